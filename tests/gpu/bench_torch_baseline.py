#!/usr/bin/env python3
"""bench_torch_baseline.py - TIDE against PyTorch's own FSDP2 ops, one process, one run.

On one GPU, on the same buffers, for each emulated topology M x L (N = M L virtual ranks):

  AG  TIDE-AG through libtide (CUDA fabric, tide_comm_init_all(TIDE_FABRIC_CUDA), ctypes);
      at M > 1 also "tide_ag_rail_puts": a second world created without TIDE_CUDA_DIRECT's
      bit 16, so that its emulated rail puts run as SM copies (docs/cuda-fabric.md);
      stock: per rank torch.ops.fsdp.all_gather_copy_in, the all-gather emulated as N - 1
      device copies of S bytes (what NCCL moves; on one GPU they run on SMs), then
      torch.ops.fsdp.split_with_sizes_copy (FSDP2's copy-out).
  RS  TIDE-RS through libtide;
      stock: per rank torch.ops.fsdp.chunk_cat (torch._chunk_cat: pad, upcast bf16 -> fp32,
      rank-major pack), then the fp32 reduce-scatter as one torch.sum over the ranks' packs
      (every rank's shard at once; no alpha: NCCL would fold AVG into the reduction);
      plain torch TIDE-RS semantics: per parameter torch.sum(G_p, dim=0, dtype=float32) over
      the N ranks' bf16 gradients (the gradients of parameter p of all ranks are one
      [N, D_p, K_p] tensor, the buffers TIDE reads as well; no alpha).
  stand-in  tide-bench's own GPU stock path (tools/tide-bench/cuda_stock.cu, loaded from
      libtide_bench_stock.so beside --lib, or --stock-lib; bench_standin.py) on the same
      buffers, with its time over the torch stock path's: within 5% or not.

It measures the device copy bandwidth (bytes read + written per second) in the same run and
prints, per path, the median time, its share of the HBM roofline (the fewest bytes the
collective must move over that bandwidth: AG, every rank writes N S and reads it once;
RS, every bf16 gradient read once and every fp32 shard written once) and the ratio
stock / TIDE.  Inputs are small integers, so every path is exact: TIDE's outputs are compared
with the stock path's element by element; any difference makes the exit status 1.

  python3 tests/gpu/bench_torch_baseline.py --lib build/libtide.so [--divisor 2] [--iters 10]
      [--topology 1x8 --topology 2x4] [--sum-ctas C] [--landing-ctas C] [--json FILE]
      [--stock-lib PATH]

Every process must run with NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1 (nothing here uses NVLink multicast; the variables are checked).
"""
import argparse
import ctypes
import json
import os
import statistics
import sys

import torch
import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401 (registers fsdp ops)

# llama3-70b-layer (src/plan/presets.c): (D_p, K_p) in FSDP2 order.
LLAMA3_70B_LAYER = [(8192, 8192), (1024, 8192), (1024, 8192), (8192, 8192), (28672, 8192),
                    (28672, 8192), (8192, 28672), (8192, 1), (8192, 1)]

TIDE_FABRIC_CUDA = 1
TIDE_DTYPE_BF16 = 0
TIDE_RS_IN_PLACE = 0
TIDE_CONFIG_MAGIC = 0x54494445


# tide_config_t as the package defines it (one definition, so a new field cannot leave a
# stale copy here: a size mismatch makes tide_group_register refuse the config).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from tide._lib import ConfigStruct as Config  # noqa: E402


class Shape(ctypes.Structure):
    _fields_ = [("dim0", ctypes.c_uint64), ("inner", ctypes.c_uint64)]


class GroupDesc(ctypes.Structure):
    _fields_ = [("num_params", ctypes.c_int), ("shapes", ctypes.POINTER(Shape)),
                ("ag_dtype", ctypes.c_int), ("grad_dtype", ctypes.c_int),
                ("shard_dtype", ctypes.c_int)]


