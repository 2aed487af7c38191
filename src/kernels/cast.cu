/*
 * cast.cu - fp32 -> bf16 cast for the mixed-precision all-gather (kernels.h).
 *
 * Round to nearest even in integer arithmetic, exactly as reference.c (NaN becomes the
 * canonical quiet bf16 NaN, Inf stays Inf).  A scalar head brings input and output to a
 * 16-byte boundary together; then each thread converts groups of 8 elements (two 16-byte
 * loads, one 16-byte store), grid-striding over the CTA budget.  Inputs whose alignment
 * cannot be matched with the output's take the scalar path throughout.
 */
#include "kernels/device.cuh"
#include "kernels/launch.h"

using namespace tide_dev;

namespace {

__global__ void __launch_bounds__(1024) cast_kernel(const float *in, uint16_t *out, uint64_t n) {
    const uintptr_t o = (uintptr_t)out;
    int h = (int)(((16u - (o & 15u)) & 15u) / 2u);
    const bool vec = (o & 1u) == 0 && (((uintptr_t)in + 4u * (uintptr_t)h) & 15u) == 0;
    const uint64_t head = vec ? ((uint64_t)h < n ? (uint64_t)h : n) : 0;
    const uint64_t groups = (n - head + 7) / 8;
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t step = (uint64_t)gridDim.x * blockDim.x;
    if (tid < head) out[tid] = (uint16_t)to_bf16(__ldg(in + tid));
    for (uint64_t g = tid; g < groups; g += step) {
        const uint64_t e0 = head + g * 8;
        if (vec && e0 + 8 <= n) {
            const uint4 a = ldg16(in + e0), b = ldg16(in + e0 + 4);
            uint4 r;
            r.x = to_bf16(__uint_as_float(a.x)) | (to_bf16(__uint_as_float(a.y)) << 16);
            r.y = to_bf16(__uint_as_float(a.z)) | (to_bf16(__uint_as_float(a.w)) << 16);
            r.z = to_bf16(__uint_as_float(b.x)) | (to_bf16(__uint_as_float(b.y)) << 16);
            r.w = to_bf16(__uint_as_float(b.z)) | (to_bf16(__uint_as_float(b.w)) << 16);
            *(uint4 *)(out + e0) = r;
        } else {
            for (uint64_t e = e0; e < e0 + 8 && e < n; ++e)
                out[e] = (uint16_t)to_bf16(__ldg(in + e));
        }
    }
}

} // namespace

extern "C" cudaError_t tide_cuda_cast_bf16(const float *in, uint16_t *out, uint64_t n, int ctas,
                                           int threads, cudaStream_t stream) {
    if (ctas < 1 || threads < 0 || threads > 1024 || threads % 32 != 0 ||
        (threads > 0 && threads < 64))
        return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (in == NULL || out == NULL) return cudaErrorInvalidValue;
    if (threads == 0) threads = TIDE_CAST_THREADS;
    cast_kernel<<<ctas, threads, 0, stream>>>(in, out, n);
    return cudaGetLastError();
}
