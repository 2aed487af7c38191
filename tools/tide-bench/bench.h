/*
 * bench.h - tide-bench: TIDE-AG / TIDE-RS against the stock FSDP2 layout path.
 *
 * In the spirit of nccl-tests: for each size, time the collective and the baseline on the
 * same buffers, print time, algbw, busbw and the ratio, then check the data after timing
 * (#wrong) and exit non-zero on any wrong element.
 */
#ifndef TIDE_BENCH_BENCH_H_
#define TIDE_BENCH_BENCH_H_

#include "tide.h"

#include <stdbool.h>
#include <stdint.h>

#define BENCH_MAX_SIZES 16

typedef struct {
    tide_fabric_kind_t fabric;
    int nodes, gpus_per_node;
    const char *preset;       /* or NULL with shapes */
    const char *shapes;       /* --shapes list */
    tide_dtype_t grad_dtype;  /* gradient dtype (bf16 default) */
    tide_rs_mode_t mode;
    int divisors[BENCH_MAX_SIZES]; /* each size divides every dim0 of the group by this */
    int num_divisors;
    uint64_t min_bytes, max_bytes; /* -b / -e: a sweep instead of --divisors (0: none) */
    double step_factor;            /* -f */
    const char *plot;              /* --plot FILE: PNG of busbw against size */
    int iters, warmup;
    uint64_t seed;
    int procs;                /* --procs N: one process per rank (CUDA, NCCL); 0: one process */
    bool json, quiet;
} bench_opts_t;

/* One size of one collective. */
typedef struct {
    const char *coll;         /* "all_gather" or "reduce_scatter" */
    int divisor;
    int num_params;
    uint64_t bytes;           /* N S (AG) or N S_grad (RS): the unsharded group */
    double tide_us, stock_us; /* medians */
    double algbw, busbw;      /* GB/s of TIDE */
    double stock_busbw;
    uint64_t wrong;           /* elements that differ from the stock path after timing */
} bench_row_t;

/* rows.c: what every runner shares.  A runner times one size (the group with every dim0
 * divided by `divisor`) and fills its two rows; bench_run_divisors walks the divisors. */
typedef tide_result_t (*bench_size_fn)(const bench_opts_t *o, const tide_param_shape_t *shapes,
                                       int num_shapes, int divisor, bench_row_t *rows);
double bench_median(double *v, int n); /* sorts v */
/* The two rows of a size: bytes[c] is N S (AG) or N S_grad (RS); times[2c] TIDE's and
 * times[2c + 1] the stock path's per-iteration times (us) of collective c. */
void bench_fill_rows(const bench_opts_t *o, int N, int P, int divisor, const uint64_t bytes[2],
                     double *const times[4], uint64_t wrong_ag, uint64_t wrong_rs,
                     bench_row_t *rows);
tide_result_t bench_run_divisors(const bench_opts_t *o, const tide_param_shape_t *shapes,
                                 int num_shapes, bench_size_fn run_size, bench_row_t *rows_out,
                                 int *num_rows_out);

/* sweep.c: "64M"-style byte counts (K, M, G: powers of 2); the divisors of a -b/-e/-f sweep
 * (0 and a message on too many sizes); --plot: run plot.py on a JSON file (0 on failure,
 * after a message). */
int bench_parse_bytes(const char *s, uint64_t *out);
int bench_sweep_divisors(bench_opts_t *o, const tide_param_shape_t *shapes, int num_shapes);
int bench_plot(const char *json_path, const char *png_path);

/* Run every size for both collectives on the CPU fabric; rows_out has 2 per divisor. */
tide_result_t bench_run_cpu(const bench_opts_t *opts, const tide_param_shape_t *shapes,
                            int num_shapes, bench_row_t *rows_out, int *num_rows_out);

#if TIDE_HAVE_CUDA
/* The same on the CUDA fabric (cuda_runner.c): one process drives every rank
 * (tide_comm_init_all), rank r on visible device r mod D. */
tide_result_t bench_run_cuda(const bench_opts_t *opts, const tide_param_shape_t *shapes,
                             int num_shapes, bench_row_t *rows_out, int *num_rows_out);

/* One process per rank (opts->procs = N ranks; cuda_procs.c): forks the N ranks, rank r on
 * visible device r mod D, joined by tide_comm_init_rank (opts->fabric TIDE_FABRIC_CUDA) or
 * tide_comm_init_nccl (TIDE_FABRIC_NCCL); rows_out receives rank 0's table. */
tide_result_t bench_run_cuda_procs(const bench_opts_t *opts, const tide_param_shape_t *shapes,
                                   int num_shapes, bench_row_t *rows_out, int *num_rows_out);

/* The number of visible CUDA devices, counted in a child process so that the caller stays
 * free to fork ranks that use CUDA; -1 when the child could not run. */
int bench_cuda_visible_devices(void);
#endif

#endif /* TIDE_BENCH_BENCH_H_ */
