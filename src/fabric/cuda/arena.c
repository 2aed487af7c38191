/*
 * arena.c - a group's arenas on the CUDA fabric.
 *
 * Registration is collective, but one thread may register all ranks one after the other, so
 * nothing here waits for other ranks: the first rank to call arena_create for a registration
 * (the k-th call of every rank is the k-th registration) allocates and zeroes all N arenas,
 * each with cudaMalloc on its rank's device (plain device memory, never managed memory); the
 * other ranks attach to it and compare the group signature.  Every view sees the same N base
 * pointers, which UVA and peer access make usable from any device.  The SIGNALS region stays
 * unused: counters are resolved into events on the host (program/schedule.c).
 *
 * The memory goes with the last view, after the last enqueued calls completed.
 *
 * Shared arenas (docs/arena.md, "Fabrics"): arena_view_create makes a registration that
 * borrows a parent registration's memory (its N base pointers, nothing allocated or zeroed)
 * and owns fresh families, so that each group of a set keeps its own events, prepared command
 * lists and call counters.  The views are destroyed before the parent, which frees the memory.
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"
#include "fabric/cuda/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tide_result_t family_init(tide_cuda_shared_t *sh, tide_cuda_family_t *fam,
                                 tide_collective_t coll) {
    const int n = sh->ranks;
    fam->coll = coll;
    fam->last_epoch = -1;
    fam->fence_epoch[0] = fam->fence_epoch[1] = -1;
    fam->user = calloc((size_t)n * TIDE_EVENT_COUNT, sizeof(*fam->user));
    fam->present = calloc((size_t)n, sizeof(*fam->present));
    fam->caller = calloc((size_t)n, sizeof(*fam->caller));
    if (fam->user == NULL || fam->present == NULL || fam->caller == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: call state of %d ranks", n);
    TIDE_CUDA_CALL(cudaSetDevice(0), "cudaSetDevice");
    for (int p = 0; p < 2; ++p)
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&fam->fence[p], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
    for (int r = 0; r < n; ++r) {
        TIDE_CUDA_CALL(cudaSetDevice(tide_cuda_device_of(sh, r)), "cudaSetDevice");
        for (int k = 0; k < TIDE_EVENT_COUNT; ++k)
            TIDE_CUDA_CALL(cudaEventCreateWithFlags(&fam->user[r * TIDE_EVENT_COUNT + k],
                                                    cudaEventDisableTiming),
                           "cudaEventCreateWithFlags");
    }
    return TIDE_SUCCESS;
}

void tide_cuda_family_free(tide_cuda_family_t *fam, int ranks) {
    for (int m = 0; m < TIDE_RS_MODE_COUNT; ++m)
        tide_cuda_prepared_free(&fam->prep[m], ranks);
    tide_cuda_own_tables_free(fam, ranks);
    tide_cuda_graph_free(fam);
    for (int p = 0; p < 2; ++p)
        if (fam->fence[p] != NULL) cudaEventDestroy(fam->fence[p]);
    if (fam->user != NULL)
        for (int i = 0; i < ranks * TIDE_EVENT_COUNT; ++i)
            if (fam->user[i] != NULL) cudaEventDestroy(fam->user[i]);
    (void)cudaGetLastError();
    free(fam->user);
    free(fam->present);
    free(fam->caller);
    memset(fam, 0, sizeof(*fam));
}

/* Wait until nothing of the group runs any more: the fence of each family's last call covers
 * every op of every rank; after a failure part-way, whole devices are synchronised. */
