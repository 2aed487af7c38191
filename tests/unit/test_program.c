/*
 * test_program.c - the program IR container and the TIDE-AG compiler.
 *
 * The AG programs are checked by executing them symbolically: every byte of every landing and
 * receive stage carries a tag (call, source rank, byte of that rank's packed shard); ops run
 * in a random order that respects only queue order and counter waits, over three consecutive
 * calls on cumulative counters.  A correct program ends each call with every landing byte
 * written exactly once, with the byte Landing(p, r) + b holding byte o_p + b of rank r's shard
 * of that call, and never writes a landing before its owner published readiness.
 */
#include "test_util.h"

#include "core/checks.h"
#include "plan/plan.h"
#include "program/machine.h"
#include "program/counters.h"
#include "program/program.h"

#define CALLS 3

typedef struct {
    tide_topo_t topo;
    tide_geom_t geom;
    tide_ag_schedule_t ag;
    struct tide_plan plan;
} test_plan_t;

static const tide_param_shape_t k_shapes[] = {{5, 3}, {1, 7}, {20, 2}, {3, 1}};

/* Built from the planner's pieces only: AG needs topology, geometry and the Bruck schedule. */
static void make_plan(int m, int l, int num_params, bool cast, test_plan_t *tp) {
    memset(tp, 0, sizeof(*tp));
    tide_group_desc_t group = {num_params, k_shapes, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16,
                               cast ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16};
    assert_tide(TIDE_SUCCESS, tide_topo_init(m, l, &tp->topo));
    assert_tide(TIDE_SUCCESS, tide_geom_build(&tp->topo, &group, &tp->geom));
    assert_tide(TIDE_SUCCESS, tide_ag_schedule_build(&tp->topo, &tp->ag));
    assert_int_equal(tp->geom.cast, cast);
    tp->plan.topo = tp->topo;
    tp->plan.geom = tp->geom;
    tp->plan.ag = tp->ag;
}

static void free_plan(test_plan_t *tp) {
    tide_geom_free(&tp->geom);
    tide_ag_schedule_free(&tp->ag);
}

/* ------------------------------------------------------------------ symbolic execution */

typedef struct {
    const tide_program_t *prog;
    const struct tide_plan *plan;
    int n, m;
    uint64_t s, landing_bytes, stage_bytes;
    int64_t *landing[CALLS]; /* [rank][N S] tags, -1 unwritten */
    int *writes[CALLS];      /* [rank][N S] write counts */
    int64_t *stage;          /* [rank][stage bytes] */
    int64_t *ctr;            /* [rank][counters] */
    uint64_t num_ctrs;
    int *ready_calls; /* calls for which a rank published readiness */
    int *done_calls;  /* call-done events per rank */
} sim_t;

static int64_t tag(const sim_t *s, int call, int rank, uint64_t byte) {
    return ((int64_t)call * s->n + rank) * (int64_t)s->s + (int64_t)byte;
}

/* Tag storage behind a destination or source reference (NULL for the shard operand). */
static int64_t *resolve(sim_t *s, int call, int self, const tide_ref_t *ref, uint64_t off,
                        uint64_t len, bool write) {
    switch (ref->kind) {
    case TIDE_REF_LANDING:
        assert_true(write);
        assert_true(ref->rank >= 0 && ref->rank < s->n);
        assert_true(off + len <= s->landing_bytes);
        /* The owner published that its landing slot of this call is free. */
        assert_true(s->ready_calls[ref->rank] > call);
        for (uint64_t i = 0; i < len; ++i)
            s->writes[call][(uint64_t)ref->rank * s->landing_bytes + off + i]++;
        return &s->landing[call][(uint64_t)ref->rank * s->landing_bytes + off];
    case TIDE_REF_ARENA:
        assert_int_equal(ref->region, TIDE_REGION_RECV_STAGE);
        assert_true(ref->rank >= 0 && ref->rank < s->n);
        if (!write) assert_int_equal(ref->rank, self); /* AG only pushes */
        assert_true(off + len <= s->stage_bytes);
        return &s->stage[(uint64_t)ref->rank * s->stage_bytes + off];
    case TIDE_REF_SHARD:
        assert_false(write);
        assert_true(off + len <= s->s);
        return NULL;
    default:
        fail_msg("unexpected reference kind %d", ref->kind);
        return NULL;
    }
}

