/*
 * arena_check.h - what the shared-arena tests of both CUDA fabrics share (test_arena_cuda.c:
 * one process drives every rank; test_arena_cuda_mp.c: one process per rank).
 *
 * A set of ARENA_G groups of different sizes runs FSDP2's order (tide_ring_fsdp_calls) for
 * ARENA_STEPS steps; every call is repeated on the same group registered alone, and the bytes
 * of both are copied out right after the call (arena_record) and compared after the step's
 * sync (arena_compare): equal bit for bit, landings holding the shards at Landing(p, r), RS
 * outputs not all zero.  The tests keep what differs (which ranks a process drives, its
 * streams and devices, how it syncs) and hand it to arena_script as an arena_ops_t.
 */
#ifndef TIDE_TESTS_GPU_ARENA_CHECK_H_
#define TIDE_TESTS_GPU_ARENA_CHECK_H_

#include "tide.h"

#include <cuda_runtime.h>
#include <stdint.h>

#define ARENA_G 3
#define ARENA_STEPS 3
#define ARENA_MAX_P 3

/* A pair of host copies made on the devices, compared after the step's sync. */
typedef struct {
    void *a, *b; /* pinned: the set's and the alone group's bytes */
    uint64_t bytes;
    const void *want; /* or NULL: the expected landing (host) */
    char what[96];
} arena_record_t;

/* One configuration (topology and RS mode) of a test: the groups, their plans, the host data
 * of the current step and the records not compared yet. */
typedef struct {
    int m, l, n;
    int me; /* the rank this process drives, or -1: it drives every rank */
    tide_rs_mode_t mode;
    tide_config_t cfg;
    tide_param_shape_t shapes[ARENA_G][ARENA_MAX_P];
    tide_group_desc_t desc[ARENA_G];
    tide_group_entry_t entries[ARENA_G];
    char names[ARENA_G][16];
    tide_plan_summary_t sum[ARENA_G];
    tide_param_geometry_t geo[ARENA_G][ARENA_MAX_P];
    uint16_t *h_shards[ARENA_G];  /* all N shards of the step */
    uint16_t *h_landing[ARENA_G]; /* the expected landing */
    arena_record_t *rec;
    int num_rec, cap_rec;
    int bad;         /* FAIL lines printed for this configuration */
    int expect_fail; /* a failure is the expected outcome: printed as such */
} arena_run_t;

/* A configuration's fields and its tide_config_t; the groups described (arena_describe). */
void arena_run_init(arena_run_t *a, int m, int l, int me, tide_rs_mode_t mode);
/* The host memory and the pinned records left (after a failure, too). */
void arena_run_free(arena_run_t *a);

/* A FAIL line naming the configuration (and the rank), counted in a->bad; returns 0. */
__attribute__((format(printf, 2, 3))) int arena_fail(arena_run_t *a, const char *fmt, ...);

/* In a function returning int: on failure print a FAIL line and return 0. */
#define ARENA_TRY(a, call, what)                                                                   \
    do {                                                                                           \
        if ((call) != TIDE_SUCCESS) return arena_fail((a), what ": %s", tide_get_last_error());    \
    } while (0)
#define ARENA_CU(a, call, what)                                                                    \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return arena_fail((a), what ": %s", cudaGetErrorString(e_));        \
    } while (0)

/* Wide-exponent bf16: exponents over 2^-40 .. 2^40, both signs (splitmix64 from seed). */
void arena_fill(uint16_t *buf, uint64_t elems, uint64_t seed);
/* Rank r's gradients of group i in the step (the same seeds in every process). */
void arena_fill_grads(const arena_run_t *a, int i, int r, int step, uint16_t *buf);
uint64_t arena_grad_elems(const arena_run_t *a, int i);
/* Each parameter's gradients of group i, packed from base. */
void arena_grad_ptrs(const arena_run_t *a, int i, const uint8_t *base, const void **out);

/* Plans, geometry and host buffers, read from a rank's groups registered alone. */
int arena_learn_plans(arena_run_t *a, const tide_group_t *alone);
/* Every rank's shards of the step and the expected landings (host). */
void arena_host_step(arena_run_t *a, int step);

/* Copy `bytes` of the set's a_dev (on stream sa) and the alone group's b_dev (on sb). */
int arena_record(arena_run_t *a, const void *a_dev, cudaStream_t sa, const void *b_dev,
                 cudaStream_t sb, uint64_t bytes, const void *want, const char *what);
/* After the step's sync: every record equal; RS outputs not all zero. */
int arena_compare(arena_run_t *a, int step);

/* Read-done events are per group (per view): distinct, and stream s can wait on them. */
int arena_check_read_done(arena_run_t *a, const tide_group_t *set, cudaStream_t s);
/* The cross-group fences that ran on the given groups of sets. */
uint64_t arena_fences(const tide_group_t *set, int count);

/* What a test does at each call of the script; each returns 1 or 0 after a FAIL line.
 * `before` (or NULL) runs ahead of call k, before any sync. */
typedef struct {
    void (*before)(arena_run_t *a, int k, int per_step);
    int (*sync)(arena_run_t *a);
    int (*new_step)(arena_run_t *a, int step);
    int (*gather)(arena_run_t *a, int i);
    int (*reshard)(arena_run_t *a, int i);
    int (*reduce)(arena_run_t *a, int i, int step);
} arena_ops_t;

/* FSDP2's order for ARENA_STEPS steps, records compared after each step. */
int arena_script(arena_run_t *a, const arena_ops_t *ops);

#endif /* TIDE_TESTS_GPU_ARENA_CHECK_H_ */
