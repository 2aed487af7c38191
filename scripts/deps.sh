#!/usr/bin/env bash
# Install what the build and the tests need on a fresh Debian machine (idempotent).
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang libclang-rt-14-dev libcmocka-dev libcjson-dev python3-pip)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
if [ -f python/requirements-test.txt ]; then
  # A Debian system Python refuses user installs (PEP 668); the pins are test-only.
  python3 -m pip install -q -r python/requirements-test.txt 2>/dev/null ||
    python3 -m pip install -q --break-system-packages -r python/requirements-test.txt
fi
# torch for the FSDP2 tests (the lightest install that imports: see the script).
./scripts/install-torch.sh