static void move_row(sim_t *s, int call, int self, const tide_op_t *op, uint64_t doff,
                     uint64_t soff, uint64_t len) {
    int64_t *src = resolve(s, call, self, &op->src, soff, len, false);
    int64_t *dst = resolve(s, call, self, &op->dst, doff, len, true);
    for (uint64_t i = 0; i < len; ++i)
        dst[i] = src ? src[i] : tag(s, call, self, soff + i);
}

static void sim_signal(sim_t *s, int rank, int ctr) {
    assert_true(rank >= 0 && rank < s->n);
    assert_true(ctr >= 0 && (uint64_t)ctr < s->num_ctrs);
    s->ctr[(uint64_t)rank * s->num_ctrs + (uint64_t)ctr]++;
}

/* The landing of `rank` in `call` is complete and correct. */
static void check_landing(const sim_t *s, int call, int rank) {
    const tide_geom_t *g = &s->plan->geom;
    const int64_t *land = &s->landing[call][(uint64_t)rank * s->landing_bytes];
    const int *writes = &s->writes[call][(uint64_t)rank * s->landing_bytes];
    for (int p = 0; p < g->num_params; ++p)
        for (int r = 0; r < s->n; ++r)
            for (uint64_t b = 0; b < g->params[p].shard_bytes; ++b) {
                uint64_t at = g->params[p].offset * (uint64_t)s->n +
                              (uint64_t)r * g->params[p].shard_bytes + b;
                assert_int_equal(land[at], tag(s, call, r, g->params[p].offset + b));
            }
    for (uint64_t i = 0; i < s->landing_bytes; ++i)
        assert_int_equal(writes[i], 1);
}

static void execute(sim_t *s, int rank, int call, int q, const tide_op_t *op) {
    switch (op->kind) {
    case TIDE_OP_COPY:
        move_row(s, call, rank, op, op->dst.offset, op->src.offset, op->bytes);
        break;
    case TIDE_OP_COPY2D:
        for (uint64_t row = 0; row < op->rows; ++row)
            move_row(s, call, rank, op, op->dst.offset + row * op->dst_pitch,
                     op->src.offset + row * op->src_pitch, op->bytes);
        break;
    case TIDE_OP_CAST: {
        /* fp32 master -> bf16: byte k of the output is byte k of the packed bf16 shard. */
        assert_int_equal(op->src.kind, TIDE_REF_SHARD);
        assert_int_equal(op->bytes, s->s);
        int64_t *dst = resolve(s, call, rank, &op->dst, op->dst.offset, op->bytes, true);
        for (uint64_t i = 0; i < op->bytes; ++i)
            dst[i] = tag(s, call, rank, i);
        break;
    }
    case TIDE_OP_SIGNAL:
        if (q == TIDE_Q_READY && s->ready_calls[rank] == call) s->ready_calls[rank] = call + 1;
        break;
    case TIDE_OP_EVENT:
        assert_int_equal(op->event, TIDE_EVENT_CALL_DONE);
        check_landing(s, call, rank);
        s->done_calls[rank]++;
        break;
    case TIDE_OP_WAIT:
        break;
    default:
        fail_msg("unexpected op kind %d in an AG program", op->kind);
    }
    if (tide_machine_signals(op)) sim_signal(s, op->sig_rank, op->ctr);
}

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/*
 * Runs CALLS calls in a random interleaving; fails on a deadlock or a wrong byte.  Uniform
 * mode picks any runnable queue; priority mode (as in probabilistic concurrency testing) lets
 * a few queues race ahead of the others, which is what exposes a missing wait.
 */
