/*
 * world.c - the CUDA fabric's communicators and the provider vtable.
 *
 * One process drives all N ranks (tide_comm_init_all): rank r runs on visible device
 * r mod D, D = min(visible devices, N), so a 2 x 4 topology runs on one GPU as 8 virtual
 * ranks.  With several devices, peer access is enabled between every pair (the landing kernel
 * reads other devices' inboxes through peer pointers).  One process per rank
 * (tide_comm_init_rank) is the mp fabric (mp.h, mp_world.c): its worlds carry their own ops.
 *
 * Streams are created once per world: one non-blocking stream per (rank, queue) up to
 * TIDE_CUDA_STREAMS per device (default 64), beyond which pairs share streams round-robin;
 * one utility stream per device for allocation-time zeroing and table uploads; one
 * aggregation stream on device 0 for the per-call fences (execute.c).
 */
#include "core/checks.h"
#include "fabric/cuda/cuda.h"
#include "fabric/cuda/graph.h"
#include "fabric/cuda/mp.h"

#include <stdlib.h>
#include <string.h>

tide_result_t tide_cuda_error(cudaError_t err, const char *file, int line, const char *what) {
    /* Non-sticky errors stay in the runtime's last-error slot; clear it so that the next
     * successful call is not blamed for this one. */
    (void)cudaGetLastError();
    return tide_error_set(TIDE_ERR_FABRIC, file, line, "cuda fabric: %s: %s (%s)", what,
                          cudaGetErrorName(err), cudaGetErrorString(err));
}

static int streams_per_device(void) {
    const char *env = getenv("TIDE_CUDA_STREAMS");
    if (env != NULL && *env != '\0') {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (end != env && *end == '\0' && v >= 1 && v <= 1024) return (int)v;
    }
    return TIDE_CUDA_STREAMS_DEFAULT;
}

/* TIDE_CUDA_BATCH=0 keeps every copy on cudaMemcpyAsync (the per-op path); anything else
 * (default) runs each run of same-device copies below TIDE_CUDA_BATCH_MAX_BYTES as one
 * batched copy kernel (batch.c). */
bool tide_cuda_env_batch(void) {
    const char *env = getenv("TIDE_CUDA_BATCH");
    return env == NULL || strcmp(env, "0") != 0;
}

/* TIDE_CUDA_BATCH_MAX_BYTES: same-device copies of at least this many bytes stay on
 * cudaMemcpyAsync (batch.c).  Unset or empty: TIDE_CUDA_BATCH_MAX_BYTES_DEFAULT.  Otherwise
 * decimal digits, optionally followed by K, M or G (KiB, MiB, GiB); 0 means no threshold
 * (every same-device copy may join a batch; TIDE_CUDA_BATCH=0 is the all-per-op mode).  Any
 * other value is refused rather than ignored: a typo would otherwise silently measure the
 * default. */
/* TIDE_CUDA_DIRECT: the single-device shortcuts a world whose nodes each live on one device
 * takes (direct.c): a mask of TIDE_CUDA_DIRECT_SUM (1), _ZERO (2), _ALIAS (4) and _FUSE (8);
 * unset, empty or not a number in [0, 15]: 7 (all but FUSE).  0 runs every copy and reads
 * every input. */
static int direct_enabled(void) {
    const char *env = getenv("TIDE_CUDA_DIRECT");
    if (env == NULL || env[0] == '\0') return TIDE_CUDA_DIRECT_DEFAULT;
    char *end;
    const long v = strtol(env, &end, 10);
    if (*end != '\0' || v < 0 || v > TIDE_CUDA_DIRECT_ALL) return TIDE_CUDA_DIRECT_DEFAULT;
    return (int)v;
}

