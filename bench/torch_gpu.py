"""tierswap.torch with the model on the GPU: exactness against the CPU path, and speed.

  python3 bench/torch_gpu.py check [--device cuda] [--widths 256,1024] [--steps 4]
      tinylm of each width on the device, AdamW state on the host tier and on NVMe: at every
      step a CPU twin of the model, with its own tierswap optimizer, takes the device model's
      gradients (copied to the host) and steps; the two models' weights must stay equal bit for
      bit (the device path: gradients from device memory after torch's stream, new values
      written into each parameter on the device). Prints one JSON line per run; exits 1 on a
      mismatch.
  python3 bench/torch_gpu.py speed [--device cuda] [--width 1024] [--steps 10] [--reps 3]
      tokens/s of tinylm on the device with tierswap (state on the host tier, and on NVMe)
      against torch.optim.AdamW(fused=True) on fp32 masters in device memory (the in-memory
      recipe), alternating, medians; and the offloaded steps' wall time (opt.last_step).

`--device cpu` runs either on the CPU (a smoke test of the script where there is no GPU).
"""

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

import torch

import tierswap.torch as tt
from tierswap import tinylm


def _opt(model, swap_dir, tier, **kw):
    return tt.AdamW(tinylm.param_groups(model), swap_dir=swap_dir, state_tier=tier,
                    host_budget="16MiB" if tier == "nvme" else "2GiB", max_grad_norm=1.0,
                    telemetry=False, **kw)


def check_one(device, width, tier, steps, scratch):
    """Steps the device model and its CPU twin on the device model's gradients; the first step
    whose weights differ (None: none)."""
    model = tinylm.make_model(width=width).to(device)
    twin = copy.deepcopy(model).cpu()
    with tempfile.TemporaryDirectory(dir=scratch) as d:
        os.mkdir(os.path.join(d, "dev"))
        os.mkdir(os.path.join(d, "cpu"))
        opt = _opt(model, os.path.join(d, "dev"), tier)
        ref = _opt(twin, os.path.join(d, "cpu"), tier)
        bad = None
        for step in range(steps):
            for x, y in tinylm.batches(step):
                (tinylm.loss_of(model, x.to(device), y.to(device)) / 2).backward()
            for p, q in zip(model.parameters(), twin.parameters()):
                q.grad = p.grad.cpu()
            opt.step()
            ref.step()
            opt.zero_grad()
            ref.zero_grad()
            same = all(torch.equal(p.cpu(), q) for p, q in zip(model.parameters(),
                                                              twin.parameters()))
            if not same and bad is None:
                bad = step
        opt.close()
        ref.close()
    return bad


def check(a):
    failed = False
    for width in a.widths:
        for tier in ("host", "nvme"):
            t0 = time.perf_counter()
            bad = check_one(a.device, width, tier, a.steps, a.scratch)
            failed |= bad is not None
            print(json.dumps({"check": "device_vs_cpu_path", "device": a.device, "width": width,
                              "state": tier, "steps": a.steps, "bit_identical": bad is None,
                              "first_mismatch_step": bad,
                              "seconds": round(time.perf_counter() - t0, 2)}), flush=True)
    return 1 if failed else 0


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def speed(a):
    tokens = a.steps * sum(x.numel() for x, _ in tinylm.batches(0))
    rates = {"tierswap_host": [], "tierswap_nvme": [], "torch_fused": []}
    step_s = {"tierswap_host": [], "tierswap_nvme": []}
    for _ in range(a.reps):
        for tier in ("host", "nvme"):
            model = tinylm.make_model(width=a.width).to(a.device)
            with tempfile.TemporaryDirectory(dir=a.scratch) as d:
                opt = _opt(model, d, tier, hooks=True)
                tinylm.train_tierswap(model, opt, 1)  # warm-up: first touch of the tiers
                _sync(a.device)
                t0 = time.perf_counter()
                seconds = []
                tinylm.train_tierswap(model, opt, a.steps + 1, start=1,
                                      log=lambda s, l, t, r: seconds.append(r["seconds"]))
                _sync(a.device)
                rates[f"tierswap_{tier}"].append(tokens / (time.perf_counter() - t0))
                step_s[f"tierswap_{tier}"].append(statistics.median(seconds))
                opt.close()
        model = tinylm.make_model(width=a.width).to(a.device)
        fused = a.device.startswith("cuda")
        tinylm.train_reference(model, 1, fused=fused)
        _sync(a.device)
        t0 = time.perf_counter()
        tinylm.train_reference(model, a.steps, fused=fused)
        _sync(a.device)
        rates["torch_fused"].append(tokens / (time.perf_counter() - t0))
    out = {"device": a.device, "width": a.width, "steps": a.steps, "reps": a.reps,
           "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None,
           "parameters": sum(p.numel() for p in tinylm.make_model(width=a.width).parameters())}
    for k, v in rates.items():
        out[f"{k}_tokens_per_s"] = statistics.median(v)
    for k in step_s:
        per = [x / t for x, t in zip(rates[k], rates["torch_fused"])]
        out[f"{k}_over_torch_median"] = statistics.median(per)
        out[f"{k}_step_seconds_median"] = statistics.median(step_s[k])
    out["runs"] = rates
    print(json.dumps(out))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("check", "speed"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--widths", default="256,1024")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scratch", default=os.environ.get("TMPDIR", "/var/tmp"))
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("torch_gpu.py: torch sees no GPU (--device cpu runs it on the CPU)")
    a.widths = [int(w) for w in a.widths.split(",")]
    a.steps = a.steps or (4 if a.what == "check" else 10)
    return check(a) if a.what == "check" else speed(a)


if __name__ == "__main__":
    sys.exit(main())
