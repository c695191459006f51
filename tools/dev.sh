#!/usr/bin/env bash
# The README's two commands, for a fresh Debian machine:
#   tools/dev.sh run  [tierswap demo options]  install what is missing, build, run the main job
#   tools/dev.sh test                          install what is missing, build, run every test
# `run` measures the swap engine (`tierswap bench io` on a temporary directory), then runs
# `tierswap demo`: a synthetic model trained a few steps by the sharded optimizer with its state on
# the NVMe tier of a temporary swap directory, ending with the residency tables.
# `test` builds three times: the normal build (whole suite, the > 4 GiB transfers included), an
# ASan+UBSan build (whole suite but the > 4 GiB transfers), and a ThreadSanitizer build of the
# concurrent components (tier manager, I/O engine, thread pool, the optimizer over them).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake ninja-build g++ pkg-config liburing-dev libaio-dev libfmt-dev libcli11-dev
          nlohmann-json3-dev libxxhash-dev libnuma-dev libgtest-dev libgmock-dev libbenchmark-dev
          libopenmpi-dev openmpi-bin libhwloc-dev)
# The test command also checks the NEON and SVE kernels on an x86 machine: cross compiler + qemu.
TEST_PACKAGES=(g++-aarch64-linux-gnu qemu-user)

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "dev.sh: installing ${missing[*]}"
    local sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
}

build() {  # build DIR [cmake args...]
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j "$(nproc)"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  run)
    install_missing
    build build
    # The embedded default: a temporary swap directory, 1 GiB written then read, 3 runs; then the
    # synthetic model (260M parameters, two groups, 3 AdamW steps) with its state on NVMe.
    build/tierswap bench io
    echo
    exec build/tierswap demo "$@"
    ;;
  test)
    extra=()
    [ "$(uname -m)" = x86_64 ] && extra=("${TEST_PACKAGES[@]}")
    install_missing "${extra[@]}"
    build build
    (cd build && ctest --output-on-failure -j 2 --timeout 900)
    build build-asan -DTIERSWAP_SANITIZE=ON -DTIERSWAP_BUILD_BENCHMARKS=OFF
    (cd build-asan && TIERSWAP_SKIP_LARGE=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       ctest --output-on-failure -j 2 --timeout 900 -LE slow)
    cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIERSWAP_SANITIZE=thread \
      -DTIERSWAP_BUILD_BENCHMARKS=OFF -DTIERSWAP_WITH_CUDA=OFF >/dev/null
    cmake --build build-tsan -j "$(nproc)" \
      --target test_tier_manager test_thread_pool test_io_engine test_io_faults test_optimizer
    (cd build-tsan && TIERSWAP_SKIP_LARGE=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
       ctest --output-on-failure -j 2 --timeout 900 \
       -R '^(TierManager|TierManagerCrash|Telemetry|ThreadPool|Backends/EngineTest|Backends/FaultTest|ShardedOptimizer)[.]')
    ;;
  *)
    echo "usage: tools/dev.sh run [demo options] | tools/dev.sh test" >&2
    exit 2
    ;;
esac
