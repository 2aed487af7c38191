/*
 * test_compile_rs.c - the TIDE-RS compiler, checked by symbolic execution.
 *
 * Every element of every buffer carries a symbolic value: which gradient element it is a sum
 * of (call e, parameter p, flat element g of G_p) and the set of source ranks u whose G_p^(u)
 * it contains; adding two values of different elements, or the same source twice, poisons
 * the result.  Gradients of rank u in call e read as (e, p, g, {u}); the output starts each
 * call poisoned.  The ops of all ranks then run over several consecutive calls, in a random
 * order that respects only queue order and counter waits (cumulative counters, epoch
 * thresholds), so stale blocks, early reuse or a missing wait show up as wrong values.
 *
 * At the end, every output element (r, p, x) must equal (e, p, r E_p + x, all N sources) for
 * real rows and hold nothing for padding rows (I1).  Along the way: no gradient is read after
 * the rank's read-done event (I2), no output is written after call-done, every access stays
 * inside its region, every WAIT's inc equals the number of signals that reach its counter per
 * call, and no schedule deadlocks.  Mutated programs (a dropped credit, zeroing or join, the
 * staging credits of the first protocol text) must fail the same evaluation, which shows it
 * is not vacuous.
 */
#include "test_util.h"

#include "core/checks.h"
#include "plan/plan.h"
#include "program/machine.h"
#include "program/counters.h"
#include "program/program.h"

#include <stdbool.h>

#define CALLS 4
#define MAX_RANKS 128

/* ------------------------------------------------------------------ symbolic values */

enum { V_BAD = 1 }; /* a mix of different elements, a duplicate source, or never written */

typedef struct {
    int16_t call; /* -1: zero (nothing summed) */
    int16_t param;
    uint32_t flags;
    uint64_t elem;
    uint64_t src[MAX_RANKS / 64];
} val_t;

static val_t v_zero(void) {
    val_t v;
    memset(&v, 0, sizeof(v));
    v.call = -1;
    return v;
}

static val_t v_poison(void) {
    val_t v = v_zero();
    v.flags = V_BAD;
    return v;
}

static bool v_is_zero(const val_t *v) {
    if (v->call != -1 || v->flags) return false;
    for (int w = 0; w < MAX_RANKS / 64; ++w)
        if (v->src[w]) return false;
    return true;
}

static val_t v_add(val_t a, val_t b) {
    if (v_is_zero(&a)) return b;
    if (v_is_zero(&b)) return a;
    val_t r = a;
    r.flags |= b.flags;
    if (a.call != b.call || a.param != b.param || a.elem != b.elem) r.flags |= V_BAD;
    for (int w = 0; w < MAX_RANKS / 64; ++w) {
        if (a.src[w] & b.src[w]) r.flags |= V_BAD;
        r.src[w] |= b.src[w];
    }
    return r;
}

/* ------------------------------------------------------------------ the machine */

static const tide_region_t k_regions[] = {TIDE_REGION_STAGING, TIDE_REGION_OUTBOX,
                                          TIDE_REGION_SPARE, TIDE_REGION_INBOX};
#define NUM_REGIONS 4

typedef struct {
    const tide_program_t *prog;
    const struct tide_plan *plan;
    int n, l, calls;
    uint64_t grad_item;
    val_t *arena[NUM_REGIONS]; /* [rank][cells] */
    uint64_t cells[NUM_REGIONS];
    val_t *out;   /* [call][rank][shard elems] */
    int64_t *ctr; /* [rank][counters] */
    uint64_t num_ctrs;
    bool *read_done, *call_done; /* [call][rank] */
    int *pc;                     /* [rank][queue]: ops executed over all calls */
    uint64_t rng;
    char err[512];
} sim_t;

static uint64_t rng_next(sim_t *s) {
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return s->rng;
}

