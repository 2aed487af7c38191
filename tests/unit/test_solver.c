/* test_solver.c - the sizing solver (App. G, eqs. 13-14) against its definition. */
#include "test_util.h"

#include "plan/plan.h"

#include <math.h>

/* The paper's calibration (App. G): 8 nodes, 47.5 GB/s rails, 99 GB/s per sum CTA, 21 GB/s
 * per landing CTA under a 90 GB/s ceiling, 1.3 ms per round, 32 MiB fp32 shards. */
static tide_solver_input_t calibration(void) {
    tide_solver_input_t in;
    memset(&in, 0, sizeof(in));
    in.nodes = 8;
    in.gpus_per_node = 8;
    in.grad_dtype = TIDE_DTYPE_BF16;
    in.bw_nic_gbps = 47.5;
    in.bw_sum_gbps = 99.0;
    in.bw_land_gbps = 21.0;
    in.bw_cap_gbps = 90.0;
    in.t_round_ms = 1.3;
    in.fp32_shard_bytes = 32ull << 20;
    return in;
}

/* Network rounds of one pass by enumeration: contributors 1..M in waves of W_wave, the own
 * node (c = M) never on the wire, at most k remote contributors per round, rounds never
 * spanning waves. */
static int enumerate_rounds(int m, int w, int k) {
    int rounds = 0;
    for (int first = 1; first <= m; first += w) {
        int in_round = 0;
        for (int c = first; c < first + w && c <= m; ++c) {
            if (c == m) continue;
            if (in_round == 0) ++rounds;
            if (++in_round == k) in_round = 0;
        }
    }
    return rounds;
}

/* The solver's definition, spelled out with exact integer comparisons where possible. */
static tide_solver_output_t reference(const tide_solver_input_t *in) {
    tide_solver_output_t out;
    int w = in->wave_width ? in->wave_width : in->gpus_per_node;
    int passes = in->passes ? in->passes : 1;
    double b = in->grad_dtype == TIDE_DTYPE_FP32 ? 4.0 : 2.0;
    double t_nic = (in->nodes - 1) * (double)in->fp32_shard_bytes / (in->bw_nic_gbps * 1e9);
    out.t_nic_ms = t_nic * 1e3;
    /* C_sum: the smallest count whose rate covers gamma (L b / 4 + 1) BW_NIC. */
    double need = 1.5 * (in->gpus_per_node * b / 4.0 + 1.0) * in->bw_nic_gbps;
    out.sum_ctas = 1;
    while (out.sum_ctas * in->bw_sum_gbps < need * (1 - 1e-12))
        ++out.sum_ctas;
    /* C_mc: the largest count within the ceiling (at least 1), capped by the fewest CTAs that
     * land one pass within 5% of t_NIC. */
    int cap = 1;
    while ((cap + 1) * in->bw_land_gbps <= in->bw_cap_gbps * (1 + 1e-12))
        ++cap;
    int tail = 1;
    if (t_nic > 0)
        while (tail * 0.05 * t_nic * in->bw_land_gbps * 1e9 <
               (double)in->fp32_shard_bytes / passes * (1 - 1e-12))
            ++tail;
    out.landing_ctas = t_nic > 0 && tail < cap ? tail : cap;
    if (in->nodes == 1) {
        out.round_width = 1;
        out.rounds = 0;
        return out;
    }
    int k = in->nodes - 1 < 2 ? in->nodes - 1 : 2;
    int rounds = enumerate_rounds(in->nodes, w, k);
    while (k < 4 && rounds * in->t_round_ms > 0.10 * out.t_nic_ms &&
           enumerate_rounds(in->nodes, w, 2 * k) < rounds) {
        k *= 2;
        rounds = enumerate_rounds(in->nodes, w, k);
    }
    out.round_width = k;
    out.rounds = rounds;
    return out;
}

