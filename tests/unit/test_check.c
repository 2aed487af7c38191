/*
 * test_check.c - the static program checker (src/program/check.h).
 *
 * The compiled AG and RS programs of small plans (both modes, one and two passes, several
 * waves and both inbox generations) pass every invariant, and the abstract machine runs every
 * op of every call.  Hand-made programs, each with one protocol bug, fail the invariant that
 * bug breaks, and the report names the rank, queue and op (and for races the other op).
 */
#include "test_util.h"

#include "plan/plan.h"
#include "program/check.h"
#include "program/counters.h"
#include "program/fault.h"
#include "program/program.h"

/* One large parameter (every sub-slice of up to 8 parts non-empty, padding rows for most N)
 * and one small one (empty pieces, padding). */
static const tide_param_shape_t shapes[] = {{105, 9}, {10, 16}};

static tide_plan_t plan_of(int m, int l, int wave_width, int passes, tide_rs_mode_t mode, int cast,
                           int fp32_grads) {
    return test_plan(m, l, wave_width, passes, mode, fp32_grads ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16,
                     cast ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16, shapes, 2);
}

static uint64_t total_ops(const tide_program_t *prog) {
    uint64_t n = 0;
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            n += (uint64_t)prog->ranks[r].queues[q].num_ops;
    return n;
}

static tide_check_report_t check(const tide_program_t *prog, int calls) {
    tide_check_report_t rep;
    memset(&rep, 0xa5, sizeof(rep));
    assert_tide(TIDE_SUCCESS, tide_program_check(prog, calls, &rep));
    return rep;
}

static void expect_ok(const tide_program_t *prog, const char *what) {
    tide_check_report_t rep = check(prog, 3);
    if (!rep.ok)
        print_error("%s: %s %s\n", what, tide_check_invariant_name(rep.violated), rep.message);
    assert_true(rep.ok);
    assert_int_equal(rep.violated, TIDE_CHECK_NONE);
    assert_int_equal(rep.i1_checked, 1);
    /* The maximal run executed every op of all three calls on every rank. */
    assert_int_equal(rep.ops_run, 3 * total_ops(prog));
}

static void expect_violation(const tide_program_t *prog, tide_check_invariant_t inv,
                             tide_check_report_t *rep_out) {
    tide_check_report_t rep = check(prog, 3);
    if (getenv("TEST_CHECK_VERBOSE")) printf("%s\n", rep.message);
    if (rep.violated != inv)
        print_error("expected %s, got %s: %s\n", tide_check_invariant_name(inv),
                    tide_check_invariant_name(rep.violated), rep.message);
    assert_false(rep.ok);
    assert_int_equal(rep.violated, inv);
    assert_true(strlen(rep.message) > 0);
    if (rep_out != NULL) *rep_out = rep;
}

/* ------------------------------------------------------------------ compiled programs */

typedef struct {
    int m, l, wave_width;
} topo_case_t;

static void check_compiled(const topo_case_t *t, int passes, tide_rs_mode_t mode, int cast,
                           int fp32) {
    char what[96];
    snprintf(what, sizeof(what), "M %d L %d W %d passes %d mode %d cast %d", t->m, t->l,
             t->wave_width, passes, (int)mode, cast);
    tide_plan_t plan = plan_of(t->m, t->l, t->wave_width, passes, mode, cast, fp32);
    tide_program_t ag, rs;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &ag));
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, mode, &rs));
    expect_ok(&ag, what);
    expect_ok(&rs, what);
    tide_program_free(&ag);
    tide_program_free(&rs);
    tide_plan_destroy(plan);
}

static void test_compiled_programs_pass(void **state) {
    (void)state;
    const topo_case_t cases[] = {{1, 2, 0}, {2, 2, 0}, {2, 4, 0}, {3, 2, 0}, {4, 2, 0}, {5, 2, 0}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i)
        for (int passes = 1; passes <= 2; ++passes)
            for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode)
                check_compiled(&cases[i], passes, (tide_rs_mode_t)mode, mode, passes == 2);
}

