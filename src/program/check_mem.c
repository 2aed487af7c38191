/*
 * check_mem.c - the checker's memory: objects, references, and the happens-before race
 * detector behind I3 (storage reuse) and I2 (source liveness).
 *
 * Each object keeps a history of byte-range accesses (thread, that thread's clock, read or
 * write).  A new access conflicts with an earlier one when their ranges overlap, one of them
 * writes, and they come from different threads; it is ordered after it iff the new thread's
 * vector clock has seen the earlier access's clock (the earlier access ran first in this
 * schedule, so the other direction is impossible).  An unordered conflict is a race.  A
 * race-free write cuts every earlier access out of its range: anything later that is not
 * ordered after those accesses is not ordered after the write either, and races with it.
 *
 * The caller is part of the model: at the read-complete event (RS; call-complete for AG) it
 * may overwrite or free its sources, and at the call-complete event it reads its output or
 * landing.  These are recorded as accesses of the event's queue, so a program op that is not
 * ordered before the event races with the caller.  An op that runs after the event in the
 * schedule is a violation even when ordered after it: the caller was already told that the
 * sources are free or the output is final.
 */
#include "program/check_internal.h"

#include "core/checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NUM_REGIONS TIDE_REGION_COUNT

/* ------------------------------------------------------------------ objects */

int chk_obj_arena(const chk_ctx_t *c, int rank, int region) {
    (void)c;
    return rank * NUM_REGIONS + region;
}
int chk_obj_landing(const chk_ctx_t *c, int rank) {
    return c->n * NUM_REGIONS + rank;
}
static int operand_base(const chk_ctx_t *c, int rank, int call) {
    return c->n * (NUM_REGIONS + 1) + (call * c->n + rank) * (c->p + 2);
}
int chk_obj_shard(const chk_ctx_t *c, int rank, int call) {
    return operand_base(c, rank, call);
}
int chk_obj_out(const chk_ctx_t *c, int rank, int call) {
    return operand_base(c, rank, call) + 1;
}
int chk_obj_grad(const chk_ctx_t *c, int rank, int call, int param) {
    return operand_base(c, rank, call) + 2 + param;
}

/* Element size of an arena region for I1: AG bytes, gradient bytes or fp32 partials. */
static uint32_t region_elem(const struct tide_plan *plan, int region) {
    switch (region) {
    case TIDE_REGION_STAGING:
        return (uint32_t)plan->geom.grad_item;
    case TIDE_REGION_OUTBOX:
    case TIDE_REGION_SPARE:
        return 4;
    case TIDE_REGION_INBOX:
        /* The rail lane's inbox holds gradient pieces as they were put (compile_lane.c). */
        return plan->rs.rail_lane ? (uint32_t)plan->geom.grad_item : 4;
    case TIDE_REGION_SIGNALS:
        return 8;
    default:
        return (uint32_t)plan->geom.ag_item;
    }
}

static void set_obj(chk_object_t *o, int kind, int rank, int sub, int call, uint64_t bytes,
                    uint32_t elem) {
    o->kind = (uint8_t)kind;
    o->rank = rank;
    o->sub = sub;
    o->call = call;
    o->bytes = bytes;
    o->elem = elem;
}

