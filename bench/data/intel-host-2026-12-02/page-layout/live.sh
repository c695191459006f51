#!/bin/bash
# The layout each engine's buffers really got, read from the running process (root): tierswap
# `bench io --mode read` (4 KiB pages) and fio io_uring (--mem=malloc, --fixedbufs) in turn, each
# reading a kept 1 GiB tierswap swap file three times; layout_of.py prints, per writable
# anonymous mapping of 8 MiB or more, the mean run of physically consecutive pages.
# Usage: live.sh SWAPDIR (a directory an earlier `bench io --mode write --keep` left)
SW=$1; T=${T:-build/tierswap}
for k in 1 2 3 4 5 6; do
  TIERSWAP_HUGE_PAGES=0 $T bench io --dir $SW --size 1GiB --mode read --keep --runs 3 --direct on \
      --backend uring --json > /tmp/tsout.json & p=$!; sleep 0.8
  L=$(/usr/bin/python3 layout_of.py $p 2>&1); wait $p
  echo "ts:  $L $(/usr/bin/python3 -c "import json; print(['%.2f'%r['gbps'] for r in json.load(open('/tmp/tsout.json'))['runs']])")"
  fio --name=r --filename=$SW/tierswap.swap --offset=1048576 --size=1073741824 --loops=3 --bs=1M \
      --iodepth=32 --ioengine=io_uring --direct=1 --rw=read --fixedbufs=1 --registerfiles=1 \
      --mem=malloc --output-format=json > /tmp/fout.json & p=$!; sleep 0.8
  L=""; for q in $p $(pgrep -P $p); do L="$L $(/usr/bin/python3 layout_of.py $q 2>&1)"; done; wait $p
  echo "fio: $L $(/usr/bin/python3 -c "import json; j=json.load(open('/tmp/fout.json'))['jobs'][0]['read']; print('%.2f'%(j['io_bytes']/j['runtime']*1e3/1e9))")"
done
