/*
 * bench_fabric_cuda.cu - TIDE-AG / TIDE-RS on the CUDA fabric against the stock FSDP2 layout
 * path, side by side in one run, on emulated M x L topologies (virtual ranks on the visible
 * GPUs).
 *
 *   bench_fabric_cuda [--preset NAME] [--divisor D] [--iters N] [--topology MxL]...
 *
 * Stock path, per rank, on one stream:
 *   AG: rank-major all-gather (N device copies of S bytes into a flat N S buffer) followed by
 *       FSDP2's copy-out (one kernel: split_with_sizes_copy into parameter-major storage);
 *   RS: _chunk_cat (one kernel: slice, zero-pad, upcast every gradient into an fp32 rank-major
 *       buffer), then the fp32 reduce-scatter (one kernel per rank summing its chunk over the
 *       N packed buffers in rank order).
 * On one GPU every copy of either path runs on SMs (same-device copies do not use copy
 * engines), so these ratios compare layouts and descriptor counts, not copy engines.
 *
 * Every topology runs in the fabric's three copy modes, one world after the other on the same
 * inputs, each interleaved with its own stock runs: "batched", the default (runs of
 * same-device copies below TIDE_CUDA_BATCH_MAX_BYTES, 64 MiB unless the environment sets it, as
 * one kernel; larger copies per op), "batched-all" (TIDE_CUDA_BATCH_MAX_BYTES=0: no
 * threshold) and "per-op" (TIDE_CUDA_BATCH=0).  The first line of a topology keeps the format
 * it had before the modes existed and gives the default mode; a "mode" row per mode follows.
 *
 * Inputs are integer-valued, so both paths produce exact results: the data check after
 * timing compares them element by element on the device (#wrong); any wrong element makes
 * the exit status non-zero.
 */
#include "tide.h"
extern "C" {
#include "api/comm.h"
#include "fabric/cuda/cuda.h"
#include "plan/plan.h"
#include "plan/presets.h"
}

#include "gpu_util.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct seg_t {
    uint64_t src, dst, bytes;
};

/* Copy-out: one block-strided loop per segment, 16-byte words when aligned. */
__global__ void copy_segments(const seg_t *segs, int n, const uint8_t *src, uint8_t *dst) {
    for (int s = blockIdx.x; s < n; s += gridDim.x) {
        seg_t g = segs[s];
        if (((g.src | g.dst | g.bytes) & 15) == 0) {
            const uint4 *a = (const uint4 *)(src + g.src);
            uint4 *b = (uint4 *)(dst + g.dst);
            for (uint64_t i = threadIdx.x; i < g.bytes / 16; i += blockDim.x) b[i] = a[i];
        } else {
            for (uint64_t i = threadIdx.x; i < g.bytes; i += blockDim.x)
                dst[g.dst + i] = src[g.src + i];
        }
    }
}

__device__ __forceinline__ float bf16f(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }

/* _chunk_cat: pack[r E + off_p + e] = fp32(G_p[r R_p K_p + e]) or 0 past D_p K_p. */
struct pack_param_t {
    const uint16_t *grad;
    uint64_t shard_elems, valid_elems, out_off;
};
__global__ void chunk_cat(const pack_param_t *ps, int P, int N, uint64_t E, float *pack) {
    for (int p = 0; p < P; ++p) {
        pack_param_t q = ps[p];
        uint64_t total = q.shard_elems * (uint64_t)N;
        for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
             i += (uint64_t)gridDim.x * blockDim.x) {
            uint64_t r = i / q.shard_elems, e = i % q.shard_elems;
            pack[r * E + q.out_off + e] = i < q.valid_elems ? bf16f(q.grad[i]) : 0.0f;
        }
    }
}

__global__ void reduce_chunk(const float *const *packs, int N, uint64_t off, uint64_t E,
                             float alpha, float *out) {
    for (uint64_t e = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; e < E;
         e += (uint64_t)gridDim.x * blockDim.x) {
        float acc = packs[0][off + e];
        for (int u = 1; u < N; ++u) acc += packs[u][off + e];
        out[e] = alpha * acc;
    }
}

__global__ void fill_ints(uint16_t *p, uint64_t n, uint64_t seed) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        x ^= x >> 31;
        x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 29;
        float v = (float)((int)(x % 9) - 4);
        p[i] = (uint16_t)(__float_as_uint(v) >> 16); /* small integers are exact in bf16 */
    }
}

