/*
 * bench_kernels.cu - throughput of the Level-1 sum, the landing and the cast per CTA budget.
 *
 * Metric (paper §4.1): logical bytes read plus bytes written per second.  For the L = 8 bf16
 * sum that is 7 staged + 1 own bf16 reads (16 B) and one fp32 write (4 B) per output element.
 * The ceiling is a large device-to-device cudaMemcpy measured in the same run, counted the
 * same way (bytes read + bytes written).
 *
 * Method: inputs are random (never zeros), every launch reads >= 512 MiB (far above the
 * 60 MB L2) and consecutive launches alternate between two input sets; each configuration
 * is warmed up, then timed launch by launch with CUDA events, and the median of the reps is
 * reported.
 *
 * The last line names the fastest configuration of the L = 8 bf16 sum (1 Mi-element segments)
 * at 4 and at 16 CTAs among every row measured in the run.  Before any timing, every sum
 * configuration is checked against PLAIN bit for bit on the bench data; a difference makes
 * the exit status 1 (the figures are still printed).
 *
 * Usage: bench_kernels [reps] [--sum-only] [--tune] [--quick] [--sweep] [--profile C]
 *   reps        timed launches per row (default 20)
 *   --sum-only  skip the landing and the cast
 *   --quick     the bit check, then only the default sum (TIDE_SUM_AUTO) at 4 and 16 CTAs
 *               and at L = 2..8 sources with 4, 16 and 28 CTAs; implies --sum-only (a check
 *               of the default's speed in about 30 s)
 *   --tune      also sweep the TMA sum's internal options (producer warps, consumer threads,
 *               stage size, consumer layout, NaN select) and probes that release every stage
 *               unread (the copy engine alone)
 *   --sweep     with --quick: also the TMA sum's producer / consumer-warp pairs that the build's
 *               launch bound allows, at 4 and 16 CTAs, and the two probes (copies alone,
 *               consumers alone); for builds with TIDE_TMA_UNITS / TIDE_TMA_MAX_THREADS
 *               (tests/gpu/sum_variants.sh)
 *   --profile C three launches of the default sum at C CTAs (1 Mi-element segments), untimed
 *               and unchecked, then exit: a target for Nsight Compute (docs/kernels.md)
 */
#include "cuda_ok.h"
#include "gpu_hash.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/launch.h"
#include "kernels/sum_tma.cuh"

__global__ void fill_bf16(uint16_t *p, uint64_t n, uint32_t seed) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        p[i] = (uint16_t)(__float_as_uint(hash_value(i, seed)) >> 16);
}
__global__ void fill_f32(float *p, uint64_t n, uint32_t seed) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        p[i] = hash_value(i, seed);
}

static int g_reps = 20;

/* Median milliseconds of `launch(rep)` over g_reps timed launches after 3 warm-ups. */
static double median_ms(const std::function<void(int)> &launch) {
    cudaEvent_t a, b;
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i)
        launch(i);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> t(g_reps);
    for (int i = 0; i < g_reps; ++i) {
        CUDA_OK(cudaEventRecord(a));
        launch(i);
        CUDA_OK(cudaEventRecord(b));
        CUDA_OK(cudaEventSynchronize(b));
        CUDA_OK(cudaEventElapsedTime(&t[i], a, b));
    }
    CUDA_OK(cudaEventDestroy(a));
    CUDA_OK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return g_reps % 2 ? t[g_reps / 2] : 0.5 * (t[g_reps / 2 - 1] + t[g_reps / 2]);
}

struct row {
    char kernel[40];
    int ctas, threads;
    double gbs;
    bool sum; /* the L = 8 bf16 sum over 1 Mi-element segments (the summary's candidates) */
};
static std::vector<row> g_rows;
static double g_copy_gbs = 0;

