#!/usr/bin/env python3
"""fsdp_pool_gpu.py - the shared arena in PyTorch's memory accounting (issue 24 item 5).

World 2 as two processes on the one visible GPU over a gloo process group holding CUDA
tensors (the harness of fsdp_parity_gpu.py: TIDE's one-process-per-rank CUDA fabric moves
FSDP2's bytes).  The Llama of the CPU tests, widened to two blocks of 3.2 M parameters (DIMS),
is trained 3 AdamW steps on stock FSDP2 and 3 with tide.fsdp (Tier 1, In-Place), from the
same bits.  Per rank it checks:

- after enable(), memory_report says counted_by_torch, and one arena segment is counted: the
  segment tide_group_segment names for every group (one shared arena), at least the planned
  arena's bytes;
- torch.cuda.memory_reserved() grew across enable() by at least that segment's bytes;
- torch.cuda.memory_snapshot() has a segment at the segment's address of exactly its size;
- training equals stock bit for bit (the local shards after each of the 3 steps), on TIDE's
  shared arena, with no gloo all-gather or reduce-scatter for FSDP2 (fsdp_parity_gpu's
  checks);
- after disable(), torch gave the segment back through the free hook (the hooks' registry
  no longer knows the pointer) and the snapshot has no segment at its address.

    python3 tests/gpu/fsdp_pool_gpu.py --lib build-cuda/libtide.so [--timeout 60] [--json F]
    python3 tests/gpu/fsdp_pool_gpu.py --device cpu     # the script's own run off the GPU:
                                                        # parity, and "not counted" expected

Exit status 0 when every check passed.  Every process runs with NCCL_NVLS_ENABLE=0
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 (checked).
"""
import argparse
import os
import sys
import tempfile
import time

import fsdp_gpu
import fsdp_parity_gpu

SAFETY = fsdp_gpu.SAFETY
WORLD = 2
STEPS = 3
# Two blocks of 3.2 M parameters: an arena of tens of MiB, so that the segment is above the
# 10 MiB under which torch's caching allocator would round the request to 20 MiB (not
# counted, docs/memory.md); the tiny default model's arena is a few hundred KiB.
DIMS = dict(dim=512, heads=8, hidden=1408, layers=2)
_SEEN = []  # the counted segments seen after enable (in the rank process)


def _probe(point, model, rec):
    """What torch's accounting says at `point` (fsdp_train.train's probe)."""
    import torch

    import tide.fsdp
    from tide.fsdp import _pool

    cuda = next(model.parameters()).device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    out = {"reserved": torch.cuda.memory_reserved() if cuda else 0}
    if point == "after_enable":
        rep = tide.fsdp.memory_report(model)
        out["counted_by_torch"] = rep["counted_by_torch"]
        out["arena"] = rep["tide"]["arena"]
        out["counted"] = [(c.ptr, c.bytes) for c in rec.ring.counted]
        segs = set()
        for st in rec.states:
            try:
                segs.add(_pool.segment(st.group)[:2])
            except Exception as exc:  # the CPU fabric: no segment
                segs.add(("none", type(exc).__name__))
        out["segments"] = sorted(segs, key=str)
        out["snapshot"] = ([(s["address"], s["total_size"])
                            for s in torch.cuda.memory_snapshot()] if cuda else [])
        _SEEN[:] = out["counted"]
    elif point == "after_disable":
        out["left_counted"] = len(rec.ring.counted)  # emptied before deregistration
        # The hooks' registry: 0 once torch returned the segment through the free hook.
        out["registry"] = [_pool.state(ptr) for ptr, _n in _SEEN]
        out["snapshot"] = ([(s["address"], s["total_size"])
                            for s in torch.cuda.memory_snapshot()] if cuda else [])
    return out


def _rank(rank, world, device):
    import torch

    import fsdp_train

    fsdp_gpu.check_safety()
    if device == "cuda":
        fsdp_gpu.deterministic_cuda()
    t0 = time.monotonic()
    stock = fsdp_train.train(rank, world, steps=STEPS, device=device, dims=DIMS)
    tide_run = fsdp_train.train(rank, world, steps=STEPS, tide_mode="in_place", device=device,
                                probe=_probe, dims=DIMS)
    return {"stock": stock, "tide": tide_run, "seconds": time.monotonic() - t0}


