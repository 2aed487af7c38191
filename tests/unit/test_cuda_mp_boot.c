/*
 * test_cuda_mp_boot.c - the one-process-per-rank bootstrap (src/fabric/cuda/mp_boot.h) with
 * real processes and no GPU: join, all-gather of blobs and descriptors (memfds standing in
 * for the CUDA VMM handles), barriers, which ranks share a device, a missing rank at join,
 * and a rank that dies.
 *
 * The group control block (mp_ctl.h) across processes: counters that name a missing rank, an
 * abort word that exactly one rank wins and every rank reads.
 *
 * Children report through their exit status (cmocka's asserts stay in the parent).
 */
#include "test_util.h"

#include "fabric/cuda/mp_boot.h"
#include "fabric/cuda/mp_ctl.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void job_name(char *buf, size_t len, const char *what) {
    snprintf(buf, len, "t%ld-%s", (long)getpid(), what);
}

static int64_t ms_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Child: join, exchange a blob and a memfd whose content names the rank, check both, then
 * a barrier.  Exit status 0 on success, else the step that failed. */
static int exchange_child(const char *name, int rank, int ranks) {
    tide_mp_boot_t b;
    if (tide_mp_boot_open(name, rank, ranks, 10000, &b) != TIDE_SUCCESS) return 10;
    const uint64_t mine[2] = {0x1000u + (uint64_t)rank, (uint64_t)rank * 0x9e3779b97f4a7c15ull};
    uint64_t all[16][2];
    int fds[16];
    int fd = memfd_create("tide-test", MFD_CLOEXEC);
    char text[32];
    const int n = snprintf(text, sizeof(text), "rank %d payload", rank);
    if (fd < 0 || write(fd, text, (size_t)n) != n) return 11;
    if (tide_mp_boot_allgather(&b, mine, sizeof(mine), fd, all, fds, 10000) != TIDE_SUCCESS)
        return 12;
    close(fd);
    for (int r = 0; r < ranks; ++r) {
        if (all[r][0] != 0x1000u + (uint64_t)r || all[r][1] != (uint64_t)r * 0x9e3779b97f4a7c15ull)
            return 13;
        if (r == rank) {
            if (fds[r] != -1) return 14;
            continue;
        }
        char got[32] = {0}, want[32];
        const int w = snprintf(want, sizeof(want), "rank %d payload", r);
        if (fds[r] < 0 || pread(fds[r], got, sizeof(got) - 1, 0) != w || strcmp(got, want) != 0)
            return 15;
        close(fds[r]);
    }
    /* A second exchange without descriptors, then barriers. */
    if (tide_mp_boot_allgather(&b, mine, 8, -1, all, NULL, 10000) != TIDE_SUCCESS) return 16;
    if (tide_mp_boot_barrier(&b, 42, 10000) != TIDE_SUCCESS) return 17;
    if (tide_mp_boot_dead_peer(&b) != -1) return 18;
    /* Ranks disagreeing on a barrier's tag are told so. */
    const tide_result_t r = tide_mp_boot_barrier(&b, rank == 0 ? 7u : 8u, 10000);
    if (r != (ranks > 1 ? TIDE_ERR_INVALID_ARGUMENT : TIDE_SUCCESS)) return 19;
    if (tide_mp_boot_barrier(&b, 43, 10000) != TIDE_SUCCESS) return 20;
    tide_mp_boot_close(&b);
    return 0;
}

static void run_children(int ranks, int (*child)(const char *, int, int), const char *name,
                         int *status) {
    pid_t pids[16];
    for (int r = 0; r < ranks; ++r) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) _exit(child(name, r, ranks));
    }
    for (int r = 0; r < ranks; ++r) {
        int st = 0;
        assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
}

static void test_exchange(void **state) {
    (void)state;
    static const int sizes[] = {1, 2, 3, 8};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); ++k) {
        char name[64];
        job_name(name, sizeof(name), "x");
        int status[16];
        run_children(sizes[k], exchange_child, name, status);
        for (int r = 0; r < sizes[k]; ++r) {
            if (status[r] != 0) print_error("N = %d rank %d: step %d\n", sizes[k], r, status[r]);
            assert_int_equal(status[r], 0);
        }
    }
}

