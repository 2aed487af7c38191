/*
 * test_numerics.c - TIDE-RS and the mixed-precision TIDE-AG on IEEE special values, end to
 * end on the CPU fabric (threads mode).
 *
 * Reduce-scatter (paper §4.3, tide.h): with alpha >= 0 and small integer gradients,
 *  - a NaN in any contribution makes the output element NaN; +Inf plus finite values gives
 *    +Inf (-Inf likewise); +Inf and -Inf together give NaN.  The brute-force reference is the
 *    same formula evaluated in fp64, whose IEEE classes do not depend on the association;
 *    finite elements must match it exactly;
 *  - every NaN written is the canonical fp32 NaN 0x7fffffff (kernels.h), whatever payload or
 *    sign went in (quiet, signalling, negative);
 *  - padding rows are +0 (bits 0) after every call, accumulating or not, also with a
 *    negative alpha (alpha * 0 would be -0);
 *  - a negative alpha flips the classes' signs (alpha = 0 is refused: tide.h);
 *  - accumulate adds the new sum to the previous output, including previous NaN and Inf;
 *  - five repeated calls are bitwise identical;
 *  - at M = 1, all gradients -0.0f land as +0.0f for L >= 2 and -0.0f for L = 1.
 * Topologies cover one rank, one node, several nodes with one and with two waves per pass
 * (both inbox generations), bf16 and fp32 gradients.
 *
 * All-gather with a cast (fp32 master shards -> bf16 landing): NaNs become 0x7fff, infinities
 * stay, overflow rounds to infinity, ties round to even, -0 and subnormals survive.
 */
#include "e2e_util.h"

#include <float.h>

#define NUM_REPEATS 5

static float f32_from(uint32_t b) {
    float v;
    memcpy(&v, &b, sizeof(v));
    return v;
}

/* NaNs with payloads, signs and a signalling one. */
static const uint32_t NAN_F32[] = {0x7fc00000u, 0x7fc00123u, 0xffc00000u, 0x7f800001u};
static const uint16_t NAN_BF16[] = {0x7fc0u, 0x7fc1u, 0xffc0u, 0x7f81u};

typedef struct {
    int m, l, wave_width;
    tide_dtype_t grad;
} num_case_t;

typedef struct {
    int n, num_params;
    tide_param_shape_t shapes[3];
    e2e_layout_t lay;
    uint64_t elems;
    void ***grads; /* [rank][p] */
    double **sum;  /* [rank][i]: sum_u G^(u) in fp64, NaN and Inf included */
    float **prev;  /* [rank][i]: previous output, with specials */
    int specials;  /* contributions set to NaN or an infinity */
} num_data_t;

typedef enum { V_FINITE, V_NAN, V_PINF, V_NINF } vclass_t;

/* Store class c (or the finite value v) as item e of a gradient; return its fp64 value. */
static double put(void *grad, tide_dtype_t dt, uint64_t e, vclass_t c, int v, e2e_rng_t *g) {
    const int pick = e2e_rng_int(g, 0, 3);
    if (dt == TIDE_DTYPE_BF16) {
        uint16_t h = c == V_NAN    ? NAN_BF16[pick]
                     : c == V_PINF ? 0x7f80u
                     : c == V_NINF ? 0xff80u
                                   : (uint16_t)(e2e_f32_bits((float)v) >> 16); /* exact */
        ((uint16_t *)grad)[e] = h;
    } else {
        float f = c == V_NAN    ? f32_from(NAN_F32[pick])
                  : c == V_PINF ? INFINITY
                  : c == V_NINF ? -INFINITY
                                : (float)v;
        ((float *)grad)[e] = f;
    }
    return c == V_NAN ? NAN : c == V_PINF ? INFINITY : c == V_NINF ? -INFINITY : (double)v;
}

