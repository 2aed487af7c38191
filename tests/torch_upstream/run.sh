#!/usr/bin/env bash
# run.sh PYTORCH_TEST_FILE_OR_DIR [OUTDIR] - PyTorch's own FSDP2 tests (any test file of
# test/distributed/_composable/fsdp/, any of its classes) on the CPU with gloo, once on stock
# FSDP2 and once with TIDE switched on through the documented switch
# (PYTHONPATH=python/tide/fsdp/sitecustomize:python TIDE_FSDP=<mode>, docs/fsdp.md).
#
#   PYTORCH_TEST_FILE_OR_DIR  a test file (e.g. test_fully_shard_training.py), or a PyTorch
#                             checkout or folder holding it (TIDE_UPSTREAM_FILE names it);
#                             take it from the PyTorch release that matches the installed
#                             torch (docs/torch-upstream-tests.md says how)
#   OUTDIR                    default bench/results/cpu-torch-upstream
#   TIDE_UPSTREAM_FILE        the file looked up in a folder (default
#                             test_fully_shard_training.py)
#   TIDE_UPSTREAM_TESTS       the classes or Class.test names to run
#                             (default TestFullyShard1DTrainingCore); FSDPTest classes
#                             (a process per rank) and FSDPTestMultiThread classes (a thread
#                             per rank, all in one process) alike
#   TIDE_UPSTREAM_MODES       TIDE modes to run (default "in_place"; "in_place slot_reuse")
#   TIDE_UPSTREAM_RUNS        which passes: "stock tide" (default), "stock" or "tide"
#   TIDE_LIBRARY              libtide.so to use (default build/libtide.so, built if absent)
#   TIDE_UPSTREAM_GPU_GATES   opt-in, for files not written for the CPU
#                             (test_fully_shard_state_dict.py): answer the file's GPU-count
#                             gates as a machine of N accelerators would (run_cpu.py's
#                             --gpu-gates; docs/torch-upstream-tests.md says which gates
#                             and why); unset: torch's gates as they are
#
# For every test, OUTDIR/summary.txt records passed / failed / skipped (with the reason)
# per run, and for the TIDE runs whether TIDE served the test: "served" means every rank
# registered TIDE groups and ran TIDE all-gathers and reduce-scatters through them (counted
# by the groups themselves); "fell back" / "partial" mean TIDE's switch was on but stock
# FSDP2 moved the bytes for all / some ranks, which is not a pass with TIDE ("served-fwd":
# served, in a test without a backward; "mixed": some calls of TIDE groups on stock); "skipped"
# means the test did not run.  The JSON files next to it hold the per-rank counters and
# tide.fsdp's log lines.
# Exit status: 0 when every run's non-skipped tests passed and every TIDE-run test that
# passed was served by TIDE; 1 otherwise.
set -uo pipefail
src=${1:?usage: tests/torch_upstream/run.sh PYTORCH_TEST_FILE_OR_DIR [OUTDIR]}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${2:-$root/bench/results/cpu-torch-upstream}
tests=${TIDE_UPSTREAM_TESTS:-TestFullyShard1DTrainingCore}
modes=${TIDE_UPSTREAM_MODES:-in_place}
runs=${TIDE_UPSTREAM_RUNS:-stock tide}
name=${TIDE_UPSTREAM_FILE:-test_fully_shard_training.py}
if [ -d "$src" ]; then
    for cand in "$src/test/distributed/_composable/fsdp/$name" "$src/$name"; do
        [ -f "$cand" ] && { file=$cand; break; }
    done
    [ -n "${file:-}" ] || { echo "no $name under $src" >&2; exit 2; }
else
    file=$src
fi
[ -f "$file" ] || { echo "no such file: $file" >&2; exit 2; }
file=$(cd "$(dirname "$file")" && pwd)/$(basename "$file")
python3 -c 'import expecttest' 2>/dev/null || {
    echo "torch's test helpers need expecttest: python3 -m pip install expecttest" >&2; exit 2; }
lib=${TIDE_LIBRARY:-$root/build/libtide.so}
if [ ! -f "$lib" ]; then
    cmake -S "$root" -B "$root/build" -DTIDE_WITH_CUDA=OFF -DTIDE_BUILD_TESTS=OFF >/dev/null &&
        cmake --build "$root/build" -j2 --target tide >/dev/null || { echo "building libtide failed" >&2; exit 2; }
