/*
 * group_test_hooks.c - swap a registered group's program for a mutated one (fault injection
 * on a real fabric, tests/unit/test_faults.c).  See group_test_hooks.h.
 */
#include "api/group_test_hooks.h"

#include "core/checks.h"
#include "api/comm.h"

#include <string.h>

static tide_result_t check_args(tide_group_t g, tide_collective_t coll, tide_rs_mode_t mode) {
    TIDE_ARG_CHECK(g != NULL, "test hook: group is NULL");
    TIDE_ARG_CHECK(coll == TIDE_COLL_ALL_GATHER || coll == TIDE_COLL_REDUCE_SCATTER,
                   "test hook: collective %d", (int)coll);
    TIDE_ARG_CHECK((unsigned)mode < TIDE_RS_MODE_COUNT, "test hook: mode %d", (int)mode);
    return TIDE_SUCCESS;
}

tide_result_t tide_group_test_set_program(tide_group_t g, tide_collective_t coll,
                                          tide_rs_mode_t mode, tide_program_t *prog) {
    TIDE_CHECK(check_args(g, coll, mode));
    TIDE_ARG_CHECK(prog != NULL && prog->ranks != NULL, "test hook: program is NULL or empty");
    TIDE_ARG_CHECK(prog->plan == g->plan,
                   "test hook: the program was compiled for another plan than the group's");
    TIDE_ARG_CHECK(prog->coll == coll, "test hook: program of collective %d swapped in as %d",
                   (int)prog->coll, (int)coll);
    const uint64_t calls = coll == TIDE_COLL_ALL_GATHER ? g->ag_calls : g->rs_calls;
    TIDE_ARG_CHECK(calls == 0, "test hook: the group already ran %llu call(s) of this collective",
                   (unsigned long long)calls);
    if (coll == TIDE_COLL_ALL_GATHER) {
        tide_program_free(&g->ag);
        g->ag = *prog;
    } else {
        if (g->rs_compiled[mode]) tide_program_free(&g->rs[mode]);
        g->rs[mode] = *prog;
        g->rs_compiled[mode] = true;
    }
    memset(prog, 0, sizeof(*prog));
    return TIDE_SUCCESS;
}

tide_result_t tide_group_test_program(tide_group_t g, tide_collective_t coll, tide_rs_mode_t mode,
                                      const tide_program_t **prog_out) {
    TIDE_CHECK(check_args(g, coll, mode));
    TIDE_ARG_CHECK(prog_out != NULL, "test hook: prog_out is NULL");
    if (coll == TIDE_COLL_ALL_GATHER) {
        *prog_out = &g->ag;
        return TIDE_SUCCESS;
    }
    if (!g->rs_compiled[mode]) {
        TIDE_CHECK(tide_program_compile_rs(g->plan, mode, &g->rs[mode]));
        g->rs_compiled[mode] = true;
    }
    *prog_out = &g->rs[mode];
    return TIDE_SUCCESS;
}
