/*
 * shm.c - the CPU fabric's primitives: clock and deadlines, back-off, POSIX shared-memory
 * objects, refcounted mappings and the collective barrier.
 */
#include "core/checks.h"
#include "fabric/cpu/cpu.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ time */

uint64_t tide_cpu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t tide_cpu_deadline_ns(void) {
    return tide_cpu_now_ns() + (uint64_t)tide_fabric_timeout_ms() * 1000000u;
}

void tide_cpu_backoff(unsigned *idle) {
    /* A few yields keep latency low when a peer thread is runnable; after that, sleeping
     * hands the cores to the ranks that have work (there may be more ranks than cores). */
    if (*idle < 16) {
        ++*idle;
        sched_yield();
        return;
    }
    unsigned shift = *idle - 16 < 4 ? *idle - 16 : 4;
    if (*idle < 64) ++*idle;
    struct timespec ts = {0, 25000L << shift}; /* 25 us .. 400 us */
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------ shared memory */

/* errno values that mean "not enough memory or space" rather than a fabric fault. */
static bool is_space_error(int e) {
    return e == ENOMEM || e == ENOSPC || e == EFBIG;
}

static tide_result_t map_fd(int fd, const char *name, size_t bytes, void **addr_out) {
    void *addr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED)
        return TIDE_ERR(errno == ENOMEM ? TIDE_ERR_NO_MEMORY : TIDE_ERR_FABRIC,
                        "cpu fabric: mmap of %s (%zu bytes) failed: %s", name, bytes,
                        strerror(errno));
    *addr_out = addr;
    return TIDE_SUCCESS;
}

tide_result_t tide_cpu_shm_create(const char *name, size_t bytes, void **addr_out) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) {
        /* Left over by a job that died before unlinking it: its contents are stale. */
        shm_unlink(name);
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0)
        return TIDE_ERR(TIDE_ERR_FABRIC, "cpu fabric: shm_open(%s) failed: %s", name,
                        strerror(errno));
    tide_result_t res;
    /* ftruncate zero-fills a new object: the arenas start zeroed without touching them. */
    if (ftruncate(fd, (off_t)bytes) != 0) {
        const int e = errno;
        res = TIDE_ERR(is_space_error(e) ? TIDE_ERR_NO_MEMORY : TIDE_ERR_FABRIC,
                       "cpu fabric: sizing %s to %zu bytes failed: %s", name, bytes, strerror(e));
        goto fail_unlink;
    }
    /* Reserve the pages now: a sparse object that outgrows /dev/shm would kill the process
     * with SIGBUS on first touch instead of failing here.  Filesystems without fallocate
     * keep the sparse object. */
    const int fa = posix_fallocate(fd, 0, (off_t)bytes);
    if (fa != 0 && is_space_error(fa)) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY,
                       "cpu fabric: cannot reserve %zu bytes (%.1f MiB) of shared memory for %s: "
                       "%s",
                       bytes, (double)bytes / 1048576.0, name, strerror(fa));
        goto fail_unlink;
    }
    TIDE_CHECK_GOTO(map_fd(fd, name, bytes, addr_out), res, fail_unlink);
    close(fd);
    return TIDE_SUCCESS;

fail_unlink:
    shm_unlink(name);
    close(fd);
    return res;
}

tide_result_t tide_cpu_shm_open(const char *name, size_t bytes, uint64_t deadline_ns,
                                void **addr_out) {
    unsigned idle = 0;
    int fd;
    for (;;) {
        fd = shm_open(name, O_RDWR, 0600);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= bytes) break;
            close(fd);
        } else if (errno != ENOENT) {
            return TIDE_ERR(TIDE_ERR_FABRIC, "cpu fabric: shm_open(%s) failed: %s", name,
                            strerror(errno));
        }
        if (tide_cpu_now_ns() > deadline_ns)
            return TIDE_ERR(TIDE_ERR_TIMEOUT,
                            "cpu fabric: %s did not appear with %zu bytes within TIDE_TIMEOUT_MS "
                            "= %lld ms",
                            name, bytes, (long long)tide_fabric_timeout_ms());
        tide_cpu_backoff(&idle);
    }
    tide_result_t res = map_fd(fd, name, bytes, addr_out);
    close(fd);
    return res;
}

void tide_cpu_shm_unlink(const char *name) {
    shm_unlink(name);
}

tide_result_t tide_cpu_map_new(void *addr, size_t bytes, tide_cpu_map_t **map_out) {
    tide_cpu_map_t *m = malloc(sizeof(*m));
    if (m == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cpu fabric: out of host memory");
    m->addr = addr;
    m->bytes = bytes;
    m->direct = NULL;
    atomic_init(&m->refs, 1);
    *map_out = m;
    return TIDE_SUCCESS;
}

void tide_cpu_map_release(tide_cpu_map_t *map) {
    if (map == NULL) return;
    if (atomic_fetch_sub_explicit(&map->refs, 1, memory_order_acq_rel) != 1) return;
    munmap(map->addr, map->bytes);
    tide_cpu_direct_group_free(map->direct);
    free(map);
}

/* ------------------------------------------------------------------ barrier */

tide_result_t tide_cpu_barrier(tide_cpu_world_t *w, const char *what) {
    const int n = w->base.ranks;
    if (w->broken)
        return TIDE_ERR(TIDE_ERR_FABRIC,
                        "rank %d: %s: an earlier handshake of this communicator missed its "
                        "deadline, so the ranks no longer agree on it; destroy the communicator",
                        w->base.rank, what);
    /* Arrivals are cumulative: barrier k completes at k N, so no reset (and no reset race)
     * is ever needed. */
    tide_cpu_note_caller(w);
    const uint64_t k = ++w->barriers;
    const uint64_t target = k * (uint64_t)n;
    tide_cpu_counter_t *ctr = &w->shared->ctl->barrier;
    atomic_fetch_add_explicit(ctr, 1, memory_order_acq_rel);
    const uint64_t deadline = tide_cpu_deadline_ns();
    unsigned idle = 0;
    uint64_t v;
    while ((v = atomic_load_explicit(ctr, memory_order_acquire)) < target) {
        if (tide_cpu_now_ns() > deadline) {
            w->broken = true;
            char hint[256];
            return TIDE_ERR(TIDE_ERR_TIMEOUT,
                            "rank %d: %s: only %llu of %d ranks arrived within TIDE_TIMEOUT_MS "
                            "= %lld ms; %s",
                            w->base.rank, what, (unsigned long long)(v - (k - 1) * (uint64_t)n), n,
                            (long long)tide_fabric_timeout_ms(),
                            tide_cpu_timeout_hint(w, hint, sizeof(hint)));
        }
        tide_cpu_backoff(&idle);
    }
    return TIDE_SUCCESS;
}
