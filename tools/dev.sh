#!/usr/bin/env bash
# The README's two commands, for a fresh Debian machine:
#   tools/dev.sh run  [tinylm options]  install what is missing, build, run the main job
#   tools/dev.sh test                   install what is missing, build, run every test
# `run` trains tierswap.tinylm (a small byte-level transformer LM in bf16, PyTorch from Debian's
# python3-torch) for 30 steps through tierswap.torch.AdamW with its state on the NVMe tier of a
# temporary swap directory: loss, tokens/s and NVMe bytes per step, then the residency table; on
# the GPU when torch sees one (the first line says which device).
# `test` builds four times: the normal build (whole suite, the > 4 GiB transfers included, then
# the Python tests with pytest), an ASan+UBSan build (whole suite but the > 4 GiB transfers), a
# ThreadSanitizer build of the concurrent components (tier manager, I/O engine, thread pool, the
# optimizer over them, the node service without its fork()ing tests), and the libFuzzer targets (clang, ASan+UBSan): each replays its seed
# corpus and fuzzes for TIERSWAP_FUZZ_SECONDS (default 25). After the Python tests it builds the
# reference documentation (tools/docs/build.sh --check: warnings are errors, links checked).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake ninja-build g++ pkg-config liburing-dev libaio-dev libfmt-dev libcli11-dev
          nlohmann-json3-dev libxxhash-dev libnuma-dev libgtest-dev libgmock-dev libbenchmark-dev
          libopenmpi-dev openmpi-bin libhwloc-dev python3-dev pybind11-dev python3-torch
          python3-pytest python3-matplotlib libcpp-httplib-dev
          libflatbuffers-dev libsystemd-dev libopenblas0-openmp)
# libopenblas0-openmp: torch's fp32 matrix products through OpenBLAS instead of Debian's
# reference BLAS (tinylm's forward and backward: 0.14 s a step instead of 3 s on a 2-core EPYC).
# The OpenMP build shares torch's libgomp threads; the pthread build's threads and torch's
# spinning OpenMP threads took turns on the cores (0.2-0.8 s a step at 2 torch threads).
# Debian's interpreter: python3-torch is built for it (another python3 may come first on PATH).
PYTHON=/usr/bin/python3
# The test command also checks the NEON and SVE kernels on an x86 machine (cross compiler +
# qemu), fuzzes the parsers (clang's libFuzzer) and scores the systemd unit (systemd-analyze).
TEST_PACKAGES=(g++-aarch64-linux-gnu qemu-user clang libclang-rt-14-dev systemd)
# ... and builds the reference documentation with every warning an error, checks its links and
# screenshots its index page (Sphinx with MyST and Breathe, Doxygen, headless Chromium).
DOC_PACKAGES=(python3-sphinx python3-breathe python3-myst-parser furo doxygen chromium
              python3-pil)

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
    # The embedded default: 30 steps, AdamW state (38 MiB) on NVMe under a 16 MiB host budget.
    PYTHONPATH=build/python exec "$PYTHON" -m tierswap.tinylm "$@"
    ;;
  test)
    extra=("${DOC_PACKAGES[@]}")
    [ "$(uname -m)" = x86_64 ] && extra+=("${TEST_PACKAGES[@]}")
    install_missing "${extra[@]}"
    build build
    (cd build && ctest --output-on-failure -j 2 --timeout 900)
    PYTHONPATH=build/python "$PYTHON" -m pytest -q -p no:cacheprovider tests/python
    tools/docs/build.sh build --check
    # The sanitizer builds skip the Python module: an instrumented extension cannot be loaded
    # into an uninstrumented interpreter. Its C++ underneath (TieredOptimizer) is in the suite.
    # The sanitizer builds compile at -O1 with line tables only (-g1: file:line in every report):
    # test_tier_manager.cpp under ASan builds in 29 s instead of 52 s at -O2 -g, and the suite
    # stays within CI's 45 minutes on two cores.
    san_flags=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")
    build build-asan "${san_flags[@]}" -DTIERSWAP_SANITIZE=ON -DTIERSWAP_BUILD_BENCHMARKS=OFF \
      -DTIERSWAP_BUILD_PYTHON=OFF
    (cd build-asan && TIERSWAP_SKIP_LARGE=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       ctest --output-on-failure -j 2 --timeout 900 -LE slow)
    cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${san_flags[@]}" \
      -DTIERSWAP_SANITIZE=thread \
      -DTIERSWAP_BUILD_BENCHMARKS=OFF -DTIERSWAP_WITH_CUDA=OFF -DTIERSWAP_BUILD_PYTHON=OFF >/dev/null
    cmake --build build-tsan -j "$(nproc)" \
      --target test_tier_manager test_thread_pool test_io_engine test_io_faults test_optimizer \
        test_fault_soak test_service test_service_lifetime
    (cd build-tsan && TIERSWAP_SKIP_LARGE=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions="$PWD/../tests/tsan.supp" \
       ctest --output-on-failure -j 2 --timeout 900 \
       -R '^(TierManager|TierManagerCrash|Telemetry|ThreadPool|Backends/EngineTest|Backends/FaultTest|ShardedOptimizer|MemoryOnly|FaultSoak|ServiceLifetime)[.]|^Service[.](BlocksGo|ClientsAre|TheNodeBudget|Simultaneous|Malformed|Metrics|ATierManager|ARawClient)')
    CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DTIERSWAP_SANITIZE=fuzz -DTIERSWAP_BUILD_TESTS=OFF -DTIERSWAP_BUILD_BENCHMARKS=OFF \
      -DTIERSWAP_BUILD_PYTHON=OFF -DTIERSWAP_WITH_CUDA=OFF -DTIERSWAP_WITH_MPI=OFF >/dev/null
    cmake --build build-fuzz -j "$(nproc)" --target fuzz
    tests/fuzz/run.sh build-fuzz "${TIERSWAP_FUZZ_SECONDS:-25}"
    ;;
  *)
    echo "usage: tools/dev.sh run [tinylm options] | tools/dev.sh test" >&2
    exit 2
    ;;
esac
