/*
 * world.c - the CPU fabric's communicators: N rank handles of one process (threads) or one
 * handle per process joined through a control shm object named after the job; and the
 * provider vtable.
 */
#include "core/checks.h"
#include "fabric/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Distinguishes the worlds of one process in shm names. */
static atomic_uint_fast64_t world_serial;

static tide_result_t shared_new(bool processes, const char *job, tide_cpu_shared_t **out) {
    tide_cpu_shared_t *s = calloc(1, sizeof(*s));
    if (s == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cpu fabric: out of host memory");
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        free(s);
        return TIDE_ERR(TIDE_ERR_FABRIC, "cpu fabric: pthread_mutex_init failed");
    }
    s->processes = processes;
    snprintf(s->job, sizeof(s->job), "%s", job);
    *out = s;
    return TIDE_SUCCESS;
}

static void shared_free(tide_cpu_shared_t *s) {
    if (s->processes) {
        if (s->ctl != NULL) munmap(s->ctl, s->ctl_bytes);
    } else {
        free(s->ctl);
    }
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static void world_fill(tide_cpu_world_t *w, tide_cpu_shared_t *s, int nodes, int l, int rank);

static tide_result_t cpu_world_create_all(int nodes, int gpus_per_node,
                                          struct tide_fabric_world **worlds_out) {
    const int n = nodes * gpus_per_node;
    char job[64];
    snprintf(job, sizeof(job), "/tide.t%ld.%llu", (long)getpid(),
             (unsigned long long)atomic_fetch_add(&world_serial, 1));
    tide_result_t res;
    tide_cpu_shared_t *s = NULL;
    TIDE_CHECK(shared_new(false, job, &s));
    s->direct = tide_cpu_direct_env();
    s->ctl_bytes = sizeof(tide_cpu_ctl_t);
    s->ctl = calloc(1, s->ctl_bytes);
    tide_cpu_world_t *w = calloc((size_t)n, sizeof(*w));
    if (s->ctl == NULL || w == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cpu fabric: out of host memory for %d ranks", n);
        goto fail;
    }
    atomic_init(&s->refs, n);
    /* One allocation for the N handles; the last world_destroy frees it as w - rank. */
    for (int r = 0; r < n; ++r) {
        world_fill(&w[r], s, nodes, gpus_per_node, r);
        worlds_out[r] = &w[r].base;
    }
    return TIDE_SUCCESS;
fail:
    free(w);
    shared_free(s);
    return res;
}

static tide_result_t cpu_world_create_rank(int nodes, int gpus_per_node, int rank, const char *name,
                                           struct tide_fabric_world **world_out) {
    const int n = nodes * gpus_per_node;
    char job[TIDE_CPU_NAME_MAX];
    snprintf(job, sizeof(job), "/tide.%s", name);
    tide_result_t res;
    tide_cpu_shared_t *s = NULL;
    TIDE_CHECK(shared_new(true, job, &s));
    atomic_init(&s->refs, 1);
    s->ctl_bytes = sizeof(tide_cpu_ctl_t) + sizeof(uint64_t) * (((size_t)n + 63) / 64);
    tide_cpu_world_t *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cpu fabric: out of host memory");
        goto fail_shared;
    }
    world_fill(w, s, nodes, gpus_per_node, rank);

    /* Rank 0 creates the control object (replacing one a crashed job of the same name left);
     * the others wait for it.  A zeroed object is ready to use. */
    void *addr;
    res = rank == 0 ? tide_cpu_shm_create(job, s->ctl_bytes, &addr)
                    : tide_cpu_shm_open(job, s->ctl_bytes, tide_cpu_deadline_ns(), &addr);
    if (res != TIDE_SUCCESS) goto fail_world;
    s->ctl = addr;
    /* From here on a failure retires the name: the job cannot complete its join. */

    const uint64_t key = ((uint64_t)nodes << 8 | (uint64_t)gpus_per_node) + 1;
    uint64_t expect = 0;
    if (!atomic_compare_exchange_strong(&s->ctl->topo_key, &expect, key) && expect != key) {
        res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                       "rank %d of job '%s': M = %d, L = %d, but another rank joined with M = "
                       "%llu, L = %llu",
                       rank, name, nodes, gpus_per_node, (unsigned long long)((expect - 1) >> 8),
                       (unsigned long long)((expect - 1) & 0xff));
        goto fail_world;
    }
    const uint64_t bit = 1ull << (rank % 64);
    if (atomic_fetch_or(&s->ctl->joined[rank / 64], bit) & bit) {
        res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT, "rank %d of job '%s' joined twice", rank, name);
        goto fail_world;
    }
    /* Every rank has the object mapped after the barrier: nobody opens it again, so the name
     * goes now and nothing is left behind if a process dies later. */
    TIDE_CHECK_GOTO(tide_cpu_barrier(w, "communicator join"), res, fail_world);
    if (rank == 0) tide_cpu_shm_unlink(job);
    *world_out = &w->base;
    return TIDE_SUCCESS;

fail_world:
    if (s->ctl != NULL) tide_cpu_shm_unlink(job);
    free(w);
fail_shared:
    shared_free(s);
    return res;
}

static const struct tide_fabric_ops *cpu_ops(void);

static void world_fill(tide_cpu_world_t *w, tide_cpu_shared_t *s, int nodes, int l, int rank) {
    w->base.ops = cpu_ops();
    w->base.rank = rank;
    w->base.nodes = nodes;
    w->base.gpus_per_node = l;
    w->base.ranks = nodes * l;
    w->shared = s;
}

static tide_result_t cpu_world_destroy(struct tide_fabric_world *world) {
    tide_cpu_world_t *w = (tide_cpu_world_t *)world;
    tide_cpu_shared_t *s = w->shared;
    if (s->processes) {
        shared_free(s);
        free(w);
        return TIDE_SUCCESS;
    }
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) {
        free(w - w->base.rank); /* the array of N handles */
        shared_free(s);
    }
    return TIDE_SUCCESS;
}

static bool cpu_rail_lane(const struct tide_fabric_world *world) {
    (void)world;
    return true;
}

const struct tide_fabric_ops tide_fabric_cpu_ops = {
    .kind = TIDE_FABRIC_CPU,
    .name = "cpu",
    .rail_lane = cpu_rail_lane,
    .world_create_all = cpu_world_create_all,
    .world_create_rank = cpu_world_create_rank,
    .world_destroy = cpu_world_destroy,
    .arena_create = tide_cpu_arena_create,
    .arena_destroy = tide_cpu_arena_destroy,
    .execute = tide_cpu_execute,
    .call_check = tide_cpu_call_check,
};

static const struct tide_fabric_ops *cpu_ops(void) {
    return &tide_fabric_cpu_ops;
}
