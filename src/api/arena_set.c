/*
 * arena_set.c - groups registered together on one arena (docs/arena.md): registration and
 * release of a set, the ring rules, and when a call needs the cross-group fence.
 *
 * Every rank makes the same calls in the same order (they are collectives), so the state
 * kept here -- who holds each landing, who used each shared region last -- evolves alike on
 * every rank, and every rank takes the same decisions (refuse, fence) without talking.
 */
#include "core/checks.h"
#include "api/comm.h"
#include "core/handles.h"
#include "plan/arena_plan.h"
#include "program/counters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ the ring */

int tide_set_landing(const struct tide_group *g) {
    const int slot = g->set->ap->groups[g->set_index].ring_slot;
    return slot >= 0 ? slot : 2 + g->set_index;
}

static const char *landing_name(const struct tide_arena_set *set, int res, char *buf, size_t size) {
    if (res < 2)
        snprintf(buf, size, "ring slot %d", res);
    else
        snprintf(buf, size, "own slot of \"%s\"", set->ap->groups[res - 2].name);
    return buf;
}

tide_result_t tide_set_ring_check(const struct tide_group *g, const tide_set_use_t *use,
                                  const char *call) {
    const struct tide_arena_set *set = g->set;
    if (use->landing < 0) return TIDE_SUCCESS;
    const int holder = set->occupant[use->landing];
    if (!set->live[use->landing] || holder == g->set_index) return TIDE_SUCCESS;
    char where[TIDE_GROUP_NAME_MAX + 32];
    landing_name(set, use->landing, where, sizeof(where));
    const char *holder_name = set->ap->groups[holder].name;
    if (use->takes_slot)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "%s: group \"%s\" cannot all-gather into %s: group \"%s\" still holds it "
                        "live (gathered, not yet resharded with tide_group_reshard nor released "
                        "by its Slot-Reuse reduce-scatter); the ring cannot serve this call order",
                        call, g->name, where, holder_name);
    return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                    "%s: group \"%s\" reads gradients staged in %s, which group \"%s\" holds "
                    "live: the staging overwrote that group's unsharded parameters",
                    call, g->name, where, holder_name);
}

/* ------------------------------------------------------------------ the fence */

static bool used_by_other(const struct tide_arena_set *set, int res, int me) {
    return set->last_user[res] >= 0 && set->last_user[res] != me;
}

int tide_set_fence_variant(const struct tide_group *g, const tide_set_use_t *use) {
    const struct tide_arena_set *set = g->set;
    const int me = g->set_index;
    const bool rs_handover = use->rs && used_by_other(set, TIDE_SET_RES_RS(set), me);
    const bool need = rs_handover || (use->landing >= 0 && used_by_other(set, use->landing, me)) ||
                      (use->recv && used_by_other(set, TIDE_SET_RES_RECV(set), me));
    return need ? (int)rs_handover : -1;
}

tide_result_t tide_set_fence(struct tide_group *g, const tide_set_use_t *use, void *stream) {
    const int variant = tide_set_fence_variant(g, use);
    if (variant < 0) return TIDE_SUCCESS;
    tide_binding_t b = {0};
    b.plan = g->plan;
    b.arena = g->arena;
    b.rank = g->comm->rank;
    b.epoch = g->fences;
    /* On the group's view where the fabric makes views: the fence's call state is the
     * group's (its counter is the group's TIDE_CTR_FENCE). */
    TIDE_CHECK(g->comm->ops->execute(g->arena, &g->fence[variant], &b, stream));
    ++g->fences;
    g->ran |= TIDE_RAN_FENCE(variant);
    return TIDE_SUCCESS;
}

void tide_set_note_call(struct tide_group *g, const tide_set_use_t *use) {
    struct tide_arena_set *set = g->set;
    const int me = g->set_index;
    if (use->landing >= 0) {
        set->last_user[use->landing] = me;
        if (use->takes_slot) {
            set->occupant[use->landing] = me;
            set->live[use->landing] = true;
        }
        if (use->frees_slot && set->occupant[use->landing] == me) set->live[use->landing] = false;
    }
    if (use->recv) set->last_user[TIDE_SET_RES_RECV(set)] = me;
    if (use->rs) set->last_user[TIDE_SET_RES_RS(set)] = me;
}

