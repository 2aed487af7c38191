/*
 * test_arena.c - a set of groups on one shared arena (docs/arena.md) on the CPU fabric.
 *
 * FSDP order over several steps, with prefetch (tide_ring_fsdp_calls): the root (own slot)
 * gathered first and kept, the blocks gathered and resharded in forward, then gathered again
 * and reduce-scattered in reverse in backward (Slot-Reuse: gradients staged in the block's
 * own ring slot).  Every call
 * is repeated on the same groups registered alone, and the landings and outputs must be equal
 * bit for bit (wide-exponent bf16 data, so a changed summation order would show).  Also: the
 * arena's size against tide_arena_plan's figure and the bound of docs/arena.md, and misuse.
 */
#include "e2e_util.h"

#include "core/checks.h"
#include "api/comm.h"
#include "plan/arena_plan.h"
#include "program/check_ring.h"

#include <stdlib.h>
#include <string.h>

#define BLOCKS 5
#define GROUPS (BLOCKS + 1) /* the root is the last entry */
#define ROOT BLOCKS
#define STEPS 3
#define MAX_P 3

typedef struct {
    int m, l, n;
    tide_rs_mode_t mode;
    tide_comm_t comms[E2E_MAX_RANKS];
    tide_config_t cfg;
    tide_param_shape_t shapes[GROUPS][MAX_P];
    tide_group_desc_t desc[GROUPS];
    tide_group_entry_t entries[GROUPS];
    char names[GROUPS][16];
    tide_group_t set[E2E_MAX_RANKS][GROUPS];
    uint64_t fences[E2E_MAX_RANKS];
    e2e_report_t rep[E2E_MAX_RANKS];
} ctx_t;

static void setup(ctx_t *c, int m, int l, tide_rs_mode_t mode) {
    memset(c, 0, sizeof(*c));
    c->m = m;
    c->l = l;
    c->n = m * l;
    c->mode = mode;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    cfg.mode = mode;
    c->cfg = cfg;
    for (int i = 0; i < GROUPS; ++i) {
        /* Different sizes, rows not divisible by N (padding), the root the largest. */
        const int np = i == ROOT ? 2 : 3;
        for (int p = 0; p < np; ++p) {
            c->shapes[i][p].dim0 = (uint64_t)(i == ROOT ? 37 + 3 * p : 5 + 3 * i + p);
            c->shapes[i][p].inner = (uint64_t)(i == ROOT ? 24 : 7 + 2 * p + i);
        }
        c->desc[i] = (tide_group_desc_t){np, c->shapes[i], TIDE_DTYPE_BF16, TIDE_DTYPE_BF16,
                                         TIDE_DTYPE_BF16};
        snprintf(c->names[i], sizeof(c->names[i]), i == ROOT ? "root" : "layers.%d", i);
        c->entries[i] = (tide_group_entry_t){&c->cfg, &c->desc[i],
                                             i == ROOT ? TIDE_RING_OWN_SLOT : i % 2, c->names[i]};
    }
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, m, l, c->comms));
}

static void teardown(ctx_t *c) {
    for (int r = 0; r < c->n; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(c->comms[r]));
}

/* Wide-exponent bf16: exponents over 2^-40 .. 2^40, both signs. */
static uint16_t wide_bf16(e2e_rng_t *g) {
    const uint64_t x = e2e_rng_next(g);
    const uint16_t exp = (uint16_t)(127 - 40 + (int)(x % 81));
    return (uint16_t)(((x >> 20) & 1) << 15 | exp << 7 | ((x >> 32) & 0x7f));
}

static void fill(uint16_t *buf, uint64_t elems, uint64_t seed) {
    e2e_rng_t g = {seed * 0x9e3779b97f4a7c15ull + 1};
    for (uint64_t i = 0; i < elems; ++i)
        buf[i] = wide_bf16(&g);
}

static uint64_t seed_of(int kind, int group, int rank, int step) {
    return (uint64_t)kind << 48 | (uint64_t)group << 32 | (uint64_t)rank << 16 | (uint64_t)step;
}

/* ------------------------------------------------------------------ one rank's script */

typedef struct {
    tide_group_t set, alone;
    const struct tide_plan *plan;
    uint16_t *shards; /* N shards of this step, S bytes each */
    uint16_t *grads;  /* sum D_p K_p, this rank's, packed in parameter order */
    float *out_set, *out_alone;
} member_t;

