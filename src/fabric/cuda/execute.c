/*
 * execute.c - a call on the CUDA fabric: every rank's execute binds its ops; the last rank's
 * execute enqueues the call of all ranks.
 *
 * The commands of a program's schedule (program/schedule_commands.c) span all ranks, so a call can only be
 * enqueued once all N bindings are known.  execute for rank r therefore validates and binds
 * rank r's ops into the pending call and returns; the N-th execute replays the command list
 * of the call's form on the streams and returns.  One thread may drive all ranks (rank 0 to
 * N-1, call after call); with a thread per rank, a rank that runs one call ahead waits until
 * the pending call is enqueued (TIDE_TIMEOUT_MS deadline).
 *
 * The caller's stream of rank r (NULL: the legacy default stream of r's device; else a stream
 * of r's device) orders the call like a kernel launched on it:
 *
 *   caller_r : [wait fence(e-2)] record start ................ wait ends, record done
 *   (r, q)   :                      wait start, ops, records, waits ... record end
 *   agg      :                                                     wait done (all ranks),
 *                                                                  record fence(e)
 *
 * So rank r's call starts after the caller's earlier work and its previous call, and the
 * caller's later work starts after rank r's call: a rank's calls are serialised, as in the
 * abstract execution.  The fence of call e - 2 (all ranks finished it) bounds what a STEADY
 * call may depend on to the current and the previous call: a STEADY wait needs e inc + thr
 * signals; the fence covers the first (e - 1) inc, its event waits on calls e - 1 and e the
 * inc + thr the abstract execution found in its calls 0 and 1.  A FRESH call (epoch 0, or
 * after another program: the other RS mode) waits on the fence of call e - 1 instead and uses
 * the epoch-0 dependencies.
 *
 * No deadlock.  Every wait names an event recorded earlier in host enqueue order: this
 * call's signals precede their waits in the global order of the abstract execution, the
 * previous call's and the fences were enqueued by earlier calls, the start events by this
 * call's prologue.  Take the op enqueued first among those not yet complete: everything
 * it waits for was enqueued before it, hence is complete; every op ahead of it in its stream,
 * and in whatever hardware queue the driver maps that stream to, was enqueued before it as
 * well, hence is complete.  So it can run, and by induction every op completes, whatever the
 * number of streams, hardware queues or virtual ranks per GPU.  A batch of copies (batch.c)
 * is enqueued at the position of its first op and holds only ops of one thread that follow
 * each other with nothing of that thread between them, so it changes none of this.
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"
#include "fabric/cuda/graph.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ enqueue */

typedef struct {
    tide_cuda_shared_t *sh;
    tide_cuda_group_t *g;
    tide_cuda_family_t *fam;
    tide_cuda_prepared_t *pp;
    int parity;
    int cur_dev;
    bool graph; /* the call is being captured: its tables are the family's graph tables */
    tide_cuda_stats_t st;
} issue_t;

static tide_result_t on_device_of(issue_t *is, int rank) {
    const int d = tide_cuda_device_of(is->sh, rank);
    if (d == is->cur_dev) return TIDE_SUCCESS;
    TIDE_CUDA_CALL(cudaSetDevice(d), "cudaSetDevice");
    is->cur_dev = d;
    return TIDE_SUCCESS;
}

static cudaStream_t caller_of(const issue_t *is, int rank) {
    cudaStream_t s = is->fam->caller[rank];
    return s != NULL ? s : cudaStreamLegacy;
}

static tide_result_t wait_on(issue_t *is, cudaStream_t s, cudaEvent_t ev) {
    ++is->st.waits;
    TIDE_CUDA_CALL(cudaStreamWaitEvent(s, ev, 0), "cudaStreamWaitEvent");
    return TIDE_SUCCESS;
}

static tide_result_t record_on(issue_t *is, cudaEvent_t ev, cudaStream_t s) {
    ++is->st.records;
    TIDE_CUDA_CALL(cudaEventRecord(ev, s), "cudaEventRecord");
    return TIDE_SUCCESS;
}

