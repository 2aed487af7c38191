/*
 * test_rails.c - the rail schedule (src/program/rails.h) over the compiled AG and RS programs
 * of many topologies (M in {2, 3, 4, 5, 8}, L in {1, 2, 4, 8}, padded shapes, with and
 * without a cast, both RS modes and one or two passes), the generic programs and, at L = 1,
 * the rail lane's (docs/protocol.md "The rail lane"; M in {2, 3, 4, 5, 8, 13, 16}, shapes whose
 * blocks hold only padding for some ranks, so that empty puts occur):
 *
 *   matching  for every pair (a, b), the sends of a to b and the receives of b from a are the
 *             same puts, with the same bytes, in the same per-pair order and the same steps;
 *   coverage  the sends are exactly the program's cross-node copies (each op once, same
 *             source, destination and bytes) and its empty puts (bare signals on another
 *             node's arrival counters, zero bytes), so the bytes moved match; every
 *             unsignalled put is followed in its step by a signalled put to the same rank;
 *   fabric    the rail fabrics' command list builds (tide_schedule_build_rails), and each of
 *             its waits on another node's signal names a put to the waiter or a credit;
 *   lockstep  the program, run on the abstract machine with rail semantics (rails_sim.h),
 *             posts step g on every rank while only steps < g may complete, for every step
 *             of two calls, and then finishes both calls.  So no step needs the data of its
 *             own or a later step's receives, and no rank deadlocks in a group.
 *
 * Mutations must fail: a put turned 2D (unsupported), a wait on the own round's arrivals
 * (lockstep fails), a receive moved to another peer (matching fails), a lane piece's signal
 * dropped at the end of a send (unsupported: nothing covers the step), a lane program with
 * one rank's round split in two (unsupported: step counts differ).  Credits are checked with
 * the bytes: test_rails_data.c runs the lane through rails, receives as early as their
 * credits allow, against the cpu fabric, and shows that a dropped credit corrupts it.
 */
#include "rails_sim.h"

#include "plan/plan.h"
#include "program/schedule.h"

#include <stdio.h>
#include <string.h>

static tide_plan_t plan_of(int m, int l, int passes, tide_rs_mode_t mode, bool cast) {
    const int n = m * l;
    /* Rows that do not divide by N (padding), a parameter with fewer rows than ranks. */
    const tide_param_shape_t shapes[] = {{2 * n - 1, 3}, {5, 8}, {n + 1, 1}};
    /* The generic programs, L = 1 included (lane = GENERIC asks for them there, over rails
     * too); the rail lane's own programs are mapped below (lane_plan_of). */
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

/* Counter indices that some cross-node copy signals on its destination (rails.h). */
static void arrival_counters(const tide_program_t *prog, uint8_t *arrival, int ctrs) {
    const int l = prog->plan->topo.gpus_per_node;
    memset(arrival, 0, (size_t)ctrs);
    for (int a = 0; a < prog->num_ranks; ++a)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[a].queues[q].num_ops; ++i) {
                const tide_op_t *op = &prog->ranks[a].queues[q].ops[i];
                if (op->kind == TIDE_OP_COPY && op->dst.kind != TIDE_REF_NONE &&
                    tide_rails_remote(l, a, op->dst.rank) && op->sig_rank == op->dst.rank)
                    arrival[op->ctr] = 1;
            }
}

/* Every cross-node copy and every empty put of the program is exactly one send, and nothing
 * else is; an unsignalled put is covered by a signalled one of its step to the same rank. */
