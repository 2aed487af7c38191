/*
 * arena.c - the NCCL fabric's arenas (fabric_nccl.h): every rank's arena and flag area in
 * one ncclMemAlloc allocation, registered as a window (ncclCommWindowRegister); peers through
 * its LSA pointers.
 *
 * Every step that can fail on one rank only is followed by a collective verdict
 * (tide_nccl_agree, over all N ranks), so that all ranks take the same path into the next
 * collective call (window registration and deregistration are collective) and none waits
 * for a rank that already gave up.
 *
 * Several nodes (M > 1, the rails): the window is registered on the node communicator, so
 * its LSA pointers reach the L ranks of this node only.  bases[] and flags[] hold those ranks
 * (TIDE rank node * L + LSA rank) and NULL for every other node; every loop here over ranks
 * skips the NULL ones (own_node below), and the execute reaches other nodes only through the
 * rail transport (its fences and poison cover this node: tide_cuda_mp_fenced).  With the
 * one-sided rails the same memory is also registered on the rail communicator.
 *
 * The control block (mp_ctl.h) stays closed: its memfd travels over the CUDA mp fabric's
 * socket bootstrap, which this fabric does not have.  Were it opened, it could only be per
 * node (host memory shared by processes of one host): tide_mp_ctl_open sizes its counters
 * for boot->ranks and indexes them by boot->rank, so a node's block would need ranks = L and
 * rank = local rank, and tide_mp_ctl_missing would then name local ranks, and an abort would
 * reach the ranks of that node only (docs/nccl-fabric.md, "Rails").
 */
#include "core/checks.h"
#include "fabric/nccl/fabric_nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The segment's size is a multiple of this on every rank (CUDA VMM granularity, >= the
 * 4096-byte NCCL_WIN_REQUIRED_ALIGNMENT). */
#define SEGMENT_UNIT (2u << 20)
/* Marker written through the own pointer and read through every LSA pointer. */
#define MARKER(rank) (0x7469646500000000ull | (uint64_t)(uint32_t)(rank))

typedef struct {
    uint64_t signature, bytes, seq, alloc_bytes; /* alloc_bytes 0: this rank failed */
} seg_info_t;

/* Whether rank r is on this rank's node: its segment is mapped here (LSA pointer). */
static bool own_node(const tide_nccl_world_t *w, int r) {
    return r / w->mp.base.gpus_per_node == w->mp.base.rank / w->mp.base.gpus_per_node;
}

static void arena_free(tide_nccl_arena_t *a) {
    for (int f = 0; f < 2; ++f)
        tide_cuda_mp_family_free(&a->mp.fam[f]);
    free(a->mp.views);
    free(a->mp.remote);
    free(a->mp.flags);
    free(a->mp.base.bases);
    free(a);
}

/* Window deregistrations (collective, the rail window first) and the memory; only on paths
 * every rank takes. */
static void segment_release(tide_nccl_world_t *w, tide_nccl_arena_t *a) {
    if (a->rail_registered) (void)w->lib->CommWindowDeregister(w->rail_comm, a->rail_win);
    a->rail_registered = false;
    if (a->registered) (void)w->lib->CommWindowDeregister(w->node_comm, a->win);
    a->registered = false;
    if (a->mem != NULL) (void)w->lib->MemFree(a->mem);
    a->mem = NULL;
}

/* After an exchange timed out.  On one node the aborted communicator was the node
 * communicator, and its windows went with it: only the memory is left to free.  On several
 * the node and rail communicators are alive and their windows registered, but a collective
 * deregistration could wait for a peer that is gone: window and memory stay until those
 * communicators are aborted at world destruction (leaked if NCCL does not release them). */
static void segment_release_aborted(tide_nccl_world_t *w, tide_nccl_arena_t *a) {
    if (w->node_comm != NULL) return;
    a->registered = false;
    a->rail_registered = false;
    segment_release(w, a);
}

/* Signature, size and registration count of every rank equal this rank's. */
static tide_result_t check_infos(const tide_nccl_world_t *w, const seg_info_t *all,
                                 const seg_info_t *mine) {
    /* Every rank compares the same table, so all reach the same verdict (the messages name
     * the first rank that differs from this one). */
    const int n = w->mp.base.ranks, me = w->mp.base.rank;
    for (int r = 0; r < n; ++r) {
        if (all[r].alloc_bytes == 0)
            return TIDE_ERR(TIDE_ERR_FABRIC,
                            "nccl fabric: rank %d could not allocate its arena "
                            "(ncclMemAlloc)",
                            r);
        if (all[r].signature != mine->signature || all[r].bytes != mine->bytes ||
            all[r].seq != mine->seq || all[r].alloc_bytes != mine->alloc_bytes)
            return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                            "nccl fabric: rank %d registered another group (signature %llx, "
                            "%llu bytes, registration %llu) than rank %d (%llx, %llu, %llu)",
                            r, (unsigned long long)all[r].signature,
                            (unsigned long long)all[r].bytes, (unsigned long long)all[r].seq, me,
                            (unsigned long long)mine->signature, (unsigned long long)mine->bytes,
                            (unsigned long long)mine->seq);
    }
    return TIDE_SUCCESS;
}

