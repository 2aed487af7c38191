/*
 * rails.c - the rail steps of program/rails.h over NCCL 2.28 point-to-point (rails.h).
 *
 * EXPERIMENTAL, NEVER RUN (see rails.h): compiled only.  The steps' design, the order of
 * their waits and the deadlock argument are in docs/nccl-fabric.md, "Rails"; the schedule
 * they issue is tested on the CPU (tests/unit/test_rails.c).
 *
 * One step on rank r, call e, in enqueue order:
 *   queue stream   cudaEventRecord(reach[s])      the queue reached the step's first put
 *   rail stream    cudaStreamWaitEvent(reach[s])  the sources are written (queue order)
 *                  cuStreamWaitValue64 per credit the credit op of call e - delta ran here
 *                  ncclGroupStart; ncclSend per send; ncclRecv per receive; ncclGroupEnd
 *                  cuStreamWriteValue64(e + 1)    per receive: the put's flag slot, in this
 *                                                 rank's flag area, which this rank's waits
 *                                                 on the put read instead of the sender's
 *                  cudaEventRecord(done[s])
 *   queue stream   cudaStreamWaitEvent(done[s])   the queue's next op sees the step done
 * A send reads its source on this rank (resolved here: the put's own binding names the
 * destination on another node, which this rank cannot address); a receive writes into this
 * rank's arena.  Peers are rail ranks: node index of the TIDE rank.
 */
#include "fabric/nccl/rails.h"

#include "core/checks.h"

#include <stdlib.h>
#include <string.h>

tide_result_t tide_nccl_rails_split(tide_nccl_world_t *w, ncclComm_t parent) {
    const tide_nccl_lib_t *lib = w->lib;
    const int rank = w->mp.base.rank, l = w->mp.base.gpus_per_node, m = w->mp.base.nodes;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "tide-rail";
    /* Point-to-point needs NCCL's kernels: no CTA policy here (the node communicator's
     * NCCL_CTA_POLICY_ZERO is for collectives that copy engines can serve). */
    TIDE_NCCL_CALL(lib, lib->CommSplit(parent, rank % l, rank / l, &w->rail_comm, &cfg),
                   "ncclCommSplit(rail communicator)");
    if (w->rail_comm == NULL)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "nccl fabric: rank %d got no rail communicator", rank);
    int count = 0, rail_rank = -1;
    TIDE_NCCL_CALL(lib, lib->CommCount(w->rail_comm, &count), "ncclCommCount(rail)");
    TIDE_NCCL_CALL(lib, lib->CommUserRank(w->rail_comm, &rail_rank), "ncclCommUserRank(rail)");
    if (count != m || rail_rank != rank / l)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "nccl fabric: rank %d's rail communicator has %d ranks (rank %d), "
                        "expected %d (rank %d)",
                        rank, count, rail_rank, m, rank / l);
    TIDE_CUDA_CALL(cudaStreamCreateWithFlags(&w->rail_stream, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags(rail)");
    return TIDE_SUCCESS;
}

void tide_nccl_rails_destroy(tide_nccl_world_t *w) {
    if (w->rail_stream != NULL) cudaStreamDestroy(w->rail_stream);
    w->rail_stream = NULL;
    if (w->rail_comm != NULL)
        (void)(w->calls_failed ? w->lib->CommAbort : w->lib->CommDestroy)(w->rail_comm);
    w->rail_comm = NULL;
    (void)cudaGetLastError();
}

/* Global op id of (rank, queue, op) in the schedule. */
static int op_id(const tide_cuda_schedule_t *s, int rank, int queue, int op) {
    return s->op_base[rank * TIDE_CUDA_Q + queue] + op;
}

tide_result_t tide_nccl_rails_prepare(tide_nccl_world_t *w, const tide_program_t *prog,
                                      const tide_cuda_schedule_t *sched,
                                      tide_nccl_rails_prog_t *out) {
    memset(out, 0, sizeof(*out));
    out->me = w->mp.base.rank;
    TIDE_CHECK(tide_rails_build(prog, &out->sched));
    const tide_rails_rank_t *rr = &out->sched.ranks[out->me];
    tide_result_t res = TIDE_SUCCESS;
    /* A receive waits on its credits' flags: each credit must own a slot. */
    for (int c = 0; c < rr->num_credits; ++c)
        if (sched->op_slot[op_id(sched, out->me, rr->credits[c].queue, rr->credits[c].op)] < 0) {
            res = TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                           "nccl rails: rank %d: credit %s[%d] has no flag slot", out->me,
                           tide_queue_name((tide_queue_t)rr->credits[c].queue), rr->credits[c].op);
            goto fail;
        }
    const int steps = out->sched.num_steps;
    out->reach = calloc((size_t)steps + 1, sizeof(*out->reach));
    out->done = calloc((size_t)steps + 1, sizeof(*out->done));
    if (out->reach == NULL || out->done == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "nccl rails: %d steps", steps);
        goto fail;
    }
    for (int s = 0; s < steps; ++s) {
        TIDE_CUDA_CALL_GOTO(cudaEventCreateWithFlags(&out->reach[s], cudaEventDisableTiming),
                            "cudaEventCreateWithFlags(rail reach)", res, fail);
        TIDE_CUDA_CALL_GOTO(cudaEventCreateWithFlags(&out->done[s], cudaEventDisableTiming),
                            "cudaEventCreateWithFlags(rail done)", res, fail);
    }
    return TIDE_SUCCESS;
