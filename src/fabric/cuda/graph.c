/*
 * graph.c - calls of the single-process CUDA fabric captured into a CUDA graph and replayed
 * (docs/cuda-fabric.md, "CUDA graphs").
 *
 * A call is captured when every rank's caller stream is in one stream capture
 * (cudaStreamBeginCapture on one stream, the other ranks' streams forked from it with
 * events).  The enqueue (execute.c) is the eager one with these differences, each because
 * the eager form would not survive capture or replay:
 *
 *  - The fabric's streams join the capture the way they join an eager call: every thread's
 *    first command waits on the start event recorded on its rank's caller stream, and its
 *    end is joined back by that caller.  The aggregation stream (the fence) and the utility
 *    streams (direct mode's read-done) have no caller to join; rank 0's caller joins them
 *    (tide_cuda_graph_join), so that cudaStreamEndCapture finds no unjoined work.
 *  - Nothing waits across the capture boundary: an event recorded outside the capture cannot
 *    be waited on inside it (cudaErrorStreamCaptureIsolation), and one recorded inside it
 *    means nothing to eager work.  So a call whose previous call of the family is in another
 *    capture (or eager) takes the FRESH form, which depends on nothing of earlier calls, and
 *    waits on no fence of a call outside its capture.  What orders it after those calls is
 *    the stream: a graph launch starts after the work before it on its stream and ends
 *    before the work after it, so the precondition (docs) is that the graph is launched on a
 *    stream ordered after every rank's earlier calls, and eager calls after a launch are
 *    ordered after it (one caller stream for all ranks gives both).
 *  - No host waits, no host-to-device uploads from memory the host rewrites: the eager path
 *    uploads per-call tables (gradient pointers, copy descriptors, direct mode's landing and
 *    fused-sum tables) from double-buffered pinned rows and waits on the host for call e - 2
 *    before reusing a row.  A captured memcpy node would read the pinned row at replay time,
 *    when later eager calls have rewritten it.  A captured call instead gets device tables of
 *    its own, uploaded once at capture time outside the capture (relaxed capture mode, a
 *    private non-blocking stream) and kept until the group is released: replays read them
 *    from device memory fixed at capture time.
 *  - Counters: on this fabric a signal is an event and a wait a stream wait, resolved when the
 *    schedule is built; no value the host advances per call is read on the device.  The
 *    per-call bank (epoch parity) is bound into the captured addresses; every replay repeats
 *    the captured calls with their banks, each replay after the previous one has ended.
 *
 * What cannot be captured returns TIDE_ERR_UNSUPPORTED before anything is recorded: the first
 * call of a program (prepare allocates and uploads synchronously), every call of groups on a
 * shared arena (the arena's fence waits on its groups' calls across the capture), ranks of
 * one call in different captures (or some eager), a call while another capture holds the
 * fabric's streams, and every call of the NCCL fabric.  The one-process-per-rank fabric
 * captures its calls differently (mp_graph.c: its signals are flags other processes write).
 */
#include "fabric/cuda/graph.h"

#include "core/checks.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct tide_cuda_graph_mem {
    struct tide_cuda_graph_mem *next;
    void *dev;
};

/* The capture `s` is in: *key_out 0 when none, else its capture id + 1.  An invalidated
 * capture (some earlier operation in it failed) is refused: nothing more can be captured. */
static tide_result_t capture_key(const char *fabric, int r, cudaStream_t s, const char *what,
                                 unsigned long long *key_out) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    const cudaError_t e = cudaStreamGetCaptureInfo(s != NULL ? s : cudaStreamLegacy, &st, &id, NULL,
                                                   NULL, NULL, NULL);
    if (e == cudaErrorStreamCaptureImplicit) {
        (void)cudaGetLastError();
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "%s: rank %d calls on the legacy default stream while a stream capture "
                        "is under way: pass the capturing stream (or one forked from it)",
                        fabric, r);
    }
    if (e != cudaSuccess) return tide_cuda_error(e, __FILE__, __LINE__, "cudaStreamGetCaptureInfo");
    if (st == cudaStreamCaptureStatusInvalidated)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "%s: rank %d: %s in an invalidated capture (an earlier operation in "
                        "it failed): end it (cudaStreamEndCapture) and capture again",
                        fabric, r, what);
    *key_out = st == cudaStreamCaptureStatusActive ? id + 1 : 0;
    return TIDE_SUCCESS;
}

/* A capture that begins now: the key a query stands for when the stream is not capturing
 * (capture ids + 1 never reach it), so that it matches no capture under way. */
#define CAPTURE_NEW (~0ull)

/* The capture checks of rank r's call of family `fam` in capture `key` (not 0), without side
 * effects: the blockers into v.  The call path (tide_cuda_graph_arrive) and the query
 * (tide_cuda_capture_check) both decide with it. */
