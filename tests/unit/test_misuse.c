/*
 * test_misuse.c - bad input and misuse of the public C API on the CPU fabric: every case must
 * return a clear error (or, where stated, a correct result), never crash or silently compute
 * something wrong.
 *
 * Cases that crashed before the fixes (use after destroy, double destroy / deregister) run in
 * a forked child, so that a regression fails this test instead of killing the suite; under
 * ASan a read of freed memory aborts the child, which fails the test as well.
 *
 *  - handles: double destroy / deregister, calls on a destroyed communicator or a
 *    deregistered group, pointers that never were handles, and no reuse of a stale address
 *    by newer groups (quarantine);
 *  - ranks that disagree on the all-gather slot, on alpha, accumulate or the mode: refused on
 *    every rank, group fail-stop afterwards;
 *  - alpha: NaN, +-Inf, 0, subnormals refused; alpha_avg / alpha_divide on invalid factors;
 *  - operands that alias the arenas (shard in its own landing slot, output in an arena,
 *    gradients overlapping the output) refused; resident shards and Slot-Reuse gradients in a
 *    landing slot still run, with correct results;
 *  - the checked variants: wrong lengths refused with the expected size, right ones equal the
 *    unchecked calls bit for bit and run the group's mode;
 *  - staging_slots bounded; a shm allocation beyond the file-size limit is NO_MEMORY with its
 *    size; TIDE_TIMEOUT_MS invalid values warn once with the value used; a timeout of ranks
 *    driven from one thread says that each rank needs its own thread; the topology comes
 *    from the communicator when the config leaves it 0;
 *  - the fabrics' switches (TIDE_SYNC_ELIDE and the like): a value outside their list is
 *    refused, naming the list.
 */
#include "e2e_util.h"

#include "api/comm.h"
#include "fabric/fabric.h"

#include <float.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static const tide_param_shape_t SHAPES[2] = {{5, 3}, {2, 4}};

static tide_config_t config_of(int m, int l) {
    tide_config_t cfg = TIDE_CONFIG_INIT;
    cfg.nodes = m;
    cfg.gpus_per_node = l;
    return cfg;
}

static tide_group_desc_t desc_of(tide_dtype_t dt) {
    return (tide_group_desc_t){2, SHAPES, dt, dt, dt};
}

/* Run fn in a forked child; it must exit 0 (a crash or a failed check fails the test). */
static void in_child(void (*fn)(void), const char *what) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* cmocka's handlers would catch a crash here and go on with the other tests in the
         * child: a crash must end the child, for the parent to see it. */
        const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
        for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); ++i)
            signal(sigs[i], SIG_DFL);
        fn();
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) fail_msg("%s: the child died of signal %d", what, WTERMSIG(status));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("%s: the child exited with %d", what, WEXITSTATUS(status));
}

/* Checks inside a child: report and exit 1 (cmocka's longjmp does not cross the fork). */
#define CHILD_EXPECT(expected, call)                                                            \
    do {                                                                                        \
        tide_result_t r_ = (call);                                                              \
        if (r_ != (expected)) {                                                                 \
            fprintf(stderr, "%s:%d: %s -> %d, expected %d (%s)\n", __FILE__, __LINE__, #call,   \
                    (int)r_, (int)(expected), tide_get_last_error());                           \
            _exit(1);                                                                           \
        }                                                                                       \
    } while (0)

#define CHILD_TRUE(cond)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "%s:%d: %s is false (last error: %s)\n", __FILE__, __LINE__, #cond, \
                    tide_get_last_error());                                                     \
            _exit(1);                                                                           \
        }                                                                                       \
    } while (0)

/* ------------------------------------------------------------------ handles */

