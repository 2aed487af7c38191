#!/usr/bin/env bash
# run.sh OUTDIR - on the GPU machine: build with CMake (-DTIDE_WITH_CUDA=ON builds tests/gpu),
# run every GPU test through `ctest -L gpu`, then the benchmarks; results under OUTDIR.
#
#   tests/gpu/run.sh "$OUT"            everything
#   TIDE_GPU_QUICK=1                   tests only (no sanitizers, no benchmarks)
#   TIDE_GPU_CTEST_EXCLUDE=REGEX       ctest -E REGEX (e.g. 'matrix|_mp' for a short run)
#   TIDE_GPU_CTEST_JOBS=J              ctest -j J (default 1; 3 keeps every test within its
#                                      timeout on one H100 and halves the run)
#   TIDE_GPU_STEPS="a b ..."           after the tests, only these steps (default: all but
#                                      sum-variants): mps-tests fsdp-layers memcheck racecheck
#                                      bench-kernels bench-fabric bench-torch
#                                      bench-torch-unfused interference enqueue sum-variants
#                                      tide-bench layer-gap (TIDE_GPU_GAP_RUNS, _WORLDS)
#                                      layer-ctas (TIDE_GPU_CTAS, TIDE_GPU_GAP_WORLDS)
#                                      stream-ops mps-sum (TIDE_GPU_GAP_WORLDS, _CTAS)
#                                      mps-copy bench-procs copy-variants
#                                      (TIDE_GPU_GAP_WORLDS) layer-env
#                                      (TIDE_GPU_ENVS, TIDE_GPU_GAP_WORLDS)
#   TIDE_GPU_LAYER_ARGS="..."          extra bench_fsdp_layers / bench_layer_single arguments
#                                      (e.g. "--sum-ctas 32 --landing-ctas 32")
#   TIDE_GPU_LAYER_PUSHED=0            skip fsdp-layers' run with TIDE_CUDA_MP_DIRECT=0
#   TIDE_GPU_LAYER_NOMPS=0             skip fsdp-layers' time-sliced run (no MPS)
#   TIDE_GPU_RACECHECK=0               skip the (slow) racecheck of the kernels
#   TIDE_GPU_ENQUEUE=0                 skip bench_enqueue
#   TIDE_GPU_INTERFERENCE=0            skip bench_interference
#   TIDE_GPU_FUSED_MATRIX=0            skip the matrix of the unfused direct path (mask 7)
#   TIDE_GPU_MATRIX_SECONDS=S          its budget (default 120)
#   TIDE_BENCH_DIVISOR=D               dim 0 divisor of the fabric benchmarks (default 2)
#
# sum-variants (tests/gpu/sum_variants.sh) builds and times the TMA sum's build-time variants;
# tide-bench runs the main job on the GPU (`tide-bench --fabric cuda`, one process).
# mps-tests: the tests labelled mps (8 processes x 50 AG + RS calls, a killed and a stopped
# rank) again under a private MPS daemon (tests/gpu/mps.sh), which ctest -L gpu ran without.
# fsdp-layers (issue 25): bench_fsdp_layers' layer at N = 2, 4, 8 processes (tide.fsdp, the
# one-process-per-rank fabric) without MPS and with a private MPS daemon, then the same layer
# on the single-process fabric at the same N (bench_layer_single.py), which prints the
# multi-process / single-process ratios of both runs (the bar: 1.25x) and the roofline shares.
#
# Safety: NVLink multicast never runs here.  These are exported for every process this
# script starts, and nothing in TIDE calls cuMulticast* or issues multimem instructions.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
# The NCCL fabric loads the libnccl.so.2 that torch loads (docs/nccl-fabric.md): a system
# libnccl found first on the loader's path may be another 2.28 release (2.28.3 there gives no
# symmetric windows on a one-rank communicator: TIDE_ERR_UNSUPPORTED).
if [ -z "${TIDE_NCCL_LIBRARY:-}" ]; then
    lib=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    [ -n "$lib" ] && [ -e "$lib" ] && export TIDE_NCCL_LIBRARY=$lib
