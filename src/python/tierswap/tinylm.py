"""A small decoder-only transformer language model, trained through tierswap.torch.

The main job of the README (``tools/dev.sh run``) and the model of the Python tests: 4 layers,
width 256, 4 heads, byte-level tokens, bf16 parameters, gradients and activations (the matrix
products in fp32, see `Linear`), trained on a text every Debian machine has
(/usr/share/common-licenses/GPL-3) with three parameter groups (decay, no-decay, embeddings with
their own learning rate), a cosine schedule with warm-up, gradient accumulation over 2
micro-batches and clipping at 1.0.

    python3 -m tierswap.tinylm --steps 30 --state-tier nvme --host-budget 16MiB

prints per step the loss, tokens/s and NVMe bytes, then the residency table.
"""

import argparse
import math
import os
import sys
import time

import torch
from torch import nn

TEXT = "/usr/share/common-licenses/GPL-3"


class Linear(nn.Linear):
    """nn.Linear whose bf16 weight and input meet in an fp32 product, rounded back to the input's
    dtype. Parameters, their gradients and the activations between layers stay bf16; only the
    product is fp32, because torch 1.13's CPU bf16 matrix product is a scalar loop on CPUs
    without AVX-512 (4 s for a step's forward and backward on an AVX2 EPYC, 0.2 s in fp32 with
    OpenBLAS), and the same on every host keeps the model's numbers the same everywhere."""

    def forward(self, x):
        bias = None if self.bias is None else self.bias.float()
        return nn.functional.linear(x.float(), self.weight.float(), bias).to(x.dtype)


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = Linear(width, 3 * width)
        self.proj = Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.up = Linear(width, 4 * width)
        self.down = Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2).float()
                   for z in (q, k, v))  # attention in fp32 too (see Linear), its output bf16
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).to(x.dtype).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, layers=4, width=256, heads=4, context=64, vocab=256):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = Linear(width, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def make_model(seed=0, width=256):
    """The model in bf16, initialized from `seed` (width 512: 13M parameters instead of 3.3M)."""
    torch.manual_seed(seed)
    return TinyLM(width=width).to(torch.bfloat16)


def param_groups(model, lr=3e-3, emb_lr=1e-2):
    """Three groups: 2-D weights with decay, biases and norms without, embeddings (own lr)."""
    decay, no_decay, emb = [], [], []
    for name, p in model.named_parameters():
        if name.startswith(("tok.", "pos.")):
            emb.append(p)
        elif p.dim() >= 2:
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": 0.1, "lr": lr},
            {"params": no_decay, "weight_decay": 0.0, "lr": lr},
            {"params": emb, "weight_decay": 0.0, "lr": emb_lr}]


def schedule(warmup=5, total=30):
    """Linear warm-up, then cosine decay to 10%: a LambdaLR factor."""
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def batches(step, micro=2, batch=4, context=64):
    """The micro-batches of optimizer step `step`: deterministic windows of the text."""
    data = torch.frombuffer(bytearray(open(TEXT, "rb").read()), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(1000 + step)
    out = []
    for _ in range(micro):
        starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=g)
        x = torch.stack([data[s:s + context] for s in starts])
        y = torch.stack([data[s + 1:s + 1 + context] for s in starts])
        out.append((x, y))
    return out


def loss_of(model, x, y):
    logits = model(x)
    return nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))


def train_tierswap(model, opt, steps, start=0, sched=None, log=None, total=None, clip=None):
    """Steps [start, steps) with tierswap's optimizer: accumulation over the micro-batches (the
    loss divided by their number). Clipping: inside the step (the optimizer's max_grad_norm),
    or, with `clip` = a max norm, by opt.clip_grad_norm_ where the recipe clips (torch's norm: the
    recipe's run bit for bit). `sched`: the schedule's LambdaLR when resuming (made before load(), which
    restores the scheduled lr, and stepped `start` times); made here otherwise, for a run of
    `total` steps (default `steps`: a prefix of a longer run passes its length). Returns the
    loss per step."""
    if sched is None:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(total=total or steps))
    losses = []
    device = next(model.parameters()).device
    for step in range(start, steps):
        t0 = time.perf_counter()
        mbs = [(x.to(device), y.to(device)) for x, y in batches(step)]
        total = 0.0
        for i, (x, y) in enumerate(mbs):
            with opt.micro_batch(final=i == len(mbs) - 1):
                loss = loss_of(model, x, y) / len(mbs)
                loss.backward()
            total += loss.item()
        if clip is not None:
            opt.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(total)
        if log:
            log(step, total, sum(x.numel() for x, _ in mbs) / (time.perf_counter() - t0),
                opt.last_step)
    return losses


def clip_fp64(params, max_norm):
    """torch.nn.utils.clip_grad_norm_ with the norm summed in fp64 (as tierswap sums it), the
    same clip coefficient rule (max_norm / (norm + 1e-6), applied when < 1)."""
    params = list(params)
    total = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for p in params:
            p.grad.mul_(coef)
    return total


