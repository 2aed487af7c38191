/* test_plan.c - the public plan object, the presets and the shape-list parser. */
#include "test_util.h"

#include "core/checks.h"
#include "plan/presets.h"

#include <limits.h>

static tide_config_t config_for(int nodes, int gpus_per_node) {
    tide_config_t c = TIDE_CONFIG_INIT;
    c.nodes = nodes;
    c.gpus_per_node = gpus_per_node;
    return c;
}

static tide_group_desc_t group_of(const tide_param_shape_t *shapes, int n, tide_dtype_t dtype) {
    tide_group_desc_t g;
    memset(&g, 0, sizeof(g));
    g.num_params = n;
    g.shapes = shapes;
    g.ag_dtype = g.grad_dtype = g.shard_dtype = dtype;
    return g;
}

static uint64_t div_ceil(uint64_t a, uint64_t b) {
    return (a + b - 1) / b;
}

/* Every public getter against the paper's definitions (§2.1, eqs. 2-3). */
static void check_plan(tide_plan_t plan, const tide_config_t *config,
                       const tide_group_desc_t *group) {
    tide_plan_summary_t s;
    assert_tide(TIDE_SUCCESS, tide_plan_get_summary(plan, &s));
    const uint64_t n = (uint64_t)config->nodes * (uint64_t)config->gpus_per_node;
    const uint64_t b_ag = tide_dtype_size(group->ag_dtype);
    const uint64_t b_grad = tide_dtype_size(group->grad_dtype);
    assert_int_equal(s.nodes, config->nodes);
    assert_int_equal(s.gpus_per_node, config->gpus_per_node);
    assert_int_equal(s.ranks, (int)n);
    assert_int_equal(s.num_params, group->num_params);

    uint64_t offset = 0, elems = 0;
    for (int p = 0; p < group->num_params; ++p) {
        tide_param_geometry_t g;
        assert_tide(TIDE_SUCCESS, tide_plan_get_param(plan, p, &g));
        uint64_t rows = div_ceil(group->shapes[p].dim0, n);
        assert_int_equal(g.dim0, group->shapes[p].dim0);
        assert_int_equal(g.inner, group->shapes[p].inner);
        assert_int_equal(g.rows_per_rank, rows);
        assert_int_equal(g.shard_bytes, rows * g.inner * b_ag);
        assert_int_equal(g.shard_offset, offset);
        assert_int_equal(g.fp32_offset, 4 * elems);
        offset += g.shard_bytes;
        elems += rows * g.inner;
    }
    assert_int_equal(s.shard_bytes, offset);
    assert_int_equal(s.group_bytes, n * offset);
    assert_int_equal(s.grad_shard_bytes, b_grad * elems);
    assert_int_equal(s.fp32_shard_bytes, 4 * elems);
    assert_int_equal(s.fsdp2_pack_bytes, 4 * n * elems);

    /* Landing(p, r) = o_p N + r s_p tiles [0, N S) exactly: parameter-major, rank-minor. */
    uint64_t expect = 0;
    for (int p = 0; p < group->num_params; ++p) {
        tide_param_geometry_t g;
        assert_tide(TIDE_SUCCESS, tide_plan_get_param(plan, p, &g));
        for (uint64_t r = 0; r < n; ++r) {
            uint64_t off;
            assert_tide(TIDE_SUCCESS, tide_plan_landing_offset(plan, p, (int)r, &off));
            assert_int_equal(off, g.shard_offset * n + r * g.shard_bytes);
            assert_int_equal(off, expect);
            expect += g.shard_bytes;
        }
    }
    assert_int_equal(expect, s.group_bytes);

    int log2m = 0;
    while ((1 << log2m) < config->nodes)
        ++log2m;
    assert_int_equal(s.ag_rounds, log2m);
    int w = config->wave_width ? config->wave_width : config->gpus_per_node;
    assert_int_equal(s.rs_wave_width, w);
    assert_int_equal(s.rs_waves, (config->nodes + w - 1) / w);
    assert_int_equal(s.rs_inbox_generations, s.rs_waves == 1 ? 1 : 2);
    assert_int_equal(s.rs_passes, config->passes ? config->passes : 1);
    int k = config->round_width;
    if (k == 0) k = config->nodes - 1 < 1 ? 1 : (config->nodes - 1 < 2 ? config->nodes - 1 : 2);
    assert_int_equal(s.rs_round_width, k);
    assert_true(s.ag_descriptors_max >= (uint64_t)group->num_params);

    /* Regions: in layout order, aligned, disjoint, inside the arena. */
    uint64_t end = 0;
    for (int r = 0; r < TIDE_REGION_COUNT; ++r) {
        tide_region_info_t info;
        assert_tide(TIDE_SUCCESS, tide_plan_get_region(plan, (tide_region_t)r, &info));
        assert_int_equal(info.offset % TIDE_ARENA_ALIGN, 0);
        assert_true(info.offset >= end);
        end = info.offset + info.bytes;
        assert_string_not_equal(tide_region_name((tide_region_t)r), "unknown");
    }
    assert_true(end <= s.arena_bytes);
    tide_region_info_t l0, l1;
    assert_tide(TIDE_SUCCESS, tide_plan_get_region(plan, TIDE_REGION_LANDING0, &l0));
    assert_tide(TIDE_SUCCESS, tide_plan_get_region(plan, TIDE_REGION_LANDING1, &l1));
    assert_true(l0.bytes >= s.group_bytes && l1.bytes >= s.group_bytes);
}

