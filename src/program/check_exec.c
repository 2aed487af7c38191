/*
 * check_exec.c - the checker's abstract machine: all ranks of a program run `calls`
 * consecutive calls, counters start at 0.
 *
 * Progress (I4).  An op is enabled when it heads its queue and, for a WAIT, its rank's
 * counter has reached epoch * inc + thr.  Counters only grow and nothing else disables an
 * op, so an enabled op stays enabled until it runs, and running one op never disables
 * another (the machine is monotone).  Hence every maximal run executes the same set of ops,
 * whatever order it picks: if one maximal run gets stuck, every interleaving gets stuck at
 * the same waits, and if one finishes, no interleaving deadlocks.  One run (the trace)
 * decides I4 for all schedules.  As on the fabrics, a rank starts call e + 1 only after all
 * of its queues finished call e.
 *
 * Happens-before (I3, I2).  Threads are (rank, queue) with vector clocks: queue order is
 * program order, a call boundary joins the rank's queues, a SIGNAL (or a copy's fused signal)
 * releases.  What a WAIT acquires is where counting differs from locks: a WAIT for k signals
 * knows that k of them happened, not which.  Sampling schedules (TSan's way) finds a race
 * only if some sampled schedule lets the wrong k signals arrive first, and the interesting
 * ones (a sender a whole call ahead, a slow sibling) are rare.  So the checker computes the
 * happens-before that holds in every schedule instead:
 *
 *   Let A(W) be the signals on W's counter, over all calls of the trace, that are not
 *   ordered after W.  In any schedule the k signals W saw are among A(W), so an op X is
 *   before W in every schedule iff X is before at least |A(W)| - k + 1 of them.  For an op
 *   of thread j at clock x that holds iff the (|A(W)| - k + 1)-th largest j-component of the
 *   signals' clocks is >= x: the acquire is a component-wise order statistic.
 *
 * A(W) depends on the ordering being computed, so the trace is replayed until a fixpoint:
 * the first pass orders only by program order (A is largest, W acquires least), each pass
 * removes from A(W) the signals the previous pass proved to follow W, and clocks only grow.
 * Every pass is sound (its A contains the true A), so the fixpoint is a sound
 * happens-before for every interleaving, and it is independent of the trace's order.  A final
 * replay in trace order runs the race detector and the I1 trace with it.
 *
 * Per-trace mode (options.per_trace) is the sampling alternative, kept to cross-check the
 * fixpoint against concrete executions: a WAIT acquires every signal its counter received
 * earlier in the trace, which is what the run itself guarantees, so a race it reports is a
 * race of that run.  Its traces vary the schedule: uniform choice, a random quarter of the
 * threads starved (they run only when nothing else can), or one rank starved, which is what
 * exposes a sender running a call ahead or a slow sibling.
 */
#include "program/check_internal.h"

#include "core/checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest clock table (signals x threads) the checker allocates. */
#define CHK_MAX_SIGNAL_CLOCKS ((size_t)64 << 20)
/* Replays before the fixpoint is declared lost (each pass must add an ordering). */
#define CHK_MAX_PASSES 256

typedef struct {
    int32_t thread;
    int32_t pc;
    int32_t call;
} chk_inst_t;

/* Trace and clock tables of one run. */
typedef struct {
    chk_inst_t *inst;
    size_t num, cap;
    size_t num_sigs;
    uint32_t *sig_vc;   /* num_sigs x threads: the releasing thread's clock */
    size_t *key_start;  /* ranks x ctrs + 1: CSR of the signals of each counter */
    uint32_t *key_sigs; /* signal ids in trace order */
    uint32_t *scratch;  /* order statistic */
    uint32_t *a_ids;    /* A(W) */
    uint32_t *key_vc;   /* per-trace mode: clocks released into each counter so far */
    int *rank_call;     /* replay: the call each rank is in */
} chk_trace_t;

tide_result_t chk_run_alloc(chk_ctx_t *c) {
    const size_t t = (size_t)c->threads, n = (size_t)c->n;
    TIDE_CHECK(tide_machine_init(&c->m, c->prog, c->ctrs, c->calls));
    c->vc = calloc(t * t, sizeof(*c->vc));
    c->events = calloc(n * (size_t)c->calls * TIDE_EVENT_COUNT, 1);
    if (c->vc == NULL || c->events == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "check: run state of %zu threads", t);
    return TIDE_SUCCESS;
}

