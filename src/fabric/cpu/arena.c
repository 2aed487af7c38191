/*
 * arena.c - a group's arenas on the CPU fabric: one POSIX shm object per registration,
 *
 *     [header page][arena of rank 0][arena of rank 1] ... [arena of rank N-1]
 *
 * each arena padded to TIDE_CPU_HEADER_BYTES, so every rank reaches every arena through one
 * mapping.  Registration is collective:
 *
 *   1. rank 0 creates the object (zero-filled), writes the group signature into the header;
 *   -- barrier --
 *   2. the other ranks map it (threads: take rank 0's mapping; processes: open by name) and
 *      compare the signature with their own;
 *   -- barrier --
 *   3. rank 0 unlinks the name (everyone has it mapped); every rank reads the verdict.
 *
 * A rank that fails a step still enters the barriers and records the failure in the control
 * block, so that all ranks return an error instead of one waiting out its deadline.  Names
 * carry the registration sequence, which all ranks share because registration is collective.
 */
#include "core/checks.h"
#include "fabric/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

static void object_name(const tide_cpu_world_t *w, uint64_t seq, char *buf, size_t size) {
    snprintf(buf, size, "%s.g%llu", w->shared->job, (unsigned long long)seq);
}

/* The call records' bytes (N of them) after the arenas. */
static uint64_t calls_bytes(int ranks) {
    return tide_align_up_u64((uint64_t)ranks * sizeof(tide_cpu_call_rec_t), TIDE_CPU_HEADER_BYTES);
}

/* The object's size: header page, N arenas padded to pages, the call records. */
static tide_result_t object_bytes(int ranks, uint64_t bytes, uint64_t *stride_out,
                                  size_t *total_out) {
    uint64_t stride = 0, total = 0;
    if (!tide_add_u64(bytes, TIDE_CPU_HEADER_BYTES - 1, &stride) ||
        !tide_mul_u64(stride / TIDE_CPU_HEADER_BYTES * TIDE_CPU_HEADER_BYTES, (uint64_t)ranks,
                      &total) ||
        !tide_add_u64(total, TIDE_CPU_HEADER_BYTES + calls_bytes(ranks), &total) ||
        total > (uint64_t)SIZE_MAX ||
        total > (uint64_t)INT64_MAX)
        return TIDE_ERR(TIDE_ERR_OVERFLOW, "cpu fabric: %d arenas of %llu bytes overflow", ranks,
                        (unsigned long long)bytes);
    *stride_out = stride / TIDE_CPU_HEADER_BYTES * TIDE_CPU_HEADER_BYTES;
    *total_out = (size_t)total;
    return TIDE_SUCCESS;
}

/* Step 1 (rank 0). */
static tide_result_t create_object(tide_cpu_world_t *w, const char *name, size_t total,
                                   uint64_t bytes, uint64_t signature, uint64_t seq,
                                   tide_cpu_map_t **map_out) {
    void *addr;
    TIDE_CHECK(tide_cpu_shm_create(name, total, &addr));
    tide_cpu_map_t *map;
    tide_result_t res = tide_cpu_map_new(addr, total, &map);
    if (res != TIDE_SUCCESS) {
        munmap(addr, total);
        return res;
    }
    tide_cpu_header_t *h = addr;
    atomic_store_explicit(&h->signature, signature, memory_order_relaxed);
    atomic_store_explicit(&h->bytes, bytes, memory_order_relaxed);
    if (!w->shared->processes && w->shared->direct != 0) {
        /* Direct mode's shared state (direct.c): threads only, where every rank's memory is
         * this process's. */
        res = tide_cpu_direct_group_new(w->base.ranks, &map->direct);
        if (res != TIDE_SUCCESS) {
            tide_cpu_map_release(map);
            return res;
        }
    }
    if (!w->shared->processes) {
        /* The other threads take a reference before the second barrier. */
        pthread_mutex_lock(&w->shared->lock);
        w->shared->pending_seq = seq;
        w->shared->pending = map;
        pthread_mutex_unlock(&w->shared->lock);
    }
    *map_out = map;
    return TIDE_SUCCESS;
}

/* Step 2 (ranks != 0). */
static tide_result_t attach_object(tide_cpu_world_t *w, const char *name, size_t total,
                                   uint64_t seq, tide_cpu_map_t **map_out) {
    if (atomic_load_explicit(&w->shared->ctl->reg_failed, memory_order_acquire) == seq + 1)
        return TIDE_ERR(TIDE_ERR_FABRIC, "rank %d: rank 0 could not create the arenas of %s",
                        w->base.rank, name);
    if (!w->shared->processes) {
        tide_cpu_map_t *map = NULL;
        pthread_mutex_lock(&w->shared->lock);
        if (w->shared->pending_seq == seq && w->shared->pending != NULL) {
            map = w->shared->pending;
            atomic_fetch_add_explicit(&map->refs, 1, memory_order_relaxed);
        }
        pthread_mutex_unlock(&w->shared->lock);
        if (map == NULL)
            return TIDE_ERR(TIDE_ERR_INTERNAL, "rank %d: no mapping for %s", w->base.rank, name);
        *map_out = map;
        return TIDE_SUCCESS;
    }
    void *addr;
    /* Rank 0 created it before the first barrier: no waiting for it to appear. */
    TIDE_CHECK(tide_cpu_shm_open(name, total, tide_cpu_now_ns(), &addr));
    tide_result_t res = tide_cpu_map_new(addr, total, map_out);
    if (res != TIDE_SUCCESS) munmap(addr, total);
    return res;
}

