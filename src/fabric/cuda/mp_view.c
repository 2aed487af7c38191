/*
 * mp_view.c - shared arenas on the fabrics that run tide_cuda_mp_execute (the CUDA fabric
 * with one process per rank, and the NCCL fabric): a set's segments, one view per group
 * (docs/arena.md, "Fabrics").
 *
 * The set's arena is created once (arena_create_set): every rank's segment holds the arena
 * and, behind it, 1 + V flag areas instead of one, V the set's groups.  Area 0 stays the
 * set arena's own (no call runs on it); view k uses area 1 + k.  A view borrows everything
 * the segment is (N base pointers, the VMM / IPC mappings, which peers are remote) and owns
 * what a call keeps: its three families (all-gather, reduce-scatter, and the cross-group
 * fence program of src/program/fence.c), so prepared command lists, call counters, done
 * flags and events, the read-done event among them, are per group; and its flag area, so
 * that the signal slots and done flags of one group's calls never meet another group's.
 * Every tide_cuda_mp_*_flag helper resolves through the arena's flags[] array, which a
 * view points at its own area: nothing in the executor changes for a view.
 *
 * Fail-stop is set-wide: the views share the set's segments, so a fail-stop of one group
 * publishes the abort word in the set's control block (tide_cuda_mp_set_of), poisons every
 * flag area of the set (tide_cuda_mp_flag_bytes) and breaks every view of the set in this
 * process; the other processes' views read the set's word at their next call or wait.  Each
 * view keeps a control block of its own for what is per group: the entered / enqueued call
 * counters that name a missing rank, and the argument checks.
 *
 * Registration: a view is created by every rank in the same order.  On the CUDA fabric a
 * barrier over the bootstrap ends each creation, so a rank that failed locally fails the
 * set's registration on every rank.  The NCCL fabric has no bootstrap here: a local failure
 * (host memory, event creation) fails that rank only, and its peers meet it at the set's
 * next collective step, which fails at TIDE_TIMEOUT_MS or NCCL's own timeout.
 *
 * The fence on this fabric is the SIGNAL / WAIT (/ ZERO) program run by the execute in the
 * view's third family: a SIGNAL's RECORD writes the fence epoch + 1 into this rank's flag of
 * the slot, and every peer's WAIT reads it through its mapping (cuStreamWaitValue64, or a
 * wait kernel with TIDE_CUDA_MP_FLAGS=kernel: mp_flags.c), so a rank passes only when every
 * rank's caller stream reached the fence.  Because FSDP2
 * enqueues all-gathers and reduce-scatters on different streams, a fence call first makes
 * the caller stream wait for this rank's done flag of the last call of every sibling view's
 * families (tide_cuda_mp_view_wait_siblings); the fence program after it then passes only
 * when every rank did the same, as the single-process fabric's wait on its families' fence
 * events does: a slot handed from one group's reduce-scatter to another group's all-gather
 * is then ordered on every rank, whatever stream each call was made on.
 *
 * Captured into a CUDA graph (mp_graph.c, "Views of a set"), the sibling waits become graph
 * edges to siblings' calls of the same capture and fixed-value waits on eager ones
 * (tide_cuda_mp_graph_wait_siblings), and the whole set is replay-only from then on.
 */
#include "core/checks.h"
#include "fabric/cuda/mp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuStreamBatchMemOp takes at most this many operations per call (a safe bound). */
#define MEMOP_BATCH 128

tide_result_t tide_cuda_mp_set_areas(const tide_mp_world_t *w, int views, int *areas_out) {
    TIDE_ARG_CHECK(views >= 1, "cuda mp fabric: a set of %d groups", views);
    /* With rails the fence program's signals would cross nodes otherwise than by puts and
     * credits, which the rail schedule refuses (mp_rails.c); and the NCCL fabric maps no
     * flag of another node. */
    if (w->rails != NULL)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "cuda mp fabric: shared arenas are not served with rails (several nodes "
                        "on the NCCL fabric, or TIDE_CUDA_MP_RAILS=1): the cross-group fence "
                        "would cross nodes; register the groups one by one");
    *areas_out = 1 + views;
    return TIDE_SUCCESS;
}

uint64_t tide_cuda_mp_flag_bytes(const tide_mp_arena_t *a) {
    const tide_mp_arena_t *s = a->parent != NULL ? a->parent : a;
    return (uint64_t)(s->flag_areas > 1 ? s->flag_areas : 1) * TIDE_MP_FLAG_BYTES;
}

