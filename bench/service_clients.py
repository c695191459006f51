#!/usr/bin/env python3
"""N training processes on one node: each on its own swap files and pinned budget ("alone"), or
all through one `tierswap serve` whose budget is what ONE of them takes alone ("service").

Every client trains tierswap.tinylm (its own seed) with tierswap.torch.AdamW, state streamed from
NVMe, for --steps steps, all N at once. Per mode and N it reports: whether every client's master
weights are bit-identical to the same seed in the other mode, the aggregate throughput (tokens/s
summed over the clients), each client's median optimizer step time (slowest / fastest), and the
pinned host memory all clients held at their peak (per-process mode: the sum of each process's
peak pinned pool; service mode: the shared memory the service granted and locked, within its
one budget) and the CPU seconds per token of the clients and the service together. A third mode,
"share", runs independent processes each at the budget a client gets from the service: it tells
the cost of the service itself from the cost of having 1/N of the memory. Modes alternate per
repetition; medians over repetitions.

  PYTHONPATH=build/python /usr/bin/python3 bench/service_clients.py --tierswap build/tierswap \\
      --clients 1,2,4 --steps 12 --budget 64MiB --reps 3 [--json]
"""
import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CLIENT = r"""
import hashlib, json, sys, time, torch, tierswap.torch as tt
from tierswap import tinylm
a = json.loads(sys.argv[1])
model = tinylm.make_model(seed=a["seed"], width=a["width"])
kw = {"service": a["service"], "service_job": a["job"]} if a["service"] else {}
opt = tt.AdamW(tinylm.param_groups(model), swap_dir=a["dir"], host_budget=a["budget"],
               state_tier="nvme", subgroup_size=a["subgroup"], max_grad_norm=1.0,
               telemetry=False, **kw)
steps, reads = [], []
sys.stdin.readline()  # every client starts together
t0, c0 = time.perf_counter(), time.process_time()
losses = tinylm.train_tierswap(model, opt, a["steps"],
                               log=lambda s, l, tps, last: (steps.append(last["seconds"]),
                                                            reads.append(last["nvme_bytes_read"])))
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
h = hashlib.sha256()
for k, v in sorted(opt.state_dict()["master_params"].items()):
    h.update(v.float().numpy().tobytes())
res = opt.residency()
print(json.dumps({"losses": losses, "masters": h.hexdigest(), "step_seconds": steps,
                  "nvme_read_per_step": sorted(reads[1:] or reads)[len(reads[1:] or reads) // 2],
                  "wall": wall, "cpu": cpu,
                  "tokens": sum(x.numel() for s in range(a["steps"]) for x, _ in tinylm.batches(s)),
                  "peak_pinned": res["counters"].get("peak_host_bytes", 0),
                  "host_memory": res["host_memory"]}))
opt.close()
"""


