/*
 * cpu_runner.c - tide-bench on the CPU fabric: one thread per rank.
 *
 * The baseline is the stock FSDP2 layout path on the same buffers: a rank-major all-gather
 * into a flat N S buffer followed by the copy-out into parameter-major storage
 * (split_with_sizes_copy), and a _chunk_cat-style fp32 pack of every gradient followed by a
 * reduce-scatter of the packed buffer.  Inputs are integer-valued, so both paths compute exact
 * sums and the data check can demand equality element by element.
 */
#include "bench.h"

#include "kernels/kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const bench_opts_t *opts;
    int N, P;
    const tide_param_shape_t *shapes;
    tide_comm_t *comms;
    pthread_barrier_t bar;
    pthread_barrier_t check_bar; /* the N ranks and the checking thread */
    /* per rank */
    tide_group_t *groups;
    uint8_t **shards;        /* S bytes, packed bf16 */
    uint8_t **flat;          /* N S rank-major all-gather output (stock) */
    uint8_t **landing;       /* N S parameter-major copy-out target (stock) */
    uint16_t ***grads;       /* P gradients of D_p K_p bf16 */
    float **pack;            /* N x shard_elems fp32 (_chunk_cat output, stock) */
    float **out_tide, **out_stock;
    double *times[4];        /* per iteration, rank 0: tide ag, stock ag, tide rs, stock rs */
    int last_slot;
    float alpha;
    tide_result_t err;
    pthread_mutex_t err_lock;
} bench_world_t;

typedef struct {
    bench_world_t *w;
    int rank;
} bench_rank_t;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Deterministic small integers in [-4, 4] (nccl-tests style: exact under any sum order). */
static uint16_t int_value(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t x = seed ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full) ^ (c + 0x165667B1);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return tide_float_to_bf16((float)((int)(x % 9) - 4));
}

static void record_error(bench_world_t *w, tide_result_t r, int rank, const char *what) {
    pthread_mutex_lock(&w->err_lock);
    if (w->err == TIDE_SUCCESS) {
        w->err = r;
        fprintf(stderr, "tide-bench: rank %d: %s failed: %s (%s)\n", rank, what,
                tide_get_error_string(r), tide_get_last_error());
    }
    pthread_mutex_unlock(&w->err_lock);
}

/* Stock all-gather: rank-major gather of every shard, then FSDP2's copy-out. */
static void stock_all_gather(bench_world_t *w, int rank, const tide_param_geometry_t *geo,
                             uint64_t S) {
    int N = w->N;
    for (int u = 0; u < N; ++u) memcpy(w->flat[rank] + (uint64_t)u * S, w->shards[u], S);
    for (int p = 0; p < w->P; ++p)
        for (int u = 0; u < N; ++u)
            memcpy(w->landing[rank] + geo[p].shard_offset * N + (uint64_t)u * geo[p].shard_bytes,
                   w->flat[rank] + (uint64_t)u * S + geo[p].shard_offset, geo[p].shard_bytes);
}

/* Stock reduce-scatter: _chunk_cat pack (slice, pad, upcast) then a rank-order fp32 sum. */
static void stock_pack(bench_world_t *w, int rank, const tide_param_geometry_t *geo,
                       uint64_t elems) {
    int N = w->N;
    float *pack = w->pack[rank];
    for (int r = 0; r < N; ++r)
        for (int p = 0; p < w->P; ++p) {
            uint64_t K = geo[p].inner, R = geo[p].rows_per_rank;
            float *dst = pack + (uint64_t)r * elems + geo[p].fp32_offset / 4;
            for (uint64_t e = 0; e < R * K; ++e) {
                uint64_t flat = (uint64_t)r * R * K + e;
                dst[e] = flat < geo[p].dim0 * K ? tide_bf16_to_float(w->grads[rank][p][flat]) : 0.0f;
            }
        }
}

