/*
 * plan.c - the public plan object: validate a config and a group, resolve the tuning knobs the
 * caller left at zero, build every part of the plan (topology, geometry, both schedules, the
 * arena), and answer the getters.
 *
 * A plan is immutable once created, so the getters only validate their arguments and copy.
 */
#include "core/checks.h"
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

/* Defaults for tuning fields left at zero (tide.h). */
#define PLAN_DEFAULT_PASSES 1
#define PLAN_DEFAULT_STAGING_SLOTS 2
#define PLAN_DEFAULT_SUM_CTAS 4
#define PLAN_DEFAULT_LANDING_CTAS 4

/* The config header: a struct from another build of tide.h must not be read field by field. */
static tide_result_t check_header(const tide_config_t *config) {
    TIDE_ARG_CHECK(config->size == sizeof(tide_config_t),
                   "config: size = %zu, expected sizeof(tide_config_t) = %zu (initialise with "
                   "TIDE_CONFIG_INIT)",
                   config->size, sizeof(tide_config_t));
    TIDE_ARG_CHECK(config->magic == TIDE_CONFIG_MAGIC,
                   "config: magic = 0x%08x, expected 0x%08x (initialise with TIDE_CONFIG_INIT)",
                   config->magic, TIDE_CONFIG_MAGIC);
    TIDE_ARG_CHECK(config->version / 10000 == TIDE_MAJOR,
                   "config: compiled against TIDE %u.x, this library is %d.%d",
                   config->version / 10000, TIDE_MAJOR, TIDE_MINOR);
    return TIDE_SUCCESS;
}

/* Replace zeros by the planner's choices and range-check the rest.  The topology is already
 * valid, so M and L are in range here.  grad_item: the group's gradient item size (0 when its
 * dtype is not one the geometry accepts). */
static tide_result_t resolve_tuning(const tide_topo_t *topo, size_t grad_item, tide_config_t *c) {
    const int m = topo->nodes, l = topo->gpus_per_node;
    TIDE_ARG_CHECK(c->wave_width >= 0 && c->wave_width <= l,
                   "config: wave_width W_wave = %d outside [1, L = %d] (0 = L)", c->wave_width, l);
    TIDE_ARG_CHECK(c->round_width >= 0 && c->round_width <= TIDE_MAX_ROUND_WIDTH,
                   "config: round_width k = %d outside [1, %d] (0 = planner's choice)",
                   c->round_width, TIDE_MAX_ROUND_WIDTH);
    TIDE_ARG_CHECK(c->passes >= 0 && c->passes <= TIDE_MAX_PASSES,
                   "config: passes n_part = %d outside [1, %d] (0 = 1)", c->passes,
                   TIDE_MAX_PASSES);
    TIDE_ARG_CHECK(c->staging_slots >= 0 && c->staging_slots <= TIDE_MAX_STAGING_SLOTS,
                   "config: staging_slots n_stg = %d outside [1, %d] (0 = 2)", c->staging_slots,
                   TIDE_MAX_STAGING_SLOTS);
    TIDE_ARG_CHECK(c->mode == TIDE_RS_IN_PLACE || c->mode == TIDE_RS_SLOT_REUSE,
                   "config: mode = %d is not a tide_rs_mode_t", (int)c->mode);
    TIDE_ARG_CHECK(c->sum_ctas >= 0, "config: sum_ctas = %d is negative", c->sum_ctas);
    TIDE_ARG_CHECK(c->landing_ctas >= 0, "config: landing_ctas = %d is negative", c->landing_ctas);
    TIDE_ARG_CHECK(c->multicast == 0 || c->multicast == 1, "config: multicast = %d, need 0 or 1",
                   c->multicast);
    TIDE_ARG_CHECK(c->lane == TIDE_LANE_AUTO || c->lane == TIDE_LANE_GENERIC ||
                       c->lane == TIDE_LANE_RAIL,
                   "config: lane = %d is not a tide_lane_t", (int)c->lane);
    /* The rail lane has no local peers to stage for or scatter to: it needs L = 1, and at
     * least one rail peer (M = 1, L = 1 is one rank with nothing to move). */
    bool rail_ok = l == 1 && m >= 2;
    if (c->lane == TIDE_LANE_RAIL && !rail_ok)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "config: lane = rail needs L = 1 and M >= 2, the topology is M = %d, "
                        "L = %d",
                        m, l);

    if (c->wave_width == 0) c->wave_width = l;
    /* k = min(2, max(1, M - 1)): two overlapped rail transfers, unless fewer remote nodes. */
    if (c->round_width == 0) c->round_width = m - 1 < 1 ? 1 : (m - 1 < 2 ? m - 1 : 2);
    if (c->passes == 0) c->passes = PLAN_DEFAULT_PASSES;
    if (c->staging_slots == 0) c->staging_slots = PLAN_DEFAULT_STAGING_SLOTS;
    /* At M = 1 the sum is the whole reduce-scatter: sized for the intra-node link (solver.c),
     * not the rail-fed default.  An unknown gradient dtype is refused by the geometry. */
    if (c->sum_ctas == 0 && m == 1 && (grad_item == 2 || grad_item == 4))
        TIDE_CHECK(tide_solve_local_sum_ctas(l, grad_item, TIDE_PLAN_BW_LINK_GBPS,
                                             tide_plan_bw_sum_gbps(l, grad_item),
                                             &c->sum_ctas));
    if (c->sum_ctas == 0) c->sum_ctas = PLAN_DEFAULT_SUM_CTAS;
    if (c->landing_ctas == 0) c->landing_ctas = PLAN_DEFAULT_LANDING_CTAS;
    if (c->lane == TIDE_LANE_AUTO) c->lane = rail_ok ? TIDE_LANE_RAIL : TIDE_LANE_GENERIC;
    return TIDE_SUCCESS;
}

