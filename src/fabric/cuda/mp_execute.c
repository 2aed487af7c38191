/*
 * mp_execute.c - a call on the one-process-per-rank CUDA fabric (mp.h) and the NCCL fabric:
 * prepare the program once, bind this rank's ops, and enqueue this rank's call through the
 * CUDA fabrics' call path (call.c) with the world's transport (ipc, or nccl: transport.h).
 *
 * What stays here is what one rank per process needs around the call path: the host wait for
 * call e - 2, the watchdog's begin point, the per-call batch plan and direct mode's exchange,
 * read-done after every peer's call, and fail-stop (the abort word, the poison).
 */
#include "core/checks.h"
#include "fabric/cuda/mp.h"
#include "fabric/cuda/graph.h"
#include "fabric/cuda/mp_graph_kernels.h"
#include "fabric/transport/ipc/ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ prepare */

static void prepared_free(tide_mp_prepared_t *pp) {
    tide_cuda_mp_direct_free(pp);
    tide_cuda_mp_elide_free(pp);
    tide_cuda_mp_rails_release(&pp->rails);
    tide_cuda_mp_batch_free(pp);
    if (pp->table_mem != NULL) cudaFree(pp->table_mem);
    (void)cudaGetLastError();
    free(pp->table_dev);
    free(pp->bound);
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        free(pp->cmds[f]);
        free(pp->defer[f]);
    }
    tide_schedule_free(&pp->sched);
    memset(pp, 0, sizeof(*pp));
}

void tide_cuda_mp_family_free(tide_mp_family_t *fam) {
    for (int m = 0; m < TIDE_RS_MODE_COUNT; ++m)
        prepared_free(&fam->prep[m]);
    for (int p = 0; p < 2; ++p) {
        if (fam->done_ev[p] != NULL) cudaEventDestroy(fam->done_ev[p]);
        tide_cuda_rows_release(1, fam->own_host[p], &fam->own_dev[p], &fam->own_done[p]);
        free(fam->own_last[p]);
        fam->done_ev[p] = NULL;
        fam->own_dev[p] = NULL;
        fam->own_host[p] = NULL;
        fam->own_done[p] = NULL;
        fam->own_last[p] = NULL;
    }
    for (int k = 0; k < TIDE_EVENT_COUNT; ++k) {
        if (fam->user[k] != NULL) cudaEventDestroy(fam->user[k]);
        fam->user[k] = NULL;
    }
    free(fam->grads);
    fam->grads = NULL;
    tide_cuda_mp_direct_family_free(fam);
    (void)cudaGetLastError();
}

static tide_result_t own_tables(tide_mp_family_t *fam, int params) {
    /* row_len: P, or the L P row of direct mode (tide_cuda_mp_direct_prepare). */
    if (fam->row_len < (params > 0 ? params : 1)) fam->row_len = params > 0 ? params : 1;
    const size_t row = (size_t)fam->row_len * sizeof(void *);
    fam->num_params = params;
    fam->grads = calloc((size_t)fam->row_len, sizeof(*fam->grads));
    if (fam->grads == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: gradients");
    for (int p = 0; p < 2; ++p) {
        fam->own_last[p] = calloc(1, row);
        if (fam->own_last[p] == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric");
        /* This rank's row on the device tide_cuda_mp_execute made current. */
        TIDE_CHECK(tide_cuda_rows_alloc(1, 0, row, &fam->own_host[p], &fam->own_dev[p],
                                        &fam->own_done[p]));
    }
    return TIDE_SUCCESS;
}

static tide_result_t prepare(tide_mp_arena_t *a, tide_mp_family_t *fam, tide_mp_prepared_t *pp,
                             const tide_program_t *prog) {
    const int me = a->w->base.rank;
    /* With rails, cross-node waits keep their commands (schedule.h). */
    TIDE_CHECK(tide_schedule_build_rails(prog, a->w->rails ? a->w->base.gpus_per_node : 0,
                                              &pp->sched));
    tide_result_t res = TIDE_SUCCESS;
    if (pp->sched.num_slots > TIDE_MP_FLAG_SLOTS) {
        res = TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                       "cuda mp fabric: the program has %d signal slots, the flag area %d",
                       pp->sched.num_slots, TIDE_MP_FLAG_SLOTS);
        goto fail;
    }
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f) {
        pp->cmds[f] = malloc(((size_t)pp->sched.num_cmds[f] + 1) * sizeof(*pp->cmds[f]));
        if (pp->cmds[f] == NULL) {
            res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: commands");
            goto fail;
        }
        for (int i = 0; i < pp->sched.num_cmds[f]; ++i)
            if (pp->sched.cmds[f][i].thread / TIDE_CUDA_Q == me)
                pp->cmds[f][pp->num_cmds[f]++] = pp->sched.cmds[f][i];
        TIDE_CHECK_GOTO(tide_cuda_mp_wait_runs(pp, pp->cmds[f], pp->num_cmds[f], &pp->defer[f]),
                        res, fail);
    }
    pp->bound = calloc((size_t)pp->sched.num_ops + 1, sizeof(*pp->bound));
    if (pp->bound == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: %d ops", pp->sched.num_ops);
        goto fail;
    }
    if (a->w->rails != NULL) TIDE_CHECK_GOTO(tide_cuda_mp_rails_prepare(a, pp, prog), res, fail);
    TIDE_CHECK_GOTO(tide_cuda_tables_upload(&prog->ranks[me], me, a->w->util, &pp->table_mem,
                                            &pp->table_dev),
                    res, fail);
    TIDE_CHECK_GOTO(tide_cuda_mp_direct_prepare(a, fam, pp, prog), res, fail);
    TIDE_CHECK_GOTO(tide_cuda_mp_elide_prepare(a, pp, prog), res, fail);
    if (a->w->batch) TIDE_CHECK_GOTO(tide_cuda_mp_batch_prepare(pp), res, fail);
    if (pp->sched.has_sum && fam->own_dev[0] == NULL)
        TIDE_CHECK_GOTO(own_tables(fam, prog->plan->geom.num_params), res, fail);
    pp->ready = true;
    return TIDE_SUCCESS;
fail:
    prepared_free(pp);
    return res;
}

