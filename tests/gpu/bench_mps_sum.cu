/*
 * bench_mps_sum.cu - is the one-process-per-rank reduce-scatter's gap to the single-process
 * fabric (issue 25, docs/performance.md) in the Level-1 sum itself?  The same sum, the one a
 * rank of a 1 x N group runs at M = 1 in direct mode (each rank reduces its 1/N chunk of N
 * bf16 gradients into fp32, reading the other ranks' gradients where they are), timed three
 * ways on one GPU:
 *
 *   single  one process, N streams: rank r's sum reads the other ranks' gradients in the same
 *           process (the single-process fabric's direct mode);
 *   peer    N processes: rank r's sum reads the other ranks' gradients through CUDA IPC
 *           mappings (the multi-process fabric's direct mode);
 *   local   N processes: rank r's sum reads N - 1 gradients of its own allocation (the same
 *           bytes and kernel, no mapping): separates what the processes cost from what the
 *           mappings cost.
 *
 *   bench_mps_sum [--op sum|copy] [--ranks N] [--mib M] [--ctas C] [--reps R]
 *                 [--copy-ctas C] [--unroll 4|8|16] [--streaming 0|1]
 *                 [--modes single,peer,local(,pull,memcpy)]
 *
 * --op copy times the all-gather's copies instead (the 1 x N AG at M = 1, whose gap to the
 * single-process fabric is the same 1.05x at N = 2, 4 and 8: docs/performance.md): rank r
 * copies its shard (its 1/N of M MiB of bf16) into chunk r of every rank's unsharded buffer,
 * its own included, as one launch of the fabric's batched copy kernel (batch_copy.h) with the
 * fabric's grid for those bytes (or --copy-ctas C CTAs).  single and peer push as the fabric
 * does (peer: into the other processes' buffers through IPC mappings); pull (copy only):
 * rank r reads every shard through the mappings into its own buffer; local: rank r copies
 * its own copies of every shard into its own buffer (the same bytes, no mapping).  Every
 * rank's buffer must end as the N shards in rank order, the same in every mode.  Bytes:
 * N x (M MiB read + M MiB written).  memcpy (copy only): single's copies as one
 * cudaMemcpyAsync each, the ceiling the kernel is held to.  --unroll and --streaming pick the
 * copy kernel's variant (tide_cuda_batch_copy); the default is the fabric's.
 *
 * Run it under an MPS daemon (run.sh step mps-sum, tests/gpu/mps.sh) for the processes to
 * share the SMs; without one they are time-sliced.  Each rep: every rank waits at a
 * process-shared barrier, launches its sum and synchronises; the rep's span is the last
 * rank's end minus the first rank's start (host CLOCK_MONOTONIC, one clock for all
 * processes), so it includes the launch skew a collective pays.  Per mode the median span,
 * the median of the ranks' own kernel times (CUDA events), and the share of the HBM peak of
 * the bytes every rank's sum reads and writes: N x (M MiB of bf16 read + M/N x 2 MiB of fp32
 * written).  Inputs are random; the outputs of the three modes are compared bit for bit with
 * each other (a rank's sum must not depend on how the inputs are reached), so a wrong mapping
 * fails the run (exit 1) instead of printing a figure.  Measurement only, not a timed test.
 */
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_ok.h"
#include "fabric/cuda/batch_copy.h"
#include "gpu_hash.cuh"
#include "kernels/kernels.h"
#include "kernels/launch.h"

#define MAX_RANKS 8
#define MAX_REPS 64
#define SEG_ELEMS (1u << 20)

__global__ void fill_grad(uint16_t *p, uint64_t n, uint32_t seed) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        p[i] = (uint16_t)(__float_as_uint(hash_value(i, seed)) >> 16);
}

