/*
 * test_matrix.c - the configuration matrix of TIDE-AG and TIDE-RS on the CPU fabric, threads
 * mode, every result checked against a brute-force definition.
 *
 * Topologies: M in {1, 2, 3, 4, 5, 8, 9} x L in {1, 2, 4, 8} (N up to 72 rank threads).
 * Groups: random shapes with padding (D_p not divisible by N), P from 1 to 256, bf16 and fp32
 * gradients, mixed-precision all-gather (fp32 shards -> bf16) and in-place shard adoption.
 * Knobs: both RS modes, W_wave < L with M > W_wave (several waves, both inbox generations),
 * staging slots, passes, CTA budgets, round widths.  Scaling: AVG, PREMUL_SUM and FSDP2's
 * divide factors folded into alpha; accumulate on and off.
 *
 * Properties:
 *  - AG: every rank's landing equals, byte for byte, the parameter-major unsharded (padded)
 *    parameters, built independently of the plan's offsets from the tensors themselves;
 *  - RS, standard-normal inputs: |y - y_ref| <= 1e-5 max(1, ||y_ref||_inf), y_ref in fp64;
 *  - RS, integer inputs whose sums are exact: equal to the stock-style fp32 reference (sum in
 *    rank order, then alpha, then the previous output) bit for bit, wherever the scaling is
 *    exact too (one wave, or alpha a power of two); padding rows +0 after every call;
 *  - repeated calls are bitwise identical, and so are runs that change only tuning knobs
 *    (staging slots, passes, CTA budgets, round width, In-Place vs Slot-Reuse) for one
 *    (M, L, W_wave), and every W_wave >= M (one wave per pass); test_tuning_invariance checks
 *    this on data whose sums round (2^e (1 + u), e in [-20, 20], random signs) with
 *    parameters that every pass count cuts differently.
 * The last test prints how many distinct (topology, shapes, dtypes, knobs) configurations ran.
 */
#include "e2e_util.h"
#include "matrix_gen.h"

#include <float.h>

/* ------------------------------------------------------------------ bf16 (independent) */

/* Round to nearest even; NaN becomes the canonical 0x7fff that kernels.h promises. */
static uint16_t bf16_rne(float v) {
    uint32_t b = e2e_f32_bits(v);
    if (isnan(v)) return 0x7fff;
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

static float bf16_widen(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float v;
    memcpy(&v, &b, sizeof(v));
    return v;
}

/* 2^e (1 + u), e in [-20, 20], u uniform in [0, 1), random sign: fp32 sums of such values
 * round in nearly every element, so any change of the association order shows. */
static float wide_value(e2e_rng_t *g) {
    const double u = (double)(e2e_rng_next(g) >> 40) / (double)(1ull << 24);
    const float v = (float)ldexp(1.0 + u, e2e_rng_int(g, -20, 20));
    return e2e_rng_next(g) & 1 ? -v : v;
}

static bool is_pow2(float a) {
    int e;
    return a > 0.0f && isfinite(a) && frexpf(a, &e) == 0.5f;
}

/* ------------------------------------------------------------------ configurations covered */

#define MAX_SEEN 2048
static uint64_t seen[MAX_SEEN];
static int num_seen, num_jobs, num_multiwave, num_exact;
static double job_seconds;

static uint64_t mix(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; ++i) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Count a (topology, shapes, dtypes, mode, knobs) tuple once, however often it runs. */
static void count_config(const tide_config_t *c, const tide_group_desc_t *g) {
    const int64_t fields[] = {c->nodes,        c->gpus_per_node, c->wave_width, c->round_width,
                              c->passes,       c->staging_slots, c->mode,       c->sum_ctas,
                              c->landing_ctas, g->num_params,    g->ag_dtype,   g->grad_dtype,
                              g->shard_dtype};
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); ++i)
        h = mix(h, (uint64_t)fields[i]);
    for (int p = 0; p < g->num_params; ++p)
        h = mix(mix(h, g->shapes[p].dim0), g->shapes[p].inner);
    for (int i = 0; i < num_seen; ++i)
        if (seen[i] == h) return;
    assert_true(num_seen < MAX_SEEN);
    seen[num_seen++] = h;
}

/* ------------------------------------------------------------------ topology */

