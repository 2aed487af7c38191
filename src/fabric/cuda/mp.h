/*
 * mp.h - the CUDA fabric with one process per rank (tide_comm_init_rank(TIDE_FABRIC_CUDA,
 * ...)); docs/cuda-fabric.md, "One process per rank".
 *
 * What is shared with the one-process fabric: the program, its binding (bind.c), the
 * schedule and its command lists (program/schedule.c, schedule_commands.c), the kernels.  Each process builds
 * the whole schedule from its own copy of the program and replays only its rank's commands.
 * What is new is transport:
 *
 *   bootstrap  mp_boot.c: a socket mesh keyed by the job name (descriptors, barriers, liveness)
 *   memory     each rank's arena, with a flag area behind it, in one CUDA VMM allocation
 *              (cuMemCreate, POSIX fd handle) exported to the peers, which import and map it
 *              (cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess); when the driver
 *              refuses a shareable VMM allocation, cudaMalloc + cudaIpc{Get,Open}MemHandle
 *              (TIDE_CUDA_IPC=legacy forces this path)
 *   signals    a signal slot of the schedule (a signalling op some wait names) is a 64-bit flag
 *              in the recording rank's flag area (by default in the group's control block,
 *              host memory every process maps and registers with its device: mp_flags.c).
 *              RECORD writes the call number e + 1 with cuStreamWriteValue64 (a release:
 *              prior work of the stream is visible first); WAIT is cuStreamWaitValue64(flag,
 *              e + 1, GEQ) on the waiter's stream (with TIDE_CUDA_MP_FLAGS=kernel a wait
 *              kernel instead, mp_flags.c), WAIT_PREV the same with e.  Flags only grow, so
 *              they are cumulative across calls like the program's counters, and one flag
 *              per slot serves every call.
 *   fences     each rank's flag area starts with one done flag per collective, written e + 1
 *              on the caller's stream when its call e ended; a call waits (on the device) for
 *              every rank's done flag of call e - 2 (STEADY) or e - 1 (FRESH): the fence the
 *              one-process fabric builds from events (execute.c explains why it suffices).
 *
 * Enqueue order.  Every process enqueues its commands in the order of the schedule's global
 * list, so every dependency points backwards in that order; the first op of that order not
 * yet complete has all it waits for complete and nothing ahead of it in its stream: progress,
 * across processes as within one (a process that has not enqueued yet only delays it).
 *
 * Fail-stop.  The host waits (at most) for its own call e - 2 before enqueueing call e, and
 * tide_cuda_mp_sync waits for the last call: both poll with the watchdog, which ends the wait
 * when a peer's socket reads EOF (its process died), when another rank failed the group (the
 * abort word of the group's control block, mp_ctl.h), or at TIDE_TIMEOUT_MS.  A rank that
 * fails first names the missing rank (the dead one, else from the control block's per-rank
 * "entered call e" / "enqueued call e" counters: the rank that never entered the call waited
 * for), publishes the abort word with that message, and only then poisons every flag it maps
 * (value 2^62: every device wait passes) so that no stream stays blocked, drains its streams,
 * and fails the call and every later one of both collectives of the group with
 * TIDE_ERR_TIMEOUT.  Every other rank sees the word at its next call, in any host wait, and
 * after any wait that ended, and fails stop the same way with the first rank's message; so a
 * rank whose device waits the poison released never reports that call as complete (the abort
 * is visible before the poison can be).  A hung rank that resumes fails at its next call.
 * Deregistration still unmaps and releases every segment and the control block.  With host
 * flags the poison is CPU stores (no stream work that could queue behind a blocked queue);
 * with kernel waits the abort word's own CPU store releases them (mp_flags.c);
 * and a watchdog thread per world (watchdog.c) bounds the device work of every call this
 * rank enqueued by TIDE_TIMEOUT_MS and follows an abort with the poison, while the host is
 * outside TIDE too.
 *
 * Batched copies (mp_batch.c): as in the one-process fabric (batch.c), a thread's run of
 * same-device copies with nothing else of the thread between them is one launch of the batch
 * kernel, planned per call from this rank's command list (TIDE_CUDA_BATCH=0: every copy is
 * one cudaMemcpyAsync).
 *
 * CUDA graphs (mp_graph.c): a captured call numbers itself on the device (a call counter per
 * family), its signals and waits are kernels that read the counter, and its waits bound
 * themselves by TIDE_TIMEOUT_MS; a family with captured calls is replay-only.
 *
 * Not done here: every rank must run on one host (the bootstrap's sockets).
 */
#ifndef TIDE_FABRIC_CUDA_MP_H_
#define TIDE_FABRIC_CUDA_MP_H_

#include "fabric/cuda/cuda.h"
#include "fabric/cuda/mp_boot.h"
#include "fabric/cuda/mp_ctl.h"
#include "program/rails.h"
#include "program/sync_elide.h"

#include <cuda.h>

/* Signal slots a program may use (each an 8-byte flag per rank). */
#define TIDE_MP_FLAG_SLOTS 32768
/* Programs with flags: AG, RS in place, RS slot reuse. */
#define TIDE_MP_PREPS (1 + TIDE_RS_MODE_COUNT)
#define TIDE_MP_DONE_BYTES 256
/* Rail steps a program may have per call (mp_rails.c): two 8-byte rendezvous flags each for
 * the emulated transport. */
