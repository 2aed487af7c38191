/*
 * cuda_runner.c - tide-bench on the CUDA fabric, one process driving every rank
 * (tide_comm_init_all): rank r on visible device r mod D, D = min(visible devices, N), as the
 * fabric places it; each rank's calls on a stream of its device, every rank called in turn
 * from this thread (the fabric enqueues and returns).  A time is the host wall time from the
 * first rank's enqueue to the end of every rank's work (every device synchronised before and
 * after), for TIDE and the stock path alike.
 */
#include "tide-bench/cuda_bench.h"

#include "core/checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tide_result_t sync_all(int devices) {
    for (int d = 0; d < devices; ++d) {
        cudaError_t e = cudaSetDevice(d);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            fprintf(stderr, "tide-bench: device %d: %s\n", d, cudaGetErrorString(e));
            return TIDE_ERR_FABRIC;
        }
    }
    return TIDE_SUCCESS;
}

#define STEP(call)                                                                                \
    do {                                                                                          \
        res = (call);                                                                             \
        if (res != TIDE_SUCCESS) {                                                                \
            fprintf(stderr, "tide-bench: %s: %s\n", #call, tide_get_last_error());                \
            goto out;                                                                             \
        }                                                                                         \
    } while (0)

static tide_result_t run_size(const bench_opts_t *o, const tide_param_shape_t *shapes, int P,
                              int divisor, bench_row_t *rows) {
    const int N = o->nodes * o->gpus_per_node;
    int visible = 0;
    if (cudaGetDeviceCount(&visible) != cudaSuccess || visible < 1) {
        fprintf(stderr, "tide-bench: --fabric cuda: no CUDA device is visible\n");
        return TIDE_ERR_UNSUPPORTED;
    }
    const int D = visible < N ? visible : N;
    const float alpha = (N & (N - 1)) == 0 ? 1.0f / (float)N : 1.0f;
    tide_result_t res = TIDE_SUCCESS;
    tide_comm_t *comms = calloc((size_t)N, sizeof(*comms));
    tide_group_t *groups = calloc((size_t)N, sizeof(*groups));
    bench_cuda_rank_t *rk = calloc((size_t)N, sizeof(*rk));
    uint16_t **shards = calloc((size_t)N, sizeof(*shards));
    float **packs = calloc((size_t)N, sizeof(*packs));
    double *times[4] = {0};
    tide_plan_t plan = NULL;
    for (int k = 0; k < 4; ++k) times[k] = calloc((size_t)o->iters, sizeof(double));
    if (!comms || !groups || !rk || !shards || !packs || !times[0] || !times[1] || !times[2] ||
        !times[3]) {
        res = TIDE_ERR_NO_MEMORY;
        goto out;
    }
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = o->nodes, cfg.gpus_per_node = o->gpus_per_node;
    tide_group_desc_t desc = {P, shapes, TIDE_DTYPE_BF16, o->grad_dtype, TIDE_DTYPE_BF16};
    STEP(tide_plan_create(&cfg, &desc, &plan));
    STEP(tide_comm_init_all(TIDE_FABRIC_CUDA, o->nodes, o->gpus_per_node, comms));
    /* Registration is collective but never waits: one thread registers every rank. */
    for (int r = 0; r < N; ++r) STEP(tide_group_register(comms[r], &cfg, &desc, &groups[r]));
    for (int r = 0; r < N; ++r) {
        STEP(bench_cuda_rank_init(&rk[r], o, shapes, P, plan, r, r % D));
        shards[r] = rk[r].shard;
        packs[r] = rk[r].pack;
    }
    for (int r = 0; r < N; ++r) STEP(bench_cuda_set_packs(&rk[r], packs));
    int last_slot = 0;
    for (int it = 0; it < o->warmup + o->iters; ++it) {
        const int slot = it % 2;
        double t[5];
        STEP(sync_all(D));
        t[0] = bench_now_us();
        for (int r = 0; r < N; ++r)
            STEP(tide_all_gather(groups[r], rk[r].shard, slot, rk[r].st));
        STEP(sync_all(D));
        t[1] = bench_now_us();
        for (int r = 0; r < N; ++r) STEP(bench_cuda_stock_ag(&rk[r], shards));
        STEP(sync_all(D));
        t[2] = bench_now_us();
        for (int r = 0; r < N; ++r)
            STEP(tide_reduce_scatter(groups[r], (const void *const *)rk[r].grads, rk[r].out_tide,
                                     alpha, 0, o->mode, rk[r].st));
        STEP(sync_all(D));
        t[3] = bench_now_us();
        for (int r = 0; r < N; ++r) STEP(bench_cuda_stock_pack(&rk[r]));
        /* Every pack is complete before any rank sums its chunk of them (other devices). */
        STEP(sync_all(D));
        for (int r = 0; r < N; ++r) STEP(bench_cuda_stock_reduce(&rk[r], alpha));
        STEP(sync_all(D));
        t[4] = bench_now_us();
        if (it >= o->warmup)
            for (int k = 0; k < 4; ++k) times[k][it - o->warmup] = t[k + 1] - t[k];
        last_slot = slot;
    }
    /* The data check after timing. */
    uint64_t wrong_ag = 0, wrong_rs = 0;
    for (int r = 0; r < N; ++r) {
        uint64_t a = 0, b = 0;
        STEP(bench_cuda_count_wrong(&rk[r], groups[r], last_slot, &a, &b));
        wrong_ag += a, wrong_rs += b;
    }
    bench_cuda_rows(o, &rk[0], divisor, times, wrong_ag, wrong_rs, rows);
out:
    if (rk != NULL)
        for (int r = 0; r < N; ++r) bench_cuda_rank_free(&rk[r]);
    if (groups != NULL)
        for (int r = 0; r < N; ++r)
            if (groups[r] != NULL) tide_group_deregister(groups[r]);
    if (comms != NULL)
        for (int r = 0; r < N; ++r)
            if (comms[r] != NULL) tide_comm_destroy(comms[r]);
    if (plan != NULL) tide_plan_destroy(plan);
    for (int k = 0; k < 4; ++k) free(times[k]);
    free(comms), free(groups), free(rk), free(shards), free(packs);
    return res;
}

tide_result_t bench_run_cuda(const bench_opts_t *o, const tide_param_shape_t *shapes,
                             int num_shapes, bench_row_t *rows_out, int *num_rows_out) {
    return bench_run_divisors(o, shapes, num_shapes, run_size, rows_out, num_rows_out);
}
