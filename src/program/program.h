/*
 * program.h - TIDE's program IR: a plan compiled into per-rank, per-queue op lists.
 *
 * A program is data (like an MSCCLang program): fabrics interpret it, the static checker
 * proves the paper's invariants on it, fault injection mutates it.  It is compiled once per
 * group, collective and mode; a call binds symbolic buffers to pointers and an epoch, so a
 * call costs O(ops) host work and no allocation.
 *
 * Queues (paper §3.2, §5.2, App. E).  Ops of one queue run in order; queues of a rank run
 * concurrently and synchronise only through counters:
 *   READY  - AG readiness: wait until the landing is free, publish local readiness
 *   CALLER - AG: credits, readiness waits, the R rail rounds (the caller's stream)
 *   CE     - copy-engine work: AG scatters into landings, RS Level-1 pushes into staging
 *   DONE   - AG completion: join scatters, node-wide completion fence, call-complete event
 *   READ   - RS read phase: Level-1 sums into outbox bank b = e mod 2 and the own spare
 *   NET    - RS network phase: rounds, puts, arrivals, landings, credits
 *
 * Signals.  Every rank's arena has TIDE_ARENA_SIGNAL_SLOTS 64-bit counters.  Counters only
 * grow (cumulative across calls), so one program serves every call: a SIGNAL adds 1 to
 * counter `ctr` of rank `rank`; a WAIT on the issuing rank's own counter `ctr` completes when
 *     value >= epoch * inc + thr        (epoch e = 0, 1, ... counts calls of this program)
 * where inc is the number of SIGNALs that reach the counter per call and thr <= inc is fixed
 * at compile time (thr <= 0 in epoch 0 means "no wait": the first call starts from a fresh
 * arena).  A COPY/COPY2D may carry a fused signal (put-with-signal): the signal is raised
 * only after the bytes are visible at the destination.
 */
#ifndef TIDE_PROGRAM_PROGRAM_H_
#define TIDE_PROGRAM_PROGRAM_H_

#include "kernels/kernels.h"
#include "plan/plan.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    TIDE_Q_READY = 0,
    TIDE_Q_CALLER = 1,
    TIDE_Q_CE = 2,
    TIDE_Q_DONE = 3,
    TIDE_Q_READ = 4,
    TIDE_Q_NET = 5,
    TIDE_Q_COUNT = 6
} tide_queue_t;

typedef enum {
    TIDE_OP_COPY = 0,   /* dst <- src, bytes (flat); optional fused signal */
    TIDE_OP_COPY2D = 1, /* rows x bytes, src/dst pitches; optional fused signal */
    TIDE_OP_SIGNAL = 2, /* counter[rank][ctr] += 1 */
    TIDE_OP_WAIT = 3,   /* own counter[ctr] >= epoch * inc + thr */
    TIDE_OP_SUM = 4,    /* Level-1 sum (kernels.h) of segment table `table` */
    TIDE_OP_LAND = 5,   /* landing (kernels.h) of segment table `table` */
    TIDE_OP_ZERO = 6,   /* dst <- 0, bytes */
    TIDE_OP_CAST = 7,   /* fp32 src -> bf16 dst, bytes = bf16 bytes written */
    TIDE_OP_EVENT = 8,  /* record call event `event` (read-complete, call-complete) */
    TIDE_OP_KIND_COUNT = 9
} tide_op_kind_t;

/* What a symbolic buffer reference points into. */
typedef enum {
    TIDE_REF_NONE = 0,
    TIDE_REF_ARENA = 1,   /* arena of rank `rank`, region `region`, byte `offset` */
    TIDE_REF_LANDING = 2, /* the call's landing slot (LANDING0/1 bound per call) of `rank` */
    TIDE_REF_SHARD = 3,   /* call operand: this rank's packed shard (S bytes, or fp32 master) */
    TIDE_REF_GRAD = 4,    /* call operand: this rank's gradient of parameter `param` */
    TIDE_REF_OUT = 5,     /* call operand: this rank's fp32 output shard (S_fp32 bytes) */
    TIDE_REF_KIND_COUNT = 6
} tide_ref_kind_t;

typedef struct {
    uint8_t kind;   /* tide_ref_kind_t */
    uint8_t region; /* tide_region_t for TIDE_REF_ARENA */
    int16_t param;  /* parameter for TIDE_REF_GRAD */
    int32_t rank;   /* owner rank for ARENA/LANDING (call operands are always local) */
    uint64_t offset;
} tide_ref_t;

