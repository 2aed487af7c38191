/*
 * test_fabric_cuda_mp.c - the CUDA fabric with one process per rank (src/fabric/cuda/mp.h)
 * against the CPU fabric, bit for bit, with 1..8 processes on one GPU.
 *
 *   test_fabric_cuda_mp [--seconds S] [--topology M L]
 *                                       configuration matrix (default budget 60 s), or the
 *                                       configurations of one topology
 *   test_fabric_cuda_mp --kill          a rank killed mid-run: the others fail stop at once
 *   test_fabric_cuda_mp --stop          a rank hung mid-run: the others fail stop at the
 *                                       deadline, naming it; resumed, it fails too
 *   test_fabric_cuda_mp --enqueue       host enqueue time per rank per call, P = 30, M = 8
 *   test_fabric_cuda_mp --repeat N C    N processes (M = 1, L = N) make C AG + RS calls each:
 *                                       none may hang (run under MPS too), the last RS checked
 *   test_fabric_cuda_mp --lane [--seconds S]
 *                                       the rail lane at 2 x 1, 3 x 1 and 4 x 1 (every group
 *                                       must register the lane; every other configuration has
 *                                       a parameter of one row, so the RS has blocks of only
 *                                       padding: empty puts); with TIDE_CUDA_MP_RAILS=1 its
 *                                       cross-node puts are rail steps (program/rails.h)
 *
 * Direct mode at M = 1 (mp_direct.c): with TIDE_CUDA_MP_DIRECT unset or 1, every rank's last
 * reduce-scatter of an M = 1, L > 1 configuration must have taken it (stats.direct >= 1, the
 * same on every rank) and some configuration must have fused its outputs (2); with 0, none.
 * TIDE_TEST_MP_MANAGED=grads0 / out0 puts rank 0's gradients / output in memory that cannot
 * be exported (a stream-ordered pool allocation): then every rank must take the pushed path /
 * direct sums without fused outputs (1), never a mix.
 *
 * The parent never touches CUDA: it draws every configuration's inputs, runs the CPU fabric
 * (a thread per rank) as the oracle, then forks the N ranks of a topology once; every child
 * runs all of the topology's configurations in turn (register, CALLS all-gathers and
 * reduce-scatters on its own stream, deregister) and writes its outputs to memory shared
 * with the parent, which compares.  Inputs use wide exponents (sums round).
 *
 * Exit status: 0 all passed, 1 a mismatch or a failed check, 2 a setup failure.
 */
#include "api/comm.h"
#include "fabric/cuda/mp.h"
#include "kernels/kernels.h"
#include "plan/plan.h"
#include "tide.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CALLS 4
#define MAX_RANKS 8
#define MAX_PARAMS 30
#define MAX_CONFIGS 12

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define HOST_RAND_SEED 0x2545f4914f6cdd1dull
#define HOST_RAND_WIDE_EXP 12
#include "host_rand.h"
#include "cpu_oracle.h"

typedef struct {
    int m, l, n;
    char what[160];
    tide_config_t cfg;
    tide_param_shape_t shapes[MAX_PARAMS];
    tide_group_desc_t desc;
    tide_plan_t plan;
    float alpha;
    int accumulate[CALLS];
    tide_rs_mode_t modes[CALLS];
    size_t shard_operand, land_bytes, out_bytes;
    uint8_t *shards[CALLS][MAX_RANKS];
    void *grads[CALLS][MAX_RANKS][MAX_PARAMS];
    float *out0[MAX_RANKS];
    uint8_t *land[2][CALLS][MAX_RANKS]; /* [0]: CPU (heap), [1]: CUDA mp (shared) */
    float *out[2][CALLS][MAX_RANKS];
    char *child_error;    /* shared, [MAX_RANKS][256] */
    uint64_t *batched;    /* shared, [MAX_RANKS]: copies the last AG and RS call ran in batches */
    uint64_t *rail_steps; /* shared, [MAX_RANKS]: rail steps of the last AG and RS call */
    uint64_t *ce_batched; /* shared, [MAX_RANKS]: batched copies cudaMemcpyBatchAsync ran */
    uint64_t *sliced;     /* shared, [MAX_RANKS]: sum / landing launches past one per op */
    uint64_t *direct;     /* shared, [MAX_RANKS]: the last RS call's stats.direct */
    uint64_t *elided;     /* shared, [MAX_RANKS]: last AG and RS calls that ran the elision */
} case_t;

static bool lane_only; /* --lane */