/* W_wave < L: several waves per pass, both inbox generations, stale-block zeroing. */
static void test_compiled_multi_wave_pass(void **state) {
    (void)state;
    const topo_case_t cases[] = {{5, 2, 1}, {3, 3, 1}, {5, 4, 2}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        tide_plan_t plan =
            plan_of(cases[i].m, cases[i].l, cases[i].wave_width, 1, TIDE_RS_IN_PLACE, 0, 0);
        assert_int_equal(plan->rs.inbox_generations, 2);
        assert_true(plan->rs.waves_per_pass >= 2);
        int zeroes = 0;
        for (int g = 0; g < plan->rs.num_waves; ++g)
            for (int s = 0; s < cases[i].l; ++s)
                zeroes += plan->rs.waves[g].zero_mask[s] != 0;
        assert_true(zeroes > 0); /* the schedule relies on stale-block zeroing */
        tide_plan_destroy(plan);
        for (int passes = 1; passes <= 2; ++passes)
            for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode)
                check_compiled(&cases[i], passes, (tide_rs_mode_t)mode, 0, mode);
    }
}

/* The verdict does not depend on the order the abstract machine picks. */
static void test_verdict_independent_of_schedule(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(4, 2, 0, 1, TIDE_RS_SLOT_REUSE, 0, 0);
    tide_program_t rs;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_SLOT_REUSE, &rs));
    for (uint64_t seed = 0; seed < 4; ++seed) {
        tide_check_options_t o = {2 + (int)seed, 3, seed * 7919, 0, 0, 0};
        tide_check_report_t rep;
        assert_tide(TIDE_SUCCESS, tide_program_check_ex(&rs, &o, &rep));
        assert_true(rep.ok);
        assert_int_equal(rep.schedules, 3);
        assert_int_equal(rep.ops_run, 3 * (uint64_t)o.calls * total_ops(&rs));
    }
    tide_program_free(&rs);
    tide_plan_destroy(plan);
}

static void test_bad_arguments(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(1, 2, 0, 1, TIDE_RS_IN_PLACE, 0, 0);
    tide_program_t ag;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &ag));
    tide_check_report_t rep;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_check(NULL, 3, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_check(&ag, 1, &rep));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_check(&ag, 3, NULL));
    tide_check_options_t o = {3, 0, 1, 0, 0, 0};
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_check_ex(&ag, &o, &rep));
    tide_program_free(&ag);
    tide_plan_destroy(plan);
}

/* ------------------------------------------------------------------ hand-made AG, M = 1 */

/*
 * The all-gather of one node of n ranks, written by hand:
 *   READY   wait LANDED >= n e (my previous call landed), signal READY on every rank
 *   CALLER  wait READY >= n e + n, copy my shard (P copies) into every landing, the last copy
 *           to each rank with a fused LANDED, signal CALLER_DONE
 *   DONE    wait LANDED >= n e + n and CALLER_DONE >= e + 1 (the shard reads), event call-done
 * Each variant below breaks it in one place (two ranks unless it says otherwise).
 *
 * The counting variants (three ranks) add a gather into rank 2's staging: the CE queues of
 * ranks 0 and 1 wait for rank 2's credit (CREDIT >= e), copy 16 bytes of their shard into
 * their half of rank 2's staging with a fused ARRIVED and signal CE_DONE (which their DONE
 * waits for, as it reads the shard); rank 2's caller, after its landing copies, waits
 * ARRIVED >= 2 e + thr, reads both halves and credits both.  thr = 2 is race-free; thr = 1
 * knows that one of the two copies landed, not which, so the read races with the other;
 * without the credit, a sender's next call races with this call's read.
 */
enum {
    AG_OK,
    AG_INC,             /* DONE waits with inc 3 */
    AG_DEADLOCK,        /* DONE of each rank waits for a signal the other sends after its wait */
    AG_EARLY_WRITE,     /* rank 0 copies into landings before waiting for readiness */
    AG_STAGE_RACE,      /* rank 1's CE reads its staging while rank 0 writes it */
    AG_SHARD_LATE,      /* rank 0 reads its shard after call-done */
    AG_SHARD_RACE,      /* rank 0's CE reads its shard, unordered with call-done */
    AG_TRUNCATED,       /* rank 1 copies half of parameter 0 */
    AG_PAST_END,        /* rank 1 copies past the end of the landing */
    AG_BAD_RANK,        /* a signal to rank 5 of 2 */
    AG_COUNT_ALL,       /* three ranks: rank 2 waits for both copies */
    AG_COUNT_ONE,       /* three ranks: rank 2 waits for one of the two copies */
    AG_COUNT_NO_CREDIT, /* three ranks: the senders do not wait for rank 2's credit */
};

