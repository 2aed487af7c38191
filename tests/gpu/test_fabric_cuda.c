/*
 * test_fabric_cuda.c - the CUDA fabric against the CPU fabric, bit for bit (GPU machine).
 *
 * Every case registers one random group (P params, D_p often not divisible by N, so shards
 * carry padding rows) on an M x L topology that fits on the visible GPUs as virtual ranks,
 * runs three all-gathers (slots 0, 1, 0) and three reduce-scatters (a mode sequence that
 * switches modes, accumulate on and off, a case-specific alpha) on the CPU fabric (one thread
 * per rank) and on the CUDA fabric (one thread driving all ranks, calls enqueued back to
 * back without host synchronisation, outputs copied back on each rank's stream after each
 * call), and compares every AG landing and every RS output of every rank and call with
 * memcmp.  Every case runs the CUDA fabric three times against one CPU run: with batched
 * copies and no size threshold (TIDE_CUDA_BATCH=1, TIDE_CUDA_BATCH_MAX_BYTES=0: runs of
 * same-device copies as one kernel), with a size threshold (TIDE_CUDA_BATCH_MAX_BYTES = the
 * median of the distinct copy sizes of the case's programs, so that copies at or above it go
 * per op and the smaller ones still batch, both inside one call), and per op
 * (TIDE_CUDA_BATCH=0: one cudaMemcpyAsync per copy).  The test's shapes are tiny (copies of
 * a few to a few hundred bytes), so a fixed threshold such as 4 KiB would split nothing.  One
 * line per case and mode: PASS, or FAIL with the first differing byte.  The threshold mode
 * must, over all cases, issue copies per op because of the threshold in a call that also
 * ran batches.
 *
 * Then a host-enqueue figure: the median host time of one call of all ranks (every rank's
 * tide_all_gather / tide_reduce_scatter; the last one enqueues the whole call) at P = 30,
 * M = 8, L = 1, with the descriptors, event waits and records of that call.  On one GPU the
 * copies run as SM kernels (same-device copies do not use copy engines).  All three modes
 * are timed, the threshold mode at the median copy size of that group (its per-rank copies
 * are 256 B to 64 KiB); the batched mode must run batches.
 *
 * --matrix walks the configuration space of tests/unit/test_matrix.c instead (the CPU
 * configuration matrix): topologies M in {1, 2, 3, 4, 5, 8, 9} x L in {1, 2, 4, 8} (up to 72
 * virtual ranks), random padded shapes, P up to 256, bf16 and fp32 gradients, integer-valued
 * gradients, the alpha forms (AVG, PREMUL_SUM, FSDP2's divide factors), accumulate, both RS
 * modes, W_wave < L with several waves, mixed-precision all-gather, resident shards and the
 * tuning-knob variants (tests/unit/matrix_gen.h); the data-set loop mirrors test_matrix.c's,
 * drawing from this program's own random stream: the same space, not the same draws.
 * Every configuration runs on the CPU fabric and on the CUDA fabric with batched copies and
 * with the threshold mode; the configurations with default knobs also run per op.
 * Configurations whose arenas and inputs do not fit in free GPU memory (cudaMemGetInfo) are
 * skipped and listed; topologies run in order of rank count until --max-seconds (default 240)
 * is spent, and what was not reached is reported.  A watchdog ends the program (exit 3) if it runs 300 s past the budget.
 *
 * Usage: test_fabric_cuda [--small | --matrix [--max-seconds S]] [seed]
 *        (--small: a few cases, for compute-sanitizer; batched and per op only)
 * Exit status: 0 only if every case matched (--matrix: and at least one was compared).
 */
#include "api/comm.h"
#include "fabric/cuda/cuda.h"
#include "kernels/kernels.h"
#include "plan/plan.h"
#include "tide.h"
#include "../unit/matrix_gen.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The largest topology of the configuration matrix: M = 9 nodes of L = 8 GPUs. */
#define MAX_RANKS (9 * TIDE_MAX_GPUS_PER_NODE)
#define MAX_PARAMS TIDE_MAX_PARAMS
#define CALLS 3

/* The CUDA fabric's copy path (TIDE_CUDA_BATCH and TIDE_CUDA_BATCH_MAX_BYTES, read when a
 * world is created): per op, batched without a size threshold, batched with the threshold
 * batch_threshold; each with its own TIDE_CUDA_DIRECT (gpu_open). */
enum { MODE_PER_OP = 0, MODE_BATCHED = 1, MODE_THRESHOLD = 2 };
static int batch_mode = MODE_BATCHED;
static uint64_t batch_threshold = 4096;
static const char *batch_name(int mode) {
    static char name[48];
    if (mode == MODE_PER_OP) return "per-op";
    if (mode == MODE_BATCHED) return "batched";
    snprintf(name, sizeof(name), "threshold=%llu", (unsigned long long)batch_threshold);
    return name;
}
/* Batched copy kernels and copies of the batched runs so far (batched mode, all cases). */
static uint64_t batch_kernels_seen, batch_copies_seen;
/* Sum and landing launches past one per op (TIDE_CUDA_SLICES / TIDE_CUDA_SLICE_US). */
static uint64_t sliced_seen;
/* Batched mode, cases with M > 1: all-gather copies direct mode did not issue (rail puts of
 * own shards read in place, TIDE_CUDA_DIRECT bit 16), and the cases counted. */
static uint64_t ag_elided_seen, ag_multi_node_cases;
/* Threshold mode, all cases: copies per op over the threshold, copies batched, and calls
 * that did both. */
static uint64_t split_over_seen, split_batched_seen, split_both_calls;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call,                        \
                    cudaGetErrorString(e_));                                                       \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------------------ inputs */

/* Host memory of the test itself: running out ends the program with a clear message. */
static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "FAIL: out of host memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static uint64_t rng_state;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int rnd_int(int lo, int hi) {
    return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}
static float rnd_normal(void) {
    double s = 0;
    for (int i = 0; i < 12; ++i)
        s += (double)(rnd() >> 11) / 9007199254740992.0;
    return (float)(s - 6.0);
}

typedef struct {
    int m, l, n;
    tide_config_t cfg;
    tide_param_shape_t shapes[MAX_PARAMS];
    tide_group_desc_t desc;
    tide_plan_t plan;
    bool resident;    /* AG reads the resident region (shard = NULL) */
    bool null_stream; /* calls pass stream = NULL (legacy default stream) */
    bool integer;     /* gradients are small integers (every sum exact) */
    bool pooled;      /* one device allocation per rank for its inputs and output */
    float alpha;
    int accumulate[CALLS];
    tide_rs_mode_t modes[CALLS];
    size_t shard_operand; /* S, or S_fp32 with a cast */
    uint8_t *shards[CALLS][MAX_RANKS];
    void *grads[CALLS][MAX_RANKS][MAX_PARAMS];
    float *out0[MAX_RANKS];             /* RS output before the first call */
    uint8_t *land[2][CALLS][MAX_RANKS]; /* [fabric][call][rank] AG landing (pinned for CUDA) */
    float *out[2][CALLS][MAX_RANKS];    /* [fabric][call][rank] RS output */
    uint8_t *pinned;                    /* the CUDA fabric's land[1] and out[1], carved */
} case_t;

