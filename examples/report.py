"""What train.py writes at the end: a summary table on stdout, and with --out the JSON of
every figure and a PNG (matplotlib) of the loss curves, step times and peak memory."""

import json
import os
import statistics
import sys

MIB = float(1 << 20)
LABELS = {"rss_peak_over_start": "peak RSS above start", "rss_peak": "peak RSS",
          "torch_peak_allocated": "torch peak allocated",
          "torch_peak_reserved": "torch peak reserved", "device_used": "device used"}


def summarize(rec):
    """Per run: the step time of the slowest rank, median over steps (the first, which
    includes FSDP2's lazy initialisation, left out when there are more), tokens/s from it,
    the peak of every memory metric over steps (per rank, and the largest rank), the mean
    loss over ranks per step."""
    times = [max(ts) for ts in zip(*rec["step_time_s"])]
    steady = times[1:] if len(times) > 1 else times
    step = statistics.median(steady)
    mem = {m: [max(per_rank) for per_rank in v] for m, v in rec["memory_bytes"].items()}
    return {"median_step_s": step, "tokens_per_s": rec["tokens_per_step"] / step,
            "peak_memory_bytes_per_rank": mem,
            "peak_memory_bytes": {m: max(v) for m, v in mem.items()},
            "mean_loss": [statistics.fmean(ls) for ls in zip(*rec["losses"])]}


def compare(stock, tide):
    """Losses of every rank at every step, TIDE against stock (same seed and data)."""
    pairs = [(a, b) for ra, rb in zip(stock["losses"], tide["losses"]) for a, b in zip(ra, rb)]
    s, t = stock["summary"], tide["summary"]
    return {"losses_bit_exact": stock["losses"] == tide["losses"],
            "max_abs_loss_diff": max((abs(a - b) for a, b in pairs), default=0.0),
            "max_rel_loss_diff": max((abs(a - b) / abs(a) for a, b in pairs if a), default=0.0),
            "speedup_stock_over_tide": s["median_step_s"] / t["median_step_s"],
            "memory_ratio_tide_over_stock": {
                m: t["peak_memory_bytes"][m] / s["peak_memory_bytes"][m]
                for m in s["peak_memory_bytes"] if s["peak_memory_bytes"][m]}}


def notes(info):
    out = []
    if info["device"].startswith("cuda") and info["backend"] == "gloo":
        out.append("stock FSDP2 runs over gloo here (several ranks per GPU): its collectives "
                   "go through host memory, so its step time is not that of NCCL")
    if info["device"] == "cpu":
        out.append("CPU: TIDE's CPU fabric (shared memory) against gloo; step times say "
                   "little about a GPU cluster")
    if info.get("same_processes"):
        out.append("under torchrun both runs share the rank processes, stock first: the "
                   "second run's memory includes what the first left cached, and its "
                   "timings follow a warm-up; spawned ranks (no torchrun) start each run "
                   "afresh")
    if info["device"].startswith("cuda"):
        out.append("torch's peak excludes TIDE's arenas (cudaMalloc outside torch's "
                   "allocator); 'device used' includes them and every process on the GPU")
    return out


def table(records, cmp):
    rows = ["%-6s %10s %12s %11s  %s" % ("run", "step ms", "tokens/s", "final loss",
                                         "peak memory, largest rank (MiB)")]
    for rec in records:
        s = rec["summary"]
        mem = ", ".join("%s %.1f" % (LABELS[m], v / MIB)
                        for m, v in s["peak_memory_bytes"].items())
        rows.append("%-6s %10.2f %12.0f %11.4f  %s" % (
            rec["name"], s["median_step_s"] * 1e3, s["tokens_per_s"], s["mean_loss"][-1], mem))
    if cmp:
        rows.append("losses %s (max |diff| %.3g, %.2g relative, over every rank and step); "
                    "stock/TIDE step time %.2fx" % (
                        "bit-exact" if cmp["losses_bit_exact"] else "differ",
                        cmp["max_abs_loss_diff"], cmp["max_rel_loss_diff"],
                        cmp["speedup_stock_over_tide"]))
        if not cmp["losses_bit_exact"] and records[0]["info"]["world"] > 2:
            rows.append("  (expected at world > 2 in the last bits, growing with the steps: "
                        "TIDE sums the gradients in another order than the stock collective; "
                        "docs/fsdp.md, Numerics)")
    return "\n".join(rows)