static void handles_child(void) {
    tide_comm_t comm[1];
    CHILD_EXPECT(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 1, comm));
    tide_config_t cfg = config_of(1, 1);
    tide_group_desc_t desc = desc_of(TIDE_DTYPE_BF16);
    tide_group_t g;
    CHILD_EXPECT(TIDE_SUCCESS, tide_group_register(comm[0], &cfg, &desc, &g));
    CHILD_EXPECT(TIDE_SUCCESS, tide_group_deregister(g));

    /* Everything on the deregistered group is refused without reading it. */
    uint16_t shard[32] = {0};
    float out[64];
    const void *grads[2] = {shard, shard};
    void *ptr = NULL;
    tide_plan_t plan = NULL;
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_all_gather(g, shard, 0, NULL));
    CHILD_TRUE(strstr(tide_get_last_error(), "not a live group handle") != NULL);
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_reduce_scatter(g, grads, out, 1, 0, 0, NULL));
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_group_landing(g, 0, &ptr));
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_group_resident(g, &ptr));
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_group_plan(g, &plan));
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_group_deregister(g)); /* twice */
    CHILD_TRUE(ptr == NULL && plan == NULL);

    /* Newer groups never take the stale address within the quarantine window. */
    for (int i = 0; i < 16; ++i) {
        tide_group_t h;
        CHILD_EXPECT(TIDE_SUCCESS, tide_group_register(comm[0], &cfg, &desc, &h));
        CHILD_TRUE(h != g);
        CHILD_EXPECT(TIDE_SUCCESS, tide_group_deregister(h));
    }
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_group_deregister(g));

    /* A pointer that never was a handle. */
    int not_a_handle = 0;
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT,
                 tide_all_gather((tide_group_t)(void *)&not_a_handle, shard, 0, NULL));
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_comm_destroy((tide_comm_t)(void *)&not_a_handle));

    CHILD_EXPECT(TIDE_SUCCESS, tide_comm_destroy(comm[0]));
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_comm_destroy(comm[0])); /* twice */
    CHILD_TRUE(strstr(tide_get_last_error(), "not a live communicator handle") != NULL);
    int rank = -1;
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_comm_rank(comm[0], &rank));
    CHILD_TRUE(rank == -1);
    /* Registering on a destroyed communicator reads nothing of it (it used to report
     * "L = 0" read from freed memory). */
    CHILD_EXPECT(TIDE_ERR_INVALID_ARGUMENT, tide_group_register(comm[0], &cfg, &desc, &g));
    CHILD_TRUE(strstr(tide_get_last_error(), "not a live communicator handle") != NULL);
}

static void test_handles(void **state) {
    (void)state;
    in_child(handles_child, "stale handles");
}

/* ------------------------------------------------------------------ ranks that disagree */

typedef struct {
    tide_comm_t comms[2];
    int slot[2];
    float alpha[2];
    int accumulate[2];
    tide_rs_mode_t mode[2];
    bool rs;
    tide_result_t res[2], again[2], dereg[2];
    char msg[2][512];
} disagree_job_t;

static void disagree_rank(int rank, void *ctx) {
    disagree_job_t *j = ctx;
    tide_config_t cfg = config_of(1, 2);
    tide_group_desc_t desc = desc_of(TIDE_DTYPE_FP32);
    tide_group_t g;
    j->res[rank] = tide_group_register(j->comms[rank], &cfg, &desc, &g);
    if (j->res[rank] != TIDE_SUCCESS) return;
    float shard[64] = {0}, out[64] = {0};
    float g0[15] = {0}, g1[8] = {0};
    const void *grads[2] = {g0, g1};
    if (j->rs)
        j->res[rank] = tide_reduce_scatter(g, grads, out, j->alpha[rank], j->accumulate[rank],
                                           j->mode[rank], NULL);
    else
        j->res[rank] = tide_all_gather(g, shard, j->slot[rank], NULL);
    snprintf(j->msg[rank], sizeof(j->msg[rank]), "%s", tide_get_last_error());
    j->again[rank] = tide_all_gather(g, shard, 0, NULL);
    j->dereg[rank] = tide_group_deregister(g);
}

