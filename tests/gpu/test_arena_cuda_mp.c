/*
 * test_arena_cuda_mp.c - groups on one shared arena (docs/arena.md) on the CUDA fabric with
 * one process per rank (src/fabric/cuda/mp_view.c): each group runs on a view of the set's
 * segments, with its own families and flag area, and the cross-group fence runs as stream
 * work (flag writes into the peers' segments, waits on the own flags).
 *
 *   test_arena_cuda_mp            1x2, 1x4 and 2x2 ranks as processes on GPU 0, both RS modes
 *   test_arena_cuda_mp --kill     1x2: rank 1 dies in the middle of a step; rank 0 fails stop
 *                                 within TIDE_TIMEOUT_MS, its streams drain (the poison covers
 *                                 every view's flags), and every group of the set fails after
 *   test_arena_cuda_mp --rails    2x1 with TIDE_CUDA_MP_RAILS=1: groups_register is refused
 *                                 (TIDE_ERR_UNSUPPORTED naming rails) on every rank
 *   test_arena_cuda_mp --nccl     the NCCL fabric, one rank in this process (NCCL takes one
 *                                 GPU per rank), both modes: the same views on an NCCL window
 *
 * A set of 3 groups of different sizes (ring slots 0, 1, 0: the third block takes over the
 * first block's slot) runs FSDP2's order for 3 steps (tide_ring_fsdp_calls: forward AGs with
 * reshard, backward AG + RS in reverse; Slot-Reuse stages the gradients in the vacated ring
 * slot).  All-gathers are enqueued on one stream and reduce-scatters on another, as FSDP2
 * does, so that the fence must order work across streams and processes.  Every call is
 * repeated on the same group registered alone (its own arena) on a third stream; landings
 * and outputs are copied out on the call's stream right after the call -- before any later
 * call may overwrite them -- and must be equal bit for bit (wide-exponent bf16 over 2^-40 ..
 * 2^40, so a changed summation order would show); landings must also hold every rank's
 * shard at Landing(p, r) (each process generates every rank's shards from the same seeds).
 * Each group's read-done event must be its own.  At least one fence must have run.
 *
 * The parent forks the ranks before it touches CUDA; each child prints FAIL lines that say
 * what failed and exits non-zero; the parent prints one PASS / FAIL line per configuration.
 * Every child has an alarm: nothing may hang (TIDE_TIMEOUT_MS is 5000 unless set).  The set's
 * groups, the step's data, the records and the call script are arena_check.c's.
 */
#include "tide.h"

#include "api/comm.h"
#include "arena_check.h"
#include "fabric/cuda/mp.h"

#include <cuda_runtime.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_N 4
#define G ARENA_G
#define MAX_P ARENA_MAX_P

/* The configuration (first: the arena_ops_t callbacks get &c->a) and this rank's part. */
typedef struct {
    arena_run_t a;
    tide_comm_t comm;
    tide_group_t set[G], alone[G];
    cudaStream_t ag, rs, lone;
    cudaEvent_t ag_done;
    uint16_t *h_grads[G]; /* this rank's */
    void *d_shard[G], *d_grads[G];
    float *d_out_set[G], *d_out_alone[G];
    int die; /* the --kill run: rank 1 dies in the middle of the second step */
} ctx_t;

#define TRY(call, what) ARENA_TRY(&c->a, call, what)
#define CU(call, what) ARENA_CU(&c->a, call, what)

/* The library's calls first (watchdog: a missing peer is an error, not a hang), then the
 * device. */
static int sync_all(arena_run_t *a) {
    ctx_t *c = (ctx_t *)a;
    for (int i = 0; i < G; ++i) {
        tide_mp_arena_t *v = (tide_mp_arena_t *)c->set[i]->arena;
        for (int f = 0; f < 3; ++f)
            TRY(tide_cuda_mp_sync_family(v, f), "sync (set)");
        TRY(tide_cuda_mp_sync(c->alone[i]->arena, TIDE_COLL_ALL_GATHER), "sync (alone)");
        TRY(tide_cuda_mp_sync(c->alone[i]->arena, TIDE_COLL_REDUCE_SCATTER), "sync (alone)");
    }
    CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return 1;
}

