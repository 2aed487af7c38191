/*
 * test_sync_elide.c - the model of fused direct mode with the proposed synchronisation
 * removed (src/program/sync_elide.h), checked by the static checker with the end-of-call
 * fence written out and the callers' operand writes at call entry modelled.
 *
 * Checked: at M = 1 and N = 2, 4, 8 (both modes) the reduced model keeps exactly the STAGED
 * waits (one a rank, for N - 1 signals) and signals (N - 1 a rank), drops every other wait
 * and signal of the program, and passes every invariant over 3 calls (and 16 sampled
 * executions find no race either); dropping the STAGED waits and signals as well fails (a
 * race with the owner's caller on a gradient), and so do the reduction without the fence
 * and a fence that does not wait for the rank's queues; a peer operand reference is
 * malformed unless the checker models direct operands; other shapes are refused.
 */
#include "test_util.h"

#include "plan/plan.h"
#include "program/check.h"
#include "program/counters.h"
#include "program/program.h"
#include "program/sync_elide.h"

#include <stdio.h>
#include <string.h>

static const tide_param_shape_t shapes[] = {{64, 64}, {64, 64}, {105, 9}, {3, 1}};

static tide_check_report_t check_model(const tide_program_t *model, int direct_operands) {
    const tide_check_options_t o = {3, 1, 1, 0, 0, direct_operands};
    tide_check_report_t rep;
    assert_tide(TIDE_SUCCESS, tide_program_check_ex(model, &o, &rep));
    return rep;
}

/* Every WAIT / SIGNAL of the model is on STAGED or the fence's counters. */
static void assert_only_staged(const tide_program_t *m, int *staged_waits, int *staged_sigs) {
    *staged_waits = *staged_sigs = 0;
    for (int r = 0; r < m->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < m->ranks[r].queues[q].num_ops; ++i) {
                const tide_op_t *op = &m->ranks[r].queues[q].ops[i];
                const bool sync = op->kind == TIDE_OP_WAIT || op->kind == TIDE_OP_SIGNAL ||
                                  (op->kind <= TIDE_OP_COPY2D && op->sig_rank >= 0);
                if (!sync) continue;
                if (op->ctr == TIDE_SYNC_ELIDE_CTR_QUEUES || op->ctr == TIDE_SYNC_ELIDE_CTR_FENCE)
                    continue;
                assert_int_equal(op->ctr, TIDE_CTR_RS_STAGED);
                ++*(op->kind == TIDE_OP_WAIT ? staged_waits : staged_sigs);
            }
}

