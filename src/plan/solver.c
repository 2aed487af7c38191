/*
 * solver.c - the analytical sizing solver (paper App. G, eqs. 13-14, §6.3).
 *
 * A first-order model, run once before the first registration, that picks:
 *
 *   C_sum  Level-1 sum CTAs: enough local-sum throughput to feed the rail (eq. 13), or at
 *          M = 1 to keep pace with the intra-node link (tide_solve_local_sum_ctas),
 *   C_mc   landing CTAs: bounded by the landing fabric ceiling and by the final-wave landing
 *          tail (eq. 14),
 *   k      round width: widened only while per-round waits are a visible share of the wire
 *          time and widening actually removes rounds.
 *
 * Units: bandwidths in GB/s (10^9 bytes per second), times in ms, S_fp32 in bytes.
 */
#include "core/checks.h"
#include "plan/plan.h"

#include <limits.h>
#include <math.h>

/* Arrival skew across the L local sources feeding one Level-1 sum (eq. 13). */
#define SOLVER_GAMMA_SKEW 1.5
/* The final wave's landing may take at most this share of t_NIC (eq. 14). */
#define SOLVER_ETA_TAIL 0.05
/* Rounds are widened while their wait overhead exceeds this share of t_NIC. */
#define SOLVER_ROUND_SHARE 0.10
/* ceil() of a ratio that is an integer in exact arithmetic must not round up because of the
 * last bit of a double product: values within this relative distance of an integer count as
 * that integer. */
#define SOLVER_CEIL_SLACK 1e-9

static int is_rate(double v) {
    return isfinite(v) && v > 0.0;
}

/* ceil(x) for x > 0, tolerant to floating-point noise just above an integer. */
static double ceil_tolerant(double x) {
    double r = nearbyint(x);
    if (fabs(x - r) <= SOLVER_CEIL_SLACK * fmax(1.0, fabs(x))) return r;
    return ceil(x);
}

/* CTA counts are ints; a model that asks for more than this is fed nonsense rates. */
#define SOLVER_MAX_CTAS 65536.0

static tide_result_t check_input(const tide_solver_input_t *in, int *wave_width, int *passes,
                                 size_t *grad_item) {
    TIDE_ARG_CHECK(in->nodes >= 1 && in->nodes <= TIDE_MAX_NODES,
                   "solver: nodes M = %d outside [1, %d]", in->nodes, TIDE_MAX_NODES);
    TIDE_ARG_CHECK(in->gpus_per_node >= 1 && in->gpus_per_node <= TIDE_MAX_GPUS_PER_NODE,
                   "solver: gpus_per_node L = %d outside [1, %d]", in->gpus_per_node,
                   TIDE_MAX_GPUS_PER_NODE);
    TIDE_ARG_CHECK(in->wave_width >= 0 && in->wave_width <= in->gpus_per_node,
                   "solver: wave_width W_wave = %d outside [1, L = %d] (0 = L)", in->wave_width,
                   in->gpus_per_node);
    TIDE_ARG_CHECK(in->passes >= 0 && in->passes <= TIDE_MAX_PASSES,
                   "solver: passes n_part = %d outside [1, %d] (0 = 1)", in->passes,
                   TIDE_MAX_PASSES);
    if (in->grad_dtype == TIDE_DTYPE_FP16)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "solver: fp16 gradients are not served");
    TIDE_ARG_CHECK(in->grad_dtype == TIDE_DTYPE_BF16 || in->grad_dtype == TIDE_DTYPE_FP32,
                   "solver: unknown grad_dtype %d", (int)in->grad_dtype);
    TIDE_ARG_CHECK(is_rate(in->bw_nic_gbps), "solver: bw_nic_gbps = %g must be finite and > 0",
                   in->bw_nic_gbps);
    TIDE_ARG_CHECK(in->bw_sum_gbps == 0.0 || is_rate(in->bw_sum_gbps),
                   "solver: bw_sum_gbps = %g must be 0 (the library's rate for L) or finite "
                   "and > 0",
                   in->bw_sum_gbps);
    TIDE_ARG_CHECK(is_rate(in->bw_land_gbps), "solver: bw_land_gbps = %g must be finite and > 0",
                   in->bw_land_gbps);
    TIDE_ARG_CHECK(is_rate(in->bw_cap_gbps), "solver: bw_cap_gbps = %g must be finite and > 0",
                   in->bw_cap_gbps);
    /* A zero wait overhead is a valid calibration: rounds are then never widened. */
    TIDE_ARG_CHECK(isfinite(in->t_round_ms) && in->t_round_ms >= 0.0,
                   "solver: t_round_ms = %g must be finite and >= 0", in->t_round_ms);
    TIDE_ARG_CHECK(in->fp32_shard_bytes > 0, "solver: fp32_shard_bytes must be > 0");
    /* 0 is "not given"; anything else must be a rate (checked where M = 1 uses it). */
    TIDE_ARG_CHECK(in->bw_link_gbps == 0.0 || is_rate(in->bw_link_gbps),
                   "solver: bw_link_gbps = %g must be 0 (not given) or finite and > 0",
                   in->bw_link_gbps);

    *wave_width = in->wave_width == 0 ? in->gpus_per_node : in->wave_width;
    *passes = in->passes == 0 ? 1 : in->passes;
    *grad_item = tide_dtype_size(in->grad_dtype);
    return TIDE_SUCCESS;
}

