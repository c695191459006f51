#!/usr/bin/env python3
"""Clients attaching to `tierswap serve` with large grants, against service binaries alternating.

  clients    N client processes attach at once (each a tierswap.torch.AdamW whose host budget,
             and so its pinned grant, is --client-memory): each one's time from start to
             attached, and the time until the last one is.
  during-io  client A runs `tierswap bench io --service --mode read --size S --runs R` (each run
             reads S through the service); one second in, client B (--client-memory) attaches
             and stays: A's per-run GB/s, its slowest run and its median.

For each --serve binary in turn (the order alternating per repetition) a fresh service with
--host-budget B is started.

  PYTHONPATH=build/python /usr/bin/python3 attach.py clients --serve NAME=PATH [--serve ...]
      [--clients 4] [--client-memory 1536MiB] [--budget 8GiB] [--reps 3]
  PYTHONPATH=build/python /usr/bin/python3 attach.py during-io --serve NAME=PATH [--serve ...]
      [--client-memory 4GiB] [--budget 6GiB] [--size 256MiB] [--runs 24] [--reps 3]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from service_clients import start_service  # noqa: E402

# argv: swap dir, host budget, socket, job; prints seconds from argv[5] (or from its own start)
# to attached, then stays attached until its stdin closes.
CLIENT = r"""
import sys, time, torch
import tierswap.torch as tt
t0 = float(sys.argv[5]) if len(sys.argv) > 5 else time.time()
p = torch.nn.Parameter(torch.zeros(1 << 20, dtype=torch.bfloat16))
opt = tt.AdamW([p], swap_dir=sys.argv[1], host_budget=sys.argv[2], service=sys.argv[3],
               service_job=sys.argv[4])
print(time.time() - t0, flush=True)
sys.stdin.read()
opt.close()
"""


def client(root, name, mem, sock, *extra):
    d = os.path.join(root, name)
    os.makedirs(d)
    return subprocess.Popen([sys.executable, "-c", CLIENT, d, mem, sock, name, *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def attached_after(proc):
    out = proc.communicate("")[0].strip()
    if proc.returncode:
        raise SystemExit("a client failed")
    return float(out)


def clients_round(sock, root, a):
    t0 = str(time.time())
    procs = [client(root, f"attach{k}", a.client_memory, sock, t0) for k in range(a.clients)]
    return sorted(attached_after(p) for p in procs)


def during_io_round(sock, root, a):
    io = subprocess.Popen([a.cli, "bench", "io", "--service", sock, "--mode", "read", "--size",
                           a.size, "--block-size", "1MiB", "--queue-depth", "8", "--runs",
                           str(a.runs), "--json"], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    b = client(root, "b", a.client_memory, sock)
    out = json.loads(io.communicate()[0])
    return {"gbps": [r["gbps"] for r in out["runs"] if r["mode"] == "read"],
            "b_attach_s": attached_after(b)}


def summary(mode, runs):
    med = statistics.median
    if mode == "clients":
        return {"median_last_attached_s": med(max(x) for x in runs),
                "median_first_attached_s": med(min(x) for x in runs)}
    return {"median_min_gbps": med(min(x["gbps"]) for x in runs),
            "median_median_gbps": med(med(x["gbps"]) for x in runs),
            "median_b_attach_s": med(x["b_attach_s"] for x in runs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["clients", "during-io"])
    ap.add_argument("--serve", action="append", required=True, help="NAME=PATH of a tierswap CLI")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--client-memory")
    ap.add_argument("--budget")
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--runs", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    clients = a.mode == "clients"
    a.client_memory = a.client_memory or ("1536MiB" if clients else "4GiB")
    a.budget = a.budget or ("8GiB" if clients else "6GiB")
    one_round = clients_round if clients else during_io_round
    sides = [s.split("=", 1) for s in a.serve]
    res = {name: [] for name, _ in sides}
    for r in range(a.reps):
        for name, cli in (sides if r % 2 == 0 else sides[::-1]):
            a.cli = cli
            with tempfile.TemporaryDirectory(dir="/var/tmp") as root:
                svc, sock = start_service(cli, root, a.budget)
                try:
                    res[name].append(one_round(sock, root, a))
                finally:
                    svc.terminate()
                    svc.wait()
            print(f"rep {r} {name}: {json.dumps(res[name][-1])[:200]}", file=sys.stderr, flush=True)
    print(json.dumps({"mode": a.mode, "client_memory": a.client_memory, "budget": a.budget,
                      "runs": res, "summary": {k: summary(a.mode, v) for k, v in res.items()}},
                     indent=2))


if __name__ == "__main__":
    main()