static void data_init(num_data_t *d, const num_case_t *c, e2e_rng_t *g) {
    memset(d, 0, sizeof(*d));
    const int n = c->m * c->l;
    d->n = n;
    d->num_params = 3;
    /* Row counts not divisible by N (padding), and one parameter smaller than N rows. */
    d->shapes[0] = (tide_param_shape_t){(uint64_t)(3 * n + 1), 5};
    d->shapes[1] = (tide_param_shape_t){(uint64_t)(n > 1 ? n - 1 : 1), 3};
    d->shapes[2] = (tide_param_shape_t){(uint64_t)(2 * n + 1), 1};
    e2e_layout_init(&d->lay, d->shapes, d->num_params, n);
    d->elems = d->lay.eoff[d->num_params];
    d->grads = calloc((size_t)n, sizeof(void **));
    d->sum = calloc((size_t)n, sizeof(double *));
    d->prev = calloc((size_t)n, sizeof(float *));
    const size_t item = tide_dtype_size(c->grad);
    for (int u = 0; u < n; ++u) {
        d->grads[u] = calloc((size_t)d->num_params, sizeof(void *));
        for (int p = 0; p < d->num_params; ++p)
            assert_non_null(d->grads[u][p] = malloc(d->shapes[p].dim0 * d->shapes[p].inner * item));
        d->sum[u] = calloc(d->elems, sizeof(double));
        d->prev[u] = calloc(d->elems, sizeof(float));
        for (uint64_t i = 0; i < d->elems; ++i) {
            const int pick = e2e_rng_int(g, 0, 19);
            d->prev[u][i] = pick == 0   ? f32_from(NAN_F32[e2e_rng_int(g, 0, 3)])
                            : pick == 1 ? INFINITY
                            : pick == 2 ? -INFINITY
                            : pick == 3 ? -0.0f
                                        : (float)e2e_rng_int(g, -20, 20);
        }
    }
    vclass_t *cls = calloc((size_t)n, sizeof(vclass_t));
    for (int p = 0; p < d->num_params; ++p) {
        const uint64_t elems = d->shapes[p].dim0 * d->shapes[p].inner;
        for (uint64_t e = 0; e < elems; ++e) {
            for (int u = 0; u < n; ++u)
                cls[u] = V_FINITE;
            const int pattern = e2e_rng_int(g, 0, 99);
            const int a = e2e_rng_int(g, 0, n - 1);
            const int b = n > 1 ? (a + e2e_rng_int(g, 1, n - 1)) % n : a; /* b != a */
            if (pattern >= 60 && pattern < 68) cls[a] = V_NAN;
            if (pattern >= 68 && pattern < 76) cls[a] = V_PINF;
            if (pattern >= 76 && pattern < 82) cls[a] = V_NINF;
            if (pattern >= 82 && pattern < 90) cls[a] = V_PINF, cls[b] = V_NINF; /* NaN */
            if (pattern >= 90 && pattern < 95) cls[a] = V_PINF, cls[b] = V_PINF;
            if (pattern >= 95) cls[a] = V_NAN, cls[b] = V_NINF;
            int owner;
            uint64_t i;
            e2e_owner(&d->lay, p, e, &owner, &i);
            for (int u = 0; u < n; ++u) {
                d->sum[owner][i] +=
                    put(d->grads[u][p], c->grad, e, cls[u], e2e_rng_int(g, -6, 6), g);
                d->specials += cls[u] != V_FINITE;
            }
        }
    }
    free(cls);
}

static void data_free(num_data_t *d) {
    for (int u = 0; u < d->n; ++u) {
        for (int p = 0; p < d->num_params; ++p)
            free(d->grads[u][p]);
        free(d->grads[u]);
        free(d->sum[u]);
        free(d->prev[u]);
    }
    free(d->grads);
    free(d->sum);
    free(d->prev);
}

/* Counts of what one call's outputs exercised. */
typedef struct {
    uint64_t nan, inf, finite, padding;
} classes_t;

/*
 * Outputs of one call against y = (accumulate ? prev : 0) + alpha sum in fp64.  exact: finite
 * elements equal y (alpha and the inputs make every fp32 step exact); otherwise within the
 * §4.3 tolerance.
 */
