/*
 * test_sync_elide_plan.c - the synchronisation elision as the fabrics run it
 * (tide_sync_elide_build, src/program/sync_elide_plan.c): the schedule's commands of a fused
 * direct-mode reduce-scatter at M = 1 with every wait and signal but STAGED left out.
 *
 * Checked at N = 2, 4, 8, both modes, on shapes with padding (so the output has ZEROs) and in
 * both forms: the elision applies; every kept RECORD / WAIT names a STAGED signal and no
 * WAIT_PREV is left; every rank records N - 1 STAGED signals and its SUM's stream waits on
 * one STAGED signal of every peer before the SUM; the late ops are exactly the NET queue's
 * ZEROs and the EVENTs, and no command runs them; every forked thread is joined once and
 * nothing runs on a thread that is not forked.  The all-gather at M = 1 keeps READY only, and
 * every copy into a peer's landing waits for that peer's READY.  A schedule that lacks one STAGED wait before
 * a SUM is refused (on false, with the rank named); other shapes give on false, not an
 * error; the counts of the one-process-per-rank fabric drop to 5 memory operations per rank
 * (one flag write for a rank's run of N - 1 STAGED signals, merge_records; the STAGED waits
 * one run, issued as one operation).
 */
#include "test_util.h"

#include "plan/plan.h"
#include "program/compile_rs.h"
#include "program/direct.h"
#include "program/stream_ops.h"
#include "program/sync_elide.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const tide_param_shape_t shapes[] = {{64, 64}, {64, 64}, {105, 9}, {3, 1}};

typedef struct {
    tide_plan_t plan;
    tide_program_t prog;
    tide_schedule_t sched;
    tide_direct_t dir;
    tide_sync_elide_t se;
} world_t;

static void world_init(world_t *w, int m, int l, tide_rs_mode_t mode) {
    memset(w, 0, sizeof(*w));
    w->plan = test_plan_lane(m, l, 0, 0, mode, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, shapes, 4,
                             TIDE_LANE_GENERIC);
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(w->plan, mode, &w->prog));
    assert_tide(TIDE_SUCCESS, tide_schedule_build(&w->prog, &w->sched));
    assert_tide(TIDE_SUCCESS,
                tide_direct_analyse(&w->prog, &w->sched, TIDE_DIRECT_SUM | TIDE_DIRECT_FUSE, NULL,
                                    &w->dir));
    assert_tide(TIDE_SUCCESS, tide_sync_elide_build(&w->prog, &w->sched, &w->dir, &w->se));
}

static void world_free(world_t *w) {
    tide_sync_elide_free(&w->se);
    tide_direct_free(&w->dir);
    tide_schedule_free(&w->sched);
    tide_program_free(&w->prog);
    tide_plan_destroy(w->plan);
}

static int slot_op(const tide_schedule_t *s, int slot) {
    for (int id = 0; id < s->num_ops; ++id)
        if (s->op_slot[id] == slot) return id;
    return -1;
}

