#!/usr/bin/env python3
"""bench_fsdp_layers.py - one FSDP2 layer's all-gather and reduce-scatter on one GPU: stock
FSDP2 (fake process group, simulated world N) against tide.fsdp (N processes on the GPU).

Both sides run FSDP2's own per-group entry points on one fully_shard'ed Llama-style decoder
layer (attention and SwiGLU weights, two RMSNorm weights, torch's FSDP2 order), between
steps (group IDLE, so FSDP2 runs everything on the current stream):

  AG  FSDPParamGroup.unshard() + wait_for_unshard(), timed with CUDA events on the current
      stream, then reshard() (untimed).
  RS  _fsdp_param_group.foreach_reduce(...) with the arguments FSDPParamGroup.post_backward
      passes, the reduce-scatter stream being the current stream, on fresh unsharded
      gradients (made before the timed region), timed the same way; the sharded gradients
      are dropped afterwards (untimed), so every call assigns, never accumulates.

stock  One process, PyTorch's `fake` process group (torch.testing._internal.distributed.
       fake_pg) with world size N: FSDP2's full code path for one rank -- copy-in
       (all_gather_copy_in), the all-gather call, copy-out (split_with_sizes_copy), _chunk_cat,
       the reduce-scatter call, the gradient views -- but the fake group's collectives return
       at once and move no byte.  Stock's figure is therefore a LOWER BOUND of stock's cost:
       it contains none of the transport (NCCL's all-gather / reduce-scatter kernels).
TIDE   N processes, all on the one GPU, a gloo process group for FSDP2's bookkeeping and
       tide.fsdp.enable(layer, mode=...) (Tier 1): TIDE-AG lands every rank's shard in the
       unsharded parameters (no copy-in, no copy-out), TIDE-RS reads the per-parameter
       gradients (no pack).  Each rank's time covers the WHOLE collective of its rank,
       transport included, while the other N - 1 ranks' collectives run on the same GPU at
       the same time: the GPU does N ranks' data movement within that time.  Ranks start
       each iteration together (gloo barrier after a device synchronize); the figure is the
       median over iterations of the slowest rank.  Host enqueue time is kept out of every
       figure: stock's timed call starts behind a GPU sleep of --hold-ms (20) during which
       the host enqueues it; TIDE's N processes (--start gate, the default) start behind one
       common gate (start_gate.py: every rank's stream waits until the last rank has
       enqueued its call), the start bench_layer_single gives all N ranks behind its one
       hold.  --start hold puts each process behind its own sleep instead: the spread of
       the processes' barrier exits is then in the slowest rank's window, and the fastest
       rank's window (the rank whose hold ended last) is printed beside it.

Peak memory: torch's allocator peak above the allocated bytes before the phase
(max_memory_allocated), per rank; TIDE's arena (tide_plan_summary_t arena_bytes: landing
slots, resident shards, staging, inboxes, signals) is allocated once at enable() outside
torch's allocator and printed beside it as a persistent cost.

HBM roofline: the device's HBM peak, bytes read + bytes written per second, from the memory
clock and bus width torch reports (2 x clock x width / 8: 3.35 TB/s on an H100 SXM, 4.8 TB/s
on an H200; 4.2 TB/s where torch reports neither).  The run also measures one large
device-to-device copy and prints it: what a copy reaches of that peak.  Bytes
counted (U: unsharded group bytes in the all-gather dtype, S = U / N padded shard, G: one
rank's unsharded gradient bytes, F: one rank's fp32 reduce output = 4 x shard elements):
  stock AG  2 S (copy-in read + write) + 2 U (copy-out read + write) per rank
  stock RS  G (pack read) + N S_rs (pack write, reduce dtype) per rank
  TIDE AG   2 U per rank (every rank's landing written once, its sources read once), times N
            ranks on the one GPU: 2 N U in the measured time
  TIDE RS   G + F per rank (every gradient read once, every fp32 shard written once), times N
            (the "TIDE" RS row is FSDP2's foreach_reduce through tide.fsdp: with a bf16 master
            dtype it also casts the fp32 output to bf16, F + F / 2 more bytes per rank, not
            counted; the "TIDE-c" row is the collective alone, group.reduce_scatter, as
            bench_layer_single times it)
Share = bytes / (time x the HBM peak).  TIDE's "per-rank equivalent" time is its time / N: what
one rank's share would take on a GPU of its own if the collective stays HBM-bound (an
extrapolation, not a measurement; NVLink is not modelled).

    python3 tests/gpu/bench_fsdp_layers.py --lib build/libtide.so [--worlds 2,4,8]
        [--dim 4096 --hidden 11008] [--dtype bf16|fp32] [--mode in_place|slot_reuse]
        [--iters 10] [--hold-ms 20] [--start gate|hold] [--json FILE]

Every process runs with NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1 (checked; nothing here uses NVLink multicast).
"""
import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import traceback

