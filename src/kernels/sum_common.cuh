/*
 * sum_common.cuh - what the Level-1 sum variants (sum.cu, sum_tma.cuh, sum_async.cuh,
 * sum_plain2.cu, sum_hybrid.cuh) share: the per-segment view, the order of the adds, and the
 * global-memory paths for heads, partial groups, padding and unaligned segments.
 *
 * Work decomposition.  A segment is cut into a scalar head of h < GE elements (h brings
 * every source and the output to a 16-byte boundary at once) and then groups of GE elements,
 * one 16-byte vector of each source (GE = 8 for bf16, 4 for fp32).  Segments whose sources
 * disagree modulo 16 bytes have no vector path: h = 0 and every group is summed element by
 * element.  Groups are packed into chunks, and the chunks of all segments, in segment order,
 * are dealt round-robin to the CTAs: every CTA walks the segment table and takes chunk j when
 * j mod grid equals its index.  No prefix table and no atomic counter is needed, any grid
 * size gives the same bits, and a CTA exits when its last chunk is stored: no CTA ever waits
 * for another.
 */
#ifndef TIDE_KERNELS_SUM_COMMON_CUH_
#define TIDE_KERNELS_SUM_COMMON_CUH_

#include "kernels/device.cuh"

#include <atomic>
#include <type_traits>

