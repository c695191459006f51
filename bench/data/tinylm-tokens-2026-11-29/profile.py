# One tinylm run per tier (10 steps), timing the backward and opt.step() apart, and the last
# step's StepResult. PYTHONPATH=build/python /usr/bin/python3 bench/data/tinylm-tokens-2026-11-29/profile.py
import torch, time, tempfile, statistics
import tierswap.torch as tt
from tierswap import tinylm
torch.set_num_threads(2)
for tier in ("host", "nvme"):
    model = tinylm.make_model()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        opt = tt.AdamW(tinylm.param_groups(model), swap_dir=d, state_tier=tier,
                       host_budget="16MiB" if tier == "nvme" else "256MiB",
                       max_grad_norm=1.0, threads=2, telemetry=False)
        steps = []
        fb = []
        for s in range(10):
            t0 = time.perf_counter()
            mbs = tinylm.batches(s)
            for i, (x, y) in enumerate(mbs):
                with opt.micro_batch(final=i == len(mbs) - 1):
                    loss = tinylm.loss_of(model, x, y) / len(mbs)
                    loss.backward()
            t1 = time.perf_counter()
            opt.step(); opt.zero_grad()
            t2 = time.perf_counter()
            fb.append(t1 - t0); steps.append(t2 - t1)
        print(tier, "fwd/bwd med", statistics.median(fb), "step med", statistics.median(steps))
        print({k: v for k, v in opt.last_step.items() if not isinstance(v, (list, dict))})
        opt.close()