static void test_presets_plan(void **state) {
    (void)state;
    static const int topologies[][2] = {{1, 1}, {1, 8}, {2, 8}, {8, 8}, {9, 8}, {3, 5}, {64, 8}};
    for (int i = 0; i < tide_preset_count(); ++i) {
        const tide_preset_t *preset = tide_preset_at(i);
        for (size_t t = 0; t < sizeof(topologies) / sizeof(topologies[0]); ++t)
            for (int dt = 0; dt < 2; ++dt) {
                tide_config_t c = config_for(topologies[t][0], topologies[t][1]);
                c.mode = (tide_rs_mode_t)dt;
                tide_group_desc_t g = group_of(preset->shapes, preset->num_params,
                                               dt ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16);
                tide_plan_t plan = NULL;
                assert_tide(TIDE_SUCCESS, tide_plan_create(&c, &g, &plan));
                check_plan(plan, &c, &g);
                tide_plan_destroy(plan);
            }
    }
}

static void test_tuning_resolution(void **state) {
    (void)state;
    const tide_param_shape_t shapes[] = {{1000, 3}, {7, 1}, {4096, 4096}};
    tide_group_desc_t g = group_of(shapes, 3, TIDE_DTYPE_BF16);
    static const int nodes[] = {1, 2, 3, 8, 16, 33};
    for (size_t i = 0; i < 6; ++i)
        for (int w = 0; w <= 8; w *= 2, w += !w) {
            tide_config_t c = config_for(nodes[i], 8);
            c.wave_width = w;
            c.passes = (int)i % 5;
            c.round_width = (int)(i % 3) * 2; /* 0, 2, 4 */
            tide_plan_t plan = NULL;
            assert_tide(TIDE_SUCCESS, tide_plan_create(&c, &g, &plan));
            check_plan(plan, &c, &g);
            tide_plan_destroy(plan);
            if (w == 8) break;
        }
    /* A mixed-precision group: fp32 masters gathered as bf16, fp32 gradients. */
    tide_group_desc_t mixed = g;
    mixed.shard_dtype = TIDE_DTYPE_FP32;
    mixed.grad_dtype = TIDE_DTYPE_FP32;
    tide_config_t c = config_for(4, 8);
    tide_plan_t plan = NULL;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&c, &mixed, &plan));
    check_plan(plan, &c, &mixed);
    tide_plan_destroy(plan);
}

/* A failing create leaves *plan_out alone and says why. */
static void expect_create(tide_result_t code, const tide_config_t *c, const tide_group_desc_t *g) {
    tide_plan_t plan = (tide_plan_t)(uintptr_t)0x1234;
    assert_tide(code, tide_plan_create(c, g, &plan));
    assert_ptr_equal(plan, (tide_plan_t)(uintptr_t)0x1234);
    assert_true(strlen(tide_get_last_error()) > 0);
}

