/*
 * sum_tma.cuh - the warp-specialised Level-1 sum (sm_90): bulk copies into a shared ring.
 *
 * The first `producers` warps (1 or 2) are producers: lane 0 of each walks the CTA's chunks
 * and, for its share of them, copies the chunk's L source tiles (staged contributions, then
 * own) into one stage of a shared-memory ring with cp.async.bulk, which completes on the
 * stage's "full" mbarrier with a byte count.  The other warps are consumers: they wait on
 * "full", sum from shared memory in the contract's order, store fp32 to global memory and
 * arrive on the stage's "empty" mbarrier, which a producer waits on before refilling the
 * stage.  The loads in flight are the ring's, not registers'.  Heads, partial groups, padding
 * and unaligned segments are summed by the consumers from global memory (sum_common.cuh).
 *
 * A chunk is one stage: `tile` elements of each of the L sources, as many as fit STAGE bytes.
 * Measured on an H200 (docs/kernels.md), one SM's bulk copies cost about 60 ns each plus
 * 3.6 ns per KiB, whatever the ring's depth, so the stage (hence each copy) is made as large
 * as a two-stage ring allows: 112 KiB stages, 14 KiB copies at L = 8 bf16.
 */
#ifndef TIDE_KERNELS_SUM_TMA_CUH_
#define TIDE_KERNELS_SUM_TMA_CUH_

#include "kernels/launch.h"
#include "kernels/sum_common.cuh"

#include <atomic>

namespace tide_sum {

constexpr int kTmaMaxStages = 16;
constexpr int kTmaBarrierBytes = 2 * kTmaMaxStages * 8; /* full[] then empty[] */
/* Threads of the TMA kernel: its register cap (launch bounds) allows up to 128 per thread. */
constexpr int kTmaMaxThreads = 512;

/* A chunk is `tile` elements of each source: the most that fits STAGE bytes for all L, in
 * multiples of 64 elements (whole 128-byte lines). */
template <typename T, int NS, int STAGE> struct tma_shape {
    static constexpr int raw = STAGE / ((NS + 1) * (int)sizeof(T)) / 64 * 64;
    static constexpr int tile = raw > 65536 ? 65536 : raw;
    static constexpr int row_bytes = tile * (int)sizeof(T);
    static constexpr int stage_bytes = (NS + 1) * row_bytes;
    static constexpr int groups = tile / vec_traits<T>::GE; /* groups per chunk */
    static_assert(tile >= 64, "stage too small");
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    }
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes,
                                         uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
#endif

/* Leading groups of chunk c that are all real rows: those travel by bulk copy. */
template <typename T, int NS, int TG>
__device__ __forceinline__ uint32_t tma_bulk_groups(const seg_view<T, NS> &v, uint64_t c) {
    constexpr int GE = vec_traits<T>::GE;
    if (!v.vec || v.valid <= v.head) return 0;
    const uint64_t full = (v.valid - v.head) / GE; /* groups entirely below valid */
    const uint64_t first = c * TG;
    if (full <= first) return 0;
    return (uint32_t)(full - first < (uint64_t)TG ? full - first : (uint64_t)TG);
}

template <typename T, int NS, int STAGE>
__global__ void __launch_bounds__(kTmaMaxThreads, 1)
    sum_tma_kernel(const tide_sum_args_t a, int stages, int producers) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using shape = tma_shape<T, NS, STAGE>;
    constexpr int GE = vec_traits<T>::GE, TG = shape::groups;
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t full_bar = smem_u32(smem), empty_bar = full_bar + kTmaMaxStages * 8;
    unsigned char *ring = smem + kTmaBarrierBytes;
    const unsigned tid = threadIdx.x, warp = tid / 32, ncons = blockDim.x - 32 * producers;

