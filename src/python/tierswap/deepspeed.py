"""DeepSpeed config -> tierswap.torch keywords (migration).

    kind, kwargs = map_config("ds_config.json")       # or a dict
    opt = tierswap.torch.from_deepspeed_config(model.parameters(), "ds_config.json")

    python3 -m tierswap.deepspeed ds_config.json      # prints the mapping as JSON

Mapped: ``optimizer`` (type Adam/AdamW/SGD/Lion and their params; DeepSpeed's "Adam" is AdamW
unless ``adam_w_mode`` is false), ``zero_optimization.offload_optimizer`` (device nvme -> state on
NVMe under ``nvme_path``; cpu -> state in host memory), ``gradient_clipping``, ``bf16`` and ``fp16``
(``loss_scale`` 0 = dynamic, ``initial_scale_power``, ``loss_scale_window``). ``aio`` settings are
the engine's environment variables (named in the warning). Keys without an equivalent are named
in one warning; nothing is dropped silently. A mapped key of the wrong type, or set to "auto" (a
value the Hugging Face Trainer fills in before DeepSpeed reads the file), is a ValueError naming
it.
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
            cfg = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{os.fspath(config)}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{os.fspath(config)}: a DeepSpeed config is a JSON object, not a "
                         f"{type(cfg).__name__}")
    return cfg


def _section(parent, key, where):
    """parent[key] as a dict ({} when absent), or a ValueError naming it."""
    v = parent.get(key, {})
    if not isinstance(v, dict):
        raise ValueError(f"{where}{key}: expected an object, got {json.dumps(v)}")
    return v


def _number(where, v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where}: expected a number, got {json.dumps(v)}")
    return v


def _boolean(where, v):
    if not isinstance(v, bool):
        raise ValueError(f"{where}: expected true or false, got {json.dumps(v)}")
    return v


def _integer(where, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{where}: expected a whole number in [{lo}, {hi}], got {json.dumps(v)}")
    return v


# The keys whose values tierswap reads; "auto" in one of them is a value the Hugging Face
# Trainer fills in before DeepSpeed sees the file, which tierswap, reading the file, cannot.
def _auto_keys(cfg):
    found = []
    opt = cfg.get("optimizer")
    if isinstance(opt, dict) and isinstance(opt.get("params"), dict):
        found += [f"optimizer.params.{k}" for k, v in opt["params"].items() if v == "auto"]
    if cfg.get("gradient_clipping") == "auto":
        found.append("gradient_clipping")
    for sec in ("fp16", "bf16"):
        if isinstance(cfg.get(sec), dict):
            found += [f"{sec}.{k}" for k, v in cfg[sec].items() if v == "auto"]
    zero = cfg.get("zero_optimization")
    off = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    if isinstance(off, dict):
        found += [f"zero_optimization.offload_optimizer.{k}" for k, v in off.items() if v == "auto"]
    return found


def _optimizer(cfg, kw, ignored):
    opt = _section(cfg, "optimizer", "")
    kind_name = str(opt.get("type", "AdamW"))
    params = dict(_section(opt, "params", "optimizer."))
    kind = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd", "lion": "lion"}.get(kind_name.lower())
    if kind is None:
        raise ValueError(f"optimizer.type '{kind_name}': tierswap has Adam, AdamW, SGD and Lion")
    if kind_name.lower() == "adam" and params.pop("adam_w_mode", True) is False:
        kind = "adam"
    params.pop("adam_w_mode", None)
    for key in ("lr", "eps", "weight_decay", "momentum", "dampening"):
        if key in params:
            kw[key] = _number(f"optimizer.params.{key}", params.pop(key))
    for key in ("nesterov", "amsgrad"):
        if key in params:
            kw[key] = _boolean(f"optimizer.params.{key}", params.pop(key))
    if "betas" in params:
        b = params.pop("betas")
        if not isinstance(b, (list, tuple)) or len(b) != 2:
            raise ValueError(f"optimizer.params.betas: expected two numbers, got {json.dumps(b)}")
        kw["betas"] = tuple(_number(f"optimizer.params.betas[{i}]", x) for i, x in enumerate(b))
    ignored += [f"optimizer.params.{k}" for k in params]
    return kind


def _offload(cfg, kw, ignored):
    zero = _section(cfg, "zero_optimization", "")
    off = dict(_section(zero, "offload_optimizer", "zero_optimization."))
    where = "zero_optimization.offload_optimizer."
    device = off.pop("device", "none")
    if device not in ("nvme", "cpu", "none", None):  # DeepSpeed's values (null: none)
        raise ValueError(f"{where}device: expected \"nvme\", \"cpu\" or \"none\", got "
                         f"{json.dumps(device)}")
    if device == "nvme":
        kw["state_tier"] = "nvme"
        if "nvme_path" in off:
            path = off.pop("nvme_path")
            if not isinstance(path, str) or not path:
                raise ValueError(f"{where}nvme_path: expected a directory path, got "
                                 f"{json.dumps(path)}")
            kw["swap_dir"] = path
    elif device == "cpu":
        kw["state_tier"] = "host"
    off.pop("nvme_path", None)
    off.pop("pin_memory", None)  # tierswap always pins, within host_budget
    if "buffer_count" in off and "buffer_size" in off:
        count = _integer(where + "buffer_count", off.pop("buffer_count"), 1, 1 << 20)
        size = _number(where + "buffer_size", off.pop("buffer_size"))
        if not size > 0:
            raise ValueError(f"{where}buffer_size: expected a positive number, got {size}")
        kw["host_budget"] = count * int(size) * 4
    ignored += [f"zero_optimization.offload_optimizer.{k}" for k in off]
    ignored += [f"zero_optimization.{k}" for k in zero if k not in ("offload_optimizer", "stage")]


def _precision(cfg, kw, ignored):
    bf16, fp16 = _section(cfg, "bf16", ""), _section(cfg, "fp16", "")
    bf16_on = _boolean("bf16.enabled", bf16.get("enabled", False))
    fp16_on = _boolean("fp16.enabled", fp16.get("enabled", False))
    if bf16_on and fp16_on:
        raise ValueError("bf16.enabled and fp16.enabled are both true: enable one")
    if bf16_on:
        kw["loss_scale"] = None
    if not fp16_on:
        return
    scale = _number("fp16.loss_scale", fp16.get("loss_scale", 0))
    if scale == 0:
        kw["loss_scale"] = "dynamic"
        power = _integer("fp16.initial_scale_power", fp16.get("initial_scale_power", 16), 0, 127)
        kw["init_scale"] = float(2 ** power)
        if "loss_scale_window" in fp16:
            kw["growth_interval"] = _integer("fp16.loss_scale_window", fp16["loss_scale_window"],
                                             1, 1 << 31)
    else:
        kw["loss_scale"] = float(scale)
    for key in ("hysteresis", "min_loss_scale", "consecutive_hysteresis", "auto_cast"):
        if key in fp16:
            ignored.append(f"fp16.{key}")


def map_config(config):
    """Returns (kind, keyword arguments for tierswap.torch's class of that kind); warns once,
    naming every key that has no tierswap equivalent."""
    cfg = _load(config)
    auto = _auto_keys(cfg)
    if auto:
        raise ValueError(f"{', '.join(auto)}: \"auto\" is a value the Hugging Face Trainer fills "
                         "in before DeepSpeed reads the file; tierswap reads the file as it is: "
                         "give the numbers")
    kw, ignored = {}, []
    kind = _optimizer(cfg, kw, ignored)
    _offload(cfg, kw, ignored)
    if "gradient_clipping" in cfg:
        kw["max_grad_norm"] = float(_number("gradient_clipping", cfg["gradient_clipping"]))
    _precision(cfg, kw, ignored)
    aio = _section(cfg, "aio", "")
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
