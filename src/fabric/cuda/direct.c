/*
 * direct.c - what the CUDA fabric leaves out when every rank of a node lives on one device
 * (the emulated topologies: docs/cuda-fabric.md, "Direct mode").
 *
 * On one device a copy is an SM kernel that reads and writes HBM, not a copy engine or a
 * link: a staging push, the own-node spare copy and an emulated rail put each cost their
 * bytes twice on the same memory the sums and landings need.  With TIDE_CUDA_DIRECT unset
 * or not 0, and every node's ranks on one device, a prepared RS program therefore
 *
 *   - elides the Level-1 pushes (copies into STAGING): each SUM reads the other local ranks'
 *     gradients in place (tide_sum_args_t.peers; contribution k of owner j is local rank
 *     k < j ? k : k + 1, at the own segment's offset: docs/protocol.md, the pusher's piece is
 *     the same gradient elements as the owner's own);
 *   - elides inbox copies whose source stays valid until every landing read it, and lets the
 *     landings read that source instead (tide_land_args_t.in_table);
 *   - does not read landing inputs that no copy of the program writes: they hold +0.0f (the
 *     arena is zeroed at registration, stale blocks by the program's ZERO ops), and the
 *     landing adds +0.0f for them, so the bits do not change;
 *   - with TIDE_CUDA_DIRECT_FUSE (in the default mask), fuses a SUM with the
 *     landings of its output when each of those landing segments has that one live input
 *     (an elided inbox copy of it, or at M = 1 the SUM's spare itself, which the M = 1
 *     program's landings read in place)
 *     and is the rank's only landing of those outputs (M = 1): the SUM stores alpha * (acc + 0) (or adds it) straight
 *     into the landings' outputs (tide_sum_args_t.fused) and the LAND op issues nothing.
 *     The fused SUM writes rank i's output from rank k's stream: it follows rank i's start
 *     through the (elided) pushes of rank i that it waits for, and rank i's call-done
 *     follows it through the landing's waits, which stay.  A first version without the
 *     only-landing rule raced on multi-wave outputs (2 of 595 GPU matrix configurations,
 *     M = 3); with the rule the GPU matrix passes (701 configurations, 0 failed,
 *     bench/results/h200-2026-12-03b), so FUSE is in the default mask since then.
 *
 * Every signal, wait and record stays where it was: an elided copy still records its fused
 * signal on its stream after the waits before it, so everything that waited for the copy
 * still waits for what the copy waited for (the sum that wrote its source, the gradients'
 * readiness through the pusher's start event).
 *
 * Why an alias is safe.  An inbox copy is elided only when (a) its source lies in SPARE or
 * OUTBOX, bank-dependent, written in the program by exactly one op, a bank-dependent SUM, and
 * by nothing else of that region that is not bank-dependent; (b) nothing else writes any byte
 * of its destination; (c) every landing segment that reads its destination reads inside it.
 * The source is then rewritten only by the same SUM two calls later (the other bank in
 * between), and call e + 2 starts after the fence of call e, which every rank's landing of
 * call e precedes.  A SUM that reads gradients in place moves the read-done event of every
 * rank of the node to after the call of the whole node (enqueue epilogue, execute.c).
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"

#include <stdlib.h>
#include <string.h>

/* A write of some op into an arena region of one rank: bytes [lo, hi) at bank 0. */
typedef struct {
    int32_t op;
    int32_t rank;
    uint8_t region;
    uint8_t kind; /* tide_op_kind_t */
    uint8_t bank_dep;
    uint64_t lo, hi;
} write_t;

typedef struct {
    write_t *v;
    int n, cap;
} writes_t;

