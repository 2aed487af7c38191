/*
 * batch_copy.cu - the batched copy kernel (batch_copy.h).
 *
 * The work of a table is descriptors x rows x units, a unit being 16, 4 or 1 bytes: the
 * widest width that divides dst, src, bytes and both pitches of the descriptor.  Threads
 * stride over the units of each descriptor in turn; the first thread of descriptor d is the
 * one after the last unit of descriptor d - 1 (modulo the grid), so that a table of many
 * small copies still spreads its units over the whole grid instead of giving each copy's
 * first units to the same threads.
 */
#include "fabric/cuda/batch_copy.h"

#include <stdint.h>

namespace {

template <typename T>
__device__ void copy_units(const tide_cuda_copy_desc_t &d, uint64_t per_row, uint64_t first,
                           uint64_t stride) {
    const uint64_t total = per_row * d.rows;
    for (uint64_t u = first; u < total; u += stride) {
        const uint64_t row = u / per_row, col = u - row * per_row;
        const T *src = reinterpret_cast<const T *>(d.src + row * d.src_pitch) + col;
        T *dst = reinterpret_cast<T *>(d.dst + row * d.dst_pitch) + col;
        *dst = *src;
    }
}

__global__ void batch_copy_kernel(const tide_cuda_copy_desc_t *table, int count) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t start = 0; /* the thread that takes the first unit of the current descriptor */
    for (int i = 0; i < count; ++i) {
        const tide_cuda_copy_desc_t d = table[i];
        const uint64_t mask =
            d.dst | d.src | d.bytes | (d.rows > 1 ? d.src_pitch | d.dst_pitch : 0);
        const unsigned width = (mask & 15u) == 0 ? 16u : (mask & 3u) == 0 ? 4u : 1u;
        const uint64_t per_row = d.bytes / width;
        const uint64_t first = (tid + stride - start) % stride;
        if (width == 16u)
            copy_units<uint4>(d, per_row, first, stride);
        else if (width == 4u)
            copy_units<uint32_t>(d, per_row, first, stride);
        else
            copy_units<uint8_t>(d, per_row, first, stride);
        start = (start + per_row * d.rows % stride) % stride;
    }
}

} // namespace

extern "C" cudaError_t tide_cuda_batch_copy(const tide_cuda_copy_desc_t *table, int count,
                                            cudaStream_t stream) {
    if (count <= 0) return cudaSuccess;
    if (table == nullptr) return cudaErrorInvalidValue;
    batch_copy_kernel<<<TIDE_CUDA_BATCH_CTAS, TIDE_CUDA_BATCH_THREADS, 0, stream>>>(table, count);
    return cudaGetLastError();
}
