"""`AugmentSpec`: the `data.augment` keys, checked once (exit-2 messages name the key and value), with the defaults
of a key a hand-built config leaves out read from the one place they are declared, configs/data/cifar10.yaml."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, fields

from vit.data.augment.policies import build_policy
from vit.data.declared import BASE, declared
from vit.data.errors import DataError

CROPS = ("pad", "rrc", "none")


# The one declaration of the augment keys' defaults: the base data config, which every data config inherits.


@functools.lru_cache(maxsize=1)
def declared_defaults() -> dict:
    """The `augment` node of configs/data/cifar10.yaml: what a key left out of a hand-built config means."""
    return dict(declared(BASE)["augment"])


@dataclass(frozen=True)
class AugmentSpec:
    """The `data.augment` node, checked. Keys a config leaves out take their value from `declared_defaults()`."""

    crop: str  # pad | rrc | none
    pad: int
    scale_min: float
    hflip: bool
    auto_augment: str | None
    re_prob: float
    mixup_alpha: float
    cutmix_alpha: float
    mixup_prob: float
    label_smoothing: float

    @classmethod
    def from_config(cls, node: Mapping | None) -> AugmentSpec:
        """Check the node (exit-2 messages name the key and value) and read it."""
        values = declared_defaults()
        known = [f.name for f in fields(cls)]
        for key, value in dict(node or {}).items():
            if key not in known:
                raise DataError(f"data.augment.{key} is not a known key (known: {', '.join(known)})")
            values = {**values, key: value}
        spec = cls(**{key: values[key] for key in known})
        spec.check()
        return spec

    def check(self) -> None:
        def require(ok: bool, message: str) -> None:
            if not ok:
                raise DataError(f"data.augment.{message}")

        require(self.crop in CROPS, f"crop={self.crop!r} must be one of {CROPS}")
        require(int(self.pad) >= 0, f"pad={self.pad} must be >= 0")
        require(0.0 < float(self.scale_min) <= 1.0, f"scale_min={float(self.scale_min)} must be in (0, 1]")
        for key in ("re_prob", "label_smoothing"):
            value = float(getattr(self, key))
            require(0.0 <= value < 1.0, f"{key}={value} must be in [0, 1)")
        require(0.0 <= float(self.mixup_prob) <= 1.0, f"mixup_prob={float(self.mixup_prob)} must be in [0, 1]")
        for key in ("mixup_alpha", "cutmix_alpha"):
            require(float(getattr(self, key)) >= 0, f"{key}={getattr(self, key)} must be >= 0")
        build_policy(self.auto_augment, 32, (0.5, 0.5, 0.5))  # refuses a bad policy string up front
