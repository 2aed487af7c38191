"""Bad use of tide.fsdp gives a clear error and loses nothing: enable before fully_shard,
enable twice, parameters changed after enable, ranks that disagree, a torch whose internals
differ, groups outside the contract, a view kept past disable, a rank that dies mid-step."""

import os
import time

import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tide  # noqa: E402
import tide.fsdp  # noqa: E402

import fsdp_harness  # noqa: E402
import fsdp_model  # noqa: E402
import fsdp_train  # noqa: E402


def _error(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the outcome is what the test asserts on
        return type(exc).__name__, str(exc)
    return None


def _step(model, rank, step):
    """One SGD step (the optimizer lives on the model object so that steps chain)."""
    if not hasattr(model, "_test_opt"):
        model._test_opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = fsdp_model.batch(step, rank)
    loss = F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1))
    loss.backward()
    model._test_opt.step()
    model._test_opt.zero_grad(set_to_none=True)
    return loss.item()


def test_enable_before_fully_shard():
    with pytest.raises(ValueError, match="fully_shard"):
        tide.fsdp.enable(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="not enabled"):
        tide.fsdp.disable(nn.Linear(4, 4))


# ------------------------------------------------------------------------ one world-2 job


def _lifecycle(rank, world):
    out = {}
    model = fsdp_model.build()
    with pytest.raises(ValueError, match="mode"):
        tide.fsdp.enable(model, mode="sideways")
    tide.fsdp.enable(model)
    out["twice"] = _error(tide.fsdp.enable, model)
    out["sub_twice"] = _error(tide.fsdp.enable, model.layers[0])
    _step(model, rank, 0)
    tide.fsdp.disable(model)
    out["disable_twice"] = _error(tide.fsdp.disable, model)
    # Stock again after disable, then TIDE again: equal to a model that never left stock.
    losses = [_step(model, rank, 1)]
    tide.fsdp.enable(model, mode="slot_reuse")
    losses.append(_step(model, rank, 2))
    tide.fsdp.disable(model)
    ref = fsdp_model.build()
    ref_losses = [_step(ref, rank, s) for s in (0, 1, 2)][1:]
    out["reenable_equal"] = losses == ref_losses

    # Parameters changed after enable: refused at the next all-gather, on every rank alike.
    model = fsdp_model.build()
    tide.fsdp.enable(model)
    _step(model, rank, 0)
    model.double()
    out["changed"] = _error(_step, model, rank, 1)
    model.float()  # fp32 -> fp64 -> fp32 is exact: the model is what it was
    model.zero_grad(set_to_none=True)
    after = [_step(model, rank, s) for s in (1, 2)]
    tide.fsdp.disable(model)
    ref = fsdp_model.build()
    _step(ref, rank, 0)
    out["changed_then_restored_equal"] = after == [_step(ref, rank, s) for s in (1, 2)]

    # A tensor kept on the arena blocks disable on every rank, until it is dropped.
    model = fsdp_model.build()
    tide.fsdp.enable(model)
    kept = []
    if rank == 0:
        model.layers[0].wq.register_forward_pre_hook(
            lambda mod, args: kept.append(mod.weight.detach()) if not kept else None)
    _step(model, rank, 0)
    out["kept_view"] = _error(tide.fsdp.disable, model)
    out["kept_data_readable"] = bool(torch.isfinite(kept[0]).all()) if kept else None
    kept.clear()
    tide.fsdp.disable(model)  # now it closes
    out["closed"] = tide.fsdp.enabled(model) is None and getattr(model, "_tide_fsdp_closing",
                                                                  None) is None

    # A checkpoint saved and loaded mid-training (load_state_dict re-pads the sharded
    # parameters): TIDE all-gathers what was loaded, as stock does.
    def checkpointed(use_tide):
        m = fsdp_model.build()
        if use_tide:
            tide.fsdp.enable(m)
        _step(m, rank, 0)
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        _step(m, rank, 1)
        m.load_state_dict(sd)
        losses = [_step(m, rank, s) for s in (2, 3)]
        if use_tide:
            tide.fsdp.disable(m)
        return losses

    out["checkpoint_equal"] = checkpointed(True) == checkpointed(False)

    # CTA budgets (enable's tuning) reach every registered group, and the numerics do not depend on them;
    # an invalid budget is refused before any collective, ranks that disagree on one too.
    out["bad_ctas"] = _error(tide.fsdp.enable, fsdp_model.build(), tuning={"sum_ctas": -1})
    model = fsdp_model.build()
    rec = tide.fsdp.enable(model, tuning={"sum_ctas": 2, "landing_ctas": 3})
    out["ctas"] = sorted({(st.group.config.sum_ctas, st.group.config.landing_ctas)
                          for st in rec.states})
    tuned = [_step(model, rank, s) for s in (0, 1)]
    tide.fsdp.disable(model)
    ref = fsdp_model.build()
    out["ctas_equal"] = tuned == [_step(ref, rank, s) for s in (0, 1)]
    out["ctas_disagree"] = _error(tide.fsdp.enable, fsdp_model.build(),
                                  tuning={"sum_ctas": 2 + rank})

    # Ranks that disagree on a group: rank 1's MLP is wider.
    model = fsdp_model.build(hidden=44 + 4 * rank)
    out["disagree"] = _error(tide.fsdp.enable, model)
    return out