static bool case_plan(case_t *c) {
    if (tide_plan_create(&c->cfg, &c->desc, &c->plan) == TIDE_SUCCESS) return true;
    /* A tuning knob the planner refuses for this shape: fall back to the defaults. */
    tide_config_t d = TIDE_CONFIG_INIT;
    d.nodes = c->m;
    d.gpus_per_node = c->l;
    d.mode = c->cfg.mode;
    c->cfg = d;
    return tide_plan_create(&c->cfg, &c->desc, &c->plan) == TIDE_SUCCESS;
}

static void case_inputs(case_t *c) {
    const tide_geom_t *g = &c->plan->geom;
    c->shard_operand = g->cast ? g->fp32_shard_bytes : g->shard_bytes;
    for (int e = 0; e < CALLS; ++e)
        for (int r = 0; r < c->n; ++r) {
            c->shards[e][r] = xmalloc(c->shard_operand);
            if (g->cast)
                for (size_t i = 0; i < c->shard_operand / 4; ++i)
                    ((float *)c->shards[e][r])[i] = rnd_normal() * 8.0f;
            else
                for (size_t i = 0; i < c->shard_operand; ++i)
                    c->shards[e][r][i] = (uint8_t)rnd();
            for (int p = 0; p < g->num_params; ++p) {
                const uint64_t elems = g->params[p].dim0 * g->params[p].inner;
                c->grads[e][r][p] = xmalloc(elems * g->grad_item);
                for (uint64_t i = 0; i < elems; ++i) {
                    float v = c->integer ? (float)rnd_int(-8, 8) : rnd_normal();
                    if (g->grad_item == 2)
                        ((uint16_t *)c->grads[e][r][p])[i] = tide_float_to_bf16(v);
                    else
                        ((float *)c->grads[e][r][p])[i] = v;
                }
            }
        }
    for (int r = 0; r < c->n; ++r) {
        c->out0[r] = xmalloc(g->fp32_shard_bytes);
        for (uint64_t i = 0; i < g->shard_elems; ++i)
            c->out0[r][i] = rnd_normal();
    }
}

static void case_free(case_t *c) {
    for (int e = 0; e < CALLS; ++e)
        for (int r = 0; r < c->n; ++r) {
            free(c->shards[e][r]);
            for (int p = 0; p < c->desc.num_params; ++p)
                free(c->grads[e][r][p]);
            free(c->land[0][e][r]);
            free(c->out[0][e][r]);
        }
    if (c->pinned != NULL) cudaFreeHost(c->pinned);
    for (int r = 0; r < c->n; ++r)
        free(c->out0[r]);
    tide_plan_destroy(c->plan);
}

static uint64_t align_up(uint64_t v) {
    return (v + 255) & ~(uint64_t)255;
}

/* Outputs of both fabrics.  The CUDA fabric's are pinned (copied out asynchronously), carved
 * from one allocation: a pinned allocation per buffer costs milliseconds at 72 ranks. */
static bool case_outputs(case_t *c) {
    const tide_geom_t *g = &c->plan->geom;
    const uint64_t per = align_up(g->group_bytes) + align_up(g->fp32_shard_bytes);
    CK(cudaMallocHost((void **)&c->pinned, per * CALLS * (uint64_t)c->n));
    uint8_t *at = c->pinned;
    for (int e = 0; e < CALLS; ++e)
        for (int r = 0; r < c->n; ++r) {
            c->land[0][e][r] = calloc(1, g->group_bytes > 0 ? g->group_bytes : 1);
            c->out[0][e][r] = calloc(1, g->fp32_shard_bytes > 0 ? g->fp32_shard_bytes : 4);
            if (c->land[0][e][r] == NULL || c->out[0][e][r] == NULL) {
                fprintf(stderr, "FAIL: out of host memory\n");
                exit(2);
            }
            c->land[1][e][r] = at;
            at += align_up(g->group_bytes);
            c->out[1][e][r] = (float *)at;
            at += align_up(g->fp32_shard_bytes);
        }
    return true;
}

/* ------------------------------------------------------------------ the CPU fabric (oracle) */

typedef struct {
    case_t *c;
    tide_comm_t comms[MAX_RANKS];
    int rank;
    char error[512];
} cpu_job_t;

static void *cpu_rank(void *arg) {
    cpu_job_t *j = arg;
    case_t *c = j->c;
    const int r = j->rank;
    const tide_geom_t *g = &c->plan->geom;
    tide_group_t grp;
    if (tide_group_register(j->comms[r], &c->cfg, &c->desc, &grp) != TIDE_SUCCESS) {
        snprintf(j->error, sizeof(j->error), "cpu register: %s", tide_get_last_error());
        return NULL;
    }
    for (int e = 0; e < CALLS && j->error[0] == '\0'; ++e) {
        void *land = NULL, *res = NULL;
        const void *shard = c->shards[e][r];
        if (c->resident && tide_group_resident(grp, &res) == TIDE_SUCCESS) {
            memcpy(res, shard, g->shard_bytes);
            shard = NULL;
        }
        if (tide_all_gather(grp, shard, e % 2, NULL) != TIDE_SUCCESS ||
            tide_group_landing(grp, e % 2, &land) != TIDE_SUCCESS)
            snprintf(j->error, sizeof(j->error), "cpu all_gather %d: %s", e, tide_get_last_error());
        else
            memcpy(c->land[0][e][r], land, g->group_bytes);
    }
    float *out = xmalloc(g->fp32_shard_bytes);
    memcpy(out, c->out0[r], g->fp32_shard_bytes);
    for (int e = 0; e < CALLS && j->error[0] == '\0'; ++e) {
        if (tide_reduce_scatter(grp, (const void *const *)c->grads[e][r], out, c->alpha,
                                c->accumulate[e], c->modes[e], NULL) != TIDE_SUCCESS)
            snprintf(j->error, sizeof(j->error), "cpu reduce_scatter %d: %s", e,
                     tide_get_last_error());
        else
            memcpy(c->out[0][e][r], out, g->fp32_shard_bytes);
    }
    free(out);
    if (tide_group_deregister(grp) != TIDE_SUCCESS && j->error[0] == '\0')
        snprintf(j->error, sizeof(j->error), "cpu deregister: %s", tide_get_last_error());
    return NULL;
}

static bool run_cpu(case_t *c, char *err, size_t err_size) {
    tide_comm_t comms[MAX_RANKS];
    if (tide_comm_init_all(TIDE_FABRIC_CPU, c->m, c->l, comms) != TIDE_SUCCESS) {
        snprintf(err, err_size, "cpu comm_init_all: %s", tide_get_last_error());
        return false;
    }
    pthread_t th[MAX_RANKS];
    cpu_job_t *jobs = calloc(MAX_RANKS, sizeof(*jobs));
    if (jobs == NULL) {
        fprintf(stderr, "FAIL: out of host memory\n");
        exit(2);
    }
    for (int r = 0; r < c->n; ++r) {
        jobs[r] = (cpu_job_t){.c = c, .rank = r};
        memcpy(jobs[r].comms, comms, sizeof(comms));
        /* A rank that cannot start would leave the others waiting for it forever. */
        if (pthread_create(&th[r], NULL, cpu_rank, &jobs[r]) != 0) {
            fprintf(stderr, "FAIL: pthread_create for CPU rank %d of %d\n", r, c->n);
            exit(2);
        }
    }
    bool ok = true;
    for (int r = 0; r < c->n; ++r) {
        pthread_join(th[r], NULL);
        if (jobs[r].error[0] != '\0' && ok) {
            snprintf(err, err_size, "rank %d: %s", r, jobs[r].error);
            ok = false;
        }
    }
    for (int r = 0; r < c->n; ++r)
        tide_comm_destroy(comms[r]);
    free(jobs);
    return ok;
}

