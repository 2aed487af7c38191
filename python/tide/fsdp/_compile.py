"""torch.compile and tide.fsdp: which compilation setups Tier 1 / Tier 0 can serve.

By default dynamo does not trace FSDP2's hooks (torch._dynamo.config.skip_fsdp_hooks): a
compiled block or a whole compiled model runs its graphs between FSDP2's eager hooks, so the
collectives, and TIDE's, run eagerly and both tiers serve them (test_fsdp_compile.py).

Traceable FSDP2 -- skip_fsdp_hooks=False, usually with compiled autograd -- traces FSDP2's
all-gather, copy-out and reduce-scatter into the graphs and resizes the unsharded storages
itself; neither TIDE's landing binding (Tier 1) nor its ctypes calls (Tier 0) can be traced.
enable() checks the two global switches and leaves every group on stock FSDP2 with one log
line (the reason is in enabled(model).fallbacks).  Compiled autograd entered only later, by a
context manager around the step, cannot be seen at enable(): Tier 1 then raises a
RuntimeError at the first traced all-gather (_tier1.py), naming the fix.
"""


def traceable_fsdp_reason():
    """Why FSDP2's collectives may be traced under this process's dynamo settings, or None."""
    try:
        import torch._dynamo.config as dcfg
    except Exception:  # no dynamo: nothing is traced
        return None
    why = []
    if getattr(dcfg, "skip_fsdp_hooks", True) is False:
        why.append("torch._dynamo.config.skip_fsdp_hooks=False")
    if getattr(dcfg, "compiled_autograd", False):
        why.append("torch._dynamo.config.compiled_autograd=True")
    if not why:
        return None
    return ("Traceable FSDP2 (%s): FSDP2's collectives are traced into the compiled graphs, "
            "where TIDE cannot run" % ", ".join(why))


__all__ = ["traceable_fsdp_reason"]