static void family_break(tide_mp_arena_t *a, const char *msg) {
    for (int f = 0; f < 3; ++f)
        if (a->fam[f].broken == TIDE_SUCCESS) {
            a->fam[f].broken = TIDE_ERR_TIMEOUT;
            snprintf(a->fam[f].broken_msg, sizeof(a->fam[f].broken_msg), "%s", msg);
        }
}

void tide_cuda_mp_set_broken(tide_mp_arena_t *a, const char *msg) {
    tide_mp_arena_t *s = tide_cuda_mp_set_of(a);
    family_break(s, msg);
    for (int k = 0; k < s->num_views && s->views != NULL; ++k)
        if (s->views[k] != NULL) family_break(s->views[k], msg);
}

/* The fence family: compiled as all-gathers (program/fence.c), counted on its own. */
static tide_result_t fence_family_create(tide_mp_family_t *fam) {
    memset(fam, 0, sizeof(*fam));
    fam->coll = TIDE_COLL_ALL_GATHER;
    fam->last_epoch = -1;
    fam->fenced_epoch = -1;
    fam->done_epoch[0] = fam->done_epoch[1] = -1;
    for (int p = 0; p < 2; ++p)
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&fam->done_ev[p], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags(fence done)");
    for (int k = 0; k < TIDE_EVENT_COUNT; ++k)
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&fam->user[k], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags(fence event)");
    return TIDE_SUCCESS;
}

static void view_free(tide_mp_arena_t *v) {
    tide_mp_watchdog_remove(v); /* before the events it reads go (no-op if never added) */
    for (int f = 0; f < 3; ++f)
        tide_cuda_mp_family_free(&v->fam[f]);
    tide_cuda_mp_graph_free(v); /* its captured calls' counters, tables and events */
    tide_mp_ctl_close(&v->ctl);
    free(v->flags);
    free(v);
}

