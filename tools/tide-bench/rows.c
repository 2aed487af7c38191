/*
 * rows.c - tide-bench: what every runner (CPU, CUDA one process, CUDA one process per rank)
 * does alike: the medians, the two table rows of a size, and the walk over the divisors.
 * One copy, so the fabrics' tables are computed by the same arithmetic.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void bench_fill_rows(const bench_opts_t *o, int N, int P, int divisor, const uint64_t bytes[2],
                     double *const times[4], uint64_t wrong_ag, uint64_t wrong_rs,
                     bench_row_t *rows) {
    double t[4];
    for (int k = 0; k < 4; ++k) t[k] = bench_median(times[k], o->iters);
    for (int c = 0; c < 2; ++c) {
        bench_row_t *row = &rows[c];
        row->coll = c == 0 ? "all_gather" : "reduce_scatter";
        row->divisor = divisor;
        row->num_params = P;
        row->bytes = bytes[c];
        row->tide_us = t[2 * c];
        row->stock_us = t[2 * c + 1];
        row->algbw = (double)bytes[c] / (row->tide_us * 1e3);
        row->busbw = row->algbw * (N - 1) / N;
        row->stock_busbw = (double)bytes[c] / (row->stock_us * 1e3) * (N - 1) / N;
        row->wrong = c == 0 ? wrong_ag : wrong_rs;
    }
}

tide_result_t bench_run_divisors(const bench_opts_t *o, const tide_param_shape_t *shapes,
                                 int num_shapes, bench_size_fn run_size, bench_row_t *rows_out,
                                 int *num_rows_out) {
    tide_param_shape_t *scaled = calloc((size_t)num_shapes, sizeof(*scaled));
    if (!scaled) return TIDE_ERR_NO_MEMORY;
    int rows = 0;
    tide_result_t r = TIDE_SUCCESS;
    for (int d = 0; d < o->num_divisors && r == TIDE_SUCCESS; ++d) {
        for (int p = 0; p < num_shapes; ++p) {
            scaled[p] = shapes[p];
            scaled[p].dim0 =
                (shapes[p].dim0 + (uint64_t)o->divisors[d] - 1) / (uint64_t)o->divisors[d];
        }
        if (!o->quiet && !o->json)
            fprintf(stderr, "# [%d/%d] dim0 / %d ...\n", d + 1, o->num_divisors, o->divisors[d]);
        r = run_size(o, scaled, num_shapes, o->divisors[d], rows_out + rows);
        if (r == TIDE_SUCCESS) rows += 2;
    }
    free(scaled);
    *num_rows_out = rows;
    return r;
}