fail:
    tide_nccl_rails_release(out);
    return res;
}

void tide_nccl_rails_release(tide_nccl_rails_prog_t *rp) {
    for (int s = 0; s < rp->sched.num_steps; ++s) {
        if (rp->reach != NULL && rp->reach[s] != NULL) cudaEventDestroy(rp->reach[s]);
        if (rp->done != NULL && rp->done[s] != NULL) cudaEventDestroy(rp->done[s]);
    }
    free(rp->reach);
    free(rp->done);
    tide_rails_free(&rp->sched);
    (void)cudaGetLastError();
    memset(rp, 0, sizeof(*rp));
}

/* This rank's address of a send's source or a receive's destination: its own arena (bank
 * shifted), its landing slot, or its shard operand. */
static tide_result_t resolve(const tide_nccl_rails_call_t *c, int me, const tide_ref_t *ref,
                             bool bank_dep, uint64_t bytes, void **ptr_out) {
    const struct tide_plan *plan = c->b->plan;
    uint8_t *base = NULL;
    uint64_t size = 0, off = ref->offset;
    if ((ref->kind == TIDE_REF_ARENA || ref->kind == TIDE_REF_LANDING) && ref->rank == me) {
        const int region =
            ref->kind == TIDE_REF_LANDING ? TIDE_REGION_LANDING0 + c->b->slot : ref->region;
        if (region < 0 || region >= TIDE_REGION_COUNT)
            return TIDE_ERR(TIDE_ERR_INTERNAL, "nccl rails: region %d", region);
        if (bank_dep && ref->kind == TIDE_REF_ARENA &&
            !tide_add_u64(off, (c->b->epoch % 2) * c->prog->bank_bytes[region], &off))
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "nccl rails: bank offset");
        base = c->b->arena->bases[me] + plan->arena.regions[region].offset;
        size = plan->arena.regions[region].bytes;
    } else if (ref->kind == TIDE_REF_SHARD) {
        base = (uint8_t *)(uintptr_t)c->b->shard;
        size = tide_bind_shard_bytes(plan);
    } else {
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "nccl rails: rank %d cannot address reference kind %d of rank %d", me,
                        (int)ref->kind, ref->rank);
    }
    if (base == NULL || off > size || bytes > size - off)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "nccl rails: rank %d: [%llu, +%llu) outside its %llu bytes (kind %d)", me,
                        (unsigned long long)off, (unsigned long long)bytes,
                        (unsigned long long)size, (int)ref->kind);
    *ptr_out = base + off;
    return TIDE_SUCCESS;
}

static tide_result_t cu_check(CUresult e, const char *what) {
    if (e == CUDA_SUCCESS) return TIDE_SUCCESS;
    const char *name = NULL;
    cuGetErrorName(e, &name);
    return TIDE_ERR(TIDE_ERR_FABRIC, "nccl rails: %s: %s", what, name ? name : "?");
}

/* The credits of the step: each receive's buffer is free on this rank. */
static tide_result_t wait_credits(tide_nccl_world_t *w, const tide_nccl_rails_prog_t *rp,
                                  const tide_nccl_rails_call_t *c, const tide_rail_step_t *st) {
    const tide_rails_rank_t *rr = &rp->sched.ranks[rp->me];
    const int64_t e = (int64_t)c->b->epoch;
    for (int k = st->first_credit; k < st->first_credit + st->num_credits; ++k) {
        const tide_rail_credit_t *cr = &rr->credits[k];
        if (e - cr->delta < 0) continue; /* the first calls start from a fresh arena */
        CUdeviceptr flag;
        uint64_t value;
        if (cr->delta > 0 && !c->steady) {
            /* The previous call ran another program (the other RS mode): its credit op is
             * not this one's, but it ran before this rank's call e - 1 ended. */
            flag = (CUdeviceptr)(uintptr_t)c->own_done;
            value = (uint64_t)(e - cr->delta + 1);
        } else {
            const int slot = c->sched->op_slot[op_id(c->sched, rp->me, cr->queue, cr->op)];
            flag = (CUdeviceptr)(uintptr_t)(c->own_slots + (size_t)slot * 8u);
            value = (uint64_t)(e - cr->delta + 1);
        }
        TIDE_CHECK(cu_check(cuStreamWaitValue64((CUstream)w->rail_stream, flag, value,
                                                CU_STREAM_WAIT_VALUE_GEQ),
                            "cuStreamWaitValue64(credit)"));
    }
    return TIDE_SUCCESS;
}