static void check_landing(ctx_t *c, int rank, member_t *mb, int step, const char *phase) {
    e2e_report_t *rep = &c->rep[rank];
    void *a = NULL, *b = NULL;
    if (tide_group_landing(mb->set, 0, &a) != TIDE_SUCCESS ||
        tide_group_landing(mb->alone, 0, &b) != TIDE_SUCCESS) {
        e2e_note(rep, "landing: %s", tide_get_last_error());
        return;
    }
    const tide_geom_t *g = &mb->plan->geom;
    if (memcmp(a, b, g->group_bytes) != 0)
        e2e_note(rep, "step %d %s: the shared arena's landing differs from the group alone's", step,
                 phase);
    /* And from the shards themselves: Landing(p, r) holds rank r's shard of p. */
    for (int p = 0; p < g->num_params; ++p)
        for (int r = 0; r < c->n; ++r) {
            const uint8_t *want =
                (const uint8_t *)mb->shards + (uint64_t)r * g->shard_bytes + g->params[p].offset;
            if (memcmp((uint8_t *)a + tide_geom_landing(g, p, r), want, g->params[p].shard_bytes) !=
                0)
                e2e_note(rep, "step %d %s: landing of p %d from rank %d is wrong", step, phase, p,
                         r);
        }
}

static tide_result_t gather(ctx_t *c, int rank, member_t *mb, int i, int step, bool resident) {
    const tide_geom_t *g = &mb->plan->geom;
    const uint16_t *mine = mb->shards + (uint64_t)rank * g->shard_bytes / 2;
    if (resident) {
        void *res = NULL;
        TIDE_CHECK(tide_group_resident(mb->set, &res));
        memcpy(res, mine, g->shard_bytes);
    }
    TIDE_CHECK(tide_all_gather(mb->set, resident ? NULL : mine, 0, NULL));
    TIDE_CHECK(tide_all_gather(mb->alone, mine, 0, NULL));
    check_landing(c, rank, mb, step, i == ROOT ? "root AG" : "AG");
    return TIDE_SUCCESS;
}

static tide_result_t reduce(ctx_t *c, int rank, member_t *mb, int step) {
    const tide_geom_t *g = &mb->plan->geom;
    const void *grads_alone[MAX_P], *grads_set[MAX_P];
    uint8_t *staged = NULL;
    if (c->mode == TIDE_RS_SLOT_REUSE) {
        void *slot = NULL;
        TIDE_CHECK(tide_group_landing(mb->set, 0, &slot));
        staged = slot; /* the vacated ring slot: the parameters are dead after backward */
    }
    uint64_t off = 0;
    for (int p = 0; p < g->num_params; ++p) {
        const uint64_t bytes = g->params[p].dim0 * g->params[p].inner * 2;
        grads_alone[p] = (const uint8_t *)mb->grads + off;
        if (staged != NULL) memcpy(staged + off, grads_alone[p], bytes);
        grads_set[p] = staged != NULL ? staged + off : grads_alone[p];
        off += bytes;
    }
    const float alpha = tide_alpha_avg(c->n);
    const int acc = step > 0;
    TIDE_CHECK(tide_reduce_scatter(mb->set, grads_set, mb->out_set, alpha, acc, c->mode, NULL));
    TIDE_CHECK(
        tide_reduce_scatter(mb->alone, grads_alone, mb->out_alone, alpha, acc, c->mode, NULL));
    if (memcmp(mb->out_set, mb->out_alone, g->fp32_shard_bytes) != 0)
        e2e_note(&c->rep[rank], "step %d: RS output on the shared arena differs from alone", step);
    bool nonzero = false;
    for (uint64_t e = 0; e < g->shard_elems; ++e)
        nonzero |= mb->out_set[e] != 0.0f;
    if (!nonzero) e2e_note(&c->rep[rank], "step %d: RS output is all zero", step);
    int live = -1;
    TIDE_CHECK(tide_group_slot_live(mb->set, &live));
    if (live) e2e_note(&c->rep[rank], "step %d: the slot is still live after its RS", step);
    return TIDE_SUCCESS;
}

