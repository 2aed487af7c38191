/*
 * counters.h - where the programs' counters live in the arena's SIGNALS region.
 *
 * Counters only grow (cumulative across calls, see program.h), so AG and RS need disjoint
 * indices: AG owns [0, 64), RS starts at 64.  Per-round, per-generation and per-rank families
 * are a base plus an index; RS_CREDIT comes last because its family grows with M, so every
 * other index is a constant and the total a plan needs is TIDE_CTR_RS_CREDIT + M.
 */
#ifndef TIDE_PROGRAM_COUNTERS_H_
#define TIDE_PROGRAM_COUNTERS_H_

#include "plan/plan.h"
#include "program/program.h"

#include <stdint.h>

/* Bruck rounds R = ceil(log2 M) <= log2(TIDE_MAX_NODES) = 16 fit in the AG families. */
#define TIDE_CTR_AG_MAX_ROUNDS 28
/* RS inbox generations n_par (1 or 2 today); the families keep room for more. */
#define TIDE_CTR_RS_MAX_GENERATIONS 4
/* Local ranks whose staging credits a rank tracks (one per owner j). */
#define TIDE_CTR_RS_STG_RANKS TIDE_MAX_GPUS_PER_NODE

enum {
    /* ---- TIDE-AG: [0, 64) */
    TIDE_CTR_AG_READY = 0,       /* local ranks whose landing slot is free this call */
    TIDE_CTR_AG_LANDED = 1,      /* own-shard copies and scatters completed into my landing */
    TIDE_CTR_AG_CALLER_DONE = 2, /* the caller queue finished its forwards */
    TIDE_CTR_AG_CE_DONE = 3,     /* the CE queue finished its scatters */
    TIDE_CTR_AG_ARRIVED = 4,     /* + d: round-d puts arrived in my receive stage */
    TIDE_CTR_AG_CREDIT = TIDE_CTR_AG_ARRIVED + TIDE_CTR_AG_MAX_ROUNDS, /* + d: stage reusable */
    TIDE_CTR_AG_END = TIDE_CTR_AG_CREDIT + TIDE_CTR_AG_MAX_ROUNDS,     /* <= 64 */
    /* Cross-group fence of a group on a shared arena (fence.c): N signals per fence. */
    TIDE_CTR_FENCE = TIDE_CTR_AG_END,

    /* ---- TIDE-RS: [64, TIDE_CTR_RS_CREDIT + M) */
    TIDE_CTR_RS_BASE = 64,
    TIDE_CTR_RS_STAGED = TIDE_CTR_RS_BASE,         /* Level-1 contributions staged into me */
    TIDE_CTR_RS_PUSHED = TIDE_CTR_RS_BASE + 1,     /* my pushes of the call completed */
    TIDE_CTR_RS_SUMMED = TIDE_CTR_RS_BASE + 2,     /* my Level-1 sums completed */
    TIDE_CTR_RS_SENT = TIDE_CTR_RS_BASE + 3,       /* my outbox blocks sent */
    TIDE_CTR_RS_SPARE_USED = TIDE_CTR_RS_BASE + 4, /* my spare blocks copied into the inbox */
    TIDE_CTR_RS_ARRIVED = TIDE_CTR_RS_BASE + 5,    /* + q: partials arrived in generation q */
    TIDE_CTR_RS_NODE_ARRIVED = TIDE_CTR_RS_ARRIVED + TIDE_CTR_RS_MAX_GENERATIONS,     /* + q */
    TIDE_CTR_RS_NODE_LANDED = TIDE_CTR_RS_NODE_ARRIVED + TIDE_CTR_RS_MAX_GENERATIONS, /* + q */
    TIDE_CTR_RS_STG_CREDIT = TIDE_CTR_RS_NODE_LANDED + TIDE_CTR_RS_MAX_GENERATIONS,   /* + j */
    TIDE_CTR_RS_CREDIT = TIDE_CTR_RS_STG_CREDIT + TIDE_CTR_RS_STG_RANKS, /* + c, c < M: last */
};

_Static_assert(TIDE_CTR_FENCE < TIDE_CTR_RS_BASE, "AG and fence counters overflow into RS");

/* Counters a plan's programs (AG and RS together) need: the RS_CREDIT family is last. */
static inline uint64_t tide_ctr_count(const struct tide_plan *plan) {
    return (uint64_t)TIDE_CTR_RS_CREDIT + (uint64_t)plan->topo.nodes;
}

/* Whether the plan's counters fit into the arena's signal slots. */
static inline int tide_ctr_fits(const struct tide_plan *plan) {
    return tide_ctr_count(plan) <= (uint64_t)TIDE_ARENA_SIGNAL_SLOTS;
}

/*
 * Consistency of a compiled program's thresholds: every WAIT's inc must equal the number of
 * SIGNALs (bare or fused) that reach (its rank, its counter) in one call of the program, with
 * 1 <= inc and thr <= inc, and every counter index must lie in [0, tide_ctr_count(plan)).
 * Returns TIDE_ERR_INTERNAL naming the first offending op: thresholds cannot drift silently.
 */
tide_result_t tide_program_check_incs(const tide_program_t *prog);

#endif /* TIDE_PROGRAM_COUNTERS_H_ */
