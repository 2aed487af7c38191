#!/usr/bin/env bash
# tide-bench sweeps (-b/-e/-f, nccl-tests style) and --plot: the sizes grow, every row's data
# is correct, and the PNG is written (matplotlib comes from scripts/deps.sh).
# $1 = tide-plan (unused), the bench sits next to it.
set -euo pipefail
bench="$(dirname "$1")/tide-bench"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bench" --topology 2x2 -b 256K -e 4M -f 4 --iters 1 --warmup 0 --json --plot "$tmp/sweep.png" \
  >"$tmp/sweep.json"
python3 - "$tmp/sweep.json" "$tmp/sweep.png" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["rows"]
for coll in ("all_gather", "reduce_scatter"):
    sizes = [r["bytes"] for r in rows if r["collective"] == coll]
    assert len(sizes) >= 3, (coll, sizes)
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes), (coll, sizes)
for r in rows:
    assert r["wrong"] == 0 and r["busbw_gbps"] > 0 and r["stock_busbw_gbps"] > 0, r
png = open(sys.argv[2], "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000, len(png)
PY
set +e
"$bench" -b 1M >/dev/null 2>&1; [ $? -eq 2 ] || { echo "-b without -e must exit 2"; exit 1; }
"$bench" -b 4M -e 1M >/dev/null 2>&1; [ $? -eq 2 ] || { echo "-b > -e must exit 2"; exit 1; }
"$bench" -b 1Q -e 4M >/dev/null 2>&1; [ $? -eq 2 ] || { echo "bad size must exit 2"; exit 1; }
"$bench" -b 1K -e 1G -f 1.01 >/dev/null 2>&1; [ $? -eq 2 ] || { echo "too many sizes must exit 2"; exit 1; }
# A missing drawing script is a clear error, not a crash.
TIDE_BENCH_PLOT=/nonexistent/plot.py "$bench" --topology 1x2 --divisors 4096 --iters 1 \
  --plot "$tmp/x.png" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "drawing script" "$tmp/err" || { echo "missing script must exit 1"; exit 1; }
echo "tide-bench sweep and plot OK"
