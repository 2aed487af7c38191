"""tide.fsdp with capture="tide" and Tier 1's fp32 companion: the reduce-scatter of gradients
accumulated in fp32 without synchronisation (mixed precision, reduce_dtype=float32), inside a
CUDA graph capture.

The companion is a second registration of a group's shapes for fp32 gradients, made at the
first such reduction (docs/fsdp.md, "Gradient accumulation without synchronisation").  Inside
a capture it may only be used when it is already registered and its reduce-scatter ran
eagerly; it must never be registered there (registration is collective and allocates).  The
capture is simulated (capture_sim.py: no GPU here, the "captured" calls run eagerly on the CPU
fabric, routed on the library's own readiness answers), so what is checked is the adapter's routing:

- warm: eager steps accumulate without sync first (the companion runs), then a step of two
  micro-batches (the first without sync) is captured: its fp32 reductions run on TIDE
  through the companion, counted as captured, none on stock;
- cold: the eager steps synchronise every micro-batch (the companion never runs), then the
  captured step accumulates: its fp32 reductions run on stock FSDP2, with the reason, no
  companion is registered inside the capture, and no exception reaches the step.

Both train to stock's parameters bit for bit (world 2, gloo, CPU fabric).
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402

STEPS = 4
ACCUM = 2
CAPTURED = 2  # the step captured


def _train(rank, world, tide_on, warm):
    import torch.nn.functional as F

    import capture_sim
    import fsdp_model
    import tide.fsdp

    capturing = {"on": False, "key": 0}
    with capture_sim.simulated(capturing):
        model = fsdp_model.build(seed=0, mp=(torch.bfloat16, torch.float32))
        if tide_on:
            tide.fsdp.enable(model, mode="in_place", capture="tide")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
        per_step, wide_after = [], []
        for step in range(STEPS):
            # warm: every step accumulates; cold: only the captured step does (the eager ones
            # synchronise every micro-batch, so the bf16 registration reduces them).
            accumulate = warm or step == CAPTURED
            capturing["on"] = step == CAPTURED
            capturing["key"] = 1 if step == CAPTURED else 0
            for micro in range(ACCUM):
                model.set_requires_gradient_sync(not accumulate or micro == ACCUM - 1)
                x, y = fsdp_model.batch(step, rank, micro)
                loss = F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1)) / ACCUM
                loss.backward()
            capturing["on"] = False
            opt.step()
            opt.zero_grad(set_to_none=True)
            rec = tide.fsdp.enabled(model)
            per_step.append({st.spec.name: dict(st.calls) for st in rec.states} if rec else {})
            wide_after.append({st.spec.name: st.wide is not None for st in rec.states}
                              if rec else {})
        rec = tide.fsdp.enabled(model)
        out = {"steps": per_step, "wide": wide_after,
               "fallbacks": list(rec.fallbacks) if rec else [],
               "params": [p.to_local().detach().clone() for p in model.parameters()]}
        if rec is not None:
            tide.fsdp.disable(model)
        return out


def _runs(rank, world, warm):
    return {"stock": _train(rank, world, False, warm), "tide": _train(rank, world, True, warm)}


def _delta(run, step, name, key):
    now = run["steps"][step][name].get(key, 0)
    return now - (run["steps"][step - 1][name].get(key, 0) if step > 0 else 0)


def _results(tmp_path, warm):
    out = []
    for rec in fsdp_harness.run(2, _runs, tmp_path, timeout=300, warm=warm):
        assert rec["ok"], rec.get("traceback")
        stock, tide = rec["result"]["stock"], rec["result"]["tide"]
        assert len(tide["params"]) == len(stock["params"])
        for a, b in zip(tide["params"], stock["params"]):
            assert a.dtype == torch.float32
            assert torch.equal(a, b)
        assert tide["steps"][0], "nothing was served"
        out.append(tide)
    return out


def test_warm_companion_reduces_on_tide_inside_capture(tmp_path):
    for run in _results(tmp_path, warm=True):
        for name in run["steps"][CAPTURED]:
            # Eager steps before: the companion registered and ran.
            assert run["wide"][0][name], name
            assert _delta(run, 0, name, "wide_reduce_scatter") == 1, name
            # The captured step: its one synchronised reduction (fp32 accumulated
            # gradients) through the companion, on TIDE, counted as captured.
            assert _delta(run, CAPTURED, name, "wide_reduce_scatter") == 1, name
            assert _delta(run, CAPTURED, name, "captured_reduce_scatter") == 1, name
            assert _delta(run, CAPTURED, name, "stock_reduce") == 0, name
            assert _delta(run, CAPTURED, name, "stock_captured") == 0, name


def test_cold_companion_stays_on_stock_inside_capture(tmp_path):
    for run in _results(tmp_path, warm=False):
        names = list(run["steps"][CAPTURED])
        for name in names:
            assert not run["wide"][CAPTURED - 1][name], name  # eager steps never needed it
            # The captured step's fp32 reduction: on stock, and no companion registered
            # inside the capture.
            assert _delta(run, CAPTURED, name, "wide_reduce_scatter") == 0, name
            assert _delta(run, CAPTURED, name, "captured_reduce_scatter") == 0, name
            assert _delta(run, CAPTURED, name, "stock_reduce") == 1, name
            assert not run["wide"][CAPTURED][name], name
        said = [why for _, why in run["fallbacks"] if "capture" in why]
        assert said, run["fallbacks"]
