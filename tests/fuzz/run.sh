#!/usr/bin/env bash
# Replays every fuzz target's seed corpus, then fuzzes each for a bounded time (seconds, default
# 30) with new inputs kept in a scratch directory; fails on any crash, leak or sanitizer report,
# the input left in BUILD_DIR/fuzz-findings/ (fix the bug, then add the input to corpus/<target>/).
# Prints executions per target.   tests/fuzz/run.sh BUILD_DIR [SECONDS]
set -euo pipefail
build=$(cd "$1" && pwd)
seconds=${2:-30}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/tierswap-fuzz-run-XXXXXX")
trap 'rm -rf "$work"' EXIT
findings="$build/fuzz-findings"
mkdir -p "$findings"
export TIERSWAP_LOG_LEVEL=off
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for corpus in "$here"/corpus/*/; do
  t=$(basename "$corpus")
  bin="$build/tests/fuzz/fuzz_$t"
  mkdir -p "$work/$t"
  (cd "$work" && "$bin" -runs=0 -artifact_prefix="$findings/$t-" "$corpus" >"$work/$t.replay.log" 2>&1) ||
    { cat "$work/$t.replay.log"; echo "fuzz_$t: the seed corpus fails"; exit 1; }
  # fuzz_service_message's live service serves each connection on a thread of its own that ends
  # after the peer saw the close, so libFuzzer's leak check after each input runs beside threads
  # of that input still ending (it once reported such a session as leaked; the input alone does
  # not leak). That target keeps the leak check at exit, after the service has joined them all.
  per_input_leaks=1
  [[ $t == service_message ]] && per_input_leaks=0
  (cd "$work" && "$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=20 \
     -detect_leaks=$per_input_leaks -artifact_prefix="$findings/$t-" \
     -rss_limit_mb=4096 "$work/$t" "$corpus" >"$work/$t.log" 2>&1) ||
    { tail -50 "$work/$t.log"; echo "fuzz_$t: FAILED (the input is in $findings; add it to corpus/$t once fixed)"; exit 1; }
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log")
  echo "fuzz_$t: ${runs:-?} executions in ${seconds} s, corpus $(ls "$corpus" | wc -l) seeds + $(ls "$work/$t" | wc -l) found, 0 crashes"
done
