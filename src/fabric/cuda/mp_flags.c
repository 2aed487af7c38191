/*
 * mp_flags.c - where the one-process-per-rank fabric's signal flags live, what a device wait
 * on them is, and how a fail-stop releases every such wait (docs/cuda-fabric.md,
 * "Fail-stop").  Three placements, TIDE_CUDA_MP_FLAGS, rank 0's choice for the group (every
 * rank takes it at world creation, mp_agree.c, and the control block rank 0 creates carries
 * it, mp_ctl.h):
 *
 * Host flags ("host").  Every rank's flag area is in the group's control block (mp_ctl.h): host
 * memory every process of the group maps.  Each process registers its mapping with its device
 * (cudaHostRegister, mapped), and its streams signal (cuStreamWriteValue64) and wait
 * (cuStreamWaitValue64) on the device addresses of that memory.  The fail-stop's poison is then
 * a plain CPU store (tide_mp_ctl_poison): it cannot queue behind a blocked stream or hardware
 * queue, and one rank's store releases the waits of every process at once, whether or not its
 * host is inside a TIDE call.
 *
 * The cost: every signal is a device write to host memory over PCIe (posted, about a
 * microsecond until visible, behind a system-scope fence instead of a device-scope one), and
 * every wait polls host memory over PCIe instead of device memory, so a wait ends about one
 * PCIe round trip (1-2 us) after its flag was written instead of a few hundred ns.  A call
 * has a few tens of such waits per rank on its critical path at most (the enqueue figures in
 * docs/cuda-fabric.md: 50 stream operations per rank per call at P = 30, M = 8, most of them
 * not on the critical path), so the added latency is some tens of microseconds per call at
 * worst, by that count.  Measured (bench/results/h100-2026-12-06g, a 386 MiB layer at N = 8
 * processes under MPS on one H100) it is more: device flags (TIDE_CUDA_MP_FLAGS=device) take
 * 0.26 ms (11%) off the reduce-scatter and 0.17 ms off the all-gather.
 *
 * Device flags ("device", and the NCCL fabric, whose arenas have no control block).  The
 * flags stay behind each rank's arena in its device segment; signals and waits are the same
 * stream memory operations on them.  The poison is an asynchronous memset on the utility
 * stream: it releases the waits when that stream gets to run, which a blocked hardware queue
 * can delay.
 *
 * Kernel waits (the default, unset or "kernel").  The flags stay in the device segments and
 * signals are the same cuStreamWriteValue64, but every wait and fence is a one-thread wait
 * kernel (the captured calls' kernel, mp_graph_kernels.h) that spins on the device flags with
 * system-scope acquire loads and, every 32 spins, reads the group's abort word in the control
 * block, which every process registers with its device for that (mp_ctl.h, "Polled abort
 * word").  The abort word is published before any poison, so its CPU store (tide_mp_ctl_abort:
 * by a failing caller, or the watchdog at TIDE_TIMEOUT_MS) is itself the release: every wait
 * kernel of every process returns within a few microseconds of it, whatever the hardware queues
 * hold.  The device poison of "device" is still written (harmless, and it releases the
 * memory-op waits of anything outside these entries).  What it costs: a kernel launch per wait
 * instead of a stream memory operation (a run of waits is one launch: tide_cuda_mp_wait_runs),
 * an SM slot per spinning wait (one thread each; nothing in the fabric needs its kernels
 * co-resident, so a waiter never keeps the work it waits for off the GPU), and one PCIe read of
 * the abort word per 32 spins.  Measured on one H100 under MPS (386 MiB layer,
 * bench/results/h100-2026-12-07c): as fast as host flags or faster at N = 2, 4 and 8 (AG 80.0 /
 * 82.4 / 84.0% of the HBM roofline against 79.8 / 82.0 / 82.6%); before runs were batched and
 * implied start fences left out they were the slowest of the three (N = 8 RS 2.207 ms against
 * 2.111 host and 2.010 device, bench/results/h100-2026-12-06h).  So they are the default: the
 * fail-stop of host flags (a CPU store releases every wait) near the speed of device flags.
 *
 * "auto".  Where kernel waits cost is processes that time-share one GPU without MPS: a
 * spinning wait kernel keeps its process's time slice until the slice ends, while the rank it
 * waits for cannot run.  Measured time-sliced on one H100 (bench/results/h100-2026-12-07e,
 * the same layer), host flags took the all-gather from 4.55 to 2.53 ms at N = 2 and from 19.1
 * to 4.48 ms at N = 8, the reduce-scatter from 4.70 to 2.85 and from 32.2 to 21.5 ms.  With
 * "auto" each world asks at creation (tide_cuda_mp_flags_resolve) whether two of its ranks
 * share a device without both being MPS clients (CU_DEVICE_ATTRIBUTE_MPS_ENABLED): then host
 * flags, else kernel waits.  It is not the default yet: the one GPU-suite run with it as
 * the default (h100-2026-12-07e, call 3) had five failures at world creation (ranks that did
 * not join within the tests' 3 s, CUDA contexts that could not be created) under three tests
 * at a time, against one such failure in the run before it, and no device time was left to
 * tell whether the placement or the load caused them.
 *
 * Which waits: the ipc transport's waits and fences (ipc.c), a view's sibling fence
 * (mp_view.c) and the emulated rail transport's waits (mp_rails.c) all go through
 * tide_cuda_mp_flags_wait.  A captured call keeps its own wait kernels (graph.c), bounded by
 * their timeout and released by the poison.
 */
