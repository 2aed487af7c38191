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

/* Tuning knobs of one run.  Every variant must reproduce MATRIX_BASE's outputs bit for bit. */
typedef struct {
    const char *name;
    int staging_slots, passes, sum_ctas, landing_ctas, round_width;
    tide_rs_mode_t mode;
    bool in_largest; /* also run on the topologies of 64 and 72 ranks */
} matrix_knobs_t;

/* One run's config: an M x L world, the wave width and k's knobs. */
static inline tide_config_t matrix_config(int m, int l, int wave_width, const matrix_knobs_t *k) {
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    cfg.wave_width = wave_width;
    cfg.staging_slots = k->staging_slots;
    cfg.passes = k->passes;
    cfg.sum_ctas = k->sum_ctas;
    cfg.landing_ctas = k->landing_ctas;
    cfg.round_width = k->round_width;
    cfg.mode = k->mode;
    return cfg;
}

static const matrix_knobs_t MATRIX_BASE = {"base", 0, 0, 0, 0, 0, TIDE_RS_IN_PLACE, true};
static const matrix_knobs_t MATRIX_VARIANTS[] = {
    {"slot-reuse", 0, 0, 0, 0, 0, TIDE_RS_SLOT_REUSE, true},
    {"staging 1", 1, 0, 0, 0, 0, TIDE_RS_IN_PLACE, true},
    {"staging 3", 3, 0, 0, 0, 0, TIDE_RS_IN_PLACE, false},
    {"passes 2", 0, 2, 0, 0, 0, TIDE_RS_IN_PLACE, true},
    {"passes 3 slot-reuse", 0, 3, 0, 0, 0, TIDE_RS_SLOT_REUSE, false},
    {"ctas 1/7", 0, 0, 1, 7, 0, TIDE_RS_IN_PLACE, true},
    {"k 1", 0, 0, 0, 0, 1, TIDE_RS_IN_PLACE, false},
    {"k 4 slot-reuse", 0, 0, 0, 0, 4, TIDE_RS_SLOT_REUSE, true},
    {"staging 1 passes 2 ctas 2/3 k 3 slot-reuse", 1, 2, 2, 3, 3, TIDE_RS_SLOT_REUSE, true},
    {"passes 4 staging 2 ctas 3/1", 2, 4, 3, 1, 0, TIDE_RS_SLOT_REUSE, false},
};
#define MATRIX_NUM_VARIANTS ((int)(sizeof(MATRIX_VARIANTS) / sizeof(MATRIX_VARIANTS[0])))

#endif /* TIDE_TESTS_MATRIX_GEN_H_ */