typedef struct {
    int m, l, n;
    tide_comm_t comms[E2E_MAX_RANKS];
} topo_t;

static void topo_open(topo_t *t, int m, int l) {
    t->m = m;
    t->l = l;
    t->n = m * l;
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, m, l, t->comms));
}

static void topo_close(topo_t *t) {
    for (int r = 0; r < t->n; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(t->comms[r]));
}

/* ------------------------------------------------------------------ a group and its inputs */

#define AG_CALLS 2

typedef struct {
    const topo_t *t;
    int num_params;
    tide_param_shape_t *shapes;
    tide_dtype_t ag, grad, shard;
    bool integer;     /* gradients are small integers: every sum is exact */
    bool wide;        /* gradients 2^e (1 + u), e in [-20, 20], random signs: sums round */
    float alpha;      /* the scale every call of this data set uses */
    tide_plan_t plan; /* default knobs */
    e2e_layout_t lay; /* R_p and offsets from the shapes */
    uint64_t elems;   /* elements of one rank's output: sum_p R_p K_p */
    size_t ag_item, shard_item;
    /* RS */
    void ***grads; /* [rank][p]: D_p K_p items of grad */
    double **sum;  /* [rank][i]: sum_u G^(u) in fp64, packed output layout, padding 0 */
    double **asum; /* [rank][i]: sum_u |G^(u)| in fp64 (the rounding error's scale) */
    float **fsum;  /* [rank][i]: stock-style fp32 sum, added in rank order u = 0..N-1 */
    float **prev;  /* [rank][i]: the output an accumulating call starts from */
    /* AG */
    uint8_t *expected[AG_CALLS]; /* parameter-major unsharded parameters, N S bytes */
    uint8_t **shards[AG_CALLS];  /* [call][rank]: packed shard operand */
} data_t;

/* Gradient data of a data set (data_init's `kind`). */
enum { DATA_NORMAL = 0, DATA_INTEGER = 1, DATA_WIDE = 2 };

/* When set, data_init uses this shape for every parameter instead of random ones. */
static const tide_param_shape_t *fixed_shape;

/* P shapes of at most max_rows x max_inner, the first one with padding when N > 1. */
static tide_param_shape_t *random_shapes(e2e_rng_t *g, int n, int p, int max_rows, int max_inner) {
    tide_param_shape_t *s = calloc((size_t)p, sizeof(*s));
    assert_non_null(s);
    for (int i = 0; i < p; ++i) {
        s[i].dim0 = (uint64_t)e2e_rng_int(g, 1, max_rows);
        s[i].inner = (uint64_t)e2e_rng_int(g, 1, max_inner);
    }
    if (n > 1 && s[0].dim0 % (uint64_t)n == 0) s[0].dim0 += 1;
    for (int i = 0; i < p && fixed_shape != NULL; ++i)
        s[i] = *fixed_shape;
    return s;
}

static void data_ag(data_t *d, e2e_rng_t *g) {
    const int n = d->t->n;
    const size_t item = d->ag_item, sitem = d->shard_item;
    const bool cast = item != sitem;
    const uint64_t group_bytes = d->elems * (uint64_t)n * item;
    assert_int_equal(group_bytes, d->plan->geom.group_bytes);
    for (int call = 0; call < AG_CALLS; ++call) {
        d->expected[call] = calloc(1, group_bytes);
        d->shards[call] = calloc((size_t)n, sizeof(uint8_t *));
        assert_non_null(d->expected[call]);
        for (int r = 0; r < n; ++r)
            assert_non_null(d->shards[call][r] = calloc(1, d->elems * sitem));
        uint64_t base = 0, shard_base = 0; /* where p starts, in bytes: unsharded / shard */
        for (int p = 0; p < d->num_params; ++p) {
            const uint64_t rows = d->lay.rows[p], inner = d->shapes[p].inner;
            /* The padded unsharded tensor: N R_p rows, rows past D_p are zero. */
            for (uint64_t row = 0; row < rows * (uint64_t)n; ++row) {
                const int r = (int)(row / rows);
                for (uint64_t k = 0; k < inner; ++k) {
                    uint8_t *dst = d->expected[call] + base + (row * inner + k) * item;
                    uint8_t *src =
                        d->shards[call][r] + shard_base + ((row % rows) * inner + k) * sitem;
                    if (row >= d->shapes[p].dim0) continue; /* padding: zero in both */
                    if (cast) {
                        float v = (float)e2e_rng_normal(g);
                        int pick = e2e_rng_int(g, 0, 40);
                        if (pick == 0) v = INFINITY;
                        if (pick == 1) v = -0.0f;
                        if (pick == 2) v = NAN;
                        if (pick == 3) v = 3.4e38f; /* rounds up to +Inf in bf16 */
                        if (pick == 4) v = 1e-40f;  /* subnormal */
                        memcpy(src, &v, 4);
                        uint16_t h = bf16_rne(v);
                        memcpy(dst, &h, 2);
                    } else {
                        /* Random bytes: NaN payloads must survive the copies as well. */
                        for (size_t b = 0; b < item; ++b)
                            dst[b] = src[b] = (uint8_t)e2e_rng_next(g);
                    }
                }
            }
            base += rows * (uint64_t)n * inner * item;
            shard_base += rows * inner * sitem;
        }
        assert_int_equal(base, group_bytes);
    }
}

