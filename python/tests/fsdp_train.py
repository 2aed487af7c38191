"""Training loops the tide.fsdp tests run in every rank process: the same model, seeds and
data once on stock FSDP2 and once with TIDE, recording losses and the local parameter shards
after every optimizer step."""

import torch
import torch.nn.functional as F

import fsdp_model

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, None: None}


def mp_dtypes(mp):
    """(param_dtype, reduce_dtype) of a config's mp, a pair of names ("bf16", "fp32"), or None."""
    return None if mp is None else (_DTYPES[mp[0]], _DTYPES[mp[1]])


def served(rec):
    """What tide.fsdp.enable's record says of a run: the groups TIDE served, its fallbacks and
    each group's call counts (empty without TIDE)."""
    return {"groups": rec.groups if rec else [], "fallbacks": rec.fallbacks if rec else [],
            "calls": {st.spec.name: dict(st.calls) for st in rec.states} if rec else {}}


def train_loop(model, opt, rank, steps, accum=1, before_micro=None, before_step=None,
               after_step=None, device=None):
    """`steps` optimizer steps of `accum` micro-batches each on fsdp_model.batch data, the loss
    scaled by 1/accum.  before_micro(step, micro) runs ahead of each micro-batch,
    before_step() after the last backward of a step (before opt.step), after_step() after
    the step.  Returns (losses, params): each step's loss and the local parameter shards
    after it, kept on the CPU (the records travel to the parent process through torch.save)."""
    losses, params = [], []
    for step in range(steps):
        total = 0.0
        for micro in range(accum):
            if before_micro is not None:
                before_micro(step, micro)
            x, y = fsdp_model.batch(step, rank, micro)
            if device is not None:
                x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x).reshape(-1, 37), y.reshape(-1)) / accum
            loss.backward()
            total += loss.item()
        if before_step is not None:
            before_step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        params.append([p.to_local().detach().cpu().clone() for p in model.parameters()])
        if after_step is not None:
            after_step()
    return losses, params


def _landing_addresses(model):
    """data_ptr of every unsharded parameter of every TIDE Tier 1 group at its last unshard
    (after the step they are resharded and hold no storage)."""
    import tide.fsdp

    rec = tide.fsdp.enabled(model)
    out = []
    for st in rec.states if rec else []:
        if st.tier == 1:
            out.extend(st.landing_addresses)
    return out


class _CountStockCopies:
    """Counts the stock layout copies and collectives while a run trains: FSDP2's all-gather
    copy-out (torch.split_with_sizes_copy), its reduce-scatter pack (torch._chunk_cat) and
    the gloo collectives it issues (looked up at call time, so wrappers see every call)."""

    NAMES = (("torch", "split_with_sizes_copy"), ("torch", "_chunk_cat"),
             ("dist", "all_gather_into_tensor"), ("dist", "reduce_scatter_tensor"))

    def __enter__(self):
        import torch.distributed as dist

        self.counts = {name: 0 for _, name in self.NAMES}
        self._saved = []
        for mod_name, name in self.NAMES:
            mod = torch if mod_name == "torch" else dist
            fn = getattr(mod, name)
            self._saved.append((mod, name, fn))

            def wrapper(*args, _fn=fn, _name=name, **kwargs):
                self.counts[_name] += 1
                return _fn(*args, **kwargs)

            setattr(mod, name, wrapper)
        return self

    def __exit__(self, *exc):
        for mod, name, fn in self._saved:
            setattr(mod, name, fn)


