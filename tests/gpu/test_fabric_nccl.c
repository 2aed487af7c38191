/*
 * test_fabric_nccl.c - the NCCL fabric's single-rank communicator path against the CPU
 * fabric, bit for bit (GPU machine, one GPU, NCCL >= 2.28 loadable).
 *
 * Both ways of making a TIDE communicator on the NCCL fabric are run:
 *   comm   the test loads libnccl.so.2 itself (as torch would), creates a one-rank ncclComm_t
 *          and hands it to tide_comm_init_nccl_comm: TIDE must find that same library
 *          (RTLD_NOLOAD) and split its node communicator from the caller's;
 *   id     tide_nccl_get_unique_id + tide_comm_init_nccl: TIDE creates the communicator.
 * On each, every case registers one group (N = 1), runs CALLS all-gathers (slots 0, 1, 0,
 * 1) and CALLS reduce-scatters (accumulate on and off, mode switches in some cases) on one
 * stream back to back, copies every landing and output back after its call, and compares
 * them with memcmp against the CPU fabric's run of the same inputs.  Inputs use wide
 * exponents (alpha * g + out rounds; the cast rounds fp32 to bf16).  Without a cast the
 * landing must also equal the shard (N = 1: the landing slot is the shard).
 *
 * Then the refusals that need a loaded library: a topology that does not match the caller's
 * communicator (TIDE_ERR_INVALID_ARGUMENT), and M = 2: without TIDE_NCCL_RAILS=1
 * TIDE_ERR_UNSUPPORTED naming the variable, on both paths before any NCCL call; with it, over
 * the one-rank communicator, TIDE_ERR_INVALID_ARGUMENT from the rank-count check (the
 * opt-in moved the refusal on, and one process cannot run M = 2: no collective is entered,
 * so nothing waits).  The unique-id path is not tried with the opt-in: its
 * ncclCommInitRankConfig would wait for a second rank that never comes.
 *
 * The multi-rank path (N > 1, one GPU per rank: NCCL refuses two ranks of a communicator on
 * one GPU) is not run here; docs/nccl-fabric.md says where it is covered.
 *
 * Exit status: 0 all passed; 1 a mismatch or a failed call; 2 setup (no GPU, no libnccl).
 */
#include "api/comm.h"
#include "fabric/cuda/mp.h"
#include "kernels/kernels.h"
#include "plan/plan.h"
#include "tide.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALLS 4
#define MAX_PARAMS 8
#define CASES 10

static int failures;

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "FAIL: %s:%d %s: %s\n", __FILE__, __LINE__, #call,                     \
                    cudaGetErrorString(e_));                                                       \
            return false;                                                                          \
        }                                                                                          \
    } while (0)
