/*
 * test_rails_data.c - the rail lane's bytes through rails (program/rails.h).  The cpu fabric
 * has no rail transport, so this test carries one: rails_sim.h runs the lane's programs of
 * all ranks on the abstract machine with rail semantics, and the hooks here execute every op
 * on host arenas with the cpu fabric's arithmetic (fabric/bind.c, fabric/cpu/arith.c) and
 * move each receive's bytes when its step completes.  The eager driver moves every rail step
 * as soon as its credits allow and runs one rank's landings as late as possible (each rank in
 * turn), so its receives overwrite their inbox generation or landing at the earliest moment
 * the schedule permits.
 *
 * At M = 2, 3, 4, 8 (passes 1..3, both modes, bf16 and fp32 gradients with a cast group,
 * a parameter of one row so that some RS blocks are only padding: empty puts), CALLS calls
 * of each collective: every rank's landing and output, read at its call-done event, must
 * equal bit for bit the cpu fabric's lane and generic programs (and the AG the shards
 * themselves), over inputs of wide exponents with NaN and Inf.  A rail schedule with the
 * credits of one rank dropped must corrupt the RS output: the check can fail.
 */
#include "e2e_util.h"
#include "rails_sim.h"

#include "fabric/cpu/cpu.h"
#include "fabric/fabric.h"
#include "wide_values.h"

#define CALLS 4
#define NUM_PARAMS 4
#define MAX_M 8

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rng(void) { return wide_rng_next(&rng_state); }
static float wide_value(bool specials) { return wide_value_next(&rng_state, specials); }

static const float k_alpha[CALLS] = {1.0f, 0.125f, -3.0f, 1.0f / 3.0f};
static const int k_accumulate[CALLS] = {0, 1, 0, 1};

typedef struct {
    int m, passes;
    tide_rs_mode_t mode;
    bool fp32; /* fp32 gradients and a casting AG (fp32 master shards) */
    tide_param_shape_t shapes[NUM_PARAMS];
    tide_config_t cfg;
    tide_group_desc_t desc;
    tide_plan_t plan;
    uint64_t shard_in, landing_bytes, out_elems;
    uint8_t *shards[CALLS][MAX_M];
    uint8_t *expected[CALLS]; /* the landing every rank must hold */
    void *grads[MAX_M][NUM_PARAMS];
    void *const *grad_rows[MAX_M];
    float *init[MAX_M];
} case_t;

static void case_init(case_t *c, int m, int passes, tide_rs_mode_t mode, bool fp32) {
    memset(c, 0, sizeof(*c));
    c->m = m;
    c->passes = passes;
    c->mode = mode;
    c->fp32 = fp32;
    const tide_param_shape_t shapes[NUM_PARAMS] = {
        {2 * (uint64_t)m - 1, 3}, {1, 8}, {(uint64_t)m + 1, 1}, {3 * (uint64_t)m + 2, 2}};
    memcpy(c->shapes, shapes, sizeof(shapes));
    const tide_dtype_t g = fp32 ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
    c->desc = (tide_group_desc_t){NUM_PARAMS, c->shapes, TIDE_DTYPE_BF16, g, g};
    c->cfg = (tide_config_t)TIDE_CONFIG_INIT;
    c->cfg.nodes = m;
    c->cfg.gpus_per_node = 1;
    c->cfg.passes = passes;
    c->cfg.mode = mode;
    c->cfg.lane = TIDE_LANE_RAIL;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&c->cfg, &c->desc, &c->plan));
    assert_true(c->plan->rs.rail_lane);
    e2e_layout_t lay;
    e2e_layout_init(&lay, c->shapes, NUM_PARAMS, m);
    const uint64_t elems = lay.eoff[NUM_PARAMS];
    c->out_elems = elems;
    c->shard_in = elems * (fp32 ? 4 : 2);
    c->landing_bytes = (uint64_t)m * elems * 2;
    assert_int_equal(c->landing_bytes, c->plan->geom.group_bytes);
    for (int e = 0; e < CALLS; ++e) {
        c->expected[e] = calloc(1, c->landing_bytes);
        assert_non_null(c->expected[e]);
        for (int r = 0; r < m; ++r) {
            c->shards[e][r] = malloc(c->shard_in);
            assert_non_null(c->shards[e][r]);
            for (int p = 0; p < NUM_PARAMS; ++p) {
                const uint64_t sp = lay.eoff[p + 1] - lay.eoff[p];
                for (uint64_t i = 0; i < sp; ++i) {
                    const uint64_t at = lay.eoff[p] + i;
                    uint16_t bits;
                    if (fp32) {
                        const float v = wide_value(false);
                        ((float *)c->shards[e][r])[at] = v;
                        bits = tide_float_to_bf16(v);
                    } else {
                        bits = (uint16_t)rng();
                        ((uint16_t *)c->shards[e][r])[at] = bits;
                    }
                    /* Landing(p, r) = o_p N + r s_p, in bf16 elements. */
                    memcpy(c->expected[e] + (lay.eoff[p] * (uint64_t)m + (uint64_t)r * sp + i) * 2,
                           &bits, 2);
                }
            }
        }
    }
    for (int r = 0; r < m; ++r) {
        for (int p = 0; p < NUM_PARAMS; ++p) {
            const uint64_t n = c->shapes[p].dim0 * c->shapes[p].inner;
            c->grads[r][p] = malloc(n * (fp32 ? 4 : 2));
            assert_non_null(c->grads[r][p]);
            for (uint64_t i = 0; i < n; ++i) {
                const float v = wide_value(true);
                if (fp32)
                    ((float *)c->grads[r][p])[i] = v;
                else
                    ((uint16_t *)c->grads[r][p])[i] = tide_float_to_bf16(v);
            }
        }
        c->grad_rows[r] = c->grads[r];
        c->init[r] = malloc(elems * sizeof(float));
        assert_non_null(c->init[r]);
        for (uint64_t i = 0; i < elems; ++i)
            c->init[r][i] = wide_value(false);
    }
}

