/*
 * test_lane.c - the rail lane (L = 1, M >= 2; src/program/compile_lane.c, docs/protocol.md
 * "The rail lane").
 *
 *   - selection: AUTO picks the lane exactly at L = 1, M >= 2; RAIL elsewhere is refused;
 *   - memory: the lane's arena has no receive stage, staging, outbox or spare, an inbox of two
 *     gradient blocks, and is smaller than the generic plan's, figure for figure;
 *   - the static checker passes both programs at M = 1..16 (passes, dtypes, cast, modes);
 *   - the CPU fabric, M = 2, 3, 4, 5, 8: several all-gathers (both slots, resident and cast)
 *     land every shard; several reduce-scatters (both modes, alpha, accumulate, passes,
 *     inputs over a wide exponent range with NaN and Inf) equal, bit for bit, the definition
 *     of kernels.h restated here (contributors c = 1 .. M - 1 from rank r - c, then the own
 *     rows, each alpha * v rounded before the add) and the generic programs' output.
 */
#include "e2e_util.h"

#include "program/check.h"
#include "program/program.h"
#include "wide_values.h"

/* Padded rows (D_p not a multiple of N), a parameter with fewer rows than ranks, K_p = 1. */
static const tide_param_shape_t k_shapes[] = {{37, 6}, {5, 4}, {19, 1}};
#define NUM_PARAMS 3
#define CALLS 5

static tide_config_t config_of(int m, int passes, tide_rs_mode_t mode, tide_lane_t lane) {
    tide_config_t c = TIDE_CONFIG_INIT;
    c.nodes = m;
    c.gpus_per_node = 1;
    c.passes = passes;
    c.mode = mode;
    c.lane = lane;
    return c;
}

static tide_plan_t lane_plan(int m, int l, int passes, tide_dtype_t grad, tide_dtype_t shard,
                             tide_lane_t lane) {
    return test_plan_lane(m, l, 0, passes, TIDE_RS_IN_PLACE, grad, shard, k_shapes, NUM_PARAMS,
                          lane);
}

/* ------------------------------------------------------------------ selection */

static void test_selection(void **state) {
    (void)state;
    for (int m = 1; m <= 9; ++m)
        for (int l = 1; l <= 4; ++l) {
            tide_plan_t plan = lane_plan(m, l, 1, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_LANE_AUTO);
            const bool want = l == 1 && m >= 2;
            assert_int_equal(plan->rs.rail_lane, want);
            assert_int_equal(plan->config.lane, want ? TIDE_LANE_RAIL : TIDE_LANE_GENERIC);
            /* What callers read (tide_plan_get_lane) says the same. */
            tide_lane_t got = TIDE_LANE_AUTO;
            assert_tide(TIDE_SUCCESS, tide_plan_get_lane(plan, &got));
            assert_int_equal(got, want ? TIDE_LANE_RAIL : TIDE_LANE_GENERIC);
            tide_plan_destroy(plan);
            plan = lane_plan(m, l, 1, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_LANE_GENERIC);
            assert_false(plan->rs.rail_lane);
            assert_tide(TIDE_SUCCESS, tide_plan_get_lane(plan, &got));
            assert_int_equal(got, TIDE_LANE_GENERIC);
            tide_plan_destroy(plan);
            /* RAIL where it does not apply is an error naming the topology. */
            tide_group_desc_t g = {NUM_PARAMS, k_shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16,
                                   TIDE_DTYPE_BF16};
            tide_config_t c = TIDE_CONFIG_INIT;
            c.nodes = m;
            c.gpus_per_node = l;
            c.lane = TIDE_LANE_RAIL;
            tide_plan_t p = NULL;
            assert_tide(want ? TIDE_SUCCESS : TIDE_ERR_INVALID_ARGUMENT,
                        tide_plan_create(&c, &g, &p));
            if (want) tide_plan_destroy(p);
        }
    tide_group_desc_t g = {NUM_PARAMS, k_shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t c = config_of(4, 1, TIDE_RS_IN_PLACE, (tide_lane_t)3);
    tide_plan_t p = NULL;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_create(&c, &g, &p));
    tide_lane_t lane;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_lane(NULL, &lane));
    p = lane_plan(2, 1, 1, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_LANE_AUTO);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_lane(p, NULL));
    tide_plan_destroy(p);
}

