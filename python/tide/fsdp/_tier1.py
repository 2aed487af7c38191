"""Tier 1: zero-copy TIDE inside an FSDP2 parameter group.

What changes for a Tier 1 group (nothing changes for any other group):

- Each FSDPParam's all-gather output -- the storage its unsharded parameter is an
  as_strided view of (storage_offset 0) -- is a tensor whose storage starts at the
  parameter's landing address o_p N in landing slot 0 of the group's TIDE arena.  The
  unsharded parameter therefore sits at the same address every step, and TIDE-AG writes every
  rank's shard straight into it: no copy-out.
- free_unsharded_param / alloc_all_gather_outputs of those FSDPParams are no-ops: the landing
  slot is the parameter's storage for the group's lifetime and is never resized.
- Each sharded parameter's padded local shard is adopted into the group's resident region
  (the DTensor keeps its identity; its local tensor is rebound there), so the optimizer
  updates shards where TIDE-AG reads them: no copy-in.  A casting group (fp32 masters, bf16
  all-gather) packs its masters into one persistent buffer per call instead, and TIDE casts
  them as they land.
- foreach_all_gather runs TIDE-AG into slot 0; foreach_all_gather_copy_out
  only waits and binds the views; foreach_reduce hands the per-parameter gradients to TIDE-RS
  (In-Place: read where autograd left them; Slot-Reuse: copied into landing slot 1 and
  freed), which writes the fp32 reduce output without the _chunk_cat pack.  The rest of
  foreach_reduce is torch 2.11's code.

_fsdp_param_group's module globals are replaced by dispatchers (install / uninstall) that
send a call to the Tier 1 group owning its FSDPParams and every other call to torch's own
function, so groups that are not enabled, or fell back, run stock code.
"""

import torch

from .. import _lib

# FSDPParam id -> _Tier1Group; the dispatchers' routing table.
_OWNERS = {}
_ORIGINALS = {}

_PATCHED_NAMES = ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce")


def _owner(fsdp_params):
    if not fsdp_params:
        return None
    return _OWNERS.get(id(fsdp_params[0]))


def _make_dispatchers():
    def foreach_all_gather(fsdp_params, group, async_op, all_gather_copy_in_stream,
                           all_gather_stream, device, all_gather_comm):
        st = _owner(fsdp_params)
        if st is None:
            return _ORIGINALS["foreach_all_gather"](
                fsdp_params, group, async_op, all_gather_copy_in_stream, all_gather_stream,
                device, all_gather_comm)
        return st.all_gather(fsdp_params, group, async_op, all_gather_copy_in_stream,
                             all_gather_stream, device)

    def foreach_all_gather_copy_out(all_gather_result, fsdp_params, group):
        st = _owner(fsdp_params)
        if st is None or not getattr(all_gather_result, "_tide", False):
            return _ORIGINALS["foreach_all_gather_copy_out"](all_gather_result, fsdp_params,
                                                             group)
        return st.copy_out(all_gather_result, fsdp_params, group)

    def foreach_reduce(fsdp_params, unsharded_grads, *args, **kwargs):
        st = _owner(fsdp_params)
        if st is not None:
            result = st.reduce(fsdp_params, unsharded_grads, *args, **kwargs)
            if result is not None:
                return result
        return _ORIGINALS["foreach_reduce"](fsdp_params, unsharded_grads, *args, **kwargs)

    out = {"foreach_all_gather": foreach_all_gather,
           "foreach_all_gather_copy_out": foreach_all_gather_copy_out,
           "foreach_reduce": foreach_reduce}
    for fn in out.values():
        fn._tide_dispatcher = True
    return out


def install():
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg_mod

    if _ORIGINALS:
        return
    for name in _PATCHED_NAMES:
        _ORIGINALS[name] = getattr(coll, name)
    for name, fn in _make_dispatchers().items():
        setattr(pg_mod, name, fn)


def uninstall_if_unused():
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg_mod

    if _OWNERS or not _ORIGINALS:
        return
    for name in _PATCHED_NAMES:
        setattr(pg_mod, name, _ORIGINALS[name])
    _ORIGINALS.clear()