static void case_free(case_t *c) {
    for (int e = 0; e < CALLS; ++e) {
        free(c->expected[e]);
        for (int r = 0; r < c->m; ++r)
            free(c->shards[e][r]);
    }
    for (int r = 0; r < c->m; ++r) {
        free(c->init[r]);
        for (int p = 0; p < NUM_PARAMS; ++p)
            free(c->grads[r][p]);
    }
    tide_plan_destroy(c->plan);
}

/* ------------------------------------------------------------------ the cpu fabric */

static void cpu_job(case_t *c, tide_lane_t lane, e2e_job_t *j) {
    memset(j, 0, sizeof(*j));
    j->cfg = c->cfg;
    j->cfg.lane = lane;
    j->desc = c->desc;
    j->shard_in_bytes = c->shard_in;
    j->landing_bytes = c->landing_bytes;
    j->out_elems = c->out_elems;
    j->num_ag = CALLS;
    for (int e = 0; e < CALLS; ++e) {
        j->ag_shards[e] = c->shards[e];
        j->ag_expected[e] = c->expected[e];
    }
    j->num_rs = CALLS;
    for (int e = 0; e < CALLS; ++e)
        j->rs[e] = (e2e_rs_call_t){k_alpha[e], k_accumulate[e], c->mode, c->init};
    j->grads = (void *const *const *)c->grad_rows;
    tide_comm_t comms[MAX_M];
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, c->m, 1, comms));
    j->comms = comms;
    e2e_job_run(j, c->m);
    for (int r = 0; r < c->m; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(comms[r]));
    j->comms = NULL;
}

/* ------------------------------------------------------------------ the rails run */

typedef struct {
    const case_t *c;
    const tide_program_t *prog;
    struct tide_fabric_world world;
    struct tide_fabric_arena arena;
    uint8_t *bases[MAX_M];
    tide_binding_t bind[CALLS][MAX_M];
    float *out[CALLS][MAX_M];
    uint8_t *seen[CALLS][MAX_M]; /* landing or output at the call-done event */
    int failures;
    char why[256];
} run_t;

static void fail_once(run_t *x, const char *what, int rank, int e) {
    if (x->failures++ == 0)
        snprintf(x->why, sizeof(x->why), "%s on rank %d call %d: %s", what, rank, e,
                 tide_get_last_error());
}

