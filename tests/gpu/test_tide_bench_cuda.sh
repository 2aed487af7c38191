#!/usr/bin/env bash
# tide-bench --fabric cuda on the GPU: the main job's table and JSON, every element checked.
#   test_tide_bench_cuda.sh TIDE_BENCH [--procs N] [more tide-bench arguments]
# Runs the table once and the JSON once; asserts exit 0 (no wrong element, no error), both
# collectives at every size, #wrong 0, positive times, and the fabric / procs in the JSON.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bench=$1; shift
procs=0
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
    [ "${args[i]}" = --procs ] && procs=${args[i+1]}
done
out=$("$bench" --fabric cuda "$@" --quiet)
echo "$out"
grep -q "^# tide-bench: fabric cuda" <<<"$out"
grep -q "^all_gather" <<<"$out"
grep -q "^reduce_scatter" <<<"$out"
json=$("$bench" --fabric cuda "$@" --json)
python3 - "$json" "$procs" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
assert d["fabric"] == "cuda" and d["procs"] == int(sys.argv[2]), d
rows = d["rows"]
assert len(rows) >= 2 and len(rows) % 2 == 0, rows
assert [r["collective"] for r in rows] == ["all_gather", "reduce_scatter"] * (len(rows) // 2), rows
for r in rows:
    assert r["wrong"] == 0 and r["tide_us"] > 0 and r["stock_us"] > 0 and r["bytes"] > 0, r
print("tide-bench --fabric cuda JSON OK:", len(rows), "rows")
PY
