/*
 * mp_rails.c - cross-node puts as rail steps on the one-process-per-rank fabrics (mp.h,
 * "rails"; docs/nccl-fabric.md, "Rails").
 *
 * What is shared by every rail transport lives here: which of this rank's ops a step carries,
 * how this rank waits on another node's signals, and one step's enqueue:
 *
 *   queue stream   cudaEventRecord(reach[s])      the queue reached the step's first put, so
 *                                                 the step's sources are written
 *   rail stream    cudaStreamWaitEvent(reach[s])
 *                  cuStreamWaitValue64 per credit the credit op of call e - delta ran here
 *                  (a wait kernel with TIDE_CUDA_MP_FLAGS=kernel: mp_flags.c):
 *                                                 the receives' buffers are free
 *                  transport->transfer            the sends and receives of the step
 *                  cuStreamWriteValue64(e + 1)    per receive: the put's flag slot in this
 *                                                 rank's own flag area, which this rank's
 *                                                 waits on the put read (TIDE_MP_SLOT_OWN)
 *                  cudaEventRecord(done[s])
 *   queue stream   cudaStreamWaitEvent(done[s])   the queue's next op sees the step done
 *
 * The schedule is built with tide_schedule_build_rails, so every wait on another node's
 * signal is in the command list and none was dropped because of the sender's stream order,
 * which the receiver no longer observes.  A wait on another node's credit is not issued: the
 * credit became a precondition of the receive it guards, on the credit's own rank
 * (program/rails.h).
 *
 * The emulated transport (TIDE_CUDA_MP_RAILS=1 on the CUDA fabric) gives a step the semantics
 * of a rendezvous send / receive over memory every rank maps: the receiver announces the step
 * (its receives are posted: its credits passed), the sender waits for that, copies into the
 * receiver and announces its sends done, and the receiver waits for that.  It exists so that
 * the rail machinery above runs, and is checked bit for bit, on one host.
 */
#include "core/checks.h"
#include "fabric/cuda/mp.h"

#include <stdlib.h>
#include <string.h>

static int op_id(const tide_schedule_t *s, int rank, int queue, int op) {
    return s->op_base[rank * TIDE_CUDA_Q + queue] + op;
}

static tide_result_t cu_check(CUresult e, const char *what) {
    if (e == CUDA_SUCCESS) return TIDE_SUCCESS;
    const char *name = NULL;
    cuGetErrorName(e, &name);
    return TIDE_ERR(TIDE_ERR_FABRIC, "rails: %s: %s", what, name ? name : "?");
}

/* A wait on a flag: cuStreamWaitValue64, or a wait kernel with TIDE_CUDA_MP_FLAGS=kernel
 * (mp_flags.c, which names the failed operation). */
static tide_result_t wait_geq(tide_mp_arena_t *a, cudaStream_t s, CUdeviceptr flag,
                              uint64_t value) {
    return tide_cuda_mp_flags_wait(a, s, &flag, 1, value, NULL);
}

static tide_result_t write_value(cudaStream_t s, CUdeviceptr flag, uint64_t value,
                                 const char *w) {
    return cu_check(cuStreamWriteValue64((CUstream)s, flag, value, 0), w);
}

void tide_cuda_mp_rails_release(tide_mp_rails_prog_t *rp) {
    for (int s = 0; s < rp->sched.num_steps; ++s) {
        if (rp->reach != NULL && rp->reach[s] != NULL) cudaEventDestroy(rp->reach[s]);
        if (rp->done != NULL && rp->done[s] != NULL) cudaEventDestroy(rp->done[s]);
    }
    free(rp->reach);
    free(rp->done);
    free(rp->op_kind);
    free(rp->op_step);
    free(rp->slot_kind);
    tide_rails_free(&rp->sched);
    (void)cudaGetLastError();
    memset(rp, 0, sizeof(*rp));
}

/* A slot of another node's rank: a put to this rank (its flag is written here), a credit (not
 * waited for), or anything else (-1: a wait on it cannot be carried). */
static int remote_slot_kind(const tide_rails_t *rs, const tide_program_t *prog, int me, int u,
                            int q, int i) {
    const tide_rails_rank_t *ru = &rs->ranks[u];
    const tide_op_t *op = &prog->ranks[u].queues[q].ops[i];
    if (q == ru->queue && ru->put_step[i] >= 0 && op->sig_rank == me) return TIDE_MP_SLOT_OWN;
    if (ru->credit[q] != NULL && ru->credit[q][i]) return TIDE_MP_SLOT_SKIP;
    return -1;
}

