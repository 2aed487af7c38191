"""MixedPrecisionPolicy's reduce dtype as the user asked for it, TIDE against stock FSDP2.

With a bf16 reduce dtype stock FSDP2 reduces in bf16 (gloo rounds the sum to bf16) and casts
the output to the parameters' dtype; fp32 gradients are cast to bf16 first.  By default Tier 1
rounds where stock does (tide/fsdp/_rounding.py), and at world 2 that is stock's result bit for
bit: a sum of two bf16 values is exact in fp32 and the division by 2 is exact.  Tier 0 rounds
into FSDP2's bf16 output buffer.  enable(reduce_in_fp32=True) keeps TIDE-RS's fp32 sum: then
TIDE equals stock's reduce_dtype=float32 run instead, and not stock's bf16 one.
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402
import fsdp_train  # noqa: E402

STEPS = 8


def _configs():
    out = []
    for mode in ("in_place", "slot_reuse"):
        out.append(dict(tide_mode=mode, mp=("bf16", "bf16")))
    out += [dict(tide_mode="in_place", mp=("bf16", None)),     # bf16 grads, reduce_dtype=None
            dict(tide_mode="slot_reuse", mp=(None, "bf16")),   # fp32 grads rounded to bf16
            dict(tide_mode="in_place", mp=("bf16", "bf16"), tier=0),
            dict(tide_mode="in_place", mp=("bf16", "bf16"), hook=True)]
    return [dict(c, steps=STEPS) for c in out]


def _body(rank, world, configs):
    return {"pairs": fsdp_train.compare(rank, world, configs),
            "fp32_option": fsdp_train.train(rank, world, steps=STEPS, mp=("bf16", "bf16"),
                                            tide_mode="in_place", reduce_in_fp32=True),
            "stock_fp32_reduce": fsdp_train.train(rank, world, steps=STEPS,
                                                  mp=("bf16", "fp32"))}


def _equal(a, b):
    return (len(a["params"]) == len(b["params"]) == STEPS
            and all(torch.equal(x, y) for pa, pb in zip(a["params"], b["params"])
                    for x, y in zip(pa, pb))
            and a["losses"] == b["losses"])


def _served(tide, cfg):
    tier = cfg.get("tier", 1)
    assert tide["fallbacks"] == [], tide["fallbacks"]
    assert [t for _, t in tide["groups"]] == [tier] * 3, tide["groups"]
    for name, calls in tide["calls"].items():
        assert calls["reduce_scatter"] == STEPS, (name, calls)
        assert calls.get("stock_reduce", 0) == 0, (name, calls)
    copies = tide["stock_copies"]
    assert copies["reduce_scatter_tensor"] == 0 and copies["all_gather_into_tensor"] == 0, copies


def test_bf16_reduce_dtype_matches_stock_world2(tmp_path):
    records = fsdp_harness.run(2, _body, tmp_path, timeout=420, configs=_configs())
    for rank, rec in enumerate(records):
        assert rec["ok"], rec.get("traceback")
        res = rec["result"]
        assert len(res["pairs"]) == len(_configs())
        for cfg, stock, tide in res["pairs"]:
            where = "rank %d, %s" % (rank, cfg)
            _served(tide, cfg)
            assert stock["stock_copies"]["reduce_scatter_tensor"] > 0, where
            assert _equal(stock, tide), where
        bf16_stock = res["pairs"][0][1]
        # The rounding matters on this model: stock's bf16 and fp32 reductions differ, so
        # the equalities above could fail.
        assert not _equal(bf16_stock, res["stock_fp32_reduce"])
        opt = res["fp32_option"]
        _served(opt, {})
        assert _equal(opt, res["stock_fp32_reduce"]), rank
        assert not _equal(opt, bf16_stock), rank