void chk_run_free(chk_ctx_t *c) {
    tide_machine_free(&c->m);
    free(c->vc);
    free(c->events);
    c->vc = NULL;
    c->events = NULL;
}

static void trace_free(chk_trace_t *tr) {
    free(tr->inst);
    free(tr->sig_vc);
    free(tr->key_start);
    free(tr->key_sigs);
    free(tr->scratch);
    free(tr->a_ids);
    free(tr->key_vc);
    free(tr->rank_call);
    memset(tr, 0, sizeof(*tr));
}

static uint64_t rng_next(uint64_t *s) {
    /* xorshift64*: reproducible schedules from a seed */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ull;
}

static const tide_op_t *op_at(const chk_ctx_t *c, int t, int pc) {
    return &c->prog->ranks[t / TIDE_Q_COUNT].queues[t % TIDE_Q_COUNT].ops[pc];
}

static const tide_op_t *head(const chk_ctx_t *c, int t) {
    return tide_machine_head(&c->m, t);
}

/* Targets of the machine's calls are representable (tide_machine_init checked them). */
static int64_t wait_target(int call, const tide_op_t *op) {
    int64_t t = 0;
    (void)tide_machine_wait_target((uint64_t)call, op, &t);
    return t;
}

static size_t ctr_key(const chk_ctx_t *c, int rank, int ctr) {
    return (size_t)rank * (size_t)c->ctrs + (size_t)ctr;
}

/* ------------------------------------------------------------------ the trace (I4) */

static tide_result_t record(chk_trace_t *tr, int t, int pc, int call) {
    if (tr->num == tr->cap) {
        size_t cap = tr->cap ? 2 * tr->cap : 4096;
        chk_inst_t *v = realloc(tr->inst, cap * sizeof(*v));
        if (v == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "check: trace of %zu ops", cap);
        tr->inst = v;
        tr->cap = cap;
    }
    tr->inst[tr->num++] = (chk_inst_t){t, pc, call};
    return TIDE_SUCCESS;
}

/* The deadlock report: up to four blocked waits. */
static void report_stuck(chk_ctx_t *c) {
    char msg[560];
    size_t used = 0;
    int shown = 0, first = -1;
    for (int t = 0; t < c->threads && used < sizeof(msg); ++t) {
        const tide_op_t *op = head(c, t);
        if (op == NULL) continue;
        const int rank = t / TIDE_Q_COUNT;
        if (first < 0) first = t;
        if (shown++ >= 4) continue;
        int k =
            snprintf(msg + used, sizeof(msg) - used,
                     "%srank %d queue %s op %d (wait) call %d: counter %d = %lld < %lld",
                     shown > 1 ? "; " : "", rank, tide_queue_name((tide_queue_t)(t % TIDE_Q_COUNT)),
                     c->m.pc[t], c->m.epoch[rank], op->ctr,
                     (long long)*tide_machine_counter(&c->m, rank, op->ctr),
                     (long long)tide_machine_head_target(&c->m, t));
        if (k < 0) break;
        used += (size_t)k < sizeof(msg) - used ? (size_t)k : sizeof(msg) - used - 1;
    }
    tide_check_site_t s;
    const int r = first / TIDE_Q_COUNT;
    chk_site(&s, r, first % TIDE_Q_COUNT, c->m.pc[first], TIDE_OP_WAIT, c->m.epoch[r]);
    chk_fail(c, TIDE_CHECK_I4, &s, NULL, "deadlock, %d queue(s) blocked: %s", shown, msg);
}

/* Threads a trace starves: none (uniform), a random quarter, or the queues of one rank. */
static void pick_starved(const chk_ctx_t *c, int index, uint64_t *rng, uint8_t *starved) {
    const int policy = index % 3;
    for (int t = 0; t < c->threads; ++t)
        starved[t] = policy == 1 ? rng_next(rng) % 4 == 0
                                 : policy == 2 && t / TIDE_Q_COUNT == (index / 3) % c->n;
}

/* One maximal run, choosing uniformly among the enabled ops of threads not starved (of the
 * starved ones when no other can run); records every op run. */
