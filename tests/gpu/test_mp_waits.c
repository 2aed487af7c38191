/*
 * test_mp_waits.c - every device wait of the one-process-per-rank CUDA fabric ends, also while
 * no host is inside a TIDE call (src/fabric/cuda/watchdog.c, mp_flags.c; docs/cuda-fabric.md,
 * "Fail-stop").  Four processes on one GPU (M = 2, L = 2), TIDE_TIMEOUT_MS = 3000.
 *
 *   test_mp_waits --idle    Rank 2's caller stream is plugged (a wait on a host word) before
 *                           its all-gather call 3, so its device never reaches the call; every
 *                           rank enqueues call 3 and then leaves TIDE (cudaStreamSynchronize).
 *                           The survivors' synchronisations must return within TIDE_TIMEOUT_MS
 *                           + 2 s (the watchdog fails the group and the poison, CPU stores into
 *                           the host flags, releases their device waits), and their next TIDE
 *                           call must fail naming rank 2 ("its device never began it").  Rank
 *                           2, unplugged later, fails too.  Ranks 1 and 3 then exit with their
 *                           groups and communicators still open: the exit must not hang on the
 *                           watchdog threads.
 *   test_mp_waits --dereg   Ranks 0, 1, 3 deregister while rank 2 does not come (its host is
 *                           asleep) and keeps a device wait on a flag of rank 0 that only the
 *                           poison satisfies.  The survivors' deregistration must fail with
 *                           TIDE_ERR_TIMEOUT within the deadline + 2 s, and fail the group:
 *                           rank 2's wait ends within the same bound and its next TIDE call
 *                           fails with "could not deregister".
 *
 * Nothing may hang: every child has a 60 s alarm.  Exit status: 0 passed, 1 a rank saw
 * something else (printed), 2 a setup failure.
 */
#include "api/comm.h"
#include "fabric/cuda/mp.h"
#include "plan/plan.h"
#include "tide.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RANKS 4
#define LATE 2 /* the rank that does not keep up */
#define TIMEOUT_S 3.0

typedef struct {
    int step[RANKS];        /* 0: passed, else the step that failed */
    double released[RANKS]; /* seconds from leaving TIDE until the device wait ended */
    int result[RANKS];      /* of the TIDE call that must fail */
    char msg[RANKS][400];
} report_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int failed(report_t *rep, int r, int step) {
    rep->step[r] = step;
    snprintf(rep->msg[r], sizeof(rep->msg[r]), "%s", tide_get_last_error());
    return step;
}

static void note(report_t *rep, int r, tide_result_t res) {
    rep->result[r] = (int)res;
    snprintf(rep->msg[r], sizeof(rep->msg[r]), "%s", tide_get_last_error());
}

typedef struct {
    tide_comm_t comm;
    tide_group_t grp;
    void *shard;
    cudaStream_t s;
} rank_t;

static int setup(const char *name, int r, rank_t *k) {
    if (cudaSetDevice(0) != cudaSuccess) return 2;
    if (tide_comm_init_rank(TIDE_FABRIC_CUDA, 2, 2, r, name, &k->comm) != TIDE_SUCCESS) return 3;
    tide_param_shape_t shapes[2] = {{64, 32}, {7, 5}};
    tide_group_desc_t desc = {2, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = 2;
    cfg.gpus_per_node = 2;
    if (tide_group_register(k->comm, &cfg, &desc, &k->grp) != TIDE_SUCCESS) return 4;
    if (cudaMalloc(&k->shard, k->grp->plan->geom.shard_bytes) != cudaSuccess) return 5;
    if (cudaStreamCreateWithFlags(&k->s, cudaStreamNonBlocking) != cudaSuccess) return 6;
    cudaMemset(k->shard, r, k->grp->plan->geom.shard_bytes);
    if (cudaDeviceSynchronize() != cudaSuccess) return 7;
    /* Calls 0-2 run normally. */
    for (int e = 0; e < 3; ++e)
        if (tide_all_gather(k->grp, k->shard, e % 2, k->s) != TIDE_SUCCESS) return 8;
    if (tide_cuda_mp_sync(k->grp->arena, TIDE_COLL_ALL_GATHER) != TIDE_SUCCESS) return 9;
    return 0;
}

/* Poll stream s until it is idle or `limit` seconds passed; the seconds it took, or -1. */
static double wait_idle(cudaStream_t s, double limit) {
    const double t0 = now_s();
    while (now_s() - t0 < limit) {
        const cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) return now_s() - t0;
        if (e != cudaErrorNotReady) return -1;
        usleep(2000);
    }
    return -1;
}

/* ------------------------------------------------------------------ --idle */

