/*
 * schedule_commands.c - turn the abstract execution (schedule.c) into the command list of a call, one
 * list per form (FRESH, STEADY), replayed by the CUDA fabrics (fabric/cuda/execute.c) for every call.
 *
 * Walking the call's ops in the global order, each op becomes:
 *   WAIT   - event waits on the signal instances its target counts: those of this call
 *            (WAIT), and in the STEADY form those of the previous call (WAIT_PREV);
 *   other  - [FORK] OP [RECORD]: a thread forks from its rank's call-start event before its
 *            first op that touches memory or signals; a signalling op records its event.
 * At the end, JOIN commands let the caller's stream of each rank wait for the rank's threads.
 *
 * Redundant waits are dropped with vector clocks over the current call, the way a race
 * detector tracks happens-before: thread t knows vc[t][u] ops of thread u completed, and
 * vc[t][T + r] != 0 once it knows rank r started this call (hence, by the join and the
 * caller's stream, finished the previous one).  On a rail fabric (schedule.h) a wait on another
 * node's signal is never dropped and merges nothing.  A wait on signal X of thread u is redundant
 * when vc[t][u] already covers X; a wait on the previous call's X of rank r when rank r is
 * known to have started.  Only edges present in every call of the form are used: stream order,
 * the fork, and this call's event waits; so what is dropped is implied at run time.  Records
 * nobody waits for are dropped at the end.
 *
 * Every WAIT names a signal that precedes it in this list (checked below), and a WAIT_PREV one
 * of the previous call, enqueued before this call started: all dependencies point backwards
 * in enqueue order.
 */
#include "core/checks.h"
#include "program/schedule.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    tide_sched_cmd_t *cmds;
    int n, cap;
} cmd_list_t;

