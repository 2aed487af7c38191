/*
 * test_fabric_cpu.c - the CPU fabric and the public communicator / group / collective calls.
 *
 * Interpreter: small hand-built programs (copy + fused signal + epoch-form waits across ranks
 * and queues, RS banks, a missed deadline, an out-of-bounds reference).
 * End to end: TIDE-AG landings against host-built parameter-major tensors (memcmp), TIDE-RS
 * outputs against an fp64 reference, both in threads mode and with one process per rank;
 * fail-stop timeouts; argument errors.
 *
 * cmocka asserts must not run on worker threads (they longjmp), so workers record failures
 * in their rank's report and the main thread asserts on the reports.
 */
#include "test_util.h"

#include "core/checks.h"
#include "fabric/fabric.h"
#include "kernels/kernels.h"
#include "plan/plan.h"
#include "program/program.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 16

/* ------------------------------------------------------------------ helpers */

typedef struct {
    int failures;
    char first[768];
} report_t;

static void note(report_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(report_t *r, const char *fmt, ...) {
    if (r->failures++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->first, sizeof(r->first), fmt, ap);
        va_end(ap);
    }
}

static void assert_reports(const report_t *reps, int n) {
    for (int r = 0; r < n; ++r) {
        if (reps[r].failures)
            print_error("rank %d: %d failure(s), first: %s\n", r, reps[r].failures, reps[r].first);
        assert_int_equal(reps[r].failures, 0);
    }
}

typedef void (*rank_fn_t)(int rank, void *ctx);
typedef struct {
    int rank;
    rank_fn_t fn;
    void *ctx;
} thread_arg_t;

static void *thread_main(void *p) {
    thread_arg_t *a = p;
    a->fn(a->rank, a->ctx);
    return NULL;
}

static void run_threads(int n, rank_fn_t fn, void *ctx) {
    pthread_t th[MAX_RANKS];
    thread_arg_t args[MAX_RANKS];
    assert_true(n <= MAX_RANKS);
    for (int r = 0; r < n; ++r) {
        args[r] = (thread_arg_t){r, fn, ctx};
        assert_int_equal(pthread_create(&th[r], NULL, thread_main, &args[r]), 0);
    }
    for (int r = 0; r < n; ++r)
        pthread_join(th[r], NULL);
}

static uint64_t rng_state;
static uint64_t rng_next(void) {
    /* xorshift64*: deterministic inputs for every run. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static int rng_int(int lo, int hi) {
    return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}
/* Roughly standard normal (sum of uniforms), enough for tolerance tests. */
static double rng_normal(void) {
    double s = 0;
    for (int i = 0; i < 12; ++i)
        s += (double)(rng_next() >> 11) / 9007199254740992.0;
    return s - 6.0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ hand-built programs */

/* A world of N rank handles and their arenas for one plan, driven without core/. */
typedef struct {
    const struct tide_plan *plan;
    const tide_program_t *prog;
    struct tide_fabric_world *worlds[MAX_RANKS];
    struct tide_fabric_arena *arenas[MAX_RANKS];
    const void *shard[MAX_RANKS];
    uint64_t epoch;
    int slot;
    tide_result_t res[MAX_RANKS];
    char msg[MAX_RANKS][512];
    double seconds[MAX_RANKS];
} hand_t;

static void hand_register(int rank, void *ctx) {
    hand_t *h = ctx;
    h->res[rank] = tide_fabric_cpu_ops.arena_create(h->worlds[rank], h->plan->arena.total_bytes, 42,
                                                    &h->arenas[rank]);
}

static void hand_execute(int rank, void *ctx) {
    hand_t *h = ctx;
    tide_binding_t b = {0};
    b.plan = h->plan;
    b.arena = h->arenas[rank];
    b.rank = rank;
    b.slot = h->slot;
    b.epoch = h->epoch;
    b.shard = h->shard[rank];
    double t0 = now_s();
    h->res[rank] = tide_fabric_cpu_ops.execute(h->arenas[rank], h->prog, &b, NULL);
    h->seconds[rank] = now_s() - t0;
    snprintf(h->msg[rank], sizeof(h->msg[rank]), "%s", tide_get_last_error());
}

static void hand_deregister(int rank, void *ctx) {
    hand_t *h = ctx;
    h->res[rank] = tide_fabric_cpu_ops.arena_destroy(h->arenas[rank]);
}

static tide_plan_t small_plan(int m, int l, uint64_t dim0, uint64_t inner) {
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    tide_param_shape_t shape = {dim0, inner};
    tide_group_desc_t g = {1, &shape, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32};
    tide_plan_t plan = NULL;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&cfg, &g, &plan));
    return plan;
}

static void hand_open(hand_t *h, const struct tide_plan *plan, const tide_program_t *prog) {
    memset(h, 0, sizeof(*h));
    h->plan = plan;
    h->prog = prog;
    int n = plan->topo.ranks;
    assert_tide(TIDE_SUCCESS, tide_fabric_cpu_ops.world_create_all(
                                  plan->topo.nodes, plan->topo.gpus_per_node, h->worlds));
    run_threads(n, hand_register, h);
    for (int r = 0; r < n; ++r)
        assert_int_equal(h->res[r], TIDE_SUCCESS);
}

