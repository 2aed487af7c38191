/*
 * cuda_procs.c - tide-bench with one process per rank: the CUDA mp fabric (--fabric cuda
 * --procs N) or the NCCL fabric (--fabric nccl --procs N).  The parent forks the N ranks
 * before touching CUDA; rank r runs on visible device r mod D (on the CUDA fabric several
 * ranks share a GPU when D < N; NCCL refuses that, so main.c asks for N GPUs first) and joins
 * with tide_comm_init_rank or tide_comm_init_nccl; only that step differs.  The
 * stock path needs the peers' shards and packs: each rank exports them with legacy CUDA IPC
 * handles over a socket mesh of its own (the fabric's bootstrap, mp_boot.h, under another
 * name).  A time is rank 0's host wall time between two barriers of every rank, each rank
 * having synchronised its stream: from the first enqueue to the last rank's end, as the
 * one-process runner measures.  Rank 0's table comes back to the parent through shared
 * memory; the data check sums every rank's wrong elements.
 */
#include "tide-bench/cuda_bench.h"

#include "core/checks.h"
#include "fabric/cuda/mp_boot.h"
#include "fabric/fabric.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    bench_row_t rows[32];
    int num_rows;
    int result; /* rank 0's tide_result_t */
} procs_report_t;

typedef struct {
    cudaIpcMemHandle_t shard, pack;
} ipc_blob_t;

#define STEP(call)                                                                                \
    do {                                                                                          \
        res = (call);                                                                             \
        if (res != TIDE_SUCCESS) {                                                                \
            fprintf(stderr, "tide-bench: rank %d: %s: %s\n", rank, #call, tide_get_last_error()); \
            goto out;                                                                             \
        }                                                                                         \
    } while (0)
#define CUSTEP(call)                                                                              \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "tide-bench: rank %d: %s: %s\n", rank, #call,                         \
                    cudaGetErrorString(e_));                                                      \
            res = TIDE_ERR_FABRIC;                                                                \
            goto out;                                                                             \
        }                                                                                         \
    } while (0)