static int new_step(arena_run_t *a, int step) {
    ctx_t *c = (ctx_t *)a;
    arena_host_step(a, step);
    for (int i = 0; i < G; ++i) {
        const uint64_t S = a->sum[i].shard_bytes;
        arena_fill_grads(a, i, a->me, step, c->h_grads[i]);
        CU(cudaMemcpy(c->d_shard[i], a->h_shards[i] + a->me * S / 2, S, cudaMemcpyHostToDevice),
           "upload shard");
        CU(cudaMemcpy(c->d_grads[i], c->h_grads[i], arena_grad_elems(a, i) * 2,
                      cudaMemcpyHostToDevice),
           "upload grads");
    }
    /* cudaMemcpy from pageable memory may return before its DMA landed, and the calls run
     * on non-blocking streams: finish the uploads first. */
    CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize(uploads)");
    return 1;
}

static int gather(arena_run_t *a, int i) {
    ctx_t *c = (ctx_t *)a;
    char what[96];
    TRY(tide_all_gather(c->set[i], c->d_shard[i], 0, c->ag), "all_gather (set)");
    TRY(tide_all_gather(c->alone[i], c->d_shard[i], 0, c->lone), "all_gather (alone)");
    void *pa = NULL, *pb = NULL;
    TRY(tide_group_landing(c->set[i], 0, &pa), "group_landing");
    TRY(tide_group_landing(c->alone[i], 0, &pb), "group_landing");
    snprintf(what, sizeof(what), "AG of group %d's landing", i);
    if (!arena_record(a, pa, c->ag, pb, c->lone, a->sum[i].group_bytes, a->h_landing[i], what))
        return 0;
    /* After the copy out: the staging of a Slot-Reuse RS overwrites the landing. */
    CU(cudaEventRecord(c->ag_done, c->ag), "cudaEventRecord");
    return 1;
}

static int reshard(arena_run_t *a, int i) {
    ctx_t *c = (ctx_t *)a;
    TRY(tide_group_reshard(c->set[i]), "group_reshard");
    return 1;
}

static int reduce(arena_run_t *a, int i, int step) {
    ctx_t *c = (ctx_t *)a;
    char what[96];
    const float alpha = tide_alpha_avg(a->n);
    const int acc = step > 0;
    const void *g_set[MAX_P], *g_alone[MAX_P];
    /* FSDP2: the backward (here: the staging) follows the all-gather. */
    CU(cudaStreamWaitEvent(c->rs, c->ag_done, 0), "cudaStreamWaitEvent");
    const uint8_t *staged = c->d_grads[i];
    if (a->mode == TIDE_RS_SLOT_REUSE) {
        void *slot = NULL;
        TRY(tide_group_landing(c->set[i], 0, &slot), "group_landing");
        CU(cudaMemcpyAsync(slot, c->d_grads[i], arena_grad_elems(a, i) * 2,
                           cudaMemcpyDeviceToDevice, c->rs),
           "stage gradients");
        staged = slot; /* the vacated ring slot */
    }
    arena_grad_ptrs(a, i, staged, g_set);
    arena_grad_ptrs(a, i, c->d_grads[i], g_alone);
    TRY(tide_reduce_scatter(c->set[i], g_set, c->d_out_set[i], alpha, acc, a->mode, c->rs),
        "reduce_scatter (set)");
    TRY(tide_reduce_scatter(c->alone[i], g_alone, c->d_out_alone[i], alpha, acc, a->mode, c->lone),
        "reduce_scatter (alone)");
    snprintf(what, sizeof(what), "RS of group %d's output", i);
    return arena_record(a, c->d_out_set[i], c->rs, c->d_out_alone[i], c->lone,
                        a->sum[i].fp32_shard_bytes, NULL, what);
}

/* The --kill run: rank 1 dies in the middle of the second step. */
static void maybe_die(arena_run_t *a, int k, int per_step) {
    const ctx_t *c = (const ctx_t *)a;
    if (c->die && a->me == 1 && k == per_step + per_step / 2) {
        /* Dies with its enqueued work: the peers' device waits on its flags would hang
         * without the poison. */
        fflush(stdout);
        kill(getpid(), SIGKILL);
    }
}

