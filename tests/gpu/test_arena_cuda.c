/*
 * test_arena_cuda.c - groups on one shared arena (docs/arena.md) on the single-process CUDA
 * fabric: each group runs on a view of the set's arena (fabric.h, arena_view_create), and
 * the cross-group fence runs as stream work.
 *
 *   test_arena_cuda          one process; M x L = 1 x 4 and 2 x 2 virtual ranks on the
 *                            visible GPU(s) (rank r on device r mod D), both RS modes
 *
 * A set of 3 groups of different sizes (ring slots 0, 1, 0: the third block takes over the
 * first block's slot) runs FSDP2's order for 3 steps (tide_ring_fsdp_calls: forward AGs with
 * reshard, backward AG + RS in reverse; Slot-Reuse stages the gradients in the vacated ring
 * slot).  All-gathers are enqueued on one stream per rank and reduce-scatters on another,
 * as FSDP2 does, so that the fence must order work across streams.  Every call is repeated
 * on the same group registered alone (its own arena) on a third stream, and the landings and
 * outputs are copied out on the call's stream right after the call -- before any later call
 * may overwrite them -- and must be equal bit for bit (wide-exponent bf16, so a changed
 * summation order would show); landings must also hold the shards at Landing(p, r).
 *
 * One thread enqueues every rank (rank 0 to N-1 per call), as the fabric allows.  The
 * one-process-per-rank fabric's shared arenas are tested by test_arena_cuda_mp.c.
 *
 * The set's groups, the step's data, the records and the call script are arena_check.c's.
 *
 * Prints PASS / FAIL lines that say what failed; the exit status is non-zero on any FAIL.
 */
#include "tide.h"

#include "api/comm.h"
#include "arena_check.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_N 4
#define G ARENA_G
#define MAX_P ARENA_MAX_P

static int failed;

/* The configuration (first: the arena_ops_t callbacks get &c->a) and every rank's part. */
typedef struct {
    arena_run_t a;
    int dev_count;
    tide_comm_t comms[MAX_N];
    tide_group_t set[MAX_N][G], alone[MAX_N][G];
    cudaStream_t ag[MAX_N], rs[MAX_N], lone[MAX_N];
    cudaEvent_t ag_done[MAX_N];
    uint16_t *h_grads[G][MAX_N];
    void *d_shards[G][MAX_N];
    void *d_grads[G][MAX_N];
    float *d_out_set[G][MAX_N], *d_out_alone[G][MAX_N];
} ctx_t;

#define TRY(call, what) ARENA_TRY(&c->a, call, what)
#define CU(call, what) ARENA_CU(&c->a, call, what)

static int dev_of(const ctx_t *c, int r) {
    return r % c->dev_count;
}