def train_reference(model, steps, max_norm=1.0, norm="fp32", fused=False, log=None):
    """The standard mixed-precision recipe: torch.optim.AdamW on fp32 master copies of the bf16
    model, gradients accumulated in bf16 by autograd, clipped on the fp32 masters, the masters
    rounded back into the model after each step. `norm`: "fp32" (torch.nn.utils.clip_grad_norm_)
    or "fp64" (clip_fp64). `fused`: torch's fused AdamW (CUDA; else its single-tensor loop). The
    masters live where the model does. `log(step, loss)` after each step. Returns (losses,
    masters in state-dict order, optimizer)."""
    params = list(model.parameters())
    masters = [p.detach().float().clone().requires_grad_(True) for p in params]
    index = {id(p): i for i, p in enumerate(params)}
    groups = [dict(g, params=[masters[index[id(p)]] for p in g["params"]])
              for g in param_groups(model)]
    opt = torch.optim.AdamW(groups, fused=True) if fused else torch.optim.AdamW(groups, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(total=steps))
    losses = []
    device = params[0].device
    for step in range(steps):
        mbs = [(x.to(device), y.to(device)) for x, y in batches(step)]
        total = 0.0
        for x, y in mbs:
            loss = loss_of(model, x, y) / len(mbs)
            loss.backward()
            total += loss.item()
        for p, m in zip(params, masters):
            m.grad = p.grad.float()
            p.grad = None
        (clip_fp64 if norm == "fp64" else torch.nn.utils.clip_grad_norm_)(masters, max_norm)
        opt.step()
        sched.step()
        with torch.no_grad():
            for p, m in zip(params, masters):
                p.copy_(m)
        losses.append(total)
        if log:
            log(step, total)
    # in the param groups' order: torch's (and tierswap's) state-dict index
    return losses, [m for g in groups for m in g["params"]], opt


def _positive(text):
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text}: a whole number >= 1")
    return n


def main(argv=None):
    import tierswap.torch as tt
    ap = argparse.ArgumentParser(prog="python3 -m tierswap.tinylm", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=_positive, default=30, help="optimizer steps (default 30)")
    ap.add_argument("--state-tier", default="nvme", choices=("auto", "host", "nvme"),
                    help="where AdamW's state lives (default nvme)")
    ap.add_argument("--host-budget", default="16MiB",
                    help="pinned host memory for the state in flight, e.g. 16MiB (the default)")
    ap.add_argument("--swap-dir", default=None,
                    help="where the state's files go (default: a temporary directory, removed at "
                         "the end)")
    onoff = {"auto": None, "on": True, "off": False}
    ap.add_argument("--hooks", default="auto", choices=onoff,
                    help="hand gradients over during the backward (auto, the default: from the "
                         "second step)")
    ap.add_argument("--overlap", default="auto", choices=onoff,
                    help="step sub-groups during the backward (auto, the default: wherever the "
                         "hooks are; on implies --hooks on)")
    ap.add_argument("--bf16-moments", action="store_true",
                    help="keep AdamW's moments in bf16 (16 B/param of NVMe traffic, not 24)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                    help="where the model trains (default: cuda when torch sees a GPU, else cpu)")
    a = ap.parse_args(argv)
    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no usable GPU")
    if not os.path.exists(TEXT):
        sys.exit(f"tinylm: {TEXT} is missing (Debian's base-files ships it)")
    model = make_model().to(device)
    # No --swap-dir: the optimizer's temporary one (removed at close, or when a signal ends us).
    try:
        opt = tt.AdamW(param_groups(model), swap_dir=a.swap_dir, host_budget=a.host_budget,
                       state_tier=a.state_tier, max_grad_norm=1.0, hooks=onoff[a.hooks],
                       overlap=onoff[a.overlap], bf16_moments=a.bf16_moments)
    except (ValueError, TypeError, RuntimeError) as e:  # a bad option, a swap dir it refuses
        ap.error(str(e))
    n = sum(p.numel() for p in model.parameters())
    where = torch.cuda.get_device_name() if device == "cuda" else "the CPU"
    print(f"tinylm: training on {device} ({where}); {n} parameters (bf16), AdamW state {opt._native.state_bytes() / 2**20:.1f} MiB "
          f"on the {a.state_tier} tier under a {a.host_budget} host budget, "
          f"{opt._native.subgroup_count()} sub-groups; swap {opt._native.rank_dirs()[0]}")
    # step ms: the exposed step time, what the trainer waited in opt.step() (the hand-over, the
    # previous step's commit still landing, the step); its commit lands during the next forward.
    print(f"{'step':>4} {'loss':>8} {'tokens/s':>9} {'nvme read':>10} {'nvme written':>12} "
          f"{'norm':>7} {'step ms':>8}")

    def log(step, loss, tps, r):
        print(f"{step:4d} {loss:8.4f} {tps:9.0f} {r['nvme_bytes_read']:10d} "
              f"{r['nvme_bytes_written']:12d} {r['grad_norm']:7.3f} "
              f"{1e3 * r['exposed_seconds']:8.1f}", flush=True)

    train_tierswap(model, opt, a.steps, log=log)
    res = opt.residency()
    print("\nresidency (bytes):")
    print(f"{'tier':>6} {'resident':>12} {'capacity':>12}")
    for row in res["tiers"]:
        print(f"{row['tier']:>6} {row.get('resident_bytes', 0):12d} {row.get('capacity_bytes', 0):12d}")
    print(f"(host capacity: {res['host_budget_bytes']} pinned budget + "
          f"{res['pageable_budget_bytes']} pageable pool for the 16-bit gradients)")
    opt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