/* Shared by every process of one mode (an anonymous shared mapping made before the fork). */
struct shared_t {
    pthread_barrier_t bar;
    cudaIpcMemHandle_t grad[MAX_RANKS];
    cudaIpcMemHandle_t land[MAX_RANKS]; /* --op copy: every rank's unsharded buffer */
    double start[MAX_REPS][MAX_RANKS], end[MAX_REPS][MAX_RANKS], kernel_ms[MAX_REPS][MAX_RANKS];
    uint64_t out_hash[MAX_RANKS];
    double peak; /* the HBM peak, bytes/s, asked in a child (see main) */
};

struct opts_t {
    int ranks = 8, ctas = 10, reps = 20;
    int copy_ctas = 0; /* --copy-ctas: the copy kernel's grid; 0 = the fabric's */
    int unroll = TIDE_CUDA_BATCH_UNROLL;        /* --unroll: the copy kernel's variant */
    int streaming = TIDE_CUDA_BATCH_STREAMING;  /* --streaming 0|1 */
    bool memcpy_mode = false; /* mode memcpy: cudaMemcpyAsync a descriptor, not the kernel */
    uint64_t mib = 384;
    bool copy = false; /* --op copy */
};

static double now_s() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t elems(const opts_t &o) { return o.mib * (1ull << 20) / 2 / o.ranks * o.ranks; }

/* The sum's segment table for rank r: its chunk of the gradient, in 1 Mi-element segments. */
static tide_sum_seg_t *upload_segs(const opts_t &o, int r, int *n_out) {
    const uint64_t chunk = elems(o) / o.ranks;
    std::vector<tide_sum_seg_t> h;
    for (uint64_t off = 0; off < chunk; off += SEG_ELEMS) {
        tide_sum_seg_t s{};
        s.out_off = off;
        s.own_off = (uint64_t)r * chunk + off;
        s.len = s.valid = (uint32_t)std::min<uint64_t>(SEG_ELEMS, chunk - off);
        h.push_back(s);
    }
    tide_sum_seg_t *d;
    CUDA_OK(cudaMalloc(&d, h.size() * sizeof(h[0])));
    CUDA_OK(cudaMemcpy(d, h.data(), h.size() * sizeof(h[0]), cudaMemcpyHostToDevice));
    *n_out = (int)h.size();
    return d;
}

/* One rank's timed launch: its sum (own = grads[r], staged contribution k read in place at
 * grads[(r+1+k) % N]) or, with --op copy, its batch of N copies. */
struct rank_sum_t {
    tide_sum_args_t args{};
    float *out = nullptr;
    uint16_t *land = nullptr;               /* --op copy: this rank's unsharded buffer */
    tide_cuda_copy_desc_t *table = nullptr; /* --op copy: the N copies (device) */
    std::vector<tide_cuda_copy_desc_t> host; /* the same copies on the host (mode memcpy) */
    int copy_ctas = 0;
    cudaStream_t stream{};
    cudaEvent_t ev0{}, ev1{};
};

