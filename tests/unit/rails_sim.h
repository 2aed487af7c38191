/*
 * rails_sim.h - a program run on the abstract machine (program/machine.h) with rail semantics
 * (program/rails.h), shared by tests/unit/test_rails.c (schedule only) and
 * tests/unit/test_rails_data.c (with the bytes):
 *
 *   - a put waits for its step; a step posts when its queue reaches its first put and its
 *     credits ran; a step completes once every peer of its sends and receives posted it;
 *   - the receiver raises the counter of each received put at completion (a put that signals
 *     nothing raises nothing); the sender's own fused signal is not delivered;
 *   - waits on credit counters are dropped, credits deliver nothing.
 *
 * Two drivers: rails_sim_lockstep posts step g on every rank while only steps < g may
 * complete (the deadlock argument of docs/nccl-fabric.md); rails_sim_eager moves every step
 * as soon as the rail semantics let it and runs an op outside the put queues only when no
 * rail step and no put queue can move, one op at a time, and an op of the `lazy` rank outside
 * its put queue only when nothing else can move at all: that rank's receives overwrite their
 * buffers at the earliest moment its credits allow and its readers of those buffers come as
 * late as possible, so a missing credit shows as wrong data.
 */
#ifndef TIDE_TESTS_RAILS_SIM_H_
#define TIDE_TESTS_RAILS_SIM_H_

#include "test_util.h"

#include "program/counters.h"
#include "program/machine.h"
#include "program/program.h"
#include "program/rails.h"

/* Data hooks (NULL: schedule only).  on_op: op (rank, queue, index) of call e runs, a put
 * excepted; on_recv: the bytes of receive x of call e are moved into its receiver. */
typedef struct {
    void *ctx;
    void (*on_op)(void *ctx, int rank, int q, int i, int e);
    void (*on_recv)(void *ctx, const tide_rail_xfer_t *x, int e);
} rails_sim_hooks_t;

typedef struct {
    const tide_program_t *prog;
    const tide_rails_t *r;
    rails_sim_hooks_t hooks;
    tide_machine_t m;
    int steps;                   /* calls x num_steps */
    int *next_post;              /* [n] */
    uint8_t *posted;             /* [n * steps] */
    uint8_t *completed;          /* [n * steps] */
    int64_t *exec[TIDE_Q_COUNT]; /* [n * max ops]: calls an op ran in */
    int max_ops;
} rails_sim_t;

static inline int64_t *rails_sim_exec(rails_sim_t *s, int rank, int q, int i) {
    return &s->exec[q][(size_t)rank * (size_t)s->max_ops + (size_t)i];
}

static inline void rails_sim_init(rails_sim_t *s, const tide_program_t *prog, const tide_rails_t *r,
                                  int calls, const rails_sim_hooks_t *hooks) {
    memset(s, 0, sizeof(*s));
    s->prog = prog;
    s->r = r;
    if (hooks != NULL) s->hooks = *hooks;
    assert_tide(TIDE_SUCCESS,
                tide_machine_init(&s->m, prog, tide_machine_counters_used(prog), calls));
    const int n = prog->num_ranks;
    s->steps = calls * r->num_steps;
    for (int a = 0; a < n; ++a)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            if (prog->ranks[a].queues[q].num_ops > s->max_ops)
                s->max_ops = prog->ranks[a].queues[q].num_ops;
    s->next_post = calloc((size_t)n, sizeof(int));
    s->posted = calloc((size_t)n * (size_t)s->steps + 1, 1);
    s->completed = calloc((size_t)n * (size_t)s->steps + 1, 1);
    assert_true(s->next_post && s->posted && s->completed);
    for (int q = 0; q < TIDE_Q_COUNT; ++q) {
        s->exec[q] = calloc((size_t)n * (size_t)(s->max_ops + 1), sizeof(int64_t));
        assert_non_null(s->exec[q]);
    }
}

static inline void rails_sim_free(rails_sim_t *s) {
    tide_machine_free(&s->m);
    free(s->next_post);
    free(s->posted);
    free(s->completed);
    for (int q = 0; q < TIDE_Q_COUNT; ++q)
        free(s->exec[q]);
}

static inline bool rails_sim_try_post(rails_sim_t *s, int a) {
    const tide_rails_rank_t *ra = &s->r->ranks[a];
    const int g = s->next_post[a];
    if (g >= s->steps || s->m.finished[a]) return false;
    const int e = g / s->r->num_steps, st = g % s->r->num_steps;
    const tide_rail_step_t *step = &ra->steps[st];
    if (s->m.epoch[a] != e || s->m.pc[a * TIDE_Q_COUNT + step->queue] != step->first_op)
        return false;
    if (g > 0 && !s->completed[(size_t)a * (size_t)s->steps + (size_t)g - 1]) return false;
    for (int c = step->first_credit; c < step->first_credit + step->num_credits; ++c) {
        const tide_rail_credit_t *cr = &ra->credits[c];
        if (e - cr->delta >= 0 && *rails_sim_exec(s, a, cr->queue, cr->op) < e - cr->delta + 1)
            return false;
    }
    s->posted[(size_t)a * (size_t)s->steps + (size_t)g] = 1;
    ++s->next_post[a];
    return true;
}

