"""start_gate.py - one common start on the GPU for N processes' timed collectives.

A single-process benchmark puts one GPU hold in front of all N ranks' calls, so every rank's
work starts at the same instant.  N processes each behind a hold of their own start when their
own hold ends, which is when their host left the last barrier: the slowest rank's window then
contains the spread of the processes' barrier exits (hundreds of microseconds at N = 8 under
MPS), which is not the collective's cost.

The gate gives the processes the single-process start: each rank's stream waits
(cuStreamWaitValue32, GEQ) on N words of one shared host page, one per rank, and a rank
writes its word after it has enqueued the timed collective.  Every stream is released when
the last rank has enqueued, within the GPU's polling of host memory (a microsecond or two),
and the host enqueue time stays out of the window, as behind a hold.

If a rank's host blocks inside the call until its GPU work progresses (its word would then
never be written), a timer writes every word after `timeout_ms` and the gate counts the
release as timed out; the window then includes the wait and the caller must say so.

The page is a file in /dev/shm that rank 0 creates and every rank maps and registers with
CUDA (cudaHostRegister, mapped); nothing is allocated on the device.
"""

import ctypes
import mmap
import os
import struct
import threading

_STRIDE = 64  # one cache line per rank's word
_GEQ = 0x0    # CU_STREAM_WAIT_VALUE_GEQ


def create(path, world):
    """Rank 0 (or the launcher): the zeroed page for `world` ranks."""
    with open(path, "wb") as f:
        f.write(b"\0" * max(mmap.PAGESIZE, world * _STRIDE))


class Gate:
    def __init__(self, path, rank, world, timeout_ms=200.0):
        import torch

        self.rank, self.world, self.timeout_ms = rank, world, timeout_ms
        self.seq = 0
        self.timed_out = 0
        self._fd = os.open(path, os.O_RDWR)
        size = os.fstat(self._fd).st_size
        self._mm = mmap.mmap(self._fd, size)
        self._host = ctypes.addressof(ctypes.c_char.from_buffer(self._mm))
        err = torch.cuda.cudart().cudaHostRegister(self._host, size, 0x3)  # portable, mapped
        if int(err) != 0:
            raise RuntimeError("start_gate: cudaHostRegister failed (%s)" % err)
        self._size = size
        cuda = ctypes.CDLL("libcuda.so.1")
        dptr = ctypes.c_uint64()
        if cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(self._host),
                                             0) != 0:
            raise RuntimeError("start_gate: cuMemHostGetDevicePointer failed")
        self._dev = dptr.value
        self._wait = getattr(cuda, "cuStreamWaitValue32_v2", None) or cuda.cuStreamWaitValue32
        self._wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                               ctypes.c_uint]
        self._timer = None

    def close(self):
        import torch

        if self._timer is not None:
            self._timer.cancel()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaHostUnregister(self._host)
        self._mm.close()
        os.close(self._fd)

    def hold(self, stream):
        """Enqueue on `stream`: wait until every rank has opened this gate (the next call of
        opened() on each rank)."""
        self.seq += 1
        for r in range(self.world):
            rc = self._wait(ctypes.c_void_p(stream.cuda_stream), self._dev + r * _STRIDE,
                            self.seq, _GEQ)
            if rc != 0:
                raise RuntimeError("start_gate: cuStreamWaitValue32 failed (%d)" % rc)
        seq = self.seq
        self._timer = threading.Timer(self.timeout_ms / 1e3, self._release_all, (seq,))
        self._timer.daemon = True
        self._timer.start()

    def opened(self):
        """This rank has enqueued the timed work: its word says so."""
        struct.pack_into("<I", self._mm, self.rank * _STRIDE, self.seq)

    def finished(self):
        """After the timed work completed: stop this call's timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _release_all(self, seq):
        # Only a gate whose words are not all written yet counts as timed out.
        words = [struct.unpack_from("<I", self._mm, r * _STRIDE)[0] for r in range(self.world)]
        if min(words) >= seq:
            return
        self.timed_out += 1
        for r in range(self.world):
            if words[r] < seq:
                struct.pack_into("<I", self._mm, r * _STRIDE, seq)
