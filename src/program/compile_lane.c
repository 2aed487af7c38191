/*
 * compile_lane.c - the rail lane: TIDE-AG and TIDE-RS for a group with one rank per node
 * (L = 1, M >= 2; paper App. F "Expert-parallel (Lsub = 1) rail lanes", docs/protocol.md
 * "The rail lane").  With no local peers there is nothing to scatter, stage or sum on a node,
 * so both collectives drop the regions that serve those steps:
 *
 *   AG  runs the R = ceil(log2 M) Bruck rounds from landing to landing.  Round d puts the
 *       first c_d shards this rank holds (ranks n .. n + c_d - 1, mod M) from its own landing
 *       into the same offsets of the landing of rank (n - 2^d) mod M: the landing layout is
 *       the same on every rank, and rank a's shard of parameter p sits at o_p N + a s_p, so a
 *       run of consecutive ranks is one copy per parameter (two where it wraps past M - 1).
 *       No receive stage, no scatter copies.  A put may write a peer's landing only after
 *       that peer's call passed its landing slot: its READY queue credits each round's
 *       sender (AG_CREDIT + d) when it starts the call.
 *   RS  puts each destination's gradient rows (the pieces of pass pi, in the gradient dtype)
 *       straight from the gradient operands into the destination's inbox, which holds two
 *       generations of one E_sub block; the destination lands each block as it arrives and
 *       then its own rows, read in place, with bf16 inputs widened exactly
 *       (tide_land_args_t.in_bf16).  No staging, outbox, spare or Level-1 sum.
 *
 * Numerics.  The generic programs at L = 1 sum nothing at Level 1 (acc = own, the exact
 * widening of the gradient) and land one input per wave, contributor c = 1 .. M - 1 of each
 * pass and then the own node (c = M), each landing rounding alpha * v and then the add.  The
 * lane lands the same values in the same order, so the output has the same bits; padding rows
 * are not landed at all and are zeroed at the end, as the generic programs do.
 *
 * Inbox generations.  Send J = pi (M - 1) + c - 1 (pass pi, contributor c, to node n + c) uses
 * generation J mod 2 of the target.  Its previous user there is J - 2, or for J < 2 one of the
 * last two sends of the previous call; the target credits J + 2 after landing J, and the next
 * call's J = 0, 1 after its last landing (RS_CREDIT + c on the sender, one signal per item, in
 * item order: one target lands in J order, and the wrap-around credits are issued in J order
 * too, which matters at M = 2 where every send shares contributor 1).  The first two sends of
 * a call therefore wait for the whole previous call's landings at their target.  Arrivals on a
 * generation are ordered the same way: a sender puts only after the credit that follows the landing
 * of the generation's previous block.
 */
#include "program/compile_lane.h"

#include "core/checks.h"
#include "program/counters.h"

#include <stdlib.h>

/* Longest landing segment: the kernels count a segment's elements in 32 bits. */
#define LANE_SEG_MAX_ELEMS ((uint64_t)1 << 30)

typedef struct {
    const struct tide_plan *plan;
    tide_program_t *prog;
    int m, p;          /* M, P */
    int n_part, d_rem; /* passes; remote sends per call n_part (M - 1) */
    uint64_t item;     /* b_grad */
    uint64_t block;    /* one inbox generation: E_sub b_grad bytes */
    tide_land_seg_t *segs;
    int cap;
} lane_ctx_t;

static tide_result_t push(tide_program_t *prog, int rank, tide_queue_t q, tide_op_t op) {
    return tide_program_push(prog, rank, q, &op);
}

static int ring(int m, int x) {
    return (x % m + m) % m;
}

/* ------------------------------------------------------------------ all-gather */

