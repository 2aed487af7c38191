/*
 * schedule.c - resolve a program's counters on the host: the abstract execution of two
 * consecutive calls of all ranks.
 *
 * The abstract machine (program/machine.h) runs two calls from counters at 0: sweeps over
 * the (rank, queue) threads fire every enabled op, in program order per thread, and the
 * machine gives a rank its call 1 only after all of its queues finished call 0 (the fabrics
 * enforce the same per-rank order, see fabric/cuda/execute.c).  The run records
 *   - the order in which ops ran, per call: call 0 is the FRESH order (nothing of the program
 *     in flight), call 1 the STEADY order (the previous call's ops enqueued before);
 *   - per counter, the signal instances (op, call) in the order they were applied;
 *   - per WAIT and call, its target e inc + thr.
 * A WAIT with target T depends on the first T signal instances of its counter.  The programs
 * keep counts unambiguous (no signal of a later use reaches a counter before the waiter
 * passes, see compile_rs.c), so these are the signals every execution's wait counts.  A
 * dependency of a call-0 wait on a call-1 signal contradicts that and is rejected.
 *
 * The counters themselves are never touched at run time: schedule_commands.c turns dependencies into
 * event waits.
 */
#include "core/checks.h"
#include "plan/plan.h"
#include "program/rails.h"
#include "program/schedule.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static tide_result_t layout(const tide_program_t *prog, tide_schedule_t *s) {
    const int n = prog->num_ranks;
    s->num_ranks = n;
    s->num_threads = n * TIDE_Q_COUNT;
    s->op_base = calloc((size_t)s->num_threads + 1, sizeof(*s->op_base));
    if (s->op_base == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: %d threads", n);
    int64_t total = 0, max_ctr = -1;
    for (int t = 0; t < s->num_threads; ++t) {
        const tide_queue_ops_t *qo = &prog->ranks[t / TIDE_Q_COUNT].queues[t % TIDE_Q_COUNT];
        s->op_base[t] = (int)total;
        total += qo->num_ops;
        if (total > INT32_MAX / 2)
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "schedule: more than %d ops", INT32_MAX / 2);
        for (int i = 0; i < qo->num_ops; ++i) {
            const tide_op_t *op = &qo->ops[i];
            if (op->kind >= TIDE_OP_KIND_COUNT)
                return TIDE_ERR(TIDE_ERR_INTERNAL,
                                "schedule: rank %d queue %s op %d has "
                                "kind %d",
                                t / TIDE_Q_COUNT, tide_queue_name((tide_queue_t)(t % TIDE_Q_COUNT)),
                                i, op->kind);
            if (op->kind != TIDE_OP_WAIT && !tide_schedule_op_signals(op)) continue;
            if (op->ctr < 0 || op->ctr >= TIDE_ARENA_SIGNAL_SLOTS ||
                (op->kind != TIDE_OP_WAIT && (op->sig_rank < 0 || op->sig_rank >= n)))
                return TIDE_ERR(TIDE_ERR_INTERNAL,
                                "schedule: rank %d queue %s op %d (%s) "
                                "names counter %d of rank %d",
                                t / TIDE_Q_COUNT, tide_queue_name((tide_queue_t)(t % TIDE_Q_COUNT)),
                                i, tide_op_kind_name(op->kind), op->ctr, op->sig_rank);
            if (op->ctr > max_ctr) max_ctr = op->ctr;
        }
    }
    s->op_base[s->num_threads] = (int)total;
    s->num_ops = (int)total;
    s->num_counters = (int)(max_ctr + 1);
    return TIDE_SUCCESS;
}

/* Signals per call on every counter (the machine's count), and the log's layout (two calls
 * per counter). */
static tide_result_t count_signals(tide_sched_run_t *run) {
    tide_schedule_t *s = run->s;
    const size_t ctrs = (size_t)s->num_ranks * (size_t)s->num_counters;
    int64_t *count = NULL;
    TIDE_CHECK(tide_machine_count_signals(run->prog, s->num_counters, &count));
    s->incs = calloc(ctrs > 0 ? ctrs : 1, sizeof(*s->incs));
    run->log_base = calloc(ctrs + 1, sizeof(*run->log_base));
    if (s->incs == NULL || run->log_base == NULL) {
        free(count);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: %zu counters", ctrs);
    }
    /* A counter receives at most num_ops <= INT32_MAX / 2 signals per call (layout). */
    for (size_t c = 0; c < ctrs; ++c)
        s->incs[c] = (int32_t)count[c];
    free(count);
    for (int t = 0; t < s->num_threads; ++t)
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id)
            run->op_thread[id] = t;
    for (size_t c = 0; c < ctrs; ++c)
        run->log_base[c + 1] = run->log_base[c] + 2 * s->incs[c];
    run->log = calloc((size_t)run->log_base[ctrs] + 1, sizeof(*run->log));
    if (run->log == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: signal log");
    return TIDE_SUCCESS;
}

