/*
 * ag_schedule.c - TIDE-AG across nodes (§3.1, Figure 5): Bruck recursive doubling on each rail,
 * the receive-stage slots it fills, and the landing copy groups that scatter those slots into
 * the parameter-major landing.
 *
 * Rail l of node n gathers the shards of ranks (n', l), n' != n.  Stage slot i (1 <= i < M)
 * holds the shard of node (n + i) mod M: after round d a node holds slots [0, 2^d + c_d), so the
 * slots it forwards in round d + 1 are always a prefix of its own stage, and what it receives
 * in round d lands contiguously at [2^d, 2^d + c_d).  R = ceil(log2 M) rounds replace the
 * (M - 1) rounds of a ring.
 *
 * Landing copies: slot i of rail l is rank ((n + i) mod M) L + l, whose rows of parameter p sit
 * at Landing(p, r) = o_p N + r s_p.  Within a run of slots that does not pass node M - 1, the
 * rank grows by L per slot, so the destination pitch is L s_p and the source pitch (stage) is
 * S: one 2D copy per parameter moves the whole run.  Merging runs of >= 4 slots this way cuts
 * the scatter from O(M P) descriptors to O(P log M).
 */
#include "core/checks.h"
#include "plan/plan.h"

#include <stdlib.h>

/* The last round is split into at most this many groups, so that scatters of its head start
 * while its tail is still on the wire. */
#define AG_LAST_ROUND_GROUPS 4
/* Runs of at least this many slots are worth one strided copy per parameter. */
#define AG_STRIDED_MIN_SLOTS 4
/* R <= ceil(log2 TIDE_MAX_NODES) = 16; non-last rounds give <= 2 groups, the last <= 4. */
#define AG_MAX_ROUNDS 16
#define AG_MAX_GROUPS (2 * (AG_MAX_ROUNDS - 1) + AG_LAST_ROUND_GROUPS)

static tide_result_t check_topo(const tide_topo_t *topo) {
    TIDE_ARG_CHECK(topo != NULL, "topo is NULL");
    TIDE_ARG_CHECK(topo->nodes >= 1 && topo->nodes <= TIDE_MAX_NODES,
                   "topo->nodes = %d outside [1, %d]", topo->nodes, TIDE_MAX_NODES);
    TIDE_ARG_CHECK(topo->gpus_per_node >= 1 && topo->gpus_per_node <= TIDE_MAX_GPUS_PER_NODE,
                   "topo->gpus_per_node = %d outside [1, %d]", topo->gpus_per_node,
                   TIDE_MAX_GPUS_PER_NODE);
    return TIDE_SUCCESS;
}

static int ceil_log2(int m) {
    int r = 0;
    while ((1 << r) < m)
        ++r;
    return r;
}

/* The groups below assume the rounds tile slots [1, M) in order; a schedule built for another
 * topology (or corrupted) would silently produce wrong landing copies. */
static tide_result_t check_schedule(const tide_topo_t *topo, const tide_ag_schedule_t *sched) {
    TIDE_ARG_CHECK(sched != NULL, "sched is NULL");
    int expected = ceil_log2(topo->nodes);
    TIDE_ARG_CHECK(sched->num_rounds == expected, "schedule has %d rounds, M = %d needs %d",
                   sched->num_rounds, topo->nodes, expected);
    TIDE_ARG_CHECK(sched->num_rounds == 0 || sched->rounds != NULL, "sched->rounds is NULL");
    int next = 1;
    for (int d = 0; d < sched->num_rounds; ++d) {
        const tide_ag_round_t *rd = &sched->rounds[d];
        TIDE_ARG_CHECK(rd->first_slot == next && rd->count >= 1 && rd->count <= topo->nodes - next,
                       "schedule round %d (slots [%d, %d)) does not continue slot %d of M = %d", d,
                       rd->first_slot, rd->first_slot + rd->count, next, topo->nodes);
        next += rd->count;
    }
    TIDE_ARG_CHECK(next == topo->nodes, "schedule covers %d of %d stage slots", next - 1,
                   topo->nodes - 1);
    return TIDE_SUCCESS;
}

tide_result_t tide_ag_schedule_build(const tide_topo_t *topo, tide_ag_schedule_t *sched_out) {
    TIDE_CHECK(check_topo(topo));
    TIDE_ARG_CHECK(sched_out != NULL, "sched_out is NULL");
    int m = topo->nodes;
    int num_rounds = ceil_log2(m);
    tide_ag_round_t *rounds = NULL;
    if (num_rounds > 0) {
        rounds = calloc((size_t)num_rounds, sizeof(*rounds));
        if (rounds == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "AG schedule: %d rounds", num_rounds);
    }
    for (int d = 0; d < num_rounds; ++d) {
        int dist = 1 << d;
        rounds[d].distance = dist;
        /* Only the last round may be partial: it forwards just the M - 2^d slots still missing. */
        rounds[d].count = dist < m - dist ? dist : m - dist;
        rounds[d].first_slot = dist;
    }
    sched_out->num_rounds = num_rounds;
    sched_out->rounds = rounds;
    sched_out->stage_slots = (uint64_t)(m - 1);
    return TIDE_SUCCESS;
}

