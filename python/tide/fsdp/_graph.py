"""TIDE inside a CUDA graph capture of an FSDP2 step: enable(..., capture="tide") or
TIDE_FSDP_CAPTURE=tide (docs/fsdp.md, "CUDA graphs").

Default (capture="stock"): every call of a served group made while the current stream
captures runs on stock FSDP2 (OFF_REASON).  With capture="tide", a served group's
all-gather / reduce-scatter made during a capture calls TIDE, so that the graph contains
TIDE-AG / TIDE-RS and replays them, when the C layer can capture it
(docs/cuda-fabric.md, "CUDA graphs across processes", "Shared-arena sets").  Its
preconditions are checked here, before the library is called; a call that does not meet
them runs on stock FSDP2, said once per group in the log and in enabled(model).fallbacks:

- the fabric captures: the one-process-per-rank CUDA fabric without rails (the CPU and NCCL
  fabrics, and TIDE_CUDA_MP_RAILS, capture nothing);
- every group of the communicator ran an eager all-gather and reduce-scatter before the
  capture (decided at the first call of the capture, so that a capture of a step without
  warm-up -- torchtitan records its first step -- contains no TIDE call at all and leaves the
  set usable eagerly);
- the call's program ran eagerly before, and so did the cross-group fence variant it will
  run (predicted by the same rule as src/api/arena_set.c, tide_set_fence, replayed here on
  the calls TIDE made: the last user of each landing, of the receive stage and of the
  reduce-scatter resources);
- no earlier capture of the communicator's calls (the C layer allows one graph per set).

A capture is told apart from the next by its id (tide_stream_capture_key on the current
stream: cudaStreamGetCaptureInfo, which torch does not expose), so a second capture is seen
as one even with no call of these groups between the two.  With a library that lacks the
call, a capture ends at the next call made outside it, and two captures with no call
between them are taken for one: the C layer's own refusal (a fence crossing graphs) is the
backstop there.  After a capture that contains TIDE calls, the set is replay-only in the
C layer: eager calls (an evaluation step outside the graph) run on stock FSDP2, said once,
until disable().  The graph may be replayed any number of times; the host-side state left by
the capture (every group resharded, the ring's occupants) is the state after each replay.
"""

import logging
import os

logger = logging.getLogger("tide.fsdp")

MODES = ("stock", "tide")

OFF_REASON = ("a CUDA graph capture is under way (tide.fsdp captures its calls only with "
              "enable(..., capture=\"tide\") or TIDE_FSDP_CAPTURE=tide)")


def capture_mode(arg):
    """The capture mode asked for: the argument, else $TIDE_FSDP_CAPTURE, else "stock"."""
    value = arg
    if value is None:
        value = os.environ.get("TIDE_FSDP_CAPTURE", "").strip().lower() or "stock"
        if value in ("0", "off", "no", "false"):
            value = "stock"
        elif value in ("1", "on", "yes", "true"):
            value = "tide"
    if value not in MODES:
        raise ValueError("capture: expected 'stock' or 'tide' (argument or TIDE_FSDP_CAPTURE), "
                         "got %r" % (value,))
    return value


def fabric_reason(comm):
    """Why `comm`'s calls cannot be captured (None when they can)."""
    from ..torch_binding import FABRIC_CUDA

    if comm.device.type != "cuda" or comm.fabric != FABRIC_CUDA:
        return ("the %s fabric captures no call (only the one-process-per-rank CUDA fabric "
                "does)" % ("CPU" if comm.device.type == "cpu" else "NCCL"))
    if os.environ.get("TIDE_CUDA_MP_RAILS", "").strip() not in ("", "0"):
        return "the CUDA fabric with rails (TIDE_CUDA_MP_RAILS) captures no call"
    return None


def _capturing():
    from . import _auto

    return _auto._capturing()


def capture_key():
    """The id (+ 1) of the capture the current CUDA stream is part of, as the library sees it
    (tide_stream_capture_key); None when the library cannot say (no CUDA build, an older
    library, no CUDA device)."""
    import ctypes

    import torch

    from .. import _lib

    if not torch.cuda.is_available():
        return None
    try:
        fn = _lib.require("tide_stream_capture_key")
    except OSError:
        return None
    key = ctypes.c_uint64(0)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    if fn(stream, ctypes.byref(key)) != _lib.Result.SUCCESS:
        return None
    return key.value