def test_lifecycle_and_refusals(tmp_path):
    for rec in fsdp_harness.run(2, _lifecycle, tmp_path):
        r = rec["result"]
        assert r["twice"][0] == "RuntimeError" and "already enabled" in r["twice"][1]
        assert r["sub_twice"][0] == "RuntimeError" and "already" in r["sub_twice"][1]
        assert r["disable_twice"][0] == "ValueError"
        assert r["reenable_equal"]
        assert r["changed"][0] == "RuntimeError" and "changed after enable" in r["changed"][1]
        assert r["changed_then_restored_equal"]
        assert r["kept_view"][0] == "RuntimeError" and "alias" in r["kept_view"][1]
        assert r["closed"]
        assert r["checkpoint_equal"]
        assert r["disagree"][0] == "RuntimeError" and "disagree" in r["disagree"][1]
        assert r["bad_ctas"][0] == "ValueError" and "sum_ctas" in r["bad_ctas"][1]
        assert r["ctas"] == [(2, 3)]
        assert r["ctas_equal"]
        assert r["ctas_disagree"][0] == "RuntimeError" and "disagree" in r["ctas_disagree"][1]


# ------------------------------------------------------------------------ torch internals


def _internals_differ(rank, world):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll

    out = {}
    original = coll.foreach_reduce

    def foreach_reduce(fsdp_params, unsharded_grads, *rest, new_argument=None):
        return original(fsdp_params, unsharded_grads, *rest)

    coll.foreach_reduce = foreach_reduce  # what a torch with other internals looks like
    try:
        out["problems"] = tide.fsdp._internals.check()
        model = fsdp_model.build()
        out["tier1"] = _error(tide.fsdp.enable, model, tier=1)
        run = fsdp_train.train(rank, world, steps=3, tide_mode="in_place")
        out["auto_groups"] = run["groups"]
        out["auto_calls"] = run["calls"]
        stock = fsdp_train.train(rank, world, steps=3)
        out["auto_equal"] = all(torch.equal(a, b) for pa, pb in zip(stock["params"],
                                                                    run["params"])
                                for a, b in zip(pa, pb))
        hooks = FSDPModule.set_custom_all_gather
        del FSDPModule.set_custom_all_gather
        try:
            out["neither"] = _error(tide.fsdp.enable, fsdp_model.build())
        finally:
            FSDPModule.set_custom_all_gather = hooks
    finally:
        coll.foreach_reduce = original
    out["restored_problems"] = tide.fsdp._internals.check()
    return out