static tide_result_t classify(tide_mp_arena_t *a, tide_mp_prepared_t *pp,
                              const tide_program_t *prog) {
    tide_mp_rails_prog_t *rp = &pp->rails;
    const tide_schedule_t *s = &pp->sched;
    const int me = a->w->base.rank, l = a->w->base.gpus_per_node;
    const tide_rails_rank_t *rr = &rp->sched.ranks[me];
    rp->op_kind = calloc((size_t)s->num_ops + 1, 1);
    rp->op_step = malloc(((size_t)s->num_ops + 1) * sizeof(*rp->op_step));
    int8_t *kind = calloc((size_t)s->num_slots + 1, 1);
    rp->slot_kind = calloc((size_t)s->num_slots + 1, 1);
    if (rp->op_kind == NULL || rp->op_step == NULL || kind == NULL || rp->slot_kind == NULL) {
        free(kind);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: %d ops", s->num_ops);
    }
    for (int id = 0; id < s->num_ops; ++id)
        rp->op_step[id] = -1;
    if (rr->queue >= 0) {
        const int q = rr->queue;
        for (int i = 0; i < prog->ranks[me].queues[q].num_ops; ++i) {
            const int st = rr->put_step[i];
            if (st < 0) continue;
            const int id = op_id(s, me, q, i);
            rp->op_step[id] = st;
            rp->op_kind[id] = rr->steps[st].first_op == i ? TIDE_MP_RAIL_STEP : TIDE_MP_RAIL_IN_STEP;
        }
    }
    for (int u = 0; u < s->num_ranks; ++u) {
        if (u / l == me / l) continue;
        for (int q = 0; q < TIDE_CUDA_Q; ++q)
            for (int i = 0; i < prog->ranks[u].queues[q].num_ops; ++i) {
                const int slot = s->op_slot[op_id(s, u, q, i)];
                if (slot >= 0) kind[slot] = (int8_t)remote_slot_kind(&rp->sched, prog, me, u, q, i);
            }
    }
    tide_result_t res = TIDE_SUCCESS;
    for (int f = 0; f < TIDE_SCHED_FORMS && res == TIDE_SUCCESS; ++f)
        for (int i = 0; i < pp->num_cmds[f]; ++i) {
            const tide_sched_cmd_t *c = &pp->cmds[f][i];
            if (c->kind != TIDE_SCHED_CMD_WAIT && c->kind != TIDE_SCHED_CMD_WAIT_PREV) continue;
            if (kind[c->arg] < 0) {
                res = TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                               "rails: rank %d waits on a signal of rank %d (another node) that "
                               "is neither a put to it nor a credit",
                               me, s->slot_thread[c->arg] / TIDE_CUDA_Q);
                break;
            }
        }
    for (int k = 0; k < s->num_slots; ++k)
        rp->slot_kind[k] = kind[k] < 0 ? TIDE_MP_SLOT_PEER : (uint8_t)kind[k];
    free(kind);
    return res;
}

tide_result_t tide_cuda_mp_rails_prepare(tide_mp_arena_t *a, tide_mp_prepared_t *pp,
                                         const tide_program_t *prog) {
    tide_mp_rails_prog_t *rp = &pp->rails;
    memset(rp, 0, sizeof(*rp));
    TIDE_CHECK(tide_rails_build(prog, &rp->sched));
    rp->on = true;
    const int me = a->w->base.rank, steps = rp->sched.num_steps;
    const tide_rails_rank_t *rr = &rp->sched.ranks[me];
    tide_result_t res = TIDE_SUCCESS;
    if (steps > TIDE_MP_RAIL_STEPS) {
        res = TIDE_ERR(TIDE_ERR_UNSUPPORTED, "rails: %d steps per call, at most %d", steps,
                       TIDE_MP_RAIL_STEPS);
        goto fail;
    }
    /* A receive waits on its credits' flags: each credit must own a slot. */
    for (int c = 0; c < rr->num_credits; ++c)
        if (pp->sched.op_slot[op_id(&pp->sched, me, rr->credits[c].queue, rr->credits[c].op)] <
            0) {
            res = TIDE_ERR(TIDE_ERR_UNSUPPORTED, "rails: rank %d: credit %s[%d] has no flag slot",
                           me, tide_queue_name((tide_queue_t)rr->credits[c].queue),
                           rr->credits[c].op);
            goto fail;
        }
    TIDE_CHECK_GOTO(classify(a, pp, prog), res, fail);
    rp->reach = calloc((size_t)steps + 1, sizeof(*rp->reach));
    rp->done = calloc((size_t)steps + 1, sizeof(*rp->done));
    if (rp->reach == NULL || rp->done == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "rails: %d steps", steps);
        goto fail;
    }
    for (int s = 0; s < steps; ++s) {
        TIDE_CUDA_CALL_GOTO(cudaEventCreateWithFlags(&rp->reach[s], cudaEventDisableTiming),
                            "cudaEventCreateWithFlags(rail reach)", res, fail);
        TIDE_CUDA_CALL_GOTO(cudaEventCreateWithFlags(&rp->done[s], cudaEventDisableTiming),
                            "cudaEventCreateWithFlags(rail done)", res, fail);
    }
    return TIDE_SUCCESS;