def parse_size(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


def start_service(cli, root, budget):
    swap = os.path.join(root, "service-swap")
    os.makedirs(swap)
    sock = os.path.join(root, "service.sock")
    note = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    note.bind(os.path.join(root, "notify"))
    note.settimeout(60)
    svc = subprocess.Popen([cli, "serve", "--swap-dir", swap, "--capacity", "2GiB",
                            "--host-budget", str(budget), "--socket", sock],
                           env=dict(os.environ, NOTIFY_SOCKET=os.path.join(root, "notify")))
    while "READY=1" not in note.recv(4096).decode().split("\n"):
        pass
    return svc, sock


def service_pages(cli, pid):
    """The kind of page the service puts its clients' shared memory on, as `tierswap residency`
    says it ("transparent huge pages (shmem_enabled: advise)", "4 KiB pages (...)")."""
    out = subprocess.run([cli, "residency", str(pid)], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith("shared memory on "):
            return line.strip()[len("shared memory on "):]
    return "unknown"


def cpu_seconds(proc):
    """User + system CPU seconds of a running process (0 for none)."""
    if proc is None:
        return 0.0
    with open(f"/proc/{proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def slab_of(host_budget, subgroup):
    """The host slab size tierswap picks for this budget and sub-group (tiered_optimizer.cpp:
    whole 2 MiB pages, at most 64 MiB, at most an eighth of the budget)."""
    two = 2 << 20
    slab = min(64 << 20, -(-subgroup * 4 // two) * two)
    if slab > host_budget // 8:
        slab = max(4096, 1 << ((host_budget // 8).bit_length() - 1))
    return slab


def share(args, n):
    """The host budget each of n clients can have from the node's one budget: the largest whose
    ask to the service (the budget and two slabs of slack) fits in 1/n of it."""
    h = args.budget // n // 4096 * 4096
    while h > 4096 and h + 2 * slab_of(h, args.subgroup) > args.budget // n:
        h -= 4096
    return h


def run_clients(n, mode, args, root):
    """n clients at once; returns their JSON reports (and the service's budget)."""
    svc, sock = (None, None)
    per_client = args.budget if mode == "alone" else share(args, n)
    if mode == "service":
        svc, sock = start_service(args.tierswap, root, args.budget)
        args.service_pages = service_pages(args.tierswap, svc.pid)
    procs = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        for i in range(n):
            d = os.path.join(root, f"{mode}-{i}")
            os.makedirs(d)
            a = {"seed": 1000 + i, "width": args.width, "dir": d, "budget": per_client,
                 "subgroup": args.subgroup,
                 "steps": args.steps, "service": sock, "job": f"bench{i}"}
            procs.append(subprocess.Popen([sys.executable, "-c", CLIENT, json.dumps(a)], env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True))
        time.sleep(3)  # imports and set-up
        svc_cpu = cpu_seconds(svc)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in procs:
            line = p.stdout.readline()
            out.append(json.loads(line) if line else None)
        svc_cpu = cpu_seconds(svc) - svc_cpu
        if any(p.wait() != 0 for p in procs) or None in out:
            raise RuntimeError(f"{mode} client failed")
        return out, per_client, svc_cpu
    finally:
        if svc:
            svc.terminate()
            svc.wait()


def summary(reports, mode, per_client, svc_cpu, subgroup):
    med = [statistics.median(r["step_seconds"]) for r in reports]
    # Service: what it granted (each client's memfd, mlocked whole: its host budget and two slabs
    # of slack, within the node's budget); alone: each process's peak.
    pinned = (len(reports) * (per_client + 2 * slab_of(per_client, subgroup)) if mode == "service"
              else sum(r["peak_pinned"] for r in reports))
    tokens = sum(r["tokens"] for r in reports)
    return {"tokens_per_s": sum(r["tokens"] / r["wall"] for r in reports),
            "cpu_us_per_token": 1e6 * (sum(r["cpu"] for r in reports) + svc_cpu) / tokens,
            # NVMe bytes read per step (each client's median after its first step), summed.
            "nvme_read_per_step": sum(r["nvme_read_per_step"] for r in reports),
            "step_s_fastest": min(med), "step_s_slowest": max(med),
            "slowest_over_fastest": max(med) / min(med), "pinned_bytes": pinned,
            "per_client_budget": per_client, "host_memory": reports[0]["host_memory"],
            "masters": [r["masters"] for r in reports]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tierswap", default="build/tierswap")
    ap.add_argument("--clients", default="1,2,4")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--budget", default="64MiB", help="one client's pinned budget alone")
    ap.add_argument("--subgroup", type=int, default=131072)
    ap.add_argument("--width", type=int, default=256,
                    help="tinylm's width (512: 13M parameters, 150 MiB of AdamW state)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/var/tmp"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.budget = parse_size(args.budget)
    args.service_pages = None
    results = []
    modes = ("alone", "share", "service")
    for n in (int(x) for x in args.clients.split(",")):
        reps = {m: [] for m in modes}
        for r in range(args.reps):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                with tempfile.TemporaryDirectory(dir=args.dir) as root:
                    reports, per, svc_cpu = run_clients(n, mode, args, root)
                reps[mode].append(summary(reports, mode, per, svc_cpu, args.subgroup))
                print(f"clients {n} rep {r} {mode}: "
                      f"{reps[mode][-1]['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
        masters = {tuple(x["masters"]) for m in modes for x in reps[m]}
        row = {"clients": n, "bit_identical": len(masters) == 1}
        for mode in modes:
            row[mode] = {k: statistics.median(x[k] for x in reps[mode])
                         for k in ("tokens_per_s", "cpu_us_per_token", "nvme_read_per_step",
                                   "step_s_fastest",
                                   "step_s_slowest", "slowest_over_fastest", "pinned_bytes",
                                   "per_client_budget")}
            row[mode]["host_memory"] = reps[mode][0]["host_memory"]
        for mode in ("alone", "share"):
            row[f"throughput_service_over_{mode}"] = (row["service"]["tokens_per_s"] /
                                                      row[mode]["tokens_per_s"])
        row["pinned_service_over_alone"] = (row["service"]["pinned_bytes"] /
                                            row["alone"]["pinned_bytes"])
        results.append(row)
    if args.json:
        print(json.dumps({"steps": args.steps, "budget": args.budget, "reps": args.reps,
                          "width": args.width, "service_shared_memory": args.service_pages,
                          "huge_pages": os.environ.get("TIERSWAP_HUGE_PAGES", "1") != "0",
                          "results": results}, indent=1))
        return
    print(f"service's shared memory on {args.service_pages}")
    print(f"{'clients':>7} {'identical':>9} {'tokens/s alone':>14} {'share':>6} {'service':>7} "
          f"{'svc/alone':>9} {'svc/share':>9} {'us/token alone/share/svc':>24} "
          f"{'pinned alone':>12} {'service':>7} {'slowest/fastest':>15}")
    for r in results:
        cpu = "/".join(f"{r[m]['cpu_us_per_token']:.0f}" for m in modes)
        print(f"{r['clients']:>7} {str(r['bit_identical']):>9} {r['alone']['tokens_per_s']:>14.0f} "
              f"{r['share']['tokens_per_s']:>6.0f} {r['service']['tokens_per_s']:>7.0f} "
              f"{r['throughput_service_over_alone']:>9.3f} "
              f"{r['throughput_service_over_share']:>9.3f} {cpu:>24} "
              f"{r['alone']['pinned_bytes'] / 2**20:>10.1f}Mi "
              f"{r['service']['pinned_bytes'] / 2**20:>5.1f}Mi "
              f"{r['service']['slowest_over_fastest']:>15.2f}")

if __name__ == "__main__":
    main()