static tide_result_t run_size(const bench_opts_t *o, tide_comm_t comm, tide_mp_boot_t *boot,
                              const tide_param_shape_t *shapes, int P, int divisor, int dev,
                              bench_row_t *rows) {
    const int N = o->nodes * o->gpus_per_node, rank = boot->rank;
    const int64_t timeout = tide_fabric_timeout_ms();
    const float alpha = (N & (N - 1)) == 0 ? 1.0f / (float)N : 1.0f;
    tide_result_t res = TIDE_SUCCESS;
    tide_group_t group = NULL;
    tide_plan_t plan = NULL;
    bench_cuda_rank_t rk;
    memset(&rk, 0, sizeof(rk));
    uint16_t **shards = calloc((size_t)N, sizeof(*shards));
    float **packs = calloc((size_t)N, sizeof(*packs));
    ipc_blob_t *blobs = calloc((size_t)N, sizeof(*blobs));
    uint64_t *wrong = calloc((size_t)N * 2, sizeof(*wrong));
    double *times[4] = {0};
    for (int k = 0; k < 4; ++k) times[k] = calloc((size_t)o->iters, sizeof(double));
    bool opened = false;
    if (!shards || !packs || !blobs || !wrong || !times[0] || !times[1] || !times[2] ||
        !times[3]) {
        res = TIDE_ERR_NO_MEMORY;
        goto out;
    }
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = o->nodes, cfg.gpus_per_node = o->gpus_per_node;
    tide_group_desc_t desc = {P, shapes, TIDE_DTYPE_BF16, o->grad_dtype, TIDE_DTYPE_BF16};
    STEP(tide_plan_create(&cfg, &desc, &plan));
    STEP(tide_group_register(comm, &cfg, &desc, &group));
    STEP(bench_cuda_rank_init(&rk, o, shapes, P, plan, rank, dev));
    /* The peers' shards and packs for the stock path. */
    ipc_blob_t mine;
    memset(&mine, 0, sizeof(mine));
    CUSTEP(cudaIpcGetMemHandle(&mine.shard, rk.shard));
    CUSTEP(cudaIpcGetMemHandle(&mine.pack, rk.pack));
    STEP(tide_mp_boot_allgather(boot, &mine, sizeof(mine), -1, blobs, NULL, timeout));
    opened = true;
    for (int u = 0; u < N; ++u) {
        if (u == rank) {
            shards[u] = rk.shard, packs[u] = rk.pack;
            continue;
        }
        CUSTEP(cudaIpcOpenMemHandle((void **)&shards[u], blobs[u].shard,
                                    cudaIpcMemLazyEnablePeerAccess));
        CUSTEP(cudaIpcOpenMemHandle((void **)&packs[u], blobs[u].pack,
                                    cudaIpcMemLazyEnablePeerAccess));
    }
    STEP(bench_cuda_set_packs(&rk, packs));
    uint64_t tag = 0x100;
    int last_slot = 0;
    for (int it = 0; it < o->warmup + o->iters; ++it) {
        const int slot = it % 2;
        double t[5];
        STEP(tide_mp_boot_barrier(boot, ++tag, timeout));
        t[0] = bench_now_us();
        STEP(tide_all_gather(group, rk.shard, slot, rk.st));
        CUSTEP(cudaStreamSynchronize(rk.st));
        STEP(tide_mp_boot_barrier(boot, ++tag, timeout));
        t[1] = bench_now_us();
        STEP(bench_cuda_stock_ag(&rk, shards));
        CUSTEP(cudaStreamSynchronize(rk.st));
        STEP(tide_mp_boot_barrier(boot, ++tag, timeout));
        t[2] = bench_now_us();
        STEP(tide_reduce_scatter(group, (const void *const *)rk.grads, rk.out_tide, alpha, 0,
                                 o->mode, rk.st));
        CUSTEP(cudaStreamSynchronize(rk.st));
        STEP(tide_mp_boot_barrier(boot, ++tag, timeout));
        t[3] = bench_now_us();
        STEP(bench_cuda_stock_pack(&rk));
        CUSTEP(cudaStreamSynchronize(rk.st));
        /* Every pack is complete before any rank sums its chunk of them. */
        STEP(tide_mp_boot_barrier(boot, ++tag, timeout));
        STEP(bench_cuda_stock_reduce(&rk, alpha));
        CUSTEP(cudaStreamSynchronize(rk.st));
        STEP(tide_mp_boot_barrier(boot, ++tag, timeout));
        t[4] = bench_now_us();
        if (it >= o->warmup)
            for (int k = 0; k < 4; ++k) times[k][it - o->warmup] = t[k + 1] - t[k];
        last_slot = slot;
    }
    /* What the barriers around every timed call cost by themselves: each procs time holds
     * one barrier (rank 0's wall time runs from one barrier's exit to the next's), which the
     * one-process runner does not pay. */
    double *bar = calloc((size_t)o->iters, sizeof(double));
    if (bar == NULL) {
        res = TIDE_ERR_NO_MEMORY;
        goto out;
    }
    for (int it = 0; it < o->iters && res == TIDE_SUCCESS; ++it) {
        res = tide_mp_boot_barrier(boot, ++tag, timeout);
        const double t0 = bench_now_us();
        if (res == TIDE_SUCCESS) res = tide_mp_boot_barrier(boot, ++tag, timeout);
        bar[it] = bench_now_us() - t0;
    }
    if (res == TIDE_SUCCESS && rank == 0 && !o->quiet && !o->json)
        fprintf(stderr, "# one barrier of %d processes alone: %.1f us (median of %d), inside "
                        "every time of this table\n", N, bench_median(bar, o->iters), o->iters);
    free(bar);
    if (res != TIDE_SUCCESS) {
        fprintf(stderr, "tide-bench: rank %d: barrier: %s\n", rank, tide_get_last_error());
        goto out;
    }
    uint64_t w[2];
    STEP(bench_cuda_count_wrong(&rk, group, last_slot, &w[0], &w[1]));
    STEP(tide_mp_boot_allgather(boot, w, sizeof(w), -1, wrong, NULL, timeout));
    uint64_t wrong_ag = 0, wrong_rs = 0;
    for (int u = 0; u < N; ++u) wrong_ag += wrong[2 * u], wrong_rs += wrong[2 * u + 1];
    bench_cuda_rows(o, &rk, divisor, times, wrong_ag, wrong_rs, rows);
out:
    if (opened) {
        /* Importers close before the owners free. */
        for (int u = 0; u < N; ++u)
            if (u != rank) {
                if (shards[u] != NULL) cudaIpcCloseMemHandle(shards[u]);
                if (packs[u] != NULL) cudaIpcCloseMemHandle(packs[u]);
            }
        if (res == TIDE_SUCCESS) res = tide_mp_boot_barrier(boot, 0xc105e, timeout);
    }
    bench_cuda_rank_free(&rk);
    if (group != NULL) {
        tide_result_t r = tide_group_deregister(group);
        if (res == TIDE_SUCCESS) res = r;
    }
    if (plan != NULL) tide_plan_destroy(plan);
    for (int k = 0; k < 4; ++k) free(times[k]);
    free(shards), free(packs), free(blobs), free(wrong);
    return res;
}