fail:
    tide_cuda_mp_rails_release(rp);
    return res;
}

tide_result_t tide_cuda_mp_rails_resolve(const tide_mp_arena_t *a, const tide_mp_rails_call_t *c,
                                         int rank, const tide_ref_t *ref, bool bank_dep,
                                         uint64_t bytes, void **ptr_out) {
    const struct tide_plan *plan = c->b->plan;
    const int me = a->w->base.rank;
    uint8_t *base = NULL;
    uint64_t size = 0, off = ref->offset;
    if ((ref->kind == TIDE_REF_ARENA || ref->kind == TIDE_REF_LANDING) && ref->rank == rank &&
        rank >= 0 && rank < a->w->base.ranks) {
        const int region =
            ref->kind == TIDE_REF_LANDING ? TIDE_REGION_LANDING0 + c->b->slot : ref->region;
        if (region < 0 || region >= TIDE_REGION_COUNT)
            return TIDE_ERR(TIDE_ERR_INTERNAL, "rails: region %d", region);
        if (bank_dep && ref->kind == TIDE_REF_ARENA &&
            !tide_add_u64(off, (c->b->epoch % 2) * c->prog->bank_bytes[region], &off))
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "rails: bank offset");
        if (a->base.bases[rank] != NULL) base = a->base.bases[rank] + plan->arena.regions[region].offset;
        size = plan->arena.regions[region].bytes;
    } else if (ref->kind == TIDE_REF_SHARD && rank == me) {
        base = (uint8_t *)(uintptr_t)c->b->shard;
        size = tide_bind_shard_bytes(plan);
    } else if (ref->kind == TIDE_REF_GRAD && rank == me && c->b->grads != NULL &&
               ref->param >= 0 && ref->param < plan->geom.num_params) {
        /* The rail lane's RS puts straight from the gradient operands (compile_lane.c). */
        const tide_geom_param_t *gp = &plan->geom.params[ref->param];
        base = (uint8_t *)(uintptr_t)c->b->grads[ref->param];
        if (!tide_mul_u64(gp->dim0 * gp->inner, (uint64_t)plan->geom.grad_item, &size))
            return TIDE_ERR(TIDE_ERR_OVERFLOW, "rails: gradient %d bytes", ref->param);
    } else {
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "rails: rank %d cannot address reference kind %d of rank %d on rank %d",
                        me, (int)ref->kind, ref->rank, rank);
    }
    if (base == NULL || off > size || bytes > size - off)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "rails: rank %d: [%llu, +%llu) of rank %d not mapped or outside its %llu "
                        "bytes (kind %d)",
                        me, (unsigned long long)off, (unsigned long long)bytes, rank,
                        (unsigned long long)size, (int)ref->kind);
    *ptr_out = base + off;
    return TIDE_SUCCESS;
}

