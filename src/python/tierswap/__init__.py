"""tierswap: an NVMe-tiered memory manager and sharded optimizer for large-model training.

Use it from PyTorch through :mod:`tierswap.torch` (``tierswap.torch.AdamW`` and friends); the
native layer is ``tierswap._tierswap``.
"""

from . import _tierswap  # noqa: F401  (fails early with the loader's message when not built)

__all__ = ["torch", "deepspeed"]
__version__ = "0.1.0"


def _parse(text, what, example, native):
    """An int (>= 0) as it is, a string through the native parser; anything else a TypeError.
    Errors name `what` (the option's name, or "size" / "count")."""
    if isinstance(text, bool):
        raise TypeError(f"{what}: an int or a string such as '{example}', not a bool")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"{what}={text}: must be >= 0")
        return text
    if not isinstance(text, str):
        raise TypeError(f"{what}={text!r}: an int or a string such as '{example}', "
                        f"not {type(text).__name__}")
    return native(text, what)


def parse_size(text, what="size"):
    """'8GiB', '512M', '1e9' or an int -> bytes (the CLI's size grammar); errors name `what`."""
    return _parse(text, what, "8GiB", _tierswap.parse_size)


def parse_count(text, what="count"):
    """'64M', '1.5B', '7e9' or an int -> a count, decimal as model sizes are named (the CLI's
    --params grammar: K, M, B or G, T); errors name `what`."""
    return _parse(text, what, "64M", _tierswap.parse_count)
