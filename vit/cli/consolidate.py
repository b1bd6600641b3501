"""Write a sharded checkpoint (the folder a `trainer.strategy=fsdp` run writes) as one file.

usage: vit-consolidate checkpoint=<sharded checkpoint folder, or its last.pt/best.pt/epoch_NNNN.pt link> [out=<file>]

The file holds what a single-file checkpoint of this trainer holds (weights, EMA, optimizer state, schedule,
step, config, classes, history), with whole tensors, read in this one process; default out: the link's name with
`.consolidated.pt` in place of `.pt`, beside it (checkpoints/last.consolidated.pt). It resumes under
trainer.strategy=ddp or in one process (its optimizer state is keyed by parameter name), and every tool that takes
a checkpoint reads it; those tools read the folder itself too, so this is for copying a run elsewhere or for a
consumer outside this project.

Example:

    torchrun --standalone --nproc_per_node=2 train.py model=vit_tiny data=cifar10 trainer.strategy=fsdp \
        trainer.device=cpu trainer.epochs=1 hydra.run.dir=runs/sharded
    vit-consolidate checkpoint=runs/sharded/checkpoints/last.pt
"""

from __future__ import annotations

import sys
from pathlib import Path

from vit.cli.args import Key, keys_help, parse_args, refuse_positional, run_script
from vit.errors import UsageError
from vit.records.files import atomic_save
from vit.weights.read import load_checkpoint
from vit.weights.sharded import is_sharded_checkpoint

KEYS = {
    "checkpoint": Key("a sharded checkpoint folder, or its last.pt/best.pt/epoch_NNNN.pt link", kind="path"),
    "out": Key("the file (default: <name>.consolidated.pt beside it)", kind="path"),
}


def main(argv: list[str]) -> int:
    refuse_positional(argv, lambda paths: f"checkpoint={paths[0]}")
    options = parse_args(argv, KEYS, required=("checkpoint",))
    source = Path(options["checkpoint"])
    if not is_sharded_checkpoint(source):
        what = "a single file already" if source.is_file() else "not a sharded checkpoint folder"
        raise UsageError(f"checkpoint={str(source)!r} is {what} (a folder holding DCP's .metadata and training.pt)")
    out = Path(options["out"]) if options["out"] else source.with_name(f"{source.stem}.consolidated.pt")
    if out.resolve() == source.resolve() or source.resolve() in out.resolve().parents:
        raise UsageError(f"out={str(out)!r} is inside the sharded checkpoint it is written from")
    state = load_checkpoint(source)
    atomic_save(state, out)
    tensors = sum(value.numel() for value in state["model"].values())
    print(f"consolidated {source} (step {state.get('step')}, {tensors:,} model values) -> {out}")
    return 0


def console() -> None:
    """`vit-consolidate`."""
    sys.exit(run_script(main, usage=__doc__, keys=keys_help(KEYS)))
