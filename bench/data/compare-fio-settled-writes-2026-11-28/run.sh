#!/bin/sh
# The huge-page cell of bench/compare_fio.py with the write phase as it was (each engine deletes
# its earlier file right before its own write; compare_fio_old.py = the script at eb0cd6c) and as
# it is now (every earlier file deleted, then sync and the settle pause, before the first write),
# alternating, ROUNDS rounds of 6 repetitions each. Run from the repository root, as root.
ROUNDS=${ROUNDS:-2}
D=bench/data/compare-fio-settled-writes-2026-11-28
git show eb0cd6c:bench/compare_fio.py > /tmp/compare_fio_old.py
for r in $(seq 1 "$ROUNDS"); do
  for v in old new; do
    s=bench/compare_fio.py; [ "$v" = old ] && s=/tmp/compare_fio_old.py
    /usr/bin/python3 "$s" --tierswap build/tierswap --dir /var/tmp --size 1GiB --block-size 1MiB \
        --queue-depth 32 --repeats 6 --pages huge --json > "$D/$v-huge-r$r.json"
  done
done
