/*
 * print.c - human-readable listing of one rank's program.
 *
 * One line per op, in queue order, made for a person chasing a hang: the queue and index
 * (what a fail-stop timeout names), the kind, every buffer as kind/rank/region+offset, the
 * sizes, the counter by name with its owner, and for a WAIT the exact condition
 * "value >= e*inc + thr" so the stuck threshold can be compared with the counter's value.
 */
#include "program/counters.h"
#include "program/program.h"

#include "core/checks.h"
#include "program/machine.h"

#include <inttypes.h>
#include <stdio.h>

static const char *kind_name(int kind) {
    static const char *const names[TIDE_OP_KIND_COUNT] = {"COPY", "COPY2D", "SIGNAL", "WAIT", "SUM",
                                                          "LAND", "ZERO",   "CAST",   "EVENT"};
    return kind >= 0 && kind < TIDE_OP_KIND_COUNT ? names[kind] : "?";
}

/* Counter family and index within it, e.g. "AG_ARRIVED+2", "RS_CREDIT+5". */
static void ctr_name(int ctr, char *buf, size_t size) {
    static const struct {
        int base, count;
        const char *name;
    } families[] = {
        {TIDE_CTR_AG_READY, 1, "AG_READY"},
        {TIDE_CTR_AG_LANDED, 1, "AG_LANDED"},
        {TIDE_CTR_AG_CALLER_DONE, 1, "AG_CALLER_DONE"},
        {TIDE_CTR_AG_CE_DONE, 1, "AG_CE_DONE"},
        {TIDE_CTR_AG_ARRIVED, TIDE_CTR_AG_MAX_ROUNDS, "AG_ARRIVED"},
        {TIDE_CTR_AG_CREDIT, TIDE_CTR_AG_MAX_ROUNDS, "AG_CREDIT"},
        {TIDE_CTR_FENCE, 1, "FENCE"},
        {TIDE_CTR_RS_STAGED, 1, "RS_STAGED"},
        {TIDE_CTR_RS_PUSHED, 1, "RS_PUSHED"},
        {TIDE_CTR_RS_SUMMED, 1, "RS_SUMMED"},
        {TIDE_CTR_RS_SENT, 1, "RS_SENT"},
        {TIDE_CTR_RS_SPARE_USED, 1, "RS_SPARE_USED"},
        {TIDE_CTR_RS_ARRIVED, TIDE_CTR_RS_MAX_GENERATIONS, "RS_ARRIVED"},
        {TIDE_CTR_RS_NODE_ARRIVED, TIDE_CTR_RS_MAX_GENERATIONS, "RS_NODE_ARRIVED"},
        {TIDE_CTR_RS_NODE_LANDED, TIDE_CTR_RS_MAX_GENERATIONS, "RS_NODE_LANDED"},
        {TIDE_CTR_RS_STG_CREDIT, TIDE_CTR_RS_STG_RANKS, "RS_STG_CREDIT"},
        {TIDE_CTR_RS_CREDIT, TIDE_ARENA_SIGNAL_SLOTS, "RS_CREDIT"},
    };
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); ++i) {
        int rel = ctr - families[i].base;
        if (rel < 0 || rel >= families[i].count) continue;
        if (families[i].count == 1)
            snprintf(buf, size, "%s", families[i].name);
        else
            snprintf(buf, size, "%s+%d", families[i].name, rel);
        return;
    }
    snprintf(buf, size, "ctr%d", ctr);
}

static void ref_name(const tide_ref_t *ref, char *buf, size_t size) {
    uint64_t off = ref->offset;
    switch (ref->kind) {
    case TIDE_REF_ARENA:
        snprintf(buf, size, "arena/r%d/%s+%" PRIu64, (int)ref->rank,
                 tide_region_name((tide_region_t)ref->region), off);
        break;
    case TIDE_REF_LANDING:
        snprintf(buf, size, "landing/r%d+%" PRIu64, (int)ref->rank, off);
        break;
    case TIDE_REF_SHARD:
        snprintf(buf, size, "shard+%" PRIu64, off);
        break;
    case TIDE_REF_GRAD:
        snprintf(buf, size, "grad[%d]+%" PRIu64, (int)ref->param, off);
        break;
    case TIDE_REF_OUT:
        snprintf(buf, size, "out+%" PRIu64, off);
        break;
    case TIDE_REF_NONE:
        snprintf(buf, size, "-");
        break;
    default:
        snprintf(buf, size, "ref?%d", (int)ref->kind);
        break;
    }
}