static int sim_fail(sim_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sim_fail(sim_t *s, const char *fmt, ...) {
    if (s->err[0] == '\0') {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->err, sizeof(s->err), fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int region_index(int region) {
    for (int i = 0; i < NUM_REGIONS; ++i)
        if ((int)k_regions[i] == region) return i;
    return -1;
}

/* A resolved buffer: element `base` of an arena region, a gradient or an output. */
typedef struct {
    int kind; /* TIDE_REF_* */
    int rank, region, param, call;
    uint64_t base, item;
} buf_t;

static int resolve(sim_t *s, int rank, int call, const tide_ref_t *ref, bool bank_dep, buf_t *out) {
    buf_t b = {ref->kind, rank, -1, ref->param, call, 0, 4};
    uint64_t off = ref->offset;
    switch (ref->kind) {
    case TIDE_REF_ARENA:
        b.rank = ref->rank;
        b.region = region_index(ref->region);
        if (b.rank < 0 || b.rank >= s->n || b.region < 0)
            return sim_fail(s, "ref to rank %d region %d", ref->rank, ref->region);
        if (ref->region == TIDE_REGION_STAGING) b.item = s->grad_item;
        if (bank_dep) off += (uint64_t)(call % 2) * s->prog->bank_bytes[ref->region];
        break;
    case TIDE_REF_GRAD:
        if (ref->param < 0 || ref->param >= s->plan->geom.num_params)
            return sim_fail(s, "gradient of parameter %d", ref->param);
        b.item = s->grad_item;
        break;
    case TIDE_REF_OUT:
        break;
    default:
        return sim_fail(s, "unexpected ref kind %d in an RS program", ref->kind);
    }
    if (off % b.item)
        return sim_fail(s, "offset %llu not a multiple of %llu", (unsigned long long)off,
                        (unsigned long long)b.item);
    b.base = off / b.item;
    *out = b;
    return 0;
}

static val_t *cell(sim_t *s, const buf_t *b, uint64_t i, bool write) {
    uint64_t at = b->base + i;
    if (b->kind == TIDE_REF_ARENA) {
        if (at >= s->cells[b->region]) {
            sim_fail(s, "access past region %s of rank %d (element %llu of %llu)",
                     tide_region_name(k_regions[b->region]), b->rank, (unsigned long long)at,
                     (unsigned long long)s->cells[b->region]);
            return NULL;
        }
        return &s->arena[b->region][(uint64_t)b->rank * s->cells[b->region] + at];
    }
    if (b->kind == TIDE_REF_OUT) {
        uint64_t e = s->plan->geom.shard_elems;
        if (at >= e) {
            sim_fail(s, "output element %llu past %llu", (unsigned long long)at,
                     (unsigned long long)e);
            return NULL;
        }
        if (write && s->call_done[b->call * s->n + b->rank]) {
            sim_fail(s, "rank %d writes its call-%d output after call-done", b->rank, b->call);
            return NULL;
        }
        return &s->out[((uint64_t)b->call * s->n + b->rank) * e + at];
    }
    sim_fail(s, "cell of ref kind %d", b->kind);
    return NULL;
}

/* Element i of a buffer, gradients generated on the fly. */
static int load(sim_t *s, const buf_t *b, uint64_t i, val_t *v) {
    if (b->kind == TIDE_REF_GRAD) {
        const tide_geom_param_t *gp = &s->plan->geom.params[b->param];
        uint64_t at = b->base + i;
        if (at >= gp->dim0 * gp->inner)
            return sim_fail(s, "rank %d reads gradient %d element %llu past D_p K_p = %llu",
                            b->rank, b->param, (unsigned long long)at,
                            (unsigned long long)(gp->dim0 * gp->inner));
        if (s->read_done[b->call * s->n + b->rank])
            return sim_fail(s, "rank %d reads its call-%d gradient after read-done", b->rank,
                            b->call);
        *v = v_zero();
        v->call = (int16_t)b->call;
        v->param = (int16_t)b->param;
        v->elem = at;
        v->src[b->rank / 64] |= (uint64_t)1 << (b->rank % 64);
        return 0;
    }
    val_t *c = cell(s, b, i, false);
    if (c == NULL) return -1;
    *v = *c;
    return 0;
}

static int store(sim_t *s, const buf_t *b, uint64_t i, val_t v) {
    if (b->kind == TIDE_REF_GRAD) return sim_fail(s, "write into a gradient");
    val_t *c = cell(s, b, i, true);
    if (c == NULL) return -1;
    *c = v;
    return 0;
}

static int copy_run(sim_t *s, const buf_t *dst, uint64_t d0, const buf_t *src, uint64_t s0,
                    uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
        val_t v;
        if (load(s, src, s0 + i, &v) || store(s, dst, d0 + i, v)) return -1;
    }
    return 0;
}

static int exec_copy(sim_t *s, int rank, int call, const tide_op_t *op) {
    buf_t d, sr;
    if (resolve(s, rank, call, &op->dst, op->bank_dep, &d) ||
        resolve(s, rank, call, &op->src, op->bank_dep, &sr))
        return -1;
    if (d.item != sr.item || op->bytes % d.item)
        return sim_fail(s, "copy of %llu bytes between items %llu and %llu",
                        (unsigned long long)op->bytes, (unsigned long long)d.item,
                        (unsigned long long)sr.item);
    const uint64_t n = op->bytes / d.item;
    if (op->kind == TIDE_OP_COPY) return copy_run(s, &d, 0, &sr, 0, n);
    if (op->src_pitch % d.item || op->dst_pitch % d.item)
        return sim_fail(s, "2D copy pitches not multiples of the item");
    for (uint64_t r = 0; r < op->rows; ++r)
        if (copy_run(s, &d, r * (op->dst_pitch / d.item), &sr, r * (op->src_pitch / d.item), n))
            return -1;
    return 0;
}

static int exec_sum(sim_t *s, int rank, int call, const tide_op_t *op) {
    const tide_rank_program_t *rp = &s->prog->ranks[rank];
    if (op->table < 0 || op->table >= rp->num_tables || rp->tables[op->table].kind != TIDE_OP_SUM)
        return sim_fail(s, "SUM with table %d", op->table);
    const tide_table_t *t = &rp->tables[op->table];
    buf_t out, staged = {0};
    if (resolve(s, rank, call, &t->out, op->bank_dep, &out)) return -1;
    if (t->num_staged > 0 && resolve(s, rank, call, &t->staged, op->bank_dep, &staged)) return -1;
    for (int x = 0; x < t->num_segs; ++x) {
        const tide_sum_seg_t *sg = &t->sum_segs[x];
        tide_ref_t own_ref = tide_ref_operand(TIDE_REF_GRAD, sg->own_idx, 0);
        buf_t own;
        if (resolve(s, rank, call, &own_ref, false, &own)) return -1;
        for (uint32_t i = 0; i < sg->len; ++i) {
            val_t acc = v_zero(), v;
            if (i < sg->valid) {
                for (int k = 0; k < t->num_staged; ++k) {
                    if (load(s, &staged, (uint64_t)k * t->stage_stride + sg->stage_off + i, &v))
                        return -1;
                    acc = v_add(acc, v);
                }
                if (load(s, &own, sg->own_off + i, &v)) return -1;
                acc = v_add(acc, v);
            }
            if (store(s, &out, sg->out_off + i, acc)) return -1;
        }
    }
    return 0;
}

static int exec_land(sim_t *s, int rank, int call, const tide_op_t *op) {
    const tide_rank_program_t *rp = &s->prog->ranks[rank];
    if (op->table < 0 || op->table >= rp->num_tables || rp->tables[op->table].kind != TIDE_OP_LAND)
        return sim_fail(s, "LAND with table %d", op->table);
    const tide_table_t *t = &rp->tables[op->table];
    buf_t in[TIDE_MAX_GPUS_PER_NODE], out;
    tide_ref_t out_ref = tide_ref_operand(TIDE_REF_OUT, 0, 0);
    if (resolve(s, rank, call, &out_ref, false, &out)) return -1;
    for (int j = 0; j < t->num_in; ++j)
        if (resolve(s, rank, call, &t->in[j], op->bank_dep, &in[j])) return -1;
    for (int x = 0; x < t->num_segs; ++x) {
        const tide_land_seg_t *sg = &t->land_segs[x];
        for (uint32_t i = 0; i < sg->len; ++i) {
            val_t v = v_zero(), w;
            for (int j = 0; j < t->num_in; ++j) {
                if (load(s, &in[j], sg->in_off + i, &w)) return -1;
                v = v_add(v, w);
            }
            if (!op->init) {
                if (load(s, &out, sg->out_off + i, &w)) return -1;
                v = v_add(w, v);
            }
            if (store(s, &out, sg->out_off + i, v)) return -1;
        }
    }
    return 0;
}

static int exec_op(sim_t *s, int rank, int call, const tide_op_t *op) {
    switch (op->kind) {
    case TIDE_OP_COPY:
    case TIDE_OP_COPY2D:
        if (exec_copy(s, rank, call, op)) return -1;
        if (tide_machine_signals(op)) s->ctr[(uint64_t)op->sig_rank * s->num_ctrs + op->ctr] += 1;
        return 0;
    case TIDE_OP_SIGNAL:
        s->ctr[(uint64_t)op->sig_rank * s->num_ctrs + op->ctr] += 1;
        return 0;
    case TIDE_OP_WAIT:
        return 0;
    case TIDE_OP_ZERO: {
        buf_t d;
        if (resolve(s, rank, call, &op->dst, op->bank_dep, &d)) return -1;
        for (uint64_t i = 0; i < op->bytes / d.item; ++i)
            if (store(s, &d, i, v_zero())) return -1;
        return 0;
    }
    case TIDE_OP_SUM:
        return exec_sum(s, rank, call, op);
    case TIDE_OP_LAND:
        return exec_land(s, rank, call, op);
    case TIDE_OP_EVENT:
        if (op->event == TIDE_EVENT_READ_DONE)
            s->read_done[call * s->n + rank] = true;
        else if (op->event == TIDE_EVENT_CALL_DONE)
            s->call_done[call * s->n + rank] = true;
        else
            return sim_fail(s, "event %d", op->event);
        return 0;
    default:
        return sim_fail(s, "unexpected op kind %d", op->kind);
    }
}

/* The head op of (rank, q), or NULL when the queue finished all calls. */
static const tide_op_t *head(const sim_t *s, int rank, int q, int *call_out) {
    const tide_queue_ops_t *qo = &s->prog->ranks[rank].queues[q];
    if (qo->num_ops == 0) return NULL;
    int pc = s->pc[rank * TIDE_Q_COUNT + q];
    if (pc >= s->calls * qo->num_ops) return NULL;
    *call_out = pc / qo->num_ops;
    return &qo->ops[pc % qo->num_ops];
}

/* The machine's wait rule (program/machine.h).  The simulator's order is deliberately weaker
 * than the machine's: a queue may start its next call before its rank's other queues finished
 * theirs, so it explores a superset of the fabrics' interleavings. */
static bool runnable(const sim_t *s, int rank, const tide_op_t *op, int call) {
    if (op->kind != TIDE_OP_WAIT) return true;
    int64_t target = 0;
    assert_true(tide_machine_wait_target((uint64_t)call, op, &target));
    return tide_machine_wait_passes(s->ctr[(uint64_t)rank * s->num_ctrs + op->ctr], target);
}

/*
 * Runs every queue of every rank over s->calls calls; 0 on success.  Odd seeds schedule by
 * random priorities, reshuffled now and then, so that some queues run far ahead of others
 * (the skew that exposes a missing credit); even seeds pick uniformly among runnable queues.
 */
static int sim_run(sim_t *s) {
    const int queues = s->n * TIDE_Q_COUNT;
    const bool by_priority = s->rng & 1;
    uint32_t *prio = calloc((size_t)queues, sizeof(uint32_t));
    assert_non_null(prio);
    uint64_t steps = 0, reshuffle = 0;
    int res = 0;
    for (;; ++steps) {
        if (by_priority && steps == reshuffle) {
            for (int id = 0; id < queues; ++id)
                prio[id] = (uint32_t)rng_next(s);
            reshuffle = steps + 20 + rng_next(s) % 400;
        }
        int start = (int)(rng_next(s) % (uint64_t)queues), picked = -1, alive = 0;
        for (int x = 0; x < queues; ++x) {
            int id = (start + x) % queues, call;
            const tide_op_t *op = head(s, id / TIDE_Q_COUNT, id % TIDE_Q_COUNT, &call);
            if (op == NULL) continue;
            ++alive;
            if (!runnable(s, id / TIDE_Q_COUNT, op, call)) continue;
            if (picked < 0 || (by_priority && prio[id] > prio[picked])) picked = id;
            if (!by_priority) break;
        }
        if (alive == 0) break;
        if (picked < 0) {
            for (int id = 0; id < queues; ++id) {
                int call;
                const tide_op_t *op = head(s, id / TIDE_Q_COUNT, id % TIDE_Q_COUNT, &call);
                if (op == NULL) continue;
                res = sim_fail(
                    s, "deadlock: rank %d %s op %d of call %d waits ctr %d >= %lld",
                    id / TIDE_Q_COUNT, tide_queue_name((tide_queue_t)(id % TIDE_Q_COUNT)),
                    s->pc[id] % s->prog->ranks[id / TIDE_Q_COUNT].queues[id % TIDE_Q_COUNT].num_ops,
                    call, op->ctr, (long long)(call * op->inc + op->thr));
                break;
            }
            break;
        }
        /* A short burst of the picked queue, so that queues also run far ahead. */
        int burst = 1 + (int)(rng_next(s) % 4), rank = picked / TIDE_Q_COUNT, call;
        for (int b = 0; b < burst; ++b) {
            const tide_op_t *op = head(s, rank, picked % TIDE_Q_COUNT, &call);
            if (op == NULL || !runnable(s, rank, op, call)) break;
            if (exec_op(s, rank, call, op)) {
                res = -1;
                break;
            }
            s->pc[picked] += 1;
        }
        if (res) break;
    }
    free(prio);
    return res;
}

/* I1 on every output element of every call. */
static int sim_check_outputs(sim_t *s) {
    const tide_geom_t *g = &s->plan->geom;
    for (int call = 0; call < s->calls; ++call)
        for (int r = 0; r < s->n; ++r)
            for (int p = 0; p < g->num_params; ++p) {
                const tide_geom_param_t *gp = &g->params[p];
                for (uint64_t x = 0; x < gp->shard_elems; ++x) {
                    const val_t *v =
                        &s->out[((uint64_t)call * s->n + r) * g->shard_elems + gp->elem_offset + x];
                    const uint64_t elem = (uint64_t)r * gp->shard_elems + x;
                    if (elem >= gp->dim0 * gp->inner) {
                        if (!v_is_zero(v))
                            return sim_fail(s,
                                            "call %d rank %d param %d: padding element %llu "
                                            "received data (flags %u)",
                                            call, r, p, (unsigned long long)x, v->flags);
                        continue;
                    }
                    int count = 0;
                    for (int w = 0; w < MAX_RANKS / 64; ++w)
                        count += __builtin_popcountll(v->src[w]);
                    if (v->flags || v->call != call || v->param != p || v->elem != elem ||
                        count != s->n)
                        return sim_fail(s,
                                        "call %d rank %d param %d element %llu: flags %u, "
                                        "call %d, param %d, elem %llu, %d of %d sources",
                                        call, r, p, (unsigned long long)x, v->flags, v->call,
                                        v->param, (unsigned long long)v->elem, count, s->n);
                }
            }
    return 0;
}

/* Executes `prog` over CALLS calls with one seed; returns 0 or -1 with the reason in err. */
static int simulate(const tide_program_t *prog, uint64_t seed, char *err, size_t err_size) {
    sim_t s;
    memset(&s, 0, sizeof(s));
    s.prog = prog;
    s.plan = prog->plan;
    s.n = prog->plan->topo.ranks;
    s.l = prog->plan->topo.gpus_per_node;
    s.calls = CALLS;
    s.grad_item = prog->plan->geom.grad_item;
    s.num_ctrs = tide_ctr_count(prog->plan);
    /* Never zero (xorshift's fixed point); the low bit picks the scheduler. */
    s.rng = ((seed * 0x9e3779b97f4a7c15ull) | 2u) & ~1ull;
    s.rng |= seed & 1;
    assert_true(s.n <= MAX_RANKS);
    for (int i = 0; i < NUM_REGIONS; ++i) {
        uint64_t item = k_regions[i] == TIDE_REGION_STAGING ? s.grad_item : 4;
        s.cells[i] = prog->plan->arena.regions[k_regions[i]].bytes / item;
        s.arena[i] = malloc((s.cells[i] * (uint64_t)s.n + 1) * sizeof(val_t));
        assert_non_null(s.arena[i]);
        /* A fresh arena is zero-filled. */
        for (uint64_t c = 0; c < s.cells[i] * (uint64_t)s.n; ++c)
            s.arena[i][c] = v_zero();
    }
    const uint64_t outs = (uint64_t)CALLS * s.n * prog->plan->geom.shard_elems;
    s.out = malloc(outs * sizeof(val_t));
    s.ctr = calloc((size_t)s.n * s.num_ctrs, sizeof(int64_t));
    s.read_done = calloc((size_t)CALLS * s.n, sizeof(bool));
    s.call_done = calloc((size_t)CALLS * s.n, sizeof(bool));
    s.pc = calloc((size_t)s.n * TIDE_Q_COUNT, sizeof(int));
    assert_true(s.out && s.ctr && s.read_done && s.call_done && s.pc);
    for (uint64_t i = 0; i < outs; ++i)
        s.out[i] = v_poison(); /* whatever the caller's output held */

    int res = sim_run(&s);
    if (res == 0) res = sim_check_outputs(&s);
    snprintf(err, err_size, "%s", s.err);
    for (int i = 0; i < NUM_REGIONS; ++i)
        free(s.arena[i]);
    free(s.out);
    free(s.ctr);
    free(s.read_done);
    free(s.call_done);
    free(s.pc);
    return res;
}

/* ------------------------------------------------------------------ static checks */

/* Signals per (rank, counter), counted by the abstract machine (which also checks every
 * signal's rank and counter bounds); an RS program signals only RS counters. */
static int64_t *count_signals(const tide_program_t *prog, uint64_t num_ctrs) {
    int64_t *count = NULL;
    assert_int_equal(tide_machine_count_signals(prog, (int)num_ctrs, &count), TIDE_SUCCESS);
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int c = 0; c < TIDE_CTR_RS_BASE; ++c)
            assert_int_equal(count[(uint64_t)r * num_ctrs + (uint64_t)c], 0);
    return count;
}

static int count_kind(const tide_queue_ops_t *qo, int kind) {
    int n = 0;
    for (int i = 0; i < qo->num_ops; ++i)
        n += qo->ops[i].kind == kind;
    return n;
}

/* What the protocol fixes independently of timing. */
static void check_static(const tide_program_t *prog) {
    const struct tide_plan *plan = prog->plan;
    const tide_rs_schedule_t *rs = &plan->rs;
    const int M = plan->topo.nodes, L = plan->topo.gpus_per_node;
    const int D = rs->passes * M, D_rem = rs->passes * (M - 1);
    const uint64_t num_ctrs = tide_ctr_count(plan);
    assert_true(num_ctrs <= TIDE_ARENA_SIGNAL_SLOTS);
    int64_t *count = count_signals(prog, num_ctrs);
    const uint64_t block = 4ull * L * rs->subslice_elems;
    assert_int_equal(prog->bank_bytes[TIDE_REGION_OUTBOX], (uint64_t)rs->outbox_depth * block);
    assert_int_equal(prog->bank_bytes[TIDE_REGION_SPARE], (uint64_t)rs->passes * block);

    for (int r = 0; r < prog->num_ranks; ++r) {
        const tide_rank_program_t *rp = &prog->ranks[r];
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const tide_queue_ops_t *qo = &rp->queues[q];
            for (int i = 0; i < qo->num_ops; ++i) {
                const tide_op_t *op = &qo->ops[i];
                if (op->kind == TIDE_OP_WAIT) {
                    /* inc is the exact per-call signal count; thr never exceeds it. */
                    assert_true(op->ctr >= TIDE_CTR_RS_BASE && (uint64_t)op->ctr < num_ctrs);
                    int64_t n = count[(uint64_t)r * num_ctrs + op->ctr];
                    if (n != op->inc)
                        print_error("rank %d %s[%d]: ctr %d inc %lld, %lld signals\n", r,
                                    tide_queue_name((tide_queue_t)q), i, op->ctr,
                                    (long long)op->inc, (long long)n);
                    assert_int_equal(op->inc, n);
                    assert_true(n >= 1 && op->thr <= op->inc);
                }
                /* Banks: only the outbox and the spares alternate; at M = 1 the landings
                 * read the spares. */
                if (op->bank_dep)
                    assert_true(op->kind == TIDE_OP_SUM || (M == 1 && op->kind == TIDE_OP_LAND) ||
                                (op->src.kind == TIDE_REF_ARENA &&
                                 (op->src.region == TIDE_REGION_OUTBOX ||
                                  op->src.region == TIDE_REGION_SPARE)));
                /* In-Place: no sum waits for this call's network (read-done never does). */
                if (q == TIDE_Q_READ && op->kind == TIDE_OP_WAIT && op->ctr == TIDE_CTR_RS_SENT &&
                    rs->outbox_depth >= D_rem)
                    assert_true(op->thr <= -D_rem);
            }
        }
        /* One sum per destination, one landing per wave (M = 1: one per wave and owner),
         * one put per remote destination, one spare copy per pass (none at M = 1). */
        assert_int_equal(count_kind(&rp->queues[TIDE_Q_READ], TIDE_OP_SUM), D);
        assert_int_equal(count_kind(&rp->queues[TIDE_Q_NET], TIDE_OP_LAND),
                         M == 1 ? rs->num_waves * L : rs->num_waves);
        assert_int_equal(count_kind(&rp->queues[TIDE_Q_NET], TIDE_OP_COPY),
                         D_rem + (M == 1 ? 0 : rs->passes));
        assert_int_equal(count_kind(&rp->queues[TIDE_Q_READ], TIDE_OP_EVENT), 1);
        assert_int_equal(count_kind(&rp->queues[TIDE_Q_NET], TIDE_OP_EVENT), 1);
        if (L == 1) assert_int_equal(rp->queues[TIDE_Q_CE].num_ops, 0);
        for (int q = TIDE_Q_READY; q <= TIDE_Q_DONE; ++q)
            if (q != TIDE_Q_CE) assert_int_equal(rp->queues[q].num_ops, 0);
        for (int t = 0; t < rp->num_tables; ++t) {
            const tide_table_t *tb = &rp->tables[t];
            if (tb->kind == TIDE_OP_SUM) {
                assert_int_equal(tb->num_staged, L - 1);
            } else if (M == 1) {
                /* One input, the owner's spare; + 0.0f stands for the L - 1 zero rows. */
                assert_int_equal(tb->num_in, 1);
                assert_int_equal(tb->in[0].kind, TIDE_REF_ARENA);
                assert_int_equal(tb->in[0].region, TIDE_REGION_SPARE);
                assert_int_equal(tb->plus_zero, L > 1);
            } else {
                assert_int_equal(tb->num_in, L);
                assert_int_equal(tb->plus_zero, 0);
            }
        }
    }
    /* Slot-Reuse with a partial outbox: some sum waits for this call's sends. */
    if (rs->outbox_depth < D_rem) {
        bool found = false;
        const tide_queue_ops_t *qo = &prog->ranks[0].queues[TIDE_Q_READ];
        for (int i = 0; i < qo->num_ops; ++i)
            found |= qo->ops[i].kind == TIDE_OP_WAIT && qo->ops[i].ctr == TIDE_CTR_RS_SENT &&
                     qo->ops[i].thr > 0;
        assert_true(found);
    }
    free(count);
}

