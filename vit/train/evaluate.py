"""Evaluate a checkpoint on the validation split: top-1, top-5, loss and per-class accuracy as JSON.

The split is the run's own: the slice it held out of the training set when it trained with data.holdout
(`data.holdout=null` evaluates its test split instead); the JSON's "split" names it.

    python scripts/evaluate.py checkpoint=outputs/.../checkpoints/best.pt [data.root=...] [ema=true]
        [confusion=confusion.png] [batch_size=256] [device=auto] [flip=true] [amp=auto|bf16|fp16|none]

`amp` defaults to the run's own trainer.amp, decided for this device by the trainer's rule
(vit/train/precision.py).

The data settings are the checkpoint's own; `data.<key>=value` overrides any of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from vit.data import DataError, build_data
from vit.train.checkpoint import CheckpointError, load_checkpoint, no_ema_message
from vit.train.config import ConfigError, build_model_from_config, resolve_device
from vit.train.loop import evaluate
from vit.train.precision import AMP_MODES, announce, choose_precision

KNOWN_KEYS = ("checkpoint", "ema", "confusion", "batch_size", "device", "limit_batches", "flip", "amp")
TRUE = ("1", "true", "yes")


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    options, data_overrides = {}, []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ConfigError(f"argument {arg!r} must look like key=value")
        if key.startswith("data."):
            data_overrides.append(arg[len("data.") :])
        elif key in KNOWN_KEYS:
            options[key] = value
        else:
            raise ConfigError(f"unknown argument {key!r}; known: {', '.join(KNOWN_KEYS)}, data.<key>")
    if "checkpoint" not in options:
        raise ConfigError("checkpoint=<path> is required")
    if options.get("amp", "auto") not in AMP_MODES:
        raise ConfigError(f"amp={options['amp']!r} must be one of {AMP_MODES}")
    return options, data_overrides


def evaluate_checkpoint(argv: list[str]) -> dict:
    options, data_overrides = parse(argv)
    state = load_checkpoint(options["checkpoint"])
    config = OmegaConf.create(state.get("config") or {})
    if "model" not in config or "data" not in config:
        raise CheckpointError(f"checkpoint {options['checkpoint']!r} holds no model/data config")
    data_cfg = OmegaConf.merge(config.data, OmegaConf.from_dotlist(data_overrides))
    if not any(o.startswith("num_workers=") for o in data_overrides):
        data_cfg.num_workers = None  # this machine's default, not the training machine's worker count
    if "batch_size" in options:
        data_cfg.batch_size = int(options["batch_size"])
    device = resolve_device(options.get("device", "auto"))
    use_ema = options.get("ema", "false").lower() in TRUE
    weights = state.get("ema") if use_ema else state["model"]
    if weights is None:
        raise CheckpointError(no_ema_message(state, options["checkpoint"]))
    model = build_model_from_config(config.model, num_classes=len(state.get("class_to_idx") or {}) or None)
    model.load_state_dict(weights)
    model.to(device)
    bundle = build_data(data_cfg, device=device)
    if bundle.class_to_idx != state.get("class_to_idx", bundle.class_to_idx):
        raise DataError("the validation data's classes differ from the checkpoint's class map")
    precision = choose_precision(options.get("amp") or config.get("trainer", {}).get("amp", "auto"), device, model)
    announce(precision)
    amp = precision.dtype
    limit = int(options["limit_batches"]) if "limit_batches" in options else None
    flip = options.get("flip", "false").lower() in TRUE
    result = evaluate(model, bundle.val_loader, device, amp, limit, num_classes=bundle.num_classes, flip=flip)
    confusion = result.pop("confusion")
    names = sorted(bundle.class_to_idx, key=bundle.class_to_idx.get)
    per_class = (confusion.diag().float() / confusion.sum(1).clamp_min(1).float() * 100).tolist()
    seen = (confusion.sum(1) > 0).tolist()  # a class with no image evaluated has no accuracy, not 0%
    result["per_class_top1"] = {
        name: round(acc, 2) for name, acc, has in zip(names, per_class, seen, strict=True) if has
    }
    result["split"] = bundle.val_name  # "holdout" (data.holdout) or the validation split's own name
    result["weights"] = "ema" if use_ema else "model"
    result["flip"] = flip
    result["precision"] = precision.name
    result["checkpoint"] = str(options["checkpoint"])
    if options.get("confusion"):
        from vit.train.figures import confusion_matrix_figure

        confusion_matrix_figure(confusion.numpy(), names, Path(options["confusion"]))
        result["confusion_png"] = options["confusion"]
    return result


def main(argv: list[str]) -> int:
    try:
        result = evaluate_checkpoint(argv)
    except (ConfigError, DataError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0
