/*
 * test_cuda_schedule.c - the CUDA fabrics' host-side schedule (src/program/schedule.h),
 * built and checked without a GPU, and the abstract machine's rules (program/machine.h).
 *
 * For the compiled AG and RS programs of several topologies, the command lists of both forms
 * must (1) run every op but the WAITs of every thread exactly once, in program order; (2)
 * name, in every WAIT, a slot recorded earlier in the same list, and in every WAIT_PREV
 * (STEADY only) a slot the list records; (3) fork a thread at most once
 * and join some thread of every rank that has ops; (4) count per counter the signals the machine counts.  Mutated programs must be
 * rejected: a threshold nobody reaches (deadlock) and a target that overflows (the machine's
 * one overflow rule, TIDE_ERR_OVERFLOW), and malformed ops (kind, counter).  A schedule is a
 * function of the program: rebuilt, it is the same; a rank's hash changes with that rank's
 * waits only; on a hand-built program the wait waits for exactly the two signals it counts.
 */
#include "test_util.h"

#include "program/schedule.h"
#include "plan/plan.h"
#include "program/counters.h"
#include "program/machine.h"
#include "program/program.h"

#include <string.h>

static const tide_param_shape_t shapes[] = {{105, 9}, {10, 16}, {3, 1}};

static tide_plan_t plan_of(int m, int l, int passes, tide_rs_mode_t mode, int cast) {
    return test_plan(m, l, 0, passes, mode, TIDE_DTYPE_BF16,
                     cast ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16, shapes, 3);
}

static void check_form(const tide_program_t *prog, const tide_schedule_t *s, int form) {
    const tide_sched_cmd_t *cmds = s->cmds[form];
    int *next = calloc((size_t)s->num_threads, sizeof(int)); /* ops of each thread run */
    bool *forked = calloc((size_t)s->num_threads, sizeof(bool));
    bool *joined = calloc((size_t)s->num_threads, sizeof(bool));
    bool *recorded = calloc((size_t)s->num_slots + 1, sizeof(bool));
    bool *recorded_any = calloc((size_t)s->num_slots + 1, sizeof(bool));
    assert_true(next && forked && joined && recorded && recorded_any);
    for (int i = 0; i < s->num_cmds[form]; ++i)
        if (cmds[i].kind == TIDE_SCHED_CMD_RECORD) recorded_any[cmds[i].arg] = true;
    for (int i = 0; i < s->num_cmds[form]; ++i) {
        const tide_sched_cmd_t *c = &cmds[i];
        assert_true(c->thread >= 0 && c->thread < s->num_threads);
        const int t = c->thread;
        switch (c->kind) {
        case TIDE_SCHED_CMD_FORK:
            assert_false(forked[t]);
            forked[t] = true;
            break;
        case TIDE_SCHED_CMD_OP: {
            /* No fork when a wait already proved the rank started (commands.c). */
            /* WAIT ops become waits; every other op runs, in program order. */
            int id = s->op_base[t] + next[t];
            while (id < s->op_base[t + 1] && tide_schedule_op(prog, s, id, t)->kind == TIDE_OP_WAIT)
                ++id;
            assert_int_equal(c->arg, id);
            next[t] = id - s->op_base[t] + 1;
            break;
        }
        case TIDE_SCHED_CMD_RECORD:
            assert_true(c->arg >= 0 && c->arg < s->num_slots);
            assert_int_equal(s->slot_thread[c->arg], t);
            recorded[c->arg] = true;
            break;
        case TIDE_SCHED_CMD_WAIT:
            assert_true(c->arg >= 0 && c->arg < s->num_slots);
            assert_true(recorded[c->arg]); /* dependencies point backwards */
            break;
        case TIDE_SCHED_CMD_WAIT_PREV:
            assert_int_equal(form, TIDE_SCHED_STEADY);
            assert_true(c->arg >= 0 && c->arg < s->num_slots);
            assert_true(recorded_any[c->arg]);
            break;
        case TIDE_SCHED_CMD_JOIN:
            joined[t] = true;
            break;
        case TIDE_SCHED_CMD_UPLOAD:
        case TIDE_SCHED_CMD_UPLOAD_WAIT:
            assert_true(s->has_sum);
            break;
        default:
            fail_msg("command kind %d", c->kind);
        }
    }
    for (int t = 0; t < s->num_threads; ++t) {
        /* Every op that is not a WAIT ran. */
        int rest = 0;
        for (int id = s->op_base[t] + next[t]; id < s->op_base[t + 1]; ++id)
            if (tide_schedule_op(prog, s, id, t)->kind != TIDE_OP_WAIT) ++rest;
        assert_int_equal(rest, 0);
    }
    /* The caller's stream of every rank with ops joins some thread of it. */
    for (int r = 0; r < s->num_ranks; ++r) {
        bool any = false, join = false;
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const int t = r * TIDE_Q_COUNT + q;
            any = any || s->op_base[t + 1] > s->op_base[t];
            join = join || joined[t];
        }
        assert_true(!any || join);
    }
    for (int k = 0; k < s->num_slots; ++k)
        assert_true(recorded[k]);
    free(next);
    free(forked);
    free(joined);
    free(recorded);
    free(recorded_any);
}

