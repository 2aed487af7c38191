/*
 * arena_plan.c - one arena for a set of groups (docs/arena.md): the two-slot all-gather ring,
 * own slots, the regions every group shares, and the per-group resident shards and counters.
 *
 * Each group is planned alone first (tide_plan_create), which gives every region's size for
 * that group; the shared arena then takes, per shared region, the largest of those sizes, and
 * each group's region table is rewritten to point into it.  Programs and the binder only read
 * the table, so they run unchanged on the shared arena; a region keeps the group's own size,
 * so the binder's bounds checks still stop a program at the edge of what that group needs.
 */
#include "plan/arena_plan.h"

#include "core/checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Region kinds one block serves for the whole set (sized for the largest group). */
static bool region_shared(tide_region_t r) {
    return r == TIDE_REGION_RECV_STAGE || r == TIDE_REGION_STAGING || r == TIDE_REGION_OUTBOX ||
           r == TIDE_REGION_SPARE || r == TIDE_REGION_INBOX;
}

/* Appends `bytes` at the aligned end of the arena; offset_out gets the block's offset. */
static tide_result_t place(uint64_t *end, uint64_t bytes, const char *what, uint64_t *offset_out) {
    uint64_t padded, next;
    if (!tide_add_u64(*end, TIDE_ARENA_ALIGN - 1, &padded))
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "arena plan: offset of %s overflows 64 bits", what);
    padded = padded / TIDE_ARENA_ALIGN * TIDE_ARENA_ALIGN;
    if (!tide_add_u64(padded, bytes, &next))
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "arena plan: end of %s overflows 64 bits", what);
    *offset_out = padded;
    *end = next;
    return TIDE_SUCCESS;
}

void tide_arena_plan_destroy(tide_arena_plan_t ap) {
    if (ap == NULL) return;
    for (int i = 0; i < ap->num_groups; ++i)
        tide_plan_destroy(ap->groups[i].plan);
    free(ap->groups);
    free(ap);
}

/* Validates the entries and plans each group alone. */
static tide_result_t plan_groups(struct tide_arena_plan *ap, const tide_group_entry_t *entries) {
    for (int i = 0; i < ap->num_groups; ++i) {
        const tide_group_entry_t *e = &entries[i];
        tide_arena_member_t *m = &ap->groups[i];
        if (e->name != NULL)
            snprintf(m->name, sizeof(m->name), "%s", e->name);
        else
            snprintf(m->name, sizeof(m->name), "group %d", i);
        TIDE_ARG_CHECK(e->config != NULL && e->group != NULL,
                       "arena plan: entry %d (\"%s\"): config and group must be non-NULL", i,
                       m->name);
        TIDE_ARG_CHECK(e->ring_slot == 0 || e->ring_slot == 1 || e->ring_slot == TIDE_RING_OWN_SLOT,
                       "arena plan: entry %d (\"%s\"): ring_slot = %d, need 0, 1 or "
                       "TIDE_RING_OWN_SLOT (%d)",
                       i, m->name, e->ring_slot, TIDE_RING_OWN_SLOT);
        m->ring_slot = e->ring_slot;
        tide_result_t res = tide_plan_create(e->config, e->group, &m->plan);
        if (res != TIDE_SUCCESS) {
            char why[512];
            snprintf(why, sizeof(why), "%s", tide_get_last_error());
            return TIDE_ERR(res, "arena plan: entry %d (\"%s\"): %s", i, m->name, why);
        }
        const tide_topo_t *t = &m->plan->topo;
        if (i == 0) ap->topo = *t;
        TIDE_ARG_CHECK(t->nodes == ap->topo.nodes && t->gpus_per_node == ap->topo.gpus_per_node,
                       "arena plan: entry %d (\"%s\") is for M = %d, L = %d, entry 0 for M = %d, "
                       "L = %d: one arena serves one topology",
                       i, m->name, t->nodes, t->gpus_per_node, ap->topo.nodes,
                       ap->topo.gpus_per_node);
        m->alone_bytes = m->plan->arena.total_bytes;
    }
    return TIDE_SUCCESS;
}

