#!/usr/bin/env bash
# sum_variants.sh OUTDIR [UNITS:MAXTHREADS ...] - on the GPU machine: build bench_kernels once
# per variant of the TMA sum's build-time knobs (sum_tma.cuh: TIDE_TMA_UNITS, units a consumer
# thread loads before its first add; TIDE_TMA_MAX_THREADS, the launch bound that sets the
# register budget) and run `bench_kernels --quick --sweep` on each, one after the other on the
# same GPU.  OUTDIR/sum_variants.txt gets, per variant, the bf16 TMA kernels' ptxas lines and the
# whole bench output (one file: the device tool brings back few files).  Default variants:
# 0:768 (the library's build), 4:512, 3:512.
#
# Measurement only: the library is always built with the defaults.  Builds run in parallel
# (tests/gpu/build.sh with the knobs appended to its gencode flags); runs are sequential.
# TIDE_VARIANTS_PHASE=build only builds (and then writes WORK/built), =run only runs, waiting
# up to 10 minutes for WORK/built: a caller can build while the GPU is busy with other tests.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${1:?usage: tests/gpu/sum_variants.sh OUTDIR [UNITS:MAXTHREADS ...]}
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(0:768 4:512 3:512)
work=${TIDE_VARIANTS_WORK:-/tmp/tide-sum-variants}
gencode=${TIDE_CUDA_GENCODE:--gencode=arch=compute_90,code=sm_90}
phase=${TIDE_VARIANTS_PHASE:-all}
mkdir -p "$out" "$work"
log="$out/sum_variants.txt"
status=0
pids=()
if [ "$phase" = run ]; then
    for _ in $(seq 600); do [ -e "$work/built" ] && break; sleep 1; done
    [ -e "$work/built" ] || { echo "variants were not built in $work" | tee -a "$log"; exit 1; }
    variants=($(cat "$work/built"))
fi
[ "$phase" = run ] || { rm -f "$work/built"; : >"$log"; }
for v in "${variants[@]}"; do
    [ "$phase" = run ] && break
    u=${v%%:*} t=${v##*:}
    TIDE_CUDA_GENCODE="$gencode -DTIDE_TMA_UNITS=$u -DTIDE_TMA_MAX_THREADS=$t" \
        bash "$root/tests/gpu/build.sh" "$work/u${u}_t$t" >"$work/build_u${u}_t$t.txt" 2>&1 &
    pids+=($!)
done
for i in "${!pids[@]}"; do
    v=${variants[$i]}
    wait "${pids[$i]}" && continue
    status=1
    { echo "== build of $v failed"; tail -40 "$work/build_u${v%%:*}_t${v##*:}.txt"; } >>"$log"
done
if [ "$phase" = build ]; then
    echo "${variants[*]}" >"$work/built"
    exit $status
fi
for v in "${variants[@]}"; do
    u=${v%%:*} t=${v##*:}
    d="$work/u${u}_t$t"
    [ -x "$d/bench_kernels" ] || continue
    {
        echo "== variant units $u, launch bound $t"
        # The bf16 L = 8 kernels the sweep runs (112 and 72 KiB stages): registers, spills.
        grep -A2 -E "sum_tma_kernelItLi7ELi(114688|73728)E" "$d/ptxas.txt"
        # The variant's kernels against the C references, bit for bit (the small subset).
        timeout 120 "$d/test_kernels" --small 2>&1 | tail -3 || echo "test rc=$?"
        timeout 120 "$d/bench_kernels" --quick --sweep 10 2>&1 || echo "bench rc=$?"
    } >>"$log"
done
grep -q -E "(bench|test) rc=" "$log" && status=1
grep -E "^==|^copy:|TMA sweep|DIFFERS|matches|rc=|runs|failed| ctas +(4|16) " "$log"
exit $status