static void check_program(const tide_program_t *prog) {
    tide_schedule_t s;
    assert_tide(TIDE_SUCCESS, tide_schedule_build(prog, &s));
    assert_int_equal(s.num_ranks, prog->num_ranks);
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f)
        check_form(prog, &s, f);
    int64_t *count = NULL;
    assert_tide(TIDE_SUCCESS, tide_machine_count_signals(prog, s.num_counters, &count));
    for (int c = 0; c < s.num_ranks * s.num_counters; ++c)
        assert_int_equal(s.incs[c], count[c]);
    assert_true(tide_schedule_incs_match(&s, &s));
    for (int r = 0; r < prog->num_ranks; ++r)
        assert_true(s.rank_hash[r] == tide_schedule_rank_hash(prog, r));
    /* op_slot (the NCCL rails find flags by op): each slot belongs to exactly one signalling
     * op, of the thread that records it. */
    int *owners = calloc((size_t)s.num_slots + 1, sizeof(int));
    assert_non_null(owners);
    for (int t = 0; t < s.num_threads; ++t)
        for (int id = s.op_base[t]; id < s.op_base[t + 1]; ++id) {
            const int slot = s.op_slot[id];
            if (slot < 0) continue;
            assert_true(slot < s.num_slots);
            assert_true(tide_schedule_op_signals(tide_schedule_op(prog, &s, id, t)));
            assert_int_equal(s.slot_thread[slot], t);
            ++owners[slot];
        }
    for (int k = 0; k < s.num_slots; ++k)
        assert_int_equal(owners[k], 1);
    free(owners);
    free(count);
    tide_schedule_free(&s);
}

/* The signalling op of each slot of s. */
static int *slot_ops(const tide_schedule_t *s) {
    int *op = calloc((size_t)s->num_slots + 1, sizeof(int));
    assert_non_null(op);
    for (int id = 0; id < s->num_ops; ++id)
        if (s->op_slot[id] >= 0) op[s->op_slot[id]] = id;
    return op;
}

/* Marks [thread * ops + op] of the waits of one form on signals of another node. */
static bool *cross_waits(const tide_schedule_t *s, int form, int l) {
    int *op = slot_ops(s);
    bool *m = calloc((size_t)s->num_threads * (size_t)s->num_ops + 1, sizeof(bool));
    assert_non_null(m);
    for (int i = 0; i < s->num_cmds[form]; ++i) {
        const tide_sched_cmd_t *c = &s->cmds[form][i];
        if (c->kind != TIDE_SCHED_CMD_WAIT && c->kind != TIDE_SCHED_CMD_WAIT_PREV) continue;
        if ((c->thread / TIDE_Q_COUNT) / l == (s->slot_thread[c->arg] / TIDE_Q_COUNT) / l) continue;
        m[(size_t)c->thread * (size_t)s->num_ops + (size_t)op[c->arg]] = true;
    }
    free(op);
    return m;
}

/* The rail variant (schedule.h): a valid schedule; with one node exactly the plain one; with
 * several, every cross-node wait the plain schedule keeps is kept, and more when the plain one
 * dropped some as implied through the sender's stream order. */