static const arena_ops_t ops = {
    .before = maybe_die,
    .sync = sync_all,
    .new_step = new_step,
    .gather = gather,
    .reshard = reshard,
    .reduce = reduce,
};

static int setup(ctx_t *c) {
    arena_run_t *a = &c->a;
    TRY(tide_groups_register(c->comm, G, a->entries, c->set), "groups_register");
    for (int i = 0; i < G; ++i)
        TRY(tide_group_register(c->comm, &a->cfg, &a->desc[i], &c->alone[i]),
            "group_register (alone)");
    if (!arena_learn_plans(a, c->alone)) return 0;
    for (int i = 0; i < G; ++i) {
        c->h_grads[i] = calloc(arena_grad_elems(a, i), 2);
        CU(cudaMalloc(&c->d_shard[i], a->sum[i].shard_bytes), "cudaMalloc");
        CU(cudaMalloc(&c->d_grads[i], arena_grad_elems(a, i) * 2), "cudaMalloc");
        CU(cudaMalloc((void **)&c->d_out_set[i], a->sum[i].fp32_shard_bytes), "cudaMalloc");
        CU(cudaMalloc((void **)&c->d_out_alone[i], a->sum[i].fp32_shard_bytes), "cudaMalloc");
    }
    CU(cudaStreamCreateWithFlags(&c->ag, cudaStreamNonBlocking), "cudaStreamCreate");
    CU(cudaStreamCreateWithFlags(&c->rs, cudaStreamNonBlocking), "cudaStreamCreate");
    CU(cudaStreamCreateWithFlags(&c->lone, cudaStreamNonBlocking), "cudaStreamCreate");
    CU(cudaEventCreateWithFlags(&c->ag_done, cudaEventDisableTiming), "cudaEventCreate");
    return 1;
}

static void teardown(ctx_t *c, int expect_ok) {
    arena_run_t *a = &c->a;
    if (expect_ok) sync_all(a);
    for (int i = 0; i < G; ++i) {
        if (c->set[i] != NULL && tide_group_deregister(c->set[i]) != TIDE_SUCCESS && expect_ok)
            arena_fail(a, "deregister (set): %s", tide_get_last_error());
        if (c->alone[i] != NULL) tide_group_deregister(c->alone[i]);
    }
    if (c->ag != NULL) cudaStreamDestroy(c->ag);
    if (c->rs != NULL) cudaStreamDestroy(c->rs);
    if (c->lone != NULL) cudaStreamDestroy(c->lone);
    if (c->ag_done != NULL) cudaEventDestroy(c->ag_done);
    for (int i = 0; i < G; ++i) {
        cudaFree(c->d_shard[i]);
        cudaFree(c->d_grads[i]);
        cudaFree(c->d_out_set[i]);
        cudaFree(c->d_out_alone[i]);
        free(c->h_grads[i]);
    }
    arena_run_free(a);
}

static ctx_t *ctx_new(tide_comm_t comm, int m, int l, int me, tide_rs_mode_t mode) {
    ctx_t *c = calloc(1, sizeof(*c));
    arena_run_init(&c->a, m, l, me, mode);
    c->comm = comm;
    return c;
}

/* Both modes on one communicator: the number of FAIL lines. */
static int run_modes(tide_comm_t comm, int m, int l, int me) {
    int bad = 0;
    for (int mode = 0; mode < 2; ++mode) {
        ctx_t *c = ctx_new(comm, m, l, me, (tide_rs_mode_t)mode);
        if (setup(c) && arena_script(&c->a, &ops) &&
            arena_check_read_done(&c->a, c->set, c->lone)) {
            if (arena_fences(c->set, G) == 0) arena_fail(&c->a, "%s", "no cross-group fence ran");
        }
        teardown(c, 1);
        bad += c->a.bad;
        free(c);
    }
    return bad;
}

