/* test_cpu_arith.c - the CPU fabric's vector sum, landing and cast give the bits of the C
 * references (kernels/reference.c) on random values, special values (NaN payloads, +-0,
 * +-Inf, subnormals), padding rows, odd lengths, fused stores, peer tables and NULL inputs. */
#include "test_util.h"

#include "fabric/cpu/cpu.h"
#include "kernels/kernels.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Mostly values whose sums depend on the order; one in eight a special pattern. */
static uint32_t rand_f32_bits(void) {
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                       0x7fc00001u, 0xffa00000u, 0x00000001u, 0x807fffffu,
                                       0x7f7fffffu, 0xff7fffffu};
    const uint64_t r = rng_next();
    if (r % 8 == 0) return special[(r >> 8) % (sizeof(special) / sizeof(special[0]))];
    const uint32_t exp = 127u - 20u + (uint32_t)((r >> 8) % 41u);
    return (uint32_t)((r >> 20) & 1u) << 31 | exp << 23 | ((uint32_t)(r >> 24) & 0x7fffffu);
}

static void fill(void *p, tide_dtype_t dt, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        const uint32_t u = rand_f32_bits();
        if (dt == TIDE_DTYPE_BF16) ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        else memcpy((float *)p + i, &u, 4);
    }
}

#define SEGS 5
#define MAXLEN 4200 /* past the 2048-element block, not a multiple of 8 */

static void check_sum(tide_dtype_t dt, int num_staged, bool peers, bool fused) {
    const size_t es = dt == TIDE_DTYPE_BF16 ? 2 : 4;
    tide_sum_seg_t segs[SEGS];
    tide_sum_fused_t fz[SEGS];
    uint64_t out_off = 0, own_off = 0;
    for (int s = 0; s < SEGS; ++s) {
        const uint32_t len = s == 0 ? 0 : s == 1 ? 7 : s == 2 ? MAXLEN : (uint32_t)(rng_next() % 3000);
        segs[s] = (tide_sum_seg_t){.out_off = out_off, .stage_off = out_off, .own_off = own_off,
                                   .len = len, .valid = s == 3 ? len / 2 : s == 4 ? len + 5 : len,
                                   .own_idx = s % 2};
        out_off += len;
        own_off += len + 3;
    }
    const size_t total = (size_t)out_off, own_n = (size_t)own_off + 8;
    void *own[2] = {malloc(own_n * es), malloc(own_n * es)};
    void *staged = malloc((size_t)(num_staged + 1) * total * es + 8);
    const void *peer_tab[2 * TIDE_MAX_GPUS_PER_NODE];
    void *peer_bufs[2 * TIDE_MAX_GPUS_PER_NODE] = {0};
    fill(own[0], dt, own_n), fill(own[1], dt, own_n);
    fill(staged, dt, (size_t)(num_staged + 1) * total);
    for (int k = 0; k < num_staged && peers; ++k)
        for (int i = 0; i < 2; ++i) {
            peer_bufs[k * 2 + i] = malloc(own_n * es);
            fill(peer_bufs[k * 2 + i], dt, own_n);
            peer_tab[k * 2 + i] = peer_bufs[k * 2 + i];
        }
    float *ref = malloc(total * 4 + 4), *got = malloc(total * 4 + 4);
    fill(ref, TIDE_DTYPE_FP32, total);
    memcpy(got, ref, total * 4);
    for (int s = 0; s < SEGS; ++s) {
        uint32_t a = rand_f32_bits();
        float alpha;
        memcpy(&alpha, &a, 4);
        fz[s] = (tide_sum_fused_t){.dst = NULL, .alpha = s == 1 ? -0.5f : alpha,
                                   .overwrite = (uint8_t)(s % 2), .plus_zero = (uint8_t)(s >= 2)};
    }
    tide_sum_args_t args = {.segs = segs, .num_segs = SEGS, .staged = staged,
                            .stage_stride = total, .num_staged = num_staged,
                            .own = (const void *const *)own, .dtype = dt,
                            .peers = peers ? peer_tab : NULL, .peer_stride = 2};
    tide_sum_fused_t fz_ref[SEGS], fz_got[SEGS];
    for (int s = 0; s < SEGS; ++s) {
        fz_ref[s] = fz[s], fz_ref[s].dst = ref + segs[s].out_off;
        fz_got[s] = fz[s], fz_got[s].dst = got + segs[s].out_off;
    }
    args.out = ref, args.fused = fused ? fz_ref : NULL;
    tide_ref_sum(&args);
    args.out = got, args.fused = fused ? fz_got : NULL;
    tide_cpu_sum(&args);
    assert_memory_equal(ref, got, total * 4);
    free(ref), free(got), free(own[0]), free(own[1]), free(staged);
    for (int i = 0; i < 2 * TIDE_MAX_GPUS_PER_NODE; ++i) free(peer_bufs[i]);
}

