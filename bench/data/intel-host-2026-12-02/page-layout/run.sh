#!/bin/sh
# Each process in a row, pinned to one CPU, faults its 32 MiB the same way: the layout it gets
# follows the order in which the process before it freed its pages.
set -e
cd "$(dirname "$0")"
gcc -O2 -o /tmp/layout layout.c -luring
for how in populate touch mlock pin; do
  for i in 1 2 3 4 5 6; do taskset -c 1 /tmp/layout $how; done
done