def plot(path, records, cmp):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_time, ax_mem) = plt.subplots(1, 3, figsize=(15, 4.5))
    styles = [dict(lw=3, alpha=0.6), dict(lw=1.2, ls="--", marker=".")]
    for i, rec in enumerate(records):
        loss = rec["summary"]["mean_loss"]
        ax_loss.plot(range(len(loss)), loss, label=_label(rec), color=_color(rec),
                     **styles[i % 2])
    ax_loss.xaxis.get_major_locator().set_params(integer=True)
    ax_loss.set(xlabel="step", ylabel="loss (mean over ranks)", title="loss" + (
        " (bit-exact)" if cmp and cmp["losses_bit_exact"] else
        " (max |diff| %.2g)" % cmp["max_abs_loss_diff"] if cmp else ""))
    ax_loss.legend()
    names = [_label(r) for r in records]
    ms = [r["summary"]["median_step_s"] * 1e3 for r in records]
    bars = ax_time.bar(names, ms, color=[_color(r) for r in records])
    ax_time.bar_label(bars, ["%.1f ms\n%.0f tok/s" % (m, r["summary"]["tokens_per_s"])
                             for m, r in zip(ms, records)])
    ax_time.set(ylabel="median step time (ms)", title="step time (slowest rank)")
    ax_time.margins(y=0.25)
    metrics = list(records[0]["summary"]["peak_memory_bytes"])
    width = 0.8 / len(records)
    for i, rec in enumerate(records):
        vals = [rec["summary"]["peak_memory_bytes"][m] / MIB for m in metrics]
        xs = [j + (i - (len(records) - 1) / 2) * width for j in range(len(metrics))]
        b = ax_mem.bar(xs, vals, width, label=_label(rec), color=_color(rec))
        ax_mem.bar_label(b, ["%.0f" % v for v in vals], fontsize=8)
    ax_mem.set_xticks(range(len(metrics)), [LABELS[m] for m in metrics])
    ax_mem.set(ylabel="MiB (largest rank)", title="peak memory per step")
    ax_mem.legend()
    ax_mem.margins(y=0.15)
    info = records[0]["info"]
    fig.suptitle("%s, %d layers, dim %d, %s, world %d on %s (%s)" % (
        info["args"]["model"], info["args"]["layers"], info["args"]["dim"],
        info["args"]["precision"], info["world"], info["device_name"], info["backend"]))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _color(rec):
    return "tab:blue" if rec["tide"] else "tab:gray"


def _label(rec):
    return "TIDE %s" % rec["tide"]["mode"] if rec["tide"] else "stock FSDP2"


def finish(args, records):
    for rec in records:
        rec["summary"] = summarize(rec)
    cmp = compare(records[0], records[1]) if len(records) == 2 else None
    print(table(records, cmp))
    info = records[0]["info"]
    for line in notes(info):
        print("note: " + line)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = "compare" if cmp else records[0]["name"]
        doc = {"info": info, "notes": notes(info), "runs": records, "comparison": cmp}
        path = os.path.join(args.out, stem + ".json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print("wrote " + path, file=sys.stderr)
        draw(path)
    return 0


def draw(json_path):
    """The PNG beside a JSON that train.py wrote (python3 examples/report.py FILE.json draws
    it again, e.g. on a machine that has matplotlib when the training machine has not)."""
    with open(json_path) as f:
        doc = json.load(f)
    png = os.path.splitext(json_path)[0] + ".png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: no %s (pip install matplotlib, then python3 "
              "examples/report.py %s)" % (png, json_path), file=sys.stderr)
        return
    plot(png, doc["runs"], doc["comparison"])
    print("wrote " + png, file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].endswith(".json"):
        sys.exit("usage: python3 examples/report.py OUT/compare.json  (draws OUT/compare.png)")
    draw(sys.argv[1])