static tide_result_t issue_op(issue_t *is, int id, int t) {
    const int rank = t / TIDE_CUDA_Q, q = t % TIDE_CUDA_Q, index = id - is->pp->sched.op_base[t];
    const tide_rank_program_t *rp = &is->pp->checked[rank]->ranks[rank];
    const tide_op_t *op = &rp->queues[q].ops[index];
    const cudaStream_t s = is->sh->stream[t];
    if (is->pp->elide != NULL && is->pp->elide[id]) {
        ++is->st.elided;
        return TIDE_SUCCESS; /* direct mode: nothing reads what it would write (direct.c) */
    }
    if (is->pp->fused_land != NULL && is->pp->fused_land[id]) {
        ++is->st.fused;
        return TIDE_SUCCESS; /* direct mode: a fused sum stored this landing (direct.c) */
    }
    if (op->kind == TIDE_OP_EVENT) {
        /* Direct mode: the node's sums read this rank's gradients until the node's call
         * ends; read-done is recorded then (enqueue_commands). */
        if (is->pp->direct_sum && op->event == TIDE_EVENT_READ_DONE) return TIDE_SUCCESS;
        /* Direct all-gather: other ranks read this rank's shard until their calls end;
         * call-done is recorded then (enqueue_commands). */
        if (is->pp->direct_ag && op->event == TIDE_EVENT_CALL_DONE) return TIDE_SUCCESS;
        return record_on(is, is->fam->user[rank * TIDE_EVENT_COUNT + op->event], s);
    }
    const tide_cuda_op_env_t env = {
        .max_pitch = is->sh->max_pitch[is->cur_dev],
        .sm_count = is->sh->sm_count[is->cur_dev],
        .sum_ctas = is->fam->sum_ctas,
        .landing_ctas = is->fam->landing_ctas,
        .slicing = &is->sh->slicing,
    };
    /* SIGNAL: its record follows as a command. */
    return tide_cuda_op_issue(&env, rp, rank, q, index, &is->pp->bound[id], s, &is->st);
}

/* Refresh rank r's gradient pointer table of this parity (skipped when unchanged). */
static tide_result_t issue_upload(issue_t *is, int t) {
    tide_cuda_family_t *fam = is->fam;
    const int r = t / TIDE_CUDA_Q, p = is->parity, np = fam->num_params, nr = fam->own_row;
    const size_t row = (size_t)nr * sizeof(void *);
    const void **want = &fam->grads[(size_t)r * (size_t)np];
    if (is->pp->direct_sum) {
        tide_cuda_direct_row(fam, is->pp->direct_l, r, fam->own_row_tmp);
        want = fam->own_row_tmp;
    }
    const void **last = &fam->own_last[p][(size_t)r * (size_t)nr];
    if (fam->own_valid[p][r] && memcmp(last, want, row) == 0) return TIDE_SUCCESS;
    /* The pinned row may still feed the copy of call e - 2. */
    if (fam->own_inflight[p][r])
        TIDE_CUDA_CALL(cudaEventSynchronize(fam->own_done[p][r]), "cudaEventSynchronize(upload)");
    const void **pinned = &fam->own_host[p][(size_t)r * (size_t)nr];
    memcpy(pinned, want, row);
    fam->own_valid[p][r] = false;
    ++is->st.descriptors;
    ++is->st.uploads;
    TIDE_CUDA_CALL(
        cudaMemcpyAsync(fam->own_dev[p][r], pinned, row, cudaMemcpyHostToDevice, is->sh->stream[t]),
        "cudaMemcpyAsync(gradient pointers)");
    TIDE_CHECK(record_on(is, fam->own_done[p][r], is->sh->stream[t]));
    fam->own_inflight[p][r] = true;
    memcpy(last, want, row);
    fam->own_valid[p][r] = true;
    return TIDE_SUCCESS;
}

/* Rank r's copy descriptors of this call into the device table of this parity, on the
 * caller's stream before the call's start event, which every thread of r forks from
 * (skipped when the table holds them already).  The fence the caller waited for ends every
 * kernel that read this table before. */
