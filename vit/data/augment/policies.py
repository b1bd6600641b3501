"""The one table of the policies `data.augment.auto_augment` can name, `POLICIES`, and `build_policy`, which turns
the setting into a callable (uint8 (B, 3, H, W), generator) -> uint8 (B, 3, H, W) that draws per sample.

A setting is a policy's name, then, for the policies that take them, "-"-separated sections of a key and a number
in timm's style: "rand-m9-mstd0.5-inc1" is the policy "rand" with m=9, mstd=0.5, inc=1. Adding a policy is one
entry here (its builder, and how it is written, for the messages) and, if a recipe uses it, the YAML that names it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torchvision.transforms import v2

from vit.data.augment.batched_policy import BatchedAutoAugment, BatchedTrivialAugmentWide
from vit.data.augment.rand_augment import LEVEL_DENOM, TimmRandAugment
from vit.data.errors import DataError


def _sections(text: str, parsers: dict[str, type]) -> dict[str, object]:
    """ "rand-m9-mstd0.5-inc1" -> {"m": 9, "mstd": 0.5, "inc": 1}: each section is a known key (the longest that
    prefixes it) and a number of that key's type; "tweights" is the one word-valued section."""
    values: dict[str, object] = {}
    for section in text.split("-")[1:]:
        key = max((k for k in parsers if section.startswith(k)), key=len, default=None)
        try:
            values[key] = parsers[key](section[len(key) :])
        except (KeyError, TypeError, ValueError):
            key = None
        if key is None or values[key] == "":
            known = ", ".join(f"{k}<{p.__name__}>" for k, p in parsers.items())
            raise DataError(f"data.augment.auto_augment={text!r}: section {section!r} is not one of {known}")
    return values


def rand_augment(text: str, img_size: int, mean: tuple[float, ...]) -> TimmRandAugment:
    """rand-<sections>: timm's RandAugment (vit/data/augment/rand_augment.py)."""
    options = _sections(text, {"m": int, "n": int, "p": float, "mstd": float, "mmax": int, "inc": int, "t": str})
    magnitude, magnitude_max = options.get("m", 10), options.get("mmax", int(LEVEL_DENOM))
    std, num_ops, prob = options.get("mstd", 0.0), options.get("n", 2), options.get("p", 0.5)
    problems = {
        f"m{magnitude} must be in [0, mmax={magnitude_max}] (raise the bound with mmax)": 0
        <= magnitude
        <= magnitude_max,
        f"n{num_ops} must be between 1 and 15 ops": 1 <= num_ops <= 15,
        f"p{prob} must be in [0, 1]": 0.0 <= prob <= 1.0,
        f"mstd{std} must be >= 0 (over 100: uniform in [0, m])": std >= 0,
        f"inc{options.get('inc', 0)} must be 0 or 1": options.get("inc", 0) in (0, 1),
        f"t{options.get('t', 'weights')} must be tweights (the weighted op choice)": options.get("t", "weights")
        == "weights",
    }
    for problem, ok in problems.items():
        if not ok:
            raise DataError(f"data.augment.auto_augment={text!r}: {problem}")
    return TimmRandAugment(
        num_ops=num_ops,
        magnitude=magnitude,
        magnitude_std=math.inf if std > 100 else std,
        magnitude_max=magnitude_max,
        increasing=bool(options.get("inc", 0)),
        prob=prob,
        weighted="t" in options,
        fill=tuple(round(255 * m) for m in mean),  # timm's img_mean
    )


class PerImageAugMix:
    """torchvision's AugMix, one image at a time (its op chain is drawn once per call, so a batch in one call would
    share it), seeded from the batch's generator so its draws repeat on resume and leave the global RNG alone."""

    def __init__(self, **kwargs) -> None:
        self.augmix = v2.AugMix(**kwargs)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        seeds = torch.randint(2**62, (len(x),), generator=generator).tolist()  # a CPU generator, like every draw
        out = []
        for image, seed in zip(x, seeds, strict=True):
            with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
                torch.manual_seed(seed)
                out.append(self.augmix(image))
        return torch.stack(out)


