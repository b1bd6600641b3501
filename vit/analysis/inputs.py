"""What the analysis scripts read: checkpoints (model + config + classes) and images. Their `key=value`
arguments and `--help` are vit/cli/args.py's."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn

from vit.errors import UsageError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def load_model(checkpoint: str | Path, use_ema: bool = False) -> tuple[nn.Module, dict, dict[str, int]]:
    """Model (eval mode, fp32), resolved config and class map of a trainer checkpoint; of a task=mae run, its
    masked autoencoder (vit/models/mae.py). `use_ema`: its EMA weights, which it must hold."""
    from vit.tasks import task_of
    from vit.weights.fit import PretrainedError
    from vit.weights.read import CheckpointError, read_weights

    try:
        weights = read_weights(checkpoint, ema=use_ema)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {str(checkpoint)!r} does not exist") from None
    except PretrainedError as err:
        raise CheckpointError(str(err)) from None
    config = weights.config
    if config is None or "model" not in config:
        raise CheckpointError(f"checkpoint {str(checkpoint)!r} holds no model config: not a checkpoint of this trainer")
    classes = weights.class_to_idx or {}
    model = task_of(config).build_model(OmegaConf.create(config), num_classes=len(classes) or None)
    model.load_state_dict({k: v.float() for k, v in weights.state_dict.items()})
    return model.eval(), config, classes


def image_paths(spec: str | Path) -> list[Path]:
    path = Path(spec)
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        if found:
            return found
        raise UsageError(f"image={str(spec)!r}: no images ({', '.join(IMAGE_SUFFIXES)}) in that folder")
    raise UsageError(f"image={str(spec)!r} does not exist")


def load_images(spec: str | Path, config: dict, limit: int | None = None) -> tuple[list[Path], torch.Tensor]:
    """Images as the model's validation transform makes them: (B, 3, H, W), normalised."""
    from vit.data.augment.transforms import val_transform
    from vit.data.images import read_rgb

    paths = image_paths(spec)[:limit]
    transform = val_transform(config["data"])
    return paths, torch.stack([transform(read_rgb(p)) for p in paths])


def denormalise(images: torch.Tensor, config: dict) -> torch.Tensor:
    from vit.data.sources.registry import mean_std

    mean, std = mean_std(config["data"])
    return (images * torch.tensor(std).view(1, 3, 1, 1) + torch.tensor(mean).view(1, 3, 1, 1)).clamp(0, 1)