import fsdp_gpu

SAFETY = fsdp_gpu.SAFETY
# Bytes read + written per second; main() replaces it by the device's HBM peak (hbm_peak).
ROOFLINE = 4.2e12


def hbm_peak(index=0):
    """The HBM peak of CUDA device `index`, bytes per second (reads and writes share it):
    2 (double data rate) x memory clock x bus width / 8; None where torch does not report
    the clock and the width."""
    import torch

    props = torch.cuda.get_device_properties(index)
    khz, bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if not khz or not bits:
        return None
    return 2.0 * khz * 1e3 * bits / 8.0


def _layer(dim, hidden, heads, dtype):
    import torch

    import fsdp_model

    torch.manual_seed(0)
    with torch.device("cpu"):
        block = fsdp_model.Block(dim, heads, hidden, exact=False)
    return block.to(dtype)


def _dtype(name):
    import torch

    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def _shard_layer(block, world, device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device, (world,))
    fully_shard(block, mesh=mesh)
    state = block._get_fsdp_state()
    state._lazy_init()
    pg = state._fsdp_param_group
    _Dev(device).sync()
    return block, pg


class _Dev:
    """CUDA events and allocator statistics, or wall time and no memory figures (--device
    cpu, which only exercises the script off the GPU)."""

    def __init__(self, device, hold_ms=0.0, gate=None):
        import torch

        self.cuda = device == "cuda"
        self.torch = torch
        self.gate = gate  # start_gate.Gate: one common start for every process (--start gate)
        self.hold_cycles = 0
        if self.cuda and hold_ms > 0:
            khz = torch.cuda.get_device_properties(torch.cuda.current_device()).clock_rate
            self.hold_cycles = int(hold_ms * khz)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def stream(self):
        t = self.torch
        return t.cuda.current_stream() if self.cuda else t.cpu.current_stream()

    def start(self):
        t = self.torch
        if self.cuda:
            base = t.cuda.memory_allocated()
            t.cuda.reset_peak_memory_stats()
            if self.gate is not None:
                # Every rank's stream starts when the last rank has enqueued (start_gate.py).
                self.gate.hold(t.cuda.current_stream())
            elif self.hold_cycles:
                # The stream sleeps on the GPU while the host enqueues the collective, so
                # that host enqueue time (FSDP2's Python, the ctypes calls) stays out of the
                # figure, as in bench_layer_single; what remains of the processes' skew
                # (their barrier exits) is in it.
                t.cuda._sleep(self.hold_cycles)
            a = t.cuda.Event(enable_timing=True)
            a.record()
            return base, a
        return 0, time.perf_counter()

    def enqueued(self):
        """The timed work is enqueued: open this rank's word of the gate."""
        if self.gate is not None:
            self.gate.opened()

    def stop(self, mark):
        """(milliseconds, peak bytes above the start)."""
        t = self.torch
        base, a = mark
        if self.cuda:
            b = t.cuda.Event(enable_timing=True)
            b.record()
            self.enqueued()
            t.cuda.synchronize()
            if self.gate is not None:
                self.gate.finished()
            return a.elapsed_time(b), t.cuda.max_memory_allocated() - base
        return (time.perf_counter() - a) * 1e3, 0


