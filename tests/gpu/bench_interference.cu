/*
 * bench_interference.cu - slowdown of a one-wave GEMM while TIDE-RS's SM kernels run beside
 * it, against spin kernels that hold the same number of CTAs (paper §2.2, Figure 4, Table 5).
 *
 *   bench_interference [--reps N] [--comm-ms T] [--gemm-only]
 *
 * Victim: cuBLAS bf16 GEMM, fp32 accumulate, M x N x K = 256 x 8192 x 8192, written as a
 * PyTorch linear layer (Y[M,N] = X[M,K] W[N,K]^T, the TN layout), random inputs, spot-checked
 * against an fp64 host product.  Every figure is the median of --reps (default 100) GEMMs,
 * each timed with CUDA events on its own non-blocking stream, after 5 warm-ups; beside median,
 * p10 and p90 each row gives the share of reps slower than 1.5x the victim's alone median
 * (">1.5x": reps that ran a second wave; a row whose share is near 50% has an unstable median).
 *
 * Scenarios (each beside the same GEMM loop; docs/interference.md says how to read them):
 *   alone         nothing else runs (measured first and last: the spread is the noise);
 *   tide serial   on one non-blocking stream, Level-1 sums (L = 8 bf16, TIDE_SUM_AUTO, the
 *                 TMA variant on sm_90: ~227 KiB shared memory, one CTA per SM) and landings
 *                 (L = 8 fp32 inbox blocks, accumulate) alternate back to back with the CTA
 *                 budgets sum + land; at most max(sum, land) CTAs are resident at a time;
 *   tide concurr. sums and landings loop on two streams at once: sum + land CTAs resident;
 *   tide duty 1/3 sum -> land, then an idle gap of twice their time alone (a host function
 *                 sleeps on the comm stream, holding no SM): resident about a third of the
 *                 time, as in training (paper §2.2); the row prints the measured residency;
 *   spin full-SM  C CTAs with the sum kernel's shared-memory footprint (one CTA per SM) spin
 *                 on a flag in host-mapped pinned memory for the whole GEMM loop, every CTA
 *                 polling the host flag every SPIN_POLL_NS (the committed baseline rows);
 *   spin 1-warp   the same with 32 threads and no shared memory;
 *   ... relay     the same CTAs, but only CTA 0 polls the host flag (every SPIN_RELAY_POLL_NS)
 *                 and relays the release through device memory;
 *   ... timed     the same CTAs reading no memory at all: each holds for a fixed time by
 *                 %globaltimer, and the row counts only if the spin was still running when
 *                 the last GEMM ended (else it is repeated with a longer hold).  Host-poll,
 *                 relay and timed rows hold the same SMs and differ only in polling, so they
 *                 separate what the polls cost from what the held SMs cost;
 *   tide-RS fabric 1x8
 *                 the whole TIDE-RS of an emulated 1 x 8 group through the CUDA fabric on the
 *                 same GPU (every rank's tide_reduce_scatter, looping), at the same CTA budgets:
 *                 these rows include the same-GPU copies, which run on SMs here.
 * TIDE scenarios run with the comm stream at normal and at the highest stream priority.
 *
 * SM-id probe (paper Table 5): a GEMM-shaped kernel (213 KB shared memory, so one CTA per SM;
 * 384 threads) whose CTAs each busy-work 40 us and record %smid and entry / exit times, run
 * alone and beside the scenarios: its duration and the CTAs that entered after the earliest
 * exit (displaced into a second wave) measure placement and waves apart from cuBLAS.
 *
 * cublasLt section: up to 4 distinct heuristic algorithms for the same GEMM, each printed with
 * its config attributes, checked against the fp64 host product, and timed alone and beside
 * timed, relay and host-poll spins and TIDE's training configuration (rows "ltK: ...").
 *
 * The TIDE kernels run continuously in the back-to-back rows (the comm loop is enqueued for
 * --comm-ms, default 40 ms, and the GEMMs are timed in its middle; a scenario whose comm loop
 * ended before the last GEMM is repeated with twice the work), so those rows bound the
 * slowdown from above; the duty rows are the training-like case.  On one GPU the landing reads
 * local inbox blocks instead of peers' through NVSwitch, and the copy-engine traffic of
 * TIDE-RS (Level-1 pushes) is not part of the kernel rows; the fabric rows run it as
 * same-device copies, which take SMs on one GPU (a real node's copy engines do not), so the
 * gap between the two is the copies' share, an overestimate for a real node.
 *
 * Spin kernels are released by a host store to the mapped flag, then their stream is
 * synchronised; nothing in this program touches the legacy default stream or synchronises the
 * device while a spin kernel runs (that would wait behind it).  Every spin CTA gives up after
 * 10 s of device time (reported as a failure), so the program cannot hang.
 *
 * --gemm-only: the GEMM checks and alone timings (cublasGemmEx and every cublasLt algorithm)
 * and nothing else, e.g. to read the kernels' launch shapes with a profiler.
 *
 * Exit status: 0 when every measurement is valid, 1 on a CUDA or cuBLAS error, a wrong GEMM
 * (any algorithm), no cublasLt algorithm, a spin kernel that timed out or was not resident, a
 * probe launch with a missing record, or a comm loop that never covered the measurement.
 * Meeting the <= 5% target is printed, not part of the exit status.
 */
#include "interference_comm.cuh"
#include "interference_lt.cuh"
#include "interference_probe.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>


