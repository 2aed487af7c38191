/*
 * schedule.c - resolve a program's counters on the host: the abstract execution of two
 * consecutive calls of all ranks.
 *
 * Counters start at 0.  Sweeps over the (rank, queue) threads run every op whose WAIT is
 * satisfied, in program order per thread, and give a rank its call 1 only after all of its
 * queues finished call 0 (the fabric enforces the same per-rank order, see execute.c).  The
 * run records
 *   - the order in which ops ran, per call: call 0 is the FRESH order (nothing of the program
 *     in flight), call 1 the STEADY order (the previous call's ops enqueued before);
 *   - per counter, the signal instances (op, call) in the order they were applied;
 *   - per WAIT and call, its target e inc + thr.
 * A WAIT with target T depends on the first T signal instances of its counter.  The programs
 * keep counts unambiguous (no signal of a later use reaches a counter before the waiter
 * passes, see compile_rs.c), so these are the signals every execution's wait counts.  A
 * dependency of a call-0 wait on a call-1 signal contradicts that and is rejected.
 *
 * The counters themselves are never touched at run time: commands.c turns dependencies into
 * event waits.
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static tide_result_t layout(const tide_program_t *prog, tide_cuda_schedule_t *s) {
    const int n = prog->num_ranks;
    s->num_ranks = n;
    s->num_threads = n * TIDE_CUDA_Q;
    s->op_base = calloc((size_t)s->num_threads + 1, sizeof(*s->op_base));
    if (s->op_base == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda schedule: %d threads", n);
    int64_t total = 0, max_ctr = -1;
    for (int t = 0; t < s->num_threads; ++t) {
        const tide_queue_ops_t *qo = &prog->ranks[t / TIDE_CUDA_Q].queues[t % TIDE_CUDA_Q];
        s->op_base[t] = (int)total;
        total += qo->num_ops;
        if (total > INT32_MAX / 2)
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "cuda schedule: more than %d ops", INT32_MAX / 2);
        for (int i = 0; i < qo->num_ops; ++i) {
            const tide_op_t *op = &qo->ops[i];
            if (op->kind >= TIDE_OP_KIND_COUNT)
                return TIDE_ERR(TIDE_ERR_INTERNAL,
                                "cuda schedule: rank %d queue %s op %d has "
                                "kind %d",
                                t / TIDE_CUDA_Q, tide_queue_name((tide_queue_t)(t % TIDE_CUDA_Q)),
                                i, op->kind);
            if (op->kind != TIDE_OP_WAIT && !tide_cuda_op_signals(op)) continue;
            if (op->ctr < 0 || op->ctr >= TIDE_ARENA_SIGNAL_SLOTS ||
                (op->kind != TIDE_OP_WAIT && (op->sig_rank < 0 || op->sig_rank >= n)))
                return TIDE_ERR(TIDE_ERR_INTERNAL,
                                "cuda schedule: rank %d queue %s op %d (%s) "
                                "names counter %d of rank %d",
                                t / TIDE_CUDA_Q, tide_queue_name((tide_queue_t)(t % TIDE_CUDA_Q)),
                                i, tide_op_kind_name(op->kind), op->ctr, op->sig_rank);
            if (op->ctr > max_ctr) max_ctr = op->ctr;
        }
    }
    s->op_base[s->num_threads] = (int)total;
    s->num_ops = (int)total;
    s->num_counters = (int)(max_ctr + 1);
    return TIDE_SUCCESS;
}

/* Signals per call on every counter, and the log's layout (two calls per counter). */
static tide_result_t count_signals(tide_cuda_run_t *run) {
    tide_cuda_schedule_t *s = run->s;
    const size_t ctrs = (size_t)s->num_ranks * (size_t)s->num_counters;
    s->incs = calloc(ctrs > 0 ? ctrs : 1, sizeof(*s->incs));
    run->log_base = calloc(ctrs + 1, sizeof(*run->log_base));
    if (s->incs == NULL || run->log_base == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda schedule: %zu counters", ctrs);
    for (int t = 0; t < s->num_threads; ++t)
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            run->op_thread[id] = t;
            const tide_op_t *op = tide_cuda_op(run->prog, s, id, t);
            if (tide_cuda_op_signals(op))
                ++s->incs[(size_t)op->sig_rank * (size_t)s->num_counters + (size_t)op->ctr];
        }
    for (size_t c = 0; c < ctrs; ++c)
        run->log_base[c + 1] = run->log_base[c] + 2 * s->incs[c];
    run->log = calloc((size_t)run->log_base[ctrs] + 1, sizeof(*run->log));
    if (run->log == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda schedule: signal log");
    return TIDE_SUCCESS;
}

/* The wait nobody can satisfy, for the deadlock message. */
static tide_result_t deadlock(const tide_cuda_run_t *run, const int *pc, const int *call,
                              const int32_t *cnt) {
    const tide_cuda_schedule_t *s = run->s;
    for (int t = 0; t < s->num_threads; ++t) {
        const int r = t / TIDE_CUDA_Q;
        if (call[r] >= 2 || s->op_base[t] + pc[t] >= s->op_base[t + 1]) continue;
        const tide_op_t *op = tide_cuda_op(run->prog, s, s->op_base[t] + pc[t], t);
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cuda schedule: the program deadlocks: rank %d queue %s op %d (wait) of "
                        "call %d never passes: counter %d = %d, target %d x %" PRId64 " + %" PRId64,
                        r, tide_queue_name((tide_queue_t)(t % TIDE_CUDA_Q)), pc[t], call[r],
                        op->ctr, cnt[(size_t)r * (size_t)s->num_counters + (size_t)op->ctr],
                        call[r], op->inc, op->thr);
    }
    return TIDE_ERR(TIDE_ERR_INTERNAL, "cuda schedule: the abstract execution stalled");
}

