#!/usr/bin/env python3
"""Raw NVMe throughput through the node service against the same engine in-process.

Runs `tierswap bench io` (write, then read, --size bytes in --block-size requests, --queue-depth
in flight) on its own swap file ("local") and through one `tierswap serve` ("service": a raw
client whose ring lies in the shared memory the service maps), alternating the order per round,
for each depth; prints medians and service / local per direction.

Equal terms: both sides move the same bytes in the same request sizes at the same depth, and
their buffers are on the same kind of page. The local engine's ring is anonymous memory on
transparent huge pages (madvise); the service's is shared memory, on huge pages only where
/sys/kernel/mm/transparent_hugepage/shmem_enabled lets it. --huge-pages off (TIERSWAP_HUGE_PAGES=0
for both) puts both on 4 KiB pages; --huge-pages on refuses to run where the service's memory
cannot have them.

  /usr/bin/python3 bench/service_io.py [--tierswap build/tierswap] [--depths 1,2,4,8]
      [--block-size 512KiB] [--size 256MiB] [--rounds 4] [--huge-pages on|off] [--json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from service_clients import service_pages, start_service  # noqa: E402


def bench_io(cli, env, size, block, depth, sock=None):
    cmd = [cli, "bench", "io", "--size", size, "--block-size", block, "--queue-depth", str(depth),
           "--runs", "1", "--json"] + (["--service", sock] if sock else [])
    out = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True,
                                    check=True).stdout)
    return {r["mode"]: r["gbps"] for r in out["runs"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tierswap", default="build/tierswap")
    ap.add_argument("--depths", default="1,2,4,8")
    ap.add_argument("--block-size", default="512KiB")
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--huge-pages", choices=("on", "off"), default="on")
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/var/tmp"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    depths = [int(d) for d in args.depths.split(",")]
    env = dict(os.environ, TMPDIR=args.dir,
               TIERSWAP_HUGE_PAGES="1" if args.huge_pages == "on" else "0")
    env.pop("TIERSWAP_IO_CONFIG", None)  # both sides on the engine's defaults and these options
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        os.environ["TIERSWAP_HUGE_PAGES"] = env["TIERSWAP_HUGE_PAGES"]  # the service's too
        svc, sock = start_service(args.tierswap, root, "64MiB")
        try:
            pages = service_pages(args.tierswap, svc.pid)
            if args.huge_pages == "on" and not pages.startswith("transparent huge pages"):
                sys.exit(f"the service's shared memory is on {pages}: not equal terms with the "
                         "local engine's huge pages (allow shmem huge pages, or --huge-pages off)")
            samples = {}
            for r in range(args.rounds):
                for d in depths:
                    for side in (("local", "service") if r % 2 == 0 else ("service", "local")):
                        got = bench_io(args.tierswap, env, args.size, args.block_size, d,
                                       sock if side == "service" else None)
                        for mode, gbps in got.items():
                            samples.setdefault(f"{d}/{mode}/{side}", []).append(gbps)
        finally:
            svc.terminate()
            svc.wait()
    rows = []
    for d in depths:
        for mode in ("write", "read"):
            loc, svc_ = samples[f"{d}/{mode}/local"], samples[f"{d}/{mode}/service"]
            rows.append({"depth": d, "mode": mode, "local_gbps": statistics.median(loc),
                         "service_gbps": statistics.median(svc_),
                         "service_over_local": statistics.median(svc_) / statistics.median(loc),
                         "local_samples": loc, "service_samples": svc_})
    if args.json:
        print(json.dumps({"block_size": args.block_size, "size": args.size,
                          "rounds": args.rounds, "huge_pages": args.huge_pages,
                          "service_shared_memory": pages, "rows": rows}, indent=1))
        return
    print(f"service's shared memory on {pages}; {args.size} per phase, {args.block_size} requests")
    print(f"{'depth':>5} {'mode':<5} {'local GB/s':>10} {'service':>8} {'service/local':>13}")
    for x in rows:
        print(f"{x['depth']:>5} {x['mode']:<5} {x['local_gbps']:>10.3f} {x['service_gbps']:>8.3f} "
              f"{x['service_over_local']:>13.3f}")


if __name__ == "__main__":
    main()