#include "core/checks.h"
#include "fabric/cuda/mp.h"

#include "fabric/cuda/mp_graph_kernels.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* cuStreamBatchMemOp takes at most this many operations per call (a safe bound). */
#define MEMOP_BATCH 128

tide_result_t tide_cuda_mp_env_flags(int *flags_out) {
    /* The first is the default (unset or empty). */
    static const char *const values[] = {"kernel", "auto", "host", "device"};
    static const int flags[] = {TIDE_MP_FLAGS_KERNEL, TIDE_MP_FLAGS_AUTO, TIDE_MP_FLAGS_HOST,
                                TIDE_MP_FLAGS_DEVICE};
    int i = 0;
    TIDE_CHECK(tide_fabric_env_choice("TIDE_CUDA_MP_FLAGS", values, 4, &i));
    *flags_out = flags[i];
    return TIDE_SUCCESS;
}

bool tide_cuda_mp_device_mps(int device) {
#if CUDA_VERSION >= 12060
    CUdevice d;
    int v = 0;
    if (cuDeviceGet(&d, device) == CUDA_SUCCESS &&
        cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, d) == CUDA_SUCCESS)
        return v != 0;
#else
    (void)device;
#endif
    return false;
}

void tide_cuda_mp_flags_resolve(tide_mp_world_t *w, int shared, int timeshared) {
    if (w->flags != TIDE_MP_FLAGS_AUTO) return;
    w->flags = timeshared >= 0 ? TIDE_MP_FLAGS_HOST : TIDE_MP_FLAGS_KERNEL;
    if (w->base.rank == 0)
        TIDE_INFO("cuda mp fabric: TIDE_CUDA_MP_FLAGS=auto: %s (%s)",
                  w->flags == TIDE_MP_FLAGS_HOST ? "host flags" : "kernel waits",
                  timeshared >= 0 ? "ranks time-share a device without MPS"
                  : shared >= 0   ? "ranks share a device through MPS"
                                  : "every rank on a device of its own");
}