static void rank_stream_init(rank_sum_t *rs) {
    CUDA_OK(cudaStreamCreateWithFlags(&rs->stream, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreate(&rs->ev0));
    CUDA_OK(cudaEventCreate(&rs->ev1));
}

static void rank_sum_init(rank_sum_t *rs, const opts_t &o, int r, void *const *grads) {
    const void *own_h[1] = {grads[r]};
    const void *peers_h[MAX_RANKS];
    for (int k = 0; k < o.ranks - 1; ++k) peers_h[k] = grads[(r + 1 + k) % o.ranks];
    const void **own_d, **peers_d;
    CUDA_OK(cudaMalloc(&own_d, sizeof(own_h)));
    CUDA_OK(cudaMalloc(&peers_d, sizeof(peers_h)));
    CUDA_OK(cudaMemcpy(own_d, own_h, sizeof(own_h), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(peers_d, peers_h, sizeof(peers_h), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&rs->out, elems(o) / o.ranks * sizeof(float)));
    rs->args.segs = upload_segs(o, r, &rs->args.num_segs);
    rs->args.num_staged = o.ranks - 1;
    rs->args.own = own_d;
    rs->args.peers = peers_d;
    /* Never read while peers is set; the launcher asks for a staged block all the same. */
    rs->args.staged = grads[r];
    rs->args.peer_stride = 1;
    rs->args.dtype = TIDE_DTYPE_BF16;
    rs->args.out = rs->out;
    rank_stream_init(rs);
}

/* --op copy: push (rank r's shard shards[r] into chunk r of lands[p], every p) or gather
 * (every shards[p] into chunk p of lands[r]); the grid as the fabric's batch planner sizes
 * it for these bytes (mp_batch.c, batch_copy.h). */
static void rank_copy_init(rank_sum_t *rs, const opts_t &o, int r, void *const *shards,
                           void *const *lands, bool push) {
    const uint64_t chunk = elems(o) / o.ranks * 2; /* bytes */
    std::vector<tide_cuda_copy_desc_t> d(o.ranks);
    for (int p = 0; p < o.ranks; ++p) {
        d[p] = tide_cuda_copy_desc_t{};
        d[p].dst = (uint64_t)(uintptr_t)lands[push ? p : r] + (uint64_t)(push ? r : p) * chunk;
        d[p].src = (uint64_t)(uintptr_t)shards[push ? r : p];
        d[p].bytes = chunk;
        d[p].rows = 1;
    }
    rs->host = d;
    CUDA_OK(cudaMalloc(&rs->table, d.size() * sizeof(d[0])));
    CUDA_OK(cudaMemcpy(rs->table, d.data(), d.size() * sizeof(d[0]), cudaMemcpyHostToDevice));
    int sms = 0;
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    rs->copy_ctas =
        o.copy_ctas > 0 ? o.copy_ctas : tide_cuda_batch_grid(chunk * o.ranks, (uint64_t)sms);
    rs->land = (uint16_t *)lands[r];
    rank_stream_init(rs);
}

static void rank_sum_launch(rank_sum_t *rs, const opts_t &o) {
    CUDA_OK(cudaEventRecord(rs->ev0, rs->stream));
    if (o.copy && o.memcpy_mode)
        for (const tide_cuda_copy_desc_t &d : rs->host)
            CUDA_OK(cudaMemcpyAsync((void *)(uintptr_t)d.dst, (const void *)(uintptr_t)d.src,
                                    d.bytes, cudaMemcpyDeviceToDevice, rs->stream));
    else if (o.copy)
        CUDA_OK(tide_cuda_batch_copy(rs->table, o.ranks, rs->copy_ctas, o.unroll, o.streaming,
                                     rs->stream));
    else CUDA_OK(tide_cuda_sum(&rs->args, o.ctas, 0, rs->stream));
    CUDA_OK(cudaEventRecord(rs->ev1, rs->stream));
}

/* The rank's result: its fp32 sum, or with --op copy its whole unsharded buffer. */
static uint64_t out_hash(const rank_sum_t &rs, const opts_t &o) {
    const uint64_t n = o.copy ? elems(o) / 2 : elems(o) / o.ranks; /* 32-bit words */
    std::vector<uint32_t> h(n);
    CUDA_OK(cudaMemcpy(h.data(), o.copy ? (const void *)rs.land : (const void *)rs.out, n * 4,
                       cudaMemcpyDeviceToHost));
    uint64_t x = 1469598103934665603ull;
    for (uint32_t v : h) x = (x ^ v) * 1099511628211ull;
    return x;
}

static uint16_t *alloc_fill(uint64_t n, uint32_t seed) {
    uint16_t *g;
    CUDA_OK(cudaMalloc(&g, n * 2));
    fill_grad<<<264, 1024>>>(g, n, seed);
    CUDA_OK(cudaGetLastError());
    return g;
}

/* A rank's gradient, or with --op copy its shard (1/N of it). */
static uint16_t *alloc_grad(const opts_t &o, uint32_t seed) {
    return alloc_fill(o.copy ? elems(o) / o.ranks : elems(o), seed);
}

static void *open_peer(const cudaIpcMemHandle_t &h) {
    void *p = nullptr;
    CUDA_OK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    return p;
}

/* A process of mode peer, pull or local, rank r. */
static int run_rank(shared_t *sh, const opts_t &o, int r, const std::string &mode) {
    CUDA_OK(cudaSetDevice(0));
    const bool mapped = mode != "local";
    void *grads[MAX_RANKS], *lands[MAX_RANKS];
    uint16_t *mine = alloc_grad(o, 1000 + r);
    uint16_t *land = o.copy ? alloc_fill(elems(o), 7) : nullptr;
    CUDA_OK(cudaDeviceSynchronize());
    if (mapped) {
        CUDA_OK(cudaIpcGetMemHandle(&sh->grad[r], mine));
        if (o.copy) CUDA_OK(cudaIpcGetMemHandle(&sh->land[r], land));
        pthread_barrier_wait(&sh->bar);
        for (int p = 0; p < o.ranks; ++p) {
            grads[p] = p == r ? (void *)mine : open_peer(sh->grad[p]);
            lands[p] = p == r ? (void *)land : o.copy ? open_peer(sh->land[p]) : nullptr;
        }
    } else {
        /* The other ranks' gradients (shards), as copies in this process: the same values. */
        for (int p = 0; p < o.ranks; ++p) {
            grads[p] = p == r ? mine : alloc_grad(o, 1000 + p);
            lands[p] = land;
        }
        CUDA_OK(cudaDeviceSynchronize());
    }
    rank_sum_t rs;
    if (!o.copy) rank_sum_init(&rs, o, r, grads);
    else rank_copy_init(&rs, o, r, grads, lands, mode == "peer");
    rank_sum_launch(&rs, o); /* warm-up */
    CUDA_OK(cudaStreamSynchronize(rs.stream));
    for (int i = 0; i < o.reps; ++i) {
        pthread_barrier_wait(&sh->bar);
        sh->start[i][r] = now_s();
        rank_sum_launch(&rs, o);
        CUDA_OK(cudaStreamSynchronize(rs.stream));
        sh->end[i][r] = now_s();
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, rs.ev0, rs.ev1));
        sh->kernel_ms[i][r] = ms;
    }
    pthread_barrier_wait(&sh->bar); /* pushed copies: every rank's have ended */
    sh->out_hash[r] = out_hash(rs, o);
    pthread_barrier_wait(&sh->bar); /* peers keep their memory until every rank is done */
    return 0;
}

