/*
 * test_fabric_cpu_direct.c - the CPU fabric's direct mode (src/fabric/cpu/direct.c) against
 * its full emulation: the same script of calls, run once with TIDE_CPU_DIRECT=0 and once with
 * the default (every shortcut), must give the same bits.
 *
 * The data exposes rounding: gradients and initial outputs spread over 2^-40 .. 2^40, so any
 * change in which values are added, or in what order, changes some output bits; and every
 * seventh gradient element is -0.0f on all ranks, whose sign only the landing's +0.0f fixes.  Each
 * job registers one group and makes three all-gathers (slots 0, 1, 0, each landing compared byte
 * for byte with the gathered shards) and six reduce-scatters (In-Place and Slot-Reuse, with
 * and without accumulation, several alphas: both banks of both modes), at 1x8, 2x4, 4x2,
 * 3x2 (and multi-wave schedules), bf16 and fp32 gradients.  That direct mode really ran is
 * checked too: its sums read the peers' gradients in place, so nothing writes STAGING, which
 * the emulation fills.  On one node (M = 1) the default also runs the synchronisation
 * elision (program/sync_elide.h: every wait but STAGED left out, the output's padding zeroed
 * after the end join); a third run with TIDE_SYNC_ELIDE=0 must give the same bits, and the
 * fabric's count says which calls ran the elision (every reduce-scatter of the default run,
 * none of the others).
 */
#include "e2e_util.h"

#include "api/comm.h"
#include "fabric/cpu/cpu.h"
#include "kernels/kernels.h"
#include "program/compile_rs.h"
#include "program/direct.h"
#include "program/sync_elide.h"

#include <stdlib.h>
#include <string.h>

#define AG_CALLS 3
#define RS_CALLS 6

typedef struct {
    e2e_job_t j;
    tide_plan_t plan;
    bool direct;         /* the run expects direct mode */
    int staging_written; /* ranks whose STAGING region holds a non-zero byte after the calls */
    uint64_t elided;     /* calls of all ranks that ran the synchronisation elision */
    pthread_mutex_t lock;
} job_t;

static e2e_rng_t rng = {0x5eed1234u};

/* A value of either sign over 2^-40 .. 2^40. */
static float wide(void) {
    const double v = e2e_rng_normal(&rng);
    return (float)ldexp(v, e2e_rng_int(&rng, -40, 40));
}

static bool staging_has_data(const job_t *jb, tide_group_t grp) {
    const tide_region_info_t *st = &jb->plan->arena.regions[TIDE_REGION_STAGING];
    void *land = NULL;
    if (st->bytes == 0 || tide_group_landing(grp, 0, &land) != TIDE_SUCCESS) return false;
    const uint8_t *base =
        (const uint8_t *)land - jb->plan->arena.regions[TIDE_REGION_LANDING0].offset;
    for (uint64_t i = 0; i < st->bytes; ++i)
        if (base[st->offset + i] != 0) return true;
    return false;
}

static void rank_main(int rank, void *ctx) {
    job_t *jb = ctx;
    e2e_job_t *j = &jb->j;
    tide_group_t grp;
    if (tide_group_register(j->comms[rank], &j->cfg, &j->desc, &grp) != TIDE_SUCCESS) {
        e2e_note(&j->rep[rank], "register: %s", tide_get_last_error());
        return;
    }
    e2e_rank_ag(j, rank, grp);
    if (j->rep[rank].failures == 0) e2e_rank_rs(j, rank, grp);
    const bool staged = staging_has_data(jb, grp);
    pthread_mutex_lock(&jb->lock);
    jb->staging_written += staged;
    jb->elided += ((const tide_cpu_arena_t *)grp->arena)->elided_calls;
    pthread_mutex_unlock(&jb->lock);
    if (tide_group_deregister(grp) != TIDE_SUCCESS)
        e2e_note(&j->rep[rank], "deregister: %s", tide_get_last_error());
}