static void assert_matches_reference(const tide_solver_input_t *in) {
    tide_solver_output_t got, want = reference(in);
    assert_tide(TIDE_SUCCESS, tide_solve(in, &got));
    if (got.sum_ctas != want.sum_ctas || got.landing_ctas != want.landing_ctas ||
        got.round_width != want.round_width || got.rounds != want.rounds)
        print_error("M %d L %d W %d n %d b %d nic %g sum %g land %g cap %g t %g S %llu\n",
                    in->nodes, in->gpus_per_node, in->wave_width, in->passes, (int)in->grad_dtype,
                    in->bw_nic_gbps, in->bw_sum_gbps, in->bw_land_gbps, in->bw_cap_gbps,
                    in->t_round_ms, (unsigned long long)in->fp32_shard_bytes);
    assert_int_equal(got.sum_ctas, want.sum_ctas);
    assert_int_equal(got.landing_ctas, want.landing_ctas);
    assert_int_equal(got.round_width, want.round_width);
    assert_int_equal(got.rounds, want.rounds);
    assert_true(fabs(got.t_nic_ms - want.t_nic_ms) <= 1e-9 * fmax(1.0, want.t_nic_ms));
}

static void test_paper_calibration(void **state) {
    (void)state;
    tide_solver_input_t in = calibration();
    tide_solver_output_t out;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    /* §6.3: "the solver selects k = 4 and four sum CTAs". */
    assert_int_equal(out.round_width, 4);
    assert_int_equal(out.sum_ctas, 4);
    /* floor(90 / 21) = 4 under the ceiling; the 5% tail alone would allow 7. */
    assert_int_equal(out.landing_ctas, 4);
    /* 7 remote contributors in one wave of 8, four per round. */
    assert_int_equal(out.rounds, 2);
    assert_true(fabs(out.t_nic_ms - 7.0 * 33554432.0 / 47.5e9 * 1e3) < 1e-9);
    assert_matches_reference(&in);
}

/* Eq. (13) at L = 8, bf16: Level 1 processes 5x the NIC rate, times gamma = 1.5. */
static void test_sum_ctas_eq13(void **state) {
    (void)state;
    tide_solver_input_t in = calibration();
    tide_solver_output_t out;
    in.bw_nic_gbps = 10.0;
    in.bw_sum_gbps = 75.0; /* exactly 1.5 * 5 * 10: one CTA, no spurious round-up */
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.sum_ctas, 1);
    in.bw_sum_gbps = 74.9;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.sum_ctas, 2);
    in.bw_sum_gbps = 7.5; /* exactly 10 CTAs */
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.sum_ctas, 10);
    /* fp32 gradients double the read load: (8 * 4 / 4 + 1) = 9x. */
    in.grad_dtype = TIDE_DTYPE_FP32;
    in.bw_sum_gbps = 135.0;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.sum_ctas, 1);
}

/* Eq. (14): the ceiling term is floored; the tail term shrinks with passes. */
static void test_landing_ctas_eq14(void **state) {
    (void)state;
    tide_solver_input_t in = calibration();
    tide_solver_output_t out;
    in.bw_cap_gbps = 84.0; /* exactly 4 CTAs of 21 */
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.landing_ctas, 4);
    in.bw_cap_gbps = 10.0; /* below one CTA's rate: still one CTA */
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.landing_ctas, 1);
    /* A high ceiling leaves the tail term: ceil(S / (0.05 t_NIC BW_land)) = 7 at one pass. */
    in.bw_cap_gbps = 1000.0;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.landing_ctas, 7);
    in.passes = 4; /* a quarter of the bytes per pass */
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.landing_ctas, 2);
}

static void test_single_node(void **state) {
    (void)state;
    tide_solver_input_t in = calibration();
    tide_solver_output_t out;
    in.nodes = 1;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.round_width, 1);
    assert_int_equal(out.rounds, 0);
    assert_true(out.t_nic_ms == 0.0);
    assert_int_equal(out.landing_ctas, 4); /* the ceiling term alone */
    assert_int_equal(out.sum_ctas, 4);     /* Level 1 still sums the node's L sources */
    in.bw_cap_gbps = 1000.0;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.landing_ctas, 47);
}

