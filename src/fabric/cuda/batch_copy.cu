/*
 * batch_copy.cu - the batched copy kernel (batch_copy.h).
 *
 * The work of a table is descriptors x rows x units, a unit being 16, 4 or 1 bytes: the
 * widest width that divides dst, src, bytes and both pitches of the descriptor.  Threads
 * stride over the units of each descriptor in turn; the first thread of descriptor d is the
 * one after the last unit of descriptor d - 1 (modulo the grid), so that a table of many
 * small copies still spreads its units over the whole grid instead of giving each copy's
 * first units to the same threads.
 *
 * Every unit is read and written by exactly one thread, whatever the grid, so the grid size
 * (batch.c scales it with the batch's bytes) never changes the bytes written.  A flat copy
 * loads four units of a thread before storing them: one outstanding load per thread would
 * leave too few bytes in flight for HBM's latency on a grid of at most one CTA per SM.  The
 * copies of a table never overlap (batch.c checks), and a copy whose own source overlaps its
 * destination is undefined for cudaMemcpyAsync as well, so reordering within a thread is
 * safe.
 */
#include "fabric/cuda/batch_copy.h"

#include <stdint.h>

namespace {

/* Units [first, n) step `stride` of a flat copy, four loads in flight per thread. */
template <typename T>
__device__ void copy_flat(const tide_cuda_copy_desc_t &d, uint64_t n, uint64_t first,
                          uint64_t stride) {
    const T *__restrict__ src = reinterpret_cast<const T *>(d.src);
    T *__restrict__ dst = reinterpret_cast<T *>(d.dst);
    uint64_t u = first;
    for (; u + 3 * stride < n; u += 4 * stride) {
        const T a = src[u], b = src[u + stride], c = src[u + 2 * stride], e = src[u + 3 * stride];
        dst[u] = a;
        dst[u + stride] = b;
        dst[u + 2 * stride] = c;
        dst[u + 3 * stride] = e;
    }
    for (; u < n; u += stride)
        dst[u] = src[u];
}

/* Units of a 2D copy: unit u is column u mod per_row of row u / per_row.  One division per
 * thread and descriptor; then the (row, column) pair steps by the stride. */
template <typename T>
__device__ void copy_rows(const tide_cuda_copy_desc_t &d, uint64_t per_row, uint64_t first,
                          uint64_t stride) {
    uint64_t row = first / per_row, col = first - row * per_row;
    const uint64_t drow = stride / per_row, dcol = stride - drow * per_row;
    while (row < d.rows) {
        const T *src = reinterpret_cast<const T *>(d.src + row * d.src_pitch) + col;
        T *dst = reinterpret_cast<T *>(d.dst + row * d.dst_pitch) + col;
        *dst = *src;
        row += drow;
        col += dcol;
        if (col >= per_row) {
            col -= per_row;
            ++row;
        }
    }
}

template <typename T>
__device__ void copy_units(const tide_cuda_copy_desc_t &d, uint64_t per_row, uint64_t first,
                           uint64_t stride) {
    if (d.rows == 1)
        copy_flat<T>(d, per_row, first, stride);
    else
        copy_rows<T>(d, per_row, first, stride);
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
        if (per_row == 0 || d.rows == 0) continue; /* nothing to copy, start unchanged */
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
                                            int ctas, cudaStream_t stream) {
    if (count <= 0) return cudaSuccess;
    if (table == nullptr || ctas < 1) return cudaErrorInvalidValue;
    batch_copy_kernel<<<ctas, TIDE_CUDA_BATCH_THREADS, 0, stream>>>(table, count);
    return cudaGetLastError();
}