static void test_bad_config(void **state) {
    (void)state;
    const tide_param_shape_t shapes[] = {{64, 64}};
    tide_group_desc_t g = group_of(shapes, 1, TIDE_DTYPE_BF16);
    tide_config_t c = config_for(2, 8);
    tide_plan_t plan;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_create(NULL, &g, &plan));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_create(&c, NULL, &plan));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_create(&c, &g, NULL));

    tide_config_t bad = c;
    bad.size = sizeof(tide_config_t) - 4;
    expect_create(TIDE_ERR_INVALID_ARGUMENT, &bad, &g);
    bad = c;
    bad.magic = 0xdeadbeef;
    expect_create(TIDE_ERR_INVALID_ARGUMENT, &bad, &g);
    bad = c;
    bad.version = (TIDE_MAJOR + 1) * 10000;
    expect_create(TIDE_ERR_INVALID_ARGUMENT, &bad, &g);

    struct {
        int field;
        int value;
    } cases[] = {
        {0, 0},  {0, -1}, {0, INT_MAX}, {0, TIDE_MAX_NODES + 1},
        {1, 0},  {1, 9},  {1, -8},      {2, 9},
        {2, -1}, {3, 5},  {3, -1},      {4, 5},
        {4, -1}, {5, -1}, {6, 2},       {6, -1},
        {7, -1}, {8, -1}, {9, 2},       {9, -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        bad = c;
        int *f[] = {&bad.nodes,        &bad.gpus_per_node, &bad.wave_width,  &bad.round_width,
                    &bad.passes,       &bad.staging_slots, (int *)&bad.mode, &bad.sum_ctas,
                    &bad.landing_ctas, &bad.multicast};
        *f[cases[i].field] = cases[i].value;
        expect_create(TIDE_ERR_INVALID_ARGUMENT, &bad, &g);
    }
    /* The same config with a minor version bump is accepted. */
    bad = c;
    bad.version = TIDE_MAJOR * 10000 + 99;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&bad, &g, &plan));
    tide_plan_destroy(plan);
}

static void test_rejected_and_unsupported(void **state) {
    (void)state;
    const tide_param_shape_t shapes[] = {{64, 64}, {8, 1}};
    tide_group_desc_t g = group_of(shapes, 2, TIDE_DTYPE_BF16);
    /* App. D: M = 9, L = 8, W_wave = 3 puts c = 8 and c = 9 on one GPU in the last wave. */
    tide_config_t c = config_for(9, 8);
    c.wave_width = 3;
    expect_create(TIDE_ERR_PLAN_REJECTED, &c, &g);
    /* Divisors of L are collision-free (Prop. 4.1). */
    for (int w = 1; w <= 8; w *= 2) {
        c.wave_width = w;
        tide_plan_t plan = NULL;
        assert_tide(TIDE_SUCCESS, tide_plan_create(&c, &g, &plan));
        tide_plan_destroy(plan);
    }

    c = config_for(2, 8);
    tide_param_shape_t many[TIDE_MAX_PARAMS + 1];
    for (int i = 0; i <= TIDE_MAX_PARAMS; ++i)
        many[i] = (tide_param_shape_t){(uint64_t)i + 1, 3};
    tide_group_desc_t big = group_of(many, TIDE_MAX_PARAMS + 1, TIDE_DTYPE_BF16);
    expect_create(TIDE_ERR_UNSUPPORTED, &c, &big);
    big.num_params = TIDE_MAX_PARAMS; /* the limit itself is served */
    tide_plan_t plan = NULL;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&c, &big, &plan));
    tide_plan_destroy(plan);

    tide_group_desc_t h = group_of(shapes, 2, TIDE_DTYPE_FP16);
    expect_create(TIDE_ERR_UNSUPPORTED, &c, &h);
    h = group_of(shapes, 2, TIDE_DTYPE_BF16);
    h.grad_dtype = TIDE_DTYPE_FP16;
    expect_create(TIDE_ERR_UNSUPPORTED, &c, &h);
    h.grad_dtype = (tide_dtype_t)42;
    expect_create(TIDE_ERR_INVALID_ARGUMENT, &c, &h);

    h = group_of(shapes, 0, TIDE_DTYPE_BF16);
    expect_create(TIDE_ERR_INVALID_ARGUMENT, &c, &h);
    h = group_of(NULL, 2, TIDE_DTYPE_BF16);
    expect_create(TIDE_ERR_INVALID_ARGUMENT, &c, &h);
    const tide_param_shape_t zero_dim[] = {{64, 64}, {0, 4}};
    h = group_of(zero_dim, 2, TIDE_DTYPE_BF16);
    expect_create(TIDE_ERR_INVALID_ARGUMENT, &c, &h);
    const tide_param_shape_t zero_inner[] = {{64, 0}};
    h = group_of(zero_inner, 1, TIDE_DTYPE_BF16);
    expect_create(TIDE_ERR_INVALID_ARGUMENT, &c, &h);
    /* Overflow: one shard, N S, and the sum over parameters. */
    const tide_param_shape_t huge[] = {{1ull << 62, 1ull << 62}};
    h = group_of(huge, 1, TIDE_DTYPE_BF16);
    expect_create(TIDE_ERR_OVERFLOW, &c, &h);
    const tide_param_shape_t wide[] = {{16, UINT64_MAX / 2}};
    h = group_of(wide, 1, TIDE_DTYPE_BF16);
    expect_create(TIDE_ERR_OVERFLOW, &c, &h);
    const tide_param_shape_t sum[] = {{16, 1ull << 58}, {16, 1ull << 58}, {16, 1ull << 58}};
    h = group_of(sum, 3, TIDE_DTYPE_FP32);
    expect_create(TIDE_ERR_OVERFLOW, &c, &h);
}