#define TIDE_MP_RAIL_STEPS 2048
#define TIDE_MP_RAIL_BYTES (TIDE_MP_PREPS * TIDE_MP_RAIL_STEPS * 16)
/* The slot flags of one more program: the cross-group fence of a set's view (mp_view.c), flag
 * index TIDE_MP_FENCE_FIDX, shared by its two variants (a switch between them is a FRESH call,
 * fenced after the previous one on every rank). */
#define TIDE_MP_FENCE_FIDX TIDE_MP_PREPS
#define TIDE_MP_SLOT_BYTES ((TIDE_MP_PREPS + 1) * TIDE_MP_FLAG_SLOTS * 8)
#define TIDE_MP_FLAG_BYTES (TIDE_MP_DONE_BYTES + TIDE_MP_SLOT_BYTES + TIDE_MP_RAIL_BYTES)
/* A poisoned flag: (int64_t)(flag - target) >= 0 for every call number. */
#define TIDE_MP_POISON ((uint64_t)1 << 62)

struct tide_mp_rails_ops;
struct tide_mp_direct;       /* mp_direct.c */
struct tide_mp_direct_world;
struct tide_mp_direct_call;

typedef struct {
    struct tide_fabric_world base;
    tide_mp_boot_t boot;
    int device;
    int sm_count;
    size_t max_pitch;
    cudaStream_t stream[TIDE_CUDA_Q];
    cudaStream_t util; /* zeroing, table uploads, flag reads, poison */
    cudaEvent_t start;
    cudaEvent_t end[TIDE_CUDA_Q];
    uint64_t registrations;
    bool batch;               /* TIDE_CUDA_BATCH: runs of same-device copies as one kernel */
    uint64_t batch_max_bytes; /* TIDE_CUDA_BATCH_MAX_BYTES: larger copies stay per op */
    int batch_unroll, batch_streaming; /* TIDE_CUDA_BATCH_KERNEL: the batch kernel's variant */
    tide_cuda_slicing_t slicing; /* sums and landings as sliced launches (slices.c) */
    int ce_batch;             /* TIDE_CUDA_CE_BATCH: TIDE_MP_CE_* */
    uint8_t uuid[16];         /* the device's, to tell which peers share it */
    /* Direct mode at M = 1 (mp_direct.c, TIDE_CUDA_MP_DIRECT): off on the NCCL fabric's worlds,
     * which have no socket mesh to exchange IPC handles over. */
    bool direct;
    struct tide_mp_direct_world *dworld; /* caller allocations exported and imported */
    /* Rail transport for the cross-node puts (mp_rails.c), or NULL: every op is issued as
     * itself, which needs every peer mapped (one host).  With one, fences cover this rank's
     * node only. */
    const struct tide_mp_rails_ops *rails;
    cudaStream_t rail_stream;
    int flags;                         /* TIDE_CUDA_MP_FLAGS: TIDE_MP_FLAGS_* (mp_flags.c) */
    bool elide; /* TIDE_SYNC_ELIDE: the synchronisation elision may run (mp_elide.c) */
    struct tide_mp_watchdog *watchdog; /* watchdog.c: device waits bounded off host calls */
    /* What carries this world's signals, fences, batches and rail puts (transport.h): the
     * ipc transport, or the nccl one on the NCCL fabric's worlds. */
    const struct tide_cuda_transport *transport;
    uint64_t graph_calls; /* calls captured into CUDA graphs on this world (mp_graph.c) */
} tide_mp_world_t;

/* Where the signal flags live and what a device wait is (TIDE_CUDA_MP_FLAGS, mp_flags.c);
 * rank 0's choice holds for its groups.  DEVICE is 0: the NCCL fabric's worlds (calloc'ed,
 * no environment read) keep their flags in device memory. */
enum {
    TIDE_MP_FLAGS_DEVICE = 0, /* "device": device segments, stream memory-op waits */
    TIDE_MP_FLAGS_HOST = 1,   /* "host": the control block, memory-op waits */
    TIDE_MP_FLAGS_KERNEL = 2, /* unset or "kernel" (default): device segments, wait kernels
                               * that poll the abort word */
    TIDE_MP_FLAGS_AUTO = 3,   /* "auto": KERNEL, or HOST where ranks time-share a device
                               * (tide_cuda_mp_flags_resolve) */
};

/* TIDE_CUDA_CE_BATCH (mp_batch.c): runs of copies that touch another device's memory (peer
 * pointers) as one cudaMemcpyBatchAsync, the copy engines' batch. */
enum {
    TIDE_MP_CE_OFF = 0,   /* "0": such copies one cudaMemcpyAsync each */
    TIDE_MP_CE_PEERS = 1, /* unset or "1" (default) */
    TIDE_MP_CE_ALL = 2,   /* "all": same-device runs too, instead of the SM batch kernel (to
                           * run this path on one GPU) */
};
/* TIDE_CUDA_CE_BATCH of the environment (TIDE_ERR_INVALID_ARGUMENT naming a bad value). */
tide_result_t tide_cuda_mp_env_ce_batch(int *mode_out);