static void simulate(const tide_program_t *prog, uint64_t seed, bool priorities) {
    const struct tide_plan *plan = prog->plan;
    sim_t s = {.prog = prog, .plan = plan, .n = plan->topo.ranks, .m = plan->topo.nodes};
    s.s = plan->geom.shard_bytes;
    s.landing_bytes = plan->geom.group_bytes;
    s.stage_bytes = (uint64_t)(plan->geom.cast ? s.m : s.m - 1) * s.s;
    s.num_ctrs = tide_ctr_count(plan);
    size_t nl = (size_t)s.n * s.landing_bytes;
    for (int c = 0; c < CALLS; ++c) {
        s.landing[c] = malloc(nl * sizeof(int64_t) + 8);
        s.writes[c] = calloc(nl + 1, sizeof(int));
        assert_non_null(s.landing[c]);
        assert_non_null(s.writes[c]);
        for (size_t i = 0; i < nl; ++i)
            s.landing[c][i] = -1;
    }
    s.stage = calloc((size_t)s.n * s.stage_bytes + 1, sizeof(int64_t));
    s.ctr = calloc((size_t)s.n * s.num_ctrs, sizeof(int64_t));
    s.ready_calls = calloc((size_t)s.n, sizeof(int));
    s.done_calls = calloc((size_t)s.n, sizeof(int));
    int nq = s.n * TIDE_Q_COUNT;
    int *pc = calloc((size_t)nq, sizeof(int));
    int *call = calloc((size_t)nq, sizeof(int));
    int *runnable = calloc((size_t)nq, sizeof(int));
    uint64_t *prio = priorities ? calloc((size_t)nq, sizeof(uint64_t)) : NULL;
    assert_true(s.stage && s.ctr && s.ready_calls && s.done_calls && pc && call && runnable);
    for (int i = 0; prio != NULL && i < nq; ++i)
        prio[i] = rng_next(&seed);

    for (;;) {
        int count = 0, pending = 0;
        for (int i = 0; i < nq; ++i) {
            const tide_queue_ops_t *qo = &prog->ranks[i / TIDE_Q_COUNT].queues[i % TIDE_Q_COUNT];
            if (qo->num_ops == 0 || call[i] == CALLS) continue;
            ++pending;
            const tide_op_t *op = &qo->ops[pc[i]];
            /* The machine's wait rule; the order is deliberately weaker than the machine's (a
             * queue may start its next call before its rank's other queues finished theirs). */
            if (op->kind == TIDE_OP_WAIT) {
                int64_t v = s.ctr[(uint64_t)(i / TIDE_Q_COUNT) * s.num_ctrs + (uint64_t)op->ctr];
                int64_t target = 0;
                assert_true(tide_machine_wait_target((uint64_t)call[i], op, &target));
                if (!tide_machine_wait_passes(v, target)) continue;
            }
            runnable[count++] = i;
        }
        if (pending == 0) break;
        if (count == 0) {
            for (int i = 0; i < nq; ++i) {
                const tide_queue_ops_t *qo =
                    &prog->ranks[i / TIDE_Q_COUNT].queues[i % TIDE_Q_COUNT];
                if (qo->num_ops && call[i] < CALLS)
                    print_error("stuck: rank %d %s[%d] call %d\n", i / TIDE_Q_COUNT,
                                tide_queue_name((tide_queue_t)(i % TIDE_Q_COUNT)), pc[i], call[i]);
            }
            fail_msg("AG program deadlocks (M = %d, L = %d)", s.m, plan->topo.gpus_per_node);
        }
        int i = runnable[rng_next(&seed) % (uint64_t)count];
        if (prio != NULL) {
            /* Priority mode: the highest-priority runnable queue runs; now and then the one
             * that ran drops to a random priority, so some queues stall for long stretches. */
            for (int k = 0; k < count; ++k)
                if (prio[runnable[k]] > prio[i]) i = runnable[k];
            if (rng_next(&seed) % 64 == 0) prio[i] = rng_next(&seed);
        }
        int rank = i / TIDE_Q_COUNT, q = i % TIDE_Q_COUNT;
        const tide_queue_ops_t *qo = &prog->ranks[rank].queues[q];
        execute(&s, rank, call[i], q, &qo->ops[pc[i]]);
        if (++pc[i] == qo->num_ops) {
            pc[i] = 0;
            ++call[i];
        }
    }
    for (int r = 0; r < s.n; ++r)
        assert_int_equal(s.done_calls[r], CALLS);

    free(prio);
    free(runnable);
    free(call);
    free(pc);
    free(s.done_calls);
    free(s.ready_calls);
    free(s.ctr);
    free(s.stage);
    for (int c = 0; c < CALLS; ++c) {
        free(s.writes[c]);
        free(s.landing[c]);
    }
}