static void new_step(ctx_t *c, int rank, member_t *mb, int i, int step) {
    const tide_geom_t *g = &mb->plan->geom;
    for (int r = 0; r < c->n; ++r)
        fill(mb->shards + (uint64_t)r * g->shard_bytes / 2, g->shard_bytes / 2,
             seed_of(1, i, r, step));
    uint64_t elems = 0;
    for (int p = 0; p < g->num_params; ++p)
        elems += g->params[p].dim0 * g->params[p].inner;
    fill(mb->grads, elems, seed_of(2, i, rank, step));
}

/* FSDP2's order with prefetch depth one (tide_ring_fsdp_calls): the root gathered first and
 * kept, block b + 1 gathered before block b is resharded in forward, block b - 1 before
 * block b's reduce-scatter in backward. */
static tide_result_t script(ctx_t *c, int rank, member_t *mb) {
    tide_ring_call_t *calls = NULL;
    int n = 0;
    TIDE_CHECK(tide_ring_fsdp_calls(BLOCKS, 1, c->mode, STEPS, &calls, &n));
    tide_result_t res = TIDE_SUCCESS;
    const int per_step = n / STEPS;
    for (int k = 0; k < n && res == TIDE_SUCCESS; ++k) {
        const int step = k / per_step, i = calls[k].group;
        if (k % per_step == 0)
            for (int q = 0; q < GROUPS; ++q)
                new_step(c, rank, &mb[q], q, step);
        switch (calls[k].kind) {
        case TIDE_RING_CALL_AG:
            /* The root and the even blocks read the resident region in forward. */
            res = gather(c, rank, &mb[i], i, step, k % per_step < per_step / 2 && i % 2 == 0);
            break;
        case TIDE_RING_CALL_RESHARD:
            res = tide_group_reshard(mb[i].set);
            break;
        default: /* RS (In-Place, after the reshard) or RS_STAGED (Slot-Reuse) */
            res = reduce(c, rank, &mb[i], step);
            break;
        }
    }
    free(calls);
    return res;
}

static void rank_main(int rank, void *p) {
    ctx_t *c = p;
    e2e_report_t *rep = &c->rep[rank];
    member_t mb[GROUPS];
    memset(mb, 0, sizeof(mb));
    if (tide_groups_register(c->comms[rank], GROUPS, c->entries, c->set[rank]) != TIDE_SUCCESS) {
        e2e_note(rep, "groups_register: %s", tide_get_last_error());
        return;
    }
    bool ok = true;
    for (int i = 0; i < GROUPS && ok; ++i) {
        mb[i].set = c->set[rank][i];
        mb[i].plan = mb[i].set->plan;
        ok =
            tide_group_register(c->comms[rank], &c->cfg, &c->desc[i], &mb[i].alone) == TIDE_SUCCESS;
        const tide_geom_t *g = &mb[i].plan->geom;
        mb[i].shards = calloc((size_t)c->n, g->shard_bytes);
        mb[i].grads = calloc(1, g->pack_bytes); /* >= sum D_p K_p x 2 */
        mb[i].out_set = calloc(1, g->fp32_shard_bytes);
        mb[i].out_alone = calloc(1, g->fp32_shard_bytes);
    }
    if (!ok || script(c, rank, mb) != TIDE_SUCCESS) e2e_note(rep, "%s", tide_get_last_error());
    c->fences[rank] = 0;
    for (int i = 0; i < GROUPS; ++i)
        c->fences[rank] += mb[i].set->fences;
    for (int i = 0; i < GROUPS; ++i) {
        if (tide_group_deregister(mb[i].set) != TIDE_SUCCESS)
            e2e_note(rep, "deregister: %s", tide_get_last_error());
        if (mb[i].alone != NULL) tide_group_deregister(mb[i].alone);
        free(mb[i].shards);
        free(mb[i].grads);
        free(mb[i].out_set);
        free(mb[i].out_alone);
    }
}

static void run_fsdp_order(int m, int l, tide_rs_mode_t mode) {
    ctx_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    setup(c, m, l, mode);
    e2e_run_threads(c->n, rank_main, c);
    e2e_assert_reports(c->rep, c->n);
    /* Different groups take turns on the shared regions: fences must have run. */
    for (int r = 0; r < c->n; ++r)
        assert_true(c->fences[r] > 0);
    teardown(c);
    free(c);
}

