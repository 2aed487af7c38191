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

/* Resolve cfg->lane for this communicator's fabric: AUTO becomes GENERIC where the fabric
 * does not run the rail lane (struct tide_fabric_ops.rail_lane), RAIL is refused there.
 * `who` prefixes the error ("group_register", "groups_register: entry 2"). */
struct tide_comm;
tide_result_t tide_comm_resolve_lane(const struct tide_comm *comm, const char *who,
                                     tide_config_t *cfg);

struct tide_comm {
    const struct tide_fabric_ops *ops;
    struct tide_fabric_world *world;
    tide_topo_t topo;
    int rank;
    int live_groups; /* registered and not yet deregistered */
};

/* Shared resources of a set, for the fence rule (arena_set.c): the landings (ring slots 0
 * and 1, then the own slot of set index i at 2 + i), the receive stage, the RS regions. */
#define TIDE_SET_RES_RECV(set) ((set)->num_groups + 2)
#define TIDE_SET_RES_RS(set) ((set)->num_groups + 3)

/* The groups registered together on one arena (tide_groups_register), one rank's view. */
struct tide_arena_set {
    struct tide_comm *comm;
    struct tide_arena_plan *ap;      /* owns the groups' plans */
    struct tide_fabric_arena *arena; /* one arena for all */
    int num_groups;
    int live_groups;                 /* registered and not yet deregistered */
    struct tide_group **groups;      /* by set index; NULL once deregistered */
    /* The ring: per landing (see TIDE_SET_RES_*) the group gathered into it last (-1: none)
     * and whether its data is live (gathered, not yet resharded or reduce-scattered). */
    int *occupant;
    bool *live;
    int *last_user;                  /* per resource: the set index of its last call, or -1 */
    uint64_t checks[2];              /* call signatures exchanged, per collective (the set's
                                        groups share the arena's records) */
    tide_result_t poison;            /* a call failed part-way: the shared regions are suspect */
    char poison_msg[512];
};

/* What a call of a set group uses (arena_set.c). */
typedef struct {
    int landing;      /* resource index of the group's landing, or -1 if untouched */
    bool recv;        /* the receive stage */
    bool rs;          /* the RS regions */
    bool takes_slot;  /* AG: the group becomes the live occupant */
    bool frees_slot;  /* RS reading gradients staged in the slot: the occupancy ends */
} tide_set_use_t;

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
    /* On a shared arena (NULL: registered alone, own arena): the set, the group's index and
     * name, and its cross-group fence program with the count of fences it ran. */
    struct tide_arena_set *set;
    int set_index;
    char name[TIDE_GROUP_NAME_MAX];
    tide_program_t fence[2]; /* [1]: zeroes the inbox first (fence.c) */
    uint64_t fences;         /* of either form: they share the counter */
    /* TIDE_RAN_* bits: the programs of which a call returned success.  A call of a program
     * that never ran cannot be captured (its first call prepares device state), and a
     * captured call succeeds only after an eager one: so a bit also says that the program
     * ran outside a capture (api/capture.c). */
    uint32_t ran;
};

#define TIDE_RAN_AG (1u << 0)
#define TIDE_RAN_RS(mode) (1u << (1 + (int)(mode)))
#define TIDE_RAN_FENCE(variant) (1u << (3 + (variant)))

/* FNV-1a over what decides a group's arena and programs (group.c): ranks that registered
 * different groups are told so instead of exchanging misplaced bytes. */
uint64_t tide_plan_signature(const struct tide_plan *plan);

/* ---- arena_set.c: groups on one arena */

/* Landing resource index of a set group: its ring slot, or 2 + its index for an own slot. */
int tide_set_landing(const struct tide_group *g);

/* The ring rule before a call (host state only): refuse an all-gather into a slot another
 * group holds live, and gradients staged in a slot another group holds live. */
tide_result_t tide_set_ring_check(const struct tide_group *g, const tide_set_use_t *use,
                                  const char *call);

/* The cross-group fence variant a call of g that uses `use` runs first: -1 for none (every
 * resource it touches was last used by g, or by nobody), 1 when it takes the RS regions over
 * from another group (that variant zeroes the inbox first), else 0.  The one copy of the
 * rule: tide_set_fence runs it, tide_group_capture_readiness asks it. */
int tide_set_fence_variant(const struct tide_group *g, const tide_set_use_t *use);

/* Run g's fence variant (tide_set_fence_variant) when the call needs one. */
tide_result_t tide_set_fence(struct tide_group *g, const tide_set_use_t *use, void *stream);

/* After a successful call: record the users and the ring's new state. */
void tide_set_note_call(struct tide_group *g, const tide_set_use_t *use);

/* Deregister a set group (its part of the collective release). */
tide_result_t tide_set_group_release(struct tide_group *g);

/* ---- group.c */

/* What a call of kind `kind` of a set group touches in its set (for the ring and the fence):
 * the call path and tide_group_capture_readiness both take it from here. */
void tide_group_call_use(const struct tide_group *g, tide_call_kind_t kind, tide_set_use_t *use);

/* Whether an earlier failure left g (or its set) unusable; if so its sentence in buf. */
bool tide_group_unusable(const struct tide_group *g, const char *call, char *buf, size_t size);

/* ---- capture.c: calls inside a CUDA graph capture */

/* The fabric-independent part of a capture verdict, from g's bookkeeping alone: whether the
 * program of bit `ran_bit` (TIDE_RAN_*), `what` in the reason, ran, and whether the fence
 * variant that `use` (NULL: a group alone) makes the call run first ran; added to v as
 * TIDE_CAPTURE_PROGRAM_COLD / TIDE_CAPTURE_FENCE_COLD.  Returns that variant (-1: none). */
int tide_capture_bookkeeping(const struct tide_group *g, uint32_t ran_bit, const char *what,
                             const tide_set_use_t *use, tide_capture_verdict_t *v);

/* Before a call of `prog` (bit ran_bit) moves anything: when `stream` is capturing, refuse
 * (TIDE_ERR_UNSUPPORTED, the first blocker's reason) a call that the capture could not hold,
 * on the verdict tide_group_capture_readiness returns (core's bookkeeping and the fabric's
 * capture_check, for the program and the fence variant it would run first). */
tide_result_t tide_capture_precheck(const struct tide_group *g, const tide_program_t *prog,
                                    uint32_t ran_bit, const char *what, const tide_set_use_t *use,
                                    void *stream, const char *call);

/* A communicator over a world that a fabric created outside tide_comm_init_all / _rank (the
 * NCCL fabric's, comm_nccl.c); the world's ops serve it.  The caller destroys the world when
 * this fails. */
tide_result_t tide_comm_adopt_world(const tide_topo_t *topo, struct tide_fabric_world *world,
                                    struct tide_comm **comm_out);

#endif /* TIDE_API_COMM_H_ */
