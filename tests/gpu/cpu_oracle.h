/*
 * cpu_oracle.h - what the one-process-per-rank GPU tests share around their oracle: the CPU
 * fabric's ranks run on threads of the parent process (one call of the test's rank function
 * each, before the ranks are forked), process-shared memory the forked ranks write their
 * results into, and the byte comparison of what they wrote.  Header-only, plain C.
 */
#ifndef TIDE_TESTS_GPU_CPU_ORACLE_H_
#define TIDE_TESTS_GPU_CPU_ORACLE_H_

#include "tide.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define CPU_ORACLE_MAX_RANKS 64

/* One rank of the oracle: on failure it writes why into err (len bytes) and returns false. */
typedef bool (*cpu_oracle_rank_fn)(void *ctx, tide_comm_t comm, int rank, char *err, size_t len);

typedef struct {
    cpu_oracle_rank_fn fn;
    void *ctx;
    tide_comm_t comm;
    int rank;
    char error[256];
} cpu_oracle_job_t;

static void *cpu_oracle_thread(void *arg) {
    cpu_oracle_job_t *j = (cpu_oracle_job_t *)arg;
    if (!j->fn(j->ctx, j->comm, j->rank, j->error, sizeof(j->error)) && !j->error[0])
        snprintf(j->error, sizeof(j->error), "failed");
    return NULL;
}

/* The CPU fabric's nodes x gpus_per_node ranks, each running fn(ctx, ...) on its own thread;
 * false (each failure printed, naming `what` and the rank) if any rank failed. */
static bool cpu_oracle_run(int nodes, int gpus_per_node, cpu_oracle_rank_fn fn, void *ctx,
                           const char *what) {
    const int n = nodes * gpus_per_node;
    if (n < 1 || n > CPU_ORACLE_MAX_RANKS) {
        fprintf(stderr, "FAIL: %s: %d ranks for the CPU oracle\n", what, n);
        return false;
    }
    tide_comm_t comms[CPU_ORACLE_MAX_RANKS];
    if (tide_comm_init_all(TIDE_FABRIC_CPU, nodes, gpus_per_node, comms) != TIDE_SUCCESS) {
        fprintf(stderr, "FAIL: %s: cpu comm_init_all: %s\n", what, tide_get_last_error());
        return false;
    }
    pthread_t th[CPU_ORACLE_MAX_RANKS];
    cpu_oracle_job_t jobs[CPU_ORACLE_MAX_RANKS];
    for (int r = 0; r < n; ++r) {
        jobs[r] = (cpu_oracle_job_t){.fn = fn, .ctx = ctx, .comm = comms[r], .rank = r};
        if (pthread_create(&th[r], NULL, cpu_oracle_thread, &jobs[r]) != 0) exit(2);
    }
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        pthread_join(th[r], NULL);
        if (jobs[r].error[0]) {
            fprintf(stderr, "FAIL: %s: cpu rank %d: %s\n", what, r, jobs[r].error);
            ok = false;
        }
    }
    for (int r = 0; r < n; ++r)
        tide_comm_destroy(comms[r]);
    return ok;
}

/* The first byte at which a and b differ, -1 if none of the n do. */
static long first_diff(const void *a, const void *b, size_t n) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    for (size_t i = 0; i < n; ++i)
        if (x[i] != y[i]) return (long)i;
    return -1;
}

/* n bytes every forked rank shares with the parent (zeroed); exit status 2 on failure. */
static void *shared_alloc(size_t n) {
    void *p = mmap(NULL, n > 0 ? n : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "FAIL: mmap %zu\n", n);
        exit(2);
    }
    return p;
}

/* Forks n rank processes, rank r exiting with child(ctx, r, name) and killed by an alarm after
 * alarm_s seconds (a hang is a failure, not a stuck job), and waits for them all; false if any
 * failed, each failure printed with what its rank wrote to errs[r * len]. */
static inline bool cpu_oracle_fork(int n, unsigned alarm_s, int (*child)(void *, int, const char *),
                                   void *ctx, const char *name, const char *errs, size_t len) {
    pid_t pids[CPU_ORACLE_MAX_RANKS];
    for (int r = 0; r < n && r < CPU_ORACLE_MAX_RANKS; ++r) {
        pids[r] = fork();
        if (pids[r] < 0) exit(2);
        if (pids[r] == 0) {
            alarm(alarm_s);
            _exit(child(ctx, r, name));
        }
    }
    bool ok = true;
    for (int r = 0; r < n && r < CPU_ORACLE_MAX_RANKS; ++r) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("FAIL N=%d rank %d: %s%s\n", n, r,
                   WIFSIGNALED(st) ? "killed by a signal (alarm: a hang?) " : "",
                   errs[r * len] ? errs + r * len : "exited non-zero");
            ok = false;
        }
    }
    return ok;
}

/* The worlds a replay test runs: N = 2 and 4, or only `only` (--ranks N) when it is not 0;
 * the worst of test(N)'s statuses, 2 for an N outside 1..max. */
static inline int cpu_oracle_worlds(int only, int max, int (*test)(int)) {
    if (only < 0 || only > max) {
        fprintf(stderr, "--ranks N: 1 <= N <= %d\n", max);
        return 2;
    }
    if (only != 0) return test(only);
    const int a = test(2), b = test(4);
    return a > b ? a : b;
}

/* In a forked rank's function whose rank_t `k` has an error buffer `k->err` of len bytes: a
 * failed library call (CPU_ORACLE_CK) or CUDA call (CPU_ORACLE_CU) is described there and the
 * function returns false; the parent prints it. */
#define CPU_ORACLE_CK(call, what, len)                                                             \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            snprintf(k->err, len, "%s: %s", what, tide_get_last_error());                          \
            return false;                                                                          \
        }                                                                                          \
    } while (0)
#define CPU_ORACLE_CU(call, what, len)                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            snprintf(k->err, len, "%s: %s", what, cudaGetErrorString(e_));                         \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

#endif /* TIDE_TESTS_GPU_CPU_ORACLE_H_ */