class Tide:
    """The few libtide calls the benchmark needs."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        vp, ci = ctypes.c_void_p, ctypes.c_int
        L.tide_get_last_error.restype = ctypes.c_char_p
        L.tide_get_version.argtypes = [ctypes.POINTER(ci)]
        L.tide_comm_init_all.argtypes = [ci, ci, ci, ctypes.POINTER(vp)]
        L.tide_comm_destroy.argtypes = [vp]
        L.tide_group_register.argtypes = [vp, ctypes.POINTER(Config), ctypes.POINTER(GroupDesc),
                                          ctypes.POINTER(vp)]
        L.tide_group_deregister.argtypes = [vp]
        L.tide_group_landing.argtypes = [vp, ci, ctypes.POINTER(vp)]
        L.tide_all_gather.argtypes = [vp, vp, ci, vp]
        L.tide_reduce_scatter.argtypes = [vp, ctypes.POINTER(vp), vp, ctypes.c_float, ci, ci, vp]
        for f in ("tide_get_version", "tide_comm_init_all", "tide_comm_destroy",
                  "tide_group_register", "tide_group_deregister", "tide_group_landing",
                  "tide_all_gather", "tide_reduce_scatter"):
            getattr(L, f).restype = ci
        v = ci()
        self.check(L.tide_get_version(ctypes.byref(v)), "tide_get_version")
        self.version = v.value

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError("%s failed (%d): %s" % (what, rc,
                                                       self.lib.tide_get_last_error().decode()))


def median_ms(samples):
    return statistics.median(samples)


HOLD_CYCLES = 0  # --hold-ms in GPU clock cycles (main)


def timed(fn, stream):
    """GPU time of fn's work on `stream`.  With a hold, the stream first sleeps on the GPU
    while the host enqueues fn (torch.cuda._sleep), so that host enqueue time, the Python and
    ctypes overhead included, stays out of every path's figure alike."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if HOLD_CYCLES:
        torch.cuda._sleep(HOLD_CYCLES)
    a.record(stream)
    fn()
    b.record(stream)
    b.synchronize()
    return a.elapsed_time(b)