/* Rank me of an m x l world on GPU 0, or NULL after a FAIL line (what: the run's word). */
static tide_comm_t open_rank(int m, int l, int me, const char *name, const char *what) {
    tide_comm_t comm = NULL;
    if (cudaSetDevice(0) != cudaSuccess ||
        tide_comm_init_rank(TIDE_FABRIC_CUDA, m, l, me, name, &comm) != TIDE_SUCCESS) {
        printf("FAIL %s%dx%d rank %d: comm_init_rank: %s\n", what, m, l, me, tide_get_last_error());
        return NULL;
    }
    return comm;
}

/* One rank of the matrix. */
static int child_matrix(int m, int l, int me, const char *name) {
    tide_comm_t comm = open_rank(m, l, me, name, "");
    if (comm == NULL) return 1;
    const int bad = run_modes(comm, m, l, me);
    tide_comm_destroy(comm);
    return bad != 0;
}

/* The NCCL fabric's one-rank communicator (NCCL takes one GPU per rank, so one GPU runs
 * N = 1): the same views, flag areas, fence program and sibling waits (mp_view.c) on an
 * NCCL window. */
static int run_nccl(void) {
    uint8_t id[TIDE_NCCL_UNIQUE_ID_BYTES];
    tide_comm_t comm = NULL;
    if (cudaSetDevice(0) != cudaSuccess || tide_nccl_get_unique_id(id) != TIDE_SUCCESS ||
        tide_comm_init_nccl(1, 1, 0, id, &comm) != TIDE_SUCCESS) {
        printf("FAIL nccl 1x1: comm_init_nccl: %s\n", tide_get_last_error());
        return 1;
    }
    const int bad = run_modes(comm, 1, 1, 0);
    tide_comm_destroy(comm);
    printf("%s nccl 1x1, both modes: %d steps of FSDP order on a shared arena of %d groups, "
           "bit-equal to each group alone\n",
           bad ? "FAIL" : "PASS", ARENA_STEPS, G);
    return bad != 0;
}

/* Rank 0 of the --kill run: rank 1 dies mid-step; rank 0 must fail stop (never hang), its
 * streams must drain, and every group of the set must fail afterwards. */
static int child_kill(int me, const char *name) {
    tide_comm_t comm = open_rank(1, 2, me, name, "kill ");
    if (comm == NULL) return 1;
    ctx_t *c = ctx_new(comm, 1, 2, me, TIDE_RS_SLOT_REUSE);
    int ok = setup(c);
    c->a.expect_fail = 1;
    c->die = 1;
    const int done = ok && arena_script(&c->a, &ops);
    int bad = 0;
    if (!ok) {
        bad = 1; /* setup printed why */
    } else if (me == 0) {
        if (done) {
            c->a.expect_fail = 0;
            bad = arena_fail(&c->a, "%s", "the script completed although rank 1 died") == 0;
        } else {
            /* The groups registered alone are groups of their own: each fails stop (and
             * poisons its flags) when its own wait meets the dead rank.  They share the
             * world's streams with the set, so they must be released too. */
            for (int i = 0; i < G; ++i) {
                (void)tide_cuda_mp_sync(c->alone[i]->arena, TIDE_COLL_ALL_GATHER);
                (void)tide_cuda_mp_sync(c->alone[i]->arena, TIDE_COLL_REDUCE_SCATTER);
            }
            /* The streams drain: a device wait left on a view's flag (a fence's, or a call's
             * of a view) would hang here, until the alarm ends the process. */
            c->a.expect_fail = 0;
            const cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess)
                bad |= arena_fail(&c->a, "streams after the fail-stop: %s",
                                  cudaGetErrorString(e)) == 0;
            /* No slot live (the ring rule would refuse first): the call reaches the set's
             * argument check, which must report the failed set. */
            for (int i = 0; i < G; ++i)
                (void)tide_group_reshard(c->set[i]);
            for (int i = 0; i < G; ++i) {
                const tide_result_t r = tide_all_gather(c->set[i], c->d_shard[i], 0, c->ag);
                if (r == TIDE_SUCCESS || strstr(tide_get_last_error(), "rank 1") == NULL)
                    bad |= arena_fail(&c->a,
                                      "group %d after the fail-stop: returned %d, not an error "
                                      "naming rank 1: %s",
                                      i, (int)r, tide_get_last_error()) == 0;
            }
        }
    }
    teardown(c, 0);
    free(c);
    tide_comm_destroy(comm);
    return bad;
}

