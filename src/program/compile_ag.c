/*
 * compile_ag.c - the TIDE-AG program (paper §3.1-3.2, docs/protocol.md), unicast fallback.
 *
 * Rank r = (n, l) on each call:
 *   READY   publishes that its landing slot is free to every local rank;
 *   CALLER  copies its own shard into every local landing, then runs the Bruck rounds on rail
 *           l: round d forwards the first c_d accumulated slots (own shard, stage slots
 *           1..c_d-1) into slots [2^d, 2^d + c_d) of rank ((n - 2^d) mod M, l);
 *   CE      scatters each round's arrivals from the receive stage into every local landing,
 *           in the planner's copy groups (one 2D copy per parameter for strided runs);
 *   DONE    joins the two, returns the stage credits to the round senders, and records the
 *           call-complete event.
 * Two waits go beyond the protocol table, both for landings written by other ranks:
 *   - CE waits AG_READY like CALLER: its scatters write into local peers' landings too, and
 *     its arrivals prove only that remote nodes are ready, not the local peers;
 *   - READY first waits until the previous call fully landed here.  AG_READY and AG_LANDED
 *     sum signals of L different senders, so a count is only meaningful while no sender can
 *     run a call ahead; this wait bounds that skew inside the program instead of relying on
 *     how a fabric sequences consecutive calls.
 */
#include "program/compile_lane.h"
#include "program/counters.h"
#include "program/program.h"

#include "core/checks.h"

#include <stdlib.h>

typedef struct {
    const struct tide_plan *plan;
    tide_program_t *prog;
    int m, l, p; /* M, L, P */
    uint64_t s;  /* S */
    bool cast;
    int64_t landed_inc; /* signals to AG_LANDED per call: L own shards (+ L scatters if M > 1) */
} ag_ctx_t;

static tide_result_t push(ag_ctx_t *c, int rank, tide_queue_t q, tide_op_t op) {
    return tide_program_push(c->prog, rank, q, &op);
}

/* Rank of local rank j of node n, and rank of the node `slot` ahead on the same rail. */
static int local_rank(const ag_ctx_t *c, int rank, int j) {
    int n = rank / c->l;
    return n * c->l + (rank % c->l + j) % c->l;
}
static int rail_rank(const ag_ctx_t *c, int rank, int ahead) {
    int n = rank / c->l;
    int m = c->m;
    return ((n + ahead) % m + m) % m * c->l + rank % c->l;
}

/* Byte offset of stage slot i >= 1 (slot 0, the cast own shard, exists only with a cast). */
static tide_result_t stage_offset(const ag_ctx_t *c, int slot, uint64_t *off_out) {
    uint64_t index = (uint64_t)(c->cast ? slot : slot - 1);
    if (!tide_mul_u64(index, c->s, off_out))
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "AG: stage slot %d of %llu bytes overflows", slot,
                        (unsigned long long)c->s);
    return TIDE_SUCCESS;
}

/* Puts of round d: one with a cast (own shard and stage run are contiguous), else the own
 * shard plus, from round 1 on, the stage run. */
static int round_puts(const ag_ctx_t *c, int d) {
    return c->cast || c->plan->ag.rounds[d].count == 1 ? 1 : 2;
}

static tide_result_t emit_ready(ag_ctx_t *c, int rank) {
    TIDE_CHECK(
        push(c, rank, TIDE_Q_READY, tide_op_wait(rank, TIDE_CTR_AG_LANDED, c->landed_inc, 0)));
    for (int j = 0; j < c->l; ++j)
        TIDE_CHECK(
            push(c, rank, TIDE_Q_READY, tide_op_signal(local_rank(c, rank, j), TIDE_CTR_AG_READY)));
    return TIDE_SUCCESS;
}

/* Own shard of parameter p: the caller's shard (or resident region), or the cast in slot 0. */
static tide_ref_t own_shard(const ag_ctx_t *c, int rank, uint64_t offset) {
    return c->cast ? tide_ref_arena(rank, TIDE_REGION_RECV_STAGE, offset)
                   : tide_ref_operand(TIDE_REF_SHARD, 0, offset);
}

