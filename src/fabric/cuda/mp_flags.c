/*
 * mp_flags.c - where the one-process-per-rank fabric's signal flags live, and how a fail-stop
 * releases every device wait on them (docs/cuda-fabric.md, "Fail-stop").
 *
 * Host flags (the default, TIDE_CUDA_MP_FLAGS unset or "host").  Every rank's flag area is in
 * the group's control block (mp_ctl.h): host memory every process of the group maps.  Each
 * process registers its mapping with its device (cudaHostRegister, mapped), and its streams
 * signal (cuStreamWriteValue64) and wait (cuStreamWaitValue64) on the device addresses of
 * that memory.  The fail-stop's poison is then a plain CPU store (tide_mp_ctl_poison): it
 * cannot queue behind a blocked stream or hardware queue, and one rank's store releases the
 * waits of every process at once, whether or not its host is inside a TIDE call.
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
 * 0.26 ms (11%) off the reduce-scatter and 0.17 ms off the all-gather.  Host flags stay the
 * default for the fail-stop property above.
 *
 * Device flags (TIDE_CUDA_MP_FLAGS=device, and the NCCL fabric, whose arenas have no control
 * block).  The poison is an asynchronous memset on the utility stream: it releases the waits
 * when that stream gets to run, which a blocked hardware queue can delay.
 */
#include "core/checks.h"
#include "fabric/cuda/mp.h"

#include <stdlib.h>
#include <string.h>

tide_result_t tide_cuda_mp_env_flags(bool *host_out) {
    const char *e = getenv("TIDE_CUDA_MP_FLAGS");
    if (e == NULL || e[0] == '\0' || strcmp(e, "host") == 0) {
        *host_out = true;
        return TIDE_SUCCESS;
    }
    if (strcmp(e, "device") == 0) {
        *host_out = false;
        return TIDE_SUCCESS;
    }
    return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                    "cuda mp fabric: TIDE_CUDA_MP_FLAGS is \"%s\" (host or device)", e);
}

tide_result_t tide_cuda_mp_flags_map(tide_mp_arena_t *a) {
    tide_mp_ctl_t *c = &a->ctl;
    if (c->flags == NULL) return TIDE_SUCCESS; /* rank 0 chose device flags */
    /* Every flag area of a rank (1 + one per view of a set: mp_view.c) is in its share. */
    if (c->flag_bytes < tide_cuda_mp_flag_bytes(a))
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
    const int n = a->w->base.ranks;
    for (int r = 0; r < n; ++r)
        a->flags[r] = (uint8_t *)dev + (tide_mp_ctl_flags(c, r) - (uint8_t *)c->hdr);
    a->host_flags = true;
    return TIDE_SUCCESS;
}

tide_result_t tide_cuda_mp_flags_began(tide_mp_arena_t *a, int f, uint64_t epoch, cudaStream_t s) {
    /* Only a block the device maps (a view's own block is not) and only the two families it
     * counts (a view's fences are not counted). */
    if (!a->host_flags || f > 1) return TIDE_SUCCESS;
    tide_mp_ctl_t *c = &a->ctl;
    /* The block's device address, from rank 0's flag area (mapped at flags[0]). */
    const uint8_t *dev =
        (const uint8_t *)a->flags[0] - (tide_mp_ctl_flags(c, 0) - (uint8_t *)c->hdr);
    const uint8_t *host = (const uint8_t *)&c->began[f * c->ranks + c->rank];
    const CUdeviceptr addr = (CUdeviceptr)(uintptr_t)(dev + (host - (const uint8_t *)c->hdr));
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
    a->host_flags = false;
}

void tide_cuda_mp_flags_poison(tide_mp_arena_t *a) {
    /* Every flag area of the set's segments (a view's siblings wait on theirs: mp_view.c). */
    tide_mp_arena_t *s = tide_cuda_mp_set_of(a);
    if (s->host_flags) {
        tide_mp_ctl_poison(&s->ctl, TIDE_MP_POISON);
        return;
    }
    const int n = a->w->base.ranks;
    const uint64_t bytes = tide_cuda_mp_flag_bytes(a);
    /* The high half of every 8-byte flag: 0x40000000 << 32 = 2^62. */
    for (int r = 0; r < n; ++r)
        if (s->flags[r] != NULL) /* every flag mapped here: a rail transport may wait on any */
            cuMemsetD2D32Async((CUdeviceptr)(uintptr_t)(s->flags[r] + 4), 8, 0x40000000u, 1,
                               (size_t)(bytes / 8), (CUstream)a->w->util);
    (void)cudaGetLastError();
}
