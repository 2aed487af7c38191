#!/usr/bin/env bash
# build_fabric.sh LIBBUILD OUTDIR - build the CUDA-fabric GPU programs against the static
# library built in LIBBUILD (cmake -DTIDE_WITH_CUDA=ON ... --target tide_static).
# Each program builds on its own: one that fails to compile is reported and the others are
# still built; the exit status is non-zero if any failed.
set -uo pipefail
lib=${1:?usage: build_fabric.sh LIBBUILD OUTDIR}
out=${2:?usage: build_fabric.sh LIBBUILD OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out"
inc=(-I"$root/include" -I"$root/src")
libs=("$lib/libtide_static.a" -lcuda -lcudart -lpthread -lm -lrt)
nvflags=(-O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -DTIDE_HAVE_CUDA=1 "${inc[@]}")
built=()
failed=()
build() { # build NAME CMD...: a stale binary never survives a failed build
    local name=$1; shift
    rm -f "$out/$name"
    if "$@"; then built+=("$name"); else failed+=("$name"); fi
}
build bench_fabric_cuda nvcc "${nvflags[@]}" "$root/tests/gpu/bench_fabric_cuda.cu" "${libs[@]}" \
    -o "$out/bench_fabric_cuda"
# bench_interference.cu includes interference_{comm,lt,probe}.cuh; warnings are errors.
build bench_interference nvcc "${nvflags[@]}" -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror \
    "$root/tests/gpu/bench_interference.cu" "${libs[@]}" -lcublasLt -lcublas \
    -o "$out/bench_interference"
build bench_enqueue nvcc "${nvflags[@]}" "$root/tests/gpu/bench_enqueue.cu" "${libs[@]}" \
    -o "$out/bench_enqueue"
if [ -f "$root/tests/gpu/test_fabric_cuda.c" ]; then
    build test_fabric_cuda gcc -std=c11 -O2 -D_GNU_SOURCE -DTIDE_HAVE_CUDA=1 "${inc[@]}" \
        -I/usr/local/cuda/include "$root/tests/gpu/test_fabric_cuda.c" "${libs[@]}" \
        -L/usr/local/cuda/lib64 -lstdc++ -o "$out/test_fabric_cuda"
fi
if [ -f "$root/tests/gpu/test_fabric_cuda_mp.c" ]; then
    build test_fabric_cuda_mp gcc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -DTIDE_HAVE_CUDA=1 \
        "${inc[@]}" -I/usr/local/cuda/include "$root/tests/gpu/test_fabric_cuda_mp.c" "${libs[@]}" \
        -L/usr/local/cuda/lib64 -lstdc++ -o "$out/test_fabric_cuda_mp"
fi
echo "built in $out: ${built[*]:-none}${failed[*]:+; FAILED: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]
