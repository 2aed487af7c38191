/*
 * cuda_stock.cu - tide-bench's stand-in for the stock FSDP2 path on the GPU and its device
 * kernels: deterministic inputs, the all-gather (a rank-major gather and one 2D copy per
 * parameter, FSDP2's split_with_sizes_copy), the reduce-scatter (_chunk_cat-style fp32 pack,
 * rank-order fp32 reduction) and the data check.
 *
 * The same file is also built as libtide_bench_stock.so (CUDA builds, not installed), so that
 * tests/gpu/bench_torch_baseline.py can time exactly this stand-in beside PyTorch's own ops on
 * the same buffers and report how far apart they are (README, "tide-bench").
 */
#include "tide-bench/cuda_bench.h"

#include <stdint.h>

#define THREADS 256

/* The same integers as the CPU runner's int_value: exact under any summation order. */
__device__ static uint16_t int_value(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = seed ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full) ^ (c + 0x165667B1);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    const float v = (float)((int)(x % 9) - 4);
    /* A small integer's float has 16 zero low bits: its bf16 is the high half, exactly. */
    return (uint16_t)(__float_as_uint(v) >> 16);
}

__global__ static void fill_kernel(uint16_t *dst, uint64_t n, uint64_t seed, uint64_t a,
                                   uint64_t b) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        dst[i] = int_value(seed, a, b, i);
}

__device__ static float bf16_to_float(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* blockIdx.y = parameter p.  Element j of rank r's chunk r of p (j = r R K + e) is the
 * gradient's flat element j, or padding (+0) past D_p K_p. */
__global__ static void pack_kernel(const uint16_t *const *grads, const bench_pack_param_t *pp,
                                   int N, uint64_t elems, float *pack) {
    const bench_pack_param_t q = pp[blockIdx.y];
    const uint64_t rk = q.rows_per_rank * q.inner, total = rk * (uint64_t)N,
                   real = q.dim0 * q.inner;
    const uint16_t *g = grads[blockIdx.y];
    for (uint64_t j = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; j < total;
         j += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = j / rk, e = j - r * rk;
        pack[r * elems + q.fp32_off + e] = j < real ? bf16_to_float(g[j]) : 0.0f;
    }
}

__global__ static void reduce_kernel(const float *const *packs, int N, uint64_t off,
                                     uint64_t elems, float alpha, float *out) {
    for (uint64_t e = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; e < elems;
         e += (uint64_t)gridDim.x * blockDim.x) {
        float acc = packs[0][off + e];
        for (int u = 1; u < N; ++u)
            acc += packs[u][off + e];
        out[e] = alpha * acc;
    }
}

__global__ static void diff_u16_kernel(const uint16_t *a, const uint16_t *b, uint64_t n,
                                       unsigned long long *count) {
    unsigned long long k = 0;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        k += a[i] != b[i];
    if (k) atomicAdd(count, k);
}

/* As the CPU runner: float equality (+0 equals -0; a NaN is wrong). */
__global__ static void diff_f32_kernel(const float *a, const float *b, uint64_t n,
                                       unsigned long long *count) {
    unsigned long long k = 0;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        k += !(a[i] == b[i]);
    if (k) atomicAdd(count, k);
}

static unsigned grid_for(uint64_t n) {
    uint64_t g = (n + THREADS - 1) / THREADS;
    if (g > 4096) g = 4096;
    return g < 1 ? 1u : (unsigned)g;
}

extern "C" cudaError_t bench_cuda_fill(uint16_t *dst, uint64_t n, uint64_t seed, uint64_t a,
                                       uint64_t b, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    fill_kernel<<<grid_for(n), THREADS, 0, s>>>(dst, n, seed, a, b);
    return cudaGetLastError();
}

extern "C" cudaError_t bench_cuda_gather_copy_out(const void *const *shards, int N, uint64_t S,
                                                  void *flat, void *landing,
                                                  const uint64_t *offsets, const uint64_t *bytes,
                                                  int P, cudaStream_t s) {
    for (int u = 0; u < N; ++u) {
        cudaError_t e = cudaMemcpyAsync((uint8_t *)flat + (uint64_t)u * S, shards[u], S,
                                        cudaMemcpyDefault, s);
        if (e != cudaSuccess) return e;
    }
    for (int p = 0; p < P; ++p) {
        if (bytes[p] == 0) continue;
        cudaError_t e = cudaMemcpy2DAsync((uint8_t *)landing + offsets[p] * (uint64_t)N, bytes[p],
                                          (const uint8_t *)flat + offsets[p], S, bytes[p],
                                          (size_t)N, cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

extern "C" cudaError_t bench_cuda_pack(const uint16_t *const *grads, const bench_pack_param_t *pp,
                                       int P, int N, uint64_t elems, uint64_t max_param_elems,
                                       float *pack, cudaStream_t s) {
    if (P == 0) return cudaSuccess;
    dim3 grid(grid_for(max_param_elems * (uint64_t)N), (unsigned)P);
    pack_kernel<<<grid, THREADS, 0, s>>>(grads, pp, N, elems, pack);
    return cudaGetLastError();
}

extern "C" cudaError_t bench_cuda_reduce(const float *const *packs, int N, uint64_t off,
                                         uint64_t elems, float alpha, float *out, cudaStream_t s) {
    if (elems == 0) return cudaSuccess;
    reduce_kernel<<<grid_for(elems), THREADS, 0, s>>>(packs, N, off, elems, alpha, out);
    return cudaGetLastError();
}

extern "C" cudaError_t bench_cuda_count_diff(const void *a, const void *b, uint64_t n, int is_f32,
                                             unsigned long long *count, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (is_f32)
        diff_f32_kernel<<<grid_for(n), THREADS, 0, s>>>((const float *)a, (const float *)b, n,
                                                        count);
    else
        diff_u16_kernel<<<grid_for(n), THREADS, 0, s>>>((const uint16_t *)a, (const uint16_t *)b,
                                                        n, count);
    return cudaGetLastError();
}