static void hand_close(hand_t *h) {
    int n = h->plan->topo.ranks;
    run_threads(n, hand_deregister, h);
    for (int r = 0; r < n; ++r) {
        assert_int_equal(h->res[r], TIDE_SUCCESS);
        assert_int_equal(tide_fabric_cpu_ops.world_destroy(h->worlds[r]), TIDE_SUCCESS);
    }
}

static void push(tide_program_t *p, int rank, tide_queue_t q, tide_op_t op) {
    assert_tide(TIDE_SUCCESS, tide_program_push(p, rank, q, &op));
}

static uint8_t *arena_region(hand_t *h, int rank, tide_region_t region) {
    return h->arenas[0]->bases[rank] + h->plan->arena.regions[region].offset;
}
static uint64_t counter_value(hand_t *h, int rank, int ctr) {
    return ((uint64_t *)(void *)arena_region(h, rank, TIDE_REGION_SIGNALS))[ctr];
}

/*
 * Two ranks, three calls.  Rank 0 puts its shard into rank 1's landing with a fused signal;
 * rank 1 waits (epoch form), copies it on into rank 0's landing with a fused signal; rank 0
 * waits and copies it into its spare bank (bank-dependent).  Rank 0's READY queue waits on a
 * counter its own NET queue raises later in queue order, so the interpreter must switch
 * queues; rank 1's DONE waits on rank 0's credit.
 */
static void test_interp_copy_signal_wait(void **state) {
    (void)state;
    tide_plan_t plan = small_plan(1, 2, 8, 4); /* S = 4 rows x 4 x 4 B = 64 B */
    const uint64_t s = plan->geom.shard_bytes;
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS,
                tide_program_init(plan, TIDE_COLL_ALL_GATHER, TIDE_RS_IN_PLACE, &prog));
    const uint64_t bank = plan->arena.regions[TIDE_REGION_SPARE].bytes / 2;
    assert_true(bank >= s);
    prog.bank_bytes[TIDE_REGION_SPARE] = bank;

    push(&prog, 0, TIDE_Q_READY, tide_op_wait(0, 10, 1, 1));
    push(&prog, 0, TIDE_Q_CE,
         tide_op_copy(tide_ref_landing(1, s), tide_ref_operand(TIDE_REF_SHARD, 0, 0), s, 1, 7));
    push(&prog, 0, TIDE_Q_CE, tide_op_wait(0, 8, 1, 1));
    tide_op_t to_spare =
        tide_op_copy(tide_ref_arena(0, TIDE_REGION_SPARE, 0), tide_ref_landing(0, s), s, -1, 0);
    to_spare.bank_dep = 1;
    push(&prog, 0, TIDE_Q_CE, to_spare);
    push(&prog, 0, TIDE_Q_CE, tide_op_signal(1, 9));
    push(&prog, 0, TIDE_Q_NET, tide_op_signal(0, 10));
    push(&prog, 1, TIDE_Q_CALLER, tide_op_wait(1, 7, 1, 1));
    push(&prog, 1, TIDE_Q_CALLER,
         tide_op_copy(tide_ref_landing(0, s), tide_ref_landing(1, s), s, 0, 8));
    push(&prog, 1, TIDE_Q_DONE, tide_op_wait(1, 9, 1, 1));

    hand_t h;
    hand_open(&h, plan, &prog);
    /* Arenas start zeroed. */
    for (int r = 0; r < 2; ++r)
        for (uint64_t i = 0; i < plan->arena.total_bytes; ++i)
            if (h.arenas[0]->bases[r][i] != 0)
                fail_msg("rank %d arena byte %lu not zero", r, (unsigned long)i);

    uint8_t shards[3][64];
    for (int e = 0; e < 3; ++e) {
        for (uint64_t i = 0; i < s; ++i)
            shards[e][i] = (uint8_t)(17 * e + i + 1);
        h.epoch = (uint64_t)e;
        h.slot = e % 2;
        h.shard[0] = shards[e];
        h.shard[1] = NULL; /* rank 1 reads no shard: an unbound operand is never touched */
        run_threads(2, hand_execute, &h);
        for (int r = 0; r < 2; ++r) {
            if (h.res[r] != TIDE_SUCCESS) fail_msg("epoch %d rank %d: %s", e, r, h.msg[r]);
        }
        tide_region_t land = e % 2 ? TIDE_REGION_LANDING1 : TIDE_REGION_LANDING0;
        assert_memory_equal(arena_region(&h, 1, land) + s, shards[e], s);
        assert_memory_equal(arena_region(&h, 0, land) + s, shards[e], s);
        assert_memory_equal(arena_region(&h, 0, TIDE_REGION_SPARE) + (uint64_t)(e % 2) * bank,
                            shards[e], s);
        if (e >= 1) /* the other bank still holds the previous call's copy */
            assert_memory_equal(arena_region(&h, 0, TIDE_REGION_SPARE) +
                                    (uint64_t)((e + 1) % 2) * bank,
                                shards[e - 1], s);
        assert_int_equal(counter_value(&h, 1, 7), e + 1);
        assert_int_equal(counter_value(&h, 0, 8), e + 1);
        assert_int_equal(counter_value(&h, 0, 10), e + 1);
    }
    hand_close(&h);
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

