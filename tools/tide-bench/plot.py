#!/usr/bin/env python3
"""Draw tide-bench's busbw against size, TIDE and the stock path, from its JSON.

    python3 tools/tide-bench/plot.py RESULT.json OUT.png

tide-bench --plot OUT.png runs this script on the JSON of the run it just made.  One panel
per collective (all-gather, reduce-scatter), like the busbw columns of nccl-tests: the bus
bandwidth of each size, log-scaled size axis.  matplotlib is optional for TIDE itself; this
script alone needs it (scripts/deps.sh installs it for the tests).
"""
import json
import sys


def main(argv):
    if len(argv) != 3:
        print("usage: plot.py RESULT.json OUT.png", file=sys.stderr)
        return 2
    try:
        import matplotlib
    except ImportError:
        print("tide-bench --plot needs matplotlib (python3 -m pip install matplotlib, or "
              "./scripts/deps.sh); the table and --json work without it", file=sys.stderr)
        return 3
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    with open(argv[1]) as f:
        run = json.load(f)
    rows = run.get("rows", [])
    if not rows:
        print(f"plot.py: {argv[1]} has no rows", file=sys.stderr)
        return 1
    colls = [("all_gather", "all-gather"), ("reduce_scatter", "reduce-scatter")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    stock = "PyTorch's ops" if run.get("stock") == "torch" else "stock path (C stand-in)"
    for ax, (key, title) in zip(axes, colls):
        rs = sorted((r for r in rows if r["collective"] == key), key=lambda r: r["bytes"])
        if not rs:
            ax.set_visible(False)
            continue
        x = [r["bytes"] for r in rs]
        ax.plot(x, [r["busbw_gbps"] for r in rs], "o-", label="TIDE")
        ax.plot(x, [r["stock_busbw_gbps"] for r in rs], "s--", label=stock)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size of the unsharded group (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"tide-bench: fabric {run.get('fabric')}, {run.get('nodes')}x"
                 f"{run.get('gpus_per_node')}, {run.get('preset') or 'custom shapes'}, "
                 f"mode {run.get('mode')}, median of {run.get('iters')}")
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    print(f"tide-bench: wrote {argv[2]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
