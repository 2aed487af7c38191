/*
 * fault.c - fault injection (fault.h, docs/faults.md): one deterministic mutation of a deep
 * copy of a compiled program per (kind, seed).
 *
 * Every kind is a predicate on ops (which ops it may target) and a mutation of the chosen
 * op.  Sites are numbered in the unmutated program, rank-major, so a site index names the
 * same op in every run; the mutated op itself is described in the site's `what`.
 */
#include "program/fault.h"

#include "core/checks.h"
#include "program/machine.h"
#include "program/counters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tide_fault_name(tide_fault_kind_t kind) {
    static const char *const names[TIDE_FAULT_KIND_COUNT] = {
        [TIDE_FAULT_DROP_CREDIT] = "drop-credit",
        [TIDE_FAULT_DROP_COMPLETION_FENCE] = "drop-completion-fence",
        [TIDE_FAULT_DROP_READ_COMPLETION] = "drop-read-completion",
        [TIDE_FAULT_EARLY_OUTBOX_REUSE] = "early-outbox-reuse",
        [TIDE_FAULT_EARLY_INBOX_REUSE] = "early-inbox-reuse",
        [TIDE_FAULT_SKIP_STALE_ZERO] = "skip-stale-zero",
        [TIDE_FAULT_SHIFT_LATIN_SLOT] = "shift-latin-slot",
        [TIDE_FAULT_MISSING_SIGNAL] = "missing-signal",
        [TIDE_FAULT_DUPLICATE_SIGNAL] = "duplicate-signal",
        [TIDE_FAULT_TRUNCATE_COPY] = "truncate-copy",
        [TIDE_FAULT_WRONG_PITCH] = "wrong-pitch",
        [TIDE_FAULT_REORDER_WAIT] = "reorder-wait",
    };
    return (unsigned)kind < TIDE_FAULT_KIND_COUNT ? names[kind] : "?";
}

/* ------------------------------------------------------------------ op classes */

static bool in_family(int ctr, int base, int size) {
    return ctr >= base && ctr < base + size;
}

static bool signals(const tide_op_t *op) {
    return tide_machine_signals(op);
}

static bool is_wait(const tide_op_t *op, int base, int size) {
    return op->kind == TIDE_OP_WAIT && in_family(op->ctr, base, size);
}

static bool credit_ctr(int ctr) {
    return in_family(ctr, TIDE_CTR_AG_CREDIT, TIDE_CTR_AG_MAX_ROUNDS) ||
           in_family(ctr, TIDE_CTR_RS_STG_CREDIT, TIDE_CTR_RS_STG_RANKS) ||
           ctr >= TIDE_CTR_RS_CREDIT;
}

/* Element size of the buffer a reference writes (AG items, gradient items, fp32). */
static uint64_t dst_elem(const tide_program_t *prog, const tide_ref_t *ref) {
    const tide_geom_t *g = &prog->plan->geom;
    if (ref->kind == TIDE_REF_LANDING) return g->ag_item;
    if (ref->kind == TIDE_REF_ARENA) {
        if (ref->region == TIDE_REGION_STAGING) return g->grad_item;
        if (ref->region == TIDE_REGION_OUTBOX || ref->region == TIDE_REGION_SPARE ||
            ref->region == TIDE_REGION_INBOX)
            return 4;
        return g->ag_item;
    }
    return ref->kind == TIDE_REF_GRAD ? g->grad_item : 4;
}

static const char *kind_name(int kind) {
    return tide_op_kind_name(kind);
}

/* Index of the last SUM before op i of the queue, or -1. */
static int last_sum_before(const tide_queue_ops_t *qo, int i) {
    for (int k = i - 1; k >= 0; --k)
        if (qo->ops[k].kind == TIDE_OP_SUM) return k;
    return -1;
}