__global__ void count_diff(const uint32_t *a, const uint32_t *b, uint64_t n,
                           unsigned long long *wrong) {
    unsigned long long local = 0;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        local += a[i] != b[i];
    if (local) atomicAdd(wrong, local);
}

/* Copy modes of the fabric (TIDE_CUDA_BATCH, TIDE_CUDA_BATCH_MAX_BYTES and TIDE_CUDA_DIRECT,
 * read when a world is created); --modes picks which run, in this order.  "no-direct" is the
 * fabric before its single-device shortcuts (every staging push, spare copy and rail put
 * runs, every landing input is read); "direct-sum" and "direct-sum-zero" add them one at a
 * time (src/fabric/cuda/direct.c) up to the default (TIDE_CUDA_DIRECT=7, with the inbox
 * aliases), so that their differences break the gain down; "direct-fused" adds the fused sum
 * and landing (TIDE_CUDA_DIRECT=15, opt-in). */
struct copy_mode_t {
    const char *name;
    int batch;      /* TIDE_CUDA_BATCH */
    int max_bytes;  /* 1: TIDE_CUDA_BATCH_MAX_BYTES as the caller set it (or the default); 0: 0 */
    int direct;     /* TIDE_CUDA_DIRECT */
};
enum { MODE_COUNT = 7 };
static const copy_mode_t MODES[MODE_COUNT] = {
    {"batched", 1, 1, 7},   {"batched-all", 1, 0, 7},     {"per-op", 0, 1, 7},
    {"no-direct", 1, 1, 0}, {"direct-sum", 1, 1, 1},      {"direct-sum-zero", 1, 1, 3},
    {"direct-fused", 1, 1, 15},
};
enum { MODE_BATCHED = 0, MODE_PER_OP = 2 };
static bool mode_on[MODE_COUNT] = {true, true, true, true, false, false, false};
/* TIDE_CUDA_BATCH_MAX_BYTES as the caller's environment set it (empty: the default). */
static char user_max_bytes[64];

/* Set the fabric's variables for a mode; `max_out` gets the threshold in bytes as text. */
static void mode_setenv(int mode, char *max_out, size_t max_size) {
    const copy_mode_t &m = MODES[mode];
    setenv("TIDE_CUDA_BATCH", m.batch ? "1" : "0", 1);
    char direct[8];
    snprintf(direct, sizeof direct, "%d", m.direct);
    setenv("TIDE_CUDA_DIRECT", direct, 1);
    if (!m.batch) {
        snprintf(max_out, max_size, "-");
    } else if (!m.max_bytes) {
        setenv("TIDE_CUDA_BATCH_MAX_BYTES", "0", 1);
        snprintf(max_out, max_size, "none");
    } else if (user_max_bytes[0] != '\0') {
        setenv("TIDE_CUDA_BATCH_MAX_BYTES", user_max_bytes, 1);
        snprintf(max_out, max_size, "%s", user_max_bytes);
    } else {
        unsetenv("TIDE_CUDA_BATCH_MAX_BYTES");
        snprintf(max_out, max_size, "%llu", (unsigned long long)TIDE_CUDA_BATCH_MAX_BYTES_DEFAULT);
    }
}

struct result_t {
    double tide_ms, stock_ms, enqueue_us;
    unsigned long long wrong;
    tide_cuda_stats_t st; /* the fabric's counts of the last call */
};

static unsigned long long diff_words(const void *a, const void *b, uint64_t bytes,
                                     unsigned long long *d_wrong) {
    CK(cudaMemset(d_wrong, 0, sizeof(*d_wrong)));
    count_diff<<<528, 512>>>((const uint32_t *)a, (const uint32_t *)b, bytes / 4, d_wrong);
    CK(cudaGetLastError());
    unsigned long long w = 0;
    CK(cudaMemcpy(&w, d_wrong, sizeof(w), cudaMemcpyDeviceToHost));
    return w;
}

