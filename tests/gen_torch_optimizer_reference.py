#!/usr/bin/python3
"""Generates tests/fixtures/torch_sharded_optimizer_reference.json with Debian's python3-torch.

The model and gradient sequence of tests/optim_model.hpp (keep the two in step): two parameter
groups (AdamW lr 1e-3 wd 0.1; lr 3e-3 wd 0, beta2 0.99), a frozen parameter, 4 micro-steps of
gradient accumulation, fp16 gradients with dynamic loss scaling (init 1024, growth interval 5,
the GradScaler rules: skip and halve on inf/nan, double after 5 good steps), clipping to a global
norm of 0.02 (torch.nn.utils.clip_grad_norm_), an inf at step 6. torch.optim.AdamW steps fp32
parameters. Records the final parameters (fp32 bits), the skipped steps and the steps that clipped.
Run: /usr/bin/python3 tests/gen_torch_optimizer_reference.py
"""
import json
import os

import torch

PARAMS = [("w1", [97, 131], 0, True), ("b1", [131], 1, True), ("w2", [64, 150], 0, True),
          ("emb", [16], 0, False), ("b2", [150], 1, True), ("w3", [7001], 0, True),
          ("b3", [3], 1, True)]
SAMPLES, MICRO, OVERFLOW_STEP, MAX_NORM, STEPS = 12, 4, 6, 0.02, 20
M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def key(a, b, c, d, e):
    return splitmix64(splitmix64(splitmix64(splitmix64(splitmix64(a) ^ b) ^ c) ^ d) ^ e)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def init_values(p, n):
    return torch.tensor([(key(0xC0FFEE, p, i, 0, 0) >> 40) * 2.0**-23 - 1.0 for i in range(n)],
                        dtype=torch.float32)


def grad_values(t, u, p, n):
    """The sum over all 12 samples (exact in fp16), as fp32."""
    out = []
    for i in range(n):
        if t == OVERFLOW_STEP and u == 2 and p == 2 and i == 17:
            out.append(float("inf"))
            continue
        k = sum(key(t, u, s, p, i) % 33 - 16 for s in range(SAMPLES))
        out.append(k * 2.0 ** (-10 + t % 3))
    return torch.tensor(out, dtype=torch.float16).to(torch.float32)


def main():
    params = [torch.nn.Parameter(init_values(p, numel(shape)), requires_grad=tr)
              for p, (_, shape, _, tr) in enumerate(PARAMS)]
    groups = [{"params": [params[p] for p, x in enumerate(PARAMS) if x[2] == 0 and x[3]],
               "lr": 1e-3, "weight_decay": 0.1},
              {"params": [params[p] for p, x in enumerate(PARAMS) if x[2] == 1 and x[3]],
               "lr": 3e-3, "weight_decay": 0.0, "betas": (0.9, 0.99)}]
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    scale, tracker = 1024.0, 0
    skipped, clipped, norms = [], [], []
    trainable = [p for p, x in enumerate(PARAMS) if x[3]]
    for t in range(1, STEPS + 1):
        for p in trainable:
            params[p].grad = None
        for u in range(MICRO):
            for p in trainable:
                g = grad_values(t, u, p, params[p].numel())
                # fp16 accumulation, as the trainer's fp16 gradients accumulate in tierswap
                acc = g if params[p].grad is None else (params[p].grad + g)
                params[p].grad = acc.to(torch.float16).to(torch.float32)
        # GradScaler.unscale_: multiply by the fp32 inverse scale, look for inf/nan
        inv = torch.tensor(1.0 / scale, dtype=torch.float64).float()
        found_inf = False
        for p in trainable:
            params[p].grad.mul_(inv)
            found_inf |= not torch.isfinite(params[p].grad).all().item()
        if found_inf:
            skipped.append(t)
            scale *= 0.5
            tracker = 0
            continue
        norm = torch.nn.utils.clip_grad_norm_([params[p] for p in trainable], MAX_NORM)
        norms.append(float(norm))
        if MAX_NORM / (float(norm) + 1e-6) < 1:
            clipped.append(t)
        opt.step()
        tracker += 1
        if tracker == 5:
            scale *= 2.0
            tracker = 0
    final = {}
    for p, (name, _, _, tr) in enumerate(PARAMS):
        if tr:
            final[name] = (params[p].detach().view(torch.int32).to(torch.int64) &
                           0xFFFFFFFF).tolist()
    out = {"torch_version": torch.__version__, "steps": STEPS, "skipped": skipped,
           "clipped": clipped, "grad_norms": norms, "final_scale": scale, "params": final}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                        "torch_sharded_optimizer_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {path}: skipped {skipped}, clipped {clipped}, final scale {scale}")


if __name__ == "__main__":
    main()
