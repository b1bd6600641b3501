"""Training: config checks, optimisation, the loop, checkpoints, logging, and `run(cfg)` tying them together."""

from vit.train.checkpoint import CheckpointError, atomic_save, load_checkpoint
from vit.train.config import ConfigError, validate
from vit.train.run import run

__all__ = ["CheckpointError", "ConfigError", "atomic_save", "load_checkpoint", "run", "validate"]
