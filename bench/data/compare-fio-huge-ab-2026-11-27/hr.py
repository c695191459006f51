import sys, os, json, tempfile, shutil, statistics, time
sys.path.insert(0, "/work/main/bench")
import compare_fio, submit_batch_ab as sb
class A: pass
a = A(); a.tierswap = "/work/main/build/tierswap"; a.size = "1GiB"; a.size_bytes = 1 << 30
a.block_size = "1MiB"; a.block_size_bytes = 1 << 20; a.queue_depth = 32
dev = sb.block_device("/var/tmp")
MODE = "read"
reps = int(sys.argv[1]); env_extra = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
names = ["tierswap", "fio-io_uring", "fio-libaio"]
res = {n: [] for n in names}
wd = tempfile.mkdtemp(prefix="hw-", dir="/var/tmp")
with compare_fio.HugePages(64):
  try:
    compare_fio.run_tierswap(a, wd, "write", "huge")
    os.sync(); time.sleep(5)
    for r in range(reps):
        for n in names[r % 3:] + names[:r % 3]:
            b = sb.disk_counters(dev)[MODE]
            if n == "tierswap":
                x = compare_fio.run_tierswap(a, wd, MODE, "huge", env=env_extra)
            else:
                p = os.path.join(wd, n); os.makedirs(p, exist_ok=True)
                x = compare_fio.run_fio(a, p, n.split("-")[1], MODE, "huge", os.path.join(wd, "tierswap", "tierswap.swap"))
            e = sb.disk_counters(dev)[MODE]
            ios, mg, tk = (y - z for y, z in zip(e, b))
            x.update(req=ios, merges=mg, ticks=tk)
            res[n].append(x)
            print(r, n, round(x["gbps"], 3), ios, mg, tk, file=sys.stderr)
  finally:
    shutil.rmtree(wd, ignore_errors=True)
for n in names:
    print(n, "median GB/s", round(statistics.median(x["gbps"] for x in res[n]), 3),
          "req", statistics.median(x["req"] for x in res[n]),
          "merges", statistics.median(x["merges"] for x in res[n]),
          "ticks", statistics.median(x["ticks"] for x in res[n]))
json.dump(res, open(sys.argv[3] if len(sys.argv) > 3 else "/tmp/m/hw.json", "w"))
