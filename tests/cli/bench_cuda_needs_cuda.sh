#!/usr/bin/env bash
# A CPU build's tide-bench refuses --fabric cuda clearly (exit 2, naming the CUDA build) and
# starts nothing.  $1 = tide-bench.
set -uo pipefail
bench=$1
err=$("$bench" --fabric cuda --topology 1x2 --divisors 4096 --iters 1 2>&1 >/dev/null)
rc=$?
echo "$err"
[ $rc -eq 2 ] || { echo "--fabric cuda in a CPU build must exit 2, got $rc"; exit 1; }
grep -q "needs a CUDA build" <<<"$err" || { echo "message must say it needs a CUDA build"; exit 1; }
grep -q "TIDE_WITH_CUDA=ON" <<<"$err" || { echo "message must name -DTIDE_WITH_CUDA=ON"; exit 1; }
err=$("$bench" --fabric cuda --procs 2 --topology 1x2 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q "needs a CUDA build" <<<"$err" || { echo "--procs: $rc $err"; exit 1; }
echo "tide-bench CPU build: --fabric cuda refused OK"
