/*
 * geometry.c - per-parameter shard geometry of one FSDP2 group (paper §2.1, eqs. 2-3).
 *
 * Parameter p, logically (D_p, K_p), is sharded along dim 0 into R_p = ceil(D_p / N) padded
 * rows per rank.  The all-gather lands rank r's s_p = R_p K_p b_ag bytes at
 * Landing(p, r) = o_p N + r s_p of parameter-major storage, and the reduce-scatter writes
 * rank r's R_p K_p fp32 rows at element elem_offset_p of its packed output.
 *
 * Every derived count is formed with overflow-checked arithmetic.  Bounding N S, S_grad,
 * S_fp32 and B_pack also bounds every address the planner forms later: an unsharded parameter
 * spans D_p K_p b <= N R_p K_p b bytes, which is at most N S (AG dtype) or B_pack (gradients,
 * b_grad <= 4), so offsets inside one parameter cannot overflow once this file accepts it.
 */
#include "core/checks.h"
#include "plan/plan.h"

#include <inttypes.h>
#include <stdlib.h>

/* Re-derive the topology so a hand-made or corrupted tide_topo_t is rejected, not trusted. */
static tide_result_t check_topo(const tide_topo_t *topo) {
    tide_topo_t ref;
    TIDE_CHECK(tide_topo_init(topo->nodes, topo->gpus_per_node, &ref));
    if (ref.ranks != topo->ranks)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "topology: ranks = %d, expected M L = %d",
                        topo->ranks, ref.ranks);
    return TIDE_SUCCESS;
}

/* Out-of-enum values are caller bugs; FP16 is a real dtype that TIDE does not serve, so the
 * caller must be able to tell the two apart and fall back only for the latter. */
static tide_result_t check_dtype(tide_dtype_t dtype, const char *what) {
    if ((int)dtype < 0 || (int)dtype >= (int)TIDE_DTYPE_COUNT)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "group: %s = %d is not a tide_dtype_t", what,
                        (int)dtype);
    if (dtype != TIDE_DTYPE_BF16 && dtype != TIDE_DTYPE_FP32)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "group: %s = %d is not bf16 or fp32", what,
                        (int)dtype);
    return TIDE_SUCCESS;
}

/*
 * Either the shard already has the all-gather dtype (in-place shard adoption, §3.1), or it is
 * the fp32 master of a bf16 all-gather (the mixed-precision cast).  A bf16 shard gathered as
 * fp32 would be an upcast FSDP2 never asks for.
 */
static tide_result_t check_dtypes(const tide_group_desc_t *group, bool *cast_out) {
    TIDE_CHECK(check_dtype(group->ag_dtype, "ag_dtype"));
    TIDE_CHECK(check_dtype(group->grad_dtype, "grad_dtype"));
    TIDE_CHECK(check_dtype(group->shard_dtype, "shard_dtype"));
    if (group->shard_dtype == group->ag_dtype) {
        *cast_out = false;
        return TIDE_SUCCESS;
    }
    if (group->shard_dtype == TIDE_DTYPE_FP32 && group->ag_dtype == TIDE_DTYPE_BF16) {
        *cast_out = true;
        return TIDE_SUCCESS;
    }
    return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                    "group: shard_dtype %d with ag_dtype %d is neither the same dtype nor the "
                    "fp32 -> bf16 cast",
                    (int)group->shard_dtype, (int)group->ag_dtype);
}

/* Checked a * b and a + b that name the quantity; param < 0 means a group-wide figure. */
static tide_result_t mul_named(uint64_t a, uint64_t b, uint64_t *out, int param, const char *what) {
    if (tide_mul_u64(a, b, out)) return TIDE_SUCCESS;
    if (param >= 0)
        return TIDE_ERR(TIDE_ERR_OVERFLOW,
                        "parameter %d: %s = %" PRIu64 " * %" PRIu64 " overflows 64 bits", param,
                        what, a, b);
    return TIDE_ERR(TIDE_ERR_OVERFLOW, "group: %s = %" PRIu64 " * %" PRIu64 " overflows 64 bits",
                    what, a, b);
}

static tide_result_t add_named(uint64_t a, uint64_t b, uint64_t *out, int param, const char *what) {
    if (tide_add_u64(a, b, out)) return TIDE_SUCCESS;
    if (param >= 0)
        return TIDE_ERR(TIDE_ERR_OVERFLOW,
                        "parameter %d: %s = %" PRIu64 " + %" PRIu64 " overflows 64 bits", param,
                        what, a, b);
    return TIDE_ERR(TIDE_ERR_OVERFLOW, "group: %s = %" PRIu64 " + %" PRIu64 " overflows 64 bits",
                    what, a, b);
}

