/*
 * check_data.c - I1 (every contributor lands exactly once, stale blocks are zeroed), traced
 * symbolically along one maximal run.
 *
 * Every element of every object carries a tag instead of a value: zero, undefined, or data
 * (the call that produced it, the element of the source it stands for, and the set of ranks
 * whose contributions it sums).  Sources are tagged when a call starts: element i of rank
 * u's shard is (e, i, {u}) (AG), element i of rank u's gradient of p is (e, p, i, {u}) (RS).
 * Arenas start zeroed; landings and outputs start undefined.  COPY / COPY2D move tags (and
 * must move whole elements of one size), ZERO clears, CAST maps fp32 elements to bf16 ones,
 * SUM and LAND union tags.  A union of two data tags must agree on call and element and must
 * not share a rank: sharing one is a contributor landed twice, another call's element is a
 * stale block that was not zeroed, another element is a misplaced block.  At each rank's
 * call-complete event the output must be exact: AG landing element k of Landing(p, u) is
 * (e, o_p + k, {u}); RS output element of G_p row r R_p + i is (e, p, element, all N ranks),
 * and padding rows are zero.
 *
 * When the program is race-free its data flow is the same in every schedule, so tracing one
 * run decides I1; races are reported (as I3 / I2) before any I1 finding.
 */
#include "program/check_internal.h"

#include "core/checks.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tags of an object, created on first use with the object's initial contents. */
static tide_result_t tags_of(chk_ctx_t *c, int obj, chk_tag_t **out) {
    chk_object_t *o = &c->objs[obj];
    if (o->tags != NULL) {
        *out = o->tags;
        return TIDE_SUCCESS;
    }
    const uint64_t n = o->bytes / o->elem;
    chk_tag_t *t = calloc(n ? n : 1, sizeof(*t));
    if (t == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "check: %" PRIu64 " element tags", n);
    for (uint64_t i = 0; i < n; ++i) {
        switch (o->kind) {
        case CHK_OBJ_ARENA:
            break; /* fresh arenas are zeroed */
        case CHK_OBJ_LANDING:
        case CHK_OBJ_OUT:
            t[i].state = CHK_TAG_UNDEF;
            break;
        default: /* shard, gradient: this rank's source elements of this call */
            t[i].state = CHK_TAG_DATA;
            t[i].epoch = (uint16_t)o->call;
            t[i].param = (int16_t)(o->kind == CHK_OBJ_GRAD ? o->sub : 0);
            t[i].elem = (uint32_t)i;
            t[i].ranks = (uint64_t)1 << o->rank;
            break;
        }
    }
    o->tags = t;
    *out = t;
    return TIDE_SUCCESS;
}

static void describe_tag(const chk_tag_t *t, char *buf, size_t len) {
    if (t->state == CHK_TAG_ZERO) {
        snprintf(buf, len, "zero");
        return;
    }
    if (t->state == CHK_TAG_UNDEF) {
        snprintf(buf, len, "undefined");
        return;
    }
    size_t used = (size_t)snprintf(buf, len, "call %u param %d element %u from ranks {",
                                   (unsigned)t->epoch, (int)t->param, (unsigned)t->elem);
    int shown = 0;
    for (int r = 0; r < 64 && used + 8 < len; ++r) {
        if (!(t->ranks >> r & 1)) continue;
        if (shown++ == 8) {
            used += (size_t)snprintf(buf + used, len - used, ",...");
            break;
        }
        used += (size_t)snprintf(buf + used, len - used, shown > 1 ? ",%d" : "%d", r);
    }
    if (used + 2 <= len) snprintf(buf + used, len - used, "}");
}

static bool same_tag(const chk_tag_t *a, const chk_tag_t *b) {
    if (a->state != b->state) return false;
    if (a->state != CHK_TAG_DATA) return true;
    return a->epoch == b->epoch && a->param == b->param && a->elem == b->elem &&
           a->ranks == b->ranks;
}

/* acc <- acc + x; false (with *why) when the two cannot be added. */
static bool tag_union(chk_tag_t *acc, const chk_tag_t *x, const char **why) {
    if (x->state == CHK_TAG_ZERO) return true;
    if (acc->state == CHK_TAG_ZERO) {
        *acc = *x;
        if (x->state == CHK_TAG_UNDEF) return (*why = "an undefined element"), false;
        return true;
    }
    if (acc->state == CHK_TAG_UNDEF || x->state == CHK_TAG_UNDEF)
        return (*why = "an undefined element"), false;
    if (acc->epoch != x->epoch) return (*why = "a stale element of another call"), false;
    if (acc->param != x->param || acc->elem != x->elem)
        return (*why = "a different element (misplaced data)"), false;
    if (acc->ranks & x->ranks) return (*why = "a contributor twice"), false;
    acc->ranks |= x->ranks;
    return true;
}

