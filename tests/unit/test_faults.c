/*
 * test_faults.c - fault injection (src/program/fault.h, docs/faults.md): every fault kind, on
 * compiled programs of at least two plans, is caught.
 *
 * Static: every eligible site (or an even sample of at most SAMPLE sites) of each plan is
 * mutated and checked.  Kinds whose every site is a protocol bug must be caught at every
 * site with the invariant docs/faults.md names; kinds whose sites can be masked by other
 * synchronisation (the checker then proves the mutated program still safe) must be caught at
 * some sites of every plan.  Signal-count faults are also checked with the INC pass off, to
 * see the deeper invariant they break.
 *
 * Runtime: stall faults run on the CPU fabric with TIDE_TIMEOUT_MS = 200 and must come back
 * as TIDE_ERR_TIMEOUT naming rank, queue and op (never a hang); data faults must change some
 * output element against the unmutated run.
 *
 * The last test prints the table kind -> how caught.
 */
#include "test_util.h"

#include "api/group_test_hooks.h"
#include "kernels/kernels.h"
#include "plan/plan.h"
#include "program/check.h"
#include "program/check_ring.h"
#include "program/fault.h"

#include <pthread.h>
#include <time.h>

#define SAMPLE 40
#define MAX_RANKS 16
#define CALLS 3

static const tide_param_shape_t shapes[] = {{105, 9}, {10, 16}};
#define NUM_PARAMS 2

typedef struct {
    int m, l, wave_width, passes;
    tide_rs_mode_t mode;
    tide_lane_t lane; /* AUTO (0): the rail lane at L = 1 */
} pcfg_t;

static tide_config_t config_of(const pcfg_t *pc) {
    tide_config_t c = TIDE_CONFIG_INIT;
    c.nodes = pc->m;
    c.gpus_per_node = pc->l;
    c.wave_width = pc->wave_width;
    c.passes = pc->passes;
    c.mode = pc->mode;
    c.lane = pc->lane;
    return c;
}

static const tide_group_desc_t desc = {NUM_PARAMS, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16,
                                       TIDE_DTYPE_BF16};

static tide_plan_t plan_of(const pcfg_t *pc) {
    tide_config_t c = config_of(pc);
    tide_plan_t plan = NULL;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&c, &desc, &plan));
    return plan;
}

static void compile(const tide_plan_t plan, tide_collective_t coll, tide_rs_mode_t mode,
                    tide_program_t *prog) {
    if (coll == TIDE_COLL_ALL_GATHER)
        assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, prog));
    else
        assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, mode, prog));
}

/* ------------------------------------------------------------------ the table */

#define BIT(inv) (1u << (inv))

typedef struct {
    int sites, caught, runs_timeout, runs_data;
    int by[TIDE_CHECK_KIND_COUNT];      /* default check */
    int deep_by[TIDE_CHECK_KIND_COUNT]; /* with INC off */
} tally_t;

static tally_t tally[TIDE_FAULT_KIND_COUNT];
static int fault_tests;

/* ------------------------------------------------------------------ static checks */

typedef struct {
    tide_fault_kind_t kind;
    tide_collective_t coll;
    pcfg_t plans[3];
    int num_plans;
    unsigned expect;      /* invariants a catch may name */
    bool every_site;      /* every site is a bug: all must be caught */
    unsigned expect_deep; /* with INC off (0: not run) */
    bool deep_every_site;
} static_case_t;

static tide_check_report_t check(const tide_program_t *prog, int skip_inc) {
    tide_check_options_t o = {3, 1, 1, skip_inc, 0, 0};
    tide_check_report_t rep;
    assert_tide(TIDE_SUCCESS, tide_program_check_ex(prog, &o, &rep));
    return rep;
}

static void run_static(const static_case_t *sc) {
    for (int i = 0; i < sc->num_plans; ++i) {
        const pcfg_t *pc = &sc->plans[i];
        tide_plan_t plan = plan_of(pc);
        tide_program_t prog;
        compile(plan, sc->coll, pc->mode, &prog);
        int count = 0;
        assert_tide(TIDE_SUCCESS, tide_fault_count_sites(&prog, sc->kind, &count));
        if (count == 0) print_error("%s: no site on plan %d\n", tide_fault_name(sc->kind), i);
        assert_true(count > 0);
        const int tested = count < SAMPLE ? count : SAMPLE;
        int caught = 0;
        for (int k = 0; k < tested; ++k) {
            const uint64_t seed = (uint64_t)k * (uint64_t)count / (uint64_t)tested;
            tide_program_t faulty;
            tide_fault_site_t site;
            assert_tide(TIDE_SUCCESS, tide_fault_inject(&prog, sc->kind, seed, &faulty, &site));
            assert_int_equal(site.index, (int)seed);
            tide_check_report_t rep = check(&faulty, 0);
            ++fault_tests;
            ++tally[sc->kind].sites;
            ++tally[sc->kind].by[rep.violated];
            if (!rep.ok) {
                ++caught;
                ++tally[sc->kind].caught;
                if (!(sc->expect & BIT(rep.violated)))
                    fail_msg("%s (%s) caught as %s, not as documented: %s",
                             tide_fault_name(sc->kind), site.what,
                             tide_check_invariant_name(rep.violated), rep.message);
            } else if (sc->every_site) {
                fail_msg("%s on M %d L %d: %s not caught", tide_fault_name(sc->kind), pc->m, pc->l,
                         site.what);
            }
            if (sc->expect_deep) {
                tide_check_report_t deep = check(&faulty, 1);
                ++tally[sc->kind].deep_by[deep.violated];
                if (!deep.ok && !(sc->expect_deep & BIT(deep.violated)))
                    fail_msg("%s (%s) with INC off: %s: %s", tide_fault_name(sc->kind), site.what,
                             tide_check_invariant_name(deep.violated), deep.message);
                if (deep.ok && sc->deep_every_site)
                    fail_msg("%s (%s) with INC off: not caught", tide_fault_name(sc->kind),
                             site.what);
            }
            tide_program_free(&faulty);
        }
        if (caught == 0) fail_msg("%s: no site caught on plan %d", tide_fault_name(sc->kind), i);
        tide_program_free(&prog);
        tide_plan_destroy(plan);
    }
}

