/*
 * cuda_common.c - a rank's device buffers and the stock path for tide-bench's CUDA runners
 * (cuda_bench.h says what the stock path is).
 */
#include "tide-bench/cuda_bench.h"

#include "core/checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "tide-bench: rank %d: %s: %s\n", b->rank, #call,                      \
                    cudaGetErrorString(e_));                                                      \
            return TIDE_ERR_FABRIC;                                                               \
        }                                                                                         \
    } while (0)

double bench_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

tide_result_t bench_cuda_rank_init(bench_cuda_rank_t *b, const bench_opts_t *o,
                                   const tide_param_shape_t *shapes, int P, tide_plan_t plan,
                                   int rank, int dev) {
    memset(b, 0, sizeof(*b));
    const int N = o->nodes * o->gpus_per_node;
    b->rank = rank, b->N = N, b->P = P, b->dev = dev;
    tide_plan_summary_t sum;
    TIDE_CHECK(tide_plan_get_summary(plan, &sum));
    b->S = sum.shard_bytes;
    b->elems = sum.fp32_shard_bytes / 4;
    b->group_bytes = sum.group_bytes;
    b->rs_bytes = sum.grad_shard_bytes * (uint64_t)N;
    b->geo = calloc((size_t)P, sizeof(*b->geo));
    b->grads = calloc((size_t)P, sizeof(*b->grads));
    b->seg_off = calloc((size_t)P, sizeof(*b->seg_off));
    b->seg_bytes = calloc((size_t)P, sizeof(*b->seg_bytes));
    bench_pack_param_t *pp = calloc((size_t)P, sizeof(*pp));
    if (b->geo == NULL || b->grads == NULL || b->seg_off == NULL || b->seg_bytes == NULL ||
        pp == NULL) {
        free(pp);
        return TIDE_ERR_NO_MEMORY;
    }
    for (int p = 0; p < P; ++p) {
        TIDE_CHECK(tide_plan_get_param(plan, p, &b->geo[p]));
        b->seg_off[p] = b->geo[p].shard_offset;
        b->seg_bytes[p] = b->geo[p].shard_bytes;
        pp[p] = (bench_pack_param_t){b->geo[p].rows_per_rank, b->geo[p].inner, shapes[p].dim0,
                                     b->geo[p].fp32_offset / 4};
        const uint64_t rk = b->geo[p].rows_per_rank * b->geo[p].inner;
        if (rk > b->max_param_elems) b->max_param_elems = rk;
    }
    cudaError_t e0 = cudaSetDevice(dev);
    if (e0 != cudaSuccess) {
        free(pp);
        fprintf(stderr, "tide-bench: rank %d: cudaSetDevice(%d): %s\n", rank, dev,
                cudaGetErrorString(e0));
        return TIDE_ERR_FABRIC;
    }
    CK(cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking));
    CK(cudaMalloc((void **)&b->shard, b->S));
    CK(cudaMalloc((void **)&b->flat, b->S * (uint64_t)N));
    CK(cudaMalloc((void **)&b->landing, b->S * (uint64_t)N));
    CK(cudaMalloc((void **)&b->pack, b->elems * (uint64_t)N * sizeof(float)));
    CK(cudaMalloc((void **)&b->out_tide, b->elems * sizeof(float)));
    CK(cudaMalloc((void **)&b->out_stock, b->elems * sizeof(float)));
    CK(cudaMalloc((void **)&b->d_grads, (size_t)P * sizeof(void *) + 8));
    CK(cudaMalloc((void **)&b->d_params, (size_t)P * sizeof(*pp) + 8));
    CK(cudaMalloc((void **)&b->d_packs, (size_t)N * sizeof(void *)));
    CK(cudaMalloc((void **)&b->d_count, sizeof(unsigned long long)));
    /* Gaps between parameters in the pack are never written: zero them once. */
    CK(cudaMemsetAsync(b->pack, 0, b->elems * (uint64_t)N * sizeof(float), b->st));
    CK(cudaMemsetAsync(b->out_tide, 0, b->elems * sizeof(float), b->st));
    CK(bench_cuda_fill(b->shard, b->S / 2, o->seed, 1, (uint64_t)rank, b->st));
    for (int p = 0; p < P; ++p) {
        const uint64_t n = shapes[p].dim0 * shapes[p].inner;
        CK(cudaMalloc((void **)&b->grads[p], n * 2 + 16));
        CK(bench_cuda_fill(b->grads[p], n, o->seed, 2 + (uint64_t)p, (uint64_t)rank, b->st));
    }
    CK(cudaMemcpyAsync(b->d_grads, b->grads, (size_t)P * sizeof(void *), cudaMemcpyHostToDevice,
                       b->st));
    CK(cudaMemcpyAsync(b->d_params, pp, (size_t)P * sizeof(*pp), cudaMemcpyHostToDevice, b->st));
    CK(cudaStreamSynchronize(b->st));
    free(pp);
    return TIDE_SUCCESS;
}

