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

#ifdef __cplusplus
extern "C" {
#endif

/* One copy: `rows` rows of `bytes` bytes, row i from src + i src_pitch to dst + i dst_pitch.
 * A flat copy has rows = 1.  Addresses are device (UVA) addresses. */
typedef struct {
    uint64_t dst;
    uint64_t src;
    uint64_t bytes;
    uint64_t rows;
    uint64_t src_pitch;
    uint64_t dst_pitch;
} tide_cuda_copy_desc_t;

/* CTA budget of the batched copy kernel.  The copies it replaces are small (a few KiB to a
 * few MiB each) and run next to the landing and sum kernels; a small fixed grid keeps the
 * batch from taking the whole GPU while 32 CTAs of 256 threads with 16-byte accesses still
 * move tens of GB/s per batch, and grid-striding makes any budget correct. */
#define TIDE_CUDA_BATCH_CTAS 32
#define TIDE_CUDA_BATCH_THREADS 256

/* Enqueue the copies table[0 .. count) (a device pointer) on `stream` as one kernel launch.
 * The copies of one table must not overlap each other's destinations (they run
 * concurrently).  count <= 0 enqueues nothing. */
cudaError_t tide_cuda_batch_copy(const tide_cuda_copy_desc_t *table, int count,
                                 cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_FABRIC_CUDA_BATCH_COPY_H_ */
