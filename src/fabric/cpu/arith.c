/*
 * arith.c - the CPU fabric's Level-1 sum and landing: the bits of kernels/reference.c, four
 * lanes at a time.
 *
 * Why not call the references: they are the oracle, written one element and one statement at
 * a time (dtype, peer table and NaN checks inside the element loop), which no compiler turns
 * into vector code.  On the main job (tide-bench, 2x4) they made TIDE-RS 2-3x slower than the
 * stock path's plain loops although TIDE moves fewer bytes (docs/cpu-fabric.md).
 *
 * Same bits: every element sees the same fp32 operations in the same order as in the
 * reference (kernels.h's association order), only several elements at once.  A segment is
 * processed in blocks of BLOCK elements: the block's accumulator is initialised from the
 * first input, each further input is added with one rounded add, then the final value is
 * scaled, added and canonicalised in separate loops, so no product and add can be contracted
 * into an FMA.  GCC vector extensions (GCC and clang) give 4-lane code at -O2 on any target.
 */
#include "fabric/cpu/cpu.h"
#include "kernels/kernels.h"

#include <string.h>

/* 128-bit vectors: the width of baseline x86-64 (SSE2) and of NEON, so every operation,
 * the NaN compare included, is one instruction (wider generic vectors get some of their
 * compares split into scalar code on SSE2). */
typedef float vf __attribute__((vector_size(16)));
typedef uint32_t vu __attribute__((vector_size(16)));
typedef uint16_t vh __attribute__((vector_size(8)));

#define LANES 4
/* A block's accumulator stays in L1: 8 KiB. */
#define BLOCK 2048
#define CANONICAL_NAN_F32 0x7fffffffu

/* ------------------------------------------------------------------ loads and stores */

/* Vectors live only in locals: a vector parameter or return value would change the ABI
 * with the target (-Wpsabi), a local does not. */

/* v = LANES elements at p, widened exactly to fp32: bf16 is the top half of an fp32, NaN
 * payloads included. */
#define LOAD_BF16(v, p)                                                                       \
    do {                                                                                      \
        vh h_;                                                                                \
        memcpy(&h_, (p), sizeof h_);                                                          \
        vu u_ = __builtin_convertvector(h_, vu) << 16;                                        \
        memcpy(&(v), &u_, sizeof(v));                                                         \
    } while (0)
#define LOAD_F32(v, p) memcpy(&(v), (p), sizeof(v))

