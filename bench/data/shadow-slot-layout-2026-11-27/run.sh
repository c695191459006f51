#!/bin/bash
# Alternating: the disk's speed for a read stream + a write stream in two separate regions,
# against the same bytes with the streams interleaved in 30 MiB extents (the tier manager's layout).
F=/var/tmp/strided.dat
common="--filename=$F --bs=1M --direct=1 --ioengine=io_uring --iodepth=16 --group_reporting --output-format=json"
regions() { fio --name=r --rw=read --offset=0 --size=2G $common --name=w --rw=write --offset=2G --size=2G $common; }
inter() { fio --name=r --rw=read --zonemode=strided --zonesize=30M --zoneskip=30M --offset=0 --size=4020M --io_size=2010M $common \
              --name=w --rw=write --zonemode=strided --zonesize=30M --zoneskip=30M --offset=30M --size=3990M --io_size=1995M $common; }
for i in 1 2 3 4 5 6; do
  for m in $( [ $((i%2)) = 1 ] && echo "regions inter" || echo "inter regions"); do
    sync; sleep 3
    $m > out-$m-$i.json 2>/dev/null
    python3 - "$m" "$i" out-$m-$i.json <<'PY'
import json,sys
d=json.load(open(sys.argv[3]))
j=d['jobs'][0]
b=j['read']['io_bytes']+j['write']['io_bytes']
t=max(j['read']['runtime'],j['write']['runtime'])/1000
print(sys.argv[1], sys.argv[2], f"{b/2**30:.2f} GiB in {t:.2f} s = {b/t/1e9:.2f} GB/s  read {j['read']['bw_bytes']/1e9:.2f} write {j['write']['bw_bytes']/1e9:.2f}")
PY
  done
done
