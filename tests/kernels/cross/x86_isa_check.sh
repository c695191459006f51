#!/usr/bin/env bash
# The x86 kernel choice on CPUs older than this one, under qemu-x86_64: the kernel tests and
# `tierswap info` on a CPU without AVX (Nehalem: the scalar kernels) and on one with AVX2 but no
# AVX-512 (Haswell). Nothing compiled for an ISA the CPU lacks may run, not even to build its
# kernel table (a build for AVX-512 hosts once died with SIGILL on an AVX2-only EPYC).
# usage: x86_isa_check.sh BUILD_DIR. Exit 77 (skipped) off x86-64 or without qemu-x86_64
# (apt-get install qemu-user).
set -euo pipefail
build=${1:?usage: x86_isa_check.sh BUILD_DIR}
[ "$(uname -m)" = x86_64 ] || { echo "skip: not an x86-64 host"; exit 77; }
command -v qemu-x86_64 >/dev/null || { echo "skip: no qemu-x86_64"; exit 77; }

expect_isa() {  # expect_isa QEMU_CPU ISA
  local got
  got=$(qemu-x86_64 -cpu "$1" "$build/tierswap" info --json |
        /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["cpu_isa"], *j["cpu_isas"])')
  [ "$got" = "$2" ] || { echo "FAIL: -cpu $1: tierswap info says '$got', expected '$2'"; exit 1; }
  echo "ok: -cpu $1: $got"
}
expect_isa Nehalem "scalar scalar"
expect_isa Haswell "avx2 scalar avx2"

# Every kernel test on the scalar CPU (the SIMD instances must not be listed, let alone run) ...
list=$(qemu-x86_64 -cpu Nehalem "$build/tests/test_kernels" --gtest_list_tests)
if grep -q -E "avx|neon|sve" <<<"$list"; then
  echo "FAIL: -cpu Nehalem lists SIMD kernel tests:"; echo "$list"; exit 1
fi
qemu-x86_64 -cpu Nehalem "$build/tests/test_kernels"
# ... and on the AVX2 CPU the AVX2 instance, without AVX-512 (a subset: AVX2 under emulation is
# slow; the whole set runs natively on every AVX2 host).
list=$(qemu-x86_64 -cpu Haswell "$build/tests/test_kernels" --gtest_list_tests)
grep -q "avx2" <<<"$list" || { echo "FAIL: -cpu Haswell lists no AVX2 test"; exit 1; }
if grep -q "avx512" <<<"$list"; then echo "FAIL: -cpu Haswell lists AVX-512 tests"; exit 1; fi
qemu-x86_64 -cpu Haswell "$build/tests/test_kernels" \
  --gtest_filter='KernelApi.*:Isa/SimdVsScalar.Casts/avx2:Isa/SimdVsScalar.StatsAndAccumulate/avx2'
