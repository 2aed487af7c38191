/*
 * world.c - the NCCL fabric's worlds (fabric_nccl.h): the communicators, the streams of the
 * CUDA mp fabric, and the small host-waited exchanges over all ranks.
 *
 * Communicators, M = 1:  world (from the unique id, or the caller's)
 *                          -> node (all N ranks): windows and exchanges
 *                M > 1:  world (from the unique id, or the caller's)
 *                          -> xchg (all N ranks, TIDE's own): exchanges and verdicts
 *                               -> node (color = rank / L): windows, LSA pointers
 *                               -> rail (color = rank % L, key = rank / L): rail steps
 *                               -> rail ready (the same split; one-sided rails only)
 * M > 1 is created only with TIDE_NCCL_RAILS=1 (experimental, never run), decided before any
 * NCCL call from the environment, which must be the same on every rank.
 */
#include "core/checks.h"
#include "fabric/nccl/fabric_nccl.h"
#include "fabric/nccl/rails.h"
#include "fabric/cuda/transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

tide_result_t tide_nccl_get_unique_id_bytes(void *id_out) {
    const tide_nccl_lib_t *lib = NULL;
    TIDE_CHECK(tide_nccl_lib_get(&lib));
    ncclUniqueId id;
    TIDE_NCCL_CALL(lib, lib->GetUniqueId(&id), "ncclGetUniqueId");
    memcpy(id_out, &id, sizeof(id));
    return TIDE_SUCCESS;
}

/* ------------------------------------------------------------------ exchanges */

/* Abort the exchange communicator after a timeout: it is gone, and so are the exchanges. */
static void abort_xchg(tide_nccl_world_t *w) {
    ncclComm_t *c = w->xchg_comm != NULL ? &w->xchg_comm : &w->node_comm;
    if (*c != NULL) (void)w->lib->CommAbort(*c);
    *c = NULL;
    w->aborted = true;
}

/* Wait for the util stream: the deadline, then the exchange communicator is aborted (a peer
 * that never joins would otherwise keep NCCL's kernel, and us, waiting forever). */