/* ------------------------------------------------------------------ configurations */

typedef struct {
    int m, l, wave_width, round_width, staging_slots;
    tide_dtype_t grad;
} shape_t;

static const shape_t k_shapes[] = {
    {1, 1, 0, 0, 0, TIDE_DTYPE_BF16},
    {1, 4, 0, 0, 0, TIDE_DTYPE_FP32},
    {2, 2, 0, 0, 0, TIDE_DTYPE_BF16},
    {2, 4, 0, 0, 3, TIDE_DTYPE_BF16},
    {3, 2, 0, 0, 1, TIDE_DTYPE_FP32},
    {4, 2, 0, 0, 0, TIDE_DTYPE_BF16},
    {5, 4, 0, 0, 0, TIDE_DTYPE_BF16},
    {9, 8, 0, 0, 0, TIDE_DTYPE_BF16},
    {3, 8, 4, 0, 0, TIDE_DTYPE_BF16},
    /* several waves per pass: two generations, odd wave counts, rounds of 1..3 */
    {5, 4, 2, 1, 0, TIDE_DTYPE_FP32},
    {3, 2, 1, 1, 0, TIDE_DTYPE_BF16},
    {7, 4, 2, 2, 1, TIDE_DTYPE_BF16},
    {9, 8, 4, 3, 3, TIDE_DTYPE_BF16},
    {6, 1, 1, 2, 0, TIDE_DTYPE_FP32},
};

