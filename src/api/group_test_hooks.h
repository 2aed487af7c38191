/*
 * group_test_hooks.h - test-only access to a registered group's programs (fault injection
 * runs mutated programs on a real fabric).  Not part of the public API: tests link the static
 * library and include this header from src/.
 */
#ifndef TIDE_API_GROUP_TEST_HOOKS_H_
#define TIDE_API_GROUP_TEST_HOOKS_H_

#include "program/program.h"
#include "tide.h"

/*
 * Replace this rank's program of `coll` (and `mode` for the reduce-scatter) with *prog,
 * which must be compiled for the group's own plan (tide_group_plan).  The group takes
 * ownership: the old program is freed and *prog is zeroed.  Only before the first call of
 * that collective on the group (counters are cumulative: a program swapped in later would
 * start at the wrong epoch).  Every rank of the group must swap in the same program.
 */
tide_result_t tide_group_test_set_program(tide_group_t g, tide_collective_t coll,
                                          tide_rs_mode_t mode, tide_program_t *prog);

/* This rank's current program of `coll` / `mode` (compiled on demand for an RS mode). */
tide_result_t tide_group_test_program(tide_group_t g, tide_collective_t coll, tide_rs_mode_t mode,
                                      const tide_program_t **prog_out);

#endif /* TIDE_API_GROUP_TEST_HOOKS_H_ */