tide_result_t tide_group_reshard(tide_group_t group) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, "group_reshard"));
    struct tide_arena_set *set = group->set;
    if (set == NULL) return TIDE_SUCCESS; /* a group alone has no ring */
    const int res = tide_set_landing(group);
    if (set->occupant[res] != group->set_index || !set->live[res]) {
        char where[TIDE_GROUP_NAME_MAX + 32];
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "group_reshard: group \"%s\" does not hold %s (%s)", group->name,
                        landing_name(set, res, where, sizeof(where)),
                        set->occupant[res] == group->set_index ? "already resharded or released"
                                                               : "not gathered into it since");
    }
    set->live[res] = false;
    return TIDE_SUCCESS;
}

tide_result_t tide_group_slot_live(tide_group_t group, int *live_out) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, "group_slot_live"));
    TIDE_ARG_CHECK(live_out != NULL, "group_slot_live: live_out is NULL");
    const struct tide_arena_set *set = group->set;
    if (set == NULL) {
        *live_out = 0;
        return TIDE_SUCCESS;
    }
    const int res = tide_set_landing(group);
    *live_out = set->live[res] && set->occupant[res] == group->set_index;
    return TIDE_SUCCESS;
}

tide_result_t tide_group_name(tide_group_t group, const char **name_out) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, "group_name"));
    TIDE_ARG_CHECK(name_out != NULL, "group_name: name_out is NULL");
    *name_out = group->name;
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ register / release */

/* FNV-1a of everything the ranks must agree on: each group's plan signature and ring slot. */
static uint64_t set_signature(const struct tide_arena_plan *ap) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < ap->num_groups; ++i) {
        const uint64_t v[3] = {tide_plan_signature(ap->groups[i].plan),
                               (uint64_t)(int64_t)ap->groups[i].ring_slot, ap->layout.total_bytes};
        for (int k = 0; k < 3; ++k)
            for (int b = 0; b < 8; ++b) {
                h ^= (v[k] >> (8 * b)) & 0xff;
                h *= 0x100000001b3ull;
            }
    }
    return h;
}

static void set_free(struct tide_arena_set *set) {
    if (set == NULL) return;
    tide_arena_plan_destroy(set->ap);
    free(set->groups);
    free(set->occupant);
    free(set->live);
    free(set->last_user);
    free(set);
}

static void member_free(struct tide_group *g) {
    for (int m = 0; m < TIDE_RS_MODE_COUNT; ++m)
        if (g->rs_compiled[m]) tide_program_free(&g->rs[m]);
    tide_program_free(&g->ag);
    tide_program_free(&g->fence[0]);
    tide_program_free(&g->fence[1]);
}

/* Compile one group's programs (AG, its RS mode, the fence). */
static tide_result_t member_init(struct tide_group *g) {
    const struct tide_plan *plan = g->plan;
    if (!tide_ctr_fits(plan))
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "groups_register: group \"%s\": the programs need %llu counters, the "
                        "arena has %d",
                        g->name, (unsigned long long)tide_ctr_count(plan), TIDE_ARENA_SIGNAL_SLOTS);
    tide_result_t res;
    TIDE_CHECK(tide_program_compile_ag(plan, &g->ag));
    TIDE_CHECK_GOTO(tide_program_compile_rs(plan, plan->config.mode, &g->rs[plan->config.mode]),
                    res, fail);
    g->rs_compiled[plan->config.mode] = true;
    TIDE_CHECK_GOTO(tide_program_compile_fence(plan, false, &g->fence[0]), res, fail);
    TIDE_CHECK_GOTO(tide_program_compile_fence(plan, true, &g->fence[1]), res, fail);
    return TIDE_SUCCESS;
fail:
    member_free(g);
    return res;
}

