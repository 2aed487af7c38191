/*
 * kernels.h - the arithmetic of TIDE-RS and mixed-precision TIDE-AG.
 *
 * Each kernel has a C reference (reference.c, always built, used by the CPU fabric) and a
 * CUDA launcher (*.cu, built with TIDE_WITH_CUDA).  The two must agree bit for bit, so the
 * association order below is part of the contract (paper §4.3):
 *
 *   Level-1 sum:  acc = staged[0]; acc += staged[1]; ... acc += staged[L-2]; acc += own
 *                 (staged contributions in local-rank order, then the own one; fp32, each add
 *                 rounded once, no FMA; bf16 inputs widened exactly).  Elements at or past a
 *                 segment's `valid` are padding rows: the output is +0.0f.
 *                 With no staged contributions (L = 1) acc = own.
 *   Landing:      v = in[0] + in[1] + ... + in[L-1]   (the L inbox blocks, GPU order; v = in[0]
 *                 for L = 1; bf16 inputs widened exactly), then out = init ? (accumulate ? out + alpha*v : alpha*v)
 *                                         : out + alpha*v
 *                 (alpha*v rounded, then the add rounded: no FMA).
 *   Cast:         fp32 -> bf16, round to nearest even; NaN stays NaN (quiet), Inf stays Inf.
 *   NaN results:  every NaN a kernel writes is canonical (fp32 0x7fffffff, bf16 0x7fff):
 *                 x86 keeps NaN payloads and the GPU does not, so only a canonical NaN lets
 *                 the two agree bit for bit.
 */
#ifndef TIDE_KERNELS_KERNELS_H_
#define TIDE_KERNELS_KERNELS_H_

#include "tide.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One contiguous run of the Level-1 sum: `len` output elements. */
typedef struct {
    uint64_t out_off;   /* element offset in the fp32 output block */
    uint64_t stage_off; /* element offset inside each staged contribution */
    uint64_t own_off;   /* element offset from own[own_idx] */
    uint32_t len;       /* elements in this segment */
    uint32_t valid;     /* elements [0, valid) are real rows; [valid, len) are padding (+0) */
    int32_t own_idx;    /* index into the own-gradient pointer table */
    int32_t pad_;
} tide_sum_seg_t;

/* Where a segment of a fused Level-1 sum is stored (tide_sum_args_t.fused). */
typedef struct {
    float *dst;        /* the landing's output at the segment's first element */
    float alpha;       /* the landing's alpha */
    uint8_t overwrite; /* the landing initialises the output (init and not accumulate) */
    uint8_t plus_zero; /* the landing added +0.0f inputs: the value is acc + 0.0f */
    uint8_t pad_[2];
} tide_sum_fused_t;

typedef struct {
    const tide_sum_seg_t *segs; /* host pointer (reference) or device pointer (CUDA) */
    int num_segs;
    const void *staged;         /* num_staged contributions, stage_stride elements apart */
    uint64_t stage_stride;
    int num_staged;             /* L - 1 in [0, TIDE_MAX_GPUS_PER_NODE - 1] */
    const void *const *own;     /* own gradient base pointers (device pointers for CUDA) */
    tide_dtype_t dtype;         /* bf16 or fp32 for staged and own */
    float *out;
    /* Optional (NULL: the staged block above).  When set, staged contribution k of a segment
     * is read in place at peers[k * peer_stride + own_idx] + own_off instead of at
     * staged + k * stage_stride + stage_off: the gradients of the other local ranks, for a
     * fabric that lets the sum read them where they are (the CUDA fabric when every rank of
     * a node shares one device).  The order of the adds does not change. */
    const void *const *peers;
    int peer_stride;
    /* Optional (NULL: out + out_off).  When set, segment s is not stored at out: it is stored
     * as the one landing that reads it would store it (a landing whose every other input is
     * +0.0f): v = plus_zero ? acc + 0.0f : acc (acc as stored above, padding +0), and
     * fused[s].dst[i] = overwrite ? alpha * v : dst[i] + alpha * v, NaN canonical, the same
     * bits as the sum followed by that landing. */
    const tide_sum_fused_t *fused;
    /* Optional (slices 0 or 1: the whole sum).  Launch `slice` of `slices`: the CTAs act as
     * CTAs [slice * grid, (slice + 1) * grid) of a grid of slices * grid CTAs, so each launch
     * does about 1/slices of the work and the slices together give the bits of one launch
     * (any grid gives the same bits).  Short launches let waiting kernels of other streams
     * take the SMs between two of them (docs/interference.md, "Sliced launches").  The C
     * reference ignores both and computes the whole sum. */
    int slice;
    int slices;
} tide_sum_args_t;

/* One contiguous run of a landing: `len` elements. */
typedef struct {
    uint64_t out_off; /* element offset in the fp32 output shard */
    uint64_t in_off;  /* element offset inside each inbox block */
    uint32_t len;
    uint32_t pad_;
} tide_land_seg_t;

typedef struct {
    const tide_land_seg_t *segs;
    int num_segs;
    const float *in[TIDE_MAX_GPUS_PER_NODE]; /* the L inbox blocks, in GPU order */
    int num_in;                              /* L */
    float *out;
    float alpha;
    bool init;       /* first landing of this call for these elements */
    bool accumulate; /* with init: add to the existing output */
    /* v = (in[0] + ... + in[num_in - 1]) + 0.0f: a landing that reads only the one input of
     * L that is not +0.0f (M = 1, compile_rs.c) keeps the bits of the L-input sum, which
     * turns a -0.0f partial into +0.0f. */
    bool plus_zero;
    /* The inputs hold bf16 values (in[k] then points at uint16_t items, in_off counts them),
     * widened exactly before the sum: the rail lane's inbox blocks and gradients (L = 1,
     * docs/protocol.md).  The widened value is the fp32 partial the generic programs' L = 1
     * Level-1 sum would have stored, so the bits do not change.  One input, no in_table (the
     * CUDA launcher returns cudaErrorInvalidValue otherwise); its CUDA kernel is a plain
     * element loop (land.cu, land_bf16_kernel). */
    bool in_bf16;
    /* Optional (NULL: in[k] + in_off).  When set, input k of segment s starts at
     * in_table[s * num_in + k] (the segment's first element); a NULL entry is an input known
     * to hold +0.0f, which is added as +0.0f without being read, so the bits do not change. */
    const float *const *in_table;
    int slice; /* launch `slice` of `slices`, as tide_sum_args_t.slice */
    int slices;
} tide_land_args_t;

/* C references (always available). */
void tide_ref_sum(const tide_sum_args_t *args);
void tide_ref_land(const tide_land_args_t *args);
void tide_ref_cast_bf16(const float *in, uint16_t *out, uint64_t n);
float tide_bf16_to_float(uint16_t v);
uint16_t tide_float_to_bf16(float v);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_KERNELS_KERNELS_H_ */
