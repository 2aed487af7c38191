#!/usr/bin/env bash
# A build without the NCCL fabric refuses --fabric nccl clearly (exit 2, naming the build it
# needs) and starts nothing.  $1 = tide-bench.
set -uo pipefail
bench=$1
err=$("$bench" --fabric nccl --procs 2 --topology 1x2 --divisors 4096 --iters 1 2>&1 >/dev/null)
rc=$?
echo "$err"
[ $rc -eq 2 ] || { echo "--fabric nccl without the NCCL fabric must exit 2, got $rc"; exit 1; }
[ "$(wc -l <<<"$err")" -eq 1 ] || { echo "the refusal must be one line"; exit 1; }
grep -q "needs a CUDA build of TIDE with the NCCL fabric" <<<"$err" ||
    { echo "message must say it needs a CUDA build with the NCCL fabric"; exit 1; }
grep -q "TIDE_WITH_NCCL=ON" <<<"$err" || { echo "message must name -DTIDE_WITH_NCCL=ON"; exit 1; }
echo "tide-bench without NCCL: --fabric nccl refused OK"
