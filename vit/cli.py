"""Console entry points: `vit-train` (same as `python train.py`) and `vit-eval` (scripts/evaluate.py)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")


def _fail(kind: str, err: Exception) -> None:
    print(f"{kind} error: {err}", file=sys.stderr, flush=True)
    # SystemExit is not an Exception, so Hydra's error handler lets it through with our exit code.
    raise SystemExit(2)


def train_task(cfg) -> float | None:
    """The Hydra task: run one training; bad settings exit with code 2 and one line on stderr."""
    from vit.data import DataError
    from vit.train import CheckpointError, ConfigError, run

    logging.getLogger("vit").setLevel(logging.INFO)
    try:
        metrics = run(cfg)
    except ConfigError as err:
        _fail("config", err)
    except DataError as err:
        _fail("data", err)
    except CheckpointError as err:
        _fail("checkpoint", err)
    # The value Hydra sweepers optimise, when one is used.
    return (metrics.get("final") or {}).get("val_top1")


def train_main() -> None:
    import hydra

    hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")(train_task)()


def evaluate_main() -> None:
    from vit.train.evaluate import main

    sys.exit(main(sys.argv[1:]))