def augmix(text: str, img_size: int, mean: tuple[float, ...]) -> PerImageAugMix:
    """augmix[-<sections>]: torchvision's AugMix, per image."""
    options = _sections(text, {"m": int, "w": int, "d": int, "a": float})
    severity, width, depth, alpha = (
        options.get("m", 3),
        options.get("w", 3),
        options.get("d", -1),
        options.get("a", 1.0),
    )
    if not (1 <= severity <= 10 and width >= 1 and (depth == -1 or 1 <= depth) and alpha > 0):
        raise DataError(
            f"data.augment.auto_augment={text!r}: needs m (severity) in [1, 10], w >= 1, d = -1 or >= 1, a > 0"
        )
    return PerImageAugMix(severity=severity, mixture_width=width, chain_depth=depth, alpha=alpha)


def is_small(img_size: int) -> bool:
    """CIFAR-like images: AutoAugment uses its CIFAR-10 policy for these, ImageNet's for larger ones."""
    return img_size <= 64


def autoaugment(text: str, img_size: int, mean: tuple[float, ...]) -> BatchedAutoAugment:
    """autoaug: torchvision's AutoAugment drawn per sample (vit/data/augment/batched_policy.py), with its CIFAR-10
    sub-policies up to 64 px and ImageNet's above."""
    return BatchedAutoAugment("cifar10" if is_small(img_size) else "imagenet")


def trivial_augment(text: str, img_size: int, mean: tuple[float, ...]) -> BatchedTrivialAugmentWide:
    """trivial: torchvision's TrivialAugmentWide drawn per sample (vit/data/augment/batched_policy.py)."""
    return BatchedTrivialAugmentWide()


@dataclass(frozen=True)
class Policy:
    """One policy `data.augment.auto_augment` can name."""

    # (the whole setting, the image size, the dataset mean (R, G, B) on a [0, 1] scale) -> the policy
    build: Callable[[str, int, tuple[float, ...]], Callable]
    # How it is written, for the message that lists the policies; None: its name alone, with no sections.
    usage: str | None = None


# The policy small photos train with (AutoAugment's CIFAR-10 policy up to 64 px): the small-image line suggests it
SMALL_PHOTOS_POLICY = "autoaug"

POLICIES: dict[str, Policy] = {
    "autoaug": Policy(autoaugment),
    "trivial": Policy(trivial_augment),
    "rand": Policy(
        rand_augment,
        "rand-<sections> (timm's RandAugment: m<int>, n<int>, p<float>, mstd<float>, mmax<int>, inc<0|1>, tweights; "
        "e.g. rand-m9-mstd0.5-inc1)",
    ),
    "augmix": Policy(augmix, "augmix[-m<severity>-w<width>-d<depth>-a<alpha>]"),
}


def policy_help() -> str:
    """ "null, autoaug, trivial, rand-<sections> (...) or augmix[...]": every way to write the setting."""
    usages = ["null", *(policy.usage or name for name, policy in POLICIES.items())]
    return f"{', '.join(usages[:-1])} or {usages[-1]}"


def build_policy(text: str | None, img_size: int, mean: tuple[float, ...]):
    """`data.augment.auto_augment` as a callable (uint8 (B, 3, H, W), generator) -> uint8 (B, 3, H, W), or None
    (null: no policy). The policy is the entry named by the text before its first "-"; only the entries with a
    `usage` take sections after it."""
    if not text:
        return None
    text = str(text)
    name = text.split("-")[0]
    policy = POLICIES.get(name)
    if policy is None or (policy.usage is None and text != name):
        raise DataError(f"data.augment.auto_augment={text!r} must be {policy_help()}")
    return policy.build(text, img_size, mean)
