/*
 * sum_plain2.cu - the PLAIN2 Level-1 sum (sum_hybrid.cuh): PLAIN with U groups a thread per
 * chunk, all U * L 16-byte loads issued before the first add, so that U * L * 16 bytes a
 * thread are in flight while fewer warps (512, 384 or 256 threads for U = 2, 3, 4) share the
 * register file.  The adds' results are stored as they are for L >= 2 (sum_store's RAW).
 */
#include "kernels/sum_hybrid.cuh"

namespace tide_sum {
namespace {

template <typename T, int NS, int U>
__global__ void __launch_bounds__(split_limits<U>::plain2)
    sum_plain2_kernel(const tide_sum_args_t a) {
    constexpr int GE = vec_traits<T>::GE, L = NS + 1;
    const unsigned nthr = blockDim.x, tid = threadIdx.x;
    const uint32_t tg = U * nthr; /* groups per chunk */
    chunk_cursor<T, NS> k;
#pragma unroll 1
    for (cursor_start(k, a, tg); !k.done; cursor_next(k, a, tg)) {
        const seg_view<T, NS> &v = k.v;
        if (k.c == 0 && tid < v.head) do_element(v, tid);
        const uint64_t g0 = k.c * tg + tid;
        uint4 in[U][L];
        bool full[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const uint64_t g = g0 + (uint64_t)u * nthr;
            full[u] = vec_full(v, g);
            if (full[u]) load_sources<T, NS, 0, L>(v, v.head + g * GE, in[u]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const uint64_t g = g0 + (uint64_t)u * nthr;
            if (full[u])
                sum_store<T, NS, true>(in[u], v.out + v.head + g * GE, v.ep);
            else if (g < v.groups)
                do_group(v, g);
        }
    }
}

template <typename T, int NS, int U>
cudaError_t launch_u(const tide_sum_args_t &a, int ctas, int threads, cudaStream_t stream) {
    if (threads == 0) threads = split_limits<U>::plain2;
    if (threads < 32 || threads > split_limits<U>::plain2 || threads % 32 != 0)
        return cudaErrorInvalidValue;
    sum_plain2_kernel<T, NS, U><<<ctas, threads, 0, stream>>>(a);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_dtype(const tide_sum_args_t &a, int ctas, int threads, int groups,
                         cudaStream_t stream) {
    return with_ns(a.num_staged, [&](auto ns) -> cudaError_t {
        constexpr int NS = decltype(ns)::value;
        switch (groups) {
        case 2:
            return launch_u<T, NS, 2>(a, ctas, threads, stream);
        case 3:
            return launch_u<T, NS, 3>(a, ctas, threads, stream);
        case 4:
            return launch_u<T, NS, 4>(a, ctas, threads, stream);
        default:
            return cudaErrorInvalidValue;
        }
    });
}

} // namespace

cudaError_t launch_plain2(const tide_sum_args_t &a, int ctas, int threads, int groups,
                          cudaStream_t stream) {
    if (groups == 0) groups = 2;
    if (ctas < 1 || threads < 0 || groups < 2 || groups > 4) return cudaErrorInvalidValue;
    if (a.num_segs == 0) return cudaSuccess;
    if (a.dtype == TIDE_DTYPE_BF16) return launch_dtype<uint16_t>(a, ctas, threads, groups, stream);
    if (a.dtype == TIDE_DTYPE_FP32) return launch_dtype<float>(a, ctas, threads, groups, stream);
    return cudaErrorInvalidValue;
}

} // namespace tide_sum
