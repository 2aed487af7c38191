/*
 * cuda_bench.h - tide-bench on the CUDA fabric (CUDA builds only): a rank's device buffers and
 * the stock FSDP2 path on them, shared by the one-process runner (cuda_runner.c) and the
 * one-process-per-rank runner (cuda_procs.c).
 *
 * Stock path, on the same device buffers as TIDE:
 *   AG  rank-major gather of every rank's shard into a flat N S buffer (N cudaMemcpyAsync),
 *       then the copy-out into parameter-major storage, one cudaMemcpy2DAsync per parameter
 *       (what split_with_sizes_copy does, as copies instead of one torch kernel)
 *   RS  a _chunk_cat-style fp32 pack of every gradient (a kernel: slice per destination rank,
 *       pad, upcast), then per rank a rank-order fp32 sum of its chunk of every pack, times
 *       alpha (a kernel).  These are stand-ins for PyTorch's ops, not PyTorch's ops.
 * Inputs are small integers (cuda_stock.cu), so both paths compute exact sums and the check
 * demands equality element by element, as the CPU runner does.
 */
#ifndef TIDE_BENCH_CUDA_BENCH_H_
#define TIDE_BENCH_CUDA_BENCH_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

typedef struct {
    uint64_t rows_per_rank, inner, dim0, fp32_off; /* fp32_off in elements */
} bench_pack_param_t;

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t bench_cuda_fill(uint16_t *dst, uint64_t n, uint64_t seed, uint64_t a, uint64_t b,
                            cudaStream_t s);
/* Stock AG on the host's arrays: shards[N] into flat (rank-major), then parameter p's N shard
 * slices (offsets[p], bytes[p] within a shard) into landing at N offsets[p]. */
cudaError_t bench_cuda_gather_copy_out(const void *const *shards, int N, uint64_t S, void *flat,
                                       void *landing, const uint64_t *offsets,
                                       const uint64_t *bytes, int P, cudaStream_t s);
cudaError_t bench_cuda_pack(const uint16_t *const *grads, const bench_pack_param_t *pp, int P,
                            int N, uint64_t elems, uint64_t max_param_elems, float *pack,
                            cudaStream_t s);
cudaError_t bench_cuda_reduce(const float *const *packs, int N, uint64_t off, uint64_t elems,
                              float alpha, float *out, cudaStream_t s);
cudaError_t bench_cuda_count_diff(const void *a, const void *b, uint64_t n, int is_f32,
                                  unsigned long long *count, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#ifndef __CUDACC__
#include "tide-bench/bench.h"

/* One rank's buffers, on its device. */
typedef struct {
    int rank, N, P, dev;
    cudaStream_t st;
    uint64_t S, elems, group_bytes, rs_bytes, max_param_elems;
    tide_param_geometry_t *geo;    /* [P] */
    uint64_t *seg_off, *seg_bytes; /* [P] geo's shard_offset and shard_bytes */
    uint16_t *shard, *flat, *landing;
    uint16_t **grads;              /* [P] device pointers (host array) */
    const uint16_t **d_grads;      /* the same, on the device */
    bench_pack_param_t *d_params;  /* [P] on the device */
    float *pack, *out_tide, *out_stock;
    const float **d_packs;         /* [N] every rank's pack as this rank reaches it */
    unsigned long long *d_count;
} bench_cuda_rank_t;

/* Allocate and fill rank `rank`'s buffers on device `dev` (the current device afterwards). */
tide_result_t bench_cuda_rank_init(bench_cuda_rank_t *b, const bench_opts_t *o,
                                   const tide_param_shape_t *shapes, int P, tide_plan_t plan,
                                   int rank, int dev);
void bench_cuda_rank_free(bench_cuda_rank_t *b);

/* The d_packs table from the N packs as this rank's device reaches them. */
tide_result_t bench_cuda_set_packs(bench_cuda_rank_t *b, float *const *packs);

/* Stock AG of rank b from every rank's shard (as b's device reaches them), on b->st. */
tide_result_t bench_cuda_stock_ag(bench_cuda_rank_t *b, uint16_t *const *shards);
/* Stock RS, the two halves: pack b's gradients; sum b's chunk of every pack. */
tide_result_t bench_cuda_stock_pack(bench_cuda_rank_t *b);
tide_result_t bench_cuda_stock_reduce(bench_cuda_rank_t *b, float alpha);

/* Elements where TIDE's landing (slot) / output and the stock path's differ. */
tide_result_t bench_cuda_count_wrong(bench_cuda_rank_t *b, tide_group_t g, int slot,
                                     uint64_t *wrong_ag, uint64_t *wrong_rs);

/* Fill the two rows of a size from rank 0's medians (us) and the wrong counts. */
void bench_cuda_rows(const bench_opts_t *o, const bench_cuda_rank_t *b, int divisor,
                     double *const times[4], uint64_t wrong_ag, uint64_t wrong_rs,
                     bench_row_t *rows);

double bench_now_us(void);
#endif

#endif /* TIDE_BENCH_CUDA_BENCH_H_ */
