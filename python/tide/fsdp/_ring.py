"""The all-gather ring of one communicator's Tier 1 groups (paper §5.3-5.4, docs/arena.md).

Registration.  All Tier 1 groups of a communicator are registered as one set on one shared
arena (tide_groups_register).  Ring positions follow the execution order -- the order of
the fully_shard modules in forward, taken as their order in named_modules(), which is the
forward order of the models FSDP2 wraps (blocks in a ModuleList) -- and the group at
position g lands in ring slot g mod 2 (positions()).  The FSDP2 root is live across every
other group's forward and gets a landing of its own; a reshard_after_forward=False group
folds into the ring when at most one group follows it (the last block, paper App. F), else
it gets its own landing too.  docs/memory.md gives each case's memory.

Every fabric serves a set (CPU, CUDA with one process for all ranks or one per rank, NCCL
on one node).  When the library cannot put the set on one arena (the NCCL fabric on several
nodes, TIDE_CUDA_MP_RAILS=1, or a library without tide_groups_register), every group is
registered alone, with its own arena, and one log line says so; memory_report's
shared_arena tells which happened.

Bookkeeping (per rank, host side).  Slot keys: 0 and 1 for the ring, ("own", name) for an
own landing or a group registered alone.  For each key the ring knows its occupant (the
group last gathered into it) and the groups resharded from it that have not been checked
for kept aliases yet (see Tier1Group.check_no_alias).  An all-gather whose slot is held by
another live group (an execution order other than the planned one: explicit prefetching
more than one group ahead, a module called out of order) does not land there: that call
runs on stock FSDP2 memory, with one log line per group.
"""

import logging

from .. import _lib
from ..torch_binding import register_set

logger = logging.getLogger("tide.fsdp")


def lifetime(pg, is_root):
    """"root" for the FSDP2 root (unsharded from the first forward to the end of the
    backward: FSDPState._lazy_init turns its resharding off unless the user set it, and even
    resharded it is live across every block's forward), "unsharded" for a group with
    reshard_after_forward=False (live from its forward to its backward), else "ring"."""
    if is_root:
        return "root"
    if pg.post_forward_mesh_info is None:
        return "unsharded"
    return "ring"


def positions(kinds):
    """Ring slots (0, 1, or None for a landing of its own) of groups in execution order,
    given their lifetime() kinds.  A "ring" group at position g takes slot g mod 2.  An
    "unsharded" group joins the ring (ring-tail folding, paper App. F) when at most one
    group follows it: the next group lands in the other slot and nothing lands in its slot
    before its backward, which comes right after that group's; otherwise, and for the root
    (live while every other group cycles through the ring), it gets a landing of its own."""
    out, g = [], 0
    for i, kind in enumerate(kinds):
        after = sum(1 for k in kinds[i + 1:] if k != "root")
        if kind == "ring" or (kind == "unsharded" and after <= 1):
            out.append(g % 2)
            g += 1
        else:
            out.append(None)
    return out


class Ring:
    def __init__(self, shared, entries=()):
        self.shared = shared          # one arena for the set (else one per group)
        self.entries = list(entries)  # what the set was registered with (memory_report)
        self.occupant = {}            # slot key -> Tier1Group last gathered there
        self.unchecked = {}           # slot key -> [Tier1Group] resharded, aliases unchecked
        self.counted = []             # [_pool.Counted]: arena segments torch's accounting sees

    def retire(self, key, st):
        lst = self.unchecked.setdefault(key, [])
        if st not in lst:
            lst.append(st)

    def claim(self, key, st):
        """Before st gathers into `key`: None when it may land there, else the live group
        holding it.  Raises (naming the group) when a tensor still aliases a resharded
        previous occupant's parameters, since the landing would overwrite it."""
        occ = self.occupant.get(key)
        if occ is not None and occ is not st and occ.live:
            return occ
        for prev in self.unchecked.pop(key, []):
            prev.check_no_alias(st)
        if occ is not None and occ is not st:
            occ.release_slot()  # resharded in Python; make the library agree (Slot-Reuse)
        self.occupant[key] = st
        return None


def register(comm, specs, configs, names, slots):
    """TorchGroups for `specs` (GroupSpec, execution order) on one arena, or one arena each
    when the library cannot share one; returns (groups, shared, entries)."""
    entries = []
    for spec, config, name, slot in zip(specs, configs, names, slots):
        entries.append(dict(config=config, shapes=spec.shapes, ag_dtype=spec.ag_dtype,
                            grad_dtype=spec.grad_dtype, shard_dtype=spec.shard_dtype,
                            ring_slot=slot, name=name))
    why = None
    if len(entries) > 1:
        try:
            return register_set(comm, entries), True, entries
        except OSError as exc:  # a library without the set API
            why = str(exc)
        except _lib.TideError as exc:
            # Planned and refused alike on every rank (UNSUPPORTED: a fabric without shared
            # arenas); anything else is a real error.
            if exc.code != _lib.Result.UNSUPPORTED:
                raise
            why = str(exc)
        logger.warning("tide.fsdp: the %d groups get one arena each, not one shared arena "
                       "(%s); memory: docs/memory.md", len(entries), why)
    groups = []
    try:
        for e in entries:
            groups.append(comm.register(e["shapes"], e["ag_dtype"], e["grad_dtype"],
                                        e["shard_dtype"], mode=_lib.mode_name(e["config"].mode),
                                        **_tuning_fields(e["config"])))
    except BaseException:
        close_quietly(groups)
        raise
    return groups, False, entries


def close_quietly(groups):
    """Release registered groups on an error path: the first error is the one to report."""
    for g in groups:
        try:
            g.close()
        except Exception:
            pass


_TUNING_FIELDS = ("wave_width", "round_width", "passes", "staging_slots", "sum_ctas",
                  "landing_ctas")


def _tuning_fields(config):
    return {f: getattr(config, f) for f in _TUNING_FIELDS}
