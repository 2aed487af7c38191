"""tide.fsdp.memory_report(model): where one rank's bytes go with TIDE, next to stock FSDP2.

TIDE's side is the library's plan of the communicator's arena (tide_arena_plan_create over
the registered set, or each group's own plan when the groups have one arena each), by
region, plus what TIDE keeps outside it (the fp32 companions of bf16 groups that accumulate
in fp32).  On the CPU fabric the arena's mapped size is also measured (/proc/self/maps).

Stock's side is a model, not a measurement, from the same group signatures:
- shards: every group's padded shard bytes (the same with TIDE: resident shards replace
  FSDP2's shard storage, and a casting group's masters live in one packed buffer instead);
- unsharded working set: the groups that stay unsharded through the forward (root,
  reshard_after_forward=False) plus two groups that reshard (the current one and the one
  prefetched), all-gather outputs that are the unsharded parameters;
- all-gather copy-in: two groups' packed shards (the in-flight and the prefetched one);
- reduce-scatter: the largest group's packed gradient input (N S in the reduce dtype) and
  its output (S in the reduce dtype).
Autograd's gradients and activations are the same on both sides and left out.

The arena is allocated by the fabric, not by torch's caching allocator: on the CPU fabric it
is POSIX shared memory, on the one-process-per-rank CUDA fabric one cuMemCreate segment per
rank (exported to the peers), on the NCCL fabric an ncclMemAlloc window.  A MemPool with
torch's own allocator cannot replace that (the caching allocator sub-allocates its segments
and may grow them as expandable segments, which are not exportable), so on the CUDA and NCCL
fabrics tide.fsdp keeps the fabric's allocation and makes its bytes visible instead: one
tensor of the segment's size in a MemPool whose pluggable allocator hands out that very
segment (_pool.py, docs/memory.md "Counted by PyTorch").  The report's counted_by_torch says
whether that happened (tide.counted_by_torch: the bytes); when it did, the torch_cuda figures
include the arena segments (the whole allocations: arena, flag areas and rounding).  On the
CPU fabric, or when the accounting could not be set up, the arena is on its own line only.
"""

import os

import torch

from ..plan import REGION_NAMES
from ..torch_binding import arena_plan


def _arena_summary(entries):
    """The library's plan of one arena for `entries` (the set's register entries)."""
    plan = arena_plan(entries)
    return {"total": plan["total_bytes"], "own_slots": plan["own_slot_bytes"],
            "largest_group": plan["largest_group_bytes"], "largest_rs": plan["largest_rs_bytes"],
            "separate": plan["separate_bytes"], "regions": dict(plan["region_bytes"])}


def mapped_arena_bytes(comm):
    """Bytes of this rank's share of the CPU fabric's shared-memory objects of `comm`'s
    registrations (the arenas; each object holds a header page, N arenas and the call
    records), from /proc/self/maps; None off the CPU fabric or off Linux."""
    if comm.device.type != "cpu" or not os.path.exists("/proc/self/maps"):
        return None
    prefix = "/dev/shm/tide.%s.g" % comm.name
    sizes = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith(prefix):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                path = parts[5].split(" (deleted)")[0].strip()
                sizes[path] = sizes.get(path, 0) + hi - lo
    return {"objects": len(sizes), "bytes": sum(sizes.values())}


def _stock_model(states):
    shards = unsharded_own = 0
    ring_groups, copy_in, rs = [], [], []
    for st in states:
        g = st.group
        shard = sum(st.numels) * torch.empty(0, dtype=st.spec.shard_dtype).element_size()
        ag_item = torch.empty(0, dtype=st.spec.ag_dtype).element_size()
        unsharded = g.ranks * sum(st.numels) * ag_item
        rs_item = torch.empty(0, dtype=st.spec.rs_dtype).element_size()
        shards += shard
        if st.slot_key in (0, 1):
            ring_groups.append(unsharded)
        else:
            unsharded_own += unsharded
        copy_in.append(sum(st.numels) * ag_item)
        rs.append(g.ranks * sum(st.numels) * rs_item + sum(st.numels) * rs_item)
    ring_groups.sort(reverse=True)
    copy_in.sort(reverse=True)
    return {"shards": shards, "unsharded": unsharded_own + sum(ring_groups[:2]),
            "all_gather_copy_in": sum(copy_in[:2]), "reduce_scatter": max(rs, default=0)}