/* ------------------------------------------------------------------ the CUDA fabric */

typedef struct {
    tide_comm_t comms[MAX_RANKS];
    tide_group_t groups[MAX_RANKS];
    int device[MAX_RANKS];
    cudaStream_t stream[MAX_RANKS];
} gpu_world_t;

/* With the all-gather's aliasing in the batched mask, the multi-node cases must have elided
 * rail puts (else the path the default takes went untested). */
static bool ag_direct_seen(const char *what) {
    const char *direct = getenv("TIDE_TEST_CUDA_DIRECT");
    const int mask = direct != NULL && direct[0] ? atoi(direct) : 31;
    printf("all-gather rail puts read in place (batched, M > 1): %llu in %llu %s\n",
           (unsigned long long)ag_elided_seen, (unsigned long long)ag_multi_node_cases, what);
    if ((mask & 16) && ag_multi_node_cases > 0 && ag_elided_seen == 0) {
        printf("FAIL: TIDE_CUDA_DIRECT %d includes 16, yet no all-gather put was elided\n", mask);
        return false;
    }
    return true;
}

static bool gpu_open(case_t *c, gpu_world_t *w, char *err, size_t err_size) {
    memset(w, 0, sizeof(*w));
    char max_bytes[32];
    snprintf(max_bytes, sizeof(max_bytes), "%llu",
             (unsigned long long)(batch_mode == MODE_THRESHOLD ? batch_threshold : 0));
    setenv("TIDE_CUDA_BATCH", batch_mode == MODE_PER_OP ? "0" : "1", 1);
    setenv("TIDE_CUDA_BATCH_MAX_BYTES", max_bytes, 1);
    /* Direct mode (direct.c, direct_ag.c: on one GPU every node shares the device) takes all
     * shortcuts (the default mask) with batched copies, or TIDE_TEST_CUDA_DIRECT's mask when
     * set (run.sh runs the matrix once more with 7, no fusion, no all-gather aliasing);
     * in-place sums, zero inputs and the all-gather's aliasing with the threshold; none per
     * op: each path meets the CPU fabric. */
    const char *direct = getenv("TIDE_TEST_CUDA_DIRECT");
    setenv("TIDE_CUDA_DIRECT",
           batch_mode == MODE_PER_OP      ? "0"
           : batch_mode == MODE_THRESHOLD ? "19"
           : direct != NULL && direct[0]  ? direct
                                          : "31",
           1);
    if (tide_comm_init_all(TIDE_FABRIC_CUDA, c->m, c->l, w->comms) != TIDE_SUCCESS) {
        snprintf(err, err_size, "cuda comm_init_all: %s", tide_get_last_error());
        return false;
    }
    /* One thread registers every rank: the CUDA fabric's registration never waits. */
    for (int r = 0; r < c->n; ++r) {
        if (tide_group_register(w->comms[r], &c->cfg, &c->desc, &w->groups[r]) != TIDE_SUCCESS) {
            snprintf(err, err_size, "cuda register rank %d: %s", r, tide_get_last_error());
            return false;
        }
        /* The comparison is only meaningful if both fabrics ran the same programs: at L = 1
         * the rail lane (docs/protocol.md), which the CPU fabric runs. */
        if (w->groups[r]->plan->rs.rail_lane != c->plan->rs.rail_lane) {
            snprintf(err, err_size, "cuda register rank %d: the group's plan is %sthe rail lane, "
                     "the cpu fabric's is %s", r, w->groups[r]->plan->rs.rail_lane ? "" : "not ",
                     c->plan->rs.rail_lane ? "the lane" : "generic");
            return false;
        }
        w->device[r] = tide_cuda_world_device(w->comms[r]->world);
        CK(cudaSetDevice(w->device[r]));
        CK(cudaStreamCreateWithFlags(&w->stream[r], cudaStreamNonBlocking));
    }
    return true;
}

static void gpu_close(case_t *c, gpu_world_t *w) {
    for (int r = 0; r < c->n; ++r) {
        if (w->stream[r] != NULL) cudaStreamDestroy(w->stream[r]);
        if (w->groups[r] != NULL && tide_group_deregister(w->groups[r]) != TIDE_SUCCESS)
            fprintf(stderr, "deregister rank %d: %s\n", r, tide_get_last_error());
    }
    for (int r = 0; r < c->n; ++r)
        if (w->comms[r] != NULL) tide_comm_destroy(w->comms[r]);
}

