"""Reading a Hydra multirun folder: each run's overrides, resolved config, metrics.json and TensorBoard curve."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vit.records.sweep_files import FAILED_FILE


@dataclass
class RunRecord:
    path: Path
    name: str  # the run folder relative to the sweep folder: "3", or "a/0" when a sweep was split over folders
    overrides: dict[str, str]
    config: dict
    metrics: dict = field(default_factory=dict)
    val_top1_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, top-1) from TensorBoard
    failure: dict | None = None  # a sweep job that failed: its FAILED_FILE (exit code, line; vit/cli/sweeps.py)

    @property
    def steps(self) -> int | None:
        """Optimizer steps trained (metrics.json), over resumes."""
        steps = self.metrics.get("steps_trained")
        return steps if steps is not None else (self.metrics.get("final") or {}).get("step")

    @property
    def images(self) -> int | None:
        return self.metrics.get("images_trained")

    @property
    def epochs(self) -> int | None:
        return self.metrics.get("epochs_done")

    @property
    def precision(self) -> str | None:
        return self.metrics.get("precision")

    @property
    def final_top1(self) -> float | None:
        final = (self.metrics.get("final") or {}).get("val_top1")
        return final if final is not None else (self.val_top1_curve[-1][1] if self.val_top1_curve else None)

    @property
    def best_top1(self) -> float | None:
        best = (self.metrics.get("best") or {}).get("val_top1")
        return best if best is not None else (max(v for _, v in self.val_top1_curve) if self.val_top1_curve else None)

    @property
    def run_seconds(self) -> float | None:
        """The run's own wall time: metrics.json's wall_time_s less the process start-up it was charged (the first
        run of a train.py process pays the imports; a multirun sweep's later runs do not), so runs compare."""
        wall = self.metrics.get("wall_time_s")
        return None if wall is None else wall - (self.metrics.get("startup_s") or 0.0)

    @property
    def startup_seconds(self) -> float | None:
        return self.metrics.get("startup_s")

    @property
    def final_ema_top1(self) -> float | None:
        """The EMA weights' top-1 after the last epoch (trainer.ema), evaluated beside the raw weights."""
        return (self.metrics.get("final") or {}).get("val_ema_top1")

    @property
    def test_top1(self) -> float | None:
        """With data.holdout: the test split, read once after training (the per-epoch numbers are the holdout's)."""
        return (self.metrics.get("test") or {}).get("top1")

    @property
    def test_ema_top1(self) -> float | None:
        return (self.metrics.get("test") or {}).get("ema_top1")

    @property
    def final_recon_loss(self) -> float | None:
        """A pretraining run (task=mae) has no top-1: its validation reconstruction loss (its task's score)."""
        from vit.tasks import TASKS

        task = TASKS.get(self.metrics.get("task") or "classify")
        return None if task is None or task.classifier else (self.metrics.get("final") or {}).get(task.score)


NULLS = ("null", "None", "~", "")


def knob_value(record: RunRecord, knob: str) -> float | None:
    """The swept value of `knob` as a number, None when it is not one (True/False, names).

    `model.qk_scale=null` means head_dim ** -0.5, so it is placed at that value: (embed_dim / num_heads) ** -0.5
    from the run's resolved config.
    """
    raw = record.overrides.get(knob, record.name if knob == "run" else None)
    if raw in NULLS and knob.endswith("qk_scale"):
        model = record.config.get("model") or {}
        if model.get("embed_dim") and model.get("num_heads"):
            return (int(model["embed_dim"]) // int(model["num_heads"])) ** -0.5
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


def _overrides(run_dir: Path) -> dict[str, str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    items = yaml.safe_load(path.read_text()) if path.is_file() else []
    return dict(item.split("=", 1) for item in items or [] if "=" in item)


def _tb_curve(run_dir: Path) -> list[tuple[int, float]]:
    if not (run_dir / "tb").is_dir():
        return []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0}).Reload()
    if "val/top1" not in events.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in events.Scalars("val/top1")]


def run_config(run_dir: Path) -> dict:
    """The run's resolved config as it trained: a group the run changed after Hydra composed it (the model of
    model.pretrained=timm:<name> or of a picked width, the groups a long run's overrides set) was written beside
    Hydra's composed config (`built_config_file`), which keeps the config it started from."""
    from vit.tasks.build import built_config_file

    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    for group in list(config):
        built = run_dir / built_config_file(group)
        if built.is_file():
            config[group] = yaml.safe_load(built.read_text())
    return config


