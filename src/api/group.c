/*
 * group.c - parameter groups and the collectives: register (plan, compile, allocate arenas),
 * bind a call's operands, hand the rank's program to the fabric (tide.h).
 */
#include "core/checks.h"
#include "api/comm.h"
#include "core/handles.h"
#include "fabric/call_table.h"
#include "program/counters.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FNV-1a over the fields that decide the arena and the programs, so that ranks that
 * registered different groups are told so instead of exchanging misplaced bytes. */
static uint64_t fnv_mix(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t tide_plan_signature(const struct tide_plan *plan) {
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
    tide_handle_release(g, TIDE_HANDLE_GROUP, sizeof(*g));
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
    TIDE_CHECK(tide_handle_check(comm, TIDE_HANDLE_COMM, "group_register"));
    TIDE_ARG_CHECK(config != NULL && group != NULL, "group_register: config and group must be "
                                                    "non-NULL");
    TIDE_ARG_CHECK(group_out != NULL, "group_register: group_out is NULL");
    /* The communicator owns the topology: nodes = gpus_per_node = 0 take its values. */
    tide_config_t cfg;
    TIDE_ARG_CHECK(config->size == sizeof(cfg),
                   "group_register: config->size = %zu, expected %zu (initialise it with "
                   "TIDE_CONFIG_INIT)",
                   config->size, sizeof(cfg));
    memcpy(&cfg, config, sizeof(cfg));
    TIDE_ARG_CHECK((cfg.nodes == 0) == (cfg.gpus_per_node == 0),
                   "group_register: config nodes = %d, gpus_per_node = %d: give both, or 0 for "
                   "both to take the communicator's topology",
                   cfg.nodes, cfg.gpus_per_node);
    if (cfg.nodes == 0) {
        cfg.nodes = comm->topo.nodes;
        cfg.gpus_per_node = comm->topo.gpus_per_node;
    }

    TIDE_CHECK(tide_comm_resolve_lane(comm, "group_register", &cfg));

    tide_result_t res;
    struct tide_group *g = calloc(1, sizeof(*g));
    if (g == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "group_register: out of host memory");
    g->comm = comm;
    TIDE_CHECK_GOTO(tide_plan_create(&cfg, group, &g->plan), res, fail_group);
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
                                            tide_plan_signature(plan), &g->arena),
                    res, fail_programs);
    res = tide_handle_add(g, TIDE_HANDLE_GROUP);
    if (res != TIDE_SUCCESS) {
        comm->ops->arena_destroy(g->arena);
        goto fail_programs;
    }
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
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, "group_deregister"));
    if (group->set != NULL) return tide_set_group_release(group);
    /* The memory goes whatever the handshake says: a peer that missed it keeps its own
     * reference to the shared memory until it deregisters too. */
    tide_result_t res = group->comm->ops->arena_destroy(group->arena);
    --group->comm->live_groups;
    group_free(group);
    return res;
}

tide_result_t tide_group_plan(tide_group_t group, tide_plan_t *plan_out) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, "group_plan"));
    TIDE_ARG_CHECK(plan_out != NULL, "group_plan: plan_out is NULL");
    *plan_out = group->plan;
    return TIDE_SUCCESS;
}

tide_result_t tide_group_landing(tide_group_t group, int slot, void **ptr_out) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, "group_landing"));
    TIDE_ARG_CHECK(slot == 0 || slot == 1, "group_landing: slot = %d, need 0 or 1", slot);
    TIDE_ARG_CHECK(ptr_out != NULL, "group_landing: ptr_out is NULL");
    TIDE_ARG_CHECK(group->set == NULL || slot == 0,
                   "group_landing: group \"%s\" is on a shared arena and has one landing, its "
                   "ring slot: pass slot 0",
                   group->name);
    return tide_bind_region(group->arena, group->plan, group->comm->rank,
                            slot == 0 ? TIDE_REGION_LANDING0 : TIDE_REGION_LANDING1, ptr_out);
}

tide_result_t tide_group_resident(tide_group_t group, void **ptr_out) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, "group_resident"));
    TIDE_ARG_CHECK(ptr_out != NULL, "group_resident: ptr_out is NULL");
    if (group->plan->geom.cast)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "group_resident: a casting group (fp32 master -> bf16) all-gathers from "
                        "the fp32 shard; it has no resident region");
    return tide_bind_region(group->arena, group->plan, group->comm->rank, TIDE_REGION_RESIDENT,
                            ptr_out);
}

