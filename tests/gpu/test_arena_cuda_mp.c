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
 * Every child has an alarm: nothing may hang (TIDE_TIMEOUT_MS is 5000 unless set).
 */
#include "tide.h"

#include "api/comm.h"
#include "fabric/cuda/mp.h"
#include "program/check_ring.h"

#include <cuda_runtime.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_N 4
#define G 3
#define STEPS 3
#define MAX_P 3

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

typedef struct {
    void *a, *b; /* pinned: the set's and the alone group's bytes */
    uint64_t bytes;
    const void *want; /* or NULL: the expected landing (host) */
    char what[96];
} record_t;

typedef struct {
    int m, l, n, me;
    tide_rs_mode_t mode;
    tide_comm_t comm;
    tide_config_t cfg;
    tide_param_shape_t shapes[G][MAX_P];
    tide_group_desc_t desc[G];
    tide_group_entry_t entries[G];
    char names[G][16];
    tide_group_t set[G], alone[G];
    tide_plan_summary_t sum[G];
    tide_param_geometry_t geo[G][MAX_P];
    cudaStream_t ag, rs, lone;
    cudaEvent_t ag_done;
    uint16_t *h_shards[G];  /* all N shards of the step */
    uint16_t *h_landing[G]; /* the expected landing */
    uint16_t *h_grads[G];   /* this rank's */
    void *d_shard[G], *d_grads[G];
    float *d_out_set[G], *d_out_alone[G];
    record_t *rec;
    int num_rec, cap_rec;
    int bad;
    int expect_fail; /* the --kill and --rails runs: a failure is the expected outcome */
} ctx_t;

static uint64_t grad_elems(const ctx_t *c, int i) {
    uint64_t e = 0;
    for (int p = 0; p < c->desc[i].num_params; ++p)
        e += c->shapes[i][p].dim0 * c->shapes[i][p].inner;
    return e;
}

__attribute__((format(printf, 2, 3))) static int fail_run(ctx_t *c, const char *fmt, ...) {
    printf("%s %dx%d %s rank %d: ", c->expect_fail ? "(expected failure)" : "FAIL", c->m, c->l,
           c->mode == TIDE_RS_IN_PLACE ? "in_place" : "slot_reuse", c->me);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    ++c->bad;
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

/* The library's calls first (watchdog: a missing peer is an error, not a hang), then the
 * device. */
static int sync_all(ctx_t *c) {
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
        memset(c->h_landing[i], 0, c->sum[i].group_bytes);
        for (int p = 0; p < c->desc[i].num_params; ++p)
            for (int r = 0; r < c->n; ++r)
                memcpy((uint8_t *)c->h_landing[i] + c->geo[i][p].shard_offset * c->n +
                           (uint64_t)r * c->geo[i][p].shard_bytes,
                       (uint8_t *)c->h_shards[i] + r * S + c->geo[i][p].shard_offset,
                       c->geo[i][p].shard_bytes);
        fill(c->h_grads[i], grad_elems(c, i), (uint64_t)(2 << 24 | i << 16 | c->me << 8 | step));
        CU(cudaMemcpy(c->d_shard[i], c->h_shards[i] + c->me * S / 2, S, cudaMemcpyHostToDevice),
           "upload shard");
        CU(cudaMemcpy(c->d_grads[i], c->h_grads[i], grad_elems(c, i) * 2, cudaMemcpyHostToDevice),
           "upload grads");
    }
    return 1;
}

static int gather(ctx_t *c, int i) {
    char what[96];
    TRY(tide_all_gather(c->set[i], c->d_shard[i], 0, c->ag), "all_gather (set)");
    TRY(tide_all_gather(c->alone[i], c->d_shard[i], 0, c->lone), "all_gather (alone)");
    void *a = NULL, *b = NULL;
    TRY(tide_group_landing(c->set[i], 0, &a), "group_landing");
    TRY(tide_group_landing(c->alone[i], 0, &b), "group_landing");
    snprintf(what, sizeof(what), "AG of group %d's landing", i);
    if (!record(c, a, c->ag, b, c->lone, c->sum[i].group_bytes, c->h_landing[i], what)) return 0;
    /* After the copy out: the staging of a Slot-Reuse RS overwrites the landing. */
    CU(cudaEventRecord(c->ag_done, c->ag), "cudaEventRecord");
    return 1;
}

static void grad_ptrs(const ctx_t *c, int i, const uint8_t *base, const void **out) {
    uint64_t off = 0;
    for (int p = 0; p < c->desc[i].num_params; ++p) {
        out[p] = base + off;
        off += c->shapes[i][p].dim0 * c->shapes[i][p].inner * 2;
    }
}

