/*
 * counters.c - the per-call signal count behind every WAIT threshold.
 *
 * A WAIT completes when counter >= epoch * inc + thr, so inc must be exactly the number of
 * signals that reach the counter per call: one too many and call e + 1 passes on call e's
 * signals, one too few and the program hangs in its second call.  The compilers write inc in
 * closed form; this pass recounts the signals from the ops themselves and rejects any drift.
 */
#include "program/counters.h"

#include "core/checks.h"

#include <stdlib.h>

/* (rank, counter) as one sortable key. */
static uint64_t key_of(int32_t rank, int32_t ctr) {
    return ((uint64_t)(uint32_t)rank << 32) | (uint32_t)ctr;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Index of the first key >= k in the sorted keys. */
static size_t lower_bound(const uint64_t *keys, size_t n, uint64_t k) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < k)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool signals(const tide_op_t *op) {
    if (op->kind == TIDE_OP_SIGNAL) return true;
    return (op->kind == TIDE_OP_COPY || op->kind == TIDE_OP_COPY2D) && op->sig_rank >= 0;
}

/* Collects every signal's key; reports a signal to a rank or counter outside the program. */
static tide_result_t collect(const tide_program_t *prog, uint64_t num_ctrs, uint64_t **keys_out,
                             size_t *num_out) {
    size_t total = 0;
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            total += (size_t)prog->ranks[r].queues[q].num_ops;
    uint64_t *keys = malloc((total ? total : 1) * sizeof(*keys));
    if (keys == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "inc check: %zu ops", total);
    size_t n = 0;
    for (int r = 0; r < prog->num_ranks; ++r) {
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const tide_queue_ops_t *qo = &prog->ranks[r].queues[q];
            for (int i = 0; i < qo->num_ops; ++i) {
                const tide_op_t *op = &qo->ops[i];
                if (!signals(op)) continue;
                if (op->sig_rank < 0 || op->sig_rank >= prog->num_ranks || op->ctr < 0 ||
                    (uint64_t)op->ctr >= num_ctrs) {
                    free(keys);
                    return TIDE_ERR(TIDE_ERR_INTERNAL,
                                    "rank %d %s[%d]: signal to rank %d counter %d outside "
                                    "%d ranks x %llu counters",
                                    r, tide_queue_name((tide_queue_t)q), i, op->sig_rank, op->ctr,
                                    prog->num_ranks, (unsigned long long)num_ctrs);
                }
                keys[n++] = key_of(op->sig_rank, op->ctr);
            }
        }
    }
    qsort(keys, n, sizeof(*keys), cmp_u64);
    *keys_out = keys;
    *num_out = n;
    return TIDE_SUCCESS;
}

tide_result_t tide_program_check_incs(const tide_program_t *prog) {
    TIDE_ARG_CHECK(prog != NULL, "prog is NULL");
    TIDE_ARG_CHECK(prog->plan != NULL, "program has no plan");
    TIDE_ARG_CHECK(prog->ranks != NULL && prog->num_ranks == prog->plan->topo.ranks,
                   "program has %d ranks, its plan %d", prog->num_ranks, prog->plan->topo.ranks);
    uint64_t num_ctrs = tide_ctr_count(prog->plan);
    uint64_t *keys = NULL;
    size_t num_keys = 0;
    TIDE_CHECK(collect(prog, num_ctrs, &keys, &num_keys));

    tide_result_t res = TIDE_SUCCESS;
    for (int r = 0; r < prog->num_ranks && res == TIDE_SUCCESS; ++r) {
        for (int q = 0; q < TIDE_Q_COUNT && res == TIDE_SUCCESS; ++q) {
            const tide_queue_ops_t *qo = &prog->ranks[r].queues[q];
            for (int i = 0; i < qo->num_ops; ++i) {
                const tide_op_t *op = &qo->ops[i];
                if (op->kind != TIDE_OP_WAIT) continue;
                const char *qn = tide_queue_name((tide_queue_t)q);
                if (op->ctr < 0 || (uint64_t)op->ctr >= num_ctrs) {
                    res = TIDE_ERR(TIDE_ERR_INTERNAL,
                                   "rank %d %s[%d]: wait on counter %d outside "
                                   "[0, %llu)",
                                   r, qn, i, op->ctr, (unsigned long long)num_ctrs);
                    break;
                }
                uint64_t k = key_of(r, op->ctr);
                size_t first = lower_bound(keys, num_keys, k);
                size_t end = lower_bound(keys, num_keys, k + 1);
                int64_t count = (int64_t)(end - first);
                if (count == 0 || op->inc != count || op->thr > op->inc) {
                    res = TIDE_ERR(TIDE_ERR_INTERNAL,
                                   "rank %d %s[%d]: wait on counter %d has inc %lld, thr %lld, "
                                   "but %lld signals reach it per call",
                                   r, qn, i, op->ctr, (long long)op->inc, (long long)op->thr,
                                   (long long)count);
                    break;
                }
            }
        }
    }
    free(keys);
    return res;
}
