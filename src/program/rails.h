/*
 * rails.h - the cross-node transfers of a program as rail steps of matched sends and
 * receives (docs/nccl-fabric.md, "Rails").  Plain C, no CUDA or NCCL: the CPU build compiles
 * and tests it (tests/unit/test_rails.c); the NCCL fabric (fabric/nccl/rails.c) issues it.
 *
 * A program moves bytes across nodes only as rail puts: a flat COPY whose destination (arena
 * or landing) belongs to a rank of another node, with a fused signal on that rank or none.
 * Across nodes it also raises credits: bare SIGNALs on a rank of another node, which the
 * receiver of a later put waits for before that put may overwrite its buffer.  A bare SIGNAL
 * on another node's counter that cross-node copies signal too (the same counter index,
 * program-wide) is not a credit but an *empty put*: an arrival that moves no bytes (the rail
 * lane's RS announces a block of only padding rows so), matched and ordered like a put of
 * zero bytes, for which the transports move nothing.  With two-sided transport (ncclSend /
 * ncclRecv) the bytes land only once the receiver posted its receive, so
 *   - a put becomes a send on the sender and a receive on the receiver, after which the
 *     receiver raises the put's signal itself (its own counter, local memory);
 *   - a credit becomes a precondition of the receiver's receive: the credit op, local to the
 *     receiver, must have run (in this call, or delta calls before); the sender's WAIT on the
 *     credit's counter is dropped (it could not read a counter on another node anyway).
 *
 * Steps.  A step of a rank is a maximal run of its puts that are adjacent ops of its put
 * queue (the AG's own shard and forwarded run of one Bruck round; the rail lane's copies of
 * one Bruck round, one per parameter and run of ranks; the rail lane's pieces of one RS
 * send): nothing of the queue can observe the state between them.  Every rank must have the
 * same number of steps per call, step s of every rank belongs to the same rendezvous; the
 * puts per step may differ between ranks (a Bruck run that wraps past rank M - 1 is two
 * copies).  Steps are not merged further, because the queue of a put waits for its step to
 * complete before its next op (the put's bytes have left and arrived, as with a copy in
 * stream order): a step holding puts k and k + 2 would need the queue to pass op k + 1 first.
 * The receives of rank b in step s are the puts of step s aimed at b, in (sender, put)
 * order, so for every pair the i-th send from a to b and the i-th receive on b from a are
 * the same put.  A put without a signal must be followed, in its step, by a put to the same
 * rank that signals it: the receiver raises that counter once the whole step is in.
 *
 * The machine's rules (machine.h) decide what signals what; the credits' call distance comes
 * from the abstract execution of two calls (the same run as the CUDA fabrics' schedule).
 */
#ifndef TIDE_PROGRAM_RAILS_H_
#define TIDE_PROGRAM_RAILS_H_

#include "program/program.h"

#include <stdbool.h>
#include <stdint.h>

/* One transfer of a step, as the sender sees it (send) or the receiver (recv). */
typedef struct {
    int32_t src_rank, dst_rank; /* sender, receiver */
    int32_t put;                /* index of the put among the sender's puts of a call */
    int32_t queue, op;          /* the put's position in the sender's program */
    tide_ref_t src;             /* the sender's bytes (the put's source; NONE: empty put) */
    tide_ref_t dst;             /* where they land on the receiver (the put's destination) */
    uint64_t bytes;             /* 0 for an empty put: the transports move nothing */
    uint8_t bank_dep;           /* offsets are for bank 0 (program.h) */
    int32_t ctr;                /* counter the receiver raises once the bytes are in (-1: none,
                                   a later put of the step signals it) */
} tide_rail_xfer_t;

/* A receive's precondition: op (queue, op) of the receiver itself, a credit, has run in call
 * e - delta (no wait when e - delta < 0). */
typedef struct {
    int32_t queue, op;
    int32_t delta;
    int32_t recv; /* index into the rank's recvs: the receive it guards */
} tide_rail_credit_t;

typedef struct {
    int first_put, num_puts;     /* the step's puts [first_put, first_put + num_puts) */
    int first_send, num_sends;   /* into the rank's sends */
    int first_recv, num_recvs;   /* into the rank's recvs */
    int first_credit, num_credits;
    int32_t queue, first_op;     /* the rank's queue and op of the step's first put */
} tide_rail_step_t;

typedef struct {
    tide_rail_step_t *steps; /* num_steps of the schedule */
    tide_rail_xfer_t *sends, *recvs;
    tide_rail_credit_t *credits;
    int num_sends, num_recvs, num_credits;
    int num_puts;      /* the rank's puts per call (empty puts included) */
    int32_t queue;     /* the one queue holding the rank's puts (-1: none) */
    int32_t *put_step; /* [ops of that queue]: step of a put, -1 for other ops */
    uint8_t *dropped[TIDE_Q_COUNT]; /* [ops]: WAITs on credit counters (not issued) */
    uint8_t *credit[TIDE_Q_COUNT];  /* [ops]: bare SIGNALs to another node (credits) */
} tide_rails_rank_t;

typedef struct {
    int num_ranks, nodes, gpus_per_node;
    int puts;      /* the most puts a rank has per call */
    int num_steps; /* steps per call */
    tide_rails_rank_t *ranks;
} tide_rails_t;

/* Whether rank and peer sit on different nodes of a topology with L ranks per node. */
static inline bool tide_rails_remote(int l, int rank, int peer) {
    return peer >= 0 && rank / l != peer / l;
}

/* The rail schedule of every rank of `prog`.  TIDE_ERR_UNSUPPORTED names the op when the
 * program crosses nodes in a way two-sided transport cannot carry (a 2D or remote-source
 * copy, a copy signalling another rank than its destination, puts in two queues, different
 * step counts per rank, an unsignalled put that no later put of its step covers, a counter
 * fed by credits and other signals, a credit that guards no later put to its sender);
 * TIDE_ERR_INTERNAL when the abstract execution deadlocks. */
tide_result_t tide_rails_build(const tide_program_t *prog, tide_rails_t *out);
void tide_rails_free(tide_rails_t *r);

#endif /* TIDE_PROGRAM_RAILS_H_ */
