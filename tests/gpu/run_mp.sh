#!/usr/bin/env bash
# run_mp.sh OUTDIR - on the GPU machine: build the library and test_fabric_cuda_mp, then run
# the one-process-per-rank checks (killed and stopped rank, the matrix with batched and per-op
# copies, the matrix and fail-stop with the cross-node puts as rail steps (TIDE_CUDA_MP_RAILS=1),
# the rail lane at 2..4 x 1 with and without rails (--lane),
# enqueue time both ways, legacy IPC, memcheck of a short matrix) with every process on
# device 0; the repeated calls and the killed / stopped rank also under a private MPS daemon;
# device waits that end while every host is outside TIDE and a deregistration timeout
# (test_mp_waits), and the matrix and enqueue figures with the flags in device memory
# (TIDE_CUDA_MP_FLAGS=device) and in host memory with memory-op waits released by the
# poison's CPU stores (TIDE_CUDA_MP_FLAGS=host, with its fail-stop cases, also under MPS)
# beside the default, device flags behind wait kernels that poll the abort word.
# Results: OUTDIR/mp.log and OUTDIR/mp-summary.txt.
#   TIDE_MP_SECONDS=S   matrix budget (default 60); TIDE_MP_LANE_SECONDS=S the lane steps' (60)
#   TIDE_MP_ONLY=REGEX  only the steps whose name matches (the builds always run), e.g.
#                       'lane|rails' for the rail lane over the emulated rails with the
#                       default hardware queues and with one
#                       (CUDA_DEVICE_MAX_CONNECTIONS=1), and the generic programs over rails
# Safety: NVLink multicast never runs; these are exported for every process started here.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
out=${1:?usage: tests/gpu/run_mp.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${TIDE_GPU_WORK:-/tmp/tide-mp}
mkdir -p "$out" "$work"
log="$out/mp.log"; summary="$out/mp-summary.txt"
: >"$log"; : >"$summary"
status=0
. "$root/tests/gpu/steps.sh"
step_width=22 step_echo=1
step() { # step NAME TIMEOUT CMD...
    local name=$1 limit=$2; shift 2
    if [ -n "${TIDE_MP_ONLY:-}" ] && [[ $name != configure && $name != build* ]] &&
        ! [[ $name =~ $TIDE_MP_ONLY ]]; then
        return 0
    fi
    run_step "$name" "$log" "$limit" "$@"
}
step configure 120 cmake -S "$root" -B "$work/lib" -DTIDE_WITH_CUDA=ON -DTIDE_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
step build 300 cmake --build "$work/lib" -j"$(nproc)" --target tide_static
t="$work/test_fabric_cuda_mp"
step build-test 120 gcc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -DTIDE_HAVE_CUDA=1 \
    -I"$root/include" -I"$root/src" -I/usr/local/cuda/include "$root/tests/gpu/test_fabric_cuda_mp.c" \
    "$work/lib/libtide_static.a" -L/usr/local/cuda/lib64 -lcuda -lcudart -lpthread -lm -lrt -lstdc++ -o "$t"
w="$work/test_mp_waits"
step build-test-waits 120 gcc -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE -DTIDE_HAVE_CUDA=1 \
    -I"$root/include" -I"$root/src" -I/usr/local/cuda/include "$root/tests/gpu/test_mp_waits.c" \
    "$work/lib/libtide_static.a" -L/usr/local/cuda/lib64 -lcuda -lcudart -lpthread -lm -lrt -lstdc++ -o "$w"
step mp-waits-idle 90 "$w" --idle
step mp-waits-dereg 90 "$w" --dereg
step mp-kill 90 "$t" --kill
step mp-stop 90 "$t" --stop
step mp-matrix $(( ${TIDE_MP_SECONDS:-60} + 90 )) "$t" --seconds "${TIDE_MP_SECONDS:-60}"
step mp-matrix-per-op $(( ${TIDE_MP_SECONDS:-60} + 90 )) env TIDE_CUDA_BATCH=0 "$t" --seconds "${TIDE_MP_SECONDS:-60}"
step mp-enqueue 120 "$t" --enqueue
step mp-enqueue-per-op 120 env TIDE_CUDA_BATCH=0 "$t" --enqueue
step mp-matrix-ce $(( ${TIDE_MP_SECONDS:-60} + 90 )) env TIDE_CUDA_CE_BATCH=all "$t" --seconds "${TIDE_MP_SECONDS:-60}"
step mp-matrix-rails $(( ${TIDE_MP_SECONDS:-60} + 90 )) env TIDE_CUDA_MP_RAILS=1 "$t" --seconds "${TIDE_MP_SECONDS:-60}"
step mp-kill-rails 90 env TIDE_CUDA_MP_RAILS=1 "$t" --kill
step mp-stop-rails 90 env TIDE_CUDA_MP_RAILS=1 "$t" --stop
step mp-enqueue-rails 120 env TIDE_CUDA_MP_RAILS=1 "$t" --enqueue
step mp-lane 150 "$t" --lane --seconds "${TIDE_MP_LANE_SECONDS:-60}"
step mp-lane-rails 150 env TIDE_CUDA_MP_RAILS=1 "$t" --lane --seconds "${TIDE_MP_LANE_SECONDS:-60}"
step mp-lane-rails-1conn 150 env TIDE_CUDA_MP_RAILS=1 CUDA_DEVICE_MAX_CONNECTIONS=1 "$t" --lane --seconds "${TIDE_MP_LANE_SECONDS:-60}"
step mp-matrix-rails-1conn $(( ${TIDE_MP_SECONDS:-60} + 90 )) env TIDE_CUDA_MP_RAILS=1 CUDA_DEVICE_MAX_CONNECTIONS=1 "$t" --seconds "${TIDE_MP_SECONDS:-60}"
step mp-lane-rails-hostflags 150 env TIDE_CUDA_MP_RAILS=1 TIDE_CUDA_MP_FLAGS=host "$t" --lane --seconds "${TIDE_MP_LANE_SECONDS:-60}"
# Every signal of the program (TIDE_SYNC_ELIDE=0; the steps above run the synchronisation
# elision, the default: docs/sync-elide.md).
step mp-full-matrix $(( ${TIDE_MP_SECONDS:-60} + 90 )) env TIDE_SYNC_ELIDE=0 "$t" --seconds "${TIDE_MP_SECONDS:-60}"
step mp-full-kill 90 env TIDE_SYNC_ELIDE=0 "$t" --kill
step mp-full-stop 90 env TIDE_SYNC_ELIDE=0 "$t" --stop
step mp-legacy-ipc 90 env TIDE_CUDA_IPC=legacy "$t" --seconds 5
step mp-matrix-devflags $(( ${TIDE_MP_SECONDS:-60} + 90 )) env TIDE_CUDA_MP_FLAGS=device "$t" --seconds "${TIDE_MP_SECONDS:-60}"
step mp-enqueue-devflags 120 env TIDE_CUDA_MP_FLAGS=device "$t" --enqueue
step mp-kill-devflags 90 env TIDE_CUDA_MP_FLAGS=device "$t" --kill
step mp-matrix-hostflags $(( ${TIDE_MP_SECONDS:-60} + 90 )) env TIDE_CUDA_MP_FLAGS=host "$t" --seconds "${TIDE_MP_SECONDS:-60}"
step mp-enqueue-hostflags 120 env TIDE_CUDA_MP_FLAGS=host "$t" --enqueue
step mp-kill-hostflags 90 env TIDE_CUDA_MP_FLAGS=host "$t" --kill
step mp-stop-hostflags 90 env TIDE_CUDA_MP_FLAGS=host "$t" --stop
step mp-waits-idle-hostflags 90 env TIDE_CUDA_MP_FLAGS=host "$w" --idle
step mp-waits-dereg-hostflags 90 env TIDE_CUDA_MP_FLAGS=host "$w" --dereg
# No hang under MPS (processes share the SMs) nor time-sliced: 8 processes x 50 AG + RS calls,
# a killed and a stopped rank (tests/gpu/mps.sh starts and stops a private daemon).
# `timeout` runs programs, not shell functions: with_mps runs in a bash of its own.
mps=(bash -c '. "$1"; shift; with_mps "$@"' with_mps "$root/tests/gpu/mps.sh")
step mp-repeat 180 "$t" --repeat 8 50
step mp-repeat-mps 240 "${mps[@]}" "$out/mps-repeat" "$t" --repeat 8 50
step mp-full-repeat-mps 240 env TIDE_SYNC_ELIDE=0 "${mps[@]}" "$out/mps-full-repeat" "$t" --repeat 8 50
step mp-kill-mps 150 "${mps[@]}" "$out/mps-kill" "$t" --kill
step mp-stop-mps 150 "${mps[@]}" "$out/mps-stop" "$t" --stop
step mp-waits-idle-mps 150 "${mps[@]}" "$out/mps-waits-idle" "$w" --idle
step mp-waits-dereg-mps 150 "${mps[@]}" "$out/mps-waits-dereg" "$w" --dereg
step mp-kill-hostflags-mps 150 env TIDE_CUDA_MP_FLAGS=host "${mps[@]}" "$out/mps-kill-hostflags" "$t" --kill
step mp-stop-hostflags-mps 150 env TIDE_CUDA_MP_FLAGS=host "${mps[@]}" "$out/mps-stop-hostflags" "$t" --stop
step mp-repeat-hostflags-mps 240 env TIDE_CUDA_MP_FLAGS=host "${mps[@]}" "$out/mps-repeat-hostflags" "$t" --repeat 8 50
if command -v compute-sanitizer >/dev/null; then
    step mp-memcheck 180 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
        "$t" --seconds 2
    step mp-memcheck-rails 240 env TIDE_CUDA_MP_RAILS=1 compute-sanitizer --tool memcheck \
        --target-processes all --error-exitcode 9 "$t" --seconds 2 --topology 2 2
fi
exit $status