static void check_coverage(const tide_program_t *prog, const tide_rails_t *r) {
    const int l = prog->plan->topo.gpus_per_node;
    uint64_t prog_bytes = 0, send_bytes = 0, recv_bytes = 0;
    uint8_t arrival[TIDE_ARENA_SIGNAL_SLOTS];
    arrival_counters(prog, arrival, TIDE_ARENA_SIGNAL_SLOTS);
    for (int a = 0; a < prog->num_ranks; ++a) {
        const tide_rails_rank_t *ra = &r->ranks[a];
        int seen = 0;
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[a].queues[q].num_ops; ++i) {
                const tide_op_t *op = &prog->ranks[a].queues[q].ops[i];
                const bool remote = (op->dst.kind == TIDE_REF_ARENA ||
                                     op->dst.kind == TIDE_REF_LANDING) &&
                                    tide_rails_remote(l, a, op->dst.rank);
                const bool empty = op->kind == TIDE_OP_SIGNAL &&
                                   tide_rails_remote(l, a, op->sig_rank) && arrival[op->ctr];
                if (!remote && !empty) continue;
                prog_bytes += op->bytes * (op->kind == TIDE_OP_COPY2D ? op->rows : 1);
                int found = 0;
                for (int k = 0; k < ra->num_sends; ++k) {
                    const tide_rail_xfer_t *s = &ra->sends[k];
                    if (s->queue != q || s->op != i) continue;
                    ++found;
                    assert_int_equal(s->ctr, op->sig_rank >= 0 ? op->ctr : -1);
                    if (empty) {
                        assert_int_equal(s->bytes, 0);
                        assert_int_equal(s->src.kind, TIDE_REF_NONE);
                        assert_int_equal(s->dst_rank, op->sig_rank);
                        continue;
                    }
                    assert_true(same_ref(&s->src, &op->src) && same_ref(&s->dst, &op->dst));
                    assert_int_equal(s->bytes, op->bytes);
                    assert_int_equal(s->dst_rank, op->dst.rank);
                    if (s->ctr >= 0) continue;
                    /* Unsignalled: a later send of the same step to the same rank signals. */
                    bool covered = false;
                    for (int st = 0; st < r->num_steps; ++st) {
                        const tide_rail_step_t *sp = &ra->steps[st];
                        if (k < sp->first_send || k >= sp->first_send + sp->num_sends) continue;
                        for (int j = k + 1; j < sp->first_send + sp->num_sends; ++j)
                            covered |=
                                ra->sends[j].dst_rank == s->dst_rank && ra->sends[j].ctr >= 0;
                    }
                    assert_true(covered);
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

static bool check_lockstep(const tide_program_t *prog, const tide_rails_t *r, char *why,
                           size_t len) {
    rails_sim_t s;
    rails_sim_init(&s, prog, r, 2, NULL);
    const bool ok = rails_sim_lockstep(&s, why, len);
    rails_sim_free(&s);
    return ok;
}

/* ------------------------------------------------------------------ the fabric's schedule */

/* The command list the rail fabrics replay (tide_schedule_build_rails) builds, and every wait
 * on a signal of another node's rank names a put to the waiter (its own flag, written by the
 * step) or a credit (not waited for): what fabric/cuda/mp_rails.c requires of each slot. */
static void check_fabric_schedule(const tide_program_t *prog, const tide_rails_t *r,
                                  const char *what) {
    const int l = prog->plan->topo.gpus_per_node;
    tide_schedule_t s;
    assert_tide(TIDE_SUCCESS, tide_schedule_build_rails(prog, l, &s));
    int cross = 0;
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f)
        for (int i = 0; i < s.num_cmds[f]; ++i) {
            const tide_sched_cmd_t *c = &s.cmds[f][i];
            if (c->kind != TIDE_SCHED_CMD_WAIT && c->kind != TIDE_SCHED_CMD_WAIT_PREV) continue;
            const int me = c->thread / TIDE_Q_COUNT, t = s.slot_thread[c->arg];
            const int u = t / TIDE_Q_COUNT, q = t % TIDE_Q_COUNT;
            if (!tide_rails_remote(l, me, u)) continue;
            int op = -1;
            for (int k = s.op_base[t]; k < s.op_base[t + 1] && op < 0; ++k)
                if (s.op_slot[k] == c->arg) op = k - s.op_base[t];
            assert_true(op >= 0);
            const tide_rails_rank_t *ru = &r->ranks[u];
            const bool put = q == ru->queue && ru->put_step[op] >= 0 &&
                             prog->ranks[u].queues[q].ops[op].sig_rank == me;
            if (!put && !ru->credit[q][op])
                fail_msg("%s: rank %d waits on %s[%d] of rank %d, neither a put to it nor a "
                         "credit",
                         what, me, tide_queue_name((tide_queue_t)q), op, u);
            ++cross;
        }
    if (prog->plan->topo.nodes > 1) assert_true(cross > 0);
    tide_schedule_free(&s);
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
    check_fabric_schedule(prog, &r, what);
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

/* ------------------------------------------------------------------ the rail lane */

/* Rows that do not divide by M, a parameter of one row: in the RS its blocks for every rank
 * but 0 hold only padding, which the lane announces with empty puts. */
static tide_plan_t lane_plan_of(int m, int passes, tide_rs_mode_t mode, bool cast) {
    const tide_param_shape_t shapes[] = {{2 * m - 1, 3}, {1, 8}, {m + 1, 1}, {3 * m + 2, 2}};
    tide_plan_t plan = test_plan_lane(m, 1, 0, passes, mode, TIDE_DTYPE_BF16,
                                      cast ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16, shapes, 4,
                                      TIDE_LANE_RAIL);
    assert_true(plan->rs.rail_lane);
    return plan;
}

static int empty_sends(const tide_rails_t *r) {
    int n = 0;
    for (int a = 0; a < r->num_ranks; ++a)
        for (int k = 0; k < r->ranks[a].num_sends; ++k)
            n += r->ranks[a].sends[k].src.kind == TIDE_REF_NONE;
    return n;
}

/* The lane's AG: one step per Bruck round on every rank, to rank n - 2^d; the rank whose run
 * wraps past M - 1 sends two copies per parameter.  Its RS: one step per send J = pi (M - 1)
 * + c - 1, to rank n + c, the pieces of one send in one step. */
static void check_lane_shape(const tide_plan_t plan, const tide_rails_t *r, bool ag) {
    const int m = plan->topo.nodes, p = plan->geom.num_params;
    const int steps = ag ? plan->ag.num_rounds : plan->rs.passes * (m - 1);
    assert_int_equal(r->num_steps, steps);
    for (int a = 0; a < m; ++a)
        for (int s = 0; s < steps; ++s) {
            const tide_rails_rank_t *ra = &r->ranks[a];
            const tide_rail_step_t *st = &ra->steps[s];
            const int to = ag ? ((a - plan->ag.rounds[s].distance) % m + m) % m
                              : (a + s % (m - 1) + 1) % m;
            for (int k = st->first_send; k < st->first_send + st->num_sends; ++k)
                assert_int_equal(ra->sends[k].dst_rank, to);
            if (ag) {
                const int wraps = a + plan->ag.rounds[s].count > m;
                assert_int_equal(st->num_sends, (1 + wraps) * p);
            }
        }
}

static void test_lane_matrix(void **state) {
    (void)state;
    static const int ms[] = {2, 3, 4, 5, 8, 13, 16};
    int programs = 0, empties = 0;
    for (size_t mi = 0; mi < sizeof(ms) / sizeof(ms[0]); ++mi)
        for (int passes = 1; passes <= 3; ++passes)
            for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
                const int m = ms[mi];
                const bool cast = (passes + mode) % 2 == 1;
                char what[96];
                tide_plan_t plan = lane_plan_of(m, passes, (tide_rs_mode_t)mode, cast);
                tide_program_t prog;
                tide_rails_t r;
                assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &prog));
                snprintf(what, sizeof(what), "lane AG %dx1%s", m, cast ? " cast" : "");
                check_program(&prog, what);
                assert_tide(TIDE_SUCCESS, tide_rails_build(&prog, &r));
                check_lane_shape(plan, &r, true);
                tide_rails_free(&r);
                tide_program_free(&prog);
                assert_tide(TIDE_SUCCESS,
                            tide_program_compile_rs(plan, (tide_rs_mode_t)mode, &prog));
                snprintf(what, sizeof(what), "lane RS %dx1 mode %d passes %d", m, mode, passes);
                check_program(&prog, what);
                assert_tide(TIDE_SUCCESS, tide_rails_build(&prog, &r));
                check_lane_shape(plan, &r, false);
                empties += empty_sends(&r);
                tide_rails_free(&r);
                tide_program_free(&prog);
                tide_plan_destroy(plan);
                programs += 2;
            }
    assert_int_equal(programs, 7 * 3 * TIDE_RS_MODE_COUNT * 2);
    assert_true(empties > 0); /* the one-row parameter made padding-only blocks */
}