/* ------------------------------------------------------------------ memory */

static void test_memory(void **state) {
    (void)state;
    const tide_dtype_t grads[] = {TIDE_DTYPE_BF16, TIDE_DTYPE_FP32};
    for (int m = 2; m <= 16; ++m)
        for (int gi = 0; gi < 2; ++gi)
            for (int cast = 0; cast < 2; ++cast)
                for (int passes = 1; passes <= 3; ++passes) {
                    const tide_dtype_t shard = cast ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
                    tide_plan_t lane = lane_plan(m, 1, passes, grads[gi], shard, TIDE_LANE_RAIL);
                    tide_plan_t gen = lane_plan(m, 1, passes, grads[gi], shard, TIDE_LANE_GENERIC);
                    const tide_region_info_t *lr = lane->arena.regions, *gr = gen->arena.regions;
                    /* What the lane drops. */
                    assert_int_equal(lr[TIDE_REGION_RECV_STAGE].bytes, 0);
                    assert_int_equal(lr[TIDE_REGION_STAGING].bytes, 0);
                    assert_int_equal(lr[TIDE_REGION_OUTBOX].bytes, 0);
                    assert_int_equal(lr[TIDE_REGION_SPARE].bytes, 0);
                    assert_true(gr[TIDE_REGION_RECV_STAGE].bytes > 0);
                    assert_true(gr[TIDE_REGION_OUTBOX].bytes > 0);
                    /* Two gradient-dtype blocks of the same E_sub instead of fp32 ones. */
                    assert_int_equal(lane->rs.subslice_elems, gen->rs.subslice_elems);
                    assert_int_equal(lr[TIDE_REGION_INBOX].bytes,
                                     2 * lane->rs.subslice_elems * lane->geom.grad_item);
                    assert_true(lr[TIDE_REGION_INBOX].bytes <= gr[TIDE_REGION_INBOX].bytes);
                    /* What it keeps, unchanged. */
                    for (int r = 0; r < TIDE_REGION_COUNT; ++r)
                        if (r == TIDE_REGION_LANDING0 || r == TIDE_REGION_LANDING1 ||
                            r == TIDE_REGION_RESIDENT || r == TIDE_REGION_SIGNALS)
                            assert_int_equal(lr[r].bytes, gr[r].bytes);
                    assert_true(lane->arena.total_bytes < gen->arena.total_bytes);
                    /* The summary callers see says the same. */
                    tide_plan_summary_t ls, gs;
                    assert_tide(TIDE_SUCCESS, tide_plan_get_summary(lane, &ls));
                    assert_tide(TIDE_SUCCESS, tide_plan_get_summary(gen, &gs));
                    assert_int_equal(ls.arena_bytes, lane->arena.total_bytes);
                    assert_true(ls.arena_bytes < gs.arena_bytes);
                    tide_plan_destroy(lane);
                    tide_plan_destroy(gen);
                }
    /* The closed form: at L = 1 the lane's RS area is two S blocks, the totals follow. */
    for (int m = 1; m <= 64; m *= 2) {
        tide_memory_bounds_t b;
        assert_tide(TIDE_SUCCESS, tide_memory_bounds(m, 1, 2, 2, &b));
        assert_int_equal(b.rail_lane, m >= 2);
        if (m < 2) continue;
        assert_true(b.rail_lane_staging_ns == 2.0 / m);
        assert_true(b.rail_lane_in_place_total_ns < b.in_place_total_ns);
        assert_true(b.rail_lane_slot_reuse_total_ns < b.slot_reuse_total_ns);
    }
    tide_memory_bounds_t b;
    assert_tide(TIDE_SUCCESS, tide_memory_bounds(8, 8, 4, 2, &b));
    assert_int_equal(b.rail_lane, 0);
}