tide_result_t chk_objects_init(chk_ctx_t *c) {
    const struct tide_plan *plan = c->plan;
    const tide_geom_t *g = &plan->geom;
    c->num_objs = c->n * (NUM_REGIONS + 1) + c->calls * c->n * (c->p + 2);
    c->objs = calloc((size_t)c->num_objs, sizeof(*c->objs));
    if (c->objs == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "check: %d objects", c->num_objs);
    for (int r = 0; r < c->n; ++r) {
        for (int reg = 0; reg < NUM_REGIONS; ++reg)
            set_obj(&c->objs[chk_obj_arena(c, r, reg)], CHK_OBJ_ARENA, r, reg, -1,
                    plan->arena.regions[reg].bytes, region_elem(plan, reg));
        set_obj(&c->objs[chk_obj_landing(c, r)], CHK_OBJ_LANDING, r, 0, -1,
                plan->arena.regions[TIDE_REGION_LANDING0].bytes, (uint32_t)g->ag_item);
    }
    /* I1 tags name ranks in a 64-bit set and elements in 32 bits. */
    c->i1_able = c->n <= 64 && c->calls <= UINT16_MAX;
    for (int e = 0; e < c->calls; ++e)
        for (int r = 0; r < c->n; ++r) {
            set_obj(&c->objs[chk_obj_shard(c, r, e)], CHK_OBJ_SHARD, r, 0, e,
                    g->cast ? g->fp32_shard_bytes : g->shard_bytes,
                    g->cast ? 4u : (uint32_t)g->ag_item);
            set_obj(&c->objs[chk_obj_out(c, r, e)], CHK_OBJ_OUT, r, 0, e, g->fp32_shard_bytes, 4);
            for (int p = 0; p < c->p; ++p) {
                uint64_t elems = 0, bytes = UINT64_MAX;
                if (tide_mul_u64(g->params[p].dim0, g->params[p].inner, &elems))
                    (void)tide_mul_u64(elems, (uint64_t)g->grad_item, &bytes);
                if (elems > UINT32_MAX || g->shard_elems > UINT32_MAX) c->i1_able = false;
                set_obj(&c->objs[chk_obj_grad(c, r, e, p)], CHK_OBJ_GRAD, r, p, e, bytes,
                        (uint32_t)g->grad_item);
            }
        }
    return TIDE_SUCCESS;
}

void chk_objects_reset(chk_ctx_t *c) {
    for (int i = 0; i < c->num_objs; ++i) {
        c->objs[i].num_acc = 0;
        free(c->objs[i].tags);
        c->objs[i].tags = NULL;
    }
}

void chk_objects_free(chk_ctx_t *c) {
    if (c->objs == NULL) return;
    for (int i = 0; i < c->num_objs; ++i) {
        free(c->objs[i].acc);
        free(c->objs[i].tags);
    }
    free(c->objs);
    c->objs = NULL;
}

void chk_resolve(const chk_ctx_t *c, const tide_ref_t *ref, bool bank_dep, int rank, int call,
                 int *obj_out, uint64_t *offset_out) {
    uint64_t off = ref->offset;
    switch (ref->kind) {
    case TIDE_REF_ARENA: {
        *obj_out = chk_obj_arena(c, ref->rank, ref->region);
        uint64_t shift;
        /* Banked regions: bank e mod 2 (what the fabric adds at bind time). */
        if (bank_dep &&
            (!tide_mul_u64((uint64_t)(call % 2), c->prog->bank_bytes[ref->region], &shift) ||
             !tide_add_u64(off, shift, &off)))
            off = UINT64_MAX; /* out of bounds of every object */
        break;
    }
    case TIDE_REF_LANDING:
        *obj_out = chk_obj_landing(c, ref->rank);
        break;
    case TIDE_REF_SHARD:
        *obj_out = chk_obj_shard(c, ref->rank >= 0 ? ref->rank : rank, call);
        break;
    case TIDE_REF_OUT:
        *obj_out = chk_obj_out(c, ref->rank >= 0 ? ref->rank : rank, call);
        break;
    default: /* TIDE_REF_GRAD (the IR pass admits nothing else); a rank: a peer's, in place */
        *obj_out = chk_obj_grad(c, ref->rank >= 0 ? ref->rank : rank, call, ref->param);
        break;
    }
    *offset_out = off;
}

static const char *region_label(int region) {
    return tide_region_name((tide_region_t)region);
}

void chk_describe_obj(const chk_ctx_t *c, int obj, char *buf, size_t len) {
    const chk_object_t *o = &c->objs[obj];
    switch (o->kind) {
    case CHK_OBJ_ARENA:
        snprintf(buf, len, "%s region of rank %d", region_label(o->sub), o->rank);
        break;
    case CHK_OBJ_LANDING:
        snprintf(buf, len, "landing slot of rank %d", o->rank);
        break;
    case CHK_OBJ_SHARD:
        snprintf(buf, len, "shard operand of rank %d (call %d)", o->rank, o->call);
        break;
    case CHK_OBJ_OUT:
        snprintf(buf, len, "output operand of rank %d (call %d)", o->rank, o->call);
        break;
    default:
        snprintf(buf, len, "gradient %d of rank %d (call %d)", o->sub, o->rank, o->call);
        break;
    }
}

/* ------------------------------------------------------------------ spans of an op */

typedef struct {
    int obj;
    uint64_t lo, hi;
    bool write;
} span_t;