/* Resolve nodes = gpus_per_node = 0 to the communicator's topology, per entry. */
static tide_result_t resolve_entries(const struct tide_comm *comm, int n,
                                     const tide_group_entry_t *entries, tide_config_t *cfgs,
                                     tide_group_entry_t *out) {
    for (int i = 0; i < n; ++i) {
        const tide_config_t *c = entries[i].config;
        TIDE_ARG_CHECK(c != NULL && entries[i].group != NULL,
                       "groups_register: entry %d: config and group must be non-NULL", i);
        TIDE_ARG_CHECK(c->size == sizeof(tide_config_t),
                       "groups_register: entry %d: config->size = %zu, expected %zu (initialise "
                       "it with TIDE_CONFIG_INIT)",
                       i, c->size, sizeof(tide_config_t));
        cfgs[i] = *c;
        TIDE_ARG_CHECK((c->nodes == 0) == (c->gpus_per_node == 0),
                       "groups_register: entry %d: nodes = %d, gpus_per_node = %d: give both, "
                       "or 0 for both to take the communicator's topology",
                       i, c->nodes, c->gpus_per_node);
        if (c->nodes == 0) {
            cfgs[i].nodes = comm->topo.nodes;
            cfgs[i].gpus_per_node = comm->topo.gpus_per_node;
        }
        TIDE_ARG_CHECK(
            cfgs[i].nodes == comm->topo.nodes && cfgs[i].gpus_per_node == comm->topo.gpus_per_node,
            "groups_register: entry %d is for M = %d, L = %d, the communicator has "
            "M = %d, L = %d",
            i, cfgs[i].nodes, cfgs[i].gpus_per_node, comm->topo.nodes, comm->topo.gpus_per_node);
        char who[48];
        snprintf(who, sizeof(who), "groups_register: entry %d", i);
        TIDE_CHECK(tide_comm_resolve_lane(comm, who, &cfgs[i]));
        out[i] = entries[i];
        out[i].config = &cfgs[i];
    }
    return TIDE_SUCCESS;
}

/* Each group's arena: a view of the set's (GPU fabrics), or the set's arena itself (CPU). */
static void views_destroy(struct tide_arena_set *set, int count) {
    for (int i = 0; i < count; ++i) {
        struct tide_group *g = set->groups[i];
        if (g->arena != NULL && g->arena != set->arena) set->comm->ops->arena_destroy(g->arena);
        g->arena = NULL;
    }
}

static tide_result_t views_create(struct tide_arena_set *set) {
    const struct tide_fabric_ops *ops = set->comm->ops;
    for (int i = 0; i < set->num_groups; ++i) {
        struct tide_group *g = set->groups[i];
        if (ops->arena_view_create == NULL) {
            g->arena = set->arena;
            continue;
        }
        const tide_result_t res = ops->arena_view_create(
            set->arena, tide_plan_signature(set->ap->groups[i].plan), &g->arena);
        if (res != TIDE_SUCCESS) {
            views_destroy(set, i);
            return res;
        }
    }
    return TIDE_SUCCESS;
}

static tide_result_t set_alloc(struct tide_comm *comm, int n, struct tide_arena_set **set_out) {
    struct tide_arena_set *set = calloc(1, sizeof(*set));
    if (set == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "groups_register: out of host memory");
    set->comm = comm;
    set->num_groups = n;
    set->groups = calloc((size_t)n, sizeof(*set->groups));
    set->occupant = malloc((size_t)(n + 2) * sizeof(int));
    set->live = calloc((size_t)(n + 2), sizeof(bool));
    set->last_user = malloc((size_t)(n + 4) * sizeof(int));
    if (set->groups == NULL || set->occupant == NULL || set->live == NULL ||
        set->last_user == NULL) {
        set_free(set);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "groups_register: ring state of %d groups", n);
    }
    for (int i = 0; i < n + 2; ++i)
        set->occupant[i] = -1;
    for (int i = 0; i < n + 4; ++i)
        set->last_user[i] = -1;
    *set_out = set;
    return TIDE_SUCCESS;
}

/* Release the members [0, count) of a set that failed to register, and the set. */
static void unwind(struct tide_arena_set *set, int count, bool handles) {
    for (int i = 0; i < count; ++i) {
        struct tide_group *g = set->groups[i];
        member_free(g);
        if (handles)
            tide_handle_release(g, TIDE_HANDLE_GROUP, sizeof(*g));
        else
            free(g);
    }
    set_free(set);
}