bool tide_group_unusable(const struct tide_group *g, const char *call, char *buf, size_t size) {
    if (g->set != NULL && g->set->poison != TIDE_SUCCESS) {
        snprintf(buf, size,
                 "%s: rank %d's groups on this shared arena are unusable since an earlier call "
                 "failed (%s): %s; deregister them",
                 call, g->comm->rank, tide_get_error_string(g->set->poison), g->set->poison_msg);
        return true;
    }
    if (g->poison == TIDE_SUCCESS) return false;
    snprintf(buf, size,
             "%s: rank %d's group is unusable since an earlier call failed (%s): %s; deregister "
             "it",
             call, g->comm->rank, tide_get_error_string(g->poison), g->poison_msg);
    return true;
}

/* Fail-stop: after a call failed part-way the counters disagree between ranks. */
static tide_result_t check_usable(const struct tide_group *g, const char *call) {
    char why[1200];
    if (!tide_group_unusable(g, call, why, sizeof(why))) return TIDE_SUCCESS;
    return TIDE_ERR(TIDE_ERR_FABRIC, "%s", why);
}

void tide_group_call_use(const struct tide_group *g, tide_call_kind_t kind, tide_set_use_t *use) {
    memset(use, 0, sizeof(*use));
    use->landing = -1;
    if (g->set == NULL) return;
    if (kind == TIDE_CALL_ALL_GATHER) {
        use->landing = tide_set_landing(g);
        use->recv = g->plan->arena.regions[TIDE_REGION_RECV_STAGE].bytes > 0;
        use->takes_slot = true;
        return;
    }
    use->rs = true;
    if (kind == TIDE_CALL_REDUCE_SCATTER_STAGED) {
        /* Gradients staged in the group's own ring slot end its occupancy. */
        use->landing = tide_set_landing(g);
        use->frees_slot = true;
    }
}

/* ------------------------------------------------------------------ the ranks agree */

/*
 * The arguments every rank of a call must pass alike, packed so that a mismatch message can
 * say what differs: AG the landing slot; RS alpha's bits, the mode and accumulate.
 */
/* Groups of a set share the arena's records, so their signatures also carry the group's
 * set index + 1 (0 for a group alone): a rank that calls another group is told so. */
static uint64_t member_bits(const struct tide_group *g) {
    return g->set != NULL ? (uint64_t)(g->set_index + 1) : 0;
}

static uint64_t ag_signature(const struct tide_group *g, int slot) {
    return member_bits(g) << 8 | (uint64_t)slot;
}

static uint64_t rs_signature(const struct tide_group *g, float alpha, int accumulate,
                             tide_rs_mode_t mode) {
    uint32_t bits;
    memcpy(&bits, &alpha, sizeof(bits));
    return (uint64_t)bits << 32 | member_bits(g) << 2 | (uint64_t)mode << 1 |
           (uint64_t)(accumulate != 0);
}

/* Exchange and compare the call's signature where the fabric can (fabric.h, call_check). */
static tide_result_t agree(struct tide_group *g, tide_collective_t coll, uint64_t sig,
                           const char *call) {
    const struct tide_fabric_ops *ops = g->comm->ops;
    if (ops->call_check == NULL) return TIDE_SUCCESS;
    int other = -1;
    uint64_t other_sig = 0;
    /* The check's own sequence advances with every exchange, so that a call refused later
     * (before any op ran) never posts the same sequence number twice. */
    uint64_t *seq = g->set != NULL ? &g->set->checks[coll] : &g->checks[coll];
    /* A set's sequence is the parent arena's (its groups may run on views of it). */
    TIDE_CHECK(ops->call_check(g->set != NULL ? g->set->arena : g->arena, coll, (*seq)++, sig,
                               &other, &other_sig));
    if (other < 0) return TIDE_SUCCESS;
    char mine[128], theirs[128];
    tide_call_describe(coll, sig, mine, sizeof(mine));
    tide_call_describe(coll, other_sig, theirs, sizeof(theirs));
    return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                    "%s: the ranks disagree on the call: rank %d passed %s, rank %d passed %s "
                    "(every rank must pass the same arguments to a collective)",
                    call, g->comm->rank, mine, other, theirs);
}