static tide_result_t batch_upload(issue_t *is, int r) {
    tide_cuda_prepared_t *pp = is->pp;
    const int p = is->parity, first = pp->slot_base[r], count = pp->slot_base[r + 1] - first;
    if (count == 0) return TIDE_SUCCESS;
    tide_cuda_batch_fill(pp, r);
    const size_t bytes = (size_t)count * sizeof(tide_cuda_copy_desc_t);
    tide_cuda_copy_desc_t *last = &pp->desc_last[p][first];
    if (pp->desc_valid[p][r] && memcmp(last, &pp->desc_call[first], bytes) == 0)
        return TIDE_SUCCESS;
    /* The pinned rows may still feed the upload of call e - 2. */
    if (pp->desc_inflight[p][r])
        TIDE_CUDA_CALL(cudaEventSynchronize(pp->desc_done[p][r]),
                       "cudaEventSynchronize(copy descriptors)");
    tide_cuda_copy_desc_t *pinned = &pp->desc_host[p][first];
    memcpy(pinned, &pp->desc_call[first], bytes);
    pp->desc_valid[p][r] = false;
    ++is->st.descriptors;
    ++is->st.uploads;
    const cudaStream_t s = caller_of(is, r);
    TIDE_CUDA_CALL(cudaMemcpyAsync(pp->desc_dev[p][r], pinned, bytes, cudaMemcpyHostToDevice, s),
                   "cudaMemcpyAsync(copy descriptors)");
    TIDE_CHECK(record_on(is, pp->desc_done[p][r], s));
    pp->desc_inflight[p][r] = true;
    memcpy(last, pinned, bytes);
    pp->desc_valid[p][r] = true;
    return TIDE_SUCCESS;
}

/* A batch: one kernel, or its copies one by one in order when they overlap. */
static tide_result_t issue_batch(issue_t *is, int b, int t) {
    tide_cuda_prepared_t *pp = is->pp;
    const tide_cuda_batch_t *bt = &pp->batches[b];
    if (!tide_cuda_batch_disjoint(pp, bt)) {
        is->st.unbatched += (uint64_t)bt->count;
        for (int k = bt->first; k < bt->first + bt->count; ++k)
            TIDE_CHECK(issue_op(is, pp->slot_op[k], t));
        return TIDE_SUCCESS;
    }
    ++is->st.descriptors;
    ++is->st.batches;
    is->st.batched += (uint64_t)bt->count;
    const tide_cuda_copy_desc_t *base = is->graph ? is->fam->graph_desc[bt->rank]
                                                  : pp->desc_dev[is->parity][bt->rank];
    const tide_cuda_copy_desc_t *table = base + (bt->first - pp->slot_base[bt->rank]);
    const cudaError_t e = tide_cuda_batch_copy(table, bt->count, bt->ctas, is->sh->stream[t]);
    if (e == cudaSuccess) return TIDE_SUCCESS;
    const int id = pp->slot_op[bt->first];
    const tide_op_t *op = tide_schedule_op(pp->checked[bt->rank], &pp->sched, id, t);
    return tide_cuda_op_failed(e, t / TIDE_CUDA_Q, t % TIDE_CUDA_Q, id - pp->sched.op_base[t],
                               op->kind, "tide_cuda_batch_copy");
}

static tide_result_t issue_cmd(issue_t *is, const tide_sched_cmd_t *c) {
    const int t = c->thread, r = t / TIDE_CUDA_Q;
    const cudaStream_t s = is->sh->stream[t];
    TIDE_CHECK(on_device_of(is, r));
    switch (c->kind) {
    case TIDE_SCHED_CMD_FORK:
        return wait_on(is, s, is->sh->start[r]);
    case TIDE_SCHED_CMD_OP:
        return issue_op(is, c->arg, t);
    case TIDE_SCHED_CMD_RECORD:
        return record_on(is, is->pp->events[is->parity][c->arg], s);
    case TIDE_SCHED_CMD_WAIT:
        return wait_on(is, s, is->pp->events[is->parity][c->arg]);
    case TIDE_SCHED_CMD_WAIT_PREV:
        return wait_on(is, s, is->pp->events[is->parity ^ 1][c->arg]);
    case TIDE_SCHED_CMD_UPLOAD: /* a captured call's table is uploaded already (graph.c) */
        return is->graph ? TIDE_SUCCESS : issue_upload(is, t);
    case TIDE_SCHED_CMD_UPLOAD_WAIT:
        return is->graph ? TIDE_SUCCESS : wait_on(is, s, is->fam->own_done[is->parity][r]);
    case TIDE_SCHED_CMD_JOIN:
        TIDE_CHECK(record_on(is, is->sh->end[t], s));
        return wait_on(is, caller_of(is, r), is->sh->end[t]);
    case TIDE_SCHED_CMD_BATCH:
        return issue_batch(is, c->arg, t);
    default:
        return TIDE_ERR(TIDE_ERR_INTERNAL, "cuda fabric: command kind %d", c->kind);
    }
}

