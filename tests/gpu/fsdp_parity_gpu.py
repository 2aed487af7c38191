#!/usr/bin/env python3
"""fsdp_parity_gpu.py - tide.fsdp against stock FSDP2 on one GPU, one process per rank.

The tiny Llama of the CPU tests (python/tests/fsdp_model.py), the same seeds and data, >= 20
AdamW steps, world sizes 2, 4 and 8 as processes that all run on the one visible GPU.  In
every process the model is trained twice, from the same bits: once on stock FSDP2, once with
tide.fsdp.enable (Tier 1 or Tier 0, In-Place or Slot-Reuse, with and without gradient
accumulation), and the local parameter shards after every optimizer step must be equal bit
for bit.

The reference is real FSDP2 on CUDA tensors.  NCCL refuses two ranks on one GPU, so both runs
use a gloo process group: in torch 2.11 ProcessGroupGloo runs all_gather_into_tensor
(_allgather_base -> allgather, AsyncAllgatherCUDAWork: staged through pinned host memory on a
side stream, the caller's stream waits for the copy back) and reduce_scatter_tensor
(_reduce_scatter_base -> reduce_scatter_tensor_coalesced: a clone, allreduce with the
requested op, the rank's chunk copied out) on CUDA tensors.  FSDP2's own code path is
unchanged: copy-in, all-gather, copy-out, _chunk_cat, reduce-scatter, the gradient views and
the optimizer all run on the GPU.  With TIDE enabled, gloo moves none of FSDP2's bytes: TIDE's
CUDA fabric does (tide_comm_init_rank(TIDE_FABRIC_CUDA, ...), bootstrap over abstract Unix
sockets); the test checks that no gloo all-gather or reduce-scatter ran for FSDP2.

What is bit-exact and why (docs/fsdp.md, "Numerics"): world 2 in plain fp32 (a sum of two
values does not depend on its order, 1/2 is exact); any world with integer-exact gradients
(fsdp_model exact=True: every partial sum is exact).  Plain fp32 at world 4 and 8 is reported
(maximum deviation) but not required to be equal: gloo and TIDE sum in different orders.
Kernels are made deterministic (math SDPA, deterministic algorithms) so that the two runs of a
process compute the same gradients from the same parameters.

If gloo refuses ReduceOp.AVG on CUDA tensors, both runs use
set_force_sum_reduction_for_comms(True) (sum, then FSDP2's division), and the log says so.

    python3 tests/gpu/fsdp_parity_gpu.py --lib build/libtide.so [--worlds 2,4,8] [--steps 20]
        [--timeout 120] [--json FILE]

Exit status 0 when every world size that ran passed, 1 otherwise; a world size that fails or
hangs does not stop the others.  Every process runs with NCCL_NVLS_ENABLE=0
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 (checked; nothing here uses
NVLink multicast).
"""
import argparse
import json
import os
import sys
import tempfile
import time

import fsdp_gpu

SAFETY = fsdp_gpu.SAFETY


def _configs(world, steps, device="cuda"):
    """(config, bit_exact) pairs per world size."""
    out = []
    if world == 2:
        for mode in ("in_place", "slot_reuse"):
            out += [(dict(tide_mode=mode), True), (dict(tide_mode=mode, exact=True), True),
                    (dict(tide_mode=mode, accum=2), True)]
        out += [(dict(tide_mode="slot_reuse", exact=True, accum=2, sync_each_micro=True), True),
                (dict(tide_mode="in_place", tier=0), True),
                (dict(tide_mode="slot_reuse", tier=0, exact=True, accum=2), True)]
    elif world == 4:
        for mode in ("in_place", "slot_reuse"):
            out += [(dict(tide_mode=mode, exact=True), True),
                    (dict(tide_mode=mode, exact=True, accum=2), True)]
        out += [(dict(tide_mode="in_place", tier=0, exact=True), True),
                (dict(tide_mode="in_place"), False)]
    else:
        out += [(dict(tide_mode="in_place", exact=True), True),
                (dict(tide_mode="slot_reuse", exact=True, accum=2), True),
                (dict(tide_mode="in_place", tier=0, exact=True, accum=2), True)]
    return [(dict(c, steps=steps, device=device), exact) for c, exact in out]


