"""tide.torch_binding: TIDE-AG / TIDE-RS over torch tensors, one process per rank on the CPU
fabric, against torch references; the argument checks; arena view lifetime."""

import ctypes
import os

import pytest

torch = pytest.importorskip("torch")

import tide  # noqa: E402
from tide import torch_binding as tb  # noqa: E402

import fsdp_harness  # noqa: E402

SHAPES = [(5, 3), (7,), (2, 2, 2), (13, 6), (1, 9)]


def _name(tag):
    return "tbtest-%d-%s" % (os.getpid(), tag)


def _wide(shape, seed):
    """Normal values times 2^k for k in [-20, 20]: sums that round, in any order."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    return x * torch.pow(2.0, torch.randint(-20, 21, shape, generator=g).float())


def _collectives(rank, world, ag_dtype, shard_dtype, mode, topology):
    comm = tb.Comm.from_process_group(None, *topology)
    # No device named over a gloo group: inferred as the CPU, i.e. the CPU fabric.
    assert comm.device == torch.device("cpu") and comm.fabric == tb._lib.FABRIC_CPU
    g = comm.register(SHAPES, ag_dtype, ag_dtype, shard_dtype, mode=mode)
    n = g.ranks
    fulls = [_wide(s, 100 + p).to(shard_dtype) for p, s in enumerate(SHAPES)]
    shard = torch.cat([torch.nn.functional.pad(
        f.reshape(f.shape[0], -1), (0, 0, 0, g.params[p].rows_per_rank * n - f.shape[0])
    ).reshape(n, -1)[rank] for p, f in enumerate(fulls)])
    g.all_gather(shard, 0)
    landing_ok = []
    for p, f in enumerate(fulls):
        view = g.param_storage(0, p)[:f.numel()].view(f.shape)
        landing_ok.append(torch.equal(view, f.to(ag_dtype)))
        del view
    grads = [_wide(s, 1000 * rank + p).to(ag_dtype) for p, s in enumerate(SHAPES)]
    out = torch.full((g.out_numel,), 7.0)
    g.reduce_scatter(grads, out, alpha=0.25, accumulate=True)
    # Reference: every rank's gradients rebuilt from the seeds, summed in float64 and
    # accumulated onto the 7 already in out; rows past D_p are +0 after every call.
    errs = []
    for p, s in enumerate(SHAPES):
        total = sum(_wide(s, 1000 * u + p).to(ag_dtype).double() for u in range(n))
        geo = g.params[p]
        rows = total.reshape(s[0], -1)
        ref = torch.zeros((geo.rows_per_rank, geo.inner), dtype=torch.float64)
        lo = rank * geo.rows_per_rank
        hi = min(s[0], lo + geo.rows_per_rank)
        if hi > lo:
            ref[:hi - lo] = rows[lo:hi] * 0.25 + 7.0
        begin = geo.fp32_offset // 4
        got = out[begin:begin + ref.numel()].double().reshape(ref.shape)
        errs.append(((got - ref).abs().max() / max(1.0, ref.abs().max().item())).item())
    err = max(errs)
    g.close()
    comm.close()
    return {"landing_ok": landing_ok, "rel_err": err}


@pytest.mark.parametrize("ag,shard,mode,topology", [
    ("fp32", "fp32", "in-place", (1, 2)),
    ("bf16", "fp32", "slot-reuse", (2, 2)),
    ("bf16", "bf16", "in-place", (1, 4)),
])
def test_collectives_across_processes(ag, shard, mode, topology, tmp_path):
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}
    world = topology[0] * topology[1]
    recs = fsdp_harness.run(world, _collectives, tmp_path, ag_dtype=dt[ag],
                            shard_dtype=dt[shard], mode=mode, topology=topology)
    for rec in recs:
        assert all(rec["result"]["landing_ok"])
        # fp32 sums in TIDE's order against float64: within 1e-5 relative (DESIGN §4).
        assert rec["result"]["rel_err"] < 1e-5


def test_checked_entry_points(group, monkeypatch):
    """The binding calls the checked entry points (lengths verified by the library), and a
    reduce-scatter mode other than the group's is refused before any call."""
    g = group
    called = []
    real = tb._lib.call

    def spy(name, *args):
        called.append(name)
        return real(name, *args)

    monkeypatch.setattr(tb._lib, "call", spy)
    g.all_gather(torch.zeros(g.shard_numel), 0)
    g.all_gather(None, 1)
    out = torch.zeros(g.out_numel)
    g.reduce_scatter([torch.ones(s) for s in SHAPES], out, alpha=0.5, mode=g.mode)
    collectives = [n for n in called if "gather" in n or "scatter" in n]
    assert collectives == ["tide_all_gather_checked"] * 2 + ["tide_reduce_scatter_checked"]
    other = "slot-reuse" if g.mode == "in-place" else "in-place"
    with pytest.raises(ValueError, match="mode .*the group's"):
        g.reduce_scatter([torch.ones(s) for s in SHAPES], out, mode=other)
    assert len([n for n in called if "scatter" in n]) == 1
    # One rank: out = 0.5 * 1 on every row of the shard, +0 on the padding rows.
    for geo in g.params:
        begin = geo.fp32_offset // 4
        rows = out[begin:begin + geo.rows_per_rank * geo.inner].view(geo.rows_per_rank, -1)
        assert torch.equal(rows[:geo.dim0], torch.full((geo.dim0, geo.inner), 0.5))


