#!/usr/bin/env bash
# run_fsdp.sh OUTDIR - on the GPU machine: build libtide with the CUDA fabric, then run the
# tide.fsdp parity test (tests/gpu/fsdp_parity_gpu.py, world sizes 2, 4, 8 as processes on
# device 0), the per-layer benchmark (tests/gpu/bench_fsdp_layers.py) and the whole-model
# memory benchmark (tests/gpu/bench_fsdp_memory.py: stock vs In-Place vs Slot-Reuse, 171 M
# parameters, world 2 and 4).  Every step runs under `timeout` inside one overall budget,
# and a failing step does not stop the next.
#   TIDE_FSDP_BUDGET=S   overall seconds (default 560)
#   TIDE_FSDP_STEPS="a b" only these steps after the build (parity-w2 parity-w4 bench memory
#                        parity-w8 pool graph; default all but pool, the arena in torch's
#                        accounting: tests/gpu/fsdp_pool_gpu.py, pool.log, pool.json, and
#                        graph, a whole FSDP2 step captured into a CUDA graph with TIDE
#                        inside and replayed: tests/gpu/fsdp_graph_gpu.py, graph.log,
#                        graph.json; and issue26, compiled blocks and a bf16 reduce dtype
#                        against stock at world 2: tests/gpu/fsdp_issue26_gpu.py,
#                        issue26.log, issue26.json; inductor compiles on the GPU, so give it
#                        the budget: TIDE_FSDP_STEPS="issue26" TIDE_FSDP_BUDGET=560)
# Results: OUTDIR/summary.txt, build.log, parity.log, parity.json, bench.log, bench.json,
# memory.log, fsdp_memory.json, fsdp_memory.txt.
# Safety: NVLink multicast never runs; these are exported for every process started here.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHONUNBUFFERED=1
out=${1:?usage: tests/gpu/run_fsdp.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${TIDE_GPU_WORK:-/tmp/tide-fsdp}
budget=${TIDE_FSDP_BUDGET:-560}
steps=${TIDE_FSDP_STEPS:-parity-w2 parity-w4 bench memory parity-w8}
want() { [[ " $steps " == *" $1 "* ]]; }
mkdir -p "$out" "$work"
summary="$out/summary.txt"; : >"$summary"
status=0
. "$root/tests/gpu/steps.sh"
step_width=16 step_kill=5 step_budget=$budget
step() { # step NAME LIMIT LOG CMD...: runs CMD under min(LIMIT, what is left of the budget)
    local name=$1 limit=$2 log=$3; shift 3
    run_step "$name" "$log" "$limit" "$@"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >>"$summary" 2>&1
step configure 60 "$out/build.log" cmake -S "$root" -B "$work/lib" -DTIDE_WITH_CUDA=ON \
    -DTIDE_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release
step build 150 "$out/build.log" cmake --build "$work/lib" -j16 --target tide
lib="$work/lib/libtide.so"
par="$root/tests/gpu/fsdp_parity_gpu.py"
bench="$root/tests/gpu/bench_fsdp_layers.py"
want parity-w2 && step parity-w2 75 "$out/parity.log" python3 "$par" --lib "$lib" --worlds 2 \
    --timeout 65 --json "$out/parity-w2.json"
want parity-w4 && step parity-w4 85 "$out/parity.log" python3 "$par" --lib "$lib" --worlds 4 \
    --timeout 75 --json "$out/parity-w4.json"
want bench && step bench 110 "$out/bench.log" python3 "$bench" --lib "$lib" --worlds 2,4,8 \
    --iters 10 --timeout 45 --json "$out/bench.json"
want memory && step memory 240 "$out/memory.log" python3 "$root/tests/gpu/bench_fsdp_memory.py" \
    --lib "$lib" --out "$out" --worlds 2,4 --steps 3 --timeout 70
want parity-w8 && step parity-w8 100 "$out/parity.log" python3 "$par" --lib "$lib" --worlds 8 \
    --timeout 90 --json "$out/parity-w8.json"
want pool && step pool 50 "$out/pool.log" python3 "$root/tests/gpu/fsdp_pool_gpu.py" \
    --lib "$lib" --timeout 40 --json "$out/pool.json"
want graph && step graph 120 "$out/graph.log" python3 "$root/tests/gpu/fsdp_graph_gpu.py" \
    --lib "$lib" --timeout 110 --json "$out/graph.json"
want issue26 && step issue26 400 "$out/issue26.log" python3 "$root/tests/gpu/fsdp_issue26_gpu.py" \
    --lib "$lib" --timeout 380 --json "$out/issue26.json"
grep -h "^rank .*: \(PASS\|FAIL\)\|^fsdp_graph_gpu" "$out/graph.log" >>"$summary" 2>/dev/null
grep -h "^world\|^N =\|^  AG\|^  RS\|^layer" "$out/parity.log" "$out/bench.log" >>"$summary" 2>/dev/null
[ -f "$out/fsdp_memory.txt" ] && sed -n '1,8p' "$out/fsdp_memory.txt" >>"$summary"
# The "arenas" column says whether each TIDE run had one shared arena per rank; a fallback
# to one arena per group is named here too (and fails the memory step).
[ -f "$out/fsdp_memory.txt" ] && grep -h "^NOT the shared arena" "$out/fsdp_memory.txt" >>"$summary"
exit $status
