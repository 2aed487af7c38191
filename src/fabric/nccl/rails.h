/*
 * rails.h - the NCCL fabric's rail transports (docs/nccl-fabric.md, "Rails"): how the sends
 * and receives of one rail step (program/rails.h) cross nodes.  The steps themselves (the
 * schedule, the step events, the rail stream's waits for the queue and the credits, the
 * receivers' arrival flags) are the one-process-per-rank execute's (fabric/cuda/mp.h,
 * mp_rails.c); what is here is the transport hook (tide_mp_rails_ops_t) and its communicators.
 *
 * EXPERIMENTAL, NEVER RUN: no machine we have has two GPUs, and NCCL refuses two ranks of one
 * communicator on one GPU, so not one of these calls has executed.  Both transports are
 * compiled with -Werror: the two-sided one against the NCCL 2.28 headers the build uses, the
 * one-sided one only against NCCL 2.29+ headers (guarded by NCCL_VERSION_CODE; the 2.28 build
 * does not contain it).  Worlds with M > 1 are created only with TIDE_NCCL_RAILS=1.
 *
 *   tide_nccl_rails_ops      grouped ncclSend / ncclRecv per step on the rail communicator
 *                            (NCCL >= 2.28)
 *   tide_nccl_rails_put_ops  ncclPutSignal into the receiver's window, ncclWaitSignal on the
 *                            receiver, with a ready signal on a second rail communicator so that
 *                            no put lands before its receiver reached the step (NCCL >= 2.29
 *                            headers at build time and the symbols in the loaded library)
 */
#ifndef TIDE_FABRIC_NCCL_RAILS_H_
#define TIDE_FABRIC_NCCL_RAILS_H_

#include "fabric/nccl/fabric_nccl.h"

/* Rail communicator: ncclCommSplit(parent, color = local rank, key = node), so that rank r
 * talks to the same local rank of every other node (rail rank = node index), and the rail
 * stream (w->mp.rail_stream).  With w->rails_put also the ready-signal communicator (the same
 * split again).  Collective over parent: every rank calls it, a rank whose earlier steps failed
 * with `pre` != TIDE_SUCCESS too (it passes NCCL_SPLIT_NOCOLOR and returns pre), so that the
 * others' splits complete and their rank-count checks fail instead of waiting. */
tide_result_t tide_nccl_rails_split(tide_nccl_world_t *w, ncclComm_t parent, tide_result_t pre);
/* Communicators (aborted after a fail-stop or a timeout, else destroyed) and the stream. */
void tide_nccl_rails_destroy(tide_nccl_world_t *w);

/* The two-sided transport: one ncclGroupStart / ncclSend per send / ncclRecv per receive /
 * ncclGroupEnd per step on the rail stream; peers are rail ranks (TIDE rank / L). */
extern const tide_mp_rails_ops_t tide_nccl_rails_ops;

#if TIDE_NCCL_HAVE_RMA
/* The one-sided transport (NCCL >= 2.29, rails_put.c).  Needs the arena registered on the
 * rail communicator too (tide_nccl_arena_t.rail_win). */
extern const tide_mp_rails_ops_t tide_nccl_rails_put_ops;
#endif

#endif /* TIDE_FABRIC_NCCL_RAILS_H_ */
