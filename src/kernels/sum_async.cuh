/*
 * sum_async.cuh - the Level-1 sum with per-thread cp.async pipelining (sm_80+).
 *
 * Every thread handles one group per chunk, as in the plain variant, but copies the group's
 * L 16-byte source vectors into its own shared-memory slots with cp.async (LDGSTS) S chunks
 * ahead of the one it sums.  The loads in flight are then bounded by shared memory (S * L * 16
 * bytes a thread) instead of registers, and no barrier is needed: a thread only ever reads the
 * slots it filled itself, after cp.async.wait_group.  Two cursors walk the CTA's chunks, one
 * issuing, one summing; groups that are not whole vectors of real rows take the global-memory
 * path of sum_common.cuh when their turn comes.
 */
#ifndef TIDE_KERNELS_SUM_ASYNC_CUH_
#define TIDE_KERNELS_SUM_ASYNC_CUH_

#include "kernels/sum_common.cuh"

#include <atomic>

namespace tide_sum {

/* Threads of the ASYNC kernel: the register cap this allows holds both cursors unspilled. */
constexpr int kAsyncMaxThreads = 768;

/* Pipeline depth: deeper when the per-thread slot (L * 16 bytes) is small. */
template <int NS> struct async_depth {
    static constexpr int S = NS + 1 <= 2 ? 16 : NS + 1 <= 4 ? 8 : 4;
    static constexpr int bytes_per_thread = S * (NS + 1) * 16;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#endif

/* The group is a whole vector of real rows (it travels through the pipeline). */
template <typename T, int NS>
__device__ __forceinline__ bool async_vector(const seg_view<T, NS> &v, uint64_t g) {
    return v.vec && g < v.groups && v.head + (g + 1) * vec_traits<T>::GE <= v.valid;
}

template <typename T, int NS>
__global__ void __launch_bounds__(kAsyncMaxThreads) sum_async_kernel(const tide_sum_args_t a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int S = async_depth<NS>::S, GE = vec_traits<T>::GE;
    extern __shared__ __align__(16) uint4 slots[];
    const unsigned nthr = blockDim.x, tid = threadIdx.x;
    /* Slot of source j in stage s for this thread: consecutive threads, consecutive 16 B. */
    auto slot = [&](int s, int j) { return slots + ((size_t)s * (NS + 1) + j) * nthr + tid; };

    chunk_cursor<T, NS> in, out;
    cursor_start(in, a, nthr);
    cursor_start(out, a, nthr);
    /* One commit group per chunk, empty when there is nothing to copy, so that group i always
     * belongs to chunk i of the walk. */
    auto issue = [&](int s) {
        if (!in.done) {
            const uint64_t g = in.c * nthr + tid;
            if (async_vector(in.v, g)) {
                const uint64_t e0 = in.v.head + g * GE;
#pragma unroll
                for (int j = 0; j < NS; ++j)
                    cp_async16(slot(s, j), in.v.src[j] + e0);
                cp_async16(slot(s, NS), in.v.own + e0);
            }
            cursor_next(in, a, nthr);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < S - 1; ++s)
        issue(s);
    int stage = 0;
#pragma unroll 1
    while (!out.done) {
        issue(stage == 0 ? S - 1 : stage - 1);
        cp_async_wait<S - 1>();
        const seg_view<T, NS> &v = out.v;
        const uint64_t g = out.c * nthr + tid;
        if (out.c == 0 && tid < v.head) do_element(v, tid);
        if (async_vector(v, g)) {
            uint4 vin[NS + 1];
#pragma unroll
            for (int j = 0; j <= NS; ++j)
                vin[j] = *slot(stage, j);
            sum_store<T, NS>(vin, v.out + v.head + g * GE, v.ep);
        } else if (g < v.groups) {
            do_group(v, g);
        }
        cursor_next(out, a, nthr);
        stage = stage + 1 == S ? 0 : stage + 1;
    }
    cp_async_wait<0>();
#endif
}

template <typename T, int NS>
cudaError_t launch_async(const tide_sum_args_t &a, int ctas, int threads, int smem_bytes, int dev,
                         int optin, cudaStream_t stream) {
    constexpr int per_thread = async_depth<NS>::bytes_per_thread;
    if (smem_bytes == 0 || smem_bytes > optin) smem_bytes = optin;
    if (threads == 0) {
        threads = smem_bytes / per_thread;
        if (threads > kAsyncMaxThreads) threads = kAsyncMaxThreads;
        threads &= ~31;
    }
    if (threads < 64 || threads > kAsyncMaxThreads || threads * per_thread > optin)
        return cudaErrorInvalidValue;
    static std::atomic<uint64_t> raised{0};
    cudaError_t err = raise_smem_limit(sum_async_kernel<T, NS>, raised, dev, optin);
    if (err != cudaSuccess) return err;
    sum_async_kernel<T, NS><<<ctas, threads, (size_t)threads * per_thread, stream>>>(a);
    return cudaGetLastError();
}

} // namespace tide_sum

#endif /* TIDE_KERNELS_SUM_ASYNC_CUH_ */
