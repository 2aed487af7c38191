/* test_memory.c - closed-form memory bounds (eqs. 10-12) and the exact arena layout (§5.4). */
#include "test_util.h"

#include "core/checks.h"
#include "plan/plan.h"

#include <limits.h>
#include <math.h>

static void assert_close(double got, double want) {
    if (fabs(got - want) > 1e-12 * fmax(1.0, fabs(want)))
        fail_msg("got %.17g, want %.17g", got, want);
}

/* ------------------------------------------------------------------ closed-form bounds */

/* The paper's figures at M = 64, L = 8, n_par = 2, k = 4 (§5.4, §7.4, abstract). */
static void test_bounds_paper_figures(void **state) {
    (void)state;
    tide_memory_bounds_t b;
    assert_tide(TIDE_SUCCESS, tide_memory_bounds(64, 8, 4, 2, &b));
    assert_close(b.in_place_staging_ns, 0.59375);
    assert_close(b.slot_reuse_staging_ns, 0.1640625);
    assert_close(b.in_place_total_ns, 3.71875);
    assert_close(b.slot_reuse_total_ns, 2.2890625);
    assert_close(b.fsdp2_total_ns, 4.0);
    /* as printed: 0.594, 0.164, 3.72, 2.29 */
    assert_close(round(b.in_place_staging_ns * 1000.0), 594.0);
    assert_close(round(b.slot_reuse_staging_ns * 1000.0), 164.0);
    assert_close(round(b.in_place_total_ns * 100.0), 372.0);
    assert_close(round(b.slot_reuse_total_ns * 100.0), 229.0);
}

/* Eqs. (11) and (12) as printed for L = 8, written out independently of the library. */
static double eq11_l8(int m, int n_par) {
    return 0.5 + (2.0 * n_par + 2.0) / m;
}
static double eq12_l8(int m, int k, int n_par) {
    return (2.0 * k + 4.0 * n_par + 5.0) / (2.0 * m);
}

static void test_bounds_eqs_11_12(void **state) {
    (void)state;
    for (int m = 1; m <= 300; ++m)
        for (int k = 1; k <= 8; ++k)
            for (int n_par = 1; n_par <= 2; ++n_par) {
                tide_memory_bounds_t b;
                assert_tide(TIDE_SUCCESS, tide_memory_bounds(m, 8, k, n_par, &b));
                assert_close(b.in_place_staging_ns, eq11_l8(m, n_par));
                assert_close(b.slot_reuse_staging_ns, eq12_l8(m, k, n_par));
                /* ring slots + receive stage: 2 + 1/8 */
                assert_close(b.in_place_total_ns, 2.125 + eq11_l8(m, n_par) + 1.0);
                assert_close(b.slot_reuse_total_ns, 2.125 + eq12_l8(m, k, n_par));
                assert_close(b.fsdp2_total_ns, 4.0);
            }
    /* At fixed k, In-Place tends to N S / 2 and Slot-Reuse decays like k / M. */
    tide_memory_bounds_t b;
    assert_tide(TIDE_SUCCESS, tide_memory_bounds(1 << 20, 8, 4, 2, &b));
    assert_true(b.in_place_staging_ns > 0.5 && b.in_place_staging_ns < 0.50001);
    assert_true(b.slot_reuse_staging_ns < 1e-4);
}

static void test_bounds_invalid(void **state) {
    (void)state;
    const int bad[][4] = {{0, 8, 4, 2}, {-1, 8, 4, 2}, {INT_MIN, 8, 4, 2}, {4, 0, 4, 2},
                          {4, 9, 4, 2}, {4, -1, 4, 2}, {4, 8, 0, 2},       {4, 8, -2, 2},
                          {4, 8, 4, 0}, {4, 8, 4, 3},  {4, 8, 4, -1}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        tide_memory_bounds_t b, ref;
        memset(&b, 0x5a, sizeof(b));
        memset(&ref, 0x5a, sizeof(ref));
        assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                    tide_memory_bounds(bad[i][0], bad[i][1], bad[i][2], bad[i][3], &b));
        assert_true(strlen(tide_get_last_error()) > 0);
        assert_memory_equal(&b, &ref, sizeof(b));
    }
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_memory_bounds(4, 8, 4, 2, NULL));
    assert_true(strlen(tide_get_last_error()) > 0);
    /* A successful public call clears the previous error. */
    tide_memory_bounds_t b;
    assert_tide(TIDE_SUCCESS, tide_memory_bounds(1, 1, 1, 1, &b));
    assert_string_equal(tide_get_last_error(), "");
}

