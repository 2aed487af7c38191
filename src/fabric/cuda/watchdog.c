/*
 * watchdog.c - every device wait of the one-process-per-rank fabric ends, even while the
 * host is not inside a TIDE call (mp.h, "watchdog"; docs/cuda-fabric.md, "Fail-stop").
 *
 * The host waits of a call (mp_execute.c, host_wait) bound a wait only while the caller is
 * in TIDE: a caller that enqueued its calls and went on to other work (a training step that
 * synchronises its stream, say) would wait forever on a device wait whose peer never comes.
 * So each world runs one thread that, every tick, for each arena of the world:
 *
 *   - when some rank failed the group (the control block's abort word), writes the poison
 *     into every flag (with host flags a CPU store, mp_flags.c) until this process's streams
 *     are idle or TIDE_TIMEOUT_MS passed since it saw the word: a record still queued in a
 *     live rank's stream may write e + 1 over the poison, hence the repetition;
 *   - otherwise, for every call this rank enqueued and whose done event has not completed:
 *     once its begin point passed (an event recorded on the caller's stream before the call's
 *     first device wait, so that work the caller queued before the call does not count), the
 *     call has TIDE_TIMEOUT_MS to complete; past that the watchdog fails the group itself,
 *     naming the ranks the control block says are missing, and poisons as above.
 *
 * The thread never touches a family's host state (broken, epochs): the caller's thread finds
 * the abort word at its next call, sync or host wait and fails stop with its message.  Nor
 * the bootstrap sockets, which belong to the caller's thread (a dead peer is named at once
 * by a host wait, at the deadline by the watchdog).
 *
 * Lifetime.  Started by world creation, stopped and joined by world destruction; an atexit
 * handler stops the threads of worlds left open (a Python World whose close() was refused),
 * before the CUDA runtime's own exit handlers run (those were registered earlier, by the
 * world's first CUDA calls).  Nothing here runs from a finaliser.  A child forked after a
 * world was created has no watchdog thread; its copies are marked so and never joined.
 */
#include "core/checks.h"
#include "fabric/cuda/mp.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct tide_mp_wd_entry {
    tide_mp_arena_t *a;
    /* [family][parity]; families 0 AG, 1 RS, 2 a view's fence (mp_view.c) */
    cudaEvent_t begin[3][2]; /* the call's begin point */
    bool pending[3][2];      /* a call of this parity is followed */
    uint64_t epoch[3][2];    /* its call number */
    uint64_t began_ns[3][2]; /* when its begin point was first seen passed; 0: not yet */
    uint64_t abort_seen_ns;  /* when the abort word was first seen; 0: not yet */
    bool drained;            /* the poison after an abort is done */
} wd_entry_t;

struct tide_mp_watchdog {
    tide_mp_world_t *w;
    pthread_t thread;
    bool running; /* the thread exists in this process and was not joined */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool stop;
    int count, cap;
    wd_entry_t **entries;
    struct tide_mp_watchdog *next; /* every watchdog of the process (atexit, fork) */
};

static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tide_mp_watchdog *all_head;
static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

/* ------------------------------------------------------------------ one tick */

static bool streams_idle(const tide_mp_world_t *w) {
    for (int q = 0; q < TIDE_CUDA_Q; ++q)
        if (cudaStreamQuery(w->stream[q]) != cudaSuccess) return false;
    return true;
}

static void poison_tick(wd_entry_t *e, uint64_t now, uint64_t limit) {
    if (e->abort_seen_ns == 0) e->abort_seen_ns = now;
    if (e->drained) return;
    tide_cuda_mp_flags_poison(e->a);
    if (streams_idle(e->a->w) || now - e->abort_seen_ns > limit) e->drained = true;
    (void)cudaGetLastError();
}

/* The device work of call `epoch` of family f outlived the deadline: fail the group. */
static void expire(wd_entry_t *e, int f, uint64_t epoch, uint64_t waited_ns) {
    tide_mp_arena_t *a = e->a;
    char why[256], msg[TIDE_MP_CTL_MSG + 320]; /* the block keeps TIDE_MP_CTL_MSG of it */
    /* The group's own counters name the missing rank (a view's fences are not counted). */
    if (f < 2)
        tide_mp_ctl_missing(&a->ctl, f, epoch, why, sizeof(why));
    else
        snprintf(why, sizeof(why), "a rank did not reach the fence");
    snprintf(msg, sizeof(msg),
             "rank %d: the device work of its %s call %llu did not complete within %lld ms "
             "(TIDE_TIMEOUT_MS; found by the watchdog after %.1f s): %s",
             a->w->base.rank,
             f == 0   ? "all-gather"
             : f == 1 ? "reduce-scatter"
                      : "fence",
             (unsigned long long)epoch, (long long)tide_fabric_timeout_ms(),
             (double)waited_ns * 1e-9, why);
    /* The abort word is the set's (a view shares its segments: mp_view.c).  If another rank
     * (or this rank's caller thread) was first, its message stands. */
    if (tide_mp_ctl_abort(&tide_cuda_mp_set_of(a)->ctl, msg))
        tide_log(TIDE_LOG_WARN, __FILE__, __LINE__, "cuda mp fabric: %s", msg);
}

