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
 * Prints PASS / FAIL lines that say what failed; the exit status is non-zero on any FAIL.
 */
#include "tide.h"

#include "api/comm.h"
#include "program/check_ring.h"

#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_N 4
#define G 3
#define STEPS 3
#define MAX_P 3

static int failed;

static void check(int ok, const char *what) {
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, ok ? "" : ": ",
           ok ? "" : tide_get_last_error());
    failed += !ok;
}

/* Wide-exponent bf16: exponents over 2^-40 .. 2^40, both signs (splitmix64 stream). */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill(uint16_t *buf, uint64_t elems, uint64_t seed) {
    uint64_t s = seed;
    for (uint64_t i = 0; i < elems; ++i) {
        const uint64_t x = rng_next(&s);
        const uint16_t exp = (uint16_t)(127 - 40 + (int)(x % 81));
        buf[i] = (uint16_t)(((x >> 20) & 1) << 15 | exp << 7 | ((x >> 32) & 0x7f));
    }
}

/* A pair of host copies made on the devices, compared after the step's sync. */
typedef struct {
    void *a, *b; /* pinned: the set's and the alone group's bytes */
    uint64_t bytes;
    const void *want; /* or NULL: the expected landing (host) */
    char what[96];
} record_t;

typedef struct {
    int m, l, n, dev_count;
    tide_rs_mode_t mode;
    tide_comm_t comms[MAX_N];
    tide_config_t cfg;
    tide_param_shape_t shapes[G][MAX_P];
    tide_group_desc_t desc[G];
    tide_group_entry_t entries[G];
    char names[G][16];
    tide_group_t set[MAX_N][G], alone[MAX_N][G];
    tide_plan_summary_t sum[G];
    tide_param_geometry_t geo[G][MAX_P];
    cudaStream_t ag[MAX_N], rs[MAX_N], lone[MAX_N];
    cudaEvent_t ag_done[MAX_N];
    uint16_t *h_shards[G];  /* N shards of the step */
    uint16_t *h_landing[G]; /* the expected landing */
    uint16_t *h_grads[G][MAX_N];
    void *d_shards[G][MAX_N];
    void *d_grads[G][MAX_N];
    float *d_out_set[G][MAX_N], *d_out_alone[G][MAX_N];
    record_t *rec;
    int num_rec, cap_rec;
    int bad; /* FAIL lines printed in this run */
} ctx_t;

static int dev_of(const ctx_t *c, int r) {
    return r % c->dev_count;
}

static uint64_t grad_elems(const ctx_t *c, int i) {
    uint64_t e = 0;
    for (int p = 0; p < c->desc[i].num_params; ++p)
        e += c->shapes[i][p].dim0 * c->shapes[i][p].inner;
    return e;
}

__attribute__((format(printf, 2, 3))) static int fail_run(ctx_t *c, const char *fmt, ...) {
    printf("FAIL %dx%d %s: ", c->m, c->l, c->mode == TIDE_RS_IN_PLACE ? "in_place" : "slot_reuse");
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    ++c->bad;
    ++failed;
    return 0;
}

#define TRY(call, what)                                                                            \
    do {                                                                                           \
        if ((call) != TIDE_SUCCESS) return fail_run(c, what ": %s", tide_get_last_error());        \
    } while (0)
#define CU(call, what)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) return fail_run(c, what ": %s", cudaGetErrorString(e_));            \
    } while (0)

/* Copy `bytes` of the set's `a_dev` (on stream sa) and the alone group's `b_dev` (on sb). */
static int record(ctx_t *c, const void *a_dev, cudaStream_t sa, const void *b_dev, cudaStream_t sb,
                  uint64_t bytes, const void *want, const char *what) {
    if (c->num_rec == c->cap_rec) {
        c->cap_rec = c->cap_rec ? 2 * c->cap_rec : 64;
        c->rec = realloc(c->rec, (size_t)c->cap_rec * sizeof(*c->rec));
    }
    record_t *rc = &c->rec[c->num_rec++];
    memset(rc, 0, sizeof(*rc));
    rc->bytes = bytes;
    rc->want = want;
    snprintf(rc->what, sizeof(rc->what), "%s", what);
    CU(cudaMallocHost(&rc->a, bytes), "cudaMallocHost");
    CU(cudaMallocHost(&rc->b, bytes), "cudaMallocHost");
    CU(cudaMemcpyAsync(rc->a, a_dev, bytes, cudaMemcpyDeviceToHost, sa), "copy out (set)");
    CU(cudaMemcpyAsync(rc->b, b_dev, bytes, cudaMemcpyDeviceToHost, sb), "copy out (alone)");
    return 1;
}

