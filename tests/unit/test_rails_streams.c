/*
 * test_rails_streams.c - the rail lane's calls as the one-process-per-rank CUDA fabric enqueues
 * them over its emulated rail transport (TIDE_CUDA_MP_RAILS=1), run on the host with
 * streams_sim.h: every rank's command list of each call (tide_schedule_build_rails), its op
 * and slot kinds as fabric/cuda/mp_rails.c classifies them, its rail steps as
 * tide_cuda_mp_rails_issue and the emulated transfer enqueue them, its waits and records as
 * the ipc transport does.  CALLS all-gathers, then CALLS reduce-scatters (the RS modes as
 * tests/gpu/test_fabric_cuda_mp.c switches them), at M = 2 .. 8, L = 1, passes 1..3, bf16 and
 * fp32 gradients, with and without a one-row parameter (empty puts).  Every call of every
 * rank must end; a deadlock fails naming the blocked stream heads.
 */
#include "streams_sim.h"

#include "plan/plan.h"

#include <stdio.h>
#include <string.h>

#define CALLS 4

enum { KIND_OP = 0, KIND_STEP = 1, KIND_IN_STEP = 2 };

/* A mutation for the test that shows the model can fail: receivers skip their arrivals. */
static bool skip_arrivals;
enum { SLOT_PEER = 0, SLOT_OWN = 1, SLOT_SKIP = 2 };

static int op_id(const tide_schedule_t *s, int rank, int queue, int op) {
    return s->op_base[rank * TIDE_Q_COUNT + queue] + op;
}

/* mp_rails.c, classify: this rank's puts, and how it waits on each slot. */
static void prepare(ss_t *s, ss_prog_t *p, const tide_program_t *prog, int fidx) {
    memset(p, 0, sizeof(*p));
    p->prog = prog;
    p->fidx = fidx;
    if (tide_rails_build(prog, &p->rails) != TIDE_SUCCESS) {
        p->unsupported = true;
        return;
    }
    assert_tide(TIDE_SUCCESS, tide_schedule_build_rails(prog, s->l, &p->sched));
    assert_true(p->sched.num_slots <= s->max_slots);
    assert_true(p->rails.num_steps <= s->max_steps);
    const tide_schedule_t *sc = &p->sched;
    for (int me = 0; me < s->n; ++me) {
        p->op_kind[me] = calloc((size_t)sc->num_ops + 1, 1);
        p->op_step[me] = malloc(((size_t)sc->num_ops + 1) * sizeof(int32_t));
        p->slot_kind[me] = calloc((size_t)sc->num_slots + 1, 1);
        assert_true(p->op_kind[me] && p->op_step[me] && p->slot_kind[me]);
        for (int id = 0; id < sc->num_ops; ++id)
            p->op_step[me][id] = -1;
        const tide_rails_rank_t *rr = &p->rails.ranks[me];
        if (rr->queue >= 0)
            for (int i = 0; i < prog->ranks[me].queues[rr->queue].num_ops; ++i) {
                const int st = rr->put_step[i];
                if (st < 0) continue;
                const int id = op_id(sc, me, rr->queue, i);
                p->op_step[me][id] = st;
                p->op_kind[me][id] = rr->steps[st].first_op == i ? KIND_STEP : KIND_IN_STEP;
            }
        for (int u = 0; u < s->n; ++u) {
            if (!tide_rails_remote(s->l, me, u)) continue;
            const tide_rails_rank_t *ru = &p->rails.ranks[u];
            for (int q = 0; q < TIDE_Q_COUNT; ++q)
                for (int i = 0; i < prog->ranks[u].queues[q].num_ops; ++i) {
                    const int slot = sc->op_slot[op_id(sc, u, q, i)];
                    if (slot < 0) continue;
                    const tide_op_t *op = &prog->ranks[u].queues[q].ops[i];
                    if (q == ru->queue && ru->put_step[i] >= 0 && op->sig_rank == me)
                        p->slot_kind[me][slot] = SLOT_OWN;
                    else if (ru->credit[q][i])
                        p->slot_kind[me][slot] = SLOT_SKIP;
                }
        }
    }
    p->ev_reach = ss_event_new(s, p->rails.num_steps + 1);
    p->ev_done = ss_event_new(s, p->rails.num_steps + 1);
}

