#!/usr/bin/env bash
# tide-bench: the main job runs, prints its table, checks its data, and rejects bad usage.
# $1 = tide-plan (unused), the bench sits next to it.
set -euo pipefail
bench="$(dirname "$1")/tide-bench"
out=$("$bench" --topology 2x2 --divisors 4096 --iters 2 --warmup 1 --quiet)
echo "$out"
grep -q "^all_gather" <<<"$out"
grep -q "^reduce_scatter" <<<"$out"
# llama3-70b-layer / 4096: a 0.75 MB group.  (qwen3-30b-a3b-layer / 2048 is a 57 MB group, 3 GB
# resident at 3x2 and 12 GB under TSan: the kernel's OOM killer ended it when ctest ran it
# beside another large test.)
json=$("$bench" --topology 3x2 --preset llama3-70b-layer --divisors 4096 --iters 1 --mode slot-reuse --json)
python3 - "$json" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
assert d["nodes"] == 3 and d["gpus_per_node"] == 2 and d["mode"] == "slot-reuse"
rows = d["rows"]
assert [r["collective"] for r in rows] == ["all_gather", "reduce_scatter"], rows
for r in rows:
    assert r["wrong"] == 0 and r["tide_us"] > 0 and r["stock_us"] > 0 and r["bytes"] > 0, r
PY
set +e
"$bench" --topology 0x4 >/dev/null 2>&1; [ $? -eq 2 ] || { echo "bad topology must exit 2"; exit 1; }
"$bench" --preset nope >/dev/null 2>&1; [ $? -eq 2 ] || { echo "unknown preset must exit 2"; exit 1; }
"$bench" --procs 2 --topology 1x2 >/dev/null 2>&1; [ $? -eq 2 ] || { echo "--procs without --fabric cuda must exit 2"; exit 1; }
"$bench" --fabric cuda --procs 3 --topology 2x2 >/dev/null 2>&1; [ $? -eq 2 ] || { echo "--procs N != M L must exit 2"; exit 1; }
echo "tide-bench CLI OK"
