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
 * Before them, one process checks the environment's check of TIDE_CUDA_MP_FLAGS
 * (src/fabric/cuda/mp_flags.c): a misspelt value fails the communicator with
 * TIDE_ERR_INVALID_ARGUMENT naming host, device and kernel; each of the three is accepted.
 * Nothing may hang: each child has a 60 s alarm, TIDE_TIMEOUT_MS is 5000.
 *
 * Exit status: 0 passed, 1 a rank saw something else (printed), 2 a setup failure.
 */
#include "call_checks.h"
#include "tide.h"

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define RANKS 4

static int child(int r, const char *name, checks_report_t *rep) {
    if (cudaSetDevice(0) != cudaSuccess) return checks_failed(rep, r, 2);
    tide_comm_t comm;
    if (tide_comm_init_rank(TIDE_FABRIC_CUDA, 2, 2, r, name, &comm) != TIDE_SUCCESS)
        return checks_failed(rep, r, 3);
    const tide_group_desc_t desc = checks_desc();
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = 2;
    cfg.gpus_per_node = 2;
    tide_group_t ag, rs;
    if (tide_group_register(comm, &cfg, &desc, &ag) != TIDE_SUCCESS)
        return checks_failed(rep, r, 4);
    if (tide_group_register(comm, &cfg, &desc, &rs) != TIDE_SUCCESS)
        return checks_failed(rep, r, 5);
    checks_bufs_t b;
    if (!checks_alloc(&b, ag, rs, r)) return checks_failed(rep, r, 6);
    cudaDeviceSynchronize();

    int step = checks_slot(ag, &b, r, 1);
    if (step != 0) return checks_failed(rep, r, step);
    /* The group is unusable on every rank now. */
    if (tide_all_gather(ag, b.shard, 1, NULL) == TIDE_SUCCESS) return checks_failed(rep, r, 12);
    step = checks_alpha(rs, &b, r, 3);
    if (step != 0) return checks_failed(rep, r, step);
    if (cudaDeviceSynchronize() != cudaSuccess) return checks_failed(rep, r, 22);

    tide_group_deregister(ag);
    tide_group_deregister(rs);
    checks_free(&b);
    tide_comm_destroy(comm);
    return 0;
}

/* One rank per communicator: world creation reads TIDE_CUDA_MP_FLAGS.  0 passed, else the
 * step that failed (printed). */
static int flags_env_child(const char *name) {
    if (cudaSetDevice(0) != cudaSuccess) return 2;
    tide_comm_t comm;
    setenv("TIDE_CUDA_MP_FLAGS", "kernels", 1);
    const tide_result_t bad = tide_comm_init_rank(TIDE_FABRIC_CUDA, 1, 1, 0, name, &comm);
    if (bad != TIDE_ERR_INVALID_ARGUMENT || strstr(tide_get_last_error(), "kernels") == NULL ||
        strstr(tide_get_last_error(), "one of: kernel, auto, host, device") == NULL) {
        printf("FAIL: TIDE_CUDA_MP_FLAGS=kernels gave %s: %s\n", tide_get_error_string(bad),
               tide_get_last_error());
        return 3;
    }
    const char *good[] = {"host", "device", "kernel", "auto"};
    for (int k = 0; k < 4; ++k) {
        setenv("TIDE_CUDA_MP_FLAGS", good[k], 1);
        char job[96];
        snprintf(job, sizeof(job), "%s-%s", name, good[k]);
        if (tide_comm_init_rank(TIDE_FABRIC_CUDA, 1, 1, 0, job, &comm) != TIDE_SUCCESS) {
            printf("FAIL: TIDE_CUDA_MP_FLAGS=%s refused: %s\n", good[k], tide_get_last_error());
            return 4 + k;
        }
        tide_comm_destroy(comm);
    }
    return 0;
}

int main(void) {
    setenv("TIDE_TIMEOUT_MS", "5000", 1);
    {
        char name[64];
        snprintf(name, sizeof(name), "mpflags%ld", (long)getpid());
        const pid_t pid = fork();
        if (pid < 0) return 2;
        if (pid == 0) {
            alarm(60);
            _exit(flags_env_child(name));
        }
        int st = 0;
        waitpid(pid, &st, 0);
        const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        printf("%s: TIDE_CUDA_MP_FLAGS is checked (exit status %d)\n", ok ? "ok  " : "FAIL",
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        if (!ok) return 1;
    }
    checks_report_t *rep = checks_report_new();
    if (rep == NULL) return 2;
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
    const bool ok = checks_wait(pids, RANKS, rep, "both disagreements refused");
    printf("%s: argument checks of the one-process-per-rank CUDA fabric\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