static void test_sum_matches_reference(void **state) {
    (void)state;
    const tide_dtype_t dts[2] = {TIDE_DTYPE_BF16, TIDE_DTYPE_FP32};
    for (int d = 0; d < 2; ++d)
        for (int staged = 0; staged < TIDE_MAX_GPUS_PER_NODE; staged += 3)
            for (int f = 0; f < 2; ++f) {
                check_sum(dts[d], staged, false, f);
                if (staged > 0) check_sum(dts[d], staged, true, f);
            }
}

static void check_land(int num_in, bool table, bool init, bool accumulate, bool plus_zero) {
    tide_land_seg_t segs[3] = {{0, 0, 9, 0}, {9, 20, MAXLEN, 0}, {9 + MAXLEN, 5, 0, 0}};
    const size_t total = 9 + MAXLEN, in_n = MAXLEN + 32;
    float *in[TIDE_MAX_GPUS_PER_NODE] = {0};
    const float *tab[3 * TIDE_MAX_GPUS_PER_NODE];
    for (int k = 0; k < num_in; ++k) {
        in[k] = malloc(in_n * 4);
        fill(in[k], TIDE_DTYPE_FP32, in_n);
        /* -0 inputs: plus_zero must turn a one-input -0 into +0, as the reference does. */
        for (size_t i = 0; i < in_n; i += 4)
            in[k][i] = -0.0f;
    }
    for (int s = 0; s < 3; ++s)
        for (int k = 0; k < num_in; ++k) /* every third entry an input known to be +0 */
            tab[s * num_in + k] = (s + k) % 3 == 1 ? NULL : in[k] + segs[s].in_off;
    float *ref = malloc(total * 4), *got = malloc(total * 4);
    fill(ref, TIDE_DTYPE_FP32, total);
    memcpy(got, ref, total * 4);
    tide_land_args_t args = {.segs = segs, .num_segs = 3, .num_in = num_in, .alpha = 0.125f,
                             .init = init, .accumulate = accumulate, .plus_zero = plus_zero,
                             .in_table = table ? tab : NULL};
    for (int k = 0; k < num_in; ++k) args.in[k] = in[k];
    args.out = ref;
    tide_ref_land(&args);
    args.out = got;
    tide_cpu_land(&args);
    assert_memory_equal(ref, got, total * 4);
    for (int k = 0; k < num_in; ++k) free(in[k]);
    free(ref), free(got);
}

static void test_land_matches_reference(void **state) {
    (void)state;
    for (int n = 1; n <= TIDE_MAX_GPUS_PER_NODE; n += 3)
        for (int t = 0; t < 2; ++t)
            for (int m = 0; m < 3; ++m)
                for (int z = 0; z < 2; ++z) check_land(n, t, m > 0, m == 2, z == 1);
}

static void test_cast_matches_reference(void **state) {
    (void)state;
    const size_t n = 4099;
    float *in = malloc(n * 4);
    uint16_t *ref = malloc(n * 2), *got = malloc(n * 2);
    fill(in, TIDE_DTYPE_FP32, n);
    /* Every rounding case of the dropped half: below, at and above the tie, odd and even. */
    const uint32_t ties[] = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f7f8000u};
    memcpy(in, ties, sizeof(ties));
    tide_ref_cast_bf16(in, ref, n);
    tide_cpu_cast_bf16(in, got, n);
    assert_memory_equal(ref, got, n * 2);
    free(in), free(ref), free(got);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_matches_reference),
        cmocka_unit_test(test_land_matches_reference),
        cmocka_unit_test(test_cast_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
