"""torch's gradient clipping refused where tierswap's hooks have already taken p.grad away."""

import functools
import weakref

import torch

HOOKED = weakref.WeakSet()  # optimizers with hooks=True: their parameters' p.grad is freed


def guard_torch_clipping(opt):
    """torch.nn.utils.clip_grad_norm_ and clip_grad_value_ refuse the parameters of an optimizer
    whose hooks are on (hooks=True, or the default after its first step): the hooks hand each
    gradient over and free p.grad during the backward, so torch's clipping would find none,
    return 0 and clip nothing. Installed with the first such
    optimizer (a name imported from torch.nn.utils before then keeps torch's function)."""
    HOOKED.add(opt)
    for module in (torch.nn.utils, torch.nn.utils.clip_grad):
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            fn = getattr(module, name, None)
            if fn is not None and not hasattr(fn, "_tierswap_original"):
                setattr(module, name, _refusing_hooked(fn, name))


def _refusing_hooked(original, name):
    @functools.wraps(original)
    def guarded(parameters, *args, **kwargs):
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        for opt in list(HOOKED):
            if not opt._closer.alive or not any(id(p) in opt._nid_of for p in parameters):
                continue
            if not opt._hooks:  # the default mode's first step: it stays at step-time hand-over
                opt._reads_grads = True
                continue
            how = ("with hooks (on by default from the second step, as the first did not clip "
                   "this way)" if opt._auto else "built with hooks=True")
            raise RuntimeError(
                f"torch.nn.utils.{name} on parameters of a tierswap optimizer {how}: their "
                "gradients were handed over to tierswap during the backward and p.grad freed, "
                "so torch would clip nothing. Clip inside the step with max_grad_norm=... (the "
                "same norm at any world size), or build the optimizer with hooks=False and call "
                "opt.clip_grad_norm_(params, max_norm) where the recipe clips")
        return original(parameters, *args, **kwargs)
    guarded._tierswap_original = original
    return guarded