/* Without symmetric memory support on the communicator NCCL 2.28 still registers, but hands
 * back a host-side local registration handle as the window; the LSA kernel must never read
 * that.  A real window is a descriptor in device memory of this device. */
static tide_result_t check_window(tide_nccl_world_t *w, tide_nccl_arena_t *a) {
    struct cudaPointerAttributes attr;
    memset(&attr, 0, sizeof(attr));
    const cudaError_t e = cudaPointerGetAttributes(&attr, (const void *)a->win);
    (void)cudaGetLastError();
    if (e != cudaSuccess || attr.type != cudaMemoryTypeDevice || attr.device != w->mp.device)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "nccl fabric: rank %d: the window NCCL returned is not a device "
                        "descriptor of device %d (memory type %d): the node communicator has "
                        "no symmetric memory support (it needs P2P between all ranks of the "
                        "node, NCCL_WIN_ENABLE=1 and NCCL_CUMEM_ENABLE=1)",
                        w->mp.base.rank, w->mp.device, (int)attr.type);
    return TIDE_SUCCESS;
}

/* The bases of this node's ranks: LSA pointers of the window (LSA rank i = TIDE rank
 * node * L + i; the node communicator's LSA team is the node, world.c).  Other nodes' bases
 * stay NULL. */
static tide_result_t lsa_bases(tide_nccl_world_t *w, tide_nccl_arena_t *a) {
    const int n = w->mp.base.gpus_per_node;
    const int first = (w->mp.base.rank / n) * n;
    void **dev = (void **)(void *)w->scratch_dev, **host = (void **)(void *)w->scratch_host;
    TIDE_CUDA_CALL(tide_nccl_lsa_pointers(a->win, n, dev, w->mp.util),
                   "tide_nccl_lsa_pointers (ncclGetLsaPointer kernel)");
    TIDE_CUDA_CALL(
        cudaMemcpyAsync(host, dev, (size_t)n * sizeof(void *), cudaMemcpyDeviceToHost, w->mp.util),
        "cudaMemcpyAsync(LSA pointers)");
    TIDE_CUDA_CALL(cudaStreamSynchronize(w->mp.util), "cudaStreamSynchronize(LSA pointers)");
    for (int r = 0; r < n; ++r) {
        if (host[r] == NULL)
            return TIDE_ERR(TIDE_ERR_FABRIC, "nccl fabric: NCCL gave no LSA pointer for rank %d",
                            first + r);
        /* Every later host-side use (the marker copies) must see device memory: a pointer
         * the driver does not know is taken for pageable host memory by a copy of kind
         * cudaMemcpyDefault and read by the CPU, which crashes the process (SIGSEGV) instead
         * of failing the call.  An LSA pointer read through a window descriptor of another
         * layout (a libnccl of another version than the headers) would be such a pointer. */
        struct cudaPointerAttributes attr;
        memset(&attr, 0, sizeof(attr));
        const cudaError_t e = cudaPointerGetAttributes(&attr, host[r]);
        (void)cudaGetLastError();
        if (e != cudaSuccess || attr.type != cudaMemoryTypeDevice)
            return TIDE_ERR(TIDE_ERR_FABRIC,
                            "nccl fabric: rank %d: the LSA pointer %p of rank %d is not device "
                            "memory (memory type %d, %s); a window descriptor of another layout "
                            "than the nccl_device headers TIDE was built with would give one "
                            "(NCCL %d headers, library %d)",
                            w->mp.base.rank, host[r], first + r, (int)attr.type,
                            cudaGetErrorString(e), NCCL_VERSION_CODE, w->lib->version);
        a->mp.base.bases[first + r] = (uint8_t *)host[r];
    }
    return TIDE_SUCCESS;
}

