/*
 * interference_comm.cuh - the communication side of bench_interference: random bf16 / fp32
 * data, TIDE-RS's SM kernels (Level-1 sum, landing) on synthetic segments, the loops that keep
 * them running beside a victim (back to back on one stream, on two streams, or with idle gaps
 * at a third of the time, as in training), and the whole TIDE-RS of an emulated 1 x 8 group on
 * the CUDA fabric.  Header-only, for nvcc (C++17), included by bench_interference.cu alone.
 */
#ifndef TIDE_TESTS_GPU_INTERFERENCE_COMM_CUH_
#define TIDE_TESTS_GPU_INTERFERENCE_COMM_CUH_

#include "tide.h"
extern "C" {
#include "kernels/kernels.h"
#include "kernels/launch.h"
#include "plan/presets.h"
}

#include "gpu_util.h"

#include "gpu_hash.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

/* ------------------------------------------------------------------ data */

__global__ void fill_bf16(uint16_t *p, uint64_t n, uint32_t seed, float scale) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint32_t b = __float_as_uint(hash_value(i, seed) * scale);
        p[i] = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16); /* RNE, finite inputs */
    }
}
__global__ void fill_f32(float *p, uint64_t n, uint32_t seed) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        p[i] = hash_value(i, seed);
}

/* ------------------------------------------------------------------ TIDE kernels */

struct comm_t {
    int sms;
    /* Level-1 sum: L = 8 bf16 (7 staged + own), E outputs in 1 Mi-element segments. */
    uint64_t sum_elems;
    uint16_t *staged, *own[4];
    const void **own_table;
    tide_sum_seg_t *sum_segs;
    int num_sum_segs;
    const tide_sum_seg_t *sum_segs_host; /* host copy of sum_segs (sliced launches) */
    float *sum_out;
    /* Landing: L = 8 fp32 inbox blocks into an fp32 shard, accumulate. */
    uint64_t land_elems;
    float *inbox[8], *land_out;
    tide_land_seg_t *land_segs;
    int num_land_segs;
    std::vector<tide_sum_seg_t> hsum;
    std::vector<tide_land_seg_t> hland;
};

static void comm_init(comm_t *c, int sms) {
    c->sms = sms;
    const uint64_t seg = 1u << 20;
    c->sum_elems = 16ull << 20; /* 320 MB of logical traffic: ~0.2 ms at 16 CTAs */
    CK(cudaMalloc(&c->staged, 7 * c->sum_elems * 2));
    fill_bf16<<<4 * sms, 512>>>(c->staged, 7 * c->sum_elems, 11, 1.0f);
    CK(cudaGetLastError());
    const void *tbl[4];
    for (int k = 0; k < 4; ++k) {
        CK(cudaMalloc(&c->own[k], c->sum_elems / 4 * 2));
        fill_bf16<<<4 * sms, 512>>>(c->own[k], c->sum_elems / 4, 20 + k, 1.0f);
        CK(cudaGetLastError());
        tbl[k] = c->own[k];
    }
    CK(cudaMalloc(&c->own_table, sizeof tbl));
    CK(cudaMemcpy(c->own_table, tbl, sizeof tbl, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&c->sum_out, c->sum_elems * 4));
    c->num_sum_segs = (int)(c->sum_elems / seg);
    std::vector<tide_sum_seg_t> hs(c->num_sum_segs);
    for (int i = 0; i < c->num_sum_segs; ++i)
        hs[i] = {(uint64_t)i * seg, (uint64_t)i * seg, (uint64_t)(i / 4) * seg, (uint32_t)seg,
                 (uint32_t)seg, (int32_t)(i % 4), 0};
    CK(cudaMalloc(&c->sum_segs, hs.size() * sizeof hs[0]));
    CK(cudaMemcpy(c->sum_segs, hs.data(), hs.size() * sizeof hs[0], cudaMemcpyHostToDevice));
    c->hsum = hs;
    c->sum_segs_host = c->hsum.data();

    c->land_elems = 4ull << 20; /* 160 MB of logical traffic: ~0.3 ms at 4 CTAs */
    for (int k = 0; k < 8; ++k) {
        CK(cudaMalloc(&c->inbox[k], c->land_elems * 4));
        fill_f32<<<4 * sms, 512>>>(c->inbox[k], c->land_elems, 100 + k);
        CK(cudaGetLastError());
    }
    CK(cudaMalloc(&c->land_out, c->land_elems * 4));
    fill_f32<<<4 * sms, 512>>>(c->land_out, c->land_elems, 99);
    CK(cudaGetLastError());
    c->num_land_segs = (int)(c->land_elems / seg);
    std::vector<tide_land_seg_t> hl(c->num_land_segs);
    for (int i = 0; i < c->num_land_segs; ++i)
        hl[i] = {(uint64_t)i * seg, (uint64_t)i * seg, (uint32_t)seg, 0};
    CK(cudaMalloc(&c->land_segs, hl.size() * sizeof hl[0]));
    CK(cudaMemcpy(c->land_segs, hl.data(), hl.size() * sizeof hl[0], cudaMemcpyHostToDevice));
    c->hland = hl;
    CK(cudaDeviceSynchronize());
}

