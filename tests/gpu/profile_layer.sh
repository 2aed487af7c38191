#!/usr/bin/env bash
# profile_layer.sh BUILD OUTDIR [N] - where the one-process-per-rank collectives spend the
# time that the single-process fabric does not (issue 25): bench_fsdp_layers' layer at N
# processes under a private MPS daemon, and bench_layer_single's at the same N, each under
# Nsight Systems (CUDA trace), then each profile's kernel summary (nsys stats
# cuda_gpu_kern_sum): how long the same kernels (the batched copies, the sums, the wait
# kernels) run in each fabric.  Profiling only: the figures of record come from run.sh.
#
#   tests/gpu/profile_layer.sh /tmp/tide-gpu/build "$OUT/prof" 2
#
# Safety: NVLink multicast never runs here (the variables below are exported for every
# process this script starts).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
b=${1:?usage: profile_layer.sh BUILD OUTDIR [N]}
out=${2:?usage: profile_layer.sh BUILD OUTDIR [N]}
n=${3:-2}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
command -v nsys >/dev/null || { echo "profile_layer: nsys not found"; exit 98; }
mkdir -p "$out"
. "$root/tests/gpu/mps.sh"
status=0
with_mps "$out/mps" nsys profile -t cuda -f true -o "$out/mp_w$n" \
    python3 "$root/tests/gpu/bench_fsdp_layers.py" --lib "$b/libtide.so" --worlds "$n" \
    --iters 10 >"$out/mp_w$n.txt" 2>&1 || status=1
nsys profile -t cuda -f true -o "$out/single_w$n" \
    python3 "$root/tests/gpu/bench_layer_single.py" --lib "$b/libtide.so" --worlds "$n" \
    --iters 10 >"$out/single_w$n.txt" 2>&1 || status=1
for p in mp single; do
    echo "== $p, N = $n: kernels (nsys stats cuda_gpu_kern_sum)"
    nsys stats -q -r cuda_gpu_kern_sum -f csv "$out/${p}_w$n.nsys-rep" 2>&1 |
        cut -c1-220 | head -25
done
exit $status