def _check(res, device):
    """Failure messages of one rank (empty: passed)."""
    cfg = dict(tide_mode="in_place", steps=STEPS)
    problems, _dev = fsdp_parity_gpu._check(cfg, True, res["stock"], res["tide"], WORLD)
    if not res["tide"]["shared_arena"]:
        problems.append("the groups did not get one shared arena")
    pr = res["tide"]["probe"]
    after = pr["after_enable"]
    if device == "cpu":
        if after["counted_by_torch"] or after["counted"]:
            problems.append("the CPU fabric's arena was counted by torch: %s" % after)
        return problems
    if not after["counted_by_torch"] or len(after["counted"]) != 1:
        return problems + ["the arena is not counted by torch: %s" % after]
    ptr, nbytes = after["counted"][0]
    if after["segments"] != [(ptr, nbytes)]:
        problems.append("groups' segments %s, counted %s" % (after["segments"], (ptr, nbytes)))
    if nbytes < after["arena"]:
        problems.append("segment of %d bytes < the planned arena's %d" % (nbytes, after["arena"]))
    grew = after["reserved"] - pr["before_enable"]["reserved"]
    if grew < nbytes:
        problems.append("memory_reserved() grew by %d across enable, < the segment's %d"
                        % (grew, nbytes))
    if (ptr, nbytes) not in after["snapshot"]:
        problems.append("no snapshot segment at 0x%x of %d bytes (segments: %s)"
                        % (ptr, nbytes, after["snapshot"][:8]))
    gone = pr["after_disable"]
    if gone["left_counted"] or gone["registry"] != [0]:
        problems.append("disable did not give the segment back (counted left %d, registry "
                        "state %s; 2: torch still holds it)" % (gone["left_counted"],
                                                                 gone["registry"]))
    if any(a == ptr for a, _n in gone["snapshot"]):
        problems.append("the snapshot still has a segment at 0x%x after disable" % ptr)
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", help="libtide.so built with -DTIDE_WITH_CUDA=ON (TIDE_LIBRARY)")
    ap.add_argument("--timeout", type=int, default=60, help="seconds for the two ranks")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    fsdp_gpu.check_safety_or_exit()
    fsdp_gpu.use_lib(args.lib)
    import torch

    import fsdp_harness

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device")
    env = dict(SAFETY, CUBLAS_WORKSPACE_CONFIG=":4096:8", TIDE_FSDP_TORCH_POOL="1",
               TIDE_TIMEOUT_MS=os.environ.get("TIDE_TIMEOUT_MS", "30000"))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        records = fsdp_harness.run(WORLD, _rank, tmp, timeout=args.timeout, env=env,
                                   allow_failure=True, device=args.device)
    status, report = 0, {"torch": torch.__version__, "device": args.device, "ranks": []}
    for r, rec in enumerate(records):
        if not rec["ok"]:
            print("rank %d: FAIL: %s: %s\n%s" % (r, rec["type"], rec["error"],
                                                 rec.get("traceback", "")), flush=True)
            status = 1
            report["ranks"].append({"ok": False, "error": rec["error"]})
            continue
        res = rec["result"]
        problems = _check(res, args.device)
        after = res["tide"]["probe"]["after_enable"]
        status |= 1 if problems else 0
        print("rank %d: %s counted=%s segments=%s arena=%d reserved %d -> %d -> %d, "
              "%d steps bit-exact=%s (%.1f s)%s"
              % (r, "PASS" if not problems else "FAIL", after["counted"], after["segments"],
                 after["arena"], res["tide"]["probe"]["before_enable"]["reserved"],
                 after["reserved"], res["tide"]["probe"]["after_disable"]["reserved"], STEPS,
                 not any("differ" in p for p in problems), res["seconds"],
                 ("\n  " + "\n  ".join(problems)) if problems else ""), flush=True)
        report["ranks"].append({"ok": not problems, "problems": problems,
                                "probe": res["tide"]["probe"]})
    print("%s in %.1f s" % ("PASS" if status == 0 else "FAIL", time.monotonic() - t0))
    fsdp_gpu.finish(report, args.json, status)


if __name__ == "__main__":
    main()
