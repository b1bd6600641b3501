"""The evaluation preprocessing of a set of weights: resize the shorter side, centre-crop, scale to [0, 1],
normalise. Written out as plain numbers (the side JSON of an export holds them) so that it can be rebuilt
anywhere: from a data config (the trainer's validation transform) or from timm's pretrained config of a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch
from torchvision import transforms as T

from vit.errors import UsageError

INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


@dataclass(frozen=True)
class Preprocessing:
    img_size: int  # side of the square centre crop the model sees
    resize: int  # the shorter side is resized to this before the crop
    interpolation: str  # one of INTERPOLATIONS
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    origin: str  # where these numbers come from, for reports

    def __post_init__(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation={self.interpolation!r} must be one of {INTERPOLATIONS}")

    def transform(self) -> T.Compose:
        """PIL image -> normalised float tensor (3, img_size, img_size)."""
        return T.Compose(
            [
                T.Resize(self.resize, interpolation=T.InterpolationMode(self.interpolation), antialias=True),
                T.CenterCrop(self.img_size),
                T.PILToTensor(),
                T.ConvertImageDtype(torch.float32),
                T.Normalize(self.mean, self.std),
            ]
        )

    def naflex_transform(self, seq_len: int, patch_size: int):
        """PIL image -> normalised float tensor (3, h, w): the whole image, no crop, resized with its aspect ratio
        kept to at most `seq_len` patches of `patch_size` px, each side a whole number of them (the geometry the
        torch loader's NaFlex batches train on, vit/data/loading/naflex_loader.py), for vit/naflex.py's `pack`."""
        from vit.data.loading.naflex_loader import OwnShape

        geometry = OwnShape(patch_size, "none", 1.0, self.interpolation)
        finish = T.Compose([T.ConvertImageDtype(torch.float32), T.Normalize(self.mean, self.std)])
        return lambda image: finish(geometry(image, seq_len))

    def to_dict(self) -> dict:
        out = asdict(self)
        out["mean"], out["std"] = list(self.mean), list(self.std)
        return out

    @classmethod
    def from_dict(cls, values: Mapping) -> Preprocessing:
        return cls(
            img_size=int(values["img_size"]),
            resize=int(values["resize"]),
            interpolation=str(values["interpolation"]),
            mean=tuple(float(v) for v in values["mean"]),
            std=tuple(float(v) for v in values["std"]),
            origin=str(values.get("origin", "")),
        )


def from_data_config(cfg: Mapping) -> Preprocessing:
    """The trainer's validation transform (vit.data.augment.transforms.val_transform) as numbers: the shorter side
    to img_size / crop_pct (`eval_resize`) with the data's filter, then the centre crop."""
    from vit.data.augment.transforms import eval_resize, resize_filter
    from vit.data.sources.registry import data_of, mean_std

    data = data_of(cfg)
    size = data.img_size
    resize = eval_resize(size, data.crop_pct)
    return Preprocessing(size, resize, resize_filter(data), *mean_std(data), f"data config {data.name!r}")


def from_timm(name: str) -> Preprocessing:
    """What timm's pretrained config prescribes for the weights `name` (e.g. vit_small_patch16_224.augreg_in1k):
    input size, crop_pct (resize to floor(size / crop_pct)), interpolation, mean and std. Needs no download."""
    import timm
    from timm.data import resolve_data_config

    try:
        model = timm.create_model(name, pretrained=False)
    except RuntimeError as err:  # "Unknown model (...)"
        raise ValueError(f"timm has no model {name!r}: {err}") from err
    cfg = resolve_data_config({}, model=model)
    size = int(cfg["input_size"][-1])
    crop_pct = float(cfg.get("crop_pct") or 1.0)
    if cfg.get("crop_mode", "center") != "center":
        raise ValueError(f"timm's config of {name!r} uses crop_mode={cfg['crop_mode']!r}; only 'center' is supported")
    return Preprocessing(
        size,
        math.floor(size / crop_pct),
        str(cfg["interpolation"]),
        tuple(float(v) for v in cfg["mean"]),
        tuple(float(v) for v in cfg["std"]),
        f"timm pretrained config of {name!r}",
    )


def check_seq_len(seq_len) -> int:
    """A tool's seq_len=<n> as a whole number of tokens >= 1, or a one-line UsageError naming it."""
    if not str(seq_len).isdigit() or int(seq_len) < 1:
        raise UsageError(f"seq_len={seq_len!r} must be a whole number of tokens >= 1")
    return int(seq_len)


def naflex_patch_size(model, seq_len: str | None) -> int | None:
    """The tools' seq_len=<n> (vit-eval, vit-predict): the side of the model's patches, which NaFlex batches are
    cut into (None without seq_len). A model that does not cut plain patches (a convolutional stem, T2T-ViT) or
    non-square ones is refused in one line, before any image is read."""
    if seq_len is None:
        return None
    check_seq_len(seq_len)
    embed = getattr(model, "embed", None)
    if not hasattr(embed, "embed_patches") or len(set(embed.patch_size)) != 1:
        raise UsageError(
            f"seq_len={seq_len}: images at their own shapes need a ViT that cuts square patches (the standard patch "
            f"embedding), not {type(embed or model).__name__}"
        )
    return int(embed.patch_size[0])
