/*
 * test_capture.c - whether a call could be captured into a CUDA graph now
 * (tide_group_capture_readiness, api/capture.c), on the CPU fabric.
 *
 * The CPU fabric captures nothing, so the public query always carries TIDE_CAPTURE_NO_FABRIC
 * there; what is tested is the fabric-independent half that every fabric shares: which
 * cross-group fence variant a call of a set group runs first (tide_set_fence_variant, the
 * rule tide_set_fence runs), whether its program and that fence variant ran, and the reason
 * that names the first blocker.  A script of calls on a set of three groups (A and C share
 * ring slot 0, B has slot 1) is run on every rank; before and after each call the verdict is
 * compared with what the call then does (a fence runs exactly when one was predicted).  Also:
 * a group registered alone, and bad input (clear errors, the output left untouched).
 */
#include "e2e_util.h"

#include "core/checks.h"
#include "api/comm.h"

#include <stdlib.h>
#include <string.h>

#define NG 3
enum { A = 0, B = 1, C = 2 };

typedef struct {
    tide_comm_t comms[4];
    int n;
    tide_rs_mode_t mode;
    tide_config_t cfg;
    tide_param_shape_t shapes[NG][2];
    tide_group_desc_t desc[NG];
    tide_group_entry_t entries[NG];
    char names[NG][8];
    e2e_report_t rep[4];
} ctx_t;

typedef struct {
    e2e_report_t *rep;
    tide_group_t g[NG];
    void *grads[NG][2];
    float *out[NG];
} rank_t;

/* The public verdict on a call of group i must be exactly `want` (bits), and its reason must
 * name `text` (NULL: no check). */
static void expect_public(rank_t *k, int i, tide_call_kind_t call, uint32_t want, const char *text,
                          const char *step) {
    tide_capture_readiness_t v;
    memset(&v, 0x5a, sizeof(v));
    const tide_result_t res = tide_group_capture_readiness(k->g[i], call, NULL, &v);
    if (res != TIDE_SUCCESS) {
        e2e_note(k->rep, "%s: capture_readiness failed: %s", step, tide_get_last_error());
        return;
    }
    if (v.blockers != want)
        e2e_note(k->rep, "%s: blockers 0x%x, expected 0x%x (%s)", step, v.blockers, want, v.reason);
    else if (text != NULL && strstr(v.reason, text) == NULL)
        e2e_note(k->rep, "%s: reason \"%s\" does not name \"%s\"", step, v.reason, text);
}

/* The internal half: the fence variant the call would run first, and its cold bits. */
static void expect_books(rank_t *k, int i, tide_call_kind_t call, int variant, uint32_t want,
                         const char *step) {
    const struct tide_group *g = k->g[i];
    tide_set_use_t use;
    tide_group_call_use(g, call, &use);
    const uint32_t bit =
        call == TIDE_CALL_ALL_GATHER ? TIDE_RAN_AG : TIDE_RAN_RS(g->plan->config.mode);
    tide_capture_verdict_t v;
    memset(&v, 0, sizeof(v));
    const int got = tide_capture_bookkeeping(g, bit, "call", &use, &v);
    char reason[TIDE_CAPTURE_REASON_MAX];
    tide_capture_reason(&v, reason, sizeof(reason));
    if (got != variant || tide_set_fence_variant(g, &use) != variant)
        e2e_note(k->rep, "%s: fence variant %d, expected %d", step, got, variant);
    if (v.blockers != want)
        e2e_note(k->rep, "%s: bookkeeping blockers 0x%x, expected 0x%x (%s)", step, v.blockers,
                 want, reason);
    if ((want == 0) != (reason[0] == '\0'))
        e2e_note(k->rep, "%s: reason \"%s\" with blockers 0x%x", step, reason, v.blockers);
}