/* A fence call of a view also waits, on every rank's caller stream, for the last call of each
 * family of every sibling view (every rank done: its family fence event).  The SIGNAL / WAIT
 * program alone orders the fence after the work on the streams the fence is enqueued on;
 * FSDP enqueues all-gathers and reduce-scatters on different streams, and a slot handed from
 * one group's reduce-scatter to another group's all-gather must wait for the former too.
 * Every such call was enqueued already: a rank calls the fence after its part of them, and a
 * call is enqueued when its last rank calls it. */
static tide_result_t wait_siblings(issue_t *is, int r) {
    const tide_cuda_group_t *parent = is->g->parent;
    if (is->fam != &is->g->fam[2] || parent == NULL) return TIDE_SUCCESS;
    for (const tide_cuda_group_t *v = parent->views; v != NULL; v = v->view_next) {
        if (v == is->g) continue;
        for (int f = 0; f < 3; ++f) {
            const tide_cuda_family_t *fam = &v->fam[f];
            if (fam->last_epoch < 0) continue;
            const int p = (int)(fam->last_epoch % 2);
            if (fam->fence_epoch[p] != fam->last_epoch)
                return TIDE_ERR(TIDE_ERR_INTERNAL,
                                "cuda fabric: fence: a sibling view's call %lld has no fence",
                                (long long)fam->last_epoch);
            TIDE_CHECK(wait_on(is, caller_of(is, r), fam->fence[p]));
        }
    }
    return TIDE_SUCCESS;
}

