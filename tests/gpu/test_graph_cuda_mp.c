/*
 * test_graph_cuda_mp.c - TIDE-AG and TIDE-RS captured into a CUDA graph on the
 * one-process-per-rank CUDA fabric (src/fabric/cuda/mp_graph.c) and replayed, against eager
 * calls and the CPU fabric, bit for bit, with N processes on one GPU.
 *
 *   test_graph_cuda_mp [--ranks N]   N = 2 and 4 by default: per N, every rank captures one
 *                                    all-gather and one reduce-scatter (In-Place) of a group,
 *                                    replays the graph REPLAYS times with fresh inputs
 *                                    (wide exponents) written before each replay, and an
 *                                    eager group makes the same calls on the same inputs;
 *                                    then BURST replays back to back with no host wait
 *                                    between them.  Also: capturing a program's first call
 *                                    and an eager call of a captured family are refused, and
 *                                    tide_group_capture_readiness answers PROGRAM_COLD before
 *                                    the first call and 0 (capturable) inside the capture.
 *   test_graph_cuda_mp --kill        N = 4, TIDE_TIMEOUT_MS = 3000: a rank is killed between
 *                                    two replays; every survivor's replay must end and its
 *                                    sync report TIDE_ERR_TIMEOUT within TIDE_TIMEOUT_MS + 2 s
 *                                    of the kill (no hang: the device waits bound themselves).
 *
 * The parent never touches CUDA: it draws every input, runs the CPU fabric (a thread per
 * rank) as the oracle, forks the N ranks, and compares what they wrote to shared memory.
 * Each line says what passed or failed; exit status 0 all passed, 1 a failure, 2 a setup
 * failure.
 */
#include "api/comm.h"
#include "fabric/cuda/mp.h"
#include "kernels/kernels.h"
#include "plan/plan.h"
#include "tide.h"

#include <cuda_runtime_api.h>
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

#define REPLAYS 20
#define BURST 30
#define SETS (REPLAYS + 1) /* set 0: the eager calls before the capture */
#define MAX_RANKS 8
#define NP 3
#define KILL_TIMEOUT_MS 3000

#define HOST_RAND_SEED 0x9e3779b97f4a7c15ull
#define HOST_RAND_WIDE_EXP 12
#include "host_rand.h"
#include "cpu_oracle.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    int n;
    tide_config_t cfg;
    tide_param_shape_t shapes[NP];
    tide_group_desc_t desc;
    tide_plan_t plan;
    float alpha;
    size_t shard_bytes, land_bytes, out_bytes;
    uint8_t *shard[SETS][MAX_RANKS];
    void *grad[SETS][MAX_RANKS][NP];
    uint8_t *land_cpu[SETS][MAX_RANKS];
    float *out_cpu[SETS][MAX_RANKS];
    /* Shared with the ranks.  [0]: the captured group (set 0 its eager calls before the
     * capture, set k > 0 replay k), [1]: the eager group. */
    uint8_t *land[2][SETS][MAX_RANKS];
    float *out[2][SETS][MAX_RANKS];
    uint8_t *burst_land[MAX_RANKS];
    float *burst_out[MAX_RANKS];
    char *err;              /* [MAX_RANKS][320] */
    pthread_barrier_t *bar; /* process-shared */
    double *killed_at;      /* [1] */
    double *failed_at;      /* [MAX_RANKS] */
    int *result;            /* [MAX_RANKS] */
} case_t;

