/*
 * compile_rs.c - the TIDE-RS program (paper §4, §5.2-5.3, Algorithm 1; docs/protocol.md,
 * "TIDE-RS"), unicast fallback, In-Place and Slot-Reuse.
 *
 * Rank (n, i) on call e, bank b = e mod 2, in the read order of compile_rs.h:
 *   CE    pushes its gradient rows of every destination to the L - 1 local owners' staging;
 *   READ  sums each destination it owns into outbox block J mod n_out of bank b, or into the
 *         pass's spare of bank b for the own node, then records read-done;
 *   NET   per wave: puts the wave's outbox blocks into the targets' inbox generation, then
 *         zeroes its stale blocks, copies the spare in, joins the node, lands, and returns
 *         the generation's credits to the senders of its next wave.  At M = 1 (no inbox) it
 *         joins the node and lands from the owners' spares (emit_landing_m1).
 * Both modes have the same ops; they differ in n_out only.  A full outbox (In-Place,
 * n_out = D_rem) never makes a sum wait for the network; a partial one (Slot-Reuse, eq. 9)
 * makes the sum of J >= n_out wait until send J - n_out released its block.  The outbox
 * depth is the plan's, because the arena holds n_out blocks per bank.
 *
 * Waits count signals (program.h): a threshold "c >= e inc + thr" is sound only if no signal
 * of a later use can reach the counter before the waiter passes.  Two counters sum several
 * senders:
 *   - RS_STAGED sums the L - 1 pushers of a rank.  A pusher that ran ahead to the next
 *     destination would make the count ambiguous, so for L >= 3 a pusher starts destination
 *     d only once the owner has seen every push of d - 1.  To keep the push of d overlapping
 *     the sum of d - 1, the owner then credits its pushers twice per destination: when it has
 *     seen the pushes (before summing) and after the sum (the slot is free).  A single
 *     pusher (L = 2) needs only the slot: n_stg-deep credits after each sum.
 *   - RS_NODE_ARRIVED / RS_NODE_LANDED sum the L local ranks; a rank reaches the next wave on
 *     a generation only after every rank landed the previous one, so no count runs ahead.
 * RS_ARRIVED sums the remote senders of a generation, which refill it only after its credit.
 */
#include "program/compile_rs.h"

#include "core/checks.h"
#include "program/compile_lane.h"
#include "program/counters.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static tide_result_t push(rs_ctx_t *c, int rank, tide_queue_t q, tide_op_t op) {
    return tide_program_push(c->prog, rank, q, &op);
}

/* Rank of local rank j on rank's node, and of rank's rail peer on node `node`. */
static int local_rank(const rs_ctx_t *c, int rank, int j) {
    return rank / c->l * c->l + j;
}
static int rail_rank(const rs_ctx_t *c, int rank, int node) {
    return ((node % c->m) + c->m) % c->m * c->l + rank % c->l;
}

/*
 * Staging credits.  Owner j signals RS_STG_CREDIT + j on each pusher after each sum and, for
 * L >= 3 with n_stg >= 2, also as soon as it has seen all pushes of a destination (before
 * summing it; see the header comment).  Destination d uses slot d mod n_stg, whose previous
 * user is d - n_stg, or for d < n_stg the last d'' = d (mod n_stg) of the previous call.
 */
static bool credit_on_arrival(const rs_ctx_t *c) {
    return c->l >= 3 && c->n_stg >= 2;
}

static int64_t stg_credit_inc(const rs_ctx_t *c) {
    return (credit_on_arrival(c) ? 2 : 1) * (int64_t)c->d_all;
}

/* Previous user of destination d's staging slot, relative to this call's first sum. */
static int64_t prev_slot_user(const rs_ctx_t *c, int d) {
    if (d >= c->n_stg) return (int64_t)d - c->n_stg;
    const int last = d + (c->d_all - 1 - d) / c->n_stg * c->n_stg;
    return (int64_t)last - c->d_all;
}

/*
 * Owner j's credits a pusher needs before it pushes destination d: the slot's previous user
 * was summed and, with several pushers, j saw every push of d - 1.  With credits on arrival
 * the owner's k-th destination raises the count to 2k + 1 when seen and 2k + 2 when summed.
 */
