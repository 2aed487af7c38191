#!/usr/bin/env bash
# test_tide_plan_program.sh - `tide-plan program`: listings, JSON, exit codes, and op counts
# against docs/protocol.md.
#   bash tests/cli/test_tide_plan_program.sh path/to/tide-plan
set -euo pipefail

TP=${1:?usage: test_tide_plan_program.sh path/to/tide-plan}
# shellcheck source=tests/cli/cli_util.sh
. "$(dirname "${BASH_SOURCE[0]}")/cli_util.sh"
cli_init
fails=0
checks=0

# has PATTERN WHAT: the last listing matches the extended regex PATTERN.
has() {
  checks=$((checks + 1))
  grep -Eq "$1" "$TMP/out" || fail "$2: no line matching '$1'"
}
hasnt() {
  checks=$((checks + 1))
  if grep -Eq "$1" "$TMP/out"; then fail "$2: unexpected line matching '$1'"; fi
}

# Properties every JSON listing has: counts agree with the op list, indices run 0..n-1 per
# queue, waits have 1 <= inc and thr <= inc, SUM/LAND reference a table of their kind, fused
# signals are objects or null, and the text listing of the same program has the same ops.
COMMON='
queues = [q["name"] for q in d["queues"]]
assert queues == ["ready", "caller", "ce", "done", "read", "net"], queues
total = 0
for q in d["queues"]:
    ops = [o for o in d["ops"] if o["queue"] == q["name"]]
    assert len(ops) == q["num_ops"], q
    assert [o["index"] for o in ops] == list(range(len(ops))), q["name"]
    kinds = {}
    for o in ops:
        kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
    assert kinds == q["kinds"], (q, kinds)
    total += q["num_ops"]
assert total == d["num_ops"] == len(d["ops"])
for o in d["ops"]:
    assert isinstance(o["bank"], bool)
    if o["kind"] == "wait":
        assert 1 <= o["inc"] and o["thr"] <= o["inc"], o
    if o["kind"] in ("sum", "land"):
        t = d["tables"][o["table"]]
        assert t["index"] == o["table"] and t["kind"] == o["kind"], (o, t)
    if o["kind"] in ("copy", "copy2d"):
        assert o["signal"] is None or set(o["signal"]) == {"ctr", "rank"}, o
        assert o["bytes"] > 0 and o["dst"]["kind"] != "none" and o["src"]["kind"] != "none"
    if o["kind"] == "copy2d":
        assert o["rows"] >= 1 and o["dst_pitch"] >= o["bytes"], o
text = open(sys.argv[1].replace(".json", ".txt")).read().splitlines()
ops_text = [l for l in text if not l.startswith("#")]
assert len(ops_text) == d["num_ops"], (len(ops_text), d["num_ops"])
for o, l in zip(d["ops"], ops_text):
    f = l.split()
    assert f[0] == "r%d" % d["rank"] and f[1] == o["queue"] and int(f[2]) == o["index"], (l, o)
    assert f[3].lower() == o["kind"], (l, o)
'

# listing_pair NAME ARGS...: text listing to NAME.txt, JSON to NAME.json; both must succeed.
listing_pair() {
  local name=$1
  shift
  if expect_rc 0 "$TP" program "$@"; then cp "$TMP/out" "$TMP/$name.txt"; fi
  if expect_rc 0 "$TP" program "$@" --json; then
    cp "$TMP/out" "$TMP/$name.json"
    check_json "$TMP/$name.json" "$COMMON"
  fi
  cp "$TMP/$name.txt" "$TMP/out"
}

# ---------------------------------------------------------------- TIDE-AG
# M = 2, L = 2, shapes 5x3 and 7 (bf16, N = 4): R_p = 2, 2; s_p = 12, 4 bytes; S = 16.
listing_pair ag22 --nodes 2 --gpus-per-node 2 --shapes 5x3,7 --collective ag --rank 1
has '^# all-gather program, rank 1 of 4 \(M = 2, L = 2\)$' "ag header"
for q in ready caller ce done; do has "^# queue $q: [0-9]+ ops$" "ag queue $q"; done
hasnt '^# queue (read|net):' "ag has no RS queues"
has '^r1 caller +[0-9]+ COPY +landing/r0\+' "ag own shard to a local peer"
has '^r1 caller +[0-9]+ COPY +arena/r3/recv_stage\+0 <- shard\+0 bytes=16 \+signal AG_ARRIVED\+0@r3$' \
  "ag rail put of the whole shard to (n+1 mod M, l)"
