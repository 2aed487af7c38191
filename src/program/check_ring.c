/*
 * check_ring.c - invariant I5 on a sequence of group calls (check_ring.h, docs/arena.md), and
 * FSDP2's call order with prefetch depth one, the order the two-slot ring is built for.
 */
#include "program/check_ring.h"

#include "core/checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *name_of(const tide_ring_seq_t *seq, int g, char *buf, size_t size) {
    if (seq->names != NULL && seq->names[g] != NULL)
        snprintf(buf, size, "\"%s\"", seq->names[g]);
    else
        snprintf(buf, size, "group %d", g);
    return buf;
}

/* Landing index: ring slots 0 and 1, own slots 2 + g. */
static int landing_of(const tide_ring_seq_t *seq, int g) {
    return seq->ring_slot[g] >= 0 ? seq->ring_slot[g] : 2 + g;
}

tide_result_t tide_ring_check(const tide_ring_seq_t *seq, tide_ring_report_t *report_out) {
    TIDE_ARG_CHECK(seq != NULL && report_out != NULL, "ring check: seq and report_out must be "
                                                      "non-NULL");
    TIDE_ARG_CHECK(seq->num_groups >= 1 && seq->ring_slot != NULL && seq->num_calls >= 0 &&
                       (seq->num_calls == 0 || seq->calls != NULL),
                   "ring check: malformed sequence (%d groups, %d calls)", seq->num_groups,
                   seq->num_calls);
    for (int g = 0; g < seq->num_groups; ++g)
        TIDE_ARG_CHECK(seq->ring_slot[g] == 0 || seq->ring_slot[g] == 1 ||
                           seq->ring_slot[g] == TIDE_RING_OWN_SLOT,
                       "ring check: group %d has ring slot %d", g, seq->ring_slot[g]);
    const int landings = seq->num_groups + 2;
    int *holder = malloc((size_t)landings * sizeof(int));
    if (holder == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "ring check: %d landings", landings);
    for (int i = 0; i < landings; ++i)
        holder[i] = -1; /* the live occupant, or -1 */

    tide_ring_report_t rep;
    memset(&rep, 0, sizeof(rep));
    rep.ok = 1;
    rep.call = -1;
    rep.holder = -1;
    tide_result_t res = TIDE_SUCCESS;
    for (int k = 0; k < seq->num_calls && rep.ok; ++k) {
        const tide_ring_call_t *c = &seq->calls[k];
        if (c->group < 0 || c->group >= seq->num_groups || c->kind < 0 ||
            c->kind >= TIDE_RING_CALL_KIND_COUNT) {
            res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "ring check: call %d names group %d, kind %d",
                           k, c->group, c->kind);
            break;
        }
        const int at = landing_of(seq, c->group);
        const int h = holder[at];
        const bool lands = c->kind == TIDE_RING_CALL_AG || c->kind == TIDE_RING_CALL_RS_STAGED;
        if (lands && h >= 0 && h != c->group) {
            char who[80], other[80];
            rep.ok = 0;
            rep.call = k;
            rep.holder = h;
            snprintf(rep.message, sizeof(rep.message),
                     "I5: call %d (%s of %s) %s ring slot %d while %s holds it live", k,
                     c->kind == TIDE_RING_CALL_AG ? "all-gather" : "Slot-Reuse reduce-scatter",
                     name_of(seq, c->group, who, sizeof(who)),
                     c->kind == TIDE_RING_CALL_AG ? "lands into" : "stages gradients in",
                     seq->ring_slot[c->group], name_of(seq, h, other, sizeof(other)));
            break;
        }
        switch (c->kind) {
        case TIDE_RING_CALL_AG:
            holder[at] = c->group;
            break;
        case TIDE_RING_CALL_RESHARD:
        case TIDE_RING_CALL_RS_STAGED:
            if (h == c->group) holder[at] = -1;
            break;
        default: /* an In-Place RS reads autograd's storage, not the slot */
            break;
        }
    }
    free(holder);
    if (res != TIDE_SUCCESS) return res;
    *report_out = rep;
    return TIDE_SUCCESS;
}

tide_result_t tide_ring_fsdp_calls(int blocks, int root, tide_rs_mode_t mode, int steps,
                                   tide_ring_call_t **calls_out, int *num_calls_out) {
    TIDE_ARG_CHECK(blocks >= 1 && steps >= 1 && calls_out != NULL && num_calls_out != NULL,
                   "ring fsdp calls: blocks = %d, steps = %d, outputs non-NULL", blocks, steps);
    const int per_step = 3 * blocks + 3 * blocks + 4;
    tide_ring_call_t *calls = malloc((size_t)per_step * (size_t)steps * sizeof(*calls));
    if (calls == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "ring fsdp calls");
    int n = 0;
    const int r = blocks; /* the root's index */
#define CALL(g, k) (calls[n++] = (tide_ring_call_t){(g), (k)})
    for (int s = 0; s < steps; ++s) {
        /* Forward, prefetch depth one: block b + 1 is gathered before b is resharded. */
        if (root) CALL(r, TIDE_RING_CALL_AG);
        CALL(0, TIDE_RING_CALL_AG);
        for (int b = 0; b < blocks; ++b) {
            if (b + 1 < blocks) CALL(b + 1, TIDE_RING_CALL_AG);
            CALL(b, TIDE_RING_CALL_RESHARD);
        }
        /* Backward in reverse: block b - 1 is gathered before b's reduce-scatter. */
        CALL(blocks - 1, TIDE_RING_CALL_AG);
        for (int b = blocks - 1; b >= 0; --b) {
            if (b > 0) CALL(b - 1, TIDE_RING_CALL_AG);
            if (mode == TIDE_RS_SLOT_REUSE) {
                CALL(b, TIDE_RING_CALL_RS_STAGED);
            } else {
                CALL(b, TIDE_RING_CALL_RESHARD);
                CALL(b, TIDE_RING_CALL_RS);
            }
        }
        if (root) {
            if (mode == TIDE_RS_SLOT_REUSE) {
                CALL(r, TIDE_RING_CALL_RS_STAGED);
            } else {
                CALL(r, TIDE_RING_CALL_RESHARD);
                CALL(r, TIDE_RING_CALL_RS);
            }
        }
    }
#undef CALL
    *calls_out = calls;
    *num_calls_out = n;
    return TIDE_SUCCESS;
}