#define AG TIDE_COLL_ALL_GATHER
#define RS TIDE_COLL_REDUCE_SCATTER
#define IP TIDE_RS_IN_PLACE
#define SR TIDE_RS_SLOT_REUSE
#define GEN TIDE_LANE_GENERIC
#define AUTO TIDE_LANE_AUTO
#define RACE (BIT(TIDE_CHECK_I2) | BIT(TIDE_CHECK_I3))
#define ANY_DEEP (RACE | BIT(TIDE_CHECK_I1) | BIT(TIDE_CHECK_I4))

/* kind, collective, plans {M, L, W_wave, passes, mode}, documented invariants, every site a
 * bug, invariants with INC off (0: not run), every site caught with INC off. */
/* clang-format off */
static const static_case_t static_cases[] = {
    {TIDE_FAULT_DROP_CREDIT, AG, {{3, 2, 0, 1, IP, AUTO}, {5, 1, 0, 1, IP, AUTO}}, 2,
     BIT(TIDE_CHECK_INC), true, BIT(TIDE_CHECK_I4), true},
    {TIDE_FAULT_DROP_CREDIT, RS, {{4, 2, 0, 1, SR, AUTO}, {5, 2, 1, 1, IP, AUTO}, {2, 4, 0, 2, IP, AUTO}}, 3,
     BIT(TIDE_CHECK_INC), true, BIT(TIDE_CHECK_I4), true},
    {TIDE_FAULT_DROP_COMPLETION_FENCE, AG, {{2, 2, 0, 1, IP, AUTO}, {3, 4, 0, 1, IP, AUTO}}, 2,
     BIT(TIDE_CHECK_I3), true, 0, false},
    {TIDE_FAULT_DROP_COMPLETION_FENCE, RS, {{2, 4, 0, 1, IP, AUTO}, {5, 2, 1, 2, SR, AUTO}}, 2,
     BIT(TIDE_CHECK_I3), true, 0, false},
    {TIDE_FAULT_DROP_READ_COMPLETION, RS, {{2, 2, 0, 1, IP, AUTO}, {3, 3, 0, 2, SR, AUTO}, {1, 4, 0, 1, IP, AUTO}}, 3,
     BIT(TIDE_CHECK_I2), true, 0, false},
    {TIDE_FAULT_EARLY_OUTBOX_REUSE, RS, {{5, 2, 1, 1, SR, AUTO}, {4, 2, 0, 2, SR, AUTO}, {6, 2, 0, 1, SR, AUTO}}, 3,
     BIT(TIDE_CHECK_I3), true, 0, false},
    {TIDE_FAULT_EARLY_INBOX_REUSE, RS, {{2, 2, 0, 1, IP, AUTO}, {3, 2, 0, 1, SR, AUTO}, {5, 2, 1, 1, IP, AUTO}}, 3,
     BIT(TIDE_CHECK_I3), false, 0, false},
    {TIDE_FAULT_SKIP_STALE_ZERO, RS, {{5, 2, 1, 1, IP, AUTO}, {3, 3, 1, 2, SR, AUTO}}, 2,
     BIT(TIDE_CHECK_I1), true, 0, false},
    {TIDE_FAULT_SHIFT_LATIN_SLOT, RS, {{2, 2, 0, 1, IP, AUTO}, {4, 2, 0, 1, SR, AUTO}, {3, 3, 1, 1, IP, AUTO}}, 3,
     BIT(TIDE_CHECK_I1) | BIT(TIDE_CHECK_I3), true, 0, false},
    {TIDE_FAULT_MISSING_SIGNAL, AG, {{3, 2, 0, 1, IP, AUTO}, {4, 1, 0, 1, IP, AUTO}}, 2,
     BIT(TIDE_CHECK_INC), true, BIT(TIDE_CHECK_I4), true},
    {TIDE_FAULT_MISSING_SIGNAL, RS, {{2, 4, 0, 1, IP, AUTO}, {3, 2, 0, 2, SR, AUTO}}, 2,
     BIT(TIDE_CHECK_INC), true, BIT(TIDE_CHECK_I4), true},
    {TIDE_FAULT_DUPLICATE_SIGNAL, AG, {{2, 2, 0, 1, IP, AUTO}, {3, 2, 0, 1, IP, AUTO}}, 2,
     BIT(TIDE_CHECK_INC), true, ANY_DEEP, false},
    {TIDE_FAULT_DUPLICATE_SIGNAL, RS, {{2, 2, 0, 1, IP, AUTO}, {4, 2, 0, 1, SR, AUTO}}, 2,
     BIT(TIDE_CHECK_INC), true, ANY_DEEP, false},
    {TIDE_FAULT_TRUNCATE_COPY, AG, {{2, 2, 0, 1, IP, AUTO}, {3, 2, 0, 1, IP, AUTO}}, 2,
     BIT(TIDE_CHECK_I1), true, 0, false},
    {TIDE_FAULT_TRUNCATE_COPY, RS, {{2, 2, 0, 1, IP, AUTO}, {2, 4, 0, 1, SR, AUTO}}, 2,
     BIT(TIDE_CHECK_I1), true, 0, false},
    /* Strided landing copies need M >= 9 rail peers: the generic programs at L = 1. */
    {TIDE_FAULT_WRONG_PITCH, AG, {{9, 1, 0, 1, IP, GEN}, {10, 1, 0, 1, IP, GEN}}, 2,
     BIT(TIDE_CHECK_I1) | BIT(TIDE_CHECK_I3) | BIT(TIDE_CHECK_BOUNDS), true, 0, false},
    {TIDE_FAULT_WRONG_PITCH, RS, {{2, 2, 0, 1, IP, AUTO}, {3, 3, 0, 2, SR, AUTO}}, 2,
     BIT(TIDE_CHECK_I1) | BIT(TIDE_CHECK_I3) | BIT(TIDE_CHECK_BOUNDS), true, 0, false},
    {TIDE_FAULT_REORDER_WAIT, AG, {{2, 2, 0, 1, IP, AUTO}, {3, 2, 0, 1, IP, AUTO}}, 2,
     RACE, false, 0, false},
    {TIDE_FAULT_REORDER_WAIT, RS, {{2, 2, 0, 1, IP, AUTO}, {4, 2, 0, 1, SR, AUTO}}, 2,
     RACE, false, 0, false},
    /* The rail lane (L = 1, compile_lane.c): M = 2 (one peer, the wrap-around credits),
     * odd M, two passes.  Its programs have no staging, stale zeroing, Latin-square slots,
     * strided copies, completion fence or RS_PUSHED wait, so those kinds have no site there
     * (test_lane_no_site).  Its read-done gate is an RS_SENT wait: lowering it (the
     * early-outbox-reuse mutation) releases the gradients early, an I2 violation. */
    {TIDE_FAULT_DROP_CREDIT, AG, {{2, 1, 0, 1, IP, AUTO}, {3, 1, 0, 2, SR, AUTO}, {5, 1, 0, 1, IP, AUTO}}, 3,
     BIT(TIDE_CHECK_INC), true, BIT(TIDE_CHECK_I4), true},
    {TIDE_FAULT_DROP_CREDIT, RS, {{2, 1, 0, 3, IP, AUTO}, {3, 1, 0, 2, SR, AUTO}, {5, 1, 0, 1, IP, AUTO}}, 3,
     BIT(TIDE_CHECK_INC), true, BIT(TIDE_CHECK_I4), true},
    {TIDE_FAULT_EARLY_OUTBOX_REUSE, RS, {{2, 1, 0, 1, IP, AUTO}, {3, 1, 0, 2, SR, AUTO}, {5, 1, 0, 1, IP, AUTO}},
     3, BIT(TIDE_CHECK_I2), true, 0, false},
    {TIDE_FAULT_EARLY_INBOX_REUSE, RS, {{2, 1, 0, 3, IP, AUTO}, {3, 1, 0, 2, SR, AUTO}, {5, 1, 0, 1, IP, AUTO}},
     3, BIT(TIDE_CHECK_I3), false, 0, false},
    {TIDE_FAULT_MISSING_SIGNAL, AG, {{2, 1, 0, 1, IP, AUTO}, {3, 1, 0, 1, IP, AUTO}, {5, 1, 0, 1, IP, AUTO}}, 3,
     BIT(TIDE_CHECK_INC), true, BIT(TIDE_CHECK_I4), true},
    {TIDE_FAULT_DUPLICATE_SIGNAL, AG, {{2, 1, 0, 1, IP, AUTO}, {5, 1, 0, 1, IP, AUTO}}, 2,
     BIT(TIDE_CHECK_INC), true, ANY_DEEP, false},
    {TIDE_FAULT_DUPLICATE_SIGNAL, RS, {{2, 1, 0, 3, IP, AUTO}, {3, 1, 0, 2, SR, AUTO}}, 2,
     BIT(TIDE_CHECK_INC), true, ANY_DEEP, false},
    {TIDE_FAULT_TRUNCATE_COPY, AG, {{2, 1, 0, 1, IP, AUTO}, {5, 1, 0, 1, IP, AUTO}}, 2,
     BIT(TIDE_CHECK_I1), true, 0, false},
    {TIDE_FAULT_TRUNCATE_COPY, RS, {{2, 1, 0, 3, IP, AUTO}, {3, 1, 0, 2, SR, AUTO}}, 2,
     BIT(TIDE_CHECK_I1), true, 0, false},
    {TIDE_FAULT_REORDER_WAIT, AG, {{2, 1, 0, 1, IP, AUTO}, {5, 1, 0, 1, IP, AUTO}}, 2,
     RACE, false, 0, false},
    {TIDE_FAULT_REORDER_WAIT, RS, {{2, 1, 0, 3, IP, AUTO}, {5, 1, 0, 1, SR, AUTO}}, 2,
     RACE, false, 0, false},
};
/* clang-format on */
#define NUM_STATIC (int)(sizeof(static_cases) / sizeof(static_cases[0]))

