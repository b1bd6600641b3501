"""Average the weights of several checkpoints of one run into a new checkpoint.

usage: vit-average <run folder | checkpoint files...> [last=<N>] [ema=auto|true|false]
       [out=<file>]
(in a checkout, without installing: python scripts/average_checkpoints.py with the same arguments)

With a run folder, its kept epoch checkpoints (checkpoints/epoch_NNNN.pt, written with trainer.keep_last=N) are
averaged, the newest `last` of them when given. The result (default: <run folder>/checkpoints/averaged.pt, else
averaged.pt beside the first file) holds the mean of each tensor and the run's config and classes, so
scripts/evaluate.py, scripts/export.py and `model.pretrained=<file>` read it like any checkpoint of this trainer;
it holds no optimizer state, so it does not resume.

Weights: {ema_rule} Here the first checkpoint decides for all of them, and every one must hold the weights chosen;
the average is written as the result's weights (its `ema` is empty: ema=auto reads them back).

Example:

    python train.py model=vit_tiny data=cifar10 trainer.epochs=30 trainer.keep_last=5 hydra.run.dir=runs/tiny
    vit-average runs/tiny last=5
    python scripts/evaluate.py checkpoint=runs/tiny/checkpoints/averaged.pt
"""

from __future__ import annotations

import sys
from pathlib import Path

from vit.cli.args import parse_args, run_script
from vit.deploy.weights import ema_option, with_ema_rule
from vit.engine.files import atomic_save
from vit.errors import UsageError
from vit.train.averaging import average_checkpoints
from vit.train.checkpoints import EPOCH_FILE


def kept_epochs(run_dir: Path) -> list[Path]:
    folder = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    numbered = sorted((int(m.group(1)), p) for p in folder.glob("epoch_*.pt") if (m := EPOCH_FILE.fullmatch(p.name)))
    if not numbered:
        raise UsageError(f"{str(folder)!r} holds no epoch checkpoints (epoch_NNNN.pt: train with trainer.keep_last=N)")
    return [path for _, path in numbered]


def main(argv: list[str]) -> int:
    sources = [arg for arg in argv if "=" not in arg]
    options = parse_args([arg for arg in argv if "=" in arg], {"last": None, "ema": None, "out": None})
    if not sources:
        raise UsageError("give a run folder or checkpoint files (see --help)")
    if len(sources) == 1 and Path(sources[0]).is_dir():
        paths = kept_epochs(Path(sources[0]))
        default_out = (paths[0].parent / "averaged.pt") if paths else None
    else:
        paths = [Path(source) for source in sources]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise UsageError(f"no such checkpoint file: {missing[0]!r}")
        default_out = paths[0].parent / "averaged.pt"
    if options["last"] is not None:
        if not str(options["last"]).isdigit() or int(options["last"]) < 1:
            raise UsageError(f"last={options['last']!r} must be a whole number >= 1")
        paths = paths[-int(options["last"]) :]
    out = Path(options["out"]) if options["out"] else default_out
    if out.resolve() in {p.resolve() for p in paths}:
        raise UsageError(f"out={str(out)!r} is one of the checkpoints being averaged")
    # averaging's own names for the same three choices (EMA_RULE): auto, ema, raw
    which = {None: "auto", True: "ema", False: "raw"}[ema_option(options["ema"])]
    averaged = average_checkpoints(paths, which)
    atomic_save(averaged, out)
    names = ", ".join(p.name for p in paths)
    print(f"averaged the {averaged['averaged_from']['weights']} weights of {len(paths)} checkpoints ({names}) -> {out}")
    return 0


def console() -> None:
    """`vit-average` (and `python scripts/average_checkpoints.py` in a checkout)."""
    sys.exit(run_script(main, usage=with_ema_rule(__doc__)))
