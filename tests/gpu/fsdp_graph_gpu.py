#!/usr/bin/env python3
"""fsdp_graph_gpu.py - a whole FSDP2 step captured into a CUDA graph with TIDE inside it
(tide.fsdp.enable(..., capture="tide")), replayed, against eager runs; world 2 as two
processes on the one GPU, TIDE's one-process-per-rank CUDA fabric, a gloo process group for
FSDP2's bookkeeping and for the stock reference (fsdp_parity_gpu.py's header says why).

Case "warm" (two models: MixedPrecisionPolicy(bf16, fp32) over fp32 masters, and a bf16
model): 2 eager steps with TIDE, then one whole step -- forward, backward, SGD step --
captured with torch.cuda.graph (its own side stream) on static inputs, then K = 10 replays,
each after the next batch is copied into the static inputs.  Checked on every rank:
- every group is Tier 1 and TIDE served the capture: each group's captured_all_gather >= 1 and
  captured_reduce_scatter == 1, no stock call, no fallback (enabled(model)); the adapter
  routed every call on the library's answer (tide_group_capture_readiness), and asked
  directly inside the capture after the step, the library says every group's all-gather
  would be captured (no TIDE_CAPTURE_NO_FABRIC / _OTHER_GRAPH / _UNUSABLE / _PROGRAM_COLD);
- the local parameter shards after each replay equal, bit for bit, those of the same steps run
  eagerly with TIDE, and those of stock FSDP2 run eagerly (gloo; the world-2 parity of
  fsdp_parity_gpu.py: gloo collectives cannot be captured, so stock is compared eagerly);
- one more eager step after the replays runs on stock FSDP2 (the set is replay-only), with
  its reason in enabled(model).fallbacks, no exception, and stock's parameters.

Case "wide": the "warm" case's checks on the mixed-precision model with two micro-batches
per step, the first without gradient sync: FSDP2 accumulates the gradients in fp32, so the
step's one reduction goes through Tier 1's fp32 companion (a second registration), which the
warm-up steps registered and ran eagerly; inside the capture it must run on TIDE
(wide_reduce_scatter counted).

Case "cold": the first step captured without warm-up (torchtitan's way).  Every call of the
served groups must run on stock FSDP2 inside the capture, with the library's reason ("the
first call of a program"), and no exception.
FSDP2's lazy initialisation runs before the capture.  Stock's gloo collectives cannot be
captured, so during that capture only they are replaced by local stand-ins (all-gather:
this rank's shard copied into every rank's place; reduce-scatter: this rank's chunk) that
count their calls; the graph is never replayed.  Then the graph is dropped and 2 eager steps
with TIDE must run on TIDE (nothing of the set was captured, so the library accepts eager
calls) and match stock's first 2 steps bit for bit.

Case "twice": after the warm-up, two captures back to back with no call of the groups
between them.  The first holds TIDE's calls; the second must be told apart by its capture id
(tide_stream_capture_key) and run every call on stock FSDP2 with the reason "an earlier CUDA
graph" (the library allows one graph per set), stock's gloo collectives replaced by the
stand-ins during it; no exception.  Neither graph is replayed.

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        python3 tests/gpu/fsdp_graph_gpu.py --lib LIBTIDE_CUDA.so [--replays 10] [--json F]

Exit status 0 when every check passed on both ranks.
"""
import argparse
import os
import sys
import tempfile
import time

import fsdp_gpu

WARMUP = 2
VOCAB = 37


