/*
 * ops.c - what every CUDA executor does the same way with one rank's ops, whatever carries
 * its signals (events between the ranks of one process, execute.c; flags in device memory
 * between processes, mp_execute.c and the NCCL fabric): the segment tables uploaded once per
 * program, the binding of a call's ops, and the issue of a data op on a stream.
 *
 * Written once so that the executors cannot drift apart in what an op does; what differs
 * between them (where a thread's stream is, which copies direct mode elides, how EVENT ops
 * are recorded, how signals and waits travel) stays with the executor.
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Segment tables start at this alignment inside a rank's table allocation. */
#define TABLE_ALIGN 256u

static size_t table_bytes(const tide_table_t *t) {
    if (t->num_segs <= 0) return 0;
    return (size_t)t->num_segs *
           (t->kind == TIDE_OP_SUM ? sizeof(tide_sum_seg_t) : sizeof(tide_land_seg_t));
}

static const void *table_segs(const tide_table_t *t) {
    return t->kind == TIDE_OP_SUM ? (const void *)t->sum_segs : (const void *)t->land_segs;
}

tide_result_t tide_cuda_tables_upload(const tide_rank_program_t *rp, int rank, cudaStream_t util,
                                      void **mem_out, const void ***dev_out) {
    const int nt = rp->num_tables;
    const void **dev = calloc((size_t)nt + 1, sizeof(*dev));
    size_t *off = calloc((size_t)nt + 1, sizeof(*off));
    uint8_t *host = NULL;
    void *mem = NULL;
    tide_result_t res = TIDE_SUCCESS;
    if (dev == NULL || off == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d tables of rank %d", nt, rank);
        goto fail;
    }
    size_t total = 0;
    for (int i = 0; i < nt; ++i) {
        const tide_table_t *t = &rp->tables[i];
        if ((t->kind != TIDE_OP_SUM && t->kind != TIDE_OP_LAND) ||
            (t->num_segs > 0 && table_segs(t) == NULL)) {
            res = TIDE_ERR(TIDE_ERR_INTERNAL, "cuda fabric: rank %d table %d is malformed", rank,
                           i);
            goto fail;
        }
        off[i] = total;
        const size_t b = table_bytes(t);
        if (b > SIZE_MAX / 2 - total - TABLE_ALIGN) {
            res = TIDE_ERR(TIDE_ERR_OVERFLOW, "cuda fabric: tables of rank %d", rank);
            goto fail;
        }
        total = (total + b + TABLE_ALIGN - 1) / TABLE_ALIGN * TABLE_ALIGN;
    }
    if (total > 0) {
        host = malloc(total);
        if (host == NULL) {
            res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %zu bytes of tables", total);
            goto fail;
        }
        for (int i = 0; i < nt; ++i)
            if (table_bytes(&rp->tables[i]) > 0)
                memcpy(host + off[i], table_segs(&rp->tables[i]), table_bytes(&rp->tables[i]));
        TIDE_CUDA_CALL_GOTO(cudaMalloc(&mem, total), "cudaMalloc(segment tables)", res, fail);
        /* Pageable source: the copy is complete only once the stream is synchronised. */
        TIDE_CUDA_CALL_GOTO(cudaMemcpyAsync(mem, host, total, cudaMemcpyHostToDevice, util),
                            "cudaMemcpyAsync(segment tables)", res, fail);
        TIDE_CUDA_CALL_GOTO(cudaStreamSynchronize(util), "cudaStreamSynchronize(tables)", res,
                            fail);
        for (int i = 0; i < nt; ++i)
            if (table_bytes(&rp->tables[i]) > 0) dev[i] = (const uint8_t *)mem + off[i];
    }
    free(host);
    free(off);
    *mem_out = mem;
    *dev_out = dev;
    return TIDE_SUCCESS;
fail:
    if (mem != NULL) cudaFree(mem);
    (void)cudaGetLastError();
    free(host);
    free(off);
    free(dev);
    return res;
}