class Graphs:
    """Capture state of the groups of one communicator: one shared-arena set (`shared`),
    or groups registered alone (Tier 0, or a set the library could not share)."""

    def __init__(self, mode, comm, shared):
        self.mode = mode
        self.comm = comm
        self.shared = shared
        self.members = []      # the states (Tier1Group / Tier0Group) of the communicator
        self.ran = set()       # (group name, program) that ran eagerly
        self.last_user = {}    # resource -> group name (src/api/arena_set.c's last_user)
        self.capture = None    # while a capture is under way: {"why": reason or None}
        self.captured = False  # some call was captured: the set is replay-only
        self.captures = 0      # captures that contained TIDE calls

    # ------------------------------------------------------------ what a call needs

    def _fence(self, name, use):
        """The cross-group fence variant (0, 1) a call of group `name` runs, None for
        none: tide_set_fence's rule."""
        if not self.shared or use is None:
            return None

        def other(res):
            who = self.last_user.get(res)
            return who is not None and who != name

        handover = bool(use.get("rs")) and other("rs")
        need = handover or (use.get("landing") is not None and other(("landing",
                                                                       use["landing"]))) or (
            bool(use.get("recv")) and other("recv"))
        return (1 if handover else 0) if need else None

    def _cold(self):
        """Why the communicator's groups are not warm for a capture (None when they are)."""
        # A reduce-scatter through Tier 1's fp32 companion ("rs-wide") warms the group as
        # well as one through its own registration: a job that always accumulates without
        # sync never runs the latter.  Each captured call is still checked for its own
        # program (check()).
        for st in self.members:
            for programs, what in ((("ag",), "all-gather"), (("rs", "rs-wide"), "reduce-scatter")):
                if not any((st.spec.name, program) in self.ran for program in programs):
                    return ("group %s ran no eager %s before this capture (the first call of "
                            "a program cannot be captured; run eager steps first)"
                            % (st.spec.name, what))
        return None

    def check(self, name, program, use=None):
        """Why this call of group `name` runs on stock FSDP2 (None: TIDE runs it, captured
        or not).  program: "ag", "rs" or "rs-wide"; use: what it touches (see _fence)."""
        if not _capturing():
            if self.capture is not None:
                self.capture = None  # the capture ended
            if self.captured:
                return ("the communicator's calls were captured into a CUDA graph; eager calls "
                        "(outside the graph) run on stock FSDP2 until tide.fsdp.disable()")
            return None
        if self.mode != "tide":
            return OFF_REASON
        key = capture_key()
        if self.capture is not None and key is not None and self.capture.get("key") != key:
            self.capture = None  # another capture began with no call outside both
        if self.capture is None:
            why = fabric_reason(self.comm)
            if why is None and self.captured:
                why = ("an earlier CUDA graph holds the communicator's calls (one graph per "
                       "set)")
            if why is None:
                why = self._cold()
            self.capture = {"why": why, "key": key}
        why = self.capture["why"]
        if why is not None:
            return "a CUDA graph capture is under way and " + why
        if (name, program) not in self.ran:
            return ("a CUDA graph capture is under way and group %s's %s program never ran "
                    "eagerly" % (name, program))
        variant = self._fence(name, use)
        if variant is not None and (name, ("fence", variant)) not in self.ran:
            return ("a CUDA graph capture is under way and group %s's cross-group fence "
                    "(variant %d) never ran eagerly" % (name, variant))
        return None

    def note(self, st, program, use=None):
        """After TIDE ran a call of group state `st` (Tier1Group / Tier0Group): the library's
        state moved as this, and st.calls counts it ("all_gather" / "reduce_scatter", and
        "captured_*" too when it was captured: once, not per replay)."""
        name = st.spec.name
        counter = "all_gather" if program == "ag" else "reduce_scatter"
        st.calls[counter] += 1
        if _capturing():
            st.calls["captured_" + counter] += 1
            self.captured = True
            if self.capture is not None and not self.capture.get("served"):
                self.capture["served"] = True
                self.captures += 1
        else:
            self.ran.add((name, program))
            variant = self._fence(name, use)  # before last_user moves, below
            if variant is not None:
                self.ran.add((name, ("fence", variant)))
        if use is not None:
            if use.get("landing") is not None:
                self.last_user[("landing", use["landing"])] = name
            if use.get("recv"):
                self.last_user["recv"] = name
            if use.get("rs"):
                self.last_user["rs"] = name


def log_once(st, why, what, kind="calls"):
    """One log line (`what`: "gathers", "reduces", ...) and one fallbacks entry ("<kind> on
    stock FSDP2: <why>") per group, kind and reason, for every tier's calls left on stock:
    Tier 1 lists its all-gathers ("calls") and reductions ("reductions") apart, Tier 0 says
    "calls" once for both."""
    said = st.__dict__.setdefault("_stock_said", set())
    if (kind, why) in said:
        return
    said.add((kind, why))
    logger.warning("tide.fsdp: %s %s with stock FSDP2 for this call: %s (and every such call)",
                   st.spec.name, what, why)
    sink = getattr(st, "fallback_sink", None)
    if sink is not None:
        sink.append((st.spec.name, "%s on stock FSDP2: %s" % (kind, why)))


__all__ = ["Graphs", "MODES", "capture_mode", "fabric_reason", "log_once"]