static void run_disagree(disagree_job_t *j, const char *want) {
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 2, j->comms));
    e2e_run_threads(2, disagree_rank, j);
    for (int r = 0; r < 2; ++r) {
        if (j->res[r] != TIDE_ERR_INVALID_ARGUMENT)
            fail_msg("rank %d: %d (%s), expected a refusal", r, j->res[r], j->msg[r]);
        if (strstr(j->msg[r], "the ranks disagree") == NULL || strstr(j->msg[r], want) == NULL)
            fail_msg("rank %d: message '%s' does not name '%s'", r, j->msg[r], want);
        assert_int_equal(j->again[r], TIDE_ERR_FABRIC); /* fail-stop: deregister it */
        assert_int_equal(j->dereg[r], TIDE_SUCCESS);
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(j->comms[r]));
    }
}

static void test_ranks_disagree(void **state) {
    (void)state;
    disagree_job_t j = {.slot = {0, 1}};
    run_disagree(&j, "slot 1");

    disagree_job_t a = {.rs = true, .alpha = {1.0f, 0.5f}};
    run_disagree(&a, "alpha 0.5");

    disagree_job_t b = {.rs = true, .alpha = {0.25f, 0.25f}, .accumulate = {0, 1}};
    run_disagree(&b, "accumulate 1");

    disagree_job_t c = {.rs = true,
                        .alpha = {1.0f, 1.0f},
                        .mode = {TIDE_RS_IN_PLACE, TIDE_RS_SLOT_REUSE}};
    run_disagree(&c, "mode slot-reuse");
}

/* ------------------------------------------------------------------ one rank, many calls */

typedef struct {
    tide_comm_t comm[1];
    tide_group_t g;
    const struct tide_plan *plan;
} solo_t;

static void solo_open(solo_t *s, tide_dtype_t dt, tide_rs_mode_t mode) {
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 1, s->comm));
    tide_config_t cfg = config_of(1, 1);
    cfg.mode = mode;
    tide_group_desc_t desc = desc_of(dt);
    assert_tide(TIDE_SUCCESS, tide_group_register(s->comm[0], &cfg, &desc, &s->g));
    tide_plan_t plan;
    assert_tide(TIDE_SUCCESS, tide_group_plan(s->g, &plan));
    s->plan = plan;
}

static void solo_close(solo_t *s) {
    assert_tide(TIDE_SUCCESS, tide_group_deregister(s->g));
    assert_tide(TIDE_SUCCESS, tide_comm_destroy(s->comm[0]));
}

static void test_alpha(void **state) {
    (void)state;
    solo_t s;
    solo_open(&s, TIDE_DTYPE_FP32, TIDE_RS_IN_PLACE);
    float g0[15], g1[8], out[64];
    for (int i = 0; i < 15; ++i)
        g0[i] = (float)ldexp(1.0 + i / 16.0, i - 7);
    for (int i = 0; i < 8; ++i)
        g1[i] = -(float)i;
    const void *grads[2] = {g0, g1};
    const double big = 1e40; /* Inf in fp32 */
    const float bad[] = {NAN, INFINITY, -INFINITY, (float)big, 0.0f, -0.0f, 1e-40f, FLT_MIN / 2};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                    tide_reduce_scatter(s.g, grads, out, bad[i], 0, TIDE_RS_IN_PLACE, NULL));
        assert_non_null(strstr(tide_get_last_error(), "finite, normal fp32"));
    }
    /* Refused before anything ran: the group stays usable, and the smallest normal and
     * negative scales work. */
    assert_tide(TIDE_SUCCESS, tide_reduce_scatter(s.g, grads, out, FLT_MIN, 0, 0, NULL));
    assert_tide(TIDE_SUCCESS, tide_reduce_scatter(s.g, grads, out, -1.0f, 0, 0, NULL));
    for (int i = 0; i < 15; ++i)
        assert_true(out[i] == -g0[i]);
    solo_close(&s);

    assert_true(isnan(tide_alpha_divide(0.0f, 4.0f)));
    assert_non_null(strstr(tide_get_last_error(), "finite and nonzero"));
    assert_true(isnan(tide_alpha_divide(4.0f, INFINITY)));
    assert_true(isnan(tide_alpha_divide(NAN, 1.0f)));
    assert_true(isnan(tide_alpha_divide(1e30f, 1e30f))); /* 1e-60 is 0 in fp32 */
    assert_non_null(strstr(tide_get_last_error(), "not a normal fp32"));
    assert_true(tide_alpha_divide(2.0f, 4.0f) == 0.125f);
    assert_string_equal(tide_get_last_error(), "");
    assert_true(isnan(tide_alpha_avg(0)));
    assert_true(tide_alpha_avg(4) == 0.25f);
}

