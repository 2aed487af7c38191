/*
 * sum_tma.cuh - the warp-specialised Level-1 sum (sm_90): bulk copies into a shared ring.
 *
 * The first `producers` warps are producers: lane 0 of producer warp w walks the CTA's chunks
 * and copies sources w, w + producers, ... of each chunk (staged contributions, then own) into
 * one stage of a shared-memory ring with cp.async.bulk, completing on the stage's "full"
 * mbarrier with a byte count.  The other warps are consumers: they wait on "full", sum from
 * shared memory in the contract's order, store fp32 to global memory and, after a proxy fence,
 * arrive on the stage's "empty" mbarrier (one arrival per thread), which the producers wait on
 * before refilling the stage (the ordering argument: docs/kernels.md, "Stage release and
 * racecheck").  The loads in flight are the ring's, not registers'.  Heads, partial groups, padding
 * and unaligned segments are summed by the consumers from global memory (sum_common.cuh).
 *
 * A chunk is one stage: `tile` elements of each of the L sources, as many as fit STAGE bytes.
 * Measured on an H200 (docs/kernels.md):
 *   - a bulk copy holds its issuing thread for a while, so one producer warp caps the copy rate
 *     (about 147 GB/s per CTA with stages released unread) and two reach about 226; the stage
 *     is as large as a two-stage ring allows (112 KiB, 14 KiB copies at L = 8 bf16);
 *   - the consumers then set the pace: each thread sums units of four elements (8-byte shared
 *     loads, one 16-byte store, so a warp stores 512 contiguous bytes) and stores the adds'
 *     results without the canonical-NaN select, which the GPU's fp32 add makes redundant.
 */
#ifndef TIDE_KERNELS_SUM_TMA_CUH_
#define TIDE_KERNELS_SUM_TMA_CUH_

#include "kernels/launch.h"
#include "kernels/mbarrier.cuh"
#include "kernels/sum_common.cuh"

#include <atomic>

