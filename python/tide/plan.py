"""Plans and the planner's closed forms: tide_config_t, tide_plan_*, tide_memory_bounds,
tide_solve and tide_validate_schedule.

A plan is pure host computation (no communicator): the landing map, the reduce-scatter
schedule, the arena layout.  Figures come back as plain dicts keyed by the C field names.
"""

import collections
import ctypes
import math
import operator

import numpy as np

from . import _lib

ParamGeometry = collections.namedtuple(
    "ParamGeometry", "dim0 inner rows_per_rank shard_bytes shard_offset fp32_offset")
ParamGeometry.__doc__ = """Geometry of one parameter (paper §2.1): D_p, K_p, R_p = ceil(D_p / N),
s_p = R_p K_p b_ag, o_p = sum_{i<p} s_i, and the byte offset of its rows in the fp32 output."""

Region = collections.namedtuple("Region", "offset bytes")
Region.__doc__ = "One region of the per-rank arena: byte offset from the base and size."

REGION_NAMES = ("landing0", "landing1", "recv_stage", "resident", "staging", "outbox", "spare",
                "inbox", "signals")

# The paper's calibration (App. G): 47.5 GB/s rails, 99 GB/s per sum CTA, 21 GB/s per landing
# CTA under a 90 GB/s ceiling, 1.3 ms per round.  Pass as solve(..., **PAPER_CALIBRATION).
PAPER_CALIBRATION = dict(bw_nic_gbps=47.5, bw_sum_gbps=99.0, bw_land_gbps=21.0,
                         bw_cap_gbps=90.0, t_round_ms=1.3)
# What tide.fsdp sizes its groups with: the paper's rates, but the sum's rate per CTA is the
# library's (bw_sum_gbps 0: the paper's 99 at L = 8 sources, scaled by the default sum's
# measured rate over L; docs/tide-plan.md), which the C planner's defaults use too.
DEFAULT_CALIBRATION = dict(PAPER_CALIBRATION, bw_sum_gbps=0.0)
# Per-GPU NVLink 4 ingress through NVSwitch (H100 / H200 SXM: 18 links x 25 GB/s per
# direction): what the sum keeps pace with on one node (solve's bw_link_gbps; the planner's
# default C_sum at M = 1 uses the same rate, src/plan/plan.h).
LINK_RATE_GBPS = 450.0


def _int(value, what, low=None, high=None):
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError("%s: expected an integer, got %r" % (what, value)) from None
    if isinstance(value, bool):
        raise ValueError("%s: expected an integer, got %r" % (what, value))
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError("%s = %d outside [%s, %s]" % (what, v, low, high))
    return v


# tide_lane_t by value: which programs serve the group (tide.h).
LANES = ("auto", "generic", "rail")


def _parse_lane(lane):
    if isinstance(lane, str):
        if lane not in LANES:
            raise ValueError("lane: expected one of %s, got %r" % (", ".join(LANES), lane))
        return LANES.index(lane)
    return _int(lane, "lane", -2**31, 2**31 - 1)


class Config(_lib.ConfigStruct):
    """tide_config_t, initialised as TIDE_CONFIG_INIT does (size, magic, version) and then
    overridden.  Zero in a tuning field lets the planner choose.  `mode` is stored as the C
    enum value; `mode_name` gives "in-place" or "slot-reuse"."""

    def __init__(self, nodes, gpus_per_node, wave_width=0, round_width=0, passes=0,
                 staging_slots=0, mode="in-place", sum_ctas=0, landing_ctas=0,
                 multicast=False, lane="auto"):
        # Range checks are the library's (it names the field); only types are checked here so
        # that a value always reaches C intact.
        c_int = (-2**31, 2**31 - 1)
        super().__init__(
            ctypes.sizeof(_lib.ConfigStruct), _lib.CONFIG_MAGIC, _lib.VERSION_CODE,
            _int(nodes, "nodes", *c_int), _int(gpus_per_node, "gpus_per_node", *c_int),
            _int(wave_width, "wave_width", *c_int), _int(round_width, "round_width", *c_int),
            _int(passes, "passes", *c_int), _int(staging_slots, "staging_slots", *c_int),
            _lib.parse_mode(mode), _int(sum_ctas, "sum_ctas", *c_int),
            _int(landing_ctas, "landing_ctas", *c_int), 1 if multicast else 0,
            _parse_lane(lane))

    @property
    def ranks(self):
        return self.nodes * self.gpus_per_node

    @property
    def mode_name(self):
        return _lib.mode_name(self.mode)

    def copy(self, **overrides):
        kw = dict(nodes=self.nodes, gpus_per_node=self.gpus_per_node,
                  wave_width=self.wave_width, round_width=self.round_width, passes=self.passes,
                  staging_slots=self.staging_slots, mode=self.mode, sum_ctas=self.sum_ctas,
                  landing_ctas=self.landing_ctas, multicast=bool(self.multicast),
                  lane=self.lane)
        kw.update(overrides)
        return Config(**kw)

    def __repr__(self):
        return ("Config(nodes=%d, gpus_per_node=%d, wave_width=%d, round_width=%d, passes=%d, "
                "staging_slots=%d, mode=%r, sum_ctas=%d, landing_ctas=%d, multicast=%s, "
                "lane=%r)"
                % (self.nodes, self.gpus_per_node, self.wave_width, self.round_width,
                   self.passes, self.staging_slots, self.mode_name, self.sum_ctas,
                   self.landing_ctas, bool(self.multicast),
                   LANES[self.lane] if 0 <= self.lane < len(LANES) else self.lane))


