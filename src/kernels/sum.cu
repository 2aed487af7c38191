/*
 * sum.cu - the Level-1 sum of TIDE-RS on the GPU (kernels.h; paper §4.1, §4.3).
 *
 * out[e] = ((staged[0][e] + staged[1][e]) + ... + staged[L-2][e]) + own[e], fp32, for every
 * element of every segment; padding elements (e >= valid) are written +0 and read nothing.
 * All variants share the decomposition of sum_common.cuh (chunks dealt round-robin to a CTA
 * budget, no CTA waits for another) and its order of adds, so every variant, CTA budget and
 * thread count gives the same bits as tide_ref_sum.
 *
 *   PLAIN  one 16-byte group per thread per chunk, L vector loads issued before the first add:
 *          threads * L * 16 bytes in flight per CTA, bounded by registers.
 *   TMA    warp-specialised: producer warps bulk-copy L tiles per chunk into a shared ring
 *          (cp.async.bulk + mbarrier), consumer warps sum from it (sum_tma.cuh).  sm_90.
 *          tide_sum::launch_tma_opts (below) takes the internal options the benchmark sweeps.
 *   ASYNC  per-thread cp.async into private shared slots S chunks ahead (sum_async.cuh).
 *          sm_80.
 *   PLAIN2 PLAIN with U groups a thread per chunk (sum_plain2.cu).
 *   HYBRID the first R sources through a bulk-copy ring, the others straight into the
 *          consumers' registers (sum_hybrid.cuh, sum_hybrid.cu).  sm_90.
 */
#include "kernels/launch.h"
#include "kernels/sum_async.cuh"
#include "kernels/sum_common.cuh"
#include "kernels/sum_hybrid.cuh"
#include "kernels/sum_tma.cuh"

namespace tide_sum {
namespace {

template <typename T, int NS>
__global__ void __launch_bounds__(1024) sum_plain_kernel(const tide_sum_args_t a) {
    const unsigned nthr = blockDim.x, tid = threadIdx.x;
    chunk_cursor<T, NS> k;
#pragma unroll 1
    for (cursor_start(k, a, nthr); !k.done; cursor_next(k, a, nthr)) {
        if (k.c == 0 && tid < k.v.head) do_element(k.v, tid);
        const uint64_t g = k.c * nthr + tid;
        if (g < k.v.groups) do_group(k.v, g);
    }
}

struct device_info {
    int dev, major, optin;
};

cudaError_t query_device(device_info *d) {
    cudaError_t err = cudaGetDevice(&d->dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->major, cudaDevAttrComputeCapabilityMajor, d->dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&d->optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d->dev);
    return err;
}

template <typename T, int NS>
cudaError_t launch_ns(const tide_sum_args_t &a, const tide_sum_launch_t &cfg, const device_info &d,
                      cudaStream_t stream) {
    switch (cfg.variant) {
    case TIDE_SUM_TMA: {
        if (cfg.threads > kTmaPublicThreads || cfg.producers > kTmaPublicProducers)
            return cudaErrorInvalidValue;
        /* raw_nan: bit-identical for every dtype and L (tests/gpu/test_kernels), 4% faster. */
        const tma_opts o = {cfg.ctas,        cfg.threads,       cfg.producers, cfg.smem_bytes,
                            cfg.stage_bytes, TMA_CONSUME_UNITS, 1};
        return launch_tma<T, NS>(a, o, d.dev, d.optin, stream);
    }
    case TIDE_SUM_ASYNC:
        return launch_async<T, NS>(a, cfg.ctas, cfg.threads, cfg.smem_bytes, d.dev, d.optin,
                                   stream);
    default: {
        const int threads = cfg.threads == 0 ? TIDE_SUM_PLAIN_THREADS : cfg.threads;
        sum_plain_kernel<T, NS><<<cfg.ctas, threads, 0, stream>>>(a);
        return cudaGetLastError();
    }
    }
}

template <typename T>
cudaError_t launch_dtype(const tide_sum_args_t &a, const tide_sum_launch_t &cfg,
                         const device_info &d, cudaStream_t stream) {
    return with_ns(a.num_staged, [&](auto ns) -> cudaError_t {
        return launch_ns<T, decltype(ns)::value>(a, cfg, d, stream);
    });
}

template <typename T>
cudaError_t launch_tma_dtype(const tide_sum_args_t &a, const tma_opts &o, const device_info &d,
                             cudaStream_t stream) {
    return with_ns(a.num_staged, [&](auto ns) -> cudaError_t {
        return launch_tma<T, decltype(ns)::value>(a, o, d.dev, d.optin, stream);
    });
}

} // namespace

cudaError_t launch_tma_opts(const tide_sum_args_t &a, const tma_opts &o, cudaStream_t stream) {
    if (a.num_staged < 0 || a.num_staged > TIDE_MAX_GPUS_PER_NODE - 1 || a.num_segs < 0 ||
        (a.dtype != TIDE_DTYPE_BF16 && a.dtype != TIDE_DTYPE_FP32))
        return cudaErrorInvalidValue;
    if (a.num_segs == 0) return cudaSuccess;
    device_info d;
    cudaError_t err = query_device(&d);
    if (err != cudaSuccess) return err;
    if (d.major < 9) return cudaErrorInvalidDeviceFunction;
    if (a.dtype == TIDE_DTYPE_BF16) return launch_tma_dtype<uint16_t>(a, o, d, stream);
    return launch_tma_dtype<float>(a, o, d, stream);
}

} // namespace tide_sum

