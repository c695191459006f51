#!/bin/bash
# bench io (1 GiB, write then read, io_uring, O_DIRECT, its default runs) idle and beside a one-core
# memory stream averaging 2 GB/s, 4 GB/s and all it can (~15 GB/s), rotating, 6 rounds.
T=/work/main/build/tierswap
conds=(idle 2 4 full)
for r in 1 2 3 4 5 6; do
  for k in 0 1 2 3; do
    m=${conds[$(( (k + r) % 4 ))]}
    pid=
    case $m in idle) ;; full) ./load stream 2>/dev/null & pid=$! ;; *) ./load stream $m 2>/dev/null & pid=$! ;; esac
    sync; sleep 2
    $T bench io --size 1GiB --mode both --backend uring --direct on --dir /var/tmp --json > r2/io-$m-$r.json 2> r2/io-$m-$r.err
    [ -n "$pid" ] && kill $pid && wait $pid 2>/dev/null
    python3 -c "import json; d=json.load(open('r2/io-$m-$r.json')); print('$m', $r, 'write %.3f read %.3f' % (d['best']['write']['median_gbps'], d['best']['read']['median_gbps']))"
  done
done