static void check_form(const world_t *w, int f, int n) {
    const tide_schedule_t *s = &w->sched;
    const tide_sync_elide_t *se = &w->se;
    int *records = calloc((size_t)n, sizeof(int)), *joins = calloc((size_t)s->num_threads, sizeof(int));
    bool *forked = calloc((size_t)s->num_threads, sizeof(bool));
    uint8_t *staged = calloc((size_t)s->num_threads * (size_t)n, 1);
    uint8_t *recorded = calloc((size_t)s->num_slots + 1, 1);
    int sums = 0;
    assert_non_null(records);
    assert_non_null(joins);
    assert_non_null(forked);
    assert_non_null(staged);
    assert_non_null(recorded);
    for (int i = 0; i < se->num_cmds[f]; ++i) {
        const tide_sched_cmd_t *c = &se->cmds[f][i];
        const int t = c->thread, r = t / TIDE_Q_COUNT;
        switch (c->kind) {
        case TIDE_SCHED_CMD_WAIT_PREV:
            fail_msg("a WAIT_PREV is left (thread %d)", t);
            break;
        case TIDE_SCHED_CMD_RECORD:
        case TIDE_SCHED_CMD_WAIT: {
            const int id = slot_op(s, c->arg);
            assert_true(id >= 0);
            const int st = s->slot_thread[c->arg];
            const tide_op_t *op = tide_schedule_op(&w->prog, s, id, st);
            assert_int_equal(op->ctr, TIDE_CTR_RS_STAGED);
            assert_true(forked[t] || c->kind == TIDE_SCHED_CMD_WAIT);
            /* A wait names a record made earlier in the list; the peers' waits on a rank's
             * run of records name its first (merge_records), whatever its target. */
            if (c->kind == TIDE_SCHED_CMD_RECORD) {
                ++records[r];
                recorded[c->arg] = 1;
            } else {
                assert_true(recorded[c->arg]);
                staged[(size_t)t * (size_t)n + (size_t)(st / TIDE_Q_COUNT)] = 1;
            }
            break;
        }
        case TIDE_SCHED_CMD_FORK:
            assert_false(forked[t]);
            forked[t] = true;
            break;
        case TIDE_SCHED_CMD_JOIN:
            assert_true(forked[t]);
            ++joins[t];
            break;
        case TIDE_SCHED_CMD_OP: {
            assert_false(se->late[c->arg]);
            const tide_op_t *op = tide_schedule_op(&w->prog, s, c->arg, t);
            if (tide_sync_elide_issues(&w->prog, s, &w->dir, se, c->arg, t))
                assert_true(forked[t]);
            if (op->kind == TIDE_OP_SUM) {
                ++sums;
                for (int u = 0; u < n; ++u)
                    if (u != r) assert_true(staged[(size_t)t * (size_t)n + (size_t)u]);
            }
            break;
        }
        default:
            assert_true(forked[t]); /* uploads */
            break;
        }
    }
    assert_int_equal(sums, n);
    for (int r = 0; r < n; ++r)
        assert_int_equal(records[r], 1); /* N - 1 STAGED signals, one flag write */
    for (int t = 0; t < s->num_threads; ++t)
        assert_int_equal(joins[t], forked[t] ? 1 : 0);
    free(records);
    free(joins);
    free(forked);
    free(staged);
    free(recorded);
}

static void test_layer_shapes(void **state) {
    (void)state;
    for (int n = 2; n <= 8; n *= 2)
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
            world_t w;
            world_init(&w, 1, n, (tide_rs_mode_t)mode);
            assert_true(w.se.on);
            /* Late: the NET queue's ZEROs (some, the shapes pad) and every EVENT. */
            int zeros = 0;
            for (int t = 0; t < w.sched.num_threads; ++t)
                for (int id = w.sched.op_base[t]; id < w.sched.op_base[t + 1]; ++id) {
                    const tide_op_t *op = tide_schedule_op(&w.prog, &w.sched, id, t);
                    const bool late = op->kind == TIDE_OP_EVENT ||
                                      (op->kind == TIDE_OP_ZERO && t % TIDE_Q_COUNT == TIDE_Q_NET);
                    assert_int_equal(w.se.late[id], late);
                    zeros += op->kind == TIDE_OP_ZERO;
                    const bool sync = tide_machine_uses_counter(op);
                    assert_int_equal(w.se.drop[id], sync && op->ctr != TIDE_CTR_RS_STAGED);
                }
            assert_true(zeros > 0);
            for (int f = 0; f < TIDE_SCHED_FORMS; ++f)
                check_form(&w, f, n);
            /* What the one-process-per-rank fabric enqueues per rank. */
            for (int r = 0; r < n; ++r) {
                tide_stream_ops_t o, full;
                assert_tide(TIDE_SUCCESS, tide_stream_ops_count(&w.prog, &w.sched, &w.dir, &w.se,
                                                                TIDE_STREAM_OPS_FLAGS, r,
                                                                TIDE_SCHED_STEADY, &o, NULL));
                assert_tide(TIDE_SUCCESS, tide_stream_ops_count(&w.prog, &w.sched, &w.dir, NULL,
                                                                TIDE_STREAM_OPS_FLAGS, r,
                                                                TIDE_SCHED_STEADY, &full, NULL));
                assert_int_equal(o.records, 1);
                assert_int_equal(o.waits_peer, n - 1);
                assert_int_equal(o.waits_own, 0);
                assert_int_equal(o.sum_waits_peer, n - 1);
                /* The record, the STAGED waits (one run), "began", done and the end fence;
                 * the start fence is implied by the previous call's end fence. */
                assert_int_equal(tide_stream_ops_memops(&o, false), n + 3);
                assert_int_equal(o.wait_calls, 1);
                assert_int_equal(tide_stream_ops_memops(&o, true), 5);
                assert_int_equal(o.elided, full.elided);
                assert_int_equal(o.fused, full.fused);
                assert_int_equal(o.sums, full.sums);
                /* The ZEROs move, the events too (read-done was the executor's already). */
                assert_int_equal(o.copies, full.copies);
                assert_int_equal(o.events, full.events + 1);
                assert_true(tide_stream_ops_memops(&o, true) < tide_stream_ops_memops(&full, true));
            }
            world_free(&w);
        }
}

