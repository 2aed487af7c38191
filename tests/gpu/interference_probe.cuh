/*
 * interference_probe.cuh - the resident kernels of bench_interference: spin kernels that hold
 * CTAs while a victim runs (paper Figure 4's lines), and the SM-id probe (paper Table 5), a
 * GEMM-shaped kernel whose CTAs busy-work a fixed time and record their SM and timestamps, so
 * that placement and waves are measured apart from anything cuBLAS does.  Header-only, for
 * nvcc (C++17), included by bench_interference.cu alone.
 */
#ifndef TIDE_TESTS_GPU_INTERFERENCE_PROBE_CUH_
#define TIDE_TESTS_GPU_INTERFERENCE_PROBE_CUH_

#include "gpu_util.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned sm_id() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

/* ------------------------------------------------------------------ spin kernel */

#define SPIN_MAX_CTAS 64
#define SPIN_TIMEOUT_NS 10000000000ull
/* Host-poll form: every spin CTA reads the host-mapped release flag (a read over PCIe) and
 * sleeps this long between two reads. */
#define SPIN_POLL_NS 2000
/* Relay form: only CTA 0 reads the host flag, this rarely, and relays the release through a
 * flag in device memory that the other CTAs poll every SPIN_POLL_NS (an L2 hit); the GPU then
 * makes one PCIe read per SPIN_RELAY_POLL_NS whatever the CTA count. */
#define SPIN_RELAY_POLL_NS 20000

/* How a spin CTA learns that it may go.  TIMED reads no memory at all: it holds for a fixed
 * time by %globaltimer, and the host checks afterwards that it was still resident when the
 * victim finished (spin_still_running), else the row is repeated with a longer hold. */
enum spin_poll_t { SPIN_POLL_HOST = 0, SPIN_POLL_RELAY = 1, SPIN_TIMED = 2 };

static const char *spin_form_name(int mode) {
    return mode == SPIN_POLL_HOST ? "" : mode == SPIN_POLL_RELAY ? " relay" : " timed";
}

struct spin_ctl_t {
    volatile int release;                   /* host sets 1 */
    volatile int started[SPIN_MAX_CTAS];    /* CTA b writes 1 when resident */
    volatile int timed_out[SPIN_MAX_CTAS];  /* CTA b writes 1 if it gave up */
    volatile int smid[SPIN_MAX_CTAS];
};

/* Holds its CTA resident until released (or, TIMED, for hold_ns); the dynamic shared memory is
 * reserved by the launch and never touched.  Every CTA gives up after SPIN_TIMEOUT_NS of
 * device time (reported); the relaying CTA 0 then releases the others too, so no form can
 * hang. */
__global__ void spin_kernel(spin_ctl_t *ctl, int *dev_flag, int mode, uint64_t hold_ns) {
    if (threadIdx.x == 0) {
        ctl->smid[blockIdx.x] = (int)sm_id();
        __threadfence_system();
        ctl->started[blockIdx.x] = 1;
        __threadfence_system();
    }
    if (threadIdx.x == 0 && mode == SPIN_TIMED) {
        const uint64_t t0 = global_ns();
        while (global_ns() - t0 < hold_ns) __nanosleep(SPIN_POLL_NS);
    } else if (threadIdx.x == 0) {
        const bool relay = mode == SPIN_POLL_RELAY;
        const bool reads_host = !relay || blockIdx.x == 0;
        const volatile int *flag = reads_host ? &ctl->release : (const volatile int *)dev_flag;
        const unsigned nap = relay && blockIdx.x == 0 ? SPIN_RELAY_POLL_NS : SPIN_POLL_NS;
        const uint64_t t0 = global_ns();
        while (*flag == 0) {
            if (global_ns() - t0 > SPIN_TIMEOUT_NS) {
                ctl->timed_out[blockIdx.x] = 1;
                __threadfence_system();
                break;
            }
            __nanosleep(nap); /* the hardware sleeps roughly [0, 2 nap] */
        }
        if (relay && blockIdx.x == 0) {
            *(volatile int *)dev_flag = 1;
            __threadfence();
        }
    }
    __syncthreads();
}

