/*
 * fabric.h - the provider interface that runs compiled programs (DESIGN.md §3, fabric/).
 *
 * A fabric is a vtable in the style of libfabric's providers: one `struct tide_fabric_ops`
 * per folder (cpu/, cuda/, nccl/), filled with C11 designated initializers.  core/ talks to a
 * fabric only through this header, so the communicator and group calls are the same for host
 * memory and for devices:
 *
 *   world_create_all / world_create_rank   the N = M L ranks of a communicator, as N handles
 *                                          of one process or one handle per process
 *   arena_create / arena_destroy           (collective) every rank's arena of one group,
 *                                          zeroed, seen by each rank as N base pointers
 *   arena_view_create (optional)           (collective) a group's view of a shared arena's
 *                                          memory with its own call state (docs/arena.md)
 *   execute                                run one rank's program of one call, bound to the
 *                                          call's operands (CPU: to completion on the calling
 *                                          thread; CUDA: enqueued on `stream`)
 *   world_destroy
 *
 * Fabric objects embed the common structs below as their first member (libfabric's fid
 * pattern): core reads the common part, the fabric casts back to its own type.
 *
 * Binding (bind.c, shared by every fabric) turns the program's symbolic references into
 * addresses for one call: arena of rank r + region offset (+ the RS bank of the epoch), the
 * call's landing slot, the shard / gradient / output operands.  Every reference is bounds
 * checked against its region or operand, so a malformed or mutated program fails with a
 * message naming the rank, queue and op instead of writing out of bounds.
 */
#ifndef TIDE_FABRIC_FABRIC_H_
#define TIDE_FABRIC_FABRIC_H_

#include "program/program.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* Wait deadline of every fabric wait and collective handshake (fail-stop, never a hang). */
#define TIDE_TIMEOUT_MS_DEFAULT 10000

/* TIDE_TIMEOUT_MS from the environment (a positive integer of milliseconds, clamped to about
 * 24 days), else the default.  Read at every call so that a test or a job may change it
 * between calls.  An invalid value (0, negative, not a number) is warned about once per
 * value, naming the default used instead (timeout.c). */
int64_t tide_fabric_timeout_ms(void);

/* How long a world's creation waits for every rank to join (the one-process-per-rank
 * fabric's socket mesh and its first exchange), separate from the calls' deadline: ranks
 * reach tide_comm_init_rank after their own start-up (interpreter, CUDA context), whose skew
 * on a loaded host is seconds, while a job may want its calls to fail stop within one.  A
 * rank that never comes still fails every other rank, after this long. */
#define TIDE_JOIN_TIMEOUT_MS_DEFAULT 120000

/* TIDE_JOIN_TIMEOUT_MS from the environment (a positive integer of milliseconds, read as
 * TIDE_TIMEOUT_MS is), else the larger of tide_fabric_timeout_ms() and the default. */
int64_t tide_fabric_join_timeout_ms(void);

/* Environment variable `name` as an index into values[0 .. count) (env.c): unset or empty
 * gives 0 (the default), another value TIDE_ERR_INVALID_ARGUMENT naming the list. */
tide_result_t tide_fabric_env_choice(const char *name, const char *const *values, int count,
                                     int *index_out);

/* TIDE_SYNC_ELIDE (env.c): whether a fabric leaves out the waits and signals that
 * program/sync_elide.h names where its elision applies: 1 on, 0 off, unset (or "default")
 * the fabric's default `default_on` (on for the CPU and the one-process-per-rank CUDA
 * fabrics, docs/sync-elide.md).  Anything else is TIDE_ERR_INVALID_ARGUMENT. */
tide_result_t tide_fabric_sync_elide_env(bool default_on, bool *on_out);
/* TIDE_CUDA_MP_WAIT_RUNS (env.c): whether the one-process-per-rank CUDA fabric issues a run
 * of one thread's waits as one stream memory operation ("1", the default) or every wait
 * alone ("0"). */