static void prog_free(ss_t *s, ss_prog_t *p) {
    if (p->unsupported) return;
    for (int r = 0; r < s->n; ++r) {
        free(p->op_kind[r]);
        free(p->op_step[r]);
        free(p->slot_kind[r]);
    }
    tide_rails_free(&p->rails);
    tide_schedule_free(&p->sched);
}

/* tide_cuda_mp_rails_issue with the emulated transfer, at the step's first put on queue k. */
static void issue_step(ss_t *s, const ss_prog_t *p, int me, int k, int step, uint64_t e,
                       bool steady, int fam) {
    const tide_rails_rank_t *rr = &p->rails.ranks[me];
    const tide_rail_step_t *st = &rr->steps[step];
    const int f = p->fidx;
    char w[64];
    snprintf(w, sizeof(w), "reach[%d] call %llu", step, (unsigned long long)e);
    ss_record(s, me, k, p->ev_reach + step, w);
    ss_wait_event(s, me, SS_RAIL, p->ev_reach + step, w);
    for (int c = st->first_credit; c < st->first_credit + st->num_credits; ++c) {
        const tide_rail_credit_t *cr = &rr->credits[c];
        if ((int64_t)e - cr->delta < 0) continue;
        uint64_t *flag;
        if (cr->delta > 0 && !steady) {
            flag = &s->done_flag[me][fam];
            snprintf(w, sizeof(w), "step %d credit: own done flag", step);
        } else {
            flag = ss_slot(s, me, f, p->sched.op_slot[op_id(&p->sched, me, cr->queue, cr->op)]);
            snprintf(w, sizeof(w), "step %d credit %s[%d] delta %d", step,
                     tide_queue_name((tide_queue_t)cr->queue), cr->op, cr->delta);
        }
        ss_wait_flag(s, me, SS_RAIL, flag, e - (uint64_t)cr->delta + 1, w);
    }
    snprintf(w, sizeof(w), "posted[%d] of rank %d", step, me);
    ss_write(s, me, SS_RAIL, ss_rail(s, me, f, step, 0), e + 1, w);
    for (int x = st->first_send; x < st->first_send + st->num_sends; ++x) {
        const tide_rail_xfer_t *sd = &rr->sends[x];
        if (sd->bytes == 0) continue;
        snprintf(w, sizeof(w), "posted[%d] of rank %d", step, sd->dst_rank);
        ss_wait_flag(s, me, SS_RAIL, ss_rail(s, sd->dst_rank, f, step, 0), e + 1, w);
    }
    snprintf(w, sizeof(w), "sent[%d] of rank %d", step, me);
    ss_write(s, me, SS_RAIL, ss_rail(s, me, f, step, 1), e + 1, w);
    for (int x = st->first_recv; x < st->first_recv + st->num_recvs; ++x) {
        const int from = rr->recvs[x].src_rank;
        if (x > st->first_recv && rr->recvs[x - 1].src_rank == from) continue;
        snprintf(w, sizeof(w), "sent[%d] of rank %d", step, from);
        ss_wait_flag(s, me, SS_RAIL, ss_rail(s, from, f, step, 1), e + 1, w);
    }
    for (int x = st->first_recv; x < st->first_recv + st->num_recvs; ++x) {
        const tide_rail_xfer_t *rv = &rr->recvs[x];
        const int slot = p->sched.op_slot[op_id(&p->sched, rv->src_rank, rv->queue, rv->op)];
        if (slot < 0 || skip_arrivals) continue;
        snprintf(w, sizeof(w), "arrival slot %d", slot);
        ss_write(s, me, SS_RAIL, ss_slot(s, me, f, slot), e + 1, w);
    }
    snprintf(w, sizeof(w), "done[%d] call %llu", step, (unsigned long long)e);
    ss_record(s, me, SS_RAIL, p->ev_done + step, w);
    ss_wait_event(s, me, k, p->ev_done + step, w);
}