/* The all-gather at M = 1: only READY's signals and waits stay, every copy into a peer's
 * landing waits for that peer's READY of the call, call-done is late, and the
 * one-process-per-rank fabric enqueues 5 memory operations per rank (N + 4 with every wait
 * alone). */
static void test_all_gather(void **state) {
    (void)state;
    for (int n = 2; n <= 8; n *= 2) {
        tide_plan_t plan = test_plan_lane(1, n, 0, 0, TIDE_RS_IN_PLACE, TIDE_DTYPE_BF16,
                                          TIDE_DTYPE_BF16, shapes, 4, TIDE_LANE_GENERIC);
        tide_program_t prog;
        tide_schedule_t sched;
        tide_sync_elide_t se;
        assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &prog));
        assert_tide(TIDE_SUCCESS, tide_schedule_build(&prog, &sched));
        assert_tide(TIDE_SUCCESS, tide_sync_elide_build(&prog, &sched, NULL, &se));
        assert_true(se.on);
        for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
            uint8_t ready[8][8]; /* [thread rank][peer]: a READY wait seen on rank's caller */
            uint8_t recorded[256];
            assert_true(sched.num_slots <= 256);
            memset(ready, 0, sizeof(ready));
            memset(recorded, 0, sizeof(recorded));
            int copies = 0;
            for (int i = 0; i < se.num_cmds[f]; ++i) {
                const tide_sched_cmd_t *c = &se.cmds[f][i];
                const int r = c->thread / TIDE_Q_COUNT;
                assert_int_not_equal(c->kind, TIDE_SCHED_CMD_WAIT_PREV);
                if (c->kind == TIDE_SCHED_CMD_RECORD || c->kind == TIDE_SCHED_CMD_WAIT) {
                    const int st = sched.slot_thread[c->arg];
                    const tide_op_t *op = tide_schedule_op(&prog, &sched, slot_op(&sched, c->arg), st);
                    assert_int_equal(op->ctr, TIDE_CTR_AG_READY);
                    assert_true(c->kind == TIDE_SCHED_CMD_RECORD || recorded[c->arg]);
                    if (c->kind == TIDE_SCHED_CMD_RECORD) recorded[c->arg] = 1;
                    if (c->kind == TIDE_SCHED_CMD_WAIT) ready[r][st / TIDE_Q_COUNT] = 1;
                }
                if (c->kind != TIDE_SCHED_CMD_OP) continue;
                assert_false(se.late[c->arg]);
                const tide_op_t *op = tide_schedule_op(&prog, &sched, c->arg, c->thread);
                if (op->kind != TIDE_OP_COPY) continue;
                ++copies;
                if (op->dst.rank != r) assert_true(ready[r][op->dst.rank]);
            }
            assert_true(copies >= n * n);
        }
        for (int id = 0; id < sched.num_ops; ++id) {
            const int t = tide_direct_thread_of(&sched, id);
            assert_int_equal(se.late[id],
                             tide_schedule_op(&prog, &sched, id, t)->kind == TIDE_OP_EVENT);
        }
        for (int r = 0; r < n; ++r) {
            tide_stream_ops_t o, full;
            assert_tide(TIDE_SUCCESS, tide_stream_ops_count(&prog, &sched, NULL, &se,
                                                            TIDE_STREAM_OPS_FLAGS, r,
                                                            TIDE_SCHED_STEADY, &o, NULL));
            assert_tide(TIDE_SUCCESS, tide_stream_ops_count(&prog, &sched, NULL, NULL,
                                                            TIDE_STREAM_OPS_FLAGS, r,
                                                            TIDE_SCHED_STEADY, &full, NULL));
            assert_int_equal(o.records, 1);
            assert_int_equal(tide_stream_ops_memops(&o, false), n + 4);
            assert_int_equal(o.wait_calls, 1); /* the N READY waits: one run */
            assert_int_equal(tide_stream_ops_memops(&o, true), 5);
            assert_int_equal(o.copies, full.copies);
            assert_int_equal(o.events, full.events);
            if (r == 0)
                printf("  all-gather N = %d: %d stream memory operations per rank (%d with "
                       "every signal)\n",
                       n, tide_stream_ops_memops(&o, true), tide_stream_ops_memops(&full, true));
        }
        tide_sync_elide_free(&se);
        tide_schedule_free(&sched);
        tide_program_free(&prog);
        tide_plan_destroy(plan);
    }
}

