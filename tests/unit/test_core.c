/* test_core.c - result strings, versions, the last-error contract. */
#include "test_util.h"

#include "core/checks.h"

static void test_error_strings(void **state) {
    (void)state;
    for (int r = 0; r < TIDE_RESULT_COUNT; ++r) {
        const char *s = tide_get_error_string((tide_result_t)r);
        assert_non_null(s);
        assert_true(strlen(s) > 0);
        assert_string_not_equal(s, "unknown result code");
    }
    assert_string_equal(tide_get_error_string((tide_result_t)999), "unknown result code");
    assert_string_equal(tide_get_error_string((tide_result_t)-1), "unknown result code");
}

static void test_fixed_values(void **state) {
    (void)state;
    /* Result codes are ABI: never renumbered. */
    assert_int_equal(TIDE_SUCCESS, 0);
    assert_int_equal(TIDE_ERR_INVALID_ARGUMENT, 1);
    assert_int_equal(TIDE_ERR_UNSUPPORTED, 2);
    assert_int_equal(TIDE_ERR_PLAN_REJECTED, 5);
    assert_int_equal(TIDE_ERR_TIMEOUT, 7);
}

static void test_version_and_last_error(void **state) {
    (void)state;
    int v = -1;
    assert_int_equal(tide_get_version(&v), TIDE_SUCCESS);
    assert_int_equal(v, TIDE_VERSION_CODE);
    assert_int_equal(tide_get_version(NULL), TIDE_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(tide_get_last_error(), "version_out"));
    tide_error_clear();
    assert_string_equal(tide_get_last_error(), "");
}

/* A held failure's message survives later errors: saved, overwritten, restored; a message
 * longer than the buffer is cut, not overrun. */
static void test_error_restore(void **state) {
    (void)state;
    assert_int_equal(tide_get_version(NULL), TIDE_ERR_INVALID_ARGUMENT);
    char held[TIDE_ERROR_BYTES];
    snprintf(held, sizeof(held), "%s", tide_get_last_error());
    assert_non_null(strstr(held, "version_out"));
    (void)TIDE_ERR(TIDE_ERR_TIMEOUT, "a later step's error");
    assert_string_equal(tide_get_last_error(), "a later step's error");
    tide_error_restore(held);
    assert_string_equal(tide_get_last_error(), held);
    tide_error_restore(tide_get_last_error()); /* its own buffer: unchanged */
    assert_string_equal(tide_get_last_error(), held);
    char longer[2 * TIDE_ERROR_BYTES];
    memset(longer, 'x', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    tide_error_restore(longer);
    assert_int_equal(strlen(tide_get_last_error()), TIDE_ERROR_BYTES - 1);
    tide_error_clear();
}

static void test_dtype_size(void **state) {
    (void)state;
    assert_int_equal(tide_dtype_size(TIDE_DTYPE_BF16), 2);
    assert_int_equal(tide_dtype_size(TIDE_DTYPE_FP32), 4);
    assert_int_equal(tide_dtype_size(TIDE_DTYPE_FP16), 2);
    assert_int_equal(tide_dtype_size((tide_dtype_t)77), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_strings),
        cmocka_unit_test(test_fixed_values),
        cmocka_unit_test(test_version_and_last_error),
        cmocka_unit_test(test_error_restore),
        cmocka_unit_test(test_dtype_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
