/* test_geometry.c - topology and shard geometry (paper §2.1, eqs. 2-3) against brute force. */
#include "test_util.h"

#include "core/checks.h"
#include "plan/plan.h"

#include <limits.h>

/* ------------------------------------------------------------------ helpers */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* xorshift64*: fixed seed, identical on every libc. */
static uint64_t rng_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static uint64_t rng_range(uint64_t lo, uint64_t hi) {
    return lo + rng_next() % (hi - lo + 1);
}

static tide_topo_t make_topo(int nodes, int gpus_per_node) {
    tide_topo_t t;
    assert_tide(TIDE_SUCCESS, tide_topo_init(nodes, gpus_per_node, &t));
    return t;
}

static tide_group_desc_t make_group(const tide_param_shape_t *shapes, int num_params,
                                    tide_dtype_t ag, tide_dtype_t grad, tide_dtype_t shard) {
    tide_group_desc_t g;
    g.num_params = num_params;
    g.shapes = shapes;
    g.ag_dtype = ag;
    g.grad_dtype = grad;
    g.shard_dtype = shard;
    return g;
}

/* Smallest R with R N >= D, found by counting up (D is small in these tests). */
static uint64_t brute_rows(uint64_t dim0, uint64_t ranks) {
    uint64_t r = 0;
    while (r * ranks < dim0)
        ++r;
    return r;
}

/*
 * A failing call must return the code, leave a message, and leave the output untouched.
 * The output is pre-filled with a byte pattern and compared afterwards.
 */
#define SENTINEL 0xA5
static void expect_geom_error(tide_result_t code, const tide_topo_t *topo,
                              const tide_group_desc_t *group, const char *needle) {
    tide_geom_t g;
    unsigned char ref[sizeof(g)];
    memset(&g, SENTINEL, sizeof(g));
    memset(ref, SENTINEL, sizeof(ref));
    tide_error_clear();
    assert_tide(code, tide_geom_build(topo, group, &g));
    assert_true(strlen(tide_get_last_error()) > 0);
    if (needle != NULL && strstr(tide_get_last_error(), needle) == NULL)
        fail_msg("error '%s' does not mention '%s'", tide_get_last_error(), needle);
    assert_memory_equal(&g, ref, sizeof(g));
}

/* ------------------------------------------------------------------ topology */

static void test_topology(void **state) {
    (void)state;
    for (int m = 1; m <= 70; m += 3) {
        for (int l = 1; l <= TIDE_MAX_GPUS_PER_NODE; ++l) {
            tide_topo_t t = make_topo(m, l);
            assert_int_equal(t.nodes, m);
            assert_int_equal(t.gpus_per_node, l);
            assert_int_equal(t.ranks, m * l);
            /* Node-major enumeration: visiting (n, l) in order yields ranks 0, 1, 2, ... */
            int expect = 0;
            for (int n = 0; n < m; ++n)
                for (int j = 0; j < l; ++j, ++expect) {
                    int r = tide_topo_rank(&t, n, j);
                    assert_int_equal(r, expect);
                    assert_int_equal(tide_topo_node(&t, r), n);
                    assert_int_equal(tide_topo_local(&t, r), j);
                    assert_int_equal(tide_topo_rail(&t, r), j);
                }
        }
    }
    tide_topo_t big = make_topo(TIDE_MAX_NODES, TIDE_MAX_GPUS_PER_NODE);
    assert_int_equal(big.ranks, TIDE_MAX_NODES * TIDE_MAX_GPUS_PER_NODE);

    const int bad[][2] = {
        {INT_MAX, 8}, {INT_MAX, 1}, {0, 8},  {-1, 8},     {INT_MIN, 8}, {TIDE_MAX_NODES + 1, 1},
        {4, 9},       {4, 0},       {4, -3}, {1, INT_MAX}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        tide_topo_t t = {-7, -7, -7};
        tide_error_clear();
        assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_topo_init(bad[i][0], bad[i][1], &t));
        assert_true(strlen(tide_get_last_error()) > 0);
        assert_int_equal(t.nodes, -7);
        assert_int_equal(t.ranks, -7);
    }
    tide_error_clear();
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_topo_init(2, 8, NULL));
    assert_true(strlen(tide_get_last_error()) > 0);
}