@pytest.fixture
def group():
    comm = tb.Comm(1, 1, 0, _name("g"))
    g = comm.register(SHAPES, torch.float32, torch.float32)
    yield g
    g.close()
    comm.close()


def test_argument_checks(group):
    g = group
    good_shard = torch.zeros(g.shard_numel)
    with pytest.raises(ValueError, match="dtype"):
        g.all_gather(good_shard.to(torch.bfloat16), 0)
    with pytest.raises(ValueError, match="items"):
        g.all_gather(torch.zeros(g.shard_numel + 1), 0)
    with pytest.raises(ValueError, match="contiguous"):
        g.all_gather(torch.zeros(g.shard_numel, 2)[:, 0], 0)
    with pytest.raises(ValueError, match="slot"):
        g.all_gather(good_shard, 2)
    with pytest.raises(ValueError, match="torch.Tensor"):
        g.all_gather([0.0] * g.shard_numel, 0)
    with pytest.raises(ValueError, match="stream"):
        g.all_gather(good_shard, 0, stream=object())
    landing = g.landing(0)
    with pytest.raises(ValueError, match="overlaps landing"):
        g.all_gather(landing[:g.shard_numel], 0)
    del landing
    grads = [torch.zeros(s) for s in SHAPES]
    out = torch.zeros(g.out_numel)
    with pytest.raises(ValueError, match="expected 5"):
        g.reduce_scatter(grads[:-1], out)
    with pytest.raises(ValueError, match="out: dtype"):
        g.reduce_scatter(grads, out.double())
    with pytest.raises(ValueError, match="items"):
        g.reduce_scatter(grads, out[:-1])
    with pytest.raises(ValueError, match=r"grads\[3\]: .*items"):
        g.reduce_scatter(grads[:3] + [torch.zeros(13, 5)] + grads[4:], out)
    with pytest.raises(ValueError, match=r"grads\[0\] overlaps out"):
        g.reduce_scatter([out[:15]] + grads[1:], out)
    with pytest.raises(ValueError, match="alpha"):
        g.reduce_scatter(grads, out, alpha="x")
    with pytest.raises(ValueError, match="device"):
        tb.Comm(1, 1, 0, _name("d"), device="meta")
    with pytest.raises(ValueError, match="not a TIDE dtype"):
        tb.tide_dtype(torch.int32)
    # Valid calls still work after the refusals.
    g.all_gather(torch.arange(g.shard_numel, dtype=torch.float32), 0)
    assert torch.equal(g.landing(0)[:g.shard_numel], torch.arange(g.shard_numel,
                                                                  dtype=torch.float32))


def test_capture_readiness_on_the_cpu_fabric(group):
    # The library's verdict (tide_group_capture_readiness): the CPU fabric captures nothing,
    # always said; a program is cold until it ran once.
    from tide import _lib

    g = group
    for call in ("all_gather", "reduce_scatter", "reduce_scatter_staged"):
        blockers, reason = g.capture_readiness(call)
        assert blockers == _lib.CAPTURE_NO_FABRIC | _lib.CAPTURE_PROGRAM_COLD, (call, reason)
        assert "first call of a program" in reason and "cpu fabric" in reason
    g.all_gather(torch.zeros(g.shard_numel), 0)
    blockers, reason = g.capture_readiness("all_gather")
    assert blockers == _lib.CAPTURE_NO_FABRIC and "first call" not in reason, reason
    blockers, _ = g.capture_readiness("reduce_scatter")
    assert blockers & _lib.CAPTURE_PROGRAM_COLD  # still: only the all-gather ran
    with pytest.raises(ValueError, match="call"):
        g.capture_readiness("broadcast")
    with pytest.raises(ValueError, match="stream"):
        g.capture_readiness("all_gather", stream=object())
    # The C checks behind it: a call outside tide_call_kind_t, and a released group.
    fn = _lib.require("tide_group_capture_readiness")
    out = _lib.CaptureReadinessStruct()
    assert fn(g._h(), 7, None, ctypes.byref(out)) == _lib.Result.INVALID_ARGUMENT
    assert "tide_call_kind_t" in _lib.last_error()
    assert fn(g._h(), 0, None, None) == _lib.Result.INVALID_ARGUMENT
    assert fn(None, 0, None, ctypes.byref(out)) == _lib.Result.INVALID_ARGUMENT