typedef struct {
    int m, l, wave;
    tide_dtype_t grad;
    tide_config_t cfg;
    tide_param_shape_t shapes[3];
    tide_plan_t plan;
    int n;
    void **grads[E2E_MAX_RANKS];
    float *init[E2E_MAX_RANKS];
    uint8_t *shards[AG_CALLS][E2E_MAX_RANKS];
    uint8_t *expected[AG_CALLS];
} inputs_t;

/* Shapes whose every landing a fused sum stores at M = 1 (so the elision applies). */
static const tide_param_shape_t fused_shapes[3] = {{64, 64}, {105, 9}, {3, 1}};

static void inputs_init(inputs_t *in, int m, int l, int wave, tide_dtype_t grad, bool fused) {
    memset(in, 0, sizeof(*in));
    in->m = m, in->l = l, in->wave = wave, in->grad = grad, in->n = m * l;
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    cfg.wave_width = wave;
    in->cfg = cfg;
    for (int p = 0; p < 3; ++p)
        in->shapes[p] = fused ? fused_shapes[p]
                              : (tide_param_shape_t){(uint64_t)e2e_rng_int(&rng, 1, 3 * in->n + 2),
                                                     (uint64_t)e2e_rng_int(&rng, 1, 9)};
    tide_group_desc_t desc = {3, in->shapes, TIDE_DTYPE_BF16, grad, TIDE_DTYPE_BF16};
    assert_tide(TIDE_SUCCESS, tide_plan_create(&in->cfg, &desc, &in->plan));
    const tide_geom_t *g = &in->plan->geom;
    for (int r = 0; r < in->n; ++r) {
        in->grads[r] = calloc(3, sizeof(void *));
        for (int p = 0; p < 3; ++p) {
            const uint64_t elems = in->shapes[p].dim0 * in->shapes[p].inner;
            in->grads[r][p] = malloc(elems * (grad == TIDE_DTYPE_BF16 ? 2 : 4));
            for (uint64_t e = 0; e < elems; ++e) {
                /* Some elements -0.0f on every rank: their sums are -0.0f, which a landing
                 * turns into +0.0f (kernels.h, plus_zero); a fused sum must too. */
                const float v = e % 7 == 3 ? -0.0f : wide();
                if (grad == TIDE_DTYPE_BF16)
                    ((uint16_t *)in->grads[r][p])[e] = tide_float_to_bf16(v);
                else
                    ((float *)in->grads[r][p])[e] = v;
            }
        }
        in->init[r] = malloc(g->fp32_shard_bytes);
        for (uint64_t e = 0; e < g->shard_elems; ++e)
            in->init[r][e] = wide();
    }
    /* All-gather: random bf16 shards; the landing is every rank's rows of each parameter. */
    const uint64_t item = g->ag_item;
    for (int call = 0; call < AG_CALLS; ++call) {
        in->expected[call] = calloc(1, g->group_bytes);
        for (int r = 0; r < in->n; ++r)
            in->shards[call][r] = calloc(1, g->shard_bytes);
        for (int p = 0; p < g->num_params; ++p) {
            const tide_geom_param_t *q = &g->params[p];
            for (uint64_t row = 0; row < q->dim0; ++row)
                for (uint64_t k = 0; k < q->inner; ++k) {
                    const int r = (int)(row / q->rows);
                    uint8_t *dst = in->expected[call] + q->offset * (uint64_t)in->n +
                                   (row * q->inner + k) * item;
                    uint8_t *src =
                        in->shards[call][r] + q->offset + ((row % q->rows) * q->inner + k) * item;
                    for (uint64_t i = 0; i < item; ++i)
                        dst[i] = src[i] = (uint8_t)e2e_rng_next(&rng);
                }
        }
    }
}

static void inputs_free(inputs_t *in) {
    for (int r = 0; r < in->n; ++r) {
        for (int p = 0; p < 3; ++p)
            free(in->grads[r][p]);
        free(in->grads[r]);
        free(in->init[r]);
        for (int call = 0; call < AG_CALLS; ++call)
            free(in->shards[call][r]);
    }
    for (int call = 0; call < AG_CALLS; ++call)
        free(in->expected[call]);
    tide_plan_destroy(in->plan);
}

