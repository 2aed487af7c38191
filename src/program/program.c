/*
 * program.c - the program IR's container: creation, appending ops and segment tables,
 * deep copy and release.
 *
 * A program owns everything it points to except the plan: per-rank op arrays and segment
 * tables including their segment arrays.  tide_program_add_table copies the caller's segment
 * array, so a compiler may build a table in a scratch buffer and reuse it.
 */
#include "program/program.h"

#include "core/checks.h"
#include "program/counters.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM_INITIAL_CAP 16

/* Capacity for one more element: doubles, never past INT_MAX elements or SIZE_MAX bytes. */
static tide_result_t grow(void **array, int *cap, int count, size_t elem, const char *what) {
    if (count < *cap) return TIDE_SUCCESS;
    if (*cap >= INT_MAX / 2)
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "program: more than %d %s", *cap, what);
    int new_cap = *cap == 0 ? PROGRAM_INITIAL_CAP : 2 * *cap;
    if ((size_t)new_cap > SIZE_MAX / elem)
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "program: %d %s do not fit in memory", new_cap, what);
    void *grown = realloc(*array, (size_t)new_cap * elem);
    if (grown == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "program: %d %s", new_cap, what);
    *array = grown;
    *cap = new_cap;
    return TIDE_SUCCESS;
}

tide_result_t tide_program_init(const struct tide_plan *plan, tide_collective_t coll,
                                tide_rs_mode_t mode, tide_program_t *prog_out) {
    TIDE_ARG_CHECK(plan != NULL, "plan is NULL");
    TIDE_ARG_CHECK(prog_out != NULL, "prog_out is NULL");
    TIDE_ARG_CHECK(coll == TIDE_COLL_ALL_GATHER || coll == TIDE_COLL_REDUCE_SCATTER,
                   "collective = %d is neither all-gather nor reduce-scatter", (int)coll);
    TIDE_ARG_CHECK((unsigned)mode < TIDE_RS_MODE_COUNT, "mode = %d outside [0, %d)", (int)mode,
                   TIDE_RS_MODE_COUNT);
    int n = plan->topo.ranks;
    TIDE_ARG_CHECK(n >= 1 && n == plan->topo.nodes * plan->topo.gpus_per_node,
                   "plan has %d ranks for M = %d, L = %d", n, plan->topo.nodes,
                   plan->topo.gpus_per_node);

    tide_rank_program_t *ranks = calloc((size_t)n, sizeof(*ranks));
    if (ranks == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "program: %d rank programs", n);
    for (int r = 0; r < n; ++r)
        ranks[r].rank = r;

    memset(prog_out, 0, sizeof(*prog_out));
    prog_out->coll = coll;
    prog_out->mode = mode;
    prog_out->plan = plan;
    prog_out->num_ranks = n;
    prog_out->ranks = ranks;
    return TIDE_SUCCESS;
}

static tide_result_t check_rank(const tide_program_t *prog, int rank) {
    TIDE_ARG_CHECK(prog != NULL, "prog is NULL");
    TIDE_ARG_CHECK(prog->ranks != NULL, "program has no ranks (not initialised?)");
    TIDE_ARG_CHECK(rank >= 0 && rank < prog->num_ranks, "rank = %d outside [0, %d)", rank,
                   prog->num_ranks);
    return TIDE_SUCCESS;
}

tide_result_t tide_program_push(tide_program_t *prog, int rank, tide_queue_t q,
                                const tide_op_t *op) {
    TIDE_CHECK(check_rank(prog, rank));
    TIDE_ARG_CHECK((unsigned)q < TIDE_Q_COUNT, "queue = %d outside [0, %d)", (int)q, TIDE_Q_COUNT);
    TIDE_ARG_CHECK(op != NULL, "op is NULL");
    TIDE_ARG_CHECK(op->kind < TIDE_OP_KIND_COUNT, "op kind = %d outside [0, %d)", op->kind,
                   TIDE_OP_KIND_COUNT);
    tide_queue_ops_t *qo = &prog->ranks[rank].queues[q];
    void *ops = qo->ops;
    TIDE_CHECK(grow(&ops, &qo->cap_ops, qo->num_ops, sizeof(tide_op_t), "ops in one queue"));
    qo->ops = ops;
    qo->ops[qo->num_ops++] = *op;
    return TIDE_SUCCESS;
}

/* Deep copy of a table's segment array into dst (whose other fields are already copied). */
static tide_result_t copy_segs(const tide_table_t *src, tide_table_t *dst) {
    dst->sum_segs = NULL;
    dst->land_segs = NULL;
    if (src->num_segs == 0) return TIDE_SUCCESS;
    if (src->kind == TIDE_OP_SUM) {
        dst->sum_segs = malloc((size_t)src->num_segs * sizeof(tide_sum_seg_t));
        if (dst->sum_segs == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "program: %d sum segments", src->num_segs);
        memcpy(dst->sum_segs, src->sum_segs, (size_t)src->num_segs * sizeof(tide_sum_seg_t));
    } else {
        dst->land_segs = malloc((size_t)src->num_segs * sizeof(tide_land_seg_t));
        if (dst->land_segs == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "program: %d landing segments", src->num_segs);
        memcpy(dst->land_segs, src->land_segs, (size_t)src->num_segs * sizeof(tide_land_seg_t));
    }
    return TIDE_SUCCESS;
}

