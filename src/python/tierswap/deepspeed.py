"""DeepSpeed config -> tierswap.torch keywords (migration).

    kind, kwargs = map_config("ds_config.json")       # or a dict
    opt = tierswap.torch.from_deepspeed_config(model.parameters(), "ds_config.json")

    python3 -m tierswap.deepspeed ds_config.json      # prints the mapping as JSON

Mapped: ``optimizer`` (type Adam/AdamW/SGD/Lion and their params; DeepSpeed's "Adam" is AdamW
unless ``adam_w_mode`` is false), ``zero_optimization.offload_optimizer`` (device nvme -> state on
NVMe under ``nvme_path``; cpu -> state in host memory), ``gradient_clipping``, ``bf16`` and ``fp16``
(``loss_scale`` 0 = dynamic, ``initial_scale_power``, ``loss_scale_window``). ``aio`` settings are
the engine's environment variables (named in the warning). Keys without an equivalent are named
in one warning; nothing is dropped silently.
"""

import json
import os
import sys
import warnings

_AIO_ENV = {"block_size": "TIERSWAP_BLOCK_SIZE", "queue_depth": "TIERSWAP_QUEUE_DEPTH",
            "thread_count": "TIERSWAP_POSIX_THREADS"}


def _load(config):
    if isinstance(config, dict):
        return config
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(f"a DeepSpeed config is a dict or a JSON file path, not {type(config).__name__}")
    with open(config, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{os.fspath(config)}: not valid JSON ({e})") from None


def _optimizer(opt, kw, ignored):
    kind_name = str(opt.get("type", "AdamW"))
    params = dict(opt.get("params", {}))
    kind = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd", "lion": "lion"}.get(kind_name.lower())
    if kind is None:
        raise ValueError(f"optimizer.type '{kind_name}': tierswap has Adam, AdamW, SGD and Lion")
    if kind_name.lower() == "adam" and params.pop("adam_w_mode", True) is False:
        kind = "adam"
    params.pop("adam_w_mode", None)
    for key in ("lr", "eps", "weight_decay", "momentum", "dampening", "nesterov", "amsgrad"):
        if key in params:
            kw[key] = params.pop(key)
    if "betas" in params:
        kw["betas"] = tuple(params.pop("betas"))
    ignored += [f"optimizer.params.{k}" for k in params]
    return kind


def _offload(zero, kw, ignored):
    off = dict(zero.get("offload_optimizer", {}))
    device = off.pop("device", "none")
    if device == "nvme":
        kw["state_tier"] = "nvme"
        if "nvme_path" in off:
            kw["swap_dir"] = off.pop("nvme_path")
    elif device == "cpu":
        kw["state_tier"] = "host"
    off.pop("nvme_path", None)
    off.pop("pin_memory", None)  # tierswap always pins, within host_budget
    if "buffer_count" in off and "buffer_size" in off:
        kw["host_budget"] = int(off.pop("buffer_count")) * int(float(off.pop("buffer_size"))) * 4
    ignored += [f"zero_optimization.offload_optimizer.{k}" for k in off]
    ignored += [f"zero_optimization.{k}" for k in zero if k not in ("offload_optimizer", "stage")]


def _precision(cfg, kw, ignored):
    if cfg.get("bf16", {}).get("enabled", False):
        kw["loss_scale"] = None
    fp16 = cfg.get("fp16", {})
    if not fp16.get("enabled", False):
        return
    scale = fp16.get("loss_scale", 0)
    if scale == 0:
        kw["loss_scale"] = "dynamic"
        kw["init_scale"] = float(2 ** fp16.get("initial_scale_power", 16))
        if "loss_scale_window" in fp16:
            kw["growth_interval"] = int(fp16["loss_scale_window"])
    else:
        kw["loss_scale"] = float(scale)
    for key in ("hysteresis", "min_loss_scale", "consecutive_hysteresis", "auto_cast"):
        if key in fp16:
            ignored.append(f"fp16.{key}")


def map_config(config):
    """Returns (kind, keyword arguments for tierswap.torch's class of that kind); warns once,
    naming every key that has no tierswap equivalent."""
    cfg = _load(config)
    kw, ignored = {}, []
    kind = _optimizer(cfg.get("optimizer", {}), kw, ignored)
    _offload(cfg.get("zero_optimization", {}), kw, ignored)
    if "gradient_clipping" in cfg:
        kw["max_grad_norm"] = float(cfg["gradient_clipping"])
    _precision(cfg, kw, ignored)
    aio = cfg.get("aio", {})
    env = [f"aio.{k} -> {_AIO_ENV[k]}" for k in aio if k in _AIO_ENV]
    ignored += [f"aio.{k}" for k in aio if k not in _AIO_ENV]
    known = {"optimizer", "zero_optimization", "gradient_clipping", "bf16", "fp16", "aio"}
    ignored += sorted(k for k in cfg if k not in known)
    if env:
        warnings.warn("DeepSpeed aio settings are the I/O engine's environment variables: "
                      + ", ".join(env), stacklevel=2)
    if ignored:
        warnings.warn("DeepSpeed keys without a tierswap equivalent (ignored): "
                      + ", ".join(ignored), stacklevel=2)
    return kind, kw


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python3 -m tierswap.deepspeed DS_CONFIG.json", file=sys.stderr)
        return 2
    try:
        kind, kw = map_config(argv[0])
    except (OSError, ValueError, TypeError) as e:
        print(f"tierswap config: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"optimizer": kind, "keywords": kw}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
