/* test_util.h - cmocka includes and small helpers shared by the unit tests. */
#ifndef TIDE_TEST_UTIL_H_
#define TIDE_TEST_UTIL_H_

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tide.h"

/* Assert a call returns the expected result; prints the last error on mismatch. */
#define assert_tide(expected, call)                                                             \
    do {                                                                                        \
        tide_result_t r_ = (call);                                                              \
        if (r_ != (expected))                                                                   \
            print_error("%s -> %d (%s), last error: %s\n", #call, (int)r_,                      \
                        tide_get_error_string(r_), tide_get_last_error());                      \
        assert_int_equal(r_, (expected));                                                       \
    } while (0)

#endif /* TIDE_TEST_UTIL_H_ */
