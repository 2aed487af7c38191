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
 * Inputs are integer-valued, so both paths produce exact results: the data check after
 * timing compares them element by element on the device (#wrong); any wrong element makes
 * the exit status non-zero.
 */
#include "tide.h"
extern "C" {
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

struct result_t {
    double tide_ms, stock_ms, enqueue_us;
    unsigned long long wrong;
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

static void run_topology(const char *preset_name, int M, int L, int divisor, int iters,
                         tide_rs_mode_t mode, result_t *ag, result_t *rs) {
    const tide_preset_t *pr = tide_preset_find(preset_name);
    if (!pr) {
        fprintf(stderr, "unknown preset %s\n", preset_name);
        exit(2);
    }
    int P = pr->num_params, N = M * L;
    std::vector<tide_param_shape_t> shapes(pr->shapes, pr->shapes + P);
    for (auto &s : shapes) s.dim0 = (s.dim0 + divisor - 1) / divisor;

    std::vector<tide_comm_t> comms(N);
    TK(tide_comm_init_all(TIDE_FABRIC_CUDA, M, L, comms.data()));
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = M, cfg.gpus_per_node = L;
    tide_group_desc_t desc = {P, shapes.data(), TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
    std::vector<tide_group_t> groups(N);
    for (int r = 0; r < N; ++r) TK(tide_group_register(comms[r], &cfg, &desc, &groups[r]));
    tide_plan_t plan;
    TK(tide_group_plan(groups[0], &plan));
    tide_plan_summary_t sum;
    TK(tide_plan_get_summary(plan, &sum));
    std::vector<tide_param_geometry_t> geo(P);
    for (int p = 0; p < P; ++p) TK(tide_plan_get_param(plan, p, &geo[p]));
    const uint64_t S = sum.shard_bytes, NS = sum.group_bytes, E = sum.fp32_shard_bytes / 4;

    /* Buffers (plain cudaMalloc; all on the current device). */
    std::vector<uint16_t *> shard(N), flat(N), landing(N);
    std::vector<std::vector<uint16_t *>> grads(N, std::vector<uint16_t *>(P));
    std::vector<float *> pack(N), out_tide(N), out_stock(N);
    for (int r = 0; r < N; ++r) {
        CK(cudaMalloc(&shard[r], S));
        CK(cudaMalloc(&flat[r], NS));
        CK(cudaMalloc(&landing[r], NS));
        CK(cudaMalloc(&pack[r], E * 4 * (uint64_t)N));
        CK(cudaMalloc(&out_tide[r], E * 4));
        CK(cudaMalloc(&out_stock[r], E * 4));
        fill_ints<<<264, 512>>>(shard[r], S / 2, 1000 + r);
        for (int p = 0; p < P; ++p) {
            uint64_t n = shapes[p].dim0 * shapes[p].inner;
            CK(cudaMalloc(&grads[r][p], n * 2));
            fill_ints<<<264, 512>>>(grads[r][p], n, 7 * r + 13 * p + 5);
        }
    }
    /* Copy-out table (same for every rank: from flat u S + o_p to o_p N + u s_p). */
    std::vector<seg_t> segs;
    for (int p = 0; p < P; ++p)
        for (int u = 0; u < N; ++u)
            segs.push_back({u * S + geo[p].shard_offset, geo[p].shard_offset * N + u * geo[p].shard_bytes,
                            geo[p].shard_bytes});
    seg_t *d_segs;
    CK(cudaMalloc(&d_segs, segs.size() * sizeof(seg_t)));
    CK(cudaMemcpy(d_segs, segs.data(), segs.size() * sizeof(seg_t), cudaMemcpyHostToDevice));
    std::vector<pack_param_t *> d_pp(N);
    for (int r = 0; r < N; ++r) {
        std::vector<pack_param_t> pp(P);
        for (int p = 0; p < P; ++p)
            pp[p] = {grads[r][p], geo[p].rows_per_rank * geo[p].inner,
                     geo[p].dim0 * geo[p].inner, geo[p].fp32_offset / 4};
        CK(cudaMalloc(&d_pp[r], P * sizeof(pack_param_t)));
        CK(cudaMemcpy(d_pp[r], pp.data(), P * sizeof(pack_param_t), cudaMemcpyHostToDevice));
    }
    float **d_packs;
    CK(cudaMalloc(&d_packs, N * sizeof(float *)));
    CK(cudaMemcpy(d_packs, pack.data(), N * sizeof(float *), cudaMemcpyHostToDevice));
    unsigned long long *d_wrong;
    CK(cudaMalloc(&d_wrong, sizeof(*d_wrong)));
    CK(cudaDeviceSynchronize());

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float alpha = (N & (N - 1)) == 0 ? 1.0f / N : 1.0f;
    std::vector<double> t_ag, t_ags, t_rs, t_rss, enq_ag, enq_rs;
    int last_slot = 0;
    for (int it = -1; it < iters; ++it) {
        int slot = (it + 1) % 2;
        double ms;
        /* TIDE-AG: every rank's call, then the caller's stream joins the call. */
        CK(cudaEventRecord(e0, st));
        double h0 = now_us();
        for (int r = 0; r < N; ++r) TK(tide_all_gather(groups[r], shard[r], slot, st));
        double h1 = now_us();
        CK(cudaEventRecord(e1, st));
        ms = event_ms(e0, e1);
        if (it >= 0) t_ag.push_back(ms), enq_ag.push_back((h1 - h0) / N);
        last_slot = slot;
        /* Stock AG. */
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < N; ++r) {
            for (int u = 0; u < N; ++u)
                CK(cudaMemcpyAsync((uint8_t *)flat[r] + u * S, shard[u], S,
                                   cudaMemcpyDeviceToDevice, st));
            copy_segments<<<1056, 512, 0, st>>>(d_segs, (int)segs.size(), (const uint8_t *)flat[r],
                                                (uint8_t *)landing[r]);
        }
        CK(cudaEventRecord(e1, st));
        ms = event_ms(e0, e1);
        if (it >= 0) t_ags.push_back(ms);
        /* TIDE-RS. */
        CK(cudaEventRecord(e0, st));
        h0 = now_us();
        for (int r = 0; r < N; ++r)
            TK(tide_reduce_scatter(groups[r], (const void *const *)grads[r].data(), out_tide[r],
                                   alpha, 0, mode, st));
        h1 = now_us();
        CK(cudaEventRecord(e1, st));
        ms = event_ms(e0, e1);
        if (it >= 0) t_rs.push_back(ms), enq_rs.push_back((h1 - h0) / N);
        /* Stock RS. */
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < N; ++r) chunk_cat<<<1056, 512, 0, st>>>(d_pp[r], P, N, E, pack[r]);
        for (int r = 0; r < N; ++r)
            reduce_chunk<<<1056, 512, 0, st>>>(d_packs, N, (uint64_t)r * E, E, alpha, out_stock[r]);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1, st));
        ms = event_ms(e0, e1);
        if (it >= 0) t_rss.push_back(ms);
    }
    /* Data check after timing. */
    ag->wrong = rs->wrong = 0;
    for (int r = 0; r < N; ++r) {
        void *land;
        TK(tide_group_landing(groups[r], last_slot, &land));
        ag->wrong += diff_words(land, landing[r], NS, d_wrong);
        rs->wrong += diff_words(out_tide[r], out_stock[r], E * 4, d_wrong);
    }
    /* The reported "median" is the upper middle value, v[n / 2], for an even --iters. */
    ag->tide_ms = quantile(t_ag, 0.5), ag->stock_ms = quantile(t_ags, 0.5);
    ag->enqueue_us = quantile(enq_ag, 0.5);
    rs->tide_ms = quantile(t_rs, 0.5), rs->stock_ms = quantile(t_rss, 0.5);
    rs->enqueue_us = quantile(enq_rs, 0.5);
    printf("%-22s %dx%d dim0/%-3d P=%-3d group %8.1f MiB | AG tide %8.3f ms stock %8.3f ms "
           "ratio %5.2fx enqueue %7.1f us/rank desc %llu wrong %llu | RS tide %8.3f ms stock "
           "%8.3f ms ratio %5.2fx enqueue %7.1f us/rank desc %llu wrong %llu\n",
           preset_name, M, L, divisor, P, NS / 1048576.0, ag->tide_ms, ag->stock_ms,
           ag->stock_ms / ag->tide_ms, ag->enqueue_us, (unsigned long long)sum.ag_descriptors_max,
           ag->wrong, rs->tide_ms, rs->stock_ms, rs->stock_ms / rs->tide_ms, rs->enqueue_us,
           (unsigned long long)sum.rs_descriptors, rs->wrong);
    fflush(stdout);
    for (int r = 0; r < N; ++r) TK(tide_group_deregister(groups[r]));
    for (int r = 0; r < N; ++r) TK(tide_comm_destroy(comms[r]));
    for (int r = 0; r < N; ++r) {
        cudaFree(shard[r]), cudaFree(flat[r]), cudaFree(landing[r]), cudaFree(pack[r]);
        cudaFree(out_tide[r]), cudaFree(out_stock[r]), cudaFree(d_pp[r]);
        for (int p = 0; p < P; ++p) cudaFree(grads[r][p]);
    }
    cudaFree(d_segs), cudaFree(d_packs), cudaFree(d_wrong);
    cudaStreamDestroy(st), cudaEventDestroy(e0), cudaEventDestroy(e1);
}

