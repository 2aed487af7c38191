/*
 * mp_export.c - caller allocations exported to the peers and opened from them, and the
 * per-call exchange that tells every rank where every rank's operands are (mp_export.h).
 *
 * Exports.  A gradient or output outside this rank's arena is looked up by its allocation
 * (cuPointerGetAttributes: start, size, buffer id).  The first time an allocation is seen,
 * its IPC handle is made (cudaIpcGetMemHandle of the base) and given a serial number; the
 * handle travels to the peers once.  torch's caching allocator hands out the same base again
 * after a segment was freed and another allocated: the buffer id (unique per allocation in a
 * process) or the size then differ, and the allocation is exported anew under a new serial.
 *
 * Imports.  A peer opens each (rank, serial) once and keeps the mapping for the world's life.
 * A new import whose range meets an older one of the same owner replaces it (the owner's
 * allocation there is gone); the old mapping is closed only once this process's queues are
 * idle, since a sum of an earlier call may still read through it.
 *
 * The exchange, per RS call of a program with direct mode (all over the world's sockets,
 * tide_mp_boot_allgather, in the same order on every rank since every rank makes the same
 * calls): (1) a header per rank: whether its gradients / output are addressable, and whether
 * its addresses equal those of the last exchange (then nothing more is sent: the steady
 * state costs one small all-gather); (2) if some rank is addressable everywhere and changed,
 * its message (new handles, then its P + 1 addresses) in chunks of TIDE_MP_BOOT_MAX_BLOB;
 * (3) after opening what is new, whether each rank resolved every peer.  Every rank computes
 * the decision from the same all-gathered words, so all take the same path.
 */
#include "core/checks.h"
#include "fabric/cuda/mp_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR_MAGIC 0x54445831u
enum { HDR_SUMS = 1, HDR_OUTS = 2, HDR_SAME = 4 };

typedef struct {
    uint32_t magic, flags, count, pad;
    uint64_t bytes; /* of the message that follows (0 when HDR_SAME or not addressable) */
} hdr_t;

typedef struct {
    uint32_t serial, pad;
    uint64_t base, size;
    cudaIpcMemHandle_t handle;
} handle_rec_t;

typedef struct {
    uint64_t base, size;
    unsigned long long buffer_id;
    uint32_t serial;
    bool sent;
    cudaIpcMemHandle_t handle;
} export_t;

typedef struct {
    int rank;
    uint32_t serial;
    uint64_t base, size;
    void *mapped;
} import_t;

struct tide_mp_direct_world {
    export_t *ex;
    int n_ex, cap_ex;
    uint32_t next_serial;
    import_t *im;
    int n_im, cap_im;
    void **retired;
    int n_ret, cap_ret;
};

static bool grow(void **v, int *cap, int need, size_t item) {
    if (need <= *cap) return true;
    const int c = *cap == 0 ? 16 : 2 * *cap > need ? 2 * *cap : need;
    void *n = realloc(*v, (size_t)c * item);
    if (n == NULL) return false;
    *v = n;
    *cap = c;
    return true;
}

