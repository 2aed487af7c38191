/*
 * batch_copy.cu - the batched copy kernel (batch_copy.h): every thread runs its share of the
 * table (tide_copy::copy_thread, batch_copy_thread.h, where the unit arithmetic and the
 * variants are described and which the CPU unit test runs too).
 */
#include "fabric/cuda/batch_copy.h"
#include "fabric/cuda/batch_copy_thread.h"

#include <stdint.h>

namespace {

template <int UNROLL, bool CS>
__global__ void batch_copy_kernel(const tide_cuda_copy_desc_t *table, int count) {
    tide_copy::copy_thread<UNROLL, CS>(table, count,
                                       (uint64_t)blockIdx.x * blockDim.x + threadIdx.x,
                                       (uint64_t)gridDim.x * blockDim.x);
}

template <int UNROLL>
cudaError_t launch(const tide_cuda_copy_desc_t *table, int count, int ctas, bool streaming,
                   cudaStream_t stream) {
    if (streaming)
        batch_copy_kernel<UNROLL, true><<<ctas, TIDE_CUDA_BATCH_THREADS, 0, stream>>>(table, count);
    else
        batch_copy_kernel<UNROLL, false>
            <<<ctas, TIDE_CUDA_BATCH_THREADS, 0, stream>>>(table, count);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t tide_cuda_batch_copy(const tide_cuda_copy_desc_t *table, int count, int ctas,
                                            int unroll, int streaming, cudaStream_t stream) {
    if (count <= 0) return cudaSuccess;
    if (table == nullptr || ctas < 1) return cudaErrorInvalidValue;
    switch (unroll) {
    case 4:
        return launch<4>(table, count, ctas, streaming != 0, stream);
    case 8:
        return launch<8>(table, count, ctas, streaming != 0, stream);
    case 16:
        return launch<16>(table, count, ctas, streaming != 0, stream);
    default:
        return cudaErrorInvalidValue;
    }
}
