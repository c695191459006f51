import torch, tierswap.torch as tt, time, sys
N = int(sys.argv[1])
ps = [torch.nn.Parameter(torch.randn(64).bfloat16()) for _ in range(N)]
t0 = time.perf_counter(); opt = tt.AdamW(ps, lr=1e-3, telemetry=False); t1 = time.perf_counter()
for p in ps: p.grad = torch.ones_like(p)
opt.step(); t2 = time.perf_counter()
for _ in range(3): opt.step()
t3 = time.perf_counter()
print(N, "ctor %.3f first step %.3f next %.4f" % (t1 - t0, t2 - t1, (t3 - t2) / 3))
opt.close()