static void on_op(void *ctx, int rank, int q, int i, int e) {
    run_t *x = ctx;
    const tide_binding_t *b = &x->bind[e][rank];
    const tide_op_t *op = &x->prog->ranks[rank].queues[q].ops[i];
    tide_bound_op_t bo;
    if (tide_bind_op(b, x->prog, (tide_queue_t)q, i, &bo) != TIDE_SUCCESS) {
        fail_once(x, "bind", rank, e);
        return;
    }
    switch (op->kind) {
    case TIDE_OP_SUM:
    case TIDE_OP_COPY2D: /* the lane has neither */
        fail_once(x, "op kind outside the lane", rank, e);
        return;
    case TIDE_OP_EVENT:
        if (op->event == TIDE_EVENT_CALL_DONE) {
            const bool ag = x->prog->coll == TIDE_COLL_ALL_GATHER;
            void *src = x->out[e][rank];
            if (ag && tide_bind_region(&x->arena, x->prog->plan, rank,
                                       (tide_region_t)(TIDE_REGION_LANDING0 + e % 2),
                                       &src) != TIDE_SUCCESS) {
                fail_once(x, "landing", rank, e);
                return;
            }
            memcpy(x->seen[e][rank], src,
                   ag ? x->c->landing_bytes : x->c->out_elems * sizeof(float));
        }
        return;
    default: /* the cpu fabric's data path; the rail schedule here does the waits and signals */
        if (tide_cpu_op_data(NULL, b, x->prog, (tide_queue_t)q, i, &bo) != TIDE_SUCCESS)
            fail_once(x, "op data", rank, e);
    }
}

/* A receive's bytes: the sender's source of that call into the receiver's memory. */
static void on_recv(void *ctx, const tide_rail_xfer_t *xf, int e) {
    run_t *x = ctx;
    if (xf->bytes == 0) return; /* an empty put */
    tide_bound_op_t bo;
    if (tide_bind_op(&x->bind[e][xf->src_rank], x->prog, (tide_queue_t)xf->queue, xf->op, &bo) !=
        TIDE_SUCCESS) {
        fail_once(x, "bind put", xf->src_rank, e);
        return;
    }
    memcpy(bo.dst, bo.src, xf->bytes);
}

/* Run CALLS calls of `prog` through `rails`; x->seen holds what each rank saw at call-done.
 * False (with x->why) when an op failed or the run did not finish. */
static bool rails_run(const case_t *c, const tide_program_t *prog, const tide_rails_t *rails,
                      int lazy, run_t *x) {
    memset(x, 0, sizeof(*x));
    x->c = c;
    x->prog = prog;
    x->world = (struct tide_fabric_world){NULL, 0, c->m, 1, c->m};
    const uint64_t bytes = c->plan->arena.total_bytes;
    for (int r = 0; r < c->m; ++r) {
        x->bases[r] = calloc(1, bytes);
        assert_non_null(x->bases[r]);
    }
    x->arena = (struct tide_fabric_arena){&x->world, bytes, x->bases};
    const bool ag = prog->coll == TIDE_COLL_ALL_GATHER;
    for (int e = 0; e < CALLS; ++e)
        for (int r = 0; r < c->m; ++r) {
            x->out[e][r] = malloc(c->out_elems * sizeof(float));
            x->seen[e][r] = calloc(1, ag ? c->landing_bytes : c->out_elems * sizeof(float));
            assert_true(x->out[e][r] != NULL && x->seen[e][r] != NULL);
            if (k_accumulate[e])
                memcpy(x->out[e][r], c->init[r], c->out_elems * sizeof(float));
            else
                for (uint64_t i = 0; i < c->out_elems; ++i)
                    x->out[e][r][i] = E2E_STALE;
            x->bind[e][r] = (tide_binding_t){.plan = c->plan,
                                             .arena = &x->arena,
                                             .rank = r,
                                             .slot = e % 2,
                                             .epoch = (uint64_t)e,
                                             .shard = c->shards[e][r],
                                             .grads = (const void *const *)c->grads[r],
                                             .out = x->out[e][r],
                                             .alpha = k_alpha[e],
                                             .accumulate = k_accumulate[e] != 0};
        }
    rails_sim_t s;
    const rails_sim_hooks_t hooks = {x, on_op, on_recv};
    rails_sim_init(&s, prog, rails, CALLS, &hooks);
    const bool done = rails_sim_eager(&s, lazy);
    rails_sim_free(&s);
    if (!done && x->failures == 0) snprintf(x->why, sizeof(x->why), "the calls did not finish");
    return done && x->failures == 0;
}