/* What every rank concludes at world creation (tide_mp_boot_agree; mp_agree.c and
 * TIDE_CUDA_MP_FLAGS=auto decide from it): each case gives every rank a device (a letter
 * standing for its UUID), whether it is an MPS client and whether its part of the world
 * failed, and the answers every rank must get.  Every rank passes choices of its own
 * (100 * rank + k): each must get rank 0's. */
typedef struct {
    int ranks;
    const char *devices; /* one letter per rank */
    const char *mps;     /* '1' or '0' per rank */
    const char *status;  /* per rank: '0' success, else the digit as the status */
    int shared;          /* the lowest rank whose device a lower rank has, or -1 */
    int timeshared;      /* the same where the two are not both MPS clients, or -1 */
    int failed;          /* the lowest rank whose status is not 0, or -1 */
} devices_case_t;

static const devices_case_t *devices_now; /* the case the forked children run */

static int devices_child(const char *name, int rank, int ranks) {
    tide_mp_boot_t b;
    if (tide_mp_boot_open(name, rank, ranks, 10000, &b) != TIDE_SUCCESS) return 10;
    tide_mp_rank_info_t mine;
    memset(&mine, 0, sizeof(mine));
    memset(mine.uuid, 0x5a, sizeof(mine.uuid));
    mine.uuid[15] = (uint8_t)devices_now->devices[rank];
    mine.mps = devices_now->mps[rank] == '1';
    mine.status = devices_now->status[rank] - '0';
    for (int k = 0; k < TIDE_MP_BOOT_CHOICES; ++k)
        mine.choice[k] = 100 * rank + k;
    /* Answers that no case expects, so a call that leaves them alone fails. */
    tide_mp_world_info_t d = {-7, -7, -7, -7, {-7, -7, -7, -7}};
    if (tide_mp_boot_agree(&b, &mine, 10000, &d) != TIDE_SUCCESS) return 11;
    if (d.shared != devices_now->shared) return 12;
    if (d.timeshared != devices_now->timeshared) return 13;
    if (d.failed != devices_now->failed) return 14;
    if (d.failed >= 0 && d.failed_status != devices_now->status[d.failed] - '0') return 15;
    if (d.failed < 0 && d.failed_status != TIDE_SUCCESS) return 16;
    for (int k = 0; k < TIDE_MP_BOOT_CHOICES; ++k)
        if (d.choice0[k] != k) return 17;
    /* The exchange left the mesh in step: a barrier still works. */
    if (tide_mp_boot_barrier(&b, 5, 10000) != TIDE_SUCCESS) return 18;
    tide_mp_boot_close(&b);
    return 0;
}

static void test_devices(void **state) {
    (void)state;
    static const devices_case_t cases[] = {
        {1, "a", "0", "0", -1, -1, -1},        {1, "a", "1", "0", -1, -1, -1},
        {3, "abc", "000", "000", -1, -1, -1},  /* one process per GPU */
        {3, "aba", "000", "000", 2, 2, -1},    /* ranks 0 and 2 time-share a GPU */
        {2, "aa", "11", "00", 1, -1, -1},      /* two processes on one GPU under MPS */
        {3, "aab", "101", "000", 1, 1, -1},    /* rank 1, on rank 0's GPU, not an MPS client */
        {3, "aab", "110", "000", 1, -1, -1},   /* MPS on the shared GPU; rank 2 alone */
        {4, "aabb", "1100", "0000", 1, 3, -1}, /* one GPU under MPS, the other time-sliced */
        {4, "abbb", "0000", "0000", 2, 2, -1}, /* the first repeat names the rank */
        {3, "abc", "000", "047", -1, -1, 1},   /* ranks 1 and 2 failed: the first is named */
        {2, "ab", "00", "30", -1, -1, 0},      /* rank 0 failed */
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); ++k) {
        char name[64];
        job_name(name, sizeof(name), "dev");
        devices_now = &cases[k];
        int status[16];
        run_children(cases[k].ranks, devices_child, name, status);
        for (int r = 0; r < cases[k].ranks; ++r) {
            if (status[r] != 0)
                print_error("case %zu (%s, mps %s) rank %d: step %d\n", k, cases[k].devices,
                            cases[k].mps, r, status[r]);
            assert_int_equal(status[r], 0);
        }
    }
}