namespace tide_sum {

constexpr int kTmaMaxStages = 16;
constexpr int kTmaBarrierBytes = 2 * kTmaMaxStages * 8; /* full[] then empty[] */
/* Threads of the TMA kernel (its launch bounds: at most 80 registers a thread).  The public
 * launcher takes at most kTmaPublicThreads and kTmaPublicProducers (launch.h); the internal
 * options (tma_opts, used by tests/gpu/bench_kernels) reach the kernel's limits.
 *
 * Two build-time knobs exist for measurement only (tests/gpu/sum_variants.sh builds
 * bench_kernels with them): TIDE_TMA_MAX_THREADS lowers the launch bound, which raises the
 * register budget a thread (512: 128 registers), and TIDE_TMA_UNITS sets how many units a
 * consumer thread loads before its first add (default: 16 bytes of each source, two bf16
 * units).  The library is built with the defaults. */
#ifndef TIDE_TMA_MAX_THREADS
#define TIDE_TMA_MAX_THREADS 768
#endif
#ifndef TIDE_TMA_UNITS
#define TIDE_TMA_UNITS 0
#endif
constexpr int kTmaMaxThreads = TIDE_TMA_MAX_THREADS;
constexpr int kTmaMaxProducers = 8;
constexpr int kTmaPublicThreads = 512;
constexpr int kTmaPublicProducers = 2;
/* With neither threads nor producers given: two producer warps and eight consumer warps, the
 * fastest pair measured on an H200 (docs/kernels.md).  One given alone keeps launch.h's
 * defaults for the other (TIDE_SUM_TMA_THREADS, one producer). */
constexpr int kTmaAutoProducers = 2;
constexpr int kTmaAutoThreads = 320;

/* How consumers read a stage. */
enum tma_consume_t {
    TMA_CONSUME_UNITS = 0,  /* four elements a thread, one 16-byte store */
    TMA_CONSUME_GROUPS = 1, /* the first version: one 16-byte group of each source a thread
                               (two 16-byte stores 32 bytes apart for bf16); kept for
                               comparison */
    TMA_CONSUME_NONE = 2,   /* measurement only: stages released unread, nothing stored for
                               the bulk part (the copy engine's rate alone) */
    TMA_CONSUME_NOCOPY = 3, /* measurement only: the producers copy nothing and only arrive,
                               the consumers sum whatever the stage holds (their rate alone;
                               the output is not the sum) */
    TMA_CONSUME_COUNT = 4
};

/* Launch options of the TMA sum: tide_sum_launch_t's fields plus the internal ones. */
struct tma_opts {
    int ctas;
    int threads;     /* 0 = TIDE_SUM_TMA_THREADS */
    int producers;   /* 0 = 1 */
    int smem_bytes;  /* 0 = TIDE_SUM_TMA_SMEM */
    int stage_bytes; /* 0 = TIDE_SUM_TMA_STAGE or the largest that fits twice */
    int consume;     /* tma_consume_t */
    int raw_nan;     /* 1: with L >= 2, store the adds' results without the canonical-NaN
                        select: the GPU's fp32 add already returns the canonical NaN */
};

/* The TMA sum with internal options, for measurements (defined in sum.cu): any dtype and L,
 * on sm_90+. */
cudaError_t launch_tma_opts(const tide_sum_args_t &a, const tma_opts &o, cudaStream_t stream);

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

/* smem_u32, mbar_*, fence_proxy_async_smem, bulk_g2s: kernels/mbarrier.cuh. */

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

/* Element e of source j of a segment: the staged contributions in order, then own. */
template <typename T, int NS>
__device__ __forceinline__ const T *source_at(const seg_view<T, NS> &v, uint32_t j, uint64_t e) {
    /* A select over the unrolled sources: a run-time index would put v.src in local memory. */
    const T *p = v.own;
#pragma unroll
    for (int k = 0; k < NS; ++k)
        if ((int)j == k) p = v.src[k];
    return p + e;
}

/* Per-launch parameters of the kernel (tma_opts after validation). */
struct tma_params {
    int stages;    /* ring depth */
    int producers; /* producer warps */
    int consume;   /* tma_consume_t */
    int raw_nan;   /* store the adds' results as they are (see tma_opts) */
};

/*
 * Consumer thread `ct` of `ncons`: units u = ct, ct + ncons, ... of a stage holding `nu` units,
 * two units a thread per step for bf16 (2 x L 8-byte loads in flight), one for fp32.
 */
template <typename T, int NS, int ROW, bool RAW>
__device__ __forceinline__ void consume_units(const unsigned char *st, uint32_t nu, float *o,
                                              unsigned ct, unsigned ncons, const epi_t &ep) {
    using V = typename unit_traits<T>::V;
    constexpr int UB = (int)sizeof(V), U = TIDE_TMA_UNITS > 0 ? TIDE_TMA_UNITS : 16 / UB;
    uint32_t u = ct;
#pragma unroll 1
    for (; u + (U - 1) * ncons < nu; u += U * ncons) {
        V x[U][NS + 1];
#pragma unroll
        for (int r = 0; r < U; ++r)
#pragma unroll
            for (int j = 0; j <= NS; ++j)
                x[r][j] = *(const V *)(st + j * ROW + (u + r * ncons) * UB);
#pragma unroll
        for (int r = 0; r < U; ++r)
            sum_store_unit<T, NS, RAW>(x[r], o + (size_t)(u + r * ncons) * 4, ep);
    }
#pragma unroll 1
    for (; U > 1 && u < nu; u += ncons) { /* at most U - 1 units left */
        V x[NS + 1];
#pragma unroll
        for (int j = 0; j <= NS; ++j)
            x[j] = *(const V *)(st + j * ROW + u * UB);
        sum_store_unit<T, NS, RAW>(x, o + (size_t)u * 4, ep);
    }
}

template <typename T, int NS, int STAGE>
__global__ void __launch_bounds__(kTmaMaxThreads, 1)
    sum_tma_kernel(const tide_sum_args_t a, const tma_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using shape = tma_shape<T, NS, STAGE>;
    constexpr int GE = vec_traits<T>::GE, TG = shape::groups, L = NS + 1;
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t full_bar = smem_u32(smem), empty_bar = full_bar + kTmaMaxStages * 8;
    unsigned char *ring = smem + kTmaBarrierBytes;
    const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const unsigned nprod = (unsigned)p.producers, ncons = blockDim.x - 32 * nprod;
    /* Producer warps that own at least one source: they arrive on "full", one each. */
    const unsigned issuing = nprod < (unsigned)L ? nprod : (unsigned)L;
    /* "empty" counts one arrival per consumer thread: each thread releases its own reads.  One
     * arrival per warp after __syncwarp is as valid under the memory model, but racecheck does
     * not take the warp barrier as ordering the other lanes' reads and reports every stage
     * (tests/gpu/racecheck_min: modes `warp` and `kernel`; docs/kernels.md). */
    const bool groups = p.consume == TMA_CONSUME_GROUPS;
    const uint32_t stages = (uint32_t)p.stages;

    if (tid == 0) {
        for (uint32_t s = 0; s < stages; ++s) {
            mbar_init(full_bar + 8 * s, issuing);
            mbar_init(empty_bar + 8 * s, ncons);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    /* Bulk chunk i of this CTA's walk lives in stage i mod stages, in that stage's use
     * (i / stages), whose parity the barriers' phases follow. */
    uint32_t i = 0;
    chunk_cursor<T, NS> k;
    if (warp < nprod) {
        /* Producer warp w: its lane 0 copies sources j = w, w + nprod, ... of every bulk chunk.
         * A bulk copy holds its issuing thread for a while, so several warps issue in parallel;
         * the copies are unrolled over the L sources with compile-time shared-memory offsets,
         * each predicated on this warp's bit in `mask`. */
        if (lane != 0 || warp >= issuing) return;
        uint32_t mask = 0, mine = 0;
#pragma unroll
        for (int j = 0; j < L; ++j)
            if ((uint32_t)j % nprod == warp) {
                mask |= 1u << j;
                ++mine;
            }
#pragma unroll 1
        for (cursor_start(k, a, TG); !k.done; cursor_next(k, a, TG)) {
            const uint32_t nb = tma_bulk_groups<T, NS, TG>(k.v, k.c);
            if (nb == 0) continue;
            const uint32_t stage = i % stages, phase = (i / stages) & 1u;
            ++i;
            mbar_wait(empty_bar + 8 * stage, phase ^ 1u);
            const uint32_t row = nb * GE * (uint32_t)sizeof(T);
            const uint32_t bar = full_bar + 8 * stage;
            /* Byte count first, copies, then the arrival: the phase cannot complete before this
             * warp arrives (its arrival is pending), and the arrival, a release, follows the
             * copies in program order, so the consumers' acquire of "full" is ordered after
             * both the issue and (by complete_tx) the landing of every byte of the stage. */
            if (p.consume != TMA_CONSUME_NOCOPY) {
                mbar_expect_tx(bar, row * mine);
                const uint32_t dst = smem_u32(ring + (size_t)stage * shape::stage_bytes);
                const uint64_t e0 = k.v.head + k.c * (uint64_t)TG * GE;
#pragma unroll
                for (int j = 0; j < NS; ++j)
                    if (mask & (1u << j))
                        bulk_g2s(dst + j * shape::row_bytes, k.v.src[j] + e0, row, bar);
                if (mask & (1u << NS))
                    bulk_g2s(dst + NS * shape::row_bytes, k.v.own + e0, row, bar);
            }
            mbar_arrive(bar);
        }
        return;
    }

    /* Consumers. */
    const unsigned ct = tid - 32 * nprod;
#pragma unroll 1
    for (cursor_start(k, a, TG); !k.done; cursor_next(k, a, TG)) {
        const seg_view<T, NS> &v = k.v;
        const uint64_t c = k.c;
        const uint32_t nb = tma_bulk_groups<T, NS, TG>(v, c);
        if (nb > 0) {
            const uint32_t stage = i % stages;
            mbar_wait(full_bar + 8 * stage, (i / stages) & 1u);
            ++i;
            const unsigned char *st = ring + (size_t)stage * shape::stage_bytes;
            float *o = v.out + v.head + c * TG * GE;
            if (p.consume == TMA_CONSUME_UNITS || p.consume == TMA_CONSUME_NOCOPY) {
                if (p.raw_nan)
                    consume_units<T, NS, shape::row_bytes, true>(st, nb * (GE / 4), o, ct, ncons,
                                                                 v.ep);
                else
                    consume_units<T, NS, shape::row_bytes, false>(st, nb * (GE / 4), o, ct, ncons,
                                                                  v.ep);
            } else if (groups) {
#pragma unroll 1
                for (uint32_t g = ct; g < nb; g += ncons) {
                    uint4 in[NS + 1];
#pragma unroll
                    for (int j = 0; j <= NS; ++j)
                        in[j] = *(const uint4 *)(st + j * shape::row_bytes + g * 16u);
                    sum_store<T, NS>(in, o + (size_t)g * GE, v.ep);
                }
            }
            /* Release the stage.  Each thread's reads of it are generic-proxy loads and the
             * refill is an async-proxy write: the proxy fence orders the two (docs/kernels.md,
             * "Stage release and racecheck"), then the arrival (a release) publishes the
             * reads to the producer's acquire of "empty". */
            fence_proxy_async_smem();
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
cudaError_t launch_tma_stage(const tide_sum_args_t &a, const tma_opts &o, int dev, int optin,
                             cudaStream_t stream) {
    using shape = tma_shape<T, NS, STAGE>;
    int stages = (o.smem_bytes - kTmaBarrierBytes) / shape::stage_bytes;
    if (stages > kTmaMaxStages) stages = kTmaMaxStages;
    if (stages < 2) return cudaErrorInvalidValue;
    static std::atomic<uint64_t> raised{0};
    cudaError_t err = raise_smem_limit(sum_tma_kernel<T, NS, STAGE>, raised, dev, optin);
    if (err != cudaSuccess) return err;
    const int dyn = kTmaBarrierBytes + stages * shape::stage_bytes;
    const tma_params p = {stages, o.producers, o.consume, o.raw_nan};
    sum_tma_kernel<T, NS, STAGE><<<o.ctas, o.threads, dyn, stream>>>(a, p);
    return cudaGetLastError();
}

/* Fill in defaults and check the options; then launch with the stage size chosen. */
template <typename T, int NS>
cudaError_t launch_tma(const tide_sum_args_t &a, tma_opts o, int dev, int optin,
                       cudaStream_t stream) {
    if (o.threads == 0 && o.producers == 0) {
        o.threads = kTmaAutoThreads;
        o.producers = kTmaAutoProducers;
    }
    if (o.threads == 0) o.threads = TIDE_SUM_TMA_THREADS;
    if (o.producers == 0) o.producers = 1;
    if (o.ctas < 1 || o.producers < 1 || o.producers > kTmaMaxProducers || o.threads % 32 != 0 ||
        o.threads < 32 * o.producers + 32 || o.threads > kTmaMaxThreads || o.consume < 0 ||
        o.consume >= TMA_CONSUME_COUNT || o.raw_nan < 0 || o.raw_nan > 1 || o.smem_bytes < 0 ||
        o.stage_bytes < 0)
        return cudaErrorInvalidValue;
    if (o.smem_bytes == 0) o.smem_bytes = TIDE_SUM_TMA_SMEM;
    if (o.smem_bytes > optin) o.smem_bytes = optin;
#define TIDE_TMA_CASE(S)                                                                           \
    case S:                                                                                        \
        return launch_tma_stage<T, NS, S>(a, o, dev, optin, stream)
    if (o.stage_bytes == 0) {
        /* The default stage, or the largest smaller one of which the ring holds two. */
        o.stage_bytes = TIDE_SUM_TMA_STAGE;
        while (o.stage_bytes > 16384 && 2 * o.stage_bytes + kTmaBarrierBytes > o.smem_bytes)
            o.stage_bytes = o.stage_bytes > 65536 ? 65536 : o.stage_bytes / 2;
    }
    switch (o.stage_bytes) {
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
