#!/bin/bash
D=/var/tmp/exp-wr; mkdir -p $D; T=/work/main/build/tierswap
echo 64 > /proc/sys/vm/nr_hugepages
for rep in $(seq 1 ${REPS:-6}); do
  V=("thp" "thpsync" "fio" "fionone" "ts")
  for i in 0 1 2 3 4; do v=${V[$(( (i+rep)%5 ))]}; rm -rf $D/*; sync; sleep 1
    case $v in
      thp|tlb) g=$(WR=1 /tmp/exp/wr $D/f $v 1 2);;
      thpsync) g=$(SYNC=1 WR=1 /tmp/exp/wr $D/f thp 1 2);;
      fionone) g=$(fio --name=w --filename=$D/f --size=1073741824 --bs=1M --iodepth=32 --ioengine=io_uring --direct=1 --rw=write --fixedbufs=1 --registerfiles=1 --mem=shmhuge --fallocate=none --output-format=json | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["write"]; print("%.4f"%(j["io_bytes"]/j["runtime"]*1e3/1e9))');;
      fio) g=$(fio --name=w --filename=$D/f --size=1073741824 --bs=1M --iodepth=32 --ioengine=io_uring --direct=1 --rw=write --fixedbufs=1 --registerfiles=1 --mem=shmhuge --fallocate=native --output-format=json | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["write"]; print("%.4f"%(j["io_bytes"]/j["runtime"]*1e3/1e9))');;
      ts) g=$(TIERSWAP_HUGE_PAGES=1 $T bench io --dir $D --size 1GiB --mode write --runs 1 --direct on --backend uring --json | /usr/bin/python3 -c "import json,sys; print('%.4f'%json.load(sys.stdin)['runs'][0]['gbps'])");;
    esac; echo "$rep|$v|$g"; done; done
echo 0 > /proc/sys/vm/nr_hugepages
