/*
 * schedule.h - a program's schedule: the order of a whole call of all ranks and, for every
 * WAIT, the signals it needs; plain C of the program layer (it needs no GPU), built and
 * tested in the CPU build (tests/unit/test_schedule.c).
 *
 * schedule.c runs the abstract machine (program/machine.h) over two consecutive calls of all
 * ranks; schedule_commands.c turns that run into the command lists the CUDA fabrics replay:
 * the single-process fabric (fabric/cuda/execute.c, events) and the one-process-per-rank
 * fabrics (fabric/cuda/mp_*.c, fabric/nccl/: flags in device memory).  A thread of a
 * schedule is one (rank, queue) of the program: thread = rank * TIDE_Q_COUNT + queue.
 */
#ifndef TIDE_PROGRAM_SCHEDULE_H_
#define TIDE_PROGRAM_SCHEDULE_H_

#include "program/machine.h"
#include "program/program.h"

#include <stdbool.h>
#include <stdint.h>


/* ------------------------------------------------------------------ schedules (host only) */

typedef enum {
    TIDE_SCHED_CMD_FORK = 0,        /* the thread's stream waits on its rank's call-start event */
    TIDE_SCHED_CMD_OP = 1,          /* run op `arg` (global id) on the thread's stream */
    TIDE_SCHED_CMD_RECORD = 2,      /* record signal event `arg` of this call's parity */
    TIDE_SCHED_CMD_WAIT = 3,        /* wait on signal event `arg` of this call */
    TIDE_SCHED_CMD_WAIT_PREV = 4,   /* wait on signal event `arg` of the previous call */
    TIDE_SCHED_CMD_UPLOAD = 5,      /* upload the rank's gradient pointer table */
    TIDE_SCHED_CMD_UPLOAD_WAIT = 6, /* wait for the rank's upload (made on another stream) */
    TIDE_SCHED_CMD_JOIN = 7,        /* the caller's stream waits for the thread's end */
    TIDE_SCHED_CMD_BATCH = 8,       /* run batch `arg` (batch.c) as one copy kernel */
    TIDE_SCHED_CMD_KIND_COUNT = 9
} tide_sched_cmd_kind_t;

typedef struct {
    uint8_t kind;   /* tide_sched_cmd_kind_t */
    int32_t thread; /* rank * TIDE_Q_COUNT + queue */
    int32_t arg;    /* OP: op id; RECORD / WAIT / WAIT_PREV: event slot; else unused */
} tide_sched_cmd_t;

/* A call is FRESH when nothing of its program is in flight (epoch 0, or the previous call of
 * its counters ran another program, e.g. the other RS mode) and STEADY otherwise. */
typedef enum { TIDE_SCHED_FRESH = 0, TIDE_SCHED_STEADY = 1, TIDE_SCHED_FORMS = 2 } tide_sched_form_t;

typedef struct {
    int num_ranks;
    int num_threads;  /* num_ranks * TIDE_Q_COUNT */
    int num_ops;      /* all ranks and queues; op ids are [0, num_ops) */
    int *op_base;     /* [num_threads + 1]: first op id of each thread */
    int num_slots;    /* signal events per call parity */
    int *slot_thread; /* [num_slots]: the thread that records the slot (its rank's device) */
    int32_t *op_slot; /* [num_ops]: the slot of a signalling op some wait names, else -1 */
    int num_counters; /* counter indices per rank used by the program */
    int32_t *incs;    /* [num_ranks * num_counters]: signals per call on each counter */
    tide_sched_cmd_t *cmds[TIDE_SCHED_FORMS];
    int num_cmds[TIDE_SCHED_FORMS];
    bool has_sum;        /* some op is a SUM: gradient pointer tables are uploaded per call */
    uint64_t *rank_hash; /* [num_ranks]: tide_schedule_rank_hash of the program it was built from */
} tide_schedule_t;

/* Hash of what a schedule depends on in rank r's part of a program: queue lengths, op kinds,
 * counters, thresholds, tables.  Every rank's group compiles its own copy of the program; a
 * rank whose copy hashes differently cannot run the shared schedule. */
uint64_t tide_schedule_rank_hash(const tide_program_t *prog, int rank);

