/*
 * check.h - the static program checker: proves the paper's protocol invariants (App. E) on a
 * compiled program, before any fabric runs it.
 *
 *   INC  every WAIT's inc equals the signals (bare or fused) that reach its (rank, counter)
 *        in one call, and thr <= inc: the epoch form `value >= e inc + thr` stays exact
 *   I4   progress: `calls` consecutive calls of all ranks, counters from 0, never deadlock
 *   I3   storage reuse: every two accesses to overlapping bytes, one a write, from different
 *        queues or ranks are ordered by happens-before (staging, outbox, inbox, stage,
 *        landing), and the caller's output is complete at the call-complete event
 *   I2   source liveness: gradients and shards are read only before, and happen-before, the
 *        read-complete event (RS) or call-complete event (AG) of their call
 *   I1   data: every contributor lands exactly once and stale blocks are zeroed; traced
 *        symbolically (tags, not values) through every copy, sum and landing
 *
 * Two further verdicts guard the model itself: IR (a malformed op: unknown kind, rank,
 * counter or table) and BOUNDS (an access outside its region or operand).
 *
 * How (check_exec.c): an abstract machine runs the program of all ranks, call after call,
 * firing any op whose WAIT is satisfied.  Counters only grow, so a satisfied WAIT stays
 * satisfied and the set of ops a maximal run executes does not depend on the order: one
 * maximal run decides deadlock freedom for every interleaving.  Happens-before is tracked
 * with vector clocks (one thread per rank and queue, a SIGNAL releases, a WAIT acquires),
 * but what a counting WAIT acquires is computed as what holds in every interleaving (a
 * fixpoint over the run, see check_exec.c), so a race that any schedule could exhibit is
 * found from one run, whichever run it is.
 */
#ifndef TIDE_PROGRAM_CHECK_H_
#define TIDE_PROGRAM_CHECK_H_

#include "program/program.h"

#include <stdint.h>

typedef enum {
    TIDE_CHECK_NONE = 0, /* no violation */
    TIDE_CHECK_IR = 1,   /* malformed op */
    TIDE_CHECK_INC = 2,  /* signal count per call inconsistent with a WAIT's inc / thr */
    TIDE_CHECK_BOUNDS = 3,
    TIDE_CHECK_I1 = 4,
    TIDE_CHECK_I2 = 5,
    TIDE_CHECK_I3 = 6,
    TIDE_CHECK_I4 = 7,
    TIDE_CHECK_KIND_COUNT = 8
} tide_check_invariant_t;

/* "ok", "IR", "INC", "BOUNDS", "I1", ... */
const char *tide_check_invariant_name(tide_check_invariant_t inv);

/* Where a violation was found: an op of one call of one rank (-1 fields: not applicable). */
typedef struct {
    int rank;
    int queue; /* tide_queue_t */
    int op;    /* index in the queue */
    int kind;  /* tide_op_kind_t */
    int call;  /* epoch */
} tide_check_site_t;

typedef struct {
    int ok;                          /* 1: every checked invariant holds */
    tide_check_invariant_t violated; /* TIDE_CHECK_NONE when ok */
    tide_check_site_t site;          /* the violating op (the later access of a race) */
    tide_check_site_t other;         /* races: the conflicting op; else rank = -1 */
    int schedules;                   /* runs analysed */
    int i1_checked;                  /* 0 when the program is too large to trace (N > 64) */
    uint64_t ops_run;                /* ops executed over all runs */
    char message[640];
} tide_check_report_t;

typedef struct {
    int calls;           /* consecutive calls, >= 2 */
    int schedules;       /* >= 1 runs in different seeded orders; the first also traces I1.  The
                            verdict does not depend on the order, so more runs only re-derive it */
    uint64_t seed;       /* seeds the runs' choices among enabled ops */
    int skip_inc;        /* 1: skip the INC pass (to see which deeper invariant a fault breaks) */
    int per_trace;       /* 1: sample instead of prove: each run's own happens-before (a WAIT
                            acquires the signals that run delivered before it), over `schedules`
                            runs that starve different threads; a race shows only if some run
                            exhibits it.  Kept to cross-check the default against executions */
    int direct_operands; /* 1: model the caller at each call entry as writing its gradients
                            and output (the backward produced them, the caller owns the
                            output), so a peer's in-place access to them (a gradient or output
                            reference naming a rank, program/sync_elide.h) must follow the
                            owner's entry through the program's signals */
} tide_check_options_t;

#define TIDE_CHECK_DEFAULT_SCHEDULES 1

/*
 * Check every invariant over `calls` (>= 2) consecutive calls with the default schedules.
 * Returns TIDE_SUCCESS when a verdict was computed (report_out->ok says which), an error for
 * invalid arguments or when out of memory.
 */
tide_result_t tide_program_check(const tide_program_t *prog, int calls,
                                 tide_check_report_t *report_out);

tide_result_t tide_program_check_ex(const tide_program_t *prog, const tide_check_options_t *opts,
                                    tide_check_report_t *report_out);

#endif /* TIDE_PROGRAM_CHECK_H_ */