static tide_result_t write_marker(tide_nccl_world_t *w, tide_nccl_arena_t *a) {
    uint64_t *host = (uint64_t *)(void *)w->scratch_host;
    *host = MARKER(w->mp.base.rank);
    TIDE_CUDA_CALL(cudaMemcpyAsync((uint8_t *)a->mem + a->mp.flags_off, host, 8,
                                   cudaMemcpyHostToDevice, w->mp.util),
                   "cudaMemcpyAsync(marker)");
    TIDE_CUDA_CALL(cudaStreamSynchronize(w->mp.util), "cudaStreamSynchronize(marker)");
    return TIDE_SUCCESS;
}

/* The marker of every rank of this node read through its LSA pointer: the pointers name the
 * right memory.  Other nodes' segments are not mapped here (NULL bases). */
static tide_result_t check_markers(tide_nccl_world_t *w, tide_nccl_arena_t *a) {
    const int n = w->mp.base.ranks;
    uint64_t *host = (uint64_t *)(void *)w->scratch_host;
    for (int r = 0; r < n; ++r)
        /* DeviceToHost, not Default: an address the driver does not know fails the copy
         * instead of being read by the CPU as pageable host memory. */
        if (own_node(w, r))
            TIDE_CUDA_CALL(cudaMemcpyAsync(&host[r], a->mp.base.bases[r] + a->mp.flags_off, 8,
                                           cudaMemcpyDeviceToHost, w->mp.util),
                           "cudaMemcpyAsync(marker through the LSA pointer)");
    TIDE_CUDA_CALL(cudaStreamSynchronize(w->mp.util), "cudaStreamSynchronize(markers)");
    for (int r = 0; r < n; ++r)
        if (own_node(w, r) && host[r] != MARKER(r))
            return TIDE_ERR(TIDE_ERR_FABRIC,
                            "nccl fabric: rank %d read %016llx through rank %d's LSA pointer %p, "
                            "expected its marker %016llx",
                            w->mp.base.rank, (unsigned long long)host[r], r,
                            (void *)a->mp.base.bases[r], (unsigned long long)MARKER(r));
    return TIDE_SUCCESS;
}

static tide_result_t zero_own(tide_nccl_world_t *w, tide_nccl_arena_t *a) {
    TIDE_CUDA_CALL(cudaMemsetAsync(a->mem, 0, a->mp.alloc_bytes, w->mp.util),
                   "cudaMemsetAsync(arena)");
    TIDE_CUDA_CALL(cudaStreamSynchronize(w->mp.util), "cudaStreamSynchronize(zero)");
    return TIDE_SUCCESS;
}

/* The one-sided rails: the same memory as a window of the rail communicator, where the
 * puts name their destinations (ncclPutSignal's peer window and offset) and find their
 * sources.  NCCL_WIN_COLL_SYMMETRIC: ncclPutSignal refuses a source outside a window with
 * that flag (NCCL 2.29's enqueue.cc).  The flag's symmetric kernels ask for NVLink multicast
 * only on a communicator with NVLS support, which NCCL_NVLS_ENABLE=0 (lib.c) rules out and a
 * rail communicator (one rank per node) would not have anyway. */
static tide_result_t rail_window(tide_nccl_world_t *w, tide_nccl_arena_t *a) {
    const ncclResult_t r = w->lib->CommWindowRegister(w->rail_comm, a->mem,
                                                      (size_t)a->mp.alloc_bytes, &a->rail_win,
                                                      NCCL_WIN_COLL_SYMMETRIC);
    if (r != ncclSuccess)
        return tide_nccl_error(w->lib, r, __FILE__, __LINE__,
                               "ncclCommWindowRegister(rail communicator, "
                               "NCCL_WIN_COLL_SYMMETRIC)");
    if (a->rail_win == NULL)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "nccl fabric: rank %d: ncclCommWindowRegister gave no window on the "
                        "rail communicator (ncclPutSignal needs one; TIDE_NCCL_RAILS_PUT=0 "
                        "uses send/recv)",
                        w->mp.base.rank);
    a->rail_registered = true;
    return TIDE_SUCCESS;
}


/* `pre`: a local failure before this step; the rank still joins the first exchange (as a
 * rank without memory), so that its peers fail with it instead of waiting. */
