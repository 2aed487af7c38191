/*
 * sync_elide.c - the model of a fused direct-mode reduce-scatter program with the proposed
 * synchronisation removed (program/sync_elide.h says what the model is and why).
 *
 * Which waits and signals go.  With every push elided and every landing fused (checked here
 * with the fabrics' analysis), staging is written by nobody (the pull that stands in for the
 * SUM's in-place reads lives on the reader's own queue), the spare is written and read by one
 * queue of one rank, and each output piece is written by one rank's SUM.  So the credits
 * (STG_CREDIT), PUSHED, SUMMED, SPARE_USED and the node barriers (NODE_ARRIVED, NODE_LANDED)
 * order nothing the end-of-call fence does not, and every counter but STAGED is dropped.
 * STAGED stays: it is the only thing that orders a peer's reads of my gradients and writes
 * of my output after my caller reached the call (modelled by the checker's operand entry).
 * This is a rule for this one program shape, not a general elision: anything outside it is
 * refused (TIDE_ERR_UNSUPPORTED) rather than guessed.
 *
 * The all-gather at M = 1 (no cast) needs no lowering: its copies into the peers' landings
 * are ordinary ops of the program.  Its model keeps READY ("my landing is free for this
 * call") and drops LANDED, CALLER_DONE and the copies' fused signals; the fence and the
 * EVENTs after it are the reduce-scatter's.
 */
#include "program/sync_elide.h"

#include "core/checks.h"
#include "plan/plan.h"
#include "program/direct.h"
#include "program/schedule.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const tide_program_t *prog;
    int flags, n;
    tide_schedule_t sched;
    tide_direct_t dir;
    uint8_t *emitted; /* [num_ops]: fused LANDs already moved behind their SUM */
    tide_program_t model;
    tide_sync_elide_stats_t st;
} se_t;

static bool is_copy(const tide_op_t *op) {
    return op->kind == TIDE_OP_COPY || op->kind == TIDE_OP_COPY2D;
}

/* The counter that stays: STAGED (reduce-scatter), READY (all-gather). */
static bool keep_counter(const se_t *s, int ctr) {
    const int kept = s->prog->coll == TIDE_COLL_ALL_GATHER ? TIDE_CTR_AG_READY : TIDE_CTR_RS_STAGED;
    return ctr == kept && !(s->flags & TIDE_SYNC_ELIDE_DROP_STAGED);
}

/* The program is the shape the lowering knows (tide_sync_elide_shape, shared with the
 * fabrics' elision). */
static tide_result_t check_shape(const se_t *s) {
    char why[160];
    if (!tide_sync_elide_shape(s->prog, &s->sched, &s->dir, why, sizeof(why)))
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "sync elide: %s", why);
    return TIDE_SUCCESS;
}

static tide_result_t push(se_t *s, int rank, tide_queue_t q, const tide_op_t *op) {
    return tide_program_push(&s->model, rank, q, op);
}

/* A WAIT or SIGNAL (bare, or a copy's fused one as a bare SIGNAL), if its counter stays. */
static tide_result_t sync_op(se_t *s, int rank, tide_queue_t q, const tide_op_t *op) {
    const bool wait = op->kind == TIDE_OP_WAIT;
    if (!keep_counter(s, op->ctr)) {
        ++*(wait ? &s->st.waits_dropped : &s->st.signals_dropped);
        return TIDE_SUCCESS;
    }
    ++*(wait ? &s->st.waits_kept : &s->st.signals_kept);
    const tide_op_t x = wait ? *op : tide_op_signal(op->sig_rank, op->ctr);
    return push(s, rank, q, &x);
}

/* The pushes into `rank`'s staging, as pulls of the pushers' gradients on its READ queue. */
static tide_result_t pulls(se_t *s, int rank) {
    for (int r = 0; r < s->n; ++r) {
        const tide_queue_ops_t *ce = &s->prog->ranks[r].queues[TIDE_Q_CE];
        for (int i = 0; i < ce->num_ops; ++i) {
            tide_op_t op = ce->ops[i];
            if (!is_copy(&op) || op.dst.rank != rank) continue;
            op.src.rank = r; /* a peer operand: the pusher's gradient, read in place */
            op.sig_rank = -1;
            op.ctr = 0;
            TIDE_CHECK(push(s, rank, TIDE_Q_READ, &op));
        }
    }
    return TIDE_SUCCESS;
}