/* The inputs and the stock path's buffers of one topology, shared by the copy modes. */
struct bench_t {
    int M, L, N, P;
    tide_config_t cfg;
    std::vector<tide_param_shape_t> shapes;
    tide_group_desc_t desc;
    uint64_t S, NS, E;
    std::vector<uint16_t *> shard, flat, landing;
    std::vector<std::vector<uint16_t *>> grads;
    std::vector<float *> pack, out_tide, out_stock;
    std::vector<seg_t> segs;
    seg_t *d_segs;
    std::vector<pack_param_t *> d_pp;
    float **d_packs;
    unsigned long long *d_wrong;
    cudaStream_t st;
    cudaEvent_t e0, e1;
    float alpha;
};

/* One copy mode: a world and groups of its own, the iterations (TIDE and stock, interleaved
 * as before the modes existed), the data check. */
static void run_mode(bench_t &b, int iters, tide_rs_mode_t mode, result_t *ag, result_t *rs) {
    const int N = b.N, P = b.P;
    std::vector<tide_comm_t> comms(N);
    TK(tide_comm_init_all(TIDE_FABRIC_CUDA, b.M, b.L, comms.data()));
    std::vector<tide_group_t> groups(N);
    for (int r = 0; r < N; ++r) TK(tide_group_register(comms[r], &b.cfg, &b.desc, &groups[r]));
    const uint64_t S = b.S, E = b.E;
    cudaStream_t st = b.st;
    std::vector<double> t_ag, t_ags, t_rs, t_rss, enq_ag, enq_rs;
    int last_slot = 0;
    for (int it = -1; it < iters; ++it) {
        int slot = (it + 1) % 2;
        double ms;
        /* TIDE-AG: every rank's call, then the caller's stream joins the call. */
        CK(cudaEventRecord(b.e0, st));
        double h0 = now_us();
        for (int r = 0; r < N; ++r) TK(tide_all_gather(groups[r], b.shard[r], slot, st));
        double h1 = now_us();
        CK(cudaEventRecord(b.e1, st));
        ms = event_ms(b.e0, b.e1);
        if (it >= 0) t_ag.push_back(ms), enq_ag.push_back((h1 - h0) / N);
        last_slot = slot;
        /* Stock AG. */
        CK(cudaEventRecord(b.e0, st));
        for (int r = 0; r < N; ++r) {
            for (int u = 0; u < N; ++u)
                CK(cudaMemcpyAsync((uint8_t *)b.flat[r] + u * S, b.shard[u], S,
                                   cudaMemcpyDeviceToDevice, st));
            copy_segments<<<1056, 512, 0, st>>>(b.d_segs, (int)b.segs.size(),
                                                (const uint8_t *)b.flat[r],
                                                (uint8_t *)b.landing[r]);
        }
        CK(cudaEventRecord(b.e1, st));
        ms = event_ms(b.e0, b.e1);
        if (it >= 0) t_ags.push_back(ms);
        /* TIDE-RS. */
        CK(cudaEventRecord(b.e0, st));
        h0 = now_us();
        for (int r = 0; r < N; ++r)
            TK(tide_reduce_scatter(groups[r], (const void *const *)b.grads[r].data(),
                                   b.out_tide[r], b.alpha, 0, mode, st));
        h1 = now_us();
        CK(cudaEventRecord(b.e1, st));
        ms = event_ms(b.e0, b.e1);
        if (it >= 0) t_rs.push_back(ms), enq_rs.push_back((h1 - h0) / N);
        /* Stock RS. */
        CK(cudaEventRecord(b.e0, st));
        for (int r = 0; r < N; ++r)
            chunk_cat<<<1056, 512, 0, st>>>(b.d_pp[r], P, N, E, b.pack[r]);
        for (int r = 0; r < N; ++r)
            reduce_chunk<<<1056, 512, 0, st>>>(b.d_packs, N, (uint64_t)r * E, E, b.alpha,
                                               b.out_stock[r]);
        CK(cudaGetLastError());
        CK(cudaEventRecord(b.e1, st));
        ms = event_ms(b.e0, b.e1);
        if (it >= 0) t_rss.push_back(ms);
    }
    TK(tide_cuda_arena_stats(groups[0]->arena, TIDE_COLL_ALL_GATHER, &ag->st));
    TK(tide_cuda_arena_stats(groups[0]->arena, TIDE_COLL_REDUCE_SCATTER, &rs->st));
    /* Data check after timing; the outputs are poisoned for the next mode. */
    ag->wrong = rs->wrong = 0;
    for (int r = 0; r < N; ++r) {
        void *land;
        TK(tide_group_landing(groups[r], last_slot, &land));
        ag->wrong += diff_words(land, b.landing[r], b.NS, b.d_wrong);
        rs->wrong += diff_words(b.out_tide[r], b.out_stock[r], E * 4, b.d_wrong);
        CK(cudaMemset(b.out_tide[r], 0xff, E * 4));
    }
    /* The reported "median" is the upper middle value, v[n / 2], for an even --iters. */
    ag->tide_ms = quantile(t_ag, 0.5), ag->stock_ms = quantile(t_ags, 0.5);
    ag->enqueue_us = quantile(enq_ag, 0.5);
    rs->tide_ms = quantile(t_rs, 0.5), rs->stock_ms = quantile(t_rss, 0.5);
    rs->enqueue_us = quantile(enq_rs, 0.5);
    for (int r = 0; r < N; ++r) TK(tide_group_deregister(groups[r]));
    for (int r = 0; r < N; ++r) TK(tide_comm_destroy(comms[r]));
}

