"""tide.fsdp under a CUDA graph capture, by default (enable(capture="stock")): the served
groups' collectives run on stock FSDP2.

TIDE's calls are captured only with enable(capture="tide") and under the C layer's
preconditions (docs/fsdp.md, "CUDA graphs"; test_fsdp_capture_tide.py).  By default, while
the current stream is capturing, every all-gather and reduce-scatter of a Tier 1 group runs
on stock FSDP2 (stock memory, NCCL, which captures), and so does every Tier 0 call; each
group says so once in the log and in enabled(model).fallbacks.  The TIDE_FSDP switch does not enable a root whose forward runs in
a capture (enable() allocates and runs collectives).

This machine has no GPU, so the capture is simulated: tide.fsdp._auto._capturing, the one
place the adapter asks torch.cuda.is_current_stream_capturing(), is patched to answer True
for steps 1 and 2.  What is checked is the adapter's side: which calls leave TIDE, what is
said, and that training gives stock's parameters bit for bit at world 2 (gloo, CPU fabric).
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402

STEPS = 4
CAPTURED = (1, 2)


def _train(rank, world, tide_on, tier=1, switch=False, captured=CAPTURED):
    import logging

    import torch.nn.functional as F

    import fsdp_model
    import tide.fsdp
    from tide.fsdp import _auto

    lines = []

    class _Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logging.getLogger("tide.fsdp").addHandler(_Keep())
    capturing = {"on": False}
    real = _auto._capturing
    _auto._capturing = lambda: capturing["on"]
    if switch:
        _auto.install("in_place")
    try:
        model = fsdp_model.build(seed=0, exact=True)
        if tide_on and not switch:
            tide.fsdp.enable(model, mode="in_place", tier=tier)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        served = []
        for step in range(STEPS):
            capturing["on"] = step in captured
            x, y = fsdp_model.batch(step, rank)
            F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1)).backward()
            capturing["on"] = False
            served.append(tide.fsdp.enabled(model) is not None)
            opt.step()
            opt.zero_grad()
        rec = tide.fsdp.enabled(model)
        calls = [(st.spec.name, st.tier, dict(st.calls)) for st in rec.states] if rec else []
        fallbacks = list(rec.fallbacks) if rec else []
        params = [p.to_local().detach().clone() for p in model.parameters()]
        if rec is not None:
            tide.fsdp.disable(model)
        return {"calls": calls, "fallbacks": fallbacks, "params": params, "lines": lines,
                "served": served}
    finally:
        _auto._capturing = real
        if switch:
            _auto.uninstall()


def _same_params(tide, stock):
    assert len(tide["params"]) == len(stock["params"])
    for a, b in zip(tide["params"], stock["params"]):
        assert torch.equal(a, b)


def _said(tide, name):
    """What enabled(model).fallbacks says of group `name` about the capture."""
    return [why for fqn, why in tide["fallbacks"] if fqn == name and "CUDA graph capture" in why]


def _check_groups(recs, tier, check):
    """Every rank ran, TIDE served `tier` groups, check(name, calls, tide) holds for each, and
    the parameters are stock's."""
    for rec in recs:
        assert rec["ok"], rec.get("traceback")
        stock, tide = rec["result"]["stock"], rec["result"]["tide"]
        assert tide["calls"], "nothing was served"
        for name, got_tier, calls in tide["calls"]:
            assert got_tier == tier, (name, got_tier)
            # Steps 0 and 3 on TIDE; steps 1 and 2 on stock.
            assert calls.get("reduce_scatter", 0) == STEPS - len(CAPTURED), (name, calls)
            check(name, calls, tide)
        _same_params(tide, stock)


def _tier1(rank, world):
    return {"stock": _train(rank, world, False), "tide": _train(rank, world, True)}


def test_tier1_calls_in_a_capture_run_on_stock(tmp_path):
    def check(name, calls, tide):
        # The forward's gather, the backward's re-gather and the reduction of steps 1, 2.
        assert calls.get("stock_reduce", 0) == len(CAPTURED), (name, calls)
        assert calls.get("stock_all_gather", 0) >= len(CAPTURED), (name, calls)
        for verb in ("gathers", "reduces"):
            said = [line for line in tide["lines"]
                    if line.startswith("tide.fsdp: %s %s with stock" % (name, verb))
                    and "CUDA graph capture" in line]
            assert len(said) == 1, tide["lines"]
        assert len(_said(tide, name)) == 2, tide["fallbacks"]

    _check_groups(fsdp_harness.run(2, _tier1, tmp_path), 1, check)


def _tier0(rank, world):
    return {"stock": _train(rank, world, False), "tide": _train(rank, world, True, tier=0)}


def test_tier0_calls_in_a_capture_run_on_stock(tmp_path):
    def check(name, calls, tide):
        assert calls.get("stock_captured", 0) >= 2 * len(CAPTURED), (name, calls)
        assert len(_said(tide, name)) == 1, tide["fallbacks"]

    _check_groups(fsdp_harness.run(2, _tier0, tmp_path), 0, check)


SWITCH_CAPTURED = (0, 1)


def _switch(rank, world):
    return {"stock": _train(rank, world, False, captured=SWITCH_CAPTURED),
            "tide": _train(rank, world, True, switch=True, captured=SWITCH_CAPTURED)}


def test_switch_does_not_enable_in_a_capture(tmp_path):
    recs = fsdp_harness.run(2, _switch, tmp_path)
    for rec in recs:
        assert rec["ok"], rec.get("traceback")
        stock, tide = rec["result"]["stock"], rec["result"]["tide"]
        # The first root forwards run in the (simulated) capture: the root stays on stock,
        # said once; the first forward outside it enables, and TIDE serves from there on.
        n = len(SWITCH_CAPTURED)
        assert tide["served"] == [False] * n + [True] * (STEPS - n), tide["served"]
        assert sum("runs in a CUDA graph capture" in line for line in tide["lines"]) == 1, \
            tide["lines"]
        for name, tier, calls in tide["calls"]:
            assert calls.get("reduce_scatter", 0) == STEPS - n, (name, calls)
        _same_params(tide, stock)