has '^r1 ce +[0-9]+ WAIT +AG_ARRIVED\+0 ' "ag scatter waits for round 0"
has '^r1 done +[0-9]+ EVENT +call-done$' "ag call-done event"
# Eq. (2): the own-shard copies land parameter p at Landing(p, r) = o_p N + r s_p on every
# local rank, s_p bytes each, from shard offset o_p.
check_json "$TMP/ag22.json" '
assert d["collective"] == "ag" and d["mode"] is None and d["rank"] == 1 and d["ranks"] == 4
N, r, L = 4, 1, 2
s = [2 * 3 * 2, 2 * 1 * 2]
o = [0, s[0]]
want = sorted((q, o[p] * N + r * s[p], o[p], s[p]) for q in range(L) for p in range(2))
got = sorted((c["dst"]["rank"], c["dst"]["offset"], c["src"]["offset"], c["bytes"])
             for c in d["ops"] if c["kind"] == "copy" and c["src"]["kind"] == "shard"
             and c["dst"]["kind"] == "landing")
assert got == want, (got, want)
'

# Bruck rounds: R = ceil(log2 M) round waits on the CE queue and R credits from DONE; at M = 9
# round 2 forwards a run of four stage slots, landed with strided 2D copies.  (The generic
# programs at L = 1; the default there is the rail lane, below.)
for m in 3 5 9; do
  r=$(python3 -c "import math; print(math.ceil(math.log2($m)))")
  listing_pair ag$m --nodes "$m" --gpus-per-node 1 --shapes 20x3,9 --collective ag --lane generic
  n=$(grep -Ec '^r0 ce +[0-9]+ WAIT +AG_ARRIVED\+' "$TMP/out" || true)
  [ "$n" = "$r" ] || fail "ag M=$m: $n round waits on the CE queue, want R = $r"
  n=$(grep -Ec '^r0 done +[0-9]+ SIGNAL +AG_CREDIT\+' "$TMP/out" || true)
  [ "$n" = "$r" ] || fail "ag M=$m: $n credits from DONE, want R = $r"
done
has '^r0 ce +[0-9]+ COPY2D ' "ag M=9: strided landing copies"

# A cast group converts the fp32 master shard first (fp32 dtype everywhere has no cast).
listing_pair agfp32 --nodes 2 --gpus-per-node 4 --preset llama3-70b-layer --collective ag --dtype fp32 --rank 7
hasnt ' CAST ' "fp32 ag: no cast"