static double bf16_to_double(uint16_t v) {
    uint32_t b = (uint32_t)v << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* ------------------------------------------------------------------ the GEMM */

static const int GM = 256, GN = 8192, GK = 8192;

struct gemm_t {
    cublasHandle_t h;
    cudaStream_t st;
    uint16_t *x, *w, *y; /* X[M,K], W[N,K], Y[M,N], row-major bf16 */
    void *workspace;
    std::vector<cudaEvent_t> ev;
    const lt_t *lt;        /* with algo: cublasLtMatmul with that algorithm */
    const lt_algo_t *algo; /* nullptr: cublasGemmEx with CUBLAS_GEMM_DEFAULT */
    int victim;            /* index into g_victims */
};

static void gemm_launch(gemm_t *g) {
    if (g->algo != nullptr) {
        lt_launch(g->lt, *g->algo, g->w, g->x, g->y, g->st);
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    /* Column-major view: Y^T (N x M) = W (N x K) X^T (K x M); W is stored K x N, so op T. */
    CB(cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, GN, GM, GK, &one, g->w, CUDA_R_16BF, GK, g->x,
                    CUDA_R_16BF, GK, &zero, g->y, CUDA_R_16BF, GN, CUBLAS_COMPUTE_32F,
                    CUBLAS_GEMM_DEFAULT));
}

/* Events for `reps` timed GEMMs. */
static void gemm_reserve(gemm_t *g, int reps) {
    while ((int)g->ev.size() < reps + 1) {
        cudaEvent_t e;
        CK(cudaEventCreate(&e));
        g->ev.push_back(e);
    }
}

/* Enqueue warm-ups and reps GEMMs with an event between consecutive ones; returns without
 * waiting (the caller synchronises on the last event). */
static void gemm_enqueue(gemm_t *g, int reps) {
    gemm_reserve(g, reps);
    for (int i = 0; i < 5; ++i) gemm_launch(g);
    for (int i = 0; i < reps; ++i) {
        CK(cudaEventRecord(g->ev[i], g->st));
        gemm_launch(g);
    }
    CK(cudaEventRecord(g->ev[reps], g->st));
}

static std::vector<double> gemm_collect(gemm_t *g, int reps) {
    CK(cudaEventSynchronize(g->ev[reps]));
    std::vector<double> t(reps);
    for (int i = 0; i < reps; ++i) {
        float ms;
        CK(cudaEventElapsedTime(&ms, g->ev[i], g->ev[i + 1]));
        t[i] = ms * 1e3;
    }
    return t;
}

/* fp64 host product at a few (m, n) positions; returns the worst relative error. */
static double gemm_check(gemm_t *g) {
    const int pts = 48;
    std::vector<uint16_t> xrow(GK), wrow(GK);
    uint16_t yv;
    double worst = 0;
    for (int i = 0; i < pts; ++i) {
        int m = (int)((i * 97u + 13) % GM), n = (int)((i * 2654435761u + 7) % GN);
        CK(cudaMemcpy(xrow.data(), g->x + (size_t)m * GK, GK * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(wrow.data(), g->w + (size_t)n * GK, GK * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&yv, g->y + (size_t)m * GN + n, 2, cudaMemcpyDeviceToHost));
        double ref = 0, mag = 0;
        for (int k = 0; k < GK; ++k) {
            double p = bf16_to_double(xrow[k]) * bf16_to_double(wrow[k]);
            ref += p;
            mag += std::fabs(p);
        }
        /* bf16 output rounding (2^-9 relative) dominates; scale by the sum of |products| so a
         * result near zero by cancellation is judged fairly. */
        double got = bf16_to_double(yv);
        if (!std::isfinite(got)) return INFINITY;
        double err = std::fabs(got - ref) / std::max(std::fabs(ref), 1e-3 * mag);
        worst = std::max(worst, err);
    }
    return worst;
}

/* Poison Y, run the current victim once, compare with the host product; prints the verdict. */
static bool gemm_verify(gemm_t *g, const char *label) {
    CK(cudaMemsetAsync(g->y, 0xff, (size_t)GM * GN * 2, g->st)); /* NaN bf16 */
    gemm_launch(g);
    CK(cudaStreamSynchronize(g->st));
    const double err = gemm_check(g);
    printf("%s check: worst relative error %.2e at 48 points vs fp64 host (limit 1e-2): %s\n",
           label, err, err <= 1e-2 ? "ok" : "WRONG");
    return err <= 1e-2;
}

/* ------------------------------------------------------------------ rows */

/* A victim: cublasGemmEx (index 0) or one cublasLt algorithm; rows are judged against its own
 * alone median. */
struct victim_t {
    std::string prefix; /* "" or "ltK: " */
    double alone_us;
};
static std::vector<victim_t> g_victims;

/* A rep slower than this times the victim's alone median ran (part of) a second wave. */
#define SECOND_WAVE_RATIO 1.5

struct row_t {
    std::string scenario, ctas, prio;
    double med_us, p10_us, p90_us, second_pct, mean_us;
    int ok;
    std::string note;
    int victim;
    double residency; /* duty rows: kernel time / loop time; -1 elsewhere */
};
static std::vector<row_t> g_rows;
static int g_fail = 0;

static double mean_of(const std::vector<double> &t) {
    double s = 0;
    for (double v : t) s += v;
    return t.empty() ? 0.0 : s / t.size();
}

static row_t make_row(const gemm_t *g, const std::string &scen, const std::string &ctas,
                      const std::string &prio, const std::vector<double> &t) {
    const double alone = g_victims[g->victim].alone_us;
    int slow = 0;
    for (double v : t) slow += v > SECOND_WAVE_RATIO * alone;
    row_t r{g_victims[g->victim].prefix + scen,
            ctas,
            prio,
            median(t),
            quantile(t, 0.1),
            quantile(t, 0.9),
            t.empty() ? 0.0 : 100.0 * slow / t.size(),
            mean_of(t),
            1,
            "",
            g->victim,
            -1};
    return r;
}

static row_t invalid_row(const gemm_t *g, const std::string &scen, const std::string &ctas,
                         const std::string &prio, const std::string &why) {
    row_t r{g_victims[g->victim].prefix + scen, ctas, prio, 0, 0, 0, 0, 0, 0, why, g->victim, -1};
    return r;
}

static void print_row(const row_t &r) {
    if (!r.ok) {
        printf("  %-30s %-7s %-6s %9s %9s %9s %10s %10s %7s  %s\n", r.scenario.c_str(),
               r.ctas.c_str(), r.prio.c_str(), "-", "-", "-", "-", "-", "-", r.note.c_str());
        return;
    }
    const double base = g_victims[r.victim].alone_us;
    printf("  %-30s %-7s %-6s %9.2f %9.2f %9.2f %+9.1f%% %+9.1f%% %6.0f%%  %s\n",
           r.scenario.c_str(), r.ctas.c_str(), r.prio.c_str(), r.med_us, r.p10_us, r.p90_us,
           base > 0 ? 100.0 * (r.med_us / base - 1.0) : 0.0,
           base > 0 ? 100.0 * (r.mean_us / base - 1.0) : 0.0, r.second_pct, r.note.c_str());
    fflush(stdout);
}

static void push_row(const row_t &r) {
    g_rows.push_back(r);
    print_row(r);
    if (!r.ok) g_fail = 1;
}

static const row_t *find_row(const std::string &scen, const std::string &ctas,
                             const std::string &prio) {
    for (const row_t &r : g_rows)
        if (r.ok && r.scenario == scen && r.ctas == ctas && r.prio == prio) return &r;
    return nullptr;
}

static void print_table_head(void) {
    printf("\n  %-30s %-7s %-6s %9s %9s %9s %10s %10s %7s  %s\n", "scenario", "CTAs", "prio",
           "median", "p10", "p90", "slowdown", "mean", ">1.5x", "note");
    printf("  (slowdown: of the median; mean: of the mean GEMM time, second waves included; "
           "prio: TIDE's stream, gemm-hi: TIDE normal, the GEMM's stream at the highest)\n");
}

/* ------------------------------------------------------------------ GEMM scenarios */

static const char *form_name(tide_form_t f) {
    return f == TIDE_SERIAL ? "tide sum -> land"
           : f == TIDE_CONCURRENT ? "tide sum || land"
                                  : "tide duty 1/3 sum -> land";
}

/* The duty form measures at least this many of its periods (so the share of GEMMs that meet a
 * kernel is not an accident of phase), with at most this many reps. */
#define DUTY_PERIODS 8
#define DUTY_MAX_REPS 4000

/* The duty loop's residency over the GEMM window and the GEMMs that met a kernel, as a note. */
static std::string duty_note(const tide_bg_t &bg, const std::vector<double> &t, int reps,
                             double *residency) {
    const std::vector<double> &m = bg.marks; /* reps + 1 rep boundaries, loop clock */
    const double w0 = m.front(), w1 = m.back();
    double busy = 0;
    for (size_t i = 0; i < bg.busy_s.size(); ++i)
        busy += std::max(0.0, std::min(w1, bg.busy_e[i]) - std::max(w0, bg.busy_s[i]));
    std::vector<double> met, clear;
    for (int j = 0; j < reps; ++j) {
        bool hit = false;
        for (size_t i = 0; i < bg.busy_s.size() && !hit; ++i)
            hit = bg.busy_s[i] < m[j + 1] && bg.busy_e[i] > m[j];
        (hit ? met : clear).push_back(t[j]);
    }
    *residency = bg.loop_residency;
    char note[256];
    snprintf(note, sizeof note,
             "resident %.0f%% of loop, %.0f%% of GEMM window; %zu reps met a kernel (median "
             "%.1f us), %zu clear (%.1f us); %d reps, gap %d us",
             100 * bg.loop_residency, w1 > w0 ? 100 * busy / (w1 - w0) : 0.0, met.size(),
             median(met), clear.size(), median(clear), reps, g_duty_gap_us);
    return note;
}

/* Rows measured with the victim on a stream of the highest priority (gemm_row_tide_gemm_hi). */
static bool g_gemm_high = false;
/* Appended to the CTA column of rows whose kernels run as sliced launches ("/8us"). */
static char g_slice_label[16] = "";

static void gemm_row_tide(gemm_t *g, comm_t *c, int reps, int sum_ctas, int land_ctas,
                          tide_form_t form, int prio, double comm_ms, double t_sum, double t_land) {
    char ctas[32];
    snprintf(ctas, sizeof ctas, "%d+%d%s", sum_ctas, land_ctas, g_slice_label);
    const char *name = form_name(form);
    const char *prio_s = g_gemm_high ? "gemm-hi" : prio ? "high" : "normal";
    if (form == TIDE_DUTY) {
        const double alone_ms = g_victims[g->victim].alone_us * 1e-3;
        const double period = 3 * (t_sum + t_land);
        reps = std::min(DUTY_MAX_REPS,
                        std::max(reps, (int)std::ceil(DUTY_PERIODS * period / alone_ms)));
        /* the loop outlasts the window even if every GEMM ran two waves */
        comm_ms = std::max(comm_ms, 2.0 * (reps + 5) * 2 * alone_ms);
    }
    std::vector<double> t;
    const std::string label = g_victims[g->victim].prefix + name;
    tide_bg_t bg = tide_background(
        c, sum_ctas, land_ctas, form, prio, comm_ms, t_sum, t_land,
        [&] {
            gemm_enqueue(g, reps);
            t = gemm_collect(g, reps);
        },
        &g->ev, reps + 1, label.c_str(), ctas);
    if (!bg.covered) {
        push_row(invalid_row(g, name, ctas, prio_s, "INVALID: comm never covered"));
        return;
    }
    row_t r = make_row(g, name, ctas, prio_s, t);
    if (form == TIDE_DUTY) {
        r.note = duty_note(bg, t, reps, &r.residency);
    } else {
        char note[96];
        snprintf(note, sizeof note, "comm loop %.0f ms%s", bg.comm_ms,
                 form == TIDE_CONCURRENT ? ", both streams" : "");
        r.note = note;
    }
    push_row(r);
}

/*
 * A duty row with the GEMM on a stream of the highest priority and TIDE's at the lowest.  The
 * idea under test: between two GEMMs the block scheduler then dispatches the next GEMM's CTAs
 * before TIDE's pending ones, so TIDE's CTAs take only SMs the GEMM's one wave leaves free
 * (with 128 one-SM CTAs on 132 SMs: 4).  It cannot move a TIDE CTA already resident, and a
 * kernel dispatched while no GEMM is pending may still split a cluster pair.
 */
static void gemm_row_tide_gemm_hi(gemm_t *g, comm_t *c, int reps, int sum_ctas, int land_ctas,
                                  int least, int greatest, double comm_ms, double t_sum,
                                  double t_land) {
    cudaStream_t hi, old = g->st;
    CK(cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, greatest));
    g->st = hi;
    CB(cublasSetStream(g->h, hi));
    g_gemm_high = true;
    gemm_row_tide(g, c, reps, sum_ctas, land_ctas, TIDE_DUTY, least, comm_ms, t_sum, t_land);
    g_gemm_high = false;
    CK(cudaStreamSynchronize(hi));
    g->st = old;
    CB(cublasSetStream(g->h, old));
    CK(cudaStreamDestroy(hi));
}

/* Run work() while `ctas` spin CTAs are resident; returns "" or why the measurement is
 * invalid.  A TIMED spin that ended before work() returned is repeated with a 4x longer hold
 * (three attempts). */
template <class F>
static std::string with_spin(spin_res_t *sr, spin_run_t *s, int ctas, bool full_sm, int mode,
                             double hold_ms, F work) {
    uint64_t hold = mode == SPIN_TIMED ? (uint64_t)(hold_ms * 1e6) : 0;
    for (int attempt = 0; attempt < 3; ++attempt, hold *= 4) {
        spin_start(sr, s, ctas, full_sm, mode, hold);
        if (s->resident == ctas) work();
        const bool covered = mode != SPIN_TIMED || spin_still_running(s);
        spin_stop(sr, s);
        if (s->resident != ctas || s->timed_out)
            return "INVALID: " + std::to_string(s->resident) + "/" + std::to_string(ctas) +
                   " resident, " + std::to_string(s->timed_out) + " timed out";
        if (covered) return "";
        printf("  spin%s %d CTAs: the hold of %.0f ms ended before the work; retrying\n",
               spin_form_name(mode), ctas, hold * 1e-6);
    }
    return "INVALID: the timed spin never covered the work";
}

static std::string spin_name(bool full_sm, int mode) {
    return std::string(full_sm ? "spin full-SM" : "spin 1-warp") + spin_form_name(mode);
}

static void gemm_row_spin(gemm_t *g, spin_res_t *sr, int reps, int ctas, bool full_sm,
                          int mode) {
    spin_run_t s;
    std::vector<double> t;
    /* a TIMED hold: 3x the loop if every GEMM ran two waves, at least 20 ms */
    const double hold_ms =
        std::max(20.0, 3 * 2 * (reps + 5) * g_victims[g->victim].alone_us * 1e-3);
    const std::string why = with_spin(sr, &s, ctas, full_sm, mode, hold_ms, [&] {
        gemm_enqueue(g, reps);
        t = gemm_collect(g, reps);
    });
    const std::string name = spin_name(full_sm, mode), cs = std::to_string(ctas);
    if (!why.empty()) {
        push_row(invalid_row(g, name, cs, "normal", why));
        return;
    }
    row_t r = make_row(g, name, cs, "normal", t);
    char note[160];
    const int on = distinct_count(s.sms);
    if (mode == SPIN_POLL_HOST)
        snprintf(note, sizeof note, "%d threads, %d B smem, on %d SMs, poll every %d ns",
                 s.threads, s.smem, on, SPIN_POLL_NS);
    else if (mode == SPIN_POLL_RELAY)
        snprintf(note, sizeof note,
                 "%d threads, %d B smem, on %d SMs, CTA 0 polls the host every %d ns", s.threads,
                 s.smem, on, SPIN_RELAY_POLL_NS);
    else
        snprintf(note, sizeof note, "%d threads, %d B smem, on %d SMs, no polling, held %.0f ms",
                 s.threads, s.smem, on, s.hold_ns * 1e-6);
    r.note = note;
    push_row(r);
}

/* The fabric's RS loop beside the GEMMs. */
static void gemm_row_fabric(gemm_t *g, fabric_t *f, int reps, double comm_ms, double t_call) {
    cudaEvent_t started;
    std::vector<cudaEvent_t> end(FABRIC_L);
    CK(cudaEventCreateWithFlags(&started, cudaEventDisableTiming));
    for (auto &e : end) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    char ctas[32];
    snprintf(ctas, sizeof ctas, "%d+%d+cp", f->sum_ctas, f->land_ctas);
    const char *name = "tide-RS fabric 1x8";
    int covered = 0;
    for (int attempt = 0; attempt < 3 && !covered; ++attempt, comm_ms *= 2) {
        const int n = std::min(4000, (int)std::ceil(comm_ms / t_call) + 2), mid = n / 2;
        /* The GEMMs are enqueued halfway through the loop's enqueue, once it is under way: a
         * call whose host enqueue takes about as long as its GPU work never runs far ahead of
         * the host, so GEMMs enqueued after the whole loop would find it nearly done. */
        for (int i = 0; i < n; ++i) {
            fabric_call(f);
            if (i == 1) CK(cudaEventRecord(started, f->st[0]));
            if (i == std::max(mid, 2)) {
                CK(cudaEventSynchronize(started));
                gemm_enqueue(g, reps);
            }
        }
        for (int r = 0; r < FABRIC_L; ++r) CK(cudaEventRecord(end[r], f->st[r]));
        std::vector<double> t = gemm_collect(g, reps);
        covered = 1;
        for (int r = 0; r < FABRIC_L; ++r) {
            cudaError_t q = cudaEventQuery(end[r]);
            if (q != cudaSuccess && q != cudaErrorNotReady) CK(q);
            covered &= q == cudaErrorNotReady;
        }
        fabric_sync(f);
        if (covered) {
            row_t r = make_row(g, name, ctas, "normal", t);
            char note[128];
            snprintf(note, sizeof note,
                     "INCLUDES same-GPU copies on SMs; %d calls, loop %.0f ms, GEMMs from call %d",
                     n, comm_ms, std::max(mid, 2) + 1);
            r.note = note;
            push_row(r);
        } else {
            printf("  %-30s %-7s: RS loop of %.0f ms ended before the GEMMs; retrying\n", name,
                   ctas, comm_ms);
        }
    }
    if (!covered) push_row(invalid_row(g, name, ctas, "normal", "INVALID: RS loop never covered"));
    CK(cudaEventDestroy(started));
    for (auto &e : end) CK(cudaEventDestroy(e));
}

/* ------------------------------------------------------------------ SM-id probe */

#define PROBE_REPS 40

struct probe_ctx_t {
    probe_rec_t *rec; /* PROBE_REPS launches of each shape */
    float *sink;
    cudaStream_t st;
    std::vector<probe_shape_t> shapes;
    std::vector<probe_rec_t> host;
};

struct probe_row_t {
    std::string scenario, ctas;
    std::vector<probe_stat_t> st;
    int ok;
    std::string note;
};
static std::vector<probe_row_t> g_probe_rows;
static int g_probe_grid_all = 0; /* the one-CTA-per-SM shape's grid */

static void probe_ctx_open(probe_ctx_t *p, int sms, int optin) {
    probe_open(optin);
    /* the GEMM's 128 CTAs single, in clusters of 2 (cuBLAS's default kernel on an H200,
     * docs/interference.md) and of 4 (the paper's), and one CTA per SM; print_summary reads
     * shapes 0, 1 and the last */
    g_probe_grid_all = std::min(sms, PROBE_MAX_CTAS);
    p->shapes = {{128, 1}, {128, 2}, {128, 4}, {g_probe_grid_all, 1}};
    CK(cudaMalloc(&p->rec, p->shapes.size() * PROBE_REPS * PROBE_MAX_CTAS * sizeof(probe_rec_t)));
    CK(cudaMalloc(&p->sink, sizeof(float)));
    CK(cudaStreamCreateWithFlags(&p->st, cudaStreamNonBlocking));
}

static void probe_ctx_close(probe_ctx_t *p) {
    CK(cudaFree(p->rec));
    CK(cudaFree(p->sink));
    CK(cudaStreamDestroy(p->st));
}

static void print_probe_head(const probe_ctx_t *p) {
    printf("\n  %-30s %-7s", "scenario", "CTAs");
    for (const probe_shape_t &s : p->shapes) {
        char h[32];
        snprintf(h, sizeof h, "%d CTAs/cl %d", s.grid, s.cluster);
        printf(" | %-20s", h);
    }
    printf(" | note\n  %-30s %-7s", "", "");
    for (size_t i = 0; i < p->shapes.size(); ++i) printf(" | %7s %5s %5s", "us", "disp", "win%");
    printf(" |\n");
}

static void push_probe_row(const probe_row_t &r) {
    g_probe_rows.push_back(r);
    printf("  %-30s %-7s", r.scenario.c_str(), r.ctas.c_str());
    for (const probe_stat_t &s : r.st)
        printf(" | %7.1f %5.0f %4.0f%%", s.dur_us, s.displaced, s.windows_pct);
    printf(" | %s\n", r.note.c_str());
    fflush(stdout);
    if (!r.ok) g_fail = 1;
}

/* The probe's own launches must all have recorded themselves. */
static probe_row_t probe_row(probe_ctx_t *p, const std::string &scen, const std::string &ctas,
                             const std::set<int> &blocked) {
    probe_row_t r{scen, ctas, probe_reduce(p->host, p->shapes, PROBE_REPS, blocked), 1, ""};
    for (const probe_stat_t &s : r.st) r.ok &= s.ok;
    if (!r.ok) r.note = "INVALID: a probe CTA left no record; ";
    return r;
}

static void probe_run(probe_ctx_t *p) {
    probe_enqueue(p->rec, p->shapes, PROBE_REPS, p->st, p->sink);
    probe_fetch(p->rec, p->shapes.size(), PROBE_REPS, p->st, &p->host);
}

static void probe_row_alone(probe_ctx_t *p) {
    probe_run(p);
    probe_row_t r = probe_row(p, "alone", "0", {});
    r.note += "max displaced per shape:";
    for (const probe_stat_t &s : r.st) r.note += " " + std::to_string(s.max_displaced);
    push_probe_row(r);
}

static void probe_row_spin(probe_ctx_t *p, spin_res_t *sr, int ctas, bool full_sm, int mode) {
    spin_run_t s;
    const std::string why = with_spin(sr, &s, ctas, full_sm, mode, 50.0, [&] { probe_run(p); });
    std::string name = spin_name(full_sm, mode);
    if (mode == SPIN_POLL_HOST) name += " host-poll";
    const std::string cs = std::to_string(ctas);
    if (!why.empty()) {
        push_probe_row({name, cs, std::vector<probe_stat_t>(p->shapes.size()), 0, why});
        return;
    }
    probe_row_t r = probe_row(p, name, cs, std::set<int>(s.sms.begin(), s.sms.end()));
    int shared = 0;
    for (const probe_stat_t &st : r.st) shared = std::max(shared, st.max_on_blocked);
    r.note += "probe CTAs on a spin CTA's SM: max " + std::to_string(shared);
    push_probe_row(r);
}

static void probe_row_tide(probe_ctx_t *p, comm_t *c, int sum_ctas, int land_ctas,
                           tide_form_t form, double comm_ms, double t_sum, double t_land) {
    char ctas[32];
    snprintf(ctas, sizeof ctas, "%d+%d", sum_ctas, land_ctas);
    tide_bg_t bg = tide_background(c, sum_ctas, land_ctas, form, 0, comm_ms, t_sum, t_land,
                                   [&] { probe_run(p); }, nullptr, 0, form_name(form), ctas);
    if (!bg.covered) {
        probe_row_t r{form_name(form), ctas, std::vector<probe_stat_t>(p->shapes.size()), 0,
                      "INVALID: comm never covered"};
        push_probe_row(r);
        return;
    }
    probe_row_t r = probe_row(p, form_name(form), ctas, {});
    char note[96];
    snprintf(note, sizeof note, "comm loop %.0f ms", bg.comm_ms);
    if (form == TIDE_DUTY)
        snprintf(note, sizeof note, "comm loop %.0f ms, resident %.0f%% of it", bg.comm_ms,
                 100 * bg.loop_residency);
    r.note += note;
    push_probe_row(r);
}

static void probe_section(probe_ctx_t *p, spin_res_t *sr, comm_t *c, double comm_ms,
                          double t_sum16, double t_sum4, double t_land) {
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, probe_kernel));
    printf("\n# SM-id probe (paper Table 5): CTAs of %d threads, %d registers per thread, %d B "
           "dynamic shared memory\n# (one per SM), each busy %.0f us by %%globaltimer, recording "
           "%%smid and entry / exit; %d launches per shape.\n",
           PROBE_THREADS, fa.numRegs, PROBE_SMEM, PROBE_WORK_NS * 1e-3, PROBE_REPS);
    printf("# clusters that fit at once on the idle GPU (occupancy API):");
    for (const probe_shape_t &s : p->shapes)
        printf(" %d CTAs/cl %d: %d;", s.grid, s.cluster, probe_max_clusters(s));
    printf("\n# per shape: median duration (us), median CTAs displaced into a second wave "
           "(entered after the\n# earliest exit), %% of launches with any displaced CTA. With "
           "one CTA per SM, the %d-CTA shape's\n# 'disp' counts the SMs the scenario holds.\n",
           p->shapes.back().grid);
    print_probe_head(p);
    probe_row_alone(p);
    for (int ctas : {4, 8, 16, 20, 32}) probe_row_spin(p, sr, ctas, true, SPIN_TIMED);
    probe_row_spin(p, sr, 16, true, SPIN_POLL_HOST);
    probe_row_spin(p, sr, 16, true, SPIN_POLL_RELAY);
    probe_row_spin(p, sr, 16, false, SPIN_TIMED);
    probe_row_tide(p, c, 16, 4, TIDE_SERIAL, comm_ms, t_sum16, t_land);
    probe_row_tide(p, c, 4, 4, TIDE_SERIAL, comm_ms, t_sum4, t_land);
    probe_row_tide(p, c, 16, 4, TIDE_DUTY, comm_ms, t_sum16, t_land);
}