/* ------------------------------------------------------------------ static properties */

static bool has_signal(const tide_op_t *op) {
    return tide_machine_signals(op);
}

/* Brute force: signals per (rank, counter) per call, compared with every wait's inc. */
static void check_incs_brute(const tide_program_t *prog) {
    uint64_t nc = tide_ctr_count(prog->plan);
    assert_true(nc <= TIDE_ARENA_SIGNAL_SLOTS);
    int64_t *count = calloc((size_t)prog->num_ranks * nc, sizeof(int64_t));
    assert_non_null(count);
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[r].queues[q].num_ops; ++i) {
                const tide_op_t *op = &prog->ranks[r].queues[q].ops[i];
                assert_true(op->ctr >= 0 && op->ctr < TIDE_CTR_AG_END); /* AG counters only */
                if (has_signal(op)) count[(uint64_t)op->sig_rank * nc + (uint64_t)op->ctr]++;
            }
    int waits = 0;
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[r].queues[q].num_ops; ++i) {
                const tide_op_t *op = &prog->ranks[r].queues[q].ops[i];
                if (op->kind != TIDE_OP_WAIT) continue;
                assert_int_equal(op->inc, count[(uint64_t)r * nc + (uint64_t)op->ctr]);
                assert_true(op->inc >= 1 && op->thr <= op->inc);
                ++waits;
            }
    assert_true(waits >= 3 * prog->num_ranks);
    free(count);
}

/* Landing copies per rank = the planner's unicast descriptor count. */
static void check_descriptors(const tide_program_t *prog) {
    const struct tide_plan *plan = prog->plan;
    for (int r = 0; r < prog->num_ranks; ++r) {
        uint64_t expected = 0, got = 0;
        assert_tide(TIDE_SUCCESS, tide_ag_descriptors(&plan->topo, &plan->ag, plan->geom.num_params,
                                                      r / plan->topo.gpus_per_node, 0, &expected));
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[r].queues[q].num_ops; ++i) {
                const tide_op_t *op = &prog->ranks[r].queues[q].ops[i];
                if ((op->kind == TIDE_OP_COPY || op->kind == TIDE_OP_COPY2D) &&
                    op->dst.kind == TIDE_REF_LANDING)
                    ++got;
            }
        assert_int_equal(got, expected);
    }
}

static bool listing_contains(const tide_program_t *prog, int rank, const char *const *words,
                             int num_words) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_tide(TIDE_SUCCESS, tide_program_print(prog, rank, f));
    fclose(f);
    int ops = 0;
    for (int q = 0; q < TIDE_Q_COUNT; ++q)
        ops += prog->ranks[rank].queues[q].num_ops;
    int lines = 0;
    for (size_t i = 0; i < len; ++i)
        lines += buf[i] == '\n';
    bool ok = lines >= ops;
    for (int w = 0; w < num_words; ++w)
        ok = ok && strstr(buf, words[w]) != NULL;
    free(buf);
    return ok;
}

