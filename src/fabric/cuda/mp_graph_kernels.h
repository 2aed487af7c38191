/*
 * mp_graph_kernels.h - the device side of captured calls on the one-process-per-rank CUDA
 * fabric (mp_graph.c; docs/cuda-fabric.md, "CUDA graphs across processes").
 *
 * An eager call's signals and waits are stream memory operations whose values (e + 1, the
 * host's call number) are fixed when they are enqueued; a captured memory operation would
 * repeat the same value on every replay.  A captured call numbers itself on the device
 * instead: its first node increments the family's call counter (a device word), and its
 * signals, waits and fences are one-thread kernels that read the counter and add the offset
 * the eager call would have added to e.
 *
 * Failure on the device, since no host watches a replay: a wait ends when its flag reached the
 * value, when the flag holds the poison (2^62 and above: a fail-stop), when this rank's error
 * word is set, or after the timeout (TIDE_TIMEOUT_MS when the call was captured, measured
 * with %globaltimer).  A wait that timed out or passed at the poison sets the error word
 * (the host reports it at its next call or sync: mp_graph.c); once it is set, this rank's
 * waits pass at once and its signals write the poison, so every rank whose replay depends on
 * the failed one is released within the timeout and fails as well, instead of reporting data
 * it never received.
 *
 * The same wait kernel serves the eager calls of TIDE_CUDA_MP_FLAGS=kernel (mp_flags.c): there
 * num is NULL (the value is delta itself, fixed at enqueue like a stream memory operation's),
 * err is NULL (the host reports a failed call: the abort word is visible before any wait
 * could be released by it), timeout_ns is TIDE_MP_GRAPH_NO_TIMEOUT (the host watchdog bounds
 * the call), and abort is the device address of the group's abort word in the control block
 * (mp_ctl.h), which the kernel reads every few dozen spins and at which it passes: a CPU
 * store of that word releases every such wait of every process, whatever its stream's queue
 * is doing.  A captured call passes abort NULL and keeps the behaviour above.
 *
 * Plain C, shared by mp_graph.c, the ipc transport's graph entries, mp_flags.c and
 * mp_graph_kernels.cu.
 */
#ifndef TIDE_FABRIC_CUDA_MP_GRAPH_KERNELS_H_
#define TIDE_FABRIC_CUDA_MP_GRAPH_KERNELS_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Flags one wait kernel checks (a fence waits on every rank's done flag: several launches
 * when there are more ranks). */
#define TIDE_MP_GRAPH_WAIT_MAX 32

/* The error word (host-mapped, 4 words): [0] code, [1] rank of the flag, [2] family, [3] slot
 * (-1: a done flag, that is a fence). */
enum {
    TIDE_MP_GRAPH_OK = 0,
    TIDE_MP_GRAPH_TIMEOUT = 1,  /* a wait reached the timeout */
    TIDE_MP_GRAPH_POISONED = 2, /* a wait found the poison: a rank failed */
};

/* timeout_ns of a wait that only the flags, the poison or the abort word end. */
#define TIDE_MP_GRAPH_NO_TIMEOUT UINT64_MAX

typedef struct {
    const uint64_t *num;   /* the family's call counter; NULL: the value is delta itself */
    uint32_t *err;         /* device address of this rank's error word; NULL: none (eager) */
    const uint32_t *abort; /* device address of the group's abort word, polled; NULL: none */
    int64_t delta;         /* value = *num + delta (delta when num is NULL) */
    uint64_t timeout_ns;   /* TIDE_MP_GRAPH_NO_TIMEOUT: none */
    int family, slot;      /* for the error word */
    int count;
    int rank[TIDE_MP_GRAPH_WAIT_MAX];
    uint64_t flag[TIDE_MP_GRAPH_WAIT_MAX]; /* device addresses */
} tide_mp_graph_wait_t;

/* *num += 1 on s: the first node of a captured call. */
cudaError_t tide_mp_graph_tick(uint64_t *num, cudaStream_t s);
/* After what s holds, *flag = *num + delta (the poison once *err is set). */
cudaError_t tide_mp_graph_signal(const uint64_t *num, const uint32_t *err, uint64_t flag,
                                 int64_t delta, cudaStream_t s);
/* s waits until every flag of w reached *num + delta, or delta without num (see the top for
 * how else it ends). */
cudaError_t tide_mp_graph_wait(const tide_mp_graph_wait_t *w, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_FABRIC_CUDA_MP_GRAPH_KERNELS_H_ */