/* Rank 2 of 3 never comes: the others time out naming it. */
static int missing_child(const char *name, int rank, int ranks) {
    tide_mp_boot_t b;
    const int64_t t0 = ms_now();
    const tide_result_t r = tide_mp_boot_open(name, rank, ranks, 400, &b);
    const int64_t took = ms_now() - t0;
    if (r != TIDE_ERR_TIMEOUT) return 1;
    if (strstr(tide_get_last_error(), "rank(s) 2 did not join") == NULL &&
        strstr(tide_get_last_error(), "rank 2") == NULL)
        return 2;
    if (took < 350 || took > 3000) return 3;
    return 0;
}

static void test_missing_rank(void **state) {
    (void)state;
    char name[64];
    job_name(name, sizeof(name), "m");
    int status[16];
    /* Only ranks 0 and 1 of a 3-rank job start. */
    pid_t pids[2];
    for (int r = 0; r < 2; ++r) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) _exit(missing_child(name, r, 3));
    }
    for (int r = 0; r < 2; ++r) {
        int st = 0;
        assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
        status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
        if (status[r] != 0) print_error("rank %d: step %d\n", r, status[r]);
        assert_int_equal(status[r], 0);
    }
}

/* Rank 3 of 4 is killed after joining; the survivors' next exchange fails at once (EOF),
 * naming it, long before its 20 s deadline; dead_peer names it too. */
static int dying_child(const char *name, int rank, int ranks) {
    tide_mp_boot_t b;
    if (tide_mp_boot_open(name, rank, ranks, 10000, &b) != TIDE_SUCCESS) return 10;
    if (tide_mp_boot_barrier(&b, 1, 10000) != TIDE_SUCCESS) return 11;
    if (rank == ranks - 1) raise(SIGKILL);
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    if (tide_mp_boot_dead_peer(&b) != ranks - 1) return 12;
    const int64_t t0 = ms_now();
    const tide_result_t r = tide_mp_boot_barrier(&b, 2, 20000);
    if (r != TIDE_ERR_TIMEOUT) return 13;
    char want[32];
    snprintf(want, sizeof(want), "rank %d", ranks - 1);
    if (strstr(tide_get_last_error(), want) == NULL) return 14;
    if (ms_now() - t0 > 5000) return 15;
    /* Stay a while: a survivor that closes at once reads as dead to the slower ones (the
     * fabric's fail-stop keeps its process too). */
    ts.tv_sec = 1;
    ts.tv_nsec = 0;
    nanosleep(&ts, NULL);
    tide_mp_boot_close(&b);
    return 0;
}

static void test_dead_rank(void **state) {
    (void)state;
    char name[64];
    job_name(name, sizeof(name), "d");
    int status[16];
    run_children(4, dying_child, name, status);
    for (int r = 0; r < 3; ++r) {
        if (status[r] != 0) print_error("rank %d: step %d\n", r, status[r]);
        assert_int_equal(status[r], 0);
    }
    assert_int_equal(status[3], 100 + SIGKILL);
}

static void test_arguments(void **state) {
    (void)state;
    tide_mp_boot_t b;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_mp_boot_open("", 0, 1, 100, &b));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_mp_boot_open("x", 2, 2, 100, &b));
    /* One rank: nothing to connect; exchanges return its own blob. */
    char name[64];
    job_name(name, sizeof(name), "one");
    assert_tide(TIDE_SUCCESS, tide_mp_boot_open(name, 0, 1, 100, &b));
    uint32_t v = 5, out = 0;
    assert_tide(TIDE_SUCCESS, tide_mp_boot_allgather(&b, &v, 4, -1, &out, NULL, 100));
    assert_int_equal(out, 5);
    assert_int_equal(tide_mp_boot_dead_peer(&b), -1);
    tide_mp_boot_close(&b);
}

/* The control block: rank 0 creates it, every rank maps it.  Rank 1 stops after call 2 (it
 * never enters call 3); rank 2 enters call 3 but does not finish enqueueing it.  Every rank
 * then names the missing ones from the counters, every rank races to abort, exactly one
 * wins, and every rank reads the winner's message. */
