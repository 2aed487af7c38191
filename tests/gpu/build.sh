#!/usr/bin/env bash
# build.sh OUTDIR - build the GPU kernel test and benchmark with nvcc alone (no CMake, no
# cmocka): OUTDIR/test_kernels and OUTDIR/bench_kernels.
#
# The C references are compiled as C11 by the host compiler, exactly as in the library; the
# kernels with -fmad=false (no FMA contraction) so that GPU output equals the references bit
# for bit.  Target: sm_90 (Hopper: the TMA sum uses cp.async.bulk and mbarrier); override with
# TIDE_CUDA_GENCODE, e.g. "-gencode=arch=compute_90a,code=sm_90a".
set -euo pipefail
out=${1:?usage: tests/gpu/build.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
nvcc=${NVCC:-nvcc}
cc=${CC:-gcc}
gencode=${TIDE_CUDA_GENCODE:--gencode=arch=compute_90,code=sm_90}
mkdir -p "$out/obj"
inc=(-I"$root/include" -I"$root/src")
cflags=(-std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE "${inc[@]}")
nvflags=(-O3 -std=c++17 $gencode -fmad=false -ftz=false -prec-div=true -prec-sqrt=true
         -Xcompiler=-Wall,-Wextra -Werror=all-warnings -D_GNU_SOURCE "${inc[@]}")

objs=()
pids=()
# The references need only dtype.c from core; the rest of the library is not linked, so the
# GPU programs build even while other layers are mid-change.
for src in "$root"/src/kernels/reference.c "$root"/src/core/dtype.c; do
    o="$out/obj/$(basename "$src" .c).c.o"
    "$cc" "${cflags[@]}" -c "$src" -o "$o" & pids+=($!)
    objs+=("$o")
done
for src in "$root"/src/kernels/*.cu; do
    o="$out/obj/$(basename "$src" .cu).cu.o"
    "$nvcc" "${nvflags[@]}" -Xptxas -v -c "$src" -o "$o" 2>"$o.ptxas.txt" & pids+=($!)
    objs+=("$o")
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
if [ "$fail" -ne 0 ]; then
    cat "$out"/obj/*.ptxas.txt >&2 || true
    exit 1
fi
pids=()
for prog in test_kernels bench_kernels; do
    rm -f "$out/$prog"
    "$nvcc" "${nvflags[@]}" "$root/tests/gpu/$prog.cu" "${objs[@]}" -o "$out/$prog" -lpthread &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ "$fail" -eq 0 ] || exit 1
# Registers, shared memory and spills of every kernel, for the record.
grep -h -E "Compiling entry|Used|spill" "$out"/obj/*.ptxas.txt > "$out/ptxas.txt" || true
echo "built $out/test_kernels $out/bench_kernels"
