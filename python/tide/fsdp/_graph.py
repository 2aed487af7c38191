"""TIDE inside a CUDA graph capture of an FSDP2 step: enable(..., capture="tide") or
TIDE_FSDP_CAPTURE=tide (docs/fsdp.md, "CUDA graphs").

Default (capture="stock"): every call of a served group made while the current stream
captures runs on stock FSDP2 (OFF_REASON).  With capture="tide", a served group's
all-gather / reduce-scatter made during a capture calls TIDE, so that the graph contains
TIDE-AG / TIDE-RS and replays them, when the C layer can capture it
(docs/cuda-fabric.md, "CUDA graphs across processes", "Shared-arena sets").  Whether it can
is asked of the library before each such call (tide_group_capture_readiness, through
TorchGroup.capture_readiness: the same checks the call itself makes, so nothing of the C
rules is copied here); a call it would refuse runs on stock FSDP2, said once per group in
the log and in enabled(model).fallbacks.  The library answers from its own state:

- the fabric captures (the one-process-per-rank CUDA fabric without rails; the CPU and NCCL
  fabrics, and TIDE_CUDA_MP_RAILS, capture nothing);
- the call's program ran eagerly before, and so did the cross-group fence variant it would
  run first (which depends on the set's earlier calls);
- no other capture holds the fabric's streams or the set's calls.

Two decisions stay here, about a capture as a whole, taken at its first call of the
communicator's groups: a capture in which some group is not warm (its all-gather or
reduce-scatter never ran eagerly: torchtitan records its first step) or the fabric captures
nothing gets no TIDE call at all, so that the set stays usable eagerly; and after a capture
that contains TIDE calls, no later capture gets any (the C layer allows one graph per set).

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


def readiness(group, call):
    """(blockers, reason) of `call` ("all_gather", "reduce_scatter", "reduce_scatter_staged")
    of TorchGroup `group` on the current stream: tide_group_capture_readiness, blockers 0 when
    the call would be captured (_lib.CAPTURE_* bits otherwise).  The one place this module asks
    (a CPU test simulates a fabric that captures by wrapping it).  A library without the call,
    or one that cannot ask the stream (an invalidated capture), captures nothing: the call
    runs on stock, which reports such a capture itself."""
    from .. import _lib

    try:
        return group.capture_readiness(call)
    except (OSError, _lib.TideError) as exc:  # OSError: _lib.require, an older libtide
        return _lib.CAPTURE_NO_FABRIC, ("the library cannot say whether the call would be "
                                        "captured (%s)" % exc)


def _session_blockers():
    """What keeps a whole capture off TIDE (Graphs._session); a per-call blocker (a cold
    fence variant) leaves that call alone on stock."""
    from .. import _lib

    return (_lib.CAPTURE_UNUSABLE | _lib.CAPTURE_PROGRAM_COLD | _lib.CAPTURE_NO_FABRIC
            | _lib.CAPTURE_OTHER_GRAPH)


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
    """Capture state of the groups of one communicator: one shared-arena set, or groups
    registered alone (Tier 0, or a set the library could not share)."""

    def __init__(self, mode, comm):
        self.mode = mode
        self.comm = comm
        self.members = []      # the states (Tier1Group / Tier0Group) of the communicator
        self.capture = None    # while a capture is under way: {"why": reason or None, ...}
        self.captured = False  # some call was captured: the set is replay-only
        self.captures = 0      # captures that contained TIDE calls

    def _session(self):
        """Why this capture gets no TIDE call at all (None when it may): the library's
        answer for every group's all-gather and reduce-scatter, where it concerns the
        capture as a whole (the fabric, a failed group, another capture, a cold program)."""
        for st in self.members:
            for call in ("all_gather", "reduce_scatter"):
                blockers, reason = readiness(st.group, call)
                wide = getattr(st, "wide", None)
                if call == "reduce_scatter" and blockers & _session_blockers() and wide:
                    # A reduce-scatter through Tier 1's fp32 companion warms the group as
                    # well as one through its own registration: a job that always
                    # accumulates without sync never runs the latter.  The captured call is
                    # asked about again on its own (check()).
                    blockers, reason = readiness(wide, call)
                if blockers & _session_blockers():
                    return reason
        return None

    def check(self, group, name, call):
        """Why this call runs on stock FSDP2 (None: TIDE runs it, captured or not).  group:
        the TorchGroup that would run it (None: the fp32-gradient companion of a reduction,
        not registered yet); name: the served group's, for messages; call: "all_gather",
        "reduce_scatter" or "reduce_scatter_staged" (gradients staged in the landing)."""
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
            why = None
            if self.captured:
                why = ("an earlier CUDA graph holds the communicator's calls (one graph per "
                       "set)")
            if why is None:
                why = self._session()
            self.capture = {"why": why, "key": key}
        why = self.capture["why"]
        if why is not None:
            return "a CUDA graph capture is under way and " + why
        if group is None:
            return ("a CUDA graph capture is under way and group %s's fp32-gradient "
                    "reduce-scatter never ran eagerly (its fp32 companion group is registered "
                    "at its first eager use)" % name)
        blockers, reason = readiness(group, call)
        if blockers:
            return "a CUDA graph capture is under way and " + reason
        return None

    def note(self, st, program):
        """After TIDE ran a call of group state `st` (Tier1Group / Tier0Group), "ag" or "rs":
        st.calls counts it ("all_gather" / "reduce_scatter", and "captured_*" too when it was
        captured: once, not per replay)."""
        counter = "all_gather" if program == "ag" else "reduce_scatter"
        st.calls[counter] += 1
        if _capturing():
            st.calls["captured_" + counter] += 1
            self.captured = True
            if self.capture is not None and not self.capture.get("served"):
                self.capture["served"] = True
                self.captures += 1


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


__all__ = ["Graphs", "MODES", "capture_mode", "log_once", "readiness"]
