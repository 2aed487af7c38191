/*
 * mp_batch.c - batched copies on the one-process-per-rank CUDA fabric (mp.h).
 *
 * The rule is the one-process fabric's (batch.c, docs/cuda-fabric.md "Batched copies"): a run
 * is a maximal sequence of one thread's OP commands whose ops are COPY / COPY2D with both ends
 * on this rank's device and below TIDE_CUDA_BATCH_MAX_BYTES, with no other command of that
 * thread between them (a RECORD of a fused signal, a WAIT, a FORK, a JOIN, another op kind, a
 * copy to or from another device, or a larger copy ends it; ops that issue nothing, such as
 * SIGNAL ops and empty copies, are passed over).  A run of two copies or more is one launch
 * of tide_cuda_batch_copy at the position of its first op.
 *
 * Why this keeps the deadlock argument (mp.h, "Enqueue order"): the run's ops are on one
 * stream, in program order, none waits on anything, and whatever followed them in their
 * thread still follows the batch; moving the later ops up to the first op's position makes no
 * dependency point forwards in the global enqueue order.
 *
 * Here the runs are planned per call from this rank's command list (a few hundred commands:
 * microseconds), not once per program, because which copies stay on this device depends on
 * where the peers' segments live, and the addresses depend on the call's binding anyway.
 *
 * Descriptor tables.  Per program and call parity, one pinned host table and one device
 * table; the call's descriptors are uploaded with one cudaMemcpyAsync on the caller's stream
 * before the call's start record, which every thread forks from, so every batch kernel follows
 * the upload.  Call e rewrites parity e % 2 only after the host waited for this rank's call
 * e - 2 (mp_execute.c, enqueue), which ended every kernel reading that table and the upload
 * reading the pinned rows.
 *
 * Copy-engine runs (TIDE_CUDA_CE_BATCH).  A thread's run of flat copies that touch a peer
 * segment on another device (its own run: a copy of the other kind ends it) is one
 * cudaMemcpyBatchAsync with stream-ordered source access, the copy engines' counterpart of
 * the batch kernel (and what NCCL 2.28's own copy-engine collectives issue); 2D copies to
 * peers stay one cudaMemcpy2DAsync each.  "all" sends same-device flat copies there too (and
 * same-device 2D copies per op: no batch kernel at all), so that one GPU runs this path; "0"
 * keeps every peer copy one cudaMemcpyAsync.
 *
 * Overlap.  A batch's copies run concurrently, the per-op path ran them in stream order: a
 * run in which some copy's destination meets another copy's source or destination (byte
 * ranges, a 2D copy taken as its whole span: conservative) is issued copy by copy, in order.
 */
#include "core/checks.h"
#include "fabric/cuda/mp.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t lo, hi;
    uint32_t dst; /* 1: a destination */
} span_t;

void tide_cuda_mp_batch_free(tide_mp_prepared_t *pp) {
    tide_mp_batch_t *b = &pp->batch;
    free(b->action), free(b->owner), free(b->b_cmd), free(b->b_count), free(b->b_first);
    free(b->b_fill), free(b->b_ctas), free(b->b_bytes), free(b->b_ok), free(b->scratch);
    free(b->b_ce), free(b->ce_dst), free(b->ce_src), free(b->ce_size);
    for (int p = 0; p < 2; ++p) {
        if (b->desc_host[p] != NULL) cudaFreeHost(b->desc_host[p]);
        if (b->desc_dev[p] != NULL) cudaFree(b->desc_dev[p]);
        free(b->desc_last[p]);
    }
    (void)cudaGetLastError();
    memset(b, 0, sizeof(*b));
}