static bool counting(int variant) {
    return variant == AG_COUNT_ALL || variant == AG_COUNT_ONE || variant == AG_COUNT_NO_CREDIT;
}

static void push(tide_program_t *prog, int rank, tide_queue_t q, tide_op_t op) {
    assert_tide(TIDE_SUCCESS, tide_program_push(prog, rank, q, &op));
}

/* A copy that signals nothing. */
static tide_op_t copy_op(tide_ref_t dst, tide_ref_t src, uint64_t bytes) {
    return tide_op_copy(dst, src, bytes, -1, 0);
}

/* Ranks 0 and 1 gather into rank 2's staging (the counting variants). */
static void build_gather(int variant, int r, tide_program_t *prog) {
    const tide_ref_t staging = tide_ref_arena(2, TIDE_REGION_STAGING, 0);
    if (r < 2) {
        if (variant != AG_COUNT_NO_CREDIT)
            push(prog, r, TIDE_Q_CE, tide_op_wait(r, TIDE_CTR_AG_CREDIT, 1, 0));
        tide_ref_t dst = staging;
        dst.offset = 16 * (uint64_t)r;
        tide_op_t cp = copy_op(dst, tide_ref_operand(TIDE_REF_SHARD, 0, 0), 16);
        cp.sig_rank = 2;
        cp.ctr = TIDE_CTR_AG_ARRIVED;
        push(prog, r, TIDE_Q_CE, cp);
        push(prog, r, TIDE_Q_CE, tide_op_signal(r, TIDE_CTR_AG_CE_DONE));
        push(prog, r, TIDE_Q_DONE, tide_op_wait(r, TIDE_CTR_AG_CE_DONE, 1, 1));
        return;
    }
    push(prog, r, TIDE_Q_CALLER,
         tide_op_wait(r, TIDE_CTR_AG_ARRIVED, 2, variant == AG_COUNT_ONE ? 1 : 2));
    push(prog, r, TIDE_Q_CALLER, copy_op(tide_ref_arena(2, TIDE_REGION_RESIDENT, 0), staging, 32));
    for (int j = 0; j < 2; ++j)
        push(prog, r, TIDE_Q_CALLER, tide_op_signal(j, TIDE_CTR_AG_CREDIT));
}

