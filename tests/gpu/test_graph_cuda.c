/*
 * test_graph_cuda.c - TIDE-AG and TIDE-RS captured into one CUDA graph and replayed, bit for
 * bit against eager calls on the same inputs (GPU machine; docs/cuda-fabric.md, "CUDA graphs").
 *
 * For 1 x 4, 1 x 8 and 2 x 2 on the single-process CUDA fabric (virtual ranks on the visible
 * GPUs), each with batched copies and direct mode (the default) and with per-op copies,
 * two groups (bf16 all-gather of bf16 shards with bf16 gradients; fp32 master shards cast to
 * a bf16 all-gather with fp32 gradients) run one "step": per group three all-gathers (slots
 * 0, 1, 0, each landing copied out on the rank's stream) and four reduce-scatters covering
 * both modes with and without accumulate, consecutive calls of one mode included (so that
 * the captured calls take both schedule forms and wait on fences inside the capture).  The
 * step runs once eagerly (programs prepared), then is captured on rank 0's stream with the
 * other ranks' streams forked from it, instantiated, and replayed 20 times.  Before each
 * replay new inputs are written into the same buffers with cudaMemcpy outside the graph
 * (shards, gradients, accumulated outputs: wide-exponent values, 2^-40 .. 2^40; written
 * outputs and copied-out landings poisoned); after it the same inputs are written again and
 * the step runs eagerly.  Every landing and output of every rank must be equal, byte for
 * byte, and no output may keep its poison.  Eager steps between replays also check that
 * eager calls after captured ones stay right.
 *
 * Odd replays launch the graph twice back to back, against two eager steps.
 *
 * Negative cases: the first call of a program inside a capture returns TIDE_ERR_UNSUPPORTED
 * and leaves the group usable; an eager call while a capture holds the fabric's streams
 * returns TIDE_ERR_UNSUPPORTED and leaves the capture intact.  An all-gather of the
 * one-process-per-rank fabric (1 x 1) is captured and replayed, and its family is replay-only
 * after (an eager call is refused).
 *
 * Usage: test_graph_cuda [seed [replays]] (default 26 and 20; run.sh's memcheck step runs 3).
 * Exit status 0 only if every comparison matched.
 */
#include "api/comm.h"
#include "kernels/kernels.h"
#include "fabric/cuda/cuda.h"
#include "fabric/cuda/mp.h"
#include "plan/plan.h"
#include "tide.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_RANKS 8
#define GROUPS 2
#define AG_CALLS 3
#define RS_CALLS 4
#define MAX_P 4
#define REPLAYS 20 /* default; the second argument overrides */

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "FAIL: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,                       \
                    cudaGetErrorString(e_));                                                       \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

