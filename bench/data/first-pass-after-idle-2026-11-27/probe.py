# Does the first pass over memory after an idle wait run slower, without tierswap? torch copies
# between two 1.5 GiB fp32 tensors (2 threads) and adds to one, 6 passes, a 20 s wait, 6 rounds.
import time, torch
torch.set_num_threads(2)
a = torch.ones(384 << 20); b = torch.zeros(384 << 20)
b.copy_(a)
for r in range(6):
    ts = []
    for i in range(6):
        t0 = time.perf_counter(); b.copy_(a); a.add_(1e-9); ts.append(time.perf_counter() - t0)
    print(r, " ".join(f"{t:.3f}" for t in ts), flush=True)
    time.sleep(20)
