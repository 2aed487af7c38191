#!/usr/bin/env bash
# run_train_example.sh OUTDIR - on the GPU machine: build libtide with the CUDA fabric, then run
# examples/train.py --compare on the GPU(s), as docs/quickstart.md tells users to:
#   w2-llama-fp32   2 processes on GPU 0 (stock over gloo), fp32, deterministic kernels:
#                   losses must be bit-exact (docs/fsdp.md, Numerics: world 2)
#   w2-moe-bf16     the same for the MoE model, bf16 compute, fp32 reduction, slot_reuse
#   w4-llama-big    4 processes on GPU 0, a larger model (dim 1024, 4 layers, bf16; gloo
#                   carries stock's bytes through the host, so its times are not NCCL's), default
#                   kernels: speed and memory figures; losses are not required to match
#   torchrun-N      with N >= 2 GPUs visible: one process per GPU, NCCL for stock
# Every step runs under `timeout` inside one budget; a failing step does not stop the next.
#   TIDE_TRAIN_BUDGET=S   overall seconds (default 360)
# Results: OUTDIR/summary.txt, build.log, <step>.log, <step>/compare.json (+ .png when
# matplotlib is installed there; else draw it elsewhere: python3 examples/report.py FILE.json).
# Safety: NVLink multicast never runs; these are exported for every process started here.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out=${1:?usage: tests/gpu/run_train_example.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${TIDE_GPU_WORK:-/tmp/tide-train}
budget=${TIDE_TRAIN_BUDGET:-360}
mkdir -p "$out" "$work"
out=$(cd "$out" && pwd)
summary="$out/summary.txt"; : >"$summary"
status=0
. "$root/tests/gpu/steps.sh"
step_width=16 step_kill=5 step_budget=$budget
step() { # step NAME LIMIT CMD...: runs CMD under min(LIMIT, what is left of the budget)
    local name=$1 limit=$2 log="$out/$1.log"; shift 2
    local rc=0
    run_step "$name" "$log" "$limit" "$@" || rc=$?
    # The run's table, served groups and the loss verdict, into the summary (none when the
    # step was skipped).
    [ -f "$log" ] && grep -h "^run \|^stock \|^tide \|^losses\|^note\|serves\|stock FSDP2 for" \
        "$log" | sed 's/^/    /' >>"$summary"
    return $rc
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  python3 -c 'import tqdm, matplotlib' 2>/dev/null || echo "tqdm/matplotlib missing: no bar/PNG"
} >>"$summary" 2>&1
step configure 90 cmake -S "$root" -B "$work/lib" -DTIDE_WITH_CUDA=ON -DTIDE_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=Release
step build 150 cmake --build "$work/lib" -j"$(nproc)" --target tide
export TIDE_LIBRARY="$work/lib/libtide.so"
train="$root/examples/train.py"
exact() { # exact NAME: that run's losses must have been bit-exact
    if grep -q "^losses bit-exact" "$out/$1.log"; then
        printf '%-16s PASS\n' "$1-exact" | tee -a "$summary"
    else
        printf '%-16s FAIL (losses not bit-exact)\n' "$1-exact" | tee -a "$summary"; status=1
    fi
}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
big=(--dim 1024 --heads 16 --layers 4 --vocab 8192 --seq 512 --batch 4 --precision bf16
     --steps 10 --no-progress)
single=${CUDA_VISIBLE_DEVICES:-0}
single=${single%%,*}  # the several-processes-on-one-GPU runs use the first visible GPU
CUDA_VISIBLE_DEVICES=$single step w2-llama-fp32 80 python3 "$train" --device cuda --world 2 \
    --compare --deterministic --steps 30 --no-progress --out "$out/w2-llama-fp32"
exact w2-llama-fp32
CUDA_VISIBLE_DEVICES=$single step w2-moe-bf16 80 python3 "$train" --device cuda --world 2 \
    --compare --model moe --precision bf16 --tide slot_reuse --deterministic --steps 30 \
    --no-progress --out "$out/w2-moe-bf16"
exact w2-moe-bf16
CUDA_VISIBLE_DEVICES=$single step w4-llama-big 150 python3 "$train" --device cuda --world 4 \
    --compare "${big[@]}" --out "$out/w4-llama-big"
if [ "$ngpu" -ge 2 ]; then
    step "torchrun-$ngpu" 120 torchrun --standalone --nproc-per-node "$ngpu" "$train" \
        --device cuda --compare "${big[@]}" --out "$out/torchrun-$ngpu"
fi
exit $status