/* Batched copies of one program on this rank (mp_batch.c), planned per call. */
typedef struct {
    int cap;                               /* commands of the longer form */
    int32_t *action;                       /* [cap]: -1 issue, -2 in a batch, k: batch k here */
    int32_t *owner;                        /* [cap]: the run of each command, -1 */
    int32_t *b_cmd, *b_count, *b_first, *b_fill, *b_ctas; /* [cap] per run */
    uint64_t *b_bytes;                     /* [cap] */
    uint8_t *b_ok;                         /* [cap]: issued as a batch */
    uint8_t *b_ce;                         /* [cap]: a copy-engine run (cudaMemcpyBatchAsync) */
    void **ce_dst;                         /* [cap]: one copy-engine run's arrays */
    const void **ce_src;
    size_t *ce_size;
    tide_cuda_copy_desc_t *desc_host[2];   /* [parity] pinned, cap */
    tide_cuda_copy_desc_t *desc_dev[2];    /* [parity] device, cap */
    tide_cuda_copy_desc_t *desc_last[2];   /* [parity] host, cap: what desc_dev holds */
    int last_total[2];                     /* [parity] descriptors in desc_last; -1: unknown */
    void *scratch;                         /* 2 cap intervals (overlap check) */
} tide_mp_batch_t;

/* How this rank issues an op on a rail fabric (op_kind) and waits on a slot (slot_kind). */
enum {
    TIDE_MP_RAIL_OP = 0,      /* not a put: issued as itself */
    TIDE_MP_RAIL_STEP = 1,    /* the first put of a step: the step is issued here */
    TIDE_MP_RAIL_IN_STEP = 2, /* a later put of a step: carried by the step */
};
enum {
    TIDE_MP_SLOT_PEER = 0, /* the recording rank's flag */
    TIDE_MP_SLOT_OWN = 1,  /* a put from another node: this rank's flag, written by its step */
    TIDE_MP_SLOT_SKIP = 2, /* a credit of another node: a precondition of its receive instead */
};

/* The rail steps of one program on this rank (mp_rails.c). */
typedef struct {
    bool on;
    tide_rails_t sched; /* every rank's (program/rails.h); this rank uses its own */
    uint8_t *op_kind;   /* [num_ops of the schedule] TIDE_MP_RAIL_* (this rank's ops) */
    int32_t *op_step;   /* [num_ops]: the step of a put, -1 */
    uint8_t *slot_kind; /* [num_slots] TIDE_MP_SLOT_* */
    cudaEvent_t *reach; /* [num_steps]: the put queue reached the step's first put */
    cudaEvent_t *done;  /* [num_steps]: the step's transfers ended, its flags are written */
} tide_mp_rails_prog_t;

typedef struct {
    bool ready;
    tide_schedule_t sched;
    tide_sched_cmd_t *cmds[TIDE_SCHED_FORMS]; /* this rank's commands, in the global order */
    int num_cmds[TIDE_SCHED_FORMS];
    /* Their runs of waits (program/schedule.h, tide_sched_wait_runs), or NULL:
     * TIDE_CUDA_MP_WAIT_RUNS=0, every wait alone. */
    uint8_t *defer[TIDE_SCHED_FORMS];
    void *table_mem;
    const void **table_dev;
    const tide_program_t *checked;
    tide_cuda_bound_t *bound; /* [num_ops]: this rank's entries of the pending call */
    tide_mp_batch_t batch;    /* allocated when the world batches */
    tide_mp_rails_prog_t rails; /* on a world with rails */
    struct tide_mp_direct *direct; /* direct mode's analysis of an M = 1 RS program, or NULL */
    /* The synchronisation elision (mp_elide.c): se.on when the program has its shape; this
     * rank's commands of it. */
    tide_sync_elide_t se;
    tide_sched_cmd_t *se_cmds[TIDE_SCHED_FORMS];
    int se_num_cmds[TIDE_SCHED_FORMS];
    uint8_t *se_defer[TIDE_SCHED_FORMS]; /* their runs of waits, as defer[] */
} tide_mp_prepared_t;

typedef struct {
    tide_collective_t coll;
    tide_mp_prepared_t prep[TIDE_RS_MODE_COUNT];
    int64_t last_epoch;
    int last_prep;
    bool last_elided; /* the last call ran the synchronisation elision (mp_direct.c) */
    /* The last eager call that ended with the end-of-call fence on its caller's stream (every
     * rank finished it before what follows there), or -1; that stream's id. */
    int64_t fenced_epoch;
    unsigned long long fenced_stream;
    cudaEvent_t done_ev[2]; /* the rank's call e on the caller's stream: parity e % 2 */
    int64_t done_epoch[2];  /* the call each was last recorded for; -1: none */
    cudaEvent_t user[TIDE_EVENT_COUNT];
    int num_params;
    void *own_dev[2];
    const void **own_host[2];
    const void **own_last[2];
    bool own_valid[2], own_inflight[2];
    cudaEvent_t own_done[2];
    const void **grads; /* the pending call's gradient pointers (row_len of them) */
    int row_len;        /* P, or L P when direct sums may read the peers' rows (mp_direct.c) */
    struct tide_mp_direct_call *dcall; /* the RS family's pointer exchange (mp_direct.c) */
    int sum_ctas, landing_ctas;
    tide_result_t broken;
    char broken_msg[TIDE_MP_CTL_MSG + 64];
    tide_cuda_stats_t stats;
} tide_mp_family_t;