/* Step 3 (rank 0), also on failure: nobody opens the object by name after the barriers. */
static void retire_name(tide_cpu_world_t *w, const char *name) {
    if (w->base.rank != 0) return;
    tide_cpu_shm_unlink(name);
    if (!w->shared->processes) {
        pthread_mutex_lock(&w->shared->lock);
        w->shared->pending = NULL;
        pthread_mutex_unlock(&w->shared->lock);
    }
}

static void flag_failure(tide_cpu_world_t *w, uint64_t seq) {
    atomic_store_explicit(&w->shared->ctl->reg_failed, seq + 1, memory_order_release);
}

tide_result_t tide_cpu_arena_create(struct tide_fabric_world *world, uint64_t bytes,
                                    uint64_t signature, struct tide_fabric_arena **arena_out) {
    tide_cpu_world_t *w = (tide_cpu_world_t *)world;
    const int n = world->ranks, rank = world->rank;
    const uint64_t seq = w->registrations++;
    char name[TIDE_CPU_NAME_MAX + 32];
    object_name(w, seq, name, sizeof(name));
    tide_result_t res, step = TIDE_SUCCESS;
    uint64_t stride = 0;
    size_t total = 0;
    TIDE_CHECK(object_bytes(n, bytes, &stride, &total));

    tide_cpu_arena_t *a = calloc(1, sizeof(*a));
    uint8_t **bases = calloc((size_t)n, sizeof(*bases));
    if (a == NULL || bases == NULL) {
        step = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cpu fabric: out of host memory for %d arenas", n);
        flag_failure(w, seq);
    }
    if (rank == 0 && step == TIDE_SUCCESS) {
        step = create_object(w, name, total, bytes, signature, seq, &a->map);
        if (step != TIDE_SUCCESS) flag_failure(w, seq);
    }
    TIDE_CHECK_GOTO(tide_cpu_barrier(w, "group registration (create)"), res, fail);
    if (rank != 0 && step == TIDE_SUCCESS) {
        step = attach_object(w, name, total, seq, &a->map);
        if (step == TIDE_SUCCESS) {
            tide_cpu_header_t *h = a->map->addr;
            if (atomic_load(&h->signature) != signature || atomic_load(&h->bytes) != bytes)
                atomic_fetch_add(&h->mismatches, 1);
        } else {
            flag_failure(w, seq);
        }
    }
    res = tide_cpu_barrier(w, "group registration (attach)");
    retire_name(w, name);
    if (res != TIDE_SUCCESS) goto fail;
    if (step != TIDE_SUCCESS) {
        res = step;
        goto fail;
    }
    if (atomic_load_explicit(&w->shared->ctl->reg_failed, memory_order_acquire) == seq + 1) {
        res = TIDE_ERR(TIDE_ERR_FABRIC, "rank %d: another rank failed to register group %s", rank,
                       name);
        goto fail;
    }
    tide_cpu_header_t *h = a->map->addr;
    uint64_t mismatches = atomic_load(&h->mismatches);
    if (mismatches != 0) {
        res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                       "rank %d: %llu rank(s) registered a group whose signature or arena size "
                       "differs from rank 0's (registration is collective: every rank must pass "
                       "the same config and group)",
                       rank, (unsigned long long)mismatches);
        goto fail;
    }
    for (int r = 0; r < n; ++r)
        bases[r] = (uint8_t *)a->map->addr + TIDE_CPU_HEADER_BYTES + (size_t)r * stride;
    a->calls = (tide_cpu_call_rec_t *)((uint8_t *)a->map->addr + TIDE_CPU_HEADER_BYTES +
                                       (size_t)n * stride);
    a->base.world = world;
    a->base.bytes = bytes;
    a->base.bases = bases;
    *arena_out = &a->base;
    return TIDE_SUCCESS;

fail:
    retire_name(w, name);
    if (a != NULL) tide_cpu_map_release(a->map);
    free(bases);
    free(a);
    return res;
}

tide_result_t tide_cpu_arena_destroy(struct tide_fabric_arena *arena) {
    if (arena == NULL) return TIDE_SUCCESS;
    tide_cpu_arena_t *a = (tide_cpu_arena_t *)arena;
    /* Collective, so that no peer still copies into this rank's arena when a process unmaps
     * it; the memory itself is refcounted and goes with the last mapping either way. */
    tide_result_t res = tide_cpu_barrier((tide_cpu_world_t *)arena->world, "group deregistration");
    tide_cpu_direct_free_all(a);
    tide_cpu_map_release(a->map);
    free(arena->bases);
    free(a);
    return res;
}
