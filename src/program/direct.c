/*
 * direct.c - direct mode's analysis of a reduce-scatter program (program/direct.h), and the
 * entry point shared with the all-gather's (direct_ag.c).
 *
 * What it finds, for a fabric whose node's ranks share one memory:
 *
 *   - the Level-1 pushes (copies into STAGING), which a SUM then replaces by reading the
 *     other local ranks' gradients in place (contribution k of owner j is local rank
 *     k < j ? k : k + 1, at the own segment's offset: docs/protocol.md, the pusher's piece is
 *     the same gradient elements as the owner's own);
 *   - inbox copies whose source stays valid until every landing read it: elided, and the
 *     landings read that source (ALIAS);
 *   - landing inputs that no copy of the program writes: they hold +0.0f (the arena is
 *     zeroed at registration, stale blocks by the program's ZERO ops), and the landing adds
 *     +0.0f for them without reading, so the bits do not change (ZERO);
 *   - SUMs fused with the landings of their output when each of those landing segments has
 *     that one live input (an elided inbox copy of it, or at M = 1 the SUM's spare itself,
 *     which the M = 1 program's landings read in place) and is the rank's only landing of
 *     those outputs: the SUM stores alpha * (acc + 0) (or adds it) straight into the
 *     landings' outputs and the LAND issues nothing (FUSE).  The fused SUM writes rank i's
 *     output from rank k's queue: it follows rank i's start through the (elided) pushes of
 *     rank i that it waits for, and rank i's call-done follows it through the landing's
 *     waits, which stay.  A first version without the only-landing rule raced on multi-wave
 *     outputs (2 of 595 GPU matrix configurations, M = 3); with the rule the GPU matrix
 *     passes (bench/results/h200-2026-12-03b).
 *
 * Why an alias is safe.  An inbox copy is elided only when (a) its source lies in SPARE or
 * OUTBOX, bank-dependent, written in the program by exactly one op, a bank-dependent SUM, and
 * by nothing else of that region that is not bank-dependent; (b) nothing else writes any byte
 * of its destination; (c) every landing segment that reads its destination reads inside it.
 * The source is then rewritten only by the same SUM two calls later (the other bank in
 * between); the fabric makes call e + 2 start after every rank's landings of call e (the
 * CUDA fabric's fence, the CPU fabric's end-of-call join).  A SUM that reads gradients in
 * place likewise needs the fabric to keep every rank of the node in its call until the
 * node's sums are done (read-done moved to the node's end).
 */
#include "core/checks.h"
#include "plan/plan.h"
#include "program/direct.h"

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
        if (v == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "direct mode: %d writes", cap);
        w->v = v;
        w->cap = cap;
    }
    w->v[w->n++] = x;
    return TIDE_SUCCESS;
}

static bool meets(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1) {
    return a0 < b1 && b0 < a1;
}