static int reduce(ctx_t *c, int i, int step) {
    char what[96];
    const float alpha = tide_alpha_avg(c->n);
    const int acc = step > 0;
    const void *g_set[MAX_P], *g_alone[MAX_P];
    /* FSDP2: the backward (here: the staging) follows the all-gather. */
    CU(cudaStreamWaitEvent(c->rs, c->ag_done, 0), "cudaStreamWaitEvent");
    const uint8_t *staged = c->d_grads[i];
    if (c->mode == TIDE_RS_SLOT_REUSE) {
        void *slot = NULL;
        TRY(tide_group_landing(c->set[i], 0, &slot), "group_landing");
        CU(cudaMemcpyAsync(slot, c->d_grads[i], grad_elems(c, i) * 2, cudaMemcpyDeviceToDevice,
                           c->rs),
           "stage gradients");
        staged = slot; /* the vacated ring slot */
    }
    grad_ptrs(c, i, staged, g_set);
    grad_ptrs(c, i, c->d_grads[i], g_alone);
    TRY(tide_reduce_scatter(c->set[i], g_set, c->d_out_set[i], alpha, acc, c->mode, c->rs),
        "reduce_scatter (set)");
    TRY(tide_reduce_scatter(c->alone[i], g_alone, c->d_out_alone[i], alpha, acc, c->mode, c->lone),
        "reduce_scatter (alone)");
    snprintf(what, sizeof(what), "RS of group %d's output", i);
    return record(c, c->d_out_set[i], c->rs, c->d_out_alone[i], c->lone, c->sum[i].fp32_shard_bytes,
                  NULL, what);
}