static tide_result_t emit(cmd_list_t *l, int kind, int thread, int arg) {
    if (l->n == l->cap) {
        if (l->cap > (1 << 28)) return TIDE_ERR(TIDE_ERR_OVERFLOW, "schedule: commands");
        int cap = l->cap == 0 ? 256 : 2 * l->cap;
        tide_sched_cmd_t *c = realloc(l->cmds, (size_t)cap * sizeof(*c));
        if (c == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: %d commands", cap);
        l->cmds = c;
        l->cap = cap;
    }
    l->cmds[l->n++] = (tide_sched_cmd_t){(uint8_t)kind, thread, arg};
    return TIDE_SUCCESS;
}

typedef struct {
    int32_t key;
    int32_t op;
} keyed_t;

static int by_key_desc(const void *a, const void *b) {
    const keyed_t *x = a, *y = b;
    return (x->key < y->key) - (x->key > y->key);
}
static int by_op(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Scratch of one form's pass. */
typedef struct {
    tide_sched_run_t *run;
    int form;
    int v_len;        /* threads + ranks */
    uint32_t *vc;     /* [threads][v_len] */
    int32_t *pos;     /* [ops]: index in the form's order */
    int32_t *snap_of; /* [ops]: snapshot index of a signal waited on in this form, or -1 */
    uint32_t *snaps;
    keyed_t *cur; /* scratch for one wait's dependencies */
    int32_t *prev;
    int *upload_thread;  /* [ranks] */
    bool *upload_waited; /* [threads] */
    bool *used;          /* [ops]: some emitted wait names this signal (both forms) */
    cmd_list_t out;
} pass_t;

static void merge(uint32_t *v, const uint32_t *w, int len) {
    for (int i = 0; i < len; ++i)
        if (w[i] > v[i]) v[i] = w[i];
}

/* Whether threads t and u belong to ranks of different nodes of a rail fabric. */
static bool cross_node(const tide_sched_run_t *run, int t, int u) {
    return run->rails_l > 0 &&
           (t / TIDE_Q_COUNT) / run->rails_l != (u / TIDE_Q_COUNT) / run->rails_l;
}

/* The wait of op `id` on thread t: emit the event waits its dependencies still need. */
static tide_result_t wait_deps(pass_t *ps, int id, int t) {
    tide_sched_run_t *run = ps->run;
    const tide_schedule_t *s = run->s;
    const int32_t target = run->target[ps->form][id];
    if (target <= 0) return TIDE_SUCCESS;
    const tide_op_t *op = tide_schedule_op(run->prog, s, id, t);
    const size_t c = (size_t)(t / TIDE_Q_COUNT) * (size_t)s->num_counters + (size_t)op->ctr;
    const tide_sched_sig_t *sig = &run->log[run->log_base[c]];
    int ncur = 0, nprev = 0;
    for (int i = 0; i < target; ++i) {
        if (sig[i].call == ps->form) {
            ps->cur[ncur++] = (keyed_t){ps->pos[sig[i].op], sig[i].op};
        } else if (sig[i].call == ps->form - 1) {
            ps->prev[nprev++] = sig[i].op;
        } else {
            const int u = run->op_thread[sig[i].op];
            return TIDE_ERR(TIDE_ERR_INTERNAL,
                            "schedule: rank %d queue %s op %d (wait, call %d) counts a "
                            "signal of call %d (rank %d queue %s): its count is ambiguous",
                            t / TIDE_Q_COUNT, tide_queue_name((tide_queue_t)(t % TIDE_Q_COUNT)),
                            id - s->op_base[t], ps->form, sig[i].call, u / TIDE_Q_COUNT,
                            tide_queue_name((tide_queue_t)(u % TIDE_Q_COUNT)));
        }
    }
    uint32_t *v = &ps->vc[(size_t)t * (size_t)ps->v_len];
    /* Latest first: a late signal's clock often covers the earlier ones. */
    qsort(ps->cur, (size_t)ncur, sizeof(*ps->cur), by_key_desc);
    for (int i = 0; i < ncur; ++i) {
        const int x = ps->cur[i].op, u = run->op_thread[x];
        if (cross_node(run, t, u)) { /* schedule.h: kept, and implies nothing */
            TIDE_CHECK(emit(&ps->out, TIDE_SCHED_CMD_WAIT, t, x));
            ps->used[x] = true;
            continue;
        }
        if (v[u] >= (uint32_t)(x - s->op_base[u] + 1)) continue;
        TIDE_CHECK(emit(&ps->out, TIDE_SCHED_CMD_WAIT, t, x));
        ps->used[x] = true;
        merge(v, &ps->snaps[(size_t)ps->snap_of[x] * (size_t)ps->v_len], ps->v_len);
    }
    /* Op ids are thread-major in queue order: per thread only the last one matters. */
    qsort(ps->prev, (size_t)nprev, sizeof(*ps->prev), by_op);
    for (int i = 0; i < nprev; ++i) {
        const int x = ps->prev[i], u = run->op_thread[x];
        if (i + 1 < nprev && run->op_thread[ps->prev[i + 1]] == u) continue;
        if (!cross_node(run, t, u) && v[s->num_threads + u / TIDE_Q_COUNT] != 0) continue;
        TIDE_CHECK(emit(&ps->out, TIDE_SCHED_CMD_WAIT_PREV, t, x));
        ps->used[x] = true;
    }
    return TIDE_SUCCESS;
}

/* Ops of thread t up to its last one that is not a WAIT (waits touch no memory). */
static uint32_t effective_len(const tide_sched_run_t *run, int t) {
    const tide_schedule_t *s = run->s;
    for (int id = s->op_base[t + 1] - 1; id >= s->op_base[t]; --id)
        if (tide_schedule_op(run->prog, s, id, t)->kind != TIDE_OP_WAIT)
            return (uint32_t)(id - s->op_base[t] + 1);
    return 0;
}

/* Caller-stream joins of rank r: threads whose ends cover every op of the rank that touches
 * memory or signals. */
static tide_result_t joins(pass_t *ps, int r) {
    uint32_t have[TIDE_Q_COUNT] = {0}, need[TIDE_Q_COUNT];
    for (int k = 0; k < TIDE_Q_COUNT; ++k)
        need[k] = effective_len(ps->run, r * TIDE_Q_COUNT + k);
    for (;;) {
        int best = -1, best_gain = 0;
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const int t = r * TIDE_Q_COUNT + q;
            const uint32_t *v = &ps->vc[(size_t)t * (size_t)ps->v_len];
            int gain = 0;
            for (int k = 0; k < TIDE_Q_COUNT; ++k)
                if (have[k] < need[k] && v[r * TIDE_Q_COUNT + k] >= need[k]) ++gain;
            if (gain > best_gain) best = t, best_gain = gain;
        }
        if (best < 0) return TIDE_SUCCESS;
        TIDE_CHECK(emit(&ps->out, TIDE_SCHED_CMD_JOIN, best, 0));
        for (int k = 0; k < TIDE_Q_COUNT; ++k) {
            const uint32_t w =
                ps->vc[(size_t)best * (size_t)ps->v_len + (size_t)(r * TIDE_Q_COUNT + k)];
            if (w > have[k]) have[k] = w;
        }
    }
}

static tide_result_t form_pass(pass_t *ps) {
    tide_sched_run_t *run = ps->run;
    tide_schedule_t *s = run->s;
    const int f = ps->form, nthreads = s->num_threads;
    const int32_t *order = run->order[f];

    /* Which signals of this call some wait of this call counts: they keep a clock snapshot. */
    int snaps = 0;
    for (int id = 0; id < s->num_ops; ++id)
        ps->snap_of[id] = -1;
    for (int k = 0; k < s->num_ops; ++k) {
        const int id = order[k], t = run->op_thread[id];
        ps->pos[id] = k;
        const int32_t target = run->target[f][id];
        if (target <= 0) continue;
        const tide_op_t *op = tide_schedule_op(run->prog, s, id, t);
        const size_t c = (size_t)(t / TIDE_Q_COUNT) * (size_t)s->num_counters + (size_t)op->ctr;
        for (int i = 0; i < target; ++i) {
            const tide_sched_sig_t *g = &run->log[run->log_base[c] + i];
            if (g->call == f && ps->snap_of[g->op] < 0) ps->snap_of[g->op] = snaps++;
        }
    }
    ps->snaps = calloc((size_t)(snaps > 0 ? snaps : 1) * (size_t)ps->v_len, sizeof(*ps->snaps));
    if (ps->snaps == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: %d clock snapshots", snaps);
    memset(ps->vc, 0, (size_t)nthreads * (size_t)ps->v_len * sizeof(*ps->vc));
    for (int r = 0; r < s->num_ranks; ++r)
        ps->upload_thread[r] = -1;
    memset(ps->upload_waited, 0, (size_t)nthreads * sizeof(*ps->upload_waited));

    for (int k = 0; k < s->num_ops; ++k) {
        const int id = order[k], t = run->op_thread[id], r = t / TIDE_Q_COUNT;
        const tide_op_t *op = tide_schedule_op(run->prog, s, id, t);
        uint32_t *v = &ps->vc[(size_t)t * (size_t)ps->v_len];
        if (op->kind == TIDE_OP_WAIT) {
            TIDE_CHECK(wait_deps(ps, id, t));
        } else {
            if (v[nthreads + r] == 0) {
                TIDE_CHECK(emit(&ps->out, TIDE_SCHED_CMD_FORK, t, 0));
                v[nthreads + r] = 1;
            }
            if (op->kind == TIDE_OP_SUM) {
                s->has_sum = true;
                if (ps->upload_thread[r] < 0) {
                    TIDE_CHECK(emit(&ps->out, TIDE_SCHED_CMD_UPLOAD, t, 0));
                    ps->upload_thread[r] = t;
                } else if (ps->upload_thread[r] != t && !ps->upload_waited[t]) {
                    TIDE_CHECK(emit(&ps->out, TIDE_SCHED_CMD_UPLOAD_WAIT, t, 0));
                    ps->upload_waited[t] = true;
                }
            }
            TIDE_CHECK(emit(&ps->out, TIDE_SCHED_CMD_OP, t, id));
        }
        v[t] = (uint32_t)(id - s->op_base[t] + 1);
        if (tide_schedule_op_signals(op)) {
            TIDE_CHECK(emit(&ps->out, TIDE_SCHED_CMD_RECORD, t, id));
            if (ps->snap_of[id] >= 0)
                memcpy(&ps->snaps[(size_t)ps->snap_of[id] * (size_t)ps->v_len], v,
                       (size_t)ps->v_len * sizeof(*v));
        }
    }
    for (int r = 0; r < s->num_ranks; ++r)
        TIDE_CHECK(joins(ps, r));
    return TIDE_SUCCESS;
}

/* Number the signals some wait names; drop the other records; check every wait points back. */
static tide_result_t assign_slots(tide_schedule_t *s, const int32_t *op_thread,
                                  const bool *used) {
    int32_t *slot_of = malloc(((size_t)s->num_ops + 1) * sizeof(*slot_of));
    if (slot_of == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: slots");
    int slots = 0;
    for (int id = 0; id < s->num_ops; ++id)
        slot_of[id] = used[id] ? slots++ : -1;
    s->num_slots = slots;
    s->slot_thread = malloc(((size_t)slots + 1) * sizeof(*s->slot_thread));
    bool *recorded = calloc((size_t)slots + 1, sizeof(*recorded));
    tide_result_t res = TIDE_SUCCESS;
    if (s->slot_thread == NULL || recorded == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: %d slots", slots);
        goto done;
    }
    for (int id = 0; id < s->num_ops; ++id)
        if (slot_of[id] >= 0) s->slot_thread[slot_of[id]] = op_thread[id];
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        memset(recorded, 0, (size_t)slots * sizeof(*recorded));
        int kept = 0;
        for (int i = 0; i < s->num_cmds[f]; ++i) {
            tide_sched_cmd_t c = s->cmds[f][i];
            if (c.kind == TIDE_SCHED_CMD_RECORD || c.kind == TIDE_SCHED_CMD_WAIT ||
                c.kind == TIDE_SCHED_CMD_WAIT_PREV) {
                const int slot = slot_of[c.arg];
                if (slot < 0) continue; /* a record nobody waits for */
                if (c.kind == TIDE_SCHED_CMD_RECORD) recorded[slot] = true;
                if (c.kind == TIDE_SCHED_CMD_WAIT && !recorded[slot]) {
                    res = TIDE_ERR(TIDE_ERR_INTERNAL,
                                   "schedule: a wait of thread %d "
                                   "precedes the record of its signal (op %d)",
                                   c.thread, c.arg);
                    goto done;
                }
                c.arg = slot;
            }
            s->cmds[f][kept++] = c;
        }
        s->num_cmds[f] = kept;
        for (int k = 0; k < slots; ++k)
            if (!recorded[k]) {
                res = TIDE_ERR(TIDE_ERR_INTERNAL,
                               "schedule: signal slot %d is not "
                               "recorded in every call",
                               k);
                goto done;
            }
    }
done:
    free(recorded);
    if (res == TIDE_SUCCESS)
        s->op_slot = slot_of; /* the NCCL rails find a credit's or a put's flag by its op */
    else
        free(slot_of);
    return res;
}

tide_result_t tide_schedule_commands_build(tide_sched_run_t *run) {
    tide_schedule_t *s = run->s;
    const size_t ops = (size_t)s->num_ops + 1, nthreads = (size_t)s->num_threads;
    tide_result_t res = TIDE_SUCCESS;
    pass_t ps;
    memset(&ps, 0, sizeof(ps));
    ps.run = run;
    ps.v_len = s->num_threads + s->num_ranks;
    ps.vc = calloc(nthreads * (size_t)ps.v_len, sizeof(*ps.vc));
    ps.pos = calloc(ops, sizeof(*ps.pos));
    ps.snap_of = calloc(ops, sizeof(*ps.snap_of));
    ps.cur = calloc(ops, sizeof(*ps.cur));
    ps.prev = calloc(ops, sizeof(*ps.prev));
    ps.upload_thread = calloc((size_t)s->num_ranks, sizeof(*ps.upload_thread));
    ps.upload_waited = calloc(nthreads, sizeof(*ps.upload_waited));
    ps.used = calloc(ops, sizeof(*ps.used));
    if (ps.vc == NULL || ps.pos == NULL || ps.snap_of == NULL || ps.cur == NULL ||
        ps.prev == NULL || ps.upload_thread == NULL || ps.upload_waited == NULL ||
        ps.used == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: clocks of %zu threads", nthreads);
        goto done;
    }
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        ps.form = f;
        memset(&ps.out, 0, sizeof(ps.out));
        res = form_pass(&ps);
        free(ps.snaps);
        ps.snaps = NULL;
        s->cmds[f] = ps.out.cmds;
        s->num_cmds[f] = ps.out.n;
        if (res != TIDE_SUCCESS) goto done;
    }
    res = assign_slots(s, run->op_thread, ps.used);
done:
    free(ps.used);
    free(ps.upload_waited);
    free(ps.upload_thread);
    free(ps.prev);
    free(ps.cur);
    free(ps.snap_of);
    free(ps.pos);
    free(ps.vc);
    return res;
}

/* ------------------------------------------------------------------ runs of waits */

tide_result_t tide_sched_wait_runs(const tide_sched_cmd_t *cmds, int n, int num_threads,
                                   uint8_t *defer, int *runs_out) {
    TIDE_ARG_CHECK(n >= 0 && num_threads > 0 && (n == 0 || cmds != NULL),
                   "schedule: wait runs of %d commands, %d threads", n, num_threads);
    int32_t *last = malloc((size_t)num_threads * sizeof(*last));
    if (last == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: wait runs of %d threads", num_threads);
    for (int t = 0; t < num_threads; ++t)
        last[t] = -1;
    int runs = 0;
    for (int i = 0; i < n; ++i) {
        const int t = cmds[i].thread;
        if (t < 0 || t >= num_threads) {
            free(last);
            return TIDE_ERR(TIDE_ERR_INTERNAL, "schedule: command %d on thread %d of %d", i, t,
                            num_threads);
        }
        const bool wait =
            cmds[i].kind == TIDE_SCHED_CMD_WAIT || cmds[i].kind == TIDE_SCHED_CMD_WAIT_PREV;
        if (defer != NULL) defer[i] = 0;
        if (wait) {
            const int p = last[t];
            if (p >= 0 && cmds[p].kind == cmds[i].kind) {
                if (defer != NULL) defer[p] = 1; /* it goes with this one */
            } else {
                ++runs;
            }
        }
        last[t] = i;
    }
    free(last);
    if (runs_out != NULL) *runs_out = runs;
    return TIDE_SUCCESS;
}
