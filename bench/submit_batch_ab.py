#!/usr/bin/python3
"""tierswap's engine at several submit_batch settings, interleaved, with what the disk saw.

IoEngineConfig::submit_batch is how many requests the engine hands the kernel per system call.
From 3 on, Linux plugs the submission and merges requests adjacent on disk, so the device sees
fewer, larger requests than --block-size; at 1 or 2 it sees --block-size (fio's default,
iodepth_batch_submit=1, submits one request per call). This script runs `tierswap bench io`
(io_uring, O_DIRECT, a fresh file per write, the read of what the write left) once per setting
and repetition, the settings' order rotating every repetition, and reads the block device's
counters (/sys/block/DEV/stat) around each run: device requests and merges per GiB, and the
device's busy time per GiB.

Usage: bench/submit_batch_ab.py --tierswap build/tierswap --dir /var/tmp [--size 1GiB]
       [--block-size 1MiB] [--queue-depth 32] [--batches 0,2] [--repeats 6] [--pages huge]
       [--json]
Standard library only; reuses compare_fio.py's runner.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_fio  # noqa: E402  (the same tierswap runner and size grammar)

GIB = 1024 ** 3


def block_device(path):
    """The /sys/block entry of the whole disk that holds `path`."""
    st = os.stat(path)
    sys_dev = os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if os.path.exists(os.path.join(sys_dev, "partition")):
        sys_dev = os.path.dirname(sys_dev)
    if not os.path.exists(os.path.join(sys_dev, "stat")):
        sys.exit(f"submit_batch_ab.py: {path} is not on a block device with /sys statistics")
    return sys_dev


def disk_counters(sys_dev):
    f = [int(x) for x in open(os.path.join(sys_dev, "stat")).read().split()]
    # reads: ios, merges, sectors, ticks; writes: ios, merges, sectors, ticks; ...
    return {"read": (f[0], f[1], f[3]), "write": (f[4], f[5], f[7])}


def one_run(args, workdir, mode, batch, sys_dev):
    before = disk_counters(sys_dev)[mode]
    r = compare_fio.run_tierswap(args, workdir, mode, args.pages,
                                 env={"TIERSWAP_SUBMIT_BATCH": str(batch)})
    after = disk_counters(sys_dev)[mode]
    gib = args.size_bytes / GIB
    ios, merges, ticks = (a - b for a, b in zip(after, before))
    r.update({"device_requests_per_gib": ios / gib, "merges_per_gib": merges / gib,
              "device_ms_per_gib": ticks / gib})
    return r


def run(args, sys_dev):
    samples = {b: {"write": [], "read": []} for b in args.batch_list}
    workdir = tempfile.mkdtemp(prefix="tierswap-sb-", dir=args.dir)
    try:
        for rep in range(args.repeats):
            k = rep % len(args.batch_list)
            for batch in args.batch_list[k:] + args.batch_list[:k]:
                for mode in ("write", "read"):
                    if mode == "read":
                        os.sync()
                        time.sleep(args.settle)
                    samples[batch][mode].append(one_run(args, workdir, mode, batch, sys_dev))
                if not args.json:
                    w, r = samples[batch]["write"][-1], samples[batch]["read"][-1]
                    print(f"{args.pages} rep {rep + 1}/{args.repeats} submit_batch {batch}: write "
                          f"{w['gbps']:.3f} GB/s ({w['device_requests_per_gib']:.0f} req/GiB), "
                          f"read {r['gbps']:.3f} GB/s ({r['device_requests_per_gib']:.0f} "
                          "req/GiB)", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return samples


def summarize(samples, first):
    keys = ("gbps", "cpu_s_per_gib", "device_requests_per_gib", "merges_per_gib",
            "device_ms_per_gib")
    out = {}
    for batch, modes in samples.items():
        out[batch] = {m: {k: statistics.median(s[k] for s in runs) for k in keys}
                      for m, runs in modes.items()}
        for m, runs in modes.items():
            out[batch][m]["samples_gbps"] = [round(s["gbps"], 3) for s in runs]
    for batch in samples:
        for m in ("write", "read"):
            out[batch][m]["gbps_vs_first"] = out[batch][m]["gbps"] / out[first][m]["gbps"]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    compare_fio.add_common_args(p)
    p.add_argument("--size", default="1GiB")
    p.add_argument("--batches", default="0,2", help="submit_batch settings, comma-separated")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--settle", type=float, default=2.0)
    p.add_argument("--pages", default="huge", help="4k or huge (tierswap's buffers)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    args.size_bytes = compare_fio.parse_size(args.size)
    try:
        args.batch_list = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        sys.exit(f"submit_batch_ab.py: --batches {args.batches}: expected integers, e.g. 0,2")
    if len(args.batch_list) < 1 or any(b < 0 or b > 4096 for b in args.batch_list):
        sys.exit(f"submit_batch_ab.py: --batches {args.batches}: each in 0..4096")
    if args.pages not in ("4k", "huge"):
        sys.exit(f"submit_batch_ab.py: --pages {args.pages}: expected 4k or huge")
    if args.repeats < 1:
        sys.exit(f"submit_batch_ab.py: --repeats {args.repeats}: at least 1")
    if not os.access(args.tierswap, os.X_OK):
        sys.exit(f"submit_batch_ab.py: --tierswap {args.tierswap}: not an executable")
    sys_dev = block_device(args.dir)
    result = summarize(run(args, sys_dev), args.batch_list[0])
    report = {"device": os.path.basename(sys_dev), "size": args.size_bytes,
              "block_size": args.block_size, "queue_depth": args.queue_depth,
              "repeats": args.repeats, "pages": args.pages,
              "submit_batch": {str(b): r for b, r in result.items()}}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.repeats} interleaved repetitions, {args.size} O_DIRECT, block {args.block_size},"
          f" depth {args.queue_depth}, {args.pages} pages, disk {report['device']}; medians")
    print(f"{'batch':>5} {'mode':<6} {'GB/s':>7} {'vs first':>8} {'CPU s/GiB':>9} "
          f"{'dev req/GiB':>11} {'merges/GiB':>10} {'dev ms/GiB':>10}")
    for b, r in result.items():
        for m in ("write", "read"):
            x = r[m]
            print(f"{b:>5} {m:<6} {x['gbps']:>7.3f} {x['gbps_vs_first']:>8.3f} "
                  f"{x['cpu_s_per_gib']:>9.4f} {x['device_requests_per_gib']:>11.0f} "
                  f"{x['merges_per_gib']:>10.0f} {x['device_ms_per_gib']:>10.0f}")


if __name__ == "__main__":
    main()