static void test_reduced_passes(void **state) {
    (void)state;
    for (int l = 2; l <= 8; l *= 2)
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
            tide_plan_t plan = test_plan_lane(1, l, 0, 0, (tide_rs_mode_t)mode, TIDE_DTYPE_BF16,
                                              TIDE_DTYPE_BF16, shapes, 4, TIDE_LANE_GENERIC);
            tide_program_t prog, model;
            assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, (tide_rs_mode_t)mode, &prog));
            /* The compiled program itself passes (the baseline the reduction starts from). */
            tide_check_report_t rep = check_model(&prog, 0);
            assert_true(rep.ok);

            tide_sync_elide_stats_t st;
            assert_tide(TIDE_SUCCESS,
                        tide_sync_elide_model(&prog, TIDE_SYNC_ELIDE_PROPOSAL, &model, &st));
            int waits, sigs;
            assert_only_staged(&model, &waits, &sigs);
            assert_int_equal(waits, l);
            assert_int_equal(sigs, l * (l - 1));
            assert_int_equal(st.waits_kept, waits);
            assert_int_equal(st.signals_kept, sigs);
            assert_true(st.waits_dropped > 0 && st.signals_dropped > 0);
            assert_true(st.pushes_elided >= l * (l - 1));
            assert_int_equal(st.landings_fused, l * l);
            rep = check_model(&model, 1);
            if (!rep.ok) print_error("L = %d mode %d: %s\n", l, mode, rep.message);
            assert_true(rep.ok);
            assert_true(rep.i1_checked);
            printf("L = %d mode %d: kept %d waits, %d signals; dropped %d waits, %d signals; "
                   "%s\n",
                   l, mode, st.waits_kept, st.signals_kept, st.waits_dropped, st.signals_dropped,
                   rep.message);
            /* Cross-check against executions: sampled runs that starve threads or ranks
             * find no race either. */
            const tide_check_options_t sampled = {3, 16, 7, 0, 1, 1};
            assert_tide(TIDE_SUCCESS, tide_program_check_ex(&model, &sampled, &rep));
            assert_true(rep.ok);

            /* A fence that does not wait for the rank's own queues orders nothing after
             * them: the reduction relies on the fence following every queue's work. */
            for (int r = 0; r < l; ++r) {
                tide_queue_ops_t *caller = &model.ranks[r].queues[TIDE_Q_CALLER];
                assert_int_equal(caller->ops[0].kind, TIDE_OP_WAIT);
                assert_int_equal(caller->ops[0].ctr, TIDE_SYNC_ELIDE_CTR_QUEUES);
                memmove(caller->ops, caller->ops + 1,
                        (size_t)(caller->num_ops - 1) * sizeof(tide_op_t));
                --caller->num_ops;
            }
            rep = check_model(&model, 1);
            assert_false(rep.ok);
            tide_program_free(&model);

            /* Without the STAGED waits a peer reads my gradients or writes my output before
             * my caller reached the call. */
            assert_tide(TIDE_SUCCESS,
                        tide_sync_elide_model(&prog, TIDE_SYNC_ELIDE_DROP_STAGED, &model, &st));
            assert_int_equal(st.waits_kept + st.signals_kept, 0);
            rep = check_model(&model, 1);
            printf("  without STAGED: %s: %s\n", tide_check_invariant_name(rep.violated),
                   rep.message);
            assert_false(rep.ok);
            assert_true(rep.violated == TIDE_CHECK_I2 || rep.violated == TIDE_CHECK_I3);
            assert_non_null(strstr(rep.message, "entering call"));
            tide_program_free(&model);

            /* Without the fence nothing orders call-done after the peers' fused writes. */
            assert_tide(TIDE_SUCCESS,
                        tide_sync_elide_model(&prog, TIDE_SYNC_ELIDE_NO_FENCE, &model, &st));
            rep = check_model(&model, 1);
            printf("  without the fence: %s: %s\n", tide_check_invariant_name(rep.violated),
                   rep.message);
            assert_false(rep.ok);
            tide_program_free(&model);

            tide_program_free(&prog);
            tide_plan_destroy(plan);
        }
}

static void test_peer_operands_need_option(void **state) {
    (void)state;
    tide_plan_t plan = test_plan_lane(1, 2, 0, 0, TIDE_RS_IN_PLACE, TIDE_DTYPE_BF16,
                                      TIDE_DTYPE_BF16, shapes, 4, TIDE_LANE_GENERIC);
    tide_program_t prog, model;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &prog));
    assert_tide(TIDE_SUCCESS, tide_sync_elide_model(&prog, TIDE_SYNC_ELIDE_PROPOSAL, &model, NULL));
    const tide_check_report_t rep = check_model(&model, 0);
    assert_false(rep.ok);
    assert_int_equal(rep.violated, TIDE_CHECK_IR);
    tide_program_free(&model);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_sync_elide_model(&prog, 8, &model, NULL));
    tide_program_free(&prog);
    tide_plan_destroy(plan);

    /* Two nodes: not the fused direct shape. */
    plan = test_plan_lane(2, 2, 0, 0, TIDE_RS_IN_PLACE, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, shapes, 4,
                          TIDE_LANE_GENERIC);
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &prog));
    assert_tide(TIDE_ERR_UNSUPPORTED,
                tide_sync_elide_model(&prog, TIDE_SYNC_ELIDE_PROPOSAL, &model, NULL));
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

