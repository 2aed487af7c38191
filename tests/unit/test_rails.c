/*
 * test_rails.c - the rail schedule (src/program/rails.h) over the compiled AG and RS programs
 * of many topologies (M in {2, 3, 4, 5, 8}, L in {1, 2, 4, 8}, padded shapes, with and
 * without a cast, both RS modes and one or two passes):
 *
 *   matching  for every pair (a, b), the sends of a to b and the receives of b from a are the
 *             same puts, with the same bytes, in the same per-pair order and the same steps;
 *   coverage  the sends are exactly the program's cross-node copies (each op once, same
 *             source, destination and bytes), so the bytes moved match;
 *   lockstep  the program, run on the abstract machine with rail semantics (a put waits for
 *             its step; a step posts when its queue reaches its first put and its credits ran;
 *             a step completes once every peer of its sends and receives posted it; the
 *             receiver raises the put's counter then; credit waits are dropped, credits
 *             deliver nothing), posts step g on every rank while only steps < g may complete,
 *             for every step of two calls, and then finishes both calls.  So no step needs the
 *             data of its own or a later step's receives, and no rank deadlocks in a group.
 *
 * Mutations must fail: a put turned 2D (unsupported), a wait on the own round's arrivals
 * (lockstep fails), a receive moved to another peer (matching fails).
 */
#include "test_util.h"

#include "plan/plan.h"
#include "program/counters.h"
#include "program/machine.h"
#include "program/program.h"
#include "program/rails.h"

#include <stdio.h>
#include <string.h>

static tide_plan_t plan_of(int m, int l, int passes, tide_rs_mode_t mode, bool cast) {
    const int n = m * l;
    /* Rows that do not divide by N (padding), a parameter with fewer rows than ranks. */
    const tide_param_shape_t shapes[] = {{2 * n - 1, 3}, {5, 8}, {n + 1, 1}};
    /* Rails serve the NCCL fabric, which runs the generic programs at L = 1 too (group.c). */
    return test_plan_lane(m, l, 0, passes, mode, TIDE_DTYPE_BF16,
                          cast ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16, shapes, 3, TIDE_LANE_GENERIC);
}

static bool same_ref(const tide_ref_t *a, const tide_ref_t *b) {
    return a->kind == b->kind && a->region == b->region && a->param == b->param &&
           a->rank == b->rank && a->offset == b->offset;
}

/* ------------------------------------------------------------------ matching and coverage */

static int step_of_recv(const tide_rails_rank_t *rr, int nsteps, int i) {
    for (int s = 0; s < nsteps; ++s)
        if (i >= rr->steps[s].first_recv && i < rr->steps[s].first_recv + rr->steps[s].num_recvs)
            return s;
    return -1;
}
static int step_of_send(const tide_rails_rank_t *rr, int nsteps, int i) {
    for (int s = 0; s < nsteps; ++s)
        if (i >= rr->steps[s].first_send && i < rr->steps[s].first_send + rr->steps[s].num_sends)
            return s;
    return -1;
}

static bool check_matching(const tide_rails_t *r, char *why, size_t len) {
    for (int a = 0; a < r->num_ranks; ++a)
        for (int b = 0; b < r->num_ranks; ++b) {
            const tide_rails_rank_t *ra = &r->ranks[a], *rb = &r->ranks[b];
            int i = 0, j = 0, pos = 0;
            for (;; ++pos) {
                while (i < ra->num_sends && ra->sends[i].dst_rank != b) ++i;
                while (j < rb->num_recvs && rb->recvs[j].src_rank != a) ++j;
                if (i == ra->num_sends || j == rb->num_recvs) break;
                const tide_rail_xfer_t *s = &ra->sends[i], *v = &rb->recvs[j];
                if (s->put != v->put || s->bytes != v->bytes || s->ctr != v->ctr ||
                    !same_ref(&s->dst, &v->dst) ||
                    step_of_send(ra, r->num_steps, i) != step_of_recv(rb, r->num_steps, j)) {
                    snprintf(why, len, "pair %d -> %d, position %d: send put %d (%llu B) vs recv "
                             "put %d (%llu B)", a, b, pos, s->put,
                             (unsigned long long)s->bytes, v->put, (unsigned long long)v->bytes);
                    return false;
                }
                ++i, ++j;
            }
            if (i != ra->num_sends || j != rb->num_recvs) {
                snprintf(why, len, "pair %d -> %d: %s left over after position %d", a, b,
                         i != ra->num_sends ? "a send" : "a receive", pos);
                return false;
            }
        }
    return true;
}

