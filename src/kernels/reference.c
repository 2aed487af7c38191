/*
 * reference.c - C references of the Level-1 sum, the landing and the fp32 -> bf16 cast.
 *
 * These are the oracle of the CUDA kernels (sum.cu, land.cu, cast.cu) and the arithmetic of
 * the CPU fabric, so they follow kernels.h's association order literally: one fp32 operation
 * per statement, each rounded to nearest even, nothing fused.
 *
 * Floating-point contraction: GCC contracts a*b+c into an FMA only under
 * -ffp-contract=fast, which is its default in GNU modes but not in ISO C modes (-std=c11,
 * what the build uses); clang contracts only within one expression.  The sum has no
 * products at all.  The landing's alpha*v goes through a volatile temporary, so the product
 * is rounded to fp32 before the add whatever the compiler mode.
 *
 * NaN payloads: the GPU's fp32 arithmetic returns the canonical NaN (0x7fffffff) whatever
 * NaN went in, while x86 returns the first operand's payload.  To stay bit-identical both
 * sides write every NaN result as the canonical NaN, and the cast writes the canonical bf16
 * NaN 0x7fff (what the GPU's cvt.rn.bf16.f32 and stock PyTorch produce).
 *
 * Inputs are internal (built by the program layer), so these functions validate nothing
 * beyond being safe for num_segs == 0 or a NULL segment table.
 */
#include "kernels/kernels.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* fp32 arithmetic must not be carried in wider registers (x87): each add rounds to fp32. */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "reference.c needs FLT_EVAL_METHOD == 0 (SSE or NEON fp32 arithmetic)"
#endif

#define TIDE_CANONICAL_NAN_F32 0x7fffffffu
#define TIDE_CANONICAL_NAN_BF16 0x7fffu

static inline uint32_t f32_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* The value written to an fp32 output: NaN results take the canonical encoding. */
static inline float canonical_f32(float v) {
    return isnan(v) ? f32_from_bits(TIDE_CANONICAL_NAN_F32) : v;
}

float tide_bf16_to_float(uint16_t v) {
    /* bf16 is the top half of an fp32: widening is exact, NaN payloads included. */
    return f32_from_bits((uint32_t)v << 16);
}

uint16_t tide_float_to_bf16(float v) {
    uint32_t u = f32_bits(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return TIDE_CANONICAL_NAN_BF16;
    /*
     * Round to nearest, ties to even, on the 16 dropped bits: add 0x7fff plus the lowest kept
     * bit, so an exact half rounds up only when that makes the kept part even.  A carry out of
     * the mantissa moves into the exponent, which is the correct next value (and turns the
     * largest finite values into Inf, as RNE must); Inf itself has zero dropped bits.
     */
    uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

void tide_ref_cast_bf16(const float *in, uint16_t *out, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i)
        out[i] = tide_float_to_bf16(in[i]);
}

/* Element i of a bf16 or fp32 array, widened exactly to fp32. */
static inline float load_elem(const void *base, tide_dtype_t dtype, uint64_t i) {
    if (dtype == TIDE_DTYPE_BF16) return tide_bf16_to_float(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

static const void *elem_ptr(const void *base, tide_dtype_t dtype, uint64_t i) {
    return (const char *)base + i * (uint64_t)tide_dtype_size(dtype);
}

/* The store of a fused sum (tide_sum_args_t.fused): what the landing would have written. */
static float fused_value(const tide_sum_fused_t *f, float acc, float old) {
    float v = acc;
    if (f->plus_zero) v = v + 0.0f;
    volatile float scaled = f->alpha * v; /* rounded before the add: no FMA */
    return canonical_f32(f->overwrite ? scaled : old + scaled);
}

void tide_ref_sum(const tide_sum_args_t *args) {
    if (args == NULL || args->segs == NULL) return;
    const tide_dtype_t dt = args->dtype;
    for (int s = 0; s < args->num_segs; ++s) {
        const tide_sum_seg_t *seg = &args->segs[s];
        const tide_sum_fused_t *fz = args->fused != NULL ? &args->fused[s] : NULL;
        float *out = fz != NULL ? fz->dst : args->out + seg->out_off;
        const uint32_t valid = seg->valid < seg->len ? seg->valid : seg->len;
        const void *own = valid > 0 ? elem_ptr(args->own[seg->own_idx], dt, seg->own_off) : NULL;
        const void *stage0 =
            valid > 0 && args->num_staged > 0 && args->peers == NULL
                ? elem_ptr(args->staged, dt, seg->stage_off)
                : NULL;
        for (uint32_t i = 0; i < valid; ++i) {
            float acc = 0.0f;
            if (args->num_staged == 0) {
                acc = load_elem(own, dt, i);
            } else {
                /* Staged contributions in local-rank order, then the own one. */
                for (int k = 0; k < args->num_staged; ++k) {
                    const float v =
                        args->peers != NULL
                            ? load_elem(args->peers[(size_t)k * (size_t)args->peer_stride +
                                                    (size_t)seg->own_idx],
                                        dt, seg->own_off + i)
                            : load_elem(stage0, dt, (uint64_t)k * args->stage_stride + i);
                    acc = k == 0 ? v : acc + v;
                }
                acc += load_elem(own, dt, i);
            }
            out[i] = fz != NULL ? fused_value(fz, canonical_f32(acc), out[i]) : canonical_f32(acc);
        }
        /* Padding rows read nothing and are written as +0. */
        for (uint32_t i = valid; i < seg->len; ++i)
            out[i] = fz != NULL ? fused_value(fz, 0.0f, out[i]) : 0.0f;
    }
}

void tide_ref_land(const tide_land_args_t *args) {
    if (args == NULL || args->segs == NULL) return;
    const bool overwrite = args->init && !args->accumulate;
    for (int s = 0; s < args->num_segs; ++s) {
        const tide_land_seg_t *seg = &args->segs[s];
        float *out = args->out + seg->out_off;
        const float *const *tab =
            args->in_table != NULL ? args->in_table + (size_t)s * (size_t)args->num_in : NULL;
        for (uint32_t i = 0; i < seg->len; ++i) {
            const uint64_t j = seg->in_off + i;
            float v = 0.0f;
            for (int k = 0; k < args->num_in; ++k) {
                /* A NULL table entry is an input known to be +0.0f. */
                float x;
                if (args->in_bf16) /* the lane's inputs (no in_table): widened exactly */
                    x = tide_bf16_to_float(((const uint16_t *)(const void *)args->in[k])[j]);
                else
                    x = tab == NULL ? args->in[k][j] : tab[k] != NULL ? tab[k][i] : 0.0f;
                v = k == 0 ? x : v + x;
            }
            if (args->plus_zero) v = v + 0.0f;
            /* The product is rounded to fp32 before the add: no FMA. */
            volatile float scaled = args->alpha * v;
            float r = overwrite ? scaled : out[i] + scaled;
            out[i] = canonical_f32(r);
        }
    }
}
