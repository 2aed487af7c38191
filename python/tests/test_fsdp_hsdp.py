"""HSDP on a 2 x 2 (replicate, shard) mesh at world 4: TIDE serves the shard dimension, the
replica all-reduce runs on TIDE-RS's shard output through FSDP2's own path (tide/fsdp/
_hsdp.py), with FSDP2's divisions and hooks in stock's order.

Bit-exact against stock: each of the two sums has two terms (order-independent) and the
divisions by 2 are exact; a bf16 reduce dtype is rounded where stock rounds
(_rounding.py), so the replica all-reduce sees stock's bf16 values.
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402
import fsdp_train  # noqa: E402

STEPS = 6


def _train(rank, world, tide_mode=None, tier=None, mp=None, accum=1, hook=False,
           force_sum=False, divide_factor=None):
    from torch.distributed.device_mesh import init_device_mesh

    import fsdp_model
    import tide.fsdp

    torch.manual_seed(0)
    model = fsdp_model.TinyLlama(exact=False)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    fsdp_model.shard(model, mp=fsdp_train.mp_dtypes(mp), mesh=mesh)
    if hook:
        for m in model.modules():
            if hasattr(m, "set_all_reduce_hook"):
                m.set_all_reduce_hook(lambda out: out.mul_(3.0).add_(1e-3))
    if force_sum:
        model.set_force_sum_reduction_for_comms(True)
    if divide_factor is not None:
        model.set_gradient_divide_factor(divide_factor)
    rec = tide.fsdp.enable(model, mode=tide_mode, tier=tier) if tide_mode else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)

    def before_micro(step, micro):
        # HSDP's own accumulation: reduce-scatter every micro-batch, all-reduce the partial
        # output at the last one only.
        model.set_requires_all_reduce(micro == accum - 1)

    with fsdp_train._CountStockCopies() as counter:
        losses, params = fsdp_train.train_loop(model, opt, rank, STEPS, accum, before_micro)
    out = {"losses": losses, "params": params, **fsdp_train.served(rec),
           "stock_copies": counter.counts}
    if rec is not None:
        tide.fsdp.disable(model)
    return out


def _configs():
    return [dict(tide_mode="in_place"),
            dict(tide_mode="slot_reuse", accum=2),
            dict(tide_mode="in_place", mp=("bf16", "bf16")),
            dict(tide_mode="slot_reuse", mp=("bf16", "fp32"), hook=True),
            dict(tide_mode="in_place", force_sum=True),
            dict(tide_mode="in_place", tier=0, accum=2)]


def _body(rank, world, configs):
    out, cache = [], {}
    for cfg in configs:
        stock_kw = {k: v for k, v in cfg.items() if k not in ("tide_mode", "tier")}
        key = repr(sorted(stock_kw.items()))
        if key not in cache:
            cache[key] = _train(rank, world, **stock_kw)
        out.append((cfg, cache[key], _train(rank, world, **cfg)))
    return out


def _equal(a, b):
    return (len(a["params"]) == len(b["params"]) == STEPS
            and all(torch.equal(x, y) for pa, pb in zip(a["params"], b["params"])
                    for x, y in zip(pa, pb))
            and a["losses"] == b["losses"])


def test_hsdp_2x2_matches_stock(tmp_path):
    records = fsdp_harness.run(4, _body, tmp_path, timeout=540, configs=_configs())
    for rank, rec in enumerate(records):
        assert rec["ok"], rec.get("traceback")
        for cfg, stock, tide in rec["result"]:
            where = "rank %d, %s" % (rank, cfg)
            tier = cfg.get("tier", 1)
            accum = cfg.get("accum", 1)
            assert tide["fallbacks"] == [], where
            assert [t for _, t in tide["groups"]] == [tier] * 3, where
            for name, calls in tide["calls"].items():
                assert calls["reduce_scatter"] == STEPS * accum, (where, name, calls)
                if tier == 1:
                    assert calls.get("stock_reduce", 0) == 0, (where, name, calls)
                    assert calls["replica_all_reduce"] == STEPS, (where, name, calls)
                    assert calls.get("deferred_all_reduce", 0) == STEPS * (accum - 1), (
                        where, name, calls)
            copies = tide["stock_copies"]
            assert copies["reduce_scatter_tensor"] == 0, (where, copies)
            assert copies["all_gather_into_tensor"] == 0, (where, copies)
            assert stock["stock_copies"]["reduce_scatter_tensor"] > 0, where
            assert _equal(stock, tide), where
