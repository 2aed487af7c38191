/*
 * racecheck_min.cu - the TMA sum's shared-memory ring alone, for compute-sanitizer racecheck.
 *
 * One kernel with the protocol of sum_tma_kernel (src/kernels/sum_tma.cuh) and nothing else:
 * two producer warps bulk-copy 8 rows of 14 KiB (one 112 KiB stage) into a ring of two stages,
 * completing on the stage's "full" mbarrier by byte count; eight consumer warps wait on "full",
 * read the stage with 8-byte shared loads, store column sums and release the stage on its
 * "empty" mbarrier, which the producers wait on before the refill.  The modes differ only in
 * how the stage is filled and released:
 *
 *   kernel   the TMA sum as it is: expect_tx, copies, arrive (producer); each consumer thread
 *            fence.proxy.async, then arrives on "empty" (one arrival per consumer thread)
 *   warp     the TMA sum's previous release: fence.proxy.async, __syncwarp, lane 0 arrives (one
 *            arrival per warp)
 *   old      the first TMA sum: arrive.expect_tx, then the copies; no proxy fence; warp release
 *   generic  the same barriers, but the producer warps fill the stage with ordinary 16-byte
 *            loads and st.shared (generic proxy) and every producer thread arrives on "full";
 *            the consumers release as in kernel (so only the async proxy differs)
 *   generic_warp  generic, with the consumers' release of `warp`: whether the tool reads the
 *            warp barrier as ordering, without any async-proxy operation in the kernel
 *   racy     kernel, but consumers release the stage *before* reading it: a real
 *            write-after-read race that racecheck must report (the control)
 *
 * Every mode but racy checks its sums against the host.  Exit status: 0 when the sums match
 * (racy: when it ran), 1 on a mismatch, 2 on a CUDA error.  Under racecheck, `racy` must fail
 * with the tool's error exit code and `generic` must pass (the controls); `kernel` must pass
 * too; `warp`, `generic_warp` and `old` are recorded (docs/kernels.md, "Stage release and
 * racecheck").
 *
 * Usage: racecheck_min MODE [ctas [chunks_per_cta [launches]]]   (defaults 4 12 3)
 */
#include "cuda_ok.h"
#include "kernels/mbarrier.cuh"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kRows = 8, kRow = 14336, kStage = kRows * kRow, kStages = 2;
constexpr int kProducers = 2, kThreads = 320, kBarrierBytes = 128;
constexpr int kUnits = kRow / 8; /* 8-byte units (4 bf16) per row */

enum ring_mode { M_KERNEL, M_WARP, M_OLD, M_GENERIC, M_GENERIC_WARP, M_RACY, M_COUNT };
const char *const kModeName[M_COUNT] = {"kernel", "warp", "old", "generic", "generic_warp",
                                        "racy"};

/* Modes whose consumers release a stage with one arrival per warp after __syncwarp. */
__host__ __device__ constexpr bool warp_release(int mode) {
    return mode == M_WARP || mode == M_OLD || mode == M_GENERIC_WARP;
}
__host__ __device__ constexpr bool generic_fill(int mode) {
    return mode == M_GENERIC || mode == M_GENERIC_WARP;
}

/* The kernels' own barrier and bulk-copy instructions (kernels/mbarrier.cuh); only the two
 * that no kernel issues any more are defined here. */
using tide_sum::smem_u32;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
using tide_sum::bulk_g2s;
using tide_sum::fence_proxy_async_smem;
using tide_sum::mbar_arrive;
using tide_sum::mbar_expect_tx;
using tide_sum::mbar_init;
using tide_sum::mbar_wait;

/* The first TMA sum's producer arrival (mode old): arrive and raise the byte count at once. */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
/* __syncwarp as the TMA sum's SASS had it (WARPSYNC.ALL): ptxas drops a plain __syncwarp in
 * this kernel's converged code, and the question is racecheck's reading of that instruction. */
__device__ __forceinline__ void warp_sync() {
    asm volatile("bar.warp.sync -1;" ::: "memory");
}
#endif