static void data_rs(data_t *d, e2e_rng_t *g) {
    const int n = d->t->n;
    d->grads = calloc((size_t)n, sizeof(void **));
    d->sum = calloc((size_t)n, sizeof(double *));
    d->asum = calloc((size_t)n, sizeof(double *));
    d->fsum = calloc((size_t)n, sizeof(float *));
    d->prev = calloc((size_t)n, sizeof(float *));
    for (int u = 0; u < n; ++u) {
        d->grads[u] = calloc((size_t)d->num_params, sizeof(void *));
        d->sum[u] = calloc(d->elems, sizeof(double));
        d->asum[u] = calloc(d->elems, sizeof(double));
        d->fsum[u] = calloc(d->elems, sizeof(float));
        d->prev[u] = calloc(d->elems, sizeof(float));
        for (uint64_t i = 0; i < d->elems; ++i)
            d->prev[u][i] = d->integer ? (float)e2e_rng_int(g, -50, 50) : (float)e2e_rng_normal(g);
    }
    const size_t item = tide_dtype_size(d->grad);
    for (int u = 0; u < n; ++u) { /* rank-major: fsum adds in rank order */
        for (int p = 0; p < d->num_params; ++p) {
            const uint64_t elems = d->shapes[p].dim0 * d->shapes[p].inner;
            d->grads[u][p] = malloc(elems * item);
            assert_non_null(d->grads[u][p]);
            for (uint64_t e = 0; e < elems; ++e) {
                float v = d->integer ? (float)e2e_rng_int(g, -8, 8) : (float)e2e_rng_normal(g);
                if (d->wide) v = wide_value(g);
                if (item == 2) {
                    uint16_t h = bf16_rne(v);
                    ((uint16_t *)d->grads[u][p])[e] = h;
                    v = bf16_widen(h);
                } else {
                    ((float *)d->grads[u][p])[e] = v;
                }
                int owner;
                uint64_t i;
                e2e_owner(&d->lay, p, e, &owner, &i);
                d->sum[owner][i] += (double)v;
                d->asum[owner][i] += fabs((double)v);
                d->fsum[owner][i] += v;
            }
        }
    }
}

static void data_init(data_t *d, const topo_t *t, e2e_rng_t *g, int num_params, int max_rows,
                      int max_inner, tide_dtype_t ag, tide_dtype_t grad, tide_dtype_t shard,
                      int kind, float alpha) {
    memset(d, 0, sizeof(*d));
    d->t = t;
    d->num_params = num_params;
    d->shapes = random_shapes(g, t->n, num_params, max_rows, max_inner);
    d->ag = ag;
    d->grad = grad;
    d->shard = shard;
    d->integer = kind == DATA_INTEGER;
    d->wide = kind == DATA_WIDE;
    d->alpha = alpha;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = t->m;
    cfg.gpus_per_node = t->l;
    tide_group_desc_t desc = {num_params, d->shapes, ag, grad, shard};
    assert_tide(TIDE_SUCCESS, tide_plan_create(&cfg, &desc, &d->plan));
    e2e_layout_init(&d->lay, d->shapes, num_params, t->n);
    d->elems = d->lay.eoff[num_params];
    assert_int_equal(d->elems, d->plan->geom.shard_elems);
    d->ag_item = tide_dtype_size(ag);
    d->shard_item = tide_dtype_size(shard);
    data_ag(d, g);
    data_rs(d, g);
}