static int sync_all(arena_run_t *a) {
    ctx_t *c = (ctx_t *)a;
    for (int d = 0; d < c->dev_count; ++d) {
        CU(cudaSetDevice(d), "cudaSetDevice");
        CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    return 1;
}

static int new_step(arena_run_t *a, int step) {
    ctx_t *c = (ctx_t *)a;
    arena_host_step(a, step);
    for (int i = 0; i < G; ++i) {
        const uint64_t S = a->sum[i].shard_bytes;
        for (int r = 0; r < a->n; ++r) {
            arena_fill_grads(a, i, r, step, c->h_grads[i][r]);
            CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
            CU(cudaMemcpy(c->d_shards[i][r], a->h_shards[i] + r * S / 2, S, cudaMemcpyHostToDevice),
               "upload shard");
            CU(cudaMemcpy(c->d_grads[i][r], c->h_grads[i][r], arena_grad_elems(a, i) * 2,
                          cudaMemcpyHostToDevice),
               "upload grads");
        }
    }
    /* cudaMemcpy from pageable memory may return before its DMA landed, and the calls run
     * on non-blocking streams: every device finishes the uploads first. */
    for (int r = 0; r < a->n; ++r) {
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
        CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize(uploads)");
    }
    return 1;
}

static int gather(arena_run_t *a, int i) {
    ctx_t *c = (ctx_t *)a;
    char what[96];
    for (int r = 0; r < a->n; ++r) {
        TRY(tide_all_gather(c->set[r][i], c->d_shards[i][r], 0, c->ag[r]), "all_gather (set)");
    }
    for (int r = 0; r < a->n; ++r)
        TRY(tide_all_gather(c->alone[r][i], c->d_shards[i][r], 0, c->lone[r]),
            "all_gather (alone)");
    for (int r = 0; r < a->n; ++r) {
        void *pa = NULL, *pb = NULL;
        TRY(tide_group_landing(c->set[r][i], 0, &pa), "group_landing");
        TRY(tide_group_landing(c->alone[r][i], 0, &pb), "group_landing");
        snprintf(what, sizeof(what), "AG of group %d, rank %d's landing", i, r);
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice"); /* its streams' device */
        if (!arena_record(a, pa, c->ag[r], pb, c->lone[r], a->sum[i].group_bytes, a->h_landing[i],
                          what))
            return 0;
        /* After the copy out: the staging of a Slot-Reuse RS overwrites the landing. */
        CU(cudaEventRecord(c->ag_done[r], c->ag[r]), "cudaEventRecord");
    }
    return 1;
}

static int reshard(arena_run_t *a, int i) {
    ctx_t *c = (ctx_t *)a;
    for (int r = 0; r < a->n; ++r)
        TRY(tide_group_reshard(c->set[r][i]), "group_reshard");
    return 1;
}

static int reduce(arena_run_t *a, int i, int step) {
    ctx_t *c = (ctx_t *)a;
    char what[96];
    const float alpha = tide_alpha_avg(a->n);
    const int acc = step > 0;
    for (int r = 0; r < a->n; ++r) {
        const void *g_set[MAX_P];
        const uint8_t *staged = c->d_grads[i][r];
        /* FSDP2: the backward (here: the staging) follows the all-gather. */
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
        CU(cudaStreamWaitEvent(c->rs[r], c->ag_done[r], 0), "cudaStreamWaitEvent");
        if (a->mode == TIDE_RS_SLOT_REUSE) {
            void *slot = NULL;
            TRY(tide_group_landing(c->set[r][i], 0, &slot), "group_landing");
            CU(cudaMemcpyAsync(slot, c->d_grads[i][r], arena_grad_elems(a, i) * 2,
                               cudaMemcpyDeviceToDevice, c->rs[r]),
               "stage gradients");
            staged = slot; /* the vacated ring slot */
        }
        arena_grad_ptrs(a, i, staged, g_set);
        TRY(tide_reduce_scatter(c->set[r][i], g_set, c->d_out_set[i][r], alpha, acc, a->mode,
                                c->rs[r]),
            "reduce_scatter (set)");
    }
    for (int r = 0; r < a->n; ++r) {
        const void *g_alone[MAX_P];
        arena_grad_ptrs(a, i, c->d_grads[i][r], g_alone);
        TRY(tide_reduce_scatter(c->alone[r][i], g_alone, c->d_out_alone[i][r], alpha, acc, a->mode,
                                c->lone[r]),
            "reduce_scatter (alone)");
    }
    for (int r = 0; r < a->n; ++r) {
        snprintf(what, sizeof(what), "RS of group %d, rank %d's output", i, r);
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
        if (!arena_record(a, c->d_out_set[i][r], c->rs[r], c->d_out_alone[i][r], c->lone[r],
                          a->sum[i].fp32_shard_bytes, NULL, what))
            return 0;
    }
    return 1;
}

static const arena_ops_t ops = {
    .sync = sync_all,
    .new_step = new_step,
    .gather = gather,
    .reshard = reshard,
    .reduce = reduce,
};

static int setup(ctx_t *c) {
    arena_run_t *a = &c->a;
    TRY(tide_comm_init_all(TIDE_FABRIC_CUDA, a->m, a->l, c->comms), "comm_init_all");
    for (int r = 0; r < a->n; ++r)
        TRY(tide_groups_register(c->comms[r], G, a->entries, c->set[r]), "groups_register");
    for (int r = 0; r < a->n; ++r)
        for (int i = 0; i < G; ++i)
            TRY(tide_group_register(c->comms[r], &a->cfg, &a->desc[i], &c->alone[r][i]),
                "group_register (alone)");
    if (!arena_learn_plans(a, c->alone[0])) return 0;
    for (int i = 0; i < G; ++i) {
        for (int r = 0; r < a->n; ++r) {
            c->h_grads[i][r] = calloc(arena_grad_elems(a, i), 2);
            CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
            CU(cudaMalloc(&c->d_shards[i][r], a->sum[i].shard_bytes), "cudaMalloc");
            CU(cudaMalloc(&c->d_grads[i][r], arena_grad_elems(a, i) * 2), "cudaMalloc");
            CU(cudaMalloc((void **)&c->d_out_set[i][r], a->sum[i].fp32_shard_bytes), "cudaMalloc");
            CU(cudaMalloc((void **)&c->d_out_alone[i][r], a->sum[i].fp32_shard_bytes),
               "cudaMalloc");
        }
    }
    for (int r = 0; r < a->n; ++r) {
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
        CU(cudaStreamCreate(&c->ag[r]), "cudaStreamCreate");
        CU(cudaStreamCreate(&c->rs[r]), "cudaStreamCreate");
        CU(cudaStreamCreate(&c->lone[r]), "cudaStreamCreate");
        CU(cudaEventCreateWithFlags(&c->ag_done[r], cudaEventDisableTiming), "cudaEventCreate");
    }
    return 1;
}

/* Every rank's read-done events, waited on from that rank's device. */
static int read_done_events(ctx_t *c) {
    for (int r = 0; r < c->a.n; ++r) {
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
        if (!arena_check_read_done(&c->a, c->set[r], c->lone[r])) return 0;
    }
    return 1;
}

static void teardown(ctx_t *c) {
    arena_run_t *a = &c->a;
    sync_all(a);
    for (int r = 0; r < a->n; ++r) {
        for (int i = 0; i < G; ++i) {
            if (c->set[r][i] != NULL && tide_group_deregister(c->set[r][i]) != TIDE_SUCCESS)
                arena_fail(a, "deregister (set): %s", tide_get_last_error());
            if (c->alone[r][i] != NULL) tide_group_deregister(c->alone[r][i]);
        }
    }
    for (int r = 0; r < a->n; ++r) {
        cudaSetDevice(dev_of(c, r));
        if (c->ag[r] != NULL) cudaStreamDestroy(c->ag[r]);
        if (c->rs[r] != NULL) cudaStreamDestroy(c->rs[r]);
        if (c->lone[r] != NULL) cudaStreamDestroy(c->lone[r]);
        if (c->ag_done[r] != NULL) cudaEventDestroy(c->ag_done[r]);
        for (int i = 0; i < G; ++i) {
            cudaFree(c->d_shards[i][r]);
            cudaFree(c->d_grads[i][r]);
            cudaFree(c->d_out_set[i][r]);
            cudaFree(c->d_out_alone[i][r]);
            free(c->h_grads[i][r]);
        }
        if (c->comms[r] != NULL) tide_comm_destroy(c->comms[r]);
    }
    arena_run_free(a);
}

static void run(int m, int l, tide_rs_mode_t mode, int dev_count) {
    ctx_t *c = calloc(1, sizeof(*c));
    arena_run_init(&c->a, m, l, -1, mode);
    c->dev_count = dev_count < c->a.n ? dev_count : c->a.n;
    if (setup(c) && arena_script(&c->a, &ops) && read_done_events(c)) {
        /* Different groups took turns on shared regions: fences must have run. */
        uint64_t fences = 0;
        for (int r = 0; r < c->a.n; ++r)
            fences += arena_fences(c->set[r], G);
        if (fences == 0) arena_fail(&c->a, "%s", "no cross-group fence ran");
    }
    teardown(c);
    failed += c->a.bad;
    if (c->a.bad == 0)
        printf("PASS %dx%d %s: %d steps of FSDP order on a shared arena of %d groups\n", m, l,
               mode == TIDE_RS_IN_PLACE ? "in_place" : "slot_reuse", ARENA_STEPS, G);
    free(c);
}

int main(void) {
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count < 1) {
        printf("FAIL no CUDA device\n");
        return 1;
    }
    const int topo[2][2] = {{1, 4}, {2, 2}};
    for (int t = 0; t < 2; ++t)
        for (int mode = 0; mode < 2; ++mode)
            run(topo[t][0], topo[t][1], (tide_rs_mode_t)mode, dev_count);
    printf("test_arena_cuda: %d failure(s)\n", failed);
    return failed != 0;
}
