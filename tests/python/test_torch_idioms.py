"""The torch idioms a new user writes, and the mistakes they make: each behaves as torch.optim
does (bit for bit against its twin) or raises (or warns) naming the parameter and the fix."""

import warnings

import pytest
import torch

import tierswap.torch as tt

from torch_twin import Twin


def _halves(ps):  # two dict groups from generators, the second with its own lr
    return [{"params": (p for p in ps[:2])}, {"params": (p for p in ps[2:]), "lr": 3e-3}]


def test_generators_in_dict_groups_train_every_parameter(tmp_path):
    t = Twin(tmp_path, groups=_halves, lr=1e-2, weight_decay=0.1)
    assert [len(g["params"]) for g in t.opt.param_groups] == [2, 3]
    before = [p.detach().clone() for p in t.params]
    for _ in range(3):
        t.step()
    assert t.differing() == []
    assert all(not torch.equal(a, p) for a, p in zip(before, t.params))
    t.close()


def test_the_same_parameters_in_two_groups_are_refused_as_by_torch(tmp_path):
    lin = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="more than one parameter group"):
        torch.optim.AdamW([{"params": lin.parameters()}, {"params": lin.parameters()}])
    lin = lin.to(torch.bfloat16)
    with pytest.raises(ValueError, match="more than one parameter group"):
        tt.AdamW([{"params": lin.parameters()}, {"params": lin.parameters()}],
                 swap_dir=str(tmp_path), telemetry=False)


@pytest.mark.parametrize("write", ["load_state_dict", "init", "copy_"])
def test_weights_written_into_the_model_after_construction_are_adopted(tmp_path, write):
    t = Twin(tmp_path, lr=1e-2, weight_decay=0.1)
    t.step()
    torch.manual_seed(5)
    if write == "load_state_dict":
        written = {i: torch.randn(p.shape).to(torch.bfloat16) for i, p in enumerate(t.params)}
        torch.nn.ParameterList(t.params).load_state_dict({str(i): v for i, v in written.items()})
    elif write == "init":
        torch.nn.init.constant_(t.params[1], 0.25)
        written = {1: torch.full_like(t.params[1], 0.25)}
    else:
        written = {3: torch.randn(t.params[3].shape).to(torch.bfloat16)}
        with torch.no_grad():
            t.params[3].copy_(written[3])
    with torch.no_grad():  # torch.optim's parameters are the weights themselves
        for i, v in written.items():
            t.ref[i].copy_(v.float())
    with pytest.warns(UserWarning, match=r"changed in the model since the last step .* taken as "
                                         r"the fp32 master weights") as said:
        t.step()
    assert said[0].filename.endswith("torch_twin.py")  # the caller of step(), not tierswap
    assert t.differing() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, and nothing adopted without a write
        t.step()
    assert t.differing() == []
    t.close()


def test_a_parameter_frozen_after_construction_is_left_alone(tmp_path):
    t = Twin(tmp_path, lr=1e-2, weight_decay=0.1)  # AdamW: a zero gradient would still decay it
    t.step()
    for p in (t.params[2], t.ref[2]):
        p.requires_grad_(False)
    frozen = t.params[2].detach().clone()
    state = t.opt.state_dict()["state"][2]
    for _ in range(2):
        t.step(which={0, 1, 3, 4})
    assert torch.equal(t.params[2], frozen)
    after = t.opt.state_dict()["state"][2]
    assert torch.equal(after["exp_avg"], state["exp_avg"])
    assert torch.equal(after["exp_avg_sq"], state["exp_avg_sq"])
    assert t.differing() == []
    t.close()


def _backward(t):
    """A real backward on both sides (hooks hand gradients over only from one), with gradients
    that bf16 holds exactly, so both sides get the same values."""
    for ps in (t.params, t.ref):
        torch.manual_seed(7)
        sum((p.float() * torch.randn(p.shape).to(torch.bfloat16).float()).sum() for p in ps
            ).backward()