static void check_rails(const tide_program_t *prog, int l, int *dropped_somewhere) {
    tide_schedule_t plain, rails;
    assert_tide(TIDE_SUCCESS, tide_schedule_build(prog, &plain));
    assert_tide(TIDE_SUCCESS, tide_schedule_build_rails(prog, l, &rails));
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        check_form(prog, &rails, f);
        if (prog->num_ranks == l) {
            assert_int_equal(plain.num_cmds[f], rails.num_cmds[f]);
            for (int i = 0; i < plain.num_cmds[f]; ++i) { /* fields: the struct has padding */
                assert_int_equal(plain.cmds[f][i].kind, rails.cmds[f][i].kind);
                assert_int_equal(plain.cmds[f][i].thread, rails.cmds[f][i].thread);
                assert_int_equal(plain.cmds[f][i].arg, rails.cmds[f][i].arg);
            }
            continue;
        }
        bool *a = cross_waits(&plain, f, l), *b = cross_waits(&rails, f, l);
        for (size_t k = 0; k < (size_t)plain.num_threads * (size_t)plain.num_ops; ++k) {
            if (a[k]) assert_true(b[k]);
            if (b[k] && !a[k]) ++*dropped_somewhere;
        }
        free(a);
        free(b);
    }
    tide_schedule_free(&plain);
    tide_schedule_free(&rails);
}

static void test_rails_variant(void **state) {
    (void)state;
    static const int topo[][2] = {{1, 4}, {2, 1}, {2, 2}, {3, 2}, {4, 2}, {8, 1}, {2, 4}};
    int more = 0;
    for (size_t k = 0; k < sizeof(topo) / sizeof(topo[0]); ++k)
        for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
            tide_plan_t plan = plan_of(topo[k][0], topo[k][1], 1 + (int)(k % 2),
                                       (tide_rs_mode_t)mode, (int)(k % 2));
            tide_program_t ag, rs;
            assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &ag));
            assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, (tide_rs_mode_t)mode, &rs));
            check_rails(&ag, topo[k][1], &more);
            check_rails(&rs, topo[k][1], &more);
            tide_program_free(&ag);
            tide_program_free(&rs);
            tide_plan_destroy(plan);
        }
    /* Not vacuous: the plain schedules do drop cross-node waits that the rails must keep. */
    assert_true(more > 0);
    tide_schedule_t s;
    tide_plan_t plan = plan_of(2, 2, 1, TIDE_RS_IN_PLACE, 0);
    tide_program_t ag;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &ag));
    assert_tide(TIDE_ERR_INTERNAL, tide_schedule_build_rails(&ag, 3, &s));
    tide_program_free(&ag);
    tide_plan_destroy(plan);
}

static void test_compiled_programs(void **state) {
    (void)state;
    static const int topo[][2] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {3, 2}, {4, 2}, {8, 1}, {5, 3}};
    for (size_t k = 0; k < sizeof(topo) / sizeof(topo[0]); ++k)
        for (int cast = 0; cast < 2; ++cast)
            for (int mode = 0; mode < TIDE_RS_MODE_COUNT; ++mode) {
                tide_plan_t plan = plan_of(topo[k][0], topo[k][1], 1 + (int)(k % 2),
                                           (tide_rs_mode_t)mode, cast);
                tide_program_t ag, rs;
                assert_tide(TIDE_SUCCESS, tide_program_compile_ag(plan, &ag));
                assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, (tide_rs_mode_t)mode, &rs));
                check_program(&ag);
                check_program(&rs);
                tide_program_free(&ag);
                tide_program_free(&rs);
                tide_plan_destroy(plan);
            }
}

/* The cross-group fence (program/fence.c) as the CUDA executors run it: a valid schedule,
 * and in both forms every rank's caller stream waits on this call's signal of every other
 * rank (that is what orders a group's call after the previous group's on every rank). */