static void test_round_width_rules(void **state) {
    (void)state;
    tide_solver_input_t in = calibration();
    tide_solver_output_t out;
    /* M = 2: one remote contributor, k starts and stays at 1. */
    in.nodes = 2;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.round_width, 1);
    assert_int_equal(out.rounds, 1);
    /* M = 3: k starts at 2; two remotes fit one round, so doubling buys nothing. */
    in.nodes = 3;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.round_width, 2);
    assert_int_equal(out.rounds, 1);
    /* No per-round cost: never widened. */
    in.nodes = 64;
    in.t_round_ms = 0.0;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.round_width, 2);
    /* W_wave = 1: one contributor per wave, widening never removes a round. */
    in.t_round_ms = 100.0;
    in.wave_width = 1;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.round_width, 2);
    assert_int_equal(out.rounds, 63);
    /* W_wave = 2: rounds hold at most 2, so k = 2 already saturates. */
    in.wave_width = 2;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.round_width, 2);
    assert_int_equal(out.rounds, 32);
    /* Huge shards make rounds cheap relative to the wire: k stays 2. */
    in = calibration();
    in.fp32_shard_bytes = 1ull << 40;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_int_equal(out.round_width, 2);
}

/* The whole model against its definition on a grid of inputs. */
static void test_against_reference_grid(void **state) {
    (void)state;
    static const int nodes[] = {1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 100, 1024, 65536};
    static const double nic[] = {12.5, 47.5, 400.0};
    static const double sum[] = {20.0, 99.0, 300.0};
    static const double t_round[] = {0.0, 0.05, 1.3, 20.0};
    static const uint64_t bytes[] = {4096, 32ull << 20, 1ull << 34};
    for (size_t a = 0; a < sizeof(nodes) / sizeof(*nodes); ++a)
        for (int l = 1; l <= 8; l += 3)
            for (int w = 0; w <= l; w += (l > 2 ? 3 : 1))
                for (size_t b = 0; b < 3; ++b)
                    for (size_t c = 0; c < 3; ++c)
                        for (size_t d = 0; d < 4; ++d)
                            for (size_t e = 0; e < 3; ++e) {
                                tide_solver_input_t in = calibration();
                                in.nodes = nodes[a];
                                in.gpus_per_node = l;
                                in.wave_width = w;
                                in.passes = (int)(e + b) % 5;
                                in.grad_dtype = (c & 1) ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
                                in.bw_nic_gbps = nic[b];
                                in.bw_sum_gbps = sum[c];
                                in.bw_land_gbps = 5.0 + 8.0 * (double)d;
                                in.bw_cap_gbps = 90.0;
                                in.t_round_ms = t_round[d];
                                in.fp32_shard_bytes = bytes[e];
                                assert_matches_reference(&in);
                            }
}

/* Monotone in the direction the model says: more NIC, more L, wider gradients, or slower
 * CTAs never lower a budget; a larger per-round cost never narrows rounds. */
