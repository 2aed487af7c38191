"""The shared arena in PyTorch's memory accounting (docs/memory.md "Counted by PyTorch").

On the one-process-per-rank CUDA fabric and the NCCL fabric the library allocates each
rank's arena segment itself (one cuMemCreate / ncclMemAlloc allocation, exported to the
peers), so torch.cuda.memory_reserved() and memory snapshots would not see it.  After the
set is registered, count() makes the segment's bytes appear there without giving up that
allocation: it allocates one uint8 tensor of the segment's size in a torch.cuda.MemPool
whose CUDAPluggableAllocator is libtide's tide_torch_pool_alloc / tide_torch_pool_free.
Those hooks never allocate: right before the tensor is allocated, count() offers the
segment (tide_torch_pool_offer: "the next allocation of at most B bytes is this
pointer"), the alloc hook hands it out, the free hook only forgets it.  The tensor is never
read or written (not even by torch.empty's deterministic fill, turned off for it); it lives
exactly as long as the arena: release() drops it (and the pool, whose destruction returns
the segment through the free hook) before the groups are deregistered, and the fabric frees
the memory there.

Sizes.  The caching allocator rounds a request before it calls the hook: a request of more
than 10 MiB becomes a multiple of 2 MiB, smaller ones a 2 MiB or 20 MiB segment.  The
fabric's segment is a multiple of 2 MiB (its allocation unit), so a request of exactly its
size reaches the hook unchanged; a segment under 10 MiB is not counted (a 20 MiB request
would exceed it; the hook would refuse it), and the hook refuses any size above the offer
in any case.  A pool with a pluggable allocator never uses expandable segments.

This is accounting only: when it cannot be set up (the CPU fabric, a fabric without
segments, a torch without MemPool, a refusal) enable() goes on, one log line says why, and
memory_report's "counted_by_torch" is False.

On by default; TIDE_FSDP_TORCH_POOL=0 turns it off.  Its assumptions about torch's caching
allocator (one hook call of exactly the segment's size, the segment returned through the free
hook when the pool goes) are checked by tests/gpu/fsdp_pool_gpu.py on a GPU (passed on an
H100 with torch 2.11: bench/results/h100-2026-12-06e).
"""

import contextlib
import ctypes
import logging
import os

import torch

from .. import _lib

logger = logging.getLogger("tide.fsdp")

_MIN_LARGE = 10 << 20  # the caching allocator's kMinLargeAlloc
_ROUND_LARGE = 2 << 20  # its kRoundLarge
_ALLOCATOR = []  # one CUDAPluggableAllocator per process


class Counted:
    """One arena segment counted by torch: `ptr`, `bytes`, `device`, with the pool and the
    tensor that hold it."""

    def __init__(self, ptr, nbytes, device, pool, tensor):
        self.ptr, self.bytes, self.device = ptr, nbytes, device
        self.pool, self.tensor = pool, tensor


def segment(group):
    """(ptr, bytes, device) of this rank's segment holding `group`'s arena (TorchGroup);
    TideError UNSUPPORTED on fabrics without one."""
    ptr, nbytes, dev = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_int()
    _lib.call("tide_group_segment", group._h(), ctypes.byref(ptr), ctypes.byref(nbytes),
              ctypes.byref(dev))
    return ptr.value, nbytes.value, dev.value


def _allocator():
    if not _ALLOCATOR:
        from torch.cuda.memory import CUDAPluggableAllocator

        _ALLOCATOR.append(CUDAPluggableAllocator(_lib.library_path(), "tide_torch_pool_alloc",
                                                 "tide_torch_pool_free"))
    return _ALLOCATOR[0]


def _new_pool():
    try:  # never split the segment: the tensor is the whole of it
        return torch.cuda.MemPool(_allocator().allocator(), no_split=True)
    except TypeError:  # a torch without no_split
        return torch.cuda.MemPool(_allocator().allocator())


