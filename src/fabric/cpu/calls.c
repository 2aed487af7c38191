/*
 * calls.c - the CPU fabric's per-call agreement check, and the advice its timeouts give.
 *
 * Every rank posts the signature of each call (core encodes the arguments that must agree:
 * the all-gather slot; alpha, accumulate and the mode of a reduce-scatter) into its record
 * after the N arenas of the group's shm object, counts itself in the group header's
 * arrivals, and once all N arrived reads every other rank's record of the same call.
 * Records keep two calls per collective, indexed by the call's sequence number mod 2: a rank
 * can be at most one call ahead of another here, because it passes the check of call e + 1
 * only after every rank posted e + 1, so the slot of call e is not overwritten while any rank
 * still reads it.  The signature is stored before the (release) arrival, which the waiters
 * read with acquire, so a rank never reads a signature older than the count says.
 */
#include "core/checks.h"
#include "fabric/cpu/cpu.h"

#include <stdio.h>

/* One marker per thread: its address identifies the thread while it lives. */
static _Thread_local char thread_marker;

void tide_cpu_note_caller(tide_cpu_world_t *w) {
    atomic_store_explicit(&w->caller, (uintptr_t)&thread_marker, memory_order_relaxed);
}

const char *tide_cpu_timeout_hint(const tide_cpu_world_t *w, char *buf, size_t size) {
    const uintptr_t me = (uintptr_t)&thread_marker;
    if (!w->shared->processes) {
        const tide_cpu_world_t *all = w - w->base.rank; /* the N handles of one allocation */
        for (int r = 0; r < w->base.ranks; ++r) {
            if (r == w->base.rank) continue;
            if (atomic_load_explicit(&all[r].caller, memory_order_relaxed) != me) continue;
            snprintf(buf, size,
                     "rank %d was called from this same thread: a CPU-fabric call runs to "
                     "completion on its calling thread, so each rank needs its own thread "
                     "(or process)",
                     r);
            return buf;
        }
    }
    snprintf(buf, size,
             "every rank must make the same collective call; on the CPU fabric each rank "
             "needs its own thread or process");
    return buf;
}

/* Call e of a collective is complete when all N ranks posted it: arrivals = N (e + 1).  Posts
 * of call e + 1 cannot come first, because a rank passes check e only once every rank posted
 * e, so the count moves through N (e + 1) exactly once. */
static bool call_complete(const tide_cpu_header_t *h, int c, uint64_t target) {
    return atomic_load_explicit(&h->arrivals[c], memory_order_acquire) >= target;
}

/* The first rank that has not posted call `epoch`: the one a timeout names. */
static int first_missing(const tide_cpu_arena_t *a, int n, int c, uint64_t epoch) {
    for (int u = 0; u < n; ++u)
        if (atomic_load_explicit(&a->calls[u].posted[c], memory_order_acquire) < epoch + 1)
            return u;
    return -1;
}

tide_result_t tide_cpu_call_check(struct tide_fabric_arena *arena, tide_collective_t coll,
                                  uint64_t epoch, uint64_t sig, int *other_rank_out,
                                  uint64_t *other_sig_out) {
    tide_cpu_arena_t *a = (tide_cpu_arena_t *)arena;
    tide_cpu_world_t *w = (tide_cpu_world_t *)arena->world;
    tide_cpu_header_t *h = a->map->addr;
    const int n = arena->world->ranks, me = arena->world->rank, c = coll ? 1 : 0;
    const int parity = (int)(epoch & 1);
    tide_cpu_note_caller(w);
    atomic_store_explicit(&a->calls[me].sig[c][parity], sig, memory_order_relaxed);
    atomic_store_explicit(&a->calls[me].posted[c], epoch + 1, memory_order_release);

    /* One group-wide count instead of a wait per peer: a rank sleeps at most once here, and
     * only the last rank to arrive wakes the others (with 8 rank threads on 2 cores every
     * wake-up is a context switch; waiting peer by peer cost up to N - 1 of them per rank). */
    const uint64_t target = (uint64_t)n * (epoch + 1);
    const uint64_t arrived =
        atomic_fetch_add_explicit(&h->arrivals[c], 1, memory_order_acq_rel) + 1;
    if (arrived >= target) {
        tide_cpu_doorbell_ring(&h->call_bell);
    } else {
        const uint64_t deadline = tide_cpu_deadline_ns();
        tide_cpu_waiter_t wt = {.d = &h->call_bell};
        while (!call_complete(h, c, target)) {
            if (tide_cpu_now_ns() > deadline) {
                char hint[256];
                tide_cpu_waiter_done(&wt);
                return TIDE_ERR(TIDE_ERR_TIMEOUT,
                                "rank %d: %s call %llu: rank %d did not make its call within "
                                "TIDE_TIMEOUT_MS = %lld ms; %s",
                                me, coll ? "reduce_scatter" : "all_gather",
                                (unsigned long long)epoch, first_missing(a, n, c, epoch),
                                (long long)tide_fabric_timeout_ms(),
                                tide_cpu_timeout_hint(w, hint, sizeof(hint)));
            }
            tide_cpu_waiter_idle(&wt);
        }
        tide_cpu_waiter_done(&wt);
    }

    /* Every rank posted: its signature was stored before its post (release / acquire). */
    int other = -1;
    uint64_t other_sig = 0;
    for (int u = 0; u < n && other < 0; ++u) {
        if (u == me) continue;
        const uint64_t v = atomic_load_explicit(&a->calls[u].sig[c][parity], memory_order_relaxed);
        if (v != sig) {
            other = u;
            other_sig = v;
        }
    }
    *other_rank_out = other;
    *other_sig_out = other_sig;
    return TIDE_SUCCESS;
}