def _move_shard(fp, flat):
    """Make `flat` (1-D, the padded sharded numel) the storage of fp's sharded parameter,
    with its current values: FSDP2's _sharded_param_data and the DTensor's local tensor
    (its first rows), as FSDPParam.reset_sharded_param rebinds them.  The nn.Parameter
    object stays the same, so optimizers and their state keep pointing at it."""
    old = fp._sharded_param_data
    local = fp.sharded_param._local_tensor
    length = local.size(0) if local.numel() > 0 else 0
    flat.copy_(old)
    fp._sharded_param_data = flat
    fp.sharded_param._local_tensor = flat.view(fp.padded_sharded_param_size).narrow(0, 0, length)


def _noop():
    return None


class Tier1Group:
    """TIDE state of one FSDPParamGroup."""

    tier = 1

    def __init__(self, param_group, comm, spec, mode, tuning=None):
        self.param_group = param_group
        self.comm = comm
        self.spec = spec
        self.mode = mode
        self.tuning = dict(tuning or {})  # tide_config_t fields (enable's sum_ctas, ...)
        self.fsdp_params = list(param_group.fsdp_params)
        self.index = {id(fp): p for p, fp in enumerate(self.fsdp_params)}
        self.group = comm.register(spec.shapes, spec.ag_dtype, spec.grad_dtype,
                                   spec.shard_dtype, mode=mode, **self.tuning)
        g = self.group
        self.world = g.ranks
        self.shard = torch.empty(g.shard_numel, dtype=spec.shard_dtype, device=g.device)
        numels = [geo.rows_per_rank * geo.inner for geo in g.params]
        self.shard_splits = list(torch.split(self.shard, numels))
        self.numels = numels
        # The per-parameter storages in slot 0 (parameters) and, for Slot-Reuse, slot 1
        # (gradient staging); the whole of slot 0 is the all-gather output FSDP2 sees.
        self.param_views = [g.param_storage(0, p) for p in range(len(g.params))]
        self.landing0 = g.landing(0)
        self.grad_views = None
        if mode == "slot-reuse":
            self.grad_views = [g.param_storage(1, p).view(spec.grad_dtype)[:geo.dim0 * geo.inner]
                               for p, geo in enumerate(g.params)]
        # In-place shard adoption (paper §3.1): when the all-gather does not cast, every
        # parameter's padded local shard lives in the group's resident region, so the
        # optimizer updates it where TIDE-AG reads it and the all-gather copies nothing in.
        # A casting group (fp32 masters, bf16 all-gather) has no resident region: it packs
        # its masters each call and TIDE casts them as they land.
        self.resident_splits = None
        if spec.shard_dtype == spec.ag_dtype:
            self.resident_splits = list(torch.split(g.resident(), numels))
            self.shard = None
            self.shard_splits = []
        self.zero_grad = None
        self._fallback_logged = False
        # The fp32-gradient companion group (see _wide_group), registered on first need.
        self.wide = None
        self.wide_grad_views = None
        self.wide_refused = None
        self.calls = {"all_gather": 0, "reduce_scatter": 0, "stock_reduce": 0, "copy_in": 0,
                      "wide_reduce_scatter": 0}
        self._adopt()

    # ---------------------------------------------------------------- adoption

    def _adopt(self):
        for fp, view in zip(self.fsdp_params, self.param_views):
            if hasattr(fp, "_unsharded_param"):
                # Built by an earlier stock unshard on stock memory: rebuilt on the landing
                # slot by the next init_unsharded_param (the group is sharded here).
                del fp._unsharded_param
            fp.all_gather_outputs = [view]
            fp.free_unsharded_param = _noop
            fp.alloc_all_gather_outputs = _noop
            _OWNERS[id(fp)] = self
        if self.resident_splits is not None:
            with torch.no_grad():
                for fp, dst in zip(self.fsdp_params, self.resident_splits):
                    _move_shard(fp, dst)

    def release(self):
        """Give the FSDPParams back to stock FSDP2 (the group must be sharded and idle)."""
        if self.resident_splits is not None:
            # The shards leave the arena for memory of their own before it is unmapped.
            with torch.no_grad():
                for fp, src in zip(self.fsdp_params, self.resident_splits):
                    if fp._sharded_param_data.data_ptr() == src.data_ptr():
                        _move_shard(fp, torch.empty_like(src))
            self.resident_splits = None
        for fp in self.fsdp_params:
            _OWNERS.pop(id(fp), None)
            for name in ("free_unsharded_param", "alloc_all_gather_outputs"):
                fp.__dict__.pop(name, None)
            fp.all_gather_outputs = []
            if hasattr(fp, "_unsharded_param"):
                # The unsharded parameter aliases the landing slot, and an autograd graph the
                # caller still holds (a loss tensor) keeps it alive through AccumulateGrad:
                # move it off the arena (as stock's free leaves it: no data), then drop it.
                with torch.no_grad():
                    fp._unsharded_param.data = torch.empty(
                        0, dtype=fp._unsharded_param.dtype, device=fp._unsharded_param.device)
                del fp._unsharded_param
        self.param_views = []
        self.landing0 = None
        self.grad_views = None
        self.wide_grad_views = None
        self.shard_splits = []

    # ---------------------------------------------------------------- checks

    def check_params(self, fsdp_params):
        """Refuse (before any collective) a group whose parameters changed since enable."""
        if len(fsdp_params) != len(self.fsdp_params) or any(
                a is not b for a, b in zip(fsdp_params, self.fsdp_params)):
            raise RuntimeError("tide.fsdp: the parameters of %s changed after enable(); call "
                               "tide.fsdp.disable() before changing them" % self.spec.name)
        for p, fp in enumerate(fsdp_params):
            data = fp._sharded_param_data
            dtype = fp.param_dtype or fp.orig_dtype
            if (tuple(fp._orig_size) != self.spec.shapes[p] or data.numel() != self.numels[p]
                    or data.dtype != self.spec.shard_dtype or dtype != self.spec.ag_dtype
                    or fp.sharded_state.name != "SHARDED" or fp.all_gather_outputs is None
                    or len(fp.all_gather_outputs) != 1
                    or fp.all_gather_outputs[0] is not self.param_views[p]):
                raise RuntimeError(
                    "tide.fsdp: parameter %s of %s changed after enable() (shape, dtype, "
                    "sharded state or storage); call tide.fsdp.disable() before changing "
                    "parameters" % (fp._param_fqn or p, self.spec.name))

    # ---------------------------------------------------------------- all-gather

    def all_gather(self, fsdp_params, group, async_op, copy_in_stream, all_gather_stream,
                   device):
        from torch.distributed.device_mesh import _get_device_handle
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import AllGatherResult

        from torch.distributed.fsdp._fully_shard._fsdp_common import compiled_autograd_enabled

        if group.size() != self.world:
            raise RuntimeError("tide.fsdp: %s all-gathers over %d ranks, registered for %d"
                               % (self.spec.name, group.size(), self.world))
        if compiled_autograd_enabled() or torch._dynamo.is_compiling():
            # Traceable FSDP2 recreates and resizes the unsharded storages itself.
            raise RuntimeError("tide.fsdp: Tier 1 does not run under torch.compile / compiled "
                               "autograd (Traceable FSDP2); call tide.fsdp.disable() or "
                               "enable(..., tier=0)")
        self.check_params(fsdp_params)
        handle = _get_device_handle(device.type)
        with torch.no_grad(), handle.stream(copy_in_stream):
            if self.resident_splits is None:
                # The fp32 masters packed param-major; TIDE casts to bf16 as they land.
                torch._foreach_copy_(self.shard_splits,
                                     [fp._sharded_param_data for fp in fsdp_params])
                self.calls["copy_in"] += 1
            else:
                # Adopted shards are read in place.  One whose storage was replaced since
                # (load_state_dict(assign=True), a user's set_) is adopted again: one copy.
                for fp, dst in zip(fsdp_params, self.resident_splits):
                    if fp._sharded_param_data.data_ptr() != dst.data_ptr():
                        _move_shard(fp, dst)
                        self.calls["copy_in"] += 1
        all_gather_stream.wait_stream(copy_in_stream)
        with handle.stream(all_gather_stream):
            stream = handle.current_stream() if device.type == "cuda" else None
            self.group.all_gather(self.shard, 0, stream=stream)
            self.calls["all_gather"] += 1
            event = all_gather_stream.record_event()
        result = AllGatherResult(self.landing0, event, None,
                                 [[self.spec.ag_dtype] for _ in fsdp_params],
                                 [[n] for n in self.numels], list(self.numels))
        return _TideAllGatherResult(result)

    def copy_out(self, result, fsdp_params, group):
        from torch.distributed.device_mesh import _get_device_handle

        device = result.all_gather_output.device
        handle = _get_device_handle(device.type)
        if result.all_gather_event is not None:
            handle.current_stream().wait_event(result.all_gather_event)
        # Nothing to copy: every unsharded parameter is a view of its landing storage.
        for p, fp in enumerate(fsdp_params):
            if not fp.all_gather_outputs or fp.all_gather_outputs[0] is not self.param_views[p]:
                fp.all_gather_outputs = [self.param_views[p]]

    # ---------------------------------------------------------------- reduce-scatter

    def _wide_group(self, grad_dtype):
        """The group that reduces fp32 gradients of a group registered for bf16 ones, or
        None.  Under mixed precision with reduce_dtype=float32, gradient accumulation without
        synchronisation keeps the accumulated gradients in fp32
        (FSDPParam.to_accumulated_grad_if_needed) and the next synchronised backward hands
        those fp32 sums to foreach_reduce; stock FSDP2 reduce-scatters them in fp32.  TIDE
        does the same with a second registration of the group's shapes for fp32 gradients
        (ag / grad / shard dtype fp32; only its TIDE-RS is used), registered at the first
        such reduction.  Registration is collective: every rank reaches it at the same
        foreach_reduce, since the gradient dtype follows set_requires_gradient_sync, which
        every rank must set alike (stock's reduce-scatter would not match otherwise)."""
        if grad_dtype != torch.float32 or self.spec.grad_dtype != torch.bfloat16:
            return None
        if self.wide is None and self.wide_refused is None:
            try:
                self.wide = self.comm.register(self.spec.shapes, torch.float32, torch.float32,
                                               torch.float32, mode=self.mode, **self.tuning)
            except _lib.TideError as exc:
                # Planned locally before the collective: refused on every rank alike.
                if exc.code != _lib.Result.UNSUPPORTED:
                    raise
                self.wide_refused = str(exc)
                return None
            if self.mode == "slot-reuse":
                self.wide_grad_views = [
                    self.wide.param_storage(1, p).view(torch.float32)[:geo.dim0 * geo.inner]
                    for p, geo in enumerate(self.wide.params)]
        return self.wide

    def _log_fallback(self, why):
        if not self._fallback_logged:
            self._fallback_logged = True
            import logging

            logging.getLogger("tide.fsdp").warning(
                "tide.fsdp: %s reduces with stock FSDP2 for this call: %s", self.spec.name, why)

    def reduce(self, fsdp_params, unsharded_grads, reduce_scatter_group, reduce_scatter_stream,
               reduce_scatter_comm, orig_dtype, reduce_dtype, device, gradient_divide_factor,
               all_reduce_group, all_reduce_stream, all_reduce_grads, partial_reduce_output,
               all_reduce_hook, force_sum_reduction_for_comms=False):
        """torch 2.11's foreach_reduce with TIDE-RS in place of copy-in + reduce-scatter.
        fp32 gradients of a bf16 group (accumulated without sync in reduce_dtype=float32)
        go through the group's fp32 companion (_wide_group); None lets stock FSDP2 run this
        call (a gradient dtype TIDE has no group for, or a companion the library refused)."""
        from torch.distributed.device_mesh import _get_device_handle
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
            _div_if_needed, _get_gradient_divide_factors)
        from torch.distributed.fsdp._fully_shard._fsdp_common import (
            _raise_assert_with_print, _to_dtype_if_needed, compiled_autograd_enabled)
        from torch.distributed.tensor import DTensor

        grad_dtypes = {grad.dtype for grad in unsharded_grads}
        if len(grad_dtypes) != 1:
            _raise_assert_with_print(
                f"FSDP reduce-scatter expects uniform gradient dtype but got {grad_dtypes}")
        grad_dtype = unsharded_grads[0].dtype
        if all_reduce_group is not None or reduce_scatter_group is None:
            return None  # never registered that way; stock handles it
        g, grad_views = self.group, self.grad_views
        if grad_dtype != self.spec.grad_dtype:
            g, grad_views = self._wide_group(grad_dtype), self.wide_grad_views
            if g is None:
                self._log_fallback("gradients are %s, the group was registered for %s%s"
                                   % (grad_dtype, self.spec.grad_dtype,
                                      "" if self.wide_refused is None
                                      else " (fp32 companion refused: %s)" % self.wide_refused))
                self.calls["stock_reduce"] += 1
                return None
        if any(id(fp) not in self.index for fp in fsdp_params):
            raise RuntimeError("tide.fsdp: foreach_reduce of %s got a parameter it does not "
                               "own" % self.spec.name)
        reduce_dtype = reduce_dtype or grad_dtype
        (predivide_factor, postdivide_factor, reduce_scatter_op, _all_reduce_op) = (
            _get_gradient_divide_factors(reduce_scatter_group, all_reduce_group, reduce_dtype,
                                         device.type, gradient_divide_factor,
                                         force_sum_reduction_for_comms))
        world_size = reduce_scatter_group.size()
        if world_size != self.world:
            raise RuntimeError("tide.fsdp: %s reduces over %d ranks, registered for %d"
                               % (self.spec.name, world_size, self.world))
        # The scaling folded into alpha (fp32): AVG = 1/N, PREMUL_SUM(1/f) = 1/f, and the
        # SUM path's pre/post divisors 1/(pre post).  A post-reduce hook must see the output
        # before the post-division, as in stock, so the post divisor then stays a division.
        alpha, post_after_hook = _alpha(reduce_scatter_op, predivide_factor, postdivide_factor,
                                        gradient_divide_factor, world_size,
                                        all_reduce_hook is not None)
        handle = _get_device_handle(device.type)
        current_stream = handle.current_stream()
        grads = [None] * len(self.fsdp_params)
        for fp, grad in zip(fsdp_params, unsharded_grads):
            grads[self.index[id(fp)]] = grad if grad.is_contiguous() else grad.contiguous()
        missing = [p for p, x in enumerate(grads) if x is None]
        if missing and grad_views is None:
            # Parameters without a gradient this step contribute zeros (their sharded
            # gradients are left untouched below, as in stock).
            need = max(g.params[p].dim0 * g.params[p].inner for p in missing)
            if (self.zero_grad is None or self.zero_grad.numel() < need
                    or self.zero_grad.dtype != grad_dtype):
                self.zero_grad = torch.zeros(need, dtype=grad_dtype, device=device)
            for p in missing:
                geo = g.params[p]
                grads[p] = self.zero_grad[:geo.dim0 * geo.inner]
        keepalive = grads
        if grad_views is not None:
            # Slot-Reuse: stage the gradients in landing slot 1 (parameter-major, as the
            # group's own layout) and free autograd's storage now.
            with torch.no_grad():
                for p, view in enumerate(grad_views):
                    if grads[p] is None:
                        view.zero_()
                    else:
                        view.copy_(grads[p].view(-1))
            grads = list(grad_views)
            keepalive = None
        unsharded_grads.clear()
        reduce_scatter_stream.wait_stream(current_stream)
        with handle.stream(reduce_scatter_stream):
            reduce_output = torch.empty(g.out_numel, dtype=torch.float32, device=device)
            stream = handle.current_stream() if device.type == "cuda" else None
            g.reduce_scatter(grads, reduce_output, alpha=alpha, accumulate=False,
                             stream=stream)
            self.calls["reduce_scatter"] += 1
            if g is not self.group:
                self.calls["wide_reduce_scatter"] += 1
            reduce_scatter_event = reduce_scatter_stream.record_event()
            post_reduce_stream = reduce_scatter_stream
        # -- END: ops in reduce_scatter stream

        if all_reduce_hook is not None:
            post_reduce_stream = all_reduce_stream
            all_reduce_stream.wait_stream(reduce_scatter_stream)
            with handle.stream(all_reduce_stream):
                if reduce_dtype != torch.float32:
                    reduce_output = reduce_output.to(reduce_dtype)  # the hook's dtype
                all_reduce_hook(reduce_output)

        with handle.stream(post_reduce_stream):
            _div_if_needed(reduce_output, post_after_hook)
            reduce_output = _to_dtype_if_needed(reduce_output, orig_dtype)
            for fsdp_param in fsdp_params:
                geo = g.params[self.index[id(fsdp_param)]]
                new_sharded_grad = torch.as_strided(
                    reduce_output,
                    size=fsdp_param.sharded_size,
                    stride=fsdp_param.contiguous_sharded_stride,
                    storage_offset=geo.fp32_offset // 4,
                )
                to_accumulate_grad = fsdp_param.sharded_param.grad is not None
                if to_accumulate_grad:
                    if not isinstance(fsdp_param.sharded_param.grad, DTensor):
                        raise AssertionError(
                            f"Expected fsdp_param.sharded_param.grad to be DTensor, got "
                            f"{type(fsdp_param.sharded_param.grad)}")
                    fsdp_param.sharded_param.grad._local_tensor += new_sharded_grad
                else:
                    new_sharded_dtensor_grad = fsdp_param.to_sharded_dtensor(new_sharded_grad)
                    fsdp_param.sharded_param.grad = new_sharded_dtensor_grad
                if not compiled_autograd_enabled():
                    for hook in (getattr(fsdp_param.sharded_param,
                                         "_post_accumulate_grad_hooks", {}) or {}).values():
                        hook(fsdp_param.sharded_param)
            post_reduce_event = post_reduce_stream.record_event()
        # In-Place: TIDE-RS read the gradients where autograd left them; they stay alive until
        # the next group's post_backward waits on reduce_scatter_event (FSDP2 keeps the
        # returned "input" until then), which covers TIDE's read completion.
        holder = torch.empty(0, device=device)
        holder._tide_keepalive = keepalive
        return (holder, reduce_scatter_event, post_reduce_event, None, None, None)

    def close(self):
        if self.wide is not None:
            self.wide.close()
            self.wide = None
        self.group.close()


