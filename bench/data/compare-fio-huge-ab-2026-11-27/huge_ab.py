"""The 2 MiB-page cell of compare_fio.py alone for one mode, with /sys/block counters per run.

Usage (as root, from the repository root): /usr/bin/python3 THIS write|read REPS OUT.json
Measurement script of 2026-11-27 (bench/RESULTS.md); reuses compare_fio.py and submit_batch_ab.py.
"""
import json, os, shutil, statistics, sys, tempfile, time
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import compare_fio, submit_batch_ab as sb  # noqa: E402


class A:
    tierswap = "build/tierswap"; size = "1GiB"; size_bytes = 1 << 30
    block_size = "1MiB"; block_size_bytes = 1 << 20; queue_depth = 32


mode, reps, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
a, dev = A(), sb.block_device("/var/tmp")
names = ["tierswap", "fio-io_uring", "fio-libaio"]
res = {n: [] for n in names}
wd = tempfile.mkdtemp(prefix="huge-ab-", dir="/var/tmp")
swap = os.path.join(wd, "tierswap", "tierswap.swap")
with compare_fio.HugePages(64):
    try:
        if mode == "read":  # the file every engine reads
            compare_fio.run_tierswap(a, wd, "write", "huge")
            os.sync()
            time.sleep(5)
        for r in range(reps):
            for n in names[r % 3:] + names[:r % 3]:
                before = sb.disk_counters(dev)[mode]
                if n == "tierswap":
                    x = compare_fio.run_tierswap(a, wd, mode, "huge")
                else:
                    p = os.path.join(wd, n)
                    os.makedirs(p, exist_ok=True)
                    x = compare_fio.run_fio(a, p, n.split("-")[1], mode, "huge", swap)
                ios, merges, ticks = (y - z for y, z in zip(sb.disk_counters(dev)[mode], before))
                x.update(req=ios, merges=merges, ticks=ticks)
                res[n].append(x)
                print(r, n, round(x["gbps"], 3), ios, merges, ticks, file=sys.stderr)
    finally:
        shutil.rmtree(wd, ignore_errors=True)
for n in names:
    print(n, "median GB/s", round(statistics.median(x["gbps"] for x in res[n]), 3),
          "requests", statistics.median(x["req"] for x in res[n]),
          "merges", statistics.median(x["merges"] for x in res[n]),
          "ticks", statistics.median(x["ticks"] for x in res[n]))
json.dump(res, open(out_path, "w"))
