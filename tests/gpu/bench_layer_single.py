#!/usr/bin/env python3
"""bench_layer_single.py - bench_fsdp_layers.py's layer on the single-process CUDA fabric: the
reference the one-process-per-rank fabric is measured against (issue 25: multi-process AG and
RS within 1.25x of these times).

For each N: one process, N virtual ranks on GPU 0 (tide_comm_init_all(TIDE_FABRIC_CUDA, 1, N)),
one group of the layer's parameter shapes in FSDP2 order (bf16, TIDE_RS_IN_PLACE); one AG
call and one RS call of all N ranks, each timed on the GPU (CUDA events around the N ranks'
calls, the stream held on the GPU while the host enqueues: bench_torch_baseline.timed), median
over --iters after two warm-up calls.  That is the time the GPU takes for every rank's part of
the collective, as bench_fsdp_layers' TIDE figure is (the slowest of N concurrent processes).

Bytes each design must move (against the device's HBM peak, read + write, as bench_fsdp_layers):
  AG  2 U per rank (every rank's landing written once, its sources read once): 2 N U
  RS  G + F per rank (every gradient read once, every fp32 shard written once): N (G + F)
with U the unsharded group bytes, G one rank's gradient bytes, F = 4 x shard elements.
The same byte counts apply to both fabrics, so the share and the ratio mean the same.

  python3 tests/gpu/bench_layer_single.py --lib build/libtide.so [--worlds 2,4,8] [--iters 10]
      [--dim 4096 --hidden 11008 --heads 32] [--sum-ctas C --landing-ctas C] [--json FILE]
      [--mp-json FILE ...]   bench_fsdp_layers --json outputs: print their TIDE times beside,
                             with the ratio multi-process / single-process (1.25 is the bar)
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_fsdp_layers as bfl  # noqa: E402  (also puts python/ and python/tests on sys.path)
import bench_torch_baseline as btb  # noqa: E402

import torch  # noqa: E402


def layer_shapes(dim, hidden, heads):
    """(D_p, K_p) of the layer's parameters in FSDP2 order (named_parameters)."""
    block = bfl._layer(dim, hidden, heads, torch.bfloat16)
    return [(p.shape[0], math.prod(p.shape[1:])) for _n, p in block.named_parameters()]