/* Eq. (13): C_sum = ceil(gamma_skew (L b_grad / 4 + 1) BW_NIC / BW_sum).  Level 1 reads L
 * b_grad-byte sources and writes one fp32 partial per fp32 byte the rail carries, so at L = 8
 * and bf16 it must process 5x the NIC rate. */
static tide_result_t solve_sum_ctas(const tide_solver_input_t *in, size_t grad_item, int *out) {
    double load = (double)in->gpus_per_node * (double)grad_item / 4.0 + 1.0;
    double c = ceil_tolerant(SOLVER_GAMMA_SKEW * load * in->bw_nic_gbps / in->bw_sum_gbps);
    if (!(c <= SOLVER_MAX_CTAS))
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "solver: bw_nic %g GB/s over bw_sum %g GB/s per CTA asks for %g sum CTAs "
                        "(more than %g)",
                        in->bw_nic_gbps, in->bw_sum_gbps, c, SOLVER_MAX_CTAS);
    *out = c < 1.0 ? 1 : (int)c;
    return TIDE_SUCCESS;
}

/*
 * The default sum's rate per CTA over L bf16 sources relative to L = 8, at 16 CTAs on an H100
 * (tests/gpu/sum_by_l.sh; bench/results/h100-2026-12-07c, call 3: 82.8, 90.6, 93.6, 91.3,
 * 93.7, 98.7 and 98.8 GB/s per CTA at L = 2..8).  Every source costs the consumers the same
 * shared-memory loads and adds per output element, but the fp32 store and the element's
 * bookkeeping are paid once, over fewer bytes when there are fewer sources.  Index L; L = 1
 * sums no peer and is sized as L = 2 (tide_solve_local_sum_ctas).
 */
static const double sum_rate_vs_l8_bf16[] = {0.838, 0.838, 0.838, 0.917, 0.947,
                                             0.924, 0.948, 0.999, 1.000};

double tide_plan_bw_sum_gbps(int gpus_per_node, size_t grad_item) {
    const int n = (int)(sizeof(sum_rate_vs_l8_bf16) / sizeof(sum_rate_vs_l8_bf16[0]));
    if (grad_item != 2 || gpus_per_node < 0 || gpus_per_node >= n) return TIDE_PLAN_BW_SUM_GBPS;
    return TIDE_PLAN_BW_SUM_GBPS * sum_rate_vs_l8_bf16[gpus_per_node];
}

