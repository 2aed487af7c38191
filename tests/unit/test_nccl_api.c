/*
 * test_nccl_api.c - the NCCL fabric's public calls where no NCCL communicator can exist: every
 * refusal is a clear error, never a crash, and the output is left unwritten.
 *
 *  - every build: NULL outputs, NULL ids and communicators, topologies and ranks out of range
 *    are TIDE_ERR_INVALID_ARGUMENT; tide_comm_init_rank(TIDE_FABRIC_NCCL, ...) is refused;
 *  - the CPU build (no TIDE_HAVE_NCCL): the calls are TIDE_ERR_UNSUPPORTED saying the fabric
 *    is not built and how to build it;
 *  - an NCCL build: M = 2 is TIDE_ERR_UNSUPPORTED before any NCCL call without the opt-in
 *    TIDE_NCCL_RAILS=1 (the message names it), TIDE_ERR_INVALID_ARGUMENT for another value;
 *    with it the call goes on to the library (the missing-library child below); a missing library
 *    (TIDE_NCCL_LIBRARY naming a file that does not exist, and no libnccl in the process) is
 *    TIDE_ERR_UNSUPPORTED naming both places tried, with NCCL_NVLS_ENABLE=0 left as it is.
 *    These run before any CUDA call, so they need no GPU.  The refusal of a nonzero
 *    NCCL_NVLS_ENABLE is not exercised: no test process runs with multicast enabled.
 */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static tide_comm_t const SENTINEL = (tide_comm_t)(uintptr_t)0x5e17;

static void test_arguments(void **state) {
    (void)state;
    uint8_t id[TIDE_NCCL_UNIQUE_ID_BYTES];
    memset(id, 0, sizeof(id));
    tide_comm_t comm = SENTINEL;
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_nccl_get_unique_id(NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_nccl(1, 1, 0, id, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_nccl(1, 1, 0, NULL, &comm));
    assert_non_null(strstr(tide_get_last_error(), "nccl_unique_id is NULL"));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_nccl(0, 1, 0, id, &comm));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT,
                tide_comm_init_nccl(1, TIDE_MAX_GPUS_PER_NODE + 1, 0, id, &comm));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_nccl(1, 2, 2, id, &comm));
    assert_non_null(strstr(tide_get_last_error(), "rank 2 outside"));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_nccl(1, 2, -1, id, &comm));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_nccl_comm(NULL, 1, 1, &comm));
    assert_non_null(strstr(tide_get_last_error(), "nccl_comm is NULL"));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_nccl_comm((void *)id, 1, 1, NULL));
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_nccl_comm((void *)id, 1, 0, &comm));
    /* The NCCL fabric is not a tide_comm_init_rank / _all fabric: it needs an id or a comm. */
    assert_int_not_equal(tide_comm_init_rank(TIDE_FABRIC_NCCL, 1, 1, 0, "job", &comm),
                         TIDE_SUCCESS);
    assert_int_not_equal(tide_comm_init_all(TIDE_FABRIC_NCCL, 1, 1, &comm), TIDE_SUCCESS);
    assert_ptr_equal(comm, SENTINEL);
}

#ifndef TIDE_HAVE_NCCL

static void test_not_built(void **state) {
    (void)state;
    uint8_t id[TIDE_NCCL_UNIQUE_ID_BYTES];
    memset(id, 0, sizeof(id));
    tide_comm_t comm = SENTINEL;
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_nccl_get_unique_id(id));
    assert_non_null(strstr(tide_get_last_error(), "not built"));
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_comm_init_nccl(1, 1, 0, id, &comm));
    assert_non_null(strstr(tide_get_last_error(), "TIDE_WITH_NCCL"));
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_comm_init_nccl_comm((void *)id, 1, 1, &comm));
    assert_non_null(strstr(tide_get_last_error(), "not built"));
    assert_ptr_equal(comm, SENTINEL);
}

#else

