"""tide.fsdp: TIDE-AG and TIDE-RS inside PyTorch FSDP2 (fully_shard).

    model = ...; fully_shard(layer) for each layer; fully_shard(model)
    tide.fsdp.enable(model, mode="in_place")      # or mode="slot_reuse"
    ... train ...
    tide.fsdp.disable(model)

enable() is collective over the parameter groups' process group: every rank calls it with
the same model, between steps.  For each FSDPParamGroup of `model` (the root and every
fully_shard submodule) it chooses:

- Tier 1 (zero copy), when the installed torch has the internals Tier 1 was written for
  (torch 2.11, see _internals.py): unsharded parameters live in TIDE's landing slot, TIDE-AG
  lands in them, TIDE-RS reads per-parameter gradients.  See _tier1.py.
- Tier 0 (public hooks), when torch's internals differ but set_custom_all_gather /
  set_custom_reduce_scatter exist (or tier=0 is asked for): FSDP2's own buffers, TIDE moving
  the bytes.  See _tier0.py.
- stock FSDP2, with one log line naming the reason, for groups outside TIDE's contract:
  sharding off dim 0, more than 256 parameters, mixed or unsupported dtypes, CPU offload,
  all-gather extensions (fsdp_pre_all_gather), DTensor (TP) parameters, world size 1, meshes
  without a shard dimension, reshard_after_forward to a smaller mesh, custom communication
  hooks.  HSDP is served on its shard dimension (_hsdp.py).

Groups on different shard process groups (a dense part on the full mesh and experts on an
expert sub-mesh; every replica of an HSDP mesh) get one communicator per process group, all
in one enable(), each on the topology its global ranks have in the job's node layout
(_topology.py).  Ranks whose groups disagree (shapes, dtypes, tier, mode, topology) abort
enable() with a RuntimeError on every rank before anything is registered.
"""

import gc
import hashlib
import logging
import math

import torch
import torch.distributed as dist

from .. import _lib
from ..torch_binding import Comm
from . import _compile, _graph, _internals, _pool, _ring, _tier0, _tier1, _topology, _tuning

logger = logging.getLogger("tide.fsdp")

_MODES = {"in_place": "in-place", "in-place": "in-place", "slot_reuse": "slot-reuse",
          "slot-reuse": "slot-reuse"}


class GroupSpec:
    """What TIDE registers for one FSDPParamGroup."""

    def __init__(self, name, shapes, ag_dtype, grad_dtype, shard_dtype, shard_numels,
                 rs_dtype):
        self.name = name
        self.shapes = shapes
        self.ag_dtype = ag_dtype
        self.grad_dtype = grad_dtype
        self.shard_dtype = shard_dtype
        self.shard_numels = shard_numels
        self.rs_dtype = rs_dtype

    def key(self):
        return (self.name, tuple(self.shapes), str(self.ag_dtype), str(self.grad_dtype),
                str(self.shard_dtype), str(self.rs_dtype))


class Enabled:
    """What enable() did: `groups` [(fqn, tier)], `fallbacks` [(fqn, reason)], `mode`,
    `capture` ("stock" or "tide": what a CUDA graph capture of a step gets, _graph.py)."""

    def __init__(self, mode, comm, states, fallbacks, pg, ring=None, capture="stock"):
        self.mode = mode
        self.capture = capture
        self.ring = ring
        self.comm = comm
        self.states = states
        self.fallbacks = fallbacks
        self.process_group = pg
        # [(shard process group, Comm)]: one communicator per process group TIDE serves,
        # in enable's order; comm / process_group / ring are the first one's.
        self.comms = [(pg, comm)] if comm is not None else []

    @property
    def groups(self):
        return [(st.spec.name, st.tier) for st in self.states]

    def __repr__(self):
        return "<tide.fsdp.Enabled mode=%s groups=%s fallbacks=%s>" % (
            self.mode, self.groups, self.fallbacks)