static void print_mode_side(const char *what, const result_t &x, const result_t *per_op) {
    printf(" | %s tide %8.3f ms stock %8.3f ms ratio %5.2fx per-op/tide %5.2fx enqueue %7.1f "
           "us/rank batches %llu batched %llu over-threshold %llu elided %llu fused %llu "
           "wrong %llu",
           what, x.tide_ms, x.stock_ms, x.stock_ms / x.tide_ms,
           per_op ? per_op->tide_ms / x.tide_ms : 0.0, x.enqueue_us,
           (unsigned long long)x.st.batches, (unsigned long long)x.st.batched,
           (unsigned long long)x.st.over_threshold, (unsigned long long)x.st.elided,
           (unsigned long long)x.st.fused, x.wrong);
}

/* Returns the wrong elements of every mode. */
static int sum_ctas = 0, landing_ctas = 0; /* --sum-ctas, --landing-ctas: 0 = the plan's */

static unsigned long long run_topology(const char *preset_name, int M, int L, int divisor,
                                       int iters, tide_rs_mode_t mode) {
    const tide_preset_t *pr = tide_preset_find(preset_name);
    if (!pr) {
        fprintf(stderr, "unknown preset %s\n", preset_name);
        exit(2);
    }
    bench_t b;
    b.M = M, b.L = L, b.N = M * L, b.P = pr->num_params;
    const int P = b.P, N = b.N;
    b.shapes.assign(pr->shapes, pr->shapes + P);
    for (auto &s : b.shapes) s.dim0 = (s.dim0 + divisor - 1) / divisor;
    b.cfg = TIDE_CONFIG_INIT;
    b.cfg.nodes = M, b.cfg.gpus_per_node = L;
    b.cfg.sum_ctas = sum_ctas, b.cfg.landing_ctas = landing_ctas;
    b.desc = {P, b.shapes.data(), TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    /* Every mode's groups plan the same geometry as this plan. */
    tide_plan_t plan;
    TK(tide_plan_create(&b.cfg, &b.desc, &plan));
    tide_plan_summary_t sum;
    TK(tide_plan_get_summary(plan, &sum));
    std::vector<tide_param_geometry_t> geo(P);
    for (int p = 0; p < P; ++p) TK(tide_plan_get_param(plan, p, &geo[p]));
    const int plan_sum_ctas = plan->config.sum_ctas, plan_landing_ctas = plan->config.landing_ctas;
    tide_plan_destroy(plan);
    b.S = sum.shard_bytes, b.NS = sum.group_bytes, b.E = sum.fp32_shard_bytes / 4;
    const uint64_t S = b.S, NS = b.NS, E = b.E;

    /* Buffers (plain cudaMalloc; all on the current device). */
    b.shard.resize(N), b.flat.resize(N), b.landing.resize(N);
    b.grads.assign(N, std::vector<uint16_t *>(P));
    b.pack.resize(N), b.out_tide.resize(N), b.out_stock.resize(N);
    for (int r = 0; r < N; ++r) {
        CK(cudaMalloc(&b.shard[r], S));
        CK(cudaMalloc(&b.flat[r], NS));
        CK(cudaMalloc(&b.landing[r], NS));
        CK(cudaMalloc(&b.pack[r], E * 4 * (uint64_t)N));
        CK(cudaMalloc(&b.out_tide[r], E * 4));
        CK(cudaMalloc(&b.out_stock[r], E * 4));
        fill_ints<<<264, 512>>>(b.shard[r], S / 2, 1000 + r);
        for (int p = 0; p < P; ++p) {
            uint64_t n = b.shapes[p].dim0 * b.shapes[p].inner;
            CK(cudaMalloc(&b.grads[r][p], n * 2));
            fill_ints<<<264, 512>>>(b.grads[r][p], n, 7 * r + 13 * p + 5);
        }
    }
    /* Copy-out table (same for every rank: from flat u S + o_p to o_p N + u s_p). */
    for (int p = 0; p < P; ++p)
        for (int u = 0; u < N; ++u)
            b.segs.push_back({u * S + geo[p].shard_offset,
                              geo[p].shard_offset * N + u * geo[p].shard_bytes,
                              geo[p].shard_bytes});
    CK(cudaMalloc(&b.d_segs, b.segs.size() * sizeof(seg_t)));
    CK(cudaMemcpy(b.d_segs, b.segs.data(), b.segs.size() * sizeof(seg_t),
                  cudaMemcpyHostToDevice));
    b.d_pp.resize(N);
    for (int r = 0; r < N; ++r) {
        std::vector<pack_param_t> pp(P);
        for (int p = 0; p < P; ++p)
            pp[p] = {b.grads[r][p], geo[p].rows_per_rank * geo[p].inner,
                     geo[p].dim0 * geo[p].inner, geo[p].fp32_offset / 4};
        CK(cudaMalloc(&b.d_pp[r], P * sizeof(pack_param_t)));
        CK(cudaMemcpy(b.d_pp[r], pp.data(), P * sizeof(pack_param_t), cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&b.d_packs, N * sizeof(float *)));
    CK(cudaMemcpy(b.d_packs, b.pack.data(), N * sizeof(float *), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&b.d_wrong, sizeof(*b.d_wrong)));
    CK(cudaDeviceSynchronize());
    CK(cudaStreamCreateWithFlags(&b.st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&b.e0));
    CK(cudaEventCreate(&b.e1));
    b.alpha = (N & (N - 1)) == 0 ? 1.0f / N : 1.0f;

    result_t ag[MODE_COUNT], rs[MODE_COUNT];
    char max_bytes[MODE_COUNT][64];
    int first = -1;
    for (int m = 0; m < MODE_COUNT; ++m) {
        if (!mode_on[m]) continue;
        mode_setenv(m, max_bytes[m], sizeof(max_bytes[m]));
        run_mode(b, iters, mode, &ag[m], &rs[m]);
        if (first >= 0) continue;
        first = m;
        /* The line of the first mode (the default, batched, unless --modes says otherwise). */
        printf("%-22s %dx%d dim0/%-3d P=%-3d group %8.1f MiB sum_ctas %d landing_ctas %d (%s) | "
               "AG tide %8.3f ms stock %8.3f ms "
               "ratio %5.2fx enqueue %7.1f us/rank desc %llu wrong %llu | RS tide %8.3f ms "
               "stock %8.3f ms ratio %5.2fx enqueue %7.1f us/rank desc %llu wrong %llu\n",
               preset_name, M, L, divisor, P, NS / 1048576.0, plan_sum_ctas, plan_landing_ctas,
               MODES[m].name, ag[m].tide_ms, ag[m].stock_ms,
               ag[m].stock_ms / ag[m].tide_ms, ag[m].enqueue_us,
               (unsigned long long)sum.ag_descriptors_max, ag[m].wrong, rs[m].tide_ms,
               rs[m].stock_ms, rs[m].stock_ms / rs[m].tide_ms, rs[m].enqueue_us,
               (unsigned long long)sum.rs_descriptors, rs[m].wrong);
        fflush(stdout);
    }
    unsigned long long wrong = 0;
    for (int m = 0; m < MODE_COUNT; ++m) {
        if (!mode_on[m]) continue;
        printf("  mode %-15s %dx%d max_bytes %-9s direct %d", MODES[m].name, M, L, max_bytes[m],
               MODES[m].direct);
        print_mode_side("AG", ag[m], mode_on[MODE_PER_OP] ? &ag[MODE_PER_OP] : nullptr);
        print_mode_side("RS", rs[m], mode_on[MODE_PER_OP] ? &rs[MODE_PER_OP] : nullptr);
        printf("\n");
        wrong += ag[m].wrong + rs[m].wrong;
    }
    fflush(stdout);
    for (int r = 0; r < N; ++r) {
        cudaFree(b.shard[r]), cudaFree(b.flat[r]), cudaFree(b.landing[r]), cudaFree(b.pack[r]);
        cudaFree(b.out_tide[r]), cudaFree(b.out_stock[r]), cudaFree(b.d_pp[r]);
        for (int p = 0; p < P; ++p) cudaFree(b.grads[r][p]);
    }
    cudaFree(b.d_segs), cudaFree(b.d_packs), cudaFree(b.d_wrong);
    cudaStreamDestroy(b.st), cudaEventDestroy(b.e0), cudaEventDestroy(b.e1);
    return wrong;
}

int main(int argc, char **argv) {
    const char *preset = "llama3-70b-layer";
    int divisor = 1, iters = 10;
    std::vector<std::pair<int, int>> topos;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
        else if (!strcmp(argv[i], "--divisor") && i + 1 < argc) divisor = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sum-ctas") && i + 1 < argc) sum_ctas = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--landing-ctas") && i + 1 < argc)
            landing_ctas = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--modes") && i + 1 < argc) {
            char list[256];
            snprintf(list, sizeof list, "%s", argv[++i]);
            for (int m = 0; m < MODE_COUNT; ++m) mode_on[m] = false;
            for (char *tok = strtok(list, ","); tok; tok = strtok(nullptr, ",")) {
                int found = -1;
                for (int m = 0; m < MODE_COUNT; ++m)
                    if (!strcmp(tok, MODES[m].name)) found = m;
                if (found < 0) {
                    fprintf(stderr, "bench_fabric_cuda: unknown mode %s\n", tok);
                    return 2;
                }
                mode_on[found] = true;
            }
        }
        else if (!strcmp(argv[i], "--topology") && i + 1 < argc) {
            int m, l;
            if (sscanf(argv[++i], "%dx%d", &m, &l) != 2) return 2;
            topos.push_back({m, l});
        } else {
            fprintf(stderr, "usage: bench_fabric_cuda [--preset P] [--divisor D] [--iters N] "
                            "[--topology MxL]... [--sum-ctas C] [--landing-ctas C] "
                            "[--modes batched,batched-all,per-op,no-direct,direct-sum,"
                            "direct-sum-zero,direct-fused]\n");
            return 2;
        }
    }
    if (topos.empty()) topos = {{1, 8}, {2, 4}};
    if (divisor < 1 || iters < 1 || sum_ctas < 0 || landing_ctas < 0) return 2;
    const char *user = getenv("TIDE_CUDA_BATCH_MAX_BYTES");
    if (user != nullptr && strlen(user) >= sizeof user_max_bytes) {
        fprintf(stderr, "bench_fabric_cuda: TIDE_CUDA_BATCH_MAX_BYTES is too long\n");
        return 2;
    }
    if (user != nullptr) snprintf(user_max_bytes, sizeof user_max_bytes, "%s", user);
    printf("# emulated topologies on one GPU: every byte moves on SMs (same-device copies do not\n"
           "# use copy engines). Times: medians of %d iterations (GPU events on the caller's\n"
           "# stream); enqueue: host time per rank per call; ratio = stock / tide.\n"
           "# The first line per topology is the default copy mode; the \"mode\" rows give the\n"
           "# three copy modes, each with a world of its own: batched (TIDE_CUDA_BATCH_MAX_BYTES,\n"
           "# default %llu: larger same-device copies per op), batched-all (no threshold) and\n"
           "# per-op (TIDE_CUDA_BATCH=0); per-op/tide = per-op GPU time / this mode's; batches,\n"
           "# batched, over-threshold: batch kernels, the copies they ran, copies per op because\n"
           "# of the threshold, in the last call.\n",
           iters, (unsigned long long)TIDE_CUDA_BATCH_MAX_BYTES_DEFAULT);
    unsigned long long wrong = 0;
    for (auto t : topos)
        wrong += run_topology(preset, t.first, t.second, divisor, iters, TIDE_RS_IN_PLACE);
    return wrong ? 1 : 0;
}