@pytest.mark.parametrize("hooks", [False, True])
def test_a_step_without_any_gradient_does_nothing_and_says_so_once(tmp_path, hooks):
    t = Twin(tmp_path, lr=1e-2, weight_decay=0.1, tier=dict(hooks=hooks))
    _backward(t)
    t.opt.step()
    t.torch.step()
    t.opt.zero_grad()
    t.torch.zero_grad(set_to_none=True)  # torch 1.13's default is False (zeros: a decay step)
    before = [p.detach().clone() for p in t.params]
    with pytest.warns(UserWarning, match="no parameter has a gradient .* nothing was stepped"):
        t.opt.step()
    t.torch.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.opt.step()
    assert t.opt.step_count == 1
    assert all(torch.equal(a, p) for a, p in zip(before, t.params))
    assert t.differing() == []
    t.close()


def test_a_non_finite_gradient_without_a_loss_scaler_warns_naming_the_parameter(tmp_path):
    t = Twin(tmp_path, lr=1e-2)
    t.step()
    before = t.masters()
    t.grads()
    t.params[3].grad[1] = float("nan")
    with pytest.warns(UserWarning, match=r"step 2 skipped: the gradient of "
                                         r"param_groups\[0\]\['params'\]\[3\] \(shape \(4,\)\) is "
                                         r"not finite .* loss_scale='dynamic'"):
        t.opt.step()
    assert t.opt.last_step["skipped"] and t.opt.step_count == 1
    after = t.masters()
    assert all(torch.equal(before[i], after[i]) for i in before)
    t.close()


def test_torch_clipping_refuses_the_parameters_whose_gradients_hooks_handed_over(tmp_path):
    model = torch.nn.Linear(8, 4).to(torch.bfloat16)
    other = torch.nn.Linear(8, 4)
    opt = tt.AdamW(model.parameters(), swap_dir=str(tmp_path), telemetry=False, hooks=True)
    model(torch.randn(2, 8).to(torch.bfloat16)).float().sum().backward()
    with pytest.raises(RuntimeError, match=r"clip_grad_norm_ on parameters of a tierswap optimizer "
                                           r"built with hooks=True.*max_grad_norm"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with pytest.raises(RuntimeError, match="clip_grad_value_"):
        torch.nn.utils.clip_grad_value_(model.parameters(), 1.0)
    other(torch.randn(2, 8)).sum().backward()  # parameters of no tierswap optimizer: torch's
    norm = torch.nn.utils.clip_grad_norm_(other.parameters(), 1e-3)
    assert norm > 1e-3 and torch.cat([p.grad.flatten() for p in other.parameters()]).norm() < 1.1e-3
    opt.step()
    opt.close()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # closed: torch's again


def test_two_optimizers_over_the_same_parameters_are_named_at_construction(tmp_path):
    model = torch.nn.Linear(8, 4).to(torch.bfloat16)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = tt.AdamW(model.parameters(), swap_dir=str(tmp_path / "a"), telemetry=False)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\] \(shape \(4, 8\)\) "
                                         r"is already trained by another tierswap optimizer.*"
                                         r"close\(\) the other one first"):
        tt.SGD(model.parameters(), swap_dir=str(tmp_path / "b"), telemetry=False)
    model.weight.grad = torch.ones_like(model.weight)
    first.step()  # the first is unharmed
    first.close()
    second = tt.SGD(model.parameters(), lr=0.1, swap_dir=str(tmp_path / "b"), telemetry=False)
    second.close()


def test_strings_for_numbers_and_zero_budgets_are_refused(tmp_path):
    lin = torch.nn.Linear(4, 4).to(torch.bfloat16)
    kw = dict(swap_dir=str(tmp_path), telemetry=False)
    with pytest.raises(TypeError, match=r"lr='1e-3': expected a number, got a string"):
        tt.AdamW(lin.parameters(), lr="1e-3", **kw)
    with pytest.raises(TypeError, match=r"weight_decay='0.1'"):
        tt.SGD(lin.parameters(), weight_decay="0.1", **kw)
    for key in ("host_budget", "swap_capacity", "subgroup_size"):
        for zero in ("0", 0):
            with pytest.raises(ValueError, match=f"{key}.*0.*(must be > 0|expected a)"):
                tt.AdamW(lin.parameters(), **{key: zero}, **kw)
    opt = tt.AdamW(lin.parameters(), **kw)
    opt.param_groups[0]["lr"] = "3e-4"  # a scheduler's mistake, named at the step
    lin.weight.grad = torch.ones_like(lin.weight)
    with pytest.raises(TypeError, match="lr='3e-4'"):
        opt.step()
    opt.close()
