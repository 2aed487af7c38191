/*
 * test_mp_checks.c - the one-process-per-rank CUDA fabric compares every call's arguments
 * across ranks (fabric.h, call_check; src/fabric/cuda/mp_ctl.h) and refuses a disagreement on
 * every rank.
 *
 * Four processes on one GPU (M = 2, L = 2), two groups:
 *   AG: calls 0 and 1 agree and succeed; in call 2 rank 1 passes slot 1 where the others pass
 *       slot 0: every rank gets TIDE_ERR_INVALID_ARGUMENT naming a slot and another rank,
 *       and a later call of the group fails too (the group is unusable on every rank).
 *   RS: call 0 agrees; in call 1 rank 3 passes alpha 0.5 where the others pass 1: every rank
 *       gets TIDE_ERR_INVALID_ARGUMENT naming alpha.
 * Nothing may hang: each child has a 60 s alarm, TIDE_TIMEOUT_MS is 5000.
 *
 * Exit status: 0 passed, 1 a rank saw something else (printed), 2 a setup failure.
 */
#include "api/comm.h"
#include "plan/plan.h"
#include "tide.h"

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define RANKS 4

typedef struct {
    int step[RANKS]; /* 0: passed, else the step that failed */
    char msg[RANKS][320];
} report_t;

/* A child's step failed: remember it and the library's message. */
static int failed(report_t *rep, int r, int step) {
    rep->step[r] = step;
    snprintf(rep->msg[r], sizeof(rep->msg[r]), "%s", tide_get_last_error());
    return step;
}

static bool refused(tide_result_t res, const char *what) {
    return res == TIDE_ERR_INVALID_ARGUMENT && strstr(tide_get_last_error(), what) != NULL &&
           strstr(tide_get_last_error(), "disagree") != NULL;
}

static int child(int r, const char *name, report_t *rep) {
    if (cudaSetDevice(0) != cudaSuccess) return failed(rep, r, 2);
    tide_comm_t comm;
    if (tide_comm_init_rank(TIDE_FABRIC_CUDA, 2, 2, r, name, &comm) != TIDE_SUCCESS)
        return failed(rep, r, 3);
    tide_param_shape_t shapes[2] = {{64, 32}, {7, 5}};
    tide_group_desc_t desc = {2, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = 2;
    cfg.gpus_per_node = 2;
    tide_group_t ag, rs;
    if (tide_group_register(comm, &cfg, &desc, &ag) != TIDE_SUCCESS) return failed(rep, r, 4);
    if (tide_group_register(comm, &cfg, &desc, &rs) != TIDE_SUCCESS) return failed(rep, r, 5);
    const tide_geom_t *g = &rs->plan->geom;
    void *shard = NULL, *out = NULL, *grads[2] = {NULL, NULL};
    if (cudaMalloc(&shard, ag->plan->geom.shard_bytes) != cudaSuccess ||
        cudaMalloc(&out, g->fp32_shard_bytes) != cudaSuccess)
        return failed(rep, r, 6);
    cudaMemset(shard, r, ag->plan->geom.shard_bytes);
    for (int p = 0; p < 2; ++p) {
        const size_t b = g->params[p].dim0 * g->params[p].inner * g->grad_item;
        if (cudaMalloc(&grads[p], b) != cudaSuccess) return failed(rep, r, 7);
        cudaMemset(grads[p], 0, b);
    }
    cudaDeviceSynchronize();

    for (int e = 0; e < 2; ++e)
        if (tide_all_gather(ag, shard, e % 2, NULL) != TIDE_SUCCESS) return failed(rep, r, 10);
    if (!refused(tide_all_gather(ag, shard, r == 1 ? 1 : 0, NULL), "slot"))
        return failed(rep, r, 11);
    /* The group is unusable on every rank now. */
    if (tide_all_gather(ag, shard, 1, NULL) == TIDE_SUCCESS) return failed(rep, r, 12);

    if (tide_reduce_scatter(rs, (const void *const *)grads, out, 1.0f, 0, TIDE_RS_IN_PLACE,
                            NULL) != TIDE_SUCCESS)
        return failed(rep, r, 20);
    if (!refused(tide_reduce_scatter(rs, (const void *const *)grads, out, r == 3 ? 0.5f : 1.0f,
                                     0, TIDE_RS_IN_PLACE, NULL),
                 "alpha"))
        return failed(rep, r, 21);
    if (cudaDeviceSynchronize() != cudaSuccess) return failed(rep, r, 22);

    tide_group_deregister(ag);
    tide_group_deregister(rs);
    for (int p = 0; p < 2; ++p)
        cudaFree(grads[p]);
    cudaFree(shard);
    cudaFree(out);
    tide_comm_destroy(comm);
    return 0;
}

int main(void) {
    setenv("TIDE_TIMEOUT_MS", "5000", 1);
    report_t *rep =
        mmap(NULL, sizeof(*rep), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rep == MAP_FAILED) return 2;
    memset(rep, 0, sizeof(*rep));
    char name[64];
    snprintf(name, sizeof(name), "mpcheck%ld", (long)getpid());
    pid_t pids[RANKS];
    for (int r = 0; r < RANKS; ++r) {
        pids[r] = fork();
        if (pids[r] < 0) return 2;
        if (pids[r] == 0) {
            alarm(60); /* a hang is a failure, not a stuck job */
            _exit(child(r, name, rep));
        }
    }
    bool ok = true;
    for (int r = 0; r < RANKS; ++r) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        const bool good = WIFEXITED(st) && WEXITSTATUS(st) == 0 && rep->step[r] == 0;
        if (good)
            printf("ok   rank %d: both disagreements refused\n", r);
        else if (WIFSIGNALED(st))
            printf("FAIL rank %d: killed by signal %d (SIGALRM: it hung)\n", r, WTERMSIG(st));
        else
            printf("FAIL rank %d: step %d: %s\n", r, rep->step[r], rep->msg[r]);
        ok = ok && good;
    }
    printf("%s: argument checks of the one-process-per-rank CUDA fabric\n",
           ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
