/*
 * direct_ag.c - the all-gather's rail puts that direct mode leaves out when sender and
 * target share a device (TIDE_CUDA_DIRECT_AG; docs/cuda-fabric.md, "Direct mode").
 *
 * On one device an emulated rail put is an SM copy of the sender's shard into the target's
 * receive stage, which the target's landing copies then read again: S bytes written and
 * read once more per rank and round, 18/16 of the roofline's bytes at 2x4.  A real rail
 * spends those bytes on the NIC, not on the GPU's memory.  With the bit set, a put is not
 * issued when
 *
 *   (a) it copies the sender's own shard (TIDE_REF_SHARD: the caller's shard or its resident
 *       region; never the cast slot, which the sender's next call rewrites unguarded);
 *   (b) nothing else of the program writes any byte of its destination;
 *   (c) every op that reads its destination is a flat COPY reading inside it, and no op
 *       touching that stage is bank-dependent;
 *   (d) sender and target are on one device,
 *
 * and each of those readers reads the sender's shard at the same offset instead (bound per
 * call at enqueue, tide_cuda_direct_ag_sources).  Every signal, wait and record stays: the
 * put's fused signal is still recorded where the put would have run, after the sender's
 * start event (its shard is ready) and its credit waits, so a reader still starts after the
 * shard is ready.
 *
 * What the aliasing changes is when the shard may be touched again: the stock protocol is
 * done with rank r's shard when r's own queues end, but now the targets read it during their
 * own calls.  So r's call-done event is recorded on r's caller stream only after the call of
 * every target of an elided put of r ended (ag_wait; enqueue epilogue, execute.c), and the
 * caller stream waits for them too, so that whatever the caller does with the shard after the
 * call, and r's next call, follow the last read.
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"

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
        if (v == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d stage spans", cap);
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
static tide_result_t collect(const tide_cuda_prepared_t *pp, const tide_program_t *prog,
                             spans_t *out) {
    const tide_schedule_t *s = &pp->sched;
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

void tide_cuda_direct_ag_free(tide_cuda_prepared_t *pp) {
    free(pp->ag_src);
    free(pp->ag_wait);
    pp->ag_src = NULL;
    pp->ag_wait = NULL;
    pp->direct_ag = false;
}

tide_result_t tide_cuda_direct_ag_prepare(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                          const tide_program_t *prog) {
    if (prog->coll != TIDE_COLL_ALL_GATHER || !(sh->direct & TIDE_CUDA_DIRECT_AG) ||
        prog->plan->config.nodes < 2)
        return TIDE_SUCCESS;
    const tide_schedule_t *s = &pp->sched;
    const int n = sh->ranks;
    spans_t sp = {0};
    tide_result_t res = collect(pp, prog, &sp);
    if (res != TIDE_SUCCESS) goto done;
    if (pp->elide == NULL) pp->elide = calloc((size_t)s->num_ops + 1, 1);
    pp->ag_src = malloc(((size_t)s->num_ops + 1) * sizeof(*pp->ag_src));
    pp->ag_wait = calloc((size_t)n * (size_t)n, 1);
    if (pp->elide == NULL || pp->ag_src == NULL || pp->ag_wait == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: all-gather direct state");
        goto done;
    }
    for (int id = 0; id < s->num_ops; ++id)
        pp->ag_src[id] = (tide_cuda_ag_src_t){-1, 0};
    int elided = 0;
    for (int i = 0; i < sp.n; ++i) {
        const stage_span_t *c = &sp.v[i];
        if (!c->write || !c->flat_copy || c->bank_dep) continue;
        int t = 0;
        while (t + 1 < s->num_threads && s->op_base[t + 1] <= c->op)
            ++t;
        const int sender = t / TIDE_CUDA_Q;
        const tide_op_t *op = tide_schedule_op(prog, s, c->op, t);
        if (op->src.kind != TIDE_REF_SHARD ||                                    /* (a) */
            tide_cuda_device_of(sh, sender) != tide_cuda_device_of(sh, c->rank) || /* (d) */
            !stage_clean(&sp, c))                                               /* (b), (c) */
            continue;
        pp->elide[c->op] = 1;
        pp->ag_wait[(size_t)sender * (size_t)n + (size_t)c->rank] = 1;
        ++elided;
        for (int k = 0; k < sp.n; ++k) {
            const stage_span_t *x = &sp.v[k];
            if (x->write || x->rank != c->rank || x->lo >= c->hi || c->lo >= x->hi) continue;
            pp->ag_src[x->op] = (tide_cuda_ag_src_t){c->op, x->lo - c->lo};
        }
    }
    pp->direct_ag = elided > 0;
done:
    free(sp.v);
    if (res != TIDE_SUCCESS || !pp->direct_ag) {
        tide_cuda_direct_ag_free(pp);
        if (!pp->direct) {
            free(pp->elide);
            pp->elide = NULL;
        }
    }
    return res;
}

void tide_cuda_direct_ag_sources(tide_cuda_prepared_t *pp) {
    if (!pp->direct_ag) return;
    for (int id = 0; id < pp->sched.num_ops; ++id) {
        const tide_cuda_ag_src_t *a = &pp->ag_src[id];
        if (a->put < 0) continue;
        /* The put's source as bound for this call: the sender's shard at the put's offset. */
        pp->bound[id].op.src = (const uint8_t *)pp->bound[a->put].op.src + a->delta;
    }
}