/* Every cross-node copy of the program is exactly one send, and nothing else is. */
static void check_coverage(const tide_program_t *prog, const tide_rails_t *r) {
    const int l = prog->plan->topo.gpus_per_node;
    uint64_t prog_bytes = 0, send_bytes = 0, recv_bytes = 0;
    for (int a = 0; a < prog->num_ranks; ++a) {
        const tide_rails_rank_t *ra = &r->ranks[a];
        int seen = 0;
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[a].queues[q].num_ops; ++i) {
                const tide_op_t *op = &prog->ranks[a].queues[q].ops[i];
                const bool remote = (op->dst.kind == TIDE_REF_ARENA ||
                                     op->dst.kind == TIDE_REF_LANDING) &&
                                    tide_rails_remote(l, a, op->dst.rank);
                if (!remote) continue;
                prog_bytes += op->bytes * (op->kind == TIDE_OP_COPY2D ? op->rows : 1);
                int found = 0;
                for (int k = 0; k < ra->num_sends; ++k) {
                    const tide_rail_xfer_t *s = &ra->sends[k];
                    if (s->queue == q && s->op == i) {
                        ++found;
                        assert_true(same_ref(&s->src, &op->src) && same_ref(&s->dst, &op->dst));
                        assert_int_equal(s->bytes, op->bytes);
                        assert_int_equal(s->dst_rank, op->dst.rank);
                        assert_int_equal(s->ctr, op->ctr);
                    }
                }
                assert_int_equal(found, 1);
                ++seen;
            }
        assert_int_equal(seen, ra->num_sends);
        for (int k = 0; k < ra->num_sends; ++k)
            send_bytes += ra->sends[k].bytes;
        for (int k = 0; k < ra->num_recvs; ++k)
            recv_bytes += ra->recvs[k].bytes;
    }
    assert_int_equal(prog_bytes, send_bytes);
    assert_int_equal(prog_bytes, recv_bytes);
    if (prog->plan->topo.nodes > 1) assert_true(prog_bytes > 0);
}

/* ------------------------------------------------------------------ lockstep */

typedef struct {
    const tide_program_t *prog;
    const tide_rails_t *r;
    tide_machine_t m;
    int steps;          /* 2 calls x num_steps */
    int *next_post;     /* [n] */
    uint8_t *posted;    /* [n * steps] */
    uint8_t *completed; /* [n * steps] */
    int64_t *exec[TIDE_Q_COUNT]; /* [n * max ops]: calls an op ran in */
    int max_ops;
} sim_t;

static int64_t *exec_of(sim_t *s, int rank, int q, int i) {
    return &s->exec[q][(size_t)rank * (size_t)s->max_ops + (size_t)i];
}

static bool try_post(sim_t *s, int a) {
    const tide_rails_rank_t *ra = &s->r->ranks[a];
    const int g = s->next_post[a];
    if (g >= s->steps || s->m.finished[a]) return false;
    const int e = g / s->r->num_steps, st = g % s->r->num_steps;
    const tide_rail_step_t *step = &ra->steps[st];
    if (s->m.epoch[a] != e || s->m.pc[a * TIDE_Q_COUNT + step->queue] != step->first_op)
        return false;
    if (g > 0 && !s->completed[(size_t)a * (size_t)s->steps + (size_t)g - 1]) return false;
    for (int c = step->first_credit; c < step->first_credit + step->num_credits; ++c) {
        const tide_rail_credit_t *cr = &ra->credits[c];
        if (e - cr->delta >= 0 && *exec_of(s, a, cr->queue, cr->op) < e - cr->delta + 1)
            return false;
    }
    s->posted[(size_t)a * (size_t)s->steps + (size_t)g] = 1;
    ++s->next_post[a];
    return true;
}