static tide_result_t enqueue_commands(issue_t *is, int form, uint64_t epoch, int64_t fence) {
    tide_cuda_shared_t *sh = is->sh;
    tide_cuda_family_t *fam = is->fam;
    const int n = sh->ranks;
    for (int r = 0; r < n; ++r) {
        TIDE_CHECK(on_device_of(is, r));
        if (fence >= 0) TIDE_CHECK(wait_on(is, caller_of(is, r), fam->fence[fence % 2]));
        TIDE_CHECK(wait_siblings(is, r));
        if (is->pp->batched && !is->graph) TIDE_CHECK(batch_upload(is, r));
        if (is->pp->direct && !is->graph)
            TIDE_CHECK(tide_cuda_direct_fuse_upload(sh, is->pp, is->parity, r, caller_of(is, r),
                                                    &is->st.uploads));
        TIDE_CHECK(record_on(is, sh->start[r], caller_of(is, r)));
    }
    const bool batched = is->pp->batched;
    const tide_sched_cmd_t *cmds = batched ? is->pp->bcmds[form] : is->pp->sched.cmds[form];
    const int num_cmds = batched ? is->pp->num_bcmds[form] : is->pp->sched.num_cmds[form];
    for (int i = 0; i < num_cmds; ++i)
        TIDE_CHECK(issue_cmd(is, &cmds[i]));
    for (int r = 0; r < n; ++r) {
        TIDE_CHECK(on_device_of(is, r));
        TIDE_CHECK(record_on(is, sh->done[r], caller_of(is, r)));
    }
    if (is->pp->direct_sum) {
        /* Read-done of every rank of a node once the node's call ended: its sums read the
         * gradients of all of them in place (direct.c).  On the device's utility stream, so
         * that no caller waits for another rank. */
        const int L = is->pp->direct_l;
        for (int n0 = 0; n0 < n; n0 += L) {
            TIDE_CHECK(on_device_of(is, n0));
            const cudaStream_t u = sh->util[is->cur_dev];
            for (int j = n0; j < n0 + L; ++j)
                TIDE_CHECK(wait_on(is, u, sh->done[j]));
            for (int j = n0; j < n0 + L; ++j)
                TIDE_CHECK(record_on(is, fam->user[j * TIDE_EVENT_COUNT + TIDE_EVENT_READ_DONE], u));
        }
    }
    if (is->pp->direct_ag) {
        /* Call-done of each rank once every rank that read its shard in place ended its call
         * (direct_ag.c); the caller stream waits too, so that nothing after the call on it
         * rewrites the shard early. */
        for (int r = 0; r < n; ++r) {
            TIDE_CHECK(on_device_of(is, r));
            const cudaStream_t c = caller_of(is, r);
            for (int j = 0; j < n; ++j)
                if (is->pp->ag_wait[(size_t)r * (size_t)n + (size_t)j])
                    TIDE_CHECK(wait_on(is, c, sh->done[j]));
            TIDE_CHECK(record_on(is, fam->user[r * TIDE_EVENT_COUNT + TIDE_EVENT_CALL_DONE], c));
        }
    }
    TIDE_CHECK(on_device_of(is, 0));
    for (int r = 0; r < n; ++r)
        TIDE_CHECK(wait_on(is, sh->agg, sh->done[r]));
    TIDE_CHECK(record_on(is, fam->fence[is->parity], sh->agg));
    if (is->graph)
        TIDE_CHECK(tide_cuda_graph_join(fam, is->pp, n, is->parity, caller_of(is, 0),
                                        &is->st.waits));
    fam->fence_epoch[is->parity] = (int64_t)epoch;
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_enqueue(tide_cuda_group_t *g, tide_cuda_family_t *fam) {
    const int pi = fam->pending_prep;
    const uint64_t e = fam->pending_epoch;
    const uint64_t t0 = tide_cuda_now_ns();
    /* A call captured into a CUDA graph waits on nothing outside its capture, nor eager work
     * on anything captured: the stream orders them (graph.c). */
    const bool steady = e >= 1 && fam->last_epoch == (int64_t)e - 1 && fam->last_prep == pi &&
                        tide_cuda_graph_same(fam, (int64_t)e - 1);
    const int form = steady ? TIDE_SCHED_STEADY : TIDE_SCHED_FRESH;
    /* STEADY waits reach back one call: the fence covers the one before.  FRESH waits reach
     * nothing of earlier calls: the fence covers all of them. */
    int64_t fence = steady ? (int64_t)e - 2 : (int64_t)e - 1;
    if (fence >= 0 && !tide_cuda_graph_same(fam, fence)) fence = -1;
    if (fence >= 0 && fam->fence_epoch[fence % 2] != fence)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cuda fabric: call %llu: the fence of call %lld is "
                        "missing (last call %lld)",
                        (unsigned long long)e, (long long)fence, (long long)fam->last_epoch);
    if (!steady && fam->last_epoch >= 0 && fam->last_prep != pi &&
        !tide_schedule_incs_match(&fam->prep[pi].sched, &fam->prep[fam->last_prep].sched))
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "cuda fabric: call %llu switches programs whose "
                        "counters count differently per call",
                        (unsigned long long)e);

    issue_t is;
    memset(&is, 0, sizeof(is));
    is.sh = g->shared;
    is.g = g;
    is.fam = fam;
    is.pp = &fam->prep[pi];
    is.parity = (int)(e % 2);
    is.cur_dev = -1;
    is.graph = fam->pending_capture != 0;
    is.st = tide_cuda_stats_begin(&fam->stats, form);
    /* The threshold's copies are plain OP commands of the lists; their count is the
     * program's (batch.c). */
    is.st.over_threshold = (uint64_t)is.pp->over_threshold[form];
    tide_result_t res =
        is.graph ? TIDE_SUCCESS : tide_cuda_direct_lands(g->shared, is.pp, is.parity);
    if (res != TIDE_SUCCESS) return res;
    tide_cuda_direct_ag_sources(is.pp);
    /* A captured call's tables, from the ops as rebound above (graph.c). */
    if (is.graph) TIDE_CHECK(tide_cuda_graph_tables(g->shared, fam, is.pp, is.parity));
    res = enqueue_commands(&is, form, e, fence);
    if (res != TIDE_SUCCESS) return res;
    fam->last_epoch = (int64_t)e;
    fam->last_prep = pi;
    tide_cuda_graph_enqueued(g->shared, fam, is.parity);
    tide_cuda_stats_end(&is.st, t0, &fam->stats);
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ recording a rank's call */