def normalize_shapes(shapes):
    """[(D_p, K_p)] of a list whose items are an int D (a 1-D parameter) or a shape tuple
    (D, d1, d2, ...) with K = d1 d2 ...; every dimension must be >= 1."""
    if isinstance(shapes, (str, bytes)) or not hasattr(shapes, "__iter__"):
        raise ValueError("shapes: expected a list of shapes, got %r" % (shapes,))
    out = []
    for i, item in enumerate(shapes):
        dims = (item,) if not hasattr(item, "__iter__") else tuple(item)
        if not dims:
            raise ValueError("shapes[%d]: empty shape" % i)
        dims = [_int(d, "shapes[%d]" % i, 1, 2**64 - 1) for d in dims]
        inner = math.prod(dims[1:])
        if inner >= 2**64:
            raise ValueError("shapes[%d]: product of the trailing dims exceeds 64 bits" % i)
        out.append((dims[0], inner))
    if not out:
        raise ValueError("shapes: a group needs at least one parameter")
    return out


class _GroupSignature:
    """The C group descriptor of (shapes, dtypes), keeping its shape array alive."""

    def __init__(self, shapes, ag_dtype, grad_dtype, shard_dtype):
        self.shapes = normalize_shapes(shapes)
        self.ag_dtype = _lib.parse_dtype(ag_dtype, "ag_dtype")
        self.grad_dtype = _lib.parse_dtype(grad_dtype, "grad_dtype")
        self.shard_dtype = (self.ag_dtype if shard_dtype is None
                            else _lib.parse_dtype(shard_dtype, "shard_dtype"))
        # Counts beyond TIDE_MAX_PARAMS go to the library, which answers UNSUPPORTED (the
        # caller's cue to fall back); only what cannot reach C is refused here.
        if len(self.shapes) > 2**31 - 1:
            raise ValueError("shapes: too many parameters")
        self._array = (_lib.ParamShape * len(self.shapes))(*self.shapes)
        self.desc = _lib.GroupDesc(len(self.shapes), self._array, self.ag_dtype,
                                   self.grad_dtype, self.shard_dtype)


def _check_config(config):
    """A private byte-for-byte copy of a Config (header included, so that the library judges
    exactly what the caller built; later changes to the caller's object do not leak in)."""
    if not isinstance(config, _lib.ConfigStruct):
        raise ValueError("config: expected a tide.Config, got %r" % (config,))
    return Config.from_buffer_copy(config)