static tide_result_t segment_create(tide_nccl_world_t *w, tide_nccl_arena_t *a, uint64_t bytes,
                                    uint64_t signature, tide_result_t pre) {
    const tide_nccl_lib_t *lib = w->lib;
    const int n = w->mp.base.ranks;
    a->mp.flags_off = tide_align_up_u64(bytes, 256);
    a->mp.alloc_bytes =
        tide_align_up_u64(a->mp.flags_off + tide_cuda_mp_flag_bytes(&a->mp), SEGMENT_UNIT);
    seg_info_t mine = {signature, bytes, w->mp.registrations, a->mp.alloc_bytes};
    tide_result_t local = pre;
    if (local == TIDE_SUCCESS) {
        const ncclResult_t ar = lib->MemAlloc(&a->mem, (size_t)a->mp.alloc_bytes);
        if (ar != ncclSuccess) {
            a->mem = NULL;
            local = tide_nccl_error(lib, ar, __FILE__, __LINE__, "ncclMemAlloc(arena)");
        }
    }
    if (local != TIDE_SUCCESS) mine.alloc_bytes = 0;
    seg_info_t *all = calloc((size_t)n, sizeof(*all));
    if (all == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "nccl fabric: %d ranks", n);
    tide_result_t res = tide_nccl_allgather(w, &mine, sizeof(mine), all);
    if (res == TIDE_SUCCESS) res = local != TIDE_SUCCESS ? local : check_infos(w, all, &mine);
    free(all);
    if (res != TIDE_SUCCESS) return res; /* every rank saw the same table */

    /* Collective over the node communicator; every rank gets here.  NCCL_WIN_DEFAULT, not
     * NCCL_WIN_COLL_SYMMETRIC: the window is the same symmetric-memory window with the same
     * LSA mapping either way, and TIDE runs no NCCL collective on it, but the SYMMETRIC flag
     * makes NCCL 2.28 set up its symmetric kernels, which ask for NVLink multicast memory
     * whenever the communicator has NVLS support (ncclSymkInitOnce). */
    const ncclResult_t rr = lib->CommWindowRegister(w->node_comm, a->mem, (size_t)a->mp.alloc_bytes,
                                                    &a->win, NCCL_WIN_DEFAULT);
    if (rr == ncclSuccess && a->win != NULL) a->registered = true;
    local = rr != ncclSuccess
                ? tide_nccl_error(lib, rr, __FILE__, __LINE__, "ncclCommWindowRegister")
            : a->win == NULL
                ? TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                           "nccl fabric: ncclCommWindowRegister gave no window: NCCL has no "
                           "symmetric memory on this communicator (it needs CUDA VMM, "
                           "NCCL_CUMEM_ENABLE, and P2P between all ranks of the node)")
                : TIDE_SUCCESS;
    if (local == TIDE_SUCCESS) local = check_window(w, a);
    TIDE_CHECK(tide_nccl_agreed(w, local, "ncclCommWindowRegister"));
    if (w->rails_put) TIDE_CHECK(tide_nccl_agreed(w, rail_window(w, a), "the rail window"));
    TIDE_CHECK(tide_nccl_agreed(w, lsa_bases(w, a), "the LSA pointers"));
    TIDE_CHECK(tide_nccl_agreed(w, write_marker(w, a), "writing its marker"));
    TIDE_CHECK(tide_nccl_agreed(w, check_markers(w, a), "reading the markers"));
    /* Nobody reads a marker any more: zero the own segment, then all start from zeros. */
    TIDE_CHECK(tide_nccl_agreed(w, zero_own(w, a), "zeroing its arena"));
    for (int r = 0; r < n; ++r)
        a->mp.flags[r] = own_node(w, r) ? a->mp.base.bases[r] + a->mp.flags_off : NULL;
    return TIDE_SUCCESS;
}

/* `areas` flag areas behind each rank's arena: 1, or 1 + the views of a set (the CUDA mp
 * fabric's views serve this fabric's sets too: fabric/cuda/mp_view.c). */
