/*
 * tide.h - the one public header of libtide.
 *
 * TIDE: zero-copy, layout-aware all-gather (TIDE-AG) and reduce-scatter (TIDE-RS) for
 * PyTorch FSDP2.  The all-gather lands every shard at its final address in parameter-major
 * storage; the reduce-scatter reads per-parameter gradients where autograd left them and
 * reduces them into fp32 shards.
 *
 * Conventions (modelled on nccl.h):
 *  - every call returns a tide_result_t; outputs are the last arguments and are written only
 *    on success;
 *  - a failing call logs its reason once (TIDE_DEBUG=WARN, the default) and keeps it for
 *    tide_get_last_error() on the calling thread;
 *  - result codes and struct layouts are never renumbered; structs that callers fill carry a
 *    size/magic/version header initialised by a macro.
 */
#ifndef TIDE_H_
#define TIDE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_MAJOR 0
#define TIDE_MINOR 1
#define TIDE_PATCH 0
#define TIDE_VERSION_CODE (TIDE_MAJOR * 10000 + TIDE_MINOR * 100 + TIDE_PATCH)

#if defined(__GNUC__)
#define TIDE_API __attribute__((visibility("default")))
#else
#define TIDE_API
#endif

/* ---------------------------------------------------------------------------------------- */
/* Results                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Fixed values: never renumber, only append. */
typedef enum {
    TIDE_SUCCESS = 0,
    TIDE_ERR_INVALID_ARGUMENT = 1, /* a caller-supplied value is out of its documented range */
    TIDE_ERR_UNSUPPORTED = 2,      /* valid, but outside what TIDE serves: fall back to stock */
    TIDE_ERR_NO_MEMORY = 3,        /* a host allocation failed */
    TIDE_ERR_OVERFLOW = 4,         /* a size or offset does not fit in 64 bits */
    TIDE_ERR_PLAN_REJECTED = 5,    /* the schedule would collide or leave stale blocks */
    TIDE_ERR_INTERNAL = 6,         /* a TIDE bug: please report */
    TIDE_ERR_TIMEOUT = 7,          /* a wait missed its deadline (fail-stop) */
    TIDE_ERR_FABRIC = 8,           /* the fabric (CPU shm, CUDA, NCCL) reported an error */
    TIDE_ERR_CHECK_FAILED = 9,     /* the static program checker found a violated invariant */
    TIDE_ERR_DATA_MISMATCH = 10,   /* a data check found wrong elements */
    TIDE_RESULT_COUNT = 11
} tide_result_t;

/* Static string for a result code; never NULL. */
TIDE_API const char *tide_get_error_string(tide_result_t result);

/* Detailed message of the last failing call on this thread ("" if none). */
TIDE_API const char *tide_get_last_error(void);

/* Library version as TIDE_VERSION_CODE; version_out must be non-NULL. */
TIDE_API tide_result_t tide_get_version(int *version_out);

/* ---------------------------------------------------------------------------------------- */
/* Data types, modes, limits                                                                 */
/* ---------------------------------------------------------------------------------------- */

typedef enum {
    TIDE_DTYPE_BF16 = 0,
    TIDE_DTYPE_FP32 = 1,
    TIDE_DTYPE_FP16 = 2, /* recognised, not served: returns TIDE_ERR_UNSUPPORTED */
    TIDE_DTYPE_COUNT = 3
} tide_dtype_t;

/* Item size in bytes, or 0 for an unknown dtype. */
TIDE_API size_t tide_dtype_size(tide_dtype_t dtype);

/* Where TIDE-RS reads gradients from (paper §5.3). */
typedef enum {
    TIDE_RS_IN_PLACE = 0,   /* read autograd's storage; full outbox, n_out = D_rem */
    TIDE_RS_SLOT_REUSE = 1, /* read a vacated all-gather slot; partial outbox, eq. (9) */
    TIDE_RS_MODE_COUNT = 2
} tide_rs_mode_t;

#define TIDE_MAX_PARAMS 256     /* larger groups fall back to stock collectives */
#define TIDE_MAX_GPUS_PER_NODE 8 /* one NVSwitch domain */
#define TIDE_MAX_NODES 65536
#define TIDE_MAX_ROUND_WIDTH 4  /* k_max of the sizing solver (App. G) */
#define TIDE_MAX_PASSES 4       /* n_part */
#define TIDE_MAX_STAGING_SLOTS 64 /* n_stg: more slots than destinations buy nothing */

/* ---------------------------------------------------------------------------------------- */
/* Configuration                                                                             */
/* ---------------------------------------------------------------------------------------- */

#define TIDE_CONFIG_MAGIC 0x54494445u /* "TIDE" */

/*
 * Which programs serve a group (docs/protocol.md, "The rail lane").  A group with one rank per
 * node (L = 1: M rail peers, no local peers, e.g. an expert subgroup) runs the rail lane: the
 * all-gather forwards landing to landing with no receive stage, the reduce-scatter puts
 * gradient pieces straight into a double-buffered inbox with no staging, outbox or spare.
 * Both give the generic programs' bits.  AUTO picks the lane when L = 1 and M >= 2 (every
 * fabric runs it, over a rail transport too); GENERIC keeps the general programs (for
 * comparison); RAIL asks for the lane and is refused where it does not apply.
 */
typedef enum {
    TIDE_LANE_AUTO = 0,
    TIDE_LANE_GENERIC = 1,
    TIDE_LANE_RAIL = 2
} tide_lane_t;

/*
 * Topology and tuning of a plan.  Initialise with TIDE_CONFIG_INIT and override fields; zero
 * in a tuning field means "let the planner choose".
 */