/* Tiny group: padded rows, a parameter with fewer rows than ranks, K_p <= 8. */
static tide_result_t make_plan(const shape_t *sh, tide_rs_mode_t mode, int passes,
                               tide_plan_t *plan_out) {
    const uint64_t n = (uint64_t)sh->m * (uint64_t)sh->l;
    const tide_param_shape_t shapes[] = {{2 * n - 1, 3}, {5, 8}, {n + 1, 1}};
    tide_group_desc_t group = {3, shapes, TIDE_DTYPE_BF16, sh->grad, TIDE_DTYPE_BF16};
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = sh->m;
    cfg.gpus_per_node = sh->l;
    cfg.wave_width = sh->wave_width;
    cfg.round_width = sh->round_width;
    cfg.staging_slots = sh->staging_slots;
    cfg.passes = passes;
    cfg.mode = mode;
    /* This file checks compile_rs.c's programs; the rail lane has its own (test_lane.c). */
    cfg.lane = TIDE_LANE_GENERIC;
    return tide_plan_create(&cfg, &group, plan_out);
}

static void run_shape(const shape_t *sh, tide_rs_mode_t mode, int passes, int seeds) {
    tide_plan_t plan;
    assert_tide(TIDE_SUCCESS, make_plan(sh, mode, passes, &plan));
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, mode, &prog));
    assert_int_equal(prog.coll, TIDE_COLL_REDUCE_SCATTER);
    assert_int_equal(prog.mode, mode);
    check_static(&prog);
    for (int seed = 0; seed < seeds; ++seed) {
        char err[512];
        if (simulate(&prog, (uint64_t)seed + 1, err, sizeof(err)) != 0) {
            print_error("M=%d L=%d W_wave=%d k=%d n_stg=%d mode=%d passes=%d seed=%d: %s\n", sh->m,
                        sh->l, plan->rs.wave_width, plan->rs.round_width, plan->rs.staging_slots,
                        (int)mode, passes, seed, err);
            fail();
        }
    }
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

