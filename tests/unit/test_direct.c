/*
 * test_direct.c - direct mode's program analysis (src/program/direct.h) on real compiled
 * programs, without a fabric.
 *
 * Checked properties: with only the SUM bit, exactly the copies into STAGING are elided, and
 * there is one at every topology with L > 1; at M = 1 the fuse plan covers every landing and
 * every non-empty segment of a fused SUM; every elided inbox copy reads a bank-dependent
 * SPARE / OUTBOX source and every landing segment that touches its destination reads inside
 * it, every ALIAS entry points into an elided copy, every ZERO entry is a range no copy or
 * SUM writes; a landing mutated to read an aliased copy's destination partly makes that copy
 * stay; the all-gather elides only puts of the sender's shard into a receive stage, its
 * readers are flat copies inside the put, and nothing is elided when every rank is its own
 * memory domain; mask 0 and the fence give an empty analysis.
 */
#include "test_util.h"

#include "plan/plan.h"
#include "program/direct.h"
#include "program/program.h"

#include <stdlib.h>
#include <string.h>

static const tide_param_shape_t shapes[] = {{105, 9}, {10, 16}, {3, 1}, {41, 4}};

typedef struct {
    tide_plan_t plan;
    tide_program_t prog;
    tide_schedule_t sched;
} compiled_t;

static void compile(compiled_t *c, int m, int l, int coll, tide_rs_mode_t mode, int wave) {
    /* The generic programs: the rail lane at L = 1 has nothing to elide (test_rail_lane). */
    c->plan = test_plan_lane(m, l, wave, 0, mode, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, shapes, 4,
                             TIDE_LANE_GENERIC);
    if (coll)
        assert_tide(TIDE_SUCCESS, tide_program_compile_rs(c->plan, mode, &c->prog));
    else
        assert_tide(TIDE_SUCCESS, tide_program_compile_ag(c->plan, &c->prog));
    assert_tide(TIDE_SUCCESS, tide_schedule_layout(&c->prog, &c->sched));
}

static void release(compiled_t *c) {
    tide_schedule_free(&c->sched);
    tide_program_free(&c->prog);
    tide_plan_destroy(c->plan);
}

static const tide_op_t *op_at(const compiled_t *c, int id) {
    return tide_schedule_op(&c->prog, &c->sched, id, tide_direct_thread_of(&c->sched, id));
}

static const tide_table_t *table_at(const compiled_t *c, int id) {
    const int t = tide_direct_thread_of(&c->sched, id);
    return &c->prog.ranks[t / TIDE_Q_COUNT].tables[op_at(c, id)->table];
}

static bool is_copy(const tide_op_t *op) {
    return op->kind == TIDE_OP_COPY || op->kind == TIDE_OP_COPY2D;
}

static uint64_t dst_span(const tide_op_t *op) {
    if (op->kind != TIDE_OP_COPY2D) return op->bytes;
    return op->rows == 0 ? 0 : (op->rows - 1) * op->dst_pitch + op->bytes;
}

static const int topos[][2] = {{1, 2}, {1, 8}, {2, 4}, {3, 2}, {4, 2}, {2, 2}};
#define NUM_TOPOS (int)(sizeof(topos) / sizeof(topos[0]))

static void test_staging_only(void **state) {
    (void)state;
    for (int t = 0; t < NUM_TOPOS; ++t)
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
            compiled_t c;
            compile(&c, topos[t][0], topos[t][1], 1, (tide_rs_mode_t)mode, 0);
            tide_direct_t d;
            assert_tide(TIDE_SUCCESS,
                        tide_direct_analyse(&c.prog, &c.sched, TIDE_DIRECT_SUM, NULL, &d));
            assert_true(d.rs && d.sum);
            assert_null(d.fuse);
            int pushes = 0;
            for (int id = 0; id < c.sched.num_ops; ++id) {
                const tide_op_t *op = op_at(&c, id);
                const bool push = is_copy(op) && op->dst.kind == TIDE_REF_ARENA &&
                                  op->dst.region == TIDE_REGION_STAGING;
                pushes += push;
                if (push != (d.elide[id] != 0))
                    fail_msg("%dx%d mode %d: op %d (%s) elided %d, a staging push %d", topos[t][0],
                             topos[t][1], mode, id, tide_op_kind_name(op->kind), d.elide[id], push);
                if (op->kind == TIDE_OP_LAND) assert_null(d.land_src[id]);
            }
            assert_true(pushes > 0);
            tide_direct_free(&d);
            release(&c);
        }
}

