"""Averaging the weights of several checkpoints of one run (for example its last epochs, kept with
`trainer.keep_last`): the mean of each tensor, element by element. Late epochs of a run sit around a minimum
of the loss; their mean often sits closer to it than any one of them (timm's avg_checkpoints.py, and the
weight averaging of SWA, do the same).

The result is a checkpoint of this trainer without optimizer state: vit-eval, vit-export and
`model.pretrained=<file>` read it like any other; `trainer.resume` refuses it (nothing to continue)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from vit.weights.read import CheckpointError, load_checkpoint

WEIGHT_CHOICES = ("auto", "ema", "raw")


def chosen_weights(state: dict, path: Path, which: str) -> dict[str, torch.Tensor]:
    if which == "raw":
        return state["model"]
    ema = state.get("ema")
    if not ema:
        raise CheckpointError(f"checkpoint {str(path)!r} holds no EMA weights: average the raw ones with ema=false")
    return ema


def average_checkpoints(paths: Sequence[Path], which: str = "auto") -> dict:
    """The averaged checkpoint of `paths` (at least one), read one at a time. `which`: ema, raw, or auto (the EMA
    weights when the first file holds them, else the raw ones: vit/deploy/loaded_model.py's EMA_RULE, which vit-average
    gives as ema=true|false|auto). Every file must hold the same tensors (names,
    shapes, dtypes) and the same classes; tensors that are not floating point must be equal in all of them."""
    if which not in WEIGHT_CHOICES:
        raise CheckpointError(f"weights={which!r} must be one of {WEIGHT_CHOICES}")
    if not paths:
        raise CheckpointError("no checkpoints to average")
    paths = [Path(path) for path in paths]
    first = load_checkpoint(paths[0])
    if which == "auto":
        which = "ema" if first.get("ema") else "raw"
    reference = chosen_weights(first, paths[0], which)
    sums = {name: tensor.double() if tensor.is_floating_point() else tensor for name, tensor in reference.items()}
    last = first
    for path in paths[1:]:
        last = load_checkpoint(path)
        check_same_run(first, paths[0], last, path)
        weights = chosen_weights(last, path, which)
        check_same_tensors(reference, paths[0], weights, path)
        for name, tensor in weights.items():
            if tensor.is_floating_point():
                sums[name] += tensor.double()
            elif not torch.equal(tensor, sums[name]):
                raise CheckpointError(f"{name} differs between {str(paths[0])!r} and {str(path)!r}: not averaged")
    averaged = {
        name: (total / len(paths)).to(reference[name].dtype) if reference[name].is_floating_point() else total
        for name, total in sums.items()
    }
    return {
        "model": averaged,
        "ema": None,
        "optimizer": None,  # a checkpoint of this trainer, but nothing to resume
        "scheduler": None,
        "config": first.get("config"),
        "class_to_idx": first.get("class_to_idx"),
        "epoch": last.get("epoch"),
        "step": last.get("step"),
        "history": last.get("history", []),
        "averaged_from": {"files": [str(p) for p in paths], "weights": which},
    }


def check_same_run(first: dict, first_path: Path, other: dict, path: Path) -> None:
    model, other_model = (first.get("config") or {}).get("model"), (other.get("config") or {}).get("model")
    if model and other_model and model.get("name") != other_model.get("name"):
        raise CheckpointError(
            f"{str(path)!r} is a {other_model.get('name')}, {str(first_path)!r} a {model.get('name')}: "
            "only checkpoints of one model can be averaged"
        )
    if (first.get("class_to_idx") or None) != (other.get("class_to_idx") or None):
        raise CheckpointError(f"{str(path)!r} was trained on other classes than {str(first_path)!r}")


def check_same_tensors(reference: dict, first_path: Path, weights: dict, path: Path) -> None:
    if weights.keys() != reference.keys():
        extra = sorted(weights.keys() ^ reference.keys())[:3]
        raise CheckpointError(f"{str(path)!r} and {str(first_path)!r} hold different tensors (e.g. {extra})")
    for name, tensor in weights.items():
        if tensor.shape != reference[name].shape or tensor.dtype != reference[name].dtype:
            raise CheckpointError(
                f"{name} is {tuple(tensor.shape)} {tensor.dtype} in {str(path)!r} but "
                f"{tuple(reference[name].shape)} {reference[name].dtype} in {str(first_path)!r}"
            )