fi
# torch's per-test limit (300 s) is sized for GPUs; 8 ranks on a few CPU cores need more.
export DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=${DISTRIBUTED_TESTS_DEFAULT_TIMEOUT:-1800}
# One intra-op thread per rank: eight ranks share the cores already.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$out"
summary=$out/summary.txt
{
    echo "# PyTorch FSDP2 upstream tests on the CPU (gloo), stock and with TIDE switched on"
    echo "# test file: $file (sha256 $(sha256sum "$file" | cut -c1-16))"
    echo "# torch $(python3 -c 'import torch; print(torch.__version__, torch.version.git_version)')"
    echo "# tests: $tests; TIDE modes: $modes; $(date -u +%Y-%m-%dT%H:%MZ); $(OMP_NUM_THREADS= nproc) cores"
    [ -z "${TIDE_UPSTREAM_GPU_GATES:-}" ] ||
        echo "# GPU-count gates answered as $TIDE_UPSTREAM_GPU_GATES accelerators (TIDE_UPSTREAM_GPU_GATES)"
} >"$summary"
status=0
run() { # run LABEL [ENV...]: one pass over the tests; the rest of the line is its environment
    local label=$1; shift
    echo "== $label" | tee -a "$summary"
    # shellcheck disable=SC2086
    env "$@" python3 "$root/tests/torch_upstream/run_cpu.py" --label "$label" \
        --out "$out/$label.json" "$file" $tests >"$out/$label.log" 2>&1
    local rc=$?
    python3 - "$out/$label.json" "$label" >>"$summary" <<'EOF' || rc=1
import json, re, sys
s = json.load(open(sys.argv[1]))
def reason(detail):
    # the exception's line: torch's failure text ends with a how-to-rerun note
    lines = detail.strip().splitlines() or [""]
    return next((l for l in reversed(lines)
                 if re.match(r"[\w.]*(Error|Exception|Exit)\b", l.strip())), lines[-1])
bad = 0
for c in s["cases"]:
    name = c["id"].split(".")[-1]
    line = "%-8s %-50s" % (c["status"], name)
    if s["tide_switch"]:
        t = c.get("tide_totals_rank0") or {}
        line += " tide=%-9s rank0: %d groups (tier1 %d, tier0 %d), %d TIDE all-gathers, " \
                "%d TIDE reduce-scatters, %d stock all-gathers, %d stock reductions" % (
                    c["tide"], t.get("groups", 0), t.get("tier1_groups", 0),
                    t.get("tier0_groups", 0), t.get("tide_all_gathers", 0),
                    t.get("tide_reduce_scatters", 0), t.get("stock_all_gathers", 0),
                    t.get("stock_reduces", 0))
        if c["status"] == "passed" and c["tide"] not in ("served", "served-fwd"):
            bad = 1
        for fb in sorted(set(c.get("tide_fallback_lines_rank0", []))):
            line += "\n         fallback: " + fb
    if c["status"] == "skipped":
        line += "  (" + c["detail"] + ")"
    if c["status"] in ("failed", "error"):
        bad = 1
        line += "\n         " + reason(c["detail"])[:300]
    print(line + "  [%ss]" % c["seconds"])
print("   %d passed, %d skipped, %d failed/error in %ss" % (
    sum(c["status"] == "passed" for c in s["cases"]),
    sum(c["status"] == "skipped" for c in s["cases"]),
    sum(c["status"] in ("failed", "error") for c in s["cases"]), s["seconds"]))
sys.exit(bad)
EOF
    [ $rc -eq 0 ] || status=1
}
case " $runs " in *" stock "*) run stock TIDE_FSDP= ;; esac
case " $runs " in *" tide "*)
    for mode in $modes; do
        run "tide-$mode" TIDE_FSDP="$mode" TIDE_LIBRARY="$lib" \
            PYTHONPATH="$root/python/tide/fsdp/sitecustomize:$root/python${PYTHONPATH:+:$PYTHONPATH}"
    done ;;
esac
cat "$summary"
exit $status