static tide_result_t writes_push(writes_t *w, write_t x) {
    if (w->n == w->cap) {
        const int cap = w->cap == 0 ? 256 : 2 * w->cap;
        write_t *v = realloc(w->v, (size_t)cap * sizeof(*v));
        if (v == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d writes", cap);
        w->v = v;
        w->cap = cap;
    }
    w->v[w->n++] = x;
    return TIDE_SUCCESS;
}

static bool meets(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1) {
    return a0 < b1 && b0 < a1;
}

bool tide_cuda_direct_world(const tide_cuda_shared_t *sh, int gpus_per_node) {
    if (sh->direct == 0 || gpus_per_node < 1 || sh->ranks % gpus_per_node != 0) return false;
    for (int r = 0; r < sh->ranks; ++r)
        if (tide_cuda_device_of(sh, r) != tide_cuda_device_of(sh, r - r % gpus_per_node))
            return false;
    return true;
}

/* The writes of every op of the program into arena regions (SUM outputs included). */
static tide_result_t collect_writes(const tide_cuda_prepared_t *pp, const tide_program_t *prog,
                                    writes_t *w) {
    const tide_schedule_t *s = &pp->sched;
    for (int t = 0; t < s->num_threads; ++t) {
        const int rank = t / TIDE_CUDA_Q;
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            const tide_op_t *op = tide_schedule_op(prog, s, id, t);
            write_t x = {id, -1, 0, op->kind, op->bank_dep, 0, 0};
            if (op->kind == TIDE_OP_COPY || op->kind == TIDE_OP_ZERO ||
                op->kind == TIDE_OP_COPY2D) {
                if (op->dst.kind != TIDE_REF_ARENA) continue;
                uint64_t span = op->bytes;
                if (op->kind == TIDE_OP_COPY2D) {
                    if (op->rows == 0) continue;
                    span = (op->rows - 1) * op->dst_pitch + op->bytes;
                }
                x.rank = op->dst.rank, x.region = op->dst.region;
                x.lo = op->dst.offset, x.hi = op->dst.offset + span;
            } else if (op->kind == TIDE_OP_SUM) {
                const tide_table_t *tb = &prog->ranks[rank].tables[op->table];
                if (tb->out.kind != TIDE_REF_ARENA) continue;
                uint64_t end = 0;
                for (int g = 0; g < tb->num_segs; ++g) {
                    const uint64_t e = (tb->sum_segs[g].out_off + tb->sum_segs[g].len) * 4u;
                    if (e > end) end = e;
                }
                x.rank = tb->out.rank, x.region = tb->out.region;
                x.lo = tb->out.offset, x.hi = tb->out.offset + end;
            } else {
                continue;
            }
            if (x.hi > x.lo) TIDE_CHECK(writes_push(w, x));
        }
    }
    return TIDE_SUCCESS;
}

/* Whether inbox copy `c` may be elided by rules (a) and (b) above. */
static bool alias_candidate(const writes_t *w, const write_t *c, const tide_op_t *op) {
    if (op->kind != TIDE_OP_COPY || !op->bank_dep || op->src.kind != TIDE_REF_ARENA ||
        (op->src.region != TIDE_REGION_SPARE && op->src.region != TIDE_REGION_OUTBOX))
        return false;
    const uint64_t s0 = op->src.offset, s1 = op->src.offset + op->bytes;
    int src_writers = 0;
    for (int i = 0; i < w->n; ++i) {
        const write_t *x = &w->v[i];
        if (x->op == c->op) continue;
        if (x->rank == c->rank && x->region == c->region && meets(x->lo, x->hi, c->lo, c->hi))
            return false; /* (b) */
        if (x->rank != op->src.rank || x->region != op->src.region) continue;
        if (!x->bank_dep) return false; /* its bytes would meet the other bank */
        if (!meets(x->lo, x->hi, s0, s1)) continue;
        if (x->kind != TIDE_OP_SUM || x->lo > s0 || x->hi < s1) return false;
        ++src_writers;
    }
    return src_writers == 1;
}

static void fuse_free(tide_cuda_fuse_t *f) {
    if (f == NULL) return;
    for (int p = 0; p < 2; ++p) {
        if (f->dev[p] != NULL) cudaFree(f->dev[p]);
        if (f->host[p] != NULL) cudaFreeHost(f->host[p]);
        if (f->done[p] != NULL) cudaEventDestroy(f->done[p]);
        free(f->last[p]);
    }
    free(f->segs);
    free(f);
}