/* The rank's communicator on the fabric of --fabric.  The NCCL unique id is made here, after
 * the fork, by rank 0 (ncclGetUniqueId starts a bootstrap thread that a fork would not carry
 * into the children) and reaches the others over the boot mesh with rank 0's verdict, so that
 * no rank enters NCCL's collective init when rank 0 has no id to give. */
static tide_result_t rank_comm_init(const bench_opts_t *o, tide_mp_boot_t *boot, int rank,
                                    const char *name, tide_comm_t *comm) {
    if (o->fabric != TIDE_FABRIC_NCCL)
        return tide_comm_init_rank(TIDE_FABRIC_CUDA, o->nodes, o->gpus_per_node, rank, name,
                                   comm);
    struct {
        int32_t result;
        uint8_t id[TIDE_NCCL_UNIQUE_ID_BYTES];
    } mine, *all = calloc((size_t)boot->ranks, sizeof(*all));
    if (all == NULL) return TIDE_ERR_NO_MEMORY;
    memset(&mine, 0, sizeof(mine));
    if (rank == 0) mine.result = (int32_t)tide_nccl_get_unique_id(mine.id);
    tide_result_t res = tide_mp_boot_allgather(boot, &mine, sizeof(mine), -1, all, NULL,
                                               tide_fabric_timeout_ms());
    if (res == TIDE_SUCCESS && all[0].result != TIDE_SUCCESS) {
        res = (tide_result_t)all[0].result;
        if (rank != 0) res = TIDE_ERR(res, "rank 0 could not create the NCCL unique id");
    }
    if (res == TIDE_SUCCESS)
        res = tide_comm_init_nccl(o->nodes, o->gpus_per_node, rank, all[0].id, comm);
    free(all);
    return res;
}

