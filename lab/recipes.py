"""Training recipes side by side: finished runs grouped by recipe and seed, one table row per recipe.

A recipe is the `experiment=<name>` of a run's command line (.hydra/overrides.yaml; without one, the run folder's
name, or its parent's when the folder is a multirun job number). Runs of one experiment that differ in some other
override (`trainer.epochs=1`, `data.holdout=5000`) are different recipes, named with those of the differing
overrides that their command line gave (`cifar10_fast (trainer.epochs=1)` next to `cifar10_fast`); only
`trainer.seed` (and `hydra.*`) may vary inside a recipe.

The accuracy reported is the test split's, evaluated once after the last epoch: `test.top1` of metrics.json when
data.holdout set a validation slice aside. Without a holdout the per-epoch validation split *is* the test split, and
the last epoch's `val_top1` stands in (flagged with a dagger). metrics.json's `best` entry is dropped as it is read:
an epoch chosen by its test accuracy is no result.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import yaml
from matplotlib.lines import Line2D

from vit.analysis.runs import RunRecord, markdown_table, run_config
from vit.errors import UsageError
from vit.tasks.figures import save

SEED_KEY = "trainer.seed"
EXPERIMENT_KEYS = ("experiment", "+experiment", "++experiment")
FALLBACK_MARK = "†"

CAPTION = (
    "test top-1: the final weights on the test split, evaluated once after the last epoch; mean ± half the "
    "min-max range over the seeds, then each seed's value. GMACs: multiply-adds per image, forward pass (the "
    "training log's unit). "
    "wall s: process start to the end of the final evaluation (mean, and min - max over the seeds). "
    "img/s: training images per second, mean over epochs and seeds."
)


@dataclass
class RecipeRun:
    record: RunRecord
    seed: int | None
    test_top1: float | None  # None: left out of the statistics, `problem` says why
    ema_top1: float | None = None  # the EMA weights' test top-1, when the run kept an EMA
    from_val: bool = False  # no held-out slice: the last epoch's val top-1 (the test split) stands in
    problem: str | None = None

    @property
    def metrics(self) -> dict:
        return self.record.metrics

    @property
    def wall_time_s(self) -> float | None:
        return self.metrics.get("wall_time_s")

    @property
    def curve(self) -> list[tuple[float, float]]:
        """(seconds from the process start, val top-1) at the end of each epoch's evaluation."""
        history = self.metrics.get("history") or []
        return [
            (r["elapsed_s"], r["val_top1"])
            for r in history
            if r.get("elapsed_s") is not None and r.get("val_top1") is not None  # epochs without an evaluation
        ]


@dataclass
class Recipe:
    name: str
    runs: list[RecipeRun] = field(default_factory=list)

    @property
    def done(self) -> list[RecipeRun]:
        """The runs that count: finished, with a test top-1; in seed order."""
        kept = [r for r in self.runs if r.test_top1 is not None]
        return sorted(kept, key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0))

    @property
    def seeds(self) -> list[int | None]:
        return sorted({r.seed for r in self.done}, key=lambda s: (s is None, s or 0))


@dataclass
class Point:
    """A marker on the figure: an outside result (`anchor=`) or a target (`goal=`)."""

    seconds: float
    top1: float
    label: str


# Reading runs -------------------------------------------------------------------------------------------------


def _natural(path: Path, root: Path) -> list:
    return [(0, int(s), "") if s.isdigit() else (1, 0, s) for s in path.relative_to(root).parts]


def find_runs(path: str | Path) -> list[RunRecord]:
    """Every finished run at or below `path`: folders holding both metrics.json and .hydra/config.yaml."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    run_dirs = sorted(
        {p.parent.parent for p in root.glob("**/.hydra/config.yaml") if (p.parent.parent / "metrics.json").is_file()},
        key=lambda p: _natural(p, root),
    )
    records = []
    for run_dir in run_dirs:
        overrides_path = run_dir / ".hydra" / "overrides.yaml"
        items = yaml.safe_load(overrides_path.read_text()) if overrides_path.is_file() else []
        metrics = json.loads((run_dir / "metrics.json").read_text())
        metrics.pop("best", None)  # the epoch with the best val top-1: chosen on the split it reports, never used
        records.append(
            RunRecord(
                path=run_dir,
                name=run_dir.as_posix(),
                overrides=dict(item.split("=", 1) for item in items or [] if "=" in item),
                config=run_config(run_dir),  # the model built, where the run picked its width
                metrics=metrics,
            )
        )
    return records


def experiment_name(record: RunRecord) -> str:
    for key in EXPERIMENT_KEYS:
        if record.overrides.get(key):
            return record.overrides[key]
    folder = record.path.resolve()
    while folder.name.isdigit() and folder.parent != folder:  # a multirun job number says nothing
        folder = folder.parent
    return folder.name


def _seed(record: RunRecord) -> int | None:
    value = (record.config.get("trainer") or {}).get("seed", record.overrides.get(SEED_KEY))
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def recipe_run(record: RunRecord) -> RecipeRun:
    """The run's test top-1, or why it has none that can be reported."""
    m, config = record.metrics, record.config
    run = RecipeRun(record=record, seed=_seed(record), test_top1=None)
    planned = (config.get("trainer") or {}).get("epochs")
    done = m.get("epochs_done", len(m.get("history") or []))
    budget = m.get("budget")  # trainer.budget: the plan's steps, not trainer.epochs (its upper bound), end the run
    if budget is not None and budget["trained_steps"] < budget["planned_steps"]:
        run.problem = f"stopped after {budget['trained_steps']} of {budget['planned_steps']} planned steps"
    elif budget is None and planned is not None and done < planned:
        run.problem = f"stopped after {done} of {planned} epochs"
    elif m.get("test"):
        run.test_top1, run.ema_top1 = m["test"].get("top1"), m["test"].get("ema_top1")
    elif m.get("val_split") == "holdout" or (config.get("data") or {}).get("holdout") is not None:
        run.problem = "held out a validation slice but has no test result"
    else:  # no holdout: the validation split of every epoch was the test split
        final = m.get("final") or {}
        run.test_top1, run.ema_top1, run.from_val = final.get("val_top1"), final.get("val_ema_top1"), True
        if run.test_top1 is None:
            run.problem = "no final val top-1"
    return run