tide_result_t tide_cuda_mp_batch_prepare(tide_mp_prepared_t *pp) {
    tide_mp_batch_t *b = &pp->batch;
    int cap = 1;
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        cap = pp->num_cmds[f] > cap ? pp->num_cmds[f] : cap;
        cap = pp->se_num_cmds[f] > cap ? pp->se_num_cmds[f] : cap; /* mp_elide.c */
    }
    b->cap = cap;
    const size_t n = (size_t)cap;
    b->action = malloc(n * sizeof(int32_t));
    b->owner = malloc(n * sizeof(int32_t));
    b->b_cmd = malloc(n * sizeof(int32_t));
    b->b_count = malloc(n * sizeof(int32_t));
    b->b_first = malloc(n * sizeof(int32_t));
    b->b_fill = malloc(n * sizeof(int32_t));
    b->b_ctas = malloc(n * sizeof(int32_t));
    b->b_bytes = malloc(n * sizeof(uint64_t));
    b->b_ok = malloc(n);
    b->scratch = malloc(2 * n * sizeof(span_t));
    b->b_ce = malloc(n);
    b->ce_dst = malloc(n * sizeof(void *));
    b->ce_src = malloc(n * sizeof(void *));
    b->ce_size = malloc(n * sizeof(size_t));
    if (!b->action || !b->owner || !b->b_cmd || !b->b_count || !b->b_first || !b->b_fill ||
        !b->b_ctas || !b->b_bytes || !b->b_ok || !b->scratch || !b->b_ce || !b->ce_dst ||
        !b->ce_src || !b->ce_size) {
        tide_cuda_mp_batch_free(pp);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: batch plan of %d commands", cap);
    }
    for (int p = 0; p < 2; ++p) {
        b->last_total[p] = -1;
        b->desc_last[p] = malloc(n * sizeof(tide_cuda_copy_desc_t));
        if (b->desc_last[p] == NULL) {
            tide_cuda_mp_batch_free(pp);
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: copy descriptors of %d commands",
                            cap);
        }
        void *h = NULL;
        TIDE_CUDA_CALL(cudaMallocHost(&h, n * sizeof(tide_cuda_copy_desc_t)),
                       "cudaMallocHost(copy descriptors)");
        b->desc_host[p] = h;
        TIDE_CUDA_CALL(cudaMalloc((void **)&b->desc_dev[p], n * sizeof(tide_cuda_copy_desc_t)),
                       "cudaMalloc(copy descriptors)");
    }
    return TIDE_SUCCESS;
}

/* Whether p lies in a peer segment on another device. */
static bool remote_ptr(const tide_mp_arena_t *a, const void *p) {
    if (!a->any_remote) return false;
    const uint8_t *x = p;
    for (int r = 0; r < a->w->base.ranks; ++r) /* another node's base is NULL (NCCL rails) */
        if (a->remote[r] && a->base.bases[r] != NULL && x >= a->base.bases[r] &&
            x < a->base.bases[r] + a->alloc_bytes)
            return true;
    return false;
}

static const tide_op_t *cmd_op(const tide_mp_prepared_t *pp, const tide_sched_cmd_t *c) {
    const int t = c->thread, index = c->arg - pp->sched.op_base[t];
    return &pp->checked->ranks[t / TIDE_CUDA_Q].queues[t % TIDE_CUDA_Q].ops[index];
}

/* An OP command that issues nothing (passed over by a run). */
static bool issues_nothing(const tide_op_t *op) {
    switch (op->kind) {
    case TIDE_OP_SIGNAL:
    case TIDE_OP_WAIT:
        return true;
    case TIDE_OP_COPY:
    case TIDE_OP_ZERO:
    case TIDE_OP_CAST:
        return op->bytes == 0;
    case TIDE_OP_COPY2D:
        return op->bytes == 0 || op->rows == 0;
    default:
        return false;
    }
}

static void desc_of(const tide_op_t *op, const tide_cuda_bound_t *bd, tide_cuda_copy_desc_t *d) {
    d->dst = (uint64_t)(uintptr_t)bd->op.dst;
    d->src = (uint64_t)(uintptr_t)bd->op.src;
    d->bytes = op->bytes;
    if (op->kind == TIDE_OP_COPY2D) {
        d->rows = op->rows;
        d->src_pitch = op->src_pitch;
        d->dst_pitch = op->dst_pitch;
    } else {
        d->rows = 1;
        d->src_pitch = d->dst_pitch = op->bytes;
    }
}

static bool batchable(const tide_mp_arena_t *a, const tide_op_t *op, const tide_cuda_bound_t *bd) {
    if (op->kind != TIDE_OP_COPY && op->kind != TIDE_OP_COPY2D) return false;
    const uint64_t rows = op->kind == TIDE_OP_COPY2D ? op->rows : 1;
    uint64_t total;
    if (!tide_mul_u64(op->bytes, rows, &total)) return false;
    if (a->w->batch_max_bytes > 0 && total >= a->w->batch_max_bytes) return false;
    return !remote_ptr(a, bd->op.dst) && !remote_ptr(a, bd->op.src);
}

