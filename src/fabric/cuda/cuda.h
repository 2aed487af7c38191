/*
 * cuda.h - the CUDA fabric's internal objects (docs/cuda-fabric.md).
 *
 * One process drives all N = M L ranks; rank r lives on visible device r mod D (several
 * virtual ranks per GPU are allowed).  Arenas are plain cudaMalloc allocations reached from
 * every device through UVA and peer access.
 *
 * Signals and waits never poll on the device.  A program's counters are resolved on the host
 * when its schedule is built (program/schedule.c): an abstract execution of two consecutive calls of
 * all ranks gives a global order of every op and, for every WAIT, the SIGNAL instances that
 * satisfy it.  At run time each (rank, queue) is a CUDA stream, a signalling op records an
 * event, a WAIT becomes cudaStreamWaitEvent on the events of its signals (program/schedule_commands.c), and
 * the host enqueues a whole call of all ranks in the global order once the last rank called
 * execute (execute.c).  Every dependency then points backwards in enqueue order, which is why
 * no aliasing of streams onto hardware queues can deadlock.
 *
 * The schedule (tide_schedule_t and its builder) belongs to the program layer: it needs no
 * GPU, lives in program/schedule.h, and the CPU build compiles and tests it.
 */
#ifndef TIDE_FABRIC_CUDA_CUDA_H_
#define TIDE_FABRIC_CUDA_CUDA_H_

/* The launchers in kernels/launch.h are declared for builds with CUDA. */
#ifndef TIDE_HAVE_CUDA
#define TIDE_HAVE_CUDA 1
#endif

#include "fabric/call_table.h"
#include "fabric/cuda/batch_copy.h"
#include "fabric/fabric.h"
#include "kernels/launch.h"
#include "program/direct.h"
#include "program/schedule.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* Streams per rank: one per queue of the program (a schedule's thread is rank * TIDE_CUDA_Q +
 * queue). */
#define TIDE_CUDA_Q TIDE_Q_COUNT

/* TIDE_CUDA_SLICE_US / TIDE_CUDA_SLICES (slices.c): each sum and landing as launches of about
 * `us` microseconds, or as `count` launches; both 0: one launch. */
typedef struct {
    int us, count;
} tide_cuda_slicing_t;

/* Streams per device unless TIDE_CUDA_STREAMS says otherwise: (rank, queue) pairs beyond it
 * share streams round-robin (correct, see the deadlock argument; only less concurrent). */
#define TIDE_CUDA_STREAMS_DEFAULT 64
/* Same-device copies of at least this many bytes (bytes x rows for a 2D copy) stay on
 * cudaMemcpyAsync instead of joining a batch, unless TIDE_CUDA_BATCH_MAX_BYTES says otherwise
 * (docs/cuda-fabric.md, "Batched copies", has the measurements).  With the batch grid scaled
 * to the batch's bytes, a lone copy in a batch takes longer on the GPU than as one
 * cudaMemcpyAsync by 2.3 us at 16 MiB, 2.1 us at 64 MiB and about 10 us at 256 MiB (H200),
 * while each copy a batch takes saves about 3.5 us of host time, and several copies in one
 * batch run faster than as memcpys at every size measured.  The crossover is near 100 MiB;
 * 64 MiB is the power of two below it.  A 1 MiB threshold measured worse on both counts: it
 * gave back most of batching's host saving, and GPU time as well. */
#define TIDE_CUDA_BATCH_MAX_BYTES_DEFAULT ((uint64_t)64 << 20)

/* ------------------------------------------------------------------ worlds */

typedef struct tide_cuda_group tide_cuda_group_t;