static int64_t stg_credit_thr(const rs_ctx_t *c, int d) {
    const int64_t prev = prev_slot_user(c, d);
    if (!credit_on_arrival(c)) return prev + 1; /* L >= 3 has n_stg = 1 here: prev = d - 1 */
    const int64_t seen = 2 * (int64_t)d - 1, summed = 2 * prev + 2;
    return seen > summed ? seen : summed;
}

/* ------------------------------------------------------------------ CE: Level-1 pushes */

static tide_result_t emit_ce(rs_ctx_t *c, int rank) {
    if (c->l == 1) return TIDE_SUCCESS; /* the owner reads its own gradient in place */
    const int i = rank % c->l;
    for (int d = 0; d < c->d_all; ++d) {
        for (int step = 1; step < c->l; ++step) {
            /* Owners in rotated order, so the L pushers start on different owners. */
            const int j = (i + step) % c->l;
            TIDE_CHECK(push(c, rank, TIDE_Q_CE,
                            tide_op_wait(rank, TIDE_CTR_RS_STG_CREDIT + j, stg_credit_inc(c),
                                    stg_credit_thr(c, d))));
            TIDE_CHECK(rs_emit_pushes(c, rank, &c->dests[d], j, d % c->n_stg));
        }
    }
    return push(c, rank, TIDE_Q_CE, tide_op_signal(rank, TIDE_CTR_RS_PUSHED));
}

/* ------------------------------------------------------------------ READ: Level-1 sums */

static tide_result_t signal_stg_credits(rs_ctx_t *c, int rank) {
    const int i = rank % c->l;
    for (int j = 0; j < c->l; ++j)
        if (j != i)
            TIDE_CHECK(push(c, rank, TIDE_Q_READ,
                            tide_op_signal(local_rank(c, rank, j), TIDE_CTR_RS_STG_CREDIT + i)));
    return TIDE_SUCCESS;
}

/* I3 for the sum's output block of bank b, last filled in call e - 2 (or earlier this call). */
static tide_result_t wait_out_block(rs_ctx_t *c, int rank, const rs_dest_t *d) {
    if (d->send < 0) {
        /* Spare (b, pass) was copied into the inbox by call e - 2's own wave of the pass. */
        return push(c, rank, TIDE_Q_READ,
                    tide_op_wait(rank, TIDE_CTR_RS_SPARE_USED, c->n_part,
                            (int64_t)d->pass + 1 - 2 * (int64_t)c->n_part));
    }
    const int J = d->send;
    if (J >= c->n_out) /* this call's send J - n_out used the block */
        return push(c, rank, TIDE_Q_READ,
                    tide_op_wait(rank, TIDE_CTR_RS_SENT, c->d_rem, (int64_t)J - c->n_out + 1));
    /* Call e - 2's last send from this block: the largest J'' < D_rem, J'' = J mod n_out. */
    const int last = J + (c->d_rem - 1 - J) / c->n_out * c->n_out;
    return push(
        c, rank, TIDE_Q_READ,
        tide_op_wait(rank, TIDE_CTR_RS_SENT, c->d_rem, (int64_t)last + 1 - 2 * (int64_t)c->d_rem));
}

static tide_result_t emit_read(rs_ctx_t *c, int rank) {
    const int64_t pushers = c->l - 1;
    for (int d = 0; d < c->d_all; ++d) {
        const rs_dest_t *dst = &c->dests[d];
        const int slot = d % c->n_stg;
        if (c->l > 1) {
            TIDE_CHECK(push(
                c, rank, TIDE_Q_READ,
                tide_op_wait(rank, TIDE_CTR_RS_STAGED, pushers * c->d_all, pushers * (int64_t)(d + 1))));
            if (credit_on_arrival(c)) TIDE_CHECK(signal_stg_credits(c, rank));
        }
        TIDE_CHECK(wait_out_block(c, rank, dst));
        int table;
        TIDE_CHECK(rs_add_sum_table(c, rank, dst, slot, &table));
        tide_op_t sum = tide_op_new(TIDE_OP_SUM);
        sum.table = table;
        sum.bank_dep = 1;
        TIDE_CHECK(push(c, rank, TIDE_Q_READ, sum));
        TIDE_CHECK(push(c, rank, TIDE_Q_READ, tide_op_signal(rank, TIDE_CTR_RS_SUMMED)));
        if (c->l > 1) TIDE_CHECK(signal_stg_credits(c, rank));
    }
    /* I2: the gradients are read by these sums and by this rank's own pushes. */
    if (c->l > 1) TIDE_CHECK(push(c, rank, TIDE_Q_READ, tide_op_wait(rank, TIDE_CTR_RS_PUSHED, 1, 1)));
    tide_op_t ev = tide_op_new(TIDE_OP_EVENT);
    ev.event = TIDE_EVENT_READ_DONE;
    return push(c, rank, TIDE_Q_READ, ev);
}

