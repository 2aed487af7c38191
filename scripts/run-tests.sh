#!/usr/bin/env bash
# The test command: install dependencies, build (CPU only), run every CPU test.
#   ./scripts/run-tests.sh            full suite (what CI runs)
#   TIDE_TEST_QUICK=1 ./scripts/...   skip the sanitizer builds and the fuzz run
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=$(nproc)

echo "== build (release, CPU only)"
cmake -S . -B build -DTIDE_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
echo "== ctest"
(cd build && ctest --output-on-failure -j"$jobs")

if [ -d python/tests ]; then
  echo "== pytest"
  TIDE_LIBRARY="$PWD/build/libtide.so" python3 -m pytest -q python/tests
fi

echo "== pip install . (a fresh virtual environment, CPU build)"
bash tests/packaging/test_pip_install.sh

if [ "${TIDE_TEST_QUICK:-0}" != 1 ]; then
  echo "== ASan+UBSan build"
  cmake -S . -B build-asan -DTIDE_WITH_CUDA=OFF -DTIDE_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug >/dev/null
  cmake --build build-asan -j"$jobs"
  (cd build-asan && TIDE_TIMEOUT_MS=120000 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$jobs")
  echo "== TSan build (the whole CPU suite: the fabric runs ranks as threads)"
  cmake -S . -B build-tsan -DTIDE_WITH_CUDA=OFF -DTIDE_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug >/dev/null
  cmake --build build-tsan -j"$jobs"
  # Sanitized ranks run 10-50x slower; the fabric deadline is a safety net, not a timing test.
  (cd build-tsan && TIDE_TIMEOUT_MS=120000 TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j"$jobs")
  if [ -f tests/fuzz/run.sh ]; then
    echo "== fuzz (brief)"
    bash tests/fuzz/run.sh
  fi
fi
echo "== all tests passed"