#define MAX_SPANS_INLINE 64

typedef struct {
    span_t *v;
    int num, cap;
    span_t inline_v[MAX_SPANS_INLINE];
    bool overflow; /* an extent did not fit in 64 bits */
} spans_t;

static tide_result_t add_span(spans_t *s, int obj, uint64_t off, uint64_t bytes, bool write) {
    if (bytes == 0) return TIDE_SUCCESS;
    uint64_t hi;
    if (!tide_add_u64(off, bytes, &hi)) {
        s->overflow = true;
        hi = UINT64_MAX;
    }
    if (s->num == s->cap) {
        int cap = s->cap * 2;
        span_t *v = malloc((size_t)cap * sizeof(*v));
        if (v == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "check: %d access spans", cap);
        memcpy(v, s->v, (size_t)s->num * sizeof(*v));
        if (s->v != s->inline_v) free(s->v);
        s->v = v;
        s->cap = cap;
    }
    s->v[s->num++] = (span_t){obj, off, hi, write};
    return TIDE_SUCCESS;
}

/* off + a * b, saturating (an out-of-range offset then fails the bounds check). */
static uint64_t off_mul_add(uint64_t off, uint64_t a, uint64_t b) {
    uint64_t t;
    if (!tide_mul_u64(a, b, &t) || !tide_add_u64(off, t, &t)) return UINT64_MAX;
    return t;
}

static tide_result_t sum_spans(const chk_ctx_t *c, int rank, int call, const tide_op_t *op,
                               spans_t *s) {
    const tide_table_t *t = &c->prog->ranks[rank].tables[op->table];
    const uint64_t item = c->plan->geom.grad_item;
    int out_obj, st_obj = -1;
    uint64_t out_off, st_off = 0;
    chk_resolve(c, &t->out, op->bank_dep, rank, call, &out_obj, &out_off);
    if (t->num_staged > 0) chk_resolve(c, &t->staged, op->bank_dep, rank, call, &st_obj, &st_off);
    for (int i = 0; i < t->num_segs; ++i) {
        const tide_sum_seg_t *g = &t->sum_segs[i];
        const uint64_t valid = g->valid < g->len ? g->valid : g->len;
        for (int k = 0; k < t->num_staged && valid > 0; ++k) {
            uint64_t e = off_mul_add(g->stage_off, (uint64_t)k, t->stage_stride);
            TIDE_CHECK(add_span(s, st_obj, off_mul_add(st_off, e, item), valid * item, false));
        }
        if (valid > 0)
            TIDE_CHECK(add_span(s, chk_obj_grad(c, rank, call, g->own_idx),
                                off_mul_add(0, g->own_off, item), valid * item, false));
        TIDE_CHECK(add_span(s, out_obj, off_mul_add(out_off, g->out_off, 4), 4ull * g->len, true));
    }
    return TIDE_SUCCESS;
}

static tide_result_t land_spans(const chk_ctx_t *c, int rank, int call, const tide_op_t *op,
                                spans_t *s) {
    const tide_table_t *t = &c->prog->ranks[rank].tables[op->table];
    int in_obj[TIDE_MAX_GPUS_PER_NODE];
    uint64_t in_off[TIDE_MAX_GPUS_PER_NODE];
    for (int k = 0; k < t->num_in; ++k)
        chk_resolve(c, &t->in[k], op->bank_dep, rank, call, &in_obj[k], &in_off[k]);
    const int out = chk_land_out(c, t, rank, call);
    const uint64_t item = t->in_bf16 ? 2 : 4;
    for (int i = 0; i < t->num_segs; ++i) {
        const tide_land_seg_t *g = &t->land_segs[i];
        for (int k = 0; k < t->num_in; ++k)
            TIDE_CHECK(add_span(s, in_obj[k], off_mul_add(in_off[k], g->in_off, item),
                                item * g->len, false));
        TIDE_CHECK(add_span(s, out, off_mul_add(0, g->out_off, 4), 4ull * g->len, true));
    }
    return TIDE_SUCCESS;
}

int chk_land_out(const chk_ctx_t *c, const tide_table_t *t, int rank, int call) {
    return chk_obj_out(c, t->out.kind == TIDE_REF_OUT && t->out.rank >= 0 ? t->out.rank : rank,
                       call);
}