static void union_fail(chk_ctx_t *c, const tide_check_site_t *s, const char *why,
                       const chk_tag_t *a, const chk_tag_t *b, int obj, uint64_t elem) {
    char ta[160], tb[160], what[96];
    describe_tag(a, ta, sizeof(ta));
    describe_tag(b, tb, sizeof(tb));
    chk_describe_obj(c, obj, what, sizeof(what));
    chk_fail_i1(c, s,
                "rank %d queue %s op %d (%s) call %d adds %s: [%s] + [%s], writing element %" PRIu64
                " of the %s",
                s->rank, tide_queue_name((tide_queue_t)s->queue), s->op, chk_op_name(s->kind),
                s->call, why, ta, tb, elem, what);
}

/* Element index of byte `off` of obj, or false when it is not element aligned. */
static bool elem_at(const chk_ctx_t *c, int obj, uint64_t off, uint64_t *out) {
    const uint32_t e = c->objs[obj].elem;
    if (off % e != 0) return false;
    *out = off / e;
    return true;
}

static void misaligned(chk_ctx_t *c, const tide_check_site_t *s, const char *what) {
    chk_fail_i1(c, s, "rank %d queue %s op %d (%s) call %d %s: elements are split or mixed",
                s->rank, tide_queue_name((tide_queue_t)s->queue), s->op, chk_op_name(s->kind),
                s->call, what);
}

/* Move `bytes` of tags from (sobj, soff) to (dobj, doff). */
static tide_result_t move(chk_ctx_t *c, const tide_check_site_t *s, int dobj, uint64_t doff,
                          int sobj, uint64_t soff, uint64_t bytes) {
    uint64_t di, si;
    const uint32_t e = c->objs[dobj].elem;
    if (c->objs[sobj].elem != e || bytes % e != 0 || !elem_at(c, dobj, doff, &di) ||
        !elem_at(c, sobj, soff, &si)) {
        misaligned(c, s, "copies bytes that are not whole elements of one size");
        return TIDE_SUCCESS;
    }
    chk_tag_t *dt, *st;
    TIDE_CHECK(tags_of(c, dobj, &dt));
    TIDE_CHECK(tags_of(c, sobj, &st));
    memmove(dt + di, st + si, (size_t)(bytes / e) * sizeof(chk_tag_t));
    return TIDE_SUCCESS;
}

static tide_result_t copy(chk_ctx_t *c, const tide_op_t *op, const tide_check_site_t *s) {
    int dobj, sobj;
    uint64_t doff, soff;
    chk_resolve(c, &op->dst, op->bank_dep, s->rank, s->call, &dobj, &doff);
    chk_resolve(c, &op->src, op->bank_dep, s->rank, s->call, &sobj, &soff);
    if (op->kind == TIDE_OP_COPY) return move(c, s, dobj, doff, sobj, soff, op->bytes);
    for (uint64_t r = 0; r < op->rows && !c->i1_found; ++r)
        TIDE_CHECK(
            move(c, s, dobj, doff + r * op->dst_pitch, sobj, soff + r * op->src_pitch, op->bytes));
    return TIDE_SUCCESS;
}

static tide_result_t zero(chk_ctx_t *c, const tide_op_t *op, const tide_check_site_t *s) {
    int obj;
    uint64_t off, i;
    chk_resolve(c, &op->dst, op->bank_dep, s->rank, s->call, &obj, &off);
    if (!elem_at(c, obj, off, &i) || op->bytes % c->objs[obj].elem != 0) {
        misaligned(c, s, "zeroes bytes that are not whole elements");
        return TIDE_SUCCESS;
    }
    chk_tag_t *t;
    TIDE_CHECK(tags_of(c, obj, &t));
    memset(t + i, 0, (size_t)(op->bytes / c->objs[obj].elem) * sizeof(chk_tag_t));
    return TIDE_SUCCESS;
}

/* fp32 element i of the source becomes bf16 element i of the destination. */
static tide_result_t cast(chk_ctx_t *c, const tide_op_t *op, const tide_check_site_t *s) {
    int dobj, sobj;
    uint64_t doff, soff, di, si;
    chk_resolve(c, &op->dst, op->bank_dep, s->rank, s->call, &dobj, &doff);
    chk_resolve(c, &op->src, op->bank_dep, s->rank, s->call, &sobj, &soff);
    if (c->objs[sobj].elem != 4 || c->objs[dobj].elem != 2 || !elem_at(c, dobj, doff, &di) ||
        !elem_at(c, sobj, soff, &si)) {
        misaligned(c, s, "casts from something other than fp32 to bf16 elements");
        return TIDE_SUCCESS;
    }
    chk_tag_t *dt, *st;
    TIDE_CHECK(tags_of(c, dobj, &dt));
    TIDE_CHECK(tags_of(c, sobj, &st));
    memmove(dt + di, st + si, (size_t)(op->bytes / 2) * sizeof(chk_tag_t));
    return TIDE_SUCCESS;
}

