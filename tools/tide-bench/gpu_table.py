#!/usr/bin/env python3
"""The main job's GPU table: tests/gpu/bench_torch_baseline.py's JSON as tide-bench rows.

    python3 tools/tide-bench/gpu_table.py RESULT.json [--json OUT.json]

bench_torch_baseline.py times TIDE (CUDA fabric) and PyTorch's own FSDP2 ops
(torch.ops.fsdp.all_gather_copy_in / split_with_sizes_copy, chunk_cat + the reduction) in one
process, on the same buffers, and records medians and shares of the HBM roofline.  This
prints one row per topology and collective, TIDE against PyTorch's ops: time, busbw
(nccl-tests' definition: bytes (N - 1) / N / time, bytes = the unsharded group) and the share
of the memory roofline.  --json writes the rows in tide-bench's JSON layout ("stock":
"torch"), which tools/tide-bench/plot.py draws.  Exit status 1 when any element was wrong.
"""
import argparse
import json
import sys


def rows_of(run):
    rows = []
    for res in run["results"]:
        n = res["ranks"]
        nbytes = int(round(res["group_mib"] * 2**20))
        med, share = res["median_ms"], res["roofline_share"]
        m, l = (int(x) for x in res["topology"].split("x"))
        for coll, tide, stock, wrong in (("all_gather", "tide_ag", "stock_ag", "ag"),
                                         ("reduce_scatter", "tide_rs", "stock_rs", "rs")):
            t_us, s_us = med[tide] * 1e3, med[stock] * 1e3
            busbw = lambda us: nbytes / (us * 1e3) * (n - 1) / n  # noqa: E731 (GB/s)
            rows.append({"collective": coll, "topology": res["topology"], "nodes": m,
                         "gpus_per_node": l, "divisor": res["divisor"], "bytes": nbytes,
                         "tide_us": t_us, "stock_us": s_us,
                         "algbw_gbps": nbytes / (t_us * 1e3), "busbw_gbps": busbw(t_us),
                         "stock_busbw_gbps": busbw(s_us), "tide_roofline_share": share[tide],
                         "stock_roofline_share": share[stock], "speedup": s_us / t_us,
                         "wrong": res["wrong"][wrong]})
    return rows


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    with open(a.result) as f:
        run = json.load(f)
    rows = rows_of(run)
    print("# %s, torch %s, device copy %.2f TB/s; stock = PyTorch's own FSDP2 ops in the same "
          "process; share = HBM roofline / time" % (run["device"], run["torch"],
                                                    run["copy_bw_tbps"]))
    print("%-15s %5s %6s %12s %10s %8s %6s %10s %8s %6s %8s %6s" % (
        "collective", "topo", "dim0/", "size(B)", "tide(us)", "busbw", "share", "torch(us)",
        "busbw", "share", "speedup", "#wrong"))
    for r in rows:
        print("%-15s %5s %6d %12d %10.1f %8.1f %5.0f%% %10.1f %8.1f %5.0f%% %7.2fx %6d" % (
            r["collective"], r["topology"], r["divisor"], r["bytes"], r["tide_us"],
            r["busbw_gbps"], 100 * r["tide_roofline_share"], r["stock_us"],
            r["stock_busbw_gbps"], 100 * r["stock_roofline_share"], r["speedup"], r["wrong"]))
    if a.json:
        first = run["results"][0] if run["results"] else {}
        with open(a.json, "w") as f:
            json.dump({"fabric": "cuda", "device": run["device"], "stock": "torch",
                       "nodes": rows[0]["nodes"] if rows else 0,
                       "gpus_per_node": rows[0]["gpus_per_node"] if rows else 0,
                       "preset": "llama3-70b-layer", "mode": "in-place",
                       "iters": first.get("iters"), "rows": rows}, f, indent=1)
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