static void data_free(data_t *d) {
    const int n = d->t->n;
    for (int call = 0; call < AG_CALLS; ++call) {
        for (int r = 0; r < n; ++r)
            free(d->shards[call][r]);
        free(d->shards[call]);
        free(d->expected[call]);
    }
    for (int u = 0; u < n; ++u) {
        for (int p = 0; p < d->num_params; ++p)
            free(d->grads[u][p]);
        free(d->grads[u]);
        free(d->sum[u]);
        free(d->asum[u]);
        free(d->fsum[u]);
        free(d->prev[u]);
    }
    free(d->grads);
    free(d->sum);
    free(d->asum);
    free(d->fsum);
    free(d->prev);
    free(d->shapes);
    tide_plan_destroy(d->plan);
}

/* ------------------------------------------------------------------ checks */

/*
 * Rank outputs of one call against the references.  exact: integer data with exact scaling,
 * compared bit for bit with the stock-style fp32 result; otherwise the fp64 tolerance.
 * Padding rows: +0 after every call (tide.h), accumulating or not.
 */
static void check_values(const data_t *d, float *const *outs, int accumulate, bool exact,
                         const char *what) {
    const double alpha = d->alpha;
    for (int r = 0; r < d->t->n; ++r) {
        const float *out = outs[r];
        double norm = 0;
        for (uint64_t i = 0; i < d->elems; ++i)
            norm = fmax(norm, fabs((accumulate ? d->prev[r][i] : 0.0) + alpha * d->sum[r][i]));
        const double tol = 1e-5 * fmax(1.0, norm);
        for (uint64_t i = 0; i < d->elems; ++i) {
            const float got = out[i];
            if (e2e_is_padding(&d->lay, r, i)) {
                const float want = 0.0f; /* +0 after every call, accumulating or not */
                if (e2e_f32_bits(got) != e2e_f32_bits(want))
                    fail_msg("%s: rank %d padding element %llu = %.9g (bits %08x), want %.9g", what,
                             r, (unsigned long long)i, got, e2e_f32_bits(got), want);
                continue;
            }
            if (exact) {
                volatile float scaled = d->alpha * d->fsum[r][i]; /* rounded before the add */
                const float want = accumulate ? d->prev[r][i] + scaled : scaled;
                if (e2e_f32_bits(got) != e2e_f32_bits(want))
                    fail_msg("%s: rank %d element %llu = %.9g, stock-style %.9g (exact)", what, r,
                             (unsigned long long)i, got, want);
            } else {
                const double want = (accumulate ? d->prev[r][i] : 0.0) + alpha * d->sum[r][i];
                /* Wide data cancels: bound the error by the terms' magnitudes instead,
                 * (N + 3) fp32 roundings of at most |alpha| sum |G| + |prev| each. */
                const double bound =
                    d->wide ? (d->t->n + 3) * (double)FLT_EPSILON *
                                  (fabs(alpha) * d->asum[r][i] +
                                   (accumulate ? fabs((double)d->prev[r][i]) : 0.0)) +
                                  1e-30
                            : tol;
                if (!(fabs((double)got - want) <= bound))
                    fail_msg("%s: rank %d element %llu = %.9g, fp64 reference %.9g (tol %.3g)",
                             what, r, (unsigned long long)i, got, want, tol);
            }
        }
    }
}

static void check_bitwise(const data_t *d, float *const *a, float *const *b, const char *what) {
    const uint64_t bytes = d->elems * sizeof(float);
    for (int r = 0; r < d->t->n; ++r)
        if (memcmp(a[r], b[r], bytes) != 0) {
            uint64_t i = 0;
            while (e2e_f32_bits(a[r][i]) == e2e_f32_bits(b[r][i]))
                ++i;
            fail_msg("%s: rank %d element %llu: %.9g vs %.9g (bits %08x vs %08x)", what, r,
                     (unsigned long long)i, a[r][i], b[r][i], e2e_f32_bits(a[r][i]),
                     e2e_f32_bits(b[r][i]));
        }
}

