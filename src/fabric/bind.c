/*
 * bind.c - resolve a program's symbolic references to addresses for one call.
 *
 * Shared by every fabric: the arithmetic is the same whether the bases are host mappings or
 * device pointers.  Each reference is checked against the region or operand it names, with
 * the RS bank of the epoch applied, so that a malformed program (or one mutated by fault
 * injection) is reported with the rank, queue and op rather than corrupting a neighbour.
 */
#include "core/checks.h"
#include "fabric/fabric.h"
#include "program/machine.h"

#include <inttypes.h>

/* Names the op in messages. */
typedef struct {
    int rank;
    tide_queue_t q;
    int index;
    int kind;
} op_where_t;

#define WHERE_FMT "rank %d queue %s op %d (%s)"
#define WHERE_ARGS(w) (w)->rank, tide_queue_name((w)->q), (w)->index, tide_op_kind_name((w)->kind)

uint64_t tide_bind_shard_bytes(const struct tide_plan *plan) {
    /* 4 sum R_p K_p = S_fp32, which the geometry bounded. */
    return plan->geom.cast ? plan->geom.fp32_shard_bytes : plan->geom.shard_bytes;
}

tide_result_t tide_bind_region(const struct tide_fabric_arena *arena, const struct tide_plan *plan,
                               int rank, tide_region_t region, void **ptr_out) {
    if (rank < 0 || rank >= arena->world->ranks || (int)region < 0 ||
        (int)region >= TIDE_REGION_COUNT)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "bind: rank %d / region %d out of range", rank,
                        (int)region);
    *ptr_out = arena->bases[rank] + plan->arena.regions[region].offset;
    return TIDE_SUCCESS;
}

tide_result_t tide_bind_shard(const struct tide_plan *plan, const struct tide_fabric_arena *arena,
                              const void *shard, const void **shard_out) {
    if (shard != NULL) {
        *shard_out = shard;
        return TIDE_SUCCESS;
    }
    if (plan->geom.cast)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "all_gather: shard = NULL reads the resident region, which a casting "
                        "group (fp32 master -> bf16) does not have; pass the fp32 shard");
    void *p = NULL;
    TIDE_CHECK(tide_bind_region(arena, plan, arena->world->rank, TIDE_REGION_RESIDENT, &p));
    *shard_out = p;
    return TIDE_SUCCESS;
}

/* offset + extent <= size without overflow. */
static bool fits(uint64_t offset, uint64_t extent, uint64_t size) {
    return offset <= size && extent <= size - offset;
}

/* Bytes of parameter p's gradient operand: D_p K_p b_grad. */
static bool grad_bytes(const struct tide_plan *plan, int p, uint64_t *out) {
    const tide_geom_param_t *q = &plan->geom.params[p];
    uint64_t elems;
    return tide_mul_u64(q->dim0, q->inner, &elems) &&
           tide_mul_u64(elems, (uint64_t)plan->geom.grad_item, out);
}

/* Resolve `ref` for `extent` bytes; `what` names the operand in messages. */
static tide_result_t resolve(const tide_binding_t *b, const tide_program_t *prog,
                             const op_where_t *w, const char *what, const tide_ref_t *ref,
                             bool bank_dep, uint64_t extent, void **ptr_out) {
    const struct tide_plan *plan = b->plan;
    const int n = b->arena->world->ranks;
    uint8_t *base = NULL;
    uint64_t size = 0, offset = ref->offset;

    switch (ref->kind) {
    case TIDE_REF_ARENA:
    case TIDE_REF_LANDING: {
        int region = ref->kind == TIDE_REF_LANDING ? TIDE_REGION_LANDING0 + b->slot : ref->region;
        if (ref->rank < 0 || ref->rank >= n || region < 0 || region >= TIDE_REGION_COUNT)
            return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": %s names rank %d region %d of %d ranks",
                            WHERE_ARGS(w), what, ref->rank, region, n);
        if (bank_dep && ref->kind == TIDE_REF_ARENA) {
            uint64_t shift;
            if (!tide_mul_u64(b->epoch % 2, prog->bank_bytes[region], &shift) ||
                !tide_add_u64(offset, shift, &offset))
                return TIDE_ERR(TIDE_ERR_OVERFLOW, WHERE_FMT ": %s bank offset overflows",
                                WHERE_ARGS(w), what);
        }
        base = b->arena->bases[ref->rank] + plan->arena.regions[region].offset;
        size = plan->arena.regions[region].bytes;
        break;
    }
    case TIDE_REF_SHARD:
        base = (uint8_t *)(uintptr_t)b->shard;
        size = tide_bind_shard_bytes(plan);
        break;
    case TIDE_REF_GRAD:
        if (ref->param < 0 || ref->param >= plan->geom.num_params || b->grads == NULL ||
            !grad_bytes(plan, ref->param, &size))
            return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": %s names gradient %d of P = %d",
                            WHERE_ARGS(w), what, ref->param, plan->geom.num_params);
        base = (uint8_t *)(uintptr_t)b->grads[ref->param];
        break;
    case TIDE_REF_OUT:
        base = (uint8_t *)b->out;
        size = plan->geom.fp32_shard_bytes;
        break;
    default:
        return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": %s has reference kind %d", WHERE_ARGS(w),
                        what, (int)ref->kind);
    }
    if (base == NULL)
        return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": %s operand (kind %d) is not bound",
                        WHERE_ARGS(w), what, (int)ref->kind);
    if (!fits(offset, extent, size))
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        WHERE_FMT ": %s [%" PRIu64 ", +%" PRIu64 ") outside its %" PRIu64
                                  " bytes (reference kind %d, rank %d, region %d)",
                        WHERE_ARGS(w), what, offset, extent, size, (int)ref->kind, ref->rank,
                        (int)ref->region);
    *ptr_out = base + offset;
    return TIDE_SUCCESS;
}