def test_torch_internals_differ(tmp_path):
    for rec in fsdp_harness.run(2, _internals_differ, tmp_path):
        r = rec["result"]
        assert any("foreach_reduce" in p for p in r["problems"])
        assert r["tier1"][0] == "RuntimeError" and "Tier 1 refused" in r["tier1"][1]
        assert [t for _, t in r["auto_groups"]] == [0, 0, 0]
        assert all(c["all_gather"] >= 3 and c["reduce_scatter"] == 3
                   for c in r["auto_calls"].values())
        assert r["auto_equal"]
        assert r["neither"][0] == "RuntimeError" and "neither" in r["neither"][1]
        assert r["restored_problems"] == []


# ------------------------------------------------------------------------ outside the contract


class _Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 16) * 0.1)
        self.scale = nn.Parameter(torch.ones(6, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, x):
        return F.linear(x, self.weight) * self.scale.float()


class _Many(nn.Module):
    def __init__(self, n=260):
        super().__init__()
        self.ps = nn.ParameterList(nn.Parameter(torch.randn(3) * 0.1) for _ in range(n))

    def forward(self, x):
        return x[..., :3] * torch.stack(list(self.ps)).sum(0)


class _Contract(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 6, bias=False)
        self.mixed = _Mixed()
        self.dim1 = nn.Linear(8, 6, bias=False)
        self.offload = nn.Linear(16, 6, bias=False)
        self.many = _Many()
        self.out = nn.Parameter(torch.randn(6, 4) * 0.3)

    def forward(self, x):
        h = self.proj(x) + self.mixed(x) + self.dim1(x[..., :8]) + self.offload(x)
        return (h @ self.out).sum(-1) + self.many(x).sum(-1)


def _build_contract():
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    from torch.distributed.tensor import Shard

    torch.manual_seed(3)
    m = _Contract()
    fully_shard(m.proj)
    fully_shard(m.mixed)
    fully_shard(m.dim1, shard_placement_fn=lambda p: Shard(1))
    fully_shard(m.offload, offload_policy=CPUOffloadPolicy(pin_memory=False))
    fully_shard(m.many)
    fully_shard(m)
    return m


def _contract(rank, world):
    def train(enable):
        m = _build_contract()
        rec = tide.fsdp.enable(m) if enable else None
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(3):
            g = torch.Generator().manual_seed(step * 10 + rank)
            m(torch.randn(4, 16, generator=g)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        params = [p.to_local().detach().clone() for p in m.parameters()]
        info = (rec.groups, rec.fallbacks) if rec else None
        if rec:
            tide.fsdp.disable(m)
        return params, info

    stock, _ = train(False)
    tide_params, (groups, fallbacks) = train(True)
    return {"groups": groups, "fallbacks": fallbacks,
            "equal": all(torch.equal(a, b) for a, b in zip(stock, tide_params))}


def test_groups_outside_the_contract_stay_stock(tmp_path):
    for rec in fsdp_harness.run(2, _contract, tmp_path):
        r = rec["result"]
        assert r["groups"] == [("<root>", 1), ("proj", 1)]
        why = dict(r["fallbacks"])
        assert "mixed parameter dtypes" in why["mixed"]
        assert "dim 1" in why["dim1"]
        assert why["offload"] == "CPU offload"
        assert "260 parameters" in why["many"]
        assert r["equal"]


def _hsdp(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out = []
    for use_tide in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        fully_shard(m[0], mesh=mesh)
        fully_shard(m, mesh=mesh)
        rec = tide.fsdp.enable(m) if use_tide else None
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(2):
            g = torch.Generator().manual_seed(10 * step + rank)
            m(torch.randn(3, 8, generator=g)).sum().backward()
            opt.step()
            opt.zero_grad()
        out.append(([p.to_local().clone() for p in m.parameters()],
                    rec.fallbacks if rec else None))
        if rec:
            tide.fsdp.disable(m)
    return {"fallbacks": out[1][1],
            "equal": all(torch.equal(a, b) for a, b in zip(out[0][0], out[1][0]))}


def test_hsdp_is_served(tmp_path):
    # HSDP runs TIDE on the shard dimension (parity in detail: test_fsdp_hsdp.py).
    for rec in fsdp_harness.run(4, _hsdp, tmp_path):
        r = rec["result"]
        assert r["fallbacks"] == []
        assert r["equal"]


def _world1(rank, world):
    model = fsdp_model.build()
    rec = tide.fsdp.enable(model)
    losses = [_step(model, rank, s) for s in range(2)]
    out = {"groups": rec.groups, "fallbacks": rec.fallbacks, "losses": losses}
    tide.fsdp.disable(model)
    return out


def test_world_size_one_stays_stock(tmp_path):
    (rec,) = fsdp_harness.run(1, _world1, tmp_path)
    r = rec["result"]
    assert r["groups"] == []
    assert [why for _, why in r["fallbacks"]] == ["world size 1"] * 3


# ------------------------------------------------------------------------ fail-stop


def _dies(rank, world):
    model = fsdp_model.build()
    tide.fsdp.enable(model)
    _step(model, rank, 0)
    x, y = fsdp_model.batch(1, rank)
    loss = F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1))
    if rank == 1:
        os._exit(17)  # dies between forward and backward
    t0 = time.monotonic()
    try:
        loss.backward()
    except tide.TideError as exc:
        return {"code": exc.code.name, "message": exc.message, "after_s": time.monotonic() - t0}
    return {"code": None}


def test_rank_dies_mid_step_fail_stops(tmp_path):
    recs = fsdp_harness.run(2, _dies, tmp_path, allow_failure=True, timeout=120,
                            env={"TIDE_TIMEOUT_MS": "3000"})
    assert recs[1]["exitcode"] == 17
    r = recs[0]["result"]
    assert r["code"] == "TIMEOUT", r
    assert 2.5 < r["after_s"] < 60, r


# ------------------------------------------------------------------------ the docs example


def test_docs_example_trains(tmp_path):
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root / "python"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(root / "docs" / "fsdp-example.py")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [float(line.split()[-1]) for line in proc.stdout.splitlines()
              if line.startswith("step ")]
    assert len(losses) == 10
    assert losses[-1] < losses[0] - 0.5  # it learns


# ------------------------------------------------------------------------ the TIDE_FSDP switch

_PLAIN_FSDP2_SCRIPT = '''
import os, sys, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, sys.argv[1])
import fsdp_model                      # the test model; nothing here imports tide

def rank_main(rank, world, store):
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                            world_size=world)
    torch.set_num_threads(1)
    model = fsdp_model.build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x, y = fsdp_model.batch(step, rank)
        torch.nn.functional.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
    rec = getattr(model, "_tide_fsdp", None)
    if rank == 0:
        print("TIDE", None if rec is None else (rec.mode, rec.groups), flush=True)
        print("SUM %.9e" % sum(float(p.to_local().double().sum()) for p in model.parameters()))

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank_main, args=(2, os.path.join(tmp, "store")), nprocs=2)
'''


def test_tide_fsdp_switch_turns_tide_on_without_code_changes(tmp_path):
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    script = tmp_path / "plain_fsdp2.py"
    script.write_text(_PLAIN_FSDP2_SCRIPT)
    site = root / "python" / "tide" / "fsdp" / "sitecustomize"
    outs = {}
    for mode in ("", "slot_reuse"):
        env = dict(os.environ, PYTHONPATH="%s:%s" % (site, root / "python"),
                   OMP_NUM_THREADS="1", TIDE_FSDP=mode)
        proc = subprocess.run([sys.executable, str(script), str(root / "python" / "tests")],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs[mode] = proc.stdout
    assert "TIDE None" in outs[""]
    assert ("TIDE ('slot-reuse', [('<root>', 1), ('layers.0', 1), ('layers.1', 1)])"
            in outs["slot_reuse"]), outs["slot_reuse"]
    # Same parameters after 3 steps, with and without the switch (world 2: bit-exact).
    sums = [line for line in outs[""].splitlines() if line.startswith("SUM")]
    assert sums and sums == [line for line in outs["slot_reuse"].splitlines()
                             if line.startswith("SUM")]
