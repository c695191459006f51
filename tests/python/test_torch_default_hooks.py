"""The default hand-over (hooks=None) of parameters on a device (here the simulated device tier,
CPU tensors standing in for GPU memory): the first step hands gradients over at step() and
watches the loop; from the second on the hooks hand them over during the backward and the step
overlaps it, unless the loop reads p.grad to clip. Every case bit-identical to step-time
hand-over. CPU parameters keep step-time hand-over."""

import pytest
import torch

import tierswap.torch as tt


def model_of(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(),
                               torch.nn.Linear(300, 8)).to(torch.bfloat16)


def optimizer(model, path, **kw):
    path.mkdir()
    kw.setdefault("max_grad_norm", 0.0)  # (a clip that applies redoes an overlapped step)
    kw.setdefault("device_tier", "simulated")
    return tt.AdamW(model.parameters(), swap_dir=str(path), telemetry=False, lr=1e-2,
                    subgroup_size=8192, **kw)


def train(path, backwards, clip=None, by_hand=(), **kw):
    """Steps with backwards[i] backward passes at step i, no micro_batch (the plain loop).
    clip: "ours" (opt.clip_grad_norm_) or "torch's" (torch.nn.utils.clip_grad_norm_) at every
    step; by_hand: steps whose gradients are set as p.grad, not by a backward. Returns the masters
    and, per step, whether p.grad was there before step() and the sub-groups overlapped."""
    model = model_of()
    opt = optimizer(model, path, **kw)
    gen = torch.Generator().manual_seed(1)
    seen = []
    for step, n in enumerate(backwards):
        opt.zero_grad()
        for _ in range(n):
            x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
            if step in by_hand:
                for p in model.parameters():
                    g = torch.randn(p.shape, generator=gen).to(torch.bfloat16) / n
                    p.grad = g if p.grad is None else p.grad + g
            else:
                (model(x).float().pow(2).sum() / n).backward()
        had = all(p.grad is not None for p in model.parameters())
        if clip == "ours":
            opt.clip_grad_norm_(model.parameters(), 0.5)
        elif clip == "torch's":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        seen.append((had, opt.last_step["overlapped_subgroups"]))
    out = opt.state_dict()["master_params"], seen
    opt.close()
    return out


def same(a, b):
    assert a.keys() == b.keys()
    for i in a:
        assert torch.equal(a[i], b[i]), f"master {i}"


def test_the_default_hooks_from_the_second_step_and_guesses_the_last_backward(tmp_path):
    """Accumulation over 1, 2 or 3 backward passes, changing from step to step: the step after
    one with as many passes overlaps (its last pass guessed right); a wrong guess is redone at
    step(). Bit-identical to hooks=False throughout."""
    plan = [1, 1, 2, 2, 1, 3, 3, 1]
    ref, ref_seen = train(tmp_path / "ref", plan, hooks=False)
    got, seen = train(tmp_path / "default", plan)
    same(ref, got)
    assert [had for had, _ in ref_seen] == [True] * len(plan)
    assert [had for had, _ in seen] == [True] + [False] * (len(plan) - 1)  # handed over, freed
    guessed = [i for i, (_, n) in enumerate(seen) if n > 0]
    assert guessed == [1, 3, 6], seen  # as many passes as the step before (from the second)


@pytest.mark.parametrize("clip", ["ours", "torch's"])
def test_a_first_step_that_clips_through_p_grad_keeps_step_time_hand_over(tmp_path, clip):
    """The recipe's clipping reads p.grad between backward and step: seen in the first step, the
    default stays at step-time hand-over (p.grad there at every step), and clips as torch does."""
    plan = [1, 2, 1, 1]
    ref, _ = train(tmp_path / "ref", plan, clip=clip, hooks=False, max_grad_norm=0.0)
    got, seen = train(tmp_path / "default", plan, clip=clip, max_grad_norm=0.0)
    same(ref, got)
    assert all(had for had, _ in seen) and not any(n for _, n in seen)