/* ------------------------------------------------------------------ NET: rounds and waves */

typedef struct {
    int64_t arrived_inc[TIDE_CTR_RS_MAX_GENERATIONS]; /* remote partials per call, per gen */
    int64_t waves_inc[TIDE_CTR_RS_MAX_GENERATIONS];   /* waves per call, per gen */
    int64_t arrived[TIDE_CTR_RS_MAX_GENERATIONS];     /* ... through the current wave */
    int64_t waves[TIDE_CTR_RS_MAX_GENERATIONS];
    int *first_credit; /* M entries: A_c, whether c's pass-0 wave credit comes from the
                          previous call (its previous wave on the generation lies there) */
} rs_net_t;

static int remote_count(const tide_rs_wave_t *wv) {
    return wv->count - (wv->has_own ? 1 : 0);
}

/* The next wave on g's generation: g + n_par, or the first of the next call. */
static int next_on_generation(const tide_rs_schedule_t *rs, int g) {
    return g + rs->inbox_generations < rs->num_waves ? g + rs->inbox_generations
                                                     : rs->waves[g].generation;
}

static tide_result_t emit_round(rs_ctx_t *c, int rank, const rs_net_t *net,
                                const tide_rs_wave_t *wv, const tide_rs_round_t *rd) {
    const int i = rank % c->l, n = rank / c->l;
    const int q = wv->generation;
    for (int cc = rd->first; cc < rd->first + rd->count; ++cc) {
        const int J = wv->pass * (c->m - 1) + cc - 1;
        const int target = rail_rank(c, rank, n + cc);
        const int s = (i + cc) % c->l; /* eq. 7 */
        TIDE_CHECK(push(c, rank, TIDE_Q_NET,
                        tide_op_wait(rank, TIDE_CTR_RS_SUMMED, c->d_all, (int64_t)c->send_pos[J] + 1)));
        /* I3 at the target: its previous wave on generation q has landed node-wide. */
        TIDE_CHECK(push(c, rank, TIDE_Q_NET,
                        tide_op_wait(rank, TIDE_CTR_RS_CREDIT + cc, c->n_part,
                                (int64_t)wv->pass + 1 - net->first_credit[cc])));
        tide_op_t put = tide_op_new(TIDE_OP_COPY);
        put.dst = tide_ref_arena(target, TIDE_REGION_INBOX,
                                 ((uint64_t)q * c->l + (uint64_t)s) * c->block_bytes);
        put.src =
            tide_ref_arena(rank, TIDE_REGION_OUTBOX, (uint64_t)(J % c->n_out) * c->block_bytes);
        put.bytes = c->block_bytes;
        put.bank_dep = 1;
        put.sig_rank = target;
        put.ctr = TIDE_CTR_RS_ARRIVED + q;
        TIDE_CHECK(push(c, rank, TIDE_Q_NET, put));
        TIDE_CHECK(push(c, rank, TIDE_Q_NET, tide_op_signal(rank, TIDE_CTR_RS_SENT)));
    }
    return TIDE_SUCCESS;
}

/* A node-wide join on counter ctr: signal it on every local rank (this one included), then
 * wait until this rank's copy has every local rank's signal of the call. */
static tide_result_t node_join(rs_ctx_t *c, int rank, int ctr, int64_t inc, int64_t thr) {
    for (int j = 0; j < c->l; ++j)
        TIDE_CHECK(push(c, rank, TIDE_Q_NET, tide_op_signal(local_rank(c, rank, j), ctr)));
    return push(c, rank, TIDE_Q_NET, tide_op_wait(rank, ctr, inc, thr));
}