/* A wait nobody satisfies fails stop within the deadline, naming rank, queue, op, counter. */
static void test_interp_deadline(void **state) {
    (void)state;
    tide_plan_t plan = small_plan(1, 1, 4, 4);
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS,
                tide_program_init(plan, TIDE_COLL_ALL_GATHER, TIDE_RS_IN_PLACE, &prog));
    push(&prog, 0, TIDE_Q_CALLER, tide_op_wait(0, 3, 1, 2)); /* only one signal ever comes */
    push(&prog, 0, TIDE_Q_CE, tide_op_signal(0, 3));
    push(&prog, 0, TIDE_Q_CE, tide_op_wait(0, 7, 1, 1)); /* never signalled */

    hand_t h;
    hand_open(&h, plan, &prog);
    setenv("TIDE_TIMEOUT_MS", "300", 1);
    hand_execute(0, &h);
    unsetenv("TIDE_TIMEOUT_MS");
    assert_int_equal(h.res[0], TIDE_ERR_TIMEOUT);
    assert_true(h.seconds[0] >= 0.29);
    assert_true(h.seconds[0] < 5.0);
    const char *m = h.msg[0];
    assert_non_null(strstr(m, "rank 0 queue caller op 0 (wait)"));
    assert_non_null(strstr(m, "counter 3 = 1, target 2"));
    assert_non_null(strstr(m, "queue ce op 1 counter 7 = 0 < 1"));
    hand_close(&h);
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

/* A reference past its region is refused before any byte moves. */
static void test_interp_bounds(void **state) {
    (void)state;
    tide_plan_t plan = small_plan(1, 1, 4, 4);
    const uint64_t ns = plan->geom.group_bytes;
    tide_program_t prog;
    assert_tide(TIDE_SUCCESS,
                tide_program_init(plan, TIDE_COLL_ALL_GATHER, TIDE_RS_IN_PLACE, &prog));
    push(&prog, 0, TIDE_Q_CE,
         tide_op_copy(tide_ref_landing(0, 8), tide_ref_arena(0, TIDE_REGION_LANDING1, 0), ns, -1,
                      0));
    hand_t h;
    hand_open(&h, plan, &prog);
    memset(arena_region(&h, 0, TIDE_REGION_LANDING1), 0xab, ns);
    hand_execute(0, &h);
    assert_int_equal(h.res[0], TIDE_ERR_INTERNAL);
    assert_non_null(strstr(h.msg[0], "rank 0 queue ce op 0 (copy): dst"));
    for (uint64_t i = 0; i < ns; ++i)
        assert_int_equal(arena_region(&h, 0, TIDE_REGION_LANDING0)[i], 0);
    hand_close(&h);
    tide_program_free(&prog);
    tide_plan_destroy(plan);
}

/* ------------------------------------------------------------------ group fixtures */

/* A random group: P params with D_p often not divisible by N (padding rows). */
typedef struct {
    int m, l, n;
    tide_config_t cfg;
    tide_param_shape_t shapes[4];
    tide_group_desc_t desc;
    tide_plan_t plan; /* host copy for geometry */
} group_case_t;

static void case_init(group_case_t *c, int m, int l, tide_dtype_t ag, tide_dtype_t grad,
                      tide_dtype_t shard, tide_rs_mode_t mode) {
    memset(c, 0, sizeof(*c));
    c->m = m;
    c->l = l;
    c->n = m * l;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    cfg.mode = mode;
    c->cfg = cfg;
    int p = rng_int(1, 4);
    for (int i = 0; i < p; ++i) {
        c->shapes[i].dim0 = (uint64_t)rng_int(1, 3 * c->n + 2);
        c->shapes[i].inner = (uint64_t)rng_int(1, 6);
    }
    c->desc = (tide_group_desc_t){p, c->shapes, ag, grad, shard};
    assert_tide(TIDE_SUCCESS, tide_plan_create(&c->cfg, &c->desc, &c->plan));
}

static void case_free(group_case_t *c) {
    tide_plan_destroy(c->plan);
}

/* A rank's group of the case, or NULL after noting why. */
static tide_group_t case_register(const group_case_t *c, tide_comm_t comm, report_t *rep) {
    tide_group_t grp = NULL;
    if (tide_group_register(comm, &c->cfg, &c->desc, &grp) != TIDE_SUCCESS) {
        note(rep, "register: %s", tide_get_last_error());
        return NULL;
    }
    return grp;
}

static void case_deregister(tide_group_t grp, report_t *rep) {
    if (tide_group_deregister(grp) != TIDE_SUCCESS)
        note(rep, "deregister: %s", tide_get_last_error());
}

/* The case's world on the CPU fabric, fn(rank, job) on a thread per rank, then every rank's
 * report asserted clean on this thread. */
static void case_run(const group_case_t *c, tide_comm_t *comms, rank_fn_t fn, void *job,
                     const report_t *reps) {
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, c->m, c->l, comms));
    run_threads(c->n, fn, job);
    for (int r = 0; r < c->n; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(comms[r]));
    assert_reports(reps, c->n);
}

/* ------------------------------------------------------------------ TIDE-AG end to end */

#define AG_CALLS 3

typedef struct {
    group_case_t *c;
    tide_comm_t comms[MAX_RANKS];
    uint8_t *shards[AG_CALLS][MAX_RANKS]; /* packed shards (fp32 master with a cast) */
    uint8_t *expected[AG_CALLS];          /* the landing every rank must hold */
    bool resident;                        /* call with shard = NULL after copying in */
    report_t rep[MAX_RANKS];
} ag_job_t;