static bool eligible(const tide_program_t *prog, tide_fault_kind_t kind, int q,
                     const tide_queue_ops_t *qo, int i) {
    const tide_op_t *op = &qo->ops[i];
    switch (kind) {
    case TIDE_FAULT_DROP_CREDIT:
        return op->kind == TIDE_OP_SIGNAL && credit_ctr(op->ctr);
    case TIDE_FAULT_DROP_COMPLETION_FENCE:
        return prog->coll == TIDE_COLL_ALL_GATHER
                   ? q == TIDE_Q_DONE && is_wait(op, TIDE_CTR_AG_LANDED, 1)
                   : q == TIDE_Q_NET &&
                         is_wait(op, TIDE_CTR_RS_NODE_ARRIVED, TIDE_CTR_RS_MAX_GENERATIONS);
    case TIDE_FAULT_DROP_READ_COMPLETION:
        if (q == TIDE_Q_READ && is_wait(op, TIDE_CTR_RS_PUSHED, 1)) return true;
        return op->kind == TIDE_OP_EVENT && op->event == TIDE_EVENT_READ_DONE &&
               last_sum_before(qo, i) >= 0;
    case TIDE_FAULT_EARLY_OUTBOX_REUSE:
        /* Only the waits for a send of the same call: a bank's use in call e - 2 is ordered
         * by the call boundary on every fabric that serialises a rank's calls. */
        return is_wait(op, TIDE_CTR_RS_SENT, 1) && op->thr >= 1;
    case TIDE_FAULT_EARLY_INBOX_REUSE:
        return op->kind == TIDE_OP_WAIT &&
               (op->ctr >= TIDE_CTR_RS_CREDIT ||
                in_family(op->ctr, TIDE_CTR_RS_NODE_LANDED, TIDE_CTR_RS_MAX_GENERATIONS));
    case TIDE_FAULT_SKIP_STALE_ZERO: /* the inbox's stale-block zeroing, not the output's */
        return op->kind == TIDE_OP_ZERO && op->dst.kind == TIDE_REF_ARENA &&
               op->dst.region == TIDE_REGION_INBOX;
    case TIDE_FAULT_SHIFT_LATIN_SLOT:
        return op->kind == TIDE_OP_COPY && op->dst.kind == TIDE_REF_ARENA &&
               op->dst.region == TIDE_REGION_INBOX && op->dst.rank != op->src.rank &&
               prog->plan->topo.gpus_per_node > 1;
    case TIDE_FAULT_MISSING_SIGNAL:
        return signals(op) && (op->ctr == TIDE_CTR_RS_STAGED ||
                               in_family(op->ctr, TIDE_CTR_AG_ARRIVED, TIDE_CTR_AG_MAX_ROUNDS));
    case TIDE_FAULT_DUPLICATE_SIGNAL:
        return op->kind == TIDE_OP_SIGNAL;
    case TIDE_FAULT_TRUNCATE_COPY: {
        const uint64_t e = dst_elem(prog, &op->dst);
        return op->kind == TIDE_OP_COPY && op->bytes / 2 / e > 0;
    }
    case TIDE_FAULT_WRONG_PITCH:
        return op->kind == TIDE_OP_COPY2D && op->rows >= 2;
    case TIDE_FAULT_REORDER_WAIT:
        return op->kind == TIDE_OP_WAIT && i + 1 < qo->num_ops &&
               qo->ops[i + 1].kind != TIDE_OP_WAIT;
    default:
        return false;
    }
}

/* Visit eligible sites in order; stops at site `want` (>= 0) and returns its coordinates. */
static int scan(const tide_program_t *prog, tide_fault_kind_t kind, int want, int *rank_out,
                int *q_out, int *op_out) {
    int count = 0;
    for (int r = 0; r < prog->num_ranks; ++r)
        for (int q = 0; q < TIDE_Q_COUNT; ++q) {
            const tide_queue_ops_t *qo = &prog->ranks[r].queues[q];
            for (int i = 0; i < qo->num_ops; ++i) {
                if (!eligible(prog, kind, q, qo, i)) continue;
                if (count == want) {
                    *rank_out = r;
                    *q_out = q;
                    *op_out = i;
                }
                ++count;
            }
        }
    return count;
}

static tide_result_t check_args(const tide_program_t *prog, tide_fault_kind_t kind) {
    TIDE_ARG_CHECK(prog != NULL && prog->plan != NULL && prog->ranks != NULL,
                   "fault: program is NULL or not compiled");
    TIDE_ARG_CHECK((unsigned)kind < TIDE_FAULT_KIND_COUNT, "fault: kind %d outside [0, %d)",
                   (int)kind, TIDE_FAULT_KIND_COUNT);
    return TIDE_SUCCESS;
}