static void run_free(const case_t *c, run_t *x) {
    for (int r = 0; r < c->m; ++r) {
        free(x->bases[r]);
        for (int e = 0; e < CALLS; ++e) {
            free(x->out[e][r]);
            free(x->seen[e][r]);
        }
    }
}

/* Bytes of rank r's call e that differ from `want` (the first one reported). */
static uint64_t count_diff(const char *what, const uint8_t *got, const uint8_t *want,
                           uint64_t bytes, int r, int e, bool report) {
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < bytes; ++i)
        if (got[i] != want[i] && wrong++ == 0 && report)
            print_error("%s: rank %d call %d differs first at byte %llu of %llu\n", what, r, e,
                        (unsigned long long)i, (unsigned long long)bytes);
    return wrong;
}

static void run_case(int m, int passes, tide_rs_mode_t mode, bool fp32) {
    case_t c;
    case_init(&c, m, passes, mode, fp32);
    e2e_job_t lane, gen;
    cpu_job(&c, TIDE_LANE_RAIL, &lane); /* its landings are compared with c.expected inside */
    cpu_job(&c, TIDE_LANE_GENERIC, &gen);
    char what[96];
    for (int coll = 0; coll < 2; ++coll) {
        tide_program_t prog;
        if (coll == 0)
            assert_tide(TIDE_SUCCESS, tide_program_compile_ag(c.plan, &prog));
        else
            assert_tide(TIDE_SUCCESS, tide_program_compile_rs(c.plan, mode, &prog));
        tide_rails_t rails;
        assert_tide(TIDE_SUCCESS, tide_rails_build(&prog, &rails));
        run_t x;
        snprintf(what, sizeof(what), "%s M=%d passes=%d mode=%d %s", coll ? "RS" : "AG", m, passes,
                 (int)mode, fp32 ? "fp32/cast" : "bf16");
        uint64_t wrong = 0;
        /* Each rank in turn the one whose landings and call-done come last. */
        for (int lazy = 0; lazy < m; ++lazy) {
            if (!rails_run(&c, &prog, &rails, lazy, &x)) fail_msg("%s: %s", what, x.why);
            for (int e = 0; e < CALLS; ++e)
                for (int r = 0; r < m; ++r)
                    if (coll == 0) {
                        wrong += count_diff(what, x.seen[e][r], c.expected[e], c.landing_bytes, r,
                                            e, wrong == 0);
                    } else {
                        const uint64_t b = c.out_elems * sizeof(float);
                        wrong += count_diff(what, x.seen[e][r], (const uint8_t *)lane.outs[e][r], b,
                                            r, e, wrong == 0);
                        wrong += count_diff(what, x.seen[e][r], (const uint8_t *)gen.outs[e][r], b,
                                            r, e, wrong == 0);
                    }
            run_free(&c, &x);
        }
        assert_int_equal(wrong, 0);
        /* The credits matter: without rank 0's, a receive overwrites an inbox generation
         * before its block landed (M >= 3 and two passes: generations are reused within a
         * call), and the outputs differ. */
        if (coll == 1 && m >= 3 && passes >= 2) {
            for (int s = 0; s < rails.num_steps; ++s)
                rails.ranks[0].steps[s].num_credits = 0;
            if (!rails_run(&c, &prog, &rails, 0, &x))
                fail_msg("%s without credits: %s", what, x.why);
            uint64_t broken = 0;
            for (int e = 0; e < CALLS; ++e)
                broken += count_diff(what, x.seen[e][0], (const uint8_t *)lane.outs[e][0],
                                     c.out_elems * sizeof(float), 0, e, false);
            assert_true(broken > 0);
            run_free(&c, &x);
        }
        tide_rails_free(&rails);
        tide_program_free(&prog);
    }
    e2e_job_free(&lane);
    e2e_job_free(&gen);
    case_free(&c);
}

static void test_lane_through_rails(void **state) {
    (void)state;
    static const int ms[] = {2, 3, 4, 8};
    for (size_t k = 0; k < sizeof(ms) / sizeof(ms[0]); ++k)
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
            run_case(ms[k], 1 + mode, (tide_rs_mode_t)mode, false);
            run_case(ms[k], 2 + mode, (tide_rs_mode_t)mode, true);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lane_through_rails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