/* The host side of one spin launch.  The release flag lives in host-mapped pinned memory and
 * the kernel runs on its own non-blocking stream: nothing here touches the legacy default
 * stream or synchronises the device while a spin kernel runs (that would wait behind it). */
struct spin_res_t {
    spin_ctl_t *host, *dev; /* cudaHostAllocMapped */
    int *flag;              /* device memory, the relay form's flag */
    int smem_full;          /* the full-SM form's dynamic shared memory */
};

struct spin_run_t {
    cudaStream_t st;
    int ctas, threads, smem, mode;
    uint64_t hold_ns; /* TIMED */
    int resident, timed_out;
    std::vector<int> sms; /* SM of each spin CTA */
};

static void spin_res_open(spin_res_t *r, int smem_full) {
    CK(cudaHostAlloc((void **)&r->host, sizeof *r->host, cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer((void **)&r->dev, r->host, 0));
    CK(cudaMalloc(&r->flag, sizeof(int)));
    r->smem_full = smem_full;
    CK(cudaFuncSetAttribute(spin_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_full));
}

static void spin_res_close(spin_res_t *r) {
    CK(cudaFreeHost(r->host));
    CK(cudaFree(r->flag));
}

/* Launch `ctas` spin CTAs and wait (up to 5 s) until all are resident; s->resident says how
 * many were.  Full-SM CTAs have the sum kernel's shared-memory footprint (one per SM); the
 * 1-warp form has 32 threads and no shared memory. */
static void spin_start(spin_res_t *r, spin_run_t *s, int ctas, bool full_sm, int mode,
                       uint64_t hold_ns) {
    if (ctas < 1 || ctas > SPIN_MAX_CTAS || (mode == SPIN_TIMED && hold_ns >= SPIN_TIMEOUT_NS)) {
        fprintf(stderr, "spin_start: %d CTAs out of [1, %d] or hold too long\n", ctas,
                SPIN_MAX_CTAS);
        exit(1);
    }
    memset((void *)r->host, 0, sizeof *r->host);
    __sync_synchronize();
    s->ctas = ctas;
    s->threads = full_sm ? 128 : 32;
    s->smem = full_sm ? r->smem_full : 0;
    s->mode = mode;
    s->hold_ns = hold_ns;
    s->timed_out = 0;
    s->sms.clear();
    CK(cudaStreamCreateWithFlags(&s->st, cudaStreamNonBlocking));
    CK(cudaMemsetAsync(r->flag, 0, sizeof(int), s->st));
    spin_kernel<<<ctas, s->threads, s->smem, s->st>>>(r->dev, r->flag, mode, hold_ns);
    CK(cudaGetLastError());
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
        s->resident = 0;
        for (int b = 0; b < ctas; ++b) s->resident += r->host->started[b] != 0;
        if (s->resident == ctas) break;
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(5)) break;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

/* TIMED: whether the spin CTAs are still resident (call right after the victim finished). */
static bool spin_still_running(const spin_run_t *s) {
    const cudaError_t q = cudaStreamQuery(s->st);
    if (q != cudaSuccess && q != cudaErrorNotReady) CK(q);
    return q == cudaErrorNotReady;
}

/* Release by a host store to the mapped flag, then wait for the spin stream only. */
static void spin_stop(spin_res_t *r, spin_run_t *s) {
    r->host->release = 1;
    __sync_synchronize();
    CK(cudaStreamSynchronize(s->st));
    CK(cudaGetLastError());
    CK(cudaStreamDestroy(s->st));
    for (int b = 0; b < s->ctas; ++b) {
        s->timed_out += r->host->timed_out[b] != 0;
        s->sms.push_back((int)r->host->smid[b]);
    }
}

static int distinct_count(std::vector<int> v) {
    std::sort(v.begin(), v.end());
    return (int)(std::unique(v.begin(), v.end()) - v.begin());
}

/* ------------------------------------------------------------------ SM-id probe */

/* One GEMM-shaped CTA: 213 KB of shared memory (the paper's GEMM CTA; one CTA per SM) and 384
 * threads, as a warp-specialised Hopper GEMM CTA (one producer, two consumer warpgroups),
 * with PROBE_ACC accumulators live per thread so that ptxas gives it about as many registers
 * as such a CTA takes at launch (167 on sm_90 with CUDA 13: 384 x 168 of the 65536; the
 * benchmark prints the count).  What fits beside it on an SM fits beside the GEMM's CTA. */
#define PROBE_THREADS 384
#define PROBE_SMEM (213 * 1024)
#define PROBE_WORK_NS 40000ull
#define PROBE_ACC 140
#define PROBE_MAX_CTAS 256 /* record stride per launch: grid <= this */

struct probe_rec_t {
    uint64_t t0, t1; /* %globaltimer at entry and exit, ns */
    uint32_t smid, done;
};

__global__ void __launch_bounds__(PROBE_THREADS, 1)
    probe_kernel(probe_rec_t *rec, uint64_t work_ns, float seed, float *sink) {
    __shared__ uint64_t start;
    if (threadIdx.x == 0) start = global_ns();
    __syncthreads();
    const uint64_t t0 = start;
    float acc[PROBE_ACC];
#pragma unroll
    for (int i = 0; i < PROBE_ACC; ++i) acc[i] = seed * (float)(threadIdx.x + i);
    do {
#pragma unroll
        for (int i = 0; i < PROBE_ACC; ++i) acc[i] = fmaf(acc[i], 0.999f, seed);
    } while (global_ns() - t0 < work_ns);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < PROBE_ACC; ++i) s += acc[i];
    if (s == 1234.5f) *sink = s; /* keeps the accumulators live; practically never true */
    __syncthreads();
    if (threadIdx.x == 0) {
        probe_rec_t r;
        r.t0 = t0;
        r.t1 = global_ns();
        r.smid = sm_id();
        r.done = 1;
        rec[blockIdx.x] = r;
    }
}

