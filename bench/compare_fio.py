#!/usr/bin/python3
"""tierswap's io_uring backend against fio (io_uring and libaio), interleaved, same disk, equal buffer memory.

Each repetition runs, on the same directory, with O_DIRECT, the same size, block size and queue
depth (the engines' order rotates every repetition; before each phase a sync and a pause,
before the writes also every engine's earlier file deleted):
  writes: tierswap (--backend uring --mode write, fresh preallocated file), fio io_uring, fio
          libaio (each a fresh file, fallocated as fio does by default)
  reads:  tierswap (--mode read of the file its write left, --keep), fio io_uring, fio libaio,
          all three reading that same file (fio at --offset=1MiB, where tierswap's data starts),
          so the reads compare engines, not file layouts fio's io_uring job uses fixed buffers and registered files, as tierswap does. It prints every run, the medians, and
the ratios tierswap / best fio engine for throughput and CPU seconds per GiB.

Both sides get the same kind of buffer memory, in three cells (--pages):
  4k:     4 KiB pages on both sides: fio --mem=malloc, tierswap with TIERSWAP_HUGE_PAGES=0;
  huge:   2 MiB pages on both sides: fio --mem=shmhuge on hugetlb pages this script reserves
          through /proc/sys/vm/nr_hugepages (and gives back), tierswap's own THP buffers;
  shared: the same 4 KiB pages on both sides: a file in --shm-dir (tmpfs) the script writes
          anew before each repetition, which fio maps (--mem=mmapshared:FILE) and tierswap maps
          (bench io --buffer-file FILE), as a shared-memory tensor handed in by a caller.
On both sides the buffers are registered before they are first written (fio's order, which
tierswap's bench io follows): on 4 KiB pages the physical layout of the pages, and so the number
of segments per request a virtio disk sees, depends on that order and on the order in which the
process before freed its pages (bench/RESULTS.md). The shared cell takes that out of the
comparison: every engine of a repetition moves its data through the same physical pages.

Usage: bench/compare_fio.py --tierswap build/tierswap --dir /var/tmp [--size 1GiB]
       [--block-size 1MiB] [--queue-depth 32] [--repeats 6] [--settle 2]
       [--pages 4k,huge,shared] [--shm-dir /dev/shm] [--json]
Needs fio (Debian package `fio`); the huge cell needs root (vm.nr_hugepages). Standard library
only.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

GIB = 1024 ** 3


def parse_size(text):
    units = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1024 ** 2, "mib": 1024 ** 2,
             "g": 1024 ** 3, "gib": 1024 ** 3}
    t = text.strip().lower()
    num = "".join(c for c in t if c.isdigit() or c == ".")
    return int(float(num) * units[t[len(num):].strip()])


HUGE_PAGE = 2 << 20


class HugePages:
    """Reserves `count` more hugetlb pages for the run and restores the old count after (also
    when the script is stopped with SIGTERM, which then exits through the `with`)."""

    PATH = "/proc/sys/vm/nr_hugepages"

    def __init__(self, count):
        self.count = count
        self.old = None
        self.old_handler = None

    def __enter__(self):
        with open(self.PATH) as f:
            self.old = int(f.read())
        self.old_handler = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            with open(self.PATH, "w") as f:
                f.write(str(self.old + self.count))
        except OSError as e:
            sys.exit(f"compare_fio.py: cannot reserve {self.count} huge pages ({self.PATH}: {e});"
                     " run as root or leave out --pages huge")
        with open(self.PATH) as f:
            got = int(f.read()) - self.old
        if got < self.count:
            self.__exit__(None, None, None)
            sys.exit(f"compare_fio.py: the kernel gave {got} of {self.count} huge pages "
                     "(memory too fragmented?)")
        return self

    def __exit__(self, *exc):
        with open(self.PATH, "w") as f:
            f.write(str(self.old))
        signal.signal(signal.SIGTERM, self.old_handler)


ENGINES = ["tierswap", "fio-io_uring", "fio-libaio"]


def engine_file(workdir, name):
    """The file engine `name` writes (and reads back) under the run's directory."""
    return os.path.join(workdir, name, "tierswap.swap" if name == "tierswap" else "fio.dat")


def run_tierswap(args, workdir, mode, pages, buffer=None, env=None):
    """One `tierswap bench io --runs 1` of `mode`; `buffer`: the file its ring is (the shared
    cell); `env`: more variables for it."""
    swap = engine_file(workdir, "tierswap")
    tdir = os.path.dirname(swap)
    if mode == "write" and os.path.exists(swap):
        os.unlink(swap)  # a fresh preallocated file, as fio's write gets
    os.makedirs(tdir, exist_ok=True)
    cmd = [args.tierswap, "bench", "io", "--dir", tdir, "--size", args.size,
           "--block-size", args.block_size, "--queue-depth", str(args.queue_depth),
           "--backend", "uring", "--mode", mode, "--runs", "1", "--direct", "on", "--keep",
           "--json"] + (["--buffer-file", buffer] if buffer else [])
    env = dict(os.environ, **(env or {}), TIERSWAP_HUGE_PAGES="1" if pages == "huge" else "0")
    env.pop("TIERSWAP_IO_CONFIG", None)  # the settings above, not a tuned file's, against fio's
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    r = json.loads(out)["runs"][0]
    assert r["mode"] == mode
    return {"gbps": r["gbps"], "cpu_s_per_gib": r["cpu_s_per_gib"],
            "latency_p50_us": r.get("latency_p50_us"), "latency_p99_us": r.get("latency_p99_us")}


