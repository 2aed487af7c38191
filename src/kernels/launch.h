/*
 * launch.h - host launchers of the CUDA kernels (sum.cu, land.cu, cast.cu).
 *
 * The arithmetic contract and the argument structs are in kernels.h, which stays free of
 * CUDA types so that host-only C includes it; the declarations below need the CUDA runtime's
 * types and appear only where the CUDA headers are available (nvcc, or a build with
 * TIDE_HAVE_CUDA).  Every launcher:
 *   - enqueues on `stream` and returns at once; the result is the launch's cudaError_t
 *     (cudaErrorInvalidValue for arguments out of range, before anything is enqueued);
 *   - takes a CTA budget `ctas` >= 1 (the grid size: the kernels stride over their work, so any
 *     budget is correct and none polls another CTA) and `threads` per CTA, a multiple of 32 in
 *     [64, 1024], or 0 for the kernel's default;
 *   - reads segment tables and pointer tables from device memory (args->segs, args->own), and
 *     does nothing for num_segs == 0 or n == 0;
 *   - is bit-identical to its C reference for every CTA budget and thread count.
 */
#ifndef TIDE_KERNELS_LAUNCH_H_
#define TIDE_KERNELS_LAUNCH_H_

#include "kernels/kernels.h"

#if defined(__CUDACC__) || defined(TIDE_HAVE_CUDA)
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TIDE_SUM_AUTO = 0,  /* TIDE_SUM_DEFAULT_SM90 on sm_90+, else PLAIN */
    TIDE_SUM_PLAIN = 1, /* grid-stride, 16-byte vector loads into registers */
    TIDE_SUM_TMA = 2,   /* sm_90: producer warp, bulk copies into a shared ring, consumer warps */
    TIDE_SUM_ASYNC = 3, /* sm_80: per-thread cp.async into shared slots, several chunks ahead */
    TIDE_SUM_HYBRID = 4, /* sm_90: staged sources 0..R-1 through a bulk-copy ring, the others
                            straight into the consumers' registers (sum_hybrid.cuh) */
    TIDE_SUM_PLAIN2 = 5, /* U 16-byte groups a thread per chunk, all U * L loads issued before
                            the first add */
    TIDE_SUM_VARIANT_COUNT = 6
} tide_sum_variant_t;

/* The variant TIDE_SUM_AUTO takes on Hopper (chosen by tests/gpu/bench_kernels). */
#define TIDE_SUM_DEFAULT_SM90 TIDE_SUM_TMA

/* Defaults, the fastest configurations measured on an H200 (docs/kernels.md).  TMA: one
 * producer warp and eight consumer warps over a ring of two 112 KiB stages (the copy engine's
 * rate grows with the size of each bulk copy, not with the ring's depth); ASYNC: as many
 * threads as its shared slots allow (see tide_sum_launch_t). */
#define TIDE_SUM_PLAIN_THREADS 1024
#define TIDE_SUM_TMA_THREADS 288
#define TIDE_SUM_TMA_STAGE 114688
#define TIDE_SUM_TMA_SMEM (227 * 1024) /* capped at the device's opt-in maximum */
#define TIDE_LAND_THREADS 1024
#define TIDE_CAST_THREADS 1024