static void test_static(void **state) {
    run_static((const static_case_t *)*state);
}

/* The rail lane's programs have no op these kinds mutate (see the static table). */
static void test_lane_no_site(void **state) {
    (void)state;
    const tide_fault_kind_t none[] = {
        TIDE_FAULT_DROP_COMPLETION_FENCE, TIDE_FAULT_DROP_READ_COMPLETION,
        TIDE_FAULT_SKIP_STALE_ZERO,       TIDE_FAULT_SHIFT_LATIN_SLOT,
        TIDE_FAULT_WRONG_PITCH,
    };
    const pcfg_t pc = {5, 1, 0, 2, IP, TIDE_LANE_RAIL};
    tide_plan_t plan = plan_of(&pc);
    assert_true(plan->rs.rail_lane);
    for (int coll = 0; coll < 2; ++coll) {
        tide_program_t prog;
        compile(plan, (tide_collective_t)coll, IP, &prog);
        for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); ++i) {
            int count = -1;
            assert_tide(TIDE_SUCCESS, tide_fault_count_sites(&prog, none[i], &count));
            assert_int_equal(count, 0);
        }
        tide_program_free(&prog);
    }
    tide_plan_destroy(plan);
}

/* Kinds without an eligible site in a program are refused, not silently ignored. */
static void test_no_site(void **state) {
    (void)state;
    const pcfg_t pc = {2, 2, 0, 1, IP, AUTO};
    tide_plan_t plan = plan_of(&pc);
    tide_program_t ag, out;
    compile(plan, AG, IP, &ag);
    int count = -1;
    assert_tide(TIDE_SUCCESS, tide_fault_count_sites(&ag, TIDE_FAULT_SKIP_STALE_ZERO, &count));
    assert_int_equal(count, 0);
    assert_tide(TIDE_ERR_UNSUPPORTED,
                tide_fault_inject(&ag, TIDE_FAULT_SKIP_STALE_ZERO, 0, &out, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_fault_inject(&ag, TIDE_FAULT_KIND_COUNT, 0, &out, NULL));
    /* The same seed mutates the same op: two injections give identical programs. */
    tide_program_t a, b;
    assert_tide(TIDE_SUCCESS, tide_fault_inject(&ag, TIDE_FAULT_TRUNCATE_COPY, 17, &a, NULL));
    assert_tide(TIDE_SUCCESS, tide_fault_inject(&ag, TIDE_FAULT_TRUNCATE_COPY, 17, &b, NULL));
    int diffs = 0;
    for (int r = 0; r < a.num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const tide_queue_ops_t *x = &a.ranks[r].queues[q], *y = &b.ranks[r].queues[q],
                                   *o = &ag.ranks[r].queues[q];
            assert_int_equal(x->num_ops, y->num_ops);
            assert_memory_equal(x->ops, y->ops, (size_t)x->num_ops * sizeof(tide_op_t));
            for (int i = 0; i < x->num_ops; ++i)
                diffs += memcmp(&x->ops[i], &o->ops[i], sizeof(tide_op_t)) != 0;
        }
    assert_int_equal(diffs, 1); /* exactly one op differs from the unmutated program */
    tide_program_free(&a);
    tide_program_free(&b);
    tide_program_free(&ag);
    tide_plan_destroy(plan);
}

/* ------------------------------------------------------------------ runtime (CPU fabric) */

typedef enum { RT_TIMEOUT, RT_DATA } rt_expect_t;

typedef struct {
    tide_fault_kind_t kind;
    tide_collective_t coll;
    pcfg_t plan;
    rt_expect_t expect;
} rt_case_t;

typedef struct {
    const rt_case_t *rc;
    tide_comm_t comms[MAX_RANKS];
    tide_config_t cfg;
    bool inject;
    uint64_t seed;
    uint64_t landing_bytes, out_elems, shard_bytes;
    uint8_t *shards[CALLS][MAX_RANKS];
    uint16_t *grads[CALLS][MAX_RANKS][NUM_PARAMS];
    uint8_t *landing[CALLS][MAX_RANKS]; /* AG: the landing after each call */
    float *out[CALLS][MAX_RANKS];
    tide_result_t res[CALLS][MAX_RANKS];
    char msg[MAX_RANKS][600];
    char setup[MAX_RANKS][300]; /* setup failures (reported by the main thread) */
} rt_job_t;

typedef struct {
    rt_job_t *job;
    int rank;
} rt_arg_t;

static void rt_call(rt_job_t *j, int rank, tide_group_t g, int call) {
    const tide_rs_mode_t mode = j->rc->plan.mode;
    tide_result_t res;
    if (j->rc->coll == AG) {
        const int slot = call % 2;
        res = tide_all_gather(g, j->shards[call][rank], slot, NULL);
        if (res != TIDE_SUCCESS && j->msg[rank][0] == '\0')
            snprintf(j->msg[rank], sizeof(j->msg[rank]), "%s", tide_get_last_error());
        /* After a failed call peers may still be writing this landing: only a completed
         * call's landing is defined (and compared). */
        void *land = NULL;
        if (res == TIDE_SUCCESS && tide_group_landing(g, slot, &land) == TIDE_SUCCESS)
            memcpy(j->landing[call][rank], land, j->landing_bytes);
    } else {
        const void *grads[NUM_PARAMS];
        for (int p = 0; p < NUM_PARAMS; ++p)
            grads[p] = j->grads[call][rank][p];
        for (uint64_t e = 0; e < j->out_elems; ++e)
            j->out[call][rank][e] = -1.0f;
        res = tide_reduce_scatter(g, grads, j->out[call][rank], 1.0f, 0, mode, NULL);
    }
    j->res[call][rank] = res;
    if (res != TIDE_SUCCESS && j->msg[rank][0] == '\0')
        snprintf(j->msg[rank], sizeof(j->msg[rank]), "%s", tide_get_last_error());
}

static void *rt_rank(void *p) {
    rt_arg_t *a = p;
    rt_job_t *j = a->job;
    const int rank = a->rank;
    const tide_collective_t coll = j->rc->coll;
    const tide_rs_mode_t mode = j->rc->plan.mode;
    tide_group_t g;
    if (tide_group_register(j->comms[rank], &j->cfg, &desc, &g) != TIDE_SUCCESS) {
        snprintf(j->setup[rank], sizeof(j->setup[rank]), "register: %s", tide_get_last_error());
        return NULL;
    }
    if (j->inject) {
        const tide_program_t *prog;
        tide_program_t faulty;
        if (tide_group_test_program(g, coll, mode, &prog) != TIDE_SUCCESS ||
            tide_fault_inject(prog, j->rc->kind, j->seed, &faulty, NULL) != TIDE_SUCCESS ||
            tide_group_test_set_program(g, coll, mode, &faulty) != TIDE_SUCCESS)
            snprintf(j->setup[rank], sizeof(j->setup[rank]), "inject: %s", tide_get_last_error());
    }
    if (j->setup[rank][0] == '\0')
        for (int call = 0; call < CALLS; ++call)
            rt_call(j, rank, g, call);
    if (tide_group_deregister(g) != TIDE_SUCCESS && j->setup[rank][0] == '\0')
        snprintf(j->setup[rank], sizeof(j->setup[rank]), "deregister: %s", tide_get_last_error());
    return NULL;
}

/* Inputs that differ per call, rank and element, and sum exactly (small integers). */
static void rt_inputs(rt_job_t *j, const struct tide_plan *plan) {
    const int n = plan->topo.ranks;
    j->landing_bytes = plan->geom.group_bytes;
    j->out_elems = plan->geom.shard_elems;
    j->shard_bytes = plan->geom.shard_bytes;
    for (int c = 0; c < CALLS; ++c)
        for (int r = 0; r < n; ++r) {
            j->shards[c][r] = malloc(j->shard_bytes);
            j->landing[c][r] = calloc(1, j->landing_bytes);
            j->out[c][r] = calloc(j->out_elems, sizeof(float));
            assert_non_null(j->shards[c][r]);
            assert_non_null(j->landing[c][r]);
            assert_non_null(j->out[c][r]);
            for (uint64_t b = 0; b < j->shard_bytes; ++b)
                j->shards[c][r][b] =
                    (uint8_t)(1 + (b * 7 + (uint64_t)r * 13 + (uint64_t)c * 29) % 251);
            for (int p = 0; p < NUM_PARAMS; ++p) {
                const uint64_t elems = shapes[p].dim0 * shapes[p].inner;
                j->grads[c][r][p] = malloc(elems * sizeof(uint16_t));
                assert_non_null(j->grads[c][r][p]);
                for (uint64_t e = 0; e < elems; ++e) {
                    int v =
                        (int)((e * 5 + (uint64_t)r * 3 + (uint64_t)p * 11 + (uint64_t)c * 7) % 15) -
                        7;
                    j->grads[c][r][p][e] = tide_float_to_bf16((float)(v == 0 ? 8 : v));
                }
            }
        }
}

static void rt_free(rt_job_t *j, int n) {
    for (int c = 0; c < CALLS; ++c)
        for (int r = 0; r < n; ++r) {
            free(j->shards[c][r]);
            free(j->landing[c][r]);
            free(j->out[c][r]);
            for (int p = 0; p < NUM_PARAMS; ++p)
                free(j->grads[c][r][p]);
        }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Run all ranks of one job (threads); returns the wall time. */
static double rt_run(rt_job_t *j, int n) {
    assert_tide(TIDE_SUCCESS,
                tide_comm_init_all(TIDE_FABRIC_CPU, j->rc->plan.m, j->rc->plan.l, j->comms));
    pthread_t th[MAX_RANKS];
    rt_arg_t args[MAX_RANKS];
    const double t0 = now_s();
    for (int r = 0; r < n; ++r) {
        args[r] = (rt_arg_t){j, r};
        assert_int_equal(pthread_create(&th[r], NULL, rt_rank, &args[r]), 0);
    }
    for (int r = 0; r < n; ++r)
        pthread_join(th[r], NULL);
    const double dt = now_s() - t0;
    for (int r = 0; r < n; ++r) {
        if (j->setup[r][0] != '\0') fail_msg("rank %d: %s", r, j->setup[r]);
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(j->comms[r]));
    }
    return dt;
}

/* The first site the checker flags, preferring a data (I1) finding. */
static uint64_t rt_pick_site(const rt_case_t *rc, const struct tide_plan *plan) {
    tide_program_t prog;
    compile((tide_plan_t)plan, rc->coll, rc->plan.mode, &prog);
    int count = 0;
    assert_tide(TIDE_SUCCESS, tide_fault_count_sites(&prog, rc->kind, &count));
    assert_true(count > 0);
    int64_t first = -1, data = -1;
    for (int s = 0; s < count && data < 0; ++s) {
        tide_program_t faulty;
        assert_tide(TIDE_SUCCESS, tide_fault_inject(&prog, rc->kind, (uint64_t)s, &faulty, NULL));
        tide_check_report_t rep = check(&faulty, 0);
        tide_program_free(&faulty);
        if (rep.ok) continue;
        if (first < 0) first = s;
        if (rep.violated == TIDE_CHECK_I1) data = s;
    }
    tide_program_free(&prog);
    assert_true(first >= 0);
    return (uint64_t)(data >= 0 ? data : first);
}

static void test_runtime(void **state) {
    const rt_case_t *rc = *state;
#if defined(__SANITIZE_THREAD__)
    /* A mutated program deliberately breaks the synchronisation that ThreadSanitizer checks,
     * so its races are the expected outcome, not findings; these runs are covered by the
     * release and ASan builds, and the static checker cases above run here too. */
    skip();
#endif
    tide_plan_t plan = plan_of(&rc->plan);
    const int n = plan->topo.ranks;
    assert_true(n <= MAX_RANKS);
    const uint64_t seed = rt_pick_site(rc, plan);

    rt_job_t *ref = calloc(1, sizeof(*ref)), *bad = calloc(1, sizeof(*bad));
    assert_non_null(ref);
    assert_non_null(bad);
    ref->rc = bad->rc = rc;
    ref->cfg = bad->cfg = config_of(&rc->plan);
    bad->inject = true;
    bad->seed = seed;
    rt_inputs(ref, plan);
    rt_inputs(bad, plan);

    rt_run(ref, n);
    for (int c = 0; c < CALLS; ++c)
        for (int r = 0; r < n; ++r) {
            if (ref->res[c][r] != TIDE_SUCCESS) fail_msg("reference rank %d: %s", r, ref->msg[r]);
        }

    /* Stalls must fail stop quickly; a data fault that stalls a peer still ends in time. */
    setenv("TIDE_TIMEOUT_MS", rc->expect == RT_TIMEOUT ? "200" : "5000", 1);
    const double dt = rt_run(bad, n);
    unsetenv("TIDE_TIMEOUT_MS");
    assert_true(dt < 30.0);
    ++fault_tests;

    int timeouts = 0, failures = 0;
    uint64_t wrong = 0;
    for (int c = 0; c < CALLS; ++c)
        for (int r = 0; r < n; ++r) {
            if (bad->res[c][r] == TIDE_ERR_TIMEOUT) ++timeouts;
            if (bad->res[c][r] != TIDE_SUCCESS) {
                ++failures;
                continue;
            }
            if (rc->coll == AG) {
                wrong += memcmp(bad->landing[c][r], ref->landing[c][r], ref->landing_bytes) != 0;
            } else {
                for (uint64_t e = 0; e < ref->out_elems; ++e)
                    wrong += memcmp(&bad->out[c][r][e], &ref->out[c][r][e], sizeof(float)) != 0;
            }
        }
    if (rc->expect == RT_TIMEOUT) {
        if (timeouts == 0)
            fail_msg("%s: no timeout (%d failures)", tide_fault_name(rc->kind), failures);
        /* The fail-stop message names the rank, the queue and the op. */
        int named = 0;
        for (int r = 0; r < n; ++r)
            named += strstr(bad->msg[r], "missed its deadline") != NULL &&
                     strstr(bad->msg[r], " queue ") != NULL && strstr(bad->msg[r], " op ") != NULL;
        assert_true(named > 0);
        ++tally[rc->kind].runs_timeout;
    } else {
        if (wrong == 0)
            fail_msg("%s (site %llu): no wrong element (%d failed calls)",
                     tide_fault_name(rc->kind), (unsigned long long)seed, failures);
        ++tally[rc->kind].runs_data;
    }
    rt_free(ref, n);
    rt_free(bad, n);
    free(ref);
    free(bad);
    tide_plan_destroy(plan);
}

static const rt_case_t rt_cases[] = {
    {TIDE_FAULT_DROP_CREDIT, AG, {3, 2, 0, 1, IP, AUTO}, RT_TIMEOUT},
    {TIDE_FAULT_DROP_CREDIT, RS, {4, 2, 0, 1, SR, AUTO}, RT_TIMEOUT},
    {TIDE_FAULT_MISSING_SIGNAL, AG, {2, 2, 0, 1, IP, AUTO}, RT_TIMEOUT},
    {TIDE_FAULT_MISSING_SIGNAL, RS, {2, 2, 0, 1, IP, AUTO}, RT_TIMEOUT},
    {TIDE_FAULT_SKIP_STALE_ZERO, RS, {5, 2, 1, 1, IP, AUTO}, RT_DATA},
    {TIDE_FAULT_SKIP_STALE_ZERO, RS, {3, 3, 1, 1, SR, AUTO}, RT_DATA},
    {TIDE_FAULT_SHIFT_LATIN_SLOT, RS, {2, 2, 0, 1, IP, AUTO}, RT_DATA},
    {TIDE_FAULT_SHIFT_LATIN_SLOT, RS, {4, 2, 0, 1, SR, AUTO}, RT_DATA},
    {TIDE_FAULT_TRUNCATE_COPY, AG, {3, 2, 0, 1, IP, AUTO}, RT_DATA},
    {TIDE_FAULT_TRUNCATE_COPY, RS, {2, 4, 0, 1, IP, AUTO}, RT_DATA},
    {TIDE_FAULT_WRONG_PITCH, RS, {2, 2, 0, 1, IP, AUTO}, RT_DATA},
    {TIDE_FAULT_WRONG_PITCH, AG, {9, 1, 0, 1, IP, GEN}, RT_DATA},
    /* The rail lane (L = 1) */
    {TIDE_FAULT_DROP_CREDIT, AG, {3, 1, 0, 1, IP, AUTO}, RT_TIMEOUT},
    {TIDE_FAULT_DROP_CREDIT, RS, {2, 1, 0, 3, IP, AUTO}, RT_TIMEOUT},
    {TIDE_FAULT_MISSING_SIGNAL, AG, {4, 1, 0, 1, IP, AUTO}, RT_TIMEOUT},
    {TIDE_FAULT_TRUNCATE_COPY, AG, {5, 1, 0, 1, IP, AUTO}, RT_DATA},
    {TIDE_FAULT_TRUNCATE_COPY, RS, {3, 1, 0, 2, SR, AUTO}, RT_DATA},
};
#define NUM_RT (int)(sizeof(rt_cases) / sizeof(rt_cases[0]))

/* ------------------------------------------------------------------ the table */

static void test_print_table(void **state) {
    (void)state;
    printf("\nfault kind               sites caught  checker verdicts          INC off       "
           "      CPU fabric\n");
    int total_sites = 0, total_caught = 0;
    for (int k = 0; k < TIDE_FAULT_KIND_COUNT; ++k) {
        const tally_t *t = &tally[k];
        char by[64] = "", deep[64] = "", rt[64] = "";
        size_t u = 0, v = 0;
        for (int i = 1; i < TIDE_CHECK_KIND_COUNT; ++i) {
            if (t->by[i])
                u += (size_t)snprintf(by + u, sizeof(by) - u, "%s:%d ",
                                      tide_check_invariant_name(i), t->by[i]);
            if (t->deep_by[i])
                v += (size_t)snprintf(deep + v, sizeof(deep) - v, "%s:%d ",
                                      tide_check_invariant_name(i), t->deep_by[i]);
        }
        if (t->by[TIDE_CHECK_NONE]) snprintf(by + u, sizeof(by) - u, "masked:%d", t->by[0]);
        if (t->deep_by[TIDE_CHECK_NONE])
            snprintf(deep + v, sizeof(deep) - v, "masked:%d", t->deep_by[0]);
        snprintf(rt, sizeof(rt), "%s%s", t->runs_timeout ? "timeout" : "",
                 t->runs_data ? "wrong-data" : "");
        printf("%-24s %5d %6d  %-25s %-19s %s\n", tide_fault_name((tide_fault_kind_t)k), t->sites,
               t->caught, by, deep, rt);
        total_sites += t->sites;
        total_caught += t->caught;
        assert_true(t->caught > 0); /* every kind is caught somewhere */
    }
    printf("fault tests: %d (%d mutated programs checked, %d caught; %d fabric runs)\n\n",
           fault_tests, total_sites, total_caught, NUM_RT);
}

/* ------------------------------------------------------------------ the ring (I5) */

/* FSDP2's order on the two-slot ring passes I5; every ring fault, at every site, is caught. */
static void test_ring_faults(void **state) {
    (void)state;
    for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode)
        for (int blocks = 2; blocks <= 6; blocks += 4)
            for (int root = 0; root <= 1; ++root) {
                const int groups = blocks + root;
                int slots[8];
                for (int g = 0; g < blocks; ++g)
                    slots[g] = g % 2;
                if (root) slots[blocks] = TIDE_RING_OWN_SLOT;
                tide_ring_call_t *calls = NULL;
                int n = 0;
                assert_tide(TIDE_SUCCESS,
                            tide_ring_fsdp_calls(blocks, root, (tide_rs_mode_t)mode, 2, &calls, &n));
                tide_ring_seq_t seq = {groups, slots, NULL, n, calls};
                tide_ring_report_t rep;
                assert_tide(TIDE_SUCCESS, tide_ring_check(&seq, &rep));
                if (!rep.ok) print_error("clean sequence rejected: %s\n", rep.message);
                assert_true(rep.ok);
                for (int f = 0; f < TIDE_RING_FAULT_KIND_COUNT; ++f)
                    for (uint64_t seed = 0; seed < 12; ++seed) {
                        tide_ring_call_t mutated[128];
                        int mslots[8];
                        assert_true(n <= 128);
                        memcpy(mutated, calls, (size_t)n * sizeof(*calls));
                        memcpy(mslots, slots, sizeof(slots));
                        const tide_result_t inj = tide_ring_fault_inject(
                            (tide_ring_fault_t)f, seed, groups, mslots, n, mutated);
                        /* With two blocks each slot has one group: a dropped reshard or an
                         * early gather meets no other occupant (only same-slot applies). */
                        if (inj == TIDE_ERR_UNSUPPORTED && blocks == 2 &&
                            f != TIDE_RING_FAULT_SAME_SLOT)
                            continue;
                        assert_int_equal(inj, TIDE_SUCCESS);
                        tide_ring_seq_t bad = {groups, mslots, NULL, n, mutated};
                        assert_tide(TIDE_SUCCESS, tide_ring_check(&bad, &rep));
                        if (rep.ok)
                            print_error("%s seed %llu (mode %d, %d blocks, root %d) not caught\n",
                                        tide_ring_fault_name((tide_ring_fault_t)f),
                                        (unsigned long long)seed, mode, blocks, root);
                        assert_false(rep.ok);
                        assert_non_null(strstr(rep.message, "I5"));
                    }
                free(calls);
            }
}