#define TK(call)                                                                                   \
    do {                                                                                           \
        tide_result_t r_ = (call);                                                                 \
        if (r_ != TIDE_SUCCESS) {                                                                  \
            fprintf(stderr, "FAIL: %s:%d %s: %s (%s)\n", __FILE__, __LINE__, #call,                \
                    tide_get_error_string(r_), tide_get_last_error());                             \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

#define HOST_RAND_SEED 0x9e3779b97f4a7c15ull
#define HOST_RAND_WIDE_EXP 20
#include "host_rand.h"

typedef struct {
    char what[160];
    tide_config_t cfg;
    tide_param_shape_t shapes[MAX_PARAMS];
    tide_group_desc_t desc;
    tide_plan_t plan;
    bool cast;
    float alpha;
    int accumulate[CALLS];
    tide_rs_mode_t modes[CALLS];
    size_t shard_operand, land_bytes, out_bytes;
    uint8_t *shards[CALLS];
    void *grads[CALLS][MAX_PARAMS];
    float *out0;
    uint8_t *land[2][CALLS]; /* [0]: CPU fabric, [1]: NCCL fabric */
    float *out[2][CALLS];
} case_t;

static bool case_init(case_t *c, int v) {
    memset(c, 0, sizeof(*c));
    const int p = 1 + v % 5;
    for (int i = 0; i < p; ++i)
        c->shapes[i] = (tide_param_shape_t){(uint64_t)rnd_int(1, 64), (uint64_t)rnd_int(1, 48)};
    const bool fp32_grads = v % 3 == 1;
    c->cast = v % 4 == 2;
    c->desc = (tide_group_desc_t){p, c->shapes, TIDE_DTYPE_BF16,
                                  fp32_grads ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16,
                                  c->cast ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16};
    c->cfg = (tide_config_t)TIDE_CONFIG_INIT;
    c->cfg.nodes = 1;
    c->cfg.gpus_per_node = 1;
    c->cfg.passes = 1 + v % 2;
    if (tide_plan_create(&c->cfg, &c->desc, &c->plan) != TIDE_SUCCESS) {
        fprintf(stderr, "FAIL: case %d: tide_plan_create: %s\n", v, tide_get_last_error());
        return false;
    }
    const tide_geom_t *g = &c->plan->geom;
    c->alpha = v % 3 == 0 ? 1.0f : v % 3 == 1 ? 1.3f : 0.3f;
    for (int e = 0; e < CALLS; ++e) {
        c->accumulate[e] = e > 0 && (v + e) % 2 == 0;
        /* Some cases switch modes between calls (the RS counters are shared). */
        c->modes[e] = (v % 2 == 0 || e % 3 != 2) ? TIDE_RS_IN_PLACE : TIDE_RS_SLOT_REUSE;
    }
    c->shard_operand = g->cast ? g->fp32_shard_bytes : g->shard_bytes;
    c->land_bytes = g->group_bytes;
    c->out_bytes = g->fp32_shard_bytes;
    for (int e = 0; e < CALLS; ++e) {
        c->shards[e] = xmalloc(c->shard_operand);
        if (g->cast) {
            for (size_t i = 0; i < c->shard_operand / 4; ++i)
                ((float *)c->shards[e])[i] = rnd_wide();
        } else {
            for (size_t i = 0; i < c->shard_operand / 2; ++i)
                ((uint16_t *)c->shards[e])[i] = tide_float_to_bf16(rnd_wide());
        }
        for (int q = 0; q < g->num_params; ++q) {
            const uint64_t elems = g->params[q].dim0 * g->params[q].inner;
            c->grads[e][q] = xmalloc(elems * g->grad_item);
            for (uint64_t i = 0; i < elems; ++i) {
                const float x = rnd_wide();
                if (g->grad_item == 2)
                    ((uint16_t *)c->grads[e][q])[i] = tide_float_to_bf16(x);
                else
                    ((float *)c->grads[e][q])[i] = x;
            }
        }
        for (int f = 0; f < 2; ++f) {
            c->land[f][e] = xmalloc(c->land_bytes);
            c->out[f][e] = xmalloc(c->out_bytes);
        }
    }
    c->out0 = xmalloc(c->out_bytes);
    for (size_t i = 0; i < c->out_bytes / 4; ++i)
        c->out0[i] = rnd_wide();
    snprintf(c->what, sizeof(c->what),
             "case %d: P=%d grads=%s cast=%d passes=%d alpha=%g modes=%d%d%d%d acc=%d%d%d%d", v, p,
             fp32_grads ? "fp32" : "bf16", c->cast, c->cfg.passes, (double)c->alpha, c->modes[0],
             c->modes[1], c->modes[2], c->modes[3], c->accumulate[0], c->accumulate[1],
             c->accumulate[2], c->accumulate[3]);
    return true;
}

static void case_free(case_t *c) {
    for (int e = 0; e < CALLS; ++e) {
        free(c->shards[e]);
        for (int q = 0; q < c->desc.num_params; ++q)
            free(c->grads[e][q]);
        for (int f = 0; f < 2; ++f) {
            free(c->land[f][e]);
            free(c->out[f][e]);
        }
    }
    free(c->out0);
    tide_plan_destroy(c->plan);
}

/* A progress line before each step, unbuffered: a crash shows the step it happened in. */
static void step(const char *what) {
    printf("step: %s\n", what);
    fflush(stdout);
}

/* ------------------------------------------------------------------ the CPU fabric (oracle) */

static bool run_cpu(case_t *c) {
    tide_comm_t comm;
    TK(tide_comm_init_all(TIDE_FABRIC_CPU, 1, 1, &comm));
    tide_group_t grp;
    TK(tide_group_register(comm, &c->cfg, &c->desc, &grp));
    for (int e = 0; e < CALLS; ++e) {
        void *land = NULL;
        TK(tide_all_gather(grp, c->shards[e], e % 2, NULL));
        TK(tide_group_landing(grp, e % 2, &land));
        memcpy(c->land[0][e], land, c->land_bytes);
    }
    float *out = xmalloc(c->out_bytes);
    memcpy(out, c->out0, c->out_bytes);
    for (int e = 0; e < CALLS; ++e) {
        TK(tide_reduce_scatter(grp, (const void *const *)c->grads[e], out, c->alpha,
                               c->accumulate[e], c->modes[e], NULL));
        memcpy(c->out[0][e], out, c->out_bytes);
    }
    free(out);
    TK(tide_group_deregister(grp));
    TK(tide_comm_destroy(comm));
    return true;
}

/* ------------------------------------------------------------------ the NCCL fabric */

static bool run_nccl(tide_comm_t comm, case_t *c, cudaStream_t s) {
    const tide_geom_t *g = &c->plan->geom;
    tide_group_t grp;
    TK(tide_group_register(comm, &c->cfg, &c->desc, &grp));
    if (!tide_cuda_mp_is(grp->arena)) {
        fprintf(stderr, "FAIL: %s: the group's arena is not run by the mp execute\n", c->what);
        return false;
    }
    void *dshard[CALLS], *dgrad[CALLS][MAX_PARAMS], *dout;
    uint8_t *hland, *hout;
    CU(cudaMallocHost((void **)&hland, CALLS * c->land_bytes));
    CU(cudaMallocHost((void **)&hout, CALLS * c->out_bytes));
    for (int e = 0; e < CALLS; ++e) {
        CU(cudaMalloc(&dshard[e], c->shard_operand));
        CU(cudaMemcpy(dshard[e], c->shards[e], c->shard_operand, cudaMemcpyHostToDevice));
        for (int q = 0; q < g->num_params; ++q) {
            const size_t b = g->params[q].dim0 * g->params[q].inner * g->grad_item;
            CU(cudaMalloc(&dgrad[e][q], b));
            CU(cudaMemcpy(dgrad[e][q], c->grads[e][q], b, cudaMemcpyHostToDevice));
        }
    }
    CU(cudaMalloc(&dout, c->out_bytes));
    CU(cudaMemcpy(dout, c->out0, c->out_bytes, cudaMemcpyHostToDevice));
    /* cudaMemcpy from pageable memory may return before its DMA landed, and the calls run
     * on a non-blocking stream: finish the uploads first. */
    CU(cudaDeviceSynchronize());
    /* Back to back on one stream; each result copied out on it right after its call. */
    for (int e = 0; e < CALLS; ++e) {
        void *land = NULL;
        TK(tide_all_gather(grp, dshard[e], e % 2, s));
        TK(tide_group_landing(grp, e % 2, &land));
        CU(cudaMemcpyAsync(hland + e * c->land_bytes, land, c->land_bytes, cudaMemcpyDeviceToHost,
                           s));
    }
    for (int e = 0; e < CALLS; ++e) {
        TK(tide_reduce_scatter(grp, (const void *const *)dgrad[e], dout, c->alpha, c->accumulate[e],
                               c->modes[e], s));
        CU(cudaMemcpyAsync(hout + e * c->out_bytes, dout, c->out_bytes, cudaMemcpyDeviceToHost, s));
    }
    /* The fabric's own waits end at TIDE_TIMEOUT_MS instead of hanging. */
    TK(tide_cuda_mp_sync(grp->arena, TIDE_COLL_ALL_GATHER));
    TK(tide_cuda_mp_sync(grp->arena, TIDE_COLL_REDUCE_SCATTER));
    CU(cudaStreamSynchronize(s));
    for (int e = 0; e < CALLS; ++e) {
        memcpy(c->land[1][e], hland + e * c->land_bytes, c->land_bytes);
        memcpy(c->out[1][e], hout + e * c->out_bytes, c->out_bytes);
    }
    TK(tide_group_deregister(grp));
    for (int e = 0; e < CALLS; ++e) {
        CU(cudaFree(dshard[e]));
        for (int q = 0; q < g->num_params; ++q)
            CU(cudaFree(dgrad[e][q]));
    }
    CU(cudaFree(dout));
    CU(cudaFreeHost(hland));
    CU(cudaFreeHost(hout));
    return true;
}

static long first_diff(const void *a, const void *b, size_t n) {
    const uint8_t *x = a, *y = b;
    for (size_t i = 0; i < n; ++i)
        if (x[i] != y[i]) return (long)i;
    return -1;
}

static bool compare(const case_t *c, const char *path) {
    bool ok = true;
    for (int e = 0; e < CALLS; ++e) {
        long d = first_diff(c->land[0][e], c->land[1][e], c->land_bytes);
        if (d >= 0) {
            fprintf(stderr,
                    "FAIL: %s: %s: AG call %d: landing differs at byte %ld (%02x vs %02x)\n", path,
                    c->what, e, d, c->land[0][e][d], c->land[1][e][d]);
            ok = false;
        }
        if (!c->cast && c->land_bytes == c->shard_operand &&
            (d = first_diff(c->shards[e], c->land[1][e], c->land_bytes)) >= 0) {
            fprintf(stderr,
                    "FAIL: %s: %s: AG call %d: landing differs from the shard at byte %ld\n", path,
                    c->what, e, d);
            ok = false;
        }
        d = first_diff(c->out[0][e], c->out[1][e], c->out_bytes);
        if (d >= 0) {
            fprintf(stderr, "FAIL: %s: %s: RS call %d: output differs at float %ld: %a vs %a\n",
                    path, c->what, e, d / 4, (double)c->out[0][e][d / 4],
                    (double)c->out[1][e][d / 4]);
            ok = false;
        }
    }
    return ok;
}

/* Every case on one TIDE communicator of the NCCL fabric. */
static bool run_cases(tide_comm_t comm, case_t *cases, int num, const char *path) {
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    bool all = true;
    for (int k = 0; k < num; ++k) {
        printf("step: %s: %s\n", path, cases[k].what);
        const bool ran = run_nccl(comm, &cases[k], s);
        const bool ok = ran && compare(&cases[k], path);
        printf("%s %s: %s\n", ok ? "PASS" : "FAIL", path, cases[k].what);
        fflush(stdout);
        if (!ok) ++failures;
        all = all && ok;
        if (!ran) break; /* a failed call leaves the communicator unusable */
    }
    CU(cudaStreamDestroy(s));
    return all;
}

/* ------------------------------------------------------------------ the caller's NCCL */

typedef struct {
    void *handle;
    __typeof__(ncclGetUniqueId) *GetUniqueId;
    __typeof__(ncclCommInitRank) *CommInitRank;
    __typeof__(ncclCommDestroy) *CommDestroy;
    __typeof__(ncclGetErrorString) *GetErrorString;
} app_nccl_t;

static bool app_nccl_load(app_nccl_t *a) {
    const char *env = getenv("TIDE_NCCL_LIBRARY");
    const char *name = env != NULL && env[0] ? env : "libnccl.so.2";
    a->handle = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    if (a->handle == NULL) {
        fprintf(stderr, "SETUP: dlopen(%s): %s (set TIDE_NCCL_LIBRARY to libnccl.so.2's path)\n",
                name, dlerror());
        return false;
    }
    void *sym[4] = {dlsym(a->handle, "ncclGetUniqueId"), dlsym(a->handle, "ncclCommInitRank"),
                    dlsym(a->handle, "ncclCommDestroy"), dlsym(a->handle, "ncclGetErrorString")};
    for (int i = 0; i < 4; ++i)
        if (sym[i] == NULL) {
            fprintf(stderr, "SETUP: %s lacks symbol %d of the test's four\n", name, i);
            return false;
        }
    memcpy(&a->GetUniqueId, &sym[0], sizeof(void *));
    memcpy(&a->CommInitRank, &sym[1], sizeof(void *));
    memcpy(&a->CommDestroy, &sym[2], sizeof(void *));
    memcpy(&a->GetErrorString, &sym[3], sizeof(void *));
    printf("loaded %s for the caller's communicator\n", name);
    return true;
}

#define NK(a, call)                                                                                \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            fprintf(stderr, "FAIL: %s:%d %s: %s\n", __FILE__, __LINE__, #call,                     \
                    (a)->GetErrorString(r_));                                                      \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

static bool expect(tide_result_t got, tide_result_t want, const char *what) {
    const bool ok = got == want;
    printf("%s refusal: %s: %s (%s)\n", ok ? "PASS" : "FAIL", what, tide_get_error_string(got),
           got != TIDE_SUCCESS ? tide_get_last_error() : "");
    if (!ok) ++failures;
    return ok;
}

/* A refusal whose message must name `needle`. */
static bool expect_msg(tide_result_t got, tide_result_t want, const char *needle,
                       const char *what) {
    if (!expect(got, want, what)) return false;
    if (strstr(tide_get_last_error(), needle) != NULL) return true;
    printf("FAIL refusal: %s: the message does not name \"%s\"\n", what, needle);
    ++failures;
    return false;
}

/* Path "comm": the caller's one-rank communicator, as ProcessGroupNCCL would hold it. */
static bool path_comm(app_nccl_t *a, case_t *cases, int num) {
    ncclUniqueId id;
    ncclComm_t nc = NULL;
    step("comm: ncclGetUniqueId + ncclCommInitRank (the caller's one-rank communicator)");
    NK(a, a->GetUniqueId(&id));
    NK(a, a->CommInitRank(&nc, 1, id, 0));
    tide_comm_t comm = NULL, other = NULL;
    /* A topology other than the communicator's (1 x 2 = 2 ranks against 1): refused. */
    step("comm: tide_comm_init_nccl_comm(1 x 2), expected refusal");
    expect(tide_comm_init_nccl_comm(nc, 1, 2, &other), TIDE_ERR_INVALID_ARGUMENT,
           "1 x 2 topology over a one-rank ncclComm_t");
    step("comm: tide_comm_init_nccl_comm(2 x 1) without TIDE_NCCL_RAILS, expected refusal");
    unsetenv("TIDE_NCCL_RAILS");
    expect_msg(tide_comm_init_nccl_comm(nc, 2, 1, &other), TIDE_ERR_UNSUPPORTED,
               "TIDE_NCCL_RAILS=1", "M = 2 without the rails opt-in");
    step("comm: tide_comm_init_nccl_comm(2 x 1) with TIDE_NCCL_RAILS=1, expected refusal");
    setenv("TIDE_NCCL_RAILS", "1", 1);
    expect_msg(tide_comm_init_nccl_comm(nc, 2, 1, &other), TIDE_ERR_INVALID_ARGUMENT,
               "the communicator has 1 ranks", "M = 2 with the opt-in over a one-rank ncclComm_t");
    unsetenv("TIDE_NCCL_RAILS");
    if (other != NULL) {
        fprintf(stderr, "FAIL: a refused tide_comm_init_nccl_comm wrote its output\n");
        ++failures;
    }
    step("comm: tide_comm_init_nccl_comm(1 x 1)");
    TK(tide_comm_init_nccl_comm(nc, 1, 1, &comm));
    step("comm: tide_comm_rank");
    int rank = -1;
    TK(tide_comm_rank(comm, &rank));
    if (rank != 0) {
        fprintf(stderr, "FAIL: comm path: tide_comm_rank = %d, expected 0\n", rank);
        ++failures;
    }
    const bool ok = run_cases(comm, cases, num, "comm");
    step("comm: tide_comm_destroy");
    TK(tide_comm_destroy(comm));
    step("comm: ncclCommDestroy (the caller's communicator)");
    NK(a, a->CommDestroy(nc));
    return ok;
}

/* Path "id": TIDE creates the communicator from a unique id. */
static bool path_id(case_t *cases, int num) {
    uint8_t id[TIDE_NCCL_UNIQUE_ID_BYTES];
    step("id: tide_nccl_get_unique_id");
    TK(tide_nccl_get_unique_id(id));
    tide_comm_t comm = NULL, other = NULL;
    step("id: tide_comm_init_nccl(M = 2) without TIDE_NCCL_RAILS, expected refusal");
    unsetenv("TIDE_NCCL_RAILS");
    expect_msg(tide_comm_init_nccl(2, 1, 0, id, &other), TIDE_ERR_UNSUPPORTED,
               "TIDE_NCCL_RAILS=1", "M = 2 without the rails opt-in");
    step("id: tide_comm_init_nccl(1 x 1)");
    TK(tide_comm_init_nccl(1, 1, 0, id, &comm));
    const bool ok = run_cases(comm, cases, num, "id");
    step("id: tide_comm_destroy");
    TK(tide_comm_destroy(comm));
    return ok;
}

int main(void) {
    /* Unbuffered: a crash (SIGSEGV) must not take the output of the steps before it with it
     * (stdout into a pipe is block-buffered; NCCL's NCCL_DEBUG lines go to stdout too). */
    setvbuf(stdout, NULL, _IONBF, 0);
    setvbuf(stderr, NULL, _IONBF, 0);
    /* NVLink multicast off in this process before any NCCL call (the library checks too). */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 0);
    setenv("NVSHMEM_DISABLE_NVLS", "1", 0);
    /* NCCL's own warnings explain a failed NCCL call beside TIDE's message. */
    setenv("NCCL_DEBUG", "WARN", 0);
    if (strcmp(getenv("NCCL_NVLS_ENABLE"), "0") != 0) {
        fprintf(stderr, "SETUP: NCCL_NVLS_ENABLE=%s; run with NCCL_NVLS_ENABLE=0\n",
                getenv("NCCL_NVLS_ENABLE"));
        return 2;
    }
    int devices = 0;
    cudaError_t ce = cudaGetDeviceCount(&devices);
    if (ce != cudaSuccess || devices < 1) {
        fprintf(stderr, "SETUP: no CUDA device (%s)\n", cudaGetErrorString(ce));
        return 2;
    }
    if (cudaSetDevice(0) != cudaSuccess) {
        fprintf(stderr, "SETUP: cudaSetDevice(0) failed\n");
        return 2;
    }
    static case_t cases[CASES];
    int num = 0;
    step("the CPU fabric's runs (the oracle)");
    for (int v = 0; v < CASES; ++v) {
        if (!case_init(&cases[num], v)) return 1;
        if (!run_cpu(&cases[num])) return 1;
        ++num;
    }
    app_nccl_t app;
    memset(&app, 0, sizeof(app));
    step("loading the caller's libnccl");
    if (!app_nccl_load(&app)) return 2;
    bool ok = path_comm(&app, cases, num);
    ok = path_id(cases, num) && ok;
    for (int k = 0; k < num; ++k)
        case_free(&cases[k]);
    ok = ok && failures == 0;
    printf("%s: NCCL fabric single-rank path, %d cases x %d AG + %d RS calls on 2 communicator "
           "paths, bit for bit equal to the CPU fabric\n",
           ok ? "PASS" : "FAIL", num, CALLS, CALLS);
    return ok ? 0 : 1;
}
