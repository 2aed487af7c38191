/*
 * batch.c - batched copies: a run of same-device copies of one thread as one kernel launch
 * (batch_copy.h, docs/cuda-fabric.md).
 *
 * A run is a maximal sequence of OP commands of one (rank, queue) thread in a form's command
 * list whose ops are COPY or COPY2D with source and destination on the thread's device, with
 * no other command of that thread between them: a WAIT, a RECORD (a fused signal somebody
 * waits for ends the run after its op, since the event must follow that copy), a FORK, an
 * UPLOAD, another op kind, a copy to or from another device (kept on cudaMemcpyAsync, the
 * copy engines) or a same-device copy of TIDE_CUDA_BATCH_MAX_BYTES or more ends it.  A SIGNAL
 * op whose record was dropped issues nothing and is passed over; so is a WAIT pruned by the
 * vector clocks (it emits no command).  A run of two copies or more becomes one BATCH command
 * at the position of its first op, and the commands of its other ops are dropped.
 *
 * Large copies.  The batch kernel's grid grows with the batch's bytes up to two CTAs per SM
 * (batch_copy.h), which moves a lone copy of up to 64 MiB at most about 2 us slower than a
 * same-device cudaMemcpyAsync, but a lone 256 MiB copy about 10 us slower, more than the host
 * time (about 3.5 us) a batch saves per copy (cuda.h, TIDE_CUDA_BATCH_MAX_BYTES_DEFAULT).  A
 * same-device copy of TIDE_CUDA_BATCH_MAX_BYTES or more therefore ends the run exactly like a
 * copy to another device: it keeps its own OP command, in its place in its thread's stream,
 * and the copies before and after it form runs of their own.  Nothing moves across it, so it
 * keeps every stream and event dependency it has on the per-op path.  The copies a threshold
 * keeps out of runs they would otherwise have joined are counted per form (over_threshold)
 * for the stats.
 *
 * The deadlock argument (execute.c) still holds: the batch is enqueued at the position of its
 * first op, all of its ops are on one stream in program order with nothing of their thread
 * between them, and none of them waits on anything; what follows them in their thread (the
 * record of a signal, a wait) follows the batch.  So moving the later ops up to the first
 * one's position makes no dependency point forwards in enqueue order.
 *
 * Descriptors.  Every copy that is in a batch of either form gets a slot in its rank's table,
 * in op id order; a batch's copies are then consecutive slots (every copy between its first
 * and last op issues an OP command of the thread, which the run took in).  The addresses
 * depend on the call's binding (landing slot, shard and gradient operands, bank), so each
 * call fills the descriptors of every rank on the host (tide_cuda_batch_fill) and execute.c
 * uploads them with one cudaMemcpyAsync per rank, from pinned memory, into a device table of
 * the call's parity, on the caller's stream before the call's start event (every thread
 * forks from it).  The fence that call e waits for (call e - 2, or e - 1) ends every kernel
 * that read the table of this parity before.  An upload is skipped when the table already
 * holds the same descriptors.
 *
 * Ops of one batch run concurrently, while the per-op path ran them in stream order.  The
 * programs do not chain copies within a run, but the operands are the caller's pointers, so
 * every call checks each batch: if a destination overlaps another copy's source or
 * destination, the batch is issued copy by copy, in order (tide_cuda_batch_disjoint).
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"

#include <stdlib.h>
#include <string.h>

/* Runs of fewer copies stay on cudaMemcpyAsync: one launch either way, and no table. */
#define BATCH_MIN_COPIES 2

/* The bytes a descriptor touches on one side: rows of `width` bytes, `pitch` apart. */
typedef struct {
    uint64_t lo, hi; /* envelope [lo, hi) */
    uint64_t pitch, rows, width;
    uint32_t copy;
    uint32_t write;
} side_t;

static int ref_device(const tide_cuda_shared_t *sh, const tide_ref_t *ref, int rank) {
    switch (ref->kind) {
    case TIDE_REF_ARENA:
    case TIDE_REF_LANDING:
        return ref->rank >= 0 && ref->rank < sh->ranks ? tide_cuda_device_of(sh, ref->rank) : -1;
    case TIDE_REF_SHARD: /* call operands live on the rank's device (docs/cuda-fabric.md) */
    case TIDE_REF_GRAD:
    case TIDE_REF_OUT:
        return tide_cuda_device_of(sh, rank);
    default:
        return -1;
    }
}