/* Run the script with TIDE_CPU_DIRECT = `env` and TIDE_SYNC_ELIDE = `elide`; outputs stay in
 * jb->j.outs. */
static void run(job_t *jb, const inputs_t *in, const char *env, const char *elide,
                tide_comm_t *comms) {
    memset(jb, 0, sizeof(*jb));
    pthread_mutex_init(&jb->lock, NULL);
    jb->plan = in->plan;
    jb->direct = strcmp(env, "0") != 0;
    assert_int_equal(setenv("TIDE_CPU_DIRECT", env, 1), 0);
    assert_int_equal(setenv("TIDE_SYNC_ELIDE", elide, 1), 0);
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, in->m, in->l, comms));
    e2e_job_t *j = &jb->j;
    const tide_geom_t *g = &in->plan->geom;
    j->comms = comms;
    j->cfg = in->cfg;
    j->desc = (tide_group_desc_t){3, in->shapes, TIDE_DTYPE_BF16, in->grad, TIDE_DTYPE_BF16};
    j->shard_in_bytes = g->shard_bytes;
    j->landing_bytes = g->group_bytes;
    j->out_elems = g->shard_elems;
    j->num_ag = AG_CALLS;
    for (int call = 0; call < AG_CALLS; ++call) {
        j->ag_shards[call] = (uint8_t *const *)in->shards[call];
        j->ag_expected[call] = in->expected[call];
    }
    static const e2e_rs_call_t script[RS_CALLS] = {
        {1.0f, 0, TIDE_RS_IN_PLACE, NULL},     {0.125f, 0, TIDE_RS_SLOT_REUSE, NULL},
        {0.3f, 1, TIDE_RS_IN_PLACE, NULL},     {1.7f, 1, TIDE_RS_SLOT_REUSE, NULL},
        {1.0f / 3, 0, TIDE_RS_IN_PLACE, NULL}, {2.0f, 1, TIDE_RS_IN_PLACE, NULL},
    };
    j->num_rs = RS_CALLS;
    for (int c = 0; c < RS_CALLS; ++c) {
        j->rs[c] = script[c];
        if (script[c].accumulate) j->rs[c].init = (float *const *)in->init;
    }
    j->grads = (void *const *const *)in->grads;
    e2e_run_threads(in->n, rank_main, jb);
    e2e_assert_reports(j->rep, in->n);
    for (int r = 0; r < in->n; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(comms[r]));
    pthread_mutex_destroy(&jb->lock);
}

static void compare_outputs(const job_t *off, const job_t *on, const inputs_t *in,
                            const char *what) {
    const uint64_t bytes = in->plan->geom.fp32_shard_bytes;
    for (int c = 0; c < RS_CALLS; ++c)
        for (int r = 0; r < in->n; ++r)
            if (memcmp(off->j.outs[c][r], on->j.outs[c][r], bytes) != 0) {
                uint64_t e = 0;
                while (memcmp(&off->j.outs[c][r][e], &on->j.outs[c][r][e], 4) == 0)
                    ++e;
                fail_msg("%dx%d wave %d %s: call %d rank %d: element %llu is %a with %s, %a "
                         "without",
                         in->m, in->l, in->wave, in->grad == TIDE_DTYPE_BF16 ? "bf16" : "fp32",
                         c, r, (unsigned long long)e, (double)on->j.outs[c][r][e], what,
                         (double)off->j.outs[c][r][e]);
            }
}

/* Calls of one rank the synchronisation elision applies to: the all-gathers, the
 * reduce-scatters, or both (it applies to both RS programs of the plan or neither here). */