/* One NCCL group: every send and receive of the step (NCCL matches per peer in issue order,
 * which is the per-pair order of program/rails.h). */
static tide_result_t group(tide_nccl_world_t *w, const tide_nccl_rails_prog_t *rp,
                           const tide_nccl_rails_call_t *c, const tide_rail_step_t *st) {
    const tide_nccl_lib_t *lib = w->lib;
    const tide_rails_rank_t *rr = &rp->sched.ranks[rp->me];
    const int l = w->mp.base.gpus_per_node;
    tide_result_t res = TIDE_SUCCESS;
    TIDE_NCCL_CALL(lib, lib->GroupStart(), "ncclGroupStart(rail step)");
    for (int k = st->first_send; k < st->first_send + st->num_sends && res == TIDE_SUCCESS; ++k) {
        const tide_rail_xfer_t *x = &rr->sends[k];
        void *src = NULL;
        res = resolve(c, rp->me, &x->src, x->bank_dep, x->bytes, &src);
        if (res == TIDE_SUCCESS && lib->Send(src, (size_t)x->bytes, ncclUint8, x->dst_rank / l,
                                             w->rail_comm, w->rail_stream) != ncclSuccess)
            res = TIDE_ERR(TIDE_ERR_FABRIC, "nccl rails: ncclSend to rank %d", x->dst_rank);
    }
    for (int k = st->first_recv; k < st->first_recv + st->num_recvs && res == TIDE_SUCCESS; ++k) {
        const tide_rail_xfer_t *x = &rr->recvs[k];
        void *dst = NULL;
        /* Inbox and stage offsets are not banked; the flag is kept for safety. */
        res = resolve(c, rp->me, &x->dst, x->bank_dep, x->bytes, &dst);
        if (res == TIDE_SUCCESS && lib->Recv(dst, (size_t)x->bytes, ncclUint8, x->src_rank / l,
                                             w->rail_comm, w->rail_stream) != ncclSuccess)
            res = TIDE_ERR(TIDE_ERR_FABRIC, "nccl rails: ncclRecv from rank %d", x->src_rank);
    }
    /* The group is closed on every path: an open group would swallow later NCCL calls. */
    const ncclResult_t end = lib->GroupEnd();
    if (res != TIDE_SUCCESS) return res;
    if (end != ncclSuccess)
        return tide_nccl_error(lib, end, __FILE__, __LINE__, "ncclGroupEnd(rail step)");
    return TIDE_SUCCESS;
}

tide_result_t tide_nccl_rails_issue(tide_nccl_world_t *w, tide_nccl_rails_prog_t *rp,
                                    const tide_nccl_rails_call_t *c, int step,
                                    cudaStream_t queue) {
    if (step < 0 || step >= rp->sched.num_steps || w->rail_comm == NULL)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "nccl rails: step %d of %d (rail communicator %s)",
                        step, rp->sched.num_steps, w->rail_comm ? "set" : "missing");
    const tide_rails_rank_t *rr = &rp->sched.ranks[rp->me];
    const tide_rail_step_t *st = &rr->steps[step];
    const cudaStream_t rail = w->rail_stream;
    TIDE_CUDA_CALL(cudaEventRecord(rp->reach[step], queue), "cudaEventRecord(rail reach)");
    TIDE_CUDA_CALL(cudaStreamWaitEvent(rail, rp->reach[step], 0), "cudaStreamWaitEvent(reach)");
    TIDE_CHECK(wait_credits(w, rp, c, st));
    TIDE_CHECK(group(w, rp, c, st));
    const uint64_t value = c->b->epoch + 1;
    for (int k = st->first_recv; k < st->first_recv + st->num_recvs; ++k) {
        const tide_rail_xfer_t *x = &rr->recvs[k];
        const int slot = c->sched->op_slot[op_id(c->sched, x->src_rank, x->queue, x->op)];
        if (slot < 0) continue; /* no wait of this rank names the put */
        TIDE_CHECK(cu_check(cuStreamWriteValue64((CUstream)rail,
                                                 (CUdeviceptr)(uintptr_t)(c->own_slots +
                                                                          (size_t)slot * 8u),
                                                 value, 0),
                            "cuStreamWriteValue64(arrival)"));
    }
    TIDE_CUDA_CALL(cudaEventRecord(rp->done[step], rail), "cudaEventRecord(rail done)");
    TIDE_CUDA_CALL(cudaStreamWaitEvent(queue, rp->done[step], 0), "cudaStreamWaitEvent(done)");
    return TIDE_SUCCESS;
}