def copy_bandwidth(stream, nbytes=4 << 30, reps=10):
    """Bytes read + written per second of a device-to-device copy (median of reps)."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = [timed(lambda: dst.copy_(src), stream) for _ in range(reps)]
    del src, dst
    return 2.0 * nbytes / (median_ms(t) * 1e-3)


def fill_ints(t, gen):
    """Small integers (exact in bf16 and in every fp32 sum here), random."""
    t.copy_(torch.randint(-4, 5, t.shape, generator=gen, device="cuda", dtype=torch.int32))


# TIDE_CUDA_DIRECT's default (src/fabric/cuda/cuda.h: every shortcut).
DIRECT_DEFAULT = 31


def tide_world(tide, M, L, cfg, desc, direct):
    """N comms and groups on the CUDA fabric; `direct` (not None) is the TIDE_CUDA_DIRECT the
    world is created with (the fabric reads it then)."""
    N = M * L
    old = os.environ.get("TIDE_CUDA_DIRECT")
    if direct is not None:
        os.environ["TIDE_CUDA_DIRECT"] = str(direct)
    try:
        comms = (ctypes.c_void_p * N)()
        tide.check(tide.lib.tide_comm_init_all(TIDE_FABRIC_CUDA, M, L, comms),
                   "tide_comm_init_all")
        groups = [ctypes.c_void_p() for _ in range(N)]
        for r in range(N):
            tide.check(tide.lib.tide_group_register(comms[r], ctypes.byref(cfg),
                                                    ctypes.byref(desc), ctypes.byref(groups[r])),
                       "tide_group_register")
    finally:
        if old is None:
            os.environ.pop("TIDE_CUDA_DIRECT", None)
        else:
            os.environ["TIDE_CUDA_DIRECT"] = old
    return comms, groups


def tide_world_close(tide, comms, groups):
    for g in groups:
        tide.check(tide.lib.tide_group_deregister(g), "tide_group_deregister")
    for c in comms:
        tide.check(tide.lib.tide_comm_destroy(c), "tide_comm_destroy")


def run_topology(tide, M, L, divisor, iters, sum_ctas, landing_ctas, bw, stream,
                 standin=None):
    N = M * L
    shapes = [((d + divisor - 1) // divisor, k) for d, k in LLAMA3_70B_LAYER]
    P = len(shapes)
    R = [(d + N - 1) // N for d, _ in shapes]
    numel = [R[p] * shapes[p][1] for p in range(P)]  # R_p K_p: shard elements of p
    E = sum(numel)  # shard elements (bf16) = fp32 shard elements
    S = 2 * E
    off = [sum(numel[:p]) for p in range(P)]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234 + N)
    dev = "cuda"

    # Inputs: every rank's packed shard; the gradients of parameter p of all ranks as one
    # [N, D_p, K_p] tensor (TIDE reads G[p][u], the plain torch reduction reads G[p]).
    shard = torch.empty((N, E), dtype=torch.bfloat16, device=dev)
    fill_ints(shard, gen)
    G = []
    for d, k in shapes:
        g = torch.empty((N, d, k), dtype=torch.bfloat16, device=dev)
        fill_ints(g, gen)
        G.append(g)

    # ---- TIDE through libtide
    cfg = Config(ctypes.sizeof(Config), TIDE_CONFIG_MAGIC, tide.version, M, L, 0, 0, 0, 0,
                 TIDE_RS_IN_PLACE, sum_ctas, landing_ctas, 0)
    shp = (Shape * P)(*[Shape(d, k) for d, k in shapes])
    desc = GroupDesc(P, shp, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16, TIDE_DTYPE_BF16)
    comms, groups = tide_world(tide, M, L, cfg, desc, None)
    # At M > 1 a second world runs the AG with its emulated rail puts issued (TIDE_CUDA_DIRECT
    # without bit 16, docs/cuda-fabric.md "Direct mode"), side by side with the default.
    direct = int(os.environ.get("TIDE_CUDA_DIRECT") or DIRECT_DEFAULT)
    puts_world = tide_world(tide, M, L, cfg, desc, direct & ~16) if M > 1 and direct & 16 \
        else None
    grad_tables = [(ctypes.c_void_p * P)(*[G[p][r].data_ptr() for p in range(P)])
                   for r in range(N)]
    out_tide = torch.full((N, E), float("nan"), dtype=torch.float32, device=dev)
    alpha = 1.0 / N if (N & (N - 1)) == 0 else 1.0
    sh = ctypes.c_void_p(stream.cuda_stream)
    slot = [0]

    def tide_ag(gs=groups):
        for r in range(N):
            tide.check(tide.lib.tide_all_gather(gs[r], shard[r].data_ptr(), slot[0], sh),
                       "tide_all_gather")

    def tide_rs():
        for r in range(N):
            tide.check(tide.lib.tide_reduce_scatter(groups[r], grad_tables[r],
                                                    out_tide[r].data_ptr(), alpha, 0,
                                                    TIDE_RS_IN_PLACE, sh), "tide_reduce_scatter")

    # ---- stock AG: FSDP2's ops per rank
    ag_out = torch.empty((N, N * E), dtype=torch.bfloat16, device=dev)  # flat, rank-major
    unsharded = torch.empty((N, N * E), dtype=torch.bfloat16, device=dev)  # param-major
    shard_views = [[shard[r].narrow(0, off[p], numel[p]) for p in range(P)] for r in range(N)]
    out_views = [[unsharded[r].narrow(0, N * off[p], N * numel[p]).view(N, numel[p])
                  for p in range(P)] for r in range(N)]

    def stock_ag_copy_in():
        for r in range(N):
            torch.ops.fsdp.all_gather_copy_in(shard_views[r], ag_out[r], numel, E, r)

    def stock_ag_transport():
        for r in range(N):
            flat = ag_out[r].view(N, E)
            for u in range(N):
                if u != r:
                    flat[u].copy_(shard[u])

    def stock_ag_copy_out():
        for r in range(N):
            torch.ops.fsdp.split_with_sizes_copy(ag_out[r].view(N, E), numel, 1,
                                                 out=out_views[r])

    def stock_ag():
        stock_ag_copy_in()
        stock_ag_transport()
        stock_ag_copy_out()

    # ---- stock RS: chunk_cat per rank, one fp32 torch.sum over the packs
    packs = torch.empty((N, N, E), dtype=torch.float32, device=dev)
    out_stock = torch.empty((N, E), dtype=torch.float32, device=dev)
    grads_of = [[G[p][u] for p in range(P)] for u in range(N)]

    def stock_rs_chunk_cat():
        for u in range(N):
            torch.ops.fsdp.chunk_cat(grads_of[u], 0, N, out=packs[u])

    def stock_rs_sum():
        torch.sum(packs, dim=0, out=out_stock)

    def stock_rs():
        stock_rs_chunk_cat()
        stock_rs_sum()

    # ---- plain torch implementation of TIDE-RS's semantics
    plain_out = [torch.empty((d, k), dtype=torch.float32, device=dev) for d, k in shapes]

    def plain_rs():
        for p in range(P):
            torch.sum(G[p], dim=0, dtype=torch.float32, out=plain_out[p])

    paths = {
        "tide_ag": tide_ag, "stock_ag": stock_ag, "stock_ag_copy_in": stock_ag_copy_in,
        "stock_ag_transport": stock_ag_transport, "stock_ag_copy_out": stock_ag_copy_out,
        "tide_rs": tide_rs, "stock_rs": stock_rs, "stock_rs_chunk_cat": stock_rs_chunk_cat,
        "stock_rs_sum": stock_rs_sum, "plain_rs": plain_rs,
    }
    if puts_world is not None:
        paths["tide_ag_rail_puts"] = lambda: tide_ag(puts_world[1])
    if standin is not None:
        # After the torch stock paths in every iteration: it rewrites their work buffers.
        paths["standin_ag"], paths["standin_rs"], standin_land, standin_out = standin.paths(
            shapes, R, numel, off, shard, G, ag_out, packs, alpha, stream)
    times = {k: [] for k in paths}
    for it in range(-1, iters):  # iteration -1 warms up (module loads, the fabric's prepare)
        slot[0] = (it + 1) % 2
        for name, fn in paths.items():
            t = timed(fn, stream)
            if it >= 0:
                times[name].append(t)
    torch.cuda.synchronize()

    # ---- data checks (after timing)
    wrong = 0
    ref_rs = out_stock * alpha
    wrong_rs = int((out_tide.view(torch.int32) != ref_rs.view(torch.int32)).sum().item())
    # The plain torch reduction against the stock one, on the real rows.
    wrong_plain = 0
    for p in range(P):
        d, k = shapes[p]
        full = plain_out[p].reshape(-1)
        for r in range(N):
            lo = r * numel[p]
            n = max(0, min(numel[p], d * k - lo))
            if n:
                wrong_plain += int((full[lo:lo + n] != out_stock[r, off[p]:off[p] + n])
                                   .sum().item())
    wrong_ag = 0
    for gs in [groups] + ([puts_world[1]] if puts_world is not None else []):
        for r in range(N):
            ptr = ctypes.c_void_p()
            tide.check(tide.lib.tide_group_landing(gs[r], slot[0], ctypes.byref(ptr)),
                       "tide_group_landing")
            land = torch.empty_like(unsharded[r])
            cudart_copy(land.data_ptr(), ptr.value, 2 * N * E)
            wrong_ag += int((land != unsharded[r]).sum().item())
    wrong_standin = 0
    if standin is not None:
        wrong_standin = int((standin_land != unsharded[N - 1]).sum().item()) + int(
            (standin_out.view(torch.int32) != ref_rs.view(torch.int32)).sum().item())
    wrong = wrong_rs + wrong_ag + wrong_plain + wrong_standin

    tide_world_close(tide, comms, groups)
    if puts_world is not None:
        tide_world_close(tide, *puts_world)

    med = {k: median_ms(v) for k, v in times.items()}
    ag_roof = 2.0 * N * N * S / bw * 1e3  # every rank writes N S (and it is read once)
    rs_roof = (N * N * S + N * 4 * E) / bw * 1e3  # every gradient read, every fp32 shard written
    rows = []
    for name in ("tide_ag", "tide_ag_rail_puts", "stock_ag", "stock_ag_copy_in",
                 "stock_ag_transport", "stock_ag_copy_out", "standin_ag"):
        if name in med:
            rows.append((name, med[name], ag_roof / med[name]))
    for name in ("tide_rs", "stock_rs", "stock_rs_chunk_cat", "stock_rs_sum", "plain_rs",
                 "standin_rs"):
        if name in med:
            rows.append((name, med[name], rs_roof / med[name]))
    return {
        "hold_cycles": HOLD_CYCLES,
        "topology": "%dx%d" % (M, L), "ranks": N, "divisor": divisor, "group_mib": N * S / 2**20,
        "sum_ctas": sum_ctas, "landing_ctas": landing_ctas, "iters": iters,
        "copy_bw_tbps": bw / 1e12, "ag_roofline_ms": ag_roof, "rs_roofline_ms": rs_roof,
        "median_ms": med,
        "ratios": {"ag_stock_over_tide": med["stock_ag"] / med["tide_ag"],
                   "ag_rail_puts_over_tide": (med["tide_ag_rail_puts"] / med["tide_ag"]
                                              if "tide_ag_rail_puts" in med else None),
                   "rs_stock_over_tide": med["stock_rs"] / med["tide_rs"],
                   "rs_plain_over_tide": med["plain_rs"] / med["tide_rs"],
                   "ag_standin_over_stock": (med["standin_ag"] / med["stock_ag"]
                                             if standin is not None else None),
                   "rs_standin_over_stock": (med["standin_rs"] / med["stock_rs"]
                                             if standin is not None else None)},
        "roofline_share": {name: share for name, _, share in rows},
        "wrong": {"rs": wrong_rs, "ag": wrong_ag, "plain_vs_stock": wrong_plain,
                  "standin_vs_stock": wrong_standin},
        "wrong_total": wrong,
    }


_cudart = None


def cudart_copy(dst, src, nbytes):
    """cudaMemcpy device to device through the CUDA runtime torch loaded."""
    global _cudart
    if _cudart is None:
        for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12",
                     "/usr/local/cuda/lib64/libcudart.so"):
            try:
                _cudart = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if _cudart is None:
            raise RuntimeError("libcudart not found")
        _cudart.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_int]
    rc = _cudart.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, 3)
    if rc != 0:
        raise RuntimeError("cudaMemcpy failed: %d" % rc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True, help="libtide.so of a -DTIDE_WITH_CUDA=ON build")
    ap.add_argument("--divisor", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--topology", action="append", default=[])
    ap.add_argument("--sum-ctas", type=int, default=0)
    ap.add_argument("--landing-ctas", type=int, default=0)
    ap.add_argument("--hold-ms", type=float, default=20.0,
                    help="GPU sleep before each timed region (0: none; host time then counts)")
    ap.add_argument("--json")
    ap.add_argument("--stock-lib", help="libtide_bench_stock.so (default: beside --lib; "
                    "'none' skips the stand-in)")
    a = ap.parse_args()
    global HOLD_CYCLES
    clock_khz = torch.cuda.get_device_properties(0).clock_rate if hasattr(
        torch.cuda.get_device_properties(0), "clock_rate") else 1980000
    HOLD_CYCLES = int(a.hold_ms * clock_khz)
    for v in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        want = "0" if v == "NCCL_NVLS_ENABLE" else "1"
        if os.environ.get(v) != want:
            sys.exit("bench_torch_baseline: set %s=%s" % (v, want))
    topos = a.topology or ["1x8", "2x4"]
    tide = Tide(a.lib)
    stock_lib = a.stock_lib or os.path.join(os.path.dirname(os.path.abspath(a.lib)),
                                            "libtide_bench_stock.so")
    standin = None
    if stock_lib != "none":
        if not os.path.exists(stock_lib):
            sys.exit("bench_torch_baseline: %s not found (build the tide_bench_stock target, "
                     "or pass --stock-lib none)" % stock_lib)
        from bench_standin import Standin
        standin = Standin(stock_lib)
    stream = torch.cuda.Stream()
    results = []
    with torch.cuda.stream(stream):
        bw = copy_bandwidth(stream)
        print("# %s, torch %s; device copy %.2f TB/s (read + write); medians of %d iterations, "
              "CUDA events on one stream after a %.1f ms GPU hold (host enqueue not counted); "
              "share = HBM roofline / time; ratio = stock / TIDE"
              % (torch.cuda.get_device_name(), torch.__version__, bw / 1e12, a.iters,
                 a.hold_ms))
        for t in topos:
            M, L = (int(x) for x in t.split("x"))
            res = run_topology(tide, M, L, a.divisor, a.iters, a.sum_ctas, a.landing_ctas, bw,
                               stream, standin)
            results.append(res)
            med, sh = res["median_ms"], res["roofline_share"]
            print("%s dim0/%d group %.1f MiB sum_ctas %d landing_ctas %d | AG roofline %.3f ms "
                  "| RS roofline %.3f ms | wrong %d" % (
                      res["topology"], a.divisor, res["group_mib"], a.sum_ctas, a.landing_ctas,
                      res["ag_roofline_ms"], res["rs_roofline_ms"], res["wrong_total"]))
            for name in med:
                print("  %-20s %8.3f ms  %5.1f%% of roofline" % (name, med[name],
                                                                  100 * sh[name]))
            r = res["ratios"]
            print("  ratios: AG stock/TIDE %.2fx | RS stock/TIDE %.2fx | RS plain-torch/TIDE "
                  "%.2fx%s" % (r["ag_stock_over_tide"], r["rs_stock_over_tide"],
                               r["rs_plain_over_tide"],
                               "" if r["ag_rail_puts_over_tide"] is None else
                               " | AG rail-puts/TIDE %.2fx" % r["ag_rail_puts_over_tide"]))
            if r["ag_standin_over_stock"] is not None:
                within = [abs(r[k] - 1) <= 0.05
                          for k in ("ag_standin_over_stock", "rs_standin_over_stock")]
                print("  tide-bench stand-in / torch stock: AG %.2fx (%s) | RS %.2fx (%s)" % (
                    r["ag_standin_over_stock"], "within 5%" if within[0] else "NOT within 5%",
                    r["rs_standin_over_stock"], "within 5%" if within[1] else "NOT within 5%"))
            sys.stdout.flush()
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "copy_bw_tbps": bw / 1e12, "results": results}, f, indent=1)
    return 1 if any(r["wrong_total"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
