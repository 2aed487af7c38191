/*
 * call.c - the one command interpreter of the CUDA fabrics (transport.h): a call's commands
 * replayed on streams, whatever transport carries its signals.
 *
 * Both executors (execute.c: every rank in this process; mp_execute.c: one process per rank,
 * also under the NCCL fabric) fill a tide_cuda_call_t and hand it their command list; the
 * signals, the fences, the batches of copies and the rail puts go through the call's
 * transport.  The order of stream operations is the command list's, so the deadlock argument
 * of execute.c holds for every transport that keeps transport.h's contract.
 */
#include "core/checks.h"
#include "fabric/cuda/transport.h"

#include <string.h>

tide_result_t tide_cuda_call_device(tide_cuda_call_t *c, int rank) {
    if (c->num_devices <= 0) return TIDE_SUCCESS;
    const int d = rank % c->num_devices;
    if (d == c->cur_dev) return TIDE_SUCCESS;
    TIDE_CUDA_CALL(cudaSetDevice(d), "cudaSetDevice");
    c->cur_dev = d;
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_call_wait_event(tide_cuda_call_t *c, cudaStream_t s, cudaEvent_t ev) {
    ++c->st.waits;
    TIDE_CUDA_CALL(cudaStreamWaitEvent(s, ev, 0), "cudaStreamWaitEvent");
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_call_record_event(tide_cuda_call_t *c, cudaEvent_t ev, cudaStream_t s) {
    ++c->st.records;
    TIDE_CUDA_CALL(cudaEventRecord(ev, s), "cudaEventRecord");
    return TIDE_SUCCESS;
}

/* Op `id` of thread t's data on stream s. */
static tide_result_t issue_data(tide_cuda_call_t *c, int id, int t, cudaStream_t s) {
    const int rank = t / TIDE_CUDA_Q, q = t % TIDE_CUDA_Q, index = id - c->sched->op_base[t];
    const tide_rank_program_t *rp = &c->checked[rank - c->rank0]->ranks[rank];
    const int dev = c->num_devices > 0 ? c->cur_dev : 0;
    const tide_cuda_op_env_t env = {
        .max_pitch = c->max_pitch[dev],
        .sm_count = c->sm_count[dev],
        .sum_ctas = c->sum_ctas,
        .landing_ctas = c->landing_ctas,
        .slicing = c->slicing,
    };
    return tide_cuda_op_issue(&env, rp, rank, q, index, &c->bound[id], s, &c->st);
}

tide_result_t tide_cuda_call_late(tide_cuda_call_t *c, int rank, const uint8_t *late) {
    const cudaStream_t s = tide_cuda_call_caller(c, rank);
    const tide_rank_program_t *rp = &c->checked[rank - c->rank0]->ranks[rank];
    for (int q = 0; q < TIDE_CUDA_Q; ++q) {
        const int t = rank * TIDE_CUDA_Q + q;
        for (int id = c->sched->op_base[t]; id < c->sched->op_base[t + 1]; ++id) {
            if (!late[id]) continue;
            const tide_op_t *op = &rp->queues[q].ops[id - c->sched->op_base[t]];
            if (op->kind != TIDE_OP_EVENT) {
                TIDE_CHECK(issue_data(c, id, t, s));
                continue;
            }
            TIDE_CHECK(tide_cuda_call_record_event(
                c, c->user[(rank - c->rank0) * TIDE_EVENT_COUNT + op->event], s));
        }
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_call_op(tide_cuda_call_t *c, int id, int t) {
    const int rank = t / TIDE_CUDA_Q, q = t % TIDE_CUDA_Q, index = id - c->sched->op_base[t];
    const tide_rank_program_t *rp = &c->checked[rank - c->rank0]->ranks[rank];
    const tide_op_t *op = &rp->queues[q].ops[index];
    const cudaStream_t s = tide_cuda_call_stream(c, t);
    if (c->elide != NULL && c->elide[id]) {
        ++c->st.elided;
        return TIDE_SUCCESS; /* direct mode: nothing reads what it would write */
    }
    if (c->fused_land != NULL && c->fused_land[id]) {
        ++c->st.fused;
        return TIDE_SUCCESS; /* direct mode: a fused sum stored this landing */
    }
    if (op->kind == TIDE_OP_EVENT) {
        /* Direct sums: the peers read this rank's gradients until their calls end; direct
         * all-gather: they read its shard.  The executor records these events then. */
        if (c->skip_read_done && op->event == TIDE_EVENT_READ_DONE) return TIDE_SUCCESS;
        if (c->skip_call_done && op->event == TIDE_EVENT_CALL_DONE) return TIDE_SUCCESS;
        ++c->st.records;
        const cudaError_t e =
            cudaEventRecord(c->user[(rank - c->rank0) * TIDE_EVENT_COUNT + op->event], s);
        return e == cudaSuccess
                   ? TIDE_SUCCESS
                   : tide_cuda_op_failed(e, rank, q, index, op->kind, "cudaEventRecord");
    }
    /* SIGNAL: its record follows as a command. */
    return issue_data(c, id, t, s);
}

/* Refresh rank r's gradient pointer table of this parity (skipped when unchanged). */
static tide_result_t issue_upload(tide_cuda_call_t *c, int t) {
    tide_cuda_rows_t *rw = &c->rows;
    const int r = t / TIDE_CUDA_Q, lr = r - c->rank0;
    const size_t row = (size_t)rw->row * sizeof(void *);
    const void **want = rw->want(c, r);
    const void **last = &rw->last[(size_t)lr * (size_t)rw->row];
    if (rw->valid[lr] && memcmp(last, want, row) == 0) return TIDE_SUCCESS;
    /* The pinned row may still feed the copy of call e - 2. */
    if (rw->inflight[lr])
        TIDE_CUDA_CALL(cudaEventSynchronize(rw->done[lr]), "cudaEventSynchronize(upload)");
    const void **pinned = &rw->host[(size_t)lr * (size_t)rw->row];
    memcpy(pinned, want, row);
    rw->valid[lr] = false;
    ++c->st.descriptors;
    ++c->st.uploads;
    const cudaStream_t s = tide_cuda_call_stream(c, t);
    TIDE_CUDA_CALL(cudaMemcpyAsync(rw->dev[lr], pinned, row, cudaMemcpyHostToDevice, s),
                   "cudaMemcpyAsync(gradient pointers)");
    TIDE_CHECK(tide_cuda_call_record_event(c, rw->done[lr], s));
    rw->inflight[lr] = true;
    memcpy(last, want, row);
    rw->valid[lr] = true;
    return TIDE_SUCCESS;
}

static tide_result_t issue_cmd(tide_cuda_call_t *c, const tide_sched_cmd_t *cmd) {
    const int t = cmd->thread, r = t / TIDE_CUDA_Q;
    const cudaStream_t s = tide_cuda_call_stream(c, t);
    TIDE_CHECK(tide_cuda_call_device(c, r));
    switch (cmd->kind) {
    case TIDE_SCHED_CMD_FORK:
        return tide_cuda_call_wait_event(c, s, c->start[r - c->rank0]);
    case TIDE_SCHED_CMD_OP:
        if (c->tp->rail_put != NULL) {
            bool carried = false;
            TIDE_CHECK(c->tp->rail_put(c, cmd->arg, s, &carried));
            if (carried) return TIDE_SUCCESS;
        }
        return tide_cuda_call_op(c, cmd->arg, t);
    case TIDE_SCHED_CMD_RECORD:
        return c->tp->record(c, s, cmd->arg);
    case TIDE_SCHED_CMD_WAIT:
    case TIDE_SCHED_CMD_WAIT_PREV:
        return c->tp->wait(c, s, cmd->arg, cmd->kind == TIDE_SCHED_CMD_WAIT_PREV);
    case TIDE_SCHED_CMD_UPLOAD: /* a captured call's table is uploaded already (graph.c) */
        return c->graph ? TIDE_SUCCESS : issue_upload(c, t);
    case TIDE_SCHED_CMD_UPLOAD_WAIT:
        return c->graph ? TIDE_SUCCESS
                        : tide_cuda_call_wait_event(c, s, c->rows.done[r - c->rank0]);
    case TIDE_SCHED_CMD_JOIN: {
        cudaEvent_t end = c->end[t - c->rank0 * TIDE_CUDA_Q];
        TIDE_CHECK(tide_cuda_call_record_event(c, end, s));
        return tide_cuda_call_wait_event(c, tide_cuda_call_caller(c, r), end);
    }
    case TIDE_SCHED_CMD_BATCH:
        return c->tp->copy_batch(c, cmd->arg, t);
    default:
        return TIDE_ERR(TIDE_ERR_INTERNAL, "cuda fabric (%s): command kind %d", c->tp->name,
                        cmd->kind);
    }
}

/* The waits of a run not issued yet, per queue of the one rank (tide_sched_wait_runs). */
typedef struct {
    int slots[TIDE_CUDA_WAIT_RUN_MAX];
    int n;
} wait_run_t;

static tide_result_t flush_run(tide_cuda_call_t *c, wait_run_t *w, int t, bool prev) {
    if (w->n == 0) return TIDE_SUCCESS;
    TIDE_CHECK(tide_cuda_call_device(c, t / TIDE_CUDA_Q));
    const tide_result_t res = c->tp->wait_run(c, tide_cuda_call_stream(c, t), w->slots, w->n, prev);
    w->n = 0;
    return res;
}

/* A WAIT of a run: held until the run's last wait, then all at once (transport.h, wait_run).
 * Holding a wait back keeps the thread's stream order (nothing of the thread stands between
 * the run's waits) and only moves it later in the enqueue order. */
static tide_result_t run_wait(tide_cuda_call_t *c, wait_run_t *runs, const tide_sched_cmd_t *cmd,
                              bool more) {
    const int t = cmd->thread;
    wait_run_t *w = &runs[t % TIDE_CUDA_Q];
    const bool prev = cmd->kind == TIDE_SCHED_CMD_WAIT_PREV;
    if (w->n == TIDE_CUDA_WAIT_RUN_MAX) TIDE_CHECK(flush_run(c, w, t, prev));
    w->slots[w->n++] = cmd->arg;
    return more ? TIDE_SUCCESS : flush_run(c, w, t, prev);
}

tide_result_t tide_cuda_call_run(tide_cuda_call_t *c, const tide_sched_cmd_t *cmds, int n,
                                 const int32_t *action) {
    const bool runs_on = c->wait_defer != NULL && c->tp->wait_run != NULL && c->num_ranks == 1;
    wait_run_t runs[TIDE_CUDA_Q];
    for (int q = 0; q < TIDE_CUDA_Q; ++q)
        runs[q].n = 0;
    for (int i = 0; i < n; ++i) {
        const int k = action != NULL ? action[i] : -1;
        if (k == -2) continue; /* a later op of a batch enqueued at its first op */
        if (k >= 0) {
            TIDE_CHECK(c->tp->copy_batch(c, k, cmds[i].thread));
            continue;
        }
        const bool wait =
            cmds[i].kind == TIDE_SCHED_CMD_WAIT || cmds[i].kind == TIDE_SCHED_CMD_WAIT_PREV;
        if (runs_on && wait) {
            TIDE_CHECK(run_wait(c, runs, &cmds[i], c->wait_defer[i] != 0));
            continue;
        }
        TIDE_CHECK(issue_cmd(c, &cmds[i]));
    }
    for (int q = 0; q < TIDE_CUDA_Q; ++q)
        if (runs[q].n != 0)
            return TIDE_ERR(TIDE_ERR_INTERNAL,
                            "cuda fabric (%s): %d waits of queue %d left at the end of the "
                            "call (the run plan is not this command list's)",
                            c->tp->name, runs[q].n, q);
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_call_enqueue(tide_cuda_call_t *c, const tide_cuda_call_hooks_t *h,
                                     int64_t fence, const tide_sched_cmd_t *cmds, int n,
                                     const int32_t *action) {
    const int end = c->rank0 + c->num_ranks;
    for (int r = c->rank0; r < end; ++r) {
        TIDE_CHECK(tide_cuda_call_device(c, r));
        if (h->begin != NULL) TIDE_CHECK(h->begin(c, r));
        if (fence >= 0) TIDE_CHECK(c->tp->fence(c, r, fence));
        if (h->prologue != NULL) TIDE_CHECK(h->prologue(c, r));
        TIDE_CHECK(
            tide_cuda_call_record_event(c, c->start[r - c->rank0], tide_cuda_call_caller(c, r)));
    }
    TIDE_CHECK(tide_cuda_call_run(c, cmds, n, action));
    for (int r = c->rank0; r < end; ++r) {
        TIDE_CHECK(tide_cuda_call_device(c, r));
        TIDE_CHECK(c->tp->done(c, r));
    }
    return h->epilogue != NULL ? h->epilogue(c) : TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ recording a call */

void tide_cuda_call_order(uint64_t epoch, int prep, int64_t last_epoch, int last_prep, bool same,
                          int *form_out, int64_t *fence_out) {
    const bool steady =
        epoch >= 1 && last_epoch == (int64_t)epoch - 1 && last_prep == prep && same;
    *form_out = steady ? TIDE_SCHED_STEADY : TIDE_SCHED_FRESH;
    *fence_out = steady ? (int64_t)epoch - 2 : (int64_t)epoch - 1;
}

tide_result_t tide_cuda_call_switch_check(const char *fabric, uint64_t epoch, int form, int prep,
                                          int64_t last_epoch, int last_prep,
                                          const tide_schedule_t *sched,
                                          const tide_schedule_t *last) {
    if (form != TIDE_SCHED_STEADY && last_epoch >= 0 && last_prep != prep &&
        !tide_schedule_incs_match(sched, last))
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "%s: call %llu switches programs whose counters count differently per "
                        "call",
                        fabric, (unsigned long long)epoch);
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_call_checked(const char *fabric, const tide_program_t *prog, int rank,
                                     const tide_schedule_t *sched,
                                     const tide_program_t **checked) {
    if (*checked == prog) return TIDE_SUCCESS;
    if (tide_schedule_rank_hash(prog, rank) != sched->rank_hash[rank])
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "%s: rank %d's program differs from the one its schedule was built from",
                        fabric, rank);
    *checked = prog;
    return TIDE_SUCCESS;
}

void tide_cuda_call_ctas(const tide_binding_t *b, int *sum_ctas_out, int *landing_ctas_out) {
    const tide_config_t *cfg = &b->plan->config;
    *sum_ctas_out = cfg->sum_ctas > 0 ? cfg->sum_ctas : 1;
    *landing_ctas_out = cfg->landing_ctas > 0 ? cfg->landing_ctas : 1;
}
