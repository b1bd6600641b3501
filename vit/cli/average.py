"""Average the weights of several checkpoints of one run into a new checkpoint.

usage: vit-average run=<run folder> [last=<N>] [ema=auto|true|false] [out=<file>]
       vit-average checkpoints=<a.pt,b.pt,...> [last=<N>] [ema=auto|true|false] [out=<file>]

`run=`: the run folder's kept epoch checkpoints (checkpoints/epoch_NNNN.pt, written with trainer.keep_last=N) are
averaged; `checkpoints=`: the files listed, comma-separated, oldest first; `last=<N>`: only the newest N. The result
(`out`; default: <run folder>/checkpoints/averaged.pt, else averaged.pt beside the first file) holds the mean of
each tensor and the run's config and classes, so vit-eval, vit-export and
`model.pretrained=<file>` read it like any checkpoint of this trainer; it holds no optimizer state, so it does not
resume.

Weights: {ema_rule} Here the first checkpoint decides for all of them, and every one must hold the weights chosen;
the average is written as the result's weights (its `ema` is empty: ema=auto reads them back).

Example:

    python train.py model=vit_tiny data=cifar10 trainer.epochs=30 trainer.keep_last=5 hydra.run.dir=runs/tiny
    vit-average run=runs/tiny last=5
    vit-eval checkpoint=runs/tiny/checkpoints/averaged.pt
"""

from __future__ import annotations

import sys
from pathlib import Path

from vit.cli.args import Key, keys_help, parse_args, refuse_positional, run_script
from vit.cli.tool_keys import EMA
from vit.deploy.loaded_model import ema_option, with_ema_rule
from vit.errors import UsageError
from vit.records.files import atomic_save
from vit.train.averaging import average_checkpoints
from vit.train.checkpoints import EPOCH_FILE
from vit.weights.sharded import is_sharded_checkpoint


def kept_epochs(run_dir: Path) -> list[Path]:
    folder = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    numbered = sorted((int(m.group(1)), p) for p in folder.glob("epoch_*.pt") if (m := EPOCH_FILE.fullmatch(p.name)))
    if not numbered:
        raise UsageError(f"{str(folder)!r} holds no epoch checkpoints (epoch_NNNN.pt: train with trainer.keep_last=N)")
    return [path for _, path in numbered]


KEYS = {
    "run": Key("a run folder: its kept epoch checkpoints (checkpoints/epoch_NNNN.pt)", kind="path"),
    "checkpoints": Key("checkpoint files, oldest first", several=True),
    "last": Key("only the newest n", kind="int", low=1),
    "ema": EMA,
    "out": Key("the averaged checkpoint (default: <run>/checkpoints/averaged.pt)", kind="path"),
}


def positional_form(paths: list[str]) -> str:
    """The key=value form of paths given without a key: a run folder, or checkpoint files."""
    if len(paths) == 1 and Path(paths[0]).is_dir():
        return f"run={paths[0]}"
    return f"checkpoints={','.join(paths)}"


def main(argv: list[str]) -> int:
    refuse_positional(argv, positional_form)
    options = parse_args(argv, KEYS)
    which = {None: "auto", True: "ema", False: "raw"}[ema_option(options["ema"])]  # averaging's names, EMA_RULE
    run, files = options["run"], options["checkpoints"]
    if bool(run) == bool(files):
        raise UsageError(
            "give run=<run folder> or checkpoints=<a.pt,b.pt,...>" + (", not both" if run else " (see --help)")
        )
    if run:
        if not Path(run).is_dir():
            raise UsageError(f"run={run}: no such folder (a run folder, its kept checkpoints in checkpoints/)")
        paths = kept_epochs(Path(run))
        default_out = paths[0].parent / "averaged.pt"
    else:
        paths = [Path(path) for path in files if path]
        missing = [str(p) for p in paths if not (p.is_file() or is_sharded_checkpoint(p))]
        if missing:
            raise UsageError(f"checkpoints=: no such checkpoint file: {missing[0]!r}")
        default_out = paths[0].parent / "averaged.pt"
    if options["last"] is not None:
        paths = paths[-int(options["last"]) :]
    out = Path(options["out"]) if options["out"] else default_out
    if out.resolve() in {p.resolve() for p in paths}:
        raise UsageError(f"out={str(out)!r} is one of the checkpoints being averaged")
    averaged = average_checkpoints(paths, which)
    atomic_save(averaged, out)
    names = ", ".join(p.name for p in paths)
    print(f"averaged the {averaged['averaged_from']['weights']} weights of {len(paths)} checkpoints ({names}) -> {out}")
    return 0


def console() -> None:
    """`vit-average`."""
    sys.exit(run_script(main, usage=with_ema_rule(__doc__), keys=keys_help(KEYS)))