/* Build unsharded parameters for each call, the packed shards, and the expected landing. */
static void ag_inputs(ag_job_t *j) {
    const tide_geom_t *g = &j->c->plan->geom;
    const int n = j->c->n;
    const size_t item = g->ag_item, sitem = g->cast ? 4 : item;
    for (int call = 0; call < AG_CALLS; ++call) {
        j->expected[call] = calloc(1, g->group_bytes);
        for (int r = 0; r < n; ++r)
            j->shards[call][r] = calloc(1, g->cast ? g->fp32_shard_bytes : g->shard_bytes);
        for (int p = 0; p < g->num_params; ++p) {
            const tide_geom_param_t *q = &g->params[p];
            for (uint64_t row = 0; row < q->dim0; ++row) {
                int r = (int)(row / q->rows);
                uint64_t local = row % q->rows;
                for (uint64_t k = 0; k < q->inner; ++k) {
                    uint8_t *dst =
                        j->expected[call] + q->offset * (uint64_t)n + (row * q->inner + k) * item;
                    uint8_t *src = j->shards[call][r] + (q->offset / item) * sitem +
                                   (local * q->inner + k) * sitem;
                    if (g->cast) {
                        float v = (float)rng_normal();
                        memcpy(src, &v, 4);
                        uint16_t b = tide_float_to_bf16(v);
                        memcpy(dst, &b, 2);
                    } else {
                        for (size_t i = 0; i < item; ++i)
                            dst[i] = src[i] = (uint8_t)rng_next();
                    }
                }
            }
        }
    }
}

static void ag_free(ag_job_t *j) {
    for (int call = 0; call < AG_CALLS; ++call) {
        free(j->expected[call]);
        for (int r = 0; r < j->c->n; ++r)
            free(j->shards[call][r]);
    }
}

/* One rank's part: register, three calls (slots 0, 1, 0), check each landing, deregister. */
static void ag_rank(int rank, void *ctx) {
    ag_job_t *j = ctx;
    report_t *rep = &j->rep[rank];
    const tide_geom_t *g = &j->c->plan->geom;
    tide_group_t grp = case_register(j->c, j->comms[rank], rep);
    if (grp == NULL) return;
    for (int call = 0; call < AG_CALLS; ++call) {
        const int slot = call % 2;
        void *land = NULL, *resident = NULL;
        if (tide_group_landing(grp, slot, &land) != TIDE_SUCCESS) note(rep, "landing");
        const void *shard = j->shards[call][rank];
        if (j->resident) {
            if (tide_group_resident(grp, &resident) != TIDE_SUCCESS)
                note(rep, "resident");
            else
                memcpy(resident, shard, g->shard_bytes);
            shard = NULL;
        }
        if (tide_all_gather(grp, shard, slot, NULL) != TIDE_SUCCESS) {
            note(rep, "call %d: %s", call, tide_get_last_error());
            break;
        }
        if (land != NULL && memcmp(land, j->expected[call], g->group_bytes) != 0) {
            uint64_t i = 0;
            while (((uint8_t *)land)[i] == j->expected[call][i])
                ++i;
            note(rep, "call %d slot %d: landing differs first at byte %llu of %llu", call, slot,
                 (unsigned long long)i, (unsigned long long)g->group_bytes);
        }
    }
    case_deregister(grp, rep);
}

static void ag_case(int m, int l, tide_dtype_t ag, tide_dtype_t shard, bool resident) {
    group_case_t c;
    case_init(&c, m, l, ag, TIDE_DTYPE_FP32, shard, TIDE_RS_IN_PLACE);
    ag_job_t j;
    memset(&j, 0, sizeof(j));
    j.c = &c;
    j.resident = resident;
    ag_inputs(&j);
    case_run(&c, j.comms, ag_rank, &j, j.rep);
    print_message("AG M=%d L=%d P=%d %s%s: ok\n", m, l, c.desc.num_params,
                  shard != ag ? "cast" : (ag == TIDE_DTYPE_BF16 ? "bf16" : "fp32"),
                  resident ? " resident" : "");
    ag_free(&j);
    case_free(&c);
}

static void test_ag_threads(void **state) {
    (void)state;
    rng_state = 0x1234567;
    static const int topo[][2] = {{1, 1}, {1, 4}, {2, 2}, {2, 4}, {3, 2}, {5, 2}};
    for (size_t t = 0; t < sizeof(topo) / sizeof(topo[0]); ++t) {
        ag_case(topo[t][0], topo[t][1], TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, false);
        ag_case(topo[t][0], topo[t][1], TIDE_DTYPE_FP32, TIDE_DTYPE_FP32, t % 2 == 0);
    }
    /* M = 9: round 2 forwards a run of 4 slots, which lands with strided 2D copies. */
    ag_case(9, 1, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, false);
    /* Mixed precision: fp32 master shards cast to bf16 on the way. */
    ag_case(1, 2, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, false);
    ag_case(3, 2, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, false);
}

/* ------------------------------------------------------------------ TIDE-RS end to end */

typedef struct {
    group_case_t *c;
    tide_comm_t comms[MAX_RANKS];
    bool integer; /* small integers: sums are exact */
    float alpha;
    void **grads[MAX_RANKS]; /* [rank][p] */
    double *ref[MAX_RANKS];  /* alpha sum_u G^(u), per rank's fp32 shard layout */
    report_t rep[MAX_RANKS];
} rs_job_t;

