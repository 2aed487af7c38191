/*
 * nccl.c - the nccl transport (transport.h): one process per rank on NCCL's symmetric memory.
 *
 * Its signals and fences are the flag entries of the ipc transport (ipc.h): the flag areas
 * are device memory in the group's LSA windows (src/fabric/nccl/arena.c maps every peer's,
 * so the same cuStreamWriteValue64 / cuStreamWaitValue64 carry them), and rail puts go to the
 * world's NCCL rail transport (src/fabric/nccl/rails.c: grouped send / receive, or
 * rails_put.c: ncclPutSignal, by TIDE_NCCL_RAILS).  Every same-node peer segment counts as
 * another device's, so runs of copies to peers are copy-engine batches (mp_batch.c).
 *
 * Fail-stop differs from ipc below this table: the flags are device memory, so a poison is
 * stream work and the waits are bounded only by the executor's host waits
 * (docs/cuda-fabric.md, "Fail-stop").
 */
#include "fabric/transport/ipc/ipc.h"

const tide_cuda_transport_t tide_transport_nccl =
    TIDE_CUDA_TRANSPORT("nccl", tide_transport_flags, tide_transport_flags_wait_run,
                        tide_transport_flags_rail_put);