/* What the caller must get right before any geometry is formed; the dtype and shape checks
 * live with the geometry. */
static tide_result_t check_group(const tide_group_desc_t *group) {
    TIDE_ARG_CHECK(group->num_params >= 1, "group: num_params P = %d, need P >= 1",
                   group->num_params);
    if (group->num_params > TIDE_MAX_PARAMS)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "group: P = %d parameters exceeds TIDE_MAX_PARAMS = %d (use stock "
                        "collectives)",
                        group->num_params, TIDE_MAX_PARAMS);
    TIDE_ARG_CHECK(group->shapes != NULL, "group: shapes is NULL");
    return TIDE_SUCCESS;
}

/* Most AG copy descriptors any rank issues per call; every rank of a node issues the same.
 * A node's count costs O(log M), so every node is visited: the maximum is exact. */
static tide_result_t max_ag_descriptors(const struct tide_plan *plan, uint64_t *out) {
    const int m = plan->topo.nodes;
    uint64_t best = 0;
    for (int n = 0; n < m; ++n) {
        uint64_t count;
        TIDE_CHECK(tide_ag_descriptors(&plan->topo, &plan->ag, plan->geom.num_params, n,
                                       plan->config.multicast, &count));
        if (count > best) best = count;
    }
    *out = best;
    return TIDE_SUCCESS;
}

tide_result_t tide_plan_create(const tide_config_t *config, const tide_group_desc_t *group,
                               tide_plan_t *plan_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(config != NULL, "plan: config is NULL");
    TIDE_ARG_CHECK(group != NULL, "plan: group is NULL");
    TIDE_ARG_CHECK(plan_out != NULL, "plan: plan_out is NULL");
    TIDE_CHECK(check_header(config));

    tide_config_t resolved = *config;
    tide_topo_t topo;
    TIDE_CHECK(tide_topo_init(config->nodes, config->gpus_per_node, &topo));
    TIDE_CHECK(check_group(group));
    TIDE_CHECK(resolve_tuning(&topo, tide_dtype_size(group->grad_dtype), &resolved));

    tide_result_t res;
    struct tide_plan *plan = calloc(1, sizeof(*plan));
    if (plan == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "plan: out of host memory");
    plan->config = resolved;
    plan->topo = topo;

    TIDE_CHECK_GOTO(tide_geom_build(&plan->topo, group, &plan->geom), res, fail_plan);
    TIDE_CHECK_GOTO(tide_ag_schedule_build(&plan->topo, &plan->ag), res, fail_geom);
    TIDE_CHECK_GOTO(tide_rs_schedule_build(&plan->topo, &plan->geom, resolved.wave_width,
                                           resolved.round_width, resolved.mode, resolved.passes,
                                           resolved.staging_slots, &plan->rs),
                    res, fail_ag);
    plan->rs.rail_lane = resolved.lane == TIDE_LANE_RAIL;
    TIDE_CHECK_GOTO(tide_arena_layout(&plan->topo, &plan->geom, &plan->rs, &plan->arena), res,
                    fail_rs);
    if (plan->rs.rail_lane) {
        /* The lane forwards landing to landing: no stage, and the only copy-engine copies
         * are the P own-shard copies (the Bruck puts are rail transfers, compile_lane.c). */
        plan->ag.stage_slots = 0;
        plan->ag_descriptors_max = (uint64_t)plan->geom.num_params;
    } else {
        TIDE_CHECK_GOTO(max_ag_descriptors(plan, &plan->ag_descriptors_max), res, fail_rs);
    }

    *plan_out = plan;
    return TIDE_SUCCESS;

fail_rs:
    tide_rs_schedule_free(&plan->rs);
fail_ag:
    tide_ag_schedule_free(&plan->ag);
fail_geom:
    tide_geom_free(&plan->geom);
fail_plan:
    free(plan);
    return res;
}