/* Runs of consecutive ranks [first, first + count) mod M: one, or two where it wraps. */
static int rank_runs(int m, int first, int count, int runs[2][2]) {
    runs[0][0] = first;
    if (first + count <= m) {
        runs[0][1] = count;
        return 1;
    }
    runs[0][1] = m - first;
    runs[1][0] = 0;
    runs[1][1] = first + count - m;
    return 2;
}

/* Signals round d's puts raise on the target: one per copy, so that each copy's bytes are
 * covered by a signal of its own (a fused signal covers only its copy). */
static int64_t ag_round_puts(const lane_ctx_t *c, int sender, int d) {
    int runs[2][2];
    return (int64_t)rank_runs(c->m, sender, c->plan->ag.rounds[d].count, runs) * c->p;
}

static tide_result_t ag_ready(lane_ctx_t *c, int r) {
    const tide_ag_schedule_t *ag = &c->plan->ag;
    /* The previous call's own shard is in: AG_LANDED has one sender, this rank. */
    TIDE_CHECK(push(c->prog, r, TIDE_Q_READY, tide_op_wait(r, TIDE_CTR_AG_LANDED, 1, 0)));
    TIDE_CHECK(push(c->prog, r, TIDE_Q_READY, tide_op_signal(r, TIDE_CTR_AG_READY)));
    /* My landing slot is free: the sender of each round may put into it. */
    for (int d = 0; d < ag->num_rounds; ++d)
        TIDE_CHECK(
            push(c->prog, r, TIDE_Q_READY,
                 tide_op_signal(ring(c->m, r + ag->rounds[d].distance), TIDE_CTR_AG_CREDIT + d)));
    return TIDE_SUCCESS;
}

static tide_result_t ag_caller(lane_ctx_t *c, int r) {
    const tide_geom_t *g = &c->plan->geom;
    const tide_ag_schedule_t *ag = &c->plan->ag;
    TIDE_CHECK(push(c->prog, r, TIDE_Q_CALLER, tide_op_wait(r, TIDE_CTR_AG_READY, 1, 1)));
    /* Own shard into my landing: copied, or cast from the fp32 master straight there. */
    for (int p = 0; p < c->p; ++p) {
        const tide_geom_param_t *gp = &g->params[p];
        tide_ref_t dst = tide_ref_landing(r, tide_geom_landing(g, p, r));
        if (g->cast) {
            tide_op_t cast = tide_op_new(TIDE_OP_CAST);
            cast.dst = dst;
            cast.src = tide_ref_operand(TIDE_REF_SHARD, 0, gp->elem_offset * 4);
            cast.bytes = gp->shard_bytes;
            TIDE_CHECK(push(c->prog, r, TIDE_Q_CALLER, cast));
        } else {
            TIDE_CHECK(push(c->prog, r, TIDE_Q_CALLER,
                            tide_op_copy(dst, tide_ref_operand(TIDE_REF_SHARD, 0, gp->offset),
                                         gp->shard_bytes, -1, 0)));
        }
    }
    /* Queue order makes the writes above visible before the signal. */
    TIDE_CHECK(push(c->prog, r, TIDE_Q_CALLER, tide_op_signal(r, TIDE_CTR_AG_LANDED)));

    int waited = 0; /* rounds [0, waited) known to have arrived in this call */
    for (int d = 0; d < ag->num_rounds; ++d) {
        const tide_ag_round_t *rd = &ag->rounds[d];
        const int target = ring(c->m, r - rd->distance), ctr = TIDE_CTR_AG_ARRIVED + d;
        /* The target's landing slot of this call is free (its READY). */
        TIDE_CHECK(push(c->prog, r, TIDE_Q_CALLER, tide_op_wait(r, TIDE_CTR_AG_CREDIT + d, 1, 1)));
        /* Shards r + 1 .. r + c_d - 1 arrived in the rounds whose first slot is below c_d. */
        while (waited < d && ag->rounds[waited].first_slot < rd->count) {
            const int64_t inc =
                ag_round_puts(c, ring(c->m, r + ag->rounds[waited].distance), waited);
            TIDE_CHECK(push(c->prog, r, TIDE_Q_CALLER,
                            tide_op_wait(r, TIDE_CTR_AG_ARRIVED + waited, inc, inc)));
            ++waited;
        }
        int runs[2][2];
        const int nr = rank_runs(c->m, r, rd->count, runs);
        for (int p = 0; p < c->p; ++p) {
            const tide_geom_param_t *gp = &g->params[p];
            for (int k = 0; k < nr; ++k) {
                const uint64_t off = tide_geom_landing(g, p, runs[k][0]);
                TIDE_CHECK(
                    push(c->prog, r, TIDE_Q_CALLER,
                         tide_op_copy(tide_ref_landing(target, off), tide_ref_landing(r, off),
                                      (uint64_t)runs[k][1] * gp->shard_bytes, target, ctr)));
            }
        }
    }
    return push(c->prog, r, TIDE_Q_CALLER, tide_op_signal(r, TIDE_CTR_AG_CALLER_DONE));
}