class Plan(_lib.Closeable):
    """tide_plan_t: the plan of one group on one topology.

    Plan(config, shapes, ag_dtype="bf16", grad_dtype="bf16", shard_dtype=None) builds one
    (shard_dtype None = ag_dtype; "fp32" with ag_dtype "bf16" means a cast all-gather).
    Raises TideError: UNSUPPORTED for groups TIDE does not serve (e.g. more than 256
    parameters), PLAN_REJECTED for a colliding schedule, INVALID_ARGUMENT otherwise.
    Use as a context manager or call close(); a group's plan (Group.plan) is owned by the
    group and close() on it is a no-op.
    """

    def __init__(self, config, shapes, ag_dtype="bf16", grad_dtype="bf16", shard_dtype=None):
        self._handle = None
        self._owned = True
        self._owner = None
        self.config = _check_config(config)
        sig = _GroupSignature(shapes, ag_dtype, grad_dtype, shard_dtype)
        handle = ctypes.c_void_p()
        _lib.call("tide_plan_create", ctypes.byref(self.config), ctypes.byref(sig.desc),
                  ctypes.byref(handle))
        self._handle = handle.value
        self._init_from(sig)

    @classmethod
    def _borrowed(cls, handle, config, sig, owner):
        """A view of a plan owned by another object (a registered group)."""
        self = cls.__new__(cls)
        self._handle = handle
        self._owned = False
        self._owner = owner
        self.config = config
        self._init_from(sig)
        return self

    def _init_from(self, sig):
        self.shapes = list(sig.shapes)
        self.ag_dtype = sig.ag_dtype
        self.grad_dtype = sig.grad_dtype
        self.shard_dtype = sig.shard_dtype
        self._summary = None
        self._params = None

    # ---------------------------------------------------------------- lifetime

    def close(self):
        handle, self._handle = self._handle, None
        if handle is not None and self._owned:
            _lib.lib().tide_plan_destroy(handle)

    def _h(self):
        if self._handle is None or (self._owner is not None and self._owner._closed):
            raise ValueError("plan is closed")
        return self._handle

    # ---------------------------------------------------------------- queries

    @property
    def summary(self):
        """Whole-plan figures (tide_plan_summary_t) as a dict."""
        handle = self._h()
        if self._summary is None:
            s = _lib.PlanSummaryStruct()
            _lib.call("tide_plan_get_summary", handle, ctypes.byref(s))
            self._summary = _lib.struct_dict(s)
        return dict(self._summary)

    @property
    def lane(self):
        """The programs that serve the plan, "rail" (the rail lane) or "generic": the
        config's lane with AUTO resolved (tide_plan_get_lane).  On a registered group's plan
        (TorchGroup.plan) it is what the group runs, the fabric's choice included."""
        lane = ctypes.c_int()
        _lib.call("tide_plan_get_lane", self._h(), ctypes.byref(lane))
        return LANES[lane.value]

    @property
    def num_params(self):
        return len(self.shapes)

    @property
    def ranks(self):
        return self.config.ranks

    def _param_index(self, p):
        p = _int(p, "p")
        if not 0 <= p < len(self.shapes):
            raise IndexError("parameter %d outside [0, %d)" % (p, len(self.shapes)))
        return p

    def param(self, p):
        """ParamGeometry of parameter p."""
        p = self._param_index(p)
        g = _lib.ParamGeometryStruct()
        _lib.call("tide_plan_get_param", self._h(), p, ctypes.byref(g))
        return ParamGeometry(**_lib.struct_dict(g))

    @property
    def params(self):
        """ParamGeometry of every parameter, in order (cached)."""
        self._h()
        if self._params is None:
            self._params = [self.param(p) for p in range(len(self.shapes))]
        return list(self._params)

    def landing_offset(self, p, rank):
        """Landing(p, r) = o_p N + r s_p: byte offset of rank r's shard of p in a slot."""
        p = self._param_index(p)
        rank = _int(rank, "rank")
        if not 0 <= rank < self.ranks:
            raise IndexError("rank %d outside [0, %d)" % (rank, self.ranks))
        off = ctypes.c_uint64()
        _lib.call("tide_plan_landing_offset", self._h(), p, rank, ctypes.byref(off))
        return off.value

    def region(self, name):
        """Region(offset, bytes) of an arena region, by name ("landing0", ...) or index."""
        if isinstance(name, str):
            if name not in REGION_NAMES:
                raise ValueError("region: %r is not one of %s" % (name, ", ".join(REGION_NAMES)))
            index = REGION_NAMES.index(name)
        else:
            index = _int(name, "region", 0, len(REGION_NAMES) - 1)
        info = _lib.RegionInfoStruct()
        _lib.call("tide_plan_get_region", self._h(), index, ctypes.byref(info))
        return Region(info.offset, info.bytes)

    def regions(self):
        """{name: Region} of every region, in layout order."""
        return {name: self.region(name) for name in REGION_NAMES}

    # ---------------------------------------------------------------- host-side layouts

    def pack_shard(self, params, rank, dtype=None):
        """Rank `rank`'s packed shard of full parameters `params` (P arrays of D_p x K_p
        items): rows [r R_p, (r+1) R_p) of each parameter at o_p, padding rows zero.  dtype
        defaults to the shard dtype (bf16 or fp32)."""
        from .collectives import numpy_dtype
        dtype = numpy_dtype(self.shard_dtype if dtype is None else _lib.parse_dtype(dtype))
        rank = _int(rank, "rank", 0, self.ranks - 1)
        if len(params) != self.num_params:
            raise ValueError("params: expected %d arrays, got %d" % (self.num_params, len(params)))
        parts = []
        for p, (g, a) in enumerate(zip(self.params, params)):
            a = np.asarray(a).reshape(-1)
            if a.size != g.dim0 * g.inner:
                raise ValueError("params[%d]: %d items, expected D_p K_p = %d"
                                 % (p, a.size, g.dim0 * g.inner))
            part = np.zeros(g.rows_per_rank * g.inner, dtype=dtype)
            lo = min(rank * g.rows_per_rank, g.dim0) * g.inner
            hi = min((rank + 1) * g.rows_per_rank, g.dim0) * g.inner
            part[:hi - lo] = a[lo:hi]
            parts.append(part)
        return np.concatenate(parts)

    def split_output(self, out):
        """Per-parameter (R_p, K_p) views of a packed fp32 reduce-scatter output."""
        out = np.asarray(out)
        return [out[g.fp32_offset // 4:g.fp32_offset // 4 + g.rows_per_rank * g.inner]
                .reshape(g.rows_per_rank, g.inner) for g in self.params]

    def __repr__(self):
        state = "closed" if self._handle is None else "%d params" % len(self.shapes)
        return "<tide.Plan %dx%d, %s>" % (self.config.nodes, self.config.gpus_per_node, state)


# ------------------------------------------------------------------------------- closed forms


def memory_bounds(nodes, gpus_per_node, round_width, inbox_generations):
    """Closed-form live bytes (paper eqs. 10-12) in units of N S, for bf16 and n_stg = 2:
    dict of in_place_staging_ns, slot_reuse_staging_ns, in_place_total_ns,
    slot_reuse_total_ns, fsdp2_total_ns, and the rail lane's (L = 1, M >= 2; rail_lane 1):
    rail_lane_staging_ns, rail_lane_in_place_total_ns, rail_lane_slot_reuse_total_ns."""
    b = _lib.MemoryBoundsStruct()
    _lib.call("tide_memory_bounds", _int(nodes, "nodes", -2**31, 2**31 - 1),
              _int(gpus_per_node, "gpus_per_node", -2**31, 2**31 - 1),
              _int(round_width, "round_width", -2**31, 2**31 - 1),
              _int(inbox_generations, "inbox_generations", -2**31, 2**31 - 1), ctypes.byref(b))
    return _lib.struct_dict(b)


def solve(nodes, gpus_per_node, *, fp32_shard_bytes, bw_nic_gbps, bw_sum_gbps, bw_land_gbps,
          bw_cap_gbps, t_round_ms, wave_width=0, passes=0, grad_dtype="bf16", bw_link_gbps=0.0):
    """The sizing solver (App. G, eqs. 13-14): dict of round_width (k), sum_ctas,
    landing_ctas, t_nic_ms, rounds.  The paper's rates are in PAPER_CALIBRATION, tide.fsdp's
    in DEFAULT_CALIBRATION.  bw_sum_gbps 0 takes the library's rate per sum CTA for
    gpus_per_node sources.  bw_link_gbps (per-GPU NVLink ingress; 0: not given) sizes
    sum_ctas at nodes = 1, where no rail paces the sum (LINK_RATE_GBPS is NVLink 4's)."""
    i32 = (-2**31, 2**31 - 1)
    floats = {}
    for name, v in (("bw_nic_gbps", bw_nic_gbps), ("bw_sum_gbps", bw_sum_gbps),
                    ("bw_land_gbps", bw_land_gbps), ("bw_cap_gbps", bw_cap_gbps),
                    ("t_round_ms", t_round_ms), ("bw_link_gbps", bw_link_gbps)):
        try:
            floats[name] = float(v)
        except (TypeError, ValueError):
            raise ValueError("%s: expected a number, got %r" % (name, v)) from None
    inp = _lib.SolverInputStruct(
        nodes=_int(nodes, "nodes", *i32), gpus_per_node=_int(gpus_per_node, "gpus_per_node", *i32),
        wave_width=_int(wave_width, "wave_width", *i32), passes=_int(passes, "passes", *i32),
        grad_dtype=_lib.parse_dtype(grad_dtype, "grad_dtype"),
        fp32_shard_bytes=_int(fp32_shard_bytes, "fp32_shard_bytes", 0, 2**64 - 1), **floats)
    out = _lib.SolverOutputStruct()
    _lib.call("tide_solve", ctypes.byref(inp), ctypes.byref(out))
    return _lib.struct_dict(out)


def validate_schedule(nodes, gpus_per_node, wave_width=0, round_width=0, mode="in-place",
                      passes=0):
    """Simulate the TIDE-RS inbox of one schedule over two consecutive calls (App. D).
    Zero picks the planner's default (W_wave = L, k = min(2, max(1, M-1)), n_part = 1).
    Returns a dict: accepted (bool), and for a rejection the first colliding wave, subslice,
    gpu and the two contributors; blocks_checked counts simulated landings."""
    i32 = (-2**31, 2**31 - 1)
    m = _int(nodes, "nodes", *i32)
    l = _int(gpus_per_node, "gpus_per_node", *i32)
    w = _int(wave_width, "wave_width", *i32) or l
    k = _int(round_width, "round_width", *i32) or min(2, max(1, m - 1))
    n = _int(passes, "passes", *i32) or 1
    rep = _lib.ValidationStruct()
    _lib.call("tide_validate_schedule", m, l, w, k, _lib.parse_mode(mode), n, ctypes.byref(rep))
    out = _lib.struct_dict(rep)
    out["accepted"] = bool(out["accepted"])
    return out