def _grads(pg):
    import torch

    return [torch.randn(fp._orig_size, dtype=fp.param_dtype or fp.orig_dtype,
                        device=pg.device) for fp in pg.fsdp_params]


def _reduce(pg, grads, dev):
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg_mod

    cur = dev.stream()
    # The module-level name FSDPParamGroup.post_backward calls (TIDE's dispatcher when
    # enabled), with the arguments it passes for a 1-D FSDP mesh.
    return pg_mod.foreach_reduce(
        pg.fsdp_params, grads, pg._reduce_scatter_process_group, cur, pg._reduce_scatter_comm,
        pg._orig_dtype, pg._reduce_dtype, pg.device, pg.gradient_divide_factor, None, cur,
        pg.all_reduce_grads, None, None, False)


def _collective_rs(st, world):
    """TIDE-RS alone on the group of Tier-1 state `st` (In-Place): the gradients in the
    group's parameter order into a fresh fp32 output, alpha 1/N, on the current stream --
    what bench_layer_single times on the single-process fabric, without FSDP2's
    post-processing (the cast of the fp32 output to a bf16 master dtype, the views)."""
    import torch

    def run(grads):
        ordered = [None] * len(grads)
        for fp, grad in zip(st.fsdp_params, grads):
            ordered[st.index[id(fp)]] = grad
        out = torch.empty(st.group.out_numel, dtype=torch.float32, device=grads[0].device)
        st.group.reduce_scatter(ordered, out, alpha=1.0 / world, accumulate=False,
                                stream=torch.cuda.current_stream() if out.is_cuda else None)
        return out
    return run


def _measure(pg, iters, barrier, dev, collective_rs=None):
    """{"ag_ms": [...], "rs_ms": [...], "ag_peak": bytes, "rs_peak": bytes}, and
    "rs_collective_ms" when collective_rs (_collective_rs) is given.  With a start gate, also
    "<key>_gate": per timed window, 1 where this rank's gate opened by its timeout, and
    "warmup_gate_timeouts": how many of the warm-up windows' gates did."""
    out = {"ag_ms": [], "rs_ms": [], "ag_peak": 0, "rs_peak": 0, "rs_collective_ms": [],
           "ag_gate": [], "rs_gate": [], "rs_collective_gate": [], "warmup_gate_timeouts": 0}
    gate = dev.gate if dev.cuda else None

    def timeouts():
        return gate.timed_out if gate is not None else 0

    def window(key, it, before):
        # A gate that opened by its timeout puts the host's wait into the window: say which.
        late = int(timeouts() > before)
        if it >= 2:
            out[key + "_gate"].append(late)
        else:
            out["warmup_gate_timeouts"] += late

    for it in range(iters + 2):  # two warm-up iterations
        # AG
        barrier()
        before = timeouts()
        mark = dev.start()
        pg.unshard(async_op=False)
        pg.wait_for_unshard()
        ms, peak = dev.stop(mark)
        window("ag", it, before)
        if it >= 2:
            out["ag_ms"].append(ms)
            out["ag_peak"] = max(out["ag_peak"], peak)
        pg.reshard()
        # RS: FSDP2's foreach_reduce through tide.fsdp, then (In-Place) the collective alone
        for key, reduce in (("rs", lambda g: _reduce(pg, g, dev)),
                            ("rs_collective", collective_rs)):
            if reduce is None:
                continue
            grads = _grads(pg)
            dev.sync()
            barrier()
            before = timeouts()
            mark = dev.start()
            result = reduce(grads)
            ms, peak = dev.stop(mark)
            window(key, it, before)
            del grads, result
            if it >= 2:
                out[key + "_ms"].append(ms)
                if key == "rs":
                    out["rs_peak"] = max(out["rs_peak"], peak)
            for fp in pg.fsdp_params:
                fp.sharded_param.grad = None
    return out


