"""Conformance: torch's own optimizer test ideas applied to tierswap.torch, each against
torch.optim on the same data, bit for bit (the fp32 masters are torch's fp32 parameters, the bf16
model their rounding). Where tierswap differs by design the test pins the difference down; the
table of tools/docs/pytorch.md lists each one."""

import pytest
import torch

import tierswap.torch as tt

from torch_twin import Twin

KINDS = [
    ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
    ("AdamW", dict(lr=1e-2, betas=(0.8, 0.9), eps=1e-6, maximize=True)),
    ("Adam", dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
]

FORMS = {
    "list": list,
    "tuple": tuple,
    "generator": lambda ps: (p for p in ps),
    "dict groups of lists": lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "lr": 3e-3}],
    "dict groups of generators": lambda ps: [{"params": iter(ps[:3]), "weight_decay": 0.0},
                                             {"params": (p for p in ps[3:])}],
    "one tensor per group": lambda ps: [{"params": p, "lr": 1e-3 * (i + 1)}
                                        for i, p in enumerate(ps)],
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind,hyper", KINDS, ids=lambda v: v if isinstance(v, str) else None)
def test_every_constructor_form_steps_as_torch(tmp_path, kind, hyper, form):
    tier = dict(state_tier="nvme", host_budget="8MiB") if len(form) % 2 else None
    t = Twin(tmp_path, kind, FORMS[form], tier=tier, **hyper)
    for _ in range(3):
        t.step()
    assert t.differing() == []
    t.close()


SCHEDULERS = {
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (s + 1)),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5),
    "LinearLR": lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=4),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1e-2, total_steps=6),
}


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
def test_schedulers_drive_both_the_same(tmp_path, name, kind):
    hyper = dict(lr=1e-2, momentum=0.9) if kind == "SGD" else dict(lr=1e-2)
    t = Twin(tmp_path, kind, **hyper)
    ours, theirs = SCHEDULERS[name](t.opt), SCHEDULERS[name](t.torch)
    for _ in range(6):
        t.step()
        ours.step()
        theirs.step()
        assert ours.get_last_lr() == theirs.get_last_lr()
    assert t.differing() == []
    t.close()


def test_reduce_lr_on_plateau_and_hand_edited_groups(tmp_path):
    t = Twin(tmp_path, "Adam", lr=1e-2)
    plateaus = [torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5)
                for o in (t.opt, t.torch)]
    for step in range(5):
        t.step()
        for s in plateaus:
            s.step(1.0)  # no improvement: halved every step
        for o in (t.opt, t.torch):
            o.param_groups[0]["betas"] = (0.9 - 0.01 * step, 0.999)
            o.param_groups[0]["weight_decay"] = 0.01 * step
    assert t.opt.param_groups[0]["lr"] == t.torch.param_groups[0]["lr"] < 1e-2
    assert t.differing() == []
    t.close()


@pytest.mark.parametrize("kind,hyper", KINDS, ids=lambda v: v if isinstance(v, str) else None)
def test_state_dicts_round_trip_both_ways_and_training_goes_on_identically(tmp_path, kind, hyper):
    t = Twin(tmp_path, kind, FORMS["dict groups of lists"], **hyper)
    for _ in range(2):
        t.step()
    ours, theirs = t.opt.state_dict(), t.torch.state_dict()
    for mine, torchs in zip(ours["param_groups"], theirs["param_groups"]):
        assert mine == {k: torchs[k] for k in mine}  # torch's has its switches (foreach...) too
    assert ours["state"].keys() == theirs["state"].keys()
    for i, st in theirs["state"].items():
        for key, value in st.items():
            assert torch.equal(ours["state"][i][key].float(), value.float()), (i, key)
    fresh = getattr(torch.optim, kind)(FORMS["dict groups of lists"](t.ref), **hyper)
    fresh.load_state_dict(ours)  # tierswap's dict into torch
    t.torch = fresh
    t.opt.load_state_dict(theirs)  # torch's into tierswap
    for _ in range(2):
        t.step()
    assert t.differing() == []
    t.close()


def _linear_backward(t, sides=("ours", "theirs")):
    """loss = sum(p * w) with w exact in bf16: both sides get the same gradient w."""
    losses = []
    for side in sides:
        ps = t.params if side == "ours" else t.ref
        g = torch.Generator().manual_seed(3)
        loss = sum((p.float() * torch.randn(p.shape, generator=g).to(torch.bfloat16).float()).sum()
                   for p in ps)
        loss.backward()
        losses.append(loss)
    return losses


@pytest.mark.parametrize("hooks", [False, True])
def test_a_closure_is_called_and_its_loss_returned(tmp_path, hooks):
    t = Twin(tmp_path, "AdamW", tier=dict(hooks=hooks), lr=1e-2)
    for _ in range(2):
        seen = []

        def closure():
            t.opt.zero_grad()
            seen.append(_linear_backward(t, ("ours",))[0])
            return seen[-1]

        def torch_closure():
            t.torch.zero_grad(set_to_none=True)
            return _linear_backward(t, ("theirs",))[0]

        assert t.opt.step(closure) is seen[-1]
        t.torch.step(torch_closure)
    assert t.differing() == []
    t.close()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_variants(tmp_path, set_to_none):
    """zero_grad(set_to_none=False) leaves zero gradients: the next step without a backward
    still steps (weight decay moves the weights), as torch's does; None leaves them alone."""
    t = Twin(tmp_path, "AdamW", lr=1e-2, weight_decay=0.1)
    t.step()
    t.opt.zero_grad(set_to_none=set_to_none)
    t.torch.zero_grad(set_to_none=set_to_none)
    assert all((p.grad is None) == set_to_none for p in t.params)
    with pytest.warns(UserWarning) if set_to_none else _no_warning():
        t.opt.step()
    t.torch.step()
    assert t.opt.step_count == (1 if set_to_none else 2)
    _linear_backward(t)  # accumulates onto the zeros (or starts from None)
    t.opt.step()
    t.torch.step()
    assert t.differing() == []
    t.close()


