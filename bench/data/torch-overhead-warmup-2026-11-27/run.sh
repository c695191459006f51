#!/bin/bash
# Issue 15's host-state Python overhead with the Python block's warm-up (the C++ bench's: one
# untimed step) against without it (--warmup 0, as before), alternating, 3 rounds.
cd "$(dirname "$0")/../../.."
out=bench/data/torch-overhead-warmup-2026-11-27
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="1 0"; else order="0 1"; fi
  for w in $order; do
    PYTHONPATH=build/python /usr/bin/python3 bench/torch_step.py overhead --params 256M \
      --state host --host-budget 6GiB --sub-group 8M --reps 4 --block 5 --settle 7 --warmup $w \
      > $out/host-warmup$w-$r.json
    python3 -c "import json; d=json.load(open('$out/host-warmup$w-$r.json')); print('warmup $w round $r: python/cpp %.3f (python %.3f s, cpp %.3f s), per block %s' % (d['python_over_cpp_bench'], d['python_step_s'], d['cpp_bench_ingest_plus_step_s'], [round(x, 3) for x in d['python_over_cpp_bench_per_block']]))"
  done
done