typedef struct {
    size_t size;          /* sizeof(tide_config_t), set by TIDE_CONFIG_INIT */
    unsigned int magic;   /* TIDE_CONFIG_MAGIC */
    unsigned int version; /* TIDE_VERSION_CODE the caller compiled against */
    int nodes;            /* M >= 1 (0 with gpus_per_node 0: the communicator's, register only) */
    int gpus_per_node;    /* L in [1, TIDE_MAX_GPUS_PER_NODE] */
    int wave_width;       /* W_wave in [1, L]; 0 = L */
    int round_width;      /* k in [1, TIDE_MAX_ROUND_WIDTH]; 0 = min(2, max(1, M-1)) */
    int passes;           /* n_part in [1, TIDE_MAX_PASSES]; 0 = 1 */
    int staging_slots;    /* n_stg in [1, TIDE_MAX_STAGING_SLOTS]; 0 = 2 */
    tide_rs_mode_t mode;  /* TIDE_RS_IN_PLACE (default) or TIDE_RS_SLOT_REUSE: the group's mode */
    int sum_ctas;         /* Level-1 sum CTA budget; 0 = the planner's: 4, or at M = 1 sized
                             for NVLink (tide_solve with bw_link_gbps = 450, bw_sum_gbps = 0) */
    int landing_ctas;     /* landing CTA budget; 0 = solver/default (4) */
    int multicast;        /* 1: plan for NCCL multicast (descriptor counts, tide-plan); 0: unicast.
                             No fabric built so far issues multicast: the cpu and cuda fabrics
                             always run the unicast path, whatever this field says */
    tide_lane_t lane;     /* TIDE_LANE_AUTO (default): the rail lane when L = 1 and M >= 2 */
} tide_config_t;

#define TIDE_CONFIG_INIT                                                                      \
    {                                                                                         \
        sizeof(tide_config_t), TIDE_CONFIG_MAGIC, TIDE_VERSION_CODE, 1, 1, 0, 0, 0, 0,        \
            TIDE_RS_IN_PLACE, 0, 0, 0, TIDE_LANE_AUTO                                         \
    }

/* ---------------------------------------------------------------------------------------- */
/* Group signature                                                                           */
/* ---------------------------------------------------------------------------------------- */

/* One parameter logically reshaped as (dim0, inner): D_p rows of K_p elements. */
typedef struct {
    uint64_t dim0;  /* D_p >= 1 */
    uint64_t inner; /* K_p >= 1: product of the trailing dimensions */
} tide_param_shape_t;

/* An FSDP2 parameter group: shapes plus the all-gather and gradient dtypes. */
typedef struct {
    int num_params;                   /* P in [1, TIDE_MAX_PARAMS] */
    const tide_param_shape_t *shapes; /* num_params entries, in FSDP2 order */
    tide_dtype_t ag_dtype;            /* all-gather item (bf16 or fp32): b_ag */
    tide_dtype_t grad_dtype;          /* gradient item (bf16 or fp32): b_grad */
    tide_dtype_t shard_dtype;         /* sharded (master) dtype; != ag_dtype means a cast */
} tide_group_desc_t;

/* ---------------------------------------------------------------------------------------- */
/* Plans                                                                                     */
/* ---------------------------------------------------------------------------------------- */

typedef struct tide_plan *tide_plan_t;

/*
 * Build and validate the plan of one group on one topology.  Pure host computation: no
 * device, no communicator.  Returns TIDE_ERR_INVALID_ARGUMENT for malformed input,
 * TIDE_ERR_UNSUPPORTED for groups TIDE does not serve (the caller falls back to stock
 * collectives), TIDE_ERR_OVERFLOW for sizes beyond 64 bits, TIDE_ERR_PLAN_REJECTED when the
 * reduce-scatter schedule would collide.  *plan_out is set only on success.
 */
TIDE_API tide_result_t tide_plan_create(const tide_config_t *config, const tide_group_desc_t *group,
                                        tide_plan_t *plan_out);

/* Release a plan; NULL is a no-op. */
TIDE_API void tide_plan_destroy(tide_plan_t plan);

/* Geometry of parameter p (paper §2.1). */
typedef struct {
    uint64_t dim0;          /* D_p */
    uint64_t inner;         /* K_p */
    uint64_t rows_per_rank; /* R_p = ceil(D_p / N) */
    uint64_t shard_bytes;   /* s_p = R_p K_p b_ag */
    uint64_t shard_offset;  /* o_p = sum_{i<p} s_i */
    uint64_t fp32_offset;   /* byte offset of p's rows in the packed fp32 RS output */
} tide_param_geometry_t;

TIDE_API tide_result_t tide_plan_get_param(tide_plan_t plan, int p,
                                           tide_param_geometry_t *geometry_out);

/* Landing(p, r) = o_p N + r s_p (eq. 2): byte offset of rank r's shard of p. */
TIDE_API tide_result_t tide_plan_landing_offset(tide_plan_t plan, int p, int rank,
                                                uint64_t *offset_out);

/* Whole-plan figures. */
typedef struct {
    int nodes, gpus_per_node, ranks; /* M, L, N */
    int num_params;                  /* P */
    uint64_t shard_bytes;            /* S */
    uint64_t group_bytes;            /* N S: one unsharded group (landing slot) */
    uint64_t grad_shard_bytes;       /* S_grad */
    uint64_t fp32_shard_bytes;       /* S_fp32 */
    uint64_t fsdp2_pack_bytes;       /* B_pack (eq. 3) */
    int ag_rounds;                   /* R = ceil(log2 M) */
    uint64_t ag_descriptors_max;     /* most copy descriptors any rank issues per AG call */
    int rs_wave_width;               /* W_wave */
    int rs_waves;                    /* W */
    int rs_inbox_generations;        /* n_par */
    int rs_round_width;              /* k */
    int rs_rounds;                   /* network rounds per call, over all passes */
    int rs_passes;                   /* n_part */
    int rs_outbox_depth;             /* n_out */
    uint64_t rs_subslice_elems;      /* E_sub: capacity of one sub-slice row, elements */
    uint64_t rs_descriptors_flat;    /* (L-1) P M L style flat Level-1 copies per rank */
    uint64_t rs_descriptors;         /* coalesced Level-1 copies per rank (strided + tails) */
    uint64_t arena_bytes;            /* total arena per rank */
} tide_plan_summary_t;