/* ------------------------------------------------------------------ cublasLt algorithms */

/* Victim index of cublasLt algorithm k (lt_alone appends them after cublasGemmEx's). */
static int lt_victim(size_t k) {
    return (int)k + 1;
}

/* Check every algorithm and time it alone; returns the algorithms that passed (the failed ones
 * become INVALID rows and fail the run). */
static std::vector<int> lt_alone(gemm_t *g, const std::vector<lt_algo_t> &algos, int reps) {
    std::vector<int> good;
    for (size_t k = 0; k < algos.size(); ++k) {
        g->algo = &algos[k];
        g->victim = lt_victim(k);
        if ((int)g_victims.size() != lt_victim(k)) {
            fprintf(stderr, "bench_interference: cublasLt victims out of order\n");
            exit(1);
        }
        g_victims.push_back({"lt" + std::to_string(k + 1) + ": ", 0});
        const std::string label = "lt" + std::to_string(k + 1);
        if (!gemm_verify(g, label.c_str())) {
            push_row(invalid_row(g, "alone", "0", "-", "INVALID: wrong result"));
            continue;
        }
        gemm_enqueue(g, reps);
        const std::vector<double> t = gemm_collect(g, reps);
        g_victims.back().alone_us = median(t);
        push_row(make_row(g, "alone", "0", "-", t));
        good.push_back((int)k);
    }
    g->algo = nullptr;
    g->victim = 0;
    return good;
}

