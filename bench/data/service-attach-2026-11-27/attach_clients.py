#!/usr/bin/env python3
"""How long N clients that attach at once take to get their pinned memory from one service.

For each service binary in turn (alternating, --reps rounds): start `tierswap serve` with
--host-budget B, start N client processes at once (each a tierswap.torch.AdamW on a small
parameter whose host budget, and so its pinned grant, is --client-memory), and record each
client's time from start to attached (its optimizer built) and the time until the last one is.

  PYTHONPATH=build/python /usr/bin/python3 attach_clients.py --serve NAME=PATH [--serve ...]
      [--clients 4] [--client-memory 1536MiB] [--budget 8GiB] [--reps 3]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from service_clients import start_service  # noqa: E402

CLIENT = r"""
import os, sys, time, torch
import tierswap.torch as tt
t0 = float(sys.argv[1])
p = torch.nn.Parameter(torch.zeros(1 << 20, dtype=torch.bfloat16))
opt = tt.AdamW([p], swap_dir=sys.argv[2], host_budget=sys.argv[3], service=sys.argv[4],
               service_job="attach%s" % sys.argv[5])
print(time.time() - t0, flush=True)
opt.close()
"""


def one_round(cli, n, mem, budget):
    with tempfile.TemporaryDirectory(dir="/var/tmp") as root:
        svc, sock = start_service(cli, root, budget)
        try:
            t0 = time.time()
            dirs = [os.path.join(root, f"client{k}") for k in range(n)]
            for d in dirs:
                os.makedirs(d)
            procs = [subprocess.Popen([sys.executable, "-c", CLIENT, str(t0), dirs[k], mem, sock,
                                       str(k)], stdout=subprocess.PIPE, text=True)
                     for k in range(n)]
            times = [float(p.communicate()[0].strip()) for p in procs]
            if any(p.returncode for p in procs):
                raise SystemExit("a client failed")
            return times
        finally:
            svc.terminate()
            svc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--serve", action="append", required=True, help="NAME=PATH of a tierswap CLI")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--client-memory", default="1536MiB")
    ap.add_argument("--budget", default="8GiB")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    sides = [s.split("=", 1) for s in a.serve]
    runs = {name: [] for name, _ in sides}
    for r in range(a.reps):
        for name, cli in (sides if r % 2 == 0 else sides[::-1]):
            t = one_round(cli, a.clients, a.client_memory, a.budget)
            runs[name].append(sorted(t))
            print(f"rep {r} {name}: attached after " + ", ".join(f"{x:.2f}" for x in sorted(t))
                  + " s", file=sys.stderr, flush=True)
    out = {"clients": a.clients, "client_memory": a.client_memory, "budget": a.budget,
           "runs": runs,
           "median_last_attached_s": {k: statistics.median(max(x) for x in v)
                                      for k, v in runs.items()},
           "median_first_attached_s": {k: statistics.median(min(x) for x in v)
                                       for k, v in runs.items()}}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
