/*
 * cuda_ok.h - CUDA_OK, the kernel tests' and benchmarks' check of a CUDA call (test_kernels,
 * bench_kernels, racecheck_min): a failure prints file, line, the call and CUDA's reason and
 * ends the program with exit status 2, which their usage lines keep apart from a wrong result
 * (1).  Header-only, for nvcc; it needs nothing of TIDE (racecheck_min links only cudart).
 */
#ifndef TIDE_TESTS_GPU_CUDA_OK_H_
#define TIDE_TESTS_GPU_CUDA_OK_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call,                   \
                         cudaGetErrorString(e_));                                                  \
            std::exit(2);                                                                          \
        }                                                                                          \
    } while (0)

#endif /* TIDE_TESTS_GPU_CUDA_OK_H_ */