static tide_result_t bind_rank(tide_mp_family_t *fam, tide_mp_prepared_t *pp,
                               const tide_program_t *prog, const tide_binding_t *b) {
    const tide_cuda_bind_env_t env = {
        .table_dev = pp->table_dev,
        .own = (const void *const *)fam->own_dev[b->epoch % 2],
        /* A put's destination is on another node: its step resolves its own ends (the
         * rails' op kinds are 0, TIDE_MP_RAIL_OP, for every other op). */
        .skip = pp->rails.on ? pp->rails.op_kind : NULL,
        .direct_l = tide_cuda_mp_direct_l(pp), /* this call's path (mp_direct.c) */
        .num_params = fam->num_params,
    };
    return tide_cuda_bind_rank(&env, &pp->sched, prog, b, pp->bound);
}

/* ------------------------------------------------------------------ the watchdog */

static tide_result_t broken_error(const tide_mp_family_t *fam, int rank) {
    return TIDE_ERR(fam->broken == TIDE_ERR_TIMEOUT ? TIDE_ERR_TIMEOUT : TIDE_ERR_FABRIC,
                    "cuda mp fabric: rank %d: the group's %s calls are unusable since a call "
                    "failed: %s",
                    rank, fam->coll == TIDE_COLL_ALL_GATHER ? "all-gather" : "reduce-scatter",
                    fam->broken_msg);
}

static bool streams_idle(const tide_mp_world_t *w) {
    for (int q = 0; q < TIDE_CUDA_Q; ++q)
        if (cudaStreamQuery(w->stream[q]) != cudaSuccess) return false;
    return true;
}

/* Release our device waits and drain our streams.  Every failing rank does this itself, not
 * only the first: a RECORD still in some live rank's stream writes e + 1 over the poison
 * (flags are written, not maxed), so each rank repeats the poison until its own streams are
 * idle, bounded by TIDE_TIMEOUT_MS. */
static void poison_and_drain(tide_mp_arena_t *a) {
    tide_mp_world_t *w = a->w;
    const uint64_t t0 = tide_cuda_now_ns(), limit = (uint64_t)tide_fabric_timeout_ms() * 1000000u;
    do {
        tide_cuda_mp_flags_poison(a); /* host flags: CPU stores (mp_flags.c) */
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    } while (!streams_idle(w) && tide_cuda_now_ns() - t0 < limit);
    (void)cudaGetLastError();
}

/* Both collectives of the group fail from now on: they share the poisoned flag areas (and
 * with them every group of a shared arena's set, mp_view.c). */
static void mark_broken(tide_mp_arena_t *a, const char *msg) {
    tide_cuda_mp_set_broken(a, msg);
}