/* ------------------------------------------------------------------ arena layout */

static void test_region_names(void **state) {
    (void)state;
    const char *names[TIDE_REGION_COUNT] = {"landing0", "landing1", "recv_stage",
                                            "resident", "staging",  "outbox",
                                            "spare",    "inbox",    "signals"};
    for (int i = 0; i < TIDE_REGION_COUNT; ++i)
        assert_string_equal(tide_region_name((tide_region_t)i), names[i]);
    assert_string_equal(tide_region_name(TIDE_REGION_COUNT), "unknown");
    assert_string_equal(tide_region_name((tide_region_t)-1), "unknown");
    assert_string_equal(tide_region_name((tide_region_t)1000), "unknown");
}

typedef struct {
    tide_topo_t topo;
    tide_geom_t geom;
    tide_rs_schedule_t rs;
    tide_param_shape_t shapes[4];
} fixture_t;

static void fixture_init(fixture_t *f, int m, int l, tide_dtype_t ag, tide_dtype_t grad,
                         tide_dtype_t shard, int n_stg, int n_out, int n_par, uint64_t e_sub) {
    memset(f, 0, sizeof(*f));
    assert_tide(TIDE_SUCCESS, tide_topo_init(m, l, &f->topo));
    const uint64_t n = (uint64_t)f->topo.ranks;
    f->shapes[0] = (tide_param_shape_t){3 * n + 1, 96};
    f->shapes[1] = (tide_param_shape_t){n, 128};
    f->shapes[2] = (tide_param_shape_t){1, 4};
    f->shapes[3] = (tide_param_shape_t){5 * n, 32};
    tide_group_desc_t group = {4, f->shapes, ag, grad, shard};
    assert_tide(TIDE_SUCCESS, tide_geom_build(&f->topo, &group, &f->geom));
    f->rs.nodes = m;
    f->rs.gpus_per_node = l;
    f->rs.staging_slots = n_stg;
    f->rs.outbox_depth = n_out;
    f->rs.inbox_generations = n_par;
    f->rs.subslice_elems = e_sub;
}

/*
 * Structural properties of any layout: regions in enum order, each at the first aligned
 * offset at or after the previous end, pairwise disjoint, total = end of the last one.
 */
static void check_layout_structure(const tide_arena_layout_t *a) {
    uint64_t end = 0;
    for (int i = 0; i < TIDE_REGION_COUNT; ++i) {
        const tide_region_info_t *r = &a->regions[i];
        assert_int_equal(r->offset % TIDE_ARENA_ALIGN, 0);
        assert_true(r->offset >= end);
        assert_true(r->offset - end < TIDE_ARENA_ALIGN); /* no wasted page */
        end = r->offset + r->bytes;
    }
    assert_int_equal(a->total_bytes, end);
    for (int i = 0; i < TIDE_REGION_COUNT; ++i)
        for (int j = i + 1; j < TIDE_REGION_COUNT; ++j) {
            const tide_region_info_t *x = &a->regions[i], *y = &a->regions[j];
            if (x->bytes == 0 || y->bytes == 0) continue;
            assert_true(x->offset + x->bytes <= y->offset || y->offset + y->bytes <= x->offset);
        }
}

