/*
 * compile_lane.h - the rail lane's programs (L = 1, M >= 2; compile_lane.c, docs/protocol.md
 * "The rail lane").  tide_program_compile_ag / _rs call these for a plan whose
 * rs.rail_lane is set; the arena of such a plan has no receive stage, staging, outbox or
 * spare, and an inbox of two gradient-dtype blocks.
 */
#ifndef TIDE_PROGRAM_COMPILE_LANE_H_
#define TIDE_PROGRAM_COMPILE_LANE_H_

#include "program/program.h"

tide_result_t tide_program_compile_ag_lane(const struct tide_plan *plan, tide_program_t *prog_out);
/* Both modes compile the same ops: the lane has no outbox whose depth the mode would set. */
tide_result_t tide_program_compile_rs_lane(const struct tide_plan *plan, tide_rs_mode_t mode,
                                           tide_program_t *prog_out);

#endif /* TIDE_PROGRAM_COMPILE_LANE_H_ */
