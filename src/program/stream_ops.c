/*
 * stream_ops.c - the per-rank stream operations of one call on the CUDA fabrics, counted from
 * the schedule's commands (stream_ops.h).  The command walk is call.c's issue_cmd and
 * tide_cuda_call_op; the executor's part is call.c's enqueue with execute.c's hooks (EVENTS)
 * or mp_execute.c's and ipc.c's (FLAGS).
 */
#include "program/stream_ops.h"

#include "core/checks.h"

#include <stdlib.h>
#include <string.h>

/* One stream: whether its last command was a WAIT, and the WAITs (and their runs) since its
 * last issued data op. */
typedef struct {
    bool in_run;
    int waits, peer, runs;
    int last_kind; /* the stream's last command's kind, -1: none (the flag fabric's runs) */
} pending_t;

static void count_op(const tide_op_t *op, const tide_direct_t *dir, int id, bool direct_sum,
                     tide_stream_ops_t *o) {
    if (dir != NULL && dir->elide != NULL && dir->elide[id]) {
        ++o->elided;
        return;
    }
    if (dir != NULL && dir->fused_land != NULL && dir->fused_land[id]) {
        ++o->fused;
        return;
    }
    switch (op->kind) {
    case TIDE_OP_COPY:
    case TIDE_OP_ZERO:
    case TIDE_OP_CAST:
        if (op->bytes > 0) ++o->copies;
        break;
    case TIDE_OP_COPY2D:
        if (op->bytes > 0 && op->rows > 0) ++o->copies;
        break;
    case TIDE_OP_SUM:
        ++o->sums;
        break;
    case TIDE_OP_LAND:
        ++o->lands;
        break;
    case TIDE_OP_EVENT:
        /* Direct sums: read-done is the executor's, after every rank's call (call.c). */
        if (!(direct_sum && op->event == TIDE_EVENT_READ_DONE)) ++o->events;
        break;
    default:
        break; /* SIGNAL and WAIT: the commands carry them */
    }
}

/* The executor's part of rank `rank`'s call (an eager call after the first: it has a fence). */
static void count_executor(tide_stream_ops_fabric_t fabric, int n, bool direct_sum, bool elided,
                           tide_stream_ops_t *o, tide_stream_ops_shared_t *sh) {
    if (fabric == TIDE_STREAM_OPS_EVENTS) {
        o->exec_event_records += 2; /* call start, done */
        o->exec_event_waits += 1;   /* the fence: the aggregate event of every rank's call */
        /* execute.c's epilogue, once per call: read-done of every rank after the node's
         * call (utility stream), then the fence event (aggregate stream). */
        if (direct_sum) {
            sh->event_waits += n;
            sh->event_records += n;
        }
        sh->event_waits += n;
        sh->event_records += 1;
        return;
    }
    /* mp_execute.c: begin (the "began" word, written where the control block is mapped to
     * the device: host flags and kernel waits, the default; the watchdog's begin event), the
     * fence on every rank's done flag, the start event; ipc.c's done flag; the epilogue's
     * done event. */
    o->exec_flag_writes += 2;
    o->exec_event_records += 3;
    if (!(direct_sum || elided)) {
        o->exec_flag_waits += n;
        o->exec_flag_calls += 1;
        return;
    }
    /* mp_direct.c / mp_execute.c: the call ends once every rank's did (the other ranks' done
     * flags: its own was written on the same stream), then read-done (with the elision, the
     * late EVENTs instead: counted as events).  The start fence is then implied by the
     * previous call's end fence on the same stream (mp_execute.c, fence_implied). */
    o->exec_flag_waits += n - 1;
    o->exec_flag_calls += n > 1;
    if (!elided) o->exec_event_records += 1;
}

/* The late ops of rank `rank` (sync_elide.h), issued by the executor after its end fence. */
static void count_late(const tide_program_t *prog, const tide_schedule_t *sched,
                       const tide_sync_elide_t *se, int rank, tide_stream_ops_t *o) {
    for (int t = rank * TIDE_Q_COUNT; t < (rank + 1) * TIDE_Q_COUNT; ++t)
        for (int id = sched->op_base[t]; id < sched->op_base[t + 1]; ++id) {
            if (!se->late[id]) continue;
            const tide_op_t *op = tide_schedule_op(prog, sched, id, t);
            if (op->kind == TIDE_OP_EVENT)
                ++o->events;
            else if (op->bytes > 0)
                ++o->copies;
        }
}

