/*
 * compile_rs_tables.c - the data movement of TIDE-RS Level 1 and the landing (paper §4.1-4.2):
 * Level-1 pushes into the owners' staging slots, and the segment tables of the SUM and LAND
 * ops.
 *
 * Layouts (docs/protocol.md, "TIDE-RS").  A block is L rows of E_sub elements; row l belongs to
 * destination rank r = t L + l of the destination node t, and piece (p, begin, len, col) of
 * (pass, s) sits at column col: it holds elements [begin, begin + len) of r's shard of p,
 * i.e. gradient elements r E_p + begin + [0, len) with E_p = R_p K_p, of which only those
 * below D_p K_p are real rows (clamp(D_p K_p - (r E_p + begin), 0, len) "valid" elements).
 * A staging slot holds the L - 1 pushed contributions of one destination, contribution k of
 * pusher i at owner j being k = i < j ? i : i - 1 (local-rank order, as the sum adds them).
 *
 * Offsets.  Every offset below indexes a region or an operand whose full size the planner
 * already computed with checked arithmetic (staging, outbox, spare, inbox, B_pack = 4 N E for
 * the gradients), so the sums and products here stay below those sizes and cannot overflow.
 */
#include "program/compile_rs.h"

#include "core/checks.h"
#include "program/counters.h"

#include <stdlib.h>

/* Longest segment: the kernels count a segment's elements in 32 bits. */
#define RS_SEG_MAX_ELEMS ((uint64_t)1 << 30)

/* Real (non-padding) elements among [begin, begin + len) of rank r's shard of a parameter. */
static uint64_t valid_elems(const tide_geom_param_t *gp, int r, uint64_t begin, uint64_t len) {
    const uint64_t real = gp->dim0 * gp->inner; /* <= N E_p, bounded by B_pack */
    const uint64_t start = (uint64_t)r * gp->shard_elems + begin;
    if (start >= real) return 0;
    return real - start < len ? real - start : len;
}

static uint64_t seg_chunks(uint64_t len) {
    return (len + RS_SEG_MAX_ELEMS - 1) / RS_SEG_MAX_ELEMS;
}

static const tide_rs_piece_t *pieces_of(const rs_ctx_t *c, int pass, int s, int *count_out) {
    const int idx = pass * c->l + s;
    *count_out = c->plan->rs.num_pieces[idx];
    return c->plan->rs.pieces[idx];
}

static tide_result_t reserve(void **segs, int *cap, uint64_t need, size_t elem) {
    if (need <= (uint64_t)*cap) return TIDE_SUCCESS;
    if (need > (uint64_t)INT32_MAX)
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "TIDE-RS: a segment table needs %llu segments",
                        (unsigned long long)need);
    void *grown = realloc(*segs, (size_t)need * elem);
    if (grown == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "TIDE-RS: segment table of %llu segments",
                        (unsigned long long)need);
    *segs = grown;
    *cap = (int)need;
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ Level-1 pushes */

/* Appends `op`, holding back the latest copy so that the last one can carry the signal. */
static tide_result_t stage_copy(rs_ctx_t *c, int rank, tide_op_t *held, bool *have,
                                const tide_op_t *op) {
    if (*have) TIDE_CHECK(tide_program_push(c->prog, rank, TIDE_Q_CE, held));
    *held = *op;
    *have = true;
    return TIDE_SUCCESS;
}

