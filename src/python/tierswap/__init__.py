"""tierswap: an NVMe-tiered memory manager and sharded optimizer for large-model training.

Use it from PyTorch through :mod:`tierswap.torch` (``tierswap.torch.AdamW`` and friends); the
native layer is ``tierswap._tierswap``.
"""

from . import _tierswap  # noqa: F401  (fails early with the loader's message when not built)

__all__ = ["torch", "deepspeed"]
__version__ = "0.1.0"


def parse_size(text):
    """'8GiB', '512M', '1e9' or an int -> bytes (the CLI's size grammar)."""
    if isinstance(text, bool):
        raise TypeError("a size must be an int or a string such as '8GiB', not a bool")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size must be >= 0, not {text}")
        return text
    if not isinstance(text, str):
        raise TypeError(f"a size must be an int or a string such as '8GiB', not {type(text).__name__}")
    return _tierswap.parse_size(text)
