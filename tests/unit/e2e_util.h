/*
 * e2e_util.h - end-to-end harness for the CPU fabric in threads mode: one thread per rank
 * registers a group, runs a script of all-gather and reduce-scatter calls, and leaves its
 * outputs for the main thread to check against brute-force references.
 *
 * cmocka asserts must not run on worker threads (they longjmp), so workers record failures
 * in their rank's report and the main thread asserts on the reports.  Header-only so that the
 * tests/unit/test_*.c glob keeps one executable per test file.
 */
#ifndef TIDE_TESTS_E2E_UTIL_H_
#define TIDE_TESTS_E2E_UTIL_H_

#include "test_util.h"

#include "plan/plan.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

/* The largest topology of the configuration matrix: M = 9 nodes of L = 8 GPUs. */
#define E2E_MAX_RANKS (9 * TIDE_MAX_GPUS_PER_NODE)
#define E2E_MAX_CALLS 12
#define E2E_STALE 777.0f /* what an output holds before a non-accumulating call */

/* ------------------------------------------------------------------ reports */

typedef struct {
    int failures;
    char first[768];
} e2e_report_t;

static inline void e2e_note(e2e_report_t *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void e2e_note(e2e_report_t *r, const char *fmt, ...) {
    if (r->failures++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->first, sizeof(r->first), fmt, ap);
        va_end(ap);
    }
}

static inline void e2e_assert_reports(const e2e_report_t *reps, int n) {
    for (int r = 0; r < n; ++r) {
        if (reps[r].failures)
            print_error("rank %d: %d failure(s), first: %s\n", r, reps[r].failures, reps[r].first);
        assert_int_equal(reps[r].failures, 0);
    }
}

/* ------------------------------------------------------------------ threads */

typedef void (*e2e_rank_fn_t)(int rank, void *ctx);
typedef struct {
    int rank;
    e2e_rank_fn_t fn;
    void *ctx;
} e2e_thread_arg_t;

static inline void *e2e_thread_main(void *p) {
    e2e_thread_arg_t *a = p;
    a->fn(a->rank, a->ctx);
    return NULL;
}

/* Run fn(rank, ctx) for every rank on its own thread and join them all. */
static inline void e2e_run_threads(int n, e2e_rank_fn_t fn, void *ctx) {
    pthread_t th[E2E_MAX_RANKS];
    e2e_thread_arg_t args[E2E_MAX_RANKS];
    assert_true(n >= 1 && n <= E2E_MAX_RANKS);
    pthread_attr_t attr;
    assert_int_equal(pthread_attr_init(&attr), 0);
    /* 72 ranks on two cores: small stacks keep the address space modest. */
    assert_int_equal(pthread_attr_setstacksize(&attr, 1u << 20), 0);
    for (int r = 0; r < n; ++r) {
        args[r] = (e2e_thread_arg_t){r, fn, ctx};
        assert_int_equal(pthread_create(&th[r], &attr, e2e_thread_main, &args[r]), 0);
    }
    for (int r = 0; r < n; ++r)
        pthread_join(th[r], NULL);
    pthread_attr_destroy(&attr);
}

/* ------------------------------------------------------------------ inputs */

/* xorshift64*: every run sees the same inputs. */
typedef struct {
    uint64_t s;
} e2e_rng_t;

