"""Mixed precision (fp32 masters, bf16 all-gather) with reduce_dtype=float32 under gradient
accumulation without synchronisation, TIDE against stock FSDP2.

FSDP2 keeps the accumulated gradients in the reduce dtype between unsynchronised backwards
(FSDPParam.to_accumulated_grad_if_needed: bf16 gradient -> fp32, then += each later bf16
gradient), so the synchronised backward hands foreach_reduce fp32 gradients of a group whose
all-gather (and so its TIDE registration) is bf16.  Tier 1 reduces those through the
group's fp32 companion registration; nothing may run on stock.

Bit-exact at world 2: both sides reduce the same fp32 accumulated gradients (FSDP2's own
accumulation runs unchanged), and a sum of two fp32 values, then * 1/2, does not depend on
the order.  The model draws gradients with wide exponents (a Llama-style block, AdamW), not
integers only.
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402
import fsdp_train  # noqa: E402

STEPS = 12


def _configs():
    out = []
    for mode in ("in_place", "slot_reuse"):
        for accum in (2, 3):
            out.append(dict(tide_mode=mode, mp=("bf16", "fp32"), accum=accum, steps=STEPS))
    # Accumulation with a sync at every micro-batch as well as without, in one run: the
    # group switches between the bf16 registration and the fp32 companion from step to step.
    out.append(dict(tide_mode="in_place", mp=("bf16", "fp32"), accum=2, steps=STEPS,
                    mixed_sync=True))
    return out


def _body(rank, world, configs):
    plain = [{k: v for k, v in c.items() if k != "mixed_sync"} for c in configs
             if not c.get("mixed_sync")]
    out = {"pairs": fsdp_train.compare(rank, world, plain), "mixed": []}
    for cfg in configs:
        if cfg.get("mixed_sync"):
            kw = {k: v for k, v in cfg.items() if k != "mixed_sync"}
            stock_kw = {k: v for k, v in kw.items() if k != "tide_mode"}
            out["mixed"].append((cfg, _alternating(rank, world, **stock_kw),
                                 _alternating(rank, world, **kw)))
    return out


def _alternating(rank, world, steps, accum, mp, tide_mode=None):
    """Even steps accumulate without sync (fp32 companion), odd steps sync every micro-batch
    (the bf16 registration): the same group serves both kinds of reduction."""
    import fsdp_model
    import tide.fsdp

    model = fsdp_model.build(seed=0, mp=(torch.bfloat16, torch.float32))
    rec = tide.fsdp.enable(model, mode=tide_mode) if tide_mode else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)

    def before_micro(step, micro):
        model.set_requires_gradient_sync(step % 2 == 1 or micro == accum - 1)

    losses, params = fsdp_train.train_loop(model, opt, rank, steps, accum, before_micro)
    out = {"losses": losses, "params": params, **fsdp_train.served(rec)}
    if rec is not None:
        tide.fsdp.disable(model)
    return out


def _assert_bit_equal(stock, tide, where):
    assert len(stock["params"]) == len(tide["params"]) == STEPS
    for step, (ps, pt) in enumerate(zip(stock["params"], tide["params"])):
        for a, b in zip(ps, pt):
            assert a.dtype == b.dtype == torch.float32
            assert torch.equal(a, b), "%s: parameters differ at step %d" % (where, step)
    assert stock["losses"] == tide["losses"], where


def test_mixed_precision_fp32_reduce_no_sync_accumulation_world2(tmp_path):
    records = fsdp_harness.run(2, _body, tmp_path, timeout=420, configs=_configs())
    for rank, rec in enumerate(records):
        assert rec["ok"], rec.get("traceback")
        res = rec["result"]
        assert len(res["pairs"]) == 4 and len(res["mixed"]) == 1
        for cfg, stock, tide in res["pairs"]:
            where = "rank %d, %s" % (rank, cfg)
            assert tide["fallbacks"] == [] and [t for _, t in tide["groups"]] == [1] * 3
            for name, calls in tide["calls"].items():
                # One synchronised reduction per step, every one on TIDE through the fp32
                # companion (the accumulated gradients are fp32), none on stock.
                assert calls["stock_reduce"] == 0, (where, name, calls)
                assert calls["reduce_scatter"] == STEPS, (where, name, calls)
                assert calls["wide_reduce_scatter"] == STEPS, (where, name, calls)
            copies = tide["stock_copies"]
            assert copies["reduce_scatter_tensor"] == 0 and copies["_chunk_cat"] == 0, copies
            assert stock["stock_copies"]["reduce_scatter_tensor"] > 0  # stock did reduce
            # The accumulation really ran in fp32: the stock run's own parameters move.
            assert not torch.equal(stock["params"][0][0], stock["params"][-1][0])
            _assert_bit_equal(stock, tide, where)
        for cfg, stock, tide in res["mixed"]:
            where = "rank %d, %s" % (rank, cfg)
            for name, calls in tide["calls"].items():
                assert calls["stock_reduce"] == 0, (where, name, calls)
                # Odd steps: accum synchronised bf16 reductions; even steps: one fp32 one.
                odd, even = STEPS // 2, STEPS - STEPS // 2
                assert calls["reduce_scatter"] == odd * 2 + even, (where, name, calls)
                assert calls["wide_reduce_scatter"] == even, (where, name, calls)
            _assert_bit_equal(stock, tide, where)
