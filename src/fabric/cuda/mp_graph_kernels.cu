/*
 * mp_graph_kernels.cu - the counter, signal and wait kernels of captured calls on the
 * one-process-per-rank CUDA fabric (mp_graph_kernels.h).
 *
 * Each is one thread: a signal or a wait is a point in its stream, not work.  Flags are read
 * with system-scope acquire loads and written with system-scope release stores after a
 * system-scope fence, the order cuStreamWriteValue64 / cuStreamWaitValue64 give the eager
 * call: a peer that sees the value sees what the stream did before it (the kernels and copies
 * before a signal kernel completed before it started), and what follows a wait sees what the
 * peer did before its signal.  Flags live in host memory every process maps, or in the peers'
 * mapped segments (TIDE_CUDA_MP_FLAGS=device or kernel): both are plain global addresses here.
 * The wait kernel also carries the eager waits of TIDE_CUDA_MP_FLAGS=kernel (num, err NULL;
 * abort set: mp_graph_kernels.h).
 */
#include "fabric/cuda/mp_graph_kernels.h"

#include <stdint.h>

#define POISON ((uint64_t)1 << 62)

namespace {

__device__ __forceinline__ uint64_t load_acquire(const uint64_t *p) {
    uint64_t v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(uint64_t *p, uint64_t v) {
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint32_t err_code(const uint32_t *err) {
    return *(const volatile uint32_t *)err;
}

__global__ void tick_kernel(uint64_t *num) {
    *num += 1;
}

__global__ void signal_kernel(const uint64_t *num, const uint32_t *err, uint64_t *flag,
                              int64_t delta) {
    /* A failed rank poisons what it signals: its peers must not take its data as sent. */
    const uint64_t v = err_code(err) != 0 ? POISON : *num + (uint64_t)delta;
    __threadfence_system();
    /* Never lower a poison a fail-stop wrote (the host's poison repeats until streams idle;
     * this spares it a round). */
    if (load_acquire(flag) >= POISON && v < POISON) return;
    store_release(flag, v);
}

/* Record why a wait of a replay failed (nothing in an eager wait, which has no error word). */
__device__ void fail(const tide_mp_graph_wait_t &w, int i, uint32_t code) {
    if (w.err == nullptr) return;
    if (atomicCAS(w.err, 0u, code) == 0u) {
        w.err[1] = (uint32_t)w.rank[i];
        w.err[2] = (uint32_t)w.family;
        w.err[3] = (uint32_t)w.slot;
        __threadfence_system();
    }
}

__global__ void wait_kernel(tide_mp_graph_wait_t w) {
    const uint64_t target = (w.num != nullptr ? *w.num : 0u) + (uint64_t)w.delta;
    const uint64_t t0 = now_ns();
    for (int i = 0; i < w.count; ++i) {
        const uint64_t *flag = (const uint64_t *)w.flag[i];
        for (unsigned spin = 0;; ++spin) {
            /* failed already: pass, the signals poison */
            if (w.err != nullptr && err_code(w.err) != 0) return;
            const uint64_t v = load_acquire(flag);
            if (v >= POISON || (int64_t)(v - target) >= 0) {
                if (v < POISON) break;
                /* The poison: some rank failed; so does this replay. */
                fail(w, i, TIDE_MP_GRAPH_POISONED);
                return;
            }
            /* A rank failed the group (eager kernel waits): the host reports the call, this
             * stream drains.  Host memory over PCIe: read once per 32 spins, never on a wait
             * that its flag ends at once. */
            if (w.abort != nullptr && (spin & 31u) == 31u &&
                *(const volatile uint32_t *)w.abort != 0u)
                return;
            if (w.timeout_ns != TIDE_MP_GRAPH_NO_TIMEOUT && now_ns() - t0 > w.timeout_ns) {
                fail(w, i, TIDE_MP_GRAPH_TIMEOUT);
                return;
            }
            if (spin > 32) __nanosleep(256);
        }
    }
    __threadfence_system();
}

} // namespace

extern "C" cudaError_t tide_mp_graph_tick(uint64_t *num, cudaStream_t s) {
    tick_kernel<<<1, 1, 0, s>>>(num);
    return cudaGetLastError();
}

extern "C" cudaError_t tide_mp_graph_signal(const uint64_t *num, const uint32_t *err, uint64_t flag,
                                            int64_t delta, cudaStream_t s) {
    signal_kernel<<<1, 1, 0, s>>>(num, err, (uint64_t *)flag, delta);
    return cudaGetLastError();
}

extern "C" cudaError_t tide_mp_graph_wait(const tide_mp_graph_wait_t *w, cudaStream_t s) {
    wait_kernel<<<1, 1, 0, s>>>(*w);
    return cudaGetLastError();
}
