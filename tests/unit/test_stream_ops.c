/*
 * test_stream_ops.c - what one reduce-scatter call enqueues per rank on the two CUDA fabrics
 * (program/stream_ops.h), for the layer of tests/gpu/bench_fsdp_layers.py (dim 4096, hidden
 * 11008: 9 parameters, bf16 gradients, fp32 output) at N = 2, 4, 8 on one node (M = 1).
 *
 * The counts follow from the program's structure at M = 1 (one pass, one SUM per rank):
 *   ce    N - 1 pushes, each after a WAIT_PREV on its target's credit of the previous call
 *         and before the RECORD of its STAGED signal, then PUSHED: N - 1 waits, N records;
 *   read  N - 1 WAITs on the peers' STAGED right before the SUM (one run), the SUM, N
 *         records (SUMMED, N - 1 credits), a WAIT on its own PUSHED;
 *   net   a WAIT on its own SUMMED, N - 1 RECORDs and N - 1 WAITs of the arrival barrier,
 *         the N landings (fused in direct mode: nothing issued), N - 1 RECORDs and N - 1
 *         WAITs of the landed barrier.
 * So 4N - 2 records and 4N - 2 waits (4 (N - 1) on other ranks) per rank and call on both
 * fabrics; the one-process-per-rank fabric adds its "began" and done flags and its end fence
 * on the N - 1 other done flags (direct mode; the next call's start fence is then implied):
 * 8N - 1 stream memory operations with every wait alone, and with a run of one stream's
 * waits as one operation (the fabric's default) the records, the runs and 3.  The runs are
 * the ones the fabric issues: tide_sched_wait_runs over the rank's commands.  The test prints
 * the table and fails when the schedule or the direct analysis changes these counts.
 */
#include "test_util.h"

#include "plan/plan.h"
#include "program/compile_rs.h"
#include "program/direct.h"
#include "program/stream_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The layer in FSDP2 order: attn_norm, wq, wk, wv, wo, mlp_norm, w1, w3, w2. */
static const tide_param_shape_t layer[] = {
    {4096, 1}, {4096, 4096},  {4096, 4096},  {4096, 4096},  {4096, 4096},
    {4096, 1}, {11008, 4096}, {11008, 4096}, {4096, 11008},
};
#define P ((int)(sizeof(layer) / sizeof(layer[0])))

typedef struct {
    tide_plan_t plan;
    tide_program_t prog;
    tide_schedule_t sched;
    tide_direct_t dir;
} world_t;

static void world_init(world_t *w, int n) {
    memset(w, 0, sizeof(*w));
    w->plan = test_plan(1, n, 0, 0, TIDE_RS_IN_PLACE, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, layer, P);
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(w->plan, TIDE_RS_IN_PLACE, &w->prog));
    assert_tide(TIDE_SUCCESS, tide_schedule_build(&w->prog, &w->sched));
    assert_tide(TIDE_SUCCESS,
                tide_direct_analyse(&w->prog, &w->sched, TIDE_DIRECT_SUM | TIDE_DIRECT_FUSE, NULL,
                                    &w->dir));
    assert_true(w->dir.rs && w->dir.sum);
}

static void world_free(world_t *w) {
    tide_direct_free(&w->dir);
    tide_schedule_free(&w->sched);
    tide_program_free(&w->prog);
    tide_plan_destroy(w->plan);
}

/* The commands' part, which both fabrics replay alike. */
static void assert_same_commands(const tide_stream_ops_t *a, const tide_stream_ops_t *b) {
    assert_int_equal(a->forks, b->forks);
    assert_int_equal(a->joins, b->joins);
    assert_int_equal(a->records, b->records);
    assert_int_equal(a->waits_peer, b->waits_peer);
    assert_int_equal(a->waits_own, b->waits_own);
    assert_int_equal(a->wait_runs, b->wait_runs);
    assert_int_equal(a->sums, b->sums);
    assert_int_equal(a->lands, b->lands);
    assert_int_equal(a->copies, b->copies);
    assert_int_equal(a->sum_waits_peer, b->sum_waits_peer);
}