tide_result_t tide_groups_register(tide_comm_t comm, int num_groups,
                                   const tide_group_entry_t *entries, tide_group_t *groups_out) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(comm, TIDE_HANDLE_COMM, "groups_register"));
    TIDE_ARG_CHECK(num_groups >= 1 && num_groups <= TIDE_ARENA_MAX_GROUPS,
                   "groups_register: num_groups = %d outside [1, %d]", num_groups,
                   TIDE_ARENA_MAX_GROUPS);
    TIDE_ARG_CHECK(entries != NULL && groups_out != NULL,
                   "groups_register: entries and groups_out must be non-NULL");
    /* The CPU fabric keeps no per-arena call state: its groups share the arena object.  The
     * GPU fabrics do, and serve a set through views (fabric.h, arena_view_create). */
    if (comm->ops->kind != TIDE_FABRIC_CPU && comm->ops->arena_view_create == NULL)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "groups_register: the %s fabric (this communicator's kind of world) does "
                        "not serve shared arenas yet (the CPU, CUDA and NCCL fabrics do; "
                        "docs/arena.md, \"Fabrics\"): register the groups one by one with "
                        "tide_group_register",
                        comm->ops->name);

    tide_config_t *cfgs = calloc((size_t)num_groups, sizeof(*cfgs));
    tide_group_entry_t *resolved = calloc((size_t)num_groups, sizeof(*resolved));
    struct tide_arena_set *set = NULL;
    tide_result_t res = TIDE_ERR_NO_MEMORY;
    if (cfgs == NULL || resolved == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "groups_register: %d entries", num_groups);
        goto out;
    }
    TIDE_CHECK_GOTO(resolve_entries(comm, num_groups, entries, cfgs, resolved), res, out);
    TIDE_CHECK_GOTO(set_alloc(comm, num_groups, &set), res, out);
    TIDE_CHECK_GOTO(tide_arena_plan_create(num_groups, resolved, &set->ap), res, fail_set);

    int built = 0;
    for (; built < num_groups; ++built) {
        struct tide_group *g = calloc(1, sizeof(*g));
        if (g == NULL) {
            res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "groups_register: out of host memory");
            goto fail_members;
        }
        g->comm = comm;
        g->set = set;
        g->set_index = built;
        g->plan = set->ap->groups[built].plan;
        snprintf(g->name, sizeof(g->name), "%s", set->ap->groups[built].name);
        res = member_init(g);
        if (res != TIDE_SUCCESS) {
            free(g);
            goto fail_members;
        }
        set->groups[built] = g;
    }
    if (comm->ops->arena_create_set != NULL)
        res = comm->ops->arena_create_set(comm->world, set->ap->layout.total_bytes,
                                          set_signature(set->ap), num_groups, &set->arena);
    else
        res = comm->ops->arena_create(comm->world, set->ap->layout.total_bytes,
                                      set_signature(set->ap), &set->arena);
    if (res != TIDE_SUCCESS) goto fail_members;
    TIDE_CHECK_GOTO(views_create(set), res, fail_arena);
    for (int i = 0; i < num_groups; ++i) {
        res = tide_handle_add(set->groups[i], TIDE_HANDLE_GROUP);
        if (res != TIDE_SUCCESS) {
            /* The handles added so far go through the quarantine, the others are freed. */
            views_destroy(set, num_groups);
            comm->ops->arena_destroy(set->arena);
            for (int j = 0; j < num_groups; ++j) {
                member_free(set->groups[j]);
                if (j < i)
                    tide_handle_release(set->groups[j], TIDE_HANDLE_GROUP, sizeof(*set->groups[j]));
                else
                    free(set->groups[j]);
            }
            set_free(set);
            goto out;
        }
        set->groups[i]->poison = TIDE_SUCCESS;
    }
    set->live_groups = num_groups;
    comm->live_groups += num_groups;
    for (int i = 0; i < num_groups; ++i)
        groups_out[i] = set->groups[i];
    res = TIDE_SUCCESS;
    goto out;

fail_arena:
    comm->ops->arena_destroy(set->arena);
fail_members:
    unwind(set, built, false);
    goto out;
fail_set:
    set_free(set);
out:
    free(cfgs);
    free(resolved);
    return res;
}

tide_result_t tide_set_group_release(struct tide_group *g) {
    struct tide_arena_set *set = g->set;
    const int res_index = tide_set_landing(g);
    if (set->occupant[res_index] == g->set_index) set->live[res_index] = false;
    set->groups[g->set_index] = NULL;
    /* A view goes with its group (collective, like the group's release); the memory stays
     * with the set's arena until the last group. */
    tide_result_t view_res = TIDE_SUCCESS;
    if (g->arena != set->arena) view_res = set->comm->ops->arena_destroy(g->arena);
    member_free(g);
    tide_handle_release(g, TIDE_HANDLE_GROUP, sizeof(*g));
    --set->comm->live_groups;
    if (--set->live_groups > 0) return view_res;
    /* The last group of the set: the arena goes (collective, like a lone group's). */
    const tide_result_t res = set->comm->ops->arena_destroy(set->arena);
    set_free(set);
    return view_res != TIDE_SUCCESS ? view_res : res;
}
