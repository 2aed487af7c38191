/*
 * fault_ring.c - fault injection on a ring call sequence (check_ring.h): the ways an adapter
 * can get the two-slot ring wrong.  Sites are found structurally (from the sequence and the
 * slots, never by running the checker), so that the test that the checker catches each one
 * is not circular.
 */
#include "program/check_ring.h"

#include "core/checks.h"

#include <string.h>

const char *tide_ring_fault_name(tide_ring_fault_t fault) {
    switch (fault) {
    case TIDE_RING_FAULT_DROP_RESHARD:
        return "drop-reshard";
    case TIDE_RING_FAULT_SAME_SLOT:
        return "same-slot";
    case TIDE_RING_FAULT_EARLY_AG:
        return "early-all-gather";
    default:
        return "?";
    }
}

static int landing_of(const int *ring_slot, int g) {
    return ring_slot[g] >= 0 ? ring_slot[g] : 2 + g;
}

static bool releases(int kind) {
    return kind == TIDE_RING_CALL_RESHARD || kind == TIDE_RING_CALL_RS_STAGED;
}

/* A reshard of g at k whose landing another group gathers into before g gathers again. */
static bool drop_site(const int *ring_slot, int n, const tide_ring_call_t *c, int k) {
    if (c[k].kind != TIDE_RING_CALL_RESHARD) return false;
    const int at = landing_of(ring_slot, c[k].group);
    for (int j = k + 1; j < n; ++j) {
        if (c[j].kind != TIDE_RING_CALL_AG || landing_of(ring_slot, c[j].group) != at) continue;
        return c[j].group != c[k].group;
    }
    return false;
}

/* An AG of g at k; *j_out: the release of the landing's previous occupant (another group)
 * with no AG into the landing in between. */
static bool early_site(const int *ring_slot, const tide_ring_call_t *c, int k, int *j_out) {
    if (c[k].kind != TIDE_RING_CALL_AG) return false;
    const int at = landing_of(ring_slot, c[k].group);
    for (int j = k - 1; j >= 0; --j) {
        if (landing_of(ring_slot, c[j].group) != at) continue;
        if (c[j].kind == TIDE_RING_CALL_AG) return false;
        if (releases(c[j].kind) && c[j].group != c[k].group) {
            *j_out = j;
            return true;
        }
    }
    return false;
}

tide_result_t tide_ring_fault_inject(tide_ring_fault_t fault, uint64_t seed, int num_groups,
                                     int *ring_slot, int num_calls, tide_ring_call_t *calls) {
    TIDE_ARG_CHECK(ring_slot != NULL && calls != NULL && num_groups >= 1 && num_calls >= 0,
                   "ring fault: malformed sequence");
    TIDE_ARG_CHECK((unsigned)fault < TIDE_RING_FAULT_KIND_COUNT, "ring fault: kind %d", (int)fault);
    int count = 0;
    const int limit = fault == TIDE_RING_FAULT_SAME_SLOT ? num_groups : num_calls;
    for (int pass = 0; pass < 2; ++pass) {
        const int pick = count > 0 ? (int)(seed % (uint64_t)count) : 0;
        int seen = 0;
        for (int i = 0; i < limit; ++i) {
            int j = -1;
            bool site = false;
            if (fault == TIDE_RING_FAULT_DROP_RESHARD)
                site = drop_site(ring_slot, num_calls, calls, i);
            else if (fault == TIDE_RING_FAULT_EARLY_AG)
                site = early_site(ring_slot, calls, i, &j);
            else
                site = i >= 1 && ring_slot[i] >= 0 && ring_slot[i - 1] >= 0 &&
                       ring_slot[i] != ring_slot[i - 1];
            if (!site) continue;
            if (pass == 1 && seen == pick) {
                if (fault == TIDE_RING_FAULT_DROP_RESHARD) {
                    /* Neutralise the call: a reduce-scatter from autograd's storage touches
                     * no slot, so the sequence keeps its length. */
                    calls[i].kind = TIDE_RING_CALL_RS;
                } else if (fault == TIDE_RING_FAULT_EARLY_AG) {
                    const tide_ring_call_t ag = calls[i];
                    memmove(&calls[j + 1], &calls[j], (size_t)(i - j) * sizeof(*calls));
                    calls[j] = ag;
                } else {
                    ring_slot[i] = ring_slot[i - 1];
                }
                return TIDE_SUCCESS;
            }
            ++seen;
        }
        count = seen;
        if (count == 0)
            return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "ring fault %s: no eligible site",
                            tide_ring_fault_name(fault));
    }
    return TIDE_ERR(TIDE_ERR_INTERNAL, "ring fault: site %llu not found", (unsigned long long)seed);
}