typedef struct tide_mp_arena {
    struct tide_fabric_arena base;
    tide_mp_world_t *w;
    uint64_t alloc_bytes;
    uint64_t flags_off; /* the flag area's offset in every rank's allocation */
    bool *vmm;          /* [N]: rank r's segment is VMM (else legacy IPC) */
    bool *remote;       /* [N]: rank r's segment is on another device (no batched copy) */
    bool any_remote;
    CUmemGenericAllocationHandle *handle; /* [N]: own and imported VMM handles */
    CUdeviceptr *va;                      /* [N]: reserved and mapped ranges */
    void *legacy_own;                     /* own cudaMalloc segment */
    uint8_t **flags;                      /* [N]: each rank's flag area as mapped here */
    tide_mp_ctl_t ctl;                    /* host memory shared by the group (mp_ctl.h) */
    bool host_flags;     /* flags[] are device addresses of the control block (mp_flags.c) */
    bool ctl_registered; /* the control block is registered with the device */
    uint8_t *ctl_dev;    /* the registered block's device address, else NULL */
    /* The abort word's device address when this arena's device waits are wait kernels that
     * poll it (TIDE_CUDA_MP_FLAGS=kernel; a view's is NULL: its set's counts); else NULL. */
    const uint32_t *abort_dev;
    struct tide_mp_wd_entry *wd; /* the watchdog's record of this arena (watchdog.c), or NULL */
    tide_mp_family_t fam[3];              /* [0]: AG, [1]: RS, [2]: a view's fence (mp_view.c) */
    /* Shared arenas (mp_view.c, docs/arena.md "Fabrics").  A set's arena reserves flag_areas
     * flag areas behind each rank's arena (1 + one per view; 0 or 1: a lone group's one); a
     * view borrows the set's segments and owns its families and its flag area.  parent: the
     * set's arena of a view, else NULL; views[k]: the live view on flag area 1 + k. */
    struct tide_mp_arena *parent;
    int flag_areas;
    int num_views;
    struct tide_mp_arena **views;
    struct tide_mp_graph *graph; /* captured calls' state (mp_graph.c), or NULL: none ever */
    /* A set's arena: some view's call was captured, so every view's eager calls are refused
     * until deregistration (mp_graph.c: the set is replay-only as a whole). */
    bool set_captured;
} tide_mp_arena_t;

/* Captured calls of an arena (mp_graph.c), created at its first capture. */
struct tide_mp_graph_mem;
struct tide_mp_graph {
    uint64_t *num;      /* device [3]: each family's call counter (the replayed call's e) */
    uint32_t *err_host; /* pinned, mapped [4]: this rank's error word (mp_graph_kernels.h) */
    uint32_t *err_dev;  /* its device address */
    int64_t timeout_ms; /* TIDE_TIMEOUT_MS at the last capture: the device waits' bound */
    bool captured[3];   /* the family has captured calls: eager calls are refused */
    bool num_set[3];    /* the family's counter was set */
    /* A view of a set (mp_view.c): the capture (tide_cuda_graph_key: its id + 1) of the
     * family's last captured call, and an event recorded at that call's end inside its
     * capture (after every stream of the rank joined), which a sibling view's captured fence
     * in the same capture waits on: a graph edge (mp_graph.c, tide_cuda_mp_graph_wait_siblings). */
    unsigned long long key[3];
    cudaEvent_t end_ev[3];
    struct tide_mp_graph_mem *mem; /* device tables of captured calls */
    /* [flag area][slot]: an event for each slot this rank both records and waits on, or NULL:
     * such a wait is a graph edge (cudaStreamWaitEvent) instead of a wait kernel.  Flag area
     * TIDE_MP_FENCE_FIDX is a view's fence family's (its two variants share it: grown to
     * the larger one's slots). */
    cudaEvent_t *local[TIDE_MP_PREPS + 1];
    int local_slots[TIDE_MP_PREPS + 1];
};

extern const struct tide_fabric_ops tide_fabric_cuda_mp_ops;

/* ------------------------------------------------------------------ flags */

/* Flag area of a program: 0 for the AG, 1 + mode for the RS. */
static inline int tide_cuda_mp_flags_index(tide_collective_t coll, int prep) {
    return coll == TIDE_COLL_ALL_GATHER ? 0 : 1 + prep;
}
/* The family index (0 AG, 1 RS, 2 fence) of one of a's families. */
static inline int tide_cuda_mp_family_index(const tide_mp_arena_t *a, const tide_mp_family_t *fam) {
    return (int)(fam - a->fam);
}
/* The set's arena of a view (whose abort word and flag areas the whole set shares), else a. */
static inline tide_mp_arena_t *tide_cuda_mp_set_of(tide_mp_arena_t *a) {
    return a->parent != NULL ? a->parent : a;
}
static inline CUdeviceptr tide_cuda_mp_slot_flag(const tide_mp_arena_t *a, int rank, int fidx,
                                                 int slot) {
    return (CUdeviceptr)(uintptr_t)(a->flags[rank] + TIDE_MP_DONE_BYTES +
                                    ((size_t)fidx * TIDE_MP_FLAG_SLOTS + (size_t)slot) * 8u);
}
/* The done flag of family f (0 AG, 1 RS, 2 a view's fence). */
static inline CUdeviceptr tide_cuda_mp_family_done_flag(const tide_mp_arena_t *a, int rank, int f) {
    return (CUdeviceptr)(uintptr_t)(a->flags[rank] + (size_t)f * 8u);
}
static inline CUdeviceptr tide_cuda_mp_done_flag(const tide_mp_arena_t *a, int rank,
                                                 tide_collective_t coll) {
    return tide_cuda_mp_family_done_flag(a, rank, coll == TIDE_COLL_ALL_GATHER ? 0 : 1);
}
/* Rendezvous flag `which` (0: receives posted, 1: sends done) of rail step `step`. */
static inline CUdeviceptr tide_cuda_mp_rail_flag(const tide_mp_arena_t *a, int rank, int fidx,
                                                 int step, int which) {
    return (CUdeviceptr)(uintptr_t)(a->flags[rank] + TIDE_MP_DONE_BYTES + TIDE_MP_SLOT_BYTES +
                                    (((size_t)fidx * TIDE_MP_RAIL_STEPS + (size_t)step) * 2u +
                                     (size_t)which) * 8u);
}
/* Whether this rank's fences cover rank r: every rank, or with rails the ranks of its node
 * (the rails' credits order the buffers across nodes, and another node's flags need not be
 * mapped).  The poison of a fail-stop covers every flag mapped here. */