tide_result_t rs_emit_pushes(rs_ctx_t *c, int rank, const rs_dest_t *d, int owner, int slot) {
    const tide_geom_t *g = &c->plan->geom;
    const int i = rank % c->l, node = rank / c->l;
    const int owner_rank = node * c->l + owner;
    const int t = rs_target_node(c, rank, d);
    const int s = (owner + d->c % c->m) % c->l; /* eq. 7 for the owner */
    const uint64_t k = (uint64_t)(i < owner ? i : i - 1);
    const uint64_t b = c->grad_item;
    /* Row 0 of contribution k in the owner's slot. */
    const uint64_t contrib =
        ((uint64_t)slot * (uint64_t)(c->l - 1) + k) * (uint64_t)c->l * c->e_sub;

    int np;
    const tide_rs_piece_t *pcs = pieces_of(c, d->pass, s, &np);
    tide_op_t held;
    bool have = false;
    for (int x = 0; x < np; ++x) {
        const tide_rs_piece_t *pc = &pcs[x];
        const tide_geom_param_t *gp = &g->params[pc->param];
        /* Valid counts fall with l: a prefix of full ranks, then at most one partial. */
        int full = 0;
        while (full < c->l && valid_elems(gp, t * c->l + full, pc->begin, pc->len) == pc->len)
            ++full;
        if (full > 0) {
            tide_op_t op = tide_op_new(full > 1 ? TIDE_OP_COPY2D : TIDE_OP_COPY);
            op.src = tide_ref_operand(TIDE_REF_GRAD, pc->param,
                                      ((uint64_t)t * c->l * gp->shard_elems + pc->begin) * b);
            op.dst = tide_ref_arena(owner_rank, TIDE_REGION_STAGING, (contrib + pc->col) * b);
            op.bytes = pc->len * b;
            if (full > 1) {
                op.rows = (uint64_t)full;
                op.src_pitch = gp->shard_elems * b; /* consecutive destination ranks */
                op.dst_pitch = c->e_sub * b;        /* consecutive block rows */
            }
            TIDE_CHECK(stage_copy(c, rank, &held, &have, &op));
        }
        if (full == c->l) continue;
        const int r = t * c->l + full;
        const uint64_t tail = valid_elems(gp, r, pc->begin, pc->len);
        if (tail == 0) continue; /* padding rows are not copied: the sum writes them as 0 */
        tide_op_t op = tide_op_new(TIDE_OP_COPY);
        op.src = tide_ref_operand(TIDE_REF_GRAD, pc->param,
                                  ((uint64_t)r * gp->shard_elems + pc->begin) * b);
        op.dst = tide_ref_arena(owner_rank, TIDE_REGION_STAGING,
                                (contrib + (uint64_t)full * c->e_sub + pc->col) * b);
        op.bytes = tail * b;
        TIDE_CHECK(stage_copy(c, rank, &held, &have, &op));
    }
    if (!have) {
        /* Nothing of this sub-slice is real data here; the owner still counts the push. */
        tide_op_t sig = tide_op_new(TIDE_OP_SIGNAL);
        sig.sig_rank = owner_rank;
        sig.ctr = TIDE_CTR_RS_STAGED;
        return tide_program_push(c->prog, rank, TIDE_Q_CE, &sig);
    }
    held.sig_rank = owner_rank;
    held.ctr = TIDE_CTR_RS_STAGED;
    return tide_program_push(c->prog, rank, TIDE_Q_CE, &held);
}

/* ------------------------------------------------------------------ SUM tables */

tide_result_t rs_add_sum_table(rs_ctx_t *c, int rank, const rs_dest_t *d, int slot,
                               int *index_out) {
    const tide_geom_t *g = &c->plan->geom;
    const int i = rank % c->l;
    const int t = rs_target_node(c, rank, d);
    const int s = (i + d->c % c->m) % c->l; /* eq. 7: the sub-slice this rank owns */
    int np;
    const tide_rs_piece_t *pcs = pieces_of(c, d->pass, s, &np);

    uint64_t per_row = 0;
    for (int x = 0; x < np; ++x)
        per_row += seg_chunks(pcs[x].len);
    void *segs = c->sum_segs;
    TIDE_CHECK(reserve(&segs, &c->sum_cap, per_row * (uint64_t)c->l, sizeof(tide_sum_seg_t)));
    c->sum_segs = segs;

    int n = 0;
    for (int l = 0; l < c->l; ++l) {
        const int r = t * c->l + l;
        const uint64_t row = (uint64_t)l * c->e_sub;
        for (int x = 0; x < np; ++x) {
            const tide_rs_piece_t *pc = &pcs[x];
            const tide_geom_param_t *gp = &g->params[pc->param];
            for (uint64_t at = 0; at < pc->len; at += RS_SEG_MAX_ELEMS) {
                const uint64_t len =
                    pc->len - at < RS_SEG_MAX_ELEMS ? pc->len - at : RS_SEG_MAX_ELEMS;
                tide_sum_seg_t *sg = &c->sum_segs[n++];
                sg->out_off = row + pc->col + at;
                sg->stage_off = row + pc->col + at; /* staged rows mirror the block's */
                sg->own_off = (uint64_t)r * gp->shard_elems + pc->begin + at;
                sg->len = (uint32_t)len;
                sg->valid = (uint32_t)valid_elems(gp, r, pc->begin + at, len);
                sg->own_idx = pc->param;
                sg->pad_ = 0;
            }
        }
    }

    tide_table_t tb = {0};
    tb.kind = TIDE_OP_SUM;
    tb.num_segs = n;
    tb.sum_segs = c->sum_segs;
    tb.num_staged = c->l - 1;
    if (c->l > 1) {
        tb.staged = tide_ref_arena(rank, TIDE_REGION_STAGING,
                                   (uint64_t)slot * c->slot_elems * c->grad_item);
        tb.stage_stride = (uint64_t)c->l * c->e_sub;
    }
    /* Bank-0 offsets: the SUM op is bank dependent. */
    if (d->send >= 0)
        tb.out = tide_ref_arena(rank, TIDE_REGION_OUTBOX,
                                (uint64_t)(d->send % c->n_out) * c->block_bytes);
    else
        tb.out = tide_ref_arena(rank, TIDE_REGION_SPARE, (uint64_t)d->pass * c->block_bytes);
    return tide_program_add_table(c->prog, rank, &tb, index_out);
}