TIDE_API tide_result_t tide_plan_get_summary(tide_plan_t plan, tide_plan_summary_t *summary_out);

/* The programs that serve the plan, AUTO resolved: TIDE_LANE_RAIL (the rail lane) or
 * TIDE_LANE_GENERIC.  A registered group's plan (tide_group_plan) also says what its fabric
 * runs: AUTO falls back to GENERIC where the fabric does not run the lane. */
TIDE_API tide_result_t tide_plan_get_lane(tide_plan_t plan, tide_lane_t *lane_out);

/* Regions of the per-rank arena, in layout order. */
typedef enum {
    TIDE_REGION_LANDING0 = 0,   /* all-gather ring slot 0 (N S) */
    TIDE_REGION_LANDING1 = 1,   /* all-gather ring slot 1 (N S) */
    TIDE_REGION_RECV_STAGE = 2, /* AG receive stage ((M-1) S, M S with a cast) */
    TIDE_REGION_RESIDENT = 3,   /* resident shards for in-place adoption (S, 0 with a cast) */
    TIDE_REGION_STAGING = 4,    /* RS Level-1 bf16 staging, n_stg slots */
    TIDE_REGION_OUTBOX = 5,     /* RS outbox, 2 banks x n_out blocks */
    TIDE_REGION_SPARE = 6,      /* RS own-node spares, one block per bank */
    TIDE_REGION_INBOX = 7,      /* RS inbox, n_par generations x L blocks */
    TIDE_REGION_SIGNALS = 8,    /* counters and signals */
    TIDE_REGION_COUNT = 9
} tide_region_t;

typedef struct {
    uint64_t offset; /* from the arena base, aligned to TIDE_ARENA_ALIGN */
    uint64_t bytes;
} tide_region_info_t;

#define TIDE_ARENA_ALIGN 4096u

TIDE_API tide_result_t tide_plan_get_region(tide_plan_t plan, tide_region_t region,
                                            tide_region_info_t *info_out);
/* Static name of a region ("landing0", ...), or "unknown". */
TIDE_API const char *tide_region_name(tide_region_t region);

/* ---------------------------------------------------------------------------------------- */
/* Memory model (paper §5.4, eqs. 10-12), in units of N S                                    */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    double in_place_staging_ns;   /* eq. (11) */
    double slot_reuse_staging_ns; /* eq. (12) */
    double in_place_total_ns;     /* ring slots + receive stage + staging + previous grads */
    double slot_reuse_total_ns;   /* ring slots + receive stage + staging */
    double fsdp2_total_ns;        /* stock FSDP2: 4 N S */
    /* The rail lane (L = 1, M >= 2; tide_lane_t), which AUTO picks there: no receive stage,
     * and the RS holds only an inbox of two gradient blocks (2 S_grad = 2 S for bf16), read
     * in place otherwise.  rail_lane is 0 (and the two totals 0) on other topologies. */
    int rail_lane;
    double rail_lane_staging_ns;  /* the two inbox blocks */
    double rail_lane_in_place_total_ns;   /* ring slots + inbox + previous grads */
    double rail_lane_slot_reuse_total_ns; /* ring slots + inbox */
} tide_memory_bounds_t;

/*
 * Closed-form live-byte bounds for bf16 inputs and n_stg = 2 staging slots.
 * round_width is k >= 1, inbox_generations n_par in {1, 2}.
 */
TIDE_API tide_result_t tide_memory_bounds(int nodes, int gpus_per_node, int round_width,
                                          int inbox_generations, tide_memory_bounds_t *bounds_out);

/* ---------------------------------------------------------------------------------------- */
/* Sizing solver (paper App. G, eqs. 13-14)                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    int nodes, gpus_per_node;   /* M, L */
    int wave_width;             /* W_wave; 0 = L */
    int passes;                 /* n_part; 0 = 1 */
    tide_dtype_t grad_dtype;    /* b_grad */
    double bw_nic_gbps;         /* sustained per-rail throughput, GB/s */
    double bw_sum_gbps;         /* Level-1 sum rate per CTA, GB/s (read + write); 0 = the
                                   library's: the paper's 99 at L = 8 bf16 sources, scaled by
                                   the default sum's measured rate over L (docs/tide-plan.md) */
    double bw_land_gbps;        /* landing rate per CTA, GB/s */
    double bw_cap_gbps;         /* landing fabric ceiling, GB/s */
    double t_round_ms;          /* calibrated per-round wait overhead */
    uint64_t fp32_shard_bytes;  /* S_fp32 of the group */
    /* Per-GPU intra-node ingress (NVLink through NVSwitch), GB/s.  At M = 1 the Level-1 sum
     * is the whole reduce-scatter and must keep pace with this link, not with a rail: C_sum
     * is then sized by it (tide_solve).  0: not given (M = 1 then sizes C_sum by eq. 13 as
     * at M > 1).  Ignored at M > 1. */
    double bw_link_gbps;
} tide_solver_input_t;

typedef struct {
    int round_width;  /* k */
    int sum_ctas;     /* C_sum */
    int landing_ctas; /* C_mc */
    double t_nic_ms;  /* (M-1) S_fp32 / BW_NIC */
    int rounds;       /* N_rounds(M-1, k, W_wave) */
} tide_solver_output_t;