/* ------------------------------------------------------------------ aliasing operands */

static void test_overlap(void **state) {
    (void)state;
    solo_t s;
    solo_open(&s, TIDE_DTYPE_FP32, TIDE_RS_SLOT_REUSE);
    const uint64_t elems = s.plan->geom.shard_elems; /* N = 1: shard = unsharded layout */
    void *slot0 = NULL, *slot1 = NULL, *resident = NULL;
    assert_tide(TIDE_SUCCESS, tide_group_landing(s.g, 0, &slot0));
    assert_tide(TIDE_SUCCESS, tide_group_landing(s.g, 1, &slot1));
    assert_tide(TIDE_SUCCESS, tide_group_resident(s.g, &resident));
    float *v = slot0;
    for (uint64_t i = 0; i < elems; ++i)
        v[i] = (float)i * 0.75f - 3.0f;

    /* A shard that is a view of its own destination slot (or of the other one). */
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_all_gather(s.g, slot0, 0, NULL));
    assert_non_null(strstr(tide_get_last_error(), "overlaps rank 0's landing slot 0"));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_all_gather(s.g, (float *)slot1 + 1, 0, NULL));
    /* The resident region is the in-place shard: fine, and the result is right. */
    memcpy(resident, v, elems * 4);
    assert_tide(TIDE_SUCCESS, tide_all_gather(s.g, resident, 1, NULL));
    assert_memory_equal(slot1, v, elems * 4);

    /* RS: gradients in a landing slot (Slot-Reuse) run; outputs in the arena do not. */
    float *out = calloc(elems, 4), *ref = calloc(elems, 4);
    const tide_geom_t *g = &s.plan->geom;
    const void *in_slot[2] = {v, v + g->params[0].dim0 * g->params[0].inner};
    float *copy = malloc(elems * 4);
    memcpy(copy, v, elems * 4);
    const void *outside[2] = {copy, copy + g->params[0].dim0 * g->params[0].inner};
    assert_tide(TIDE_SUCCESS, tide_reduce_scatter(s.g, outside, ref, 0.5f, 0, 1, NULL));
    assert_tide(TIDE_SUCCESS, tide_reduce_scatter(s.g, in_slot, out, 0.5f, 0, 1, NULL));
    assert_memory_equal(out, ref, elems * 4);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_reduce_scatter(s.g, outside, (float *)resident, 0.5f, 0, 1, NULL));
    assert_non_null(strstr(tide_get_last_error(), "out ["));
    const void *on_out[2] = {out, outside[1]};
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_reduce_scatter(s.g, on_out, out, 0.5f, 0, 1, NULL));
    assert_non_null(strstr(tide_get_last_error(), "grads[0] overlaps out"));
    const void *in_resident[2] = {resident, outside[1]};
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_reduce_scatter(s.g, in_resident, out, 0.5f, 0, 1, NULL));
    /* Nothing ran: the group is still usable. */
    assert_tide(TIDE_SUCCESS, tide_all_gather(s.g, copy, 0, NULL));
    free(copy);
    free(out);
    free(ref);
    solo_close(&s);
}

/* ------------------------------------------------------------------ checked variants */

