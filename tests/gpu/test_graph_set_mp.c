/*
 * test_graph_set_mp.c - the calls of a shared-arena set (tide_groups_register: what tide.fsdp
 * registers) captured into ONE CUDA graph on the one-process-per-rank CUDA fabric and
 * replayed, cross-group fences included (src/fabric/cuda/mp_graph.c, "Views of a set";
 * docs/cuda-fabric.md, "CUDA graphs across processes").
 *
 *   test_graph_set_mp [--ranks N]   N = 2 and 4 by default.  A set of three groups of
 *                                   different shapes: A and B share ring slot 0, C (slot 1)
 *                                   is never called before the capture.  One round is
 *                                   FSDP2's order for A and B:
 *                                     AG A, reshard A, AG B (fence: slot 0 was A's),
 *                                     RS B (fence: the RS regions were A's), reshard B,
 *                                     AG A (fence: slot 0 was B's), RS A (fence), reshard A
 *                                   all-gathers on one stream, reduce-scatters (In-Place) on
 *                                   another, as FSDP2 does; each landing is copied out on the
 *                                   all-gather stream right after its call (captured too).
 *                                   Two eager rounds (the second is the first in which B's
 *                                   reduce-scatter needs a fence: every fence variant of
 *                                   every view must have run once outside the capture), then
 *                                   one round captured into one graph (the RS stream forked
 *                                   into the capture), replayed REPLAYS times with fresh
 *                                   inputs (wide exponents); an eager set makes the same
 *                                   round on the same inputs; every landing and output is
 *                                   compared bit for bit with it and with the CPU fabric.
 *                                   Then BURST replays back to back.  Then the refusals
 *                                   (TIDE_ERR_UNSUPPORTED, nothing enqueued): an eager call
 *                                   of a captured family (AG A), of a never-called group of
 *                                   the set (AG C: the set is replay-only as a whole), one
 *                                   that needs an eager fence (AG B), and, in a second
 *                                   capture, a call whose fence would wait on siblings of
 *                                   the first graph (AG B; tide_group_capture_readiness
 *                                   asked before it must say TIDE_CAPTURE_OTHER_GRAPH, and
 *                                   nothing else).  One more replay after them must
 *                                   still match the CPU fabric (the set stays usable).
 *
 * The parent never touches CUDA: it draws every input, runs the CPU fabric (a thread per
 * rank) as the oracle, forks the N ranks, and compares what they wrote to shared memory.
 * Exit status 0 all passed, 1 a failure, 2 a setup failure.
 */
#include "api/comm.h"
#include "fabric/cuda/mp.h"
#include "kernels/kernels.h"
#include "plan/plan.h"
#include "tide.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define REPLAYS 20
#define WARM 2                /* eager rounds before the capture */
#define SETS (WARM + REPLAYS) /* input sets: WARM eager rounds, then one per replay */
#define BURST 10
#define MAX_RANKS 8
#define NG 3 /* groups of the set: A, B, C */
#define NC 2 /* groups the round calls: A, B */
#define MAXP 3
#define NL 3 /* landings copied out per round: A, B, A again */

#define HOST_RAND_SEED 0x5eed5e7a11ull
#define HOST_RAND_WIDE_EXP 12
#include "host_rand.h"

#include "cpu_oracle.h"


/* One round's results of one rank: the three landings and the two outputs. */
typedef struct {
    uint8_t *land[NL];
    float *out[NC];
} res_t;

typedef struct {
    int n;
    tide_config_t cfg;
    int np[NG];
    tide_param_shape_t shapes[NG][MAXP];
    tide_group_desc_t desc[NG];
    tide_group_entry_t entries[NG];
    tide_plan_t plan[NG];
    float alpha;
    size_t shard_bytes[NG], land_bytes[NG], out_bytes[NG], grad_bytes[NG][MAXP];
    uint8_t *shard[SETS][MAX_RANKS][NC];
    void *grad[SETS][MAX_RANKS][NC][MAXP];
    res_t cpu[SETS][MAX_RANKS];
    /* Shared with the ranks.  [0]: the captured set (the WARM eager rounds, then replay k),
     * [1]: the eager set (replay sets only). */
    res_t gpu[2][SETS][MAX_RANKS];
    res_t burst[MAX_RANKS], after[MAX_RANKS];
    char *err;              /* [MAX_RANKS][400] */
    int *fences;            /* [MAX_RANKS]: cross-group fences of the captured round */
    pthread_barrier_t *bar; /* process-shared */
} case_t;