static void print_table(FILE *f, const tide_rank_program_t *rp, int index) {
    if (index < 0 || index >= rp->num_tables) {
        fprintf(f, " table=%d (missing)", index);
        return;
    }
    const tide_table_t *t = &rp->tables[index];
    char a[96], b[96];
    if (t->kind == TIDE_OP_SUM) {
        ref_name(&t->staged, a, sizeof(a));
        ref_name(&t->out, b, sizeof(b));
        fprintf(f, " table=%d segs=%d staged=%s x%d stride=%" PRIu64 " out=%s", index, t->num_segs,
                a, t->num_staged, t->stage_stride, b);
    } else {
        fprintf(f, " table=%d segs=%d in=", index, t->num_segs);
        for (int i = 0; i < t->num_in && i < TIDE_MAX_GPUS_PER_NODE; ++i) {
            ref_name(&t->in[i], a, sizeof(a));
            fprintf(f, "%s%s", i ? "," : "", a);
        }
        if (t->plus_zero) fprintf(f, " +0");
        if (t->in_bf16) fprintf(f, " bf16");
    }
}

static void print_op(FILE *f, const tide_rank_program_t *rp, int q, int i, const tide_op_t *op) {
    char dst[96], src[96], ctr[48];
    ref_name(&op->dst, dst, sizeof(dst));
    ref_name(&op->src, src, sizeof(src));
    ctr_name(op->ctr, ctr, sizeof(ctr));
    fprintf(f, "r%d %-6s %4d %-6s", rp->rank, tide_queue_name((tide_queue_t)q), i,
            kind_name(op->kind));
    switch (op->kind) {
    case TIDE_OP_COPY:
    case TIDE_OP_CAST:
        fprintf(f, " %s <- %s bytes=%" PRIu64, dst, src, op->bytes);
        break;
    case TIDE_OP_COPY2D:
        fprintf(f,
                " %s <- %s rows=%" PRIu64 " x bytes=%" PRIu64 " pitch dst=%" PRIu64 " src=%" PRIu64,
                dst, src, op->rows, op->bytes, op->dst_pitch, op->src_pitch);
        break;
    case TIDE_OP_ZERO:
        fprintf(f, " %s bytes=%" PRIu64, dst, op->bytes);
        break;
    case TIDE_OP_SIGNAL:
        fprintf(f, " %s@r%d += 1", ctr, (int)op->sig_rank);
        break;
    case TIDE_OP_WAIT:
        fprintf(f, " %s >= e*%" PRId64 " + %" PRId64, ctr, op->inc, op->thr);
        break;
    case TIDE_OP_SUM:
    case TIDE_OP_LAND:
        print_table(f, rp, op->table);
        if (op->kind == TIDE_OP_LAND && op->init) fprintf(f, " init");
        break;
    case TIDE_OP_EVENT:
        fprintf(f, " %s",
                op->event == TIDE_EVENT_READ_DONE   ? "read-done"
                : op->event == TIDE_EVENT_CALL_DONE ? "call-done"
                                                    : "event?");
        break;
    default:
        break;
    }
    if (op->kind != TIDE_OP_SIGNAL && tide_machine_signals(op))
        fprintf(f, " +signal %s@r%d", ctr, (int)op->sig_rank);
    if (op->bank_dep) fprintf(f, " bank");
    fputc('\n', f);
}

tide_result_t tide_program_print(const tide_program_t *prog, int rank, void *file) {
    TIDE_ARG_CHECK(prog != NULL, "prog is NULL");
    TIDE_ARG_CHECK(prog->ranks != NULL, "program has no ranks");
    TIDE_ARG_CHECK(rank >= 0 && rank < prog->num_ranks, "rank = %d outside [0, %d)", rank,
                   prog->num_ranks);
    TIDE_ARG_CHECK(file != NULL, "file is NULL");
    FILE *f = file;
    const tide_rank_program_t *rp = &prog->ranks[rank];
    const char *coll = prog->coll == TIDE_COLL_ALL_GATHER ? "all-gather" : "reduce-scatter";
    if (prog->plan != NULL)
        fprintf(f, "# %s program, rank %d of %d (M = %d, L = %d)\n", coll, rank, prog->num_ranks,
                prog->plan->topo.nodes, prog->plan->topo.gpus_per_node);
    else
        fprintf(f, "# %s program, rank %d of %d\n", coll, rank, prog->num_ranks);
    for (int q = 0; q < TIDE_Q_COUNT; ++q) {
        const tide_queue_ops_t *qo = &rp->queues[q];
        if (qo->num_ops == 0) continue;
        fprintf(f, "# queue %s: %d ops\n", tide_queue_name((tide_queue_t)q), qo->num_ops);
        for (int i = 0; i < qo->num_ops; ++i)
            print_op(f, rp, q, i, &qo->ops[i]);
    }
    if (ferror(f))
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "program listing: the file is not writable");
    return TIDE_SUCCESS;
}