static tide_result_t ag_done(lane_ctx_t *c, int r) {
    const tide_ag_schedule_t *ag = &c->plan->ag;
    /* No AG_LANDED wait: the own shard is written on CALLER before AG_CALLER_DONE, which
     * this queue waits for below. */
    for (int d = 0; d < ag->num_rounds; ++d) {
        const int64_t inc = ag_round_puts(c, ring(c->m, r + ag->rounds[d].distance), d);
        TIDE_CHECK(
            push(c->prog, r, TIDE_Q_DONE, tide_op_wait(r, TIDE_CTR_AG_ARRIVED + d, inc, inc)));
    }
    /* My forwards read my landing and wrote the targets': both done before call-done. */
    TIDE_CHECK(push(c->prog, r, TIDE_Q_DONE, tide_op_wait(r, TIDE_CTR_AG_CALLER_DONE, 1, 1)));
    tide_op_t ev = tide_op_new(TIDE_OP_EVENT);
    ev.event = TIDE_EVENT_CALL_DONE;
    return push(c->prog, r, TIDE_Q_DONE, ev);
}

/* ------------------------------------------------------------------ reduce-scatter */

/* Real (non-padding) elements among [begin, begin + len) of rank r's shard of a parameter. */
static uint64_t valid_elems(const tide_geom_param_t *gp, int r, uint64_t begin, uint64_t len) {
    const uint64_t real = gp->dim0 * gp->inner;
    const uint64_t start = (uint64_t)r * gp->shard_elems + begin;
    if (start >= real) return 0;
    return real - start < len ? real - start : len;
}

/* Send J's contributor c and pass. */
static int send_c(const lane_ctx_t *c, int J) {
    return J % (c->m - 1) + 1;
}
static int send_pass(const lane_ctx_t *c, int J) {
    return J / (c->m - 1);
}

/* Arrivals per call on generation q, and those up to and including send J. */
static int64_t gen_count(const lane_ctx_t *c, int q, int upto) {
    int64_t k = 0;
    for (int J = q; J <= upto && J < c->d_rem; J += 2)
        ++k;
    return k;
}

