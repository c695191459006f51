"""Parameters in device memory through tierswap.torch: the hand-over (gradients by
add_grad_device, new values written into each parameter's own storage by
bind_param16_device) is the same code on a GPU and on the simulated device tier, where CPU
tensors stand in for device memory. Each run here is bit-identical to the host path (CPU
parameters aliased to tierswap's 16-bit copy, gradients lent)."""

import copy
import os
import subprocess
import sys

import pytest
import torch

import tierswap.torch as tt

from test_torch_optim import RANK, _expect_same_state, _free_port, _one_rank


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 5),
                               torch.nn.LayerNorm(5)).to(torch.bfloat16)


class Pair:
    """The same model twice: one on the host path, one on the simulated device path."""

    def __init__(self, tmp_path, kind="AdamW", dtype=torch.bfloat16, **kw):
        self.host = _model().to(dtype)
        self.dev = copy.deepcopy(self.host)
        self.kw = kw
        kw.setdefault("telemetry", False)
        (tmp_path / "h").mkdir()
        (tmp_path / "d").mkdir()
        self.oh = getattr(tt, kind)(self.host.parameters(), swap_dir=str(tmp_path / "h"), **kw)
        self.od = getattr(tt, kind)(self.dev.parameters(), swap_dir=str(tmp_path / "d"),
                                    device_tier="simulated", **kw)
        self.gen = torch.Generator().manual_seed(11)

    def backward(self, scale=1.0):
        dtype = next(self.host.parameters()).dtype
        if dtype == torch.float16:  # torch 1.13 has no fp16 matmul on the CPU: given gradients
            for p, q in zip(self.host.parameters(), self.dev.parameters()):
                g = (torch.randn(p.shape, generator=self.gen) * scale * 256).to(dtype)
                p.grad = g if p.grad is None else p.grad + g
                q.grad = p.grad.clone()
            return
        x = torch.randn(6, 24, generator=self.gen).to(dtype)
        for m in (self.host, self.dev):
            (m(x).float().square().mean() * scale).backward()

    def step(self, micro=1, clip=None):
        for i in range(micro):
            final = i == micro - 1
            with self.oh.micro_batch(final), self.od.micro_batch(final):
                self.backward(1.0 / micro)
        if clip is not None:
            assert torch.equal(self.oh.clip_grad_norm_(self.host.parameters(), clip),
                               self.od.clip_grad_norm_(self.dev.parameters(), clip))
        self.oh.step()
        self.od.step()
        self.oh.zero_grad()
        self.od.zero_grad()

    def check(self):
        for a, b in zip(self.host.parameters(), self.dev.parameters()):
            assert torch.equal(a, b)
        sh, sd = self.oh.state_dict(), self.od.state_dict()
        for i, m in sh["master_params"].items():
            assert torch.equal(m, sd["master_params"][i]), i
        for i, st in sh["state"].items():
            for k, v in st.items():
                assert torch.equal(v, sd["state"][i][k]), (i, k)

    def close(self):
        self.oh.close()
        self.od.close()


