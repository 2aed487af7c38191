/*
 * matrix_gen.h - the configuration choices shared by the CPU matrix (test_matrix.c) and the
 * GPU comparison over the same space (tests/gpu/test_fabric_cuda.c --matrix).  Free of
 * cmocka so that the GPU program, which has no test framework, can include it.
 */
#ifndef TIDE_TESTS_MATRIX_GEN_H_
#define TIDE_TESTS_MATRIX_GEN_H_

#include "tide.h"

#include <stdbool.h>

/* The other TIDE-RS mode (for mode-invariance checks). */
static inline tide_rs_mode_t matrix_other_mode(tide_rs_mode_t m) {
    return m == TIDE_RS_IN_PLACE ? TIDE_RS_SLOT_REUSE : TIDE_RS_IN_PLACE;
}

/* The W_wave below min(L, M) that divides L (Prop. 4.1), or 0 when every W_wave gives one
 * wave (M = 1). */
static inline int matrix_multiwave_width(int m, int l) {
    for (int w = l - 1; w >= 1; --w)
        if (l % w == 0 && w < m) return w;
    return 0;
}

/* FSDP2's divide factors: predivide by the largest power of two whose square stays below N
 * (while N divides evenly), postdivide by the rest. */
static inline float matrix_alpha_fsdp2_divide(int n) {
    int pre = 1;
    while (n % (pre * 2) == 0 && n / (pre * 2) >= pre * 2)
        pre *= 2;
    return tide_alpha_divide((float)pre, (float)n / (float)pre);
}

/* The alpha forms in turn: AVG, a PREMUL_SUM factor, FSDP2's divide factors. */
static inline float matrix_alpha_of(int which, int n, bool integer) {
    switch (which % 3) {
    case 0:
        return tide_alpha_avg(n);
    case 1:
        return integer ? 0.5f : 1.3f; /* PREMUL_SUM factor */
    default:
        return matrix_alpha_fsdp2_divide(n);
    }
}

#endif /* TIDE_TESTS_MATRIX_GEN_H_ */