def _rank(rank, world, configs, force_sum):
    """One rank: stock and TIDE runs of every config on the one GPU (fsdp_train.compare)."""
    import torch

    import fsdp_train

    fsdp_gpu.check_safety()
    if configs[0]["device"] == "cpu":  # --device cpu: the script's own check off the GPU
        return {"results": fsdp_train.compare(rank, world, configs), "seconds": 0.0}
    fsdp_gpu.deterministic_cuda()
    cfgs = [dict(c, force_sum=True) if force_sum else c for c in configs]
    t0 = time.monotonic()
    out = fsdp_train.compare(rank, world, cfgs)
    return {"results": out, "seconds": time.monotonic() - t0}


def _check(cfg, exact, stock, tide_run, world):
    """Failure messages for one config (empty: passed) and the maximum deviation."""
    import torch

    problems = []
    steps = cfg["steps"]
    if len(stock["params"]) != steps or len(tide_run["params"]) != steps:
        problems.append("expected %d steps, got %d / %d" % (steps, len(stock["params"]),
                                                           len(tide_run["params"])))
    equal = [all(torch.equal(a, b) for a, b in zip(pa, pb))
             for pa, pb in zip(stock["params"], tide_run["params"])]
    dev = max(max((a.double() - b.double()).abs().max().item() for a, b in zip(pa, pb))
              for pa, pb in zip(stock["params"], tide_run["params"]))
    if exact and not all(equal):
        problems.append("parameters differ from stock at steps %s (max |diff| %.3g)"
                        % ([s for s, e in enumerate(equal) if not e], dev))
    tier = cfg.get("tier", 1)
    if tide_run["fallbacks"]:
        problems.append("groups fell back to stock: %s" % tide_run["fallbacks"])
    if [t for _, t in tide_run["groups"]] != [tier] * 3:
        problems.append("groups %s, expected three of tier %d" % (tide_run["groups"], tier))
    accum = cfg.get("accum", 1)
    syncs = accum if cfg.get("sync_each_micro") or accum == 1 else 1
    for name, calls in tide_run["calls"].items():
        if calls["all_gather"] < steps * accum:
            problems.append("%s: %d TIDE all-gathers, expected >= %d"
                            % (name, calls["all_gather"], steps * accum))
        if calls["reduce_scatter"] != steps * syncs:
            problems.append("%s: %d TIDE reduce-scatters, expected %d"
                            % (name, calls["reduce_scatter"], steps * syncs))
    copies = tide_run["stock_copies"]
    if copies["all_gather_into_tensor"] or copies["reduce_scatter_tensor"]:
        problems.append("gloo moved FSDP2 bytes with TIDE enabled: %s" % copies)
    if tier == 1:
        if copies["split_with_sizes_copy"] or copies["_chunk_cat"]:
            problems.append("Tier 1 ran FSDP2's copy-out / pack: %s" % copies)
        first = tide_run["addresses"][0] if tide_run["addresses"] else []
        if len(first) != 21 or len(set(first)) != 21 or any(
                a != first for a in tide_run["addresses"]):
            problems.append("unsharded parameters did not stay at their landing addresses")
    if stock["stock_copies"]["all_gather_into_tensor"] == 0:
        problems.append("the stock run issued no gloo all-gather")
    return problems, dev


