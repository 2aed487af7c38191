/*
 * host_rand.h - what the C fabric tests on the GPU machine draw their host data with: a
 * xorshift generator, integers in a range, wide-exponent floats (sums of these round, so
 * association order shows) and an allocation that ends the program when the host is out of
 * memory.  Each test defines HOST_RAND_SEED and HOST_RAND_WIDE_EXP (floats are u * 2^k, u
 * uniform in [-0.5, 0.5), k in [-HOST_RAND_WIDE_EXP, HOST_RAND_WIDE_EXP]) before including it.
 */
#ifndef TIDE_TESTS_GPU_HOST_RAND_H_
#define TIDE_TESTS_GPU_HOST_RAND_H_

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#if !defined(HOST_RAND_SEED) || !defined(HOST_RAND_WIDE_EXP)
#error "define HOST_RAND_SEED and HOST_RAND_WIDE_EXP before including host_rand.h"
#endif

static uint64_t rng = HOST_RAND_SEED;

static inline uint64_t rnd(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 2685821657736338717ull;
}

static inline int rnd_int(int lo, int hi) {
    return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

static inline float rnd_wide(void) {
    const double u = (double)(rnd() >> 11) / 9007199254740992.0 - 0.5;
    return (float)ldexp(u, rnd_int(-HOST_RAND_WIDE_EXP, HOST_RAND_WIDE_EXP));
}

static inline void *xmalloc(size_t n) {
    void *p = calloc(1, n > 0 ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "FAIL: out of host memory\n");
        exit(2);
    }
    return p;
}

#endif /* TIDE_TESTS_GPU_HOST_RAND_H_ */