static bool case_init(case_t *c, int m, int l, int v) {
    memset(c, 0, sizeof(*c));
    c->m = m;
    c->l = l;
    c->n = m * l;
    const int p = 1 + v % 4;
    for (int i = 0; i < p; ++i)
        c->shapes[i] = (tide_param_shape_t){(uint64_t)rnd_int(1, 40), (uint64_t)rnd_int(1, 24)};
    /* The lane's empty puts: every rank but 0 has only padding rows of a one-row parameter. */
    if (lane_only && v % 2 == 0) c->shapes[p - 1].dim0 = 1;
    const bool fp32_grads = v % 3 == 1, cast = v % 4 == 2;
    c->desc = (tide_group_desc_t){p, c->shapes, TIDE_DTYPE_BF16,
                                  fp32_grads ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16,
                                  cast ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16};
    c->cfg = (tide_config_t)TIDE_CONFIG_INIT;
    c->cfg.nodes = m;
    c->cfg.gpus_per_node = l;
    c->cfg.passes = 1 + v % 2;
    c->cfg.staging_slots = v % 5 == 3 ? 1 : 0;
    if (tide_plan_create(&c->cfg, &c->desc, &c->plan) != TIDE_SUCCESS) {
        c->cfg.passes = 0;
        c->cfg.staging_slots = 0;
        if (tide_plan_create(&c->cfg, &c->desc, &c->plan) != TIDE_SUCCESS) return false;
    }
    const tide_geom_t *g = &c->plan->geom;
    c->alpha = v % 3 == 0 ? tide_alpha_avg(c->n) : v % 3 == 1 ? 1.3f : 0.3f;
    for (int e = 0; e < CALLS; ++e) {
        c->accumulate[e] = e > 0 && (v + e) % 2 == 0;
        /* Mode switches between calls share the RS counters (FRESH forms). */
        c->modes[e] = (v % 2 == 0 || e % 3 != 2) ? TIDE_RS_IN_PLACE : TIDE_RS_SLOT_REUSE;
    }
    c->shard_operand = g->cast ? g->fp32_shard_bytes : g->shard_bytes;
    c->land_bytes = g->group_bytes;
    c->out_bytes = g->fp32_shard_bytes;
    for (int e = 0; e < CALLS; ++e)
        for (int r = 0; r < c->n; ++r) {
            c->shards[e][r] = xmalloc(c->shard_operand);
            if (g->cast)
                for (size_t i = 0; i < c->shard_operand / 4; ++i)
                    ((float *)c->shards[e][r])[i] = rnd_wide();
            else
                for (size_t i = 0; i < c->shard_operand; ++i)
                    c->shards[e][r][i] = (uint8_t)rnd();
            for (int q = 0; q < g->num_params; ++q) {
                const uint64_t elems = g->params[q].dim0 * g->params[q].inner;
                c->grads[e][r][q] = xmalloc(elems * g->grad_item);
                for (uint64_t i = 0; i < elems; ++i) {
                    const float x = rnd_wide();
                    if (g->grad_item == 2)
                        ((uint16_t *)c->grads[e][r][q])[i] = tide_float_to_bf16(x);
                    else
                        ((float *)c->grads[e][r][q])[i] = x;
                }
            }
        }
    for (int r = 0; r < c->n; ++r) {
        c->out0[r] = xmalloc(c->out_bytes);
        for (size_t i = 0; i < c->out_bytes / 4; ++i)
            c->out0[r][i] = rnd_wide();
    }
    for (int e = 0; e < CALLS; ++e)
        for (int r = 0; r < c->n; ++r) {
            c->land[0][e][r] = xmalloc(c->land_bytes);
            c->out[0][e][r] = xmalloc(c->out_bytes);
            c->land[1][e][r] = shared_alloc(c->land_bytes);
            c->out[1][e][r] = shared_alloc(c->out_bytes);
        }
    c->child_error = shared_alloc(MAX_RANKS * 256);
    c->batched = shared_alloc(MAX_RANKS * sizeof(uint64_t));
    c->rail_steps = shared_alloc(MAX_RANKS * sizeof(uint64_t));
    c->ce_batched = shared_alloc(MAX_RANKS * sizeof(uint64_t));
    c->sliced = shared_alloc(MAX_RANKS * sizeof(uint64_t));
    c->direct = shared_alloc(MAX_RANKS * sizeof(uint64_t));
    c->elided = shared_alloc(MAX_RANKS * sizeof(uint64_t));
    snprintf(c->what, sizeof(c->what),
             "M=%d L=%d P=%d grads=%s cast=%d passes=%d stg=%d alpha=%g modes=%d%d%d%d", m, l, p,
             fp32_grads ? "fp32" : "bf16", cast, c->cfg.passes, c->cfg.staging_slots,
             (double)c->alpha, c->modes[0], c->modes[1], c->modes[2], c->modes[3]);
    return true;
}

/* ------------------------------------------------------------------ the CPU fabric (oracle) */

static bool cpu_rank(void *ctx, tide_comm_t comm, int r, char *err, size_t len) {
    case_t *c = ctx;
    tide_group_t grp;
    if (tide_group_register(comm, &c->cfg, &c->desc, &grp) != TIDE_SUCCESS) {
        snprintf(err, len, "register: %s", tide_get_last_error());
        return false;
    }
    for (int e = 0; e < CALLS && !err[0]; ++e) {
        void *land = NULL;
        if (tide_all_gather(grp, c->shards[e][r], e % 2, NULL) != TIDE_SUCCESS ||
            tide_group_landing(grp, e % 2, &land) != TIDE_SUCCESS)
            snprintf(err, len, "all_gather %d: %s", e, tide_get_last_error());
        else
            memcpy(c->land[0][e][r], land, c->land_bytes);
    }
    float *out = xmalloc(c->out_bytes);
    memcpy(out, c->out0[r], c->out_bytes);
    for (int e = 0; e < CALLS && !err[0]; ++e) {
        if (tide_reduce_scatter(grp, (const void *const *)c->grads[e][r], out, c->alpha,
                                c->accumulate[e], c->modes[e], NULL) != TIDE_SUCCESS)
            snprintf(err, len, "reduce_scatter %d: %s", e, tide_get_last_error());
        else
            memcpy(c->out[0][e][r], out, c->out_bytes);
    }
    free(out);
    tide_group_deregister(grp);
    return err[0] == 0;
}

/* ------------------------------------------------------------------ one rank process */

#define CHILD_CK(call, what)                                                                       \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            snprintf(err, 256, "%s: %s", what, tide_get_last_error());                             \
            return false;                                                                          \
        }                                                                                          \
    } while (0)
#define CHILD_CU(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            snprintf(err, 256, "%s: %s", what, cudaGetErrorString(e_));                            \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

/* TIDE_TEST_MP_MANAGED: "grads0" / "out0" (see the top), else "". */
static const char *managed_env(void) {
    const char *e = getenv("TIDE_TEST_MP_MANAGED");
    return e != NULL ? e : "";
}

/* Rank r's operand: where TIDE_TEST_MP_MANAGED asks for it, memory of the device's default
 * stream-ordered pool, which cudaIpcGetMemHandle cannot export (as managed memory could not,
 * without allocating managed memory); cudaFree releases it like the others. */
static cudaError_t operand_alloc(void **p, size_t bytes, int r, const char *which) {
    if (r == 0 && strcmp(managed_env(), which) == 0) {
        const cudaError_t e = cudaMallocAsync(p, bytes, 0);
        return e != cudaSuccess ? e : cudaStreamSynchronize(0);
    }
    return cudaMalloc(p, bytes);
}

static bool rails_on(void);

/* TIDE_CUDA_MP_FLAGS took effect (src/fabric/cuda/mp_flags.c): host flags live in the control
 * block, device flags and kernel waits in the segments, and only kernel waits have the abort
 * word's device address (else a run "with kernel waits" could test the default).  Unset:
 * kernel waits; "auto", where every rank here is on device 0: host flags where two or more
 * ranks time-slice it, kernel waits under MPS and in a world of one rank. */