def test_views_keep_the_group_and_close_refuses_while_alive():
    comm = tb.Comm(1, 1, 0, _name("v"))
    g = comm.register(SHAPES, torch.bfloat16, torch.bfloat16)
    view = g.param_storage(0, 3)[:78].view(13, 6)
    view.fill_(1.5)
    assert g.live_views() == 1
    with pytest.raises(ValueError, match="still alive"):
        g.close()
    with pytest.raises(ValueError, match="still registered"):
        comm.close()
    assert float(view.sum()) == 1.5 * 78  # still mapped: the group was not closed
    del view
    g.close()
    g.close()  # twice is a no-op
    with pytest.raises(ValueError, match="closed"):
        g.landing(0)
    with pytest.raises(ValueError, match="closed"):
        g.all_gather(torch.zeros(g.shard_numel, dtype=torch.bfloat16), 0)
    comm.close()


def test_unsupported_group_raises_before_the_collective():
    comm = tb.Comm(1, 1, 0, _name("u"))
    with pytest.raises(tide.TideError) as info:
        comm.register([(2,)] * 257, torch.float32, torch.float32)
    assert info.value.code == tide.Result.UNSUPPORTED
    comm.close()


def test_default_topology():
    assert tb.default_topology(4) == (1, 4)
    assert tb.default_topology(16) == (2, 8)
    assert tb.default_topology(4, nodes=2) == (2, 2)
    with pytest.raises(ValueError):
        tb.default_topology(6, gpus_per_node=4)


def test_finaliser_runs_no_collective():
    import gc

    comm = tb.Comm(1, 1, 0, _name("f"))
    g = comm.register(SHAPES, torch.float32, torch.float32)
    with pytest.warns(ResourceWarning, match="without close"):
        del g
        gc.collect()
    # The arena was not deregistered (that is collective), so the library refuses to drop the
    # communicator under it, and says why.
    with pytest.raises(tide.TideError, match="still has 1 registered group"):
        comm.close()


def test_fabric_choice_and_nccl_misuse(monkeypatch):
    # The name: argument first, then TIDE_FABRIC; anything else is a ValueError.
    monkeypatch.delenv("TIDE_FABRIC", raising=False)
    assert tb._fabric_choice(None) is None
    assert tb._fabric_choice("NCCL") == "nccl"
    monkeypatch.setenv("TIDE_FABRIC", "cuda")
    assert tb._fabric_choice(None) == "cuda"
    assert tb._fabric_choice("cpu") == "cpu"
    monkeypatch.setenv("TIDE_FABRIC", "infiniband")
    with pytest.raises(ValueError, match="infiniband"):
        tb._fabric_choice(None)
    with pytest.raises(ValueError, match="expected one of cpu, cuda, nccl"):
        tb._fabric_choice(3)
    monkeypatch.delenv("TIDE_FABRIC")
    # from_nccl_comm checks its arguments before any C call.
    with pytest.raises(ValueError, match="not a CUDA device"):
        tb.Comm.from_nccl_comm(0x1000, 1, 1, 0, "cpu")


def test_nccl_fabric_refused_on_a_gloo_group(tmp_path, monkeypatch):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    dist.init_process_group("gloo", init_method="file://%s" % (tmp_path / "pg"), rank=0,
                            world_size=1)
    try:
        # The CPU cannot carry the NCCL fabric's tensors, and a gloo group has no NCCL
        # communicator to share: both refused with the reason, no collective started.
        with pytest.raises(ValueError, match="fabric nccl cannot carry tensors on cpu"):
            tb.Comm.from_process_group(fabric="nccl")
        monkeypatch.setenv("TIDE_FABRIC", "nccl")
        with pytest.raises(ValueError, match="fabric nccl cannot carry tensors on cpu"):
            tb.Comm.from_process_group()
        with pytest.raises(ValueError, match="not a ProcessGroupNCCL"):
            tb._nccl_comm_ptr(None, torch.device("cpu"))
        monkeypatch.setenv("TIDE_FABRIC", "cpu")
        comm = tb.Comm.from_process_group()
        assert comm.fabric == tb._lib.FABRIC_CPU and "cpu fabric" in repr(comm)
        comm.close()
    finally:
        dist.destroy_process_group()


_EXIT_COMM = """
import os, time, torch
from tide import torch_binding as tb
keep = []
for k in range(2):
    c = tb.Comm(1, 1, 0, "exitcomm-%d-%d" % (os.getpid(), k))
    g = c.register([(8, 4), (3,)], torch.float32, torch.float32)
    view = g.landing(0)
    try:
        g.close()  # refused: a view of the arena is alive
    except ValueError:
        pass
    keep.append((c, g, view))
print("exiting at %.6f" % time.monotonic(), flush=True)
"""


def test_open_comm_at_exit_finalised_locally(exit_script):
    """A communicator whose group could not be closed does not keep its process from
    exiting, is not destroyed under its registered group, and warns once."""
    proc = exit_script(_EXIT_COMM)
    assert proc.stderr.count("finalised with 1 group(s) still registered") == 1, proc.stderr
    # Never destroyed under its group (the library would refuse, and log it).
    assert "comm_destroy" not in proc.stderr, proc.stderr