struct probe_shape_t {
    int grid, cluster;
};

/* One probe launch's reading. */
struct probe_obs_t {
    double dur_us;     /* last exit - first entry */
    int displaced;     /* CTAs that entered after the earliest exit: a second wave */
    int on_blocked;    /* CTAs on an SM that a resident spin CTA holds */
    int distinct_sms;
};

/* Per scenario and probe shape: medians over the repetitions. */
struct probe_stat_t {
    double dur_us;        /* median duration */
    double displaced;     /* median displaced CTAs */
    double windows_pct;   /* % of launches with any displaced CTA */
    int max_displaced;
    int max_on_blocked;
    int ok;               /* every CTA of every launch recorded itself */
};

static void probe_open(int sms_optin) {
    if (sms_optin < PROBE_SMEM) {
        fprintf(stderr, "probe: %d B opt-in shared memory < %d B\n", sms_optin, PROBE_SMEM);
        exit(1);
    }
    CK(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            PROBE_SMEM));
}

static cudaLaunchConfig_t probe_config(probe_shape_t sh, cudaStream_t st,
                                       cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(sh.grid);
    cfg.blockDim = dim3(PROBE_THREADS);
    cfg.dynamicSmemBytes = PROBE_SMEM;
    cfg.stream = st;
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = sh.cluster;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

/* Clusters of the probe's shape that fit at once on an idle GPU (occupancy API). */
static int probe_max_clusters(probe_shape_t sh) {
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = probe_config(sh, nullptr, &attr);
    int n = 0;
    CK(cudaOccupancyMaxActiveClusters(&n, probe_kernel, &cfg));
    return n;
}

static void probe_launch(probe_rec_t *rec, probe_shape_t sh, cudaStream_t st, float *sink) {
    if (sh.grid < 1 || sh.grid > PROBE_MAX_CTAS || sh.cluster < 1 || sh.grid % sh.cluster) {
        fprintf(stderr, "probe: grid %d / cluster %d not supported\n", sh.grid, sh.cluster);
        exit(1);
    }
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = probe_config(sh, st, &attr);
    CK(cudaLaunchKernelEx(&cfg, probe_kernel, rec, (uint64_t)PROBE_WORK_NS, 1.0f, sink));
}

/* Enqueue `reps` launches of each shape on `st` (launches on one stream do not overlap), the
 * records of launch (shape s, rep i) at rec + (s * reps + i) * PROBE_MAX_CTAS. */
static void probe_enqueue(probe_rec_t *rec, const std::vector<probe_shape_t> &shapes, int reps,
                          cudaStream_t st, float *sink) {
    CK(cudaMemsetAsync(rec, 0, shapes.size() * reps * PROBE_MAX_CTAS * sizeof(probe_rec_t), st));
    for (size_t s = 0; s < shapes.size(); ++s)
        for (int i = 0; i < reps; ++i)
            probe_launch(rec + (s * reps + i) * PROBE_MAX_CTAS, shapes[s], st, sink);
}

static probe_obs_t probe_observe(const probe_rec_t *r, int grid, const std::set<int> &blocked,
                                 int *ok) {
    probe_obs_t o;
    uint64_t first_in = UINT64_MAX, first_out = UINT64_MAX, last_out = 0;
    std::vector<int> sms;
    for (int b = 0; b < grid; ++b) {
        if (!r[b].done || r[b].t1 < r[b].t0) {
            *ok = 0;
            continue;
        }
        first_in = std::min(first_in, r[b].t0);
        first_out = std::min(first_out, r[b].t1);
        last_out = std::max(last_out, r[b].t1);
        sms.push_back((int)r[b].smid);
    }
    o.dur_us = last_out > first_in ? (last_out - first_in) * 1e-3 : 0;
    o.displaced = 0;
    o.on_blocked = 0;
    for (int b = 0; b < grid; ++b) {
        if (!r[b].done) continue;
        o.displaced += r[b].t0 >= first_out;
        o.on_blocked += blocked.count((int)r[b].smid) != 0;
    }
    o.distinct_sms = distinct_count(sms);
    return o;
}

/* Wait for `st` and copy the records of probe_enqueue's launches to `host`. */
static void probe_fetch(const probe_rec_t *rec_dev, size_t shapes, int reps, cudaStream_t st,
                        std::vector<probe_rec_t> *host) {
    host->assign(shapes * reps * PROBE_MAX_CTAS, probe_rec_t{});
    CK(cudaMemcpyAsync(host->data(), rec_dev, host->size() * sizeof(probe_rec_t),
                       cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
}

/* Reduce each shape's launches to a probe_stat_t; `blocked`: SMs held by spin CTAs. */
static std::vector<probe_stat_t> probe_reduce(const std::vector<probe_rec_t> &h,
                                              const std::vector<probe_shape_t> &shapes, int reps,
                                              const std::set<int> &blocked) {
    std::vector<probe_stat_t> out;
    for (size_t s = 0; s < shapes.size(); ++s) {
        std::vector<double> dur, disp;
        probe_stat_t st_s = {0, 0, 0, 0, 0, 1};
        int windows = 0;
        for (int i = 0; i < reps; ++i) {
            const probe_obs_t o = probe_observe(&h[(s * reps + i) * PROBE_MAX_CTAS],
                                                shapes[s].grid, blocked, &st_s.ok);
            dur.push_back(o.dur_us);
            disp.push_back(o.displaced);
            windows += o.displaced > 0;
            st_s.max_displaced = std::max(st_s.max_displaced, o.displaced);
            st_s.max_on_blocked = std::max(st_s.max_on_blocked, o.on_blocked);
        }
        st_s.dur_us = median(dur);
        st_s.displaced = median(disp);
        st_s.windows_pct = reps > 0 ? 100.0 * windows / reps : 0;
        out.push_back(st_s);
    }
    return out;
}

#endif /* TIDE_TESTS_GPU_INTERFERENCE_PROBE_CUH_ */