static tide_result_t rs_sends(lane_ctx_t *c, int r) {
    const tide_geom_t *g = &c->plan->geom;
    const tide_rs_schedule_t *rs = &c->plan->rs;
    for (int J = 0; J < c->d_rem; ++J) {
        const int cc = send_c(c, J), pass = send_pass(c, J), t = ring(c->m, r + cc);
        const int q = J % 2;
        /* Items on RS_CREDIT + cc: one per pass; those of J < 2 were credited by the
         * previous call (none before the first call: the arena starts fresh). */
        int fresh = 0;
        for (int x = 0; x < 2 && x < c->d_rem; ++x)
            fresh += send_c(c, x) == cc;
        TIDE_CHECK(push(c->prog, r, TIDE_Q_READ,
                        tide_op_wait(r, TIDE_CTR_RS_CREDIT + cc, c->n_part, pass + 1 - fresh)));
        const int np = rs->num_pieces[pass];
        const tide_rs_piece_t *pcs = rs->pieces[pass];
        tide_op_t held = {0};
        bool have = false;
        for (int x = 0; x < np; ++x) {
            const tide_rs_piece_t *pc = &pcs[x];
            const tide_geom_param_t *gp = &g->params[pc->param];
            const uint64_t valid = valid_elems(gp, t, pc->begin, pc->len);
            if (valid == 0) continue;
            if (have) TIDE_CHECK(push(c->prog, r, TIDE_Q_READ, held));
            held = tide_op_copy(
                tide_ref_arena(t, TIDE_REGION_INBOX, (uint64_t)q * c->block + pc->col * c->item),
                tide_ref_operand(TIDE_REF_GRAD, pc->param,
                                 ((uint64_t)t * gp->shard_elems + pc->begin) * c->item),
                valid * c->item, -1, 0);
            have = true;
        }
        if (have) {
            held.sig_rank = t;
            held.ctr = TIDE_CTR_RS_ARRIVED + q;
            TIDE_CHECK(push(c->prog, r, TIDE_Q_READ, held));
        } else {
            /* Only padding for t in this pass: the block still counts as arrived. */
            TIDE_CHECK(push(c->prog, r, TIDE_Q_READ, tide_op_signal(t, TIDE_CTR_RS_ARRIVED + q)));
        }
    }
    /* The sends read the gradients: NET records read-done after this. */
    return push(c->prog, r, TIDE_Q_READ, tide_op_signal(r, TIDE_CTR_RS_SENT));
}

static tide_result_t reserve_segs(lane_ctx_t *c, uint64_t need) {
    if (need <= (uint64_t)c->cap) return TIDE_SUCCESS;
    if (need > (uint64_t)INT32_MAX)
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "rail lane: a landing table needs %llu segments",
                        (unsigned long long)need);
    tide_land_seg_t *grown = realloc(c->segs, (size_t)need * sizeof(*grown));
    if (grown == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rail lane: landing table of %llu segments",
                        (unsigned long long)need);
    c->segs = grown;
    c->cap = (int)need;
    return TIDE_SUCCESS;
}

/*
 * LAND of pass `pass` on rank r reading `in`: the pieces of parameter `only` (or every
 * parameter when only < 0), valid rows only, at input element `col` (the inbox block) or
 * `begin` (the own gradient, whose reference starts at r's rows of that parameter).
 */
static tide_result_t rs_land(lane_ctx_t *c, int r, int pass, int only, tide_ref_t in, bool init) {
    const tide_geom_t *g = &c->plan->geom;
    const tide_rs_schedule_t *rs = &c->plan->rs;
    const int np = rs->num_pieces[pass];
    const tide_rs_piece_t *pcs = rs->pieces[pass];
    uint64_t total = 0;
    for (int x = 0; x < np; ++x)
        total += (pcs[x].len + LANE_SEG_MAX_ELEMS - 1) / LANE_SEG_MAX_ELEMS;
    TIDE_CHECK(reserve_segs(c, total));
    int n = 0;
    for (int x = 0; x < np; ++x) {
        const tide_rs_piece_t *pc = &pcs[x];
        if (only >= 0 && pc->param != only) continue;
        const tide_geom_param_t *gp = &g->params[pc->param];
        const uint64_t valid = valid_elems(gp, r, pc->begin, pc->len);
        const uint64_t in_base = only >= 0 ? pc->begin : pc->col;
        for (uint64_t at = 0; at < valid; at += LANE_SEG_MAX_ELEMS) {
            const uint64_t len = valid - at < LANE_SEG_MAX_ELEMS ? valid - at : LANE_SEG_MAX_ELEMS;
            tide_land_seg_t *sg = &c->segs[n++];
            sg->out_off = gp->elem_offset + pc->begin + at;
            sg->in_off = in_base + at;
            sg->len = (uint32_t)len;
            sg->pad_ = 0;
        }
    }
    /* Nothing of this rank's rows (only padding): no op, and no reference past the end of a
     * gradient that has none of them. */
    if (n == 0) return TIDE_SUCCESS;
    tide_table_t tb = {0};
    tb.kind = TIDE_OP_LAND;
    tb.num_segs = n;
    tb.land_segs = c->segs;
    tb.num_in = 1;
    tb.in[0] = in;
    tb.in_bf16 = c->item == 2;
    int index;
    TIDE_CHECK(tide_program_add_table(c->prog, r, &tb, &index));
    tide_op_t op = tide_op_new(TIDE_OP_LAND);
    op.table = index;
    op.init = init;
    return push(c->prog, r, TIDE_Q_NET, op);
}