namespace tide_sum {

using namespace tide_dev;

/* How a segment's results are stored: as they are (mode 0), or as the landing of a fused sum
 * would store them (tide_sum_args_t.fused): 1 overwrites with alpha * v, 2 adds alpha * v to
 * the output; v = acc + 0.0f with plus_zero. */
struct epi_t {
    float alpha;
    int mode;
    int plus_zero;
};

__device__ __forceinline__ float epi_value(const epi_t &ep, float x, float old) {
    const float v = ep.plus_zero ? __fadd_rn(x, 0.0f) : x;
    const float scaled = __fmul_rn(ep.alpha, v);
    return canonical(ep.mode == 1 ? scaled : __fadd_rn(old, scaled));
}

/* Store four results at p (16-byte aligned), through the epilogue. */
__device__ __forceinline__ void store4(const epi_t &ep, float *p, float a, float b, float c,
                                       float d) {
    if (ep.mode == 0) {
        st16(p, a, b, c, d);
        return;
    }
    float4 old = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (ep.mode == 2) old = *(const float4 *)p;
    st16(p, epi_value(ep, a, old.x), epi_value(ep, b, old.y), epi_value(ep, c, old.z),
         epi_value(ep, d, old.w));
}

/* One segment as every thread of a CTA sees it. */
template <typename T, int NS> struct seg_view {
    /* Staged contribution k at the segment's first element (NS > 0, valid > 0): in the staged
     * block, or in place in a peer's gradient (tide_sum_args_t.peers). */
    const T *src[NS > 0 ? NS : 1];
    const T *own; /* own contribution at the segment's first element (valid > 0) */
    float *out;
    epi_t ep;
    uint32_t len;
    uint32_t valid;
    int vec;         /* the vector path exists */
    uint32_t head;   /* elements summed one by one before the first group */
    uint64_t groups; /* groups of GE elements after the head */
};

template <typename T, int NS>
__device__ __forceinline__ seg_view<T, NS> load_seg(const tide_sum_args_t &a, int s) {
    constexpr int GE = vec_traits<T>::GE;
    const tide_sum_seg_t *sp = a.segs + s;
    seg_view<T, NS> v;
    v.len = __ldg(&sp->len);
    uint32_t valid = __ldg(&sp->valid);
    v.valid = valid < v.len ? valid : v.len;
    v.ep.mode = 0;
    v.ep.alpha = 1.0f;
    v.ep.plus_zero = 0;
    if (a.fused != nullptr) {
        const tide_sum_fused_t *f = a.fused + s;
        v.out = (float *)__ldg((const unsigned long long *)&f->dst);
        v.ep.alpha = __ldg(&f->alpha);
        const unsigned flags = __ldg((const unsigned *)&f->overwrite);
        v.ep.mode = (flags & 0xffu) ? 1 : 2;
        v.ep.plus_zero = (flags >> 8) & 0xffu;
    } else {
        v.out = a.out + __ldg(&sp->out_off);
    }
#pragma unroll
    for (int k = 0; k < (NS > 0 ? NS : 1); ++k)
        v.src[k] = nullptr;
    v.own = nullptr;
    int h;
    if (v.valid > 0) {
        /* The pointer tables live in device memory; read them through the read-only path. */
        const int own_idx = __ldg(&sp->own_idx);
        const uint64_t own_off = __ldg(&sp->own_off);
        const unsigned long long own_base =
            __ldg((const unsigned long long *)(a.own + own_idx));
        v.own = (const T *)own_base + own_off;
        uintptr_t a0 = (uintptr_t)v.own, mis = 0;
        if (a.peers != nullptr) {
#pragma unroll
            for (int k = 0; k < NS; ++k) {
                const unsigned long long b = __ldg(
                    (const unsigned long long *)(a.peers + (size_t)k * a.peer_stride + own_idx));
                v.src[k] = (const T *)b + own_off;
                mis |= (uintptr_t)v.src[k] ^ a0;
            }
        } else {
            const T *stage = (const T *)a.staged + __ldg(&sp->stage_off);
#pragma unroll
            for (int k = 0; k < NS; ++k) {
                v.src[k] = stage + (uint64_t)k * a.stage_stride;
                mis |= (uintptr_t)v.src[k] ^ a0;
            }
        }
        h = vector_head(a0, mis, (int)sizeof(T), (uintptr_t)v.out);
    } else {
        /* Only padding: the vector path needs the output aligned alone. */
        uintptr_t o = (uintptr_t)v.out;
        h = (o & 3u) ? -1 : (int)(((16u - (o & 15u)) & 15u) / 4u);
    }
    v.vec = h >= 0;
    v.head = h > 0 ? ((uint32_t)h < v.len ? (uint32_t)h : v.len) : 0u;
    v.groups = v.len > v.head ? (v.len - v.head + GE - 1) / GE : 0;
    return v;
}

/* out[e] for one real element, in the contract's order. */
template <typename T, int NS>
__device__ __forceinline__ float sum_scalar(const seg_view<T, NS> &v, uint64_t e) {
    if (NS == 0) return load_scalar(v.own, e);
    float acc = load_scalar(v.src[0], e);
#pragma unroll
    for (int k = 1; k < NS; ++k)
        acc = __fadd_rn(acc, load_scalar(v.src[k], e));
    return __fadd_rn(acc, load_scalar(v.own, e));
}

/* Sum GE elements from L unpacked vectors (staged in order, own last) and store them.  RAW
 * (used with L >= 2 only) stores the last add's results as they are: the GPU's fp32 add
 * already returns the canonical NaN 0x7fffffff (see sum_store_unit). */
template <typename T, int NS, bool RAW = false>
__device__ __forceinline__ void sum_store(const uint4 *vin, float *out, const epi_t &ep) {
    constexpr int GE = vec_traits<T>::GE;
    float acc[GE], f[GE];
    unpack<T>(vin[0], acc);
#pragma unroll
    for (int k = 1; k <= NS; ++k) {
        unpack<T>(vin[k], f);
#pragma unroll
        for (int j = 0; j < GE; ++j)
            acc[j] = __fadd_rn(acc[j], f[j]);
    }
#pragma unroll
    for (int j = 0; j < GE; j += 4) {
        if (RAW && NS > 0)
            store4(ep, out + j, acc[j], acc[j + 1], acc[j + 2], acc[j + 3]);
        else
            store4(ep, out + j, canonical(acc[j]), canonical(acc[j + 1]), canonical(acc[j + 2]),
                   canonical(acc[j + 3]));
    }
}

/* Group g of a segment is a whole 16-byte vector of real rows in every source: it may travel
 * by vector loads or bulk copies.  Such groups are the leading ones of a segment. */
template <typename T, int NS>
__device__ __forceinline__ bool vec_full(const seg_view<T, NS> &v, uint64_t g) {
    return v.vec && v.head + (g + 1) * (uint64_t)vec_traits<T>::GE <= v.valid;
}

/* How many leading groups of chunk c (tg groups a chunk) are whole vectors of real rows. */
template <typename T, int NS>
__device__ __forceinline__ uint32_t full_groups(const seg_view<T, NS> &v, uint64_t c, uint32_t tg) {
    constexpr int GE = vec_traits<T>::GE;
    if (!v.vec || v.valid <= v.head) return 0;
    const uint64_t full = (v.valid - v.head) / GE, first = c * tg;
    if (full <= first) return 0;
    return (uint32_t)(full - first < (uint64_t)tg ? full - first : (uint64_t)tg);
}

/*
 * Units of four elements, the consumers' share in the TMA sum: four elements of every source
 * (8 bytes of bf16, 16 of fp32) summed into one 16-byte fp32 store, so that consecutive threads
 * store consecutive 16 bytes (a warp's store covers 512 contiguous bytes: four full lines)
 * while their shared-memory loads stay contiguous too (conflict-free).
 */
template <typename T> struct unit_traits;
template <> struct unit_traits<uint16_t> {
    using V = uint2;
};
template <> struct unit_traits<float> {
    using V = uint4;
};

__device__ __forceinline__ void unpack4(const uint2 &v, float *f) {
    f[0] = bf16_lo(v.x);
    f[1] = bf16_hi(v.x);
    f[2] = bf16_lo(v.y);
    f[3] = bf16_hi(v.y);
}
__device__ __forceinline__ void unpack4(const uint4 &v, float *f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
}

/* Sum one unit from L unpacked sources (staged in order, own last) and store it.  RAW (L >= 2
 * only) stores the last add's results as they are: a NaN the GPU's fp32 add returns is already
 * the canonical 0x7fffffff, so the select of canonical() is redundant there. */
template <typename T, int NS, bool RAW>
__device__ __forceinline__ void sum_store_unit(const typename unit_traits<T>::V *vin, float *out,
                                               const epi_t &ep) {
    float acc[4], f[4];
    unpack4(vin[0], acc);
#pragma unroll
    for (int k = 1; k <= NS; ++k) {
        unpack4(vin[k], f);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            acc[j] = __fadd_rn(acc[j], f[j]);
    }
    if (RAW && NS > 0)
        store4(ep, out, acc[0], acc[1], acc[2], acc[3]);
    else
        store4(ep, out, canonical(acc[0]), canonical(acc[1]), canonical(acc[2]), canonical(acc[3]));
}

/* One element by element: real or padding. */
template <typename T, int NS>
__device__ __forceinline__ void do_element(const seg_view<T, NS> &v, uint64_t e) {
    const float x = e < v.valid ? canonical(sum_scalar(v, e)) : 0.0f;
    v.out[e] = v.ep.mode == 0 ? x : epi_value(v.ep, x, v.ep.mode == 2 ? v.out[e] : 0.0f);
}

/* Group g of a segment from global memory, whatever its kind. */
template <typename T, int NS>
__device__ __forceinline__ void do_group(const seg_view<T, NS> &v, uint64_t g) {
    constexpr int GE = vec_traits<T>::GE;
    const uint64_t e0 = v.head + g * GE;
    if (v.vec && e0 + GE <= v.valid) {
        uint4 in[NS + 1];
#pragma unroll
        for (int k = 0; k < NS; ++k)
            in[k] = ldg16(v.src[k] + e0);
        in[NS] = ldg16(v.own + e0);
        sum_store<T, NS>(in, v.out + e0, v.ep);
    } else if (v.vec && e0 >= v.valid && e0 + GE <= v.len) {
#pragma unroll
        for (int j = 0; j < GE; j += 4)
            store4(v.ep, v.out + e0 + j, 0.0f, 0.0f, 0.0f, 0.0f);
    } else {
        /* Rolled: unrolling would hoist GE * L scalar loads and spill. */
#pragma unroll 1
        for (int j = 0; j < GE; ++j)
            if (e0 + j < v.len) do_element(v, e0 + j);
    }
}

/* Sources FIRST .. FIRST + N - 1 (staged in order, own = NS) of the group at element e0. */
template <typename T, int NS, int FIRST, int N>
__device__ __forceinline__ void load_sources(const seg_view<T, NS> &v, uint64_t e0, uint4 *out) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const int s = FIRST + j;
        out[j] = ldg16(s < NS ? v.src[s < NS ? s : 0] + e0 : v.own + e0);
    }
}

