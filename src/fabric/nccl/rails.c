/*
 * rails.c - the rail communicators and the two-sided rail transport over NCCL 2.28
 * point-to-point (rails.h).
 *
 * EXPERIMENTAL, NEVER RUN (see rails.h): compiled only.  The steps' design, the order of
 * their waits and the deadlock argument are in docs/nccl-fabric.md, "Rails"; the schedule is
 * tested on the CPU (tests/unit/test_rails.c).
 *
 * One step on rank r, as the execute issues it (fabric/cuda/mp_rails.c):
 *   rail stream   waits for the queue reaching the step (its sources are written) and for
 *                 the credits of its receives (their buffers are free on this rank)
 *                 transfer (here): ncclGroupStart; ncclSend per send; ncclRecv per receive;
 *                 ncclGroupEnd, all on the rail stream
 *                 writes e + 1 into this rank's flag of every received put; records done
 * A send reads its source on this rank and a receive writes into this rank's memory, both
 * resolved on this rank (the put names a destination on another node, which this rank
 * cannot address).  NCCL matches point-to-point per peer in issue order, which is the
 * per-pair order of program/rails.h, so the i-th send from a to b is the i-th receive on b
 * from a, with the same bytes.  A group's receives complete only once the peers posted their
 * sends of the same step: a send never lands before its receiver reached the step.
 */
#include "fabric/nccl/rails.h"

#include "core/checks.h"

#include <stdlib.h>
#include <string.h>

/* One split of the rail communicator family, checked: M ranks, rail rank = node. */
static tide_result_t split_one(tide_nccl_world_t *w, ncclComm_t parent, bool join,
                               const char *name, ncclComm_t *out) {
    const tide_nccl_lib_t *lib = w->lib;
    const int rank = w->mp.base.rank, l = w->mp.base.gpus_per_node, m = w->mp.base.nodes;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = name;
    /* Point-to-point and one-sided transfers need NCCL's kernels or proxy: no CTA policy here
     * (the node communicator's NCCL_CTA_POLICY_ZERO is for its few-byte collectives). */
    TIDE_NCCL_CALL(lib,
                   lib->CommSplit(parent, join ? rank % l : NCCL_SPLIT_NOCOLOR, rank / l, out,
                                  &cfg),
                   "ncclCommSplit(rail communicator)");
    if (!join) return TIDE_SUCCESS;
    if (*out == NULL)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "nccl fabric: rank %d got no %s communicator", rank,
                        name);
    int count = 0, rail_rank = -1;
    TIDE_NCCL_CALL(lib, lib->CommCount(*out, &count), "ncclCommCount(rail)");
    TIDE_NCCL_CALL(lib, lib->CommUserRank(*out, &rail_rank), "ncclCommUserRank(rail)");
    if (count != m || rail_rank != rank / l)
        return TIDE_ERR(TIDE_ERR_FABRIC,
                        "nccl fabric: rank %d's %s communicator has %d ranks (rank %d), "
                        "expected %d (rank %d): some rank failed before the split",
                        rank, name, count, rail_rank, m, rank / l);
    return TIDE_SUCCESS;
}