/* ------------------------------------------------------------------ static checker */

static uint64_t total_ops(const tide_program_t *prog) {
    uint64_t n = 0;
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            n += (uint64_t)prog->ranks[r].queues[q].num_ops;
    return n;
}

static void expect_checked(const tide_program_t *prog, const char *what) {
    tide_check_report_t rep;
    assert_tide(TIDE_SUCCESS, tide_program_check(prog, 3, &rep));
    if (!rep.ok)
        print_error("%s: %s %s\n", what, tide_check_invariant_name(rep.violated), rep.message);
    assert_true(rep.ok);
    assert_int_equal(rep.i1_checked, 1);
    assert_int_equal(rep.ops_run, 3 * total_ops(prog));
}

static void test_checker(void **state) {
    (void)state;
    for (int m = 1; m <= 16; ++m)
        for (int variant = 0; variant < 4; ++variant) {
            /* bf16; fp32 gradients; a cast group; three passes (M = 2: wrap-around credits) */
            const tide_dtype_t grad = variant == 1 ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
            const tide_dtype_t shard = variant == 2 ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
            const int passes = variant == 3 ? 3 : 1 + m % 2;
            tide_plan_t plan = lane_plan(m, 1, passes, grad, shard, TIDE_LANE_AUTO);
            assert_int_equal(plan->rs.rail_lane, m >= 2);
            char what[64];
            snprintf(what, sizeof(what), "M %d variant %d", m, variant);
            tide_program_t ag;
            assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &ag));
            expect_checked(&ag, what);
            tide_program_free(&ag);
            for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
                tide_program_t rs;
                assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, (tide_rs_mode_t)mode, &rs));
                expect_checked(&rs, what);
                tide_program_free(&rs);
            }
            tide_plan_destroy(plan);
        }
}

/* ------------------------------------------------------------------ CPU fabric */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) { return wide_rng_next(&rng_state); }
static float wide_value(bool specials) { return wide_value_next(&rng_state, specials); }

typedef struct {
    int m, passes;
    tide_rs_mode_t mode;
    tide_dtype_t grad, shard;
    bool resident, specials;
} fab_case_t;

typedef struct {
    e2e_layout_t lay;
    uint64_t shard_elems, shard_in_bytes, landing_bytes;
    uint8_t *shards[CALLS][E2E_MAX_RANKS];
    uint8_t *expected[CALLS];
    void *grads[E2E_MAX_RANKS][NUM_PARAMS];
    void *const *grad_rows[E2E_MAX_RANKS];
    float *init[E2E_MAX_RANKS];
} fab_data_t;

static float grad_at(const fab_case_t *fc, const fab_data_t *d, int rank, int p, uint64_t e) {
    if (fc->grad == TIDE_DTYPE_BF16) return tide_bf16_to_float(((uint16_t *)d->grads[rank][p])[e]);
    return ((float *)d->grads[rank][p])[e];
}