/* Every byte range op reads or writes, reads first. */
static tide_result_t op_spans(const chk_ctx_t *c, int rank, int call, const tide_op_t *op,
                              spans_t *s) {
    int dobj, sobj;
    uint64_t doff, soff;
    const bool bank = op->bank_dep != 0;
    switch (op->kind) {
    case TIDE_OP_COPY:
    case TIDE_OP_CAST:
        chk_resolve(c, &op->src, bank, rank, call, &sobj, &soff);
        chk_resolve(c, &op->dst, bank, rank, call, &dobj, &doff);
        TIDE_CHECK(
            add_span(s, sobj, soff, op->kind == TIDE_OP_CAST ? 2 * op->bytes : op->bytes, false));
        return add_span(s, dobj, doff, op->bytes, true);
    case TIDE_OP_COPY2D:
        chk_resolve(c, &op->src, bank, rank, call, &sobj, &soff);
        chk_resolve(c, &op->dst, bank, rank, call, &dobj, &doff);
        for (uint64_t row = 0; row < op->rows; ++row) {
            TIDE_CHECK(add_span(s, sobj, off_mul_add(soff, row, op->src_pitch), op->bytes, false));
            TIDE_CHECK(add_span(s, dobj, off_mul_add(doff, row, op->dst_pitch), op->bytes, true));
        }
        return TIDE_SUCCESS;
    case TIDE_OP_ZERO:
        chk_resolve(c, &op->dst, bank, rank, call, &dobj, &doff);
        return add_span(s, dobj, doff, op->bytes, true);
    case TIDE_OP_SUM:
        return sum_spans(c, rank, call, op, s);
    case TIDE_OP_LAND:
        return land_spans(c, rank, call, op, s);
    default:
        return TIDE_SUCCESS;
    }
}

/* ------------------------------------------------------------------ race detector */

static tide_result_t hist_reserve(chk_object_t *o, int need) {
    if (need <= o->cap_acc) return TIDE_SUCCESS;
    int cap = o->cap_acc ? o->cap_acc : 16;
    while (cap < need)
        cap *= 2;
    chk_access_t *a = realloc(o->acc, (size_t)cap * sizeof(*a));
    if (a == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "check: %d accesses of one object", cap);
    o->acc = a;
    o->cap_acc = cap;
    return TIDE_SUCCESS;
}

/* Remove [lo, hi) from every record (splitting records that straddle it). */
static tide_result_t hist_cut(chk_object_t *o, uint64_t lo, uint64_t hi) {
    int splits = 0;
    for (int i = 0; i < o->num_acc; ++i)
        splits += o->acc[i].lo < lo && o->acc[i].hi > hi;
    TIDE_CHECK(hist_reserve(o, o->num_acc + splits + 1));
    const int n = o->num_acc;
    int j = 0, tail = 0;
    for (int i = 0; i < n; ++i) {
        chk_access_t a = o->acc[i];
        if (a.hi <= lo || a.lo >= hi) {
            o->acc[j++] = a;
            continue;
        }
        if (a.lo < lo && a.hi > hi) {
            chk_access_t right = a;
            right.lo = hi;
            o->acc[n + tail++] = right;
        }
        if (a.lo < lo) {
            a.hi = lo;
            o->acc[j++] = a;
        } else if (a.hi > hi) {
            a.lo = hi;
            o->acc[j++] = a;
        }
    }
    memmove(o->acc + j, o->acc + n, (size_t)tail * sizeof(chk_access_t));
    o->num_acc = j + tail;
    return TIDE_SUCCESS;
}

static void describe_access(const chk_ctx_t *c, const chk_access_t *a, bool write, char *buf,
                            size_t len) {
    int rank = (int)a->thread / TIDE_Q_COUNT, q = (int)a->thread % TIDE_Q_COUNT;
    if (a->user && a->op < 0)
        snprintf(buf, len, "the caller of rank %d entering call %d writes", rank, a->call);
    else if (a->user)
        snprintf(buf, len, "the caller of rank %d after its %s event of call %d %s", rank,
                 a->op == TIDE_EVENT_READ_DONE ? "read-done" : "call-done", a->call,
                 write ? "releases" : "reads");
    else
        snprintf(buf, len, "rank %d queue %s op %d (%s) call %d %s", rank,
                 tide_queue_name((tide_queue_t)q), a->op, chk_op_name(a->kind), a->call,
                 write ? "writes" : "reads");
    (void)c;
}

