/*
 * test_batch_copy.cu - the batched copy kernel (src/fabric/cuda/batch_copy.cu) against a host
 * copy, for every build variant (tide_cuda_batch_copy's unroll 4, 8 or 16 units in flight,
 * plain or evict-first) and several grids.
 *
 * The fabric's matrix tests reach the kernel only through the variant the fabric runs and
 * the tables the programs make; this test gives it the cases those may miss, in
 * one table per round so that the descriptor order (the first thread of each descriptor
 * follows the last of the one before) is exercised too:
 *   - flat copies whose sizes fall on and beside the multiples of grid x threads x unroll
 *     (the predicated last round), of 0, 1 and 15 bytes, and of every unit width (16, 4 and 1
 *     bytes, chosen from the alignment of both addresses and the size);
 *   - 2D copies with pitches wider than their rows, of each width, with one and many rows;
 *   - descriptors of no bytes or no rows, which must write nothing;
 *   - random tables (batch_copy_cases.h, shared with the CPU test of the per-thread work).
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
#include "batch_copy_cases.h"
#include "fabric/cuda/batch_copy.h"

using namespace batch_copy_cases;

namespace {

constexpr uint64_t kSrcBytes = 48ull << 20, kDstBytes = 160ull << 20;

/* The table on the device, with the kernel's variant (unroll, streaming);
 * the number of destination bytes that differ from the host's copy, the first in *first. */
uint64_t run_gpu(const table_t &t, const std::vector<uint8_t> &src, uint8_t *dsrc, uint8_t *ddst,
                 tide_cuda_copy_desc_t *dtable, int ctas, int unroll, int streaming,
                 uint64_t *first) {
    if (t.dst_end > kDstBytes || t.d.size() > 64) {
        std::fprintf(stderr, "test_batch_copy: a table does not fit its buffers\n");
        std::exit(2);
    }
    std::vector<uint8_t> want(kDstBytes), got(kDstBytes);
    expected(t, src, &want);
    const std::vector<tide_cuda_copy_desc_t> bound = bind(t, dsrc, ddst);
    for (uint64_t i = 0; i < kDstBytes; ++i)
        got[i] = guard_byte(i);
    CUDA_OK(cudaMemcpy(ddst, got.data(), kDstBytes, cudaMemcpyHostToDevice));
    CUDA_OK(
        cudaMemcpy(dtable, bound.data(), bound.size() * sizeof(bound[0]), cudaMemcpyHostToDevice));
    CUDA_OK(tide_cuda_batch_copy(dtable, (int)bound.size(), ctas, unroll, streaming, 0));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got.data(), ddst, kDstBytes, cudaMemcpyDeviceToHost));
    uint64_t wrong = 0;
    if (std::memcmp(got.data(), want.data(), kDstBytes) != 0)
        for (uint64_t i = 0; i < kDstBytes; ++i)
            if (got[i] != want[i] && wrong++ == 0) *first = i;
    return wrong;
}

} // namespace

int main() {
    std::mt19937_64 rng(20261207);
    std::vector<uint8_t> src(kSrcBytes);
    for (auto &b : src)
        b = (uint8_t)rng();
    uint8_t *dsrc, *ddst;
    tide_cuda_copy_desc_t *dtable;
    CUDA_OK(cudaMalloc(&dsrc, kSrcBytes));
    CUDA_OK(cudaMalloc(&ddst, kDstBytes));
    CUDA_OK(cudaMalloc(&dtable, 64 * sizeof(tide_cuda_copy_desc_t)));
    CUDA_OK(cudaMemcpy(dsrc, src.data(), kSrcBytes, cudaMemcpyHostToDevice));
    int failures = 0, cases = 0;
    /* Every variant (the default, TIDE_CUDA_BATCH_UNROLL / _STREAMING, among them) on grids of
     * one CTA, a few, the fabric's smallest (32) and its largest on an H100 or H200 (264). */
    for (int ctas : {1, 3, 32, 264})
        for (int unroll : {4, 8, 16})
            for (int streaming : {0, 1}) {
                const table_t t =
                    edge_table(rng, kSrcBytes, (uint64_t)ctas * TIDE_CUDA_BATCH_THREADS);
                uint64_t first = 0;
                const uint64_t wrong =
                    run_gpu(t, src, dsrc, ddst, dtable, ctas, unroll, streaming, &first);
                ++cases;
                if (wrong != 0) {
                    ++failures;
                    std::printf("FAIL ctas %d unroll %d streaming %d: %llu wrong bytes, first at "
                                "%llu\n",
                                ctas, unroll, streaming, (unsigned long long)wrong,
                                (unsigned long long)first);
                }
            }
    /* Random tables on the fabric's largest grid, each variant. */
    for (int round = 0; round < 8; ++round) {
        const table_t t = random_table(rng, kSrcBytes, 1 + (int)(rng() % 60));
        static const int unrolls[3] = {4, 8, 16};
        const int unroll = unrolls[round % 3];
        uint64_t first = 0;
        ++cases;
        if (run_gpu(t, src, dsrc, ddst, dtable, 264, unroll, round / 4, &first) != 0) {
            ++failures;
            std::printf("FAIL random table %d, unroll %d: first wrong byte at %llu\n", round,
                        unroll, (unsigned long long)first);
        }
    }
    /* Refusals: an unknown unroll, no table, no CTAs; an empty table enqueues nothing. */
    const bool refused = tide_cuda_batch_copy(dtable, 1, 1, 5, 0, 0) == cudaErrorInvalidValue &&
                         tide_cuda_batch_copy(nullptr, 1, 1, 4, 0, 0) == cudaErrorInvalidValue &&
                         tide_cuda_batch_copy(dtable, 1, 0, 4, 0, 0) == cudaErrorInvalidValue &&
                         tide_cuda_batch_copy(nullptr, 0, 0, 5, 0, 0) == cudaSuccess;
    ++cases;
    if (!refused) {
        ++failures;
        std::printf("FAIL the refusals of tide_cuda_batch_copy\n");
    }
    cudaFree(dsrc), cudaFree(ddst), cudaFree(dtable);
    std::printf("test_batch_copy: %d cases, %d failed\n", cases, failures);
    return failures == 0 ? 0 : 1;
}