def _sizes(pg, world):
    """(U, S, G, S_rs, F): see the module doc."""
    import torch

    ag_item = torch.empty(0, dtype=pg.fsdp_params[0].param_dtype
                          or pg.fsdp_params[0].orig_dtype).element_size()
    rs_dtype = pg._reduce_dtype or pg.fsdp_params[0].param_dtype or pg._orig_dtype
    rs_item = torch.empty(0, dtype=rs_dtype).element_size()
    shard_elems = sum(fp._sharded_param_data.numel() for fp in pg.fsdp_params)
    grad_elems = sum(math.prod(fp._orig_size) for fp in pg.fsdp_params)
    return dict(U=world * shard_elems * ag_item, S=shard_elems * ag_item,
                G=grad_elems * ag_item, S_rs=shard_elems * rs_item, F=4 * shard_elems)


def _check_env():
    fsdp_gpu.check_safety()


# ---------------------------------------------------------------------------- stock side


def _stock_entry(world, cfg, path):
    try:
        _check_env()
        import torch
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dev = _Dev(cfg["device"], cfg.get("hold_ms", 0.0))
        if dev.cuda:
            torch.cuda.set_device(0)
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        _block, pg = _shard_layer(_layer(cfg["dim"], cfg["hidden"], cfg["heads"],
                                         _dtype(cfg["dtype"])), world, cfg["device"])
        res = _measure(pg, cfg["iters"], dev.sync, dev)
        res["sizes"] = _sizes(pg, world)
        res["ok"] = True
    except BaseException as exc:
        res = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc),
               "traceback": traceback.format_exc()}
    with open(path, "w") as f:
        json.dump(res, f)
    os._exit(0)


def run_stock(world, cfg, timeout):
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "stock.json")
        p = ctx.Process(target=_stock_entry, args=(world, cfg, path))
        p.start()
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
            return {"ok": False, "error": "stock run hung (killed after %d s)" % timeout}
        if not os.path.exists(path):
            return {"ok": False, "error": "stock process died (exit %s)" % p.exitcode}
        with open(path) as f:
            return json.load(f)


# ---------------------------------------------------------------------------- TIDE side


def _tide_rank(rank, world, cfg):
    _check_env()
    import torch
    import torch.distributed as dist

    import tide.fsdp

    gate = None
    if cfg["device"] == "cuda":
        torch.cuda.set_device(0)
        if cfg.get("gate_path"):
            import start_gate

            try:
                gate = start_gate.Gate(cfg["gate_path"], rank, world,
                                       timeout_ms=max(cfg.get("hold_ms", 0.0), 20.0))
            except (OSError, RuntimeError, AttributeError) as exc:
                # If only some ranks fall back, the others' gates never see those ranks'
                # words and open by their timeout: no hang, and the run's NOTE says so.
                print("rank %d: start gate unavailable (%s): per-process hold instead"
                      % (rank, exc), flush=True)
    dev = _Dev(cfg["device"], cfg.get("hold_ms", 0.0), gate)
    block, pg = _shard_layer(_layer(cfg["dim"], cfg["hidden"], cfg["heads"],
                                    _dtype(cfg["dtype"])), world, cfg["device"])
    knobs = {k: cfg[k] for k in ("sum_ctas", "landing_ctas") if cfg.get(k) is not None}
    rec = tide.fsdp.enable(block, mode=cfg["mode"], tier=1, tuning=knobs or None)
    if [t for _, t in rec.groups] != [1] or rec.fallbacks:
        raise RuntimeError("TIDE did not take the layer: %s" % rec)
    st = rec.states[0]

    def barrier():
        dev.sync()
        dist.barrier()

    in_place = cfg["mode"] == "in_place"
    res = _measure(pg, cfg["iters"], barrier, dev,
                   _collective_rs(st, world) if in_place else None)
    res["sizes"] = _sizes(pg, world)
    res["arena_bytes"] = st.group.plan.summary["arena_bytes"]
    res["calls"] = dict(st.calls)
    tide.fsdp.disable(block)
    if gate is not None:
        gate.close()
    return res


