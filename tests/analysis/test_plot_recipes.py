"""lab/plot_recipes.py and lab/recipes.py: the recipes table against the numbers in the runs'
metrics.json, computed here independently; grouping by experiment and seed; the test-vs-val fallback; errors."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import recipes as recipes_module
import yaml
from PIL import Image
from recipes import find_runs, group_recipes, parse_point
from trainer_utils import QUICK_SYNTHETIC, REPO, TINY_MODEL, load_script, run_cli

from vit.cli.args import run_script


def _script():
    module = load_script("plot_recipes")
    return module


def plot_recipes(argv: list) -> int:
    return run_script(_script().main, [str(a) for a in argv])


def assert_png(path: Path):
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32)
    assert min(image.shape[:2]) >= 300 and image.std() > 1.0


def table_rows(text: str) -> dict[str, list[str]]:
    """The markdown table's body rows by their first cell."""
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells] for cells in rows[1:]}


# Real trainer output ------------------------------------------------------------------------------------------

# Two epochs of the plain recipe on tiny synthetic data, seeds 0 and 1, without and with a held-out slice.
SWEEP_ARGS = [
    "-m",
    "experiment=cifar10_plain",
    *QUICK_SYNTHETIC,
    *TINY_MODEL,
    "trainer=debug",
    "trainer.epochs=2",
    "trainer.attn_maps_every_n_epochs=0",
    "data.num_workers=0",
    "data.augment.auto_augment=null",
    "trainer.seed=0,1",
    "data.holdout=null,64",
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes")
    done = run_cli([*SWEEP_ARGS, f"hydra.sweep.dir={root / 'sweep'}"], cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    return root / "sweep"


def expected_from_metrics(sweep: Path) -> dict[str, dict]:
    """What the table should say, from metrics.json and .hydra/overrides.yaml read here, by holdout setting."""
    groups: dict[str, dict] = {}
    for overrides_path in sorted(sweep.glob("*/.hydra/overrides.yaml")):
        run_dir = overrides_path.parent.parent
        overrides = dict(item.split("=", 1) for item in yaml.safe_load(overrides_path.read_text()))
        m = json.loads((run_dir / "metrics.json").read_text())
        if overrides["data.holdout"] == "null":
            assert "test" not in m and m["val_split"] == "val"
            top1 = m["history"][-1]["val_top1"]  # val is the test split
        else:
            assert m["val_split"] == "holdout" and m["test"]["split"] == "val"
            top1 = m["test"]["top1"]
        group = groups.setdefault(overrides["data.holdout"], {"seeds": {}, "wall": [], "img_s": [], "m": m})
        group["seeds"][int(overrides["trainer.seed"])] = top1
        group["wall"].append(m["wall_time_s"])
        group["img_s"].append(np.mean([r["train_img_per_s"] for r in m["history"]]))
    return groups


def seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def test_table_of_a_real_sweep_matches_its_metrics(sweep, tmp_path, capsys):
    out = tmp_path / "out"
    args = [sweep, f"out={out}", "anchor=326:81.4:plain pipeline (timm + torchvision)", "goal=65:81.4"]
    assert plot_recipes(args) == 0
    printed = capsys.readouterr().out
    text = (out / "recipes.md").read_text()
    assert printed.strip() in text and "half the min-max range" in text and "![" in text
    header = next(line for line in text.splitlines() if line.startswith("| recipe |"))
    assert header == (
        "| recipe | model | params (M) | GMACs | epochs | wall s | wall s min - max | img/s | test top-1 "
        "| per seed (seed: top-1) | seeds |"
    )
    rows = table_rows(text)
    expected = expected_from_metrics(sweep)
    assert set(rows) == {"cifar10_plain (data.holdout=null)", "cifar10_plain (data.holdout=64)"}
    for holdout, want in expected.items():
        row = rows[f"cifar10_plain (data.holdout={holdout})"]
        m = want["m"]
        values = [want["seeds"][s] for s in (0, 1)]
        mean, spread = np.mean(values), (max(values) - min(values)) / 2
        mark = "†" if holdout == "null" else ""
        assert row[1:5] == ["vit_tiny", f"{m['params'] / 1e6:.2f}", f"{m['macs'] / 1e9:.3f}", "2"]
        assert row[5] == seconds(np.mean(want["wall"]))
        assert row[6] == f"{seconds(min(want['wall']))} - {seconds(max(want['wall']))}"
        assert row[7] == f"{np.mean(want['img_s']):,.0f}"
        assert row[8] == f"{mean:.2f} ± {spread:.2f}{mark}"
        assert row[9] == f"0: {values[0]:.2f}, 1: {values[1]:.2f}"
        assert row[10] == "2"
    # The fallback is said once, for the recipe without a held-out slice only.
    notes = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(notes) == 1 and "† no held-out slice" in notes[0] and "(data.holdout=null)" in notes[0]
    assert "data.holdout=64" not in notes[0]
    assert_png(out / "recipes.png")


def test_the_best_epoch_is_never_read(sweep, tmp_path, capsys):
    """A `best` that would be found in the table or the figure if anything used it; and the code never names it."""
    copy = shutil.copytree(sweep, tmp_path / "sweep")
    for path in copy.glob("*/metrics.json"):
        m = json.loads(path.read_text())
        assert "best" in m  # the trainer writes it: the test means something
        m["best"] = {"val_top1": 99.99, "epoch": 1}
        path.write_text(json.dumps(m))
    assert all("best" not in r.metrics for r in find_runs(copy))
    assert plot_recipes([copy]) == 0
    assert "99.99" not in capsys.readouterr().out and "99.99" not in (copy / "recipes.md").read_text()
    sources = [REPO / "lab" / "plot_recipes.py", REPO / "lab" / "recipes.py"]
    code = "\n".join(p.read_text() for p in sources)
    assert not re.search(r"""\[["']best["']\]|get\(["']best["']|best_top1""", code)


def test_figure_one_colour_per_recipe_and_the_markers(sweep, tmp_path, monkeypatch):
    axes = []
    real_subplots = recipes_module.plt.subplots

    def spy(*args, **kwargs):
        fig, ax = real_subplots(*args, **kwargs)
        axes.append(ax)
        return fig, ax

    monkeypatch.setattr(recipes_module.plt, "subplots", spy)
    recipes = group_recipes(find_runs(sweep))
    anchors = [parse_point("326:81.4:plain pipeline (timm + torchvision)", "anchor")]
    goals = [parse_point("65:81.4", "goal"), parse_point("300:90", "goal")]
    assert_png(recipes_module.recipes_figure(recipes, anchors, goals, tmp_path / "r.png"))
    ax = axes[0]
    assert ax.get_xscale() == "log"
    curves = [line for line in ax.get_lines() if len(line.get_xdata()) == 2]  # 2 epochs: one line per run
    assert len(curves) == 4
    colours = {}
    for recipe in recipes:
        for run in recipe.done:
            line = next(c for c in curves if list(zip(c.get_xdata(), c.get_ydata(), strict=True)) == run.curve)
            colours.setdefault(recipe.name, set()).add(line.get_color())
    assert all(len(c) == 1 for c in colours.values()) and len({c.pop() for c in colours.values()}) == 2
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [
        "cifar10_plain (data.holdout=null) (2 seeds)",
        "cifar10_plain (data.holdout=64) (2 seeds)",
        "plain pipeline (timm + torchvision)",
        "goals",
        "final test top-1",
    ]
    assert [t.get_text() for t in ax.texts] == ["goal: 81.4% in 65 s", "goal: 90% in 300 s"]


# Hand-written runs for the grouping and the edge cases ----------------------------------------------------------


def fake_run(run_dir: Path, overrides: list[str], seed: int, top1: float, wall: float, **kw) -> Path:
    """A finished run: test top-1 from a held-out setup unless `holdout=None`; `epochs` planned, `done` run."""
    holdout, epochs, done = kw.get("holdout", 500), kw.get("epochs", 2), kw.get("done", 2)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*overrides, f"trainer.seed={seed}"]))
    config = {"trainer": {"seed": seed, "epochs": epochs}, "data": {"holdout": holdout}, "model": {}}
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    history = [
        {"epoch": e + 1, "elapsed_s": wall * (e + 1) / (done + 1), "val_top1": top1 - 5 + e, "train_img_per_s": 1e3}
        for e in range(done)
    ]
    metrics = {
        "model": "vit_tiny",
        "params": 5_400_000,
        "macs": 350_000_000,
        "epochs_done": done,
        "final": {**history[-1], "val_top1": kw.get("val_top1", 50.0)},
        "best": {"val_top1": 99.99, "epoch": 1},
        "train_img_per_s": 1000.0,
        "wall_time_s": wall,
        "val_split": "holdout" if holdout is not None else "test",
        "history": history,
    }
    if holdout is not None and done == epochs and not kw.get("no_test"):
        metrics["test"] = {"split": "test", "top1": top1, **({"ema_top1": kw["ema"]} if "ema" in kw else {})}
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    return run_dir


