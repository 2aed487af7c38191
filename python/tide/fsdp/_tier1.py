"""Tier 1: zero-copy TIDE inside an FSDP2 parameter group.

What changes for a Tier 1 group (nothing changes for any other group):

- Each FSDPParam's all-gather output is a tensor whose storage starts at the parameter's
  landing address o_p N in the group's landing: its ring slot (slot g mod 2 of the
  communicator's shared arena, _ring.py) or a landing of its own.  TIDE-AG writes every
  rank's shard straight into it: no copy-out.
- Reshard frees: free_unsharded_param rebinds the unsharded parameter to an empty tensor
  (it holds no storage after reshard, as in stock) and tells the library that the slot's
  data are dead (tide_group_reshard), so the next group of the slot may land there; the next
  unshard binds it to its landing again.  Autograd's saved views of a
  reshard_after_forward group keep pointing at its slot; the backward re-gathers the group
  into the same slot before its backward reads them, exactly as stock re-fills the storage
  it resized to 0.
- Each sharded parameter's padded local shard is adopted (_adopt.py): into the group's
  resident region when the all-gather does not cast (no copy-in), into one packed fp32
  buffer of torch's when it casts (fp32 masters, bf16 all-gather: the masters are that
  buffer, TIDE casts as they land).  Every adopted shard sits at offset 0 of a storage of
  its own, so state dicts deep-copy, save and load as stock's.
- foreach_all_gather runs TIDE-AG into the landing; foreach_all_gather_copy_out only waits
  and binds the views; foreach_reduce hands the per-parameter gradients to TIDE-RS
  (In-Place: read where autograd left them; Slot-Reuse: copied into the ring slot the group
  just vacated, and freed), which writes the fp32 reduce output without the _chunk_cat pack.
  The rest of foreach_reduce is torch 2.11's code.

_fsdp_param_group's module globals are replaced by dispatchers (install / uninstall) that
send a call to the Tier 1 group owning its FSDPParams and every other call to torch's own
function, so groups that are not enabled, or fell back, run stock code.
"""

import logging

import torch

from .. import _lib
from . import _adopt, _auto, _graph, _hsdp, _rounding

logger = logging.getLogger("tide.fsdp")

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
                             all_gather_stream, device, all_gather_comm)

    def foreach_all_gather_copy_out(all_gather_result, fsdp_params, group):
        st = _owner(fsdp_params)
        if st is None or not getattr(all_gather_result, "_tide", False):
            out = _ORIGINALS["foreach_all_gather_copy_out"](all_gather_result, fsdp_params,
                                                            group)
            if st is not None:
                st.bind_stock_outputs()
            return out
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