/*
 * C_sum at M = 1, where Level 1 is the whole reduce-scatter and no rail paces it.  Per fp32
 * output byte the sum reads L b_grad / 4 bytes and writes one (the load of eq. 13), and
 * (L - 1) b_grad / 4 of those reads arrive over the intra-node link.  Keeping pace with a link
 * of BW_link therefore takes a sum throughput of (L b_grad / 4 + 1) BW_link / ((L - 1) b_grad /
 * 4); with the same skew allowance as eq. 13:
 *
 *   C_sum(M = 1) = ceil(gamma_skew (L b_grad / 4 + 1) BW_link / ((L - 1) b_grad / 4 BW_sum)).
 *
 * At bf16 with BW_link 450 and BW_sum 99 that is 28, 14 and 10 CTAs at L = 2, 4 and 8: fewer
 * local peers put a larger share of every byte on the link per output byte that the sum must
 * keep up with.  The planner's BW_sum also follows the sum's measured rate over L sources
 * (tide_plan_bw_sum_gbps, above: 83 GB/s at L = 2), which makes its defaults 33, 15 and 10.
 * L = 1 has no link traffic; it is sized as L = 2.
 */
tide_result_t tide_solve_local_sum_ctas(int gpus_per_node, size_t grad_item, double bw_link_gbps,
                                        double bw_sum_gbps, int *out) {
    TIDE_ARG_CHECK(gpus_per_node >= 1, "solver: L = %d, need L >= 1", gpus_per_node);
    TIDE_ARG_CHECK(grad_item == 2 || grad_item == 4, "solver: b_grad = %zu, need 2 or 4",
                   grad_item);
    TIDE_ARG_CHECK(is_rate(bw_link_gbps), "solver: bw_link_gbps = %g must be finite and > 0",
                   bw_link_gbps);
    TIDE_ARG_CHECK(is_rate(bw_sum_gbps), "solver: bw_sum_gbps = %g must be finite and > 0",
                   bw_sum_gbps);
    double l = (double)gpus_per_node;
    double remote = (l > 1.0 ? l - 1.0 : 1.0) * (double)grad_item / 4.0;
    double load = l * (double)grad_item / 4.0 + 1.0;
    double c = ceil_tolerant(SOLVER_GAMMA_SKEW * load * bw_link_gbps / (remote * bw_sum_gbps));
    if (!(c <= SOLVER_MAX_CTAS))
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "solver: bw_link %g GB/s over bw_sum %g GB/s per CTA asks for %g sum "
                        "CTAs (more than %g)",
                        bw_link_gbps, bw_sum_gbps, c, SOLVER_MAX_CTAS);
    *out = c < 1.0 ? 1 : (int)c;
    return TIDE_SUCCESS;
}

/*
 * Eq. (14): C_mc = min(BW_cap / BW_land, (S_fp32 / n_part) / (eta_tail t_NIC BW_land)).
 *
 * The cap term is read as max(1, floor(BW_cap / BW_land)): landing CTAs beyond the fabric
 * ceiling add no throughput, so the budget is the largest count whose aggregate rate still fits
 * under the ceiling, and at least one CTA.  The tail term is rounded up: it is the fewest CTAs
 * that land one pass's final wave within eta_tail t_NIC.  With M = 1 there is no wire time and
 * no tail bound, and the cap term alone decides.
 */
static tide_result_t solve_landing_ctas(const tide_solver_input_t *in, int passes, double t_nic_s,
                                        int *out) {
    double cap = floor(in->bw_cap_gbps / in->bw_land_gbps + SOLVER_CEIL_SLACK);
    if (cap < 1.0) cap = 1.0;
    double c = cap;
    if (t_nic_s > 0.0) {
        double per_pass = (double)in->fp32_shard_bytes / (double)passes;
        double tail_rate = SOLVER_ETA_TAIL * t_nic_s * in->bw_land_gbps * 1e9;
        double tail = ceil_tolerant(per_pass / tail_rate);
        if (tail < 1.0) tail = 1.0;
        if (tail < c) c = tail;
    }
    if (!(c <= SOLVER_MAX_CTAS))
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "solver: bw_cap %g GB/s over bw_land %g GB/s per CTA asks for %g landing "
                        "CTAs (more than %g)",
                        in->bw_cap_gbps, in->bw_land_gbps, c, SOLVER_MAX_CTAS);
    *out = (int)c;
    return TIDE_SUCCESS;
}

