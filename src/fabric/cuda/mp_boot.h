/*
 * mp_boot.h - the bootstrap of the one-process-per-rank CUDA fabric (docs/cuda-fabric.md,
 * "One process per rank"): plain POSIX, no CUDA, so the CPU build tests it.
 *
 * The store.  Every rank of job `name` listens on the abstract-namespace Unix socket
 * "\0tide.<name>.<rank>" (Linux; nothing on the file system, gone when the process is) and
 * connects to every lower rank's, retrying until TIDE_TIMEOUT_MS: a full mesh of N (N - 1) / 2
 * stream connections, opened once per world.  Abstract sockets are per network namespace, so
 * all ranks must run on one host (one node of a torchrun job: pass its TORCHELASTIC_RUN_ID or
 * any job-unique string as `name`, LOCAL_RANK / LOCAL_WORLD_SIZE as rank and size).  A second
 * job with the same name on the host fails to bind: TIDE_ERR_FABRIC naming the socket.
 *
 * Messages carry a small blob and at most one file descriptor (SCM_RIGHTS): that is how the
 * CUDA VMM handles (cuMemExportToShareableHandle, POSIX fd) travel.  The connections double
 * as liveness: the kernel closes a dead process's sockets, so a peer that died reads as EOF
 * (tide_mp_boot_dead_peer), and the watchdog names it at once instead of at the deadline.
 */
#ifndef TIDE_FABRIC_CUDA_MP_BOOT_H_
#define TIDE_FABRIC_CUDA_MP_BOOT_H_

#include "tide.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest blob one rank contributes to one exchange. */
#define TIDE_MP_BOOT_MAX_BLOB 1024

typedef struct {
    int rank, ranks;
    int listen_fd;
    int *peer_fd; /* [ranks]: connection to each peer; -1 for this rank and closed peers */
    uint32_t seq; /* exchanges made: every message names its exchange */
    char name[96];
} tide_mp_boot_t;

/* Join job `name` as rank `rank` of `ranks`: returns when every rank is connected
 * (TIDE_ERR_TIMEOUT naming the ranks still missing after timeout_ms). */
tide_result_t tide_mp_boot_open(const char *name, int rank, int ranks, int64_t timeout_ms,
                                tide_mp_boot_t *out);
void tide_mp_boot_close(tide_mp_boot_t *b);

/* All-gather: every rank contributes `bytes` (<= TIDE_MP_BOOT_MAX_BLOB, the same on every
 * rank) and optionally a descriptor (fd < 0: none).  blobs_out[r * bytes] receives rank r's
 * blob (this rank's own too); fds_out (may be NULL when no rank sends one) receives the
 * descriptors peers sent, as new descriptors of this process the caller closes, and -1 for
 * this rank and for peers that sent none.  A peer that dies or misses the deadline gives
 * TIDE_ERR_TIMEOUT naming it; descriptors received so far are closed then. */
tide_result_t tide_mp_boot_allgather(tide_mp_boot_t *b, const void *blob, size_t bytes, int fd,
                                     void *blobs_out, int *fds_out, int64_t timeout_ms);

/* Every rank reached this point (an all-gather of the tag; ranks passing different tags get
 * TIDE_ERR_INVALID_ARGUMENT naming the first that differs). */
tide_result_t tide_mp_boot_barrier(tide_mp_boot_t *b, uint64_t tag, int64_t timeout_ms);

/* Settings a rank brings to world creation that every rank must share (mp_agree.c): opaque
 * here, rank 0's hold. */
#define TIDE_MP_BOOT_CHOICES 4

/* What one rank tells the others at world creation (tide_mp_boot_agree). */
typedef struct {
    uint8_t uuid[16]; /* its device's */
    int32_t mps;      /* its context is an MPS client */
    int32_t status;   /* TIDE_SUCCESS, or the code its part of the world failed with */
    int32_t choice[TIDE_MP_BOOT_CHOICES];
} tide_mp_rank_info_t;

/* What every rank concludes from every rank's tide_mp_rank_info_t (the same on every rank). */
typedef struct {
    int shared;            /* the lowest rank whose device a lower rank also has, or -1 */
    int timeshared;        /* the lowest rank whose device a lower rank also has where the two
                            * are not both MPS clients (they time-slice it), or -1 */
    int failed;            /* the lowest rank whose status is not TIDE_SUCCESS, or -1 */
    int32_t failed_status; /* that rank's status */
    int32_t choice0[TIDE_MP_BOOT_CHOICES]; /* rank 0's choices */
} tide_mp_world_info_t;

/* One all-gather of every rank's `mine`; *out as above. */
tide_result_t tide_mp_boot_agree(tide_mp_boot_t *b, const tide_mp_rank_info_t *mine,
                                 int64_t timeout_ms, tide_mp_world_info_t *out);

/* A peer whose connection reads EOF or failed without a goodbye (its process died), or -1.
 * A peer that closed its world (goodbye waiting) is not reported.  Never blocks. */
int tide_mp_boot_dead_peer(tide_mp_boot_t *b);

#endif /* TIDE_FABRIC_CUDA_MP_BOOT_H_ */