static tide_result_t capture_verdict(tide_cuda_group_t *g, tide_cuda_family_t *fam, int r,
                                     unsigned long long key, tide_capture_verdict_t *v) {
    tide_cuda_shared_t *sh = g->shared;
    /* A shared arena's fence waits on its sibling views' last fences: a captured one would be
     * waited on by eager fences, an eager one by a captured fence. */
    if (fam == &g->fam[2] || g->parent != NULL)
        tide_capture_block(v, TIDE_CAPTURE_NO_FABRIC,
                           "cuda fabric: rank %d: calls of groups on a shared arena cannot be "
                           "captured into a CUDA graph (the arena's fence waits on every group's "
                           "last call across the capture boundary)",
                           r);
    if (fam->pending > 0 && fam->pending_capture != key)
        tide_capture_block(
            v, TIDE_CAPTURE_OTHER_GRAPH,
            "cuda fabric: rank %d: its stream is capturing, the stream of the ranks "
            "that called before it %s: every rank's call must be in one capture, "
            "or none",
            r, fam->pending_capture == 0 ? "is not capturing" : "is in another capture");
    if (sh->captured > 0) {
        /* Every captured call joins the aggregation stream into its capture, so it tells
         * whether the fabric's streams belong to a capture still under way. */
        unsigned long long held = 0;
        TIDE_CHECK(capture_key("cuda fabric", r, sh->agg, "the fabric's streams are", &held));
        if (held != 0 && held != key)
            tide_capture_block(v, TIDE_CAPTURE_OTHER_GRAPH,
                               "cuda fabric: rank %d: the fabric's streams are in a stream capture "
                               "that is still under way (capture %llu); calls of two concurrent "
                               "captures on one world cannot be captured: end one capture first",
                               r, held - 1);
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_graph_arrive(tide_cuda_group_t *g, tide_cuda_family_t *fam, bool ready,
                                     int r, cudaStream_t caller) {
    tide_cuda_shared_t *sh = g->shared;
    unsigned long long key = 0;
    TIDE_CHECK(capture_key("cuda fabric", r, caller, "the caller's stream is", &key));
    if (key == 0 && sh->captured == 0) { /* eager, nothing ever captured */
        if (fam->pending == 0) fam->pending_capture = 0;
        return TIDE_SUCCESS;
    }
    if (key != 0) {
        tide_capture_verdict_t v;
        memset(&v, 0, sizeof(v));
        TIDE_CHECK(capture_verdict(g, fam, r, key, &v));
        TIDE_CHECK(tide_capture_refuse(&v, ""));
        /* Core refuses a program's first call inside a capture before it gets here
         * (api/capture.c): its bookkeeping says whether the program ran. */
        if (!ready)
            return TIDE_ERR(TIDE_ERR_INTERNAL,
                            "cuda fabric: rank %d: a captured call of a program this fabric "
                            "never prepared (its first call cannot be captured into a CUDA "
                            "graph)",
                            r);
    } else {
        if (fam->pending > 0 && fam->pending_capture != 0)
            return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                            "cuda fabric: rank %d: its stream is not capturing, the stream of the "
                            "ranks that called before it is capturing: every rank's call must be "
                            "in one capture, or none",
                            r);
        unsigned long long held = 0;
        TIDE_CHECK(capture_key("cuda fabric", r, sh->agg, "the fabric's streams are", &held));
        if (held != 0)
            return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                            "cuda fabric: rank %d: the fabric's streams are in a stream capture "
                            "that is still under way (capture %llu); an eager call would join "
                            "it: end the capture first, or capture this call too",
                            r, held - 1);
    }
    if (fam->pending == 0) fam->pending_capture = key;
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_capture_check(struct tide_fabric_arena *arena, const tide_program_t *prog,
                                      void *stream, uint64_t *key_out, tide_capture_verdict_t *v) {
    tide_cuda_arena_t *a = (tide_cuda_arena_t *)arena;
    tide_cuda_group_t *g = a->group;
    tide_cuda_shared_t *sh = g->shared;
    const int r = arena->world->rank;
    unsigned long long key = 0;
    TIDE_CHECK(capture_key("cuda fabric", r, (cudaStream_t)stream, "the stream is", &key));
    pthread_mutex_lock(&sh->lock);
    const tide_result_t res =
        capture_verdict(g, &g->fam[tide_cuda_family_of(prog)], r, key != 0 ? key : CAPTURE_NEW, v);
    pthread_mutex_unlock(&sh->lock);
    if (res == TIDE_SUCCESS) *key_out = (uint64_t)key;
    return res;
}

/* ------------------------------------------------------------------ the captured call's tables */

typedef struct {
    tide_cuda_family_t *fam;
    cudaStream_t *up; /* [num_devices]: private upload streams, created on use */
    int num_devices;
} uploader_t;

/* `bytes` of `host` into a new device table on `device`, owned by the family; synchronous
 * (capture time only), so that the host buffer may be reused at once. */
static tide_result_t table_put(uploader_t *u, int device, const void *host, size_t bytes,
                               void **dev_out) {
    struct tide_cuda_graph_mem *m = calloc(1, sizeof(*m));
    if (m == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: captured call's tables");
    m->next = u->fam->graph_mem;
    u->fam->graph_mem = m;
    TIDE_CUDA_CALL(cudaSetDevice(device), "cudaSetDevice");
    TIDE_CUDA_CALL(cudaMalloc(&m->dev, bytes > 0 ? bytes : 1), "cudaMalloc(captured call's table)");
    if (u->up[device] == NULL)
        TIDE_CUDA_CALL(cudaStreamCreateWithFlags(&u->up[device], cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags(captured call's tables)");
    TIDE_CUDA_CALL(cudaMemcpyAsync(m->dev, host, bytes, cudaMemcpyHostToDevice, u->up[device]),
                   "cudaMemcpyAsync(captured call's table)");
    TIDE_CUDA_CALL(cudaStreamSynchronize(u->up[device]),
                   "cudaStreamSynchronize(captured call's table)");
    *dev_out = m->dev;
    return TIDE_SUCCESS;
}

/* p inside the row [old, old + n): the same entry of row `now`. */
static const void *const *rebase(const void *const *p, const void *const *old,
                                 const void *const *now, int n) {
    if (p == NULL || old == NULL || p < old || p >= old + n) return p;
    return now + (p - old);
}

/* Rank r's gradient pointer row (P pointers, or direct mode's L P) and its SUM ops rebound
 * from the family's table of this parity to the captured copy. */
static tide_result_t own_row(uploader_t *u, tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                             int parity, int r) {
    tide_cuda_family_t *fam = u->fam;
    const int np = fam->num_params, nr = fam->own_row;
    const void **want = &fam->grads[(size_t)r * (size_t)np];
    if (pp->direct_sum) {
        tide_cuda_direct_row(fam, pp->direct_l, r, fam->own_row_tmp);
        want = fam->own_row_tmp;
    }
    void *dev = NULL;
    TIDE_CHECK(table_put(u, tide_cuda_device_of(sh, r), want, (size_t)nr * sizeof(void *), &dev));
    const void *const *old = (const void *const *)fam->own_dev[parity][r];
    const void *const *now = (const void *const *)dev;
    for (int t = r * TIDE_CUDA_Q; t < (r + 1) * TIDE_CUDA_Q; ++t)
        for (int id = pp->sched.op_base[t]; id < pp->sched.op_base[t + 1]; ++id) {
            if (tide_schedule_op(pp->checked[r], &pp->sched, id, t)->kind != TIDE_OP_SUM) continue;
            tide_sum_args_t *a = &pp->bound[id].sum;
            a->own = rebase(a->own, old, now, nr);
            a->peers = rebase(a->peers, old, now, nr);
        }
    return TIDE_SUCCESS;
}

/* Direct mode's landing tables and fused-sum tables of the pending call. */
static tide_result_t direct_tables(uploader_t *u, tide_cuda_shared_t *sh,
                                   tide_cuda_prepared_t *pp) {
    const tide_schedule_t *s = &pp->sched;
    for (int t = 0; t < s->num_threads; ++t) {
        const int dev = tide_cuda_device_of(sh, t / TIDE_CUDA_Q);
        for (int id = s->op_base[t]; id < s->op_base[t + 1]; ++id) {
            const size_t n = tide_cuda_direct_land_entries(pp, id, t);
            if (n > 0) {
                const float **host = malloc(n * sizeof(*host));
                if (host == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: landing table");
                tide_cuda_direct_land_fill(pp, id, t, host);
                void *d = NULL;
                const tide_result_t res = table_put(u, dev, host, n * sizeof(*host), &d);
                free(host);
                TIDE_CHECK(res);
                pp->bound[id].land.in_table = (const float *const *)d;
            }
            const tide_cuda_fuse_t *f = pp->fuse != NULL ? pp->fuse[id] : NULL;
            if (f != NULL && f->num_segs > 0) {
                const size_t bytes = (size_t)f->num_segs * sizeof(tide_sum_fused_t);
                tide_sum_fused_t *row = malloc(bytes);
                if (row == NULL)
                    return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: fused sum table");
                tide_cuda_direct_fuse_fill(pp, f, row);
                void *d = NULL;
                const tide_result_t res = table_put(u, dev, row, bytes, &d);
                free(row);
                TIDE_CHECK(res);
                pp->bound[id].sum.fused = (const tide_sum_fused_t *)d;
            }
        }
    }
    return TIDE_SUCCESS;
}

static tide_result_t tables(uploader_t *u, tide_cuda_shared_t *sh, tide_cuda_prepared_t *pp,
                            int parity) {
    tide_cuda_family_t *fam = u->fam;
    const int n = sh->ranks;
    if (pp->sched.has_sum && fam->own_dev[parity] != NULL)
        for (int r = 0; r < n; ++r)
            TIDE_CHECK(own_row(u, sh, pp, parity, r));
    if (pp->batched) {
        if (fam->graph_desc == NULL) {
            fam->graph_desc = calloc(n > 0 ? (size_t)n : 1, sizeof(*fam->graph_desc));
            if (fam->graph_desc == NULL)
                return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: captured copy tables");
        }
        for (int r = 0; r < n; ++r) {
            const int first = pp->slot_base[r], count = pp->slot_base[r + 1] - first;
            fam->graph_desc[r] = NULL;
            if (count == 0) continue;
            tide_cuda_batch_fill(pp, r);
            void *d = NULL;
            TIDE_CHECK(table_put(u, tide_cuda_device_of(sh, r), &pp->desc_call[first],
                                 (size_t)count * sizeof(tide_cuda_copy_desc_t), &d));
            fam->graph_desc[r] = (const tide_cuda_copy_desc_t *)d;
        }
    }
    if (pp->direct) TIDE_CHECK(direct_tables(u, sh, pp));
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_graph_tables(tide_cuda_shared_t *sh, tide_cuda_family_t *fam,
                                     tide_cuda_prepared_t *pp, int parity) {
    uploader_t u = {.fam = fam, .num_devices = sh->num_devices};
    u.up = calloc(sh->num_devices > 0 ? (size_t)sh->num_devices : 1, sizeof(*u.up));
    if (u.up == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: upload streams");
    /* cudaMalloc and stream synchronisation are refused on a thread in a global-mode
     * capture; none of this touches the capturing streams. */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
        free(u.up);
        return tide_cuda_error(e, __FILE__, __LINE__, "cudaThreadExchangeStreamCaptureMode");
    }
    tide_result_t res = tables(&u, sh, pp, parity);
    for (int d = 0; d < sh->num_devices; ++d)
        if (u.up[d] != NULL) (void)cudaStreamDestroy(u.up[d]);
    free(u.up);
    e = cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess && res == TIDE_SUCCESS)
        res = tide_cuda_error(e, __FILE__, __LINE__, "cudaThreadExchangeStreamCaptureMode");
    return res;
}

tide_result_t tide_cuda_graph_join(tide_cuda_family_t *fam, const tide_cuda_prepared_t *pp,
                                   int ranks, int parity, cudaStream_t caller0, uint64_t *waits) {
    ++*waits;
    TIDE_CUDA_CALL(cudaStreamWaitEvent(caller0, fam->fence[parity], 0),
                   "cudaStreamWaitEvent(capture join)");
    if (!pp->direct_sum) return TIDE_SUCCESS;
    /* Each node's read-done events are recorded in rank order on its device's utility
     * stream: the last one ends that stream's part of the call. */
    const int L = pp->direct_l;
    for (int n0 = 0; n0 < ranks; n0 += L) {
        ++*waits;
        TIDE_CUDA_CALL(
            cudaStreamWaitEvent(
                caller0, fam->user[(n0 + L - 1) * TIDE_EVENT_COUNT + TIDE_EVENT_READ_DONE], 0),
            "cudaStreamWaitEvent(capture join)");
    }
    return TIDE_SUCCESS;
}

void tide_cuda_graph_enqueued(tide_cuda_shared_t *sh, tide_cuda_family_t *fam, int parity) {
    fam->call_capture[parity] = fam->pending_capture;
    if (fam->pending_capture != 0) ++sh->captured;
}

void tide_cuda_graph_free(tide_cuda_family_t *fam) {
    while (fam->graph_mem != NULL) {
        struct tide_cuda_graph_mem *m = fam->graph_mem;
        fam->graph_mem = m->next;
        if (m->dev != NULL) (void)cudaFree(m->dev);
        free(m);
    }
    free(fam->graph_desc);
    fam->graph_desc = NULL;
    (void)cudaGetLastError();
}

tide_result_t tide_cuda_graph_key(const char *fabric, int rank, cudaStream_t s, const char *what,
                                  unsigned long long *key_out) {
    return capture_key(fabric, rank, s, what, key_out);
}

tide_result_t tide_cuda_stream_capture_key(void *stream, uint64_t *key_out) {
    unsigned long long key = 0;
    TIDE_CHECK(capture_key("stream_capture_key", 0, (cudaStream_t)stream, "the stream", &key));
    *key_out = (uint64_t)key;
    return TIDE_SUCCESS;
}
