#!/bin/bash
# Issue 15's host-state Python overhead with the C++ bench on the Python side's parameter layout
# (16Mi-element parameters, each gradient its own buffer: --cpp-grads distinct, the default now)
# against its own (64Mi-element parameters sharing one gradient buffer: shared), alternating,
# 3 rounds each.
cd "$(dirname "$0")/../../.."
out=bench/data/torch-overhead-cpp-layout-2026-11-27
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="distinct shared"; else order="shared distinct"; fi
  for g in $order; do
    PYTHONPATH=build/python /usr/bin/python3 bench/torch_step.py overhead --params 256M \
      --state host --host-budget 6GiB --sub-group 8M --reps 4 --block 5 --settle 7 \
      --cpp-grads $g > $out/host-$g-$r.json
    python3 -c "import json; d=json.load(open('$out/host-$g-$r.json')); print('$g round $r: python/cpp %.3f (python %.3f s, cpp %.3f s), per block %s' % (d['python_over_cpp_bench'], d['python_step_s'], d['cpp_bench_ingest_plus_step_s'], [round(x, 3) for x in d['python_over_cpp_bench_per_block']]))"
  done
done