tide_result_t tide_cuda_bind_rank(const tide_cuda_bind_env_t *env, const tide_schedule_t *sched,
                                  const tide_program_t *prog, const tide_binding_t *b,
                                  tide_cuda_bound_t *bound) {
    const int r = b->rank;
    for (int q = 0; q < TIDE_CUDA_Q; ++q) {
        const tide_queue_ops_t *qo = &prog->ranks[r].queues[q];
        const int base = sched->op_base[r * TIDE_CUDA_Q + q];
        for (int i = 0; i < qo->num_ops; ++i) {
            tide_cuda_bound_t *out = &bound[base + i];
            const tide_op_t *op = &qo->ops[i];
            if (env->skip != NULL && env->skip[base + i]) continue;
            switch (op->kind) {
            case TIDE_OP_WAIT:
            case TIDE_OP_SIGNAL:
                break; /* the schedule's commands carry them */
            case TIDE_OP_SUM:
                TIDE_CHECK(tide_bind_sum(b, prog, (tide_queue_t)q, i, &out->sum));
                out->sum.segs = env->table_dev[op->table];
                out->sum.own = env->own;
                if (env->direct_l > 0 && out->sum.num_staged > 0) {
                    /* Direct mode (direct.c): the other local ranks' gradients in place, the
                     * row of L P pointers with this rank's own P last. */
                    if (out->sum.num_staged != env->direct_l - 1)
                        return TIDE_ERR(TIDE_ERR_INTERNAL,
                                        "cuda fabric: rank %d: a sum of %d staged "
                                        "contributions on a node of %d ranks",
                                        r, out->sum.num_staged, env->direct_l);
                    out->sum.peers = out->sum.own;
                    out->sum.peer_stride = env->num_params;
                    out->sum.own = out->sum.own + (size_t)(env->direct_l - 1) *
                                                      (size_t)env->num_params;
                }
                break;
            case TIDE_OP_LAND:
                TIDE_CHECK(tide_bind_land(b, prog, (tide_queue_t)q, i, &out->land));
                out->land.segs = env->table_dev[op->table];
                break;
            default:
                TIDE_CHECK(tide_bind_op(b, prog, (tide_queue_t)q, i, &out->op));
                break;
            }
        }
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_op_failed(cudaError_t err, int rank, int q, int index, int kind,
                                  const char *call) {
    char what[160];
    snprintf(what, sizeof(what), "rank %d queue %s op %d (%s): %s", rank,
             tide_queue_name((tide_queue_t)q), index, tide_op_kind_name(kind), call);
    return tide_cuda_error(err, __FILE__, __LINE__, what);
}

/* The cast's grid: enough CTAs for 8 elements a thread, at most one per SM. */
static int cast_ctas(const tide_cuda_op_env_t *env, uint64_t n) {
    const uint64_t per_cta = (uint64_t)TIDE_CAST_THREADS * 8u;
    const uint64_t ctas = (n + per_cta - 1) / per_cta, cap = (uint64_t)env->sm_count;
    return (int)(ctas < 1 ? 1 : ctas > cap ? cap : ctas);
}

tide_result_t tide_cuda_op_issue(const tide_cuda_op_env_t *env, const tide_rank_program_t *rp,
                                 int rank, int q, int index, const tide_cuda_bound_t *b,
                                 cudaStream_t s, tide_cuda_stats_t *st) {
    const tide_op_t *op = &rp->queues[q].ops[index];
    cudaError_t e = cudaSuccess;
    const char *call = "";
    switch (op->kind) {
    case TIDE_OP_COPY:
        if (op->bytes == 0) return TIDE_SUCCESS;
        ++st->descriptors;
        call = "cudaMemcpyAsync";
        e = cudaMemcpyAsync(b->op.dst, b->op.src, (size_t)op->bytes, cudaMemcpyDefault, s);
        break;
    case TIDE_OP_COPY2D:
        if (op->bytes == 0 || op->rows == 0) return TIDE_SUCCESS;
        if (op->src_pitch <= env->max_pitch && op->dst_pitch <= env->max_pitch) {
            ++st->descriptors;
            call = "cudaMemcpy2DAsync";
            e = cudaMemcpy2DAsync(b->op.dst, (size_t)op->dst_pitch, b->op.src,
                                  (size_t)op->src_pitch, (size_t)op->bytes, (size_t)op->rows,
                                  cudaMemcpyDefault, s);
            break;
        }
        /* Pitches past the device limit: one flat copy per row. */
        call = "cudaMemcpyAsync (2D row)";
        for (uint64_t r = 0; r < op->rows && e == cudaSuccess; ++r) {
            ++st->descriptors;
            e = cudaMemcpyAsync((uint8_t *)b->op.dst + r * op->dst_pitch,
                                (const uint8_t *)b->op.src + r * op->src_pitch, (size_t)op->bytes,
                                cudaMemcpyDefault, s);
        }
        break;
    case TIDE_OP_ZERO:
        if (op->bytes == 0) return TIDE_SUCCESS;
        ++st->descriptors;
        call = "cudaMemsetAsync";
        e = cudaMemsetAsync(b->op.dst, 0, (size_t)op->bytes, s);
        break;
    case TIDE_OP_CAST:
        if (op->bytes == 0) return TIDE_SUCCESS;
        ++st->descriptors;
        call = "tide_cuda_cast_bf16";
        e = tide_cuda_cast_bf16(b->op.src, b->op.dst, op->bytes / 2,
                                cast_ctas(env, op->bytes / 2), 0, s);
        break;
    case TIDE_OP_SUM:
        ++st->descriptors;
        call = "tide_cuda_sum";
        e = tide_cuda_issue_sum(&rp->tables[op->table], &b->sum, env->sum_ctas, env->slicing, s,
                                &st->sliced);
        break;
    case TIDE_OP_LAND:
        ++st->descriptors;
        call = "tide_cuda_land";
        e = tide_cuda_issue_land(&rp->tables[op->table], &b->land, env->landing_ctas,
                                 env->slicing, s, &st->sliced);
        break;
    default:
        return TIDE_SUCCESS; /* SIGNAL, WAIT, EVENT: the executor's */
    }
    return e == cudaSuccess ? TIDE_SUCCESS : tide_cuda_op_failed(e, rank, q, index, op->kind, call);
}

tide_result_t tide_cuda_call_check(const char *fabric, const tide_program_t *prog,
                                   const tide_binding_t *binding,
                                   const struct tide_fabric_arena *arena, int ranks, int device,
                                   void *stream, cudaStream_t *caller_out) {
    const int r = arena->world->rank;
    if (prog->num_ranks != ranks || binding->rank != r || binding->arena != arena ||
        (prog->coll != TIDE_COLL_ALL_GATHER && prog->coll != TIDE_COLL_REDUCE_SCATTER) ||
        (unsigned)prog->mode >= TIDE_RS_MODE_COUNT)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "%s: program of %d ranks / binding of rank %d does not match rank %d of "
                        "%d",
                        fabric, prog->num_ranks, binding->rank, r, ranks);
    cudaStream_t caller = (cudaStream_t)stream;
    /* While a stream captures (graph.c), the runtime refuses cudaStreamGetDevice in the
     * default (global) capture mode and invalidates the capture; cudaStreamIsCapturing is
     * allowed.  A captured call's stream is then not checked for its device here. */
    enum cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (caller != NULL && cudaStreamIsCapturing(caller, &capturing) != cudaSuccess) {
        (void)cudaGetLastError();
        capturing = cudaStreamCaptureStatusNone; /* an invalid stream: reported below */
    }
    if (caller != NULL && capturing == cudaStreamCaptureStatusNone) {
        int dev = -1;
        const cudaError_t e = cudaStreamGetDevice(caller, &dev);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                            "%s: rank %d: stream is not a valid cudaStream_t (%s)", fabric, r,
                            cudaGetErrorString(e));
        }
        if (dev != device)
            return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                            "%s: rank %d runs on device %d, its stream belongs to device %d",
                            fabric, r, device, dev);
    }
    *caller_out = caller;
    return TIDE_SUCCESS;
}

uint64_t tide_cuda_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

tide_cuda_stats_t tide_cuda_stats_begin(const tide_cuda_stats_t *prev, int form) {
    tide_cuda_stats_t st;
    memset(&st, 0, sizeof(st));
    st.calls = prev->calls;
    st.form = form;
    return st;
}

void tide_cuda_stats_end(tide_cuda_stats_t *st, uint64_t t0_ns, tide_cuda_stats_t *out) {
    ++st->calls;
    st->enqueue_ns = tide_cuda_now_ns() - t0_ns;
    *out = *st;
}