static tide_result_t emit_landing(rs_ctx_t *c, int rank, rs_net_t *net, int g) {
    const tide_rs_schedule_t *rs = &c->plan->rs;
    const tide_rs_wave_t *wv = &rs->waves[g];
    const int i = rank % c->l, n = rank / c->l;
    const int q = wv->generation;
    const uint64_t gen_off = (uint64_t)q * (uint64_t)c->l * c->block_bytes;

    /* The previous wave on q has landed node-wide (the NODE_LANDED wait that ended it). */
    for (int s = 0; s < c->l; ++s) {
        if (!(wv->zero_mask[s] & (1u << i))) continue;
        tide_op_t z = tide_op_new(TIDE_OP_ZERO);
        z.dst = tide_ref_arena(rank, TIDE_REGION_INBOX, gen_off + (uint64_t)s * c->block_bytes);
        z.bytes = c->block_bytes;
        TIDE_CHECK(push(c, rank, TIDE_Q_NET, z));
    }
    if (wv->has_own) {
        /* The own node's partial of sub-slice i lands on GPU i (eq. 8 with c mod M = 0). */
        TIDE_CHECK(push(
            c, rank, TIDE_Q_NET,
            tide_op_wait(rank, TIDE_CTR_RS_SUMMED, c->d_all, (int64_t)rs_own_pos(c, wv->pass) + 1)));
        tide_op_t cp = tide_op_new(TIDE_OP_COPY);
        cp.dst = tide_ref_arena(rank, TIDE_REGION_INBOX, gen_off + (uint64_t)i * c->block_bytes);
        cp.src = tide_ref_arena(rank, TIDE_REGION_SPARE, (uint64_t)wv->pass * c->block_bytes);
        cp.bytes = c->block_bytes;
        cp.bank_dep = 1;
        TIDE_CHECK(push(c, rank, TIDE_Q_NET, cp));
        TIDE_CHECK(push(c, rank, TIDE_Q_NET, tide_op_signal(rank, TIDE_CTR_RS_SPARE_USED)));
    }
    const int remote = remote_count(wv);
    net->arrived[q] += remote;
    net->waves[q] += 1;
    if (remote > 0)
        TIDE_CHECK(
            push(c, rank, TIDE_Q_NET,
                 tide_op_wait(rank, TIDE_CTR_RS_ARRIVED + q, net->arrived_inc[q], net->arrived[q])));
    const int64_t node_inc = c->l * net->waves_inc[q], node_thr = c->l * net->waves[q];
    TIDE_CHECK(node_join(c, rank, TIDE_CTR_RS_NODE_ARRIVED + q, node_inc, node_thr));

    int table;
    TIDE_CHECK(rs_add_land_table(c, rank, wv->pass, q, &table));
    tide_op_t land = tide_op_new(TIDE_OP_LAND);
    land.table = table;
    land.init = (uint8_t)(g % rs->waves_per_pass == 0); /* first landing of the pass's rows */
    TIDE_CHECK(push(c, rank, TIDE_Q_NET, land));

    TIDE_CHECK(node_join(c, rank, TIDE_CTR_RS_NODE_LANDED + q, node_inc, node_thr));
    /* Generation q is free on the whole node: credit the senders of its next wave. */
    const tide_rs_wave_t *nx = &rs->waves[next_on_generation(rs, g)];
    for (int cc = nx->first; cc < nx->first + remote_count(nx); ++cc)
        TIDE_CHECK(push(c, rank, TIDE_Q_NET,
                        tide_op_signal(rail_rank(c, rank, n - cc), TIDE_CTR_RS_CREDIT + cc)));
    return TIDE_SUCCESS;
}

/*
 * M = 1: the node partial is the result, no other node adds to it.  Rank s's spare holds
 * sub-slice s's partial of every local rank, and each rank lands its row of it straight from
 * there: one LAND per sub-slice s, reading rank s's spare (bank-dependent), with v + 0.0f
 * (plus_zero) for L > 1.  That is the arithmetic of the L-input landing over the inbox it
 * replaces, whose other L - 1 rows were +0.0f: x + 0 + ... + 0 = x + 0, and 0 + x = x + 0.
 * So the inbox and the spare -> inbox copy go; the spare's SPARE_USED credit moves after the
 * node-wide NODE_LANDED wait, since the other ranks' landings now read it.
 */