/* Run op pc[t] of thread t if it can; returns whether it ran. */
static tide_result_t step(tide_cuda_run_t *run, int t, int *pc, const int *call, int32_t *cnt,
                          int *norder, bool *ran) {
    const tide_cuda_schedule_t *s = run->s;
    const int r = t / TIDE_CUDA_Q, e = call[r], id = s->op_base[t] + pc[t];
    const tide_op_t *op = tide_cuda_op(run->prog, s, id, t);
    *ran = false;
    if (op->kind == TIDE_OP_WAIT) {
        int64_t target;
        if (__builtin_mul_overflow((int64_t)e, op->inc, &target) ||
            __builtin_add_overflow(target, op->thr, &target) || target > INT32_MAX)
            return TIDE_ERR(TIDE_ERR_OVERFLOW,
                            "cuda schedule: rank %d queue %s op %d: target "
                            "overflows",
                            r, tide_queue_name((tide_queue_t)(t % TIDE_CUDA_Q)), pc[t]);
        const size_t c = (size_t)r * (size_t)s->num_counters + (size_t)op->ctr;
        if (target > 0 && cnt[c] < target) return TIDE_SUCCESS;
        run->target[e][id] = target > 0 ? (int32_t)target : 0;
    }
    if (tide_cuda_op_signals(op)) {
        const size_t c = (size_t)op->sig_rank * (size_t)s->num_counters + (size_t)op->ctr;
        run->log[run->log_base[c] + cnt[c]] = (tide_cuda_sig_t){id, e};
        ++cnt[c];
    }
    run->order[e][norder[e]++] = id;
    ++pc[t];
    *ran = true;
    return TIDE_SUCCESS;
}

static tide_result_t execute_two_calls(tide_cuda_run_t *run) {
    const tide_cuda_schedule_t *s = run->s;
    const int n = s->num_ranks;
    const size_t ctrs = (size_t)n * (size_t)s->num_counters;
    tide_result_t res = TIDE_SUCCESS;
    int *pc = calloc((size_t)s->num_threads, sizeof(*pc));
    int *call = calloc((size_t)n, sizeof(*call));
    int *left = calloc((size_t)n, sizeof(*left));
    int32_t *cnt = calloc(ctrs > 0 ? ctrs : 1, sizeof(*cnt));
    int norder[TIDE_CUDA_FORMS] = {0, 0};
    if (pc == NULL || call == NULL || left == NULL || cnt == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda schedule: run state");
        goto done;
    }
    for (int r = 0; r < n; ++r) {
        left[r] = s->op_base[(r + 1) * TIDE_CUDA_Q] - s->op_base[r * TIDE_CUDA_Q];
        if (left[r] == 0) call[r] = 2;
    }
    for (bool progress = true; progress;) {
        progress = false;
        for (int t = 0; t < s->num_threads; ++t) {
            const int r = t / TIDE_CUDA_Q;
            while (call[r] < 2 && s->op_base[t] + pc[t] < s->op_base[t + 1]) {
                bool ran;
                TIDE_CHECK_GOTO(step(run, t, pc, call, cnt, norder, &ran), res, done);
                if (!ran) break;
                progress = true;
                if (--left[r] > 0) continue;
                /* The rank finished a call: its queues start the next one together. */
                if (++call[r] < 2) {
                    left[r] = s->op_base[(r + 1) * TIDE_CUDA_Q] - s->op_base[r * TIDE_CUDA_Q];
                    memset(&pc[r * TIDE_CUDA_Q], 0, TIDE_CUDA_Q * sizeof(*pc));
                }
            }
        }
    }
    for (int r = 0; r < n; ++r)
        if (call[r] < 2) {
            res = deadlock(run, pc, call, cnt);
            goto done;
        }
done:
    free(cnt);
    free(left);
    free(call);
    free(pc);
    return res;
}