/* The LANDs fused into SUM `id` of `rank`, moved behind it, writing their owners' outputs. */
static tide_result_t fused_lands(se_t *s, int rank, int id) {
    for (int q = 0; q < s->dir.fuse_segs[id]; ++q) {
        const int land = s->dir.fuse[id][q].land;
        if (land < 0 || s->emitted[land]) continue;
        s->emitted[land] = 1;
        const int lt = tide_direct_thread_of(&s->sched, land), owner = lt / TIDE_Q_COUNT;
        const tide_op_t *op = tide_schedule_op(s->prog, &s->sched, land, lt);
        tide_table_t t = s->prog->ranks[owner].tables[op->table];
        t.out = tide_ref_operand(TIDE_REF_OUT, 0, 0);
        t.out.rank = owner;
        tide_op_t x = *op;
        TIDE_CHECK(tide_program_add_table(&s->model, rank, &t, &x.table));
        TIDE_CHECK(push(s, rank, TIDE_Q_READ, &x));
        ++s->st.landings_fused;
    }
    return TIDE_SUCCESS;
}

/* The end-of-call fence written out (sync_elide.h) on the queues qs[0 .. nqs) of rank r,
 * then the late ops: the RS output's padding ZEROs (of `net`, or none) and the EVENTs
 * (every event for the RS; the all-gather's own EVENT ops, in program order). */
static tide_result_t add_fence(se_t *s, int r, const tide_queue_t *qs, int nqs,
                               const tide_queue_ops_t *net) {
    const bool ag = s->prog->coll == TIDE_COLL_ALL_GATHER;
    const int ctr_queues = ag ? TIDE_SYNC_ELIDE_AG_CTR_QUEUES : TIDE_SYNC_ELIDE_CTR_QUEUES;
    int nq = 0;
    for (int k = 0; k < nqs; ++k)
        if (s->model.ranks[r].queues[qs[k]].num_ops > 0) {
            const tide_op_t sig = tide_op_signal(r, ctr_queues);
            TIDE_CHECK(push(s, r, qs[k], &sig));
            ++nq;
        }
    tide_op_t w = tide_op_wait(r, ctr_queues, nq, nq);
    if (nq > 0) TIDE_CHECK(push(s, r, TIDE_Q_CALLER, &w));
    for (int i = 1; i <= s->n; ++i) {
        const tide_op_t sig = tide_op_signal((r + i) % s->n, TIDE_SYNC_ELIDE_CTR_FENCE);
        TIDE_CHECK(push(s, r, TIDE_Q_CALLER, &sig));
    }
    w = tide_op_wait(r, TIDE_SYNC_ELIDE_CTR_FENCE, s->n, s->n);
    TIDE_CHECK(push(s, r, TIDE_Q_CALLER, &w));
    /* The output's padding is zeroed after every landing of it in the program; the peers'
     * fused sums write those bytes too, and only the barriers ordered them before the ZERO.
     * The fence does now (the proposal as first written missed this). */
    for (int i = 0; net != NULL && i < net->num_ops; ++i)
        if (net->ops[i].kind == TIDE_OP_ZERO) TIDE_CHECK(push(s, r, TIDE_Q_CALLER, &net->ops[i]));
    if (ag) {
        const tide_rank_program_t *rp = &s->prog->ranks[r];
        for (int q = 0; q < TIDE_Q_COUNT; ++q)
            for (int i = 0; i < rp->queues[q].num_ops; ++i)
                if (rp->queues[q].ops[i].kind == TIDE_OP_EVENT)
                    TIDE_CHECK(push(s, r, TIDE_Q_CALLER, &rp->queues[q].ops[i]));
        return TIDE_SUCCESS;
    }
    for (int e = 0; e < TIDE_EVENT_COUNT; ++e) {
        tide_op_t ev = tide_op_new(TIDE_OP_EVENT);
        ev.event = (uint8_t)e;
        TIDE_CHECK(push(s, r, TIDE_Q_CALLER, &ev));
    }
    return TIDE_SUCCESS;
}