static tide_result_t emit_landing_m1(rs_ctx_t *c, int rank, rs_net_t *net, int g) {
    const tide_rs_schedule_t *rs = &c->plan->rs;
    const tide_rs_wave_t *wv = &rs->waves[g];
    const int q = wv->generation;
    bool zeroes = false;
    for (int s = 0; s < c->l; ++s)
        zeroes = zeroes || wv->zero_mask[s] != 0;
    if (!wv->has_own || remote_count(wv) != 0 || rs->waves_per_pass != 1 || zeroes)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "TIDE-RS: M = 1 wave %d is not one own-node wave per pass", g);
    /* The own partial of this pass is in the spare; every local rank's, after the join. */
    TIDE_CHECK(push(
        c, rank, TIDE_Q_NET,
        tide_op_wait(rank, TIDE_CTR_RS_SUMMED, c->d_all, (int64_t)rs_own_pos(c, wv->pass) + 1)));
    net->waves[q] += 1;
    const int64_t node_inc = c->l * net->waves_inc[q], node_thr = c->l * net->waves[q];
    TIDE_CHECK(node_join(c, rank, TIDE_CTR_RS_NODE_ARRIVED + q, node_inc, node_thr));
    for (int s = 0; s < c->l; ++s) {
        int table;
        TIDE_CHECK(rs_add_land_table_m1(c, rank, wv->pass, s, &table));
        tide_op_t land = tide_op_new(TIDE_OP_LAND);
        land.table = table;
        land.bank_dep = 1;
        land.init = 1; /* one wave per pass, and the sub-slices' elements are disjoint */
        TIDE_CHECK(push(c, rank, TIDE_Q_NET, land));
    }
    TIDE_CHECK(node_join(c, rank, TIDE_CTR_RS_NODE_LANDED + q, node_inc, node_thr));
    /* Every local rank has read this rank's spare of the pass: call e + 2 may refill it. */
    return push(c, rank, TIDE_Q_NET, tide_op_signal(rank, TIDE_CTR_RS_SPARE_USED));
}

/*
 * Padding rows of this rank's output are +0 after every call (tide.h), accumulating or not:
 * the landings add alpha * 0 there (which keeps an accumulated value, or gives -0 for a
 * negative alpha), so they are zeroed after the last landing, in the same queue.
 */
static tide_result_t emit_padding_zeros(rs_ctx_t *c, int rank) {
    const tide_geom_t *g = &c->plan->geom;
    for (int p = 0; p < g->num_params; ++p) {
        uint64_t first, valid;
        tide_geom_rs_rows(g, p, rank, &first, &valid);
        const tide_geom_param_t *q = &g->params[p];
        const uint64_t real = valid * q->inner; /* <= R_p K_p */
        if (real >= q->shard_elems) continue;
        tide_op_t z = tide_op_new(TIDE_OP_ZERO);
        z.dst = tide_ref_operand(TIDE_REF_OUT, 0, (q->elem_offset + real) * 4);
        z.bytes = (q->shard_elems - real) * 4;
        TIDE_CHECK(push(c, rank, TIDE_Q_NET, z));
    }
    return TIDE_SUCCESS;
}

static tide_result_t emit_net(rs_ctx_t *c, int rank, rs_net_t *net) {
    const tide_rs_schedule_t *rs = &c->plan->rs;
    for (int q = 0; q < TIDE_CTR_RS_MAX_GENERATIONS; ++q)
        net->arrived[q] = net->waves[q] = 0;
    for (int g = 0; g < rs->num_waves; ++g) {
        const tide_rs_wave_t *wv = &rs->waves[g];
        for (int r = wv->first_round; r < wv->first_round + wv->num_rounds; ++r)
            TIDE_CHECK(emit_round(c, rank, net, wv, &rs->rounds[r]));
        TIDE_CHECK(c->m == 1 ? emit_landing_m1(c, rank, net, g) : emit_landing(c, rank, net, g));
    }
    TIDE_CHECK(emit_padding_zeros(c, rank));
    tide_op_t ev = tide_op_new(TIDE_OP_EVENT);
    ev.event = TIDE_EVENT_CALL_DONE;
    return push(c, rank, TIDE_Q_NET, ev);
}