CASES = {
    "plain": dict(),
    "hooks": dict(hooks=True),
    "hooks_overlap": dict(hooks=True, overlap=True),
    "nvme_clip": dict(state_tier="nvme", max_grad_norm=0.05, subgroup_size=8192),
    "host_memory_only": dict(state_tier="host", persist_resident_state=False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_simulated_device_path_is_bit_identical_to_the_host_path(tmp_path, case):
    pair = Pair(tmp_path, **CASES[case])
    for k in range(4):
        pair.step(micro=2 if k % 2 else 1)
    pair.check()
    # the device path's parameters keep their own storage; the host path's is tierswap's
    assert all(p.data_ptr() == s for (p, _), s in zip(pair.od._ids, pair.od._storage))
    pair.close()


def test_clipping_with_torchs_norm_and_fp16_with_the_loss_scaler(tmp_path):
    pair = Pair(tmp_path, dtype=torch.float16, loss_scale="dynamic", init_scale=256.0)
    for _ in range(3):
        pair.step(clip=0.1)
    pair.check()
    assert pair.od.last_step["loss_scale"] == pair.oh.last_step["loss_scale"]
    pair.close()


def test_weights_written_and_groups_added_reach_both_paths_alike(tmp_path):
    pair = Pair(tmp_path, lr=1e-2)
    pair.step()
    with torch.no_grad():  # adopted as the masters at the next backward
        pair.host[0].weight.mul_(0.5)
        pair.dev[0].weight.mul_(0.5)
    pair.step()
    extra = [torch.nn.Parameter(torch.full((33,), 0.25, dtype=torch.bfloat16)) for _ in range(2)]
    pair.oh.add_param_group({"params": [extra[0]], "lr": 3e-3})
    pair.od.add_param_group({"params": [extra[1]], "lr": 3e-3})
    for k in range(2):
        extra[0].grad = torch.full((33,), 0.5 + k, dtype=torch.bfloat16)
        extra[1].grad = extra[0].grad.clone()
        pair.step()
    pair.check()
    assert torch.equal(extra[0], extra[1]) and not torch.equal(extra[0], torch.full_like(
        extra[0], 0.25))
    pair.close()


def test_a_gradient_or_parameter_on_the_wrong_device_is_named(tmp_path):
    m = _model()
    with pytest.raises(ValueError, match="device_tier='gpu'"):
        tt.AdamW(m.parameters(), swap_dir=str(tmp_path), device_tier="gpu", telemetry=False)
    opt = tt.AdamW(m.parameters(), swap_dir=str(tmp_path), device_tier="simulated",
                   telemetry=False)
    m[0].weight.grad = torch.ones_like(m[0].weight)
    m[0].weight.grad.data = torch.ones(3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"gradient of parameter 0 is \(3,\) on cpu for a "
                                         r"\(40, 24\) simulated device parameter"):
        opt.step()
    opt.close()
    if torch.cuda.is_available():
        mixed = [torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16, device="cuda")),
                 torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))]
        with pytest.raises(ValueError, match="one device per optimizer"):
            tt.AdamW(mixed, swap_dir=str(tmp_path), telemetry=False)


def test_two_gloo_ranks_on_the_simulated_device_path_match_one_host_rank(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    one = _one_rank(tmp_path, 2, env)
    port = str(_free_port())
    procs = []
    for r in range(2):
        (tmp_path / f"r{r}").mkdir()
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(r), "2", "2", port,
                                       str(tmp_path / "many.pt"), str(tmp_path / f"r{r}")],
                                      env=dict(env, TS_DEVICE_TIER="simulated")))
    for p in procs:
        assert p.wait(timeout=300) == 0
    _expect_same_state(one, torch.load(tmp_path / "many.pt"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU here")
@pytest.mark.parametrize("hooks", [False, True])
def test_a_cuda_model_steps_as_the_same_model_on_the_cpu(tmp_path, hooks):
    """The GPU path: gradients from the GPU after torch's stream, new values written into each
    p on the GPU. Inputs and gradients are made on the CPU and copied, so both sides step on
    the same bits (the forward on the GPU is not compared)."""
    cpu = _model()
    gpu = copy.deepcopy(cpu).cuda()
    (tmp_path / "c").mkdir()
    (tmp_path / "g").mkdir()
    oc = tt.AdamW(cpu.parameters(), swap_dir=str(tmp_path / "c"), telemetry=False, hooks=hooks)
    og = tt.AdamW(gpu.parameters(), swap_dir=str(tmp_path / "g"), telemetry=False, hooks=hooks)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        for p, q in zip(cpu.parameters(), gpu.parameters()):
            g = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
            if hooks:  # through a backward, so the hooks hand them over
                (p.float() * g.float()).sum().backward()
                (q.float() * g.cuda().float()).sum().backward()
            else:
                p.grad, q.grad = g, g.cuda()
        oc.step()
        og.step()
    for p, q in zip(cpu.parameters(), gpu.parameters()):
        assert q.is_cuda and torch.equal(p, q.cpu())
    oc.close()
    og.close()