static void comm_free(comm_t *c) {
    CK(cudaFree(c->staged));
    for (int k = 0; k < 4; ++k) CK(cudaFree(c->own[k]));
    CK(cudaFree(c->own_table));
    CK(cudaFree(c->sum_out));
    CK(cudaFree(c->sum_segs));
    for (int k = 0; k < 8; ++k) CK(cudaFree(c->inbox[k]));
    CK(cudaFree(c->land_out));
    CK(cudaFree(c->land_segs));
}

/* Sliced launches (tide_cuda_sum_sliced): each sum / landing of the loops below runs in about
 * this many launches (1/count of its logical bytes a slice); 1: one launch.  Set per row,
 * with the loop drained. */
static int g_sum_slices = 1, g_land_slices = 1;
static int g_sum_launches = 0; /* launches of the last sum_launch */

static void sum_launch(comm_t *c, int ctas, cudaStream_t st) {
    tide_sum_args_t a = {c->sum_segs,     c->num_sum_segs, c->staged, c->sum_elems, 7,
                         c->own_table,    TIDE_DTYPE_BF16, c->sum_out, nullptr,     0,
                         nullptr,         0,               0};
    const uint64_t bytes = tide_cuda_sum_bytes(&a, c->sum_segs_host);
    CK(tide_cuda_sum_sliced(&a, c->sum_segs_host, ctas, 0,
                            g_sum_slices > 1 ? bytes / g_sum_slices + 1 : 0, st,
                            &g_sum_launches));
}

static void land_launch(comm_t *c, int ctas, cudaStream_t st) {
    tide_land_args_t a;
    memset(&a, 0, sizeof a);
    a.segs = c->land_segs;
    a.num_segs = c->num_land_segs;
    for (int k = 0; k < 8; ++k) a.in[k] = c->inbox[k];
    a.num_in = 8;
    a.out = c->land_out;
    a.alpha = 0.125f;
    a.init = false;
    a.accumulate = true;
    const uint64_t bytes = tide_cuda_land_bytes(&a, c->hland.data());
    CK(tide_cuda_land_sliced(&a, c->hland.data(), ctas, 0,
                             g_land_slices > 1 ? bytes / g_land_slices + 1 : 0, st, nullptr));
}

/* Median ms of one launch alone, on `st`. */
template <class F> static double time_alone_ms(F launch, cudaStream_t st) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    launch();
    launch();
    std::vector<double> t;
    for (int i = 0; i < 9; ++i) {
        CK(cudaEventRecord(a, st));
        launch();
        CK(cudaEventRecord(b, st));
        t.push_back(event_ms(a, b));
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return median(t);
}

/* ------------------------------------------------------------------ background loops */

enum tide_form_t {
    TIDE_SERIAL,     /* sum -> land back to back on one stream: max(sum, land) CTAs resident */
    TIDE_CONCURRENT, /* sums and landings loop on two streams: sum + land CTAs resident */
    TIDE_DUTY        /* sum -> land, then an idle gap of twice their time alone: resident ~1/3 */
};

