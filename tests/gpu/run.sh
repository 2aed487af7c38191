#!/usr/bin/env bash
# run.sh OUTDIR - on the GPU machine: build there, run every GPU test and benchmark, write the
# results under OUTDIR (at most a few files: logs are concatenated).
#
#   tests/gpu/run.sh "$OUT"           everything
#   TIDE_GPU_QUICK=1 tests/gpu/run.sh  skip compute-sanitizer and the benchmarks
#   TIDE_GPU_RACECHECK=0               skip the (slow) racecheck of the kernels
#   TIDE_GPU_MEMCHECK_KERNELS=0        skip memcheck of the kernel test (the fabric's still runs)
#   TIDE_GPU_MATRIX_SECONDS=S          time budget of test_fabric_cuda --matrix (default 240)
#   TIDE_GPU_ENQUEUE=0                 skip bench_enqueue (the slowest benchmark, ~45 s)
#
# The kernels build while the library builds.  Steps run in order of what a short device
# lease most needs: the bit-exactness tests, memcheck, the benchmarks, then the slow checks
# (racecheck, the configuration matrix), so a run cut short still reports the essentials.
#
# Safety: NVLink multicast never runs here.  These are exported for every process this
# script starts, and nothing in TIDE calls cuMulticast* or issues multimem instructions.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32
out=${1:?usage: tests/gpu/run.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out"
work=${TIDE_GPU_WORK:-/tmp/tide-gpu}
log="$out/gpu.log"
summary="$out/summary.txt"
: >"$log"
: >"$summary"
status=0

step() { # step NAME CMD... : run, append output to the log, record PASS/FAIL in the summary
    local name=$1; shift
    echo "== $name: $*" | tee -a "$log"
    local t0=$SECONDS
    "$@" >>"$log" 2>&1
    local rc=$?
    printf '%-28s %s (%ds)\n' "$name" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc")" \
        $((SECONDS - t0)) | tee -a "$summary"
    [ $rc -eq 0 ] || status=1
    return $rc
}

{ nvidia-smi; nvcc --version; } >"$out/machine.txt" 2>&1

mkdir -p "$work"
# The kernel build needs no library: run it beside the library build, then record it.
("$root/tests/gpu/build.sh" "$work/k" >"$work/build-kernels.log" 2>&1; echo $? >"$work/build-kernels.rc") &
kpid=$!
step build-library cmake -S "$root" -B "$work/lib" -DTIDE_WITH_CUDA=ON -DTIDE_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
step build-library-make cmake --build "$work/lib" -j"$(nproc)" --target tide_static tide
if [ -x "$root/tests/gpu/build_fabric.sh" ]; then
    step build-fabric "$root/tests/gpu/build_fabric.sh" "$work/lib" "$work/f"
fi
wait $kpid
step build-kernels bash -c "cat '$work/build-kernels.log'; exit \$(cat '$work/build-kernels.rc')"

fab=$work/f/test_fabric_cuda
step test-kernels "$work/k/test_kernels"
[ -x "$fab" ] && step test-fabric-cuda "$fab"

quick=${TIDE_GPU_QUICK:-0}
sanitizer=0
[ "$quick" != 1 ] && command -v compute-sanitizer >/dev/null && sanitizer=1
if [ $sanitizer = 1 ]; then
    [ "${TIDE_GPU_MEMCHECK_KERNELS:-1}" = 1 ] && step memcheck-kernels compute-sanitizer \
        --tool memcheck --error-exitcode 3 "$work/k/test_kernels" --small
    [ -x "$fab" ] && step memcheck-fabric compute-sanitizer \
        --tool memcheck --error-exitcode 3 "$fab" --small
fi
if [ "$quick" != 1 ]; then
    step bench-kernels bash -c "set -o pipefail; '$work/k/bench_kernels' | tee '$out/bench_kernels.txt'"
    [ -x "$work/f/bench_fabric_cuda" ] &&
        step bench-fabric bash -c "set -o pipefail; '$work/f/bench_fabric_cuda' --divisor ${TIDE_BENCH_DIVISOR:-2} --iters 10 | tee '$out/bench_fabric.txt'"
    [ -x "$work/f/bench_interference" ] &&
        step bench-interference bash -c "set -o pipefail; '$work/f/bench_interference' | tee '$out/bench_interference.txt'"
    [ -x "$work/f/bench_enqueue" ] && [ "${TIDE_GPU_ENQUEUE:-1}" = 1 ] &&
        step bench-enqueue bash -c "set -o pipefail; '$work/f/bench_enqueue' | tee '$out/bench_enqueue.txt'; a=\$?; '$work/f/bench_enqueue' --llama 8 | tee -a '$out/bench_enqueue.txt'; exit \$((a | \$?))"
fi
[ $sanitizer = 1 ] && [ "${TIDE_GPU_RACECHECK:-1}" = 1 ] && step racecheck-kernels \
    compute-sanitizer --tool racecheck --error-exitcode 3 "$work/k/test_kernels" --small
[ -x "$fab" ] && step test-fabric-matrix "$fab" --matrix --max-seconds "${TIDE_GPU_MATRIX_SECONDS:-240}"
cat "$summary"
exit $status