def run_world(world, steps, timeout, force_sum, device="cuda"):
    import fsdp_harness

    configs = _configs(world, steps, device)
    env = dict(SAFETY, CUBLAS_WORKSPACE_CONFIG=":4096:8",
               TIDE_TIMEOUT_MS=os.environ.get("TIDE_TIMEOUT_MS", "30000"))
    with tempfile.TemporaryDirectory() as tmp:
        records = fsdp_harness.run(world, _rank, tmp, timeout=timeout, env=env,
                                   allow_failure=True, configs=[c for c, _ in configs],
                                   force_sum=force_sum)
    failed = [(r, rec) for r, rec in enumerate(records) if not rec["ok"]]
    if failed:
        r, rec = failed[0]
        return None, "rank %d failed: %s: %s\n%s" % (r, rec["type"], rec["error"],
                                                     rec.get("traceback", ""))
    rows = []
    for r, rec in enumerate(records):
        for (cfg, exact), (_c, stock, tide_run) in zip(configs, rec["result"]["results"]):
            problems, dev = _check(cfg, exact, stock, tide_run, world)
            rows.append({"world": world, "rank": r, "config": {k: v for k, v in cfg.items()
                                                               if k != "device"},
                         "bit_exact_required": exact, "max_abs_diff": dev,
                         "loss_last": [stock["losses"][-1], tide_run["losses"][-1]],
                         "shared_arena": tide_run.get("shared_arena"),
                         "problems": problems})
    seconds = max(rec["result"]["seconds"] for rec in records)
    return rows, "%.1f s per rank" % seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", help="libtide.so built with -DTIDE_WITH_CUDA=ON (TIDE_LIBRARY)")
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=150, help="seconds per world size")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: run the same checks on the CPU fabric (checks the script)")
    args = ap.parse_args()
    fsdp_gpu.check_safety_or_exit()
    fsdp_gpu.use_lib(args.lib)
    if args.steps < 20:
        sys.exit("--steps: at least 20 optimizer steps")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device")
    status = 0
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)
              if args.device == "cuda" else "cpu",
              "worlds": {}}
    for world in [int(w) for w in args.worlds.split(",") if w]:
        t0 = time.monotonic()
        force_sum = False
        try:
            rows, note = run_world(world, args.steps, args.timeout, force_sum, args.device)
            if rows is None and "AVG" in note:
                print("world %d: gloo refused ReduceOp.AVG on CUDA (%s); both runs use "
                      "force_sum" % (world, note.splitlines()[0]), flush=True)
                force_sum = True
                rows, note = run_world(world, args.steps, args.timeout, force_sum,
                                       args.device)
        except Exception as exc:  # a hung or broken world size must not stop the others
            rows, note = None, "%s: %s" % (type(exc).__name__, exc)
        took = time.monotonic() - t0
        if rows is None:
            status = 1
            print("world %d: FAIL (%.0f s): %s" % (world, took, note), flush=True)
            report["worlds"][str(world)] = {"ok": False, "error": note}
            continue
        bad = [row for row in rows if row["problems"]]
        ok = not bad
        status |= 0 if ok else 1
        print("world %d: %s, %d config x rank checks, %d failed (%.0f s, %s%s)"
              % (world, "PASS" if ok else "FAIL", len(rows), len(bad), took, note,
                 ", force_sum" if force_sum else ""), flush=True)
        seen = set()
        for row in rows:
            key = json.dumps(row["config"], sort_keys=True)
            if row["rank"] == 0 or row["problems"]:
                print("  rank %d %-70s %s max|diff| %.3g, %s%s" % (
                    row["rank"], key, "bit-exact" if row["bit_exact_required"] else "spread",
                    row["max_abs_diff"],
                    {True: "shared arena", False: "one arena per group"}.get(
                        row["shared_arena"], "no ring"),
                    ("  " + "; ".join(row["problems"])) if row["problems"] else ""),
                    flush=True)
            seen.add(key)
        report["worlds"][str(world)] = {"ok": ok, "force_sum": force_sum, "rows": rows}
    fsdp_gpu.finish(report, args.json, status)


if __name__ == "__main__":
    main()