/* Shared by the N rank handles of one world. */
typedef struct {
    int refs;
    int ranks;
    int num_devices;    /* devices used: min(visible, N) */
    bool batch;         /* TIDE_CUDA_BATCH (default 1): runs of same-device copies batched */
    int direct;         /* TIDE_CUDA_DIRECT (default 7): single-device shortcuts (direct.c) */
    uint64_t batch_max_bytes; /* TIDE_CUDA_BATCH_MAX_BYTES: larger copies stay per op; 0: none */
    int batch_unroll, batch_streaming; /* TIDE_CUDA_BATCH_KERNEL: the batch kernel's variant */
    tide_cuda_slicing_t slicing; /* sums and landings as sliced launches (slices.c) */
    int *sm_count;      /* [num_devices] */
    size_t *max_pitch;  /* [num_devices] */
    cudaStream_t *pool; /* every stream created, pool_size entries */
    int pool_size;
    cudaStream_t *stream;           /* [N * TIDE_CUDA_Q]: the stream of each (rank, queue) */
    cudaStream_t *util;             /* [num_devices]: allocation zeroing and table uploads */
    cudaStream_t agg;               /* device 0: joins all ranks' ends into the fence of a call */
    cudaEvent_t *start;             /* [N]: the call's start on the caller's stream */
    cudaEvent_t *done;              /* [N]: the call's end on the caller's stream */
    cudaEvent_t *end;               /* [N * TIDE_CUDA_Q]: a thread's end, joined by the caller */
    pthread_mutex_t lock;           /* registrations, pending calls, enqueues */
    pthread_cond_t cond;            /* a pending call was enqueued */
    tide_cuda_group_t *registering; /* groups not every rank registered yet */
    uint64_t captured;              /* calls enqueued into a CUDA graph capture (graph.c) */
} tide_cuda_shared_t;

typedef struct {
    struct tide_fabric_world base;
    tide_cuda_shared_t *shared;
    uint64_t registrations; /* arena_create calls of this rank: pairs them across ranks */
} tide_cuda_world_t;

static inline int tide_cuda_device_of(const tide_cuda_shared_t *sh, int rank) {
    return rank % sh->num_devices;
}

/* Report a failed CUDA call once (TIDE_ERR_FABRIC with the CUDA error string) and clear the
 * runtime's last error, so that a later call does not see it again. */
tide_result_t tide_cuda_error(cudaError_t err, const char *file, int line, const char *what);

#define TIDE_CUDA_CALL(call, what)                                                                 \
    do {                                                                                           \
        cudaError_t tide_cuda_e_ = (call);                                                         \
        if (tide_cuda_e_ != cudaSuccess)                                                           \
            return tide_cuda_error(tide_cuda_e_, __FILE__, __LINE__, (what));                      \
    } while (0)