static bool queues_idle(const tide_mp_world_t *w) {
    for (int q = 0; q < TIDE_CUDA_Q; ++q)
        if (cudaStreamQuery(w->stream[q]) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
    return true;
}

static void close_retired(struct tide_mp_direct_world *dw) {
    for (int i = 0; i < dw->n_ret; ++i)
        cudaIpcCloseMemHandle(dw->retired[i]);
    dw->n_ret = 0;
    (void)cudaGetLastError();
}

void tide_cuda_mp_direct_world_free(tide_mp_world_t *w) {
    struct tide_mp_direct_world *dw = w->dworld;
    if (dw == NULL) return;
    /* World release follows every arena's deregistration, which ended every call. */
    close_retired(dw);
    for (int i = 0; i < dw->n_im; ++i)
        cudaIpcCloseMemHandle(dw->im[i].mapped);
    (void)cudaGetLastError();
    free(dw->ex);
    free(dw->im);
    free(dw->retired);
    free(dw);
    w->dworld = NULL;
}

void tide_cuda_mp_exchange_free(struct tide_mp_direct_call *c) {
    if (c == NULL) return;
    free(c->grads), free(c->outs_at), free(c->mine), free(c->sent), free(c->theirs);
    free(c->tx), free(c->rx), free(c->rx_len);
    free(c);
}

/* ------------------------------------------------------------------ this rank's addresses */

/* The export of the allocation holding [ptr, ptr + bytes), made if new; NULL when it cannot
 * be exported (not device memory of this device, managed, VMM, or past the allocation). */
static export_t *export_of(tide_mp_world_t *w, const void *ptr, uint64_t bytes) {
    struct tide_mp_direct_world *dw = w->dworld;
    CUdeviceptr start = 0;
    size_t size = 0;
    unsigned long long id = 0;
    unsigned int type = 0;
    int ordinal = -1, managed = 0;
    CUpointer_attribute at[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                CU_POINTER_ATTRIBUTE_IS_MANAGED};
    void *data[] = {&start, &size, &id, &type, &ordinal, &managed};
    if (cuPointerGetAttributes(6, at, data, (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE || ordinal != w->device || managed != 0 || start == 0 ||
        (uintptr_t)ptr < (uintptr_t)start || (uintptr_t)ptr - (uintptr_t)start > size ||
        bytes > size - ((uintptr_t)ptr - (uintptr_t)start))
        return NULL;
    for (int i = 0; i < dw->n_ex; ++i)
        if (dw->ex[i].base == (uint64_t)start && dw->ex[i].size == size &&
            dw->ex[i].buffer_id == id)
            return &dw->ex[i];
    cudaIpcMemHandle_t h;
    if (cudaIpcGetMemHandle(&h, (void *)(uintptr_t)start) != cudaSuccess) {
        (void)cudaGetLastError(); /* e.g. a VMM allocation: not an error, the pushed path */
        return NULL;
    }
    /* Entries whose range this allocation meets are gone (the allocator reused the range). */
    int k = 0;
    for (int i = 0; i < dw->n_ex; ++i)
        if (!(dw->ex[i].base < (uint64_t)start + size && (uint64_t)start < dw->ex[i].base + dw->ex[i].size))
            dw->ex[k++] = dw->ex[i];
    dw->n_ex = k;
    if (!grow((void **)&dw->ex, &dw->cap_ex, dw->n_ex + 1, sizeof(*dw->ex))) return NULL;
    export_t *e = &dw->ex[dw->n_ex++];
    *e = (export_t){(uint64_t)start, size, id, ++dw->next_serial, false, h};
    return e;
}

/* This rank's P gradients and its output as addresses the peers can resolve; *sums / *outs:
 * all of the gradients / the output are addressable.  New handles go first into the message. */
static tide_result_t describe(tide_mp_arena_t *a, struct tide_mp_direct_call *c,
                              const tide_binding_t *b, bool *sums, bool *outs) {
    const tide_geom_t *g = &b->plan->geom;
    const int me = a->w->base.rank, np = c->params;
    const uintptr_t own = (uintptr_t)a->base.bases[me];
    *sums = *outs = true;
    c->tx_len = 0;
    for (int i = 0; i <= np; ++i) {
        const void *ptr = i < np ? b->grads[i] : (const void *)b->out;
        const uint64_t bytes =
            i < np ? g->params[i].dim0 * g->params[i].inner * g->grad_item : g->fp32_shard_bytes;
        tide_mp_addr_t *d = &c->mine[i];
        *d = (tide_mp_addr_t){TIDE_MP_ADDR_NONE, 0, 0};
        const uintptr_t p = (uintptr_t)ptr;
        if (p >= own && p - own <= a->alloc_bytes && bytes <= a->alloc_bytes - (p - own)) {
            *d = (tide_mp_addr_t){TIDE_MP_ADDR_ARENA, 0, (uint64_t)(p - own)};
            continue;
        }
        export_t *e = export_of(a->w, ptr, bytes);
        if (e == NULL) {
            *(i < np ? sums : outs) = false;
            continue;
        }
        *d = (tide_mp_addr_t){TIDE_MP_ADDR_IPC, e->serial, (uint64_t)(p - (uintptr_t)e->base)};
        if (e->sent) continue;
        if (c->tx_len + sizeof(handle_rec_t) > c->tx_cap) {
            const size_t cap = 2 * c->tx_cap + sizeof(handle_rec_t) * 16;
            uint8_t *n = realloc(c->tx, cap);
            if (n == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: export message");
            c->tx = n;
            c->tx_cap = cap;
        }
        /* Two operands in one new allocation: one record. */
        bool dup = false;
        for (size_t o = 0; o < c->tx_len; o += sizeof(handle_rec_t))
            dup = dup || ((const handle_rec_t *)(c->tx + o))->serial == e->serial;
        if (dup) continue;
        handle_rec_t rec = {e->serial, 0, e->base, e->size, e->handle};
        memcpy(c->tx + c->tx_len, &rec, sizeof(rec));
        c->tx_len += sizeof(rec);
    }
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ the peers' addresses */

static import_t *import_find(struct tide_mp_direct_world *dw, int rank, uint32_t serial) {
    for (int i = 0; i < dw->n_im; ++i)
        if (dw->im[i].rank == rank && dw->im[i].serial == serial) return &dw->im[i];
    return NULL;
}

/* Open rank r's new handles; false when one cannot be opened here. */
static bool import_handles(tide_mp_world_t *w, int r, const handle_rec_t *recs, size_t count) {
    struct tide_mp_direct_world *dw = w->dworld;
    bool ok = true;
    for (size_t i = 0; i < count; ++i) {
        handle_rec_t h;
        memcpy(&h, &recs[i], sizeof(h));
        if (import_find(dw, r, h.serial) != NULL) continue;
        void *p = NULL;
        if (cudaIpcOpenMemHandle(&p, h.handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
            (void)cudaGetLastError();
            ok = false;
            continue;
        }
        int k = 0;
        for (int j = 0; j < dw->n_im; ++j) {
            const import_t *o = &dw->im[j];
            if (o->rank == r && o->base < h.base + h.size && h.base < o->base + o->size) {
                if (!grow((void **)&dw->retired, &dw->cap_ret, dw->n_ret + 1,
                          sizeof(*dw->retired)))
                    continue; /* kept open until the world ends */
                dw->retired[dw->n_ret++] = o->mapped;
                continue;
            }
            dw->im[k++] = *o;
        }
        dw->n_im = k;
        if (!grow((void **)&dw->im, &dw->cap_im, dw->n_im + 1, sizeof(*dw->im))) {
            cudaIpcCloseMemHandle(p);
            ok = false;
            continue;
        }
        dw->im[dw->n_im++] = (import_t){r, h.serial, h.base, h.size, p};
    }
    return ok;
}

/* Rank r's operand `d` as addressed here, or NULL. */
static void *resolve(tide_mp_arena_t *a, int r, const tide_mp_addr_t *d) {
    if (d->kind == TIDE_MP_ADDR_ARENA) return a->base.bases[r] + d->offset;
    if (d->kind != TIDE_MP_ADDR_IPC) return NULL;
    const import_t *im = import_find(a->w->dworld, r, d->serial);
    return im != NULL ? (uint8_t *)im->mapped + d->offset : NULL;
}

/* ------------------------------------------------------------------ the exchange */

static void mark_sent(struct tide_mp_direct_world *dw, const struct tide_mp_direct_call *c,
                      uint32_t count) {
    for (uint32_t k = 0; k < count; ++k) {
        handle_rec_t rec;
        memcpy(&rec, c->tx + (size_t)k * sizeof(rec), sizeof(rec));
        for (int i = 0; i < dw->n_ex; ++i)
            if (dw->ex[i].serial == rec.serial) dw->ex[i].sent = true;
    }
}

static tide_result_t setup(tide_mp_arena_t *a, tide_mp_family_t *fam, int np) {
    const int n = a->w->base.ranks;
    if (a->w->dworld == NULL) {
        a->w->dworld = calloc(1, sizeof(*a->w->dworld));
        if (a->w->dworld == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: exports");
    }
    if (fam->dcall != NULL) return TIDE_SUCCESS;
    struct tide_mp_direct_call *c = calloc(1, sizeof(*c));
    if (c == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: exchange");
    c->ranks = n;
    c->params = np;
    c->logged = -1;
    c->grads = calloc((size_t)n * (size_t)(np + 1), sizeof(*c->grads));
    c->outs_at = calloc((size_t)n, sizeof(*c->outs_at));
    c->mine = calloc((size_t)np + 1, sizeof(*c->mine));
    c->sent = calloc((size_t)np + 1, sizeof(*c->sent));
    c->theirs = calloc((size_t)n * (size_t)(np + 1), sizeof(*c->theirs));
    c->rx_len = calloc((size_t)n, sizeof(*c->rx_len));
    if (c->grads == NULL || c->outs_at == NULL || c->mine == NULL || c->sent == NULL ||
        c->theirs == NULL || c->rx_len == NULL) {
        tide_cuda_mp_exchange_free(c);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: exchange of %d ranks", n);
    }
    fam->dcall = c;
    return TIDE_SUCCESS;
}

/* An all-gather of `bytes` per rank over the sockets; a failure fails the group. */
static tide_result_t gather(tide_mp_arena_t *a, const void *blob, size_t bytes, void *out,
                            const char *what) {
    const tide_result_t res =
        tide_mp_boot_allgather(&a->w->boot, blob, bytes, -1, out, NULL, tide_fabric_timeout_ms());
    if (res == TIDE_SUCCESS) return res;
    char msg[TIDE_MP_CTL_MSG];
    snprintf(msg, sizeof(msg), "rank %d: direct mode's %s exchange failed: %s", a->w->base.rank,
             what, tide_get_last_error());
    return tide_cuda_mp_fail_stop_msg(a, msg);
}

/* Step (2): every changed rank's message, in chunks, into c->rx. */
static tide_result_t gather_messages(tide_mp_arena_t *a, struct tide_mp_direct_call *c,
                                     const hdr_t *h) {
    const int n = c->ranks;
    const size_t chunk = TIDE_MP_BOOT_MAX_BLOB;
    size_t most = 0;
    for (int r = 0; r < n; ++r)
        if (h[r].bytes > most) most = h[r].bytes;
    const size_t rounds = (most + chunk - 1) / chunk, cap = rounds * chunk;
    if (cap > c->rx_cap) {
        uint8_t *rx = realloc(c->rx, (size_t)n * cap);
        if (rx == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: %zu bytes", cap);
        c->rx = rx;
        c->rx_cap = cap;
    }
    uint8_t *piece = malloc(chunk), *all = malloc((size_t)n * chunk);
    tide_result_t res = TIDE_SUCCESS;
    if (piece == NULL || all == NULL) res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: chunk");
    for (size_t k = 0; k < rounds && res == TIDE_SUCCESS; ++k) {
        memset(piece, 0, chunk);
        if (k * chunk < c->tx_len)
            memcpy(piece, c->tx + k * chunk,
                   c->tx_len - k * chunk < chunk ? c->tx_len - k * chunk : chunk);
        res = gather(a, piece, chunk, all, "address");
        for (int r = 0; r < n && res == TIDE_SUCCESS; ++r)
            memcpy(c->rx + (size_t)r * c->rx_cap + k * chunk, all + (size_t)r * chunk, chunk);
    }
    free(piece);
    free(all);
    return res;
}

/* Resolve every rank's operands from the exchanged addresses (this rank's own pointers are
 * the call's); false when some peer's operand cannot be addressed here. */
static bool resolve_all(tide_mp_arena_t *a, struct tide_mp_direct_call *c, const hdr_t *h,
                        const tide_binding_t *b, bool outs) {
    const int n = c->ranks, np = c->params, me = a->w->base.rank;
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        tide_mp_addr_t *t = &c->theirs[(size_t)r * (size_t)(np + 1)];
        if (r != me && !(h[r].flags & HDR_SAME)) {
            const uint8_t *m = c->rx + (size_t)r * c->rx_cap;
            const size_t addr_bytes = (size_t)(np + 1) * sizeof(tide_mp_addr_t);
            if (h[r].bytes < addr_bytes || h[r].count * sizeof(handle_rec_t) + addr_bytes != h[r].bytes)
                return false;
            ok = import_handles(a->w, r, (const handle_rec_t *)m, h[r].count) && ok;
            memcpy(t, m + h[r].count * sizeof(handle_rec_t), addr_bytes);
        }
        for (int p = 0; p <= np; ++p) {
            void *at = r == me ? (p < np ? (void *)(uintptr_t)b->grads[p] : (void *)b->out)
                               : resolve(a, r, &t[p]);
            if (p == np && !outs) at = NULL;
            else if (at == NULL) ok = false;
            if (p < np)
                c->grads[(size_t)r * (size_t)np + (size_t)p] = at;
            else
                c->outs_at[r] = at;
        }
    }
    return ok;
}

tide_result_t tide_cuda_mp_exchange(tide_mp_arena_t *a, tide_mp_family_t *fam,
                                    const tide_binding_t *b) {
    const int np = b->plan->geom.num_params, n = a->w->base.ranks;
    TIDE_CHECK(setup(a, fam, np));
    struct tide_mp_direct_call *c = fam->dcall;
    if (c->params != np) return TIDE_ERR(TIDE_ERR_INTERNAL, "cuda mp fabric: P changed");
    if (a->w->dworld->n_ret > 0 && queues_idle(a->w)) close_retired(a->w->dworld);
    bool sums, outs;
    TIDE_CHECK(describe(a, c, b, &sums, &outs));
    const size_t addr_bytes = (size_t)(np + 1) * sizeof(tide_mp_addr_t);
    const bool same = c->sent_valid && c->tx_len == 0 && memcmp(c->mine, c->sent, addr_bytes) == 0;
    /* The message: new handles first, then the addresses. */
    if (sums && !same) {
        if (c->tx_len + addr_bytes > c->tx_cap) {
            uint8_t *t = realloc(c->tx, c->tx_len + addr_bytes);
            if (t == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: message");
            c->tx = t;
            c->tx_cap = c->tx_len + addr_bytes;
        }
        memcpy(c->tx + c->tx_len, c->mine, addr_bytes);
    }
    const uint32_t count = (uint32_t)(c->tx_len / sizeof(handle_rec_t));
    if (sums && !same) c->tx_len += addr_bytes;
    else c->tx_len = 0;
    hdr_t mine = {HDR_MAGIC, (sums ? HDR_SUMS : 0u) | (outs ? HDR_OUTS : 0u) | (same ? HDR_SAME : 0u),
                  sums && !same ? count : 0, 0, c->tx_len};
    hdr_t *h = malloc((size_t)n * sizeof(*h));
    if (h == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: headers");
    tide_result_t res = gather(a, &mine, sizeof(mine), h, "header");
    bool all_sums = res == TIDE_SUCCESS, all_outs = true, all_same = true;
    c->blocker = -1;
    for (int r = 0; r < n && res == TIDE_SUCCESS; ++r) {
        if (h[r].magic != HDR_MAGIC) {
            res = TIDE_ERR(TIDE_ERR_INTERNAL, "cuda mp fabric: rank %d sent no exchange header", r);
            break;
        }
        all_sums = all_sums && (h[r].flags & HDR_SUMS);
        all_outs = all_outs && (h[r].flags & HDR_OUTS);
        all_same = all_same && (h[r].flags & HDR_SAME);
    }
    for (int r = 0; r < n && res == TIDE_SUCCESS && c->blocker < 0; ++r)
        if (!(h[r].flags & (all_sums ? HDR_OUTS : HDR_SUMS))) c->blocker = r;
    bool ok = false;
    if (res == TIDE_SUCCESS && all_sums) {
        /* Every rank's "same" refers to the last exchange every rank completed: theirs_valid. */
        if (all_same && c->theirs_valid) {
            /* Nothing new: every import the last exchange resolved is still open (a mapping is
             * retired only for a new allocation of its owner, whose addresses then changed).
             * Without a vote a failure here could split the ranks: fail the group instead. */
            ok = resolve_all(a, c, h, b, all_outs);
            if (!ok) {
                char msg[TIDE_MP_CTL_MSG];
                snprintf(msg, sizeof(msg),
                         "rank %d: direct mode: a peer's operand mapped at the last call is "
                         "gone",
                         a->w->base.rank);
                res = tide_cuda_mp_fail_stop_msg(a, msg);
            }
        } else {
            res = gather_messages(a, c, h);
            if (res == TIDE_SUCCESS) {
                const uint32_t resolved = resolve_all(a, c, h, b, all_outs) ? 1u : 0u;
                uint32_t *votes = malloc((size_t)n * sizeof(*votes));
                if (votes == NULL) res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: votes");
                if (res == TIDE_SUCCESS) res = gather(a, &resolved, sizeof(resolved), votes, "vote");
                ok = res == TIDE_SUCCESS;
                for (int r = 0; r < n && ok; ++r)
                    ok = votes[r] == 1u;
                free(votes);
            }
            /* This rank's new handles went out: peers that opened them keep them (a failed
             * open is not retried; that allocation then stays on the pushed path). */
            if (res == TIDE_SUCCESS) mark_sent(a->w->dworld, c, mine.count);
        }
    }
    free(h);
    if (res != TIDE_SUCCESS) return res;
    /* The state every rank agrees on: direct with these addresses, or none. */
    c->sums = ok;
    c->outs = ok && all_outs;
    c->sent_valid = c->theirs_valid = ok;
    if (ok) memcpy(c->sent, c->mine, addr_bytes);
    return TIDE_SUCCESS;
}