def _no_warning():
    import warnings
    cm = warnings.catch_warnings()

    class _Error:
        def __enter__(self):
            cm.__enter__()
            warnings.simplefilter("error")

        def __exit__(self, *exc):
            return cm.__exit__(*exc)
    return _Error()


def test_frozen_and_unused_parameters(tmp_path):
    """Frozen at construction (no state kept) and unused in some steps (p.grad None: left alone):
    SGD with momentum is torch's bit for bit."""
    def groups(ps):
        ps[1].requires_grad_(False)
        return ps
    t = Twin(tmp_path, "SGD", groups, lr=0.1, momentum=0.9, weight_decay=0.01)
    for which in ({0, 2, 3, 4}, {0, 3}, {2, 4}, {0, 2, 3, 4}):
        t.step(which)
    assert t.differing() == []
    assert 1 not in t.masters()  # frozen: no state
    t.close()


def test_adam_counts_one_step_for_all_parameters(tmp_path):
    """The documented difference: tierswap keeps one step count, torch one per parameter. A
    parameter first stepped at step 2 gets step 2's bias correction here, step 1's in torch;
    the parameters stepped every time are torch's bit for bit."""
    t = Twin(tmp_path, "Adam", lr=1e-2)
    t.step({0, 1, 2, 3})
    t.step()
    assert t.differing() == [4]
    assert int(t.torch.state[t.ref[4]]["step"]) == 1
    assert int(t.opt.state[t.params[4]]["step"]) == 2
    t.close()


def test_tied_parameters_are_one_parameter_and_a_repeat_is_refused(tmp_path):
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # weight tying: model.parameters() gives it once
    model = torch.nn.ModuleList([emb, head]).to(torch.bfloat16)
    assert len(list(model.parameters())) == 1
    opt = tt.AdamW(model.parameters(), swap_dir=str(tmp_path), telemetry=False)
    model[1](model[0](torch.tensor([1, 2]))).float().sum().backward()
    opt.step()
    assert torch.equal(model[0].weight, model[1].weight)
    opt.close()
    lin = torch.nn.Linear(4, 4)
    with pytest.warns(UserWarning, match="duplicate parameters"):  # torch 1.13: a warning
        torch.optim.AdamW([lin.weight, lin.weight])
    with pytest.raises(ValueError, match="holds a parameter twice"):  # tierswap: refused
        tt.AdamW([lin.to(torch.bfloat16).weight] * 2, swap_dir=str(tmp_path), telemetry=False)


def test_sparse_parameters_and_gradients_are_refused_as_by_torch(tmp_path):
    w = torch.zeros(4, 4, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(TypeError, match="is sparse"):
        tt.AdamW([w.detach().to_sparse().requires_grad_()], swap_dir=str(tmp_path))
    opt = tt.AdamW([w], swap_dir=str(tmp_path), telemetry=False)
    w.grad = torch.ones(4, 4, dtype=torch.bfloat16).to_sparse()
    with pytest.raises(TypeError, match="gradient of parameter 0 .* is sparse"):
        opt.step()
    ref = torch.zeros(4, 4, requires_grad=True)
    ref.grad = torch.ones(4, 4).to_sparse()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        torch.optim.AdamW([ref]).step()
    opt.close()


@pytest.mark.parametrize("kind,hooks", [("AdamW", False), ("AdamW", True), ("SGD", False),
                                        ("Lion", False)])
def test_add_param_group_between_steps_trains_the_group_as_torch_does(tmp_path, kind, hooks):
    """Progressive unfreezing: the group added after two steps takes its step count from 1, as
    torch's per-parameter count does (Adam's bias correction, SGD's first momentum buffer)."""
    if kind == "Lion" and not hasattr(torch.optim, "Lion"):
        pytest.skip("torch has no Lion to compare with")
    hyper = {"lr": 0.01, "momentum": 0.9} if kind == "SGD" else {}
    t = Twin(tmp_path, kind, groups=lambda ps: [{"params": ps[:3]}], tier={"hooks": hooks},
             **hyper)
    for _ in range(2):
        _backward_and_step(t, hooks)
    t.opt.add_param_group({"params": t.params[3:], "lr": 3e-3})
    t.torch.add_param_group({"params": t.ref[3:], "lr": 3e-3})
    assert t.opt.param_groups[1]["lr"] == 3e-3
    for _ in range(3):
        _backward_and_step(t, hooks)
    assert t.differing() == []
    sd, ref = t.opt.state_dict(), t.torch.state_dict()
    assert [float(sd["state"][i]["step"]) for i in (0, 4)] == [5.0, 3.0]
    if kind != "SGD":  # torch's SGD keeps no step
        assert [float(ref["state"][i]["step"]) for i in (0, 4)] == [5.0, 3.0]
    t.close()


def _backward_and_step(t, hooks):
    """One step of both sides; with hooks the gradients reach tierswap through a backward."""
    if not hooks:
        t.step()
        return
    t.grads()
    given = [p.grad for p in t.params]
    for p in t.params:
        p.grad = None
    loss = sum((p.float() * g.float()).sum() for p, g in zip(t.params, given))
    loss.backward()  # d loss / d p = g, handed over by the hooks of the optimizer's parameters
    t.opt.step()
    t.torch.step()
