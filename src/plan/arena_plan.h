/*
 * arena_plan.h - the plan of one arena shared by a set of groups (docs/arena.md).
 *
 * Owns one full plan per group (planned alone, then with its region table pointed into the
 * shared arena), the arena-level layout, and the groups' ring positions.  Pure host C.
 */
#ifndef TIDE_PLAN_ARENA_PLAN_H_
#define TIDE_PLAN_ARENA_PLAN_H_

#include "plan/plan.h"

#include <stdbool.h>
#include <stdint.h>

/* Groups of one set: a model's FSDP2 groups (torchtitan's 80-block 70B model has 81). */
#define TIDE_ARENA_MAX_GROUPS 4096

typedef struct {
    struct tide_plan *plan; /* owned; regions point into the shared arena */
    int ring_slot;          /* 0, 1 or TIDE_RING_OWN_SLOT */
    char name[TIDE_GROUP_NAME_MAX];
    uint64_t own_offset;      /* the own slot's offset (ring_slot < 0) */
    uint64_t block_offset[2]; /* resident, signals */
    uint64_t alone_bytes;     /* the arena the group would get registered alone */
} tide_arena_member_t;

struct tide_arena_plan {
    int num_groups;
    tide_topo_t topo;
    tide_arena_member_t *groups; /* num_groups entries, in entry order */
    tide_arena_layout_t layout;  /* arena-level extents; total_bytes is the arena per rank */
    uint64_t own_slot_bytes;
    uint64_t per_group_bytes[2]; /* resident, signals: sums over the groups */
};

#endif /* TIDE_PLAN_ARENA_PLAN_H_ */
