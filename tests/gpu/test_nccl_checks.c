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
#include "call_checks.h"
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

/* Rank 0's NCCL id for rank 1, in memory both share. */
typedef struct {
    _Atomic int id_ready;
    uint8_t id[TIDE_NCCL_UNIQUE_ID_BYTES];
} shared_id_t;

static int child(int r, shared_id_t *sh, checks_report_t *rep) {
    if (cudaSetDevice(r) != cudaSuccess) return checks_failed(rep, r, 2);
    if (r == 0) {
        if (tide_nccl_get_unique_id(sh->id) != TIDE_SUCCESS) return checks_failed(rep, r, 3);
        atomic_store(&sh->id_ready, 1);
    } else {
        while (atomic_load(&sh->id_ready) == 0)
            usleep(1000);
    }
    tide_comm_t comm;
    if (tide_comm_init_nccl(1, RANKS, r, sh->id, &comm) != TIDE_SUCCESS)
        return checks_failed(rep, r, 4);
    const tide_group_desc_t desc = checks_desc();
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = 1;
    cfg.gpus_per_node = RANKS;
    tide_group_t ag, rs, third;
    if (tide_group_register(comm, &cfg, &desc, &ag) != TIDE_SUCCESS)
        return checks_failed(rep, r, 5);
    if (tide_group_register(comm, &cfg, &desc, &rs) != TIDE_SUCCESS)
        return checks_failed(rep, r, 6);
    if (tide_group_register(comm, &cfg, &desc, &third) != TIDE_SUCCESS)
        return checks_failed(rep, r, 7);
    checks_bufs_t b;
    if (!checks_alloc(&b, ag, rs, r)) return checks_failed(rep, r, 8);
    cudaDeviceSynchronize();

    int step = checks_slot(ag, &b, r, 1);
    if (step == 0) step = checks_alpha(rs, &b, r, 1);
    if (step != 0) return checks_failed(rep, r, step);
    const tide_result_t res = r == 0 ? tide_all_gather(third, b.shard, 0, NULL)
                                     : tide_reduce_scatter(third, (const void *const *)b.grads,
                                                           b.out, 1.0f, 0, TIDE_RS_IN_PLACE, NULL);
    if (!checks_refused(res, "which call")) return checks_failed(rep, r, 30);
    if (cudaDeviceSynchronize() != cudaSuccess) return checks_failed(rep, r, 31);

    tide_group_deregister(ag);
    tide_group_deregister(rs);
    tide_group_deregister(third);
    checks_free(&b);
    tide_comm_destroy(comm);
    return 0;
}

int main(void) {
    setenv("TIDE_TIMEOUT_MS", "10000", 1);
    checks_report_t *rep = checks_report_new();
    shared_id_t *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rep == NULL || sh == MAP_FAILED) return 2;
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
            _exit(child(r, sh, rep));
        }
    }
    const bool ok =
        checks_wait(pids, RANKS, rep, "slot, alpha and call-order disagreements refused");
    printf("%s: argument checks of the NCCL fabric\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