static tide_result_t util_wait(tide_nccl_world_t *w, const char *what) {
    const ncclComm_t comm = tide_nccl_xchg_comm(w);
    const uint64_t t0 = now_ns(), limit = (uint64_t)tide_fabric_timeout_ms() * 1000000u;
    for (unsigned spin = 0;; ++spin) {
        const cudaError_t e = cudaStreamQuery(w->mp.util);
        if (e == cudaSuccess) return TIDE_SUCCESS;
        if (e != cudaErrorNotReady) return tide_cuda_error(e, __FILE__, __LINE__, what);
        ncclResult_t async = ncclSuccess;
        const ncclResult_t r = w->lib->CommGetAsyncError(comm, &async);
        if (r != ncclSuccess) return tide_nccl_error(w->lib, r, __FILE__, __LINE__, what);
        if (async != ncclSuccess && async != ncclInProgress)
            return tide_nccl_error(w->lib, async, __FILE__, __LINE__, what);
        if (now_ns() - t0 > limit) {
            const bool node = w->xchg_comm == NULL;
            abort_xchg(w);
            return TIDE_ERR(TIDE_ERR_TIMEOUT,
                            "nccl fabric: rank %d waited %lld ms (TIDE_TIMEOUT_MS) for %s over "
                            "the %s communicator: some rank did not join; it was aborted",
                            w->mp.base.rank, (long long)tide_fabric_timeout_ms(), what,
                            node ? "node" : "exchange");
        }
        if (spin > 64) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

tide_result_t tide_nccl_allgather(tide_nccl_world_t *w, const void *blob, size_t bytes,
                                  void *all_out) {
    const int n = w->mp.base.ranks, me = w->mp.base.rank;
    if (bytes == 0 || bytes > TIDE_NCCL_SCRATCH)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "nccl fabric: exchange of %zu bytes", bytes);
    if (w->aborted)
        return TIDE_ERR(TIDE_ERR_FABRIC,
                        "nccl fabric: rank %d: the exchange communicator was aborted after a "
                        "timeout; destroy the communicator",
                        me);
    memcpy(w->scratch_host + (size_t)me * bytes, blob, bytes);
    uint8_t *mine = w->scratch_dev + (size_t)me * bytes;
    TIDE_CUDA_CALL(cudaMemcpyAsync(mine, w->scratch_host + (size_t)me * bytes, bytes,
                                   cudaMemcpyHostToDevice, w->mp.util),
                   "cudaMemcpyAsync(exchange in)");
    /* In place: rank r's contribution already sits at r * bytes. */
    TIDE_NCCL_CALL(w->lib,
                   w->lib->AllGather(mine, w->scratch_dev, bytes, ncclUint8,
                                     tide_nccl_xchg_comm(w), w->mp.util),
                   "ncclAllGather(exchange)");
    TIDE_CUDA_CALL(cudaMemcpyAsync(w->scratch_host, w->scratch_dev, (size_t)n * bytes,
                                   cudaMemcpyDeviceToHost, w->mp.util),
                   "cudaMemcpyAsync(exchange out)");
    TIDE_CHECK(util_wait(w, "an exchange"));
    memcpy(all_out, w->scratch_host, (size_t)n * bytes);
    return TIDE_SUCCESS;
}

tide_result_t tide_nccl_agree(tide_nccl_world_t *w, bool ok, bool *all_ok_out) {
    const int n = w->mp.base.ranks;
    int32_t mine = ok ? 1 : 0;
    int32_t *all = calloc((size_t)n, sizeof(*all));
    if (all == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "nccl fabric: %d ranks", n);
    tide_result_t res = tide_nccl_allgather(w, &mine, sizeof(mine), all);
    bool all_ok = true;
    for (int r = 0; r < n && res == TIDE_SUCCESS; ++r)
        all_ok = all_ok && all[r] == 1;
    free(all);
    if (res == TIDE_SUCCESS) *all_ok_out = all_ok;
    return res;
}

/* ------------------------------------------------------------------ worlds */

static void world_free(tide_nccl_world_t *w) {
    (void)cudaSetDevice(w->mp.device);
    /* On one node the calls run no NCCL work (copies and stream memory operations only); on
     * several the rail steps' NCCL work ended with the calls (arena destruction synced them).
     * An aborted exchange communicator is already gone.  After a fail-stop or a timeout a
     * peer may have died, and destruction may wait for it: abort instead. */
    __typeof__(w->lib->CommDestroy) release =
        w->calls_failed || w->aborted ? w->lib->CommAbort : w->lib->CommDestroy;
    tide_nccl_rails_destroy(w);
    if (w->node_comm != NULL) (void)release(w->node_comm);
    if (w->xchg_comm != NULL) (void)release(w->xchg_comm);
    if (w->world_comm != NULL) (void)release(w->world_comm);
    if (w->scratch_dev != NULL) cudaFree(w->scratch_dev);
    if (w->scratch_host != NULL) cudaFreeHost(w->scratch_host);
    (void)cudaGetLastError();
    tide_cuda_mp_world_release(&w->mp);
    free(w);
}

/* The node communicator and its LSA team: every rank of the node load/store reachable. */
static tide_result_t split_node(tide_nccl_world_t *w, ncclComm_t parent) {
    const tide_nccl_lib_t *lib = w->lib;
    const int rank = w->mp.base.rank, l = w->mp.base.gpus_per_node;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "tide-node";
    /* No SMs for NCCL's own collectives where it can avoid them (NCCL >= 2.28). */
    cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    TIDE_NCCL_CALL(lib, lib->CommSplit(parent, rank / l, rank, &w->node_comm, &cfg),
                   "ncclCommSplit(node communicator, NCCL_CTA_POLICY_ZERO)");
    if (w->node_comm == NULL)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "nccl fabric: rank %d got no node communicator", rank);
    int count = 0, node_rank = -1;
    TIDE_NCCL_CALL(lib, lib->CommCount(w->node_comm, &count), "ncclCommCount(node)");
    TIDE_NCCL_CALL(lib, lib->CommUserRank(w->node_comm, &node_rank), "ncclCommUserRank(node)");
    if (count != l || node_rank != rank % l)
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "nccl fabric: rank %d's node communicator has %d ranks (rank %d), "
                        "expected %d (rank %d)",
                        rank, count, node_rank, l, rank % l);
    const tide_nccl_team_t lsa = lib->TeamLsa(w->node_comm);
    if (lsa.nRanks != l || lsa.rank != node_rank || lsa.stride != 1)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "nccl fabric: rank %d: NCCL's LSA team of the node communicator has %d "
                        "ranks (this rank %d, stride %d), not all %d ranks of the node: the "
                        "GPUs of one node must reach each other by load/store (NVLink or PCIe "
                        "P2P with CUDA VMM)",
                        rank, lsa.nRanks, lsa.rank, lsa.stride, l);
    return TIDE_SUCCESS;
}