/* Fill params[p] and advance the running totals S and sum R_i K_i. */
static tide_result_t build_param(const tide_param_shape_t *shape, int p, uint64_t ranks,
                                 uint64_t ag_item, tide_geom_param_t *out, uint64_t *bytes,
                                 uint64_t *elems) {
    if (shape->dim0 == 0 || shape->inner == 0)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "parameter %d: shape (dim0 = %" PRIu64 ", inner = %" PRIu64
                        ") has a zero extent",
                        p, shape->dim0, shape->inner);
    uint64_t numel;
    TIDE_CHECK(mul_named(shape->dim0, shape->inner, &numel, p, "D_p * K_p"));

    tide_geom_param_t q;
    q.dim0 = shape->dim0;
    q.inner = shape->inner;
    q.rows = tide_div_ceil_u64(shape->dim0, ranks);
    TIDE_CHECK(mul_named(q.rows, q.inner, &q.shard_elems, p, "R_p * K_p"));
    TIDE_CHECK(mul_named(q.shard_elems, ag_item, &q.shard_bytes, p, "s_p = R_p K_p b_ag"));
    q.offset = *bytes;
    q.elem_offset = *elems;
    TIDE_CHECK(add_named(*bytes, q.shard_bytes, bytes, p, "o_p + s_p (prefix of S)"));
    TIDE_CHECK(add_named(*elems, q.shard_elems, elems, p, "sum R_i K_i (packed output prefix)"));
    *out = q;
    return TIDE_SUCCESS;
}

/* Group-wide figures; params[] is already filled. */
static tide_result_t build_totals(tide_geom_t *g) {
    const uint64_t n = (uint64_t)g->ranks;
    TIDE_CHECK(mul_named(n, g->shard_bytes, &g->group_bytes, -1, "N S"));
    TIDE_CHECK(mul_named(g->grad_item, g->shard_elems, &g->grad_shard_bytes, -1,
                         "S_grad = b_grad sum R_p K_p"));
    TIDE_CHECK(mul_named(4, g->shard_elems, &g->fp32_shard_bytes, -1, "S_fp32 = 4 sum R_p K_p"));
    TIDE_CHECK(mul_named(n, g->fp32_shard_bytes, &g->pack_bytes, -1, "B_pack = N S_fp32"));

    /* The end of the last landing, o_p N + (N-1) s_p + s_p, equals N (o_p + s_p) <= N S, so
     * it cannot fail here; it is still evaluated in the form tide_geom_landing() uses, which
     * is unchecked, so that the bound is proven rather than assumed. */
    for (int p = 0; p < g->num_params; ++p) {
        const tide_geom_param_t *q = &g->params[p];
        uint64_t base, step, end;
        TIDE_CHECK(mul_named(q->offset, n, &base, p, "o_p N"));
        TIDE_CHECK(mul_named(n - 1, q->shard_bytes, &step, p, "(N - 1) s_p"));
        TIDE_CHECK(add_named(base, step, &end, p, "Landing(p, N - 1)"));
        TIDE_CHECK(add_named(end, q->shard_bytes, &end, p, "Landing(p, N - 1) + s_p"));
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_geom_build(const tide_topo_t *topo, const tide_group_desc_t *group,
                              tide_geom_t *geom_out) {
    TIDE_ARG_CHECK(topo != NULL, "geometry: topo is NULL");
    TIDE_ARG_CHECK(group != NULL, "geometry: group is NULL");
    TIDE_ARG_CHECK(geom_out != NULL, "geometry: geom_out is NULL");
    TIDE_CHECK(check_topo(topo));
    TIDE_ARG_CHECK(group->num_params >= 1, "group: num_params = %d, need at least 1",
                   group->num_params);
    if (group->num_params > TIDE_MAX_PARAMS)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "group: num_params = %d exceeds TIDE_MAX_PARAMS = %d",
                        group->num_params, TIDE_MAX_PARAMS);
    TIDE_ARG_CHECK(group->shapes != NULL, "group: shapes is NULL");

    tide_result_t res;
    tide_geom_t g = {0};
    TIDE_CHECK(check_dtypes(group, &g.cast));
    g.num_params = group->num_params;
    g.ranks = topo->ranks;
    g.ag_item = tide_dtype_size(group->ag_dtype);
    g.grad_item = tide_dtype_size(group->grad_dtype);

    g.params = calloc((size_t)g.num_params, sizeof(*g.params));
    if (g.params == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "geometry: cannot allocate %d parameters",
                        g.num_params);

    for (int p = 0; p < g.num_params; ++p)
        TIDE_CHECK_GOTO(build_param(&group->shapes[p], p, (uint64_t)g.ranks, g.ag_item,
                                    &g.params[p], &g.shard_bytes, &g.shard_elems),
                        res, fail_params);
    TIDE_CHECK_GOTO(build_totals(&g), res, fail_params);

    *geom_out = g;
    return TIDE_SUCCESS;

fail_params:
    free(g.params);
    return res;
}

void tide_geom_free(tide_geom_t *geom) {
    if (geom == NULL) return;
    free(geom->params);
    *geom = (tide_geom_t){0};
}
