/*
 * bench_enqueue.cu - host enqueue time of tide_all_gather and tide_reduce_scatter on the CUDA
 * fabric, per call and rank, against the paper's medians (§5, "Long copy-descriptor chains":
 * 0.62 ms for TIDE-AG, 0.80 ms for TIDE-RS).
 *
 *   bench_enqueue [--topology MxL]... [--params P] [--shape DxK] [--llama DIV]
 *                 [--iters N] [--warmup W] [--depth D]
 *
 * Group: P parameters (default 30) of D x K bf16 (default 4096 x 1024), or with --llama DIV
 * the llama3-70b-layer preset repeated in order up to P parameters, dim0 divided by DIV.
 * Topologies default to 8x1 and 8x2 (N = 8 and 16 virtual ranks on the visible GPUs); one
 * that does not fit in free device memory is skipped and says so.
 *
 * One thread drives every rank, rank 0 to N-1, one stream per rank.  Each call of each rank
 * is timed with the host clock.  The fabric binds a rank's operands and returns, and the
 * last rank's call enqueues the whole call of all N ranks, so the table gives
 *   per-rank = (sum of the N calls) / N: the host time per rank and call, the figure that
 *              corresponds to one rank's enqueue in a one-process-per-rank deployment;
 *   last     = the last rank's call (the enqueue of all N ranks' work);
 *   others   = mean of ranks 0..N-2 (binding only);
 *   fabric   = the fabric's own timer of the enqueue (tide_cuda_stats_t.enqueue_ns);
 * medians over --iters calls (default 30, >= 20) after --warmup calls (default 3).  The
 * streams are synchronised after every call by default (--depth 1: no queued GPU work in
 * front of the enqueue); --depth D synchronises after every D iterations instead.
 *
 * Every topology runs in three copy modes: "batched", the default (TIDE_CUDA_BATCH=1 with
 * the size threshold TIDE_CUDA_BATCH_MAX_BYTES, 64 MiB unless the environment sets it: runs of
 * smaller same-device copies as one kernel each, larger copies per op), "batched-all"
 * (TIDE_CUDA_BATCH_MAX_BYTES=0: no threshold, every same-device copy may join a batch) and
 * "per-op" (TIDE_CUDA_BATCH=0); every line names the mode, and the RESULT lines end with the
 * copies the threshold issued per op.
 *
 * Data check after timing: integer-valued inputs, so the landing slot of ranks 0 and N-1 must
 * equal the shards byte for byte, and their fp32 RS shards the exact sums (alpha = 1/N for a
 * power of two N).  Exit status 0 when every call succeeded and every check passed.
 */
#include "gpu_util.h"
#include "tide.h"
extern "C" {
#include "api/comm.h"
#include "fabric/cuda/cuda.h"
#include "plan/presets.h"
}

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static const double PAPER_AG_MS = 0.62, PAPER_RS_MS = 0.80;

/* Copy modes of the fabric (TIDE_CUDA_BATCH, TIDE_CUDA_BATCH_MAX_BYTES). */
enum { MODE_PER_OP = 0, MODE_BATCHED = 1, MODE_BATCHED_ALL = 2 };
static const char *mode_name(int mode) {
    return mode == MODE_PER_OP ? "per-op" : mode == MODE_BATCHED ? "batched" : "batched-all";
}
/* TIDE_CUDA_BATCH_MAX_BYTES as the caller's environment set it (empty: the default). */
static char user_max_bytes[64];

/* Set the fabric's variables for a mode (read when the world is created); returns the
 * threshold in words. */
static const char *mode_setenv(int mode) {
    static char what[128];
    setenv("TIDE_CUDA_BATCH", mode == MODE_PER_OP ? "0" : "1", 1);
    if (mode == MODE_BATCHED_ALL) {
        setenv("TIDE_CUDA_BATCH_MAX_BYTES", "0", 1);
        return "TIDE_CUDA_BATCH_MAX_BYTES=0";
    }
    if (user_max_bytes[0] != '\0') {
        setenv("TIDE_CUDA_BATCH_MAX_BYTES", user_max_bytes, 1);
        snprintf(what, sizeof what, "TIDE_CUDA_BATCH_MAX_BYTES=%s", user_max_bytes);
    } else {
        unsetenv("TIDE_CUDA_BATCH_MAX_BYTES");
        snprintf(what, sizeof what, "TIDE_CUDA_BATCH_MAX_BYTES unset: %llu",
                 (unsigned long long)TIDE_CUDA_BATCH_MAX_BYTES_DEFAULT);
    }
    return what;
}

