"""timm's RandAugment (`rand-m9-mstd0.5-inc1` and the other `rand-...` strings) for whole uint8 (B, 3, H, W)
batches, every sample with its own draws: the one implementation both loaders apply.

timm applies its RandAugment to one PIL image at a time with Pillow's ops. This module keeps timm's policy (its
15 ops, their level-to-argument formulas, the magnitude noise, the per-op probability, the "increasing" variants,
the weighted op choice) and reproduces each op's arithmetic on uint8 tensors, so the CPU workers' batches and the
GPU-resident loader's batches come out of the same code. Per sample and per slot (`n` slots):

    op ~ uniform over the 15 ops (with replacement; `tweights`: timm's weights, without replacement)
    applied with probability p (timm: skipped when random() > p)
    level = m, or ~ N(m, mstd) (mstd > 100: U(0, m)), clipped to [0, mmax] (mmax: 10 unless given)
    argument = the op's formula of level (below), with a random sign for the signed ops

The draws come from the batch's CPU generator (vit/data/augment/draws.py); the drawn ops then run where the batch is
(vit/data/augment/rand_augment_ops.py): through Pillow image by image on the CPU, as batched tensor kernels with
Pillow's arithmetic on a GPU.
"""

from __future__ import annotations

import math

import torch

from vit.data.augment import draws
from vit.data.augment.rand_augment_ops import OP_INDEX, OPS, apply_with_pillow, apply_with_tensors

# The ops whose argument takes a random sign; the enhance ops, whose "increasing" variant is 1 +- level.
SIGNED = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
ENHANCE = ("Color", "Contrast", "Brightness", "Sharpness")
# timm's `tweights` op weights (with `inc1` spelled as the increasing variants), drawn without replacement.
CHOICE_WEIGHTS = {
    "Rotate": 3,
    "ShearX": 2,
    "ShearY": 2,
    "TranslateXRel": 1,
    "TranslateYRel": 1,
    "Color": 0.25,
    "Sharpness": 0.25,
    "AutoContrast": 0.25,
    "Solarize": 0.05,
    "SolarizeAdd": 0.05,
    "Contrast": 0.05,
    "Brightness": 0.05,
    "Equalize": 0.05,
    "Posterize": 0.05,
    "Invert": 0.05,
}
LEVEL_DENOM = 10.0  # timm's magnitude scale: m10 is the full strength of every op


def op_argument(op: torch.Tensor, level: torch.Tensor, negate: torch.Tensor, increasing: bool) -> torch.Tensor:
    """float64 (n,): timm's `level_to_arg` of each sample's op at its level (float64, as Python's floats).

    Rotate: degrees, level / 10 * 30; ShearX/Y: level / 10 * 0.3; TranslateX/YRel: a fraction of the side,
    level / 10 * 0.45 (these five negated where `negate`). Posterize: bits kept, int(level / 10 * 4) (increasing:
    4 minus that); Solarize: threshold, min(256, int(level / 10 * 256)) (increasing: 256 minus that); SolarizeAdd:
    min(128, int(level / 10 * 110)); Color/Contrast/Brightness/Sharpness: the blend factor level / 10 * 1.8 + 0.1
    (increasing: max(0.1, 1 +- level / 10 * 0.9)). The table-free ops (AutoContrast, Equalize, Invert): 0.
    """
    fraction = level / LEVEL_DENOM
    sign = torch.where(negate, -1.0, 1.0).double()
    bits = (fraction * 4).trunc()
    threshold = (fraction * 256).trunc().clamp(max=256)
    if increasing:
        bits, threshold = 4 - bits, 256 - threshold
        enhance = (1.0 + sign * (fraction * 0.9)).clamp(min=0.1)
    else:
        enhance = fraction * 1.8 + 0.1
    values = {
        "Rotate": sign * (fraction * 30.0),
        "ShearX": sign * (fraction * 0.3),
        "ShearY": sign * (fraction * 0.3),
        "TranslateXRel": sign * (fraction * 0.45),
        "TranslateYRel": sign * (fraction * 0.45),
        "Posterize": bits,
        "Solarize": threshold,
        "SolarizeAdd": (fraction * 110).trunc().clamp(max=128),
        **{name: enhance for name in ENHANCE},
    }
    argument = torch.zeros_like(level)
    for name, value in values.items():
        argument = torch.where(op == OP_INDEX[name], value, argument)
    return argument