static void rs_inputs(rs_job_t *j) {
    const tide_geom_t *g = &j->c->plan->geom;
    const int n = j->c->n, np = g->num_params;
    for (int u = 0; u < n; ++u) {
        j->grads[u] = calloc((size_t)np, sizeof(void *));
        j->ref[u] = calloc(g->shard_elems, sizeof(double));
    }
    for (int p = 0; p < np; ++p) {
        const tide_geom_param_t *q = &g->params[p];
        const uint64_t elems = q->dim0 * q->inner;
        for (int u = 0; u < n; ++u) {
            j->grads[u][p] = malloc(elems * g->grad_item);
            for (uint64_t e = 0; e < elems; ++e) {
                double v = j->integer ? (double)rng_int(-8, 8) : rng_normal();
                if (g->grad_item == 2) {
                    uint16_t b = tide_float_to_bf16((float)v);
                    ((uint16_t *)j->grads[u][p])[e] = b;
                    v = tide_bf16_to_float(b);
                } else {
                    ((float *)j->grads[u][p])[e] = (float)v;
                    v = (float)v;
                }
                /* Element (row, k) lands on rank row / R_p at local row row % R_p. */
                uint64_t row = e / q->inner, k = e % q->inner;
                int owner = (int)(row / q->rows);
                j->ref[owner][q->elem_offset + (row % q->rows) * q->inner + k] +=
                    (double)j->alpha * v;
            }
        }
    }
}

static void rs_free(rs_job_t *j) {
    for (int u = 0; u < j->c->n; ++u) {
        for (int p = 0; p < j->c->desc.num_params; ++p)
            free(j->grads[u][p]);
        free(j->grads[u]);
        free(j->ref[u]);
    }
}

/* Compare out with scale * ref + base (fp64), exact for integer inputs. */
static void rs_check(rs_job_t *j, report_t *rep, int rank, const char *what, const float *out,
                     double scale) {
    const tide_geom_t *g = &j->c->plan->geom;
    double inf = 0;
    for (uint64_t e = 0; e < g->shard_elems; ++e)
        inf = fmax(inf, fabs(scale * j->ref[rank][e]));
    const double tol = j->integer ? 0.0 : 1e-5 * fmax(1.0, inf);
    for (uint64_t e = 0; e < g->shard_elems; ++e) {
        double want = scale * j->ref[rank][e];
        double got = out[e];
        bool ok = j->integer ? got == (double)(float)want : fabs(got - want) <= tol;
        if (!ok) {
            note(rep, "%s: element %llu = %.9g, reference %.9g (tol %.3g)", what,
                 (unsigned long long)e, got, want, tol);
            return;
        }
    }
}

/* Padding rows of the output (rows past D_p) must read as zero. */
static void rs_check_padding(rs_job_t *j, report_t *rep, int rank, const float *out) {
    const tide_geom_t *g = &j->c->plan->geom;
    for (int p = 0; p < g->num_params; ++p) {
        const tide_geom_param_t *q = &g->params[p];
        for (uint64_t i = 0; i < q->rows; ++i) {
            if ((uint64_t)rank * q->rows + i < q->dim0) continue;
            for (uint64_t k = 0; k < q->inner; ++k)
                if (out[q->elem_offset + i * q->inner + k] != 0.0f) {
                    note(rep, "param %d padding row %llu not zero", p, (unsigned long long)i);
                    return;
                }
        }
    }
}

/* Calls: In-Place, Slot-Reuse (bitwise equal to In-Place), In-Place accumulating (2x). */
static void rs_rank(int rank, void *ctx) {
    rs_job_t *j = ctx;
    report_t *rep = &j->rep[rank];
    const tide_geom_t *g = &j->c->plan->geom;
    tide_group_t grp = case_register(j->c, j->comms[rank], rep);
    if (grp == NULL) return;
    float *out = malloc(g->fp32_shard_bytes), *out2 = malloc(g->fp32_shard_bytes);
    const void *const *grads = (const void *const *)j->grads[rank];
    for (uint64_t e = 0; e < g->shard_elems; ++e)
        out[e] = out2[e] = 777.0f; /* stale */
    if (tide_reduce_scatter(grp, grads, out, j->alpha, 0, TIDE_RS_IN_PLACE, NULL) != TIDE_SUCCESS)
        note(rep, "in-place: %s", tide_get_last_error());
    else
        rs_check(j, rep, rank, "in-place", out, 1.0);
    rs_check_padding(j, rep, rank, out);
    if (tide_reduce_scatter(grp, grads, out2, j->alpha, 0, TIDE_RS_SLOT_REUSE, NULL) !=
        TIDE_SUCCESS)
        note(rep, "slot-reuse: %s", tide_get_last_error());
    else if (memcmp(out, out2, g->fp32_shard_bytes) != 0)
        note(rep, "slot-reuse output differs bitwise from in-place");
    if (tide_reduce_scatter(grp, grads, out, j->alpha, 1, TIDE_RS_IN_PLACE, NULL) != TIDE_SUCCESS)
        note(rep, "accumulate: %s", tide_get_last_error());
    else
        rs_check(j, rep, rank, "accumulate", out, 2.0);
    rs_check_padding(j, rep, rank, out);
    free(out);
    free(out2);
    case_deregister(grp, rep);
}