static void test_fence_programs(void **state) {
    (void)state;
    static const int topo[][2] = {{1, 1}, {1, 4}, {2, 2}, {3, 2}};
    for (size_t k = 0; k < sizeof(topo) / sizeof(topo[0]); ++k)
        for (int zero = 0; zero < 2; ++zero) {
            tide_plan_t plan = plan_of(topo[k][0], topo[k][1], 1, TIDE_RS_IN_PLACE, 0);
            tide_program_t f;
            assert_tide(TIDE_SUCCESS, tide_program_compile_fence(plan, zero != 0, &f));
            assert_int_equal(f.fence, 1 + zero);
            check_program(&f);
            tide_schedule_t s;
            assert_tide(TIDE_SUCCESS, tide_schedule_build(&f, &s));
            const int n = s.num_ranks;
            bool *seen = calloc((size_t)n * (size_t)n, sizeof(bool));
            assert_non_null(seen);
            for (int form = 0; form < TIDE_SCHED_FORMS; ++form) {
                memset(seen, 0, (size_t)n * (size_t)n * sizeof(bool));
                for (int i = 0; i < s.num_cmds[form]; ++i) {
                    const tide_sched_cmd_t *c = &s.cmds[form][i];
                    if (c->kind != TIDE_SCHED_CMD_WAIT) continue;
                    assert_int_equal(c->thread % TIDE_Q_COUNT, TIDE_Q_CALLER);
                    const int r = c->thread / TIDE_Q_COUNT;
                    seen[r * n + s.slot_thread[c->arg] / TIDE_Q_COUNT] = true;
                }
                for (int r = 0; r < n; ++r)
                    for (int j = 0; j < n; ++j)
                        if (j != r) assert_true(seen[r * n + j]);
            }
            free(seen);
            tide_schedule_free(&s);
            tide_program_free(&f);
            tide_plan_destroy(plan);
        }
}

/* The first WAIT of any rank, or NULL. */
static tide_op_t *first_wait(tide_program_t *prog) {
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[r].queues[q].num_ops; ++i)
                if (prog->ranks[r].queues[q].ops[i].kind == TIDE_OP_WAIT)
                    return &prog->ranks[r].queues[q].ops[i];
    return NULL;
}

static void test_mutations_rejected(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(2, 2, 1, TIDE_RS_IN_PLACE, 0);
    tide_program_t rs, bad;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_IN_PLACE, &rs));
    tide_schedule_t s;

    /* A threshold one past what a call delivers: the second call never passes it. */
    assert_tide(TIDE_SUCCESS, tide_program_clone(&rs, &bad));
    tide_op_t *w = first_wait(&bad);
    assert_non_null(w);
    w->thr = w->inc + 1;
    assert_tide(TIDE_ERR_INTERNAL, tide_schedule_build(&bad, &s));
    assert_non_null(strstr(tide_get_last_error(), "deadlocks"));
    tide_program_free(&bad);

    /* A target that overflows int64 in call 1: rejected, never saturated. */
    assert_tide(TIDE_SUCCESS, tide_program_clone(&rs, &bad));
    w = first_wait(&bad);
    w->inc = INT64_MAX;
    w->thr = 1;
    assert_tide(TIDE_ERR_OVERFLOW, tide_schedule_build(&bad, &s));
    tide_program_free(&bad);

    tide_program_free(&rs);
    tide_plan_destroy(plan);
}

/* The machine on a hand-built two-rank program: rank 1 signals rank 0 from two queues; rank
 * 0's WAIT needs both (inc 2, thr 2), then its second call needs the second call's two. */