static void test_arena_layout_sizes(void **state) {
    (void)state;
    const int topos[][2] = {{1, 1}, {1, 8}, {2, 4}, {4, 8}, {9, 8}, {64, 8}, {3, 1}};
    const tide_dtype_t B = TIDE_DTYPE_BF16, F = TIDE_DTYPE_FP32;
    const tide_dtype_t dts[][3] = {{B, B, B}, {B, F, F}, {F, F, F}, {B, B, F}};
    for (size_t t = 0; t < sizeof(topos) / sizeof(topos[0]); ++t)
        for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); ++d) {
            const int m = topos[t][0], l = topos[t][1];
            const int n_stg = 1 + (int)(t % 3), n_out = (int)(m - 1 + d), n_par = 1 + (int)(d % 2);
            const uint64_t e_sub = 4 * (100 + 7 * t + d);
            fixture_t f;
            fixture_init(&f, m, l, dts[d][0], dts[d][1], dts[d][2], n_stg, n_out, n_par, e_sub);
            tide_arena_layout_t a;
            assert_tide(TIDE_SUCCESS, tide_arena_layout(&f.topo, &f.geom, &f.rs, &a));
            check_layout_structure(&a);

            const uint64_t S = f.geom.shard_bytes, NS = f.geom.group_bytes;
            const uint64_t b_grad = dts[d][1] == B ? 2 : 4, L = (uint64_t)l, M = (uint64_t)m;
            const bool cast = dts[d][0] != dts[d][2];
            const tide_region_info_t *r = a.regions;
            assert_int_equal(r[TIDE_REGION_LANDING0].offset, 0);
            assert_int_equal(r[TIDE_REGION_LANDING0].bytes, NS);
            assert_int_equal(r[TIDE_REGION_LANDING1].bytes, NS);
            assert_int_equal(r[TIDE_REGION_RECV_STAGE].bytes, (cast ? M : M - 1) * S);
            assert_int_equal(r[TIDE_REGION_RESIDENT].bytes, cast ? 0 : S);
            /* one staging slot: L - 1 peers x L sub-slices x E_sub gradient items */
            assert_int_equal(r[TIDE_REGION_STAGING].bytes, n_stg * (L - 1) * L * e_sub * b_grad);
            /* an fp32 block is L rows of E_sub */
            const uint64_t block = L * e_sub * 4;
            assert_int_equal(r[TIDE_REGION_OUTBOX].bytes, 2 * (uint64_t)n_out * block);
            assert_int_equal(r[TIDE_REGION_SPARE].bytes, 2 * block);
            /* no inbox at M = 1: the landings read the owners' spares */
            assert_int_equal(r[TIDE_REGION_INBOX].bytes, M > 1 ? (uint64_t)n_par * L * block : 0);
            /* one spare per bank and pass */
            f.rs.passes = 3;
            tide_arena_layout_t a3;
            assert_tide(TIDE_SUCCESS, tide_arena_layout(&f.topo, &f.geom, &f.rs, &a3));
            assert_int_equal(a3.regions[TIDE_REGION_SPARE].bytes, 2 * 3 * block);
            f.rs.passes = 0;
            assert_int_equal(r[TIDE_REGION_SIGNALS].bytes, 8 * TIDE_ARENA_SIGNAL_SLOTS);
            if (l == 1) assert_int_equal(r[TIDE_REGION_STAGING].bytes, 0);
            tide_geom_free(&f.geom);
        }
}

/* Zero-size regions keep aligned offsets and never shift later regions off the page grid. */
static void test_arena_empty_regions(void **state) {
    (void)state;
    fixture_t f;
    /* M = 1, no cast: no receive stage; L = 1: no staging; n_out = 0: no outbox. */
    fixture_init(&f, 1, 1, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, 2, 0, 1, 4);
    tide_arena_layout_t a;
    assert_tide(TIDE_SUCCESS, tide_arena_layout(&f.topo, &f.geom, &f.rs, &a));
    check_layout_structure(&a);
    assert_int_equal(a.regions[TIDE_REGION_RECV_STAGE].bytes, 0);
    assert_int_equal(a.regions[TIDE_REGION_STAGING].bytes, 0);
    assert_int_equal(a.regions[TIDE_REGION_OUTBOX].bytes, 0);
    assert_int_equal(a.regions[TIDE_REGION_RESIDENT].bytes, f.geom.shard_bytes);
    /* an empty region sits where the next one starts */
    assert_int_equal(a.regions[TIDE_REGION_RECV_STAGE].offset,
                     a.regions[TIDE_REGION_RESIDENT].offset);
    assert_int_equal(a.regions[TIDE_REGION_STAGING].offset, a.regions[TIDE_REGION_OUTBOX].offset);
    tide_geom_free(&f.geom);

    /* M = 1 with a cast: the cast output still needs one stage slot, no resident shard. */
    fixture_init(&f, 1, 8, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, 2, 0, 1, 4);
    assert_tide(TIDE_SUCCESS, tide_arena_layout(&f.topo, &f.geom, &f.rs, &a));
    check_layout_structure(&a);
    assert_int_equal(a.regions[TIDE_REGION_RECV_STAGE].bytes, f.geom.shard_bytes);
    assert_int_equal(a.regions[TIDE_REGION_RESIDENT].bytes, 0);
    tide_geom_free(&f.geom);
}