static classes_t check_call(const num_data_t *d, float *const *outs, float alpha, int accumulate,
                            bool exact, const char *what) {
    classes_t seen = {0, 0, 0, 0};
    for (int r = 0; r < d->n; ++r) {
        double norm = 0; /* ||y||_inf over the finite elements: the §4.3 tolerance */
        for (uint64_t i = 0; i < d->elems; ++i) {
            const double y = (accumulate ? (double)d->prev[r][i] : 0.0) + alpha * d->sum[r][i];
            if (isfinite(y)) norm = fmax(norm, fabs(y));
        }
        const double tol = 1e-5 * fmax(1.0, norm);
        for (uint64_t i = 0; i < d->elems; ++i) {
            const float got = outs[r][i];
            const uint32_t bits = e2e_f32_bits(got);
            const double y = (accumulate ? (double)d->prev[r][i] : 0.0) + alpha * d->sum[r][i];
            if (e2e_is_padding(&d->lay, r, i)) {
                if (bits != 0u)
                    fail_msg("%s: rank %d padding element %llu has bits %08x, want +0", what, r,
                             (unsigned long long)i, bits);
                ++seen.padding;
                continue;
            }
            if (isnan(y)) {
                if (bits != 0x7fffffffu)
                    fail_msg("%s: rank %d element %llu = %g (bits %08x), want canonical NaN", what,
                             r, (unsigned long long)i, got, bits);
                ++seen.nan;
            } else if (isinf(y)) {
                if ((double)got != y)
                    fail_msg("%s: rank %d element %llu = %g, want %g", what, r,
                             (unsigned long long)i, got, y);
                ++seen.inf;
            } else {
                const bool ok = exact ? (double)got == y : fabs((double)got - y) <= tol;
                if (!ok)
                    fail_msg("%s: rank %d element %llu = %.9g, want %.9g", what, r,
                             (unsigned long long)i, got, y);
                ++seen.finite;
            }
        }
    }
    return seen;
}