/* Another rank failed the group: fail stop with its message (TIDE_SUCCESS: nobody did). */
static tide_result_t follow_abort(tide_mp_arena_t *a) {
    char msg[TIDE_MP_CTL_MSG], full[TIDE_MP_CTL_MSG + 64];
    const int by = tide_mp_ctl_aborted(&tide_cuda_mp_set_of(a)->ctl, msg, sizeof(msg));
    if (by < 0) return TIDE_SUCCESS;
    snprintf(full, sizeof(full), "rank %d failed the group: %s", by, msg);
    poison_and_drain(a);
    mark_broken(a, full);
    return TIDE_ERR(TIDE_ERR_TIMEOUT, "cuda mp fabric: rank %d: %s", a->w->base.rank, full);
}

tide_result_t tide_cuda_mp_fail_stop_msg(tide_mp_arena_t *a, const char *msg) {
    /* The abort word first, the poison after (mp_ctl.h: the ordering every survivor relies
     * on).  If another rank was first, its message is the group's. */
    if (!tide_mp_ctl_abort(&tide_cuda_mp_set_of(a)->ctl, msg)) return follow_abort(a);
    poison_and_drain(a);
    mark_broken(a, msg);
    return TIDE_ERR(TIDE_ERR_TIMEOUT, "cuda mp fabric: %s", msg);
}

tide_result_t tide_cuda_mp_fail_stop(tide_mp_arena_t *a, tide_mp_family_t *fam, int dead,
                                     uint64_t call, const char *waiting_for) {
    tide_mp_world_t *w = a->w;
    const int me = w->base.rank;
    char msg[TIDE_MP_CTL_MSG];
    if (dead >= 0) {
        snprintf(msg, sizeof(msg),
                 "rank %d is missing: its process exited while rank %d waited for %s", dead, me,
                 waiting_for);
    } else {
        /* Who is missing, from the host counters: never the device flags, which the poison
         * overwrites and which the host can only read through a stream. */
        char why[256];
        if (tide_cuda_mp_family_index(a, fam) == 2) /* no host counters for fences */
            snprintf(why, sizeof(why), "some rank did not reach the cross-group fence");
        else
            tide_mp_ctl_missing(&a->ctl, fam->coll == TIDE_COLL_ALL_GATHER ? 0 : 1, call, why,
                                sizeof(why));
        snprintf(msg, sizeof(msg), "rank %d waited %lld ms (TIDE_TIMEOUT_MS) for %s: %s", me,
                 (long long)tide_fabric_timeout_ms(), waiting_for, why);
    }
    return tide_cuda_mp_fail_stop_msg(a, msg);
}

/* Wait on the host for `ev` (this rank's call `call` of fam), ending at a dead peer, another
 * rank's abort or the deadline (fail-stop).  A wait that ended is trusted only when no rank
 * aborted: a poisoned flag may have ended it. */
static tide_result_t host_wait(tide_mp_arena_t *a, tide_mp_family_t *fam, cudaEvent_t ev,
                               uint64_t call, const char *what) {
    cudaError_t e = cudaEventQuery(ev);
    const uint64_t t0 = tide_cuda_now_ns(), limit = (uint64_t)tide_fabric_timeout_ms() * 1000000u;
    for (unsigned spin = 0;; ++spin) {
        if (e == cudaSuccess) return follow_abort(a);
        if (e != cudaErrorNotReady) return tide_cuda_error(e, __FILE__, __LINE__, what);
        if (tide_mp_ctl_aborted(&tide_cuda_mp_set_of(a)->ctl, NULL, 0) >= 0) return follow_abort(a);
        const int dead = tide_mp_boot_dead_peer(&a->w->boot);
        if (dead >= 0 || tide_cuda_now_ns() - t0 > limit)
            return tide_cuda_mp_fail_stop(a, fam, dead, call, what);
        if (spin > 64) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        e = cudaEventQuery(ev);
    }
}

/* ------------------------------------------------------------------ argument checks */

/* fabric.h, call_check: post this rank's signature of check `seq` in the control block and
 * wait on the host, with the watchdog, until every rank posted its own.  A rank that never
 * posts (it stopped calling, or its process died) fails the group like a missing rank of a
 * call: every rank that waits for it fails stop naming it.  Arenas without a control block
 * (the NCCL fabric's) compare nothing. */