/* Rank r's inbox generation of send J may be refilled: credit J's sender. */
static tide_result_t rs_credit(lane_ctx_t *c, int r, int J) {
    const int cc = send_c(c, J);
    return push(c->prog, r, TIDE_Q_NET,
                tide_op_signal(ring(c->m, r - cc), TIDE_CTR_RS_CREDIT + cc));
}

static tide_result_t rs_net(lane_ctx_t *c, int r) {
    const tide_geom_t *g = &c->plan->geom;
    const tide_rs_schedule_t *rs = &c->plan->rs;
    for (int J = 0; J < c->d_rem; ++J) {
        const int cc = send_c(c, J), pass = send_pass(c, J), q = J % 2;
        /* Send J of contributor cc arrives from node r - cc. */
        TIDE_CHECK(push(c->prog, r, TIDE_Q_NET,
                        tide_op_wait(r, TIDE_CTR_RS_ARRIVED + q, gen_count(c, q, c->d_rem),
                                     gen_count(c, q, J))));
        TIDE_CHECK(
            rs_land(c, r, pass, -1, tide_ref_arena(r, TIDE_REGION_INBOX, q * c->block), cc == 1));
        /* The generation is free: credit the sender of its next user.  The next call's first
         * two users are credited after the last landing, in their order: one sender may
         * count both on one counter (M = 2), so its credits must arrive in item order. */
        if (J + 2 < c->d_rem) TIDE_CHECK(rs_credit(c, r, J + 2));
        if (J == c->d_rem - 1)
            for (int x = 0; x < 2 && x < c->d_rem; ++x)
                TIDE_CHECK(rs_credit(c, r, x));
        if (cc < c->m - 1) continue;
        /* Pass complete on the wire: my own rows last (c = M), read in place. */
        for (int p = 0; p < c->p; ++p) {
            bool has = false;
            for (int x = 0; x < rs->num_pieces[pass] && !has; ++x)
                has = rs->pieces[pass][x].param == p;
            if (!has) continue;
            const uint64_t own = (uint64_t)r * g->params[p].shard_elems * c->item;
            TIDE_CHECK(rs_land(c, r, pass, p, tide_ref_operand(TIDE_REF_GRAD, p, own), false));
        }
    }
    /* Read-done (I2): my sends and my own landings no longer read the gradients. */
    TIDE_CHECK(push(c->prog, r, TIDE_Q_NET, tide_op_wait(r, TIDE_CTR_RS_SENT, 1, 1)));
    tide_op_t ev = tide_op_new(TIDE_OP_EVENT);
    ev.event = TIDE_EVENT_READ_DONE;
    TIDE_CHECK(push(c->prog, r, TIDE_Q_NET, ev));
    /* Padding rows are +0 after every call (tide.h); no landing wrote them. */
    for (int p = 0; p < g->num_params; ++p) {
        uint64_t first, valid;
        tide_geom_rs_rows(g, p, r, &first, &valid);
        const tide_geom_param_t *gp = &g->params[p];
        const uint64_t real = valid * gp->inner;
        if (real >= gp->shard_elems) continue;
        tide_op_t z = tide_op_new(TIDE_OP_ZERO);
        z.dst = tide_ref_operand(TIDE_REF_OUT, 0, (gp->elem_offset + real) * 4);
        z.bytes = (gp->shard_elems - real) * 4;
        TIDE_CHECK(push(c->prog, r, TIDE_Q_NET, z));
    }
    ev.event = TIDE_EVENT_CALL_DONE;
    return push(c->prog, r, TIDE_Q_NET, ev);
}

