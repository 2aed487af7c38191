/*
 * mp_graph.c - calls of the one-process-per-rank CUDA fabric captured into a CUDA graph and
 * replayed (docs/cuda-fabric.md, "CUDA graphs across processes").
 *
 * A call whose caller stream is capturing is enqueued by the eager path (mp_execute.c,
 * call.c) with these differences, each because the eager form would not survive a replay:
 *
 *  - Numbering on the device.  Eagerly, signals and waits are stream memory operations with
 *    the host's call number e baked in.  A captured call's first node increments the family's
 *    call counter (a device word, set to e - 1 when the family's first call is captured), and
 *    its signals, waits, fence and done flag are one-thread kernels that read the counter and
 *    add the offset the eager call adds to e (the ipc transport's graph entries,
 *    transport/ipc/graph.c; the kernels in mp_graph_kernels.cu).  Every replay therefore runs
 *    as the next call of the family on every rank, as long as every rank replays the same
 *    graphs in the same order.
 *  - The FRESH form, always: a captured call depends on nothing of the call before it but its
 *    fence (every rank's done flag of the previous call), so consecutive replays, and a replay
 *    after the eager calls before the capture, are ordered on every rank without host waits.
 *  - No host waits, no uploads the host rewrites: the gradient pointer row is uploaded at
 *    capture time, outside the capture, into device memory of its own (kept until the group is
 *    deregistered), and the call's sums are bound to it; copies are issued one by one (the
 *    batch kernel's descriptors and cudaMemcpyBatchAsync are planned per call from pinned
 *    rows); direct mode takes the pushed path (its address exchange is a per-call host
 *    collective), bit for bit the same result.
 *  - Failure: no host watches a replay, so every device wait bounds itself (mp_graph_kernels.h)
 *    and sets this rank's error word; the host reports it, and fails the group (abort word,
 *    poison), at the group's next call or sync.
 *
 *  - Views of a set (mp_view.c): the fence program is a third family like the others (its
 *    own counter, num[2]; its own flag area, TIDE_MP_FENCE_FIDX).  Its sibling waits
 *    (tide_cuda_mp_view_wait_siblings: this rank's done flag of each sibling family's last
 *    call in enqueue order) become tide_cuda_mp_graph_wait_siblings: for a sibling family
 *    whose last call was captured in the same capture, a graph edge to the event recorded at
 *    that call's end (tide_cuda_mp_graph_end); for one whose last call was eager (before any
 *    capture of the set), a wait kernel on its done flag with the fixed value last + 1,
 *    right for every replay since nothing of that family runs eagerly again.  A sibling
 *    family captured later in the same graph needs no wait at all: replays of a rank are
 *    launched one after the other (a precondition), so the previous replay's call ended.
 *
 * Restrictions, each refused with TIDE_ERR_UNSUPPORTED before anything is enqueued: a family
 * with a captured call can only be replayed from then on (its eager calls are refused until
 * the group is deregistered: the host no longer knows the device's call numbers), and for a
 * view of a set so is every family of every view of the set (an eager fence would wait on a
 * captured sibling's done flag with a host number); a captured fence whose sibling family's
 * last call was captured in another capture (the calls of one set must be captured in one
 * graph: an edge cannot cross graphs, and a device counter read at run time does not say
 * which replay of the other graph ended); the first call of a program (prepare allocates and
 * uploads); rail transports (sets refuse them at registration too); the NCCL fabric; a call
 * while another capture holds the world's streams, and an eager call while a capture does.
 */
#include "core/checks.h"
#include "fabric/cuda/graph.h"
#include "fabric/cuda/mp.h"
#include "fabric/cuda/mp_graph_kernels.h"
#include "fabric/transport/ipc/ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tide_mp_graph_mem {
    struct tide_mp_graph_mem *next;
    void *dev;
};

static const char *const family_name[3] = {"all-gather", "reduce-scatter", "cross-group fence"};

/* A capture that begins now: the key a query stands for when the stream is not capturing
 * (capture ids + 1 never reach it), so that it matches no capture under way. */
#define CAPTURE_NEW (~0ull)