static inline bool tide_cuda_mp_fenced(const tide_mp_arena_t *a, int r) {
    const tide_mp_world_t *w = a->w;
    return w->rails == NULL ||
           r / w->base.gpus_per_node == w->base.rank / w->base.gpus_per_node;
}

/* ------------------------------------------------------------------ rails (mp_rails.c) */

/* One call of a program, as its rail steps need it. */
typedef struct {
    const tide_program_t *prog;
    const tide_binding_t *b;
    const tide_mp_prepared_t *pp;
    tide_collective_t coll;
    int fidx;    /* the program's flag area */
    bool steady; /* the previous call of the collective ran this program */
} tide_mp_rails_call_t;

/* A rail transport: how the sends and receives of one step cross nodes. */
typedef struct tide_mp_rails_ops {
    const char *name;
    /* Enqueue every send and receive of step `step` on `rail`, whose earlier work already
     * waited for the step's sources (this rank's queue reached the step) and credits (its
     * receives' buffers are free).  What follows on `rail` must see the step's sends left and
     * its receives' bytes in this rank's memory. */
    tide_result_t (*transfer)(tide_mp_arena_t *a, const tide_mp_rails_prog_t *rp,
                              const tide_mp_rails_call_t *c, int step, cudaStream_t rail);
} tide_mp_rails_ops_t;

/* The emulated transport of the CUDA fabric (TIDE_CUDA_MP_RAILS=1, M > 1): every rank's
 * memory is mapped, so a step rendezvouses through flags and copies into the peer, with the
 * semantics the NCCL transport has (a send lands only after its receiver posted the step).
 * It runs the rail machinery on one host; it is not faster than issuing the puts. */
extern const tide_mp_rails_ops_t tide_cuda_mp_rails_emulated;

/* The rail steps of pp's program (after its schedule and commands): classify this rank's ops
 * and slots, create the step events.  TIDE_ERR_UNSUPPORTED when the program crosses nodes
 * otherwise than by puts and credits (rails.h) or has more than TIDE_MP_RAIL_STEPS steps. */
tide_result_t tide_cuda_mp_rails_prepare(tide_mp_arena_t *a, tide_mp_prepared_t *pp,
                                         const tide_program_t *prog);
void tide_cuda_mp_rails_release(tide_mp_rails_prog_t *rp);
/* Step `step` of the call, enqueued where the put queue's stream `queue` reaches the step's
 * first put: the rail stream waits for the queue and the receives' credits, runs the
 * transport's transfer, writes e + 1 into this rank's flag of every received put, and the
 * queue waits for all of it. */
tide_result_t tide_cuda_mp_rails_issue(tide_mp_arena_t *a, const tide_mp_rails_call_t *c,
                                       int step, cudaStream_t queue);
/* Rank `rank`'s address of ref (its arena, bank shifted; its landing slot; this rank's shard
 * operand) for `bytes`: TIDE_ERR_INTERNAL when not mapped here or out of bounds. */
tide_result_t tide_cuda_mp_rails_resolve(const tide_mp_arena_t *a, const tide_mp_rails_call_t *c,
                                         int rank, const tide_ref_t *ref, bool bank_dep,
                                         uint64_t bytes, void **ptr_out);

/* Whether a world of this fabric (or of the NCCL fabric, which runs its calls through this
 * fabric's execute) runs the rail lane: every one does, with or without rails (mp_world.c). */
bool tide_cuda_mp_rail_lane(const struct tide_fabric_world *world);

tide_result_t tide_cuda_mp_world_create(int nodes, int gpus_per_node, int rank, const char *name,
                                        struct tide_fabric_world **out);
tide_result_t tide_cuda_mp_execute(struct tide_fabric_arena *arena, const tide_program_t *prog,
                                   const tide_binding_t *binding, void *stream);
void tide_cuda_mp_family_free(tide_mp_family_t *fam);

/* Shared with the NCCL fabric (fabric/nccl/), which runs its calls through this fabric's
 * execute over its own transport.  World: the current device, its streams and events (the
 * boot is left as it is); release undoes it and closes the boot, not freeing w.  Families:
 * both collectives' call state of an arena, freed with tide_cuda_mp_family_free. */
tide_result_t tide_cuda_mp_world_init(tide_mp_world_t *w);
void tide_cuda_mp_world_release(tide_mp_world_t *w);
tide_result_t tide_cuda_mp_families_create(tide_mp_arena_t *a);
/* Carry this world's cross-node puts over `ops` (creates the rail stream, which release
 * destroys). */
struct tide_mp_rails_ops;
tide_result_t tide_cuda_mp_world_set_rails(tide_mp_world_t *w, const struct tide_mp_rails_ops *ops);

/* World creation, every rank, once the socket mesh is up (mp_agree.c): one exchange of every
 * rank's device and protocol settings (TIDE_CUDA_MP_FLAGS, TIDE_CUDA_MP_DIRECT,
 * TIDE_SYNC_ELIDE, TIDE_CUDA_MP_RAILS); every rank takes rank 0's, and fails, naming the
 * rank, when some rank's part of the world failed before it (`local`: this rank's result so
 * far, returned as is when it failed). */
