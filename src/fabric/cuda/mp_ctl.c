/*
 * mp_ctl.c - the shared control block of a one-process-per-rank group (mp_ctl.h says why it
 * lives in host memory and how the abort word is ordered against the device poison).
 */
#include "fabric/cuda/mp_ctl.h"

#include "core/checks.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CTL_MAGIC 0x7469646cu /* "tidl" */

/* The counters follow the header: 8-byte atomics. */
_Static_assert(sizeof(tide_mp_ctl_hdr_t) % 8 == 0, "control block header size");

static size_t counter_bytes(int ranks) {
    /* entered, enqueued, began: 2 ranks each; check_seq, check_sig: 4 ranks each */
    return sizeof(tide_mp_ctl_hdr_t) + 14u * (size_t)ranks * sizeof(uint64_t);
}

/* The flag areas start on a page of their own: the device maps the block, and a page that
 * only the host writes (counters, abort word) stays apart from the ones the device writes. */
static size_t flags_offset(int ranks) {
    return (counter_bytes(ranks) + 4095u) / 4096u * 4096u;
}

static size_t ctl_bytes(int ranks, size_t flag_bytes, bool abort_polled) {
    /* With flags or a polled abort word, whole pages: the CUDA fabric registers the mapping
     * with the device. */
    if (flag_bytes == 0) return abort_polled ? flags_offset(ranks) : counter_bytes(ranks);
    return (flags_offset(ranks) + (size_t)ranks * flag_bytes + 4095u) / 4096u * 4096u;
}

/* Map the block behind fd.  rank 0 (init) sized it with its flag_bytes and abort_polled; the
 * others learn the size from the descriptor and check it against the header. */
static tide_result_t ctl_map(int fd, int rank, int ranks, bool init, size_t flag_bytes,
                             bool abort_polled, tide_mp_ctl_t *out) {
    size_t bytes = ctl_bytes(ranks, flag_bytes, abort_polled);
    if (!init) {
        struct stat st;
        if (fstat(fd, &st) != 0)
            return TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp control block: fstat: %s",
                            strerror(errno));
        bytes = (size_t)st.st_size;
        if (bytes < counter_bytes(ranks))
            return TIDE_ERR(TIDE_ERR_INTERNAL,
                            "cuda mp control block: rank 0's block has %zu bytes, %d ranks need "
                            "%zu",
                            bytes, ranks, counter_bytes(ranks));
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp control block: mmap of %zu bytes: %s", bytes,
                        strerror(errno));
    tide_mp_ctl_hdr_t *h = p;
    if (init) {
        /* A fresh memfd reads as zeros: counters 0, no abort, every flag 0. */
        h->ranks = ranks;
        h->flag_bytes = (uint32_t)flag_bytes;
        h->abort_polled = abort_polled ? 1u : 0u;
        atomic_store(&h->abort, 0u);
        h->magic = CTL_MAGIC;
    } else if (h->magic != CTL_MAGIC || h->ranks != ranks ||
               bytes != ctl_bytes(ranks, h->flag_bytes, h->abort_polled != 0)) {
        const int theirs = h->ranks;
        munmap(p, bytes);
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cuda mp control block: rank 0's block is for %d ranks (%zu bytes), this "
                        "rank has %d",
                        theirs, bytes, ranks);
    }
    out->hdr = h;
    out->entered = (_Atomic uint64_t *)(void *)((uint8_t *)p + sizeof(*h));
    out->enqueued = out->entered + 2 * ranks;
    out->check_seq = out->enqueued + 2 * ranks;
    out->check_sig = out->check_seq + 4 * ranks;
    out->began = out->check_sig + 4 * ranks;
    out->flag_bytes = h->flag_bytes;
    out->abort_polled = h->abort_polled != 0;
    out->flags = h->flag_bytes > 0 ? (uint8_t *)p + flags_offset(ranks) : NULL;
    out->bytes = bytes;
    out->rank = rank;
    out->ranks = ranks;
    return TIDE_SUCCESS;
}

tide_result_t tide_mp_ctl_open(tide_mp_boot_t *boot, int64_t timeout_ms, tide_mp_ctl_t *out) {
    return tide_mp_ctl_open_flags(boot, timeout_ms, 0, out);
}

tide_result_t tide_mp_ctl_open_flags(tide_mp_boot_t *boot, int64_t timeout_ms, size_t flag_bytes,
                                     tide_mp_ctl_t *out) {
    return tide_mp_ctl_open_mapped(boot, timeout_ms, flag_bytes, false, out);
}

