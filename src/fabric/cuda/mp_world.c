/*
 * mp_world.c - the one-process-per-rank CUDA fabric's worlds and arenas (mp.h): bootstrap,
 * streams, and each rank's segment (arena + flag area) exported, imported and mapped.
 */
#include "core/checks.h"
#include "fabric/cuda/mp.h"
#include "fabric/cuda/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TIDE_CU_CALL(call, what)                                                                   \
    do {                                                                                           \
        CUresult tide_cu_e_ = (call);                                                              \
        if (tide_cu_e_ != CUDA_SUCCESS) return cu_error(tide_cu_e_, __FILE__, __LINE__, (what));   \
    } while (0)

static tide_result_t cu_error(CUresult e, const char *file, int line, const char *what) {
    const char *name = NULL, *str = NULL;
    cuGetErrorName(e, &name);
    cuGetErrorString(e, &str);
    return tide_error_set(TIDE_ERR_FABRIC, file, line, "cuda mp fabric: %s: %s (%s)", what,
                          name ? name : "?", str ? str : "?");
}

/* ------------------------------------------------------------------ worlds */

void tide_cuda_mp_world_release(tide_mp_world_t *w) {
    for (int q = 0; q < TIDE_CUDA_Q; ++q) {
        if (w->stream[q] != NULL) cudaStreamDestroy(w->stream[q]);
        if (w->end[q] != NULL) cudaEventDestroy(w->end[q]);
    }
    if (w->util != NULL) cudaStreamDestroy(w->util);
    if (w->rail_stream != NULL) cudaStreamDestroy(w->rail_stream);
    w->rail_stream = NULL;
    w->rails = NULL;
    if (w->start != NULL) cudaEventDestroy(w->start);
    tide_cuda_mp_direct_world_free(w);
    (void)cudaGetLastError();
    tide_mp_boot_close(&w->boot);
}

static void world_free(tide_mp_world_t *w) {
    tide_mp_watchdog_stop(w); /* joined before the streams it queries go */
    tide_cuda_mp_world_release(w);
    free(w);
}