tide_result_t tide_cuda_env_batch_max_bytes(uint64_t *out) {
    const char *env = getenv("TIDE_CUDA_BATCH_MAX_BYTES");
    if (env == NULL || *env == '\0') {
        *out = TIDE_CUDA_BATCH_MAX_BYTES_DEFAULT;
        return TIDE_SUCCESS;
    }
    uint64_t v = 0;
    const char *p = env;
    bool ok = *p >= '0' && *p <= '9';
    for (; ok && *p >= '0' && *p <= '9'; ++p)
        ok = tide_mul_u64(v, 10, &v) && tide_add_u64(v, (uint64_t)(*p - '0'), &v);
    if (ok && *p != '\0') {
        const char u = *p++;
        const uint64_t unit = u == 'K' || u == 'k'   ? (uint64_t)1 << 10
                              : u == 'M' || u == 'm' ? (uint64_t)1 << 20
                              : u == 'G' || u == 'g' ? (uint64_t)1 << 30
                                                     : 0;
        ok = unit != 0 && *p == '\0' && tide_mul_u64(v, unit, &v);
    }
    if (!ok)
        return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                        "cuda fabric: TIDE_CUDA_BATCH_MAX_BYTES=\"%.64s\" is not a byte count "
                        "(decimal digits, optionally followed by K, M or G; 0: no threshold; "
                        "unset: %llu)",
                        env, (unsigned long long)TIDE_CUDA_BATCH_MAX_BYTES_DEFAULT);
    *out = v;
    return TIDE_SUCCESS;
}

/* Release whatever was created; tolerates a partly built world. */
static void shared_destroy(tide_cuda_shared_t *sh) {
    if (sh == NULL) return;
    const int n = sh->ranks;
    for (int i = 0; i < sh->pool_size; ++i)
        if (sh->pool != NULL && sh->pool[i] != NULL) cudaStreamDestroy(sh->pool[i]);
    for (int d = 0; d < sh->num_devices; ++d)
        if (sh->util != NULL && sh->util[d] != NULL) cudaStreamDestroy(sh->util[d]);
    if (sh->agg != NULL) cudaStreamDestroy(sh->agg);
    for (int r = 0; r < n; ++r) {
        if (sh->start != NULL && sh->start[r] != NULL) cudaEventDestroy(sh->start[r]);
        if (sh->done != NULL && sh->done[r] != NULL) cudaEventDestroy(sh->done[r]);
    }
    for (int t = 0; t < n * TIDE_CUDA_Q; ++t)
        if (sh->end != NULL && sh->end[t] != NULL) cudaEventDestroy(sh->end[t]);
    (void)cudaGetLastError();
    pthread_cond_destroy(&sh->cond);
    pthread_mutex_destroy(&sh->lock);
    free(sh->end);
    free(sh->done);
    free(sh->start);
    free(sh->util);
    free(sh->stream);
    free(sh->pool);
    free(sh->max_pitch);
    free(sh->sm_count);
    free(sh);
}

/* Device attributes and peer access between every pair of used devices. */
static tide_result_t devices_init(tide_cuda_shared_t *sh) {
    const int nd = sh->num_devices;
    for (int d = 0; d < nd; ++d) {
        int sms = 0, pitch = 0;
        TIDE_CUDA_CALL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d),
                       "cudaDeviceGetAttribute(multiprocessors)");
        TIDE_CUDA_CALL(cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, d),
                       "cudaDeviceGetAttribute(max pitch)");
        sh->sm_count[d] = sms > 0 ? sms : 1;
        sh->max_pitch[d] = pitch > 0 ? (size_t)pitch : 0;
    }
    for (int i = 0; i < nd; ++i)
        for (int j = 0; j < nd; ++j) {
            if (i == j) continue;
            int ok = 0;
            TIDE_CUDA_CALL(cudaDeviceCanAccessPeer(&ok, i, j), "cudaDeviceCanAccessPeer");
            if (!ok)
                return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                                "cuda fabric: device %d cannot access device %d (no peer "
                                "access); restrict CUDA_VISIBLE_DEVICES to peer-capable GPUs",
                                i, j);
            TIDE_CUDA_CALL(cudaSetDevice(i), "cudaSetDevice");
            cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled)
                (void)cudaGetLastError();
            else if (e != cudaSuccess)
                return tide_cuda_error(e, __FILE__, __LINE__, "cudaDeviceEnablePeerAccess");
        }
    return TIDE_SUCCESS;
}