void tide_cuda_direct_free(tide_cuda_prepared_t *pp) {
    if (pp->fuse != NULL)
        for (int id = 0; id < pp->sched.num_ops; ++id)
            fuse_free(pp->fuse[id]);
    free(pp->fuse);
    free(pp->fused_land);
    pp->fuse = NULL;
    pp->fused_land = NULL;
    if (pp->land_src != NULL)
        for (int id = 0; id < pp->sched.num_ops; ++id)
            free(pp->land_src[id]);
    for (int p = 0; p < 2; ++p) {
        if (pp->land_dev[p] != NULL)
            for (int id = 0; id < pp->sched.num_ops; ++id)
                if (pp->land_dev[p][id] != NULL) cudaFree(pp->land_dev[p][id]);
        if (pp->land_last[p] != NULL)
            for (int id = 0; id < pp->sched.num_ops; ++id)
                free(pp->land_last[p][id]);
        free(pp->land_dev[p]);
        free(pp->land_last[p]);
        pp->land_dev[p] = NULL;
        pp->land_last[p] = NULL;
    }
    free(pp->land_src);
    free(pp->elide);
    pp->land_src = NULL;
    pp->elide = NULL;
    pp->direct = pp->direct_sum = false;
    tide_cuda_direct_ag_free(pp);
    (void)cudaGetLastError();
}

/* The landing sources of LAND op `id` (rank `rank`) against the program's writes. */
static tide_result_t land_sources(tide_cuda_prepared_t *pp, const tide_program_t *prog,
                                  const writes_t *w, const uint8_t *cand, int mask, int id,
                                  int rank, const tide_op_t *op) {
    const tide_table_t *tb = &prog->ranks[rank].tables[op->table];
    const int nin = tb->num_in;
    if (tb->num_segs <= 0 || nin < 1) return TIDE_SUCCESS;
    tide_cuda_land_src_t *src = calloc((size_t)tb->num_segs * (size_t)nin, sizeof(*src));
    if (src == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: landing sources");
    bool any = false;
    for (int g = 0; g < tb->num_segs; ++g) {
        const tide_land_seg_t *sg = &tb->land_segs[g];
        for (int k = 0; k < nin; ++k) {
            tide_cuda_land_src_t *o = &src[(size_t)g * (size_t)nin + (size_t)k];
            o->kind = TIDE_CUDA_LAND_READ;
            const tide_ref_t *in = &tb->in[k];
            if (in->kind != TIDE_REF_ARENA || sg->len == 0) continue;
            const uint64_t lo = in->offset + sg->in_off * 4u, hi = lo + (uint64_t)sg->len * 4u;
            int copies = 0, which = -1;
            for (int i = 0; i < w->n; ++i) {
                const write_t *x = &w->v[i];
                if (x->rank != in->rank || x->region != in->region || !meets(x->lo, x->hi, lo, hi))
                    continue;
                if (x->kind == TIDE_OP_ZERO) continue;
                ++copies;
                which = i;
            }
            if (copies == 0 && (mask & TIDE_CUDA_DIRECT_ZERO)) {
                o->kind = TIDE_CUDA_LAND_ZERO;
                any = true;
            } else if (copies == 1 && cand[which] && w->v[which].lo <= lo && hi <= w->v[which].hi) {
                o->kind = TIDE_CUDA_LAND_ALIAS;
                o->copy = w->v[which].op;
                o->delta = lo - w->v[which].lo;
                any = true;
            } else if (copies == 1 && w->v[which].kind == TIDE_OP_SUM &&
                       (mask & TIDE_CUDA_DIRECT_FUSE)) {
                /* M = 1: the landing reads a SUM's output in place (compile_rs.c,
                 * emit_landing_m1); it stays a READ, listed for fuse_plan. */
                any = true;
            }
        }
    }
    /* Every input from its inbox: the plain landing, no table. */
    if (any)
        pp->land_src[id] = src;
    else
        free(src);
    return TIDE_SUCCESS;
}

/* Rule (c): a candidate stays one only if no landing segment reads it partly. */
static void drop_partial(const tide_cuda_prepared_t *pp, const tide_program_t *prog,
                         const writes_t *w, uint8_t *cand) {
    const tide_schedule_t *s = &pp->sched;
    for (int t = 0; t < s->num_threads; ++t) {
        const int rank = t / TIDE_CUDA_Q;
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            const tide_op_t *op = tide_schedule_op(prog, s, id, t);
            if (op->kind != TIDE_OP_LAND) continue;
            const tide_table_t *tb = &prog->ranks[rank].tables[op->table];
            for (int g = 0; g < tb->num_segs; ++g)
                for (int k = 0; k < tb->num_in; ++k) {
                    const tide_ref_t *in = &tb->in[k];
                    if (in->kind != TIDE_REF_ARENA) continue;
                    const uint64_t lo = in->offset + tb->land_segs[g].in_off * 4u;
                    const uint64_t hi = lo + (uint64_t)tb->land_segs[g].len * 4u;
                    for (int i = 0; i < w->n; ++i) {
                        const write_t *x = &w->v[i];
                        if (cand[i] && x->rank == in->rank && x->region == in->region &&
                            meets(x->lo, x->hi, lo, hi) && (lo < x->lo || hi > x->hi))
                            cand[i] = 0;
                    }
                }
        }
    }
}

