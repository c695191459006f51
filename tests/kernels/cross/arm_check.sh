#!/usr/bin/env bash
# Builds tests/kernels/cross/arm_vs_scalar.cpp for aarch64 with the NEON kernels and the SVE
# instances (kernels/cpu/kernels_sve.cpp at 128, 256 and 512 bits) and runs it under
# qemu-aarch64: at SVE vector lengths 128, 256 and 512 (the matching instance must be chosen and
# equal the scalar reference bit for bit), at 384 (no instance: NEON serves) and on a CPU
# without SVE.
# Exit 77 (skipped) when the cross compiler or qemu is missing
# (apt-get install g++-aarch64-linux-gnu qemu-user).
set -euo pipefail
src=$(cd "$(dirname "$0")/../../.." && pwd)
out=${1:-$(mktemp -d)}
command -v aarch64-linux-gnu-g++ >/dev/null || { echo "skip: no aarch64-linux-gnu-g++"; exit 77; }
command -v qemu-aarch64 >/dev/null || { echo "skip: no qemu-aarch64"; exit 77; }
cxx=(aarch64-linux-gnu-g++ -std=c++20 -O2 -ffp-contract=off -I"$src/include" -I"$src")
objs=()
for bits in 128 256 512; do
  "${cxx[@]}" -march=armv8.2-a+sve -msve-vector-bits=$bits -DTIERSWAP_SVE_BITS=$bits \
    -c "$src/kernels/cpu/kernels_sve.cpp" -o "$out/kernels_sve$bits.o"
  objs+=("$out/kernels_sve$bits.o")
done
"${cxx[@]}" -static "$src/tests/kernels/cross/arm_vs_scalar.cpp" "${objs[@]}" \
  -o "$out/arm_vs_scalar"
for bits in 128 256 512; do
  qemu-aarch64 -cpu max,sve-default-vector-length=$((bits / 8)) "$out/arm_vs_scalar" $bits
done
qemu-aarch64 -cpu max,sve-default-vector-length=48 "$out/arm_vs_scalar" 0
qemu-aarch64 -cpu cortex-a72 "$out/arm_vs_scalar" 0