/* A rank of the --rails run: the set is refused on every rank, saying why. */
static int child_rails(int me, const char *name) {
    tide_comm_t comm = open_rank(2, 1, me, name, "rails ");
    if (comm == NULL) return 1;
    ctx_t *c = ctx_new(comm, 2, 1, me, TIDE_RS_IN_PLACE);
    c->a.expect_fail = 1;
    const int ok = setup(c);
    int bad = 0;
    if (ok || strstr(tide_get_last_error(), "rails") == NULL) {
        printf("FAIL rails rank %d: groups_register was not refused naming rails: %s\n", me,
               ok ? "(it succeeded)" : tide_get_last_error());
        bad = 1;
    }
    teardown(c, 0);
    free(c);
    tide_comm_destroy(comm);
    return bad;
}

typedef enum { RUN_MATRIX, RUN_KILL, RUN_RAILS } run_t;

/* Fork the N ranks, wait for them (each has an alarm), print the verdict. */
static int fork_ranks(run_t kind, int m, int l, const char *what) {
    const int n = m * l;
    char name[64];
    snprintf(name, sizeof(name), "tide-test-arena-mp-%d-%d%d%d", (int)getpid(), (int)kind, m, l);
    pid_t pids[MAX_N];
    fflush(stdout);
    for (int r = 0; r < n; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(240);
            int rc = kind == RUN_MATRIX ? child_matrix(m, l, r, name)
                     : kind == RUN_KILL ? child_kill(r, name)
                                        : child_rails(r, name);
            fflush(stdout);
            _exit(rc);
        }
    }
    int ok = 1;
    for (int r = 0; r < n; ++r) {
        int st = 0;
        const int got = pids[r] > 0 && waitpid(pids[r], &st, 0) == pids[r];
        if (kind == RUN_KILL && r == 1) {
            ok &= got && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
            continue;
        }
        ok &= got && WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (got && WIFSIGNALED(st)) printf("  rank %d ended by signal %d\n", r, WTERMSIG(st));
    }
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    fflush(stdout);
    return !ok;
}

int main(int argc, char **argv) {
    /* Each child's watchdog window; a failure must come well within the alarm. */
    setenv("TIDE_TIMEOUT_MS", getenv("TIDE_TIMEOUT_MS") ? getenv("TIDE_TIMEOUT_MS") : "5000", 1);
    int failed = 0;
    if (argc > 1 && strcmp(argv[1], "--kill") == 0) {
        failed += fork_ranks(RUN_KILL, 1, 2,
                             "1x2 slot_reuse: rank 1 killed mid-step; rank 0 fails stop, its "
                             "streams drain, every group of the set fails after");
    } else if (argc > 1 && strcmp(argv[1], "--nccl") == 0) {
        alarm(240); /* in this process: nothing may hang */
        failed += run_nccl();
    } else if (argc > 1 && strcmp(argv[1], "--rails") == 0) {
        setenv("TIDE_CUDA_MP_RAILS", "1", 1);
        failed +=
            fork_ranks(RUN_RAILS, 2, 1, "2x1 with rails: groups_register refused on every rank");
    } else {
        const int topo[3][2] = {{1, 2}, {1, 4}, {2, 2}};
        for (int t = 0; t < 3; ++t) {
            char what[160];
            snprintf(what, sizeof(what),
                     "%dx%d (processes on one GPU), both modes: %d steps of FSDP order on a "
                     "shared arena of %d groups, bit-equal to each group alone",
                     topo[t][0], topo[t][1], ARENA_STEPS, G);
            failed += fork_ranks(RUN_MATRIX, topo[t][0], topo[t][1], what);
        }
    }
    printf("test_arena_cuda_mp: %d failure(s)\n", failed);
    return failed != 0;
}