static int thread_of(const tide_schedule_t *s, int id) {
    int lo = 0, hi = s->num_threads - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (s->op_base[mid] <= id)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The SUM segment that writes [lo, lo + bytes) of (rank, region) exactly; *seg_out = -1: none. */
static int sum_writing(const tide_cuda_prepared_t *pp, const tide_program_t *prog,
                       const writes_t *w, int rank, int region, uint64_t lo, uint64_t bytes,
                       int *seg_out) {
    *seg_out = -1;
    for (int i = 0; i < w->n; ++i) {
        const write_t *x = &w->v[i];
        if (x->kind != TIDE_OP_SUM || x->rank != rank || x->region != region || lo < x->lo ||
            lo + bytes > x->hi)
            continue;
        const int t = thread_of(&pp->sched, x->op);
        const tide_op_t *op = tide_schedule_op(prog, &pp->sched, x->op, t);
        const tide_table_t *tb = &prog->ranks[t / TIDE_CUDA_Q].tables[op->table];
        for (int j = 0; j < tb->num_segs; ++j)
            if (tb->out.offset + tb->sum_segs[j].out_off * 4u == lo &&
                (uint64_t)tb->sum_segs[j].len * 4u == bytes) {
                *seg_out = j;
                return x->op;
            }
        return -1;
    }
    return -1;
}

static const tide_table_t *op_table(const tide_cuda_prepared_t *pp, const tide_program_t *prog,
                                    int id) {
    const int t = thread_of(&pp->sched, id);
    const tide_op_t *op = tide_schedule_op(prog, &pp->sched, id, t);
    return &prog->ranks[t / TIDE_CUDA_Q].tables[op->table];
}

/* Which SUMs store their segments as the landings that read them (see the top). */
static tide_result_t fuse_plan(tide_cuda_prepared_t *pp, const tide_program_t *prog,
                               const writes_t *w, int L) {
    const tide_schedule_t *s = &pp->sched;
    const int n = s->num_ops;
    pp->fuse = calloc((size_t)n + 1, sizeof(*pp->fuse));
    pp->fused_land = calloc((size_t)n + 1, 1);
    uint8_t *sum_ok = calloc((size_t)n + 1, 1);
    tide_result_t res = TIDE_SUCCESS;
    if (pp->fuse == NULL || pp->fused_land == NULL || sum_ok == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: fused sums");
        goto done;
    }
    /* Candidate landings: every segment has one live input, an alias of a SUM segment; no
     * other landing of the rank writes any of its outputs (several waves of one output land
     * in their queue's order: fused, their sums would race on it); and the SUM runs on the
     * landing's rank or waits for that rank's pushes (so it follows the rank's start). */
    for (int id = 0; id < n; ++id) {
        if (pp->land_src[id] == NULL) continue;
        const tide_table_t *lt = op_table(pp, prog, id);
        const int lrank = thread_of(s, id) / TIDE_CUDA_Q;
        bool ok = true;
        for (int o2 = 0; ok && o2 < n; ++o2) {
            if (o2 == id || thread_of(s, o2) / TIDE_CUDA_Q != lrank) continue;
            const tide_op_t *op2 = tide_schedule_op(prog, s, o2, thread_of(s, o2));
            if (op2->kind != TIDE_OP_LAND) continue;
            const tide_table_t *t2 = op_table(pp, prog, o2);
            for (int g = 0; ok && g < lt->num_segs; ++g)
                for (int h = 0; ok && h < t2->num_segs; ++h)
                    if (meets(lt->land_segs[g].out_off,
                              lt->land_segs[g].out_off + lt->land_segs[g].len,
                              t2->land_segs[h].out_off,
                              t2->land_segs[h].out_off + t2->land_segs[h].len))
                        ok = false;
        }
        for (int g = 0; ok && g < lt->num_segs; ++g) {
            if (lt->land_segs[g].len == 0) continue;
            int live = 0, at = -1;
            for (int k = 0; k < lt->num_in; ++k)
                if (pp->land_src[id][(size_t)g * lt->num_in + k].kind != TIDE_CUDA_LAND_ZERO)
                    ++live, at = k;
            const tide_cuda_land_src_t *o = at >= 0 ? &pp->land_src[id][(size_t)g * lt->num_in + at]
                                                    : NULL;
            if (live != 1 || (o->kind != TIDE_CUDA_LAND_ALIAS && o->kind != TIDE_CUDA_LAND_READ)) {
                ok = false;
                break;
            }
            /* The bytes the landing reads: an elided copy's source, or (M = 1) its input
             * itself; either must be exactly one SUM segment's output. */
            tide_ref_t from = lt->in[at];
            uint64_t from_off = from.offset + lt->land_segs[g].in_off * 4u;
            if (o->kind == TIDE_CUDA_LAND_ALIAS) {
                const tide_op_t *copy = tide_schedule_op(prog, s, o->copy, thread_of(s, o->copy));
                from = copy->src;
                from_off = copy->src.offset + o->delta;
            }
            if (from.kind != TIDE_REF_ARENA) {
                ok = false;
                break;
            }
            int j;
            const int sum = sum_writing(pp, prog, w, from.rank, from.region, from_off,
                                        (uint64_t)lt->land_segs[g].len * 4u, &j);
            if (sum < 0) {
                ok = false;
                break;
            }
            const int srank = thread_of(s, sum) / TIDE_CUDA_Q;
            if (srank != lrank && (srank / L != lrank / L || op_table(pp, prog, sum)->num_staged < 1)) {
                ok = false;
                break;
            }
            if (pp->fuse[sum] == NULL) {
                const tide_table_t *st = op_table(pp, prog, sum);
                tide_cuda_fuse_t *f = calloc(1, sizeof(*f));
                if (f != NULL) f->segs = malloc((size_t)(st->num_segs + 1) * sizeof(*f->segs));
                if (f == NULL || f->segs == NULL) {
                    fuse_free(f);
                    res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: fused sums");
                    goto done;
                }
                f->num_segs = st->num_segs;
                for (int q = 0; q < st->num_segs; ++q)
                    f->segs[q] = (tide_cuda_fuse_seg_t){-1, -1};
                pp->fuse[sum] = f;
                sum_ok[sum] = 1;
            }
            if (pp->fuse[sum]->segs[j].land >= 0) {
                ok = false; /* read by two landings */
                sum_ok[sum] = 0;
                break;
            }
            pp->fuse[sum]->segs[j] = (tide_cuda_fuse_seg_t){id, g};
        }
        pp->fused_land[id] = ok;
    }
    /* A SUM fuses only if every segment goes to a fusing landing, a landing only if every
     * segment comes from a fusing SUM: drop both until nothing changes. */
    for (bool changed = true; changed;) {
        changed = false;
        for (int id = 0; id < n; ++id) {
            tide_cuda_fuse_t *f = pp->fuse[id];
            if (f == NULL || !sum_ok[id]) continue;
            const tide_table_t *st = op_table(pp, prog, id);
            for (int q = 0; q < f->num_segs; ++q)
                if (st->sum_segs[q].len > 0 &&
                    (f->segs[q].land < 0 || !pp->fused_land[f->segs[q].land])) {
                    sum_ok[id] = 0;
                    changed = true;
                    break;
                }
        }
        for (int id = 0; id < n; ++id) {
            if (!pp->fused_land[id]) continue;
            const tide_table_t *lt = op_table(pp, prog, id);
            for (int sum = 0; sum < n && pp->fused_land[id]; ++sum) {
                tide_cuda_fuse_t *f = pp->fuse[sum];
                if (f == NULL || sum_ok[sum]) continue;
                for (int q = 0; q < f->num_segs; ++q)
                    if (f->segs[q].land == id) {
                        pp->fused_land[id] = 0;
                        changed = true;
                        break;
                    }
            }
            (void)lt;
        }
    }
    for (int id = 0; id < n; ++id)
        if (pp->fuse[id] != NULL && !sum_ok[id]) {
            fuse_free(pp->fuse[id]);
            pp->fuse[id] = NULL;
        }
done:
    free(sum_ok);
    return res;
}

static tide_result_t analyse(tide_cuda_prepared_t *pp, const tide_program_t *prog, int mask,
                             writes_t *w, uint8_t **cand_out) {
    const tide_schedule_t *s = &pp->sched;
    TIDE_CHECK(collect_writes(pp, prog, w));
    uint8_t *cand = calloc((size_t)w->n + 1, 1);
    *cand_out = cand;
    if (cand == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d writes", w->n);
    for (int i = 0; i < w->n; ++i) {
        const write_t *x = &w->v[i];
        if (!(mask & TIDE_CUDA_DIRECT_ALIAS) || x->kind != TIDE_OP_COPY ||
            x->region != TIDE_REGION_INBOX)
            continue;
        int t = 0;
        while (t + 1 < s->num_threads && s->op_base[t + 1] <= x->op)
            ++t;
        cand[i] = alias_candidate(w, x, tide_schedule_op(prog, s, x->op, t));
    }
    drop_partial(pp, prog, w, cand);
    /* Staging pushes: every copy into STAGING. */
    for (int i = 0; i < w->n; ++i) {
        const write_t *x = &w->v[i];
        if ((mask & TIDE_CUDA_DIRECT_SUM) &&
            (x->kind == TIDE_OP_COPY || x->kind == TIDE_OP_COPY2D) &&
            x->region == TIDE_REGION_STAGING)
            pp->elide[x->op] = 1;
        else if (cand[i])
            pp->elide[x->op] = 1;
    }
    for (int t = 0; t < s->num_threads; ++t)
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            const tide_op_t *op = tide_schedule_op(prog, s, id, t);
            if (op->kind == TIDE_OP_LAND)
                TIDE_CHECK(land_sources(pp, prog, w, cand, mask, id, t / TIDE_CUDA_Q, op));
        }
    if (mask & TIDE_CUDA_DIRECT_FUSE)
        TIDE_CHECK(fuse_plan(pp, prog, w, prog->plan->config.gpus_per_node));
    /* Device tables of the landings with a source other than their inbox. */
    for (int p = 0; p < 2; ++p) {
        pp->land_dev[p] = calloc((size_t)s->num_ops + 1, sizeof(*pp->land_dev[p]));
        pp->land_last[p] = calloc((size_t)s->num_ops + 1, sizeof(*pp->land_last[p]));
        if (pp->land_dev[p] == NULL || pp->land_last[p] == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: landing tables");
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_direct_prepare(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                       const tide_program_t *prog) {
    const int L = prog->plan->config.gpus_per_node;
    if (prog->coll != TIDE_COLL_REDUCE_SCATTER || !tide_cuda_direct_world(sh, L))
        return TIDE_SUCCESS;
    pp->elide = calloc((size_t)pp->sched.num_ops + 1, 1);
    pp->land_src = calloc((size_t)pp->sched.num_ops + 1, sizeof(*pp->land_src));
    if (pp->elide == NULL || pp->land_src == NULL) {
        tide_cuda_direct_free(pp);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: direct state");
    }
    writes_t w = {0};
    uint8_t *cand = NULL;
    tide_result_t res = analyse(pp, prog, sh->direct, &w, &cand);
    free(w.v);
    free(cand);
    if (res != TIDE_SUCCESS) {
        tide_cuda_direct_free(pp);
        return res;
    }
    pp->direct = true;
    pp->direct_sum = (sh->direct & TIDE_CUDA_DIRECT_SUM) != 0;
    pp->direct_l = L;
    return TIDE_SUCCESS;
}

void tide_cuda_direct_row(const tide_cuda_family_t *fam, int L, int r, const void **row) {
    const int np = fam->num_params, j = r % L, node0 = r - j;
    for (int k = 0; k < L - 1; ++k) {
        const int u = node0 + (k < j ? k : k + 1);
        memcpy(row + (size_t)k * (size_t)np, &fam->grads[(size_t)u * (size_t)np],
               (size_t)np * sizeof(void *));
    }
    memcpy(row + (size_t)(L - 1) * (size_t)np, &fam->grads[(size_t)r * (size_t)np],
           (size_t)np * sizeof(void *));
}

tide_result_t tide_cuda_direct_lands(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                     int parity) {
    if (!pp->direct) return TIDE_SUCCESS;
    const tide_schedule_t *s = &pp->sched;
    for (int t = 0; t < s->num_threads; ++t) {
        const int rank = t / TIDE_CUDA_Q;
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            if (pp->land_src[id] == NULL || (pp->fused_land != NULL && pp->fused_land[id]))
                continue;
            const tide_op_t *op = tide_schedule_op(pp->checked[rank], s, id, t);
            const tide_table_t *tb = &pp->checked[rank]->ranks[rank].tables[op->table];
            const tide_land_args_t *la = &pp->bound[id].land;
            const size_t n = (size_t)tb->num_segs * (size_t)tb->num_in;
            const float **host = malloc(n * sizeof(*host));
            if (host == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: landing table");
            for (int g = 0; g < tb->num_segs; ++g)
                for (int k = 0; k < tb->num_in; ++k) {
                    const tide_cuda_land_src_t *o = &pp->land_src[id][(size_t)g * tb->num_in + k];
                    const float **e = &host[(size_t)g * tb->num_in + k];
                    if (o->kind == TIDE_CUDA_LAND_ZERO)
                        *e = NULL;
                    else if (o->kind == TIDE_CUDA_LAND_ALIAS)
                        *e = (const float *)((const uint8_t *)pp->bound[o->copy].op.src + o->delta);
                    else
                        *e = la->in[k] + tb->land_segs[g].in_off;
                }
            const float **last = pp->land_last[parity][id];
            if (last != NULL && memcmp(last, host, n * sizeof(*host)) == 0) {
                free(host);
                pp->bound[id].land.in_table = (const float *const *)pp->land_dev[parity][id];
                continue;
            }
            /* First call of this parity (the addresses are the arena's, fixed after it): an
             * earlier table of this parity may still be read, so wait for the device. */
            tide_result_t res = TIDE_SUCCESS;
            TIDE_CUDA_CALL_GOTO(cudaSetDevice(tide_cuda_device_of(sh, rank)), "cudaSetDevice",
                                res, fail);
            if (pp->land_dev[parity][id] == NULL)
                TIDE_CUDA_CALL_GOTO(cudaMalloc(&pp->land_dev[parity][id], n * sizeof(*host)),
                                    "cudaMalloc(landing table)", res, fail);
            else
                TIDE_CUDA_CALL_GOTO(cudaDeviceSynchronize(), "cudaDeviceSynchronize", res, fail);
            TIDE_CUDA_CALL_GOTO(cudaMemcpy(pp->land_dev[parity][id], host, n * sizeof(*host),
                                           cudaMemcpyHostToDevice),
                                "cudaMemcpy(landing table)", res, fail);
            free(last);
            pp->land_last[parity][id] = host;
            pp->bound[id].land.in_table = (const float *const *)pp->land_dev[parity][id];
            continue;
        fail:
            free(host);
            return res;
        }
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_direct_fuse_upload(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                           int parity, int r, cudaStream_t stream,
                                           uint64_t *uploads) {
    (void)sh;
    if (pp->fuse == NULL) return TIDE_SUCCESS;
    const tide_schedule_t *s = &pp->sched;
    for (int t = r * TIDE_CUDA_Q; t < (r + 1) * TIDE_CUDA_Q; ++t)
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            tide_cuda_fuse_t *f = pp->fuse[id];
            if (f == NULL || f->num_segs == 0) continue;
            const size_t bytes = (size_t)f->num_segs * sizeof(tide_sum_fused_t);
            if (f->dev[parity] == NULL) {
                TIDE_CUDA_CALL(cudaMalloc((void **)&f->dev[parity], bytes),
                               "cudaMalloc(fused sum table)");
                TIDE_CUDA_CALL(cudaMallocHost((void **)&f->host[parity], bytes),
                               "cudaMallocHost(fused sum table)");
                TIDE_CUDA_CALL(cudaEventCreateWithFlags(&f->done[parity], cudaEventDisableTiming),
                               "cudaEventCreateWithFlags(fused sum table)");
                f->last[parity] = calloc(1, bytes);
                if (f->last[parity] == NULL)
                    return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: fused sum table");
            }
            /* The pinned row may still feed the upload of call e - 2. */
            if (f->inflight[parity])
                TIDE_CUDA_CALL(cudaEventSynchronize(f->done[parity]),
                               "cudaEventSynchronize(fused sum table)");
            f->inflight[parity] = false;
            tide_sum_fused_t *row = f->host[parity];
            memset(row, 0, bytes);
            for (int q = 0; q < f->num_segs; ++q) {
                if (f->segs[q].land < 0) continue; /* an empty segment: nothing is stored */
                const int lid = f->segs[q].land;
                const int lt = thread_of(s, lid);
                const tide_op_t *lop = tide_schedule_op(pp->checked[lt / TIDE_CUDA_Q], s, lid, lt);
                const tide_table_t *tb =
                    &pp->checked[lt / TIDE_CUDA_Q]->ranks[lt / TIDE_CUDA_Q].tables[lop->table];
                const tide_land_args_t *la = &pp->bound[lid].land;
                row[q].dst = la->out + tb->land_segs[f->segs[q].seg].out_off;
                row[q].alpha = la->alpha;
                row[q].overwrite = la->init && !la->accumulate;
                row[q].plus_zero = la->num_in > 1 || la->plus_zero;
            }
            if (!f->valid[parity] || memcmp(f->last[parity], row, bytes) != 0) {
                TIDE_CUDA_CALL(
                    cudaMemcpyAsync(f->dev[parity], row, bytes, cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync(fused sum table)");
                TIDE_CUDA_CALL(cudaEventRecord(f->done[parity], stream),
                               "cudaEventRecord(fused sum table)");
                f->inflight[parity] = true;
                memcpy(f->last[parity], row, bytes);
                f->valid[parity] = true;
                ++*uploads;
            }
            pp->bound[id].sum.fused = f->dev[parity];
        }
    return TIDE_SUCCESS;
}