/* The duty form's gap: a host function on the comm stream sleeps, so the stream waits and no
 * CTA is resident (a device-side wait kernel would hold an SM).  One value for every gap of a
 * loop; the loop is drained before it changes. */
static int g_duty_gap_us = 0;
static void CUDART_CB duty_sleep(void *) {
    std::this_thread::sleep_for(std::chrono::microseconds(g_duty_gap_us));
}

/* What one background loop did. */
struct tide_bg_t {
    int covered;       /* the loop was still running when the work finished */
    double comm_ms;    /* the loop length of the attempt that counted */
    int cycles;        /* sum -> land cycles enqueued (serial and duty forms) */
    /* Duty form only, in ms from the loop's first event: each cycle's kernel interval, and
     * the caller's mark events (the victim's per-rep events) on the same clock. */
    std::vector<double> busy_s, busy_e, marks;
    double loop_residency; /* duty: sum of kernel intervals / loop span */
};

/*
 * Run TIDE's kernels in `form` for about comm_ms and call work() once the loop is under way;
 * when the loop ended before work() returned, retry with twice the length (three attempts).
 * `marks` (duty form): events that work() records on another stream, converted to the loop's
 * clock afterwards.  Streams are non-blocking, at priority `prio`.
 */
template <class F>
static tide_bg_t tide_background(comm_t *c, int sum_ctas, int land_ctas, tide_form_t form,
                                 int prio, double comm_ms, double t_sum, double t_land, F work,
                                 const std::vector<cudaEvent_t> *marks, int nmarks,
                                 const char *name, const char *ctas) {
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, prio));
    CK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, prio));
    cudaEvent_t started, end1, end2;
    CK(cudaEventCreateWithFlags(&started, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&end1, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&end2, cudaEventDisableTiming));
    tide_bg_t bg;
    bg.covered = 0;
    bg.cycles = 0;
    bg.loop_residency = 0;
    std::vector<cudaEvent_t> cyc; /* duty: 2 timing events per cycle */
    for (int attempt = 0; attempt < 3 && !bg.covered; ++attempt, comm_ms *= 2) {
        for (cudaEvent_t e : cyc) CK(cudaEventDestroy(e));
        cyc.clear();
        if (form == TIDE_CONCURRENT) {
            int ns = (int)std::ceil(comm_ms / t_sum) + 2, nl = (int)std::ceil(comm_ms / t_land) + 2;
            for (int i = 0; i < std::max(ns, nl); ++i) {
                if (i < ns) sum_launch(c, sum_ctas, s1);
                if (i < nl) land_launch(c, land_ctas, s2);
                if (i == 1) CK(cudaEventRecord(started, s1));
            }
        } else if (form == TIDE_SERIAL) {
            int n = (int)std::ceil(comm_ms / (t_sum + t_land)) + 2;
            bg.cycles = n;
            for (int i = 0; i < n; ++i) {
                sum_launch(c, sum_ctas, s1);
                land_launch(c, land_ctas, s1);
                if (i == 0) CK(cudaEventRecord(started, s1));
            }
        } else {
            const double busy_ms = t_sum + t_land;
            g_duty_gap_us = (int)std::lround(2e3 * busy_ms);
            const int n = (int)std::ceil(comm_ms / (3 * busy_ms)) + 2;
            bg.cycles = n;
            cyc.resize(2 * n);
            for (cudaEvent_t &e : cyc) CK(cudaEventCreate(&e));
            for (int i = 0; i < n; ++i) {
                CK(cudaEventRecord(cyc[2 * i], s1));
                sum_launch(c, sum_ctas, s1);
                land_launch(c, land_ctas, s1);
                CK(cudaEventRecord(cyc[2 * i + 1], s1));
                if (i == 0) CK(cudaEventRecord(started, s1));
                CK(cudaLaunchHostFunc(s1, duty_sleep, nullptr));
            }
        }
        CK(cudaEventRecord(end1, s1));
        CK(cudaEventRecord(end2, s2));
        CK(cudaEventSynchronize(started)); /* the comm loop is under way */
        work();
        cudaError_t q1 = cudaEventQuery(end1), q2 = cudaEventQuery(end2);
        if (q1 != cudaSuccess && q1 != cudaErrorNotReady) CK(q1);
        if (q2 != cudaSuccess && q2 != cudaErrorNotReady) CK(q2);
        /* One stream: s2 is empty and trivially complete; concurrent: both loops must outlast.
         * Duty: the last cycle's end event must still be ahead (end1 follows its gap). */
        if (form == TIDE_DUTY) {
            cudaError_t q = cudaEventQuery(cyc.back());
            if (q != cudaSuccess && q != cudaErrorNotReady) CK(q);
            bg.covered = q == cudaErrorNotReady;
        } else {
            bg.covered =
                q1 == cudaErrorNotReady && (form != TIDE_CONCURRENT || q2 == cudaErrorNotReady);
        }
        CK(cudaStreamSynchronize(s1));
        CK(cudaStreamSynchronize(s2));
        CK(cudaGetLastError());
        bg.comm_ms = comm_ms;
        if (!bg.covered)
            printf("  %-30s %-7s: comm loop of %.0f ms ended before the work; retrying\n", name,
                   ctas, comm_ms);
    }
    if (bg.covered && form == TIDE_DUTY) {
        double busy = 0;
        for (size_t i = 0; i + 1 < cyc.size(); i += 2) {
            bg.busy_s.push_back(event_ms(cyc[0], cyc[i]));
            bg.busy_e.push_back(event_ms(cyc[0], cyc[i + 1]));
            busy += bg.busy_e.back() - bg.busy_s.back();
        }
        const double span = bg.busy_e.back();
        bg.loop_residency = span > 0 ? busy / span : 0;
        if (marks != nullptr)
            for (int i = 0; i < nmarks; ++i) bg.marks.push_back(event_ms(cyc[0], (*marks)[i]));
    }
    for (cudaEvent_t e : cyc) CK(cudaEventDestroy(e));
    CK(cudaEventDestroy(started));
    CK(cudaEventDestroy(end1));
    CK(cudaEventDestroy(end2));
    CK(cudaStreamDestroy(s1));
    CK(cudaStreamDestroy(s2));
    return bg;
}