/* Per-call counts of the schedule, the same on every rank. */
static tide_result_t net_counts(const rs_ctx_t *c, rs_net_t *net) {
    const tide_rs_schedule_t *rs = &c->plan->rs;
    for (int q = 0; q < TIDE_CTR_RS_MAX_GENERATIONS; ++q)
        net->arrived_inc[q] = net->waves_inc[q] = 0;
    for (int g = 0; g < rs->num_waves; ++g) {
        const tide_rs_wave_t *wv = &rs->waves[g];
        net->arrived_inc[wv->generation] += remote_count(wv);
        net->waves_inc[wv->generation] += 1;
        if (wv->pass == 0)
            for (int cc = wv->first; cc < wv->first + remote_count(wv); ++cc)
                net->first_credit[cc] = g < rs->inbox_generations;
    }
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ setup */

static tide_result_t check_region(const struct tide_plan *plan, tide_region_t region,
                                  uint64_t units, uint64_t unit_bytes) {
    uint64_t need;
    if (!tide_mul_u64(units, unit_bytes, &need))
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "TIDE-RS: region %s size overflows",
                        tide_region_name(region));
    if (plan->arena.regions[region].bytes < need)
        return TIDE_ERR(
            TIDE_ERR_INTERNAL, "TIDE-RS: arena region %s holds %llu bytes, the program uses %llu",
            tide_region_name(region), (unsigned long long)plan->arena.regions[region].bytes,
            (unsigned long long)need);
    return TIDE_SUCCESS;
}

static tide_result_t check_plan(const struct tide_plan *plan) {
    TIDE_CHECK(tide_program_check_plan(plan));
    const tide_topo_t *t = &plan->topo;
    const tide_geom_t *g = &plan->geom;
    const tide_rs_schedule_t *rs = &plan->rs;
    TIDE_ARG_CHECK(g->grad_item == 2 || g->grad_item == 4,
                   "plan gradient item size %zu is not bf16 or fp32", g->grad_item);
    TIDE_ARG_CHECK(rs->nodes == t->nodes && rs->gpus_per_node == t->gpus_per_node &&
                       rs->passes >= 1 && rs->staging_slots >= 1 && rs->num_waves >= 1 &&
                       rs->waves != NULL && rs->pieces != NULL && rs->num_pieces != NULL &&
                       rs->subslice_elems > 0,
                   "plan RS schedule (M = %d, L = %d) is incomplete or does not match its "
                   "topology",
                   rs->nodes, rs->gpus_per_node);
    TIDE_ARG_CHECK(t->nodes == 1 || rs->outbox_depth >= 1,
                   "plan RS outbox depth n_out = %d with M = %d nodes", rs->outbox_depth, t->nodes);
    if (rs->inbox_generations < 1 || rs->inbox_generations > TIDE_CTR_RS_MAX_GENERATIONS)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "TIDE-RS: %d inbox generations exceed %d counters",
                        rs->inbox_generations, TIDE_CTR_RS_MAX_GENERATIONS);
    /* D = n_part M sums per call must count in an int (and thresholds in int64). */
    if ((int64_t)rs->passes * t->nodes > INT32_MAX / TIDE_MAX_GPUS_PER_NODE)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "TIDE-RS: %d passes x %d nodes", rs->passes,
                        t->nodes);
    return TIDE_SUCCESS;
}