static void build_ag(const struct tide_plan *plan, int variant, tide_program_t *prog) {
    const tide_geom_t *g = &plan->geom;
    const int n = plan->topo.ranks;
    assert_int_equal(n, counting(variant) ? 3 : 2);
    assert_tide(TIDE_SUCCESS,
                tide_program_init(plan, TIDE_COLL_ALL_GATHER, TIDE_RS_IN_PLACE, prog));
    for (int r = 0; r < n; ++r) {
        push(prog, r, TIDE_Q_READY, tide_op_wait(r, TIDE_CTR_AG_LANDED, n, 0));
        for (int j = 0; j < n; ++j)
            push(prog, r, TIDE_Q_READY, tide_op_signal(j, TIDE_CTR_AG_READY));

        const tide_op_t ready = tide_op_wait(r, TIDE_CTR_AG_READY, n, n);
        if (!(variant == AG_EARLY_WRITE && r == 0)) push(prog, r, TIDE_Q_CALLER, ready);
        if (counting(variant) && r < 2) build_gather(variant, r, prog);
        for (int j = 0; j < n; ++j)
            for (int p = 0; p < g->num_params; ++p) {
                uint64_t bytes = g->params[p].shard_bytes;
                uint64_t dst = tide_geom_landing(g, p, r);
                if (variant == AG_TRUNCATED && r == 1 && p == 0)
                    bytes = bytes / 2 / g->ag_item * g->ag_item;
                if (variant == AG_PAST_END && r == 1 && p == g->num_params - 1) dst += 64;
                tide_op_t cp =
                    copy_op(tide_ref_landing(j, dst),
                            tide_ref_operand(TIDE_REF_SHARD, 0, g->params[p].offset), bytes);
                if (p == g->num_params - 1) {
                    cp.sig_rank = j;
                    cp.ctr = TIDE_CTR_AG_LANDED;
                }
                push(prog, r, TIDE_Q_CALLER, cp);
            }
        if (variant == AG_EARLY_WRITE && r == 0) push(prog, r, TIDE_Q_CALLER, ready);
        if (counting(variant) && r == 2) build_gather(variant, r, prog);
        push(prog, r, TIDE_Q_CALLER, tide_op_signal(r, TIDE_CTR_AG_CALLER_DONE));

        push(prog, r, TIDE_Q_DONE,
             tide_op_wait(r, TIDE_CTR_AG_LANDED, variant == AG_INC ? n + 1 : n, n));
        push(prog, r, TIDE_Q_DONE, tide_op_wait(r, TIDE_CTR_AG_CALLER_DONE, 1, 1));
        if (variant == AG_DEADLOCK) {
            /* A cycle: each DONE waits for the other's DONE. */
            push(prog, r, TIDE_Q_DONE, tide_op_wait(r, TIDE_CTR_AG_CE_DONE, 1, 1));
            push(prog, r, TIDE_Q_DONE, tide_op_signal(1 - r, TIDE_CTR_AG_CE_DONE));
        }
        tide_op_t ev = tide_op_new(TIDE_OP_EVENT);
        ev.event = TIDE_EVENT_CALL_DONE;
        push(prog, r, TIDE_Q_DONE, ev);
    }
    tide_ref_t stage = tide_ref_arena(1, TIDE_REGION_STAGING, 0);
    tide_ref_t resident = tide_ref_arena(1, TIDE_REGION_RESIDENT, 0);
    tide_ref_t shard = tide_ref_operand(TIDE_REF_SHARD, 0, 0);
    switch (variant) {
    case AG_STAGE_RACE:
        push(prog, 0, TIDE_Q_CALLER, copy_op(stage, shard, 16));
        push(prog, 1, TIDE_Q_CE, copy_op(resident, stage, 16));
        break;
    case AG_SHARD_LATE:
        push(prog, 0, TIDE_Q_DONE, copy_op(tide_ref_arena(0, TIDE_REGION_RESIDENT, 0), shard, 16));
        break;
    case AG_SHARD_RACE:
        push(prog, 0, TIDE_Q_CE, copy_op(tide_ref_arena(0, TIDE_REGION_RESIDENT, 0), shard, 16));
        break;
    case AG_BAD_RANK:
        push(prog, 1, TIDE_Q_CE, tide_op_signal(5, TIDE_CTR_AG_CE_DONE));
        break;
    default:
        break;
    }
}

