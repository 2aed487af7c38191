#!/usr/bin/env python3
"""fsdp_issue26_gpu.py - issue 26's GPU checks: compiled blocks and a bf16 reduce dtype,
tide.fsdp against stock FSDP2 on one GPU, world 2 as two processes on the one device.

The harness, checks and reference are fsdp_parity_gpu.py's (read its header: gloo over CUDA
tensors for stock, TIDE's CUDA fabric for TIDE, deterministic kernels, every group on TIDE,
no gloo collective moving FSDP2's bytes, fixed landing addresses, parameters after every
step bit-equal to stock).  Only the configurations differ, all at world 2 where they are
bit-exact on the CPU (python/tests/test_fsdp_compile.py, test_fsdp_reduce_dtype.py):

- torch.compile (inductor on the GPU): each block compiled then fully_shard ("before", as
  torchtitan), fully_shard then each block compiled ("after"), the whole model ("whole");
  stock and TIDE compile the same graphs, so the same kernels run on both sides;
- MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16) in both modes and Tier 0, and
  fp32 masters with reduce_dtype=bf16 (TIDE rounds where stock rounds).

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        python3 tests/gpu/fsdp_issue26_gpu.py --lib LIBTIDE_CUDA.so [--steps 20] [--json F]

Exit status 0 when every check passed.  Same options as fsdp_parity_gpu.py (--worlds is
fixed to 2 here: the configurations are bit-exact at world 2 only).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fsdp_parity_gpu  # noqa: E402


def _configs(world, steps, device="cuda"):
    out = []
    for how in ("before", "after", "whole"):
        out.append(dict(tide_mode="in_place", compile=how))
    out.append(dict(tide_mode="slot_reuse", compile="before", mp=("bf16", "fp32")))
    for mode in ("in_place", "slot_reuse"):
        out.append(dict(tide_mode=mode, mp=("bf16", "bf16")))
    out += [dict(tide_mode="in_place", tier=0, mp=("bf16", "bf16")),
            dict(tide_mode="slot_reuse", mp=(None, "bf16"))]
    return [(dict(c, steps=steps, device=device), True) for c in out]


if __name__ == "__main__":
    fsdp_parity_gpu._configs = _configs
    if "--worlds" not in sys.argv:
        sys.argv += ["--worlds", "2"]
    fsdp_parity_gpu.main()