static void test_fsdp_in_place_1x4(void **state) {
    (void)state;
    run_fsdp_order(1, 4, TIDE_RS_IN_PLACE);
}
static void test_fsdp_slot_reuse_1x4(void **state) {
    (void)state;
    run_fsdp_order(1, 4, TIDE_RS_SLOT_REUSE);
}
static void test_fsdp_in_place_2x2(void **state) {
    (void)state;
    run_fsdp_order(2, 2, TIDE_RS_IN_PLACE);
}
static void test_fsdp_slot_reuse_2x2(void **state) {
    (void)state;
    run_fsdp_order(2, 2, TIDE_RS_SLOT_REUSE);
}

/* ------------------------------------------------------------------ sizes */

static void register_rank(int rank, void *p) {
    ctx_t *c = p;
    if (tide_groups_register(c->comms[rank], GROUPS, c->entries, c->set[rank]) != TIDE_SUCCESS)
        e2e_note(&c->rep[rank], "groups_register: %s", tide_get_last_error());
}

static void deregister_rank(int rank, void *p) {
    ctx_t *c = p;
    for (int i = 0; i < GROUPS; ++i)
        if (tide_group_deregister(c->set[rank][i]) != TIDE_SUCCESS)
            e2e_note(&c->rep[rank], "deregister %d: %s", i, tide_get_last_error());
}

static void check_sizes(int m, int l, tide_rs_mode_t mode) {
    ctx_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    setup(c, m, l, mode);
    tide_arena_plan_t ap = NULL;
    assert_tide(TIDE_SUCCESS, tide_arena_plan_create(GROUPS, c->entries, &ap));
    tide_arena_summary_t s;
    assert_tide(TIDE_SUCCESS, tide_arena_plan_get_summary(ap, &s));
    assert_int_equal(s.num_groups, GROUPS);
    assert_int_equal(s.largest_group, ROOT);

    /* The bound of docs/arena.md: 2 x the largest N S + the largest group's receive stage and
     * RS regions + every resident shard and signal page + one alignment per region. */
    tide_plan_t big;
    assert_tide(TIDE_SUCCESS, tide_arena_plan_group(ap, s.largest_group, &big));
    tide_region_info_t recv;
    assert_tide(TIDE_SUCCESS, tide_plan_get_region(big, TIDE_REGION_RECV_STAGE, &recv));
    const uint64_t blocks = TIDE_REGION_COUNT + 2 * GROUPS + GROUPS;
    const uint64_t bound = 2 * s.largest_group_bytes + recv.bytes + s.largest_rs_bytes +
                           s.region_bytes[TIDE_REGION_RESIDENT] +
                           s.region_bytes[TIDE_REGION_SIGNALS] + blocks * TIDE_ARENA_ALIGN;
    /* The root has an own slot: the ring's two slots hold the blocks, which are smaller. */
    assert_true(s.total_bytes <= bound + s.own_slot_bytes);
    assert_true(s.region_bytes[TIDE_REGION_LANDING0] + s.region_bytes[TIDE_REGION_LANDING1] <=
                2 * s.largest_group_bytes);
    assert_true(s.total_bytes < s.separate_bytes);
    if (m == 1) { /* nothing for other nodes' data at M = 1: no receive stage, no outbox */
        assert_int_equal(s.region_bytes[TIDE_REGION_RECV_STAGE], 0);
        assert_int_equal(s.region_bytes[TIDE_REGION_OUTBOX], 0);
    }

    /* The registered arena is exactly the planned one, and each group's landing is its ring
     * slot of the shared arena. */
    e2e_run_threads(c->n, register_rank, c);
    e2e_assert_reports(c->rep, c->n);
    for (int r = 0; r < c->n; ++r) {
        const struct tide_fabric_arena *a = c->set[r][0]->arena;
        assert_int_equal(a->bytes, s.total_bytes);
        for (int i = 0; i < GROUPS; ++i) {
            void *land = NULL;
            tide_region_info_t info;
            assert_tide(TIDE_SUCCESS, tide_group_landing(c->set[r][i], 0, &land));
            assert_tide(TIDE_SUCCESS,
                        tide_arena_plan_get_region(ap, i, TIDE_REGION_LANDING0, &info));
            assert_ptr_equal(land, a->bases[r] + info.offset);
            if (i != ROOT) {
                tide_region_info_t slot;
                assert_tide(TIDE_SUCCESS,
                            tide_arena_plan_get_region(
                                ap, -1, (tide_region_t)(TIDE_REGION_LANDING0 + i % 2), &slot));
                assert_int_equal(info.offset, slot.offset);
            }
            void *ignored;
            assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_landing(c->set[r][i], 1, &ignored));
        }
    }
    /* Deregistration is collective and runs on the ranks' own threads. */
    e2e_run_threads(c->n, deregister_rank, c);
    e2e_assert_reports(c->rep, c->n);
    tide_arena_plan_destroy(ap);
    teardown(c);
    free(c);
}