static void case_init(case_t *c, int n) {
    memset(c, 0, sizeof(*c));
    c->n = n;
    const tide_param_shape_t shapes[NP] = {{33, 17}, {8, 5}, {64, 3}};
    memcpy(c->shapes, shapes, sizeof(shapes));
    c->desc = (tide_group_desc_t){NP, c->shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    c->cfg = (tide_config_t)TIDE_CONFIG_INIT;
    c->cfg.nodes = 1;
    c->cfg.gpus_per_node = n;
    if (tide_plan_create(&c->cfg, &c->desc, &c->plan) != TIDE_SUCCESS) {
        fprintf(stderr, "FAIL: plan: %s\n", tide_get_last_error());
        exit(2);
    }
    const tide_geom_t *g = &c->plan->geom;
    c->alpha = tide_alpha_avg(n);
    c->shard_bytes = g->shard_bytes;
    c->land_bytes = g->group_bytes;
    c->out_bytes = g->fp32_shard_bytes;
    for (int k = 0; k < SETS; ++k)
        for (int r = 0; r < n; ++r) {
            c->shard[k][r] = xmalloc(c->shard_bytes);
            for (size_t i = 0; i < c->shard_bytes / 2; ++i)
                ((uint16_t *)c->shard[k][r])[i] = tide_float_to_bf16(rnd_wide());
            for (int q = 0; q < NP; ++q) {
                const uint64_t elems = g->params[q].dim0 * g->params[q].inner;
                c->grad[k][r][q] = xmalloc(elems * 2);
                for (uint64_t i = 0; i < elems; ++i)
                    ((uint16_t *)c->grad[k][r][q])[i] = tide_float_to_bf16(rnd_wide());
            }
            c->land_cpu[k][r] = xmalloc(c->land_bytes);
            c->out_cpu[k][r] = xmalloc(c->out_bytes);
            for (int v = 0; v < 2; ++v) {
                c->land[v][k][r] = shared_alloc(c->land_bytes);
                c->out[v][k][r] = shared_alloc(c->out_bytes);
            }
        }
    for (int r = 0; r < n; ++r) {
        c->burst_land[r] = shared_alloc(c->land_bytes);
        c->burst_out[r] = shared_alloc(c->out_bytes);
    }
    c->err = shared_alloc(MAX_RANKS * 320);
    c->killed_at = shared_alloc(sizeof(double));
    c->failed_at = shared_alloc(MAX_RANKS * sizeof(double));
    c->result = shared_alloc(MAX_RANKS * sizeof(int));
    c->bar = shared_alloc(sizeof(pthread_barrier_t));
    pthread_barrierattr_t at;
    pthread_barrierattr_init(&at);
    pthread_barrierattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    if (pthread_barrier_init(c->bar, &at, (unsigned)n) != 0) exit(2);
    pthread_barrierattr_destroy(&at);
}

/* ------------------------------------------------------------------ the CPU fabric (oracle) */

static bool cpu_rank(void *ctx, tide_comm_t comm, int r, char *err, size_t len) {
    case_t *c = ctx;
    tide_group_t grp;
    if (tide_group_register(comm, &c->cfg, &c->desc, &grp) != TIDE_SUCCESS) {
        snprintf(err, len, "register: %s", tide_get_last_error());
        return false;
    }
    for (int k = 0; k < SETS && !err[0]; ++k) {
        void *land = NULL;
        if (tide_all_gather(grp, c->shard[k][r], 0, NULL) != TIDE_SUCCESS ||
            tide_group_landing(grp, 0, &land) != TIDE_SUCCESS ||
            tide_reduce_scatter(grp, (const void *const *)c->grad[k][r], c->out_cpu[k][r], c->alpha,
                                0, TIDE_RS_IN_PLACE, NULL) != TIDE_SUCCESS)
            snprintf(err, len, "call %d: %s", k, tide_get_last_error());
        else
            memcpy(c->land_cpu[k][r], land, c->land_bytes);
    }
    tide_group_deregister(grp);
    return err[0] == 0;
}

/* ------------------------------------------------------------------ one rank process */

typedef struct {
    case_t *c;
    int r;
    cudaStream_t s;
    tide_group_t g, e; /* captured, eager */
    tide_comm_t comm;  /* for the capture diagnostic: the world's streams */
    void *shard, *grad[NP], *out, *out_e;
    char *err;
} rank_t;

#define CK(call, what) CPU_ORACLE_CK(call, what, 320)
#define CU(call, what) CPU_ORACLE_CU(call, what, 320)

/* Input set `set` into the operands, on the rank's stream. */
static bool upload(rank_t *k, int set) {
    case_t *c = k->c;
    const tide_geom_t *g = &c->plan->geom;
    CU(cudaMemcpyAsync(k->shard, c->shard[set][k->r], c->shard_bytes, cudaMemcpyHostToDevice, k->s),
       "upload shard");
    for (int q = 0; q < NP; ++q)
        CU(cudaMemcpyAsync(k->grad[q], c->grad[set][k->r][q],
                           g->params[q].dim0 * g->params[q].inner * 2, cudaMemcpyHostToDevice,
                           k->s),
           "upload grad");
    return true;
}

static bool calls(rank_t *k, tide_group_t grp, float *out) {
    CK(tide_all_gather(grp, k->shard, 0, k->s), "all_gather");
    CK(tide_reduce_scatter(grp, (const void *const *)k->grad, out, k->c->alpha, 0, TIDE_RS_IN_PLACE,
                           k->s),
       "reduce_scatter");
    return true;
}

static bool download(rank_t *k, tide_group_t grp, const float *out, uint8_t *land_to,
                     float *out_to) {
    void *land = NULL;
    CK(tide_group_landing(grp, 0, &land), "landing");
    CU(cudaMemcpyAsync(land_to, land, k->c->land_bytes, cudaMemcpyDeviceToHost, k->s),
       "download landing");
    CU(cudaMemcpyAsync(out_to, out, k->c->out_bytes, cudaMemcpyDeviceToHost, k->s), "download out");
    CU(cudaStreamSynchronize(k->s), "cudaStreamSynchronize");
    return true;
}

/* A call that must be refused with TIDE_ERR_UNSUPPORTED naming `why`. */
static bool refused(rank_t *k, tide_result_t res, const char *what, const char *why) {
    if (res == TIDE_ERR_UNSUPPORTED && strstr(tide_get_last_error(), why) != NULL) return true;
    snprintf(k->err, 320, "%s: %s, not refused for \"%s\": %s", what, tide_get_error_string(res),
             why, tide_get_last_error());
    return false;
}

/* tide_group_capture_readiness of the group's all-gather and reduce-scatter on k->s must
 * answer exactly `want` (the same verdict the calls then act on). */
static bool readiness(rank_t *k, uint32_t want, const char *what) {
    for (int c = 0; c < 2; ++c) {
        tide_capture_readiness_t v;
        const tide_call_kind_t call = c == 0 ? TIDE_CALL_ALL_GATHER : TIDE_CALL_REDUCE_SCATTER;
        CK(tide_group_capture_readiness(k->g, call, k->s, &v), "capture_readiness");
        if (v.blockers != want) {
            snprintf(k->err, 320, "%s: capture_readiness of the %s: 0x%x, expected 0x%x (%.160s)",
                     what, c == 0 ? "all-gather" : "reduce-scatter", v.blockers, want, v.reason);
            return false;
        }
    }
    return true;
}

/* The nodes the caller's capture frontier `front` depends on, itself included (a backward
 * walk over the captured graph); NULL when the walk fails. */
static cudaGraphNode_t *ancestors(const cudaGraphNode_t *front, size_t nf, size_t *n_out) {
    size_t cap = nf + 64, n = 0;
    cudaGraphNode_t *seen = malloc(cap * sizeof(*seen));
    if (seen == NULL) return NULL;
    for (size_t i = 0; i < nf; ++i)
        seen[n++] = front[i];
    for (size_t at = 0; at < n; ++at) { /* seen[] doubles as the walk's queue */
        size_t nd = 0;
        if (cudaGraphNodeGetDependencies(seen[at], NULL, NULL, &nd) != cudaSuccess) goto fail;
        if (nd == 0) continue;
        cudaGraphNode_t *deps = malloc(nd * sizeof(*deps));
        if (deps == NULL) goto fail;
        if (cudaGraphNodeGetDependencies(seen[at], deps, NULL, &nd) != cudaSuccess) {
            free(deps);
            goto fail;
        }
        for (size_t j = 0; j < nd; ++j) {
            bool have = false;
            for (size_t m = 0; m < n && !have; ++m)
                have = seen[m] == deps[j];
            if (have) continue;
            if (n == cap) {
                cudaGraphNode_t *more = realloc(seen, 2 * cap * sizeof(*seen));
                if (more == NULL) {
                    free(deps);
                    goto fail;
                }
                seen = more;
                cap *= 2;
            }
            seen[n++] = deps[j];
        }
        free(deps);
    }
    *n_out = n;
    return seen;
fail:
    (void)cudaGetLastError();
    free(seen);
    return NULL;
}

/* The world's streams in capture `cid` whose last captured work the caller's stream does not
 * depend on (names appended to buf): what cudaStreamEndCapture calls unjoined work. */
static void unjoined_streams(const rank_t *k, cudaStream_t caller, unsigned long long cid,
                             char *buf, size_t size) {
    if (k->comm == NULL || k->comm->world == NULL) return;
    const tide_mp_world_t *w = (const tide_mp_world_t *)k->comm->world;
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    const cudaGraphNode_t *front = NULL;
    size_t nf = 0, na = 0;
    if (cudaStreamGetCaptureInfo(caller, &st, NULL, NULL, &front, NULL, &nf) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    cudaGraphNode_t *anc = ancestors(front, nf, &na);
    if (anc == NULL) return;
    cudaStream_t streams[TIDE_CUDA_Q + 2];
    for (int q = 0; q < TIDE_CUDA_Q; ++q)
        streams[q] = w->stream[q];
    streams[TIDE_CUDA_Q] = w->util;
    streams[TIDE_CUDA_Q + 1] = w->rail_stream;
    size_t at = strlen(buf);
    for (int i = 0; i < TIDE_CUDA_Q + 2 && at + 24 < size; ++i) {
        const cudaGraphNode_t *last = NULL;
        unsigned long long id = 0;
        size_t nl = 0;
        if (streams[i] == NULL ||
            cudaStreamGetCaptureInfo(streams[i], &st, &id, NULL, &last, NULL, &nl) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        if (st == cudaStreamCaptureStatusNone || id != cid) continue;
        bool covered = true;
        for (size_t j = 0; j < nl && covered; ++j) {
            bool have = false;
            for (size_t m = 0; m < na && !have; ++m)
                have = anc[m] == last[j];
            covered = have;
        }
        if (covered) continue;
        if (i < TIDE_CUDA_Q)
            at += (size_t)snprintf(buf + at, size - at, " q%d", i);
        else
            at += (size_t)snprintf(buf + at, size - at, " %s", i == TIDE_CUDA_Q ? "util" : "rail");
    }
    free(anc);
}

static bool capture(rank_t *k, cudaGraph_t *graph, cudaGraphExec_t *exec) {
    CU(cudaStreamBeginCapture(k->s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    /* Warm now: the library says both calls would be captured, before and after the first. */
    bool ok = readiness(k, 0, "in the capture, before its calls");
    ok = ok && calls(k, k->g, k->out);
    ok = ok && readiness(k, 0, "in the capture, after its calls");
    /* The capture's state just before it ends, reported if the end fails: an invalidated
     * capture points at a refused operation inside the calls, an active one with the end
     * refused at work forked into the capture and never joined back. */
    enum cudaStreamCaptureStatus cst = cudaStreamCaptureStatusNone;
    unsigned long long cid = 0;
    cudaGraph_t cg = NULL;
    size_t ndeps = 0, nnodes = 0;
    const cudaError_t qe = cudaStreamGetCaptureInfo(k->s, &cst, &cid, &cg, NULL, NULL, &ndeps);
    if (qe == cudaSuccess && cg != NULL) (void)cudaGraphGetNodes(cg, NULL, &nnodes);
    char joined[96] = "";
    if (qe == cudaSuccess && cst != cudaStreamCaptureStatusNone)
        unjoined_streams(k, k->s, cid, joined, sizeof(joined));
    const cudaError_t e = cudaStreamEndCapture(k->s, graph);
    if (!ok) return false;
    if (e != cudaSuccess) {
        snprintf(k->err, 320,
                 "cudaStreamEndCapture: %s (before the end: query %s, status %s, capture %llu, "
                 "%zu nodes, caller stream depends on %zu; world streams left unjoined:%s)",
                 cudaGetErrorString(e), cudaGetErrorString(qe),
                 cst == cudaStreamCaptureStatusActive        ? "active"
                 : cst == cudaStreamCaptureStatusInvalidated ? "invalidated"
                                                             : "none",
                 cid, nnodes, ndeps, joined[0] != '\0' ? joined : " none");
        return false;
    }
    CU(cudaGraphInstantiate(exec, *graph, 0), "cudaGraphInstantiate");
    return true;
}

static bool setup(rank_t *k, const char *name, tide_comm_t *comm, bool eager_group) {
    case_t *c = k->c;
    const tide_geom_t *g = &c->plan->geom;
    CU(cudaSetDevice(0), "cudaSetDevice");
    CU(cudaStreamCreateWithFlags(&k->s, cudaStreamNonBlocking), "cudaStreamCreate");
    CK(tide_comm_init_rank(TIDE_FABRIC_CUDA, 1, c->n, k->r, name, comm), "comm_init_rank");
    k->comm = *comm;
    CK(tide_group_register(*comm, &c->cfg, &c->desc, &k->g), "register (captured group)");
    if (eager_group) CK(tide_group_register(*comm, &c->cfg, &c->desc, &k->e), "register (eager)");
    CU(cudaMalloc(&k->shard, c->shard_bytes), "cudaMalloc");
    for (int q = 0; q < NP; ++q)
        CU(cudaMalloc(&k->grad[q], g->params[q].dim0 * g->params[q].inner * 2), "cudaMalloc");
    CU(cudaMalloc(&k->out, c->out_bytes), "cudaMalloc");
    CU(cudaMalloc(&k->out_e, c->out_bytes), "cudaMalloc");
    /* A program's first call cannot be captured (it prepares device state). */
    cudaGraph_t graph = NULL;
    CU(cudaStreamBeginCapture(k->s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    /* Asked first: both programs are cold, nothing else blocks (the ipc transport). */
    const bool cold = readiness(k, TIDE_CAPTURE_PROGRAM_COLD, "before the first call");
    const tide_result_t res = tide_all_gather(k->g, k->shard, 0, k->s);
    const cudaError_t ce = cudaStreamEndCapture(k->s, &graph);
    if (graph != NULL) cudaGraphDestroy(graph);
    if (!cold) return false;
    if (!refused(k, res, "capturing the first all-gather", "first call of a program")) return false;
    CU(ce, "cudaStreamEndCapture (refused call)");
    /* Set 0 eagerly on the group that will be captured (prepares both programs). */
    if (!upload(k, 0) || !calls(k, k->g, k->out) ||
        !download(k, k->g, k->out, c->land[0][0][k->r], c->out[0][0][k->r]))
        return false;
    pthread_barrier_wait(c->bar); /* nobody's next call lands in a landing still read */
    return true;
}

static int child_main(case_t *c, int r, const char *name) {
    rank_t rk = {.c = c, .r = r, .err = c->err + r * 320}, *k = &rk;
    tide_comm_t comm = NULL;
    if (!setup(k, name, &comm, true)) return 1;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (!capture(k, &graph, &exec)) return 1;
    /* The captured family is replay-only now. */
    if (!refused(k, tide_all_gather(k->g, k->shard, 0, k->s), "an eager all-gather after capture",
                 "only be replayed"))
        return 1;
    for (int set = 1; set < SETS; ++set) {
        if (!upload(k, set)) return 1;
        if (cudaGraphLaunch(exec, k->s) != cudaSuccess) {
            snprintf(k->err, 320, "cudaGraphLaunch %d failed", set);
            return 1;
        }
        if (!calls(k, k->e, k->out_e)) return 1; /* the eager reference, same inputs */
        if (!download(k, k->g, k->out, c->land[0][set][r], c->out[0][set][r]) ||
            !download(k, k->e, k->out_e, c->land[1][set][r], c->out[1][set][r]))
            return 1;
        CK(tide_cuda_mp_sync(k->g->arena, TIDE_COLL_ALL_GATHER), "sync (captured AG)");
        CK(tide_cuda_mp_sync(k->g->arena, TIDE_COLL_REDUCE_SCATTER), "sync (captured RS)");
        pthread_barrier_wait(c->bar);
    }
    /* Back to back, no host wait: only the device counters and fences order the replays. */
    for (int i = 0; i < BURST; ++i)
        if (cudaGraphLaunch(exec, k->s) != cudaSuccess) {
            snprintf(k->err, 320, "cudaGraphLaunch (burst %d) failed", i);
            return 1;
        }
    if (!download(k, k->g, k->out, c->burst_land[r], c->burst_out[r])) return 1;
    CK(tide_cuda_mp_sync(k->g->arena, TIDE_COLL_ALL_GATHER), "sync after the burst (AG)");
    CK(tide_cuda_mp_sync(k->g->arena, TIDE_COLL_REDUCE_SCATTER), "sync after the burst (RS)");
    pthread_barrier_wait(c->bar);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    CK(tide_group_deregister(k->g), "deregister (captured)");
    CK(tide_group_deregister(k->e), "deregister (eager)");
    tide_comm_destroy(comm);
    fflush(stdout);
    return 0;
}

/* ------------------------------------------------------------------ replays, compared */

static bool same(const char *what, int n_ranks, int set, int r, const void *got, const void *want,
                 size_t bytes) {
    const long d = first_diff(got, want, bytes);
    if (d < 0) return true;
    printf("FAIL N=%d %s, set %d, rank %d: byte %ld of %zu differs\n", n_ranks, what, set, r, d,
           bytes);
    return false;
}

static int child_entry(void *c, int r, const char *name) { return child_main(c, r, name); }

static int replay_test(int n) {
    case_t *c = xmalloc(sizeof(*c));
    case_init(c, n);
    if (!cpu_oracle_run(1, c->n, cpu_rank, c, "oracle")) return 2;
    char name[64];
    snprintf(name, sizeof(name), "mpgraph%ld_%d", (long)getpid(), n);
    if (!cpu_oracle_fork(n, 120, child_entry, c, name, c->err, 320)) return 1;
    printf("ok   N=%d: capturing a program's first call and an eager call of a captured family "
           "are refused (TIDE_ERR_UNSUPPORTED)\n",
           n);
    int wrong = 0;
    for (int set = 0; set < SETS; ++set)
        for (int r = 0; r < n; ++r) {
            wrong += !same(set == 0 ? "AG (eager, before capture) vs CPU" : "AG replay vs CPU", n,
                           set, r, c->land[0][set][r], c->land_cpu[set][r], c->land_bytes);
            wrong += !same(set == 0 ? "RS (eager, before capture) vs CPU" : "RS replay vs CPU", n,
                           set, r, c->out[0][set][r], c->out_cpu[set][r], c->out_bytes);
            if (set == 0) continue;
            wrong += !same("AG replay vs eager", n, set, r, c->land[0][set][r], c->land[1][set][r],
                           c->land_bytes);
            wrong += !same("RS replay vs eager", n, set, r, c->out[0][set][r], c->out[1][set][r],
                           c->out_bytes);
            wrong += !same("AG eager group vs CPU", n, set, r, c->land[1][set][r],
                           c->land_cpu[set][r], c->land_bytes);
            wrong += !same("RS eager group vs CPU", n, set, r, c->out[1][set][r],
                           c->out_cpu[set][r], c->out_bytes);
        }
    printf("%s N=%d: %d replays of a captured AG + RS (In-Place) with fresh inputs, bit for bit "
           "with eager calls and the CPU fabric (%d mismatches)\n",
           wrong == 0 ? "ok  " : "FAIL", n, REPLAYS, wrong);
    int bwrong = 0;
    for (int r = 0; r < n; ++r) {
        bwrong += !same("AG after the burst vs CPU", n, REPLAYS, r, c->burst_land[r],
                        c->land_cpu[REPLAYS][r], c->land_bytes);
        bwrong += !same("RS after the burst vs CPU", n, REPLAYS, r, c->burst_out[r],
                        c->out_cpu[REPLAYS][r], c->out_bytes);
    }
    printf("%s N=%d: %d replays back to back (no host wait between them), the last one bit for "
           "bit with the CPU fabric\n",
           bwrong == 0 ? "ok  " : "FAIL", n, BURST);
    return wrong == 0 && bwrong == 0 ? 0 : 1;
}

/* ------------------------------------------------------------------ a killed rank */

static int kill_child(case_t *c, int r, const char *name, int victim) {
    rank_t rk = {.c = c, .r = r, .err = c->err + r * 320}, *k = &rk;
    tide_comm_t comm = NULL;
    c->result[r] = -1;
    if (!setup(k, name, &comm, false)) return 1;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (!capture(k, &graph, &exec)) return 1;
    tide_result_t res = TIDE_SUCCESS;
    for (int i = 0; i < 10 && res == TIDE_SUCCESS; ++i) {
        if (r == victim && i == 3) {
            *c->killed_at = now_s();
            raise(SIGKILL);
        }
        if (cudaGraphLaunch(exec, k->s) != cudaSuccess) {
            snprintf(k->err, 320, "cudaGraphLaunch %d failed", i);
            return 1;
        }
        /* Returns: every device wait of the replay is bounded by TIDE_TIMEOUT_MS. */
        const cudaError_t ce = cudaStreamSynchronize(k->s);
        if (ce != cudaSuccess) {
            snprintf(k->err, 320, "cudaStreamSynchronize after replay %d: %s", i,
                     cudaGetErrorString(ce));
            return 1;
        }
        res = tide_cuda_mp_sync(k->g->arena, TIDE_COLL_ALL_GATHER);
        if (res == TIDE_SUCCESS) res = tide_cuda_mp_sync(k->g->arena, TIDE_COLL_REDUCE_SCATTER);
        if (res == TIDE_SUCCESS && i < 3) pthread_barrier_wait(c->bar);
    }
    c->failed_at[r] = now_s();
    c->result[r] = (int)res;
    snprintf(k->err, 320, "%s",
             res == TIDE_SUCCESS ? "every replay after the kill succeeded" : tide_get_last_error());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    tide_group_deregister(k->g); /* releases everything, without hanging */
    tide_comm_destroy(comm);
    return 0;
}

static int kill_test(void) {
    const int n = 4, victim = 2;
    char tmo[16];
    snprintf(tmo, sizeof(tmo), "%d", KILL_TIMEOUT_MS);
    setenv("TIDE_TIMEOUT_MS", tmo, 1);
    case_t *c = xmalloc(sizeof(*c));
    case_init(c, n);
    char name[64];
    snprintf(name, sizeof(name), "mpgraphkill%ld", (long)getpid());
    pid_t pids[MAX_RANKS];
    for (int r = 0; r < n; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) {
            alarm(60);
            _exit(kill_child(c, r, name, victim));
        }
    }
    bool ok = true;
    const double bound = KILL_TIMEOUT_MS / 1000.0 + 2.0;
    for (int r = 0; r < n; ++r) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (r == victim) {
            const bool good = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
            printf("%s rank %d: killed between two replays\n", good ? "ok  " : "FAIL", r);
            ok = ok && good;
            continue;
        }
        const double after = c->failed_at[r] - *c->killed_at;
        const bool good = WIFEXITED(st) && WEXITSTATUS(st) == 0 &&
                          c->result[r] == TIDE_ERR_TIMEOUT && *c->killed_at > 0 && after < bound;
        printf("%s rank %d: %s %.3f s after the kill (bound %.1f s): %s\n", good ? "ok  " : "FAIL",
               r, c->result[r] >= 0 ? tide_get_error_string((tide_result_t)c->result[r]) : "-",
               after, bound, c->err + r * 320);
        ok = ok && good;
    }
    printf("%s: a rank killed between replays of a captured AG + RS; survivors fail within "
           "TIDE_TIMEOUT_MS + 2 s\n",
           ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    int only = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--kill") == 0) return kill_test();
        if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) only = atoi(argv[++i]);
    }
    const int worst = cpu_oracle_worlds(only, MAX_RANKS, replay_test);
    printf("%s\n", worst == 0 ? "PASS: captured TIDE-AG / TIDE-RS replays on the one-process-per-"
                                "rank CUDA fabric"
                              : "FAIL");
    return worst;
}