static void test_getters_bad_input(void **state) {
    (void)state;
    const tide_param_shape_t shapes[] = {{64, 64}, {8, 1}};
    tide_group_desc_t g = group_of(shapes, 2, TIDE_DTYPE_BF16);
    tide_config_t c = config_for(2, 4);
    tide_plan_t plan = NULL;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&c, &g, &plan));

    tide_param_geometry_t geo;
    uint64_t off = 77;
    tide_plan_summary_t s;
    tide_region_info_t info;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_param(NULL, 0, &geo));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_param(plan, -1, &geo));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_param(plan, 2, &geo));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_param(plan, 0, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_landing_offset(NULL, 0, 0, &off));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_landing_offset(plan, 2, 0, &off));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_landing_offset(plan, 0, -1, &off));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_landing_offset(plan, 0, 8, &off));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_landing_offset(plan, 0, 0, NULL));
    assert_int_equal(off, 77);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_summary(NULL, &s));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_summary(plan, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_region(NULL, TIDE_REGION_INBOX, &info));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_plan_get_region(plan, (tide_region_t)TIDE_REGION_COUNT, &info));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_region(plan, (tide_region_t)-1, &info));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_region(plan, TIDE_REGION_INBOX, NULL));
    assert_string_equal(tide_region_name((tide_region_t)99), "unknown");

    /* Every public call clears the last error on entry. */
    assert_true(strlen(tide_get_last_error()) > 0);
    assert_tide(TIDE_SUCCESS, tide_plan_landing_offset(plan, 1, 7, &off));
    assert_string_equal(tide_get_last_error(), "");
    /* o_1 = s_0 = 8 rows of 64 bf16 = 1024 bytes, N = 8, s_1 = one bf16 row of 1. */
    assert_int_equal(off, 1024 * 8 + 7 * 2);

    /* Destroy cannot fail and keeps the reason of the last failure for the caller. */
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_get_param(plan, 99, &geo));
    tide_plan_destroy(plan);
    tide_plan_destroy(NULL);
    assert_non_null(strstr(tide_get_last_error(), "99"));
}

/* Build and destroy many plans, including failures half-way (after the geometry, after the
 * schedules): the ASan build turns any leak into a failure. */
static void test_no_leaks_on_failure_paths(void **state) {
    (void)state;
    const tide_param_shape_t shapes[] = {{100, 10}, {3, 1}, {77, 5}};
    tide_group_desc_t g = group_of(shapes, 3, TIDE_DTYPE_BF16);
    for (int m = 1; m <= 20; ++m)
        for (int w = 1; w <= 8; ++w) {
            tide_config_t c = config_for(m, 8);
            c.wave_width = w;
            c.mode = (tide_rs_mode_t)(m & 1);
            c.passes = 1 + m % TIDE_MAX_PASSES;
            tide_plan_t plan = NULL;
            tide_result_t r = tide_plan_create(&c, &g, &plan);
            assert_true(r == TIDE_SUCCESS || r == TIDE_ERR_PLAN_REJECTED);
            if (r == TIDE_SUCCESS) tide_plan_destroy(plan);
        }
    tide_config_t c = config_for(TIDE_MAX_NODES, 8); /* the largest topology builds */
    tide_plan_t plan = NULL;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&c, &g, &plan));
    tide_plan_summary_t s;
    assert_tide(TIDE_SUCCESS, tide_plan_get_summary(plan, &s));
    assert_int_equal(s.ag_rounds, 16);
    tide_plan_destroy(plan);
}

/* ------------------------------------------------------------------ presets */

static uint64_t total_elems(const tide_preset_t *p) {
    uint64_t t = 0;
    for (int i = 0; i < p->num_params; ++i)
        t += p->shapes[i].dim0 * p->shapes[i].inner;
    return t;
}