static void test_monotonicity(void **state) {
    (void)state;
    tide_solver_input_t in = calibration();
    tide_solver_output_t prev, out;
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &prev));
    for (double nic = 1.0; nic <= 800.0; nic *= 1.37) {
        in.bw_nic_gbps = nic;
        assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
        if (nic > 1.0) assert_true(out.sum_ctas >= prev.sum_ctas);
        prev = out;
    }
    in = calibration();
    for (int l = 1; l <= 8; ++l) {
        in.gpus_per_node = l;
        in.wave_width = 0;
        assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
        if (l > 1) assert_true(out.sum_ctas >= prev.sum_ctas);
        tide_solver_input_t wide = in;
        wide.grad_dtype = TIDE_DTYPE_FP32;
        tide_solver_output_t o32;
        assert_tide(TIDE_SUCCESS, tide_solve(&wide, &o32));
        assert_true(o32.sum_ctas >= out.sum_ctas);
        prev = out;
    }
    in = calibration();
    for (double s = 500.0; s >= 1.0; s /= 1.5) {
        in.bw_sum_gbps = s;
        assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
        if (s < 500.0) assert_true(out.sum_ctas >= prev.sum_ctas);
        prev = out;
    }
    in = calibration();
    in.bw_cap_gbps = 1000.0;
    for (int n = 1; n <= TIDE_MAX_PASSES; ++n) {
        in.passes = n;
        assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
        if (n > 1) assert_true(out.landing_ctas <= prev.landing_ctas);
        assert_true(out.landing_ctas <= (int)(in.bw_cap_gbps / in.bw_land_gbps));
        prev = out;
    }
    for (int m = 2; m <= 300; m += 7) {
        in = calibration();
        in.nodes = m;
        for (double t = 0.0; t <= 50.0; t = t * 2 + 0.01) {
            in.t_round_ms = t;
            assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
            if (t > 0.0) assert_true(out.round_width >= prev.round_width);
            assert_true(out.round_width >= 1 && out.round_width <= TIDE_MAX_ROUND_WIDTH);
            assert_true(out.round_width <= m - 1);
            prev = out;
        }
    }
}

static void expect_invalid(tide_solver_input_t in, tide_result_t code) {
    tide_solver_output_t out;
    memset(&out, 0x5a, sizeof(out));
    tide_solver_output_t before = out;
    assert_tide(code, tide_solve(&in, &out));
    assert_memory_equal(&out, &before, sizeof(out)); /* outputs only on success */
    assert_true(strlen(tide_get_last_error()) > 0);
}

static void test_invalid_inputs(void **state) {
    (void)state;
    tide_solver_output_t out;
    tide_solver_input_t in = calibration();
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_solve(NULL, &out));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_solve(&in, NULL));

    static const int bad_nodes[] = {0, -1, TIDE_MAX_NODES + 1, 2147483647};
    for (size_t i = 0; i < 4; ++i) {
        in = calibration();
        in.nodes = bad_nodes[i];
        expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
    }
    static const int bad_l[] = {0, -3, 9, 1000};
    for (size_t i = 0; i < 4; ++i) {
        in = calibration();
        in.gpus_per_node = bad_l[i];
        expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
    }
    in = calibration();
    in.wave_width = 9;
    expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
    in.wave_width = -1;
    expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
    in = calibration();
    in.passes = TIDE_MAX_PASSES + 1;
    expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
    in.passes = -1;
    expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
    in = calibration();
    in.grad_dtype = TIDE_DTYPE_FP16;
    expect_invalid(in, TIDE_ERR_UNSUPPORTED);
    in.grad_dtype = (tide_dtype_t)77;
    expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
    in = calibration();
    in.fp32_shard_bytes = 0;
    expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);

    const double bad_rates[] = {0.0, -1.0, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < 5; ++i)
        for (int f = 0; f < 5; ++f) {
            in = calibration();
            double *field[] = {&in.bw_nic_gbps, &in.bw_sum_gbps, &in.bw_land_gbps, &in.bw_cap_gbps,
                               &in.t_round_ms};
            /* t_round = 0 is valid; bw_sum = 0 is the library's rate (test_plan_bw_sum) */
            if ((f == 4 || f == 1) && bad_rates[i] == 0.0) continue;
            *field[f] = bad_rates[i];
            expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
        }
    /* Rates so skewed that the budget exceeds any GPU. */
    in = calibration();
    in.bw_sum_gbps = 1e-9;
    expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
    in = calibration();
    in.bw_land_gbps = 1e-9;
    in.bw_cap_gbps = 1e9;
    in.nodes = 1;
    expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);

    /* A later success clears the last error. */
    in = calibration();
    assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
    assert_string_equal(tide_get_last_error(), "");
}

/* M = 1 with BW_link: the fewest CTAs whose rate covers gamma (L b / 4 + 1) BW_link /
 * (max(L - 1, 1) b / 4), by counting up (no ceil, no shared formula). */