extern "C" cudaError_t tide_cuda_sum_launch(const tide_sum_args_t *args,
                                            const tide_sum_launch_t *cfg, cudaStream_t stream) {
    if (args == NULL || cfg == NULL || cfg->ctas < 1 || cfg->threads < 0 || cfg->threads > 1024 ||
        cfg->threads % 32 != 0 || (cfg->threads > 0 && cfg->threads < 64) || cfg->smem_bytes < 0 ||
        cfg->stage_bytes < 0 || cfg->producers < 0 || cfg->groups < 0 || cfg->bulk_sources < 0 ||
        args->num_segs < 0 || args->num_staged < 0 || args->slices < 0 || args->slice < 0 ||
        (args->slice > 0 && args->slice >= args->slices) ||
        args->num_staged > TIDE_MAX_GPUS_PER_NODE - 1 || (int)cfg->variant < 0 ||
        cfg->variant >= TIDE_SUM_VARIANT_COUNT)
        return cudaErrorInvalidValue;
    if (args->dtype != TIDE_DTYPE_BF16 && args->dtype != TIDE_DTYPE_FP32)
        return cudaErrorInvalidValue;
    if (args->num_segs == 0) return cudaSuccess;
    if (args->segs == NULL || args->out == NULL || args->own == NULL ||
        (args->num_staged > 0 && args->staged == NULL))
        return cudaErrorInvalidValue;
    tide_sum::device_info d;
    cudaError_t err = tide_sum::query_device(&d);
    if (err != cudaSuccess) return err;
    tide_sum_launch_t c = *cfg;
    if (c.variant == TIDE_SUM_AUTO) {
        c.variant = d.major >= 9 ? TIDE_SUM_DEFAULT_SM90 : TIDE_SUM_PLAIN;
    } else if (((c.variant == TIDE_SUM_TMA || c.variant == TIDE_SUM_HYBRID) && d.major < 9) ||
               (c.variant == TIDE_SUM_ASYNC && d.major < 8)) {
        return cudaErrorInvalidDeviceFunction;
    }
    if (c.variant == TIDE_SUM_PLAIN2)
        return tide_sum::launch_plain2(*args, c.ctas, c.threads, c.groups, stream);
    if (c.variant == TIDE_SUM_HYBRID) {
        const tide_sum::hybrid_opts o = {c.ctas,         c.threads,   c.groups,
                                         c.bulk_sources, c.producers, c.smem_bytes};
        return tide_sum::launch_hybrid(*args, o, d.dev, d.optin, stream);
    }
    if (args->dtype == TIDE_DTYPE_BF16)
        return tide_sum::launch_dtype<uint16_t>(*args, c, d, stream);
    return tide_sum::launch_dtype<float>(*args, c, d, stream);
}

extern "C" cudaError_t tide_cuda_sum(const tide_sum_args_t *args, int ctas, int threads,
                                     cudaStream_t stream) {
    const tide_sum_launch_t cfg = {TIDE_SUM_AUTO, ctas, threads, 0, 0, 0, 0, 0};
    return tide_cuda_sum_launch(args, &cfg, stream);
}
