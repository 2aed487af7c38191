#!/usr/bin/env bash
# test_tide_plan.sh - tide-plan's documented commands, exit codes and JSON fields.
#   bash tests/cli/test_tide_plan.sh path/to/tide-plan
set -euo pipefail

TP=${1:?usage: test_tide_plan.sh path/to/tide-plan}
# shellcheck source=tests/cli/cli_util.sh
. "$(dirname "${BASH_SOURCE[0]}")/cli_util.sh"
cli_init
fails=0
checks=0

# ---------------------------------------------------------------- show, every preset
for preset in llama3-70b-layer wan2.2-block qwen3-30b-a3b-layer; do
  for topo in "1 8" "8 8" "9 8" "64 8"; do
    set -- $topo
    if expect_rc 0 "$TP" show --nodes "$1" --gpus-per-node "$2" --preset "$preset"; then
      grep -q "TIDE-AG" "$TMP/out" || fail "show $preset $topo: no TIDE-AG section"
      grep -q "TIDE-RS" "$TMP/out" || fail "show $preset $topo: no TIDE-RS section"
      grep -q "landing0" "$TMP/out" || fail "show $preset $topo: no arena"
    fi
    if expect_rc 0 "$TP" show --nodes "$1" --gpus-per-node "$2" --preset "$preset" --json; then
      cp "$TMP/out" "$TMP/show.json"
      check_json "$TMP/show.json" "