static void test_checked(void **state) {
    (void)state;
    solo_t s;
    solo_open(&s, TIDE_DTYPE_BF16, TIDE_RS_SLOT_REUSE);
    const tide_geom_t *g = &s.plan->geom;
    uint16_t *shard = calloc(g->shard_elems, 2);
    for (uint64_t i = 0; i < g->shard_elems; ++i)
        shard[i] = (uint16_t)(0x3f80 + i);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_all_gather_checked(s.g, shard, g->shard_bytes - 2, 0, NULL));
    char want[96];
    snprintf(want, sizeof(want), "the group's shard is %llu bytes",
             (unsigned long long)g->shard_bytes);
    assert_non_null(strstr(tide_get_last_error(), want));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_all_gather_checked(s.g, NULL, 8, 0, NULL));
    assert_tide(TIDE_SUCCESS, tide_all_gather_checked(s.g, shard, g->shard_bytes, 0, NULL));
    void *slot0;
    assert_tide(TIDE_SUCCESS, tide_group_landing(s.g, 0, &slot0));
    assert_memory_equal(slot0, shard, g->shard_bytes);

    const void *grads[2] = {shard, shard + g->params[0].dim0 * g->params[0].inner};
    uint64_t gb[2] = {15 * 2, 8 * 2};
    float *a = calloc(g->shard_elems, 4), *b = calloc(g->shard_elems, 4);
    const uint64_t ob = g->fp32_shard_bytes;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_reduce_scatter_checked(s.g, grads, gb, 1, a, ob, 1.0f, 0, NULL));
    gb[1] = 8 * 4;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_reduce_scatter_checked(s.g, grads, gb, 2, a, ob, 1.0f, 0, NULL));
    assert_non_null(strstr(tide_get_last_error(), "grad_bytes[1] = 32"));
    gb[1] = 8 * 2;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_reduce_scatter_checked(s.g, grads, gb, 2, a, ob + 4, 1.0f, 0, NULL));
    assert_tide(TIDE_SUCCESS, tide_reduce_scatter_checked(s.g, grads, gb, 2, a, ob, 0.5f, 0, NULL));
    /* The checked call runs the group's mode, and only that one was compiled. */
    assert_true(s.g->rs_compiled[TIDE_RS_SLOT_REUSE] && !s.g->rs_compiled[TIDE_RS_IN_PLACE]);
    assert_tide(TIDE_SUCCESS, tide_reduce_scatter(s.g, grads, b, 0.5f, 0, TIDE_RS_SLOT_REUSE, NULL));
    assert_memory_equal(a, b, ob);
    free(a);
    free(b);
    free(shard);
    solo_close(&s);
}

/* ------------------------------------------------------------------ config limits */

static void test_staging_bound(void **state) {
    (void)state;
    tide_config_t cfg = config_of(2, 4);
    tide_group_desc_t desc = desc_of(TIDE_DTYPE_BF16);
    tide_plan_t plan = NULL;
    cfg.staging_slots = 2147483647;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_create(&cfg, &desc, &plan));
    assert_non_null(strstr(tide_get_last_error(), "outside [1, 64]"));
    cfg.staging_slots = TIDE_MAX_STAGING_SLOTS + 1;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_plan_create(&cfg, &desc, &plan));
    cfg.staging_slots = TIDE_MAX_STAGING_SLOTS;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&cfg, &desc, &plan));
    tide_plan_destroy(plan);
}

/* A shared-memory object beyond RLIMIT_FSIZE cannot be sized: NO_MEMORY naming the size. */
static void no_memory_child(void) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {1 << 20, 1 << 20};
    CHILD_TRUE(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    tide_comm_t comm[1];
    CHILD_EXPECT(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 1, comm));
    tide_config_t cfg = config_of(1, 1);
    const tide_param_shape_t big = {1024, 1024}; /* two 4 MiB landing slots */
    tide_group_desc_t desc = {1, &big, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32, TIDE_DTYPE_FP32};
    tide_group_t g;
    CHILD_EXPECT(TIDE_ERR_NO_MEMORY, tide_group_register(comm[0], &cfg, &desc, &g));
    CHILD_TRUE(strstr(tide_get_last_error(), " bytes") != NULL);
    CHILD_EXPECT(TIDE_SUCCESS, tide_comm_destroy(comm[0]));
}

static void test_no_memory(void **state) {
    (void)state;
    in_child(no_memory_child, "arena beyond the file-size limit");
}