/* The lane RS's last piece of a send loses its signal: nothing covers that step's pieces. */
static void test_lane_uncovered_piece_is_unsupported(void **state) {
    (void)state;
    tide_plan_t plan = lane_plan_of(3, 1, TIDE_RS_IN_PLACE, false);
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &prog));
    tide_queue_ops_t *qo = &prog.ranks[0].queues[TIDE_Q_READ];
    int i = 0;
    while (i < qo->num_ops && !(qo->ops[i].kind == TIDE_OP_COPY && qo->ops[i].sig_rank >= 0))
        ++i;
    assert_true(i < qo->num_ops && i > 0 && qo->ops[i - 1].kind == TIDE_OP_COPY);
    qo->ops[i].sig_rank = -1;
    tide_rails_t r;
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_rails_build(&prog, &r));
    assert_non_null(strstr(tide_get_last_error(), "signals nothing"));
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

/* One put in the middle of rank 0's last AG round becomes a local copy: its round splits in
 * two steps there and nowhere else, so the ranks' steps no longer pair up. */
static void test_lane_split_round_is_unsupported(void **state) {
    (void)state;
    tide_plan_t plan = lane_plan_of(4, 1, TIDE_RS_IN_PLACE, false);
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &prog));
    tide_queue_ops_t *qo = &prog.ranks[0].queues[TIDE_Q_CALLER];
    int last = -1;
    for (int i = 0; i < qo->num_ops; ++i)
        if (qo->ops[i].kind == TIDE_OP_COPY && qo->ops[i].dst.rank != 0) last = i;
    assert_true(last >= 2 && qo->ops[last - 2].kind == TIDE_OP_COPY);
    tide_op_t *mid = &qo->ops[last - 1];
    mid->dst.rank = 0;
    mid->sig_rank = -1;
    tide_rails_t r;
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_rails_build(&prog, &r));
    assert_non_null(strstr(tide_get_last_error(), "rail steps per call"));
    tide_program_free(&prog);
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
        cmocka_unit_test(test_lane_matrix),
        cmocka_unit_test(test_lane_uncovered_piece_is_unsupported),
        cmocka_unit_test(test_lane_split_round_is_unsupported),
        cmocka_unit_test(test_own_step_dependency_fails),
        cmocka_unit_test(test_moved_recv_fails_matching),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
