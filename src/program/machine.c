/*
 * machine.c - the abstract machine's counting and stepping (rules in machine.h).
 */
#include "program/machine.h"

#include "core/checks.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

int tide_machine_counters_used(const tide_program_t *prog) {
    int max = 0;
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < prog->ranks[r].queues[q].num_ops; ++i) {
                const tide_op_t *op = &prog->ranks[r].queues[q].ops[i];
                if (tide_machine_uses_counter(op) && op->ctr >= max) max = op->ctr + 1;
            }
    return max;
}

tide_result_t tide_machine_count_signals(const tide_program_t *prog, int num_ctrs,
                                         int64_t **counts_out) {
    const size_t slots = (size_t)prog->num_ranks * (size_t)(num_ctrs > 0 ? num_ctrs : 1);
    int64_t *count = calloc(slots, sizeof(*count));
    if (count == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "machine: %zu signal counts", slots);
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const tide_queue_ops_t *qo = &prog->ranks[r].queues[q];
            for (int i = 0; i < qo->num_ops; ++i) {
                const tide_op_t *op = &qo->ops[i];
                if (!tide_machine_signals(op)) continue;
                if (op->sig_rank < 0 || op->sig_rank >= prog->num_ranks || op->ctr < 0 ||
                    op->ctr >= num_ctrs) {
                    free(count);
                    return TIDE_ERR(TIDE_ERR_INTERNAL,
                                    "rank %d %s[%d]: signal to rank %d counter %d outside "
                                    "%d ranks x %d counters",
                                    r, tide_queue_name((tide_queue_t)q), i, op->sig_rank, op->ctr,
                                    prog->num_ranks, num_ctrs);
                }
                ++count[(size_t)op->sig_rank * (size_t)num_ctrs + (size_t)op->ctr];
            }
        }
    *counts_out = count;
    return TIDE_SUCCESS;
}

/* Every counter index inside [0, ctrs) and every target of calls [0, calls) representable. */
static tide_result_t validate(const tide_program_t *prog, int ctrs, int calls) {
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const tide_queue_ops_t *qo = &prog->ranks[r].queues[q];
            for (int i = 0; i < qo->num_ops; ++i) {
                const tide_op_t *op = &qo->ops[i];
                if (!tide_machine_uses_counter(op)) continue;
                if (op->ctr < 0 || op->ctr >= ctrs ||
                    (op->kind != TIDE_OP_WAIT &&
                     (op->sig_rank < 0 || op->sig_rank >= prog->num_ranks)))
                    return TIDE_ERR(TIDE_ERR_INTERNAL,
                                    "machine: rank %d %s[%d] names counter %d of rank %d "
                                    "(%d ranks x %d counters)",
                                    r, tide_queue_name((tide_queue_t)q), i, op->ctr, op->sig_rank,
                                    prog->num_ranks, ctrs);
                if (op->kind != TIDE_OP_WAIT) continue;
                /* Targets are monotone in the call when inc >= 0; check both ends. */
                int64_t t;
                if (!tide_machine_wait_target(0, op, &t) ||
                    (calls > 0 && !tide_machine_wait_target((uint64_t)(calls - 1), op, &t)))
                    return TIDE_ERR(TIDE_ERR_OVERFLOW,
                                    "machine: rank %d %s[%d]: wait target %d x %" PRId64
                                    " + %" PRId64 " overflows",
                                    r, tide_queue_name((tide_queue_t)q), i, calls - 1, op->inc,
                                    op->thr);
            }
        }
    return TIDE_SUCCESS;
}

tide_result_t tide_machine_init(tide_machine_t *m, const tide_program_t *prog, int ctrs,
                                int calls) {
    memset(m, 0, sizeof(*m));
    TIDE_CHECK(validate(prog, ctrs, calls));
    m->prog = prog;
    m->n = prog->num_ranks;
    m->threads = m->n * TIDE_Q_COUNT;
    m->ctrs = ctrs;
    m->calls = calls;
    const size_t nc = (size_t)m->n * (size_t)(ctrs > 0 ? ctrs : 1);
    m->pc = calloc((size_t)m->threads, sizeof(*m->pc));
    m->epoch = calloc((size_t)m->n, sizeof(*m->epoch));
    m->finished = calloc((size_t)m->n, 1);
    m->ctr = calloc(nc, sizeof(*m->ctr));
    if (m->pc == NULL || m->epoch == NULL || m->finished == NULL || m->ctr == NULL) {
        tide_machine_free(m);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "machine: state of %d threads", m->threads);
    }
    tide_machine_reset(m);
    return TIDE_SUCCESS;
}

void tide_machine_free(tide_machine_t *m) {
    free(m->pc);
    free(m->epoch);
    free(m->finished);
    free(m->ctr);
    memset(m, 0, sizeof(*m));
}

/* Rank r finished every queue of its call: start the next one (the order rule). */
static void next_calls(tide_machine_t *m, int r) {
    const int q0 = r * TIDE_Q_COUNT;
    while (!m->finished[r]) {
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            if (tide_machine_head(m, q0 + q) != NULL) return;
        if (m->epoch[r] + 1 >= m->calls) {
            m->finished[r] = 1;
            return;
        }
        ++m->epoch[r];
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            m->pc[q0 + q] = 0;
    }
}

void tide_machine_reset(tide_machine_t *m) {
    memset(m->pc, 0, (size_t)m->threads * sizeof(*m->pc));
    memset(m->epoch, 0, (size_t)m->n * sizeof(*m->epoch));
    memset(m->finished, m->calls > 0 ? 0 : 1, (size_t)m->n);
    memset(m->ctr, 0, (size_t)m->n * (size_t)(m->ctrs > 0 ? m->ctrs : 1) * sizeof(*m->ctr));
    for (int r = 0; r < m->n; ++r)
        next_calls(m, r); /* ranks with empty programs */
}

int64_t tide_machine_head_target(const tide_machine_t *m, int t) {
    const tide_op_t *op = tide_machine_head(m, t);
    int64_t target = 0;
    /* Representable for every call of the machine (validate). */
    (void)tide_machine_wait_target((uint64_t)m->epoch[t / TIDE_Q_COUNT], op, &target);
    return target;
}

bool tide_machine_enabled(const tide_machine_t *m, int t) {
    const tide_op_t *op = tide_machine_head(m, t);
    if (op == NULL) return false;
    if (op->kind != TIDE_OP_WAIT) return true;
    return tide_machine_wait_passes(*tide_machine_counter(m, t / TIDE_Q_COUNT, op->ctr),
                                    tide_machine_head_target(m, t));
}

void tide_machine_fire(tide_machine_t *m, int t) {
    const tide_op_t *op = tide_machine_head(m, t);
    if (tide_machine_signals(op)) ++*tide_machine_counter(m, op->sig_rank, op->ctr);
    ++m->pc[t];
    next_calls(m, t / TIDE_Q_COUNT);
}

bool tide_machine_done(const tide_machine_t *m) {
    for (int r = 0; r < m->n; ++r)
        if (!m->finished[r]) return false;
    return true;
}
