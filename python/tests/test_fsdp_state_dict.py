"""State dicts with TIDE on equal stock's (issue 24): copy.deepcopy(get_model_state_dict())
(what EMA and validation copies do), torch.save / torch.load of it, and a
torch.distributed.checkpoint save -> train -> load -> train round trip, world 2 (bit-exact
against stock, docs/fsdp.md "Numerics"), both modes, fp32 and fp32 masters with a bf16
all-gather (the casting groups, whose masters TIDE adopts in a packed buffer)."""

import copy
import io

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import tide.fsdp  # noqa: E402

import fsdp_harness  # noqa: E402
import fsdp_model  # noqa: E402


def _step(model, opt, rank, step):
    x, y = fsdp_model.batch(step, rank)
    loss = F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def _local(sd):
    return {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone()
            for k, v in sd.items()}


def _run(rank, world, mode, mp, ckpt_dir):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         set_model_state_dict)

    model = fsdp_model.build(mp=mp)
    if mode is not None:
        tide.fsdp.enable(model, mode=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    out = {"losses": [_step(model, opt, rank, s) for s in range(2)]}
    sd = get_model_state_dict(model)
    # Every DTensor's local tensor at offset 0 of a storage of its own (as stock's).
    out["offsets"] = sorted({v.to_local().storage_offset() for v in sd.values()})
    deep = copy.deepcopy(sd)
    out["deepcopy"] = _local(deep)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    out["saved"] = _local(torch.load(buf, weights_only=False))
    dcp.save(sd, checkpoint_id=ckpt_dir)
    out["losses"] += [_step(model, opt, rank, s) for s in range(2, 4)]
    # Back to the checkpoint, in place (the adopted shards stay where TIDE reads them).
    target = get_model_state_dict(model)
    dcp.load(target, checkpoint_id=ckpt_dir)
    set_model_state_dict(model, target)
    out["loaded"] = _local(get_model_state_dict(model))
    out["losses"] += [_step(model, opt, rank, s) for s in range(4, 6)]
    out["final"] = _local(get_model_state_dict(model))
    if mode is not None:
        out["copy_in"] = sum(st.calls["copy_in"] for st in tide.fsdp.enabled(model).states)
        # The state dicts' tensors alias the adopted shards (TIDE's arena) as they alias
        # FSDP2's shard storage in stock: dropped before disable() unmaps the arena.
        del sd, deep, target
        tide.fsdp.disable(model)
    return out


def _job(rank, world, ckpt_root):
    import torch.distributed as dist

    out = {}
    for mp in (None, (torch.bfloat16, torch.float32)):
        for mode in (None, "in_place", "slot_reuse"):
            key = "%s/%s" % (mode, "mp" if mp else "fp32")
            path = "%s/%s" % (ckpt_root, key.replace("/", "-"))
            out[key] = _run(rank, world, mode, mp, path)
            dist.barrier()
    return out


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_state_dict_deepcopy_save_and_checkpoint_equal_stock(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    records = fsdp_harness.run(2, _job, run_dir, timeout=400, ckpt_root=str(ckpt))
    for rank, rec in enumerate(records):
        res = rec["result"]
        for prec in ("fp32", "mp"):
            stock = res["None/%s" % prec]
            for mode in ("in_place", "slot_reuse"):
                tide_run = res["%s/%s" % (mode, prec)]
                where = (rank, mode, prec)
                assert tide_run["offsets"] == [0], where
                for what in ("deepcopy", "saved", "loaded", "final"):
                    assert _equal(stock[what], tide_run[what]), (where, what)
                assert stock["losses"] == tide_run["losses"], where
                # The load went into the adopted shards in place: nothing re-adopted.
                assert tide_run["copy_in"] == 0, where
            # The checkpoint really was loaded: the state after loading is the saved one,
            # not the one trained past it.
            assert _equal(stock["loaded"], stock["saved"]), (rank, prec)
