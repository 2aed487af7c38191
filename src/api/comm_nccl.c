/*
 * comm_nccl.c - communicators on the NCCL fabric (tide.h, docs/nccl-fabric.md).
 *
 * Built in every configuration: without the NCCL fabric (TIDE_HAVE_NCCL) the calls check
 * their arguments and return TIDE_ERR_UNSUPPORTED, so the API and its error paths are the
 * same in every build.
 */
#include "core/checks.h"
#include "api/comm.h"

#ifdef TIDE_HAVE_NCCL
#include "fabric/nccl/entry.h"
#endif

#include <stddef.h>

#ifndef TIDE_HAVE_NCCL
static tide_result_t not_built(void) {
    return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                    "nccl fabric: not built into this library (it needs the CUDA build and "
                    "NCCL >= 2.28 headers: cmake -DTIDE_WITH_CUDA=ON -DTIDE_WITH_NCCL=ON)");
}
#endif

tide_result_t tide_nccl_get_unique_id(void *id_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(id_out != NULL, "nccl_get_unique_id: id_out is NULL");
#ifdef TIDE_HAVE_NCCL
    return tide_nccl_get_unique_id_bytes(id_out);
#else
    return not_built();
#endif
}

#ifdef TIDE_HAVE_NCCL
static tide_result_t adopt(const tide_topo_t *topo, struct tide_fabric_world *world,
                           tide_comm_t *comm_out) {
    struct tide_comm *c = NULL;
    const tide_result_t res = tide_comm_adopt_world(topo, world, &c);
    if (res != TIDE_SUCCESS) {
        world->ops->world_destroy(world);
        return res;
    }
    *comm_out = c;
    return TIDE_SUCCESS;
}
#endif

tide_result_t tide_comm_init_nccl(int nodes, int gpus_per_node, int rank,
                                  const void *nccl_unique_id, tide_comm_t *comm_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(comm_out != NULL, "comm_init_nccl: comm_out is NULL");
    TIDE_ARG_CHECK(nccl_unique_id != NULL, "comm_init_nccl: nccl_unique_id is NULL");
    tide_topo_t topo;
    TIDE_CHECK(tide_topo_init(nodes, gpus_per_node, &topo));
    TIDE_ARG_CHECK(rank >= 0 && rank < topo.ranks, "comm_init_nccl: rank %d outside [0, N = %d)",
                   rank, topo.ranks);
#ifdef TIDE_HAVE_NCCL
    struct tide_fabric_world *world = NULL;
    TIDE_CHECK(tide_nccl_world_create(nodes, gpus_per_node, rank, nccl_unique_id, NULL, &world));
    return adopt(&topo, world, comm_out);
#else
    return not_built();
#endif
}

tide_result_t tide_comm_init_nccl_comm(void *nccl_comm, int nodes, int gpus_per_node,
                                       tide_comm_t *comm_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(comm_out != NULL, "comm_init_nccl_comm: comm_out is NULL");
    TIDE_ARG_CHECK(nccl_comm != NULL, "comm_init_nccl_comm: nccl_comm is NULL");
    tide_topo_t topo;
    TIDE_CHECK(tide_topo_init(nodes, gpus_per_node, &topo));
#ifdef TIDE_HAVE_NCCL
    struct tide_fabric_world *world = NULL;
    TIDE_CHECK(tide_nccl_world_create(nodes, gpus_per_node, 0, NULL, nccl_comm, &world));
    return adopt(&topo, world, comm_out);
#else
    return not_built();
#endif
}