tide_result_t tide_fabric_wait_runs_env(bool *on_out);
/* TIDE_CUDA_BATCH_KERNEL (env.c): the batched copy kernel's variant in both CUDA fabrics
 * (batch_copy_thread.h): "default" (or unset) gives default_unroll / default_streaming, the
 * build's; "4", "8", "16" units in flight per thread with plain loads and stores; "4cs",
 * "8cs", "16cs" the same with evict-first loads and stores.  For measuring the variants in
 * the fabric itself (tests/gpu/run.sh); every variant writes the same bytes. */
tide_result_t tide_fabric_batch_kernel_env(int default_unroll, int default_streaming,
                                           int *unroll_out, int *streaming_out);

/* ------------------------------------------------------------------ common objects */

struct tide_fabric_ops;

/* One rank's view of the ranks of a communicator. */
struct tide_fabric_world {
    const struct tide_fabric_ops *ops;
    int rank;
    int nodes;         /* M */
    int gpus_per_node; /* L */
    int ranks;         /* N */
};

/* One rank's view of the arenas of one registered group. */
struct tide_fabric_arena {
    struct tide_fabric_world *world;
    uint64_t bytes;  /* per rank (the plan's arena total) */
    uint8_t **bases; /* N base pointers valid for this rank (device pointers on a GPU) */
};

/* ------------------------------------------------------------------ binding */

/* Everything a call binds: operands, landing slot, epoch.  Filled by core, read by fabrics. */
typedef struct {
    const struct tide_plan *plan;
    const struct tide_fabric_arena *arena;
    int rank;                 /* the executing rank */
    int slot;                 /* AG: landing slot 0 or 1 (LANDING0 + slot) */
    uint64_t epoch;           /* calls of this program before this one */
    const void *shard;        /* AG: packed shard (S bytes, or fp32 master with a cast) */
    const void *const *grads; /* RS: P gradient pointers */
    float *out;               /* RS: fp32 output shard */
    float alpha;              /* RS */
    bool accumulate;          /* RS */
} tide_binding_t;

/* One op with its references resolved.  Unused fields are NULL / 0. */
typedef struct {
    void *dst;           /* COPY, COPY2D, ZERO, CAST */
    const void *src;     /* COPY, COPY2D, CAST */
    uint64_t *signal;    /* SIGNAL, fused signal of COPY/COPY2D: counter to add 1 to */
    uint64_t *wait_ctr;  /* WAIT: the executing rank's counter */
    int64_t wait_target; /* WAIT: epoch * inc + thr; satisfied when the counter >= it */
} tide_bound_op_t;

/* Shard operand bytes of an AG call: S, or 4 sum R_p K_p with a cast (fp32 master). */
uint64_t tide_bind_shard_bytes(const struct tide_plan *plan);

/* The shard a call reads: `shard`, or the RESIDENT region of the executing rank when NULL
 * (TIDE_ERR_UNSUPPORTED with a cast: the fp32 master shard is not resident). */
tide_result_t tide_bind_shard(const struct tide_plan *plan, const struct tide_fabric_arena *arena,
                              const void *shard, const void **shard_out);

/* Base of region `region` of rank `rank`'s arena. */
tide_result_t tide_bind_region(const struct tide_fabric_arena *arena, const struct tide_plan *plan,
                               int rank, tide_region_t region, void **ptr_out);

/* Resolve op `index` of queue `q` of the binding's rank (messages name rank, queue, op). */
tide_result_t tide_bind_op(const tide_binding_t *b, const tide_program_t *prog, tide_queue_t q,
                           int index, tide_bound_op_t *out);

/* Resolve the segment table of a SUM / LAND op into kernel arguments, bounds checked. */
tide_result_t tide_bind_sum(const tide_binding_t *b, const tide_program_t *prog, tide_queue_t q,
                            int index, tide_sum_args_t *args_out);
tide_result_t tide_bind_land(const tide_binding_t *b, const tide_program_t *prog, tide_queue_t q,
                             int index, tide_land_args_t *args_out);

/* ------------------------------------------------------------------ capture verdicts */

/* A verdict being formed: the blockers found (TIDE_CAPTURE_* bits of tide.h) and, for each,
 * the first sentence found (capture.c). */
