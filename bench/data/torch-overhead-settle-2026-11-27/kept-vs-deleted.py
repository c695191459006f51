# After the C++ bench subprocess: is it its swap files' deletion that slows the next steps?
import os, sys, time, json, statistics, subprocess, tempfile, shutil
sys.path.insert(0, "/work/main/build/python")
import torch, tierswap, tierswap.torch as tt
torch.set_num_threads(2)
n = 64_000_000
ps = [torch.empty(k, dtype=torch.bfloat16).uniform_(-0.02, 0.02).requires_grad_() for k in [16 << 20] * 3 + [n - 3 * (16 << 20)]]
for p in ps: p.grad = torch.empty_like(p).normal_(0, 1e-3)
tmp = tempfile.mkdtemp(prefix="mech-", dir="/var/tmp")
ts = tt.AdamW(ps, lr=1e-3, swap_dir=tmp, state_tier="nvme", host_budget="512MiB", subgroup_size="4M", threads=2, telemetry=False, durable=False)
ts.step()
cli = "/work/main/build/tierswap"
out = {"deleted": [], "kept": []}
for rep in range(4):
    for mode in ("deleted", "kept"):
        d = tempfile.mkdtemp(prefix="mech-cpp-", dir="/var/tmp")
        cmd = [cli, "bench", "step", "--params", str(n), "--host-budget", "512MiB", "--sub-group", "4M", "--threads", "2", "--runs", "5", "--json", "--lend", "--dir", d]
        if mode == "kept": cmd.append("--keep")
        subprocess.run(cmd, check=True, capture_output=True)
        t = []
        for _ in range(5):
            t0 = time.perf_counter(); ts.step(); t.append(time.perf_counter() - t0)
        out[mode].append(statistics.median(t))
        print(mode, [round(x, 3) for x in t], flush=True)
        shutil.rmtree(d)
        os.sync(); time.sleep(7)
ts.close()
out["median"] = {k: statistics.median(v) for k, v in out.items()}
print(json.dumps(out))
