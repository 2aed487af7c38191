/*
 * capture.c - calls inside a CUDA graph capture, seen from core: which capture a stream is
 * part of (tide_stream_capture_key), and whether a call of a group could be captured now
 * (tide_group_capture_readiness), before anything moves.
 *
 * A verdict has two halves.  Core's bookkeeping, the same on every fabric: the group is
 * usable, the call's program ran before (its first call prepares device state, which a
 * capture cannot hold), and so did the cross-group fence variant the call would run first on
 * a shared arena (tide_set_fence_variant: which one depends on the set's earlier calls).  The
 * fabric's half (fabric.h, capture_check): whether it captures such calls at all, and whether
 * another capture holds its streams or the set's siblings.  The call path refuses a captured
 * call on this verdict (tide_capture_precheck) and tide_group_capture_readiness returns it:
 * one implementation, so that a caller routing calls around a capture (tide.fsdp's
 * capture="tide") never predicts with a copy of the rules.
 *
 * Callers that route calls around a capture also need the capture's identity, which torch
 * does not expose: two captures with no call in between are otherwise indistinguishable, and
 * the library refuses a set's calls spread over two graphs (tide_stream_capture_key).
 */
#include "core/checks.h"
#include "api/comm.h"
#include "core/handles.h"
#include "fabric/fabric.h"
#include "tide.h"

#include <stdio.h>
#include <string.h>

tide_result_t tide_stream_capture_key(void *stream, uint64_t *key_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(key_out != NULL, "stream_capture_key: key_out is NULL");
#ifdef TIDE_HAVE_CUDA
    return tide_cuda_stream_capture_key(stream, key_out);
#else
    (void)stream;
    return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "stream_capture_key: this libtide is built without CUDA "
                                          "(cmake -DTIDE_WITH_CUDA=ON)");
#endif
}

/* "group "name"" for a set member, "the group" for a group registered alone (no name). */
static const char *who(const struct tide_group *g, char *buf, size_t size) {
    if (g->set == NULL || g->name[0] == '\0') return "the group";
    snprintf(buf, size, "group \"%s\"", g->name);
    return buf;
}

int tide_capture_bookkeeping(const struct tide_group *g, uint32_t ran_bit, const char *what,
                             const tide_set_use_t *use, tide_capture_verdict_t *v) {
    char name[TIDE_GROUP_NAME_MAX + 16];
    if ((g->ran & ran_bit) == 0)
        tide_capture_block(v, TIDE_CAPTURE_PROGRAM_COLD,
                           "%s: the first call of a program (its %s) cannot be captured into a "
                           "CUDA graph: it prepares the program's device state; call it once "
                           "outside the capture first",
                           who(g, name, sizeof(name)), what);
    const int variant = use != NULL && g->set != NULL ? tide_set_fence_variant(g, use) : -1;
    if (variant >= 0 && (g->ran & TIDE_RAN_FENCE(variant)) == 0)
        tide_capture_block(v, TIDE_CAPTURE_FENCE_COLD,
                           "%s: its %s runs the cross-group fence (variant %d: %s) first, which "
                           "never ran outside a capture: the first call of a program cannot be "
                           "captured into a CUDA graph; run the calls in this order outside the "
                           "capture first",
                           who(g, name, sizeof(name)), what, variant,
                           variant == 1 ? "the reduce-scatter regions change hands"
                                        : "a landing or the receive stage changes hands");
    return variant;
}

/* The verdict on a call of `prog` (bit ran_bit) of g on `stream`; *key_out as capture_check. */
static tide_result_t verdict(const struct tide_group *g, const tide_program_t *prog,
                             uint32_t ran_bit, const char *what, const tide_set_use_t *use,
                             void *stream, const char *call, uint64_t *key_out,
                             tide_capture_verdict_t *v) {
    memset(v, 0, sizeof(*v));
    *key_out = 0;
    char why[sizeof(v->why[0])];
    if (tide_group_unusable(g, call, why, sizeof(why)))
        tide_capture_block(v, TIDE_CAPTURE_UNUSABLE, "%s", why);
    const int variant = tide_capture_bookkeeping(g, ran_bit, what, use, v);
    const struct tide_fabric_ops *ops = g->comm->ops;
    if (ops->capture_check == NULL) {
        tide_capture_block(v, TIDE_CAPTURE_NO_FABRIC,
                           "the %s fabric captures no call into a CUDA graph (the CUDA "
                           "fabric does: tide.h, \"CUDA graphs\")",
                           ops->name);
        return TIDE_SUCCESS;
    }
    TIDE_CHECK(ops->capture_check(g->arena, prog, stream, key_out, v));
    if (variant >= 0) {
        uint64_t key = 0;
        TIDE_CHECK(ops->capture_check(g->arena, &g->fence[variant], stream, &key, v));
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_capture_precheck(const struct tide_group *g, const tide_program_t *prog,
                                    uint32_t ran_bit, const char *what, const tide_set_use_t *use,
                                    void *stream, const char *call) {
    /* A fabric that captures nothing does not look at streams (the CPU fabric's are NULL). */
    const struct tide_fabric_ops *ops = g->comm->ops;
    if (ops->capture_check == NULL) return TIDE_SUCCESS;
    tide_capture_verdict_t v;
    uint64_t key = 0;
    /* An eager call (the common case) stops at the stream's capture status. */
    memset(&v, 0, sizeof(v));
    TIDE_CHECK(ops->capture_check(g->arena, prog, stream, &key, &v));
    if (key == 0) return TIDE_SUCCESS;
    TIDE_CHECK(verdict(g, prog, ran_bit, what, use, stream, call, &key, &v));
    if (key == 0) return TIDE_SUCCESS; /* eager */
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "%s: ", call);
    return tide_capture_refuse(&v, prefix);
}

tide_result_t tide_group_capture_readiness(tide_group_t group, tide_call_kind_t call, void *stream,
                                           tide_capture_readiness_t *readiness_out) {
    tide_error_clear();
    const char *fn = "group_capture_readiness";
    TIDE_CHECK(tide_handle_check(group, TIDE_HANDLE_GROUP, fn));
    TIDE_ARG_CHECK((unsigned)call < TIDE_CALL_KIND_COUNT,
                   "%s: call = %d is not a tide_call_kind_t (TIDE_CALL_ALL_GATHER, "
                   "TIDE_CALL_REDUCE_SCATTER, TIDE_CALL_REDUCE_SCATTER_STAGED)",
                   fn, (int)call);
    TIDE_ARG_CHECK(readiness_out != NULL, "%s: readiness_out is NULL", fn);
    /* The reduce-scatter of the group's mode: the one its registration compiled. */
    const tide_rs_mode_t mode = group->plan->config.mode;
    const bool ag = call == TIDE_CALL_ALL_GATHER;
    tide_set_use_t use;
    tide_group_call_use(group, call, &use);
    tide_capture_verdict_t v;
    uint64_t key = 0;
    TIDE_CHECK(verdict(group, ag ? &group->ag : &group->rs[mode],
                       ag ? TIDE_RAN_AG : TIDE_RAN_RS(mode),
                       ag                         ? "all-gather"
                       : mode == TIDE_RS_IN_PLACE ? "In-Place reduce-scatter"
                                                  : "Slot-Reuse reduce-scatter",
                       group->set != NULL ? &use : NULL, stream, fn, &key, &v));
    readiness_out->blockers = v.blockers;
    tide_capture_reason(&v, readiness_out->reason, sizeof(readiness_out->reason));
    return TIDE_SUCCESS;
}