/* ------------------------------------------------------------------ jobs */


/*
 * Register the data set's group with knobs k and run: [AG_CALLS all-gathers when ag] then
 * RS calls  0: overwrite (k's mode),  1: accumulate onto prev (the other mode),
 *           [full:  2: call 0 again,  3: overwrite in the other mode].
 * Checks values, and bitwise equality with `base` (calls 0 and 1) when given.
 */
static e2e_job_t *run_job(const data_t *d, const matrix_knobs_t *k, int wave_width, bool ag, bool resident,
                          bool full, const e2e_job_t *base) {
    const topo_t *t = d->t;
    e2e_job_t *j = calloc(1, sizeof(*j));
    assert_non_null(j);
    const tide_config_t cfg = matrix_config(t->m, t->l, wave_width, k);
    j->comms = (tide_comm_t *)t->comms;
    j->cfg = cfg;
    j->desc = (tide_group_desc_t){d->num_params, d->shapes, d->ag, d->grad, d->shard};
    j->shard_in_bytes = d->elems * d->shard_item;
    j->landing_bytes = d->elems * (uint64_t)t->n * d->ag_item;
    j->out_elems = d->elems;
    if (ag) {
        j->num_ag = AG_CALLS;
        for (int c = 0; c < AG_CALLS; ++c) {
            j->ag_shards[c] = d->shards[c];
            j->ag_expected[c] = d->expected[c];
        }
        j->resident = resident;
    }
    j->grads = (void *const *const *)d->grads;
    const tide_rs_mode_t mode = k->mode, other = matrix_other_mode(k->mode);
    j->rs[0] = (e2e_rs_call_t){d->alpha, 0, mode, NULL};
    j->rs[1] = (e2e_rs_call_t){d->alpha, 1, other, d->prev};
    j->num_rs = 2;
    if (full) {
        j->rs[2] = (e2e_rs_call_t){d->alpha, 0, mode, NULL};
        j->rs[3] = (e2e_rs_call_t){d->alpha, 0, other, NULL};
        j->num_rs = 4;
    }

    /* The resolved plan says how many waves land, hence whether the scaling is exact. */
    tide_plan_t plan = NULL;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&cfg, &j->desc, &plan));
    /* The knobs take effect as asked (else "bitwise identical" would prove nothing). */
    const tide_config_t *rc = &plan->config;
    if (cfg.wave_width) assert_int_equal(rc->wave_width, cfg.wave_width);
    if (cfg.staging_slots) assert_int_equal(plan->rs.staging_slots, cfg.staging_slots);
    if (cfg.passes) assert_int_equal(plan->rs.passes, cfg.passes);
    if (cfg.round_width) assert_int_equal(plan->rs.round_width, cfg.round_width);
    if (cfg.sum_ctas) assert_int_equal(rc->sum_ctas, cfg.sum_ctas);
    if (cfg.landing_ctas) assert_int_equal(rc->landing_ctas, cfg.landing_ctas);
    assert_int_equal(plan->rs.mode, cfg.mode);
    const bool exact = d->integer && (plan->rs.waves_per_pass == 1 || is_pow2(d->alpha));
    const bool multiwave = plan->rs.waves_per_pass > 1;
    /* Several waves per pass alternate the two inbox generations (§4.2). */
    assert_int_equal(plan->rs.inbox_generations, multiwave ? 2 : 1);
    tide_plan_destroy(plan);

    e2e_job_run(j, t->n);
    count_config(&cfg, &j->desc);
    ++num_jobs;
    num_multiwave += multiwave;
    num_exact += exact;
    job_seconds += j->seconds;

    char what[160];
    snprintf(what, sizeof(what), "M=%d L=%d W=%d P=%d %s%s %s", t->m, t->l, wave_width,
             d->num_params, d->grad == TIDE_DTYPE_BF16 ? "bf16" : "fp32", d->integer ? " int" : "",
             k->name);
    check_values(d, j->outs[0], 0, exact, what);
    check_values(d, j->outs[1], 1, exact, what);
    if (full) {
        check_bitwise(d, j->outs[0], j->outs[2], "repeated call");
        check_bitwise(d, j->outs[0], j->outs[3], "the other mode");
    }
    if (base != NULL) {
        check_bitwise(d, base->outs[0], j->outs[0], what);
        check_bitwise(d, base->outs[1], j->outs[1], what);
    }
    if (getenv("TIDE_TEST_VERBOSE"))
        print_message("%-60s %s %.3f s\n", what, exact ? "exact" : "tol", j->seconds);
    return j;
}