static void run_ag_variant(int variant, tide_check_invariant_t inv, tide_check_report_t *rep) {
    tide_plan_t plan = plan_of(1, counting(variant) ? 3 : 2, 0, 1, TIDE_RS_IN_PLACE, 0, 0);
    tide_program_t prog;
    build_ag(plan, variant, &prog);
    if (inv == TIDE_CHECK_NONE)
        expect_ok(&prog, "hand-made all-gather");
    else
        expect_violation(&prog, inv, rep);
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

static void test_hand_made_ok(void **state) {
    (void)state;
    run_ag_variant(AG_OK, TIDE_CHECK_NONE, NULL);
}

static void test_hand_made_inc(void **state) {
    (void)state;
    tide_check_report_t rep;
    run_ag_variant(AG_INC, TIDE_CHECK_INC, &rep);
    assert_int_equal(rep.site.queue, TIDE_Q_DONE);
    assert_int_equal(rep.site.op, 0);
    assert_non_null(strstr(rep.message, "inc 3"));
    assert_non_null(strstr(rep.message, "2 signal(s)"));
}

static void test_hand_made_deadlock(void **state) {
    (void)state;
    tide_check_report_t rep;
    run_ag_variant(AG_DEADLOCK, TIDE_CHECK_I4, &rep);
    /* Both DONE queues block at their second op (the cycle) in the first call. */
    assert_int_equal(rep.site.rank, 0);
    assert_int_equal(rep.site.queue, TIDE_Q_DONE);
    assert_int_equal(rep.site.op, 2);
    assert_int_equal(rep.site.call, 0);
    assert_non_null(strstr(rep.message, "rank 0 queue done op 2 (wait) call 0"));
    assert_non_null(strstr(rep.message, "rank 1 queue done op 2 (wait) call 0"));
    assert_non_null(strstr(rep.message, "2 queue(s) blocked"));
}

static void test_hand_made_races(void **state) {
    (void)state;
    tide_check_report_t rep;
    /* Writing a peer's landing before it published readiness races with the peer's caller
     * still reading the previous call's landing. */
    run_ag_variant(AG_EARLY_WRITE, TIDE_CHECK_I3, &rep);
    /* The report names the later access first; either may come first in the trace. */
    const bool copy_first = rep.site.kind == TIDE_OP_COPY;
    const tide_check_site_t *copy = copy_first ? &rep.site : &rep.other;
    const tide_check_site_t *user = copy_first ? &rep.other : &rep.site;
    assert_int_equal(copy->rank, 0);
    assert_int_equal(copy->queue, TIDE_Q_CALLER);
    assert_int_equal(copy->kind, TIDE_OP_COPY);
    assert_int_equal(user->rank, 1);
    assert_int_equal(user->kind, TIDE_OP_EVENT);
    assert_int_equal(user->call + 1, copy->call); /* the previous call's landing */
    assert_non_null(strstr(rep.message, "landing slot of rank 1"));
    assert_non_null(strstr(rep.message, "the caller of rank 1 after its call-done event"));
    /* Two ops of two ranks on one stage range, no ordering. */
    run_ag_variant(AG_STAGE_RACE, TIDE_CHECK_I3, &rep);
    assert_non_null(strstr(rep.message, "staging region of rank 1"));
    const bool first_is_ce = rep.site.rank == 1 && rep.site.queue == TIDE_Q_CE;
    const tide_check_site_t *ce = first_is_ce ? &rep.site : &rep.other;
    const tide_check_site_t *caller = first_is_ce ? &rep.other : &rep.site;
    assert_int_equal(ce->rank, 1);
    assert_int_equal(ce->queue, TIDE_Q_CE);
    assert_int_equal(caller->rank, 0);
    assert_int_equal(caller->queue, TIDE_Q_CALLER);
}

static void test_hand_made_source_liveness(void **state) {
    (void)state;
    tide_check_report_t rep;
    run_ag_variant(AG_SHARD_LATE, TIDE_CHECK_I2, &rep);
    assert_int_equal(rep.site.rank, 0);
    assert_int_equal(rep.site.queue, TIDE_Q_DONE);
    assert_non_null(strstr(rep.message, "reads shard operand of rank 0"));
    assert_non_null(strstr(rep.message, "after its call-done event"));
    run_ag_variant(AG_SHARD_RACE, TIDE_CHECK_I2, &rep);
    assert_non_null(strstr(rep.message, "shard operand of rank 0"));
}

static void test_hand_made_data(void **state) {
    (void)state;
    tide_check_report_t rep;
    run_ag_variant(AG_TRUNCATED, TIDE_CHECK_I1, &rep);
    assert_int_equal(rep.site.kind, TIDE_OP_EVENT);
    assert_non_null(strstr(rep.message, "undefined"));
    assert_non_null(strstr(rep.message, "shard of rank 1"));
    run_ag_variant(AG_PAST_END, TIDE_CHECK_BOUNDS, &rep);
    assert_int_equal(rep.site.rank, 1);
    assert_int_equal(rep.site.queue, TIDE_Q_CALLER);
    run_ag_variant(AG_BAD_RANK, TIDE_CHECK_IR, &rep);
    assert_int_equal(rep.site.rank, 1);
    assert_int_equal(rep.site.queue, TIDE_Q_CE);
    assert_non_null(strstr(rep.message, "signal to rank 5"));
}

/* A WAIT for k of m signals acquires what every k-subset guarantees, nothing more. */
static void test_counting_waits(void **state) {
    (void)state;
    run_ag_variant(AG_COUNT_ALL, TIDE_CHECK_NONE, NULL);
    tide_check_report_t rep;
    run_ag_variant(AG_COUNT_ONE, TIDE_CHECK_I3, &rep);
    assert_non_null(strstr(rep.message, "staging region of rank 2"));
    /* Rank 2's read (the caller's op after its ARRIVED wait) and one sender's copy of the
     * same call. */
    const bool read_first = rep.site.rank == 2;
    const tide_check_site_t *rd = read_first ? &rep.site : &rep.other;
    const tide_check_site_t *wr = read_first ? &rep.other : &rep.site;
    assert_int_equal(rd->rank, 2);
    assert_int_equal(rd->queue, TIDE_Q_CALLER);
    assert_int_equal(rd->kind, TIDE_OP_COPY);
    assert_int_equal(wr->queue, TIDE_Q_CE);
    assert_true(wr->rank == 0 || wr->rank == 1);
    assert_int_equal(wr->call, rd->call);
    /* Without credits a sender may run a call ahead: two signals of one sender then satisfy
     * the wait for two, and the read races even within one call. */
    run_ag_variant(AG_COUNT_NO_CREDIT, TIDE_CHECK_I3, &rep);
    assert_non_null(strstr(rep.message, "staging region of rank 2"));
    assert_true(rep.site.rank == 2 || rep.other.rank == 2);
}

/* ------------------------------------------------------------------ proof vs. executions */

static bool is_race(const tide_check_report_t *r) {
    return r->violated == TIDE_CHECK_I2 || r->violated == TIDE_CHECK_I3;
}

/*
 * The default verdict is a proof over every interleaving; the per-trace mode only reports
 * what some concrete run exhibits (a WAIT acquires the signals that run delivered before it).
 * On programs whose mutations are sometimes masked by other synchronisation, the two must
 * agree site by site: a race the proof reports shows up in some run (no false alarm), and a
 * site the proof accepts shows no race in any run (soundness, as far as runs can tell).
 */
static void test_proof_matches_executions(void **state) {
    (void)state;
    const struct {
        tide_collective_t coll;
        int m, l, wave_width;
        tide_rs_mode_t mode;
        tide_fault_kind_t kind;
    } cases[] = {
        {TIDE_COLL_REDUCE_SCATTER, 3, 2, 0, TIDE_RS_SLOT_REUSE, TIDE_FAULT_EARLY_INBOX_REUSE},
        {TIDE_COLL_REDUCE_SCATTER, 5, 2, 1, TIDE_RS_IN_PLACE, TIDE_FAULT_EARLY_INBOX_REUSE},
        {TIDE_COLL_REDUCE_SCATTER, 2, 2, 0, TIDE_RS_IN_PLACE, TIDE_FAULT_REORDER_WAIT},
        {TIDE_COLL_ALL_GATHER, 3, 2, 0, TIDE_RS_IN_PLACE, TIDE_FAULT_REORDER_WAIT},
        {TIDE_COLL_ALL_GATHER, 2, 2, 0, TIDE_RS_IN_PLACE, TIDE_FAULT_DUPLICATE_SIGNAL},
    };
    int races = 0, masked = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        tide_plan_t plan =
            plan_of(cases[i].m, cases[i].l, cases[i].wave_width, 1, cases[i].mode, 0, 0);
        tide_program_t prog;
        if (cases[i].coll == TIDE_COLL_ALL_GATHER)
            assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &prog));
        else
            assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, cases[i].mode, &prog));
        int count = 0;
        assert_tide(TIDE_SUCCESS, tide_fault_count_sites(&prog, cases[i].kind, &count));
        for (int s = 0; s < count; ++s) {
            tide_program_t faulty;
            tide_fault_site_t site;
            assert_tide(TIDE_SUCCESS,
                        tide_fault_inject(&prog, cases[i].kind, (uint64_t)s, &faulty, &site));
            const tide_check_options_t proof = {3, 1, 1, 1, 0, 0}, runs = {3, 24, 5, 1, 1, 0};
            tide_check_report_t a, b;
            assert_tide(TIDE_SUCCESS, tide_program_check_ex(&faulty, &proof, &a));
            assert_tide(TIDE_SUCCESS, tide_program_check_ex(&faulty, &runs, &b));
            if (is_race(&a) != is_race(&b) || a.ok != b.ok)
                fail_msg("%s (%s): proof says %s, runs say %s: %s / %s",
                         tide_fault_name(cases[i].kind), site.what,
                         tide_check_invariant_name(a.violated),
                         tide_check_invariant_name(b.violated), a.message, b.message);
            races += is_race(&a);
            masked += a.ok;
            tide_program_free(&faulty);
        }
        tide_program_free(&prog);
        tide_plan_destroy(plan);
    }
    printf("proof and 24 runs agree on %d racy and %d masked mutations\n", races, masked);
    /* Both outcomes occur: the comparison is not vacuous. */
    assert_true(races > 0);
    assert_true(masked > 0);
}

