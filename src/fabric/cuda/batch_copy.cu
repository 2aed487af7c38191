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

/* A unit's load and store: plain, or marked evict-first (ld.global.cs / st.global.cs) for the
 * streaming variant, whose bytes are touched once and should not displace what the sums and
 * landings running beside the copies keep in L2. */
template <typename T, bool CS> __device__ __forceinline__ T load_unit(const T *p) {
    if constexpr (CS)
        return __ldcs(p);
    else
        return *p;
}
template <typename T, bool CS> __device__ __forceinline__ void store_unit(T *p, const T &v) {
    if constexpr (CS)
        __stcs(p, v);
    else
        *p = v;
}

/* Units [first, n) step `stride` of a flat copy, UNROLL loads in flight per thread.  The
 * last round of a thread (fewer than UNROLL of its units left) is predicated rather than a
 * unit at a time: one round trip to memory instead of up to UNROLL - 1 in a row at the end
 * of every descriptor. */
template <typename T, int UNROLL, bool CS>
__device__ void copy_flat(const tide_cuda_copy_desc_t &d, uint64_t n, uint64_t first,
                          uint64_t stride) {
    const T *__restrict__ src = reinterpret_cast<const T *>(d.src);
    T *__restrict__ dst = reinterpret_cast<T *>(d.dst);
    uint64_t u = first;
    T v[UNROLL];
    for (; u + (UNROLL - 1) * stride < n; u += UNROLL * stride) {
#pragma unroll
        for (int k = 0; k < UNROLL; ++k)
            v[k] = load_unit<T, CS>(src + u + k * stride);
#pragma unroll
        for (int k = 0; k < UNROLL; ++k)
            store_unit<T, CS>(dst + u + k * stride, v[k]);
    }
#pragma unroll
    for (int k = 0; k < UNROLL - 1; ++k)
        if (u + k * stride < n) v[k] = load_unit<T, CS>(src + u + k * stride);
#pragma unroll
    for (int k = 0; k < UNROLL - 1; ++k)
        if (u + k * stride < n) store_unit<T, CS>(dst + u + k * stride, v[k]);
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

template <typename T, int UNROLL, bool CS>
__device__ void copy_units(const tide_cuda_copy_desc_t &d, uint64_t per_row, uint64_t first,
                           uint64_t stride) {
    if (d.rows == 1)
        copy_flat<T, UNROLL, CS>(d, per_row, first, stride);
    else
        copy_rows<T>(d, per_row, first, stride);
}

/* The next descriptor is loaded while the current one is copied: every thread reads the
 * table, and without the prefetch each descriptor began with a dependent load. */
template <int UNROLL, bool CS>
__global__ void batch_copy_kernel(const tide_cuda_copy_desc_t *table, int count) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t start = 0; /* the thread that takes the first unit of the current descriptor */
    tide_cuda_copy_desc_t next = table[0];
    for (int i = 0; i < count; ++i) {
        const tide_cuda_copy_desc_t d = next;
        if (i + 1 < count) next = table[i + 1];
        const uint64_t mask =
            d.dst | d.src | d.bytes | (d.rows > 1 ? d.src_pitch | d.dst_pitch : 0);
        const unsigned width = (mask & 15u) == 0 ? 16u : (mask & 3u) == 0 ? 4u : 1u;
        const uint64_t per_row = d.bytes / width;
        if (per_row == 0 || d.rows == 0) continue; /* nothing to copy, start unchanged */
        const uint64_t first = (tid + stride - start) % stride;
        if (width == 16u)
            copy_units<uint4, UNROLL, CS>(d, per_row, first, stride);
        else if (width == 4u)
            copy_units<uint32_t, UNROLL, CS>(d, per_row, first, stride);
        else
            copy_units<uint8_t, UNROLL, CS>(d, per_row, first, stride);
        start = (start + per_row * d.rows % stride) % stride;
    }
}

template <int UNROLL>
cudaError_t launch(const tide_cuda_copy_desc_t *table, int count, int ctas, bool streaming,
                   cudaStream_t stream) {
    if (streaming)
        batch_copy_kernel<UNROLL, true><<<ctas, TIDE_CUDA_BATCH_THREADS, 0, stream>>>(table, count);
    else
        batch_copy_kernel<UNROLL, false>
            <<<ctas, TIDE_CUDA_BATCH_THREADS, 0, stream>>>(table, count);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t tide_cuda_batch_copy_variant(const tide_cuda_copy_desc_t *table, int count,
                                                    int ctas, int unroll, int streaming,
                                                    cudaStream_t stream) {
    if (count <= 0) return cudaSuccess;
    if (table == nullptr || ctas < 1) return cudaErrorInvalidValue;
    switch (unroll) {
    case 4:
        return launch<4>(table, count, ctas, streaming != 0, stream);
    case 8:
        return launch<8>(table, count, ctas, streaming != 0, stream);
    case 16:
        return launch<16>(table, count, ctas, streaming != 0, stream);
    default:
        return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t tide_cuda_batch_copy(const tide_cuda_copy_desc_t *table, int count, int ctas,
                                            cudaStream_t stream) {
    return tide_cuda_batch_copy_variant(table, count, ctas, TIDE_CUDA_BATCH_UNROLL,
                                        TIDE_CUDA_BATCH_STREAMING, stream);
}
