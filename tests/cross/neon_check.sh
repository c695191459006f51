#!/usr/bin/env bash
# Builds tests/cross/neon_vs_scalar.cpp for aarch64 and runs it under qemu-aarch64.
# Exit 77 (skipped) when the cross compiler or qemu is missing
# (apt-get install g++-aarch64-linux-gnu qemu-user).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$(mktemp -d)}
command -v aarch64-linux-gnu-g++ >/dev/null || { echo "skip: no aarch64-linux-gnu-g++"; exit 77; }
command -v qemu-aarch64 >/dev/null || { echo "skip: no qemu-aarch64"; exit 77; }
aarch64-linux-gnu-g++ -std=c++20 -O2 -ffp-contract=off -static -I"$src/include" -I"$src" \
  "$src/tests/cross/neon_vs_scalar.cpp" -o "$out/neon_vs_scalar"
qemu-aarch64 "$out/neon_vs_scalar"