TIDE_API tide_result_t tide_solve(const tide_solver_input_t *input, tide_solver_output_t *output);

/* ---------------------------------------------------------------------------------------- */
/* Schedule validation (paper App. D)                                                        */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    int accepted;     /* 1: collision-free and stale-block free over two consecutive calls */
    int wave;         /* first colliding wave (when rejected) */
    int subslice;     /* s */
    int gpu;          /* destination local GPU j */
    int contributor0; /* the two contributors c that map to (s, j) in that wave */
    int contributor1;
    uint64_t blocks_checked; /* inbox block landings simulated */
} tide_validation_t;

/*
 * Simulate the TIDE-RS inbox for one (M, L, W_wave, k, mode, n_part) schedule.  Returns
 * TIDE_SUCCESS whenever the arguments are valid; the verdict is in report_out->accepted.
 */
TIDE_API tide_result_t tide_validate_schedule(int nodes, int gpus_per_node, int wave_width,
                                              int round_width, tide_rs_mode_t mode, int passes,
                                              tide_validation_t *report_out);

/* ---------------------------------------------------------------------------------------- */
/* Communicators, groups and the collectives                                                */
/* ---------------------------------------------------------------------------------------- */

typedef enum {
    TIDE_FABRIC_CPU = 0,  /* host memory in POSIX shm; memcpy copy engine; the oracle */
    TIDE_FABRIC_CUDA = 1, /* one process, ranks placed on the visible GPUs (virtual ranks) */
    TIDE_FABRIC_NCCL = 2, /* NCCL 2.28 symmetric windows: tide_comm_init_nccl(_comm) below */
    TIDE_FABRIC_COUNT = 3
} tide_fabric_kind_t;

typedef struct tide_comm *tide_comm_t;
typedef struct tide_group *tide_group_t;

/*
 * One process drives all N = M L ranks (like ncclCommInitAll): comms_out receives N handles,
 * rank r's handle at index r.  Each rank's calls must then be made from its own thread (the
 * CPU fabric) or may be made from one thread (the CUDA fabric, which enqueues and returns).
 */
TIDE_API tide_result_t tide_comm_init_all(tide_fabric_kind_t fabric, int nodes, int gpus_per_node,
                                          tide_comm_t *comms_out);

/*
 * One process per rank (CPU and CUDA fabrics): every rank calls this with the same `name` (a
 * short identifier, [A-Za-z0-9_-], shared by the ranks of one job) and its own rank.  CUDA:
 * the rank runs on the calling thread's current device; all ranks must be on one host
 * (docs/cuda-fabric.md, "One process per rank").
 */
TIDE_API tide_result_t tide_comm_init_rank(tide_fabric_kind_t fabric, int nodes, int gpus_per_node,
                                           int rank, const char *name, tide_comm_t *comm_out);

/*
 * The NCCL fabric (docs/nccl-fabric.md): one process per rank on NCCL >= 2.28, loaded at run
 * time (the libnccl.so.2 already in the process, e.g. torch's; else TIDE_NCCL_LIBRARY or the
 * default search path).  NCCL types stay opaque here.  The rank runs on the calling thread's
 * current device (tide_comm_init_nccl) or on the communicator's (tide_comm_init_nccl_comm).
 * NVLink multicast stays off: NCCL_NVLS_ENABLE is set to 0 when unset, and any other value
 * is refused (TIDE_ERR_UNSUPPORTED).  This release serves one node (nodes = 1); more nodes
 * return TIDE_ERR_UNSUPPORTED before any NCCL call.  Without NCCL in the build, or without
 * a loadable libnccl, these return TIDE_ERR_UNSUPPORTED saying why.
 */
#define TIDE_NCCL_UNIQUE_ID_BYTES 128 /* sizeof(ncclUniqueId) */

/* ncclGetUniqueId through the loaded library: TIDE_NCCL_UNIQUE_ID_BYTES bytes to id_out,
 * which rank 0 shares with the others (any out-of-band channel). */
TIDE_API tide_result_t tide_nccl_get_unique_id(void *id_out);

/* From scratch: every rank calls this with the same id; TIDE creates the NCCL communicator
 * (ncclCommInitRankConfig) and owns it. */
TIDE_API tide_result_t tide_comm_init_nccl(int nodes, int gpus_per_node, int rank,
                                           const void *nccl_unique_id, tide_comm_t *comm_out);

/* From an existing ncclComm_t of N = nodes x gpus_per_node ranks (what ProcessGroupNCCL
 * holds), passed as void *: collective over it (every rank calls this).  TIDE takes the rank
 * and device of the communicator, splits its own communicators from it (ncclCommSplit) and
 * never issues work on it; the caller keeps it and must destroy the TIDE communicator first. */
TIDE_API tide_result_t tide_comm_init_nccl_comm(void *nccl_comm, int nodes, int gpus_per_node,
                                                tide_comm_t *comm_out);

/*
 * Release a communicator; every group registered on it must be deregistered first.
 *
 * Handles: every call checks its communicator / group handle against a process-wide table
 * of live objects before reading it, so a destroyed or deregistered handle (a double
 * destroy, a call after deregistration) returns TIDE_ERR_INVALID_ARGUMENT instead of reading
 * freed memory.  Released objects are held back from reuse for the next 1024 releases, so a
 * stale handle cannot silently resolve to a newer object within that window.
 */
TIDE_API tide_result_t tide_comm_destroy(tide_comm_t comm);

TIDE_API tide_result_t tide_comm_rank(tide_comm_t comm, int *rank_out);