/* ------------------------------------------------------------------ brute force */

/*
 * Parameter-major storage by definition: parameters one after another, parameter p as its
 * padded (N R_p, K_p) tensor of b_ag-byte items, row x owned by rank x / R_p.  owner[] gets
 * p N + r for every byte; the landing map must hit exactly rank r's bytes of p, once each.
 */
static void check_landing_bytes(const tide_geom_t *g, const uint64_t *rows, uint64_t total) {
    const uint64_t n = (uint64_t)g->ranks;
    uint32_t *owner = malloc(total * sizeof(*owner));
    uint8_t *hits = calloc(total, 1);
    uint64_t *block = malloc((size_t)g->num_params * sizeof(*block));
    assert_non_null(owner);
    assert_non_null(hits);
    assert_non_null(block);

    uint64_t cursor = 0;
    for (int p = 0; p < g->num_params; ++p) {
        block[p] = cursor;
        const uint64_t row_bytes = g->params[p].inner * g->ag_item;
        for (uint64_t x = 0; x < n * rows[p]; ++x)
            for (uint64_t b = 0; b < row_bytes; ++b)
                owner[cursor++] = (uint32_t)(p * n + x / rows[p]);
    }
    assert_int_equal(cursor, total);

    for (int p = 0; p < g->num_params; ++p) {
        const uint64_t s_p = g->params[p].shard_bytes;
        for (int r = 0; r < g->ranks; ++r) {
            const uint64_t at = tide_geom_landing(g, p, r);
            assert_true(at >= block[p]);
            assert_true(at + s_p <= block[p] + n * s_p); /* inside p's unsharded block */
            assert_true(at + s_p <= total);
            for (uint64_t j = 0; j < s_p; ++j) {
                assert_int_equal(owner[at + j], (uint32_t)(p * n + (uint64_t)r));
                hits[at + j]++;
            }
        }
    }
    for (uint64_t i = 0; i < total; ++i)
        if (hits[i] != 1)
            fail_msg("byte %llu of N S covered %d times", (unsigned long long)i, hits[i]);
    free(block);
    free(hits);
    free(owner);
}

/* I_{p,r} over r: consecutive, covering [0, D_p) exactly, empty ranks only at the end. */
static void check_rs_rows(const tide_geom_t *g, int p) {
    const tide_geom_param_t *q = &g->params[p];
    uint8_t *seen = calloc(q->dim0, 1);
    assert_non_null(seen);
    uint64_t next = 0;
    bool padded = false;
    for (int r = 0; r < g->ranks; ++r) {
        uint64_t first, valid;
        tide_geom_rs_rows(g, p, r, &first, &valid);
        assert_true(valid <= q->rows);
        if (padded) assert_int_equal(valid, 0); /* once a rank is short, the rest are empty */
        if (valid < q->rows) padded = true;
        if (valid > 0) assert_int_equal(first, next);
        for (uint64_t i = 0; i < valid; ++i) {
            assert_true(first + i < q->dim0);
            seen[first + i]++;
        }
        next += valid;
    }
    assert_int_equal(next, q->dim0);
    for (uint64_t i = 0; i < q->dim0; ++i)
        assert_int_equal(seen[i], 1);
    free(seen);
}

static const tide_dtype_t dtype_combos[][3] = {
    /* ag, grad, shard */
    {TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16},
    {TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32},
    {TIDE_DTYPE_FP32, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32},
    {TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32},
    {TIDE_DTYPE_FP32, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32},
};