static void fab_inputs(const fab_case_t *fc, fab_data_t *d) {
    const int n = fc->m;
    memset(d, 0, sizeof(*d));
    e2e_layout_init(&d->lay, k_shapes, NUM_PARAMS, n);
    d->shard_elems = d->lay.eoff[NUM_PARAMS];
    const uint64_t ag_item = 2, in_item = fc->shard == TIDE_DTYPE_FP32 ? 4 : 2;
    d->shard_in_bytes = d->shard_elems * in_item;
    d->landing_bytes = (uint64_t)n * d->shard_elems * ag_item;
    for (int c = 0; c < CALLS; ++c) {
        d->expected[c] = calloc(1, d->landing_bytes);
        assert_non_null(d->expected[c]);
        for (int r = 0; r < n; ++r) {
            d->shards[c][r] = malloc(d->shard_in_bytes);
            assert_non_null(d->shards[c][r]);
            for (int p = 0; p < NUM_PARAMS; ++p) {
                const uint64_t sp = d->lay.eoff[p + 1] - d->lay.eoff[p];
                for (uint64_t i = 0; i < sp; ++i) {
                    const uint64_t e = d->lay.eoff[p] + i;
                    uint16_t bits;
                    if (fc->shard == TIDE_DTYPE_FP32) {
                        const float v = wide_value(false);
                        ((float *)d->shards[c][r])[e] = v;
                        bits = tide_float_to_bf16(v); /* the cast's definition (kernels.h) */
                    } else {
                        bits = (uint16_t)rng();
                        ((uint16_t *)d->shards[c][r])[e] = bits;
                    }
                    /* Landing(p, r) = o_p N + r s_p, in bf16 elements. */
                    const uint64_t at = d->lay.eoff[p] * (uint64_t)n + (uint64_t)r * sp + i;
                    memcpy(d->expected[c] + at * 2, &bits, 2);
                }
            }
        }
    }
    const uint64_t g_item = fc->grad == TIDE_DTYPE_BF16 ? 2 : 4;
    for (int r = 0; r < n; ++r) {
        for (int p = 0; p < NUM_PARAMS; ++p) {
            const uint64_t elems = k_shapes[p].dim0 * k_shapes[p].inner;
            d->grads[r][p] = malloc(elems * g_item);
            assert_non_null(d->grads[r][p]);
            for (uint64_t e = 0; e < elems; ++e) {
                const float v = wide_value(fc->specials);
                if (g_item == 2)
                    ((uint16_t *)d->grads[r][p])[e] = tide_float_to_bf16(v);
                else
                    ((float *)d->grads[r][p])[e] = v;
            }
        }
        d->grad_rows[r] = d->grads[r];
        d->init[r] = malloc(d->shard_elems * sizeof(float));
        assert_non_null(d->init[r]);
        for (uint64_t i = 0; i < d->shard_elems; ++i)
            d->init[r][i] = wide_value(false);
    }
}

static void fab_free(const fab_case_t *fc, fab_data_t *d) {
    for (int c = 0; c < CALLS; ++c) {
        free(d->expected[c]);
        for (int r = 0; r < fc->m; ++r)
            free(d->shards[c][r]);
    }
    for (int r = 0; r < fc->m; ++r) {
        free(d->init[r]);
        for (int p = 0; p < NUM_PARAMS; ++p)
            free(d->grads[r][p]);
    }
}

/* The RS calls of a case: alpha, accumulate and the previous output vary per call. */
static const float k_alpha[CALLS] = {1.0f, 0.125f, -3.0f, 1.0f / 3.0f, 0.5f};
static const int k_accumulate[CALLS] = {0, 1, 0, 1, 1};

/*
 * kernels.h at L = 1: the landings of c = 1 .. M - 1 (rank r - c's rows, widened exactly),
 * then the own rows; each alpha * v rounded, then the add rounded; the first one initialises
 * (onto the old output when accumulating).  Padding rows +0; NaN canonical.
 */
static uint32_t reference_bits(const fab_case_t *fc, const fab_data_t *d, int call, int r,
                               uint64_t i) {
    if (e2e_is_padding(&d->lay, r, i)) return 0;
    int p = 0;
    while (d->lay.eoff[p + 1] <= i)
        ++p;
    const uint64_t e = (uint64_t)r * (d->lay.eoff[p + 1] - d->lay.eoff[p]) + (i - d->lay.eoff[p]);
    const float alpha = k_alpha[call];
    float out = k_accumulate[call] ? d->init[r][i] : 0.0f;
    for (int c = 1; c <= fc->m; ++c) {
        const int src = ((r - c) % fc->m + fc->m) % fc->m; /* c = M: r itself */
        volatile float scaled = alpha * grad_at(fc, d, src, p, e);
        out = (c == 1 && !k_accumulate[call]) ? scaled : out + scaled;
    }
    return isnan(out) ? 0x7fffffffu : e2e_f32_bits(out);
}

