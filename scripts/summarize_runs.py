"""Summarise a Hydra multirun.

usage: python scripts/summarize_runs.py <multirun folder> [out=<folder>] [storage=<database URL>]

Writes summary.md (one row per run: swept knobs, params, FLOPs, img/s, the steps, images and epochs it trained and
its precision (a line above the table when the runs trained different amounts), final/best val top-1, the EMA's and the
test split's top-1 where runs have them, the run's own seconds (`run s`: its wall time less the process start-up
it was charged, which the first run of a multirun process pays alone; that start-up gets a column of its own);
when `trainer.seed` is swept too, each setting's mean and
min-max over the seeds; a screen of more than three unrelated knobs gets one "overrides" column; the jobs that
failed below it, with the line each ended with) and summary.png (val top-1 against the swept knob, the seeds'
mean and range where there are several, from chance or 0; for a screen, each setting's seeds in a row) into the
multirun folder (or `out=`), and prints the table.

An Optuna search's folder (python train.py -m hparams_search=...) holds its study in optuna.db: summary.md then
starts with the study (trials complete/pruned/failed, the trial-epochs pruning saved, the best trial, Optuna's
parameter importances with the number of complete trials behind them, shown from 10 trials and two per parameter
on, a table of every trial). `storage=` reads a study kept elsewhere (postgresql://...).

Example:

    python train.py -m model=vit_tiny model.lsa=false,true trainer.seed=0,1
    python scripts/summarize_runs.py multirun/<date>/<time>
    python scripts/summarize_runs.py multirun/search/cifar10_proxy
"""

from __future__ import annotations

import sys
from pathlib import Path

from vit.analysis.plots import screen_figure, sweep_figure
from vit.analysis.runs import (
    SEED_KEY,
    failure_lines,
    markdown_table,
    read_runs,
    screen_settings,
    seed_rows,
    split_label,
    summary_rows,
    swept_keys,
    unequal_training,
)
from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.search.report import STUDY_FILE, load_studies, search_report, study_url


def main(argv: list[str]) -> int:
    if not argv or "=" in argv[0]:
        raise UsageError(
            "usage: python scripts/summarize_runs.py <multirun folder> [out=<folder>] [storage=<database URL>]"
        )
    sweep_dir = Path(argv[0])
    options = parse_args(argv[1:], {"out": None, "storage": None})
    records = read_runs(sweep_dir)
    studies = read_studies(sweep_dir, options["storage"])
    if not records and not studies:
        raise UsageError(f"{str(sweep_dir)!r} holds no runs (no */.hydra/config.yaml) and no study ({STUDY_FILE})")
    out = Path(options["out"]) if options["out"] else sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    text = "".join(search_report(study, sweep_dir) + "\n" for study in studies)
    if records:
        text += runs_summary(records, out)
    (out / "summary.md").write_text(f"# Sweep {sweep_dir}\n\n{text}")
    print(text, end="")
    return 0


def read_studies(sweep_dir: Path, storage: str | None) -> list:
    """The studies of an Optuna search's database: the one given, else the folder's optuna.db; none without."""
    url = study_url(sweep_dir, storage)
    if url is None:
        return []
    try:
        return load_studies(url)
    except ImportError:
        raise UsageError("reading a search's study needs optuna: pip install -e '.[search]'") from None
    except Exception as err:  # SQLAlchemy's errors: a bad URL, a file that is not a study database
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"cannot read the study in {url}: {reason}") from None


def runs_summary(records: list, out: Path) -> str:
    """The table of runs (and over seeds) with a line above it when they trained different amounts and the failed
    jobs below it, and summary.png."""
    header, rows = summary_rows(records)
    note = unequal_training(records)
    table = (f"{note}\n\n" if note else "") + markdown_table(header, rows)
    failures = failure_lines(records)
    if failures:
        table += "\n\nFailed jobs:\n\n" + "\n".join(failures)
    seeds = seed_rows(records)
    if seeds is not None:  # a sweep over seeds too: each setting's mean and range
        table += "\n\nOver seeds:\n\n" + markdown_table(*seeds)
    screen = screen_settings(records)
    if screen is not None:  # a screen of unrelated levers: each setting's seeds in a row
        screen_figure(screen, out / "summary.png", xlabel=f"final {split_label(records) or 'val '}top-1 (%)")
    else:
        knobs = [k for k in swept_keys(records) if k != SEED_KEY] or swept_keys(records)
        sweep_figure(records, knobs, out / "summary.png")
    return table + "\n"


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
