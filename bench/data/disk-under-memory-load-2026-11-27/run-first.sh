#!/bin/bash
# bench io (1 GiB, both modes, io_uring, O_DIRECT) idle, beside a one-core CPU spin, and beside a
# one-core memory stream (memcpy of 256 MiB buffers), rotating, 6 rounds.
T=/work/main/build/tierswap
for r in 1 2 3 4 5 6; do
  case $((r % 3)) in 0) order="idle spin stream";; 1) order="spin stream idle";; 2) order="stream idle spin";; esac
  for m in $order; do
    pid=
    [ $m != idle ] && { ./load $m & pid=$!; sleep 1; }
    sync; sleep 2
    $T bench io --size 1GiB --mode both --backend uring --direct on --dir /var/tmp --json > io-$m-$r.json 2> io-$m-$r.err
    [ -n "$pid" ] && kill $pid && wait $pid 2>/dev/null
    python3 -c "import json; d=json.load(open(\"io-$m-$r.json\")); print(\"$m\", $r, \"write %.3f read %.3f\" % (d[\"best\"][\"write\"][\"median_gbps\"], d[\"best\"][\"read\"][\"median_gbps\"]))"
  done
done