fi
out=${1:?usage: tests/gpu/run.sh OUTDIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out"
b=${TIDE_GPU_WORK:-/tmp/tide-gpu}/build
log="$out/gpu.log"
summary="$out/summary.txt"
: >"$log"
: >"$summary"
status=0
. "$root/tests/gpu/steps.sh"
step_echo=1
step() { # step NAME CMD... : run, append output to the log, record PASS/FAIL in the summary
    local name=$1; shift
    run_step "$name" "$log" 0 "$@"
}
{ nvidia-smi; nvcc --version; } >"$out/machine.txt" 2>&1
step configure cmake -S "$root" -B "$b" -DTIDE_WITH_CUDA=ON -DTIDE_BUILD_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
step build cmake --build "$b" -j"$(nproc)" || { cat "$summary"; exit 1; }
step ctest-gpu bash -c "cd '$b' && ctest -L gpu -j${TIDE_GPU_CTEST_JOBS:-1} --output-on-failure ${TIDE_GPU_CTEST_EXCLUDE:+-E '$TIDE_GPU_CTEST_EXCLUDE'}"
# ctest's matrix runs the default direct mask (15, fusion on); the unfused mask (7) must equal
# the CPU fabric too.
[ "${TIDE_GPU_FUSED_MATRIX:-1}" = 1 ] &&
    step matrix-unfused env TIDE_TEST_CUDA_DIRECT=7 "$b/tests/gpu/test_fabric_cuda" --matrix --max-seconds "${TIDE_GPU_MATRIX_SECONDS:-120}"
steps=${TIDE_GPU_STEPS:-mps-tests fsdp-layers memcheck racecheck bench-kernels bench-fabric bench-torch bench-torch-unfused interference enqueue tide-bench}
want() { [ "${TIDE_GPU_QUICK:-0}" != 1 ] && [[ " $steps " == *" $1 "* ]]; }
div=${TIDE_BENCH_DIVISOR:-2}
torch_bench="python3 '$root/tests/gpu/bench_torch_baseline.py' --lib '$b/libtide.so' --divisor $div --sum-ctas 16 --landing-ctas 16"
. "$root/tests/gpu/mps.sh"
want mps-tests && step ctest-mps with_mps "$out/mps-tests" bash -c "cd '$b' && ctest -L mps --output-on-failure"
if want fsdp-layers; then
    layer="python3 '$root/tests/gpu/bench_fsdp_layers.py' --lib '$b/libtide.so' --worlds 2,4,8 ${TIDE_GPU_LAYER_ARGS:-}"
    # Time-sliced (no MPS): without the GPU hold, since a sleeping process holds the GPU for
    # its time slices while the others' halves of the collective wait for theirs.
    [ "${TIDE_GPU_LAYER_NOMPS:-1}" = 1 ] &&
        step fsdp-layers bash -c "set -o pipefail; $layer --hold-ms 0 --json '$out/fsdp_layers.json' | tee '$out/fsdp_layers.txt'"
    # One MPS daemon per world size, so that a world's failure cannot leave the next one a
    # server in a bad state (mps.sh also caps the clients' device connections, whose pool
    # made every process after the N = 2 run fail: bench/results/h100-2026-12-06f).
    mps_json=""
    for w in 2 4 8; do
        step fsdp-layers-mps-w$w with_mps "$out/mps-layers-w$w" bash -c "set -o pipefail; $layer --worlds $w --json '$out/fsdp_layers_mps_w$w.json' | tee '$out/fsdp_layers_mps_w$w.txt'"
        mps_json="$mps_json --mp-json '$out/fsdp_layers_mps_w$w.json'"
    done
    # The same layer on the pushed path (direct mode off, docs/cuda-fabric.md "Direct mode
    # across processes"): the before / after of the one-process-per-rank reduce-scatter.
    [ "${TIDE_GPU_LAYER_PUSHED:-1}" = 1 ] &&
        step fsdp-layers-pushed env TIDE_CUDA_MP_DIRECT=0 bash -c "set -o pipefail; $layer --json '$out/fsdp_layers_pushed.json' | tee '$out/fsdp_layers_pushed.txt'"
    step layer-single bash -c "set -o pipefail; python3 '$root/tests/gpu/bench_layer_single.py' --lib '$b/libtide.so' --worlds 2,4,8 ${TIDE_GPU_LAYER_ARGS:-} --json '$out/layer_single.json' --mp-json '$out/fsdp_layers.json' $mps_json | tee '$out/layer_single.txt'"
fi
# layer-gap (issue 25): where the one-process-per-rank collectives lose against the
# single-process fabric at N = 8 under MPS: behind the common start gate with host-mapped
# flags, with device flags and with device flags behind wait kernels (TIDE_CUDA_MP_FLAGS=host,
# device, kernel: src/fabric/cuda/mp_flags.c), side by side in gap_single.txt, and behind
# per-process holds (the processes' start spread in the figure); not in the default steps.
if want layer-gap; then
    # TIDE_GPU_GAP_RUNS picks the runs (host device kernel hold full alone; flags as named,
    # "hold" = host flags behind per-process holds; all with the synchronisation elision,
    # TIDE_SYNC_ELIDE=1, but "full" = host flags with every signal of the program,
    # TIDE_SYNC_ELIDE=0: docs/sync-elide.md; all with a run of waits as one stream operation,
    # but "alone" = host flags, every wait alone, TIDE_CUDA_MP_WAIT_RUNS=0),
    # TIDE_GPU_GAP_WORLDS the world sizes (default 8).
    gap_worlds=${TIDE_GPU_GAP_WORLDS:-8} gap_json=""
    for w in ${gap_worlds//,/ }; do
        gap="python3 '$root/tests/gpu/bench_fsdp_layers.py' --lib '$b/libtide.so' --worlds $w ${TIDE_GPU_LAYER_ARGS:-}"
        for run in ${TIDE_GPU_GAP_RUNS:-host device kernel hold}; do
            flags=$run start="" elide=1 runs=1
            [ "$run" = hold ] && flags=host start="--start hold"
            [ "$run" = full ] && flags=host elide=0
            [ "$run" = alone ] && flags=host runs=0
            step layer-gap-$run-w$w with_mps "$out/mps-gap-$run-w$w" env TIDE_CUDA_MP_FLAGS=$flags TIDE_SYNC_ELIDE=$elide TIDE_CUDA_MP_WAIT_RUNS=$runs bash -c "set -o pipefail; $gap $start --json '$out/gap_${run}_w$w.json' | tee '$out/gap_${run}_w$w.txt'"
            gap_json="$gap_json --mp-json '$out/gap_${run}_w$w.json'"
        done
    done
    step layer-gap-single bash -c "set -o pipefail; python3 '$root/tests/gpu/bench_layer_single.py' --lib '$b/libtide.so' --worlds $gap_worlds ${TIDE_GPU_LAYER_ARGS:-} $gap_json | tee '$out/gap_single.txt'"
fi
# layer-ctas (issue 25): the same comparison against the Level-1 CTA budget: for each budget
# C in TIDE_GPU_CTAS (default "10 20 40"; 10 is the solver's at 8 GPUs), the layer with
# --sum-ctas C --landing-ctas C on N processes under MPS (host flags, common gate) and on the
# single-process fabric, side by side in ctas_single_C.txt: whether the N = 8 gap of the
# one-process-per-rank reduce-scatter follows the CTA count.  Not in the default steps.
if want layer-ctas; then
    for c in ${TIDE_GPU_CTAS:-10 20 40}; do
        for w in ${TIDE_GPU_GAP_WORLDS:-8}; do
            cta="python3 '$root/tests/gpu/bench_fsdp_layers.py' --lib '$b/libtide.so' --worlds $w --sum-ctas $c --landing-ctas $c"
            step layer-ctas-c$c-w$w with_mps "$out/mps-ctas-c$c-w$w" bash -c "set -o pipefail; $cta --json '$out/ctas_c${c}_w$w.json' | tee '$out/ctas_c${c}_w$w.txt'"
            step layer-ctas-single-c$c-w$w bash -c "set -o pipefail; python3 '$root/tests/gpu/bench_layer_single.py' --lib '$b/libtide.so' --worlds $w --sum-ctas $c --landing-ctas $c --mp-json '$out/ctas_c${c}_w$w.json' | tee '$out/ctas_single_c${c}_w$w.txt'"
        done
    done
fi
# stream-ops (issue 25): the per-rank stream operations of one reduce-scatter call of the
# layer's shapes, as tide-plan program --stream-ops counts them without a GPU, against the
# one-process-per-rank fabric's own counts at N = 2, 4, 8 (test_stream_ops_mp; under MPS
# too).  Not in the default steps (ctest -L gpu runs N = 8).
if want stream-ops; then
    # With the synchronisation elision (TIDE_SYNC_ELIDE=1, the default: docs/sync-elide.md)
    # and, at N = 8, with every signal of the program (0) and with every wait alone
    # (TIDE_CUDA_MP_WAIT_RUNS=0).
    for w in 2 4 8; do
        step stream-ops-w$w env TIDE_SYNC_ELIDE=1 "$b/tests/gpu/test_stream_ops_mp" $w
        step stream-ops-mps-w$w with_mps "$out/mps-ops-w$w" env TIDE_SYNC_ELIDE=1 "$b/tests/gpu/test_stream_ops_mp" $w
    done
    step stream-ops-full-w8 env TIDE_SYNC_ELIDE=0 "$b/tests/gpu/test_stream_ops_mp" 8
    step stream-ops-alone-w8 env TIDE_CUDA_MP_WAIT_RUNS=0 "$b/tests/gpu/test_stream_ops_mp" 8
fi
# mps-sum (issue 25): the Level-1 sum alone, one process with N streams against N processes
# reading each other's gradients through IPC and N processes reading their own copies, under
# MPS (tests/gpu/bench_mps_sum.cu); at N in TIDE_GPU_GAP_WORLDS (default "2 4 8") and the sum
# CTAs of TIDE_GPU_CTAS (default 10).  Not in the default steps.
if want mps-sum; then
    for w in ${TIDE_GPU_GAP_WORLDS:-2 4 8}; do
        for c in ${TIDE_GPU_CTAS:-10}; do
            step mps-sum-w$w-c$c with_mps "$out/mps-sum-w$w-c$c" bash -c "set -o pipefail; '$b/tests/gpu/bench_mps_sum' --ranks $w --ctas $c | tee -a '$out/mps_sum.txt'"
        done
    done
fi
# mps-copy (issue 25): the all-gather's batched copies alone (bench_mps_sum --op copy: the
# layer's 386 MiB a rank, one process against processes pushing through IPC, pulling through
# IPC and copying their own copies), under MPS, at N in TIDE_GPU_GAP_WORLDS (default "2 4 8"):
# whether the processes' all-gather gap (1.05x at every N) is in the copies themselves.  Not
# in the default steps.
if want mps-copy; then
    for w in ${TIDE_GPU_GAP_WORLDS:-2 4 8}; do
        step mps-copy-w$w with_mps "$out/mps-copy-w$w" bash -c "set -o pipefail; '$b/tests/gpu/bench_mps_sum' --op copy --ranks $w --mib 386 --modes single,peer,pull,local | tee -a '$out/mps_copy.txt'"
    done
fi
# bench-procs (issue 25): the layer's collectives through the fabrics alone, no Python and no
# FSDP2 around them: `tide-bench --fabric cuda` at 1 x N in one process against `--procs N`
# (one process per rank, under MPS), the same shapes (bench_fsdp_layers' layer in FSDP2
# order), at N in TIDE_GPU_GAP_WORLDS.  Whether the processes' all-gather gap is in the
# fabric or in the benchmarks around it.  Not in the default steps.
if want bench-procs; then
    shapes="4096,4096x4096,4096x4096,4096x4096,4096x4096,4096,11008x4096,11008x4096,4096x11008"
    for w in ${TIDE_GPU_GAP_WORLDS:-2 4 8}; do
        step bench-procs-single-w$w bash -c "set -o pipefail; '$b/tide-bench' --fabric cuda --topology 1x$w --shapes $shapes --divisors 1 --iters 20 2>&1 | tee -a '$out/bench_procs.txt'"
        step bench-procs-mps-w$w with_mps "$out/mps-procs-w$w" bash -c "set -o pipefail; '$b/tide-bench' --fabric cuda --procs $w --topology 1x$w --shapes $shapes --divisors 1 --iters 20 2>&1 | tee -a '$out/bench_procs.txt'"
    done
fi
# copy-variants: the batched copy kernel's build variants (bench_mps_sum --unroll, --streaming;
# batch_copy.h) against one cudaMemcpyAsync a copy, on the all-gather's copies of the 386 MiB
# layer at N in TIDE_GPU_GAP_WORLDS (default "2 8"): one process (N streams), the fabric's
# grid and twice it; then the processes pushing through IPC under MPS for unroll 4 and 8.
# Which variant tide_cuda_batch_copy runs.  Not in the default steps.
if want copy-variants; then
    for w in ${TIDE_GPU_GAP_WORLDS:-2 8}; do
        for c in 0 528; do # the fabric's grid (2 CTAs an SM at most), 4 an SM on 132 SMs
            for u in 4 8 16; do
                for sm in 0 1; do
                    modes=single
                    [ "$u$sm" = 40 ] && modes=single,memcpy
                    step copy-w$w-c$c-u$u-s$sm bash -c "set -o pipefail; '$b/tests/gpu/bench_mps_sum' --op copy --ranks $w --mib 386 --copy-ctas $c --unroll $u --streaming $sm --modes $modes | tee -a '$out/copy_variants.txt'"
                done
            done
        done
        for u in 4 8; do
            step copy-mps-w$w-u$u with_mps "$out/mps-copyv-w$w-u$u" bash -c "set -o pipefail; '$b/tests/gpu/bench_mps_sum' --op copy --ranks $w --mib 386 --unroll $u --modes single,peer | tee -a '$out/copy_variants.txt'"
        done
    done
fi
# layer-env (issue 25): the layer on N processes under MPS and on the single-process fabric
# with each environment setting of TIDE_GPU_ENVS (default: "none TIDE_CUDA_BATCH_KERNEL=8
# TIDE_CUDA_BATCH_KERNEL=8cs TIDE_CUDA_IPC=legacy": the batched copy kernel's variants
# (src/fabric/env.c) and the processes' segments as cudaMalloc memory shared by legacy IPC
# instead of VMM), at N in TIDE_GPU_GAP_WORLDS (default 2): the ratios and roofline shares
# side by side in env_single_<setting>_w<N>.txt.  Not in the default steps.
if want layer-env; then
    for v in ${TIDE_GPU_ENVS:-none TIDE_CUDA_BATCH_KERNEL=8 TIDE_CUDA_BATCH_KERNEL=8cs TIDE_CUDA_IPC=legacy}; do
        tag=${v//[^A-Za-z0-9]/_}
        setting=$v
        [ "$v" = none ] && setting=TIDE_GPU_ENV_NONE=1
        for w in ${TIDE_GPU_GAP_WORLDS:-2}; do
            le="python3 '$root/tests/gpu/bench_fsdp_layers.py' --lib '$b/libtide.so' --worlds $w ${TIDE_GPU_LAYER_ARGS:-}"
            step layer-env-$tag-w$w with_mps "$out/mps-env-$tag-w$w" env "$setting" bash -c "set -o pipefail; $le --json '$out/env_${tag}_w$w.json' | tee '$out/env_${tag}_w$w.txt'"
            step layer-env-single-$tag-w$w env "$setting" bash -c "set -o pipefail; python3 '$root/tests/gpu/bench_layer_single.py' --lib '$b/libtide.so' --worlds $w ${TIDE_GPU_LAYER_ARGS:-} --mp-json '$out/env_${tag}_w$w.json' | tee '$out/env_single_${tag}_w$w.txt'"
        done
    done
fi
if command -v compute-sanitizer >/dev/null; then
    want memcheck && step memcheck-fabric compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$b/tests/gpu/test_fabric_cuda" --small
    want memcheck && step memcheck-graph compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$b/tests/gpu/test_graph_cuda" 26 3
    # The one-process-per-rank fabric: every forked rank under the tool (captured sets with
    # kernel-polled flags, then eager calls with host flags, a short matrix run).
    # The tool slows every rank down: a longer TIDE_TIMEOUT_MS, and a bound on each step.
    want memcheck && step memcheck-set-mp env TIDE_CUDA_MP_FLAGS=kernel TIDE_TIMEOUT_MS=60000 \
        timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 --target-processes all \
        "$b/tests/gpu/test_graph_set_mp" --ranks 2
    want memcheck && step memcheck-fabric-mp env TIDE_TIMEOUT_MS=60000 timeout 240 \
        compute-sanitizer --tool memcheck --error-exitcode 3 --target-processes all \
        "$b/tests/gpu/test_fabric_cuda_mp" --seconds 10 --topology 2 1
    want racecheck && [ "${TIDE_GPU_RACECHECK:-1}" = 1 ] && step racecheck-kernels timeout 120 \
        compute-sanitizer --tool racecheck --error-exitcode 3 "$b/tests/gpu/test_kernels" --racecheck
fi
want bench-kernels && step bench-kernels bash -c "set -o pipefail; '$b/tests/gpu/bench_kernels' | tee '$out/bench_kernels.txt'"
want bench-fabric && step bench-fabric bash -c "set -o pipefail; '$b/tests/gpu/bench_fabric_cuda' --divisor $div --iters 10 --sum-ctas 16 --landing-ctas 16 | tee '$out/bench_fabric.txt'"
want bench-torch && step bench-torch bash -c "set -o pipefail; $torch_bench | tee '$out/bench_torch.txt'"
want bench-torch-unfused && step bench-torch-unfused bash -c "set -o pipefail; TIDE_CUDA_DIRECT=7 $torch_bench | tee '$out/bench_torch_unfused.txt'"
want interference && [ "${TIDE_GPU_INTERFERENCE:-1}" = 1 ] &&
    step bench-interference bash -c "set -o pipefail; '$b/tests/gpu/bench_interference' | tee '$out/bench_interference.txt'"
want enqueue && [ "${TIDE_GPU_ENQUEUE:-1}" = 1 ] &&
    step bench-enqueue bash -c "set -o pipefail; '$b/tests/gpu/bench_enqueue' | tee '$out/bench_enqueue.txt'"
want tide-bench && step tide-bench bash -c "set -o pipefail; '$b/tide-bench' --fabric cuda | tee '$out/tide_bench_cuda.txt'"
want sum-variants && step sum-variants bash "$root/tests/gpu/sum_variants.sh" "$out"
cat "$summary"
exit $status