#define TIDE_CAPTURE_BLOCKERS 5
typedef struct {
    uint32_t blockers;
    char why[TIDE_CAPTURE_BLOCKERS][320];
} tide_capture_verdict_t;

/* Add blocker `bit` to v with its sentence (kept only if the bit had none). */
void tide_capture_block(tide_capture_verdict_t *v, uint32_t bit, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* v's sentences in the order of the bits, joined by "; ", into buf ("" for none). */
void tide_capture_reason(const tide_capture_verdict_t *v, char *buf, size_t size);

/* TIDE_SUCCESS when v has no blocker, else TIDE_ERR_UNSUPPORTED with `prefix` ("" for none)
 * and v's reason: how every layer refuses a call a capture cannot hold. */
tide_result_t tide_capture_refuse(const tide_capture_verdict_t *v, const char *prefix);

/* ------------------------------------------------------------------ the provider vtable */

struct tide_fabric_ops {
    tide_fabric_kind_t kind;
    const char *name;
    /* Optional (NULL: never).  Whether `world` runs the rail lane's programs (L = 1,
     * docs/protocol.md "The rail lane"): landings of bf16 inbox blocks, puts from landing to
     * landing.  false: registration keeps the generic programs at L = 1 (tide_config_t.lane
     * AUTO) and refuses lane = RAIL. */
    bool (*rail_lane)(const struct tide_fabric_world *world);

    /* One process drives all N ranks: worlds_out[r] is rank r's handle (N entries). */
    tide_result_t (*world_create_all)(int nodes, int gpus_per_node,
                                      struct tide_fabric_world **worlds_out);
    /* One process per rank; every rank passes the same job `name`.  Returns when all N ranks
     * joined (TIDE_ERR_TIMEOUT when some did not within TIDE_TIMEOUT_MS). */
    tide_result_t (*world_create_rank)(int nodes, int gpus_per_node, int rank, const char *name,
                                       struct tide_fabric_world **world_out);
    /* Release one rank's handle (shared state goes with the last handle). */
    tide_result_t (*world_destroy)(struct tide_fabric_world *world);

    /* Collective over the world: allocate and zero every rank's arena of `bytes`, and make each
     * reachable from every rank.  `signature` identifies the group; ranks that registered
     * different groups get TIDE_ERR_INVALID_ARGUMENT. */
    tide_result_t (*arena_create)(struct tide_fabric_world *world, uint64_t bytes,
                                  uint64_t signature, struct tide_fabric_arena **arena_out);
    /* Collective; releases this rank's view (and the memory with the last view). */
    tide_result_t (*arena_destroy)(struct tide_fabric_arena *arena);

    /* Optional (NULL: the fabric serves no shared arenas, docs/arena.md "Fabrics").
     * Collective over the world, paired across ranks like arena_create: a view of `parent`'s
     * memory for one group of a shared arena (`signature` identifies the group).  The view
     * sees the parent's N base pointers and owns fresh call state (the GPU fabrics' families,
     * events, prepared command lists, call counters), so the groups of a set run their
     * programs each on its own view.  arena_destroy of a view releases the view only; the
     * memory goes with the parent, which is destroyed after its views. */
    tide_result_t (*arena_view_create)(struct tide_fabric_arena *parent, uint64_t signature,
                                       struct tide_fabric_arena **view_out);
    /* Optional (NULL: arena_create serves a set too).  arena_create for the memory of a set
     * whose `views` groups each get a view next: for fabrics that keep per-view state in the
     * shared segment (the one-process-per-rank fabrics' flag areas, fabric/cuda/mp_view.c). */
    tide_result_t (*arena_create_set)(struct tide_fabric_world *world, uint64_t bytes,
                                      uint64_t signature, int views,
                                      struct tide_fabric_arena **arena_out);

    /* Run (or enqueue on `stream`) the binding rank's part of `prog` for one call. */
    tide_result_t (*execute)(struct tide_fabric_arena *arena, const tide_program_t *prog,
                             const tide_binding_t *binding, void *stream);

    /* Optional (NULL: the fabric does not compare calls).  Collective, before execute: post
     * this rank's signature `sig` of call `epoch` of collective `coll` and compare it with
     * every other rank's signature of the same call.  *other_rank_out is -1 when all agree,
     * else the lowest rank whose signature differs, with it in *other_sig_out.  Returns an
     * error only when the exchange itself failed (TIDE_ERR_TIMEOUT: a rank never made the
     * call). */
    tide_result_t (*call_check)(struct tide_fabric_arena *arena, tide_collective_t coll,
                                uint64_t epoch, uint64_t sig, int *other_rank_out,
                                uint64_t *other_sig_out);

    /* Optional (NULL: the fabric captures no call into a CUDA graph).  Whether this rank's
     * call of `prog` on `arena` would be captured into the capture `stream` is part of (one
     * that begins now when it is not capturing): the fabric's own checks, those execute makes
     * before it records a captured call (the same function), with no side effects.  Adds
     * TIDE_CAPTURE_NO_FABRIC / TIDE_CAPTURE_OTHER_GRAPH bits to v (tide_capture_block);
     * *key_out: the capture's id + 1, 0 when `stream` is not capturing.  Whether the program
     * ran before is core's bookkeeping (api/capture.c), not asked here.  Returns an error only
     * when the stream cannot be asked (the legacy default stream during a capture, an
     * invalidated capture, a CUDA error). */
    tide_result_t (*capture_check)(struct tide_fabric_arena *arena, const tide_program_t *prog,
                                   void *stream, uint64_t *key_out, tide_capture_verdict_t *v);
};



/* The providers.  A fabric that is not built has no ops; tide_fabric_lookup returns NULL. */
extern const struct tide_fabric_ops tide_fabric_cpu_ops;
#ifdef TIDE_HAVE_CUDA
extern const struct tide_fabric_ops tide_fabric_cuda_ops;
/* The cudaEvent_t (as void *) of rank `rank`'s last reduce-scatter's read-done point on a
 * tide_fabric_cuda_ops arena (fabric/cuda/read_done.c). */
tide_result_t tide_cuda_read_done_event(const struct tide_fabric_arena *arena, int rank,
                                        void **event_out);
/* The same on the one-process-per-rank CUDA fabric and the NCCL fabric (their arenas and
 * views: tide_cuda_mp_is). */
bool tide_cuda_mp_is(const struct tide_fabric_arena *arena);
tide_result_t tide_cuda_mp_read_done_event(const struct tide_fabric_arena *arena, void **event_out);
/* This rank's segment of a one-process-per-rank or NCCL arena (or view): base, allocation
 * size (the arena, the flag areas and the rounding to the allocation unit) and device. */
void tide_cuda_mp_segment(const struct tide_fabric_arena *arena, void **ptr_out,
                          uint64_t *bytes_out, int *device_out);
/* The capture key of a stream (a cudaStream_t as void *), as the CUDA fabrics' calls see
 * it: tide_stream_capture_key (fabric/cuda/graph.c). */
tide_result_t tide_cuda_stream_capture_key(void *stream, uint64_t *key_out);
#endif
#ifdef TIDE_HAVE_NCCL
/* Created by tide_comm_init_nccl / tide_comm_init_nccl_comm only (fabric/nccl/). */
extern const struct tide_fabric_ops tide_fabric_nccl_ops;
#endif

static inline const struct tide_fabric_ops *tide_fabric_lookup(tide_fabric_kind_t kind) {
    switch (kind) {
    case TIDE_FABRIC_CPU:
        return &tide_fabric_cpu_ops;
#ifdef TIDE_HAVE_CUDA
    case TIDE_FABRIC_CUDA:
        return &tide_fabric_cuda_ops;
#endif
#ifdef TIDE_HAVE_NCCL
    case TIDE_FABRIC_NCCL:
        return &tide_fabric_nccl_ops;
#endif
    default:
        return NULL;
    }
}

#endif /* TIDE_FABRIC_FABRIC_H_ */