static void *device_copy(int device, const void *host, size_t bytes) {
    void *d = NULL;
    CK(cudaSetDevice(device));
    CK(cudaMalloc(&d, bytes > 0 ? bytes : 1));
    CK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* Device copies of one case's inputs and the RS outputs. */
typedef struct {
    void *shard[CALLS][MAX_RANKS];
    void *grad[CALLS][MAX_RANKS][MAX_PARAMS];
    float *out[MAX_RANKS];
    uint8_t *pool[MAX_RANKS]; /* pooled: everything of rank r */
} gpu_inputs_t;

static uint64_t grad_bytes(const tide_geom_t *g, int p) {
    return g->params[p].dim0 * g->params[p].inner * g->grad_item;
}

/* Device bytes of one rank's pooled inputs and output. */
static uint64_t pooled_bytes(const case_t *c) {
    const tide_geom_t *g = &c->plan->geom;
    uint64_t bytes = align_up(g->fp32_shard_bytes);
    for (int e = 0; e < CALLS; ++e) {
        bytes += align_up(c->shard_operand);
        for (int p = 0; p < g->num_params; ++p)
            bytes += align_up(grad_bytes(g, p));
    }
    return bytes;
}

/* cudaMemcpy from pageable host memory may return before its DMA reached the device, and
 * the world's streams are non-blocking (no implicit order behind the legacy stream's copy):
 * every device the inputs went to finishes them before the first call reads them. */
static void gpu_inputs_fill(const case_t *c, const gpu_world_t *w, gpu_inputs_t *in);

static void gpu_inputs(const case_t *c, const gpu_world_t *w, gpu_inputs_t *in) {
    gpu_inputs_fill(c, w, in);
    for (int r = 0; r < c->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        CK(cudaDeviceSynchronize());
    }
}

static void gpu_inputs_fill(const case_t *c, const gpu_world_t *w, gpu_inputs_t *in) {
    const tide_geom_t *g = &c->plan->geom;
    const int np = g->num_params;
    if (!c->pooled) { /* one allocation per buffer: what compute-sanitizer checks bounds of */
        for (int e = 0; e < CALLS; ++e)
            for (int r = 0; r < c->n; ++r) {
                in->shard[e][r] = device_copy(w->device[r], c->shards[e][r], c->shard_operand);
                for (int p = 0; p < np; ++p)
                    in->grad[e][r][p] =
                        device_copy(w->device[r], c->grads[e][r][p], grad_bytes(g, p));
            }
        for (int r = 0; r < c->n; ++r)
            in->out[r] = device_copy(w->device[r], c->out0[r], g->fp32_shard_bytes);
        return;
    }
    /* Pooled: staged on the host, one allocation and one copy per rank. */
    const uint64_t bytes = pooled_bytes(c);
    uint8_t *host = xmalloc(bytes);
    for (int r = 0; r < c->n; ++r) {
        uint64_t at = 0;
        CK(cudaSetDevice(w->device[r]));
        CK(cudaMalloc((void **)&in->pool[r], bytes));
        for (int e = 0; e < CALLS; ++e) {
            memcpy(host + at, c->shards[e][r], c->shard_operand);
            in->shard[e][r] = in->pool[r] + at;
            at += align_up(c->shard_operand);
            for (int p = 0; p < np; ++p) {
                memcpy(host + at, c->grads[e][r][p], grad_bytes(g, p));
                in->grad[e][r][p] = in->pool[r] + at;
                at += align_up(grad_bytes(g, p));
            }
        }
        memcpy(host + at, c->out0[r], g->fp32_shard_bytes);
        in->out[r] = (float *)(in->pool[r] + at);
        CK(cudaMemcpy(in->pool[r], host, bytes, cudaMemcpyHostToDevice));
    }
    free(host);
}

static void gpu_inputs_free(const case_t *c, gpu_inputs_t *in) {
    for (int r = 0; r < c->n; ++r) {
        if (c->pooled) {
            cudaFree(in->pool[r]);
            continue;
        }
        for (int e = 0; e < CALLS; ++e) {
            cudaFree(in->shard[e][r]);
            for (int p = 0; p < c->desc.num_params; ++p)
                cudaFree(in->grad[e][r][p]);
        }
        cudaFree(in->out[r]);
    }
    free(in);
}

static bool run_gpu(case_t *c, char *err, size_t err_size) {
    const tide_geom_t *g = &c->plan->geom;
    const int n = c->n;
    gpu_world_t w;
    bool ok = gpu_open(c, &w, err, err_size);
    gpu_inputs_t *in = calloc(1, sizeof(*in));
    if (in == NULL) {
        fprintf(stderr, "FAIL: out of host memory\n");
        exit(2);
    }
    if (ok) gpu_inputs(c, &w, in);
    void *(*dshard)[MAX_RANKS] = in->shard;
    float **dout = in->out;

    /* AG: three calls back to back.  Once every rank called (the last call enqueued the
     * whole call), each rank's landing is copied out on its stream: behind call e there,
     * ahead of call e + 2, which reuses the slot. */
    for (int e = 0; ok && e < CALLS; ++e) {
        for (int r = 0; ok && r < n; ++r) {
            cudaStream_t s = c->null_stream ? NULL : w.stream[r];
            const void *shard = dshard[e][r];
            CK(cudaSetDevice(w.device[r]));
            if (c->resident) {
                void *res = NULL;
                if (tide_group_resident(w.groups[r], &res) != TIDE_SUCCESS) {
                    snprintf(err, err_size, "resident: %s", tide_get_last_error());
                    ok = false;
                    break;
                }
                CK(cudaMemcpyAsync(res, shard, g->shard_bytes, cudaMemcpyDeviceToDevice, s));
                shard = NULL;
            }
            if (tide_all_gather(w.groups[r], shard, e % 2, s) != TIDE_SUCCESS) {
                snprintf(err, err_size, "cuda all_gather %d rank %d: %s", e, r,
                         tide_get_last_error());
                ok = false;
            }
        }
        for (int r = 0; ok && r < n; ++r) {
            cudaStream_t s = c->null_stream ? NULL : w.stream[r];
            void *land = NULL;
            CK(cudaSetDevice(w.device[r]));
            if (tide_group_landing(w.groups[r], e % 2, &land) != TIDE_SUCCESS) {
                snprintf(err, err_size, "landing: %s", tide_get_last_error());
                ok = false;
                break;
            }
            CK(cudaMemcpyAsync(c->land[1][e][r], land, g->group_bytes, cudaMemcpyDeviceToHost, s));
        }
    }

    /* RS: three calls back to back, outputs copied out after each call. */
    for (int e = 0; ok && e < CALLS; ++e) {
        for (int r = 0; ok && r < n; ++r) {
            cudaStream_t s = c->null_stream ? NULL : w.stream[r];
            CK(cudaSetDevice(w.device[r]));
            if (tide_reduce_scatter(w.groups[r], (const void *const *)in->grad[e][r], dout[r],
                                    c->alpha, c->accumulate[e], c->modes[e], s) != TIDE_SUCCESS) {
                snprintf(err, err_size, "cuda reduce_scatter %d rank %d: %s", e, r,
                         tide_get_last_error());
                ok = false;
            }
        }
        for (int r = 0; ok && r < n; ++r) {
            cudaStream_t s = c->null_stream ? NULL : w.stream[r];
            CK(cudaSetDevice(w.device[r]));
            CK(cudaMemcpyAsync(c->out[1][e][r], dout[r], g->fp32_shard_bytes,
                               cudaMemcpyDeviceToHost, s));
        }
    }
    for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(w.device[r]));
        CK(cudaDeviceSynchronize());
    }
    for (int k = 0; ok && k < 2; ++k) {
        tide_cuda_stats_t st;
        tide_cuda_arena_stats(w.groups[0]->arena,
                              k == 0 ? TIDE_COLL_ALL_GATHER : TIDE_COLL_REDUCE_SCATTER, &st);
        if (batch_mode == MODE_PER_OP && st.batches != 0) {
            snprintf(err, err_size, "TIDE_CUDA_BATCH=0 ran %llu batched copy kernels",
                     (unsigned long long)st.batches);
            ok = false;
        }
        if (batch_mode != MODE_THRESHOLD && st.over_threshold != 0) {
            snprintf(err, err_size, "no size threshold, yet %llu copies went per op over it",
                     (unsigned long long)st.over_threshold);
            ok = false;
        }
        sliced_seen += st.sliced;
        if (k == 0 && batch_mode == MODE_BATCHED && c->m > 1) {
            ag_elided_seen += st.elided;
            ++ag_multi_node_cases;
        }
        if (batch_mode == MODE_BATCHED) {
            batch_kernels_seen += st.batches;
            batch_copies_seen += st.batched;
        } else if (batch_mode == MODE_THRESHOLD) {
            split_over_seen += st.over_threshold;
            split_batched_seen += st.batched;
            split_both_calls += st.over_threshold > 0 && st.batches > 0;
        }
    }
    gpu_inputs_free(c, in);
    gpu_close(c, &w);
    return ok;
}

/* ------------------------------------------------------------------ cases */

static int first_diff(const void *a, const void *b, size_t bytes, size_t *at) {
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < bytes; ++i)
        if (x[i] != y[i]) {
            *at = i;
            return 1;
        }
    return 0;
}

static const char *dtype_name(tide_dtype_t d) {
    return d == TIDE_DTYPE_BF16 ? "bf16" : "fp32";
}
static const char *mode_name(tide_rs_mode_t m) {
    return m == TIDE_RS_IN_PLACE ? "ip" : "sr";
}

