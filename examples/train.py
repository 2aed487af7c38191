#!/usr/bin/env python3
"""Train a Llama-style or MoE model with PyTorch FSDP2, on stock collectives or on TIDE's.

CPU, ranks spawned here (gloo + TIDE's CPU fabric):
    python3 examples/train.py --world 2 --compare --out out/
GPU, one process per GPU (NCCL + TIDE's CUDA fabric):
    torchrun --nproc-per-node 8 examples/train.py --device cuda --compare --out out/
GPU, several processes sharing one GPU (gloo carries stock FSDP2's bytes through the host):
    python3 examples/train.py --device cuda --world 4 --compare --out out/

--tide off|in_place|slot_reuse picks the run; --compare runs stock FSDP2 and TIDE from the same
seed and data and writes out/compare.json and out/compare.png (docs/quickstart.md explains
every figure). The only TIDE line is tide.fsdp.enable(model, mode=...), after fully_shard.
"""

import os

# Never NVLink multicast: NCCL's NVLS, torch's symmetric-memory multicast and NVSHMEM's NVLS
# stay off in this process and in every rank it spawns (set before torch.distributed loads).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
for _k, _v in SAFE_ENV.items():
    os.environ.setdefault(_k, _v)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory  # noqa: E402
import models  # noqa: E402

try:
    import tide.fsdp