tide_result_t tide_cuda_mp_flags_map(tide_mp_arena_t *a) {
    tide_mp_ctl_t *c = &a->ctl;
    if (!tide_mp_ctl_device_mapped(c)) return TIDE_SUCCESS; /* rank 0 chose device flags */
    /* Every flag area of a rank (1 + one per view of a set: mp_view.c) is in its share. */
    if (c->flags != NULL && c->flag_bytes < tide_cuda_mp_flag_bytes(a))
        return TIDE_ERR(TIDE_ERR_INTERNAL,
                        "cuda mp fabric: the control block has %zu bytes of flags per rank, a "
                        "rank needs %llu",
                        c->flag_bytes, (unsigned long long)tide_cuda_mp_flag_bytes(a));
    /* Portable: every context of the process may use it; mapped: the device gets an address. */
    TIDE_CUDA_CALL(
        cudaHostRegister(c->hdr, c->bytes, cudaHostRegisterMapped | cudaHostRegisterPortable),
        "cudaHostRegister(control block)");
    a->ctl_registered = true;
    void *dev = NULL;
    TIDE_CUDA_CALL(cudaHostGetDevicePointer(&dev, c->hdr, 0), "cudaHostGetDevicePointer");
    a->ctl_dev = dev;
    if (c->abort_polled) {
        /* Kernel waits: the flags stay in the segments (flags[] as segments_create set it). */
        a->abort_dev =
            (const uint32_t *)(const void *)(a->ctl_dev + offsetof(tide_mp_ctl_hdr_t, abort));
        return TIDE_SUCCESS;
    }
    const int n = a->w->base.ranks;
    for (int r = 0; r < n; ++r)
        a->flags[r] = a->ctl_dev + (tide_mp_ctl_flags(c, r) - (uint8_t *)c->hdr);
    a->host_flags = true;
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_flags_began(tide_mp_arena_t *a, int f, uint64_t epoch, cudaStream_t s) {
    /* Only a block the device maps (a view's own block is not) and only the two families it
     * counts (a view's fences are not counted). */
    if (a->ctl_dev == NULL || f > 1) return TIDE_SUCCESS;
    tide_mp_ctl_t *c = &a->ctl;
    const uint8_t *host = (const uint8_t *)&c->began[f * c->ranks + c->rank];
    const CUdeviceptr addr =
        (CUdeviceptr)(uintptr_t)(a->ctl_dev + (host - (const uint8_t *)c->hdr));
    /* A plain write: CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER would do (nothing needs ordering
     * before it), but the v2 stream memory operations that cuStreamWriteValue64 resolves to
     * since CUDA 12 refuse that flag with CUDA_ERROR_INVALID_VALUE. */
    const CUresult e =
        cuStreamWriteValue64((CUstream)s, addr, epoch + 1, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (e == CUDA_SUCCESS) return TIDE_SUCCESS;
    const char *name = NULL;
    cuGetErrorName(e, &name);
    return TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp fabric: cuStreamWriteValue64(began): %s",
                    name ? name : "?");
}

void tide_cuda_mp_flags_unmap(tide_mp_arena_t *a) {
    if (a->ctl_registered) {
        (void)cudaHostUnregister(a->ctl.hdr);
        (void)cudaGetLastError();
    }
    a->ctl_registered = false;
    a->ctl_dev = NULL;
    a->abort_dev = NULL;
    a->host_flags = false;
}

void tide_cuda_mp_flags_poison(tide_mp_arena_t *a) {
    /* Every flag area of the set's segments (a view's siblings wait on theirs: mp_view.c). */
    tide_mp_arena_t *s = tide_cuda_mp_set_of(a);
    if (s->host_flags) {
        tide_mp_ctl_poison(&s->ctl, TIDE_MP_POISON);
        return;
    }
    /* Device flags, and kernel waits (whose release is the abort word itself: this memset
     * only spares them the spins and releases any memory-op wait on these flags). */
    const int n = a->w->base.ranks;
    const uint64_t bytes = tide_cuda_mp_flag_bytes(a);
    /* The high half of every 8-byte flag: 0x40000000 << 32 = 2^62. */
    for (int r = 0; r < n; ++r)
        if (s->flags[r] != NULL) /* every flag mapped here: a rail transport may wait on any */
            cuMemsetD2D32Async((CUdeviceptr)(uintptr_t)(s->flags[r] + 4), 8, 0x40000000u, 1,
                               (size_t)(bytes / 8), (CUstream)a->w->util);
    (void)cudaGetLastError();
}

static tide_result_t cu_failed(CUresult e, const char *what) {
    const char *name = NULL;
    cuGetErrorName(e, &name);
    return TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp fabric: %s: %s", what, name ? name : "?");
}

/* Kernel waits: one wait kernel per TIDE_MP_GRAPH_WAIT_MAX flags, the value fixed at enqueue
 * (num NULL), no error word (the host reports the call: it sees the abort first), no device
 * timeout (the watchdog publishes the abort at TIDE_TIMEOUT_MS, which ends the kernel). */
static tide_result_t wait_kernels(const uint32_t *abort_word, cudaStream_t s,
                                  const CUdeviceptr *flag, int count, uint64_t value) {
    tide_mp_graph_wait_t w;
    memset(&w, 0, sizeof(w));
    w.abort = abort_word;
    w.delta = (int64_t)value;
    w.timeout_ns = TIDE_MP_GRAPH_NO_TIMEOUT;
    w.slot = -1;
    for (int i = 0; i < count; i += TIDE_MP_GRAPH_WAIT_MAX) {
        w.count = count - i < TIDE_MP_GRAPH_WAIT_MAX ? count - i : TIDE_MP_GRAPH_WAIT_MAX;
        for (int k = 0; k < w.count; ++k) {
            w.rank[k] = -1;
            w.flag[k] = (uint64_t)flag[i + k];
        }
        const cudaError_t e = tide_mp_graph_wait(&w, s);
        if (e != cudaSuccess) return tide_cuda_error(e, __FILE__, __LINE__, "wait kernel");
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_flags_wait(tide_mp_arena_t *a, cudaStream_t s, const CUdeviceptr *flag,
                                      int count, uint64_t value, tide_cuda_stats_t *st) {
    if (count <= 0) return TIDE_SUCCESS;
    /* The set's word: a view waits on the set's segments and fails with the set (mp_view.c). */
    const uint32_t *abort_word = tide_cuda_mp_set_of(a)->abort_dev;
    const int per_call = abort_word != NULL ? TIDE_MP_GRAPH_WAIT_MAX : MEMOP_BATCH;
    if (st != NULL) {
        st->waits += (uint64_t)count;
        st->wait_calls += (uint64_t)((count + per_call - 1) / per_call);
    }
    if (abort_word != NULL) return wait_kernels(abort_word, s, flag, count, value);
    if (count == 1) {
        const CUresult e =
            cuStreamWaitValue64((CUstream)s, flag[0], value, CU_STREAM_WAIT_VALUE_GEQ);
        return e == CUDA_SUCCESS ? TIDE_SUCCESS : cu_failed(e, "cuStreamWaitValue64");
    }
    CUstreamBatchMemOpParams ops[MEMOP_BATCH];
    for (int i = 0; i < count; i += MEMOP_BATCH) {
        const int k = count - i < MEMOP_BATCH ? count - i : MEMOP_BATCH;
        memset(ops, 0, (size_t)k * sizeof(ops[0]));
        for (int j = 0; j < k; ++j) {
            ops[j].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
            ops[j].waitValue.address = flag[i + j];
            ops[j].waitValue.value64 = value;
            ops[j].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
        }
        const CUresult e = cuStreamBatchMemOp((CUstream)s, (unsigned)k, ops, 0);
        if (e != CUDA_SUCCESS) return cu_failed(e, "cuStreamBatchMemOp(wait)");
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_wait_runs(const tide_mp_prepared_t *pp, const tide_sched_cmd_t *cmds,
                                     int n, uint8_t **defer_out) {
    *defer_out = NULL;
    bool on = true;
    TIDE_CHECK(tide_fabric_wait_runs_env(&on));
    if (!on) return TIDE_SUCCESS;
    uint8_t *d = malloc((size_t)n + 1);
    if (d == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp fabric: runs of %d commands", n);
    const tide_result_t res = tide_sched_wait_runs(cmds, n, pp->sched.num_threads, d, NULL);
    if (res != TIDE_SUCCESS) {
        free(d);
        return res;
    }
    *defer_out = d;
    return TIDE_SUCCESS;
}
