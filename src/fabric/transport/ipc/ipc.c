/*
 * ipc.c - the ipc transport (ipc.h): signals and fences are flags in the group's flag areas,
 * written with cuStreamWriteValue64 (e + 1 for call e) and waited (GEQ) by
 * tide_cuda_mp_flags_wait: cuStreamWaitValue64 / cuStreamBatchMemOp, so a poison (2^62,
 * mp_flags.c) releases every wait, or with TIDE_CUDA_MP_FLAGS=kernel wait kernels that the
 * group's abort word releases too; rail puts go to the world's rail transport (mp_rails.c);
 * runs of copies were planned for this call by mp_batch.c.
 */
#include "core/checks.h"
#include "fabric/transport/ipc/ipc.h"

static tide_result_t cu_failed(CUresult e, const char *what) {
    const char *name = NULL;
    cuGetErrorName(e, &name);
    return TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp fabric: %s: %s", what, name ? name : "?");
}

tide_result_t tide_transport_flag_write(tide_cuda_call_t *c, cudaStream_t s, CUdeviceptr flag,
                                        uint64_t value) {
    ++c->st.records;
    const CUresult e = cuStreamWriteValue64((CUstream)s, flag, value, 0);
    return e == CUDA_SUCCESS ? TIDE_SUCCESS : cu_failed(e, "cuStreamWriteValue64");
}

tide_result_t tide_transport_flag_wait(tide_cuda_call_t *c, cudaStream_t s, CUdeviceptr flag,
                                       uint64_t value) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    return tide_cuda_mp_flags_wait(x->a, s, &flag, 1, value, &c->st);
}

tide_result_t tide_transport_flags_record(tide_cuda_call_t *c, cudaStream_t s, int slot) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    return tide_transport_flag_write(
        c, s, tide_cuda_mp_slot_flag(x->a, x->a->w->base.rank, x->fidx, slot), c->epoch + 1);
}

/* The flag a wait on `slot` polls; false: nothing to wait for. */
static bool slot_flag(const tide_transport_ipc_t *x, int slot, CUdeviceptr *flag) {
    int owner = x->pp->sched.slot_thread[slot] / TIDE_CUDA_Q;
    if (x->pp->rails.on) {
        /* mp.h: a put from another node is waited on in this rank's own flags, a credit of
         * another node not at all (its receive waits for it). */
        const uint8_t k = x->pp->rails.slot_kind[slot];
        if (k == TIDE_MP_SLOT_SKIP) return false;
        if (k == TIDE_MP_SLOT_OWN) owner = x->a->w->base.rank;
    }
    *flag = tide_cuda_mp_slot_flag(x->a, owner, x->fidx, slot);
    return true;
}

tide_result_t tide_transport_flags_wait(tide_cuda_call_t *c, cudaStream_t s, int slot, bool prev) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    CUdeviceptr flag;
    if (!slot_flag(x, slot, &flag)) return TIDE_SUCCESS;
    return tide_transport_flag_wait(c, s, flag, prev ? c->epoch : c->epoch + 1);
}

/* One cuStreamBatchMemOp (or one wait kernel per TIDE_MP_GRAPH_WAIT_MAX flags) for the run:
 * on N processes sharing a GPU the stream memory operations of all ranks are what a call
 * costs beyond its bytes (docs/performance.md, "The gap is per call, not per byte"). */
tide_result_t tide_transport_flags_wait_run(tide_cuda_call_t *c, cudaStream_t s, const int *slots,
                                            int n, bool prev) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    CUdeviceptr flags[TIDE_CUDA_WAIT_RUN_MAX];
    if (n > TIDE_CUDA_WAIT_RUN_MAX)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "cuda mp fabric: a run of %d waits (at most %d)", n,
                        TIDE_CUDA_WAIT_RUN_MAX);
    int k = 0;
    for (int i = 0; i < n; ++i)
        k += slot_flag(x, slots[i], &flags[k]);
    return tide_cuda_mp_flags_wait(x->a, s, flags, k, prev ? c->epoch : c->epoch + 1, &c->st);
}

/* The caller's stream waits until the done flag of every rank it fences (tide_cuda_mp_fenced)
 * reached call + 1: tide_cuda_mp_flags_wait per FENCE_CHUNK ranks (one cuStreamBatchMemOp
 * each, or one wait kernel per TIDE_MP_GRAPH_WAIT_MAX).  The epilogue's fence of the call
 * itself skips the own flag (ipc.h). */
#define FENCE_CHUNK 128
tide_result_t tide_transport_flags_fence(tide_cuda_call_t *c, int rank, int64_t call) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    const int n = x->a->w->base.ranks, f = tide_cuda_mp_family_index(x->a, x->fam);
    const cudaStream_t caller = tide_cuda_call_caller(c, rank);
    const int own = call == (int64_t)c->epoch ? rank : -1;
    CUdeviceptr flags[FENCE_CHUNK];
    int k = 0;
    for (int r = 0; r <= n; ++r) {
        if (k == FENCE_CHUNK || (r == n && k > 0)) {
            TIDE_CHECK(tide_cuda_mp_flags_wait(x->a, caller, flags, k, (uint64_t)call + 1, &c->st));
            k = 0;
        }
        if (r < n && r != own && tide_cuda_mp_fenced(x->a, r))
            flags[k++] = tide_cuda_mp_family_done_flag(x->a, r, f);
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_transport_flags_done(tide_cuda_call_t *c, int rank) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    const int f = tide_cuda_mp_family_index(x->a, x->fam);
    return tide_transport_flag_write(c, tide_cuda_call_caller(c, rank),
                                     tide_cuda_mp_family_done_flag(x->a, rank, f), c->epoch + 1);
}

tide_result_t tide_transport_flags_copy_batch(tide_cuda_call_t *c, int k, int t) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    const tide_mp_batch_t *b = &x->pp->batch;
    ++c->st.descriptors;
    ++c->st.batches;
    c->st.batched += (uint64_t)b->b_count[k];
    if (b->b_ce[k]) c->st.ce_batched += (uint64_t)b->b_count[k];
    return tide_cuda_mp_batch_issue(x->a, x->pp, k, c->parity, t);
}

tide_result_t tide_transport_flags_rail_put(tide_cuda_call_t *c, int id, cudaStream_t s,
                                            bool *carried) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    const tide_mp_rails_prog_t *rp = &x->pp->rails;
    *carried = rp->on && rp->op_kind[id] != TIDE_MP_RAIL_OP;
    if (!*carried || rp->op_kind[id] != TIDE_MP_RAIL_STEP) return TIDE_SUCCESS;
    ++c->st.descriptors;
    ++c->st.rail_steps;
    return tide_cuda_mp_rails_issue(x->a, &x->rails, rp->op_step[id], s);
}

const tide_cuda_transport_t tide_transport_ipc =
    TIDE_CUDA_TRANSPORT("ipc", tide_transport_flags, tide_transport_flags_wait_run,
                        tide_transport_flags_rail_put);