static void check_config(int m, int l, int num_params, bool cast) {
    test_plan_t tp;
    make_plan(m, l, num_params, cast, &tp);
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(&tp.plan, &prog));
    assert_int_equal(prog.num_ranks, m * l);
    assert_int_equal(prog.coll, TIDE_COLL_ALL_GATHER);
    check_incs_brute(&prog);
    assert_tide(TIDE_SUCCESS, tide_program_check_incs(&prog));
    check_descriptors(&prog);
    for (int r = 0; r < prog.num_ranks; ++r) {
        assert_int_equal(prog.ranks[r].rank, r);
        assert_int_equal(prog.ranks[r].queues[TIDE_Q_READ].num_ops, 0);
        assert_int_equal(prog.ranks[r].queues[TIDE_Q_NET].num_ops, 0);
        /* M = 1: no stage traffic at all unless the cast needs slot 0. */
        if (m == 1) assert_int_equal(prog.ranks[r].queues[TIDE_Q_CE].num_ops, 0);
    }
    for (uint64_t seed = 1; seed <= 12; ++seed)
        simulate(&prog, seed * 0x9E3779B97F4A7C15ull, seed > 2);
    const char *words[] = {"COPY", "WAIT", "SIGNAL", "EVENT", "AG_READY", "AG_LANDED"};
    assert_true(listing_contains(&prog, prog.num_ranks - 1, words, 6));
    if (cast) {
        const char *w[] = {"CAST"};
        assert_true(listing_contains(&prog, 0, w, 1));
    }
    if (m > 1) {
        const char *w[] = {"AG_ARRIVED+0", "AG_CREDIT+0", "recv_stage"};
        assert_true(listing_contains(&prog, 0, w, 3));
    }
    tide_program_free(&prog);
    free_plan(&tp);
}

static void test_ag_programs(void **state) {
    (void)state;
    static const int configs[][2] = {{1, 1}, {1, 4}, {2, 1}, {2, 3}, {3, 2}, {4, 2},
                                     {5, 1}, {5, 2}, {7, 3}, {9, 1}, {9, 2}, {13, 1}};
    for (size_t i = 0; i < sizeof(configs) / sizeof(configs[0]); ++i)
        for (int cast = 0; cast <= 1; ++cast)
            for (int p = 1; p <= 4; p += 3)
                check_config(configs[i][0], configs[i][1], p, cast);
}

/* Strided groups become COPY2D: M = 9 gives a 4-slot round (slots 4..7) that some nodes see
 * unwrapped. */
static void test_ag_strided(void **state) {
    (void)state;
    test_plan_t tp;
    make_plan(9, 2, 4, false, &tp);
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(&tp.plan, &prog));
    int copy2d = 0;
    for (int r = 0; r < prog.num_ranks; ++r)
        for (int i = 0; i < prog.ranks[r].queues[TIDE_Q_CE].num_ops; ++i) {
            const tide_op_t *op = &prog.ranks[r].queues[TIDE_Q_CE].ops[i];
            if (op->kind != TIDE_OP_COPY2D) continue;
            ++copy2d;
            assert_true(op->rows >= 4);
            assert_int_equal(op->src_pitch, tp.geom.shard_bytes);
        }
    assert_true(copy2d > 0);
    const char *w[] = {"COPY2D"};
    bool found = false;
    for (int r = 0; r < prog.num_ranks; ++r)
        found = found || listing_contains(&prog, r, w, 1);
    assert_true(found);
    tide_program_free(&prog);
    free_plan(&tp);
}

/* The inc check rejects a drifted threshold and a dropped signal. */
static void test_inc_check_catches_drift(void **state) {
    (void)state;
    test_plan_t tp;
    make_plan(5, 2, 2, false, &tp);
    tide_program_t prog, copy;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(&tp.plan, &prog));

    assert_tide(TIDE_SUCCESS, tide_program_clone(&prog, &copy));
    tide_queue_ops_t *done = &copy.ranks[3].queues[TIDE_Q_DONE];
    assert_int_equal(done->ops[0].kind, TIDE_OP_WAIT);
    done->ops[0].inc += 1;
    assert_tide(TIDE_ERR_INTERNAL, tide_program_check_incs(&copy));
    done->ops[0].inc -= 1;
    done->ops[0].thr = done->ops[0].inc + 1;
    assert_tide(TIDE_ERR_INTERNAL, tide_program_check_incs(&copy));
    tide_program_free(&copy);

    /* Drop the ready signal to rank 0: rank 0's waits on AG_READY now over-count. */
    assert_tide(TIDE_SUCCESS, tide_program_clone(&prog, &copy));
    tide_queue_ops_t *ready = &copy.ranks[1].queues[TIDE_Q_READY];
    bool dropped = false;
    for (int i = 0; i < ready->num_ops; ++i)
        if (ready->ops[i].kind == TIDE_OP_SIGNAL && ready->ops[i].sig_rank == 0) {
            ready->ops[i].kind = TIDE_OP_EVENT; /* no longer a signal */
            dropped = true;
        }
    assert_true(dropped);
    assert_tide(TIDE_ERR_INTERNAL, tide_program_check_incs(&copy));
    tide_program_free(&copy);

    /* A counter outside the plan's signal slots. */
    assert_tide(TIDE_SUCCESS, tide_program_clone(&prog, &copy));
    copy.ranks[0].queues[TIDE_Q_CALLER].ops[copy.ranks[0].queues[TIDE_Q_CALLER].num_ops - 1].ctr =
        TIDE_ARENA_SIGNAL_SLOTS;
    assert_tide(TIDE_ERR_INTERNAL, tide_program_check_incs(&copy));
    tide_program_free(&copy);

    assert_tide(TIDE_SUCCESS, tide_program_check_incs(&prog));
    tide_program_free(&prog);
    free_plan(&tp);
}

