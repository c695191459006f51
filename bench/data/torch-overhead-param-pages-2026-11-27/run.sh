#!/bin/bash
# Issue 15's host-state Python overhead with the parameters (where the step writes the new 16-bit
# values) on transparent huge pages, as the C++ bench's own 16-bit copies are, against torch's
# allocator (4 KiB pages here, THP `madvise`), alternating, 3 rounds; both with the warm-up.
cd "$(dirname "$0")/../../.."
out=bench/data/torch-overhead-param-pages-2026-11-27
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="huge 4k"; else order="4k huge"; fi
  for p in $order; do
    PYTHONPATH=build/python /usr/bin/python3 bench/torch_step.py overhead --params 256M \
      --state host --host-budget 6GiB --sub-group 8M --reps 4 --block 5 --settle 7 \
      --param-pages $p > $out/host-$p-$r.json
    python3 -c "import json; d=json.load(open('$out/host-$p-$r.json')); print('$p round $r: python/cpp %.3f (python %.3f s: hand-over %.3f, native %.3f; cpp %.3f s), per block %s' % (d['python_over_cpp_bench'], d['python_step_s'], d['handover_s'], d['native_step_s'], d['cpp_bench_ingest_plus_step_s'], [round(x, 3) for x in d['python_over_cpp_bench_per_block']]))"
  done
done