/* Chunk c of CTA b is global chunk c * grid + b: 8 rows of kRow bytes in, kRow / 2 sums out. */
__global__ void __launch_bounds__(kThreads, 1)
    ring_kernel(const unsigned char *src, uint32_t *out, int chunks, int mode) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t full_bar = smem_u32(smem), empty_bar = full_bar + kStages * 8;
    unsigned char *ring = smem + kBarrierBytes;
    const unsigned tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const unsigned ncons = blockDim.x - 32 * kProducers;
    if (tid == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(full_bar + 8 * s, generic_fill(mode) ? 32 * kProducers : kProducers);
            mbar_init(empty_bar + 8 * s, warp_release(mode) ? ncons / 32 : ncons);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp < kProducers) {
        if (!generic_fill(mode) && lane != 0) return;
        for (int c = 0; c < chunks; ++c) {
            const uint32_t s = c % kStages, phase = (c / kStages) & 1u;
            mbar_wait(empty_bar + 8 * s, phase ^ 1u);
            const unsigned char *g = src + ((size_t)c * gridDim.x + blockIdx.x) * kStage;
            const uint32_t bar = full_bar + 8 * s, dst = smem_u32(ring + s * kStage);
            if (generic_fill(mode)) {
                for (int j = warp; j < kRows; j += kProducers)
                    for (int q = lane; q < kRow / 16; q += 32)
                        *(uint4 *)(ring + s * kStage + j * kRow + q * 16) =
                            *(const uint4 *)(g + j * kRow + q * 16);
                mbar_arrive(bar); /* every writing thread: a direct dependency */
                continue;
            }
            const uint32_t bytes = kRow * (kRows / kProducers);
            if (mode == M_OLD)
                mbar_arrive_expect_tx(bar, bytes);
            else
                mbar_expect_tx(bar, bytes);
            for (int j = warp; j < kRows; j += kProducers)
                bulk_g2s(dst + j * kRow, g + j * kRow, kRow, bar);
            if (mode != M_OLD) mbar_arrive(bar);
        }
        return;
    }

    const unsigned ct = tid - 32 * kProducers;
    for (int c = 0; c < chunks; ++c) {
        const uint32_t s = c % kStages;
        mbar_wait(full_bar + 8 * s, (c / kStages) & 1u);
        if (mode == M_RACY) /* released before it is read: the producer may refill it */
            mbar_arrive(empty_bar + 8 * s);
        const unsigned char *st = ring + s * kStage;
        uint32_t *o = out + ((size_t)c * gridDim.x + blockIdx.x) * (kRow / 2);
        for (uint32_t u = ct; u < (uint32_t)kUnits; u += ncons) {
            uint2 x[kRows];
#pragma unroll
            for (int j = 0; j < kRows; ++j)
                x[j] = *(const uint2 *)(st + j * kRow + u * 8);
            uint4 r = {0, 0, 0, 0};
#pragma unroll
            for (int j = 0; j < kRows; ++j) {
                r.x += x[j].x & 0xffffu;
                r.y += x[j].x >> 16;
                r.z += x[j].y & 0xffffu;
                r.w += x[j].y >> 16;
            }
            *(uint4 *)(o + u * 4) = r;
        }
        if (mode == M_RACY) continue;
        if (mode != M_OLD) fence_proxy_async_smem();
        if (warp_release(mode)) {
            warp_sync();
            if (lane == 0) mbar_arrive(empty_bar + 8 * s);
        } else {
            mbar_arrive(empty_bar + 8 * s);
        }
    }
#endif
}

} // namespace

int main(int argc, char **argv) {
    int mode = -1;
    for (int m = 0; argc > 1 && m < M_COUNT; ++m)
        if (std::strcmp(argv[1], kModeName[m]) == 0) mode = m;
    if (mode < 0) {
        std::fprintf(stderr, "usage: racecheck_min kernel|warp|old|generic|generic_warp|racy "
                             "[ctas [chunks_per_cta [launches]]]\n");
        return 2;
    }
    const int ctas = argc > 2 ? std::atoi(argv[2]) : 4;
    const int chunks = argc > 3 ? std::atoi(argv[3]) : 12;
    const int launches = argc > 4 ? std::atoi(argv[4]) : 3;
    if (ctas < 1 || chunks < 1 || launches < 1) return 2;
    int major = 0;
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major < 9) {
        std::fprintf(stderr, "racecheck_min: needs sm_90 (cp.async.bulk, mbarrier tx counts)\n");
        return 2;
    }
    const size_t nchunk = (size_t)ctas * chunks;
    std::vector<uint16_t> h_src(nchunk * kStage / 2);
    uint64_t z = 0x2545f4914f6cdd1dull;
    for (uint16_t &v : h_src) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        v = (uint16_t)(z >> 24);
    }
    std::vector<uint32_t> want(nchunk * (kRow / 2)), got(want.size());
    for (size_t g = 0; g < nchunk; ++g)
        for (int e = 0; e < kRow / 2; ++e) {
            uint32_t s = 0;
            for (int j = 0; j < kRows; ++j) s += h_src[g * (kStage / 2) + j * (kRow / 2) + e];
            want[g * (kRow / 2) + e] = s;
        }
    unsigned char *d_src;
    uint32_t *d_out;
    CUDA_OK(cudaMalloc(&d_src, h_src.size() * 2));
    CUDA_OK(cudaMalloc(&d_out, want.size() * 4));
    CUDA_OK(cudaMemcpy(d_src, h_src.data(), h_src.size() * 2, cudaMemcpyHostToDevice));
    const int dyn = kBarrierBytes + kStages * kStage;
    CUDA_OK(cudaFuncSetAttribute(ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn));
    int bad = 0;
    for (int l = 0; l < launches; ++l) {
        CUDA_OK(cudaMemset(d_out, 0xff, want.size() * 4));
        ring_kernel<<<ctas, kThreads, dyn>>>(d_src, d_out, chunks, mode);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost));
        if (std::memcmp(got.data(), want.data(), got.size() * 4) != 0) ++bad;
    }
    CUDA_OK(cudaFree(d_src));
    CUDA_OK(cudaFree(d_out));
    const bool check = mode != M_RACY;
    std::printf("%s racecheck_min mode=%s ctas=%d chunks=%d launches=%d: %d of %d launches %s\n",
                check && bad ? "FAIL" : "PASS", kModeName[mode], ctas, chunks, launches,
                check ? bad : 0, launches,
                check ? "wrong" : "not checked (racy by design)");
    return check && bad ? 1 : 0;
}
