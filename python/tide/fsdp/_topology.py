"""The topology (M nodes x L ranks per node) of each process group enable() serves, from the
global ranks the group holds and the job's node layout.

The C library numbers a communicator's ranks node-major: rank r = node m * L + local l
(docs/protocol.md), and tide.torch_binding.Comm takes the group rank as r.  A process group's
topology is therefore read off its global ranks in group-rank order: rank g sits on node
g // G of the job (G = the job's ranks per node), and the group is M x L when those nodes
form M consecutive runs of L ranks each, on M distinct nodes.  So an expert subgroup
{0, 8, 16, 24} of a job with 8 ranks per node is 4 x 1 (the rail lane, on the fabrics that
run it), {0..7} is 1 x 8 and {0, 1, 8, 9} is 2 x 2.  Within a node's run any order of local ranks is
accepted: the library's local index l is the position in the run, and the fabrics place a
rank by its process, not by l.  A group whose nodes hold different local positions ({0, 9}
of nodes of 8: 2 x 1) pairs rail peers that sit on different rails of real hardware, which
can only cost speed.  Groups with no such M x L (a node holding more of the group's ranks than
another, nodes interleaved in the group-rank order, more than TIDE_MAX_GPUS_PER_NODE ranks on
one node) get a reason instead, and enable() leaves them on stock FSDP2: the library cannot
express them, and any guess would give a wrong topology.

The job's layout: enable(nodes=, gpus_per_node=) describe the job (every rank of
torch.distributed's default group), since one enable() serves several process groups of
different sizes; without them, $LOCAL_WORLD_SIZE (torchrun sets it) when it divides the world
and is at most 8, else one node for a world of at most 8 ranks and nodes of 8 beyond (the
defaults of tide.torch_binding.default_topology; a world with none of these, e.g. 12 ranks
and no $LOCAL_WORLD_SIZE, keeps the old per-group default_topology(group size)).  `nodes`
alone is the job's node count.  For a call that serves one process group, a layout that
covers that group's ranks but not the job's is taken as the group's own topology, the meaning
these arguments had before enable() served several groups.
"""

from .. import _lib
from ..torch_binding import default_topology


def group_topology(ranks, ranks_per_node):
    """((M, L), None) for a process group whose global ranks, in group-rank order, are
    `ranks`, on a job of `ranks_per_node` ranks per node; (None, reason) where no M x L the
    library can run exists."""
    ranks = [int(r) for r in ranks]
    if not ranks:
        return None, "the process group holds no ranks"
    if ranks_per_node < 1:
        raise ValueError("ranks_per_node: expected >= 1, got %r" % (ranks_per_node,))
    runs = []  # [(node, count)] in group-rank order
    for r in ranks:
        node = r // ranks_per_node
        if runs and runs[-1][0] == node:
            runs[-1] = (node, runs[-1][1] + 1)
        else:
            runs.append((node, 1))
    nodes = [n for n, _c in runs]
    if len(set(nodes)) != len(nodes):
        return None, ("its ranks %s (in group-rank order) interleave nodes %s of %d ranks "
                      "each; TIDE numbers a group's ranks node by node (rank = node m * L + "
                      "local l)" % (ranks, [r // ranks_per_node for r in ranks],
                                    ranks_per_node))
    counts = sorted({c for _n, c in runs})
    if len(counts) != 1:
        return None, ("its ranks %s hold %s ranks on nodes %s (of %d ranks each): no uniform "
                      "M x L topology" % (ranks, [c for _n, c in runs], nodes, ranks_per_node))
    local = counts[0]
    if local > _lib.MAX_GPUS_PER_NODE:
        return None, ("its ranks %s put %d ranks on one node; TIDE serves at most %d per node"
                      % (ranks, local, _lib.MAX_GPUS_PER_NODE))
    return (len(runs), local), None


def process_group_ranks(pg):
    """The global ranks of process group `pg`, in group-rank order (group rank i holds the
    i-th), from torch.distributed itself rather than from the order of any listing."""
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(pg)
    return sorted(ranks, key=lambda g: dist.get_group_rank(pg, g))


def topologies(pgs, nodes=None, gpus_per_node=None):
    """[((M, L), None) or (None, reason)] for the process groups `pgs` that one enable()
    serves, on the job's layout (module doc)."""
    import torch.distributed as dist

    world = dist.get_world_size()
    sizes = [dist.get_world_size(pg) for pg in pgs]
    explicit = nodes is not None or gpus_per_node is not None
    try:
        per_node = default_topology(world, nodes, gpus_per_node)[1]
    except ValueError as exc:
        if not explicit:
            # No layout for this world (more than 8 ranks, not a multiple of 8, and no
            # $LOCAL_WORLD_SIZE): each group's size alone, as before.
            return [(default_topology(n), None) for n in sizes]
        if len(pgs) == 1 and sizes[0] != world:
            # The single-group meaning: nodes / gpus_per_node are that group's topology
            # (ValueError, as before, if they do not cover it either).
            return [(default_topology(sizes[0], nodes, gpus_per_node), None)]
        raise ValueError("tide.fsdp.enable: nodes=%r, gpus_per_node=%r describe the job's "
                         "layout (%d ranks): %s" % (nodes, gpus_per_node, world, exc)) from None
    return [group_topology(process_group_ranks(pg), per_node) for pg in pgs]
