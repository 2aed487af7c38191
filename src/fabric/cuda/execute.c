/*
 * execute.c - a call on the CUDA fabric: every rank's execute binds its ops; the last rank's
 * execute enqueues the call of all ranks.
 *
 * The commands of a program's schedule (program/schedule_commands.c) span all ranks, so a call can only be
 * enqueued once all N bindings are known.  execute for rank r therefore validates and binds
 * rank r's ops into the pending call and returns; the N-th execute replays the command list
 * of the call's form on the streams and returns.  One thread may drive all ranks (rank 0 to
 * N-1, call after call); with a thread per rank, a rank that runs one call ahead waits until
 * the pending call is enqueued (TIDE_TIMEOUT_MS deadline).  The commands go through the CUDA
 * fabrics' call path (call.c) with the local transport (events; transport.h).
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
#include "fabric/transport/local/local.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ enqueue */

/* The call as the interpreter (call.c) sees it, with the local transport's view. */
typedef struct {
    tide_cuda_call_t c;
    tide_transport_local_t x;
    tide_cuda_group_t *g;
} issue_t;

/* The gradient row rank r's sums read: its own P pointers, or direct mode's L P. */
static const void **row_want(tide_cuda_call_t *c, int r) {
    issue_t *is = c->owner;
    tide_cuda_family_t *fam = is->x.fam;
    if (is->x.pp->direct_sum) {
        tide_cuda_direct_row(fam, is->x.pp->direct_l, r, fam->own_row_tmp);
        return fam->own_row_tmp;
    }
    return &fam->grads[(size_t)r * (size_t)fam->num_params];
}

/* Rank r's copy descriptors of this call into the device table of this parity, on the
 * caller's stream before the call's start event, which every thread of r forks from
 * (skipped when the table holds them already).  The fence the caller waited for ends every
 * kernel that read this table before. */
static tide_result_t batch_upload(issue_t *is, int r) {
    tide_cuda_prepared_t *pp = is->x.pp;
    const int p = is->c.parity, first = pp->slot_base[r], count = pp->slot_base[r + 1] - first;
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
    ++is->c.st.descriptors;
    ++is->c.st.uploads;
    const cudaStream_t s = tide_cuda_call_caller(&is->c, r);
    TIDE_CUDA_CALL(cudaMemcpyAsync(pp->desc_dev[p][r], pinned, bytes, cudaMemcpyHostToDevice, s),
                   "cudaMemcpyAsync(copy descriptors)");
    TIDE_CHECK(tide_cuda_call_record_event(&is->c, pp->desc_done[p][r], s));
    pp->desc_inflight[p][r] = true;
    memcpy(last, pinned, bytes);
    pp->desc_valid[p][r] = true;
    return TIDE_SUCCESS;
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
    if (is->x.fam != &is->g->fam[2] || parent == NULL) return TIDE_SUCCESS;
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
            TIDE_CHECK(tide_cuda_call_wait_event(&is->c, tide_cuda_call_caller(&is->c, r),
                                                 fam->fence[p]));
        }
    }
    return TIDE_SUCCESS;
}

/* Before rank r's start record: the sibling views' fences, the copy descriptors and direct
 * mode's fused-sum tables (a captured call's were uploaded by graph.c). */
static tide_result_t prologue(tide_cuda_call_t *c, int r) {
    issue_t *is = c->owner;
    tide_cuda_prepared_t *pp = is->x.pp;
    TIDE_CHECK(wait_siblings(is, r));
    if (pp->batched && !c->graph) TIDE_CHECK(batch_upload(is, r));
    if (pp->direct && !c->graph)
        TIDE_CHECK(tide_cuda_direct_fuse_upload(is->x.sh, pp, c->parity, r,
                                                tide_cuda_call_caller(c, r), &c->st.uploads));
    return TIDE_SUCCESS;
}

/* After every rank's done event: direct mode's read-done and call-done, then the call's fence
 * (every rank done) on the aggregate stream. */
