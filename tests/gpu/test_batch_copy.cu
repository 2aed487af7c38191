/*
 * test_batch_copy.cu - the batched copy kernel (src/fabric/cuda/batch_copy.cu) against a host
 * copy, for every build variant (tide_cuda_batch_copy_variant: 4, 8 or 16 units in flight,
 * plain or evict-first) and several grids.
 *
 * The fabric's matrix tests reach the kernel only through the variant tide_cuda_batch_copy
 * runs and the tables the programs make; this test gives it the cases those may miss, in
 * one table per round so that the descriptor order (the first thread of each descriptor
 * follows the last of the one before) is exercised too:
 *   - flat copies whose sizes fall on and beside the multiples of grid x threads x unroll
 *     (the predicated last round), of 0, 1 and 15 bytes, and of every unit width (16, 4 and 1
 *     bytes, chosen from the alignment of both addresses and the size);
 *   - 2D copies with pitches wider than their rows, of each width, with one and many rows;
 *   - descriptors of no bytes or no rows, which must write nothing.
 * Sources hold random bytes; the destination starts as a guard pattern, and after the kernel
 * every byte of it must equal the host's copy of the same table: the bytes of each copy, and
 * the guard everywhere else (a stray or missed unit fails).  Exit 0 on success, 1 on a wrong
 * byte, 2 on a CUDA error.
 */
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_ok.h"
#include "fabric/cuda/batch_copy.h"

namespace {

constexpr uint64_t kSrcBytes = 48ull << 20, kDstBytes = 160ull << 20;

struct table_t {
    std::vector<tide_cuda_copy_desc_t> d; /* src / dst as offsets until bound */
    uint64_t dst_end = 0;                 /* the first destination byte no copy writes */
};

/* Appends a copy of `rows` rows of `bytes` with the given pitches, its source at a random
 * offset of alignment `align` and its destination after the previous one at alignment `align`
 * (plus a gap of guard bytes), so that no two destinations overlap. */
void add_copy(table_t *t, std::mt19937_64 &rng, uint64_t bytes, uint64_t rows, uint64_t spitch,
              uint64_t dpitch, uint64_t align) {
    tide_cuda_copy_desc_t c{};
    const uint64_t span_src = rows == 0 ? 0 : (rows - 1) * spitch + bytes;
    const uint64_t span_dst = rows == 0 ? 0 : (rows - 1) * dpitch + bytes;
    uint64_t s = rng() % (kSrcBytes - span_src - 64);
    c.src = s - s % align + (align == 1 ? rng() % 16 : 0);
    uint64_t d = t->dst_end + 16 + rng() % 64;
    c.dst = (d + align - 1) / align * align + (align == 1 ? 3 : 0);
    c.bytes = bytes;
    c.rows = rows;
    c.src_pitch = spitch;
    c.dst_pitch = dpitch;
    t->d.push_back(c);
    t->dst_end = c.dst + span_dst;
}

table_t make_table(std::mt19937_64 &rng, uint64_t threads) {
    table_t t;
    /* Flat copies on and beside the multiples of the grid's units, for each unroll. */
    for (uint64_t unroll : {1ull, 4ull, 8ull, 16ull})
        for (int64_t delta : {-1, 0, 1})
            add_copy(&t, rng, (uint64_t)((int64_t)(threads * unroll) + delta) * 16, 1, 0, 0, 16);
    for (uint64_t b : {0ull, 1ull, 15ull, 16ull, 17ull, 4096ull + 4, 65536ull + 7})
        add_copy(&t, rng, b, 1, 0, 0, b % 16 == 0 ? 16 : b % 4 == 0 ? 4 : 1);
    add_copy(&t, rng, (3ull << 20) + 48, 1, 0, 0, 16); /* many rounds per thread */
    add_copy(&t, rng, (1ull << 20) + 4, 1, 0, 0, 4);
    add_copy(&t, rng, (1ull << 18) + 1, 1, 0, 0, 1);
    /* 2D copies: each width, one row and many, pitches wider than the rows. */
    add_copy(&t, rng, 4096, 300, 8192, 4096 + 512, 16);
    add_copy(&t, rng, 1024, 1, 4096, 2048, 16);
    add_copy(&t, rng, 100, 77, 132, 260, 4);
    add_copy(&t, rng, 33, 129, 35, 70, 1);
    add_copy(&t, rng, 4096, 0, 4096, 4096, 16); /* no rows: nothing */
    std::shuffle(t.d.begin(), t.d.end(), rng);
    return t;
}

void host_copy(const table_t &t, const std::vector<uint8_t> &src, std::vector<uint8_t> *dst) {
    for (const tide_cuda_copy_desc_t &c : t.d)
        for (uint64_t r = 0; r < c.rows; ++r)
            std::memcpy(dst->data() + c.dst + r * c.dst_pitch, src.data() + c.src + r * c.src_pitch,
                        c.bytes);
}

} // namespace

