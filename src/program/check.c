/*
 * check.c - the static program checker's entry points, its reports, and the two static
 * passes that run before any abstract execution:
 *
 *   IR   every op is well formed (kind, ranks, regions, counters, tables), so the abstract
 *        machine and the race detector may trust references without re-checking them;
 *   INC  every WAIT's inc equals the signals that reach its (rank, counter) per call, with
 *        thr <= inc.  Cumulative counters make that count part of the protocol: one signal
 *        too many lets call e + 1 pass on call e's signals, one too few hangs call e + 1.
 *
 * The dynamic invariants (I4, I3, I2, I1) live in check_exec.c, check_mem.c, check_data.c.
 */
#include "program/check_internal.h"

#include "core/checks.h"
#include "program/machine.h"
#include "program/counters.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tide_check_invariant_name(tide_check_invariant_t inv) {
    static const char *const names[TIDE_CHECK_KIND_COUNT] = {
        [TIDE_CHECK_NONE] = "ok",       [TIDE_CHECK_IR] = "IR", [TIDE_CHECK_INC] = "INC",
        [TIDE_CHECK_BOUNDS] = "BOUNDS", [TIDE_CHECK_I1] = "I1", [TIDE_CHECK_I2] = "I2",
        [TIDE_CHECK_I3] = "I3",         [TIDE_CHECK_I4] = "I4",
    };
    return (unsigned)inv < TIDE_CHECK_KIND_COUNT ? names[inv] : "?";
}

const char *chk_op_name(int kind) {
    return tide_op_kind_name(kind);
}

void chk_site(tide_check_site_t *s, int rank, int queue, int op, int kind, int call) {
    s->rank = rank;
    s->queue = queue;
    s->op = op;
    s->kind = kind;
    s->call = call;
}

static const tide_check_site_t no_site = {-1, -1, -1, -1, -1};

static void fill(tide_check_report_t *r, tide_check_invariant_t inv, const tide_check_site_t *site,
                 const tide_check_site_t *other, const char *fmt, va_list ap) {
    r->ok = 0;
    r->violated = inv;
    r->site = site ? *site : no_site;
    r->other = other ? *other : no_site;
    vsnprintf(r->message, sizeof(r->message), fmt, ap);
}

void chk_fail(chk_ctx_t *c, tide_check_invariant_t inv, const tide_check_site_t *site,
              const tide_check_site_t *other, const char *fmt, ...) {
    if (c->found) return; /* the first violation is the report */
    va_list ap;
    va_start(ap, fmt);
    fill(c->rep, inv, site, other, fmt, ap);
    va_end(ap);
    c->found = true;
}

void chk_fail_i1(chk_ctx_t *c, const tide_check_site_t *site, const char *fmt, ...) {
    if (c->i1_found) return;
    va_list ap;
    va_start(ap, fmt);
    fill(&c->i1, TIDE_CHECK_I1, site, NULL, fmt, ap);
    va_end(ap);
    c->i1_found = true;
}

/* ------------------------------------------------------------------ IR */

static bool ref_ok(const chk_ctx_t *c, const tide_ref_t *ref, char *why, size_t len) {
    switch (ref->kind) {
    case TIDE_REF_ARENA:
        if (ref->rank < 0 || ref->rank >= c->n || ref->region >= TIDE_REGION_SIGNALS) {
            snprintf(why, len, "arena reference to rank %d region %d", ref->rank, ref->region);
            return false;
        }
        return true;
    case TIDE_REF_LANDING:
        if (ref->rank < 0 || ref->rank >= c->n) {
            snprintf(why, len, "landing reference to rank %d", ref->rank);
            return false;
        }
        return true;
    case TIDE_REF_GRAD:
        if (ref->param < 0 || ref->param >= c->p) {
            snprintf(why, len, "gradient %d of P = %d", ref->param, c->p);
            return false;
        }
        break;
    case TIDE_REF_SHARD:
    case TIDE_REF_OUT:
        break;
    default:
        snprintf(why, len, "reference kind %d", ref->kind);
        return false;
    }
    /* A call operand is the issuing rank's (-1).  One naming a rank is a peer's operand
     * accessed in place, which only direct mode's model makes (options.direct_operands). */
    if (ref->rank == -1 || (c->entry && ref->rank >= 0 && ref->rank < c->n)) return true;
    snprintf(why, len, "operand reference to rank %d%s", ref->rank,
             c->entry ? "" : " (peer operands need options.direct_operands)");
    return false;
}

static bool counter_ok(const chk_ctx_t *c, int rank, int ctr) {
    return rank >= 0 && rank < c->n && ctr >= 0 && ctr < TIDE_ARENA_SIGNAL_SLOTS;
}

