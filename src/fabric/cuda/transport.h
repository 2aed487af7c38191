/*
 * transport.h - the one command interpreter of the CUDA fabrics (call.c) and the narrow table
 * through which it reaches a transport (docs/cuda-fabric.md, "The transport table").
 *
 * A call replays its schedule's commands (program/schedule_commands.c) on streams.  The data
 * ops, the gradient table uploads, forks, joins and the rank's EVENT ops are the same on every
 * CUDA fabric and are issued here once; what depends on where the peers live goes through a
 * tide_cuda_transport_t:
 *
 *   local (src/fabric/transport/local/): every rank in this process, signals are CUDA events;
 *   ipc   (src/fabric/transport/ipc/):   one process per rank, signals are 64-bit flags (host-
 *                                        mapped or in the mapped segments), rails emulated;
 *   nccl  (src/fabric/transport/nccl/):  one process per rank on NCCL's LSA windows, rails
 *                                        through NCCL.
 *
 * The contract every entry keeps (the deadlock argument of execute.c relies on it): an entry
 * only enqueues stream work and never waits on the host, so a call may be captured into a
 * CUDA graph; every wait names a signal recorded earlier in the global enqueue order; a wait
 * ends when its signal was recorded or when the group was failed (a transport that cannot be
 * released by a poison must be bounded by its executor's host waits).  An entry counts the
 * stream operations it enqueues in c->st.
 */
#ifndef TIDE_FABRIC_CUDA_TRANSPORT_H_
#define TIDE_FABRIC_CUDA_TRANSPORT_H_

#include "fabric/cuda/cuda.h"

typedef struct tide_cuda_call tide_cuda_call_t;

typedef struct tide_cuda_transport {
    const char *name;
    /* RECORD: signal `slot` of this call is done, after what stream s holds. */
    tide_result_t (*record)(tide_cuda_call_t *c, cudaStream_t s, int slot);
    /* WAIT (prev false) / WAIT_PREV (prev true): stream s waits for `slot` of this call or
     * of the previous one. */
    tide_result_t (*wait)(tide_cuda_call_t *c, cudaStream_t s, int slot, bool prev);
    /* A run of WAITs (or WAIT_PREVs) of one thread (program/schedule.h, tide_sched_wait_runs):
     * stream s waits for every slots[0 .. n) at once, as one stream operation where the
     * transport can; NULL: the interpreter issues every wait alone, where it stands.  Only a
     * transport whose waits poll memory may have it: an event wait binds the event's last
     * record at enqueue, and a run is issued at its last wait's position. */
    tide_result_t (*wait_run)(tide_cuda_call_t *c, cudaStream_t s, const int *slots, int n,
                              bool prev);
    /* The caller stream of `rank` waits until every rank this transport fences finished call
     * `call` of the family (the fence of "A call"). */
    tide_result_t (*fence)(tide_cuda_call_t *c, int rank, int64_t call);
    /* `rank` finished this call: after what its caller stream holds, the signal its peers'
     * fences wait for. */
    tide_result_t (*done)(tide_cuda_call_t *c, int rank);
    /* BATCH: run `k` of copies (planned by the executor) at thread t's position; the copies
     * of a run whose ranges overlap go one by one through tide_cuda_call_op. */
    tide_result_t (*copy_batch)(tide_cuda_call_t *c, int k, int t);
    /* A put the transport carries itself (a rail step), or NULL: every op is issued as
     * itself.  *carried: the op was handled (issued, or part of a step issued earlier). */
    tide_result_t (*rail_put)(tide_cuda_call_t *c, int id, cudaStream_t s, bool *carried);
} tide_cuda_transport_t;

/* The gradient pointer table of a call's parity, per rank this process enqueues (UPLOAD). */
typedef struct {
    void **dev;        /* [local rank]: device table */
    const void **host; /* [local rank * row]: pinned upload sources */
    const void **last; /* [local rank * row]: what each device table holds */
    bool *valid;       /* [local rank] */
    bool *inflight;    /* [local rank]: done recorded after an upload from host */
    cudaEvent_t *done; /* [local rank] */
    int row;           /* pointers per rank */
    /* The row this call wants in rank r's table. */
    const void **(*want)(tide_cuda_call_t *c, int rank);
} tide_cuda_rows_t;

