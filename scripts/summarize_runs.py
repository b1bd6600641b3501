"""Summarise a Hydra multirun.

usage: python scripts/summarize_runs.py <multirun folder> [out=<folder>]

Writes summary.md (one row per run: swept knobs, params, FLOPs, img/s, final/best val top-1, the EMA's and the
test split's top-1 where runs have them, wall time; when `trainer.seed` is swept too, each setting's mean and
min-max over the seeds; a screen of more than three unrelated knobs gets one "overrides" column) and summary.png
(val top-1 against the swept knob; for a screen, each setting's seeds in a row) into the multirun folder (or
`out=`), and prints the table.

Example:

    python train.py -m model=vit_tiny model.lsa=false,true trainer.seed=0,1
    python scripts/summarize_runs.py multirun/<date>/<time>
"""

from __future__ import annotations

import sys
from pathlib import Path

from vit.analysis.figures import screen_figure, sweep_figure
from vit.analysis.runs import (
    SEED_KEY,
    markdown_table,
    read_runs,
    screen_settings,
    seed_rows,
    split_label,
    summary_rows,
    swept_keys,
)
from vit.args import UsageError, parse_args, run_script


def main(argv: list[str]) -> int:
    if not argv or "=" in argv[0]:
        raise UsageError("usage: python scripts/summarize_runs.py <multirun folder> [out=<folder>]")
    sweep_dir = Path(argv[0])
    options = parse_args(argv[1:], {"out": None})
    records = read_runs(sweep_dir)
    if not records:
        raise UsageError(f"{str(sweep_dir)!r} holds no runs (no */.hydra/config.yaml)")
    out = Path(options["out"]) if options["out"] else sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    header, rows = summary_rows(records)
    table = markdown_table(header, rows)
    seeds = seed_rows(records)
    if seeds is not None:  # a sweep over seeds too: each setting's mean and range
        table += "\n\nOver seeds:\n\n" + markdown_table(*seeds)
    (out / "summary.md").write_text(f"# Sweep {sweep_dir}\n\n{table}\n")
    screen = screen_settings(records)
    if screen is not None:  # a screen of unrelated levers: each setting's seeds in a row
        screen_figure(screen, out / "summary.png", xlabel=f"final {split_label(records) or 'val '}top-1 (%)")
    else:
        knobs = [k for k in swept_keys(records) if k != SEED_KEY] or swept_keys(records)
        sweep_figure(records, knobs, out / "summary.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
