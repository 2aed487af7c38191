#!/usr/bin/env bash
# The main job: install dependencies, build, and compare TIDE with the stock FSDP2 path on the
# machine at hand.
#
#   GPU visible (nvidia-smi -L lists one): a CUDA build; TIDE on the CUDA fabric against
#     PyTorch's own FSDP2 ops, timed in one process on the same buffers
#     (tests/gpu/bench_torch_baseline.py), per row busbw and share of the memory roofline
#     (tools/tide-bench/gpu_table.py).  Results land in bench/results/main-<host>-<date>/.
#   Otherwise: a CPU build; tide-bench on its embedded default (CPU fabric, 2x4 topology,
#     llama3-70b-layer scaled down), TIDE against a C stand-in of the stock path on the same
#     threads and buffers.
#
# TIDE_MAIN=cpu|gpu forces a path.  Extra arguments go to tide-bench (CPU path) or to
# bench_torch_baseline.py (GPU path).  Progress goes to stderr, the table to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
# Nothing here uses NVLink multicast; every process started below inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

path=${TIDE_MAIN:-}
why=""
if [ -z "$path" ]; then
  if gpus=$(nvidia-smi -L 2>/dev/null) && [ -n "$gpus" ]; then
    path=gpu
    why="nvidia-smi -L lists $(wc -l <<<"$gpus") GPU(s): $(head -1 <<<"$gpus" | sed 's/ (UUID.*//')"
  else
    path=cpu
    why="no GPU visible (nvidia-smi -L lists none)"
  fi
else
  why="TIDE_MAIN=$path"
  case "$path" in cpu | gpu) ;; *) echo "run-main: TIDE_MAIN must be cpu or gpu" >&2; exit 2 ;; esac
fi

echo "# main job: setting up (scripts/deps.sh, build) ..." >&2
if [ "$path" = cpu ]; then
  ./scripts/deps.sh >/dev/null
elif ! ./scripts/deps.sh >/dev/null 2>&1; then
  # GPU machines are often offline images with the toolkit and torch but not every Debian
  # package of the CPU tests; the GPU path needs only cmake, a compiler, nvcc and torch, and
  # the build below says what is missing.
  echo "# main job: scripts/deps.sh could not install everything (offline?); building with" \
       "what is installed" >&2
fi

if [ "$path" = cpu ]; then
  cmake -S . -B build -DTIDE_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build -j"$(nproc)" --target tide-bench >/dev/null
  cat <<EOF
# main job: CPU path ($why).
# N = 8 ranks are threads of this process on $(nproc) core(s), their arenas POSIX shared
# memory: TIDE and the stock path run on the same threads and buffers, one after the other
# in every iteration, so speedup = stock time / TIDE time is a like-for-like comparison of
# the bytes each moves and its synchronisation on this CPU, not of a GPU or a network
# (busbw is nccl-tests' definition, of host memory).  With a GPU visible this script runs
# TIDE against PyTorch's own ops instead.
EOF
  # Medians of 40 iterations: rank threads outnumber the cores, so single iterations vary.
  exec ./build/tide-bench --iters 40 --warmup 4 "$@"
fi

python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || {
  echo "run-main: the GPU path needs torch with CUDA (python3 -m pip install torch); or run" \
       "TIDE_MAIN=cpu $0" >&2
  exit 1
}
cmake -S . -B build-cuda -DTIDE_WITH_CUDA=ON -DTIDE_BUILD_GPU_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-cuda -j"$(nproc)" --target tide tide_bench_stock tide-bench >/dev/null
out="bench/results/main-$(hostname -s)-$(date -u +%Y-%m-%d)"
mkdir -p "$out"
cat <<EOF | tee "$out/header.txt"
# main job: GPU path ($why).
# One GPU emulates each M x L job: N = M L virtual ranks share its memory, so the figures are
# that GPU's memory traffic (no NVLink, no network).  TIDE runs on the CUDA fabric; "torch"
# is PyTorch's own FSDP2 ops (all_gather_copy_in, the all-gather's copies, split_with_sizes_copy;
# chunk_cat and the fp32 reduction) timed in the same process on the same buffers, CUDA
# events after a GPU hold.  busbw = bytes (N - 1) / N / time (nccl-tests); share = the fewest
# bytes the collective must move at this GPU's measured copy bandwidth, over the time.
EOF
# The job holds TIDE's and PyTorch's buffers of one 2x4 / 1x8 layer at once: dim 0 / 2 (816 MiB
# a group) needs more than an 80 GB card has, / 4 fits one (H100: 75 GB in use at / 2).
gib=$(python3 -c 'import torch; print(torch.cuda.get_device_properties(0).total_memory >> 30)')
divisor=${TIDE_MAIN_DIVISOR:-$([ "$gib" -ge 120 ] && echo 2 || echo 4)}
echo "# main job: timing (llama3-70b-layer / $divisor on a $gib GiB GPU, 1x8 and 2x4) ..." >&2
python3 tests/gpu/bench_torch_baseline.py --lib build-cuda/libtide.so \
  --divisor "$divisor" --sum-ctas 16 --landing-ctas 16 --json "$out/bench_torch.json" \
  "$@" | tee "$out/bench_torch.txt" >&2  # every path's medians, as progress
nvidia-smi -L >"$out/machine.txt"
python3 tools/tide-bench/gpu_table.py "$out/bench_torch.json" --json "$out/rows.json" |
  tee "$out/table.txt"
echo "# main job: results in $out (bench_torch.txt has every path, incl. the C stand-in)" >&2