static void run_free(tide_cuda_run_t *run) {
    for (int f = 0; f < TIDE_CUDA_FORMS; ++f) {
        free(run->order[f]);
        free(run->target[f]);
    }
    free(run->op_thread);
    free(run->log_base);
    free(run->log);
}

tide_result_t tide_cuda_schedule_build(const tide_program_t *prog, tide_cuda_schedule_t *out) {
    tide_cuda_schedule_t s;
    memset(&s, 0, sizeof(s));
    tide_cuda_run_t run;
    memset(&run, 0, sizeof(run));
    run.prog = prog;
    run.s = &s;
    tide_result_t res;
    if (prog == NULL || prog->ranks == NULL || prog->num_ranks < 1) {
        res = TIDE_ERR(TIDE_ERR_INTERNAL, "cuda schedule: empty program");
        goto fail;
    }
    TIDE_CHECK_GOTO(layout(prog, &s), res, fail);
    const size_t ops = (size_t)s.num_ops + 1;
    run.op_thread = calloc(ops, sizeof(*run.op_thread));
    bool allocated = run.op_thread != NULL;
    for (int f = 0; f < TIDE_CUDA_FORMS; ++f) {
        run.order[f] = calloc(ops, sizeof(*run.order[f]));
        run.target[f] = calloc(ops, sizeof(*run.target[f]));
        allocated = allocated && run.order[f] != NULL && run.target[f] != NULL;
    }
    if (!allocated) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda schedule: %d ops", s.num_ops);
        goto fail;
    }
    TIDE_CHECK_GOTO(count_signals(&run), res, fail);
    TIDE_CHECK_GOTO(execute_two_calls(&run), res, fail);
    TIDE_CHECK_GOTO(tide_cuda_commands_build(&run), res, fail);
    s.rank_hash = calloc((size_t)s.num_ranks, sizeof(*s.rank_hash));
    if (s.rank_hash == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda schedule: %d ranks", s.num_ranks);
        goto fail;
    }
    for (int r = 0; r < s.num_ranks; ++r)
        s.rank_hash[r] = tide_cuda_rank_hash(prog, r);
    run_free(&run);
    *out = s;
    return TIDE_SUCCESS;
fail:
    run_free(&run);
    tide_cuda_schedule_free(&s);
    return res;
}

void tide_cuda_schedule_free(tide_cuda_schedule_t *s) {
    if (s == NULL) return;
    for (int f = 0; f < TIDE_CUDA_FORMS; ++f)
        free(s->cmds[f]);
    free(s->op_base);
    free(s->slot_thread);
    free(s->incs);
    free(s->rank_hash);
    memset(s, 0, sizeof(*s));
}

bool tide_cuda_schedule_incs_match(const tide_cuda_schedule_t *a, const tide_cuda_schedule_t *b) {
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

uint64_t tide_cuda_rank_hash(const tide_program_t *prog, int rank) {
    const tide_rank_program_t *rp = &prog->ranks[rank];
    uint64_t h = fnv(0xcbf29ce484222325ull, (uint64_t)rp->num_tables);
    for (int q = 0; q < TIDE_CUDA_Q; ++q) {
        const tide_queue_ops_t *qo = &rp->queues[q];
        h = fnv(h, (uint64_t)qo->num_ops);
        for (int i = 0; i < qo->num_ops; ++i) {
            const tide_op_t *op = &qo->ops[i];
            h = fnv(h, (uint64_t)op->kind | (uint64_t)op->event << 8 |
                           (uint64_t)(uint32_t)op->table << 16);
            if (op->kind == TIDE_OP_WAIT || tide_cuda_op_signals(op)) {
                h = fnv(h, (uint64_t)(uint32_t)op->sig_rank << 32 | (uint32_t)op->ctr);
                h = fnv(h, (uint64_t)op->inc);
                h = fnv(h, (uint64_t)op->thr);
            }
        }
    }
    return h;
}