static void job_free(e2e_job_t *j) {
    e2e_job_free(j);
    free(j);
}

/* ------------------------------------------------------------------ one topology */

/* Up to 16 ranks both gradient dtypes run every variant; larger topologies run one dtype. */
typedef enum { LEVEL_BOTH_DTYPES, LEVEL_ONE_DTYPE } level_t;

static const int P_CYCLE[] = {3, 1, 5, 17, 2};

static void topology_case(int m, int l, level_t level, int index) {
    e2e_rng_t g = {0x9e3779b97f4a7c15ull ^ (uint64_t)(m * 16 + l)};
    topo_t t;
    topo_open(&t, m, l);
    const int n = m * l;
    const int max_rows = 2 * n + 3, max_inner = n > 16 ? 3 : 5;
    const int wave = matrix_multiwave_width(m, l);
    const int num_dtypes = level == LEVEL_BOTH_DTYPES ? 2 : 1;
    for (int di = 0; di < num_dtypes; ++di) {
        const tide_dtype_t dt =
            (level == LEVEL_BOTH_DTYPES ? di : index % 2) ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
        const int p = P_CYCLE[(index + di) % 5];
        data_t d;
        data_init(&d, &t, &g, p, max_rows, max_inner, dt, dt, dt, false,
                  matrix_alpha_of(index + di, n, false));
        /* fp32 groups adopt their shard in place; bf16 groups pass it. */
        e2e_job_t *base = run_job(&d, &MATRIX_BASE, 0, true, dt == TIDE_DTYPE_FP32, true, NULL);
        for (int v = 0; v < MATRIX_NUM_VARIANTS; ++v)
            if (n < 64 || MATRIX_VARIANTS[v].in_largest)
                job_free(run_job(&d, &MATRIX_VARIANTS[v], 0, false, false, false, base));
        job_free(base);
        if (wave > 0) {
            /* Several waves per pass, both inbox generations; tuning still changes nothing. */
            base = run_job(&d, &MATRIX_BASE, wave, false, false, true, NULL);
            job_free(run_job(&d, &MATRIX_VARIANTS[8], wave, false, false, false, base));
            job_free(run_job(&d, &MATRIX_VARIANTS[4], wave, false, false, false, base));
            if (n < 64) job_free(run_job(&d, &MATRIX_VARIANTS[6], wave, false, false, false, base));
            job_free(base);
        }
        data_free(&d);
    }

    /* Integer gradients: exact sums, compared with the stock-style result bit for bit. */
    {
        const tide_dtype_t dt = index % 2 ? TIDE_DTYPE_BF16 : TIDE_DTYPE_FP32;
        /* Several waves round alpha once per wave: keep the scaling exact there. */
        float alpha = matrix_alpha_of(index, n, true);
        if (!is_pow2(alpha) && (wave > 0 || m > l)) alpha = index % 2 ? 1.0f : 0.25f;
        data_t d;
        data_init(&d, &t, &g, P_CYCLE[(index + 2) % 5], max_rows, max_inner, dt, dt, dt, true,
                  alpha);
        e2e_job_t *base = run_job(&d, &MATRIX_BASE, wave, false, false, level == LEVEL_BOTH_DTYPES, NULL);
        job_free(run_job(&d, &MATRIX_VARIANTS[8], wave, false, false, false, base));
        job_free(base);
        data_free(&d);
    }

    /* Mixed precision: fp32 master shards cast to bf16 on the way; bf16 gradients. */
    if (level == LEVEL_BOTH_DTYPES || index % 3 == 0) {
        data_t d;
        data_init(&d, &t, &g, P_CYCLE[(index + 3) % 5], max_rows, max_inner, TIDE_DTYPE_BF16,
                  TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, false, matrix_alpha_of(index + 1, n, false));
        job_free(run_job(&d, &MATRIX_BASE, 0, true, false, false, NULL));
        data_free(&d);
    }
    topo_close(&t);
}

