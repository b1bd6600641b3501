"""Training: config checks, optimisation, the loop, checkpoints, logging, and `run(cfg)` tying them together."""

from vit.train.config import validate
from vit.train.run import run

__all__ = ["run", "validate"]