static void check_one_group(const tide_topo_t *topo, const tide_param_shape_t *shapes, int np,
                            const tide_dtype_t *dt) {
    tide_group_desc_t group = make_group(shapes, np, dt[0], dt[1], dt[2]);
    tide_geom_t g;
    assert_tide(TIDE_SUCCESS, tide_geom_build(topo, &group, &g));
    const uint64_t n = (uint64_t)topo->ranks;
    const uint64_t b_ag = dt[0] == TIDE_DTYPE_BF16 ? 2 : 4;
    const uint64_t b_grad = dt[1] == TIDE_DTYPE_BF16 ? 2 : 4;
    assert_int_equal(g.num_params, np);
    assert_int_equal(g.ranks, topo->ranks);
    assert_int_equal(g.ag_item, b_ag);
    assert_int_equal(g.grad_item, b_grad);
    assert_int_equal(g.cast, dt[0] != dt[2]);

    uint64_t rows[64], bytes = 0, elems = 0;
    for (int p = 0; p < np; ++p) {
        rows[p] = brute_rows(shapes[p].dim0, n);
        const tide_geom_param_t *q = &g.params[p];
        assert_int_equal(q->dim0, shapes[p].dim0);
        assert_int_equal(q->inner, shapes[p].inner);
        assert_int_equal(q->rows, rows[p]);
        assert_int_equal(q->shard_elems, rows[p] * shapes[p].inner);
        assert_int_equal(q->shard_bytes, rows[p] * shapes[p].inner * b_ag);
        assert_int_equal(q->offset, bytes);
        assert_int_equal(q->elem_offset, elems);
        bytes += q->shard_bytes;
        elems += q->shard_elems;
        check_rs_rows(&g, p);
    }
    assert_int_equal(g.shard_bytes, bytes);
    assert_int_equal(g.shard_elems, elems);
    assert_int_equal(g.group_bytes, n * bytes);
    assert_int_equal(g.grad_shard_bytes, b_grad * elems);
    /* S_fp32 is S re-expressed in 4-byte items; eq. (3): B_pack = 4 N S_grad / b_grad. */
    assert_int_equal(g.fp32_shard_bytes * b_ag, 4 * g.shard_bytes);
    assert_int_equal(g.pack_bytes * b_grad, 4 * n * g.grad_shard_bytes);
    assert_int_equal(g.pack_bytes, n * g.fp32_shard_bytes);
    check_landing_bytes(&g, rows, n * bytes);
    tide_geom_free(&g);
    assert_null(g.params);
}

static void test_geometry_vs_brute_force(void **state) {
    (void)state;
    const int topos[][2] = {{1, 1}, {1, 2}, {1, 8}, {2, 1},  {2, 4},  {3, 3},
                            {5, 8}, {7, 2}, {8, 8}, {13, 1}, {16, 8}, {64, 8}};
    rng_state = 0x1234567ull;
    for (size_t t = 0; t < sizeof(topos) / sizeof(topos[0]); ++t) {
        tide_topo_t topo = make_topo(topos[t][0], topos[t][1]);
        const uint64_t n = (uint64_t)topo.ranks;
        for (int trial = 0; trial < 12; ++trial) {
            tide_param_shape_t shapes[16];
            int np = (int)rng_range(1, 12);
            for (int p = 0; p < np; ++p) {
                /* Mix of D < N (ranks with no rows), D a multiple of N, and ragged D. */
                switch (rng_next() % 3) {
                case 0:
                    shapes[p].dim0 = rng_range(1, n);
                    break;
                case 1:
                    shapes[p].dim0 = n * rng_range(1, 3);
                    break;
                default:
                    shapes[p].dim0 = rng_range(1, 3 * n + 5);
                    break;
                }
                shapes[p].inner = rng_range(1, 9);
            }
            const tide_dtype_t *dt = dtype_combos[rng_next() % 5];
            check_one_group(&topo, shapes, np, dt);
        }
    }
}

/* Landing runs of large groups: sort the (start, length) runs and check they tile [0, N S). */
typedef struct {
    uint64_t start, len;
    int param;
} run_t;