/* The all-gather at M = 1 as the fabrics run its elision: only READY's waits and signals
 * stay.  It passes every invariant over 3 calls; dropping READY as well fails (a peer's copy
 * of the next call into my landing races with my caller's use of this call's landing, which
 * the checker models at call-done), and so does no fence.  (Unlike the reduce-scatter's, a
 * fence that skips the rank's own queues passes here: the copies stand on the caller queue
 * itself, and the READY queue only signals.) */
static void test_all_gather_model(void **state) {
    (void)state;
    for (int l = 2; l <= 8; l *= 2) {
        tide_plan_t plan = test_plan_lane(1, l, 0, 0, TIDE_RS_IN_PLACE, TIDE_DTYPE_BF16,
                                          TIDE_DTYPE_BF16, shapes, 4, TIDE_LANE_GENERIC);
        tide_program_t prog, model;
        assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &prog));
        tide_check_report_t rep = check_model(&prog, 0);
        assert_true(rep.ok);
        tide_sync_elide_stats_t st;
        assert_tide(TIDE_SUCCESS, tide_sync_elide_model(&prog, TIDE_SYNC_ELIDE_PROPOSAL, &model, &st));
        int waits = 0, sigs = 0;
        for (int r = 0; r < l; ++r)
            for (int q = 0; q < TIDE_Q_COUNT; ++q)
                for (int i = 0; i < model.ranks[r].queues[q].num_ops; ++i) {
                    const tide_op_t *op = &model.ranks[r].queues[q].ops[i];
                    if (op->kind <= TIDE_OP_COPY2D) assert_int_equal(op->sig_rank, -1);
                    if (op->kind != TIDE_OP_WAIT && op->kind != TIDE_OP_SIGNAL) continue;
                    if (op->ctr == TIDE_SYNC_ELIDE_AG_CTR_QUEUES ||
                        op->ctr == TIDE_SYNC_ELIDE_CTR_FENCE)
                        continue;
                    assert_int_equal(op->ctr, TIDE_CTR_AG_READY);
                    ++*(op->kind == TIDE_OP_WAIT ? &waits : &sigs);
                }
        assert_int_equal(waits, st.waits_kept);
        assert_int_equal(sigs, st.signals_kept);
        assert_int_equal(sigs, l * l); /* every rank tells every rank, itself included */
        assert_true(waits >= l);
        assert_true(st.waits_dropped > 0 && st.signals_dropped > 0);
        assert_int_equal(st.pushes_elided + st.landings_fused, 0);
        rep = check_model(&model, 0);
        if (!rep.ok) print_error("AG L = %d: %s\n", l, rep.message);
        assert_true(rep.ok);
        printf("AG L = %d: kept %d waits, %d signals; dropped %d waits, %d signals; %s\n", l,
               st.waits_kept, st.signals_kept, st.waits_dropped, st.signals_dropped,
               rep.message);
        const tide_check_options_t sampled = {3, 16, 7, 0, 1, 0};
        assert_tide(TIDE_SUCCESS, tide_program_check_ex(&model, &sampled, &rep));
        assert_true(rep.ok);
        tide_program_free(&model);

        assert_tide(TIDE_SUCCESS,
                    tide_sync_elide_model(&prog, TIDE_SYNC_ELIDE_DROP_STAGED, &model, &st));
        assert_int_equal(st.waits_kept + st.signals_kept, 0);
        rep = check_model(&model, 0);
        printf("  without READY: %s: %s\n", tide_check_invariant_name(rep.violated), rep.message);
        assert_false(rep.ok);
        tide_program_free(&model);

        assert_tide(TIDE_SUCCESS, tide_sync_elide_model(&prog, TIDE_SYNC_ELIDE_NO_FENCE, &model, &st));
        rep = check_model(&model, 0);
        printf("  without the fence: %s: %s\n", tide_check_invariant_name(rep.violated),
               rep.message);
        assert_false(rep.ok);
        tide_program_free(&model);
        tide_program_free(&prog);
        tide_plan_destroy(plan);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduced_passes),
        cmocka_unit_test(test_peer_operands_need_option),
        cmocka_unit_test(test_all_gather_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
