/*
 * sum_hybrid.cu - launcher of the HYBRID Level-1 sum (sm_90; kernel in sum_hybrid.cuh): the
 * first R sources of each chunk through the bulk-copy ring, the other D = L - R straight into
 * the consumer threads' registers.
 *
 * Options: R in 1 .. L-1 with D <= kHybridMaxDirect (default: kHybridDefaultDirect direct
 * sources, fewer when L is small); U = 2 or 4 groups per consumer thread (default 2); 1 or 2
 * producer warps (default 1); threads = 32 * producers + consumers, at most
 * split_limits<U>::hybrid (512 for U = 2, 320 for U = 4; default kHybridDefaultThreads).  A
 * stage holds R tiles of U * consumers 16-byte groups; the ring, within smem_bytes, must hold
 * two stages.  L = 1 has no staged source: PLAIN2 runs on the consumer threads (R ignored).
 */
#include "kernels/sum_hybrid.cuh"

namespace tide_sum {
namespace {

constexpr int kHybridDefaultThreads = 512; /* one producer warp, 480 consumers */
constexpr int kHybridDefaultDirect = 2;

template <typename T, int NS, int U, int D>
cudaError_t launch_if(const tide_sum_args_t &a, const hybrid_opts &o, int dev, int optin,
                      cudaStream_t stream) {
    /* D <= NS keeps R >= 1; the other combinations are never instantiated. */
    if constexpr (D <= NS) return launch_hybrid_kernel<T, NS, D, U>(a, o, dev, optin, stream);
    return cudaErrorInvalidValue;
}

template <typename T, int NS, int U>
cudaError_t launch_d(const tide_sum_args_t &a, const hybrid_opts &o, int d, int dev, int optin,
                     cudaStream_t stream) {
    switch (d) {
    case 1:
        return launch_if<T, NS, U, 1>(a, o, dev, optin, stream);
    case 2:
        return launch_if<T, NS, U, 2>(a, o, dev, optin, stream);
    case 3:
        return launch_if<T, NS, U, 3>(a, o, dev, optin, stream);
    case 4:
        return launch_if<T, NS, U, 4>(a, o, dev, optin, stream);
    case 5:
        return launch_if<T, NS, U, 5>(a, o, dev, optin, stream);
    case 6:
        return launch_if<T, NS, U, 6>(a, o, dev, optin, stream);
    default:
        return cudaErrorInvalidValue;
    }
}

template <typename T>
cudaError_t launch_dtype(const tide_sum_args_t &a, const hybrid_opts &o, int d, int dev,
                         int optin, cudaStream_t stream) {
    return with_ns(a.num_staged, [&](auto ns) -> cudaError_t {
        constexpr int NS = decltype(ns)::value;
        if (o.groups == 2) return launch_d<T, NS, 2>(a, o, d, dev, optin, stream);
        return launch_d<T, NS, 4>(a, o, d, dev, optin, stream);
    });
}

} // namespace

cudaError_t launch_hybrid(const tide_sum_args_t &a, const hybrid_opts &in, int dev, int optin,
                          cudaStream_t stream) {
    hybrid_opts o = in;
    if (o.groups == 0) o.groups = 2;
    if (o.producers == 0) o.producers = 1;
    if (o.threads == 0) o.threads = kHybridDefaultThreads;
    if (o.smem_bytes == 0) o.smem_bytes = TIDE_SUM_TMA_SMEM;
    if (o.smem_bytes > optin) o.smem_bytes = optin;
    const int most = o.groups == 2 ? split_limits<2>::hybrid : split_limits<4>::hybrid;
    if (o.ctas < 1 || o.bulk < 0 || o.producers < 1 || o.producers > kHybridMaxProducers ||
        o.threads % 32 != 0 || o.threads > most || o.threads - 32 * o.producers < 32 ||
        o.smem_bytes < 0 || (o.groups != 2 && o.groups != 4))
        return cudaErrorInvalidValue;
    const int L = a.num_staged + 1;
    if (L == 1) {
        /* No staged source to bulk-copy: the consumer threads alone run PLAIN2. */
        const int plain_most = o.groups == 2 ? split_limits<2>::plain2 : split_limits<4>::plain2;
        const int threads = o.threads - 32 * o.producers;
        return launch_plain2(a, o.ctas, threads < plain_most ? threads : plain_most, o.groups,
                             stream);
    }
    const int d = o.bulk == 0 ? (L - 1 < kHybridDefaultDirect ? L - 1 : kHybridDefaultDirect)
                              : L - o.bulk;
    if (d < 1 || d > kHybridMaxDirect || d > L - 1) return cudaErrorInvalidValue;
    if (a.num_segs == 0) return cudaSuccess;
    if (a.dtype == TIDE_DTYPE_BF16) return launch_dtype<uint16_t>(a, o, d, dev, optin, stream);
    if (a.dtype == TIDE_DTYPE_FP32) return launch_dtype<float>(a, o, d, dev, optin, stream);
    return cudaErrorInvalidValue;
}

} // namespace tide_sum