static const char *problem(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static const char *problem(char *why, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return why;
}

/* Why op is malformed, or NULL. */
static const char *op_problem(const chk_ctx_t *c, int rank, const tide_op_t *op, char *why,
                              size_t len) {
    const tide_rank_program_t *rp = &c->prog->ranks[rank];
    switch (op->kind) {
    case TIDE_OP_COPY:
    case TIDE_OP_COPY2D:
    case TIDE_OP_CAST:
    case TIDE_OP_ZERO:
        if (op->kind != TIDE_OP_ZERO && !ref_ok(c, &op->src, why, len)) return why;
        if (!ref_ok(c, &op->dst, why, len)) return why;
        if (op->kind == TIDE_OP_COPY2D && op->rows > 1 &&
            (op->dst_pitch < op->bytes || op->src_pitch < op->bytes))
            return problem(why, len, "2D pitches %llu / %llu below the row bytes %llu",
                           (unsigned long long)op->dst_pitch, (unsigned long long)op->src_pitch,
                           (unsigned long long)op->bytes);
        if (op->kind == TIDE_OP_CAST && op->bytes % 2 != 0)
            return problem(why, len, "cast of %llu bf16 bytes", (unsigned long long)op->bytes);
        if (tide_machine_signals(op) && !counter_ok(c, op->sig_rank, op->ctr))
            return problem(why, len, "fused signal to rank %d counter %d", op->sig_rank, op->ctr);
        return NULL;
    case TIDE_OP_SIGNAL:
        if (!counter_ok(c, op->sig_rank, op->ctr))
            return problem(why, len, "signal to rank %d counter %d", op->sig_rank, op->ctr);
        return NULL;
    case TIDE_OP_WAIT:
        if (!counter_ok(c, rank, op->ctr)) return problem(why, len, "wait on counter %d", op->ctr);
        return NULL;
    case TIDE_OP_EVENT:
        if (op->event >= TIDE_EVENT_COUNT) return problem(why, len, "event %d", op->event);
        return NULL;
    case TIDE_OP_SUM:
    case TIDE_OP_LAND: {
        if (op->table < 0 || op->table >= rp->num_tables || rp->tables[op->table].kind != op->kind)
            return problem(why, len, "table %d is not a %s table of %d", op->table,
                           chk_op_name(op->kind), rp->num_tables);
        const tide_table_t *t = &rp->tables[op->table];
        if (t->num_segs < 0 ||
            (t->num_segs > 0 &&
             (op->kind == TIDE_OP_SUM ? t->sum_segs == NULL : t->land_segs == NULL)))
            return problem(why, len, "table %d has no segments", op->table);
        if (op->kind == TIDE_OP_SUM) {
            if (t->num_staged < 0 || t->num_staged >= TIDE_MAX_GPUS_PER_NODE)
                return problem(why, len, "sum table with %d staged", t->num_staged);
            if (!ref_ok(c, &t->out, why, len)) return why;
            if (t->num_staged > 0 && !ref_ok(c, &t->staged, why, len)) return why;
            for (int s = 0; s < t->num_segs; ++s)
                if (t->sum_segs[s].own_idx < 0 || t->sum_segs[s].own_idx >= c->p)
                    return problem(why, len, "segment %d reads gradient %d", s,
                                   t->sum_segs[s].own_idx);
        } else {
            if (t->num_in < 1 || t->num_in > TIDE_MAX_GPUS_PER_NODE)
                return problem(why, len, "landing table with %d inputs", t->num_in);
            for (int k = 0; k < t->num_in; ++k)
                if (!ref_ok(c, &t->in[k], why, len)) return why;
            /* `out` unset: the own output; else the output it names (chk_land_out). */
            if (t->out.kind != TIDE_REF_NONE &&
                (t->out.kind != TIDE_REF_OUT || t->out.offset != 0 ||
                 !ref_ok(c, &t->out, why, len)))
                return problem(why, len, "landing table %d writes %s", op->table,
                               t->out.kind == TIDE_REF_OUT ? why : "no output operand");
        }
        return NULL;
    }
    default:
        return problem(why, len, "unknown op kind %d", op->kind);
    }
}

static void check_ir(chk_ctx_t *c) {
    char why[160];
    for (int r = 0; r < c->n; ++r) {
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const tide_queue_ops_t *qo = &c->prog->ranks[r].queues[q];
            for (int i = 0; i < qo->num_ops; ++i) {
                if (op_problem(c, r, &qo->ops[i], why, sizeof(why)) == NULL) continue;
                tide_check_site_t s;
                chk_site(&s, r, q, i, qo->ops[i].kind, -1);
                chk_fail(c, TIDE_CHECK_IR, &s, NULL, "rank %d queue %s op %d (%s): %s", r,
                         tide_queue_name((tide_queue_t)q), i, chk_op_name(qo->ops[i].kind), why);
                return;
            }
        }
    }
}

/* ------------------------------------------------------------------ INC */