/* Mode single: one process, one stream per rank, launched back to back each rep. */
static int run_single(shared_t *sh, const opts_t &o) {
    CUDA_OK(cudaSetDevice(0));
    void *grads[MAX_RANKS], *lands[MAX_RANKS];
    for (int p = 0; p < o.ranks; ++p) {
        grads[p] = alloc_grad(o, 1000 + p);
        lands[p] = o.copy ? alloc_fill(elems(o), 7) : nullptr;
    }
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<rank_sum_t> rs(o.ranks);
    for (int r = 0; r < o.ranks; ++r) {
        if (!o.copy) rank_sum_init(&rs[r], o, r, grads);
        else rank_copy_init(&rs[r], o, r, grads, lands, true);
    }
    for (int i = -1; i < o.reps; ++i) {
        const double t0 = now_s();
        for (int r = 0; r < o.ranks; ++r) rank_sum_launch(&rs[r], o);
        for (int r = 0; r < o.ranks; ++r) CUDA_OK(cudaStreamSynchronize(rs[r].stream));
        const double t1 = now_s();
        if (i < 0) continue; /* warm-up */
        for (int r = 0; r < o.ranks; ++r) {
            float ms;
            CUDA_OK(cudaEventElapsedTime(&ms, rs[r].ev0, rs[r].ev1));
            sh->start[i][r] = t0;
            sh->end[i][r] = t1;
            sh->kernel_ms[i][r] = ms;
        }
    }
    for (int r = 0; r < o.ranks; ++r) sh->out_hash[r] = out_hash(rs[r], o);
    return 0;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* The HBM peak from the device's memory clock and bus width (2 x clock x width / 8). */
static double hbm_peak_bytes_s() {
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, 0) != cudaSuccess)
        return 0.0;
    return 2.0 * khz * 1e3 * bits / 8.0;
}