/* Chunks of a segment when a chunk holds `per_chunk` groups (at least one: the head). */
template <typename T, int NS>
__device__ __forceinline__ uint64_t chunk_count(const seg_view<T, NS> &v, uint32_t per_chunk) {
    const uint64_t chunks = (v.groups + per_chunk - 1) / per_chunk;
    return chunks == 0 ? 1 : chunks;
}

/*
 * The sequence of (segment, chunk) pairs one CTA owns, walked one step at a time; the
 * pipelined variants keep two of these, one issuing copies ahead of the one summing.
 */
template <typename T, int NS> struct chunk_cursor {
    seg_view<T, NS> v;
    int s;           /* current segment */
    uint64_t c;      /* current chunk inside it */
    uint64_t chunks; /* chunks of the current segment */
    uint64_t base;   /* chunks dealt before the current segment */
    bool done;
};

template <typename T, int NS>
__device__ __forceinline__ void cursor_seek(chunk_cursor<T, NS> &k, const tide_sum_args_t &a,
                                            uint32_t per_chunk) {
    for (;;) {
        k.base += k.chunks;
        k.chunks = 0;
        if (++k.s >= a.num_segs) {
            k.done = true;
            return;
        }
        if (__ldg(&a.segs[k.s].len) == 0) continue;
        k.v = load_seg<T, NS>(a, k.s);
        k.chunks = chunk_count(k.v, per_chunk);
        k.c = first_chunk(k.base, deal_cta(a.slice, a.slices), deal_grid(a.slices));
        if (k.c < k.chunks) return;
    }
}

