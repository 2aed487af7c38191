/* test_reference.c - the C references of the kernels against brute-force definitions. */
#include "test_util.h"

#include <math.h>

#include "kernels/kernels.h"

/* ------------------------------------------------------------------ helpers */

static uint32_t fbits(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static float ffrom(uint32_t u) {
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void) {
    /* splitmix64: deterministic across platforms, so a failure reproduces. */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A finite float with a random sign, mantissa and an exponent in [-20, 20]: sums of such
 * values depend on the association order. */
static float rand_wide(void) {
    uint64_t r = rng_next();
    uint32_t exp = 127u - 20u + (uint32_t)(r % 41u);
    uint32_t man = (uint32_t)(r >> 8) & 0x7fffffu;
    uint32_t sign = (uint32_t)(r >> 40) & 1u;
    return ffrom((sign << 31) | (exp << 23) | man);
}

/* The value of a non-NaN bf16 pattern from its fields, in fp64.  With `unbounded` the Inf
 * pattern reads as 2^128, the next step of the exponent range, which is how IEEE rounding
 * decides overflow. */
static double bf16_value_ex(uint16_t b, int unbounded) {
    int sign = b >> 15, exp = (b >> 7) & 0xff, man = b & 0x7f;
    double v = exp == 0 ? ldexp(man, -133) : ldexp(128 + man, exp - 134);
    if (exp == 0xff && !unbounded) v = INFINITY;
    return sign ? -v : v;
}

static double bf16_value(uint16_t b) {
    return bf16_value_ex(b, 0);
}

/* RNE to bf16 by definition: the nearest of the two bf16 neighbours, ties to the even one. */
static uint16_t bf16_rne_brute(float x) {
    if (isnan(x)) return 0x7fff;
    uint16_t lo = (uint16_t)(fbits(x) >> 16); /* truncation: toward zero */
    if ((fbits(x) & 0xffffu) == 0) return lo;
    uint16_t hi = (uint16_t)(lo + 1); /* next away from zero (may be Inf) */
    double dl = fabs((double)x - bf16_value_ex(lo, 1));
    double dh = fabs((double)x - bf16_value_ex(hi, 1));
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo & 1u) ? hi : lo;
}

/* Sum in the contract's order, one statement per rounding. */
static float sum_in_order(const float *v, int n) {
    volatile float acc = v[0];
    for (int i = 1; i < n; ++i)
        acc = acc + v[i];
    return acc;
}

/* ------------------------------------------------------------------ bf16 */

static void test_bf16_widen_exact(void **state) {
    (void)state;
    for (uint32_t b = 0; b < 0x10000u; ++b) {
        float f = tide_bf16_to_float((uint16_t)b);
        int exp = (b >> 7) & 0xff, man = b & 0x7f;
        if (exp == 0xff && man != 0) {
            assert_true(isnan(f));
        } else {
            assert_true((double)f == bf16_value((uint16_t)b));
            assert_int_equal(signbit(f) != 0, (b >> 15) != 0);
        }
    }
}

static void test_bf16_round_trip(void **state) {
    (void)state;
    for (uint32_t b = 0; b < 0x10000u; ++b) {
        float f = tide_bf16_to_float((uint16_t)b);
        if (isnan(f))
            assert_int_equal(tide_float_to_bf16(f), 0x7fff);
        else
            assert_int_equal(tide_float_to_bf16(f), b);
    }
}

static void test_bf16_rne_random_and_ties(void **state) {
    (void)state;
    for (int i = 0; i < 200000; ++i) {
        float x = ffrom((uint32_t)rng_next());
        assert_int_equal(tide_float_to_bf16(x), bf16_rne_brute(x));
    }
    /* Exact halves: the even neighbour wins, in both directions. */
    assert_int_equal(tide_float_to_bf16(ffrom(0x3f808000u)), 0x3f80); /* 1 + 2^-8 -> 1 */
    assert_int_equal(tide_float_to_bf16(ffrom(0x3f818000u)), 0x3f82);
    assert_int_equal(tide_float_to_bf16(ffrom(0xbf808000u)), 0xbf80);
    assert_int_equal(tide_float_to_bf16(ffrom(0xbf818000u)), 0xbf82);
    assert_int_equal(tide_float_to_bf16(ffrom(0x3f808001u)), 0x3f81); /* just past half */
    assert_int_equal(tide_float_to_bf16(ffrom(0x3f807fffu)), 0x3f80); /* just below */
    /* Subnormals round like normals; the carry out of the mantissa reaches the exponent. */
    assert_int_equal(tide_float_to_bf16(ffrom(0x00008000u)), 0x0000);
    assert_int_equal(tide_float_to_bf16(ffrom(0x00018000u)), 0x0002);
    assert_int_equal(tide_float_to_bf16(ffrom(0x3fffffffu)), 0x4000);
    /* Inf stays Inf; the largest floats overflow to Inf as RNE must; NaN becomes quiet. */
    assert_int_equal(tide_float_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(tide_float_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(tide_float_to_bf16(ffrom(0x7f7fffffu)), 0x7f80);
    assert_int_equal(tide_float_to_bf16(ffrom(0x7f7f7fffu)), 0x7f7f);
    assert_int_equal(tide_float_to_bf16(ffrom(0x7f800001u)), 0x7fff); /* signalling */
    assert_int_equal(tide_float_to_bf16(ffrom(0xffc00000u)), 0x7fff);
    assert_int_equal(tide_float_to_bf16(-0.0f), 0x8000);
}

static void test_cast_array(void **state) {
    (void)state;
    enum { N = 1000 };
    float in[N];
    uint16_t out[N + 1];
    for (int i = 0; i < N; ++i)
        in[i] = ffrom((uint32_t)rng_next());
    in[3] = NAN;
    in[4] = -INFINITY;
    memset(out, 0xab, sizeof out);
    tide_ref_cast_bf16(in, out, N);
    for (int i = 0; i < N; ++i)
        assert_int_equal(out[i], bf16_rne_brute(in[i]));
    assert_int_equal(out[N], 0xabab); /* nothing past n */
    tide_ref_cast_bf16(in, out, 0);
    assert_int_equal(out[0], bf16_rne_brute(in[0]));
}

/* ------------------------------------------------------------------ Level-1 sum */

/* One output element: num_staged staged values (stride 1), then own[0][0], into *out. */
static const tide_sum_seg_t one_seg = {.len = 1, .valid = 1};
static tide_sum_args_t one_sum(const void *staged, int num_staged, const void *const *own,
                               tide_dtype_t dtype, float *out) {
    return (tide_sum_args_t){.segs = &one_seg,
                             .num_segs = 1,
                             .staged = staged,
                             .stage_stride = 1,
                             .num_staged = num_staged,
                             .own = own,
                             .dtype = dtype,
                             .out = out};
}

static void test_sum_association_order(void **state) {
    (void)state;
    /* 2^24 + 1 + 1 + 1 in the contract's order: each +1 is a tie that rounds back to 2^24,
     * where the exact sum rounds to 2^24 + 4. */
    float staged[3] = {16777216.0f, 1.0f, 1.0f};
    float own_v[1] = {1.0f};
    const void *own[1] = {own_v};
    float out = -1.0f;
    const tide_sum_args_t a = one_sum(staged, 3, own, TIDE_DTYPE_FP32, &out);
    tide_ref_sum(&a);
    assert_true(out == 16777216.0f);

    /* Own last, not first: own + 1 + 1 + 1 would stay 2^24. */
    staged[0] = staged[1] = staged[2] = 1.0f;
    own_v[0] = 16777216.0f;
    tide_ref_sum(&a);
    assert_true(out == 16777220.0f); /* (1+1+1) + 2^24 = 2^24 + 3 -> 2^24 + 4 */

    /* Random wide-range values, every L: equal to the explicit order, and the data is
     * chosen so that the reverse order disagrees somewhere (the check has teeth). */
    enum { N = 512 };
    static float st[7 * N], ow[N], got[N];
    for (int ns = 0; ns <= 7; ++ns) {
        for (int i = 0; i < 7 * N; ++i)
            st[i] = rand_wide();
        for (int i = 0; i < N; ++i)
            ow[i] = rand_wide();
        const void *owt[1] = {ow};
        tide_sum_seg_t s2 = {.len = N, .valid = N};
        tide_sum_args_t b = {.segs = &s2,
                             .num_segs = 1,
                             .staged = st,
                             .stage_stride = N,
                             .num_staged = ns,
                             .own = owt,
                             .dtype = TIDE_DTYPE_FP32,
                             .out = got};
        tide_ref_sum(&b);
        int reverse_differs = 0;
        for (int i = 0; i < N; ++i) {
            float v[8], r[8];
            for (int k = 0; k < ns; ++k)
                v[k] = st[k * N + i];
            v[ns] = ow[i];
            for (int k = 0; k <= ns; ++k)
                r[k] = v[ns - k];
            float want = sum_in_order(v, ns + 1);
            assert_int_equal(fbits(got[i]), fbits(want));
            reverse_differs |= fbits(sum_in_order(r, ns + 1)) != fbits(want);
        }
        if (ns >= 2) assert_true(reverse_differs);
    }
}

/* Segments with offsets, strides, several own tensors, padding and untouched gaps; inputs are
 * small integers, so every sum is exact and the fp64 sum is the brute-force answer. */
static void test_sum_segments_padding_exact(void **state) {
    (void)state;
    enum { STRIDE = 1000, OWN_N = 600, OUT_N = 700 };
    for (int dt = 0; dt < 2; ++dt) {
        const tide_dtype_t dtype = dt ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
        const int ns = 5;
        static uint16_t st16[6 * STRIDE], ow16[2][OWN_N];
        static float st32[6 * STRIDE], ow32[2][OWN_N], out[OUT_N];
        double stv[6 * STRIDE], owv[2][OWN_N];
        for (int i = 0; i < 6 * STRIDE; ++i) {
            stv[i] = (double)((int)(rng_next() % 201) - 100);
            st32[i] = (float)stv[i];
            st16[i] = tide_float_to_bf16(st32[i]);
        }
        for (int t = 0; t < 2; ++t)
            for (int i = 0; i < OWN_N; ++i) {
                owv[t][i] = (double)((int)(rng_next() % 201) - 100);
                ow32[t][i] = (float)owv[t][i];
                ow16[t][i] = tide_float_to_bf16(ow32[t][i]);
            }
        const void *own[2] = {dt ? (const void *)ow32[0] : ow16[0],
                              dt ? (const void *)ow32[1] : ow16[1]};
        const tide_sum_seg_t segs[] = {
            {.out_off = 0, .stage_off = 0, .own_off = 0, .len = 100, .valid = 100, .own_idx = 0},
            {.out_off = 100, .stage_off = 300, .own_off = 17, .len = 37, .valid = 30, .own_idx = 1},
            {.out_off = 150, .stage_off = 5, .own_off = 400, .len = 0, .valid = 0, .own_idx = 0},
            {.out_off = 150, .stage_off = 901, .own_off = 599, .len = 9, .valid = 1, .own_idx = 0},
            {.out_off = 200, .stage_off = 0, .own_off = 0, .len = 64, .valid = 0, .own_idx = 7},
            {.out_off = 300,
             .stage_off = 500,
             .own_off = 100,
             .len = 400,
             .valid = 400,
             .own_idx = 1},
        };
        const int nsegs = (int)(sizeof segs / sizeof segs[0]);
        for (int i = 0; i < OUT_N; ++i)
            out[i] = ffrom(0xffc0dead);
        tide_sum_args_t a = {.segs = segs,
                             .num_segs = nsegs,
                             .staged = dt ? (const void *)st32 : st16,
                             .stage_stride = STRIDE,
                             .num_staged = ns,
                             .own = own,
                             .dtype = dtype,
                             .out = out};
        tide_ref_sum(&a);
        static char touched[OUT_N];
        memset(touched, 0, sizeof touched);
        for (int s = 0; s < nsegs; ++s) {
            for (uint32_t i = 0; i < segs[s].len; ++i) {
                const uint64_t o = segs[s].out_off + i;
                touched[o] = 1;
                if (i >= segs[s].valid) {
                    assert_int_equal(fbits(out[o]), 0); /* +0, not -0 */
                    continue;
                }
                double want = owv[segs[s].own_idx][segs[s].own_off + i];
                for (int k = 0; k < ns; ++k)
                    want += stv[k * STRIDE + segs[s].stage_off + i];
                assert_true((double)out[o] == want);
            }
        }
        for (int i = 0; i < OUT_N; ++i)
            if (!touched[i]) assert_int_equal(fbits(out[i]), 0xffc0dead);
    }
}

static void test_sum_special_values(void **state) {
    (void)state;
    /* One element per case; L = 3 (two staged + own). */
    const float cases[][4] = {
        /* s0, s1, own, expected (NaN encoded as canonical) */
        {1.0f, NAN, 2.0f, NAN},
        {INFINITY, 1.0f, -5.0f, INFINITY},
        {-INFINITY, 3.0f, 1e30f, -INFINITY},
        {INFINITY, -INFINITY, 0.0f, NAN},
        {3e38f, 3e38f, -3e38f, INFINITY}, /* overflow is not undone by a later add */
        {-0.0f, -0.0f, -0.0f, -0.0f},
        {-0.0f, 0.0f, -0.0f, 0.0f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        float st[2] = {cases[c][0], cases[c][1]}, ow[1] = {cases[c][2]}, out = 1.0f;
        const void *own[1] = {ow};
        const tide_sum_args_t a = one_sum(st, 2, own, TIDE_DTYPE_FP32, &out);
        tide_ref_sum(&a);
        if (isnan(cases[c][3]))
            assert_int_equal(fbits(out), 0x7fffffffu);
        else
            assert_int_equal(fbits(out), fbits(cases[c][3]));
    }
    /* bf16 NaN payloads and signs, L = 1 and L = 2: the result is the canonical NaN. */
    const uint16_t nans[] = {0x7fc0, 0xffc1, 0x7f81};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; ++i) {
        for (int ns = 0; ns <= 1; ++ns) {
            uint16_t st[1] = {0x3f80}, ow[1] = {nans[i]};
            float out = 1.0f;
            const void *own[1] = {ow};
            const tide_sum_args_t a = one_sum(st, ns, own, TIDE_DTYPE_BF16, &out);
            tide_ref_sum(&a);
            assert_int_equal(fbits(out), 0x7fffffffu);
        }
    }
}

static void test_sum_empty_is_noop(void **state) {
    (void)state;
    float out = 5.0f;
    tide_sum_args_t a = {
        .segs = NULL, .num_segs = 0, .num_staged = 1, .dtype = TIDE_DTYPE_BF16, .out = &out};
    tide_ref_sum(&a);
    tide_ref_sum(NULL);
    assert_true(out == 5.0f);
    tide_land_args_t l = {.segs = NULL, .num_segs = 0, .num_in = 1, .out = &out, .alpha = 1.0f};
    tide_ref_land(&l);
    tide_ref_land(NULL);
    assert_true(out == 5.0f);
}

/* ------------------------------------------------------------------ landing */

static float land_brute(const float *v, int n, float alpha, bool init, bool accumulate, float old) {
    volatile float s = sum_in_order(v, n);
    volatile float scaled = alpha * s;
    volatile float r = (init && !accumulate) ? scaled : old + scaled;
    return isnan(r) ? ffrom(0x7fffffffu) : r;
}

static void test_land_modes_and_order(void **state) {
    (void)state;
    enum { N = 300, L = 8 };
    static float in[L][N + 10], out[N + 20], old[N + 20];
    for (int l = 1; l <= L; ++l) {
        for (int mode = 0; mode < 4; ++mode) {
            const bool init = mode & 1, accumulate = (mode >> 1) & 1;
            const float alpha = (mode == 3) ? 0.125f : rand_wide();
            for (int k = 0; k < l; ++k)
                for (int i = 0; i < N + 10; ++i)
                    in[k][i] = rand_wide();
            for (int i = 0; i < N + 20; ++i)
                old[i] = out[i] = rand_wide();
            out[0] = old[0] = NAN; /* ignored only when initialising without accumulate */
            const tide_land_seg_t segs[] = {{.out_off = 0, .in_off = 3, .len = 100},
                                            {.out_off = 120, .in_off = 200, .len = 110},
                                            {.out_off = 240, .in_off = 0, .len = 0}};
            tide_land_args_t a = {.segs = segs,
                                  .num_segs = 3,
                                  .num_in = l,
                                  .out = out,
                                  .alpha = alpha,
                                  .init = init,
                                  .accumulate = accumulate};
            for (int k = 0; k < l; ++k)
                a.in[k] = in[k];
            tide_ref_land(&a);
            for (int i = 0; i < N + 20; ++i) {
                const tide_land_seg_t *sg = NULL;
                for (int s = 0; s < 3; ++s)
                    if ((uint64_t)i >= segs[s].out_off &&
                        (uint64_t)i < segs[s].out_off + segs[s].len)
                        sg = &segs[s];
                if (sg == NULL) {
                    assert_int_equal(fbits(out[i]), fbits(old[i]));
                    continue;
                }
                float v[L];
                for (int k = 0; k < l; ++k)
                    v[k] = in[k][sg->in_off + (uint64_t)i - sg->out_off];
                float want = land_brute(v, l, alpha, init, accumulate, old[i]);
                assert_int_equal(fbits(out[i]), fbits(want));
            }
            if (init && !accumulate)
                assert_false(isnan(out[0]));
            else
                assert_int_equal(fbits(out[0]), 0x7fffffffu);
        }
    }
}

static void test_land_no_fma(void **state) {
    (void)state;
    /* alpha*v = (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 rounds (tie to even) to 1 + 2^-11, and
     * old = -(1 + 2^-11) cancels it exactly; a fused multiply-add would leave 2^-24. */
    float in0 = 1.0f + 0x1p-12f, out = -(1.0f + 0x1p-11f);
    tide_land_seg_t seg = {.len = 1};
    tide_land_args_t a = {.segs = &seg,
                          .num_segs = 1,
                          .num_in = 1,
                          .out = &out,
                          .alpha = 1.0f + 0x1p-12f,
                          .init = false};
    a.in[0] = &in0;
    tide_ref_land(&a);
    assert_int_equal(fbits(out), 0);
    /* The inbox blocks are summed in GPU order before alpha: 2^24 + 1 + 1 stays 2^24. */
    float b0 = 16777216.0f, b1 = 1.0f, b2 = 1.0f;
    out = 7.0f;
    a.num_in = 3;
    a.in[0] = &b0;
    a.in[1] = &b1;
    a.in[2] = &b2;
    a.alpha = 0.5f;
    a.init = true;
    tide_ref_land(&a);
    assert_true(out == 8388608.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_widen_exact),
        cmocka_unit_test(test_bf16_round_trip),
        cmocka_unit_test(test_bf16_rne_random_and_ties),
        cmocka_unit_test(test_cast_array),
        cmocka_unit_test(test_sum_association_order),
        cmocka_unit_test(test_sum_segments_padding_exact),
        cmocka_unit_test(test_sum_special_values),
        cmocka_unit_test(test_sum_empty_is_noop),
        cmocka_unit_test(test_land_modes_and_order),
        cmocka_unit_test(test_land_no_fma),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