static void run_case(const num_case_t *c, uint64_t seed) {
    e2e_rng_t g = {seed};
    num_data_t d;
    data_init(&d, c, &g);
    assert_true(d.specials > 0);
    tide_comm_t comms[E2E_MAX_RANKS];
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, c->m, c->l, comms));

    e2e_job_t *j = calloc(1, sizeof(*j));
    assert_non_null(j);
    j->comms = comms;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = c->m;
    cfg.gpus_per_node = c->l;
    cfg.wave_width = c->wave_width;
    j->cfg = cfg;
    j->desc = (tide_group_desc_t){d.num_params, d.shapes, c->grad, c->grad, c->grad};
    j->out_elems = d.elems;
    j->grads = (void *const *const *)d.grads;
    const float avg = tide_alpha_avg(d.n);
    j->rs[0] = (e2e_rs_call_t){1.0f, 0, TIDE_RS_IN_PLACE, NULL};
    j->rs[1] = (e2e_rs_call_t){0.5f, 0, TIDE_RS_SLOT_REUSE, NULL};
    j->rs[2] = (e2e_rs_call_t){-2.0f, 0, TIDE_RS_IN_PLACE, NULL};
    j->rs[3] = (e2e_rs_call_t){1.0f, 1, TIDE_RS_SLOT_REUSE, d.prev};
    j->rs[4] = (e2e_rs_call_t){-2.0f, 1, TIDE_RS_IN_PLACE, d.prev};
    for (int k = 0; k < NUM_REPEATS; ++k)
        j->rs[5 + k] = (e2e_rs_call_t){avg, 0, TIDE_RS_IN_PLACE, NULL};
    j->num_rs = 5 + NUM_REPEATS;
    e2e_job_run(j, d.n);

    /* The plan's waves: with several, alpha is applied once per wave. */
    tide_plan_t plan = NULL;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&cfg, &j->desc, &plan));
    const int waves = plan->rs.waves_per_pass;
    tide_plan_destroy(plan);

    char what[96];
    snprintf(what, sizeof(what), "M=%d L=%d W=%d %s", c->m, c->l, c->wave_width,
             c->grad == TIDE_DTYPE_BF16 ? "bf16" : "fp32");
    classes_t s0 = check_call(&d, j->outs[0], 1.0f, 0, true, what);
    check_call(&d, j->outs[1], 0.5f, 0, true, what);
    classes_t s2 = check_call(&d, j->outs[2], -2.0f, 0, true, what);
    classes_t s3 = check_call(&d, j->outs[3], 1.0f, 1, true, what);
    check_call(&d, j->outs[4], -2.0f, 1, true, what);
    /* 1/N is exact for N a power of two; otherwise one rounding per wave and per add. */
    const bool avg_exact = (d.n & (d.n - 1)) == 0;
    for (int k = 0; k < NUM_REPEATS; ++k) {
        check_call(&d, j->outs[5 + k], avg, 0, avg_exact, what);
        if (k > 0)
            for (int r = 0; r < d.n; ++r)
                if (memcmp(j->outs[5][r], j->outs[5 + k][r], d.elems * sizeof(float)) != 0)
                    fail_msg("%s: repeated call %d differs bitwise on rank %d", what, k, r);
    }
    /* The data really exercised every class (else the checks above prove little). */
    assert_true(s0.nan > 0 && s0.inf > 0 && s0.finite > 0);
    assert_true(d.n == 1 || s0.padding > 0);
    assert_true(s2.nan == s0.nan && s2.inf == s0.inf); /* alpha = -2 keeps the classes */
    assert_true(s3.nan >= s0.nan && s3.inf > 0);
    print_message("%s (%d wave%s per pass): %llu NaN, %llu Inf, %llu finite, %llu padding: ok\n",
                  what, waves, waves > 1 ? "s" : "", (unsigned long long)s0.nan,
                  (unsigned long long)s0.inf, (unsigned long long)s0.finite,
                  (unsigned long long)s0.padding);

    e2e_job_free(j);
    free(j);
    for (int r = 0; r < d.n; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(comms[r]));
    data_free(&d);
}

static const num_case_t CASES[] = {
    {1, 1, 0, TIDE_DTYPE_FP32}, {1, 1, 0, TIDE_DTYPE_BF16}, /* one rank */
    {1, 4, 0, TIDE_DTYPE_BF16}, {1, 3, 0, TIDE_DTYPE_FP32}, /* one node */
    {2, 2, 0, TIDE_DTYPE_FP32}, {2, 4, 0, TIDE_DTYPE_BF16}, /* one wave */
    {2, 2, 1, TIDE_DTYPE_BF16}, {3, 2, 0, TIDE_DTYPE_FP32}, /* two waves: M > W_wave */
    {4, 2, 1, TIDE_DTYPE_FP32}, {3, 4, 2, TIDE_DTYPE_BF16},
};

static void test_rs_specials(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); ++i)
        run_case(&CASES[i], 0xfeed0000u + i);
}

/* ------------------------------------------------------------------ signed zeros at M = 1 */

/*
 * Every gradient -0.0f.  At M = 1 the node partial is -0.0f; the landing has always added it
 * to the other L - 1 local ranks' +0.0f inbox rows, so for L >= 2 the value landed is
 * -0 + 0 = +0, and for L = 1 (one input) it stays -0.  The M = 1 program lands from the
 * owners' spares with one input and plus_zero (compile_rs.c), which must keep exactly these
 * bits: out = alpha v, or old + alpha v with old = -0.
 */