/* ------------------------------------------------------------------ operands */

static bool overlaps(const void *a, uint64_t a_bytes, const void *b, uint64_t b_bytes) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

/*
 * An operand must not alias any rank's arena, which the call itself writes (or peers write
 * into), except inside this rank's region `allowed` (TIDE_REGION_COUNT: none), which the
 * call only reads: the resident shard for the all-gather, the landing slots for Slot-Reuse
 * gradients.  The landing slots count as one allowance (LANDING0 stands for both).
 */
static tide_result_t check_outside_arena(const struct tide_group *g, const void *ptr,
                                         uint64_t bytes, tide_region_t allowed, const char *what,
                                         const char *call) {
    const struct tide_fabric_arena *a = g->arena;
    const struct tide_plan *plan = g->plan;
    const int me = g->comm->rank;
    for (int r = 0; r < a->world->ranks; ++r) {
        if (!overlaps(ptr, bytes, a->bases[r], a->bytes)) continue;
        if (r == me && allowed != TIDE_REGION_COUNT) {
            uint64_t lo = plan->arena.regions[allowed].offset, hi;
            if (allowed == TIDE_REGION_LANDING0 && g->set != NULL)
                hi = lo + plan->arena.regions[TIDE_REGION_LANDING0].bytes; /* one landing */
            else if (allowed == TIDE_REGION_LANDING0)
                hi = plan->arena.regions[TIDE_REGION_LANDING1].offset +
                     plan->arena.regions[TIDE_REGION_LANDING1].bytes;
            else
                hi = lo + plan->arena.regions[allowed].bytes;
            const uintptr_t p = (uintptr_t)ptr, base = (uintptr_t)a->bases[r];
            if (p >= base + lo && p + bytes <= base + hi) continue;
        }
        void *slot0 = NULL, *slot1 = NULL;
        tide_bind_region(a, plan, r, TIDE_REGION_LANDING0, &slot0);
        tide_bind_region(a, plan, r, TIDE_REGION_LANDING1, &slot1);
        const uint64_t l1 = plan->arena.regions[TIDE_REGION_LANDING1].bytes;
        const char *region = overlaps(ptr, bytes, slot0, plan->geom.group_bytes) ? "landing slot 0"
                             : overlaps(ptr, bytes, slot1, l1)                    ? "landing slot 1"
                                                                                  : "arena";
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "%s: %s [%p, +%llu bytes) overlaps rank %d's %s, which the call writes",
                        call, what, ptr, (unsigned long long)bytes, r, region);
    }
    return TIDE_SUCCESS;
}

/* Bytes of parameter p's gradient: D_p K_p b_grad (bounded by the geometry's checks). */
static uint64_t grad_bytes_of(const struct tide_plan *plan, int p) {
    const tide_geom_param_t *q = &plan->geom.params[p];
    return q->dim0 * q->inner * (uint64_t)plan->geom.grad_item;
}

/* alpha must be a finite, normal fp32 number (tide.h, tide_reduce_scatter). */
static tide_result_t check_alpha(float alpha, const char *call) {
    if (fpclassify(alpha) == FP_NORMAL) return TIDE_SUCCESS;
    const char *why = isnan(alpha)       ? "NaN"
                      : isinf(alpha)     ? "infinite (a value beyond 3.4e38 rounds to Inf in fp32)"
                      : alpha == 0.0f    ? "zero (it would discard every gradient)"
                                         : "subnormal in fp32 (below 1.18e-38: its products "
                                           "lose precision, and flush to zero on some devices)";
    return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "%s: alpha = %g is %s; alpha must be a finite, "
                    "normal fp32 number", call, (double)alpha, why);
}

/* ------------------------------------------------------------------ running a call */

static void poison(struct tide_group *g, tide_result_t res) {
    g->poison = res;
    snprintf(g->poison_msg, sizeof(g->poison_msg), "%s", tide_get_last_error());
}

/* Ranks that disagree (or never make the call) leave the group unusable on every rank
 * (fail-stop).  Argument rejections of execute happen before any op ran; everything else
 * may have run part-way. */