/* The run a copy may join: 0 none, 1 the batch kernel's, 2 a copy-engine run. */
static int run_kind(const tide_mp_arena_t *a, const tide_op_t *op, const tide_cuda_bound_t *bd) {
    const int ce = a->w->ce_batch;
    /* "all": no batch kernel; a same-device 2D copy stays one cudaMemcpy2DAsync, as a 2D copy
     * to a peer does (the copy-engine batch is flat). */
    if (batchable(a, op, bd))
        return ce != TIDE_MP_CE_ALL ? 1 : op->kind == TIDE_OP_COPY ? 2 : 0;
    if (ce == TIDE_MP_CE_OFF || op->kind != TIDE_OP_COPY) return 0;
    return remote_ptr(a, bd->op.dst) || remote_ptr(a, bd->op.src) ? 2 : 0;
}

tide_result_t tide_cuda_mp_env_ce_batch(int *mode_out) {
    const char *e = getenv("TIDE_CUDA_CE_BATCH");
    if (e == NULL || e[0] == '\0' || strcmp(e, "1") == 0)
        *mode_out = TIDE_MP_CE_PEERS;
    else if (strcmp(e, "0") == 0)
        *mode_out = TIDE_MP_CE_OFF;
    else if (strcmp(e, "all") == 0)
        *mode_out = TIDE_MP_CE_ALL;
    else
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "cuda mp fabric: TIDE_CUDA_CE_BATCH is \"%s\" (0, 1 or all)", e);
    return TIDE_SUCCESS;
}

static int by_lo(const void *x, const void *y) {
    const span_t *a = x, *b = y;
    return (a->lo > b->lo) - (a->lo < b->lo);
}

/* No destination meets another range of the batch (its own source included: conservative). */
static bool disjoint(const tide_cuda_copy_desc_t *d, int count, span_t *sp) {
    int n = 0;
    for (int i = 0; i < count; ++i) {
        const uint64_t span = (d[i].rows - 1) * d[i].dst_pitch + d[i].bytes;
        const uint64_t sspan = (d[i].rows - 1) * d[i].src_pitch + d[i].bytes;
        sp[n++] = (span_t){d[i].dst, d[i].dst + span, 1};
        sp[n++] = (span_t){d[i].src, d[i].src + sspan, 0};
    }
    qsort(sp, (size_t)n, sizeof(*sp), by_lo);
    uint64_t hi_any = 0, hi_dst = 0;
    for (int i = 0; i < n; ++i) {
        if (sp[i].lo < hi_dst || (sp[i].dst && sp[i].lo < hi_any)) return false;
        if (sp[i].hi > hi_any) hi_any = sp[i].hi;
        if (sp[i].dst && sp[i].hi > hi_dst) hi_dst = sp[i].hi;
    }
    return true;
}