static void test_all_shapes(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof(k_shapes) / sizeof(k_shapes[0]); ++i) {
        const int seeds = k_shapes[i].m * k_shapes[i].l > 32 ? 2 : 6;
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode)
            for (int passes = 1; passes <= 2; ++passes)
                run_shape(&k_shapes[i], (tide_rs_mode_t)mode, passes, seeds);
    }
}

/* ------------------------------------------------------------------ faults are caught */

typedef void (*mutate_fn)(tide_program_t *prog);

/* Applies `mutate` to a clone of the program of `sh` and expects some seed to fail: the
 * evaluator notices the fault. */
static void expect_caught(const shape_t *sh, tide_rs_mode_t mode, int passes, mutate_fn mutate,
                          const char *what) {
    tide_plan_t plan;
    assert_tide(TIDE_SUCCESS, make_plan(sh, mode, passes, &plan));
    tide_program_t prog, bad;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, mode, &prog));
    assert_tide(TIDE_SUCCESS, tide_program_clone(&prog, &bad));
    mutate(&bad);
    char err[512] = "";
    bool caught = false;
    for (int seed = 0; seed < 40 && !caught; ++seed)
        caught = simulate(&bad, (uint64_t)seed + 100, err, sizeof(err)) != 0;
    if (!caught) print_error("fault not caught: %s\n", what);
    if (getenv("TIDE_TEST_VERBOSE")) print_message("%s: %s\n", what, err);
    assert_true(caught);
    /* The unmutated program passes the same seeds. */
    for (int seed = 0; seed < 4; ++seed)
        assert_int_equal(simulate(&prog, (uint64_t)seed + 100, err, sizeof(err)), 0);
    tide_program_free(&bad);
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