static int reference_local_sum_ctas(int l, double b, double bw_link, double bw_sum) {
    double need = 1.5 * (l * b / 4.0 + 1.0) * bw_link / ((l > 1 ? l - 1 : 1) * b / 4.0);
    int c = 1;
    while (c * bw_sum < need * (1 - 1e-12)) ++c;
    return c;
}

static void test_single_node_link(void **state) {
    (void)state;
    tide_solver_input_t in = calibration();
    tide_solver_output_t out;
    in.nodes = 1;
    in.bw_link_gbps = 450.0;
    /* The figures docs/tide-plan.md quotes. */
    static const int l_of[] = {2, 4, 8}, bf16_ctas[] = {28, 14, 10};
    for (int i = 0; i < 3; ++i) {
        in.gpus_per_node = l_of[i];
        assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
        assert_int_equal(out.sum_ctas, bf16_ctas[i]);
    }
    for (int l = 1; l <= TIDE_MAX_GPUS_PER_NODE; ++l)
        for (int fp32 = 0; fp32 < 2; ++fp32)
            for (double link = 25.0; link <= 3200.0; link *= 2.0) {
                in.gpus_per_node = l;
                in.wave_width = 0;
                in.grad_dtype = fp32 ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
                in.bw_link_gbps = link;
                assert_tide(TIDE_SUCCESS, tide_solve(&in, &out));
                assert_int_equal(out.sum_ctas,
                                 reference_local_sum_ctas(l, fp32 ? 4.0 : 2.0, link, 99.0));
                assert_int_equal(out.round_width, 1);
                assert_int_equal(out.rounds, 0);
            }
    /* Ignored at M > 1: eq. 13 alone. */
    tide_solver_input_t multi = calibration();
    tide_solver_output_t without, with;
    assert_tide(TIDE_SUCCESS, tide_solve(&multi, &without));
    multi.bw_link_gbps = 450.0;
    assert_tide(TIDE_SUCCESS, tide_solve(&multi, &with));
    assert_int_equal(with.sum_ctas, without.sum_ctas);
    /* Not a rate: refused at any M. */
    const double bad[] = {-1.0, NAN, INFINITY};
    for (int i = 0; i < 3; ++i) {
        in = calibration();
        in.bw_link_gbps = bad[i];
        expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
        in.nodes = 1;
        expect_invalid(in, TIDE_ERR_INVALID_ARGUMENT);
    }
}

/* The default sum's GB/s per CTA over L bf16 sources at 16 CTAs, as measured on an H100
 * (bench/results/h100-2026-12-07c, call 3; index L, 0 where not measured): the planner's
 * BW_sum at M = 1 is 99 GB/s scaled by the rate at L over the rate at 8. */
static const double measured_bf16_rate[] = {0, 0, 82.8, 90.6, 93.6, 91.3, 93.7, 98.7, 98.8};

static double reference_plan_bw_sum(int l, bool fp32) {
    const int lm = l < 2 ? 2 : l; /* L = 1 is sized as L = 2 */
    if (fp32 || lm > 8) return 99.0;
    return 99.0 * measured_bf16_rate[lm] / measured_bf16_rate[8];
}

