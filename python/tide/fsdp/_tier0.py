"""Tier 0: TIDE behind FSDP2's public communication hooks (set_custom_all_gather /
set_custom_reduce_scatter, torch >= 2.9).

FSDP2 keeps its own layout here: it still packs the all-gather input (all_gather_copy_in),
copies the output out (split_with_sizes_copy) and packs the fp32 reduce-scatter input
(_chunk_cat).  Those buffers are rank-major: rank r's part of the flat all-gather output is
[r n, (r + 1) n).  TIDE serves them as a group of ONE parameter of shape (N, n): its landing
map Landing(0, r) = r n b is exactly that rank-major layout, and its reduce-scatter of row r
is exactly FSDP2's reduce-scatter.  allocate() of the all-gather returns landing slot 0, so
TIDE moves the bytes straight into the buffer FSDP2 copies out of.

This tier needs nothing of torch beyond the public hooks, so it is the fallback when torch's
internals differ from those Tier 1 was written for.  Calls whose size or dtype differ from
the registered ones (e.g. a backward where only some parameters have gradients) go to the
stock collectives, which is always correct.
"""

import logging

import torch
import torch.distributed as dist

from .. import _lib

logger = logging.getLogger("tide.fsdp")


class Tier0Group:
    """The AllGather and ReduceScatter objects of one FSDPParamGroup."""

    tier = 0

    def __init__(self, param_group, comm, spec, mode, graphs=None, **tuning):
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

        from . import _graph

        self.param_group = param_group
        self.spec = spec
        # Capture routing (_graph.py): Tier 0 groups are registered alone, no fences.
        self.graphs = graphs if graphs is not None else _graph.Graphs("stock", comm)
        self.world = comm.ranks
        n_ag = sum(geo_numel for geo_numel in spec.shard_numels)
        self.n_ag = n_ag
        self.n_rs = n_ag  # per-rank numel of the reduce-scatter output (same padding)
        self.group = comm.register([(self.world, n_ag)], spec.ag_dtype, spec.rs_dtype,
                                   mode=mode, **tuning)
        g = self.group
        self.landing0 = g.landing(0)
        self.scratch = torch.empty(n_ag, dtype=spec.ag_dtype, device=g.device)
        state = self

        class TideAllGather(AllGather):
            _tide = True

            def allocate(self, size, *, dtype, device):
                if state.owns_ag(size, dtype, device):
                    if state.landing_free():
                        return state.landing0
                    state.on_stock("ag", "all-gathers")  # said and counted here
                return torch.empty(*size, dtype=dtype, device=device)

            def __call__(self, output_tensor, input_tensor, group, async_op=False):
                if (output_tensor is state.landing0 and group.size() == state.world
                        and not state.on_stock("ag", "all-gathers")):
                    return state.all_gather(input_tensor)
                return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group,
                                                   async_op=async_op)

        class TideReduceScatter(ReduceScatter):
            def allocate(self, size, *, dtype, device):
                return torch.empty(*size, dtype=dtype, device=device)

            def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
                if (state.owns_rs(output_tensor, input_tensor, group)
                        and not state.on_stock("rs", "reduce-scatters")):
                    return state.reduce_scatter(output_tensor, input_tensor, op)
                return dist.reduce_scatter_tensor(output=output_tensor, input=input_tensor,
                                                  group=group, op=op, async_op=async_op)

        self.ag_comm = TideAllGather()
        self.rs_comm = TideReduceScatter()
        # Calls made in Python: a captured call counts once (also as captured_*).
        self.calls = {"all_gather": 0, "reduce_scatter": 0, "captured_all_gather": 0,
                      "captured_reduce_scatter": 0}
        self.out = torch.empty(g.out_numel, dtype=torch.float32, device=g.device)
        param_group._all_gather_comm = self.ag_comm
        param_group._reduce_scatter_comm = self.rs_comm

    def on_stock(self, program, what):
        """Whether this call runs on the stock collective (into the same buffer): during a
        CUDA graph capture unless enable(capture="tide") and _graph.Graphs allows it, and
        eagerly after a capture of TIDE calls (the library refuses those); said once per
        group and reason, in the log and in enabled(model).fallbacks."""
        from . import _auto, _graph

        why = self.graphs.check(self.group, self.spec.name,
                                "all_gather" if program == "ag" else "reduce_scatter")
        if why is None:
            return False
        _graph.log_once(self, why, what)
        key = "stock_captured" if _auto._capturing() else "stock_after_capture"
        self.calls[key] = self.calls.get(key, 0) + 1
        return True

    def landing_free(self):
        """Whether an all-gather may land in landing slot 0 now: not after a capture of
        TIDE calls, outside it (the graph's replays write there; an eager step on stock
        gets memory of its own)."""
        from . import _auto

        g = self.graphs
        return not g.captured or (_auto._capturing() and g.capture is not None
                                  and g.capture.get("served", False))

    def owns_ag(self, size, dtype, device):
        numel = 1
        for s in size:
            numel *= int(s)
        return (numel == self.world * self.n_ag and dtype == self.spec.ag_dtype
                and torch.device(device) == self.group.device)

    def owns_rs(self, output, input, group):
        return (group.size() == self.world and input.dtype == self.spec.rs_dtype
                and input.numel() == self.world * self.n_rs and output.numel() == self.n_rs
                and input.device == self.group.device and input.is_contiguous()
                and output.is_contiguous())

    def _stream(self):
        if self.group.device.type == "cuda":
            return torch.cuda.current_stream(self.group.device)
        return None

    def all_gather(self, input_tensor):
        # The input is FSDP2's narrow of the output at this rank's place, i.e. inside the
        # landing slot that TIDE writes: it is staged once (n items) so that source and
        # destination never alias.
        with torch.no_grad():
            self.scratch.copy_(input_tensor)
        self.group.all_gather(self.scratch, 0, stream=self._stream())
        self.graphs.note(self, "ag")
        return None

    def reduce_scatter(self, output, input, op):
        from torch.distributed import ReduceOp

        if op == ReduceOp.AVG:
            alpha = float(_lib.require("tide_alpha_avg")(self.world))
        elif op == ReduceOp.SUM:
            alpha = 1.0
        elif op == ReduceOp.PREMUL_SUM:
            factor = self.param_group.gradient_divide_factor
            if factor is None:
                raise RuntimeError("tide.fsdp: PREMUL_SUM without a gradient divide factor")
            alpha = 1.0 / float(factor)
        else:
            raise RuntimeError("tide.fsdp: reduce op %r is not a sum" % (op,))
        self.group.reduce_scatter([input], self.out, alpha=alpha, stream=self._stream())
        self.graphs.note(self, "rs")
        with torch.no_grad():
            output.copy_(self.out)  # fp32 -> the reduce dtype when that is narrower
        return None

    def release(self):
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
            DefaultAllGather, DefaultReduceScatter)

        if self.param_group._all_gather_comm is self.ag_comm:
            self.param_group._all_gather_comm = DefaultAllGather()
        if self.param_group._reduce_scatter_comm is self.rs_comm:
            self.param_group._reduce_scatter_comm = DefaultReduceScatter()
        self.landing0 = None
        # FSDP2 may still hold the last all-gather output (the landing view) in its
        # all-gather state until the next forward; drop it so the arena can be released.
        ctx = self.param_group.comm_ctx
        state = getattr(ctx, "all_gather_state", None)
        if state is not None and getattr(state.all_gather_result, "all_gather_output",
                                         None) is not None:
            ctx.all_gather_state = None

    def close(self):
        self.group.close()


__all__ = ["Tier0Group"]