/* How to launch a Level-1 sum. */
typedef struct {
    tide_sum_variant_t variant;
    int ctas;        /* CTA budget (grid size) >= 1 */
    int threads;     /* per CTA; 0 = the variant's default.  TMA: 32 * (producers + 1) to 512.
                        ASYNC: at most what shared memory allows (S * L * 16 bytes a thread) */
    int smem_bytes;  /* TMA ring or ASYNC slots; 0 = default (TMA: TIDE_SUM_TMA_SMEM; ASYNC:
                        the device's opt-in maximum); PLAIN ignores it */
    int stage_bytes; /* TMA stage, one chunk of all L tiles: 16384, 32768, 65536, 73728 or
                        114688; 0 = TIDE_SUM_TMA_STAGE.  The ring must hold two stages */
    int producers;   /* TMA producer warps, 1 or 2; 0 = the default (2, with 320 threads,
                        when threads is 0 too; else 1).  HYBRID: 1 or 2; 0 = 1 */
    int groups;      /* PLAIN2: U = 2, 3 or 4 groups a thread per chunk, with at most 512,
                        384 or 256 threads (default: that maximum).  HYBRID: U = 2 or 4 groups
                        a consumer thread, at most 512 or 320 threads, producer warps included
                        (default 512).  0 = 2 */
    int bulk_sources; /* HYBRID: R, the staged sources 0..R-1 that travel by bulk copy, in
                         1..L-1 with L - R <= 6; 0 = L - 2 (R = 1 for L = 2).  Ignored for
                         L = 1 (PLAIN2 runs on the consumer threads).  The ring (smem_bytes, as
                         TMA's) must hold two stages of R * U * (threads - 32 * producers) * 16
                         bytes; stage_bytes is ignored */
} tide_sum_launch_t;

/* Level-1 sum with TIDE_SUM_AUTO, the given CTA budget and threads: 0 (the default) or a
 * count the chosen variant takes (TMA on sm_90+: at most 512). */
cudaError_t tide_cuda_sum(const tide_sum_args_t *args, int ctas, int threads, cudaStream_t stream);

/*
 * Level-1 sum with an explicit launch configuration.  A variant the device cannot run
 * (TMA and HYBRID below sm_90, ASYNC below sm_80) returns cudaErrorInvalidDeviceFunction.
 */
cudaError_t tide_cuda_sum_launch(const tide_sum_args_t *args, const tide_sum_launch_t *cfg,
                                 cudaStream_t stream);

/* Landing of args->num_in inbox blocks (device or peer pointers) into args->out. */
cudaError_t tide_cuda_land(const tide_land_args_t *args, int ctas, int threads,
                           cudaStream_t stream);

/*
 * The sum or the landing as launches of about `slice_bytes` logical bytes each (what their
 * elements read and write), one after the other on `stream`; 0: one launch.  Consecutive
 * segments are grouped up to that size, and each launch walks only its own group (a CTA
 * walks the whole table it is given: sliced over the whole table, every launch would pay
 * that walk); a segment larger than that is cut further into virtual-grid slices
 * (tide_sum_args_t.slice).  `host_segs`: a host copy of args->segs.  The bits are those of
 * one launch.  Between two launches a kernel of another stream that waits for SMs gets them,
 * so a long sum beside a one-wave GEMM costs it the rest of one slice instead of a second
 * wave (docs/interference.md, "Sliced launches").  *launches_out (may be NULL): launches.
 */
/* Logical bytes of a sum or landing (what its elements read and write): the size
 * tide_cuda_sum_sliced slices.  host_segs: a host copy of args->segs. */
uint64_t tide_cuda_sum_bytes(const tide_sum_args_t *args, const tide_sum_seg_t *host_segs);
uint64_t tide_cuda_land_bytes(const tide_land_args_t *args, const tide_land_seg_t *host_segs);
cudaError_t tide_cuda_sum_sliced(const tide_sum_args_t *args, const tide_sum_seg_t *host_segs,
                                 int ctas, int threads, uint64_t slice_bytes, cudaStream_t stream,
                                 int *launches_out);
cudaError_t tide_cuda_land_sliced(const tide_land_args_t *args, const tide_land_seg_t *host_segs,
                                  int ctas, int threads, uint64_t slice_bytes,
                                  cudaStream_t stream, int *launches_out);

/* out[i] = bf16(in[i]) for i < n, round to nearest even. */
cudaError_t tide_cuda_cast_bf16(const float *in, uint16_t *out, uint64_t n, int ctas, int threads,
                                cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* __CUDACC__ || TIDE_HAVE_CUDA */

#endif /* TIDE_KERNELS_LAUNCH_H_ */
