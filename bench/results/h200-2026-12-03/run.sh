#!/usr/bin/env bash
# run.sh OUT [STEPS] - the H200 commands of this folder's results, on one GPU, from the
# repository root: build (CMake, -DTIDE_WITH_CUDA=ON; tests/gpu/build_fabric.sh), then the
# steps named in STEPS (default: all), each with its output in OUT/<step>.txt.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
out=${1:?usage: run.sh OUT [STEPS]}
steps=${2:-test,matrix,memcheck,bench,ctas,torch}
mkdir -p "$out"
b=/tmp/tide-b
step() { # step NAME CMD...
    local name=$1; shift
    case ",$steps," in *",$name,"*) ;; *) return 0 ;; esac
    echo "== $name: $*" | tee -a "$out/summary.txt"
    local t0=$SECONDS
    "$@" >"$out/$name.txt" 2>&1
    echo "   rc=$? ($((SECONDS - t0))s)" | tee -a "$out/summary.txt"
    tail -4 "$out/$name.txt"
}
{ nvidia-smi; nvcc --version; } >/tmp/tide-build.txt 2>&1; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$out/summary.txt" 2>&1
cmake -S . -B $b/lib -DTIDE_WITH_CUDA=ON -DTIDE_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >>/tmp/tide-build.txt 2>&1
cmake --build $b/lib -j16 --target tide_static tide >>/tmp/tide-build.txt 2>&1 || { tail -30 /tmp/tide-build.txt; exit 1; }
tests/gpu/build_fabric.sh $b/lib $b/f >>/tmp/tide-build.txt 2>&1 || { tail -30 /tmp/tide-build.txt; exit 1; }
f=$b/f
step test $f/test_fabric_cuda 5151
step matrix $f/test_fabric_cuda --matrix --max-seconds ${MATRIX_SECONDS:-90} 5152
step memcheck compute-sanitizer --tool memcheck --error-exitcode 3 $f/test_fabric_cuda --small 5153
# Before (no-direct) and after (batched = the default shortcuts), the breakdown modes between,
# and the opt-in fusion (direct-fused). run1 and run2 ran the earlier mode lists named in README.md.
step bench $f/bench_fabric_cuda --divisor 2 --iters 10 --sum-ctas 16 --landing-ctas 16 \
    --modes batched,no-direct,direct-sum,direct-sum-zero,direct-fused,per-op
step ctas bash -c "for c in '4 4' '8 8' '16 8' '16 16' '32 16'; do set -- \$c; $f/bench_fabric_cuda --divisor 2 --iters 10 --sum-ctas \$1 --landing-ctas \$2 --modes batched || exit 1; done"
step torch python3 tests/gpu/bench_torch_baseline.py --lib $b/lib/libtide.so --divisor 2 \
    --iters 10 --sum-ctas ${SUM_CTAS:-16} --landing-ctas ${LANDING_CTAS:-16} --json /tmp/torch.json
# The kernels (nvcc alone) and their racecheck.
case ",$steps," in *",kernels,"*|*",racecheck,"*) tests/gpu/build.sh $b/k >>/tmp/tide-build.txt 2>&1 || { tail -30 /tmp/tide-build.txt; exit 1; } ;; esac
step kernels $b/k/test_kernels
step racecheck timeout ${RACECHECK_SECONDS:-180} compute-sanitizer --tool racecheck --error-exitcode 3 $b/k/test_kernels --small
cat "$out/summary.txt"