tide_result_t tide_cuda_mp_call_check(struct tide_fabric_arena *arena, tide_collective_t coll,
                                      uint64_t seq, uint64_t sig, int *other_rank_out,
                                      uint64_t *other_sig_out) {
    tide_mp_arena_t *a = (tide_mp_arena_t *)arena;
    const int f = coll == TIDE_COLL_ALL_GATHER ? 0 : 1, me = a->w->base.rank;
    tide_mp_family_t *fam = &a->fam[f];
    if (fam->broken != TIDE_SUCCESS) return broken_error(fam, me);
    /* A rank that resumes after the others failed the group fails before it posts. */
    TIDE_CHECK(follow_abort(a));
    tide_mp_ctl_post(&a->ctl, f, seq, sig);
    const uint64_t t0 = tide_cuda_now_ns(), limit = (uint64_t)tide_fabric_timeout_ms() * 1000000u;
    const char *name = f == 0 ? "all-gather" : "reduce-scatter";
    for (unsigned spin = 0;; ++spin) {
        int other = -1;
        uint64_t other_sig = 0;
        if (tide_mp_ctl_compare(&a->ctl, f, seq, sig, &other, &other_sig)) {
            *other_rank_out = other;
            *other_sig_out = other_sig;
            return TIDE_SUCCESS;
        }
        if (tide_mp_ctl_aborted(&tide_cuda_mp_set_of(a)->ctl, NULL, 0) >= 0) return follow_abort(a);
        const int dead = tide_mp_boot_dead_peer(&a->w->boot);
        char msg[TIDE_MP_CTL_MSG];
        if (dead >= 0) {
            snprintf(msg, sizeof(msg),
                     "rank %d is missing: its process exited while rank %d waited for its "
                     "arguments of %s call %llu (argument check)",
                     dead, me, name, (unsigned long long)seq);
            return tide_cuda_mp_fail_stop_msg(a, msg);
        }
        if (tide_cuda_now_ns() - t0 > limit) {
            snprintf(msg, sizeof(msg),
                     "rank %d waited %lld ms (TIDE_TIMEOUT_MS) for rank %d to make %s call %llu "
                     "(argument check): rank %d never called it",
                     me, (long long)tide_fabric_timeout_ms(), other, name,
                     (unsigned long long)seq, other);
            return tide_cuda_mp_fail_stop_msg(a, msg);
        }
        if (spin > 64) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ------------------------------------------------------------------ a call */

/* The interpreter's view of this rank's call (call.c): one rank, on the device the entry made
 * current. */
typedef struct {
    tide_cuda_call_t c;
    tide_transport_ipc_t x;
    const tide_binding_t *b;
    bool batch;             /* the call's copies are planned into batches (mp_batch.c) */
    unsigned long long key; /* a captured call's capture (tide_cuda_graph_key), else 0 */
    const uint8_t *late;    /* the synchronisation elision's late ops (mp_elide.c), or NULL */
    const tide_sched_cmd_t *cmds; /* the commands the call replays */
    int num_cmds;
} issue_t;

static const void **row_want(tide_cuda_call_t *c, int rank) {
    (void)rank;
    return ((issue_t *)c->owner)->x.fam->grads;
}

static void call_init(issue_t *is, tide_mp_arena_t *a, tide_mp_family_t *fam, int pi,
                      const tide_binding_t *b, bool steady, cudaStream_t *caller) {
    tide_mp_world_t *w = a->w;
    tide_mp_prepared_t *pp = &fam->prep[pi];
    tide_cuda_call_t *c = &is->c;
    const uint64_t e = b->epoch;
    const int p = (int)(e % 2), fi = tide_cuda_mp_family_index(a, fam);
    memset(is, 0, sizeof(*is));
    is->x.a = a;
    is->x.fam = fam;
    is->x.pp = pp;
    is->x.fidx = fi == 2 ? TIDE_MP_FENCE_FIDX : tide_cuda_mp_flags_index(fam->coll, pi);
    is->x.rails = (tide_mp_rails_call_t){pp->checked, b, pp, fam->coll, is->x.fidx, steady};
    c->tp = w->transport;
    c->tp_ctx = &is->x;
    c->owner = is;
    c->rank0 = w->base.rank;
    c->num_ranks = 1;
    c->num_devices = 0; /* tide_cuda_mp_execute made the device current */
    c->cur_dev = -1;
    c->max_pitch = &w->max_pitch;
    c->sm_count = &w->sm_count;
    c->slicing = &w->slicing;
    c->sum_ctas = fam->sum_ctas;
    c->landing_ctas = fam->landing_ctas;
    c->sched = &pp->sched;
    c->checked = &pp->checked;
    c->bound = pp->bound;
    tide_cuda_mp_direct_skips(pp, &c->elide, &c->fused_land, &c->skip_read_done);
    c->stream = w->stream;
    c->start = &w->start;
    c->end = w->end;
    c->caller = caller;
    c->user = fam->user;
    c->rows = (tide_cuda_rows_t){
        .dev = &fam->own_dev[p],
        .host = fam->own_host[p],
        .last = fam->own_last[p],
        .valid = &fam->own_valid[p],
        .inflight = &fam->own_inflight[p],
        .done = &fam->own_done[p],
        .row = fam->row_len,
        .want = row_want,
    };
    c->parity = p;
    c->epoch = e;
}

/* The watchdog times the call's device work from the begin point (watchdog.c); a fence of a
 * view also waits for its sibling views' last calls (mp_view.c). */
static tide_result_t begin(tide_cuda_call_t *c, int rank) {
    issue_t *is = c->owner;
    tide_mp_arena_t *a = is->x.a;
    const int fi = tide_cuda_mp_family_index(a, is->x.fam);
    const cudaStream_t caller = tide_cuda_call_caller(c, rank);
    /* A captured call numbers itself on the device (mp_graph.c); no host follows a replay. */
    if (c->graph) {
        TIDE_CHECK(tide_cuda_mp_graph_begin(a, fi, is->key, caller));
        return fi == 2 ? tide_cuda_mp_graph_wait_siblings(a, caller, is->key, &c->st)
                       : TIDE_SUCCESS;
    }
    TIDE_CHECK(tide_mp_watchdog_begin(a, fi, c->parity, c->epoch, caller));
    return fi == 2 ? tide_cuda_mp_view_wait_siblings(a, caller, &c->st) : TIDE_SUCCESS;
}

/* A captured call brings every stream of the rank into the capture before any command.  The
 * schedule forks a thread before its first op that touches memory or signals, not before
 * its first WAIT: eagerly a wait is a memory operation with its value fixed at enqueue, and
 * where it stands in the stream is all that matters.  Issued on a stream outside the capture,
 * a captured call's wait kernel would run once, at capture time, and be missing from every
 * replay (the replay's sums then read the peers' staging before their pushes of this replay
 * landed).  Forking every thread after the counter tick and the fence costs graph edges only. */
static tide_result_t fork_captured(tide_cuda_call_t *c, int rank) {
    const cudaStream_t caller = tide_cuda_call_caller(c, rank);
    const cudaEvent_t start = c->start[rank - c->rank0];
    TIDE_CHECK(tide_cuda_call_record_event(c, start, caller));
    for (int q = 0; q < TIDE_CUDA_Q; ++q)
        TIDE_CHECK(tide_cuda_call_wait_event(c, tide_cuda_call_stream(c, rank * TIDE_CUDA_Q + q),
                                             start));
    return TIDE_SUCCESS;
}

/* The call's copy descriptors and direct mode's tables go up before the start record every
 * thread forks from. */
static tide_result_t prologue(tide_cuda_call_t *c, int rank) {
    issue_t *is = c->owner;
    tide_mp_arena_t *a = is->x.a;
    const cudaStream_t caller = tide_cuda_call_caller(c, rank);
    if (c->graph) TIDE_CHECK(fork_captured(c, rank));
    if (is->batch)
        TIDE_CHECK(tide_cuda_mp_batch_plan(a, is->x.pp, is->cmds, is->num_cmds, c->parity,
                                           caller, &c->st));
    return tide_cuda_mp_direct_before(a, is->x.pp, is->b, caller, &c->st);
}

/* A captured call joins every stream of the rank that its capture reached back into the
 * caller's stream.  The schedule's joins are the fewest that cover the rank's work through the
 * threads' waits on each other; in a capture those waits are kernels polling flags, not graph
 * edges, so a thread covered only through one would be left unjoined (cudaStreamEndCapture
 * refuses that).  Every thread was forked into the capture (fork_captured); the streams are
 * asked all the same, so that a stream the capture reached otherwise is joined too.  Extra
 * joins of an eager call would only cost stream waits, so eager calls keep the schedule's. */
static tide_result_t join_captured(tide_cuda_call_t *c) {
    const cudaStream_t caller = tide_cuda_call_caller(c, c->rank0);
    for (int q = 0; q < TIDE_CUDA_Q; ++q) {
        const cudaStream_t s = tide_cuda_call_stream(c, c->rank0 * TIDE_CUDA_Q + q);
        enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        TIDE_CUDA_CALL(cudaStreamIsCapturing(s, &st), "cudaStreamIsCapturing(thread)");
        if (st != cudaStreamCaptureStatusActive) continue;
        TIDE_CHECK(tide_cuda_call_record_event(c, c->end[q], s));
        TIDE_CHECK(tide_cuda_call_wait_event(c, caller, c->end[q]));
    }
    return TIDE_SUCCESS;
}

static tide_result_t epilogue(tide_cuda_call_t *c) {
    issue_t *is = c->owner;
    tide_mp_family_t *fam = is->x.fam;
    const int me = c->rank0;
    const cudaStream_t caller = tide_cuda_call_caller(c, me);
    ++c->st.records;
    if (tide_cuda_mp_direct_l(is->x.pp) > 0 || is->late != NULL) {
        /* Direct mode (mp_direct.c): the peers read this rank's gradients and wrote its output
         * during their calls, so the call ends once every rank's did; read-done follows.  With
         * the synchronisation elided (mp_elide.c), the late ops (the output's padding,
         * read-done and call-done) follow: only this fence orders them after the peers'
         * accesses (fused stores, an all-gather's copies into this rank's landing). */
        TIDE_CHECK(c->tp->fence(c, me, (int64_t)c->epoch));
        if (is->late != NULL) {
            TIDE_CHECK(tide_cuda_call_late(c, me, is->late));
        } else {
            ++c->st.records;
            TIDE_CUDA_CALL(cudaEventRecord(fam->user[TIDE_EVENT_READ_DONE], caller),
                           "cudaEventRecord(read-done)");
        }
    }
    if (c->graph) {
        TIDE_CHECK(join_captured(c));
        /* A sibling view's captured fence waits on this point (mp_graph.c). */
        TIDE_CHECK(tide_cuda_mp_graph_end(is->x.a, tide_cuda_mp_family_index(is->x.a, fam),
                                          caller));
    }
    /* The host and the watchdog wait on done events of eager calls only: a captured call's
     * record would be a point inside the capture, which neither may query (mp_graph.c). */
    if (!c->graph)
        TIDE_CUDA_CALL(cudaEventRecord(fam->done_ev[c->parity], caller), "cudaEventRecord(done)");
    return TIDE_SUCCESS;
}

static const tide_cuda_call_hooks_t hooks = {
    .begin = begin,
    .prologue = prologue,
    .epilogue = epilogue,
};

/* Whether call e's start fence (on call `fence`) is implied: the family's previous call, e - 1,
 * ended with the end-of-call fence, which waited for every rank's done flag of e - 1 (so of
 * every call up to it), and that fence is ordered before this call's work: it stood on the
 * same caller stream (stream ids are never reused, unlike handles), or it has completed.
 * Leaving the start fence out then only saves its N flag waits (docs/performance.md). */
static bool fence_implied(const tide_mp_family_t *fam, uint64_t e, int64_t fence,
                          cudaStream_t caller) {
    if (fence < 0 || fam->fenced_epoch < 0 || fam->fenced_epoch != (int64_t)e - 1 ||
        fam->fenced_epoch < fence)
        return false;
    unsigned long long id = 0;
    if (cudaStreamGetId(caller, &id) == cudaSuccess && id == fam->fenced_stream) return true;
    const cudaError_t q = cudaEventQuery(fam->done_ev[fam->fenced_epoch % 2]);
    (void)cudaGetLastError();
    return q == cudaSuccess;
}

static tide_result_t enqueue(tide_mp_arena_t *a, tide_mp_family_t *fam, int pi,
                             const tide_binding_t *b, cudaStream_t caller,
                             unsigned long long key) {
    const bool captured = key != 0;
    tide_mp_world_t *w = a->w;
    tide_mp_prepared_t *pp = &fam->prep[pi];
    const uint64_t e = b->epoch;
    int form;
    int64_t fence;
    /* A captured call is always FRESH: a replay depends on the call before it (whichever
     * that is on the device) through its fence only (mp_graph.c). */
    /* The synchronisation elision (mp_elide.c) runs other commands: a call after one that
     * ran the other list starts FRESH (no WAIT_PREV on a signal the previous call left out),
     * and an elided call fences call e - 1 (its STAGED waits count on no rank being a call
     * ahead, which the credits bounded before: docs/sync-elide.md). */
    const bool elided = tide_cuda_mp_elide_on(pp, captured);
    tide_cuda_call_order(e, pi, fam->last_epoch, fam->last_prep,
                         !captured && elided == fam->last_elided, &form, &fence);
    if (elided) fence = (int64_t)e - 1;
    const bool fence_skipped = !captured && fence_implied(fam, e, fence, caller);
    if (fence_skipped) fence = -1;
    const bool steady = form == TIDE_SCHED_STEADY;
    TIDE_CHECK(tide_cuda_call_switch_check("cuda mp fabric", e, form, pi, fam->last_epoch,
                                           fam->last_prep, &pp->sched,
                                           &fam->prep[fam->last_prep].sched));
    /* At most two calls of this rank in flight: the host waits for call e - 2 (watchdog). */
    const int par = (int)(e % 2);
    if (fam->done_epoch[par] >= 0 && !captured) {
        char what[96];
        snprintf(what, sizeof(what), "its call %lld of the %s to end",
                 (long long)fam->done_epoch[par],
                 fam->coll == TIDE_COLL_ALL_GATHER ? "all-gather" : "reduce-scatter");
        TIDE_CHECK(host_wait(a, fam, fam->done_ev[par], (uint64_t)fam->done_epoch[par], what));
    }
    /* The enqueue figure leaves the wait out: it is the host work of the call. */
    const uint64_t t_enqueue = tide_cuda_now_ns();
    issue_t is;
    call_init(&is, a, fam, pi, b, steady, &caller);
    is.b = b;
    is.batch = w->batch && pp->batch.cap > 0 && !captured;
    is.cmds = pp->cmds[form];
    is.num_cmds = pp->num_cmds[form];
    const uint8_t *defer = pp->defer[form];
    if (elided) tide_cuda_mp_elide_cmds(pp, form, &is.cmds, &defer, &is.num_cmds, &is.late);
    is.key = key;
    tide_cuda_call_t *c = &is.c;
    if (captured) {
        c->tp = &tide_transport_ipc_graph;
        c->graph = true; /* the gradient row was uploaded at capture time */
    }
    c->wait_defer = captured ? NULL : defer; /* a captured call's waits are kernels */
    c->st = tide_cuda_stats_begin(&fam->stats, form);
    TIDE_CHECK(tide_cuda_call_enqueue(c, &hooks, fence, is.cmds, is.num_cmds,
                                      is.batch ? pp->batch.action : NULL));
    c->st.sync_elided = elided;
    c->st.fence_skipped = fence_skipped;
    if (captured) {
        tide_cuda_mp_graph_enqueued(a, fam, key);
    } else {
        fam->done_epoch[par] = (int64_t)e;
        tide_mp_watchdog_enqueued(a, tide_cuda_mp_family_index(a, fam), par, e);
    }
    fam->last_epoch = (int64_t)e;
    fam->last_prep = pi;
    fam->last_elided = elided;
    /* The epilogue fenced this call on the caller's stream (direct mode, or the elision). */
    fam->fenced_epoch = -1;
    if (!captured && (tide_cuda_mp_direct_l(pp) > 0 || is.late != NULL) &&
        cudaStreamGetId(caller, &fam->fenced_stream) == cudaSuccess)
        fam->fenced_epoch = (int64_t)e;
    (void)cudaGetLastError();
    tide_cuda_stats_end(&c->st, t_enqueue, &fam->stats);
    return TIDE_SUCCESS;
}

static tide_result_t record_call(tide_mp_arena_t *a, tide_mp_family_t *fam, int pi,
                                 const tide_program_t *prog, const tide_binding_t *b,
                                 cudaStream_t caller, unsigned long long key) {
    const int r = b->rank;
    const bool captured = key != 0;
    if (fam->broken != TIDE_SUCCESS) return broken_error(fam, r);
    if ((int64_t)b->epoch != fam->last_epoch + 1)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "cuda mp fabric: rank %d calls call %llu after %lld",
                        r, (unsigned long long)b->epoch, (long long)fam->last_epoch);
    /* Entered: from here on the peers' watchdogs do not name this rank for this call. */
    /* The control block counts all-gathers and reduce-scatters; a view's fences (family 2)
     * are not counted there. */
    const int fi = tide_cuda_mp_family_index(a, fam);
    if (fi < 2) tide_mp_ctl_enter(&a->ctl, fi, b->epoch);
    /* A rank that resumes after the others failed the group fails too, before it enqueues. */
    TIDE_CHECK(follow_abort(a));
    tide_mp_prepared_t *pp = &fam->prep[pi];
    if (!pp->ready) TIDE_CHECK(prepare(a, fam, pp, prog));
    TIDE_CHECK(tide_cuda_call_checked("cuda mp fabric", prog, r, &pp->sched, &pp->checked));
    /* The path of this call (the same on every rank) and its gradient row (mp_direct.c). */
    if (captured)
        TIDE_CHECK(tide_cuda_mp_direct_pushed(fam, pp, b));
    else
        TIDE_CHECK(tide_cuda_mp_direct_call(a, fam, pp, b));
    TIDE_CHECK(bind_rank(fam, pp, prog, b));
    if (captured) TIDE_CHECK(tide_cuda_mp_graph_capture(a, fam, pp, b->epoch, (int)(b->epoch % 2)));
    tide_cuda_call_ctas(b, &fam->sum_ctas, &fam->landing_ctas);
    TIDE_CHECK(enqueue(a, fam, pi, b, caller, key));
    if (fi < 2) tide_mp_ctl_enqueued(&a->ctl, fi, b->epoch);
    /* An abort published while we enqueued (this rank was stopped in the middle, say): the
     * call may be released by the poison, so it must not report success. */
    return follow_abort(a);
}

tide_result_t tide_cuda_mp_execute(struct tide_fabric_arena *arena, const tide_program_t *prog,
                                   const tide_binding_t *binding, void *stream) {
    tide_mp_arena_t *a = (tide_mp_arena_t *)arena;
    tide_mp_world_t *w = a->w;
    cudaStream_t caller = NULL;
    TIDE_CHECK(tide_cuda_call_check("cuda mp fabric", prog, binding, arena, w->base.ranks,
                                    w->device, stream, &caller));
    /* A fence program (a view's, mp_view.c) runs in the third family; its two variants are
     * its two programs. */
    const int fi = tide_cuda_family_of(prog), pi = tide_cuda_prep_of(prog);
    bool captured = false;
    unsigned long long key = 0;
    TIDE_CHECK(
        tide_cuda_mp_graph_arrive(a, fi, a->fam[fi].prep[pi].ready, caller, &captured, &key));
    if (caller == NULL) caller = cudaStreamLegacy;
    if (fi == 2 && a->parent == NULL)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cuda mp fabric: rank %d: a cross-group fence on an arena that is not a "
                        "view of a set",
                        w->base.rank);
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != w->device) TIDE_CUDA_CALL(cudaSetDevice(w->device), "cudaSetDevice");
    tide_mp_family_t *fam = &a->fam[fi];
    /* A replay that failed on the device fails the group at the next call (mp_graph.c). */
    tide_result_t res = a->graph != NULL ? tide_cuda_mp_graph_check(a) : TIDE_SUCCESS;
    if (res == TIDE_SUCCESS)
        res = record_call(a, fam, pi, prog, binding, caller, captured ? key : 0);
    if (prev >= 0 && prev != w->device) (void)cudaSetDevice(prev);
    return res;
}

