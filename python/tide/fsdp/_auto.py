"""The switch that turns TIDE on for FSDP2 code that does not call tide.fsdp.enable():
TIDE_FSDP=in_place (or slot_reuse) in the environment, read when tide.fsdp is imported.

FSDP2 decides which module is the root at its first forward (FSDPState._lazy_init); that is
also the first moment every fully_shard call of the model is known to be done.  The switch
wraps _lazy_init so that, right after the root's lazy initialisation, the root module is
enabled as enable(root, mode) would (collective: every rank runs its first forward).  A
refusal (say, ranks that disagree) raises from that forward, as enable() would.

To reach code that never imports tide (a test suite that spawns its own ranks), put
python/tide/fsdp/sitecustomize on PYTHONPATH: its sitecustomize imports tide.fsdp when
TIDE_FSDP is set, in every process that starts.

A root stays on stock FSDP2, with one log line, until its first forward where it can be
enabled: not while the forward runs under a TorchDispatchMode (CommDebugMode, a FLOP
counter, FakeTensorMode, ...), since TIDE's collectives do not pass through the dispatcher,
so the mode could not see (or replace) them, and enable()'s agreement collectives would run
inside it as if they were the user's; not while one of its groups is unsharded (a pipeline
schedule's unshard() before the first forward), since enable() registers resharded groups
only; not while a group holds gradients accumulated without reduction
(set_requires_gradient_sync(False) in earlier micro-batches), which live on the unsharded
parameters that enable() rebuilds on TIDE's landing.  Every rank must run that forward the
same way (they run one program), as for any collective.
"""

import logging
import os

logger = logging.getLogger("tide.fsdp")

_INSTALLED = []


def install(mode):
    """Enable TIDE (mode "in_place" / "slot_reuse") on every FSDP2 root at its first forward."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    from . import _MODES, enable, enabled

    if mode not in _MODES:
        raise ValueError("TIDE_FSDP=%r: expected in_place or slot_reuse" % (mode,))
    if _INSTALLED:
        _INSTALLED[0][1] = mode
        return
    original = FSDPState._lazy_init
    state = [original, mode]

    def _lazy_init(self):
        first = self._is_root is None
        original(self)
        if not self._is_root:
            return
        root = self._modules[0]
        if not first and not getattr(root, "_tide_auto_waiting", False):
            return  # enabled at its first forward, or disabled since: leave it as it is
        if enabled(root) is not None:
            return
        why = _not_now(root)
        if why is not None:
            root._tide_auto_waiting = True
            logged = root.__dict__.setdefault("_tide_auto_reasons", set())
            if why not in logged:  # each reason once
                logged.add(why)
                logger.warning("tide.fsdp: root %s stays on stock FSDP2 while %s; TIDE is "
                               "enabled at its first forward where that no longer holds",
                               type(root).__name__, why)
            return
        root._tide_auto_waiting = False
        enable(root, mode=state[1])

    _lazy_init._tide_auto = True
    FSDPState._lazy_init = _lazy_init
    _INSTALLED.append(state)


def _not_now(root):
    """Why `root` cannot be enabled at this forward (None when it can): its forward runs
    under a TorchDispatchMode, or one of its groups is not idle and resharded (unshard()
    called before the first forward, as a pipeline schedule does to issue all-gathers early;
    enable() registers only resharded groups), or holds unreduced gradients of earlier
    micro-batches (they live on the unsharded parameters enable() rebuilds)."""
    from . import _busy, _param_groups

    modes = _dispatch_modes()
    if modes:
        return ("its forward runs under TorchDispatchMode %s (TIDE's collectives bypass the "
                "dispatcher, the mode would not see them)" % ", ".join(modes))
    if _capturing():
        return ("its forward runs in a CUDA graph capture (enable() registers memory and "
                "runs collectives, which a capture may not contain)")
    for name, _m, pg in _param_groups(root):
        why = _busy(name, pg)
        if why is not None:
            return "its " + why
    return None


def _dispatch_modes():
    """Names of the user TorchDispatchModes active now (empty when none)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return [type(m).__name__ for m in _get_current_dispatch_mode_stack()]


def _capturing():
    """Whether the current CUDA stream is being captured into a CUDA graph."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _dispatch_reason():
    """Why a served group's collective runs on stock FSDP2 for this call, whatever the
    capture: a user TorchDispatchMode is active (TIDE's collectives bypass the dispatcher,
    so the mode would not see them); None when none is.  A CUDA graph capture is decided by
    the group's _graph.Graphs (stock FSDP2 unless enable(capture="tide"))."""
    modes = _dispatch_modes()
    if modes:
        return "a TorchDispatchMode is active (%s)" % ", ".join(modes)
    return None


def uninstall():
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    if _INSTALLED:
        FSDPState._lazy_init = _INSTALLED.pop()[0]


def install_from_environment():
    mode = os.environ.get("TIDE_FSDP", "").strip()
    if mode and mode.lower() not in ("0", "off", "no", "false"):
        install(mode)