/* ------------------------------------------------------------------ container */

static bool ops_equal(const tide_program_t *a, const tide_program_t *b) {
    if (a->num_ranks != b->num_ranks) return false;
    for (int r = 0; r < a->num_ranks; ++r) {
        if (a->ranks[r].num_tables != b->ranks[r].num_tables) return false;
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const tide_queue_ops_t *x = &a->ranks[r].queues[q], *y = &b->ranks[r].queues[q];
            if (x->num_ops != y->num_ops) return false;
            if (x->num_ops && memcmp(x->ops, y->ops, (size_t)x->num_ops * sizeof(tide_op_t)))
                return false;
        }
    }
    return true;
}

static void test_clone_is_deep(void **state) {
    (void)state;
    test_plan_t tp;
    make_plan(3, 2, 4, true, &tp);
    tide_program_t prog, copy;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(&tp.plan, &prog));
    tide_sum_seg_t segs[3] = {{0, 0, 0, 4, 4, 0, 0}, {4, 4, 8, 4, 2, 1, 0}, {8, 8, 0, 8, 8, 2, 0}};
    tide_table_t table = {.kind = TIDE_OP_SUM, .num_segs = 3, .sum_segs = segs, .num_staged = 1};
    int index = -1;
    assert_tide(TIDE_SUCCESS, tide_program_add_table(&prog, 2, &table, &index));
    assert_int_equal(index, 0);
    segs[0].len = 99; /* the program keeps its own copy */
    assert_int_equal(prog.ranks[2].tables[0].sum_segs[0].len, 4);

    assert_tide(TIDE_SUCCESS, tide_program_clone(&prog, &copy));
    assert_true(ops_equal(&prog, &copy));
    assert_ptr_equal(copy.plan, prog.plan);
    assert_ptr_not_equal(copy.ranks, prog.ranks);
    for (int r = 0; r < copy.num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            if (copy.ranks[r].queues[q].num_ops)
                assert_ptr_not_equal(copy.ranks[r].queues[q].ops, prog.ranks[r].queues[q].ops);

    uint64_t before = prog.ranks[1].queues[TIDE_Q_CALLER].ops[0].bytes;
    copy.ranks[1].queues[TIDE_Q_CALLER].ops[0].bytes = before + 1;
    copy.ranks[2].tables[0].sum_segs[1].len = 77;
    assert_int_equal(prog.ranks[1].queues[TIDE_Q_CALLER].ops[0].bytes, before);
    assert_int_equal(prog.ranks[2].tables[0].sum_segs[1].len, 4);
    /* Appending to the clone grows only the clone. */
    tide_op_t sig = {.kind = TIDE_OP_SIGNAL, .sig_rank = 0, .ctr = TIDE_CTR_AG_READY};
    int n_before = prog.ranks[0].queues[TIDE_Q_READY].num_ops;
    for (int i = 0; i < 40; ++i)
        assert_tide(TIDE_SUCCESS, tide_program_push(&copy, 0, TIDE_Q_READY, &sig));
    assert_int_equal(prog.ranks[0].queues[TIDE_Q_READY].num_ops, n_before);
    assert_int_equal(copy.ranks[0].queues[TIDE_Q_READY].num_ops, n_before + 40);

    tide_program_free(&copy);
    assert_null(copy.ranks);
    tide_program_free(&copy); /* idempotent */
    tide_program_free(NULL);
    tide_program_free(&prog);
    free_plan(&tp);
}