tide_result_t tide_nccl_rails_split(tide_nccl_world_t *w, ncclComm_t parent, tide_result_t pre) {
    /* Every split is joined by every rank, whatever failed before it on this rank. */
    tide_result_t res = split_one(w, parent, pre == TIDE_SUCCESS, "tide-rail", &w->rail_comm);
    if (w->rails_put) {
        const tide_result_t r = split_one(w, parent, pre == TIDE_SUCCESS && res == TIDE_SUCCESS,
                                          "tide-rail-ready", &w->rail_ready_comm);
        if (res == TIDE_SUCCESS) res = r;
    }
    if (pre != TIDE_SUCCESS) return pre;
    if (res != TIDE_SUCCESS) return res;
    TIDE_CUDA_CALL(cudaStreamCreateWithFlags(&w->mp.rail_stream, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags(rail)");
    return TIDE_SUCCESS;
}

void tide_nccl_rails_destroy(tide_nccl_world_t *w) {
    if (w->mp.rail_stream != NULL) cudaStreamDestroy(w->mp.rail_stream);
    w->mp.rail_stream = NULL;
    /* After a fail-stop or a timeout a peer may be gone, and destruction may wait for it. */
    __typeof__(w->lib->CommDestroy) release =
        w->calls_failed || w->aborted ? w->lib->CommAbort : w->lib->CommDestroy;
    if (w->rail_ready_comm != NULL) (void)release(w->rail_ready_comm);
    w->rail_ready_comm = NULL;
    if (w->rail_comm != NULL) (void)release(w->rail_comm);
    w->rail_comm = NULL;
    (void)cudaGetLastError();
}

/* Every address of the step, resolved before the group opens: a failure then leaves no
 * half-filled group behind (NCCL has no way to drop one; ending it would launch receives
 * that no peer matches). */
static tide_result_t resolve_step(tide_mp_arena_t *a, const tide_mp_rails_call_t *c,
                                  const tide_rails_rank_t *rr, const tide_rail_step_t *st,
                                  int me) {
    void *p = NULL;
    for (int k = st->first_send; k < st->first_send + st->num_sends; ++k)
        if (rr->sends[k].bytes > 0)
            TIDE_CHECK(tide_cuda_mp_rails_resolve(a, c, me, &rr->sends[k].src,
                                                  rr->sends[k].bank_dep != 0, rr->sends[k].bytes,
                                                  &p));
    for (int k = st->first_recv; k < st->first_recv + st->num_recvs; ++k)
        if (rr->recvs[k].bytes > 0)
            TIDE_CHECK(tide_cuda_mp_rails_resolve(a, c, me, &rr->recvs[k].dst,
                                                  rr->recvs[k].bank_dep != 0, rr->recvs[k].bytes,
                                                  &p));
    return TIDE_SUCCESS;
}

/* One NCCL group: every send and receive of the step.  An empty put (zero bytes, program/
 * rails.h) is neither sent nor received, on both sides alike: it carries no bytes, and its
 * receiver raises its signal after the step's credits and transfers anyway. */
static tide_result_t transfer(tide_mp_arena_t *a, const tide_mp_rails_prog_t *rp,
                              const tide_mp_rails_call_t *c, int step, cudaStream_t rail) {
    const tide_nccl_world_t *w = (const tide_nccl_world_t *)a->w;
    const tide_nccl_lib_t *lib = w->lib;
    const int me = w->mp.base.rank, l = w->mp.base.gpus_per_node;
    if (w->rail_comm == NULL || step < 0 || step >= rp->sched.num_steps)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "nccl rails: rank %d: step %d of %d (rail communicator %s)", me, step,
                        rp->sched.num_steps, w->rail_comm != NULL ? "set" : "missing");
    const tide_rails_rank_t *rr = &rp->sched.ranks[me];
    const tide_rail_step_t *st = &rr->steps[step];
    TIDE_CHECK(resolve_step(a, c, rr, st, me));
    /* From here only NCCL calls fail; NCCL records an error of a call inside the group and
     * ncclGroupEnd returns it without launching the group. */
    ncclResult_t first = ncclSuccess;
    const char *what = NULL;
    TIDE_NCCL_CALL(lib, lib->GroupStart(), "ncclGroupStart(rail step)");
    for (int k = st->first_send; k < st->first_send + st->num_sends && first == ncclSuccess;
         ++k) {
        const tide_rail_xfer_t *x = &rr->sends[k];
        if (x->bytes == 0) continue;
        void *src = NULL;
        (void)tide_cuda_mp_rails_resolve(a, c, me, &x->src, x->bank_dep != 0, x->bytes, &src);
        first = lib->Send(src, (size_t)x->bytes, ncclUint8, x->dst_rank / l, w->rail_comm, rail);
        what = "ncclSend(rail step)";
    }
    for (int k = st->first_recv; k < st->first_recv + st->num_recvs && first == ncclSuccess;
         ++k) {
        const tide_rail_xfer_t *x = &rr->recvs[k];
        if (x->bytes == 0) continue;
        void *dst = NULL;
        (void)tide_cuda_mp_rails_resolve(a, c, me, &x->dst, x->bank_dep != 0, x->bytes, &dst);
        first = lib->Recv(dst, (size_t)x->bytes, ncclUint8, x->src_rank / l, w->rail_comm, rail);
        what = "ncclRecv(rail step)";
    }
    /* The group is closed on every path: an open group would swallow the thread's later NCCL
     * calls. */
    const ncclResult_t end = lib->GroupEnd();
    if (first != ncclSuccess) return tide_nccl_error(lib, first, __FILE__, __LINE__, what);
    if (end != ncclSuccess)
        return tide_nccl_error(lib, end, __FILE__, __LINE__, "ncclGroupEnd(rail step)");
    return TIDE_SUCCESS;
}

const tide_mp_rails_ops_t tide_nccl_rails_ops = {
    .name = "nccl send/recv",
    .transfer = transfer,
};
