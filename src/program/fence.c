/*
 * fence.c - the cross-group fence (docs/arena.md, docs/protocol.md "Cross-group fence").
 *
 * Groups on one arena share regions (a ring slot, the receive stage, the RS regions), but
 * their counters are their own, so nothing in a group's program orders its call after another
 * group's call on a peer.  The fence does: before a call whose shared regions another group
 * used last, every rank raises TIDE_CTR_FENCE of the new group on every rank and waits until
 * its own counter has all N.  A rank raises only after its part of the previous call is
 * complete (the fabric runs the fence after it), so passing the fence means no rank still
 * reads or writes for the previous call.  It is an ordinary program, so every fabric that
 * runs programs runs it: CPU counters in shm, stream writes / waits on a GPU.
 *
 * The inbox variant first zeroes the rank's inbox (the group's extent of it).  A group's RS
 * program zeroes only the inbox blocks its own previous call left stale (the plan's zero
 * masks); every other block it reads must be zero, as in a fresh arena.  Another group's call
 * leaves other blocks written, so the first RS of a group after another group's RS starts
 * from a zeroed inbox.  Zeroing precedes the signals: no peer puts into it before.
 */
#include "core/checks.h"
#include "program/counters.h"
#include "program/program.h"

tide_result_t tide_program_compile_fence(const struct tide_plan *plan, bool zero_inbox,
                                         tide_program_t *prog_out) {
    TIDE_ARG_CHECK(plan != NULL && prog_out != NULL, "fence: plan and prog_out must be non-NULL");
    tide_program_t prog;
    TIDE_CHECK(tide_program_init(plan, TIDE_COLL_ALL_GATHER, TIDE_RS_IN_PLACE, &prog));
    prog.fence = zero_inbox ? 2 : 1;
    const int n = plan->topo.ranks;
    tide_result_t res = TIDE_SUCCESS;
    const uint64_t inbox = plan->arena.regions[TIDE_REGION_INBOX].bytes;
    for (int r = 0; r < n && res == TIDE_SUCCESS; ++r) {
        if (zero_inbox && inbox > 0) {
            /* Before the signals: no peer puts into this inbox before it is zero. */
            tide_op_t z = tide_op_new(TIDE_OP_ZERO);
            z.dst = tide_ref_arena(r, TIDE_REGION_INBOX, 0);
            z.bytes = inbox;
            res = tide_program_push(&prog, r, TIDE_Q_CALLER, &z);
            if (res != TIDE_SUCCESS) break;
        }
        /* Start with the next rank, so the N signals of a fence do not all hit rank 0 first. */
        for (int i = 1; i <= n && res == TIDE_SUCCESS; ++i) {
            const tide_op_t sig = tide_op_signal((r + i) % n, TIDE_CTR_FENCE);
            res = tide_program_push(&prog, r, TIDE_Q_CALLER, &sig);
        }
        if (res != TIDE_SUCCESS) break;
        const tide_op_t wait = tide_op_wait(r, TIDE_CTR_FENCE, n, n);
        res = tide_program_push(&prog, r, TIDE_Q_CALLER, &wait);
    }
    if (res != TIDE_SUCCESS) {
        tide_program_free(&prog);
        return res;
    }
    *prog_out = prog;
    return TIDE_SUCCESS;
}