/* Destroy cannot fail, so it leaves the last error alone: cleanup after a failed call must not
 * erase the reason the caller is about to print. */
void tide_plan_destroy(tide_plan_t plan) {
    if (plan == NULL) return;
    tide_rs_schedule_free(&plan->rs);
    tide_ag_schedule_free(&plan->ag);
    tide_geom_free(&plan->geom);
    free(plan);
}

static tide_result_t check_param(tide_plan_t plan, int p) {
    TIDE_ARG_CHECK(plan != NULL, "plan is NULL");
    TIDE_ARG_CHECK(p >= 0 && p < plan->geom.num_params, "parameter index %d outside [0, P = %d)", p,
                   plan->geom.num_params);
    return TIDE_SUCCESS;
}

tide_result_t tide_plan_get_param(tide_plan_t plan, int p, tide_param_geometry_t *geometry_out) {
    tide_error_clear();
    TIDE_CHECK(check_param(plan, p));
    TIDE_ARG_CHECK(geometry_out != NULL, "geometry_out is NULL");
    const tide_geom_param_t *q = &plan->geom.params[p];
    tide_param_geometry_t g;
    g.dim0 = q->dim0;
    g.inner = q->inner;
    g.rows_per_rank = q->rows;
    g.shard_bytes = q->shard_bytes;
    g.shard_offset = q->offset;
    /* elem_offset < sum R_p K_p, and 4 sum R_p K_p = S_fp32 fits: no overflow. */
    g.fp32_offset = q->elem_offset * 4u;
    *geometry_out = g;
    return TIDE_SUCCESS;
}

tide_result_t tide_plan_landing_offset(tide_plan_t plan, int p, int rank, uint64_t *offset_out) {
    tide_error_clear();
    TIDE_CHECK(check_param(plan, p));
    TIDE_ARG_CHECK(rank >= 0 && rank < plan->topo.ranks, "rank %d outside [0, N = %d)", rank,
                   plan->topo.ranks);
    TIDE_ARG_CHECK(offset_out != NULL, "offset_out is NULL");
    /* Landing(p, r) < N S, which the geometry bounded to 64 bits. */
    *offset_out = tide_geom_landing(&plan->geom, p, rank);
    return TIDE_SUCCESS;
}

tide_result_t tide_plan_get_summary(tide_plan_t plan, tide_plan_summary_t *summary_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(plan != NULL, "plan is NULL");
    TIDE_ARG_CHECK(summary_out != NULL, "summary_out is NULL");
    const tide_geom_t *g = &plan->geom;
    const tide_rs_schedule_t *rs = &plan->rs;
    tide_plan_summary_t s;
    memset(&s, 0, sizeof(s));
    s.nodes = plan->topo.nodes;
    s.gpus_per_node = plan->topo.gpus_per_node;
    s.ranks = plan->topo.ranks;
    s.num_params = g->num_params;
    s.shard_bytes = g->shard_bytes;
    s.group_bytes = g->group_bytes;
    s.grad_shard_bytes = g->grad_shard_bytes;
    s.fp32_shard_bytes = g->fp32_shard_bytes;
    s.fsdp2_pack_bytes = g->pack_bytes;
    s.ag_rounds = plan->ag.num_rounds;
    s.ag_descriptors_max = plan->ag_descriptors_max;
    s.rs_wave_width = rs->wave_width;
    s.rs_waves = rs->waves_per_pass;
    s.rs_inbox_generations = rs->inbox_generations;
    s.rs_round_width = rs->round_width;
    s.rs_rounds = rs->num_rounds;
    s.rs_passes = rs->passes;
    s.rs_outbox_depth = rs->outbox_depth;
    s.rs_subslice_elems = rs->subslice_elems;
    s.rs_descriptors_flat = rs->descriptors_flat;
    s.rs_descriptors = rs->descriptors_coalesced;
    s.arena_bytes = plan->arena.total_bytes;
    *summary_out = s;
    return TIDE_SUCCESS;
}

tide_result_t tide_plan_get_lane(tide_plan_t plan, tide_lane_t *lane_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(plan != NULL, "plan is NULL");
    TIDE_ARG_CHECK(lane_out != NULL, "lane_out is NULL");
    *lane_out = plan->rs.rail_lane ? TIDE_LANE_RAIL : TIDE_LANE_GENERIC;
    return TIDE_SUCCESS;
}

tide_result_t tide_plan_get_region(tide_plan_t plan, tide_region_t region,
                                   tide_region_info_t *info_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(plan != NULL, "plan is NULL");
    TIDE_ARG_CHECK((int)region >= 0 && (int)region < (int)TIDE_REGION_COUNT,
                   "region %d outside [0, %d)", (int)region, (int)TIDE_REGION_COUNT);
    TIDE_ARG_CHECK(info_out != NULL, "info_out is NULL");
    *info_out = plan->arena.regions[region];
    return TIDE_SUCCESS;
}
