"""A CUDA graph capture simulated on the CPU fabric for the tide.fsdp capture tests (CI has
no GPU): while `state["on"]`, tide.fsdp sees a capture under way; the library's own
capture-readiness answer (tide_group_capture_readiness) is taken as it is, less the one
blocker a CPU fabric always reports (it cannot capture), which the simulation checks is
there.  The "captured" calls then run eagerly on the CPU fabric, which is what lets the
tests compare parameters with stock's.  What this checks is the adapter's routing on the
library's answers, not the capture itself (tests/gpu/fsdp_graph_gpu.py does that)."""

import contextlib


@contextlib.contextmanager
def simulated(state, fabric_ok=True, keys=True):
    """Patch tide.fsdp for the block.  state: a dict the caller flips, "on" (capturing) and
    "key" (the capture's id, as tide_stream_capture_key would tell; with keys=False the
    library "cannot say", as with CPU-only torch).  fabric_ok=False leaves the library's
    answer whole (a fabric that cannot capture)."""
    from tide import _lib
    from tide.fsdp import _auto, _graph

    real, real_ready, real_key = _auto._capturing, _graph.readiness, _graph.capture_key
    _auto._capturing = lambda: state["on"]
    _graph.capture_key = (lambda: state.get("key", 0)) if keys else (lambda: None)
    if fabric_ok:
        def readiness(group, call):
            blockers, reason = real_ready(group, call)
            if not blockers & _lib.CAPTURE_NO_FABRIC:
                raise AssertionError("the CPU fabric said it captures: %s" % reason)
            return blockers & ~_lib.CAPTURE_NO_FABRIC, reason

        _graph.readiness = readiness
    try:
        yield state
    finally:
        _auto._capturing = real
        _graph.readiness = real_ready
        _graph.capture_key = real_key