static bool source_obj(const chk_object_t *o) {
    return o->kind == CHK_OBJ_SHARD || o->kind == CHK_OBJ_GRAD;
}

/* Check one access against the history, then record it. */
static tide_result_t access(chk_ctx_t *c, int t, int obj, uint64_t lo, uint64_t hi, bool write,
                            const chk_access_t *self) {
    chk_object_t *o = &c->objs[obj];
    const uint32_t *vc = c->vc + (size_t)t * (size_t)c->threads;
    for (int i = 0; i < o->num_acc; ++i) {
        const chk_access_t *a = &o->acc[i];
        if (a->hi <= lo || a->lo >= hi || (!write && !a->write) || a->thread == (uint32_t)t)
            continue;
        if (vc[a->thread] >= a->clock) continue; /* ordered after it */
        char what[96], mine[160], theirs[160];
        chk_describe_obj(c, obj, what, sizeof(what));
        describe_access(c, self, write, mine, sizeof(mine));
        describe_access(c, a, a->write, theirs, sizeof(theirs));
        tide_check_site_t s, other;
        chk_site(&s, t / TIDE_Q_COUNT, t % TIDE_Q_COUNT, self->user ? -1 : self->op,
                 self->user ? TIDE_OP_EVENT : self->kind, self->call);
        chk_site(&other, (int)a->thread / TIDE_Q_COUNT, (int)a->thread % TIDE_Q_COUNT,
                 a->user ? -1 : a->op, a->user ? TIDE_OP_EVENT : a->kind, a->call);
        chk_fail(c, source_obj(o) ? TIDE_CHECK_I2 : TIDE_CHECK_I3, &s, &other,
                 "race on %s bytes [%llu, %llu): %s, %s bytes [%llu, %llu), and neither "
                 "happens before the other",
                 what, (unsigned long long)(lo > a->lo ? lo : a->lo),
                 (unsigned long long)(hi < a->hi ? hi : a->hi), mine, theirs,
                 (unsigned long long)a->lo, (unsigned long long)a->hi);
        return TIDE_SUCCESS;
    }
    if (write) TIDE_CHECK(hist_cut(o, lo, hi));
    TIDE_CHECK(hist_reserve(o, o->num_acc + 1));
    chk_access_t a = *self;
    a.lo = lo;
    a.hi = hi;
    a.write = write;
    o->acc[o->num_acc++] = a;
    return TIDE_SUCCESS;
}

static bool event_seen(const chk_ctx_t *c, int rank, int call, int event) {
    return c->events[((size_t)rank * (size_t)c->calls + (size_t)call) * TIDE_EVENT_COUNT +
                     (size_t)event] != 0;
}

/* The event after which the caller may release this call's sources. */
static int source_event(const chk_ctx_t *c) {
    return c->rs ? TIDE_EVENT_READ_DONE : TIDE_EVENT_CALL_DONE;
}

/* An access the program makes after the caller was told it would not. */
static void after_event(chk_ctx_t *c, const span_t *sp, const tide_check_site_t *s) {
    const chk_object_t *o = &c->objs[sp->obj];
    char what[96];
    chk_describe_obj(c, sp->obj, what, sizeof(what));
    if (source_obj(o) && event_seen(c, o->rank, o->call, source_event(c))) {
        chk_fail(c, TIDE_CHECK_I2, s, NULL,
                 "rank %d queue %s op %d (%s) call %d %s %s after its %s event", s->rank,
                 tide_queue_name((tide_queue_t)s->queue), s->op, chk_op_name(s->kind), s->call,
                 sp->write ? "writes" : "reads", what, c->rs ? "read-done" : "call-done");
        return;
    }
    if (!sp->write) return;
    int rank = -1, call = -1;
    if (o->kind == CHK_OBJ_OUT) {
        rank = o->rank;
        call = o->call;
    } else if (o->kind == CHK_OBJ_LANDING && !c->rs) {
        rank = o->rank;
        call = s->call;
    }
    if (rank >= 0 && event_seen(c, rank, call, TIDE_EVENT_CALL_DONE))
        chk_fail(c, TIDE_CHECK_I3, s, NULL,
                 "rank %d queue %s op %d (%s) call %d writes %s after rank %d's call-done event "
                 "of call %d",
                 s->rank, tide_queue_name((tide_queue_t)s->queue), s->op, chk_op_name(s->kind),
                 s->call, what, rank, call);
}