/* The capture checks of a call of family fi on arena a in capture `key` (not 0), without side
 * effects: the blockers into v.  The call path (tide_cuda_mp_graph_arrive) and the query
 * (tide_cuda_mp_capture_check) both decide with it. */
static tide_result_t capture_verdict(const tide_mp_arena_t *a, int fi, unsigned long long key,
                                     tide_capture_verdict_t *v) {
    const tide_mp_world_t *w = a->w;
    const int me = w->base.rank;
    if (w->transport != &tide_transport_ipc)
        tide_capture_block(v, TIDE_CAPTURE_NO_FABRIC,
                           "cuda mp fabric (%s transport): rank %d: calls cannot be captured into "
                           "a CUDA graph on this fabric; capture on the CUDA fabric "
                           "(TIDE_FABRIC_CUDA), or call outside the capture",
                           w->transport->name, me);
    if (w->rails != NULL)
        tide_capture_block(v, TIDE_CAPTURE_NO_FABRIC,
                           "cuda mp fabric: rank %d: calls cannot be captured into a CUDA graph "
                           "with a rail transport (TIDE_CUDA_MP_RAILS)",
                           me);
    if (w->graph_calls > 0) {
        /* Every captured call joins the world's streams into its capture. */
        unsigned long long held = 0;
        TIDE_CHECK(tide_cuda_graph_key("cuda mp fabric", me, w->stream[0],
                                       "the fabric's streams are", &held));
        if (held != 0 && held != key)
            tide_capture_block(v, TIDE_CAPTURE_OTHER_GRAPH,
                               "cuda mp fabric: rank %d: the fabric's streams are in a stream "
                               "capture that is still under way; calls of two concurrent captures "
                               "on one world cannot be captured: end one capture first",
                               me);
    }
    /* A captured fence of a view: every sibling family whose last call was captured must have
     * been captured in this capture (mp_graph.c, top). */
    const tide_mp_arena_t *p = a->parent;
    for (int i = 0; fi == 2 && p != NULL && p->views != NULL && i < p->num_views; ++i) {
        const tide_mp_arena_t *sib = p->views[i];
        if (sib == NULL || sib == a || sib->graph == NULL) continue;
        for (int f = 0; f < 3; ++f)
            if (sib->graph->captured[f] && sib->graph->key[f] != key)
                tide_capture_block(v, TIDE_CAPTURE_OTHER_GRAPH,
                                   "cuda mp fabric: rank %d: calls of one set must be captured in "
                                   "one graph: this cross-group fence waits on the last %s call "
                                   "of the set's view %d, which was captured in another capture",
                                   me, family_name[f], i);
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_capture_check(struct tide_fabric_arena *arena,
                                         const tide_program_t *prog, void *stream,
                                         uint64_t *key_out, tide_capture_verdict_t *v) {
    const tide_mp_arena_t *a = (const tide_mp_arena_t *)arena;
    unsigned long long key = 0;
    TIDE_CHECK(tide_cuda_graph_key("cuda mp fabric", a->w->base.rank, (cudaStream_t)stream,
                                   "the stream is", &key));
    TIDE_CHECK(capture_verdict(a, tide_cuda_family_of(prog), key != 0 ? key : CAPTURE_NEW, v));
    *key_out = (uint64_t)key;
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_graph_arrive(tide_mp_arena_t *a, int fi, bool ready, cudaStream_t caller,
                                        bool *captured_out, unsigned long long *key_out) {
    tide_mp_world_t *w = a->w;
    const int me = w->base.rank;
    unsigned long long key = 0;
    TIDE_CHECK(tide_cuda_graph_key("cuda mp fabric", me, caller, "the caller's stream is", &key));
    *captured_out = false;
    *key_out = 0;
    if (key == 0 && w->graph_calls == 0) return TIDE_SUCCESS; /* eager, nothing ever captured */
    if (key == 0) {
        /* Every captured call joins the world's streams into its capture. */
        unsigned long long held = 0;
        TIDE_CHECK(tide_cuda_graph_key("cuda mp fabric", me, w->stream[0],
                                       "the fabric's streams are", &held));
        if (held != 0)
            return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                            "cuda mp fabric: rank %d: the fabric's streams are in a stream "
                            "capture that is still under way; an eager call would join it: end "
                            "the capture first, or capture this call too",
                            me);
        const struct tide_mp_graph *g = a->graph;
        if (g != NULL && g->captured[fi])
            return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                            "cuda mp fabric: rank %d: this group's %s calls were captured into a "
                            "CUDA graph: they can only be replayed (launch the graph) until the "
                            "group is deregistered, not called eagerly",
                            me, family_name[fi]);
        if (a->parent != NULL && a->parent->set_captured)
            return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                            "cuda mp fabric: rank %d: calls of this group's set were captured "
                            "into a CUDA graph: every group of the set can only be replayed "
                            "(launch the graph) until it is deregistered, not called eagerly "
                            "(a %s call here)",
                            me, family_name[fi]);
        return TIDE_SUCCESS;
    }
    /* A set's own arena runs no call (mp_view.c); a view's calls are served below. */
    if ((fi == 2 && a->parent == NULL) || (a->parent == NULL && a->flag_areas > 1))
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cuda mp fabric: rank %d: a captured call on a set's arena, not on one "
                        "of its views",
                        me);
    tide_capture_verdict_t v;
    memset(&v, 0, sizeof(v));
    TIDE_CHECK(capture_verdict(a, fi, key, &v));
    TIDE_CHECK(tide_capture_refuse(&v, ""));
    /* Core refuses a program's first call inside a capture before it gets here
     * (api/capture.c): its bookkeeping says whether the program ran. */
    if (!ready)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cuda mp fabric: rank %d: a captured call of a program this fabric never "
                        "prepared (the first call of a program cannot be captured into a CUDA "
                        "graph)",
                        me);
    *captured_out = true;
    *key_out = key;
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ capture-time state */