@contextlib.contextmanager
def _no_fill():
    """torch.empty writes a fill pattern into new memory under deterministic algorithms
    (torch.utils.deterministic.fill_uninitialized_memory): here that memory is the live
    arena, so the fill is off for this one allocation."""
    det = getattr(torch.utils, "deterministic", None)
    if det is None or not hasattr(det, "fill_uninitialized_memory"):
        yield
        return
    saved = det.fill_uninitialized_memory
    det.fill_uninitialized_memory = False
    try:
        yield
    finally:
        det.fill_uninitialized_memory = saved


def _count_one(ptr, nbytes, device):
    if nbytes < _MIN_LARGE or nbytes % _ROUND_LARGE:
        raise RuntimeError("a segment of %d bytes is not a multiple of 2 MiB of 10 MiB or more, "
                           "which torch's caching allocator would round to another size" % nbytes)
    c = Counted(ptr, nbytes, device, _new_pool(), None)
    _lib.call("tide_torch_pool_offer", ptr, nbytes, device)
    try:
        dev = torch.device("cuda", device)
        with torch.cuda.use_mem_pool(c.pool, device=dev), _no_fill():
            c.tensor = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        if c.tensor.data_ptr() != ptr:
            raise RuntimeError("the pool's tensor is at 0x%x, not at the segment 0x%x"
                               % (c.tensor.data_ptr(), ptr))
    except BaseException:
        _drop(c)
        raise
    return c


def count(comm, groups):
    """[Counted] for the segments of `groups` (TorchGroups of one communicator), or [] with
    one log line when the accounting cannot be set up."""
    if comm.device.type != "cuda" or not groups:
        return []
    if os.environ.get("TIDE_FSDP_TORCH_POOL", "1") == "0":
        logger.info("tide.fsdp: the arena is not counted by torch (TIDE_FSDP_TORCH_POOL=0)")
        return []
    out = []
    try:
        if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
            raise RuntimeError("torch %s has no torch.cuda.MemPool" % torch.__version__)
        segs = {}
        for g in groups:  # the groups of a set share one segment
            ptr, nbytes, dev = segment(g)
            segs.setdefault(ptr, (nbytes, dev))
        for ptr, (nbytes, dev) in segs.items():
            out.append(_count_one(ptr, nbytes, dev))
    except Exception as exc:
        release(out)
        logger.warning("tide.fsdp: the arena is not counted by torch.cuda.memory_reserved() "
                       "(%s); memory_report names it on its own line", exc)
        return []
    logger.info("tide.fsdp: %d arena segment(s), %d bytes, counted by torch's allocator",
                len(out), sum(c.bytes for c in out))
    return out


def state(ptr):
    """The registry's state of `ptr`: 0 unknown (or freed by torch), 1 offered, 2 held by
    torch."""
    out = ctypes.c_int()
    _lib.call("tide_torch_pool_state", ptr, ctypes.byref(out))
    return out.value


def _drop(c):
    """Drop the tensor, then the pool (its destruction returns the segment through the free
    hook), then make sure the registry forgot the pointer."""
    c.tensor = None
    c.pool = None
    if state(c.ptr) == 2:
        # A torch whose pool destruction keeps free segments cached until empty_cache().
        torch.cuda.empty_cache()
    left = ctypes.c_int()
    _lib.call("tide_torch_pool_withdraw", c.ptr, ctypes.byref(left))
    if left.value == 2:
        # torch kept the segment's record (a pool still referenced elsewhere): its figures
        # over-count until it lets go; the hooks never free, so nothing else happens.
        logger.warning("tide.fsdp: torch did not return the arena segment 0x%x to its pool's "
                       "allocator; torch.cuda.memory_reserved() keeps counting %d bytes",
                       c.ptr, c.bytes)


def release(counted):
    """Undo count() (before the groups are deregistered)."""
    while counted:
        _drop(counted.pop())