/* TIDE_TIMEOUT_MS: the child logs at WARN into a pipe (TIDE_DEBUG is read once per process,
 * so the child is a fresh exec of this program). */
static void timeout_env_child(void) {
    static const char *const values[] = {"abc", "abc", "0", "-5", "abc"};
    for (int i = 0; i < 5; ++i) {
        setenv("TIDE_TIMEOUT_MS", values[i], 1);
        CHILD_TRUE(tide_fabric_timeout_ms() == TIDE_TIMEOUT_MS_DEFAULT);
    }
    setenv("TIDE_TIMEOUT_MS", "250", 1);
    CHILD_TRUE(tide_fabric_timeout_ms() == 250);
    /* A world's join waits TIDE_JOIN_TIMEOUT_MS, else at least its default, else the calls'
     * deadline when that is longer. */
    unsetenv("TIDE_JOIN_TIMEOUT_MS");
    CHILD_TRUE(tide_fabric_join_timeout_ms() == TIDE_JOIN_TIMEOUT_MS_DEFAULT);
    setenv("TIDE_TIMEOUT_MS", "300000", 1);
    CHILD_TRUE(tide_fabric_join_timeout_ms() == 300000);
    setenv("TIDE_JOIN_TIMEOUT_MS", "5000", 1);
    CHILD_TRUE(tide_fabric_join_timeout_ms() == 5000);
    setenv("TIDE_JOIN_TIMEOUT_MS", "soon", 1);
    CHILD_TRUE(tide_fabric_join_timeout_ms() == 300000);
}

static void test_timeout_env(void **state) {
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        setenv("TIDE_DEBUG", "WARN", 1);
        char *argv[] = {(char *)"test_misuse", (char *)"--timeout-env-child", NULL};
        execv("/proc/self/exe", argv);
        _exit(2);
    }
    close(fds[1]);
    char log[4096] = "";
    size_t used = 0;
    ssize_t k;
    while (used < sizeof(log) - 1 && (k = read(fds[0], log + used, sizeof(log) - 1 - used)) > 0)
        used += (size_t)k;
    log[used] = '\0';
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* One warning per distinct invalid value (abc, 0, -5, then abc again after -5). */
    int warnings = 0;
    for (const char *p = log; (p = strstr(p, "TIDE_TIMEOUT_MS = '")) != NULL; ++p)
        ++warnings;
    if (warnings != 4) fail_msg("%d warnings in:\n%s", warnings, log);
    assert_non_null(strstr(log, "TIDE_TIMEOUT_MS = 'abc' is not a positive integer"));
    assert_non_null(strstr(log, "using the default 10000 ms"));
    assert_non_null(strstr(log, "TIDE_JOIN_TIMEOUT_MS = 'soon' is not a positive integer of "
                                "milliseconds; using the default 300000 ms"));
}

/* ------------------------------------------------------------------ one thread, N ranks */

typedef struct {
    tide_comm_t comms[2];
    tide_group_t g[2];
    tide_result_t res[2];
} pair_t;

static void pair_register(int rank, void *ctx) {
    pair_t *p = ctx;
    tide_config_t cfg = config_of(0, 0); /* the communicator's topology */
    tide_group_desc_t desc = desc_of(TIDE_DTYPE_BF16);
    p->res[rank] = tide_group_register(p->comms[rank], &cfg, &desc, &p->g[rank]);
}

static void pair_deregister(int rank, void *ctx) {
    pair_t *p = ctx;
    p->res[rank] = tide_group_deregister(p->g[rank]);
}

/* The fabrics' switches (fabric/env.c): unset and empty give the default, listed values
 * their index, anything else TIDE_ERR_INVALID_ARGUMENT naming the variable, the value and the
 * list; TIDE_SYNC_ELIDE maps "default" to the fabric's default. */