def report(handle):
    """The figures of one Enabled record (Tier 1)."""
    states = [st for st in handle.states if st.tier == 1]
    ring = handle.ring
    rings = {id(st.ring): st.ring for st in states if st.ring is not None}
    counted = [c for r in rings.values() for c in r.counted]
    # counted_by_torch: the arena segments are in torch.cuda.memory_reserved() and memory
    # snapshots (_pool.py); False on the CPU fabric or when that could not be set up.
    out = {"shared_arena": bool(ring is not None and ring.shared), "tide": {}, "stock": {},
           "counted_by_torch": bool(counted)}
    if not states:
        return out
    if ring is not None and ring.shared:
        plan = _arena_summary(ring.entries)
    else:
        plan = {"total": sum(st.group.plan.summary["arena_bytes"] for st in states),
                "regions": {}, "separate": None}
    tide = {"arena": plan["total"], "arena_regions": plan["regions"],
            "arena_own_landings": plan.get("own_slots", 0),
            "arena_if_separate": plan.get("separate"),
            "shards_outside_arena": sum(st.packed.numel() * st.packed.element_size()
                                        for st in states if st.packed is not None),
            "fp32_companions": sum(st.wide.plan.summary["arena_bytes"]
                                   for st in states if st.wide is not None)}
    tide["counted_by_torch"] = sum(c.bytes for c in counted)
    mapped = mapped_arena_bytes(handle.comm)
    if mapped is not None:
        tide["mapped"] = mapped
    tide["total"] = tide["arena"] + tide["shards_outside_arena"] + tide["fp32_companions"]
    stock = _stock_model(states)
    stock["total"] = sum(stock.values())
    out["tide"], out["stock"] = tide, stock
    if handle.comm.device.type == "cuda":
        out["torch_cuda"] = {"allocated": torch.cuda.memory_allocated(handle.comm.device),
                             "reserved": torch.cuda.memory_reserved(handle.comm.device),
                             "max_allocated": torch.cuda.max_memory_allocated(
                                 handle.comm.device)}
    return out


def format_report(rep):
    def mib(x):
        return "%10.2f MiB" % (x / 2**20)

    lines = ["tide.fsdp memory per rank (%s arena)" % ("one shared" if rep["shared_arena"]
                                                       else "one per group")]
    tide, stock = rep["tide"], rep["stock"]
    if not tide:
        return lines[0] + ": no Tier 1 group"
    for name, b in sorted(tide["arena_regions"].items(), key=lambda kv: REGION_NAMES.index(
            kv[0])):
        lines.append("  arena %-12s %s" % (name, mib(b)))
    if tide.get("arena_own_landings"):
        lines.append("  arena own landings %s" % mib(tide["arena_own_landings"]))
    lines.append("  arena total        %s" % mib(tide["arena"]))
    if tide.get("arena_if_separate"):
        lines.append("  (one arena per group would be %s)" % mib(tide["arena_if_separate"]))
    lines.append("  shards outside     %s" % mib(tide["shards_outside_arena"]))
    lines.append("  fp32 companions    %s" % mib(tide["fp32_companions"]))
    lines.append("  TIDE total         %s" % mib(tide["total"]))
    if rep.get("counted_by_torch"):
        lines.append("  arena segments counted by torch (memory_reserved, snapshots) %s"
                     % mib(tide["counted_by_torch"]))
    else:
        lines.append("  the arena is not counted by torch.cuda.memory_reserved()")
    lines.append("stock FSDP2 (model):")
    for k in ("shards", "unsharded", "all_gather_copy_in", "reduce_scatter", "total"):
        lines.append("  %-18s %s" % (k, mib(stock[k])))
    return "\n".join(lines)