/* Runs one mode in child processes (so that no CUDA context outlives it); its figures. */
static bool run_mode(const std::string &mode, const opts_t &o, shared_t *sh, double *span_ms,
                     double *kernel_ms, uint64_t hash[MAX_RANKS]) {
    std::memset(sh, 0, sizeof(*sh));
    pthread_barrierattr_t at;
    pthread_barrierattr_init(&at);
    pthread_barrierattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    const bool one = mode == "single" || mode == "memcpy";
    const int procs = one ? 1 : o.ranks;
    pthread_barrier_init(&sh->bar, &at, (unsigned)procs);
    std::vector<pid_t> pids;
    for (int r = 0; r < procs; ++r) {
        const pid_t pid = fork();
        if (pid == 0) {
            opts_t om = o;
            om.memcpy_mode = mode == "memcpy";
            _exit(one ? run_single(sh, om) : run_rank(sh, o, r, mode));
        }
        pids.push_back(pid);
    }
    bool ok = true;
    for (pid_t pid : pids) {
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = false;
    }
    pthread_barrier_destroy(&sh->bar);
    if (!ok) return false;
    std::vector<double> spans, kms;
    for (int i = 0; i < o.reps; ++i) {
        double lo = sh->start[i][0], hi = sh->end[i][0];
        for (int r = 0; r < o.ranks; ++r) {
            lo = std::min(lo, sh->start[i][r]);
            hi = std::max(hi, sh->end[i][r]);
            kms.push_back(sh->kernel_ms[i][r]);
        }
        spans.push_back((hi - lo) * 1e3);
    }
    *span_ms = median(spans);
    *kernel_ms = median(kms);
    std::memcpy(hash, sh->out_hash, sizeof(sh->out_hash));
    return true;
}