def run(tide, n, shapes, iters, sum_ctas, landing_ctas, stream):
    P = len(shapes)
    R = [(d + n - 1) // n for d, _ in shapes]
    E = sum(R[p] * shapes[p][1] for p in range(P))  # shard elements
    U = n * E * 2                                    # unsharded group bytes (bf16)
    G = sum(d * k for d, k in shapes) * 2            # one rank's gradient bytes (bf16)
    F = 4 * E                                        # one rank's fp32 output bytes
    cfg = btb.Config(ctypes.sizeof(btb.Config), btb.TIDE_CONFIG_MAGIC, tide.version, 1, n, 0, 0,
                     0, 0, btb.TIDE_RS_IN_PLACE, sum_ctas, landing_ctas, 0)
    shp = (btb.Shape * P)(*[btb.Shape(d, k) for d, k in shapes])
    desc = btb.GroupDesc(P, shp, btb.TIDE_DTYPE_BF16, btb.TIDE_DTYPE_BF16, btb.TIDE_DTYPE_BF16)
    comms, groups = btb.tide_world(tide, 1, n, cfg, desc, None)
    try:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(4321 + n)
        shard = torch.empty((n, E), dtype=torch.bfloat16, device="cuda")
        btb.fill_ints(shard, gen)
        grads = []
        for d, k in shapes:
            g = torch.empty((n, d, k), dtype=torch.bfloat16, device="cuda")
            btb.fill_ints(g, gen)
            grads.append(g)
        tables = [(ctypes.c_void_p * P)(*[grads[p][r].data_ptr() for p in range(P)])
                  for r in range(n)]
        out = torch.empty((n, E), dtype=torch.float32, device="cuda")
        sh = ctypes.c_void_p(stream.cuda_stream)
        alpha = 1.0 / n if (n & (n - 1)) == 0 else 1.0
        slot = [0]

        def ag():
            for r in range(n):
                tide.check(tide.lib.tide_all_gather(groups[r], shard[r].data_ptr(), slot[0],
                                                    sh), "tide_all_gather")
            slot[0] ^= 1

        def rs():
            for r in range(n):
                tide.check(tide.lib.tide_reduce_scatter(groups[r], tables[r],
                                                        out[r].data_ptr(), alpha, 0,
                                                        btb.TIDE_RS_IN_PLACE, sh),
                           "tide_reduce_scatter")

        ag_ms, rs_ms = [], []
        for it in range(iters + 2):
            a, b = btb.timed(ag, stream), btb.timed(rs, stream)
            if it >= 2:
                ag_ms.append(a)
                rs_ms.append(b)
        ag_t, rs_t = statistics.median(ag_ms), statistics.median(rs_ms)
        return {"world": n, "U": U, "G": G, "F": F, "ag_ms": ag_t, "rs_ms": rs_t,
                "ag_bytes": 2 * n * U, "rs_bytes": n * (G + F),
                "ag_roofline": 2 * n * U / (ag_t / 1e3 * bfl.ROOFLINE),
                "rs_roofline": n * (G + F) / (rs_t / 1e3 * bfl.ROOFLINE)}
    finally:
        torch.cuda.synchronize()
        btb.tide_world_close(tide, comms, groups)


def mp_times(paths):
    """{world: {"ag_ms", "rs_ms", "label"}} from bench_fsdp_layers --json files."""
    found = {}
    for path in paths:
        try:
            with open(path) as f:
                rep = json.load(f)
        except (OSError, ValueError) as exc:
            # A multi-process run that failed leaves no (or a partial) file: say so, and
            # still time the single-process side.
            print("no multi-process figures from %s: %s" % (path, exc))
            continue
        gated = rep.get("config", {}).get("start") == "gate"
        for row in rep.get("rows", []):
            t = row.get("tide", {})
            if "ag_ms" in t:
                found.setdefault(row["world"], []).append(
                    (os.path.basename(path), t["ag_ms"], t["rs_ms"]))
            if "rs_collective_ms" in t:
                # The same work as this benchmark's RS: the collective alone, fp32 output.
                found.setdefault(row["world"], []).append(
                    (os.path.basename(path) + " [AG; RS collective alone%s]"
                     % ("; common start gate" if gated else ""), t["ag_ms"],
                     t["rs_collective_ms"]))
            if "rs_collective_min_ms" in t and "ag_min_ms" in t and not gated:
                # The last rank to start: the RS without the skew of the processes' starts,
                # as here, where one hold precedes every rank's call (the AG: a lower bound).
                found.setdefault(row["world"], []).append(
                    (os.path.basename(path) + " [last rank to start; RS collective alone]",
                     t["ag_min_ms"], t["rs_collective_min_ms"]))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True, help="libtide.so built with -DTIDE_WITH_CUDA=ON")
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=11008)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--sum-ctas", type=int, default=0)
    ap.add_argument("--landing-ctas", type=int, default=0)
    ap.add_argument("--hold-ms", type=float, default=20.0)
    ap.add_argument("--json")
    ap.add_argument("--mp-json", action="append", default=[])
    args = ap.parse_args()
    bfl._check_env()
    torch.cuda.set_device(0)
    props = torch.cuda.get_device_properties(0)
    clock_khz = props.clock_rate if hasattr(props, "clock_rate") else 1980000
    btb.HOLD_CYCLES = int(args.hold_ms * clock_khz)
    tide = btb.Tide(os.path.abspath(args.lib))
    stream = torch.cuda.Stream()
    shapes = layer_shapes(args.dim, args.hidden, args.heads)
    mp = mp_times(args.mp_json)
    rows, worst = [], 0.0
    bfl.ROOFLINE = bfl.hbm_peak() or bfl.ROOFLINE
    print("layer dim %d hidden %d (%d parameters), bf16, single-process CUDA fabric on %s; HBM "
          "roofline %.2f TB/s" % (args.dim, args.hidden, len(shapes),
                                  torch.cuda.get_device_name(0), bfl.ROOFLINE / 1e12))
    for n in [int(w) for w in args.worlds.split(",") if w]:
        with torch.cuda.stream(stream):
            row = run(tide, n, shapes, args.iters, args.sum_ctas, args.landing_ctas, stream)
        rows.append(row)
        print("N = %d: AG %.3f ms (%.1f%% of %.1f MiB at the roofline)  RS %.3f ms (%.1f%%)"
              % (n, row["ag_ms"], 100 * row["ag_roofline"], row["ag_bytes"] / 2**20,
                 row["rs_ms"], 100 * row["rs_roofline"]))
        for label, ag, rs in mp.get(n, []):
            ra, rr = ag / row["ag_ms"], rs / row["rs_ms"]
            worst = max(worst, ra, rr)
            print("    multi-process (%s): AG %.3f ms = %.2fx, RS %.3f ms = %.2fx %s"
                  % (label, ag, ra, rs, rr, "ok" if max(ra, rr) <= 1.25 else "ABOVE 1.25x"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "shapes": shapes,
                       "roofline_bytes_per_s": bfl.ROOFLINE, "rows": rows,
                       "sum_ctas": args.sum_ctas, "landing_ctas": args.landing_ctas}, f,
                      indent=1)
    if mp:
        print("largest multi-process / single-process ratio: %.2fx (bar: 1.25x)" % worst)


if __name__ == "__main__":
    main()