/* Streams and the per-rank events of the call protocol. */
static tide_result_t streams_init(tide_cuda_shared_t *sh) {
    const int n = sh->ranks, nd = sh->num_devices, cap = streams_per_device();
    int total = 0;
    for (int d = 0; d < nd; ++d) {
        const int threads = (n - d + nd - 1) / nd * TIDE_CUDA_Q;
        total += threads < cap ? threads : cap;
    }
    sh->pool = calloc((size_t)total, sizeof(*sh->pool));
    if (sh->pool == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: %d streams", total);
    for (int d = 0; d < nd; ++d) {
        const int threads = (n - d + nd - 1) / nd * TIDE_CUDA_Q;
        const int count = threads < cap ? threads : cap, first = sh->pool_size;
        TIDE_CUDA_CALL(cudaSetDevice(d), "cudaSetDevice");
        for (int i = 0; i < count; ++i) {
            TIDE_CUDA_CALL(cudaStreamCreateWithFlags(&sh->pool[first + i], cudaStreamNonBlocking),
                           "cudaStreamCreateWithFlags");
            ++sh->pool_size;
        }
        /* Rank r is the (r / nd)-th rank of device d = r mod nd. */
        for (int r = d; r < n; r += nd)
            for (int q = 0; q < TIDE_CUDA_Q; ++q)
                sh->stream[r * TIDE_CUDA_Q + q] =
                    sh->pool[first + ((r / nd) * TIDE_CUDA_Q + q) % count];
        TIDE_CUDA_CALL(cudaStreamCreateWithFlags(&sh->util[d], cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags");
    }
    for (int r = 0; r < n; ++r) {
        TIDE_CUDA_CALL(cudaSetDevice(tide_cuda_device_of(sh, r)), "cudaSetDevice");
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&sh->start[r], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
        TIDE_CUDA_CALL(cudaEventCreateWithFlags(&sh->done[r], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
        for (int q = 0; q < TIDE_CUDA_Q; ++q)
            TIDE_CUDA_CALL(
                cudaEventCreateWithFlags(&sh->end[r * TIDE_CUDA_Q + q], cudaEventDisableTiming),
                "cudaEventCreateWithFlags");
    }
    TIDE_CUDA_CALL(cudaSetDevice(0), "cudaSetDevice");
    TIDE_CUDA_CALL(cudaStreamCreateWithFlags(&sh->agg, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags");
    return TIDE_SUCCESS;
}

static tide_result_t shared_create(int n, tide_cuda_shared_t **out) {
    uint64_t max_bytes = 0;
    tide_cuda_slicing_t slicing;
    TIDE_CHECK(tide_cuda_env_batch_max_bytes(&max_bytes));
    TIDE_CHECK(tide_cuda_env_slicing(&slicing));
    int unroll = 0, streaming = 0;
    TIDE_CHECK(tide_fabric_batch_kernel_env(TIDE_CUDA_BATCH_UNROLL, TIDE_CUDA_BATCH_STREAMING,
                                            &unroll, &streaming));
    int visible = 0;
    cudaError_t e = cudaGetDeviceCount(&visible);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
        (e == cudaSuccess && visible < 1)) {
        (void)cudaGetLastError();
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "cuda fabric: no usable CUDA device (%s)",
                        e == cudaSuccess ? "none visible" : cudaGetErrorString(e));
    }
    if (e != cudaSuccess) return tide_cuda_error(e, __FILE__, __LINE__, "cudaGetDeviceCount");

    tide_cuda_shared_t *sh = calloc(1, sizeof(*sh));
    if (sh == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: out of host memory");
    if (pthread_mutex_init(&sh->lock, NULL) != 0) {
        free(sh);
        return TIDE_ERR(TIDE_ERR_FABRIC, "cuda fabric: pthread_mutex_init failed");
    }
    if (pthread_cond_init(&sh->cond, NULL) != 0) {
        pthread_mutex_destroy(&sh->lock);
        free(sh);
        return TIDE_ERR(TIDE_ERR_FABRIC, "cuda fabric: pthread_cond_init failed");
    }
    sh->ranks = n;
    sh->batch = tide_cuda_env_batch();
    sh->direct = direct_enabled();
    sh->batch_max_bytes = max_bytes;
    sh->batch_unroll = unroll;
    sh->batch_streaming = streaming;
    sh->slicing = slicing;
    sh->num_devices = visible < n ? visible : n;
    sh->sm_count = calloc((size_t)sh->num_devices, sizeof(*sh->sm_count));
    sh->max_pitch = calloc((size_t)sh->num_devices, sizeof(*sh->max_pitch));
    sh->util = calloc((size_t)sh->num_devices, sizeof(*sh->util));
    sh->stream = calloc((size_t)n * TIDE_CUDA_Q, sizeof(*sh->stream));
    sh->start = calloc((size_t)n, sizeof(*sh->start));
    sh->done = calloc((size_t)n, sizeof(*sh->done));
    sh->end = calloc((size_t)n * TIDE_CUDA_Q, sizeof(*sh->end));
    tide_result_t res;
    if (sh->sm_count == NULL || sh->max_pitch == NULL || sh->util == NULL || sh->stream == NULL ||
        sh->start == NULL || sh->done == NULL || sh->end == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: out of host memory for %d ranks", n);
        goto fail;
    }
    TIDE_CHECK_GOTO(devices_init(sh), res, fail);
    TIDE_CHECK_GOTO(streams_init(sh), res, fail);
    *out = sh;
    return TIDE_SUCCESS;
fail:
    shared_destroy(sh);
    return res;
}

static const struct tide_fabric_ops *cuda_ops(void);

static tide_result_t cuda_world_create_all(int nodes, int gpus_per_node,
                                           struct tide_fabric_world **worlds_out) {
    const int n = nodes * gpus_per_node;
    int prev_device = -1;
    if (cudaGetDevice(&prev_device) != cudaSuccess) {
        (void)cudaGetLastError();
        prev_device = -1;
    }
    tide_cuda_shared_t *sh = NULL;
    tide_result_t res = shared_create(n, &sh);
    if (prev_device >= 0) (void)cudaSetDevice(prev_device);
    if (res != TIDE_SUCCESS) return res;

    tide_cuda_world_t *w = calloc((size_t)n, sizeof(*w));
    if (w == NULL) {
        shared_destroy(sh);
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda fabric: out of host memory for %d ranks", n);
    }
    sh->refs = n;
    /* One allocation for the N handles: the last world_destroy frees it through rank 0's. */
    for (int r = 0; r < n; ++r) {
        w[r].base.ops = cuda_ops();
        w[r].base.rank = r;
        w[r].base.nodes = nodes;
        w[r].base.gpus_per_node = gpus_per_node;
        w[r].base.ranks = n;
        w[r].shared = sh;
        worlds_out[r] = &w[r].base;
    }
    return TIDE_SUCCESS;
}

/* One process per rank: the world carries the mp fabric's ops (mp.h), which core uses for
 * everything after this call. */
static tide_result_t cuda_world_create_rank(int nodes, int gpus_per_node, int rank,
                                            const char *name, struct tide_fabric_world **out) {
    return tide_cuda_mp_world_create(nodes, gpus_per_node, rank, name, out);
}

static tide_result_t cuda_world_destroy(struct tide_fabric_world *world) {
    tide_cuda_world_t *w = (tide_cuda_world_t *)world;
    tide_cuda_shared_t *sh = w->shared;
    pthread_mutex_lock(&sh->lock);
    const bool last = --sh->refs == 0;
    pthread_mutex_unlock(&sh->lock);
    if (last) {
        free(w - w->base.rank);
        shared_destroy(sh);
    }
    return TIDE_SUCCESS;
}

int tide_cuda_world_device(const struct tide_fabric_world *world) {
    const tide_cuda_world_t *w = (const tide_cuda_world_t *)world;
    return tide_cuda_device_of(w->shared, world->rank);
}

static bool cuda_rail_lane(const struct tide_fabric_world *world) {
    (void)world;
    return true;
}

const struct tide_fabric_ops tide_fabric_cuda_ops = {
    .kind = TIDE_FABRIC_CUDA,
    .name = "cuda",
    /* One process drives every rank: the lane's puts and bf16 landings are plain ops of the
     * executor (land.cu's bf16-input kernel), checked against the cpu fabric by
     * test_fabric_cuda's 3x1 and 1x2 topologies.  Direct mode leaves lane programs whole
     * (src/program/direct.c). */
    .rail_lane = cuda_rail_lane,
    .world_create_all = cuda_world_create_all,
    .world_create_rank = cuda_world_create_rank,
    .world_destroy = cuda_world_destroy,
    .arena_create = tide_cuda_arena_create,
    .arena_destroy = tide_cuda_arena_destroy,
    .arena_view_create = tide_cuda_arena_view_create,
    .execute = tide_cuda_execute,
    .call_check = tide_cuda_call_compare,
    .capture_check = tide_cuda_capture_check,
};

static const struct tide_fabric_ops *cuda_ops(void) {
    return &tide_fabric_cuda_ops;
}
