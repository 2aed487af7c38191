#!/usr/bin/env bash
# tools/tide-bench/gpu_table.py (the main job's GPU rows) on a bench_torch_baseline.py-shaped
# JSON: busbw from bytes and medians, the roofline shares, the JSON plot.py draws, and exit
# status 1 on a wrong element.  $1 = tide-plan (unused).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/in.json" 0 <<'PY'
import json, sys
res = lambda t: {"topology": t, "ranks": 8, "divisor": 2, "group_mib": 816.0, "iters": 10,
                 "median_ms": {"tide_ag": 3.4, "stock_ag": 6.8, "tide_rs": 2.0, "stock_rs": 20.0},
                 "roofline_share": {"tide_ag": 0.9, "stock_ag": 0.45, "tide_rs": 0.95,
                                    "stock_rs": 0.1},
                 "wrong": {"ag": 0, "rs": int(sys.argv[2])}, "wrong_total": int(sys.argv[2])}
json.dump({"device": "test", "torch": "0", "copy_bw_tbps": 4.0,
           "results": [res("1x8"), res("2x4")]}, open(sys.argv[1], "w"))
PY
python3 "$root/tools/tide-bench/gpu_table.py" "$tmp/in.json" --json "$tmp/rows.json" >"$tmp/out.txt"
cat "$tmp/out.txt"
python3 - "$tmp/rows.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["stock"] == "torch" and len(d["rows"]) == 4, d
r = d["rows"][0]
nbytes = 816 * 2**20
assert r["collective"] == "all_gather" and r["bytes"] == nbytes, r
assert abs(r["busbw_gbps"] - nbytes / 3.4e6 * 7 / 8) < 1e-6, r
assert abs(r["speedup"] - 2.0) < 1e-9 and r["tide_roofline_share"] == 0.9, r
PY
grep -q "^reduce_scatter    2x4" "$tmp/out.txt"
python3 - "$tmp/in.json" 3 <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["results"][1]["wrong"]["rs"] = int(sys.argv[2])
json.dump(d, open(sys.argv[1], "w"))
PY
set +e
python3 "$root/tools/tide-bench/gpu_table.py" "$tmp/in.json" >/dev/null
[ $? -eq 1 ] || { echo "a wrong element must exit 1"; exit 1; }
echo "gpu_table OK"