static void test_fuse_m1(void **state) {
    (void)state;
    static const int ls[] = {2, 4, 8};
    for (int i = 0; i < 3; ++i)
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
            compiled_t c;
            compile(&c, 1, ls[i], 1, (tide_rs_mode_t)mode, 0);
            tide_direct_t d;
            assert_tide(TIDE_SUCCESS,
                        tide_direct_analyse(&c.prog, &c.sched, TIDE_DIRECT_ALL, NULL, &d));
            int lands = 0, sums = 0;
            for (int id = 0; id < c.sched.num_ops; ++id) {
                const tide_op_t *op = op_at(&c, id);
                if (op->kind == TIDE_OP_LAND) {
                    ++lands;
                    if (!d.fused_land[id])
                        fail_msg("1x%d mode %d: landing %d not fused", ls[i], mode, id);
                }
                if (op->kind != TIDE_OP_SUM) continue;
                ++sums;
                assert_non_null(d.fuse[id]);
                const tide_table_t *st = table_at(&c, id);
                assert_int_equal(d.fuse_segs[id], st->num_segs);
                for (int q = 0; q < st->num_segs; ++q) {
                    const tide_direct_fuse_seg_t *f = &d.fuse[id][q];
                    if (st->sum_segs[q].len == 0) continue;
                    assert_true(f->land >= 0 && d.fused_land[f->land]);
                    const tide_table_t *lt = table_at(&c, f->land);
                    assert_int_equal(lt->land_segs[f->seg].len, st->sum_segs[q].len);
                }
            }
            assert_true(lands > 0 && sums > 0);
            tide_direct_free(&d);
            release(&c);
        }
}

/* The landing inputs' byte ranges, for the alias and zero rules. */
static void check_land_sources(const compiled_t *c, const tide_direct_t *d, int *aliases,
                               int *zeros) {
    for (int id = 0; id < c->sched.num_ops; ++id) {
        if (d->land_src[id] == NULL) continue;
        const tide_table_t *lt = table_at(c, id);
        for (int g = 0; g < lt->num_segs; ++g)
            for (int k = 0; k < lt->num_in; ++k) {
                const tide_direct_land_src_t *o = &d->land_src[id][g * lt->num_in + k];
                const tide_ref_t *in = &lt->in[k];
                const uint64_t lo = in->offset + lt->land_segs[g].in_off * 4u;
                const uint64_t hi = lo + lt->land_segs[g].len * 4u;
                if (o->kind == TIDE_DIRECT_LAND_ALIAS) {
                    ++*aliases;
                    assert_true(d->elide[o->copy]);
                    const tide_op_t *cp = op_at(c, o->copy);
                    assert_int_equal(cp->dst.rank, in->rank);
                    assert_int_equal(cp->dst.region, TIDE_REGION_INBOX);
                    assert_int_equal(cp->dst.offset + o->delta, lo);
                    assert_true(o->delta + (hi - lo) <= cp->bytes);
                } else if (o->kind == TIDE_DIRECT_LAND_ZERO) {
                    ++*zeros;
                    /* No copy or SUM of the program writes any byte of it. */
                    for (int w = 0; w < c->sched.num_ops; ++w) {
                        const tide_op_t *op = op_at(c, w);
                        if (!is_copy(op) || op->dst.kind != TIDE_REF_ARENA ||
                            op->dst.rank != in->rank || op->dst.region != in->region)
                            continue;
                        assert_false(op->dst.offset < hi && lo < op->dst.offset + dst_span(op));
                    }
                }
            }
    }
}