/* Calls f on every op of every queue. */
static void for_each_op(tide_program_t *prog, void (*f)(tide_op_t *op)) {
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[r].queues[q].num_ops; ++i)
                f(&prog->ranks[r].queues[q].ops[i]);
}

/* Every WAIT on a counter in [lo, hi) passes at once. */
static void drop_waits(tide_program_t *prog, int lo, int hi) {
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[r].queues[q].num_ops; ++i) {
                tide_op_t *op = &prog->ranks[r].queues[q].ops[i];
                if (op->kind == TIDE_OP_WAIT && op->ctr >= lo && op->ctr < hi) op->thr = -1000000;
            }
}

/*
 * The staging credit as first specified: the owner credits after each sum only, and a pusher
 * starts destination d once the owner summed d - n_stg (count d - n_stg + 1 per call of D).
 * The observation credits go to an AG counter nobody waits on.
 */
static void m_stage_sum_credits_only(tide_program_t *prog) {
    const int n_stg = prog->plan->rs.staging_slots, L = prog->plan->topo.gpus_per_node;
    const int D = prog->plan->rs.passes * prog->plan->topo.nodes;
    for (int r = 0; r < prog->num_ranks; ++r) {
        tide_queue_ops_t *rd = &prog->ranks[r].queues[TIDE_Q_READ];
        for (int i = 1; i < rd->num_ops; ++i) {
            tide_op_t *op = &rd->ops[i];
            if (op->kind != TIDE_OP_SIGNAL || op->ctr < TIDE_CTR_RS_STG_CREDIT ||
                op->ctr >= TIDE_CTR_RS_STG_CREDIT + L)
                continue;
            /* Credits right behind the STAGED wait are observation credits. */
            int k = i - 1;
            while (k > 0 && rd->ops[k].kind == TIDE_OP_SIGNAL)
                --k;
            if (rd->ops[k].kind == TIDE_OP_WAIT && rd->ops[k].ctr == TIDE_CTR_RS_STAGED)
                op->ctr = TIDE_CTR_AG_READY;
        }
        tide_queue_ops_t *ce = &prog->ranks[r].queues[TIDE_Q_CE];
        int seen[TIDE_MAX_GPUS_PER_NODE] = {0};
        for (int i = 0; i < ce->num_ops; ++i) {
            tide_op_t *op = &ce->ops[i];
            if (op->kind != TIDE_OP_WAIT) continue;
            int d = seen[op->ctr - TIDE_CTR_RS_STG_CREDIT]++;
            op->inc = D;
            op->thr = d - n_stg + 1;
        }
    }
}
static void zero_nothing(tide_op_t *op) {
    if (op->kind == TIDE_OP_ZERO) op->bytes = 0;
}
static void land_init(tide_op_t *op) {
    if (op->kind == TIDE_OP_LAND) op->init = 1;
}
static void m_no_zero(tide_program_t *prog) {
    for_each_op(prog, zero_nothing);
}
static void m_init_always(tide_program_t *prog) {
    for_each_op(prog, land_init);
}
static void m_no_credit(tide_program_t *prog) {
    drop_waits(prog, TIDE_CTR_RS_CREDIT, TIDE_CTR_RS_CREDIT + prog->plan->topo.nodes);
}
static void m_no_landed_join(tide_program_t *prog) {
    drop_waits(prog, TIDE_CTR_RS_NODE_LANDED,
               TIDE_CTR_RS_NODE_LANDED + TIDE_CTR_RS_MAX_GENERATIONS);
}
static void m_no_node_arrived(tide_program_t *prog) {
    drop_waits(prog, TIDE_CTR_RS_NODE_ARRIVED,
               TIDE_CTR_RS_NODE_ARRIVED + TIDE_CTR_RS_MAX_GENERATIONS);
}
static void m_no_sent(tide_program_t *prog) {
    drop_waits(prog, TIDE_CTR_RS_SENT, TIDE_CTR_RS_SENT + 1);
}
static void m_no_spare_used(tide_program_t *prog) {
    drop_waits(prog, TIDE_CTR_RS_SPARE_USED, TIDE_CTR_RS_SPARE_USED + 1);
}
static void m_no_pushed(tide_program_t *prog) {
    drop_waits(prog, TIDE_CTR_RS_PUSHED, TIDE_CTR_RS_PUSHED + 1);
}

