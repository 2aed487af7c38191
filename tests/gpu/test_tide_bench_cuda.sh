#!/usr/bin/env bash
# tide-bench on a GPU fabric: the main job's table and JSON, every element checked.
#   test_tide_bench_cuda.sh TIDE_BENCH [--fabric cuda|nccl] [--procs N] [more tide-bench arguments]
# The fabric is cuda unless named.  Runs the table once and the JSON once; asserts exit 0 (no
# wrong element, no error), both collectives at every size, #wrong 0, positive times, and the
# fabric / procs in the header and the JSON.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bench=$1; shift
procs=0
fabric=cuda
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
    [ "${args[i]}" = --procs ] && procs=${args[i+1]}
    [ "${args[i]}" = --fabric ] && fabric=${args[i+1]}
done
out=$("$bench" --fabric "$fabric" "$@" --quiet)
echo "$out"
grep -q "^# tide-bench: fabric $fabric[ ,]" <<<"$out"
grep -q "^all_gather" <<<"$out"
grep -q "^reduce_scatter" <<<"$out"
json=$("$bench" --fabric "$fabric" "$@" --json)
python3 - "$json" "$procs" "$fabric" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
assert d["fabric"] == sys.argv[3] and d["procs"] == int(sys.argv[2]), d
rows = d["rows"]
assert len(rows) >= 2 and len(rows) % 2 == 0, rows
assert [r["collective"] for r in rows] == ["all_gather", "reduce_scatter"] * (len(rows) // 2), rows
for r in rows:
    assert r["wrong"] == 0 and r["tide_us"] > 0 and r["stock_us"] > 0 and r["bytes"] > 0, r
print("tide-bench --fabric", sys.argv[3], "JSON OK:", len(rows), "rows")
PY