static tide_result_t bind_rank(tide_cuda_family_t *fam, tide_cuda_prepared_t *pp,
                               const tide_program_t *prog, const tide_binding_t *b) {
    const int r = b->rank, parity = (int)(b->epoch % 2);
    const tide_cuda_bind_env_t env = {
        .table_dev = pp->table_dev[r],
        /* Programs without sums have no gradient tables. */
        .own = fam->own_dev[parity] != NULL ? (const void *const *)fam->own_dev[parity][r] : NULL,
        .skip = NULL,
        .direct_l = pp->direct_sum ? pp->direct_l : 0,
        .num_params = fam->num_params,
    };
    return tide_cuda_bind_rank(&env, &pp->sched, prog, b, pp->bound);
}

/* Fail-stop: ranks that recorded this call already returned; all later calls fail. */
static tide_result_t family_break(tide_cuda_shared_t *sh, tide_cuda_family_t *fam,
                                  tide_result_t res) {
    if (fam->broken == TIDE_SUCCESS) {
        fam->broken = res;
        snprintf(fam->broken_msg, sizeof(fam->broken_msg), "%s", tide_get_last_error());
    }
    pthread_cond_broadcast(&sh->cond);
    return res;
}

/* A rank one call ahead waits (with the deadline) until the pending call is enqueued. */
static tide_result_t wait_turn(tide_cuda_shared_t *sh, tide_cuda_family_t *fam,
                               const tide_binding_t *b) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    const int64_t ms = tide_fabric_timeout_ms();
    deadline.tv_sec += (time_t)(ms / 1000);
    deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    while (fam->broken == TIDE_SUCCESS && fam->pending > 0 && fam->pending_epoch != b->epoch) {
        if (b->epoch != fam->pending_epoch + 1 || !fam->present[b->rank])
            return TIDE_ERR(TIDE_ERR_INTERNAL,
                            "cuda fabric: rank %d calls call %llu while call "
                            "%llu is pending",
                            b->rank, (unsigned long long)b->epoch,
                            (unsigned long long)fam->pending_epoch);
        if (pthread_cond_timedwait(&sh->cond, &sh->lock, &deadline) == ETIMEDOUT)
            return TIDE_ERR(TIDE_ERR_TIMEOUT,
                            "cuda fabric: rank %d waited %lld ms for the other ranks to call call "
                            "%llu (TIDE_TIMEOUT_MS); with one thread, call every rank once per "
                            "call, rank 0 to N-1",
                            b->rank, (long long)ms, (unsigned long long)fam->pending_epoch);
    }
    return TIDE_SUCCESS;
}