#define TIDE_CUDA_CALL_GOTO(call, what, res, label)                                                \
    do {                                                                                           \
        cudaError_t tide_cuda_e_ = (call);                                                         \
        if (tide_cuda_e_ != cudaSuccess) {                                                         \
            (res) = tide_cuda_error(tide_cuda_e_, __FILE__, __LINE__, (what));                     \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------------------ groups and calls */

/* One op of the pending call, bound to this call's addresses. */
typedef union {
    tide_bound_op_t op;
    tide_sum_args_t sum; /* segs and own point to device copies */
    tide_land_args_t land;
} tide_cuda_bound_t;

/* A maximal run of same-device copies of one thread (batch.c): the descriptors
 * [first, first + count) of the call's table, all of rank `rank`. */
typedef struct {
    int32_t rank;
    int32_t first; /* global descriptor slot (slot_base[rank] + index in the rank's table) */
    int32_t count;
    int32_t ctas; /* grid of its kernel: scaled with its bytes (batch_copy.h) */
} tide_cuda_batch_t;

/* A fused sum's device tables (direct.c); its plan (which landing stores each segment) is
 * the analysis's (program/direct.h). */
typedef struct {
    const tide_direct_fuse_seg_t *segs; /* [num_segs of the SUM's table], owned by pp->dir */
    int num_segs;
    tide_sum_fused_t *host[2];       /* [parity] pinned: upload sources */
    tide_sum_fused_t *last[2];       /* [parity]: what the device table holds */
    tide_sum_fused_t *dev[2];        /* [parity] device tables */
    bool valid[2], inflight[2];
    cudaEvent_t done[2];             /* [parity] the upload's completion */
} tide_cuda_fuse_t;

/* A program's device-side state: its schedule, events, and segment tables. */
typedef struct {
    bool ready;
    tide_schedule_t sched;
    cudaEvent_t *events[2];         /* [parity][slot] */
    void **table_mem;               /* [N]: one device allocation per rank */
    const void ***table_dev;        /* [N][table]: device copy of each segment table */
    const tide_program_t **checked; /* [N]: the program each rank's ops were compared with */
    tide_cuda_bound_t *bound;       /* [num_ops]: the pending call's ops */
    /* Batched copies (batch.c), when the world batches and the program has a run to batch. */
    bool batched;
    tide_sched_cmd_t *bcmds[TIDE_SCHED_FORMS]; /* the command lists with BATCH commands */
    int num_bcmds[TIDE_SCHED_FORMS];
    tide_cuda_batch_t *batches;
    int num_batches;
    int max_batch;                       /* largest count */
    int over_threshold[TIDE_SCHED_FORMS]; /* copies of runs kept per op by the size threshold */
    int num_desc;                        /* descriptor slots of all ranks */
    int *slot_base;                      /* [N + 1]: first slot of each rank */
    int32_t *slot_op;                    /* [num_desc]: op id of each slot */
    int32_t *slot_thread;                /* [num_desc]: its thread */
    tide_cuda_copy_desc_t *desc_call;    /* [num_desc]: the pending call's descriptors */
    tide_cuda_copy_desc_t *desc_host[2]; /* [parity] pinned, num_desc: upload sources */
    tide_cuda_copy_desc_t *desc_last[2]; /* [parity] num_desc: what the device tables hold */
    tide_cuda_copy_desc_t **desc_dev[2]; /* [parity][N]: device table of each rank */
    bool *desc_valid[2];                 /* [parity][N] */
    bool *desc_inflight[2];              /* [parity][N]: desc_done recorded after an upload */
    cudaEvent_t *desc_done[2];           /* [parity][N] */
    void *scratch;                       /* 2 * max_batch intervals (overlap check) */
    /* Direct mode (direct.c): an RS program whose nodes each live on one device.  The
     * analysis (program/direct.h) owns elide, land_src, fused_land, ag_src and ag_wait. */
    tide_direct_t dir;
    bool direct;                         /* some TIDE_CUDA_DIRECT bit applies */
    bool direct_sum;                     /* SUMs read the peers' gradients in place */
    int direct_l;                        /* L: ranks per node */
    uint8_t *elide;                      /* [num_ops]: copies not issued */
    tide_direct_land_src_t **land_src;     /* [num_ops]: LAND ops, num_segs x num_in sources */
    void **land_dev[2];                  /* [parity][num_ops]: device in_table of a LAND op */
    const float ***land_last[2];         /* [parity][num_ops]: what each device table holds */
    tide_cuda_fuse_t **fuse;             /* [num_ops]: SUM ops stored as their landings */
    uint8_t *fused_land;                 /* [num_ops]: LAND ops a fused sum does */
    /* Direct mode for the all-gather (direct_ag.c): rail puts of own shards elided. */
    bool direct_ag;                      /* some put is elided (`elide`) */
    tide_direct_ag_src_t *ag_src;        /* [num_ops]: copies that read an elided put's source */
    uint8_t *ag_wait;                    /* [N x N]: rank r's call-done follows rank j's call */
} tide_cuda_prepared_t;

/* TIDE_CUDA_BATCH (false: "0") and TIDE_CUDA_BATCH_MAX_BYTES (world.c), read when a world
 * is created; the one-process-per-rank fabric reads them too. */
bool tide_cuda_env_batch(void);
tide_result_t tide_cuda_env_batch_max_bytes(uint64_t *out);

/* Sliced launches (slices.c): TIDE_CUDA_SLICE_US and TIDE_CUDA_SLICES, and the SUM / LAND
 * of table `tb` issued as launches of about `us` each (or `count` launches); *sliced counts
 * the launches past the first. */
tide_result_t tide_cuda_env_slicing(tide_cuda_slicing_t *out);
cudaError_t tide_cuda_issue_sum(const tide_table_t *tb, const tide_sum_args_t *a, int ctas,
                                const tide_cuda_slicing_t *sl, cudaStream_t s, uint64_t *sliced);
cudaError_t tide_cuda_issue_land(const tide_table_t *tb, const tide_land_args_t *a, int ctas,
                                 const tide_cuda_slicing_t *sl, cudaStream_t s,
                                 uint64_t *sliced);

/* Batched copies (batch.c).  prepare: find the runs of the schedule's command lists (a copy
 * of sh->batch_max_bytes or more ends a run and stays per op), number their descriptors,
 * allocate the tables (nothing when no run has two copies).  fill: the
 * descriptors of rank r from the pending call's bound ops.  disjoint: whether the copies of a
 * batch may run concurrently (no destination overlaps another copy's source or destination);
 * otherwise the batch is issued copy by copy. */
tide_result_t tide_cuda_batch_prepare(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                      const tide_program_t *prog);
void tide_cuda_batch_free(tide_cuda_prepared_t *pp, int ranks);
void tide_cuda_batch_fill(tide_cuda_prepared_t *pp, int rank);
bool tide_cuda_batch_disjoint(tide_cuda_prepared_t *pp, const tide_cuda_batch_t *b);

/* TIDE_CUDA_DIRECT bits (direct.c): sums read the peers' gradients in place (the staging
 * pushes are elided); landings skip inputs no copy writes; inbox copies whose source stays
 * valid are elided and the landings read that source; fused sums (8); all-gather rail puts
 * of own shards elided, their readers reading the shard (16, direct_ag.c). */
enum { TIDE_CUDA_DIRECT_SUM = TIDE_DIRECT_SUM, TIDE_CUDA_DIRECT_ZERO = TIDE_DIRECT_ZERO,
       TIDE_CUDA_DIRECT_ALIAS = TIDE_DIRECT_ALIAS, TIDE_CUDA_DIRECT_FUSE = TIDE_DIRECT_FUSE,
       TIDE_CUDA_DIRECT_AG = TIDE_DIRECT_AG, TIDE_CUDA_DIRECT_ALL = TIDE_DIRECT_ALL,
       /* The default: every shortcut; verified bit for bit on the GPU matrix
        * (bench/results/h200-2026-12-03b: 701 configurations with 15; -04d: ctest -L gpu
        * with 31). */
       TIDE_CUDA_DIRECT_DEFAULT = TIDE_CUDA_DIRECT_ALL };



/* Direct mode (direct.c).  world: whether every node's ranks share a device and
 * TIDE_CUDA_DIRECT allows it; prepare: the elided copies and landing sources of an RS
 * program (nothing for other programs or worlds); row: rank r's pointer row of L P
 * gradients (the other local ranks in local-rank order, then its own); lands: the landing
 * tables of this call's parity, uploaded when they change, bound into pp->bound. */
bool tide_cuda_direct_world(const tide_cuda_shared_t *sh, int gpus_per_node);
/* The analysis of `prog` for the bits of `mask`, with each rank's device as its memory domain,
 * into pp->dir (program/direct.h). */
tide_result_t tide_cuda_direct_analyse(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                       const tide_program_t *prog, int mask);
tide_result_t tide_cuda_direct_prepare(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                       const tide_program_t *prog);
void tide_cuda_direct_free(tide_cuda_prepared_t *pp);
/* The all-gather's part (direct_ag.c): prepare finds the puts to elide (after
 * tide_cuda_direct_prepare, before the batches); sources rebinds their readers' sources for
 * the call being enqueued (after every rank bound it). */
tide_result_t tide_cuda_direct_ag_prepare(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                          const tide_program_t *prog);
void tide_cuda_direct_ag_sources(tide_cuda_prepared_t *pp);
void tide_cuda_direct_ag_free(tide_cuda_prepared_t *pp);
struct tide_cuda_family;
void tide_cuda_direct_row(const struct tide_cuda_family *fam, int L, int r, const void **row);
tide_result_t tide_cuda_direct_lands(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                     int parity);
/* Upload rank r's fused-sum tables of this parity on `stream` (the caller's, after the fence,
 * before the call's start) when they changed; bind them into pp->bound.  *uploads counts. */
tide_result_t tide_cuda_direct_fuse_upload(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                           int parity, int r, cudaStream_t stream,
                                           uint64_t *uploads);
/* A fused sum's device table, written once for both executors: fuse_row hands out the
 * pinned row of this parity cleared (allocating the table on first use, waiting for the
 * upload of call e - 2 that read the row), fused_entry is segment `seg` of a landing as the
 * fused sum stores it, fuse_commit uploads the row on `stream` when it differs from the
 * last upload of this parity (*uploads counts), fuse_free releases it all. */
tide_result_t tide_cuda_fuse_row(tide_cuda_fuse_t *f, int parity, tide_sum_fused_t **row_out);
void tide_cuda_fused_entry(const tide_land_args_t *la, const tide_table_t *tb, int seg,
                           tide_sum_fused_t *entry);
tide_result_t tide_cuda_fuse_commit(tide_cuda_fuse_t *f, int parity, cudaStream_t stream,
                                    uint64_t *uploads);
void tide_cuda_fuse_free(tide_cuda_fuse_t *f);
/* The per-call tables of direct mode, for a call captured into a CUDA graph (graph.c):
 * land_entries: the entries of LAND op `id` of thread t's table built per call (0: none);
 * land_fill: that table of the pending call; fuse_fill: the table of fused sum f. */
size_t tide_cuda_direct_land_entries(const tide_cuda_prepared_t *pp, int id, int t);
void tide_cuda_direct_land_fill(const tide_cuda_prepared_t *pp, int id, int t, const float **host);
void tide_cuda_direct_fuse_fill(const tide_cuda_prepared_t *pp, const tide_cuda_fuse_t *f,
                                tide_sum_fused_t *row);


/* ------------------------------------------------------------------ ops (ops.c) */

/* What every CUDA executor does the same way with a rank's ops (ops.c), whatever carries the
 * signals between ranks. */

/* Copy rank `rank`'s segment tables into one allocation of the current device (on `util`,
 * synchronised): *mem_out (NULL when there is none) and *dev_out[table] (NULL for an empty
 * one); both set only on success, the caller frees them. */
tide_result_t tide_cuda_tables_upload(const tide_rank_program_t *rp, int rank, cudaStream_t util,
                                      void **mem_out, const void ***dev_out);

/* How a rank's ops are bound for a call (tide_cuda_bind_rank). */
typedef struct {
    const void *const *table_dev; /* [tables]: the rank's device segment tables */
    const void *const *own;       /* device gradient pointer table of the call's parity */
    const uint8_t *skip;          /* [num_ops] or NULL: ops another path binds (rail puts) */
    int direct_l;                 /* > 0: direct sums read the L - 1 peers' rows of `own` */
    int num_params;               /* P: pointers per rank in a row of `own` */
} tide_cuda_bind_env_t;

/* Bind rank b->rank's ops of `prog` into bound[op id of sched]. */
tide_result_t tide_cuda_bind_rank(const tide_cuda_bind_env_t *env, const tide_schedule_t *sched,
                                  const tide_program_t *prog, const tide_binding_t *b,
                                  tide_cuda_bound_t *bound);

/* How data ops are launched on the rank's device (tide_cuda_op_issue). */
typedef struct {
    size_t max_pitch; /* cudaMemcpy2DAsync's pitch limit */
    int sm_count;
    int sum_ctas, landing_ctas;
    const tide_cuda_slicing_t *slicing;
} tide_cuda_op_env_t;

/* Counts of the last enqueued call (host enqueue figures). */
typedef struct {
    uint64_t calls;       /* calls enqueued so far */
    int form;             /* tide_sched_form_t of the last call */
    uint64_t descriptors; /* copies, memsets and kernel launches */
    uint64_t waits;       /* cudaStreamWaitEvent, including forks and joins */
    uint64_t records;     /* cudaEventRecord */
    uint64_t uploads;     /* gradient pointer and copy descriptor tables uploaded */
    uint64_t batches;     /* batched copy kernels (counted in descriptors) */
    uint64_t batched;     /* copies they ran */
    uint64_t unbatched;   /* copies of batches issued one by one (overlapping copies) */
    uint64_t over_threshold; /* same-device copies issued per op because of their size
                              * (TIDE_CUDA_BATCH_MAX_BYTES): copies that would have joined a
                              * batch without the threshold, counted in descriptors */
    uint64_t enqueue_ns;  /* host time of the last rank's execute (the whole enqueue) */
    uint64_t elided;      /* copies direct mode did not issue (direct.c) */
    uint64_t fused;       /* landings a fused sum stored (direct.c) */
    uint64_t rail_steps;  /* rail steps issued (mp_rails.c), counted in descriptors */
    uint64_t ce_batched;  /* copies of `batched` run by cudaMemcpyBatchAsync (mp_batch.c) */
    uint64_t sliced;      /* sum and landing launches past one per op (slices.c) */
    uint64_t direct;      /* one-process-per-rank RS (mp_direct.c): 0 pushed, 1 the sums read
                           * the peers' gradients in place, 2 and fused sums stored every
                           * rank's output */
    uint64_t sync_elided; /* 1: the call ran the synchronisation elision (mp_elide.c) */
    uint64_t wait_calls;  /* flag waits (counted in waits): the stream memory operations or
                           * wait kernels they took (mp_flags.c; runs batched, call.c) */
    uint64_t fence_skipped; /* 1: the call's start fence was implied (mp_execute.c) */
} tide_cuda_stats_t;

/* Issue op `index` of queue q of rank `rank` (program rp), bound to b, on stream s when it is
 * a data op (COPY, COPY2D, ZERO, CAST, SUM, LAND), counting into st; other kinds are the
 * executor's (nothing is issued).  A failure names rank, queue and op. */
tide_result_t tide_cuda_op_issue(const tide_cuda_op_env_t *env, const tide_rank_program_t *rp,
                                 int rank, int q, int index, const tide_cuda_bound_t *b,
                                 cudaStream_t s, tide_cuda_stats_t *st);
/* The checks at the entry of an execute: program and binding of this arena's rank (ranks
 * of the world), and the caller's stream (NULL: the default stream) on `device`;
 * *caller_out is the stream.  Messages start with `fabric`. */
tide_result_t tide_cuda_call_check(const char *fabric, const tide_program_t *prog,
                                   const tide_binding_t *binding,
                                   const struct tide_fabric_arena *arena, int ranks, int device,
                                   void *stream, cudaStream_t *caller_out);
/* Call bookkeeping: CLOCK_MONOTONIC in ns; the stats of a call about to be enqueued in form
 * `form` (the running count of calls of `prev`, every per-call count 0); the end of its
 * enqueue, started at t0_ns (counts the call, times it, publishes it into *out). */
uint64_t tide_cuda_now_ns(void);
tide_cuda_stats_t tide_cuda_stats_begin(const tide_cuda_stats_t *prev, int form);
void tide_cuda_stats_end(tide_cuda_stats_t *st, uint64_t t0_ns, tide_cuda_stats_t *out);
/* A failed launch of op `index` of queue q of rank `rank`, reported once. */
tide_result_t tide_cuda_op_failed(cudaError_t err, int rank, int q, int index, int kind,
                                  const char *call);

/* The calls of one collective on one group: AG, or RS (both modes share the RS counters). */
typedef struct tide_cuda_family {
    tide_collective_t coll;
    tide_cuda_prepared_t prep[TIDE_RS_MODE_COUNT]; /* AG uses prep[0] */
    cudaEvent_t fence[2];                          /* every rank finished call e: parity e % 2 */
    int64_t fence_epoch[2]; /* the call each fence was last recorded for; -1: none */
    int64_t last_epoch;     /* last enqueued call; -1: none */
    int last_prep;
    cudaEvent_t *user; /* [N * TIDE_EVENT_COUNT]: EVENT ops (read-done, call-done) */
    /* The pending call: bindings recorded, enqueued when the last rank arrives. */
    int pending;
    uint64_t pending_epoch;
    int pending_prep;
    bool *present;        /* [N] */
    cudaStream_t *caller; /* [N] */
    int sum_ctas, landing_ctas;
    int num_params;
    const void **grads; /* [N * P]: the call's gradient pointers */
    int own_row;        /* pointers per rank in the tables below: P, or L P in direct mode */
    const void **own_row_tmp; /* [own_row]: direct mode's row under construction */
    /* RS: gradient pointer tables, double-buffered by call parity. */
    void **own_dev[2];        /* [parity][N] device tables of P pointers */
    const void **own_host[2]; /* [parity] pinned N * P */
    const void **own_last[2]; /* [parity] N * P: what each device table holds */
    bool *own_valid[2];       /* [parity][N] */
    bool *own_inflight[2];    /* [parity][N]: own_done recorded after a copy from own_host */
    cudaEvent_t *own_done[2]; /* [parity][N] */
    /* Fail-stop: a call that failed after ranks recorded leaves the family unusable. */
    tide_result_t broken;
    char broken_msg[384];
    tide_cuda_stats_t stats;
    /* CUDA graphs (graph.c): the capture of the pending call and of the last call of each
     * parity (0: enqueued eagerly); tables owned by captured calls; the copy descriptor
     * table of each rank for the call being captured. */
    unsigned long long pending_capture;
    unsigned long long call_capture[2];
    struct tide_cuda_graph_mem *graph_mem;
    const tide_cuda_copy_desc_t **graph_desc; /* [N] */
} tide_cuda_family_t;

/* The arenas of one registration, shared by the N rank views. */
struct tide_cuda_group {
    tide_cuda_shared_t *shared;
    tide_cuda_group_t *next; /* in shared->registering */
    uint64_t seq;
    uint64_t signature;
    uint64_t bytes;
    int arrived;               /* ranks that called arena_create */
    int refs;                  /* views alive */
    tide_result_t failed;      /* the registration failed for some rank */
    uint8_t **bases;           /* [N] device pointers (a view: the parent's) */
    /* [0]: AG, [1]: RS, [2]: the cross-group fence of a view (prep[0]: plain, prep[1]: with
     * the inbox zeroed), whose calls also wait for the last call of every sibling view. */
    tide_cuda_family_t fam[3];
    /* Shared arenas (docs/arena.md): a view has the registration whose memory it shares as
     * `parent` (NULL: the group owns its memory); a parent lists its live views. */
    tide_cuda_group_t *parent;
    tide_cuda_group_t *views;      /* a parent's views, linked by view_next */
    tide_cuda_group_t *view_next;
    /* [0]: AG, [1]: RS: call arguments compared across ranks (call_compare.c) */
    tide_call_table_t checks[2];
};

typedef struct {
    struct tide_fabric_arena base;
    tide_cuda_group_t *group;
} tide_cuda_arena_t;

tide_result_t tide_cuda_arena_create(struct tide_fabric_world *world, uint64_t bytes,
                                     uint64_t signature, struct tide_fabric_arena **arena_out);
tide_result_t tide_cuda_arena_destroy(struct tide_fabric_arena *arena);
tide_result_t tide_cuda_arena_view_create(struct tide_fabric_arena *parent, uint64_t signature,
                                          struct tide_fabric_arena **view_out);
/* fabric.h's call_check, without waiting (call_compare.c). */
tide_result_t tide_cuda_call_compare(struct tide_fabric_arena *arena, tide_collective_t coll,
                                     uint64_t seq, uint64_t sig, int *other_rank_out,
                                     uint64_t *other_sig_out);

/* The family a program runs in: 0 AG, 1 RS, 2 the fence. */
static inline int tide_cuda_family_of(const tide_program_t *prog) {
    return prog->fence ? 2 : prog->coll == TIDE_COLL_ALL_GATHER ? 0 : 1;
}
/* Which prepared program of its family a program is: a fence's variant, a reduce-scatter's
 * mode (an all-gather has one). */
static inline int tide_cuda_prep_of(const tide_program_t *prog) {
    const int fi = tide_cuda_family_of(prog);
    return fi == 2 ? prog->fence - 1 : fi == 0 ? 0 : (int)prog->mode;
}

/* Build a program's schedule and upload its tables (first call of the program). */
tide_result_t tide_cuda_prepare(tide_cuda_group_t *g, tide_cuda_family_t *fam,
                                tide_cuda_prepared_t *pp, const tide_program_t *prog);
void tide_cuda_prepared_free(tide_cuda_prepared_t *pp, int ranks);
void tide_cuda_family_free(tide_cuda_family_t *fam, int ranks);
void tide_cuda_own_tables_free(tide_cuda_family_t *fam, int ranks);

tide_result_t tide_cuda_execute(struct tide_fabric_arena *arena, const tide_program_t *prog,
                                const tide_binding_t *binding, void *stream);

/* Enqueue the pending call of `fam` (all N bindings present). */
tide_result_t tide_cuda_enqueue(tide_cuda_group_t *g, tide_cuda_family_t *fam);

/* ------------------------------------------------------------------ queries (tests, tools) */

/* Device of a rank of the world. */
int tide_cuda_world_device(const struct tide_fabric_world *world);

/* Stats of the last enqueued call of a collective on a group. */
tide_result_t tide_cuda_arena_stats(const struct tide_fabric_arena *arena, tide_collective_t coll,
                                    tide_cuda_stats_t *stats_out);

/* The event an EVENT op of the last enqueued call records (cudaEvent_t), for rank `rank`:
 * read-done (sources may be released) or call-done. */
tide_result_t tide_cuda_arena_event(const struct tide_fabric_arena *arena, tide_collective_t coll,
                                    int rank, tide_event_t which, cudaEvent_t *event_out);

#endif /* TIDE_FABRIC_CUDA_CUDA_H_ */
