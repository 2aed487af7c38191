"""The PyTorch allocator hooks of libtide (tide_torch_pool_*, docs/memory.md "Counted by
PyTorch"), without a GPU: the registry hands out only what was offered, at most its size,
on its device, once; free forgets only what it handed out; and on the CPU fabric there is
no segment to count (tide_group_segment refuses, tide.fsdp counts nothing).

The pointers below are never dereferenced: the hooks only compare them."""

import ctypes
import os

import pytest

torch = pytest.importorskip("torch")

from tide import _lib  # noqa: E402
from tide import torch_binding as tb  # noqa: E402
from tide.fsdp import _pool  # noqa: E402

MIB = 1 << 20
FAKE = 0x7F0000000000  # an address the hooks only compare


def _alloc(size, device=0):
    return _lib.lib().tide_torch_pool_alloc(size, device, None)


def _free(ptr, size, device=0):
    _lib.lib().tide_torch_pool_free(ptr, size, device, None)


def _offer(ptr, nbytes, device=0):
    _lib.call("tide_torch_pool_offer", ptr, nbytes, device)


@pytest.fixture(autouse=True)
def clean_registry():
    yield
    for ptr in (FAKE, FAKE + 64 * MIB):
        _lib.call("tide_torch_pool_withdraw", ptr, None)


def test_hands_out_the_offer_once():
    assert _alloc(12 * MIB) is None  # nothing offered: refused, never allocated
    _offer(FAKE, 12 * MIB)
    assert _pool.state(FAKE) == 1
    assert _alloc(12 * MIB, device=1) is None  # another device
    assert _alloc(12 * MIB + 1) is None  # larger than the segment
    assert _alloc(0) is None
    assert _pool.state(FAKE) == 1
    assert _alloc(12 * MIB) == FAKE
    assert _pool.state(FAKE) == 2
    assert _alloc(12 * MIB) is None  # handed out already: no second time
    # A free of something else, or of the wrong size, is ignored; the right one forgets it.
    _free(FAKE + 4096, 12 * MIB)
    _free(FAKE, 2 * MIB)
    assert _pool.state(FAKE) == 2
    _free(FAKE, 12 * MIB)
    assert _pool.state(FAKE) == 0
    _free(FAKE, 12 * MIB)  # twice: ignored
    assert _alloc(12 * MIB) is None


def test_smaller_request_and_withdraw():
    _offer(FAKE, 12 * MIB)
    with pytest.raises(_lib.TideError, match="already offered"):
        _offer(FAKE, 12 * MIB)
    assert _alloc(10 * MIB) == FAKE  # at most the offer
    left = ctypes.c_int()
    _lib.call("tide_torch_pool_withdraw", FAKE, ctypes.byref(left))
    assert left.value == 2
    _lib.call("tide_torch_pool_withdraw", FAKE, ctypes.byref(left))
    assert left.value == 0


def test_two_pending_offers_are_ambiguous():
    _offer(FAKE, 12 * MIB)
    _offer(FAKE + 64 * MIB, 12 * MIB)
    assert _alloc(12 * MIB) is None
    _lib.call("tide_torch_pool_withdraw", FAKE + 64 * MIB, None)
    assert _alloc(12 * MIB) == FAKE


def test_bad_offers():
    for ptr, nbytes, dev in ((None, MIB, 0), (FAKE, 0, 0), (FAKE, MIB, -1)):
        with pytest.raises(_lib.TideError):
            _offer(ptr, nbytes, dev)
    assert _pool.state(FAKE) == 0


def test_cpu_fabric_has_no_segment():
    comm = tb.Comm(1, 1, 0, "tpool%d" % os.getpid())
    g = comm.register([(6, 4), (5,)], torch.float32, torch.float32)
    try:
        with pytest.raises(_lib.TideError) as info:
            _pool.segment(g)
        assert info.value.code == _lib.Result.UNSUPPORTED
        assert _pool.count(comm, [g]) == []
    finally:
        g.close()
        comm.close()


def test_small_segment_is_not_counted():
    # Under 10 MiB torch would ask the hook for a 20 MiB segment: refused before any CUDA call.
    with pytest.raises(RuntimeError, match="not a multiple of 2 MiB of 10 MiB or more"):
        _pool._count_one(FAKE, 4 * MIB, 0)
    with pytest.raises(RuntimeError, match="not a multiple"):
        _pool._count_one(FAKE, 12 * MIB + 4096, 0)
    assert _pool.state(FAKE) == 0  # nothing was offered