/* The wait nobody can satisfy, for the deadlock message. */
static tide_result_t deadlock(const tide_machine_t *m) {
    for (int t = 0; t < m->threads; ++t) {
        const tide_op_t *op = tide_machine_head(m, t);
        if (op == NULL) continue;
        const int r = t / TIDE_Q_COUNT;
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "schedule: the program deadlocks: rank %d queue %s op %d (wait) of "
                        "call %d never passes: counter %d = %" PRId64 ", target %d x %" PRId64
                        " + %" PRId64,
                        r, tide_queue_name((tide_queue_t)(t % TIDE_Q_COUNT)), m->pc[t],
                        m->epoch[r], op->ctr, *tide_machine_counter(m, r, op->ctr), m->epoch[r],
                        op->inc, op->thr);
    }
    return TIDE_ERR(TIDE_ERR_INTERNAL, "schedule: the abstract execution stalled");
}

/* Record what thread t's head does before the machine fires it. */
static void note(tide_sched_run_t *run, const tide_machine_t *m, int t, int *norder) {
    const tide_schedule_t *s = run->s;
    const int e = m->epoch[t / TIDE_Q_COUNT], id = s->op_base[t] + m->pc[t];
    const tide_op_t *op = tide_machine_head(m, t);
    if (op->kind == TIDE_OP_WAIT) {
        /* Enabled, so the target is at most the counter: below INT32_MAX. */
        const int64_t target = tide_machine_head_target(m, t);
        run->target[e][id] = target > 0 ? (int32_t)target : 0;
    }
    if (tide_machine_signals(op)) {
        const size_t c = (size_t)op->sig_rank * (size_t)s->num_counters + (size_t)op->ctr;
        const int64_t k = *tide_machine_counter(m, op->sig_rank, op->ctr);
        run->log[run->log_base[c] + k] = (tide_sched_sig_t){id, e};
    }
    run->order[e][norder[e]++] = id;
}

static tide_result_t execute_two_calls(tide_sched_run_t *run) {
    tide_machine_t m;
    TIDE_CHECK(tide_machine_init(&m, run->prog, run->s->num_counters, TIDE_SCHED_FORMS));
    int norder[TIDE_SCHED_FORMS] = {0, 0};
    for (bool progress = true; progress;) {
        progress = false;
        for (int t = 0; t < m.threads; ++t)
            while (tide_machine_enabled(&m, t)) {
                note(run, &m, t, norder);
                tide_machine_fire(&m, t);
                progress = true;
            }
    }
    const tide_result_t res = tide_machine_done(&m) ? TIDE_SUCCESS : deadlock(&m);
    tide_machine_free(&m);
    return res;
}

/* Whether thread t's head is a put that a rail step carries (rails.h). */
static bool rail_put_head(const tide_rails_t *r, const tide_machine_t *m, int t) {
    const int a = t / TIDE_Q_COUNT, q = t % TIDE_Q_COUNT;
    const tide_rails_rank_t *ra = &r->ranks[a];
    return q == ra->queue && tide_machine_head(m, t) != NULL && ra->put_step[m->pc[t]] >= 0;
}

/* Step g (call g / steps, step g % steps) may run: every rank's put queue is at its first
 * put (so each rank's credits for it ran: the WAITs before it passed). */
static bool rail_step_ready(const tide_rails_t *r, const tide_machine_t *m, int g) {
    const int e = g / r->num_steps, st = g % r->num_steps;
    for (int a = 0; a < m->n; ++a) {
        const tide_rails_rank_t *ra = &r->ranks[a];
        const int t = a * TIDE_Q_COUNT + ra->queue;
        if (ra->queue < 0 || m->finished[a] || m->epoch[a] != e ||
            m->pc[t] != ra->steps[st].first_op)
            return false;
    }
    return true;
}

