/*
 * interference_lt.cuh - the victim GEMM through cublasLt with explicit algorithms, so that
 * bench_interference can name the configuration it measures (tile, split-K, reduction,
 * swizzle, cluster) instead of taking whatever cublasGemmEx's default picks.  Header-only, for
 * nvcc (C++17), included by bench_interference.cu alone.
 */
#ifndef TIDE_TESTS_GPU_INTERFERENCE_LT_CUH_
#define TIDE_TESTS_GPU_INTERFERENCE_LT_CUH_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

/* cuBLAS and cublasLt calls: any status but success ends the benchmark. */
#define CB(x)                                                                                  \
    do {                                                                                       \
        cublasStatus_t s_ = (x);                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            fprintf(stderr, "%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, (int)s_);  \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* D (m x n, column-major) = op(A) op(B) with A stored k x m (op T) and B stored k x n (op N):
 * the column-major view of Y[M,N] = X[M,K] W[N,K]^T with m = N, n = M, A = W, B = X. */
struct lt_t {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    int m, n, k;
    void *ws;
    size_t ws_bytes;
};

/* One algorithm and what cublasLt says about it; a field the library does not report is -1. */
struct lt_algo_t {
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
    float waves;
    std::string origin; /* which heuristic query returned it, and its rank there */
    long id, tile, splitk, reduction, swizzle, custom, stages, inner, cluster;
};

static void lt_open(lt_t *lt, int m, int n, int k, size_t ws_bytes) {
    lt->m = m;
    lt->n = n;
    lt->k = k;
    lt->ws_bytes = ws_bytes;
    CK(cudaMalloc(&lt->ws, ws_bytes));
    CB(cublasLtCreate(&lt->h));
    CB(cublasLtMatmulDescCreate(&lt->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(lt->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CB(cublasLtMatmulDescSetAttribute(lt->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CB(cublasLtMatrixLayoutCreate(&lt->a, CUDA_R_16BF, k, m, k));
    CB(cublasLtMatrixLayoutCreate(&lt->b, CUDA_R_16BF, k, n, k));
    CB(cublasLtMatrixLayoutCreate(&lt->d, CUDA_R_16BF, m, n, m));
}

static void lt_close(lt_t *lt) {
    CB(cublasLtMatrixLayoutDestroy(lt->a));
    CB(cublasLtMatrixLayoutDestroy(lt->b));
    CB(cublasLtMatrixLayoutDestroy(lt->d));
    CB(cublasLtMatmulDescDestroy(lt->op));
    CB(cublasLtDestroy(lt->h));
    CK(cudaFree(lt->ws));
}

template <class T>
static long lt_config(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t attr) {
    T v = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(a, attr, &v, sizeof v, &written) !=
            CUBLAS_STATUS_SUCCESS ||
        written != sizeof v)
        return -1;
    return (long)v;
}

static void lt_read_config(lt_algo_t *x) {
    const cublasLtMatmulAlgo_t *a = &x->algo;
    x->id = lt_config<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID);
    x->tile = lt_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID);
    x->splitk = lt_config<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    x->reduction = lt_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    x->swizzle = lt_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING);
    x->custom = lt_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION);
    x->stages = lt_config<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID);
#if CUBLAS_VER_MAJOR >= 12
    x->inner = lt_config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID);
    x->cluster = lt_config<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
#else
    x->inner = -1;
    x->cluster = -1;
#endif
}

/* Tile ids 1..35 of cublasLtMatmulTile_t (stable since CUDA 11); later ids print as numbers. */
static bool lt_tile_shape(long id, int *tm, int *tn) {
    static const short shapes[][2] = {
        {0, 0},     {8, 8},     {8, 16},   {16, 8},    {8, 32},   {16, 16},  {32, 8},
        {8, 64},    {16, 32},   {32, 16},  {64, 8},    {32, 32},  {32, 64},  {64, 32},
        {32, 128},  {64, 64},   {128, 32}, {64, 128},  {128, 64}, {64, 256}, {128, 128},
        {256, 64},  {64, 512},  {128, 256}, {256, 128}, {512, 64}, {64, 96},  {96, 64},
        {96, 128},  {128, 160}, {160, 128}, {192, 128}, {128, 192}, {128, 96}, {32, 256},
        {256, 32}};
    if (id < 1 || id >= (long)(sizeof shapes / sizeof shapes[0])) return false;
    *tm = shapes[id][0];
    *tn = shapes[id][1];
    return true;
}

/* cublasLtClusterShape_t 0..16 (AUTO, then the power-of-two shapes); later ids as numbers. */
static std::string lt_cluster_name(long id) {
    static const char *names[] = {"auto", "?",    "1x1x1", "2x1x1", "4x1x1",  "1x2x1",
                                  "2x2x1", "4x2x1", "1x4x1", "2x4x1", "4x4x1",  "8x1x1",
                                  "1x8x1", "8x2x1", "2x8x1", "16x1x1", "1x16x1"};
    if (id >= 0 && id < (long)(sizeof names / sizeof names[0])) return names[id];
    return "#" + std::to_string(id);
}