/* Lays out the arena and points every group's region table into it. */
static tide_result_t lay_out(struct tide_arena_plan *ap) {
    tide_arena_layout_t *L = &ap->layout;
    memset(L, 0, sizeof(*L));
    uint64_t need[TIDE_REGION_COUNT] = {0};
    for (int i = 0; i < ap->num_groups; ++i) {
        const tide_arena_member_t *m = &ap->groups[i];
        const tide_region_info_t *r = m->plan->arena.regions;
        const uint64_t ns = r[TIDE_REGION_LANDING0].bytes;
        if (m->ring_slot >= 0 && ns > need[TIDE_REGION_LANDING0 + m->ring_slot])
            need[TIDE_REGION_LANDING0 + m->ring_slot] = ns;
        for (int k = 0; k < TIDE_REGION_COUNT; ++k)
            if (region_shared((tide_region_t)k) && r[k].bytes > need[k]) need[k] = r[k].bytes;
    }

    uint64_t end = 0;
    /* The ring first, then the own slots, then the shared RS / receive regions. */
    for (int s = 0; s < 2; ++s) {
        const tide_region_t k = (tide_region_t)(TIDE_REGION_LANDING0 + s);
        TIDE_CHECK(place(&end, need[k], tide_region_name(k), &L->regions[k].offset));
        L->regions[k].bytes = need[k];
    }
    ap->own_slot_bytes = 0;
    for (int i = 0; i < ap->num_groups; ++i) {
        tide_arena_member_t *m = &ap->groups[i];
        if (m->ring_slot >= 0) continue;
        const uint64_t ns = m->plan->arena.regions[TIDE_REGION_LANDING0].bytes;
        TIDE_CHECK(place(&end, ns, "an own slot", &m->own_offset));
        ap->own_slot_bytes += ns;
    }
    for (int k = 0; k < TIDE_REGION_COUNT; ++k) {
        if (!region_shared((tide_region_t)k)) continue;
        TIDE_CHECK(place(&end, need[k], tide_region_name((tide_region_t)k), &L->regions[k].offset));
        L->regions[k].bytes = need[k];
    }
    /* Per-group blocks: resident shards, then counters.  Arena-level extent: the span. */
    const tide_region_t per_group[2] = {TIDE_REGION_RESIDENT, TIDE_REGION_SIGNALS};
    for (int j = 0; j < 2; ++j) {
        const tide_region_t k = per_group[j];
        uint64_t first = 0, total = 0;
        for (int i = 0; i < ap->num_groups; ++i) {
            tide_arena_member_t *m = &ap->groups[i];
            const uint64_t bytes = m->plan->arena.regions[k].bytes;
            TIDE_CHECK(place(&end, bytes, tide_region_name(k), &m->block_offset[j]));
            if (i == 0) first = m->block_offset[j];
            total += bytes;
        }
        L->regions[k].offset = first;
        L->regions[k].bytes = end - first;
        ap->per_group_bytes[j] = total;
    }
    L->total_bytes = end;

    /* Each group: its own sizes, the arena's offsets. */
    for (int i = 0; i < ap->num_groups; ++i) {
        tide_arena_member_t *m = &ap->groups[i];
        tide_region_info_t *r = m->plan->arena.regions;
        for (int k = 0; k < TIDE_REGION_COUNT; ++k)
            if (region_shared((tide_region_t)k)) r[k].offset = L->regions[k].offset;
        r[TIDE_REGION_LANDING0].offset =
            m->ring_slot >= 0 ? L->regions[TIDE_REGION_LANDING0 + m->ring_slot].offset
                              : m->own_offset;
        /* A set group has one landing: landing1 is empty, at the same place. */
        r[TIDE_REGION_LANDING1].offset = r[TIDE_REGION_LANDING0].offset;
        r[TIDE_REGION_LANDING1].bytes = 0;
        r[TIDE_REGION_RESIDENT].offset = m->block_offset[0];
        r[TIDE_REGION_SIGNALS].offset = m->block_offset[1];
        m->plan->arena.total_bytes = end;
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_arena_plan_create(int num_groups, const tide_group_entry_t *entries,
                                     tide_arena_plan_t *plan_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(num_groups >= 1, "arena plan: num_groups = %d, need >= 1", num_groups);
    TIDE_ARG_CHECK(num_groups <= TIDE_ARENA_MAX_GROUPS, "arena plan: num_groups = %d exceeds %d",
                   num_groups, TIDE_ARENA_MAX_GROUPS);
    TIDE_ARG_CHECK(entries != NULL, "arena plan: entries is NULL");
    TIDE_ARG_CHECK(plan_out != NULL, "arena plan: plan_out is NULL");
    struct tide_arena_plan *ap = calloc(1, sizeof(*ap));
    if (ap != NULL) ap->groups = calloc((size_t)num_groups, sizeof(*ap->groups));
    if (ap == NULL || ap->groups == NULL) {
        free(ap);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "arena plan: %d groups", num_groups);
    }
    ap->num_groups = num_groups;
    tide_result_t res = plan_groups(ap, entries);
    if (res == TIDE_SUCCESS) res = lay_out(ap);
    if (res != TIDE_SUCCESS) {
        tide_arena_plan_destroy(ap);
        return res;
    }
    *plan_out = ap;
    return TIDE_SUCCESS;
}

tide_result_t tide_arena_plan_get_summary(tide_arena_plan_t ap, tide_arena_summary_t *out) {
    tide_error_clear();
    TIDE_ARG_CHECK(ap != NULL && out != NULL, "arena plan summary: plan and out must be non-NULL");
    tide_arena_summary_t s;
    memset(&s, 0, sizeof(s));
    s.num_groups = ap->num_groups;
    s.nodes = ap->topo.nodes;
    s.gpus_per_node = ap->topo.gpus_per_node;
    s.total_bytes = ap->layout.total_bytes;
    for (int k = 0; k < TIDE_REGION_COUNT; ++k)
        s.region_bytes[k] = ap->layout.regions[k].bytes;
    s.region_bytes[TIDE_REGION_RESIDENT] = ap->per_group_bytes[0];
    s.region_bytes[TIDE_REGION_SIGNALS] = ap->per_group_bytes[1];
    s.own_slot_bytes = ap->own_slot_bytes;
    for (int i = 0; i < ap->num_groups; ++i) {
        const tide_arena_member_t *m = &ap->groups[i];
        const tide_region_info_t *r = m->plan->arena.regions;
        if (i == 0 || r[TIDE_REGION_LANDING0].bytes > s.largest_group_bytes) {
            s.largest_group = i;
            s.largest_group_bytes = r[TIDE_REGION_LANDING0].bytes;
            s.largest_rs_bytes = r[TIDE_REGION_STAGING].bytes + r[TIDE_REGION_OUTBOX].bytes +
                                 r[TIDE_REGION_SPARE].bytes + r[TIDE_REGION_INBOX].bytes;
        }
        s.separate_bytes += m->alone_bytes;
    }
    *out = s;
    return TIDE_SUCCESS;
}

tide_result_t tide_arena_plan_get_region(tide_arena_plan_t ap, int group, tide_region_t region,
                                         tide_region_info_t *info_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(ap != NULL && info_out != NULL, "arena plan region: plan and info_out must "
                                                   "be non-NULL");
    TIDE_ARG_CHECK(group >= -1 && group < ap->num_groups,
                   "arena plan region: group = %d outside [-1, %d)", group, ap->num_groups);
    TIDE_ARG_CHECK((int)region >= 0 && region < TIDE_REGION_COUNT,
                   "arena plan region: region = %d is not a tide_region_t", (int)region);
    *info_out =
        group < 0 ? ap->layout.regions[region] : ap->groups[group].plan->arena.regions[region];
    return TIDE_SUCCESS;
}

tide_result_t tide_arena_plan_group(tide_arena_plan_t ap, int group, tide_plan_t *plan_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(ap != NULL && plan_out != NULL, "arena plan group: plan and plan_out must be "
                                                   "non-NULL");
    TIDE_ARG_CHECK(group >= 0 && group < ap->num_groups,
                   "arena plan group: group = %d outside [0, %d)", group, ap->num_groups);
    *plan_out = ap->groups[group].plan;
    return TIDE_SUCCESS;
}
