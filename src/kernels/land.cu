/*
 * land.cu - the landing of TIDE-RS on the GPU (kernels.h; paper §4.2).
 *
 * For every element of every segment: v = in[0] + in[1] + ... + in[L-1] (the L inbox blocks
 * in GPU order, fp32, each add rounded), then out = alpha*v when the landing initialises the
 * output without accumulating, else out + alpha*v (the product rounded before the add);
 * with plus_zero, v + 0.0f takes v's place (kernels.h).
 *
 * Same decomposition as the plain Level-1 sum (sum.cu): a scalar head brings every inbox
 * block and the output to a 16-byte boundary, then one 16-byte group of 4 elements per
 * thread, chunks of `threads` groups dealt round-robin to the CTAs, so any CTA budget gives
 * the same bits and no CTA waits for another.  Inbox pointers may be peer pointers: each
 * thread issues its L loads before the first add so that NVLink latency overlaps.
 */
#include "kernels/device.cuh"
#include "kernels/launch.h"

using namespace tide_dev;

namespace {

struct land_view {
    /* Inbox blocks at the segment's first element; nullptr: an input known to be +0.0f
     * (tide_land_args_t.in_table), added as +0.0f without a load. */
    const float *in[TIDE_MAX_GPUS_PER_NODE];
    float *out;
    uint32_t len;
    int vec;
    uint32_t head;
    uint64_t groups;
};

template <int L>
__device__ __forceinline__ land_view load_land_seg(const tide_land_args_t &a, int s) {
    const tide_land_seg_t *sp = a.segs + s;
    land_view v;
    v.len = __ldg(&sp->len);
    const uint64_t in_off = __ldg(&sp->in_off);
    v.out = a.out + __ldg(&sp->out_off);
    if (a.in_table != nullptr) {
        const unsigned long long *t = (const unsigned long long *)(a.in_table + (size_t)s * L);
#pragma unroll
        for (int k = 0; k < L; ++k)
            v.in[k] = (const float *)__ldg(t + k);
    } else {
#pragma unroll
        for (int k = 0; k < L; ++k)
            v.in[k] = a.in[k] + in_off;
    }
    /* Alignment is decided by the inputs that are read, and the output. */
    uintptr_t a0 = (uintptr_t)v.out, mis = 0;
#pragma unroll
    for (int k = L - 1; k >= 0; --k)
        if (v.in[k] != nullptr) a0 = (uintptr_t)v.in[k];
#pragma unroll
    for (int k = 0; k < L; ++k)
        if (v.in[k] != nullptr) mis |= (uintptr_t)v.in[k] ^ a0;
    const int h = vector_head(a0, mis, 4, (uintptr_t)v.out);
    v.vec = h >= 0;
    v.head = h > 0 ? ((uint32_t)h < v.len ? (uint32_t)h : v.len) : 0u;
    v.groups = v.len > v.head ? (v.len - v.head + 3) / 4 : 0;
    return v;
}

__device__ __forceinline__ float land_one(float v, float alpha, bool overwrite, float old,
                                          bool plus_zero) {
    const float scaled = __fmul_rn(alpha, plus_zero ? __fadd_rn(v, 0.0f) : v);
    return canonical(overwrite ? scaled : __fadd_rn(old, scaled));
}

template <int L>
__device__ __forceinline__ void land_element(const land_view &v, uint64_t e, float alpha,
                                             bool overwrite, bool plus_zero) {
    float s = v.in[0] != nullptr ? __ldg(v.in[0] + e) : 0.0f;
#pragma unroll
    for (int k = 1; k < L; ++k)
        s = __fadd_rn(s, v.in[k] != nullptr ? __ldg(v.in[k] + e) : 0.0f);
    v.out[e] = land_one(s, alpha, overwrite, overwrite ? 0.0f : v.out[e], plus_zero);
}

template <int L>
__device__ __forceinline__ void land_group(const land_view &v, uint64_t g, float alpha,
                                           bool overwrite, bool plus_zero) {
    const uint64_t e0 = v.head + g * 4;
    if (v.vec && e0 + 4 <= v.len) {
        uint4 in[L];
#pragma unroll
        for (int k = 0; k < L; ++k)
            in[k] = v.in[k] != nullptr ? ldg16(v.in[k] + e0) : make_uint4(0u, 0u, 0u, 0u);
        float4 old = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (!overwrite) old = *(const float4 *)(v.out + e0);
        float s[4], f[4];
        unpack<float>(in[0], s);
#pragma unroll
        for (int k = 1; k < L; ++k) {
            unpack<float>(in[k], f);
#pragma unroll
            for (int j = 0; j < 4; ++j)
                s[j] = __fadd_rn(s[j], f[j]);
        }
        st16(v.out + e0, land_one(s[0], alpha, overwrite, old.x, plus_zero),
             land_one(s[1], alpha, overwrite, old.y, plus_zero), land_one(s[2], alpha, overwrite, old.z, plus_zero),
             land_one(s[3], alpha, overwrite, old.w, plus_zero));
    } else {
#pragma unroll 1
        for (int j = 0; j < 4; ++j)
            if (e0 + j < v.len) land_element<L>(v, e0 + j, alpha, overwrite, plus_zero);
    }
}

template <int L> __global__ void __launch_bounds__(1024) land_kernel(const tide_land_args_t a) {
    const unsigned grid = deal_grid(a.slices), cta = deal_cta(a.slice, a.slices);
    const unsigned nthr = blockDim.x, tid = threadIdx.x;
    const bool overwrite = a.init && !a.accumulate;
    const float alpha = a.alpha;
    const bool plus_zero = a.plus_zero;
    uint64_t base = 0;
    for (int s = 0; s < a.num_segs; ++s) {
        if (__ldg(&a.segs[s].len) == 0) continue;
        const land_view v = load_land_seg<L>(a, s);
        uint64_t chunks = (v.groups + nthr - 1) / nthr;
        if (chunks == 0) chunks = 1;
        for (uint64_t c = first_chunk(base, cta, grid); c < chunks; c += grid) {
            if (c == 0 && tid < v.head) land_element<L>(v, tid, alpha, overwrite, plus_zero);
            const uint64_t g = c * nthr + tid;
            if (g < v.groups) land_group<L>(v, g, alpha, overwrite, plus_zero);
        }
        base += chunks;
    }
}

/*
 * The rail lane's landing (tide_land_args_t.in_bf16): one bf16 input, widened exactly, then
 * the same alpha product and add as land_one.  Plain element loop: each thread owns elements
 * e = k * (grid * threads) + (cta * threads + tid) of every segment, so any CTA budget, thread
 * count or slicing gives the bits of the C reference.  Not tuned (no 16-byte vectors).
 */
__global__ void __launch_bounds__(1024) land_bf16_kernel(const tide_land_args_t a) {
    const unsigned grid = deal_grid(a.slices), cta = deal_cta(a.slice, a.slices);
    const uint64_t stride = (uint64_t)grid * blockDim.x;
    const uint64_t first = (uint64_t)cta * blockDim.x + threadIdx.x;
    const bool overwrite = a.init && !a.accumulate;
    const uint16_t *in = (const uint16_t *)(const void *)a.in[0];
    for (int s = 0; s < a.num_segs; ++s) {
        const uint32_t len = __ldg(&a.segs[s].len);
        const uint16_t *src = in + __ldg(&a.segs[s].in_off);
        float *dst = a.out + __ldg(&a.segs[s].out_off);
        for (uint64_t e = first; e < len; e += stride)
            dst[e] = land_one(widen_bf16(__ldg(src + e)), a.alpha, overwrite,
                              overwrite ? 0.0f : dst[e], a.plus_zero);
    }
}

} // namespace