/*
 * The arena and the closed-form bounds describe the same buffers.  With bf16 everywhere,
 * n_stg = 2 and E_sub = sum R_p K_p / L (no padding), the outbox, spare and inbox equal their
 * eq. (10) terms exactly, staging is (L - 1) / L of its term, the RS total stays under the
 * bound, and the ring plus receive stage stay under (2 + 1/L) N S.
 */
static void test_arena_matches_bounds(void **state) {
    (void)state;
    for (int l = 1; l <= 8; ++l)
        for (int m = 1; m <= 70; m += 3)
            for (int n_par = 1; n_par <= 2; ++n_par)
                for (int mode = 0; mode < 2; ++mode) {
                    const int k = 1 + (m + l) % 4;
                    const int n_out = mode == 0 ? m - 1 : 2 * k;
                    tide_topo_t topo;
                    assert_tide(TIDE_SUCCESS, tide_topo_init(m, l, &topo));
                    const uint64_t n = (uint64_t)topo.ranks;
                    /* sum R_p K_p = 2 * 840 + 2 * 420 = 2520: divisible by every L <= 8 */
                    tide_param_shape_t shapes[2] = {{2 * n, 840}, {n + 1, 420}};
                    tide_group_desc_t group = {2, shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16,
                                               TIDE_DTYPE_BF16};
                    tide_geom_t g;
                    assert_tide(TIDE_SUCCESS, tide_geom_build(&topo, &group, &g));
                    assert_int_equal(g.shard_elems % (uint64_t)l, 0);
                    tide_rs_schedule_t rs;
                    memset(&rs, 0, sizeof(rs));
                    rs.nodes = m;
                    rs.gpus_per_node = l;
                    rs.staging_slots = 2;
                    rs.outbox_depth = n_out;
                    rs.inbox_generations = n_par;
                    rs.subslice_elems = g.shard_elems / (uint64_t)l;
                    tide_arena_layout_t a;
                    assert_tide(TIDE_SUCCESS, tide_arena_layout(&topo, &g, &rs, &a));
                    tide_memory_bounds_t b;
                    assert_tide(TIDE_SUCCESS, tide_memory_bounds(m, l, k, n_par, &b));

                    const double ns = (double)g.group_bytes, fp32 = (double)g.fp32_shard_bytes;
                    const tide_region_info_t *r = a.regions;
                    assert_close(fp32 / ns, 2.0 / (m * l));
                    assert_close((double)r[TIDE_REGION_OUTBOX].bytes, 2.0 * n_out * fp32);
                    assert_close((double)r[TIDE_REGION_SPARE].bytes, 2.0 * fp32);
                    /* eq. (10) counts an inbox at M = 1 too; the arena has none there */
                    const double inbox = m > 1 ? (double)l * n_par * fp32 : 0.0;
                    assert_close((double)r[TIDE_REGION_INBOX].bytes, inbox);
                    assert_close((double)r[TIDE_REGION_STAGING].bytes, 2.0 * (l - 1) / 2.0 * fp32);
                    const double rs_ns =
                        (double)(r[TIDE_REGION_STAGING].bytes + r[TIDE_REGION_OUTBOX].bytes +
                                 r[TIDE_REGION_SPARE].bytes + r[TIDE_REGION_INBOX].bytes) /
                        ns;
                    const double bound =
                        mode == 0 ? b.in_place_staging_ns : b.slot_reuse_staging_ns;
                    assert_true(rs_ns <= bound * (1.0 + 1e-12));
                    /* the bound's only slack is one contribution per staging slot (and at
                     * M = 1 the inbox the bound still counts) */
                    assert_close(bound - rs_ns,
                                 (2.0 * 0.5 * fp32 + (m > 1 ? 0.0 : (double)l * n_par * fp32)) /
                                     ns);
                    const double ring_ns =
                        (double)(r[TIDE_REGION_LANDING0].bytes + r[TIDE_REGION_LANDING1].bytes +
                                 r[TIDE_REGION_RECV_STAGE].bytes) /
                        ns;
                    assert_true(ring_ns <= 2.0 + 1.0 / l + 1e-12);
                    tide_geom_free(&g);
                }
}