tide_result_t tide_cuda_mp_world_agree(tide_mp_world_t *w, tide_result_t local,
                                       int64_t timeout_ms);

/* ------------------------------------------------------------------ flags (mp_flags.c) */

/* TIDE_CUDA_MP_FLAGS: unset or "kernel" (default), "auto", "host" or "device"
 * (TIDE_MP_FLAGS_*; TIDE_ERR_INVALID_ARGUMENT naming the four otherwise). */
tide_result_t tide_cuda_mp_env_flags(int *flags_out);
/* Once every rank holds rank 0's setting (mp_agree.c): resolve TIDE_MP_FLAGS_AUTO to HOST
 * when two ranks of the world share a device and are not both MPS clients (their processes
 * are time-sliced), else to KERNEL; explicit placements are left as they are. */
void tide_cuda_mp_flags_resolve(tide_mp_world_t *w, int shared, int timeshared);
/* Whether contexts on `device` are MPS clients (CU_DEVICE_ATTRIBUTE_MPS_ENABLED, since CUDA
 * 12.6; an older toolkit or driver answers false, which only costs "auto" the kernel waits'
 * speed under MPS). */
bool tide_cuda_mp_device_mps(int device);
/* After the segments and the control block: register the block with the device when rank 0
 * made it device-mapped (with flags: point flags[] at its flag areas; with a polled abort
 * word: set abort_dev, the flags stay in the segments); else leave everything as it is. */
tide_result_t tide_cuda_mp_flags_map(tide_mp_arena_t *a);
/* s waits until each of the `count` flags reached value (>=): stream memory operations, or,
 * when a's set polls its abort word (kernel waits), one wait kernel per
 * TIDE_MP_GRAPH_WAIT_MAX flags that also ends at the abort word.  st (may be NULL): waits
 * += count, wait_calls += the stream operations (or kernels) issued. */
tide_result_t tide_cuda_mp_flags_wait(tide_mp_arena_t *a, cudaStream_t s, const CUdeviceptr *flag,
                                      int count, uint64_t value, tide_cuda_stats_t *st);
/* Before the control block is closed. */
void tide_cuda_mp_flags_unmap(tide_mp_arena_t *a);
/* With a device-mapped control block (host flags, kernel waits): the stream s writes
 * 1 + epoch into this rank's began counter of family f in the block (mp_ctl.h) when it gets
 * there; nothing otherwise. */
tide_result_t tide_cuda_mp_flags_began(tide_mp_arena_t *a, int f, uint64_t epoch,
                                       cudaStream_t s);
/* Write the poison into every flag mapped here: CPU stores for host flags, else a memset on
 * the utility stream. */
void tide_cuda_mp_flags_poison(tide_mp_arena_t *a);

/* ------------------------------------------------------------------ watchdog (watchdog.c) */

/* One thread per world of this fabric (not the NCCL fabric's), started at world creation and
 * joined at its destruction (never from a finaliser).  It follows every call this rank
 * enqueued: when the call's device work (from its begin point on the caller's stream to its
 * done event) outlives TIDE_TIMEOUT_MS it fails the group (abort word, poison), and when
 * any rank failed the group it poisons until this process's streams are idle, so that no
 * device wait of this process outlives the group, whether or not its host is in a call. */
tide_result_t tide_mp_watchdog_start(tide_mp_world_t *w);
void tide_mp_watchdog_stop(tide_mp_world_t *w);
/* Follow / stop following an arena (after it is created / before its memory is released). */
tide_result_t tide_mp_watchdog_add(tide_mp_arena_t *a);
void tide_mp_watchdog_remove(tide_mp_arena_t *a);
/* Call `epoch` of family f (0 AG, 1 RS) of a, parity p: begin records the begin point on the
 * caller's stream (before the call's first device wait; with host flags the stream also
 * writes the control block's began counter there); enqueued marks the call as followed
 * (after its done event was recorded).  Without a watchdog only the began counter. */
tide_result_t tide_mp_watchdog_begin(tide_mp_arena_t *a, int f, int p, uint64_t epoch,
                                     cudaStream_t caller);
void tide_mp_watchdog_enqueued(tide_mp_arena_t *a, int f, int p, uint64_t epoch);

/* fabric.h's call_check through the group's control block (mp_execute.c). */
tide_result_t tide_cuda_mp_call_check(struct tide_fabric_arena *arena, tide_collective_t coll,
                                      uint64_t seq, uint64_t sig, int *other_rank_out,
                                      uint64_t *other_sig_out);

/* Fail-stop with `msg` as the group's message (mp_execute.c): publish the abort (or follow
 * the one published first), poison the flags, drain the streams, break both families;
 * returns TIDE_ERR_TIMEOUT. */
tide_result_t tide_cuda_mp_fail_stop_msg(tide_mp_arena_t *a, const char *msg);

/* Fail-stop (mp_execute.c): name the missing rank (dead >= 0: that one; else from the control
 * block, for call `call` of fam), publish the abort, poison the flags, drain the streams. */
tide_result_t tide_cuda_mp_fail_stop(tide_mp_arena_t *a, tide_mp_family_t *fam, int dead,
                                     uint64_t call, const char *waiting_for);

/* ------------------------------------------------------------------ direct mode (mp_direct.c) */