static tide_result_t emit_rounds(ag_ctx_t *c, int rank) {
    const tide_ag_schedule_t *ag = &c->plan->ag;
    int waited = 0; /* rounds [0, waited) already known to have arrived in this call */
    for (int d = 0; d < ag->num_rounds; ++d) {
        const tide_ag_round_t *rd = &ag->rounds[d];
        int target = rail_rank(c, rank, -rd->distance);
        int ctr = TIDE_CTR_AG_ARRIVED + d;
        /* I3: the target scattered and forwarded the slots of my previous call's round d. */
        TIDE_CHECK(push(c, rank, TIDE_Q_CALLER, tide_op_wait(rank, TIDE_CTR_AG_CREDIT + d, 1, 0)));
        /* Slots 1..c_d-1 arrived in the rounds whose first slot is below c_d. */
        while (waited < d && ag->rounds[waited].first_slot < rd->count) {
            int64_t inc = round_puts(c, waited);
            TIDE_CHECK(push(c, rank, TIDE_Q_CALLER,
                            tide_op_wait(rank, TIDE_CTR_AG_ARRIVED + waited, inc, inc)));
            ++waited;
        }
        uint64_t dst_off, run_src, run_dst, run_bytes;
        TIDE_CHECK(stage_offset(c, rd->first_slot, &dst_off));
        tide_ref_t dst = tide_ref_arena(target, TIDE_REGION_RECV_STAGE, dst_off);
        if (c->cast) {
            /* Slot 0 (the cast own shard) and slots 1..c_d-1 are one contiguous run. */
            if (!tide_mul_u64((uint64_t)rd->count, c->s, &run_bytes))
                return TIDE_ERR(TIDE_ERR_OVERFLOW, "AG: round %d put overflows", d);
            TIDE_CHECK(push(c, rank, TIDE_Q_CALLER,
                            tide_op_copy(dst, own_shard(c, rank, 0), run_bytes, target, ctr)));
            continue;
        }
        TIDE_CHECK(push(c, rank, TIDE_Q_CALLER,
                        tide_op_copy(dst, own_shard(c, rank, 0), c->s, target, ctr)));
        if (rd->count == 1) continue;
        TIDE_CHECK(stage_offset(c, 1, &run_src));
        TIDE_CHECK(stage_offset(c, rd->first_slot + 1, &run_dst));
        if (!tide_mul_u64((uint64_t)(rd->count - 1), c->s, &run_bytes))
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "AG: round %d put overflows", d);
        TIDE_CHECK(push(c, rank, TIDE_Q_CALLER,
                        tide_op_copy(tide_ref_arena(target, TIDE_REGION_RECV_STAGE, run_dst),
                                     tide_ref_arena(rank, TIDE_REGION_RECV_STAGE, run_src),
                                     run_bytes, target, ctr)));
    }
    return TIDE_SUCCESS;
}

static tide_result_t emit_caller(ag_ctx_t *c, int rank) {
    const tide_geom_t *g = &c->plan->geom;
    if (c->cast) {
        tide_op_t cast = tide_op_new(TIDE_OP_CAST);
        cast.dst = tide_ref_arena(rank, TIDE_REGION_RECV_STAGE, 0);
        cast.src = tide_ref_operand(TIDE_REF_SHARD, 0, 0);
        cast.bytes = c->s;
        TIDE_CHECK(push(c, rank, TIDE_Q_CALLER, cast));
    }
    TIDE_CHECK(push(c, rank, TIDE_Q_CALLER, tide_op_wait(rank, TIDE_CTR_AG_READY, c->l, c->l)));
    for (int j = 0; j < c->l; ++j) {
        int peer = local_rank(c, rank, j);
        for (int p = 0; p < c->p; ++p) {
            const tide_geom_param_t *gp = &g->params[p];
            bool last = p == c->p - 1;
            TIDE_CHECK(push(c, rank, TIDE_Q_CALLER,
                            tide_op_copy(tide_ref_landing(peer, tide_geom_landing(g, p, rank)),
                                         own_shard(c, rank, gp->offset), gp->shard_bytes,
                                         last ? peer : -1, TIDE_CTR_AG_LANDED)));
        }
    }
    TIDE_CHECK(emit_rounds(c, rank));
    return push(c, rank, TIDE_Q_CALLER, tide_op_signal(rank, TIDE_CTR_AG_CALLER_DONE));
}

/* Landing copies of one group into local rank `peer`'s landing. */
static tide_result_t emit_group(ag_ctx_t *c, int rank, int peer, const tide_ag_group_t *grp) {
    const tide_geom_t *g = &c->plan->geom;
    int per_copy = grp->strided ? grp->num_slots : 1;
    for (int first = grp->first_slot; first < grp->first_slot + grp->num_slots; first += per_copy) {
        int src_rank = rail_rank(c, rank, first);
        uint64_t slot_off;
        TIDE_CHECK(stage_offset(c, first, &slot_off));
        for (int p = 0; p < c->p; ++p) {
            const tide_geom_param_t *gp = &g->params[p];
            tide_op_t op =
                tide_op_copy(tide_ref_landing(peer, tide_geom_landing(g, p, src_rank)),
                             tide_ref_arena(rank, TIDE_REGION_RECV_STAGE, slot_off + gp->offset),
                             gp->shard_bytes, -1, 0);
            if (grp->strided) {
                /* Consecutive slots are ranks L apart: rows S apart in the stage, L s_p apart
                 * in the landing (the group never wraps past node M - 1). */
                op.kind = TIDE_OP_COPY2D;
                op.rows = (uint64_t)grp->num_slots;
                op.src_pitch = c->s;
                op.dst_pitch = (uint64_t)c->l * gp->shard_bytes;
            }
            TIDE_CHECK(push(c, rank, TIDE_Q_CE, op));
        }
    }
    return TIDE_SUCCESS;
}