static tide_result_t check_table(const tide_table_t *t) {
    TIDE_ARG_CHECK(t != NULL, "table is NULL");
    TIDE_ARG_CHECK(t->kind == TIDE_OP_SUM || t->kind == TIDE_OP_LAND,
                   "table kind = %d is neither SUM nor LAND", t->kind);
    TIDE_ARG_CHECK(t->num_segs >= 0, "table has %d segments", t->num_segs);
    TIDE_ARG_CHECK(t->num_segs == 0 ||
                       (t->kind == TIDE_OP_SUM ? t->sum_segs != NULL : t->land_segs != NULL),
                   "table has %d segments but no segment array", t->num_segs);
    TIDE_ARG_CHECK(t->num_in >= 0 && t->num_in <= TIDE_MAX_GPUS_PER_NODE,
                   "table num_in = %d outside [0, %d]", t->num_in, TIDE_MAX_GPUS_PER_NODE);
    return TIDE_SUCCESS;
}

tide_result_t tide_program_add_table(tide_program_t *prog, int rank, const tide_table_t *table,
                                     int *index_out) {
    TIDE_CHECK(check_rank(prog, rank));
    TIDE_CHECK(check_table(table));
    TIDE_ARG_CHECK(index_out != NULL, "index_out is NULL");
    tide_rank_program_t *rp = &prog->ranks[rank];
    void *tables = rp->tables;
    TIDE_CHECK(grow(&tables, &rp->cap_tables, rp->num_tables, sizeof(tide_table_t),
                    "segment tables in one rank"));
    rp->tables = tables;
    tide_table_t copy = *table;
    TIDE_CHECK(copy_segs(table, &copy));
    int index = rp->num_tables++;
    rp->tables[index] = copy;
    *index_out = index;
    return TIDE_SUCCESS;
}

static void free_rank(tide_rank_program_t *rp) {
    for (int q = 0; q < TIDE_Q_COUNT; ++q)
        free(rp->queues[q].ops);
    for (int t = 0; t < rp->num_tables; ++t) {
        free(rp->tables[t].sum_segs);
        free(rp->tables[t].land_segs);
    }
    free(rp->tables);
    memset(rp, 0, sizeof(*rp));
}

void tide_program_free(tide_program_t *prog) {
    if (prog == NULL) return;
    if (prog->ranks != NULL) {
        for (int r = 0; r < prog->num_ranks; ++r)
            free_rank(&prog->ranks[r]);
        free(prog->ranks);
    }
    memset(prog, 0, sizeof(*prog));
}

/* Deep copy of one rank; on failure dst holds what was copied so far (free_rank releases it). */
static tide_result_t clone_rank(const tide_rank_program_t *src, tide_rank_program_t *dst) {
    dst->rank = src->rank;
    for (int q = 0; q < TIDE_Q_COUNT; ++q) {
        const tide_queue_ops_t *sq = &src->queues[q];
        if (sq->num_ops == 0) continue;
        dst->queues[q].ops = malloc((size_t)sq->num_ops * sizeof(tide_op_t));
        if (dst->queues[q].ops == NULL)
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "program clone: %d ops", sq->num_ops);
        memcpy(dst->queues[q].ops, sq->ops, (size_t)sq->num_ops * sizeof(tide_op_t));
        dst->queues[q].num_ops = sq->num_ops;
        dst->queues[q].cap_ops = sq->num_ops;
    }
    if (src->num_tables == 0) return TIDE_SUCCESS;
    dst->tables = calloc((size_t)src->num_tables, sizeof(tide_table_t));
    if (dst->tables == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "program clone: %d tables", src->num_tables);
    dst->cap_tables = src->num_tables;
    for (int t = 0; t < src->num_tables; ++t) {
        dst->tables[t] = src->tables[t];
        tide_result_t res = copy_segs(&src->tables[t], &dst->tables[t]);
        dst->num_tables = t + 1; /* the table's own arrays are NULL or owned from here on */
        if (res != TIDE_SUCCESS) return res;
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_program_clone(const tide_program_t *src, tide_program_t *dst_out) {
    TIDE_ARG_CHECK(src != NULL, "src is NULL");
    TIDE_ARG_CHECK(dst_out != NULL, "dst_out is NULL");
    TIDE_ARG_CHECK(src->num_ranks >= 1 && src->ranks != NULL, "program has no ranks");
    tide_result_t res = TIDE_SUCCESS;
    tide_program_t copy = *src;
    copy.ranks = calloc((size_t)src->num_ranks, sizeof(tide_rank_program_t));
    if (copy.ranks == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "program clone: %d ranks", src->num_ranks);
    for (int r = 0; r < src->num_ranks; ++r)
        TIDE_CHECK_GOTO(clone_rank(&src->ranks[r], &copy.ranks[r]), res, fail_ranks);
    *dst_out = copy;
    return TIDE_SUCCESS;

fail_ranks:
    tide_program_free(&copy);
    return res;
}

tide_result_t tide_program_check_plan(const struct tide_plan *plan) {
    TIDE_ARG_CHECK(plan != NULL, "plan is NULL");
    const tide_topo_t *t = &plan->topo;
    const tide_geom_t *g = &plan->geom;
    TIDE_ARG_CHECK(t->nodes >= 1 && t->gpus_per_node >= 1 &&
                       t->gpus_per_node <= TIDE_MAX_GPUS_PER_NODE &&
                       t->ranks == t->nodes * t->gpus_per_node,
                   "plan topology M = %d, L = %d, N = %d is inconsistent", t->nodes,
                   t->gpus_per_node, t->ranks);
    TIDE_ARG_CHECK(g->ranks == t->ranks && g->num_params >= 1 && g->params != NULL,
                   "plan geometry (N = %d, P = %d) does not match its topology", g->ranks,
                   g->num_params);
    if (!tide_ctr_fits(plan))
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "plan needs %llu counters, the arena has %d",
                        (unsigned long long)tide_ctr_count(plan), TIDE_ARENA_SIGNAL_SLOTS);
    return TIDE_SUCCESS;
}