static tide_result_t record_call(tide_cuda_group_t *g, tide_cuda_family_t *fam, int pi,
                                 const tide_program_t *prog, const tide_binding_t *b,
                                 cudaStream_t caller) {
    tide_cuda_shared_t *sh = g->shared;
    const int r = b->rank;
    if (g->failed != TIDE_SUCCESS)
        return TIDE_ERR(TIDE_ERR_FABRIC,
                        "cuda fabric: rank %d: the group's registration failed "
                        "on some rank (%s)",
                        r, tide_get_error_string(g->failed));
    if (fam->broken != TIDE_SUCCESS)
        return TIDE_ERR(TIDE_ERR_FABRIC,
                        "cuda fabric: rank %d: the group's %s calls are unusable "
                        "since a call failed (%s): %s",
                        r, fam == &g->fam[2]                     ? "fence"
                           : fam->coll == TIDE_COLL_ALL_GATHER ? "all-gather"
                                                               : "reduce-scatter",
                        tide_get_error_string(fam->broken), fam->broken_msg);
    tide_result_t res = wait_turn(sh, fam, b);
    if (res != TIDE_SUCCESS) return family_break(sh, fam, res);
    if (fam->broken != TIDE_SUCCESS)
        return TIDE_ERR(TIDE_ERR_FABRIC, "cuda fabric: rank %d: a call failed while waiting: %s", r,
                        fam->broken_msg);
    /* Refused before anything is recorded: the family stays usable. */
    TIDE_CHECK(tide_cuda_graph_arrive(g, fam, fam->prep[pi].ready, r, caller));
    if (fam->pending > 0 && (fam->present[r] || fam->pending_prep != pi))
        return family_break(
            sh, fam,
            TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "cuda fabric: rank %d: call %llu %s", r,
                     (unsigned long long)b->epoch,
                     fam->present[r] ? "was already called by this rank"
                                     : "uses another reduce-scatter mode than the ranks "
                                       "before it"));
    if (fam->pending == 0 && (int64_t)b->epoch != fam->last_epoch + 1)
        return family_break(sh, fam,
                            TIDE_ERR(TIDE_ERR_INTERNAL,
                                     "cuda fabric: rank %d calls call %llu after call %lld", r,
                                     (unsigned long long)b->epoch, (long long)fam->last_epoch));

    tide_cuda_prepared_t *pp = &fam->prep[pi];
    if (!pp->ready) {
        res = tide_cuda_prepare(g, fam, pp, prog);
        if (res != TIDE_SUCCESS) return family_break(sh, fam, res);
    }
    if (pp->checked[r] != prog) {
        if (tide_schedule_rank_hash(prog, r) != pp->sched.rank_hash[r])
            return family_break(sh, fam,
                                TIDE_ERR(TIDE_ERR_INTERNAL,
                                         "cuda fabric: rank %d's program differs from the one its "
                                         "schedule was built from",
                                         r));
        pp->checked[r] = prog;
    }
    res = bind_rank(fam, pp, prog, b);
    if (res != TIDE_SUCCESS) return family_break(sh, fam, res);
    if (fam->grads != NULL && b->grads != NULL)
        memcpy(&fam->grads[(size_t)r * (size_t)fam->num_params], b->grads,
               (size_t)fam->num_params * sizeof(void *));
    if (fam->pending == 0) {
        fam->pending_epoch = b->epoch;
        fam->pending_prep = pi;
        fam->sum_ctas = b->plan->config.sum_ctas > 0 ? b->plan->config.sum_ctas : 1;
        fam->landing_ctas = b->plan->config.landing_ctas > 0 ? b->plan->config.landing_ctas : 1;
    }
    fam->caller[r] = caller;
    fam->present[r] = true;
    if (++fam->pending < sh->ranks) return TIDE_SUCCESS;

    res = tide_cuda_enqueue(g, fam);
    fam->pending = 0;
    memset(fam->present, 0, (size_t)sh->ranks * sizeof(*fam->present));
    pthread_cond_broadcast(&sh->cond);
    return res == TIDE_SUCCESS ? res : family_break(sh, fam, res);
}

tide_result_t tide_cuda_execute(struct tide_fabric_arena *arena, const tide_program_t *prog,
                                const tide_binding_t *binding, void *stream) {
    tide_cuda_arena_t *a = (tide_cuda_arena_t *)arena;
    tide_cuda_group_t *g = a->group;
    tide_cuda_shared_t *sh = g->shared;
    const int r = arena->world->rank;
    cudaStream_t caller = NULL;
    TIDE_CHECK(tide_cuda_call_check("cuda fabric", prog, binding, arena, sh->ranks,
                                    tide_cuda_device_of(sh, r), stream, &caller));
    const int fi = tide_cuda_family_of(prog);
    const int pi = fi == 2 ? prog->fence - 1 : fi == 0 ? 0 : (int)prog->mode;
    int prev_device = -1;
    if (cudaGetDevice(&prev_device) != cudaSuccess) {
        (void)cudaGetLastError();
        prev_device = -1;
    }
    pthread_mutex_lock(&sh->lock);
    tide_result_t res = record_call(g, &g->fam[fi], pi, prog, binding, caller);
    pthread_mutex_unlock(&sh->lock);
    if (prev_device >= 0) (void)cudaSetDevice(prev_device);
    return res;
}