/* The device half of one parity's tables for the n ranks of this process (rows.c): *host_out a
 * pinned block of n rows of row_bytes; per rank r a device row dev[r] and the upload's event
 * done[r], on device r % num_devices (num_devices 0: the current device).  Partial results stay
 * for tide_cuda_rows_release, which takes NULL entries (and NULL arrays) as absent. */
tide_result_t tide_cuda_rows_alloc(int n, int num_devices, size_t row_bytes,
                                   const void ***host_out, void **dev, cudaEvent_t *done);
void tide_cuda_rows_release(int n, const void **host, void **dev, cudaEvent_t *done);

/* One call as the interpreter sees it.  Arrays are indexed by a rank or thread of this process
 * less rank0 (rank0 * TIDE_CUDA_Q for threads): all N ranks in one process (local), only this
 * rank's own (ipc, nccl). */
struct tide_cuda_call {
    const tide_cuda_transport_t *tp;
    void *tp_ctx; /* the transport's view of the call (its header) */
    void *owner;  /* the executor's (rows.want) */
    int rank0;
    int num_ranks;           /* ranks this process enqueues: rank0 .. rank0 + num_ranks - 1 */
    int num_devices;         /* > 0: rank r runs on device r % num_devices, made current here */
    int cur_dev;             /* -1: none made current yet */
    const size_t *max_pitch; /* [device index] */
    const int *sm_count;     /* [device index] */
    const tide_cuda_slicing_t *slicing;
    int sum_ctas, landing_ctas;
    const tide_schedule_t *sched;
    const tide_program_t *const *checked; /* [local rank] */
    tide_cuda_bound_t *bound;             /* [op id] */
    /* Direct mode: copies not issued, landings a fused sum stored, EVENT ops recorded by the
     * executor's epilogue instead. */
    const uint8_t *elide, *fused_land;
    bool skip_read_done, skip_call_done;
    /* The command list's runs of waits (tide_sched_wait_runs: 1 = issued with the run's last
     * wait), or NULL: every wait alone.  Used only with a transport's wait_run and one rank
     * in this process. */
    const uint8_t *wait_defer;
    cudaStream_t *stream; /* [local thread] */
    cudaEvent_t *start;   /* [local rank]: forks wait for it */
    cudaEvent_t *end;     /* [local thread]: joins record it */
    cudaStream_t *caller; /* [local rank]; NULL entries: the legacy stream */
    cudaEvent_t *user;    /* [local rank * TIDE_EVENT_COUNT + event] */
    tide_cuda_rows_t rows;
    bool graph; /* being captured: the tables were uploaded before (graph.c) */
    int parity;
    uint64_t epoch;
    tide_cuda_stats_t st;
};

static inline cudaStream_t tide_cuda_call_caller(const tide_cuda_call_t *c, int rank) {
    cudaStream_t s = c->caller[rank - c->rank0];
    return s != NULL ? s : cudaStreamLegacy;
}
static inline cudaStream_t tide_cuda_call_stream(const tide_cuda_call_t *c, int t) {
    return c->stream[t - c->rank0 * TIDE_CUDA_Q];
}

/* Make rank's device current (a no-op when the executor did: num_devices 0). */
tide_result_t tide_cuda_call_device(tide_cuda_call_t *c, int rank);
/* Stream s waits for ev / records ev, counted. */
tide_result_t tide_cuda_call_wait_event(tide_cuda_call_t *c, cudaStream_t s, cudaEvent_t ev);
tide_result_t tide_cuda_call_record_event(tide_cuda_call_t *c, cudaEvent_t ev, cudaStream_t s);
/* Issue op `id` of thread t (direct mode's elisions applied). */
tide_result_t tide_cuda_call_op(tide_cuda_call_t *c, int id, int t);
/* The ops of `rank` marked in late[] (program/sync_elide.h: the output's padding ZEROs and
 * the EVENTs), in op order, on the rank's caller stream: the executor calls this after its
 * end-of-call fence.  EVENTs are recorded whatever skip_read_done / skip_call_done say. */