# ---------------------------------------------------------------- TIDE-RS
# protocol.md: D = n_part M Level-1 sums per call (READ), one landing per wave
# (n_part ceil(M / W_wave), NET), one put per remote destination (n_part (M - 1)), one
# read-done and one call-done event; the CE queue exists only for L >= 2.
rs_counts() { # NAME M L W PASSES MODE RANK (generic programs)
  local name=$1 m=$2 l=$3 w=$4 passes=$5 mode=$6 rank=$7
  listing_pair "$name" --nodes "$m" --gpus-per-node "$l" --shapes 13x5,9,4x3x2 \
    --collective rs --wave-width "$w" --passes "$passes" --mode "$mode" --rank "$rank" \
    --lane generic
  check_json "$TMP/$name.json" "
M, L, W, n_part = $m, $l, $w, $passes
assert d['collective'] == 'rs' and d['mode'] == '$mode' and d['rank'] == $rank
assert d['wave_width'] == W and d['passes'] == n_part
q = {x['name']: x for x in d['queues']}
assert q['ready']['num_ops'] == q['caller']['num_ops'] == q['done']['num_ops'] == 0
assert q['read']['kinds'].get('sum', 0) == n_part * M, q['read']
# one landing per wave; at M = 1 one per owner's spare (L per pass)
assert q['net']['kinds'].get('land', 0) == n_part * (L if M == 1 else -(-M // W)), q['net']
puts = [o for o in d['ops'] if o['kind'] == 'copy' and o['src']['kind'] == 'arena'
        and o['src']['region'] == 'outbox']
assert len(puts) == n_part * (M - 1), len(puts)
for o in puts:
    assert o['dst']['region'] == 'inbox' and o['dst']['rank'] % L == $rank % L  # rail
    assert o['dst']['rank'] // L != $rank // L and o['signal'] is not None and o['bank']
ev = [(o['queue'], o['event']) for o in d['ops'] if o['kind'] == 'event']
assert ev == [('read', 'read-done'), ('net', 'call-done')], ev
assert (q['ce']['num_ops'] > 0) == (L >= 2), q['ce']
"
}
rs_counts rs22 2 2 2 1 in-place 1
has '^# reduce-scatter program, rank 1 of 4 \(M = 2, L = 2\)$' "rs header"
for q in ce read net; do has "^# queue $q: [0-9]+ ops$" "rs queue $q"; done
has '^r1 read +[0-9]+ SUM +table=[0-9]+ segs=[0-9]+ staged=arena/r1/staging\+' "rs Level-1 sum"
has '^r1 net +[0-9]+ LAND +table=[0-9]+ .* init$' "rs first landing initialises"
has '^r1 ce +[0-9]+ COPY2D +arena/r0/staging\+' "rs coalesced Level-1 push"
rs_counts rs32w 3 2 1 2 slot-reuse 4 # three waves per pass, both inbox generations
has ' ZERO ' "rs multi-wave: stale inbox blocks zeroed"
rs_counts rs21 2 1 1 1 in-place 0    # L = 1: no CE queue
hasnt '^# queue ce' "rs L = 1"
rs_counts rs14 1 4 4 3 slot-reuse 2  # M = 1: no puts, one wave per pass
rs_counts rs94 9 4 2 2 in-place 35

# ---------------------------------------------------------------- the rail lane (L = 1)
# The default at L = 1, M >= 2 (protocol.md, "The rail lane").  AG: no receive stage and no CE
# queue; R = ceil(log2 M) rounds, each a credit wait and landing-to-landing puts with a signal
# each; DONE waits every round's arrivals.  M = 5, rank 4: rounds send c_d = 1, 2, 1 shards;
# round 1's ranks 4, 0 wrap past M - 1, so two puts per parameter there.
listing_pair lane_ag --nodes 5 --gpus-per-node 1 --shapes 20x3,9 --collective ag --rank 4
check_json "$TMP/lane_ag.json" '
assert d["lane"] == "rail", d["lane"]
q = {x["name"]: x for x in d["queues"]}
assert q["ce"]["num_ops"] == 0 and q["read"]["num_ops"] == q["net"]["num_ops"] == 0, q
for o in d["ops"]:
    for k in ("dst", "src"):
        r = o.get(k)
        assert r is None or r.get("region") != "recv_stage", o
puts = [o for o in d["ops"] if o["kind"] == "copy" and o["dst"]["kind"] == "landing"
        and o["dst"]["rank"] != 4]
assert all(o["src"]["kind"] == "landing" and o["src"]["rank"] == 4 and o["signal"] for o in puts)
assert sorted({o["dst"]["rank"] for o in puts}) == [0, 2, 3], puts  # 4 - 1, 4 - 2, 4 - 4
# puts per round: 2 params x (1, 2, 1 runs)
assert len(puts) == 2 * (1 + 2 + 1), len(puts)
credits = [o for o in d["ops"] if o["queue"] == "caller" and o["kind"] == "wait"
           and 32 <= o["ctr"] < 60]
assert len(credits) == 3, credits
'
hasnt '^r4 ce ' "lane ag: no CE ops"
has '^r4 caller +[0-9]+ COPY +landing/r3\+[0-9]+ <- landing/r4\+' "lane ag: landing-to-landing put"
# RS: no CE queue, no Level-1 sum; one put chain per remote destination from the gradients
# into the target's inbox; landings read bf16 inbox blocks, then the own rows in place.
listing_pair lane_rs --nodes 4 --gpus-per-node 1 --shapes 13x5,9,4x3x2 --collective rs \
  --passes 2 --rank 1
check_json "$TMP/lane_rs.json" '
assert d["lane"] == "rail"
q = {x["name"]: x for x in d["queues"]}
assert q["ce"]["num_ops"] == 0 and "sum" not in q["read"]["kinds"], q
puts = [o for o in d["ops"] if o["kind"] == "copy"]
assert all(o["src"]["kind"] == "grad" and o["dst"]["region"] == "inbox" for o in puts), puts
assert {o["dst"]["rank"] for o in puts} == {0, 2, 3}
lands = [d["tables"][o["table"]] for o in d["ops"] if o["kind"] == "land"]
assert sum(t["in"][0]["kind"] == "arena" for t in lands) == 2 * 3, lands  # n_part (M - 1)
assert all(t["in"][0]["kind"] in ("arena", "grad") and t["in_bf16"] for t in lands)
regions = {r["region"] for o in d["ops"] for r in (o.get("dst"), o.get("src")) if r and "region" in r}
assert regions <= {"inbox"}, regions
ev = [(o["queue"], o["event"]) for o in d["ops"] if o["kind"] == "event"]
assert ev == [("net", "read-done"), ("net", "call-done")], ev
'
has '^r1 net +[0-9]+ LAND +table=[0-9]+ segs=[0-9]+ in=arena/r1/inbox\+0 bf16 init$' \
  "lane rs: first landing reads the bf16 inbox and initialises"
# The lane where it does not apply is refused by the library (exit 1); a bad name is a usage
# error (exit 2).
expect_rc 1 "$TP" program --nodes 4 --gpus-per-node 2 --shapes 5 --collective rs --lane rail || true
expect_rc 2 "$TP" program --nodes 4 --gpus-per-node 1 --shapes 5 --collective rs --lane fast || true

# Both modes run the same arithmetic: the same SUM and LAND ops, table for table.
for mode in in-place slot-reuse; do
  expect_rc 0 "$TP" program --nodes 4 --gpus-per-node 2 --preset wan2.2-block --collective rs \
    --mode "$mode" --rank 3 --json && cp "$TMP/out" "$TMP/wan-$mode.json"
done
check_json "$TMP/wan-in-place.json" '
s = json.load(open(sys.argv[1].replace("in-place", "slot-reuse")))
assert d["mode"] == "in-place" and s["mode"] == "slot-reuse"
def arith(x):
    return sorted((o["kind"], x["tables"][o["table"]]["num_segs"]) for o in x["ops"]
                  if o["kind"] in ("sum", "land"))
assert arith(d) == arith(s)
'

# ---------------------------------------------------------------- --stream-ops
# The reduce-scatter of the bench_fsdp_layers layer at N = 8, M = 1 (test_stream_ops.c has the
# counts at N = 2, 4, 8): 7 waits on the peers right before the sum, 45 stream memory
# operations per rank on the one-process-per-rank fabric with every signal of the program
# (63 with every wait alone), 5 with the synchronisation elided (its default; 11).
layer=4096x1,4096x4096,4096x4096,4096x4096,4096x4096,4096x1,11008x4096,11008x4096,4096x11008
expect_rc 0 "$TP" program --nodes 1 --gpus-per-node 8 --shapes "$layer" --collective rs \
    --rank 5 --stream-ops
grep -q "rank 5 of 8 (reduce-scatter, M = 1, L = 8, direct sums)" "$TMP/out" ||
    fail "--stream-ops: header"
grep -q "into the sums            7 waits (7 on other ranks) in 1 runs" "$TMP/out" ||
    fail "--stream-ops: the waits into the sum"
grep -q "stream memory operations 45 (63 with every wait alone" "$TMP/out" ||
    fail "--stream-ops: memory operations"
grep -q "synchronisation elided (its default here)" "$TMP/out" ||
    fail "--stream-ops: the elision is not shown"
grep -q "stream memory operations 5 (11 with every wait alone" "$TMP/out" ||
    fail "--stream-ops: memory operations with the elision"
grep -q "63 copies elided, 8 landings fused" "$TMP/out" || fail "--stream-ops: direct mode"
expect_rc 0 "$TP" program --nodes 1 --gpus-per-node 2 --shapes 5 --collective ag --stream-ops
grep -q "pushed path" "$TMP/out" || fail "--stream-ops: the all-gather is counted pushed"
expect_rc 2 "$TP" program --nodes 1 --gpus-per-node 2 --shapes 5 --collective rs --stream-ops \
    --json || true
grep -q "does not take --json" "$TMP/err" || fail "--stream-ops --json: not refused"

# ---------------------------------------------------------------- errors
expect_rc 2 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5 || true
grep -q -- "--collective is required" "$TMP/err" || fail "missing --collective not named"
expect_rc 2 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5 --collective xs || true
expect_rc 2 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5 --collective rs --rank one || true
grep -q -- "'--rank' expects an integer" "$TMP/err" || fail "bad --rank not named"
expect_rc 2 "$TP" program --gpus-per-node 2 --shapes 5 --collective rs || true
expect_rc 2 "$TP" program --nodes 2 --gpus-per-node 2 --collective rs || true
expect_rc 2 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5 --preset wan2.2-block --collective rs || true
expect_rc 2 "$TP" program --nodes 2 --gpus-per-node 2 --preset nope --collective rs || true
expect_rc 2 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5x0 --collective rs || true
expect_rc 2 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5 --collective rs --mode sideways || true
expect_rc 2 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5 --collective rs --bogus || true
expect_rc 2 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5 --collective rs extra || true
expect_rc 1 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5 --collective rs --rank 4 || true
grep -q "outside \[0, 4)" "$TMP/err" || fail "--rank 4 of 4: range not named"
expect_rc 1 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5 --collective ag --rank -1 || true
expect_rc 1 "$TP" program --nodes 0 --gpus-per-node 2 --shapes 5 --collective ag || true
grep -q "tide_plan_create" "$TMP/err" || fail "a rejected plan does not name the call"
expect_rc 1 "$TP" program --nodes 9 --gpus-per-node 8 --shapes 5 --collective rs --wave-width 3 || true
expect_rc 1 "$TP" program --nodes 2 --gpus-per-node 2 --shapes 5 --collective rs --dtype fp16 || true
expect_rc 0 "$TP" program --help
grep -q "tide-plan program" "$TMP/out" || fail "--help does not print the usage"
expect_rc 0 "$TP" --help
grep -q "tide-plan program" "$TMP/out" || fail "tide-plan --help does not list program"

passed=$((checks - fails))
echo "$passed passed, $fails failed"
[ "$fails" = 0 ]
