#!/usr/bin/env bash
# A/B of the commit record's escaping and sharing: OLD and NEW are two build directories (each
# binary loads its own libtierswap by RPATH; the Python package from BUILD/python), alternating
# which goes first, ROUNDS rounds. Per round and side: `bench step` at 40,000 parameters of 64
# elements, host state persisted (a commit per step), median of 5 steps; and the Python step of
# the same parameters (../many-small-params-2026-11-28/small_params.py: median of 20 steps, with
# its commit's share).
#   run.sh OLD_BUILD NEW_BUILD [ROUNDS] > results.txt
set -euo pipefail
old=$1 new=$2 rounds=${3:-5}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /var/tmp/commit-record-XXXXXX)
trap 'rm -rf "$dir"' EXIT
one() {  # side build
  local s
  s=$("$2/tierswap" bench step --params 2560000 --tensor 64 --state host --runs 5 --lend \
        --dir "$dir" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["step_s"])')
  echo "$1 bench_step_s $s"
  echo "$1 python $(PYTHONPATH=$2/python /usr/bin/python3 "$here/../many-small-params-2026-11-28/small_params.py" 40000)"
}
for r in $(seq 1 "$rounds"); do
  echo "round $r"
  if (( r % 2 )); then one old "$old"; one new "$new"; else one new "$new"; one old "$old"; fi
done