/* ------------------------------------------------------------------ LAND tables */

/* Append the landing segments of np pieces whose partials sit at `row` of the input block:
 * each piece lands at its parameter's rows of the output, cut into RS_SEG_MAX_ELEMS chunks. */
static int append_land_segs(rs_ctx_t *c, const tide_rs_piece_t *pcs, int np, uint64_t row,
                            int n) {
    const tide_geom_t *g = &c->plan->geom;
    for (int x = 0; x < np; ++x) {
        const tide_rs_piece_t *pc = &pcs[x];
        for (uint64_t at = 0; at < pc->len; at += RS_SEG_MAX_ELEMS) {
            const uint64_t len = pc->len - at < RS_SEG_MAX_ELEMS ? pc->len - at : RS_SEG_MAX_ELEMS;
            tide_land_seg_t *sg = &c->land_segs[n++];
            sg->out_off = g->params[pc->param].elem_offset + pc->begin + at;
            sg->in_off = row + pc->col + at;
            sg->len = (uint32_t)len;
            sg->pad_ = 0;
        }
    }
    return n;
}

tide_result_t rs_add_land_table(rs_ctx_t *c, int rank, int pass, int gen, int *index_out) {
    const int i = rank % c->l, node = rank / c->l;
    uint64_t total = 0;
    for (int s = 0; s < c->l; ++s) {
        int np;
        const tide_rs_piece_t *pcs = pieces_of(c, pass, s, &np);
        for (int x = 0; x < np; ++x)
            total += seg_chunks(pcs[x].len);
    }
    void *segs = c->land_segs;
    TIDE_CHECK(reserve(&segs, &c->land_cap, total, sizeof(tide_land_seg_t)));
    c->land_segs = segs;

    int n = 0;
    for (int s = 0; s < c->l; ++s) {
        int np;
        const tide_rs_piece_t *pcs = pieces_of(c, pass, s, &np);
        /* Row i of block s: this rank's partials of sub-slice s. */
        n = append_land_segs(c, pcs, np, ((uint64_t)s * c->l + (uint64_t)i) * c->e_sub, n);
    }

    tide_table_t tb = {0};
    tb.kind = TIDE_OP_LAND;
    tb.num_segs = n;
    tb.land_segs = c->land_segs;
    tb.num_in = c->l;
    const uint64_t gen_off = (uint64_t)gen * (uint64_t)c->l * c->block_bytes;
    for (int j = 0; j < c->l; ++j)
        tb.in[j] = tide_ref_arena(node * c->l + j, TIDE_REGION_INBOX, gen_off);
    return tide_program_add_table(c->prog, rank, &tb, index_out);
}

tide_result_t rs_add_land_table_m1(rs_ctx_t *c, int rank, int pass, int s, int *index_out) {
    const int i = rank % c->l, node = rank / c->l;
    int np;
    const tide_rs_piece_t *pcs = pieces_of(c, pass, s, &np);
    uint64_t total = 0;
    for (int x = 0; x < np; ++x)
        total += seg_chunks(pcs[x].len);
    void *segs = c->land_segs;
    TIDE_CHECK(reserve(&segs, &c->land_cap, total, sizeof(tide_land_seg_t)));
    c->land_segs = segs;

    /* Row i of rank s's spare block of the pass: this rank's partials of sub-slice s. */
    const int n = append_land_segs(c, pcs, np, (uint64_t)i * c->e_sub, 0);

    tide_table_t tb = {0};
    tb.kind = TIDE_OP_LAND;
    tb.num_segs = n;
    tb.land_segs = c->land_segs;
    tb.num_in = 1;
    tb.plus_zero = c->l > 1;
    /* Bank-0 offset: the LAND op is bank dependent. */
    tb.in[0] = tide_ref_arena(node * c->l + s, TIDE_REGION_SPARE, (uint64_t)pass * c->block_bytes);
    return tide_program_add_table(c->prog, rank, &tb, index_out);
}