static tide_result_t epilogue(tide_cuda_call_t *c) {
    issue_t *is = c->owner;
    tide_cuda_shared_t *sh = is->x.sh;
    tide_cuda_family_t *fam = is->x.fam;
    tide_cuda_prepared_t *pp = is->x.pp;
    const int n = sh->ranks;
    if (pp->direct_sum) {
        /* Read-done of every rank of a node once the node's call ended: its sums read the
         * gradients of all of them in place (direct.c).  On the device's utility stream, so
         * that no caller waits for another rank. */
        const int L = pp->direct_l;
        for (int n0 = 0; n0 < n; n0 += L) {
            TIDE_CHECK(tide_cuda_call_device(c, n0));
            const cudaStream_t u = sh->util[c->cur_dev];
            for (int j = n0; j < n0 + L; ++j)
                TIDE_CHECK(tide_cuda_call_wait_event(c, u, sh->done[j]));
            for (int j = n0; j < n0 + L; ++j)
                TIDE_CHECK(tide_cuda_call_record_event(
                    c, fam->user[j * TIDE_EVENT_COUNT + TIDE_EVENT_READ_DONE], u));
        }
    }
    if (pp->direct_ag) {
        /* Call-done of each rank once every rank that read its shard in place ended its call
         * (direct_ag.c); the caller stream waits too, so that nothing after the call on it
         * rewrites the shard early. */
        for (int r = 0; r < n; ++r) {
            TIDE_CHECK(tide_cuda_call_device(c, r));
            const cudaStream_t cs = tide_cuda_call_caller(c, r);
            for (int j = 0; j < n; ++j)
                if (pp->ag_wait[(size_t)r * (size_t)n + (size_t)j])
                    TIDE_CHECK(tide_cuda_call_wait_event(c, cs, sh->done[j]));
            TIDE_CHECK(tide_cuda_call_record_event(
                c, fam->user[r * TIDE_EVENT_COUNT + TIDE_EVENT_CALL_DONE], cs));
        }
    }
    TIDE_CHECK(tide_cuda_call_device(c, 0));
    for (int r = 0; r < n; ++r)
        TIDE_CHECK(tide_cuda_call_wait_event(c, sh->agg, sh->done[r]));
    TIDE_CHECK(tide_cuda_call_record_event(c, fam->fence[c->parity], sh->agg));
    if (c->graph)
        TIDE_CHECK(tide_cuda_graph_join(fam, pp, n, c->parity, tide_cuda_call_caller(c, 0),
                                        &c->st.waits));
    fam->fence_epoch[c->parity] = (int64_t)c->epoch;
    return TIDE_SUCCESS;
}

static const tide_cuda_call_hooks_t hooks = {
    .begin = NULL,
    .prologue = prologue,
    .epilogue = epilogue,
};

/* The interpreter's view of the pending call of `fam` (every rank in this process). */
static void call_init(issue_t *is, tide_cuda_group_t *g, tide_cuda_family_t *fam, int pi,
                      uint64_t e, int form) {
    tide_cuda_shared_t *sh = g->shared;
    tide_cuda_prepared_t *pp = &fam->prep[pi];
    tide_cuda_call_t *c = &is->c;
    const int p = (int)(e % 2);
    memset(is, 0, sizeof(*is));
    is->g = g;
    is->x = (tide_transport_local_t){sh, fam, pp};
    c->tp = &tide_transport_local;
    c->tp_ctx = &is->x;
    c->owner = is;
    c->rank0 = 0;
    c->num_ranks = sh->ranks;
    c->num_devices = sh->num_devices;
    c->cur_dev = -1;
    c->max_pitch = sh->max_pitch;
    c->sm_count = sh->sm_count;
    c->slicing = &sh->slicing;
    c->sum_ctas = fam->sum_ctas;
    c->landing_ctas = fam->landing_ctas;
    c->sched = &pp->sched;
    c->checked = pp->checked;
    c->bound = pp->bound;
    c->elide = pp->elide;
    c->fused_land = pp->fused_land;
    c->skip_read_done = pp->direct_sum;
    c->skip_call_done = pp->direct_ag;
    c->stream = sh->stream;
    c->start = sh->start;
    c->end = sh->end;
    c->caller = fam->caller;
    c->user = fam->user;
    /* Programs without sums have no gradient tables and no UPLOAD commands. */
    c->rows = (tide_cuda_rows_t){
        .dev = fam->own_dev[p],
        .host = fam->own_host[p],
        .last = fam->own_last[p],
        .valid = fam->own_valid[p],
        .inflight = fam->own_inflight[p],
        .done = fam->own_done[p],
        .row = fam->own_row,
        .want = row_want,
    };
    c->graph = fam->pending_capture != 0;
    c->parity = p;
    c->epoch = e;
    c->st = tide_cuda_stats_begin(&fam->stats, form);
}