def test_runs_group_by_experiment_and_seed_over_several_folders(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    fake_run(a / "0", ["experiment=cifar10_minute"], 0, 80.0, 60.0)
    fake_run(a / "1", ["experiment=cifar10_minute"], 1, 81.0, 64.0)
    fake_run(a / "2", ["experiment=cifar10_fast"], 0, 90.0, 290.0, ema=90.5)
    fake_run(b / "0", ["experiment=cifar10_minute"], 2, 81.5, 62.0)
    fake_run(b / "1", ["experiment=cifar10_fast"], 0, 89.0, 310.0)  # seed 0 again: counted, and said
    fake_run(b / "2", ["experiment=cifar10_minute", "trainer.epochs=1"], 0, 40.0, 30.0)  # another recipe
    fake_run(b / "3", ["experiment=cifar10_minute"], 3, 70.0, 20.0, epochs=2, done=1)  # stopped early
    fake_run(b / "4", ["experiment=cifar10_minute"], 4, 70.0, 20.0, no_test=True)  # holdout, no test
    fake_run(tmp_path / "mine" / "multirun" / "0", [], 0, 0.0, 100.0, holdout=None, val_top1=60.0)  # no experiment
    fake_run(tmp_path / "plain_run", [], 0, 0.0, 100.0, holdout=None, val_top1=61.0)  # a single run folder
    out = tmp_path / "out"
    paths = [a, b, tmp_path / "mine", tmp_path / "plain_run"]
    assert plot_recipes([*paths, f"out={out}"]) == 0
    text = (out / "recipes.md").read_text()
    assert capsys.readouterr().out.strip() in text
    rows = table_rows(text)
    assert list(rows) == [
        "cifar10_minute",
        "cifar10_minute (trainer.epochs=1)",
        "cifar10_fast",
        "multirun",
        "plain_run",
    ]
    minute = rows["cifar10_minute"]
    assert minute[5:12] == ["62.0", "60.0 - 64.0", "1,000", "80.83 ± 0.75", "0: 80.00, 1: 81.00, 2: 81.50", "-", "3"]
    assert minute[2:4] == ["5.40", "0.350"]  # 350 M multiply-adds: 0.350 GMACs
    # The EMA column appears when a run kept one; the fast recipe ran seed 0 twice.
    assert rows["cifar10_fast"][8:] == ["89.50 ± 0.50", "0: 90.00, 0: 89.00", "90.50", "1 (2 runs)"]
    assert rows["cifar10_minute (trainer.epochs=1)"][8:] == ["40.00", "0: 40.00", "-", "1"]
    assert rows["multirun"][8:] == ["60.00†", "0: 60.00", "-", "1"]  # the final val top-1, never `best`
    assert rows["plain_run"][8] == "61.00†"
    notes = [line for line in text.splitlines() if line.startswith("- ")]
    assert "† no held-out slice" in notes[0] and "multirun, plain_run" in notes[0]
    assert notes[1:] == [
        f"- left out: {(b / '3').as_posix()} (cifar10_minute, seed 3): stopped after 1 of 2 epochs.",
        f"- left out: {(b / '4').as_posix()} (cifar10_minute, seed 4): held out a validation slice but has no "
        "test result.",
    ]
    assert_png(out / "recipes.png")


def test_one_folder_is_the_default_output_and_a_run_given_twice_counts_once(tmp_path, capsys):
    fake_run(tmp_path / "sweep" / "0", ["experiment=cifar10_best"], 0, 94.0, 1700.0)
    assert plot_recipes([tmp_path / "sweep", tmp_path / "sweep" / "0", f"out={tmp_path}"]) == 0
    assert table_rows(capsys.readouterr().out)["cifar10_best"][5:] == ["1700", "1700 - 1700", "1,000", "94.00"] + [
        "0: 94.00",
        "1",
    ]
    assert plot_recipes([tmp_path / "sweep"]) == 0
    assert (tmp_path / "sweep" / "recipes.md").is_file() and (tmp_path / "sweep" / "recipes.png").is_file()


def test_points_parse_with_labels_holding_colons():
    point = parse_point("326:81.4:plain: timm + torchvision", "anchor")
    assert (point.seconds, point.top1, point.label) == (326.0, 81.4, "plain: timm + torchvision")
    assert parse_point("1800:94", "goal").label == "goal: 94% in 1800 s"
    assert parse_point("60:80:", "anchor").label == "80% in 60 s"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["{tmp}/nothing"], "'{tmp}/nothing' does not exist"),
        (["{tmp}/empty"], "'{tmp}/empty' holds no finished runs"),
        (["{tmp}/run", "anchor=326"], "anchor='326' must look like <seconds>:<top1>[:<label>]"),
        (["{tmp}/run", "anchor=x:81.4:plain"], "anchor='x:81.4:plain'"),
        (["{tmp}/run", "goal=65:101"], "goal='65:101'"),
        (["{tmp}/run", "goal=-5:80"], "goal='-5:80'"),
        (["{tmp}/run", "goal=inf:80"], "goal='inf:80'"),
        (["{tmp}/run", "colour=red"], "unknown argument 'colour'"),
        (["{tmp}/run", "{tmp}/run"], "with 2 folders, say where to write: out=<folder>"),
        (["out={tmp}"], "usage: python lab/plot_recipes.py <run or multirun folder>"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, needle):
    (tmp_path / "empty" / "crashed" / ".hydra").mkdir(parents=True)  # a run that never wrote metrics.json
    (tmp_path / "empty" / "crashed" / ".hydra" / "config.yaml").write_text("trainer: {}\n")
    fake_run(tmp_path / "run", ["experiment=cifar10_minute"], 0, 80.0, 60.0)
    assert plot_recipes([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle.format(tmp=tmp_path) in err[0], err


def test_a_budgeted_run_is_finished_by_its_plan_not_by_trainer_epochs():
    """trainer.budget: trainer.epochs is an upper bound, so 7 of 200 epochs is a finished run when the plan's
    steps were all trained, and a stopped one when they were not."""
    from recipes import recipe_run

    from vit.analysis.runs import RunRecord

    def record(trained: int) -> RunRecord:
        metrics = {"epochs_done": 7, "final": {"val_top1": 69.4}, "budget": {"trained_steps": trained}}
        metrics["budget"]["planned_steps"] = 2382
        config = {"trainer": {"epochs": 200, "seed": 0}, "data": {"holdout": None}}
        return RunRecord(Path("run"), "run", {}, config, metrics)

    finished, stopped = recipe_run(record(2382)), recipe_run(record(1000))
    assert finished.problem is None and finished.test_top1 == 69.4
    assert stopped.problem == "stopped after 1000 of 2382 planned steps" and stopped.test_top1 is None