/* Small integers (-4..4): exact in bf16, and sums of up to 2^21 of them exact in fp32. */
__host__ __device__ inline int int_value(uint64_t i, uint64_t seed) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (int)(x % 9) - 4;
}
static uint16_t bf16_of_int(int v) {
    float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, 4);
    return (uint16_t)(b >> 16);
}
__global__ void fill_ints(uint16_t *p, uint64_t n, uint64_t seed) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float v = (float)int_value(i, seed);
        p[i] = (uint16_t)(__float_as_uint(v) >> 16);
    }
}
static uint64_t shard_seed(int r) { return 1000 + (uint64_t)r; }
static uint64_t grad_seed(int r, int p) { return 7 * (uint64_t)r + 13 * (uint64_t)p + 5; }

/* Wrong elements of a landing slot (N S bytes): Landing(p, u) must hold rank u's shard of p. */
static uint64_t check_landing(const std::vector<tide_param_geometry_t> &geo, int N,
                              const uint16_t *land) {
    uint64_t wrong = 0;
    for (const tide_param_geometry_t &g : geo) {
        const uint64_t n = g.shard_bytes / 2, o_p = g.shard_offset / 2;
        for (int u = 0; u < N; ++u) {
            const uint16_t *dst = land + o_p * N + (uint64_t)u * n;
            for (uint64_t e = 0; e < n; ++e)
                wrong += dst[e] != bf16_of_int(int_value(o_p + e, shard_seed(u)));
        }
    }
    return wrong;
}

/* Wrong elements of rank r's fp32 RS shard: alpha times the exact sum over ranks of the
 * gradient rows r R_p .. r R_p + R_p - 1, zero past D_p. */
static uint64_t check_rs(const std::vector<tide_param_geometry_t> &geo, int N, int r, float alpha,
                         const float *out) {
    uint64_t wrong = 0;
    for (size_t p = 0; p < geo.size(); ++p) {
        const uint64_t R = geo[p].rows_per_rank, K = geo[p].inner, off = geo[p].fp32_offset / 4;
        for (uint64_t i = 0; i < R; ++i) {
            const uint64_t row = (uint64_t)r * R + i;
            for (uint64_t c = 0; c < K; ++c) {
                float want = 0.0f;
                if (row < geo[p].dim0) {
                    long acc = 0;
                    for (int u = 0; u < N; ++u) acc += int_value(row * K + c, grad_seed(u, (int)p));
                    want = alpha * (float)acc;
                }
                const float got = out[off + i * K + c];
                uint32_t a, b;
                memcpy(&a, &got, 4);
                memcpy(&b, &want, 4);
                /* +0 and -0 both count as zero: a sum of integers may end as either. */
                wrong += a != b && !(want == 0.0f && got == 0.0f);
            }
        }
    }
    return wrong;
}

struct opts_t {
    int params = 30;
    uint64_t dim0 = 4096, inner = 1024;
    int llama_div = 0;
    int iters = 30, warmup = 3, depth = 1;
};

struct call_stats_t {
    std::vector<double> per_rank, last, others, total, fabric;
    tide_cuda_stats_t st;
};