def run_tide(world, cfg, timeout):
    import fsdp_harness

    env = dict(SAFETY, TIDE_TIMEOUT_MS=os.environ.get("TIDE_TIMEOUT_MS", "30000"))
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        if cfg.get("start") == "gate" and cfg["device"] == "cuda":
            import start_gate

            cfg = dict(cfg, gate_path=os.path.join(tmp, "start_gate"))
            start_gate.create(cfg["gate_path"], world)
        try:
            records = fsdp_harness.run(world, _tide_rank, tmp, timeout=timeout, env=env,
                                       allow_failure=True, cfg=cfg)
        except AssertionError as exc:
            return {"ok": False, "error": str(exc)}
    bad = [(r, rec) for r, rec in enumerate(records) if not rec["ok"]]
    if bad:
        r, rec = bad[0]
        return {"ok": False, "error": "rank %d: %s: %s" % (r, rec["type"], rec["error"]),
                "traceback": rec.get("traceback", "")}
    res = [rec["result"] for rec in records]

    def per_iter(key, pick):
        return [pick(x[key][i] for x in res) for i in range(len(res[0][key]))]

    # The slowest rank's window (max) is the headline figure; the fastest rank's (min) is the
    # window of the rank whose hold ended last: for the RS at M = 1, whose sums all wait for
    # every rank's start, the collective without the skew of the processes' starts (max - min
    # is that skew), what bench_layer_single times behind one hold; for the AG a lower bound.
    return {"ok": True,
            "ag_ms": per_iter("ag_ms", max), "rs_ms": per_iter("rs_ms", max),
            "rs_collective_ms": per_iter("rs_collective_ms", max),
            "ag_min_ms": per_iter("ag_ms", min), "rs_min_ms": per_iter("rs_ms", min),
            "rs_collective_min_ms": per_iter("rs_collective_ms", min),
            "ag_peak": max(x["ag_peak"] for x in res), "rs_peak": max(x["rs_peak"] for x in res),
            "arena_bytes": res[0]["arena_bytes"], "sizes": res[0]["sizes"],
            "calls": res[0]["calls"],
            # Per timed window, 1 where any rank's gate opened by its timeout.
            "ag_gate": per_iter("ag_gate", max), "rs_gate": per_iter("rs_gate", max),
            "rs_collective_gate": per_iter("rs_collective_gate", max),
            "warmup_gate_timeouts": sum(x["warmup_gate_timeouts"] for x in res)}


# ---------------------------------------------------------------------------- report


def _copy_bandwidth():
    import torch

    torch.cuda.set_device(0)
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    return 2 * n / statistics.median(times)