static int sync_all(ctx_t *c) {
    for (int d = 0; d < c->dev_count; ++d) {
        CU(cudaSetDevice(d), "cudaSetDevice");
        CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    return 1;
}

/* After the step's sync: every record equal; RS outputs not all zero. */
static int compare_records(ctx_t *c, int step) {
    int ok = 1;
    for (int k = 0; k < c->num_rec; ++k) {
        record_t *rc = &c->rec[k];
        if (memcmp(rc->a, rc->b, rc->bytes) != 0)
            ok = fail_run(c,
                          "step %d %s: the shared arena's bytes differ from the group "
                          "registered alone",
                          step, rc->what);
        if (rc->want != NULL && memcmp(rc->a, rc->want, rc->bytes) != 0)
            ok = fail_run(c, "step %d %s: the landing does not hold the shards", step, rc->what);
        if (rc->want == NULL) {
            int nonzero = 0;
            for (uint64_t e = 0; e < rc->bytes / 4; ++e)
                nonzero |= ((const float *)rc->a)[e] != 0.0f;
            if (!nonzero) ok = fail_run(c, "step %d %s: the output is all zero", step, rc->what);
        }
        cudaFreeHost(rc->a);
        cudaFreeHost(rc->b);
    }
    c->num_rec = 0;
    return ok;
}

static int new_step(ctx_t *c, int step) {
    for (int i = 0; i < G; ++i) {
        const uint64_t S = c->sum[i].shard_bytes;
        for (int r = 0; r < c->n; ++r)
            fill(c->h_shards[i] + r * S / 2, S / 2, (uint64_t)(1 << 24 | i << 16 | r << 8 | step));
        /* The expected landing: Landing(p, r) = o_p N + r s_p holds rank r's shard of p. */
        memset(c->h_landing[i], 0, c->sum[i].group_bytes);
        for (int p = 0; p < c->desc[i].num_params; ++p)
            for (int r = 0; r < c->n; ++r)
                memcpy((uint8_t *)c->h_landing[i] + c->geo[i][p].shard_offset * c->n +
                           (uint64_t)r * c->geo[i][p].shard_bytes,
                       (uint8_t *)c->h_shards[i] + r * S + c->geo[i][p].shard_offset,
                       c->geo[i][p].shard_bytes);
        for (int r = 0; r < c->n; ++r) {
            fill(c->h_grads[i][r], grad_elems(c, i), (uint64_t)(2 << 24 | i << 16 | r << 8 | step));
            CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
            CU(cudaMemcpy(c->d_shards[i][r], c->h_shards[i] + r * S / 2, S, cudaMemcpyHostToDevice),
               "upload shard");
            CU(cudaMemcpy(c->d_grads[i][r], c->h_grads[i][r], grad_elems(c, i) * 2,
                          cudaMemcpyHostToDevice),
               "upload grads");
        }
    }
    return 1;
}

static int gather(ctx_t *c, int i, int step) {
    char what[96];
    for (int r = 0; r < c->n; ++r) {
        TRY(tide_all_gather(c->set[r][i], c->d_shards[i][r], 0, c->ag[r]), "all_gather (set)");
    }
    for (int r = 0; r < c->n; ++r)
        TRY(tide_all_gather(c->alone[r][i], c->d_shards[i][r], 0, c->lone[r]),
            "all_gather (alone)");
    for (int r = 0; r < c->n; ++r) {
        void *a = NULL, *b = NULL;
        TRY(tide_group_landing(c->set[r][i], 0, &a), "group_landing");
        TRY(tide_group_landing(c->alone[r][i], 0, &b), "group_landing");
        snprintf(what, sizeof(what), "AG of group %d, rank %d's landing", i, r);
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice"); /* its streams' device */
        if (!record(c, a, c->ag[r], b, c->lone[r], c->sum[i].group_bytes, c->h_landing[i], what))
            return 0;
        /* After the copy out: the staging of a Slot-Reuse RS overwrites the landing. */
        CU(cudaEventRecord(c->ag_done[r], c->ag[r]), "cudaEventRecord");
    }
    (void)step;
    return 1;
}

static int reduce(ctx_t *c, int i, int step) {
    char what[96];
    const float alpha = tide_alpha_avg(c->n);
    const int acc = step > 0;
    for (int r = 0; r < c->n; ++r) {
        const void *g_set[MAX_P], *g_alone[MAX_P];
        uint8_t *staged = NULL;
        /* FSDP2: the backward (here: the staging) follows the all-gather. */
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
        CU(cudaStreamWaitEvent(c->rs[r], c->ag_done[r], 0), "cudaStreamWaitEvent");
        if (c->mode == TIDE_RS_SLOT_REUSE) {
            void *slot = NULL;
            TRY(tide_group_landing(c->set[r][i], 0, &slot), "group_landing");
            staged = slot; /* the vacated ring slot */
            CU(cudaMemcpyAsync(staged, c->d_grads[i][r], grad_elems(c, i) * 2,
                               cudaMemcpyDeviceToDevice, c->rs[r]),
               "stage gradients");
        }
        uint64_t off = 0;
        for (int p = 0; p < c->desc[i].num_params; ++p) {
            g_alone[p] = (const uint8_t *)c->d_grads[i][r] + off;
            g_set[p] = staged != NULL ? staged + off : g_alone[p];
            off += c->shapes[i][p].dim0 * c->shapes[i][p].inner * 2;
        }
        TRY(tide_reduce_scatter(c->set[r][i], g_set, c->d_out_set[i][r], alpha, acc, c->mode,
                                c->rs[r]),
            "reduce_scatter (set)");
        (void)g_alone;
    }
    for (int r = 0; r < c->n; ++r) {
        const void *g_alone[MAX_P];
        uint64_t off = 0;
        for (int p = 0; p < c->desc[i].num_params; ++p) {
            g_alone[p] = (const uint8_t *)c->d_grads[i][r] + off;
            off += c->shapes[i][p].dim0 * c->shapes[i][p].inner * 2;
        }
        TRY(tide_reduce_scatter(c->alone[r][i], g_alone, c->d_out_alone[i][r], alpha, acc, c->mode,
                                c->lone[r]),
            "reduce_scatter (alone)");
    }
    for (int r = 0; r < c->n; ++r) {
        snprintf(what, sizeof(what), "RS of group %d, rank %d's output", i, r);
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
        if (!record(c, c->d_out_set[i][r], c->rs[r], c->d_out_alone[i][r], c->lone[r],
                    c->sum[i].fp32_shard_bytes, NULL, what))
            return 0;
    }
    return 1;
}

static int script(ctx_t *c) {
    tide_ring_call_t *calls = NULL;
    int n = 0;
    TRY(tide_ring_fsdp_calls(G, 0, c->mode, STEPS, &calls, &n), "ring_fsdp_calls");
    const int per_step = n / STEPS;
    int ok = 1;
    for (int k = 0; k < n && ok; ++k) {
        const int step = k / per_step, i = calls[k].group;
        if (k % per_step == 0) ok = sync_all(c) && new_step(c, step);
        if (!ok) break;
        switch (calls[k].kind) {
        case TIDE_RING_CALL_AG:
            ok = gather(c, i, step);
            break;
        case TIDE_RING_CALL_RESHARD:
            for (int r = 0; r < c->n && ok; ++r)
                if (tide_group_reshard(c->set[r][i]) != TIDE_SUCCESS)
                    ok = fail_run(c, "group_reshard: %s", tide_get_last_error());
            break;
        default:
            ok = reduce(c, i, step);
            break;
        }
        if (ok && (k + 1) % per_step == 0) ok = sync_all(c) && compare_records(c, step);
    }
    free(calls);
    return ok;
}

static int setup(ctx_t *c) {
    TRY(tide_comm_init_all(TIDE_FABRIC_CUDA, c->m, c->l, c->comms), "comm_init_all");
    for (int i = 0; i < G; ++i) {
        const int np = 2 + i % 2;
        for (int p = 0; p < np; ++p) {
            /* Different sizes per group, rows not divisible by N (padding). */
            c->shapes[i][p].dim0 = (uint64_t)(5 + 7 * i + 3 * p);
            c->shapes[i][p].inner = (uint64_t)(9 + 4 * i + 2 * p);
        }
        c->desc[i] = (tide_group_desc_t){np, c->shapes[i], TIDE_DTYPE_BF16, TIDE_DTYPE_BF16,
                                         TIDE_DTYPE_BF16};
        snprintf(c->names[i], sizeof(c->names[i]), "layers.%d", i);
        c->entries[i] = (tide_group_entry_t){&c->cfg, &c->desc[i], i % 2, c->names[i]};
    }
    for (int r = 0; r < c->n; ++r)
        TRY(tide_groups_register(c->comms[r], G, c->entries, c->set[r]), "groups_register");
    for (int r = 0; r < c->n; ++r)
        for (int i = 0; i < G; ++i)
            TRY(tide_group_register(c->comms[r], &c->cfg, &c->desc[i], &c->alone[r][i]),
                "group_register (alone)");
    for (int i = 0; i < G; ++i) {
        tide_plan_t plan;
        TRY(tide_group_plan(c->alone[0][i], &plan), "group_plan");
        TRY(tide_plan_get_summary(plan, &c->sum[i]), "plan_get_summary");
        for (int p = 0; p < c->desc[i].num_params; ++p)
            TRY(tide_plan_get_param(plan, p, &c->geo[i][p]), "plan_get_param");
        c->h_shards[i] = calloc((size_t)c->n, c->sum[i].shard_bytes);
        c->h_landing[i] = calloc(1, c->sum[i].group_bytes);
        for (int r = 0; r < c->n; ++r) {
            c->h_grads[i][r] = calloc(grad_elems(c, i), 2);
            CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
            CU(cudaMalloc(&c->d_shards[i][r], c->sum[i].shard_bytes), "cudaMalloc");
            CU(cudaMalloc(&c->d_grads[i][r], grad_elems(c, i) * 2), "cudaMalloc");
            CU(cudaMalloc((void **)&c->d_out_set[i][r], c->sum[i].fp32_shard_bytes), "cudaMalloc");
            CU(cudaMalloc((void **)&c->d_out_alone[i][r], c->sum[i].fp32_shard_bytes),
               "cudaMalloc");
        }
    }
    for (int r = 0; r < c->n; ++r) {
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
        CU(cudaStreamCreate(&c->ag[r]), "cudaStreamCreate");
        CU(cudaStreamCreate(&c->rs[r]), "cudaStreamCreate");
        CU(cudaStreamCreate(&c->lone[r]), "cudaStreamCreate");
        CU(cudaEventCreateWithFlags(&c->ag_done[r], cudaEventDisableTiming), "cudaEventCreate");
    }
    return 1;
}

/* Read-done events are per group (per view): distinct, and a stream can wait on them. */
static int read_done_events(ctx_t *c) {
    for (int r = 0; r < c->n; ++r) {
        void *ev[G] = {0};
        for (int i = 0; i < G; ++i)
            TRY(tide_group_read_done_event(c->set[r][i], &ev[i]), "group_read_done_event");
        for (int i = 0; i < G; ++i)
            for (int j = 0; j < i; ++j)
                if (ev[i] == NULL || ev[i] == ev[j])
                    return fail_run(c, "%s", "read-done events of a set's groups are not distinct");
        CU(cudaSetDevice(dev_of(c, r)), "cudaSetDevice");
        for (int i = 0; i < G; ++i)
            CU(cudaStreamWaitEvent(c->lone[r], (cudaEvent_t)ev[i], 0), "wait on read-done");
        CU(cudaStreamSynchronize(c->lone[r]), "cudaStreamSynchronize");
    }
    return 1;
}

static void teardown(ctx_t *c) {
    sync_all(c);
    for (int r = 0; r < c->n; ++r) {
        for (int i = 0; i < G; ++i) {
            if (c->set[r][i] != NULL && tide_group_deregister(c->set[r][i]) != TIDE_SUCCESS)
                fail_run(c, "deregister (set): %s", tide_get_last_error());
            if (c->alone[r][i] != NULL) tide_group_deregister(c->alone[r][i]);
        }
    }
    for (int r = 0; r < c->n; ++r) {
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
    for (int i = 0; i < G; ++i) {
        free(c->h_shards[i]);
        free(c->h_landing[i]);
    }
    for (int k = 0; k < c->num_rec; ++k) {
        cudaFreeHost(c->rec[k].a);
        cudaFreeHost(c->rec[k].b);
    }
    free(c->rec);
}

static void run(int m, int l, tide_rs_mode_t mode, int dev_count) {
    ctx_t *c = calloc(1, sizeof(*c));
    c->m = m;
    c->l = l;
    c->n = m * l;
    c->mode = mode;
    c->dev_count = dev_count < c->n ? dev_count : c->n;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    cfg.mode = mode;
    c->cfg = cfg;
    if (setup(c) && script(c) && read_done_events(c)) {
        /* Different groups took turns on shared regions: fences must have run. */
        uint64_t fences = 0;
        for (int r = 0; r < c->n; ++r)
            for (int i = 0; i < G; ++i)
                fences += c->set[r][i]->fences;
        if (fences == 0) fail_run(c, "%s", "no cross-group fence ran");
    }
    teardown(c);
    char what[96];
    snprintf(what, sizeof(what), "%dx%d %s: %d steps of FSDP order on a shared arena of %d groups",
             m, l, mode == TIDE_RS_IN_PLACE ? "in_place" : "slot_reuse", STEPS, G);
    if (c->bad == 0) check(1, what);
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
