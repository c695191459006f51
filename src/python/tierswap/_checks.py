"""Checks of what a user hands tierswap.torch (options, parameter groups, state dicts), each
error naming what was wrong, and how the ranks agree on their outcome before a collective."""

from collections.abc import Mapping

import torch


def not_owned(p, where):
    """A parameter whose storage another live tierswap optimizer's step writes (its 16-bit copy):
    a second optimizer would move it to its own and the first would stop reaching it."""
    ref = getattr(p, "_tierswap_owner", None)
    other = ref() if ref is not None else None
    if other is not None and other._closer.alive:
        raise ValueError(f"{where} is already trained by another tierswap optimizer, whose step "
                         "writes its new values into the parameter's storage: a parameter can "
                         "belong to one tierswap optimizer at a time. Give each optimizer its own "
                         "parameters (param groups of one optimizer for different settings), or "
                         "close() the other one first")


def listed_params(param_group, gi):
    """param_group['params'] made a list in place, as torch.optim's add_param_group does: a
    generator (model.parameters()) or any other iterable is read once, here, so that the group
    holds its parameters (read twice, a generator gives nothing the second time)."""
    if not isinstance(param_group, Mapping):
        raise TypeError(f"param group {gi} is {type(param_group).__name__}: a dict with 'params'")
    if "params" not in param_group:
        raise ValueError(f"param group {gi} has no 'params'")
    params = param_group["params"]
    if isinstance(params, torch.Tensor):
        param_group["params"] = [params]
    elif not isinstance(params, set):  # torch refuses a set (its order is not stable)
        param_group["params"] = list(params)
    params = param_group["params"]
    if isinstance(params, list) and len({id(p) for p in params}) != len(params):
        raise ValueError(f"param group {gi} holds a parameter twice")


def number(name, value):
    """float(value) of a real number (a Python or numpy number, a one-element tensor); a string
    is a TypeError as in torch.optim ('1e-3' is not 1e-3), anything else a ValueError, each
    naming the option."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name}={value!r}: expected a number, got a string (write {name}="
                        f"{value.strip() if isinstance(value, str) else value!r} without quotes)")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{name}={value!r}: expected a number") from None


def threads(value):
    """The kernel threads (0: all), or a ValueError naming the option."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"threads={value!r}: a whole number >= 1 (or None: all)")
    return value


def pair(name, value):
    """A (b1, b2) pair of numbers, or a ValueError naming the option."""
    try:
        a, b = value
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: expected a pair of numbers") from None
    return number(f"{name}[0]", a), number(f"{name}[1]", b)


def num(group, key):
    return number(key, group[key])


def optimizer_state_dict(sd):
    """An optimizer's state dict has 'state' (a mapping) and 'param_groups' (a list): anything
    else (a model's state dict, a whole checkpoint) is named before it is read."""
    if not isinstance(sd, Mapping):
        raise TypeError(f"load_state_dict: expected an optimizer state dict (a dict), got "
                        f"{type(sd).__name__}")
    for key, kind, name in (("state", Mapping, "a dict"), ("param_groups", (list, tuple),
                                                             "a list")):
        if key not in sd:
            keys = ", ".join(repr(k) for k in list(sd)[:5]) + (", ..." if len(sd) > 5 else "")
            hint = (": the checkpoint's 'optimizer' entry?" if "optimizer" in sd else
                    ": a model's state dict?" if any(isinstance(v, torch.Tensor)
                                                     for v in sd.values()) else "")
            raise ValueError(f"load_state_dict: not an optimizer state dict: no {key!r} "
                             f"(its keys: {keys or 'none'}){hint}")
        if not isinstance(sd[key], kind):
            raise TypeError(f"load_state_dict: state dict's {key!r} is "
                            f"{type(sd[key]).__name__}, expected {name}")


def step_count(value, saved):
    """A state dict's 'step' (torch keeps a float tensor) as the count it must be."""
    try:
        f = float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several values
        f = float("nan")
    if not (0 <= f < 2 ** 63 and f == int(f)):  # nan and inf fail the range first
        raise ValueError(f"state 'step' of parameter {saved}: {value!r} is not a step count "
                         "(a whole number >= 0)")
    return int(f)


def choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: one of {', '.join(allowed)}")
    return value


def positive(value, name, parse):
    """A size or count the native side reads with 0 as "the default": None gives that default,
    and an explicit 0 (or "0") is refused instead of silently becoming it."""
    if value is None:
        return 0
    v = parse(value, name)
    if v <= 0:
        raise ValueError(f"{name}={value!r}: must be > 0 (leave it out, or None, for the default)")
    return v


def nonneg(name, value):
    v = number(name, value)
    if not v >= 0:
        raise ValueError(f"{name}={value!r}: must be >= 0")
    return v


def scaler(loss_scale, init_scale, growth_factor, backoff_factor, growth_interval):
    if loss_scale is None:
        return {"mode": "none"}
    base = {"growth_factor": number("growth_factor", growth_factor),
            "backoff_factor": number("backoff_factor", backoff_factor),
            "growth_interval": int(number("growth_interval", growth_interval))}
    if loss_scale == "dynamic":
        return dict(base, mode="dynamic", init_scale=number("init_scale", init_scale))
    if isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
        return dict(base, mode="fixed", init_scale=float(loss_scale))
    raise ValueError(f"loss_scale={loss_scale!r}: None, 'dynamic' or a number")


def agree_on(problem, world, any_rank, message):
    """Raises `problem` (this rank's exception, or None) and, at world size > 1, on every rank
    when any rank has one (the others: RuntimeError(message)); `any_rank(flag)` is the collective
    that tells. Before a collective that a rank refusing would leave waiting."""
    if world > 1 and any_rank(problem is not None) and problem is None:
        raise RuntimeError(message)
    if problem is not None:
        raise problem