/* Run a call of group i and check that it ran the fence exactly when one was predicted. */
static void call(rank_t *k, int i, tide_call_kind_t kind, tide_rs_mode_t mode, const char *step) {
    struct tide_group *g = k->g[i];
    tide_set_use_t use;
    tide_group_call_use(g, kind, &use);
    const int variant = tide_set_fence_variant(g, &use);
    const uint64_t fences = g->fences;
    tide_result_t res;
    if (kind == TIDE_CALL_ALL_GATHER)
        res = tide_all_gather(g, NULL, 0, NULL);
    else
        res = tide_reduce_scatter(g, (const void *const *)k->grads[i], k->out[i], 1.0f, 0, mode,
                                  NULL);
    if (res != TIDE_SUCCESS) {
        e2e_note(k->rep, "%s: %s", step, tide_get_last_error());
        return;
    }
    if (g->fences != fences + (variant >= 0 ? 1u : 0u))
        e2e_note(k->rep, "%s: %llu fences ran, %s predicted", step,
                 (unsigned long long)(g->fences - fences), variant >= 0 ? "one" : "none");
    if (variant >= 0 && (g->ran & TIDE_RAN_FENCE(variant)) == 0)
        e2e_note(k->rep, "%s: fence variant %d ran, its bit is not set", step, variant);
}

static const uint32_t NOFAB = TIDE_CAPTURE_NO_FABRIC;
static const uint32_t COLD = TIDE_CAPTURE_PROGRAM_COLD;
static const uint32_t FCOLD = TIDE_CAPTURE_FENCE_COLD;

static void script_rank(int rank, void *p) {
    ctx_t *c = p;
    rank_t rk = {.rep = &c->rep[rank]}, *k = &rk;
    if (tide_groups_register(c->comms[rank], NG, c->entries, k->g) != TIDE_SUCCESS) {
        e2e_note(k->rep, "groups_register: %s", tide_get_last_error());
        return;
    }
    for (int i = 0; i < NG; ++i) {
        const struct tide_plan *pl = k->g[i]->plan;
        for (int q = 0; q < pl->geom.num_params; ++q)
            k->grads[i][q] = calloc(pl->geom.params[q].dim0 * pl->geom.params[q].inner, 2);
        k->out[i] = calloc(1, pl->geom.fp32_shard_bytes);
    }
    const tide_call_kind_t AG = TIDE_CALL_ALL_GATHER, RS = TIDE_CALL_REDUCE_SCATTER;
    const tide_rs_mode_t m = c->mode;

    /* Nothing ran: every program is cold, no fence is due (no resource has a last user). */
    expect_books(k, A, AG, -1, COLD, "A's first all-gather");
    expect_public(k, A, AG, COLD | NOFAB, "first call of a program", "A's first all-gather");
    expect_public(k, A, RS, COLD | NOFAB, "\"A\"", "A's first reduce-scatter");
    call(k, A, AG, m, "all_gather A");
    /* A's all-gather ran and A used its resources last: only the fabric blocks it. */
    expect_books(k, A, AG, -1, 0, "A's second all-gather");
    expect_public(k, A, AG, NOFAB, "cpu", "A's second all-gather");
    /* C lands in A's ring slot 0 after A: fence variant 0, never run by C. */
    if (tide_group_reshard(k->g[A]) != TIDE_SUCCESS)
        e2e_note(k->rep, "reshard A: %s", tide_get_last_error());
    expect_books(k, C, AG, 0, COLD | FCOLD, "C's first all-gather");
    expect_public(k, C, AG, COLD | FCOLD | NOFAB, "\"C\"", "C's first all-gather");
    call(k, C, AG, m, "all_gather C");
    expect_books(k, C, AG, -1, 0, "C's second all-gather");
    /* A's reduce-scatter: the RS regions have no user yet, so no fence; its program is cold. */
    expect_books(k, A, RS, -1, COLD, "A's first reduce-scatter");
    call(k, A, RS, m, "reduce_scatter A");
    expect_books(k, A, RS, -1, 0, "A's second reduce-scatter");
    /* C's reduce-scatter takes the RS regions over from A: variant 1, never run by C. */
    expect_books(k, C, RS, 1, COLD | FCOLD, "C's first reduce-scatter");
    expect_public(k, C, RS, COLD | FCOLD | NOFAB, "first call of a program",
                  "C's first reduce-scatter");
    call(k, C, RS, m, "reduce_scatter C");
    /* Back to A: its program ran, but it never took the RS regions over (variant 1). */
    expect_books(k, A, RS, 1, FCOLD, "A's reduce-scatter after C's");
    expect_public(k, A, RS, FCOLD | NOFAB, "cross-group fence (variant 1",
                  "A's reduce-scatter after C's");
    /* The reason has a sentence per blocker, the fabric's after the group's. */
    expect_public(k, A, RS, FCOLD | NOFAB, "; the cpu fabric captures no call",
                  "A's reduce-scatter after C's (fabric)");
    call(k, A, RS, m, "reduce_scatter A after C");
    expect_books(k, A, RS, -1, 0, "A's reduce-scatter after its own");
    /* Once A ran variant 1, the hand-over back from C is warm for A too. */
    call(k, C, RS, m, "reduce_scatter C after A");
    expect_books(k, A, RS, 1, 0, "A's reduce-scatter after C's, warm");
    expect_public(k, A, RS, NOFAB, "cpu", "A's reduce-scatter after C's, warm");
    /* B, in slot 1, still never ran anything; the staged form touches its own slot too. */
    expect_public(k, B, TIDE_CALL_REDUCE_SCATTER_STAGED, COLD | FCOLD | NOFAB, "\"B\"",
                  "B's staged reduce-scatter");

    for (int i = 0; i < NG; ++i) {
        if (tide_group_deregister(k->g[i]) != TIDE_SUCCESS)
            e2e_note(k->rep, "deregister: %s", tide_get_last_error());
        for (int q = 0; q < 2; ++q)
            free(k->grads[i][q]);
        free(k->out[i]);
    }
}

