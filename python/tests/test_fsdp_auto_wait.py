"""When the TIDE_FSDP switch enables a root, and TIDE under a TorchDispatchMode.

The switch (tide/fsdp/_auto.py) enables a root at its first forward where it can: not under
a TorchDispatchMode, not while a group is unsharded (unshard() before the first forward).
Until then the root runs stock FSDP2, with one log line.

TIDE's collectives do not pass through the dispatcher, so a dispatch mode that watches or
replaces collectives (CommDebugMode counts c10d ops; PyTorch's own
test_gradient_accumulation asserts those counts) cannot see them, and enable()'s own
agreement collectives would be counted as the user's.  The switch (tide/fsdp/_auto.py)
therefore leaves a root on stock FSDP2, with one log line, while its forward runs under such
a mode, and enables it at the first root forward outside one.  Checked against stock at
world 2: the same c10d op counts inside the mode, TIDE serving every group afterwards, and
the same parameters bit for bit after the steps.

A mode entered after enable() (the second test) finds Tier 1 groups registered: their
all-gathers and reduce-scatters under the mode run on stock FSDP2 memory, call by call
(tide/fsdp/_tier1.py, _gather_on_stock), so the mode counts stock's collectives and
CommDebugMode's module tracker, which keeps param.data of every module it enters, holds no
alias of a landing (before, the next reshard raised "a tensor still aliases the unsharded
parameter" in the user's step).
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402

STEPS_IN_MODE = 2
STEPS_AFTER = 2


def _train(rank, world, switch, mode_steps=range(STEPS_IN_MODE), enable_first=False):
    import logging

    import torch.nn.functional as F
    from torch.distributed.tensor.debug import CommDebugMode

    import fsdp_model
    import tide.fsdp
    from tide.fsdp import _auto

    lines = []

    class _Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logging.getLogger("tide.fsdp").addHandler(_Keep())
    if switch and not enable_first:
        _auto.install("in_place")
    try:
        model = fsdp_model.build(seed=0, exact=True)
        if switch and enable_first:
            tide.fsdp.enable(model, mode="in_place")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        counts, served_in_mode = [], []
        for step in range(STEPS_IN_MODE + STEPS_AFTER):
            x, y = fsdp_model.batch(step, rank)
            in_mode = step in mode_steps
            mode = CommDebugMode() if in_mode else None
            if mode is not None:
                mode.__enter__()
            try:
                F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1)).backward()
            finally:
                if mode is not None:
                    mode.__exit__(None, None, None)
            if in_mode:
                counts.append({str(k): v for k, v in mode.get_comm_counts().items()})
                served_in_mode.append(tide.fsdp.enabled(model) is not None)
            opt.step()
            opt.zero_grad()
        rec = tide.fsdp.enabled(model)
        calls = [(st.spec.name, dict(st.calls)) for st in rec.states] if rec else []
        params = [p.to_local().detach().clone() for p in model.parameters()]
        if rec is not None and not enable_first:
            tide.fsdp.disable(model)
        # else: left enabled (the process ends next).  CommDebugMode's module tracker
        # outlives the mode in torch 2.11 (global hooks keep it) and holds param.data of the
        # sharded parameters it saw, which after enable() are TIDE's resident shards:
        # disable() would rightly refuse to unmap the arena under that alias.
        return {"counts": counts, "served_in_mode": served_in_mode, "calls": calls,
                "params": params, "lines": lines}
    finally:
        if switch and not enable_first:
            _auto.uninstall()


def _body(rank, world):
    return {"stock": _train(rank, world, False), "tide": _train(rank, world, True)}


def test_switch_waits_for_a_forward_outside_a_dispatch_mode(tmp_path):
    recs = fsdp_harness.run(2, _body, tmp_path)
    for rank, rec in enumerate(recs):
        assert rec["ok"], rec.get("traceback")
        stock, tide = rec["result"]["stock"], rec["result"]["tide"]
        # Inside the mode: stock FSDP2 only, the same collectives counted as stock's (none
        # of enable()'s agreement traffic, no TIDE collective hidden from the mode).
        assert tide["served_in_mode"] == [False] * STEPS_IN_MODE
        assert tide["counts"] == stock["counts"]
        assert any("c10d._allgather_base_" in k for k in stock["counts"][0]), stock["counts"]
        assert sum("runs under TorchDispatchMode CommDebugMode" in line
                   for line in tide["lines"]) == 1, tide["lines"]
        # Outside it: enabled, every group served by TIDE in every later step.
        assert tide["calls"], "TIDE was never enabled after the mode ended"
        for name, calls in tide["calls"]:
            assert calls.get("all_gather", 0) >= STEPS_AFTER, (name, calls)
            assert calls.get("reduce_scatter", 0) == STEPS_AFTER, (name, calls)
            assert calls.get("stock_reduce", 0) == 0, (name, calls)
        # World 2: stock's parameters bit for bit.
        assert len(tide["params"]) == len(stock["params"])
        for a, b in zip(tide["params"], stock["params"]):
            assert torch.equal(a, b)


def _body_after(rank, world):
    steps = (1, 2)
    return {"stock": _train(rank, world, False, steps),
            "tide": _train(rank, world, True, steps, enable_first=True)}


def test_calls_under_a_dispatch_mode_after_enable_run_on_stock(tmp_path):
    recs = fsdp_harness.run(2, _body_after, tmp_path)
    for rank, rec in enumerate(recs):
        assert rec["ok"], rec.get("traceback")
        stock, tide = rec["result"]["stock"], rec["result"]["tide"]
        assert tide["counts"] == stock["counts"]
        assert any("c10d._reduce_scatter_base_" in k for k in tide["counts"][0]), tide["counts"]
        steps = STEPS_IN_MODE + STEPS_AFTER
        for name, calls in tide["calls"]:
            # Steps 0 and 3 on TIDE, steps 1 and 2 on stock (the forward's gather and the
            # backward's re-gather, where the group reshards after forward).
            assert calls.get("reduce_scatter", 0) == steps - 2, (name, calls)
            assert calls.get("stock_reduce", 0) == 2, (name, calls)
            assert calls.get("stock_all_gather", 0) >= 2, (name, calls)
        assert any("gathers with stock FSDP2 for this call: a TorchDispatchMode is active "
                   "(CommDebugMode)" in line for line in tide["lines"]), tide["lines"]
        for a, b in zip(tide["params"], stock["params"]):
            assert torch.equal(a, b)


def _explicit_unshard(rank, world, switch, accumulate=False):
    """unshard() of every FSDP module before the first forward (the 1F1B pattern of
    PyTorch's test_1f1b_microbatching): the first forward finds its groups unsharded.
    accumulate: steps of three micro-batches, gradients reduced at the last one only
    (set_requires_gradient_sync), resharded after every backward: the groups are resharded
    at the second micro-batch's forward but hold the first one's unreduced gradients."""
    import logging

    import torch.nn.functional as F
    from torch.distributed.fsdp import FSDPModule

    import fsdp_model
    import tide.fsdp
    from tide.fsdp import _auto

    lines = []

    class _Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logging.getLogger("tide.fsdp").addHandler(_Keep())
    if switch:
        _auto.install("in_place")
    try:
        model = fsdp_model.build(seed=0, exact=True, reshard_after_forward=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.unshard(async_op=True)
        enabled_after = []
        micro = 3 if accumulate else 1
        for step in range(3):
            for mb in range(micro):
                if accumulate:
                    model.set_requires_gradient_sync(mb == micro - 1)
                x, y = fsdp_model.batch(step, rank, micro=mb)
                F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1)).backward()
                enabled_after.append(tide.fsdp.enabled(model) is not None)
            opt.step()
            opt.zero_grad()
        rec = tide.fsdp.enabled(model)
        calls = [(st.spec.name, dict(st.calls)) for st in rec.states] if rec else []
        params = [p.to_local().detach().clone() for p in model.parameters()]
        if rec is not None:
            tide.fsdp.disable(model)
        return {"enabled": enabled_after, "calls": calls, "params": params, "lines": lines}
    finally:
        if switch:
            _auto.uninstall()


def _body_unshard(rank, world, accumulate=False):
    return {"stock": _explicit_unshard(rank, world, False, accumulate),
            "tide": _explicit_unshard(rank, world, True, accumulate)}


def test_switch_waits_for_resharded_groups(tmp_path):
    recs = fsdp_harness.run(2, _body_unshard, tmp_path)
    for rank, rec in enumerate(recs):
        assert rec["ok"], rec.get("traceback")
        stock, tide = rec["result"]["stock"], rec["result"]["tide"]
        # Step 0 on stock (its groups were unsharded by the user), then TIDE from step 1:
        # the backward resharded every group.
        assert tide["enabled"] == [False, True, True]
        assert sum("is unsharded (unshard() before this forward)" in line
                   for line in tide["lines"]) == 1, tide["lines"]
        assert tide["calls"]
        for name, calls in tide["calls"]:
            assert calls.get("reduce_scatter", 0) == 2, (name, calls)
            assert calls.get("stock_reduce", 0) == 0, (name, calls)
        for a, b in zip(tide["params"], stock["params"]):
            assert torch.equal(a, b)


def test_switch_waits_for_reduced_gradients(tmp_path):
    """PyTorch's test_1f1b_microbatching with the switch: enabling at the second
    micro-batch dropped the first one's unreduced gradients (held by the unsharded
    parameters that enable() rebuilds on the landing), and the step's gradients differed
    from stock's.  The switch now waits for a forward without pending gradients."""
    recs = fsdp_harness.run(2, _body_unshard, tmp_path, accumulate=True)
    for rank, rec in enumerate(recs):
        assert rec["ok"], rec.get("traceback")
        stock, tide = rec["result"]["stock"], rec["result"]["tide"]
        for a, b in zip(tide["params"], stock["params"]):
            assert torch.equal(a, b)
        # Step 0 on stock (unsharded, then unreduced gradients), TIDE from step 1 on.
        assert tide["enabled"] == [False] * 3 + [True] * 6, tide["enabled"]
        assert any("unreduced gradients" in line for line in tide["lines"]), tide["lines"]
        for name, calls in tide["calls"]:
            assert calls.get("reduce_scatter", 0) == 2, (name, calls)


def _enable_mid_accumulation(rank, world):
    import torch.nn.functional as F

    import fsdp_model
    import tide.fsdp

    model = fsdp_model.build(seed=0, exact=True)
    model.set_requires_gradient_sync(False)
    x, y = fsdp_model.batch(0, rank)
    F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1)).backward()
    try:
        tide.fsdp.enable(model, mode="in_place")
    except RuntimeError as exc:
        return str(exc)
    return None


def test_enable_refuses_groups_with_unreduced_gradients(tmp_path):
    """enable() between micro-batches of an accumulation would drop their gradients (they
    live on the unsharded parameters it rebuilds): a clear error instead, on every rank."""
    recs = fsdp_harness.run(2, _enable_mid_accumulation, tmp_path)
    for rec in recs:
        assert rec["ok"], rec.get("traceback")
        assert rec["result"] is not None and "holds unreduced gradients" in rec["result"], rec
