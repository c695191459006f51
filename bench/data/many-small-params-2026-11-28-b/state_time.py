import torch, tierswap.torch as tt, time, sys
N = int(sys.argv[1])
ps = [torch.nn.Parameter(torch.randn(64).bfloat16()) for _ in range(N)]
opt = tt.AdamW(ps, lr=1e-3, telemetry=False)
for p in ps: p.grad = torch.ones_like(p)
opt.step()
t0 = time.perf_counter(); sd = opt.state_dict(); t1 = time.perf_counter()
opt.load_state_dict(sd); t2 = time.perf_counter()
vals = list(opt.state.values()); t3 = time.perf_counter()
print(N, "state_dict %.3f load_state_dict %.3f state.values %.3f" % (t1 - t0, t2 - t1, t3 - t2))
opt.close()