/* Direct mode at M = 1 (docs/cuda-fabric.md, "Direct mode across processes"): the sums read
 * the peers' gradients in place and store every rank's output, when every gradient and output
 * of the call is addressable from every rank.  env: TIDE_CUDA_MP_DIRECT ("0" off; unset or
 * "1" on).  prepare: the analysis of an RS program at M = 1 (nothing otherwise).  call: per
 * call, exchange the operands' addresses with the peers (collective), decide the path (the
 * same on every rank) and fill fam->grads with the call's row.  elided / skips: what the call
 * does not issue (read-done is recorded after every rank's call: mp_execute.c's enqueue).
 * l: the bind environment's direct_l (> 0: this call is direct).  before: the fused-sum
 * tables on the caller's stream, before the start record. */
tide_result_t tide_cuda_mp_direct_env(bool *on_out);
tide_result_t tide_cuda_mp_direct_prepare(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                          tide_mp_prepared_t *pp, const tide_program_t *prog);
void tide_cuda_mp_direct_free(tide_mp_prepared_t *pp);
void tide_cuda_mp_direct_family_free(tide_mp_family_t *fam);
void tide_cuda_mp_direct_world_free(tide_mp_world_t *w);
tide_result_t tide_cuda_mp_direct_call(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                       tide_mp_prepared_t *pp, const tide_binding_t *b);
/* The pushed path for this call without the collective exchange (a call captured into a CUDA
 * graph, which every rank captures alike: mp_graph.c): fills fam->grads with the call's row. */
tide_result_t tide_cuda_mp_direct_pushed(tide_mp_family_t *fam, tide_mp_prepared_t *pp,
                                         const tide_binding_t *b);
bool tide_cuda_mp_direct_elided(const tide_mp_prepared_t *pp, int id);
void tide_cuda_mp_direct_skips(const tide_mp_prepared_t *pp, const uint8_t **elide_out,
                               const uint8_t **fused_out, bool *read_done_out);
int tide_cuda_mp_direct_l(const tide_mp_prepared_t *pp);
/* The program's analysis when some sum fuses its outputs (else NULL), and whether this call
 * took fused outputs. */
const tide_direct_t *tide_cuda_mp_direct_analysis(const tide_mp_prepared_t *pp);
bool tide_cuda_mp_direct_fused(const tide_mp_prepared_t *pp);

/* The synchronisation elision (mp_elide.c; program/sync_elide.h, docs/sync-elide.md).
 * prepare builds it for a program of its shape unless TIDE_SYNC_ELIDE=0 or the world has
 * rails (after tide_cuda_mp_direct_prepare); on says whether this call runs it (an eager
 * call; a reduce-scatter only with fused outputs); cmds gives this rank's commands of form
 * `form` and the late ops, which the epilogue issues after the end fence (mp_execute.c). */
tide_result_t tide_cuda_mp_elide_prepare(tide_mp_arena_t *a, tide_mp_prepared_t *pp,
                                         const tide_program_t *prog);
void tide_cuda_mp_elide_free(tide_mp_prepared_t *pp);
bool tide_cuda_mp_elide_on(const tide_mp_prepared_t *pp, bool captured);
/* The runs of waits of n commands (tide_sched_wait_runs) into *defer_out (malloc'd; NULL
 * when TIDE_CUDA_MP_WAIT_RUNS is 0). */
tide_result_t tide_cuda_mp_wait_runs(const tide_mp_prepared_t *pp, const tide_sched_cmd_t *cmds,
                                     int n, uint8_t **defer_out);
void tide_cuda_mp_elide_cmds(const tide_mp_prepared_t *pp, int form,
                             const tide_sched_cmd_t **cmds_out, const uint8_t **defer_out,
                             int *num_out,
                             const uint8_t **late_out);
tide_result_t tide_cuda_mp_direct_before(tide_mp_arena_t *a, tide_mp_prepared_t *pp,
                                         const tide_binding_t *b, cudaStream_t caller,
                                         tide_cuda_stats_t *st);

/* Batched copies (mp_batch.c).  prepare allocates for the program's command lists (the
 * schedule's and the elided ones: call it after tide_cuda_mp_elide_prepare); plan walks the
 * call's commands, groups each thread's runs of same-device copies (below the size
 * threshold, nothing else of that thread between them) and of flat copies to or from peer
 * pointers (TIDE_CUDA_CE_BATCH), fills their descriptors from the bound ops, checks each run
 * for overlaps (overlapping runs stay per op), and uploads the descriptors on the caller's
 * stream; issue launches run k: the batch kernel, or one cudaMemcpyBatchAsync. */
tide_result_t tide_cuda_mp_batch_prepare(tide_mp_prepared_t *pp);
void tide_cuda_mp_batch_free(tide_mp_prepared_t *pp);
tide_result_t tide_cuda_mp_batch_plan(tide_mp_arena_t *a, tide_mp_prepared_t *pp,
                                      const tide_sched_cmd_t *cmds, int n, int parity,
                                      cudaStream_t caller, tide_cuda_stats_t *st);
tide_result_t tide_cuda_mp_batch_issue(tide_mp_arena_t *a, tide_mp_prepared_t *pp, int k,
                                       int parity, int thread);

/* ------------------------------------------------------------------ shared arenas (mp_view.c) */

/* fabric.h's arena_view_create / a view's arena_destroy, for both fabrics that run this
 * execute (the parent reserved flag_areas > 1: tide_cuda_mp_set_areas).  create is local
 * apart from the view's control block (opened over the bootstrap, collective, when the parent
 * has one); destroy waits for the view's calls and releases nothing of the parent's. */