static void test_env_switches(void **state) {
    (void)state;
    static const char *const values[] = {"host", "device", "kernel"};
    int i = -1;
    unsetenv("TIDE_TEST_SWITCH");
    assert_tide(TIDE_SUCCESS, tide_fabric_env_choice("TIDE_TEST_SWITCH", values, 3, &i));
    assert_int_equal(i, 0);
    setenv("TIDE_TEST_SWITCH", "", 1);
    assert_tide(TIDE_SUCCESS, tide_fabric_env_choice("TIDE_TEST_SWITCH", values, 3, &i));
    assert_int_equal(i, 0);
    setenv("TIDE_TEST_SWITCH", "kernel", 1);
    assert_tide(TIDE_SUCCESS, tide_fabric_env_choice("TIDE_TEST_SWITCH", values, 3, &i));
    assert_int_equal(i, 2);
    setenv("TIDE_TEST_SWITCH", "kernels", 1);
    i = -1;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_fabric_env_choice("TIDE_TEST_SWITCH", values, 3, &i));
    assert_int_equal(i, -1);
    assert_non_null(strstr(tide_get_last_error(),
                           "TIDE_TEST_SWITCH is \"kernels\" (one of: host, device, kernel)"));
    unsetenv("TIDE_TEST_SWITCH");
    bool on = false;
    for (int d = 0; d < 2; ++d) {
        unsetenv("TIDE_SYNC_ELIDE");
        assert_tide(TIDE_SUCCESS, tide_fabric_sync_elide_env(d == 1, &on));
        assert_int_equal(on, d == 1);
        setenv("TIDE_SYNC_ELIDE", "default", 1);
        assert_tide(TIDE_SUCCESS, tide_fabric_sync_elide_env(d == 1, &on));
        assert_int_equal(on, d == 1);
        setenv("TIDE_SYNC_ELIDE", "0", 1);
        assert_tide(TIDE_SUCCESS, tide_fabric_sync_elide_env(d == 1, &on));
        assert_false(on);
        setenv("TIDE_SYNC_ELIDE", "1", 1);
        assert_tide(TIDE_SUCCESS, tide_fabric_sync_elide_env(d == 1, &on));
        assert_true(on);
    }
    setenv("TIDE_SYNC_ELIDE", "yes", 1);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_fabric_sync_elide_env(true, &on));
    unsetenv("TIDE_SYNC_ELIDE");
    /* TIDE_CUDA_MP_WAIT_RUNS: runs of waits as one operation unless "0". */
    unsetenv("TIDE_CUDA_MP_WAIT_RUNS");
    on = false;
    assert_tide(TIDE_SUCCESS, tide_fabric_wait_runs_env(&on));
    assert_true(on);
    setenv("TIDE_CUDA_MP_WAIT_RUNS", "0", 1);
    assert_tide(TIDE_SUCCESS, tide_fabric_wait_runs_env(&on));
    assert_false(on);
    setenv("TIDE_CUDA_MP_WAIT_RUNS", "1", 1);
    assert_tide(TIDE_SUCCESS, tide_fabric_wait_runs_env(&on));
    assert_true(on);
    setenv("TIDE_CUDA_MP_WAIT_RUNS", "off", 1);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_fabric_wait_runs_env(&on));
    assert_non_null(strstr(tide_get_last_error(),
                           "TIDE_CUDA_MP_WAIT_RUNS is \"off\" (one of: 1, 0)"));
    unsetenv("TIDE_CUDA_MP_WAIT_RUNS");
    /* TIDE_CUDA_BATCH_KERNEL: the build's variant unless one is named. */
    static const struct {
        const char *value;
        int unroll, streaming;
    } kernels[] = {{NULL, 6, 1},  {"", 6, 1},   {"default", 6, 1}, {"4", 4, 0},
                   {"8", 8, 0},   {"16", 16, 0}, {"4cs", 4, 1},    {"8cs", 8, 1},
                   {"16cs", 16, 1}};
    for (size_t k = 0; k < sizeof(kernels) / sizeof(kernels[0]); ++k) {
        if (kernels[k].value == NULL) unsetenv("TIDE_CUDA_BATCH_KERNEL");
        else setenv("TIDE_CUDA_BATCH_KERNEL", kernels[k].value, 1);
        int unroll = -1, streaming = -1;
        assert_tide(TIDE_SUCCESS, tide_fabric_batch_kernel_env(6, 1, &unroll, &streaming));
        assert_int_equal(unroll, kernels[k].unroll);
        assert_int_equal(streaming, kernels[k].streaming);
    }
    setenv("TIDE_CUDA_BATCH_KERNEL", "32", 1);
    int unroll = -1, streaming = -1;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_fabric_batch_kernel_env(4, 0, &unroll, &streaming));
    assert_non_null(strstr(tide_get_last_error(), "TIDE_CUDA_BATCH_KERNEL is \"32\" (one of: "
                                                  "default, 4, 8, 16, 4cs, 8cs, 16cs)"));
    unsetenv("TIDE_CUDA_BATCH_KERNEL");
}