/*
 * Register a parameter group (collective: every rank of the communicator calls it with the
 * same config and group).  Plans the group, compiles its programs, allocates and zeroes its
 * arena.  The communicator owns the topology: set config->nodes = config->gpus_per_node = 0
 * to take its M and L (TIDE_CONFIG_INIT's 1 x 1 suits tide_plan_create on its own); nonzero
 * values must match the communicator.  TIDE_ERR_NO_MEMORY when the arena cannot be
 * allocated, with its size in the message.
 */
TIDE_API tide_result_t tide_group_register(tide_comm_t comm, const tide_config_t *config,
                                           const tide_group_desc_t *group, tide_group_t *group_out);

/* Collective; releases the arena. */
TIDE_API tide_result_t tide_group_deregister(tide_group_t group);

/* The plan the group runs (owned by the group). */
TIDE_API tide_result_t tide_group_plan(tide_group_t group, tide_plan_t *plan_out);

/*
 * Landing slot `slot` (0 or 1) of this rank: N S bytes of parameter-major storage where
 * parameter p's unsharded (padded) tensor starts at o_p N.  Valid until deregistration.
 */
TIDE_API tide_result_t tide_group_landing(tide_group_t group, int slot, void **ptr_out);

/*
 * Resident shard region (S bytes) for in-place shard adoption (§3.1): copy the packed shard
 * there once; then pass shard = NULL to tide_all_gather.  TIDE_ERR_UNSUPPORTED with a cast.
 */
TIDE_API tide_result_t tide_group_resident(tide_group_t group, void **ptr_out);

/*
 * TIDE-AG.  shard: this rank's packed shard (S bytes of ag_dtype, param p at o_p), or the
 * packed fp32 master shard when the group casts (shard_dtype fp32, ag_dtype bf16), or NULL
 * to read the resident region.  On return of the CPU fabric (when the CUDA fabric's stream
 * reaches the call-complete point) landing slot `slot` holds every rank's shard at
 * Landing(p, r).  stream: cudaStream_t for the CUDA fabric, NULL otherwise.
 */
TIDE_API tide_result_t tide_all_gather(tide_group_t group, const void *shard, int slot,
                                       void *stream);

/*
 * TIDE-RS.  grads[p]: this rank's unsharded gradient of parameter p (D_p K_p items of
 * grad_dtype, row-major), read in place.  out: this rank's fp32 shard (S_fp32 bytes, param p
 * at 4 x elem_offset_p).  Computes
 *     out = (accumulate ? out : 0) + alpha * sum_u G_p^(u)[rows of this rank]
 * in fp32 with the association order of §4.3; the padding rows past D_p are written as +0
 * in every call, accumulating or not.  The order depends only on (M, L, W_wave): every
 * other knob (passes, staging slots, CTA budgets, round width, mode) leaves the result
 * bitwise unchanged, and so does any W_wave >= M (one wave per pass); wave widths that cut
 * the contributors into different waves change the rounding of alpha's per-wave products.
 * alpha must be a finite, normal fp32 number: NaN, +-Inf, 0 and subnormals are refused
 * (TIDE_ERR_INVALID_ARGUMENT), as a zero or denormal scale would silently discard or
 * distort every gradient.
 * mode: In-Place or Slot-Reuse (same arithmetic).  The mode belongs to the group
 * (config->mode, which sizes its outbox); this argument is kept for ABI compatibility and
 * may still name the other mode, which is then compiled on first use.  New code should
 * call tide_reduce_scatter_checked, which takes no mode.
 *
 * Both collectives are checked across ranks on the CPU fabric: before any data moves every
 * rank posts the arguments that must agree (the all-gather slot; alpha, accumulate and mode)
 * and compares them with every other rank's; a disagreement returns
 * TIDE_ERR_INVALID_ARGUMENT on every rank naming both values, and, like any failure after a
 * call started, leaves the group unusable (deregister it).  A rank that never makes the call
 * is reported as TIDE_ERR_TIMEOUT after TIDE_TIMEOUT_MS.  The CUDA fabric with one process
 * per rank compares them the same way (through host memory the group's processes share), the
 * NCCL fabric through a small all-gather over its own communicator.  The single-process CUDA
 * fabric compares them without waiting (one thread may enqueue every rank): the rank that
 * differs and every rank after it are refused at once, the ranks that called before it at
 * their next call of that collective (nothing of the refused call runs).
 */
TIDE_API tide_result_t tide_reduce_scatter(tide_group_t group, const void *const *grads, float *out,
                                           float alpha, int accumulate, tide_rs_mode_t mode,
                                           void *stream);

/*
 * Checked variants: the same collectives, given the caller's buffer lengths, which must equal
 * what the group reads and writes (TIDE_ERR_INVALID_ARGUMENT naming the expected size
 * otherwise).  shard_bytes: tide_plan_summary_t's shard_bytes (S), or 4 sum R_p K_p (=
 * fp32_shard_bytes) for a casting group, or 0 with shard = NULL.  grad_bytes[p]: D_p K_p
 * b_grad for each of the num_grads = P gradients; out_bytes: S_fp32.  The reduce-scatter
 * runs the group's mode (config->mode): the mode is given once, at registration.
 *
 * The unchecked calls above have the same contract without the lengths: the buffers must
 * be at least those sizes, which the library cannot verify.  Both forms refuse operands that
 * alias the arenas the call writes: a shard anywhere in an arena except inside this rank's
 * resident region, an output anywhere in an arena, gradients anywhere in an arena except
 * inside this rank's landing slots (Slot-Reuse reads a vacated slot), and gradients that
 * overlap the output.
 */
TIDE_API tide_result_t tide_all_gather_checked(tide_group_t group, const void *shard,
                                               uint64_t shard_bytes, int slot, void *stream);