static void rs_case(int m, int l, tide_dtype_t grad, tide_rs_mode_t mode, bool integer) {
    group_case_t c;
    case_init(&c, m, l, TIDE_DTYPE_BF16, grad, TIDE_DTYPE_BF16, mode);
    rs_job_t j;
    memset(&j, 0, sizeof(j));
    j.c = &c;
    j.integer = integer;
    j.alpha = integer ? 1.0f : tide_alpha_avg(c.n);
    rs_inputs(&j);
    case_run(&c, j.comms, rs_rank, &j, j.rep);
    print_message("RS M=%d L=%d P=%d %s %s%s: ok\n", m, l, c.desc.num_params,
                  grad == TIDE_DTYPE_BF16 ? "bf16" : "fp32",
                  mode == TIDE_RS_IN_PLACE ? "in-place" : "slot-reuse", integer ? " int" : "");
    rs_free(&j);
    case_free(&c);
}

static void test_rs_threads(void **state) {
    (void)state;
    rng_state = 0x7654321;
    static const int topo[][2] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {3, 2}, {2, 4}, {4, 2}};
    for (size_t t = 0; t < sizeof(topo) / sizeof(topo[0]); ++t) {
        const tide_rs_mode_t mode = t % 2 ? TIDE_RS_SLOT_REUSE : TIDE_RS_IN_PLACE;
        rs_case(topo[t][0], topo[t][1], TIDE_DTYPE_BF16, mode, false);
        rs_case(topo[t][0], topo[t][1], TIDE_DTYPE_FP32, mode, true);
    }
    rs_case(3, 2, TIDE_DTYPE_FP32, TIDE_RS_SLOT_REUSE, false);
    rs_case(2, 2, TIDE_DTYPE_BF16, TIDE_RS_IN_PLACE, true);
}

/* ------------------------------------------------------------------ process mode */

/* Each child is one rank: join by name, AG (slots 0, 1, 0) and RS in both modes, then exit
 * with the number of failures.  The parent built every input before forking. */
static void test_processes(void **state) {
    (void)state;
    rng_state = 0xabcdef;
    group_case_t c;
    case_init(&c, 2, 2, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, TIDE_DTYPE_BF16, TIDE_RS_IN_PLACE);
    ag_job_t ag;
    memset(&ag, 0, sizeof(ag));
    ag.c = &c;
    ag_inputs(&ag);
    rs_job_t rs;
    memset(&rs, 0, sizeof(rs));
    rs.c = &c;
    rs.integer = true;
    rs.alpha = 1.0f;
    rs_inputs(&rs);
    char name[64];
    snprintf(name, sizeof(name), "tide-test-%ld", (long)getpid());

    pid_t kids[MAX_RANKS];
    for (int r = 0; r < c.n; ++r) {
        fflush(NULL);
        kids[r] = fork();
        assert_true(kids[r] >= 0);
        if (kids[r] != 0) continue;
        tide_comm_t comm;
        int fails = 0;
        if (tide_comm_init_rank(TIDE_FABRIC_CPU, c.m, c.l, r, name, &comm) != TIDE_SUCCESS) {
            fprintf(stderr, "rank %d: init: %s\n", r, tide_get_last_error());
            _exit(100);
        }
        ag.comms[r] = comm;
        rs.comms[r] = comm;
        /* A second group stays registered throughout: arenas of several groups coexist. */
        tide_group_t spare;
        if (tide_group_register(comm, &c.cfg, &c.desc, &spare) != TIDE_SUCCESS) _exit(101);
        ag_rank(r, &ag);
        rs_rank(r, &rs);
        if (tide_comm_destroy(comm) != TIDE_ERR_INVALID_ARGUMENT) ++fails; /* spare is live */
        if (tide_group_deregister(spare) != TIDE_SUCCESS) ++fails;
        fails += ag.rep[r].failures + rs.rep[r].failures;
        if (fails) fprintf(stderr, "rank %d: %s%s\n", r, ag.rep[r].first, rs.rep[r].first);
        if (tide_comm_destroy(comm) != TIDE_SUCCESS) ++fails;
        _exit(fails > 99 ? 99 : fails);
    }
    double deadline = now_s() + 60.0;
    int done = 0, statuses[MAX_RANKS];
    bool reaped[MAX_RANKS] = {false};
    while (done < c.n && now_s() < deadline) {
        for (int r = 0; r < c.n; ++r) {
            if (reaped[r]) continue;
            if (waitpid(kids[r], &statuses[r], WNOHANG) == kids[r]) {
                reaped[r] = true;
                ++done;
            }
        }
        usleep(10000);
    }
    for (int r = 0; r < c.n; ++r)
        if (!reaped[r]) {
            kill(kids[r], SIGKILL);
            waitpid(kids[r], &statuses[r], 0);
            fail_msg("rank %d process did not finish", r);
        }
    for (int r = 0; r < c.n; ++r) {
        assert_true(WIFEXITED(statuses[r]));
        assert_int_equal(WEXITSTATUS(statuses[r]), 0);
    }
    /* Every shm object was unlinked. */
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm/tide.%s", name);
    assert_int_equal(access(path, F_OK), -1);
    for (int seq = 0; seq < 3; ++seq) {
        snprintf(path, sizeof(path), "/dev/shm/tide.%s.g%d", name, seq);
        assert_int_equal(access(path, F_OK), -1);
    }
    ag_free(&ag);
    rs_free(&rs);
    case_free(&c);
}

/* ------------------------------------------------------------------ fail-stop */