/* One call of rank me (mp_execute.c enqueue, call.c tide_cuda_call_enqueue / issue_cmd). */
static void enqueue(ss_t *s, const ss_prog_t *p, int fam, int pi, int me, uint64_t e) {
    ss_family_t *fm = &s->fam[me][fam];
    const bool steady = e >= 1 && fm->last_epoch == (int64_t)e - 1 && fm->last_prep == pi;
    const int form = steady ? TIDE_SCHED_STEADY : TIDE_SCHED_FRESH;
    const int64_t fence = steady ? (int64_t)e - 2 : (int64_t)e - 1;
    char w[64];
    if (fence >= 0)
        for (int r = 0; r < s->n; ++r)
            if (r / s->l == me / s->l) {
                snprintf(w, sizeof(w), "fence: done flag of rank %d", r);
                ss_wait_flag(s, me, SS_CALLER, &s->done_flag[r][fam], (uint64_t)fence + 1, w);
            }
    ss_record(s, me, SS_CALLER, s->ev_start + me, "start");
    const tide_schedule_t *sc = &p->sched;
    const int f = p->fidx;
    for (int i = 0; i < sc->num_cmds[form]; ++i) {
        const tide_sched_cmd_t *c = &sc->cmds[form][i];
        if (c->thread / TIDE_Q_COUNT != me) continue;
        const int k = c->thread % TIDE_Q_COUNT;
        switch (c->kind) {
        case TIDE_SCHED_CMD_FORK:
            ss_wait_event(s, me, k, s->ev_start + me, "start");
            break;
        case TIDE_SCHED_CMD_OP:
            if (p->op_kind[me][c->arg] == KIND_STEP)
                issue_step(s, p, me, k, p->op_step[me][c->arg], e, steady, fam);
            break;
        case TIDE_SCHED_CMD_RECORD:
            snprintf(w, sizeof(w), "slot %d", c->arg);
            ss_write(s, me, k, ss_slot(s, me, f, c->arg), e + 1, w);
            break;
        case TIDE_SCHED_CMD_WAIT:
        case TIDE_SCHED_CMD_WAIT_PREV: {
            const uint8_t kind = p->slot_kind[me][c->arg];
            if (kind == SLOT_SKIP) break;
            const int owner = kind == SLOT_OWN ? me : sc->slot_thread[c->arg] / TIDE_Q_COUNT;
            const bool prev = c->kind == TIDE_SCHED_CMD_WAIT_PREV;
            snprintf(w, sizeof(w), "slot %d of rank %d%s", c->arg, owner, prev ? " (prev)" : "");
            ss_wait_flag(s, me, k, ss_slot(s, owner, f, c->arg), prev ? e : e + 1, w);
            break;
        }
        case TIDE_SCHED_CMD_JOIN:
            ss_record(s, me, k, s->ev_end + c->thread, "end");
            ss_wait_event(s, me, SS_CALLER, s->ev_end + c->thread, "end");
            break;
        default:
            break; /* uploads and batches order nothing here */
        }
    }
    snprintf(w, sizeof(w), "done flag call %llu", (unsigned long long)e);
    ss_write(s, me, SS_CALLER, &s->done_flag[me][fam], e + 1, w);
    const int par = (int)(e % 2), ev = s->ev_done_call + (me * 2 + fam) * 2 + par;
    ss_record(s, me, SS_CALLER, ev, "call done");
    fm->done_inst[par] = s->ev_recorded[ev];
    fm->done_epoch[par] = (int64_t)e;
    fm->last_epoch = (int64_t)e;
    fm->last_prep = pi;
}

/* Whether rank me's host may enqueue call e of fam: its call e - 2 ended. */
static bool host_may(const ss_t *s, int me, int fam, uint64_t e) {
    const ss_family_t *fm = &s->fam[me][fam];
    const int par = (int)(e % 2);
    if (fm->done_epoch[par] < 0) return true;
    return s->ev_completed[s->ev_done_call + (me * 2 + fam) * 2 + par] >= fm->done_inst[par];
}

/* Every rank enqueues call k before any enqueues call k + 1 (argument check); the host of a
 * rank blocks for its call e - 2.  False with `why` on a deadlock. */
static bool run_calls(ss_t *s, const ss_prog_t *ag, const ss_prog_t *rs[2],
                      const tide_rs_mode_t modes[CALLS], char *why, size_t len) {
    for (int k = 0; k < 2 * CALLS; ++k) {
        const int fam = k < CALLS ? 0 : 1;
        const uint64_t e = (uint64_t)(k % CALLS);
        const int pi = fam == 0 ? 0 : (int)modes[e];
        const ss_prog_t *p = fam == 0 ? ag : rs[pi];
        bool done[SS_MAX_RANKS] = {false};
        for (int left = s->n; left > 0;) {
            bool any = false;
            for (int r = 0; r < s->n; ++r)
                if (!done[r] && host_may(s, r, fam, e)) {
                    enqueue(s, p, fam, pi, r, e);
                    done[r] = true;
                    --left;
                    any = true;
                }
            ss_progress(s);
            if (!any && left > 0) {
                char head[256] = "";
                ss_blocked(s, head, sizeof(head));
                snprintf(why, len, "%s call %llu: a host waits for its call %llu forever; %s",
                         fam ? "reduce-scatter" : "all-gather", (unsigned long long)e,
                         (unsigned long long)(e - 2), head);
                return false;
            }
        }
    }
    ss_progress(s);
    char head[256];
    if (ss_blocked(s, head, sizeof(head))) {
        snprintf(why, len, "the calls do not end: %s", head);
        return false;
    }
    return true;
}

