#!/usr/bin/env bash
# sum_by_l.sh OUTDIR - on the GPU machine: the default Level-1 sum's rate per CTA at L = 2..8
# sources (bench_kernels --quick), and the sum CTAs the M = 1 solver asks for when its BW_sum
# follows that rate (src/plan/solver.c, tide_solve_local_sum_ctas).
#
# The paper's 99 GB/s per sum CTA was measured with L = 8 sources.  A sum over fewer sources
# moves fewer bytes per output element for the same per-element work, so its rate per CTA can
# be lower; this prints, per L, the rate at 16 CTAs, its ratio to L = 8's, and C_sum with
# BW_sum = 99 x that ratio beside C_sum with 99.  The planner's default uses the ratios of one
# such run (tide_plan_bw_sum_gbps, src/plan/solver.c); the C_sum rule is repeated here so that
# the script needs no build of the library.
# Results: OUTDIR/bench_kernels.txt, OUTDIR/sum_by_l.txt.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${1:?usage: tests/gpu/sum_by_l.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${TIDE_GPU_WORK:-/tmp/tide-sum-by-l}
mkdir -p "$out" "$work"
# TIDE_BENCH_KERNELS=PATH runs a bench_kernels built before (tests/gpu/build.sh, which needs
# nvcc but no GPU) instead of building one here.
bench=${TIDE_BENCH_KERNELS:-}
if [ -z "$bench" ]; then
    bash "$root/tests/gpu/build.sh" "$work" >"$work/build.txt" 2>&1 ||
        { tail -20 "$work/build.txt"; exit 1; }
    bench=$work/bench_kernels
fi
"$bench" --quick 10 >"$out/bench_kernels.txt" 2>&1 || status=$?
python3 - "$out/bench_kernels.txt" <<'PY' | tee "$out/sum_by_l.txt"
import math, re, sys
rate = {}  # (L, ctas) -> GB/s per CTA
for line in open(sys.argv[1]):
    m = re.match(r"\s*sum auto L=(\d+)\s+ctas\s+(\d+).*?([\d.]+) GB/s/CTA", line)
    if m:
        rate[int(m[1]), int(m[2])] = float(m[3])
if (8, 16) not in rate:
    sys.exit("no 'sum auto L=8' row at 16 CTAs in the bench output")
def c_sum(l, bw_sum, link=450.0, skew=1.5, item=2):
    load = l * item / 4 + 1
    remote = (l - 1) * item / 4
    return math.ceil(skew * load * link / (remote * bw_sum) - 1e-9)
print("L  GB/s/CTA at 4 / 16 / 28 CTAs   ratio to L=8 (16 CTAs)   C_sum(99)  C_sum(99 x ratio)")
for l in range(2, 9):
    if (l, 16) not in rate:
        continue
    r = [rate.get((l, c), float("nan")) for c in (4, 16, 28)]
    ratio = r[1] / rate[8, 16]
    print("%d  %6.1f / %6.1f / %6.1f            %5.3f                  %3d        %3d"
          % (l, *r, ratio, c_sum(l, 99.0), c_sum(l, 99.0 * ratio)))
PY
grep -E "DIFFERS|match" "$out/bench_kernels.txt"
exit ${status:-0}