tide_result_t tide_mp_ctl_open_mapped(tide_mp_boot_t *boot, int64_t timeout_ms, size_t flag_bytes,
                                      bool abort_polled, tide_mp_ctl_t *out) {
    const int me = boot->rank, n = boot->ranks;
    flag_bytes = (flag_bytes + 63u) / 64u * 64u;
    if (flag_bytes > UINT32_MAX) flag_bytes = 0; /* never: TIDE_MP_FLAG_BYTES is under 1 MiB */
    memset(out, 0, sizeof(*out));
    int fd = -1;
    tide_result_t own = TIDE_SUCCESS;
    if (me == 0) {
        fd = memfd_create("tide-mp-ctl", MFD_CLOEXEC);
        if (fd < 0)
            own = TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp control block: memfd_create: %s",
                           strerror(errno));
        else if (ftruncate(fd, (off_t)ctl_bytes(n, flag_bytes, abort_polled)) != 0)
            own = TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp control block: ftruncate: %s",
                           strerror(errno));
        if (own == TIDE_SUCCESS) own = ctl_map(fd, me, n, true, flag_bytes, abort_polled, out);
    }
    /* Every rank says whether it is fine; rank 0's descriptor travels with its word.  (Out of
     * host memory here, the peers wait until their deadline.) */
    int32_t ok = own == TIDE_SUCCESS;
    int32_t *oks = calloc((size_t)n, sizeof(*oks));
    int *fds = calloc((size_t)n, sizeof(*fds));
    tide_result_t res = TIDE_SUCCESS;
    if (oks == NULL || fds == NULL) {
        if (fd >= 0) close(fd);
        free(oks);
        free(fds);
        tide_mp_ctl_close(out);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp control block: %d ranks", n);
    }
    const tide_result_t ex =
        tide_mp_boot_allgather(boot, &ok, sizeof(ok), me == 0 ? fd : -1, oks, fds, timeout_ms);
    if (fd >= 0) close(fd);
    res = own != TIDE_SUCCESS ? own : ex;
    for (int r = 0; r < n && res == TIDE_SUCCESS; ++r)
        if (!oks[r])
            res = TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp control block: rank %d could not set it up",
                           r);
    if (res == TIDE_SUCCESS && me != 0) {
        if (fds[0] < 0)
            res = TIDE_ERR(TIDE_ERR_INTERNAL, "cuda mp control block: rank 0 sent no descriptor");
        else
            res = ctl_map(fds[0], me, n, false, 0, false, out);
    }
    /* The mapping keeps the memory; no descriptor stays open. */
    for (int r = 0; r < n; ++r)
        if (fds[r] >= 0) close(fds[r]);
    free(fds);
    free(oks);
    if (res != TIDE_SUCCESS) tide_mp_ctl_close(out);
    return res;
}

void tide_mp_ctl_close(tide_mp_ctl_t *c) {
    if (c->hdr != NULL) munmap(c->hdr, c->bytes);
    memset(c, 0, sizeof(*c));
}

bool tide_mp_ctl_device_mapped(const tide_mp_ctl_t *c) {
    return c->hdr != NULL && (c->flags != NULL || c->abort_polled);
}

uint8_t *tide_mp_ctl_flags(const tide_mp_ctl_t *c, int r) {
    if (c->flags == NULL || r < 0 || r >= c->ranks) return NULL;
    return c->flags + (size_t)r * c->flag_bytes;
}

void tide_mp_ctl_poison(tide_mp_ctl_t *c, uint64_t value) {
    if (c->flags == NULL) return;
    /* Whole 8-byte stores: a device wait never sees half a poison (the flags are 8-byte
     * aligned: the area is page aligned, flag_bytes a multiple of 64). */
    _Atomic uint64_t *f = (_Atomic uint64_t *)(void *)c->flags;
    const size_t count = (size_t)c->ranks * c->flag_bytes / 8u;
    for (size_t i = 0; i < count; ++i)
        atomic_store_explicit(&f[i], value, memory_order_relaxed);
    /* After the abort word (published before this is called) and before what follows. */
    atomic_thread_fence(memory_order_seq_cst);
}

void tide_mp_ctl_enter(tide_mp_ctl_t *c, int f, uint64_t call) {
    if (c->hdr == NULL) return; /* no control block (mp_ctl.h) */
    atomic_store_explicit(&c->entered[f * c->ranks + c->rank], call + 1, memory_order_release);
}

void tide_mp_ctl_enqueued(tide_mp_ctl_t *c, int f, uint64_t call) {
    if (c->hdr == NULL) return;
    atomic_store_explicit(&c->enqueued[f * c->ranks + c->rank], call + 1, memory_order_release);
}

void tide_mp_ctl_began(tide_mp_ctl_t *c, int f, uint64_t call) {
    if (c->hdr == NULL) return;
    atomic_store_explicit(&c->began[f * c->ranks + c->rank], call + 1, memory_order_release);
}

bool tide_mp_ctl_abort(tide_mp_ctl_t *c, const char *msg) {
    if (c->hdr == NULL) return true; /* nobody else to tell: this rank's message stands */
    uint32_t expect = 0;
    if (!atomic_compare_exchange_strong(&c->hdr->abort, &expect, TIDE_MP_CTL_CLAIMED))
        return false;
    snprintf(c->hdr->msg, sizeof(c->hdr->msg), "%s", msg);
    /* seq_cst store: the message and the word before anything this process does next (the
     * poison writes are submitted afterwards). */
    atomic_store(&c->hdr->abort, (uint32_t)c->rank + 1u);
    return true;
}

