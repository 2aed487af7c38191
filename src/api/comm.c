/*
 * comm.c - communicators: one handle per rank over a fabric world (tide.h).
 */
#include "core/checks.h"
#include "api/comm.h"
#include "core/handles.h"

#include <stdlib.h>
#include <string.h>

/* The fabric of a kind, or an error saying why there is none. */
static tide_result_t fabric_of(tide_fabric_kind_t kind, const struct tide_fabric_ops **ops_out) {
    TIDE_ARG_CHECK((int)kind >= 0 && kind < TIDE_FABRIC_COUNT,
                   "fabric = %d is not a tide_fabric_kind_t", (int)kind);
    const struct tide_fabric_ops *ops = tide_fabric_lookup(kind);
    if (ops == NULL)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "fabric %d is not built into this library",
                        (int)kind);
    *ops_out = ops;
    return TIDE_SUCCESS;
}

tide_result_t tide_comm_resolve_lane(const struct tide_comm *comm, const char *who,
                                     tide_config_t *cfg) {
    if (comm->ops->rail_lane != NULL && comm->ops->rail_lane(comm->world)) return TIDE_SUCCESS;
    TIDE_ARG_CHECK(cfg->lane != TIDE_LANE_RAIL,
                   "%s: lane = rail: this %s world does not run the rail lane",
                   who, comm->ops->name);
    cfg->lane = TIDE_LANE_GENERIC;
    return TIDE_SUCCESS;
}

static tide_result_t comm_new(const struct tide_fabric_ops *ops, const tide_topo_t *topo,
                              struct tide_fabric_world *world, struct tide_comm **comm_out) {
    struct tide_comm *c = calloc(1, sizeof(*c));
    if (c == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "communicator: out of host memory");
    /* A fabric may hand out worlds of another provider of its kind (the CUDA fabric's
     * one-process-per-rank worlds): the world's ops serve the communicator. */
    c->ops = world->ops != NULL ? world->ops : ops;
    c->world = world;
    c->topo = *topo;
    c->rank = world->rank;
    tide_result_t res = tide_handle_add(c, TIDE_HANDLE_COMM);
    if (res != TIDE_SUCCESS) {
        free(c);
        return res;
    }
    *comm_out = c;
    return TIDE_SUCCESS;
}

tide_result_t tide_comm_init_all(tide_fabric_kind_t fabric, int nodes, int gpus_per_node,
                                 tide_comm_t *comms_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(comms_out != NULL, "comm_init_all: comms_out is NULL");
    const struct tide_fabric_ops *ops = NULL;
    tide_topo_t topo;
    TIDE_CHECK(fabric_of(fabric, &ops));
    TIDE_CHECK(tide_topo_init(nodes, gpus_per_node, &topo));
    if (ops->world_create_all == NULL)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "fabric %s cannot drive all ranks from one process",
                        ops->name);

    const int n = topo.ranks;
    tide_result_t res;
    struct tide_fabric_world **worlds = calloc((size_t)n, sizeof(*worlds));
    struct tide_comm **comms = calloc((size_t)n, sizeof(*comms));
    if (worlds == NULL || comms == NULL) {
        res = TIDE_ERR(TIDE_ERR_NO_MEMORY, "comm_init_all: out of host memory for %d ranks", n);
        goto fail_arrays;
    }
    TIDE_CHECK_GOTO(ops->world_create_all(nodes, gpus_per_node, worlds), res, fail_arrays);
    for (int r = 0; r < n; ++r)
        TIDE_CHECK_GOTO(comm_new(ops, &topo, worlds[r], &comms[r]), res, fail_worlds);
    for (int r = 0; r < n; ++r)
        comms_out[r] = comms[r];
    free(comms);
    free(worlds);
    return TIDE_SUCCESS;

fail_worlds:
    for (int r = 0; r < n; ++r) {
        tide_handle_release(comms[r], TIDE_HANDLE_COMM, sizeof(*comms[r]));
        ops->world_destroy(worlds[r]);
    }
fail_arrays:
    free(comms);
    free(worlds);
    return res;
}

/* Job names become shm names: a short, portable charset. */
static tide_result_t check_job_name(const char *name) {
    TIDE_ARG_CHECK(name != NULL, "comm_init_rank: name is NULL");
    size_t len = strlen(name);
    TIDE_ARG_CHECK(len >= 1 && len <= 64, "comm_init_rank: name '%s' must have 1..64 characters",
                   name);
    for (size_t i = 0; i < len; ++i) {
        char ch = name[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
        TIDE_ARG_CHECK(ok, "comm_init_rank: name '%s' has '%c'; use [A-Za-z0-9_-]", name, ch);
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_comm_init_rank(tide_fabric_kind_t fabric, int nodes, int gpus_per_node, int rank,
                                  const char *name, tide_comm_t *comm_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(comm_out != NULL, "comm_init_rank: comm_out is NULL");
    const struct tide_fabric_ops *ops = NULL;
    tide_topo_t topo;
    TIDE_CHECK(fabric_of(fabric, &ops));
    TIDE_CHECK(tide_topo_init(nodes, gpus_per_node, &topo));
    TIDE_ARG_CHECK(rank >= 0 && rank < topo.ranks, "comm_init_rank: rank %d outside [0, N = %d)",
                   rank, topo.ranks);
    TIDE_CHECK(check_job_name(name));
    if (ops->world_create_rank == NULL)
        return TIDE_ERR(TIDE_ERR_UNSUPPORTED, "fabric %s has no one-process-per-rank mode",
                        ops->name);

    struct tide_fabric_world *world;
    TIDE_CHECK(ops->world_create_rank(nodes, gpus_per_node, rank, name, &world));
    struct tide_comm *c = NULL;
    tide_result_t res = comm_new(ops, &topo, world, &c);
    if (res != TIDE_SUCCESS) {
        ops->world_destroy(world);
        return res;
    }
    *comm_out = c;
    return TIDE_SUCCESS;
}

tide_result_t tide_comm_adopt_world(const tide_topo_t *topo, struct tide_fabric_world *world,
                                    struct tide_comm **comm_out) {
    return comm_new(world->ops, topo, world, comm_out);
}

tide_result_t tide_comm_destroy(tide_comm_t comm) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(comm, TIDE_HANDLE_COMM, "comm_destroy"));
    TIDE_ARG_CHECK(comm->live_groups == 0,
                   "comm_destroy: rank %d still has %d registered group(s); deregister them first",
                   comm->rank, comm->live_groups);
    tide_result_t res = comm->ops->world_destroy(comm->world);
    tide_handle_release(comm, TIDE_HANDLE_COMM, sizeof(*comm));
    return res;
}

tide_result_t tide_comm_rank(tide_comm_t comm, int *rank_out) {
    tide_error_clear();
    TIDE_CHECK(tide_handle_check(comm, TIDE_HANDLE_COMM, "comm_rank"));
    TIDE_ARG_CHECK(rank_out != NULL, "comm_rank: rank_out is NULL");
    *rank_out = comm->rank;
    return TIDE_SUCCESS;
}