extern "C" cudaError_t tide_cuda_land(const tide_land_args_t *args, int ctas, int threads,
                                      cudaStream_t stream) {
    if (args == NULL || ctas < 1 || threads < 0 || threads > 1024 || threads % 32 != 0 ||
        (threads > 0 && threads < 64) || args->num_segs < 0 || args->num_in < 1 ||
        args->num_in > TIDE_MAX_GPUS_PER_NODE || args->slices < 0 || args->slice < 0 ||
        (args->slice > 0 && args->slice >= args->slices))
        return cudaErrorInvalidValue;
    /* bf16 inputs: the rail lane's one-input landings; no peer table there. */
    if (args->in_bf16 && (args->num_in != 1 || args->in_table != NULL))
        return cudaErrorInvalidValue;
    if (args->num_segs == 0) return cudaSuccess;
    if (args->segs == NULL || args->out == NULL) return cudaErrorInvalidValue;
    for (int k = 0; k < args->num_in; ++k)
        if (args->in[k] == NULL) return cudaErrorInvalidValue;
    if (threads == 0) threads = TIDE_LAND_THREADS;
    const tide_land_args_t &a = *args;
    if (a.in_bf16) {
        land_bf16_kernel<<<ctas, threads, 0, stream>>>(a);
        return cudaGetLastError();
    }
    switch (args->num_in) {
    case 1:
        land_kernel<1><<<ctas, threads, 0, stream>>>(a);
        break;
    case 2:
        land_kernel<2><<<ctas, threads, 0, stream>>>(a);
        break;
    case 3:
        land_kernel<3><<<ctas, threads, 0, stream>>>(a);
        break;
    case 4:
        land_kernel<4><<<ctas, threads, 0, stream>>>(a);
        break;
    case 5:
        land_kernel<5><<<ctas, threads, 0, stream>>>(a);
        break;
    case 6:
        land_kernel<6><<<ctas, threads, 0, stream>>>(a);
        break;
    case 7:
        land_kernel<7><<<ctas, threads, 0, stream>>>(a);
        break;
    default:
        land_kernel<8><<<ctas, threads, 0, stream>>>(a);
        break;
    }
    return cudaGetLastError();
}
