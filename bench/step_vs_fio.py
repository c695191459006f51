#!/usr/bin/python3
"""The NVMe step against fio moving the same bytes: how close the step comes to the disk's limit.

Each repetition runs, alternating, on the same directory:
  step: `tierswap bench step --runs 1 --json` (AdamW, state on NVMe under the host budget): its
        step time, and the NVMe bytes it read and wrote (12 + 12 B per parameter);
  fio:  one io_uring job (`--fixedbufs --registerfiles`, O_DIRECT) that reads and writes the same
        numbers of bytes, interleaved on one queue (`--rw=rw`, the read share set from the step's
        bytes) at the step's request size and depth (the engine's: 1 MiB, 32 unless
        TIERSWAP_IO_CONFIG or TIERSWAP_BLOCK_SIZE / TIERSWAP_QUEUE_DEPTH say otherwise), on a
        file as large as those bytes; its buffers on hugetlb pages this script reserves (the
        step's pinned slabs are tierswap's own 2 MiB-page buffers: equal buffer memory).
It prints each repetition, the medians and the median of the per-repetition ratios step / fio.

Usage: bench/step_vs_fio.py --tierswap build/tierswap --dir /var/tmp [--params 256M]
       [--host-budget 1GiB] [--repeats 5] [--block-size 1MiB] [--queue-depth 32] [--json]
Needs fio and root (vm.nr_hugepages). Standard library only.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from compare_fio import HUGE_PAGE, HugePages, add_common_args, fio_job, parse_size


def run_step(args, workdir):
    os.makedirs(workdir, exist_ok=True)  # bench step, as tierswap, never makes a swap directory
    cmd = [args.tierswap, "bench", "step", "--dir", workdir, "--params", args.params,
           "--host-budget", args.host_budget, "--runs", "1", "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"step_vs_fio.py: {' '.join(cmd)} failed:\n{res.stderr}")
    j = json.loads(res.stdout)
    return {"seconds": j["step_s"], "io_only_s": j["io_only_s"],
            "read_bytes": int(j["nvme_read_bytes_per_param"] * j["params"]),
            "write_bytes": int(j["nvme_write_bytes_per_param"] * j["params"])}


def run_fio(args, path, read_bytes, write_bytes):
    total = read_bytes + write_bytes
    total -= total % args.block_size_bytes
    mix = round(100 * read_bytes / (read_bytes + write_bytes))
    cmd = ["fio", "--name=step", f"--filename={path}", f"--size={total}",
           f"--bs={args.block_size_bytes}", f"--iodepth={args.queue_depth}", "--ioengine=io_uring",
           "--fixedbufs=1", "--registerfiles=1", "--direct=1", "--rw=rw", f"--rwmixread={mix}",
           "--mem=shmhuge", "--fallocate=native", "--output-format=json"]
    job = fio_job(cmd)
    seconds = max(job["read"]["runtime"], job["write"]["runtime"]) / 1000.0
    return {"seconds": seconds, "read_bytes": job["read"]["io_bytes"],
            "write_bytes": job["write"]["io_bytes"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--params", default="256M")
    p.add_argument("--host-budget", default="1GiB")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    args.block_size_bytes = parse_size(args.block_size)
    if shutil.which("fio") is None:
        sys.exit("step_vs_fio.py: fio is not installed (apt-get install fio)")
    workdir = tempfile.mkdtemp(prefix="tierswap-stepfio-", dir=args.dir)
    reps = []
    need = -(-args.queue_depth * args.block_size_bytes // HUGE_PAGE) + 4
    try:
        with HugePages(need):
            for rep in range(args.repeats):
                order = ["step", "fio"] if rep % 2 == 0 else ["fio", "step"]
                r = {}
                for what in order:
                    if what == "step":
                        r["step"] = run_step(args, os.path.join(workdir, "step"))
                        shutil.rmtree(os.path.join(workdir, "step"), ignore_errors=True)
                    else:
                        # The step's byte counts: from this repetition's step, or the first one.
                        ref = r.get("step") or (reps[0]["step"] if reps else None)
                        if ref is None:
                            ref = r["step"] = run_step(args, os.path.join(workdir, "step"))
                            shutil.rmtree(os.path.join(workdir, "step"), ignore_errors=True)
                        r["fio"] = run_fio(args, os.path.join(workdir, "fio.dat"),
                                           ref["read_bytes"], ref["write_bytes"])
                        os.unlink(os.path.join(workdir, "fio.dat"))
                r["ratio"] = r["step"]["seconds"] / r["fio"]["seconds"]
                reps.append(r)
                if not args.json:
                    print(f"rep {rep + 1}/{args.repeats}: step {r['step']['seconds']:.3f} s, fio "
                          f"{r['fio']['seconds']:.3f} s for {r['fio']['read_bytes'] / 2**30:.2f} "
                          f"GiB read + {r['fio']['write_bytes'] / 2**30:.2f} GiB written: "
                          f"{r['ratio']:.3f}x", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {"params": args.params, "host_budget": args.host_budget, "repeats": reps,
              "median_step_s": statistics.median(r["step"]["seconds"] for r in reps),
              "median_fio_s": statistics.median(r["fio"]["seconds"] for r in reps),
              "median_ratio": statistics.median(r["ratio"] for r in reps)}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.repeats} alternating repetitions, {args.params} parameters, host budget "
          f"{args.host_budget}: step {report['median_step_s']:.3f} s, fio on the same bytes "
          f"{report['median_fio_s']:.3f} s (medians); step / fio {report['median_ratio']:.3f}x "
          "(median of the per-repetition ratios)")


if __name__ == "__main__":
    main()
