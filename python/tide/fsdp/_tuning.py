"""Per-group tuning for enable(tuning=...): the tide_config_t knobs each group registers with.

- None or "solver" (the default): the sizing solver (paper App. G, tide_solve) for the
  group's own size -- its fp32 shard bytes S_fp32 -- on the topology, with the paper's
  calibration and the library's sum rate per CTA for L sources (tide.plan.DEFAULT_CALIBRATION)
  and NVLink 4's rate (tide.plan.LINK_RATE_GBPS),
  or with the rates given as {"solver": {rate: value, ...}}.  It picks the round width k and
  the Level-1 sum and landing CTA budgets; a group the solver refuses keeps the planner's
  defaults (logged).  On one node (M = 1) no rail paces the sum: its CTAs are sized to keep
  pace with the NVLink ingress (bw_link_gbps), 33 / 15 / 10 CTAs at 2 / 4 / 8 GPUs (bf16).
- "default": the planner's defaults (every knob 0).
- a dict of tide_config_t fields (wave_width, round_width, passes, staging_slots, sum_ctas,
  landing_ctas) for every group;
- a callable (group name, fp32 shard bytes) -> such a dict, per group.

The knobs change no result bit (docs/fsdp.md, "Numerics"): the reduction order depends on
the topology and the wave width only, and the solver never sets the wave width.  Every rank
must pass the same tuning; enable() compares them with the group signatures.
"""

import logging

from .. import _lib
from ..plan import DEFAULT_CALIBRATION, LINK_RATE_GBPS, Config, Plan, solve
from ..torch_binding import tide_dtype

logger = logging.getLogger("tide.fsdp")

FIELDS = ("wave_width", "round_width", "passes", "staging_slots", "sum_ctas", "landing_ctas")


def fp32_shard_bytes(spec):
    return 4 * sum(spec.shard_numels)


def fields(config):
    """The tuning fields of a Config, as a dict (what Comm.register takes)."""
    return {f: int(getattr(config, f)) for f in FIELDS}


def _checked(knobs, what):
    if not isinstance(knobs, dict):
        raise ValueError("tuning: %s must be a dict of %s, got %r" % (what, ", ".join(FIELDS),
                                                                     knobs))
    bad = sorted(set(knobs) - set(FIELDS))
    if bad:
        raise ValueError("tuning: %s names %s; the knobs are %s" % (what, ", ".join(bad),
                                                                   ", ".join(FIELDS)))
    for name, value in knobs.items():
        # 0 is tide_config_t's "the library chooses"; anything else the C planner would
        # refuse is refused here, before any collective, instead of a silent stock fallback.
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1024:
            raise ValueError("tuning: %s: %s must be an int in [0, 1024] (0: the library's "
                             "choice), got %r" % (what, name, value))
    return knobs


def _solver_knobs(spec, nodes, gpus_per_node, rates):
    rates = dict(rates)
    # One node: no rail paces the sum; the solver sizes it for the NVLink ingress instead
    # (tide.h, tide_solver_input_t.bw_link_gbps).  Ignored at nodes > 1.
    rates.setdefault("bw_link_gbps", LINK_RATE_GBPS)
    try:
        out = solve(nodes, gpus_per_node, fp32_shard_bytes=fp32_shard_bytes(spec),
                    grad_dtype=tide_dtype(spec.grad_dtype), **rates)
    except (_lib.TideError, ValueError) as exc:
        logger.warning("tide.fsdp: the sizing solver refused group %s (%s); it keeps the "
                       "planner's defaults", spec.name, exc)
        return {}
    return {"round_width": out["round_width"], "sum_ctas": out["sum_ctas"],
            "landing_ctas": out["landing_ctas"]}


def config_for(spec, nodes, gpus_per_node, mode, tuning):
    """The Config group `spec` registers with."""
    if tuning is None or tuning == "solver":
        knobs = _solver_knobs(spec, nodes, gpus_per_node, DEFAULT_CALIBRATION)
    elif isinstance(tuning, dict) and set(tuning) == {"solver"}:
        rates = dict(DEFAULT_CALIBRATION)
        rates.update(tuning["solver"])
        knobs = _solver_knobs(spec, nodes, gpus_per_node, rates)
    elif tuning == "default":
        knobs = {}
    elif isinstance(tuning, dict):
        knobs = _checked(tuning, "the dict")
    elif callable(tuning):
        knobs = _checked(tuning(spec.name, fp32_shard_bytes(spec)),
                         "the callable's result for %s" % spec.name)
    else:
        raise ValueError("tuning: expected None, 'solver', 'default', a dict or a callable, "
                         "got %r" % (tuning,))
    return Config(nodes, gpus_per_node, mode=mode, **knobs)


def plan_refusal(spec, config):
    """None when the library plans the group with `config`, else why it does not (a group
    it refuses -- UNSUPPORTED -- goes to stock FSDP2; anything else is the caller's error)."""
    try:
        with Plan(config, spec.shapes, tide_dtype(spec.ag_dtype), tide_dtype(spec.grad_dtype),
                  tide_dtype(spec.shard_dtype)):
            return None
    except _lib.TideError as exc:
        if exc.code != _lib.Result.UNSUPPORTED:
            raise
        return str(exc)
