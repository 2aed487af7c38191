"""Training features FSDP2 users combine with TIDE, at world 2 (fp32, bit for bit against
stock FSDP2, TIDE serving every group): frozen parameters (requires_grad=False in a group: they
contribute zeros to TIDE-RS and keep no gradient, as in stock), gradient clipping
(clip_grad_norm_ over the sharded DTensor gradients), and both together with bf16 mixed
precision.  reshard_after_forward as an int, set_requires_gradient_sync and explicit
prefetching are test_fsdp_ring.py's and test_fsdp_parity.py's; CPU offload stays on stock
(test_fsdp_misuse.py checks the fallback and its reason).
"""

import pytest

torch = pytest.importorskip("torch")

import fsdp_harness  # noqa: E402
import fsdp_train  # noqa: E402

STEPS = 4


def _train(rank, world, frozen=False, clip=False, mp=None, tide_mode=None):
    import fsdp_model
    import tide.fsdp

    torch.manual_seed(0)
    model = fsdp_model.TinyLlama()
    if frozen:
        model.embed.requires_grad_(False)
        model.layers[0].wq.weight.requires_grad_(False)
        model.layers[1].mlp_norm.weight.requires_grad_(False)
    fsdp_model.shard(model, mp=fsdp_train.mp_dtypes(mp))
    rec = tide.fsdp.enable(model, mode=tide_mode) if tide_mode else None
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2,
                            weight_decay=0.1, foreach=False)
    norms = []

    def clip_grads():
        if clip:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))

    with fsdp_train._CountStockCopies() as counter:
        losses, params = fsdp_train.train_loop(model, opt, rank, STEPS, before_step=clip_grads)
    out = {"losses": losses, "params": params, "norms": norms,
           "stock_copies": counter.counts,
           "frozen_grads": [p.grad is not None for p in model.parameters()
                            if not p.requires_grad]}
    if rec is not None:
        out.update(fsdp_train.served(rec))
        tide.fsdp.disable(model)
    return out


CONFIGS = [dict(frozen=True), dict(clip=True), dict(frozen=True, clip=True, mp=("bf16", "fp32"))]


def _body(rank, world):
    out = []
    for cfg in CONFIGS:
        for mode in ("in_place", "slot_reuse"):
            out.append((dict(cfg, tide_mode=mode), _train(rank, world, **cfg),
                        _train(rank, world, tide_mode=mode, **cfg)))
    return out


def test_frozen_parameters_and_clipping_world2(tmp_path):
    records = fsdp_harness.run(2, _body, tmp_path, timeout=540)
    for rank, rec in enumerate(records):
        assert rec["ok"], rec.get("traceback")
        for cfg, stock, tide in rec["result"]:
            where = "rank %d, %s" % (rank, cfg)
            assert tide["fallbacks"] == [] and [t for _, t in tide["groups"]] == [1] * 3, where
            for name, calls in tide["calls"].items():
                assert calls["reduce_scatter"] == STEPS, (where, name, calls)
                assert calls.get("stock_reduce", 0) == 0, (where, name, calls)
            assert tide["stock_copies"]["reduce_scatter_tensor"] == 0, where
            if cfg.get("frozen"):
                assert tide["frozen_grads"] == stock["frozen_grads"] == [False] * 3, where
            if cfg.get("clip"):
                assert stock["norms"] == tide["norms"] and max(stock["norms"]) > 0.05, where
            for step, (a, b) in enumerate(zip(stock["params"], tide["params"])):
                assert all(torch.equal(x, y) for x, y in zip(a, b)), (where, step)
            assert stock["losses"] == tide["losses"], where


def _runtime_fallback(rank, world):
    """fp32-accumulated gradients of bf16 groups whose fp32 companion is unavailable (the
    library's refusal, forced here): those reductions run on stock FSDP2, logged once per
    group and listed once in enabled(model).fallbacks; results stay stock's."""
    import logging

    import torch.nn.functional as F

    import fsdp_model
    import tide.fsdp

    lines = []

    class _Count(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    def run(use_tide):
        model = fsdp_model.build(seed=0, mp=(torch.bfloat16, torch.float32))
        rec = tide.fsdp.enable(model) if use_tide else None
        if rec is not None:
            for st in rec.states:
                st.wide_refused = "refused for the test"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
        for step in range(3):
            for micro in range(2):
                model.set_requires_gradient_sync(micro == 1)
                x, y = fsdp_model.batch(step, rank, micro)
                F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        params = [p.to_local().detach().clone() for p in model.parameters()]
        out = {"params": params}
        if rec is not None:
            out["fallbacks"] = list(tide.fsdp.enabled(model).fallbacks)
            out["stock_reduce"] = {st.spec.name: st.calls["stock_reduce"] for st in rec.states}
            tide.fsdp.disable(model)
        return out

    handler = _Count()
    logging.getLogger("tide.fsdp").addHandler(handler)
    try:
        stock, tide_run = run(False), run(True)
    finally:
        logging.getLogger("tide.fsdp").removeHandler(handler)
    tide_run["log_lines"] = [m for m in lines if "reduces with stock FSDP2" in m]
    tide_run["equal"] = all(torch.equal(a, b) for a, b in zip(stock["params"],
                                                             tide_run["params"]))
    return tide_run


def test_runtime_fallback_is_listed_once(tmp_path):
    for rec in fsdp_harness.run(2, _runtime_fallback, tmp_path, timeout=300):
        assert rec["ok"], rec.get("traceback")
        r = rec["result"]
        assert r["equal"]
        assert sorted(r["stock_reduce"]) == ["<root>", "layers.0", "layers.1"]
        assert all(n == 3 for n in r["stock_reduce"].values()), r["stock_reduce"]
        assert sorted(n for n, _ in r["fallbacks"]) == ["<root>", "layers.0", "layers.1"]
        assert all("reductions on stock FSDP2" in why for _, why in r["fallbacks"])
        assert len(r["log_lines"]) == 3, r["log_lines"]
