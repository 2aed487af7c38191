"""tide.torch_binding.register_set: a set of groups on one shared arena (docs/arena.md), one
process per rank on the CPU fabric: the ring slots, the ring rule's error naming both groups,
reshard, Slot-Reuse from the ring slot equal to the group's In-Place result, the read-done
event."""

import os

import pytest

torch = pytest.importorskip("torch")

from tide import _lib  # noqa: E402
from tide import torch_binding as tb  # noqa: E402
from tide.plan import Config  # noqa: E402

import fsdp_harness  # noqa: E402

SHAPES = [[(6, 4), (5,)], [(9, 3), (4, 4)], [(6, 4), (5,)]]


def _wide(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    return x * torch.pow(2.0, torch.randint(-20, 21, shape, generator=g).float())


def _ring(rank, world):
    comm = tb.Comm.from_process_group(None, 1, world)
    specs = [{"config": Config(1, world, mode="slot-reuse"), "shapes": s,
              "ag_dtype": torch.bfloat16, "grad_dtype": torch.bfloat16, "ring_slot": i % 2,
              "name": "layers.%d" % i} for i, s in enumerate(SHAPES)]
    groups = tb.register_set(comm, specs)
    out = {}
    ptr = [g.landing(0).data_ptr() for g in groups]
    out["same_slot"] = ptr[0] == ptr[2] and ptr[0] != ptr[1]
    g0, g1, g2 = groups
    g0.all_gather(torch.zeros(g0.shard_numel, dtype=torch.bfloat16), 0)
    try:
        g2.all_gather(torch.zeros(g2.shard_numel, dtype=torch.bfloat16), 0)
        out["refused"] = ""
    except _lib.TideError as exc:
        out["refused"] = str(exc)
    out["live"] = g0.slot_live()
    g0.reshard()
    out["live_after"] = g0.slot_live()
    g2.all_gather(torch.zeros(g2.shard_numel, dtype=torch.bfloat16), 0)
    # Slot-Reuse: the gradients staged in layers.2's ring slot give what they give from
    # ordinary tensors (bit for bit), and the RS releases the slot.
    grads = [_wide(s, 10 * rank + p).to(torch.bfloat16) for p, s in enumerate(SHAPES[2])]
    ref = torch.zeros(g2.out_numel)
    g2.reduce_scatter(grads, ref)
    slot = g2.landing(0)
    staged, at = [], 0
    for gr in grads:
        view = slot[at:at + gr.numel()].view(gr.shape)
        view.copy_(gr)
        staged.append(view)
        at += gr.numel()
    got = torch.zeros(g2.out_numel)
    g2.reduce_scatter(staged, got)
    del staged, view, slot
    out["slot_reuse_equal"] = torch.equal(got, ref)
    out["released"] = not g2.slot_live()
    out["event"] = g2.read_done_event()
    # The registered arena is the planner's: the slots sit where arena_plan says.
    plan = tb.arena_plan(specs)
    base = ptr[0] - plan["groups"][0]["landing0"][0]
    out["plan_slots"] = all(ptr[i] - base == plan["groups"][i]["landing0"][0] for i in range(3))
    out["plan_total"] = plan["total_bytes"] == g0.plan.summary["arena_bytes"]
    for g in groups:
        g.close()
    comm.close()
    return out


def test_register_set_ring(tmp_path):
    recs = fsdp_harness.run(2, _ring, tmp_path)
    for rec in recs:
        assert rec["ok"], rec.get("traceback")
        r = rec["result"]
        assert r["same_slot"]
        assert "layers.2" in r["refused"] and "layers.0" in r["refused"], r["refused"]
        assert r["live"] and not r["live_after"]
        assert r["slot_reuse_equal"] and r["released"]
        assert r["event"] is None
        assert r["plan_slots"] and r["plan_total"]
