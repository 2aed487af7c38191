#!/usr/bin/env bash
# Install torch 2.11 for the CPU FSDP2 tests, as light as it can be (idempotent).
#
# PyPI's Linux torch wheel is the CUDA build.  Its full install pulls about 3 GB of nvidia-*
# wheels; on a CPU-only test machine it runs on the CPU anyway.  It imports with only the
# CUDA libraries its shared objects link against, and the CUDA toolkit of our build machines
# (/usr/local/cuda, on the loader's path) already has most of them: cudart, cublas, cufft,
# curand, cusparse, cudnn, nccl, nvrtc, cupti.  So install torch without its dependencies,
# plus the three libraries the toolkit lacks (cusparseLt, cuFile, NVSHMEM: about 300 MB) and
# torch's pure-Python needs.  If that import still fails (another machine), fall back to the
# full install.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.11.0
pip_install() {
  python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}
have_torch() {
  python3 - "$TORCH_VERSION" <<'PY' >/dev/null 2>&1
import sys
import torch, torch.distributed as dist
assert torch.__version__.split("+")[0] == sys.argv[1], torch.__version__
assert dist.is_gloo_available()
from torch.distributed.fsdp import fully_shard  # noqa: F401
PY
}
if have_torch; then
  echo "torch $TORCH_VERSION: already installed"
  exit 0
fi
t0=$SECONDS
pip_install -r python/requirements-torch.txt
pip_install --no-deps "torch==$TORCH_VERSION" nvidia-cusparselt-cu13==0.8.0 \
  nvidia-cufile==1.20.0.107 nvidia-nvshmem-cu13==3.4.5
if ! have_torch; then
  echo "torch without its CUDA wheels does not import here; installing the full wheel set"
  pip_install "torch==$TORCH_VERSION"
fi
have_torch || { echo "torch $TORCH_VERSION does not import" >&2; exit 1; }
echo "torch $TORCH_VERSION installed in $((SECONDS - t0)) s"