/* Returns the number of failed checks; prints one block per topology. */
static int run_topology(const opts_t &o, const std::vector<tide_param_shape_t> &shapes, int M,
                        int L, int mode) {
    const int P = (int)shapes.size(), N = M * L;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = M, cfg.gpus_per_node = L;
    tide_group_desc_t desc = {P, shapes.data(), TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};

    /* Fit check before touching the device: arenas + shards + gradients + fp32 outputs. */
    tide_plan_t probe;
    TK(tide_plan_create(&cfg, &desc, &probe));
    tide_plan_summary_t sum;
    TK(tide_plan_get_summary(probe, &sum));
    tide_plan_destroy(probe);
    uint64_t grad_bytes = 0;
    for (auto &s : shapes) grad_bytes += s.dim0 * s.inner * 2;
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    const int D = std::min(ndev, N);
    const double need = (double)N * (sum.arena_bytes + sum.shard_bytes + grad_bytes +
                                     sum.fp32_shard_bytes);
    double free_total = 0;
    for (int d = 0; d < D; ++d) {
        size_t fr, tot;
        CK(cudaSetDevice(d));
        CK(cudaMemGetInfo(&fr, &tot));
        free_total += (double)fr;
    }
    /* The fabric reads its variables when the world is created. */
    const char *threshold = mode_setenv(mode);
    printf("\n== M=%d L=%d (N=%d virtual ranks on %d GPU%s), %s copies (TIDE_CUDA_BATCH=%d%s%s), "
           "P=%d, S=%.2f MiB, group %.1f MiB, arena %.1f MiB per rank, needs %.1f GiB of %.1f "
           "GiB free\n",
           M, L, N, D, D > 1 ? "s" : "", mode_name(mode), mode != MODE_PER_OP,
           mode != MODE_PER_OP ? ", " : "", mode != MODE_PER_OP ? threshold : "", P,
           sum.shard_bytes / 1048576.0,
           sum.group_bytes / 1048576.0, sum.arena_bytes / 1048576.0, need / 1073741824.0,
           free_total / 1073741824.0);
    if (need > 0.9 * free_total) {
        printf("   skipped: does not fit in device memory\n");
        return 0;
    }

    std::vector<tide_comm_t> comms(N);
    TK(tide_comm_init_all(TIDE_FABRIC_CUDA, M, L, comms.data()));
    std::vector<tide_group_t> groups(N);
    for (int r = 0; r < N; ++r) TK(tide_group_register(comms[r], &cfg, &desc, &groups[r]));
    tide_plan_t plan;
    TK(tide_group_plan(groups[0], &plan));
    TK(tide_plan_get_summary(plan, &sum));
    std::vector<tide_param_geometry_t> geo(P);
    for (int p = 0; p < P; ++p) TK(tide_plan_get_param(plan, p, &geo[p]));
    const uint64_t S = sum.shard_bytes, E = sum.fp32_shard_bytes / 4;

    std::vector<uint16_t *> shard(N);
    std::vector<std::vector<uint16_t *>> grads(N, std::vector<uint16_t *>(P));
    std::vector<float *> out(N);
    std::vector<cudaStream_t> st(N);
    for (int r = 0; r < N; ++r) {
        CK(cudaSetDevice(r % D));
        CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
        CK(cudaMalloc(&shard[r], S));
        fill_ints<<<264, 512>>>(shard[r], S / 2, shard_seed(r));
        CK(cudaGetLastError());
        CK(cudaMalloc(&out[r], E * 4));
        CK(cudaMemset(out[r], 0xff, E * 4)); /* poison: NaN */
        for (int p = 0; p < P; ++p) {
            uint64_t n = shapes[p].dim0 * shapes[p].inner;
            CK(cudaMalloc(&grads[r][p], n * 2));
            fill_ints<<<264, 512>>>(grads[r][p], n, grad_seed(r, p));
            CK(cudaGetLastError());
        }
    }
    for (int d = 0; d < D; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaDeviceSynchronize());
    }
    const float alpha = (N & (N - 1)) == 0 ? 1.0f / N : 1.0f;
    auto sync_all = [&] {
        for (int r = 0; r < N; ++r) CK(cudaStreamSynchronize(st[r]));
    };

    call_stats_t cs[2];
    std::vector<double> t(N);
    int last_slot = 0;
    for (int it = -o.warmup; it < o.iters; ++it) {
        const int slot = (it + o.warmup) % 2;
        for (int k = 0; k < 2; ++k) {
            for (int r = 0; r < N; ++r) {
                double t0 = now_us();
                if (k == 0)
                    TK(tide_all_gather(groups[r], shard[r], slot, st[r]));
                else
                    TK(tide_reduce_scatter(groups[r], (const void *const *)grads[r].data(),
                                           out[r], alpha, 0, TIDE_RS_IN_PLACE, st[r]));
                t[r] = now_us() - t0;
            }
            if (o.depth <= 1 || (it + o.warmup + 1) % o.depth == 0) sync_all();
            if (it < 0) continue;
            double total = 0, others = 0;
            for (int r = 0; r < N; ++r) total += t[r];
            for (int r = 0; r + 1 < N; ++r) others += t[r];
            tide_cuda_stats_t s;
            TK(tide_cuda_arena_stats(groups[0]->arena,
                                     k == 0 ? TIDE_COLL_ALL_GATHER : TIDE_COLL_REDUCE_SCATTER, &s));
            cs[k].per_rank.push_back(total / N);
            cs[k].last.push_back(t[N - 1]);
            cs[k].others.push_back(N > 1 ? others / (N - 1) : 0);
            cs[k].total.push_back(total);
            cs[k].fabric.push_back(s.enqueue_ns / 1e3);
            cs[k].st = s;
        }
        last_slot = slot;
    }
    sync_all();

    /* Data check, ranks 0 and N-1. */
    int bad = 0;
    uint64_t wrong_ag = 0, wrong_rs = 0;
    std::vector<uint16_t> land(sum.group_bytes / 2);
    std::vector<float> h(E);
    const int check_ranks[2] = {0, N - 1};
    for (int ci = 0; ci < (N > 1 ? 2 : 1); ++ci) {
        const int r = check_ranks[ci];
        void *lp;
        TK(tide_group_landing(groups[r], last_slot, &lp));
        CK(cudaMemcpy(land.data(), lp, sum.group_bytes, cudaMemcpyDeviceToHost));
        wrong_ag += check_landing(geo, N, land.data());
        CK(cudaMemcpy(h.data(), out[r], E * 4, cudaMemcpyDeviceToHost));
        wrong_rs += check_rs(geo, N, r, alpha, h.data());
    }
    bad += wrong_ag != 0;
    bad += wrong_rs != 0;

    printf("   plan: ag_descriptors_max %llu per rank, rs_descriptors %llu per rank "
           "(flat %llu), AG rounds %d, RS rounds %d\n",
           (unsigned long long)sum.ag_descriptors_max, (unsigned long long)sum.rs_descriptors,
           (unsigned long long)sum.rs_descriptors_flat, sum.ag_rounds, sum.rs_rounds);
    printf("   %-15s %6s %10s %10s %10s %10s %10s %9s %9s %9s %8s %8s %8s\n", "call", "depth",
           "per-rank", "last", "others", "all ranks", "fabric", "desc/call", "waits", "records",
           "paper", "ratio", "ratio");
    printf("   %-15s %6s %10s %10s %10s %10s %10s %9s %9s %9s %8s %8s %8s\n", "", "",
           "us (med)", "us (med)", "us (med)", "us (med)", "us (med)", "(all N)", "", "", "ms",
           "per-rank", "last");
    const char *names[2] = {"tide_all_gather", "tide_reduce_scatter"};
    const double paper[2] = {PAPER_AG_MS, PAPER_RS_MS};
    for (int k = 0; k < 2; ++k) {
        const double pr = median(cs[k].per_rank), la = median(cs[k].last);
        printf("   %-15s %6d %10.1f %10.1f %10.1f %10.1f %10.1f %9llu %9llu %9llu %8.2f %8.2f "
               "%8.2f\n",
               k == 0 ? "all_gather" : "reduce_scatter", o.depth, pr, la, median(cs[k].others),
               median(cs[k].total), median(cs[k].fabric),
               (unsigned long long)cs[k].st.descriptors, (unsigned long long)cs[k].st.waits,
               (unsigned long long)cs[k].st.records, paper[k], pr / (paper[k] * 1e3),
               la / (paper[k] * 1e3));
        printf("RESULT enqueue %s %s M=%d L=%d P=%d depth=%d: per-rank %.1f us, last rank %.1f "
               "us, fabric %.1f us; paper %.2f ms (ratio %.2f per-rank, %.2f last); descriptors "
               "%llu per rank (plan), %llu CUDA copies/kernels (%llu batched copy kernels "
               "running %llu copies, %llu table uploads) + %llu waits + %llu records per call "
               "of all ranks (%s form); %llu copies per op over the size threshold\n",
               names[k], mode_name(mode), M, L, P, o.depth, pr, la, median(cs[k].fabric), paper[k],
               pr / (paper[k] * 1e3), la / (paper[k] * 1e3),
               (unsigned long long)(k == 0 ? sum.ag_descriptors_max : sum.rs_descriptors),
               (unsigned long long)cs[k].st.descriptors, (unsigned long long)cs[k].st.batches,
               (unsigned long long)cs[k].st.batched, (unsigned long long)cs[k].st.uploads,
               (unsigned long long)cs[k].st.waits, (unsigned long long)cs[k].st.records,
               cs[k].st.form ? "steady" : "fresh", (unsigned long long)cs[k].st.over_threshold);
    }
    printf("   data check (ranks 0 and %d): AG %llu wrong elements, RS %llu wrong elements: %s\n",
           N - 1, (unsigned long long)wrong_ag, (unsigned long long)wrong_rs,
           bad ? "FAIL" : "ok");
    fflush(stdout);

    for (int r = 0; r < N; ++r) TK(tide_group_deregister(groups[r]));
    for (int r = 0; r < N; ++r) TK(tide_comm_destroy(comms[r]));
    for (int r = 0; r < N; ++r) {
        CK(cudaSetDevice(r % D));
        CK(cudaFree(shard[r]));
        CK(cudaFree(out[r]));
        for (int p = 0; p < P; ++p) CK(cudaFree(grads[r][p]));
        CK(cudaStreamDestroy(st[r]));
    }
    CK(cudaSetDevice(0));
    return bad;
}