static void stock_reduce(bench_world_t *w, int rank, uint64_t elems) {
    float *out = w->out_stock[rank];
    for (uint64_t e = 0; e < elems; ++e) {
        float acc = w->pack[0][(uint64_t)rank * elems + e];
        for (int u = 1; u < w->N; ++u) acc += w->pack[u][(uint64_t)rank * elems + e];
        out[e] = w->alpha * acc;
    }
}

static void *rank_main(void *arg) {
    bench_rank_t *br = arg;
    bench_world_t *w = br->w;
    const bench_opts_t *o = w->opts;
    int rank = br->rank, P = w->P;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = o->nodes;
    cfg.gpus_per_node = o->gpus_per_node;
    tide_group_desc_t desc = {P, w->shapes, TIDE_DTYPE_BF16, o->grad_dtype, TIDE_DTYPE_BF16};
    tide_result_t r = tide_group_register(w->comms[rank], &cfg, &desc, &w->groups[rank]);
    if (r != TIDE_SUCCESS) {
        record_error(w, r, rank, "tide_group_register");
        pthread_barrier_wait(&w->check_bar);
        pthread_barrier_wait(&w->check_bar);
        return NULL;
    }
    tide_plan_t plan;
    tide_plan_summary_t sum;
    tide_group_plan(w->groups[rank], &plan);
    tide_plan_get_summary(plan, &sum);
    tide_param_geometry_t *geo = calloc((size_t)P, sizeof(*geo));
    for (int p = 0; p < P; ++p) tide_plan_get_param(plan, p, &geo[p]);
    uint64_t S = sum.shard_bytes, elems = sum.fp32_shard_bytes / 4;

    /* Inputs. */
    uint16_t *shard = (uint16_t *)w->shards[rank];
    for (uint64_t i = 0; i < S / 2; ++i) shard[i] = int_value(o->seed, 1, (uint64_t)rank, i);
    for (int p = 0; p < P; ++p)
        for (uint64_t i = 0; i < w->shapes[p].dim0 * w->shapes[p].inner; ++i)
            w->grads[rank][p][i] = int_value(o->seed, 2 + (uint64_t)p, (uint64_t)rank, i);
    pthread_barrier_wait(&w->bar);

    int total = o->warmup + o->iters;
    for (int it = 0; it < total; ++it) {
        /* Counterbalanced order: TIDE runs first in two iterations, second in the next two.
         * Each phase starts with the caches as the phase before left them, and TIDE's arena
         * and the stock buffers do not fit the cache together, so a fixed order would hand
         * one side the other's evictions in every iteration. */
        const int tide_first = (it / 2) % 2 == 0; /* both orders meet both slots */
        double t_ag[2], t_rs[2]; /* [0] TIDE, [1] stock */
        int slot = it % 2;
        for (int k = 0; k < 2; ++k) {
            const int tide = (k == 0) == tide_first;
            pthread_barrier_wait(&w->bar);
            const double t0 = now_us();
            if (tide) {
                r = tide_all_gather(w->groups[rank], w->shards[rank], slot, NULL);
                if (r != TIDE_SUCCESS) record_error(w, r, rank, "tide_all_gather");
            } else {
                stock_all_gather(w, rank, geo, S);
            }
            pthread_barrier_wait(&w->bar);
            t_ag[tide ? 0 : 1] = now_us() - t0;
        }
        for (int k = 0; k < 2; ++k) {
            const int tide = (k == 0) == tide_first;
            pthread_barrier_wait(&w->bar);
            const double t0 = now_us();
            if (tide) {
                r = tide_reduce_scatter(w->groups[rank], (const void *const *)w->grads[rank],
                                        w->out_tide[rank], w->alpha, 0, o->mode, NULL);
                if (r != TIDE_SUCCESS) record_error(w, r, rank, "tide_reduce_scatter");
            } else {
                stock_pack(w, rank, geo, elems);
                pthread_barrier_wait(&w->bar);
                stock_reduce(w, rank, elems);
            }
            pthread_barrier_wait(&w->bar);
            t_rs[tide ? 0 : 1] = now_us() - t0;
        }
        if (rank == 0 && it >= o->warmup) {
            w->times[0][it - o->warmup] = t_ag[0];
            w->times[1][it - o->warmup] = t_ag[1];
            w->times[2][it - o->warmup] = t_rs[0];
            w->times[3][it - o->warmup] = t_rs[1];
        }
        if (rank == 0) w->last_slot = slot;
        if (w->err != TIDE_SUCCESS) break;
    }
    free(geo);
    /* The data check reads every landing while the groups are alive; deregistration is
     * collective, so each rank deregisters from its own thread afterwards. */
    pthread_barrier_wait(&w->check_bar);
    pthread_barrier_wait(&w->check_bar);
    r = tide_group_deregister(w->groups[rank]);
    if (r != TIDE_SUCCESS) record_error(w, r, rank, "tide_group_deregister");
    w->groups[rank] = NULL;
    return NULL;
}