static void test_machine_rules(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(2, 1, 1, TIDE_RS_IN_PLACE, 0);
    tide_program_t p;
    assert_tide(TIDE_SUCCESS,
                tide_program_init(plan, TIDE_COLL_ALL_GATHER, TIDE_RS_IN_PLACE, &p));
    const tide_op_t sig = tide_op_signal(0, 5);
    assert_tide(TIDE_SUCCESS, tide_program_push(&p, 1, TIDE_Q_CE, &sig));
    assert_tide(TIDE_SUCCESS, tide_program_push(&p, 1, TIDE_Q_NET, &sig));
    const tide_op_t wait = tide_op_wait(0, 5, 2, 2);
    assert_tide(TIDE_SUCCESS, tide_program_push(&p, 0, TIDE_Q_CALLER, &wait));

    assert_int_equal(tide_machine_counters_used(&p), 6);
    int64_t *count = NULL;
    assert_tide(TIDE_SUCCESS, tide_machine_count_signals(&p, 6, &count));
    assert_int_equal(count[0 * 6 + 5], 2);
    assert_int_equal(count[1 * 6 + 5], 0);
    assert_true(tide_machine_inc_ok(&wait, 2));
    assert_false(tide_machine_inc_ok(&wait, 3));
    free(count);
    assert_tide(TIDE_ERR_INTERNAL, tide_machine_count_signals(&p, 5, &count));

    tide_machine_t m;
    assert_tide(TIDE_SUCCESS, tide_machine_init(&m, &p, 6, 2));
    const int w0 = 0 * TIDE_Q_COUNT + TIDE_Q_CALLER;
    const int ce1 = 1 * TIDE_Q_COUNT + TIDE_Q_CE, net1 = 1 * TIDE_Q_COUNT + TIDE_Q_NET;
    assert_false(tide_machine_enabled(&m, w0));
    tide_machine_fire(&m, ce1);
    /* Rank 1's CE queue is done with call 0, but call 1 waits for its NET queue (order). */
    assert_null(tide_machine_head(&m, ce1));
    assert_int_equal(m.epoch[1], 0);
    assert_false(tide_machine_enabled(&m, w0));
    tide_machine_fire(&m, net1);
    assert_int_equal(m.epoch[1], 1);
    assert_true(tide_machine_enabled(&m, w0));
    tide_machine_fire(&m, w0);
    assert_int_equal(m.epoch[0], 1);
    assert_int_equal(tide_machine_head_target(&m, w0), 4);
    assert_false(tide_machine_enabled(&m, w0));
    tide_machine_fire(&m, ce1);
    assert_false(tide_machine_enabled(&m, w0));
    tide_machine_fire(&m, net1);
    assert_true(tide_machine_enabled(&m, w0));
    tide_machine_fire(&m, w0);
    assert_true(tide_machine_done(&m));
    tide_machine_free(&m);

    /* Wait rule and overflow rule. */
    int64_t t = -1;
    assert_true(tide_machine_wait_target(3, &wait, &t));
    assert_int_equal(t, 8);
    assert_true(tide_machine_wait_passes(0, 0));
    assert_true(tide_machine_wait_passes(0, -3));
    assert_false(tide_machine_wait_passes(7, 8));
    tide_op_t big = tide_op_wait(0, 5, INT64_MAX / 2 + 1, 0);
    assert_false(tide_machine_wait_target(2, &big, &t));
    assert_false(tide_machine_wait_target((uint64_t)INT64_MAX + 1, &wait, &t));
    p.ranks[0].queues[TIDE_Q_CALLER].ops[0] = big;
    assert_tide(TIDE_ERR_OVERFLOW, tide_machine_init(&m, &p, 6, 3));
    tide_program_free(&p);
    tide_plan_destroy(plan);
}

/* The hand-built two-rank program of test_machine_rules: rank 1 signals counter 5 of rank 0
 * from its CE and NET queues (`signals` of them), rank 0's caller waits for them, then records
 * an event. */
static void two_rank_program(tide_plan_t plan, int signals, tide_program_t *p) {
    assert_tide(TIDE_SUCCESS, tide_program_init(plan, TIDE_COLL_ALL_GATHER, TIDE_RS_IN_PLACE, p));
    const tide_op_t sig = tide_op_signal(0, 5);
    assert_tide(TIDE_SUCCESS, tide_program_push(p, 1, TIDE_Q_CE, &sig));
    if (signals > 1) assert_tide(TIDE_SUCCESS, tide_program_push(p, 1, TIDE_Q_NET, &sig));
    const tide_op_t wait = tide_op_wait(0, 5, signals, signals);
    assert_tide(TIDE_SUCCESS, tide_program_push(p, 0, TIDE_Q_CALLER, &wait));
    /* An op after the wait: trailing waits touch no memory and are not joined. */
    const tide_op_t ev = tide_op_new(TIDE_OP_EVENT);
    assert_tide(TIDE_SUCCESS, tide_program_push(p, 0, TIDE_Q_CALLER, &ev));
}

static bool same_commands(const tide_schedule_t *a, const tide_schedule_t *b) {
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        if (a->num_cmds[f] != b->num_cmds[f]) return false;
        for (int i = 0; i < a->num_cmds[f]; ++i) /* fields: the struct has padding */
            if (a->cmds[f][i].kind != b->cmds[f][i].kind ||
                a->cmds[f][i].thread != b->cmds[f][i].thread ||
                a->cmds[f][i].arg != b->cmds[f][i].arg)
                return false;
    }
    return true;
}

/* The hand-built program's schedule: two slots (one per signalling op, both of rank 1), the
 * wait of rank 0 names both in each form, rank 0 gets two signals per call on counter 5. */