typedef enum {
    TIDE_EVENT_READ_DONE = 0, /* sources (gradients, slot copies) may be released (I2) */
    TIDE_EVENT_CALL_DONE = 1, /* outputs are complete and may be consumed */
    TIDE_EVENT_COUNT = 2
} tide_event_t;

/* One operation.  Fields not used by a kind are zero. */
typedef struct {
    uint8_t kind;  /* tide_op_kind_t */
    uint8_t event; /* TIDE_OP_EVENT */
    uint8_t init;  /* TIDE_OP_LAND: first landing of these elements in the call */
    uint8_t bank_dep; /* 1: offsets in dst/src with region OUTBOX/SPARE/STAGING are for bank 0
                         and the fabric adds bank (epoch mod 2) x bank_bytes at bind time */
    int32_t table; /* TIDE_OP_SUM / TIDE_OP_LAND: index into the program's segment tables */
    tide_ref_t dst;
    tide_ref_t src;
    uint64_t bytes;     /* COPY/ZERO/CAST: bytes; COPY2D: bytes per row */
    uint64_t rows;      /* COPY2D */
    uint64_t src_pitch; /* COPY2D */
    uint64_t dst_pitch; /* COPY2D */
    /* SIGNAL, WAIT, fused signal of COPY/COPY2D (sig_rank < 0: none) */
    int32_t sig_rank;
    int32_t ctr;
    int64_t inc; /* WAIT */
    int64_t thr; /* WAIT */
} tide_op_t;

/* Segment table of a SUM (segs of tide_sum_seg_t) or LAND (tide_land_seg_t) op.  Buffers:
 * SUM reads `staged` (num_staged contributions, stride elements apart) and the GRAD operands,
 * writes `out`; LAND reads `in[0..num_in)` and writes the OUT operand. */
typedef struct {
    int kind; /* TIDE_OP_SUM or TIDE_OP_LAND */
    int num_segs;
    tide_sum_seg_t *sum_segs;
    tide_land_seg_t *land_segs;
    tide_ref_t staged;      /* SUM */
    uint64_t stage_stride;  /* SUM, elements */
    int num_staged;         /* SUM */
    tide_ref_t out;         /* SUM: outbox block or spare */
    tide_ref_t in[TIDE_MAX_GPUS_PER_NODE]; /* LAND: inbox blocks of the L local ranks */
    int num_in;             /* LAND */
    uint8_t plus_zero;      /* LAND: v + 0.0f (tide_land_args_t.plus_zero) */
    uint8_t in_bf16;        /* LAND: the inputs are bf16 (tide_land_args_t.in_bf16; rail lane) */
} tide_table_t;

typedef struct {
    int num_ops;
    int cap_ops;
    tide_op_t *ops;
} tide_queue_ops_t;

typedef struct {
    int rank;
    tide_queue_ops_t queues[TIDE_Q_COUNT];
    int num_tables;
    int cap_tables;
    tide_table_t *tables;
} tide_rank_program_t;

typedef enum { TIDE_COLL_ALL_GATHER = 0, TIDE_COLL_REDUCE_SCATTER = 1 } tide_collective_t;

typedef struct {
    tide_collective_t coll;
    tide_rs_mode_t mode;
    /* 0: an AG / RS program; 1: the cross-group fence, 2: the fence that zeroes the inbox
     * first (fence.c).  Fabrics that keep call state per program family tell them apart. */
    int fence;
    const struct tide_plan *plan; /* borrowed */
    int num_ranks;
    tide_rank_program_t *ranks;   /* N entries */
    uint64_t bank_bytes[TIDE_REGION_COUNT]; /* per-region bank stride for bank_dep ops */
} tide_program_t;

/* Compile the all-gather / reduce-scatter program of a plan (all ranks). */
tide_result_t tide_program_compile_ag(const struct tide_plan *plan, tide_program_t *prog_out);
tide_result_t tide_program_compile_rs(const struct tide_plan *plan, tide_rs_mode_t mode,
                                      tide_program_t *prog_out);
void tide_program_free(tide_program_t *prog);

/* The cross-group fence of a group on a shared arena (fence.c, docs/protocol.md): every rank
 * (zero_inbox: zeroes its inbox extent, then) signals TIDE_CTR_FENCE on every rank, then
 * waits for N signals; epoch = fences run before. */
