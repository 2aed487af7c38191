#!/usr/bin/env bash
# The main job: install dependencies, build, and run tide-bench on its embedded default
# (CPU fabric, 2x4 topology, llama3-70b-layer scaled down, TIDE vs the stock FSDP2 path).
# Extra arguments go to tide-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -DTIDE_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target tide-bench >/dev/null
exec ./build/tide-bench "$@"