static inline bool rails_sim_try_complete(rails_sim_t *s, int a, int limit) {
    const tide_rails_rank_t *ra = &s->r->ranks[a];
    bool any = false;
    for (int g = 0; g < limit && g < s->steps; ++g) {
        const size_t ag = (size_t)a * (size_t)s->steps + (size_t)g;
        if (!s->posted[ag] || s->completed[ag]) continue;
        const tide_rail_step_t *step = &ra->steps[g % s->r->num_steps];
        bool ok = true;
        for (int k = step->first_send; ok && k < step->first_send + step->num_sends; ++k)
            ok = s->posted[(size_t)ra->sends[k].dst_rank * (size_t)s->steps + (size_t)g];
        for (int k = step->first_recv; ok && k < step->first_recv + step->num_recvs; ++k)
            ok = s->posted[(size_t)ra->recvs[k].src_rank * (size_t)s->steps + (size_t)g];
        if (!ok) continue;
        s->completed[ag] = 1;
        for (int k = step->first_recv; k < step->first_recv + step->num_recvs; ++k) {
            const tide_rail_xfer_t *x = &ra->recvs[k];
            if (s->hooks.on_recv != NULL) s->hooks.on_recv(s->hooks.ctx, x, g / s->r->num_steps);
            if (x->ctr >= 0) ++*tide_machine_counter(&s->m, a, x->ctr);
        }
        any = true;
    }
    return any;
}

/* Fire thread t's head under rail semantics; false when it cannot run now. */
static inline bool rails_sim_try_fire(rails_sim_t *s, int t) {
    const int a = t / TIDE_Q_COUNT, q = t % TIDE_Q_COUNT;
    const tide_op_t *op = tide_machine_head(&s->m, t);
    if (op == NULL) return false;
    const int i = s->m.pc[t], e = s->m.epoch[a];
    const tide_rails_rank_t *ra = &s->r->ranks[a];
    if (q == ra->queue && ra->put_step[i] >= 0) {
        const int g = e * s->r->num_steps + ra->put_step[i];
        if (!s->completed[(size_t)a * (size_t)s->steps + (size_t)g]) return false;
        const int rank = op->sig_rank, ctr = op->ctr;
        tide_machine_fire(&s->m, t);
        /* The receiver raised it at completion. */
        if (rank >= 0) --*tide_machine_counter(&s->m, rank, ctr);
        return true;
    }
    if (ra->credit[q][i]) {
        const int rank = op->sig_rank, ctr = op->ctr;
        ++*rails_sim_exec(s, a, q, i);
        tide_machine_fire(&s->m, t);
        --*tide_machine_counter(&s->m, rank, ctr); /* a credit delivers nothing */
        return true;
    }
    if (!ra->dropped[q][i] && !tide_machine_enabled(&s->m, t)) return false;
    ++*rails_sim_exec(s, a, q, i);
    if (s->hooks.on_op != NULL && op->kind != TIDE_OP_WAIT)
        s->hooks.on_op(s->hooks.ctx, a, q, i, e);
    tide_machine_fire(&s->m, t);
    return true;
}

static inline bool rails_sim_rail_progress(rails_sim_t *s, int limit) {
    bool progress = false;
    for (int a = 0; a < s->m.n; ++a) {
        while (rails_sim_try_post(s, a))
            progress = true;
        if (rails_sim_try_complete(s, a, limit)) progress = true;
    }
    return progress;
}

static inline void rails_sim_fixpoint(rails_sim_t *s, int limit) {
    for (bool progress = true; progress;) {
        progress = false;
        for (int t = 0; t < s->m.threads; ++t)
            while (rails_sim_try_fire(s, t))
                progress = true;
        if (rails_sim_rail_progress(s, limit)) progress = true;
    }
}

/* The lockstep driver (top); false with the reason in `why` when a rank cannot post a step
 * or the calls do not finish. */
static inline bool rails_sim_lockstep(rails_sim_t *s, char *why, size_t len) {
    const tide_rails_t *r = s->r;
    for (int g = 0; g < s->steps; ++g) {
        rails_sim_fixpoint(s, g);
        for (int a = 0; a < s->m.n; ++a)
            if (!s->posted[(size_t)a * (size_t)s->steps + (size_t)g]) {
                const int t = a * TIDE_Q_COUNT + r->ranks[a].queue;
                snprintf(why, len,
                         "rank %d cannot post step %d of call %d while only earlier steps "
                         "completed (its %s queue is at op %d, call %d)",
                         a, g % r->num_steps, g / r->num_steps,
                         tide_queue_name((tide_queue_t)r->ranks[a].queue), s->m.pc[t],
                         s->m.epoch[a]);
                return false;
            }
    }
    rails_sim_fixpoint(s, s->steps);
    if (!tide_machine_done(&s->m)) {
        snprintf(why, len, "the calls do not finish after every step completed");
        return false;
    }
    return true;
}

/* The eager driver (top); false when the calls do not finish. */
static inline bool rails_sim_eager(rails_sim_t *s, int lazy) {
    for (;;) {
        if (rails_sim_rail_progress(s, s->steps)) continue;
        bool fired = false;
        for (int a = 0; a < s->m.n && !fired; ++a) {
            const int q = s->r->ranks[a].queue;
            if (q >= 0) fired = rails_sim_try_fire(s, a * TIDE_Q_COUNT + q);
        }
        for (int t = 0; t < s->m.threads && !fired; ++t)
            if (t / TIDE_Q_COUNT != lazy) fired = rails_sim_try_fire(s, t);
        for (int q = 0; q < TIDE_Q_COUNT && !fired && lazy >= 0; ++q)
            fired = rails_sim_try_fire(s, lazy * TIDE_Q_COUNT + q);
        if (!fired) break;
    }
    return tide_machine_done(&s->m);
}

#endif /* TIDE_TESTS_RAILS_SIM_H_ */
