/*
 * rows.c - the gradient pointer tables that a call's UPLOAD commands refresh (call.c,
 * issue_upload), allocated and released the same way on every CUDA fabric.
 *
 * Per call parity, one pinned block of one row per rank of this process (the upload's
 * source), and per rank a device row and the event its upload records.  The single-process
 * fabric holds all N ranks, rank r on device r % num_devices (prepare.c); a process of the
 * one-process-per-rank fabric holds its own rank on the current device (mp_execute.c).  The
 * host-side bookkeeping (last row, valid, in flight) stays with the executor's family: its
 * shape follows the family's layout.
 */
#include "core/checks.h"
#include "fabric/cuda/transport.h"

tide_result_t tide_cuda_rows_alloc(int n, int num_devices, size_t row_bytes,
                                   const void ***host_out, void **dev, cudaEvent_t *done) {
    void *pinned = NULL;
    TIDE_CUDA_CALL(cudaMallocHost(&pinned, (size_t)n * row_bytes),
                   "cudaMallocHost(gradient tables)");
    *host_out = pinned;
    for (int r = 0; r < n; ++r) {
        if (num_devices > 0) TIDE_CUDA_CALL(cudaSetDevice(r % num_devices), "cudaSetDevice");
        TIDE_CUDA_CALL(cudaMalloc(&dev[r], row_bytes), "cudaMalloc(gradient table)");
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&done[r], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags(upload)");
    }
    return TIDE_SUCCESS;
}

void tide_cuda_rows_release(int n, const void **host, void **dev, cudaEvent_t *done) {
    for (int r = 0; r < n; ++r) {
        if (dev != NULL && dev[r] != NULL) cudaFree(dev[r]);
        if (done != NULL && done[r] != NULL) cudaEventDestroy(done[r]);
    }
    if (host != NULL) cudaFreeHost((void *)host);
}
