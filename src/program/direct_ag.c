/*
 * direct_ag.c - the all-gather's rail puts that direct mode leaves out when sender and
 * target share a memory (TIDE_DIRECT_AG, program/direct.h).
 *
 * With the memory shared, an emulated rail put is a copy of the sender's shard into the
 * target's receive stage, which the target's landing copies then read again: S bytes written
 * and read once more per rank and round (18/16 of the roofline's bytes at 2x4 on one GPU).
 * A real rail spends those bytes on the NIC, not on the memory.  A put is elided when
 *
 *   (a) it copies the sender's own shard (TIDE_REF_SHARD: the caller's shard or its resident
 *       region; never the cast slot, which the sender's next call rewrites unguarded);
 *   (b) nothing else of the program writes any byte of its destination;
 *   (c) every op that reads its destination is a flat COPY reading inside it, and no op
 *       touching that stage is bank-dependent;
 *   (d) sender and target share a memory (one domain),
 *
 * and each of those readers reads the sender's shard at the same offset instead (ag_src,
 * bound per call by the fabric).  Every signal, wait and record stays: the put's fused signal
 * still fires where the put would have run, after the sender's start (its shard is ready) and
 * its credit waits, so a reader still starts after the shard is ready.
 *
 * What the aliasing changes is when the shard may be touched again: the stock protocol is
 * done with rank r's shard when r's own queues end, but now the targets read it during their
 * own calls.  ag_wait[r N + j] says that rank j reads r's shard: the fabric ends r's call
 * (call-done, and its return) only after j's call ended.
 */
#include "core/checks.h"
#include "program/direct.h"

#include <stdlib.h>
#include <string.h>

/* Bytes [lo, hi) of rank `rank`'s receive stage that op `op` reads or writes. */
typedef struct {
    int32_t op;
    int32_t rank;
    uint64_t lo, hi;
    uint8_t write;
    uint8_t flat_copy; /* a COPY (a reader that can be redirected) */
    uint8_t bank_dep;
} stage_span_t;

typedef struct {
    stage_span_t *v;
    int n, cap;
} spans_t;

static tide_result_t spans_push(spans_t *l, stage_span_t x) {
    if (l->n == l->cap) {
        const int cap = l->cap == 0 ? 256 : 2 * l->cap;
        stage_span_t *v = realloc(l->v, (size_t)cap * sizeof(*v));
        if (v == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "direct mode: %d stage spans", cap);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
    return TIDE_SUCCESS;
}

static bool is_stage(const tide_ref_t *ref) {
    return ref->kind == TIDE_REF_ARENA && ref->region == TIDE_REGION_RECV_STAGE;
}

/* Bytes an op covers from its start: one row, or rows - 1 pitches plus a row. */
static uint64_t span_of(const tide_op_t *op, bool dst_side) {
    if (op->kind != TIDE_OP_COPY2D) return op->bytes;
    if (op->rows == 0) return 0;
    return (op->rows - 1) * (dst_side ? op->dst_pitch : op->src_pitch) + op->bytes;
}

/* Access of op `id` to the receive stage `ref` points into, `n` bytes from its offset. */
static tide_result_t access(spans_t *out, int id, const tide_op_t *op, const tide_ref_t *ref,
                            uint64_t n, bool write) {
    if (!is_stage(ref) || n == 0) return TIDE_SUCCESS;
    return spans_push(out, (stage_span_t){id, ref->rank, ref->offset, ref->offset + n, write,
                                          op->kind == TIDE_OP_COPY, op->bank_dep});
}

/* Every access of an op to a receive stage.  SUM and LAND touch only the reduce-scatter's
 * regions. */
static tide_result_t collect(const tide_program_t *prog, const tide_schedule_t *s, spans_t *out) {
    for (int t = 0; t < s->num_threads; ++t)
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            const tide_op_t *op = tide_schedule_op(prog, s, id, t);
            const bool copies = op->kind == TIDE_OP_COPY || op->kind == TIDE_OP_COPY2D;
            if (copies || op->kind == TIDE_OP_ZERO || op->kind == TIDE_OP_CAST)
                TIDE_CHECK(access(out, id, op, &op->dst, span_of(op, true), true));
            if (copies || op->kind == TIDE_OP_CAST)
                TIDE_CHECK(access(out, id, op, &op->src, span_of(op, false), false));
        }
    return TIDE_SUCCESS;
}

/* Rules (b) and (c) for the put writing span c. */
static bool stage_clean(const spans_t *sp, const stage_span_t *c) {
    for (int i = 0; i < sp->n; ++i) {
        const stage_span_t *x = &sp->v[i];
        if (x == c || x->rank != c->rank || x->lo >= c->hi || c->lo >= x->hi) continue;
        if (x->write || x->bank_dep || !x->flat_copy || x->lo < c->lo || x->hi > c->hi)
            return false;
    }
    return true;
}

tide_result_t tide_direct_analyse_ag(const tide_program_t *prog, const tide_schedule_t *s,
                                     const int *domain, tide_direct_t *d) {
    const int n = prog->num_ranks;
    spans_t sp = {0};
    tide_result_t res = collect(prog, s, &sp);
    if (res != TIDE_SUCCESS) goto done;
    d->elide = calloc((size_t)s->num_ops + 1, 1);
    d->ag_src = malloc(((size_t)s->num_ops + 1) * sizeof(*d->ag_src));
    d->ag_wait = calloc((size_t)n * (size_t)n, 1);
    if (d->elide == NULL || d->ag_src == NULL || d->ag_wait == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "direct mode: all-gather state of %d ops", s->num_ops);
        goto done;
    }
    for (int id = 0; id < s->num_ops; ++id)
        d->ag_src[id] = (tide_direct_ag_src_t){-1, 0};
    int elided = 0;
    for (int i = 0; i < sp.n; ++i) {
        const stage_span_t *c = &sp.v[i];
        if (!c->write || !c->flat_copy || c->bank_dep) continue;
        const int t = tide_direct_thread_of(s, c->op);
        const int sender = t / TIDE_Q_COUNT;
        const tide_op_t *op = tide_schedule_op(prog, s, c->op, t);
        if (op->src.kind != TIDE_REF_SHARD ||                        /* (a) */
            (domain != NULL && domain[sender] != domain[c->rank]) || /* (d) */
            !stage_clean(&sp, c))                                    /* (b), (c) */
            continue;
        d->elide[c->op] = 1;
        d->ag_wait[(size_t)sender * (size_t)n + (size_t)c->rank] = 1;
        ++elided;
        for (int k = 0; k < sp.n; ++k) {
            const stage_span_t *x = &sp.v[k];
            if (x->write || x->rank != c->rank || x->lo >= c->hi || c->lo >= x->hi) continue;
            d->ag_src[x->op] = (tide_direct_ag_src_t){c->op, x->lo - c->lo};
        }
    }
    d->ag = elided > 0;
done:
    free(sp.v);
    if (res == TIDE_SUCCESS && !d->ag) {
        free(d->elide);
        free(d->ag_src);
        free(d->ag_wait);
        d->elide = NULL;
        d->ag_src = NULL;
        d->ag_wait = NULL;
    }
    return res;
}