static void world_free(bench_world_t *w) {
    for (int r = 0; r < w->N; ++r) {
        if (w->groups && w->groups[r]) tide_group_deregister(w->groups[r]);
        if (w->shards) free(w->shards[r]);
        if (w->flat) free(w->flat[r]);
        if (w->landing) free(w->landing[r]);
        if (w->pack) free(w->pack[r]);
        if (w->out_tide) free(w->out_tide[r]);
        if (w->out_stock) free(w->out_stock[r]);
        if (w->grads && w->grads[r]) {
            for (int p = 0; p < w->P; ++p) free(w->grads[r][p]);
            free(w->grads[r]);
        }
    }
    free(w->groups), free(w->shards), free(w->flat), free(w->landing), free(w->pack);
    free(w->out_tide), free(w->out_stock), free(w->grads);
    for (int k = 0; k < 4; ++k) free(w->times[k]);
}

/* Count elements where TIDE and the stock path disagree. */
static uint64_t count_wrong(bench_world_t *w, uint64_t group_bytes, uint64_t elems,
                            uint64_t *wrong_ag) {
    uint64_t ag = 0, rs = 0;
    for (int r = 0; r < w->N; ++r) {
        void *land = NULL;
        if (tide_group_landing(w->groups[r], w->last_slot, &land) != TIDE_SUCCESS) return UINT64_MAX;
        const uint16_t *a = land, *b = (const uint16_t *)w->landing[r];
        for (uint64_t i = 0; i < group_bytes / 2; ++i) ag += a[i] != b[i];
        for (uint64_t e = 0; e < elems; ++e) rs += !(w->out_tide[r][e] == w->out_stock[r][e]);
    }
    *wrong_ag = ag;
    return rs;
}