static void setup(ctx_t *c, tide_rs_mode_t mode) {
    memset(c, 0, sizeof(*c));
    c->n = 2;
    c->mode = mode;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = 1;
    cfg.gpus_per_node = 2;
    cfg.mode = mode;
    c->cfg = cfg;
    for (int i = 0; i < NG; ++i) {
        for (int p = 0; p < 2; ++p)
            c->shapes[i][p] = (tide_param_shape_t){(uint64_t)(5 + 2 * i + p), (uint64_t)(8 + i)};
        c->desc[i] =
            (tide_group_desc_t){2, c->shapes[i], TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16};
        snprintf(c->names[i], sizeof(c->names[i]), "%c", 'A' + i);
        c->entries[i] = (tide_group_entry_t){&c->cfg, &c->desc[i], i == B ? 1 : 0, c->names[i]};
    }
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 2, c->comms));
}

static void teardown(ctx_t *c) {
    for (int r = 0; r < c->n; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(c->comms[r]));
}

static void test_set_script(void **state) {
    (void)state;
    for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
        ctx_t *c = calloc(1, sizeof(*c));
        assert_non_null(c);
        setup(c, (tide_rs_mode_t)mode);
        e2e_run_threads(c->n, script_rank, c);
        e2e_assert_reports(c->rep, c->n);
        teardown(c);
        free(c);
    }
}