static std::string lt_reduction_name(long r) {
    switch (r) {
    case CUBLASLT_REDUCTION_SCHEME_NONE: return "none";
    case CUBLASLT_REDUCTION_SCHEME_INPLACE: return "inplace";
    case CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE: return "compute-type";
    case CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE: return "output-type";
    default: return "#" + std::to_string(r);
    }
}

/* A one-line description: the config attributes, the tile count when the tile id is known
 * (CTAs of a non-persistent launch = tiles x split-K), cublasLt's wave estimate. */
static std::string lt_describe(const lt_t *lt, const lt_algo_t &x) {
    char buf[384];
    int tm = 0, tn = 0;
    std::string tile = "#" + std::to_string(x.tile), ctas = "?";
    if (lt_tile_shape(x.tile, &tm, &tn)) {
        tile = std::to_string(tm) + "x" + std::to_string(tn);
        const long tiles = (long)((lt->m + tm - 1) / tm) * ((lt->n + tn - 1) / tn);
        ctas = std::to_string(tiles) + " tiles";
        if (x.splitk > 1) ctas += " x " + std::to_string(x.splitk) + " splits";
    }
    snprintf(buf, sizeof buf,
             "algo id %ld, tile %s (%s), split-K %ld, reduction %s, swizzle %ld, custom %ld, "
             "stages id %ld, inner shape %ld, cluster %s; workspace %zu B, waves %.2f",
             x.id, tile.c_str(), ctas.c_str(), x.splitk, lt_reduction_name(x.reduction).c_str(),
             x.swizzle, x.custom, x.stages, x.inner, lt_cluster_name(x.cluster).c_str(),
             x.workspace, x.waves);
    return buf;
}

/* The attributes that make two algorithms different kernels for this benchmark's purpose
 * (stage count and inner shape are left out: they change the pipeline, not the grid). */
static bool lt_same_kind(const lt_algo_t &p, const lt_algo_t &q) {
    return p.id == q.id && p.tile == q.tile && p.splitk == q.splitk &&
           p.reduction == q.reduction && p.swizzle == q.swizzle && p.custom == q.custom &&
           p.cluster == q.cluster;
}

static std::vector<lt_algo_t> lt_heuristic(lt_t *lt, uint32_t reduction_mask, const char *name) {
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = lt->ws_bytes;
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                            sizeof ws));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                            &reduction_mask, sizeof reduction_mask));
    cublasLtMatmulHeuristicResult_t res[16];
    int got = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt->h, lt->op, lt->a, lt->b, lt->d, lt->d, pref, 16, res,
                                      &got));
    CB(cublasLtMatmulPreferenceDestroy(pref));
    std::vector<lt_algo_t> out;
    for (int i = 0; i < got; ++i) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        lt_algo_t x;
        x.algo = res[i].algo;
        x.workspace = res[i].workspaceSize;
        x.waves = res[i].wavesCount;
        x.origin = std::string(name) + " #" + std::to_string(i + 1);
        lt_read_config(&x);
        out.push_back(x);
    }
    return out;
}

/* Up to `want` algorithms of distinct kinds: the default heuristic's first choice (the one
 * cublasGemmEx normally runs), the first choice without any split-K reduction, then the next
 * distinct ones of either list in turn. */
static std::vector<lt_algo_t> lt_pick(lt_t *lt, int want) {
    const std::vector<lt_algo_t> all = lt_heuristic(lt, CUBLASLT_REDUCTION_SCHEME_MASK, "default");
    const std::vector<lt_algo_t> none =
        lt_heuristic(lt, CUBLASLT_REDUCTION_SCHEME_NONE, "no-reduction");
    std::vector<lt_algo_t> pick;
    auto add = [&](const lt_algo_t &x) {
        for (const lt_algo_t &p : pick)
            if (lt_same_kind(p, x)) return false;
        pick.push_back(x);
        return true;
    };
    size_t ia = 0, in = 0;
    while ((int)pick.size() < want && (ia < all.size() || in < none.size())) {
        while (ia < all.size() && !add(all[ia++])) {
        }
        if ((int)pick.size() >= want) break;
        while (in < none.size() && !add(none[in++])) {
        }
    }
    return pick;
}

static void lt_launch(const lt_t *lt, const lt_algo_t &x, const void *a, const void *b, void *d,
                      cudaStream_t st) {
    const float one = 1.0f, zero = 0.0f;
    CB(cublasLtMatmul(lt->h, lt->op, &one, a, lt->a, b, lt->b, &zero, d, lt->d, d, lt->d, &x.algo,
                      lt->ws, lt->ws_bytes, st));
}

#endif /* TIDE_TESTS_GPU_INTERFERENCE_LT_CUH_ */