static void test_builders(void **state) {
    (void)state;
    test_plan_t tp;
    make_plan(2, 2, 1, false, &tp);
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS,
                tide_program_init(&tp.plan, TIDE_COLL_REDUCE_SCATTER, TIDE_RS_SLOT_REUSE, &prog));
    assert_int_equal(prog.num_ranks, 4);
    assert_int_equal(prog.mode, TIDE_RS_SLOT_REUSE);
    /* Growth keeps order and contents across many reallocations. */
    for (int i = 0; i < 1000; ++i) {
        tide_op_t op = {.kind = TIDE_OP_ZERO, .bytes = (uint64_t)i, .sig_rank = -1};
        assert_tide(TIDE_SUCCESS, tide_program_push(&prog, 3, TIDE_Q_NET, &op));
    }
    assert_int_equal(prog.ranks[3].queues[TIDE_Q_NET].num_ops, 1000);
    for (int i = 0; i < 1000; ++i)
        assert_int_equal(prog.ranks[3].queues[TIDE_Q_NET].ops[i].bytes, (uint64_t)i);
    tide_land_seg_t lsegs[2] = {{0, 0, 8, 0}, {8, 16, 4, 0}};
    for (int i = 0; i < 40; ++i) {
        tide_table_t t = {.kind = TIDE_OP_LAND, .num_segs = 2, .land_segs = lsegs, .num_in = 2};
        int index = -1;
        assert_tide(TIDE_SUCCESS, tide_program_add_table(&prog, 1, &t, &index));
        assert_int_equal(index, i);
    }
    tide_table_t empty = {.kind = TIDE_OP_SUM, .num_segs = 0};
    int index = -1;
    assert_tide(TIDE_SUCCESS, tide_program_add_table(&prog, 0, &empty, &index));
    tide_op_t land = {.kind = TIDE_OP_LAND, .table = 5, .init = 1, .sig_rank = -1};
    assert_tide(TIDE_SUCCESS, tide_program_push(&prog, 1, TIDE_Q_NET, &land));
    const char *w[] = {"LAND", "table=5", "init"};
    assert_true(listing_contains(&prog, 1, w, 3));
    const char *w3[] = {"ZERO"};
    assert_true(listing_contains(&prog, 3, w3, 1));
    tide_program_free(&prog);
    free_plan(&tp);
}

static void test_bad_input(void **state) {
    (void)state;
    test_plan_t tp;
    make_plan(2, 2, 1, false, &tp);
    tide_program_t prog, out;
    memset(&out, 0x5a, sizeof(out));
    tide_program_t untouched = out;

    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_compile_ag(NULL, &out));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_compile_ag(&tp.plan, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_init(NULL, TIDE_COLL_ALL_GATHER, 0, &out));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_program_init(&tp.plan, (tide_collective_t)7, TIDE_RS_IN_PLACE, &out));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_program_init(&tp.plan, TIDE_COLL_ALL_GATHER, TIDE_RS_MODE_COUNT, &out));
    struct tide_plan broken = tp.plan;
    broken.geom.ranks = 3; /* geometry of another topology */
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_compile_ag(&broken, &out));
    broken = tp.plan;
    broken.ag.num_rounds = 0; /* schedule of another topology */
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_compile_ag(&broken, &out));
    assert_memory_equal(&out, &untouched, sizeof(out));

    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(&tp.plan, &prog));
    tide_op_t op = {.kind = TIDE_OP_SIGNAL, .sig_rank = 0};
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_push(NULL, 0, TIDE_Q_CE, &op));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_push(&prog, 4, TIDE_Q_CE, &op));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_push(&prog, -1, TIDE_Q_CE, &op));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_push(&prog, 0, TIDE_Q_COUNT, &op));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_push(&prog, 0, TIDE_Q_CE, NULL));
    op.kind = TIDE_OP_KIND_COUNT;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_push(&prog, 0, TIDE_Q_CE, &op));

    int index = 42;
    tide_table_t t = {.kind = TIDE_OP_COPY, .num_segs = 0};
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_add_table(&prog, 0, &t, &index));
    t.kind = TIDE_OP_SUM;
    t.num_segs = 2; /* no segment array */
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_add_table(&prog, 0, &t, &index));
    t.num_segs = -1;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_add_table(&prog, 0, &t, &index));
    t.num_segs = 0;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_add_table(&prog, 0, &t, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_add_table(&prog, 9, &t, &index));
    assert_int_equal(index, 42);

    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_clone(NULL, &out));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_clone(&prog, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_print(&prog, 4, stderr));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_print(&prog, 0, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_print(NULL, 0, stderr));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_program_check_incs(NULL));
    tide_program_free(&prog);
    free_plan(&tp);
}

