/*
 * fabric_nccl.h - the NCCL fabric (docs/nccl-fabric.md): one process per rank over NCCL
 * 2.28 communicators and symmetric windows.
 *
 * What it adds is transport only.  The program, its binding, the schedule and its command
 * lists, the replay of one rank's commands with flags in device memory, the fences and the
 * fail-stop watchdog are the one-process-per-rank CUDA fabric's (fabric/cuda/mp.h,
 * mp_execute.c): the world and arena below embed that fabric's objects as their first
 * members and its execute runs the calls.  What differs:
 *
 *   communicators  a world communicator (ncclCommInitRankConfig from an ncclUniqueId, or the
 *                  caller's ncclComm_t, e.g. ProcessGroupNCCL's, never used by TIDE directly)
 *                  and a node communicator split from it (ncclCommSplit, color = node, config
 *                  CTAPolicy = NCCL_CTA_POLICY_ZERO) that carries the window (and on one node
 *                  the exchanges)
 *   memory         each rank's arena + flag area in one ncclMemAlloc allocation registered as
 *                  a symmetric-memory window (ncclCommWindowRegister, NCCL_WIN_DEFAULT: see
 *                  arena.c for why not NCCL_WIN_COLL_SYMMETRIC); the peers' bases are the
 *                  window's LSA pointers (ncclGetLsaPointer, evaluated by a one-thread-per-peer
 *                  kernel, lsa.cu), checked at registration by reading a per-rank marker
 *                  through them
 *   bootstrap      small all-gathers over all N ranks (group signature, status, barriers) on
 *                  the node communicator (M = 1) or the exchange communicator (M > 1), waited
 *                  on the host with TIDE_TIMEOUT_MS; a timeout aborts that communicator
 *                  (ncclCommAbort) and fails with TIDE_ERR_TIMEOUT
 *   transfers      same-node copies are cudaMemcpyAsync into peer pointers (copy engines),
 *                  signals and waits cuStreamWriteValue64 / cuStreamWaitValue64 on the flags,
 *                  as in mp_execute.c
 *   rails          M > 1, opt-in (TIDE_NCCL_RAILS=1, experimental, never run): the cross-node
 *                  puts are rail steps (program/rails.h) issued by the execute (mp_rails.c)
 *                  over a transport of rails.h on a rail communicator (color = local rank);
 *                  the arena maps only this node's ranks (bases and flags of other nodes are
 *                  NULL) and exchanges run on an all-rank communicator of TIDE's own
 *
 * Batched copies (cudaMemcpyBatchAsync) are not used: every copy to or from a peer is one
 * cudaMemcpyAsync, as in the CUDA mp fabric.
 */
#ifndef TIDE_FABRIC_NCCL_FABRIC_NCCL_H_
#define TIDE_FABRIC_NCCL_FABRIC_NCCL_H_

#include "fabric/cuda/mp.h"
#include "fabric/nccl/entry.h"
#include "fabric/nccl/lib.h"

#include <stdbool.h>

_Static_assert(TIDE_NCCL_UNIQUE_ID_BYTES == sizeof(ncclUniqueId),
               "tide.h's TIDE_NCCL_UNIQUE_ID_BYTES is sizeof(ncclUniqueId)");

typedef struct {
    tide_mp_world_t mp; /* first: its base is the fabric world */
    const tide_nccl_lib_t *lib;
    ncclComm_t world_comm; /* created from the unique id (owned), or NULL: the caller's */
    /* M > 1: all N ranks, split from the world (or the caller's) communicator (owned): every
     * exchange and verdict, so that a failure on any node reaches every rank.  M = 1: NULL,
     * the exchanges run on node_comm (which then has all N ranks). */
    ncclComm_t xchg_comm;
    ncclComm_t node_comm;  /* the node's L ranks, split by node (owned): the windows */
    ncclComm_t rail_comm;  /* M > 1: same local rank on every node, rail rank = node (owned) */
    ncclComm_t rail_ready_comm; /* M > 1, one-sided rails: the ready signals (owned) */
    bool rails_put;        /* M > 1: the one-sided rails (NCCL >= 2.29), else send/recv */
    bool aborted;          /* an exchange timed out: its communicator was aborted and is gone */
    bool calls_failed;     /* a group failed stop: peers may be gone, so abort, not destroy */
    uint8_t *scratch_dev;  /* exchanges and LSA pointers: TIDE_NCCL_SCRATCH per rank */
    uint8_t *scratch_host; /* pinned, same size */
} tide_nccl_world_t;