static bool flags_placement(const struct tide_fabric_arena *arena, char *err) {
    const tide_mp_arena_t *a = (const tide_mp_arena_t *)arena;
    const char *e = getenv("TIDE_CUDA_MP_FLAGS");
    const bool timeshared = a->w->base.ranks >= 2 && !tide_cuda_mp_device_mps(0);
    const char *want = e == NULL || e[0] == '\0'   ? "kernel"
                       : strcmp(e, "auto") == 0 ? (timeshared ? "host" : "kernel")
                                                : e;
    const char *got = a->host_flags ? "host" : a->abort_dev != NULL ? "kernel" : "device";
    const bool ok = strcmp(want, got) == 0 && (a->abort_dev == NULL || !a->host_flags);
    if (!ok)
        snprintf(err, 256, "register: TIDE_CUDA_MP_FLAGS=%s, the arena has %s flags", want, got);
    return ok;
}

static bool child_case(tide_comm_t comm, case_t *c, int r, cudaStream_t s, char *err) {
    const tide_geom_t *g = &c->plan->geom;
    tide_group_t grp;
    CHILD_CK(tide_group_register(comm, &c->cfg, &c->desc, &grp), "register");
    /* At L = 1 the group runs the rail lane, as the cpu oracle does (docs/protocol.md), with or
     * without a rail transport for the cross-node puts (program/rails.h). */
    const bool want_lane = c->plan->rs.rail_lane;
    if (lane_only && !want_lane) {
        snprintf(err, 256, "--lane: the plan of %s is not the rail lane", c->what);
        tide_group_deregister(grp);
        return false;
    }
    if (((struct tide_group *)grp)->plan->rs.rail_lane != want_lane) {
        snprintf(err, 256, "register: the group's plan is %sthe rail lane, %s expected",
                 want_lane ? "not " : "", want_lane ? "the lane" : "the generic programs");
        tide_group_deregister(grp);
        return false;
    }
    if (!flags_placement(grp->arena, err)) {
        tide_group_deregister(grp);
        return false;
    }
    void *dshard[CALLS], *dgrad[CALLS][MAX_PARAMS], *dout;
    uint8_t *hland, *hout;
    CHILD_CU(cudaMallocHost((void **)&hland, CALLS * (c->land_bytes + 256)), "cudaMallocHost");
    CHILD_CU(cudaMallocHost((void **)&hout, CALLS * (c->out_bytes + 256)), "cudaMallocHost");
    for (int e = 0; e < CALLS; ++e) {
        CHILD_CU(cudaMalloc(&dshard[e], c->shard_operand), "cudaMalloc(shard)");
        CHILD_CU(cudaMemcpy(dshard[e], c->shards[e][r], c->shard_operand, cudaMemcpyHostToDevice),
                 "upload shard");
        for (int q = 0; q < g->num_params; ++q) {
            const size_t b = g->params[q].dim0 * g->params[q].inner * g->grad_item;
            CHILD_CU(operand_alloc(&dgrad[e][q], b, r, "grads0"), "cudaMalloc(grad)");
            CHILD_CU(cudaMemcpy(dgrad[e][q], c->grads[e][r][q], b, cudaMemcpyHostToDevice),
                     "upload grad");
        }
    }
    CHILD_CU(operand_alloc(&dout, c->out_bytes, r, "out0"), "cudaMalloc(out)");
    CHILD_CU(cudaMemcpy(dout, c->out0[r], c->out_bytes, cudaMemcpyHostToDevice), "upload out");
    /* cudaMemcpy from pageable memory may return before its DMA landed, and the calls run
     * on a non-blocking stream: finish the uploads first. */
    CHILD_CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize(uploads)");
    /* Calls back to back on the rank's stream; outputs copied out on it after each call.
     * Call 2 of each collective runs on a second stream, ordered with the first by events as
     * a caller must: the call after one on another stream keeps its start fence unless the
     * other stream's end fence completed (mp_execute.c, fence_implied), and call 3 comes
     * back. */
    cudaStream_t s2 = NULL;
    cudaEvent_t hop[2] = {NULL, NULL};
    CHILD_CU(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "cudaStreamCreate(second)");
    for (int k = 0; k < 2; ++k)
        CHILD_CU(cudaEventCreateWithFlags(&hop[k], cudaEventDisableTiming), "cudaEventCreate");
    for (int e = 0; e < CALLS; ++e) {
        void *land = NULL;
        const cudaStream_t on = e == 2 ? s2 : s;
        if (on != s) {
            CHILD_CU(cudaEventRecord(hop[0], s), "cudaEventRecord(hop)");
            CHILD_CU(cudaStreamWaitEvent(on, hop[0], 0), "cudaStreamWaitEvent(hop)");
        }
        CHILD_CK(tide_all_gather(grp, dshard[e], e % 2, on), "all_gather");
        CHILD_CK(tide_group_landing(grp, e % 2, &land), "landing");
        CHILD_CU(cudaMemcpyAsync(hland + e * (c->land_bytes + 256), land, c->land_bytes,
                                 cudaMemcpyDeviceToHost, on),
                 "download landing");
        if (on != s) {
            CHILD_CU(cudaEventRecord(hop[1], on), "cudaEventRecord(hop back)");
            CHILD_CU(cudaStreamWaitEvent(s, hop[1], 0), "cudaStreamWaitEvent(hop back)");
        }
    }
    for (int e = 0; e < CALLS; ++e) {
        const cudaStream_t on = e == 2 ? s2 : s;
        if (on != s) {
            CHILD_CU(cudaEventRecord(hop[0], s), "cudaEventRecord(hop)");
            CHILD_CU(cudaStreamWaitEvent(on, hop[0], 0), "cudaStreamWaitEvent(hop)");
        }
        CHILD_CK(tide_reduce_scatter(grp, (const void *const *)dgrad[e], dout, c->alpha,
                                     c->accumulate[e], c->modes[e], on),
                 "reduce_scatter");
        CHILD_CU(cudaMemcpyAsync(hout + e * (c->out_bytes + 256), dout, c->out_bytes,
                                 cudaMemcpyDeviceToHost, on),
                 "download out");
        if (on != s) {
            CHILD_CU(cudaEventRecord(hop[1], on), "cudaEventRecord(hop back)");
            CHILD_CU(cudaStreamWaitEvent(s, hop[1], 0), "cudaStreamWaitEvent(hop back)");
        }
    }
    CHILD_CK(tide_cuda_mp_sync(grp->arena, TIDE_COLL_ALL_GATHER), "sync AG");
    CHILD_CK(tide_cuda_mp_sync(grp->arena, TIDE_COLL_REDUCE_SCATTER), "sync RS");
    CHILD_CU(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    cudaStreamDestroy(s2);
    for (int k = 0; k < 2; ++k)
        cudaEventDestroy(hop[k]);
    tide_cuda_stats_t sa, sr;
    CHILD_CK(tide_cuda_mp_stats(grp->arena, TIDE_COLL_ALL_GATHER, &sa), "stats AG");
    CHILD_CK(tide_cuda_mp_stats(grp->arena, TIDE_COLL_REDUCE_SCATTER, &sr), "stats RS");
    c->batched[r] = sa.batched + sr.batched;
    c->rail_steps[r] = sa.rail_steps + sr.rail_steps;
    c->ce_batched[r] = sa.ce_batched + sr.ce_batched;
    c->sliced[r] = sa.sliced + sr.sliced;
    c->direct[r] = sr.direct;
    c->elided[r] = sa.sync_elided + sr.sync_elided;
    for (int e = 0; e < CALLS; ++e) {
        memcpy(c->land[1][e][r], hland + e * (c->land_bytes + 256), c->land_bytes);
        memcpy(c->out[1][e][r], hout + e * (c->out_bytes + 256), c->out_bytes);
    }
    static bool said;
    if (r == 0 && !said) {
        said = true;
        printf("  segments: %s\n", tide_cuda_mp_uses_vmm(grp->arena, 1 % c->n)
                                       ? "CUDA VMM (POSIX fd handles)"
                                       : "legacy cudaIpc");
        const tide_mp_arena_t *ma = (const tide_mp_arena_t *)grp->arena;
        const char *where = ma->host_flags          ? "host (control block), memory-op waits"
                            : ma->abort_dev != NULL ? "device, wait kernels polling the abort"
                                                    : "device, memory-op waits";
        printf("  flags: %s\n", where);
    }
    CHILD_CK(tide_group_deregister(grp), "deregister");
    for (int e = 0; e < CALLS; ++e) {
        cudaFree(dshard[e]);
        for (int q = 0; q < g->num_params; ++q)
            cudaFree(dgrad[e][q]);
    }
    cudaFree(dout);
    cudaFreeHost(hland);
    cudaFreeHost(hout);
    return true;
}

/* A rank's CUDA context (cudaSetDevice creates it): false, with CUDA's reason on stderr, when
 * it cannot be made, so that a rank's exit status 2 names its cause in the test's log. */
static bool rank_device(int r) {
    const cudaError_t e = cudaSetDevice(0);
    if (e == cudaSuccess) return true;
    fprintf(stderr, "rank %d: cudaSetDevice(0): %s\n", r, cudaGetErrorString(e));
    return false;
}

static int child_main(case_t *cases, int num, int m, int l, int r, const char *name) {
    if (!rank_device(r)) return 2;
    cudaStream_t s;
    const cudaError_t se = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (se != cudaSuccess) {
        fprintf(stderr, "rank %d: cudaStreamCreateWithFlags: %s\n", r, cudaGetErrorString(se));
        return 2;
    }
    tide_comm_t comm;
    if (tide_comm_init_rank(TIDE_FABRIC_CUDA, m, l, r, name, &comm) != TIDE_SUCCESS) {
        snprintf(cases[0].child_error + r * 256, 256, "comm_init_rank: %s", tide_get_last_error());
        return 1;
    }
    for (int k = 0; k < num; ++k)
        if (!child_case(comm, &cases[k], r, s, cases[k].child_error + r * 256)) return 1;
    tide_comm_destroy(comm);
    fflush(stdout); /* the child leaves by _exit */
    return 0;
}

/* ------------------------------------------------------------------ the matrix */

static uint64_t batched_copies; /* over the matrix: batched copies of the last calls */
static uint64_t rail_steps;     /* over the matrix: rail steps of the last calls */
static uint64_t ce_batched;     /* over the matrix: batched copies run by cudaMemcpyBatchAsync */
static uint64_t sliced;         /* over the matrix: sum / landing launches past one per op */

/* TIDE_CUDA_MP_RAILS=1: cross-node puts go through the rail steps (mp_rails.c). */
static bool rails_on(void) {
    const char *e = getenv("TIDE_CUDA_MP_RAILS");
    return e != NULL && strcmp(e, "1") == 0;
}

static uint64_t fused_calls;  /* over the matrix: last RS calls with fused outputs (direct 2) */
static uint64_t elided_calls; /* last AG and RS calls of rank 0 that ran the synchronisation
                               * elision (stats.sync_elided) */
static uint64_t direct_cases; /* configurations where direct mode had to be taken */

/* TIDE_CUDA_MP_DIRECT: unset or 1 on, 0 off. */
static bool direct_on(void) {
    const char *e = getenv("TIDE_CUDA_MP_DIRECT");
    return e == NULL || e[0] == '\0' || strcmp(e, "1") == 0;
}

/* The last RS call of a configuration took the path it must: direct at M = 1, L > 1 when on
 * and every gradient is exportable, with fused outputs only where every output is, the same
 * on every rank. */
static bool direct_check(const case_t *c) {
    const bool sums = direct_on() && c->m == 1 && c->l > 1 && strcmp(managed_env(), "grads0") != 0;
    bool ok = true;
    if (sums) ++direct_cases;
    for (int r = 0; r < c->n; ++r) {
        const bool good = c->direct[r] == c->direct[0] &&
                          (sums ? c->direct[r] >= 1 : c->direct[r] == 0) &&
                          !(strcmp(managed_env(), "out0") == 0 && c->direct[r] >= 2);
        if (!good) {
            fprintf(stderr,
                    "FAIL: %s: rank %d's last RS call took path %llu (rank 0: %llu; "
                    "want %s; TIDE_CUDA_MP_DIRECT %s, TIDE_TEST_MP_MANAGED %s)\n",
                    c->what, r, (unsigned long long)c->direct[r], (unsigned long long)c->direct[0],
                    sums ? ">= 1 on every rank" : "0", direct_on() ? "on" : "0", managed_env());
            ok = false;
        }
    }
    if (ok && sums && c->direct[0] >= 2) ++fused_calls;
    if (ok) elided_calls += c->elided[0];
    return ok;
}

static bool run_topology(int m, int l, int *configs, double budget_end) {
    static case_t cases[MAX_CONFIGS];
    int num = 0;
    for (int v = 0; v < MAX_CONFIGS && now_s() < budget_end; ++v) {
        if (!case_init(&cases[num], m, l, v)) continue;
        if (!cpu_oracle_run(cases[num].m, cases[num].l, cpu_rank, &cases[num], cases[num].what))
            return false;
        ++num;
    }
    if (lane_only && num < 2) { /* one with empty puts, one without */
        fprintf(stderr, "FAIL: --lane: %d configurations at M=%d L=%d within the budget\n", num,
                m, l);
        return false;
    }
    char name[64];
    snprintf(name, sizeof(name), "mp%ld-%dx%d", (long)getpid(), m, l);
    const int n = m * l;
    pid_t pids[MAX_RANKS];
    fflush(stdout);
    for (int r = 0; r < n; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(child_main(cases, num, m, l, r, name));
    }
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            ok = false;
            for (int k = 0; k < num; ++k)
                if (cases[k].child_error[r * 256])
                    fprintf(stderr, "FAIL: %s: rank %d: %s\n", cases[k].what, r,
                            cases[k].child_error + r * 256);
            fprintf(stderr, "FAIL: M=%d L=%d rank %d exited with status %d\n", m, l, r, st);
        }
    }
    for (int k = 0; k < num && ok; ++k) {
        case_t *c = &cases[k];
        for (int e = 0; e < CALLS && ok; ++e)
            for (int r = 0; r < n && ok; ++r) {
                long d = first_diff(c->land[0][e][r], c->land[1][e][r], c->land_bytes);
                if (d >= 0) {
                    fprintf(stderr, "FAIL: %s: AG call %d rank %d differs at byte %ld\n", c->what,
                            e, r, d);
                    ok = false;
                }
                d = first_diff(c->out[0][e][r], c->out[1][e][r], c->out_bytes);
                if (d >= 0) {
                    fprintf(stderr, "FAIL: %s: RS call %d rank %d differs at float %ld: %a vs %a\n",
                            c->what, e, r, d / 4, (double)c->out[0][e][r][d / 4],
                            (double)c->out[1][e][r][d / 4]);
                    ok = false;
                }
            }
        /* Every rank of a several-node topology has cross-node puts in both collectives: with
         * rails each must have issued steps, without them none. */
        for (int r = 0; r < n && ok; ++r)
            if ((rails_on() && m > 1) != (c->rail_steps[r] > 0)) {
                fprintf(
                    stderr, "FAIL: %s: rank %d issued %llu rail steps (TIDE_CUDA_MP_RAILS %s)\n",
                    c->what, r, (unsigned long long)c->rail_steps[r], rails_on() ? "1" : "unset");
                ok = false;
            }
        if (ok) ok = direct_check(c);
        if (ok) ++*configs;
        for (int r = 0; r < n; ++r) {
            batched_copies += c->batched[r];
            rail_steps += c->rail_steps[r];
            ce_batched += c->ce_batched[r];
            sliced += c->sliced[r];
        }
    }
    printf("%s M=%d L=%d: %d configurations x %d AG + %d RS calls\n", ok ? "ok  " : "FAIL", m, l,
           num, CALLS, CALLS);
    fflush(stdout);
    return ok;
}