/* `bytes` of `host` into new device memory owned by the arena's graph state; synchronous, on a
 * private stream, outside the capture (the caller switched to relaxed capture mode). */
static tide_result_t table_put(struct tide_mp_graph *g, cudaStream_t up, const void *host,
                               size_t bytes, void **dev_out) {
    struct tide_mp_graph_mem *m = calloc(1, sizeof(*m));
    if (m == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: captured call's tables");
    m->next = g->mem;
    g->mem = m;
    TIDE_CUDA_CALL(cudaMalloc(&m->dev, bytes > 0 ? bytes : 1), "cudaMalloc(captured call's table)");
    TIDE_CUDA_CALL(cudaMemcpyAsync(m->dev, host, bytes, cudaMemcpyHostToDevice, up),
                   "cudaMemcpyAsync(captured call's table)");
    TIDE_CUDA_CALL(cudaStreamSynchronize(up), "cudaStreamSynchronize(captured call's table)");
    *dev_out = m->dev;
    return TIDE_SUCCESS;
}

static tide_result_t state_create(tide_mp_arena_t *a) {
    struct tide_mp_graph *g = calloc(1, sizeof(*g));
    if (g == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: graph state");
    a->graph = g;
    TIDE_CUDA_CALL(cudaMalloc((void **)&g->num, 3 * sizeof(uint64_t)),
                   "cudaMalloc(captured calls' counters)");
    /* Pinned host memory the device maps (no managed memory): the host reads it at the next
     * call or sync without a stream. */
    TIDE_CUDA_CALL(cudaHostAlloc((void **)&g->err_host, 4 * sizeof(uint32_t),
                                 cudaHostAllocMapped | cudaHostAllocPortable),
                   "cudaHostAlloc(captured calls' error word)");
    memset(g->err_host, 0, 4 * sizeof(uint32_t));
    TIDE_CUDA_CALL(cudaHostGetDevicePointer((void **)&g->err_dev, g->err_host, 0),
                   "cudaHostGetDevicePointer(captured calls' error word)");
    return TIDE_SUCCESS;
}

/* An event per slot that this rank records and also waits on (in either form): inside a
 * capture, that dependency is an edge of the graph rather than a kernel spinning on a flag
 * (the flag is still written: the peers wait on it).  The record precedes the wait in this
 * rank's command order (mp.h, "Enqueue order"), so the edge points backwards as the flag
 * dependency does.  One event per slot serves every captured call: a wait takes the latest
 * record in capture order, that of its own call. */
static tide_result_t local_events(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                  tide_mp_prepared_t *pp) {
    struct tide_mp_graph *g = a->graph;
    const int me = a->w->base.rank, pi = (int)(pp - fam->prep);
    /* As call_init in mp_execute.c numbers the call's flag area. */
    const int fidx = tide_cuda_mp_family_index(a, fam) == 2
                         ? TIDE_MP_FENCE_FIDX
                         : tide_cuda_mp_flags_index(fam->coll, pi);
    const int n = pp->sched.num_slots;
    if (g->local[fidx] == NULL || g->local_slots[fidx] < n) {
        /* The fence's two variants share the area: grown to the larger one. */
        const int old = g->local[fidx] != NULL ? g->local_slots[fidx] : 0;
        cudaEvent_t *ev = realloc(g->local[fidx], (size_t)(n > 0 ? n : 1) * sizeof(cudaEvent_t));
        if (ev == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: slot events");
        for (int i = old; i < (n > 0 ? n : 1); ++i)
            ev[i] = NULL;
        g->local[fidx] = ev;
        g->local_slots[fidx] = n;
    }
    for (int f = 0; f < TIDE_SCHED_FORMS; ++f)
        for (int i = 0; i < pp->num_cmds[f]; ++i) {
            const tide_sched_cmd_t *cmd = &pp->cmds[f][i];
            if (cmd->kind != TIDE_SCHED_CMD_WAIT) continue;
            const int slot = cmd->arg;
            if (slot < 0 || slot >= n || pp->sched.slot_thread[slot] / TIDE_CUDA_Q != me ||
                g->local[fidx][slot] != NULL)
                continue;
            TIDE_CUDA_CALL(cudaEventCreateWithFlags(&g->local[fidx][slot], cudaEventDisableTiming),
                           "cudaEventCreateWithFlags(captured slot)");
        }
    return TIDE_SUCCESS;
}

/* The family's counter starts at e - 1 (the first replay runs as call e, after the eager
 * calls before it); the call's gradient pointer row gets a device copy of its own, and this
 * rank's sums are bound to it. */
static tide_result_t capture_state(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                   tide_mp_prepared_t *pp, int fi, uint64_t e, int parity,
                                   cudaStream_t up) {
    if (a->graph == NULL) TIDE_CHECK(state_create(a));
    struct tide_mp_graph *g = a->graph;
    g->timeout_ms = tide_fabric_timeout_ms();
    if (!g->num_set[fi]) {
        const uint64_t start = e - 1;
        TIDE_CUDA_CALL(
            cudaMemcpyAsync(&g->num[fi], &start, sizeof(start), cudaMemcpyHostToDevice, up),
            "cudaMemcpyAsync(captured calls' counter)");
        TIDE_CUDA_CALL(cudaStreamSynchronize(up), "cudaStreamSynchronize(counter)");
        g->num_set[fi] = true;
    }
    TIDE_CHECK(local_events(a, fam, pp));
    if (a->parent != NULL && g->end_ev[fi] == NULL)
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&g->end_ev[fi], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags(captured call's end)");
    if (!pp->sched.has_sum || fam->own_dev[parity] == NULL) return TIDE_SUCCESS;
    const int nr = fam->row_len, me = a->w->base.rank;
    void *dev = NULL;
    TIDE_CHECK(table_put(g, up, fam->grads, (size_t)nr * sizeof(void *), &dev));
    const void *const *old = (const void *const *)fam->own_dev[parity];
    const void *const *now = (const void *const *)dev;
    for (int t = me * TIDE_CUDA_Q; t < (me + 1) * TIDE_CUDA_Q; ++t)
        for (int id = pp->sched.op_base[t]; id < pp->sched.op_base[t + 1]; ++id) {
            if (tide_schedule_op(pp->checked, &pp->sched, id, t)->kind != TIDE_OP_SUM) continue;
            tide_sum_args_t *s = &pp->bound[id].sum;
            if (s->own != NULL && s->own >= old && s->own < old + nr) s->own = now + (s->own - old);
            if (s->peers != NULL) /* direct mode is off in a capture: never bound */
                return TIDE_ERR(TIDE_ERR_INTERNAL,
                                "cuda mp fabric: rank %d: a captured sum reads peers in place", me);
        }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_graph_capture(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                         tide_mp_prepared_t *pp, uint64_t e, int parity) {
    const int fi = tide_cuda_mp_family_index(a, fam);
    /* cudaMalloc and stream synchronisation are refused on a thread in a global-mode capture;
     * none of this touches the capturing streams. */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaError_t ce = cudaThreadExchangeStreamCaptureMode(&mode);
    if (ce != cudaSuccess)
        return tide_cuda_error(ce, __FILE__, __LINE__, "cudaThreadExchangeStreamCaptureMode");
    cudaStream_t up = NULL;
    tide_result_t res = TIDE_SUCCESS;
    ce = cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking);
    if (ce != cudaSuccess)
        res = tide_cuda_error(ce, __FILE__, __LINE__, "cudaStreamCreateWithFlags(graph tables)");
    else
        res = capture_state(a, fam, pp, fi, e, parity, up);
    if (up != NULL) (void)cudaStreamDestroy(up);
    ce = cudaThreadExchangeStreamCaptureMode(&mode);
    if (ce != cudaSuccess && res == TIDE_SUCCESS)
        res = tide_cuda_error(ce, __FILE__, __LINE__, "cudaThreadExchangeStreamCaptureMode");
    return res;
}

void tide_cuda_mp_graph_enqueued(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                 unsigned long long key) {
    const int fi = tide_cuda_mp_family_index(a, fam);
    a->graph->captured[fi] = true;
    a->graph->key[fi] = key;
    if (a->parent != NULL) a->parent->set_captured = true;
    ++a->w->graph_calls;
}

/* ------------------------------------------------------------------ views of a set */

/* The counter is one device word that each captured call of the family increments and its
 * kernels read after: two calls of one family must not overlap on the device.  A view's fence
 * is called from the all-gather's stream and from the reduce-scatter's, which nothing else
 * orders inside a graph before the tick (the previous fence call's done flags are waited on
 * after it, through the counter), so its call waits for the previous one's end first (an
 * edge; implied anyway by that wait on every rank's done flag, so it costs no concurrency). */
tide_result_t tide_cuda_mp_graph_begin(tide_mp_arena_t *a, int fi, unsigned long long key,
                                       cudaStream_t caller) {
    const struct tide_mp_graph *g = a->graph;
    if (a->parent != NULL && g->captured[fi] && g->key[fi] == key)
        TIDE_CUDA_CALL(cudaStreamWaitEvent(caller, g->end_ev[fi], 0),
                       "cudaStreamWaitEvent(the family's previous captured call)");
    TIDE_CUDA_CALL(tide_mp_graph_tick(&g->num[fi], caller), "captured call's counter kernel");
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_graph_end(tide_mp_arena_t *a, int fi, cudaStream_t caller) {
    if (a->parent == NULL) return TIDE_SUCCESS;
    TIDE_CUDA_CALL(cudaEventRecord(a->graph->end_ev[fi], caller), "cudaEventRecord(captured end)");
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_graph_wait_siblings(tide_mp_arena_t *a, cudaStream_t caller,
                                               unsigned long long key, tide_cuda_stats_t *st) {
    const tide_mp_arena_t *p = a->parent;
    const struct tide_mp_graph *g = a->graph;
    const int me = a->w->base.rank;
    for (int i = 0; p->views != NULL && i < p->num_views; ++i) {
        const tide_mp_arena_t *v = p->views[i];
        if (v == NULL || v == a) continue;
        for (int f = 0; f < 3; ++f) {
            const int64_t last = v->fam[f].last_epoch;
            if (last < 0) continue;
            if (v->graph != NULL && v->graph->captured[f]) {
                /* Checked at arrival (siblings_check): the same capture. */
                if (v->graph->key[f] != key)
                    return TIDE_ERR(TIDE_ERR_INTERNAL,
                                    "cuda mp fabric: rank %d: a sibling's call of another capture",
                                    me);
                TIDE_CUDA_CALL(cudaStreamWaitEvent(caller, v->graph->end_ev[f], 0),
                               "cudaStreamWaitEvent(sibling's captured call)");
                continue;
            }
            /* Eager, before any capture of the set: its done value is final. */
            tide_mp_graph_wait_t w;
            memset(&w, 0, sizeof(w));
            w.num = NULL;
            w.err = g->err_dev;
            w.delta = last + 1;
            w.timeout_ns = (uint64_t)g->timeout_ms * 1000000u;
            w.family = f;
            w.slot = -2; /* named as a sibling's end by tide_cuda_mp_graph_check */
            w.count = 1;
            w.rank[0] = me;
            w.flag[0] = (uint64_t)tide_cuda_mp_family_done_flag(v, me, f);
            ++st->waits;
            const cudaError_t e = tide_mp_graph_wait(&w, caller);
            if (e != cudaSuccess)
                return tide_cuda_error(e, __FILE__, __LINE__, "captured sibling wait kernel");
        }
    }
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ failure */

tide_result_t tide_cuda_mp_graph_check(tide_mp_arena_t *a) {
    const struct tide_mp_graph *g = a->graph;
    if (g == NULL) return TIDE_SUCCESS;
    const volatile uint32_t *err = g->err_host;
    const uint32_t code = err[0];
    if (code == TIDE_MP_GRAPH_OK) return TIDE_SUCCESS;
    const int rank = (int)err[1], f = (int)err[2], slot = (int)err[3], me = a->w->base.rank;
    const char *fam = f >= 0 && f < 3 ? family_name[f] : "?";
    char what[96];
    if (slot == -2)
        snprintf(what, sizeof(what),
                 "rank %d's end of a sibling group's last %s call (the "
                 "cross-group fence)",
                 rank, fam);
    else if (slot < 0)
        snprintf(what, sizeof(what), "rank %d's end of the previous %s call (the fence)", rank,
                 fam);
    else
        snprintf(what, sizeof(what), "rank %d's signal %d of a %s call", rank, slot, fam);
    char msg[TIDE_MP_CTL_MSG];
    const int dead = tide_mp_boot_dead_peer(&a->w->boot);
    char why[64] = "";
    if (dead >= 0) snprintf(why, sizeof(why), " (rank %d's process exited)", dead);
    if (code == TIDE_MP_GRAPH_TIMEOUT)
        snprintf(msg, sizeof(msg),
                 "rank %d waited %lld ms (TIDE_TIMEOUT_MS) in a replayed captured call for %s%s",
                 me, (long long)a->graph->timeout_ms, what, why);
    else
        snprintf(msg, sizeof(msg),
                 "rank %d: a replayed captured call found %s poisoned: a rank failed%s", me, what,
                 why);
    return tide_cuda_mp_fail_stop_msg(a, msg);
}

void tide_cuda_mp_graph_free(tide_mp_arena_t *a) {
    struct tide_mp_graph *g = a->graph;
    if (g == NULL) return;
    while (g->mem != NULL) {
        struct tide_mp_graph_mem *m = g->mem;
        g->mem = m->next;
        if (m->dev != NULL) (void)cudaFree(m->dev);
        free(m);
    }
    for (int f = 0; f < TIDE_MP_PREPS + 1; ++f) {
        for (int i = 0; g->local[f] != NULL && i < g->local_slots[f]; ++i)
            if (g->local[f][i] != NULL) (void)cudaEventDestroy(g->local[f][i]);
        free(g->local[f]);
    }
    for (int f = 0; f < 3; ++f)
        if (g->end_ev[f] != NULL) (void)cudaEventDestroy(g->end_ev[f]);
    if (g->num != NULL) (void)cudaFree(g->num);
    if (g->err_host != NULL) (void)cudaFreeHost(g->err_host);
    (void)cudaGetLastError();
    free(g);
    a->graph = NULL;
}