static void poison_set(struct tide_group *g, tide_result_t res) {
    if (g->set == NULL || g->set->poison != TIDE_SUCCESS) return;
    g->set->poison = res;
    snprintf(g->set->poison_msg, sizeof(g->set->poison_msg), "group \"%s\": %s", g->name,
             tide_get_last_error());
}

/* use: what a set group's call touches (NULL for a group alone): the ring rule is checked
 * first (nothing has moved), then whether a capture could hold the call, and the fence runs
 * after the ranks agreed on the call.  ran_bit: the program's TIDE_RAN_* bit, `what` its name
 * in a refusal. */
static tide_result_t run(struct tide_group *g, const tide_program_t *prog, const tide_binding_t *b,
                         void *stream, uint64_t *calls, uint64_t sig, const char *call,
                         const tide_set_use_t *use, uint32_t ran_bit, const char *what) {
    if (use != NULL) TIDE_CHECK(tide_set_ring_check(g, use, call));
    TIDE_CHECK(tide_capture_precheck(g, prog, ran_bit, what, use, stream, call));
    tide_result_t res = agree(g, prog->coll, sig, call);
    if (res != TIDE_SUCCESS) {
        poison(g, res);
        poison_set(g, res);
        return res;
    }
    if (use != NULL) {
        res = tide_set_fence(g, use, stream);
        /* A fence the fabric refused (TIDE_ERR_UNSUPPORTED, say an eager call on a set whose
         * calls were captured into a CUDA graph) enqueued nothing on any rank, as a refused
         * call: the set stays usable. */
        if (res != TIDE_SUCCESS && res != TIDE_ERR_INVALID_ARGUMENT &&
            res != TIDE_ERR_UNSUPPORTED) {
            poison(g, res);
            poison_set(g, res);
        }
        if (res != TIDE_SUCCESS) return res;
    }
    res = g->comm->ops->execute(g->arena, prog, b, stream);
    if (res == TIDE_SUCCESS) {
        ++*calls;
        g->ran |= ran_bit;
        if (use != NULL) tide_set_note_call(g, use);
    } else if (res != TIDE_ERR_INVALID_ARGUMENT && res != TIDE_ERR_UNSUPPORTED) {
        poison(g, res);
        poison_set(g, res);
    }
    return res;
}

static tide_result_t all_gather(tide_group_t group, const void *shard, int slot, void *stream,
                                const char *call) {
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, call));
    TIDE_ARG_CHECK(slot == 0 || slot == 1, "%s: slot = %d, need 0 or 1", call, slot);
    TIDE_ARG_CHECK(group->set == NULL || slot == 0,
                   "%s: group \"%s\" is on a shared arena and lands in its ring slot: pass "
                   "slot 0 (slot = %d)",
                   call, group->name, slot);
    TIDE_CHECK(check_usable(group, call));
    if (shard != NULL)
        TIDE_CHECK(check_outside_arena(group, shard, tide_bind_shard_bytes(group->plan),
                                       TIDE_REGION_RESIDENT, "shard", call));
    tide_binding_t b = {0};
    TIDE_CHECK(tide_bind_shard(group->plan, group->arena, shard, &b.shard));
    b.plan = group->plan;
    b.arena = group->arena;
    b.rank = group->comm->rank;
    b.slot = slot;
    b.epoch = group->ag_calls;
    tide_set_use_t use;
    tide_group_call_use(group, TIDE_CALL_ALL_GATHER, &use);
    return run(group, &group->ag, &b, stream, &group->ag_calls, ag_signature(group, slot), call,
               group->set != NULL ? &use : NULL, TIDE_RAN_AG, "all-gather");
}

tide_result_t tide_all_gather(tide_group_t group, const void *shard, int slot, void *stream) {
    tide_error_clear();
    return all_gather(group, shard, slot, stream, "all_gather");
}