    if (tid == 0) {
        for (int s = 0; s < stages; ++s) {
            mbar_init(full_bar + 8 * s, 1);
            mbar_init(empty_bar + 8 * s, ncons);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    /* Bulk chunk i of this CTA's walk lives in stage i mod stages, in that stage's use
     * (i / stages), whose parity the barriers' phases follow. */
    uint32_t i = 0;
    chunk_cursor<T, NS> k;
    if (warp < (unsigned)producers) {
        /* Producer warp w: its lane 0 fills the stages of bulk chunks i = w mod producers. */
        if (tid % 32 != 0) return;
#pragma unroll 1
        for (cursor_start(k, a, TG); !k.done; cursor_next(k, a, TG)) {
            const uint32_t nb = tma_bulk_groups<T, NS, TG>(k.v, k.c);
            if (nb == 0) continue;
            if (i++ % (uint32_t)producers != warp) continue;
            const uint32_t stage = (i - 1) % (uint32_t)stages;
            const uint32_t phase = ((i - 1) / (uint32_t)stages) & 1u;
            mbar_wait(empty_bar + 8 * stage, phase ^ 1u);
            const uint32_t row = nb * GE * (uint32_t)sizeof(T);
            const uint32_t bar = full_bar + 8 * stage;
            mbar_arrive_expect_tx(bar, row * (NS + 1));
            const uint32_t dst = smem_u32(ring + (size_t)stage * shape::stage_bytes);
            const uint64_t e0 = k.v.head + k.c * (uint64_t)TG * GE;
#pragma unroll
            for (int j = 0; j < NS; ++j)
                bulk_g2s(dst + j * shape::row_bytes, k.v.stage + (uint64_t)j * k.v.stride + e0, row,
                         bar);
            bulk_g2s(dst + NS * shape::row_bytes, k.v.own + e0, row, bar);
        }
        return;
    }

    /* Consumers. */
    const unsigned ct = tid - 32 * producers;
#pragma unroll 1
    for (cursor_start(k, a, TG); !k.done; cursor_next(k, a, TG)) {
        const seg_view<T, NS> &v = k.v;
        const uint64_t c = k.c;
        const uint32_t nb = tma_bulk_groups<T, NS, TG>(v, c);
        if (nb > 0) {
            const uint32_t stage = i % (uint32_t)stages;
            mbar_wait(full_bar + 8 * stage, (i / (uint32_t)stages) & 1u);
            ++i;
            const unsigned char *st = ring + (size_t)stage * shape::stage_bytes;
#pragma unroll 1
            for (uint32_t g = ct; g < nb; g += ncons) {
                uint4 in[NS + 1];
#pragma unroll
                for (int j = 0; j <= NS; ++j)
                    in[j] = *(const uint4 *)(st + j * shape::row_bytes + g * 16u);
                sum_store<T, NS>(in, v.out + v.head + (c * TG + g) * GE);
            }
            mbar_arrive(empty_bar + 8 * stage);
        }
        /* The rest of the chunk (partial and padding groups, unaligned segments). */
        const uint64_t g_end = (c + 1) * TG < v.groups ? (c + 1) * TG : v.groups;
#pragma unroll 1
        for (uint64_t g = c * TG + nb + ct; g < g_end; g += ncons)
            do_group(v, g);
        if (c == 0 && ct < v.head) do_element(v, ct);
    }
#endif
}

template <typename T, int NS, int STAGE>
cudaError_t launch_tma_stage(const tide_sum_args_t &a, int ctas, int threads, int producers,
                             int smem_bytes, int dev, int optin, cudaStream_t stream) {
    using shape = tma_shape<T, NS, STAGE>;
    int stages = (smem_bytes - kTmaBarrierBytes) / shape::stage_bytes;
    if (stages > kTmaMaxStages) stages = kTmaMaxStages;
    if (stages < 2) return cudaErrorInvalidValue;
    static std::atomic<uint64_t> raised{0};
    cudaError_t err = raise_smem_limit(sum_tma_kernel<T, NS, STAGE>, raised, dev, optin);
    if (err != cudaSuccess) return err;
    const int dyn = kTmaBarrierBytes + stages * shape::stage_bytes;
    sum_tma_kernel<T, NS, STAGE><<<ctas, threads, dyn, stream>>>(a, stages, producers);
    return cudaGetLastError();
}

template <typename T, int NS>
cudaError_t launch_tma(const tide_sum_args_t &a, int ctas, int threads, int producers,
                       int smem_bytes, int stage_bytes, int dev, int optin, cudaStream_t stream) {
    if (threads == 0) threads = TIDE_SUM_TMA_THREADS;
    if (producers == 0) producers = 1;
    if (producers > 2 || threads < 32 * producers + 32 || threads > kTmaMaxThreads)
        return cudaErrorInvalidValue;
    if (smem_bytes == 0) smem_bytes = TIDE_SUM_TMA_SMEM;
    if (smem_bytes > optin) smem_bytes = optin;
#define TIDE_TMA_CASE(S)                                                                           \
    case S:                                                                                        \
        return launch_tma_stage<T, NS, S>(a, ctas, threads, producers, smem_bytes, dev, optin,     \
                                          stream)
    if (stage_bytes == 0) {
        /* The default stage, or the largest smaller one of which the ring holds two. */
        stage_bytes = TIDE_SUM_TMA_STAGE;
        while (stage_bytes > 16384 && 2 * stage_bytes + kTmaBarrierBytes > smem_bytes)
            stage_bytes = stage_bytes > 65536 ? 65536 : stage_bytes / 2;
    }
    switch (stage_bytes) {
        TIDE_TMA_CASE(16384);
        TIDE_TMA_CASE(32768);
        TIDE_TMA_CASE(65536);
        TIDE_TMA_CASE(73728);
        TIDE_TMA_CASE(114688);
    default:
        return cudaErrorInvalidValue;
    }
#undef TIDE_TMA_CASE
}

} // namespace tide_sum

#endif /* TIDE_KERNELS_SUM_TMA_CUH_ */
