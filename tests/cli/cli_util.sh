# shellcheck shell=bash disable=SC2154  # fails and checks are the test's
# cli_util.sh - sourced by the tide-plan CLI tests (test_tide_plan.sh,
# test_tide_plan_program.sh): a scratch folder, failures counted instead of stopping at the
# first, and the checks they share.
#
#   cli_init               TMP (a folder removed at exit), TIDE_DEBUG=NONE
#   fail MSG...            print FAIL: MSG, count it in fails (the test sets fails=0)
#   expect_rc CODE CMD...  count a check in checks (the test sets checks=0), run CMD (stdout to $TMP/out, stderr to $TMP/err); its exit status
#                          must be CODE, else fail (with CMD's stderr) and return 1
#   check_json FILE PY     run the assert block PY with d = FILE's parsed JSON; fail if it raises
cli_init() {
  TMP=$(mktemp -d)
  trap 'rm -rf "$TMP"' EXIT
  export TIDE_DEBUG=NONE
}

fail() {
  echo "FAIL: $*" >&2
  fails=$((fails + 1))
}

expect_rc() {
  local want=$1
  shift
  local rc=0
  checks=$((checks + 1))
  "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  if [ "$rc" != "$want" ]; then
    fail "exit $rc (want $want): $*"
    sed 's/^/  | /' "$TMP/err" >&2
    return 1
  fi
}

check_json() {
  checks=$((checks + 1))
  python3 - "$1" "$2" <<'PY' || fail "JSON check failed: $2"
import json, sys
d = json.load(open(sys.argv[1]))
exec(sys.argv[2])
PY
}
