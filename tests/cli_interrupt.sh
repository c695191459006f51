#!/usr/bin/env bash
# A CLI run ended by SIGINT or SIGTERM removes the temporary directory it made (swap files of
# gigabytes must not stay behind), and still ends by that signal.
# Usage: cli_interrupt.sh TIERSWAP_CLI WORK_DIR
set -u
set -m  # job control: background runs keep SIGINT's default (without it, bash ignores it there)
cli=$1
work=$2/cli-interrupt
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

# Starts `tierswap ARGS...` with TMPDIR=$work/$name, waits until its temporary directory holds
# files (so it is registered and the run is under way), sends the signal, and checks.
interrupt() {
  local name=$1 sig=$2 status=$3
  shift 3
  local tmp=$work/$name
  mkdir -p "$tmp"
  TMPDIR=$tmp "$cli" "$@" > "$work/$name.out" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do  # a hang guard, not a timing: the run takes minutes uninterrupted
    [ -n "$(find "$tmp" -mindepth 2 -type f 2>/dev/null | head -1)" ] && break
    kill -0 $pid 2>/dev/null || fail "$name ended before it could be interrupted: $(cat "$work/$name.out")"
    sleep 0.1
  done
  kill -s "$sig" $pid
  wait $pid
  local rc=$?
  [ $rc -eq "$status" ] || fail "$name: exit status $rc after SIG$sig, expected $status"
  [ -z "$(ls -A "$tmp")" ] || fail "$name: left behind after SIG$sig: $(find "$tmp" | head)"
  echo "ok: $name (SIG$sig, status $rc, $tmp empty)"
}

interrupt bench-step INT 130 bench step --params 64M --host-budget 64MiB --runs 1000
interrupt demo TERM 143 demo --params 2097152 --sub-group 262144 --host-budget 16MiB --steps 1000000
# A file outside the temporary directory is not touched.
echo kept > "$work/outside"
interrupt bench-io INT 130 bench io --size 256MiB --runs 1000
[ "$(cat "$work/outside")" = kept ] || fail "a file outside the temporary directory changed"

# With --dir the directory is the user's: what bench step made in it goes, the rest stays.
given=$work/given
mkdir -p "$given"
echo mine > "$given/mine"
"$cli" bench step --params 64M --host-budget 64MiB --runs 1000 --dir "$given" > "$work/given.out" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ -n "$(find "$given" -mindepth 2 -type f 2>/dev/null | head -1)" ] && break
  kill -0 $pid 2>/dev/null || fail "bench step --dir ended early: $(cat "$work/given.out")"
  sleep 0.1
done
kill -s INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || fail "bench step --dir: exit status $rc after SIGINT, expected 130"
[ "$(ls -A "$given")" = mine ] || fail "bench step --dir left: $(ls -A "$given")"
[ "$(cat "$given/mine")" = mine ] || fail "bench step --dir changed a file of the user's"
echo "ok: bench step --dir (SIGINT, status $rc, only the user's file left)"
rm -rf "$work"