int tide_mp_ctl_aborted(tide_mp_ctl_t *c, char *msg, size_t len) {
    if (c->hdr == NULL) return -1;
    uint32_t v = atomic_load(&c->hdr->abort);
    /* A claim is followed by the message within microseconds; wait for it a little. */
    for (int spin = 0; v == TIDE_MP_CTL_CLAIMED && spin < 1000; ++spin) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        v = atomic_load(&c->hdr->abort);
    }
    if (v == 0) return -1;
    if (v == TIDE_MP_CTL_CLAIMED) {
        if (msg != NULL && len > 0) snprintf(msg, len, "a rank failed the group (no message)");
        return c->ranks; /* aborted, by a rank that stopped while writing its message */
    }
    if (msg != NULL && len > 0) snprintf(msg, len, "%s", c->hdr->msg);
    return (int)v - 1;
}

static size_t check_index(const tide_mp_ctl_t *c, int f, uint64_t seq, int r) {
    return ((size_t)f * 2u + (size_t)(seq & 1u)) * (size_t)c->ranks + (size_t)r;
}

void tide_mp_ctl_post(tide_mp_ctl_t *c, int f, uint64_t seq, uint64_t sig) {
    if (c->hdr == NULL) return;
    const size_t i = check_index(c, f, seq, c->rank);
    atomic_store_explicit(&c->check_sig[i], sig, memory_order_relaxed);
    /* Release: a rank that reads 1 + seq reads this signature. */
    atomic_store_explicit(&c->check_seq[i], seq + 1, memory_order_release);
}

int tide_mp_ctl_compare(tide_mp_ctl_t *c, int f, uint64_t seq, uint64_t sig, int *other_out,
                        uint64_t *other_sig_out) {
    *other_out = -1;
    *other_sig_out = 0;
    if (c->hdr == NULL) return 1;
    int differs = -1;
    uint64_t differs_sig = 0;
    for (int r = 0; r < c->ranks; ++r) {
        const size_t i = check_index(c, f, seq, r);
        const uint64_t posted = atomic_load_explicit(&c->check_seq[i], memory_order_acquire);
        if (posted < seq + 1) {
            *other_out = r;
            return 0;
        }
        if (posted > seq + 1) continue; /* it gave up on this check */
        const uint64_t s = atomic_load_explicit(&c->check_sig[i], memory_order_relaxed);
        if (s != sig && differs < 0) {
            differs = r;
            differs_sig = s;
        }
    }
    *other_out = differs;
    *other_sig_out = differs_sig;
    return 1;
}

static size_t list_ranks(const tide_mp_ctl_t *c, const _Atomic uint64_t *v, int f, uint64_t call,
                         char *out, size_t len, int *first) {
    size_t used = 0;
    *first = -1;
    for (int r = 0; r < c->ranks; ++r) {
        const uint64_t x = atomic_load_explicit(&v[f * c->ranks + r], memory_order_acquire);
        if (x > call) continue;
        if (*first < 0) *first = r;
        if (used + 40 < len)
            used += (size_t)snprintf(out + used, len - used, "%s%d (last: %lld)",
                                     used ? ", " : "", r, (long long)x - 1);
    }
    return used;
}

int tide_mp_ctl_missing(tide_mp_ctl_t *c, int f, uint64_t call, char *out, size_t len) {
    char list[200];
    int first = -1;
    const char *coll = f == 0 ? "all-gather" : "reduce-scatter";
    if (c->hdr == NULL) {
        snprintf(out, len,
                 "%s call %llu did not complete (no control block: which rank is "
                 "missing is unknown)",
                 coll, (unsigned long long)call);
        return -1;
    }
    if (list_ranks(c, c->entered, f, call, list, sizeof(list), &first) > 0) {
        snprintf(out, len, "rank%s %s never entered %s call %llu", strchr(list, ',') ? "s" : "",
                 list, coll, (unsigned long long)call);
        return first;
    }
    if (list_ranks(c, c->enqueued, f, call, list, sizeof(list), &first) > 0) {
        snprintf(out, len, "rank%s %s entered %s call %llu but never finished enqueueing it",
                 strchr(list, ',') ? "s" : "", list, coll, (unsigned long long)call);
        return first;
    }
    /* Only the device writes began, and only into a block it maps. */
    if (tide_mp_ctl_device_mapped(c) && list_ranks(c, c->began, f, call, list, sizeof(list), &first) > 0) {
        const bool many = strchr(list, ',') != NULL;
        snprintf(out, len,
                 "rank%s %s enqueued %s call %llu but %s device never began it (work queued "
                 "before it on %s caller's stream did not finish)",
                 many ? "s" : "", list, coll, (unsigned long long)call, many ? "their" : "its",
                 many ? "their" : "its");
        return first;
    }
    snprintf(out, len, "every rank enqueued %s call %llu; its device work did not complete", coll,
             (unsigned long long)call);
    return -1;
}