int main(void) {
    /* The runtime faults mutate the emulation's copies and signals; the CPU fabric's direct
     * mode leaves some of those copies out (a truncated staging push would change nothing),
     * so the faults run on the full emulation.  Direct mode's own fail-stop is tested in
     * test_fabric_cpu_direct.c. */
    setenv("TIDE_CPU_DIRECT", "0", 1);
    struct CMUnitTest tests[NUM_STATIC + NUM_RT + 4];
    int n = 0;
    static char names[NUM_STATIC + NUM_RT][96];
    for (int i = 0; i < NUM_STATIC; ++i) {
        const pcfg_t *p0 = &static_cases[i].plans[0];
        snprintf(names[n], sizeof(names[n]), "static %s %s%s", tide_fault_name(static_cases[i].kind),
                 static_cases[i].coll == AG ? "AG" : "RS",
                 p0->l == 1 && p0->lane != GEN ? " rail lane" : "");
        tests[n] = (struct CMUnitTest){names[n], test_static, NULL, NULL, (void *)&static_cases[i]};
        ++n;
    }
    tests[n++] = (struct CMUnitTest){"no eligible site", test_no_site, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"rail lane: no eligible site", test_lane_no_site, NULL, NULL,
                                     NULL};
    for (int i = 0; i < NUM_RT; ++i) {
        const rt_case_t *rc = &rt_cases[i];
        snprintf(names[NUM_STATIC + i], sizeof(names[0]), "fabric %s %s M%d L%d",
                 tide_fault_name(rc->kind), rc->coll == AG ? "AG" : "RS", rc->plan.m, rc->plan.l);
        tests[n++] =
            (struct CMUnitTest){names[NUM_STATIC + i], test_runtime, NULL, NULL, (void *)rc};
    }
    tests[n++] = (struct CMUnitTest){"table", test_print_table, NULL, NULL, NULL};
    tests[n++] = (struct CMUnitTest){"ring I5", test_ring_faults, NULL, NULL, NULL};
    return _cmocka_run_group_tests("test_faults", tests, (size_t)n, NULL, NULL);
}
