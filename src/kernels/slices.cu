/*
 * slices.cu - the Level-1 sum and the landing as sliced launches (launch.h,
 * tide_cuda_sum_sliced; docs/interference.md, "Sliced launches").
 *
 * Every CTA of a launch walks the launch's whole segment table (sum_common.cuh: a few
 * dependent loads per segment, about 0.5 us each on an H200), so slices over the whole table
 * pay that walk once per launch: 16 us per launch at 16 segments.  The slices are therefore
 * groups of consecutive segments, each launch given only its group; a single segment larger
 * than a slice is cut into virtual-grid slices of its own, which walk one segment.
 */
#include "kernels/launch.h"

#include <cmath>

namespace {

constexpr int kMaxSlicesPerSegment = 4096;

double sum_elem_bytes(const tide_sum_args_t *a) {
    return 4.0 + (double)(a->num_staged + 1) * (a->dtype == TIDE_DTYPE_BF16 ? 2.0 : 4.0);
}
double land_elem_bytes(const tide_land_args_t *a) {
    return (a->in_bf16 ? 2.0 : 4.0) * (double)a->num_in + 4.0;
}

/* launch(first, count, slices, slice) for every launch of the plan over n segments. */
template <class Len, class Launch>
cudaError_t run_slices(int n, Len len, double per_elem, uint64_t slice_bytes, Launch launch,
                       int *launches_out) {
    int launches = 0;
    cudaError_t e = cudaSuccess;
    if (slice_bytes == 0) {
        e = launch(0, n, 0, 0);
        launches = n > 0;
    }
    const double cap = (double)slice_bytes;
    for (int i = 0; slice_bytes != 0 && i < n && e == cudaSuccess;) {
        const double b = (double)len(i) * per_elem;
        if (b > cap) {
            double want = std::ceil(b / cap);
            const int k = want > kMaxSlicesPerSegment ? kMaxSlicesPerSegment : (int)want;
            for (int s = 0; s < k && e == cudaSuccess; ++s, ++launches)
                e = launch(i, 1, k, s);
            ++i;
            continue;
        }
        int j = i;
        double acc = 0;
        while (j < n && acc + (double)len(j) * per_elem <= cap) {
            acc += (double)len(j) * per_elem;
            ++j;
        }
        e = launch(i, j - i, 0, 0);
        ++launches;
        i = j;
    }
    if (launches_out != nullptr) *launches_out = launches;
    return e;
}

} // namespace

extern "C" uint64_t tide_cuda_sum_bytes(const tide_sum_args_t *args,
                                        const tide_sum_seg_t *host_segs) {
    double b = 0;
    for (int i = 0; i < args->num_segs; ++i) b += (double)host_segs[i].len * sum_elem_bytes(args);
    return (uint64_t)b;
}

extern "C" uint64_t tide_cuda_land_bytes(const tide_land_args_t *args,
                                         const tide_land_seg_t *host_segs) {
    double b = 0;
    for (int i = 0; i < args->num_segs; ++i)
        b += (double)host_segs[i].len * land_elem_bytes(args);
    return (uint64_t)b;
}

extern "C" cudaError_t tide_cuda_sum_sliced(const tide_sum_args_t *args,
                                            const tide_sum_seg_t *host_segs, int ctas,
                                            int threads, uint64_t slice_bytes,
                                            cudaStream_t stream, int *launches_out) {
    if (args == NULL || (args->num_segs > 0 && host_segs == NULL)) return cudaErrorInvalidValue;
    return run_slices(
        args->num_segs, [&](int i) { return (uint64_t)host_segs[i].len; }, sum_elem_bytes(args),
        slice_bytes,
        [&](int first, int count, int slices, int slice) {
            tide_sum_args_t a = *args;
            a.segs = args->segs + first;
            a.num_segs = count;
            if (a.fused != NULL) a.fused += first;
            a.slices = slices;
            a.slice = slice;
            return tide_cuda_sum(&a, ctas, threads, stream);
        },
        launches_out);
}

extern "C" cudaError_t tide_cuda_land_sliced(const tide_land_args_t *args,
                                             const tide_land_seg_t *host_segs, int ctas,
                                             int threads, uint64_t slice_bytes,
                                             cudaStream_t stream, int *launches_out) {
    if (args == NULL || (args->num_segs > 0 && host_segs == NULL)) return cudaErrorInvalidValue;
    return run_slices(
        args->num_segs, [&](int i) { return (uint64_t)host_segs[i].len; },
        land_elem_bytes(args), slice_bytes,
        [&](int first, int count, int slices, int slice) {
            tide_land_args_t a = *args;
            a.segs = args->segs + first;
            a.num_segs = count;
            if (a.in_table != NULL) a.in_table += (size_t)first * (size_t)args->num_in;
            a.slices = slices;
            a.slice = slice;
            return tide_cuda_land(&a, ctas, threads, stream);
        },
        launches_out);
}