def _varying(keys_of: list[dict[str, str]]) -> list[str]:
    keys = sorted({k for o in keys_of for k in o if k != SEED_KEY and not k.startswith("hydra.")})
    return [k for k in keys if len({o.get(k) for o in keys_of}) > 1 and k not in EXPERIMENT_KEYS]


def group_recipes(records: list[RunRecord]) -> list[Recipe]:
    """Runs grouped by experiment, split further by any other override that differs between them; in the order
    the recipes first appear."""
    by_experiment: dict[str, list[RunRecord]] = {}
    for record in records:
        by_experiment.setdefault(experiment_name(record), []).append(record)
    recipes: dict[str, Recipe] = {}
    for experiment, group in by_experiment.items():
        varying = _varying([r.overrides for r in group])
        for record in group:
            extra = ", ".join(f"{k}={record.overrides[k]}" for k in varying if k in record.overrides)
            name = f"{experiment} ({extra})" if extra else experiment
            recipes.setdefault(name, Recipe(name)).runs.append(recipe_run(record))
    return list(recipes.values())


# The table ----------------------------------------------------------------------------------------------------


def mean_spread(values: list[float]) -> tuple[float, float]:
    """Mean and half the min-max range."""
    return sum(values) / len(values), (max(values) - min(values)) / 2


def _seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _distinct(values, spec: str) -> str:
    shown = list(dict.fromkeys(format(v, spec) for v in values if v is not None))
    return ", ".join(shown) or "-"


def _top1(values: list[float], mark: str) -> str:
    if not values:
        return "-"
    mean, spread = mean_spread(values)
    return (f"{mean:.2f} ± {spread:.2f}" if len(values) > 1 else f"{mean:.2f}") + mark


def recipe_rows(recipes: list[Recipe]) -> tuple[list[str], list[list[str]]]:
    with_ema = any(r.ema_top1 is not None for recipe in recipes for r in recipe.done)
    header = ["recipe", "model", "params (M)", "GMACs", "epochs", "wall s", "wall s min - max", "img/s"]
    header += ["test top-1", "per seed (seed: top-1)", *(["EMA test top-1"] if with_ema else []), "seeds"]
    rows = []
    for recipe in recipes:
        done = recipe.done
        ms = [r.metrics for r in done]
        mark = FALLBACK_MARK if any(r.from_val for r in done) else ""
        walls = [r.wall_time_s for r in done if r.wall_time_s is not None]
        speeds = [m["train_img_per_s"] for m in ms if m.get("train_img_per_s") is not None]
        epochs = sorted({m.get("epochs_done") for m in ms if m.get("epochs_done") is not None})
        seeds = len(recipe.seeds)
        row = [
            recipe.name,
            ", ".join(dict.fromkeys(str(m.get("model", "-")) for m in ms)) or "-",
            _distinct([m.get("params") and m["params"] / 1e6 for m in ms], ".2f"),
            _distinct([m.get("macs") and m["macs"] / 1e9 for m in ms], ".3f"),
            "-" if not epochs else f"{epochs[0]}" if len(epochs) == 1 else f"{epochs[0]} - {epochs[-1]}",
            _seconds(sum(walls) / len(walls)) if walls else "-",
            f"{_seconds(min(walls))} - {_seconds(max(walls))}" if walls else "-",
            f"{sum(speeds) / len(speeds):,.0f}" if speeds else "-",
            _top1([r.test_top1 for r in done], mark),
            ", ".join(f"{'?' if r.seed is None else r.seed}: {r.test_top1:.2f}" for r in done) or "-",
        ]
        if with_ema:
            row.append(_top1([r.ema_top1 for r in done if r.ema_top1 is not None], mark))
        row.append(f"{seeds} ({len(done)} runs)" if len(done) != seeds else str(seeds))
        rows.append(row)
    return header, rows


