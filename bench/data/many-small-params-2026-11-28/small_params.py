import torch, tierswap.torch as tt, time, sys
N = int(sys.argv[1])
ps = [torch.nn.Parameter(torch.randn(64).bfloat16()) for _ in range(N)]
opt = tt.AdamW(ps, lr=1e-3, telemetry=False)
for p in ps: p.grad = torch.ones_like(p)
rows = []
for i in range(20):
    t0 = time.perf_counter(); opt.step(); t1 = time.perf_counter()
    ls = opt.last_step
    rows.append((t1-t0, ls["handover_seconds"], ls["seconds"], ls.get("commit_seconds", 0)))
rows.sort()
print(N, "median step %.4f handover %.4f native %.4f commit %.4f" % rows[len(rows)//2])
opt.close()
