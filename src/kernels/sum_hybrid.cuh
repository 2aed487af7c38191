/*
 * sum_hybrid.cuh - the PLAIN2 and HYBRID Level-1 sums: more loads in flight than PLAIN
 * (sum.cu) without sending every byte through shared memory as the TMA sum (sum_tma.cuh) does.
 *
 *   PLAIN2  PLAIN with U groups a thread per chunk: all U * L 16-byte loads are issued before
 *           the first add (launched from sum_plain2.cu).
 *   HYBRID  (sm_90) producer warps bulk-copy the first R sources of each chunk
 *           (staged[0..R-1]) into a ring of shared-memory stages, as the TMA sum does; each
 *           consumer thread loads the other D = L - R sources (staged[R..L-2], own) of its U
 *           groups straight from global memory into registers, issues those loads before it
 *           waits on the stage's "full" mbarrier, then reads staged[0..R-1] from the stage and
 *           adds in the contract's order (staged[0], ..., staged[L-2], own) whichever path
 *           each source took.  The bulk-copied part stays in flight in the ring while the
 *           consumers add, the direct part in registers; only R of the L sources cross shared
 *           memory (written by the copy engine, read back by the consumers) against all L in
 *           the TMA sum.
 *
 * Both keep sum_common.cuh's decomposition (chunks dealt round-robin, no CTA waits for another)
 * and its order of adds.  A chunk is U groups per consumer thread: thread ct handles groups
 * q = u * consumers + ct (u < U), so a warp's 16-byte loads, global or shared, cover 512
 * contiguous bytes.  Groups that are not whole vectors of real rows (partial, padding,
 * unaligned segments) and heads take the common global-memory paths.  With L >= 2 the last
 * add's result is stored as it is (the GPU's fp32 add already returns the canonical NaN).
 *
 * Not kept: rotating U register sets, each refilled with the next chunk's loads as soon as it
 * is summed.  ptxas put every such load on one scoreboard, so summing any set waited for all
 * loads in flight, the ones just issued included (docs/kernels.md).
 */
#ifndef TIDE_KERNELS_SUM_HYBRID_CUH_
#define TIDE_KERNELS_SUM_HYBRID_CUH_

#include "kernels/launch.h"
#include "kernels/sum_common.cuh"
#include "kernels/sum_tma.cuh"