static int elided_per_rank(const inputs_t *in) {
    bool all = true, ag = false;
    for (int mode = -1; mode < TIDE_RS_MODE_COUNT; ++mode) {
        tide_program_t prog;
        tide_schedule_t sched;
        tide_direct_t dir;
        tide_sync_elide_t se;
        memset(&sched, 0, sizeof(sched));
        if (mode < 0)
            assert_tide(TIDE_SUCCESS, tide_program_compile_ag(in->plan, &prog));
        else
            assert_tide(TIDE_SUCCESS,
                        tide_program_compile_rs(in->plan, (tide_rs_mode_t)mode, &prog));
        assert_tide(TIDE_SUCCESS, tide_schedule_layout(&prog, &sched));
        assert_tide(TIDE_SUCCESS, tide_direct_analyse(&prog, &sched, TIDE_DIRECT_ALL, NULL, &dir));
        assert_tide(TIDE_SUCCESS, tide_sync_elide_build(&prog, &sched, &dir, &se));
        if (mode < 0)
            ag = se.on;
        else
            all = all && se.on;
        tide_sync_elide_free(&se);
        tide_direct_free(&dir);
        tide_schedule_free(&sched);
        tide_program_free(&prog);
    }
    return (ag ? AG_CALLS : 0) + (all ? RS_CALLS : 0);
}

static void compare_case(int m, int l, int wave, tide_dtype_t grad, bool fused) {
    inputs_t in;
    inputs_init(&in, m, l, wave, grad, fused);
    static job_t off, on, full;
    tide_comm_t comms[E2E_MAX_RANKS];
    run(&off, &in, "0", "1", comms);
    run(&on, &in, "31", "1", comms);
    run(&full, &in, "31", "0", comms);
    compare_outputs(&off, &on, &in, "direct mode");
    compare_outputs(&full, &on, &in, "the synchronisation elided");
    /* The elision ran on every reduce-scatter of every rank where it applies (M = 1, L > 1,
     * every landing fused, one pass; always with the fused shapes), and nowhere else. */
    const int per_rank = elided_per_rank(&in);
    const bool applies = per_rank > 0;
    if (fused) assert_int_equal(per_rank, AG_CALLS + RS_CALLS);
    assert_int_equal(on.elided, (uint64_t)per_rank * (uint64_t)in.n);
    /* TIDE_CPU_DIRECT=0 has no end-of-call join: no elision either. */
    assert_int_equal(full.elided + off.elided, 0);
    /* Direct mode ran: its sums read gradients in place, so STAGING stays as registered. */
    if (l > 1) {
        assert_int_equal(on.staging_written, 0);
        assert_true(off.staging_written > 0);
    }
    print_message("%dx%d wave %d %s%s: %d calls bit-identical with and without direct mode%s\n",
                  m, l, wave, grad == TIDE_DTYPE_BF16 ? "bf16" : "fp32",
                  fused ? " (fused shapes)" : "", AG_CALLS + RS_CALLS,
                  applies ? ", and with and without the synchronisation elided" : "");
    e2e_job_free(&off.j);
    e2e_job_free(&on.j);
    e2e_job_free(&full.j);
    inputs_free(&in);
}

static void test_topologies(void **state) {
    (void)state;
    static const int topos[][3] = {{1, 8, 0}, {2, 4, 0}, {4, 2, 0}, {3, 2, 0},
                                   {4, 2, 1}, {3, 2, 1}, {1, 2, 0}, {5, 1, 0}};
    for (size_t t = 0; t < sizeof(topos) / sizeof(topos[0]); ++t) {
        compare_case(topos[t][0], topos[t][1], topos[t][2], TIDE_DTYPE_BF16, false);
        compare_case(topos[t][0], topos[t][1], topos[t][2], TIDE_DTYPE_FP32, false);
    }
    /* One node, shapes that padding and fusion cover: the elision runs. */
    for (int l = 2; l <= 8; l *= 2) {
        compare_case(1, l, 0, TIDE_DTYPE_BF16, true);
        compare_case(1, l, 0, TIDE_DTYPE_FP32, true);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topologies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