static const int NODES[] = {1, 2, 3, 4, 5, 8, 9};
static const int GPUS[] = {1, 2, 4, 8};

/* All four L of one M.  Topologies of more than 16 ranks run one gradient dtype, those of
 * 64 and 72 ranks also fewer knob variants (registration compiles every rank's program on
 * every rank, so a run costs O(N^2) there). */
static void nodes_case(int m) {
    for (int li = 0; li < 4; ++li) {
        const int l = GPUS[li];
        int index = 0;
        while (NODES[index] != m)
            ++index;
        double t0 = e2e_now_s();
        int jobs0 = num_jobs;
        topology_case(m, l, m * l <= 16 ? LEVEL_BOTH_DTYPES : LEVEL_ONE_DTYPE, index * 4 + li);
        print_message("M=%d L=%d: %d runs, %.2f s\n", m, l, num_jobs - jobs0, e2e_now_s() - t0);
    }
}

static void test_m1(void **state) {
    (void)state;
    nodes_case(1);
}
static void test_m2(void **state) {
    (void)state;
    nodes_case(2);
}
static void test_m3(void **state) {
    (void)state;
    nodes_case(3);
}
static void test_m4(void **state) {
    (void)state;
    nodes_case(4);
}
static void test_m5(void **state) {
    (void)state;
    nodes_case(5);
}
static void test_m8(void **state) {
    (void)state;
    nodes_case(8);
}
static void test_m9(void **state) {
    (void)state;
    nodes_case(9);
}

/* ------------------------------------------------------------------ many parameters */

/* P = 256 (TIDE_MAX_PARAMS) on small topologies, both dtypes, with a knob variant; and P = 17
 * with a multi-wave schedule and the mixed-precision all-gather. */
static void test_many_params(void **state) {
    (void)state;
    e2e_rng_t g = {12345};
    static const int topo[][2] = {{2, 2}, {1, 2}, {3, 1}};
    for (int ti = 0; ti < 3; ++ti) {
        topo_t t;
        topo_open(&t, topo[ti][0], topo[ti][1]);
        const tide_dtype_t dt = ti % 2 ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
        data_t d;
        data_init(&d, &t, &g, TIDE_MAX_PARAMS, t.n + 2, 3, dt, dt, dt, ti == 2,
                  matrix_alpha_of(ti, t.n, ti == 2));
        e2e_job_t *base = run_job(&d, &MATRIX_BASE, 0, true, ti == 1, true, NULL);
        job_free(run_job(&d, &MATRIX_VARIANTS[8], 0, false, false, false, base));
        job_free(base);
        data_free(&d);
        topo_close(&t);
    }
    topo_t t;
    topo_open(&t, 3, 2);
    data_t d;
    data_init(&d, &t, &g, 17, 40, 6, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32, false,
              matrix_alpha_of(2, t.n, false));
    e2e_job_t *base = run_job(&d, &MATRIX_BASE, 1, true, false, true, NULL);
    job_free(run_job(&d, &MATRIX_VARIANTS[4], 1, false, false, false, base));
    job_free(base);
    data_free(&d);
    topo_close(&t);
}

/* ------------------------------------------------------------------ tuning invariance */

/*
 * Data whose fp32 sums round (wide exponents, random signs) and parameters large enough that
 * every pass count cuts them differently, on small topologies; every tuning knob in turn, and
 * the wave widths inside their documented scope (every W_wave >= M gives one wave per pass,
 * the same arithmetic).  Every run must equal the base run bit for bit.
 */