def fio_job(cmd):
    """Runs fio with --output-format=json; its one job's results (exits with fio's output on a
    failure)."""
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {' '.join(cmd)} failed:\n"
                 f"{res.stdout}{res.stderr}")
    return json.loads(res.stdout[res.stdout.index("{"):])["jobs"][0]


def add_common_args(p):
    """The options every script here shares."""
    p.add_argument("--tierswap", default="build/tierswap")
    p.add_argument("--dir", default=os.environ.get("TMPDIR", "/var/tmp"))
    p.add_argument("--block-size", default="1MiB")
    p.add_argument("--queue-depth", type=int, default=32)


def fio_mem(pages, buffer):
    """fio's --mem for a cell."""
    if buffer:
        return "mmapshared:" + buffer
    return "malloc" if pages == "4k" else "shmhuge"


def run_fio(args, workdir, name, mode, pages, buffer=None):
    """One fio job of engine `name` ("fio-io_uring", "fio-libaio"): a write of a fresh file, or
    a read of the file tierswap's write left; `buffer`: the file its buffers are (shared cell)."""
    engine = name.split("-", 1)[1]
    path, offset = engine_file(workdir, name), 0
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if mode == "write" and os.path.exists(path):
        os.unlink(path)  # a fresh preallocated file, as tierswap writes into
    if mode == "read":
        path, offset = engine_file(workdir, "tierswap"), 1024 * 1024  # its data starts 1 MiB in
    cmd = ["fio", "--name=cmp", f"--filename={path}", f"--offset={offset}",
           f"--size={args.size_bytes}",
           f"--bs={args.block_size_bytes}", f"--iodepth={args.queue_depth}",
           f"--ioengine={engine}", "--direct=1", f"--rw={mode}", "--output-format=json",
           "--fallocate=native", "--mem=" + fio_mem(pages, buffer)]
    if engine == "io_uring":
        cmd += ["--fixedbufs=1", "--registerfiles=1"]
    job = fio_job(cmd)
    side = job[mode]
    seconds = side["runtime"] / 1000.0
    cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * seconds
    moved = side["io_bytes"]
    return {"gbps": moved / seconds / 1e9, "cpu_s_per_gib": cpu_s / (moved / GIB)}


def remove_old_files(workdir):
    """The files the engines wrote in the repetition before (each write gets a fresh one)."""
    for name in ENGINES:
        f = engine_file(workdir, name)
        if os.path.exists(f):
            os.unlink(f)


def shared_buffer_bytes(args):
    """The shared cell's buffer file: depth x block, and a huge page of slack for fio's
    alignment of its buffers."""
    return args.queue_depth * args.block_size_bytes + HUGE_PAGE