def two_steps_and_a_backward(path):
    """An optimizer with the defaults after two steps of one backward pass each, and the third
    step's backward done: hooks on, that backward overlapped (as many passes as the step before)."""
    model = model_of()
    opt = optimizer(model, path)
    x = torch.randn(4, 64).to(torch.bfloat16)
    for i in range(3):
        if i:
            opt.step()
            opt.zero_grad()
        model(x).float().sum().backward()
    return model, opt


def test_clipping_through_p_grad_after_the_first_step_is_refused_saying_why(tmp_path):
    model, opt = two_steps_and_a_backward(tmp_path / "o")
    for clip in (torch.nn.utils.clip_grad_norm_, torch.nn.utils.clip_grad_value_):
        with pytest.raises(RuntimeError, match="on by default from the second step.*hooks=False"):
            clip(model.parameters(), 0.5)
    with pytest.raises(RuntimeError, match="on by default from the second step.*hooks=False"):
        opt.clip_grad_norm_(model.parameters(), 0.5)
    opt.close()


def test_gradients_set_by_hand_are_stepped_with_the_hooks_on(tmp_path):
    """p.grad assigned by the trainer (no backward, so no hook) is still taken at step()."""
    plan, by_hand = [1, 1, 1, 2, 1], (2, 3)
    ref, _ = train(tmp_path / "ref", plan, by_hand=by_hand, hooks=False)
    got, seen = train(tmp_path / "default", plan, by_hand=by_hand)
    same(ref, got)
    assert [had for had, _ in seen] == [True, False, True, True, False]


def test_explicit_choices_are_kept(tmp_path):
    """hooks=False: never; overlap=False: hooks without the overlapped step; overlap=True alone
    asks for the hooks from the first step."""
    plan = [1, 1, 1]
    _, off = train(tmp_path / "off", plan, hooks=False)
    _, no_overlap = train(tmp_path / "no-overlap", plan, overlap=False)
    _, overlap = train(tmp_path / "overlap", plan, overlap=True)
    assert all(had and not n for had, n in off)
    assert [had for had, _ in no_overlap] == [True, False, False]
    assert not any(n for _, n in no_overlap)
    assert not any(had for had, _ in overlap) and all(n for _, n in overlap)
    with pytest.raises(ValueError, match="needs the hooks"):
        optimizer(model_of(), tmp_path / "refused", hooks=False, overlap=True)


def test_a_step_that_clips_is_not_overlapped_the_next_time(tmp_path):
    """Clipping redoes what was stepped during the backward: after a step that clipped, the
    default steps the next one after its backward; after one that did not, during it."""
    big = [1, 1, 1, 1, 1]
    got, seen = train(tmp_path / "clipped", big, max_grad_norm=1e-6)  # clips at every step
    ref, _ = train(tmp_path / "ref", big, max_grad_norm=1e-6, hooks=False)
    same(ref, got)
    assert not any(n for _, n in seen)  # (the first step's backward: not overlapped either)
    _, seen = train(tmp_path / "unclipped", big, max_grad_norm=1e9)
    assert [bool(n) for _, n in seen] == [False, True, True, True, True]


def test_reading_the_state_between_an_overlapped_backward_and_its_step(tmp_path):
    """The trainer's own thread is told to read after step(); the state after it is torch's."""
    model, opt = two_steps_and_a_backward(tmp_path / "o")
    p = next(model.parameters())
    for read in (lambda: opt.state[p], opt.state_dict, lambda: opt.save(tmp_path / "ck")):
        with pytest.raises(RuntimeError, match="read it after step"):
            read()
    opt.step()
    assert opt.last_step["overlapped_subgroups"] > 0
    assert int(opt.state[p]["step"]) == 3 and opt.state_dict()["state"]
    opt.close()


def test_cpu_parameters_keep_step_time_hand_over(tmp_path):
    """On the CPU the backward and the step share the cores, and step() reads p.grad in place:
    the default leaves the hooks off there."""
    plan = [1, 2, 1, 1]
    ref, _ = train(tmp_path / "ref", plan, hooks=False, device_tier=None)
    got, seen = train(tmp_path / "default", plan, device_tier=None)
    same(ref, got)
    assert all(had for had, _ in seen) and not any(n for _, n in seen)