tide_result_t tide_all_gather_checked(tide_group_t group, const void *shard, uint64_t shard_bytes,
                                      int slot, void *stream) {
    tide_error_clear();
    const char *call = "all_gather_checked";
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, call));
    const uint64_t want = tide_bind_shard_bytes(group->plan);
    if (shard == NULL)
        TIDE_ARG_CHECK(shard_bytes == 0,
                       "%s: shard is NULL (read the resident region) but shard_bytes = %llu; "
                       "pass 0",
                       call, (unsigned long long)shard_bytes);
    else
        TIDE_ARG_CHECK(shard_bytes == want,
                       "%s: shard_bytes = %llu, the group's shard is %llu bytes (%s)", call,
                       (unsigned long long)shard_bytes, (unsigned long long)want,
                       group->plan->geom.cast ? "the fp32 master shard, 4 sum R_p K_p"
                                              : "S = sum_p R_p K_p b_ag");
    return all_gather(group, shard, slot, stream, call);
}

static tide_result_t reduce_scatter(tide_group_t group, const void *const *grads, float *out,
                                    float alpha, int accumulate, tide_rs_mode_t mode,
                                    void *stream, const char *call) {
    TIDE_ARG_CHECK(grads != NULL, "%s: grads is NULL", call);
    TIDE_ARG_CHECK(out != NULL, "%s: out is NULL", call);
    TIDE_ARG_CHECK(mode == TIDE_RS_IN_PLACE || mode == TIDE_RS_SLOT_REUSE,
                   "%s: mode = %d is not a tide_rs_mode_t", call, (int)mode);
    TIDE_CHECK(check_alpha(alpha, call));
    const struct tide_plan *plan = group->plan;
    const uint64_t out_bytes = plan->geom.fp32_shard_bytes;
    TIDE_CHECK(check_outside_arena(group, out, out_bytes, TIDE_REGION_COUNT, "out", call));
    for (int p = 0; p < plan->geom.num_params; ++p) {
        TIDE_ARG_CHECK(grads[p] != NULL, "%s: grads[%d] is NULL", call, p);
        const uint64_t gb = grad_bytes_of(plan, p);
        TIDE_ARG_CHECK(!overlaps(grads[p], gb, out, out_bytes),
                       "%s: grads[%d] overlaps out (the output is written while gradients are "
                       "read)",
                       call, p);
        char what[32];
        snprintf(what, sizeof(what), "grads[%d]", p);
        TIDE_CHECK(check_outside_arena(group, grads[p], gb, TIDE_REGION_LANDING0, what, call));
    }
    /* Slot-Reuse on a shared arena: gradients staged in the group's own ring slot (the only
     * part of the arena check_outside_arena lets them be in) end its occupancy. */
    bool staged = false;
    if (group->set != NULL) {
        void *slot = NULL;
        TIDE_CHECK(tide_bind_region(group->arena, plan, group->comm->rank, TIDE_REGION_LANDING0,
                                    &slot));
        for (int p = 0; p < plan->geom.num_params; ++p)
            staged = staged || overlaps(grads[p], grad_bytes_of(plan, p), slot,
                                        plan->arena.regions[TIDE_REGION_LANDING0].bytes);
    }
    tide_set_use_t use;
    tide_group_call_use(group, staged ? TIDE_CALL_REDUCE_SCATTER_STAGED : TIDE_CALL_REDUCE_SCATTER,
                        &use);
    TIDE_CHECK(check_usable(group, call));
    /* A mode the group was not registered with is compiled on first use; its failure (e.g.
     * an outbox the arena cannot hold) leaves the group usable in the other mode. */
    TIDE_CHECK(ensure_rs(group, mode));
    tide_binding_t b = {0};
    b.plan = plan;
    b.arena = group->arena;
    b.rank = group->comm->rank;
    b.epoch = group->rs_calls;
    b.grads = grads;
    b.out = out;
    b.alpha = alpha;
    b.accumulate = accumulate != 0;
    return run(group, &group->rs[mode], &b, stream, &group->rs_calls,
               rs_signature(group, alpha, accumulate, mode), call,
               group->set != NULL ? &use : NULL, TIDE_RAN_RS(mode),
               mode == TIDE_RS_IN_PLACE ? "In-Place reduce-scatter" : "Slot-Reuse reduce-scatter");
}

tide_result_t tide_reduce_scatter(tide_group_t group, const void *const *grads, float *out,
                                  float alpha, int accumulate, tide_rs_mode_t mode, void *stream) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, "reduce_scatter"));
    return reduce_scatter(group, grads, out, alpha, accumulate, mode, stream, "reduce_scatter");
}