tide_result_t tide_fault_count_sites(const tide_program_t *prog, tide_fault_kind_t kind,
                                     int *count_out) {
    TIDE_CHECK(check_args(prog, kind));
    TIDE_ARG_CHECK(count_out != NULL, "fault: count_out is NULL");
    int r, q, i;
    *count_out = scan(prog, kind, -1, &r, &q, &i);
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ queue edits */

static void remove_op(tide_queue_ops_t *qo, int i) {
    memmove(&qo->ops[i], &qo->ops[i + 1], (size_t)(qo->num_ops - i - 1) * sizeof(tide_op_t));
    --qo->num_ops;
}

/* Move op `from` to position `to` (to < from), shifting the ops in between back. */
static void move_op(tide_queue_ops_t *qo, int from, int to) {
    tide_op_t op = qo->ops[from];
    memmove(&qo->ops[to + 1], &qo->ops[to], (size_t)(from - to) * sizeof(tide_op_t));
    qo->ops[to] = op;
}

static tide_result_t insert_op(tide_queue_ops_t *qo, int i, const tide_op_t *op) {
    if (qo->num_ops == qo->cap_ops) {
        int cap = qo->cap_ops ? 2 * qo->cap_ops : 4;
        tide_op_t *ops = realloc(qo->ops, (size_t)cap * sizeof(*ops));
        if (ops == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "fault: %d ops", cap);
        qo->ops = ops;
        qo->cap_ops = cap;
    }
    memmove(&qo->ops[i + 1], &qo->ops[i], (size_t)(qo->num_ops - i) * sizeof(tide_op_t));
    qo->ops[i] = *op;
    ++qo->num_ops;
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ mutations */

static tide_result_t mutate(tide_program_t *prog, tide_fault_kind_t kind, int r, int q, int i,
                            char *what, size_t len) {
    tide_queue_ops_t *qo = &prog->ranks[r].queues[q];
    tide_op_t *op = &qo->ops[i];
    const char *qn = tide_queue_name((tide_queue_t)q);
    const int L = prog->plan->topo.gpus_per_node;
    switch (kind) {
    case TIDE_FAULT_DROP_CREDIT:
    case TIDE_FAULT_DROP_COMPLETION_FENCE:
    case TIDE_FAULT_SKIP_STALE_ZERO:
        snprintf(what, len, "rank %d %s[%d]: %s removed (counter %d)", r, qn, i,
                 kind_name(op->kind), op->ctr);
        remove_op(qo, i);
        return TIDE_SUCCESS;
    case TIDE_FAULT_DROP_READ_COMPLETION:
        if (op->kind == TIDE_OP_WAIT) {
            snprintf(what, len, "rank %d %s[%d]: wait on RS_PUSHED removed", r, qn, i);
            remove_op(qo, i);
        } else {
            const int to = last_sum_before(qo, i);
            snprintf(what, len, "rank %d %s[%d]: read-done event moved before the last sum (%d)", r,
                     qn, i, to);
            move_op(qo, i, to);
        }
        return TIDE_SUCCESS;
    case TIDE_FAULT_EARLY_OUTBOX_REUSE:
        op->thr -= prog->plan->rs.outbox_depth;
        snprintf(what, len, "rank %d %s[%d]: RS_SENT threshold lowered by n_out = %d to %lld", r,
                 qn, i, prog->plan->rs.outbox_depth, (long long)op->thr);
        return TIDE_SUCCESS;
    case TIDE_FAULT_EARLY_INBOX_REUSE: {
        /* One use: one credit, or the L local landings of one wave. */
        const int64_t use = op->ctr >= TIDE_CTR_RS_CREDIT ? 1 : L;
        op->thr -= use;
        snprintf(what, len, "rank %d %s[%d]: counter %d threshold lowered by %lld to %lld", r, qn,
                 i, op->ctr, (long long)use, (long long)op->thr);
        return TIDE_SUCCESS;
    }
    case TIDE_FAULT_SHIFT_LATIN_SLOT: {
        const uint64_t block = 4ull * (uint64_t)L * prog->plan->rs.subslice_elems;
        const uint64_t index = op->dst.offset / block, gen = index / (uint64_t)L;
        const uint64_t s = index % (uint64_t)L, s1 = (s + 1) % (uint64_t)L;
        op->dst.offset = (gen * (uint64_t)L + s1) * block + op->dst.offset % block;
        snprintf(what, len, "rank %d %s[%d]: put into inbox block %llu instead of %llu", r, qn, i,
                 (unsigned long long)s1, (unsigned long long)s);
        return TIDE_SUCCESS;
    }
    case TIDE_FAULT_MISSING_SIGNAL:
        snprintf(what, len, "rank %d %s[%d]: signal to rank %d counter %d removed", r, qn, i,
                 op->sig_rank, op->ctr);
        if (op->kind == TIDE_OP_SIGNAL) {
            remove_op(qo, i);
        } else {
            op->sig_rank = -1;
            op->ctr = 0;
        }
        return TIDE_SUCCESS;
    case TIDE_FAULT_DUPLICATE_SIGNAL: {
        tide_op_t copy = *op;
        snprintf(what, len, "rank %d %s[%d]: signal to rank %d counter %d issued twice", r, qn, i,
                 op->sig_rank, op->ctr);
        return insert_op(qo, i + 1, &copy);
    }
    case TIDE_FAULT_TRUNCATE_COPY: {
        const uint64_t e = dst_elem(prog, &op->dst);
        const uint64_t bytes = op->bytes / 2 / e * e;
        snprintf(what, len, "rank %d %s[%d]: copy of %llu bytes truncated to %llu", r, qn, i,
                 (unsigned long long)op->bytes, (unsigned long long)bytes);
        op->bytes = bytes;
        return TIDE_SUCCESS;
    }
    case TIDE_FAULT_WRONG_PITCH: {
        const uint64_t e = dst_elem(prog, &op->dst);
        snprintf(what, len, "rank %d %s[%d]: 2D destination pitch %llu -> %llu", r, qn, i,
                 (unsigned long long)op->dst_pitch, (unsigned long long)(op->dst_pitch + e));
        op->dst_pitch += e;
        return TIDE_SUCCESS;
    }
    case TIDE_FAULT_REORDER_WAIT: {
        tide_op_t w = *op;
        snprintf(what, len, "rank %d %s[%d]: wait on counter %d moved after the next op (%s)", r,
                 qn, i, w.ctr, kind_name(qo->ops[i + 1].kind));
        qo->ops[i] = qo->ops[i + 1];
        qo->ops[i + 1] = w;
        return TIDE_SUCCESS;
    }
    default:
        return TIDE_ERR(TIDE_ERR_INTERNAL, "fault: kind %d has no mutation", (int)kind);
    }
}

tide_result_t tide_fault_inject(const tide_program_t *prog, tide_fault_kind_t kind, uint64_t seed,
                                tide_program_t *faulty_out, tide_fault_site_t *site_out) {
    TIDE_CHECK(check_args(prog, kind));
    TIDE_ARG_CHECK(faulty_out != NULL, "fault: faulty_out is NULL");
    int r = -1, q = -1, i = -1;
    const int count = scan(prog, kind, -1, &r, &q, &i);
    if (count == 0)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "fault %s: no eligible op in this %s program",
                        tide_fault_name(kind),
                        prog->coll == TIDE_COLL_ALL_GATHER ? "all-gather" : "reduce-scatter");
    const int index = (int)(seed % (uint64_t)count);
    scan(prog, kind, index, &r, &q, &i);

    tide_fault_site_t site;
    memset(&site, 0, sizeof(site));
    site.index = index;
    site.rank = r;
    site.queue = q;
    site.op = i;
    tide_program_t faulty;
    TIDE_CHECK(tide_program_clone(prog, &faulty));
    tide_result_t res = mutate(&faulty, kind, r, q, i, site.what, sizeof(site.what));
    if (res != TIDE_SUCCESS) {
        tide_program_free(&faulty);
        return res;
    }
    *faulty_out = faulty;
    if (site_out != NULL) *site_out = site;
    return TIDE_SUCCESS;
}