static int matrix(double seconds, int only_m, int only_l) {
    static int topo[][2] = {{1, 2}, {2, 1}, {2, 2}, {1, 4}, {4, 1}, {3, 2},
                            {2, 4}, {4, 2}, {8, 1}, {1, 8}, {1, 1}, {1, 3}};
    static const int lane_topo[][2] = {{2, 1}, {3, 1}, {4, 1}};
    if (only_m > 0) { /* --topology M L: that one only */
        topo[0][0] = only_m;
        topo[0][1] = only_l;
    }
    if (lane_only) /* --lane: the M x 1 topologies of the rail lane */
        for (int k = 0; k < 3; ++k) {
            topo[k][0] = lane_topo[k][0];
            topo[k][1] = lane_topo[k][1];
        }
    const double t0 = now_s(), end = t0 + seconds;
    int configs = 0, topos = 0;
    bool ok = true;
    const size_t count = only_m > 0 ? 1 : lane_only ? 3 : sizeof(topo) / sizeof(topo[0]);
    for (size_t k = 0; k < count && now_s() < end; ++k) {
        ok = run_topology(topo[k][0], topo[k][1], &configs, end) && ok;
        ++topos;
    }
    /* Batched mode must have run batches (else it compared the per-op path twice). */
    const char *env = getenv("TIDE_CUDA_BATCH");
    const bool per_op = env != NULL && strcmp(env, "0") == 0;
    if (per_op ? batched_copies != 0 : batched_copies == 0) {
        fprintf(stderr, "FAIL: %llu copies ran in batches with TIDE_CUDA_BATCH=%s\n",
                (unsigned long long)batched_copies, env ? env : "(unset)");
        ok = false;
    }
    /* Every process is on one GPU: copy-engine batches run only with TIDE_CUDA_CE_BATCH=all,
     * and then every batch is one. */
    const char *ce = getenv("TIDE_CUDA_CE_BATCH");
    const bool ce_all = ce != NULL && strcmp(ce, "all") == 0;
    if (ce_all ? ce_batched != batched_copies || (!per_op && ce_batched == 0) : ce_batched != 0) {
        fprintf(stderr,
                "FAIL: %llu of %llu batched copies ran as cudaMemcpyBatchAsync with "
                "TIDE_CUDA_CE_BATCH=%s\n",
                (unsigned long long)ce_batched, (unsigned long long)batched_copies,
                ce ? ce : "(unset)");
        ok = false;
    }
    /* TIDE_CUDA_SLICES=K > 1: the sums and landings ran as several launches. */
    const char *sl = getenv("TIDE_CUDA_SLICES");
    if (sl != NULL && atoi(sl) > 1 && sliced == 0) {
        fprintf(stderr, "FAIL: TIDE_CUDA_SLICES=%s, yet no sum or landing ran sliced\n", sl);
        ok = false;
    }
    /* Direct mode must have fused some configuration's outputs where they are exportable. */
    if (direct_cases > 0 && strcmp(managed_env(), "out0") != 0 && fused_calls == 0) {
        fprintf(stderr, "FAIL: direct mode ran %llu configurations, none with fused outputs\n",
                (unsigned long long)direct_cases);
        ok = false;
    }
    printf("direct mode (TIDE_CUDA_MP_DIRECT %s, TIDE_TEST_MP_MANAGED '%s'): %llu configurations "
           "at M = 1 took it, %llu with fused outputs; %llu last calls (AG and RS) ran the "
           "synchronisation elision\n",
           direct_on() ? "on" : "0", managed_env(), (unsigned long long)direct_cases,
           (unsigned long long)fused_calls, (unsigned long long)elided_calls);
    /* --lane ran every topology it names, each with configurations. */
    if (lane_only && topos != 3) {
        fprintf(stderr, "FAIL: --lane ran %d of its 3 topologies within the budget\n", topos);
        ok = false;
    }
    printf("%s: %d configurations on %d topologies%s bit for bit equal to the CPU fabric (%.1f s); "
           "copies %s, %llu batched in the last calls (%llu by cudaMemcpyBatchAsync); cross-node "
           "puts %s, %llu rail steps; %llu sliced launches\n",
           ok ? "PASS" : "FAIL", configs, topos, lane_only ? " (rail lane, M x 1)" : "",
           now_s() - t0, per_op ? "per op" : "batched",
           (unsigned long long)batched_copies, (unsigned long long)ce_batched,
           rails_on() ? "as rail steps" : "as copies", (unsigned long long)rail_steps,
           (unsigned long long)sliced);
    return ok ? 0 : 1;
}