static void test_alias_rules(void **state) {
    (void)state;
    int aliases = 0, zeros = 0;
    for (int t = 0; t < NUM_TOPOS; ++t) {
        if (topos[t][0] < 2) continue;
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode)
            for (int wave = 0; wave <= 1; ++wave) {
                compiled_t c;
                compile(&c, topos[t][0], topos[t][1], 1, (tide_rs_mode_t)mode, wave);
                tide_direct_t d;
                assert_tide(TIDE_SUCCESS,
                            tide_direct_analyse(&c.prog, &c.sched, TIDE_DIRECT_ALL, NULL, &d));
                for (int id = 0; id < c.sched.num_ops; ++id) {
                    const tide_op_t *op = op_at(&c, id);
                    if (!d.elide[id] || op->dst.region != TIDE_REGION_INBOX) continue;
                    assert_int_equal(op->kind, TIDE_OP_COPY);
                    assert_true(op->bank_dep);
                    assert_true(op->src.region == TIDE_REGION_SPARE ||
                                op->src.region == TIDE_REGION_OUTBOX);
                    /* Every landing segment touching its destination reads inside it. */
                    const uint64_t c0 = op->dst.offset, c1 = c0 + op->bytes;
                    for (int l = 0; l < c.sched.num_ops; ++l) {
                        if (op_at(&c, l)->kind != TIDE_OP_LAND) continue;
                        const tide_table_t *lt = table_at(&c, l);
                        for (int g = 0; g < lt->num_segs; ++g)
                            for (int k = 0; k < lt->num_in; ++k) {
                                const tide_ref_t *in = &lt->in[k];
                                if (in->rank != op->dst.rank || in->region != TIDE_REGION_INBOX)
                                    continue;
                                const uint64_t lo = in->offset + lt->land_segs[g].in_off * 4u;
                                const uint64_t hi = lo + lt->land_segs[g].len * 4u;
                                if (lo < c1 && c0 < hi) assert_true(c0 <= lo && hi <= c1);
                            }
                    }
                }
                check_land_sources(&c, &d, &aliases, &zeros);
                tide_direct_free(&d);
                release(&c);
            }
    }
    print_message("alias entries %d, zero entries %d\n", aliases, zeros);
    assert_true(aliases > 0);
    assert_true(zeros > 0);
}

/* Rule (c): a landing that reads an aliased copy's destination partly keeps the copy. */
static void test_partial_read_keeps_copy(void **state) {
    (void)state;
    compiled_t c;
    compile(&c, 2, 4, 1, TIDE_RS_IN_PLACE, 0);
    tide_direct_t d;
    assert_tide(TIDE_SUCCESS, tide_direct_analyse(&c.prog, &c.sched, TIDE_DIRECT_ALL, NULL, &d));
    int land = -1, seg = -1, copy = -1;
    for (int id = 0; id < c.sched.num_ops && land < 0; ++id) {
        if (d.land_src[id] == NULL) continue;
        const tide_table_t *lt = table_at(&c, id);
        for (int g = 0; g < lt->num_segs && land < 0; ++g)
            for (int k = 0; k < lt->num_in; ++k)
                if (d.land_src[id][g * lt->num_in + k].kind == TIDE_DIRECT_LAND_ALIAS) {
                    land = id, seg = g, copy = d.land_src[id][g * lt->num_in + k].copy;
                    break;
                }
    }
    assert_true(land >= 0);
    assert_true(d.elide[copy]);
    tide_direct_free(&d);
    /* One element more than the copy writes: the landing's segment ends past it. */
    tide_land_seg_t *sg = (tide_land_seg_t *)&table_at(&c, land)->land_segs[seg];
    const tide_op_t *cp = op_at(&c, copy);
    sg->len = (uint32_t)(cp->bytes / 4u + 1u);
    assert_tide(TIDE_SUCCESS, tide_direct_analyse(&c.prog, &c.sched, TIDE_DIRECT_ALL, NULL, &d));
    assert_false(d.elide[copy]);
    tide_direct_free(&d);
    release(&c);
}

/* The rail lane's programs (L = 1, the default there) are analysed as having no shortcut. */
static void test_rail_lane(void **state) {
    (void)state;
    for (int coll = 0; coll < 2; ++coll) {
        compiled_t c;
        c.plan = test_plan(4, 1, 0, 0, TIDE_RS_IN_PLACE, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, shapes,
                           4);
        if (coll)
            assert_tide(TIDE_SUCCESS, tide_program_compile_rs(c.plan, TIDE_RS_IN_PLACE, &c.prog));
        else
            assert_tide(TIDE_SUCCESS, tide_program_compile_ag(c.plan, &c.prog));
        assert_tide(TIDE_SUCCESS, tide_schedule_layout(&c.prog, &c.sched));
        tide_direct_t d;
        assert_tide(TIDE_SUCCESS, tide_direct_analyse(&c.prog, &c.sched, TIDE_DIRECT_ALL, NULL, &d));
        assert_false(d.rs);
        assert_false(d.ag);
        for (int id = 0; d.elide != NULL && id < c.sched.num_ops; ++id)
            assert_false(d.elide[id]);
        tide_direct_free(&d);
        release(&c);
    }
}