/* A group registered alone: no fence ever; its programs cold until they ran. */
static void alone_rank(int rank, void *p) {
    ctx_t *c = p;
    rank_t rk = {.rep = &c->rep[rank]}, *k = &rk;
    if (tide_group_register(c->comms[rank], &c->cfg, &c->desc[0], &k->g[0]) != TIDE_SUCCESS) {
        e2e_note(k->rep, "group_register: %s", tide_get_last_error());
        return;
    }
    const struct tide_plan *pl = k->g[0]->plan;
    for (int q = 0; q < pl->geom.num_params; ++q)
        k->grads[0][q] = calloc(pl->geom.params[q].dim0 * pl->geom.params[q].inner, 2);
    k->out[0] = calloc(1, pl->geom.fp32_shard_bytes);
    expect_public(k, 0, TIDE_CALL_ALL_GATHER, COLD | NOFAB, "all-gather", "alone, first AG");
    expect_public(k, 0, TIDE_CALL_REDUCE_SCATTER, COLD | NOFAB, "reduce-scatter",
                  "alone, first RS");
    call(k, 0, TIDE_CALL_ALL_GATHER, c->mode, "alone all_gather");
    call(k, 0, TIDE_CALL_REDUCE_SCATTER, c->mode, "alone reduce_scatter");
    expect_public(k, 0, TIDE_CALL_ALL_GATHER, NOFAB, "cpu", "alone, second AG");
    expect_public(k, 0, TIDE_CALL_REDUCE_SCATTER_STAGED, NOFAB, "cpu", "alone, second RS");
    if (k->g[0]->fences != 0) e2e_note(k->rep, "a group alone ran a fence");
    if (tide_group_deregister(k->g[0]) != TIDE_SUCCESS)
        e2e_note(k->rep, "deregister: %s", tide_get_last_error());
    for (int q = 0; q < 2; ++q)
        free(k->grads[0][q]);
    free(k->out[0]);
}

static void test_alone(void **state) {
    (void)state;
    ctx_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    setup(c, TIDE_RS_IN_PLACE);
    e2e_run_threads(c->n, alone_rank, c);
    e2e_assert_reports(c->rep, c->n);
    teardown(c);
    free(c);
}

static void test_bad_input(void **state) {
    (void)state;
    ctx_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    setup(c, TIDE_RS_IN_PLACE);
    tide_capture_readiness_t v;
    memset(&v, 0x5a, sizeof(v));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_group_capture_readiness(NULL, TIDE_CALL_ALL_GATHER, NULL, &v));
    /* A handle that is not a group (a communicator). */
    assert_tide(
        TIDE_ERR_INVALID_ARGUMENT,
        tide_group_capture_readiness((tide_group_t)c->comms[0], TIDE_CALL_ALL_GATHER, NULL, &v));
    assert_int_equal(v.blockers, 0x5a5a5a5au); /* untouched */
    tide_group_t g = NULL;
    /* One rank registers alone: the CPU fabric's arena_create is collective, so use a world
     * of one rank for the argument checks. */
    tide_comm_t one = NULL;
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 1, &one));
    tide_config_t cfg = c->cfg;
    cfg.nodes = cfg.gpus_per_node = 0;
    assert_tide(TIDE_SUCCESS, tide_group_register(one, &cfg, &c->desc[0], &g));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_group_capture_readiness(g, (tide_call_kind_t)TIDE_CALL_KIND_COUNT, NULL, &v));
    assert_non_null(strstr(tide_get_last_error(), "tide_call_kind_t"));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_group_capture_readiness(g, (tide_call_kind_t)-1, NULL, &v));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_group_capture_readiness(g, TIDE_CALL_ALL_GATHER, NULL, NULL));
    assert_non_null(strstr(tide_get_last_error(), "readiness_out"));
    assert_int_equal(v.blockers, 0x5a5a5a5au);
    /* A valid query clears the last error and answers. */
    assert_tide(TIDE_SUCCESS, tide_group_capture_readiness(g, TIDE_CALL_ALL_GATHER, NULL, &v));
    assert_int_equal(v.blockers, TIDE_CAPTURE_PROGRAM_COLD | TIDE_CAPTURE_NO_FABRIC);
    assert_string_equal(tide_get_last_error(), "");
    assert_tide(TIDE_SUCCESS, tide_group_deregister(g));
    /* A released group is refused, not read. */
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_group_capture_readiness(g, TIDE_CALL_ALL_GATHER, NULL, &v));
    assert_tide(TIDE_SUCCESS, tide_comm_destroy(one));
    teardown(c);
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_alone),
        cmocka_unit_test(test_set_script),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