/* ------------------------------------------------------------------ a killed rank */

typedef struct {
    double killed_at;
    double failed_at[MAX_RANKS];
    double called_at[MAX_RANKS]; /* when the rank entered its last call */
    int result[MAX_RANKS];
    char msg[MAX_RANKS][320];
} kill_report_t;

static int kill_child(int m, int l, int r, const char *name, int victim, kill_report_t *rep,
                      int sig) {
    if (!rank_device(r)) return 2;
    tide_comm_t comm;
    if (tide_comm_init_rank(TIDE_FABRIC_CUDA, m, l, r, name, &comm) != TIDE_SUCCESS) return 3;
    tide_param_shape_t shapes[2] = {{64, 32}, {7, 5}};
    tide_group_desc_t desc = {2, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    tide_group_t grp;
    if (tide_group_register(comm, &cfg, &desc, &grp) != TIDE_SUCCESS) return 4;
    void *shard = NULL;
    if (cudaMalloc(&shard, grp->plan->geom.shard_bytes) != cudaSuccess) return 5;
    cudaMemset(shard, r, grp->plan->geom.shard_bytes);
    cudaDeviceSynchronize();
    tide_result_t res = TIDE_SUCCESS;
    for (int e = 0; e < 200 && res == TIDE_SUCCESS; ++e) {
        if (r == victim && e == 3) {
            rep->killed_at = now_s();
            raise(sig); /* SIGKILL: dies; SIGSTOP: hangs with its sockets open */
        }
        rep->called_at[r] = now_s();
        res = tide_all_gather(grp, shard, e % 2, NULL);
    }
    if (res == TIDE_SUCCESS) res = tide_cuda_mp_sync(grp->arena, TIDE_COLL_ALL_GATHER);
    rep->failed_at[r] = now_s();
    rep->result[r] = (int)res;
    snprintf(rep->msg[r], sizeof(rep->msg[r]), "%s", tide_get_last_error());
    /* Deregistration and destruction still release everything, without hanging. */
    tide_group_deregister(grp);
    cudaFree(shard);
    tide_comm_destroy(comm);
    return 0;
}

/* sig SIGKILL: the victim dies, its sockets close, the survivors name it at once.  SIGSTOP:
 * it hangs with its sockets open; the first survivor to reach TIDE_TIMEOUT_MS names it from
 * the group's control block (it never entered call 3) and fails the group, the others follow
 * with that message (none may return success: the poison released their device waits), and
 * the victim, resumed, fails at its next call. */
static int kill_test(int sig) {
    const int m = 2, l = 2, n = 4, victim = 2;
    const double lo = sig == SIGSTOP ? 3.0 : 0.0, hi = 3.0 + 1.0;
    setenv("TIDE_TIMEOUT_MS", "3000", 1);
    kill_report_t *rep = shared_alloc(sizeof(*rep));
    char name[64];
    snprintf(name, sizeof(name), "mpkill%ld", (long)getpid());
    pid_t pids[MAX_RANKS];
    const double t0 = now_s();
    for (int r = 0; r < n; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(60); /* a hang is a failure, not a stuck job */
            _exit(kill_child(m, l, r, name, victim, rep, sig));
        }
    }
    bool ok = true;
    int status[MAX_RANKS] = {0};
    for (int r = 0; r < n; ++r)
        if (r != victim) waitpid(pids[r], &status[r], 0);
    /* The first survivor whose deadline passes fails the group and the others follow at once,
     * so the no-early-failure bound holds for that survivor, measured from its own call (it
     * may enter call 3, and start its deadline, a little before the victim stops itself); the
     * bound on how late every survivor fails is measured from the stop.  That survivor is the
     * one whose error does not say another rank "failed the group": a follower can return
     * before it (it still clears its flags and drains its stream), and a follower that entered
     * call 3 a few ms later measures just under the deadline from its own call. */
    int first = -1;
    for (int q = 0; q < n; ++q) {
        if (q == victim) continue;
        const bool own = strstr(rep->msg[q], "failed the group") == NULL;
        const bool first_own = first >= 0 && strstr(rep->msg[first], "failed the group") == NULL;
        if (first < 0 || (own && !first_own) ||
            (own == first_own && rep->failed_at[q] < rep->failed_at[first]))
            first = q;
    }
    const double waited = rep->failed_at[first] - rep->called_at[first];
    for (int r = 0; r < n; ++r) {
        if (r == victim) continue;
        const int st = status[r];
        const double after = rep->failed_at[r] - rep->killed_at;
        char want[32];
        snprintf(want, sizeof(want), "rank %d", victim);
        const bool good = WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
                          rep->result[r] == TIDE_ERR_TIMEOUT && strstr(rep->msg[r], want) &&
                          waited >= lo && after < hi;
        printf("%s rank %d: %s %.3f s after the kill: %s\n", good ? "ok  " : "FAIL", r,
               tide_get_error_string((tide_result_t)rep->result[r]), after, rep->msg[r]);
        ok = ok && good;
    }
    int st = 0;
    if (sig == SIGSTOP) {
        /* The hung rank resumes after the others failed the group: its next call fails too
         * (never success), naming the rank that failed the group, and it exits cleanly. */
        kill(pids[victim], SIGCONT);
        waitpid(pids[victim], &st, 0);
        const bool good = WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
                          rep->result[victim] == TIDE_ERR_TIMEOUT &&
                          strstr(rep->msg[victim], "failed the group") != NULL;
        printf("%s rank %d (resumed): %s: %s\n", good ? "ok  " : "FAIL", victim,
               tide_get_error_string((tide_result_t)rep->result[victim]), rep->msg[victim]);
        ok = ok && good;
    } else {
        waitpid(pids[victim], &st, 0);
        ok = ok && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    }
    printf("%s: %s rank %d of %d; survivors fail stop within TIDE_TIMEOUT_MS = 3000 and exit "
           "(%.1f s in all)\n",
           ok ? "PASS" : "FAIL", sig == SIGSTOP ? "stopped" : "killed", victim, n, now_s() - t0);
    return ok ? 0 : 1;
}

