/*
 * call_table.c - call signatures compared across ranks without waiting (call_table.h).
 */
#include "fabric/call_table.h"

#include "core/checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tide_call_table_init(tide_call_table_t *t, int ranks) {
    memset(t, 0, sizeof(*t));
    t->ranks = ranks;
}

void tide_call_table_free(tide_call_table_t *t) {
    free(t->open);
    tide_call_table_init(t, t->ranks);
}

static tide_call_check_t *find(tide_call_table_t *t, uint64_t seq) {
    for (int i = 0; i < t->count; ++i)
        if (t->open[i].seq == seq) return &t->open[i];
    return NULL;
}

static tide_result_t open_check(tide_call_table_t *t, int rank, uint64_t seq, uint64_t sig) {
    if (t->count == t->cap) {
        const int cap = t->cap > 0 ? 2 * t->cap : 4;
        tide_call_check_t *grown = realloc(t->open, (size_t)cap * sizeof(*grown));
        if (grown == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "call check: %d open checks", t->count);
        t->open = grown;
        t->cap = cap;
    }
    t->open[t->count++] = (tide_call_check_t){.seq = seq, .sig = sig, .first = rank, .posted = 1};
    return TIDE_SUCCESS;
}

tide_result_t tide_call_table_post(tide_call_table_t *t, int rank, uint64_t seq, uint64_t sig,
                                   int *verdict_out, int *other_out, uint64_t *other_sig_out) {
    *verdict_out = TIDE_CALL_TABLE_AGREE;
    *other_out = -1;
    *other_sig_out = 0;
    if (t->refused) {
        if (seq != t->refused_seq) {
            *verdict_out = TIDE_CALL_TABLE_REFUSED;
            return TIDE_SUCCESS;
        }
        /* A later poster of the refused check: named against the side it differs from. */
        *verdict_out = TIDE_CALL_TABLE_DIFFERS;
        *other_out = sig != t->sig_a ? t->rank_a : t->rank_b;
        *other_sig_out = sig != t->sig_a ? t->sig_a : t->sig_b;
        return TIDE_SUCCESS;
    }
    tide_call_check_t *c = find(t, seq);
    if (c == NULL) return t->ranks == 1 ? TIDE_SUCCESS : open_check(t, rank, seq, sig);
    ++c->posted;
    if (c->sig != sig) {
        t->refused = true;
        t->refused_seq = seq;
        t->rank_a = c->first;
        t->sig_a = c->sig;
        t->rank_b = rank;
        t->sig_b = sig;
        *verdict_out = TIDE_CALL_TABLE_DIFFERS;
        *other_out = c->first;
        *other_sig_out = c->sig;
    }
    if (c->posted >= t->ranks) *c = t->open[--t->count]; /* closed: every rank posted it */
    return TIDE_SUCCESS;
}

void tide_call_describe(tide_collective_t coll, uint64_t sig, char *buf, size_t size) {
    if (coll == TIDE_COLL_ALL_GATHER) {
        const uint64_t member = sig >> 8;
        if (member > 0)
            snprintf(buf, size, "group %llu of the set, slot %llu",
                     (unsigned long long)(member - 1), (unsigned long long)(sig & 0xff));
        else
            snprintf(buf, size, "slot %llu", (unsigned long long)sig);
        return;
    }
    const uint32_t bits = (uint32_t)(sig >> 32);
    const uint64_t member = (sig & 0xffffffffu) >> 2;
    float alpha;
    memcpy(&alpha, &bits, sizeof(alpha));
    char who[48] = "";
    if (member > 0)
        snprintf(who, sizeof(who), "group %llu of the set, ", (unsigned long long)(member - 1));
    snprintf(buf, size, "%salpha %.9g (bits %08x), accumulate %d, mode %s", who, (double)alpha,
             bits, (int)(sig & 1), (sig >> 1 & 1) ? "slot-reuse" : "in-place");
}