static int run_cmp(const void *a, const void *b) {
    const run_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void test_landing_runs_large(void **state) {
    (void)state;
    const int topos[][2] = {{1, 8}, {6, 8}, {64, 8}, {37, 3}};
    rng_state = 0xfeedbeefull;
    tide_param_shape_t *shapes = malloc(TIDE_MAX_PARAMS * sizeof(*shapes));
    assert_non_null(shapes);
    for (size_t t = 0; t < sizeof(topos) / sizeof(topos[0]); ++t) {
        tide_topo_t topo = make_topo(topos[t][0], topos[t][1]);
        const int np = t % 2 ? TIDE_MAX_PARAMS : (int)rng_range(1, 40);
        for (int p = 0; p < np; ++p) {
            shapes[p].dim0 = rng_range(1, 1u << 20);
            shapes[p].inner = rng_range(1, 16384);
        }
        tide_group_desc_t group =
            make_group(shapes, np, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16);
        tide_geom_t g;
        assert_tide(TIDE_SUCCESS, tide_geom_build(&topo, &group, &g));
        const size_t count = (size_t)np * (size_t)topo.ranks;
        run_t *runs = malloc(count * sizeof(*runs));
        assert_non_null(runs);
        size_t k = 0;
        for (int p = 0; p < np; ++p)
            for (int r = 0; r < topo.ranks; ++r, ++k) {
                runs[k].start = tide_geom_landing(&g, p, r);
                runs[k].len = g.params[p].shard_bytes;
                runs[k].param = p;
                /* Property of ceil: the N padded shards hold D_p rows, less than one shard
                 * of padding. */
                const uint64_t rr = g.params[p].rows;
                assert_true(rr * (uint64_t)topo.ranks >= shapes[p].dim0);
                assert_true((rr - 1) * (uint64_t)topo.ranks < shapes[p].dim0);
            }
        qsort(runs, count, sizeof(*runs), run_cmp);
        uint64_t end = 0;
        for (size_t i = 0; i < count; ++i) {
            assert_true(runs[i].len > 0);
            assert_int_equal(runs[i].start, end); /* no gap, no overlap */
            end = runs[i].start + runs[i].len;
            /* parameter-major: runs of p come after all runs of p - 1 */
            if (i > 0) assert_true(runs[i].param >= runs[i - 1].param);
        }
        assert_int_equal(end, g.group_bytes);
        free(runs);
        tide_geom_free(&g);
    }
    free(shapes);
}

/* Hand-picked shard-map corners. */
static void test_rs_rows_corners(void **state) {
    (void)state;
    tide_topo_t topo = make_topo(2, 4); /* N = 8 */
    const tide_param_shape_t shapes[] = {{1, 3}, {8, 1}, {9, 2}, {15, 1}, {17, 5}};
    tide_group_desc_t group =
        make_group(shapes, 5, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32);
    tide_geom_t g;
    assert_tide(TIDE_SUCCESS, tide_geom_build(&topo, &group, &g));
    /* expected valid rows per rank, written out by hand */
    const uint64_t valid[5][8] = {{1, 0, 0, 0, 0, 0, 0, 0},
                                  {1, 1, 1, 1, 1, 1, 1, 1},
                                  {2, 2, 2, 2, 1, 0, 0, 0},
                                  {2, 2, 2, 2, 2, 2, 2, 1},
                                  {3, 3, 3, 3, 3, 2, 0, 0}};
    for (int p = 0; p < 5; ++p) {
        for (int r = 0; r < 8; ++r) {
            uint64_t first, v;
            tide_geom_rs_rows(&g, p, r, &first, &v);
            assert_int_equal(v, valid[p][r]);
            if (v > 0) assert_int_equal(first, (uint64_t)r * g.params[p].rows);
        }
        check_rs_rows(&g, p);
    }
    assert_true(g.cast);
    assert_int_equal(g.shard_elems, 1 * 3 + 1 * 1 + 2 * 2 + 2 * 1 + 3 * 5);
    tide_geom_free(&g);
    tide_geom_free(&g); /* freeing twice is harmless: the struct is zeroed */
    tide_geom_free(NULL);
}

/* ------------------------------------------------------------------ bad input */

static void test_bad_groups(void **state) {
    (void)state;
    tide_topo_t topo = make_topo(4, 8);
    tide_param_shape_t *many = calloc(TIDE_MAX_PARAMS + 1, sizeof(*many));
    assert_non_null(many);
    for (int p = 0; p <= TIDE_MAX_PARAMS; ++p)
        many[p] = (tide_param_shape_t){64, 64};
    const tide_dtype_t B = TIDE_DTYPE_BF16, F = TIDE_DTYPE_FP32, H = TIDE_DTYPE_FP16;

    /* The boundary itself is served. */
    tide_group_desc_t group = make_group(many, TIDE_MAX_PARAMS, B, B, B);
    tide_geom_t g;
    assert_tide(TIDE_SUCCESS, tide_geom_build(&topo, &group, &g));
    tide_geom_free(&g);

    group.num_params = TIDE_MAX_PARAMS + 1;
    expect_geom_error(TIDE_ERR_UNSUPPORTED, &topo, &group, "num_params");
    group.num_params = INT_MAX;
    expect_geom_error(TIDE_ERR_UNSUPPORTED, &topo, &group, "num_params");
    group.num_params = 0;
    expect_geom_error(TIDE_ERR_INVALID_ARGUMENT, &topo, &group, "num_params");
    group.num_params = -5;
    expect_geom_error(TIDE_ERR_INVALID_ARGUMENT, &topo, &group, "num_params");
    group = make_group(NULL, 3, B, B, B);
    expect_geom_error(TIDE_ERR_INVALID_ARGUMENT, &topo, &group, "shapes");

    /* NULL arguments */
    group = make_group(many, 3, B, B, B);
    expect_geom_error(TIDE_ERR_INVALID_ARGUMENT, NULL, &group, NULL);
    expect_geom_error(TIDE_ERR_INVALID_ARGUMENT, &topo, NULL, NULL);
    tide_error_clear();
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_geom_build(&topo, &group, NULL));
    assert_true(strlen(tide_get_last_error()) > 0);

    /* An inconsistent hand-made topology is not trusted. */
    tide_topo_t odd = topo;
    odd.ranks = 31;
    expect_geom_error(TIDE_ERR_INVALID_ARGUMENT, &odd, &group, "ranks");
    odd = (tide_topo_t){INT_MAX, 8, 8};
    expect_geom_error(TIDE_ERR_INVALID_ARGUMENT, &odd, &group, NULL);
    odd = (tide_topo_t){2, 9, 18};
    expect_geom_error(TIDE_ERR_INVALID_ARGUMENT, &odd, &group, NULL);

    /* Zero extents name the parameter. */
    many[3] = (tide_param_shape_t){0, 64};
    group = make_group(many, 5, B, B, B);
    expect_geom_error(TIDE_ERR_INVALID_ARGUMENT, &topo, &group, "parameter 3");
    many[3] = (tide_param_shape_t){64, 64};
    many[0] = (tide_param_shape_t){64, 0};
    expect_geom_error(TIDE_ERR_INVALID_ARGUMENT, &topo, &group, "parameter 0");
    many[0] = (tide_param_shape_t){64, 64};

    /* dtypes: FP16 is recognised but not served; out-of-enum values are caller bugs. */
    const struct {
        tide_dtype_t ag, grad, shard;
        tide_result_t code;
        const char *needle;
    } dt[] = {
        {H, B, B, TIDE_ERR_UNSUPPORTED, "ag_dtype"},
        {B, H, B, TIDE_ERR_UNSUPPORTED, "grad_dtype"},
        {B, B, H, TIDE_ERR_UNSUPPORTED, "shard_dtype"},
        {H, H, H, TIDE_ERR_UNSUPPORTED, NULL},
        {(tide_dtype_t)99, B, B, TIDE_ERR_INVALID_ARGUMENT, "ag_dtype"},
        {B, (tide_dtype_t)99, B, TIDE_ERR_INVALID_ARGUMENT, "grad_dtype"},
        {B, B, (tide_dtype_t)99, TIDE_ERR_INVALID_ARGUMENT, "shard_dtype"},
        {(tide_dtype_t)-1, B, B, TIDE_ERR_INVALID_ARGUMENT, "ag_dtype"},
        {B, B, TIDE_DTYPE_COUNT, TIDE_ERR_INVALID_ARGUMENT, "shard_dtype"},
        /* a bf16 shard gathered as fp32 is not a cast FSDP2 performs */
        {F, B, B, TIDE_ERR_UNSUPPORTED, "shard_dtype"},
        {F, F, B, TIDE_ERR_UNSUPPORTED, "shard_dtype"},
    };
    for (size_t i = 0; i < sizeof(dt) / sizeof(dt[0]); ++i) {
        group = make_group(many, 4, dt[i].ag, dt[i].grad, dt[i].shard);
        expect_geom_error(dt[i].code, &topo, &group, dt[i].needle);
    }
    /* The accepted combinations and their cast flag. */
    const tide_dtype_t ok[][4] = {{B, B, B, 0}, {B, F, B, 0}, {F, F, F, 0},
                                  {F, B, F, 0}, {B, B, F, 1}, {B, F, F, 1}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); ++i) {
        group = make_group(many, 4, ok[i][0], ok[i][1], ok[i][2]);
        assert_tide(TIDE_SUCCESS, tide_geom_build(&topo, &group, &g));
        assert_int_equal(g.cast, ok[i][3] != 0);
        tide_geom_free(&g);
    }
    free(many);
}