static void lt_print_algos(const lt_t *lt, const std::vector<lt_algo_t> &algos) {
    printf("\n# cublasLt: the same GEMM (bf16 in / out, fp32 compute, TN) with explicit "
           "heuristic algorithms\n# ('default' = cublasLt's ranking, whose first choice "
           "cublasGemmEx normally runs; 'no-reduction' =\n# the ranking with split-K reductions "
           "excluded). Rows 'ltK: ...' are judged against ltK's own alone median.\n");
    for (size_t k = 0; k < algos.size(); ++k)
        printf("lt%zu [%s]: %s\n", k + 1, algos[k].origin.c_str(),
               lt_describe(lt, algos[k]).c_str());
}

static void lt_section(gemm_t *g, const std::vector<lt_algo_t> &algos, spin_res_t *sr,
                       comm_t *c, int reps, double comm_ms, double t_sum16, double t_land) {
    print_table_head();
    const std::vector<int> good = lt_alone(g, algos, reps);
    for (int k : good) {
        g->algo = &algos[k];
        g->victim = lt_victim(k);
        gemm_row_spin(g, sr, reps, 4, true, SPIN_TIMED);
        gemm_row_spin(g, sr, reps, 16, true, SPIN_TIMED);
        gemm_row_spin(g, sr, reps, 16, true, SPIN_POLL_RELAY);
        gemm_row_spin(g, sr, reps, 16, true, SPIN_POLL_HOST);
        gemm_row_tide(g, c, reps, 16, 4, TIDE_SERIAL, 0, comm_ms, t_sum16, t_land);
        gemm_row_tide(g, c, reps, 16, 4, TIDE_DUTY, 0, comm_ms, t_sum16, t_land);
    }
    g->algo = nullptr;
    g->victim = 0;
}