TIDE_API tide_result_t tide_reduce_scatter_checked(tide_group_t group, const void *const *grads,
                                                   const uint64_t *grad_bytes, int num_grads,
                                                   float *out, uint64_t out_bytes, float alpha,
                                                   int accumulate, void *stream);

/*
 * CUDA graphs (docs/cuda-fabric.md, "CUDA graphs").  On the single-process CUDA fabric
 * (tide_comm_init_all with TIDE_FABRIC_CUDA) tide_all_gather and tide_reduce_scatter (both
 * modes, with and without accumulate, and the _checked forms) may be called while `stream` is
 * being captured (cudaStreamBeginCapture); the graph replays the captured calls.  Every
 * rank's stream of one call must be in the same capture (with one device, pass one stream
 * for all ranks, or fork the others from the capturing stream with events).  Preconditions:
 *   - each program ran once outside the capture (the all-gather, each reduce-scatter mode
 *     used): its first call allocates and uploads device state;
 *   - the operands stay where they were at capture: the same shard, gradient and output
 *     pointers, their contents rewritten between replays as needed; the group stays
 *     registered while the graph may run (the arena addresses are fixed by registration);
 *   - a launch runs after every earlier call of the group on every rank's stream (launched
 *     on a stream those calls are ordered before), a launch after the previous launch, and
 *     eager calls after a launch are ordered after it (one stream for all ranks gives all
 *     three);
 *   - no other capture holds the world's streams, and no eager call, registration or
 *     deregistration of the world runs while a capture is under way.
 * Refused with TIDE_ERR_UNSUPPORTED (nothing recorded, the group stays usable): the first
 * call of a program, calls of groups on a shared arena on the single-process fabric, ranks
 * of one call in different captures, a call on the legacy default stream during a capture,
 * and every call of the NCCL fabric while its stream is capturing.
 * On the one-process-per-rank CUDA fabric (tide_comm_init_rank with TIDE_FABRIC_CUDA) each
 * process captures its own rank's calls with the same preconditions; in addition every rank
 * captures the same calls and launches the same graphs in the same order, a family
 * (all-gather, reduce-scatter) with a captured call is replay-only until the group is
 * deregistered (its eager calls are refused), replays have ended before the group is
 * deregistered, and a failed replay (every device wait of a replay ends by TIDE_TIMEOUT_MS)
 * is reported with TIDE_ERR_TIMEOUT at the group's next call (docs/cuda-fabric.md, "CUDA
 * graphs across processes").  Groups on a shared arena (tide_groups_register) are captured
 * there as a whole set, in one graph: after every program of every group, and each variant
 * of their cross-group fence, ran once outside the capture; from the first captured call on,
 * every eager call of the set is refused until deregistration, and a fence whose sibling was
 * captured in another graph is refused (docs/cuda-fabric.md, "Shared-arena sets").
 * tide_group_capture_readiness (below) says beforehand, without calling, whether a call
 * would be captured or refused, and why.
 * The device tables of a captured call are kept until the group is deregistered.  Events
 * recorded by a captured call (tide_group_read_done_event) mark points inside the capture:
 * later captured work may wait on them; a replay does not record them for eager waits.
 */

/* The CUDA graph capture `stream` (a cudaStream_t; NULL: the legacy default stream) is part
 * of, as the calls above see it: *key_out = 0 when it is not capturing, else the capture's
 * id + 1 (cudaStreamGetCaptureInfo), which tells two captures apart.  TIDE_ERR_UNSUPPORTED
 * in a build without CUDA, for the legacy default stream while a capture is under way, and
 * for an invalidated capture. */
TIDE_API tide_result_t tide_stream_capture_key(void *stream, uint64_t *key_out);

/* A collective call of a group, as tide_group_capture_readiness asks about it. */
typedef enum {
    TIDE_CALL_ALL_GATHER = 0,
    /* The group's reduce-scatter in its registered mode (the _checked form), the gradients
     * outside the arena. */
    TIDE_CALL_REDUCE_SCATTER = 1,
    /* The same with the gradients staged in the group's own landing slot, vacated by its
     * reshard (Slot-Reuse on a shared arena): the call also touches that landing. */
    TIDE_CALL_REDUCE_SCATTER_STAGED = 2,
    TIDE_CALL_KIND_COUNT = 3
} tide_call_kind_t;

/* Why a call would not be captured: bits of tide_capture_readiness_t.blockers.  Fixed
 * values: never renumbered, only appended. */
typedef enum {
    TIDE_CAPTURE_UNUSABLE = 1u << 0,     /* an earlier call failed: every call fails */
    TIDE_CAPTURE_PROGRAM_COLD = 1u << 1, /* the call's program never ran outside a capture */
    TIDE_CAPTURE_FENCE_COLD = 1u << 2,   /* the cross-group fence variant the call runs first
                                            (shared arena) never ran outside a capture */
    TIDE_CAPTURE_NO_FABRIC = 1u << 3,    /* the communicator's fabric captures no such call */
    TIDE_CAPTURE_OTHER_GRAPH = 1u << 4   /* another capture holds the fabric's streams, or the
                                            set's calls were captured in another graph */
} tide_capture_blocker_t;

#define TIDE_CAPTURE_REASON_MAX 1024

typedef struct {
    uint32_t blockers;                    /* tide_capture_blocker_t bits; 0: it is captured */
    char reason[TIDE_CAPTURE_REASON_MAX]; /* a sentence per blocker, in the order of the
                                             bits, joined by "; " (cut to fit); "" if none */
} tide_capture_readiness_t;

