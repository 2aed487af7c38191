/*
 * group.c - parameter groups and the collectives: register (plan, compile, allocate arenas),
 * bind a call's operands, hand the rank's program to the fabric (tide.h).
 */
#include "core/checks.h"
#include "core/comm.h"
#include "program/counters.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* FNV-1a over the fields that decide the arena and the programs, so that ranks that
 * registered different groups are told so instead of exchanging misplaced bytes. */
static uint64_t fnv_mix(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t group_signature(const struct tide_plan *plan) {
    const tide_config_t *c = &plan->config;
    const int64_t fields[] = {c->nodes,
                              c->gpus_per_node,
                              c->wave_width,
                              c->round_width,
                              c->passes,
                              c->staging_slots,
                              (int64_t)c->mode,
                              c->sum_ctas,
                              c->landing_ctas,
                              c->multicast,
                              plan->geom.num_params,
                              (int64_t)plan->geom.ag_item,
                              (int64_t)plan->geom.grad_item,
                              (int64_t)plan->geom.cast};
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); ++i)
        h = fnv_mix(h, (uint64_t)fields[i]);
    for (int p = 0; p < plan->geom.num_params; ++p) {
        h = fnv_mix(h, plan->geom.params[p].dim0);
        h = fnv_mix(h, plan->geom.params[p].inner);
    }
    return fnv_mix(h, plan->arena.total_bytes);
}

static void group_free(struct tide_group *g) {
    for (int m = 0; m < TIDE_RS_MODE_COUNT; ++m)
        if (g->rs_compiled[m]) tide_program_free(&g->rs[m]);
    tide_program_free(&g->ag);
    tide_plan_destroy(g->plan);
    free(g);
}

static tide_result_t ensure_rs(struct tide_group *g, tide_rs_mode_t mode) {
    if (g->rs_compiled[mode]) return TIDE_SUCCESS;
    TIDE_CHECK(tide_program_compile_rs(g->plan, mode, &g->rs[mode]));
    g->rs_compiled[mode] = true;
    return TIDE_SUCCESS;
}

tide_result_t tide_group_register(tide_comm_t comm, const tide_config_t *config,
                                  const tide_group_desc_t *group, tide_group_t *group_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(comm != NULL, "group_register: comm is NULL");
    TIDE_ARG_CHECK(config != NULL && group != NULL, "group_register: config and group must be "
                                                    "non-NULL");
    TIDE_ARG_CHECK(group_out != NULL, "group_register: group_out is NULL");

    tide_result_t res;
    struct tide_group *g = calloc(1, sizeof(*g));
    if (g == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "group_register: out of host memory");
    g->comm = comm;
    TIDE_CHECK_GOTO(tide_plan_create(config, group, &g->plan), res, fail_group);
    const struct tide_plan *plan = g->plan;
    if (plan->topo.nodes != comm->topo.nodes ||
        plan->topo.gpus_per_node != comm->topo.gpus_per_node) {
        res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                       "group_register: config is for M = %d, L = %d, the communicator has "
                       "M = %d, L = %d",
                       plan->topo.nodes, plan->topo.gpus_per_node, comm->topo.nodes,
                       comm->topo.gpus_per_node);
        goto fail_plan;
    }
    if (!tide_ctr_fits(plan)) {
        res = TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                       "group_register: the programs need %llu counters, the arena has %d",
                       (unsigned long long)tide_ctr_count(plan), TIDE_ARENA_SIGNAL_SLOTS);
        goto fail_plan;
    }
    TIDE_CHECK_GOTO(tide_program_compile_ag(plan, &g->ag), res, fail_plan);
    TIDE_CHECK_GOTO(ensure_rs(g, plan->config.mode), res, fail_programs);
    TIDE_CHECK_GOTO(comm->ops->arena_create(comm->world, plan->arena.total_bytes,
                                            group_signature(plan), &g->arena),
                    res, fail_programs);
    g->poison = TIDE_SUCCESS;
    ++comm->live_groups;
    *group_out = g;
    return TIDE_SUCCESS;

fail_programs:
    for (int m = 0; m < TIDE_RS_MODE_COUNT; ++m)
        if (g->rs_compiled[m]) tide_program_free(&g->rs[m]);
    tide_program_free(&g->ag);
fail_plan:
    tide_plan_destroy(g->plan);
fail_group:
    free(g);
    return res;
}

tide_result_t tide_group_deregister(tide_group_t group) {
    tide_error_clear();
    TIDE_ARG_CHECK(group != NULL, "group_deregister: group is NULL");
    /* The memory goes whatever the handshake says: a peer that missed it keeps its own
     * reference to the shared memory until it deregisters too. */
    tide_result_t res = group->comm->ops->arena_destroy(group->arena);
    --group->comm->live_groups;
    group_free(group);
    return res;
}

tide_result_t tide_group_plan(tide_group_t group, tide_plan_t *plan_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(group != NULL, "group_plan: group is NULL");
    TIDE_ARG_CHECK(plan_out != NULL, "group_plan: plan_out is NULL");
    *plan_out = group->plan;
    return TIDE_SUCCESS;
}

