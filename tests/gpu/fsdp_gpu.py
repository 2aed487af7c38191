"""fsdp_gpu.py - what the tide.fsdp GPU scripts share (bench_fsdp_layers.py,
bench_fsdp_memory.py, fsdp_parity_gpu.py, fsdp_pool_gpu.py): importing it puts python/ and
python/tests first on sys.path (tide, fsdp_harness, fsdp_model, fsdp_train); SAFETY, the
variables that keep NVLink multicast off in every process, and their check; the library
named by --lib; and the settings under which two runs of one process compute the same bits.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for _path in (os.path.join(ROOT, "python", "tests"), os.path.join(ROOT, "python")):
    sys.path.insert(0, _path)

SAFETY = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
          "NVSHMEM_DISABLE_NVLS": "1"}


def check_safety():
    """Raises RuntimeError unless every SAFETY variable is set as it must be (in a rank)."""
    for k, v in SAFETY.items():
        if os.environ.get(k) != v:
            raise RuntimeError("%s must be %s in every process" % (k, v))


def check_safety_or_exit():
    """The same check in the script's own process: a wrong variable ends the script."""
    for k, v in SAFETY.items():
        if os.environ.get(k) != v:
            sys.exit("%s must be %s (NVLink multicast stays off)" % (k, v))


def use_lib(lib):
    """--lib, when given, is the libtide.so that tide loads (TIDE_LIBRARY)."""
    if lib:
        os.environ["TIDE_LIBRARY"] = os.path.abspath(lib)


def deterministic_cuda():
    """GPU 0, no TF32, the math SDPA kernel, deterministic algorithms: a process's stock and
    TIDE runs compute the same gradients from the same parameters."""
    import torch

    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.use_deterministic_algorithms(True, warn_only=True)


def finish(report, json_path, status):
    """Writes the report to json_path (when given), then exits with status."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1, default=str)
    sys.exit(status)
