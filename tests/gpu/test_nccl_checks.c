/*
 * test_nccl_checks.c - the NCCL fabric compares every call's arguments across ranks
 * (src/fabric/nccl/calls.c) and refuses a disagreement on every rank.
 *
 * Two processes, one GPU each (NCCL refuses two ranks of a communicator on one GPU; with
 * fewer than two GPUs the test is skipped, exit 77), M = 1, L = 2, two groups:
 *   AG: calls 0 and 1 agree and succeed; in call 2 rank 1 passes slot 1 where rank 0 passes
 *       slot 0: both get TIDE_ERR_INVALID_ARGUMENT naming a slot and the other rank.
 *   RS: call 0 agrees; in call 1 rank 1 passes alpha 0.5: both refused naming alpha.
 *   A third group: rank 0 calls its all-gather while rank 1 calls its reduce-scatter: both
 *       refused, "disagree on which call".
 * Nothing may hang: each child has a 90 s alarm, TIDE_TIMEOUT_MS is 10000.
 *
 * Exit status: 0 passed, 1 a rank saw something else (printed), 2 a setup failure, 77 skipped.
 */
#include "api/comm.h"
#include "plan/plan.h"
#include "tide.h"

#include <cuda_runtime_api.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define RANKS 2

typedef struct {
    _Atomic int id_ready;
    uint8_t id[TIDE_NCCL_UNIQUE_ID_BYTES];
    int step[RANKS];
    char msg[RANKS][400];
} shared_t;

static int failed(shared_t *sh, int r, int step) {
    sh->step[r] = step;
    snprintf(sh->msg[r], sizeof(sh->msg[r]), "%s", tide_get_last_error());
    return step;
}

static bool refused(tide_result_t res, const char *what) {
    return res == TIDE_ERR_INVALID_ARGUMENT && strstr(tide_get_last_error(), what) != NULL &&
           strstr(tide_get_last_error(), "disagree") != NULL;
}

static int child(int r, shared_t *sh) {
    if (cudaSetDevice(r) != cudaSuccess) return failed(sh, r, 2);
    if (r == 0) {
        if (tide_nccl_get_unique_id(sh->id) != TIDE_SUCCESS) return failed(sh, r, 3);
        atomic_store(&sh->id_ready, 1);
    } else {
        while (atomic_load(&sh->id_ready) == 0)
            usleep(1000);
    }
    tide_comm_t comm;
    if (tide_comm_init_nccl(1, RANKS, r, sh->id, &comm) != TIDE_SUCCESS) return failed(sh, r, 4);
    tide_param_shape_t shapes[2] = {{64, 32}, {7, 5}};
    tide_group_desc_t desc = {2, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = 1;
    cfg.gpus_per_node = RANKS;
    tide_group_t ag, rs, third;
    if (tide_group_register(comm, &cfg, &desc, &ag) != TIDE_SUCCESS) return failed(sh, r, 5);
    if (tide_group_register(comm, &cfg, &desc, &rs) != TIDE_SUCCESS) return failed(sh, r, 6);
    if (tide_group_register(comm, &cfg, &desc, &third) != TIDE_SUCCESS) return failed(sh, r, 7);
    const tide_geom_t *g = &rs->plan->geom;
    void *shard = NULL, *out = NULL, *grads[2] = {NULL, NULL};
    if (cudaMalloc(&shard, ag->plan->geom.shard_bytes) != cudaSuccess ||
        cudaMalloc(&out, g->fp32_shard_bytes) != cudaSuccess)
        return failed(sh, r, 8);
    cudaMemset(shard, r, ag->plan->geom.shard_bytes);
    for (int p = 0; p < 2; ++p) {
        const size_t b = g->params[p].dim0 * g->params[p].inner * g->grad_item;
        if (cudaMalloc(&grads[p], b) != cudaSuccess) return failed(sh, r, 9);
        cudaMemset(grads[p], 0, b);
    }
    cudaDeviceSynchronize();

    for (int e = 0; e < 2; ++e)
        if (tide_all_gather(ag, shard, e % 2, NULL) != TIDE_SUCCESS) return failed(sh, r, 10);
    if (!refused(tide_all_gather(ag, shard, r == 1 ? 1 : 0, NULL), "slot"))
        return failed(sh, r, 11);
    if (tide_reduce_scatter(rs, (const void *const *)grads, out, 1.0f, 0, TIDE_RS_IN_PLACE, NULL) !=
        TIDE_SUCCESS)
        return failed(sh, r, 20);
    if (!refused(tide_reduce_scatter(rs, (const void *const *)grads, out, r == 1 ? 0.5f : 1.0f, 0,
                                     TIDE_RS_IN_PLACE, NULL),
                 "alpha"))
        return failed(sh, r, 21);
    const tide_result_t res = r == 0 ? tide_all_gather(third, shard, 0, NULL)
                                     : tide_reduce_scatter(third, (const void *const *)grads, out,
                                                           1.0f, 0, TIDE_RS_IN_PLACE, NULL);
    if (!refused(res, "which call")) return failed(sh, r, 30);
    if (cudaDeviceSynchronize() != cudaSuccess) return failed(sh, r, 31);

    tide_group_deregister(ag);
    tide_group_deregister(rs);
    tide_group_deregister(third);
    for (int p = 0; p < 2; ++p)
        cudaFree(grads[p]);
    cudaFree(shard);
    cudaFree(out);
    tide_comm_destroy(comm);
    return 0;
}

int main(void) {
    setenv("TIDE_TIMEOUT_MS", "10000", 1);
    shared_t *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 2;
    memset(sh, 0, sizeof(*sh));
    /* The parent touches no CUDA: ask a child how many GPUs there are. */
    pid_t probe = fork();
    if (probe == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess && n >= RANKS ? 0 : 77);
    }
    int st = 0;
    waitpid(probe, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        printf("SKIP: the NCCL fabric's argument checks need %d GPUs\n", RANKS);
        return 77;
    }
    pid_t pids[RANKS];
    for (int r = 0; r < RANKS; ++r) {
        pids[r] = fork();
        if (pids[r] < 0) return 2;
        if (pids[r] == 0) {
            alarm(90); /* a hang is a failure, not a stuck job */
            _exit(child(r, sh));
        }
    }
    bool ok = true;
    for (int r = 0; r < RANKS; ++r) {
        waitpid(pids[r], &st, 0);
        const bool good = WIFEXITED(st) && WEXITSTATUS(st) == 0 && sh->step[r] == 0;
        if (good)
            printf("ok   rank %d: slot, alpha and call-order disagreements refused\n", r);
        else if (WIFSIGNALED(st))
            printf("FAIL rank %d: killed by signal %d (SIGALRM: it hung)\n", r, WTERMSIG(st));
        else
            printf("FAIL rank %d: step %d: %s\n", r, sh->step[r], sh->msg[r]);
        ok = ok && good;
    }
    printf("%s: argument checks of the NCCL fabric\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