tide_result_t tide_cuda_call_late(tide_cuda_call_t *c, int rank, const uint8_t *late);
/* Replay cmds[0 .. n): action (or NULL) is a per-command plan of batches made per call
 * (-1: issue the command, -2: carried by a batch, k >= 0: batch k here). */
tide_result_t tide_cuda_call_run(tide_cuda_call_t *c, const tide_sched_cmd_t *cmds, int n,
                                 const int32_t *action);

/* What an executor adds around the commands (NULL: nothing).  begin: on rank r's caller stream
 * before its fence wait; prologue: after it, before the start record every thread of r forks
 * from (table uploads); epilogue: once every rank of this process recorded done (read-done,
 * call-done, the call's own fence). */
typedef struct {
    tide_result_t (*begin)(tide_cuda_call_t *c, int rank);
    tide_result_t (*prologue)(tide_cuda_call_t *c, int rank);
    tide_result_t (*epilogue)(tide_cuda_call_t *c);
} tide_cuda_call_hooks_t;

/* The call path of every CUDA fabric: per rank of this process, begin, the transport's fence
 * of call `fence` (none when negative), prologue and the start record; the commands
 * (tide_cuda_call_run); per rank the transport's done; the epilogue. */
tide_result_t tide_cuda_call_enqueue(tide_cuda_call_t *c, const tide_cuda_call_hooks_t *h,
                                     int64_t fence, const tide_sched_cmd_t *cmds, int n,
                                     const int32_t *action);

/* ------------------------------------------------------------------ recording a call
 * The bookkeeping every executor does before it enqueues a call, whatever its process layout. */

/* The form of call `epoch` of program `prep` after the family's last enqueued call
 * (last_epoch, last_prep; -1: none): STEADY when it directly follows a call of the same
 * program (and `same`: the executor's own condition, the capture state on the single-process
 * fabric), else FRESH.  *fence_out: the call the fence covers (STEADY waits reach back one
 * call, so the one before; FRESH waits reach none, so the previous); negative: none. */
void tide_cuda_call_order(uint64_t epoch, int prep, int64_t last_epoch, int last_prep, bool same,
                          int *form_out, int64_t *fence_out);
/* A FRESH call that switches programs must find their per-call counters counting alike
 * (tide_schedule_incs_match); `last`: the schedule of program last_prep. */
tide_result_t tide_cuda_call_switch_check(const char *fabric, uint64_t epoch, int form, int prep,
                                          int64_t last_epoch, int last_prep,
                                          const tide_schedule_t *sched,
                                          const tide_schedule_t *last);
/* Rank `rank` calls with `prog`: unless it is *checked already, its rank program must be the
 * one the schedule was built from (rank hash); then *checked = prog. */
tide_result_t tide_cuda_call_checked(const char *fabric, const tide_program_t *prog, int rank,
                                     const tide_schedule_t *sched,
                                     const tide_program_t **checked);
/* The call's launch geometry from its plan (at least one CTA each). */
void tide_cuda_call_ctas(const tide_binding_t *b, int *sum_ctas_out, int *landing_ctas_out);

/* A transport's table from the common prefix p of its entries (p_record, p_wait, p_fence,
 * p_done, p_copy_batch), its wait_run and its rail_put (each may be NULL). */
#define TIDE_CUDA_TRANSPORT(name_, p, wait_run_, rail_put_)                                        \
    {                                                                                              \
        .name = (name_), .record = p##_record, .wait = p##_wait, .wait_run = (wait_run_),          \
        .fence = p##_fence, .done = p##_done, .copy_batch = p##_copy_batch,                        \
        .rail_put = (rail_put_)                                                                    \
    }

/* The most waits of a run issued together; a longer run is issued in pieces of this many,
 * each at its last wait's position. */
#define TIDE_CUDA_WAIT_RUN_MAX 64

/* The three transports (src/fabric/transport/). */
extern const tide_cuda_transport_t tide_transport_local;
extern const tide_cuda_transport_t tide_transport_ipc;
extern const tide_cuda_transport_t tide_transport_nccl; /* built with TIDE_WITH_NCCL */

#endif /* TIDE_FABRIC_CUDA_TRANSPORT_H_ */
