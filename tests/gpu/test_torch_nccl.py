"""The torch binding on the NCCL fabric, one rank on one GPU (GPU machine only).

A ProcessGroupNCCL of world 1 (init_process_group("nccl", device_id=...)): Comm.from_process_group(
fabric="nccl") takes the group's own ncclComm_t (ProcessGroupNCCL._comm_ptr()) and runs TIDE's
all-gather and reduce-scatter on it; every landing and output must equal the same calls on the
one-process CUDA fabric (Comm(..., device="cuda")) bit for bit, over several groups (dtypes,
modes, alpha, accumulate) and wide-exponent data.  Then the misuse paths: a wrong rank, a gloo
group, an unknown fabric name.  World 1 is what one GPU allows (NCCL refuses two ranks of one
communicator on one device), so this checks the binding's path into the fabric, not the
multi-rank transport.

    python3 tests/gpu/test_torch_nccl.py --lib BUILD/libtide.so

Exit status 0 when every check passed.
"""
import argparse
import os
import sys
import tempfile

for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
             ("NVSHMEM_DISABLE_NVLS", "1")):
    if os.environ.get(k, v) != v:
        sys.exit("%s must be %s on this machine" % (k, v))
    os.environ[k] = v

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--lib", required=True, help="libtide.so of a -DTIDE_WITH_CUDA=ON build")
args = ap.parse_args()
os.environ["TIDE_LIBRARY"] = os.path.abspath(args.lib)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import tide  # noqa: E402
from tide import torch_binding as tb  # noqa: E402

SHAPES = [(5, 3), (7,), (2, 2, 2), (130, 61), (1, 9), (4096, 33)]
failed = 0


def check(ok, what):
    global failed
    print("%s %s" % ("PASS" if ok else "FAIL", what), flush=True)
    failed += 0 if ok else 1


def wide(shape, seed, device):
    """Normal values times 2^k, k in [-20, 20]: sums that round in any order."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    return (x * torch.pow(2.0, torch.randint(-20, 21, shape, generator=g).float())).to(device)


def run_calls(comm, ag, shard_dtype, mode, alpha, accumulate, dev):
    """AG then RS (twice: overwrite, then accumulate when asked) on comm; the landings and
    outputs, on the host."""
    g = comm.register(SHAPES, ag, ag, shard_dtype, mode=mode)
    fulls = [wide(s, 100 + p, dev).to(shard_dtype) for p, s in enumerate(SHAPES)]
    # World 1: the shard is every parameter, each padded to its rows_per_rank rows.
    shard = torch.cat([torch.nn.functional.pad(
        f.reshape(f.shape[0], -1), (0, 0, 0, g.params[p].rows_per_rank - f.shape[0])
    ).reshape(-1) for p, f in enumerate(fulls)])
    g.all_gather(shard, 0)
    torch.cuda.synchronize(dev)
    landing = [g.param_storage(0, p)[:f.numel()].clone().cpu() for p, f in enumerate(fulls)]
    grads = [wide(s, 1000 + p, dev).to(ag) for p, s in enumerate(SHAPES)]
    out = wide((g.out_numel,), 7, dev)
    g.reduce_scatter(grads, out, alpha=alpha, accumulate=False)
    g.reduce_scatter(grads, out, alpha=alpha, accumulate=accumulate)
    torch.cuda.synchronize(dev)
    res = (landing, out.cpu())
    g.close()
    return res, fulls


def main():
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    init = tempfile.mktemp(prefix="tide-nccl-pg-")
    dist.init_process_group("nccl", init_method="file://" + init, rank=0, world_size=1,
                            device_id=dev)
    try:
        comm = tb.Comm.from_process_group(fabric="nccl")
        check(comm.fabric == tb.FABRIC_NCCL and comm.device == dev,
              "from_process_group(fabric='nccl'): %r" % comm)
        ref = tb.Comm(1, 1, 0, "tnccl-%d" % os.getpid(), device=dev)
        cases = [(torch.bfloat16, torch.float32, "in-place", 1.0, True),
                 (torch.bfloat16, torch.bfloat16, "slot-reuse", 0.3, False),
                 (torch.float32, torch.float32, "in-place", 1.3, True)]
        for ag, sd, mode, alpha, acc in cases:
            what = "%s/%s %s alpha=%g acc=%d" % (ag, sd, mode, alpha, acc)
            (land_n, out_n), fulls = run_calls(comm, ag, sd, mode, alpha, acc, dev)
            (land_c, out_c), _ = run_calls(ref, ag, sd, mode, alpha, acc, dev)
            check(all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                      for a, b in zip(land_n, land_c)),
                  "AG landings equal the CUDA fabric's bit for bit: " + what)
            check(all(torch.equal(a.reshape(f.shape), f.to(ag).cpu())
                      for a, f in zip(land_n, fulls)), "AG landings hold the shards: " + what)
            check(torch.equal(out_n.view(torch.uint8), out_c.view(torch.uint8)),
                  "RS outputs equal the CUDA fabric's bit for bit: " + what)
        ref.close()
        comm.close()
        # Misuse: each a ValueError before any collective.
        ptr = dist.distributed_c10d._get_default_group()._get_backend(dev)._comm_ptr()
        try:
            tb.Comm.from_nccl_comm(ptr, 1, 1, 3, dev)
            check(False, "wrong rank refused")
        except ValueError as e:
            check("rank 3" in str(e), "wrong rank refused: %s" % e)
        for bad in ("bogus", 7):
            try:
                tb.Comm.from_process_group(fabric=bad)
                check(False, "fabric %r refused" % (bad,))
            except ValueError as e:
                check(True, "fabric %r refused: %s" % (bad, e))
        gloo = dist.new_group([0], backend="gloo")
        try:
            tb.Comm.from_process_group(gloo, fabric="nccl", device=dev)
            check(False, "gloo group refused for fabric nccl")
        except ValueError as e:
            check("ProcessGroupNCCL" in str(e), "gloo group refused for fabric nccl: %s" % e)
    finally:
        dist.destroy_process_group()
        if os.path.exists(init):
            os.unlink(init)
    print("%s: torch binding on the NCCL fabric, %d check(s) failed"
          % ("FAIL" if failed else "PASS", failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