static void test_presets_table(void **state) {
    (void)state;
    assert_int_equal(tide_preset_count(), 3);
    assert_null(tide_preset_at(-1));
    assert_null(tide_preset_at(3));
    assert_null(tide_preset_find("nope"));
    assert_null(tide_preset_find(NULL));
    for (int i = 0; i < tide_preset_count(); ++i) {
        const tide_preset_t *p = tide_preset_at(i);
        assert_ptr_equal(tide_preset_find(p->name), p);
        assert_non_null(strstr(tide_preset_names(), p->name));
        for (int j = 0; j < p->num_params; ++j) {
            assert_true(p->shapes[j].dim0 >= 1 && p->shapes[j].inner >= 1);
            assert_non_null(p->param_names[j]);
        }
    }
    /* Parameter counts of one block, from the models' published sizes:
     * Llama 3 70B: 80 such layers + 2 x 128256 x 8192 embeddings + final norm = 70.55 B. */
    const tide_preset_t *llama = tide_preset_find("llama3-70b-layer");
    assert_int_equal(llama->num_params, 9);
    assert_int_equal(total_elems(llama), 855654400ull);
    assert_int_equal(80 * total_elems(llama) + 2ull * 128256 * 8192 + 8192, 70553706496ull);
    /* Wan2.2 A14B expert: 40 blocks of 351.4 M (about 14 B with the embedders and head). */
    const tide_preset_t *wan = tide_preset_find("wan2.2-block");
    assert_int_equal(wan->num_params, 27);
    assert_int_equal(total_elems(wan), 30720ull + 2 * 4 * (5120ull * 5120 + 5120) + 4 * 5120 +
                                           2 * 5120 + 13824ull * 5120 + 13824 + 5120ull * 13824 +
                                           5120);
    assert_int_equal(wan->shapes[0].dim0, 1);
    assert_int_equal(wan->shapes[0].inner, 6 * 5120);
    /* Qwen3-30B-A3B: 48 layers, 30.5 B with embeddings and head. */
    const tide_preset_t *qwen = tide_preset_find("qwen3-30b-a3b-layer");
    assert_int_equal(qwen->num_params, 12);
    assert_int_equal(48 * total_elems(qwen) + 2ull * 151936 * 2048 + 2048, 30532122624ull);
    assert_int_equal(qwen->shapes[9].dim0, 128); /* grouped experts shard by expert */
}

static void test_shapes_parse(void **state) {
    (void)state;
    tide_param_shape_t *s = NULL;
    int n = 0;
    assert_tide(TIDE_SUCCESS, tide_shapes_parse("8192x8192,1024x8192,8192", &s, &n));
    assert_int_equal(n, 3);
    assert_int_equal(s[0].dim0, 8192);
    assert_int_equal(s[0].inner, 8192);
    assert_int_equal(s[1].dim0, 1024);
    assert_int_equal(s[2].dim0, 8192);
    assert_int_equal(s[2].inner, 1);
    free(s);
    assert_tide(TIDE_SUCCESS, tide_shapes_parse("128x768x2048,1x6x5120", &s, &n));
    assert_int_equal(n, 2);
    assert_int_equal(s[0].dim0, 128);
    assert_int_equal(s[0].inner, 768 * 2048);
    assert_int_equal(s[1].inner, 30720);
    free(s);
    assert_tide(TIDE_SUCCESS, tide_shapes_parse("18446744073709551615x1", &s, &n));
    assert_int_equal(s[0].dim0, UINT64_MAX);
    free(s);
    /* dim0 x inner beyond 64 bits parses; the plan, not the parser, reports the overflow. */
    assert_tide(TIDE_SUCCESS, tide_shapes_parse("4294967296x4294967296x2", &s, &n));
    assert_int_equal(s[0].inner, 1ull << 33);
    free(s);

    static const char *const bad[] = {
        "",
        ",",
        "8192,",
        ",8192",
        "8192,,4",
        "0",
        "4x0",
        "x4",
        "4x",
        "4xx4",
        "-4",
        "+4",
        " 4",
        "4 ",
        "4x4y",
        "abc",
        "4,4,a",
        "18446744073709551616",
        "4x4294967296x4294967296",
        "1x4294967296x4294967296",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        s = (tide_param_shape_t *)(uintptr_t)0x99;
        n = -7;
        tide_error_clear();
        if (tide_shapes_parse(bad[i], &s, &n) != TIDE_ERR_INVALID_ARGUMENT)
            fail_msg("accepted \"%s\"", bad[i]);
        assert_ptr_equal(s, (tide_param_shape_t *)(uintptr_t)0x99);
        assert_int_equal(n, -7);
        assert_true(strlen(tide_get_last_error()) > 0);
    }
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_shapes_parse(NULL, &s, &n));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_plan),      cmocka_unit_test(test_tuning_resolution),
        cmocka_unit_test(test_bad_config),        cmocka_unit_test(test_rejected_and_unsupported),
        cmocka_unit_test(test_getters_bad_input), cmocka_unit_test(test_no_leaks_on_failure_paths),
        cmocka_unit_test(test_presets_table),     cmocka_unit_test(test_shapes_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
