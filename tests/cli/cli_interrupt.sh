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

# Starts `tierswap ARGS...` with TMPDIR=$work/$name, waits until that directory holds files in a
# sub-directory (the run made and registered it, and is under way; with DEPTH=1, files in the
# directory itself, a --dir's swap files, registered just after they are made: a second more),
# sends the signal, and checks the exit status and that the directory holds no more than $LEFT
# (default: nothing).
interrupt() {
  local name=$1 sig=$2 status=$3
  shift 3
  local tmp=$work/$name
  mkdir -p "$tmp"
  TMPDIR=$tmp "$cli" "$@" > "$work/$name.out" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do  # a hang guard, not a timing: the run takes minutes uninterrupted
    [ -n "$(find "$tmp" -mindepth "${DEPTH:-2}" -type f ! -name mine 2>/dev/null | head -1)" ] && break
    kill -0 $pid 2>/dev/null || fail "$name ended before it could be interrupted: $(cat "$work/$name.out")"
    sleep 0.1
  done
  [ "${DEPTH:-2}" = 1 ] && sleep 1
  kill -s "$sig" $pid
  wait $pid
  local rc=$?
  [ $rc -eq "$status" ] || fail "$name: exit status $rc after SIG$sig, expected $status"
  [ "$(ls -A "$tmp")" = "${LEFT:-}" ] || fail "$name: left behind after SIG$sig: $(find "$tmp" | head)"
  echo "ok: $name (SIG$sig, status $rc, $tmp holds ${LEFT:-nothing})"
}

interrupt bench-step INT 130 bench step --params 64M --host-budget 64MiB --runs 1000
interrupt demo TERM 143 demo --params 2097152 --sub-group 262144 --host-budget 16MiB --steps 1000000
# A file outside the temporary directory is not touched.
echo kept > "$work/outside"
interrupt bench-io INT 130 bench io --size 256MiB --runs 1000
[ "$(cat "$work/outside")" = kept ] || fail "a file outside the temporary directory changed"
# With --dir the directory is the user's: what bench step made in it goes, the rest stays.
mkdir -p "$work/given"
echo mine > "$work/given/mine"
LEFT=mine interrupt given INT 130 bench step --params 64M --host-budget 64MiB --runs 1000 \
  --dir "$work/given"
[ "$(cat "$work/given/mine")" = mine ] || fail "bench step --dir changed a file of the user's"
# bench io and tune make their swap files in the user's --dir itself: the files go, the rest stays.
for run in "gio bench io --size 256MiB --runs 1000" "gtune tune --size 64MiB --runs 50"; do
  set -- $run
  name=$1
  shift
  mkdir -p "$work/$name"
  echo mine > "$work/$name/mine"
  DEPTH=1 LEFT=mine interrupt "$name" INT 130 "$@" --dir "$work/$name"
done
rm -rf "$work"