typedef struct {
    group_case_t *c;
    tide_comm_t comms[MAX_RANKS];
    pthread_barrier_t barrier;
    int absent; /* the rank that never calls */
    tide_result_t res[MAX_RANKS], again[MAX_RANKS];
    double seconds[MAX_RANKS];
    char msg[MAX_RANKS][600];
    report_t rep[MAX_RANKS];
} timeout_job_t;

static void timeout_rank(int rank, void *ctx) {
    timeout_job_t *j = ctx;
    const tide_geom_t *g = &j->c->plan->geom;
    tide_group_t grp = case_register(j->c, j->comms[rank], &j->rep[rank]);
    if (grp == NULL) return;
    /* The environment changes only while every thread waits here. */
    pthread_barrier_wait(&j->barrier);
    if (rank == 0) setenv("TIDE_TIMEOUT_MS", "300", 1);
    pthread_barrier_wait(&j->barrier);
    uint8_t *shard = calloc(1, g->shard_bytes);
    if (rank != j->absent) {
        double t0 = now_s();
        j->res[rank] = tide_all_gather(grp, shard, 0, NULL);
        j->seconds[rank] = now_s() - t0;
        snprintf(j->msg[rank], sizeof(j->msg[rank]), "%s", tide_get_last_error());
        j->again[rank] = tide_all_gather(grp, shard, 1, NULL);
    }
    pthread_barrier_wait(&j->barrier);
    if (rank == 0) unsetenv("TIDE_TIMEOUT_MS");
    pthread_barrier_wait(&j->barrier);
    free(shard);
    case_deregister(grp, &j->rep[rank]);
}

static void test_timeout(void **state) {
    (void)state;
    rng_state = 99;
    group_case_t c;
    case_init(&c, 2, 2, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_RS_IN_PLACE);
    timeout_job_t j;
    memset(&j, 0, sizeof(j));
    j.c = &c;
    j.absent = 1;
    pthread_barrier_init(&j.barrier, NULL, (unsigned)c.n);
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 2, 2, j.comms));
    run_threads(c.n, timeout_rank, &j);
    pthread_barrier_destroy(&j.barrier);
    for (int r = 0; r < c.n; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(j.comms[r]));
    assert_reports(j.rep, c.n);
    for (int r = 0; r < c.n; ++r) {
        if (r == j.absent) continue;
        if (j.res[r] != TIDE_ERR_TIMEOUT) fail_msg("rank %d: %d: %s", r, j.res[r], j.msg[r]);
        assert_true(j.seconds[r] >= 0.29 && j.seconds[r] < 10.0);
        /* The per-call agreement check is the first to wait for the absent rank. */
        char want[96];
        snprintf(want, sizeof(want), "rank %d: all_gather call 0: rank %d did not make its call",
                 r, j.absent);
        if (strstr(j.msg[r], want) == NULL) fail_msg("rank %d: %s", r, j.msg[r]);
        assert_non_null(strstr(j.msg[r], "each rank needs its own thread or process"));
        /* Poisoned: later calls fail at once. */
        assert_int_equal(j.again[r], TIDE_ERR_FABRIC);
    }
    case_free(&c);
}

/* A process-mode job whose second rank never joins: the first fails stop, leaves no shm. */
static void test_join_timeout(void **state) {
    (void)state;
    char name[64], path[128];
    snprintf(name, sizeof(name), "tide-join-%ld", (long)getpid());
    snprintf(path, sizeof(path), "/dev/shm/tide.%s", name);
    tide_comm_t comm = NULL;
    setenv("TIDE_TIMEOUT_MS", "200", 1);
    double t0 = now_s();
    assert_tide(TIDE_ERR_TIMEOUT, tide_comm_init_rank(TIDE_FABRIC_CPU, 1, 2, 0, name, &comm));
    double dt = now_s() - t0;
    unsetenv("TIDE_TIMEOUT_MS");
    assert_null(comm);
    assert_true(dt >= 0.19 && dt < 5.0);
    assert_non_null(strstr(tide_get_last_error(), "only 1 of 2 ranks arrived"));
    assert_int_equal(access(path, F_OK), -1);
}

/* ------------------------------------------------------------------ arguments */