static void test_faults_are_caught(void **state) {
    (void)state;
    /* D = 4 a multiple of n_stg = 2: only the pushers' run-ahead is wrong. */
    const shape_t l4 = {4, 4, 0, 0, 2, TIDE_DTYPE_BF16};
    /* One pusher, D = 3 not a multiple of n_stg = 2: the slot of the next call's first
     * destination is the previous call's last one. */
    const shape_t odd = {3, 2, 0, 0, 2, TIDE_DTYPE_BF16};
    const shape_t waves = {5, 4, 2, 1, 0, TIDE_DTYPE_BF16};
    const shape_t one_node = {1, 4, 0, 0, 0, TIDE_DTYPE_BF16};
    expect_caught(&l4, TIDE_RS_IN_PLACE, 1, m_stage_sum_credits_only, "pusher run-ahead");
    expect_caught(&odd, TIDE_RS_IN_PLACE, 1, m_stage_sum_credits_only, "slot across calls");
    expect_caught(&waves, TIDE_RS_IN_PLACE, 1, m_no_zero, "stale zeroing");
    expect_caught(&waves, TIDE_RS_IN_PLACE, 2, m_no_credit, "inbox credits");
    expect_caught(&waves, TIDE_RS_IN_PLACE, 1, m_no_landed_join, "node-wide landing join");
    expect_caught(&waves, TIDE_RS_IN_PLACE, 1, m_no_node_arrived, "node-wide arrival join");
    expect_caught(&waves, TIDE_RS_SLOT_REUSE, 1, m_no_sent, "outbox reuse");
    expect_caught(&one_node, TIDE_RS_IN_PLACE, 1, m_no_spare_used, "spare reuse");
    expect_caught(&waves, TIDE_RS_IN_PLACE, 1, m_init_always, "landing init");
    expect_caught(&l4, TIDE_RS_IN_PLACE, 1, m_no_pushed, "read-done before pushes");
}

