/*
 * doorbell.c - how a rank thread with nothing to do waits for a peer's signal.
 *
 * Rank threads usually outnumber the cores (the main job runs 8 ranks on 2).  The first
 * interpreter waited with sched_yield and then nanosleep of 25 to 400 us: a yield keeps the
 * waiter runnable, so it takes time slices from the ranks that have work, and a sleep wakes
 * up to 400 us after the signal it waits for, with the cores idle in between if every other
 * rank waits too.  Both made the CPU fabric slower than plain loops on the same threads
 * (docs/cpu-fabric.md has the figures).
 *
 * Now a waiter sleeps in the kernel until what it waits for may have happened: a futex on a
 * doorbell word, which is rung (incremented and woken) while some thread sleeps on it.  Each
 * rank has one, in the group's shm object (its call record), so it works for threads and
 * processes alike (a shared futex, not FUTEX_PRIVATE).  A rank's interpreter sleeps on its
 * own doorbell, and every signal rings the doorbell of the rank that owns the counter (WAITs
 * read only the waiting rank's counters), so a signal wakes only the rank it is for.  Ranks
 * waiting in the per-call check (calls.c) sleep on the group's call bell, which the last rank
 * to post the call rings.
 *
 * No lost wake-up: the waiter announces itself (sleepers + 1), reads the doorbell, then polls
 * its counters once more before it sleeps on that doorbell value; a signaller increments its
 * counter, then reads sleepers.  With a full fence on both sides (store-load), either the
 * waiter's poll sees the signal or the signaller sees the sleeper and rings, which changes
 * the doorbell so that the futex wait returns at once.  A sleep is also bounded by
 * SLEEP_SLICE_NS, so deadlines (TIDE_TIMEOUT_MS) and peers that died are noticed as before.
 */
#include "fabric/cpu/cpu.h"

#include <sched.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Yields before a waiter sleeps.  While other rank threads are runnable a yield hands them
 * the core at once (cheaper than a futex sleep and wake-up, and the peer a waiter needs is
 * often among them); when none is, it returns at once and the waiter polls again.  On the
 * idle 2-core machine 32 took 8-12% off TIDE's calls at the main job's smallest rows against
 * 2 (four alternating runs each, docs/cpu-fabric.md); larger rows did not change. */
#define YIELDS_BEFORE_SLEEP 32
/* Longest single sleep: the interpreter checks its deadlines between two sleeps. */
#define SLEEP_SLICE_NS 10000000L

void tide_cpu_doorbell_ring(tide_cpu_doorbell_t *d) {
    atomic_thread_fence(memory_order_seq_cst); /* the store, then sleepers */
    if (atomic_load_explicit(&d->sleepers, memory_order_relaxed) == 0) return;
    atomic_fetch_add_explicit(&d->ring, 1, memory_order_release);
#if defined(__linux__)
    syscall(SYS_futex, (uint32_t *)&d->ring, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
#endif
}

static void disarm(tide_cpu_waiter_t *wt) {
    if (!wt->armed) return;
    atomic_fetch_sub_explicit(&wt->d->sleepers, 1, memory_order_relaxed);
    wt->armed = false;
}

void tide_cpu_waiter_busy(tide_cpu_waiter_t *wt) {
    disarm(wt);
    wt->idle = 0;
}

void tide_cpu_waiter_idle(tide_cpu_waiter_t *wt) {
    if (wt->idle < YIELDS_BEFORE_SLEEP) {
        ++wt->idle;
        sched_yield();
        return;
    }
    if (!wt->armed) {
        /* Announce, then let the caller poll once more before the sleep (see above). */
        atomic_fetch_add_explicit(&wt->d->sleepers, 1, memory_order_relaxed);
        atomic_thread_fence(memory_order_seq_cst);
        wt->seen = atomic_load_explicit(&wt->d->ring, memory_order_acquire);
        wt->armed = true;
        return;
    }
#if defined(__linux__)
    struct timespec slice = {0, SLEEP_SLICE_NS};
    /* EAGAIN (rung since the poll), EINTR and ETIMEDOUT all mean: poll again. */
    syscall(SYS_futex, (uint32_t *)&wt->d->ring, FUTEX_WAIT, wt->seen, &slice, NULL, 0);
#else
    struct timespec nap = {0, 50000L};
    nanosleep(&nap, NULL);
#endif
    disarm(wt);
}

void tide_cpu_waiter_done(tide_cpu_waiter_t *wt) {
    disarm(wt);
}
