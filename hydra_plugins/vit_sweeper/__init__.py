"""Hydra looks for sweepers in the `hydra_plugins` package only: this names the project's Optuna sweeper there.
The sweeper itself is vit/search/sweeper.py; configs/hydra/sweeper/optuna.yaml selects it."""

from vit.search.sweeper import OptunaSweeper as _OptunaSweeper


class OptunaSweeper(_OptunaSweeper):
    """vit.search.sweeper.OptunaSweeper, under the name Hydra accepts for a plugin."""


__all__ = ["OptunaSweeper"]