static tide_result_t emit_ce(ag_ctx_t *c, int rank, const tide_ag_group_t *groups, int num_groups) {
    if (c->m == 1) return TIDE_SUCCESS;
    TIDE_CHECK(push(c, rank, TIDE_Q_CE, tide_op_wait(rank, TIDE_CTR_AG_READY, c->l, c->l)));
    int round = -1;
    for (int i = 0; i < num_groups; ++i) {
        const tide_ag_group_t *grp = &groups[i];
        if (grp->round != round) {
            round = grp->round;
            int64_t inc = round_puts(c, round);
            TIDE_CHECK(push(c, rank, TIDE_Q_CE,
                            tide_op_wait(rank, TIDE_CTR_AG_ARRIVED + round, inc, inc)));
        }
        for (int j = 0; j < c->l; ++j)
            TIDE_CHECK(emit_group(c, rank, local_rank(c, rank, j), grp));
    }
    /* Queue order makes every scatter above visible before these signals. */
    for (int j = 0; j < c->l; ++j)
        TIDE_CHECK(
            push(c, rank, TIDE_Q_CE, tide_op_signal(local_rank(c, rank, j), TIDE_CTR_AG_LANDED)));
    return push(c, rank, TIDE_Q_CE, tide_op_signal(rank, TIDE_CTR_AG_CE_DONE));
}

static tide_result_t emit_done(ag_ctx_t *c, int rank) {
    const tide_ag_schedule_t *ag = &c->plan->ag;
    TIDE_CHECK(push(c, rank, TIDE_Q_DONE,
                    tide_op_wait(rank, TIDE_CTR_AG_LANDED, c->landed_inc, c->landed_inc)));
    if (c->m > 1)
        TIDE_CHECK(push(c, rank, TIDE_Q_DONE, tide_op_wait(rank, TIDE_CTR_AG_CE_DONE, 1, 1)));
    TIDE_CHECK(push(c, rank, TIDE_Q_DONE, tide_op_wait(rank, TIDE_CTR_AG_CALLER_DONE, 1, 1)));
    /* Both readers of the stage (scatters, forwards) are done: senders may refill it. */
    for (int d = 0; d < ag->num_rounds; ++d)
        TIDE_CHECK(push(
            c, rank, TIDE_Q_DONE,
            tide_op_signal(rail_rank(c, rank, ag->rounds[d].distance), TIDE_CTR_AG_CREDIT + d)));
    tide_op_t ev = tide_op_new(TIDE_OP_EVENT);
    ev.event = TIDE_EVENT_CALL_DONE;
    return push(c, rank, TIDE_Q_DONE, ev);
}

static tide_result_t check_plan(const struct tide_plan *plan) {
    TIDE_CHECK(tide_program_check_plan(plan));
    TIDE_ARG_CHECK(plan->geom.shard_bytes > 0, "plan geometry has an empty shard");
    if (plan->ag.num_rounds > TIDE_CTR_AG_MAX_ROUNDS)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "AG: %d rounds exceed %d round counters",
                        plan->ag.num_rounds, TIDE_CTR_AG_MAX_ROUNDS);
    return TIDE_SUCCESS;
}

static tide_result_t compile_node(ag_ctx_t *c, int node) {
    tide_ag_group_t *groups = NULL;
    int num_groups = 0;
    TIDE_CHECK(tide_ag_groups(&c->plan->topo, &c->plan->ag, node, &groups, &num_groups));
    tide_result_t res = TIDE_SUCCESS;
    for (int j = 0; j < c->l && res == TIDE_SUCCESS; ++j) {
        int rank = node * c->l + j;
        TIDE_CHECK_GOTO(emit_ready(c, rank), res, out);
        TIDE_CHECK_GOTO(emit_caller(c, rank), res, out);
        TIDE_CHECK_GOTO(emit_ce(c, rank, groups, num_groups), res, out);
        TIDE_CHECK_GOTO(emit_done(c, rank), res, out);
    }
out:
    free(groups);
    return res;
}

tide_result_t tide_program_compile_ag(const struct tide_plan *plan, tide_program_t *prog_out) {
    TIDE_CHECK(check_plan(plan));
    TIDE_ARG_CHECK(prog_out != NULL, "prog_out is NULL");
    if (plan->rs.rail_lane) return tide_program_compile_ag_lane(plan, prog_out);
    tide_program_t prog;
    TIDE_CHECK(tide_program_init(plan, TIDE_COLL_ALL_GATHER, TIDE_RS_IN_PLACE, &prog));
    ag_ctx_t c = {
        .plan = plan,
        .prog = &prog,
        .m = plan->topo.nodes,
        .l = plan->topo.gpus_per_node,
        .p = plan->geom.num_params,
        .s = plan->geom.shard_bytes,
        .cast = plan->geom.cast,
        .landed_inc =
            plan->topo.nodes > 1 ? 2 * plan->topo.gpus_per_node : plan->topo.gpus_per_node,
    };
    tide_result_t res = TIDE_SUCCESS;
    for (int n = 0; n < c.m; ++n)
        TIDE_CHECK_GOTO(compile_node(&c, n), res, fail);
    TIDE_CHECK_GOTO(tide_program_check_incs(&prog), res, fail);
    *prog_out = prog;
    return TIDE_SUCCESS;

fail:
    tide_program_free(&prog);
    return res;
}
