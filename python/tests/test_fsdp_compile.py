"""torch.compile with tide.fsdp at world 2 on the CPU (inductor, gcc): compiled blocks in both
orders (compile each block, then fully_shard, as torchtitan does; fully_shard, then compile
each block) and a whole compiled model, TIDE against stock FSDP2, bit for bit (fp32 at world
2: the sums have two terms).  FSDP2's hooks run outside the compiled graphs (dynamo skips
them: torch._dynamo.config.skip_fsdp_hooks), so Tier 1 serves every group and the test
checks it did.  Traceable FSDP2 (FSDP2's hooks traced, with compiled autograd) is where TIDE
cannot run: set before enable(), every group stays on stock with one log line (_compile.py).
Compiled autograd with dynamo's default (FSDP2's hooks not traced) is served by Tier 1.
Setting skip_fsdp_hooks=False after enable() is refused by Tier 1 with an error naming the
remedy (disable(), or tier=0); stock FSDP2 itself stops in that configuration here
(queue_callback needs compiled autograd with fullgraph=True), so there is no stock step to
fall back to.
"""

import math

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402
import fsdp_train  # noqa: E402

STEPS = 3


def _train(rank, world, how, tide_mode=None):
    from torch.distributed.fsdp import fully_shard

    import fsdp_model
    import tide.fsdp

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = fsdp_model.TinyLlama()
    if how == "compile_then_shard":
        for layer in model.layers:
            layer.compile()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    if how == "shard_then_compile":
        for layer in model.layers:
            layer.compile()
    elif how == "whole":
        model.compile()
    rec = tide.fsdp.enable(model, mode=tide_mode) if tide_mode else None
    out = fsdp_train.run_steps(model, rank, STEPS, rec)
    if rec is not None:
        tide.fsdp.disable(model)
    return out


def _body(rank, world, hows):
    torch.set_num_threads(1)
    return [(how, _train(rank, world, how), _train(rank, world, how, tide_mode="in_place"))
            for how in hows]


@pytest.mark.parametrize("hows", [["compile_then_shard", "shard_then_compile"], ["whole"]])
def test_compiled_blocks_world2(tmp_path, hows):
    records = fsdp_harness.run(2, _body, tmp_path, timeout=600, hows=hows)
    for rank, rec in enumerate(records):
        assert rec["ok"], rec.get("traceback")
        for how, stock, tide in rec["result"]:
            where = "rank %d, %s" % (rank, how)
            _assert_served_equal(stock, tide, where)
            assert tide["stock_copies"]["reduce_scatter_tensor"] == 0, where
            assert stock["stock_copies"]["reduce_scatter_tensor"] > 0, where


def _assert_served_equal(stock, tide, where):
    """Tier 1 served every group (no fallback, no stock collective) and the parameters and
    losses equal stock's bit for bit after every step."""
    assert tide["fallbacks"] == [], where
    assert [t for _, t in tide["groups"]] == [1] * 3, where
    for name, calls in tide["calls"].items():
        assert calls["reduce_scatter"] == STEPS, (where, name, calls)
        assert calls.get("stock_reduce", 0) == 0, (where, name, calls)
        assert calls.get("stock_all_gather", 0) == 0, (where, name, calls)
    for step, (a, b) in enumerate(zip(stock["params"], tide["params"])):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), (where, step)
    assert stock["losses"] == tide["losses"], where


def _ca_served_body(rank, world):
    torch.set_num_threads(1)
    runs = {}
    for name, mode in (("stock", None), ("stock_again", None), ("tide", "in_place")):
        with torch._dynamo.compiled_autograd._enable(torch.compile):
            runs[name] = _train(rank, world, "whole", tide_mode=mode)
    return {"stock": runs["stock"], "tide": runs["tide"],
            "stock_reproducible": _same_run(runs["stock"], runs["stock_again"])}


