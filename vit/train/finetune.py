"""Fine-tuning: a run that starts from pretrained weights (`model.pretrained`), optionally with a frozen backbone
(`model.freeze`). Layer-wise learning-rate decay (`optim.layer_decay`) lives with the optimizer
(vit/train/optimizer.py).

Order inside a run (vit/train/run.py): the weights are read and checked against the configured model before any
data is read (a bad source stops the run with exit code 2); they are loaded into the model built for the data's
class count; then the freeze is applied and the optimizer sees only the parameters that train. A resumed run
(`trainer.resume`) skips all of it: its own checkpoint holds the fine-tuned weights.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import replace

from torch import nn

from vit.weights.fit import PretrainedError, Weights, fit_state_dict
from vit.weights.read import CheckpointError, read_weights, source_forms, source_kind, source_name

log = logging.getLogger("vit.train")

# none: every parameter trains; backbone: a linear probe, only the classifier `head` trains (the final norm,
# the position table and the cls token stay frozen with the blocks, so the features are exactly the source's).
FREEZE_MODES = ("none", "backbone")
TRAINABLE_WITH_FROZEN_BACKBONE = ("head.",)


def read_pretrained(model_cfg: Mapping, model: nn.Module) -> Weights | None:
    """`model.pretrained`'s weights, checked against `model` (architecture, then every key and shape after the
    position table, patch kernel and classifier are adapted); None without a source. Any problem is a
    CheckpointError naming the setting: the trainer prints it in one line and exits with code 2."""
    source, file = model_cfg.get("pretrained"), model_cfg.get("pretrained_file")
    if file and not (source and source_kind(str(source)) == "timm"):
        raise CheckpointError(
            f"model.pretrained_file={str(file)!r} gives the weights of a model.pretrained=timm:<name> architecture, "
            f"and model.pretrained is {source!r}; a file of another kind goes in model.pretrained itself"
        )
    if not source:
        return None
    setting = f"model.pretrained={str(source)!r}" + (f" model.pretrained_file={str(file)!r}" if file else "")
    instead = f"model.pretrained_file=/path/to/{source_name(str(source))}.safetensors"
    try:
        # model.pretrained_ema=true: the EMA weights where the source holds them, else its raw ones
        ema = None if model_cfg.get("pretrained_ema", True) else False
        weights = read_weights(str(source), ema=ema, instead=instead, file=file or None)
        with quiet(logging.getLogger("vit.weights.fit")):  # what is adapted is said once, at the load
            fit_state_dict(weights, model)
    except FileNotFoundError:
        if file:
            raise CheckpointError(f"{setting}: no such file") from None
        raise CheckpointError(f"{setting}: no such file (give {source_forms()})") from None
    except PretrainedError as err:
        raise CheckpointError(f"{setting}: {err}") from None
    return weights


@contextlib.contextmanager
def quiet(logger: logging.Logger) -> Iterator[None]:
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_pretrained_weights(model: nn.Module, weights: Weights, class_to_idx: Mapping | None = None) -> None:
    """Load checked weights into the model the run trains (built for the data's class count). A checkpoint of
    this trainer whose classes are not the data's (`class_to_idx`) gets a fresh classifier even where the count
    is the same: its head would map the new images to the old classes."""
    if weights.class_to_idx and class_to_idx and dict(weights.class_to_idx) != dict(class_to_idx):
        weights = replace(weights, reset_head=True)
    try:
        state_dict = fit_state_dict(weights, model)
    except PretrainedError as err:
        raise CheckpointError(f"model.pretrained={weights.where!r}: {err}") from None
    model.load_state_dict(state_dict, strict=True)
    which = f", {weights.which}" if weights.which else ""
    log.info("model.pretrained: started from %s%s (%d tensors)", weights.where, which, len(state_dict))


def freeze(model: nn.Module, mode: str | None) -> tuple[int, int]:
    """Switch off the gradients `model.freeze` names; returns (trainable, total) parameter counts. Fixed
    tables (a sinusoid position embedding) stay frozen whatever the mode."""
    mode = mode or "none"
    if mode not in FREEZE_MODES:
        raise ValueError(f"model.freeze={mode!r} must be one of {FREEZE_MODES}")
    if mode == "backbone":
        for name, param in model.named_parameters():
            param.requires_grad_(name.startswith(TRAINABLE_WITH_FROZEN_BACKBONE))
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("training %s of %s parameters (model.freeze=%s)", f"{trainable:,}", f"{total:,}", mode)
    return trainable, total