/* Counter `ctr` of rank `rank`. */
static tide_result_t counter(const tide_binding_t *b, const op_where_t *w, int rank, int ctr,
                             uint64_t **ptr_out) {
    const tide_region_info_t *sig = &b->plan->arena.regions[TIDE_REGION_SIGNALS];
    if (rank < 0 || rank >= b->arena->world->ranks || ctr < 0 ||
        (uint64_t)ctr >= sig->bytes / sizeof(uint64_t))
        return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": counter %d of rank %d out of range",
                        WHERE_ARGS(w), ctr, rank);
    *ptr_out = (uint64_t *)(void *)(b->arena->bases[rank] + sig->offset) + ctr;
    return TIDE_SUCCESS;
}

static tide_result_t lookup_op(const tide_binding_t *b, const tide_program_t *prog, tide_queue_t q,
                               int index, const tide_op_t **op_out, op_where_t *w) {
    if (b->rank < 0 || b->rank >= prog->num_ranks || (unsigned)q >= TIDE_Q_COUNT)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "bind: rank %d / queue %d outside the program", b->rank,
                        (int)q);
    const tide_queue_ops_t *ops = &prog->ranks[b->rank].queues[q];
    if (index < 0 || index >= ops->num_ops)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "bind: rank %d queue %s has no op %d", b->rank,
                        tide_queue_name(q), index);
    *op_out = &ops->ops[index];
    w->rank = b->rank;
    w->q = q;
    w->index = index;
    w->kind = (*op_out)->kind;
    return TIDE_SUCCESS;
}

/* Bytes a 2D copy spans: (rows - 1) pitch + bytes. */
static bool span_2d(uint64_t rows, uint64_t pitch, uint64_t bytes, uint64_t *out) {
    if (rows == 0) return (*out = 0, true);
    uint64_t t;
    return tide_mul_u64(rows - 1, pitch, &t) && tide_add_u64(t, bytes, out);
}