static tide_result_t count_rounds(int nodes, int wave_width, int k, int *out) {
    int r = tide_rs_count_rounds(nodes, wave_width, k);
    if (r < 0)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "solver: N_rounds(M = %d, k = %d, W_wave = %d) = %d",
                        nodes, k, wave_width, r);
    *out = r;
    return TIDE_SUCCESS;
}

/* Round width: start at min(2, M - 1) and double up to k_max while the per-round waits exceed
 * SOLVER_ROUND_SHARE of the wire time and doubling reduces the round count (rounds never
 * span waves, so at small W_wave a wider round may buy nothing). */
static tide_result_t solve_round_width(const tide_solver_input_t *in, int wave_width,
                                       double t_nic_ms, int *k_out, int *rounds_out) {
    int k = in->nodes - 1 < 2 ? in->nodes - 1 : 2;
    int rounds = 0;
    TIDE_CHECK(count_rounds(in->nodes, wave_width, k, &rounds));
    while (k * 2 <= TIDE_MAX_ROUND_WIDTH &&
           (double)rounds * in->t_round_ms > SOLVER_ROUND_SHARE * t_nic_ms) {
        int wider = 0;
        TIDE_CHECK(count_rounds(in->nodes, wave_width, k * 2, &wider));
        if (wider >= rounds) break;
        k *= 2;
        rounds = wider;
    }
    *k_out = k;
    *rounds_out = rounds;
    return TIDE_SUCCESS;
}

tide_result_t tide_solve(const tide_solver_input_t *input, tide_solver_output_t *output) {
    tide_error_clear();
    TIDE_ARG_CHECK(input != NULL, "solver: input is NULL");
    TIDE_ARG_CHECK(output != NULL, "solver: output is NULL");

    int wave_width = 0, passes = 0;
    size_t grad_item = 0;
    TIDE_CHECK(check_input(input, &wave_width, &passes, &grad_item));

    /* BW_sum 0: the default sum's rate per CTA as measured over L sources. */
    tide_solver_input_t in = *input;
    if (in.bw_sum_gbps == 0.0) in.bw_sum_gbps = tide_plan_bw_sum_gbps(in.gpus_per_node, grad_item);
    input = &in;

    tide_solver_output_t out = {0};
    /* t_NIC = (M - 1) S_fp32 / BW_NIC: one rail carries every remote node's fp32 partial. */
    double t_nic_s =
        (double)(input->nodes - 1) * (double)input->fp32_shard_bytes / (input->bw_nic_gbps * 1e9);
    out.t_nic_ms = t_nic_s * 1e3;
    if (input->nodes == 1 && input->bw_link_gbps != 0.0)
        TIDE_CHECK(tide_solve_local_sum_ctas(input->gpus_per_node, grad_item, input->bw_link_gbps,
                                             input->bw_sum_gbps, &out.sum_ctas));
    else
        TIDE_CHECK(solve_sum_ctas(input, grad_item, &out.sum_ctas));
    TIDE_CHECK(solve_landing_ctas(input, passes, t_nic_s, &out.landing_ctas));
    if (input->nodes == 1) {
        /* No network phase: nothing to widen, nothing to wait for. */
        out.round_width = 1;
        out.rounds = 0;
    } else {
        TIDE_CHECK(
            solve_round_width(input, wave_width, out.t_nic_ms, &out.round_width, &out.rounds));
    }
    *output = out;
    return TIDE_SUCCESS;
}