tide_result_t tide_cuda_mp_sync(struct tide_fabric_arena *arena, tide_collective_t coll) {
    TIDE_ARG_CHECK(tide_cuda_mp_is(arena), "cuda mp sync: not a one-process-per-rank arena");
    return tide_cuda_mp_sync_family((tide_mp_arena_t *)arena, coll == TIDE_COLL_ALL_GATHER ? 0 : 1);
}

tide_result_t tide_cuda_mp_sync_family(tide_mp_arena_t *a, int f) {
    tide_mp_family_t *fam = &a->fam[f];
    if (fam->broken != TIDE_SUCCESS) return broken_error(fam, a->w->base.rank);
    if (a->graph != NULL) {
        TIDE_CHECK(tide_cuda_mp_graph_check(a));
        /* A family with captured calls: the host cannot tell which replay is the last; the
         * caller waits for its launches on their stream (every device wait of a replay is
         * bounded: mp_graph_kernels.h), then this reports a replay's failure or another
         * rank's. */
        if (a->graph->captured[f]) return follow_abort(a);
    }
    if (fam->last_epoch < 0) return TIDE_SUCCESS;
    char what[96];
    snprintf(what, sizeof(what), "its call %lld of the %s to end", (long long)fam->last_epoch,
             f == 2   ? "cross-group fence"
             : f == 0 ? "all-gather"
                      : "reduce-scatter");
    return host_wait(a, fam, fam->done_ev[fam->last_epoch % 2], (uint64_t)fam->last_epoch, what);
}

tide_result_t tide_cuda_mp_stats(const struct tide_fabric_arena *arena, tide_collective_t coll,
                                 tide_cuda_stats_t *stats_out) {
    TIDE_ARG_CHECK(tide_cuda_mp_is(arena), "cuda mp stats: not a one-process-per-rank arena");
    const tide_mp_arena_t *a = (const tide_mp_arena_t *)arena;
    *stats_out = a->fam[coll == TIDE_COLL_ALL_GATHER ? 0 : 1].stats;
    return TIDE_SUCCESS;
}