/* The runs the fabric issues (mp_flags.c: tide_sched_wait_runs over the rank's commands). */
static int fabric_runs(const tide_schedule_t *sched, int form, int rank) {
    tide_sched_cmd_t *mine = malloc(((size_t)sched->num_cmds[form] + 1) * sizeof(*mine));
    assert_non_null(mine);
    int n = 0, runs = -1;
    for (int i = 0; i < sched->num_cmds[form]; ++i)
        if (sched->cmds[form][i].thread / TIDE_Q_COUNT == rank) mine[n++] = sched->cmds[form][i];
    assert_tide(TIDE_SUCCESS, tide_sched_wait_runs(mine, n, sched->num_threads, NULL, &runs));
    free(mine);
    return runs;
}

static void test_layer_direct(void **state) {
    (void)state;
    printf("N rank | records waits(peer/own) runs | into sum (peer, runs) | flags: memops "
           "(exec writes, exec waits/calls) | events: exec waits, once per call waits/records\n");
    for (int n = 2; n <= 8; n *= 2) {
        world_t w;
        world_init(&w, n);
        for (int r = 0; r < n; ++r) {
            tide_stream_ops_t ev, fl;
            tide_stream_ops_shared_t sh, sh_fl;
            assert_tide(TIDE_SUCCESS,
                        tide_stream_ops_count(&w.prog, &w.sched, &w.dir, NULL, TIDE_STREAM_OPS_EVENTS, r,
                                              TIDE_SCHED_STEADY, &ev, &sh));
            assert_tide(TIDE_SUCCESS,
                        tide_stream_ops_count(&w.prog, &w.sched, &w.dir, NULL, TIDE_STREAM_OPS_FLAGS, r,
                                              TIDE_SCHED_STEADY, &fl, &sh_fl));
            assert_same_commands(&ev, &fl);
            assert_int_equal(fl.records, 4 * n - 2);
            assert_int_equal(fl.waits_peer, 4 * (n - 1));
            assert_int_equal(fl.waits_own, 2);
            assert_int_equal(fl.wait_runs, n + 4);
            assert_int_equal(fl.forks, 2);
            assert_int_equal(fl.sums, 1);
            assert_int_equal(fl.lands, 0);
            assert_int_equal(fl.copies, 0);
            assert_int_equal(fl.events, 1); /* call-done; read-done is the executor's */
            assert_int_equal(fl.elided, P * (n - 1));
            assert_int_equal(fl.fused, n);
            assert_int_equal(fl.sum_waits, n - 1);
            assert_int_equal(fl.sum_waits_peer, n - 1);
            assert_int_equal(fl.sum_wait_runs, 1);
            assert_int_equal(fl.exec_flag_writes, 2);
            assert_int_equal(fl.exec_flag_waits, n - 1);
            assert_int_equal(fl.exec_flag_calls, 1);
            assert_int_equal(tide_stream_ops_memops(&fl, false), 8 * n - 1);
            assert_int_equal(fl.wait_calls, fabric_runs(&w.sched, TIDE_SCHED_STEADY, r));
            assert_int_equal(fl.wait_calls, n + 4);
            assert_int_equal(tide_stream_ops_memops(&fl, true), 4 * n - 2 + n + 4 + 3);
            assert_int_equal(sh_fl.event_waits + sh_fl.event_records, 0);
            assert_int_equal(ev.exec_event_waits, 1);
            assert_int_equal(sh.event_waits, 2 * n);
            assert_int_equal(sh.event_records, n + 1);
            if (r == 0)
                printf("%d %d | %d %d(%d/%d) %d | %d (%d, %d) | %d (%d, %d/%d) | %d, %d/%d\n", n, r,
                       fl.records, fl.waits_peer + fl.waits_own, fl.waits_peer, fl.waits_own,
                       fl.wait_runs, fl.sum_waits, fl.sum_waits_peer, fl.sum_wait_runs,
                       tide_stream_ops_memops(&fl, true), fl.exec_flag_writes, fl.exec_flag_waits,
                       fl.exec_flag_calls, ev.exec_event_waits, sh.event_waits, sh.event_records);
        }
        world_free(&w);
    }
}