/* ------------------------------------------------------------------ counters */

static void test_counter_layout(void **state) {
    (void)state;
    /* Families, as [base, base + size): disjoint, AG below 64, RS_CREDIT last. */
    const int fam[][2] = {
        {TIDE_CTR_AG_READY, 1},
        {TIDE_CTR_AG_LANDED, 1},
        {TIDE_CTR_AG_CALLER_DONE, 1},
        {TIDE_CTR_AG_CE_DONE, 1},
        {TIDE_CTR_AG_ARRIVED, TIDE_CTR_AG_MAX_ROUNDS},
        {TIDE_CTR_AG_CREDIT, TIDE_CTR_AG_MAX_ROUNDS},
        {TIDE_CTR_RS_STAGED, 1},
        {TIDE_CTR_RS_PUSHED, 1},
        {TIDE_CTR_RS_SUMMED, 1},
        {TIDE_CTR_RS_SENT, 1},
        {TIDE_CTR_RS_SPARE_USED, 1},
        {TIDE_CTR_RS_ARRIVED, TIDE_CTR_RS_MAX_GENERATIONS},
        {TIDE_CTR_RS_NODE_ARRIVED, TIDE_CTR_RS_MAX_GENERATIONS},
        {TIDE_CTR_RS_NODE_LANDED, TIDE_CTR_RS_MAX_GENERATIONS},
        {TIDE_CTR_RS_STG_CREDIT, 8},
    };
    int n = (int)(sizeof(fam) / sizeof(fam[0]));
    for (int i = 0; i < n; ++i) {
        assert_true(fam[i][0] + fam[i][1] <= TIDE_CTR_RS_CREDIT);
        bool ag = i < 6;
        if (ag)
            assert_true(fam[i][0] + fam[i][1] <= 64);
        else
            assert_true(fam[i][0] >= 64);
        for (int j = 0; j < i; ++j)
            assert_true(fam[i][0] >= fam[j][0] + fam[j][1] || fam[j][0] >= fam[i][0] + fam[i][1]);
    }
    /* Bruck rounds of the largest M fit. */
    int r = 0;
    while ((1 << r) < TIDE_MAX_NODES)
        ++r;
    assert_true(r <= TIDE_CTR_AG_MAX_ROUNDS);

    /* The largest M that fits compiles; one more node needs more counters than the arena has. */
    int fit = TIDE_ARENA_SIGNAL_SLOTS - TIDE_CTR_RS_CREDIT;
    test_plan_t tp;
    make_plan(fit, 1, 1, false, &tp);
    assert_int_equal(tide_ctr_count(&tp.plan), TIDE_ARENA_SIGNAL_SLOTS);
    assert_true(tide_ctr_fits(&tp.plan));
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS, tide_program_compile_ag(&tp.plan, &prog));
    tide_program_free(&prog);
    free_plan(&tp);
    make_plan(fit + 1, 1, 1, false, &tp);
    assert_false(tide_ctr_fits(&tp.plan));
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_program_compile_ag(&tp.plan, &prog));
    free_plan(&tp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ag_programs),
        cmocka_unit_test(test_ag_strided),
        cmocka_unit_test(test_inc_check_catches_drift),
        cmocka_unit_test(test_clone_is_deep),
        cmocka_unit_test(test_builders),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_counter_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