/* M > 1 only with TIDE_NCCL_RAILS=1.  Read before any NCCL call: every rank must see the same
 * value (a rank that refuses while the others go on would leave them in their first
 * collective call), as with any setting of the job. */
static tide_result_t rails_opt_in(int nodes) {
    const char *v = getenv("TIDE_NCCL_RAILS");
    if (v == NULL || v[0] == '\0' || strcmp(v, "0") == 0)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                        "nccl fabric: %d nodes: ranks on several nodes need the rail transport "
                        "(cross-node puts as grouped ncclSend / ncclRecv, or ncclPutSignal with "
                        "NCCL >= 2.29, on a rail communicator), which is experimental and has "
                        "never run on real nodes; set TIDE_NCCL_RAILS=1 on every rank to use it "
                        "(docs/nccl-fabric.md, \"Rails\")",
                        nodes);
    if (strcmp(v, "1") != 0)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "nccl fabric: TIDE_NCCL_RAILS=%s: expected 1 (rails on) or 0 / unset", v);
    return TIDE_SUCCESS;
}

/* The one-sided rails where this build saw the NCCL >= 2.29 headers and the loaded library
 * has their symbols, unless TIDE_NCCL_RAILS_PUT=0 asks for send/recv. */
static bool rails_put_wanted(const tide_nccl_world_t *w) {
#if TIDE_NCCL_HAVE_RMA
    const char *v = getenv("TIDE_NCCL_RAILS_PUT");
    if (v != NULL && strcmp(v, "0") == 0) return false;
    return w->lib->has_rma;
#else
    (void)w;
    return false;
#endif
}

tide_result_t tide_nccl_agreed(tide_nccl_world_t *w, tide_result_t local, const char *step) {
    bool all_ok = false;
    TIDE_CHECK(tide_nccl_agree(w, local == TIDE_SUCCESS, &all_ok));
    if (local != TIDE_SUCCESS) return local;
    if (!all_ok)
        return TIDE_ERR(TIDE_ERR_FABRIC, "nccl fabric: rank %d: another rank failed at %s",
                        w->mp.base.rank, step);
    return TIDE_SUCCESS;
}

static tide_result_t scratch_alloc(tide_nccl_world_t *w) {
    const size_t scratch = (size_t)w->mp.base.ranks * TIDE_NCCL_SCRATCH;
    TIDE_CUDA_CALL(cudaMalloc((void **)&w->scratch_dev, scratch), "cudaMalloc(scratch)");
    TIDE_CUDA_CALL(cudaMallocHost((void **)&w->scratch_host, scratch), "cudaMallocHost(scratch)");
    return TIDE_SUCCESS;
}

/* The world communicator from the unique id (collective over all N ranks). */
static tide_result_t init_world(tide_nccl_world_t *w, const void *unique_id) {
    ncclUniqueId id;
    memcpy(&id, unique_id, sizeof(id));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "tide-world";
    const ncclResult_t r =
        w->lib->CommInitRankConfig(&w->world_comm, w->mp.base.ranks, id, w->mp.base.rank, &cfg);
    if (r != ncclSuccess) {
        w->world_comm = NULL;
        return tide_nccl_error(w->lib, r, __FILE__, __LINE__, "ncclCommInitRankConfig(world)");
    }
    return TIDE_SUCCESS;
}