tide_result_t tide_group_landing(tide_group_t group, int slot, void **ptr_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(group != NULL, "group_landing: group is NULL");
    TIDE_ARG_CHECK(slot == 0 || slot == 1, "group_landing: slot = %d, need 0 or 1", slot);
    TIDE_ARG_CHECK(ptr_out != NULL, "group_landing: ptr_out is NULL");
    return tide_bind_region(group->arena, group->plan, group->comm->rank,
                            slot == 0 ? TIDE_REGION_LANDING0 : TIDE_REGION_LANDING1, ptr_out);
}

tide_result_t tide_group_resident(tide_group_t group, void **ptr_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(group != NULL, "group_resident: group is NULL");
    TIDE_ARG_CHECK(ptr_out != NULL, "group_resident: ptr_out is NULL");
    if (group->plan->geom.cast)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "group_resident: a casting group (fp32 master -> bf16) all-gathers from "
                        "the fp32 shard; it has no resident region");
    return tide_bind_region(group->arena, group->plan, group->comm->rank, TIDE_REGION_RESIDENT,
                            ptr_out);
}

/* Fail-stop: after a call failed part-way the counters disagree between ranks. */
static tide_result_t check_usable(const struct tide_group *g, const char *call) {
    if (g->poison == TIDE_SUCCESS) return TIDE_SUCCESS;
    return TIDE_ERR(TIDE_ERR_FABRIC,
                    "%s: rank %d's group is unusable since an earlier call failed (%s): %s; "
                    "deregister it",
                    call, g->comm->rank, tide_get_error_string(g->poison), g->poison_msg);
}

/* Argument rejections happen before any op ran; everything else may have run part-way. */
static tide_result_t run(struct tide_group *g, const tide_program_t *prog, const tide_binding_t *b,
                         void *stream, uint64_t *calls) {
    tide_result_t res = g->comm->ops->execute(g->arena, prog, b, stream);
    if (res == TIDE_SUCCESS) {
        ++*calls;
    } else if (res != TIDE_ERR_INVALID_ARGUMENT && res != TIDE_ERR_UNSUPPORTED) {
        g->poison = res;
        snprintf(g->poison_msg, sizeof(g->poison_msg), "%s", tide_get_last_error());
    }
    return res;
}

tide_result_t tide_all_gather(tide_group_t group, const void *shard, int slot, void *stream) {
    tide_error_clear();
    TIDE_ARG_CHECK(group != NULL, "all_gather: group is NULL");
    TIDE_ARG_CHECK(slot == 0 || slot == 1, "all_gather: slot = %d, need 0 or 1", slot);
    TIDE_CHECK(check_usable(group, "all_gather"));
    tide_binding_t b = {0};
    TIDE_CHECK(tide_bind_shard(group->plan, group->arena, shard, &b.shard));
    b.plan = group->plan;
    b.arena = group->arena;
    b.rank = group->comm->rank;
    b.slot = slot;
    b.epoch = group->ag_calls;
    return run(group, &group->ag, &b, stream, &group->ag_calls);
}

tide_result_t tide_reduce_scatter(tide_group_t group, const void *const *grads, float *out,
                                  float alpha, int accumulate, tide_rs_mode_t mode, void *stream) {
    tide_error_clear();
    TIDE_ARG_CHECK(group != NULL, "reduce_scatter: group is NULL");
    TIDE_ARG_CHECK(grads != NULL, "reduce_scatter: grads is NULL");
    TIDE_ARG_CHECK(out != NULL, "reduce_scatter: out is NULL");
    TIDE_ARG_CHECK(mode == TIDE_RS_IN_PLACE || mode == TIDE_RS_SLOT_REUSE,
                   "reduce_scatter: mode = %d is not a tide_rs_mode_t", (int)mode);
    for (int p = 0; p < group->plan->geom.num_params; ++p)
        TIDE_ARG_CHECK(grads[p] != NULL, "reduce_scatter: grads[%d] is NULL", p);
    TIDE_CHECK(check_usable(group, "reduce_scatter"));
    /* A mode the group was not registered with is compiled on first use; its failure (e.g.
     * an outbox the arena cannot hold) leaves the group usable in the other mode. */
    TIDE_CHECK(ensure_rs(group, mode));
    tide_binding_t b = {0};
    b.plan = group->plan;
    b.arena = group->arena;
    b.rank = group->comm->rank;
    b.epoch = group->rs_calls;
    b.grads = grads;
    b.out = out;
    b.alpha = alpha;
    b.accumulate = accumulate != 0;
    return run(group, &group->rs[mode], &b, stream, &group->rs_calls);
}

float tide_alpha_avg(int ranks) {
    /* No error channel in a float: an invalid count gives NaN, which the output shows. */
    return ranks >= 1 ? 1.0f / (float)ranks : NAN;
}

float tide_alpha_divide(float predivide, float postdivide) {
    /* FSDP2 divides before and after the reduction; folded, that is one scale of
     * 1 / (pre post), formed in double so the only rounding is the final one. */
    return (float)(1.0 / ((double)predivide * (double)postdivide));
}
