#!/usr/bin/env bash
# build_fabric.sh LIBBUILD OUTDIR - build the CUDA-fabric GPU programs against the static
# library built in LIBBUILD (cmake -DTIDE_WITH_CUDA=ON ... --target tide_static).
set -euo pipefail
lib=${1:?usage: build_fabric.sh LIBBUILD OUTDIR}
out=${2:?usage: build_fabric.sh LIBBUILD OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out"
inc=(-I"$root/include" -I"$root/src")
libs=("$lib/libtide_static.a" -lcuda -lcudart -lpthread -lm -lrt)
nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -DTIDE_HAVE_CUDA=1 "${inc[@]}" \
    "$root/tests/gpu/bench_fabric_cuda.cu" "${libs[@]}" -o "$out/bench_fabric_cuda"
if [ -f "$root/tests/gpu/test_fabric_cuda.c" ]; then
    gcc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -DTIDE_HAVE_CUDA=1 "${inc[@]}" \
        -I/usr/local/cuda/include "$root/tests/gpu/test_fabric_cuda.c" "${libs[@]}" \
        -L/usr/local/cuda/lib64 -lstdc++ -o "$out/test_fabric_cuda"
fi
echo "built $out"
