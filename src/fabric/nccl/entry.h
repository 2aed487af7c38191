/*
 * entry.h - what core/ calls of the NCCL fabric (no CUDA or NCCL header needed).
 */
#ifndef TIDE_FABRIC_NCCL_ENTRY_H_
#define TIDE_FABRIC_NCCL_ENTRY_H_

#include "fabric/fabric.h"

/* World creation (world.c).  unique_id: an ncclUniqueId (TIDE_NCCL_UNIQUE_ID_BYTES) shared by
 * all ranks, with user_comm NULL; or user_comm, an ncclComm_t of exactly N ranks, whose rank
 * and device this rank takes (rank is then ignored). */
tide_result_t tide_nccl_world_create(int nodes, int gpus_per_node, int rank, const void *unique_id,
                                     void *user_comm, struct tide_fabric_world **world_out);

/* ncclGetUniqueId of the loaded library, TIDE_NCCL_UNIQUE_ID_BYTES bytes. */
tide_result_t tide_nccl_get_unique_id_bytes(void *id_out);

#endif /* TIDE_FABRIC_NCCL_ENTRY_H_ */
