cd /work/main
mkdir -p /var/tmp/spin-io
for r in 1 2 3 4 5 6; do
  if [ $((r % 2)) = 1 ]; then order="idle spin"; else order="spin idle"; fi
  for mode in $order; do
    pids=""
    if [ $mode = spin ]; then
      nice -n 19 sh -c 'while :; do :; done' & pids="$pids $!"
      nice -n 19 sh -c 'while :; do :; done' & pids="$pids $!"
      sleep 0.5
    fi
    build/tierswap bench io --dir /var/tmp/spin-io --size 1GiB --mode both --runs 1 --backend uring --direct on --json > /tmp/spin/$mode-$r.json 2>/tmp/spin/$mode-$r.err
    [ -n "$pids" ] && kill $pids
    sleep 2
  done
done
rm -rf /var/tmp/spin-io
echo done > /tmp/spin/done
