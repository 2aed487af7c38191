/*
 * check_ring.h - invariant I5 of a set of groups on one shared arena (docs/arena.md): no
 * landing into a ring slot whose occupant is live.
 *
 * The ring is modelled as data: the groups' landings (ring slot 0 or 1, or an own slot) and a
 * sequence of calls on them, as FSDP2 makes them (forward all-gathers and reshards, backward
 * all-gathers and reduce-scatters).  tide_ring_check replays the sequence and reports the
 * first call that lands into, or stages gradients in, a landing another group holds live.
 * Fault injection on a sequence (tide_ring_fault_inject) models the ways an adapter gets the
 * ring wrong; tests/unit/test_faults.c shows each is caught.  The runtime enforces the same
 * rule call by call (api/arena_set.c); this is the whole-sequence proof a planner or an
 * adapter runs before the first step.
 */
#ifndef TIDE_PROGRAM_CHECK_RING_H_
#define TIDE_PROGRAM_CHECK_RING_H_

#include "tide.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum {
    TIDE_RING_CALL_AG = 0,        /* all-gather into the group's landing: it becomes live */
    TIDE_RING_CALL_RESHARD = 1,   /* the group's unsharded parameters are dead */
    TIDE_RING_CALL_RS = 2,        /* reduce-scatter from autograd's storage (In-Place) */
    TIDE_RING_CALL_RS_STAGED = 3, /* Slot-Reuse: gradients staged in the landing, then read;
                                     the occupancy ends at read-done */
    TIDE_RING_CALL_KIND_COUNT = 4
} tide_ring_call_kind_t;

typedef struct {
    int group;
    int kind; /* tide_ring_call_kind_t */
} tide_ring_call_t;

typedef struct {
    int num_groups;
    const int *ring_slot;     /* per group: 0, 1 or TIDE_RING_OWN_SLOT */
    const char *const *names; /* per group, for messages; may be NULL */
    int num_calls;
    const tide_ring_call_t *calls;
} tide_ring_seq_t;

typedef struct {
    int ok;     /* 1: no call lands into or stages in a live landing of another group */
    int call;   /* the first violating call (-1 when ok) */
    int holder; /* the group that held the landing live */
    char message[320];
} tide_ring_report_t;

/* Replay `seq`; TIDE_SUCCESS with the verdict in *report_out, or an error for a malformed
 * sequence (group or kind out of range). */
tide_result_t tide_ring_check(const tide_ring_seq_t *seq, tide_ring_report_t *report_out);

/*
 * FSDP2's call order over `steps` steps for `blocks` blocks on ring slots b mod 2, plus a root
 * on an own slot when `root` (the last group): forward root AG, then AG + reshard per block;
 * backward per block in reverse AG then RS (In-Place: reshard first) or RS_STAGED
 * (Slot-Reuse); the root's reduce-scatter last.  *calls_out is malloc'ed.
 */
tide_result_t tide_ring_fsdp_calls(int blocks, int root, tide_rs_mode_t mode, int steps,
                                   tide_ring_call_t **calls_out, int *num_calls_out);

typedef enum {
    TIDE_RING_FAULT_DROP_RESHARD = 0, /* a forward reshard removed */
    TIDE_RING_FAULT_SAME_SLOT = 1,    /* a block put on its predecessor's slot */
    TIDE_RING_FAULT_EARLY_AG = 2,     /* a backward AG moved before the previous occupant's RS */
    TIDE_RING_FAULT_KIND_COUNT = 3
} tide_ring_fault_t;

const char *tide_ring_fault_name(tide_ring_fault_t fault);

/* Mutate `calls` / `ring_slot` in place at eligible site `seed mod count` (count: sites of
 * the kind); TIDE_ERR_UNSUPPORTED when the kind has none. */
tide_result_t tide_ring_fault_inject(tide_ring_fault_t fault, uint64_t seed, int num_groups,
                                     int *ring_slot, int num_calls, tide_ring_call_t *calls);

#endif /* TIDE_PROGRAM_CHECK_RING_H_ */