/* ------------------------------------------------------------------ edited RS programs */

static int find_op(const tide_queue_ops_t *qo, int kind, int from) {
    for (int i = from; i < qo->num_ops; ++i)
        if (qo->ops[i].kind == kind) return i;
    return -1;
}

static void insert_at(tide_queue_ops_t *qo, int i, const tide_op_t *op) {
    tide_op_t *ops = realloc(qo->ops, (size_t)(qo->num_ops + 1) * sizeof(*ops));
    assert_non_null(ops);
    memmove(&ops[i + 1], &ops[i], (size_t)(qo->num_ops - i) * sizeof(*ops));
    ops[i] = *op;
    qo->ops = ops;
    qo->cap_ops = ++qo->num_ops;
}

/* A landing repeated lands every contributor twice. */
static void test_rs_double_landing(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(2, 2, 0, 1, TIDE_RS_IN_PLACE, 0, 0);
    tide_program_t rs;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &rs));
    expect_ok(&rs, "RS M 2 L 2");
    tide_queue_ops_t *net = &rs.ranks[3].queues[TIDE_Q_NET];
    const int land = find_op(net, TIDE_OP_LAND, 0);
    assert_true(land >= 0);
    tide_op_t again = net->ops[land];
    again.init = 0;
    insert_at(net, land + 1, &again);
    tide_check_report_t rep;
    expect_violation(&rs, TIDE_CHECK_I1, &rep);
    assert_int_equal(rep.site.rank, 3);
    assert_int_equal(rep.site.queue, TIDE_Q_NET);
    assert_int_equal(rep.site.op, land + 1);
    assert_non_null(strstr(rep.message, "a contributor twice"));
    tide_program_free(&rs);
    tide_plan_destroy(plan);
}