except ImportError:  # running from a checkout without `pip install .`: use its python/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import tide.fsdp


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    m = p.add_argument_group("model")
    m.add_argument("--model", choices=["llama", "moe"], default="llama")
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--dim", type=int, default=64)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    m.add_argument("--hidden", type=int, default=None, help="MLP width; default 8/3 dim")
    m.add_argument("--vocab", type=int, default=256)
    m.add_argument("--experts", type=int, default=4, help="MoE experts per layer")
    m.add_argument("--top-k", type=int, default=2, help="MoE experts per token")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    t.add_argument("--seq", type=int, default=64)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: fp32 masters, bf16 compute and all-gather, fp32 reduction")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--aux-weight", type=float, default=0.01, help="MoE load-balancing loss")
    r = p.add_argument_group("TIDE and the run")
    r.add_argument("--tide", choices=["off", "in_place", "slot_reuse"], default="in_place",
                   help="off: stock FSDP2; else TIDE-RS's mode (docs/fsdp.md)")
    r.add_argument("--compare", action="store_true",
                   help="run stock FSDP2, then TIDE (--tide's mode, in_place if off)")
    r.add_argument("--out", default=None, help="folder for the JSON (and PNG with --compare)")
    r.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda under torchrun when a GPU is visible, else cpu")
    r.add_argument("--world", type=int, default=2, help="ranks to spawn (not under torchrun)")
    r.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="auto: nccl when every rank has a GPU of its own, else gloo")
    r.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per rank; default cores / ranks")
    r.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels, no TF32 (GPU runs whose losses must match)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    a.kv_heads = a.kv_heads or a.heads
    a.hidden = a.hidden or max(8, (8 * a.dim // 3 + 7) // 8 * 8)
    for name in ("layers", "dim", "heads", "vocab", "steps", "batch", "seq", "world"):
        if getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name)
    if a.model == "moe" and not 1 <= a.top_k <= a.experts:
        p.error("--top-k must be within 1..--experts")
    if a.dim % a.heads or a.heads % a.kv_heads or (a.dim // a.heads) % 2:
        p.error("--dim %d, --heads %d, --kv-heads %d: dim must be a multiple of heads, heads "
                "of kv-heads, and dim / heads even (rotary embedding)" % (
                    a.dim, a.heads, a.kv_heads))
    return a


def variants(args):
    """The runs: [("stock" | mode, tide mode or None)]."""
    mode = args.tide if args.tide != "off" else "in_place"
    if args.compare:
        return [("stock", None), ("tide", mode)]
    return [("stock", None)] if args.tide == "off" else [("tide", mode)]


def pick_device(args, local_rank, world):
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()
                                         and "RANK" in os.environ)
    if not use_cuda:
        return torch.device("cpu"), "gloo"
    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU visible")
    count = torch.cuda.device_count()
    device = torch.device("cuda", local_rank % count)
    torch.cuda.set_device(device)
    backend = args.backend
    if backend == "auto":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        backend = "nccl" if local_world <= count else "gloo"  # NCCL: one rank per GPU
    elif backend == "nccl" and int(os.environ.get("LOCAL_WORLD_SIZE", world)) > count:
        raise SystemExit("--backend nccl: NCCL takes one rank per GPU, and %d ranks share "
                         "%d GPU(s) here; use --backend gloo" % (
                             int(os.environ.get("LOCAL_WORLD_SIZE", world)), count))
    return device, backend


def build(args, device, world):
    """The seeded model (initialised on the CPU, so every device starts from the same bits),
    wrapped with fully_shard per layer and at the root."""
    torch.manual_seed(args.seed)
    model = models.build(args.model, args.vocab, args.dim, args.layers, args.heads,
                         args.kv_heads, args.hidden, args.experts, args.top_k)
    kw = {"mesh": init_device_mesh(device.type, (world,))}
    if args.precision == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def describe_tide(model):
    """What tide.fsdp.enable did, as a dict for the record and lines for the console."""
    rec = tide.fsdp.enabled(model)
    info = {"mode": rec.mode, "groups": [[n or "<root>", t] for n, t in rec.groups],
            "fallbacks": [[n or "<root>", why] for n, why in rec.fallbacks]}
    lines = ["TIDE (%s) serves %d FSDP2 group(s): %s" % (
        rec.mode, len(info["groups"]),
        ", ".join("%s (tier %d)" % (n, t) for n, t in info["groups"]) or "none")]
    for n, why in info["fallbacks"]:
        lines.append("  stock FSDP2 for %s: %s" % (n, why))
    return info, lines


def train(args, name, mode, rank, world, device):
    """One run in this rank process; rank 0 returns the record of every rank, others None."""
    probe = memory.StepMemory(device)
    model = build(args, device, world)
    info = None
    if mode is not None:
        tide.fsdp.enable(model, mode=mode)
        info, lines = describe_tide(model)
        if rank == 0:
            print("\n".join(lines), file=sys.stderr, flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    bar = None
    if rank == 0 and not args.no_progress:
        try:
            from tqdm import tqdm
        except ImportError:  # the per-step lines still come
            print("tqdm is not installed: no progress bar (pip install tqdm)", file=sys.stderr)
        else:
            bar = tqdm(total=args.steps, desc=name, unit="step", file=sys.stderr, leave=False,
                       disable=None)  # None: no bar when stderr is not a terminal
    steps = []
    tokens = args.batch * args.seq * world
    for step in range(args.steps):
        x, y = models.synthetic_batch(step, rank, args.batch, args.seq, args.vocab, args.seed)
        x, y = x.to(device), y.to(device)
        probe.reset()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1))
        aux = model.aux_loss()
        total = loss if aux is None else loss + args.aux_weight * aux
        total.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        mine = {"loss": loss.item(), "time": dt, "mem": probe.sample()}
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        if rank == 0:
            steps.append(everyone)
            mean = statistics.fmean(r["loss"] for r in everyone)
            slowest = max(r["time"] for r in everyone)
            mem = "  ".join("%s MiB %s" % (m, "/".join(
                "%.0f" % (r["mem"][m] / memory.MIB) for r in everyone))
                for m in probe.console_metrics())
            line = "%s step %3d  loss %.4f  %8.0f tok/s  %s" % (
                name, step, mean, tokens / slowest, mem)
            if bar is not None:
                bar.set_postfix(loss="%.4f" % mean, tok_s="%.0f" % (tokens / slowest))
                bar.update()
                bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
    if mode is not None:
        tide.fsdp.disable(model)  # releases TIDE's arenas before a next run in this process
    del model, opt
    memory.release_cached(device)
    if rank != 0:
        return None
    return {"name": name, "tide": info, "tokens_per_step": tokens,
            "metrics": probe.metrics(),
            "losses": [[s[r]["loss"] for s in steps] for r in range(world)],
            "step_time_s": [[s[r]["time"] for s in steps] for r in range(world)],
            "memory_bytes": {m: [[s[r]["mem"][m] for s in steps] for r in range(world)]
                             for m in probe.metrics()}}


