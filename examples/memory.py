"""Peak memory of one training step, per rank, as train.py reports it.

On the CPU: the process's peak resident set (VmHWM), reset at every step start through
/proc/self/clear_refs (Linux; elsewhere getrusage's lifetime peak, which never goes down).
It counts what this rank touched: its heap, torch's tensors and the pages of TIDE's POSIX
shared-memory arenas it wrote or read.

On the GPU: torch's allocator peak (max_memory_allocated / max_memory_reserved, reset every
step) and the device's used memory (NVML through torch.cuda.device_memory_used when pynvml is
installed, else cudaMemGetInfo's total - free: the same figure) sampled after the step.
TIDE's arenas are plain cudaMalloc allocations outside torch's allocator, so torch's peak
does not include them and the device figure does; the device figure is the whole GPU's (every
process on it, the CUDA contexts too), sampled, not a peak.
"""

import re
import resource
import sys

import torch

MIB = float(1 << 20)


def _vm_hwm():
    try:
        with open("/proc/self/status") as f:
            return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024
    except (OSError, AttributeError):
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB else
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _current_rss():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        return _vm_hwm()


def _reset_vm_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # "5": reset the peak RSS to the current RSS (Linux >= 4.0)
    except OSError:
        pass


def _device_used(device):
    try:
        return torch.cuda.device_memory_used(device)
    except Exception:  # no pynvml / NVML: cudaMemGetInfo gives the same device-wide figure
        free, total = torch.cuda.mem_get_info(device)
        return total - free


_START = []


def _start_rss():
    """The RSS when the first run of this process began, before any model existed."""
    if not _START:
        _START.append(_current_rss())
    return _START[0]


class StepMemory:
    """reset() at a step start, sample() after it: {metric: bytes}.  Made before the model is
    built: on the CPU, "rss_peak_over_start" is the step's peak RSS less the RSS before the
    process's first run (the imported libraries' few hundred MiB are the same for every run
    and would hide the model's share).  A second run in the same process (torchrun) counts
    from the same start, so what the first one left allocated is charged to the second."""

    def __init__(self, device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.start = None if self.cuda else _start_rss()

    def metrics(self):
        if self.cuda:
            return ["torch_peak_allocated", "torch_peak_reserved", "device_used"]
        return ["rss_peak_over_start", "rss_peak"]

    def console_metrics(self):
        """The per-step line's: on the GPU both torch's and the device's (TIDE's arenas are
        only in the latter)."""
        return ["torch_peak_allocated", "device_used"] if self.cuda else ["rss_peak_over_start"]

    def reset(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _reset_vm_hwm()

    def sample(self):
        if self.cuda:
            return {"torch_peak_allocated": torch.cuda.max_memory_allocated(self.device),
                    "torch_peak_reserved": torch.cuda.max_memory_reserved(self.device),
                    "device_used": _device_used(self.device)}
        peak = _vm_hwm()
        return {"rss_peak_over_start": peak - self.start, "rss_peak": peak}


def release_cached(device):
    """Between two runs in the same process: give cached memory back so that the second run's
    figures do not include the first one's leftovers."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    else:
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
