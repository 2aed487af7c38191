/*
 * machine.h - the abstract machine of a program: the one place that says what an op does to
 * the counters and when it may run.  The checker, the fabrics' schedulers, the binder and the
 * tests ask it; none of them restates the rules.
 *
 * The rules (program.h gives the IR):
 *   signal   an op signals when it is a SIGNAL, or a COPY / COPY2D with a fused signal
 *            (sig_rank >= 0); it adds 1 to counter `ctr` of rank `sig_rank` once it is done.
 *   wait     a WAIT of call e (e = 0, 1, ...) of rank r passes when counter (r, ctr) >=
 *            e * inc + thr.  A target <= 0 always passes (the first call starts from a fresh
 *            arena; counters never go below 0).
 *   overflow a target that does not fit int64 is an error, TIDE_ERR_OVERFLOW, never a
 *            saturated or capped value: the program is rejected before anything runs.
 *   order    ops of one (rank, queue) run in program order; a rank starts call e + 1 only
 *            after every one of its queues finished call e (fabrics enforce the same).
 *   counts   per call, counter (r, c) receives exactly the number of signalling ops that name
 *            it; every WAIT's inc must equal that count (counters.c checks it).
 *
 * tide_machine_t runs those rules: a state of `calls` consecutive calls of all ranks, counters
 * from 0, in which the caller picks which enabled (rank, queue) thread fires next.  Threads
 * are t = rank * TIDE_Q_COUNT + queue.
 */
#ifndef TIDE_PROGRAM_MACHINE_H_
#define TIDE_PROGRAM_MACHINE_H_

#include "program/program.h"

#include <stdbool.h>
#include <stdint.h>

/* Whether op signals (a bare SIGNAL or a copy's fused signal). */
static inline bool tide_machine_signals(const tide_op_t *op) {
    return op->kind == TIDE_OP_SIGNAL ||
           ((op->kind == TIDE_OP_COPY || op->kind == TIDE_OP_COPY2D) && op->sig_rank >= 0);
}

/* Whether op names a counter (signals or waits). */
static inline bool tide_machine_uses_counter(const tide_op_t *op) {
    return op->kind == TIDE_OP_WAIT || tide_machine_signals(op);
}

/* Target of WAIT op in call `epoch`: epoch * inc + thr.  False when it overflows int64 (the
 * caller returns TIDE_ERR_OVERFLOW, see the overflow rule). */
static inline bool tide_machine_wait_target(uint64_t epoch, const tide_op_t *op,
                                            int64_t *target_out) {
    int64_t t;
    if (epoch > (uint64_t)INT64_MAX || __builtin_mul_overflow((int64_t)epoch, op->inc, &t) ||
        __builtin_add_overflow(t, op->thr, &t))
        return false;
    *target_out = t;
    return true;
}

/* Whether a counter holding `value` passes a wait whose target is `target`. */
static inline bool tide_machine_wait_passes(int64_t value, int64_t target) {
    return target <= 0 || value >= target;
}

/* The counts rule for one WAIT: `count` signals reach its counter per call. */
static inline bool tide_machine_inc_ok(const tide_op_t *op, int64_t count) {
    return count >= 1 && op->inc == count && op->thr <= op->inc;
}

/* One past the largest counter index any op of the program names (0: none). */
int tide_machine_counters_used(const tide_program_t *prog);

/* Signals per call on every counter: counts_out[rank * num_ctrs + ctr], calloc'ed (free()).
 * TIDE_ERR_INTERNAL naming the op when a signal names a rank or counter outside
 * num_ranks x num_ctrs. */
tide_result_t tide_machine_count_signals(const tide_program_t *prog, int num_ctrs,
                                         int64_t **counts_out);

/* ------------------------------------------------------------------ the stepper */

typedef struct {
    const tide_program_t *prog;
    int n, threads, ctrs, calls;
    int *pc;           /* [threads]: next op of each thread in its rank's current call */
    int *epoch;        /* [n]: the call each rank is in */
    uint8_t *finished; /* [n]: the rank finished all `calls` calls */
    int64_t *ctr;      /* [n * ctrs] */
} tide_machine_t;

/* Allocate a machine for `calls` calls over counters [0, ctrs) and reset it.  Checks every
 * counter index and every wait target of those calls up front: TIDE_ERR_INTERNAL for an index
 * outside, TIDE_ERR_OVERFLOW for a target (the overflow rule), naming the op. */
tide_result_t tide_machine_init(tide_machine_t *m, const tide_program_t *prog, int ctrs,
                                int calls);
void tide_machine_free(tide_machine_t *m);
/* Counters to 0, every rank at op 0 of call 0 (ranks with empty programs finished). */
void tide_machine_reset(tide_machine_t *m);

/* The op thread t runs next, or NULL when its rank finished or its queue is done this call. */
static inline const tide_op_t *tide_machine_head(const tide_machine_t *m, int t) {
    const int r = t / TIDE_Q_COUNT;
    if (m->finished[r]) return NULL;
    const tide_queue_ops_t *qo = &m->prog->ranks[r].queues[t % TIDE_Q_COUNT];
    return m->pc[t] < qo->num_ops ? &qo->ops[m->pc[t]] : NULL;
}

/* Target of thread t's head WAIT in its rank's current call (checked at init). */
int64_t tide_machine_head_target(const tide_machine_t *m, int t);

static inline int64_t *tide_machine_counter(const tide_machine_t *m, int rank, int ctr) {
    return &m->ctr[(size_t)rank * (size_t)m->ctrs + (size_t)ctr];
}

/* Whether thread t's head may run now. */
bool tide_machine_enabled(const tide_machine_t *m, int t);

/* Run thread t's head (enabled): apply its signal, advance, and start the rank's next call
 * when all of its queues finished this one. */
void tide_machine_fire(tide_machine_t *m, int t);

/* Whether every rank finished every call. */
bool tide_machine_done(const tide_machine_t *m);

#endif /* TIDE_PROGRAM_MACHINE_H_ */
