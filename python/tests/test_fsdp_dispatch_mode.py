"""The TIDE_FSDP switch under a TorchDispatchMode (CommDebugMode): stock FSDP2 until the
first root forward outside the mode.

TIDE's collectives do not pass through the dispatcher, so a dispatch mode that watches or
replaces collectives (CommDebugMode counts c10d ops; PyTorch's own
test_gradient_accumulation asserts those counts) cannot see them, and enable()'s own
agreement collectives would be counted as the user's.  The switch (tide/fsdp/_auto.py)
therefore leaves a root on stock FSDP2, with one log line, while its forward runs under such
a mode, and enables it at the first root forward outside one.  Checked against stock at
world 2: the same c10d op counts inside the mode, TIDE serving every group afterwards, and
the same parameters bit for bit after the steps.
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402

STEPS_IN_MODE = 2
STEPS_AFTER = 2


def _train(rank, world, switch):
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
    if switch:
        _auto.install("in_place")
    try:
        model = fsdp_model.build(seed=0, exact=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        counts, served_in_mode = [], []
        for step in range(STEPS_IN_MODE + STEPS_AFTER):
            x, y = fsdp_model.batch(step, rank)
            in_mode = step < STEPS_IN_MODE
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
        if rec is not None:
            tide.fsdp.disable(model)
        return {"counts": counts, "served_in_mode": served_in_mode, "calls": calls,
                "params": params, "lines": lines}
    finally:
        if switch:
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