/*
 * Whether a `call` of `group` made now on `stream` would be captured into the CUDA graph
 * that `stream` is being captured into (a capture that begins now when `stream` is not
 * capturing, NULL, or the build has no CUDA), and if not why: every blocker found, each with
 * a sentence.  It runs and enqueues nothing and changes no state: it answers from the state
 * the calls themselves check before they record a captured call (the same checks), namely
 * the group is usable; the call's program, and the cross-group fence variant that the call
 * would run first on a shared arena (which depends on the set's earlier calls), each ran
 * once outside a capture; the fabric captures such calls (the one-process-per-rank CUDA
 * fabric without a rail transport; the single-process CUDA fabric for groups registered
 * alone; never the CPU and NCCL fabrics: TIDE_CAPTURE_NO_FABRIC there, always); no other
 * capture holds the fabric's streams, and a fence would not wait on a sibling group's call
 * captured in another graph.  It says nothing about the call's operands and the ring rule
 * (tide_groups_register), which eager calls check alike, nor about an eager call after a
 * capture (refused on a set whose calls were captured).  Errors: an invalid group, a call
 * outside tide_call_kind_t, readiness_out NULL (TIDE_ERR_INVALID_ARGUMENT); the legacy
 * default stream during a capture and an invalidated capture (TIDE_ERR_UNSUPPORTED, as
 * tide_stream_capture_key).  readiness_out is set only on success.
 */
TIDE_API tide_result_t tide_group_capture_readiness(tide_group_t group, tide_call_kind_t call,
                                                    void *stream,
                                                    tide_capture_readiness_t *readiness_out);

/* ---------------------------------------------------------------------------------------- */
/* Groups on one shared arena: the two-slot all-gather ring (docs/arena.md)                   */
/* ---------------------------------------------------------------------------------------- */

/* ring_slot of a group that needs a landing of its own (a group that stays unsharded). */
#define TIDE_RING_OWN_SLOT (-1)
/* Longest group name kept (longer names are cut), terminator included. */
#define TIDE_GROUP_NAME_MAX 64

/*
 * One group of a set planned onto one arena.  The ring slot is the group's landing: the
 * group at position g in execution order normally takes slot g mod 2 (tide_arena_plan does
 * not reorder).  Slot-Reuse gradients are staged in that same slot.
 */
typedef struct {
    const tide_config_t *config;    /* as for tide_group_register (nodes = 0: the comm's) */
    const tide_group_desc_t *group; /* the group's signature */
    int ring_slot;                  /* 0, 1 or TIDE_RING_OWN_SLOT */
    const char *name;               /* for messages ("layers.3"); NULL: "group <index>" */
} tide_group_entry_t;

typedef struct tide_arena_plan *tide_arena_plan_t;

/*
 * Plan one arena per rank for a set of groups (pure host computation, like tide_plan_create;
 * every entry's config must give the same nonzero nodes and gpus_per_node).  Layout, each
 * region aligned to TIDE_ARENA_ALIGN:
 *   landing0 / landing1  ring slots 0 and 1, each N S of the largest group assigned to it
 *   own slots            one landing per TIDE_RING_OWN_SLOT group
 *   recv_stage, staging, outbox, spare, inbox
 *                        shared by all groups, each sized for the largest group's need (0 when
 *                        no group needs it: the receive stage at M = 1 without a cast, the
 *                        outbox at M = 1)
 *   resident, signals    per group
 * Each group's plan (tide_arena_plan_group) keeps its own region table with offsets into
 * this arena, so its programs run unchanged.  Errors name the entry.
 */
TIDE_API tide_result_t tide_arena_plan_create(int num_groups, const tide_group_entry_t *entries,
                                              tide_arena_plan_t *plan_out);
TIDE_API void tide_arena_plan_destroy(tide_arena_plan_t plan);

typedef struct {
    int num_groups;
    int nodes, gpus_per_node;
    uint64_t total_bytes;                        /* the arena per rank */
    uint64_t region_bytes[TIDE_REGION_COUNT];    /* bytes by region kind (resident, signals:
                                                    all groups; landing0/1: the ring slots) */
    uint64_t own_slot_bytes;                     /* all TIDE_RING_OWN_SLOT landings */
    int largest_group;                           /* index of the largest N S */
    uint64_t largest_group_bytes;                /* its N S */
    uint64_t largest_rs_bytes;                   /* staging + outbox + spare + inbox it needs */
    uint64_t separate_bytes;                     /* sum of the groups' own arenas
                                                    (tide_group_register one by one) */
} tide_arena_summary_t;

TIDE_API tide_result_t tide_arena_plan_get_summary(tide_arena_plan_t plan,
                                                   tide_arena_summary_t *summary_out);
/* Region `region` of group `group` inside the shared arena (offset from the arena base);
 * group = -1 gives the arena-level extent of that region kind (for resident and signals,
 * the span of all groups' blocks). */
TIDE_API tide_result_t tide_arena_plan_get_region(tide_arena_plan_t plan, int group,
                                                  tide_region_t region,
                                                  tide_region_info_t *info_out);
/* The plan of group `group` (owned by the arena plan): tide_plan_get_region on it returns
 * the same regions; its landing1 is empty (a ring group has one slot). */
TIDE_API tide_result_t tide_arena_plan_group(tide_arena_plan_t plan, int group,
                                             tide_plan_t *plan_out);

/*
 * Register a set of groups on one arena (collective: every rank passes the same entries in
 * the same order).  Plans as tide_arena_plan_create does, compiles every group's programs,
 * allocates and zeroes one arena.  groups_out receives num_groups handles, entry i's at
 * index i.  Each group is deregistered with tide_group_deregister; the arena is released
 * with the last group of the set.  Fabrics: CPU; the CUDA and NCCL fabrics return
 * TIDE_ERR_UNSUPPORTED in this release (docs/arena.md, "Fabrics").
 *
 * Calls on a set's groups follow the ring rules (docs/arena.md):
 *  - tide_group_landing(g, 0) is g's ring slot (or own slot); slot 1 is refused, and so is
 *    tide_all_gather(g, ..., slot != 0): a set group has one landing;
 *  - an all-gather into a ring slot whose occupant (the last group gathered into it) is still
 *    live is refused with TIDE_ERR_INVALID_ARGUMENT naming both groups, before any data
 *    moves.  The occupant stops being live at tide_group_reshard, or when its Slot-Reuse
 *    reduce-scatter read the gradients staged in the slot (grads inside the slot);
 *  - consecutive calls of different groups that use the same shared region are ordered by a
 *    fence the library inserts (docs/protocol.md, "Cross-group fence").
 */