static int ctl_child(const char *name, int rank, int ranks) {
    tide_mp_boot_t b;
    if (tide_mp_boot_open(name, rank, ranks, 10000, &b) != TIDE_SUCCESS) return 10;
    tide_mp_ctl_t c;
    if (tide_mp_ctl_open(&b, 10000, &c) != TIDE_SUCCESS) return 11;
    if (tide_mp_ctl_aborted(&c, NULL, 0) != -1) return 12;
    const uint64_t last = rank == 1 ? 2 : 3;
    for (uint64_t e = 0; e <= last; ++e) {
        tide_mp_ctl_enter(&c, 0, e);
        if (!(rank == 2 && e == 3)) tide_mp_ctl_enqueued(&c, 0, e);
    }
    /* Reduce-scatter counters are separate: every rank did call 0 of it. */
    tide_mp_ctl_enter(&c, 1, 0);
    tide_mp_ctl_enqueued(&c, 1, 0);
    if (tide_mp_boot_barrier(&b, 1, 10000) != TIDE_SUCCESS) return 13;
    char why[256];
    if (tide_mp_ctl_missing(&c, 0, 3, why, sizeof(why)) != 1) return 14;
    if (strstr(why, "rank 1 (last: 2) never entered all-gather call 3") == NULL) return 15;
    if (tide_mp_ctl_missing(&c, 0, 2, why, sizeof(why)) != -1) return 16;
    if (strstr(why, "every rank enqueued") == NULL) return 17;
    if (tide_mp_ctl_missing(&c, 1, 0, why, sizeof(why)) != -1) return 18;
    if (tide_mp_ctl_missing(&c, 1, 1, why, sizeof(why)) != 0) return 19;
    if (strstr(why, "ranks 0 (last: 0), 1 (last: 0), 2 (last: 0)") == NULL) return 20;
    if (tide_mp_boot_barrier(&b, 2, 10000) != TIDE_SUCCESS) return 21;
    /* Rank 1 has entered call 3 now: rank 2 is the one left, having not enqueued it. */
    if (rank == 1) tide_mp_ctl_enter(&c, 0, 3);
    if (tide_mp_boot_barrier(&b, 3, 10000) != TIDE_SUCCESS) return 22;
    if (tide_mp_ctl_missing(&c, 0, 3, why, sizeof(why)) != 1) return 23; /* 1 did not enqueue */
    if (strstr(why, "ranks 1 (last: 2), 2 (last: 2) entered all-gather call 3 but never") == NULL)
        return 24;
    char mine[64];
    snprintf(mine, sizeof(mine), "rank %d was first", rank);
    const bool won = tide_mp_ctl_abort(&c, mine);
    char msg[TIDE_MP_CTL_MSG];
    const int by = tide_mp_ctl_aborted(&c, msg, sizeof(msg));
    if (by < 0 || by >= ranks) return 25;
    char want[64];
    snprintf(want, sizeof(want), "rank %d was first", by);
    if (strcmp(msg, want) != 0) return 26;
    if (won != (by == rank)) return 27;
    /* A second abort never replaces the first message. */
    if (tide_mp_ctl_abort(&c, "late")) return 28;
    if (tide_mp_boot_barrier(&b, 4, 10000) != TIDE_SUCCESS) return 29;
    tide_mp_ctl_close(&c);
    tide_mp_boot_close(&b);
    return 0;
}

static void test_control_block(void **state) {
    (void)state;
    char name[64];
    job_name(name, sizeof(name), "c");
    int status[16];
    run_children(4, ctl_child, name, status);
    for (int r = 0; r < 4; ++r) {
        if (status[r] != 0) print_error("rank %d: step %d\n", r, status[r]);
        assert_int_equal(status[r], 0);
    }
}

