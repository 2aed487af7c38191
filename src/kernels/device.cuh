/*
 * device.cuh - device helpers shared by sum.cu, land.cu and cast.cu.
 *
 * Everything here mirrors reference.c bit for bit: fp32 adds and products go through the
 * __fadd_rn / __fmul_rn intrinsics, which the compiler never contracts into an FMA (the build
 * adds -fmad=false as a second guard), and NaN results take the canonical encodings.
 */
#ifndef TIDE_KERNELS_DEVICE_CUH_
#define TIDE_KERNELS_DEVICE_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/kernels.h"

namespace tide_dev {

constexpr uint32_t kCanonicalNanF32 = 0x7fffffffu;
constexpr uint16_t kCanonicalNanBf16 = 0x7fffu;

__device__ __forceinline__ float bf16_lo(uint32_t w) {
    return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t w) {
    return __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ float widen_bf16(uint16_t v) {
    return __uint_as_float((uint32_t)v << 16);
}

/* The value written to an fp32 output: NaN results take the canonical encoding. */
__device__ __forceinline__ float canonical(float v) {
    return isnan(v) ? __uint_as_float(kCanonicalNanF32) : v;
}

/* fp32 -> bf16, round to nearest even, in integer arithmetic exactly as reference.c. */
__device__ __forceinline__ uint32_t to_bf16(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return kCanonicalNanBf16;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* Element i of a bf16 or fp32 array, widened exactly. */
template <typename T> __device__ __forceinline__ float load_scalar(const T *p, uint64_t i);
template <> __device__ __forceinline__ float load_scalar<uint16_t>(const uint16_t *p, uint64_t i) {
    return widen_bf16(__ldg(p + i));
}
template <> __device__ __forceinline__ float load_scalar<float>(const float *p, uint64_t i) {
    return __ldg(p + i);
}

/* A 16-byte vector holds GE elements of T; the vector path moves one such group per thread. */
template <typename T> struct vec_traits { static constexpr int GE = 16 / (int)sizeof(T); };

/* Widen the 16-byte vector `v` of T into GE floats. */
template <typename T> __device__ __forceinline__ void unpack(const uint4 &v, float *f);
template <> __device__ __forceinline__ void unpack<uint16_t>(const uint4 &v, float *f) {
    f[0] = bf16_lo(v.x);
    f[1] = bf16_hi(v.x);
    f[2] = bf16_lo(v.y);
    f[3] = bf16_hi(v.y);
    f[4] = bf16_lo(v.z);
    f[5] = bf16_hi(v.z);
    f[6] = bf16_lo(v.w);
    f[7] = bf16_hi(v.w);
}
template <> __device__ __forceinline__ void unpack<float>(const uint4 &v, float *f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
}

__device__ __forceinline__ uint4 ldg16(const void *p) {
    return __ldg((const uint4 *)p);
}

/* One 16-byte store (p 16-byte aligned, in global memory).  Written as PTX because the
 * compiler split some float4 stores whose lanes come from selects into four 4-byte stores (seen
 * in the TMA sum's consumers), each of which makes the warp touch the same lines again. */
__device__ __forceinline__ void st16(float *p, float a, float b, float c, float d) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c),
                 "f"(d)
                 : "memory");
}

/*
 * The first element index h at which every address base_k + h*esize is 16-byte aligned, or
 * -1 when there is none (the addresses disagree modulo 16, or one is not even esize-aligned).
 * `mis_or` is the OR of (addr_k ^ addr_0) over the element-typed addresses; `out` is fp32.
 */
__device__ __forceinline__ int vector_head(uintptr_t addr0, uintptr_t mis_or, int esize,
                                           uintptr_t out) {
    if ((mis_or & 15u) != 0 || (addr0 % (uintptr_t)esize) != 0 || (out & 3u) != 0) return -1;
    int h = (int)(((16u - (addr0 & 15u)) & 15u) / (uintptr_t)esize);
    if (((out + 4u * (uintptr_t)h) & 15u) != 0) return -1;
    return h;
}

/* The chunk index of the first chunk that CTA `cta` owns when chunks are dealt round-robin
 * and `base` chunks precede this segment in the deal. */
__device__ __forceinline__ uint64_t first_chunk(uint64_t base, unsigned cta, unsigned grid) {
    return (uint64_t)((cta + grid - (unsigned)(base % grid)) % grid);
}

/* The CTA index and grid size that deal the chunks: launch `slice` of `slices` (slices <= 1:
 * the launch itself) plays CTAs [slice * gridDim.x, (slice + 1) * gridDim.x) of a grid of
 * slices * gridDim.x CTAs (tide_sum_args_t.slice). */
__device__ __forceinline__ unsigned deal_grid(int slices) {
    return slices > 1 ? gridDim.x * (unsigned)slices : gridDim.x;
}
__device__ __forceinline__ unsigned deal_cta(int slice, int slices) {
    return slices > 1 ? blockIdx.x + (unsigned)slice * gridDim.x : blockIdx.x;
}

} // namespace tide_dev

#endif /* TIDE_KERNELS_DEVICE_CUH_ */
