"""The torch internals Tier 1 replaces, checked against the torch they were written for.

Tier 1 swaps three functions that torch.distributed.fsdp._fully_shard._fsdp_param_group
imported from _fsdp_collectives (foreach_all_gather, foreach_all_gather_copy_out,
foreach_reduce) and overrides two FSDPParam methods per parameter (free_unsharded_param,
alloc_all_gather_outputs).  The replacements reproduce torch 2.11's code around the bytes
they move (foreach_reduce's tail: divide factors, gradient views, accumulation, hooks,
events), so they are only correct for the code they were copied from.  check() compares
signatures, the AllGatherResult fields and a digest of each function's source with what
torch 2.11.0 ships; any difference means "internals differ" and tide.fsdp falls back to
Tier 0 (the public hooks) instead of patching code it does not know.
"""

import hashlib
import inspect

# name -> the parameter names of its signature in torch 2.11.0.
EXPECTED_SIGNATURES = {
    "foreach_all_gather": ("fsdp_params", "group", "async_op", "all_gather_copy_in_stream",
                           "all_gather_stream", "device", "all_gather_comm"),
    "foreach_all_gather_copy_out": ("all_gather_result", "fsdp_params", "group"),
    "foreach_reduce": ("fsdp_params", "unsharded_grads", "reduce_scatter_group",
                       "reduce_scatter_stream", "reduce_scatter_comm", "orig_dtype",
                       "reduce_dtype", "device", "gradient_divide_factor", "all_reduce_group",
                       "all_reduce_stream", "all_reduce_grads", "partial_reduce_output",
                       "all_reduce_hook", "force_sum_reduction_for_comms"),
    "_get_gradient_divide_factors": ("reduce_scatter_group", "all_reduce_group", "reduce_dtype",
                                     "device_type", "factor", "force_sum_reduction_for_comms"),
    "FSDPParam.free_unsharded_param": ("self",),
    "FSDPParam.alloc_all_gather_outputs": ("self",),
    "FSDPParam.init_unsharded_param": ("self",),
    "FSDPParam.to_sharded_dtensor": ("self", "tensor"),
    "FSDPParamGroup.post_backward": ("self", "unused"),
    "FSDPParamGroup.wait_for_unshard": ("self",),
    "FSDPParamGroup.unshard": ("self", "async_op"),
}

ALL_GATHER_RESULT_FIELDS = ("all_gather_output", "all_gather_event", "all_gather_work",
                            "param_all_gather_input_dtypes", "param_all_gather_input_numels",
                            "all_gather_input_split_sizes")

# SHA-256 of inspect.getsource() of the functions whose behaviour the replacements copy, as
# torch 2.11.0 ships them.  A patch release that edits them sends tide.fsdp to Tier 0.
EXPECTED_SOURCE_SHA256 = {
    "foreach_all_gather": "1aa050738aa76be357492ab05ba129b37e62d72bd6d8376e9fbd761cd2416a12",
    "foreach_all_gather_copy_out":
        "c0f79256258369b30d025659edcaa8e243c25b9126977327a16ce9f46e01d026",
    "foreach_reduce": "46bcdaa0df40823e13922359db131cf329f8adf12eefa72ff16ceb41f9650d90",
    "FSDPParam.init_unsharded_param":
        "d597bfb80142791baa2834efaeb5d150fbf0dbcd5ac43853652892e569b74435",
    "FSDPParam.free_unsharded_param":
        "dbd2d26dbf0ed09b615a5ede37f02d44ef99c13c0028fd5826f39406f874f25c",
    "FSDPParamGroup.post_backward":
        "db4367af6f37c6aa64bd226c849e5fa2e133232d6eb0343d8d5fc09a41c37fb6",
    "FSDPParamGroup.wait_for_unshard":
        "92c196c60683a329f5c272079472823c380438a64f18b4feeaa69ce4ea4155c3",
}


def _modules():
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    return _fsdp_collectives, _fsdp_param, _fsdp_param_group


def _resolve(name):
    coll, param, group = _modules()
    if name.startswith("FSDPParam."):
        return getattr(param.FSDPParam, name.split(".", 1)[1], None)
    if name.startswith("FSDPParamGroup."):
        return getattr(group.FSDPParamGroup, name.split(".", 1)[1], None)
    return getattr(coll, name, None)


def source_digest(fn):
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    return hashlib.sha256(src.encode()).hexdigest()


def check():
    """[] when the installed torch has the internals Tier 1 was written for, else a list of
    human-readable differences."""
    problems = []
    try:
        coll, param, group = _modules()
    except ImportError as exc:
        return ["torch.distributed.fsdp._fully_shard is not importable: %s" % exc]
    for name, expected in EXPECTED_SIGNATURES.items():
        fn = _resolve(name)
        if fn is None:
            problems.append("%s is missing" % name)
            continue
        try:
            got = tuple(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            problems.append("%s has no inspectable signature" % name)
            continue
        if got != expected:
            problems.append("%s%s, expected %s" % (name, got, expected))
    fields = getattr(getattr(coll, "AllGatherResult", None), "_fields", None)
    if tuple(fields or ()) != ALL_GATHER_RESULT_FIELDS:
        problems.append("AllGatherResult fields %s, expected %s" % (fields,
                                                                     ALL_GATHER_RESULT_FIELDS))
    for name in ("foreach_all_gather", "foreach_all_gather_copy_out", "foreach_reduce"):
        # _fsdp_param_group must still call the functions of _fsdp_collectives (or our
        # dispatchers): anything else means another library patched them.
        mine = getattr(getattr(group, name, None), "_tide_dispatcher", False)
        if not mine and getattr(group, name, None) is not getattr(coll, name, None):
            problems.append("_fsdp_param_group.%s is not _fsdp_collectives.%s (patched by "
                            "someone else)" % (name, name))
    for name, digest in EXPECTED_SOURCE_SHA256.items():
        fn = _resolve(name)
        got = source_digest(fn) if fn is not None else None
        if got != digest:
            problems.append("the source of %s differs from torch 2.11.0's" % name)
    return problems


def check_public_hooks():
    """[] when FSDPModule has the public hooks Tier 0 uses (torch >= 2.9), else problems."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    except ImportError as exc:
        return ["FSDP2's public communication hooks are not importable: %s" % exc]
    problems = []
    for name in ("set_custom_all_gather", "set_custom_reduce_scatter"):
        fn = getattr(FSDPModule, name, None)
        if fn is None or tuple(inspect.signature(fn).parameters) != ("self", "comm"):
            problems.append("FSDPModule.%s is missing or has another signature" % name)
    for cls, args in ((AllGather, ("self", "output_tensor", "input_tensor", "group",
                                   "async_op")),
                      (ReduceScatter, ("self", "output_tensor", "input_tensor", "group", "op",
                                       "async_op"))):
        got = tuple(inspect.signature(cls.__call__).parameters)
        if got != args:
            problems.append("%s.__call__%s, expected %s" % (cls.__name__, got, args))
    return problems
