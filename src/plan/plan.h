/*
 * plan.h - the planner's internal model (pure host C, no CUDA).
 *
 * A plan is computed once per (group signature, topology, tuning) and then read by the
 * program compiler and by tide-plan.  Every map here follows the paper's notation:
 *
 *   topology   N = M L ranks, node-major r = n L + l, rail l            (§2.1)
 *   geometry   R_p, s_p, o_p, S, Landing(p, r), I_{p,r}, S_fp32, B_pack (§2.1, eqs. 2-3)
 *   ag         Bruck recursive doubling, stage slots, strided runs      (§3.1)
 *   rs         Latin square, waves, generations, outbox, rounds         (§4, §5, App. D/E)
 *   memory     closed-form bounds and the exact arena layout            (§5.4, eqs. 10-12)
 *   solver     C_sum, C_mc, k                                           (App. G, eqs. 13-14)
 *
 * All functions return tide_result_t and report their own errors with TIDE_ERR; outputs are
 * written only on success.  Structures own their arrays; each has a *_free().
 */
#ifndef TIDE_PLAN_PLAN_H_
#define TIDE_PLAN_PLAN_H_

#include "tide.h"

#include <stdbool.h>
#include <stdint.h>

/* ------------------------------------------------------------------ topology (§2.1) */

typedef struct {
    int nodes;         /* M */
    int gpus_per_node; /* L */
    int ranks;         /* N = M L */
} tide_topo_t;

/* Validates M >= 1, 1 <= L <= TIDE_MAX_GPUS_PER_NODE, M <= TIDE_MAX_NODES. */
tide_result_t tide_topo_init(int nodes, int gpus_per_node, tide_topo_t *topo_out);

static inline int tide_topo_rank(const tide_topo_t *t, int node, int local) {
    return node * t->gpus_per_node + local;
}
static inline int tide_topo_node(const tide_topo_t *t, int rank) {
    return rank / t->gpus_per_node;
}
static inline int tide_topo_local(const tide_topo_t *t, int rank) {
    return rank % t->gpus_per_node;
}
/* Rails are aligned with local ranks: rank (n, l) talks to other nodes only over rail l. */
static inline int tide_topo_rail(const tide_topo_t *t, int rank) {
    return tide_topo_local(t, rank);
}

/* ------------------------------------------------------------------ geometry (§2.1) */

typedef struct {
    uint64_t dim0;          /* D_p */
    uint64_t inner;         /* K_p */
    uint64_t rows;          /* R_p = ceil(D_p / N) */
    uint64_t shard_elems;   /* R_p K_p */
    uint64_t shard_bytes;   /* s_p = R_p K_p b_ag */
    uint64_t offset;        /* o_p (bytes, AG layout) */
    uint64_t elem_offset;   /* sum_{i<p} R_i K_i: element offset in the packed RS output */
} tide_geom_param_t;

typedef struct {
    int num_params;             /* P */
    int ranks;                  /* N */
    size_t ag_item;             /* b_ag */
    size_t grad_item;           /* b_grad */
    bool cast;                  /* shard dtype differs from the AG dtype (fp32 -> bf16) */
    tide_geom_param_t *params;  /* P entries */
    uint64_t shard_bytes;       /* S */
    uint64_t shard_elems;       /* sum_p R_p K_p */
    uint64_t group_bytes;       /* N S */
    uint64_t grad_shard_bytes;  /* S_grad = b_grad sum R_p K_p */
    uint64_t fp32_shard_bytes;  /* S_fp32 = 4 sum R_p K_p */
    uint64_t pack_bytes;        /* B_pack = 4 N sum R_p K_p (eq. 3) */
} tide_geom_t;

/*
 * Validates the group (1 <= P <= TIDE_MAX_PARAMS, D_p, K_p >= 1, bf16/fp32 dtypes, no 64-bit
 * overflow of any derived byte count, including N S and B_pack) and computes the geometry.
 */
tide_result_t tide_geom_build(const tide_topo_t *topo, const tide_group_desc_t *group,
                              tide_geom_t *geom_out);
void tide_geom_free(tide_geom_t *geom);

/* Landing(p, r) = o_p N + r s_p (eq. 2). */
static inline uint64_t tide_geom_landing(const tide_geom_t *g, int p, int rank) {
    return g->params[p].offset * (uint64_t)g->ranks + (uint64_t)rank * g->params[p].shard_bytes;
}

/* I_{p,r}: rows [r R_p, (r+1) R_p) of G_p, clipped to D_p; *valid_rows may be 0 (padding). */
static inline void tide_geom_rs_rows(const tide_geom_t *g, int p, int rank, uint64_t *first_row,
                                     uint64_t *valid_rows) {
    const tide_geom_param_t *q = &g->params[p];
    uint64_t first = (uint64_t)rank * q->rows;
    uint64_t end = first + q->rows;
    if (end > q->dim0) end = q->dim0;
    *first_row = first;
    *valid_rows = first < end ? end - first : 0;
}