static inline uint64_t e2e_rng_next(e2e_rng_t *g) {
    g->s ^= g->s >> 12;
    g->s ^= g->s << 25;
    g->s ^= g->s >> 27;
    return g->s * 0x2545f4914f6cdd1dull;
}
static inline int e2e_rng_int(e2e_rng_t *g, int lo, int hi) {
    return lo + (int)(e2e_rng_next(g) % (uint64_t)(hi - lo + 1));
}
/* Standard normal by Box-Muller from two 53-bit uniforms in (0, 1). */
static inline double e2e_rng_normal(e2e_rng_t *g) {
    double u1 = ((double)(e2e_rng_next(g) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(e2e_rng_next(g) >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static inline double e2e_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ jobs */

/* One reduce-scatter call of a script. */
typedef struct {
    float alpha;
    int accumulate;
    tide_rs_mode_t mode;
    float *const *init; /* per rank: the output before the call; NULL: E2E_STALE everywhere */
} e2e_rs_call_t;

/*
 * One registered group and the calls every rank makes on it: num_ag all-gathers (slots 0, 1,
 * 0, ...), each landing compared bytewise with ag_expected[call], then num_rs reduce-scatters
 * whose outputs are kept in outs[call][rank] (freed by e2e_job_free).
 */
typedef struct {
    tide_comm_t *comms; /* N handles of one communicator */
    tide_config_t cfg;
    tide_group_desc_t desc;
    uint64_t shard_in_bytes; /* bytes of one AG shard operand (S, or S_fp32 with a cast) */
    uint64_t landing_bytes;  /* N S */
    uint64_t out_elems;      /* sum_p R_p K_p */
    int num_ag;
    uint8_t *const *ag_shards[E2E_MAX_CALLS]; /* [call][rank] */
    const uint8_t *ag_expected[E2E_MAX_CALLS];
    bool resident; /* copy the shard into the resident region and pass NULL */
    int num_rs;
    e2e_rs_call_t rs[E2E_MAX_CALLS];
    void *const *const *grads; /* [rank][p] */
    float *outs[E2E_MAX_CALLS][E2E_MAX_RANKS];
    double seconds; /* wall time of the whole job */
    e2e_report_t rep[E2E_MAX_RANKS];
} e2e_job_t;

static inline void e2e_rank_ag(e2e_job_t *j, int rank, tide_group_t grp) {
    e2e_report_t *rep = &j->rep[rank];
    for (int call = 0; call < j->num_ag; ++call) {
        const int slot = call % 2;
        void *land = NULL, *resident = NULL;
        if (tide_group_landing(grp, slot, &land) != TIDE_SUCCESS) {
            e2e_note(rep, "landing %d: %s", slot, tide_get_last_error());
            return;
        }
        const void *shard = j->ag_shards[call][rank];
        if (j->resident) {
            if (tide_group_resident(grp, &resident) != TIDE_SUCCESS) {
                e2e_note(rep, "resident: %s", tide_get_last_error());
                return;
            }
            memcpy(resident, shard, j->shard_in_bytes);
            shard = NULL;
        }
        if (tide_all_gather(grp, shard, slot, NULL) != TIDE_SUCCESS) {
            e2e_note(rep, "all-gather call %d: %s", call, tide_get_last_error());
            return;
        }
        const uint8_t *got = land, *want = j->ag_expected[call];
        if (memcmp(got, want, j->landing_bytes) != 0) {
            uint64_t i = 0;
            while (got[i] == want[i])
                ++i;
            e2e_note(rep, "all-gather call %d slot %d: landing differs first at byte %llu of %llu",
                     call, slot, (unsigned long long)i, (unsigned long long)j->landing_bytes);
        }
    }
}

static inline void e2e_rank_rs(e2e_job_t *j, int rank, tide_group_t grp) {
    e2e_report_t *rep = &j->rep[rank];
    if (j->num_rs == 0) return;
    const void *const *grads = (const void *const *)j->grads[rank];
    for (int call = 0; call < j->num_rs; ++call) {
        const e2e_rs_call_t *c = &j->rs[call];
        float *out = malloc(j->out_elems * sizeof(float));
        if (out == NULL) {
            e2e_note(rep, "out of memory");
            return;
        }
        if (c->init != NULL)
            memcpy(out, c->init[rank], j->out_elems * sizeof(float));
        else
            for (uint64_t e = 0; e < j->out_elems; ++e)
                out[e] = E2E_STALE;
        j->outs[call][rank] = out;
        if (tide_reduce_scatter(grp, grads, out, c->alpha, c->accumulate, c->mode, NULL) !=
            TIDE_SUCCESS) {
            e2e_note(rep, "reduce-scatter call %d: %s", call, tide_get_last_error());
            return;
        }
    }
}

static inline void e2e_rank(int rank, void *ctx) {
    e2e_job_t *j = ctx;
    tide_group_t grp;
    if (tide_group_register(j->comms[rank], &j->cfg, &j->desc, &grp) != TIDE_SUCCESS) {
        e2e_note(&j->rep[rank], "register: %s", tide_get_last_error());
        return;
    }
    e2e_rank_ag(j, rank, grp);
    if (j->rep[rank].failures == 0) e2e_rank_rs(j, rank, grp);
    if (tide_group_deregister(grp) != TIDE_SUCCESS)
        e2e_note(&j->rep[rank], "deregister: %s", tide_get_last_error());
}

/* Run the job on all n ranks and assert that no rank reported a failure. */
static inline void e2e_job_run(e2e_job_t *j, int n) {
    double t0 = e2e_now_s();
    e2e_run_threads(n, e2e_rank, j);
    j->seconds = e2e_now_s() - t0;
    e2e_assert_reports(j->rep, n);
}

static inline void e2e_job_free(e2e_job_t *j) {
    for (int c = 0; c < E2E_MAX_CALLS; ++c)
        for (int r = 0; r < E2E_MAX_RANKS; ++r) {
            free(j->outs[c][r]);
            j->outs[c][r] = NULL;
        }
}

/* ------------------------------------------------------------------ layout (paper §2.1) */

/*
 * The packed per-rank layout, computed here from the shapes alone (not from the plan):
 * R_p = ceil(D_p / N) rows per rank, parameter p at element eoff[p] of every rank's output.
 */
typedef struct {
    int num_params, ranks;
    const tide_param_shape_t *shapes;
    uint64_t rows[TIDE_MAX_PARAMS];
    uint64_t eoff[TIDE_MAX_PARAMS + 1]; /* eoff[P]: elements of one rank's output */
} e2e_layout_t;

static inline void e2e_layout_init(e2e_layout_t *lay, const tide_param_shape_t *shapes, int P,
                                   int n) {
    lay->num_params = P;
    lay->ranks = n;
    lay->shapes = shapes;
    lay->eoff[0] = 0;
    for (int p = 0; p < P; ++p) {
        lay->rows[p] = (shapes[p].dim0 + (uint64_t)n - 1) / (uint64_t)n;
        lay->eoff[p + 1] = lay->eoff[p] + lay->rows[p] * shapes[p].inner;
    }
}

/* Parameter p's element e (row-major in G_p) belongs to rank row / R_p at this packed index. */
static inline void e2e_owner(const e2e_layout_t *lay, int p, uint64_t e, int *rank_out,
                             uint64_t *index_out) {
    const uint64_t inner = lay->shapes[p].inner, row = e / inner, k = e % inner;
    *rank_out = (int)(row / lay->rows[p]);
    *index_out = lay->eoff[p] + (row % lay->rows[p]) * inner + k;
}

/* Whether packed output element i of rank r is a padding row (global row >= D_p). */
static inline bool e2e_is_padding(const e2e_layout_t *lay, int rank, uint64_t i) {
    int lo = 0, hi = lay->num_params - 1; /* the p with eoff[p] <= i < eoff[p + 1] */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (lay->eoff[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    const uint64_t local_row = (i - lay->eoff[lo]) / lay->shapes[lo].inner;
    return (uint64_t)rank * lay->rows[lo] + local_row >= lay->shapes[lo].dim0;
}

static inline uint32_t e2e_f32_bits(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof(b));
    return b;
}

#endif /* TIDE_TESTS_E2E_UTIL_H_ */