/* Bytes a copy moves (saturated: a product past 64 bits is above any threshold). */
static uint64_t copy_bytes(const tide_op_t *op) {
    uint64_t b = op->bytes;
    if (op->kind == TIDE_OP_COPY2D && !tide_mul_u64(op->bytes, op->rows, &b)) return UINT64_MAX;
    return b;
}

static bool op_same_device_copy(const tide_cuda_shared_t *sh, const tide_op_t *op, int rank) {
    if (op->kind != TIDE_OP_COPY && op->kind != TIDE_OP_COPY2D) return false;
    const int d = tide_cuda_device_of(sh, rank);
    return ref_device(sh, &op->dst, rank) == d && ref_device(sh, &op->src, rank) == d;
}

/* Whether a copy of `bytes` bytes stays per op under the threshold (0: no threshold). */
static bool over_threshold(uint64_t max_bytes, uint64_t bytes) {
    return max_bytes > 0 && bytes >= max_bytes;
}

static bool op_batchable(const tide_cuda_shared_t *sh, const tide_op_t *op, int rank,
                         uint64_t max_bytes) {
    return op_same_device_copy(sh, op, rank) && !over_threshold(max_bytes, copy_bytes(op));
}

/* A run found in one form: command indices of its first and last copy. */
typedef struct {
    int thread;
    int first_cmd, last_cmd;
    int first_op, last_op;
    int copies;
} run_t;

typedef struct {
    run_t *v;
    int n, cap;
} runs_t;