static void test_rs_signed_zero_one_node(void **state) {
    (void)state;
    static const int ls[] = {1, 2, 3, 4};
    for (size_t t = 0; t < sizeof(ls) / sizeof(ls[0]); ++t) {
        const int l = ls[t], n = l;
        tide_param_shape_t shapes[2] = {{(uint64_t)(3 * n), 5}, {(uint64_t)(2 * n), 3}};
        e2e_layout_t lay;
        e2e_layout_init(&lay, shapes, 2, n);
        const uint64_t elems = lay.eoff[2];
        float **grads[E2E_MAX_RANKS];
        float *prev[E2E_MAX_RANKS];
        for (int r = 0; r < n; ++r) {
            grads[r] = calloc(2, sizeof(float *));
            assert_non_null(grads[r]);
            for (int p = 0; p < 2; ++p) {
                const uint64_t g = shapes[p].dim0 * shapes[p].inner;
                grads[r][p] = malloc(g * sizeof(float));
                assert_non_null(grads[r][p]);
                for (uint64_t e = 0; e < g; ++e)
                    grads[r][p][e] = -0.0f;
            }
            prev[r] = malloc(elems * sizeof(float));
            assert_non_null(prev[r]);
            for (uint64_t e = 0; e < elems; ++e)
                prev[r][e] = -0.0f;
        }
        tide_comm_t comms[E2E_MAX_RANKS];
        assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, l, comms));
        e2e_job_t *j = calloc(1, sizeof(*j));
        assert_non_null(j);
        j->comms = comms;
        tide_config_t cfg = TIDE_CONFIG_INIT;
        cfg.nodes = 1;
        cfg.gpus_per_node = l;
        j->cfg = cfg;
        j->desc = (tide_group_desc_t){2, shapes, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32};
        j->out_elems = elems;
        j->grads = (void *const *const *)grads;
        const float alpha[4] = {1.0f, -1.0f, 1.0f, -1.0f};
        const int acc[4] = {0, 0, 1, 1};
        for (int c = 0; c < 4; ++c)
            j->rs[c] = (e2e_rs_call_t){alpha[c], acc[c], c % 2 ? TIDE_RS_SLOT_REUSE : TIDE_RS_IN_PLACE,
                                       acc[c] ? (float *const *)prev : NULL};
        j->num_rs = 4;
        e2e_job_run(j, n);
        /* v = -0 (L = 1) or +0; alpha = -1 flips it; accumulating adds it to -0. */
        const float v = l == 1 ? -0.0f : 0.0f;
        for (int c = 0; c < 4; ++c) {
            volatile float scaled = alpha[c] * v;
            const float want = acc[c] ? -0.0f + scaled : scaled;
            for (int r = 0; r < n; ++r)
                for (uint64_t e = 0; e < elems; ++e)
                    if (e2e_f32_bits(j->outs[c][r][e]) != e2e_f32_bits(want))
                        fail_msg("M=1 L=%d call %d rank %d element %llu: bits %08x, want %08x", l,
                                 c, r, (unsigned long long)e, e2e_f32_bits(j->outs[c][r][e]),
                                 e2e_f32_bits(want));
        }
        print_message("RS signed zeros M=1 L=%d: ok\n", l);
        e2e_job_free(j);
        free(j);
        for (int r = 0; r < n; ++r) {
            assert_tide(TIDE_SUCCESS, tide_comm_destroy(comms[r]));
            for (int p = 0; p < 2; ++p)
                free(grads[r][p]);
            free(grads[r]);
            free(prev[r]);
        }
    }
}

/* ------------------------------------------------------------------ the AG cast */