def write_shared_buffer(path, nbytes):
    """The shared cell's buffer file, written anew (its 4 KiB pages placed now, before any engine
    maps it)."""
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(nbytes // len(chunk)):
            f.write(chunk)
        f.write(chunk[:nbytes % len(chunk)])


def check_shared_pages(shm_dir):
    """The shared cell is a 4 KiB-page cell: refused where tmpfs would give the file huge pages."""
    if not os.path.isdir(shm_dir):
        sys.exit(f"compare_fio.py: --shm-dir {shm_dir}: not a directory (the shared cell needs a "
                 "tmpfs directory, e.g. /dev/shm)")
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            policy = f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        policy = "never"
    if policy in ("always", "within_size", "force"):
        sys.exit(f"compare_fio.py: shmem_enabled is {policy}: tmpfs files get huge pages, so the "
                 "shared cell would not be a 4 KiB-page cell; set it to advise or never, or leave "
                 "out --pages shared")


def run_cell(args, pages):
    """Every repetition of one buffer-memory cell; {engine: {mode: [sample, ...]}}."""
    samples = {e: {"write": [], "read": []} for e in ENGINES}
    workdir = tempfile.mkdtemp(prefix="tierswap-fio-", dir=args.dir)
    buffer = None
    if pages == "shared":
        buffer = os.path.join(args.shm_dir, f"tierswap-fio-buffer-{os.getpid()}")
    try:
        for rep in range(args.repeats):
            if buffer:  # new pages each repetition, the same for every engine within it
                write_shared_buffer(buffer, shared_buffer_bytes(args))
            # Rotate who goes first: on a shared virtual disk the first run after the other
            # phase is penalized, so each engine takes each position equally often.
            order = ENGINES[rep % 3:] + ENGINES[:rep % 3]
            for mode in ("write", "read"):
                if mode == "write":
                    # Every engine's earlier file goes before any write, then the disk settles:
                    # on a filesystem mounted with `discard` a deleted file's blocks are
                    # discarded at the journal's next commit, which slowed whichever write ran
                    # then (the first writer after the read phase, 2026-11-28).
                    remove_old_files(workdir)
                os.sync()
                time.sleep(args.settle)  # let the disk absorb the phase before
                for name in order:
                    if name == "tierswap":
                        sample = run_tierswap(args, workdir, mode, pages, buffer)
                    else:
                        sample = run_fio(args, workdir, name, mode, pages, buffer)
                    samples[name][mode].append(sample)
            if not args.json:
                line = "  ".join(f"{e} {m} {samples[e][m][-1]['gbps']:.3f}" for e in ENGINES
                                 for m in ("write", "read"))
                print(f"{pages} rep {rep + 1}/{args.repeats}: GB/s {line}", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if buffer and os.path.exists(buffer):
            os.unlink(buffer)
    return samples


def summarize(samples):
    def med(e, m, k):
        return statistics.median(s[k] for s in samples[e][m])

    out = {}
    for m in ("write", "read"):
        best = max(("fio-io_uring", "fio-libaio"), key=lambda e: med(e, m, "gbps"))
        out[m] = {
            "median_gbps": {e: med(e, m, "gbps") for e in ENGINES},
            "median_cpu_s_per_gib": {e: med(e, m, "cpu_s_per_gib") for e in ENGINES},
            "best_fio": best,
            "throughput_ratio": med("tierswap", m, "gbps") / med(best, m, "gbps"),
            "cpu_ratio": med("tierswap", m, "cpu_s_per_gib") / med(best, m, "cpu_s_per_gib"),
            "samples": {e: samples[e][m] for e in ENGINES},
        }
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--size", default="1GiB")
    p.add_argument("--repeats", type=int, default=6, help="a multiple of 3 balances the order")
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds of pause (after sync) before each write and each read phase")
    p.add_argument("--pages", default="4k,huge,shared",
                   help="cells to run, comma-separated: 4k, huge, shared")
    p.add_argument("--shm-dir", default="/dev/shm",
                   help="tmpfs directory for the shared cell's buffer file")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    args.size_bytes = parse_size(args.size)
    args.block_size_bytes = parse_size(args.block_size)
    cells = [c.strip() for c in args.pages.split(",") if c.strip()]
    if not cells or any(c not in ("4k", "huge", "shared") for c in cells):
        sys.exit(f"compare_fio.py: --pages {args.pages}: expected a comma-separated list of 4k, "
                 "huge and shared")
    if "shared" in cells:
        check_shared_pages(args.shm_dir)
    if shutil.which("fio") is None:
        sys.exit("compare_fio.py: fio is not installed (apt-get install fio)")
    if args.repeats < 1:
        sys.exit(f"compare_fio.py: --repeats {args.repeats}: at least 1")
    if args.repeats % len(ENGINES):
        print(f"compare_fio.py: warning: --repeats {args.repeats} is not a multiple of "
              f"{len(ENGINES)}: the engines do not take each position in the order equally often, "
              "and on a shared disk the position moves the figures", file=sys.stderr)

    report = {"size": args.size_bytes, "block_size": args.block_size_bytes,
              "queue_depth": args.queue_depth, "repeats": args.repeats, "cells": {}}
    for pages in cells:
        if pages == "huge":
            # fio's buffers (depth x block, in one shm segment, rounded up) plus slack.
            need = -(-args.queue_depth * args.block_size_bytes // HUGE_PAGE) + 4
            with HugePages(need):
                report["cells"][pages] = summarize(run_cell(args, pages))
        else:
            report["cells"][pages] = summarize(run_cell(args, pages))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.repeats} interleaved repetitions, {args.size} O_DIRECT, block {args.block_size},"
          f" depth {args.queue_depth}; medians")
    print(f"{'pages':<6} {'mode':<6} {'engine':<14} {'GB/s':>8} {'CPU s/GiB':>10}")
    for pages, cell in report["cells"].items():
        for m in ("write", "read"):
            for e in ENGINES:
                print(f"{pages:<6} {m:<6} {e:<14} {cell[m]['median_gbps'][e]:>8.3f} "
                      f"{cell[m]['median_cpu_s_per_gib'][e]:>10.4f}")
    for pages, cell in report["cells"].items():
        for m in ("write", "read"):
            r = cell[m]
            print(f"{pages} {m}: tierswap/{r['best_fio']} throughput {r['throughput_ratio']:.3f}, "
                  f"CPU s/GiB {r['cpu_ratio']:.3f}")


if __name__ == "__main__":
    main()
