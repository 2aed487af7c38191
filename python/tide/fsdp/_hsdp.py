"""HSDP: a 2-D (replicate, shard) mesh, with TIDE serving the shard dimension.

FSDP2 hands foreach_reduce both process groups for an HSDPMeshInfo: the shard group's
reduce-scatter, then an all-reduce of the shard output over the replicate group.  Tier 1 runs
TIDE-RS over the shard group (the group's communicator is the shard group's; every replica
has its own), and this module runs the rest as torch 2.11's foreach_reduce does, line for line:
accumulation into the partial output while all-reduce is off (set_requires_all_reduce(False)),
the partial output added before the all-reduce, dist.all_reduce over the replicate group with
the op _get_gradient_divide_factors chose (AVG, or SUM after PREMUL_SUM / pre-division), on
FSDP2's all-reduce stream, then the hook and the post division in the caller.

The all-reduce runs on the shard output as TIDE-RS wrote it: fp32, or rounded to a bf16
reduce dtype first where stock reduces in bf16 (_rounding.py), so the replica sum sees the
same values as stock's.  The replica all-reduce itself is gloo's / NCCL's, not TIDE's: the
paper's rail all-reduce fed from TIDE-RS's landing is not built here.
"""

import torch.distributed as dist


def replica_all_reduce(reduce_output, reduce_scatter_stream, all_reduce_stream, handle,
                       all_reduce_group, all_reduce_op, all_reduce_grads,
                       partial_reduce_output):
    """Runs inside the reduce-scatter stream context, as stock's block does.  Returns
    (done, reduce_output, post_reduce_stream, all_reduce_input, all_reduce_event,
    partial_reduce_output); done means foreach_reduce returns now (all-reduce deferred)."""
    if not all_reduce_grads:
        # Accumulations run in the reduce-scatter stream (stock's comment and order).
        if partial_reduce_output is not None:
            partial_reduce_output += reduce_output
        else:
            partial_reduce_output = reduce_output
        return True, reduce_output, reduce_scatter_stream, None, None, partial_reduce_output
    if partial_reduce_output is not None:
        reduce_output += partial_reduce_output
    all_reduce_stream.wait_stream(reduce_scatter_stream)
    with handle.stream(all_reduce_stream):
        dist.all_reduce(reduce_output, group=all_reduce_group, op=all_reduce_op)
        all_reduce_event = all_reduce_stream.record_event()
    return (False, reduce_output, all_reduce_stream, reduce_output, all_reduce_event,
            partial_reduce_output)


__all__ = ["replica_all_reduce"]
