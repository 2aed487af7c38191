/*
 * test_arena_cuda.c - what the CUDA fabric offers of docs/arena.md so far: the read-done
 * event of a group's last reduce-scatter (tide_group_read_done_event), and a clear refusal
 * of shared arenas (tide_groups_register returns TIDE_ERR_UNSUPPORTED on this fabric).
 *
 *   test_arena_cuda          one process, M = 1, L = 2 virtual ranks on the visible GPU(s)
 *
 * Prints PASS / FAIL lines; the exit status is non-zero on any FAIL.
 */
#include "tide.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#define N 2

static int failed;

static void check(int ok, const char *what) {
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, ok ? "" : ": ",
           ok ? "" : tide_get_last_error());
    failed += !ok;
}

int main(void) {
    tide_comm_t comms[N];
    if (tide_comm_init_all(TIDE_FABRIC_CUDA, 1, N, comms) != TIDE_SUCCESS) {
        printf("FAIL comm_init_all: %s\n", tide_get_last_error());
        return 1;
    }
    const tide_param_shape_t shapes[2] = {{64, 32}, {33, 8}};
    const tide_group_desc_t desc = {2, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = cfg.gpus_per_node = 0; /* the communicator's */
    cfg.mode = TIDE_RS_SLOT_REUSE;

    /* Shared arenas: refused, saying so, on every rank (nothing is allocated). */
    tide_group_entry_t e[2] = {{&cfg, &desc, 0, "a"}, {&cfg, &desc, 1, "b"}};
    tide_group_t set[2];
    const tide_result_t res = tide_groups_register(comms[0], 2, e, set);
    check(res == TIDE_ERR_UNSUPPORTED && strstr(tide_get_last_error(), "shared arena") != NULL,
          "groups_register is refused on the cuda fabric");

    tide_group_t g[N];
    int ok = 1;
    for (int r = 0; r < N && ok; ++r)
        ok = tide_group_register(comms[r], &cfg, &desc, &g[r]) == TIDE_SUCCESS;
    check(ok, "group_register");
    if (!ok) return 1;
    tide_plan_t plan;
    tide_plan_summary_t s;
    tide_group_plan(g[0], &plan);
    tide_plan_get_summary(plan, &s);
    void *grads[N][2] = {{0}};
    float *out[N] = {0};
    cudaStream_t stream[N];
    for (int r = 0; r < N; ++r) {
        cudaStreamCreate(&stream[r]);
        cudaMalloc((void **)&out[r], s.fp32_shard_bytes);
        for (int p = 0; p < 2; ++p) {
            cudaMalloc(&grads[r][p], shapes[p].dim0 * shapes[p].inner * 2);
            cudaMemset(grads[r][p], 0, shapes[p].dim0 * shapes[p].inner * 2);
        }
    }
    for (int r = 0; r < N && ok; ++r)
        ok = tide_reduce_scatter(g[r], (const void *const *)grads[r], out[r], 1.0f, 0,
                                 TIDE_RS_SLOT_REUSE, stream[r]) == TIDE_SUCCESS;
    check(ok, "reduce_scatter");
    for (int r = 0; r < N && ok; ++r) {
        void *ev = NULL;
        ok = tide_group_read_done_event(g[r], &ev) == TIDE_SUCCESS && ev != NULL;
        check(ok, "read_done_event is a cudaEvent_t");
        if (ok) {
            /* The event completes (the call ran), and before the call-complete point's work on
             * the caller's stream is needed: waiting on it from another stream is legal. */
            cudaStream_t other;
            cudaStreamCreate(&other);
            check(cudaStreamWaitEvent(other, (cudaEvent_t)ev, 0) == cudaSuccess &&
                      cudaStreamSynchronize(other) == cudaSuccess &&
                      cudaEventQuery((cudaEvent_t)ev) == cudaSuccess,
                  "a stream waits on the read-done event");
            cudaStreamDestroy(other);
        }
    }
    for (int r = 0; r < N; ++r) {
        cudaStreamSynchronize(stream[r]);
        cudaStreamDestroy(stream[r]);
        cudaFree(out[r]);
        for (int p = 0; p < 2; ++p)
            cudaFree(grads[r][p]);
        tide_group_deregister(g[r]);
        tide_comm_destroy(comms[r]);
    }
    printf("test_arena_cuda: %d failure(s)\n", failed);
    return failed != 0;
}