/* Variant v of topology (m, l): dtypes, modes, accumulate, alpha, streams, knobs. */
static bool case_init(case_t *c, int m, int l, int v) {
    memset(c, 0, sizeof(*c));
    c->m = m;
    c->l = l;
    c->n = m * l;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    const int np = rnd_int(1, 6);
    for (int p = 0; p < np; ++p) {
        c->shapes[p].dim0 = (uint64_t)rnd_int(1, 3 * c->n + 2);
        c->shapes[p].inner = (uint64_t)rnd_int(1, 6);
    }
    tide_dtype_t ag = TIDE_DTYPE_BF16, grad = TIDE_DTYPE_BF16, shard = TIDE_DTYPE_BF16;
    static const tide_rs_mode_t seq[4][CALLS] = {
        {TIDE_RS_IN_PLACE, TIDE_RS_IN_PLACE, TIDE_RS_SLOT_REUSE},
        {TIDE_RS_SLOT_REUSE, TIDE_RS_SLOT_REUSE, TIDE_RS_IN_PLACE},
        {TIDE_RS_IN_PLACE, TIDE_RS_SLOT_REUSE, TIDE_RS_SLOT_REUSE},
        {TIDE_RS_SLOT_REUSE, TIDE_RS_IN_PLACE, TIDE_RS_IN_PLACE}};
    static const int acc[4][CALLS] = {{0, 1, 1}, {1, 0, 1}, {0, 0, 1}, {1, 1, 0}};
    switch (v) {
    case 0:
        c->alpha = tide_alpha_avg(c->n);
        break;
    case 1:
        ag = shard = grad = TIDE_DTYPE_FP32;
        c->alpha = 0.37f;
        c->resident = true;
        c->null_stream = true;
        break;
    case 2: /* mixed precision: fp32 master shards cast to bf16 */
        shard = TIDE_DTYPE_FP32;
        c->alpha = tide_alpha_divide(2.0f, (float)c->n);
        cfg.staging_slots = 3;
        break;
    default:
        grad = TIDE_DTYPE_FP32;
        c->alpha = -1.5f;
        cfg.staging_slots = 1;
        cfg.passes = 2;
        cfg.sum_ctas = 1;
        cfg.landing_ctas = 7;
        break;
    }
    cfg.mode = seq[v][0];
    c->cfg = cfg;
    memcpy(c->modes, seq[v], sizeof(c->modes));
    memcpy(c->accumulate, acc[v], sizeof(c->accumulate));
    c->desc = (tide_group_desc_t){np, c->shapes, ag, grad, shard};
    return case_plan(c);
}

static void sizes_of(const tide_program_t *prog, uint64_t *v, int *n, int cap) {
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[r].queues[q].num_ops; ++i) {
                const tide_op_t *op = &prog->ranks[r].queues[q].ops[i];
                const uint64_t b =
                    op->kind == TIDE_OP_COPY     ? op->bytes
                    : op->kind == TIDE_OP_COPY2D ? op->bytes * op->rows
                                                 : 0;
                if (b > 0 && *n < cap) v[(*n)++] = b;
            }
}

static int by_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The threshold mode's TIDE_CUDA_BATCH_MAX_BYTES for case c: the median of the distinct copy
 * sizes of its AG and RS programs, so that the smallest copies batch and the others go per
 * op (4096 when the programs cannot be compiled here or have one copy size only). */
static uint64_t case_threshold(const case_t *c) {
    enum { CAP = 1 << 16 };
    uint64_t *v = xmalloc(CAP * sizeof(*v));
    int n = 0;
    tide_program_t prog;
    /* At L = 1 both fabrics run the rail lane's programs (docs/protocol.md). */
    const struct tide_plan *plan = c->plan;
    if (tide_program_compile_ag(plan, &prog) == TIDE_SUCCESS) {
        sizes_of(&prog, v, &n, CAP);
        tide_program_free(&prog);
    }
    for (int e = 0; e < CALLS; ++e)
        if ((e == 0 || c->modes[e] != c->modes[0]) &&
            tide_program_compile_rs(plan, c->modes[e], &prog) == TIDE_SUCCESS) {
            sizes_of(&prog, v, &n, CAP);
            tide_program_free(&prog);
        }
    qsort(v, (size_t)n, sizeof(*v), by_u64);
    int distinct = 0;
    for (int i = 0; i < n; ++i)
        if (distinct == 0 || v[i] != v[distinct - 1]) v[distinct++] = v[i];
    const uint64_t t = distinct >= 2 ? v[distinct / 2] : 4096;
    free(v);
    return t;
}

/* Run case c (inputs and outputs in place) on the CPU fabric once and on the CUDA fabric with
 * batched copies, with the size threshold when threshold, and one copy per op when per_op;
 * compare every landing and output. */
static bool case_compare(case_t *c, const char *name, bool threshold, bool per_op) {
    const tide_geom_t *g = &c->plan->geom;
    char err[768] = "";
    bool cpu_ok = run_cpu(c, err, sizeof(err)), all_ok = cpu_ok;
    const int modes[3] = {MODE_BATCHED, MODE_THRESHOLD, MODE_PER_OP};
    if (threshold) batch_threshold = case_threshold(c);
    for (int mi = 0; mi < 3; ++mi) {
        const int mode = modes[mi];
        if ((mode == MODE_THRESHOLD && !threshold) || (mode == MODE_PER_OP && !per_op)) continue;
        batch_mode = mode;
        for (int e = 0; e < CALLS; ++e)
            for (int r = 0; r < c->n; ++r) {
                memset(c->land[1][e][r], 0xa5, g->group_bytes);
                memset(c->out[1][e][r], 0xa5, g->fp32_shard_bytes);
            }
        bool ok = cpu_ok && run_gpu(c, err, sizeof(err));
        for (int e = 0; ok && e < CALLS; ++e)
            for (int r = 0; ok && r < c->n; ++r) {
                size_t at = 0;
                if (first_diff(c->land[0][e][r], c->land[1][e][r], g->group_bytes, &at)) {
                    snprintf(err, sizeof(err),
                             "AG call %d rank %d: landing differs at byte %zu of %llu", e, r, at,
                             (unsigned long long)g->group_bytes);
                    ok = false;
                } else if (first_diff(c->out[0][e][r], c->out[1][e][r], g->fp32_shard_bytes,
                                      &at)) {
                    snprintf(err, sizeof(err),
                             "RS call %d (%s) rank %d: output differs at element "
                             "%zu: cpu %.9g, cuda %.9g",
                             e, mode_name(c->modes[e]), r, at / 4,
                             (double)c->out[0][e][r][at / 4], (double)c->out[1][e][r][at / 4]);
                    ok = false;
                }
            }
        printf("%s %s %s%s%s\n", ok ? "PASS" : "FAIL", name, batch_name(mode), ok ? "" : ": ",
               ok ? "" : err);
        fflush(stdout);
        all_ok = all_ok && ok;
    }
    return all_ok;
}

static case_t *case_alloc(void) {
    case_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        fprintf(stderr, "FAIL: out of host memory\n");
        exit(2);
    }
    return c;
}

static bool run_case(int m, int l, int v, bool threshold) {
    case_t *c = case_alloc();
    if (!case_init(c, m, l, v)) {
        printf("FAIL M=%d L=%d v%d: plan: %s\n", m, l, v, tide_get_last_error());
        free(c);
        return false;
    }
    const tide_geom_t *g = &c->plan->geom;
    char name[256];
    snprintf(name, sizeof(name),
             "M=%d L=%d P=%d ag=%s%s grad=%s rs=%s,%s,%s acc=%d%d%d alpha=%g%s%s", m, l,
             c->desc.num_params, dtype_name(c->desc.ag_dtype), g->cast ? "(cast)" : "",
             dtype_name(c->desc.grad_dtype), mode_name(c->modes[0]), mode_name(c->modes[1]),
             mode_name(c->modes[2]), c->accumulate[0], c->accumulate[1], c->accumulate[2],
             (double)c->alpha, c->resident ? " resident" : "", c->null_stream ? " null-stream" : "");
    case_inputs(c);
    bool ok = case_outputs(c) && case_compare(c, name, threshold, true);
    case_free(c);
    free(c);
    return ok;
}