/* ------------------------------------------------------------------ entry points */

static tide_result_t ctx_init(const struct tide_plan *plan, tide_program_t *prog, lane_ctx_t *c) {
    const tide_rs_schedule_t *rs = &plan->rs;
    TIDE_ARG_CHECK(rs->rail_lane && plan->topo.gpus_per_node == 1 && plan->topo.nodes >= 2,
                   "rail lane: the plan (M = %d, L = %d) is not a rail-lane plan", plan->topo.nodes,
                   plan->topo.gpus_per_node);
    *c = (lane_ctx_t){0};
    c->plan = plan;
    c->prog = prog;
    c->m = plan->topo.nodes;
    c->p = plan->geom.num_params;
    c->n_part = rs->passes;
    c->d_rem = rs->passes * (c->m - 1);
    c->item = plan->geom.grad_item;
    if (!tide_mul_u64(rs->subslice_elems, c->item, &c->block))
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "rail lane: inbox block overflows");
    if (plan->arena.regions[TIDE_REGION_INBOX].bytes / 2 < c->block)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "rail lane: the inbox holds %llu bytes, two blocks need %llu x 2",
                        (unsigned long long)plan->arena.regions[TIDE_REGION_INBOX].bytes,
                        (unsigned long long)c->block);
    return TIDE_SUCCESS;
}

/* One rank's ops of each collective. */
static tide_result_t ag_rank(lane_ctx_t *c, int r) {
    TIDE_CHECK(ag_ready(c, r));
    TIDE_CHECK(ag_caller(c, r));
    return ag_done(c, r);
}

static tide_result_t rs_rank(lane_ctx_t *c, int r) {
    TIDE_CHECK(rs_sends(c, r));
    return rs_net(c, r);
}

/* The lane's program of `coll`: every rank's ops by `emit`, then the signal count check. */
static tide_result_t compile_lane(const struct tide_plan *plan, tide_collective_t coll,
                                  tide_rs_mode_t mode, tide_result_t (*emit)(lane_ctx_t *, int),
                                  tide_program_t *prog_out) {
    tide_program_t prog;
    TIDE_CHECK(tide_program_init(plan, coll, mode, &prog));
    lane_ctx_t c = {0};
    tide_result_t res;
    TIDE_CHECK_GOTO(ctx_init(plan, &prog, &c), res, fail);
    for (int r = 0; r < c.m; ++r)
        TIDE_CHECK_GOTO(emit(&c, r), res, fail);
    TIDE_CHECK_GOTO(tide_program_check_incs(&prog), res, fail);
    free(c.segs);
    *prog_out = prog;
    return TIDE_SUCCESS;
fail:
    free(c.segs);
    tide_program_free(&prog);
    return res;
}

tide_result_t tide_program_compile_ag_lane(const struct tide_plan *plan, tide_program_t *prog_out) {
    return compile_lane(plan, TIDE_COLL_ALL_GATHER, TIDE_RS_IN_PLACE, ag_rank, prog_out);
}

tide_result_t tide_program_compile_rs_lane(const struct tide_plan *plan, tide_rs_mode_t mode,
                                           tide_program_t *prog_out) {
    return compile_lane(plan, TIDE_COLL_REDUCE_SCATTER, mode, rs_rank, prog_out);
}