tide_result_t tide_cuda_mp_world_init(tide_mp_world_t *w) {
    w->transport = &tide_transport_ipc; /* the NCCL fabric sets its own after this */
    TIDE_CUDA_CALL(cudaGetDevice(&w->device), "cudaGetDevice");
    TIDE_CUDA_CALL(cudaSetDevice(w->device), "cudaSetDevice");
    TIDE_CUDA_CALL(cudaFree(NULL), "cudaFree(NULL) (context)");
    TIDE_CUDA_CALL(cudaDeviceGetAttribute(&w->sm_count, cudaDevAttrMultiProcessorCount, w->device),
                   "cudaDeviceGetAttribute(SMs)");
    int pitch = 0;
    TIDE_CUDA_CALL(cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, w->device),
                   "cudaDeviceGetAttribute(max pitch)");
    w->max_pitch = (size_t)pitch;
    CUdevice dev;
    TIDE_CU_CALL(cuDeviceGet(&dev, w->device), "cuDeviceGet");
    int memops = 0;
    TIDE_CU_CALL(cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
                                      dev),
                 "cuDeviceGetAttribute(64-bit stream memory operations)");
    if (!memops)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "cuda mp fabric: device %d has no 64-bit stream memory operations "
                        "(cuStreamWaitValue64), which carry the signals between processes",
                        w->device);
    for (int q = 0; q < TIDE_CUDA_Q; ++q) {
        TIDE_CUDA_CALL(cudaStreamCreateWithFlags(&w->stream[q], cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags");
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&w->end[q], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags(end)");
    }
    TIDE_CUDA_CALL(cudaStreamCreateWithFlags(&w->util, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags(util)");
    TIDE_CUDA_CALL(cudaEventCreateWithFlags(&w->start, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags(start)");
    w->batch = tide_cuda_env_batch();
    TIDE_CHECK(tide_cuda_env_batch_max_bytes(&w->batch_max_bytes));
    TIDE_CHECK(tide_fabric_batch_kernel_env(TIDE_CUDA_BATCH_UNROLL, TIDE_CUDA_BATCH_STREAMING,
                                            &w->batch_unroll, &w->batch_streaming));
    TIDE_CHECK(tide_cuda_env_slicing(&w->slicing));
    TIDE_CHECK(tide_cuda_mp_env_ce_batch(&w->ce_batch));
    CUuuid uuid;
    TIDE_CU_CALL(cuDeviceGetUuid(&uuid, dev), "cuDeviceGetUuid");
    memcpy(w->uuid, uuid.bytes, sizeof(w->uuid));
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_world_set_rails(tide_mp_world_t *w, const tide_mp_rails_ops_t *ops) {
    if (w->rail_stream == NULL)
        TIDE_CUDA_CALL(cudaStreamCreateWithFlags(&w->rail_stream, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags(rail)");
    w->rails = ops;
    return TIDE_SUCCESS;
}

/* TIDE_CUDA_MP_RAILS: unset, empty or 0 issues cross-node puts as copies; 1 carries them as
 * rail steps over the emulated transport (mp.h), to run the rail machinery on one host. */
static tide_result_t env_rails(int nodes, tide_mp_world_t *w) {
    const char *e = getenv("TIDE_CUDA_MP_RAILS");
    if (e == NULL || e[0] == '\0' || strcmp(e, "0") == 0) return TIDE_SUCCESS;
    if (strcmp(e, "1") != 0)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "cuda mp fabric: TIDE_CUDA_MP_RAILS is \"%s\" (0 or 1)", e);
    return nodes > 1 ? tide_cuda_mp_world_set_rails(w, &tide_cuda_mp_rails_emulated)
                     : TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_world_create(int nodes, int gpus_per_node, int rank, const char *name,
                                        struct tide_fabric_world **out) {
    const int n = nodes * gpus_per_node;
    tide_mp_world_t *w = calloc(1, sizeof(*w));
    if (w == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: world");
    w->boot.listen_fd = -1;
    w->base.ops = &tide_fabric_cuda_mp_ops;
    w->base.rank = rank;
    w->base.nodes = nodes;
    w->base.gpus_per_node = gpus_per_node;
    w->base.ranks = n;
    tide_result_t res = tide_cuda_mp_world_init(w);
    if (res == TIDE_SUCCESS) res = tide_cuda_mp_direct_env(&w->direct);
    if (res == TIDE_SUCCESS) res = tide_fabric_sync_elide_env(true, &w->elide);
    if (res == TIDE_SUCCESS) res = env_rails(nodes, w);
    if (res == TIDE_SUCCESS) res = tide_cuda_mp_env_flags(&w->flags);
    /* A rank whose part failed (a refused variable, no CUDA context) still joins: every rank
     * then fails at once naming it, instead of waiting out the join deadline for it.  It
     * returns its own error, and its own message, whatever the join reports. */
    const tide_result_t local = res;
    char held[TIDE_ERROR_BYTES] = "";
    if (local != TIDE_SUCCESS) snprintf(held, sizeof(held), "%s", tide_get_last_error());
    const int64_t join_ms = tide_fabric_join_timeout_ms();
    res = tide_mp_boot_open(name, rank, n, join_ms, &w->boot);
    if (res == TIDE_SUCCESS) res = tide_cuda_mp_world_agree(w, local, join_ms);
    if (local != TIDE_SUCCESS) {
        tide_error_restore(held);
        res = local;
    }
    if (res == TIDE_SUCCESS) res = tide_mp_watchdog_start(w);
    if (res != TIDE_SUCCESS) {
        world_free(w);
        return res;
    }
    *out = &w->base;
    return TIDE_SUCCESS;
}

static tide_result_t mp_world_destroy(struct tide_fabric_world *world) {
    world_free((tide_mp_world_t *)world);
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ segments */

/* What each rank tells the others about its segment. */
typedef struct {
    uint64_t signature;
    uint64_t bytes;       /* the plan's arena bytes */
    uint64_t seq;         /* registrations of this world so far */
    uint64_t alloc_bytes; /* the segment */
    int32_t vmm;          /* 1: an fd travels with the blob; 0: legacy handle below */
    int32_t device;
    uint8_t uuid[16]; /* the device's: peers on another device get no batched copies */
    cudaIpcMemHandle_t ipc;
} seg_info_t;

static void segments_release(tide_mp_arena_t *a) {
    const int n = a->w->base.ranks, me = a->w->base.rank;
    for (int r = 0; r < n; ++r) {
        if (a->vmm != NULL && a->vmm[r]) {
            if (a->va != NULL && a->va[r] != 0) {
                cuMemUnmap(a->va[r], a->alloc_bytes);
                cuMemAddressFree(a->va[r], a->alloc_bytes);
            }
            if (a->handle != NULL && a->handle[r] != 0) cuMemRelease(a->handle[r]);
        } else if (r != me && a->base.bases != NULL && a->base.bases[r] != NULL) {
            cudaIpcCloseMemHandle(a->base.bases[r]);
        }
    }
    if (a->legacy_own != NULL) cudaFree(a->legacy_own);
    (void)cudaGetLastError();
    tide_cuda_mp_flags_unmap(a);
    tide_mp_ctl_close(&a->ctl);
    free(a->vmm);
    free(a->remote);
    a->remote = NULL;
    free(a->handle);
    free(a->va);
    free(a->flags);
    free(a->base.bases);
    a->vmm = NULL;
    a->handle = NULL;
    a->va = NULL;
    a->flags = NULL;
    a->base.bases = NULL;
    a->legacy_own = NULL;
}

static bool legacy_forced(void) {
    const char *e = getenv("TIDE_CUDA_IPC");
    return e != NULL && strcmp(e, "legacy") == 0;
}

/* Reserve a range for handle h and map it read-write for this device. */
static tide_result_t map_handle(tide_mp_arena_t *a, int r) {
    TIDE_CU_CALL(cuMemAddressReserve(&a->va[r], a->alloc_bytes, 0, 0, 0), "cuMemAddressReserve");
    TIDE_CU_CALL(cuMemMap(a->va[r], a->alloc_bytes, 0, a->handle[r], 0), "cuMemMap");
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = a->w->device;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    TIDE_CU_CALL(cuMemSetAccess(a->va[r], a->alloc_bytes, &acc, 1), "cuMemSetAccess");
    a->base.bases[r] = (uint8_t *)(uintptr_t)a->va[r];
    return TIDE_SUCCESS;
}

/* This rank's segment: a shareable VMM allocation (fd_out: its exported handle), or, when the
 * driver refuses one, a cudaMalloc allocation with a legacy IPC handle. */
static tide_result_t own_segment(tide_mp_arena_t *a, seg_info_t *info, int *fd_out) {
    const int me = a->w->base.rank;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = a->w->device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    *fd_out = -1;
    bool vmm = !legacy_forced() &&
               cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ==
                   CUDA_SUCCESS &&
               gran > 0;
    /* One size on every rank whatever its path: granularities are powers of two. */
    const uint64_t unit = vmm && (uint64_t)gran > (2u << 20) ? (uint64_t)gran : 2u << 20;
    a->alloc_bytes = (a->flags_off + tide_cuda_mp_flag_bytes(a) + unit - 1) / unit * unit;
    if (vmm && cuMemCreate(&a->handle[me], a->alloc_bytes, &prop, 0) != CUDA_SUCCESS) {
        a->handle[me] = 0;
        vmm = false;
    }
    if (vmm && cuMemExportToShareableHandle(fd_out, a->handle[me],
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                            0) != CUDA_SUCCESS) {
        cuMemRelease(a->handle[me]);
        a->handle[me] = 0;
        *fd_out = -1;
        vmm = false;
    }
    /* Every later failure of this rank is reported by the exchange's caller. */
    (void)cudaGetLastError();
    info->alloc_bytes = a->alloc_bytes;
    info->vmm = vmm;
    info->device = a->w->device;
    a->vmm[me] = vmm;
    if (vmm) return map_handle(a, me);
    TIDE_CUDA_CALL(cudaMalloc(&a->legacy_own, a->alloc_bytes), "cudaMalloc(segment)");
    TIDE_CUDA_CALL(cudaIpcGetMemHandle(&info->ipc, a->legacy_own), "cudaIpcGetMemHandle");
    a->base.bases[me] = a->legacy_own;
    return TIDE_SUCCESS;
}

static tide_result_t peer_segment(tide_mp_arena_t *a, int r, const seg_info_t *info, int *fd) {
    if (info->alloc_bytes != a->alloc_bytes)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cuda mp fabric: rank %d's segment has %llu bytes, rank %d's %llu "
                        "(granularities differ across devices)",
                        r, (unsigned long long)info->alloc_bytes, a->w->base.rank,
                        (unsigned long long)a->alloc_bytes);
    a->vmm[r] = info->vmm != 0;
    if (a->vmm[r]) {
        if (*fd < 0)
            return TIDE_ERR(TIDE_ERR_INTERNAL, "cuda mp fabric: rank %d sent no handle", r);
        const CUresult e = cuMemImportFromShareableHandle(
            &a->handle[r], (void *)(uintptr_t)*fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(*fd);
        *fd = -1;
        if (e != CUDA_SUCCESS) {
            a->handle[r] = 0;
            return cu_error(e, __FILE__, __LINE__, "cuMemImportFromShareableHandle");
        }
        return map_handle(a, r);
    }
    void *p = NULL;
    TIDE_CUDA_CALL(cudaIpcOpenMemHandle(&p, info->ipc, cudaIpcMemLazyEnablePeerAccess),
                   "cudaIpcOpenMemHandle");
    a->base.bases[r] = p;
    return TIDE_SUCCESS;
}

static tide_result_t segments_create(tide_mp_arena_t *a, uint64_t bytes, uint64_t signature) {
    tide_mp_world_t *w = a->w;
    const int n = w->base.ranks, me = w->base.rank;
    const int64_t timeout = tide_fabric_timeout_ms();
    a->vmm = calloc((size_t)n, sizeof(*a->vmm));
    a->remote = calloc((size_t)n, sizeof(*a->remote));
    a->handle = calloc((size_t)n, sizeof(*a->handle));
    a->va = calloc((size_t)n, sizeof(*a->va));
    a->flags = calloc((size_t)n, sizeof(*a->flags));
    a->base.bases = calloc((size_t)n, sizeof(*a->base.bases));
    seg_info_t *all = calloc((size_t)n, sizeof(*all));
    int *fds = malloc((size_t)n * sizeof(*fds));
    if (a->vmm == NULL || a->remote == NULL || a->handle == NULL || a->va == NULL || a->flags == NULL ||
        a->base.bases == NULL || all == NULL || fds == NULL) {
        free(all);
        free(fds);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: %d segments", n);
    }
    for (int r = 0; r < n; ++r)
        fds[r] = -1;
    /* The control block first: every rank fails here together if any cannot set it up.  With
     * host flags (rank 0's TIDE_CUDA_MP_FLAGS) it carries every rank's flag area; with kernel
     * waits it says so, and every rank maps it for its wait kernels' abort word (mp_flags.c). */
    tide_result_t ctl = tide_mp_ctl_open_mapped(
        &w->boot, timeout,
        w->flags == TIDE_MP_FLAGS_HOST ? (size_t)tide_cuda_mp_flag_bytes(a) : 0,
        w->flags == TIDE_MP_FLAGS_KERNEL, &a->ctl);
    if (ctl != TIDE_SUCCESS) {
        free(all);
        free(fds);
        return ctl;
    }
    a->flags_off = (bytes + 255) / 256 * 256;
    seg_info_t mine;
    memset(&mine, 0, sizeof(mine));
    mine.signature = signature;
    mine.bytes = bytes;
    mine.seq = w->registrations;
    memcpy(mine.uuid, w->uuid, sizeof(mine.uuid));
    int fd = -1;
    tide_result_t own = own_segment(a, &mine, &fd);
    /* Exchange even after a local failure, so that the peers fail too instead of waiting. */
    if (own != TIDE_SUCCESS) mine.alloc_bytes = 0;
    tide_result_t res = tide_mp_boot_allgather(&w->boot, &mine, sizeof(mine), fd, all, fds, timeout);
    if (fd >= 0) close(fd);
    if (res == TIDE_SUCCESS && own != TIDE_SUCCESS) res = own;
    for (int r = 0; r < n && res == TIDE_SUCCESS; ++r) {
        if (all[r].alloc_bytes == 0)
            res = TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp fabric: rank %d could not allocate its "
                                            "segment", r);
        else if (all[r].signature != signature || all[r].bytes != bytes || all[r].seq != mine.seq)
            res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                           "cuda mp fabric: rank %d registered another group (signature %llx, "
                           "%llu bytes, registration %llu) than rank %d (%llx, %llu, %llu)",
                           r, (unsigned long long)all[r].signature,
                           (unsigned long long)all[r].bytes, (unsigned long long)all[r].seq, me,
                           (unsigned long long)signature, (unsigned long long)bytes,
                           (unsigned long long)mine.seq);
    }
    for (int r = 0; r < n && res == TIDE_SUCCESS; ++r)
        if (r != me) {
            res = peer_segment(a, r, &all[r], &fds[r]);
            a->remote[r] = memcmp(all[r].uuid, w->uuid, sizeof(w->uuid)) != 0;
            a->any_remote = a->any_remote || a->remote[r];
        }
    for (int r = 0; r < n; ++r)
        if (fds[r] >= 0) close(fds[r]);
    free(all);
    free(fds);
    if (res == TIDE_SUCCESS) {
        /* Zero the own segment (arena and flags) before any peer may touch it. */
        TIDE_CUDA_CALL(cudaMemsetAsync(a->base.bases[me], 0, a->alloc_bytes, w->util),
                       "cudaMemsetAsync(segment)");
        TIDE_CUDA_CALL(cudaStreamSynchronize(w->util), "cudaStreamSynchronize(zero)");
        for (int r = 0; r < n; ++r)
            a->flags[r] = a->base.bases[r] + a->flags_off;
        /* The control block's flags instead, or its abort word for kernel waits (mp_flags.c). */
        res = tide_cuda_mp_flags_map(a);
    }
    /* Everybody mapped and zeroed, or everybody learns that someone failed. */
    const tide_result_t bar =
        tide_mp_boot_barrier(&w->boot, res == TIDE_SUCCESS ? 0x5e6 + mine.seq : 0xbad, timeout);
    return res != TIDE_SUCCESS ? res : bar;
}

static void family_init(tide_mp_family_t *fam, tide_collective_t coll) {
    memset(fam, 0, sizeof(*fam));
    fam->coll = coll;
    fam->last_epoch = -1;
    fam->fenced_epoch = -1;
    fam->done_epoch[0] = fam->done_epoch[1] = -1;
}

static tide_result_t family_events(tide_mp_family_t *fam) {
    for (int p = 0; p < 2; ++p)
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&fam->done_ev[p], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags(done)");
    for (int k = 0; k < TIDE_EVENT_COUNT; ++k)
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&fam->user[k], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags(call event)");
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_families_create(tide_mp_arena_t *a) {
    family_init(&a->fam[0], TIDE_COLL_ALL_GATHER);
    family_init(&a->fam[1], TIDE_COLL_REDUCE_SCATTER);
    for (int f = 0; f < 2; ++f)
        TIDE_CHECK(family_events(&a->fam[f]));
    return TIDE_SUCCESS;
}

/* `areas` flag areas behind each rank's arena: 1, or 1 + the views of a set (mp_view.c). */
static tide_result_t arena_create_areas(struct tide_fabric_world *world, uint64_t bytes,
                                        uint64_t signature, int areas,
                                        struct tide_fabric_arena **out) {
    tide_mp_world_t *w = (tide_mp_world_t *)world;
    TIDE_CUDA_CALL(cudaSetDevice(w->device), "cudaSetDevice");
    tide_mp_arena_t *a = calloc(1, sizeof(*a));
    if (a == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: arena");
    a->w = w;
    a->flag_areas = areas;
    a->base.world = world;
    a->base.bytes = bytes;
    ++w->registrations;
    family_init(&a->fam[0], TIDE_COLL_ALL_GATHER);
    family_init(&a->fam[1], TIDE_COLL_REDUCE_SCATTER);
    tide_result_t res = segments_create(a, bytes, signature);
    for (int f = 0; f < 2 && res == TIDE_SUCCESS; ++f)
        res = family_events(&a->fam[f]);
    if (res == TIDE_SUCCESS) res = tide_mp_watchdog_add(a);
    if (res != TIDE_SUCCESS) {
        for (int f = 0; f < 2; ++f)
            tide_cuda_mp_family_free(&a->fam[f]);
        segments_release(a);
        free(a);
        return res;
    }
    *out = &a->base;
    return TIDE_SUCCESS;
}

static tide_result_t mp_arena_create(struct tide_fabric_world *world, uint64_t bytes,
                                     uint64_t signature, struct tide_fabric_arena **out) {
    return arena_create_areas(world, bytes, signature, 1, out);
}

static tide_result_t mp_arena_create_set(struct tide_fabric_world *world, uint64_t bytes,
                                         uint64_t signature, int views,
                                         struct tide_fabric_arena **out) {
    int areas = 0;
    /* Every rank refuses alike (rails are a property of the world), before any exchange. */
    TIDE_CHECK(tide_cuda_mp_set_areas((tide_mp_world_t *)world, views, &areas));
    return arena_create_areas(world, bytes, signature, areas, out);
}

/* A deregistration barrier failed (a peer is dead, hung, or still calling): fail the group as
 * a missing rank of a call would, so that the abort word tells every peer and the poison
 * releases every device wait on the flags mapped here, before this rank releases its
 * segment.  Without it a peer still waiting on one of our flags would wait forever.  The
 * barrier's error stays the result. */
static bool deregistration_failed(tide_mp_arena_t *a) {
    char msg[TIDE_MP_CTL_MSG];
    snprintf(msg, sizeof(msg), "rank %d could not deregister the group with its peers: %s",
             a->w->base.rank, tide_get_last_error());
    (void)tide_cuda_mp_fail_stop_msg(a, msg);
    return true;
}

static tide_result_t mp_arena_destroy(struct tide_fabric_arena *arena) {
    tide_mp_arena_t *a = (tide_mp_arena_t *)arena;
    if (a->parent != NULL) return tide_cuda_mp_view_destroy(a); /* a group's view of a set */
    tide_mp_world_t *w = a->w;
    const int64_t timeout = tide_fabric_timeout_ms();
    (void)cudaSetDevice(w->device);
    /* Nothing of ours may still run against a segment: finish (or fail-stop) both families. */
    tide_result_t res = TIDE_SUCCESS;
    for (int f = 0; f < 2; ++f) {
        tide_result_t r = tide_cuda_mp_sync(arena, f == 0 ? TIDE_COLL_ALL_GATHER
                                                          : TIDE_COLL_REDUCE_SCATTER);
        if (res == TIDE_SUCCESS) res = r;
    }
    bool broken = a->fam[0].broken != TIDE_SUCCESS || a->fam[1].broken != TIDE_SUCCESS;
    /* Peers stop using our segment before anybody unmaps (legacy IPC needs the owner's memory
     * to outlive the importers' mappings; VMM keeps it alive by reference anyway).  After a
     * fail-stop the barrier cannot complete: release at once. */
    if (!broken) {
        tide_result_t r = tide_mp_boot_barrier(&w->boot, 0xde5, timeout);
        if (r != TIDE_SUCCESS) broken = deregistration_failed(a);
        if (res == TIDE_SUCCESS) res = r;
    }
    tide_mp_watchdog_remove(a); /* before the events and flags it reads go */
    for (int f = 0; f < 2; ++f)
        tide_cuda_mp_family_free(&a->fam[f]);
    tide_cuda_mp_graph_free(a); /* the captured calls' tables and counters */
    /* Importers close first, then owners free (legacy). */
    const int n = w->base.ranks, me = w->base.rank;
    for (int r = 0; r < n; ++r)
        if (r != me && a->vmm != NULL && !a->vmm[r] && a->base.bases != NULL &&
            a->base.bases[r] != NULL) {
            cudaIpcCloseMemHandle(a->base.bases[r]);
            a->base.bases[r] = NULL;
        }
    if (!broken && res == TIDE_SUCCESS) {
        tide_result_t r = tide_mp_boot_barrier(&w->boot, 0xde6, timeout);
        if (r != TIDE_SUCCESS) broken = deregistration_failed(a);
        if (res == TIDE_SUCCESS) res = r;
    }
    segments_release(a);
    free(a->views);
    free(a);
    return res;
}

bool tide_cuda_mp_is(const struct tide_fabric_arena *arena) {
    if (arena == NULL || arena->world == NULL) return false;
#ifdef TIDE_HAVE_NCCL
    /* The NCCL fabric runs its calls through this fabric's execute (fabric/nccl/). */
    if (arena->world->ops == &tide_fabric_nccl_ops) return true;
#endif
    return arena->world->ops == &tide_fabric_cuda_mp_ops;
}

bool tide_cuda_mp_uses_vmm(const struct tide_fabric_arena *arena, int rank) {
    const tide_mp_arena_t *a = (const tide_mp_arena_t *)arena;
    return rank >= 0 && rank < arena->world->ranks && a->vmm != NULL && a->vmm[rank];
}

/* The lane's puts are copies into mapped peer segments and its landings the shared bf16-input
 * kernel, issued by the same interpreter (call.c) as on the single-process fabric.  With a
 * rail transport (TIDE_CUDA_MP_RAILS=1, and the NCCL fabric on several nodes) the cross-node
 * puts are rail steps: src/program/rails.c maps the lane's programs (tests/unit/test_rails.c,
 * test_rails_data.c), the schedule fires each rail step of every rank as one block so that a
 * step's credits are enqueued before it (program/schedule.c, test_rails_streams.c), and the
 * transports resolve the RS pieces' gradient sources and skip the empty puts (mp_rails.c,
 * fabric/nccl/rails*.c).  Every world runs the lane at M x 1 (docs/protocol.md, "Over rails"
 * says what ran on a GPU). */
bool tide_cuda_mp_rail_lane(const struct tide_fabric_world *world) {
    (void)world;
    return true;
}

void tide_cuda_mp_segment(const struct tide_fabric_arena *arena, void **ptr_out,
                          uint64_t *bytes_out, int *device_out) {
    /* A view borrows its parent's segments and size (mp_view.c). */
    const tide_mp_arena_t *a = (const tide_mp_arena_t *)arena;
    *ptr_out = a->base.bases[a->base.world->rank];
    *bytes_out = a->alloc_bytes;
    *device_out = a->w->device;
}

const struct tide_fabric_ops tide_fabric_cuda_mp_ops = {
    .kind = TIDE_FABRIC_CUDA,
    .name = "cuda (one process per rank)",
    .world_create_all = NULL,
    .world_create_rank = tide_cuda_mp_world_create,
    .world_destroy = mp_world_destroy,
    .arena_create = mp_arena_create,
    .arena_destroy = mp_arena_destroy,
    .arena_create_set = mp_arena_create_set,
    .arena_view_create = tide_cuda_mp_view_create,
    .execute = tide_cuda_mp_execute,
    .call_check = tide_cuda_mp_call_check,
    .capture_check = tide_cuda_mp_capture_check,
    .rail_lane = tide_cuda_mp_rail_lane, /* test_fabric_cuda_mp checks it (--lane: 2..4 x 1) */
};