static void record(const char *kernel, int ctas, int threads, double bytes, double ms,
                   bool sum = false) {
    row r;
    std::snprintf(r.kernel, sizeof r.kernel, "%s", kernel);
    r.ctas = ctas;
    r.threads = threads;
    r.sum = sum;
    r.gbs = bytes / (ms * 1e-3) / 1e9;
    g_rows.push_back(r);
    std::printf("  %-28s ctas %4d threads %4d  %8.3f ms  %9.1f GB/s  %7.1f GB/s/CTA\n", kernel,
                ctas, threads, ms, r.gbs, r.gbs / ctas);
    std::fflush(stdout);
}

int main(int argc, char **argv) {
    bool sum_only = false, tune = false, quick = false, sweep = false;
    int profile_ctas = 0;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--profile") == 0 && i + 1 < argc)
            profile_ctas = std::max(1, std::atoi(argv[++i]));
        else if (std::strcmp(argv[i], "--sum-only") == 0)
            sum_only = true;
        else if (std::strcmp(argv[i], "--quick") == 0)
            quick = sum_only = true;
        else if (std::strcmp(argv[i], "--tune") == 0)
            tune = true;
        else if (std::strcmp(argv[i], "--sweep") == 0)
            sweep = true;
        else
            g_reps = std::max(5, std::atoi(argv[i]));
    }
    std::setvbuf(stdout, nullptr, _IOLBF, 0); /* progress survives a timeout */
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    std::printf("device %s, %d SMs, L2 %d MB, reps %d (median)\n", prop.name, sms,
                prop.l2CacheSize >> 20, g_reps);

    /* ---- copy ceiling: 1 GiB device-to-device, bytes read + written */
    {
        const size_t bytes = 1ull << 30;
        void *src, *dst;
        CUDA_OK(cudaMalloc(&src, bytes));
        CUDA_OK(cudaMalloc(&dst, bytes));
        fill_f32<<<4 * sms, 512>>>((float *)src, bytes / 4, 1);
        CUDA_OK(cudaGetLastError());
        double ms = median_ms(
            [&](int) { CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
        g_copy_gbs = 2.0 * bytes / (ms * 1e-3) / 1e9;
        std::printf("copy: cudaMemcpy D2D 1 GiB: %.3f ms, %.1f GB/s (read + write)\n", ms,
                    g_copy_gbs);
        CUDA_OK(cudaFree(src));
        CUDA_OK(cudaFree(dst));
    }

    /* ---- Level-1 sum, L = 8, bf16: 32 Mi output elements, 512 MiB of inputs per launch */
    const int NS = 7;
    const uint64_t E = 32ull << 20;
    const int nsets = 2, nown = 4;
    uint16_t *staged[nsets], *own[nsets][nown];
    const void **d_table[nsets];
    float *out[nsets];
    for (int s = 0; s < nsets; ++s) {
        CUDA_OK(cudaMalloc(&staged[s], (size_t)NS * E * 2));
        fill_bf16<<<4 * sms, 512>>>(staged[s], (uint64_t)NS * E, 10 + s);
        const void *tbl[nown];
        for (int k = 0; k < nown; ++k) {
            CUDA_OK(cudaMalloc(&own[s][k], E / nown * 2));
            fill_bf16<<<4 * sms, 512>>>(own[s][k], E / nown, 20 + 4 * s + k);
            tbl[k] = own[s][k];
        }
        CUDA_OK(cudaMalloc(&d_table[s], sizeof tbl));
        CUDA_OK(cudaMemcpy(d_table[s], tbl, sizeof tbl, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMalloc(&out[s], E * 4));
    }
    CUDA_OK(cudaGetLastError());
    /* Segment tables: one per segment length; own rows spread over nown tensors. */
    auto make_segs = [&](uint32_t seg_len, int *count) {
        const int n = (int)(E / seg_len);
        std::vector<tide_sum_seg_t> h(n);
        for (int i = 0; i < n; ++i)
            h[i] = {(uint64_t)i * seg_len,
                    (uint64_t)i * seg_len,
                    (uint64_t)(i / nown) * seg_len,
                    seg_len,
                    seg_len,
                    (int32_t)(i % nown),
                    0};
        tide_sum_seg_t *d;
        CUDA_OK(cudaMalloc(&d, n * sizeof *d));
        CUDA_OK(cudaMemcpy(d, h.data(), n * sizeof *d, cudaMemcpyHostToDevice));
        *count = n;
        return d;
    };
    int nseg_big, nseg_small;
    tide_sum_seg_t *segs_big = make_segs(1u << 20, &nseg_big);
    tide_sum_seg_t *segs_small = make_segs(1u << 14, &nseg_small);
    const double sum_bytes = (double)E * ((NS + 1) * 2 + 4);
    auto sum_args = [&](int set, tide_sum_seg_t *segs, int n) {
        tide_sum_args_t a = {segs,         n,           staged[set],     E, NS,
                             d_table[set], TIDE_DTYPE_BF16, out[set], nullptr, 0, nullptr,
                             0,            0};
        return a;
    };

    auto run_sum = [&](const char *name, tide_sum_launch_t cfg, tide_sum_seg_t *segs, int n) {
        double ms = median_ms([&](int i) {
            tide_sum_args_t a = sum_args(i % nsets, segs, n);
            CUDA_OK(tide_cuda_sum_launch(&a, &cfg, 0));
        });
        record(name, cfg.ctas, cfg.threads, sum_bytes, ms, segs == segs_big);
    };

    if (profile_ctas > 0) {
        const tide_sum_launch_t cfg = {TIDE_SUM_AUTO, profile_ctas, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < 3; ++i) {
            tide_sum_args_t a = sum_args(i % nsets, segs_big, nseg_big);
            CUDA_OK(tide_cuda_sum_launch(&a, &cfg, 0));
        }
        CUDA_OK(cudaDeviceSynchronize());
        std::printf("profile: 3 launches of the default sum at %d CTAs\n", profile_ctas);
        return 0;
    }

    /* The timed sum configurations (ctas set per row).  PLAIN2 rows: U groups a thread.
     * HYBRID rows: R sources bulk-copied, U groups a consumer thread, c consumer threads, p
     * producer warps. */
    struct variant {
        const char *name;
        tide_sum_launch_t cfg;
    };
    const int ring = 227 * 1024;
    const variant variants[] = {
        {"sum plain", {TIDE_SUM_PLAIN, 0, 1024, 0, 0, 0, 0, 0}},
        {"sum async", {TIDE_SUM_ASYNC, 0, 448, 0, 0, 0, 0, 0}},
        {"sum tma st16K ring128K", {TIDE_SUM_TMA, 0, 288, 128 * 1024, 16384, 0, 0, 0}},
        {"sum tma st64K ring200K", {TIDE_SUM_TMA, 0, 288, 200 * 1024, 65536, 0, 0, 0}},
        {"sum tma st64K ring200K", {TIDE_SUM_TMA, 0, 512, 200 * 1024, 65536, 0, 0, 0}},
        {"sum tma st72K ring216K", {TIDE_SUM_TMA, 0, 288, ring, 73728, 0, 0, 0}},
        {"sum tma st112K ring224K", {TIDE_SUM_TMA, 0, 288, ring, 114688, 0, 0, 0}},
        {"sum tma st112K ring224K", {TIDE_SUM_TMA, 0, 512, ring, 114688, 0, 0, 0}},
        {"sum tma st64K 2prod", {TIDE_SUM_TMA, 0, 320, 200 * 1024, 65536, 2, 0, 0}},
        {"sum tma st112K 2prod", {TIDE_SUM_TMA, 0, 512, ring, 114688, 2, 0, 0}},
        {"sum plain2 u2", {TIDE_SUM_PLAIN2, 0, 512, 0, 0, 0, 2, 0}},
        {"sum plain2 u2", {TIDE_SUM_PLAIN2, 0, 384, 0, 0, 0, 2, 0}},
        {"sum plain2 u3", {TIDE_SUM_PLAIN2, 0, 384, 0, 0, 0, 3, 0}},
        {"sum plain2 u4", {TIDE_SUM_PLAIN2, 0, 256, 0, 0, 0, 4, 0}},
        {"sum hybrid R4 u2 c480 p1", {TIDE_SUM_HYBRID, 0, 512, ring, 0, 1, 2, 4}},
        {"sum hybrid R5 u2 c480 p1", {TIDE_SUM_HYBRID, 0, 512, ring, 0, 1, 2, 5}},
        {"sum hybrid R6 u2 c480 p1", {TIDE_SUM_HYBRID, 0, 512, ring, 0, 1, 2, 6}},
        {"sum hybrid R7 u2 c480 p1", {TIDE_SUM_HYBRID, 0, 512, ring, 0, 1, 2, 7}},
        {"sum hybrid R7 u2 c448 p2", {TIDE_SUM_HYBRID, 0, 512, ring, 0, 2, 2, 7}},
        {"sum hybrid R6 u2 c352 p1", {TIDE_SUM_HYBRID, 0, 384, ring, 0, 1, 2, 6}},
        {"sum hybrid R7 u2 c352 p1", {TIDE_SUM_HYBRID, 0, 384, ring, 0, 1, 2, 7}},
        {"sum hybrid R6 u2 c224 p1", {TIDE_SUM_HYBRID, 0, 256, ring, 0, 1, 2, 6}},
        {"sum hybrid R7 u2 c224 p1", {TIDE_SUM_HYBRID, 0, 256, ring, 0, 1, 2, 7}},
        {"sum hybrid R4 u4 c256 p1", {TIDE_SUM_HYBRID, 0, 288, ring, 0, 1, 4, 4}},
        {"sum hybrid R6 u4 c256 p1", {TIDE_SUM_HYBRID, 0, 288, ring, 0, 1, 4, 6}},
        {"sum hybrid R7 u4 c256 p1", {TIDE_SUM_HYBRID, 0, 288, ring, 0, 1, 4, 7}}};

    /* Every configuration agrees with PLAIN bit for bit on the bench data (the GPU test
     * covers every L, dtype and layout). */
    int bench_differ = 0;
    {
        const size_t n = 1 << 20;
        std::vector<float> ref(n), h(n);
        tide_sum_args_t a = sum_args(0, segs_big, nseg_big);
        const tide_sum_launch_t plain = {TIDE_SUM_PLAIN, sms, 1024, 0, 0, 0, 0, 0};
        CUDA_OK(tide_cuda_sum_launch(&a, &plain, 0));
        CUDA_OK(cudaMemcpy(ref.data(), out[0] + (E >> 1), n * 4, cudaMemcpyDeviceToHost));
        for (const variant &v : variants) {
            tide_sum_launch_t cfg = v.cfg;
            cfg.ctas = sms;
            CUDA_OK(cudaMemset(out[0], 0xff, E * 4));
            CUDA_OK(tide_cuda_sum_launch(&a, &cfg, 0));
            CUDA_OK(cudaMemcpy(h.data(), out[0] + (E >> 1), n * 4, cudaMemcpyDeviceToHost));
            if (std::memcmp(ref.data(), h.data(), n * 4) != 0) {
                std::printf("sum: %s (threads %d) DIFFERS from plain\n", v.name, v.cfg.threads);
                ++bench_differ;
            }
        }
        std::printf("sum: every configuration %s plain\n",
                    bench_differ ? "does NOT match" : "matches");
    }

    /* A TMA option that sums must give the plain variant's bits on the bench data: 1 if it
     * does not (and a line saying so). */
    std::vector<float> tma_ref;
    auto tma_differs = [&](const char *name, tide_sum::tma_opts o) {
        const size_t n = 1 << 20;
        tide_sum_args_t a = sum_args(0, segs_big, nseg_big);
        if (tma_ref.empty()) {
            tma_ref.resize(n);
            const tide_sum_launch_t plain = {TIDE_SUM_PLAIN, sms, 1024, 0, 0, 0, 0, 0};
            CUDA_OK(tide_cuda_sum_launch(&a, &plain, 0));
            CUDA_OK(cudaMemcpy(tma_ref.data(), out[0] + (E >> 1), n * 4,
                               cudaMemcpyDeviceToHost));
        }
        std::vector<float> h(n);
        o.ctas = sms;
        CUDA_OK(cudaMemset(out[0], 0xff, E * 4));
        CUDA_OK(tide_sum::launch_tma_opts(a, o, 0));
        CUDA_OK(cudaMemcpy(h.data(), out[0] + (E >> 1), n * 4, cudaMemcpyDeviceToHost));
        if (std::memcmp(tma_ref.data(), h.data(), n * 4) == 0) return 0;
        std::printf("sum: %s DIFFERS from plain\n", name);
        return 1;
    };

    if (tune) {
        /* Internal options of the TMA sum (sum_tma.cuh): threads, producer warps, stage size,
         * consumer layout, NaN select.  "none" rows release every stage unread: the
         * copy engine's rate with nothing else running (their output is not the sum). */
        struct tune_row {
            const char *name;
            tide_sum::tma_opts o;
        };
        using namespace tide_sum;
        const tune_row rows[] = {
            {"tune none st112K p2 t320", {0, 320, 2, 0, 114688, TMA_CONSUME_NONE, 0}},
            {"tune none st112K p4 t384", {0, 384, 4, 0, 114688, TMA_CONSUME_NONE, 0}},
            {"tune none st112K p8 t512", {0, 512, 8, 0, 114688, TMA_CONSUME_NONE, 0}},
            {"tune groups st112K p4 t384", {0, 384, 4, 0, 114688, TMA_CONSUME_GROUPS, 0}},
            {"tune units st112K p1 t288", {0, 288, 1, 0, 114688, TMA_CONSUME_UNITS, 0}},
            {"tune units st112K p2 t288", {0, 288, 2, 0, 114688, TMA_CONSUME_UNITS, 0}},
            {"tune units st112K p2 t320", {0, 320, 2, 0, 114688, TMA_CONSUME_UNITS, 0}},
            {"tune units st112K p2 t320 raw", {0, 320, 2, 0, 114688, TMA_CONSUME_UNITS, 1}},
            {"tune units st112K p4 t256", {0, 256, 4, 0, 114688, TMA_CONSUME_UNITS, 0}},
            {"tune units st112K p4 t288", {0, 288, 4, 0, 114688, TMA_CONSUME_UNITS, 0}},
            {"tune units st112K p4 t288 raw", {0, 288, 4, 0, 114688, TMA_CONSUME_UNITS, 1}},
            {"tune units st112K p4 t384", {0, 384, 4, 0, 114688, TMA_CONSUME_UNITS, 0}},
            {"tune units st112K p4 t384 raw", {0, 384, 4, 0, 114688, TMA_CONSUME_UNITS, 1}},
            {"tune units st112K p4 t512", {0, 512, 4, 0, 114688, TMA_CONSUME_UNITS, 0}},
            {"tune units st112K p8 t384", {0, 384, 8, 0, 114688, TMA_CONSUME_UNITS, 0}},
            {"tune units st112K p8 t512", {0, 512, 8, 0, 114688, TMA_CONSUME_UNITS, 0}},
            {"tune units st112K p8 t512 raw", {0, 512, 8, 0, 114688, TMA_CONSUME_UNITS, 1}},
            {"tune units st112K p8 t768", {0, 768, 8, 0, 114688, TMA_CONSUME_UNITS, 0}},
            {"tune units st72K p4 t384", {0, 384, 4, 0, 73728, TMA_CONSUME_UNITS, 0}},
            {"tune units st64K p4 t384", {0, 384, 4, 0, 65536, TMA_CONSUME_UNITS, 0}},
            {"tune units st64K p8 t512", {0, 512, 8, 0, 65536, TMA_CONSUME_UNITS, 0}},
            {"tune units st64K p8 t512 raw", {0, 512, 8, 0, 65536, TMA_CONSUME_UNITS, 1}},
        };
        /* Options past this build's launch bound (TIDE_TMA_MAX_THREADS) are not run. */
        int differ = 0;
        for (const tune_row &r : rows)
            if (r.o.consume != TMA_CONSUME_NONE && r.o.threads <= kTmaMaxThreads)
                differ += tma_differs(r.name, r.o);
        std::printf("sum: TMA internal options %s plain\n", differ ? "DIFFER from" : "match");
        bench_differ += differ;
        std::printf("sum L=8 bf16, TMA internal options, 1 Mi-element segments:\n");
        for (const tune_row &r : rows)
            for (int c : {1, 4, 16, sms}) {
                if (r.o.threads > kTmaMaxThreads) break;
                tma_opts o = r.o;
                o.ctas = c;
                double ms = median_ms([&](int i) {
                    tide_sum_args_t a = sum_args(i % nsets, segs_big, nseg_big);
                    CUDA_OK(launch_tma_opts(a, o, 0));
                });
                record(r.name, c, o.threads, sum_bytes, ms, r.o.consume != TMA_CONSUME_NONE);
            }
    }

    if (sweep) {
        /* The build's knobs (sum_tma.cuh) and every pair its launch bound allows. */
        using namespace tide_sum;
        std::printf("sum L=8 bf16, TMA sweep: units %d a step, launch bound %d threads\n",
                    TIDE_TMA_UNITS > 0 ? TIDE_TMA_UNITS : 2, kTmaMaxThreads);
        struct sweep_row {
            const char *name;
            tma_opts o;
        };
        const sweep_row rows[] = {
            {"sweep units p2 t320", {0, 320, 2, 0, 114688, TMA_CONSUME_UNITS, 1}},
            {"sweep units p2 t384", {0, 384, 2, 0, 114688, TMA_CONSUME_UNITS, 1}},
            {"sweep units p2 t448", {0, 448, 2, 0, 114688, TMA_CONSUME_UNITS, 1}},
            {"sweep units p2 t576", {0, 576, 2, 0, 114688, TMA_CONSUME_UNITS, 1}},
            {"sweep units p4 t384", {0, 384, 4, 0, 114688, TMA_CONSUME_UNITS, 1}},
            {"sweep units p4 t512", {0, 512, 4, 0, 114688, TMA_CONSUME_UNITS, 1}},
            {"sweep units p4 st72K t384", {0, 384, 4, 0, 73728, TMA_CONSUME_UNITS, 1}},
            {"sweep units p4 st72K t512", {0, 512, 4, 0, 73728, TMA_CONSUME_UNITS, 1}},
            {"sweep nocopy p2 t320", {0, 320, 2, 0, 114688, TMA_CONSUME_NOCOPY, 1}},
            {"sweep nocopy p2 t448", {0, 448, 2, 0, 114688, TMA_CONSUME_NOCOPY, 1}},
            {"sweep nocopy p4 st72K t384", {0, 384, 4, 0, 73728, TMA_CONSUME_NOCOPY, 1}},
            {"sweep none p2 t320", {0, 320, 2, 0, 114688, TMA_CONSUME_NONE, 1}},
            {"sweep none p4 st72K t384", {0, 384, 4, 0, 73728, TMA_CONSUME_NONE, 1}},
        };
        for (const sweep_row &r : rows) {
            if (r.o.threads > kTmaMaxThreads) continue;
            const bool sums = r.o.consume == TMA_CONSUME_UNITS;
            if (sums) bench_differ += tma_differs(r.name, r.o);
            for (int c : {4, 16}) {
                tma_opts o = r.o;
                o.ctas = c;
                double ms = median_ms([&](int i) {
                    tide_sum_args_t a = sum_args(i % nsets, segs_big, nseg_big);
                    CUDA_OK(launch_tma_opts(a, o, 0));
                });
                record(r.name, c, o.threads, sum_bytes, ms, sums);
            }
        }
    }

    std::printf("sum L=8 bf16, 32 Mi elements, 1 Mi-element segments:\n");
    const int cta_list[] = {1, 2, 4, 8, 16, 32, 64, sms};
    for (const variant &v : variants)
        for (int c : cta_list) {
            if (quick) break;
            tide_sum_launch_t cfg = v.cfg;
            cfg.ctas = c;
            run_sum(v.name, cfg, segs_big, nseg_big);
        }
    std::printf("sum L=8 bf16, TIDE_SUM_AUTO with its defaults:\n");
    for (int c : {4, 16})
        run_sum("sum auto (defaults)", {TIDE_SUM_AUTO, c, 0, 0, 0, 0, 0, 0}, segs_big, nseg_big);
    /* The per-CTA rate against the number of sources: the planner's BW_sum at M = 1 is the
     * paper's L = 8 rate scaled by these rows' ratio to L = 8 (tide_plan_bw_sum_gbps,
     * src/plan/solver.c; tests/gpu/sum_by_l.sh prints it).  Fewer sources move fewer bytes
     * per output element for the same per-element work. */
    std::printf("sum bf16 by L, TIDE_SUM_AUTO with its defaults, 1 Mi-element segments:\n");
    for (int l = 2; l <= 8; ++l)
        for (int c : {4, 16, 28}) {
            char name[40];
            std::snprintf(name, sizeof name, "sum auto L=%d", l);
            const double bytes = (double)E * (l * 2 + 4);
            tide_sum_launch_t cfg = {TIDE_SUM_AUTO, c, 0, 0, 0, 0, 0, 0};
            double ms = median_ms([&](int i) {
                tide_sum_args_t a = sum_args(i % nsets, segs_big, nseg_big);
                a.num_staged = l - 1;
                CUDA_OK(tide_cuda_sum_launch(&a, &cfg, 0));
            });
            record(name, c, 0, bytes, ms);
        }
    if (!quick) std::printf("sum L=8 bf16, 16 Ki-element segments:\n");
    for (int c : {4, 16}) {
        if (quick) break;
        run_sum("sum plain seg16K", {TIDE_SUM_PLAIN, c, 1024, 0, 0, 0, 0, 0}, segs_small,
                nseg_small);
        run_sum("sum async seg16K", {TIDE_SUM_ASYNC, c, 448, 0, 0, 0, 0, 0}, segs_small,
                nseg_small);
        run_sum("sum tma st16K seg16K", {TIDE_SUM_TMA, c, 288, 128 * 1024, 16384, 0, 0, 0},
                segs_small, nseg_small);
        run_sum("sum tma st64K seg16K", {TIDE_SUM_TMA, c, 288, 200 * 1024, 65536, 0, 0, 0},
                segs_small, nseg_small);
        run_sum("sum tma st112K seg16K", {TIDE_SUM_TMA, c, 288, ring, 114688, 0, 0, 0},
                segs_small, nseg_small);
        run_sum("sum plain2 u2 seg16K", {TIDE_SUM_PLAIN2, c, 512, 0, 0, 0, 2, 0}, segs_small,
                nseg_small);
        run_sum("sum hybrid R6 u2 seg16K", {TIDE_SUM_HYBRID, c, 512, ring, 0, 1, 2, 6},
                segs_small, nseg_small);
    }
    for (int s = 0; s < nsets; ++s) {
        CUDA_OK(cudaFree(staged[s]));
        for (int k = 0; k < nown; ++k)
            CUDA_OK(cudaFree(own[s][k]));
        CUDA_OK(cudaFree(d_table[s]));
        CUDA_OK(cudaFree(out[s]));
    }
    CUDA_OK(cudaFree(segs_big));
    CUDA_OK(cudaFree(segs_small));

    /* ---- landing, L = 8 fp32 inbox blocks, accumulate: 32 B + 4 B read, 4 B written */
    if (!sum_only) {
        const uint64_t N = 16ull << 20, seg = 1u << 20;
        float *in[nsets][8], *lout;
        for (int s = 0; s < nsets; ++s)
            for (int k = 0; k < 8; ++k) {
                CUDA_OK(cudaMalloc(&in[s][k], N * 4));
                fill_f32<<<4 * sms, 512>>>(in[s][k], N, 100 + 8 * s + k);
            }
        CUDA_OK(cudaMalloc(&lout, N * 4));
        fill_f32<<<4 * sms, 512>>>(lout, N, 99);
        std::vector<tide_land_seg_t> h(N / seg);
        for (size_t i = 0; i < h.size(); ++i)
            h[i] = {i * seg, i * seg, (uint32_t)seg, 0};
        tide_land_seg_t *d;
        CUDA_OK(cudaMalloc(&d, h.size() * sizeof *d));
        CUDA_OK(cudaMemcpy(d, h.data(), h.size() * sizeof *d, cudaMemcpyHostToDevice));
        std::printf("landing L=8 fp32, accumulate, 16 Mi elements:\n");
        for (int threads : {512, 1024})
            for (int c : {1, 2, 4, 8, 16, sms}) {
                double ms = median_ms([&](int i) {
                    tide_land_args_t a = {};
                    a.segs = d;
                    a.num_segs = (int)h.size();
                    for (int k = 0; k < 8; ++k)
                        a.in[k] = in[i % nsets][k];
                    a.num_in = 8;
                    a.out = lout;
                    a.alpha = 0.125f;
                    a.init = false;
                    CUDA_OK(tide_cuda_land(&a, c, threads, 0));
                });
                record("land L=8 acc", c, threads, (double)N * 40, ms);
            }
        for (int s = 0; s < nsets; ++s)
            for (int k = 0; k < 8; ++k)
                CUDA_OK(cudaFree(in[s][k]));
        CUDA_OK(cudaFree(lout));
        CUDA_OK(cudaFree(d));
    }

    /* ---- cast fp32 -> bf16: 4 B read, 2 B written */
    if (!sum_only) {
        const uint64_t N = 128ull << 20;
        float *cin[nsets];
        uint16_t *cout;
        for (int s = 0; s < nsets; ++s) {
            CUDA_OK(cudaMalloc(&cin[s], N * 4));
            fill_f32<<<4 * sms, 512>>>(cin[s], N, 200 + s);
        }
        CUDA_OK(cudaMalloc(&cout, N * 2));
        std::printf("cast fp32->bf16, 128 Mi elements:\n");
        for (int threads : {512, 1024})
            for (int c : {1, 4, 16, sms}) {
                double ms = median_ms([&](int i) {
                    CUDA_OK(tide_cuda_cast_bf16(cin[i % nsets], cout, N, c, threads, 0));
                });
                record("cast", c, threads, (double)N * 6, ms);
            }
        for (int s = 0; s < nsets; ++s)
            CUDA_OK(cudaFree(cin[s]));
        CUDA_OK(cudaFree(cout));
    }

    std::printf("\n%-28s %5s %7s %11s %11s %9s\n", "kernel", "ctas", "threads", "GB/s total",
                "GB/s / CTA", "vs copy");
    for (const row &r : g_rows)
        std::printf("%-28s %5d %7d %11.1f %11.1f %8.3f\n", r.kernel, r.ctas, r.threads, r.gbs,
                    r.gbs / r.ctas, r.gbs / g_copy_gbs);
    std::printf("copy ceiling (cudaMemcpy D2D, read + write): %.1f GB/s\n", g_copy_gbs);
    /* The fastest sum row at 4 and at 16 CTAs, from this run's measurements. */
    for (int c : {4, 16}) {
        const row *best = nullptr;
        for (const row &r : g_rows)
            if (r.sum && r.ctas == c && (best == nullptr || r.gbs > best->gbs)) best = &r;
        if (best != nullptr)
            std::printf("fastest sum L=8 bf16 at %d CTAs: %s, threads %d: %.1f GB/s, "
                        "%.1f GB/s/CTA\n",
                        c, best->kernel, best->threads, best->gbs, best->gbs / c);
    }
    if (bench_differ) std::printf("FAIL: %d sum configurations differ from plain\n", bench_differ);
    return bench_differ ? 1 : 0;
}
