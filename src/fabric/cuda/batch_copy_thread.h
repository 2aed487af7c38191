/*
 * batch_copy_thread.h - one thread's share of a batched copy (batch_copy.h, batch_copy.cu):
 * the copy descriptor, and which units of which descriptors thread `tid` of a grid of
 * `stride` threads copies, and how.
 *
 * The work of a table is descriptors x rows x units, a unit being 16, 4 or 1 bytes: the
 * widest width that divides dst, src, bytes and both pitches of the descriptor.  Threads
 * stride over the units of each descriptor in turn; the first thread of descriptor d is the
 * one after the last unit of descriptor d - 1 (modulo the grid), so that a table of many
 * small copies still spreads its units over the whole grid instead of giving each copy's
 * first units to the same threads.  Every unit is read and written by exactly one thread,
 * whatever the grid, so the grid size never changes the bytes written.
 *
 * A flat copy loads UNROLL units of a thread before storing them: one outstanding load per
 * thread leaves too few bytes in flight for HBM's latency on a grid of one or two CTAs per SM.
 * A thread's last round of a descriptor (fewer than UNROLL of its units left) is predicated,
 * one round trip to memory instead of up to UNROLL - 1 in a row.  The copies of a table never
 * overlap (batch.c checks), and a copy whose own source overlaps its destination is undefined
 * for cudaMemcpyAsync as well, so reordering within a thread is safe.
 *
 * The descriptor is plain C (the fabric's C files fill tables of it).  The rest is C++ with
 * no CUDA type in the host pass: nvcc compiles it into the kernel, and the host compiler into
 * the CPU unit test (tests/unit/test_batch_copy_thread.cpp), which runs every thread of a
 * grid in turn, so the index arithmetic the kernel runs is the one CI tests.  Only the
 * evict-first loads and stores (the CS variant) exist on the device alone; on the host they
 * are plain.
 */
#ifndef TIDE_FABRIC_CUDA_BATCH_COPY_THREAD_H_
#define TIDE_FABRIC_CUDA_BATCH_COPY_THREAD_H_

#include <stdint.h>

/* One copy: `rows` rows of `bytes` bytes, row i from src + i src_pitch to dst + i dst_pitch.
 * A flat copy has rows = 1.  Addresses are device (UVA) addresses. */
typedef struct {
    uint64_t dst;
    uint64_t src;
    uint64_t bytes;
    uint64_t rows;
    uint64_t src_pitch;
    uint64_t dst_pitch;
} tide_cuda_copy_desc_t;

#ifdef __cplusplus

#if defined(__CUDACC__)
#define TIDE_COPY_FN __host__ __device__ __forceinline__
#else
#define TIDE_COPY_FN inline
#endif
/* The device pass unrolls; a host compiler (nvcc's host pass included) does not know the
 * pragma and, with -Werror, refuses it. */
#if defined(__CUDA_ARCH__)
#define TIDE_COPY_UNROLL _Pragma("unroll")
#else
#define TIDE_COPY_UNROLL
#endif

/* C++ linkage even where a C++ file includes the fabric's C headers inside extern "C". */
extern "C++" {
namespace tide_copy {

/* A 16-byte unit: four 32-bit words, 16-byte aligned (one 128-bit load or store). */
struct alignas(16) unit16_t {
    uint32_t x, y, z, w;
};

template <typename T, bool CS> TIDE_COPY_FN T load(const T *p) {
#if defined(__CUDA_ARCH__)
    if (CS) {
        if (sizeof(T) == 16) {
            const uint4 v = __ldcs(reinterpret_cast<const uint4 *>(p));
            return *reinterpret_cast<const T *>(&v);
        }
        if (sizeof(T) == 4) {
            const unsigned v = __ldcs(reinterpret_cast<const unsigned *>(p));
            return *reinterpret_cast<const T *>(&v);
        }
    }
#endif
    return *p;
}

template <typename T, bool CS> TIDE_COPY_FN void store(T *p, const T &v) {
#if defined(__CUDA_ARCH__)
    if (CS && sizeof(T) == 16) {
        __stcs(reinterpret_cast<uint4 *>(p), *reinterpret_cast<const uint4 *>(&v));
        return;
    }
    if (CS && sizeof(T) == 4) {
        __stcs(reinterpret_cast<unsigned *>(p), *reinterpret_cast<const unsigned *>(&v));
        return;
    }
#endif
    *p = v;
}

/* Units [first, n) step `stride` of a flat copy, UNROLL loads in flight per thread. */
template <typename T, int UNROLL, bool CS>
TIDE_COPY_FN void copy_flat(const tide_cuda_copy_desc_t &d, uint64_t n, uint64_t first,
                            uint64_t stride) {
    const T *__restrict__ src = reinterpret_cast<const T *>(d.src);
    T *__restrict__ dst = reinterpret_cast<T *>(d.dst);
    uint64_t u = first;
    /* The predicated tail loads and stores under the same condition, but a host compiler
     * at -O3 cannot see that and warns (an error under -Werror): zeroed there only, so the
     * kernel's code stays as measured. */
#if defined(__CUDA_ARCH__)
    T v[UNROLL];
#else
    T v[UNROLL] = {};
#endif
    for (; u + (UNROLL - 1) * stride < n; u += UNROLL * stride) {
        TIDE_COPY_UNROLL
        for (int k = 0; k < UNROLL; ++k)
            v[k] = load<T, CS>(src + u + k * stride);
        TIDE_COPY_UNROLL
        for (int k = 0; k < UNROLL; ++k)
            store<T, CS>(dst + u + k * stride, v[k]);
    }
    TIDE_COPY_UNROLL
    for (int k = 0; k < UNROLL - 1; ++k)
        if (u + k * stride < n) v[k] = load<T, CS>(src + u + k * stride);
    TIDE_COPY_UNROLL
    for (int k = 0; k < UNROLL - 1; ++k)
        if (u + k * stride < n) store<T, CS>(dst + u + k * stride, v[k]);
}

/* Units of a 2D copy: unit u is column u mod per_row of row u / per_row.  One division per
 * thread and descriptor; then the (row, column) pair steps by the stride. */
template <typename T>
TIDE_COPY_FN void copy_rows(const tide_cuda_copy_desc_t &d, uint64_t per_row, uint64_t first,
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
TIDE_COPY_FN void copy_units(const tide_cuda_copy_desc_t &d, uint64_t per_row, uint64_t first,
                             uint64_t stride) {
    if (d.rows == 1)
        copy_flat<T, UNROLL, CS>(d, per_row, first, stride);
    else
        copy_rows<T>(d, per_row, first, stride);
}

/* Thread `tid` of `stride` threads: its units of table[0 .. count).  The next descriptor is
 * loaded while the current one is copied: every thread reads the table, and without the
 * prefetch each descriptor began with a dependent load. */
template <int UNROLL, bool CS>
TIDE_COPY_FN void copy_thread(const tide_cuda_copy_desc_t *table, int count, uint64_t tid,
                              uint64_t stride) {
    if (count <= 0) return;
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
            copy_units<unit16_t, UNROLL, CS>(d, per_row, first, stride);
        else if (width == 4u)
            copy_units<uint32_t, UNROLL, CS>(d, per_row, first, stride);
        else
            copy_units<uint8_t, UNROLL, CS>(d, per_row, first, stride);
        start = (start + per_row * d.rows % stride) % stride;
    }
}

} // namespace tide_copy
} // extern "C++"

#endif /* __cplusplus */

#endif /* TIDE_FABRIC_CUDA_BATCH_COPY_THREAD_H_ */