/*
 * The same two calls on a rail fabric.  A rail step is one rendezvous of every rank
 * (program/rails.h): its puts run as one block, every rank's in turn, once every rank's put
 * queue reached the step; no other op runs in between.  So in the global order every
 * precondition of a step (the queues reaching it, the receivers' credits) comes before the
 * step's puts of every rank, and whatever counts its arrivals after all of them.  The rail
 * fabrics enqueue a step's transfers at the position of each rank's first put
 * (fabric/cuda/mp_rails.c) and write its arrival flags there, so the deadlock argument of
 * fabric/cuda/execute.c (every wait names something enqueued earlier, whatever hardware
 * queues the streams share) holds with rails too.  The order of the plain abstract run
 * does not give that: a rank's wait for an arrival, or its receive's credit, could stand
 * before its own step, which writes that arrival or waits for that credit
 * (tests/unit/test_rails_streams.c).
 */
static tide_result_t execute_two_calls_rails(tide_sched_run_t *run, const tide_rails_t *r) {
    tide_machine_t m;
    TIDE_CHECK(tide_machine_init(&m, run->prog, run->s->num_counters, TIDE_SCHED_FORMS));
    int norder[TIDE_SCHED_FORMS] = {0, 0};
    const int steps = TIDE_SCHED_FORMS * r->num_steps;
    int g = 0;
    for (bool progress = true; progress;) {
        progress = false;
        for (int t = 0; t < m.threads; ++t)
            while (tide_machine_enabled(&m, t) && !rail_put_head(r, &m, t)) {
                note(run, &m, t, norder);
                tide_machine_fire(&m, t);
                progress = true;
            }
        if (g < steps && rail_step_ready(r, &m, g)) {
            const int st = g % r->num_steps;
            for (int a = 0; a < m.n; ++a) {
                const int t = a * TIDE_Q_COUNT + r->ranks[a].queue;
                for (int k = 0; k < r->ranks[a].steps[st].num_puts; ++k) {
                    note(run, &m, t, norder);
                    tide_machine_fire(&m, t);
                }
            }
            ++g;
            progress = true;
        }
    }
    tide_result_t res = TIDE_SUCCESS;
    if (!tide_machine_done(&m)) {
        /* Name the first rank not at the next step's first put, if any (else a wait). */
        int a = 0;
        for (; g < steps && a < m.n; ++a) {
            const tide_rails_rank_t *ra = &r->ranks[a];
            const int t = a * TIDE_Q_COUNT + ra->queue;
            if (m.finished[a] || m.epoch[a] != g / r->num_steps ||
                m.pc[t] != ra->steps[g % r->num_steps].first_op)
                break;
        }
        res = g < steps && a < m.n
                  ? TIDE_ERR(TIDE_ERR_INTERNAL,
                             "schedule: the rail steps deadlock: rail step %d of call %d never "
                             "runs: rank %d's %s queue is at op %d of call %d",
                             g % r->num_steps, g / r->num_steps, a,
                             tide_queue_name((tide_queue_t)r->ranks[a].queue),
                             m.pc[a * TIDE_Q_COUNT + r->ranks[a].queue], m.epoch[a])
                  : deadlock(&m);
    }
    tide_machine_free(&m);
    return res;
}

static void run_free(tide_sched_run_t *run) {
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        free(run->order[f]);
        free(run->target[f]);
    }
    free(run->op_thread);
    free(run->log_base);
    free(run->log);
}

tide_result_t tide_schedule_layout(const tide_program_t *prog, tide_schedule_t *out) {
    if (prog == NULL || prog->ranks == NULL || prog->num_ranks < 1)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "schedule: empty program");
    tide_schedule_t s;
    memset(&s, 0, sizeof(s));
    tide_result_t res = layout(prog, &s);
    if (res != TIDE_SUCCESS) {
        tide_schedule_free(&s);
        return res;
    }
    *out = s;
    return TIDE_SUCCESS;
}

tide_result_t tide_schedule_build(const tide_program_t *prog, tide_schedule_t *out) {
    return tide_schedule_build_rails(prog, 0, out);
}