def configure(args, device, world):
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # warn_only: an op without a deterministic kernel warns instead of stopping the run
        # (its result may then differ between the stock and the TIDE run, as the loss shows).
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        for sdp in ("flash", "mem_efficient", "cudnn"):  # the math attention kernels only
            getattr(torch.backends.cuda, "enable_%s_sdp" % sdp)(False)


def run_info(args, device, backend, world):
    return {"args": vars(args), "world": world, "device": str(device), "backend": backend,
            "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                            else "cpu"),
            "torch": torch.__version__, "tide_library": tide.library_path(),
            "safe_env": {k: os.environ.get(k) for k in SAFE_ENV}}


def _spawned_rank(rank, world, init_file, args, name, mode, result_path):
    device, backend = pick_device(args, rank, world)
    configure(args, device, world)
    dist.init_process_group(backend, init_method="file://" + init_file, rank=rank,
                            world_size=world)
    try:
        rec = train(args, name, mode, rank, world, device)
        if rank == 0:
            rec["info"] = run_info(args, device, backend, world)
            with open(result_path, "w") as f:
                json.dump(rec, f)
    finally:
        dist.destroy_process_group()


def spawn_runs(args):
    """Each run in fresh rank processes, so that memory figures start from the same state."""
    import glob

    import torch.multiprocessing as mp

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, mode) in enumerate(variants(args)):
            path = os.path.join(tmp, "%s.json" % name)
            ctx = mp.start_processes(_spawned_rank, nprocs=args.world, join=False,
                                     start_method="spawn",
                                     args=(args.world, os.path.join(tmp, "store%d" % i), args,
                                           name, mode, path))
            try:
                while not ctx.join():
                    pass
            finally:
                # A rank that failed cannot unlink TIDE's shared memory (job names start with
                # rank 0's pid, tide.torch_binding.Comm.from_process_group).
                for leftover in glob.glob("/dev/shm/tide.tide-%d-*" % ctx.pids()[0]):
                    os.unlink(leftover)
            with open(path) as f:
                records.append(json.load(f))
    return records


def torchrun_runs(args):
    """Under torchrun: every run in these processes, one after another."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device, backend = pick_device(args, int(os.environ.get("LOCAL_RANK", rank)), world)
    configure(args, device, world)
    dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    records = []
    try:
        for name, mode in variants(args):
            rec = train(args, name, mode, rank, world, device)
            if rank == 0:
                rec["info"] = run_info(args, device, backend, world)
                rec["info"]["same_processes"] = True
                records.append(rec)
    finally:
        dist.destroy_process_group()
    return records if rank == 0 else None


def main(argv=None):
    args = parse_args(argv)
    for k, v in SAFE_ENV.items():
        if os.environ[k] != v:
            print("warning: %s=%s (this script expects %s: no NVLink multicast)" % (
                k, os.environ[k], v), file=sys.stderr)
    try:
        tide.library_path()  # loads libtide: fail here, once, rather than in every rank
    except OSError as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no GPU visible", file=sys.stderr)
        return 2
    records = torchrun_runs(args) if "RANK" in os.environ else spawn_runs(args)
    if records is None:
        return 0
    import report

    return report.finish(args, records)


if __name__ == "__main__":
    sys.exit(main())