#define TK(x)                                                                                      \
    do {                                                                                           \
        tide_result_t r_ = (x);                                                                    \
        if (r_ != TIDE_SUCCESS) {                                                                  \
            fprintf(stderr, "FAIL: %s:%d: %s: %s\n", __FILE__, __LINE__, #x,                       \
                    tide_get_last_error());                                                        \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static const tide_rs_mode_t rs_mode[GROUPS][RS_CALLS] = {
    {TIDE_RS_IN_PLACE, TIDE_RS_IN_PLACE, TIDE_RS_SLOT_REUSE, TIDE_RS_SLOT_REUSE},
    {TIDE_RS_SLOT_REUSE, TIDE_RS_SLOT_REUSE, TIDE_RS_IN_PLACE, TIDE_RS_IN_PLACE}};
static const int rs_acc[GROUPS][RS_CALLS] = {{0, 1, 1, 0}, {1, 0, 0, 1}};

typedef struct {
    int n;
    tide_comm_t comms[MAX_RANKS];
    tide_group_t groups[GROUPS][MAX_RANKS];
    const struct tide_plan *plan[GROUPS];
    float alpha[GROUPS];
    int device[MAX_RANKS];
    cudaStream_t stream[MAX_RANKS];
    cudaEvent_t fork, join[MAX_RANKS];
    size_t shard_bytes[GROUPS], land_bytes[GROUPS], out_bytes[GROUPS], grad_bytes[GROUPS][MAX_P];
    void *shard[GROUPS][AG_CALLS][MAX_RANKS];
    const void *grads[GROUPS][RS_CALLS][MAX_RANKS][MAX_P];
    float *out[GROUPS][RS_CALLS][MAX_RANKS];
    uint8_t *ag_res[GROUPS][AG_CALLS][MAX_RANKS];
    void *mem[MAX_RANKS]; /* every buffer of rank r, carved */
    size_t mem_bytes;
} world_t;

static uint64_t rng;
static int replays = REPLAYS;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* sign x 2^e x (1 + f), e in [-40, 40]: sums whose terms differ by up to 2^80. */
static float wide(void) {
    const uint64_t v = rnd();
    const int e = (int)(v % 81) - 40;
    const float f = (float)((v >> 8) & 0xffffff) / 16777216.0f;
    return ldexpf(1.0f + f, e) * ((v >> 40) & 1 ? -1.0f : 1.0f);
}

static void fill_wide(void *host, size_t bytes, int item) {
    if (item == 2)
        for (size_t i = 0; i < bytes / 2; ++i)
            ((uint16_t *)host)[i] = tide_float_to_bf16(wide());
    else
        for (size_t i = 0; i < bytes / 4; ++i)
            ((float *)host)[i] = wide();
}

static size_t align_up(size_t v) {
    return (v + 255) & ~(size_t)255;
}

static void world_open(world_t *w, int m, int l) {
    memset(w, 0, sizeof(*w));
    w->n = m * l;
    TK(tide_comm_init_all(TIDE_FABRIC_CUDA, m, l, w->comms));
    for (int g = 0; g < GROUPS; ++g) {
        tide_param_shape_t shapes[MAX_P];
        const int np = 3 + g;
        for (int p = 0; p < np; ++p)
            shapes[p] = (tide_param_shape_t){.dim0 = 1 + rnd() % (uint64_t)(5 * w->n),
                                             .inner = 1 + rnd() % 9};
        tide_config_t cfg = TIDE_CONFIG_INIT;
        cfg.nodes = m;
        cfg.gpus_per_node = l;
        cfg.mode = rs_mode[g][0];
        const tide_group_desc_t desc = {np, shapes, TIDE_DTYPE_BF16,
                                        g == 0 ? TIDE_DTYPE_BF16 : TIDE_DTYPE_FP32,
                                        g == 0 ? TIDE_DTYPE_BF16 : TIDE_DTYPE_FP32};
        for (int r = 0; r < w->n; ++r)
            TK(tide_group_register(w->comms[r], &cfg, &desc, &w->groups[g][r]));
        tide_plan_t plan = NULL;
        TK(tide_group_plan(w->groups[g][0], &plan));
        w->plan[g] = plan;
        const tide_geom_t *ge = &plan->geom;
        w->shard_bytes[g] = ge->cast ? ge->fp32_shard_bytes : ge->shard_bytes;
        w->land_bytes[g] = ge->group_bytes;
        w->out_bytes[g] = ge->fp32_shard_bytes;
        for (int p = 0; p < np; ++p)
            w->grad_bytes[g][p] = ge->params[p].dim0 * ge->params[p].inner * ge->grad_item;
        w->alpha[g] = g == 0 ? tide_alpha_avg(w->n) : 0.75f;
    }
    size_t per = 0;
    for (int g = 0; g < GROUPS; ++g) {
        per += AG_CALLS * (align_up(w->shard_bytes[g]) + align_up(w->land_bytes[g]));
        per += RS_CALLS * align_up(w->out_bytes[g]);
        for (int p = 0; p < w->plan[g]->geom.num_params; ++p)
            per += RS_CALLS * align_up(w->grad_bytes[g][p]);
    }
    w->mem_bytes = per;
    for (int r = 0; r < w->n; ++r) {
        w->device[r] = tide_cuda_world_device(w->comms[r]->world);
        CK(cudaSetDevice(w->device[r]));
        CK(cudaStreamCreateWithFlags(&w->stream[r], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&w->join[r], cudaEventDisableTiming));
        CK(cudaMalloc(&w->mem[r], per));
        uint8_t *at = w->mem[r];
        for (int g = 0; g < GROUPS; ++g) {
            for (int k = 0; k < AG_CALLS; ++k) {
                w->shard[g][k][r] = at;
                at += align_up(w->shard_bytes[g]);
                w->ag_res[g][k][r] = at;
                at += align_up(w->land_bytes[g]);
            }
            for (int k = 0; k < RS_CALLS; ++k) {
                w->out[g][k][r] = (float *)at;
                at += align_up(w->out_bytes[g]);
                for (int p = 0; p < w->plan[g]->geom.num_params; ++p) {
                    w->grads[g][k][r][p] = at;
                    at += align_up(w->grad_bytes[g][p]);
                }
            }
        }
    }
    CK(cudaSetDevice(w->device[0]));
    CK(cudaEventCreateWithFlags(&w->fork, cudaEventDisableTiming));
}

static void world_close(world_t *w) {
    for (int r = 0; r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        CK(cudaDeviceSynchronize());
    }
    for (int g = 0; g < GROUPS; ++g)
        for (int r = 0; r < w->n; ++r)
            TK(tide_group_deregister(w->groups[g][r]));
    for (int r = 0; r < w->n; ++r) {
        cudaFree(w->mem[r]);
        cudaStreamDestroy(w->stream[r]);
        cudaEventDestroy(w->join[r]);
        TK(tide_comm_destroy(w->comms[r]));
    }
    cudaEventDestroy(w->fork);
}

/* The inputs of one step from `seed`, written with cudaMemcpy outside any graph: every shard,
 * gradient and accumulated output; written outputs and the landing copies get 0xff bytes
 * (a NaN pattern no step writes). */
static void write_inputs(world_t *w, uint64_t seed) {
    rng = seed * 0x9e3779b97f4a7c15ull + 1;
    uint8_t *host = malloc(w->mem_bytes);
    if (host == NULL) exit(2);
    for (int r = 0; r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        uint8_t *base = w->mem[r];
        for (int g = 0; g < GROUPS; ++g) {
            const tide_geom_t *ge = &w->plan[g]->geom;
            for (int k = 0; k < AG_CALLS; ++k) {
                fill_wide(host + ((uint8_t *)w->shard[g][k][r] - base), w->shard_bytes[g],
                          ge->cast ? 4 : 2);
                memset(host + (w->ag_res[g][k][r] - base), 0xff, w->land_bytes[g]);
            }
            for (int k = 0; k < RS_CALLS; ++k) {
                uint8_t *o = host + ((uint8_t *)w->out[g][k][r] - base);
                if (rs_acc[g][k])
                    fill_wide(o, w->out_bytes[g], 4);
                else
                    memset(o, 0xff, w->out_bytes[g]);
                for (int p = 0; p < ge->num_params; ++p)
                    fill_wide(host + ((const uint8_t *)w->grads[g][k][r][p] - base),
                              w->grad_bytes[g][p], (int)ge->grad_item);
            }
        }
        CK(cudaMemcpy(w->mem[r], host, w->mem_bytes, cudaMemcpyHostToDevice));
    }
    free(host);
    /* From pageable memory cudaMemcpy may return before its DMA has landed (CUDA's "API
     * synchronization behavior"), and the fabric's and the ranks' streams are non-blocking:
     * without this, the step or graph launched next could read the last rank's old inputs, or
     * see the poison land over what it wrote. */
    for (int r = 0; r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        CK(cudaDeviceSynchronize());
    }
}

/* One step's collectives on the ranks' streams (eager, or captured: the caller forks). */
static bool step(world_t *w) {
    for (int g = 0; g < GROUPS; ++g)
        for (int k = 0; k < AG_CALLS; ++k) {
            for (int r = 0; r < w->n; ++r) {
                CK(cudaSetDevice(w->device[r]));
                if (tide_all_gather(w->groups[g][r], w->shard[g][k][r], k % 2, w->stream[r]) !=
                    TIDE_SUCCESS) {
                    fprintf(stderr, "FAIL: all_gather g%d call %d rank %d: %s\n", g, k, r,
                            tide_get_last_error());
                    return false;
                }
            }
            for (int r = 0; r < w->n; ++r) {
                void *land = NULL;
                TK(tide_group_landing(w->groups[g][r], k % 2, &land));
                CK(cudaSetDevice(w->device[r]));
                CK(cudaMemcpyAsync(w->ag_res[g][k][r], land, w->land_bytes[g],
                                   cudaMemcpyDeviceToDevice, w->stream[r]));
            }
        }
    for (int g = 0; g < GROUPS; ++g)
        for (int k = 0; k < RS_CALLS; ++k)
            for (int r = 0; r < w->n; ++r) {
                CK(cudaSetDevice(w->device[r]));
                if (tide_reduce_scatter(w->groups[g][r], w->grads[g][k][r], w->out[g][k][r],
                                        w->alpha[g], rs_acc[g][k], rs_mode[g][k],
                                        w->stream[r]) != TIDE_SUCCESS) {
                    fprintf(stderr, "FAIL: reduce_scatter g%d call %d rank %d: %s\n", g, k, r,
                            tide_get_last_error());
                    return false;
                }
            }
    return true;
}

static void sync_all(world_t *w) {
    for (int r = 0; r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        CK(cudaStreamSynchronize(w->stream[r]));
    }
}

static void read_all(world_t *w, uint8_t *host) {
    sync_all(w);
    for (int r = 0; r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        CK(cudaMemcpy(host + (size_t)r * w->mem_bytes, w->mem[r], w->mem_bytes,
                      cudaMemcpyDeviceToHost));
    }
}

/* Begin a capture on rank 0's stream and fork every other rank's stream from it. */
static void capture_begin(world_t *w) {
    CK(cudaSetDevice(w->device[0]));
    CK(cudaStreamBeginCapture(w->stream[0], cudaStreamCaptureModeGlobal));
    CK(cudaEventRecord(w->fork, w->stream[0]));
    for (int r = 1; r < w->n; ++r)
        CK(cudaStreamWaitEvent(w->stream[r], w->fork, 0));
}

static cudaGraph_t capture_end(world_t *w) {
    for (int r = 1; r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        CK(cudaEventRecord(w->join[r], w->stream[r]));
        CK(cudaSetDevice(w->device[0]));
        CK(cudaStreamWaitEvent(w->stream[0], w->join[r], 0));
    }
    CK(cudaSetDevice(w->device[0]));
    cudaGraph_t graph = NULL;
    CK(cudaStreamEndCapture(w->stream[0], &graph));
    return graph;
}

/* First difference between the replay's and the eager step's results of rank r, or a
 * poisoned output; false with a message. */
static bool compare(world_t *w, const uint8_t *a, const uint8_t *b, int replay) {
    for (int r = 0; r < w->n; ++r) {
        const uint8_t *base = w->mem[r];
        const uint8_t *ar = a + (size_t)r * w->mem_bytes, *br = b + (size_t)r * w->mem_bytes;
        for (int g = 0; g < GROUPS; ++g) {
            for (int k = 0; k < AG_CALLS; ++k) {
                const size_t off = (size_t)(w->ag_res[g][k][r] - base);
                if (memcmp(ar + off, br + off, w->land_bytes[g]) != 0) {
                    fprintf(stderr, "FAIL: replay %d: group %d all-gather %d rank %d differs\n",
                            replay, g, k, r);
                    return false;
                }
            }
            for (int k = 0; k < RS_CALLS; ++k) {
                const size_t off = (size_t)((const uint8_t *)w->out[g][k][r] - base);
                if (memcmp(ar + off, br + off, w->out_bytes[g]) != 0) {
                    fprintf(stderr,
                            "FAIL: replay %d: group %d reduce-scatter %d (%s, accumulate %d) "
                            "rank %d differs\n",
                            replay, g, k,
                            rs_mode[g][k] == TIDE_RS_IN_PLACE ? "in-place" : "slot-reuse",
                            rs_acc[g][k], r);
                    return false;
                }
                const uint32_t *o = (const uint32_t *)(ar + off);
                for (size_t i = 0; i < w->out_bytes[g] / 4; ++i)
                    if (o[i] == 0xffffffffu) {
                        fprintf(stderr,
                                "FAIL: replay %d: group %d reduce-scatter %d rank %d element %zu "
                                "was never written\n",
                                replay, g, k, r, i);
                        return false;
                    }
            }
        }
    }
    return true;
}

/* Whether every landing copy and output of two runs' host images is the same. */
static bool outputs_same(const world_t *w, const uint8_t *a, const uint8_t *b) {
    for (int r = 0; r < w->n; ++r) {
        const uint8_t *base = w->mem[r];
        const size_t at = (size_t)r * w->mem_bytes;
        for (int g = 0; g < GROUPS; ++g) {
            for (int k = 0; k < AG_CALLS; ++k) {
                const size_t off = at + (size_t)(w->ag_res[g][k][r] - base);
                if (memcmp(a + off, b + off, w->land_bytes[g]) != 0) return false;
            }
            for (int k = 0; k < RS_CALLS; ++k) {
                const size_t off = at + (size_t)((const uint8_t *)w->out[g][k][r] - base);
                if (memcmp(a + off, b + off, w->out_bytes[g]) != 0) return false;
            }
        }
    }
    return true;
}

/* The first call of a program inside a capture is refused on every rank (nothing is
 * recorded); the group stays usable (the eager step after it runs the same program). */
static bool negative_first_call(world_t *w) {
    capture_begin(w);
    bool ok = true;
    char msg[512] = "";
    for (int r = 0; r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        const tide_result_t res =
            tide_reduce_scatter(w->groups[0][r], w->grads[0][0][r], w->out[0][0][r], 1.0f, 0,
                                rs_mode[0][0], w->stream[r]);
        snprintf(msg, sizeof(msg), "%s", tide_get_last_error());
        if (res != TIDE_ERR_UNSUPPORTED || strstr(msg, "CUDA graph") == NULL) {
            fprintf(stderr,
                    "FAIL: rank %d: a captured call of an unprepared program returned %s "
                    "(%s)\n",
                    r, tide_get_error_string(res), msg);
            ok = false;
        }
    }
    cudaGraph_t graph = capture_end(w);
    CK(cudaGraphDestroy(graph));
    if (ok) printf("PASS negative: unprepared program in a capture: %s\n", msg);
    return ok;
}

/* An eager call while a capture holds the fabric's streams (group 0's all-gather captured,
 * the capture not ended) is refused on every rank, on streams outside the capture; the
 * capture ends intact and both groups stay usable. */
static bool negative_foreign_capture(world_t *w) {
    cudaStream_t eager[MAX_RANKS];
    for (int r = 0; r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        CK(cudaStreamCreateWithFlags(&eager[r], cudaStreamNonBlocking));
    }
    capture_begin(w);
    bool ok = true;
    char msg[512] = "";
    for (int r = 0; ok && r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        if (tide_all_gather(w->groups[0][r], w->shard[0][0][r], 0, w->stream[r]) != TIDE_SUCCESS) {
            fprintf(stderr, "FAIL: captured all_gather rank %d: %s\n", r, tide_get_last_error());
            ok = false;
        }
    }
    for (int r = 0; ok && r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        const tide_result_t res = tide_all_gather(w->groups[1][r], w->shard[1][0][r], 0, eager[r]);
        snprintf(msg, sizeof(msg), "%s", tide_get_last_error());
        if (res != TIDE_ERR_UNSUPPORTED || strstr(msg, "still under way") == NULL) {
            fprintf(stderr, "FAIL: rank %d: an eager call during a capture returned %s (%s)\n", r,
                    tide_get_error_string(res), msg);
            ok = false;
        }
    }
    cudaGraph_t graph = capture_end(w);
    CK(cudaGraphDestroy(graph));
    for (int r = 0; r < w->n; ++r) {
        CK(cudaSetDevice(w->device[r]));
        CK(cudaStreamSynchronize(eager[r]));
        CK(cudaStreamDestroy(eager[r]));
    }
    if (ok) printf("PASS negative: eager call during a capture: %s\n", msg);
    return ok;
}

/* The one-process-per-rank fabric (1 x 1): a captured all-gather replays (mp_graph.c; N > 1
 * is test_graph_cuda_mp) with its landing bit for bit an eager call's of the same shard, and
 * the family is replay-only: an eager all-gather after the capture is refused. */
#define MP_REPLAYS 5
static void mp_pattern(uint8_t *p, size_t bytes, int k) {
    for (size_t i = 0; i < bytes; ++i)
        p[i] = (uint8_t)(i * 7 + (size_t)k * 13 + 1);
}

static bool mp_capture_one_rank(void) {
    tide_comm_t comm = NULL;
    char name[64];
    snprintf(name, sizeof(name), "graph26_%d", (int)getpid());
    CK(cudaSetDevice(0));
    TK(tide_comm_init_rank(TIDE_FABRIC_CUDA, 1, 1, 0, name, &comm));
    const tide_param_shape_t shape = {.dim0 = 7, .inner = 3};
    const tide_group_desc_t desc = {1, &shape, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    tide_config_t cfg = TIDE_CONFIG_INIT;
    tide_group_t group = NULL;
    TK(tide_group_register(comm, &cfg, &desc, &group));
    const size_t bytes = group->plan->geom.shard_bytes, lbytes = group->plan->geom.group_bytes;
    void *shard = NULL, *land = NULL;
    CK(cudaMalloc(&shard, bytes));
    TK(tide_group_landing(group, 0, &land));
    cudaStream_t s = NULL;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint8_t *in = malloc(bytes), *want = malloc(MP_REPLAYS * lbytes), *got = malloc(lbytes);
    if (in == NULL || want == NULL || got == NULL) exit(2);
    /* The references: eager calls of the shards the replays will gather. */
    for (int k = 0; k < MP_REPLAYS; ++k) {
        mp_pattern(in, bytes, k);
        CK(cudaMemcpyAsync(shard, in, bytes, cudaMemcpyHostToDevice, s));
        TK(tide_all_gather(group, shard, 0, s));
        CK(cudaMemcpyAsync(want + (size_t)k * lbytes, land, lbytes, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
    }
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    const tide_result_t res = tide_all_gather(group, shard, 0, s);
    cudaGraph_t graph = NULL;
    CK(cudaStreamEndCapture(s, &graph));
    bool ok = res == TIDE_SUCCESS;
    if (!ok)
        fprintf(stderr,
                "FAIL: a captured call on the one-process-per-rank fabric returned %s (%s)\n",
                tide_get_error_string(res), tide_get_last_error());
    cudaGraphExec_t exec = NULL;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int k = MP_REPLAYS - 1; ok && k >= 0; --k) {
        mp_pattern(in, bytes, k);
        CK(cudaMemcpyAsync(shard, in, bytes, cudaMemcpyHostToDevice, s));
        CK(cudaGraphLaunch(exec, s));
        CK(cudaMemcpyAsync(got, land, lbytes, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        if (tide_cuda_mp_sync(group->arena, TIDE_COLL_ALL_GATHER) != TIDE_SUCCESS ||
            memcmp(got, want + (size_t)k * lbytes, lbytes) != 0) {
            fprintf(stderr, "FAIL: replay of shard %d of a captured all-gather at 1 x 1: %s\n", k,
                    tide_get_last_error());
            ok = false;
        }
    }
    const tide_result_t eager = tide_all_gather(group, shard, 0, s);
    if (ok && (eager != TIDE_ERR_UNSUPPORTED ||
               strstr(tide_get_last_error(), "only be replayed") == NULL)) {
        fprintf(stderr, "FAIL: an eager all-gather after the capture returned %s (%s)\n",
                tide_get_error_string(eager), tide_get_last_error());
        ok = false;
    }
    if (ok)
        printf("PASS one-process-per-rank fabric (1 x 1): %d replays of a captured all-gather, "
               "bit for bit eager calls; then eagerly: %s\n",
               MP_REPLAYS, tide_get_last_error());
    free(in);
    free(want);
    free(got);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(shard));
    TK(tide_group_deregister(group));
    TK(tide_comm_destroy(comm));
    return ok;
}

static bool run_topology(int m, int l, uint64_t seed) {
    world_t *w = calloc(1, sizeof(*w));
    if (w == NULL) exit(2);
    rng = seed;
    world_open(w, m, l);
    uint8_t *a = malloc((size_t)w->n * w->mem_bytes), *b = malloc((size_t)w->n * w->mem_bytes);
    uint8_t *prev = calloc((size_t)w->n, w->mem_bytes);
    if (a == NULL || b == NULL || prev == NULL) exit(2);
    bool ok = negative_first_call(w);
    /* Eager once: every program prepared, the refused one included. */
    write_inputs(w, seed);
    ok = ok && step(w);
    sync_all(w);
    capture_begin(w);
    const bool captured = step(w);
    cudaGraph_t graph = capture_end(w);
    cudaGraphExec_t exec = NULL;
    if (!captured) ok = false;
    if (ok) CK(cudaGraphInstantiate(&exec, graph, 0));
    size_t nodes = 0;
    CK(cudaGraphGetNodes(graph, NULL, &nodes));
    int changed = 0;
    for (int k = 0; ok && k < replays; ++k) {
        /* Odd replays launch twice back to back (a launch right after a launch), against two
         * eager steps on the same inputs (the accumulating outputs accumulate twice). */
        const int steps = 1 + k % 2;
        write_inputs(w, seed + 1000 + (uint64_t)k);
        CK(cudaSetDevice(w->device[0]));
        for (int j = 0; j < steps; ++j)
            CK(cudaGraphLaunch(exec, w->stream[0]));
        read_all(w, a);
        write_inputs(w, seed + 1000 + (uint64_t)k);
        for (int j = 0; ok && j < steps; ++j)
            ok = step(w);
        if (!ok) break;
        read_all(w, b);
        ok = compare(w, a, b, k);
        changed += !outputs_same(w, a, prev);
        memcpy(prev, a, (size_t)w->n * w->mem_bytes);
    }
    if (ok && changed != replays) {
        fprintf(stderr, "FAIL: only %d of %d replays changed their results with their inputs\n",
                changed, replays);
        ok = false;
    }
    /* The refused eager calls leave a world whose next eager step still runs. */
    if (ok) ok = negative_foreign_capture(w) && step(w);
    if (ok) sync_all(w);
    printf("%s graph %dx%d: %d groups, %d all-gathers + %d reduce-scatters per group, %zu graph "
           "nodes, %d replays bit-equal to eager\n",
           ok ? "PASS" : "FAIL", m, l, GROUPS, AG_CALLS, RS_CALLS, nodes, ok ? replays : 0);
    if (exec != NULL) CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    world_close(w);
    free(a);
    free(b);
    free(prev);
    free(w);
    return ok;
}

int main(int argc, char **argv) {
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 26;
    if (argc > 2) replays = atoi(argv[2]);
    if (replays < 2) {
        fprintf(stderr, "FAIL: replays = %d, need at least 2\n", replays);
        return 2;
    }
    /* The copy paths a world takes (read when it is created): batched copies with every
     * direct-mode shortcut (the default), and per-op copies without direct mode. */
    static const struct {
        const char *name, *batch, *direct;
    } paths[] = {{"batched, direct 31", "1", "31"}, {"per op, direct 0", "0", "0"}};
    static const int topo[][2] = {{1, 4}, {1, 8}, {2, 2}};
    bool ok = true;
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); ++i) {
        setenv("TIDE_CUDA_BATCH", paths[i].batch, 1);
        setenv("TIDE_CUDA_DIRECT", paths[i].direct, 1);
        printf("copies: %s\n", paths[i].name);
        for (size_t t = 0; t < sizeof(topo) / sizeof(topo[0]); ++t)
            ok = run_topology(topo[t][0], topo[t][1], seed + 17 * i + t) && ok;
    }
    ok = mp_capture_one_rank() && ok;
    printf("%s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