int main() {
    std::mt19937_64 rng(20261207);
    std::vector<uint8_t> src(kSrcBytes), guard(kDstBytes);
    for (auto &b : src)
        b = (uint8_t)rng();
    for (uint64_t i = 0; i < kDstBytes; ++i)
        guard[i] = (uint8_t)(0xa5 ^ (i * 131));
    uint8_t *dsrc, *ddst;
    tide_cuda_copy_desc_t *dtable;
    CUDA_OK(cudaMalloc(&dsrc, kSrcBytes));
    CUDA_OK(cudaMalloc(&ddst, kDstBytes));
    CUDA_OK(cudaMalloc(&dtable, 64 * sizeof(tide_cuda_copy_desc_t)));
    CUDA_OK(cudaMemcpy(dsrc, src.data(), kSrcBytes, cudaMemcpyHostToDevice));
    std::vector<uint8_t> got(kDstBytes);
    int failures = 0, cases = 0;
    for (int ctas : {1, 3, 32, 264})
        for (int unroll : {4, 8, 16})
            for (int streaming : {0, 1}) {
                table_t t = make_table(rng, (uint64_t)ctas * TIDE_CUDA_BATCH_THREADS);
                if (t.dst_end > kDstBytes || t.d.size() > 64) {
                    std::fprintf(stderr, "test_batch_copy: table does not fit its buffers\n");
                    return 2;
                }
                std::vector<uint8_t> want = guard;
                host_copy(t, src, &want);
                std::vector<tide_cuda_copy_desc_t> bound = t.d;
                for (auto &c : bound)
                    c.src += (uint64_t)(uintptr_t)dsrc, c.dst += (uint64_t)(uintptr_t)ddst;
                CUDA_OK(cudaMemcpy(ddst, guard.data(), kDstBytes, cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(dtable, bound.data(), bound.size() * sizeof(bound[0]),
                                   cudaMemcpyHostToDevice));
                CUDA_OK(tide_cuda_batch_copy_variant(dtable, (int)bound.size(), ctas, unroll,
                                                     streaming, 0));
                CUDA_OK(cudaDeviceSynchronize());
                CUDA_OK(cudaMemcpy(got.data(), ddst, kDstBytes, cudaMemcpyDeviceToHost));
                ++cases;
                uint64_t wrong = 0, first = 0;
                if (std::memcmp(got.data(), want.data(), kDstBytes) != 0)
                    for (uint64_t i = 0; i < kDstBytes; ++i)
                        if (got[i] != want[i] && wrong++ == 0) first = i;
                if (wrong != 0) {
                    ++failures;
                    std::printf("FAIL ctas %d unroll %d streaming %d: %llu wrong bytes, first at "
                                "%llu\n",
                                ctas, unroll, streaming, (unsigned long long)wrong,
                                (unsigned long long)first);
                }
            }
    /* The default entry point runs one of the variants: the same bytes. */
    {
        table_t t = make_table(rng, 264ull * TIDE_CUDA_BATCH_THREADS);
        std::vector<uint8_t> want = guard;
        host_copy(t, src, &want);
        for (auto &c : t.d)
            c.src += (uint64_t)(uintptr_t)dsrc, c.dst += (uint64_t)(uintptr_t)ddst;
        CUDA_OK(cudaMemcpy(ddst, guard.data(), kDstBytes, cudaMemcpyHostToDevice));
        CUDA_OK(
            cudaMemcpy(dtable, t.d.data(), t.d.size() * sizeof(t.d[0]), cudaMemcpyHostToDevice));
        CUDA_OK(tide_cuda_batch_copy(dtable, (int)t.d.size(), 264, 0));
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(got.data(), ddst, kDstBytes, cudaMemcpyDeviceToHost));
        ++cases;
        if (std::memcmp(got.data(), want.data(), kDstBytes) != 0) {
            ++failures;
            std::printf("FAIL tide_cuda_batch_copy (the default variant)\n");
        }
    }
    /* Refusals: an unknown unroll, no table, no CTAs; an empty table enqueues nothing. */
    const bool refused =
        tide_cuda_batch_copy_variant(dtable, 1, 1, 5, 0, 0) == cudaErrorInvalidValue &&
        tide_cuda_batch_copy_variant(nullptr, 1, 1, 4, 0, 0) == cudaErrorInvalidValue &&
        tide_cuda_batch_copy_variant(dtable, 1, 0, 4, 0, 0) == cudaErrorInvalidValue &&
        tide_cuda_batch_copy_variant(nullptr, 0, 0, 5, 0, 0) == cudaSuccess;
    if (!refused) {
        ++failures;
        std::printf("FAIL the refusals of tide_cuda_batch_copy_variant\n");
    }
    cudaFree(dsrc), cudaFree(ddst), cudaFree(dtable);
    std::printf("test_batch_copy: %d cases, %d failed\n", cases + 1, failures);
    return failures == 0 ? 0 : 1;
}