/* ------------------------------------------------------------------ TIDE-AG (§3.1) */

/* Round d of Bruck recursive doubling: forward c_d = min(2^d, M - 2^d) slots. */
typedef struct {
    int distance;   /* 2^d: send to (n - 2^d) mod M, receive from (n + 2^d) mod M */
    int count;      /* c_d */
    int first_slot; /* stage slots [first_slot, first_slot + count) arrive this round; = 2^d */
} tide_ag_round_t;

/*
 * One landing copy group on node n: stage slots [first_slot, first_slot + num_slots), whose
 * shards come from nodes (n + first_slot + i) mod M, i.e. ranks ((n + slot) mod M) L + l.
 * A group never wraps past node M-1, so its rows have constant pitches (src S, dst L s_p).
 * Strided groups (num_slots >= 4) cost one 2D copy per parameter; the others one flat copy
 * per slot and parameter.
 */
typedef struct {
    int round;
    int first_slot;
    int num_slots;
    bool strided;
} tide_ag_group_t;

typedef struct {
    int num_rounds;           /* R = ceil(log2 M) */
    tide_ag_round_t *rounds;  /* R entries */
    uint64_t stage_slots;     /* M - 1 (M with a cast: slot 0 holds the cast own shard) */
} tide_ag_schedule_t;

tide_result_t tide_ag_schedule_build(const tide_topo_t *topo, tide_ag_schedule_t *sched_out);
void tide_ag_schedule_free(tide_ag_schedule_t *sched);

/* The landing copy groups of node n, in arrival order. *groups_out is malloc'ed. */
tide_result_t tide_ag_groups(const tide_topo_t *topo, const tide_ag_schedule_t *sched, int node,
                             tide_ag_group_t **groups_out, int *num_groups_out);

/*
 * Copy descriptors one rank issues per AG call: its own shard to the local GPUs plus the
 * landing copies of every stage group, with P descriptors per strided group and P per slot
 * otherwise.  multicast = 1 counts one multicast write per copy; 0 counts L unicast writes.
 */
tide_result_t tide_ag_descriptors(const tide_topo_t *topo, const tide_ag_schedule_t *sched,
                                  int num_params, int node, int multicast, uint64_t *count_out);

/* ------------------------------------------------------------------ TIDE-RS (§4, §5) */

/* Part of parameter p inside one sub-slice row: elements [begin, begin + len) of the
 * per-rank shard of p (R_p K_p elements), stored at column col of the sub-slice row. */
typedef struct {
    int param;
    uint64_t begin;
    uint64_t len;
    uint64_t col;
} tide_rs_piece_t;

/* One wave: contributors c in [first, first + count), all c in [1, M].  The W waves of a pass
 * repeat in every pass; waves are listed in call order (pass-major), so wave g belongs to pass
 * g / W and its generation is g mod n_par. */
typedef struct {
    int pass;
    int first;
    int count;
    int generation;      /* inbox buffer generation q (0 when n_par = 1) */
    bool has_own;        /* contains c = M (own node; lands from the spare) */
    int first_round;     /* index into rs->rounds */
    int num_rounds;
    /* zero_mask[s] bit j: before landing this wave, zero inbox block s on local GPU j, because
     * an earlier wave (or call) left data there that this wave does not overwrite. */
    uint16_t *zero_mask; /* L entries */
} tide_rs_wave_t;

/* One network round: up to k remote contributors c in [first, first + count). */
typedef struct {
    int wave;
    int first;
    int count;
} tide_rs_round_t;

typedef struct {
    int nodes, gpus_per_node;  /* M, L */
    int wave_width;            /* W_wave */
    int round_width;           /* k */
    int passes;                /* n_part */
    tide_rs_mode_t mode;
    int staging_slots;         /* n_stg */
    int inbox_generations;     /* n_par: 1 for a single-wave schedule, else 2 */
    int waves_per_pass;        /* W = ceil(M / W_wave) */
    int num_waves;             /* n_part W: waves per call, in call order */
    tide_rs_wave_t *waves;
    int num_rounds;            /* network rounds per call, in call order (all passes) */
    tide_rs_round_t *rounds;
    int outbox_depth;          /* n_out per bank */
    /* Sub-slices: piece lists per (pass, s) at index pass * L + s; the row capacity E_sub
     * (elements, a multiple of 4 for 16-byte fp32 vectors) is the same in every pass. */
    uint64_t subslice_elems;   /* E_sub */
    int *num_pieces;           /* n_part L entries */
    tide_rs_piece_t **pieces;  /* n_part L arrays */
    /* The rail lane (L = 1, tide_lane_t): no staging, outbox or spare; the inbox holds two
     * generations of one gradient-dtype block (E_sub elements), and the all-gather has no
     * receive stage.  Set by tide_plan_create from the resolved config. */
    bool rail_lane;
    /* Level-1 copy descriptors per rank per call. */
    uint64_t descriptors_flat;
    uint64_t descriptors_coalesced;
} tide_rs_schedule_t;