tide_result_t chk_mem_op(chk_ctx_t *c, int t, const tide_op_t *op, const tide_check_site_t *s) {
    spans_t sp = {0};
    sp.v = sp.inline_v;
    sp.cap = MAX_SPANS_INLINE;
    tide_result_t res = op_spans(c, s->rank, s->call, op, &sp);
    if (res != TIDE_SUCCESS) goto out;
    chk_access_t self = {0};
    self.thread = (uint32_t)t;
    self.clock = c->vc[(size_t)t * (size_t)c->threads + (size_t)t];
    self.kind = (uint8_t)op->kind;
    self.op = s->op;
    self.call = s->call;
    for (int i = 0; i < sp.num && !c->found; ++i) {
        const span_t *x = &sp.v[i];
        const chk_object_t *o = &c->objs[x->obj];
        if (sp.overflow || x->hi > o->bytes) {
            char what[96];
            chk_describe_obj(c, x->obj, what, sizeof(what));
            chk_fail(c, TIDE_CHECK_BOUNDS, s, NULL,
                     "rank %d queue %s op %d (%s) call %d %s bytes [%llu, %llu) of the %llu-byte "
                     "%s",
                     s->rank, tide_queue_name((tide_queue_t)s->queue), s->op, chk_op_name(op->kind),
                     s->call, x->write ? "writes" : "reads", (unsigned long long)x->lo,
                     (unsigned long long)x->hi, (unsigned long long)o->bytes, what);
            break;
        }
        after_event(c, x, s);
        if (c->found) break;
        TIDE_CHECK_GOTO(access(c, t, x->obj, x->lo, x->hi, x->write, &self), res, out);
    }
out:
    if (sp.v != sp.inline_v) free(sp.v);
    return res;
}

tide_result_t chk_mem_entry(chk_ctx_t *c, int t, int rank, int call) {
    chk_access_t self = {0};
    self.thread = (uint32_t)t;
    self.clock = c->vc[(size_t)t * (size_t)c->threads + (size_t)t];
    self.kind = TIDE_OP_EVENT;
    self.user = 1;
    self.op = -1;
    self.call = call;
    int obj = chk_obj_out(c, rank, call);
    TIDE_CHECK(access(c, t, obj, 0, c->objs[obj].bytes, true, &self));
    for (int p = 0; p < c->p && !c->found; ++p) {
        obj = chk_obj_grad(c, rank, call, p);
        TIDE_CHECK(access(c, t, obj, 0, c->objs[obj].bytes, true, &self));
    }
    return TIDE_SUCCESS;
}

tide_result_t chk_mem_event(chk_ctx_t *c, int t, int event, const tide_check_site_t *s) {
    const int rank = s->rank, call = s->call;
    chk_access_t self = {0};
    self.thread = (uint32_t)t;
    self.clock = c->vc[(size_t)t * (size_t)c->threads + (size_t)t];
    self.kind = TIDE_OP_EVENT;
    self.user = 1;
    self.op = event;
    self.call = call;
    if (event == source_event(c)) {
        /* The caller may now overwrite or free the call's sources. */
        int obj = chk_obj_shard(c, rank, call);
        TIDE_CHECK(access(c, t, obj, 0, c->objs[obj].bytes, true, &self));
        for (int p = 0; p < c->p && !c->found; ++p) {
            obj = chk_obj_grad(c, rank, call, p);
            TIDE_CHECK(access(c, t, obj, 0, c->objs[obj].bytes, true, &self));
        }
    }
    if (event == TIDE_EVENT_CALL_DONE && !c->found) {
        /* The caller consumes the output (RS) or the landing (AG). */
        int obj = c->rs ? chk_obj_out(c, rank, call) : chk_obj_landing(c, rank);
        TIDE_CHECK(access(c, t, obj, 0, c->objs[obj].bytes, false, &self));
    }
    c->events[((size_t)rank * (size_t)c->calls + (size_t)call) * TIDE_EVENT_COUNT + (size_t)event] =
        1;
    return TIDE_SUCCESS;
}