/* ------------------------------------------------------------------ contract details */

static void test_bad_arguments(void **state) {
    (void)state;
    tide_plan_t plan;
    assert_tide(TIDE_SUCCESS, make_plan(&k_shapes[2], TIDE_RS_IN_PLACE, 1, &plan));
    tide_program_t prog;
    memset(&prog, 0x5a, sizeof(prog));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_compile_rs(NULL, TIDE_RS_IN_PLACE, &prog));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_compile_rs(plan, (tide_rs_mode_t)7, &prog));
    assert_int_equal(prog.num_ranks, 0x5a5a5a5a); /* untouched on failure */
    tide_plan_destroy(plan);
}

/* The arena too small for the program: refused, and the partial program is released. */
static void test_small_arena_refused(void **state) {
    (void)state;
    const shape_t sh = {3, 2, 0, 0, 0, TIDE_DTYPE_BF16};
    tide_plan_t plan;
    assert_tide(TIDE_SUCCESS, make_plan(&sh, TIDE_RS_IN_PLACE, 2, &plan));
    tide_program_t prog;
    const tide_region_t regions[] = {TIDE_REGION_OUTBOX, TIDE_REGION_SPARE, TIDE_REGION_INBOX,
                                     TIDE_REGION_STAGING};
    for (size_t i = 0; i < sizeof(regions) / sizeof(regions[0]); ++i) {
        const uint64_t bytes = plan->arena.regions[regions[i]].bytes;
        plan->arena.regions[regions[i]].bytes = bytes - 4;
        assert_tide(TIDE_ERR_INTERNAL, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &prog));
        plan->arena.regions[regions[i]].bytes = bytes;
    }
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &prog));
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

/* A group compiles both modes from one plan: the outbox depth is the plan's. */
static void test_other_mode_same_plan(void **state) {
    (void)state;
    const shape_t sh = {5, 4, 2, 1, 0, TIDE_DTYPE_BF16};
    for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
        tide_plan_t plan;
        assert_tide(TIDE_SUCCESS, make_plan(&sh, (tide_rs_mode_t)mode, 2, &plan));
        tide_rs_mode_t other = mode == TIDE_RS_IN_PLACE ? TIDE_RS_SLOT_REUSE : TIDE_RS_IN_PLACE;
        tide_program_t prog;
        assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, other, &prog));
        assert_int_equal(prog.mode, other);
        assert_int_equal(prog.bank_bytes[TIDE_REGION_OUTBOX],
                         (uint64_t)plan->rs.outbox_depth * 4 * 4 * plan->rs.subslice_elems);
        check_static(&prog);
        char err[512];
        for (int seed = 1; seed <= 4; ++seed) {
            int rc = simulate(&prog, (uint64_t)seed, err, sizeof(err));
            if (rc) print_error("%s\n", err);
            assert_int_equal(rc, 0);
        }
        tide_program_free(&prog);
        tide_plan_destroy(plan);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_shapes),           cmocka_unit_test(test_faults_are_caught),
        cmocka_unit_test(test_bad_arguments),        cmocka_unit_test(test_small_arena_refused),
        cmocka_unit_test(test_other_mode_same_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