static bool try_complete(sim_t *s, int a, int limit) {
    const tide_rails_rank_t *ra = &s->r->ranks[a];
    bool any = false;
    for (int g = 0; g < limit && g < s->steps; ++g) {
        const size_t ag = (size_t)a * (size_t)s->steps + (size_t)g;
        if (!s->posted[ag] || s->completed[ag]) continue;
        const tide_rail_step_t *step = &ra->steps[g % s->r->num_steps];
        bool ok = true;
        for (int k = step->first_send; ok && k < step->first_send + step->num_sends; ++k)
            ok = s->posted[(size_t)ra->sends[k].dst_rank * (size_t)s->steps + (size_t)g];
        for (int k = step->first_recv; ok && k < step->first_recv + step->num_recvs; ++k)
            ok = s->posted[(size_t)ra->recvs[k].src_rank * (size_t)s->steps + (size_t)g];
        if (!ok) continue;
        s->completed[ag] = 1;
        for (int k = step->first_recv; k < step->first_recv + step->num_recvs; ++k)
            ++*tide_machine_counter(&s->m, a, ra->recvs[k].ctr);
        any = true;
    }
    return any;
}

/* Fire thread t's head under rail semantics; false when it cannot run now. */
static bool try_fire(sim_t *s, int t) {
    const int a = t / TIDE_Q_COUNT, q = t % TIDE_Q_COUNT;
    const tide_op_t *op = tide_machine_head(&s->m, t);
    if (op == NULL) return false;
    const int i = s->m.pc[t], e = s->m.epoch[a];
    const tide_rails_rank_t *ra = &s->r->ranks[a];
    if (q == ra->queue && ra->put_step[i] >= 0) {
        const int g = e * s->r->num_steps + ra->put_step[i];
        if (!s->completed[(size_t)a * (size_t)s->steps + (size_t)g]) return false;
        const int rank = op->sig_rank, ctr = op->ctr;
        tide_machine_fire(&s->m, t);
        --*tide_machine_counter(&s->m, rank, ctr); /* the receiver raised it at completion */
        return true;
    }
    if (ra->credit[q][i]) {
        const int rank = op->sig_rank, ctr = op->ctr;
        ++*exec_of(s, a, q, i);
        tide_machine_fire(&s->m, t);
        --*tide_machine_counter(&s->m, rank, ctr); /* a credit delivers nothing */
        return true;
    }
    if (!ra->dropped[q][i] && !tide_machine_enabled(&s->m, t)) return false;
    ++*exec_of(s, a, q, i);
    tide_machine_fire(&s->m, t);
    return true;
}

static void fixpoint(sim_t *s, int limit) {
    for (bool progress = true; progress;) {
        progress = false;
        for (int t = 0; t < s->m.threads; ++t)
            while (try_fire(s, t))
                progress = true;
        for (int a = 0; a < s->m.n; ++a) {
            while (try_post(s, a))
                progress = true;
            if (try_complete(s, a, limit)) progress = true;
        }
    }
}

static bool check_lockstep(const tide_program_t *prog, const tide_rails_t *r, char *why,
                           size_t len) {
    sim_t s;
    memset(&s, 0, sizeof(s));
    s.prog = prog;
    s.r = r;
    assert_tide(TIDE_SUCCESS, tide_machine_init(&s.m, prog, tide_machine_counters_used(prog), 2));
    const int n = prog->num_ranks;
    s.steps = 2 * r->num_steps;
    for (int a = 0; a < n; ++a)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            if (prog->ranks[a].queues[q].num_ops > s.max_ops)
                s.max_ops = prog->ranks[a].queues[q].num_ops;
    s.next_post = calloc((size_t)n, sizeof(int));
    s.posted = calloc((size_t)n * (size_t)s.steps + 1, 1);
    s.completed = calloc((size_t)n * (size_t)s.steps + 1, 1);
    assert_true(s.next_post && s.posted && s.completed);
    for (int q = 0; q < TIDE_Q_COUNT; ++q) {
        s.exec[q] = calloc((size_t)n * (size_t)(s.max_ops + 1), sizeof(int64_t));
        assert_non_null(s.exec[q]);
    }
    bool ok = true;
    for (int g = 0; g < s.steps && ok; ++g) {
        fixpoint(&s, g);
        for (int a = 0; a < n && ok; ++a)
            if (!s.posted[(size_t)a * (size_t)s.steps + (size_t)g]) {
                const int t = a * TIDE_Q_COUNT + r->ranks[a].queue;
                snprintf(why, len,
                         "rank %d cannot post step %d of call %d while only earlier steps "
                         "completed (its %s queue is at op %d, call %d)",
                         a, g % r->num_steps, g / r->num_steps,
                         tide_queue_name((tide_queue_t)r->ranks[a].queue), s.m.pc[t],
                         s.m.epoch[a]);
                ok = false;
            }
    }
    if (ok) {
        fixpoint(&s, s.steps);
        if (!tide_machine_done(&s.m)) {
            snprintf(why, len, "the two calls do not finish after every step completed");
            ok = false;
        }
    }
    tide_machine_free(&s.m);
    free(s.next_post);
    free(s.posted);
    free(s.completed);
    for (int q = 0; q < TIDE_Q_COUNT; ++q)
        free(s.exec[q]);
    return ok;
}