static void test_hand_built_schedule(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(2, 1, 1, TIDE_RS_IN_PLACE, 0);
    tide_program_t p;
    two_rank_program(plan, 2, &p);
    tide_schedule_t s;
    assert_tide(TIDE_SUCCESS, tide_schedule_build(&p, &s));
    assert_int_equal(s.num_ranks, 2);
    assert_int_equal(s.num_threads, 2 * TIDE_Q_COUNT);
    assert_int_equal(s.num_ops, 4);
    assert_int_equal(s.num_slots, 2);
    assert_true(s.num_counters >= 6);
    assert_int_equal(s.incs[0 * s.num_counters + 5], 2);
    assert_int_equal(s.incs[1 * s.num_counters + 5], 0);
    assert_false(s.has_sum);
    const int ce1 = 1 * TIDE_Q_COUNT + TIDE_Q_CE, net1 = 1 * TIDE_Q_COUNT + TIDE_Q_NET;
    const int w0 = 0 * TIDE_Q_COUNT + TIDE_Q_CALLER;
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        check_form(&p, &s, f);
        bool waits_on[2] = {false, false};
        for (int i = 0; i < s.num_cmds[f]; ++i) {
            const tide_sched_cmd_t *c = &s.cmds[f][i];
            if (c->kind == TIDE_SCHED_CMD_WAIT) {
                assert_int_equal(c->thread, w0);
                waits_on[c->arg] = true;
            }
        }
        /* Both signals are of other threads than the waiter's: neither wait is implied. */
        assert_true(waits_on[0] && waits_on[1]);
    }
    assert_true((s.slot_thread[0] == ce1 && s.slot_thread[1] == net1) ||
                (s.slot_thread[0] == net1 && s.slot_thread[1] == ce1));

    /* One signal per call instead of two: another count, so the calls of one may not follow
     * the calls of the other. */
    tide_program_t q;
    two_rank_program(plan, 1, &q);
    tide_schedule_t t;
    assert_tide(TIDE_SUCCESS, tide_schedule_build(&q, &t));
    assert_int_equal(t.incs[0 * t.num_counters + 5], 1);
    assert_false(tide_schedule_incs_match(&s, &t));
    assert_true(tide_schedule_incs_match(&t, &t));
    assert_true(t.rank_hash[0] != s.rank_hash[0]); /* its wait's inc and thr differ */
    assert_true(t.rank_hash[1] != s.rank_hash[1]); /* one signalling op less */
    tide_schedule_free(&t);
    tide_program_free(&q);
    tide_schedule_free(&s);
    tide_program_free(&p);
    tide_plan_destroy(plan);
}

/* A schedule depends on the program only: rebuilt, the same command lists; a mutated wait
 * changes its own rank's hash and no other rank's. */