typedef struct {
    tide_mp_arena_t mp; /* first: its base is the fabric arena */
    void *mem;          /* ncclMemAlloc: this rank's arena and flags */
    ncclWindow_t win;   /* on node_comm: the LSA pointers of this node's ranks */
    bool registered;
    /* One-sided rails: the same memory registered on rail_comm (NCCL_WIN_COLL_SYMMETRIC, which
     * ncclPutSignal requires of its source), the window the puts name on the receiver. */
    ncclWindow_t rail_win;
    bool rail_registered;
    uint64_t registration; /* this world's registrations up to this one: the same on every rank */
} tide_nccl_arena_t;

/* The exchanges' communicator: all N ranks. */
static inline ncclComm_t tide_nccl_xchg_comm(const tide_nccl_world_t *w) {
    return w->xchg_comm != NULL ? w->xchg_comm : w->node_comm;
}

/* Bytes of scratch per rank: the largest exchange blob, and room for one pointer. */
#define TIDE_NCCL_SCRATCH 64

/* All-gather of `bytes` (<= TIDE_NCCL_SCRATCH) per rank over all N ranks (the exchange
 * communicator), waited on the host with the deadline. */
tide_result_t tide_nccl_allgather(tide_nccl_world_t *w, const void *blob, size_t bytes,
                                  void *all_out);
/* Every rank's `ok`, and'ed: *all_ok_out false when some rank failed (a collective verdict,
 * so that every rank takes the same path through the next collective call). */
tide_result_t tide_nccl_agree(tide_nccl_world_t *w, bool ok, bool *all_ok_out);
/* A local step's result, then every rank's verdict (tide_nccl_agree): the local error,
 * TIDE_ERR_FABRIC naming `step` when another rank failed, or the exchange's own error. */
tide_result_t tide_nccl_agreed(tide_nccl_world_t *w, tide_result_t local, const char *step);

/* The LSA pointer of window `win` at offset 0 for LSA ranks [0, n), into dev_out[0..n) on
 * `stream` (lsa.cu).  LSA rank i of the node communicator is TIDE rank node * L + i. */
cudaError_t tide_nccl_lsa_pointers(ncclWindow_t win, int n, void **dev_out, cudaStream_t stream);

/* fabric.h's call_check over the exchange communicator (calls.c). */
tide_result_t tide_nccl_call_check(struct tide_fabric_arena *arena, tide_collective_t coll,
                                   uint64_t seq, uint64_t sig, int *other_rank_out,
                                   uint64_t *other_sig_out);

/* Arenas (arena.c). */
tide_result_t tide_nccl_arena_create(struct tide_fabric_world *world, uint64_t bytes,
                                     uint64_t signature, struct tide_fabric_arena **arena_out);
tide_result_t tide_nccl_arena_destroy(struct tide_fabric_arena *arena);
/* A set's memory with one flag area per view; the views are the CUDA mp fabric's
 * (tide_cuda_mp_view_create), which run on this fabric's segments unchanged. */
tide_result_t tide_nccl_arena_create_set(struct tide_fabric_world *world, uint64_t bytes,
                                         uint64_t signature, int views,
                                         struct tide_fabric_arena **arena_out);

#endif /* TIDE_FABRIC_NCCL_FABRIC_NCCL_H_ */