static tide_result_t ctx_init(const struct tide_plan *plan, tide_program_t *prog, rs_ctx_t *c) {
    const tide_rs_schedule_t *rs = &plan->rs;
    memset(c, 0, sizeof(*c));
    c->plan = plan;
    c->prog = prog;
    c->m = plan->topo.nodes;
    c->l = plan->topo.gpus_per_node;
    c->n_part = rs->passes;
    c->n_stg = rs->staging_slots;
    c->n_out = rs->outbox_depth;
    c->d_rem = c->n_part * (c->m - 1);
    c->d_all = c->n_part * c->m;
    c->e_sub = rs->subslice_elems;
    c->grad_item = plan->geom.grad_item;
    const uint64_t l = (uint64_t)c->l;
    if (!tide_mul_u64(4 * l, c->e_sub, &c->block_bytes) ||
        !tide_mul_u64((l - 1) * l, c->e_sub, &c->slot_elems))
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "TIDE-RS: block of E_sub = %llu overflows",
                        (unsigned long long)c->e_sub);
    /* The arena must hold what the program addresses: two banks of outbox blocks and of
     * per-pass spares, the inbox generations, the staging slots. */
    TIDE_CHECK(check_region(plan, TIDE_REGION_OUTBOX, 2 * (uint64_t)c->n_out, c->block_bytes));
    TIDE_CHECK(check_region(plan, TIDE_REGION_SPARE, 2 * (uint64_t)c->n_part, c->block_bytes));
    TIDE_CHECK(check_region(plan, TIDE_REGION_INBOX,
                            c->m > 1 ? (uint64_t)rs->inbox_generations * l : 0, c->block_bytes));
    uint64_t slot_bytes;
    if (!tide_mul_u64(c->slot_elems, c->grad_item, &slot_bytes))
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "TIDE-RS: staging slot overflows");
    TIDE_CHECK(check_region(plan, TIDE_REGION_STAGING, (uint64_t)c->n_stg, slot_bytes));

    c->dests = calloc((size_t)c->d_all, sizeof(*c->dests));
    c->send_pos = calloc((size_t)(c->d_rem > 0 ? c->d_rem : 1), sizeof(*c->send_pos));
    if (c->dests == NULL || c->send_pos == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "TIDE-RS: read order of %d destinations", c->d_all);
    /* Algorithm 1: the first n_out remote sums, the own-node spares, the remaining sums. */
    const int early = c->n_out < c->d_rem ? c->n_out : c->d_rem;
    int pos = 0;
    for (int J = 0; J < c->d_rem; ++J) {
        if (J == early)
            for (int p = 0; p < c->n_part; ++p)
                c->dests[pos++] = (rs_dest_t){.pass = p, .c = c->m, .send = -1};
        c->send_pos[J] = pos;
        c->dests[pos++] = (rs_dest_t){.pass = J / (c->m - 1), .c = J % (c->m - 1) + 1, .send = J};
    }
    if (early == c->d_rem)
        for (int p = 0; p < c->n_part; ++p)
            c->dests[pos++] = (rs_dest_t){.pass = p, .c = c->m, .send = -1};
    if (pos != c->d_all)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "TIDE-RS: read order has %d of %d destinations", pos,
                        c->d_all);
    return TIDE_SUCCESS;
}

static void ctx_free(rs_ctx_t *c) {
    free(c->land_segs);
    free(c->sum_segs);
    free(c->send_pos);
    free(c->dests);
}

tide_result_t tide_program_compile_rs(const struct tide_plan *plan, tide_rs_mode_t mode,
                                      tide_program_t *prog_out) {
    TIDE_CHECK(check_plan(plan));
    TIDE_ARG_CHECK(prog_out != NULL, "prog_out is NULL");
    if (plan->rs.rail_lane) return tide_program_compile_rs_lane(plan, mode, prog_out);
    tide_result_t res = TIDE_SUCCESS;
    tide_program_t prog;
    TIDE_CHECK(tide_program_init(plan, TIDE_COLL_REDUCE_SCATTER, mode, &prog));
    rs_ctx_t c;
    rs_net_t net = {0};
    TIDE_CHECK_GOTO(ctx_init(plan, &prog, &c), res, fail_ctx);
    net.first_credit = calloc((size_t)c.m + 1, sizeof(int));
    if (net.first_credit == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "TIDE-RS: credit table of %d nodes", c.m);
        goto fail_ctx;
    }
    TIDE_CHECK_GOTO(net_counts(&c, &net), res, fail_net);
    prog.bank_bytes[TIDE_REGION_OUTBOX] = (uint64_t)c.n_out * c.block_bytes;
    prog.bank_bytes[TIDE_REGION_SPARE] = (uint64_t)c.n_part * c.block_bytes;

    for (int r = 0; r < plan->topo.ranks; ++r) {
        TIDE_CHECK_GOTO(emit_ce(&c, r), res, fail_net);
        TIDE_CHECK_GOTO(emit_read(&c, r), res, fail_net);
        TIDE_CHECK_GOTO(emit_net(&c, r, &net), res, fail_net);
    }
    /* Every inc above is a closed form; recount the signals and reject any drift. */
    TIDE_CHECK_GOTO(tide_program_check_incs(&prog), res, fail_net);
    free(net.first_credit);
    ctx_free(&c);
    *prog_out = prog;
    return TIDE_SUCCESS;

fail_net:
    free(net.first_credit);
fail_ctx:
    ctx_free(&c);
    tide_program_free(&prog);
    return res;
}
