/*
 * mp_ctl.h - the control block of a group on the one-process-per-rank CUDA fabric: host
 * memory shared by the group's processes (docs/cuda-fabric.md, "Fail-stop").  Plain POSIX, no
 * CUDA, so the CPU build tests it (tests/unit/test_cuda_mp_boot.c).
 *
 * Why host memory.  A hung rank (SIGSTOP, or a process that never calls) keeps its sockets
 * open, so only a deadline finds it; the rank that reaches the deadline must then (1) name
 * the rank that is missing and (2) make every other rank fail too.  Device flags cannot do
 * either soundly: reading them from the host goes through a stream, and the fail-stop itself
 * overwrites them (the poison that releases every device wait so streams drain), after which
 * a survivor whose waits were released sees a completed call with wrong data.  A page every
 * process maps, written and read with atomics by the host, has neither problem.
 *
 *   entered[f][r]   1 + the last call of collective family f (0: all-gather, 1: reduce-
 *                   scatter) that rank r entered (set at the top of the call, before any wait)
 *   enqueued[f][r]  1 + the last call that rank r finished enqueueing
 *   began[f][r]     1 + the last call of family f whose device work rank r's stream reached
 *                   (written by the device, before the call's first device wait; only in a
 *                   block the device maps, with flags or a polled abort word: mp_flags.c)
 *   abort word      0, or 1 + the rank that failed the group first; its message beside it.
 *   checks[f][k][r] rank r's arguments of its argument check number `seq` of family f, k =
 *                   seq mod 2: 1 + seq and the signature (fabric.h, call_check).  Two slots
 *                   suffice: a rank posts check seq + 2 only after every rank posted seq + 1,
 *                   which each did after reading everything of check seq.
 *
 * The abort word is published (release) before the publishing rank poisons any device flag,
 * so a rank that observes one of its calls complete and then reads the word (acquire) sees
 * the abort whenever a poisoned flag could have let that call complete: the only way a call
 * that depends on a missing rank completes is through the poison (mp_execute.c).
 *
 * The block is one memfd (nothing on the file system) created by rank 0 at registration and
 * passed to the peers over the bootstrap sockets (SCM_RIGHTS); each process maps it and closes
 * the descriptor, so the memory is gone when the last process unmaps it or exits.
 *
 * Signal flags.  Opened with flag_bytes > 0, the block also carries every rank's flag area
 * (page aligned, after the counters): the CUDA fabric registers the mapping with the device
 * (mp_flags.c) and its streams signal and wait on these host flags, so that a fail-stop
 * releases every device wait of every process with plain CPU stores (tide_mp_ctl_poison)
 * instead of stream work that could queue behind a blocked queue.  Rank 0's flag_bytes
 * decides; the other ranks map what it created.
 *
 * Polled abort word.  Opened with abort_polled (TIDE_CUDA_MP_FLAGS=kernel), the block holds
 * no flags (they stay in device memory) but says so to every rank: each registers it with its
 * device like a block with flags, its device writes the began counters, and its wait kernels
 * read the abort word, so that the word's CPU store releases them (mp_flags.c).  Rank 0's
 * choice again decides for the group.
 */
#ifndef TIDE_FABRIC_CUDA_MP_CTL_H_
#define TIDE_FABRIC_CUDA_MP_CTL_H_

#include "fabric/cuda/mp_boot.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TIDE_MP_CTL_MSG 384

typedef struct {
    uint32_t magic;
    int32_t ranks;
    _Atomic uint32_t abort; /* 0; TIDE_MP_CTL_CLAIMED while the message is written; 1 + rank */
    uint32_t flag_bytes;    /* each rank's flag area in this block; 0: flags live elsewhere */
    uint32_t abort_polled;  /* 1: the group's device waits poll the abort word (see the top) */
    uint32_t reserved;      /* 0; keeps the counters after the header 8-byte aligned */
    char msg[TIDE_MP_CTL_MSG];
    /* then _Atomic uint64_t entered[2][ranks], enqueued[2][ranks], check_seq[2][2][ranks],
     * check_sig[2][2][ranks], began[2][ranks] */
} tide_mp_ctl_hdr_t;

#define TIDE_MP_CTL_CLAIMED UINT32_MAX

typedef struct {
    tide_mp_ctl_hdr_t *hdr; /* NULL: not open */
    _Atomic uint64_t *entered, *enqueued, *check_seq, *check_sig, *began;
    uint8_t *flags;    /* rank 0's flag area, then rank 1's, ...; NULL: none in the block */
    size_t flag_bytes; /* bytes of each rank's flag area */
    bool abort_polled; /* rank 0 opened it with abort_polled */
    size_t bytes;
    int rank, ranks;
} tide_mp_ctl_t;