namespace tide_sum {

/*
 * Threads of a CTA per groups-per-thread U.  PLAIN2: U * L 16-byte vectors live in a thread's
 * registers (32 * U at L = 8), so the register file bounds U * threads.  Each of the SM's four
 * schedulers owns a quarter of the registers and of the warps (rounded up): 16 warps leave a
 * thread 128 registers, 17 to 20 warps about 96, too few for HYBRID's bf16 kernels with five
 * or six direct sources (ptxas spilled them).  HYBRID counts its producer warps: U = 2, 16
 * warps; U = 4, 10 warps (168 registers).
 */
template <int U> struct split_limits {
    static constexpr int plain2 = U == 2 ? 512 : U == 3 ? 384 : 256;
    static constexpr int hybrid = U == 2 ? 512 : 320;
};
constexpr int kHybridMaxDirect = 6;    /* D = L - R: direct sources of a consumer thread */
constexpr int kHybridMaxProducers = 2; /* producer warps of HYBRID */

/* HYBRID's launch options (tide_sum_launch_t's fields it uses). */
struct hybrid_opts {
    int ctas;
    int threads;    /* producer warps included; 0 = the default */
    int groups;     /* U = 2 or 4; 0 = 2 */
    int bulk;       /* R: sources 0 .. R-1 bulk-copied, 1 .. L-1 with L - R <= 6; 0 = default */
    int producers;  /* 1 or 2; 0 = 1 */
    int smem_bytes; /* ring budget; 0 = TIDE_SUM_TMA_SMEM, capped at the opt-in maximum */
};

/* PLAIN2 with U = groups (0 = 2; 2, 3 or 4) and threads (0 = split_limits<U>::plain2, the
 * most), any dtype and L (sum_plain2.cu). */
cudaError_t launch_plain2(const tide_sum_args_t &a, int ctas, int threads, int groups,
                          cudaStream_t stream);
/* HYBRID on sm_90+ (sum_hybrid.cu); L = 1 has no staged source and runs PLAIN2. */
cudaError_t launch_hybrid(const tide_sum_args_t &a, const hybrid_opts &o, int dev, int optin,
                          cudaStream_t stream);

/* Per-launch parameters of the HYBRID kernel. */
struct hybrid_params {
    int stages;           /* ring depth */
    int producers;        /* producer warps */
    uint32_t stage_bytes; /* R tiles of U * consumers groups */
};

template <typename T, int NS, int D, int U>
__global__ void __launch_bounds__(split_limits<U>::hybrid, 1)
    sum_hybrid_kernel(const tide_sum_args_t a, const hybrid_params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int GE = vec_traits<T>::GE, R = NS + 1 - D;
    static_assert(D >= 1 && R >= 1, "HYBRID needs a source of each kind");
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t full_bar = smem_u32(smem), empty_bar = full_bar + kTmaMaxStages * 8;
    const unsigned char *ring = smem + kTmaBarrierBytes;
    const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const unsigned nprod = (unsigned)p.producers, ncons = blockDim.x - 32 * nprod;
    const uint32_t tg = U * ncons;  /* groups per chunk */
    const uint32_t row = tg * 16u;  /* bytes of one source's tile in a stage */
    const uint32_t stages = (uint32_t)p.stages;
    /* Producer warps that own at least one source arrive on "full", one each; every consumer
     * thread arrives on "empty" once it has read the stage (as in sum_tma.cuh, for racecheck). */
    const unsigned issuing = nprod < (unsigned)R ? nprod : (unsigned)R;
    if (tid == 0) {
        for (uint32_t s = 0; s < stages; ++s) {
            mbar_init(full_bar + 8 * s, issuing);
            mbar_init(empty_bar + 8 * s, ncons);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    /* Bulk chunk i of the CTA's walk (a chunk with whole groups) lives in stage i mod stages,
     * in that stage's use i / stages, whose parity the barriers' phases follow. */
    chunk_cursor<T, NS> k;
    uint32_t i = 0;
    if (warp < nprod) {
        /* Lane 0 of producer warp w copies sources j = w, w + nprod, ... (j < R). */
        if (lane != 0 || warp >= issuing) return;
        uint32_t mask = 0, mine = 0;
#pragma unroll
        for (int j = 0; j < R; ++j)
            if ((uint32_t)j % nprod == warp) {
                mask |= 1u << j;
                ++mine;
            }
#pragma unroll 1
        for (cursor_start(k, a, tg); !k.done; cursor_next(k, a, tg)) {
            const uint32_t nb = full_groups(k.v, k.c, tg);
            if (nb == 0) continue;
            const uint32_t stage = i % stages, phase = (i / stages) & 1u;
            ++i;
            mbar_wait(empty_bar + 8 * stage, phase ^ 1u);
            const uint32_t bytes = nb * 16u, bar = full_bar + 8 * stage;
            /* As the TMA sum: byte count, copies, then the arrival (sum_tma.cuh). */
            mbar_expect_tx(bar, bytes * mine);
            const uint32_t dst = smem_u32(ring) + stage * p.stage_bytes;
            const uint64_t e0 = k.v.head + k.c * (uint64_t)tg * GE;
#pragma unroll
            for (int j = 0; j < R; ++j)
                if (mask & (1u << j))
                    bulk_g2s(dst + j * row, k.v.src[j] + e0, bytes, bar);
            mbar_arrive(bar);
        }
        return;
    }

    /* Consumers. */
    const unsigned ct = tid - 32 * nprod;
#pragma unroll 1
    for (cursor_start(k, a, tg); !k.done; cursor_next(k, a, tg)) {
        const seg_view<T, NS> &v = k.v;
        const uint64_t g0 = k.c * tg;
        const uint32_t nb = full_groups(v, k.c, tg);
        if (nb > 0) {
            /* The direct sources first: their loads fly while this thread waits for the
             * stage and adds the bulk-copied sources, which come first in the order. */
            uint4 dir[U][D];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const uint32_t q = u * ncons + ct;
                if (q < nb) load_sources<T, NS, R, D>(v, v.head + (g0 + q) * GE, dir[u]);
            }
            const uint32_t stage = i % stages;
            mbar_wait(full_bar + 8 * stage, (i / stages) & 1u);
            ++i;
            const unsigned char *st = ring + (size_t)stage * p.stage_bytes;
            float *o = v.out + v.head + g0 * GE;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const uint32_t q = u * ncons + ct;
                if (q < nb) {
                    uint4 x[NS + 1];
#pragma unroll
                    for (int j = 0; j < R; ++j)
                        x[j] = *(const uint4 *)(st + j * row + q * 16u);
#pragma unroll
                    for (int j = 0; j < D; ++j)
                        x[R + j] = dir[u][j];
                    sum_store<T, NS, true>(x, o + (size_t)q * GE, v.ep);
                }
            }
            /* The proxy fence orders this thread's generic reads of the stage before the
             * async-proxy refill; the arrival (a release) publishes them (sum_tma.cuh). */
            fence_proxy_async_smem();
            mbar_arrive(empty_bar + 8 * stage);
        }
        /* The rest of the chunk: partial and padding groups, unaligned segments, the head. */
        const uint64_t g_end = g0 + tg < v.groups ? g0 + tg : v.groups;
#pragma unroll 1
        for (uint64_t g = g0 + nb + ct; g < g_end; g += ncons)
            do_group(v, g);
        if (k.c == 0 && ct < v.head) do_element(v, ct);
    }
#endif
}

/* Launch the HYBRID kernel once the options are checked. */
template <typename T, int NS, int D, int U>
cudaError_t launch_hybrid_kernel(const tide_sum_args_t &a, const hybrid_opts &o, int dev,
                                 int optin, cudaStream_t stream) {
    constexpr int R = NS + 1 - D;
    const int ncons = o.threads - 32 * o.producers;
    if (ncons < 32 || o.threads > split_limits<U>::hybrid) return cudaErrorInvalidValue;
    hybrid_params p = {0, o.producers, (uint32_t)(R * U * ncons * 16)};
    int stages = (o.smem_bytes - kTmaBarrierBytes) / (int)p.stage_bytes;
    if (stages > kTmaMaxStages) stages = kTmaMaxStages;
    if (stages < 2) return cudaErrorInvalidValue; /* the ring holds two stages at least */
    p.stages = stages;
    static std::atomic<uint64_t> raised{0};
    cudaError_t err = raise_smem_limit(sum_hybrid_kernel<T, NS, D, U>, raised, dev, optin);
    if (err != cudaSuccess) return err;
    const size_t dyn = kTmaBarrierBytes + (size_t)stages * p.stage_bytes;
    sum_hybrid_kernel<T, NS, D, U><<<o.ctas, o.threads, dyn, stream>>>(a, p);
    return cudaGetLastError();
}

} // namespace tide_sum

#endif /* TIDE_KERNELS_SUM_HYBRID_CUH_ */