void tide_ag_schedule_free(tide_ag_schedule_t *sched) {
    if (sched == NULL) return;
    free(sched->rounds);
    sched->rounds = NULL;
    sched->num_rounds = 0;
    sched->stage_slots = 0;
}

/* Append the slots [first, first + len) as at most `parts` near-equal groups (sizes differ by
 * <= 1).  A run is split only into parts that stay strided (>= AG_STRIDED_MIN_SLOTS slots):
 * splitting a short run for pipelining would turn one strided copy per parameter into one
 * flat copy per slot and parameter, and descriptor count is the first-order cost. */
static int emit_split(tide_ag_group_t *out, int n, int round, int first, int len, int parts) {
    int keep_strided = len / AG_STRIDED_MIN_SLOTS;
    if (parts > keep_strided) parts = keep_strided > 0 ? keep_strided : 1;
    for (int j = 0; j < parts; ++j) {
        int size = len / parts + (j < len % parts);
        out[n].round = round;
        out[n].first_slot = first;
        out[n].num_slots = size;
        out[n].strided = size >= AG_STRIDED_MIN_SLOTS;
        first += size;
        ++n;
    }
    return n;
}

/* Fill out (capacity AG_MAX_GROUPS) with node's groups; returns their number. */
static int fill_groups(const tide_topo_t *topo, const tide_ag_schedule_t *sched, int node,
                       tide_ag_group_t *out) {
    int m = topo->nodes;
    int wrap = m - node; /* slot whose source is node 0: pitches restart there */
    int n = 0;
    for (int d = 0; d < sched->num_rounds; ++d) {
        int first = sched->rounds[d].first_slot;
        int end = first + sched->rounds[d].count;
        bool last = d == sched->num_rounds - 1;
        if (first < wrap && wrap < end) {
            int parts = last ? AG_LAST_ROUND_GROUPS / 2 : 1;
            n = emit_split(out, n, d, first, wrap - first, parts);
            n = emit_split(out, n, d, wrap, end - wrap, parts);
        } else {
            n = emit_split(out, n, d, first, end - first, last ? AG_LAST_ROUND_GROUPS : 1);
        }
    }
    return n;
}

tide_result_t tide_ag_groups(const tide_topo_t *topo, const tide_ag_schedule_t *sched, int node,
                             tide_ag_group_t **groups_out, int *num_groups_out) {
    TIDE_CHECK(check_topo(topo));
    TIDE_CHECK(check_schedule(topo, sched));
    TIDE_ARG_CHECK(node >= 0 && node < topo->nodes, "node = %d outside [0, %d)", node, topo->nodes);
    TIDE_ARG_CHECK(groups_out != NULL, "groups_out is NULL");
    TIDE_ARG_CHECK(num_groups_out != NULL, "num_groups_out is NULL");

    tide_ag_group_t tmp[AG_MAX_GROUPS];
    int count = fill_groups(topo, sched, node, tmp);
    tide_ag_group_t *groups = NULL; /* M = 1: no stage, no groups */
    if (count > 0) {
        groups = malloc((size_t)count * sizeof(*groups));
        if (groups == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "AG groups: %d groups of node %d", count, node);
        for (int i = 0; i < count; ++i)
            groups[i] = tmp[i];
    }
    *groups_out = groups;
    *num_groups_out = count;
    return TIDE_SUCCESS;
}

tide_result_t tide_ag_descriptors(const tide_topo_t *topo, const tide_ag_schedule_t *sched,
                                  int num_params, int node, int multicast, uint64_t *count_out) {
    TIDE_CHECK(check_topo(topo));
    TIDE_CHECK(check_schedule(topo, sched));
    TIDE_ARG_CHECK(num_params >= 1 && num_params <= TIDE_MAX_PARAMS,
                   "num_params = %d outside [1, %d]", num_params, TIDE_MAX_PARAMS);
    TIDE_ARG_CHECK(node >= 0 && node < topo->nodes, "node = %d outside [0, %d)", node, topo->nodes);
    TIDE_ARG_CHECK(count_out != NULL, "count_out is NULL");

    tide_ag_group_t groups[AG_MAX_GROUPS];
    int num_groups = fill_groups(topo, sched, node, groups);
    uint64_t p = (uint64_t)num_params;
    /* Without multicast every copy becomes one unicast write per local GPU. */
    uint64_t fanout = multicast ? 1 : (uint64_t)topo->gpus_per_node;

    /* The own shard goes straight from the resident shard to every local landing. */
    uint64_t total = p;
    for (int i = 0; i < num_groups; ++i) {
        uint64_t copies = p;
        if (!groups[i].strided && !tide_mul_u64(p, (uint64_t)groups[i].num_slots, &copies))
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "AG descriptor count overflows");
        if (!tide_add_u64(total, copies, &total))
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "AG descriptor count overflows");
    }
    if (!tide_mul_u64(total, fanout, &total))
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "AG descriptor count overflows");
    *count_out = total;
    return TIDE_SUCCESS;
}
