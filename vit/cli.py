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


def check_group_choices(args: list[str]) -> None:
    """`model=vit_huge`: Hydra would stop with exit code 1; like every other bad setting it exits 2 here, naming
    the known options. Comma lists (multirun sweeps over groups) are checked choice by choice."""
    for arg in args:
        group, sep, value = arg.partition("=")
        group_dir = Path(CONFIG_DIR) / group
        if not sep or not group.isidentifier() or not group_dir.is_dir() or "(" in value:
            continue  # not a group choice (a key, hydra.*, +/~ edits), or a sweep function Hydra expands
        known = sorted(p.stem for p in group_dir.glob("*.yaml"))
        for choice in value.split(","):
            if choice not in known and not (group == "experiment" and choice == "null"):
                print(
                    f"config error: {group}={choice} is not a known {group} config; known: {', '.join(known)}",
                    file=sys.stderr,
                    flush=True,
                )
                raise SystemExit(2)


def train_main() -> None:
    import hydra

    check_group_choices(sys.argv[1:])
    hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")(train_task)()


def evaluate_main() -> None:
    from vit.train.evaluate import main

    sys.exit(main(sys.argv[1:]))
