/*
 * memory.c - the memory model of a plan (paper §5.4, eqs. 10-12): closed-form bounds in units
 * of one unsharded bf16 group N S, and the exact per-rank arena the program binds to.
 *
 * The two agree by construction: the arena's RS regions are the terms of eq. (10) with the
 * real sub-slice capacity E_sub in place of the bound S_fp32 / (4 L), except that a staging
 * slot holds the L - 1 pushed contributions (the owner reads its own one in place), where the
 * bound charges L / 2 S_fp32, i.e. L of them.
 */
#include "core/checks.h"
#include "plan/plan.h"

#include <inttypes.h>

/* ------------------------------------------------------------------ closed-form bounds */

/* Default staging depth the bounds are stated for (§5.4). */
#define TIDE_BOUNDS_STAGING_SLOTS 2

/*
 * Eq. (10) generalised to L, in units of S_fp32.  A block of L sub-slice rows of
 * E_sub ~ sum R_p K_p / L fp32 elements is one S_fp32.  Each bf16 staging slot holds at most L
 * contributions of S_grad = S_fp32 / 2 (L / 2 S_fp32, 4 S_fp32 at L = 8), each inbox generation
 * L blocks, the two outbox banks n_out blocks each, and each bank one own-node spare.
 */
static double area_rs_fp32(int gpus_per_node, int n_par, double n_out) {
    const double l = (double)gpus_per_node;
    return TIDE_BOUNDS_STAGING_SLOTS * l / 2.0 + l * n_par + 2.0 * n_out + 2.0;
}

