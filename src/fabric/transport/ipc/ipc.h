/*
 * ipc.h - the ipc transport (transport.h): one process per rank on one host, every peer's
 * segment mapped (VMM or legacy IPC, mp_world.c), signals 64-bit flags that only grow (host-
 * mapped control block memory by default, mp_flags.c), rails emulated by copies (mp_rails.c).
 * Its flag entries are shared with the nccl transport, whose flags live in LSA windows.
 */
#ifndef TIDE_FABRIC_TRANSPORT_IPC_H_
#define TIDE_FABRIC_TRANSPORT_IPC_H_

#include "fabric/cuda/mp.h"
#include "fabric/cuda/transport.h"

/* The call's tp_ctx. */
typedef struct {
    tide_mp_arena_t *a;
    tide_mp_family_t *fam;
    tide_mp_prepared_t *pp;
    int fidx;                   /* the program's flag area (mp.h) */
    tide_mp_rails_call_t rails; /* the call as its rail steps see it */
} tide_transport_ipc_t;

/* A flag written with `value` after what s holds / s waits until the flag is >= value. */
tide_result_t tide_transport_flag_write(tide_cuda_call_t *c, cudaStream_t s, CUdeviceptr flag,
                                        uint64_t value);
tide_result_t tide_transport_flag_wait(tide_cuda_call_t *c, cudaStream_t s, CUdeviceptr flag,
                                       uint64_t value);

/* The entries of a flag transport (ipc, nccl). */
tide_result_t tide_transport_flags_record(tide_cuda_call_t *c, cudaStream_t s, int slot);
tide_result_t tide_transport_flags_wait(tide_cuda_call_t *c, cudaStream_t s, int slot, bool prev);
tide_result_t tide_transport_flags_wait_run(tide_cuda_call_t *c, cudaStream_t s, const int *slots,
                                            int n, bool prev);
/* A fence of the call itself (call == c->epoch, the epilogue's) leaves out the rank's own done
 * flag: tide_transport_flags_done wrote it on the same caller stream just before. */
tide_result_t tide_transport_flags_fence(tide_cuda_call_t *c, int rank, int64_t call);
tide_result_t tide_transport_flags_done(tide_cuda_call_t *c, int rank);
tide_result_t tide_transport_flags_copy_batch(tide_cuda_call_t *c, int k, int t);
tide_result_t tide_transport_flags_rail_put(tide_cuda_call_t *c, int id, cudaStream_t s,
                                            bool *carried);

/* The same transport for a call being captured into a CUDA graph (graph.c, and
 * fabric/cuda/mp_graph.c): its signals, waits, fence and done flag are kernels that read the
 * family's call counter on the device; no batches, no rails. */
extern const tide_cuda_transport_t tide_transport_ipc_graph;

#endif /* TIDE_FABRIC_TRANSPORT_IPC_H_ */