tide_result_t tide_cuda_mp_batch_plan(tide_mp_arena_t *a, tide_mp_prepared_t *pp,
                                      const tide_sched_cmd_t *cmds, int n, int parity,
                                      cudaStream_t caller, tide_cuda_stats_t *st) {
    tide_mp_batch_t *b = &pp->batch;
    if (n > b->cap)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "cuda mp fabric: %d commands, batch plan of %d", n,
                        b->cap);
    int open[TIDE_CUDA_Q], runs = 0;
    for (int q = 0; q < TIDE_CUDA_Q; ++q)
        open[q] = -1;
    /* Runs per thread, in command order. */
    for (int i = 0; i < n; ++i) {
        const tide_sched_cmd_t *c = &cmds[i];
        const int q = c->thread % TIDE_CUDA_Q;
        b->action[i] = -1;
        b->owner[i] = -1;
        if (c->kind == TIDE_SCHED_CMD_OP) {
            const tide_op_t *op = cmd_op(pp, c);
            /* A push direct mode elides issues nothing either (mp_direct.c). */
            if (issues_nothing(op) || tide_cuda_mp_direct_elided(pp, c->arg)) continue;
            const tide_cuda_bound_t *bd = &pp->bound[c->arg];
            /* A put carried by a rail step is not a copy here: it ends the run. */
            const bool put = pp->rails.on && pp->rails.op_kind[c->arg] != TIDE_MP_RAIL_OP;
            const int kind = put ? 0 : run_kind(a, op, bd);
            if (kind != 0) {
                if (open[q] >= 0 && b->b_ce[open[q]] != (kind == 2)) open[q] = -1;
                if (open[q] < 0) {
                    open[q] = runs++;
                    b->b_cmd[open[q]] = i;
                    b->b_count[open[q]] = 0;
                    b->b_bytes[open[q]] = 0;
                    b->b_ce[open[q]] = kind == 2;
                }
                b->owner[i] = open[q];
                ++b->b_count[open[q]];
                b->b_bytes[open[q]] += op->bytes * (op->kind == TIDE_OP_COPY2D ? op->rows : 1);
                continue;
            }
        }
        open[q] = -1;
    }
    /* Runs of two or more get contiguous descriptor ranges. */
    int total = 0;
    const uint64_t sms = (uint64_t)a->w->sm_count;
    for (int k = 0; k < runs; ++k) {
        b->b_ok[k] = b->b_count[k] >= 2;
        b->b_fill[k] = 0;
        if (!b->b_ok[k]) continue;
        b->b_first[k] = total;
        total += b->b_count[k];
        b->b_ctas[k] = tide_cuda_batch_grid(b->b_bytes[k], sms);
    }
    if (total == 0) return TIDE_SUCCESS;
    tide_cuda_copy_desc_t *d = b->desc_host[parity];
    for (int i = 0; i < n; ++i) {
        const int k = b->owner[i];
        if (k < 0 || !b->b_ok[k]) continue;
        desc_of(cmd_op(pp, &cmds[i]), &pp->bound[cmds[i].arg], &d[b->b_first[k] + b->b_fill[k]++]);
    }
    for (int k = 0; k < runs; ++k)
        if (b->b_ok[k] && !disjoint(&d[b->b_first[k]], b->b_count[k], b->scratch)) {
            b->b_ok[k] = 0;
            st->unbatched += (uint64_t)b->b_count[k];
        }
    for (int i = 0; i < n; ++i) {
        const int k = b->owner[i];
        if (k >= 0 && b->b_ok[k]) b->action[i] = b->b_cmd[k] == i ? k : -2;
    }
    /* The device table of this parity holds these descriptors already (a program called
     * with the same operands, slot by slot, as FSDP2 does): no upload, as on the one-process
     * fabric (execute.c, batch_upload), and none counted.  Only uploads write desc_dev, and
     * each one is remembered in desc_last; a failed upload forgets it. */
    const size_t bytes = (size_t)total * sizeof(tide_cuda_copy_desc_t);
    if (b->desc_last[parity] != NULL && b->last_total[parity] == total &&
        memcmp(b->desc_last[parity], d, bytes) == 0)
        return TIDE_SUCCESS;
    b->last_total[parity] = -1;
    ++st->descriptors;
    ++st->uploads;
    TIDE_CUDA_CALL(cudaMemcpyAsync(b->desc_dev[parity], d, bytes, cudaMemcpyHostToDevice, caller),
                   "cudaMemcpyAsync(copy descriptors)");
    if (b->desc_last[parity] != NULL) {
        memcpy(b->desc_last[parity], d, bytes);
        b->last_total[parity] = total;
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_batch_issue(tide_mp_arena_t *a, tide_mp_prepared_t *pp, int k,
                                       int parity, int thread) {
    tide_mp_batch_t *b = &pp->batch;
    if (b->b_ce[k]) {
        /* The host table of the call holds the run's descriptors (flat copies only). */
        const tide_cuda_copy_desc_t *d = b->desc_host[parity] + b->b_first[k];
        const int n = b->b_count[k];
        for (int i = 0; i < n; ++i) {
            b->ce_dst[i] = (void *)(uintptr_t)d[i].dst;
            b->ce_src[i] = (const void *)(uintptr_t)d[i].src;
            b->ce_size[i] = (size_t)d[i].bytes;
        }
        struct cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof(attr));
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t first = 0;
        TIDE_CUDA_CALL(cudaMemcpyBatchAsync(b->ce_dst, b->ce_src, b->ce_size, (size_t)n, &attr,
                                            &first, 1, a->w->stream[thread % TIDE_CUDA_Q]),
                       "cudaMemcpyBatchAsync");
        return TIDE_SUCCESS;
    }
    TIDE_CUDA_CALL(tide_cuda_batch_copy(b->desc_dev[parity] + b->b_first[k], b->b_count[k],
                                        b->b_ctas[k], a->w->batch_unroll, a->w->batch_streaming,
                                        a->w->stream[thread % TIDE_CUDA_Q]),
                   "tide_cuda_batch_copy");
    return TIDE_SUCCESS;
}