def read_runs(sweep_dir: str | Path) -> list[RunRecord]:
    """Every run below `sweep_dir` (folders holding .hydra/config.yaml), in Hydra's job order."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"multirun folder {str(sweep_dir)!r} does not exist")
    run_dirs = sorted(
        (p.parent.parent for p in sweep_dir.glob("**/.hydra/config.yaml")),
        key=lambda p: [int(s) if s.isdigit() else s for s in p.relative_to(sweep_dir).parts],
    )
    records = []
    for run_dir in run_dirs:
        metrics_path = run_dir / "metrics.json"
        failed_path = run_dir / FAILED_FILE
        records.append(
            RunRecord(
                path=run_dir,
                name=run_dir.relative_to(sweep_dir).as_posix() if run_dir != sweep_dir else run_dir.name,
                overrides=_overrides(run_dir),
                config=run_config(run_dir),
                metrics=json.loads(metrics_path.read_text()) if metrics_path.is_file() else {},
                val_top1_curve=_tb_curve(run_dir),
                failure=json.loads(failed_path.read_text()) if failed_path.is_file() else None,
            )
        )
    return records


def _spread(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,} to {high:,}"


def unequal_training(records: list[RunRecord]) -> str | None:
    """One line when the runs that trained did not train the same amount (steps or images): then the table compares
    how much each run trained as well as its knobs. None when they are equal, or nothing says."""
    trained = [r for r in records if r.failure is None and r.metrics]
    steps = [r.steps for r in trained if r.steps is not None]
    images = [r.images for r in trained if r.images is not None]
    if len(set(steps)) <= 1 and len(set(images)) <= 1:
        return None
    amounts = [f"{_spread(steps)} steps" if steps else "", f"{_spread(images)} images" if images else ""]
    budgeted = any((r.config.get("trainer") or {}).get("budget") for r in trained)
    why = (
        "a time budget per job ends each run when its time is up, so a slower or busier job trains less"
        if budgeted
        else "their settings (epochs, batch, data) differ"
    )
    return (
        f"note: these runs trained different amounts ({', '.join(a for a in amounts if a)}): {why}; the top-1 "
        "below compares the training as well as the knobs (give every job the same trainer.epochs, or "
        "trainer.max_steps, to compare like with like)"
    )


def failure_lines(records: list[RunRecord]) -> list[str]:
    """One line per job of the sweep that failed: its folder, its overrides and the line it ended with."""
    return [
        f"- {r.name} ({' '.join(r.failure.get('overrides') or []) or 'no overrides'}): exit "
        f"{r.failure.get('exit_code')}, {r.failure.get('line')}"
        for r in records
        if r.failure is not None
    ]


def swept_keys(records: list[RunRecord]) -> list[str]:
    """Override keys whose value differs between runs: the knobs of the sweep (not search.*, which an Optuna search
    sets to name each run's study and trial)."""
    keys = sorted({k for r in records for k in r.overrides if not k.startswith("search.")})
    return [k for k in keys if len({r.overrides.get(k) for r in records}) > 1]


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def split_label(records: list[RunRecord]) -> str:
    """ "holdout " when every run evaluated a slice held out of the training set (data.holdout), else ""."""
    splits = {r.metrics.get("val_split") for r in records}
    return "holdout " if splits == {"holdout"} else ""


def _extra_accuracies(records: list[RunRecord]) -> list[tuple[str, str, str]]:
    """(column, RunRecord property, format) for the scores some run has: EMA, the test split read after training,
    and a pretraining run's reconstruction loss."""
    columns = [
        ("final EMA top-1", "final_ema_top1", ".2f"),
        ("test top-1", "test_top1", ".2f"),
        ("test EMA top-1", "test_ema_top1", ".2f"),
        ("final reconstruction loss", "final_recon_loss", ".4f"),
    ]
    return [column for column in columns if any(getattr(r, column[1]) is not None for r in records)]


SEED_KEY = "trainer.seed"
MAX_KNOB_COLUMNS = 3  # more swept keys than this (a screen of unrelated levers): one "overrides" column instead


def knob_cells(records: list[RunRecord], knobs: list[str]) -> tuple[list[str], Callable[[RunRecord], list[str]]]:
    """The header and a row's cells for the swept `knobs`: a column each, or, for a screen of many unrelated levers
    (each run setting one or two of many keys), one column with the run's own swept overrides ("-": none of them)."""
    if len([k for k in knobs if k != SEED_KEY]) <= MAX_KNOB_COLUMNS:  # seeds are grouped, not levers
        return knobs, lambda record: [record.overrides.get(k, "-") for k in knobs]

    def overrides(record: RunRecord) -> list[str]:
        return [" ".join(f"{k}={record.overrides[k]}" for k in knobs if k in record.overrides) or "-"]

    return ["overrides"], overrides


def screen_settings(records: list[RunRecord]) -> list[tuple[str, list[float]]] | None:
    """For a screen of unrelated levers (more than MAX_KNOB_COLUMNS swept keys besides the seed): each setting's
    overrides ("-" for the baseline, listed first) and its runs' final top-1; None for a sweep of a few knobs."""
    knobs = [k for k in swept_keys(records) if k != SEED_KEY]
    if len(knobs) <= MAX_KNOB_COLUMNS:
        return None
    _, cells = knob_cells(records, knobs)
    settings: dict[str, list[float]] = {}
    for record in records:
        finals = settings.setdefault(cells(record)[0], [])
        if record.final_top1 is not None:
            finals.append(record.final_top1)
    return sorted(settings.items(), key=lambda item: item[0] != "-")


def summary_rows(records: list[RunRecord]) -> tuple[list[str], list[list[str]]]:
    knob_header, cells = knob_cells(records, swept_keys(records))
    split = split_label(records)
    extras = _extra_accuracies(records)
    startups = any(record.startup_seconds for record in records)  # its own column: paid once per process
    header = [
        "run",
        *knob_header,
        "params (M)",
        "GMACs",
        "img/s",
        "steps",
        "images",
        "epochs",
        "precision",
        f"final {split}top-1",
        f"best {split}top-1",
        *[name for name, _, _ in extras],
        "run s",
        *(["start-up s"] if startups else []),
    ]
    rows = []
    for record in records:
        m = record.metrics
        rows.append(
            [
                record.name,
                *cells(record),
                _fmt(m.get("params") and m["params"] / 1e6, ".2f"),
                _fmt(m.get("macs") and m["macs"] / 1e9, ".3f"),
                _fmt(m.get("train_img_per_s"), ",.0f"),
                _fmt(record.steps, ","),
                _fmt(record.images, ","),
                _fmt(record.epochs, "d"),
                record.precision or ("failed" if record.failure else "-"),
                _fmt(record.final_top1, ".2f"),
                _fmt(record.best_top1, ".2f"),
                *[_fmt(getattr(record, attr), fmt) for _, attr, fmt in extras],
                _fmt(record.run_seconds, ".1f"),
                *([_fmt(record.startup_seconds, ".1f")] if startups else []),
            ]
        )
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def seed_rows(records: list[RunRecord]) -> tuple[list[str], list[list[str]]] | None:
    """The runs of a sweep that also varies `trainer.seed`, grouped by their other knobs: the number of seeds,
    the mean final top-1 with its min-max range (and its difference to the baseline's mean where one setting sets
    none of the swept keys: a lever screen's baseline), the means of the EMA and test-split accuracies where the
    runs have them, and the mean wall time. None when the seed is not swept."""
    knobs = swept_keys(records)
    if SEED_KEY not in knobs:
        return None
    knob_header, cells = knob_cells(records, [k for k in knobs if k != SEED_KEY])
    groups: dict[tuple, list[RunRecord]] = {}
    for record in records:
        groups.setdefault(tuple(cells(record)), []).append(record)
    extras = _extra_accuracies(records)
    split = split_label(records)

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    baseline_key = tuple("-" for _ in knob_header)  # the setting with none of the swept keys
    baseline = [r.final_top1 for r in groups.get(baseline_key, []) if r.final_top1 is not None]
    baseline_mean = mean(baseline) if len(groups) > 1 else None
    header = [
        *knob_header,
        "seeds",
        f"final {split}top-1 mean",
        "min - max",
        *(["vs baseline"] if baseline_mean is not None else []),
        *[f"{n} mean" for n, _, _ in extras],
        "run s mean",
    ]

    rows = []
    for key, group in groups.items():
        finals = [r.final_top1 for r in group if r.final_top1 is not None]
        walls = [r.run_seconds for r in group if r.run_seconds is not None]
        final_mean = mean(finals)
        vs_baseline = None if final_mean is None or baseline_mean is None else final_mean - baseline_mean
        rows.append(
            [
                *key,
                str(len(finals)),
                _fmt(final_mean, ".2f"),
                f"{min(finals):.2f} - {max(finals):.2f}" if finals else "-",
                *([_fmt(vs_baseline, "+.2f")] if baseline_mean is not None else []),
                *[
                    _fmt(mean([v for r in group if (v := getattr(r, attr)) is not None]), fmt)
                    for _, attr, fmt in extras
                ],
                _fmt(mean(walls), ".1f"),
            ]
        )
    return header, rows
