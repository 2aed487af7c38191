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

/* A plan of `count` parameters on an m x l topology (bf16 all-gather), asserted to succeed;
 * the other config fields keep TIDE_CONFIG_INIT's defaults (wave_width 0 = L). */
static inline tide_plan_t test_plan_lane(int m, int l, int wave_width, int passes,
                                         tide_rs_mode_t mode, tide_dtype_t grad_dtype,
                                         tide_dtype_t shard_dtype, const tide_param_shape_t *shapes,
                                         int count, tide_lane_t lane) {
    tide_group_desc_t g = {count, shapes, TIDE_DTYPE_BF16, grad_dtype, shard_dtype};
    tide_config_t c = TIDE_CONFIG_INIT;
    c.nodes = m;
    c.gpus_per_node = l;
    c.wave_width = wave_width;
    c.passes = passes;
    c.mode = mode;
    c.lane = lane;
    tide_plan_t plan = NULL;
    assert_tide(TIDE_SUCCESS, tide_plan_create(&c, &g, &plan));
    return plan;
}

/* The same with the default lane (the rail lane at L = 1, M >= 2). */
static inline tide_plan_t test_plan(int m, int l, int wave_width, int passes, tide_rs_mode_t mode,
                                    tide_dtype_t grad_dtype, tide_dtype_t shard_dtype,
                                    const tide_param_shape_t *shapes, int count) {
    return test_plan_lane(m, l, wave_width, passes, mode, grad_dtype, shard_dtype, shapes, count,
                          TIDE_LANE_AUTO);
}

#endif /* TIDE_TEST_UTIL_H_ */