/* Poll check `seq` until every rank posted it (10 s at most): 1, or 0 on the deadline. */
static int compare_all(tide_mp_ctl_t *c, int f, uint64_t seq, uint64_t sig, int *other,
                       uint64_t *other_sig) {
    const int64_t t0 = ms_now();
    while (tide_mp_ctl_compare(c, f, seq, sig, other, other_sig) == 0) {
        if (ms_now() - t0 > 10000) return 0;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return 1;
}

/* Argument checks through the control block: agreeing ranks; rank 2 passing another
 * signature (every rank names the lowest rank that differs from it); rank 3 not posting (the
 * others see it missing), then posting a later check (it gave up: counted, not compared). */
static int check_child(const char *name, int rank, int ranks) {
    tide_mp_boot_t b;
    if (tide_mp_boot_open(name, rank, ranks, 10000, &b) != TIDE_SUCCESS) return 10;
    tide_mp_ctl_t c;
    if (tide_mp_ctl_open(&b, 10000, &c) != TIDE_SUCCESS) return 11;
    int other = -2;
    uint64_t other_sig = 1;
    tide_mp_ctl_post(&c, 1, 0, 7);
    if (!compare_all(&c, 1, 0, 7, &other, &other_sig)) return 12;
    if (other != -1 || other_sig != 0) return 13;
    /* The all-gather's checks are separate: nobody posted one. */
    if (tide_mp_ctl_compare(&c, 0, 0, 7, &other, &other_sig) != 0 || other != 0) return 14;
    const uint64_t mine = rank == 2 ? 9 : 7;
    tide_mp_ctl_post(&c, 1, 1, mine);
    if (!compare_all(&c, 1, 1, mine, &other, &other_sig)) return 15;
    if (rank == 2 ? (other != 0 || other_sig != 7) : (other != 2 || other_sig != 9)) return 16;
    if (rank != 3) tide_mp_ctl_post(&c, 1, 2, 7);
    if (tide_mp_boot_barrier(&b, 1, 10000) != TIDE_SUCCESS) return 17;
    if (rank != 3) {
        if (tide_mp_ctl_compare(&c, 1, 2, 7, &other, &other_sig) != 0 || other != 3) return 18;
    }
    if (tide_mp_boot_barrier(&b, 2, 10000) != TIDE_SUCCESS) return 19;
    /* Rank 3 moves on to check 4 (the slot of check 2): the others' check 2 completes
     * without comparing it. */
    if (rank == 3) tide_mp_ctl_post(&c, 1, 4, 5);
    if (tide_mp_boot_barrier(&b, 3, 10000) != TIDE_SUCCESS) return 20;
    if (rank != 3) {
        if (tide_mp_ctl_compare(&c, 1, 2, 7, &other, &other_sig) != 1 || other != -1) return 21;
    }
    if (tide_mp_boot_barrier(&b, 4, 10000) != TIDE_SUCCESS) return 22;
    tide_mp_ctl_close(&c);
    tide_mp_boot_close(&b);
    return 0;
}

static void test_argument_checks(void **state) {
    (void)state;
    char name[64];
    job_name(name, sizeof(name), "k");
    int status[16];
    run_children(4, check_child, name, status);
    for (int r = 0; r < 4; ++r) {
        if (status[r] != 0) print_error("rank %d: step %d\n", r, status[r]);
        assert_int_equal(status[r], 0);
    }
}

/* Flag areas in the block (mp_ctl.h, "Signal flags"): rank 0's flag_bytes decides (the
 * others pass another size, or none, and map rank 0's), every area starts zeroed, a store by
 * one process is read by the others, and the poison of one rank reaches every flag of every
 * rank in every process, with whole 8-byte values. */
#define FLAG_BYTES 4096u
static int flag_child(const char *name, int rank, int ranks) {
    tide_mp_boot_t b;
    if (tide_mp_boot_open(name, rank, ranks, 10000, &b) != TIDE_SUCCESS) return 10;
    tide_mp_ctl_t c;
    if (tide_mp_ctl_open_flags(&b, 10000, rank == 0 ? FLAG_BYTES : 8u * (size_t)rank, &c) !=
        TIDE_SUCCESS)
        return 11;
    if (c.flag_bytes != FLAG_BYTES) return 12;
    if (((uintptr_t)tide_mp_ctl_flags(&c, 0) & 4095u) != 0) return 13;
    if (tide_mp_ctl_flags(&c, -1) != NULL || tide_mp_ctl_flags(&c, ranks) != NULL) return 14;
    for (int r = 0; r < ranks; ++r) {
        const uint8_t *f = tide_mp_ctl_flags(&c, r);
        if (f == NULL || f != tide_mp_ctl_flags(&c, 0) + (size_t)r * FLAG_BYTES) return 15;
        for (size_t i = 0; i < FLAG_BYTES; ++i)
            if (f[i] != 0) return 16;
    }
    if (tide_mp_boot_barrier(&b, 9, 10000) != TIDE_SUCCESS) return 31;
    /* Each rank writes call number 5 + rank into its own last flag. */
    _Atomic uint64_t *own = (_Atomic uint64_t *)(void *)(tide_mp_ctl_flags(&c, rank) +
                                                         FLAG_BYTES - 8u);
    atomic_store(own, 5u + (uint64_t)rank);
    if (tide_mp_boot_barrier(&b, 1, 10000) != TIDE_SUCCESS) return 17;
    for (int r = 0; r < ranks; ++r) {
        _Atomic uint64_t *f = (_Atomic uint64_t *)(void *)(tide_mp_ctl_flags(&c, r) +
                                                           FLAG_BYTES - 8u);
        if (atomic_load(f) != 5u + (uint64_t)r) return 18;
    }
    if (tide_mp_boot_barrier(&b, 2, 10000) != TIDE_SUCCESS) return 19;
    if (rank == ranks - 1) tide_mp_ctl_poison(&c, (uint64_t)1 << 62);
    if (tide_mp_boot_barrier(&b, 3, 10000) != TIDE_SUCCESS) return 20;
    for (int r = 0; r < ranks; ++r) {
        _Atomic uint64_t *f = (_Atomic uint64_t *)(void *)tide_mp_ctl_flags(&c, r);
        for (size_t i = 0; i < FLAG_BYTES / 8u; ++i)
            if (atomic_load(&f[i]) != (uint64_t)1 << 62) return 21;
    }
    /* The counters and the abort word are not flags: the poison left them alone. */
    if (tide_mp_ctl_aborted(&c, NULL, 0) != -1) return 22;
    /* A block with flags tells a rank whose device never began a call it enqueued. */
    tide_mp_ctl_enter(&c, 0, 0);
    tide_mp_ctl_enqueued(&c, 0, 0);
    if (rank != 1) tide_mp_ctl_began(&c, 0, 0);
    if (tide_mp_boot_barrier(&b, 4, 10000) != TIDE_SUCCESS) return 23;
    char why[256];
    if (tide_mp_ctl_missing(&c, 0, 0, why, sizeof(why)) != 1) return 24;
    if (strstr(why, "rank 1 (last: -1) enqueued all-gather call 0 but its device never began") ==
        NULL)
        return 25;
    if (tide_mp_boot_barrier(&b, 5, 10000) != TIDE_SUCCESS) return 26;
    if (rank == 1) tide_mp_ctl_began(&c, 0, 0);
    if (tide_mp_boot_barrier(&b, 6, 10000) != TIDE_SUCCESS) return 27;
    if (tide_mp_ctl_missing(&c, 0, 0, why, sizeof(why)) != -1) return 28;
    if (strstr(why, "every rank enqueued") == NULL) return 29;
    if (tide_mp_boot_barrier(&b, 7, 10000) != TIDE_SUCCESS) return 30;
    tide_mp_ctl_close(&c);
    tide_mp_boot_close(&b);
    return 0;
}

static void test_control_block_flags(void **state) {
    (void)state;
    char name[64];
    job_name(name, sizeof(name), "f");
    int status[16];
    run_children(3, flag_child, name, status);
    for (int r = 0; r < 3; ++r)
        if (status[r] != 0) print_error("rank %d: step %d\n", r, status[r]);
    for (int r = 0; r < 3; ++r)
        assert_int_equal(status[r], 0);
    /* A block without flags has none to give or poison. */
    tide_mp_ctl_t c;
    memset(&c, 0, sizeof(c));
    assert_null(tide_mp_ctl_flags(&c, 0));
    tide_mp_ctl_poison(&c, 1);
}

/* A block whose abort word the devices poll (mp_ctl.h, "Polled abort word";
 * TIDE_CUDA_MP_FLAGS=kernel): rank 0's choice reaches every rank whatever it passed, the block
 * is whole pages without flags (nothing to poison), every rank's view of the abort word is
 * the same memory, and the began counters name a rank whose device never began a call, as
 * in a block with flags.  A block rank 0 opened without it stays unmapped on every rank. */
static int polled_child(const char *name, int rank, int ranks) {
    tide_mp_boot_t b;
    if (tide_mp_boot_open(name, rank, ranks, 10000, &b) != TIDE_SUCCESS) return 10;
    tide_mp_ctl_t c;
    if (tide_mp_ctl_open_mapped(&b, 10000, 0, rank == 0, &c) != TIDE_SUCCESS) return 11;
    if (!c.abort_polled || !tide_mp_ctl_device_mapped(&c)) return 12;
    if (c.flags != NULL || c.flag_bytes != 0 || tide_mp_ctl_flags(&c, 0) != NULL) return 13;
    if (c.bytes == 0 || c.bytes % 4096u != 0) return 14;
    if (tide_mp_boot_barrier(&b, 1, 10000) != TIDE_SUCCESS) return 15;
    tide_mp_ctl_poison(&c, (uint64_t)1 << 62); /* no flags: must leave the counters alone */
    if (tide_mp_ctl_aborted(&c, NULL, 0) != -1) return 16;
    tide_mp_ctl_enter(&c, 1, 0);
    tide_mp_ctl_enqueued(&c, 1, 0);
    if (rank != 2) tide_mp_ctl_began(&c, 1, 0);
    if (tide_mp_boot_barrier(&b, 2, 10000) != TIDE_SUCCESS) return 17;
    char why[256];
    if (tide_mp_ctl_missing(&c, 1, 0, why, sizeof(why)) != 2) return 18;
    if (strstr(why, "rank 2 (last: -1) enqueued reduce-scatter call 0 but its device never "
                    "began") == NULL)
        return 19;
    if (tide_mp_boot_barrier(&b, 3, 10000) != TIDE_SUCCESS) return 20;
    /* The word a device would poll: rank 1's store is every rank's. */
    if (rank == 1 && !tide_mp_ctl_abort(&c, "rank 1 failed")) return 21;
    if (tide_mp_boot_barrier(&b, 4, 10000) != TIDE_SUCCESS) return 22;
    if (atomic_load(&c.hdr->abort) != 2u || tide_mp_ctl_aborted(&c, NULL, 0) != 1) return 23;
    tide_mp_ctl_close(&c);
    /* Rank 0 without it: nobody's block is mapped, whatever the others asked for. */
    if (tide_mp_ctl_open_mapped(&b, 10000, 0, rank != 0, &c) != TIDE_SUCCESS) return 24;
    if (c.abort_polled || tide_mp_ctl_device_mapped(&c)) return 25;
    tide_mp_ctl_close(&c);
    tide_mp_boot_close(&b);
    return 0;
}

static void test_control_block_polled(void **state) {
    (void)state;
    char name[64];
    job_name(name, sizeof(name), "p");
    int status[16];
    run_children(3, polled_child, name, status);
    for (int r = 0; r < 3; ++r)
        if (status[r] != 0) print_error("rank %d: step %d\n", r, status[r]);
    for (int r = 0; r < 3; ++r)
        assert_int_equal(status[r], 0);
}

/* A block that was never opened (the NCCL fabric's arenas): every call is safe and says
 * "no control block" (before, enter and enqueued wrote through NULL counters). */
static void test_closed_control_block(void **state) {
    (void)state;
    tide_mp_ctl_t c;
    memset(&c, 0, sizeof(c));
    c.rank = 1;
    c.ranks = 4;
    tide_mp_ctl_enter(&c, 0, 5);
    tide_mp_ctl_enqueued(&c, 1, 5);
    assert_int_equal(tide_mp_ctl_aborted(&c, NULL, 0), -1);
    char why[256] = {0};
    assert_int_equal(tide_mp_ctl_missing(&c, 1, 5, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "reduce-scatter call 5"));
    assert_non_null(strstr(why, "no control block"));
    assert_true(tide_mp_ctl_abort(&c, "first"));
    assert_int_equal(tide_mp_ctl_aborted(&c, NULL, 0), -1);
    int other = -2;
    uint64_t other_sig = 1;
    tide_mp_ctl_post(&c, 1, 0, 7); /* nothing to write to */
    assert_int_equal(tide_mp_ctl_compare(&c, 1, 0, 7, &other, &other_sig), 1);
    assert_int_equal(other, -1);
    tide_mp_ctl_close(&c);
    assert_null(c.hdr);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_closed_control_block),
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_exchange),
        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_missing_rank),
        cmocka_unit_test(test_dead_rank),
        cmocka_unit_test(test_control_block),
        cmocka_unit_test(test_argument_checks),
        cmocka_unit_test(test_control_block_flags),
        cmocka_unit_test(test_control_block_polled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