static void tick(wd_entry_t *e, uint64_t limit) {
    tide_mp_arena_t *a = e->a;
    const uint64_t now = tide_cuda_now_ns();
    if (tide_mp_ctl_aborted(&tide_cuda_mp_set_of(a)->ctl, NULL, 0) >= 0) {
        poison_tick(e, now, limit);
        return;
    }
    for (int f = 0; f < 3; ++f)
        for (int p = 0; p < 2; ++p) {
            if (!e->pending[f][p]) continue;
            const cudaError_t done = cudaEventQuery(a->fam[f].done_ev[p]);
            if (done != cudaErrorNotReady) {
                /* Complete, or a CUDA error the caller's thread reports at its next wait. */
                (void)cudaGetLastError();
                e->pending[f][p] = false;
                continue;
            }
            if (e->began_ns[f][p] == 0) {
                const cudaError_t began = cudaEventQuery(e->begin[f][p]);
                if (began == cudaSuccess)
                    e->began_ns[f][p] = now;
                else if (began != cudaErrorNotReady)
                    (void)cudaGetLastError();
                continue;
            }
            if (now - e->began_ns[f][p] > limit) {
                expire(e, f, e->epoch[f][p], now - e->began_ns[f][p]);
                poison_tick(e, now, limit);
                return;
            }
        }
}

static void *watchdog_main(void *arg) {
    struct tide_mp_watchdog *wd = arg;
    (void)cudaSetDevice(wd->w->device);
    /* Relaxed capture mode for this thread: while another thread captures calls into a CUDA
     * graph in global mode (mp_graph.c), the runtime would refuse this thread's event queries
     * as potentially unsafe and invalidate that capture.  The events it queries are never
     * recorded inside a capture. */
    enum cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&relaxed);
    (void)cudaGetLastError();
    const int64_t timeout_ms = tide_fabric_timeout_ms();
    const uint64_t limit = (uint64_t)timeout_ms * 1000000u;
    /* A tick of at most 50 ms, and a twentieth of the deadline: the deadline is kept to
     * within a few percent plus the poison's own time. */
    int64_t tick_ms = timeout_ms / 20;
    if (tick_ms > 50) tick_ms = 50;
    if (tick_ms < 1) tick_ms = 1;
    pthread_mutex_lock(&wd->lock);
    while (!wd->stop) {
        for (int i = 0; i < wd->count; ++i)
            tick(wd->entries[i], limit);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)(tick_ms % 1000) * 1000000L;
        until.tv_sec += (time_t)(tick_ms / 1000) + until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        while (!wd->stop && pthread_cond_timedwait(&wd->cond, &wd->lock, &until) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&wd->lock);
    return NULL;
}

/* ------------------------------------------------------------------ process hooks */

static void join(struct tide_mp_watchdog *wd) {
    if (!wd->running) return;
    pthread_mutex_lock(&wd->lock);
    wd->stop = true;
    pthread_cond_signal(&wd->cond);
    pthread_mutex_unlock(&wd->lock);
    pthread_join(wd->thread, NULL);
    wd->running = false;
}

/* Worlds left open at exit: their threads stop before the CUDA runtime tears down. */
static void at_exit(void) {
    pthread_mutex_lock(&all_lock);
    for (struct tide_mp_watchdog *wd = all_head; wd != NULL; wd = wd->next)
        join(wd);
    pthread_mutex_unlock(&all_lock);
}

/* fork: no watchdog lock is held across it, and the child has none of the threads. */
static void fork_prepare(void) {
    pthread_mutex_lock(&all_lock);
    for (struct tide_mp_watchdog *wd = all_head; wd != NULL; wd = wd->next)
        pthread_mutex_lock(&wd->lock);
}
static void fork_parent(void) {
    for (struct tide_mp_watchdog *wd = all_head; wd != NULL; wd = wd->next)
        pthread_mutex_unlock(&wd->lock);
    pthread_mutex_unlock(&all_lock);
}
static void fork_child(void) {
    for (struct tide_mp_watchdog *wd = all_head; wd != NULL; wd = wd->next) {
        wd->running = false;
        pthread_mutex_unlock(&wd->lock);
    }
    pthread_mutex_unlock(&all_lock);
}

