/*
 * test_batch_copy_thread.cpp - the batched copy kernel's per-thread work
 * (src/fabric/cuda/batch_copy_thread.h) on the CPU: every thread of a grid runs in turn, and
 * the destination must equal a host memcpy of the same table, byte for byte, with guard bytes
 * untouched between the copies.  The same function is the body of the CUDA kernel, so the
 * unit arithmetic (widths, the order of descriptors over the grid, the predicated last round
 * of each variant, 2D rows) is tested in the CPU build; tests/gpu/test_batch_copy.cu runs the
 * kernel itself.
 *
 * Copies are idempotent, so a unit that one thread writes twice (wasted bytes, not wrong
 * ones) passes; test_exactly_once checks that no unit is taken by two threads or by none.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" { /* cmocka.h declares some of its functions without C linkage for C++ */
#include <cmocka.h>
}

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "batch_copy_cases.h"
#include "fabric/cuda/batch_copy_thread.h"

namespace {

using namespace batch_copy_cases;

struct bufs_t {
    std::vector<uint8_t> src, dst, want;
};

/* Runs the table on a grid of `threads` threads, each in turn; true when the destination is
 * the host copy and every other byte still its guard. */
template <int UNROLL, bool CS> bool run_table(bufs_t *b, const table_t &t, uint64_t threads) {
    assert_true(t.dst_end <= b->dst.size());
    const std::vector<tide_cuda_copy_desc_t> bound = bind(t, b->src.data(), b->dst.data());
    expected(t, b->src, &b->want);
    for (uint64_t i = 0; i < b->dst.size(); ++i)
        b->dst[i] = guard_byte(i);
    for (uint64_t tid = 0; tid < threads; ++tid)
        tide_copy::copy_thread<UNROLL, CS>(bound.data(), (int)bound.size(), tid, threads);
    return b->dst == b->want;
}

bufs_t make_bufs(uint64_t src_size, uint64_t dst_size) {
    bufs_t b;
    std::mt19937_64 rng(7);
    b.src.resize(src_size);
    for (auto &x : b.src)
        x = (uint8_t)rng();
    b.dst.resize(dst_size);
    b.want.resize(dst_size);
    return b;
}

template <int UNROLL, bool CS> void edge_cases_for(bufs_t *b, std::mt19937_64 &rng) {
    /* One thread, a few, an odd count and a grid of 32 CTAs of 256 (the fabric's smallest). */
    for (uint64_t threads : {1ull, 7ull, 2051ull, 8192ull}) {
        const table_t t = edge_table(rng, b->src.size(), threads);
        if (!run_table<UNROLL, CS>(b, t, threads))
            fail_msg("unroll %d streaming %d, %llu threads: wrong bytes", UNROLL, (int)CS,
                     (unsigned long long)threads);
    }
}

void test_edge_cases(void **state) {
    (void)state;
    bufs_t b = make_bufs(4u << 20, 16u << 20);
    std::mt19937_64 rng(20261207);
    edge_cases_for<4, false>(&b, rng);
    edge_cases_for<8, false>(&b, rng);
    edge_cases_for<16, false>(&b, rng);
    edge_cases_for<4, true>(&b, rng); /* the hints are device-only: the same code here */
}

void test_random_tables(void **state) {
    (void)state;
    bufs_t b = make_bufs(4u << 20, 24u << 20);
    std::mt19937_64 rng(99);
    for (int round = 0; round < 12; ++round) {
        const table_t t = random_table(rng, b.src.size(), 1 + (int)(rng() % 60));
        static const uint64_t grids[5] = {1, 3, 256, 1000, 8192};
        const uint64_t threads = grids[round % 5];
        const bool ok = round % 3 == 0   ? run_table<4, false>(&b, t, threads)
                        : round % 3 == 1 ? run_table<8, false>(&b, t, threads)
                                         : run_table<16, false>(&b, t, threads);
        if (!ok)
            fail_msg("random table %d (%zu copies, %llu threads): wrong bytes", round, t.d.size(),
                     (unsigned long long)threads);
    }
}

/* Each unit is taken by exactly one thread: the table copies a source of ones, one thread at
 * a time into a zeroed destination, and the test sums per byte how many threads wrote it:
 * once for every byte of a copy, never for the rest. */
void test_exactly_once(void **state) {
    (void)state;
    bufs_t b = make_bufs(1u << 20, 3u << 20);
    std::mt19937_64 rng(5);
    const uint64_t threads = 37;
    table_t t = random_table(rng, b.src.size(), 9);
    assert_true(t.dst_end + (8u << 10) < b.dst.size());
    add_copy(&t, rng, b.src.size(), 4096 + 16, 1, 0, 0, 16);
    const std::vector<uint8_t> ones(b.src.size(), 1);
    const std::vector<tide_cuda_copy_desc_t> bound = bind(t, ones.data(), b.dst.data());
    std::vector<uint32_t> writes(b.dst.size(), 0);
    for (uint64_t tid = 0; tid < threads; ++tid) {
        std::fill(b.dst.begin(), b.dst.end(), 0);
        tide_copy::copy_thread<8, false>(bound.data(), (int)bound.size(), tid, threads);
        for (uint64_t i = 0; i < b.dst.size(); ++i)
            writes[i] += b.dst[i];
    }
    std::vector<uint32_t> want(b.dst.size(), 0);
    for (const auto &c : t.d)
        for (uint64_t r = 0; r < c.rows; ++r)
            for (uint64_t k = 0; k < c.bytes; ++k)
                want[c.dst + r * c.dst_pitch + k] = 1;
    assert_true(writes == want);
}

} // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_random_tables),
        cmocka_unit_test(test_exactly_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