/* Send-order contributor index c(m, n) (eq. 6): (m - n) mod M, or M for n == m. */
static inline int tide_rs_contributor(int nodes, int dest_node, int src_node) {
    return dest_node == src_node ? nodes : ((dest_node - src_node) % nodes + nodes) % nodes;
}
/* Sub-slice that local rank j fills for contributor c (eq. 7): (j + (c mod M)) mod L. */
static inline int tide_rs_subslice(int nodes, int L, int j, int c) {
    return (j + (c % nodes)) % L;
}
/* Destination GPU of contributor c's partial for sub-slice s (eq. 8): (s - (c mod M)) mod L. */
static inline int tide_rs_dest_gpu(int nodes, int L, int s, int c) {
    return ((s - (c % nodes)) % L + L) % L;
}

/*
 * Build the schedule: waves, rounds, generations, zero masks (computed across two consecutive
 * calls), outbox depth, sub-slices, descriptor counts.  Returns TIDE_ERR_PLAN_REJECTED (with
 * the collision in the message) when some wave maps two contributors to one GPU, and
 * TIDE_ERR_INVALID_ARGUMENT for W_wave outside [1, L], k outside [1, TIDE_MAX_ROUND_WIDTH], passes outside
 * [1, TIDE_MAX_PASSES].  geom may be NULL: then sub-slices and descriptors are left empty
 * (the validator's use).
 */
tide_result_t tide_rs_schedule_build(const tide_topo_t *topo, const tide_geom_t *geom,
                                     int wave_width, int round_width, tide_rs_mode_t mode,
                                     int passes, int staging_slots,
                                     tide_rs_schedule_t *sched_out);
void tide_rs_schedule_free(tide_rs_schedule_t *sched);

/* C_sum at M = 1: the sum CTAs that keep pace with an intra-node link of bw_link_gbps
 * (solver.c; the planner's default at M = 1 with the rates below). */
tide_result_t tide_solve_local_sum_ctas(int gpus_per_node, size_t grad_item, double bw_link_gbps,
                                        double bw_sum_gbps, int *out);
/* The rates the planner sizes a default C_sum with at M = 1: NVLink 4's 450 GB/s per
 * direction per GPU (H100 / H200 SXM through NVSwitch), and the paper's 99 GB/s per sum CTA
 * (App. G calibration, a sum over L = 8 sources), scaled by L (tide_plan_bw_sum_gbps). */
#define TIDE_PLAN_BW_LINK_GBPS 450.0
#define TIDE_PLAN_BW_SUM_GBPS 99.0
/* BW_sum for a default C_sum at M = 1 with L local sources of grad_item-byte gradients:
 * TIDE_PLAN_BW_SUM_GBPS times the default sum's measured rate per CTA over L sources relative
 * to L = 8 (bf16; fp32 gradients and L > 8 keep the L = 8 rate: not measured). */
double tide_plan_bw_sum_gbps(int gpus_per_node, size_t grad_item);

/* N_rounds(M - 1, k, W_wave): network rounds of one pass (used by the solver). */
int tide_rs_count_rounds(int nodes, int wave_width, int round_width);

/*
 * The validator: simulate the inbox of every destination node over two consecutive calls
 * (all passes, all waves) using only the schedule's waves, generations and zero masks, and
 * check that each landing sees exactly one fresh partial or a zero in every block.  Also
 * checks outbox reuse (a block is refilled only after its send).  Independent of how the
 * schedule computed its masks: it tracks block contents itself.
 */
tide_result_t tide_rs_validate(const tide_rs_schedule_t *sched, tide_validation_t *report_out);

/* Same check without building masks first: collision scan of the raw wave partition. */
bool tide_rs_find_collision(int nodes, int L, int wave_width, tide_validation_t *report_out);

/* ------------------------------------------------------------------ memory (§5.4) */

typedef struct {
    tide_region_info_t regions[TIDE_REGION_COUNT];
    uint64_t total_bytes;
} tide_arena_layout_t;

/* 8-byte counters reserved in TIDE_REGION_SIGNALS for the program's signals. */
#define TIDE_ARENA_SIGNAL_SLOTS 4096

/* Exact arena of a plan: every region's offset and size, aligned to TIDE_ARENA_ALIGN. */
tide_result_t tide_arena_layout(const tide_topo_t *topo, const tide_geom_t *geom,
                                const tide_rs_schedule_t *rs, tide_arena_layout_t *layout_out);

/* ------------------------------------------------------------------ the plan object */

struct tide_plan {
    tide_config_t config; /* as resolved (zeros replaced by the chosen values) */
    tide_topo_t topo;
    tide_geom_t geom;
    tide_ag_schedule_t ag;
    tide_rs_schedule_t rs;
    tide_arena_layout_t arena;
    uint64_t ag_descriptors_max;
};

#endif /* TIDE_PLAN_PLAN_H_ */