static void install_hooks(void) {
    (void)atexit(at_exit);
    (void)pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* ------------------------------------------------------------------ worlds */

tide_result_t tide_mp_watchdog_start(tide_mp_world_t *w) {
    pthread_once(&hooks_once, install_hooks);
    struct tide_mp_watchdog *wd = calloc(1, sizeof(*wd));
    if (wd == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: watchdog");
    wd->w = w;
    pthread_mutex_init(&wd->lock, NULL);
    pthread_cond_init(&wd->cond, NULL);
    pthread_mutex_lock(&all_lock);
    const int rc = pthread_create(&wd->thread, NULL, watchdog_main, wd);
    if (rc == 0) {
        wd->running = true;
        wd->next = all_head;
        all_head = wd;
    }
    pthread_mutex_unlock(&all_lock);
    if (rc != 0) {
        pthread_cond_destroy(&wd->cond);
        pthread_mutex_destroy(&wd->lock);
        free(wd);
        return TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp fabric: watchdog thread: %s", strerror(rc));
    }
    w->watchdog = wd;
    return TIDE_SUCCESS;
}

void tide_mp_watchdog_stop(tide_mp_world_t *w) {
    struct tide_mp_watchdog *wd = w->watchdog;
    if (wd == NULL) return;
    pthread_mutex_lock(&all_lock);
    for (struct tide_mp_watchdog **pp = &all_head; *pp != NULL; pp = &(*pp)->next)
        if (*pp == wd) {
            *pp = wd->next;
            break;
        }
    join(wd);
    pthread_mutex_unlock(&all_lock);
    /* Arenas are removed before their world goes; any left are only forgotten. */
    for (int i = 0; i < wd->count; ++i)
        wd->entries[i]->a->wd = NULL;
    free(wd->entries);
    pthread_cond_destroy(&wd->cond);
    pthread_mutex_destroy(&wd->lock);
    free(wd);
    w->watchdog = NULL;
}

/* ------------------------------------------------------------------ arenas and calls */

static void entry_free(wd_entry_t *e) {
    for (int f = 0; f < 3; ++f)
        for (int p = 0; p < 2; ++p)
            if (e->begin[f][p] != NULL) cudaEventDestroy(e->begin[f][p]);
    (void)cudaGetLastError();
    free(e);
}

tide_result_t tide_mp_watchdog_add(tide_mp_arena_t *a) {
    struct tide_mp_watchdog *wd = a->w->watchdog;
    if (wd == NULL) return TIDE_SUCCESS;
    wd_entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: watchdog entry");
    e->a = a;
    for (int f = 0; f < 3; ++f)
        for (int p = 0; p < 2; ++p)
            if (cudaEventCreateWithFlags(&e->begin[f][p], cudaEventDisableTiming) != cudaSuccess) {
                const cudaError_t err = cudaGetLastError();
                entry_free(e);
                return tide_cuda_error(err, __FILE__, __LINE__,
                                       "cudaEventCreateWithFlags(watchdog)");
            }
    pthread_mutex_lock(&wd->lock);
    if (wd->count == wd->cap) {
        const int cap = wd->cap > 0 ? 2 * wd->cap : 8;
        wd_entry_t **grown = realloc(wd->entries, (size_t)cap * sizeof(*grown));
        if (grown == NULL) {
            pthread_mutex_unlock(&wd->lock);
            entry_free(e);
            return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: watchdog entries");
        }
        wd->entries = grown;
        wd->cap = cap;
    }
    wd->entries[wd->count++] = e;
    a->wd = e;
    pthread_mutex_unlock(&wd->lock);
    return TIDE_SUCCESS;
}

void tide_mp_watchdog_remove(tide_mp_arena_t *a) {
    struct tide_mp_watchdog *wd = a->w->watchdog;
    wd_entry_t *e = a->wd;
    if (wd == NULL || e == NULL) return;
    pthread_mutex_lock(&wd->lock);
    for (int i = 0; i < wd->count; ++i)
        if (wd->entries[i] == e) {
            wd->entries[i] = wd->entries[--wd->count];
            break;
        }
    a->wd = NULL;
    pthread_mutex_unlock(&wd->lock);
    entry_free(e);
}

tide_result_t tide_mp_watchdog_begin(tide_mp_arena_t *a, int f, int p, uint64_t epoch,
                                     cudaStream_t caller) {
    /* Whoever fails the group can then tell a rank whose device never got to the call. */
    TIDE_CHECK(tide_cuda_mp_flags_began(a, f, epoch, caller));
    struct tide_mp_watchdog *wd = a->w->watchdog;
    wd_entry_t *e = a->wd;
    if (wd == NULL || e == NULL) return TIDE_SUCCESS;
    pthread_mutex_lock(&wd->lock);
    /* The previous call of this parity completed (the caller waited for it); the event is
     * about to be recorded for the new one, which is followed once it is enqueued. */
    e->pending[f][p] = false;
    const cudaError_t err = cudaEventRecord(e->begin[f][p], caller);
    pthread_mutex_unlock(&wd->lock);
    return err == cudaSuccess
               ? TIDE_SUCCESS
               : tide_cuda_error(err, __FILE__, __LINE__, "cudaEventRecord(watchdog begin)");
}

void tide_mp_watchdog_enqueued(tide_mp_arena_t *a, int f, int p, uint64_t epoch) {
    struct tide_mp_watchdog *wd = a->w->watchdog;
    wd_entry_t *e = a->wd;
    if (wd == NULL || e == NULL) return;
    pthread_mutex_lock(&wd->lock);
    e->pending[f][p] = true;
    e->epoch[f][p] = epoch;
    e->began_ns[f][p] = 0;
    pthread_mutex_unlock(&wd->lock);
}
