#!/usr/bin/env bash
# --fabric nccl is one process per rank: without --procs it is a usage error (exit 2, naming
# --procs) in every build, and so is a --procs N that is not M L.  $1 = tide-bench.
set -uo pipefail
bench=$1
err=$("$bench" --fabric nccl --topology 1x2 --divisors 4096 --iters 1 2>&1 >/dev/null)
rc=$?
echo "$err"
[ $rc -eq 2 ] || { echo "--fabric nccl without --procs must exit 2, got $rc"; exit 1; }
grep -q "^tide-bench: --fabric nccl .*add --procs N" <<<"$err" ||
    { echo "message must ask for --procs N"; exit 1; }
grep -q "^usage: tide-bench" <<<"$err" || { echo "a usage error prints the usage"; exit 1; }
err=$("$bench" --fabric nccl --procs 3 --topology 1x2 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q "needs N = M L" <<<"$err" || { echo "--procs 3 of 1x2: $rc $err"; exit 1; }
echo "tide-bench: --fabric nccl without --procs refused OK"
