/*
 * topology.c - the M x L rank grid (paper §2.1).
 *
 * Ranks are node-major, r = n L + l, and local rank l is also the rail that rank uses to reach
 * other nodes; the accessors in plan.h rely on that.  The limits keep N = M L far inside an int,
 * so no later index computation over ranks can overflow.
 */
#include "core/checks.h"
#include "plan/plan.h"

tide_result_t tide_topo_init(int nodes, int gpus_per_node, tide_topo_t *topo_out) {
    TIDE_ARG_CHECK(topo_out != NULL, "topology: topo_out is NULL");
    /* Both bounds are checked before the product so that N = M L is never formed out of
     * range (nodes = INT_MAX would overflow an int). */
    TIDE_ARG_CHECK(nodes >= 1 && nodes <= TIDE_MAX_NODES, "topology: nodes M = %d outside [1, %d]",
                   nodes, TIDE_MAX_NODES);
    TIDE_ARG_CHECK(gpus_per_node >= 1 && gpus_per_node <= TIDE_MAX_GPUS_PER_NODE,
                   "topology: gpus_per_node L = %d outside [1, %d] (one NVSwitch domain)",
                   gpus_per_node, TIDE_MAX_GPUS_PER_NODE);

    tide_topo_t topo;
    topo.nodes = nodes;
    topo.gpus_per_node = gpus_per_node;
    topo.ranks = nodes * gpus_per_node; /* <= 65536 * 8 */
    *topo_out = topo;
    return TIDE_SUCCESS;
}
