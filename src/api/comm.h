/*
 * comm.h - the communicator and group objects behind tide_comm_t / tide_group_t.
 *
 * Fabric-neutral: a communicator is one rank's handle on a fabric world, a group one rank's
 * plan, programs and arenas.  Everything fabric-specific sits behind struct tide_fabric_ops.
 */
#ifndef TIDE_API_COMM_H_
#define TIDE_API_COMM_H_

#include "fabric/fabric.h"
#include "plan/plan.h"
#include "program/program.h"

#include <stdbool.h>
#include <stdint.h>

struct tide_comm {
    const struct tide_fabric_ops *ops;
    struct tide_fabric_world *world;
    tide_topo_t topo;
    int rank;
    int live_groups; /* registered and not yet deregistered */
};

struct tide_group {
    struct tide_comm *comm;
    struct tide_plan *plan;
    tide_program_t ag;
    tide_program_t rs[TIDE_RS_MODE_COUNT]; /* compiled on first use of a mode */
    bool rs_compiled[TIDE_RS_MODE_COUNT];
    struct tide_fabric_arena *arena;
    /* Epochs: counters are cumulative, so each call must know how many calls of the same
     * program ran before it on this group (both RS modes share the RS counters). */
    uint64_t ag_calls;
    uint64_t rs_calls;
    /* Call signatures exchanged per collective (fabric.h, call_check): advances with every
     * exchange, including calls refused afterwards, so no sequence number is posted twice. */
    uint64_t checks[2];
    /* A call that failed part-way left the counters inconsistent: the group only fails
     * afterwards (fail-stop), naming the first failure. */
    tide_result_t poison;
    char poison_msg[512];
};

/* A communicator over a world that a fabric created outside tide_comm_init_all / _rank (the
 * NCCL fabric's, comm_nccl.c); the world's ops serve it.  The caller destroys the world when
 * this fails. */
tide_result_t tide_comm_adopt_world(const tide_topo_t *topo, struct tide_fabric_world *world,
                                    struct tide_comm **comm_out);

#endif /* TIDE_API_COMM_H_ */