def _model(kind, world):
    """The tiny Llama of the CPU tests on a 1-D CUDA mesh: "mp" (fp32 masters,
    MixedPrecisionPolicy(bf16, fp32)) or "bf16" (bf16 parameters, no policy)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    import fsdp_model

    torch.manual_seed(0)
    model = fsdp_model.TinyLlama(exact=True)
    mp = None
    if kind == "bf16":
        model = model.to(torch.bfloat16)
    else:
        mp = (torch.bfloat16, torch.float32)
    return fsdp_model.shard(model, mp, init_device_mesh("cuda", (world,)))


def _step(model, opt, batches):
    """One optimizer step over `batches` [(x, y)]: with more than one, gradient accumulation
    without sync until the last micro-batch (under MixedPrecisionPolicy(bf16, fp32) FSDP2
    accumulates in fp32, and Tier 1 reduces through its fp32 companion)."""
    import torch.nn.functional as F

    for micro, (x, y) in enumerate(batches):
        if len(batches) > 1:
            model.set_requires_gradient_sync(micro == len(batches) - 1)
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)) / len(batches)
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _batch(step, rank, accum=1):
    import fsdp_model

    out = []
    for micro in range(accum):
        x, y = fsdp_model.batch(step, rank, micro)
        out.append((x.cuda(), y.cuda()))
    return out


def _accum(kind):
    """Micro-batches per step of a case: "wide" accumulates two on the "mp" model."""
    return 2 if kind == "wide" else 1


def _shards(model):
    import torch

    out = [p.to_local().detach().clone() for p in model.parameters()]
    torch.cuda.synchronize()
    return [t.cpu() for t in out]


def _eager(kind, rank, world, steps, tide_on):
    """Parameters after each of `steps` eager steps (stock, or TIDE with capture="tide")."""
    import torch

    import tide.fsdp

    model = _model(kind, world)
    if tide_on:
        tide.fsdp.enable(model, mode="in_place", capture="tide")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = []
    for step in range(steps):
        _step(model, opt, _batch(step, rank, _accum(kind)))
        params.append(_shards(model))
    rec = tide.fsdp.enabled(model)
    calls = {st.spec.name: dict(st.calls) for st in rec.states} if rec else {}
    if rec is not None:
        tide.fsdp.disable(model)
    return params, calls


def _captured(kind, rank, world, replays):
    """TIDE: WARMUP eager steps, one captured step, `replays` replays, one eager step."""
    import torch
    import torch.distributed as dist

    import tide.fsdp

    model = _model(kind, world)
    rec = tide.fsdp.enable(model, mode="in_place", capture="tide")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = []
    accum = _accum(kind)
    for step in range(WARMUP):
        _step(model, opt, _batch(step, rank, accum))
        params.append(_shards(model))
    before = {st.spec.name: dict(st.calls) for st in rec.states}
    static = _batch(WARMUP, rank, accum)
    graph = torch.cuda.CUDAGraph()
    t0 = time.monotonic()
    with torch.cuda.graph(graph):
        _step(model, opt, static)
        # The library's verdict inside the real capture (tide_group_capture_readiness on
        # the capturing stream), after the step's calls: the fabric captures, the capture
        # holds its streams, every group is usable and warm.  (A fence variant a next
        # all-gather would run may be cold: not asked here.)
        in_capture = {st.spec.name: st.group.capture_readiness("all_gather")
                      for st in rec.states}
    capture_s = time.monotonic() - t0
    at_capture = {st.spec.name: dict(st.calls) for st in rec.states}
    fallbacks_at_capture = list(rec.fallbacks)
    t0 = time.monotonic()
    for k in range(replays):
        for (sx, sy), (x, y) in zip(static, _batch(WARMUP + k, rank, accum)):
            sx.copy_(x)
            sy.copy_(y)
        graph.replay()
        params.append(_shards(model))
        # The peers' next replay may overwrite this rank's landing once every rank ended
        # this one; nothing here reads the landing, but keep the replays in lock step.
        dist.barrier()
    replay_s = time.monotonic() - t0
    # An eager step after the capture: stock FSDP2, said in fallbacks, no exception.
    after_error = None
    try:
        _step(model, opt, _batch(WARMUP + replays, rank, accum))
        params.append(_shards(model))
    except Exception as exc:  # reported, fails the check
        after_error = "%s: %s" % (type(exc).__name__, exc)
    end = {st.spec.name: dict(st.calls) for st in rec.states}
    fallbacks = list(rec.fallbacks)
    tiers = [st.tier for st in rec.states]
    torch.cuda.synchronize()
    graph.reset()  # the replays ended; the groups may be deregistered now
    del graph
    tide.fsdp.disable(model)
    return {"params": params, "before": before, "at_capture": at_capture, "end": end,
            "fallbacks_at_capture": fallbacks_at_capture, "fallbacks": fallbacks,
            "tiers": tiers, "after_error": after_error, "capture_s": capture_s,
            "in_capture": in_capture,
            "replay_s": replay_s}


class _StandIns:
    """Stock's gloo collectives replaced by local stand-ins while the block runs (gloo
    cannot be captured): all-gather copies this rank's shard into every rank's place,
    reduce-scatter keeps this rank's chunk; `counts` counts their calls.  Only for captures
    whose graph is never replayed."""

    def __init__(self):
        self.counts = {"all_gather": 0, "reduce_scatter": 0}

    def __enter__(self):
        import torch.distributed as dist

        counts = self.counts

        class _Done:
            def wait(self):
                return True

        def ag(output_tensor, input_tensor, group=None, async_op=False):
            counts["all_gather"] += 1
            n = input_tensor.numel()
            output_tensor.view(-1, n).copy_(input_tensor.reshape(1, n).expand(
                output_tensor.numel() // n, n))
            return _Done() if async_op else None

        def rs(output, input, op=None, group=None, async_op=False):
            counts["reduce_scatter"] += 1
            n = output.numel()
            output.view(-1).copy_(input.view(-1, n)[dist.get_rank(group)])
            return _Done() if async_op else None

        self.real = dist.all_gather_into_tensor, dist.reduce_scatter_tensor
        dist.all_gather_into_tensor, dist.reduce_scatter_tensor = ag, rs
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        dist.all_gather_into_tensor, dist.reduce_scatter_tensor = self.real
        return False


def _cold(rank, world):
    """The first step captured without warm-up: every call on stock (stand-ins), then two
    eager TIDE steps."""
    import torch

    import tide.fsdp

    model = _model("mp", world)
    rec = tide.fsdp.enable(model, mode="in_place", capture="tide")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    error = None
    # FSDP2's lazy initialisation (root, streams) before the capture: this case checks
    # TIDE's routing, not whether FSDP2 initialises inside a capture.
    model._get_fsdp_state()._lazy_init()
    graph = torch.cuda.CUDAGraph()
    stand_ins = _StandIns()
    try:
        static = _batch(0, rank)
        with stand_ins, torch.cuda.graph(graph):
            _step(model, opt, static)
    except Exception as exc:  # reported, fails the check
        error = "%s: %s" % (type(exc).__name__, exc)
    at_capture = {st.spec.name: dict(st.calls) for st in rec.states}
    fallbacks = list(rec.fallbacks)
    torch.cuda.synchronize()
    graph.reset()
    del graph
    opt.zero_grad(set_to_none=True)
    params, after_error = [], None
    try:
        for step in range(WARMUP):
            _step(model, opt, _batch(step, rank))
            params.append(_shards(model))
    except Exception as exc:
        after_error = "%s: %s" % (type(exc).__name__, exc)
    end = {st.spec.name: dict(st.calls) for st in rec.states}
    tide.fsdp.disable(model)
    return {"error": error, "after_error": after_error, "stand_ins": stand_ins.counts,
            "at_capture": at_capture, "end": end, "fallbacks": fallbacks, "params": params}


def _twice(rank, world):
    """Two captures back to back after the warm-up, no call of the groups between them: the
    first holds TIDE's calls; the second is told apart by its capture id
    (tide_stream_capture_key) and runs on stock (one graph per set), stand-ins for gloo."""
    import torch

    import tide.fsdp

    model = _model("mp", world)
    rec = tide.fsdp.enable(model, mode="in_place", capture="tide")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(WARMUP):
        _step(model, opt, _batch(step, rank))
    before = {st.spec.name: dict(st.calls) for st in rec.states}
    first = second = None
    graphs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()]
    stand_ins, error = _StandIns(), None
    try:
        static = _batch(WARMUP, rank)
        with torch.cuda.graph(graphs[0]):
            _step(model, opt, static)
        first = {st.spec.name: dict(st.calls) for st in rec.states}
        with stand_ins, torch.cuda.graph(graphs[1]):
            _step(model, opt, static)
        second = {st.spec.name: dict(st.calls) for st in rec.states}
    except Exception as exc:  # reported, fails the check
        error = "%s: %s" % (type(exc).__name__, exc)
    fallbacks = list(rec.fallbacks)
    torch.cuda.synchronize()
    for g in graphs:
        g.reset()
    del graphs
    tide.fsdp.disable(model)
    return {"error": error, "before": before, "first": first, "second": second,
            "fallbacks": fallbacks, "stand_ins": stand_ins.counts}


def _rank(rank, world, replays):
    fsdp_gpu.check_safety()
    fsdp_gpu.deterministic_cuda()
    steps = WARMUP + replays + 1
    out = {"warm": {}}
    for kind in ("mp", "bf16", "wide"):
        stock, _ = _eager(kind, rank, world, steps, False)
        eager, eager_calls = _eager(kind, rank, world, steps, True)
        out["warm"][kind] = {"stock": stock, "eager": eager, "eager_calls": eager_calls,
                             "captured": _captured(kind, rank, world, replays)}
    out["cold"] = _cold(rank, world)
    out["twice"] = _twice(rank, world)
    return out


def _equal(a, b):
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _check_warm(kind, rec, replays):
    problems = []
    cap = rec["captured"]
    if set(cap["tiers"]) != {1} or len(cap["tiers"]) != 3:
        problems.append("groups of tiers %s, expected three of Tier 1" % cap["tiers"])
    if cap["fallbacks_at_capture"]:
        problems.append("fallbacks by the end of the capture: %s" % cap["fallbacks_at_capture"])
    for name, calls in cap["at_capture"].items():
        before = cap["before"][name]
        d = {k: calls.get(k, 0) - before.get(k, 0) for k in calls}
        if d["captured_all_gather"] < 1 or d["captured_reduce_scatter"] != 1:
            problems.append("%s: the capture holds %d TIDE all-gathers and %d TIDE "
                            "reduce-scatters (expected >= 1 and 1)"
                            % (name, d["captured_all_gather"], d["captured_reduce_scatter"]))
        if kind == "wide" and d.get("wide_reduce_scatter", 0) != 1:
            problems.append("%s: the capture's reduction did not go through the fp32 "
                            "companion: %s" % (name, d))
        if d["stock_all_gather"] or d["stock_reduce"]:
            problems.append("%s: stock calls in the capture: %s" % (name, d))
        end = cap["end"][name]
        if end["all_gather"] != calls["all_gather"] or end["stock_reduce"] != calls[
                "stock_reduce"] + 1:
            problems.append("%s: the eager step after the capture did not run on stock: %s"
                            % (name, end))
    from tide import _lib

    whole = (_lib.CAPTURE_NO_FABRIC | _lib.CAPTURE_OTHER_GRAPH | _lib.CAPTURE_UNUSABLE
             | _lib.CAPTURE_PROGRAM_COLD)
    for name, (blockers, reason) in cap["in_capture"].items():
        if blockers & whole:
            problems.append("%s: inside the capture the library says its all-gather would not "
                            "be captured: 0x%x %s" % (name, blockers, reason))
    if cap["after_error"]:
        problems.append("the eager step after the capture raised %s" % cap["after_error"])
    if not any("were captured into a CUDA graph" in why for _n, why in cap["fallbacks"]):
        problems.append("no fallback reason for the eager step after the capture: %s"
                        % cap["fallbacks"])
    steps = WARMUP + replays + 1
    if len(cap["params"]) != steps:
        problems.append("%d steps recorded, expected %d" % (len(cap["params"]), steps))
    for s, got in enumerate(cap["params"]):
        what = "eager step" if s < WARMUP or s == steps - 1 else "replay %d" % (s - WARMUP + 1)
        if not _equal(got, rec["eager"][s]):
            problems.append("step %d (%s): parameters differ from the eager TIDE run" % (s, what))
        if not _equal(got, rec["stock"][s]):
            problems.append("step %d (%s): parameters differ from stock" % (s, what))
    for name, calls in rec["eager_calls"].items():
        if calls["reduce_scatter"] != steps or calls["stock_reduce"]:
            problems.append("eager TIDE run, %s: %s" % (name, calls))
    return problems


def _check_cold(rec, stock):
    problems = []
    if rec["error"]:
        problems.append("the capture without warm-up raised %s" % rec["error"])
    if rec["after_error"]:
        problems.append("the eager steps after it raised %s" % rec["after_error"])
    for name, calls in rec["at_capture"].items():
        if calls["all_gather"] or calls["reduce_scatter"] or calls["captured_all_gather"]:
            problems.append("%s: TIDE calls in the capture without warm-up: %s" % (name, calls))
        end = rec["end"][name]
        if end["reduce_scatter"] != WARMUP or end["stock_reduce"] != 1:
            problems.append("%s: after the capture, %s (expected %d TIDE reduce-scatters)"
                            % (name, end, WARMUP))
        if not any(n == name and "first call of a program" in why
                   for n, why in rec["fallbacks"]):
            problems.append("%s: no 'first call of a program' reason in %s"
                            % (name, rec["fallbacks"]))
    if rec["stand_ins"]["reduce_scatter"] != len(rec["at_capture"]):
        problems.append("stock stand-ins called %s" % rec["stand_ins"])
    for s in range(WARMUP):
        if s >= len(rec["params"]) or not _equal(rec["params"][s], stock[s]):
            problems.append("eager step %d after the cold capture differs from stock" % s)
    return problems


def _check_twice(rec):
    problems = []
    if rec["error"]:
        return ["the two captures raised %s" % rec["error"]]
    for name, calls in rec["first"].items():
        d1 = {k: calls.get(k, 0) - rec["before"][name].get(k, 0) for k in calls}
        d2 = {k: rec["second"][name].get(k, 0) - calls.get(k, 0) for k in calls}
        if d1["captured_all_gather"] < 1 or d1["captured_reduce_scatter"] != 1:
            problems.append("%s: the first capture holds %s" % (name, d1))
        if d2["all_gather"] or d2["reduce_scatter"] or not d2["stock_reduce"]:
            problems.append("%s: the second capture ran TIDE or no stock reduction: %s"
                            % (name, d2))
        if not any(n == name and "an earlier CUDA graph" in why for n, why in rec["fallbacks"]):
            problems.append("%s: no 'an earlier CUDA graph' reason in %s"
                            % (name, rec["fallbacks"]))
    if not rec["stand_ins"]["reduce_scatter"]:
        problems.append("stock stand-ins never called: %s" % rec["stand_ins"])
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", help="libtide.so built with -DTIDE_WITH_CUDA=ON (TIDE_LIBRARY)")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=110)
    ap.add_argument("--json")
    args = ap.parse_args()
    fsdp_gpu.check_safety_or_exit()
    fsdp_gpu.use_lib(args.lib)
    import torch

    import fsdp_harness

    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    env = dict(fsdp_gpu.SAFETY, CUBLAS_WORKSPACE_CONFIG=":4096:8",
               TIDE_TIMEOUT_MS=os.environ.get("TIDE_TIMEOUT_MS", "30000"))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        records = fsdp_harness.run(2, _rank, tmp, timeout=args.timeout, env=env,
                                   allow_failure=True, replays=args.replays)
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
              "replays": args.replays, "ranks": []}
    status = 0
    for r, rec in enumerate(records):
        if not rec["ok"]:
            print("rank %d: FAIL: %s: %s\n%s" % (r, rec.get("type"), rec.get("error"),
                                                 rec.get("traceback", "")), flush=True)
            report["ranks"].append({"ok": False, "error": rec.get("error")})
            status = 1
            continue
        res = rec["result"]
        row = {"ok": True, "problems": {}}
        for kind, warm in res["warm"].items():
            problems = _check_warm(kind, warm, args.replays)
            row["problems"]["warm-" + kind] = problems
            cap = warm["captured"]
            print("rank %d warm %-4s: %s (capture %.2f s, %d replays %.2f s)%s" % (
                r, kind, "PASS" if not problems else "FAIL", cap["capture_s"], args.replays,
                cap["replay_s"], "".join("\n    " + p for p in problems)), flush=True)
            if r == 0:
                for name, calls in cap["at_capture"].items():
                    print("    %s at capture: %s" % (name, calls), flush=True)
        problems = _check_cold(res["cold"], res["warm"]["mp"]["stock"])
        row["problems"]["cold"] = problems
        print("rank %d cold    : %s (stand-ins %s)%s" % (
            r, "PASS" if not problems else "FAIL", res["cold"]["stand_ins"],
            "".join("\n    " + p for p in problems)), flush=True)
        problems = _check_twice(res["twice"])
        row["problems"]["twice"] = problems
        print("rank %d twice   : %s%s" % (r, "PASS" if not problems else "FAIL",
                                          "".join("\n    " + p for p in problems)), flush=True)
        if any(row["problems"].values()):
            row["ok"] = False
            status = 1
        report["ranks"].append(row)
    print("fsdp_graph_gpu: %s (%.0f s)" % ("PASS" if status == 0 else "FAIL",
                                           time.monotonic() - t0), flush=True)
    fsdp_gpu.finish(report, args.json, status)


if __name__ == "__main__":
    main()
