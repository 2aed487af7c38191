#!/usr/bin/env bash
# run_lane_rails.sh OUTDIR - on the GPU machine: the rail lane over the emulated rails
# (TIDE_CUDA_MP_RAILS=1 with the development switch TIDE_RAIL_LANE_OVER_RAILS=1) after the
# schedule fix of docs/protocol.md "Over rails" (the lane's programs only), and the generic programs
# over rails (their order unchanged: a control).  Each with the driver's default hardware queues and with
# CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue per process: the case in which the CPU
# model, tests/unit/test_rails_streams.c, deadlocked the lane before the fix).  The lane
# without rails runs first as the control.  Every process on device 0.
# Results: OUTDIR/lane-rails.log and OUTDIR/lane-rails-summary.txt.
# Safety: NVLink multicast never runs; these are exported for every process started here.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
out=${1:?usage: tests/gpu/run_lane_rails.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${TIDE_GPU_WORK:-/tmp/tide-lane-rails}
mkdir -p "$out" "$work"
log="$out/lane-rails.log"; summary="$out/lane-rails-summary.txt"
: >"$log"; : >"$summary"
status=0
. "$root/tests/gpu/steps.sh"
step_width=26 step_echo=1
step() { # step NAME TIMEOUT CMD...
    local name=$1 limit=$2; shift 2
    run_step "$name" "$log" "$limit" "$@"
}
step configure 120 cmake -S "$root" -B "$work/lib" -DTIDE_WITH_CUDA=ON -DTIDE_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
step build 300 cmake --build "$work/lib" -j"$(nproc)" --target tide_static
t="$work/test_fabric_cuda_mp"
step build-test 120 gcc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -DTIDE_HAVE_CUDA=1 \
    -I"$root/include" -I"$root/src" -I/usr/local/cuda/include "$root/tests/gpu/test_fabric_cuda_mp.c" \
    "$work/lib/libtide_static.a" -L/usr/local/cuda/lib64 -lcuda -lcudart -lpthread -lm -lrt -lstdc++ -o "$t"
step lane-no-rails 150 "$t" --lane --seconds 60
step lane-rails 150 env TIDE_CUDA_MP_RAILS=1 TIDE_RAIL_LANE_OVER_RAILS=1 "$t" --lane --seconds 60
step lane-rails-1conn 150 env TIDE_CUDA_MP_RAILS=1 TIDE_RAIL_LANE_OVER_RAILS=1 CUDA_DEVICE_MAX_CONNECTIONS=1 "$t" --lane --seconds 60
step lane-rails-kernflags 150 env TIDE_CUDA_MP_RAILS=1 TIDE_RAIL_LANE_OVER_RAILS=1 TIDE_CUDA_MP_FLAGS=kernel "$t" --lane --seconds 60
step matrix-rails 150 env TIDE_CUDA_MP_RAILS=1 "$t" --seconds 60
step matrix-rails-1conn 150 env TIDE_CUDA_MP_RAILS=1 CUDA_DEVICE_MAX_CONNECTIONS=1 "$t" --seconds 60
step kill-rails 90 env TIDE_CUDA_MP_RAILS=1 "$t" --kill
echo "summary: $summary" >>"$log"
exit $status