tide_result_t tide_schedule_build_rails(const tide_program_t *prog, int gpus_per_node,
                                             tide_schedule_t *out) {
    tide_schedule_t s;
    memset(&s, 0, sizeof(s));
    tide_sched_run_t run;
    memset(&run, 0, sizeof(run));
    run.prog = prog;
    run.s = &s;
    run.rails_l = gpus_per_node;
    tide_result_t res;
    if (prog == NULL || prog->ranks == NULL || prog->num_ranks < 1 || gpus_per_node < 0 ||
        (gpus_per_node > 0 && prog->num_ranks % gpus_per_node != 0)) {
        res = TIDE_ERR(TIDE_ERR_INTERNAL, "schedule: empty program or %d ranks per node",
                       gpus_per_node);
        goto fail;
    }
    TIDE_CHECK_GOTO(layout(prog, &s), res, fail);
    const size_t ops = (size_t)s.num_ops + 1;
    run.op_thread = calloc(ops, sizeof(*run.op_thread));
    bool allocated = run.op_thread != NULL;
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        run.order[f] = calloc(ops, sizeof(*run.order[f]));
        run.target[f] = calloc(ops, sizeof(*run.target[f]));
        allocated = allocated && run.order[f] != NULL && run.target[f] != NULL;
    }
    if (!allocated) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: %d ops", s.num_ops);
        goto fail;
    }
    TIDE_CHECK_GOTO(count_signals(&run), res, fail);
    /* Only the rail lane's programs take the step-block order: with it the lane over the
     * emulated rails passed on an H100 at 2..4 x 1 (bench/results/h100-2026-12-07/lane_rails_
     * on.log), where the plain order had deadlocked (h100-2026-12-06j).  The generic programs'
     * rail command lists keep the order of the plain run, which passed there too (gpu_test_
     * fabric_cuda_mp_rails; h100-2026-12-06h and -07); the step-block order has not run on a
     * GPU for them. */
    if (gpus_per_node > 0 && prog->plan != NULL && prog->plan->rs.rail_lane) {
        tide_rails_t rails;
        TIDE_CHECK_GOTO(tide_rails_build(prog, &rails), res, fail);
        res = rails.num_steps > 0 ? execute_two_calls_rails(&run, &rails)
                                  : execute_two_calls(&run);
        tide_rails_free(&rails);
        if (res != TIDE_SUCCESS) goto fail;
    } else {
        TIDE_CHECK_GOTO(execute_two_calls(&run), res, fail);
    }
    TIDE_CHECK_GOTO(tide_schedule_commands_build(&run), res, fail);
    s.rank_hash = calloc((size_t)s.num_ranks, sizeof(*s.rank_hash));
    if (s.rank_hash == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "schedule: %d ranks", s.num_ranks);
        goto fail;
    }
    for (int r = 0; r < s.num_ranks; ++r)
        s.rank_hash[r] = tide_schedule_rank_hash(prog, r);
    run_free(&run);
    *out = s;
    return TIDE_SUCCESS;
fail:
    run_free(&run);
    tide_schedule_free(&s);
    return res;
}

void tide_schedule_free(tide_schedule_t *s) {
    if (s == NULL) return;
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f)
        free(s->cmds[f]);
    free(s->op_base);
    free(s->slot_thread);
    free(s->op_slot);
    free(s->incs);
    free(s->rank_hash);
    memset(s, 0, sizeof(*s));
}

bool tide_schedule_incs_match(const tide_schedule_t *a, const tide_schedule_t *b) {
    if (a->num_ranks != b->num_ranks) return false;
    const int cmax = a->num_counters > b->num_counters ? a->num_counters : b->num_counters;
    for (int r = 0; r < a->num_ranks; ++r)
        for (int c = 0; c < cmax; ++c) {
            int32_t ia =
                c < a->num_counters ? a->incs[(size_t)r * (size_t)a->num_counters + (size_t)c] : 0;
            int32_t ib =
                c < b->num_counters ? b->incs[(size_t)r * (size_t)b->num_counters + (size_t)c] : 0;
            if (ia != ib) return false;
        }
    return true;
}

static uint64_t fnv(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t tide_schedule_rank_hash(const tide_program_t *prog, int rank) {
    const tide_rank_program_t *rp = &prog->ranks[rank];
    uint64_t h = fnv(0xcbf29ce484222325ull, (uint64_t)rp->num_tables);
    for (int q = 0; q < TIDE_Q_COUNT; ++q) {
        const tide_queue_ops_t *qo = &rp->queues[q];
        h = fnv(h, (uint64_t)qo->num_ops);
        for (int i = 0; i < qo->num_ops; ++i) {
            const tide_op_t *op = &qo->ops[i];
            h = fnv(h, (uint64_t)op->kind | (uint64_t)op->event << 8 |
                           (uint64_t)(uint32_t)op->table << 16);
            if (op->kind == TIDE_OP_WAIT || tide_schedule_op_signals(op)) {
                h = fnv(h, (uint64_t)(uint32_t)op->sig_rank << 32 | (uint32_t)op->ctr);
                h = fnv(h, (uint64_t)op->inc);
                h = fnv(h, (uint64_t)op->thr);
            }
        }
    }
    return h;
}