tide_result_t tide_bind_op(const tide_binding_t *b, const tide_program_t *prog, tide_queue_t q,
                           int index, tide_bound_op_t *out) {
    const tide_op_t *op = NULL;
    op_where_t w;
    TIDE_CHECK(lookup_op(b, prog, q, index, &op, &w));
    tide_bound_op_t r = {0};
    void *p;
    const bool bank = op->bank_dep != 0;

    switch (op->kind) {
    case TIDE_OP_COPY:
        TIDE_CHECK(resolve(b, prog, &w, "dst", &op->dst, bank, op->bytes, &r.dst));
        TIDE_CHECK(resolve(b, prog, &w, "src", &op->src, bank, op->bytes, &p));
        r.src = p;
        break;
    case TIDE_OP_COPY2D: {
        uint64_t dspan, sspan;
        if (op->rows > 0 && (op->dst_pitch < op->bytes || op->src_pitch < op->bytes))
            return TIDE_ERR(TIDE_ERR_INTERNAL,
                            WHERE_FMT ": pitches (dst %" PRIu64 ", src %" PRIu64
                                      ") below the row bytes %" PRIu64,
                            WHERE_ARGS(&w), op->dst_pitch, op->src_pitch, op->bytes);
        if (!span_2d(op->rows, op->dst_pitch, op->bytes, &dspan) ||
            !span_2d(op->rows, op->src_pitch, op->bytes, &sspan))
            return TIDE_ERR(TIDE_ERR_OVERFLOW, WHERE_FMT ": 2D extent overflows", WHERE_ARGS(&w));
        TIDE_CHECK(resolve(b, prog, &w, "dst", &op->dst, bank, dspan, &r.dst));
        TIDE_CHECK(resolve(b, prog, &w, "src", &op->src, bank, sspan, &p));
        r.src = p;
        break;
    }
    case TIDE_OP_SIGNAL:
        TIDE_CHECK(counter(b, &w, op->sig_rank, op->ctr, &r.signal));
        break;
    case TIDE_OP_WAIT: {
        int64_t t;
        if (!tide_machine_wait_target(b->epoch, op, &t))
            return TIDE_ERR(TIDE_ERR_OVERFLOW,
                            WHERE_FMT ": target epoch %" PRIu64 " x %" PRId64 " + %" PRId64
                                      " overflows",
                            WHERE_ARGS(&w), b->epoch, op->inc, op->thr);
        TIDE_CHECK(counter(b, &w, b->rank, op->ctr, &r.wait_ctr));
        r.wait_target = t;
        break;
    }
    case TIDE_OP_ZERO:
        TIDE_CHECK(resolve(b, prog, &w, "dst", &op->dst, bank, op->bytes, &r.dst));
        break;
    case TIDE_OP_CAST:
        /* bytes counts the bf16 output; the fp32 input is twice as long. */
        if (op->bytes % 2 != 0 || op->bytes > UINT64_MAX / 2)
            return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": %" PRIu64 " bf16 bytes", WHERE_ARGS(&w),
                            op->bytes);
        TIDE_CHECK(resolve(b, prog, &w, "dst", &op->dst, bank, op->bytes, &r.dst));
        TIDE_CHECK(resolve(b, prog, &w, "src", &op->src, bank, op->bytes * 2, &p));
        r.src = p;
        break;
    case TIDE_OP_SUM:
    case TIDE_OP_LAND:
        break; /* tables: tide_bind_sum / tide_bind_land */
    case TIDE_OP_EVENT:
        if (op->event >= TIDE_EVENT_COUNT)
            return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": event %d", WHERE_ARGS(&w), op->event);
        break;
    default:
        return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": unknown op kind %d", WHERE_ARGS(&w),
                        op->kind);
    }
    if (op->kind != TIDE_OP_SIGNAL && tide_machine_signals(op))
        TIDE_CHECK(counter(b, &w, op->sig_rank, op->ctr, &r.signal));
    *out = r;
    return TIDE_SUCCESS;
}

static tide_result_t lookup_table(const tide_binding_t *b, const tide_program_t *prog,
                                  const tide_op_t *op, const op_where_t *w, int kind,
                                  const tide_table_t **table_out) {
    const tide_rank_program_t *rp = &prog->ranks[b->rank];
    if (op->kind != kind || op->table < 0 || op->table >= rp->num_tables ||
        rp->tables[op->table].kind != kind || rp->tables[op->table].num_segs < 0)
        return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": table %d is not a %s table of %d",
                        WHERE_ARGS(w), op->table, tide_op_kind_name(kind), rp->num_tables);
    *table_out = &rp->tables[op->table];
    return TIDE_SUCCESS;
}

/* end = a + b (elements) as bytes of `item`, overflow-checked. */
static bool elem_end_bytes(uint64_t a, uint64_t b, uint64_t item, uint64_t *out) {
    uint64_t e;
    return tide_add_u64(a, b, &e) && tide_mul_u64(e, item, out);
}