def _row(world, stock, tide_res):
    z = stock["sizes"] if stock.get("ok") else tide_res["sizes"]
    out = {"world": world, "sizes": z}
    if stock.get("ok"):
        ag, rs = statistics.median(stock["ag_ms"]), statistics.median(stock["rs_ms"])
        out["stock"] = {
            "ag_ms": ag, "rs_ms": rs, "ag_peak_mib": stock["ag_peak"] / 2**20,
            "rs_peak_mib": stock["rs_peak"] / 2**20,
            "ag_roofline": (2 * z["S"] + 2 * z["U"]) / (ag / 1e3 * ROOFLINE),
            "rs_roofline": (z["G"] + world * z["S_rs"]) / (rs / 1e3 * ROOFLINE)}
    else:
        out["stock"] = {"error": stock.get("error")}
    if tide_res.get("ok"):
        ag, rs = statistics.median(tide_res["ag_ms"]), statistics.median(tide_res["rs_ms"])
        out["tide"] = {
            "ag_ms": ag, "rs_ms": rs, "ag_ms_per_rank_equiv": ag / world,
            "rs_ms_per_rank_equiv": rs / world, "ag_peak_mib": tide_res["ag_peak"] / 2**20,
            "rs_peak_mib": tide_res["rs_peak"] / 2**20,
            "arena_mib": tide_res["arena_bytes"] / 2**20,
            "ag_roofline": world * 2 * z["U"] / (ag / 1e3 * ROOFLINE),
            "rs_roofline": world * (z["G"] + z["F"]) / (rs / 1e3 * ROOFLINE),
            "calls": tide_res["calls"],
            # Timed windows whose start gate opened by its timeout (the median is over all).
            "gate_timeouts": {k: sum(tide_res.get(k + "_gate", []))
                              for k in ("ag", "rs", "rs_collective")},
            "warmup_gate_timeouts": tide_res.get("warmup_gate_timeouts", 0)}
        for key in ("ag_min_ms", "rs_min_ms", "rs_collective_ms", "rs_collective_min_ms"):
            if tide_res.get(key):
                out["tide"][key] = statistics.median(tide_res[key])
        if "rs_collective_ms" in out["tide"]:
            rc = out["tide"]["rs_collective_ms"]
            out["tide"]["rs_collective_roofline"] = world * (z["G"] + z["F"]) / (rc / 1e3 *
                                                                                 ROOFLINE)
    else:
        out["tide"] = {"error": tide_res.get("error"), "traceback": tide_res.get("traceback")}
    return out