/* ------------------------------------------------------------------ summary */

static double slowdown_pct(const row_t &r, double base0) {
    const double base = r.victim == 0 ? base0 : g_victims[r.victim].alone_us;
    return 100.0 * (r.med_us / base - 1.0);
}

static std::string pct_of(const std::string &scen, const std::string &ctas,
                          const std::string &prio, double base0) {
    const row_t *r = find_row(scen, ctas, prio);
    if (r == nullptr) return "n/a";
    char b[32];
    snprintf(b, sizeof b, "%+.1f%%", slowdown_pct(*r, base0));
    return b;
}

static void print_summary(double base, const std::vector<lt_algo_t> &algos) {
    /* The paper's target: TIDE's training configuration (16 sum + 4 landing CTAs) <= 5%. */
    for (const row_t &r : g_rows) {
        if (r.ctas != "16+4" || !r.ok) continue;
        /* The median of a bimodal row flips with its second-wave share near 50%: print both. */
        const double s = slowdown_pct(r, base);
        char extra[128];
        const double base_r = r.victim == 0 ? base : g_victims[r.victim].alone_us;
        snprintf(extra, sizeof extra, " (mean %+.1f%%, %.0f%% of reps > 1.5x alone",
                 100.0 * (r.mean_us / base_r - 1.0), r.second_pct);
        if (r.residency >= 0)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                     "; kernels resident %.0f%% of the loop", 100 * r.residency);
        printf("target <= 5%% (training config 16+4, %s, %s prio): %+.1f%% %s%s)\n",
               r.scenario.c_str(), r.prio.c_str(), s, s <= 5.0 ? "MET" : "NOT MET", extra);
    }
    /* The mean counts the second waves the median hides: <= 3% is the bar for the duty rows
     * (training-like residency), at every CTA budget and priority measured. */
    for (const row_t &r : g_rows) {
        if (!r.ok || r.residency < 0) continue;
        const double base_r = r.victim == 0 ? base : g_victims[r.victim].alone_us;
        const double mean = 100.0 * (r.mean_us / base_r - 1.0);
        printf("mean target <= 3%% (%s, %s, %s prio): mean %+.1f%% %s (median %+.1f%%, %.0f%% "
               "of reps > 1.5x alone; kernels resident %.0f%% of the loop)\n",
               r.scenario.c_str(), r.ctas.c_str(), r.prio.c_str(), mean,
               mean <= 3.0 ? "MET" : "NOT MET", slowdown_pct(r, base), r.second_pct,
               100 * r.residency);
    }
    for (const row_t &r : g_rows) {
        if (r.ctas != "16+4+cp" || !r.ok) continue;
        printf("training config 16+4 with the same-GPU copies on SMs (%s): %+.1f%% (not the\n"
               "# <= 5%% target's setting: on a real node the pushes take no SMs)\n",
               r.scenario.c_str(), slowdown_pct(r, base));
    }
    printf("# spin rows hold their CTAs for the whole GEMM loop (paper Figure 4 lines); the\n"
           "# full-SM spin has the sum kernel's shared-memory footprint, so each CTA takes an SM.\n"
           "# A spin CTA sleeps %d ns between two polls of its host-mapped release flag; in the\n"
           "# relay rows only CTA 0 polls the host, every %d ns; timed rows poll nothing.\n",
           SPIN_POLL_NS, SPIN_RELAY_POLL_NS);
    /* The same CTAs held, only the polling differs: what the polls cost, apart from the SMs. */
    for (int ctas : {4, 8, 16, 20, 32}) {
        const std::string cs = std::to_string(ctas);
        printf("spin %2d CTAs: full-SM host-poll %s, relay %s, timed %s; 1-warp host-poll %s, "
               "relay %s, timed %s\n",
               ctas, pct_of("spin full-SM", cs, "normal", base).c_str(),
               pct_of("spin full-SM relay", cs, "normal", base).c_str(),
               pct_of("spin full-SM timed", cs, "normal", base).c_str(),
               pct_of("spin 1-warp", cs, "normal", base).c_str(),
               pct_of("spin 1-warp relay", cs, "normal", base).c_str(),
               pct_of("spin 1-warp timed", cs, "normal", base).c_str());
    }
    /* Beyond the two-wave bound, held SMs alone cannot explain a row. */
    for (int mode : {SPIN_POLL_HOST, SPIN_POLL_RELAY, SPIN_TIMED}) {
        int n = 0, beyond = 0;
        for (bool full : {true, false})
            for (const row_t &r : g_rows) {
                if (!r.ok || r.victim != 0 || r.scenario != spin_name(full, mode)) continue;
                ++n;
                beyond += slowdown_pct(r, base) > 100.0;
            }
        printf("two-wave bound (+100%%): exceeded by %d of %d spin%s rows\n", beyond, n,
               mode == SPIN_POLL_HOST ? " host-poll" : spin_form_name(mode));
    }
    printf("Figure 4 analogue (timed spin, full-SM single CTAs): 8 CTAs %s, 20 CTAs %s (paper, "
           "B200 and a 4-CTA-cluster GEMM: +66%%, +271%%)\n",
           pct_of("spin full-SM timed", "8", "normal", base).c_str(),
           pct_of("spin full-SM timed", "20", "normal", base).c_str());
    for (const probe_row_t &r : g_probe_rows) {
        if (!r.ok || r.st.empty()) continue;
        printf("probe %-25s %-5s: 128 CTAs: %g displaced (cluster 1) in %.0f%% of launches, "
               "%g (cluster 2) in %.0f%%; %d-CTA probe: %g displaced\n",
               r.scenario.c_str(), r.ctas.c_str(), r.st[0].displaced, r.st[0].windows_pct,
               r.st[1].displaced, r.st[1].windows_pct, g_probe_grid_all,
               r.st.back().displaced);
    }
    for (size_t k = 0; k < algos.size(); ++k) {
        const std::string p = "lt" + std::to_string(k + 1) + ": ";
        const row_t *a = find_row(p + "alone", "0", "-");
        int tm = 0, tn = 0;
        std::string tile = lt_tile_shape(algos[k].tile, &tm, &tn)
                               ? std::to_string(tm) + "x" + std::to_string(tn)
                               : "#" + std::to_string(algos[k].tile);
        char alone[32] = "n/a";
        if (a != nullptr) snprintf(alone, sizeof alone, "%.2f", a->med_us);
        printf("lt%zu (tile %s, split-K %ld, %s reduction, cluster %s): alone %s us; timed spin "
               "4 %s, 16 %s; relay spin 16 %s; host-poll spin 16 %s; tide 16+4 %s, duty 1/3 %s\n",
               k + 1, tile.c_str(), algos[k].splitk,
               lt_reduction_name(algos[k].reduction).c_str(),
               lt_cluster_name(algos[k].cluster).c_str(), alone,
               pct_of(p + "spin full-SM timed", "4", "normal", base).c_str(),
               pct_of(p + "spin full-SM timed", "16", "normal", base).c_str(),
               pct_of(p + "spin full-SM relay", "16", "normal", base).c_str(),
               pct_of(p + "spin full-SM", "16", "normal", base).c_str(),
               pct_of(p + form_name(TIDE_SERIAL), "16+4", "normal", base).c_str(),
               pct_of(p + form_name(TIDE_DUTY), "16+4", "normal", base).c_str());
    }
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    int reps = 100;
    double comm_ms = 40;
    bool gemm_only = false;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--comm-ms") && i + 1 < argc) comm_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--gemm-only")) gemm_only = true;
        else {
            fprintf(stderr, "usage: bench_interference [--reps N (>= 50)] [--comm-ms T] "
                            "[--gemm-only]\n");
            return 2;
        }
    }
    if (reps < 50 || comm_ms <= 0) {
        fprintf(stderr, "bench_interference: --reps must be >= 50, --comm-ms > 0\n");
        return 2;
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);
    /* The emulated fabric group places rank r on visible device r mod D: it must share the
     * GEMM's GPU, so unless the caller chose devices, only the first one is visible. */
    if (getenv("CUDA_VISIBLE_DEVICES") == nullptr) setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    int devices = 0;
    CK(cudaGetDeviceCount(&devices));
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int least = 0, greatest = 0, cublas_ver = 0;
    CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    const int sms = prop.multiProcessorCount;
    const int smem_optin = (int)prop.sharedMemPerBlockOptin;

    gemm_t g;
    g.lt = nullptr;
    g.algo = nullptr;
    g.victim = 0;
    g_victims.push_back({"", 0});
    CB(cublasCreate(&g.h));
    CB(cublasGetVersion(g.h, &cublas_ver));
    CK(cudaStreamCreateWithFlags(&g.st, cudaStreamNonBlocking));
    CB(cublasSetStream(g.h, g.st));
    /* A fixed workspace: no allocation can happen inside cuBLAS while a spin kernel runs. */
    const size_t ws_bytes = 64ull << 20;
    CK(cudaMalloc(&g.workspace, ws_bytes));
    CB(cublasSetWorkspace(g.h, g.workspace, ws_bytes));
    CK(cudaMalloc(&g.x, (size_t)GM * GK * 2));
    CK(cudaMalloc(&g.w, (size_t)GN * GK * 2));
    CK(cudaMalloc(&g.y, (size_t)GM * GN * 2));
    fill_bf16<<<4 * sms, 512>>>(g.x, (uint64_t)GM * GK, 1, 1.0f);
    fill_bf16<<<4 * sms, 512>>>(g.w, (uint64_t)GN * GK, 2, 1.0f / 64);
    CK(cudaGetLastError());
    CK(cudaMemset(g.y, 0xff, (size_t)GM * GN * 2)); /* poison: NaN bf16 */
    CK(cudaDeviceSynchronize());
    gemm_reserve(&g, reps);
    /* cublasLt: its own workspace, the same operands and stream. */
    lt_t lt;
    lt_open(&lt, GN, GM, GK, ws_bytes);
    g.lt = &lt;
    const std::vector<lt_algo_t> algos = lt_pick(&lt, 4);

    printf("# bench_interference: %s, %d SMs, smem opt-in %d B, cuBLAS %d, stream priorities "
           "%d (normal) .. %d (high)\n",
           prop.name, sms, smem_optin, cublas_ver, least, greatest);
    printf("# victim: cuBLAS GemmEx bf16 -> bf16, fp32 accumulate, M x N x K = %d x %d x %d "
           "(Y = X W^T), median of %d reps after 5 warm-ups\n",
           GM, GN, GK, reps);
    printf("# 'tide sum' rows: only TIDE-RS's SM kernels (Level-1 sum, landing) run beside the\n"
           "# GEMM; the copy traffic of TIDE's Level-1 pushes is NOT part of them. The landing\n"
           "# reads local blocks (peers' inboxes over NVSwitch in a real node).\n"
           "# 'tide-RS fabric 1x8' rows: the whole TIDE-RS of an emulated 1x8 group (llama3-70b-\n"
           "# layer, dim0/%d) through the CUDA fabric on this GPU, so they INCLUDE the same-GPU\n"
           "# copies, which run on SMs here (copy engines and NVSwitch on a real node): their\n"
           "# difference from the kernel rows is the copies' share of the slowdown.\n"
           "# TIDE work loops continuously (in training it is resident ~1/3 of a reduce-scatter),\n"
           "# so these are upper bounds; 'tide duty 1/3' rows idle twice the kernels' time\n"
           "# between cycles (no SM held) and print the residency they reached. Spin CTAs poll\n"
           "# their release flag every %d ns ('relay' rows: only CTA 0, every %d ns; 'timed'\n"
           "# rows poll nothing and hold for a fixed time that must outlast the GEMMs).\n"
           "# '>1.5x': share of reps slower than 1.5x the victim's alone median (second waves).\n",
           FABRIC_DIVISOR, SPIN_POLL_NS, SPIN_RELAY_POLL_NS);

    if (!gemm_verify(&g, "gemm")) return 1;

    /* Alone, first. */
    gemm_enqueue(&g, reps);
    std::vector<double> alone1 = gemm_collect(&g, reps);
    const double base1 = median(alone1);
    g_victims[0].alone_us = base1;
    const double tflops = 2.0 * GM * GN * GK / (base1 * 1e-6) / 1e12;
    printf("gemm alone: median %.2f us (%.0f TFLOP/s); two waves would take about %.0f us\n",
           base1, tflops, 2 * base1);
    if (algos.empty()) {
        printf("cublasLt: no algorithm for this GEMM: FAILED\n");
        g_fail = 1;
    }

    if (gemm_only) {
        lt_print_algos(&lt, algos);
        print_table_head();
        push_row(make_row(&g, "alone (first)", "0", "-", alone1));
        lt_alone(&g, algos, reps);
        lt_close(&lt);
        if (g_fail) printf("bench_interference: FAILED (invalid measurements above)\n");
        return g_fail;
    }

    comm_t c;
    comm_init(&c, sms);
    cudaStream_t cal;
    CK(cudaStreamCreateWithFlags(&cal, cudaStreamNonBlocking));
    const int budgets[2][2] = {{16, 4}, {4, 4}};
    double t_sum[2], t_land;
    for (int i = 0; i < 2; ++i) {
        t_sum[i] = time_alone_ms([&] { sum_launch(&c, budgets[i][0], cal); }, cal);
        printf("tide sum alone: L=8 bf16, %llu Mi elements, %2d CTAs: %.3f ms (%.0f GB/s)\n",
               (unsigned long long)(c.sum_elems >> 20), budgets[i][0], t_sum[i],
               c.sum_elems * 20.0 / (t_sum[i] * 1e-3) / 1e9);
    }
    t_land = time_alone_ms([&] { land_launch(&c, 4, cal); }, cal);
    printf("tide landing alone: L=8 fp32 accumulate, %llu Mi elements, 4 CTAs: %.3f ms "
           "(%.0f GB/s)\n",
           (unsigned long long)(c.land_elems >> 20), t_land,
           c.land_elems * 40.0 / (t_land * 1e-3) / 1e9);
    /* Two CTAs: each holds at most one cluster slot, and the GEMM's one wave leaves two of
     * them free (66 slots, 64 needed), so 2 + 2 back to back can never displace it. */
    const double t_sum2 = time_alone_ms([&] { sum_launch(&c, 2, cal); }, cal);
    const double t_land2 = time_alone_ms([&] { land_launch(&c, 2, cal); }, cal);
    printf("tide sum / landing alone at 2 CTAs: %.3f / %.3f ms (sum %.0f GB/s)\n", t_sum2,
           t_land2, c.sum_elems * 20.0 / (t_sum2 * 1e-3) / 1e9);
    CK(cudaStreamDestroy(cal));

    print_table_head();
    push_row(make_row(&g, "alone (first)", "0", "-", alone1));

    for (int i = 0; i < 2; ++i)
        for (int conc = 0; conc < 2; ++conc)
            for (int prio : {least, greatest})
                gemm_row_tide(&g, &c, reps, budgets[i][0], budgets[i][1],
                              conc ? TIDE_CONCURRENT : TIDE_SERIAL, prio, comm_ms, t_sum[i],
                              t_land);
    /* Training-like residency: the same cycles with idle gaps. */
    gemm_row_tide(&g, &c, reps, 16, 4, TIDE_DUTY, least, comm_ms, t_sum[0], t_land);
    gemm_row_tide(&g, &c, reps, 16, 4, TIDE_DUTY, greatest, comm_ms, t_sum[0], t_land);
    gemm_row_tide(&g, &c, reps, 4, 4, TIDE_DUTY, least, comm_ms, t_sum[1], t_land);
    /* Sizing the transient CTAs: at most the cluster slots the GEMM leaves free. */
    gemm_row_tide(&g, &c, reps, 2, 2, TIDE_DUTY, least, comm_ms, t_sum2, t_land2);
    /* Timing the transient CTAs: the GEMM's CTAs first whenever both wait for SMs. */
    gemm_row_tide_gemm_hi(&g, &c, reps, 16, 4, least, greatest, comm_ms, t_sum[0], t_land);
    gemm_row_tide_gemm_hi(&g, &c, reps, 4, 4, least, greatest, comm_ms, t_sum[1], t_land);
    /* Timing them by slicing: every sum and landing of the 16 + 4 duty cycle as launches of
     * about `us` each (tide_cuda_sum_sliced), so a GEMM that waits for SMs gets them when the
     * running slice ends instead of when the whole kernel does.  The sliced kernels' own time
     * alone is printed against one launch's (what slicing costs the collective). */
    {
        cudaStream_t cs;
        CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
        for (int us : {16, 8, 4}) {
            g_sum_slices = std::max(1, (int)std::lround(t_sum[0] * 1e3 / us));
            g_land_slices = std::max(1, (int)std::lround(t_land * 1e3 / us));
            const double ts = time_alone_ms([&] { sum_launch(&c, 16, cs); }, cs);
            const double tl = time_alone_ms([&] { land_launch(&c, 4, cs); }, cs);
            printf("tide sliced ~%d us: sum 16 CTAs in %d launches %.3f ms (one launch %.3f), "
                   "landing 4 CTAs in about %d launches %.3f ms (one launch %.3f)\n",
                   us, g_sum_launches, ts, t_sum[0], g_land_slices, tl, t_land);
            snprintf(g_slice_label, sizeof g_slice_label, "/%dus", us);
            gemm_row_tide(&g, &c, reps, 16, 4, TIDE_DUTY, least, comm_ms, ts, tl);
            gemm_row_tide_gemm_hi(&g, &c, reps, 16, 4, least, greatest, comm_ms, ts, tl);
        }
        g_sum_slices = g_land_slices = 1;
        g_slice_label[0] = '\0';
        /* What a slice costs beyond its share of the work, against the segment count of the
         * table (the same 16 Mi elements as 4, 16 or 64 segments): every launch's CTAs walk
         * the whole segment table. */
        tide_sum_seg_t *saved = c.sum_segs;
        const int saved_n = c.num_sum_segs;
        const tide_sum_seg_t *saved_host = c.sum_segs_host;
        for (int nseg : {4, 16, 64}) {
            const uint64_t len = c.sum_elems / (uint64_t)nseg, per_own = c.sum_elems / 4;
            std::vector<tide_sum_seg_t> hs(nseg);
            for (int i = 0; i < nseg; ++i) {
                const uint64_t e = (uint64_t)i * len;
                hs[i] = {e, e, e % per_own, (uint32_t)len, (uint32_t)len, (int32_t)(e / per_own), 0};
            }
            tide_sum_seg_t *d = nullptr;
            CK(cudaMalloc(&d, hs.size() * sizeof hs[0]));
            CK(cudaMemcpy(d, hs.data(), hs.size() * sizeof hs[0], cudaMemcpyHostToDevice));
            c.sum_segs = d, c.num_sum_segs = nseg, c.sum_segs_host = hs.data();
            double t[2];
            int launches[2];
            const int ks[2] = {1, 27};
            for (int j = 0; j < 2; ++j) {
                g_sum_slices = ks[j];
                t[j] = time_alone_ms([&] { sum_launch(&c, 16, cs); }, cs);
                launches[j] = g_sum_launches;
            }
            printf("tide sliced sum, %d segments of %llu Ki elements, 16 CTAs: one launch %.3f ms, "
                   "%d launches at 1/27 of the bytes each %.3f ms: %.1f us per extra launch\n",
                   nseg, (unsigned long long)(len >> 10), t[0], launches[1], t[1],
                   launches[1] > 1 ? (t[1] - t[0]) * 1e3 / (launches[1] - 1) : 0.0);
            CK(cudaFree(d));
        }
        /* The same 27 launches, each over a contiguous 1/27 of the elements (its own segment
         * table) instead of every 27th round of chunks: locality against interleaving. */
        {
            const int K = 27;
            const uint64_t per_own = c.sum_elems / 4;
            std::vector<tide_sum_seg_t> hs;
            std::vector<int> first(K + 1);
            for (int i = 0; i < K; ++i) {
                first[i] = (int)hs.size();
                uint64_t a = c.sum_elems * i / K / 16 * 16, b = c.sum_elems * (i + 1) / K / 16 * 16;
                if (i == K - 1) b = c.sum_elems;
                while (a < b) {
                    const uint64_t end = std::min(b, (a / per_own + 1) * per_own);
                    hs.push_back({a, a, a % per_own, (uint32_t)(end - a), (uint32_t)(end - a),
                                  (int32_t)(a / per_own), 0});
                    a = end;
                }
            }
            first[K] = (int)hs.size();
            tide_sum_seg_t *d = nullptr;
            CK(cudaMalloc(&d, hs.size() * sizeof hs[0]));
            CK(cudaMemcpy(d, hs.data(), hs.size() * sizeof hs[0], cudaMemcpyHostToDevice));
            g_sum_slices = 1;
            const double t = time_alone_ms(
                [&] {
                    for (int i = 0; i < K; ++i) {
                        c.sum_segs = d + first[i], c.num_sum_segs = first[i + 1] - first[i];
                        c.sum_segs_host = hs.data() + first[i];
                        sum_launch(&c, 16, cs);
                    }
                },
                cs);
            printf("tide sum as 27 launches over contiguous ranges, 16 CTAs: %.3f ms\n", t);
            CK(cudaFree(d));
        }
        c.sum_segs = saved, c.num_sum_segs = saved_n, c.sum_segs_host = saved_host;
        g_sum_slices = 1;
        CK(cudaStreamDestroy(cs));
    }

    /* The whole TIDE-RS through the CUDA fabric, copies included. */
    if (devices != 1) {
        printf("  tide-RS fabric 1x8: SKIPPED, %d devices visible (the emulated group must "
               "share the GEMM's GPU; set CUDA_VISIBLE_DEVICES to one device)\n",
               devices);
    } else {
        for (int i = 0; i < 2; ++i) {
            fabric_t f;
            fabric_open(&f, budgets[i][0], budgets[i][1], sms);
            const double t_call = fabric_alone_ms(&f);
            printf("tide-RS fabric alone: 1x8, %.1f MiB group, sum %d + landing %d CTAs, "
                   "copies on SMs: %.3f ms per call of all ranks\n",
                   f.group_bytes / 1048576.0, budgets[i][0], budgets[i][1], t_call);
            gemm_row_fabric(&g, &f, reps, comm_ms, t_call);
            fabric_close(&f);
        }
    }

    spin_res_t sr;
    spin_res_open(&sr, std::min(smem_optin, TIDE_SUM_TMA_SMEM));
    for (int mode : {SPIN_POLL_HOST, SPIN_POLL_RELAY, SPIN_TIMED})
        for (int full = 1; full >= 0; --full)
            for (int ctas : {4, 8, 16, 20, 32})
                gemm_row_spin(&g, &sr, reps, ctas, full != 0, mode);

    gemm_enqueue(&g, reps);
    std::vector<double> alone2 = gemm_collect(&g, reps);
    push_row(make_row(&g, "alone (last)", "0", "-", alone2));
    const double base = 0.5 * (base1 + g_rows.back().med_us);

    probe_ctx_t probe;
    probe_ctx_open(&probe, sms, smem_optin);
    probe_section(&probe, &sr, &c, comm_ms, t_sum[0], t_sum[1], t_land);
    probe_ctx_close(&probe);

    lt_print_algos(&lt, algos);
    lt_section(&g, algos, &sr, &c, reps, comm_ms, t_sum[0], t_land);

    /* Final table: cublasGemmEx rows against the mean of its two alone medians, ltK rows
     * against ltK's alone median. */
    printf("\n# GEMM %dx%dx%d bf16 on %s: alone %.2f us (first %.2f, last %.2f, spread %.1f%%)\n",
           GM, GN, GK, prop.name, base, base1, alone2.empty() ? 0.0 : median(alone2),
           100.0 * std::fabs(median(alone2) - base1) / base);
    printf("%-30s %-7s %-6s %12s %10s %7s  %s\n", "scenario", "CTAs", "prio", "median us",
           "slowdown", ">1.5x", "note");
    for (const row_t &r : g_rows) {
        if (!r.ok) {
            printf("%-30s %-7s %-6s %12s %10s %7s  %s\n", r.scenario.c_str(), r.ctas.c_str(),
                   r.prio.c_str(), "-", "-", "-", r.note.c_str());
            continue;
        }
        printf("%-30s %-7s %-6s %12.2f %+9.1f%% %6.0f%%  %s\n", r.scenario.c_str(),
               r.ctas.c_str(), r.prio.c_str(), r.med_us, slowdown_pct(r, base), r.second_pct,
               r.note.c_str());
    }
    print_summary(base, algos);

    spin_res_close(&sr);
    comm_free(&c);
    lt_close(&lt);
    for (auto &e : g.ev) CK(cudaEventDestroy(e));
    CB(cublasDestroy(g.h));
    CK(cudaFree(g.x));
    CK(cudaFree(g.w));
    CK(cudaFree(g.y));
    CK(cudaFree(g.workspace));
    CK(cudaStreamDestroy(g.st));
    if (g_fail) printf("bench_interference: FAILED (invalid measurements above)\n");
    return g_fail;
}