/* die: rank 1 dies in the middle of the second step (the --kill run). */
static int script(ctx_t *c, int die) {
    tide_ring_call_t *calls = NULL;
    int n = 0;
    TRY(tide_ring_fsdp_calls(G, 0, c->mode, STEPS, &calls, &n), "ring_fsdp_calls");
    const int per_step = n / STEPS;
    const int kill_at = die ? per_step + per_step / 2 : -1;
    int ok = 1;
    for (int k = 0; k < n && ok; ++k) {
        const int step = k / per_step, i = calls[k].group;
        if (k == kill_at && c->me == 1) {
            /* Dies with its enqueued work: the peers' device waits on its flags would hang
             * without the poison. */
            fflush(stdout);
            kill(getpid(), SIGKILL);
        }
        if (k % per_step == 0) ok = sync_all(c) && new_step(c, step);
        if (!ok) break;
        switch (calls[k].kind) {
        case TIDE_RING_CALL_AG:
            ok = gather(c, i);
            break;
        case TIDE_RING_CALL_RESHARD:
            TRY(tide_group_reshard(c->set[i]), "group_reshard");
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
    TRY(tide_groups_register(c->comm, G, c->entries, c->set), "groups_register");
    for (int i = 0; i < G; ++i)
        TRY(tide_group_register(c->comm, &c->cfg, &c->desc[i], &c->alone[i]),
            "group_register (alone)");
    for (int i = 0; i < G; ++i) {
        tide_plan_t plan;
        TRY(tide_group_plan(c->alone[i], &plan), "group_plan");
        TRY(tide_plan_get_summary(plan, &c->sum[i]), "plan_get_summary");
        for (int p = 0; p < c->desc[i].num_params; ++p)
            TRY(tide_plan_get_param(plan, p, &c->geo[i][p]), "plan_get_param");
        c->h_shards[i] = calloc((size_t)c->n, c->sum[i].shard_bytes);
        c->h_landing[i] = calloc(1, c->sum[i].group_bytes);
        c->h_grads[i] = calloc(grad_elems(c, i), 2);
        CU(cudaMalloc(&c->d_shard[i], c->sum[i].shard_bytes), "cudaMalloc");
        CU(cudaMalloc(&c->d_grads[i], grad_elems(c, i) * 2), "cudaMalloc");
        CU(cudaMalloc((void **)&c->d_out_set[i], c->sum[i].fp32_shard_bytes), "cudaMalloc");
        CU(cudaMalloc((void **)&c->d_out_alone[i], c->sum[i].fp32_shard_bytes), "cudaMalloc");
    }
    CU(cudaStreamCreateWithFlags(&c->ag, cudaStreamNonBlocking), "cudaStreamCreate");
    CU(cudaStreamCreateWithFlags(&c->rs, cudaStreamNonBlocking), "cudaStreamCreate");
    CU(cudaStreamCreateWithFlags(&c->lone, cudaStreamNonBlocking), "cudaStreamCreate");
    CU(cudaEventCreateWithFlags(&c->ag_done, cudaEventDisableTiming), "cudaEventCreate");
    return 1;
}

/* Read-done events are per group (per view): distinct, and a stream can wait on them. */
static int read_done_events(ctx_t *c) {
    void *ev[G] = {0};
    for (int i = 0; i < G; ++i)
        TRY(tide_group_read_done_event(c->set[i], &ev[i]), "group_read_done_event");
    for (int i = 0; i < G; ++i)
        for (int j = 0; j < i; ++j)
            if (ev[i] == NULL || ev[i] == ev[j])
                return fail_run(c, "%s", "read-done events of a set's groups are not distinct");
    for (int i = 0; i < G; ++i)
        CU(cudaStreamWaitEvent(c->lone, (cudaEvent_t)ev[i], 0), "wait on read-done");
    CU(cudaStreamSynchronize(c->lone), "cudaStreamSynchronize");
    return 1;
}

static void teardown(ctx_t *c, int expect_ok) {
    if (expect_ok) sync_all(c);
    for (int i = 0; i < G; ++i) {
        if (c->set[i] != NULL && tide_group_deregister(c->set[i]) != TIDE_SUCCESS && expect_ok)
            fail_run(c, "deregister (set): %s", tide_get_last_error());
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
        free(c->h_shards[i]);
        free(c->h_landing[i]);
        free(c->h_grads[i]);
    }
    for (int k = 0; k < c->num_rec; ++k) {
        cudaFreeHost(c->rec[k].a);
        cudaFreeHost(c->rec[k].b);
    }
    free(c->rec);
}

static ctx_t *ctx_new(tide_comm_t comm, int m, int l, int me, tide_rs_mode_t mode) {
    ctx_t *c = calloc(1, sizeof(*c));
    c->comm = comm;
    c->m = m;
    c->l = l;
    c->n = m * l;
    c->me = me;
    c->mode = mode;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    cfg.mode = mode;
    c->cfg = cfg;
    return c;
}

/* Both modes on one communicator: the number of FAIL lines. */
static int run_modes(tide_comm_t comm, int m, int l, int me) {
    int bad = 0;
    for (int mode = 0; mode < 2; ++mode) {
        ctx_t *c = ctx_new(comm, m, l, me, (tide_rs_mode_t)mode);
        if (setup(c) && script(c, 0) && read_done_events(c)) {
            uint64_t fences = 0;
            for (int i = 0; i < G; ++i)
                fences += c->set[i]->fences;
            if (fences == 0) fail_run(c, "%s", "no cross-group fence ran");
        }
        teardown(c, 1);
        bad += c->bad;
        free(c);
    }
    return bad;
}

/* One rank of the matrix. */
static int child_matrix(int m, int l, int me, const char *name) {
    tide_comm_t comm = NULL;
    if (cudaSetDevice(0) != cudaSuccess ||
        tide_comm_init_rank(TIDE_FABRIC_CUDA, m, l, me, name, &comm) != TIDE_SUCCESS) {
        printf("FAIL %dx%d rank %d: comm_init_rank: %s\n", m, l, me, tide_get_last_error());
        return 1;
    }
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
           bad ? "FAIL" : "PASS", STEPS, G);
    return bad != 0;
}

/* Rank 0 of the --kill run: rank 1 dies mid-step; rank 0 must fail stop (never hang), its
 * streams must drain, and every group of the set must fail afterwards. */
static int child_kill(int me, const char *name) {
    tide_comm_t comm = NULL;
    if (cudaSetDevice(0) != cudaSuccess ||
        tide_comm_init_rank(TIDE_FABRIC_CUDA, 1, 2, me, name, &comm) != TIDE_SUCCESS) {
        printf("FAIL kill rank %d: comm_init_rank: %s\n", me, tide_get_last_error());
        return 1;
    }
    ctx_t *c = ctx_new(comm, 1, 2, me, TIDE_RS_SLOT_REUSE);
    int ok = setup(c);
    c->expect_fail = 1;
    const int done = ok && script(c, 1);
    int bad = 0;
    if (!ok) {
        bad = 1; /* setup printed why */
    } else if (me == 0) {
        if (done) {
            c->expect_fail = 0;
            bad = fail_run(c, "%s", "the script completed although rank 1 died") == 0;
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
            c->expect_fail = 0;
            const cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess)
                bad |= fail_run(c, "streams after the fail-stop: %s", cudaGetErrorString(e)) == 0;
            /* No slot live (the ring rule would refuse first): the call reaches the set's
             * argument check, which must report the failed set. */
            for (int i = 0; i < G; ++i)
                (void)tide_group_reshard(c->set[i]);
            for (int i = 0; i < G; ++i) {
                const tide_result_t r = tide_all_gather(c->set[i], c->d_shard[i], 0, c->ag);
                if (r == TIDE_SUCCESS || strstr(tide_get_last_error(), "rank 1") == NULL)
                    bad |= fail_run(c,
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
    tide_comm_t comm = NULL;
    if (cudaSetDevice(0) != cudaSuccess ||
        tide_comm_init_rank(TIDE_FABRIC_CUDA, 2, 1, me, name, &comm) != TIDE_SUCCESS) {
        printf("FAIL rails rank %d: comm_init_rank: %s\n", me, tide_get_last_error());
        return 1;
    }
    ctx_t *c = ctx_new(comm, 2, 1, me, TIDE_RS_IN_PLACE);
    c->expect_fail = 1;
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
                     topo[t][0], topo[t][1], STEPS, G);
            failed += fork_ranks(RUN_MATRIX, topo[t][0], topo[t][1], what);
        }
    }
    printf("test_arena_cuda_mp: %d failure(s)\n", failed);
    return failed != 0;
}
