/*
 * batch_copy.h - one kernel launch for a run of same-device copies (docs/cuda-fabric.md,
 * "Batched copies").
 *
 * A copy within one GPU never uses a copy engine: cudaMemcpyAsync and cudaMemcpy2DAsync run
 * as SM kernels there, each with its own launch on the host and on the device.  The batched
 * path runs a whole run of copies as one kernel that reads a table of descriptors from device
 * memory.  It runs on SMs, exactly like the copies it replaces; copies between devices stay
 * on cudaMemcpyAsync (copy engines).
 *
 * Plain C (no CUDA types beyond cudaError_t / cudaStream_t), shared by the fabric's C files
 * and batch_copy.cu.
 */
#ifndef TIDE_FABRIC_CUDA_BATCH_COPY_H_
#define TIDE_FABRIC_CUDA_BATCH_COPY_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "fabric/cuda/batch_copy_thread.h"

#ifdef __cplusplus
extern "C" {
#endif

/* tide_cuda_copy_desc_t, one copy of a table: batch_copy_thread.h. */

/* Grid of the batched copy kernel, fixed per batch when the program is prepared (batch.c):
 * one CTA per TIDE_CUDA_BATCH_BYTES_PER_CTA bytes of the batch's copies, at least
 * TIDE_CUDA_BATCH_CTAS and at most TIDE_CUDA_BATCH_CTAS_PER_SM per SM of the device.  Most
 * batches are small (a few KiB to a few MiB in all) and run next to the landing and sum
 * kernels: the floor of 32 CTAs keeps them from taking the whole GPU, as the fixed 32-CTA
 * grid did.  A batch of many MiB crawled on 32 CTAs (one 64 MiB copy: 90 us, against 35 us
 * for a same-device cudaMemcpyAsync on an H200), so it grows with its bytes.  With four
 * 16-byte loads in flight per thread (batch_copy.cu), one CTA per SM moved that copy in 42 us
 * and two per SM in 36-37 us; more per SM gained nothing.  Threads grid-stride over the units
 * and each unit is written once by one thread, so any grid gives the same bytes. */
#define TIDE_CUDA_BATCH_CTAS 32
#define TIDE_CUDA_BATCH_CTAS_PER_SM 2
#define TIDE_CUDA_BATCH_BYTES_PER_CTA (256u << 10)
#define TIDE_CUDA_BATCH_THREADS 256
/* Units (16 bytes where aligned) each thread has in flight, and whether loads and stores are
 * marked evict-first: the kernel's default variant (TIDE_CUDA_BATCH_KERNEL unset). */
#define TIDE_CUDA_BATCH_UNROLL 4
#define TIDE_CUDA_BATCH_STREAMING 0

/* The grid above for a batch of `bytes` bytes of copies on a device of `sms` SMs. */
static inline int32_t tide_cuda_batch_grid(uint64_t bytes, uint64_t sms) {
    const uint64_t most = sms * TIDE_CUDA_BATCH_CTAS_PER_SM;
    const uint64_t cap = most > TIDE_CUDA_BATCH_CTAS ? most : TIDE_CUDA_BATCH_CTAS;
    const uint64_t want = bytes / TIDE_CUDA_BATCH_BYTES_PER_CTA +
                          (bytes % TIDE_CUDA_BATCH_BYTES_PER_CTA != 0);
    return (int32_t)(want < TIDE_CUDA_BATCH_CTAS ? TIDE_CUDA_BATCH_CTAS
                     : want > cap                ? cap
                                                 : want);
}

/* Enqueue the copies table[0 .. count) (a device pointer) on `stream` as one kernel launch
 * of `ctas` CTAs (any ctas >= 1 gives the same result), with the kernel's variant: `unroll`
 * units in flight per thread (4, 8 or 16) and, with streaming != 0, loads and stores marked
 * evict-first (the fabrics pass TIDE_CUDA_BATCH_KERNEL's, by default TIDE_CUDA_BATCH_UNROLL
 * and TIDE_CUDA_BATCH_STREAMING).  Every variant writes the same bytes.  The copies of one
 * table must not overlap each other's destinations (they run concurrently).  count <= 0
 * enqueues nothing; cudaErrorInvalidValue for another unroll. */
cudaError_t tide_cuda_batch_copy(const tide_cuda_copy_desc_t *table, int count, int ctas,
                                 int unroll, int streaming, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_FABRIC_CUDA_BATCH_COPY_H_ */
