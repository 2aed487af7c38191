/*
 * gpu_util.h - what the CUDA-fabric benchmarks share: checks that end the program on a CUDA
 * or TIDE error (naming the call and its line), host and event timers, and the statistics
 * their tables report.  Header-only, for nvcc (C++17).
 */
#ifndef TIDE_TESTS_GPU_UTIL_H_
#define TIDE_TESTS_GPU_UTIL_H_

#include "tide.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

/* A failed CUDA call: file, line, the call and CUDA's reason, then exit status 1. */
#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* A failed TIDE call: the result string and the library's last error, then exit status 1. */
#define TK(x)                                                                                  \
    do {                                                                                       \
        tide_result_t r_ = (x);                                                                \
        if (r_ != TIDE_SUCCESS) {                                                              \
            fprintf(stderr, "%s:%d %s: %s (%s)\n", __FILE__, __LINE__, #x,                     \
                    tide_get_error_string(r_), tide_get_last_error());                         \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* Host wall clock in microseconds (steady: only differences mean anything). */
static inline double now_us() {
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/* Milliseconds from event a to event b, once b has completed. */
static inline double event_ms(cudaEvent_t a, cudaEvent_t b) {
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* The median: the mean of the two middle values for an even count; 0 for none. */
static inline double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/*
 * The q-quantile by nearest rank, v[round(q (n - 1))] of the sorted values; 0 for none.
 * quantile(v, 0.5) is v[n / 2]: the upper of the two middle values for an even count.
 */
static inline double quantile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)(q * (v.size() - 1) + 0.5))];
}

#endif /* TIDE_TESTS_GPU_UTIL_H_ */