static tide_result_t run_trace(chk_ctx_t *c, chk_trace_t *tr, int index, uint64_t seed) {
    tide_machine_reset(&c->m);
    uint64_t rng = (seed + (uint64_t)index) * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    if (rng == 0) rng = 1;
    int *cand = malloc((size_t)c->threads * sizeof(int));
    uint8_t *starved = malloc((size_t)c->threads);
    tide_result_t res = TIDE_SUCCESS;
    if (cand == NULL || starved == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "check: %d threads", c->threads);
        goto out;
    }
    pick_starved(c, index, &rng, starved);
    for (;;) {
        int num = 0;
        for (int t = 0; t < c->threads; ++t)
            if (!starved[t] && tide_machine_enabled(&c->m, t)) cand[num++] = t;
        for (int t = 0; t < c->threads && num == 0; ++t)
            if (starved[t] && tide_machine_enabled(&c->m, t)) cand[num++] = t;
        if (num == 0) break;
        const int t = cand[rng_next(&rng) % (uint64_t)num], rank = t / TIDE_Q_COUNT;
        TIDE_CHECK_GOTO(record(tr, t, c->m.pc[t], c->m.epoch[rank]), res, out);
        if (tide_machine_signals(head(c, t))) ++tr->num_sigs;
        tide_machine_fire(&c->m, t);
    }
    if (!tide_machine_done(&c->m)) report_stuck(c);
out:
    free(starved);
    free(cand);
    return res;
}

/* Clock tables and the signals of each counter, in trace order. */
static tide_result_t index_signals(chk_ctx_t *c, chk_trace_t *tr) {
    const size_t keys = (size_t)c->n * (size_t)(c->ctrs > 0 ? c->ctrs : 1);
    const size_t t = (size_t)c->threads;
    if (tr->num_sigs > 0 && tr->num_sigs > CHK_MAX_SIGNAL_CLOCKS / t)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "check: %zu signals x %zu threads exceed the checker's clock table",
                        tr->num_sigs, t);
    tr->sig_vc = calloc(tr->num_sigs * t + 1, sizeof(uint32_t));
    tr->key_start = calloc(keys + 1, sizeof(size_t));
    tr->key_sigs = calloc(tr->num_sigs + 1, sizeof(uint32_t));
    tr->scratch = calloc(tr->num_sigs + 1, sizeof(uint32_t));
    tr->a_ids = calloc(tr->num_sigs + 1, sizeof(uint32_t));
    tr->rank_call = calloc((size_t)c->n, sizeof(int));
    if (c->per_trace) tr->key_vc = calloc(keys * t, sizeof(uint32_t));
    if (tr->sig_vc == NULL || tr->key_start == NULL || tr->key_sigs == NULL ||
        tr->scratch == NULL || tr->a_ids == NULL || tr->rank_call == NULL ||
        (c->per_trace && tr->key_vc == NULL))
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "check: clocks of %zu signals", tr->num_sigs);
    for (size_t i = 0; i < tr->num; ++i) {
        const tide_op_t *op = op_at(c, tr->inst[i].thread, tr->inst[i].pc);
        if (tide_machine_signals(op)) ++tr->key_start[ctr_key(c, op->sig_rank, op->ctr) + 1];
    }
    for (size_t k = 0; k < keys; ++k)
        tr->key_start[k + 1] += tr->key_start[k];
    size_t *fill = calloc(keys + 1, sizeof(size_t));
    if (fill == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "check: %zu counters", keys);
    uint32_t sig = 0;
    for (size_t i = 0; i < tr->num; ++i) {
        const tide_op_t *op = op_at(c, tr->inst[i].thread, tr->inst[i].pc);
        if (!tide_machine_signals(op)) continue;
        const size_t k = ctr_key(c, op->sig_rank, op->ctr);
        tr->key_sigs[tr->key_start[k] + fill[k]++] = sig;
        /* Before the first pass a signal is known to follow only its own thread's past. */
        tr->sig_vc[(size_t)sig * t + (size_t)tr->inst[i].thread] = UINT32_MAX;
        ++sig;
    }
    free(fill);
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ happens-before */

static void join(uint32_t *dst, const uint32_t *src, int n) {
    for (int i = 0; i < n; ++i)
        if (src[i] > dst[i]) dst[i] = src[i];
}

/* The m-th largest (m >= 1) of v[0..n) (quickselect; v is reordered). */
static uint32_t mth_largest(uint32_t *v, size_t n, size_t m) {
    size_t lo = 0, hi = n - 1, k = m - 1;
    while (lo < hi) {
        const uint32_t pivot = v[lo + (hi - lo) / 2];
        size_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot)
                ++i;
            while (v[j] < pivot)
                --j;
            if (i <= j) {
                uint32_t x = v[i];
                v[i] = v[j];
                v[j] = x;
                ++i;
                if (j == 0) break;
                --j;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return v[k];
    }
    return v[k];
}

