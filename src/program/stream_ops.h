/*
 * stream_ops.h - what one call of a program enqueues per rank on the CUDA fabrics, counted on
 * the host from the schedule's commands (program/schedule.h) and the direct-mode analysis
 * (program/direct.h), without a GPU (tide-plan program --stream-ops, test_stream_ops).
 *
 * The two CUDA executors replay the same command list (fabric/cuda/call.c); they differ in
 * how a RECORD or WAIT travels and in what they add around the commands:
 *   EVENTS (the single-process fabric, execute.c + transport/local): a RECORD is an event
 *     record, a WAIT an event wait that the GPU resolves on the device; the call's fence is
 *     one event wait per rank; direct mode's end-of-call joins are on the utility and
 *     aggregate streams, once per call, off every caller's stream.
 *   FLAGS (one process per rank, mp_execute.c + transport/ipc): a RECORD is a flag write
 *     (cuStreamWriteValue64), a WAIT polls the signalling rank's flag (host-mapped by
 *     default, mp_flags.c) and a run of one stream's WAITs is one stream memory operation
 *     (cuStreamBatchMemOp); the start fence waits on the N done flags (one batch), the call
 *     writes its done flag and its "began" word, and in direct mode or with the
 *     synchronisation elision the caller's stream waits on the other ranks' done flags at the
 *     end (mp_direct.c: the peers read this rank's gradients and wrote its output), which
 *     makes the next call's start fence implied on the same stream (left out).
 * This mirrors those files' counting into tide_cuda_stats_t; a change there must change
 * stream_ops.c too (tests/gpu/test_stream_ops_mp.c compares the two on a GPU).  Counts are of an eager call in the given form, with the gradient pointer
 * row and the fused-sum tables unchanged since the call of the same parity (the steady state
 * of a training loop: no uploads), copies unbatched, sums and landings one launch each
 * (slicing, fabric/cuda/slices.c, may split a launch: counted as one here).
 */
#ifndef TIDE_PROGRAM_STREAM_OPS_H_
#define TIDE_PROGRAM_STREAM_OPS_H_

#include "program/direct.h"
#include "program/schedule.h"
#include "program/sync_elide.h"

typedef enum { TIDE_STREAM_OPS_EVENTS = 0, TIDE_STREAM_OPS_FLAGS = 1 } tide_stream_ops_fabric_t;

typedef struct {
    /* The rank's commands (the same list on both fabrics). */
    int forks;        /* stream waits on the rank's call-start event */
    int joins;        /* a thread's end recorded and waited by the caller's stream */
    int records;      /* RECORD: event records (EVENTS) or flag writes (FLAGS) */
    int waits_peer;   /* WAIT / WAIT_PREV on a signal of another rank */
    int waits_own;    /* WAIT / WAIT_PREV on a signal of another queue of this rank */
    int wait_runs;    /* maximal runs of WAITs on one stream with no other command of that
                       * stream between them: the waits if each run were one batch */
    int wait_calls;   /* FLAGS: the stream memory operations the WAITs take, one per run of
                       * one stream's waits of one kind with no other command of that stream
                       * between them (tide_sched_wait_runs; every wait alone:
                       * TIDE_CUDA_MP_WAIT_RUNS=0) */
    int upload_waits; /* a thread's wait on the rank's gradient-table upload (an event) */
    int copies;       /* COPY / COPY2D / ZERO / CAST issued (SM kernels on one GPU) */
    int sums, lands;  /* kernel launches */
    int events;       /* EVENT ops recorded in the queues */
    int elided;       /* copies direct mode does not issue */
    int fused;        /* landings a fused sum stores (nothing issued) */
    /* Around the commands: the executor's begin, fence, prologue, done and epilogue. */
    int exec_event_records, exec_event_waits;
    int exec_flag_writes; /* FLAGS: "began" (host flags, kernel waits), done */
    int exec_flag_waits;  /* FLAGS: done flags polled by the start and end fences */
    int exec_flag_calls;  /* FLAGS: the wait kernels (memory operations) those take */
    /* The critical path into the sums: the WAITs right before each SUM on its stream. */
    int sum_waits;      /* summed over the rank's issued SUMs */
    int sum_waits_peer; /* of those, on another rank's signal */
    int sum_wait_runs;  /* their runs (see wait_runs) */
} tide_stream_ops_t;

/* Once per call on EVENTS, not per rank: direct mode's read-done joins on the utility stream
 * and the fence event on the aggregate stream (execute.c, epilogue). */
typedef struct {
    int event_waits, event_records;
} tide_stream_ops_shared_t;

/* Count what rank `rank`'s part of one call in form `form` (tide_sched_form_t) enqueues on
 * `fabric`.  `sched` is prog's schedule (tide_schedule_build); `dir` its direct analysis, or
 * NULL for the pushed path; `se` the synchronisation elision the fabric runs with fused
 * outputs (program/sync_elide.h: the one-process-per-rank fabric's default), or NULL (or not
 * on): the schedule's own commands.  With it, the late ops are counted where the executor
 * issues them after its end fence: ZEROs as copies, EVENTs as events.  *shared_out (may be
 * NULL) gets the once-per-call part (EVENTS; zero on FLAGS). */
tide_result_t tide_stream_ops_count(const tide_program_t *prog, const tide_schedule_t *sched,
                                    const tide_direct_t *dir, const tide_sync_elide_t *se,
                                    tide_stream_ops_fabric_t fabric, int rank, int form,
                                    tide_stream_ops_t *out, tide_stream_ops_shared_t *shared_out);

/* Stream memory operations of a rank's call on FLAGS: every RECORD, the WAITs' runs (or, with
 * runs false, every WAIT alone), the executor's flag writes and wait calls. */
static inline int tide_stream_ops_memops(const tide_stream_ops_t *s, bool runs) {
    return s->records + (runs ? s->wait_calls : s->waits_peer + s->waits_own) +
           s->exec_flag_writes + s->exec_flag_calls;
}

#endif /* TIDE_PROGRAM_STREAM_OPS_H_ */
