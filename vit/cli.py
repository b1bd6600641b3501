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


DIVERGED_EXIT_CODE = 3  # the loss stopped being finite: the settings were valid, the training was not


def train_task(cfg) -> float | None:
    """The Hydra task: run one training; bad settings exit with code 2 and one line on stderr, a diverged
    training with code 3."""
    from vit.data import DataError
    from vit.train import CheckpointError, ConfigError, run
    from vit.train.loop import NonFiniteLossError

    logging.getLogger("vit").setLevel(logging.INFO)
    try:
        metrics = run(cfg)
    except ConfigError as err:
        _fail("config", err)
    except DataError as err:
        _fail("data", err)
    except CheckpointError as err:
        _fail("checkpoint", err)
    except NonFiniteLossError as err:
        print(f"training stopped: {err}", file=sys.stderr, flush=True)
        raise SystemExit(DIVERGED_EXIT_CODE) from None
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


def dotted_keys(node, prefix: str = "") -> list[str]:
    """Every key path of a composed config: model.num_heads, data.augment.re_prob, ..."""
    from omegaconf import DictConfig

    keys = []
    for key in node:
        path = f"{prefix}{key}"
        keys.append(path)
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            keys.extend(dotted_keys(child, f"{path}."))
    return keys


def check_override_keys(args: list[str]) -> None:
    """`model.num_head=4`: Hydra would stop with exit code 1 and a traceback-like message; here it exits 2 naming
    the nearest existing key. The config is composed from the command line's group choices (the first of a sweep)
    so an experiment's keys count; `+key=`, `++key=`, `~key`, hydra.* and sweep functions are left to Hydra."""
    import difflib

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    choices, keys = [], []
    for arg in args:
        if arg.startswith(("-", "+", "~")) or "=" not in arg:
            continue
        key, _, value = arg.partition("=")
        if key.startswith("hydra.") or key.startswith("hydra/") or "@" in key:
            continue
        if (Path(CONFIG_DIR) / key).is_dir():
            choices.append(f"{key}={value.split(',')[0]}")
        else:
            keys.append(key)
    if not keys:
        return
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name="check"):
        cfg = compose(config_name="config", overrides=choices)
    known = dotted_keys(cfg)
    for key in keys:
        if OmegaConf.select(cfg, key, default="<missing>") == "<missing>" and key not in known:
            # Compare the last part among the siblings (the shared "model." would make every key look close).
            parent, _, leaf = key.rpartition(".")
            siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent]
            if siblings:
                matches = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
                close = [f"{parent}.{m}" if parent else m for m in matches]
            else:  # the parent itself is misspelt: compare whole paths
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            if not close:  # the right name in another place (`num_heads=3` for model.num_heads)
                leaves = {k.rpartition(".")[2]: k for k in reversed(known)}
                close = [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.8)]
            hint = f"; did you mean {close[0]}?" if close else ""
            print(
                f"config error: unknown key {key}{hint} (a new key would be +{key}=...)",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(2)


def train_main() -> None:
    import hydra

    from vit.train.distributed import worker_hydra_overrides

    check_group_choices(sys.argv[1:])
    check_override_keys(sys.argv[1:])
    sys.argv.extend(worker_hydra_overrides())  # torchrun ranks > 0: no config copy or log file of their own
    hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")(train_task)()


def evaluate_main() -> None:
    from vit.train.evaluate import main

    sys.exit(main(sys.argv[1:]))
