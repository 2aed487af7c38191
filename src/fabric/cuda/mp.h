/*
 * mp.h - the CUDA fabric with one process per rank (tide_comm_init_rank(TIDE_FABRIC_CUDA,
 * ...)); docs/cuda-fabric.md, "One process per rank".
 *
 * What is shared with the one-process fabric: the program, its binding (bind.c), the
 * schedule and its command lists (schedule.c, commands.c), the kernels.  Each process builds
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
 *              in the recording rank's flag area.  RECORD writes the call number e + 1 with
 *              cuStreamWriteValue64 (a release: prior work of the stream is visible first);
 *              WAIT is cuStreamWaitValue64(flag, e + 1, GEQ) on the waiter's stream, WAIT_PREV
 *              the same with e.  Flags only grow, so they are cumulative across calls like the
 *              program's counters, and one flag per slot serves every call.
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
 * Deregistration still unmaps and releases every segment and the control block.
 *
 * Batched copies (mp_batch.c): as in the one-process fabric (batch.c), a thread's run of
 * same-device copies with nothing else of the thread between them is one launch of the batch
 * kernel, planned per call from this rank's command list (TIDE_CUDA_BATCH=0: every copy is
 * one cudaMemcpyAsync).
 *
 * Not done here: every rank must run on one host (the bootstrap's sockets).
 */
#ifndef TIDE_FABRIC_CUDA_MP_H_
#define TIDE_FABRIC_CUDA_MP_H_

#include "fabric/cuda/cuda.h"
#include "fabric/cuda/mp_boot.h"
#include "fabric/cuda/mp_ctl.h"

#include <cuda.h>

/* Signal slots a program may use (each an 8-byte flag per rank). */
#define TIDE_MP_FLAG_SLOTS 32768
/* Programs with flags: AG, RS in place, RS slot reuse. */
#define TIDE_MP_PREPS (1 + TIDE_RS_MODE_COUNT)
#define TIDE_MP_DONE_BYTES 256
#define TIDE_MP_FLAG_BYTES (TIDE_MP_DONE_BYTES + TIDE_MP_PREPS * TIDE_MP_FLAG_SLOTS * 8)
/* A poisoned flag: (int64_t)(flag - target) >= 0 for every call number. */
#define TIDE_MP_POISON ((uint64_t)1 << 62)

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
    uint8_t uuid[16];         /* the device's, to tell which peers share it */
} tide_mp_world_t;

/* Batched copies of one program on this rank (mp_batch.c), planned per call. */
typedef struct {
    int cap;                               /* commands of the longer form */
    int32_t *action;                       /* [cap]: -1 issue, -2 in a batch, k: batch k here */
    int32_t *owner;                        /* [cap]: the run of each command, -1 */
    int32_t *b_cmd, *b_count, *b_first, *b_fill, *b_ctas; /* [cap] per run */
    uint64_t *b_bytes;                     /* [cap] */
    uint8_t *b_ok;                         /* [cap]: issued as a batch */
    tide_cuda_copy_desc_t *desc_host[2];   /* [parity] pinned, cap */
    tide_cuda_copy_desc_t *desc_dev[2];    /* [parity] device, cap */
    void *scratch;                         /* 2 cap intervals (overlap check) */
} tide_mp_batch_t;

typedef struct {
    bool ready;
    tide_cuda_schedule_t sched;
    tide_cuda_cmd_t *cmds[TIDE_CUDA_FORMS]; /* this rank's commands, in the global order */
    int num_cmds[TIDE_CUDA_FORMS];
    void *table_mem;
    const void **table_dev;
    const tide_program_t *checked;
    tide_cuda_bound_t *bound; /* [num_ops]: this rank's entries of the pending call */
    tide_mp_batch_t batch;    /* allocated when the world batches */
} tide_mp_prepared_t;

typedef struct {
    tide_collective_t coll;
    tide_mp_prepared_t prep[TIDE_RS_MODE_COUNT];
    int64_t last_epoch;
    int last_prep;
    cudaEvent_t done_ev[2]; /* the rank's call e on the caller's stream: parity e % 2 */
    int64_t done_epoch[2];  /* the call each was last recorded for; -1: none */
    cudaEvent_t user[TIDE_EVENT_COUNT];
    int num_params;
    void *own_dev[2];
    const void **own_host[2];
    const void **own_last[2];
    bool own_valid[2], own_inflight[2];
    cudaEvent_t own_done[2];
    const void **grads; /* the pending call's gradient pointers */
    int sum_ctas, landing_ctas;
    tide_result_t broken;
    char broken_msg[TIDE_MP_CTL_MSG + 64];
    tide_cuda_stats_t stats;
} tide_mp_family_t;

typedef struct {
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
    tide_mp_family_t fam[2];              /* [0]: AG, [1]: RS */
} tide_mp_arena_t;

extern const struct tide_fabric_ops tide_fabric_cuda_mp_ops;

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

/* Fail-stop (mp_execute.c): name the missing rank (dead >= 0: that one; else from the control
 * block, for call `call` of fam), publish the abort, poison the flags, drain the streams. */
tide_result_t tide_cuda_mp_fail_stop(tide_mp_arena_t *a, tide_mp_family_t *fam, int dead,
                                     uint64_t call, const char *waiting_for);

/* Batched copies (mp_batch.c).  prepare allocates for the program's command lists; plan
 * walks this call's form, groups each thread's runs of same-device copies (below the size
 * threshold, nothing else of that thread between them), fills their descriptors from the
 * bound ops, checks each run for overlaps (overlapping runs stay per op), and uploads the
 * descriptors on the caller's stream; issue launches run k. */
tide_result_t tide_cuda_mp_batch_prepare(tide_mp_prepared_t *pp);
void tide_cuda_mp_batch_free(tide_mp_prepared_t *pp);
tide_result_t tide_cuda_mp_batch_plan(tide_mp_arena_t *a, tide_mp_prepared_t *pp, int form,
                                      int parity, cudaStream_t caller, tide_cuda_stats_t *st);
tide_result_t tide_cuda_mp_batch_issue(tide_mp_arena_t *a, tide_mp_prepared_t *pp, int k,
                                       int parity, int thread);

/* ------------------------------------------------------------------ queries (tests, tools) */

/* Whether a fabric arena belongs to the one-process-per-rank fabric. */
bool tide_cuda_mp_is(const struct tide_fabric_arena *arena);

/* Wait on the host, with the watchdog, until this rank's last call of `coll` is complete
 * (TIDE_ERR_TIMEOUT naming the missing rank; the family fails stop). */
tide_result_t tide_cuda_mp_sync(struct tide_fabric_arena *arena, tide_collective_t coll);

tide_result_t tide_cuda_mp_stats(const struct tide_fabric_arena *arena, tide_collective_t coll,
                                 tide_cuda_stats_t *stats_out);

/* Whether rank r's segment is a VMM allocation (false: legacy cudaIpc). */
bool tide_cuda_mp_uses_vmm(const struct tide_fabric_arena *arena, int rank);

#endif /* TIDE_FABRIC_CUDA_MP_H_ */
