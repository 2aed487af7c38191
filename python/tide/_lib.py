"""Loading libtide and its C ABI: result codes, struct layouts and call prototypes.

Everything here mirrors include/tide.h one to one.  The structs are ctypes mirrors of the
public C structs in the header's field order; the library itself checks the one struct that
callers fill (tide_config_t) through its size/magic/version header, and the test suite checks
the rest against the values the library writes.
"""

import atexit
import ctypes
import ctypes.util
import enum
import os
import pathlib
import sys
import threading
import warnings
import weakref

# TIDE_VERSION_CODE of the header this module mirrors (TIDE_MAJOR 0, TIDE_MINOR 1, TIDE_PATCH 0).
VERSION_CODE = 100
CONFIG_MAGIC = 0x54494445  # "TIDE"

MAX_PARAMS = 256
MAX_GPUS_PER_NODE = 8
MAX_NODES = 65536
MAX_ROUND_WIDTH = 4
MAX_PASSES = 4
ARENA_ALIGN = 4096


class Result(enum.IntEnum):
    """tide_result_t: fixed values, never renumbered."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    NO_MEMORY = 3
    OVERFLOW = 4
    PLAN_REJECTED = 5
    INTERNAL = 6
    TIMEOUT = 7
    FABRIC = 8
    CHECK_FAILED = 9
    DATA_MISMATCH = 10


class TideError(Exception):
    """A libtide call failed.  `code` is a Result, `message` the library's detailed reason
    (tide_get_last_error() of the calling thread)."""

    def __init__(self, code, message=""):
        try:
            code = Result(code)
        except ValueError:
            code = int(code)
        self.code = code
        self.message = message
        name = code.name if isinstance(code, Result) else "result %d" % code
        super().__init__("%s: %s" % (name, message) if message else name)

    def __reduce__(self):
        return (type(self), (int(self.code), self.message))


# ------------------------------------------------------------------------------- dtypes, modes

DTYPE_BF16, DTYPE_FP32, DTYPE_FP16 = 0, 1, 2
RS_IN_PLACE, RS_SLOT_REUSE = 0, 1
FABRIC_CPU = 0

_DTYPE_NAMES = {"bf16": DTYPE_BF16, "bfloat16": DTYPE_BF16, "fp32": DTYPE_FP32,
                "float32": DTYPE_FP32, "fp16": DTYPE_FP16, "float16": DTYPE_FP16}
_MODE_NAMES = {"in-place": RS_IN_PLACE, "in_place": RS_IN_PLACE,
               "slot-reuse": RS_SLOT_REUSE, "slot_reuse": RS_SLOT_REUSE}


def parse_dtype(value, what="dtype"):
    """tide_dtype_t of "bf16" / "fp32" / "fp16" (or their numpy names, or the C value)."""
    if isinstance(value, bool):
        raise ValueError("%s: expected 'bf16' or 'fp32', got %r" % (what, value))
    if isinstance(value, int):
        if value in (DTYPE_BF16, DTYPE_FP32, DTYPE_FP16):
            return value
    elif isinstance(value, str) and value.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[value.lower()]
    else:
        name = getattr(value, "name", None)  # a numpy dtype or scalar type
        if name is None and isinstance(value, type):
            name = getattr(value, "__name__", None)
        if isinstance(name, str) and name.lower() in _DTYPE_NAMES:
            return _DTYPE_NAMES[name.lower()]
    raise ValueError("%s: expected 'bf16' or 'fp32', got %r" % (what, value))


def parse_mode(value):
    """tide_rs_mode_t of "in-place" / "slot-reuse" (or the C value)."""
    if isinstance(value, bool):
        raise ValueError("mode: expected 'in-place' or 'slot-reuse', got %r" % (value,))
    if isinstance(value, int) and value in (RS_IN_PLACE, RS_SLOT_REUSE):
        return value
    if isinstance(value, str) and value.lower() in _MODE_NAMES:
        return _MODE_NAMES[value.lower()]
    raise ValueError("mode: expected 'in-place' or 'slot-reuse', got %r" % (value,))


def mode_name(mode):
    return "slot-reuse" if mode == RS_SLOT_REUSE else "in-place"


# ------------------------------------------------------------------------------- structs


# ------------------------------------------------------------------------------- shutdown

# Objects whose finalisers must not run collectives or start threads (tide.World, and the
# torch binding's Comm): a collective needs every rank, and threads started while the
# interpreter shuts down may never be joined, so a World left open used to keep its process
# from exiting.  At exit each open one is finalised once, locally (_finalize), in the order
# of creation; a finaliser that runs later (garbage collection) does the same.
_open = weakref.WeakValueDictionary()
_open_seq = iter(range(1 << 62))
_warned = set()


def track(obj):
    """Finalise obj (an object with _finalize()) at interpreter exit if it is still open."""
    _open[next(_open_seq)] = obj


def warn_once(key, message):
    """One warning per key and process, also while the interpreter shuts down (when the
    warnings machinery may be gone: then on stderr)."""
    if key in _warned:
        return
    _warned.add(key)
    try:
        if sys.is_finalizing():
            raise RuntimeError
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Exception:
        try:
            sys.stderr.write("tide: warning: %s\n" % message)
        except Exception:
            pass


def _finalize_open():
    for key in sorted(list(_open.keys())):
        obj = _open.get(key)
        if obj is not None:
            try:
                obj._finalize()
            except Exception:
                pass


atexit.register(_finalize_open)


class Closeable:
    """`with` support and a finaliser for objects that own library handles and define close()
    (close() must be safe to call twice)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class ConfigStruct(ctypes.Structure):
    """tide_config_t, field for field."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("nodes", ctypes.c_int),
        ("gpus_per_node", ctypes.c_int),
        ("wave_width", ctypes.c_int),
        ("round_width", ctypes.c_int),
        ("passes", ctypes.c_int),
        ("staging_slots", ctypes.c_int),
        ("mode", ctypes.c_int),
        ("sum_ctas", ctypes.c_int),
        ("landing_ctas", ctypes.c_int),
        ("multicast", ctypes.c_int),
        ("lane", ctypes.c_int),
    ]


class ParamShape(ctypes.Structure):
    _fields_ = [("dim0", ctypes.c_uint64), ("inner", ctypes.c_uint64)]


class GroupDesc(ctypes.Structure):
    _fields_ = [
        ("num_params", ctypes.c_int),
        ("shapes", ctypes.POINTER(ParamShape)),
        ("ag_dtype", ctypes.c_int),
        ("grad_dtype", ctypes.c_int),
        ("shard_dtype", ctypes.c_int),
    ]


class ParamGeometryStruct(ctypes.Structure):
    _fields_ = [
        ("dim0", ctypes.c_uint64),
        ("inner", ctypes.c_uint64),
        ("rows_per_rank", ctypes.c_uint64),
        ("shard_bytes", ctypes.c_uint64),
        ("shard_offset", ctypes.c_uint64),
        ("fp32_offset", ctypes.c_uint64),
    ]


class PlanSummaryStruct(ctypes.Structure):
    _fields_ = [
        ("nodes", ctypes.c_int),
        ("gpus_per_node", ctypes.c_int),
        ("ranks", ctypes.c_int),
        ("num_params", ctypes.c_int),
        ("shard_bytes", ctypes.c_uint64),
        ("group_bytes", ctypes.c_uint64),
        ("grad_shard_bytes", ctypes.c_uint64),
        ("fp32_shard_bytes", ctypes.c_uint64),
        ("fsdp2_pack_bytes", ctypes.c_uint64),
        ("ag_rounds", ctypes.c_int),
        ("ag_descriptors_max", ctypes.c_uint64),
        ("rs_wave_width", ctypes.c_int),
        ("rs_waves", ctypes.c_int),
        ("rs_inbox_generations", ctypes.c_int),
        ("rs_round_width", ctypes.c_int),
        ("rs_rounds", ctypes.c_int),
        ("rs_passes", ctypes.c_int),
        ("rs_outbox_depth", ctypes.c_int),
        ("rs_subslice_elems", ctypes.c_uint64),
        ("rs_descriptors_flat", ctypes.c_uint64),
        ("rs_descriptors", ctypes.c_uint64),
        ("arena_bytes", ctypes.c_uint64),
    ]


class RegionInfoStruct(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]


class MemoryBoundsStruct(ctypes.Structure):
    _fields_ = [
        ("in_place_staging_ns", ctypes.c_double),
        ("slot_reuse_staging_ns", ctypes.c_double),
        ("in_place_total_ns", ctypes.c_double),
        ("slot_reuse_total_ns", ctypes.c_double),
        ("fsdp2_total_ns", ctypes.c_double),
        ("rail_lane", ctypes.c_int),
        ("rail_lane_staging_ns", ctypes.c_double),
        ("rail_lane_in_place_total_ns", ctypes.c_double),
        ("rail_lane_slot_reuse_total_ns", ctypes.c_double),
    ]


class SolverInputStruct(ctypes.Structure):
    _fields_ = [
        ("nodes", ctypes.c_int),
        ("gpus_per_node", ctypes.c_int),
        ("wave_width", ctypes.c_int),
        ("passes", ctypes.c_int),
        ("grad_dtype", ctypes.c_int),
        ("bw_nic_gbps", ctypes.c_double),
        ("bw_sum_gbps", ctypes.c_double),
        ("bw_land_gbps", ctypes.c_double),
        ("bw_cap_gbps", ctypes.c_double),
        ("t_round_ms", ctypes.c_double),
        ("fp32_shard_bytes", ctypes.c_uint64),
        ("bw_link_gbps", ctypes.c_double),
    ]


class SolverOutputStruct(ctypes.Structure):
    _fields_ = [
        ("round_width", ctypes.c_int),
        ("sum_ctas", ctypes.c_int),
        ("landing_ctas", ctypes.c_int),
        ("t_nic_ms", ctypes.c_double),
        ("rounds", ctypes.c_int),
    ]


class ValidationStruct(ctypes.Structure):
    _fields_ = [
        ("accepted", ctypes.c_int),
        ("wave", ctypes.c_int),
        ("subslice", ctypes.c_int),
        ("gpu", ctypes.c_int),
        ("contributor0", ctypes.c_int),
        ("contributor1", ctypes.c_int),
        ("blocks_checked", ctypes.c_uint64),
    ]


class GroupEntryStruct(ctypes.Structure):
    """tide_group_entry_t: one group of a set on one arena (docs/arena.md)."""

    _fields_ = [
        ("config", ctypes.POINTER(ConfigStruct)),
        ("group", ctypes.POINTER(GroupDesc)),
        ("ring_slot", ctypes.c_int),
        ("name", ctypes.c_char_p),
    ]


RING_OWN_SLOT = -1
REGION_COUNT = 9

# tide_call_kind_t: the call tide_group_capture_readiness asks about.
CALL_ALL_GATHER, CALL_REDUCE_SCATTER, CALL_REDUCE_SCATTER_STAGED = 0, 1, 2

# tide_capture_blocker_t: why a call would not be captured (bits; fixed values).
CAPTURE_UNUSABLE = 1 << 0
CAPTURE_PROGRAM_COLD = 1 << 1
CAPTURE_FENCE_COLD = 1 << 2
CAPTURE_NO_FABRIC = 1 << 3
CAPTURE_OTHER_GRAPH = 1 << 4
CAPTURE_REASON_MAX = 384


class CaptureReadinessStruct(ctypes.Structure):
    """tide_capture_readiness_t: the blockers of a call in a capture, the first one's reason."""

    _fields_ = [
        ("blockers", ctypes.c_uint32),
        ("reason", ctypes.c_char * CAPTURE_REASON_MAX),
    ]