template <typename T, int NS>
__device__ __forceinline__ void cursor_start(chunk_cursor<T, NS> &k, const tide_sum_args_t &a,
                                             uint32_t per_chunk) {
    k.s = -1;
    k.c = 0;
    k.chunks = 0;
    k.base = 0;
    k.done = false;
    cursor_seek(k, a, per_chunk);
}

template <typename T, int NS>
__device__ __forceinline__ void cursor_next(chunk_cursor<T, NS> &k, const tide_sum_args_t &a,
                                            uint32_t per_chunk) {
    k.c += deal_grid(a.slices);
    if (k.c >= k.chunks) cursor_seek(k, a, per_chunk);
}

/* f(std::integral_constant<int, NS>{}) for the run-time count of staged sources NS. */
template <typename F> cudaError_t with_ns(int ns, F &&f) {
    switch (ns) {
    case 0:
        return f(std::integral_constant<int, 0>{});
    case 1:
        return f(std::integral_constant<int, 1>{});
    case 2:
        return f(std::integral_constant<int, 2>{});
    case 3:
        return f(std::integral_constant<int, 3>{});
    case 4:
        return f(std::integral_constant<int, 4>{});
    case 5:
        return f(std::integral_constant<int, 5>{});
    case 6:
        return f(std::integral_constant<int, 6>{});
    case 7:
        return f(std::integral_constant<int, 7>{});
    default:
        return cudaErrorInvalidValue;
    }
}

/* Raise a kernel's dynamic shared-memory limit to the device's opt-in maximum, once per
 * device (bit `dev` of `raised`). */
template <typename K>
cudaError_t raise_smem_limit(K *kernel, std::atomic<uint64_t> &raised, int dev, int optin) {
    const uint64_t bit = dev < 64 ? (1ull << dev) : 0ull;
    if (bit != 0 && (raised.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
    if (err == cudaSuccess) raised.fetch_or(bit, std::memory_order_relaxed);
    return err;
}

} // namespace tide_sum

#endif /* TIDE_KERNELS_SUM_COMMON_CUH_ */
