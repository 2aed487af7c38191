/*
 * slices.c - the Level-1 sums and landings of the CUDA fabrics as sliced launches
 * (TIDE_CUDA_SLICE_US; docs/interference.md, "Sliced launches").
 *
 * A sum CTA lives as long as its kernel: a long sum beside a GEMM that needs every SM for one
 * wave holds SMs for the whole sum, and the GEMM's displaced CTAs wait for it (a second wave,
 * about +100% for that GEMM).  Cut into launches of about TIDE_CUDA_SLICE_US each, one after
 * the other on the op's stream (tide_cuda_sum_sliced: groups of whole segments, a larger
 * segment cut into virtual-grid slices), a waiting GEMM gets the SMs when the running slice
 * ends.  The bits do not change.  Unset or 0: one launch per op, as before.
 *
 * The slice size is the op's logical bytes (what its elements read and write) at a fixed
 * rate per CTA, TIDE_CUDA_SLICE_RATE: the measured Level-1 sum and landing rates on an H200
 * are 100-125 GB/s per CTA (bench/results/h200-2026-12-03d, bench_kernels), so a slice lasts
 * about the target there, shorter on a faster part.  TIDE_CUDA_SLICES=K instead cuts every
 * sum and landing into about K launches whatever its size (the tests use it: their ops are
 * too small for a time target to cut them).
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"

#include <stdlib.h>

/* Bytes per microsecond per CTA assumed for the slice count (100 GB/s). */
#define TIDE_CUDA_SLICE_RATE 100000.0
#define TIDE_CUDA_SLICE_US_MAX 1000000
#define TIDE_CUDA_SLICES_MAX 4096

static tide_result_t env_int(const char *name, long max, const char *what, int *out) {
    const char *env = getenv(name);
    *out = 0;
    if (env == NULL || *env == '\0') return TIDE_SUCCESS;
    char *end = NULL;
    const long v = strtol(env, &end, 10);
    if (end == env || *end != '\0' || v < 0 || v > max)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "cuda fabric: %s=\"%.64s\" is not %s (0..%ld; 0 or unset: one launch "
                        "per sum and landing)",
                        name, env, what, max);
    *out = (int)v;
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_env_slicing(tide_cuda_slicing_t *out) {
    TIDE_CHECK(env_int("TIDE_CUDA_SLICE_US", TIDE_CUDA_SLICE_US_MAX,
                       "a slice length in microseconds", &out->us));
    return env_int("TIDE_CUDA_SLICES", TIDE_CUDA_SLICES_MAX, "a slice count", &out->count);
}

/* Logical bytes per slice: the time target at the assumed rate, or 1/count of the op. */
static uint64_t slice_bytes(double total, int ctas, const tide_cuda_slicing_t *sl) {
    double b = 0;
    if (sl->count > 1)
        b = total / (double)sl->count;
    else if (sl->count == 0 && sl->us > 0)
        b = TIDE_CUDA_SLICE_RATE * (double)(ctas > 0 ? ctas : 1) * (double)sl->us;
    return b <= 0 ? 0 : b < 1 ? 1 : (uint64_t)b;
}

cudaError_t tide_cuda_issue_sum(const tide_table_t *tb, const tide_sum_args_t *a, int ctas,
                                const tide_cuda_slicing_t *sl, cudaStream_t s, uint64_t *sliced) {
    const double total = (double)tide_cuda_sum_bytes(a, tb->sum_segs);
    int launches = 0;
    const cudaError_t e = tide_cuda_sum_sliced(a, tb->sum_segs, ctas, 0,
                                               slice_bytes(total, ctas, sl), s, &launches);
    if (launches > 1) *sliced += (uint64_t)(launches - 1);
    return e;
}

cudaError_t tide_cuda_issue_land(const tide_table_t *tb, const tide_land_args_t *a, int ctas,
                                 const tide_cuda_slicing_t *sl, cudaStream_t s, uint64_t *sliced) {
    const double total = (double)tide_cuda_land_bytes(a, tb->land_segs);
    int launches = 0;
    const cudaError_t e = tide_cuda_land_sliced(a, tb->land_segs, ctas, 0,
                                                slice_bytes(total, ctas, sl), s, &launches);
    if (launches > 1) *sliced += (uint64_t)(launches - 1);
    return e;
}