M, L = $1, $2
N = M * L
assert d['preset'] == '$preset' and d['nodes'] == M and d['gpus_per_node'] == L
assert d['ranks'] == N and d['num_params'] == len(d['params'])
off = 0
for p in d['params']:
    R = -(-p['dim0'] // N)
    assert p['rows_per_rank'] == R
    assert p['shard_bytes'] == R * p['inner'] * 2
    assert p['shard_offset'] == off
    off += p['shard_bytes']
assert d['shard_bytes'] == off and d['group_bytes'] == N * off
assert d['fp32_shard_bytes'] == 2 * off and d['fsdp2_pack_bytes'] == 2 * N * off
R = (M - 1).bit_length()
assert d['ag']['num_rounds'] == R and len(d['ag']['rounds']) == R
assert sum(r['count'] for r in d['ag']['rounds']) == M - 1
rs = d['rs']
assert rs['wave_width'] == L and rs['waves_per_pass'] == -(-M // L)
assert len(rs['waves']) == rs['num_waves'] and len(rs['rounds']) == rs['num_rounds']
assert sum(w['count'] for w in rs['waves']) == M
assert all(len(w['zero_mask']) == L for w in rs['waves'])
regions = d['arena']['regions']
assert [r['name'] for r in regions][:2] == ['landing0', 'landing1'] and len(regions) == 9
end = 0
for r in regions:
    assert r['offset'] % 4096 == 0 and r['offset'] >= end
    end = r['offset'] + r['bytes']
assert end <= d['arena']['total_bytes']
m = d['memory']
assert m['fsdp2_total_bytes'] == 2 * d['group_bytes'] + d['fsdp2_pack_bytes']
assert m['tide_arena_bytes'] == d['arena']['total_bytes']
assert m['bounds_ns']['fsdp2_total_ns'] == 4
"
    fi
  done
done

# Tuning options reach the plan; --shapes parses AxBxC lists.
if expect_rc 0 "$TP" show --nodes 16 --gpus-per-node 8 --shapes 8192x8192,1024x8192,8192,128x768x2048 \
  --dtype fp32 --mode slot-reuse --wave-width 4 --round-width 4 --passes 2 --json; then
  cp "$TMP/out" "$TMP/shapes.json"
  check_json "$TMP/shapes.json" "
assert d['preset'] is None and d['num_params'] == 4
assert [(p['dim0'], p['inner']) for p in d['params']] == [(8192, 8192), (1024, 8192), (8192, 1), (128, 768 * 2048)]
assert d['ag_dtype'] == 'fp32' and d['grad_dtype'] == 'fp32' and d['mode'] == 'slot-reuse'
assert d['wave_width'] == 4 and d['round_width'] == 4 and d['passes'] == 2
assert d['rs']['waves_per_pass'] == 4 and d['rs']['num_waves'] == 8
assert d['params'][0]['shard_bytes'] == 64 * 8192 * 4
"
fi

# ---------------------------------------------------------------- memory (§5.4)
if expect_rc 0 "$TP" memory --nodes 64 --gpus-per-node 8 --round-width 4 --inbox-generations 2 --json; then
  cp "$TMP/out" "$TMP/mem.json"
  check_json "$TMP/mem.json" "
assert round(d['in_place_staging_ns'], 3) == 0.594
assert round(d['slot_reuse_staging_ns'], 3) == 0.164
assert round(d['in_place_total_ns'], 2) == 3.72
assert round(d['slot_reuse_total_ns'], 2) == 2.29
assert d['fsdp2_total_ns'] == 4
"
fi
expect_rc 0 "$TP" memory --nodes 64 --gpus-per-node 8 --round-width 4 --inbox-generations 2 &&
  { grep -q "0.594" "$TMP/out" || fail "memory text lacks 0.594"; }

# ---------------------------------------------------------------- memory --model (docs/arena.md)
# Llama-3.1-70B at N = 64, blocks only (the issue's accounting): stock about 24 GiB per GPU,
# TIDE In-Place about 22.5; the shared arena a small fraction of one arena per group.
if expect_rc 0 "$TP" memory --model llama-3.1-70b --nodes 8 --gpus-per-node 8 --no-root --json; then
  cp "$TMP/out" "$TMP/model.json"
  check_json "$TMP/model.json" "
G = 2.0 ** 30
assert d['groups'] == 80 and not d['root']
assert 23.0 < d['stock']['total'] / G < 25.0, d['stock']['total'] / G
assert 21.5 < d['tide']['total'] / G < 23.0, d['tide']['total'] / G
a = d['arena']
assert a['landing0'] == a['landing1'] == d['bounds_ns']['unit_bytes']
assert a['total'] < 2 * a['landing0'] + a['recv_stage'] + a['staging'] + a['outbox'] + a['spare'] + a['inbox'] + a['signals'] + 20 * 4096
assert a['separate_arenas'] > 50 * a['total']
assert d['tide']['arena'] == a['total']
"
fi
if expect_rc 0 "$TP" memory --model Llama-3.1-70B --nodes 8 --gpus-per-node 8 --mode slot-reuse --json; then
  cp "$TMP/out" "$TMP/model_sr.json"
  check_json "$TMP/model_sr.json" "
assert d['groups'] == 81 and d['root'] and d['mode'] == 'slot-reuse'
assert d['tide']['autograd_grads'] == 0 and d['stock']['root_unsharded'] > 0
assert d['arena']['own_slots'] == d['stock']['root_unsharded']
"
fi
expect_rc 0 "$TP" memory --model qwen3-30b-a3b --nodes 1 --gpus-per-node 8 &&
  { grep -q "TIDE arena by region" "$TMP/out" || fail "memory --model text lacks the regions"; }
expect_rc 2 "$TP" memory --model gpt-5 --nodes 1 --gpus-per-node 8 || true
expect_rc 2 "$TP" memory --model llama-3.1-8b --nodes 1 --gpus-per-node 8 --round-width 2 || true
expect_rc 2 "$TP" memory --nodes 1 --gpus-per-node 8 --round-width 2 --inbox-generations 1 --mode slot-reuse || true

# ---------------------------------------------------------------- solve (App. G)
if expect_rc 0 "$TP" solve --nodes 8 --gpus-per-node 8 --bw-nic 47.5 --bw-sum 99 --bw-land 21 \
  --bw-cap 90 --t-round 1.3 --bytes 32MiB --json; then
  cp "$TMP/out" "$TMP/solve.json"
  check_json "$TMP/solve.json" "
assert d['round_width'] == 4 and d['sum_ctas'] == 4 and d['landing_ctas'] == 4
assert d['rounds'] == 2 and abs(d['t_nic_ms'] - 7 * 32 * 2**20 / 47.5e9 * 1e3) < 1e-9
assert d['fp32_shard_bytes'] == 32 * 2**20
"
fi
expect_rc 0 "$TP" solve --nodes 8 --gpus-per-node 8 --bw-nic 47.5 --bw-sum 99 --bw-land 21 \
  --bw-cap 90 --t-round 1.3 --bytes 33554432 && { grep -q "round width k *4" "$TMP/out" || fail "solve text"; }
# One node: --bw-link sizes the sum (28 CTAs at L = 2, bf16); a bad rate is a library error.
if expect_rc 0 "$TP" solve --nodes 1 --gpus-per-node 2 --bw-nic 47.5 --bw-sum 99 --bw-land 21 \
  --bw-cap 90 --t-round 1.3 --bytes 32MiB --bw-link 450 --json; then
  check_json "$TMP/out" "assert d['sum_ctas'] == 28 and d['bw_link_gbps'] == 450 and d['rounds'] == 0"
fi
# --bw-sum 0: the library's rate for L sources (33 CTAs at L = 2, bf16: docs/tide-plan.md).
if expect_rc 0 "$TP" solve --nodes 1 --gpus-per-node 2 --bw-nic 47.5 --bw-sum 0 --bw-land 21 \
  --bw-cap 90 --t-round 1.3 --bytes 32MiB --bw-link 450 --json; then
  check_json "$TMP/out" "assert d['sum_ctas'] == 33"
fi
expect_rc 1 "$TP" solve --nodes 1 --gpus-per-node 2 --bw-nic 47.5 --bw-sum -1 --bw-land 21 \
  --bw-cap 90 --t-round 1.3 --bytes 32MiB --bw-link 450 || true
expect_rc 1 "$TP" solve --nodes 1 --gpus-per-node 2 --bw-nic 47.5 --bw-sum 99 --bw-land 21 \
  --bw-cap 90 --t-round 1.3 --bytes 32MiB --bw-link -3 || true

# ---------------------------------------------------------------- validate (App. D)
# The full M <= 1024 sweep takes seconds in a release build and about a minute under ASan,
# where the sweep adds nothing a shorter one does not: sanitizer builds check M <= 128.
mmax=1024
if grep -q __asan_init "$TP" 2>/dev/null; then mmax=128; fi
if expect_rc 0 "$TP" validate --gpus-per-node 8 --max-nodes "$mmax" --json; then
  cp "$TMP/out" "$TMP/validate.json"
  check_json "$TMP/validate.json" "
Mmax = $mmax
assert d['verified'] is True
assert d['gpus_per_node'] == 8 and d['max_nodes'] == Mmax
pairs = d['pairs']
assert len(pairs) == (Mmax - 1) * 8
acc = {(p['nodes'], p['wave_width']): p['accepted'] for p in pairs}
assert len(acc) == (Mmax - 1) * 8
assert all(acc[(m, w)] for m in range(2, Mmax + 1) for w in (1, 2, 4, 8))
assert acc[(9, 3)] is False
assert d['accepted_pairs'] == sum(acc.values())
assert d['rejected_pairs'] == len(acc) - d['accepted_pairs']
assert d['accepted'] == 24 * d['accepted_pairs'] and d['rejected'] == 24 * d['rejected_pairs']
"
fi
# The verdicts do not depend on the thread count.
if expect_rc 0 "$TP" validate --gpus-per-node 8 --max-nodes 40 --jobs 1 --json; then
  cp "$TMP/out" "$TMP/v1.json"
  expect_rc 0 "$TP" validate --gpus-per-node 8 --max-nodes 40 --jobs 3 --json &&
    { cmp -s "$TMP/out" "$TMP/v1.json" || fail "validate output depends on --jobs"; }
fi
expect_rc 0 "$TP" validate --gpus-per-node 8 --max-nodes 16 &&
  { grep -q "verified: yes" "$TMP/out" || fail "validate text lacks 'verified: yes'"; }
# L = 1 with --programs: the static checker on every compiled program of M = 1..16, the rail
# lane (the default there) and the generic programs; per M >= 2 two lanes x two pass counts x
# bf16 / cast x (AG + two RS modes) = 24 programs, 12 at M = 1.
if expect_rc 0 "$TP" validate --gpus-per-node 1 --max-nodes 16 --programs --json; then
  check_json "$TMP/out" "
assert d['verified'] is True
assert d['programs'] == {'checked': 12 + 15 * 24, 'failed': 0, 'first_failure': None}, d['programs']
assert d['accepted'] == 24 * 15 and d['rejected'] == 0
"
fi

# ---------------------------------------------------------------- errors
expect_rc 2 "$TP" || true
expect_rc 2 "$TP" bogus || true
expect_rc 2 "$TP" show --gpus-per-node 8 --preset llama3-70b-layer || true  # no --nodes
expect_rc 2 "$TP" show --nodes 8 --gpus-per-node 8 || true                  # no group
expect_rc 2 "$TP" show --nodes 8 --gpus-per-node 8 --preset llama3-70b-layer --shapes 4 || true
expect_rc 2 "$TP" show --nodes 8 --gpus-per-node 8 --preset nope || true
expect_rc 2 "$TP" show --nodes x8 --gpus-per-node 8 --preset llama3-70b-layer || true
expect_rc 2 "$TP" show --nodes 8 --gpus-per-node 8 --shapes 8192x0 || true
expect_rc 2 "$TP" show --nodes 8 --gpus-per-node 8 --shapes 8192,,4 || true
expect_rc 2 "$TP" show --nodes 8 --gpus-per-node 8 --preset llama3-70b-layer --dtype int8 || true
expect_rc 2 "$TP" show --nodes 8 --gpus-per-node 8 --preset llama3-70b-layer --frobnicate || true
expect_rc 2 "$TP" show --nodes 8 --gpus-per-node 8 --preset llama3-70b-layer extra || true
expect_rc 2 "$TP" show --nodes || true
expect_rc 2 "$TP" memory --nodes 64 --gpus-per-node 8 --round-width 4 || true
expect_rc 2 "$TP" solve --nodes 8 --gpus-per-node 8 --bytes 32MiB || true
expect_rc 2 "$TP" solve --nodes 8 --gpus-per-node 8 --bw-nic 47.5 --bw-sum 99 --bw-land 21 \
  --bw-cap 90 --t-round 1.3 --bytes 32XB || true
expect_rc 2 "$TP" validate --gpus-per-node 8 || true
expect_rc 2 "$TP" validate --gpus-per-node 9 --max-nodes 4 || true
expect_rc 2 "$TP" validate --gpus-per-node 8 --max-nodes 9 --programs || true  # N = 72 > 64
# Usage errors print one line naming the problem, then the usage.
expect_rc 2 "$TP" show --nodes 8 --gpus-per-node 8 --preset nope || true
head -1 "$TMP/err" | grep -q "unknown preset 'nope'" || fail "usage error line: $(head -1 "$TMP/err")"
grep -q "^usage:" "$TMP/err" || fail "usage error without usage"

# Library errors exit 1 with the library's message.
expect_rc 1 "$TP" show --nodes 9 --gpus-per-node 8 --wave-width 3 --preset llama3-70b-layer &&
  { grep -q "plan rejected" "$TMP/err" || fail "rejected plan message: $(cat "$TMP/err")"; }
expect_rc 1 "$TP" show --nodes 0 --gpus-per-node 8 --preset llama3-70b-layer || true
expect_rc 1 "$TP" show --nodes 8 --gpus-per-node 8 --preset llama3-70b-layer --dtype fp16 || true
expect_rc 1 "$TP" memory --nodes 64 --gpus-per-node 8 --round-width 4 --inbox-generations 3 || true
expect_rc 1 "$TP" solve --nodes 8 --gpus-per-node 8 --bw-nic 0 --bw-sum 99 --bw-land 21 \
  --bw-cap 90 --t-round 1.3 --bytes 32MiB || true

# Help exits 0 on stdout.
expect_rc 0 "$TP" --help && { grep -q "tide-plan show" "$TMP/out" || fail "--help"; }
expect_rc 0 "$TP" solve --help || true

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed" >&2
  exit 1
fi
echo "tide-plan CLI: all $checks checks passed"