void bench_cuda_rank_free(bench_cuda_rank_t *b) {
    if (b->st == NULL) {
        free(b->geo), free(b->grads), free(b->seg_off), free(b->seg_bytes);
        memset(b, 0, sizeof(*b));
        return;
    }
    cudaSetDevice(b->dev);
    cudaStreamSynchronize(b->st);
    cudaFree(b->shard), cudaFree(b->flat), cudaFree(b->landing), cudaFree(b->pack);
    cudaFree(b->out_tide), cudaFree(b->out_stock), cudaFree((void *)b->d_grads);
    cudaFree(b->d_params), cudaFree((void *)b->d_packs), cudaFree(b->d_count);
    for (int p = 0; p < b->P && b->grads != NULL; ++p) cudaFree(b->grads[p]);
    cudaStreamDestroy(b->st);
    free(b->geo), free(b->grads), free(b->seg_off), free(b->seg_bytes);
    memset(b, 0, sizeof(*b));
}

tide_result_t bench_cuda_set_packs(bench_cuda_rank_t *b, float *const *packs) {
    CK(cudaSetDevice(b->dev));
    CK(cudaMemcpy((void *)b->d_packs, packs, (size_t)b->N * sizeof(void *),
                  cudaMemcpyHostToDevice));
    return TIDE_SUCCESS;
}

tide_result_t bench_cuda_stock_ag(bench_cuda_rank_t *b, uint16_t *const *shards) {
    CK(cudaSetDevice(b->dev)); /* b->st belongs to it */
    CK(bench_cuda_gather_copy_out((const void *const *)shards, b->N, b->S, b->flat, b->landing,
                                  b->seg_off, b->seg_bytes, b->P, b->st));
    return TIDE_SUCCESS;
}

tide_result_t bench_cuda_stock_pack(bench_cuda_rank_t *b) {
    CK(cudaSetDevice(b->dev)); /* b->st belongs to it */
    CK(bench_cuda_pack(b->d_grads, b->d_params, b->P, b->N, b->elems, b->max_param_elems, b->pack,
                       b->st));
    return TIDE_SUCCESS;
}

tide_result_t bench_cuda_stock_reduce(bench_cuda_rank_t *b, float alpha) {
    CK(cudaSetDevice(b->dev)); /* b->st belongs to it */
    CK(bench_cuda_reduce(b->d_packs, b->N, (uint64_t)b->rank * b->elems, b->elems, alpha,
                         b->out_stock, b->st));
    return TIDE_SUCCESS;
}

tide_result_t bench_cuda_count_wrong(bench_cuda_rank_t *b, tide_group_t g, int slot,
                                     uint64_t *wrong_ag, uint64_t *wrong_rs) {
    void *land = NULL;
    TIDE_CHECK(tide_group_landing(g, slot, &land));
    unsigned long long k[2];
    CK(cudaSetDevice(b->dev));
    CK(cudaStreamSynchronize(b->st));
    for (int c = 0; c < 2; ++c) {
        CK(cudaMemsetAsync(b->d_count, 0, sizeof(*b->d_count), b->st));
        if (c == 0)
            CK(bench_cuda_count_diff(land, b->landing, b->group_bytes / 2, 0, b->d_count, b->st));
        else
            CK(bench_cuda_count_diff(b->out_tide, b->out_stock, b->elems, 1, b->d_count, b->st));
        CK(cudaMemcpyAsync(&k[c], b->d_count, sizeof(k[c]), cudaMemcpyDeviceToHost, b->st));
        CK(cudaStreamSynchronize(b->st));
    }
    *wrong_ag = k[0];
    *wrong_rs = k[1];
    return TIDE_SUCCESS;
}

void bench_cuda_rows(const bench_opts_t *o, const bench_cuda_rank_t *b, int divisor,
                     double *const times[4], uint64_t wrong_ag, uint64_t wrong_rs,
                     bench_row_t *rows) {
    /* As the CPU runner: N S (AG) and N S_grad (RS). */
    const uint64_t bytes[2] = {b->group_bytes, b->rs_bytes};
    bench_fill_rows(o, b->N, b->P, divisor, bytes, times, wrong_ag, wrong_rs, rows);
}
