"""AutoAugment and TrivialAugmentWide for whole uint8 (B, 3, H, W) batches, every sample with its own draw: what
`data.augment.auto_augment=autoaug|trivial` means on both loaders (vit/data/augment/policies.py builds them).

torchvision's v2 policies draw ONE op per call, from the global RNG, so a loader calling them on a batch either
shares one draw among many images or makes a call per chunk of images, each a handful of small kernels (and host
syncs) launched from Python. Here a batch costs a fixed number of launches per op family, whatever its size:

    uint8 (B, 3, H, W), generator
      --draw, per sample and per slot (1 for TrivialAugmentWide, 2 for AutoAugment): a row of
        the policy's table = (op, magnitude bin, sign), and for AutoAugment a sub-policy and whether each of its two
        ops applies-->
      --per slot, three families (vit/data/augment/batched_ops.py): the geometric ops in ONE nearest grid_sample with a
        per-sample affine matrix; the value-to-value ops in ONE lookup-table gather; Color / Contrast / Sharpness in
        ONE fused multiply-add-->
    uint8 (B, 3, H, W)

Matching torchvision (transforms/v2/_auto_augment.py, 0.2x): the same op set, magnitude bins and signed ops, the same
sub-policies and probabilities, and per op the same arithmetic as torchvision.transforms.v2.functional, down to the
rounding (tests/data/test_batched_policy.py checks every op image by image, exactly). The draws are not
torchvision's: they come from the generator passed in (the loader's per-epoch device generator), so they repeat
exactly on resume.
AugMix (a Dirichlet mixture of op chains) has no batched version: the loader keeps torchvision's for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vit.data.augment import draws
from vit.data.augment.batched_ops import OP_INDEX, OPS, affine_theta, apply_ops, member, static_lut

# The ops whose magnitude takes a random sign, as torchvision's `_AUGMENTATION_SPACE` marks them.
SIGNED = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness")

# The magnitude bins of each op, (num_bins, height, width) -> (num_bins,) or None (no magnitude), as torchvision's
# `_AUGMENTATION_SPACE`s: the "standard" one of AutoAugment, and TrivialAugmentWide's "wide" one.
MagnitudeFn = Callable[[int, int, int], torch.Tensor | None]
_NONE: MagnitudeFn = lambda bins, h, w: None  # noqa: E731


def _linspace(start: float, end: float) -> MagnitudeFn:
    return lambda bins, h, w: torch.linspace(start, end, bins)


def _posterize_bits(drop: int) -> MagnitudeFn:
    """8 bits down to 8 - drop bits over the bins, rounded (torchvision's formula)."""
    return lambda bins, h, w: (8 - (torch.arange(bins) / ((bins - 1) / drop))).round().int()


STANDARD_SPACE: dict[str, MagnitudeFn] = {
    "Identity": _NONE,
    "ShearX": _linspace(0.0, 0.3),
    "ShearY": _linspace(0.0, 0.3),
    "TranslateX": lambda bins, h, w: torch.linspace(0.0, 150.0 / 331.0 * w, bins),
    "TranslateY": lambda bins, h, w: torch.linspace(0.0, 150.0 / 331.0 * h, bins),
    "Rotate": _linspace(0.0, 30.0),
    "Brightness": _linspace(0.0, 0.9),
    "Color": _linspace(0.0, 0.9),
    "Contrast": _linspace(0.0, 0.9),
    "Sharpness": _linspace(0.0, 0.9),
    "Posterize": _posterize_bits(4),
    "Solarize": _linspace(1.0, 0.0),
    "AutoContrast": _NONE,
    "Equalize": _NONE,
    "Invert": _NONE,
}
WIDE_SPACE: dict[str, MagnitudeFn] = {
    "Identity": _NONE,
    "ShearX": _linspace(0.0, 0.99),
    "ShearY": _linspace(0.0, 0.99),
    "TranslateX": _linspace(0.0, 32.0),  # pixels, whatever the image size (as torchvision)
    "TranslateY": _linspace(0.0, 32.0),
    "Rotate": _linspace(0.0, 135.0),
    "Brightness": _linspace(0.0, 0.99),
    "Color": _linspace(0.0, 0.99),
    "Contrast": _linspace(0.0, 0.99),
    "Sharpness": _linspace(0.0, 0.99),
    "Posterize": _posterize_bits(6),
    "Solarize": _linspace(1.0, 0.0),
    "AutoContrast": _NONE,
    "Equalize": _NONE,
}

# AutoAugment's sub-policies: ((op, probability, magnitude bin or None), (op, probability, bin)), drawn uniformly.
AUTOAUGMENT_POLICIES = {
    "imagenet": (
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ),
    "cifar10": (
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ),
}


# ---- the policies ----


class BatchedPolicy:
    """A policy as slots, each drawing per sample a row of the policy's table: (op, magnitude bin, sign).

    The table is built on the CPU with torchvision's formulas and kept per (image size, device): per row the op,
    its float64 magnitude, and what depends on the magnitude alone (the affine matrix, the static lookup table), so
    a batch gathers those instead of recomputing them. Subclasses set `space` (op -> magnitude bins), `num_bins`
    and `slot_kinds` (the ops each slot can draw) and implement `draw`. `subsets`: as `apply_ops`'s.
    """

    space: dict[str, MagnitudeFn]
    num_bins: int
    slot_kinds: list[tuple[str, ...]]

    def __init__(self) -> None:
        self._tables: dict[tuple, dict[str, torch.Tensor]] = {}
        self.subsets: bool | None = None

    def magnitudes(self, height: int, width: int) -> torch.Tensor:
        """float32 (len(OPS), num_bins): the magnitude of every op and bin (0 for ops without one)."""
        table = torch.zeros(len(OPS), self.num_bins)
        for name, fn in self.space.items():
            values = fn(self.num_bins, height, width)
            if values is not None:
                table[OP_INDEX[name]] = values.float()
        return table

    def row(self, ops: torch.Tensor, bins: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """The table row of (op, bin, sign): rows run over ops, then bins, then (+, -)."""
        return (ops * self.num_bins + bins) * 2 + negative.long()

    def build_tables(self, height: int, width: int) -> dict[str, torch.Tensor]:
        """On the CPU, for (H, W) images: op, magnitude, theta and lut per row; `choices`: the ops drawn from."""
        ops = torch.arange(len(OPS)).repeat_interleave(self.num_bins * 2)  # (R,), R = len(OPS) * num_bins * 2
        magnitude = self.magnitudes(height, width).double().view(-1, 1).repeat(1, 2)  # (len(OPS) * bins, 2)
        signed = member(SIGNED, torch.device("cpu")).repeat_interleave(self.num_bins)  # (len(OPS) * bins,)
        magnitude[:, 1] = torch.where(signed, -magnitude[:, 1], magnitude[:, 1])  # torchvision: magnitude *= -1
        magnitude = magnitude.view(-1)
        return {
            "op": ops,
            "magnitude": magnitude,
            "theta": affine_theta(ops, magnitude, height, width),  # (R, 2, 3)
            "lut": static_lut(ops, magnitude),  # (R, 1, 256)
            "choices": torch.tensor([OP_INDEX[name] for name in self.space]),
        }

    def tables(self, height: int, width: int, device: torch.device) -> dict[str, torch.Tensor]:
        key = (height, width, str(device))
        if key not in self._tables:
            self._tables[key] = {name: t.to(device) for name, t in self.build_tables(height, width).items()}
        return self._tables[key]

    def draw(
        self, batch: int, height: int, width: int, device: torch.device, generator: torch.Generator
    ) -> list[torch.Tensor]:
        """Per slot: table rows int64 (B,). A fixed number of random values per batch, so the generator advances
        the same whatever is drawn. Signs as torchvision: negative where `torch.rand() <= 0.5`."""
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """uint8 (B, C, H, W) -> uint8 (B, C, H, W)."""
        height, width = x.shape[-2:]
        tables = self.tables(height, width, x.device)
        for rows, kinds in zip(self.draw(len(x), height, width, x.device, generator), self.slot_kinds, strict=True):
            ops, magnitude = tables["op"][rows], tables["magnitude"][rows]
            x = apply_ops(x, ops, magnitude, kinds, self.subsets, tables["theta"][rows], tables["lut"][rows])
        return x


class BatchedTrivialAugmentWide(BatchedPolicy):
    """TrivialAugmentWide: one op per sample, uniform over 14, a uniform bin of `num_magnitude_bins`, a random sign."""

    space = WIDE_SPACE

    def __init__(self, num_magnitude_bins: int = 31) -> None:
        super().__init__()
        self.num_bins = num_magnitude_bins
        self.slot_kinds = [tuple(self.space)]

    def draw(self, batch, height, width, device, generator):
        choices = self.tables(height, width, device)["choices"]
        ops = choices[draws.randint(len(choices), (batch,), generator, device)]
        bins = draws.randint(self.num_bins, (batch,), generator, device)
        negative = draws.rand(batch, generator, device) <= 0.5
        return [self.row(ops, bins, negative)]


class BatchedAutoAugment(BatchedPolicy):
    """AutoAugment: a uniform sub-policy per sample, then its two ops in sequence, each applied with its
    probability at its fixed bin (of 10), signed ops with a random sign. policy: "cifar10" or "imagenet"."""

    space = {name: fn for name, fn in STANDARD_SPACE.items() if name != "Identity"}
    num_bins = 10

    def __init__(self, policy: str = "imagenet") -> None:
        super().__init__()
        self.policy = policy
        self.sub_policies = AUTOAUGMENT_POLICIES[policy]
        self.slot_kinds = [tuple(sorted({sub[j][0] for sub in self.sub_policies})) for j in range(2)]

    def build_tables(self, height, width):
        tables = super().build_tables(height, width)
        steps = [step for sub in self.sub_policies for step in sub]  # (25 * 2) in sub-policy order
        ops = torch.tensor([OP_INDEX[name] for name, _, _ in steps])
        bins = torch.tensor([b or 0 for _, _, b in steps])
        tables["step_rows"] = self.row(ops, bins, torch.zeros_like(ops)).view(-1, 2)  # the + sign's rows
        tables["probability"] = torch.tensor([p for _, p, _ in steps], dtype=torch.float32).view(-1, 2)
        return tables

    def draw(self, batch, height, width, device, generator):
        tables = self.tables(height, width, device)
        sub = draws.randint(len(self.sub_policies), (batch,), generator, device)
        slots = []
        for j in range(2):
            # torchvision: `if not torch.rand(()) <= probability: skip` (compared in float32); skipped: Identity
            applied = draws.rand(batch, generator, device) <= tables["probability"][sub, j]
            negative = draws.rand(batch, generator, device) <= 0.5
            rows = tables["step_rows"][sub, j] + negative  # the - sign's row follows the + sign's
            slots.append(torch.where(applied, rows, 0))  # row 0: Identity
        return slots
