"""tide: TIDE's zero-copy, layout-aware all-gather and reduce-scatter, over libtide.

ctypes bindings of include/tide.h (no build step, no torch):

- planning: Config, Plan, memory_bounds, solve, validate_schedule;
- collectives on the CPU fabric over numpy arrays (bf16 through ml_dtypes): World, Group;
- errors: every failing call raises TideError(code, message) with a Result code and the
  library's reason.

The library is found through $TIDE_LIBRARY, else build/libtide.so of this repository, else
the system's library path; it is loaded on first use.
"""

from ._lib import Result, TideError, library_path
from ._lib import (ARENA_ALIGN, MAX_GPUS_PER_NODE, MAX_NODES, MAX_PARAMS, MAX_PASSES,
                   MAX_ROUND_WIDTH, VERSION_CODE)
from .collectives import Group, World, alpha_avg, alpha_divide, numpy_dtype
from .plan import (DEFAULT_CALIBRATION, LINK_RATE_GBPS, PAPER_CALIBRATION, REGION_NAMES, Config,
                   ParamGeometry, Plan, Region, memory_bounds, solve, validate_schedule)

__version__ = "0.1.0"


def version():
    """The loaded library's version as (major, minor, patch)."""
    import ctypes

    from . import _lib

    code = ctypes.c_int()
    _lib.call("tide_get_version", ctypes.byref(code))
    return (code.value // 10000, code.value // 100 % 100, code.value % 100)


def error_string(code):
    """The library's static string of a result code."""
    from . import _lib

    return _lib.lib().tide_get_error_string(int(code)).decode()


__all__ = [
    "ARENA_ALIGN", "Config", "DEFAULT_CALIBRATION", "Group", "LINK_RATE_GBPS", "MAX_GPUS_PER_NODE",
    "MAX_NODES", "MAX_PARAMS", "MAX_PASSES", "MAX_ROUND_WIDTH", "PAPER_CALIBRATION",
    "ParamGeometry", "Plan", "REGION_NAMES", "Region", "Result", "TideError", "VERSION_CODE",
    "World", "alpha_avg", "alpha_divide", "error_string", "library_path", "memory_bounds",
    "numpy_dtype", "solve", "validate_schedule", "version"
]