static tide_result_t arena_create_areas(struct tide_fabric_world *world, uint64_t bytes,
                                        uint64_t signature, int areas,
                                        struct tide_fabric_arena **arena_out) {
    tide_nccl_world_t *w = (tide_nccl_world_t *)world;
    const int n = w->mp.base.ranks;
    TIDE_CUDA_CALL(cudaSetDevice(w->mp.device), "cudaSetDevice");
    tide_nccl_arena_t *a = calloc(1, sizeof(*a));
    if (a == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "nccl fabric: arena");
    a->mp.w = &w->mp;
    a->mp.flag_areas = areas;
    a->mp.base.world = world;
    a->mp.base.bytes = bytes;
    a->mp.base.bases = calloc((size_t)n, sizeof(*a->mp.base.bases));
    a->mp.flags = calloc((size_t)n, sizeof(*a->mp.flags));
    a->mp.remote = calloc((size_t)n, sizeof(*a->mp.remote));
    ++w->mp.registrations;
    a->registration = w->mp.registrations; /* names the group in argument checks (calls.c) */
    tide_result_t res = a->mp.base.bases == NULL || a->mp.flags == NULL || a->mp.remote == NULL
                            ? TIDE_ERR(TIDE_ERR_NO_MEMORY, "nccl fabric: %d ranks", n)
                            : TIDE_SUCCESS;
    /* NCCL puts every rank of a communicator on a device of its own (it refuses two on one),
     * so every peer's segment is on another device: copies to or from it stay one
     * cudaMemcpyAsync each (copy engines), never the SM batch kernel (mp_batch.c), exactly
     * as on the CUDA mp fabric with ranks on several devices.  Ranks of other nodes are
     * remote too (and not mapped at all: their bases stay NULL). */
    if (res == TIDE_SUCCESS)
        for (int r = 0; r < n; ++r) {
            a->mp.remote[r] = r != w->mp.base.rank;
            a->mp.any_remote = a->mp.any_remote || a->mp.remote[r];
        }
    /* a->mp.ctl stays closed (no control block, mp_ctl.h): the shared memfd block of the CUDA
     * mp fabric needs its socket bootstrap to pass the descriptor, which this fabric does not
     * have.  A hung or dead peer is seen at TIDE_TIMEOUT_MS only, and a fail-stop is not
     * published to the other ranks (docs/nccl-fabric.md). */
    /* Families are local and cannot leave a peer waiting: before the collective steps. */
    if (res == TIDE_SUCCESS) res = tide_cuda_mp_families_create(&a->mp);
    res = segment_create(w, a, bytes, signature, res);
    if (res != TIDE_SUCCESS) {
        /* Every rank fails at the same step (the verdicts). */
        if (w->aborted)
            segment_release_aborted(w, a);
        else
            segment_release(w, a);
        arena_free(a);
        return res;
    }
    *arena_out = &a->mp.base;
    return TIDE_SUCCESS;
}

tide_result_t tide_nccl_arena_create(struct tide_fabric_world *world, uint64_t bytes,
                                     uint64_t signature, struct tide_fabric_arena **arena_out) {
    return arena_create_areas(world, bytes, signature, 1, arena_out);
}

tide_result_t tide_nccl_arena_create_set(struct tide_fabric_world *world, uint64_t bytes,
                                         uint64_t signature, int views,
                                         struct tide_fabric_arena **arena_out) {
    int areas = 0;
    /* Refused alike on every rank (several nodes: rails), before any collective step. */
    TIDE_CHECK(tide_cuda_mp_set_areas(&((tide_nccl_world_t *)world)->mp, views, &areas));
    return arena_create_areas(world, bytes, signature, areas, arena_out);
}

tide_result_t tide_nccl_arena_destroy(struct tide_fabric_arena *arena) {
    /* A group's view of a set is a plain mp arena (mp_view.c): nothing of NCCL's to release. */
    if (((tide_mp_arena_t *)arena)->parent != NULL)
        return tide_cuda_mp_view_destroy((tide_mp_arena_t *)arena);
    tide_nccl_arena_t *a = (tide_nccl_arena_t *)arena;
    tide_nccl_world_t *w = (tide_nccl_world_t *)a->mp.w;
    (void)cudaSetDevice(w->mp.device);
    /* Nothing of ours may still run against a segment: finish (or fail-stop) both families. */
    tide_result_t res = TIDE_SUCCESS;
    for (int f = 0; f < 2; ++f) {
        const tide_result_t r =
            tide_cuda_mp_sync(arena, f == 0 ? TIDE_COLL_ALL_GATHER : TIDE_COLL_REDUCE_SCATTER);
        if (res == TIDE_SUCCESS) res = r;
    }
    const bool broken =
        a->mp.fam[0].broken != TIDE_SUCCESS || a->mp.fam[1].broken != TIDE_SUCCESS || w->aborted;
    if (broken) w->calls_failed = true;
    if (!broken) {
        /* Every rank finished its calls (peers stop writing into our segment) before any
         * window goes; the deregistration itself is collective. */
        bool all_ok = false;
        const tide_result_t r = tide_nccl_agree(w, res == TIDE_SUCCESS, &all_ok);
        if (res == TIDE_SUCCESS) res = r;
        if (r == TIDE_SUCCESS) {
            segment_release(w, a);
        } else if (w->aborted) {
            segment_release_aborted(w, a);
        }
    }
    /* After a fail-stop the peers may be gone and a collective deregistration could hang:
     * the windows and the memory stay until the node (and rail) communicators are aborted at
     * world destruction (leaked otherwise; docs/nccl-fabric.md). */
    arena_free(a);
    return res;
}