static tide_result_t run_size(const bench_opts_t *o, const tide_param_shape_t *shapes, int P,
                              int divisor, bench_row_t *rows) {
    int N = o->nodes * o->gpus_per_node;
    tide_result_t res = TIDE_SUCCESS;
    bench_world_t w = {0};
    w.opts = o, w.N = N, w.P = P, w.shapes = shapes;
    w.alpha = (N & (N - 1)) == 0 ? 1.0f / (float)N : 1.0f; /* exact scaling of exact sums */
    pthread_mutex_init(&w.err_lock, NULL);
    w.comms = calloc((size_t)N, sizeof(*w.comms));
    bench_rank_t *brs = calloc((size_t)N, sizeof(*brs));
    pthread_t *th = calloc((size_t)N, sizeof(*th));
    if (!w.comms || !brs || !th) {
        res = TIDE_ERR_NO_MEMORY;
        goto out;
    }
    res = tide_comm_init_all(o->fabric, o->nodes, o->gpus_per_node, w.comms);
    if (res != TIDE_SUCCESS) goto out;

    /* Sizes come from a plan of the scaled group (same geometry the ranks will register). */
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = o->nodes, cfg.gpus_per_node = o->gpus_per_node;
    tide_group_desc_t desc = {P, shapes, TIDE_DTYPE_BF16, o->grad_dtype, TIDE_DTYPE_BF16};
    tide_plan_t plan;
    res = tide_plan_create(&cfg, &desc, &plan);
    if (res != TIDE_SUCCESS) goto comms;
    tide_plan_summary_t sum;
    tide_plan_get_summary(plan, &sum);
    tide_plan_destroy(plan);
    uint64_t S = sum.shard_bytes, elems = sum.fp32_shard_bytes / 4;

    w.groups = calloc((size_t)N, sizeof(*w.groups));
    w.shards = calloc((size_t)N, sizeof(*w.shards));
    w.flat = calloc((size_t)N, sizeof(*w.flat));
    w.landing = calloc((size_t)N, sizeof(*w.landing));
    w.pack = calloc((size_t)N, sizeof(*w.pack));
    w.out_tide = calloc((size_t)N, sizeof(*w.out_tide));
    w.out_stock = calloc((size_t)N, sizeof(*w.out_stock));
    w.grads = calloc((size_t)N, sizeof(*w.grads));
    for (int k = 0; k < 4; ++k) w.times[k] = calloc((size_t)o->iters, sizeof(double));
    res = TIDE_ERR_NO_MEMORY;
    if (!w.groups || !w.shards || !w.flat || !w.landing || !w.pack || !w.out_tide ||
        !w.out_stock || !w.grads || !w.times[0] || !w.times[1] || !w.times[2] || !w.times[3])
        goto bufs;
    for (int r = 0; r < N; ++r) {
        w.shards[r] = malloc(S);
        w.flat[r] = malloc(S * (uint64_t)N);
        w.landing[r] = malloc(S * (uint64_t)N);
        w.pack[r] = malloc(elems * (uint64_t)N * sizeof(float));
        w.out_tide[r] = calloc(elems, sizeof(float));
        w.out_stock[r] = calloc(elems, sizeof(float));
        w.grads[r] = calloc((size_t)P, sizeof(*w.grads[r]));
        if (!w.shards[r] || !w.flat[r] || !w.landing[r] || !w.pack[r] || !w.out_tide[r] ||
            !w.out_stock[r] || !w.grads[r])
            goto bufs;
        for (int p = 0; p < P; ++p)
            if (!(w.grads[r][p] = malloc(shapes[p].dim0 * shapes[p].inner * 2))) goto bufs;
    }
    res = TIDE_SUCCESS;
    pthread_barrier_init(&w.bar, NULL, (unsigned)N);
    pthread_barrier_init(&w.check_bar, NULL, (unsigned)N + 1);
    for (int r = 0; r < N; ++r) {
        brs[r].w = &w, brs[r].rank = r;
        pthread_create(&th[r], NULL, rank_main, &brs[r]);
    }
    pthread_barrier_wait(&w.check_bar);
    uint64_t wrong_ag = 0, wrong_rs = 0;
    if (w.err == TIDE_SUCCESS) wrong_rs = count_wrong(&w, sum.group_bytes, elems, &wrong_ag);
    pthread_barrier_wait(&w.check_bar);
    for (int r = 0; r < N; ++r) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&w.bar);
    pthread_barrier_destroy(&w.check_bar);
    res = w.err;
    if (res == TIDE_SUCCESS) {
        const uint64_t bytes[2] = {sum.group_bytes, sum.grad_shard_bytes * (uint64_t)N};
        bench_fill_rows(o, N, P, divisor, bytes, w.times, wrong_ag, wrong_rs, rows);
    }
bufs:
    world_free(&w);
comms:
    for (int r = 0; r < N; ++r)
        if (w.comms[r]) tide_comm_destroy(w.comms[r]);
out:
    free(w.comms), free(brs), free(th);
    pthread_mutex_destroy(&w.err_lock);
    return res;
}

tide_result_t bench_run_cpu(const bench_opts_t *o, const tide_param_shape_t *shapes,
                            int num_shapes, bench_row_t *rows_out, int *num_rows_out) {
    return bench_run_divisors(o, shapes, num_shapes, run_size, rows_out, num_rows_out);
}