int main(int argc, char **argv) {
    const char *preset = "llama3-70b-layer";
    int divisor = 1, iters = 10;
    std::vector<std::pair<int, int>> topos;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
        else if (!strcmp(argv[i], "--divisor") && i + 1 < argc) divisor = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--topology") && i + 1 < argc) {
            int m, l;
            if (sscanf(argv[++i], "%dx%d", &m, &l) != 2) return 2;
            topos.push_back({m, l});
        } else {
            fprintf(stderr, "usage: bench_fabric_cuda [--preset P] [--divisor D] [--iters N] "
                            "[--topology MxL]...\n");
            return 2;
        }
    }
    if (topos.empty()) topos = {{1, 8}, {2, 4}};
    if (divisor < 1 || iters < 1) return 2;
    printf("# emulated topologies on one GPU: every byte moves on SMs (same-device copies do not\n"
           "# use copy engines). Times: medians of %d iterations (GPU events on the caller's\n"
           "# stream); enqueue: host time per rank per call; ratio = stock / tide.\n",
           iters);
    unsigned long long wrong = 0;
    for (auto t : topos) {
        result_t ag, rs;
        run_topology(preset, t.first, t.second, divisor, iters, TIDE_RS_IN_PLACE, &ag, &rs);
        wrong += ag.wrong + rs.wrong;
    }
    return wrong ? 1 : 0;
}