def _print(row):
    z, s, t = row["sizes"], row["stock"], row["tide"]
    print("N = %d: U = %.1f MiB (all-gather dtype), G = %.1f MiB per rank"
          % (row["world"], z["U"] / 2**20, z["G"] / 2**20))
    fmt = "  %-5s %-6s %9s %9s %10s %12s %s"
    print(fmt % ("phase", "side", "time ms", "roofline", "peak MiB", "per-rank eq", "notes"))
    for phase in ("ag", "rs"):
        if "error" not in s:
            print(fmt % (phase.upper(), "stock", "%.3f" % s[phase + "_ms"],
                         "%.1f%%" % (100 * s[phase + "_roofline"]),
                         "%.1f" % s[phase + "_peak_mib"], "-",
                         "one rank, fake transport (lower bound)"))
        else:
            print("  %s stock: FAILED %s" % (phase.upper(), s["error"]))
        if "error" not in t:
            print(fmt % (phase.upper(), "TIDE", "%.3f" % t[phase + "_ms"],
                         "%.1f%%" % (100 * t[phase + "_roofline"]),
                         "%.1f" % t[phase + "_peak_mib"],
                         "%.3f" % t[phase + "_ms_per_rank_equiv"],
                         "all %d ranks on one GPU, transport included; arena %.1f MiB"
                         % (row["world"], t["arena_mib"])))
        else:
            print("  %s TIDE: FAILED %s" % (phase.upper(), t["error"]))
    if "rs_collective_ms" in t:
        print(fmt % ("RS", "TIDE-c", "%.3f" % t["rs_collective_ms"],
                     "%.1f%%" % (100 * t["rs_collective_roofline"]), "-", "-",
                     "the collective alone (group.reduce_scatter, fp32 out): no FSDP2 "
                     "post-processing"))
    if "error" not in t and "ag_min_ms" in t:
        print("  the fastest rank's window (with --start hold the last rank to start: no start "
              "skew; AG: a lower bound): AG %.3f ms, "
              "RS %.3f ms%s" % (t["ag_min_ms"], t["rs_min_ms"],
                                ", RS collective alone %.3f ms" % t["rs_collective_min_ms"]
                                if "rs_collective_min_ms" in t else ""))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", help="libtide.so built with -DTIDE_WITH_CUDA=ON (TIDE_LIBRARY)")
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=11008)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--mode", default="in_place", choices=("in_place", "slot_reuse"))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--sum-ctas", type=int, default=None,
                    help="TIDE-RS sum CTA budget (tide.fsdp.enable; default: the library's)")
    ap.add_argument("--landing-ctas", type=int, default=None,
                    help="TIDE-RS landing CTA budget (default: the library's)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per side and world")
    ap.add_argument("--hold-ms", type=float, default=20.0,
                    help="GPU sleep before each timed collective while the host enqueues it "
                         "(0: none; the figure then includes host enqueue time)")
    ap.add_argument("--start", default="gate", choices=("gate", "hold"),
                    help="how TIDE's N processes start each timed collective: gate (default): "
                         "every rank's stream waits until the last rank has enqueued "
                         "(start_gate.py), one common start as the single-process fabric's "
                         "one hold; hold: each process behind its own GPU sleep of --hold-ms "
                         "(the spread of the processes' starts is then in the figure)")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: exercise the script on the CPU fabric (no meaningful figures)")
    args = ap.parse_args()
    try:
        _check_env()
    except RuntimeError as exc:
        sys.exit(str(exc))
    fsdp_gpu.use_lib(args.lib)
    import torch

    cfg = dict(dim=args.dim, hidden=args.hidden, heads=args.heads, dtype=args.dtype,
               mode=args.mode, iters=args.iters, device=args.device, sum_ctas=args.sum_ctas,
               landing_ctas=args.landing_ctas, hold_ms=args.hold_ms, start=args.start)
    cuda = args.device == "cuda"
    global ROOFLINE
    peak = hbm_peak() if cuda else None
    ROOFLINE = peak or ROOFLINE
    report = {"torch": torch.__version__, "config": cfg, "roofline_bytes_per_s": ROOFLINE,
              "roofline_source": "device HBM peak" if peak else "fixed 4.2 TB/s",
              "device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    bw = _copy_bandwidth() if cuda else float("nan")
    report["measured_copy_bytes_per_s"] = bw
    print("layer dim %d hidden %d, %s, TIDE %s; HBM roofline %.2f TB/s (%s); measured device "
          "copy %.2f TB/s (read + write, %.0f%% of it)"
          % (args.dim, args.hidden, args.dtype, args.mode, ROOFLINE / 1e12,
             report["roofline_source"], bw / 1e12, 100 * bw / ROOFLINE), flush=True)
    if cuda:
        torch.cuda.empty_cache()
    rows, status = [], 0
    for world in [int(w) for w in args.worlds.split(",") if w]:
        t0 = time.monotonic()
        stock = run_stock(world, cfg, args.timeout)
        tide_res = run_tide(world, cfg, args.timeout)
        row = _row(world, stock, tide_res)
        for side in ("stock", "tide"):
            for phase in ("ag_ms", "rs_ms"):
                v = row[side].get(phase)
                if args.hold_ms > 0 and v is not None and v >= 0.9 * args.hold_ms:
                    # The host waited for the GPU inside the call: the hold is in the figure.
                    print("NOTE: %s %s %.3f ms is near or above the %.0f ms hold: the host "
                          "blocked inside the call, the figure includes the hold"
                          % (side, phase, v, args.hold_ms))
        late = row["tide"].get("gate_timeouts") or {}
        if any(late.values()):
            print("NOTE: TIDE's start gate opened by its timeout, not by every rank, in AG %d, "
                  "RS %d, RS-c %d of the %d timed windows: a host blocked inside the call; "
                  "those windows include the wait" % (late["ag"], late["rs"],
                                                      late["rs_collective"], args.iters))
        if row["tide"].get("warmup_gate_timeouts"):
            print("note: %d start gate(s) of the warm-up calls opened by their timeout (not "
                  "timed)" % row["tide"]["warmup_gate_timeouts"])
        row["seconds"] = time.monotonic() - t0
        rows.append(row)
        _print(row)
        if "error" in row["stock"] or "error" in row["tide"]:
            status = 1
            for side in ("stock", "tide"):
                if row[side].get("traceback"):
                    print(row[side]["traceback"])
    report["rows"] = rows
    fsdp_gpu.finish(report, args.json, status)


if __name__ == "__main__":
    main()