static void test_bad_arguments(void **state) {
    (void)state;
    tide_comm_t comms[8];
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 1, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_all(TIDE_FABRIC_CPU, 0, 1, comms));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 9, comms));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_all((tide_fabric_kind_t)7, 1, 1, comms));
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_comm_init_all(TIDE_FABRIC_NCCL, 1, 1, comms));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_comm_init_rank(TIDE_FABRIC_CPU, 1, 2, 2, "job", comms));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_comm_init_rank(TIDE_FABRIC_CPU, 1, 2, 0, "a/b", comms));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_comm_init_rank(TIDE_FABRIC_CPU, 1, 2, 0, "", comms));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_comm_init_rank(TIDE_FABRIC_CPU, 1, 2, 0, NULL, comms));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_destroy(NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_rank(NULL, NULL));

    /* One rank (M = L = 1): collective calls complete on the main thread. */
    rng_state = 5;
    group_case_t c;
    case_init(&c, 1, 1, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, TIDE_DTYPE_BF16, TIDE_RS_IN_PLACE);
    tide_comm_t comm;
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 1, &comm));
    int rank = -1;
    assert_tide(TIDE_SUCCESS, tide_comm_rank(comm, &rank));
    assert_int_equal(rank, 0);
    tide_group_t grp = NULL;
    tide_config_t wrong = c.cfg;
    wrong.gpus_per_node = 2;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_register(comm, &wrong, &c.desc, &grp));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_register(comm, NULL, &c.desc, &grp));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_register(comm, &c.cfg, &c.desc, NULL));
    assert_null(grp);
    assert_tide(TIDE_SUCCESS, tide_group_register(comm, &c.cfg, &c.desc, &grp));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_destroy(comm)); /* group still live */

    const tide_geom_t *g = &c.plan->geom;
    uint8_t *shard = calloc(1, g->shard_bytes);
    float *out = calloc(1, g->fp32_shard_bytes);
    void *grads[4] = {NULL, NULL, NULL, NULL};
    for (int p = 0; p < g->num_params; ++p)
        grads[p] = calloc(g->params[p].dim0 * g->params[p].inner, g->grad_item);
    const void *const *cg = (const void *const *)grads;
    void *ptr = NULL;
    tide_plan_t plan = NULL;

    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_all_gather(NULL, shard, 0, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_all_gather(grp, shard, 2, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_all_gather(grp, shard, -1, NULL));
    /* A stream on the CPU fabric is refused before anything runs: not poisoned. */
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_all_gather(grp, shard, 0, (void *)shard));
    assert_tide(TIDE_SUCCESS, tide_all_gather(grp, shard, 0, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_reduce_scatter(NULL, cg, out, 1, 0, 0, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_reduce_scatter(grp, NULL, out, 1, 0, 0, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_reduce_scatter(grp, cg, NULL, 1, 0, 0, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_reduce_scatter(grp, cg, out, 1, 0, (tide_rs_mode_t)2, NULL));
    void *first = grads[0];
    grads[0] = NULL;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_reduce_scatter(grp, cg, out, 1, 0, 0, NULL));
    grads[0] = first;
    /* alpha must be a finite normal fp32 number: refused before anything runs. */
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_reduce_scatter(grp, cg, out, NAN, 0, TIDE_RS_SLOT_REUSE, NULL));
    assert_tide(TIDE_SUCCESS, tide_reduce_scatter(grp, cg, out, 1, 0, TIDE_RS_SLOT_REUSE, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_landing(NULL, 0, &ptr));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_landing(grp, 3, &ptr));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_landing(grp, 0, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_resident(NULL, &ptr));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_plan(grp, NULL));
    assert_tide(TIDE_SUCCESS, tide_group_plan(grp, &plan));
    assert_int_equal(plan->geom.shard_bytes, g->shard_bytes);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_deregister(NULL));
    assert_tide(TIDE_SUCCESS, tide_group_deregister(grp));
    assert_tide(TIDE_SUCCESS, tide_comm_destroy(comm));

    /* A casting group has no resident region. */
    case_free(&c);
    case_init(&c, 1, 1, TIDE_DTYPE_BF16, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32, TIDE_RS_IN_PLACE);
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 1, &comm));
    assert_tide(TIDE_SUCCESS, tide_group_register(comm, &c.cfg, &c.desc, &grp));
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_group_resident(grp, &ptr));
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_all_gather(grp, NULL, 0, NULL));
    assert_tide(TIDE_SUCCESS, tide_group_deregister(grp));
    assert_tide(TIDE_SUCCESS, tide_comm_destroy(comm));

    for (int p = 0; p < 4; ++p)
        free(grads[p]);
    free(shard);
    free(out);
    case_free(&c);

    /* FSDP2's factors folded into alpha. */
    assert_true(tide_alpha_avg(4) == 0.25f);
    assert_true(isnan(tide_alpha_avg(0)));
    assert_true(tide_alpha_divide(2.0f, 4.0f) == 0.125f);
    assert_true(tide_alpha_divide(3.0f, 1.0f) == (float)(1.0 / 3.0));
}

/* Ranks that register different groups are told so, and nobody hangs. */
typedef struct {
    group_case_t *c[2];
    tide_comm_t comms[2];
    tide_result_t res[2];
} mismatch_job_t;

static void mismatch_rank(int rank, void *ctx) {
    mismatch_job_t *j = ctx;
    tide_group_t grp;
    j->res[rank] = tide_group_register(j->comms[rank], &j->c[rank]->cfg, &j->c[rank]->desc, &grp);
    if (j->res[rank] == TIDE_SUCCESS) tide_group_deregister(grp);
}

static void test_register_mismatch(void **state) {
    (void)state;
    group_case_t a, b;
    rng_state = 11;
    case_init(&a, 1, 2, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_RS_IN_PLACE);
    b = a;
    tide_param_shape_t shapes[4];
    memcpy(shapes, a.shapes, sizeof(shapes));
    shapes[0].inner += 1;
    b.desc.shapes = shapes;
    mismatch_job_t j = {{&a, &b}, {NULL, NULL}, {0, 0}};
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 2, j.comms));
    run_threads(2, mismatch_rank, &j);
    assert_int_equal(j.res[0], TIDE_ERR_INVALID_ARGUMENT);
    assert_int_equal(j.res[1], TIDE_ERR_INVALID_ARGUMENT);
    for (int r = 0; r < 2; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(j.comms[r]));
    case_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interp_copy_signal_wait),
        cmocka_unit_test(test_interp_deadline),
        cmocka_unit_test(test_interp_bounds),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_register_mismatch),
        cmocka_unit_test(test_ag_threads),
        cmocka_unit_test(test_rs_threads),
        cmocka_unit_test(test_processes),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_join_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
