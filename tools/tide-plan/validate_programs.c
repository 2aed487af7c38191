/*
 * validate_programs.c - `tide-plan validate --programs`: the static checker (check.h: INC,
 * I1-I4, bounds) on the compiled TIDE-AG and TIDE-RS programs of every M in [1, Mmax] at the
 * given L, over three consecutive calls.
 *
 * The schedule validation above proves the RS schedule; this pass proves the programs the
 * fabrics run, including the rail lane that L = 1 selects (docs/protocol.md): for each M both
 * lanes where they differ (the default and, at L = 1, the generic programs), one and two
 * passes, both modes, bf16 and a casting group (fp32 masters, fp32 gradients).  The group is
 * small and padded (rows that do not divide by N, a parameter with fewer rows than ranks), so
 * that I1 is traced for every N up to 64, the checker's limit.
 */
#include "tide-plan/cli.h"

#include "plan/plan.h"
#include "program/check.h"
#include "program/program.h"

#include <stdio.h>
#include <string.h>

static void note_failure(cli_programs_result_t *r, int m, int l, int lane, int passes, int mode,
                         int cast, const char *what) {
    ++r->failed;
    if (r->first_failure[0] != '\0') return;
    snprintf(r->first_failure, sizeof(r->first_failure), "M %d L %d lane %s passes %d %s %s: %s", m,
             l, lane ? "generic" : "default", passes, mode ? "slot-reuse" : "in-place",
             cast ? "cast" : "bf16", what);
}

/* Check one compiled program; false on a library error (reported in r). */
static bool check_one(const tide_program_t *prog, cli_programs_result_t *r, int m, int l, int lane,
                      int passes, int mode, int cast, const char *coll) {
    tide_check_report_t rep;
    tide_result_t res = tide_program_check(prog, 3, &rep);
    if (res != TIDE_SUCCESS) {
        note_failure(r, m, l, lane, passes, mode, cast, "check failed to run");
        return false;
    }
    ++r->checked;
    if (!rep.ok || !rep.i1_checked) {
        char what[480];
        snprintf(what, sizeof(what), "%s: %s %.400s", coll,
                 rep.ok ? "I1 not traced" : tide_check_invariant_name(rep.violated), rep.message);
        note_failure(r, m, l, lane, passes, mode, cast, what);
    }
    return true;
}

bool cli_validate_programs(int l, int mmax, cli_programs_result_t *r) {
    memset(r, 0, sizeof(*r));
    for (int m = 1; m <= mmax; ++m) {
        const uint64_t n = (uint64_t)m * (uint64_t)l;
        const tide_param_shape_t shapes[] = {{2 * n - 1, 3}, {5, 8}, {n + 1, 1}};
        for (int lane = 0; lane < (l == 1 && m >= 2 ? 2 : 1); ++lane)
            for (int passes = 1; passes <= 2; ++passes)
                for (int cast = 0; cast < 2; ++cast) {
                    tide_group_desc_t g = {3, shapes, TIDE_DTYPE_BF16,
                                           cast ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16,
                                           cast ? TIDE_DTYPE_FP32 : TIDE_DTYPE_BF16};
                    tide_config_t c = TIDE_CONFIG_INIT;
                    c.nodes = m;
                    c.gpus_per_node = l;
                    c.passes = passes;
                    c.lane = lane ? TIDE_LANE_GENERIC : TIDE_LANE_AUTO;
                    tide_plan_t plan = NULL;
                    tide_program_t ag;
                    if (tide_plan_create(&c, &g, &plan) != TIDE_SUCCESS ||
                        tide_program_compile_ag(plan, &ag) != TIDE_SUCCESS) {
                        note_failure(r, m, l, lane, passes, 0, cast, tide_get_last_error());
                        tide_plan_destroy(plan);
                        continue;
                    }
                    bool ok = check_one(&ag, r, m, l, lane, passes, 0, cast, "AG");
                    tide_program_free(&ag);
                    for (int mode = 0; ok && mode < TIDE_RS_MODE_COUNT; ++mode) {
                        /* The RS program is compiled for the mode the plan was made for. */
                        tide_plan_t pm = NULL;
                        tide_program_t rs;
                        c.mode = (tide_rs_mode_t)mode;
                        if (tide_plan_create(&c, &g, &pm) != TIDE_SUCCESS ||
                            tide_program_compile_rs(pm, (tide_rs_mode_t)mode, &rs) !=
                                TIDE_SUCCESS) {
                            note_failure(r, m, l, lane, passes, mode, cast, tide_get_last_error());
                            tide_plan_destroy(pm);
                            continue;
                        }
                        ok = check_one(&rs, r, m, l, lane, passes, mode, cast, "RS");
                        tide_program_free(&rs);
                        tide_plan_destroy(pm);
                    }
                    tide_plan_destroy(plan);
                    if (!ok) return false;
                }
    }
    return true;
}