static int idle_child(const char *name, int r, report_t *rep) {
    rank_t k;
    int st = setup(name, r, &k);
    if (st != 0) return failed(rep, r, st);
    volatile uint64_t *plug = NULL;
    if (r == LATE) {
        /* A device that is busy for a long time: the caller's stream waits on a host word. */
        if (cudaHostAlloc((void **)&plug, sizeof(*plug), cudaHostAllocMapped) != cudaSuccess)
            return failed(rep, r, 10);
        *plug = 0;
        void *dev = NULL;
        if (cudaHostGetDevicePointer(&dev, (void *)plug, 0) != cudaSuccess)
            return failed(rep, r, 11);
        if (cuStreamWaitValue64((CUstream)k.s, (CUdeviceptr)(uintptr_t)dev, 1,
                                CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
            return failed(rep, r, 12);
    }
    /* Call 3: every rank enqueues it (the argument check passes on the host). */
    if (tide_all_gather(k.grp, k.shard, 1, k.s) != TIDE_SUCCESS) return failed(rep, r, 13);
    if (r != LATE) {
        /* Out of TIDE: only the watchdog can end what the stream waits for. */
        const double t0 = now_s();
        const cudaError_t e = cudaStreamSynchronize(k.s);
        rep->released[r] = now_s() - t0;
        if (e != cudaSuccess) return failed(rep, r, 14);
        note(rep, r, tide_cuda_mp_sync(k.grp->arena, TIDE_COLL_ALL_GATHER));
    } else {
        sleep((unsigned)TIMEOUT_S + 3);
        *plug = 1;
        if (cudaStreamSynchronize(k.s) != cudaSuccess) return failed(rep, r, 15);
        note(rep, r, tide_cuda_mp_sync(k.grp->arena, TIDE_COLL_ALL_GATHER));
    }
    if (r == 1 || r == 3) return 0; /* exit with the group and the communicator open */
    tide_group_deregister(k.grp);
    tide_comm_destroy(k.comm);
    return 0;
}

static bool idle_verdict(const report_t *rep, int r) {
    if (r == LATE)
        return rep->result[r] == TIDE_ERR_TIMEOUT && strstr(rep->msg[r], "failed the group");
    return rep->result[r] == TIDE_ERR_TIMEOUT && rep->released[r] >= TIMEOUT_S - 0.2 &&
           rep->released[r] < TIMEOUT_S + 2.0 && strstr(rep->msg[r], "watchdog") != NULL &&
           strstr(rep->msg[r], "rank 2 (last: 2) enqueued all-gather call 3 but its device "
                               "never began it") != NULL;
}

/* ------------------------------------------------------------------ --dereg */

static int dereg_child(const char *name, int r, report_t *rep) {
    rank_t k;
    int st = setup(name, r, &k);
    if (st != 0) return failed(rep, r, st);
    if (r != LATE) {
        const double t0 = now_s();
        note(rep, r, tide_group_deregister(k.grp));
        rep->released[r] = now_s() - t0;
        tide_comm_destroy(k.comm);
        return 0;
    }
    /* A peer still waiting on rank 0's flags: its all-gather done flag reads 3 now; only the
     * poison (2^62) reaches 2^61. */
    tide_mp_arena_t *a = (tide_mp_arena_t *)k.grp->arena;
    if (cuStreamWaitValue64((CUstream)k.s, tide_cuda_mp_done_flag(a, 0, TIDE_COLL_ALL_GATHER),
                            (uint64_t)1 << 61, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
        return failed(rep, r, 20);
    rep->released[r] = wait_idle(k.s, TIMEOUT_S + 8.0);
    if (rep->released[r] < 0) return failed(rep, r, 21);
    note(rep, r, tide_cuda_mp_sync(k.grp->arena, TIDE_COLL_ALL_GATHER));
    tide_group_deregister(k.grp);
    tide_comm_destroy(k.comm);
    return 0;
}

static bool dereg_verdict(const report_t *rep, int r) {
    const bool in_time = rep->released[r] < TIMEOUT_S + 2.0;
    if (r == LATE)
        return in_time && rep->result[r] == TIDE_ERR_TIMEOUT &&
               strstr(rep->msg[r], "could not deregister") != NULL;
    return in_time && rep->released[r] >= TIMEOUT_S - 0.2 && rep->result[r] == TIDE_ERR_TIMEOUT;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    const bool idle = argc > 1 && strcmp(argv[1], "--idle") == 0;
    const bool dereg = argc > 1 && strcmp(argv[1], "--dereg") == 0;
    if (!idle && !dereg) {
        fprintf(stderr, "usage: test_mp_waits --idle | --dereg\n");
        return 2;
    }
    setenv("TIDE_TIMEOUT_MS", "3000", 1);
    report_t *rep =
        mmap(NULL, sizeof(*rep), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rep == MAP_FAILED) return 2;
    memset(rep, 0, sizeof(*rep));
    char name[64];
    snprintf(name, sizeof(name), "mpwaits%ld", (long)getpid());
    pid_t pids[RANKS];
    const double t0 = now_s();
    for (int r = 0; r < RANKS; ++r) {
        pids[r] = fork();
        if (pids[r] < 0) return 2;
        if (pids[r] == 0) {
            alarm(60); /* a hang is a failure, not a stuck job */
            /* exit, not _exit: the atexit handler that stops the watchdogs must run. */
            exit(idle ? idle_child(name, r, rep) : dereg_child(name, r, rep));
        }
    }
    bool ok = true;
    for (int r = 0; r < RANKS; ++r) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        bool good = WIFEXITED(st) && WEXITSTATUS(st) == 0 && rep->step[r] == 0;
        good = good && (idle ? idle_verdict(rep, r) : dereg_verdict(rep, r));
        if (WIFSIGNALED(st))
            printf("FAIL rank %d: killed by signal %d (SIGALRM: it hung)\n", r, WTERMSIG(st));
        else if (rep->step[r] != 0)
            printf("FAIL rank %d: step %d: %s\n", r, rep->step[r], rep->msg[r]);
        else
            printf("%s rank %d: released after %.3f s; %s: %s\n", good ? "ok  " : "FAIL", r,
                   rep->released[r], tide_get_error_string((tide_result_t)rep->result[r]),
                   rep->msg[r]);
        ok = ok && good;
    }
    printf("%s: %s (TIDE_TIMEOUT_MS = 3000, %.1f s in all)\n", ok ? "PASS" : "FAIL",
           idle ? "device waits of hosts outside TIDE end (watchdog)"
                : "a deregistration timeout fails the group and releases a peer's device wait",
           now_s() - t0);
    return ok ? 0 : 1;
}