def _param_groups(module):
    from torch.distributed.fsdp import FSDPModule

    out = []
    for name, m in module.named_modules():
        if isinstance(m, FSDPModule):
            pg = m._get_fsdp_state()._fsdp_param_group
            if pg is not None:
                out.append((name or "<root>", m, pg))
    return out


def _busy(name, pg):
    """Why group `name` cannot be registered or released now (None when it can): it is
    unsharded or mid-step, or it holds gradients accumulated without reduction
    (set_requires_gradient_sync(False)), which FSDP2 keeps on the unsharded parameters that
    registration rebuilds on TIDE's landing and release drops: they would be lost."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    if pg._training_state != TrainingState.IDLE:
        return "group %s is in use (state %s)" % (name, pg._training_state.name)
    if not pg.is_sharded or pg._all_gather_result is not None:
        return "group %s is unsharded (unshard() before this forward)" % name
    for fp in pg.fsdp_params:
        unsharded = fp.__dict__.get("_unsharded_param")
        if fp.unsharded_accumulated_grad is not None or (
                unsharded is not None and unsharded.grad is not None):
            return ("group %s holds unreduced gradients (accumulated with "
                    "set_requires_gradient_sync(False))" % name)
    return None


def _check_idle(name, pg, what):
    why = _busy(name, pg)
    if why is not None:
        raise RuntimeError("tide.fsdp.%s: %s; call it between steps" % (what, why))


def _contract(name, pg, tier):
    """(GroupSpec, None) for a group TIDE serves, else (None, reason)."""
    from torch.distributed.fsdp._fully_shard._fsdp_api import CPUOffloadPolicy
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
        DefaultAllGather, DefaultReduceScatter)
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo

    fps = pg.fsdp_params
    mesh = pg.mesh_info
    if not isinstance(mesh, FSDPMeshInfo):
        return None, "replicated meshes without a shard dimension are not supported"
    world = mesh.shard_mesh_size
    if world < 2:
        return None, "world size 1"
    if pg.post_forward_mesh_info not in (None, mesh):
        return None, "reshard_after_forward to a smaller mesh"
    if isinstance(pg.offload_policy, CPUOffloadPolicy):
        return None, "CPU offload"
    if len(fps) > _lib.MAX_PARAMS:
        return None, "%d parameters (TIDE serves at most %d)" % (len(fps), _lib.MAX_PARAMS)
    if type(pg._all_gather_comm) is not DefaultAllGather or type(
            pg._reduce_scatter_comm) is not DefaultReduceScatter:
        return None, "custom all-gather / reduce-scatter hooks are set"
    if pg.device.type not in ("cpu", "cuda"):
        return None, "device %s" % pg.device
    orig = {fp.sharded_param.dtype for fp in fps}
    if len(orig) != 1:
        return None, "mixed parameter dtypes %s" % sorted(str(d) for d in orig)
    orig = orig.pop()
    param_dtype = pg.mp_policy.param_dtype
    ag = orig if param_dtype is None else param_dtype
    if ag not in (torch.float32, torch.bfloat16) or orig not in (torch.float32,
                                                                 torch.bfloat16):
        return None, "dtype %s (TIDE serves bf16 and fp32)" % ag
    if ag == torch.float32 and orig == torch.bfloat16:
        return None, "bf16 masters all-gathered as fp32"
    shapes, numels = [], []
    for fp in fps:
        what = fp._param_fqn or repr(fp)
        if fp.fsdp_placement.dim != 0:
            return None, "%s is sharded on dim %d" % (what, fp.fsdp_placement.dim)
        if getattr(fp, "is_dtensor", False):
            return None, "%s is a DTensor (tensor parallel)" % what
        if hasattr(fp._sharded_local_tensor, "fsdp_pre_all_gather"):
            return None, "%s uses all-gather extensions" % what
        size = tuple(int(d) for d in fp._orig_size)
        if len(size) == 0 or min(size) < 1:
            return None, "%s has shape %s" % (what, size)
        rows = math.ceil(size[0] / world)
        inner = math.prod(size[1:])
        if (tuple(fp.padded_sharded_param_size)[0] != rows
                or fp._sharded_param_data.numel() != rows * inner):
            return None, "%s is not padded to ceil(D / N) rows" % what
        shapes.append(size)
        numels.append(rows * inner)
    reduce_dtype = pg.mp_policy.reduce_dtype or ag
    if tier == 0 and reduce_dtype not in (torch.float32, torch.bfloat16):
        return None, "reduce dtype %s" % reduce_dtype
    spec = GroupSpec(name, shapes, ag_dtype=ag, grad_dtype=ag,
                     shard_dtype=orig if tier == 1 else ag, shard_numels=numels,
                     rs_dtype=reduce_dtype)
    return spec, None


def _choose_tier(tier):
    problems = _internals.check()
    hooks = _internals.check_public_hooks()
    if tier is None:
        if not problems:
            return 1
        if not hooks:
            logger.warning("tide.fsdp: torch %s's FSDP2 internals differ from those Tier 1 "
                           "was written for (%s); using Tier 0 (public hooks)",
                           torch.__version__, "; ".join(problems))
            return 0
        raise RuntimeError("tide.fsdp: this torch (%s) offers neither the internals of Tier "
                           "1 (%s) nor the public hooks of Tier 0 (%s)"
                           % (torch.__version__, "; ".join(problems), "; ".join(hooks)))
    if tier == 1 and problems:
        raise RuntimeError("tide.fsdp: Tier 1 refused: torch %s's FSDP2 internals differ: %s"
                           % (torch.__version__, "; ".join(problems)))
    if tier == 0 and hooks:
        raise RuntimeError("tide.fsdp: Tier 0 refused: %s" % "; ".join(hooks))
    if tier not in (0, 1):
        raise ValueError("tier: expected None, 0 or 1, got %r" % (tier,))
    return tier


def _agree(pg, payload, what):
    digest = hashlib.sha256(repr(payload).encode()).hexdigest()
    everyone = [None] * dist.get_world_size(pg)
    dist.all_gather_object(everyone, digest, group=pg)
    if len(set(everyone)) != 1:
        raise RuntimeError("tide.fsdp.enable: ranks disagree on %s (digest per rank: %s); "
                           "every rank must enable the same model the same way"
                           % (what, ", ".join(d[:12] for d in everyone)))


def enable(module, mode="in_place", tier=None, nodes=None, gpus_per_node=None, tuning=None,
           reduce_in_fp32=False, capture=None):
    """Switch `module`'s FSDP2 parameter groups to TIDE (collective; see the module doc).
    Returns an Enabled record.  mode: "in_place" or "slot_reuse"; tier: None (best
    available), 1 or 0; nodes / gpus_per_node: the job's node layout (every rank of the
    default process group; default: $LOCAL_WORLD_SIZE, else one node of <= 8 ranks, nodes
    of 8 beyond), from which each process group's M x L is read off the global ranks it
    holds (_topology.py: an expert subgroup with one rank per node is M x 1, the rail lane
    where its fabric runs it; a group with no uniform node-major M x L stays on stock
    FSDP2, listed in fallbacks); a layout that covers the one process group a call
    serves but not the job is that group's topology, as before; tuning: per-group knobs
    (see _tuning.py and docs/fsdp.md): None or "solver" (the sizing solver per group
    size), "default" (the planner's defaults), a dict of tide_config_t tuning fields for
    every group, or a callable (group name, fp32 shard bytes) -> such a dict.
    reduce_in_fp32: False (the
    default) rounds each reduction to the MixedPrecisionPolicy's reduce dtype where stock
    FSDP2 rounds (stock's result; bit for bit at world 2); True keeps TIDE-RS's fp32 sum
    for a bf16 reduce dtype (Tier 1; see _rounding.py).  capture: what a CUDA graph capture
    of a step gets: "stock" (the default; None reads $TIDE_FSDP_CAPTURE) runs the served
    groups' calls made during a capture on stock FSDP2; "tide" captures TIDE-AG / TIDE-RS
    into the graph where the C layer can (_graph.py; docs/fsdp.md, "CUDA graphs")."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        raise ValueError("tide.fsdp.enable: %s is not an FSDP2 module; call fully_shard() on "
                         "it (and its layers) first" % type(module).__name__)
    if getattr(module, "_tide_fsdp", None) is not None:
        raise RuntimeError("tide.fsdp.enable: TIDE is already enabled on this module; call "
                           "tide.fsdp.disable() first")
    if mode not in _MODES:
        raise ValueError("mode: expected 'in_place' or 'slot_reuse', got %r" % (mode,))
    mode = _MODES[mode]
    capture = _graph.capture_mode(capture)
    groups = _param_groups(module)
    for name, _m, pg in groups:
        if any(id(fp) in _tier1._OWNERS for fp in pg.fsdp_params) or getattr(
                pg._all_gather_comm, "_tide", False):
            raise RuntimeError("tide.fsdp.enable: group %s already runs TIDE (enabled through "
                               "another module)" % name)
        _check_idle(name, pg, "enable")
    tier = _choose_tier(tier)
    specs, fallbacks = [], []
    traced = _compile.traceable_fsdp_reason()
    for name, _m, pg in groups:
        spec, why = _contract(name, pg, tier) if traced is None else (None, traced)
        if spec is None:
            if traced is None:
                logger.warning("tide.fsdp: group %s stays on stock FSDP2: %s", name, why)
            fallbacks.append((name, why))
        else:
            spec.reduce_in_fp32 = bool(reduce_in_fp32)
            specs.append((spec, pg, _m))
    if traced is not None and groups:
        logger.warning("tide.fsdp: every group (%d) stays on stock FSDP2: %s", len(groups),
                       traced)
    # One communicator per shard process group (the dense part on the full mesh, experts on
    # their sub-mesh, ...), in the order the groups first appear in named_modules(): every
    # rank of a process group reaches its agreement and registration in the same order.
    by_pg = []
    for entry in specs:
        shard_pg = entry[1].mesh_info.shard_process_group
        for pg_i, entries in by_pg:
            if pg_i is shard_pg:
                entries.append(entry)
                break
        else:
            by_pg.append((shard_pg, [entry]))
    # Every rank takes part in an agreement whenever there is a process group of 2 or more
    # ranks, even with nothing to register, so that a rank that would register a group
    # cannot wait alone in the collective.
    if not by_pg:
        agree_pg = next((getattr(pg.mesh_info, "shard_process_group", None)
                         for _n, _m2, pg in groups), None)
        if agree_pg is not None and dist.get_world_size(agree_pg) >= 2:
            _agree(agree_pg, (tier, mode, bool(reduce_in_fp32), capture, [], [],
                              [f[0] for f in fallbacks]), "the TIDE group signatures")
        module._tide_fsdp = Enabled(mode, None, [], fallbacks, None, capture=capture)
        return module._tide_fsdp
    # Each process group's M x L from the global ranks it holds and the job's layout
    # (_topology.py); a group with none stays on stock FSDP2.
    topologies = _topology.topologies([shard_pg for shard_pg, _e in by_pg], nodes,
                                      gpus_per_node)
    # What every process group agrees on besides its own groups: the contract's fallbacks,
    # the same on every rank of the job.  Later refusals (plan, topology) belong to one
    # process group and may differ between the groups a rank is in and those of its peers.
    agreed = [f[0] for f in fallbacks]
    done = []  # [(pg, comm, states, ring)]
    try:
        for (shard_pg, entries), topology in zip(by_pg, topologies):
            comm, states, ring = _enable_on(module, shard_pg, entries, tier, mode, topology,
                                            tuning, reduce_in_fp32, fallbacks, agreed,
                                            capture)
            if comm is not None:
                done.append((shard_pg, comm, states, ring))
    except BaseException:
        for _pg, comm, states, _unused_ring in done:
            _abandon(comm, states)
        raise
    if not done:
        module._tide_fsdp = Enabled(mode, None, [], fallbacks, None, capture=capture)
        return module._tide_fsdp
    if tier == 1:
        _tier1.install()
    pg0, comm0, _s, ring0 = done[0]
    module._tide_fsdp = Enabled(mode, comm0, [st for d in done for st in d[2]], fallbacks,
                                pg0, ring0, capture)
    module._tide_fsdp.comms = [(d[0], d[1]) for d in done]
    for st in module._tide_fsdp.states:  # calls that fall back later are listed there too
        st.fallback_sink = fallbacks
    logger.info("tide.fsdp: enabled %s", module._tide_fsdp)
    return module._tide_fsdp


def _enable_on(module, pg0, specs, tier, mode, topology, tuning, reduce_in_fp32, fallbacks,
               agreed, capture="stock"):
    """Agreement, planning and registration of the groups `specs` [(spec, pg, module)] of
    one shard process group `pg0` (collective over it) on `topology`, ((M, L), None) or
    (None, why not).  Returns (comm, states, ring), comm None when the library planned none
    of them."""
    shape, why = topology
    nodes, gpus_per_node = shape if shape is not None else (None, None)
    configs = [] if why is not None else [
        _tuning.config_for(spec, nodes, gpus_per_node, mode, tuning) for spec, _pg, _m in specs]
    # Also when the group has no topology: a rank that computed one (a job launched with
    # another $LOCAL_WORLD_SIZE on some ranks) raises here rather than waiting alone.
    _agree(pg0, (tier, mode, bool(reduce_in_fp32), capture, nodes, gpus_per_node, why,
                 [s.key() for s, _, _m in specs],
                 [_tuning.fields(c) for c in configs], agreed),
           "the TIDE group signatures")
    if why is not None:
        why = "no TIDE topology for its process group: " + why
        logger.warning("tide.fsdp: groups %s stay on stock FSDP2: %s",
                       ", ".join(spec.name for spec, _pg, _m in specs), why)
        fallbacks.extend((spec.name, why) for spec, _pg, _m in specs)
        return None, [], None
    # The library plans every group locally first: a group it does not serve is refused on
    # every rank alike, before any collective, and stays on stock FSDP2.
    kept = []
    for (spec, pg, m), config in zip(specs, configs):
        why = _tuning.plan_refusal(spec, config)
        if why is None:
            kept.append((spec, pg, m, config))
        else:
            logger.warning("tide.fsdp: group %s stays on stock FSDP2: %s", spec.name, why)
            fallbacks.append((spec.name, why))
    if not kept:
        return None, [], None
    comm = Comm.from_process_group(pg0, nodes, gpus_per_node, device=kept[0][1].device)
    states = []
    ring = None
    try:
        if tier == 1:
            states, ring = _register_tier1(module, comm, kept, mode, capture)
        else:
            graphs = _graph.Graphs(capture, comm)  # Tier 0: groups alone
            for spec, pg, _m, config in kept:
                states.append(_tier0.Tier0Group(pg, comm, spec, mode, graphs,
                                                **_tuning.fields(config)))
            graphs.members = list(states)
    except BaseException:
        _abandon(comm, states)
        raise
    return comm, states, ring


def _release_counted(states):
    """Drop the tensors that make the arenas visible to torch (_pool.py), before the
    groups that own the arenas are deregistered."""
    rings = {id(st.ring): st.ring for st in states if getattr(st, "ring", None) is not None}
    for ring in rings.values():
        _pool.release(ring.counted)


def _abandon(comm, states):
    for st in states:
        st.release()
    _release_counted(states)
    _tier1.uninstall_if_unused()
    for st in states:  # collective, like the registrations that succeeded everywhere
        try:
            st.close()
        except Exception:
            pass
    try:
        comm.close()
    except Exception:
        pass


def _register_tier1(module, comm, kept, mode, capture="stock"):
    """Tier1Groups of `kept` [(spec, pg, module, config)], in execution order, on one
    shared arena where the library can (_ring.py)."""
    slots = _ring.positions([_ring.lifetime(pg, m is module)
                             for _spec, pg, m, _config in kept])
    groups, shared, reg_entries = _ring.register(comm, [k[0] for k in kept],
                                                 [k[3] for k in kept],
                                                 [k[0].name for k in kept], slots)
    ring = _ring.Ring(shared, reg_entries)
    ring.graphs = _graph.Graphs(capture, comm)
    states = []
    try:
        for (spec, pg, _m, _config), g, slot in zip(kept, groups, slots):
            key = slot if shared and slot is not None else ("own", spec.name)
            states.append(_tier1.Tier1Group(pg, comm, spec, mode, g, ring, key))
    except BaseException:
        for st in states:
            st.release()
        _ring.close_quietly(groups)
        raise
    ring.graphs.members = list(states)
    # Accounting only: never fails enable (one log line when it cannot be set up).
    ring.counted = _pool.count(comm, groups)
    return states, ring


def disable(module):
    """Give `module`'s groups back to stock FSDP2 and release TIDE's arenas (collective,
    between steps).  While a tensor that aliases an arena is alive on some rank (e.g. a kept
    .detach() of an unsharded parameter), the model is back on stock FSDP2 but the arenas
    stay mapped: RuntimeError on every rank; drop the tensor and call disable() again."""
    handle = getattr(module, "_tide_fsdp", None)
    if handle is None:
        pending = getattr(module, "_tide_fsdp_closing", None)
        if pending is None:
            raise ValueError("tide.fsdp.disable: TIDE is not enabled on this module")
        return _close(module, pending)
    for st in handle.states:
        _check_idle(st.spec.name, st.param_group, "disable")
    for st in handle.states:
        st.release()
        _drop_all_gather_state(st.param_group)
    _tier1.uninstall_if_unused()
    module._tide_fsdp = None
    if handle.comm is not None:
        _close(module, handle)


def _close(module, handle):
    gc.collect()
    live = sum(st.group.live_views() for st in handle.states)
    flag = torch.tensor([live], dtype=torch.int64)
    comms = getattr(handle, "comms", None) or [(handle.process_group, handle.comm)]
    for pg, comm in comms:  # in enable's order: the same on every rank
        if pg is not None:
            if "nccl" in str(dist.get_backend(pg)).lower():
                flag = flag.to(comm.device)  # NCCL reduces device tensors only
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=pg)
    if int(flag.item()):
        module._tide_fsdp_closing = handle
        raise RuntimeError("tide.fsdp.disable: %d tensor(s) on this rank (at most %d on one "
                           "rank) still alias TIDE's arenas; the model runs stock FSDP2 now, "
                           "the arenas stay mapped until those tensors are dropped and "
                           "disable() is called again" % (live, int(flag.item())))
    module._tide_fsdp_closing = None
    _release_counted(handle.states)
    for st in handle.states:
        st.close()
    for _pg, comm in comms:
        comm.close()
    # The released states (hooks on FSDP2's groups, arena views, communicators) sit in
    # reference cycles.  Left to the interpreter's last collection, they went after the
    # process groups were destroyed, during finalisation, and that aborted the process
    # ("terminate called without an active exception") in about one run in seven of
    # docs/fsdp-example.py (gloo, torch 2.11); none in 35 runs with this collection.
    gc.collect()


def _drop_all_gather_state(pg):
    ctx = pg.comm_ctx
    state = getattr(ctx, "all_gather_state", None)
    if state is not None:
        ctx.all_gather_state = None


def enabled(module):
    """The Enabled record of `module`, or None."""
    return getattr(module, "_tide_fsdp", None)


def memory_report(module, file=None):
    """Per-rank bytes by region with TIDE next to stock FSDP2's (a model of stock's; see
    _memory.py); prints a table to `file` when given and returns the figures as a dict."""
    from . import _memory

    handle = enabled(module)
    if handle is None:
        raise ValueError("tide.fsdp.memory_report: TIDE is not enabled on this module")
    rep = _memory.report(handle)
    if file is not None:
        print(_memory.format_report(rep), file=file)
    return rep


from . import _auto  # noqa: E402

_auto.install_from_environment()

__all__ = ["Enabled", "disable", "enable", "enabled", "memory_report"]
