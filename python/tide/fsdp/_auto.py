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
"""

import os

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
        if first and self._is_root:
            root = self._modules[0]
            if enabled(root) is None:
                enable(root, mode=state[1])

    _lazy_init._tide_auto = True
    FSDPState._lazy_init = _lazy_init
    _INSTALLED.append(state)


def uninstall():
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    if _INSTALLED:
        FSDPState._lazy_init = _INSTALLED.pop()[0]


def install_from_environment():
    mode = os.environ.get("TIDE_FSDP", "").strip()
    if mode and mode.lower() not in ("0", "off", "no", "false"):
        install(mode)
