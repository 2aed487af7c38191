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
#include "program/machine.h"

#include <stdlib.h>

tide_result_t tide_program_check_incs(const tide_program_t *prog) {
    TIDE_ARG_CHECK(prog != NULL, "prog is NULL");
    TIDE_ARG_CHECK(prog->plan != NULL, "program has no plan");
    TIDE_ARG_CHECK(prog->ranks != NULL && prog->num_ranks == prog->plan->topo.ranks,
                   "program has %d ranks, its plan %d", prog->num_ranks, prog->plan->topo.ranks);
    const uint64_t num_ctrs = tide_ctr_count(prog->plan);
    if (num_ctrs > INT32_MAX)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "inc check: %llu counters",
                        (unsigned long long)num_ctrs);
    int64_t *count = NULL;
    TIDE_CHECK(tide_machine_count_signals(prog, (int)num_ctrs, &count));

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
                const int64_t n = count[(size_t)r * num_ctrs + (size_t)op->ctr];
                if (!tide_machine_inc_ok(op, n)) {
                    res = TIDE_ERR(TIDE_ERR_INTERNAL,
                                   "rank %d %s[%d]: wait on counter %d has inc %lld, thr %lld, "
                                   "but %lld signals reach it per call",
                                   r, qn, i, op->ctr, (long long)op->inc, (long long)op->thr,
                                   (long long)n);
                    break;
                }
            }
        }
    }
    free(count);
    return res;
}