/* The all-gather at M = 1 as the fabrics run it elided (sync_elide_plan.c): every copy as it
 * is (the copies into the peers' landings are ordinary ops of this program), their fused
 * signals and every WAIT / SIGNAL on a counter other than READY dropped, the EVENTs after
 * the fence.  An op of another kind (a cast) is outside the shape the elision runs. */
static tide_result_t lower_ag_rank(se_t *s, int r) {
    const tide_rank_program_t *rp = &s->prog->ranks[r];
    const bool fence = !(s->flags & TIDE_SYNC_ELIDE_NO_FENCE);
    static const tide_queue_t qs[] = {TIDE_Q_READY, TIDE_Q_CALLER, TIDE_Q_CE, TIDE_Q_DONE};
    for (int k = 0; k < 4; ++k) {
        const tide_queue_t q = qs[k];
        for (int i = 0; i < rp->queues[q].num_ops; ++i) {
            const tide_op_t *op = &rp->queues[q].ops[i];
            switch (op->kind) {
            case TIDE_OP_WAIT:
            case TIDE_OP_SIGNAL:
                TIDE_CHECK(sync_op(s, r, q, op));
                break;
            case TIDE_OP_COPY:
            case TIDE_OP_COPY2D: {
                tide_op_t x = *op;
                if (x.sig_rank >= 0 && !keep_counter(s, x.ctr)) {
                    ++s->st.signals_dropped;
                    x.sig_rank = -1;
                    x.ctr = 0;
                } else if (x.sig_rank >= 0) {
                    ++s->st.signals_kept;
                }
                TIDE_CHECK(push(s, r, q, &x));
                break;
            }
            case TIDE_OP_EVENT: /* after the fence, unless there is none */
                if (!fence) TIDE_CHECK(push(s, r, q, op));
                break;
            default:
                return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                                "sync elide: all-gather op %d of rank %d queue %s is a %d, not "
                                "a copy, wait, signal or event",
                                i, r, tide_queue_name(q), (int)op->kind);
            }
        }
    }
    if (rp->queues[TIDE_Q_READ].num_ops + rp->queues[TIDE_Q_NET].num_ops > 0)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "sync elide: rank %d's all-gather uses the "
                                              "read or net queue (not M = 1)", r);
    return fence ? add_fence(s, r, qs, 4, NULL) : TIDE_SUCCESS;
}

static tide_result_t lower_rank(se_t *s, int r) {
    const tide_rank_program_t *rp = &s->prog->ranks[r];
    /* Same table indices as the program: the SUM ops keep theirs. */
    for (int t = 0; t < rp->num_tables; ++t) {
        int idx;
        TIDE_CHECK(tide_program_add_table(&s->model, r, &rp->tables[t], &idx));
    }
    const bool fence = !(s->flags & TIDE_SYNC_ELIDE_NO_FENCE);
    const tide_queue_t qs[] = {TIDE_Q_CE, TIDE_Q_READ, TIDE_Q_NET};
    for (int k = 0; k < 3; ++k) {
        const tide_queue_t q = qs[k];
        const int base = s->sched.op_base[r * TIDE_Q_COUNT + (int)q];
        for (int i = 0; i < rp->queues[q].num_ops; ++i) {
            const tide_op_t *op = &rp->queues[q].ops[i];
            switch (op->kind) {
            case TIDE_OP_WAIT:
            case TIDE_OP_SIGNAL:
                TIDE_CHECK(sync_op(s, r, q, op));
                break;
            case TIDE_OP_COPY:
            case TIDE_OP_COPY2D: /* elided; its fused signal fires where it stood */
                ++s->st.pushes_elided;
                if (op->sig_rank >= 0) TIDE_CHECK(sync_op(s, r, q, op));
                break;
            case TIDE_OP_SUM:
                TIDE_CHECK(pulls(s, r));
                TIDE_CHECK(push(s, r, q, op));
                TIDE_CHECK(fused_lands(s, r, base + i));
                break;
            case TIDE_OP_ZERO: /* the output's padding: after the fence, unless there is none */
                if (!fence) TIDE_CHECK(push(s, r, q, op));
                break;
            case TIDE_OP_EVENT: /* after the fence, unless there is none */
                if (!fence) TIDE_CHECK(push(s, r, q, op));
                break;
            default: /* TIDE_OP_LAND: fused, moved behind its SUM */
                break;
            }
        }
    }
    return fence ? add_fence(s, r, qs, 3, &rp->queues[TIDE_Q_NET]) : TIDE_SUCCESS;
}