static tide_result_t runs_push(runs_t *l, run_t r) {
    if (l->n == l->cap) {
        const int cap = l->cap == 0 ? 64 : 2 * l->cap;
        run_t *v = realloc(l->v, (size_t)cap * sizeof(*v));
        if (v == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d copy runs", cap);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = r;
    return TIDE_SUCCESS;
}

/* The runs of one form's command list with at least BATCH_MIN_COPIES copies, copies of
 * max_bytes or more (0: no threshold) ending runs. */
static tide_result_t find_runs(const tide_cuda_shared_t *sh, const tide_cuda_prepared_t *pp,
                               const tide_program_t *prog, int form, uint64_t max_bytes,
                               run_t *open, runs_t *out) {
    const tide_schedule_t *s = &pp->sched;
    for (int t = 0; t < s->num_threads; ++t)
        open[t].copies = 0;
    for (int i = 0; i <= s->num_cmds[form]; ++i) {
        const bool end = i == s->num_cmds[form];
        const tide_sched_cmd_t *c = end ? NULL : &s->cmds[form][i];
        int close_from = 0, close_to = s->num_threads; /* at the end: every thread */
        if (c != NULL) {
            const int t = c->thread;
            if (c->kind == TIDE_SCHED_CMD_OP) {
                const tide_op_t *op = tide_schedule_op(prog, s, c->arg, t);
                /* A SIGNAL issues nothing; neither does a copy direct mode elides. */
                if (op->kind == TIDE_OP_SIGNAL || (pp->elide != NULL && pp->elide[c->arg]))
                    continue;
                if (op_batchable(sh, op, t / TIDE_CUDA_Q, max_bytes)) {
                    run_t *r = &open[t];
                    if (r->copies == 0) *r = (run_t){t, i, i, c->arg, c->arg, 0};
                    r->last_cmd = i;
                    r->last_op = c->arg;
                    ++r->copies;
                    continue;
                }
            }
            close_from = t;
            close_to = t + 1;
        }
        for (int t = close_from; t < close_to; ++t) {
            if (open[t].copies >= BATCH_MIN_COPIES) TIDE_CHECK(runs_push(out, open[t]));
            open[t].copies = 0;
        }
    }
    return TIDE_SUCCESS;
}

static bool is_copy(const tide_op_t *op) {
    return op->kind == TIDE_OP_COPY || op->kind == TIDE_OP_COPY2D;
}

/* The grid of a batch: one CTA per TIDE_CUDA_BATCH_BYTES_PER_CTA of its copies, between
 * TIDE_CUDA_BATCH_CTAS and TIDE_CUDA_BATCH_CTAS_PER_SM per SM of its device (batch_copy.h).
 * The sizes are the program's, the same in every call. */
static int32_t batch_ctas(const tide_cuda_shared_t *sh, const tide_cuda_prepared_t *pp,
                          const tide_program_t *prog, const run_t *r) {
    const tide_schedule_t *s = &pp->sched;
    uint64_t total = 0;
    for (int id = r->first_op; id <= r->last_op; ++id) {
        const tide_op_t *op = tide_schedule_op(prog, s, id, r->thread);
        if (is_copy(op) && !tide_add_u64(total, copy_bytes(op), &total)) total = UINT64_MAX;
    }
    const uint64_t sms = (uint64_t)sh->sm_count[tide_cuda_device_of(sh, r->thread / TIDE_CUDA_Q)];
    return tide_cuda_batch_grid(total, sms);
}

/* Copies over the threshold inside the runs found without one: those it keeps per op. */
static int count_over_threshold(const tide_cuda_shared_t *sh, const tide_cuda_prepared_t *pp,
                                const tide_program_t *prog, const runs_t *whole) {
    int count = 0;
    for (int k = 0; k < whole->n; ++k) {
        const run_t *r = &whole->v[k];
        for (int id = r->first_op; id <= r->last_op; ++id) {
            const tide_op_t *op = tide_schedule_op(prog, &pp->sched, id, r->thread);
            count += is_copy(op) && !(pp->elide != NULL && pp->elide[id]) &&
                     over_threshold(sh->batch_max_bytes, copy_bytes(op));
        }
    }
    return count;
}

/* Descriptor slots: every copy in some run of either form, per rank in op id order
 * (slot_of[id], -1: none); then the batches and the command lists with BATCH commands. */
static tide_result_t build(const tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                           const tide_program_t *prog, const runs_t *runs, int32_t *slot_of) {
    const tide_schedule_t *s = &pp->sched;
    const int n = s->num_ranks;
    for (int id = 0; id < s->num_ops; ++id)
        slot_of[id] = -1;
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f)
        for (int k = 0; k < runs[f].n; ++k) {
            const run_t *r = &runs[f].v[k];
            for (int id = r->first_op; id <= r->last_op; ++id)
                if (is_copy(tide_schedule_op(prog, s, id, r->thread)) &&
                    !(pp->elide != NULL && pp->elide[id]))
                    slot_of[id] = 0;
        }
    pp->slot_base = calloc((size_t)n + 1, sizeof(*pp->slot_base));
    if (pp->slot_base == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: copy tables");
    int slots = 0;
    for (int t = 0; t < s->num_threads; ++t) {
        if (t % TIDE_CUDA_Q == 0) pp->slot_base[t / TIDE_CUDA_Q] = slots;
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id)
            if (slot_of[id] == 0) slot_of[id] = slots++;
    }
    pp->slot_base[n] = slots;
    pp->num_desc = slots;
    pp->slot_op = calloc((size_t)slots + 1, sizeof(*pp->slot_op));
    pp->slot_thread = calloc((size_t)slots + 1, sizeof(*pp->slot_thread));
    pp->batches = calloc((size_t)(runs[0].n + runs[1].n) + 1, sizeof(*pp->batches));
    if (pp->slot_op == NULL || pp->slot_thread == NULL || pp->batches == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d copy descriptors", slots);
    for (int t = 0; t < s->num_threads; ++t)
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id)
            if (slot_of[id] >= 0) {
                pp->slot_op[slot_of[id]] = id;
                pp->slot_thread[slot_of[id]] = t;
            }
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        /* Command i: -1 keep, -2 drop (a later copy of a run, or a SIGNAL inside one), else
         * the batch it starts. */
        int32_t *fate = calloc((size_t)s->num_cmds[f] + 1, sizeof(*fate));
        if (fate == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: command lists");
        for (int i = 0; i < s->num_cmds[f]; ++i)
            fate[i] = -1;
        tide_result_t res = TIDE_SUCCESS;
        for (int k = 0; k < runs[f].n && res == TIDE_SUCCESS; ++k) {
            const run_t *r = &runs[f].v[k];
            const int first = slot_of[r->first_op], last = slot_of[r->last_op];
            if (first < 0 || last - first + 1 != r->copies) {
                res = TIDE_ERR(TIDE_ERR_INTERNAL,
                               "cuda fabric: a run of %d copies of thread %d has %d "
                               "descriptor slots",
                               r->copies, r->thread, last - first + 1);
                break;
            }
            const int b = pp->num_batches++;
            pp->batches[b] = (tide_cuda_batch_t){r->thread / TIDE_CUDA_Q, first, r->copies,
                                                 batch_ctas(sh, pp, prog, r)};
            if (r->copies > pp->max_batch) pp->max_batch = r->copies;
            for (int i = r->first_cmd; i <= r->last_cmd; ++i)
                if (s->cmds[f][i].thread == r->thread) fate[i] = -2;
            fate[r->first_cmd] = b;
        }
        int kept = 0;
        for (int i = 0; i < s->num_cmds[f]; ++i)
            kept += fate[i] != -2;
        pp->bcmds[f] = calloc((size_t)kept + 1, sizeof(*pp->bcmds[f]));
        if (res == TIDE_SUCCESS && pp->bcmds[f] == NULL)
            res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d commands", kept);
        for (int i = 0; i < s->num_cmds[f] && res == TIDE_SUCCESS; ++i) {
            if (fate[i] == -2) continue;
            tide_sched_cmd_t c = s->cmds[f][i];
            if (fate[i] >= 0) c = (tide_sched_cmd_t){TIDE_SCHED_CMD_BATCH, c.thread, fate[i]};
            pp->bcmds[f][pp->num_bcmds[f]++] = c;
        }
        free(fate);
        TIDE_CHECK(res);
    }
    return TIDE_SUCCESS;
}

/* Pinned, last-uploaded and device tables of both parities. */
static tide_result_t tables_alloc(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp) {
    const int n = sh->ranks;
    const size_t nd = (size_t)pp->num_desc, bytes = nd * sizeof(tide_cuda_copy_desc_t);
    pp->desc_call = calloc(nd, sizeof(*pp->desc_call));
    /* The overlap check's sides and active list: 2 per copy. */
    pp->scratch = calloc(2 * (size_t)pp->max_batch + 1, sizeof(side_t) + sizeof(int));
    if (pp->desc_call == NULL || pp->scratch == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %zu copy descriptors", nd);
    for (int p = 0; p < 2; ++p) {
        pp->desc_last[p] = calloc(nd, sizeof(*pp->desc_last[p]));
        pp->desc_dev[p] = calloc((size_t)n, sizeof(*pp->desc_dev[p]));
        pp->desc_valid[p] = calloc((size_t)n, sizeof(*pp->desc_valid[p]));
        pp->desc_inflight[p] = calloc((size_t)n, sizeof(*pp->desc_inflight[p]));
        pp->desc_done[p] = calloc((size_t)n, sizeof(*pp->desc_done[p]));
        if (pp->desc_last[p] == NULL || pp->desc_dev[p] == NULL || pp->desc_valid[p] == NULL ||
            pp->desc_inflight[p] == NULL || pp->desc_done[p] == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: copy tables of %d ranks", n);
        void *pinned = NULL;
        TIDE_CUDA_CALL(cudaMallocHost(&pinned, bytes), "cudaMallocHost(copy descriptors)");
        pp->desc_host[p] = pinned;
        for (int r = 0; r < n; ++r) {
            const int count = pp->slot_base[r + 1] - pp->slot_base[r];
            if (count == 0) continue;
            TIDE_CUDA_CALL(cudaSetDevice(tide_cuda_device_of(sh, r)), "cudaSetDevice");
            TIDE_CUDA_CALL(cudaMalloc((void **)&pp->desc_dev[p][r],
                                      (size_t)count * sizeof(tide_cuda_copy_desc_t)),
                           "cudaMalloc(copy descriptors)");
            TIDE_CUDA_CALL(cudaEventCreateWithFlags(&pp->desc_done[p][r], cudaEventDisableTiming),
                           "cudaEventCreateWithFlags(copy descriptors)");
        }
    }
    return TIDE_SUCCESS;
}

void tide_cuda_batch_free(tide_cuda_prepared_t *pp, int ranks) {
    for (int p = 0; p < 2; ++p) {
        for (int r = 0; r < ranks; ++r) {
            if (pp->desc_dev[p] != NULL && pp->desc_dev[p][r] != NULL) cudaFree(pp->desc_dev[p][r]);
            if (pp->desc_done[p] != NULL && pp->desc_done[p][r] != NULL)
                cudaEventDestroy(pp->desc_done[p][r]);
        }
        if (pp->desc_host[p] != NULL) cudaFreeHost(pp->desc_host[p]);
        free(pp->desc_last[p]);
        free(pp->desc_dev[p]);
        free(pp->desc_valid[p]);
        free(pp->desc_inflight[p]);
        free(pp->desc_done[p]);
        free(pp->bcmds[p]);
        pp->desc_host[p] = pp->desc_last[p] = NULL;
        pp->desc_dev[p] = NULL;
        pp->desc_valid[p] = pp->desc_inflight[p] = NULL;
        pp->desc_done[p] = NULL;
        pp->bcmds[p] = NULL;
        pp->num_bcmds[p] = 0;
    }
    (void)cudaGetLastError();
    free(pp->scratch);
    free(pp->desc_call);
    free(pp->batches);
    free(pp->slot_thread);
    free(pp->slot_op);
    free(pp->slot_base);
    pp->scratch = NULL;
    pp->desc_call = NULL;
    pp->batches = NULL;
    pp->slot_thread = pp->slot_op = NULL;
    pp->slot_base = NULL;
    pp->num_batches = pp->max_batch = pp->num_desc = 0;
    pp->over_threshold[0] = pp->over_threshold[1] = 0;
    pp->batched = false;
}

tide_result_t tide_cuda_batch_prepare(tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                                      const tide_program_t *prog) {
    const tide_schedule_t *s = &pp->sched;
    tide_result_t res = TIDE_SUCCESS;
    runs_t runs[TIDE_SCHED_FORMS], whole;
    memset(runs, 0, sizeof(runs));
    memset(&whole, 0, sizeof(whole));
    run_t *open = calloc((size_t)s->num_threads, sizeof(*open));
    int32_t *slot_of = calloc((size_t)s->num_ops + 1, sizeof(*slot_of));
    if (open == NULL || slot_of == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: copy runs of %d ops", s->num_ops);
        goto done;
    }
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        TIDE_CHECK_GOTO(find_runs(sh, pp, prog, f, sh->batch_max_bytes, open, &runs[f]), res,
                        done);
        pp->over_threshold[f] = 0;
        if (sh->batch_max_bytes == 0) continue;
        whole.n = 0;
        TIDE_CHECK_GOTO(find_runs(sh, pp, prog, f, 0, open, &whole), res, done);
        pp->over_threshold[f] = count_over_threshold(sh, pp, prog, &whole);
    }
    if (runs[0].n + runs[1].n == 0) goto done; /* nothing to batch: the per-op lists */
    TIDE_CHECK_GOTO(build(sh, pp, prog, runs, slot_of), res, fail);
    TIDE_CHECK_GOTO(tables_alloc(sh, pp), res, fail);
    pp->batched = true;
    goto done;
fail:
    tide_cuda_batch_free(pp, sh->ranks);
done:
    free(whole.v);
    free(runs[0].v);
    free(runs[1].v);
    free(slot_of);
    free(open);
    return res;
}

void tide_cuda_batch_fill(tide_cuda_prepared_t *pp, int rank) {
    const tide_program_t *prog = pp->checked[rank];
    for (int k = pp->slot_base[rank]; k < pp->slot_base[rank + 1]; ++k) {
        const int id = pp->slot_op[k], t = pp->slot_thread[k];
        const tide_op_t *op = tide_schedule_op(prog, &pp->sched, id, t);
        const tide_bound_op_t *b = &pp->bound[id].op;
        const bool flat = op->kind == TIDE_OP_COPY;
        pp->desc_call[k] = (tide_cuda_copy_desc_t){
            .dst = (uint64_t)(uintptr_t)b->dst,
            .src = (uint64_t)(uintptr_t)b->src,
            .bytes = op->bytes,
            .rows = flat ? 1 : op->rows,
            .src_pitch = flat ? 0 : op->src_pitch,
            .dst_pitch = flat ? 0 : op->dst_pitch,
        };
    }
}

/* ------------------------------------------------------------------ overlap check */

static int by_lo(const void *a, const void *b) {
    const side_t *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Whether two sides share a byte.  Exact for flat sides and for equal pitches (the rows of
 * one are the rows of the other shifted); otherwise the envelopes decide (conservative). */
static bool sides_meet(const side_t *a, const side_t *b) {
    if (a->lo >= b->hi || b->lo >= a->hi) return false;
    uint64_t p;
    if (a->rows <= 1 && b->rows <= 1) return true;
    if (a->rows <= 1)
        p = b->pitch;
    else if (b->rows <= 1 || a->pitch == b->pitch)
        p = a->pitch;
    else
        return true;
    if (p == 0 || a->width > p || b->width > p) return true;
    /* Row i of a at a->lo + i p, row j of b at b->lo + j p: they meet iff some k = j - i in
     * [-(a->rows - 1), b->rows - 1] has b->lo - a->lo + k p in (-b->width, a->width). */
    const int64_t d = (int64_t)(b->lo - a->lo), pp = (int64_t)p;
    const int64_t kmin = a->rows <= 1 ? 0 : -(int64_t)(a->rows - 1);
    const int64_t kmax = b->rows <= 1 ? 0 : (int64_t)(b->rows - 1);
    /* Smallest k with d + k p > -b->width, i.e. k p > -b->width - d. */
    const int64_t lim = -(int64_t)b->width - d;
    int64_t k = lim >= 0 ? lim / pp + 1 : -((-lim) / pp) + ((-lim) % pp == 0 ? 1 : 0);
    if (k < kmin) k = kmin;
    return k <= kmax && d + k * pp < (int64_t)a->width;
}

static side_t side_of(uint64_t base, uint64_t pitch, const tide_cuda_copy_desc_t *d, uint32_t copy,
                      uint32_t write) {
    const uint64_t rows = d->rows;
    return (side_t){
        base, base + (rows - 1) * pitch + d->bytes, rows > 1 ? pitch : 0, rows, d->bytes, copy,
        write};
}

bool tide_cuda_batch_disjoint(tide_cuda_prepared_t *pp, const tide_cuda_batch_t *b) {
    side_t *v = pp->scratch;
    int *active = (int *)(v + 2 * (size_t)pp->max_batch);
    int n = 0, na = 0;
    for (int i = 0; i < b->count; ++i) {
        const tide_cuda_copy_desc_t *d = &pp->desc_call[b->first + i];
        if (d->bytes == 0 || d->rows == 0) continue;
        v[n++] = side_of(d->dst, d->dst_pitch, d, (uint32_t)i, 1);
        v[n++] = side_of(d->src, d->src_pitch, d, (uint32_t)i, 0);
    }
    qsort(v, (size_t)n, sizeof(*v), by_lo);
    /* Sweep by start: a side can only meet the sides that started before it and have not
     * ended yet (the active list), and only if one of the two is written. */
    for (int i = 0; i < n; ++i) {
        int kept = 0;
        for (int a = 0; a < na; ++a) {
            const side_t *w = &v[active[a]];
            if (w->hi <= v[i].lo) continue; /* ended: no later side meets it either */
            active[kept++] = active[a];
            if (w->copy != v[i].copy && (w->write || v[i].write) && sides_meet(w, &v[i]))
                return false;
        }
        na = kept;
        active[na++] = i;
    }
    return true;
}
