/*
 * batch_copy_cases.h - copy tables for the batched copy kernel's tests: the CPU test of its
 * per-thread work (tests/unit/test_batch_copy_thread.cpp) and the GPU test of the kernel
 * (tests/gpu/test_batch_copy.cu).  C++ with no CUDA type, for the host compiler and nvcc.
 *
 * A table's addresses are offsets into a source and a destination buffer, bound by the test;
 * destinations follow each other with gaps of guard bytes, so that no two copies overlap and
 * a stray write shows.
 */
#ifndef TIDE_TESTS_BATCH_COPY_CASES_H_
#define TIDE_TESTS_BATCH_COPY_CASES_H_

#include <stdint.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "fabric/cuda/batch_copy_thread.h"

namespace batch_copy_cases {

struct table_t {
    std::vector<tide_cuda_copy_desc_t> d; /* src and dst as offsets into the buffers */
    uint64_t dst_end = 0;
};

inline uint8_t guard_byte(uint64_t i) {
    return (uint8_t)(0xa5 ^ (i * 131));
}

/* A copy of `rows` rows of `bytes` (pitches as given) at alignment `align` (1: deliberately
 * misaligned), its destination after the previous one with a gap of guard bytes. */
inline void add_copy(table_t *t, std::mt19937_64 &rng, uint64_t src_size, uint64_t bytes,
                     uint64_t rows, uint64_t spitch, uint64_t dpitch, uint64_t align) {
    tide_cuda_copy_desc_t c{};
    const uint64_t span_src = rows == 0 ? 0 : (rows - 1) * spitch + bytes;
    const uint64_t span_dst = rows == 0 ? 0 : (rows - 1) * dpitch + bytes;
    const uint64_t s = rng() % (src_size - span_src - 32);
    c.src = s - s % align + (align == 1 ? 1 + rng() % 14 : 0);
    const uint64_t d = t->dst_end + 1 + rng() % 48;
    c.dst = (d + align - 1) / align * align + (align == 1 ? 3 : 0);
    c.bytes = bytes;
    c.rows = rows;
    c.src_pitch = spitch;
    c.dst_pitch = dpitch;
    t->d.push_back(c);
    t->dst_end = std::max(t->dst_end, c.dst + span_dst);
}

/* The cases the programs' tables may miss, for a grid of `threads` threads. */
inline table_t edge_table(std::mt19937_64 &rng, uint64_t src_size, uint64_t threads) {
    table_t t;
    for (uint64_t unroll : {1ull, 4ull, 8ull, 16ull})
        for (int64_t delta : {-1, 0, 1}) {
            const int64_t units = (int64_t)(threads * unroll) + delta;
            if (units > 0) add_copy(&t, rng, src_size, (uint64_t)units * 16, 1, 0, 0, 16);
        }
    for (uint64_t b : {0ull, 1ull, 15ull, 16ull, 17ull, 4100ull, 65543ull})
        add_copy(&t, rng, src_size, b, 1, 0, 0, b % 16 == 0 ? 16 : b % 4 == 0 ? 4 : 1);
    add_copy(&t, rng, src_size, (1ull << 20) + 48, 1, 0, 0, 16);
    add_copy(&t, rng, src_size, 4096, 37, 8192, 4096 + 512, 16);
    add_copy(&t, rng, src_size, 1024, 1, 4096, 2048, 16);
    add_copy(&t, rng, src_size, 100, 77, 132, 260, 4);
    add_copy(&t, rng, src_size, 33, 129, 35, 70, 1);
    add_copy(&t, rng, src_size, 4096, 0, 4096, 4096, 16); /* no rows: nothing */
    std::shuffle(t.d.begin(), t.d.end(), rng);
    return t;
}

/* Random copies: sizes from 0 to 200 KiB, any alignment, a third of them 2D. */
inline table_t random_table(std::mt19937_64 &rng, uint64_t src_size, int count) {
    table_t t;
    for (int i = 0; i < count; ++i) {
        static const uint64_t aligns[3] = {1, 4, 16};
        const uint64_t align = aligns[rng() % 3];
        uint64_t bytes = rng() % (200u << 10);
        bytes -= bytes % align;
        if (rng() % 3 == 0) {
            const uint64_t b = bytes % 3000 + align, rows = 1 + rng() % 50;
            const uint64_t sp = b + (rng() % 8) * align, dp = b + (rng() % 8) * align;
            add_copy(&t, rng, src_size, b - b % align, rows, sp, dp, align);
        } else {
            add_copy(&t, rng, src_size, bytes, 1, 0, 0, align);
        }
    }
    return t;
}

/* `want` = the destination after the table: guard bytes, then each copy's bytes. */
inline void expected(const table_t &t, const std::vector<uint8_t> &src,
                     std::vector<uint8_t> *want) {
    for (uint64_t i = 0; i < want->size(); ++i)
        (*want)[i] = guard_byte(i);
    for (const auto &c : t.d)
        for (uint64_t r = 0; r < c.rows; ++r)
            std::memcpy(want->data() + c.dst + r * c.dst_pitch,
                        src.data() + c.src + r * c.src_pitch, c.bytes);
}

/* The table with its offsets turned into addresses of the two buffers. */
inline std::vector<tide_cuda_copy_desc_t> bind(const table_t &t, const void *src, void *dst) {
    std::vector<tide_cuda_copy_desc_t> bound = t.d;
    for (auto &c : bound) {
        c.src += (uint64_t)(uintptr_t)src;
        c.dst += (uint64_t)(uintptr_t)dst;
    }
    return bound;
}

} // namespace batch_copy_cases

#endif /* TIDE_TESTS_BATCH_COPY_CASES_H_ */