/* ------------------------------------------------------------------ the matrix */

static void check_program(const tide_program_t *prog, const char *what) {
    tide_rails_t r;
    assert_tide(TIDE_SUCCESS, tide_rails_build(prog, &r));
    char why[256] = "";
    if (!check_matching(&r, why, sizeof(why))) fail_msg("%s: matching: %s", what, why);
    check_coverage(prog, &r);
    if (prog->plan->topo.nodes > 1) assert_true(r.num_steps >= 1);
    if (!check_lockstep(prog, &r, why, sizeof(why))) fail_msg("%s: lockstep: %s", what, why);
    if (getenv("TIDE_TEST_VERBOSE")) printf("%s: %d puts, %d steps, %d credits on rank 0\n", what, r.puts, r.num_steps, r.ranks[0].num_credits);
    tide_rails_free(&r);
}

static void test_matrix(void **state) {
    (void)state;
    static const int ms[] = {2, 3, 4, 5, 8}, ls[] = {1, 2, 4, 8};
    int programs = 0;
    for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); ++mi)
        for (size_t li = 0; li < sizeof(ls) / sizeof(ls[0]); ++li)
            for (int variant = 0; variant < 2; ++variant) {
                const int m = ms[mi], l = ls[li];
                char what[96];
                tide_plan_t plan = plan_of(m, l, 1 + variant, TIDE_RS_SLOT_REUSE, variant == 1);
                tide_program_t prog;
                assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &prog));
                snprintf(what, sizeof(what), "AG %dx%d%s", m, l, variant ? " cast" : "");
                check_program(&prog, what);
                tide_program_free(&prog);
                for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
                    assert_tide(TIDE_SUCCESS,
                                tide_program_compile_rs(plan, (tide_rs_mode_t)mode, &prog));
                    snprintf(what, sizeof(what), "RS %dx%d mode %d passes %d", m, l, mode,
                             1 + variant);
                    check_program(&prog, what);
                    tide_program_free(&prog);
                    programs += 1;
                }
                tide_plan_destroy(plan);
                programs += 1;
            }
    assert_int_equal(programs, 5 * 4 * 2 * 3);
}

/* AG with M = 4 (rounds of 1 and 2 slots): one step per Bruck round, the own shard and the
 * forwarded run of round 1 in one step; each rank sends to one peer and receives from one. */
static void test_ag_steps_are_rounds(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(4, 2, 1, TIDE_RS_IN_PLACE, false);
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &prog));
    tide_rails_t r;
    assert_tide(TIDE_SUCCESS, tide_rails_build(&prog, &r));
    assert_int_equal(r.num_steps, plan->ag.num_rounds);
    assert_int_equal(r.puts, 3); /* round 0: own shard; round 1: own shard + one slot */
    for (int a = 0; a < r.num_ranks; ++a) {
        const tide_rails_rank_t *ra = &r.ranks[a];
        assert_int_equal(ra->steps[1].num_sends, 2);
        assert_int_equal(ra->steps[1].num_recvs, 2);
        /* Round d sends to node n - 2^d on the same rail, receives from n + 2^d. */
        for (int d = 0; d < r.num_steps; ++d) {
            const int dist = 1 << d, n = a / 2, lr = a % 2;
            const tide_rail_xfer_t *s = &ra->sends[ra->steps[d].first_send];
            const tide_rail_xfer_t *v = &ra->recvs[ra->steps[d].first_recv];
            assert_int_equal(s->dst_rank, ((n - dist + 4) % 4) * 2 + lr);
            assert_int_equal(v->src_rank, ((n + dist) % 4) * 2 + lr);
        }
        /* The credits of round d guard the receive of round d, from the previous call. */
        assert_true(ra->num_credits >= r.num_steps);
        for (int c = 0; c < ra->num_credits; ++c)
            assert_int_equal(ra->credits[c].delta, 1);
    }
    tide_rails_free(&r);
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

