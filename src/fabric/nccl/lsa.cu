/*
 * lsa.cu - peer pointers of a symmetric window through NCCL 2.28's LSA API.
 *
 * ncclGetLsaPointer is a device function (nccl_device/core.h): it reads the window's device
 * descriptor.  One thread per LSA rank evaluates it; the host copies the results back once
 * per registration.  Only the header's inline functions are used: nothing links libnccl.
 */
/* NCCL's device headers have unused parameters (gin__funcs.h); the build uses -Werror. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <nccl_device.h>
#pragma GCC diagnostic pop

extern "C" cudaError_t tide_nccl_lsa_pointers(ncclWindow_t win, int n, void **dev_out,
                                              cudaStream_t stream);

static __global__ void lsa_pointers_kernel(ncclWindow_t win, int n, void **out) {
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = ncclGetLsaPointer(win, 0, i);
}

extern "C" cudaError_t tide_nccl_lsa_pointers(ncclWindow_t win, int n, void **dev_out,
                                              cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    const int threads = 128, blocks = (n + threads - 1) / threads;
    lsa_pointers_kernel<<<blocks, threads, 0, stream>>>(win, n, dev_out);
    return cudaGetLastError();
}