/* ------------------------------------------------------------------ repeated calls */

typedef struct {
    int step[MAX_RANKS]; /* 0: passed, else the step that failed */
    float got[MAX_RANKS];
    double seconds[MAX_RANKS];
    char msg[MAX_RANKS][320];
} repeat_report_t;

static int repeat_fail(repeat_report_t *rep, int r, int step) {
    rep->step[r] = step;
    snprintf(rep->msg[r], sizeof(rep->msg[r]), "%s", tide_get_last_error());
    return 0;
}

/* `calls` AG + RS calls on each of n processes (M = 1, L = n), then a sync: every call must
 * succeed, within the children's alarm (a hang fails), and the last RS must give n times the
 * gradients' value (every byte 0x3f: bf16 0x3f3f = 0.74609375; the sum is exact). */
static int repeat_child(int n, int r, const char *name, int calls, repeat_report_t *rep) {
    const double t0 = now_s();
    if (cudaSetDevice(0) != cudaSuccess) return repeat_fail(rep, r, 2);
    tide_comm_t comm;
    if (tide_comm_init_rank(TIDE_FABRIC_CUDA, 1, n, r, name, &comm) != TIDE_SUCCESS)
        return repeat_fail(rep, r, 3);
    tide_param_shape_t shapes[2] = {{64, 32}, {7, 5}};
    tide_group_desc_t desc = {2, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = 1;
    cfg.gpus_per_node = n;
    tide_group_t grp;
    if (tide_group_register(comm, &cfg, &desc, &grp) != TIDE_SUCCESS) return repeat_fail(rep, r, 4);
    const tide_geom_t *g = &grp->plan->geom;
    void *shard = NULL, *grads[2] = {NULL, NULL};
    float *out = NULL;
    if (cudaMalloc(&shard, g->shard_bytes) != cudaSuccess ||
        cudaMalloc((void **)&out, g->fp32_shard_bytes) != cudaSuccess)
        return repeat_fail(rep, r, 5);
    cudaMemset(shard, r, g->shard_bytes);
    for (int p = 0; p < 2; ++p) {
        const size_t b = g->params[p].dim0 * g->params[p].inner * g->grad_item;
        if (cudaMalloc(&grads[p], b) != cudaSuccess) return repeat_fail(rep, r, 6);
        cudaMemset(grads[p], 0x3f, b);
    }
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        return repeat_fail(rep, r, 7);
    cudaDeviceSynchronize();
    for (int e = 0; e < calls; ++e) {
        if (tide_all_gather(grp, shard, e % 2, s) != TIDE_SUCCESS) return repeat_fail(rep, r, 10);
        if (tide_reduce_scatter(grp, (const void *const *)grads, out, 1.0f, 0, TIDE_RS_IN_PLACE,
                                s) != TIDE_SUCCESS)
            return repeat_fail(rep, r, 11);
    }
    if (tide_cuda_mp_sync(grp->arena, TIDE_COLL_ALL_GATHER) != TIDE_SUCCESS ||
        tide_cuda_mp_sync(grp->arena, TIDE_COLL_REDUCE_SCATTER) != TIDE_SUCCESS)
        return repeat_fail(rep, r, 12);
    if (cudaMemcpy(&rep->got[r], out, sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
        return repeat_fail(rep, r, 13);
    tide_group_deregister(grp);
    cudaFree(shard);
    cudaFree(out);
    for (int p = 0; p < 2; ++p)
        cudaFree(grads[p]);
    cudaStreamDestroy(s);
    tide_comm_destroy(comm);
    rep->seconds[r] = now_s() - t0;
    return 0;
}

static int repeat_test(int n, int calls) {
    if (n < 1 || n > MAX_RANKS || calls < 1) {
        fprintf(stderr, "--repeat N CALLS: 1 <= N <= %d, CALLS >= 1\n", MAX_RANKS);
        return 2;
    }
    repeat_report_t *rep = shared_alloc(sizeof(*rep));
    char name[64];
    snprintf(name, sizeof(name), "mprep%ld", (long)getpid());
    pid_t pids[MAX_RANKS];
    const double t0 = now_s();
    for (int r = 0; r < n; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(120); /* a hang is a failure, not a stuck job */
            _exit(repeat_child(n, r, name, calls, rep));
        }
    }
    const float want = (float)n * 0.74609375f;
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        const bool good =
            WIFEXITED(st) && WEXITSTATUS(st) == 0 && rep->step[r] == 0 && rep->got[r] == want;
        if (good)
            printf("ok   rank %d: %d AG + %d RS calls in %.2f s\n", r, calls, calls,
                   rep->seconds[r]);
        else if (WIFSIGNALED(st))
            printf("FAIL rank %d: killed by signal %d (SIGALRM: it hung)\n", r, WTERMSIG(st));
        else if (rep->step[r] != 0)
            printf("FAIL rank %d: step %d: %s\n", r, rep->step[r], rep->msg[r]);
        else
            printf("FAIL rank %d: out[0] = %.9g, want %.9g\n", r, (double)rep->got[r],
                   (double)want);
        ok = ok && good;
    }
    printf("%s: %d processes x %d AG + RS calls on one GPU (%.1f s)%s\n", ok ? "PASS" : "FAIL", n,
           calls, now_s() - t0,
           getenv("CUDA_MPS_PIPE_DIRECTORY") ? " (CUDA_MPS_PIPE_DIRECTORY set)" : "");
    return ok ? 0 : 1;
}

/* ------------------------------------------------------------------ enqueue time */

typedef struct {
    double ag_us[MAX_RANKS], rs_us[MAX_RANKS], ag_api_us[MAX_RANKS], rs_api_us[MAX_RANKS];
    uint64_t ag_cmds[MAX_RANKS], rs_cmds[MAX_RANKS], ag_batched[MAX_RANKS], ag_batches[MAX_RANKS];
    int status[MAX_RANKS];
} enq_report_t;

static int by_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int enqueue_child(int m, int l, int r, const char *name, enq_report_t *rep) {
    if (!rank_device(r)) return 2;
    tide_comm_t comm;
    if (tide_comm_init_rank(TIDE_FABRIC_CUDA, m, l, r, name, &comm) != TIDE_SUCCESS) return 3;
    enum { P = 30, ITERS = 60 };
    tide_param_shape_t shapes[P];
    for (int p = 0; p < P; ++p)
        shapes[p] = (tide_param_shape_t){(uint64_t)(64 + 16 * (p % 5)), (uint64_t)(32 + p)};
    tide_group_desc_t desc = {P, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    tide_group_t grp;
    if (tide_group_register(comm, &cfg, &desc, &grp) != TIDE_SUCCESS) {
        fprintf(stderr, "rank %d register: %s\n", r, tide_get_last_error());
        return 4;
    }
    const tide_geom_t *g = &grp->plan->geom;
    void *shard, *out, *grads[P];
    cudaMalloc(&shard, g->shard_bytes);
    cudaMemset(shard, 0, g->shard_bytes);
    cudaMalloc(&out, g->fp32_shard_bytes);
    for (int p = 0; p < P; ++p) {
        const size_t b = g->params[p].dim0 * g->params[p].inner * g->grad_item;
        cudaMalloc(&grads[p], b);
        cudaMemset(grads[p], 0, b);
    }
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaDeviceSynchronize();
    double ag[ITERS], rs[ITERS], api[ITERS], rsapi[ITERS];
    for (int i = 0; i < ITERS; ++i) {
        tide_cuda_stats_t st;
        const double t0 = now_s();
        if (tide_all_gather(grp, shard, i % 2, s) != TIDE_SUCCESS) return 5;
        api[i] = 1e6 * (now_s() - t0);
        tide_cuda_mp_stats(grp->arena, TIDE_COLL_ALL_GATHER, &st);
        ag[i] = 1e-3 * (double)st.enqueue_ns;
        rep->ag_cmds[r] = st.descriptors + st.waits + st.records;
        rep->ag_batches[r] = st.batches;
        rep->ag_batched[r] = st.batched;
        const double t1 = now_s();
        if (tide_reduce_scatter(grp, (const void *const *)grads, out, 1.0f, 0, TIDE_RS_IN_PLACE,
                                s) != TIDE_SUCCESS)
            return 6;
        rsapi[i] = 1e6 * (now_s() - t1);
        tide_cuda_mp_stats(grp->arena, TIDE_COLL_REDUCE_SCATTER, &st);
        rs[i] = 1e-3 * (double)st.enqueue_ns;
        rep->rs_cmds[r] = st.descriptors + st.waits + st.records;
    }
    if (tide_cuda_mp_sync(grp->arena, TIDE_COLL_REDUCE_SCATTER) != TIDE_SUCCESS) return 7;
    /* Medians of the steady calls (the first two prepare and run FRESH). */
    qsort(ag + 4, ITERS - 4, sizeof(double), by_double);
    qsort(rs + 4, ITERS - 4, sizeof(double), by_double);
    qsort(api + 4, ITERS - 4, sizeof(double), by_double);
    qsort(rsapi + 4, ITERS - 4, sizeof(double), by_double);
    rep->rs_api_us[r] = rsapi[4 + (ITERS - 4) / 2];
    rep->ag_us[r] = ag[4 + (ITERS - 4) / 2];
    rep->rs_us[r] = rs[4 + (ITERS - 4) / 2];
    rep->ag_api_us[r] = api[4 + (ITERS - 4) / 2];
    tide_group_deregister(grp);
    tide_comm_destroy(comm);
    return 0;
}

static int enqueue_test(void) {
    const int m = 8, l = 1, n = 8;
    enq_report_t *rep = shared_alloc(sizeof(*rep));
    char name[64];
    snprintf(name, sizeof(name), "mpenq%ld", (long)getpid());
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < n; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(enqueue_child(m, l, r, name, rep));
    }
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0))
            fprintf(stderr, "rank %d: status %d\n", r, st);
    }
    if (!ok) return 1;
    const char *b = getenv("TIDE_CUDA_BATCH");
    printf("enqueue per rank per call, P = 30, M = 8, L = 1 (8 processes, one GPU), median of 56 "
           "steady calls, copies %s; enqueue: host work of the call; API: the whole tide_* call, "
           "which also waits for the rank's call e - 2:\n",
           b != NULL && strcmp(b, "0") == 0 ? "per op (TIDE_CUDA_BATCH=0)" : "batched");
    for (int r = 0; r < n; ++r)
        printf("  rank %d: AG enqueue %.1f us (API %.1f us, %llu stream ops, %llu batches of %llu "
               "copies), RS enqueue %.1f us (API %.1f us, %llu stream ops)\n",
               r, rep->ag_us[r], rep->ag_api_us[r], (unsigned long long)rep->ag_cmds[r],
               (unsigned long long)rep->ag_batches[r], (unsigned long long)rep->ag_batched[r],
               rep->rs_us[r], rep->rs_api_us[r], (unsigned long long)rep->rs_cmds[r]);
    return 0;
}

int main(int argc, char **argv) {
    double seconds = 60;
    int only_m = 0, only_l = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--kill") == 0) return kill_test(SIGKILL);
        if (strcmp(argv[i], "--stop") == 0) return kill_test(SIGSTOP);
        if (strcmp(argv[i], "--enqueue") == 0) return enqueue_test();
        if (strcmp(argv[i], "--repeat") == 0 && i + 2 < argc)
            return repeat_test(atoi(argv[i + 1]), atoi(argv[i + 2]));
        if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) seconds = atof(argv[++i]);
        if (strcmp(argv[i], "--lane") == 0) lane_only = true;
        if (strcmp(argv[i], "--topology") == 0 && i + 2 < argc) {
            only_m = atoi(argv[++i]);
            only_l = atoi(argv[++i]);
            if (only_m < 1 || only_l < 1 || only_m * only_l > MAX_RANKS) {
                fprintf(stderr, "--topology M L: 1 <= M L <= %d\n", MAX_RANKS);
                return 2;
            }
        }
    }
    return matrix(seconds, only_m, only_l);
}