static void test_plan_bw_sum(void **state) {
    (void)state;
    for (int l = 1; l <= TIDE_MAX_GPUS_PER_NODE; ++l)
        for (int fp32 = 0; fp32 < 2; ++fp32) {
            const double got = tide_plan_bw_sum_gbps(l, fp32 ? 4 : 2);
            assert_true(fabs(got - reference_plan_bw_sum(l, fp32)) < 0.05);
            assert_true(got <= TIDE_PLAN_BW_SUM_GBPS); /* never fewer CTAs than with 99 */
        }
    /* tide_solve with bw_sum_gbps 0 takes the same rate, at M = 1 and in eq. 13. */
    tide_solver_input_t in = calibration();
    tide_solver_output_t zero, given;
    for (int m = 1; m <= 2; ++m)
        for (int l = 1; l <= TIDE_MAX_GPUS_PER_NODE; ++l)
            for (int fp32 = 0; fp32 < 2; ++fp32) {
                in.nodes = m;
                in.gpus_per_node = l;
                in.wave_width = 0;
                in.bw_link_gbps = m == 1 ? TIDE_PLAN_BW_LINK_GBPS : 0.0;
                in.grad_dtype = fp32 ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
                in.bw_sum_gbps = 0.0;
                assert_tide(TIDE_SUCCESS, tide_solve(&in, &zero));
                in.bw_sum_gbps = reference_plan_bw_sum(l, fp32);
                assert_tide(TIDE_SUCCESS, tide_solve(&in, &given));
                assert_int_equal(zero.sum_ctas, given.sum_ctas);
            }
    /* Not a gradient size the sum takes: the flat rate. */
    assert_true(tide_plan_bw_sum_gbps(2, 1) == TIDE_PLAN_BW_SUM_GBPS);
    assert_true(tide_plan_bw_sum_gbps(-1, 2) == TIDE_PLAN_BW_SUM_GBPS);
}

/* A config that leaves sum_ctas at 0 gets the M = 1 link sizing from the planner (at the
 * rates plan.h names), 4 at M > 1, and a budget the caller set stays. */
static void test_plan_default_sum_ctas(void **state) {
    (void)state;
    for (int m = 1; m <= 2; ++m)
        for (int l = 1; l <= TIDE_MAX_GPUS_PER_NODE; ++l)
            for (int fp32 = 0; fp32 < 2; ++fp32)
                for (int given = 0; given <= 7; given += 7) {
                    tide_config_t config = TIDE_CONFIG_INIT;
                    config.nodes = m;
                    config.gpus_per_node = l;
                    config.sum_ctas = given;
                    tide_param_shape_t shape = {(uint64_t)(2 * m * l), 64};
                    tide_dtype_t grad = fp32 ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
                    tide_group_desc_t group = {1, &shape, TIDE_DTYPE_BF16, grad, TIDE_DTYPE_FP32};
                    tide_plan_t plan = NULL;
                    assert_tide(TIDE_SUCCESS, tide_plan_create(&config, &group, &plan));
                    int want = given ? given
                               : m == 1 ? reference_local_sum_ctas(l, fp32 ? 4.0 : 2.0,
                                                                   TIDE_PLAN_BW_LINK_GBPS,
                                                                   reference_plan_bw_sum(l, fp32))
                                        : 4;
                    assert_int_equal(plan->config.sum_ctas, want);
                    tide_plan_destroy(plan);
                }
    /* The defaults docs/tide-plan.md quotes: bf16 at L = 2, 4, 8. */
    static const int l_of[] = {2, 4, 8}, bf16_ctas[] = {33, 15, 10};
    for (int i = 0; i < 3; ++i) {
        tide_config_t config = TIDE_CONFIG_INIT;
        config.nodes = 1;
        config.gpus_per_node = l_of[i];
        tide_param_shape_t shape = {(uint64_t)(2 * l_of[i]), 64};
        tide_group_desc_t group = {1, &shape, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32};
        tide_plan_t plan = NULL;
        assert_tide(TIDE_SUCCESS, tide_plan_create(&config, &group, &plan));
        assert_int_equal(plan->config.sum_ctas, bf16_ctas[i]);
        tide_plan_destroy(plan);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paper_calibration), cmocka_unit_test(test_sum_ctas_eq13),
        cmocka_unit_test(test_landing_ctas_eq14), cmocka_unit_test(test_single_node),
        cmocka_unit_test(test_round_width_rules), cmocka_unit_test(test_against_reference_grid),
        cmocka_unit_test(test_monotonicity),      cmocka_unit_test(test_invalid_inputs),
        cmocka_unit_test(test_single_node_link),  cmocka_unit_test(test_plan_default_sum_ctas),
        cmocka_unit_test(test_plan_bw_sum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