static void test_sizes(void **state) {
    (void)state;
    check_sizes(1, 4, TIDE_RS_IN_PLACE);
    check_sizes(1, 8, TIDE_RS_SLOT_REUSE);
    check_sizes(2, 2, TIDE_RS_IN_PLACE);
    check_sizes(4, 2, TIDE_RS_SLOT_REUSE);
}

static void test_plan_errors(void **state) {
    (void)state;
    ctx_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    setup(c, 1, 2, TIDE_RS_IN_PLACE);
    tide_arena_plan_t ap = NULL;
    c->entries[2].ring_slot = 2;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_arena_plan_create(GROUPS, c->entries, &ap));
    assert_non_null(strstr(tide_get_last_error(), "layers.2"));
    c->entries[2].ring_slot = 0;
    tide_config_t other = c->cfg;
    other.gpus_per_node = 1;
    c->entries[3].config = &other;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_arena_plan_create(GROUPS, c->entries, &ap));
    assert_non_null(strstr(tide_get_last_error(), "layers.3"));
    assert_null(ap);
    teardown(c);
    free(c);
}

/* ------------------------------------------------------------------ misuse */

#define EXPECT(rep, code, call, ...)                                                               \
    do {                                                                                           \
        const tide_result_t got_ = (call);                                                         \
        if (got_ != (code))                                                                        \
            e2e_note((rep), "line %d: %s returned %d, expected %d (%s)", __LINE__, #call,          \
                     (int)got_, (int)(code), tide_get_last_error());                               \
        const char *names_[] = {__VA_ARGS__};                                                      \
        for (size_t k_ = 0; got_ == (code) && k_ < sizeof(names_) / sizeof(*names_); ++k_)         \
            if (strstr(tide_get_last_error(), names_[k_]) == NULL)                                 \
                e2e_note((rep), "line %d: the message does not name %s: %s", __LINE__, names_[k_], \
                         tide_get_last_error());                                                   \
    } while (0)