def recipe_notes(recipes: list[Recipe]) -> list[str]:
    """The table's footnotes: the recipes whose test top-1 is the last epoch's val top-1, the runs left out."""
    notes = []
    fallback = [recipe.name for recipe in recipes if any(r.from_val for r in recipe.done)]
    if fallback:
        notes.append(
            f"{FALLBACK_MARK} no held-out slice (data.holdout: null) in {', '.join(fallback)}: the per-epoch "
            "validation split was the test split, and the top-1 shown is the last epoch's val top-1."
        )
    for recipe in recipes:
        for run in recipe.runs:
            if run.problem:
                notes.append(f"left out: {run.record.name} ({recipe.name}, seed {run.seed}): {run.problem}.")
    return notes


def recipes_markdown(recipes: list[Recipe]) -> str:
    """The table with its footnotes, as printed and as written into recipes.md under the caption."""
    text = markdown_table(*recipe_rows(recipes))
    notes = recipe_notes(recipes)
    return text + ("\n\n" + "\n".join(f"- {n}" for n in notes) if notes else "")


# Markers ------------------------------------------------------------------------------------------------------


def parse_point(spec: str, key: str) -> Point:
    """`<seconds>:<top1>[:<label>]` (the label may hold colons) -> Point; seconds > 0, top-1 in [0, 100]."""
    parts = spec.split(":", 2)
    bad = UsageError(f"{key}={spec!r} must look like <seconds>:<top1>[:<label>] (seconds > 0, top-1 in 0..100)")
    if len(parts) < 2:
        raise bad
    try:
        seconds, top1 = float(parts[0]), float(parts[1])
    except ValueError:
        raise bad from None
    if not (math.isfinite(seconds) and seconds > 0 and 0 <= top1 <= 100):
        raise bad
    label = parts[2].strip() if len(parts) == 3 and parts[2].strip() else None
    if label is None:
        label = f"goal: {top1:g}% in {seconds:g} s" if key == "goal" else f"{top1:g}% in {seconds:g} s"
    return Point(seconds, top1, label)


def recipes_figure(recipes, anchors, goals, path: Path) -> Path:
    """Top-1 against wall-clock seconds (log scale), one colour per recipe (the recipes of `group_recipes`).

    Per run: a thin line through its per-epoch validation top-1 at the seconds each epoch's evaluation ended, and a
    dot at its final test top-1 and wall time. `anchors`: outside results (black stars and other filled shapes);
    `goals`: targets (open red diamonds). Each point has `seconds`, `top1` and `label`.
    """
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    colours = plt.get_cmap("tab10")
    xs_seen = []
    for i, recipe in enumerate(recipes):
        colour = colours(i % 10)
        done = recipe.done
        seeds = len(recipe.seeds)
        label = f"{recipe.name} ({seeds} seed{'s' if seeds != 1 else ''})"
        for run in done:
            curve = [(s, v) for s, v in run.curve if s > 0]
            if curve:
                xs, ys = zip(*curve, strict=True)
                ax.plot(xs, ys, color=colour, linewidth=0.9, alpha=0.6, label=label)
                label = None  # one legend entry per recipe: its seeds share the colour
                xs_seen += xs
            if run.wall_time_s and run.wall_time_s > 0:
                ax.scatter(run.wall_time_s, run.test_top1, color=colour, edgecolor="black", s=40, zorder=3)
                xs_seen.append(run.wall_time_s)
        if label is not None:  # no curve drawn: the legend still names the recipe
            ax.plot([], [], color=colour, label=label)
    handles = [
        Line2D([], [], linestyle="", marker="o", color="grey", markeredgecolor="black", label="final test top-1")
    ]
    markers = ["*", "P", "X", "h", "p", "v"]
    for k, point in enumerate(anchors):
        marker = markers[k % len(markers)]
        ax.scatter(point.seconds, point.top1, marker=marker, s=170, color="black", zorder=4, label=point.label)
        xs_seen.append(point.seconds)
    for k, point in enumerate(goals):
        ax.scatter(
            point.seconds,
            point.top1,
            marker="D",
            s=60,
            facecolor="none",
            edgecolor="crimson",
            linewidth=1.5,
            zorder=4,
            label="goals" if k == 0 else None,
        )
        ax.annotate(point.label, (point.seconds, point.top1), xytext=(6, -10), textcoords="offset points", fontsize=7)
        xs_seen.append(point.seconds)
    if xs_seen:
        ax.set_xscale("log")
        ax.margins(x=0.12)  # room for the goals' labels at the right
    ax.set_xlabel("wall-clock seconds from the process start (log scale)")
    ax.set_ylabel("top-1 (%)")
    ax.set_title(
        "lines: per-epoch validation top-1 (the holdout slice, or the test split without one); dots: final test top-1",
        fontsize=8,
    )
    ax.grid(alpha=0.3, which="both")
    items, names = ax.get_legend_handles_labels()
    ax.legend(items + handles, names + [h.get_label() for h in handles], fontsize=8, loc="best")
    fig.tight_layout()
    return save(fig, path)
