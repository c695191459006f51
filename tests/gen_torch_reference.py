#!/usr/bin/python3
"""Generates tests/fixtures/torch_optim_reference.json with Debian's python3-torch.

For several hyper-parameter sets it runs torch.optim.AdamW / Adam / SGD (CPU, fp32) for 12 steps
on 263 parameters whose gradients are bf16 values times a multiplier, exactly what tierswap's
fused kernels read, and records the inputs (initial fp32 parameters, bf16 gradient bits per step)
and the final parameters and state. Lion has no torch class; its reference is the formula in
torch fp32 tensor ops. Run: /usr/bin/python3 tests/gen_torch_reference.py
"""
import json
import os

import torch

N = 263
STEPS = 12


def bf16_bits(t):
    return (t.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF).tolist()


def f32_bits(t):
    return (t.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF).tolist()


def make_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    p0 = torch.randn(N, generator=g, dtype=torch.float32)
    grads = [torch.randn(N, generator=g, dtype=torch.float32) * 0.3 for _ in range(STEPS)]
    grads = [x.to(torch.bfloat16).to(torch.float32) for x in grads]
    return p0, grads


def run_torch(kind, hp, p0, grads, multiplier):
    p = torch.nn.Parameter(p0.clone())
    if kind == "adamw":
        opt = torch.optim.AdamW([p], **hp)
    elif kind == "adam":
        opt = torch.optim.Adam([p], **hp)
    elif kind == "sgd":
        opt = torch.optim.SGD([p], **hp)
    for g in grads:
        p.grad = g * multiplier
        opt.step()
    st = opt.state[p]
    out = {"param": f32_bits(p.detach())}
    for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"):
        if k in st and st[k] is not None:
            out[k] = f32_bits(st[k])
    return out


def run_lion(hp, p0, grads, multiplier):
    p = p0.clone()
    m = torch.zeros_like(p)
    lr, b1, b2, wd = hp["lr"], hp["betas"][0], hp["betas"][1], hp["weight_decay"]
    for g in grads:
        g = g * multiplier
        p.mul_(1 - lr * wd)
        c = m * b1 + g * (1 - b1)
        p.add_(torch.sign(c), alpha=-lr)
        m.mul_(b2).add_(g, alpha=1 - b2)
    return {"param": f32_bits(p), "exp_avg": f32_bits(m)}


CASES = [
    ("adamw", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), 1.0),
    ("adamw", dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1), 0.5),
    ("adamw", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=True), 1.0),
    ("adamw", dict(lr=2e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, maximize=True), 0.25),
    ("adam", dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), 1.0),
    ("adam", dict(lr=5e-3, betas=(0.85, 0.98), eps=1e-7, weight_decay=0.0, amsgrad=True), 2.0),
    ("sgd", dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=1e-3), 1.0),
    ("sgd", dict(lr=0.05, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=True), 0.5),
    ("sgd", dict(lr=0.1, momentum=0.5, dampening=0.1, weight_decay=0.0, maximize=True), 1.0),
    ("sgd", dict(lr=0.1, momentum=0.0, weight_decay=0.01), 1.0),
    ("lion", dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1), 1.0),
]


def main():
    out = {"torch_version": torch.__version__, "n": N, "steps": STEPS, "cases": []}
    for i, (kind, hp, mult) in enumerate(CASES):
        p0, grads = make_inputs(1000 + i)
        ref = run_lion(hp, p0, grads, mult) if kind == "lion" else run_torch(kind, hp, p0, grads, mult)
        hp_json = {k: (list(v) if isinstance(v, tuple) else v) for k, v in hp.items()}
        out["cases"].append({"kind": kind, "hp": hp_json, "multiplier": mult,
                             "param0": f32_bits(p0), "grads_bf16": [bf16_bits(g) for g in grads],
                             "expected": ref})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                        "torch_optim_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {path}: {len(CASES)} cases, torch {torch.__version__}")


if __name__ == "__main__":
    main()