tide_result_t tide_program_compile_fence(const struct tide_plan *plan, bool zero_inbox,
                                         tide_program_t *prog_out);

/* What both compilers require of a plan: a consistent topology and geometry, and counters
 * that fit the arena's signal slots (TIDE_ERR_UNSUPPORTED otherwise). */
tide_result_t tide_program_check_plan(const struct tide_plan *plan);

/* Deep copy (fault injection mutates copies). */
tide_result_t tide_program_clone(const tide_program_t *src, tide_program_t *dst_out);

/* Builders used by the compilers (append; grow arrays as needed). */
tide_result_t tide_program_init(const struct tide_plan *plan, tide_collective_t coll,
                                tide_rs_mode_t mode, tide_program_t *prog_out);
tide_result_t tide_program_push(tide_program_t *prog, int rank, tide_queue_t q,
                                const tide_op_t *op);
tide_result_t tide_program_add_table(tide_program_t *prog, int rank, const tide_table_t *table,
                                     int *index_out);

/* Human-readable listing of one rank's program (tide-plan program ... --rank r). */
tide_result_t tide_program_print(const tide_program_t *prog, int rank, void *file /* FILE* */);

static inline const char *tide_queue_name(tide_queue_t q) {
    static const char *const names[TIDE_Q_COUNT] = {"ready", "caller", "ce", "done", "read", "net"};
    return (unsigned)q < TIDE_Q_COUNT ? names[q] : "?";
}

/* Static name of an op kind ("copy", "wait", ...), or "?". */
static inline const char *tide_op_kind_name(int kind) {
    static const char *const names[TIDE_OP_KIND_COUNT] = {
        [TIDE_OP_COPY] = "copy", [TIDE_OP_COPY2D] = "copy2d", [TIDE_OP_SIGNAL] = "signal",
        [TIDE_OP_WAIT] = "wait", [TIDE_OP_SUM] = "sum",       [TIDE_OP_LAND] = "land",
        [TIDE_OP_ZERO] = "zero", [TIDE_OP_CAST] = "cast",     [TIDE_OP_EVENT] = "event",
    };
    return kind >= 0 && kind < TIDE_OP_KIND_COUNT ? names[kind] : "?";
}

/* Op constructors shared by the compilers: every field zero, no fused signal. */
static inline tide_op_t tide_op_new(tide_op_kind_t kind) {
    tide_op_t op = {0};
    op.kind = (uint8_t)kind;
    op.sig_rank = -1;
    return op;
}
static inline tide_op_t tide_op_signal(int rank, int ctr) {
    tide_op_t op = tide_op_new(TIDE_OP_SIGNAL);
    op.sig_rank = rank;
    op.ctr = ctr;
    return op;
}
/* A flat copy; with sig_rank >= 0 it signals counter `ctr` of that rank when it completes
 * (a fused signal), else it signals nothing. */
static inline tide_op_t tide_op_copy(tide_ref_t dst, tide_ref_t src, uint64_t bytes, int sig_rank,
                                     int ctr) {
    tide_op_t op = tide_op_new(TIDE_OP_COPY);
    op.dst = dst;
    op.src = src;
    op.bytes = bytes;
    op.sig_rank = sig_rank;
    op.ctr = sig_rank >= 0 ? ctr : 0;
    return op;
}
/* The counter's owner is the waiting rank itself; sig_rank records it for listings. */
static inline tide_op_t tide_op_wait(int rank, int ctr, int64_t inc, int64_t thr) {
    tide_op_t op = tide_op_new(TIDE_OP_WAIT);
    op.sig_rank = rank;
    op.ctr = ctr;
    op.inc = inc;
    op.thr = thr;
    return op;
}

/* Reference constructors. */
static inline tide_ref_t tide_ref_arena(int rank, tide_region_t region, uint64_t offset) {
    tide_ref_t r = {TIDE_REF_ARENA, (uint8_t)region, 0, rank, offset};
    return r;
}
static inline tide_ref_t tide_ref_landing(int rank, uint64_t offset) {
    tide_ref_t r = {TIDE_REF_LANDING, 0, 0, rank, offset};
    return r;
}
static inline tide_ref_t tide_ref_operand(tide_ref_kind_t kind, int param, uint64_t offset) {
    tide_ref_t r = {(uint8_t)kind, 0, (int16_t)param, -1, offset};
    return r;
}

#endif /* TIDE_PROGRAM_PROGRAM_H_ */
