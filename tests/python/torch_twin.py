"""A tierswap optimizer and its torch.optim twin, stepped on the same gradients.

The model is bf16 (tierswap keeps the fp32 masters); the twin steps fp32 copies of the same
weights with torch.optim, which is what tierswap's masters must equal bit for bit (torch's own
roundings: the kernels follow torch.optim's order of operations)."""

import torch

import tierswap.torch as tt

SHAPES = ((16, 8), (8,), (4, 16), (4,), (33,))


class Twin:
    """`groups(params)` makes the params argument from a list of parameters (the same function
    for both sides: a list, a generator, dict groups...)."""

    def __init__(self, tmp_path, kind="AdamW", groups=list, shapes=SHAPES, tier=None, **hyper):
        torch.manual_seed(0)
        self.params = [torch.nn.Parameter(torch.randn(s).to(torch.bfloat16)) for s in shapes]
        self.ref = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]
        tier = dict(tier or {})
        tier.setdefault("telemetry", False)
        self.opt = getattr(tt, kind)(groups(self.params), swap_dir=str(tmp_path), **tier, **hyper)
        self.torch = getattr(torch.optim, kind)(groups(self.ref), **hyper)
        self.gen = torch.Generator().manual_seed(1)

    def grads(self, which=None):
        """Fresh bf16 gradients for the parameters at `which` (all when None); None elsewhere."""
        for i, (p, r) in enumerate(zip(self.params, self.ref)):
            if which is None or i in which:
                g = torch.randn(p.shape, generator=self.gen).to(torch.bfloat16)
                p.grad, r.grad = g.clone(), g.float()
            else:
                p.grad, r.grad = None, None

    def step(self, which=None):
        self.grads(which)
        self.opt.step()
        self.torch.step()

    def masters(self):
        return self.opt.state_dict()["master_params"]

    def differing(self):
        """Indices of the parameters whose tierswap master is not torch's fp32 value bit for bit
        (or whose bf16 value is not that master rounded)."""
        ms = self.masters()  # trainable parameters only (a frozen one has no master)
        return [i for i, r in enumerate(self.ref)
                if (i in ms and not torch.equal(ms[i], r.detach()))
                or not torch.equal(self.params[i].detach(), r.detach().to(torch.bfloat16))]

    def close(self):
        self.opt.close()
