/*
 * test_kernels.cu - every CUDA kernel variant against its C reference, bit for bit.
 *
 * Inputs are drawn fresh from a seed printed at start (pass one as argv[1] to repeat a run):
 * wide-exponent values (where the association order shows), small integers (exact sums),
 * standard-normal-like values, and a mix with NaN, +-Inf, -0 and subnormals.  Segment tables
 * mix aligned and unaligned offsets, padding rows, empty segments and gaps that no segment
 * covers.  Each run poisons the output first (gaps must keep the poison), launches one
 * variant at one CTA budget and thread count, and compares the whole output buffer with the
 * reference by memcmp.  One line per case: PASS or FAIL with the first differing element.
 * Exit status: 0 only if every run matched.
 *
 * Usage: test_kernels [seed] [--small | --racecheck]
 *   no seed or 0: fresh; --small: a subset for memcheck; --racecheck: the kernels that use
 *   shared memory (TMA, HYBRID, ASYNC) on small inputs that still refill every ring stage,
 *   sized to finish in well under a minute under compute-sanitizer racecheck
 */
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <initializer_list>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/launch.h"
#include "kernels/sum_tma.cuh"

#include "cuda_ok.h"

static uint64_t g_rng;
static uint64_t rnd() {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint64_t rnd_below(uint64_t n) {
    return n ? rnd() % n : 0;
}
static float f_from(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

enum value_mode { V_WIDE, V_INT, V_NORMAL, V_SPECIAL, V_COUNT };
static const char *mode_name[] = {"wide", "int", "normal", "special"};

static float draw(value_mode m) {
    switch (m) {
    case V_WIDE: {
        uint64_t r = rnd();
        uint32_t e = 127u - 20u + (uint32_t)(r % 41u);
        return f_from((uint32_t)((r >> 40) & 1u) << 31 | e << 23 |
                      ((uint32_t)(r >> 8) & 0x7fffffu));
    }
    case V_INT:
        return (float)((int)rnd_below(513) - 256);
    case V_NORMAL: {
        float s = 0.0f; /* Irwin-Hall: sum of 12 uniforms minus 6 */
        for (int i = 0; i < 12; ++i)
            s += (float)(rnd() >> 40) * 0x1p-24f;
        return s - 6.0f;
    }
    default: {
        uint64_t r = rnd_below(100);
        if (r == 0) return f_from(0x7fc00000u | (uint32_t)rnd_below(1u << 22)); /* NaN payload */
        if (r == 1) return f_from(0xff800001u);                                 /* signalling */
        if (r == 2) return f_from(0x7f800000u);
        if (r == 3) return f_from(0xff800000u);
        if (r == 4) return -0.0f;
        if (r == 5) return f_from((uint32_t)rnd_below(0x800000u)); /* subnormal */
        if (r == 6) return 3.0e38f;
        return draw(V_NORMAL);
    }
    }
}

static int g_failures = 0, g_runs = 0;
/* --racecheck: few, small segments (a few 112 KiB chunks a CTA, so every ring stage is
 * refilled), the shared-memory variants only, 1 and 3 CTAs. */
static bool g_racecheck = false;

/* Compare and report the first difference; returns true when equal. */
static bool same(const void *got, const void *want, size_t bytes, size_t esize, char *msg,
                 size_t msgn) {
    if (std::memcmp(got, want, bytes) == 0) return true;
    for (size_t i = 0; i < bytes / esize; ++i) {
        uint32_t g = 0, w = 0;
        std::memcpy(&g, (const char *)got + i * esize, esize);
        std::memcpy(&w, (const char *)want + i * esize, esize);
        if (g != w) {
            std::snprintf(msg, msgn, "element %zu: got 0x%08x want 0x%08x", i, g, w);
            break;
        }
    }
    return false;
}

/* ------------------------------------------------------------------ Level-1 sum */

/* HYBRID's bulk-copied sources R for L sources: kind 0 = L/2, 1 = L-2, 2 = L-1, 3 = L-6,
 * 4 = L-3, each kept in 1 .. L-1 with at most six direct sources (L = 8: 4, 6, 7, 2, 5); 0 for
 * L = 1 (ignored). */
static int hybrid_r(int L, int kind) {
    if (L == 1) return 0;
    const int back[] = {0, 2, 1, 6, 3};
    int r = kind == 0 ? L / 2 : L - back[kind];
    if (r < L - 6) r = L - 6;
    return r < 1 ? 1 : r;
}

struct sum_case {
    tide_dtype_t dtype;
    int ns;
    value_mode mode;
    int layout; /* 0 aligned, 1 unaligned, 2 mixed, 3 many tiny segments, 4 few huge segments */
};

static void run_sum_case(const sum_case &c) {
    const size_t es = c.dtype == TIDE_DTYPE_BF16 ? 2 : 4;
    const int nown = 3;
    int nsegs;
    uint32_t maxlen;
    switch (c.layout) {
    case 3:
        nsegs = 3000;
        maxlen = 24;
        break;
    case 4:
        nsegs = 3;
        maxlen = 1500000;
        break;
    default:
        nsegs = 1 + (int)rnd_below(120);
        maxlen = 20000;
        break;
    }
    if (g_racecheck && c.layout != 3) {
        /* ~90 Ki outputs: a dozen or more chunks of 7168 elements (bf16, L = 8, 112 KiB
         * stages), so with 1 or 3 CTAs every stage of a two-stage ring is refilled */
        nsegs = c.layout == 4 ? 2 : 10;
        maxlen = c.layout == 4 ? 48000 : 24000;
    }
    std::vector<tide_sum_seg_t> segs(nsegs);
    uint64_t out_n = 0, stride_need = 0, own_need = 0;
    for (int s = 0; s < nsegs; ++s) {
        tide_sum_seg_t &g = segs[s];
        const bool al = c.layout == 0 || c.layout == 4 || (c.layout == 2 && rnd_below(2));
        uint32_t len = (uint32_t)(rnd_below(4) == 0 ? rnd_below(40) : rnd_below(maxlen + 1));
        if (c.layout == 4) len = maxlen - (uint32_t)rnd_below(100);
        g.len = len;
        g.valid = rnd_below(4) == 0 ? (uint32_t)rnd_below(len + 1) : len;
        const uint64_t q = al ? 8 : 1;
        out_n = (out_n + rnd_below(6) + q - 1) / q * q; /* gap, then alignment */
        g.out_off = out_n;
        out_n += len;
        g.stage_off = rnd_below(3000) * q;
        g.own_off = rnd_below(3000) * q;
        g.own_idx = (int32_t)rnd_below(nown);
        g.pad_ = 0;
        if (g.stage_off + len > stride_need) stride_need = g.stage_off + len;
        if (g.own_off + len > own_need) own_need = g.own_off + len;
    }
    out_n += 7;
    const bool odd = c.layout == 1 || (c.layout == 2 && rnd_below(2));
    const uint64_t stride = (stride_need + 7) / 8 * 8 + (odd ? 1 + rnd_below(7) : 0);
    const uint64_t shift[3] = {0, odd ? 1u : 8u, odd ? 3u : 16u}; /* own base misalignment */

    /* Host inputs. */
    const uint64_t st_n = (uint64_t)c.ns * stride + 1, own_n = own_need + 16;
    std::vector<unsigned char> h_st(st_n * es), h_own[3];
    auto fill = [&](unsigned char *p, uint64_t n) {
        for (uint64_t i = 0; i < n; ++i) {
            float v = draw(c.mode);
            if (es == 2) {
                uint16_t b = c.mode == V_SPECIAL && rnd_below(50) == 0 ? (uint16_t)rnd()
                                                                       : tide_float_to_bf16(v);
                std::memcpy(p + i * 2, &b, 2);
            } else {
                std::memcpy(p + i * 4, &v, 4);
            }
        }
    };
    fill(h_st.data(), st_n);
    for (int k = 0; k < nown; ++k) {
        h_own[k].resize(own_n * es);
        fill(h_own[k].data(), own_n);
    }

    /* Device copies. */
    void *d_st, *d_own[3], *d_out, *d_segs, *d_table;
    CUDA_OK(cudaMalloc(&d_st, h_st.size()));
    CUDA_OK(cudaMemcpy(d_st, h_st.data(), h_st.size(), cudaMemcpyHostToDevice));
    const void *h_table[3], *d_ptrs[3];
    for (int k = 0; k < nown; ++k) {
        CUDA_OK(cudaMalloc(&d_own[k], h_own[k].size()));
        CUDA_OK(cudaMemcpy(d_own[k], h_own[k].data(), h_own[k].size(), cudaMemcpyHostToDevice));
        h_table[k] = h_own[k].data() + shift[k] * es;
        d_ptrs[k] = (const char *)d_own[k] + shift[k] * es;
    }
    CUDA_OK(cudaMalloc(&d_table, sizeof d_ptrs));
    CUDA_OK(cudaMemcpy(d_table, d_ptrs, sizeof d_ptrs, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&d_segs, segs.size() * sizeof(tide_sum_seg_t)));
    CUDA_OK(cudaMemcpy(d_segs, segs.data(), segs.size() * sizeof(tide_sum_seg_t),
                       cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&d_out, out_n * 4));

    /* Reference on a poisoned buffer. */
    const uint32_t poison = 0xff800000u | (uint32_t)rnd_below(1u << 22) | 1u;
    std::vector<float> want(out_n, f_from(poison)), got(out_n);
    tide_sum_args_t ha = {segs.data(), nsegs,   h_st.data(), stride,  c.ns, h_table,
                          c.dtype,     want.data(), nullptr, 0,       nullptr, 0, 0};
    tide_ref_sum(&ha);
    tide_sum_args_t da = {(const tide_sum_seg_t *)d_segs, nsegs,   d_st,          stride, c.ns,
                          (const void *const *)d_table,   c.dtype, (float *)d_out,
                          nullptr,                        0,       nullptr,
                          0,                              0};

    /* variant, ctas (set below), threads, smem_bytes, stage_bytes, producers, groups,
     * bulk_sources.  HYBRID's R follows L as the benchmark's L = 8 sweep does (L/2, L-3, L-2,
     * L-1: 4, 5, 6, 7; and L-6 = 2, the most direct sources) at its thread counts and groups
     * per thread. */
    const int L = c.ns + 1, r_half = hybrid_r(L, 0), r_two = hybrid_r(L, 1);
    const int r_one = hybrid_r(L, 2), r_six = hybrid_r(L, 3), r_three = hybrid_r(L, 4);
    const int ring = 227 * 1024;
    const tide_sum_launch_t cfgs[] = {
        {TIDE_SUM_PLAIN, 0, 64, 0, 0, 0, 0, 0},
        {TIDE_SUM_PLAIN, 0, 256, 0, 0, 0, 0, 0},
        {TIDE_SUM_PLAIN, 0, 1024, 0, 0, 0, 0, 0},
        {TIDE_SUM_TMA, 0, 64, 0, 0, 0, 0, 0},
        {TIDE_SUM_TMA, 0, 160, 0, 32768, 0, 0, 0},
        {TIDE_SUM_TMA, 0, 288, 40 * 1024, 16384, 0, 0, 0},
        {TIDE_SUM_TMA, 0, 288, 70000, 32768, 0, 0, 0},
        {TIDE_SUM_TMA, 0, 512, 227 * 1024, 65536, 0, 0, 0},
        {TIDE_SUM_TMA, 0, 0, 0, 0, 0, 0, 0},
        {TIDE_SUM_TMA, 0, 288, 227 * 1024, 114688, 0, 0, 0},
        {TIDE_SUM_TMA, 0, 512, 227 * 1024, 73728, 2, 0, 0},
        {TIDE_SUM_TMA, 0, 96, 0, 16384, 2, 0, 0},
        {TIDE_SUM_ASYNC, 0, 64, 0, 0, 0, 0, 0},
        {TIDE_SUM_ASYNC, 0, 256, 0, 0, 0, 0, 0},
        {TIDE_SUM_ASYNC, 0, 0, 0, 0, 0, 0, 0},
        {TIDE_SUM_ASYNC, 0, 96, 96 * 512, 0, 0, 0, 0},
        {TIDE_SUM_AUTO, 0, 0, 0, 0, 0, 0, 0},
        {TIDE_SUM_PLAIN2, 0, 512, 0, 0, 0, 2, 0},
        {TIDE_SUM_PLAIN2, 0, 384, 0, 0, 0, 2, 0},
        {TIDE_SUM_PLAIN2, 0, 384, 0, 0, 0, 3, 0},
        {TIDE_SUM_PLAIN2, 0, 256, 0, 0, 0, 4, 0},
        {TIDE_SUM_PLAIN2, 0, 96, 0, 0, 0, 3, 0},
        {TIDE_SUM_HYBRID, 0, 512, ring, 0, 1, 2, r_half},
        {TIDE_SUM_HYBRID, 0, 512, ring, 0, 1, 2, r_three},
        {TIDE_SUM_HYBRID, 0, 512, ring, 0, 1, 2, r_two},
        {TIDE_SUM_HYBRID, 0, 512, ring, 0, 1, 2, r_one},
        {TIDE_SUM_HYBRID, 0, 512, ring, 0, 2, 2, r_one},
        {TIDE_SUM_HYBRID, 0, 384, ring, 0, 1, 2, r_two},
        {TIDE_SUM_HYBRID, 0, 256, ring, 0, 1, 2, r_two},
        {TIDE_SUM_HYBRID, 0, 256, ring, 0, 1, 2, r_one},
        {TIDE_SUM_HYBRID, 0, 256, ring, 0, 1, 2, r_six},
        {TIDE_SUM_HYBRID, 0, 288, ring, 0, 1, 4, r_half},
        {TIDE_SUM_HYBRID, 0, 288, ring, 0, 1, 4, r_two},
        {TIDE_SUM_HYBRID, 0, 288, ring, 0, 1, 4, r_one},
        {TIDE_SUM_HYBRID, 0, 320, ring, 0, 2, 4, r_six},
        {TIDE_SUM_HYBRID, 0, 96, 40 * 1024, 0, 1, 2, r_one}, /* small ring, many chunks */
        {TIDE_SUM_HYBRID, 0, 0, 0, 0, 0, 0, 0}};
    const std::vector<int> ctas =
        g_racecheck ? std::vector<int>{1, 3} : std::vector<int>{1, 3, 8, 132};
    char msg[256] = "";
    int fails = 0, runs = 0;
    const std::vector<float> pz(out_n, f_from(poison));
    /* One launch on the poisoned output, compared with the reference; the first difference
     * (or the last error) is kept in msg.  False after an error other than a refusal of the
     * arguments (cudaErrorInvalidValue): the configuration's other CTA counts are skipped. */
    auto launch_check = [&](auto launch, const char *label) {
        CUDA_OK(cudaMemcpy(d_out, pz.data(), out_n * 4, cudaMemcpyHostToDevice));
        cudaError_t e = launch();
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        ++runs;
        if (e != cudaSuccess) {
            std::snprintf(msg, sizeof msg, "%s: %s", label, cudaGetErrorString(e));
            ++fails;
            return e == cudaErrorInvalidValue;
        }
        CUDA_OK(cudaMemcpy(got.data(), d_out, out_n * 4, cudaMemcpyDeviceToHost));
        char m2[120];
        if (!same(got.data(), want.data(), out_n * 4, 4, m2, sizeof m2) && fails++ == 0)
            std::snprintf(msg, sizeof msg, "%s: %s", label, m2);
        return true;
    };
    for (tide_sum_launch_t f : cfgs) {
        if (g_racecheck && f.variant != TIDE_SUM_TMA && f.variant != TIDE_SUM_HYBRID &&
            f.variant != TIDE_SUM_ASYNC)
            continue; /* PLAIN and PLAIN2 use no shared memory; AUTO is a TMA row already */
        if (g_racecheck && f.variant == TIDE_SUM_HYBRID && f.producers != 2 && f.threads != 96 &&
            f.threads != 0 && !(f.threads == 288 && f.bulk_sources == r_half))
            continue; /* HYBRID: two producers, U = 4, the small ring, the defaults */
        for (int nc : ctas) {
            f.ctas = nc;
            char label[128];
            std::snprintf(label, sizeof label,
                          "variant %d ctas %d threads %d smem %d stage %d producers %d groups %d "
                          "bulk %d",
                          (int)f.variant, nc, f.threads, f.smem_bytes, f.stage_bytes, f.producers,
                          f.groups, f.bulk_sources);
            if (!launch_check([&] { return tide_cuda_sum_launch(&da, &f, 0); }, label)) break;
        }
    }
    /* The TMA sum's internal options past the public limits (tide_sum::tma_opts): more
     * producer warps, some of them with no source, up to 768 threads, the adds' NaNs stored
     * as they are, the first version's consumer layout. */
    using namespace tide_sum;
    const tma_opts topts[] = {{0, 288, 1, 0, 114688, TMA_CONSUME_GROUPS, 0},
                              {0, 320, 2, 0, 114688, TMA_CONSUME_UNITS, 1},
                              {0, 288, 4, 0, 114688, TMA_CONSUME_UNITS, 1},
                              {0, 416, 3, 0, 32768, TMA_CONSUME_UNITS, 0},
                              {0, 544, 8, 0, 16384, TMA_CONSUME_UNITS, 1},
                              {0, 768, 8, 0, 0, TMA_CONSUME_UNITS, 0},
                              {0, 160, 4, 70000, 32768, TMA_CONSUME_GROUPS, 1}};
    for (tma_opts o : topts) {
        /* A measurement build with a lower launch bound (TIDE_TMA_MAX_THREADS, sum_tma.cuh)
         * rejects the wider options; they are not run there. */
        if (o.threads > kTmaMaxThreads) continue;
        for (int nc : ctas) {
            o.ctas = nc;
            char label[128];
            std::snprintf(label, sizeof label,
                          "tma opts ctas %d threads %d producers %d stage %d consume %d "
                          "raw_nan %d",
                          nc, o.threads, o.producers, o.stage_bytes, o.consume, o.raw_nan);
            if (!launch_check([&] { return launch_tma_opts(da, o, 0); }, label)) break;
        }
    }
    /* Sliced launches give the bits of one: K virtual-grid slices of the whole table
     * (tide_sum_args_t.slice, every variant; K = 40 leaves some slices without a chunk in the
     * small cases), and AUTO through tide_cuda_sum_sliced at 1/K of the logical bytes a
     * slice (groups of segments, large segments cut into virtual-grid slices). */
    const uint64_t sum_bytes = tide_cuda_sum_bytes(&da, segs.data());
    const tide_sum_launch_t sliced_cfgs[] = {{TIDE_SUM_AUTO, 0, 0, 0, 0, 0, 0, 0},
                                             {TIDE_SUM_PLAIN, 0, 256, 0, 0, 0, 0, 0},
                                             {TIDE_SUM_HYBRID, 0, 0, 0, 0, 0, 0, 0},
                                             {TIDE_SUM_ASYNC, 0, 0, 0, 0, 0, 0, 0}};
    for (tide_sum_launch_t f : sliced_cfgs)
        for (int nc : {1, 3})
            for (int k : {2, 7, 40}) {
                if (g_racecheck && (f.variant == TIDE_SUM_PLAIN || k == 40)) continue;
                f.ctas = nc;
                CUDA_OK(cudaMemcpy(d_out, pz.data(), out_n * 4, cudaMemcpyHostToDevice));
                cudaError_t e = cudaSuccess;
                if (f.variant == TIDE_SUM_AUTO) {
                    int launches = 0;
                    e = tide_cuda_sum_sliced(&da, segs.data(), nc, 0, sum_bytes / k + 1, 0,
                                             &launches);
                    if (e == cudaSuccess && sum_bytes > 0 && launches < 2) {
                        std::snprintf(msg, sizeof msg, "sliced sum at 1/%d: %d launch(es)", k,
                                      launches);
                        ++fails;
                    }
                } else {
                    tide_sum_args_t s = da;
                    s.slices = k;
                    for (int i = 0; i < k && e == cudaSuccess; ++i) {
                        s.slice = i;
                        e = tide_cuda_sum_launch(&s, &f, 0);
                    }
                }
                if (e == cudaSuccess) e = cudaDeviceSynchronize();
                ++runs;
                char m2[120] = "";
                if (e == cudaSuccess)
                    CUDA_OK(cudaMemcpy(got.data(), d_out, out_n * 4, cudaMemcpyDeviceToHost));
                if ((e != cudaSuccess ||
                     !same(got.data(), want.data(), out_n * 4, 4, m2, sizeof m2)) &&
                    fails++ == 0)
                    std::snprintf(msg, sizeof msg, "variant %d ctas %d in %d slices: %s",
                                  (int)f.variant, nc, k,
                                  e != cudaSuccess ? cudaGetErrorString(e) : m2);
            }
    g_runs += runs;
    g_failures += fails;
    std::printf("%s sum dtype=%s L=%d values=%-7s layout=%d segs=%-5d elems=%-8llu runs=%d %s\n",
                fails ? "FAIL" : "PASS", c.dtype == TIDE_DTYPE_BF16 ? "bf16" : "fp32", c.ns + 1,
                mode_name[c.mode], c.layout, nsegs, (unsigned long long)out_n, runs,
                fails ? msg : "");
    cudaFree(d_st);
    for (int k = 0; k < nown; ++k)
        cudaFree(d_own[k]);
    cudaFree(d_table);
    cudaFree(d_segs);
    cudaFree(d_out);
}

/* ------------------------------------------------------------------ landing */

/* nsegs landing segments with gaps of 0-4 elements, output offsets rounded up to q elements,
 * input offsets multiples of q; out_n ends after the last, in_need past the furthest input. */
static std::vector<tide_land_seg_t> draw_land_segs(int nsegs, uint64_t q, uint64_t *out_n,
                                                   uint64_t *in_need) {
    std::vector<tide_land_seg_t> segs(nsegs);
    uint64_t out = 0, need = 0;
    for (int s = 0; s < nsegs; ++s) {
        const uint32_t len = (uint32_t)(rnd_below(4) == 0 ? rnd_below(30) : rnd_below(30000));
        out = (out + rnd_below(5) + q - 1) / q * q;
        segs[s] = {out, rnd_below(5000) * q, len, 0};
        out += len;
        if (segs[s].in_off + len > need) need = segs[s].in_off + len;
    }
    *out_n = out;
    *in_need = need;
    return segs;
}

/* 1, 1/8 or a normal draw: the alphas a landing case scales by. */
static float draw_alpha() {
    const float alphas[] = {1.0f, 0.125f, draw(V_NORMAL)};
    return alphas[rnd_below(3)];
}

/* A device copy of `bytes` host bytes. */
static void *upload(const void *host, size_t bytes) {
    void *d = nullptr;
    CUDA_OK(cudaMalloc(&d, bytes));
    CUDA_OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* A landing case's launches: each resets the fp32 output to `old`, runs, and must give the
 * reference's `want` bit for bit; the first difference is kept in msg. */
struct land_runs {
    float *d_out;
    const std::vector<float> &old, &want;
    std::vector<float> got;
    int fails = 0, runs = 0;
    char msg[256] = "";

    land_runs(float *d, const std::vector<float> &o, const std::vector<float> &w)
        : d_out(d), old(o), want(w), got(w.size()) {}

    template <class F> void check(F launch, int nc, const char *knob, int v) {
        const size_t bytes = want.size() * 4;
        CUDA_OK(cudaMemcpy(d_out, old.data(), bytes, cudaMemcpyHostToDevice));
        CUDA_OK(launch());
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(got.data(), d_out, bytes, cudaMemcpyDeviceToHost));
        ++runs;
        char m2[120];
        if (!same(got.data(), want.data(), bytes, 4, m2, sizeof m2) && fails++ == 0)
            std::snprintf(msg, sizeof msg, "ctas %d %s %d: %s", nc, knob, v, m2);
    }

    /* One launch per CTA count and thread count, then sliced launches at 1/K of the logical
     * bytes a slice (for each of slice_ctas and ks, 256 threads): the bits of one launch. */
    void sweep(const tide_land_args_t &da, const tide_land_seg_t *h_segs,
               std::initializer_list<int> ctas, std::initializer_list<int> threads,
               std::initializer_list<int> slice_ctas, std::initializer_list<int> ks) {
        for (int nc : ctas)
            for (int nt : threads)
                check([&] { return tide_cuda_land(&da, nc, nt, 0); }, nc, "threads", nt);
        const uint64_t land_bytes = tide_cuda_land_bytes(&da, h_segs);
        for (int nc : slice_ctas)
            for (int k : ks)
                check(
                    [&] {
                        return tide_cuda_land_sliced(&da, h_segs, nc, 256, land_bytes / k + 1, 0,
                                                     nullptr);
                    },
                    nc, "slices 1 /", k);
    }
};

/* plus_zero: the M = 1 one-input landing (kernels.h), v + 0.0f before alpha. */
static void run_land_case(int L, int mode, value_mode vm, bool aligned, bool plus_zero = false) {
    const int nsegs = 1 + (int)rnd_below(60);
    uint64_t out_n = 0, in_need = 0;
    std::vector<tide_land_seg_t> segs = draw_land_segs(nsegs, aligned ? 4 : 1, &out_n, &in_need);
    out_n += 3;
    const uint64_t in_n = in_need + 8;
    std::vector<std::vector<float>> h_in(L, std::vector<float>(in_n));
    for (auto &b : h_in)
        for (auto &v : b)
            v = draw(vm);
    std::vector<float> old(out_n);
    for (auto &v : old)
        v = draw(vm);
    const float alpha = draw_alpha();

    tide_land_args_t ha = {}, da = {};
    float *d_in[TIDE_MAX_GPUS_PER_NODE];
    for (int k = 0; k < L; ++k) {
        const uint64_t sh = aligned ? 0 : rnd_below(4);
        d_in[k] = (float *)upload(h_in[k].data(), in_n * 4);
        ha.in[k] = h_in[k].data() + sh;
        da.in[k] = d_in[k] + sh;
    }
    void *d_segs = upload(segs.data(), nsegs * sizeof(tide_land_seg_t));
    float *d_out;
    CUDA_OK(cudaMalloc(&d_out, out_n * 4));
    const bool init = mode & 1, acc = mode & 2;
    std::vector<float> want(old);
    ha.segs = segs.data();
    da.segs = (const tide_land_seg_t *)d_segs;
    ha.num_segs = da.num_segs = nsegs;
    ha.num_in = da.num_in = L;
    ha.out = want.data();
    da.out = d_out;
    ha.alpha = da.alpha = alpha;
    ha.init = da.init = init;
    ha.accumulate = da.accumulate = acc;
    ha.plus_zero = da.plus_zero = plus_zero;
    tide_ref_land(&ha);

    land_runs lr(d_out, old, want);
    lr.sweep(da, segs.data(), {1, 3, 8, 132}, {64, 256, 1024}, {1, 3}, {2, 7, 40});
    g_runs += lr.runs;
    g_failures += lr.fails;
    std::printf(
        "%s land L=%d init=%d accumulate=%d plus_zero=%d alpha=%g values=%-7s aligned=%d segs=%d "
        "runs=%d %s\n",
        lr.fails ? "FAIL" : "PASS", L, init, acc, plus_zero, alpha, mode_name[vm], aligned, nsegs,
        lr.runs, lr.msg);
    for (int k = 0; k < L; ++k)
        cudaFree(d_in[k]);
    cudaFree(d_segs);
    cudaFree(d_out);
}

/* The rail lane's landing (tide_land_args_t.in_bf16): one bf16 input, widened exactly; any
 * CTA count, thread count or slicing gives the C reference's bits. */
static void run_land_bf16_case(int mode, value_mode vm) {
    const int nsegs = 1 + (int)rnd_below(40);
    uint64_t out_n = 0, in_need = 0;
    std::vector<tide_land_seg_t> segs = draw_land_segs(nsegs, 1, &out_n, &in_need);
    const uint64_t in_n = in_need + 8;
    std::vector<uint16_t> h_in(in_n);
    for (auto &v : h_in)
        v = tide_float_to_bf16(draw(vm));
    std::vector<float> old(out_n);
    for (auto &v : old)
        v = draw(vm);
    const float alpha = draw_alpha();
    uint16_t *d_in = (uint16_t *)upload(h_in.data(), in_n * 2);
    void *d_segs = upload(segs.data(), nsegs * sizeof(tide_land_seg_t));
    float *d_out;
    CUDA_OK(cudaMalloc(&d_out, (out_n + 1) * 4));
    tide_land_args_t ha = {}, da = {};
    ha.in[0] = (const float *)(const void *)h_in.data();
    da.in[0] = (const float *)(const void *)d_in;
    ha.segs = segs.data();
    da.segs = (const tide_land_seg_t *)d_segs;
    ha.num_segs = da.num_segs = nsegs;
    ha.num_in = da.num_in = 1;
    ha.alpha = da.alpha = alpha;
    ha.init = da.init = mode & 1;
    ha.accumulate = da.accumulate = mode & 2;
    ha.in_bf16 = da.in_bf16 = true;
    std::vector<float> want(old);
    ha.out = want.data();
    da.out = d_out;
    tide_ref_land(&ha);
    land_runs lr(d_out, old, want);
    lr.sweep(da, segs.data(), {1, 3, 132}, {64, 1024}, {3}, {2, 7});
    /* More than one input, or a peer table, is refused. */
    tide_land_args_t bad = da;
    bad.num_in = 2;
    bad.in[1] = da.in[0];
    lr.fails += tide_cuda_land(&bad, 1, 0, 0) != cudaErrorInvalidValue;
    g_runs += lr.runs;
    g_failures += lr.fails;
    std::printf("%s land bf16 init=%d accumulate=%d alpha=%g values=%-7s segs=%d runs=%d %s\n",
                lr.fails ? "FAIL" : "PASS", mode & 1, (mode & 2) != 0, alpha, mode_name[vm], nsegs,
                lr.runs, lr.msg);
    cudaFree(d_in);
    cudaFree(d_segs);
    cudaFree(d_out);
}

/* ------------------------------------------------------------------ cast */

static void run_cast_case(uint64_t n, int in_shift, int out_shift) {
    std::vector<float> in(n + in_shift);
    for (auto &v : in) {
        uint64_t r = rnd_below(4);
        /* Random bit patterns (every class), exact ties, and plain values. */
        v = r == 0   ? f_from((uint32_t)rnd())
            : r == 1 ? f_from(((uint32_t)rnd() & 0xffff0000u) | 0x8000u)
                     : draw(V_NORMAL);
    }
    std::vector<uint16_t> want(n + out_shift + 4, 0xdead), got(want.size());
    tide_ref_cast_bf16(in.data() + in_shift, want.data() + out_shift, n);
    float *d_in;
    uint16_t *d_out;
    CUDA_OK(cudaMalloc(&d_in, in.size() * 4));
    CUDA_OK(cudaMalloc(&d_out, want.size() * 2));
    CUDA_OK(cudaMemcpy(d_in, in.data(), in.size() * 4, cudaMemcpyHostToDevice));
    const int ctas[] = {1, 3, 132}, threads[] = {64, 512, 0};
    int fails = 0, runs = 0;
    char msg[256] = "";
    std::vector<uint16_t> pz(want.size(), 0xdead);
    for (int nc : ctas)
        for (int nt : threads) {
            CUDA_OK(cudaMemcpy(d_out, pz.data(), pz.size() * 2, cudaMemcpyHostToDevice));
            CUDA_OK(tide_cuda_cast_bf16(d_in + in_shift, d_out + out_shift, n, nc, nt, 0));
            CUDA_OK(cudaDeviceSynchronize());
            CUDA_OK(cudaMemcpy(got.data(), d_out, got.size() * 2, cudaMemcpyDeviceToHost));
            ++runs;
            char m2[120];
            if (!same(got.data(), want.data(), got.size() * 2, 2, m2, sizeof m2) && fails++ == 0)
                std::snprintf(msg, sizeof msg, "ctas %d threads %d: %s", nc, nt, m2);
        }
    g_runs += runs;
    g_failures += fails;
    std::printf("%s cast n=%llu in_shift=%d out_shift=%d runs=%d %s\n", fails ? "FAIL" : "PASS",
                (unsigned long long)n, in_shift, out_shift, runs, msg);
    cudaFree(d_in);
    cudaFree(d_out);
}

/* ------------------------------------------------------------------ argument checks */

static void run_arg_checks() {
    float *d_out;
    CUDA_OK(cudaMalloc(&d_out, 64));
    const float marker = 42.0f;
    CUDA_OK(cudaMemcpy(d_out, &marker, 4, cudaMemcpyHostToDevice));
    tide_sum_args_t a = {nullptr, 0,       nullptr, 0, 1, nullptr, TIDE_DTYPE_BF16,
                         d_out,   nullptr, 0,       nullptr, 0, 0};
    int bad = 0;
    bad += tide_cuda_sum(&a, 4, 0, 0) != cudaSuccess; /* no segments: nothing to do */
    bad += tide_cuda_sum(&a, 0, 0, 0) != cudaErrorInvalidValue;
    bad += tide_cuda_sum(&a, 4, 48, 0) != cudaErrorInvalidValue;
    bad += tide_cuda_sum(&a, 4, 2048, 0) != cudaErrorInvalidValue;
    tide_sum_launch_t cfg = {TIDE_SUM_TMA, 4, 1024, 0, 0, 0, 0, 0}; /* TMA: at most 512 */
    tide_sum_seg_t one = {0, 0, 0, 1, 1, 0, 0};
    tide_sum_args_t a1 = a;
    a1.segs = &one; /* never read: the configuration is rejected first */
    a1.num_segs = 1;
    a1.staged = d_out;
    a1.own = (const void *const *)&d_out;
    bad += tide_cuda_sum_launch(&a1, &cfg, 0) != cudaErrorInvalidValue;
    cfg.threads = 288;
    cfg.stage_bytes = 4096;
    bad += tide_cuda_sum_launch(&a1, &cfg, 0) != cudaErrorInvalidValue;
    cfg.stage_bytes = 65536;
    cfg.smem_bytes = 100000; /* one 64 KiB stage: a ring needs two */
    bad += tide_cuda_sum_launch(&a1, &cfg, 0) != cudaErrorInvalidValue;
    cfg = {TIDE_SUM_TMA, 4, 64, 0, 0, 2, 0, 0}; /* two producers leave no consumer */
    bad += tide_cuda_sum_launch(&a1, &cfg, 0) != cudaErrorInvalidValue;
    cfg = {TIDE_SUM_TMA, 4, 288, 0, 0, 3, 0, 0};
    bad += tide_cuda_sum_launch(&a1, &cfg, 0) != cudaErrorInvalidValue;
    {
        /* The internal TMA options have their own limits; a rejected launch enqueues nothing. */
        using namespace tide_sum;
        const tma_opts bad_opts[] = {{4, 288, 9, 0, 0, TMA_CONSUME_UNITS, 0},  /* producers */
                                     {4, 800, 1, 0, 0, TMA_CONSUME_UNITS, 0},  /* threads */
                                     {4, 64, 2, 0, 0, TMA_CONSUME_UNITS, 0},   /* no consumer */
                                     {4, 300, 1, 0, 0, TMA_CONSUME_UNITS, 0},  /* not warps */
                                     {4, 288, 1, 0, 0, TMA_CONSUME_UNITS, 2},  /* raw_nan */
                                     {4, 288, 1, 0, 0, TMA_CONSUME_COUNT, 0},  /* layout */
                                     {0, 288, 1, 0, 0, TMA_CONSUME_UNITS, 0},  /* no CTA */
                                     {4, 288, 1, 0, 4096, TMA_CONSUME_UNITS, 0}}; /* stage */
        for (const tma_opts &o : bad_opts)
            bad += launch_tma_opts(a1, o, 0) != cudaErrorInvalidValue;
    }
    cfg = {TIDE_SUM_ASYNC, 4, 1024, 0, 0, 0, 0, 0};
    bad += tide_cuda_sum_launch(&a1, &cfg, 0) != cudaErrorInvalidValue;
    {
        /* PLAIN2 and HYBRID limits (a1: L = 2; a8: L = 8). */
        tide_sum_args_t a8 = a1;
        a8.num_staged = 7;
        const struct {
            const tide_sum_args_t *a;
            tide_sum_launch_t c;
        } bad_cfgs[] = {
            {&a1, {TIDE_SUM_PLAIN2, 4, 0, 0, 0, 0, 5, 0}},        /* groups */
            {&a1, {TIDE_SUM_PLAIN2, 4, 0, 0, 0, 0, 1, 0}},        /* groups */
            {&a1, {TIDE_SUM_PLAIN2, 4, 512, 0, 0, 0, 4, 0}},      /* U = 4: 256 threads */
            {&a1, {TIDE_SUM_PLAIN2, 4, 1024, 0, 0, 0, 0, 0}},     /* U = 2: 512 threads */
            {&a1, {TIDE_SUM_PLAIN2, 4, 0, 0, 0, 0, -1, 0}},       /* negative */
            {&a1, {TIDE_SUM_HYBRID, 4, 0, 0, 0, 0, 0, 2}},        /* R = L */
            {&a8, {TIDE_SUM_HYBRID, 4, 0, 0, 0, 0, 0, 1}},        /* seven direct sources */
            {&a8, {TIDE_SUM_HYBRID, 4, 544, 0, 0, 1, 2, 6}},      /* U = 2: 512 threads */
            {&a8, {TIDE_SUM_HYBRID, 4, 352, 0, 0, 1, 4, 6}},      /* U = 4: 320 threads */
            {&a8, {TIDE_SUM_HYBRID, 4, 512, 0, 0, 3, 2, 6}},      /* producers */
            {&a8, {TIDE_SUM_HYBRID, 4, 512, 0, 0, 1, 3, 6}},      /* groups */
            {&a8, {TIDE_SUM_HYBRID, 4, 64, 0, 0, 2, 2, 6}},       /* no consumer */
            {&a8, {TIDE_SUM_HYBRID, 4, 512, 100000, 0, 1, 2, 7}}, /* one stage */
            {&a8, {TIDE_SUM_HYBRID, 4, 512, 0, 0, 0, 0, -1}}};    /* negative */
        for (const auto &b : bad_cfgs)
            bad += tide_cuda_sum_launch(b.a, &b.c, 0) != cudaErrorInvalidValue;
    }
    cfg.variant = (tide_sum_variant_t)9;
    bad += tide_cuda_sum_launch(&a1, &cfg, 0) != cudaErrorInvalidValue;
    a.num_staged = 8;
    bad += tide_cuda_sum(&a, 4, 0, 0) != cudaErrorInvalidValue;
    bad += tide_cuda_sum(nullptr, 4, 0, 0) != cudaErrorInvalidValue;
    tide_land_args_t l = {};
    l.num_in = 9;
    bad += tide_cuda_land(&l, 4, 0, 0) != cudaErrorInvalidValue;
    l.num_in = 1;
    bad += tide_cuda_land(&l, 4, 0, 0) != cudaSuccess;
    /* Slices: a negative count, a slice past the count; a rejected launch enqueues nothing. */
    bad += tide_cuda_land_sliced(nullptr, nullptr, 4, 0, 0, 0, nullptr) != cudaErrorInvalidValue;
    l.slices = 2, l.slice = 2;
    bad += tide_cuda_land(&l, 4, 0, 0) != cudaErrorInvalidValue;
    tide_sum_args_t as = a1;
    as.slices = 3, as.slice = 3;
    bad += tide_cuda_sum(&as, 4, 0, 0) != cudaErrorInvalidValue;
    as.slices = -2, as.slice = 0;
    bad += tide_cuda_sum(&as, 4, 0, 0) != cudaErrorInvalidValue;
    bad += tide_cuda_sum_sliced(&a1, nullptr, 4, 0, 1, 0, nullptr) != cudaErrorInvalidValue;
    bad += tide_cuda_cast_bf16(nullptr, nullptr, 0, 1, 0, 0) != cudaSuccess;
    bad += tide_cuda_cast_bf16(nullptr, nullptr, 5, 1, 0, 0) != cudaErrorInvalidValue;
    CUDA_OK(cudaDeviceSynchronize());
    float back = 0;
    CUDA_OK(cudaMemcpy(&back, d_out, 4, cudaMemcpyDeviceToHost));
    bad += back != marker;
    cudaFree(d_out);
    ++g_runs;
    g_failures += bad != 0;
    std::printf("%s argument checks (%d wrong answers)\n", bad ? "FAIL" : "PASS", bad);
}

int main(int argc, char **argv) {
    /* Arguments in any order: a seed (0 or none = fresh), and --small (or "quick") for a few
     * cases of each kernel, for runs under compute-sanitizer. */
    uint64_t seed = 0;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--small") == 0 || std::strcmp(argv[i], "quick") == 0)
            quick = true;
        else if (std::strcmp(argv[i], "--racecheck") == 0)
            g_racecheck = true;
        else
            seed = std::strtoull(argv[i], nullptr, 0);
    }
    if (seed == 0) seed = (uint64_t)std::time(nullptr) ^ 0x5eedull;
    g_rng = seed;
    std::setvbuf(stdout, nullptr, _IOLBF, 0); /* progress survives a timeout */
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, sm_%d%d, %d SMs; seed 0x%llx\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount, (unsigned long long)seed);

    run_arg_checks();
    if (g_racecheck) {
        /* bf16 at L = 8 (the training shape), fp32 at L = 5 with mixed alignment (bulk and
         * element paths in one launch), bf16 at L = 2 with NaN payloads in few huge segments. */
        run_sum_case({TIDE_DTYPE_BF16, 7, V_WIDE, 0});
        run_sum_case({TIDE_DTYPE_FP32, 4, V_NORMAL, 2});
        run_sum_case({TIDE_DTYPE_BF16, 1, V_SPECIAL, 4});
        std::printf("%s: %d runs, %d failed\n", g_failures ? "FAIL" : "PASS", g_runs, g_failures);
        return g_failures ? 1 : 0;
    }
    if (quick) {
        for (int dt = 0; dt < 2; ++dt)
            for (int layout = 0; layout < 4; ++layout)
                run_sum_case({dt ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16, 7, V_NORMAL, layout});
        run_sum_case({TIDE_DTYPE_BF16, 1, V_SPECIAL, 2});
        run_land_case(8, 0, V_NORMAL, false);
        run_land_case(3, 3, V_SPECIAL, true);
        run_land_case(1, 1, V_SPECIAL, false, true);
        run_land_bf16_case(3, V_SPECIAL);
        run_cast_case(1000003, 3, 1);
        std::printf("%s: %d runs, %d failed\n", g_failures ? "FAIL" : "PASS", g_runs, g_failures);
        return g_failures ? 1 : 0;
    }
    for (int dt = 0; dt < 2; ++dt)
        for (int ns = 0; ns <= 7; ++ns)
            for (int m = 0; m < V_COUNT; ++m)
                run_sum_case({dt ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16, ns, (value_mode)m,
                              (int)((ns + m + dt) % 3)});
    for (int dt = 0; dt < 2; ++dt)
        for (int ns : {1, 3, 7}) {
            run_sum_case({dt ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16, ns, V_WIDE, 3});
            run_sum_case({dt ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16, ns, V_NORMAL, 4});
        }
    for (int L = 1; L <= 8; ++L)
        for (int mode = 0; mode < 4; ++mode)
            run_land_case(L, mode, (value_mode)((L + mode) % V_COUNT), (L + mode) % 2 == 0);
    for (int mode = 0; mode < 4; ++mode) /* the M = 1 landing: one input, v + 0.0f */
        for (int vm = 0; vm < V_COUNT; ++vm)
            run_land_case(1, mode, (value_mode)vm, (mode + vm) % 2 == 0, true);
    for (int mode = 0; mode < 4; ++mode) /* the rail lane's landing: one bf16 input */
        for (int vm = 0; vm < V_COUNT; ++vm)
            run_land_bf16_case(mode, (value_mode)vm);
    const uint64_t ns_[] = {1, 7, 8, 9, 1000, 65536 + 3, 3000001};
    for (uint64_t n : ns_)
        for (int sh = 0; sh < 3; ++sh)
            run_cast_case(n, sh * 3 % 8, sh == 2 ? 1 : 0);

    std::printf("%s: %d runs, %d failed\n", g_failures ? "FAIL" : "PASS", g_runs, g_failures);
    return g_failures ? 1 : 0;
}
