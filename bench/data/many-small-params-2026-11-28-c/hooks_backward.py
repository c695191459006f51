import time, statistics, sys, torch, tierswap.torch as tt
torch.manual_seed(0)
N, E = 5000, 64
def model():
    ps = [torch.nn.Parameter(torch.randn(E).to(torch.bfloat16)) for _ in range(N)]
    return ps
x = torch.randn(E).to(torch.bfloat16)
def loss_of(ps): return sum((p * x).sum() for p in ps)
def timed_backward(ps, before=None):
    ts = []
    for i in range(12):
        loss = loss_of(ps)
        t = time.perf_counter(); loss.backward(); ts.append(time.perf_counter() - t)
        if before: before()
    return statistics.median(ts)
mode = sys.argv[1]
ps = model()
if mode == "plain":
    def z():
        for p in ps: p.grad = None
    print(mode, timed_backward(ps, z))
elif mode == "trivial":
    hs = []
    for p in ps:
        node = p.expand_as(p).grad_fn.next_functions[0][0]
        def h(*_, p=p): p.grad = None
        hs.append(node.register_hook(h))
    print(mode, timed_backward(ps))
elif mode == "tierswap":
    opt = tt.AdamW(ps, lr=1e-3, hooks=True, state_tier="host")
    def st(): opt.step(); opt.zero_grad()
    print(mode, timed_backward(ps, st))