_RESULT_CLASS = []


def _TideAllGatherResult(result):
    """torch's AllGatherResult, as a subclass marked as TIDE's so that the copy-out
    dispatcher never mistakes a stock result for one of ours."""
    if not _RESULT_CLASS:
        base = type(result)
        _RESULT_CLASS.append(type("TideAllGatherResult", (base,), {"__slots__": (),
                                                                  "_tide": True}))
    return _RESULT_CLASS[0](*result)


def _alpha(op, predivide, postdivide, factor, world_size, has_hook):
    """(alpha, divisor left for after the hook) of the op and divisors that torch's
    _get_gradient_divide_factors chose."""
    from torch.distributed import ReduceOp

    pre = 1.0 if predivide in (None, 1) else float(predivide)
    post = 1.0 if postdivide in (None, 1) else float(postdivide)
    if op == ReduceOp.AVG:
        scale = float(_lib.require("tide_alpha_avg")(world_size))
    elif op == ReduceOp.PREMUL_SUM:
        # _make_nccl_premul_sum(1 / factor): the factor is the group's divide factor.
        scale = 1.0 / float(factor)
    elif op == ReduceOp.SUM:
        scale = 1.0
    else:
        raise RuntimeError("tide.fsdp: reduce op %r is not a sum" % (op,))
    if has_hook:
        return scale / pre, (None if post == 1.0 else post)
    if (pre, post) != (1.0, 1.0):
        scale *= float(_lib.require("tide_alpha_divide")(pre, post))
    return scale, None


__all__ = ["Tier1Group", "install", "uninstall_if_unused"]