static void sweep_knobs(const data_t *d, int base_wave) {
    const topo_t *t = d->t;
    matrix_knobs_t k = MATRIX_BASE;
    e2e_job_t *base = run_job(d, &k, base_wave, false, false, true, NULL);
    char name[96];
    k.name = name;
    for (int passes = 1; passes <= TIDE_MAX_PASSES; ++passes)
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
            k = MATRIX_BASE;
            k.name = name;
            k.passes = passes;
            k.mode = (tide_rs_mode_t)mode;
            snprintf(name, sizeof(name), "passes %d %s", passes, mode ? "slot-reuse" : "in-place");
            job_free(run_job(d, &k, base_wave, false, false, false, base));
        }
    static const int stg[] = {1, 3, 8}, sum_ctas[] = {1, 3, 16}, land_ctas[] = {1, 5, 2};
    for (int i = 0; i < 3; ++i) {
        k = MATRIX_BASE;
        k.name = name;
        k.staging_slots = stg[i];
        k.sum_ctas = sum_ctas[i];
        k.landing_ctas = land_ctas[i];
        k.passes = 4 - i;
        snprintf(name, sizeof(name), "staging %d ctas %d/%d passes %d", stg[i], sum_ctas[i],
                 land_ctas[i], 4 - i);
        job_free(run_job(d, &k, base_wave, false, false, false, base));
    }
    for (int rw = 1; rw <= TIDE_MAX_ROUND_WIDTH && t->m > 1; ++rw) {
        k = MATRIX_BASE;
        k.name = name;
        k.round_width = rw;
        k.passes = rw % 3 + 1;
        snprintf(name, sizeof(name), "k %d passes %d", rw, k.passes);
        job_free(run_job(d, &k, base_wave, false, false, false, base));
    }
    if (base_wave == 0)
        for (int w = t->m; w <= t->l; ++w) {
            tide_plan_t plan = NULL;
            tide_config_t cfg = TIDE_CONFIG_INIT;
            cfg.nodes = t->m;
            cfg.gpus_per_node = t->l;
            cfg.wave_width = w;
            tide_group_desc_t desc = {d->num_params, d->shapes, d->ag, d->grad, d->shard};
            if (tide_plan_create(&cfg, &desc, &plan) != TIDE_SUCCESS) continue; /* App. D */
            tide_plan_destroy(plan);
            k = MATRIX_BASE;
            k.name = name;
            k.passes = w % TIDE_MAX_PASSES + 1;
            snprintf(name, sizeof(name), "W_wave %d passes %d", w, k.passes);
            job_free(run_job(d, &k, w, false, false, false, base));
        }
    job_free(base);
}

static void test_tuning_invariance(void **state) {
    (void)state;
    e2e_rng_t g = {0x5eed5eedull};
    /* The reported case first: one 8 x 16 fp32 parameter on 1 x 4. */
    {
        topo_t t;
        topo_open(&t, 1, 4);
        data_t d;
        static const tide_param_shape_t one = {8, 16};
        fixed_shape = &one;
        data_init(&d, &t, &g, 1, 8, 16, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32,
                  DATA_WIDE, 1.0f);
        fixed_shape = NULL;
        sweep_knobs(&d, 0);
        data_free(&d);
        topo_close(&t);
    }
    static const int topo[][2] = {{1, 4}, {1, 8}, {2, 4}, {3, 2}, {2, 8}, {5, 2}};
    for (int ti = 0; ti < 6; ++ti) {
        topo_t t;
        topo_open(&t, topo[ti][0], topo[ti][1]);
        const tide_dtype_t dt = ti % 2 ? TIDE_DTYPE_BF16 : TIDE_DTYPE_FP32;
        data_t d;
        data_init(&d, &t, &g, 1 + ti % 3, 3 * t.n + 5, 37, dt, dt, dt, DATA_WIDE,
                  matrix_alpha_of(ti, t.n, false));
        sweep_knobs(&d, 0);
        const int wave = matrix_multiwave_width(t.m, t.l);
        if (wave > 0 && ti < 4) sweep_knobs(&d, wave); /* several waves: its own identity */
        data_free(&d);
        topo_close(&t);
    }
}

static void test_summary(void **state) {
    (void)state;
    assert_true(num_seen > 0);
    print_message("configuration matrix: %d distinct configurations covered in %d runs "
                  "(%d with several waves per pass, %d compared bit for bit with the "
                  "stock-style sum; %.1f s registering and calling)\n",
                  num_seen, num_jobs, num_multiwave, num_exact, job_seconds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_m1),      cmocka_unit_test(test_m2),
        cmocka_unit_test(test_m3),      cmocka_unit_test(test_m4),
        cmocka_unit_test(test_m5),      cmocka_unit_test(test_m8),
        cmocka_unit_test(test_m9),      cmocka_unit_test(test_many_params),
        cmocka_unit_test(test_tuning_invariance),
        cmocka_unit_test(test_summary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
