#!/usr/bin/env python3
"""A client's NVMe reads through the service while another client attaches with a large grant.

For each service binary in turn (alternating, --reps rounds): start `tierswap serve`; client A
runs `tierswap bench io --service --mode read --size S --runs R` (a raw client: each run reads S
through the service); one second in, client B (a tierswap.torch.AdamW whose host budget is
--client-memory) attaches and stays. Reports A's per-run GB/s: its slowest run and its median.

  PYTHONPATH=build/python /usr/bin/python3 attach_during_io.py --serve NAME=PATH [--serve ...]
      [--client-memory 4GiB] [--budget 6GiB] [--size 256MiB] [--runs 24] [--reps 3]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from service_clients import start_service  # noqa: E402

CLIENT_B = r"""
import sys, time, torch
import tierswap.torch as tt
p = torch.nn.Parameter(torch.zeros(1 << 20, dtype=torch.bfloat16))
t0 = time.time()
opt = tt.AdamW([p], swap_dir=sys.argv[1], host_budget=sys.argv[2], service=sys.argv[3],
               service_job="b")
print(time.time() - t0, flush=True)
sys.stdin.read()
opt.close()
"""


def one_round(cli, a):
    with tempfile.TemporaryDirectory(dir="/var/tmp") as root:
        svc, sock = start_service(cli, root, a.budget)
        try:
            io = subprocess.Popen([cli, "bench", "io", "--service", sock, "--mode", "read",
                                   "--size", a.size, "--block-size", "1MiB", "--queue-depth", "8",
                                   "--runs", str(a.runs), "--json"],
                                  stdout=subprocess.PIPE, text=True)
            time.sleep(1.0)
            bdir = os.path.join(root, "b")
            os.makedirs(bdir)
            b = subprocess.Popen([sys.executable, "-c", CLIENT_B, bdir, a.client_memory, sock],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            out = json.loads(io.communicate()[0])
            b_attach = float(b.communicate("")[0].strip())
            gbps = [r["gbps"] for r in out["runs"] if r["mode"] == "read"]
            return {"gbps": gbps, "b_attach_s": b_attach}
        finally:
            svc.terminate()
            svc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--serve", action="append", required=True, help="NAME=PATH of a tierswap CLI")
    ap.add_argument("--client-memory", default="4GiB")
    ap.add_argument("--budget", default="6GiB")
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--runs", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    sides = [s.split("=", 1) for s in a.serve]
    res = {name: [] for name, _ in sides}
    for r in range(a.reps):
        for name, cli in (sides if r % 2 == 0 else sides[::-1]):
            x = one_round(cli, a)
            res[name].append(x)
            print(f"rep {r} {name}: B attached in {x['b_attach_s']:.2f} s; A's reads GB/s min "
                  f"{min(x['gbps']):.3f} median {statistics.median(x['gbps']):.3f}",
                  file=sys.stderr, flush=True)
    summary = {k: {"median_min_gbps": statistics.median(min(x["gbps"]) for x in v),
                   "median_median_gbps": statistics.median(statistics.median(x["gbps"])
                                                           for x in v),
                   "median_b_attach_s": statistics.median(x["b_attach_s"] for x in v)}
               for k, v in res.items()}
    print(json.dumps({"client_memory": a.client_memory, "budget": a.budget, "size": a.size,
                      "runs": a.runs, "results": res, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