/* ------------------------------------------------------------------ mutations */

static tide_op_t *find_put(tide_program_t *prog, int rank, int nth) {
    const int l = prog->plan->topo.gpus_per_node;
    for (int q = 0; q < TIDE_Q_COUNT; ++q)
        for (int i = 0; i < prog->ranks[rank].queues[q].num_ops; ++i) {
            tide_op_t *op = &prog->ranks[rank].queues[q].ops[i];
            if (op->kind == TIDE_OP_COPY && op->dst.kind != TIDE_REF_NONE &&
                (op->dst.kind == TIDE_REF_ARENA || op->dst.kind == TIDE_REF_LANDING) &&
                tide_rails_remote(l, rank, op->dst.rank) && nth-- == 0)
                return op;
        }
    return NULL;
}

static void test_2d_put_is_unsupported(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(2, 2, 1, TIDE_RS_IN_PLACE, false);
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &prog));
    tide_op_t *op = find_put(&prog, 1, 0);
    assert_non_null(op);
    op->kind = TIDE_OP_COPY2D;
    op->rows = 1;
    tide_rails_t r;
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_rails_build(&prog, &r));
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

/* The rail lane's programs (L = 1) are not rail-shaped for the NCCL fabric yet: pieces put
 * without a signal each (RS) and a put count that depends on the rank (AG wrap-around).  They
 * are refused with a reason, never mapped wrongly (the NCCL fabric gets generic plans). */
static void test_rail_lane_is_unsupported(void **state) {
    (void)state;
    const tide_param_shape_t shapes[] = {{11, 3}, {5, 8}};
    tide_plan_t plan = test_plan(5, 1, 0, 1, TIDE_RS_IN_PLACE, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16,
                                 shapes, 2);
    assert_true(plan->rs.rail_lane);
    tide_program_t ag, rs;
    tide_rails_t r;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &ag));
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &rs));
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_rails_build(&ag, &r));
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_rails_build(&rs, &r));
    tide_program_free(&ag);
    tide_program_free(&rs);
    tide_plan_destroy(plan);
}

/* Round 1 of the AG forwards what round 0 brought; make rank 0 wait for round 1's own
 * arrivals instead: its step 1 then needs its own step-1 receives and cannot post. */
static void test_own_step_dependency_fails(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(4, 1, 1, TIDE_RS_IN_PLACE, false);
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &prog));
    tide_queue_ops_t *qo = &prog.ranks[0].queues[TIDE_Q_CALLER];
    bool mutated = false;
    for (int i = 0; i < qo->num_ops && !mutated; ++i)
        if (qo->ops[i].kind == TIDE_OP_WAIT && qo->ops[i].ctr == TIDE_CTR_AG_ARRIVED) {
            qo->ops[i].ctr += 1;
            qo->ops[i].inc = qo->ops[i].thr = 2; /* round 1 has two puts */
            mutated = true;
        }
    assert_true(mutated);
    tide_rails_t r;
    assert_tide(TIDE_SUCCESS, tide_rails_build(&prog, &r));
    char why[256] = "";
    assert_false(check_lockstep(&prog, &r, why, sizeof(why)));
    assert_non_null(strstr(why, "rank 0 cannot post step 1"));
    tide_rails_free(&r);
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

static void test_moved_recv_fails_matching(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(3, 2, 1, TIDE_RS_IN_PLACE, false);
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &prog));
    tide_rails_t r;
    assert_tide(TIDE_SUCCESS, tide_rails_build(&prog, &r));
    char why[256] = "";
    assert_true(check_matching(&r, why, sizeof(why)));
    r.ranks[0].recvs[0].src_rank = (r.ranks[0].recvs[0].src_rank + 2) % r.num_ranks;
    assert_false(check_matching(&r, why, sizeof(why)));
    tide_rails_free(&r);
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matrix),
        cmocka_unit_test(test_ag_steps_are_rounds),
        cmocka_unit_test(test_2d_put_is_unsupported),
        cmocka_unit_test(test_rail_lane_is_unsupported),
        cmocka_unit_test(test_own_step_dependency_fails),
        cmocka_unit_test(test_moved_recv_fails_matching),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