/* M > 1, after the local steps (result `pre`).  Every rank takes the same path through the
 * collective calls: the first one after the world communicator, the split of the exchange
 * communicator, is joined by a rank whose local steps failed too (NCCL_SPLIT_NOCOLOR), so
 * every other rank's exchange communicator lacks it and all fail at the rank-count check;
 * from then on each step that can fail on one rank is followed by a verdict over it. */
static tide_result_t create_nodes(tide_nccl_world_t *w, ncclComm_t parent, const void *unique_id,
                                  tide_result_t pre) {
    const tide_nccl_lib_t *lib = w->lib;
    const int n = w->mp.base.ranks, rank = w->mp.base.rank;
    if (parent == NULL) {
        /* A rank that failed locally still joins: its peers would wait in the init. */
        TIDE_CHECK(init_world(w, unique_id));
        parent = w->world_comm;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "tide-xchg";
    /* No CTA policy: its all-gathers cross nodes, where NCCL's copy-engine collectives (what
     * NCCL_CTA_POLICY_ZERO asks for) do not reach; they are a few bytes, off the calls. */
    const ncclResult_t sr = lib->CommSplit(parent, pre == TIDE_SUCCESS ? 0 : NCCL_SPLIT_NOCOLOR,
                                           rank, &w->xchg_comm, &cfg);
    if (pre != TIDE_SUCCESS) return pre;
    if (sr != ncclSuccess) {
        w->xchg_comm = NULL;
        return tide_nccl_error(lib, sr, __FILE__, __LINE__,
                               "ncclCommSplit(exchange communicator)");
    }
    if (w->xchg_comm == NULL)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "nccl fabric: rank %d got no exchange communicator",
                        rank);
    int count = 0, xrank = -1;
    TIDE_NCCL_CALL(lib, lib->CommCount(w->xchg_comm, &count), "ncclCommCount(exchange)");
    TIDE_NCCL_CALL(lib, lib->CommUserRank(w->xchg_comm, &xrank), "ncclCommUserRank(exchange)");
    /* Every rank that got here sees the same count: the same verdict everywhere. */
    if (count != n)
        return TIDE_ERR(TIDE_ERR_FABRIC,
                        "nccl fabric: rank %d: %d of %d ranks joined the exchange communicator: "
                        "the others failed before it (their own messages say why)",
                        rank, count, n);
    if (xrank != rank)
        return TIDE_ERR(TIDE_ERR_INTERNAL, "nccl fabric: rank %d is rank %d of the exchange "
                        "communicator", rank, xrank);
    /* The transport decides which communicators and windows exist: every rank must choose the
     * same (the library and TIDE_NCCL_RAILS_PUT could differ between hosts). */
    int32_t mine = rails_put_wanted(w) ? 1 : 0;
    int32_t *all = calloc((size_t)n, sizeof(*all));
    if (all == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "nccl fabric: %d ranks", n);
    tide_result_t res = tide_nccl_allgather(w, &mine, sizeof(mine), all);
    int differs = -1;
    for (int r = 0; r < n && res == TIDE_SUCCESS && differs < 0; ++r)
        if (all[r] != all[0]) differs = r;
    free(all);
    TIDE_CHECK(res);
    if (differs >= 0)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "nccl fabric: rank %d and rank 0 chose different rail transports "
                        "(ncclPutSignal needs NCCL >= 2.29 on every rank, and "
                        "TIDE_NCCL_RAILS_PUT the same everywhere)",
                        differs);
    w->rails_put = mine != 0;
    /* Both splits are joined by every rank; the rail split gets the node split's result, so
     * a rank that failed there joins it without a color. */
    const tide_result_t node = split_node(w, w->xchg_comm);
    TIDE_CHECK(tide_nccl_agreed(w, tide_nccl_rails_split(w, w->xchg_comm, node),
                      "the node and rail communicators"));
#if TIDE_NCCL_HAVE_RMA
    w->mp.rails = w->rails_put ? &tide_nccl_rails_put_ops : &tide_nccl_rails_ops;
#else
    w->mp.rails = &tide_nccl_rails_ops;
#endif
    return TIDE_SUCCESS;
}