static tide_result_t build(se_t *s) {
    if (s->prog->coll == TIDE_COLL_ALL_GATHER) {
        TIDE_CHECK(tide_program_init(s->prog->plan, s->prog->coll, s->prog->mode, &s->model));
        memcpy(s->model.bank_bytes, s->prog->bank_bytes, sizeof(s->model.bank_bytes));
        for (int r = 0; r < s->n; ++r)
            TIDE_CHECK(lower_ag_rank(s, r));
        return TIDE_SUCCESS;
    }
    TIDE_CHECK(tide_schedule_layout(s->prog, &s->sched));
    TIDE_CHECK(
        tide_direct_analyse(s->prog, &s->sched, TIDE_DIRECT_SUM | TIDE_DIRECT_FUSE, NULL, &s->dir));
    if (!s->dir.rs || !s->dir.sum || s->dir.fuse == NULL)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "sync elide: the program has no fused direct mode");
    TIDE_CHECK(check_shape(s));
    s->emitted = calloc((size_t)s->sched.num_ops + 1, 1);
    if (s->emitted == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "sync elide: %d ops", s->sched.num_ops);
    TIDE_CHECK(tide_program_init(s->prog->plan, s->prog->coll, s->prog->mode, &s->model));
    memcpy(s->model.bank_bytes, s->prog->bank_bytes, sizeof(s->model.bank_bytes));
    for (int r = 0; r < s->n; ++r)
        TIDE_CHECK(lower_rank(s, r));
    /* Every LAND must have been moved behind a SUM: the fuse plan covers them all. */
    for (int id = 0; id < s->sched.num_ops; ++id)
        if (s->dir.fused_land[id] && !s->emitted[id])
            return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "sync elide: fused landing %d has no SUM", id);
    return TIDE_SUCCESS;
}

tide_result_t tide_sync_elide_model(const tide_program_t *prog, int flags,
                                    tide_program_t *model_out, tide_sync_elide_stats_t *stats_out) {
    TIDE_ARG_CHECK(prog != NULL && prog->plan != NULL && prog->ranks != NULL && model_out != NULL,
                   "sync elide: program and model_out must be non-NULL");
    TIDE_ARG_CHECK((flags & ~(TIDE_SYNC_ELIDE_DROP_STAGED | TIDE_SYNC_ELIDE_NO_FENCE)) == 0,
                   "sync elide: unknown flags 0x%x", (unsigned)flags);
    if (prog->fence != 0 || prog->plan->topo.nodes != 1 || prog->plan->topo.gpus_per_node < 2)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "sync elide: only reduce-scatter and all-gather programs at M = 1, "
                        "L >= 2");
    se_t s;
    memset(&s, 0, sizeof(s));
    s.prog = prog;
    s.flags = flags;
    s.n = prog->num_ranks;
    const tide_result_t res = build(&s);
    free(s.emitted);
    tide_direct_free(&s.dir);
    tide_schedule_free(&s.sched);
    if (res != TIDE_SUCCESS) {
        tide_program_free(&s.model);
        return res;
    }
    *model_out = s.model;
    if (stats_out != NULL) *stats_out = s.st;
    return TIDE_SUCCESS;
}