int main(int argc, char **argv) {
    opts_t o;
    std::vector<std::pair<int, int>> topos;
    for (int i = 1; i < argc; ++i) {
        unsigned long long a, b;
        if (!strcmp(argv[i], "--params") && i + 1 < argc) o.params = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc &&
                 sscanf(argv[i + 1], "%llux%llu", &a, &b) == 2)
            o.dim0 = a, o.inner = b, ++i;
        else if (!strcmp(argv[i], "--llama") && i + 1 < argc) o.llama_div = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) o.iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) o.warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--depth") && i + 1 < argc) o.depth = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--topology") && i + 1 < argc) {
            int m, l;
            if (sscanf(argv[++i], "%dx%d", &m, &l) != 2 || m < 1 || l < 1) return 2;
            topos.push_back({m, l});
        } else {
            fprintf(stderr, "usage: bench_enqueue [--topology MxL]... [--params P] [--shape DxK] "
                            "[--llama DIV] [--iters N>=20] [--warmup W] [--depth D]\n");
            return 2;
        }
    }
    if (o.params < 1 || o.params > TIDE_MAX_PARAMS || o.iters < 20 || o.warmup < 1 ||
        o.depth < 1 || o.dim0 < 1 || o.inner < 1 || o.llama_div < 0) {
        fprintf(stderr, "bench_enqueue: invalid arguments (iters >= 20, warmup >= 1)\n");
        return 2;
    }
    if (topos.empty()) topos = {{8, 1}, {8, 2}};
    setvbuf(stdout, nullptr, _IOLBF, 0);

    std::vector<tide_param_shape_t> shapes;
    char what[160];
    if (o.llama_div > 0) {
        const tide_preset_t *pr = tide_preset_find("llama3-70b-layer");
        if (!pr) {
            fprintf(stderr, "preset llama3-70b-layer missing\n");
            return 1;
        }
        for (int p = 0; p < o.params; ++p) {
            tide_param_shape_t s = pr->shapes[p % pr->num_params];
            s.dim0 = (s.dim0 + o.llama_div - 1) / o.llama_div;
            shapes.push_back(s);
        }
        snprintf(what, sizeof what, "llama3-70b-layer repeated to %d params, dim0/%d", o.params,
                 o.llama_div);
    } else {
        shapes.assign(o.params, tide_param_shape_t{o.dim0, o.inner});
        snprintf(what, sizeof what, "%d x (%llu x %llu)", o.params,
                 (unsigned long long)o.dim0, (unsigned long long)o.inner);
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# bench_enqueue: %s; group %s bf16; %d warm-up + %d timed calls, streams synchronised "
           "%s\n",
           prop.name, what, o.warmup, o.iters,
           o.depth <= 1 ? "after every call" : "every --depth iterations");
    printf("# host time per call (steady_clock around each rank's call). The CUDA fabric binds\n"
           "# ranks 0..N-2 and enqueues all N ranks' work in the last rank's call: per-rank =\n"
           "# (sum over ranks) / N is the figure comparable to one rank's enqueue in the paper\n"
           "# (one process per rank: AG %.2f ms, RS %.2f ms median).\n",
           PAPER_AG_MS, PAPER_RS_MS);
    int bad = 0;
    /* The copy modes of the fabric: batched with the size threshold (the default), batched
     * without it, and per op. */
    const char *user = getenv("TIDE_CUDA_BATCH_MAX_BYTES");
    if (user != nullptr && strlen(user) >= sizeof user_max_bytes) {
        fprintf(stderr, "bench_enqueue: TIDE_CUDA_BATCH_MAX_BYTES is too long\n");
        return 2;
    }
    if (user != nullptr) snprintf(user_max_bytes, sizeof user_max_bytes, "%s", user);
    static const int modes[3] = {MODE_BATCHED, MODE_BATCHED_ALL, MODE_PER_OP};
    for (auto t : topos)
        for (int mode : modes) bad += run_topology(o, shapes, t.first, t.second, mode);
    if (bad) printf("bench_enqueue: FAILED (%d data checks)\n", bad);
    return bad ? 1 : 0;
}