static tide_result_t check_inc(chk_ctx_t *c) {
    /* Signal indices were validated by the IR pass. */
    int64_t *count = NULL;
    TIDE_CHECK(tide_machine_count_signals(c->prog, TIDE_ARENA_SIGNAL_SLOTS, &count));
    for (int r = 0; r < c->n && !c->found; ++r)
        for (int q = 0; q < TIDE_Q_COUNT && !c->found; ++q) {
            const tide_queue_ops_t *qo = &c->prog->ranks[r].queues[q];
            for (int i = 0; i < qo->num_ops; ++i) {
                const tide_op_t *op = &qo->ops[i];
                if (op->kind != TIDE_OP_WAIT) continue;
                int64_t n = count[(size_t)r * TIDE_ARENA_SIGNAL_SLOTS + (size_t)op->ctr];
                if (tide_machine_inc_ok(op, n)) continue;
                tide_check_site_t s;
                chk_site(&s, r, q, i, op->kind, -1);
                chk_fail(c, TIDE_CHECK_INC, &s, NULL,
                         "rank %d queue %s op %d (wait): counter %d has inc %lld, thr %lld, but "
                         "%lld signal(s) reach it per call",
                         r, tide_queue_name((tide_queue_t)q), i, op->ctr, (long long)op->inc,
                         (long long)op->thr, (long long)n);
                break;
            }
        }
    free(count);
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ entry points */

static tide_result_t check_args(const tide_program_t *prog, const tide_check_options_t *o) {
    TIDE_ARG_CHECK(prog != NULL && prog->plan != NULL && prog->ranks != NULL,
                   "check: program is NULL or not compiled");
    TIDE_ARG_CHECK(prog->num_ranks == prog->plan->topo.ranks,
                   "check: program has %d ranks, its plan %d", prog->num_ranks,
                   prog->plan->topo.ranks);
    TIDE_ARG_CHECK(prog->coll == TIDE_COLL_ALL_GATHER || prog->coll == TIDE_COLL_REDUCE_SCATTER,
                   "check: collective %d", (int)prog->coll);
    TIDE_ARG_CHECK(o != NULL, "check: options are NULL");
    TIDE_ARG_CHECK(o->calls >= 2 && o->calls <= 64, "check: calls = %d outside [2, 64]", o->calls);
    TIDE_ARG_CHECK(o->schedules >= 1 && o->schedules <= 1024,
                   "check: schedules = %d outside [1, 1024]", o->schedules);
    return TIDE_SUCCESS;
}

tide_result_t tide_program_check_ex(const tide_program_t *prog, const tide_check_options_t *opts,
                                    tide_check_report_t *report_out) {
    TIDE_CHECK(check_args(prog, opts));
    TIDE_ARG_CHECK(report_out != NULL, "check: report_out is NULL");
    tide_check_report_t rep;
    memset(&rep, 0, sizeof(rep));
    chk_ctx_t c;
    memset(&c, 0, sizeof(c));
    c.prog = prog;
    c.plan = prog->plan;
    c.n = prog->num_ranks;
    c.p = prog->plan->geom.num_params;
    c.calls = opts->calls;
    c.threads = c.n * TIDE_Q_COUNT;
    c.rs = prog->coll == TIDE_COLL_REDUCE_SCATTER;
    c.per_trace = opts->per_trace != 0;
    c.entry = opts->direct_operands != 0;
    c.rep = &rep;

    tide_result_t res = TIDE_SUCCESS;
    check_ir(&c);
    if (!c.found && !opts->skip_inc) TIDE_CHECK(check_inc(&c));
    if (c.found) goto done;

    c.ctrs = tide_machine_counters_used(prog);
    TIDE_CHECK_GOTO(chk_objects_init(&c), res, fail_objects);
    TIDE_CHECK_GOTO(chk_run_alloc(&c), res, fail_run);
    for (int s = 0; s < opts->schedules && !c.found; ++s) {
        c.trace = s == 0 && c.i1_able;
        chk_objects_reset(&c);
        TIDE_CHECK_GOTO(chk_run(&c, s, opts->seed), res, fail_run);
        rep.schedules = s + 1;
    }
    rep.i1_checked = c.i1_able;
    rep.ops_run = c.ops_run;
    if (!c.found && c.i1_found) {
        int schedules = rep.schedules;
        rep = c.i1;
        rep.schedules = schedules;
        rep.i1_checked = 1;
        rep.ops_run = c.ops_run;
        c.found = true;
    }
    chk_run_free(&c);
    chk_objects_free(&c);
done:
    if (!c.found) {
        rep.ok = 1;
        rep.violated = TIDE_CHECK_NONE;
        rep.site = no_site;
        rep.other = no_site;
        snprintf(rep.message, sizeof(rep.message), "ok: %d call(s), %d schedule(s), %llu ops run%s",
                 c.calls, rep.schedules, (unsigned long long)rep.ops_run,
                 rep.i1_checked ? "" : ", I1 not traced");
    }
    *report_out = rep;
    return TIDE_SUCCESS;

fail_run:
    chk_run_free(&c);
fail_objects:
    chk_objects_free(&c);
    return res;
}

tide_result_t tide_program_check(const tide_program_t *prog, int calls,
                                 tide_check_report_t *report_out) {
    tide_check_options_t o = {calls, TIDE_CHECK_DEFAULT_SCHEDULES, 1, 0, 0, 0};
    return tide_program_check_ex(prog, &o, report_out);
}
