/*
 * direct.h - direct mode as program analysis: which copies of a compiled program a fabric may
 * leave out when the ranks it runs share one memory, and where the ops that read their
 * destinations read instead (docs/cuda-fabric.md and docs/cpu-fabric.md, "Direct mode").
 *
 * The emulation of a node on one memory (the CUDA fabric on one device, the CPU fabric's
 * threads) pays for copies that exist only to move bytes between memories: the Level-1 pushes
 * into STAGING, the inbox copies of the reduce-scatter, the all-gather's rail puts into a
 * receive stage.  This analysis looks only at the program and its op numbering (the
 * schedule's, program/schedule.h), needs no device, and is shared by every fabric that takes
 * the shortcuts; a fabric keeps what binds the result to a call (tables, uploads) and the
 * joins that make the cross-rank reads safe (see each fabric).
 *
 * Every signal, wait and record stays: an elided copy still fires its fused signal where it
 * would have run, after the waits before it.  The arithmetic and its association order do
 * not change, so outputs are bit-identical with and without direct mode.
 *
 * The rules (direct.c for the reduce-scatter, direct_ag.c for the all-gather):
 *   SUM (1)    every copy into STAGING is elided; a SUM reads the other local ranks'
 *              gradients in place (tide_sum_args_t.peers: contribution k of the rank with
 *              local index j is local rank k < j ? k : k + 1, then the own one).
 *   ZERO (2)   a landing input that no copy of the program writes holds +0.0f (the arena is
 *              zeroed at registration, stale blocks by ZERO ops): it is added, not read.
 *   ALIAS (4)  an inbox copy whose source stays valid until every landing read it is elided
 *              and the landings read its source (tide_land_args_t.in_table).
 *   FUSE (8)   a SUM whose every segment is read by exactly one landing, as that landing's
 *              one live input, and which is its rank's only landing of those outputs (M = 1),
 *              stores the landings' values itself (tide_sum_args_t.fused); the LAND issues
 *              nothing (its waits stay).
 *   AG (16)    an all-gather rail put of the sender's own shard into a receive stage that
 *              only flat copies read (inside it) is elided when sender and target share a
 *              memory; those copies read the sender's shard at the same offset.
 */
#ifndef TIDE_PROGRAM_DIRECT_H_
#define TIDE_PROGRAM_DIRECT_H_

#include "program/schedule.h"

#include <stdbool.h>
#include <stdint.h>

enum {
    TIDE_DIRECT_SUM = 1,
    TIDE_DIRECT_ZERO = 2,
    TIDE_DIRECT_ALIAS = 4,
    TIDE_DIRECT_FUSE = 8,
    TIDE_DIRECT_AG = 16,
    TIDE_DIRECT_ALL = 31
};

/* Where a landing reads input k of segment s in direct mode. */
enum { TIDE_DIRECT_LAND_READ = 0, TIDE_DIRECT_LAND_ZERO = 1, TIDE_DIRECT_LAND_ALIAS = 2 };
typedef struct {
    int32_t kind;   /* READ: its inbox; ZERO: +0.0f, not read; ALIAS: the source of `copy` */
    int32_t copy;   /* ALIAS: op id of the elided inbox copy */
    uint64_t delta; /* ALIAS: bytes from the copy's destination start */
} tide_direct_land_src_t;

/* A fused sum: segment q of the SUM is stored by landing segment `seg` of LAND op `land`
 * (land < 0: an empty segment, nothing stored). */
typedef struct {
    int32_t land, seg;
} tide_direct_fuse_seg_t;

/* An all-gather copy that reads the source of the elided put `put`, `delta` bytes on
 * (put < 0: its own source). */
typedef struct {
    int32_t put;
    uint64_t delta;
} tide_direct_ag_src_t;

/* The analysis of one program.  Arrays are indexed by the schedule's op ids. */
typedef struct {
    int num_ops;
    int num_ranks;
    int mask;                          /* the bits asked for */
    bool rs;                           /* some reduce-scatter shortcut applies */
    bool sum;                          /* SUMs read the peers' gradients in place */
    int l;                             /* ranks per node */
    uint8_t *elide;                    /* [num_ops]: copies not issued (NULL: none) */
    tide_direct_land_src_t **land_src; /* [num_ops]: LAND ops, num_segs x num_in (or NULL) */
    tide_direct_fuse_seg_t **fuse;     /* [num_ops]: fused SUM ops, a row per segment */
    int *fuse_segs;                    /* [num_ops]: segments of each fused SUM's row */
    uint8_t *fused_land;               /* [num_ops]: LAND ops a fused sum stores */
    bool ag;                           /* some all-gather put is elided */
    tide_direct_ag_src_t *ag_src;      /* [num_ops] */
    uint8_t *ag_wait;                  /* [N x N]: rank r's shard is read by rank j's call */
} tide_direct_t;

/* Analyse `prog` (numbered by `sched`: op_base, num_threads and num_ops are used) for the
 * shortcuts in `mask`.  `domain` (N entries, or NULL: all one) says which ranks share a
 * memory: the reduce-scatter's shortcuts apply only when every node's ranks share one, an
 * all-gather put only between two ranks of one domain.  A fence program, or one with nothing
 * to elide, gives an empty analysis (rs and ag false).  *out is set only on success and
 * released with tide_direct_free. */
tide_result_t tide_direct_analyse(const tide_program_t *prog, const tide_schedule_t *sched,
                                  int mask, const int *domain, tide_direct_t *out);
void tide_direct_free(tide_direct_t *d);

/* The two halves (direct.c, direct_ag.c), for tide_direct_analyse. */
tide_result_t tide_direct_analyse_rs(const tide_program_t *prog, const tide_schedule_t *s,
                                     tide_direct_t *d);
tide_result_t tide_direct_analyse_ag(const tide_program_t *prog, const tide_schedule_t *s,
                                     const int *domain, tide_direct_t *d);

/* The thread (rank * TIDE_Q_COUNT + queue) of op `id`. */
int tide_direct_thread_of(const tide_schedule_t *s, int id);

#endif /* TIDE_PROGRAM_DIRECT_H_ */