/* ------------------------------------------------------------------ host enqueue time */

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int by_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median host time of one call of all ranks, per collective, at P = 30, M = 8, L = 1. */
static bool enqueue_timer(int mode) {
    enum { M = 8, L = 1, N = M * L, P = 30, ITERS = 25, WARMUP = 3 };
    case_t c;
    memset(&c, 0, sizeof(c));
    c.m = M;
    c.l = L;
    c.n = N;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = M;
    cfg.gpus_per_node = L;
    c.cfg = cfg;
    for (int p = 0; p < P; ++p) {
        c.shapes[p].dim0 = (uint64_t)rnd_int(64, 1024);
        c.shapes[p].inner = (uint64_t)rnd_int(16, 256);
    }
    c.desc = (tide_group_desc_t){P, c.shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    char err[512] = "";
    batch_mode = mode;
    for (int e = 0; e < CALLS; ++e)
        c.modes[e] = TIDE_RS_IN_PLACE;
    if (tide_plan_create(&c.cfg, &c.desc, &c.plan) != TIDE_SUCCESS) {
        printf("FAIL enqueue timer: plan: %s\n", tide_get_last_error());
        return false;
    }
    /* Copies of 256 B to 64 KiB per rank: the median size splits the runs of this group. */
    batch_threshold = case_threshold(&c);
    const tide_geom_t *g = &c.plan->geom;
    gpu_world_t w;
    bool ok = gpu_open(&c, &w, err, sizeof(err));
    void *dshard[N] = {0}, *dgrad[N][P] = {{0}};
    float *dout[N] = {0};
    for (int r = 0; ok && r < N; ++r) {
        CK(cudaSetDevice(w.device[r]));
        CK(cudaMalloc(&dshard[r], g->shard_bytes));
        CK(cudaMemset(dshard[r], 0, g->shard_bytes));
        CK(cudaMalloc((void **)&dout[r], g->fp32_shard_bytes));
        for (int p = 0; p < P; ++p) {
            const size_t bytes = g->params[p].dim0 * g->params[p].inner * g->grad_item;
            CK(cudaMalloc(&dgrad[r][p], bytes));
            CK(cudaMemset(dgrad[r][p], 0, bytes));
        }
    }
    double ag_us[ITERS], rs_us[ITERS];
    for (int it = 0; ok && it < WARMUP + ITERS; ++it) {
        double t0 = now_us();
        for (int r = 0; ok && r < N; ++r)
            ok = tide_all_gather(w.groups[r], dshard[r], it % 2, w.stream[r]) == TIDE_SUCCESS;
        double t1 = now_us();
        for (int r = 0; ok && r < N; ++r)
            ok = tide_reduce_scatter(w.groups[r], (const void *const *)dgrad[r], dout[r], 1.0f, 0,
                                     TIDE_RS_IN_PLACE, w.stream[r]) == TIDE_SUCCESS;
        double t2 = now_us();
        if (!ok) snprintf(err, sizeof(err), "call: %s", tide_get_last_error());
        /* Outside the timed region: keep the device queues from filling up. */
        for (int r = 0; r < N; ++r)
            CK(cudaStreamSynchronize(w.stream[r]));
        if (it >= WARMUP) {
            ag_us[it - WARMUP] = t1 - t0;
            rs_us[it - WARMUP] = t2 - t1;
        }
    }
    if (ok) {
        tide_cuda_stats_t st[2];
        tide_cuda_arena_stats(w.groups[0]->arena, TIDE_COLL_ALL_GATHER, &st[0]);
        tide_cuda_arena_stats(w.groups[0]->arena, TIDE_COLL_REDUCE_SCATTER, &st[1]);
        double *us[2] = {ag_us, rs_us};
        const char *what[2] = {"all_gather", "reduce_scatter"};
        for (int k = 0; k < 2; ++k) {
            qsort(us[k], ITERS, sizeof(double), by_double);
            const double med = us[k][ITERS / 2];
            const uint64_t calls = st[k].descriptors + st[k].waits + st[k].records;
            printf("ENQUEUE %s %s M=%d L=%d P=%d (one GPU; copies run on SMs): median %.1f us "
                   "per call of all %d ranks (%.1f us per rank), %s call: %llu descriptors "
                   "(%llu batched copy kernels running %llu copies, %llu table uploads), %llu "
                   "event waits, %llu event records, %llu CUDA calls (%.2f us per CUDA call), "
                   "%llu copies per op over the size threshold\n",
                   what[k], batch_name(mode), M, L, P, med, N, med / N,
                   st[k].form ? "steady" : "fresh", (unsigned long long)st[k].descriptors,
                   (unsigned long long)st[k].batches, (unsigned long long)st[k].batched,
                   (unsigned long long)st[k].uploads, (unsigned long long)st[k].waits,
                   (unsigned long long)st[k].records, (unsigned long long)calls,
                   calls > 0 ? med / (double)calls : 0.0,
                   (unsigned long long)st[k].over_threshold);
            if (mode == MODE_BATCHED && k == 0 && st[k].batches == 0) {
                printf("FAIL enqueue timer: the batched all-gather ran no batch\n");
                ok = false;
            }
        }
    } else {
        printf("FAIL enqueue timer: %s\n", err);
    }
    for (int r = 0; r < N; ++r) {
        cudaFree(dshard[r]);
        cudaFree(dout[r]);
        for (int p = 0; p < P; ++p)
            cudaFree(dgrad[r][p]);
    }
    gpu_close(&c, &w);
    tide_plan_destroy(c.plan);
    return ok;
}

/* ------------------------------------------------------------------ the configuration matrix */

/*
 * The space of tests/unit/test_matrix.c: the knob variants and choices come from matrix_gen.h;
 * the data-set loop mirrors test_matrix.c's (whose e2e_util.h includes cmocka).
 * A data set is (topology, shapes, dtypes, alpha, integer gradients); it runs with the default
 * knobs and with the tuning-knob variants, one CUDA-vs-CPU comparison each.
 */

typedef struct {
    int m, l, n;
    int num_params;
    tide_param_shape_t shapes[MAX_PARAMS];
    tide_dtype_t ag, grad, shard;
    bool integer;
    float alpha;
} dataset_t;

static struct {
    double deadline_s;
    int compared, per_op, failed, skipped_memory, refused, not_reached;
    int max_n_compared;
    uint64_t min_free; /* the least free memory over the visible devices, before a case */
    int devices;
} mx;

static double now_s(void) {
    return now_us() * 1e-6;
}

/* The least free memory over the visible devices (printed when print). */
static uint64_t least_free(bool print) {
    uint64_t least = UINT64_MAX;
    for (int dev = 0; dev < mx.devices; ++dev) {
        size_t free_b = 0, total_b = 0;
        CK(cudaSetDevice(dev));
        CK(cudaMemGetInfo(&free_b, &total_b));
        if (print)
            printf("device %d: %.1f of %.1f GiB free\n", dev, free_b / 1073741824.0,
                   total_b / 1073741824.0);
        if ((uint64_t)free_b < least) least = free_b;
    }
    return least;
}

static bool is_pow2(float a) {
    int e;
    return a > 0.0f && isfinite(a) && frexpf(a, &e) == 0.5f;
}

/* P shapes of at most max_rows x max_inner, the first one with padding when N > 1. */
static void dataset_init(dataset_t *d, int m, int l, int p, int max_rows, int max_inner,
                         tide_dtype_t ag, tide_dtype_t grad, tide_dtype_t shard, bool integer,
                         float alpha) {
    memset(d, 0, sizeof(*d));
    d->m = m;
    d->l = l;
    d->n = m * l;
    d->num_params = p;
    for (int i = 0; i < p; ++i) {
        d->shapes[i].dim0 = (uint64_t)rnd_int(1, max_rows);
        d->shapes[i].inner = (uint64_t)rnd_int(1, max_inner);
    }
    if (d->n > 1 && d->shapes[0].dim0 % (uint64_t)d->n == 0) d->shapes[0].dim0 += 1;
    d->ag = ag;
    d->grad = grad;
    d->shard = shard;
    d->integer = integer;
    d->alpha = alpha;
}

/* Per-device bytes a case needs: arenas and inputs of the ranks on the busiest device, plus
 * the fabric's own tables (a generous allowance). */
static uint64_t case_device_bytes(const case_t *c) {
    const int per_device = (c->n + mx.devices - 1) / mx.devices;
    const uint64_t arena = c->plan->arena.total_bytes;
    return (uint64_t)per_device * (arena + pooled_bytes(c) + (1u << 20));
}

/* One data set with one knob set: the CUDA fabric against the CPU fabric. */
static void matrix_one(const dataset_t *d, const matrix_knobs_t *k, int wave, bool ag_resident,
                       bool per_op) {
    if (now_s() > mx.deadline_s) {
        ++mx.not_reached;
        return;
    }
    case_t *c = case_alloc();
    c->m = d->m;
    c->l = d->l;
    c->n = d->n;
    c->pooled = true;
    c->integer = d->integer;
    c->alpha = d->alpha;
    c->resident = ag_resident;
    memcpy(c->shapes, d->shapes, sizeof(d->shapes));
    c->cfg = matrix_config(d->m, d->l, wave, k);
    /* Overwrite, accumulate in the other mode, accumulate again in the registered mode. */
    c->modes[0] = c->modes[2] = k->mode;
    c->modes[1] = matrix_other_mode(k->mode);
    c->accumulate[0] = 0;
    c->accumulate[1] = c->accumulate[2] = 1;
    c->desc = (tide_group_desc_t){d->num_params, c->shapes, d->ag, d->grad, d->shard};
    char name[320];
    snprintf(name, sizeof(name),
             "matrix M=%d L=%d W=%d P=%d ag=%s grad=%s%s shard=%s alpha=%g%s knobs=\"%s\"", d->m,
             d->l, wave, d->num_params, dtype_name(d->ag), dtype_name(d->grad),
             d->integer ? "(int)" : "", dtype_name(d->shard), (double)d->alpha,
             ag_resident ? " resident" : "", k->name);
    if (tide_plan_create(&c->cfg, &c->desc, &c->plan) != TIDE_SUCCESS) {
        /* The same plan is refused on either fabric: nothing to compare. */
        printf("SKIP %s: the planner refuses it: %s\n", name, tide_get_last_error());
        ++mx.refused;
        free(c);
        return;
    }
    const uint64_t need = case_device_bytes(c);
    mx.min_free = least_free(false); /* now: whatever earlier cases left allocated counts */
    if (need + need / 2 + (256u << 20) > mx.min_free) {
        printf("SKIP %s: needs about %.1f MiB per device (arena %llu B per rank), %.1f MiB "
               "free\n",
               name, need / 1048576.0, (unsigned long long)c->plan->arena.total_bytes,
               mx.min_free / 1048576.0);
        ++mx.skipped_memory;
        tide_plan_destroy(c->plan);
        free(c);
        return;
    }
    case_inputs(c);
    const bool ok = case_outputs(c) && case_compare(c, name, true, per_op);
    ++mx.compared;
    mx.per_op += per_op;
    mx.failed += !ok;
    if (ok && c->n > mx.max_n_compared) mx.max_n_compared = c->n;
    case_free(c);
    free(c);
}

/* The configurations test_matrix.c runs on topology (m, l); index as there. */
static void matrix_topology(int m, int l, int index) {
    const int n = m * l;
    const bool both = n <= 16; /* larger topologies run one gradient dtype */
    const int max_rows = 2 * n + 3, max_inner = n > 16 ? 3 : 5;
    const int wave = matrix_multiwave_width(m, l);
    static const int P_CYCLE[] = {3, 1, 5, 17, 2};
    const double t0 = now_s();
    const int c0 = mx.compared;
    dataset_t *d = calloc(1, sizeof(*d));
    if (d == NULL) exit(2);
    for (int di = 0; di < (both ? 2 : 1); ++di) {
        const tide_dtype_t dt = (both ? di : index % 2) ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
        dataset_init(d, m, l, P_CYCLE[(index + di) % 5], max_rows, max_inner, dt, dt, dt, false,
                     matrix_alpha_of(index + di, n, false));
        /* fp32 groups adopt their shard in place; bf16 groups pass it. */
        matrix_one(d, &MATRIX_BASE, 0, dt == TIDE_DTYPE_FP32, true);
        for (int v = 0; v < MATRIX_NUM_VARIANTS; ++v)
            if (n < 64 || MATRIX_VARIANTS[v].in_largest) matrix_one(d, &MATRIX_VARIANTS[v], 0, false, false);
        if (wave > 0) { /* several waves per pass, both inbox generations */
            matrix_one(d, &MATRIX_BASE, wave, false, true);
            matrix_one(d, &MATRIX_VARIANTS[8], wave, false, false);
            matrix_one(d, &MATRIX_VARIANTS[4], wave, false, false);
            if (n < 64) matrix_one(d, &MATRIX_VARIANTS[6], wave, false, false);
        }
    }
    { /* integer gradients */
        const tide_dtype_t dt = index % 2 ? TIDE_DTYPE_BF16 : TIDE_DTYPE_FP32;
        float alpha = matrix_alpha_of(index, n, true);
        if (!is_pow2(alpha) && (wave > 0 || m > l)) alpha = index % 2 ? 1.0f : 0.25f;
        dataset_init(d, m, l, P_CYCLE[(index + 2) % 5], max_rows, max_inner, dt, dt, dt, true,
                     alpha);
        matrix_one(d, &MATRIX_BASE, wave, false, true);
        matrix_one(d, &MATRIX_VARIANTS[8], wave, false, false);
    }
    if (both || index % 3 == 0) { /* mixed precision: fp32 master shards cast to bf16 */
        dataset_init(d, m, l, P_CYCLE[(index + 3) % 5], max_rows, max_inner, TIDE_DTYPE_BF16,
                     TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, false, matrix_alpha_of(index + 1, n, false));
        matrix_one(d, &MATRIX_BASE, 0, false, true);
    }
    free(d);
    printf("MATRIX M=%d L=%d (N=%d): %d configuration(s) compared, %.1f s\n", m, l, n,
           mx.compared - c0, now_s() - t0);
    fflush(stdout);
}

/* P = 256 (TIDE_MAX_PARAMS) on small topologies, and P = 17 with several waves and the
 * mixed-precision all-gather (test_matrix.c's test_many_params). */
static void matrix_many_params(void) {
    static const int topo[][2] = {{2, 2}, {1, 2}, {3, 1}};
    dataset_t *d = calloc(1, sizeof(*d));
    if (d == NULL) exit(2);
    for (int ti = 0; ti < 3; ++ti) {
        const int m = topo[ti][0], l = topo[ti][1], n = m * l;
        const tide_dtype_t dt = ti % 2 ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
        dataset_init(d, m, l, TIDE_MAX_PARAMS, n + 2, 3, dt, dt, dt, ti == 2,
                     matrix_alpha_of(ti, n, ti == 2));
        matrix_one(d, &MATRIX_BASE, 0, ti == 1, true);
        matrix_one(d, &MATRIX_VARIANTS[8], 0, false, false);
    }
    dataset_init(d, 3, 2, 17, 40, 6, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32, false,
                 matrix_alpha_of(2, 6, false));
    matrix_one(d, &MATRIX_BASE, 1, false, true);
    matrix_one(d, &MATRIX_VARIANTS[4], 1, false, false);
    free(d);
    printf("MATRIX many parameters: done\n");
}

/* The threshold mode must have split runs: copies per op over the threshold in a call that
 * also ran batches. */
static bool split_seen(const char *what) {
    printf("threshold mode: %llu copies per op over the threshold, %llu copies batched, %llu "
           "call(s) with both (all %s, last calls)\n",
           (unsigned long long)split_over_seen, (unsigned long long)split_batched_seen,
           (unsigned long long)split_both_calls, what);
    if (split_both_calls > 0) return true;
    printf("FAIL: the threshold mode never issued copies per op over the threshold in a call "
           "that also ran batches\n");
    return false;
}

static void watchdog(int sig) {
    (void)sig;
    static const char msg[] = "FAIL: test_fabric_cuda --matrix ran 300 s past its budget\n";
    if (write(STDOUT_FILENO, msg, sizeof(msg) - 1) < 0) _exit(3);
    _exit(3);
}

static int run_matrix(double max_seconds) {
    static const int NODES[] = {1, 2, 3, 4, 5, 8, 9};
    static const int GPUS[] = {1, 2, 4, 8};
    CK(cudaGetDeviceCount(&mx.devices));
    mx.min_free = least_free(true);
    const double t0 = now_s();
    mx.deadline_s = t0 + max_seconds;
    signal(SIGALRM, watchdog);
    alarm((unsigned)max_seconds + 300);

    matrix_many_params();
    /* Topologies in order of rank count, so that a budget cut leaves out the largest. */
    int order[28][3], count = 0;
    for (int mi = 0; mi < 7; ++mi)
        for (int li = 0; li < 4; ++li) {
            order[count][0] = NODES[mi];
            order[count][1] = GPUS[li];
            order[count][2] = mi * 4 + li; /* test_matrix.c's index */
            ++count;
        }
    for (int i = 1; i < count; ++i) /* insertion sort by N, stable */
        for (int j = i; j > 0 && order[j][0] * order[j][1] < order[j - 1][0] * order[j - 1][1];
             --j) {
            int t[3];
            memcpy(t, order[j], sizeof(t));
            memcpy(order[j], order[j - 1], sizeof(t));
            memcpy(order[j - 1], t, sizeof(t));
        }
    char missed[512] = "";
    for (int i = 0; i < count; ++i) {
        if (now_s() > mx.deadline_s) {
            const size_t used = strlen(missed);
            snprintf(missed + used, sizeof(missed) - used, " %dx%d", order[i][0], order[i][1]);
            continue;
        }
        matrix_topology(order[i][0], order[i][1], order[i][2]);
    }
    alarm(0);
    if (batch_kernels_seen == 0 && mx.compared > 0) {
        printf("FAIL: the batched mode ran no batched copy kernel in any configuration\n");
        ++mx.failed;
    }
    if (mx.compared > 0 && !split_seen("configurations")) ++mx.failed;
    mx.failed += !ag_direct_seen("configurations");
    printf("configuration matrix on the CUDA fabric: %d configuration(s) compared with the CPU "
           "fabric bit for bit (%d also per op), %d failed; largest topology compared: %d "
           "ranks; %d skipped for GPU memory, %d refused by the planner, %d configuration(s) of "
           "started topologies not reached within --max-seconds %.0f (%.1f s used)%s%s\n",
           mx.compared, mx.per_op, mx.failed, mx.max_n_compared, mx.skipped_memory, mx.refused,
           mx.not_reached, max_seconds, now_s() - t0,
           missed[0] ? "; topologies not started:" : "", missed);
    if (mx.compared == 0) printf("FAIL: no configuration was compared\n");
    return mx.failed != 0 || mx.compared == 0;
}

int main(int argc, char **argv) {
    bool small = false, matrix = false;
    double max_seconds = 240;
    uint64_t seed = 0;
    for (int i = 1; i < argc; ++i) {
        char *end = NULL;
        if (strcmp(argv[i], "--small") == 0) {
            small = true;
        } else if (strcmp(argv[i], "--matrix") == 0) {
            matrix = true;
        } else if (strcmp(argv[i], "--max-seconds") == 0 && i + 1 < argc) {
            max_seconds = strtod(argv[++i], &end);
            if (*end != '\0' || !(max_seconds > 0 && max_seconds < 86400)) {
                fprintf(stderr, "test_fabric_cuda: --max-seconds needs a number in (0, 86400)\n");
                return 2;
            }
        } else {
            seed = strtoull(argv[i], &end, 0);
            if (argv[i][0] == '-' || *end != '\0') {
                fprintf(stderr, "usage: test_fabric_cuda [--small | --matrix [--max-seconds S]] "
                                "[seed]\n");
                return 2;
            }
        }
    }
    if (small && matrix) {
        fprintf(stderr, "test_fabric_cuda: --small and --matrix exclude each other\n");
        return 2;
    }
    if (seed == 0) seed = (uint64_t)time(NULL);
    rng_state = seed;
    printf("test_fabric_cuda seed %llu%s\n", (unsigned long long)seed,
           small ? " (small)" : matrix ? " (matrix)" : "");
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices < 1) {
        printf("FAIL: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none");
        return 1;
    }
    if (matrix) return run_matrix(max_seconds);
    static const int topo[][2] = {{1, 2}, {1, 8}, {2, 2}, {2, 4}, {3, 2}, {4, 2}};
    int failed = 0, run = 0;
    for (size_t t = 0; t < sizeof(topo) / sizeof(topo[0]); ++t)
        for (int v = 0; v < 4; ++v) {
            if (small && (v != (int)t % 4 || t % 2 == 1)) continue;
            ++run;
            failed += !run_case(topo[t][0], topo[t][1], v, !small);
        }
    if (batch_kernels_seen == 0) {
        printf("FAIL: the batched mode ran no batched copy kernel in any case\n");
        ++failed;
    }
    printf("batched copy kernels: %llu, running %llu copies (all cases, last calls)\n",
           (unsigned long long)batch_kernels_seen, (unsigned long long)batch_copies_seen);
    /* With TIDE_CUDA_SLICES set the sums and landings must really have run sliced. */
    const char *slices_env = getenv("TIDE_CUDA_SLICES");
    if (slices_env != NULL && atoi(slices_env) > 1 && sliced_seen == 0) {
        printf("FAIL: TIDE_CUDA_SLICES=%s, yet no sum or landing ran as several launches\n",
               slices_env);
        ++failed;
    }
    printf("sliced launches past one per op: %llu (all cases, last calls)\n",
           (unsigned long long)sliced_seen);
    failed += !ag_direct_seen("cases");
    if (!small) {
        failed += !split_seen("cases");
        const int modes[3] = {MODE_BATCHED, MODE_THRESHOLD, MODE_PER_OP};
        for (int mi = 0; mi < 3; ++mi)
            failed += !enqueue_timer(modes[mi]);
    }
    printf("%d case(s) x %d modes, %d failed\n", run, small ? 2 : 3, failed);
    return failed != 0;
}