tide_result_t tide_reduce_scatter_checked(tide_group_t group, const void *const *grads,
                                          const uint64_t *grad_bytes, int num_grads, float *out,
                                          uint64_t out_bytes, float alpha, int accumulate,
                                          void *stream) {
    tide_error_clear();
    const char *call = "reduce_scatter_checked";
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, call));
    const struct tide_plan *plan = group->plan;
    TIDE_ARG_CHECK(num_grads == plan->geom.num_params, "%s: num_grads = %d, the group has P = %d",
                   call, num_grads, plan->geom.num_params);
    TIDE_ARG_CHECK(grads != NULL && grad_bytes != NULL, "%s: grads and grad_bytes must be non-NULL",
                   call);
    for (int p = 0; p < num_grads; ++p)
        TIDE_ARG_CHECK(grad_bytes[p] == grad_bytes_of(plan, p),
                       "%s: grad_bytes[%d] = %llu, parameter %d's gradient is D_p K_p b_grad = "
                       "%llu x %llu x %zu = %llu bytes",
                       call, p, (unsigned long long)grad_bytes[p], p,
                       (unsigned long long)plan->geom.params[p].dim0,
                       (unsigned long long)plan->geom.params[p].inner, plan->geom.grad_item,
                       (unsigned long long)grad_bytes_of(plan, p));
    TIDE_ARG_CHECK(out_bytes == plan->geom.fp32_shard_bytes,
                   "%s: out_bytes = %llu, the fp32 output shard is S_fp32 = %llu bytes", call,
                   (unsigned long long)out_bytes,
                   (unsigned long long)plan->geom.fp32_shard_bytes);
    return reduce_scatter(group, grads, out, alpha, accumulate, plan->config.mode, stream, call);
}

/* ------------------------------------------------------------------ events */

tide_result_t tide_group_read_done_event(tide_group_t group, void **event_out) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, "group_read_done_event"));
    TIDE_ARG_CHECK(event_out != NULL, "group_read_done_event: event_out is NULL");
    const struct tide_fabric_ops *ops = group->comm->ops;
    if (ops->kind == TIDE_FABRIC_CPU) {
        *event_out = NULL; /* the call returned after its read-done point */
        return TIDE_SUCCESS;
    }
#ifdef TIDE_HAVE_CUDA
    if (ops == &tide_fabric_cuda_ops)
        return tide_cuda_read_done_event(group->arena, group->comm->rank, event_out);
    if (tide_cuda_mp_is(group->arena)) return tide_cuda_mp_read_done_event(group->arena, event_out);
#endif
    return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                    "group_read_done_event: the %s fabric does not expose the read-done event "
                    "yet (the CPU and CUDA fabrics and the NCCL fabric do)",
                    ops->name);
}

/* ------------------------------------------------------------------ alpha */

float tide_alpha_avg(int ranks) {
    /* No error channel in a float: an invalid count gives NaN (which tide_reduce_scatter
     * refuses) and records why for tide_get_last_error. */
    tide_error_clear();
    if (ranks >= 1) return 1.0f / (float)ranks;
    TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "alpha_avg: ranks = %d, need >= 1; returning NaN", ranks);
    return NAN;
}

float tide_alpha_divide(float predivide, float postdivide) {
    /* FSDP2 divides before and after the reduction; folded, that is one scale of
     * 1 / (pre post), formed in double so the only rounding is the final one. */
    tide_error_clear();
    if (!isfinite(predivide) || !isfinite(postdivide) || predivide == 0.0f || postdivide == 0.0f) {
        TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                 "alpha_divide: predivide = %g, postdivide = %g: divide factors must be finite "
                 "and nonzero; returning NaN",
                 (double)predivide, (double)postdivide);
        return NAN;
    }
    const float alpha = (float)(1.0 / ((double)predivide * (double)postdivide));
    if (fpclassify(alpha) != FP_NORMAL) {
        TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                 "alpha_divide: 1 / (%g x %g) = %g is not a normal fp32 number; returning NaN",
                 (double)predivide, (double)postdivide, (double)alpha);
        return NAN;
    }
    return alpha;
}