tide_result_t tide_cuda_mp_view_create(struct tide_fabric_arena *parent, uint64_t signature,
                                       struct tide_fabric_arena **view_out) {
    (void)signature; /* the set's signature, compared at arena_create_set, covers each group */
    tide_mp_arena_t *p = (tide_mp_arena_t *)parent;
    tide_mp_world_t *w = p->w;
    const int n = w->base.ranks;
    if (p->parent != NULL)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "cuda mp fabric: rank %d: a view of a view (views share a set's "
                        "segments: pass the set's arena)",
                        w->base.rank);
    if (p->num_views >= p->flag_areas - 1)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "cuda mp fabric: rank %d: view %d of an arena created for %d views "
                        "(arena_create_set reserves one flag area per view)",
                        w->base.rank, p->num_views + 1, p->flag_areas > 1 ? p->flag_areas - 1 : 0);
    TIDE_CUDA_CALL(cudaSetDevice(w->device), "cudaSetDevice");
    if (p->views == NULL) {
        p->views = calloc((size_t)(p->flag_areas - 1), sizeof(*p->views));
        if (p->views == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: views");
    }
    tide_mp_arena_t *v = calloc(1, sizeof(*v));
    if (v == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: view");
    const int k = p->num_views;
    v->w = w;
    v->base = p->base; /* world, bytes, and the set's N base pointers (borrowed) */
    v->alloc_bytes = p->alloc_bytes;
    v->flags_off = p->flags_off;
    v->vmm = p->vmm; /* borrowed: the segments are the set's */
    v->remote = p->remote;
    v->any_remote = p->any_remote;
    v->parent = p;
    v->flags = calloc((size_t)n, sizeof(*v->flags));
    tide_result_t res =
        v->flags == NULL ? TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: view") : TIDE_SUCCESS;
    for (int r = 0; r < n && res == TIDE_SUCCESS; ++r)
        v->flags[r] =
            p->flags[r] != NULL ? p->flags[r] + (size_t)(1 + k) * (size_t)TIDE_MP_FLAG_BYTES : NULL;
    /* The view's own counters and checks (collective over the bootstrap; a rank that failed
     * above still takes part, so that its peers do not wait for it).  No block on the set
     * (the NCCL fabric): none on the view either. */
    if (p->ctl.hdr != NULL) {
        const tide_result_t c = tide_mp_ctl_open(&w->boot, tide_fabric_timeout_ms(), &v->ctl);
        if (res == TIDE_SUCCESS) res = c;
    }
    if (res == TIDE_SUCCESS) res = tide_cuda_mp_families_create(v);
    if (res == TIDE_SUCCESS) res = fence_family_create(&v->fam[2]);
    /* Its calls are bounded like a lone group's (watchdog.c; view_free stops that). */
    if (res == TIDE_SUCCESS) res = tide_mp_watchdog_add(v);
    /* Every rank has its view, or every rank learns that one failed (the set's registration
     * then fails on all of them, none waits for a view that does not exist). */
    if (p->ctl.hdr != NULL) {
        const tide_result_t bar =
            tide_mp_boot_barrier(&w->boot, res == TIDE_SUCCESS ? 0x71e00 + (uint64_t)k : 0xbad,
                                 tide_fabric_timeout_ms());
        if (res == TIDE_SUCCESS) res = bar;
    }
    if (res != TIDE_SUCCESS) {
        view_free(v);
        return res;
    }
    p->views[k] = v;
    ++p->num_views;
    *view_out = &v->base;
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_view_destroy(tide_mp_arena_t *v) {
    tide_mp_arena_t *p = v->parent;
    (void)cudaSetDevice(v->w->device);
    /* Nothing of the view may still run (its tables and events go): finish, or fail stop,
     * every family.  The segments and their flags stay with the set until its last group. */
    tide_result_t res = TIDE_SUCCESS;
    for (int f = 0; f < 3; ++f) {
        const tide_result_t r = tide_cuda_mp_sync_family(v, f);
        if (res == TIDE_SUCCESS) res = r;
    }
    for (int k = 0; k < p->num_views; ++k)
        if (p->views[k] == v) p->views[k] = NULL;
    view_free(v);
    return res;
}

static tide_result_t memops(cudaStream_t s, CUstreamBatchMemOpParams *ops, int k,
                            tide_cuda_stats_t *st) {
    if (k == 0) return TIDE_SUCCESS;
    st->waits += (uint64_t)k;
    ++st->wait_calls;
    const CUresult e = cuStreamBatchMemOp((CUstream)s, (unsigned)k, ops, 0);
    if (e != CUDA_SUCCESS)
        return TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp fabric: cuStreamBatchMemOp(sibling fence): %d",
                        (int)e);
    return TIDE_SUCCESS;
}

/* This rank's own done flags suffice: the fence program that follows on the same stream
 * passes only when every rank signalled, and each rank signals after its own sibling waits,
 * so passing it means every rank's part of every sibling's last calls is complete (the
 * single-process fabric waits for all ranks' events at once; here the fence carries it). */
tide_result_t tide_cuda_mp_view_wait_siblings(tide_mp_arena_t *a, cudaStream_t caller,
                                              tide_cuda_stats_t *st) {
    const tide_mp_arena_t *p = a->parent;
    if (p == NULL || p->views == NULL) return TIDE_SUCCESS;
    const int me = a->w->base.rank;
    CUstreamBatchMemOpParams ops[MEMOP_BATCH];
    int k = 0;
    for (int i = 0; i < p->num_views; ++i) {
        const tide_mp_arena_t *v = p->views[i];
        if (v == NULL || v == a) continue;
        for (int f = 0; f < 3; ++f) {
            const int64_t last = v->fam[f].last_epoch;
            if (last < 0) continue;
            if (tide_cuda_mp_set_of(a)->abort_dev != NULL) {
                /* Kernel waits (mp_flags.c): one per flag, each with its own value. */
                const CUdeviceptr flag = tide_cuda_mp_family_done_flag(v, me, f);
                TIDE_CHECK(
                    tide_cuda_mp_flags_wait(a, caller, &flag, 1, (uint64_t)last + 1, st));
                continue;
            }
            if (k == MEMOP_BATCH) {
                TIDE_CHECK(memops(caller, ops, k, st));
                k = 0;
            }
            memset(&ops[k], 0, sizeof(ops[k]));
            ops[k].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
            ops[k].waitValue.address = tide_cuda_mp_family_done_flag(v, me, f);
            ops[k].waitValue.value64 = (uint64_t)last + 1;
            ops[k].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
            ++k;
        }
    }
    return memops(caller, ops, k, st);
}