int main(int argc, char **argv) {
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
    setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
    opts_t o;
    std::string modes = "single,peer,local";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (a == "--ranks" && v) o.ranks = atoi(argv[++i]);
        else if (a == "--mib" && v) o.mib = strtoull(argv[++i], nullptr, 10);
        else if (a == "--ctas" && v) o.ctas = atoi(argv[++i]);
        else if (a == "--reps" && v) o.reps = atoi(argv[++i]);
        else if (a == "--copy-ctas" && v) o.copy_ctas = atoi(argv[++i]);
        else if (a == "--unroll" && v) o.unroll = atoi(argv[++i]);
        else if (a == "--streaming" && v) o.streaming = atoi(argv[++i]);
        else if (a == "--modes" && v) modes = argv[++i];
        else if (a == "--op" && v && (!std::strcmp(v, "sum") || !std::strcmp(v, "copy")))
            o.copy = !std::strcmp(argv[++i], "copy");
        else {
            std::fprintf(stderr,
                         "usage: %s [--op sum|copy] [--ranks N<=8] [--mib M] [--ctas C] "
                         "[--reps R<=64] [--copy-ctas C] [--unroll 4|8|16] [--streaming 0|1] "
                         "[--modes single,peer,local(,pull,memcpy: copy)]\n",
                         argv[0]);
            return 2;
        }
    }
    if (o.ranks < 2 || o.ranks > MAX_RANKS || o.reps < 1 || o.reps > MAX_REPS || o.ctas < 1 ||
        o.mib < 1 || o.copy_ctas < 0 || (o.unroll != 4 && o.unroll != 8 && o.unroll != 16)) {
        std::fprintf(stderr, "bench_mps_sum: --ranks 2..%d, --reps 1..%d, --ctas >= 1, "
                             "--mib >= 1, --copy-ctas >= 0, --unroll 4, 8 or 16\n",
                     MAX_RANKS, MAX_REPS);
        return 2;
    }
    auto *sh = (shared_t *)mmap(nullptr, sizeof(shared_t), PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 2;
    const double bytes = o.copy ? (double)o.ranks * elems(o) * 2.0 * 2.0
                                : (double)o.ranks * (elems(o) * 2.0 + elems(o) / o.ranks * 4.0);
    if (o.copy)
        std::printf("bench_mps_sum --op copy: %d ranks, %llu MiB bf16 unsharded a rank, each rank "
                    "one batched copy of N shards (grid: %d CTAs, 0 = the fabric's; unroll %d, "
                    "streaming %d), %d reps; %s\n",
                    o.ranks, (unsigned long long)o.mib, o.copy_ctas, o.unroll, o.streaming, o.reps,
                    getenv("CUDA_MPS_PIPE_DIRECTORY") ? "under MPS" : "no MPS daemon named");
    else
        std::printf("bench_mps_sum: %d ranks, %llu MiB bf16 gradient a rank, %d sum CTAs a rank, "
                    "%d reps; %s\n", o.ranks, (unsigned long long)o.mib, o.ctas, o.reps,
                    getenv("CUDA_MPS_PIPE_DIRECTORY") ? "under MPS" : "no MPS daemon named");
    std::printf("%-8s %10s %8s %12s %12s\n", "mode", "span ms", "HBM %", "kernel ms", "vs single");
    uint64_t ref[MAX_RANKS] = {0};
    bool have_ref = false, all_ok = true;
    double single_span = 0.0, peak = 0.0;
    size_t pos = 0;
    while (pos <= modes.size()) {
        const size_t comma = modes.find(',', pos);
        const std::string m =
            modes.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        pos = comma == std::string::npos ? modes.size() + 1 : comma + 1;
        if (m != "single" && m != "peer" && m != "local" &&
            !(o.copy && (m == "pull" || m == "memcpy"))) {
            std::fprintf(stderr, "bench_mps_sum: unknown mode '%s'\n", m.c_str());
            return 2;
        }
        double span = 0, kms = 0;
        uint64_t hash[MAX_RANKS];
        if (!run_mode(m, o, sh, &span, &kms, hash)) {
            std::printf("%-8s FAILED (a process exited with an error; see stderr)\n", m.c_str());
            all_ok = false;
            continue;
        }
        if (peak == 0.0) {
            /* Asked in a child: the parent keeps no CUDA context across later forks. */
            const pid_t pid = fork();
            if (pid == 0) {
                sh->peak = hbm_peak_bytes_s();
                _exit(0);
            }
            waitpid(pid, nullptr, 0);
            peak = sh->peak;
        }
        if (m == "single") single_span = span;
        if (!have_ref) {
            std::memcpy(ref, hash, sizeof(ref));
            have_ref = true;
        } else if (std::memcmp(ref, hash, sizeof(uint64_t) * o.ranks) != 0) {
            std::printf("%-8s output differs from the first mode's: WRONG\n", m.c_str());
            all_ok = false;
        }
        const double share = peak > 0 ? 100.0 * bytes / (span * 1e-3) / peak : 0.0;
        char ratio[32] = "-";
        if (single_span > 0 && m != "single")
            std::snprintf(ratio, sizeof(ratio), "%.2fx", span / single_span);
        std::printf("%-8s %10.3f %7.1f%% %12.3f %12s\n", m.c_str(), span, share, kms, ratio);
    }
    std::printf("bytes a rep: %.1f MiB; HBM peak %.2f TB/s\n", bytes / (1 << 20), peak / 1e12);
    return all_ok ? 0 : 1;
}
