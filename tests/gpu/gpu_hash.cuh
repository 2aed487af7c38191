/*
 * gpu_hash.cuh - benchmark data without a host round trip: a value of roughly N(0, 1) for
 * element i, from an integer hash (the sum of four uniforms), the same on every GPU.
 */
#ifndef TIDE_TESTS_GPU_HASH_CUH_
#define TIDE_TESTS_GPU_HASH_CUH_

#include <cstdint>

__device__ inline float hash_value(uint64_t i, uint32_t seed) {
    float s = 0.0f;
    for (int k = 0; k < 4; ++k) {
        uint64_t z = i * 4 + k + ((uint64_t)seed << 40) + 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        s += (float)((z ^ (z >> 31)) >> 40) * 0x1p-24f;
    }
    return (s - 2.0f) * 1.7320508f;
}

#endif /* TIDE_TESTS_GPU_HASH_CUH_ */