/* fp32 master value -> the bf16 bits the landing must hold. */
static const struct {
    uint32_t in;
    uint16_t out;
} CAST[] = {
    {0x7fc00000u, 0x7fffu}, /* quiet NaN -> canonical */
    {0x7fc00123u, 0x7fffu}, /* payload dropped */
    {0xffc00000u, 0x7fffu}, /* negative NaN */
    {0x7f800001u, 0x7fffu}, /* signalling NaN, payload only in the low half */
    {0x7f800000u, 0x7f80u}, /* +Inf */
    {0xff800000u, 0xff80u}, /* -Inf */
    {0x7f7fffffu, 0x7f80u}, /* FLT_MAX rounds up to +Inf */
    {0xff7fffffu, 0xff80u}, /* -FLT_MAX to -Inf */
    {0x7f7f8000u, 0x7f80u}, /* tie above the largest odd bf16: to even = Inf */
    {0x7f7f7fffu, 0x7f7fu}, /* just below that tie */
    {0x80000000u, 0x8000u}, /* -0 */
    {0x00000000u, 0x0000u}, /* +0 */
    {0x3f800000u, 0x3f80u}, /* 1 */
    {0x3f808000u, 0x3f80u}, /* 1 + 2^-8: tie, to even (down) */
    {0x3f818000u, 0x3f82u}, /* 1 + 3 2^-8: tie, to even (up) */
    {0x3f808001u, 0x3f81u}, /* just above a tie */
    {0x3f7fffffu, 0x3f80u}, /* just below 1 */
    {0x000116c2u, 0x0001u}, /* subnormal */
    {0x80400000u, 0x8040u}, /* negative subnormal, exact */
    {0xc0490fdbu, 0xc049u}, /* -pi */
};
#define NUM_CAST ((int)(sizeof(CAST) / sizeof(CAST[0])))

static void test_ag_cast_specials(void **state) {
    (void)state;
    static const int topo[][2] = {{1, 2}, {2, 2}, {3, 1}};
    for (int t = 0; t < 3; ++t) {
        const int m = topo[t][0], l = topo[t][1], n = m * l;
        /* Rank r's shard of parameter 0 holds every case, rotated by r; parameter 1 pads. */
        tide_param_shape_t shapes[2] = {{(uint64_t)(n * NUM_CAST), 1}, {(uint64_t)(n + 1), 2}};
        e2e_layout_t lay;
        e2e_layout_init(&lay, shapes, 2, n);
        const uint64_t elems = lay.eoff[2];
        uint8_t **shards = calloc((size_t)n, sizeof(uint8_t *));
        uint16_t *expected = calloc(elems * (uint64_t)n, sizeof(uint16_t));
        for (int r = 0; r < n; ++r) {
            float *s = calloc(elems, sizeof(float));
            for (int i = 0; i < NUM_CAST; ++i) {
                const int k = (i + r) % NUM_CAST;
                s[i] = f32_from(CAST[k].in);
                expected[(uint64_t)r * NUM_CAST + (uint64_t)i] = CAST[k].out;
            }
            for (uint64_t i = 0; i < lay.rows[1] * 2; ++i) { /* parameter 1: 2.0, padding 0 */
                if ((uint64_t)r * lay.rows[1] + i / 2 >= shapes[1].dim0) continue;
                s[lay.eoff[1] + i] = 2.0f;
                expected[(uint64_t)n * lay.eoff[1] + (uint64_t)r * lay.rows[1] * 2 + i] = 0x4000u;
            }
            shards[r] = (uint8_t *)s;
        }
        tide_comm_t comms[E2E_MAX_RANKS];
        assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, m, l, comms));
        e2e_job_t *j = calloc(1, sizeof(*j));
        assert_non_null(j);
        j->comms = comms;
        tide_config_t cfg = TIDE_CONFIG_INIT;
        cfg.nodes = m;
        cfg.gpus_per_node = l;
        j->cfg = cfg;
        j->desc = (tide_group_desc_t){2, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32};
        j->shard_in_bytes = elems * sizeof(float);
        j->landing_bytes = elems * (uint64_t)n * sizeof(uint16_t);
        j->out_elems = elems;
        j->num_ag = 2; /* both landing slots */
        for (int c = 0; c < 2; ++c) {
            j->ag_shards[c] = shards;
            j->ag_expected[c] = (const uint8_t *)expected;
        }
        e2e_job_run(j, n);
        print_message("AG cast M=%d L=%d: %d special values on every rank: ok\n", m, l, NUM_CAST);
        e2e_job_free(j);
        free(j);
        for (int r = 0; r < n; ++r) {
            assert_tide(TIDE_SUCCESS, tide_comm_destroy(comms[r]));
            free(shards[r]);
        }
        free(shards);
        free(expected);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rs_specials),
        cmocka_unit_test(test_rs_signed_zero_one_node),
        cmocka_unit_test(test_ag_cast_specials),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