static void test_one_thread(void **state) {
    (void)state;
    pair_t p;
    memset(&p, 0, sizeof(p));
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 2, p.comms));
    e2e_run_threads(2, pair_register, &p);
    assert_tide(TIDE_SUCCESS, p.res[0]);
    assert_tide(TIDE_SUCCESS, p.res[1]);
    tide_plan_t plan;
    assert_tide(TIDE_SUCCESS, tide_group_plan(p.g[0], &plan));
    assert_int_equal(plan->topo.gpus_per_node, 2); /* taken from the communicator */

    /* The classic mistake: every rank's call from one thread. */
    setenv("TIDE_TIMEOUT_MS", "200", 1);
    uint16_t shard[32] = {0};
    assert_tide(TIDE_ERR_TIMEOUT, tide_all_gather(p.g[0], shard, 0, NULL));
    assert_non_null(strstr(tide_get_last_error(), "each rank needs its own thread or process"));
    assert_tide(TIDE_ERR_TIMEOUT, tide_all_gather(p.g[1], shard, 0, NULL));
    assert_non_null(strstr(tide_get_last_error(), "rank 0 was called from this same thread"));
    unsetenv("TIDE_TIMEOUT_MS");
    e2e_run_threads(2, pair_deregister, &p);
    for (int r = 0; r < 2; ++r)
        assert_tide(TIDE_SUCCESS, tide_comm_destroy(p.comms[r]));

    /* Half a topology is refused; so is one that differs from the communicator. */
    tide_comm_t solo[1];
    assert_tide(TIDE_SUCCESS, tide_comm_init_all(TIDE_FABRIC_CPU, 1, 1, solo));
    tide_config_t cfg = config_of(0, 1);
    tide_group_desc_t desc = desc_of(TIDE_DTYPE_BF16);
    tide_group_t g;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_register(solo[0], &cfg, &desc, &g));
    cfg = config_of(1, 2);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_group_register(solo[0], &cfg, &desc, &g));
    assert_tide(TIDE_SUCCESS, tide_comm_destroy(solo[0]));
}

/* tide_stream_capture_key: a NULL output is an argument error; a build without CUDA says
 * it cannot tell (unit tests run in the CPU build). */
static void test_capture_key(void **state) {
    (void)state;
    uint64_t key = 7;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_stream_capture_key(NULL, NULL));
    assert_non_null(strstr(tide_get_last_error(), "key_out is NULL"));
#ifdef TIDE_HAVE_CUDA
    (void)key;
#else
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_stream_capture_key(NULL, &key));
    assert_non_null(strstr(tide_get_last_error(), "without CUDA"));
    assert_int_equal(key, 7); /* untouched */
#endif
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--timeout-env-child") == 0) {
        timeout_env_child();
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handles),       cmocka_unit_test(test_ranks_disagree),
        cmocka_unit_test(test_alpha),         cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_checked),       cmocka_unit_test(test_staging_bound),
        cmocka_unit_test(test_no_memory),     cmocka_unit_test(test_timeout_env),
        cmocka_unit_test(test_one_thread),    cmocka_unit_test(test_capture_key),
        cmocka_unit_test(test_env_switches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
