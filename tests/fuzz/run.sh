#!/usr/bin/env bash
# run.sh - build every tests/fuzz/fuzz_*.c with libFuzzer + ASan + UBSan and run each briefly.
#   bash tests/fuzz/run.sh            30 s per target (FUZZ_SECONDS overrides)
# Exits non-zero on any finding (crash, leak, UB, trap) or build failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${FUZZ_SECONDS:-30}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cc=${FUZZ_CC:-clang}
# Warnings stay warnings here: the -Werror gate is the CMake build; this one looks for bugs.
flags=(-std=c11 -g -O1 -D_GNU_SOURCE -Wall -Wextra -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iinclude -Isrc)
# The host library exactly as CMake globs it (CPU only), so every symbol resolves.
shopt -s nullglob
lib_sources=(src/core/*.c src/api/*.c src/plan/*.c src/program/*.c src/kernels/*.c src/fabric/*.c
             src/fabric/cpu/*.c)

status=0
for target in tests/fuzz/fuzz_*.c; do
  name=$(basename "$target" .c)
  echo "== $name: build"
  "$cc" "${flags[@]}" "$target" "${lib_sources[@]}" -lm -lpthread -lrt -o "$work/$name"
  mkdir -p "$work/$name.corpus"
  echo "== $name: run ${seconds}s"
  if ! (cd "$work" && TIDE_DEBUG=NONE ASAN_OPTIONS=detect_leaks=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "./$name" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
        "$name.corpus" 2>"$work/$name.log"); then
    tail -60 "$work/$name.log" >&2
    echo "== $name: FINDING (see above)" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|Done" "$work/$name.log" || true
  fi
done
exit "$status"