/* What WAIT instance (thread t, call e) acquires: see the file comment. */
static void acquire(chk_ctx_t *c, chk_trace_t *tr, int t, const tide_op_t *op, int call) {
    const int64_t target = wait_target(call, op);
    if (target <= 0) return;
    const size_t T = (size_t)c->threads;
    const size_t k = ctr_key(c, t / TIDE_Q_COUNT, op->ctr);
    uint32_t *vc = c->vc + (size_t)t * T;
    const uint32_t clock = vc[t];
    size_t na = 0;
    for (size_t i = tr->key_start[k]; i < tr->key_start[k + 1]; ++i) {
        const uint32_t s = tr->key_sigs[i];
        if (tr->sig_vc[(size_t)s * T + (size_t)t] > clock) continue; /* ordered after W */
        tr->a_ids[na++] = s;
    }
    if ((int64_t)na < target) return; /* cannot pass: the trace says otherwise; acquire none */
    const size_t m = na - (size_t)target + 1;
    for (size_t j = 0; j < T; ++j) {
        uint32_t v;
        if (m == 1) {
            v = 0;
            for (size_t i = 0; i < na; ++i) {
                const uint32_t x = tr->sig_vc[(size_t)tr->a_ids[i] * T + j];
                if (x > v) v = x;
            }
        } else {
            for (size_t i = 0; i < na; ++i)
                tr->scratch[i] = tr->sig_vc[(size_t)tr->a_ids[i] * T + j];
            v = mth_largest(tr->scratch, na, m);
        }
        if (v > vc[j] && v != UINT32_MAX) vc[j] = v;
    }
}

/* Rank r's call `call` is complete: were its events recorded? */
static void check_events(chk_ctx_t *c, int r, int call) {
    const uint8_t *ev =
        c->events + ((size_t)r * (size_t)c->calls + (size_t)call) * TIDE_EVENT_COUNT;
    tide_check_site_t s;
    chk_site(&s, r, -1, -1, TIDE_OP_EVENT, call);
    if (c->rs && !ev[TIDE_EVENT_READ_DONE])
        chk_fail(c, TIDE_CHECK_I2, &s, NULL,
                 "rank %d finished call %d without a read-done event: its sources are never "
                 "released",
                 r, call);
    else if (!ev[TIDE_EVENT_CALL_DONE])
        chk_fail(c, TIDE_CHECK_I3, &s, NULL,
                 "rank %d finished call %d without a call-done event: its output is never "
                 "complete",
                 r, call);
}

/* Rank r enters call `call`: check the calls it left, join its queues (with
 * options.direct_operands, the caller's operand writes of each call entered go first). */
static tide_result_t enter_call(chk_ctx_t *c, chk_trace_t *tr, int r, int call, bool checks) {
    const size_t T = (size_t)c->threads, q0 = (size_t)r * TIDE_Q_COUNT;
    uint32_t *base = c->vc + q0 * T;
    while (tr->rank_call[r] < call) {
        if (checks) check_events(c, r, tr->rank_call[r]);
        for (int q = 1; q < TIDE_Q_COUNT; ++q)
            join(base, base + (size_t)q * T, (int)T);
        /* The entry is an event of its own: nothing of the call before it shares its clock
         * (in every replay, so the fixpoint's clocks match the checking replay's). */
        if (c->entry) ++base[q0];
        for (int q = 1; q < TIDE_Q_COUNT; ++q)
            memcpy(base + (size_t)q * T, base, T * sizeof(uint32_t));
        ++tr->rank_call[r];
        if (checks && c->entry && !c->found)
            TIDE_CHECK(chk_mem_entry(c, (int)q0, r, tr->rank_call[r]));
    }
    return TIDE_SUCCESS;
}

/* options.direct_operands: every rank's queues start after its caller entered call 0. */
static tide_result_t enter_first_call(chk_ctx_t *c, bool checks) {
    const size_t T = (size_t)c->threads;
    for (int r = 0; r < c->n && !c->found; ++r) {
        const size_t q0 = (size_t)r * TIDE_Q_COUNT;
        for (int q = 1; q < TIDE_Q_COUNT; ++q)
            c->vc[(q0 + (size_t)q) * T + q0] = c->vc[q0 * T + q0];
        if (checks) TIDE_CHECK(chk_mem_entry(c, (int)q0, r, 0));
    }
    return TIDE_SUCCESS;
}