TIDE_API tide_result_t tide_groups_register(tide_comm_t comm, int num_groups,
                                            const tide_group_entry_t *entries,
                                            tide_group_t *groups_out);

/*
 * Reshard: this rank declares the group's unsharded parameters in its ring slot dead, so the
 * next group of the slot may all-gather into it.  Host-only and immediate: the caller must
 * have ordered its own readers of the slot before the next all-gather (a stream or the CPU
 * call order).  Every rank must reshard alike.  TIDE_ERR_INVALID_ARGUMENT when the group does
 * not hold its slot (it was not gathered since, or was already resharded); a group registered
 * alone (tide_group_register) has no ring and returns TIDE_SUCCESS.
 */
TIDE_API tide_result_t tide_group_reshard(tide_group_t group);

/* Whether the group currently holds its ring slot (1) or not (0). */
TIDE_API tide_result_t tide_group_slot_live(tide_group_t group, int *live_out);

/* The group's name: the entry's, or "group <index in its set>", or "group" alone. */
TIDE_API tide_result_t tide_group_name(tide_group_t group, const char **name_out);

/*
 * The read-done point of this rank's last reduce-scatter of the group: after it the call no
 * longer reads its gradients (Slot-Reuse: the staged ring slot), so the slot may be
 * overwritten.  CUDA fabric, one process driving the ranks (tide_comm_init_all): *event_out
 * is the cudaEvent_t recorded there (valid until the next reduce-scatter of the group; for a
 * call captured into a CUDA graph, a point inside the capture: waits in the same capture may
 * name it, a replay does not record it).  CPU
 * fabric: *event_out = NULL, the call returned after that point.  The one-process-per-rank
 * CUDA fabric and the NCCL fabric: TIDE_ERR_UNSUPPORTED in this release.
 */
TIDE_API tide_result_t tide_group_read_done_event(tide_group_t group, void **event_out);

/*
 * FSDP2's scaling folded into alpha: AVG = 1/N, PREMUL_SUM = factor, divide factors
 * (pre, post) = 1 / (pre * post).  There is no error channel in a float: an invalid
 * argument (ranks < 1; a divide factor that is 0, NaN or infinite; a product whose
 * reciprocal is not a normal fp32 number) returns NaN, which tide_reduce_scatter refuses,
 * and records the reason for tide_get_last_error().
 */
TIDE_API float tide_alpha_avg(int ranks);
TIDE_API float tide_alpha_divide(float predivide, float postdivide);

/*
 * ---------------------------------------------------------------- PyTorch allocator hooks
 *
 * Not collectives: the memory accounting of tide.fsdp (docs/memory.md "Counted by
 * PyTorch").  The one-process-per-rank CUDA and NCCL fabrics allocate each rank's arena
 * segment themselves (exportable to the peers); tide.fsdp makes those bytes visible to
 * torch.cuda.memory_reserved() and memory snapshots by allocating one tensor of the
 * segment's size in a torch.cuda.MemPool whose CUDAPluggableAllocator is
 * tide_torch_pool_alloc / tide_torch_pool_free.  The hooks never allocate nor free device
 * memory: they hand out a segment offered just before (tide_torch_pool_offer) and forget it
 * when PyTorch frees it; the fabric frees the memory at deregistration.
 */

/* This rank's arena segment holding `group`'s arena (the whole allocation, shared by every
 * group of a set): its base, its allocation size in bytes and its device.
 * TIDE_ERR_UNSUPPORTED on fabrics that do not allocate one device segment per rank (CPU,
 * one process for all ranks). */
TIDE_API tide_result_t tide_group_segment(tide_group_t group, void **ptr_out,
                                          uint64_t *bytes_out, int *device_out);
/* Offer: the next tide_torch_pool_alloc of at most `bytes` bytes on `device` returns `ptr`.
 * One offer at a time per pointer; TIDE_ERR_INVALID_ARGUMENT for a pointer already offered
 * or handed out, or when the registry is full. */
TIDE_API tide_result_t tide_torch_pool_offer(void *ptr, uint64_t bytes, int device);
/* Forget `ptr` whatever its state; *state_out (may be NULL) is what it was: 0 not
 * registered (never offered, or PyTorch freed it), 1 offered and not taken, 2 held by
 * PyTorch (its free was not seen). */
TIDE_API tide_result_t tide_torch_pool_withdraw(void *ptr, int *state_out);
/* What `ptr` is now, as tide_torch_pool_withdraw's *state_out, without forgetting it. */
TIDE_API tide_result_t tide_torch_pool_state(void *ptr, int *state_out);
/* The CUDAPluggableAllocator functions (PyTorch's signatures; ptrdiff_t is ssize_t).  alloc
 * hands out the pending offer when `size` fits it and `device` matches, else returns NULL
 * (logged: PyTorch reports an out-of-memory error).  free forgets a handed-out pointer;
 * anything else is logged and ignored. */
TIDE_API void *tide_torch_pool_alloc(ptrdiff_t size, int device, void *stream);
TIDE_API void tide_torch_pool_free(void *ptr, ptrdiff_t size, int device, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_H_ */