def _storage_refs(t):
    """How many tensors (and Python storage objects) hold t's storage."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _noop():
    return None


def _key_name(key):
    return "ring slot %d" % key if isinstance(key, int) else "landing of its own"


class Tier1Group:
    """TIDE state of one FSDPParamGroup.  `group` is its registered TorchGroup, `ring` the
    communicator's _ring.Ring and `slot_key` its landing's key there."""

    tier = 1

    def __init__(self, param_group, comm, spec, mode, group, ring, slot_key):
        self.param_group = param_group
        self.comm = comm
        self.spec = spec
        self.mode = mode
        self.fsdp_params = list(param_group.fsdp_params)
        self.index = {id(fp): p for p, fp in enumerate(self.fsdp_params)}
        self.group = g = group
        self.ring = ring
        self.slot_key = slot_key
        # Capture routing of the communicator's groups (_graph.py).
        self.graphs = ring.graphs
        self.world = g.ranks
        numels = [geo.rows_per_rank * geo.inner for geo in g.params]
        self.numels = numels
        # The per-parameter storages in the landing (parameters and, for Slot-Reuse, the
        # gradients staged once the parameters are dead); the whole landing is the
        # all-gather output FSDP2 sees.
        self.param_views = [g.param_storage(0, p) for p in range(len(g.params))]
        self.landing0 = g.landing(0)
        self.grad_views = None
        if mode == "slot-reuse":
            # The vacated slot: FSDP2 reshards (post_backward) before it reduces.
            self.grad_views = [
                g.param_storage(0, p).view(spec.grad_dtype)[:geo.dim0 * geo.inner]
                for p, geo in enumerate(g.params)]
        # Shard adoption (paper §3.1; _adopt.py).
        if spec.shard_dtype == spec.ag_dtype:
            self.packed = None
            self.shard_views = _adopt.zero_offset_views(g.resident(), numels)
        else:
            self.packed = torch.empty(g.shard_numel, dtype=spec.shard_dtype, device=g.device)
            self.shard_views = _adopt.zero_offset_views(self.packed, numels)
        self.zero_grad = None
        self._order_logged = False
        self._defer_logged = False
        # The fp32-gradient companion group (see _wide_group), registered on first need.
        self.wide = None
        self.wide_grad_views = None
        self.wide_refused = None
        # live: unsharded into the landing, not resharded since.  on_stock: this unshard
        # ran on stock memory (the landing was held by another group).
        self.live = False
        self.on_stock = False
        # pending: the arguments of an all-gather deferred until its parameters are waited
        # for (its landing was held).  saved_in_slot: resharded in a forward that saved
        # views of the landing for the backward, not gathered there since.
        self.pending = None
        self.saved_in_slot = False
        self.landing_addresses = []
        # Calls made in Python: a call captured into a CUDA graph counts once (also as
        # captured_*), not once per replay.
        self.calls = {"all_gather": 0, "reduce_scatter": 0, "stock_reduce": 0, "copy_in": 0,
                      "wide_reduce_scatter": 0, "stock_all_gather": 0, "deferred_all_gather": 0,
                      "reshard": 0, "captured_all_gather": 0, "captured_reduce_scatter": 0}
        self._empty = torch.empty(0, dtype=spec.ag_dtype, device=g.device)
        self._adopt()
        # What holds each landing storage when nothing but TIDE and FSDP2 do (the view and
        # FSDP2's all_gather_outputs, one tensor); more at a later landing is an alias.
        self._baseline = [_storage_refs(v) for v in self.param_views]

    # ---------------------------------------------------------------- adoption

    def _adopt(self):
        for p, (fp, view) in enumerate(zip(self.fsdp_params, self.param_views)):
            if hasattr(fp, "_unsharded_param"):
                # Built by an earlier stock unshard on stock memory: rebuilt on the landing
                # by the next init_unsharded_param (the group is sharded here).
                del fp._unsharded_param
            fp.all_gather_outputs = [view]
            fp.free_unsharded_param = (lambda p=p: self._free(p))
            fp.alloc_all_gather_outputs = _noop
            _OWNERS[id(fp)] = self
        _adopt.adopt(self.fsdp_params, self.shard_views)

    def release(self):
        """Give the FSDPParams back to stock FSDP2 (the group must be sharded and idle)."""
        if self.packed is None:
            # The shards leave the arena for memory of their own before it is unmapped.
            _adopt.release(self.fsdp_params, self.shard_views)
        self.shard_views = []
        self.packed = None
        for fp in self.fsdp_params:
            _OWNERS.pop(id(fp), None)
            for name in ("free_unsharded_param", "alloc_all_gather_outputs"):
                fp.__dict__.pop(name, None)
            fp.all_gather_outputs = []
            if hasattr(fp, "_unsharded_param"):
                # An autograd graph the caller still holds (a loss tensor) may keep the
                # unsharded parameter alive through AccumulateGrad: move it off the arena
                # (as stock's free leaves it: no data), then drop it.
                with torch.no_grad():
                    fp._unsharded_param.data = torch.empty(
                        0, dtype=fp._unsharded_param.dtype, device=fp._unsharded_param.device)
                del fp._unsharded_param
        if self.ring is not None:
            for key in list(self.ring.occupant):
                if self.ring.occupant[key] is self:
                    del self.ring.occupant[key]
            for lst in self.ring.unchecked.values():
                if self in lst:
                    lst.remove(self)
        self.param_views = []
        self.landing0 = None
        self.grad_views = None
        self.wide_grad_views = None

    # ---------------------------------------------------------------- reshard

    def _free(self, p):
        """FSDPParam.free_unsharded_param of parameter p (FSDP2 frees them in order)."""
        fp = self.fsdp_params[p]
        if hasattr(fp, "_unsharded_param"):
            with torch.no_grad():
                fp._unsharded_param.data = self._empty
        fp.all_gather_outputs = [self.param_views[p]]
        if p == len(self.fsdp_params) - 1:
            self._resharded()

    def _resharded(self):
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

        was_live, self.live = self.live, False
        on_stock, self.on_stock = self.on_stock, False
        if not was_live or on_stock:
            return
        self.calls["reshard"] += 1
        state = self.param_group._training_state
        backward = state == TrainingState.POST_BACKWARD
        if not (self.mode == "slot-reuse" and backward and self.param_group.reduce_grads):
            self.release_slot()
        # else: the Slot-Reuse reduce-scatter that follows stages the gradients in the slot
        # and its read-done point ends the occupancy (docs/arena.md); Ring.claim releases
        # the slot should no reduction follow.
        if backward or state == TrainingState.IDLE or not torch.is_grad_enabled():
            # No autograd graph may still hold views of the landing (the backward ran, or
            # the forward saved nothing): any tensor that does is a kept alias.
            self.saved_in_slot = False
            self.ring.retire(self.slot_key, self)
        else:
            self.saved_in_slot = True

    def release_slot(self):
        """Tell the library this group's landing holds no live data (host side)."""
        if self.group.ring_slot is not None and self.group.slot_live():
            self.group.reshard()

    def check_no_alias(self, by):
        """Raise, naming this group, when a tensor still aliases one of its unsharded
        parameters after its reshard (e.g. a kept .detach()): `by` is about to overwrite
        that memory."""
        for p, view in enumerate(self.param_views):
            if _storage_refs(view) > self._baseline[p]:
                fp = self.fsdp_params[p]
                raise RuntimeError(
                    "tide.fsdp: a tensor still aliases the unsharded parameter %s of group %s "
                    "after the group was resharded (e.g. a .detach() of it kept past the "
                    "step); its memory is TIDE's landing %s, which %s is about to "
                    "overwrite.  Keep a .clone() instead, or call tide.fsdp.disable() first"
                    % (fp._param_fqn or p, self.spec.name, _key_name(self.slot_key),
                       "group " + by.spec.name if by is not self else "its next all-gather"))

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
                   device, all_gather_comm=None):
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
        args = (group, async_op, copy_in_stream, all_gather_stream, device, all_gather_comm)
        why = _auto._dispatch_reason() or self.graphs.check(self.group, self.spec.name,
                                                            "all_gather")
        if why is not None:
            return self._gather_on_stock(fsdp_params, args, why)
        if self.ring.claim(self.slot_key, self) is not None:
            # The landing is held by a live group (an order other than the planned one, e.g.
            # prefetching two groups ahead): gather when the parameters are waited for, by
            # which time the holder has usually resharded (copy_out).  Every rank defers
            # alike: the order is the same program on every rank.
            self.pending = args
            self.calls["deferred_all_gather"] += 1
            if not self._defer_logged:
                self._defer_logged = True
                logger.warning("tide.fsdp: group %s is unsharded ahead of time while group %s "
                               "still holds their shared %s (prefetching deeper than the "
                               "two-slot ring); such all-gathers of %s run when the parameters "
                               "are waited for", self.spec.name,
                               self.ring.occupant[self.slot_key].spec.name,
                               _key_name(self.slot_key), self.spec.name)
            result = AllGatherResult(self.landing0, None, None,
                                     [[self.spec.ag_dtype] for _ in fsdp_params],
                                     [[n] for n in self.numels], list(self.numels))
            return _TideAllGatherResult(result)
        return self._land(fsdp_params, *args)

    def _gather_on_stock(self, fsdp_params, args, why):
        """An all-gather under a TorchDispatchMode (CommDebugMode, ...): TIDE's collectives
        bypass the dispatcher, so the mode would not see them, and a mode that keeps
        parameter tensors (CommDebugMode's module tracker keeps param.data) would alias the
        landing.  Or in a CUDA graph capture that TIDE does not capture, or eagerly after one
        that it did (_graph.py: the library refuses those calls).  This
        call runs on stock FSDP2 memory; the dispatcher's copy-out binds the parameters to
        it, and the reshard drops it."""
        _graph.log_once(self, why, "gathers")
        for fp in fsdp_params:
            fp.all_gather_outputs = []  # stock's copy-out allocates its own
        self.on_stock = True
        self.live = True
        self.calls["stock_all_gather"] += 1
        return _ORIGINALS["foreach_all_gather"](fsdp_params, *args)

    def _land(self, fsdp_params, group, async_op, copy_in_stream, all_gather_stream, device,
              all_gather_comm):
        """TIDE-AG into the landing this group just claimed."""
        from torch.distributed.device_mesh import _get_device_handle
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import AllGatherResult

        handle = _get_device_handle(device.type)
        with torch.no_grad(), handle.stream(copy_in_stream):
            # Adopted shards are read in place.  One whose storage was replaced since
            # (load_state_dict(assign=True), a user's set_) is adopted again: one copy.
            self.calls["copy_in"] += _adopt.readopt_if_replaced(fsdp_params, self.shard_views)
        all_gather_stream.wait_stream(copy_in_stream)
        with handle.stream(all_gather_stream):
            stream = handle.current_stream() if device.type == "cuda" else None
            self.group.all_gather(self.packed, 0, stream=stream)
            self.graphs.note(self, "ag")
            event = all_gather_stream.record_event()
        self.live = True
        self.saved_in_slot = False  # the landing holds this group's parameters again
        result = AllGatherResult(self.landing0, event, None,
                                 [[self.spec.ag_dtype] for _ in fsdp_params],
                                 [[n] for n in self.numels], list(self.numels))
        return _TideAllGatherResult(result)

    def _land_pending(self, fsdp_params):
        """The deferred all-gather, at the moment its parameters are needed: into the
        landing if its holder has resharded since, else on stock FSDP2's memory."""
        args, self.pending = self.pending, None
        holder = self.ring.claim(self.slot_key, self)
        if holder is None:
            return self._land(fsdp_params, *args)
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

        if self.saved_in_slot and self.param_group._training_state == TrainingState.PRE_BACKWARD:
            # Autograd saved views of this group's landing in forward, and its backward is
            # about to read them; gathering elsewhere would leave them reading the holder's
            # parameters.  (A forward may gather elsewhere: the backward re-gathers.)
            raise RuntimeError(
                "tide.fsdp: group %s must unshard for its backward while group %s holds their "
                "shared %s, where the forward saved %s's parameters for the backward: an "
                "execution order the two-slot ring cannot serve (prefetching or calling "
                "modules out of the forward's order); disable TIDE for this model or keep "
                "the prefetch depth at one" % (self.spec.name, holder.spec.name,
                                               _key_name(self.slot_key), self.spec.name))
        if not self._order_logged:
            self._order_logged = True
            logger.warning(
                "tide.fsdp: group %s unshards while group %s still holds their shared %s "
                "(an execution order other than the planned one: a module called again, "
                "explicit prefetching more than one group ahead, another order in eval); "
                "such unshards of %s run on stock FSDP2 memory", self.spec.name,
                holder.spec.name, _key_name(self.slot_key), self.spec.name)
        group, async_op, copy_in_stream, all_gather_stream, device, all_gather_comm = args
        for fp in fsdp_params:
            fp.all_gather_outputs = []  # stock's copy-out allocates its own
        self.on_stock = True
        self.live = True
        self.calls["stock_all_gather"] += 1
        result = _ORIGINALS["foreach_all_gather"](fsdp_params, group, False, copy_in_stream,
                                                  all_gather_stream, device, all_gather_comm)
        _ORIGINALS["foreach_all_gather_copy_out"](result, fsdp_params, group)
        self.bind_stock_outputs()
        return None

    def bind_stock_outputs(self):
        """After stock's copy-out: the unsharded parameters onto its outputs."""
        for fp in self.fsdp_params:
            if hasattr(fp, "_unsharded_param"):
                with torch.no_grad():
                    fp._unsharded_param.data = torch.as_strided(
                        fp.all_gather_outputs[0], fp._orig_size, fp._contiguous_orig_stride,
                        storage_offset=0)

    def copy_out(self, result, fsdp_params, group):
        from torch.distributed.device_mesh import _get_device_handle

        if self.pending is not None:
            result = self._land_pending(fsdp_params)
            if result is None:
                return  # on stock memory, bound already
        device = result.all_gather_output.device
        handle = _get_device_handle(device.type)
        if result.all_gather_event is not None:
            handle.current_stream().wait_event(result.all_gather_event)
        # Nothing to copy: every unsharded parameter is a view of its landing storage.  A
        # parameter resharded since its last unshard is bound to it again here (the first
        # unshard builds it in init_unsharded_param, right after).
        addresses = []
        for p, fp in enumerate(fsdp_params):
            view = self.param_views[p]
            if not fp.all_gather_outputs or fp.all_gather_outputs[0] is not view:
                fp.all_gather_outputs = [view]
            if hasattr(fp, "_unsharded_param"):
                u = fp._unsharded_param
                if u.numel() == 0 or u.data_ptr() != view.data_ptr():
                    with torch.no_grad():
                        u.data = torch.as_strided(view, fp._orig_size,
                                                  fp._contiguous_orig_stride, storage_offset=0)
                addresses.append(u.data_ptr())
            else:
                addresses.append(view.data_ptr())
        self.landing_addresses = addresses

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
                                               torch.float32, mode=self.mode)
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

    def _slot_vacated(self):
        """Whether this group resharded out of its landing and nobody landed there since."""
        return (not self.live and not self.on_stock
                and self.ring.occupant.get(self.slot_key) is self)

    def _log_fallback(self, why):
        # Also in enabled(model).fallbacks (the list enable() returned), once.
        _graph.log_once(self, why, "reduces", "reductions")

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
        if reduce_scatter_group is None:
            return None  # never registered that way; stock handles it
        # Which group runs it (the fp32 companion for fp32 gradients of a bf16 group), and
        # whether Slot-Reuse stages the gradients in the landing (as decided below): the
        # library's capture verdict depends on both (the fence variant the call runs).
        if grad_dtype == self.spec.grad_dtype:
            staged = self.grad_views is not None and self._slot_vacated()
            runner, call = self.group, "reduce_scatter_staged" if staged else "reduce_scatter"
        else:
            runner, call = self.wide, "reduce_scatter"
        why = _auto._dispatch_reason() or self.graphs.check(runner, self.spec.name, call)
        if why is not None:  # see _gather_on_stock
            self._log_fallback(why)
            self.calls["stock_reduce"] += 1
            return None
        # all_reduce_group is set for HSDP only (FSDP2 passes it for meshes with a replicate
        # dimension, and a mesh without a shard dimension is never registered): _hsdp.py.
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
        if g is self.group and grad_views is not None and not self._slot_vacated():
            # The slot is not this group's to write now (its last unshard ran on stock
            # memory, or it is unsharded again): read the gradients in place this time.
            grad_views = None
            self.calls["in_place_reduce"] = self.calls.get("in_place_reduce", 0) + 1
        reduce_dtype = reduce_dtype or grad_dtype
        # Where stock rounds to a reduce dtype narrower than fp32 (enable(reduce_in_fp32=
        # False), the default), TIDE rounds too: the gradients when they are wider than the
        # reduce dtype (stock's pack casts them), and the fp32 sum (stock's reduce output is
        # in the reduce dtype).  See _rounding.py.
        rounding = _rounding.reduce_rounding(self.spec, reduce_dtype)
        if rounding is not None and grad_dtype != rounding:
            unsharded_grads[:] = _rounding.round_grads(unsharded_grads, rounding)
        (predivide_factor, postdivide_factor, reduce_scatter_op, all_reduce_op) = (
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
                                        all_reduce_hook is not None
                                        or all_reduce_group is not None)
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
            # Slot-Reuse: stage the gradients in the slot the group just vacated
            # (parameter-major, as its own layout) and free autograd's storage now.
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
            self.graphs.note(self, "rs")
            if g is not self.group:
                self.calls["wide_reduce_scatter"] += 1
            if rounding is not None:
                reduce_output = reduce_output.to(rounding)
            reduce_scatter_event = reduce_scatter_stream.record_event()
            post_reduce_stream = reduce_scatter_stream
            all_reduce_input = all_reduce_event = None
            if all_reduce_group is not None:  # HSDP: the replica all-reduce, as stock
                (deferred, reduce_output, post_reduce_stream, all_reduce_input,
                 all_reduce_event, partial_reduce_output) = _hsdp.replica_all_reduce(
                    reduce_output, reduce_scatter_stream, all_reduce_stream, handle,
                    all_reduce_group, all_reduce_op, all_reduce_grads, partial_reduce_output)
                if deferred:
                    self.calls["deferred_all_reduce"] = (
                        self.calls.get("deferred_all_reduce", 0) + 1)
                    holder = torch.empty(0, device=device)
                    holder._tide_keepalive = keepalive
                    return (holder, reduce_scatter_event, post_reduce_stream.record_event(),
                            None, None, partial_reduce_output)
                self.calls["replica_all_reduce"] = self.calls.get("replica_all_reduce", 0) + 1
        # -- END: ops in reduce_scatter stream

        if all_reduce_hook is not None:
            post_reduce_stream = all_reduce_stream
            all_reduce_stream.wait_stream(reduce_scatter_stream)
            with handle.stream(all_reduce_stream):
                if reduce_output.dtype != reduce_dtype:
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
        return (holder, reduce_scatter_event, post_reduce_event, all_reduce_input,
                all_reduce_event, None)

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