tide_result_t tide_cuda_enqueue(tide_cuda_group_t *g, tide_cuda_family_t *fam) {
    const int pi = fam->pending_prep;
    const uint64_t e = fam->pending_epoch;
    const uint64_t t0 = tide_cuda_now_ns();
    /* A call captured into a CUDA graph waits on nothing outside its capture, nor eager work
     * on anything captured: the stream orders them (graph.c). */
    int form;
    int64_t fence;
    tide_cuda_call_order(e, pi, fam->last_epoch, fam->last_prep,
                         e >= 1 && tide_cuda_graph_same(fam, (int64_t)e - 1), &form, &fence);
    if (fence >= 0 && !tide_cuda_graph_same(fam, fence)) fence = -1;
    if (fence >= 0 && fam->fence_epoch[fence % 2] != fence)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cuda fabric: call %llu: the fence of call %lld is "
                        "missing (last call %lld)",
                        (unsigned long long)e, (long long)fence, (long long)fam->last_epoch);
    TIDE_CHECK(tide_cuda_call_switch_check("cuda fabric", e, form, pi, fam->last_epoch,
                                           fam->last_prep, &fam->prep[pi].sched,
                                           &fam->prep[fam->last_prep].sched));

    issue_t is;
    call_init(&is, g, fam, pi, e, form);
    tide_cuda_prepared_t *pp = is.x.pp;
    /* The threshold's copies are plain OP commands of the lists; their count is the
     * program's (batch.c). */
    is.c.st.over_threshold = (uint64_t)pp->over_threshold[form];
    tide_result_t res =
        is.c.graph ? TIDE_SUCCESS : tide_cuda_direct_lands(g->shared, pp, is.c.parity);
    if (res != TIDE_SUCCESS) return res;
    tide_cuda_direct_ag_sources(pp);
    /* A captured call's tables, from the ops as rebound above (graph.c). */
    if (is.c.graph) TIDE_CHECK(tide_cuda_graph_tables(g->shared, fam, pp, is.c.parity));
    const tide_sched_cmd_t *cmds = pp->batched ? pp->bcmds[form] : pp->sched.cmds[form];
    const int num_cmds = pp->batched ? pp->num_bcmds[form] : pp->sched.num_cmds[form];
    res = tide_cuda_call_enqueue(&is.c, &hooks, fence, cmds, num_cmds, NULL);
    if (res != TIDE_SUCCESS) return res;
    fam->last_epoch = (int64_t)e;
    fam->last_prep = pi;
    tide_cuda_graph_enqueued(g->shared, fam, is.c.parity);
    tide_cuda_stats_end(&is.c.st, t0, &fam->stats);
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
    res = tide_cuda_call_checked("cuda fabric", prog, r, &pp->sched, &pp->checked[r]);
    if (res != TIDE_SUCCESS) return family_break(sh, fam, res);
    res = bind_rank(fam, pp, prog, b);
    if (res != TIDE_SUCCESS) return family_break(sh, fam, res);
    if (fam->grads != NULL && b->grads != NULL)
        memcpy(&fam->grads[(size_t)r * (size_t)fam->num_params], b->grads,
               (size_t)fam->num_params * sizeof(void *));
    if (fam->pending == 0) {
        fam->pending_epoch = b->epoch;
        fam->pending_prep = pi;
        tide_cuda_call_ctas(b, &fam->sum_ctas, &fam->landing_ctas);
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
    const int fi = tide_cuda_family_of(prog), pi = tide_cuda_prep_of(prog);
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