/* ------------------------------------------------------------------ TIDE-RS on the CUDA fabric */

/*
 * The whole TIDE-RS of an emulated 1 x 8 group (llama3-70b-layer, dim0 / FABRIC_DIVISOR) on
 * the GEMM's GPU: every rank's tide_reduce_scatter, looping.  Beside the sum and landing
 * kernels this runs the fabric's same-device copies (Level-1 pushes, the packing of
 * outboxes), which on one GPU are SM work (batched copy kernels or cudaMemcpyAsync), so these
 * rows include the copies' SM time; on a real node the pushes go to peers over NVSwitch by
 * copy engines and would not take SMs.
 */
#define FABRIC_L 8
#define FABRIC_DIVISOR 8

struct fabric_t {
    int sum_ctas, land_ctas;
    std::vector<tide_comm_t> comms;
    std::vector<tide_group_t> groups;
    std::vector<cudaStream_t> st;
    std::vector<std::vector<void *>> grads;
    std::vector<float *> out;
    uint64_t group_bytes;
};

static void fabric_open(fabric_t *f, int sum_ctas, int land_ctas, int sms) {
    const tide_preset_t *pr = tide_preset_find("llama3-70b-layer");
    if (pr == NULL) {
        fprintf(stderr, "bench_interference: preset llama3-70b-layer missing\n");
        exit(1);
    }
    const int P = pr->num_params;
    std::vector<tide_param_shape_t> shapes(pr->shapes, pr->shapes + P);
    for (auto &sh : shapes) sh.dim0 = (sh.dim0 + FABRIC_DIVISOR - 1) / FABRIC_DIVISOR;
    f->sum_ctas = sum_ctas;
    f->land_ctas = land_ctas;
    f->comms.assign(FABRIC_L, nullptr);
    f->groups.assign(FABRIC_L, nullptr);
    f->st.assign(FABRIC_L, nullptr);
    f->grads.assign(FABRIC_L, std::vector<void *>(P, nullptr));
    f->out.assign(FABRIC_L, nullptr);
    TK(tide_comm_init_all(TIDE_FABRIC_CUDA, 1, FABRIC_L, f->comms.data()));
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = 1;
    cfg.gpus_per_node = FABRIC_L;
    cfg.sum_ctas = sum_ctas;
    cfg.landing_ctas = land_ctas;
    cfg.mode = TIDE_RS_IN_PLACE;
    tide_group_desc_t desc = {P, shapes.data(), TIDE_DTYPE_BF16, TIDE_DTYPE_BF16,
                              TIDE_DTYPE_BF16};
    /* One thread registers every rank: the CUDA fabric's registration never waits. */
    for (int r = 0; r < FABRIC_L; ++r)
        TK(tide_group_register(f->comms[r], &cfg, &desc, &f->groups[r]));
    tide_plan_t plan;
    TK(tide_group_plan(f->groups[0], &plan));
    tide_plan_summary_t sum;
    TK(tide_plan_get_summary(plan, &sum));
    f->group_bytes = sum.group_bytes;
    CK(cudaSetDevice(0));
    for (int r = 0; r < FABRIC_L; ++r) {
        CK(cudaStreamCreateWithFlags(&f->st[r], cudaStreamNonBlocking));
        CK(cudaMalloc(&f->out[r], sum.fp32_shard_bytes));
        CK(cudaMemset(f->out[r], 0, sum.fp32_shard_bytes));
        for (int p = 0; p < P; ++p) {
            const uint64_t n = shapes[p].dim0 * shapes[p].inner;
            CK(cudaMalloc(&f->grads[r][p], n * 2));
            fill_bf16<<<4 * sms, 512>>>((uint16_t *)f->grads[r][p], n, 300 + 17 * r + p, 1.0f);
            CK(cudaGetLastError());
        }
    }
    CK(cudaDeviceSynchronize());
}