/* One replay of the trace; *changed says whether any signal's clock grew.  With checks,
 * also the race detector, the events and I1. */
static tide_result_t replay(chk_ctx_t *c, chk_trace_t *tr, bool checks, bool *changed) {
    const size_t T = (size_t)c->threads;
    memset(c->vc, 0, T * T * sizeof(*c->vc));
    for (size_t i = 0; i < T; ++i)
        c->vc[i * T + i] = 1;
    memset(tr->rank_call, 0, (size_t)c->n * sizeof(int));
    if (checks) memset(c->events, 0, (size_t)c->n * (size_t)c->calls * TIDE_EVENT_COUNT);
    const size_t keys = (size_t)c->n * (size_t)(c->ctrs > 0 ? c->ctrs : 1);
    if (c->per_trace) memset(tr->key_vc, 0, keys * T * sizeof(uint32_t));
    if (c->entry) TIDE_CHECK(enter_first_call(c, checks));
    *changed = false;
    uint32_t sig = 0;
    for (size_t i = 0; i < tr->num && !c->found; ++i) {
        const int t = tr->inst[i].thread, rank = t / TIDE_Q_COUNT, call = tr->inst[i].call;
        const tide_op_t *op = op_at(c, t, tr->inst[i].pc);
        uint32_t *vc = c->vc + (size_t)t * T;
        if (call != tr->rank_call[rank]) TIDE_CHECK(enter_call(c, tr, rank, call, checks));
        if (op->kind == TIDE_OP_WAIT && c->per_trace && wait_target(call, op) > 0)
            join(vc, tr->key_vc + ctr_key(c, rank, op->ctr) * T, (int)T);
        else if (op->kind == TIDE_OP_WAIT)
            acquire(c, tr, t, op, call);
        if (checks) {
            tide_check_site_t s;
            chk_site(&s, rank, t % TIDE_Q_COUNT, tr->inst[i].pc, op->kind, call);
            if (op->kind == TIDE_OP_EVENT) {
                TIDE_CHECK(chk_mem_event(c, t, op->event, &s));
                if (c->trace && !c->found) TIDE_CHECK(chk_data_event(c, op->event, &s));
            } else if (op->kind != TIDE_OP_WAIT && op->kind != TIDE_OP_SIGNAL) {
                TIDE_CHECK(chk_mem_op(c, t, op, &s));
                if (c->trace && !c->found) TIDE_CHECK(chk_data_op(c, op, &s));
            }
        }
        if (tide_machine_signals(op) && c->per_trace)
            join(tr->key_vc + ctr_key(c, op->sig_rank, op->ctr) * T, vc, (int)T);
        if (tide_machine_signals(op)) {
            uint32_t *dst = tr->sig_vc + (size_t)sig * T;
            if (memcmp(dst, vc, T * sizeof(uint32_t)) != 0) {
                memcpy(dst, vc, T * sizeof(uint32_t));
                *changed = true;
            }
            ++sig;
        }
        ++vc[t];
    }
    if (checks)
        for (int r = 0; r < c->n && !c->found; ++r) {
            TIDE_CHECK(enter_call(c, tr, r, c->calls - 1, true));
            check_events(c, r, c->calls - 1);
        }
    return TIDE_SUCCESS;
}

tide_result_t chk_run(chk_ctx_t *c, int index, uint64_t seed) {
    chk_trace_t tr;
    memset(&tr, 0, sizeof(tr));
    tide_result_t res = TIDE_SUCCESS;
    TIDE_CHECK_GOTO(run_trace(c, &tr, index, seed), res, out);
    c->ops_run += tr.num;
    if (c->found) goto out; /* I4 */
    TIDE_CHECK_GOTO(index_signals(c, &tr), res, out);
    bool changed = !c->per_trace;
    int passes = 0;
    while (changed) {
        if (++passes > CHK_MAX_PASSES) {
            res = TIDE_ERR(TIDE_ERR_INTERNAL,
                           "check: happens-before did not converge in %d "
                           "passes",
                           CHK_MAX_PASSES);
            goto out;
        }
        TIDE_CHECK_GOTO(replay(c, &tr, false, &changed), res, out);
    }
    TIDE_CHECK_GOTO(replay(c, &tr, true, &changed), res, out);
out:
    trace_free(&tr);
    return res;
}