static void test_all_gather(void **state) {
    (void)state;
    static const int ag_topos[][2] = {{2, 4}, {3, 2}, {4, 2}, {5, 1}};
    for (int t = 0; t < 4; ++t) {
        compiled_t c;
        compile(&c, ag_topos[t][0], ag_topos[t][1], 0, TIDE_RS_IN_PLACE, 0);
        const int n = c.prog.num_ranks;
        tide_direct_t d;
        assert_tide(TIDE_SUCCESS,
                    tide_direct_analyse(&c.prog, &c.sched, TIDE_DIRECT_ALL, NULL, &d));
        assert_true(d.ag);
        assert_false(d.rs);
        int elided = 0, readers = 0;
        for (int id = 0; id < c.sched.num_ops; ++id) {
            const tide_op_t *op = op_at(&c, id);
            const int sender = tide_direct_thread_of(&c.sched, id) / TIDE_Q_COUNT;
            if (d.elide[id]) {
                ++elided;
                assert_int_equal(op->kind, TIDE_OP_COPY);
                assert_int_equal(op->src.kind, TIDE_REF_SHARD);
                assert_int_equal(op->dst.region, TIDE_REGION_RECV_STAGE);
                assert_true(d.ag_wait[sender * n + op->dst.rank]);
            }
            if (d.ag_src[id].put >= 0) {
                ++readers;
                assert_int_equal(op->kind, TIDE_OP_COPY);
                const tide_op_t *put = op_at(&c, d.ag_src[id].put);
                assert_true(d.elide[d.ag_src[id].put]);
                assert_int_equal(op->src.rank, put->dst.rank);
                assert_int_equal(op->src.offset, put->dst.offset + d.ag_src[id].delta);
                assert_true(d.ag_src[id].delta + op->bytes <= put->bytes);
            }
        }
        assert_true(elided > 0 && readers >= elided);
        tide_direct_free(&d);
        /* Every rank its own memory: no put is between two ranks of one. */
        int *dom = malloc((size_t)n * sizeof(*dom));
        for (int r = 0; r < n; ++r)
            dom[r] = r;
        assert_tide(TIDE_SUCCESS, tide_direct_analyse(&c.prog, &c.sched, TIDE_DIRECT_ALL, dom, &d));
        assert_false(d.ag);
        assert_null(d.elide);
        tide_direct_free(&d);
        free(dom);
        release(&c);
    }
}

static void test_nothing_to_do(void **state) {
    (void)state;
    compiled_t c;
    compile(&c, 2, 2, 1, TIDE_RS_IN_PLACE, 0);
    tide_direct_t d;
    assert_tide(TIDE_SUCCESS, tide_direct_analyse(&c.prog, &c.sched, 0, NULL, &d));
    assert_false(d.rs || d.ag);
    assert_null(d.elide);
    tide_direct_free(&d);
    /* Ranks of one node in two domains: the reduce-scatter's shortcuts do not apply. */
    const int dom[4] = {0, 1, 2, 3};
    assert_tide(TIDE_SUCCESS, tide_direct_analyse(&c.prog, &c.sched, TIDE_DIRECT_ALL, dom, &d));
    assert_false(d.rs);
    tide_direct_free(&d);
    /* The AG bit alone does nothing for a reduce-scatter. */
    assert_tide(TIDE_SUCCESS, tide_direct_analyse(&c.prog, &c.sched, TIDE_DIRECT_AG, NULL, &d));
    assert_false(d.rs || d.ag);
    tide_direct_free(&d);
    release(&c);

    compiled_t f;
    f.plan = test_plan(2, 2, 0, 0, TIDE_RS_IN_PLACE, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, shapes, 4);
    assert_tide(TIDE_SUCCESS, tide_program_compile_fence(f.plan, false, &f.prog));
    assert_tide(TIDE_SUCCESS, tide_schedule_layout(&f.prog, &f.sched));
    assert_tide(TIDE_SUCCESS, tide_direct_analyse(&f.prog, &f.sched, TIDE_DIRECT_ALL, NULL, &d));
    assert_false(d.rs || d.ag);
    tide_direct_free(&d);
    release(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_staging_only), cmocka_unit_test(test_fuse_m1),
        cmocka_unit_test(test_alias_rules),  cmocka_unit_test(test_partial_read_keeps_copy),
        cmocka_unit_test(test_all_gather),
        cmocka_unit_test(test_rail_lane),   cmocka_unit_test(test_nothing_to_do),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