static void test_rebuild_and_hash(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(2, 2, 2, TIDE_RS_SLOT_REUSE, 1);
    tide_program_t rs, bad;
    assert_tide(TIDE_SUCCESS, tide_program_compile_rs(plan, TIDE_RS_SLOT_REUSE, &rs));
    tide_schedule_t a, b;
    assert_tide(TIDE_SUCCESS, tide_schedule_build(&rs, &a));
    assert_tide(TIDE_SUCCESS, tide_schedule_build(&rs, &b));
    assert_true(same_commands(&a, &b));
    assert_int_equal(a.num_slots, b.num_slots);
    assert_memory_equal(a.op_slot, b.op_slot, (size_t)a.num_ops * sizeof(*a.op_slot));
    tide_schedule_free(&b);

    assert_tide(TIDE_SUCCESS, tide_program_clone(&rs, &bad));
    tide_op_t *w = first_wait(&bad);
    assert_non_null(w);
    int wr = -1; /* the rank of that wait */
    for (int r = 0; r < bad.num_ranks && wr < 0; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            if (bad.ranks[r].queues[q].num_ops > 0 && w >= bad.ranks[r].queues[q].ops &&
                w < bad.ranks[r].queues[q].ops + bad.ranks[r].queues[q].num_ops)
                wr = r;
    assert_true(wr >= 0);
    w->thr += 1;
    for (int r = 0; r < rs.num_ranks; ++r)
        assert_true((tide_schedule_rank_hash(&bad, r) != a.rank_hash[r]) == (r == wr));
    tide_program_free(&bad);
    tide_schedule_free(&a);
    tide_program_free(&rs);
    tide_plan_destroy(plan);
}

/* Malformed programs and arguments fail with TIDE_ERR_INTERNAL naming what is wrong, and
 * leave nothing allocated (the sanitizer builds check the latter). */
static void test_malformed_rejected(void **state) {
    (void)state;
    tide_plan_t plan = plan_of(2, 1, 1, TIDE_RS_IN_PLACE, 0);
    tide_program_t p, bad;
    two_rank_program(plan, 2, &p);
    tide_schedule_t s;

    assert_tide(TIDE_SUCCESS, tide_program_clone(&p, &bad));
    bad.ranks[1].queues[TIDE_Q_CE].ops[0].kind = TIDE_OP_KIND_COUNT;
    assert_tide(TIDE_ERR_INTERNAL, tide_schedule_build(&bad, &s));
    assert_non_null(strstr(tide_get_last_error(), "has kind"));
    tide_program_free(&bad);

    assert_tide(TIDE_SUCCESS, tide_program_clone(&p, &bad));
    bad.ranks[1].queues[TIDE_Q_CE].ops[0].ctr = TIDE_ARENA_SIGNAL_SLOTS;
    assert_tide(TIDE_ERR_INTERNAL, tide_schedule_build(&bad, &s));
    assert_non_null(strstr(tide_get_last_error(), "names counter"));
    tide_program_free(&bad);

    assert_tide(TIDE_SUCCESS, tide_program_clone(&p, &bad));
    bad.ranks[1].queues[TIDE_Q_CE].ops[0].sig_rank = 2; /* no rank 2 */
    assert_tide(TIDE_ERR_INTERNAL, tide_schedule_build(&bad, &s));
    tide_program_free(&bad);

    assert_tide(TIDE_ERR_INTERNAL, tide_schedule_build(NULL, &s));
    assert_tide(TIDE_ERR_INTERNAL, tide_schedule_build_rails(&p, -1, &s));
    tide_program_free(&p);
    tide_plan_destroy(plan);
}

/* Runs of waits (tide_sched_wait_runs): per thread, consecutive waits of one kind, whatever
 * other threads' commands stand between them; any other command of the thread, or a wait of
 * the other kind, starts a new run.  defer marks every wait of a run but its last. */
static void test_wait_runs(void **state) {
    (void)state;
    enum { W = TIDE_SCHED_CMD_WAIT, WP = TIDE_SCHED_CMD_WAIT_PREV, R = TIDE_SCHED_CMD_RECORD,
           O = TIDE_SCHED_CMD_OP };
    const tide_sched_cmd_t cmds[] = {
        {W, 0, 1},  /* 0: thread 0, run A */
        {R, 1, 2},  /* 1: thread 1 between: A goes on */
        {W, 0, 3},  /* 2: A */
        {W, 1, 4},  /* 3: thread 1, run B */
        {WP, 0, 5}, /* 4: another kind: run C */
        {W, 0, 6},  /* 5: run D */
        {O, 0, 0},  /* 6: thread 0's op ends D */
        {W, 0, 7},  /* 7: run E, alone */
        {W, 1, 8},  /* 8: B */
        {W, 2, 9},  /* 9: run F, alone */
    };
    const int n = (int)(sizeof(cmds) / sizeof(cmds[0]));
    const uint8_t want[] = {1, 0, 0, 1, 0, 0, 0, 0, 0, 0};
    uint8_t defer[16];
    memset(defer, 0xee, sizeof(defer));
    int runs = -1;
    assert_tide(TIDE_SUCCESS, tide_sched_wait_runs(cmds, n, 3, defer, &runs));
    assert_int_equal(runs, 6);
    for (int i = 0; i < n; ++i)
        assert_int_equal(defer[i], want[i]);
    assert_int_equal(defer[n], 0xee); /* nothing past the list written */
    runs = -1;
    assert_tide(TIDE_SUCCESS, tide_sched_wait_runs(cmds, 0, 3, NULL, &runs));
    assert_int_equal(runs, 0);
    assert_tide(TIDE_ERR_INTERNAL, tide_sched_wait_runs(cmds, n, 2, defer, &runs)); /* thread 2 */
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_sched_wait_runs(NULL, 3, 3, defer, &runs));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_sched_wait_runs(cmds, n, 0, defer, &runs));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compiled_programs),
        cmocka_unit_test(test_fence_programs),
        cmocka_unit_test(test_rails_variant),
        cmocka_unit_test(test_mutations_rejected),
        cmocka_unit_test(test_machine_rules),
        cmocka_unit_test(test_hand_built_schedule),
        cmocka_unit_test(test_rebuild_and_hash),
        cmocka_unit_test(test_malformed_rejected),
        cmocka_unit_test(test_wait_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
