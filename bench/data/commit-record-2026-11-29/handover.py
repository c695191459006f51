# The step-time hand-over from Python at 40,000 parameters of 64 elements: the median of 15
# steps of _lend_grads (the Python loop over p.grad and the native lend_grads) and of the whole
# hand-over (handover_seconds).   PYTHONPATH=BUILD/python /usr/bin/python3 handover.py
import torch, tierswap.torch as tt, time, sys
N=40000
ps=[torch.nn.Parameter(torch.randn(64).bfloat16()) for _ in range(N)]
opt=tt.AdamW(ps, lr=1e-3, telemetry=False)
for p in ps: p.grad=torch.ones_like(p)
orig=opt._lend_grads; ts=[]
def timed():
    a=time.perf_counter(); r=orig(); ts.append(time.perf_counter()-a); return r
opt._lend_grads=timed
hs=[]
for i in range(15):
    opt.step(); hs.append(opt.last_step["handover_seconds"])
ts.sort(); hs.sort()
print("lend_grads %.4f of handover %.4f" % (ts[7], hs[7]))
opt.close()
