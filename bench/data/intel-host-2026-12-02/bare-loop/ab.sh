#!/bin/bash
# interleaved: rd variants, fio io_uring, tierswap bench io, reading the same 1 GiB file
set -e
D=/var/tmp/exp-rd; mkdir -p $D
F=$D/f
T=/work/main/build/tierswap
if [ ! -f $F ]; then fio --name=w --filename=$F --size=1073741824 --bs=1M --iodepth=32 --ioengine=io_uring --direct=1 --rw=write --fallocate=native --output-format=json >/dev/null; fi
mkdir -p $D/ts; [ -n "$(ls $D/ts)" ] || $T bench io --dir $D/ts --size 1GiB --mode write --runs 1 --direct on --keep --backend uring >/dev/null
echo 64 > /proc/sys/vm/nr_hugepages
fiord() { fio --name=r --filename=$F --size=1073741824 --bs=1M --iodepth=32 --ioengine=io_uring --direct=1 --rw=read --fixedbufs=1 --registerfiles=1 --mem=$1 --output-format=json | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["read"]; print("%.4f"%(j["io_bytes"]/j["runtime"]*1e3/1e9))'; }
V=("rd thp 1 2" "rd tlb 1 2" "rd thp 0 1" "rd tlb 0 1" "fio shmhuge" "ts")
for rep in $(seq 1 ${REPS:-6}); do
  n=${#V[@]}
  for i in $(seq 0 $((n-1))); do
    v=${V[$(( (i+rep) % n ))]}
    set -- $v
    case $1 in
      rd) g=$(/tmp/exp/rd $F $2 $3 $4);;
      ts) g=$($T bench io --dir $D/ts --size 1GiB --block-size 1MiB --queue-depth 32 --backend uring --mode read --runs 1 --direct on --keep --json | /usr/bin/python3 -c "import json,sys; print('%.4f'%json.load(sys.stdin)['runs'][0]['gbps'])");;
      fio) if [ $2 = shmhuge ]; then g=$(fiord shmhuge); else g=$(fiord malloc); fi;;
    esac
    echo "$rep|$v|$g"
  done
done
echo 0 > /proc/sys/vm/nr_hugepages