static inline float load_elem(const void *base, tide_dtype_t dt, uint64_t i) {
    if (dt != TIDE_DTYPE_BF16) return ((const float *)base)[i];
    const uint32_t u = (uint32_t)((const uint16_t *)base)[i] << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* ------------------------------------------------------------------ block steps */

/* acc = x (k = 0 of the association order).  A NULL input is +0.0f. */
static void block_init(float *acc, const void *x, tide_dtype_t dt, uint32_t n) {
    uint32_t i = 0;
    if (x == NULL) {
        for (; i < n; ++i) acc[i] = 0.0f;
        return;
    }
    /* One loop per dtype: the element loops carry no dtype test. */
    if (dt == TIDE_DTYPE_BF16) {
        for (; i + LANES <= n; i += LANES) {
            vf v;
            LOAD_BF16(v, (const uint16_t *)x + i);
            memcpy(acc + i, &v, sizeof v);
        }
    } else {
        memcpy(acc, x, (size_t)n * sizeof(float));
        return;
    }
    for (; i < n; ++i) acc[i] = load_elem(x, dt, i);
}

/* acc += x, one rounded add per element.  A NULL input is +0.0f, and it is still added
 * (-0.0f + +0.0f is +0.0f). */
static void block_add(float *acc, const void *x, tide_dtype_t dt, uint32_t n) {
    uint32_t i = 0;
    if (x == NULL) {
        const vf zero = {0};
        for (; i + LANES <= n; i += LANES) {
            vf a;
            memcpy(&a, acc + i, sizeof a);
            a = a + zero;
            memcpy(acc + i, &a, sizeof a);
        }
        for (; i < n; ++i) acc[i] = acc[i] + 0.0f;
        return;
    }
    if (dt == TIDE_DTYPE_BF16) {
        for (; i + LANES <= n; i += LANES) {
            vf a, v;
            memcpy(&a, acc + i, sizeof a);
            LOAD_BF16(v, (const uint16_t *)x + i);
            a = a + v;
            memcpy(acc + i, &a, sizeof a);
        }
    } else {
        for (; i + LANES <= n; i += LANES) {
            vf a, v;
            memcpy(&a, acc + i, sizeof a);
            LOAD_F32(v, (const float *)x + i);
            a = a + v;
            memcpy(acc + i, &a, sizeof a);
        }
    }
    for (; i < n; ++i) acc[i] = acc[i] + load_elem(x, dt, i);
}

/* acc *= alpha, rounded: a statement (and loop) of its own, so no FMA with the add after it. */
static void block_scale(float *acc, float alpha, uint32_t n) {
    uint32_t i = 0;
    const vf a = {alpha, alpha, alpha, alpha};
    for (; i + LANES <= n; i += LANES) {
        vf v;
        memcpy(&v, acc + i, sizeof v);
        v = v * a;
        memcpy(acc + i, &v, sizeof v);
    }
    for (; i < n; ++i) acc[i] = acc[i] * alpha;
}

static inline float canonical(float v) {
    if (v == v) return v;
    const uint32_t u = CANONICAL_NAN_F32;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* out[0, LANES) = canonical(v), or canonical(out + v) when add. */
#define STORE_CANONICAL(out, v, add)                                                          \
    do {                                                                                      \
        vf r_ = (v);                                                                         \
        if (add) {                                                                            \
            vf o_;                                                                           \
            memcpy(&o_, (out), sizeof o_);                                                    \
            r_ = o_ + r_;                                                                     \
        }                                                                                     \
        const vu nan_ = (vu)(r_ != r_); /* all ones in NaN lanes */                         \
        vu u_;                                                                               \
        memcpy(&u_, &r_, sizeof u_);                                                          \
        u_ = (nan_ & CANONICAL_NAN_F32) | (~nan_ & u_);                                       \
        memcpy((out), &u_, sizeof u_);                                                        \
    } while (0)

/* out = canonical(overwrite ? acc : out + acc). */
static void block_store(float *out, const float *acc, bool overwrite, uint32_t n) {
    uint32_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        vf v;
        memcpy(&v, acc + i, sizeof v);
        STORE_CANONICAL(out + i, v, !overwrite);
    }
    for (; i < n; ++i) out[i] = canonical(overwrite ? acc[i] : out[i] + acc[i]);
}

/* ------------------------------------------------------------------ the sum */

static const void *elem_ptr(const void *base, tide_dtype_t dt, uint64_t i) {
    return (const char *)base + i * (uint64_t)tide_dtype_size(dt);
}

/* Segment s's values v[0, len): staged contributions then the own one (valid elements), +0
 * past valid; then stored as tide_ref_sum stores them (fused or not). */
static void sum_segment(const tide_sum_args_t *a, int s, float *acc) {
    const tide_sum_seg_t *seg = &a->segs[s];
    const tide_dtype_t dt = a->dtype;
    const tide_sum_fused_t *fz = a->fused != NULL ? &a->fused[s] : NULL;
    float *out = fz != NULL ? fz->dst : a->out + seg->out_off;
    const uint32_t valid = seg->valid < seg->len ? seg->valid : seg->len;
    for (uint32_t b = 0; b < seg->len; b += BLOCK) {
        const uint32_t n = seg->len - b < BLOCK ? seg->len - b : BLOCK;
        const uint32_t nv = valid > b ? (valid - b < n ? valid - b : n) : 0;
        if (nv > 0) {
            const void *own = elem_ptr(a->own[seg->own_idx], dt, seg->own_off + b);
            if (a->num_staged == 0) {
                block_init(acc, own, dt, nv);
            } else {
                for (int k = 0; k < a->num_staged; ++k) {
                    const void *x =
                        a->peers != NULL
                            ? elem_ptr(a->peers[(size_t)k * (size_t)a->peer_stride +
                                                (size_t)seg->own_idx],
                                       dt, seg->own_off + b)
                            : elem_ptr(a->staged, dt,
                                       seg->stage_off + (uint64_t)k * a->stage_stride + b);
                    (k == 0 ? block_init : block_add)(acc, x, dt, nv);
                }
                block_add(acc, own, dt, nv);
            }
        }
        block_init(acc + nv, NULL, dt, n - nv); /* padding rows: +0, nothing read */
        if (fz == NULL) {
            block_store(out + b, acc, true, n);
            continue;
        }
        /* As the landing would store it: (acc + 0.0f) * alpha, then overwrite or add.  The
         * NaN of acc need not be made canonical first: any NaN stays NaN to the store. */
        if (fz->plus_zero) block_add(acc, NULL, dt, n);
        block_scale(acc, fz->alpha, n);
        block_store(out + b, acc, fz->overwrite != 0, n);
    }
}

void tide_cpu_sum(const tide_sum_args_t *args) {
    if (args == NULL || args->segs == NULL) return;
    float acc[BLOCK];
    for (int s = 0; s < args->num_segs; ++s) sum_segment(args, s, acc);
}

/* ------------------------------------------------------------------ the landing */

void tide_cpu_land(const tide_land_args_t *args) {
    if (args == NULL || args->segs == NULL) return;
    const bool overwrite = args->init && !args->accumulate;
    /* The rail lane lands bf16 blocks (no in_table there): widened exactly, as the sums do. */
    const tide_dtype_t dt = args->in_bf16 ? TIDE_DTYPE_BF16 : TIDE_DTYPE_FP32;
    const uint64_t item = args->in_bf16 ? 2 : 4;
    float acc[BLOCK];
    for (int s = 0; s < args->num_segs; ++s) {
        const tide_land_seg_t *seg = &args->segs[s];
        const float *const *tab =
            args->in_table != NULL ? args->in_table + (size_t)s * (size_t)args->num_in : NULL;
        for (uint32_t b = 0; b < seg->len; b += BLOCK) {
            const uint32_t n = seg->len - b < BLOCK ? seg->len - b : BLOCK;
            for (int k = 0; k < args->num_in; ++k) {
                const void *x = tab == NULL ? (const void *)((const uint8_t *)args->in[k] +
                                                             (seg->in_off + b) * item)
                                : tab[k] != NULL ? (const void *)(tab[k] + b)
                                                 : NULL;
                (k == 0 ? block_init : block_add)(acc, x, dt, n);
            }
            if (args->num_in == 0) block_init(acc, NULL, TIDE_DTYPE_FP32, n);
            /* The M = 1 landing of one input keeps the bits of the L-input one (-0 + +0). */
            if (args->plus_zero) block_add(acc, NULL, TIDE_DTYPE_FP32, n);
            block_scale(acc, args->alpha, n);
            block_store(args->out + seg->out_off + b, acc, overwrite, n);
        }
    }
}

/* ------------------------------------------------------------------ the cast */

void tide_cpu_cast_bf16(const float *in, uint16_t *out, uint64_t n) {
    uint64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        vu u;
        memcpy(&u, in + i, sizeof u);
        /* Round to nearest even on the dropped 16 bits (tide_float_to_bf16); NaN -> 0x7fff. */
        const vu nan = (vu)((u & 0x7fffffffu) > 0x7f800000u);
        const vu r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        const vu h32 = (nan & 0x7fffu) | (~nan & r);
        const vh h = __builtin_convertvector(h32, vh);
        memcpy(out + i, &h, sizeof h);
    }
    for (; i < n; ++i) out[i] = tide_float_to_bf16(in[i]);
}
