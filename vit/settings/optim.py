"""`optim.*`: the optimizer (vit/train/optimizer.py builds it through timm's registry; configs/optim/ chooses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from vit.errors import ConfigError
from vit.settings.schema import Settings, knob


def parse_optimizer_name(value: Any) -> str:
    """`optim.name`: a name of timm's optimizer registry. A name it lacks is one line with the closest names (as an
    unknown config key gets its nearest one) and where the whole list is, not the list itself: timm knows about a
    hundred names, a line of a thousand characters in which the misspelt name's neighbour is hard to find."""
    import difflib

    from timm.optim import list_optimizers  # here, not at the top: Hydra imports the settings at its start

    known = list_optimizers()
    if isinstance(value, str) and value in known:
        return value
    close = difflib.get_close_matches(str(value).lower(), known, n=3, cutoff=0.6)  # timm's names are lower case
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    listing = f"timm.optim.list_optimizers() lists all {len(known)}"
    raise ConfigError(f"optim.name={value!r} is not an optimizer timm knows{hint} ({listing})")


@dataclass(frozen=True)
class OptimSettings(Settings):
    group: ClassVar[str] = "optim"

    name: str = knob("adamw", parse=parse_optimizer_name)  # any optimizer of timm's registry (list_optimizers())
    lr: float = knob(1.0e-3, low=0.0, low_open=True)  # for a global batch of lr_batch images, scaled linearly
    lr_batch: int | None = knob(512, low=1)  # the global batch lr is given for (null: 512)
    weight_decay: float = knob(0.05, low=0.0)  # none on norms, biases, position embeddings and tokens
    weight_decay_end: float | None = knob(None, low=0.0)  # null: constant; else a cosine to this by the last step
    # null: the optimizer's own default (AdamW's betas (0.9, 0.999), eps 1e-8), also under another optim.name
    betas: tuple[float, float] | None = knob(None, low=0.0, high=1.0, high_open=True, text="must both be in [0, 1)")
    eps: float | None = knob(None, low=0.0, low_open=True)  # the optimizer's epsilon; null: its own default
    momentum: float | None = knob(None, low=0.0, high=1.0, high_open=True)  # where the optimizer takes one
    kwargs: dict[str, Any] = knob({})  # any other keyword of the optimizer, e.g. +optim.kwargs.amsgrad=true
    # null: off | in (0, 1]: layer-wise lr decay, the head at the full rate, each block below it layer_decay times
    # the one above, the patch embedding, cls token and position table the lowest (timm's param_groups_layer_decay)
    layer_decay: float | None = knob(None, low=0.0, high=1.0, low_open=True)
