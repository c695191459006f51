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


def _unfreezing_run(params, swap_dir, **kw):
    """Two steps of the first three parameters, then the last two added as a group of their
    own (progressive unfreezing), two more steps; the gradients come from `gen`."""
    gen = torch.Generator().manual_seed(5)
    opt = tt.AdamW(params[:3], lr=1e-2, swap_dir=str(swap_dir), telemetry=False, **kw)
    for k in range(4):
        if k == 2:
            opt.add_param_group({"params": params[3:], "lr": 3e-3})
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
        opt.step()
    return opt


def _same_state(a, b):
    assert a["state"].keys() == b["state"].keys()
    for i, st in a["state"].items():
        assert st.keys() == b["state"][i].keys()
        assert all(torch.equal(v, b["state"][i][k]) for k, v in st.items()), i
    assert all(torch.equal(v, b["master_params"][i]) for i, v in a["master_params"].items())


def test_a_group_added_between_steps_is_in_resume_and_state_dicts(tmp_path):
    params = [torch.nn.Parameter(torch.randn(s).to(torch.bfloat16)) for s in ((9, 4), (9,), (5,),
                                                                              (300, 7), (7,))]
    (tmp_path / "run").mkdir()
    (tmp_path / "load").mkdir()
    opt = _unfreezing_run(params, tmp_path / "run", keep_swap_files=True, swap_capacity="64MiB")
    sd = opt.state_dict()
    assert [float(sd["state"][i]["step"]) for i in (0, 3)] == [4.0, 2.0]
    assert sd["param_groups"][1]["lr"] == 3e-3
    opt.close()
    # kill -9 and resume: the run passes every group, the added one too, to the constructor
    resumed = tt.AdamW([{"params": params[:3]}, {"params": params[3:], "lr": 3e-3}], lr=1e-2,
                       swap_dir=str(tmp_path / "run"), resume=True, telemetry=False)
    assert resumed.resumed
    _same_state(resumed.state_dict(), sd)
    # torch's way: the same add_param_group, then load_state_dict
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    loaded = tt.AdamW(twins[:3], lr=1e-2, swap_dir=str(tmp_path / "load"), telemetry=False)
    loaded.add_param_group({"params": twins[3:], "lr": 3e-3})
    loaded.load_state_dict(sd)
    _same_state(loaded.state_dict(), sd)
    for p, q in zip(params, twins):
        p.grad = torch.full(p.shape, 0.5, dtype=torch.bfloat16)
        q.grad = p.grad.clone()
    resumed.step()
    loaded.step()
    _same_state(loaded.state_dict(), resumed.state_dict())
    assert all(torch.equal(p, q) for p, q in zip(params, twins))
    resumed.close()
    loaded.close()


def test_a_group_the_swap_space_cannot_hold_is_refused_naming_swap_capacity(tmp_path):
    small = [torch.nn.Parameter(torch.randn(64).to(torch.bfloat16))]
    big = torch.nn.Parameter(torch.randn(4096, 1024).to(torch.bfloat16))  # 48 MiB of state
    opt = tt.AdamW(small, swap_dir=str(tmp_path), telemetry=False)  # sized for 64 elements
    with pytest.raises(ValueError, match="no room for the new group.*swap_capacity"):
        opt.add_param_group({"params": [big]})
    assert len(opt.param_groups) == 1
    big.grad = torch.ones_like(big)  # not the optimizer's: ignored, as torch ignores it
    small[0].grad = torch.ones_like(small[0])
    opt.step()
    assert getattr(big, "_tierswap_owner", None) is None
    later = torch.nn.Parameter(torch.randn(100).to(torch.bfloat16))
    opt.add_param_group({"params": [later]})  # one that fits
    later.grad = torch.ones_like(later)
    opt.step()
    assert opt.state[later]["step"] == 1 and opt.state[small[0]]["step"] == 2
    opt.close()
