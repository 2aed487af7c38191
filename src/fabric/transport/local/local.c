/*
 * local.c - the local transport (transport.h): signals are events, one per waited-on slot and
 * call parity (prepare.c); a fence is the aggregate event of every rank's call (execute.c);
 * a run of same-device copies is one launch of the batch kernel over descriptors planned with
 * the program (batch.c).  No rail puts: every op is issued as itself.
 */
#include "core/checks.h"
#include "fabric/transport/local/local.h"

static tide_result_t local_record(tide_cuda_call_t *c, cudaStream_t s, int slot) {
    const tide_transport_local_t *x = c->tp_ctx;
    return tide_cuda_call_record_event(c, x->pp->events[c->parity][slot], s);
}

static tide_result_t local_wait(tide_cuda_call_t *c, cudaStream_t s, int slot, bool prev) {
    const tide_transport_local_t *x = c->tp_ctx;
    return tide_cuda_call_wait_event(c, s, x->pp->events[prev ? c->parity ^ 1 : c->parity][slot]);
}

static tide_result_t local_fence(tide_cuda_call_t *c, int rank, int64_t call) {
    const tide_transport_local_t *x = c->tp_ctx;
    return tide_cuda_call_wait_event(c, tide_cuda_call_caller(c, rank), x->fam->fence[call % 2]);
}

static tide_result_t local_done(tide_cuda_call_t *c, int rank) {
    const tide_transport_local_t *x = c->tp_ctx;
    return tide_cuda_call_record_event(c, x->sh->done[rank], tide_cuda_call_caller(c, rank));
}

/* A batch: one kernel, or its copies one by one in order when they overlap. */
static tide_result_t local_copy_batch(tide_cuda_call_t *c, int b, int t) {
    const tide_transport_local_t *x = c->tp_ctx;
    tide_cuda_prepared_t *pp = x->pp;
    const tide_cuda_batch_t *bt = &pp->batches[b];
    if (!tide_cuda_batch_disjoint(pp, bt)) {
        c->st.unbatched += (uint64_t)bt->count;
        for (int k = bt->first; k < bt->first + bt->count; ++k)
            TIDE_CHECK(tide_cuda_call_op(c, pp->slot_op[k], t));
        return TIDE_SUCCESS;
    }
    ++c->st.descriptors;
    ++c->st.batches;
    c->st.batched += (uint64_t)bt->count;
    const tide_cuda_copy_desc_t *base =
        c->graph ? x->fam->graph_desc[bt->rank] : pp->desc_dev[c->parity][bt->rank];
    const tide_cuda_copy_desc_t *table = base + (bt->first - pp->slot_base[bt->rank]);
    const cudaError_t e =
        tide_cuda_batch_copy(table, bt->count, bt->ctas, x->sh->batch_unroll,
                             x->sh->batch_streaming, tide_cuda_call_stream(c, t));
    if (e == cudaSuccess) return TIDE_SUCCESS;
    const int id = pp->slot_op[bt->first];
    const tide_op_t *op = tide_schedule_op(pp->checked[bt->rank], &pp->sched, id, t);
    return tide_cuda_op_failed(e, t / TIDE_CUDA_Q, t % TIDE_CUDA_Q, id - pp->sched.op_base[t],
                               op->kind, "tide_cuda_batch_copy");
}

const tide_cuda_transport_t tide_transport_local = TIDE_CUDA_TRANSPORT("local", local, NULL, NULL);