/* Level-1 sum: staged contributions, then the own gradient; padding rows become zero. */
static tide_result_t sum(chk_ctx_t *c, const tide_op_t *op, const tide_check_site_t *s) {
    const tide_table_t *t = &c->prog->ranks[s->rank].tables[op->table];
    int out_obj, st_obj = -1;
    uint64_t out_off, st_off = 0, out0, st0 = 0;
    chk_resolve(c, &t->out, op->bank_dep, s->rank, s->call, &out_obj, &out_off);
    if (t->num_staged > 0)
        chk_resolve(c, &t->staged, op->bank_dep, s->rank, s->call, &st_obj, &st_off);
    if (c->objs[out_obj].elem != 4 || !elem_at(c, out_obj, out_off, &out0) ||
        (st_obj >= 0 &&
         (c->objs[st_obj].elem != c->plan->geom.grad_item || !elem_at(c, st_obj, st_off, &st0)))) {
        misaligned(c, s, "sums into or from buffers of the wrong element type");
        return TIDE_SUCCESS;
    }
    chk_tag_t *out, *st = NULL;
    TIDE_CHECK(tags_of(c, out_obj, &out));
    if (st_obj >= 0) TIDE_CHECK(tags_of(c, st_obj, &st));
    for (int g = 0; g < t->num_segs && !c->i1_found; ++g) {
        const tide_sum_seg_t *seg = &t->sum_segs[g];
        const int own_obj = chk_obj_grad(c, s->rank, s->call, seg->own_idx);
        chk_tag_t *own;
        TIDE_CHECK(tags_of(c, own_obj, &own));
        const uint32_t valid = seg->valid < seg->len ? seg->valid : seg->len;
        for (uint32_t i = 0; i < seg->len && !c->i1_found; ++i) {
            chk_tag_t acc = {0};
            const char *why = NULL;
            for (int k = 0; k < t->num_staged && i < valid && !c->i1_found; ++k) {
                const chk_tag_t *x = &st[st0 + (uint64_t)k * t->stage_stride + seg->stage_off + i];
                chk_tag_t before = acc;
                if (!tag_union(&acc, x, &why))
                    union_fail(c, s, why, &before, x, out_obj, out0 + seg->out_off + i);
            }
            if (i < valid && !c->i1_found) {
                const chk_tag_t *x = &own[seg->own_off + i];
                chk_tag_t before = acc;
                if (!tag_union(&acc, x, &why))
                    union_fail(c, s, why, &before, x, out_obj, out0 + seg->out_off + i);
            }
            out[out0 + seg->out_off + i] = acc;
        }
    }
    return TIDE_SUCCESS;
}

/* Landing: the inbox blocks of the node, then into (init) or onto the output. */
static tide_result_t land(chk_ctx_t *c, const tide_op_t *op, const tide_check_site_t *s) {
    const tide_table_t *t = &c->prog->ranks[s->rank].tables[op->table];
    chk_tag_t *in[TIDE_MAX_GPUS_PER_NODE], *out;
    uint64_t in0[TIDE_MAX_GPUS_PER_NODE];
    int in_obj[TIDE_MAX_GPUS_PER_NODE];
    for (int k = 0; k < t->num_in; ++k) {
        uint64_t off;
        chk_resolve(c, &t->in[k], op->bank_dep, s->rank, s->call, &in_obj[k], &off);
        if (c->objs[in_obj[k]].elem != (t->in_bf16 ? 2u : 4u) ||
            !elem_at(c, in_obj[k], off, &in0[k])) {
            misaligned(c, s, "lands from buffers of the wrong element type");
            return TIDE_SUCCESS;
        }
        TIDE_CHECK(tags_of(c, in_obj[k], &in[k]));
    }
    const int out_obj = chk_land_out(c, t, s->rank, s->call);
    TIDE_CHECK(tags_of(c, out_obj, &out));
    for (int g = 0; g < t->num_segs && !c->i1_found; ++g) {
        const tide_land_seg_t *seg = &t->land_segs[g];
        for (uint32_t i = 0; i < seg->len && !c->i1_found; ++i) {
            chk_tag_t v = {0};
            const char *why = NULL;
            for (int k = 0; k < t->num_in && !c->i1_found; ++k) {
                const chk_tag_t *x = &in[k][in0[k] + seg->in_off + i];
                chk_tag_t before = v;
                if (!tag_union(&v, x, &why))
                    union_fail(c, s, why, &before, x, out_obj, seg->out_off + i);
            }
            chk_tag_t *o = &out[seg->out_off + i];
            if (op->init) {
                *o = v;
            } else if (!c->i1_found) {
                chk_tag_t before = *o;
                if (o->state == CHK_TAG_UNDEF)
                    union_fail(c, s, "onto an output element no landing of this call initialised",
                               &before, &v, out_obj, seg->out_off + i);
                else if (!tag_union(o, &v, &why))
                    union_fail(c, s, why, &before, &v, out_obj, seg->out_off + i);
            }
        }
    }
    return TIDE_SUCCESS;
}