tide_result_t tide_bind_sum(const tide_binding_t *b, const tide_program_t *prog, tide_queue_t q,
                            int index, tide_sum_args_t *args_out) {
    const tide_op_t *op = NULL;
    const tide_table_t *t;
    op_where_t w;
    TIDE_CHECK(lookup_op(b, prog, q, index, &op, &w));
    TIDE_CHECK(lookup_table(b, prog, op, &w, TIDE_OP_SUM, &t));
    const struct tide_plan *plan = b->plan;
    const uint64_t item = plan->geom.grad_item;
    if (t->num_staged < 0 || t->num_staged >= TIDE_MAX_GPUS_PER_NODE || b->grads == NULL ||
        (t->num_segs > 0 && t->sum_segs == NULL))
        return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": malformed sum table (%d staged)",
                        WHERE_ARGS(&w), t->num_staged);

    /* The kernel writes [out_off, out_off + len) and reads stage / own [off, off + valid). */
    uint64_t out_end = 0, stage_end = 0, e;
    for (int s = 0; s < t->num_segs; ++s) {
        const tide_sum_seg_t *g = &t->sum_segs[s];
        if (!elem_end_bytes(g->out_off, g->len, 4, &e)) goto overflow;
        if (e > out_end) out_end = e;
        const uint32_t valid = g->valid < g->len ? g->valid : g->len;
        if (valid == 0) continue;
        if (!tide_add_u64(g->stage_off, valid, &e)) goto overflow;
        if (e > stage_end) stage_end = e;
        uint64_t gb, own_end;
        if (g->own_idx < 0 || g->own_idx >= plan->geom.num_params ||
            !grad_bytes(plan, g->own_idx, &gb) || b->grads[g->own_idx] == NULL)
            return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": segment %d reads gradient %d of %d",
                            WHERE_ARGS(&w), s, g->own_idx, plan->geom.num_params);
        if (!elem_end_bytes(g->own_off, valid, item, &own_end)) goto overflow;
        if (own_end > gb)
            return TIDE_ERR(TIDE_ERR_INTERNAL,
                            WHERE_FMT ": segment %d reads gradient %d up to byte %" PRIu64
                                      " of %" PRIu64,
                            WHERE_ARGS(&w), s, g->own_idx, own_end, gb);
    }
    uint64_t staged_bytes = 0;
    if (t->num_staged > 0 && stage_end > 0) {
        uint64_t first;
        if (!tide_mul_u64((uint64_t)(t->num_staged - 1), t->stage_stride, &first) ||
            !elem_end_bytes(first, stage_end, item, &staged_bytes))
            goto overflow;
    }
    void *out, *staged = NULL;
    TIDE_CHECK(resolve(b, prog, &w, "sum out", &t->out, op->bank_dep, out_end, &out));
    if (t->num_staged > 0)
        TIDE_CHECK(
            resolve(b, prog, &w, "sum staged", &t->staged, op->bank_dep, staged_bytes, &staged));

    tide_sum_args_t a = {0};
    a.segs = t->sum_segs;
    a.num_segs = t->num_segs;
    a.staged = staged;
    a.stage_stride = t->stage_stride;
    a.num_staged = t->num_staged;
    a.own = b->grads;
    a.dtype = item == 2 ? TIDE_DTYPE_BF16 : TIDE_DTYPE_FP32;
    a.out = out;
    *args_out = a;
    return TIDE_SUCCESS;
overflow:
    return TIDE_ERR(TIDE_ERR_OVERFLOW, WHERE_FMT ": sum table extents overflow", WHERE_ARGS(&w));
}

tide_result_t tide_bind_land(const tide_binding_t *b, const tide_program_t *prog, tide_queue_t q,
                             int index, tide_land_args_t *args_out) {
    const tide_op_t *op = NULL;
    const tide_table_t *t;
    op_where_t w;
    TIDE_CHECK(lookup_op(b, prog, q, index, &op, &w));
    TIDE_CHECK(lookup_table(b, prog, op, &w, TIDE_OP_LAND, &t));
    if (t->num_in < 1 || t->num_in > TIDE_MAX_GPUS_PER_NODE ||
        (t->num_segs > 0 && t->land_segs == NULL) || b->out == NULL)
        return TIDE_ERR(TIDE_ERR_INTERNAL, WHERE_FMT ": malformed landing table (%d inputs)",
                        WHERE_ARGS(&w), t->num_in);

    uint64_t out_end = 0, in_end = 0, e;
    const uint64_t in_item = t->in_bf16 ? 2 : 4;
    for (int s = 0; s < t->num_segs; ++s) {
        const tide_land_seg_t *g = &t->land_segs[s];
        if (!elem_end_bytes(g->out_off, g->len, 4, &e)) goto overflow;
        if (e > out_end) out_end = e;
        if (!elem_end_bytes(g->in_off, g->len, in_item, &e)) goto overflow;
        if (e > in_end) in_end = e;
    }
    if (out_end > b->plan->geom.fp32_shard_bytes)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        WHERE_FMT ": landing writes output byte %" PRIu64 " of %" PRIu64,
                        WHERE_ARGS(&w), out_end, b->plan->geom.fp32_shard_bytes);

    tide_land_args_t a = {0};
    for (int k = 0; k < t->num_in; ++k) {
        void *p;
        TIDE_CHECK(resolve(b, prog, &w, "landing input", &t->in[k], op->bank_dep, in_end, &p));
        a.in[k] = p;
    }
    a.segs = t->land_segs;
    a.num_segs = t->num_segs;
    a.num_in = t->num_in;
    a.out = b->out;
    a.alpha = b->alpha;
    a.init = op->init != 0;
    a.accumulate = b->accumulate;
    a.plus_zero = t->plus_zero != 0;
    a.in_bf16 = t->in_bf16 != 0;
    *args_out = a;
    return TIDE_SUCCESS;
overflow:
    return TIDE_ERR(TIDE_ERR_OVERFLOW, WHERE_FMT ": landing table extents overflow",
                    WHERE_ARGS(&w));
}