/* Collective over the bootstrap: rank 0 creates the block, every rank maps it.  A rank that
 * fails still takes part, so that the others fail too instead of waiting. */
tide_result_t tide_mp_ctl_open(tide_mp_boot_t *boot, int64_t timeout_ms, tide_mp_ctl_t *out);
/* The same with a flag area of flag_bytes (a multiple of 8; 0: none) per rank in the block.
 * Only rank 0's flag_bytes counts: the others map the block rank 0 made, whatever they
 * passed (so that every rank signals through the same memory). */
tide_result_t tide_mp_ctl_open_flags(tide_mp_boot_t *boot, int64_t timeout_ms, size_t flag_bytes,
                                     tide_mp_ctl_t *out);
/* The same, and with abort_polled (rank 0's counts, as its flag_bytes does) a block the
 * device maps without flags: whole pages, abort_polled set in every rank's view of it. */
tide_result_t tide_mp_ctl_open_mapped(tide_mp_boot_t *boot, int64_t timeout_ms, size_t flag_bytes,
                                      bool abort_polled, tide_mp_ctl_t *out);

/* Whether the group's devices map the block (it has flags, or its abort word is polled):
 * then the began counters are written. */
bool tide_mp_ctl_device_mapped(const tide_mp_ctl_t *c);
void tide_mp_ctl_close(tide_mp_ctl_t *c);

/* Rank r's flag area in the block, or NULL when the block has none. */
uint8_t *tide_mp_ctl_flags(const tide_mp_ctl_t *c, int r);

/* Store `value` into every 8-byte flag of every rank's area (CPU stores, visible to every
 * process and device that maps the block; nothing when it has none). */
void tide_mp_ctl_poison(tide_mp_ctl_t *c, uint64_t value);

/* A block that was never opened (hdr NULL: the NCCL fabric's arenas, which have no socket
 * bootstrap to pass the memfd) is "no control block": enter and enqueued do nothing, abort
 * returns true, aborted returns -1, missing names no rank.  Every one of them used to write
 * or read through the NULL counters, which crashed the first call on such an arena. */

/* This rank entered / finished enqueueing call `call` of family f. */
void tide_mp_ctl_enter(tide_mp_ctl_t *c, int f, uint64_t call);
void tide_mp_ctl_enqueued(tide_mp_ctl_t *c, int f, uint64_t call);
/* The host's form of the device's began store (tests): this rank's stream reached call `call`
 * of family f. */
void tide_mp_ctl_began(tide_mp_ctl_t *c, int f, uint64_t call);

/* Fail the group: the first caller's message wins (true: this call published it).  The word
 * is visible to every process before this returns. */
bool tide_mp_ctl_abort(tide_mp_ctl_t *c, const char *msg);

/* The rank that failed the group, or -1; its message into msg (may be NULL). */
int tide_mp_ctl_aborted(tide_mp_ctl_t *c, char *msg, size_t len);

/* Argument checks across ranks (fabric.h, call_check).  post: this rank's signature `sig` of
 * its check number `seq` of family f.  compare: 1 when every rank posted check `seq`, with
 * *other_out the lowest rank whose signature differs from `sig` (its signature in
 * *other_sig_out) or -1; 0 while some rank has not posted it, with *other_out the lowest such
 * rank.  A rank that posted a later check already gave up on this one (its deadline passed):
 * it counts as posted and is not compared.  No control block: 1, nobody differs. */
void tide_mp_ctl_post(tide_mp_ctl_t *c, int f, uint64_t seq, uint64_t sig);
int tide_mp_ctl_compare(tide_mp_ctl_t *c, int f, uint64_t seq, uint64_t sig, int *other_out,
                        uint64_t *other_sig_out);

/* Why call `call` of family f is not complete, as far as the host can tell: the ranks that
 * have not entered it (kind 1), else those that entered but did not finish enqueueing it
 * (kind 2), else, in a block with flags, those whose device never began it (kind 3: work
 * queued before it on the caller's stream has not finished), else none (kind 0: every rank
 * enqueued it; the device has not completed it).
 * Writes a phrase naming them into out; returns the lowest such rank or -1. */
int tide_mp_ctl_missing(tide_mp_ctl_t *c, int f, uint64_t call, char *out, size_t len);

#endif /* TIDE_FABRIC_CUDA_MP_CTL_H_ */