tide_result_t chk_data_op(chk_ctx_t *c, const tide_op_t *op, const tide_check_site_t *s) {
    if (c->i1_found) return TIDE_SUCCESS;
    switch (op->kind) {
    case TIDE_OP_COPY:
    case TIDE_OP_COPY2D:
        return copy(c, op, s);
    case TIDE_OP_ZERO:
        return zero(c, op, s);
    case TIDE_OP_CAST:
        return cast(c, op, s);
    case TIDE_OP_SUM:
        return sum(c, op, s);
    case TIDE_OP_LAND:
        return land(c, op, s);
    default:
        return TIDE_SUCCESS;
    }
}

static void wrong_output(chk_ctx_t *c, const tide_check_site_t *s, const char *where,
                         const chk_tag_t *got, const chk_tag_t *want) {
    char tg[160], tw[160];
    describe_tag(got, tg, sizeof(tg));
    describe_tag(want, tw, sizeof(tw));
    chk_fail_i1(c, s, "at rank %d's call-done event of call %d, %s holds [%s], expected [%s]",
                s->rank, s->call, where, tg, tw);
}

/* AG: every shard of every rank at Landing(p, u). */
static tide_result_t check_landing(chk_ctx_t *c, const tide_check_site_t *s) {
    const tide_geom_t *g = &c->plan->geom;
    const uint64_t b = g->ag_item;
    chk_tag_t *t;
    TIDE_CHECK(tags_of(c, chk_obj_landing(c, s->rank), &t));
    for (int p = 0; p < c->p && !c->i1_found; ++p)
        for (int u = 0; u < c->n && !c->i1_found; ++u) {
            const uint64_t base = tide_geom_landing(g, p, u) / b;
            for (uint64_t k = 0; k < g->params[p].shard_bytes / b; ++k) {
                chk_tag_t want = {CHK_TAG_DATA, (uint16_t)s->call, 0,
                                  (uint32_t)(g->params[p].offset / b + k), (uint64_t)1 << u};
                if (same_tag(&t[base + k], &want)) continue;
                char where[128];
                snprintf(where, sizeof(where),
                         "landing element %" PRIu64 " (param %d, shard of rank %d, element %" PRIu64
                         ")",
                         base + k, p, u, k);
                wrong_output(c, s, where, &t[base + k], &want);
                break;
            }
        }
    return TIDE_SUCCESS;
}

/* RS: every output element sums all N ranks' element once; padding rows are zero. */
static tide_result_t check_output(chk_ctx_t *c, const tide_check_site_t *s) {
    const tide_geom_t *g = &c->plan->geom;
    const uint64_t all = c->n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << c->n) - 1);
    chk_tag_t *t;
    TIDE_CHECK(tags_of(c, chk_obj_out(c, s->rank, s->call), &t));
    for (int p = 0; p < c->p && !c->i1_found; ++p) {
        const tide_geom_param_t *q = &g->params[p];
        const uint64_t real = q->dim0 * q->inner, first = (uint64_t)s->rank * q->shard_elems;
        for (uint64_t k = 0; k < q->shard_elems; ++k) {
            chk_tag_t want = {0};
            if (first + k < real)
                want = (chk_tag_t){CHK_TAG_DATA, (uint16_t)s->call, (int16_t)p,
                                   (uint32_t)(first + k), all};
            const chk_tag_t *got = &t[q->elem_offset + k];
            if (same_tag(got, &want)) continue;
            char where[128];
            snprintf(where, sizeof(where),
                     "output element %" PRIu64 " (param %d, element %" PRIu64 " of its shard)",
                     q->elem_offset + k, p, k);
            wrong_output(c, s, where, got, &want);
            break;
        }
    }
    return TIDE_SUCCESS;
}

tide_result_t chk_data_event(chk_ctx_t *c, int event, const tide_check_site_t *s) {
    if (c->i1_found || event != TIDE_EVENT_CALL_DONE) return TIDE_SUCCESS;
    return c->rs ? check_output(c, s) : check_landing(c, s);
}