tide_result_t tide_memory_bounds(int nodes, int gpus_per_node, int round_width,
                                 int inbox_generations, tide_memory_bounds_t *bounds_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(bounds_out != NULL, "memory bounds: bounds_out is NULL");
    TIDE_ARG_CHECK(nodes >= 1, "memory bounds: nodes M = %d, need M >= 1", nodes);
    TIDE_ARG_CHECK(gpus_per_node >= 1 && gpus_per_node <= TIDE_MAX_GPUS_PER_NODE,
                   "memory bounds: gpus_per_node L = %d outside [1, %d]", gpus_per_node,
                   TIDE_MAX_GPUS_PER_NODE);
    TIDE_ARG_CHECK(round_width >= 1, "memory bounds: round_width k = %d, need k >= 1", round_width);
    TIDE_ARG_CHECK(inbox_generations == 1 || inbox_generations == 2,
                   "memory bounds: inbox_generations n_par = %d, need 1 or 2", inbox_generations);

    /* bf16 shards: S_fp32 = 2 S and N S = M L S, so S_fp32 = 2 / (M L) in units of N S. */
    const double m = (double)nodes, l = (double)gpus_per_node;
    const double fp32_ns = 2.0 / (m * l);
    /* AG ring: two landing slots plus the (M - 1) S receive stage, bounded by S = N S / L. */
    const double ring_ns = 2.0 + 1.0 / l;

    tide_memory_bounds_t b;
    /* In-Place: a full outbox, one block per remote node (eq. 11). */
    b.in_place_staging_ns = area_rs_fp32(gpus_per_node, inbox_generations, m - 1.0) * fp32_ns;
    /* Slot-Reuse: a partial outbox over two consecutive rounds, n_out <= 2k (eqs. 9, 12). */
    b.slot_reuse_staging_ns =
        area_rs_fp32(gpus_per_node, inbox_generations, 2.0 * round_width) * fp32_ns;
    /* In-Place also keeps the previous layer's bf16 gradients (N S) until the next
     * post_backward; Slot-Reuse keeps them in the vacated ring slot already counted. */
    b.in_place_total_ns = ring_ns + b.in_place_staging_ns + 1.0;
    b.slot_reuse_total_ns = ring_ns + b.slot_reuse_staging_ns;
    /* Stock FSDP2: unsharded parameters, the prefetched all-gather output, and the previous
     * layer's fp32 reduce-scatter input (2 N S). */
    b.fsdp2_total_ns = 4.0;
    /* The rail lane (memory.c, lane_sizes): two landing slots and two bf16 inbox blocks of
     * S_grad = S = N S / M each; the gradients as above. */
    b.rail_lane = gpus_per_node == 1 && nodes >= 2;
    b.rail_lane_staging_ns = b.rail_lane ? 2.0 / m : 0.0;
    b.rail_lane_in_place_total_ns = b.rail_lane ? 2.0 + b.rail_lane_staging_ns + 1.0 : 0.0;
    b.rail_lane_slot_reuse_total_ns = b.rail_lane ? 2.0 + b.rail_lane_staging_ns : 0.0;
    *bounds_out = b;
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ exact arena layout */

const char *tide_region_name(tide_region_t region) {
    switch (region) {
    case TIDE_REGION_LANDING0:
        return "landing0";
    case TIDE_REGION_LANDING1:
        return "landing1";
    case TIDE_REGION_RECV_STAGE:
        return "recv_stage";
    case TIDE_REGION_RESIDENT:
        return "resident";
    case TIDE_REGION_STAGING:
        return "staging";
    case TIDE_REGION_OUTBOX:
        return "outbox";
    case TIDE_REGION_SPARE:
        return "spare";
    case TIDE_REGION_INBOX:
        return "inbox";
    case TIDE_REGION_SIGNALS:
        return "signals";
    default:
        return "unknown";
    }
}

/* Checked product of n factors; the region is named in the error. */
static tide_result_t region_bytes(tide_region_t region, const uint64_t *factors, int n,
                                  uint64_t *bytes_out) {
    uint64_t acc = 1;
    for (int i = 0; i < n; ++i)
        if (!tide_mul_u64(acc, factors[i], &acc))
            return TIDE_ERR(TIDE_ERR_OVERFLOW,
                            "arena: size of region %s overflows 64 bits (factor %d = %" PRIu64 ")",
                            tide_region_name(region), i, factors[i]);
    *bytes_out = acc;
    return TIDE_SUCCESS;
}

#define REGION_BYTES(region, out, ...)                                                             \
    region_bytes((region), (const uint64_t[]){__VA_ARGS__},                                        \
                 (int)(sizeof((const uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t)), (out))

static tide_result_t check_inputs(const tide_topo_t *topo, const tide_geom_t *geom,
                                  const tide_rs_schedule_t *rs) {
    tide_topo_t ref;
    TIDE_CHECK(tide_topo_init(topo->nodes, topo->gpus_per_node, &ref));
    TIDE_ARG_CHECK(ref.ranks == topo->ranks, "arena: topology ranks = %d, expected M L = %d",
                   topo->ranks, ref.ranks);
    TIDE_ARG_CHECK(geom->ranks == topo->ranks, "arena: geometry is for N = %d ranks, topology %d",
                   geom->ranks, topo->ranks);
    TIDE_ARG_CHECK(geom->grad_item == 2 || geom->grad_item == 4,
                   "arena: gradient item size %zu is not bf16 or fp32", geom->grad_item);
    TIDE_ARG_CHECK(rs->nodes == topo->nodes && rs->gpus_per_node == topo->gpus_per_node,
                   "arena: RS schedule is for M = %d, L = %d, topology M = %d, L = %d", rs->nodes,
                   rs->gpus_per_node, topo->nodes, topo->gpus_per_node);
    TIDE_ARG_CHECK(rs->staging_slots >= 1, "arena: staging slots n_stg = %d, need >= 1",
                   rs->staging_slots);
    TIDE_ARG_CHECK(rs->outbox_depth >= 0, "arena: outbox depth n_out = %d is negative",
                   rs->outbox_depth);
    TIDE_ARG_CHECK(rs->inbox_generations == 1 || rs->inbox_generations == 2,
                   "arena: inbox generations n_par = %d, need 1 or 2", rs->inbox_generations);
    return TIDE_SUCCESS;
}

/* The rail lane (L = 1, docs/protocol.md): the all-gather forwards landing to landing, so no
 * receive stage (a cast writes into the own landing); the reduce-scatter puts gradient-dtype
 * pieces into the destination's inbox, two generations of one E_sub block, and reads its own
 * contribution in place: no staging, outbox or spare.  The ring slots and the resident shard
 * are sized by the caller as for every plan. */
static tide_result_t lane_sizes(const tide_geom_t *geom, const tide_rs_schedule_t *rs,
                                uint64_t bytes[TIDE_REGION_COUNT]) {
    TIDE_ARG_CHECK(rs->gpus_per_node == 1 && rs->nodes >= 2,
                   "arena: the rail lane needs L = 1 and M >= 2 (M = %d, L = %d)", rs->nodes,
                   rs->gpus_per_node);
    bytes[TIDE_REGION_RECV_STAGE] = 0;
    bytes[TIDE_REGION_STAGING] = 0;
    bytes[TIDE_REGION_OUTBOX] = 0;
    bytes[TIDE_REGION_SPARE] = 0;
    TIDE_CHECK(REGION_BYTES(TIDE_REGION_INBOX, &bytes[TIDE_REGION_INBOX], 2, rs->subslice_elems,
                            (uint64_t)geom->grad_item));
    return REGION_BYTES(TIDE_REGION_SIGNALS, &bytes[TIDE_REGION_SIGNALS],
                        (uint64_t)TIDE_ARENA_SIGNAL_SLOTS, sizeof(uint64_t));
}

static tide_result_t region_sizes(const tide_topo_t *topo, const tide_geom_t *geom,
                                  const tide_rs_schedule_t *rs, uint64_t bytes[TIDE_REGION_COUNT]) {
    const uint64_t m = (uint64_t)topo->nodes, l = (uint64_t)topo->gpus_per_node;
    const uint64_t n = (uint64_t)topo->ranks, s = geom->shard_bytes;
    const uint64_t e_sub = rs->subslice_elems, fp32 = 4;

    /* Two ring slots: FSDP2's prefetch depth of one alternates two landings (§3.1). */
    TIDE_CHECK(REGION_BYTES(TIDE_REGION_LANDING0, &bytes[TIDE_REGION_LANDING0], n, s));
    TIDE_CHECK(REGION_BYTES(TIDE_REGION_LANDING1, &bytes[TIDE_REGION_LANDING1], n, s));
    /* In-place shard adoption: the shard lives in the arena unless it is the fp32 master. */
    TIDE_CHECK(
        REGION_BYTES(TIDE_REGION_RESIDENT, &bytes[TIDE_REGION_RESIDENT], geom->cast ? 0 : 1, s));
    if (rs->rail_lane) return lane_sizes(geom, rs, bytes);
    /* One slot per remote node; with a cast the fp32 -> bf16 output takes the first slot,
     * so even M = 1 needs one. */
    TIDE_CHECK(REGION_BYTES(TIDE_REGION_RECV_STAGE, &bytes[TIDE_REGION_RECV_STAGE],
                            geom->cast ? m : m - 1, s));
    /* The L - 1 peers push their gradient rows for the owner's L destination sub-slices; the
     * owner reads its own contribution in place. */
    TIDE_CHECK(REGION_BYTES(TIDE_REGION_STAGING, &bytes[TIDE_REGION_STAGING],
                            (uint64_t)rs->staging_slots, l - 1, l, e_sub,
                            (uint64_t)geom->grad_item));
    /* An outbox block is one fp32 node partial: L rows of E_sub, two banks of n_out. */
    TIDE_CHECK(REGION_BYTES(TIDE_REGION_OUTBOX, &bytes[TIDE_REGION_OUTBOX], 2,
                            (uint64_t)rs->outbox_depth, l, e_sub, fp32));
    /* One own-node spare per bank and pass: the read phase sums every pass's own partial
     * before the network phase lands it, so passes must not share a spare. */
    TIDE_CHECK(REGION_BYTES(TIDE_REGION_SPARE, &bytes[TIDE_REGION_SPARE], 2,
                            (uint64_t)(rs->passes > 1 ? rs->passes : 1), l, e_sub, fp32));
    /* Each generation has L blocks s, each an L-row partial.  At M = 1 there are no other
     * nodes' partials: the landings read the owners' spares (compile_rs.c). */
    TIDE_CHECK(REGION_BYTES(TIDE_REGION_INBOX, &bytes[TIDE_REGION_INBOX],
                            m > 1 ? (uint64_t)rs->inbox_generations : 0, l, l, e_sub, fp32));
    TIDE_CHECK(REGION_BYTES(TIDE_REGION_SIGNALS, &bytes[TIDE_REGION_SIGNALS],
                            (uint64_t)TIDE_ARENA_SIGNAL_SLOTS, sizeof(uint64_t)));
    return TIDE_SUCCESS;
}

tide_result_t tide_arena_layout(const tide_topo_t *topo, const tide_geom_t *geom,
                                const tide_rs_schedule_t *rs, tide_arena_layout_t *layout_out) {
    TIDE_ARG_CHECK(topo != NULL && geom != NULL && rs != NULL,
                   "arena: topo, geom and rs must be non-NULL");
    TIDE_ARG_CHECK(layout_out != NULL, "arena: layout_out is NULL");
    TIDE_CHECK(check_inputs(topo, geom, rs));

    uint64_t bytes[TIDE_REGION_COUNT] = {0};
    TIDE_CHECK(region_sizes(topo, geom, rs, bytes));

    /* Regions in tide_region_t order; every offset (even of an empty region) is aligned so
     * that the program may map or register each region on its own. */
    tide_arena_layout_t layout;
    uint64_t end = 0;
    for (int i = 0; i < TIDE_REGION_COUNT; ++i) {
        uint64_t padded;
        if (!tide_add_u64(end, TIDE_ARENA_ALIGN - 1, &padded))
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "arena: offset of region %s overflows 64 bits",
                            tide_region_name((tide_region_t)i));
        layout.regions[i].offset = padded / TIDE_ARENA_ALIGN * TIDE_ARENA_ALIGN;
        layout.regions[i].bytes = bytes[i];
        if (!tide_add_u64(layout.regions[i].offset, bytes[i], &end))
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "arena: end of region %s overflows 64 bits",
                            tide_region_name((tide_region_t)i));
    }
    layout.total_bytes = end;
    *layout_out = layout;
    return TIDE_SUCCESS;
}