# ---- the policy ----


class TimmRandAugment:
    """timm's RandAugment on uint8 (B, C, H, W) batches, drawing from a torch.Generator (see the module docstring).

    num_ops: `n`; magnitude: `m` (0..magnitude_max); magnitude_std: `mstd` (0: none, inf: uniform in [0, m]);
    magnitude_max: `mmax`; increasing: `inc1`; prob: `p`; weighted: `tweights`; fill: uint8 (C,) for the pixels
    a geometric op brings in from outside the image (the dataset mean).
    """

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: float = 10,
        magnitude_std: float = 0.0,
        magnitude_max: float = LEVEL_DENOM,
        increasing: bool = False,
        prob: float = 0.5,
        weighted: bool = False,
        fill: tuple[int, ...] = (128, 128, 128),
    ) -> None:
        self.num_ops, self.magnitude, self.magnitude_std = num_ops, float(magnitude), float(magnitude_std)
        self.magnitude_max, self.increasing, self.prob = float(magnitude_max), increasing, float(prob)
        self.weights = torch.tensor([float(CHOICE_WEIGHTS[name]) for name in OPS]) if weighted else None
        self.fill = tuple(int(v) for v in fill)
        # How the ops are computed: with Pillow image by image (None: on the CPU, where its C loops are several
        # times faster than tensor kernels on one image), else with the tensor kernels, gathering each op's samples
        # (subsets; None: on the CPU) or on the whole batch.
        self.pillow: bool | None = None
        self.subsets: bool | None = None

    def draw(self, batch: int, device: torch.device, generator: torch.Generator | None) -> list[tuple]:
        """Per slot: (op int64 (B,), or -1 where the op is skipped; argument float64 (B,)). A fixed number of random
        values per batch, so the generator advances the same whatever is drawn."""
        if self.weights is None:
            ops = draws.randint(len(OPS), (batch, self.num_ops), generator, device)
        else:
            weights = self.weights.expand(batch, -1)  # on the CPU, like every draw
            ops = torch.multinomial(weights, self.num_ops, replacement=False, generator=generator).to(device)
        slots = []
        for k in range(self.num_ops):
            applied = draws.rand(batch, generator, device, torch.float64) <= self.prob
            noise = draws.randn(batch, generator, device, torch.float64)
            uniform = draws.rand(batch, generator, device, torch.float64)
            negate = draws.rand(batch, generator, device, torch.float64) > 0.5
            level = torch.full((batch,), self.magnitude, dtype=torch.float64, device=device)
            if math.isinf(self.magnitude_std):
                level = uniform * self.magnitude
            elif self.magnitude_std > 0:
                level = level + noise * self.magnitude_std
            level = level.clamp(0.0, self.magnitude_max)
            op = ops[:, k]
            slots.append((torch.where(applied, op, -1), op_argument(op, level, negate, self.increasing)))
        return slots

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """uint8 (B, C, H, W) -> uint8 (B, C, H, W)."""
        slots = self.draw(len(x), x.device, generator)
        on_cpu = x.device.type == "cpu"
        if (on_cpu if self.pillow is None else self.pillow) and x.shape[1] == 3:
            return apply_with_pillow(x, slots, self.fill)
        return self.apply_with_tensors(x, slots, on_cpu if self.subsets is None else self.subsets)

    def apply_with_tensors(self, x: torch.Tensor, slots: list[tuple], subsets: bool) -> torch.Tensor:
        """The drawn ops as batched tensor kernels (vit/data/augment/rand_augment_ops.py)."""
        return apply_with_tensors(x, slots, self.fill, subsets)