/* The pushed path (direct mode off, or a rank whose operands are not addressable): the
 * pushes and landings are issued, read-done is the queue's own event. */
static void test_layer_pushed(void **state) {
    (void)state;
    for (int n = 2; n <= 8; n *= 2) {
        world_t w;
        world_init(&w, n);
        for (int r = 0; r < n; ++r) {
            tide_stream_ops_t fl;
            assert_tide(TIDE_SUCCESS,
                        tide_stream_ops_count(&w.prog, &w.sched, NULL, NULL, TIDE_STREAM_OPS_FLAGS, r,
                                              TIDE_SCHED_STEADY, &fl, NULL));
            assert_int_equal(fl.copies, P * (n - 1));
            assert_int_equal(fl.lands, n);
            assert_int_equal(fl.sums, 1);
            assert_int_equal(fl.events, 2);
            assert_int_equal(fl.elided + fl.fused, 0);
            assert_int_equal(fl.records, 4 * n - 2);
            assert_int_equal(fl.exec_flag_calls, 1); /* no end fence */
            assert_int_equal(fl.exec_flag_waits, n);
        }
        world_free(&w);
    }
}

/* Every rank's counts add up to the schedule's command list. */
static void test_totals_match_commands(void **state) {
    (void)state;
    world_t w;
    world_init(&w, 4);
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        int records = 0, waits = 0, forks = 0, joins = 0;
        for (int i = 0; i < w.sched.num_cmds[f]; ++i) {
            const int k = w.sched.cmds[f][i].kind;
            records += k == TIDE_SCHED_CMD_RECORD;
            waits += k == TIDE_SCHED_CMD_WAIT || k == TIDE_SCHED_CMD_WAIT_PREV;
            forks += k == TIDE_SCHED_CMD_FORK;
            joins += k == TIDE_SCHED_CMD_JOIN;
        }
        tide_stream_ops_t sum;
        memset(&sum, 0, sizeof(sum));
        for (int r = 0; r < 4; ++r) {
            tide_stream_ops_t s;
            assert_tide(TIDE_SUCCESS,
                        tide_stream_ops_count(&w.prog, &w.sched, &w.dir, NULL, TIDE_STREAM_OPS_EVENTS, r,
                                              f, &s, NULL));
            sum.records += s.records;
            sum.waits_peer += s.waits_peer + s.waits_own;
            sum.forks += s.forks;
            sum.joins += s.joins;
            assert_true(s.wait_runs <= s.waits_peer + s.waits_own);
            assert_int_equal(s.wait_calls, fabric_runs(&w.sched, f, r));
        }
        assert_int_equal(sum.records, records);
        assert_int_equal(sum.waits_peer, waits);
        assert_int_equal(sum.forks, forks);
        assert_int_equal(sum.joins, joins);
    }
    world_free(&w);
}

static void test_bad_arguments(void **state) {
    (void)state;
    world_t w;
    world_init(&w, 2);
    tide_stream_ops_t s;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_stream_ops_count(&w.prog, &w.sched, NULL, NULL, TIDE_STREAM_OPS_FLAGS, 2,
                                      TIDE_SCHED_STEADY, &s, NULL));
    assert_tide(
        TIDE_ERR_INVALID_ARGUMENT,
        tide_stream_ops_count(&w.prog, &w.sched, NULL, NULL, TIDE_STREAM_OPS_FLAGS, 0, 2, &s, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_stream_ops_count(&w.prog, &w.sched, NULL, NULL, (tide_stream_ops_fabric_t)7, 0,
                                      TIDE_SCHED_STEADY, &s, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_stream_ops_count(NULL, &w.sched, NULL, NULL, TIDE_STREAM_OPS_FLAGS, 0,
                                      TIDE_SCHED_STEADY, &s, NULL));
    world_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_direct),
        cmocka_unit_test(test_layer_pushed),
        cmocka_unit_test(test_totals_match_commands),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