tide_result_t tide_cuda_mp_view_create(struct tide_fabric_arena *parent, uint64_t signature,
                                       struct tide_fabric_arena **view_out);
tide_result_t tide_cuda_mp_view_destroy(tide_mp_arena_t *view);
/* The flag areas a set of `views` groups reserves per segment (TIDE_ERR_UNSUPPORTED with
 * rails: the fence crosses nodes otherwise than by puts). */
tide_result_t tide_cuda_mp_set_areas(const tide_mp_world_t *w, int views, int *areas_out);
/* A fence call of a view: the caller's stream waits until this rank's done flag of each
 * family of every sibling view reached that family's last call; the fence program that
 * follows extends it to every rank (mp_view.c). */
tide_result_t tide_cuda_mp_view_wait_siblings(tide_mp_arena_t *a, cudaStream_t caller,
                                              tide_cuda_stats_t *st);
/* The poison of a fail-stop: every flag of every area of the set's segments mapped here. */
uint64_t tide_cuda_mp_flag_bytes(const tide_mp_arena_t *a);
/* Fail-stop reaches every view of the set in this process (they share the flag areas the
 * poison wrote): break each family of a's set with msg. */
void tide_cuda_mp_set_broken(tide_mp_arena_t *a, const char *msg);

/* ------------------------------------------------------------------ CUDA graphs (mp_graph.c) */

/* The fabric's capture_check (fabric.h; also the NCCL fabric's): the capture checks of
 * tide_cuda_mp_graph_arrive for a call of `prog` on `arena`, without side effects. */
tide_result_t tide_cuda_mp_capture_check(struct tide_fabric_arena *arena,
                                         const tide_program_t *prog, void *stream,
                                         uint64_t *key_out, tide_capture_verdict_t *v);

/* A call of family fi on `caller`: whether it is captured (*captured_out), or refused with
 * TIDE_ERR_UNSUPPORTED before anything is enqueued (the restrictions of mp_graph.c).  ready:
 * the call's program was prepared (core refused its first call in a capture before:
 * api/capture.c; a captured unprepared one is TIDE_ERR_INTERNAL).  An eager call costs one capture query while nothing was
 * captured on the world. */
tide_result_t tide_cuda_mp_graph_arrive(tide_mp_arena_t *a, int fi, bool ready,
                                        cudaStream_t caller, bool *captured_out,
                                        unsigned long long *key_out);
/* Capture time, outside the capture, after the call was bound: the family's counter (first
 * capture), the call's gradient pointer row on the device, its sums bound to it. */
tide_result_t tide_cuda_mp_graph_capture(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                         tide_mp_prepared_t *pp, uint64_t e, int parity);
/* The captured call (capture `key`) was enqueued: the family, and a view's whole set, is
 * replay-only from now on. */
void tide_cuda_mp_graph_enqueued(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                 unsigned long long key);
/* The first nodes of a captured call of family fi (capture `key`) on caller: the family's
 * counter tick, after (views of a set) an edge to the family's previous call when that was
 * captured in the same capture (its calls may come from several streams: a fence from the
 * all-gather's and the reduce-scatter's). */
tide_result_t tide_cuda_mp_graph_begin(tide_mp_arena_t *a, int fi, unsigned long long key,
                                       cudaStream_t caller);
/* At the end of a captured call of family fi (every stream of the rank joined into caller):
 * the event a sibling view's captured fence waits on (views of a set only). */
tide_result_t tide_cuda_mp_graph_end(tide_mp_arena_t *a, int fi, cudaStream_t caller);
/* The captured form of tide_cuda_mp_view_wait_siblings (a view's captured fence, capture
 * `key`): a graph edge to each sibling family's last call captured in this capture, a wait
 * kernel on the done flag (fixed value) of one whose last call was eager. */
tide_result_t tide_cuda_mp_graph_wait_siblings(tide_mp_arena_t *a, cudaStream_t caller,
                                               unsigned long long key, tide_cuda_stats_t *st);
/* A device wait of a replay failed (this rank's error word): fail stop with its message
 * (TIDE_ERR_TIMEOUT); TIDE_SUCCESS when none did. */
tide_result_t tide_cuda_mp_graph_check(tide_mp_arena_t *a);
void tide_cuda_mp_graph_free(tide_mp_arena_t *a);

/* ------------------------------------------------------------------ queries (tests, tools) */

/* Whether a fabric arena belongs to the one-process-per-rank fabric. */
bool tide_cuda_mp_is(const struct tide_fabric_arena *arena);

/* Wait on the host, with the watchdog, until this rank's last call of `coll` is complete
 * (TIDE_ERR_TIMEOUT naming the missing rank; the family fails stop). */
tide_result_t tide_cuda_mp_sync(struct tide_fabric_arena *arena, tide_collective_t coll);
/* The same for family f of a (0 AG, 1 RS, 2 a view's fence). */
tide_result_t tide_cuda_mp_sync_family(tide_mp_arena_t *a, int f);

tide_result_t tide_cuda_mp_stats(const struct tide_fabric_arena *arena, tide_collective_t coll,
                                 tide_cuda_stats_t *stats_out);

/* Whether rank r's segment is a VMM allocation (false: legacy cudaIpc). */
bool tide_cuda_mp_uses_vmm(const struct tide_fabric_arena *arena, int rank);

#endif /* TIDE_FABRIC_CUDA_MP_H_ */