static void group_quiesce(tide_cuda_group_t *g) {
    tide_cuda_shared_t *sh = g->shared;
    bool sync_devices = false;
    for (int f = 0; f < 3; ++f) {
        tide_cuda_family_t *fam = &g->fam[f];
        if (fam->last_epoch < 0) continue;
        const int p = (int)(fam->last_epoch % 2);
        /* A fence recorded in a capture is a graph node, not a point of this stream. */
        if (fam->broken == TIDE_SUCCESS && fam->fence_epoch[p] == fam->last_epoch &&
            fam->call_capture[p] == 0)
            (void)cudaEventSynchronize(fam->fence[p]);
        else
            sync_devices = true;
    }
    for (int f = 0; f < 3 && !sync_devices; ++f)
        if (g->fam[f].broken != TIDE_SUCCESS) sync_devices = true;
    if (sync_devices)
        for (int d = 0; d < sh->num_devices; ++d)
            if (cudaSetDevice(d) == cudaSuccess) (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
}

static void group_free(tide_cuda_group_t *g) {
    tide_cuda_shared_t *sh = g->shared;
    group_quiesce(g);
    for (int c = 0; c < 2; ++c)
        tide_call_table_free(&g->checks[c]);
    for (int f = 0; f < 3; ++f)
        tide_cuda_family_free(&g->fam[f], sh->ranks);
    if (g->parent != NULL) {
        free(g); /* the memory is the parent's */
        return;
    }
    if (g->bases != NULL)
        for (int r = 0; r < sh->ranks; ++r)
            if (g->bases[r] != NULL) cudaFree(g->bases[r]);
    (void)cudaGetLastError();
    free(g->bases);
    free(g);
}

/* Allocate and zero the N arenas of a registration. */
static tide_result_t families_init(tide_cuda_group_t *g) {
    TIDE_CHECK(family_init(g->shared, &g->fam[0], TIDE_COLL_ALL_GATHER));
    TIDE_CHECK(family_init(g->shared, &g->fam[1], TIDE_COLL_REDUCE_SCATTER));
    /* The fence runs SIGNAL / WAIT programs compiled as all-gathers (program/fence.c). */
    return family_init(g->shared, &g->fam[2], TIDE_COLL_ALL_GATHER);
}

static tide_result_t group_alloc(tide_cuda_group_t *g) {
    tide_cuda_shared_t *sh = g->shared;
    const int n = sh->ranks;
    if (g->parent != NULL) {
        g->bases = g->parent->bases;
        return families_init(g);
    }
    g->bases = calloc((size_t)n, sizeof(*g->bases));
    if (g->bases == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d arenas", n);
    for (int r = 0; r < n; ++r) {
        const int d = tide_cuda_device_of(sh, r);
        char what[96];
        snprintf(what, sizeof(what), "cudaMalloc(%llu bytes) of rank %d's arena on device %d",
                 (unsigned long long)g->bytes, r, d);
        TIDE_CUDA_CALL(cudaSetDevice(d), "cudaSetDevice");
        TIDE_CUDA_CALL(cudaMalloc((void **)&g->bases[r], (size_t)g->bytes), what);
        TIDE_CUDA_CALL(cudaMemsetAsync(g->bases[r], 0, (size_t)g->bytes, sh->util[d]),
                       "cudaMemsetAsync(arena)");
    }
    for (int d = 0; d < sh->num_devices; ++d)
        TIDE_CUDA_CALL(cudaStreamSynchronize(sh->util[d]), "cudaStreamSynchronize(arena zeroing)");
    return families_init(g);
}

/* The registration `seq` (under the lock): found, or created by the first rank to arrive. */
static tide_result_t group_of(tide_cuda_shared_t *sh, tide_cuda_group_t *parent, uint64_t seq,
                              uint64_t bytes, uint64_t signature, tide_cuda_group_t **out) {
    for (tide_cuda_group_t *g = sh->registering; g != NULL; g = g->next)
        if (g->seq == seq) {
            *out = g;
            return TIDE_SUCCESS;
        }
    tide_cuda_group_t *g = calloc(1, sizeof(*g));
    if (g == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: out of host memory");
    g->shared = sh;
    g->parent = parent;
    g->seq = seq;
    g->bytes = bytes;
    g->signature = signature;
    int prev_device = -1;
    if (cudaGetDevice(&prev_device) != cudaSuccess) prev_device = -1;
    g->failed = group_alloc(g);
    if (prev_device >= 0) (void)cudaSetDevice(prev_device);
    if (g->failed != TIDE_SUCCESS) {
        /* Keep the entry so that the other ranks learn of the failure; free the memory now
         * (nothing ran on it). */
        for (int f = 0; f < 3; ++f)
            tide_cuda_family_free(&g->fam[f], sh->ranks);
        if (g->bases != NULL && parent == NULL) {
            for (int r = 0; r < sh->ranks; ++r)
                if (g->bases[r] != NULL) cudaFree(g->bases[r]);
            free(g->bases);
        }
        (void)cudaGetLastError();
        g->bases = NULL;
    } else if (parent != NULL) {
        g->view_next = parent->views;
        parent->views = g;
    }
    g->next = sh->registering;
    sh->registering = g;
    *out = g;
    return TIDE_SUCCESS;
}

/* A view that goes leaves its parent's list (under the lock). */
static void unlink_view(tide_cuda_group_t *g) {
    if (g->parent == NULL) return;
    for (tide_cuda_group_t **p = &g->parent->views; *p != NULL; p = &(*p)->view_next)
        if (*p == g) {
            *p = g->view_next;
            g->view_next = NULL;
            return;
        }
}

/* The last rank passed registration: the entry leaves the registering list. */
static void unlist(tide_cuda_shared_t *sh, tide_cuda_group_t *g) {
    for (tide_cuda_group_t **p = &sh->registering; *p != NULL; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            g->next = NULL;
            return;
        }
}

/* A registration of this rank: of new memory (parent NULL) or a view of parent's. */
static tide_result_t attach(struct tide_fabric_world *world, tide_cuda_group_t *parent,
                            uint64_t bytes, uint64_t signature,
                            struct tide_fabric_arena **arena_out) {
    tide_cuda_world_t *w = (tide_cuda_world_t *)world;
    tide_cuda_shared_t *sh = w->shared;
    if (bytes == 0 || bytes > (uint64_t)SIZE_MAX)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "cuda fabric: arena of %llu bytes",
                        (unsigned long long)bytes);
    tide_cuda_arena_t *a = calloc(1, sizeof(*a));
    if (a == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: out of host memory");

    pthread_mutex_lock(&sh->lock);
    const uint64_t seq = w->registrations++;
    tide_cuda_group_t *g = NULL;
    tide_result_t res = group_of(sh, parent, seq, bytes, signature, &g);
    if (res != TIDE_SUCCESS) goto fail_locked;
    const bool last = ++g->arrived == sh->ranks;
    if (last) unlist(sh, g);
    if (g->failed != TIDE_SUCCESS) {
        res = TIDE_ERR(TIDE_ERR_FABRIC,
                       "rank %d: the arenas of registration %llu could not be "
                       "created (%s)",
                       world->rank, (unsigned long long)seq, tide_get_error_string(g->failed));
        if (last && g->refs == 0) free(g);
        goto fail_locked;
    }
    if (g->signature != signature || g->bytes != bytes || g->parent != parent) {
        /* The ranks that attached would wait for this one forever: the group fails for all. */
        g->failed = TIDE_ERR_INVALID_ARGUMENT;
        res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                       "rank %d: registered a group whose signature or arena size (%llu bytes) "
                       "differs from the first rank's (%llu bytes); registration is collective: "
                       "every rank must pass the same config and group",
                       world->rank, (unsigned long long)bytes, (unsigned long long)g->bytes);
        if (last && g->refs == 0) {
            unlink_view(g);
            group_free(g);
        }
        goto fail_locked;
    }
    ++g->refs;
    pthread_mutex_unlock(&sh->lock);
    a->group = g;
    a->base.world = world;
    a->base.bytes = bytes;
    a->base.bases = g->bases;
    *arena_out = &a->base;
    return TIDE_SUCCESS;

fail_locked:
    pthread_mutex_unlock(&sh->lock);
    free(a);
    return res;
}

tide_result_t tide_cuda_arena_create(struct tide_fabric_world *world, uint64_t bytes,
                                     uint64_t signature, struct tide_fabric_arena **arena_out) {
    return attach(world, NULL, bytes, signature, arena_out);
}

tide_result_t tide_cuda_arena_view_create(struct tide_fabric_arena *parent, uint64_t signature,
                                          struct tide_fabric_arena **view_out) {
    tide_cuda_group_t *pg = ((tide_cuda_arena_t *)parent)->group;
    if (pg->parent != NULL)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "cuda fabric: rank %d: a view of a view (views share a registration's "
                        "memory: pass the parent arena)",
                        parent->world->rank);
    return attach(parent->world, pg, parent->bytes, signature, view_out);
}

tide_result_t tide_cuda_arena_destroy(struct tide_fabric_arena *arena) {
    if (arena == NULL) return TIDE_SUCCESS;
    tide_cuda_arena_t *a = (tide_cuda_arena_t *)arena;
    tide_cuda_group_t *g = a->group;
    tide_cuda_shared_t *sh = g->shared;
    pthread_mutex_lock(&sh->lock);
    const bool last = --g->refs == 0 && g->arrived == sh->ranks;
    if (last) unlink_view(g);
    pthread_mutex_unlock(&sh->lock);
    if (last) {
        int prev_device = -1;
        if (cudaGetDevice(&prev_device) != cudaSuccess) prev_device = -1;
        group_free(g);
        if (prev_device >= 0) (void)cudaSetDevice(prev_device);
    }
    free(a);
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_arena_stats(const struct tide_fabric_arena *arena, tide_collective_t coll,
                                    tide_cuda_stats_t *stats_out) {
    const tide_cuda_group_t *g = ((const tide_cuda_arena_t *)arena)->group;
    pthread_mutex_lock(&g->shared->lock);
    *stats_out = g->fam[coll == TIDE_COLL_ALL_GATHER ? 0 : 1].stats;
    pthread_mutex_unlock(&g->shared->lock);
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_arena_event(const struct tide_fabric_arena *arena, tide_collective_t coll,
                                    int rank, tide_event_t which, cudaEvent_t *event_out) {
    const tide_cuda_group_t *g = ((const tide_cuda_arena_t *)arena)->group;
    TIDE_ARG_CHECK(rank >= 0 && rank < g->shared->ranks, "cuda fabric: rank %d", rank);
    TIDE_ARG_CHECK((unsigned)which < TIDE_EVENT_COUNT, "cuda fabric: event %d", (int)which);
    *event_out = g->fam[coll == TIDE_COLL_ALL_GATHER ? 0 : 1].user[rank * TIDE_EVENT_COUNT + which];
    return TIDE_SUCCESS;
}