def train(rank, world, steps=20, tide_mode=None, exact=False, mp=None, accum=1,
          sync_each_micro=False, tier=None, topology=None, seed=0, lr=1e-2, perturb=False,
          divide_factor=None, force_sum=False, hook=False, reshard_after_forward=True,
          prefetch=False, device=None, reduce_in_fp32=False, compile=None, probe=None,
          dims=None):
    """One run; returns {"losses": [...], "params": [[local shards after step s]],
    "addresses": [...per step], "groups": [(fqn, tier)], "fallbacks": [...]}.
    probe(point, model, rec), when given, runs at "before_enable", "after_enable" and
    "after_disable" (TIDE runs); what it returns is in out["probe"][point].  dims:
    TinyLlama's sizes other than the vocabulary (dim, heads, hidden, layers)."""
    import tide.fsdp

    model = fsdp_model.build(seed=seed, exact=exact, mp=mp_dtypes(mp),
                             reshard_after_forward=reshard_after_forward, device=device,
                             compile=compile, **(dims or {}))
    if prefetch:
        # Explicit prefetching: each layer unshards the next one (forward) / the previous
        # one (backward) ahead of time, through FSDPModule's public API.
        layers = list(model.layers)
        layers[0].set_modules_to_forward_prefetch([layers[1]])
        layers[1].set_modules_to_backward_prefetch([layers[0]])
    if perturb:
        # Every fp32 master one ulp up: the rounding noise that stock FSDP2 itself shows
        # when anything upstream (a kernel, a reduction order) rounds differently.
        with torch.no_grad():
            for p in model.parameters():
                local = p.to_local()
                local.copy_(torch.nextafter(local, torch.full_like(local, float("inf"))))
    if divide_factor is not None:
        model.set_gradient_divide_factor(divide_factor)
    if force_sum:
        model.set_force_sum_reduction_for_comms(True)
    if hook:
        # A post-reduce hook that changes the output: it must see it before the division.
        for m in model.modules():
            if hasattr(m, "set_all_reduce_hook"):
                m.set_all_reduce_hook(lambda out: out.mul_(3.0).add_(1e-3))
    rec = None
    if tide_mode is not None:
        kw = {}
        if topology is not None:
            kw = dict(nodes=topology[0], gpus_per_node=topology[1])
        if reduce_in_fp32:
            kw["reduce_in_fp32"] = True
        probed = {"before_enable": probe("before_enable", model, None)} if probe else {}
        rec = tide.fsdp.enable(model, mode=tide_mode, tier=tier, **kw)
        if probe:
            probed["after_enable"] = probe("after_enable", model, rec)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, foreach=False)
    addresses = []

    def before_micro(step, micro):
        if accum > 1 and not sync_each_micro:
            model.set_requires_gradient_sync(micro == accum - 1)

    def after_step():
        if rec is not None:
            addresses.append(_landing_addresses(model))

    with _CountStockCopies() as counter:
        losses, params = train_loop(model, opt, rank, steps, accum, before_micro,
                                    after_step=after_step, device=device)
    out = {"losses": losses, "params": params, "addresses": addresses, **served(rec),
           "stock_copies": counter.counts,
           # Whether the Tier 1 groups shared one arena (tide_groups_register) or fell back
           # to one arena each (a fabric that refuses sets); None without a ring (Tier 0).
           "shared_arena": (None if rec is None or rec.ring is None
                            else bool(rec.ring.shared))}
    if rec is not None:
        tide.fsdp.disable(model)
        if probe:
            probed["after_disable"] = probe("after_disable", model, rec)
            out["probe"] = probed
    return out


def compare(rank, world, configs):
    """For each config (a dict of train() keyword arguments with tide_mode set), a stock run
    and a TIDE run; returns [(config, stock_result, tide_result)]."""
    out = []
    stock_cache = {}
    for cfg in configs:
        # "stock": overrides for the stock run, where gloo cannot run what FSDP2 asks for
        # (PREMUL_SUM): the same arithmetic through another stock path.
        tide_kw = {k: v for k, v in cfg.items() if k != "stock"}
        stock_kw = {k: v for k, v in tide_kw.items() if k not in ("tide_mode", "tier",
                                                                  "topology",
                                                                  "reduce_in_fp32")}
        stock_kw.update(cfg.get("stock", {}))
        key = repr(sorted(stock_kw.items()))
        if key not in stock_cache:
            stock_cache[key] = train(rank, world, **stock_kw)
        out.append((cfg, stock_cache[key], train(rank, world, **tide_kw)))
    return out


def run_steps(model, rank, steps, rec=None):
    """Trains an already sharded (and possibly TIDE-enabled) model for `steps` AdamW steps on
    fsdp_model.batch data; returns {"losses", "params" (local shards after every step),
    "stock_copies"} and, when `rec` (tide.fsdp.enable's record) is given, the groups TIDE
    served, its fallbacks and each group's call counts."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    with _CountStockCopies() as counter:
        losses, params = train_loop(model, opt, rank, steps)
    out = {"losses": losses, "params": params, "stock_copies": counter.counts}
    if rec is not None:
        out.update(served(rec))
    return out