def test_compiled_autograd_served_world2(tmp_path):
    """Compiled autograd where FSDP2 runs it with its hooks outside the graphs (dynamo's
    default skip_fsdp_hooks=True), on a whole compiled model: Tier 1 serves every group, and
    the step equals stock's bit for bit."""
    records = fsdp_harness.run(2, _ca_served_body, tmp_path, timeout=600)
    for rank, rec in enumerate(records):
        assert rec["ok"], rec.get("traceback")
        stock, tide = rec["result"]["stock"], rec["result"]["tide"]
        assert rec["result"]["stock_reproducible"], rank  # else there is no reference
        _assert_served_equal(stock, tide, "rank %d" % rank)


def _compiled_autograd(rank, world, tide_mode=None):
    """A whole compiled model with compiled autograd on (FSDP2's hooks traced)."""
    import torch._dynamo.config as dcfg

    dcfg.skip_fsdp_hooks = False
    try:
        with torch._dynamo.compiled_autograd._enable(torch.compile):
            return _train(rank, world, "whole", tide_mode=tide_mode)
    finally:
        dcfg.skip_fsdp_hooks = True


def _ca_body(rank, world):
    torch.set_num_threads(1)
    try:
        # Stock runs twice: a reference exists only where stock reproduces itself.
        stock = _compiled_autograd(rank, world)
        stock_again = _compiled_autograd(rank, world)
    except Exception as exc:  # stock itself cannot run it here
        return {"stock_error": "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0])}
    import logging

    lines = []

    class _Count(logging.Handler):
        def emit(self, record):
            if "stays on stock" in record.getMessage():
                lines.append(record.getMessage())

    handler = _Count()
    logging.getLogger("tide.fsdp").addHandler(handler)
    try:
        tide = _compiled_autograd(rank, world, "in_place")
    finally:
        logging.getLogger("tide.fsdp").removeHandler(handler)
    return {"stock": stock, "tide": tide, "log_lines": len(lines),
            "stock_reproducible": _same_run(stock, stock_again)}


def _same_run(a, b):
    """Bit-equal parameters and losses, all finite (NaN never equals itself)."""
    return (all(math.isfinite(x) for x in a["losses"]) and a["losses"] == b["losses"]
            and all(torch.equal(x, y) for pa, pb in zip(a["params"], b["params"])
                    for x, y in zip(pa, pb)))


def test_traceable_fsdp2_falls_back_to_stock(tmp_path):
    """Compiled autograd with FSDP2's hooks traced (skip_fsdp_hooks=False, set before
    enable): every group stays on stock FSDP2 with one log line and its reason in
    enabled(model).fallbacks; the step raises nothing and equals stock's."""
    records = fsdp_harness.run(2, _ca_body, tmp_path, timeout=600)
    for rec in records:
        assert rec["ok"], rec.get("traceback")
        if "stock_error" in rec["result"]:
            pytest.skip("stock FSDP2 with compiled autograd does not run here: "
                        + rec["result"]["stock_error"])
    for rank, rec in enumerate(records):
        stock, tide = rec["result"]["stock"], rec["result"]["tide"]
        assert tide["groups"] == [], rank
        assert sorted(n for n, _ in tide["fallbacks"]) == ["<root>", "layers.0", "layers.1"]
        assert all("Traceable FSDP2" in why for _, why in tide["fallbacks"])
        assert rec["result"]["log_lines"] == 1, rec["result"]["log_lines"]
        # Stock Traceable FSDP2 itself does not train reliably on the CPU with torch 2.11
        # (observed: non-finite losses from the first step on one machine; finite losses that
        # differ between two stock runs in one process on another), so a reference exists only
        # where two stock runs agree bit for bit; there the fallback must equal them.
        if rec["result"]["stock_reproducible"]:
            for a, b in zip(stock["params"], tide["params"]):
                assert all(torch.equal(x, y) for x, y in zip(a, b)), rank
            assert stock["losses"] == tide["losses"], rank