static int rank_main(const bench_opts_t *o, const tide_param_shape_t *shapes, int P, int rank,
                     const char *name, procs_report_t *rep) {
    int visible = 0;
    if (cudaGetDeviceCount(&visible) != cudaSuccess || visible < 1) {
        fprintf(stderr, "tide-bench: rank %d: no CUDA device is visible\n", rank);
        return 1;
    }
    const int N = o->nodes * o->gpus_per_node, dev = rank % visible;
    if (cudaSetDevice(dev) != cudaSuccess) return 1;
    /* The boot mesh first: the NCCL fabric's unique id travels on it. */
    char bname[80];
    snprintf(bname, sizeof(bname), "%sb", name);
    tide_mp_boot_t boot;
    tide_result_t res = tide_mp_boot_open(bname, rank, N, tide_fabric_timeout_ms(), &boot);
    if (res != TIDE_SUCCESS) {
        fprintf(stderr, "tide-bench: rank %d: %s\n", rank, tide_get_last_error());
        return 1;
    }
    tide_comm_t comm = NULL;
    res = rank_comm_init(o, &boot, rank, name, &comm);
    if (res != TIDE_SUCCESS) {
        fprintf(stderr, "tide-bench: rank %d: %s: %s\n", rank,
                o->fabric == TIDE_FABRIC_NCCL ? "tide_comm_init_nccl" : "tide_comm_init_rank",
                tide_get_last_error());
        tide_mp_boot_close(&boot);
        return 1;
    }
    tide_param_shape_t *scaled = calloc((size_t)P, sizeof(*scaled));
    int rows = 0;
    for (int d = 0; d < o->num_divisors && res == TIDE_SUCCESS && scaled != NULL; ++d) {
        for (int p = 0; p < P; ++p) {
            scaled[p] = shapes[p];
            scaled[p].dim0 = (shapes[p].dim0 + (uint64_t)o->divisors[d] - 1) / (uint64_t)o->divisors[d];
        }
        if (rank == 0 && !o->quiet && !o->json)
            fprintf(stderr, "# [%d/%d] dim0 / %d ...\n", d + 1, o->num_divisors, o->divisors[d]);
        bench_row_t two[2];
        res = run_size(o, comm, &boot, scaled, P, o->divisors[d], dev, two);
        if (res == TIDE_SUCCESS && rank == 0) {
            rep->rows[rows] = two[0];
            rep->rows[rows + 1] = two[1];
            rows += 2;
            rep->num_rows = rows;
        }
    }
    if (scaled == NULL) res = TIDE_ERR_NO_MEMORY;
    free(scaled);
    if (rank == 0) rep->result = (int)res;
    tide_comm_destroy(comm);
    tide_mp_boot_close(&boot);
    fflush(stdout);
    fflush(stderr);
    return res == TIDE_SUCCESS ? 0 : 1;
}

int bench_cuda_visible_devices(void) {
    fflush(stdout);
    fflush(stderr);
    /* A child asks: the parent must stay off CUDA until it has forked the ranks. */
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > 254 ? 254 : n);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

tide_result_t bench_run_cuda_procs(const bench_opts_t *o, const tide_param_shape_t *shapes,
                                   int num_shapes, bench_row_t *rows_out, int *num_rows_out) {
    const int N = o->procs;
    *num_rows_out = 0;
    if (2 * o->num_divisors > 32) return TIDE_ERR_INVALID_ARGUMENT;
    procs_report_t *rep = mmap(NULL, sizeof(*rep), PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rep == MAP_FAILED) return TIDE_ERR_NO_MEMORY;
    memset(rep, 0, sizeof(*rep));
    rep->result = (int)TIDE_ERR_INTERNAL;
    char name[48];
    snprintf(name, sizeof(name), "bench%ld", (long)getpid());
    pid_t *pids = calloc((size_t)N, sizeof(*pids));
    if (pids == NULL) return TIDE_ERR_NO_MEMORY;
    fflush(stdout);
    fflush(stderr);
    /* The parent never touches CUDA: a CUDA context does not survive fork. */
    for (int r = 0; r < N; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(o, shapes, num_shapes, r, name, rep));
        if (pids[r] < 0) {
            fprintf(stderr, "tide-bench: fork: rank %d\n", r);
            for (int k = 0; k < r; ++k) waitpid(pids[k], NULL, 0);
            free(pids);
            munmap(rep, sizeof(*rep));
            return TIDE_ERR_FABRIC;
        }
    }
    int failed = -1;
    for (int r = 0; r < N; ++r) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            if (failed < 0) failed = r;
            fprintf(stderr, "tide-bench: rank %d (pid %ld) ended with status %d\n", r,
                    (long)pids[r], st);
        }
    }
    tide_result_t res = (tide_result_t)rep->result;
    if (res == TIDE_SUCCESS && failed >= 0) res = TIDE_ERR_FABRIC;
    memcpy(rows_out, rep->rows, (size_t)rep->num_rows * sizeof(bench_row_t));
    *num_rows_out = rep->num_rows;
    free(pids);
    munmap(rep, sizeof(*rep));
    return res;
}