/* The writes of every op of the program into arena regions (SUM outputs included). */
static tide_result_t collect_writes(const tide_program_t *prog, const tide_schedule_t *s,
                                    writes_t *w) {
    for (int t = 0; t < s->num_threads; ++t) {
        const int rank = t / TIDE_Q_COUNT;
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

/* The landing sources of LAND op `id` (rank `rank`) against the program's writes. */
static tide_result_t land_sources(const tide_program_t *prog, tide_direct_t *d, const writes_t *w,
                                  const uint8_t *cand, int mask, int id, int rank,
                                  const tide_op_t *op) {
    const tide_table_t *tb = &prog->ranks[rank].tables[op->table];
    const int nin = tb->num_in;
    if (tb->num_segs <= 0 || nin < 1) return TIDE_SUCCESS;
    tide_direct_land_src_t *src = calloc((size_t)tb->num_segs * (size_t)nin, sizeof(*src));
    if (src == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "direct mode: landing sources");
    bool any = false;
    for (int g = 0; g < tb->num_segs; ++g) {
        const tide_land_seg_t *sg = &tb->land_segs[g];
        for (int k = 0; k < nin; ++k) {
            tide_direct_land_src_t *o = &src[(size_t)g * (size_t)nin + (size_t)k];
            o->kind = TIDE_DIRECT_LAND_READ;
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
            if (copies == 0 && (mask & TIDE_DIRECT_ZERO)) {
                o->kind = TIDE_DIRECT_LAND_ZERO;
                any = true;
            } else if (copies == 1 && cand[which] && w->v[which].lo <= lo && hi <= w->v[which].hi) {
                o->kind = TIDE_DIRECT_LAND_ALIAS;
                o->copy = w->v[which].op;
                o->delta = lo - w->v[which].lo;
                any = true;
            } else if (copies == 1 && w->v[which].kind == TIDE_OP_SUM &&
                       (mask & TIDE_DIRECT_FUSE)) {
                /* M = 1: the landing reads a SUM's output in place (compile_rs.c,
                 * emit_landing_m1); it stays a READ, listed for fuse_plan. */
                any = true;
            }
        }
    }
    /* Every input from its inbox: the plain landing, no table. */
    if (any)
        d->land_src[id] = src;
    else
        free(src);
    return TIDE_SUCCESS;
}

/* Rule (c): a candidate stays one only if no landing segment reads it partly. */
static void drop_partial(const tide_program_t *prog, const tide_schedule_t *s, const writes_t *w,
                         uint8_t *cand) {
    for (int t = 0; t < s->num_threads; ++t) {
        const int rank = t / TIDE_Q_COUNT;
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

/* The SUM segment that writes [lo, lo + bytes) of (rank, region) exactly; *seg_out = -1: none. */
static int sum_writing(const tide_program_t *prog, const tide_schedule_t *s, const writes_t *w,
                       int rank, int region, uint64_t lo, uint64_t bytes, int *seg_out) {
    *seg_out = -1;
    for (int i = 0; i < w->n; ++i) {
        const write_t *x = &w->v[i];
        if (x->kind != TIDE_OP_SUM || x->rank != rank || x->region != region || lo < x->lo ||
            lo + bytes > x->hi)
            continue;
        const int t = tide_direct_thread_of(s, x->op);
        const tide_op_t *op = tide_schedule_op(prog, s, x->op, t);
        const tide_table_t *tb = &prog->ranks[t / TIDE_Q_COUNT].tables[op->table];
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

static const tide_table_t *op_table(const tide_program_t *prog, const tide_schedule_t *s, int id) {
    const int t = tide_direct_thread_of(s, id);
    const tide_op_t *op = tide_schedule_op(prog, s, id, t);
    return &prog->ranks[t / TIDE_Q_COUNT].tables[op->table];
}

/* Which SUMs store their segments as the landings that read them (see the top). */
static tide_result_t fuse_plan(const tide_program_t *prog, const tide_schedule_t *s,
                               tide_direct_t *d, const writes_t *w, int L) {
    const int n = s->num_ops;
    d->fuse = calloc((size_t)n + 1, sizeof(*d->fuse));
    d->fuse_segs = calloc((size_t)n + 1, sizeof(*d->fuse_segs));
    d->fused_land = calloc((size_t)n + 1, 1);
    uint8_t *sum_ok = calloc((size_t)n + 1, 1);
    tide_result_t res = TIDE_SUCCESS;
    if (d->fuse == NULL || d->fuse_segs == NULL || d->fused_land == NULL || sum_ok == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "direct mode: fused sums");
        goto done;
    }
    /* Candidate landings: every segment has one live input, an alias of a SUM segment; no
     * other landing of the rank writes any of its outputs (several waves of one output land
     * in their queue's order: fused, their sums would race on it); and the SUM runs on the
     * landing's rank or waits for that rank's pushes (so it follows the rank's start). */
    for (int id = 0; id < n; ++id) {
        if (d->land_src[id] == NULL) continue;
        const tide_table_t *lt = op_table(prog, s, id);
        const int lrank = tide_direct_thread_of(s, id) / TIDE_Q_COUNT;
        bool ok = true;
        for (int o2 = 0; ok && o2 < n; ++o2) {
            if (o2 == id || tide_direct_thread_of(s, o2) / TIDE_Q_COUNT != lrank) continue;
            const tide_op_t *op2 = tide_schedule_op(prog, s, o2, tide_direct_thread_of(s, o2));
            if (op2->kind != TIDE_OP_LAND) continue;
            const tide_table_t *t2 = op_table(prog, s, o2);
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
                if (d->land_src[id][(size_t)g * lt->num_in + k].kind != TIDE_DIRECT_LAND_ZERO)
                    ++live, at = k;
            const tide_direct_land_src_t *o =
                at >= 0 ? &d->land_src[id][(size_t)g * lt->num_in + at] : NULL;
            if (live != 1 ||
                (o->kind != TIDE_DIRECT_LAND_ALIAS && o->kind != TIDE_DIRECT_LAND_READ)) {
                ok = false;
                break;
            }
            /* The bytes the landing reads: an elided copy's source, or (M = 1) its input
             * itself; either must be exactly one SUM segment's output. */
            tide_ref_t from = lt->in[at];
            uint64_t from_off = from.offset + lt->land_segs[g].in_off * 4u;
            if (o->kind == TIDE_DIRECT_LAND_ALIAS) {
                const tide_op_t *copy =
                    tide_schedule_op(prog, s, o->copy, tide_direct_thread_of(s, o->copy));
                from = copy->src;
                from_off = copy->src.offset + o->delta;
            }
            if (from.kind != TIDE_REF_ARENA) {
                ok = false;
                break;
            }
            int j;
            const int sum = sum_writing(prog, s, w, from.rank, from.region, from_off,
                                        (uint64_t)lt->land_segs[g].len * 4u, &j);
            if (sum < 0) {
                ok = false;
                break;
            }
            const int srank = tide_direct_thread_of(s, sum) / TIDE_Q_COUNT;
            if (srank != lrank &&
                (srank / L != lrank / L || op_table(prog, s, sum)->num_staged < 1)) {
                ok = false;
                break;
            }
            if (d->fuse[sum] == NULL) {
                const tide_table_t *st = op_table(prog, s, sum);
                tide_direct_fuse_seg_t *f = malloc((size_t)(st->num_segs + 1) * sizeof(*f));
                if (f == NULL) {
                    res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "direct mode: fused sums");
                    goto done;
                }
                for (int q = 0; q < st->num_segs; ++q)
                    f[q] = (tide_direct_fuse_seg_t){-1, -1};
                d->fuse[sum] = f;
                d->fuse_segs[sum] = st->num_segs;
                sum_ok[sum] = 1;
            }
            if (d->fuse[sum][j].land >= 0) {
                ok = false; /* read by two landings */
                sum_ok[sum] = 0;
                break;
            }
            d->fuse[sum][j] = (tide_direct_fuse_seg_t){id, g};
        }
        d->fused_land[id] = ok;
    }
    /* A SUM fuses only if every segment goes to a fusing landing, a landing only if every
     * segment comes from a fusing SUM: drop both until nothing changes. */
    for (bool changed = true; changed;) {
        changed = false;
        for (int id = 0; id < n; ++id) {
            const tide_direct_fuse_seg_t *f = d->fuse[id];
            if (f == NULL || !sum_ok[id]) continue;
            const tide_table_t *st = op_table(prog, s, id);
            for (int q = 0; q < d->fuse_segs[id]; ++q)
                if (st->sum_segs[q].len > 0 && (f[q].land < 0 || !d->fused_land[f[q].land])) {
                    sum_ok[id] = 0;
                    changed = true;
                    break;
                }
        }
        for (int id = 0; id < n; ++id) {
            if (!d->fused_land[id]) continue;
            for (int sum = 0; sum < n && d->fused_land[id]; ++sum) {
                const tide_direct_fuse_seg_t *f = d->fuse[sum];
                if (f == NULL || sum_ok[sum]) continue;
                for (int q = 0; q < d->fuse_segs[sum]; ++q)
                    if (f[q].land == id) {
                        d->fused_land[id] = 0;
                        changed = true;
                        break;
                    }
            }
        }
    }
    for (int id = 0; id < n; ++id)
        if (d->fuse[id] != NULL && !sum_ok[id]) {
            free(d->fuse[id]);
            d->fuse[id] = NULL;
            d->fuse_segs[id] = 0;
        }
done:
    free(sum_ok);
    return res;
}

static tide_result_t analyse(const tide_program_t *prog, const tide_schedule_t *s, tide_direct_t *d,
                             int mask, writes_t *w, uint8_t **cand_out) {
    TIDE_CHECK(collect_writes(prog, s, w));
    uint8_t *cand = calloc((size_t)w->n + 1, 1);
    *cand_out = cand;
    if (cand == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "direct mode: %d writes", w->n);
    for (int i = 0; i < w->n; ++i) {
        const write_t *x = &w->v[i];
        if (!(mask & TIDE_DIRECT_ALIAS) || x->kind != TIDE_OP_COPY ||
            x->region != TIDE_REGION_INBOX)
            continue;
        int t = 0;
        while (t + 1 < s->num_threads && s->op_base[t + 1] <= x->op)
            ++t;
        cand[i] = alias_candidate(w, x, tide_schedule_op(prog, s, x->op, t));
    }
    drop_partial(prog, s, w, cand);
    /* Staging pushes: every copy into STAGING. */
    for (int i = 0; i < w->n; ++i) {
        const write_t *x = &w->v[i];
        if ((mask & TIDE_DIRECT_SUM) && (x->kind == TIDE_OP_COPY || x->kind == TIDE_OP_COPY2D) &&
            x->region == TIDE_REGION_STAGING)
            d->elide[x->op] = 1;
        else if (cand[i])
            d->elide[x->op] = 1;
    }
    for (int t = 0; t < s->num_threads; ++t)
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            const tide_op_t *op = tide_schedule_op(prog, s, id, t);
            if (op->kind == TIDE_OP_LAND)
                TIDE_CHECK(land_sources(prog, d, w, cand, mask, id, t / TIDE_Q_COUNT, op));
        }
    if (mask & TIDE_DIRECT_FUSE) TIDE_CHECK(fuse_plan(prog, s, d, w, d->l));
    return TIDE_SUCCESS;
}

tide_result_t tide_direct_analyse_rs(const tide_program_t *prog, const tide_schedule_t *s,
                                     tide_direct_t *d) {
    d->elide = calloc((size_t)s->num_ops + 1, 1);
    d->land_src = calloc((size_t)s->num_ops + 1, sizeof(*d->land_src));
    if (d->elide == NULL || d->land_src == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "direct mode: %d ops", s->num_ops);
    writes_t w = {0};
    uint8_t *cand = NULL;
    tide_result_t res = analyse(prog, s, d, d->mask, &w, &cand);
    free(w.v);
    free(cand);
    if (res == TIDE_SUCCESS) {
        d->rs = true;
        d->sum = (d->mask & TIDE_DIRECT_SUM) != 0;
    }
    return res;
}

int tide_direct_thread_of(const tide_schedule_t *s, int id) {
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

/* Whether every node's ranks share one memory. */
static bool nodes_shared(const int *domain, int ranks, int l) {
    if (domain == NULL) return true;
    for (int r = 0; r < ranks; ++r)
        if (domain[r] != domain[r - r % l]) return false;
    return true;
}

void tide_direct_free(tide_direct_t *d) {
    if (d == NULL) return;
    for (int id = 0; id < d->num_ops; ++id) {
        if (d->land_src != NULL) free(d->land_src[id]);
        if (d->fuse != NULL) free(d->fuse[id]);
    }
    free(d->land_src);
    free(d->fuse);
    free(d->fuse_segs);
    free(d->fused_land);
    free(d->elide);
    free(d->ag_src);
    free(d->ag_wait);
    memset(d, 0, sizeof(*d));
}

tide_result_t tide_direct_analyse(const tide_program_t *prog, const tide_schedule_t *sched,
                                  int mask, const int *domain, tide_direct_t *out) {
    if (prog == NULL || sched == NULL || out == NULL || sched->op_base == NULL ||
        sched->num_ranks != prog->num_ranks)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "direct mode: no program or schedule to analyse");
    tide_direct_t d;
    memset(&d, 0, sizeof(d));
    d.num_ops = sched->num_ops;
    d.num_ranks = prog->num_ranks;
    d.mask = mask & TIDE_DIRECT_ALL;
    d.l = prog->plan->config.gpus_per_node;
    tide_result_t res = TIDE_SUCCESS;
    if (prog->fence || d.l < 1 || prog->num_ranks % d.l != 0 || prog->plan->rs.rail_lane) {
        /* A fence has no copies to elide (it is compiled as an all-gather).  Nor has the rail
         * lane (L = 1, docs/protocol.md): its puts go from landing to landing and its
         * reduce-scatter pushes no Level-1 piece; its landings read bf16 inbox blocks, which
         * the alias, zero and fuse rules (written for fp32 partials) do not describe. */
    } else if (prog->coll == TIDE_COLL_REDUCE_SCATTER) {
        if ((d.mask & (TIDE_DIRECT_ALL & ~TIDE_DIRECT_AG)) != 0 &&
            nodes_shared(domain, prog->num_ranks, d.l))
            res = tide_direct_analyse_rs(prog, sched, &d);
    } else if ((d.mask & TIDE_DIRECT_AG) && prog->plan->config.nodes >= 2) {
        res = tide_direct_analyse_ag(prog, sched, domain, &d);
    }
    if (res != TIDE_SUCCESS) {
        tide_direct_free(&d);
        return res;
    }
    *out = d;
    return TIDE_SUCCESS;
}