tide_result_t tide_stream_ops_count(const tide_program_t *prog, const tide_schedule_t *sched,
                                    const tide_direct_t *dir, const tide_sync_elide_t *se,
                                    tide_stream_ops_fabric_t fabric, int rank, int form,
                                    tide_stream_ops_t *out, tide_stream_ops_shared_t *shared_out) {
    TIDE_ARG_CHECK(prog != NULL && sched != NULL && out != NULL, "stream ops: NULL argument");
    TIDE_ARG_CHECK(rank >= 0 && rank < sched->num_ranks, "stream ops: rank %d of %d", rank,
                   sched->num_ranks);
    TIDE_ARG_CHECK(form >= 0 && form < TIDE_SCHED_FORMS, "stream ops: form %d", form);
    TIDE_ARG_CHECK(fabric == TIDE_STREAM_OPS_EVENTS || fabric == TIDE_STREAM_OPS_FLAGS,
                   "stream ops: fabric %d", (int)fabric);
    pending_t *pend = calloc((size_t)sched->num_threads + 1, sizeof(*pend));
    if (pend == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "stream ops: %d threads", sched->num_threads);
    for (int t = 0; t <= sched->num_threads; ++t)
        pend[t].last_kind = -1;
    tide_stream_ops_t o;
    tide_stream_ops_shared_t sh;
    memset(&o, 0, sizeof(o));
    memset(&sh, 0, sizeof(sh));
    /* Direct sums, as both executors decide them: the analysis found them (the peers'
     * operands addressable on FLAGS is a run-time condition, assumed met). */
    const bool direct_sum = dir != NULL && dir->rs && dir->sum;
    const tide_direct_t *d = direct_sum ? dir : NULL;
    /* The elision: a fused reduce-scatter (direct sums), or an all-gather. */
    const bool elided = se != NULL && se->on &&
                        (direct_sum || prog->coll == TIDE_COLL_ALL_GATHER);
    const tide_sched_cmd_t *cmds = elided ? se->cmds[form] : sched->cmds[form];
    const int ncmds = elided ? se->num_cmds[form] : sched->num_cmds[form];
    for (int i = 0; i < ncmds; ++i) {
        const tide_sched_cmd_t *c = &cmds[i];
        const int t = c->thread;
        if (t / TIDE_Q_COUNT != rank) continue;
        pending_t *p = &pend[t];
        /* The flag fabric's runs (program/schedule.h, tide_sched_wait_runs): a wait that
         * directly follows a wait of the same kind on its stream goes with it. */
        const int kind_before = p->last_kind;
        p->last_kind = c->kind;
        if (c->kind == TIDE_SCHED_CMD_WAIT || c->kind == TIDE_SCHED_CMD_WAIT_PREV) {
            if (kind_before != c->kind) ++o.wait_calls;
            const bool peer = sched->slot_thread[c->arg] / TIDE_Q_COUNT != rank;
            ++*(peer ? &o.waits_peer : &o.waits_own);
            if (!p->in_run) {
                ++o.wait_runs;
                ++p->runs;
            }
            p->in_run = true;
            ++p->waits;
            p->peer += peer;
            continue;
        }
        if (c->kind == TIDE_SCHED_CMD_OP) {
            const tide_op_t *op = tide_schedule_op(prog, sched, c->arg, t);
            const tide_stream_ops_t before = o;
            count_op(op, d, c->arg, direct_sum, &o);
            if (o.sums > before.sums) {
                o.sum_waits += p->waits;
                o.sum_waits_peer += p->peer;
                o.sum_wait_runs += p->runs;
            }
            if (o.copies + o.sums + o.lands + o.events ==
                before.copies + before.sums + before.lands + before.events)
                continue; /* nothing issued: the stream's run of waits goes on */
            p->waits = p->peer = p->runs = 0; /* a data op or an event issued */
        } else if (c->kind == TIDE_SCHED_CMD_FORK) {
            ++o.forks;
        } else if (c->kind == TIDE_SCHED_CMD_JOIN) {
            ++o.joins;
        } else if (c->kind == TIDE_SCHED_CMD_RECORD) {
            ++o.records;
        } else if (c->kind == TIDE_SCHED_CMD_UPLOAD) {
            continue; /* the row is unchanged: nothing issued */
        } else if (c->kind == TIDE_SCHED_CMD_UPLOAD_WAIT) {
            ++o.upload_waits;
        } else {
            free(pend);
            return TIDE_ERR(TIDE_ERR_INTERNAL,
                            "stream ops: command kind %d (batches are the "
                            "executor's plan)",
                            c->kind);
        }
        /* Any other command of this stream ends its run of waits. */
        p->in_run = false;
    }
    free(pend);
    if (elided) count_late(prog, sched, se, rank, &o);
    count_executor(fabric, sched->num_ranks, direct_sum, elided, &o, &sh);
    *out = o;
    if (shared_out != NULL) *shared_out = sh;
    return TIDE_SUCCESS;
}
