#!/usr/bin/env bash
# run_arena_mp.sh OUTDIR - on the GPU machine: shared arenas on the one-process-per-rank CUDA
# fabric and the NCCL fabric (src/fabric/cuda/mp_view.c, docs/arena.md "Fabrics").  Builds the
# library and the GPU tests, then runs, every process on device 0:
#   arena-mp          test_arena_cuda_mp: 1x2, 1x4, 2x2 processes, both modes, a set of 3
#                     groups (ring slots 0, 1, 0) in FSDP order, bit-equal to each group alone
#   arena-mp-per-op   the same with TIDE_CUDA_BATCH=0 (one cudaMemcpyAsync per copy)
#   arena-mp-legacy   the same over legacy IPC segments (TIDE_CUDA_IPC=legacy)
#   arena-mp-kill     a killed rank fails the whole set, no hang, streams drain
#   arena-mp-rails    with TIDE_CUDA_MP_RAILS=1 a set is refused on every rank
#   arena-nccl        the views on the NCCL fabric's one-rank communicator (if built with NCCL)
#   arena-cuda        the single-process fabric's shared arenas (regression)
#   mp-matrix, mp-kill  test_fabric_cuda_mp: lone groups, whose flag area grew by one program
# Results: OUTDIR/arena-mp.log and OUTDIR/arena-mp-summary.txt (one PASS / FAIL line a step).
# Safety: NVLink multicast never runs; these are exported for every process started here.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
out=${1:?usage: tests/gpu/run_arena_mp.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${TIDE_GPU_WORK:-/tmp/tide-arena-mp}
mkdir -p "$out" "$work"
log="$out/arena-mp.log"; summary="$out/arena-mp-summary.txt"
: >"$log"; : >"$summary"
status=0
. "$root/tests/gpu/steps.sh"
step_width=18 step_echo=1
step() { # step NAME TIMEOUT CMD...
    local name=$1 limit=$2; shift 2
    run_step "$name" "$log" "$limit" "$@"
}
b="$work/build"
step configure 120 cmake -S "$root" -B "$b" -DTIDE_WITH_CUDA=ON -DTIDE_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
step build 400 cmake --build "$b" -j"$(nproc)" --target test_arena_cuda_mp test_arena_cuda \
    test_fabric_cuda_mp
t="$b/tests/gpu/test_arena_cuda_mp"
step arena-mp 240 "$t"
step arena-mp-per-op 240 env TIDE_CUDA_BATCH=0 "$t"
step arena-mp-legacy 240 env TIDE_CUDA_IPC=legacy "$t"
step arena-mp-kill 120 "$t" --kill
step arena-mp-rails 120 "$t" --rails
if grep -q "^TIDE_WITH_NCCL:BOOL=ON" "$b/CMakeCache.txt" 2>/dev/null; then
    step arena-nccl 240 "$t" --nccl
fi
step arena-cuda 240 "$b/tests/gpu/test_arena_cuda"
step mp-matrix 150 "$b/tests/gpu/test_fabric_cuda_mp" --seconds 30
step mp-kill 90 "$b/tests/gpu/test_fabric_cuda_mp" --kill
grep -h "^PASS\|^FAIL\|failure(s)" "$log" >>"$summary"
exit $status