/* Build the schedule of `prog` (all ranks): abstract execution, dependency sets, commands.
 * TIDE_ERR_INTERNAL names the op when the program deadlocks or a count is ambiguous. */
tide_result_t tide_schedule_build(const tide_program_t *prog, tide_schedule_t *out);
void tide_schedule_free(tide_schedule_t *s);

/* The op numbering alone (num_ranks, num_threads, op_base, num_ops, num_counters; no
 * abstract execution, no commands): what an analysis of the program's ops needs
 * (program/direct.h).  Released with tide_schedule_free. */
tide_result_t tide_schedule_layout(const tide_program_t *prog, tide_schedule_t *out);

/* The same for a fabric that carries the cross-node puts as rail steps (program/rails.h) with
 * `gpus_per_node` ranks per node (0: no rails, tide_schedule_build).  There a put's flag
 * is written by its receiver once the bytes are in and a credit becomes a precondition of a
 * receive, so the sender's stream order says nothing about the receiver: a wait on a signal
 * of another node's rank is never dropped as implied by what the waiter knows, and teaches
 * the waiter nothing (its clock snapshot is not merged).  The global order comes from a run
 * in which each rail step's puts of every rank run as one block once every rank reached the
 * step (schedule.c), so that a step's credits precede it and its arrivals' waiters follow it
 * in every rank's enqueue order.  TIDE_ERR_UNSUPPORTED where tide_rails_build refuses. */
tide_result_t tide_schedule_build_rails(const tide_program_t *prog, int gpus_per_node,
                                             tide_schedule_t *out);

/* Runs of waits that a flag fabric issues as one stream memory operation (the one-process-
 * per-rank CUDA fabric: fabric/cuda/call.c with a transport that has wait_run).  A run is a
 * maximal sequence of one thread's commands in `cmds` that are all WAIT, or all WAIT_PREV,
 * with no other command of that thread between them (other threads' commands may be).
 * defer[i] (may be NULL) is 1 for a wait of a run that is not the run's last: the fabric
 * issues it with the last one, at the last one's position.  Deferring keeps every thread's
 * stream order and moves no wait ahead of a signal it names in the enqueue order (a wait
 * only goes later), which is why the run ends at the position of its last wait and not its
 * first.  *runs_out (may be NULL): the runs, so one wait alone is a run.  threads: cmds'
 * thread values are below num_threads. */
tide_result_t tide_sched_wait_runs(const tide_sched_cmd_t *cmds, int n, int num_threads,
                                   uint8_t *defer, int *runs_out);

/* Whether the counters of two schedules get the same signals per call, so that the calls of
 * one may follow the calls of the other (the RS modes share the RS counters). */
bool tide_schedule_incs_match(const tide_schedule_t *a, const tide_schedule_t *b);

/* The abstract execution (schedule.c) for the command builder (schedule_commands.c). */
typedef struct {
    int32_t op;   /* op id of the signalling op */
    int32_t call; /* 0 or 1 */
} tide_sched_sig_t;

typedef struct {
    const tide_program_t *prog;
    tide_schedule_t *s;
    int32_t *op_thread;               /* [num_ops] */
    int32_t *order[TIDE_SCHED_FORMS];  /* op ids of call 0 (FRESH) and call 1 (STEADY), in order */
    int32_t *target[TIDE_SCHED_FORMS]; /* WAIT op id -> signals it needs (0: none) */
    int32_t *log_base;                /* [counters + 1] into log */
    tide_sched_sig_t *log;             /* signals of both calls, per counter, in abstract order */
    int rails_l;                      /* ranks per node of a rail fabric, 0: none */
} tide_sched_run_t;

tide_result_t tide_schedule_commands_build(tide_sched_run_t *run);

static inline const tide_op_t *tide_schedule_op(const tide_program_t *prog,
                                            const tide_schedule_t *s, int id, int thread) {
    return &prog->ranks[thread / TIDE_Q_COUNT]
                .queues[thread % TIDE_Q_COUNT]
                .ops[id - s->op_base[thread]];
}

/* The abstract machine's signal rule (machine.h). */
static inline bool tide_schedule_op_signals(const tide_op_t *op) {
    return tide_machine_signals(op);
}

#endif /* TIDE_PROGRAM_SCHEDULE_H_ */
