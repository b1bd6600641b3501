"""Compare training recipes.

usage: python lab/plot_recipes.py <run or multirun folder> [<more> ...] [out=<folder>]
    [anchor=<seconds>:<top1>[:<label>] ...] [goal=<seconds>:<top1>[:<label>] ...]

Finds every finished run below the folders (metrics.json next to .hydra/config.yaml), groups them into recipes by
their `experiment=` override (split further by any other override that differs, never by `trainer.seed`), and
writes into `out=` (default: the folder, when one is given; required with several):

- recipes.md: one row per recipe: model, params, GMACs per image, epochs, wall time (mean, min - max), training
  img/s, test top-1 as mean ± half the min-max range over seeds with each seed's value, and the seed count. The test
  top-1 is the test split evaluated once after training (`test.top1`, with data.holdout); without a holdout the
  last epoch's val top-1, marked †. metrics.json's `best` is never read (see lab/recipes.py).
- recipes.png: top-1 against wall-clock seconds (log scale): each run's per-epoch validation curve, its final
  test top-1 as a dot, one colour per recipe.

`anchor=` and `goal=` may be given any number of times; the label may contain colons and spaces (quote it).
Example:

    python lab/plot_recipes.py multirun/2025-01-01/10-00-00 outputs/plain out=docs/figures \\
        anchor=326:81.4:"plain pipeline (timm + torchvision)" goal=60:81.4 goal=300:90 goal=480:94

Prints the table and its notes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from recipes import CAPTION, find_runs, group_recipes, parse_point, recipes_figure, recipes_markdown

from vit.cli.args import parse_args, run_script
from vit.errors import UsageError

USAGE = (
    "usage: python lab/plot_recipes.py <run or multirun folder> [<more> ...] [out=<folder>] "
    "[anchor=<seconds>:<top1>[:<label>] ...] [goal=<seconds>:<top1>[:<label>] ...]"
)
POINT_KEYS = ("anchor", "goal")


def main(argv: list[str]) -> int:
    # Folders are the arguments without "=" (or existing paths that happen to hold one); the rest are options.
    folders = [a for a in argv if "=" not in a or Path(a).exists()]
    options = [a for a in argv if a not in folders]
    points = {
        key: [parse_point(a.split("=", 1)[1], key) for a in options if a.startswith(f"{key}=")] for key in POINT_KEYS
    }
    options = [a for a in options if a.split("=", 1)[0] not in POINT_KEYS]
    out = parse_args(options, {"out": None, **dict.fromkeys(POINT_KEYS)})["out"]
    if not folders:
        raise UsageError(USAGE)
    records = []
    for folder in folders:
        if not Path(folder).exists():
            raise UsageError(f"{folder!r} does not exist")
        found = find_runs(folder)
        if not found:
            raise UsageError(f"{folder!r} holds no finished runs (no folder with metrics.json and .hydra/config.yaml)")
        records += [r for r in found if r.path.resolve() not in {s.path.resolve() for s in records}]
    if out is None and len(folders) > 1:
        raise UsageError(f"with {len(folders)} folders, say where to write: out=<folder>")
    out = Path(out or folders[0])
    out.mkdir(parents=True, exist_ok=True)
    recipes = group_recipes(records)
    table = recipes_markdown(recipes)
    runs = ", ".join(f"`{f}`" for f in folders)
    figure = "![test top-1 against wall-clock seconds](recipes.png)"
    (out / "recipes.md").write_text(f"# Recipes\n\nRuns: {runs}\n\n{CAPTION}\n\n{table}\n\n{figure}\n")
    recipes_figure(recipes, points["anchor"], points["goal"], out / "recipes.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