typedef struct {
    int m, l, passes;
    bool fp32, one_row;
    int num_params;
    tide_lane_t lane;
    const tide_param_shape_t *shapes; /* NULL: the fixed ones */
    bool one_queue;                   /* every stream of a rank on one hardware queue */
} cfg_t;

typedef enum { CASE_ENDS, CASE_DEADLOCK, CASE_UNSUPPORTED } case_result_t;

/* One configuration through the fabric model. */
static case_result_t run_case(const cfg_t *cf, const tide_rs_mode_t modes[CALLS], char *why,
                              size_t len) {
    const uint64_t n = (uint64_t)cf->m * (uint64_t)cf->l;
    tide_param_shape_t shapes[4] = {{2 * n - 1, 3}, {n + 1, 2}, {5, 1}, {3 * n, 2}};
    if (cf->shapes != NULL) memcpy(shapes, cf->shapes, sizeof(shapes));
    if (cf->one_row) shapes[cf->num_params - 1].dim0 = 1;
    const tide_dtype_t g = cf->fp32 ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16;
    tide_plan_t plan = test_plan_lane(cf->m, cf->l, 0, cf->passes, TIDE_RS_IN_PLACE, g,
                                      TIDE_DTYPE_BF16, shapes, cf->num_params, cf->lane);
    tide_program_t pag, prs[2];
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &pag));
    for (int mo = 0; mo < 2; ++mo)
        assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, (tide_rs_mode_t)mo, &prs[mo]));
    ss_t s;
    ss_init(&s, (int)n, cf->l, 4096, 512);
    if (cf->one_queue)
        for (int k = 0; k < SS_STREAMS; ++k)
            s.chan[k] = 0;
    ss_prog_t ag, rs[2];
    prepare(&s, &ag, &pag, 0);
    for (int mo = 0; mo < 2; ++mo)
        prepare(&s, &rs[mo], &prs[mo], 1 + mo);
    const ss_prog_t *rsp[2] = {&rs[0], &rs[1]};
    case_result_t res = CASE_UNSUPPORTED;
    if (!ag.unsupported && !rs[0].unsupported && !rs[1].unsupported)
        res = run_calls(&s, &ag, rsp, modes, why, len) ? CASE_ENDS : CASE_DEADLOCK;
    prog_free(&s, &ag);
    for (int mo = 0; mo < 2; ++mo) {
        prog_free(&s, &rs[mo]);
        tide_program_free(&prs[mo]);
    }
    tide_program_free(&pag);
    ss_free(&s);
    tide_plan_destroy(plan);
    return res;
}

/* Mode sequences of tests/gpu/test_fabric_cuda_mp.c: all in place, or a switch at call 2. */
static const tide_rs_mode_t k_modes[2][CALLS] = {
    {TIDE_RS_IN_PLACE, TIDE_RS_IN_PLACE, TIDE_RS_IN_PLACE, TIDE_RS_IN_PLACE},
    {TIDE_RS_IN_PLACE, TIDE_RS_IN_PLACE, TIDE_RS_SLOT_REUSE, TIDE_RS_IN_PLACE}};

/* Both stream mappings of one configuration and both mode sequences: the calls end.  A
 * program tide_rails_build refuses is counted in *unsupported. */
static int check_config(cfg_t cf, int *unsupported) {
    int failed = 0;
    for (int oq = 0; oq < 2; ++oq)
        for (int ms = 0; ms < 2; ++ms) {
            cf.one_queue = oq == 1;
            char why[512] = "";
            const case_result_t r = run_case(&cf, k_modes[ms], why, sizeof(why));
            if (r == CASE_UNSUPPORTED) {
                ++*unsupported;
            } else if (r == CASE_DEADLOCK && failed++ == 0) {
                print_error("%s M=%d x %d passes=%d %s P=%d%s modes %s, %s: %s\n",
                            cf.lane == TIDE_LANE_RAIL ? "lane" : "generic", cf.m, cf.l, cf.passes,
                            cf.fp32 ? "fp32" : "bf16", cf.num_params, cf.one_row ? " one-row" : "",
                            ms ? "0010" : "0000",
                            oq ? "one hardware queue per rank" : "independent streams", why);
            }
        }
    return failed;
}