#define EXPECT_OK(rep, call)                                                                       \
    do {                                                                                           \
        if ((call) != TIDE_SUCCESS)                                                                \
            e2e_note((rep), "line %d: %s failed: %s", __LINE__, #call, tide_get_last_error());     \
    } while (0)

static void misuse_rank(int rank, void *p) {
    ctx_t *c = p;
    e2e_report_t *rep = &c->rep[rank];
    tide_group_t *g = c->set[rank];
    if (tide_groups_register(c->comms[rank], GROUPS, c->entries, g) != TIDE_SUCCESS) {
        e2e_note(rep, "groups_register: %s", tide_get_last_error());
        return;
    }
    const struct tide_plan *pa = g[0]->plan;
    uint8_t *shard = calloc(1, g[ROOT]->plan->geom.fp32_shard_bytes * 4);
    float *out = calloc(1, g[ROOT]->plan->geom.fp32_shard_bytes);
    memset(shard, 0x3c, g[ROOT]->plan->geom.fp32_shard_bytes * 4);
    void *slot0 = NULL, *slot1 = NULL;
    tide_group_landing(g[0], 0, &slot0);
    tide_group_landing(g[1], 0, &slot1);

    EXPECT_OK(rep, tide_all_gather(g[0], shard, 0, NULL));
    EXPECT_OK(rep, tide_all_gather(g[1], shard, 0, NULL));
    uint8_t *before = malloc(pa->geom.group_bytes);
    memcpy(before, slot0, pa->geom.group_bytes);
    /* layers.2 shares ring slot 0 with layers.0, which is live. */
    EXPECT(rep, TIDE_ERR_INVALID_ARGUMENT, tide_all_gather(g[2], shard, 0, NULL), "\"layers.2\"",
           "\"layers.0\"", "ring slot 0");
    if (memcmp(before, slot0, pa->geom.group_bytes) != 0)
        e2e_note(rep, "a refused all-gather changed the live slot");
    EXPECT(rep, TIDE_ERR_INVALID_ARGUMENT, tide_group_reshard(g[2]), "layers.2");
    EXPECT(rep, TIDE_ERR_INVALID_ARGUMENT, tide_all_gather(g[1], shard, 1, NULL), "layers.1");
    int live = 0;
    tide_group_slot_live(g[0], &live);
    if (!live) e2e_note(rep, "layers.0 should hold its slot");
    EXPECT_OK(rep, tide_group_reshard(g[0]));
    EXPECT(rep, TIDE_ERR_INVALID_ARGUMENT, tide_group_reshard(g[0]), "layers.0");
    EXPECT_OK(rep, tide_all_gather(g[2], shard, 0, NULL));

    /* Gradients in a landing that is not the group's (the root's own slot), and staged in a
     * ring slot another group holds live (layers.3 shares slot 1 with layers.1; layers.0
     * slot 0 with layers.2). */
    const void *grads[MAX_P];
    void *root_slot = NULL;
    tide_group_landing(g[ROOT], 0, &root_slot);
    for (int q = 0; q < g[3]->plan->geom.num_params; ++q)
        grads[q] = root_slot;
    EXPECT(rep, TIDE_ERR_INVALID_ARGUMENT,
           tide_reduce_scatter(g[3], grads, out, 1.0f, 0, c->mode, NULL), "arena");
    for (int q = 0; q < g[3]->plan->geom.num_params; ++q)
        grads[q] = slot1;
    EXPECT(rep, TIDE_ERR_INVALID_ARGUMENT,
           tide_reduce_scatter(g[3], grads, out, 1.0f, 0, c->mode, NULL), "\"layers.3\"",
           "\"layers.1\"");
    for (int q = 0; q < pa->geom.num_params; ++q)
        grads[q] = slot0;
    EXPECT(rep, TIDE_ERR_INVALID_ARGUMENT,
           tide_reduce_scatter(g[0], grads, out, 1.0f, 0, c->mode, NULL), "\"layers.0\"",
           "\"layers.2\"");
    /* Nothing was poisoned: the groups still work. */
    for (int q = 0; q < g[2]->plan->geom.num_params; ++q)
        grads[q] = slot0;
    EXPECT_OK(rep, tide_reduce_scatter(g[2], grads, out, 1.0f, 0, c->mode, NULL));
    tide_group_slot_live(g[2], &live);
    if (live) e2e_note(rep, "layers.2's RS from its slot should have released it");
    EXPECT_OK(rep, tide_all_gather(g[0], shard, 0, NULL));
    free(before);
    free(shard);
    free(out);
    for (int i = 0; i < GROUPS; ++i)
        EXPECT_OK(rep, tide_group_deregister(g[i]));
}

/* ------------------------------------------------------------------ the ring model */

/* A call sequence of check_ring.h replayed on the CPU fabric: the runtime must refuse exactly
 * the call the model reports (or none), naming both groups. */
typedef struct {
    ctx_t *c;
    int slots[GROUPS];
    const tide_ring_call_t *calls;
    int num_calls;
    int refused_at[E2E_MAX_RANKS]; /* -1: every call succeeded */
    char message[E2E_MAX_RANKS][320];
} replay_t;

static void replay_rank(int rank, void *p) {
    replay_t *rp = p;
    ctx_t *c = rp->c;
    e2e_report_t *rep = &c->rep[rank];
    tide_group_t *g = c->set[rank];
    rp->refused_at[rank] = -1;
    if (tide_groups_register(c->comms[rank], GROUPS, c->entries, g) != TIDE_SUCCESS) {
        e2e_note(rep, "groups_register: %s", tide_get_last_error());
        return;
    }
    const uint64_t big = g[ROOT]->plan->geom.pack_bytes;
    uint8_t *buf = calloc(1, big);
    float *out = calloc(1, big);
    for (int k = 0; k < rp->num_calls && rp->refused_at[rank] < 0; ++k) {
        tide_group_t grp = g[rp->calls[k].group];
        const struct tide_plan *pl = grp->plan;
        const void *grads[MAX_P];
        void *slot = NULL;
        tide_group_landing(grp, 0, &slot);
        tide_result_t res = TIDE_SUCCESS;
        switch (rp->calls[k].kind) {
        case TIDE_RING_CALL_AG:
            res = tide_all_gather(grp, buf, 0, NULL);
            break;
        case TIDE_RING_CALL_RESHARD:
            res = tide_group_reshard(grp);
            break;
        default: {
            const bool staged = rp->calls[k].kind == TIDE_RING_CALL_RS_STAGED;
            uint64_t off = 0;
            for (int q = 0; q < pl->geom.num_params; ++q) {
                grads[q] = (staged ? (uint8_t *)slot : buf) + off;
                off += pl->geom.params[q].dim0 * pl->geom.params[q].inner * 2;
            }
            res = tide_reduce_scatter(grp, grads, out, 1.0f, 0, c->mode, NULL);
        }
        }
        if (res != TIDE_SUCCESS) {
            rp->refused_at[rank] = k;
            snprintf(rp->message[rank], sizeof(rp->message[rank]), "%s", tide_get_last_error());
            if (res != TIDE_ERR_INVALID_ARGUMENT)
                e2e_note(rep, "call %d: %s", k, rp->message[rank]);
        }
    }
    free(buf);
    free(out);
    for (int i = 0; i < GROUPS; ++i)
        if (tide_group_deregister(g[i]) != TIDE_SUCCESS)
            e2e_note(rep, "deregister: %s", tide_get_last_error());
}

static void replay(ctx_t *c, replay_t *rp, const tide_ring_report_t *model) {
    for (int i = 0; i < GROUPS; ++i)
        c->entries[i].ring_slot = rp->slots[i];
    rp->c = c;
    e2e_run_threads(c->n, replay_rank, rp);
    e2e_assert_reports(c->rep, c->n);
    for (int r = 0; r < c->n; ++r) {
        if (rp->refused_at[r] != model->call)
            print_error("rank %d: runtime refused call %d, the model %d (%s / %s)\n", r,
                        rp->refused_at[r], model->call, rp->message[r], model->message);
        assert_int_equal(rp->refused_at[r], model->call);
        if (model->call >= 0) {
            assert_non_null(strstr(rp->message[r], c->names[model->holder]));
            assert_non_null(strstr(rp->message[r], c->names[rp->calls[model->call].group]));
        }
    }
}

static void test_ring_model(void **state) {
    (void)state;
    for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
        ctx_t *c = calloc(1, sizeof(*c));
        replay_t *rp = calloc(1, sizeof(*rp));
        assert_true(c != NULL && rp != NULL);
        setup(c, 1, 2, (tide_rs_mode_t)mode);
        tide_ring_call_t *calls = NULL, mutated[128];
        int n = 0;
        assert_tide(TIDE_SUCCESS,
                    tide_ring_fsdp_calls(BLOCKS, 1, (tide_rs_mode_t)mode, 2, &calls, &n));
        assert_true(n <= 128);
        const char *names[GROUPS];
        for (int i = 0; i < GROUPS; ++i)
            names[i] = c->names[i];
        for (int f = -1; f < TIDE_RING_FAULT_KIND_COUNT; ++f) {
            for (int i = 0; i < GROUPS; ++i)
                rp->slots[i] = i == ROOT ? TIDE_RING_OWN_SLOT : i % 2;
            memcpy(mutated, calls, (size_t)n * sizeof(*calls));
            if (f >= 0)
                assert_tide(TIDE_SUCCESS, tide_ring_fault_inject((tide_ring_fault_t)f, 3, GROUPS,
                                                                 rp->slots, n, mutated));
            tide_ring_seq_t seq = {GROUPS, rp->slots, names, n, mutated};
            tide_ring_report_t model;
            assert_tide(TIDE_SUCCESS, tide_ring_check(&seq, &model));
            assert_int_equal(model.ok, f < 0);
            rp->calls = mutated;
            rp->num_calls = n;
            replay(c, rp, &model);
        }
        free(calls);
        teardown(c);
        free(c);
        free(rp);
    }
}

static void test_misuse(void **state) {
    (void)state;
    ctx_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    setup(c, 1, 2, TIDE_RS_SLOT_REUSE);
    e2e_run_threads(c->n, misuse_rank, c);
    e2e_assert_reports(c->rep, c->n);
    teardown(c);
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_plan_errors),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_ring_model),
        cmocka_unit_test(test_fsdp_in_place_1x4),
        cmocka_unit_test(test_fsdp_slot_reuse_1x4),
        cmocka_unit_test(test_fsdp_in_place_2x2),
        cmocka_unit_test(test_fsdp_slot_reuse_2x2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
