/*
 * calls.c - the NCCL fabric compares every call's arguments across ranks (fabric.h,
 * call_check), as the CPU and the one-process-per-rank CUDA fabrics do.
 *
 * This fabric has no control block (its ranks may be on several hosts), so the signatures
 * travel over the exchange communicator: one ncclAllGather of 32 bytes per rank on the
 * utility stream, waited on the host with TIDE_TIMEOUT_MS (tide_nccl_allgather; a rank that
 * never makes the call leaves the others at the deadline with TIDE_ERR_TIMEOUT, and the
 * exchange communicator aborted).  Each rank posts which call it makes (the group's
 * registration number, the collective, the group's check number) beside its signature, so
 * that ranks calling different groups or collectives in the same slot of the exchange are
 * refused too instead of pairing their programs.
 *
 * The cost: one small NCCL collective and one host wait per call, before anything is
 * enqueued (tens of microseconds; the CPU and CUDA mp fabrics pay a host rendezvous too).
 * Not measured on a GPU yet.
 */
#include "core/checks.h"
#include "fabric/nccl/fabric_nccl.h"

#include <stdlib.h>

typedef struct {
    uint64_t registration, seq, sig;
    uint32_t coll, pad;
} call_post_t;

_Static_assert(sizeof(call_post_t) <= TIDE_NCCL_SCRATCH, "a post fits one exchange slot");

static const char *coll_name(uint32_t coll) {
    return coll == TIDE_COLL_ALL_GATHER ? "all-gather" : "reduce-scatter";
}

tide_result_t tide_nccl_call_check(struct tide_fabric_arena *arena, tide_collective_t coll,
                                   uint64_t seq, uint64_t sig, int *other_rank_out,
                                   uint64_t *other_sig_out) {
    /* A view of a shared arena (mp_view.c) is a plain tide_mp_arena_t: its set's arena is
     * the NCCL one, whose registration names the set. */
    const tide_mp_arena_t *m = (const tide_mp_arena_t *)arena;
    const tide_nccl_arena_t *a = (const tide_nccl_arena_t *)(m->parent != NULL ? m->parent : m);
    tide_nccl_world_t *w = (tide_nccl_world_t *)arena->world;
    const int n = w->mp.base.ranks, me = w->mp.base.rank;
    const call_post_t mine = {a->registration, seq, sig, (uint32_t)coll, 0};
    call_post_t *all = calloc((size_t)n, sizeof(*all));
    if (all == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "nccl fabric: %d ranks", n);
    /* The exchange runs on this rank's device; the caller's current device is restored. */
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    tide_result_t res =
        prev == w->mp.device || cudaSetDevice(w->mp.device) == cudaSuccess
            ? tide_nccl_allgather(w, &mine, sizeof(mine), all)
            : tide_cuda_error(cudaGetLastError(), __FILE__, __LINE__, "cudaSetDevice");
    if (prev >= 0 && prev != w->mp.device) (void)cudaSetDevice(prev);
    int other = -1;
    uint64_t other_sig = 0;
    for (int r = 0; r < n && res == TIDE_SUCCESS; ++r) {
        const call_post_t *p = &all[r];
        if (p->registration != mine.registration || p->coll != mine.coll || p->seq != seq)
            res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                           "nccl fabric: the ranks disagree on which call they make: rank %d "
                           "makes %s call %llu of registration %llu, rank %d %s call %llu of "
                           "registration %llu (every rank must call the collectives of its "
                           "groups in the same order)",
                           me, coll_name(mine.coll), (unsigned long long)seq,
                           (unsigned long long)mine.registration, r, coll_name(p->coll),
                           (unsigned long long)p->seq, (unsigned long long)p->registration);
        else if (p->sig != sig && other < 0) {
            other = r;
            other_sig = p->sig;
        }
    }
    free(all);
    if (res != TIDE_SUCCESS) return res;
    *other_rank_out = other;
    *other_sig_out = other_sig;
    return TIDE_SUCCESS;
}
