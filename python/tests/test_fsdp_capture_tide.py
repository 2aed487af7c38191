"""tide.fsdp with enable(..., capture="tide"): which calls a CUDA graph capture gets from TIDE.

This machine has no GPU, so the capture is simulated as in test_fsdp_capture_fallback.py:
tide.fsdp._auto._capturing answers True for the captured steps.  Whether a call would be
captured is the library's answer (tide_group_capture_readiness, through
tide.fsdp._graph.readiness), and the CPU fabric answers that it captures nothing
(TIDE_CAPTURE_NO_FABRIC, checked on every answer); the simulated fabric that captures is that
answer without this one bit, everything else as the library says (which programs and fence
variants ran, from its own state).  The "captured" calls run eagerly on the CPU fabric, which
is what lets the parameters be compared with stock's.  What is checked is the adapter's
routing (tide.fsdp._graph) on the library's answers:

- opt-in on, two eager steps first: every call of the captured step runs TIDE (counted as
  captured_*), none on stock; eager steps after the capture run on stock FSDP2 with one
  reason per group (the library refuses them); a second capture runs on stock;
- opt-in on, one eager step only: the cross-group fence variant that FSDP2's first
  reduce-scatter of a backward needs has not run yet (the library says so), so that call
  runs on stock;
- opt-in on, the first step captured (no warm-up): every call on stock, with the reason, and
  the eager steps after it on TIDE (nothing was captured);
- opt-in off (the default): the capture runs on stock as before, the steps after on TIDE;
- Tier 0 the same way as Tier 1;
- HSDP at 2 x 2 and an MoE model with an expert sub-mesh at world 4 (several process groups,
  one set per communicator): the captured step on TIDE.

Every run trains to stock's parameters bit for bit (world 2, gloo, CPU fabric).
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402

STEPS = 5


def _train(rank, world, tide_on, tier=1, capture="tide", captured=(), mode="in_place",
           fabric_ok=True, keys=False, hsdp=False, moe=False):
    import logging

    import torch.nn.functional as F

    import capture_sim
    import fsdp_model
    import tide.fsdp

    lines = []

    class _Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = _Keep()
    logging.getLogger("tide.fsdp").addHandler(handler)
    capturing = {"on": False, "key": 0}
    # keys: each captured step is a capture of its own id, as tide_stream_capture_key tells
    # on the GPU (without: the library cannot say, as with CPU-only torch).
    sim = capture_sim.simulated(capturing, fabric_ok=fabric_ok, keys=keys)
    sim.__enter__()
    try:
        if hsdp:  # a 2 x 2 (replicate, shard) mesh at world 4: TIDE serves the shard dim
            from torch.distributed.device_mesh import init_device_mesh

            torch.manual_seed(0)
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
            model = fsdp_model.shard(fsdp_model.TinyLlama(exact=True), mesh=mesh)
        elif moe:  # experts over a sub-mesh of 2 ranks: two process groups, two communicators
            import fsdp_moe_model

            model = fsdp_moe_model.build(rank, world, exact=True)
        else:
            model = fsdp_model.build(seed=0, exact=True)
        if tide_on:
            tide.fsdp.enable(model, mode=mode, tier=tier, capture=capture)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        per_step = []
        for step in range(STEPS):
            capturing["on"] = step in captured
            capturing["key"] = step + 1 if step in captured else 0
            x, y = fsdp_model.batch(step, rank)
            F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1)).backward()
            capturing["on"] = False
            opt.step()
            opt.zero_grad()
            rec = tide.fsdp.enabled(model)
            per_step.append({st.spec.name: dict(st.calls) for st in rec.states} if rec else {})
        rec = tide.fsdp.enabled(model)
        fallbacks = list(rec.fallbacks) if rec else []
        tiers = [st.tier for st in rec.states] if rec else []
        params = [p.to_local().detach().clone() for p in model.parameters()]
        if rec is not None:
            tide.fsdp.disable(model)
        return {"steps": per_step, "fallbacks": fallbacks, "params": params, "lines": lines,
                "tiers": tiers}
    finally:
        sim.__exit__(None, None, None)
        logging.getLogger("tide.fsdp").removeHandler(handler)


def _delta(run, step, name, key):
    """How much calls[key] of group `name` grew during `step`."""
    now = run["steps"][step][name].get(key, 0)
    before = run["steps"][step - 1][name].get(key, 0) if step > 0 else 0
    return now - before


def _tide_calls(run, step, name):
    return _delta(run, step, name, "all_gather") + _delta(run, step, name, "reduce_scatter")


def _stock_calls(run, step, name):
    return sum(_delta(run, step, name, k) for k in ("stock_all_gather", "stock_reduce",
                                                     "stock_captured", "stock_after_capture"))


def _reasons(run, name, text):
    return [why for fqn, why in run["fallbacks"] if fqn == name and text in why]


def _said_once(run, name, text):
    """Group `name`'s fallbacks say `text` once: once for its all-gathers and once for its
    reductions (Tier 1 lists the two), or once for both (Tier 0)."""
    said = _reasons(run, name, text)
    return 1 <= len(said) <= 2 and len(set(said)) == len(said)


def _runs(rank, world, **kw):
    shape = {k: kw[k] for k in ("hsdp", "moe") if k in kw}
    return {"stock": _train(rank, world, False, **shape),
            "tide": _train(rank, world, True, **kw)}


def _results(tmp_path, world=2, **kw):
    recs = fsdp_harness.run(world, _runs, tmp_path, **kw)
    out = []
    for rec in recs:
        assert rec["ok"], rec.get("traceback")
        stock, tide = rec["result"]["stock"], rec["result"]["tide"]
        assert len(tide["params"]) == len(stock["params"])
        for a, b in zip(tide["params"], stock["params"]):
            assert torch.equal(a, b)
        assert tide["steps"][0], "nothing was served"
        out.append(tide)
    return out


@pytest.mark.parametrize("tier,mode", [(1, "in_place"), (1, "slot_reuse"), (0, "in_place")])
def test_warm_capture_runs_tide_inside(tmp_path, tier, mode):
    # Steps 0, 1 eager (warm-up), step 2 captured, steps 3, 4 eager after the capture.
    for tide in _results(tmp_path, tier=tier, mode=mode, captured=(2,)):
        assert tide["tiers"] and set(tide["tiers"]) == {tier}
        for name in tide["steps"][0]:
            assert _tide_calls(tide, 0, name) >= 2 and _stock_calls(tide, 0, name) == 0
            # The captured step: TIDE inside the capture, nothing on stock.
            assert _delta(tide, 2, name, "captured_all_gather") >= 1, tide["steps"][2][name]
            assert _delta(tide, 2, name, "captured_reduce_scatter") == 1, tide["steps"][2]
            assert _stock_calls(tide, 2, name) == 0, tide["steps"][2][name]
            # After it: stock, said once per group.
            for step in (3, 4):
                assert _tide_calls(tide, step, name) == 0, tide["steps"][step][name]
                assert _stock_calls(tide, step, name) >= 2, tide["steps"][step][name]
            assert _said_once(tide, name, "were captured into a CUDA graph"), tide["fallbacks"]
            assert not _reasons(tide, name, "capture is under way"), tide["fallbacks"]


def test_capture_without_warm_up_stays_on_stock(tmp_path):
    # The first step captured (torchtitan's way): every call on stock, the set stays usable
    # eagerly, so the steps after it run TIDE.
    for tide in _results(tmp_path, captured=(0,)):
        for name in tide["steps"][0]:
            assert _tide_calls(tide, 0, name) == 0, tide["steps"][0][name]
            assert _stock_calls(tide, 0, name) >= 2, tide["steps"][0][name]
            for step in range(1, STEPS):
                assert _delta(tide, step, name, "reduce_scatter") == 1
            assert tide["steps"][-1][name]["captured_all_gather"] == 0
            assert _said_once(tide, name, "the first call of a program"), tide["fallbacks"]
            assert not _reasons(tide, name, "were captured"), tide["fallbacks"]


@pytest.mark.parametrize("mode", ["in_place", "slot_reuse"])
def test_fence_variant_not_run_eagerly_stays_on_stock(tmp_path, mode):
    # One eager step only: the first reduce-scatter of FSDP2's backward (the last block's)
    # had no earlier reduce-scatter to hand over from, so its fence variant never ran; in
    # the captured step 1 it needs it: that reduction runs on stock, every other call TIDE.
    for tide in _results(tmp_path, mode=mode, captured=(1,)):
        fenced = [name for name in tide["steps"][0]
                  if _reasons(tide, name, "runs the cross-group fence (variant 1")]
        assert fenced, tide["fallbacks"]
        for name in tide["steps"][0]:
            assert _delta(tide, 1, name, "stock_all_gather") == 0
            assert _delta(tide, 1, name, "captured_all_gather") >= 1
            cold = name in fenced
            assert _delta(tide, 1, name, "stock_reduce") == int(cold), tide["steps"][1][name]
            assert _delta(tide, 1, name, "captured_reduce_scatter") == int(not cold)


def test_second_capture_runs_on_stock(tmp_path):
    # Eager 0, 1; captured 2; eager 3 (stock); captured 4: one graph per set, so stock.
    for tide in _results(tmp_path, captured=(2, 4)):
        for name in tide["steps"][0]:
            assert _delta(tide, 2, name, "captured_reduce_scatter") == 1
            assert _tide_calls(tide, 4, name) == 0, tide["steps"][4][name]
            assert _stock_calls(tide, 4, name) >= 2, tide["steps"][4][name]
            assert _said_once(tide, name, "an earlier CUDA graph"), tide["fallbacks"]


def test_back_to_back_captures_told_apart_by_id(tmp_path):
    # Captured 2 and 3 with no call of the groups between them (the optimizer step makes
    # none): the capture ids tell the two apart, so step 3 runs on stock (one graph per set).
    for tide in _results(tmp_path, captured=(2, 3), keys=True):
        for name in tide["steps"][0]:
            assert _delta(tide, 2, name, "captured_reduce_scatter") == 1
            assert _tide_calls(tide, 3, name) == 0, tide["steps"][3][name]
            assert _stock_calls(tide, 3, name) >= 2, tide["steps"][3][name]
            assert _said_once(tide, name, "an earlier CUDA graph"), tide["fallbacks"]


def test_hsdp_capture_runs_tide_inside(tmp_path):
    # HSDP at 2 x 2: the shard dimension's calls are captured on TIDE, the replica all-reduce
    # stays FSDP2's (captured by the process group's backend on a GPU), stock's bits.
    for tide in _results(tmp_path, world=4, captured=(2,), hsdp=True):
        for name in tide["steps"][0]:
            assert _delta(tide, 2, name, "captured_all_gather") >= 1, tide["steps"][2][name]
            assert _delta(tide, 2, name, "captured_reduce_scatter") == 1, tide["steps"][2]
            assert _delta(tide, 2, name, "replica_all_reduce") == 1, tide["steps"][2][name]
            assert _stock_calls(tide, 2, name) == 0, tide["steps"][2][name]
            assert _said_once(tide, name, "were captured into a CUDA graph"), tide["fallbacks"]


def test_expert_subgroups_capture_runs_tide_inside(tmp_path):
    # An MoE model at world 4, experts over {0, 1} and {2, 3}: each process group's set is
    # captured on TIDE (the capture routing is per communicator), stock's bits.
    for tide in _results(tmp_path, world=4, captured=(2,), moe=True):
        experts = [name for name in tide["steps"][0] if "experts" in name]
        assert experts and len(experts) < len(tide["steps"][0]), list(tide["steps"][0])
        for name in tide["steps"][0]:
            assert _delta(tide, 2, name, "captured_all_gather") >= 1, tide["steps"][2][name]
            assert _delta(tide, 2, name, "captured_reduce_scatter") == 1, tide["steps"][2]
            assert _stock_calls(tide, 2, name) == 0, tide["steps"][2][name]
            for step in (3, 4):
                assert _tide_calls(tide, step, name) == 0, tide["steps"][step][name]


def test_capture_off_by_default_runs_on_stock(tmp_path):
    # capture="stock" (the default): the captured step on stock, TIDE before and after.
    for tide in _results(tmp_path, capture="stock", captured=(2,)):
        for name in tide["steps"][0]:
            assert _tide_calls(tide, 2, name) == 0 and _stock_calls(tide, 2, name) >= 2
            for step in (0, 1, 3, 4):
                assert _delta(tide, step, name, "reduce_scatter") == 1
            assert tide["steps"][-1][name]["captured_reduce_scatter"] == 0
            assert _reasons(tide, name, "capture=\"tide\""), tide["fallbacks"]


def test_fabric_that_cannot_capture_runs_on_stock(tmp_path):
    # The CPU fabric as it is (not patched): the capture runs on stock, TIDE after it.
    for tide in _results(tmp_path, captured=(2,), fabric_ok=False):
        for name in tide["steps"][0]:
            assert _tide_calls(tide, 2, name) == 0 and _stock_calls(tide, 2, name) >= 2
            assert _delta(tide, 3, name, "reduce_scatter") == 1
            assert _reasons(tide, name, "the cpu fabric captures no call"), tide["fallbacks"]


def test_capture_mode_argument_and_environment(monkeypatch):
    from tide.fsdp import _graph

    monkeypatch.delenv("TIDE_FSDP_CAPTURE", raising=False)
    assert _graph.capture_mode(None) == "stock"
    assert _graph.capture_mode("tide") == "tide"
    monkeypatch.setenv("TIDE_FSDP_CAPTURE", "tide")
    assert _graph.capture_mode(None) == "tide"
    assert _graph.capture_mode("stock") == "stock"
    monkeypatch.setenv("TIDE_FSDP_CAPTURE", "1")
    assert _graph.capture_mode(None) == "tide"
    monkeypatch.setenv("TIDE_FSDP_CAPTURE", "sometimes")
    with pytest.raises(ValueError, match="TIDE_FSDP_CAPTURE"):
        _graph.capture_mode(None)
    with pytest.raises(ValueError):
        _graph.capture_mode("always")