class ArenaSummaryStruct(ctypes.Structure):
    _fields_ = [
        ("num_groups", ctypes.c_int),
        ("nodes", ctypes.c_int),
        ("gpus_per_node", ctypes.c_int),
        ("total_bytes", ctypes.c_uint64),
        ("region_bytes", ctypes.c_uint64 * REGION_COUNT),
        ("own_slot_bytes", ctypes.c_uint64),
        ("largest_group", ctypes.c_int),
        ("largest_group_bytes", ctypes.c_uint64),
        ("largest_rs_bytes", ctypes.c_uint64),
        ("separate_bytes", ctypes.c_uint64),
    ]


def struct_dict(s):
    return {name: getattr(s, name) for name, _ in s._fields_}


# ------------------------------------------------------------------------------- prototypes

_p = ctypes.POINTER
_void_p = ctypes.c_void_p
_res = ctypes.c_int

# name: (restype, argtypes).  The planner calls come first; the collective calls are bound
# only when the library exports them (see require()).
_PROTOTYPES = {
    "tide_get_error_string": (ctypes.c_char_p, [ctypes.c_int]),
    "tide_get_last_error": (ctypes.c_char_p, []),
    "tide_get_version": (_res, [_p(ctypes.c_int)]),
    "tide_dtype_size": (ctypes.c_size_t, [ctypes.c_int]),
    "tide_plan_create": (_res, [_p(ConfigStruct), _p(GroupDesc), _p(_void_p)]),
    "tide_plan_destroy": (None, [_void_p]),
    "tide_plan_get_param": (_res, [_void_p, ctypes.c_int, _p(ParamGeometryStruct)]),
    "tide_plan_landing_offset": (_res, [_void_p, ctypes.c_int, ctypes.c_int,
                                        _p(ctypes.c_uint64)]),
    "tide_plan_get_summary": (_res, [_void_p, _p(PlanSummaryStruct)]),
    "tide_plan_get_region": (_res, [_void_p, ctypes.c_int, _p(RegionInfoStruct)]),
    "tide_plan_get_lane": (_res, [_void_p, _p(ctypes.c_int)]),
    "tide_region_name": (ctypes.c_char_p, [ctypes.c_int]),
    "tide_memory_bounds": (_res, [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  _p(MemoryBoundsStruct)]),
    "tide_solve": (_res, [_p(SolverInputStruct), _p(SolverOutputStruct)]),
    "tide_validate_schedule": (_res, [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_int, _p(ValidationStruct)]),
    "tide_comm_init_all": (_res, [ctypes.c_int, ctypes.c_int, ctypes.c_int, _p(_void_p)]),
    "tide_comm_destroy": (_res, [_void_p]),
    "tide_comm_rank": (_res, [_void_p, _p(ctypes.c_int)]),
    "tide_group_register": (_res, [_void_p, _p(ConfigStruct), _p(GroupDesc), _p(_void_p)]),
    "tide_group_deregister": (_res, [_void_p]),
    "tide_group_plan": (_res, [_void_p, _p(_void_p)]),
    "tide_group_landing": (_res, [_void_p, ctypes.c_int, _p(_void_p)]),
    "tide_group_resident": (_res, [_void_p, _p(_void_p)]),
    "tide_all_gather": (_res, [_void_p, _void_p, ctypes.c_int, _void_p]),
    "tide_reduce_scatter": (_res, [_void_p, _p(_void_p), _p(ctypes.c_float), ctypes.c_float,
                                   ctypes.c_int, ctypes.c_int, _void_p]),
    "tide_all_gather_checked": (_res, [_void_p, _void_p, ctypes.c_uint64, ctypes.c_int,
                                       _void_p]),
    "tide_reduce_scatter_checked": (_res, [_void_p, _p(_void_p), _p(ctypes.c_uint64),
                                           ctypes.c_int, _p(ctypes.c_float), ctypes.c_uint64,
                                           ctypes.c_float, ctypes.c_int, _void_p]),
    "tide_arena_plan_create": (_res, [ctypes.c_int, _p(GroupEntryStruct), _p(_void_p)]),
    "tide_arena_plan_destroy": (None, [_void_p]),
    "tide_arena_plan_get_summary": (_res, [_void_p, _p(ArenaSummaryStruct)]),
    "tide_arena_plan_get_region": (_res, [_void_p, ctypes.c_int, ctypes.c_int,
                                          _p(RegionInfoStruct)]),
    "tide_arena_plan_group": (_res, [_void_p, ctypes.c_int, _p(_void_p)]),
    "tide_groups_register": (_res, [_void_p, ctypes.c_int, _p(GroupEntryStruct), _p(_void_p)]),
    "tide_group_reshard": (_res, [_void_p]),
    "tide_group_slot_live": (_res, [_void_p, _p(ctypes.c_int)]),
    "tide_group_name": (_res, [_void_p, _p(ctypes.c_char_p)]),
    "tide_group_read_done_event": (_res, [_void_p, _p(_void_p)]),
    "tide_stream_capture_key": (_res, [_void_p, _p(ctypes.c_uint64)]),
    "tide_group_capture_readiness": (_res, [_void_p, ctypes.c_int, _void_p,
                                            _p(CaptureReadinessStruct)]),
    "tide_group_segment": (_res, [_void_p, _p(_void_p), _p(ctypes.c_uint64), _p(ctypes.c_int)]),
    "tide_torch_pool_offer": (_res, [_void_p, ctypes.c_uint64, ctypes.c_int]),
    "tide_torch_pool_withdraw": (_res, [_void_p, _p(ctypes.c_int)]),
    "tide_torch_pool_state": (_res, [_void_p, _p(ctypes.c_int)]),
    "tide_torch_pool_alloc": (_void_p, [ctypes.c_ssize_t, ctypes.c_int, _void_p]),
    "tide_torch_pool_free": (None, [_void_p, ctypes.c_ssize_t, ctypes.c_int, _void_p]),
    "tide_alpha_avg": (ctypes.c_float, [ctypes.c_int]),
    "tide_alpha_divide": (ctypes.c_float, [ctypes.c_float, ctypes.c_float]),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    """Where the library is looked for, in order: $TIDE_LIBRARY, the copy installed inside
    the package (`pip install .`), the repository's build/, then the system's library path."""
    env = os.environ.get("TIDE_LIBRARY")
    if env:
        return [("$TIDE_LIBRARY", env)]
    here = pathlib.Path(__file__).resolve().parent
    out = [("installed package", str(here / "lib" / "libtide.so"))]
    out.append(("repository build", str(here.parents[1] / "build" / "libtide.so")))
    found = ctypes.util.find_library("tide")
    out.append(("find_library('tide')", found))
    return out


def _load():
    tried = []
    for origin, path in _candidates():
        if not path:
            tried.append("%s: not found" % origin)
            continue
        if os.sep in path and not os.path.exists(path):
            tried.append("%s: %s does not exist" % (origin, path))
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            tried.append("%s: %s" % (origin, exc))
            continue
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = restype
                fn.argtypes = argtypes
        if getattr(lib, "tide_get_last_error", None) is None:
            tried.append("%s: %s does not export tide_get_last_error" % (origin, path))
            continue
        return lib, path
    raise OSError("libtide not found; build it (cmake -S . -B build && cmake --build build) "
                  "or set TIDE_LIBRARY to the path of libtide.so.  Tried: " + "; ".join(tried))


def lib():
    """The loaded library (loaded on first use, so that `import tide` never fails)."""
    global _lib, _lib_path
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib, _lib_path = _load()
    return _lib


def library_path():
    lib()
    return _lib_path


def require(name):
    """The C function `name`, or OSError naming the library that lacks it."""
    fn = getattr(lib(), name, None)
    if fn is None:
        raise OSError("%s does not export %s (a library built without this part of the API)"
                      % (_lib_path, name))
    return fn


def last_error():
    msg = lib().tide_get_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(result):
    """Raise TideError for a failing result, with the calling thread's last error."""
    if result != Result.SUCCESS:
        raise TideError(result, last_error())


def call(name, *args):
    check(require(name)(*args))