/* Each overflow is caught at the first quantity that leaves 64 bits, and named. */
static void test_overflow(void **state) {
    (void)state;
    const tide_dtype_t B = TIDE_DTYPE_BF16, F = TIDE_DTYPE_FP32;
    const struct {
        int nodes, gpus;
        int np;
        tide_param_shape_t shape;
        tide_dtype_t ag, grad;
        const char *needle;
    } cases[] = {
        /* D_p K_p = 2^80 */
        {8, 8, 1, {1ull << 40, 1ull << 40}, B, B, "D_p * K_p"},
        {1, 1, 1, {UINT64_MAX, 2}, B, B, "D_p * K_p"},
        /* D_p K_p = 2^62 elements of fp32: s_p = 2^64 */
        {1, 1, 1, {1ull << 31, 1ull << 31}, F, F, "s_p"},
        /* four shards of 2^62 bytes: S = 2^64 */
        {1, 1, 4, {1ull << 61, 1}, B, B, "prefix of S"},
        /* N = 2, s_p = 2^63: N S = 2^64 */
        {1, 2, 1, {1ull << 63, 1}, B, B, "N S"},
        /* sum R K = 2^62, fp32 gradients: S_grad = 2^64 */
        {1, 1, 1, {1ull << 62, 1}, B, F, "S_grad"},
        /* sum R K = 2^62, bf16 everywhere: S = S_grad = 2^63, S_fp32 = 2^64 */
        {1, 1, 1, {1ull << 62, 1}, B, B, "S_fp32"},
        /* N = 4, sum R K = 2^60: N S = 2^63 fits, B_pack = 2^64 */
        {1, 4, 1, {1ull << 62, 1}, B, B, "B_pack"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        tide_topo_t topo = make_topo(cases[i].nodes, cases[i].gpus);
        tide_param_shape_t shapes[4];
        for (int p = 0; p < cases[i].np; ++p)
            shapes[p] = cases[i].shape;
        tide_group_desc_t group =
            make_group(shapes, cases[i].np, cases[i].ag, cases[i].grad, cases[i].ag);
        expect_geom_error(TIDE_ERR_OVERFLOW, &topo, &group, cases[i].needle);
    }
    /* Just below the B_pack limit everything fits, and the last landing ends at N S. */
    tide_topo_t topo = make_topo(1, 4);
    tide_param_shape_t shape = {(1ull << 62) - 4, 1};
    tide_group_desc_t group = make_group(&shape, 1, B, B, B);
    tide_geom_t g;
    assert_tide(TIDE_SUCCESS, tide_geom_build(&topo, &group, &g));
    assert_int_equal(g.pack_bytes, UINT64_MAX - 15);
    assert_int_equal(tide_geom_landing(&g, 0, 3) + g.params[0].shard_bytes, g.group_bytes);
    tide_geom_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topology),           cmocka_unit_test(test_geometry_vs_brute_force),
        cmocka_unit_test(test_landing_runs_large), cmocka_unit_test(test_rs_rows_corners),
        cmocka_unit_test(test_bad_groups),         cmocka_unit_test(test_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
