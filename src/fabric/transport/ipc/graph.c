/*
 * graph.c - the ipc transport's entries for a call being captured into a CUDA graph
 * (fabric/cuda/mp_graph.c): the flags and values of the eager entries (ipc.c), written and
 * waited by kernels that read the family's call counter on the device (mp_graph_kernels.h),
 * so that every replay signals and waits for its own call number.  A value is the eager one
 * less the host's call number, added to the counter: e + 1 for a signal and a wait, e for a
 * wait on the previous call, call + 1 for a fence on call `call`.  A wait on a slot this rank
 * records itself is an edge of the graph instead (an event recorded with the signal).
 */
#include "core/checks.h"
#include "fabric/cuda/mp_graph_kernels.h"
#include "fabric/transport/ipc/ipc.h"

#include <string.h>

static void wait_init(tide_mp_graph_wait_t *w, const tide_cuda_call_t *c, int slot, int64_t value) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    const struct tide_mp_graph *g = x->a->graph;
    const int f = tide_cuda_mp_family_index(x->a, x->fam);
    memset(w, 0, sizeof(*w));
    w->num = &g->num[f];
    w->err = g->err_dev;
    w->delta = value - (int64_t)c->epoch;
    w->timeout_ns = (uint64_t)g->timeout_ms * 1000000u;
    w->family = f;
    w->slot = slot;
}

static tide_result_t launched(cudaError_t e, const char *what) {
    return e == cudaSuccess ? TIDE_SUCCESS : tide_cuda_error(e, __FILE__, __LINE__, what);
}

static tide_result_t signal_flag(tide_cuda_call_t *c, cudaStream_t s, CUdeviceptr flag,
                                 int64_t value) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    const struct tide_mp_graph *g = x->a->graph;
    const int f = tide_cuda_mp_family_index(x->a, x->fam);
    ++c->st.records;
    return launched(
        tide_mp_graph_signal(&g->num[f], g->err_dev, (uint64_t)flag, value - (int64_t)c->epoch, s),
        "captured signal kernel");
}

static tide_result_t graph_record(tide_cuda_call_t *c, cudaStream_t s, int slot) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    /* This rank waits on it too: a graph edge for that wait (mp_graph.c, local_events). */
    const cudaEvent_t ev = x->a->graph->local[x->fidx][slot];
    if (ev != NULL) TIDE_CHECK(tide_cuda_call_record_event(c, ev, s));
    return signal_flag(c, s, tide_cuda_mp_slot_flag(x->a, x->a->w->base.rank, x->fidx, slot),
                       (int64_t)c->epoch + 1);
}

static tide_result_t graph_wait(tide_cuda_call_t *c, cudaStream_t s, int slot, bool prev) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    const int owner = x->pp->sched.slot_thread[slot] / TIDE_CUDA_Q; /* no rails (mp_graph.c) */
    const cudaEvent_t ev = x->a->graph->local[x->fidx][slot];
    /* The owner is checked too: a view's two fence variants share one flag area's events
     * (mp_graph.c, local_events), and the other variant may record this slot itself. */
    if (!prev && ev != NULL && owner == x->a->w->base.rank)
        return tide_cuda_call_wait_event(c, s, ev);
    tide_mp_graph_wait_t w;
    wait_init(&w, c, slot, prev ? (int64_t)c->epoch : (int64_t)c->epoch + 1);
    w.count = 1;
    w.rank[0] = owner;
    w.flag[0] = (uint64_t)tide_cuda_mp_slot_flag(x->a, owner, x->fidx, slot);
    ++c->st.waits;
    return launched(tide_mp_graph_wait(&w, s), "captured wait kernel");
}

static tide_result_t graph_fence(tide_cuda_call_t *c, int rank, int64_t call) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    const int n = x->a->w->base.ranks, f = tide_cuda_mp_family_index(x->a, x->fam);
    const cudaStream_t caller = tide_cuda_call_caller(c, rank);
    tide_mp_graph_wait_t w;
    wait_init(&w, c, -1, call + 1);
    for (int r = 0; r <= n; ++r) {
        if (w.count == TIDE_MP_GRAPH_WAIT_MAX || (r == n && w.count > 0)) {
            c->st.waits += (uint64_t)w.count;
            TIDE_CHECK(launched(tide_mp_graph_wait(&w, caller), "captured fence kernel"));
            w.count = 0;
        }
        if (r == n || !tide_cuda_mp_fenced(x->a, r)) continue;
        w.rank[w.count] = r;
        w.flag[w.count] = (uint64_t)tide_cuda_mp_family_done_flag(x->a, r, f);
        ++w.count;
    }
    return TIDE_SUCCESS;
}

static tide_result_t graph_done(tide_cuda_call_t *c, int rank) {
    const tide_transport_ipc_t *x = c->tp_ctx;
    const int f = tide_cuda_mp_family_index(x->a, x->fam);
    return signal_flag(c, tide_cuda_call_caller(c, rank),
                       tide_cuda_mp_family_done_flag(x->a, rank, f), (int64_t)c->epoch + 1);
}

static tide_result_t graph_copy_batch(tide_cuda_call_t *c, int k, int t) {
    (void)k;
    return TIDE_ERR(TIDE_ERR_INTERNAL,
                    "cuda mp fabric: rank %d: a batch of copies in a captured call (thread %d)",
                    c->rank0, t);
}

const tide_cuda_transport_t tide_transport_ipc_graph =
    TIDE_CUDA_TRANSPORT("ipc-graph", graph, NULL, NULL);