/* Which group's landing each of the NL copies is. */
static const int land_group[NL] = {0, 1, 0};

static void res_alloc(const case_t *c, res_t *r, bool shared) {
    for (int l = 0; l < NL; ++l) {
        const size_t b = c->land_bytes[land_group[l]];
        r->land[l] = shared ? shared_alloc(b) : xmalloc(b);
    }
    for (int i = 0; i < NC; ++i)
        r->out[i] = shared ? shared_alloc(c->out_bytes[i]) : xmalloc(c->out_bytes[i]);
}

static void case_init(case_t *c, int n) {
    memset(c, 0, sizeof(*c));
    c->n = n;
    const tide_param_shape_t shapes[NG][MAXP] = {
        {{33, 17}, {8, 5}, {64, 3}}, {{40, 9}, {7, 11}, {0, 0}}, {{16, 4}, {0, 0}, {0, 0}}};
    const int np[NG] = {3, 2, 1};
    const int slot[NG] = {0, 0, 1};
    static const char *const names[NG] = {"A", "B", "C"};
    memcpy(c->shapes, shapes, sizeof(shapes));
    memcpy(c->np, np, sizeof(np));
    c->cfg = (tide_config_t)TIDE_CONFIG_INIT;
    c->cfg.nodes = 1;
    c->cfg.gpus_per_node = n;
    c->alpha = tide_alpha_avg(n);
    for (int i = 0; i < NG; ++i) {
        c->desc[i] = (tide_group_desc_t){c->np[i], c->shapes[i], TIDE_DTYPE_BF16, TIDE_DTYPE_BF16,
                                         TIDE_DTYPE_BF16};
        c->entries[i] = (tide_group_entry_t){&c->cfg, &c->desc[i], slot[i], names[i]};
        if (tide_plan_create(&c->cfg, &c->desc[i], &c->plan[i]) != TIDE_SUCCESS) {
            fprintf(stderr, "FAIL: plan: %s\n", tide_get_last_error());
            exit(2);
        }
        const tide_geom_t *g = &c->plan[i]->geom;
        c->shard_bytes[i] = g->shard_bytes;
        c->land_bytes[i] = g->group_bytes;
        c->out_bytes[i] = g->fp32_shard_bytes;
        for (int q = 0; q < c->np[i]; ++q)
            c->grad_bytes[i][q] = g->params[q].dim0 * g->params[q].inner * 2;
    }
    for (int k = 0; k < SETS; ++k)
        for (int r = 0; r < n; ++r) {
            for (int i = 0; i < NC; ++i) {
                c->shard[k][r][i] = xmalloc(c->shard_bytes[i]);
                for (size_t e = 0; e < c->shard_bytes[i] / 2; ++e)
                    ((uint16_t *)c->shard[k][r][i])[e] = tide_float_to_bf16(rnd_wide());
                for (int q = 0; q < c->np[i]; ++q) {
                    c->grad[k][r][i][q] = xmalloc(c->grad_bytes[i][q]);
                    for (size_t e = 0; e < c->grad_bytes[i][q] / 2; ++e)
                        ((uint16_t *)c->grad[k][r][i][q])[e] = tide_float_to_bf16(rnd_wide());
                }
            }
            res_alloc(c, &c->cpu[k][r], false);
            res_alloc(c, &c->gpu[0][k][r], true);
            res_alloc(c, &c->gpu[1][k][r], true);
        }
    for (int r = 0; r < n; ++r) {
        res_alloc(c, &c->burst[r], true);
        res_alloc(c, &c->after[r], true);
    }
    c->err = shared_alloc(MAX_RANKS * 400);
    c->fences = shared_alloc(MAX_RANKS * sizeof(int));
    c->bar = shared_alloc(sizeof(pthread_barrier_t));
    pthread_barrierattr_t at;
    pthread_barrierattr_init(&at);
    pthread_barrierattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    if (pthread_barrier_init(c->bar, &at, (unsigned)n) != 0) exit(2);
    pthread_barrierattr_destroy(&at);
}