static void fabric_close(fabric_t *f) {
    for (int r = 0; r < FABRIC_L; ++r) CK(cudaStreamSynchronize(f->st[r]));
    for (int r = 0; r < FABRIC_L; ++r) TK(tide_group_deregister(f->groups[r]));
    for (int r = 0; r < FABRIC_L; ++r) TK(tide_comm_destroy(f->comms[r]));
    for (int r = 0; r < FABRIC_L; ++r) {
        for (void *p : f->grads[r]) CK(cudaFree(p));
        CK(cudaFree(f->out[r]));
        CK(cudaStreamDestroy(f->st[r]));
    }
}

/* One reduce-scatter of all ranks (the last rank's call enqueues the whole call). */
static void fabric_call(fabric_t *f) {
    for (int r = 0; r < FABRIC_L; ++r)
        TK(tide_reduce_scatter(f->groups[r], (const void *const *)f->grads[r].data(), f->out[r],
                               1.0f / FABRIC_L, 0, TIDE_RS_IN_PLACE, f->st[r]));
}

static void fabric_sync(fabric_t *f) {
    for (int r = 0; r < FABRIC_L; ++r) CK(cudaStreamSynchronize(f->st[r]));
    CK(cudaGetLastError());
}

/* Median ms of one call of all ranks alone, host-timed from an idle GPU to its end. */
static double fabric_alone_ms(fabric_t *f) {
    fabric_call(f);
    fabric_call(f);
    fabric_sync(f);
    std::vector<double> t;
    for (int i = 0; i < 7; ++i) {
        double t0 = now_us();
        fabric_call(f);
        fabric_sync(f);
        t.push_back((now_us() - t0) * 1e-3);
    }
    return median(t);
}

#endif /* TIDE_TESTS_GPU_INTERFERENCE_COMM_CUH_ */