/* A schedule whose rank-1 SUM lacks the WAIT on rank 0's STAGED signal is refused. */
static void test_missing_staged_wait_refused(void **state) {
    (void)state;
    world_t w;
    world_init(&w, 1, 4, TIDE_RS_IN_PLACE);
    assert_true(w.se.on);
    tide_sync_elide_free(&w.se);
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        tide_sched_cmd_t *c = w.sched.cmds[f];
        int k = 0, removed = 0;
        for (int i = 0; i < w.sched.num_cmds[f]; ++i) {
            if (c[i].kind == TIDE_SCHED_CMD_WAIT && c[i].thread / TIDE_Q_COUNT == 1 &&
                w.sched.slot_thread[c[i].arg] / TIDE_Q_COUNT == 0) {
                const int id = slot_op(&w.sched, c[i].arg);
                const tide_op_t *op =
                    tide_schedule_op(&w.prog, &w.sched, id, w.sched.slot_thread[c[i].arg]);
                if (op->ctr == TIDE_CTR_RS_STAGED) {
                    ++removed;
                    continue;
                }
            }
            c[k++] = c[i];
        }
        assert_true(removed > 0);
        w.sched.num_cmds[f] = k;
    }
    assert_tide(TIDE_SUCCESS, tide_sync_elide_build(&w.prog, &w.sched, &w.dir, &w.se));
    assert_false(w.se.on);
    printf("  refused: %s\n", w.se.why);
    assert_non_null(strstr(w.se.why, "rank 1's sum does not wait for rank 0's STAGED"));
    assert_null(w.se.cmds[0]);
    world_free(&w);
}

/* Two nodes, or no direct analysis: not applicable, and not an error. */
static void test_other_shapes(void **state) {
    (void)state;
    world_t w;
    world_init(&w, 2, 2, TIDE_RS_IN_PLACE);
    assert_false(w.se.on);
    assert_true(strlen(w.se.why) > 0);
    tide_sync_elide_free(&w.se);
    tide_direct_t none;
    memset(&none, 0, sizeof(none));
    assert_tide(TIDE_SUCCESS, tide_sync_elide_build(&w.prog, &w.sched, &none, &w.se));
    assert_false(w.se.on);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_sync_elide_build(NULL, &w.sched, &none, &w.se));
    world_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_shapes),
        cmocka_unit_test(test_all_gather),
        cmocka_unit_test(test_missing_staged_wait_refused),
        cmocka_unit_test(test_other_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