/* The credits of the step: each receive's buffer is free on this rank. */
static tide_result_t wait_credits(tide_mp_arena_t *a, const tide_mp_rails_call_t *c,
                                  const tide_rail_step_t *st, cudaStream_t rail) {
    const int me = a->w->base.rank;
    const tide_rails_rank_t *rr = &c->pp->rails.sched.ranks[me];
    const int64_t e = (int64_t)c->b->epoch;
    for (int k = st->first_credit; k < st->first_credit + st->num_credits; ++k) {
        const tide_rail_credit_t *cr = &rr->credits[k];
        if (e - cr->delta < 0) continue; /* the first calls start from a fresh arena */
        CUdeviceptr flag;
        if (cr->delta > 0 && !c->steady) {
            /* The previous call ran another program (the other RS mode): its credit op is not
             * this one's, but it ran before this rank's call e - 1 ended. */
            flag = tide_cuda_mp_done_flag(a, me, c->coll);
        } else {
            const int slot = c->pp->sched.op_slot[op_id(&c->pp->sched, me, cr->queue, cr->op)];
            flag = tide_cuda_mp_slot_flag(a, me, c->fidx, slot);
        }
        TIDE_CHECK(wait_geq(a, rail, flag, (uint64_t)(e - cr->delta + 1)));
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_rails_issue(tide_mp_arena_t *a, const tide_mp_rails_call_t *c,
                                       int step, cudaStream_t queue) {
    tide_mp_world_t *w = a->w;
    const tide_mp_rails_prog_t *rp = &c->pp->rails;
    const int me = w->base.rank;
    if (w->rails == NULL || w->rail_stream == NULL || !rp->on || step < 0 ||
        step >= rp->sched.num_steps)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "rails: step %d of %d without a transport", step,
                        rp->sched.num_steps);
    const tide_rails_rank_t *rr = &rp->sched.ranks[me];
    const tide_rail_step_t *st = &rr->steps[step];
    const cudaStream_t rail = w->rail_stream;
    TIDE_CUDA_CALL(cudaEventRecord(rp->reach[step], queue), "cudaEventRecord(rail reach)");
    TIDE_CUDA_CALL(cudaStreamWaitEvent(rail, rp->reach[step], 0), "cudaStreamWaitEvent(reach)");
    TIDE_CHECK(wait_credits(a, c, st, rail));
    TIDE_CHECK(w->rails->transfer(a, rp, c, step, rail));
    const uint64_t value = c->b->epoch + 1;
    for (int k = st->first_recv; k < st->first_recv + st->num_recvs; ++k) {
        const tide_rail_xfer_t *x = &rr->recvs[k];
        const int slot = c->pp->sched.op_slot[op_id(&c->pp->sched, x->src_rank, x->queue, x->op)];
        if (slot < 0) continue; /* no wait of this rank names the put */
        TIDE_CHECK(write_value(rail, tide_cuda_mp_slot_flag(a, me, c->fidx, slot), value,
                               "cuStreamWriteValue64(arrival)"));
    }
    TIDE_CUDA_CALL(cudaEventRecord(rp->done[step], rail), "cudaEventRecord(rail done)");
    TIDE_CUDA_CALL(cudaStreamWaitEvent(queue, rp->done[step], 0), "cudaStreamWaitEvent(done)");
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ the emulated transport */

static tide_result_t emulated_transfer(tide_mp_arena_t *a, const tide_mp_rails_prog_t *rp,
                                       const tide_mp_rails_call_t *c, int step,
                                       cudaStream_t rail) {
    const int me = a->w->base.rank;
    const tide_rails_rank_t *rr = &rp->sched.ranks[me];
    const tide_rail_step_t *st = &rr->steps[step];
    const uint64_t value = c->b->epoch + 1;
    /* This rank's receives of the step are posted (its credits passed: issue waited). */
    TIDE_CHECK(write_value(rail, tide_cuda_mp_rail_flag(a, me, c->fidx, step, 0), value,
                           "cuStreamWriteValue64(rail posted)"));
    for (int k = st->first_send; k < st->first_send + st->num_sends; ++k) {
        const tide_rail_xfer_t *x = &rr->sends[k];
        if (x->bytes == 0) continue; /* an empty put: nothing to move (program/rails.h) */
        void *src = NULL, *dst = NULL;
        TIDE_CHECK(tide_cuda_mp_rails_resolve(a, c, me, &x->src, x->bank_dep, x->bytes, &src));
        TIDE_CHECK(tide_cuda_mp_rails_resolve(a, c, x->dst_rank, &x->dst, x->bank_dep, x->bytes,
                                              &dst));
        TIDE_CHECK(
            wait_geq(a, rail, tide_cuda_mp_rail_flag(a, x->dst_rank, c->fidx, step, 0), value));
        TIDE_CUDA_CALL(cudaMemcpyAsync(dst, src, (size_t)x->bytes, cudaMemcpyDefault, rail),
                       "cudaMemcpyAsync(rail send)");
    }
    TIDE_CHECK(write_value(rail, tide_cuda_mp_rail_flag(a, me, c->fidx, step, 1), value,
                           "cuStreamWriteValue64(rail sent)"));
    for (int k = st->first_recv; k < st->first_recv + st->num_recvs; ++k) {
        const int from = rr->recvs[k].src_rank;
        if (k > st->first_recv && rr->recvs[k - 1].src_rank == from) continue;
        TIDE_CHECK(wait_geq(a, rail, tide_cuda_mp_rail_flag(a, from, c->fidx, step, 1), value));
    }
    return TIDE_SUCCESS;
}

const tide_mp_rails_ops_t tide_cuda_mp_rails_emulated = {"emulated", emulated_transfer};