tide_result_t tide_nccl_world_create(int nodes, int gpus_per_node, int rank, const void *unique_id,
                                     void *user_comm, struct tide_fabric_world **world_out) {
    const int n = nodes * gpus_per_node;
    /* Decided before any NCCL call, the same on every rank: nobody enters a collective the
     * others skip. */
    if (nodes > 1) TIDE_CHECK(rails_opt_in(nodes));
    const tide_nccl_lib_t *lib = NULL;
    TIDE_CHECK(tide_nccl_lib_get(&lib));
    ncclComm_t parent = (ncclComm_t)user_comm;
    if (parent != NULL) {
        int count = 0, dev = -1;
        TIDE_NCCL_CALL(lib, lib->CommCount(parent, &count), "ncclCommCount");
        if (count != n)
            return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                            "nccl fabric: the communicator has %d ranks, the topology %d x %d = "
                            "%d",
                            count, nodes, gpus_per_node, n);
        TIDE_NCCL_CALL(lib, lib->CommUserRank(parent, &rank), "ncclCommUserRank");
        TIDE_NCCL_CALL(lib, lib->CommCuDevice(parent, &dev), "ncclCommCuDevice");
        TIDE_CUDA_CALL(cudaSetDevice(dev), "cudaSetDevice(the communicator's device)");
    }
    tide_nccl_world_t *w = calloc(1, sizeof(*w));
    if (w == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "nccl fabric: world");
    w->lib = lib;
    w->mp.boot.listen_fd = -1; /* no socket bootstrap: NCCL's */
    w->mp.base.ops = &tide_fabric_nccl_ops;
    w->mp.base.rank = rank;
    w->mp.base.nodes = nodes;
    w->mp.base.gpus_per_node = gpus_per_node;
    w->mp.base.ranks = n;
    tide_result_t res = tide_cuda_mp_world_init(&w->mp);
    w->mp.transport = &tide_transport_nccl;
    if (nodes > 1) {
        if (res == TIDE_SUCCESS) res = scratch_alloc(w);
        TIDE_CHECK_GOTO(create_nodes(w, parent, unique_id, res), res, fail);
    } else {
        if (res != TIDE_SUCCESS) goto fail;
        if (parent == NULL) {
            TIDE_CHECK_GOTO(init_world(w, unique_id), res, fail);
            parent = w->world_comm;
        }
        TIDE_CHECK_GOTO(split_node(w, parent), res, fail);
        TIDE_CHECK_GOTO(scratch_alloc(w), res, fail);
    }
    TIDE_INFO("nccl fabric: rank %d of %d on device %d (%s)%s%s", rank, n, w->mp.device, lib->path,
              w->mp.rails != NULL ? ", rails: " : "",
              w->mp.rails != NULL ? w->mp.rails->name : "");
    *world_out = &w->mp.base;
    return TIDE_SUCCESS;
fail:
    world_free(w);
    return res;
}

static tide_result_t nccl_world_destroy(struct tide_fabric_world *world) {
    world_free((tide_nccl_world_t *)world);
    return TIDE_SUCCESS;
}

const struct tide_fabric_ops tide_fabric_nccl_ops = {
    .kind = TIDE_FABRIC_NCCL,
    .name = "nccl (created by tide_comm_init_nccl or tide_comm_init_nccl_comm)",
    /* The lane needs M >= 2, i.e. the rails; their mapping takes the lane's programs
     * (program/rails.h), and the execute is the CUDA mp fabric's. */
    .rail_lane = tide_cuda_mp_rail_lane,
    .world_create_all = NULL,
    .world_create_rank = NULL,
    .world_destroy = nccl_world_destroy,
    .arena_create = tide_nccl_arena_create,
    .arena_destroy = tide_nccl_arena_destroy,
    .arena_create_set = tide_nccl_arena_create_set,
    .arena_view_create = tide_cuda_mp_view_create,
    .execute = tide_cuda_mp_execute,
    .call_check = tide_nccl_call_check,
    /* Its calls run through the one-process-per-rank fabric's execute, whose capture checks
     * refuse the nccl transport (TIDE_CAPTURE_NO_FABRIC). */
    .capture_check = tide_cuda_mp_capture_check,
};