static void test_nodes(void **state) {
    (void)state;
    uint8_t id[TIDE_NCCL_UNIQUE_ID_BYTES];
    memset(id, 0, sizeof(id));
    tide_comm_t comm = SENTINEL;
    /* Unset and "0": refused, naming the opt-in. */
    unsetenv("TIDE_NCCL_RAILS");
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_comm_init_nccl(2, 1, 0, id, &comm));
    assert_non_null(strstr(tide_get_last_error(), "2 nodes"));
    assert_non_null(strstr(tide_get_last_error(), "ncclSend"));
    assert_non_null(strstr(tide_get_last_error(), "TIDE_NCCL_RAILS=1"));
    setenv("TIDE_NCCL_RAILS", "0", 1);
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_comm_init_nccl(3, 2, 5, id, &comm));
    assert_non_null(strstr(tide_get_last_error(), "3 nodes"));
    assert_non_null(strstr(tide_get_last_error(), "TIDE_NCCL_RAILS=1"));
    assert_tide(TIDE_ERR_UNSUPPORTED, tide_comm_init_nccl_comm((void *)id, 2, 1, &comm));
    assert_non_null(strstr(tide_get_last_error(), "TIDE_NCCL_RAILS=1"));
    /* Any other value: an argument error, still before any NCCL call. */
    setenv("TIDE_NCCL_RAILS", "yes", 1);
    assert_tide(TIDE_ERR_INVALID_ARGUMENT, tide_comm_init_nccl(2, 1, 0, id, &comm));
    assert_non_null(strstr(tide_get_last_error(), "TIDE_NCCL_RAILS=yes"));
    unsetenv("TIDE_NCCL_RAILS");
    /* No refusal wrote the output. */
    assert_ptr_equal(comm, SENTINEL);
}

/* In a child: a missing library (TIDE_NCCL_LIBRARY naming nothing, none in the process).
 * NCCL_NVLS_ENABLE stays 0 in every process these tests start (multicast must never be
 * enabled, even by its absence), so the library's "an unset value becomes 0" branch is not
 * exercised here; the check is that 0 is accepted and left as it is.  Exit 0 when all held. */
static int no_library_child(void) {
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    setenv("TIDE_NCCL_LIBRARY", "/nonexistent/tide-test/libnccl.so.2", 1);
    uint8_t id[TIDE_NCCL_UNIQUE_ID_BYTES];
    tide_comm_t comm = SENTINEL;
    int bad = 0;
    if (tide_nccl_get_unique_id(id) != TIDE_ERR_UNSUPPORTED) bad |= 1;
    const char *msg = tide_get_last_error();
    if (strstr(msg, "libnccl.so.2 is not loaded in this process") == NULL) bad |= 2;
    if (strstr(msg, "/nonexistent/tide-test/libnccl.so.2") == NULL) bad |= 4;
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    if (nvls == NULL || strcmp(nvls, "0") != 0) bad |= 8;
    if (tide_comm_init_nccl(1, 1, 0, id, &comm) != TIDE_ERR_UNSUPPORTED) bad |= 16;
    if (comm != SENTINEL) bad |= 32;
    /* With the opt-in, M = 2 passes the rails gate and fails at the library, the same way
     * (no communicator is ever attempted without one). */
    setenv("TIDE_NCCL_RAILS", "1", 1);
    if (tide_comm_init_nccl(2, 1, 0, id, &comm) != TIDE_ERR_UNSUPPORTED) bad |= 64;
    if (strstr(tide_get_last_error(), "/nonexistent/tide-test/libnccl.so.2") == NULL) bad |= 128;
    if (comm != SENTINEL) bad |= 256;
    unsetenv("TIDE_NCCL_RAILS");
    if (bad)
        fprintf(stderr, "no-library child: checks failed (mask %d), last error: %s\n", bad,
                tide_get_last_error());
    return bad ? 1 : 0;
}

static void test_no_library(void **state) {
    (void)state;
    fflush(NULL);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(no_library_child());
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),
#ifndef TIDE_HAVE_NCCL
        cmocka_unit_test(test_not_built),
#else
        cmocka_unit_test(test_nodes),
        cmocka_unit_test(test_no_library),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