static void fab_job(const fab_case_t *fc, fab_data_t *d, tide_lane_t lane, e2e_job_t *j) {
    memset(j, 0, sizeof(*j));
    j->cfg = config_of(fc->m, fc->passes, fc->mode, lane);
    j->desc = (tide_group_desc_t){NUM_PARAMS, k_shapes, TIDE_DTYPE_BF16, fc->grad, fc->shard};
    j->shard_in_bytes = d->shard_in_bytes;
    j->landing_bytes = d->landing_bytes;
    j->out_elems = d->shard_elems;
    j->num_ag = CALLS;
    for (int c = 0; c < CALLS; ++c) {
        j->ag_shards[c] = d->shards[c];
        j->ag_expected[c] = d->expected[c];
    }
    j->resident = fc->resident;
    j->num_rs = CALLS;
    for (int c = 0; c < CALLS; ++c)
        j->rs[c] = (e2e_rs_call_t){k_alpha[c], k_accumulate[c], fc->mode, d->init};
    j->grads = (void *const *const *)d->grad_rows;
    tide_comm_t comms[E2E_MAX_RANKS];
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, fc->m, 1, comms));
    j->comms = comms;
    e2e_job_run(j, fc->m);
    for (int r = 0; r < fc->m; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(comms[r]));
    j->comms = NULL;
}

static void run_fab_case(const fab_case_t *fc) {
    fab_data_t d;
    fab_inputs(fc, &d);
    e2e_job_t lane, gen;
    fab_job(fc, &d, TIDE_LANE_RAIL, &lane); /* the all-gathers are compared inside */
    fab_job(fc, &d, TIDE_LANE_GENERIC, &gen);
    uint64_t wrong_ref = 0, wrong_gen = 0, nan = 0;
    for (int c = 0; c < CALLS; ++c)
        for (int r = 0; r < fc->m; ++r)
            for (uint64_t i = 0; i < d.shard_elems; ++i) {
                const uint32_t got = e2e_f32_bits(lane.outs[c][r][i]);
                const uint32_t want = reference_bits(fc, &d, c, r, i);
                nan += want == 0x7fffffffu;
                if (got != want && wrong_ref++ == 0)
                    print_error("M %d passes %d mode %d call %d rank %d element %llu: "
                                "0x%08x, reference 0x%08x\n",
                                fc->m, fc->passes, (int)fc->mode, c, r, (unsigned long long)i, got,
                                want);
                wrong_gen += got != e2e_f32_bits(gen.outs[c][r][i]);
            }
    if (fc->specials) assert_true(nan > 0); /* the data reached the NaN classes */
    assert_int_equal(wrong_ref, 0);
    assert_int_equal(wrong_gen, 0);
    e2e_job_free(&lane);
    e2e_job_free(&gen);
    fab_free(fc, &d);
}

static void test_fabric(void **state) {
    (void)state;
    const int ms[] = {2, 3, 4, 5, 8};
    for (size_t k = 0; k < sizeof(ms) / sizeof(ms[0]); ++k)
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
            const int m = ms[k];
            /* bf16 throughout (resident shards), then fp32 gradients with a cast group. */
            const fab_case_t a = {m,
                                  1 + (m + mode) % 3,
                                  (tide_rs_mode_t)mode,
                                  TIDE_DTYPE_BF16,
                                  TIDE_DTYPE_BF16,
                                  mode == 0,
                                  true};
            const fab_case_t b = {
                m, 1 + mode, (tide_rs_mode_t)mode, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32, false, false};
            run_fab_case(&a);
            run_fab_case(&b);
        }
}

/* The CPU fabric serves the lane; registering the rail lane on a topology without it fails. */
static void test_register(void **state) {
    (void)state;
    tide_comm_t comms[2];
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 2, comms));
    tide_group_desc_t g = {NUM_PARAMS, k_shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t c = TIDE_CONFIG_INIT;
    c.nodes = c.gpus_per_node = 0;
    c.lane = TIDE_LANE_RAIL;
    tide_group_t grp;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_register(comms[0], &c, &g, &grp));
    for (int r = 0; r < 2; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(comms[r]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_selection), cmocka_unit_test(test_memory),
        cmocka_unit_test(test_checker),   cmocka_unit_test(test_fabric),
        cmocka_unit_test(test_register),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
