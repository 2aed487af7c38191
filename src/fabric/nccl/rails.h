/*
 * rails.h - the NCCL fabric's rail transport (docs/nccl-fabric.md, "Rails"): the cross-node
 * steps of program/rails.h as grouped ncclSend / ncclRecv on a rail communicator.
 *
 * EXPERIMENTAL, NEVER RUN: no machine we have has two GPUs, and NCCL refuses two ranks of one
 * communicator on one GPU, so not one of these calls has executed.  It is compiled with
 * -Werror against the NCCL 2.28 headers.  It is not wired into a call either: the NCCL arena
 * still maps every rank through the node's LSA team (M = 1) and the one-process-per-rank
 * execute (mp_execute.c) still issues every op itself, so tide_nccl_world_create refuses
 * M > 1 and there is no opt-in yet (TIDE_NCCL_RAILS is not read): the documentation lists
 * what is missing.
 *
 * Only the NCCL 2.28 path exists: ncclPutSignal / ncclWaitSignal (NCCL >= 2.29) are not
 * written, because no 2.29 headers were available to compile them.
 */
#ifndef TIDE_FABRIC_NCCL_RAILS_H_
#define TIDE_FABRIC_NCCL_RAILS_H_

#include "fabric/fabric.h"
#include "fabric/nccl/fabric_nccl.h"
#include "program/rails.h"

#include <stdbool.h>

/* The rail schedule of one program on this rank, and its per-step events. */
typedef struct {
    tide_rails_t sched; /* every rank's (program/rails.h); this rank uses its own */
    int me;
    cudaEvent_t *reach; /* [num_steps]: the put queue reached the step's first put */
    cudaEvent_t *done;  /* [num_steps]: the step's group ended and its flags are written */
} tide_nccl_rails_prog_t;

/* What one call of a step needs from the caller (the mp execute's state of the call). */
typedef struct {
    const tide_program_t *prog;
    const tide_binding_t *b;
    const tide_cuda_schedule_t *sched; /* the program's schedule: op ids and slots */
    uint8_t *own_slots;                /* this rank's flag slots of the program (8 bytes each) */
    uint8_t *own_done;                 /* this rank's done flag of the collective */
    bool steady;                       /* the STEADY form: the previous call ran this program */
} tide_nccl_rails_call_t;

/* Rail communicator: ncclCommSplit(parent, color = local rank, key = node), so that rank r
 * talks to the same local rank of every other node; and the rail stream.  Collective over
 * parent. */
tide_result_t tide_nccl_rails_split(tide_nccl_world_t *w, ncclComm_t parent);
void tide_nccl_rails_destroy(tide_nccl_world_t *w);

/* The rail schedule of prog for this rank; TIDE_ERR_UNSUPPORTED when a credit has no flag
 * slot in the schedule (its receive could not wait for it). */
tide_result_t tide_nccl_rails_prepare(tide_nccl_world_t *w, const tide_program_t *prog,
                                      const tide_cuda_schedule_t *sched,
                                      tide_nccl_rails_prog_t *out);
void tide_nccl_rails_release(tide_nccl_rails_prog_t *rp);

/* Step `step` of the call, enqueued when the put queue's stream `queue` reaches the step's
 * first put: the rail stream waits for the queue and for the receives' credits, runs one
 * ncclGroupStart / ncclSend... / ncclRecv... / ncclGroupEnd, writes e + 1 into the flag of
 * every received put, and the queue waits for all of it. */
tide_result_t tide_nccl_rails_issue(tide_nccl_world_t *w, tide_nccl_rails_prog_t *rp,
                                    const tide_nccl_rails_call_t *call, int step,
                                    cudaStream_t queue);

#endif /* TIDE_FABRIC_NCCL_RAILS_H_ */
