"""FSDP2's own state-dict contract with TIDE enabled: the properties PyTorch's
test_fully_shard_state_dict.py checks of `module.state_dict()` / `load_state_dict()`
(docs/torch-upstream-tests.md), on models TIDE has enabled and trained one step.

Under the TIDE_FSDP switch the upstream file reaches TIDE only through one forward and the
reshard of the state-dict hook after it: its storage and write-back checks run before the
switch enables anything (a root's first forward).  Here TIDE is enabled at once, so every
check sees the adopted shards and the landing:

- state_dict() after a forward without reshard (reshard_after_forward=False) reshards and
  holds the values of the one taken before that forward;
- the state dict's local tensors are the parameters' local tensors (same data pointers);
- load_state_dict() of new tensors writes into the parameters in place (pointers kept
  where the sharding is even) with the new values, and the next forward all-gathers them.

World 2 on a 1-D mesh and world 4 on an HSDP 2 x 2 mesh, dims that pad (3, 5) and one that
does not (16), both reshard_after_forward settings, both modes; outputs equal stock's."""

import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402

import tide.fsdp  # noqa: E402

import fsdp_harness  # noqa: E402

DIMS = (3, 5, 16)


def _model(dim):
    torch.manual_seed(7)

    def mlp():
        return nn.Sequential(nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim))

    return nn.Sequential(mlp(), nn.Sequential(mlp(), nn.Linear(dim, dim)), mlp())


def _check(model, rank, dim):
    """The state-dict properties on an enabled (or stock) model; returns the output of a
    forward after the load."""
    from torch.distributed.tensor import DTensor

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    model(torch.randn(2, dim, generator=gen)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

    before = {k: v.to_local().clone() for k, v in model.state_dict().items()}
    model(torch.randn(2, dim, generator=gen))  # unsharded after it if not resharding
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k, v in after.items():
        assert torch.equal(before[k], v.to_local()), ("state_dict after a forward", k)
    del after

    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    ptrs = {n: p.to_local().data_ptr() for n, p in model.named_parameters()}
    sd = model.state_dict()
    assert sd.keys() == ptrs.keys()
    for k, v in sd.items():
        assert isinstance(v, DTensor), k
        if ptrs[k]:  # 0: an empty padded shard
            assert v.to_local().data_ptr() == ptrs[k], ("state_dict aliases the shard", k)
    value = 42.0 + rank
    new = {k: v.detach().clone().fill_(value) for k, v in sd.items()}
    del sd
    model.load_state_dict(new)
    del new
    for n, p in model.named_parameters():
        local = p.to_local()
        assert torch.equal(local, torch.full_like(local, value)), ("loaded value", n)
        if local.size(0) * p.device_mesh.size() == p.size(0):
            assert local.data_ptr() == ptrs[n], ("load_state_dict in place", n)
        del local
    out = model(torch.ones(2, dim)).detach().clone()
    for m in model.modules():  # resharded, as disable() asks (between steps)
        if hasattr(m, "reshard"):
            m.reshard()
    return out


def _job(rank, world, hsdp):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = (init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
            if hsdp else init_device_mesh("cpu", (world,)))
    out = {}
    for mode in (None, "in_place", "slot_reuse"):
        for reshard in (True, False):
            for dim in DIMS:
                model = _model(dim)
                for block in model:
                    fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
                fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
                if mode is not None:
                    tide.fsdp.enable(model, mode=mode)
                key = (mode, reshard, dim)
                out[key] = {"out": _check(model, rank, dim)}
                if mode is not None:
                    handle = tide.fsdp.enabled(model)
                    out[key]["tide_groups"] = sum(st.tier in (0, 1) for st in handle.states)
                    out[key]["all_gathers"] = sum(st.calls["all_gather"]
                                                  for st in handle.states)
                    out[key]["fallbacks"] = list(handle.fallbacks)
                    tide.fsdp.disable(model)
    return out


@pytest.mark.parametrize("world,hsdp", [(2, False), (4, True)], ids=["1d-w2", "hsdp-2x2"])
def test_state_dict_contract_on_enabled_model_equals_stock(tmp_path, world, hsdp):
    records = fsdp_harness.run(world, _job, tmp_path, timeout=600, hsdp=hsdp)
    for rank, rec in enumerate(records):
        assert rec["ok"], (rank, rec.get("traceback"))
        res = rec["result"]
        for mode in ("in_place", "slot_reuse"):
            for reshard in (True, False):
                for dim in DIMS:
                    key = (mode, reshard, dim)
                    tide_run, stock = res[key], res[(None, reshard, dim)]
                    # TIDE served every group (three blocks; the root holds no parameters)
                    # and ran the all-gathers: a run on stock would pass vacuously.
                    assert tide_run["fallbacks"] == [], (rank, key, tide_run["fallbacks"])
                    assert tide_run["tide_groups"] == 3, (rank, key)
                    assert tide_run["all_gathers"] >= 3 * 3, (rank, key)
                    assert torch.equal(tide_run["out"], stock["out"]), (rank, key)