/* The lane at M = 2, 3, 4, 5, 8: among them the shapes of the H100 deadlock (3 x 1 at
 * passes = 2, 4 x 1 at passes = 1; bench/results/h100-2026-12-06j/lane_rails_first.log). */
static void test_lane_calls_end(void **state) {
    (void)state;
    static const int ms[] = {2, 3, 4, 5, 8};
    int failed = 0, unsupported = 0, cases = 0;
    for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); ++i)
        for (int passes = 1; passes <= 3; ++passes)
            for (int v = 0; v < 8; ++v) {
                const cfg_t cf = {
                    ms[i],          1,    passes, v % 2 == 1, (v / 2) % 2 == 1, 1 + 3 * (v / 4),
                    TIDE_LANE_RAIL, NULL, false};
                int unsup = 0;
                if (check_config(cf, &unsup) > 0) ++failed;
                ++cases;
                /* Known refusal (rails.h): at M = 2 with a one-row parameter and passes >= 2,
                 * one inbox generation receives only bare signals, which the mapping takes
                 * for credits.  Refused at the first call, never a hang. */
                if (unsup > 0) {
                    assert_true(ms[i] == 2 && cf.one_row && passes >= 2);
                    ++unsupported;
                }
            }
    if (failed) fail_msg("%d of %d lane configurations deadlock", failed, cases);
    assert_true(unsupported < cases / 4);
}

/* The generic programs over rails: the control (their command lists kept this property). */
static void test_generic_calls_end(void **state) {
    (void)state;
    static const int topo[][2] = {{2, 1}, {3, 1}, {4, 1}, {2, 2}, {3, 2}};
    int failed = 0, unsupported = 0;
    for (size_t i = 0; i < sizeof(topo) / sizeof(topo[0]); ++i)
        for (int passes = 1; passes <= 2; ++passes) {
            const cfg_t cf = {topo[i][0], topo[i][1],        passes, passes == 2, true,
                              4,          TIDE_LANE_GENERIC, NULL,   false};
            failed += check_config(cf, &unsupported) > 0;
        }
    assert_int_equal(unsupported, 0);
    if (failed) fail_msg("%d generic configurations deadlock", failed);
}

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;
static int rnd_in(int lo, int hi) {
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return lo + (int)(rnd_state % (uint64_t)(hi - lo + 1));
}

/* Shapes drawn as the GPU test draws them (rows 1..40, columns 1..24). */
static void test_lane_random_shapes(void **state) {
    (void)state;
    int failed = 0, unsupported = 0;
    for (int i = 0; i < 60; ++i) {
        tide_param_shape_t sh[4];
        for (int k = 0; k < 4; ++k)
            sh[k] = (tide_param_shape_t){(uint64_t)rnd_in(1, 40), (uint64_t)rnd_in(1, 24)};
        const cfg_t cf = {
            rnd_in(2, 5),   1,  rnd_in(1, 2), rnd_in(0, 1) == 1, rnd_in(0, 1) == 1, rnd_in(1, 4),
            TIDE_LANE_RAIL, sh, false};
        failed += check_config(cf, &unsupported) > 0;
    }
    if (failed) fail_msg("%d random lane configurations deadlock", failed);
}

/* The model can fail: receivers that never write their arrival flags hang the first calls. */
static void test_missing_arrivals_deadlock(void **state) {
    (void)state;
    skip_arrivals = true;
    const cfg_t cf = {3, 1, 1, false, false, 1, TIDE_LANE_RAIL, NULL, false};
    char why[512] = "";
    const case_result_t r = run_case(&cf, k_modes[0], why, sizeof(why));
    skip_arrivals = false;
    assert_int_equal(r, CASE_DEADLOCK);
    assert_non_null(strstr(why, "call 2"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lane_calls_end),
        cmocka_unit_test(test_generic_calls_end),
        cmocka_unit_test(test_lane_random_shapes),
        cmocka_unit_test(test_missing_arrivals_deadlock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