static void expect_arena_error(tide_result_t code, const tide_topo_t *topo, const tide_geom_t *g,
                               const tide_rs_schedule_t *rs, const char *needle) {
    tide_arena_layout_t a, ref;
    memset(&a, 0x3c, sizeof(a));
    memset(&ref, 0x3c, sizeof(ref));
    tide_error_clear();
    assert_tide(code, tide_arena_layout(topo, g, rs, &a));
    assert_true(strlen(tide_get_last_error()) > 0);
    if (needle != NULL && strstr(tide_get_last_error(), needle) == NULL)
        fail_msg("error '%s' does not mention '%s'", tide_get_last_error(), needle);
    assert_memory_equal(&a, &ref, sizeof(a));
}

static void test_arena_invalid(void **state) {
    (void)state;
    fixture_t f;
    fixture_init(&f, 4, 8, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, 2, 3, 2, 1024);
    const tide_rs_schedule_t good = f.rs;
    expect_arena_error(TIDE_ERR_INVALID_ARGUMENT, NULL, &f.geom, &f.rs, NULL);
    expect_arena_error(TIDE_ERR_INVALID_ARGUMENT, &f.topo, NULL, &f.rs, NULL);
    expect_arena_error(TIDE_ERR_INVALID_ARGUMENT, &f.topo, &f.geom, NULL, NULL);
    tide_error_clear();
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_arena_layout(&f.topo, &f.geom, &f.rs, NULL));

    f.rs.nodes = 5;
    expect_arena_error(TIDE_ERR_INVALID_ARGUMENT, &f.topo, &f.geom, &f.rs, "RS schedule");
    f.rs = good;
    f.rs.inbox_generations = 3;
    expect_arena_error(TIDE_ERR_INVALID_ARGUMENT, &f.topo, &f.geom, &f.rs, "n_par");
    f.rs = good;
    f.rs.staging_slots = 0;
    expect_arena_error(TIDE_ERR_INVALID_ARGUMENT, &f.topo, &f.geom, &f.rs, "n_stg");
    f.rs = good;
    f.rs.outbox_depth = -1;
    expect_arena_error(TIDE_ERR_INVALID_ARGUMENT, &f.topo, &f.geom, &f.rs, "n_out");
    f.rs = good;

    /* geometry of another topology */
    tide_topo_t other;
    assert_tide(TIDE_SUCCESS, tide_topo_init(2, 8, &other));
    tide_rs_schedule_t rs2 = good;
    rs2.nodes = 2;
    expect_arena_error(TIDE_ERR_INVALID_ARGUMENT, &other, &f.geom, &rs2, "geometry");
    tide_topo_t odd = f.topo;
    odd.ranks = 7;
    expect_arena_error(TIDE_ERR_INVALID_ARGUMENT, &odd, &f.geom, &f.rs, NULL);

    /* a region whose size leaves 64 bits: staging = 2 * 7 * 8 * 2^58 * 2 */
    f.rs.subslice_elems = 1ull << 58;
    expect_arena_error(TIDE_ERR_OVERFLOW, &f.topo, &f.geom, &f.rs, "staging");
    /* every region fits, their sum does not: (224 + 256 + 64 + 512) 2^54 > 2^64 = 1024 2^54 */
    f.rs.subslice_elems = 1ull << 54;
    f.rs.outbox_depth = 4;
    expect_arena_error(TIDE_ERR_OVERFLOW, &f.topo, &f.geom, &f.rs, "region");
    tide_geom_free(&f.geom);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds_paper_figures), cmocka_unit_test(test_bounds_eqs_11_12),
        cmocka_unit_test(test_bounds_invalid),       cmocka_unit_test(test_region_names),
        cmocka_unit_test(test_arena_layout_sizes),   cmocka_unit_test(test_arena_empty_regions),
        cmocka_unit_test(test_arena_matches_bounds), cmocka_unit_test(test_arena_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
