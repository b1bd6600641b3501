"""`trainer.width_by_budget.long_overrides`: the overrides a budgeted run also trains with where the budget buys its
width at least `long_epochs` (vit/train/width_choice.py decides), read with Hydra's override grammar and written
into the run's config as Hydra would have applied them on the command line. Free of torch: the config's checks
(vit/train/config.py) read them before anything heavy is imported."""

from __future__ import annotations

from omegaconf import DictConfig

from vit.config.compose import Edit, apply_edits, edit_of
from vit.errors import ConfigError, UsageError

LONG_KEY = "trainer.width_by_budget.long_overrides"
# The groups built after the width is picked; the trainer's own keys are read before it.
LONG_GROUPS = ("data", "model", "optim", "sched")


def long_edits(overrides: tuple[str, ...]) -> list[tuple[str, Edit]]:
    """`long_overrides` read with Hydra's override grammar, as (group, its Edit); a text that is no override, or
    one of another group than LONG_GROUPS, is a ConfigError naming it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    edits = []
    for text in overrides:
        try:
            (override,) = OverridesParser.create().parse_overrides([text])
        except OverrideParseException as err:
            why = str(err).strip().splitlines()[0]
            raise ConfigError(f"{LONG_KEY}: {text!r} is not an override in Hydra's grammar ({why})") from err
        key = override.key_or_group
        group = key.partition(".")[0]
        if group not in LONG_GROUPS or "." not in key:
            groups = ", ".join(f"{g}.*" for g in LONG_GROUPS)
            raise ConfigError(f"{LONG_KEY}: {text!r} sets {key}; a long run's overrides set keys of {groups}")
        try:
            edits.append((group, edit_of(override, text, group)))
        except UsageError as err:
            raise ConfigError(f"{LONG_KEY}: {err}") from err
    return edits


def apply_long_overrides(cfg: DictConfig, overrides: tuple[str, ...]) -> None:
    """Write `overrides` into the run's config, as Hydra would have applied them on the command line."""
    for group, edit in long_edits(overrides):
        try:
            apply_edits(cfg[group], [edit], group, "the run's config")
        except UsageError as err:
            raise ConfigError(f"{LONG_KEY}: {err}") from err
