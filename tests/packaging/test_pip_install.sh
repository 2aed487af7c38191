#!/usr/bin/env bash
# `pip install .` from the repository root into a fresh virtual environment, then check that
# the installed package loads its own libtide (not the repository's build/), that tide-plan
# and tide-bench run as installed commands and as `python -m tide.bench`, and that the
# bench's data check passes.  CPU build (-DTIDE_WITH_CUDA=OFF): CI has no GPU driver.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=$(mktemp -d)/venv
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q -Ccmake.define.TIDE_WITH_CUDA=OFF "$root"
cd "$(dirname "$venv")"   # away from the checkout, so only the installed package is seen
unset TIDE_LIBRARY
"$venv/bin/python" - <<'PY'
import pathlib, sys, tide
lib = pathlib.Path(tide.library_path()).resolve()
pkg = pathlib.Path(tide.__file__).resolve().parent
assert lib == pkg / "lib" / "libtide.so", (lib, pkg)
assert tide.version() == (0, 1, 0), tide.version()
with tide.Plan(tide.Config(2, 4), [(64, 8), (16,)]) as plan:
    assert plan.summary["ranks"] == 8
sc = pkg / "fsdp" / "sitecustomize" / "sitecustomize.py"
assert sc.is_file(), sc  # the TIDE_FSDP switch (docs/fsdp.md) ships with the package
import importlib.util
assert importlib.util.find_spec("tide.fsdp") is not None
assert importlib.util.find_spec("tide.torch_binding") is not None
print("installed package OK:", lib)
PY
"$venv/bin/tide-plan" memory --nodes 8 --gpus-per-node 8 --round-width 2 --inbox-generations 2 >/dev/null
"$venv/bin/tide-bench" --divisors 4096 --iters 1 --warmup 0 --quiet
"$venv/bin/python" -m tide.bench --divisors 4096 --iters 1 --warmup 0 --quiet
echo "pip install . OK"