/* Read-done recorded before the sums: the sums read gradients the caller already released. */
static void test_rs_read_done_first(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(2, 2, 0, 1, TIDE_RS_IN_PLACE, 0, 0);
    tide_program_t rs;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &rs));
    tide_queue_ops_t *read = &rs.ranks[1].queues[TIDE_Q_READ];
    const int ev = read->num_ops - 1;
    assert_int_equal(read->ops[ev].kind, TIDE_OP_EVENT);
    tide_op_t event = read->ops[ev];
    --read->num_ops;
    insert_at(read, 0, &event);
    tide_check_report_t rep;
    expect_violation(&rs, TIDE_CHECK_I2, &rep);
    assert_int_equal(rep.site.rank, 1);
    assert_non_null(strstr(rep.message, "gradient"));
    assert_non_null(strstr(rep.message, "read-done"));
    tide_program_free(&rs);
    tide_plan_destroy(plan);
}

/* A landing that does not initialise adds onto whatever the output held. */
static void test_rs_landing_without_init(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(3, 2, 0, 1, TIDE_RS_IN_PLACE, 0, 0);
    tide_program_t rs;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &rs));
    tide_queue_ops_t *net = &rs.ranks[0].queues[TIDE_Q_NET];
    const int land = find_op(net, TIDE_OP_LAND, 0);
    assert_true(land >= 0 && net->ops[land].init);
    net->ops[land].init = 0;
    tide_check_report_t rep;
    expect_violation(&rs, TIDE_CHECK_I1, &rep);
    assert_int_equal(rep.site.op, land);
    assert_non_null(strstr(rep.message, "no landing of this call initialised"));
    tide_program_free(&rs);
    tide_plan_destroy(plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compiled_programs_pass),
        cmocka_unit_test(test_compiled_multi_wave_pass),
        cmocka_unit_test(test_verdict_independent_of_schedule),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_hand_made_ok),
        cmocka_unit_test(test_hand_made_inc),
        cmocka_unit_test(test_hand_made_deadlock),
        cmocka_unit_test(test_hand_made_races),
        cmocka_unit_test(test_hand_made_source_liveness),
        cmocka_unit_test(test_hand_made_data),
        cmocka_unit_test(test_counting_waits),
        cmocka_unit_test(test_proof_matches_executions),
        cmocka_unit_test(test_rs_double_landing),
        cmocka_unit_test(test_rs_read_done_first),
        cmocka_unit_test(test_rs_landing_without_init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