/* ------------------------------------------------------------------ the CPU fabric (oracle) */

/* One oracle rank: its case and rank, and where a failure is described. */
typedef struct {
    case_t *c;
    int rank;
    char *error;
    size_t len;
} cpu_job_t;

#define CPU_TRY(call, what)                                                                        \
    do {                                                                                           \
        if ((call) != TIDE_SUCCESS) {                                                              \
            snprintf(j->error, j->len, "set %d, %s: %s", k, what,                        \
                     tide_get_last_error());                                                       \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

static bool cpu_gather(cpu_job_t *j, tide_group_t *gs, int k, int i, int l) {
    case_t *c = j->c;
    void *land = NULL;
    CPU_TRY(tide_all_gather(gs[i], c->shard[k][j->rank][i], 0, NULL), "all_gather");
    CPU_TRY(tide_group_landing(gs[i], 0, &land), "landing");
    memcpy(c->cpu[k][j->rank].land[l], land, c->land_bytes[i]);
    return true;
}

static bool cpu_round(cpu_job_t *j, tide_group_t *gs, int k) {
    case_t *c = j->c;
    const int r = j->rank;
    if (!cpu_gather(j, gs, k, 0, 0)) return false;
    CPU_TRY(tide_group_reshard(gs[0]), "reshard A");
    if (!cpu_gather(j, gs, k, 1, 1)) return false;
    CPU_TRY(tide_reduce_scatter(gs[1], (const void *const *)c->grad[k][r][1], c->cpu[k][r].out[1],
                                c->alpha, 0, TIDE_RS_IN_PLACE, NULL),
            "reduce_scatter B");
    CPU_TRY(tide_group_reshard(gs[1]), "reshard B");
    if (!cpu_gather(j, gs, k, 0, 2)) return false;
    CPU_TRY(tide_reduce_scatter(gs[0], (const void *const *)c->grad[k][r][0], c->cpu[k][r].out[0],
                                c->alpha, 0, TIDE_RS_IN_PLACE, NULL),
            "reduce_scatter A");
    CPU_TRY(tide_group_reshard(gs[0]), "reshard A");
    return true;
}

static bool cpu_rank(void *ctx, tide_comm_t comm, int rank, char *err, size_t len) {
    cpu_job_t job = {.c = ctx, .rank = rank, .error = err, .len = len}, *j = &job;
    tide_group_t gs[NG];
    if (tide_groups_register(comm, NG, j->c->entries, gs) != TIDE_SUCCESS) {
        snprintf(err, len, "groups_register: %s", tide_get_last_error());
        return false;
    }
    bool ok = true;
    for (int k = 0; k < SETS && ok; ++k)
        ok = cpu_round(j, gs, k);
    for (int i = 0; i < NG; ++i)
        tide_group_deregister(gs[i]);
    return ok;
}

static bool run_cpu(case_t *c) { return cpu_oracle_run(1, c->n, cpu_rank, c, "oracle"); }

/* ------------------------------------------------------------------ one rank process */

/* A set's device buffers: each landing's copy (written on the all-gather stream right after
 * its call) and the outputs. */
typedef struct {
    tide_group_t g[NG];
    void *land[NL];
    float *out[NC];
} dev_set_t;

typedef struct {
    case_t *c;
    int r;
    cudaStream_t ag, rs;
    dev_set_t set[2]; /* [0] captured, [1] eager */
    void *shard[NC], *grad[NC][MAXP];
    char *err;
} rank_t;

#define CK(call, what) CPU_ORACLE_CK(call, what, 400)
#define CU(call, what) CPU_ORACLE_CU(call, what, 400)

/* Input set `set` into the operands; returns once they are on the device (both streams'
 * later work then reads them). */
static bool upload(rank_t *k, int set) {
    case_t *c = k->c;
    for (int i = 0; i < NC; ++i) {
        CU(cudaMemcpyAsync(k->shard[i], c->shard[set][k->r][i], c->shard_bytes[i],
                           cudaMemcpyHostToDevice, k->ag),
           "upload shard");
        for (int q = 0; q < c->np[i]; ++q)
            CU(cudaMemcpyAsync(k->grad[i][q], c->grad[set][k->r][i][q], c->grad_bytes[i][q],
                               cudaMemcpyHostToDevice, k->ag),
               "upload grad");
    }
    CU(cudaStreamSynchronize(k->ag), "cudaStreamSynchronize(upload)");
    return true;
}

static bool gather(rank_t *k, dev_set_t *s, int i, int l) {
    void *land = NULL;
    CK(tide_all_gather(s->g[i], k->shard[i], 0, k->ag), l == 1 ? "all_gather B" : "all_gather A");
    CK(tide_group_landing(s->g[i], 0, &land), "landing");
    CU(cudaMemcpyAsync(s->land[l], land, k->c->land_bytes[i], cudaMemcpyDeviceToDevice, k->ag),
       "copy the landing");
    return true;
}

static bool scatter(rank_t *k, dev_set_t *s, int i) {
    CK(tide_reduce_scatter(s->g[i], (const void *const *)k->grad[i], s->out[i], k->c->alpha, 0,
                           TIDE_RS_IN_PLACE, k->rs),
       i == 1 ? "reduce_scatter B" : "reduce_scatter A");
    return true;
}

/* FSDP2's order for A and B (the top of the file). */
static bool round_calls(rank_t *k, dev_set_t *s) {
    if (!gather(k, s, 0, 0)) return false;
    CK(tide_group_reshard(s->g[0]), "reshard A");
    if (!gather(k, s, 1, 1) || !scatter(k, s, 1)) return false;
    CK(tide_group_reshard(s->g[1]), "reshard B");
    if (!gather(k, s, 0, 2) || !scatter(k, s, 0)) return false;
    CK(tide_group_reshard(s->g[0]), "reshard A");
    return true;
}

static bool download(rank_t *k, const dev_set_t *s, res_t *to) {
    case_t *c = k->c;
    CU(cudaStreamSynchronize(k->ag), "cudaStreamSynchronize(ag)");
    CU(cudaStreamSynchronize(k->rs), "cudaStreamSynchronize(rs)");
    for (int l = 0; l < NL; ++l)
        CU(cudaMemcpy(to->land[l], s->land[l], c->land_bytes[land_group[l]],
                      cudaMemcpyDeviceToHost),
           "download landing");
    for (int i = 0; i < NC; ++i)
        CU(cudaMemcpy(to->out[i], s->out[i], c->out_bytes[i], cudaMemcpyDeviceToHost),
           "download output");
    return true;
}

/* A call that must be refused with TIDE_ERR_UNSUPPORTED naming `why`. */
static bool refused(rank_t *k, tide_result_t res, const char *what, const char *why) {
    if (res == TIDE_ERR_UNSUPPORTED && strstr(tide_get_last_error(), why) != NULL) return true;
    snprintf(k->err, 400, "%s: %s, not refused for \"%s\": %s", what, tide_get_error_string(res),
             why, tide_get_last_error());
    return false;
}

/* One round captured on the all-gather stream, the reduce-scatter stream forked into it. */
static bool capture(rank_t *k, cudaGraph_t *graph, cudaGraphExec_t *exec) {
    cudaEvent_t fork_ev = NULL, join_ev = NULL;
    CU(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming), "cudaEventCreate");
    CU(cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming), "cudaEventCreate");
    CU(cudaStreamBeginCapture(k->ag, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    bool ok = cudaEventRecord(fork_ev, k->ag) == cudaSuccess &&
              cudaStreamWaitEvent(k->rs, fork_ev, 0) == cudaSuccess;
    if (!ok) snprintf(k->err, 400, "forking the RS stream into the capture failed");
    ok = ok && round_calls(k, &k->set[0]);
    /* Joined back whatever happened, so that the capture can end. */
    (void)cudaEventRecord(join_ev, k->rs);
    (void)cudaStreamWaitEvent(k->ag, join_ev, 0);
    const cudaError_t e = cudaStreamEndCapture(k->ag, graph);
    cudaEventDestroy(fork_ev);
    cudaEventDestroy(join_ev);
    if (!ok) return false;
    CU(e, "cudaStreamEndCapture");
    CU(cudaGraphInstantiate(exec, *graph, 0), "cudaGraphInstantiate");
    return true;
}

static bool setup(rank_t *k, const char *name, tide_comm_t *comm) {
    case_t *c = k->c;
    CU(cudaSetDevice(0), "cudaSetDevice");
    CU(cudaStreamCreateWithFlags(&k->ag, cudaStreamNonBlocking), "cudaStreamCreate");
    CU(cudaStreamCreateWithFlags(&k->rs, cudaStreamNonBlocking), "cudaStreamCreate");
    CK(tide_comm_init_rank(TIDE_FABRIC_CUDA, 1, c->n, k->r, name, comm), "comm_init_rank");
    for (int v = 0; v < 2; ++v) {
        CK(tide_groups_register(*comm, NG, c->entries, k->set[v].g),
           v == 0 ? "groups_register (captured set)" : "groups_register (eager set)");
        for (int l = 0; l < NL; ++l)
            CU(cudaMalloc(&k->set[v].land[l], c->land_bytes[land_group[l]]), "cudaMalloc");
        for (int i = 0; i < NC; ++i)
            CU(cudaMalloc((void **)&k->set[v].out[i], c->out_bytes[i]), "cudaMalloc");
    }
    for (int i = 0; i < NC; ++i) {
        CU(cudaMalloc(&k->shard[i], c->shard_bytes[i]), "cudaMalloc");
        for (int q = 0; q < c->np[i]; ++q)
            CU(cudaMalloc(&k->grad[i][q], c->grad_bytes[i][q]), "cudaMalloc");
    }
    /* The eager rounds before the capture, on the set that will be captured. */
    for (int set = 0; set < WARM; ++set) {
        if (!upload(k, set) || !round_calls(k, &k->set[0]) ||
            !download(k, &k->set[0], &c->gpu[0][set][k->r]))
            return false;
        pthread_barrier_wait(c->bar);
    }
    return true;
}

/* The refusals after the capture; nothing of them may be enqueued. */
static bool refusals(rank_t *k) {
    dev_set_t *s = &k->set[0];
    if (!refused(k, tide_all_gather(s->g[0], k->shard[0], 0, k->ag),
                 "an eager all-gather of a captured group", "only be replayed"))
        return false;
    /* C was never called: refused because its set was captured. */
    void *c_shard = NULL;
    CU(cudaMalloc(&c_shard, k->c->shard_bytes[2]), "cudaMalloc");
    const tide_result_t rc = tide_all_gather(s->g[2], c_shard, 0, k->ag);
    cudaFree(c_shard);
    if (!refused(k, rc, "an eager all-gather of a group of a captured set", "set were captured"))
        return false;
    /* Slot 0 was A's last: B's all-gather needs a fence, which is refused eagerly. */
    if (!refused(k, tide_all_gather(s->g[1], k->shard[1], 0, k->ag),
                 "an eager all-gather that needs a cross-group fence", "cross-group fence"))
        return false;
    /* The same call in a second capture: its fence would wait on A's calls of the first. */
    cudaGraph_t g2 = NULL;
    CU(cudaStreamBeginCapture(k->ag, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture (2)");
    /* Asked first (tide_group_capture_readiness): the same verdict, nothing else blocks. */
    tide_capture_readiness_t v;
    const tide_result_t q = tide_group_capture_readiness(s->g[1], TIDE_CALL_ALL_GATHER, k->ag, &v);
    const tide_result_t r2 = tide_all_gather(s->g[1], k->shard[1], 0, k->ag);
    const cudaError_t e2 = cudaStreamEndCapture(k->ag, &g2);
    if (g2 != NULL) cudaGraphDestroy(g2);
    if (q != TIDE_SUCCESS || v.blockers != TIDE_CAPTURE_OTHER_GRAPH ||
        strstr(v.reason, "captured in one graph") == NULL) {
        snprintf(k->err, 400, "capture_readiness of a fence in a second capture: %s, 0x%x (%.200s)",
                 tide_get_error_string(q), q == TIDE_SUCCESS ? v.blockers : 0u,
                 q == TIDE_SUCCESS ? v.reason : tide_get_last_error());
        return false;
    }
    if (!refused(k, r2, "a fence in a second capture", "captured in one graph")) return false;
    CU(e2, "cudaStreamEndCapture (refused call)");
    return true;
}

static int child_main(case_t *c, int r, const char *name) {
    rank_t rk = {.c = c, .r = r, .err = c->err + r * 400}, *k = &rk;
    tide_comm_t comm = NULL;
    if (!setup(k, name, &comm)) return 1;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    uint64_t before[NC];
    for (int i = 0; i < NC; ++i)
        before[i] = k->set[0].g[i]->fences;
    if (!capture(k, &graph, &exec)) return 1;
    /* Each of A and B ran a fence inside the capture, or the test does not test them. */
    for (int i = 0; i < NC; ++i) {
        if (k->set[0].g[i]->fences == before[i]) {
            snprintf(k->err, 400, "no cross-group fence of group %s in the captured round",
                     i == 0 ? "A" : "B");
            return 1;
        }
        c->fences[r] += (int)(k->set[0].g[i]->fences - before[i]);
    }
    for (int set = WARM; set < SETS; ++set) {
        if (!upload(k, set)) return 1;
        if (cudaGraphLaunch(exec, k->ag) != cudaSuccess) {
            snprintf(k->err, 400, "cudaGraphLaunch (set %d) failed", set);
            return 1;
        }
        if (!round_calls(k, &k->set[1])) return 1; /* the eager reference, same inputs */
        if (!download(k, &k->set[0], &c->gpu[0][set][r]) ||
            !download(k, &k->set[1], &c->gpu[1][set][r]))
            return 1;
        for (int i = 0; i < NC; ++i) {
            CK(tide_cuda_mp_sync(k->set[0].g[i]->arena, TIDE_COLL_ALL_GATHER), "sync (AG)");
            CK(tide_cuda_mp_sync(k->set[0].g[i]->arena, TIDE_COLL_REDUCE_SCATTER), "sync (RS)");
        }
        pthread_barrier_wait(c->bar);
    }
    /* Back to back, no host wait: only the device counters, fences and edges order them. */
    for (int i = 0; i < BURST; ++i)
        if (cudaGraphLaunch(exec, k->ag) != cudaSuccess) {
            snprintf(k->err, 400, "cudaGraphLaunch (burst %d) failed", i);
            return 1;
        }
    if (!download(k, &k->set[0], &c->burst[r])) return 1;
    pthread_barrier_wait(c->bar);
    if (!refusals(k)) return 1;
    pthread_barrier_wait(c->bar);
    /* The set is still usable: one more replay (the last set's inputs are still there). */
    if (cudaGraphLaunch(exec, k->ag) != cudaSuccess) {
        snprintf(k->err, 400, "cudaGraphLaunch after the refusals failed");
        return 1;
    }
    if (!download(k, &k->set[0], &c->after[r])) return 1;
    for (int i = 0; i < NC; ++i)
        CK(tide_cuda_mp_sync(k->set[0].g[i]->arena, TIDE_COLL_REDUCE_SCATTER), "sync (last)");
    pthread_barrier_wait(c->bar);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    for (int v = 0; v < 2; ++v)
        for (int i = 0; i < NG; ++i)
            CK(tide_group_deregister(k->set[v].g[i]), "deregister");
    tide_comm_destroy(comm);
    fflush(stdout);
    return 0;
}

/* ------------------------------------------------------------------ compared */


static const char *const land_name[NL] = {"AG A (forward)", "AG B", "AG A (backward)"};
static const char *const out_name[NC] = {"RS A", "RS B"};

/* Every landing and output of `got` against `want`; the mismatches. */
static int compare(const case_t *c, const char *what, int set, int r, const res_t *got,
                   const res_t *want) {
    int wrong = 0;
    for (int l = 0; l < NL; ++l) {
        const size_t b = c->land_bytes[land_group[l]];
        const long d = first_diff(got->land[l], want->land[l], b);
        if (d < 0) continue;
        printf("FAIL N=%d %s, %s, set %d, rank %d: byte %ld of %zu differs\n", c->n, what,
               land_name[l], set, r, d, b);
        ++wrong;
    }
    for (int i = 0; i < NC; ++i) {
        const long d = first_diff(got->out[i], want->out[i], c->out_bytes[i]);
        if (d < 0) continue;
        printf("FAIL N=%d %s, %s, set %d, rank %d: byte %ld of %zu differs\n", c->n, what,
               out_name[i], set, r, d, c->out_bytes[i]);
        ++wrong;
    }
    return wrong;
}

static int child_entry(void *c, int r, const char *name) { return child_main(c, r, name); }

static int replay_test(int n) {
    case_t *c = xmalloc(sizeof(*c));
    case_init(c, n);
    if (!run_cpu(c)) return 2;
    char name[64];
    snprintf(name, sizeof(name), "mpgset%ld_%d", (long)getpid(), n);
    if (!cpu_oracle_fork(n, 180, child_entry, c, name, c->err, 400)) return 1;
    printf("ok   N=%d: %d cross-group fences captured per round (rank 0)\n", n, c->fences[0]);
    printf("ok   N=%d: eager calls of a captured set (a captured group, a group never called, "
           "an eager fence) and a fence in a second capture are refused (TIDE_ERR_UNSUPPORTED)\n",
           n);
    int wrong = 0;
    for (int set = 0; set < SETS; ++set)
        for (int r = 0; r < n; ++r) {
            if (set < WARM) {
                wrong += compare(c, "eager round before capture vs CPU", set, r, &c->gpu[0][set][r],
                                 &c->cpu[set][r]);
                continue;
            }
            wrong += compare(c, "replay vs CPU", set, r, &c->gpu[0][set][r], &c->cpu[set][r]);
            wrong +=
                compare(c, "replay vs eager set", set, r, &c->gpu[0][set][r], &c->gpu[1][set][r]);
            wrong += compare(c, "eager set vs CPU", set, r, &c->gpu[1][set][r], &c->cpu[set][r]);
        }
    printf("%s N=%d: %d replays of one graph holding a set's round (3 AG + 2 RS In-Place of two "
           "groups, 4 cross-group fences) with fresh inputs, bit for bit with an eager set and "
           "the CPU fabric (%d mismatches)\n",
           wrong == 0 ? "ok  " : "FAIL", n, REPLAYS, wrong);
    int bwrong = 0, awrong = 0;
    for (int r = 0; r < n; ++r) {
        bwrong +=
            compare(c, "after the burst vs CPU", SETS - 1, r, &c->burst[r], &c->cpu[SETS - 1][r]);
        awrong += compare(c, "replay after the refusals vs CPU", SETS - 1, r, &c->after[r],
                          &c->cpu[SETS - 1][r]);
    }
    printf("%s N=%d: %d replays back to back, the last one bit for bit with the CPU fabric\n",
           bwrong == 0 ? "ok  " : "FAIL", n, BURST);
    printf("%s N=%d: a replay after the refusals, bit for bit with the CPU fabric\n",
           awrong == 0 ? "ok  " : "FAIL", n);
    return wrong == 0 && bwrong == 0 && awrong == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    int only = 0;
    for (int i = 1; i < argc; ++i)
        if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc) only = atoi(argv[++i]);
    const int worst = cpu_oracle_worlds(only, MAX_RANKS, replay_test);
    printf("%s\n", worst == 0 ? "PASS: a shared-arena set captured into one CUDA graph on the "
                                "one-process-per-rank CUDA fabric"
                              : "FAIL");
    return worst;
}
