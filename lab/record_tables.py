"""The docs' tables of measured figures, generated from the records under docs/results/ and never typed.

A generated table sits in a Markdown file between two comments that name it:

    <!-- table: cifar10_cpu_budget_avx2 -->
    | run | ... |
    ...
    <!-- /table -->

`TABLES` maps each name to the record folder it reads and the function that turns those records into the table
(means, spreads and ratios computed here). `regenerate(text)` rewrites every marked block of a document;
`lab/doc_tables.py` does it for README.md and docs/*.md, and its `check=true` (run by the default test suite)
fails when a document's block differs from what its records give. Each block ends with the line naming its
records, so a reader can go from the figure to the files and from there to the commit, machine and command.
"""

from __future__ import annotations

import json
import re
import statistics
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf
from recipes import find_runs, recipe_run

from vit.analysis.runs import markdown_table

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
BLOCK = re.compile(r"(?P<open><!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(?P<close><!-- /table -->)", re.S)


@dataclass(frozen=True)
class DocTable:
    """One generated table: the record folder (relative to docs/results/) and what builds its Markdown."""

    records: str
    build: Callable[[Path], str]


def mean_and_half_range(values: list[float]) -> tuple[float, float]:
    """The mean and half the min-max range: how the docs report a figure over seeds."""
    return statistics.fmean(values), (max(values) - min(values)) / 2


def _seed_of(path: Path) -> int:
    match = re.search(r"seed(\d+)", path.as_posix())
    if match is None:
        raise ValueError(f"{path}: no seed<N> in its name")
    return int(match.group(1))


# --- CIFAR-10 on a 2-core CPU in a 30-minute budget ------------------------------------------------------------


def budget_text(seconds: float) -> str:
    """A budget as the user writes it: 1800 -> 30m, 7200 -> 2h, 90 -> 90s."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


POSITION_NAMES = {"rope_mixed": "mixed RoPE", "rope": "RoPE", "rope_dinov3": "DINOv3's RoPE", "none": "no positions"}


OPTIMIZER_NAMES = {"muon": "Muon", "nmuon": "Muon (Nesterov)", "lion": "Lion", "sgd": "SGD"}


def _vit_name(config: dict) -> str:
    """`ViT/4 96 x 6, 2 heads, conv stem, qk-norm, mixed RoPE`: the size, then what differs from a plain ViT."""
    model = OmegaConf.to_container(OmegaConf.create(config), resolve=True)["model"]  # `${data.patch_size}`
    parts = [f"ViT/{model['patch_size']} {model['embed_dim']} x {model['depth']}", f"{model['num_heads']} heads"]
    parts += {"conv": ["conv stem"], "cct": ["CCT tokenizer"]}.get(model.get("patch_embed"), [])
    parts += ["qk-norm"] if model.get("qk_norm") else []
    parts += [POSITION_NAMES[model["pos_embed"]]] if model.get("pos_embed") in POSITION_NAMES else []
    parts += ["sequence pooling"] if model.get("global_pool") == "seq" else []
    return ", ".join(parts)


def cpu_budget_table(folder: Path) -> str:
    """`experiment=cifar10_cpu` under its budget and the plain timm + torchvision loop, a row a seed and a mean row
    for each (run folders `<recipe>/seed<N>/` holding metrics.json and .hydra/)."""
    header = ["run", "model", "params", "precision", "trained", "images seen", "mean train img/s", "wall time"]
    header.append("test top-1")
    rows = []
    for recipe_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        runs = sorted((recipe_run(r) for r in find_runs(recipe_dir)), key=lambda run: run.seed)
        reference = recipe_dir.name == "timm_torchvision_reference"
        for index, run in enumerate(runs):
            metrics, config = run.metrics, run.record.config
            if reference:
                ref = config["reference"]
                label = "plain timm + torchvision" if index == 0 else "same"
                model = f"timm ViT/4 {ref['embed_dim']} x {ref['depth']}, {ref['num_heads']} heads"
                model += ", qk-norm" if ref.get("qk_norm") == "true" else ""  # (absent before it was a setting)
                precision, trained = "fp32", f"{metrics['epochs_done']} epochs (fitted after the first)"
                seen, img_s = metrics["images_seen"], ""
            else:
                budget = metrics["budget"]
                label = f"`experiment={recipe_dir.name}` (`trainer.budget={budget_text(budget['budget_s'])}`)"
                label = label if index == 0 else "same"
                model, precision = _vit_name(config), metrics["precision"]
                optimizer = config["optim"]["name"]
                model += f"; {OPTIMIZER_NAMES.get(optimizer, optimizer)}" if optimizer != "adamw" else ""
                resize = (config.get("trainer") or {}).get("progressive_resize") or {}
                if resize.get("min_size"):  # progressive resizing: the first size and where the ramp ends
                    model += f"; {resize['min_size']} px first, full size by {resize['end']:g} of the epochs"
                policy = (config["data"].get("augment") or {}).get("auto_augment")
                model += f"; `auto_augment={policy}`" if policy else ""  # (the budget's long_overrides may add it)
                trained = f"{budget['trained_steps']:,} steps ({budget['planned_epochs']:.2f} epochs, planned)"
                seen = budget["trained_steps"] * config["data"]["batch_size"]
                img_s = f"{metrics['train_img_per_s']:.0f}"
            row = [f"{label}, seed {run.seed}", model, f"{metrics['params'] / 1e6:.2f} M", precision, trained]
            row += [f"{seen:,}", img_s, f"{run.wall_time_s:,.0f} s", f"{run.test_top1:.2f}%"]
            rows.append(row)
        if len(runs) < 2:
            continue  # one seed: its row is all there is
        top1, spread = mean_and_half_range([run.test_top1 for run in runs])
        wall = statistics.fmean(run.wall_time_s for run in runs)
        name = "plain loop" if reference else "recipe"
        rows.append(
            [f"**{name}, mean over {len(runs)} seeds** (± half the spread)", "", "", "", "", "", ""]
            + [f"{wall:,.0f} s", f"**{top1:.2f}% ± {spread:.2f}**"]
        )
    return markdown_table(header, rows)


SEARCH_FIXED = ("hparams_search=", "data.root=", "search.")  # overrides every trial shares


def _setting_text(override: str) -> str:
    """`model.embed_dim=128` -> `embed_dim=128`; a float to 3 significant digits."""
    key, value = override.split("=", 1)
    try:
        value = f"{float(value):.3g}" if "." in value or "e" in value.lower() else value
    except ValueError:
        pass
    return f"`{key.split('.')[-1]}={value}`"


def budget_search_table(folder: Path) -> str:
    """An Optuna search's trials (`trial_<N>/` holding metrics.json and .hydra/overrides.yaml), in the order they
    ran: the settings the sampler chose, what the fixed budget bought (steps, epochs, img/s) and the holdout's
    top-1; the best score in bold. `recipe/`, where present: the recipe's own settings run as one more trial."""
    trials = []
    paths = sorted(folder.glob("trial_*"), key=lambda p: int(p.name.split("_")[1]))
    for path in [*paths, *([folder / "recipe"] if (folder / "recipe").is_dir() else [])]:
        overrides = OmegaConf.load(path / ".hydra" / "overrides.yaml")
        chosen = [o for o in overrides if not str(o).startswith(SEARCH_FIXED)]
        metrics = json.loads((path / "metrics.json").read_text()) if (path / "metrics.json").is_file() else None
        label = path.name.split("_")[1] if path.name != "recipe" else "the recipe's own settings"
        trials.append((label, chosen, metrics))
    scores = [m["final"]["val_top1"] for _, _, m in trials if m]
    rows = []
    for number, chosen, metrics in trials:
        settings = ", ".join(_setting_text(str(o)) for o in chosen)
        if metrics is None:
            rows.append([number, settings, "-", "-", "-", "no result (no metrics.json)"])
            continue
        budget, top1 = metrics["budget"], metrics["final"]["val_top1"]
        score = f"**{top1:.2f}%**" if top1 == max(scores) else f"{top1:.2f}%"
        steps = f"{budget['trained_steps']:,} ({budget['planned_epochs']:.2f})"
        rows.append([number, settings, steps, f"{metrics['train_img_per_s']:.0f}", f"{budget['wall_s']:.0f}", score])
    header = ["trial", "settings chosen", "steps (epochs)", "train img/s", "wall s", "holdout top-1"]
    return markdown_table(header, rows)


# overrides every compared run shares
COMPARISON_FIXED = ("experiment=", "data.root=", "data.holdout=", "trainer.seed=", "hydra.", "trainer.budget=")
COMPARISON_FIXED += ("trainer.epochs=",)  # a comparison at equal epochs: every run's, in its section's command


def budget_comparison_table(folder: Path, first: tuple[Path, ...] = ()) -> str:
    """Runs of one experiment on the holdout, a subfolder each (metrics.json, .hydra/overrides.yaml), in the
    subfolders' order after the run folders `first` (a baseline recorded elsewhere): the settings each adds to the
    experiment, the steps trained (what the budget bought, or the epochs set), the holdout top-1 at each evaluation
    on the way and at the end; the best final score in bold."""
    runs = []
    for path in [*first, *sorted(p for p in folder.iterdir() if (p / "metrics.json").is_file())]:
        overrides = OmegaConf.load(path / ".hydra" / "overrides.yaml")
        chosen = [str(o) for o in overrides if not str(o).startswith(COMPARISON_FIXED)]
        runs.append((chosen, json.loads((path / "metrics.json").read_text())))
    best = max(m["final"]["val_top1"] for _, m in runs)
    rows = []
    for chosen, metrics in runs:
        top1, history = metrics["final"]["val_top1"], metrics["history"]
        budget = metrics.get("budget") or {  # a run of set epochs: what it trained, its wall time
            "trained_steps": history[-1]["step"],
            "planned_epochs": float(metrics["epochs_done"]),
            "wall_s": metrics["wall_time_s"],
        }
        settings = ", ".join(_setting_text(o) for o in chosen) or "none: the recipe as it is"
        curve = ", ".join(
            f"{r['val_top1']:.2f}% (epoch {r['epoch']})" for r in metrics["history"] if r.get("val_top1") is not None
        )
        rows.append([
            settings,
            f"{budget['trained_steps']:,} ({budget['planned_epochs']:.2f})",
            f"{metrics['train_img_per_s']:.0f}",
            f"{budget['wall_s']:.0f}",
            curve,
            f"**{top1:.2f}%**" if top1 == best else f"{top1:.2f}%",
        ])  # fmt: skip
    header = ["settings added", "steps (epochs)", "train img/s", "wall s", "holdout top-1 on the way", "holdout top-1"]
    return markdown_table(header, rows)


def levers_beside_recipe_table(folder: Path) -> str:
    """The 30-minute lever runs on the AMX Xeon after the recipe's own run on that machine, the widths' record."""
    return budget_comparison_table(folder, first=(folder.parent / "amx_xeon_30m_widths" / "recipe",))


def tta_table(folder: Path) -> str:
    """vit-eval's JSON records in `tta/` (`<run>_flip_true[_shift_<n>].json`): a row per run, its holdout top-1
    with the flip alone and with each shift beside it."""
    results: dict[str, dict[int, float]] = {}
    for path in sorted((folder / "tta").glob("*.json")):
        run, _, views = path.stem.partition("_flip_true")
        shift = int(views.removeprefix("_shift_")) if views else 0
        results.setdefault(run, {})[shift] = json.loads(path.read_text())["top1"]
    shifts = sorted({shift for row in results.values() for shift in row})
    header = ["run", *("flip" if s == 0 else f"flip, shift {s}" for s in shifts)]
    rows = [[run, *(f"{row[s]:.2f}%" if s in row else "" for s in shifts)] for run, row in results.items()]
    return markdown_table(header, rows)


# --- The GPU recipes as budgets ----------------------------------------------------------------------------------


def gpu_budget_table(folder: Path) -> str:
    """Each `<experiment>_<budget>_seed<N>.json` (a run's metrics.json) a row, and a mean row per experiment with
    more than one seed."""
    header = ["run", "seed", "wall s", "planned = trained steps (epochs)", "train img/s", "test top-1", "EMA"]
    groups: dict[str, list[tuple[int, dict]]] = {}
    for path in sorted(folder.glob("*_seed*.json")):
        group = re.sub(r"_seed\d+$", "", path.stem)
        groups.setdefault(group, []).append((_seed_of(path), json.loads(path.read_text())))
    rows = []
    for group, runs in groups.items():
        runs.sort(key=lambda item: item[0])
        experiment, budget = group.rsplit("_", 1)
        for index, (seed, metrics) in enumerate(runs):
            plan, final = metrics["budget"], metrics["final"]
            if plan["planned_steps"] != plan["trained_steps"]:
                raise ValueError(f"{group} seed {seed}: trained {plan['trained_steps']} of {plan['planned_steps']}")
            label = f"`experiment={experiment} trainer.budget={budget}`" if index == 0 else "same"
            rows.append(
                [label, str(seed), f"{metrics['wall_time_s']:.1f}"]
                + [f"{plan['trained_steps']:,} ({plan['planned_epochs']:.1f})", f"{metrics['train_img_per_s']:,.0f}"]
                + [f"{final['val_top1']:.2f}%", f"{final['val_ema_top1']:.2f}%" if "val_ema_top1" in final else ""]
            )
        if len(runs) > 1:
            top1 = [metrics["final"]["val_top1"] for _, metrics in runs]
            wall = statistics.fmean(metrics["wall_time_s"] for _, metrics in runs)
            rows.append(
                [f"**mean of {len(runs)} seeds** (min-max)", "", f"{wall:.1f}", "", ""]
                + [f"**{statistics.fmean(top1):.2f}%** ({min(top1):.2f}-{max(top1):.2f})", ""]
            )
    return markdown_table(header, rows)


@dataclass(frozen=True)
class Headline:
    """One row of the tables that answer first (README's "What to expect", docs/RESULTS.md's opening): a recipe's
    runs on one kind of machine. The machine is named here, as its record's NOTE.md or section names it: a record's
    provenance holds the CPU's flags, not its generation."""

    machine: str
    records: str  # relative to docs/results/: a folder of run folders, or of `<experiment>_<budget>_seed<N>.json`
    pattern: str = ""  # for a folder of JSON records: the glob of this row's files
    measured: str = ""  # when its records predate provenance: the date docs/results/README.md lists for them


HEADLINES_CPU = [
    Headline("2-core AMD EPYC Zen 5, AVX512-BF16", "cifar10_cpu_budget/avx512_zen5_30m/cifar10_cpu"),
    Headline("2-core AMD EPYC Zen 4, AVX512-BF16", "cifar10_cpu_budget/avx512_zen4_30m_autoaug/cifar10_cpu"),
    Headline("2-core AMD EPYC, AVX2 only", "cifar10_cpu_budget/avx2_progressive_resize/cifar10_cpu"),
    Headline("2-core Intel Xeon, AMX-BF16", "cifar10_cpu_budget/amx_xeon_30m/cifar10_cpu"),
]
HEADLINES = [
    *HEADLINES_CPU,
    Headline("2-core AMD EPYC Zen 4, AVX512-BF16", "cifar10_cpu_budget/avx512_2h_autoaug/cifar10_cpu"),
    Headline(
        "one NVIDIA H200 (the recipe before its rebuild)",
        "gpu_budget_h200",
        "cifar10_minute_60s_seed*.json",
        "2026-11-26",
    ),
    Headline(
        "one NVIDIA H200 (the recipe before its rebuild)", "gpu_budget_h200", "cifar10_fast_5m_seed*.json", "2026-11-26"
    ),
]


HEADLINE_OWN_KEYS = ("data.root=", "hydra.run.dir=", "trainer.seed=", "trainer.budget=")  # shown in other columns


def _headline_metrics(row: Headline, results: Path) -> list[dict]:
    """The metrics.json of each seed of the row: run folders' (a test split read once) or JSON records'."""
    folder = results / row.records
    if row.pattern:
        return [json.loads(path.read_text()) for path in sorted(folder.glob(row.pattern))]
    runs = [recipe_run(record) for record in find_runs(folder)]
    problems = [run.problem for run in runs if run.problem]
    if problems or not runs:
        raise ValueError(f"{row.records}: {problems or 'no runs'}")
    return [run.metrics for run in runs]


def _top1_of(metrics: dict) -> float:
    """The test top-1: the test split's, read once after a holdout chose, or the last evaluation's without one."""
    return metrics["test"]["top1"] if metrics.get("test") else metrics["final"]["val_top1"]


def headline_table(rows: list[Headline], results: Path, link: str) -> str:
    """A row per recipe and machine: the command, its budget and wall time, test top-1 over its seeds (mean ± half
    the spread), the dates and commits, and the record (`link` + its folder)."""
    header = ["machine", "command", "budget", "wall time", "CIFAR-10 test top-1", "measured", "record"]
    table = []
    for row in rows:
        runs = _headline_metrics(row, results)
        if row.pattern:  # `<experiment>_<budget>_seed*.json`
            experiment = row.pattern.split("_seed")[0].rsplit("_", 1)[0]
        else:
            experiment = re.search(r"experiment=(\S+)", runs[0]["provenance"]["command"]).group(1)
            extra = [o for o in runs[0]["provenance"]["command"].split()[2:] if not o.startswith(HEADLINE_OWN_KEYS)]
            experiment += "".join(f" {o}" for o in extra)
        budget = budget_text(runs[0]["budget"]["budget_s"])
        top1, spread = mean_and_half_range([_top1_of(m) for m in runs])
        seeds = f"{len(runs)} seeds" if len(runs) > 1 else "1 seed"
        top1_text = f"**{top1:.2f}%** ± {spread:.2f} ({seeds})" if len(runs) > 1 else f"**{top1:.2f}%** (1 seed)"
        if row.measured:
            measured = row.measured
        else:
            dates = sorted({m["provenance"]["date"][:10] for m in runs})
            commits = sorted({m["provenance"]["commit"][:7] for m in runs})
            measured = f"{' to '.join([dates[0], dates[-1]] if len(dates) > 1 else dates)}, {', '.join(commits)}"
        wall = statistics.fmean(m["wall_time_s"] for m in runs)
        table.append(
            [row.machine, f"`experiment={experiment}`", budget, f"{wall:,.0f} s", top1_text]
            + [measured, f"[{'/'.join(row.records.split('/')[:2])}]({link}{row.records}/)"]
        )
    return markdown_table(header, table)


# The budget's first plan against the steps its run trained: (machine, the record folder under cifar10_cpu_budget/)
FIRST_PLANS = [
    ("2-core AMD EPYC Zen 5, AVX512-BF16", "avx512_zen5_30m"),
    ("2-core AMD EPYC Zen 4, AVX512-BF16", "avx512_zen4_30m_autoaug"),
    ("2-core AMD EPYC Zen 4, AVX512-BF16", "avx512_2h_autoaug"),
    ("2-core AMD EPYC Zen 5, AVX512-BF16 (a slower host)", "avx512_zen5_30m_first_plan"),
    ("2-core Intel Xeon, AMX-BF16", "amx_xeon_30m"),
    ("2-core Intel Xeon, AMX-BF16 (holdout)", "amx_xeon_30m_widths"),
    ("2-core Intel Xeon, AMX-BF16 (holdout, levers)", "amx_xeon_30m_levers"),
]


def first_plan_table(folder: Path) -> str:
    """A row per budgeted run of FIRST_PLANS: how its first plan priced the steps still to come, the steps that plan
    laid out against the steps the run trained, and their ratio. Runs before `fixed_share` was recorded planned
    every step at the first size's measured cost."""
    header = ["record", "machine", "commit", "budget", "later sizes priced", "first plan", "trained", "first / trained"]
    rows = []
    for machine, name in FIRST_PLANS:
        for path in sorted((folder / name).rglob("metrics.json")):
            metrics = json.loads(path.read_text())
            budget = metrics["budget"]
            first, trained = budget["plans"][0]["total_steps"], budget["trained_steps"]
            if "fixed_share" not in budget:
                priced = "at the first size's cost"
            else:
                priced = f"by tokens and a fixed {budget['fixed_share']:.0%}" if budget["fixed_share"] else "by tokens"
            run = path.parent.relative_to(folder).as_posix()
            rows.append(
                [f"[{run}](results/{folder.name}/{run}/)", machine, metrics["provenance"]["commit"][:7]]
                + [budget_text(budget["budget_s"]), priced, f"{first:,}", f"{trained:,}", f"{first / trained:.2f}"]
            )
    return markdown_table(header, rows)


def matmul_peak_table(folder: Path) -> str:
    """lab/bench_matmul.py's JSON records (`matmul_<dtype>_<commit>.json`), in the order they were taken (the
    date in `machine_<commit>.txt`, which lab/gpu_check.sh writes beside them): every round and the median."""
    rows = []
    for path in folder.glob("matmul_*.json"):
        record, commit = json.loads(path.read_text()), path.stem.rsplit("_", 1)[1]
        taken = re.search(r"date (\S+)", (folder / f"machine_{commit}.txt").read_text()).group(1)
        rounds = ", ".join(f"{t:.0f}" for t in record["tflops_rounds"])
        size = f"{record['n']}^3 {record['dtype']}"
        median = f"{statistics.median(record['tflops_rounds']):.0f}"
        rows.append([record["device"], taken[:16].replace("T", " "), commit, size, rounds, median])
    header = ["device", "taken (UTC)", "commit", "product", "TFLOP/s, each round in order", "median"]
    return markdown_table(header, sorted(rows, key=lambda row: row[1]))


def rate(img_per_s: float) -> str:
    """Images a second with at least two significant digits: 3.7, 24, 8,820."""
    return f"{img_per_s:,.1f}" if img_per_s < 10 else f"{img_per_s:,.0f}"


def model_step_table(folder: Path) -> str:
    """lab/benchmark.py's JSON records (`step_<case>*.json`, mode=steps): a row per case and compile mode,
    ours against its peer, as the script prints it; the peer named from lab/bench_cases.py."""
    from bench_cases import CASES

    results = [r for path in folder.glob("step_*.json") for r in json.loads(path.read_text())["results"]]
    order = list(CASES)
    results.sort(key=lambda r: (order.index(r["case"]), r["compile_mode"] is not None))

    def gib(side: dict | None) -> str:
        return f"{side['peak_gib']:.2f}" if side and side.get("peak_gib") is not None else "-"

    rows = []
    for result in results:
        ours, peer = result["sides"][0], (result["sides"][1] if len(result["sides"]) > 1 else None)
        ratio = f"{result['ratio_median']:.3f} ({result['ratio_p10']:.3f}-{result['ratio_p90']:.3f})" if peer else "-"
        rows.append(
            [f"`{result['case']}`", str(result["img_size"]), str(result["batch"])]
            + [result["compile_mode"] or "eager", rate(ours["img_per_s"])]
            + [f"{rate(peer['img_per_s'])} ({CASES[result['case']].peer})" if peer else "-", ratio]
            + [f"{100 * ours['mfu']:.1f}%" if ours.get("mfu") is not None else "-", gib(ours), gib(peer)]
        )
    header = ["model", "img px", "batch", "compile", "ours img/s", "peer img/s", "ratio (p10-p90)", "ours MFU"]
    return markdown_table([*header, "ours GiB", "peer GiB"], rows)


def cpu_matmul_table(folder: Path) -> str:
    """lab/bench_matmul.py's JSON records on a CPU (`matmul_<dtype>_<n>.json`): every round's GFLOP/s and the
    median, a row per precision."""
    rows = []
    for path in sorted(folder.glob("matmul_*.json")):
        record = json.loads(path.read_text())
        rounds = record["tflops_rounds"]
        each = ", ".join(f"{1000 * t:,.0f}" for t in rounds)
        rows.append([f"{record['n']}^3 {record['dtype']}", each, f"{1000 * statistics.median(rounds):,.0f}"])
    return markdown_table(["product", "GFLOP/s, each round in order", "median"], rows)


def width_rate_table(folder: Path) -> str:
    """The recipe's model at each width (recipe_widths_bf16.json, lab/benchmark.py mode=steps) against the CPU's
    own bf16 matrix rate (matmul_bf16_2048.json, lab/bench_matmul.py): img/s, the training FLOPs an image (the
    benchmark's count, torch.utils.flop_counter over a forward and backward), the FLOP/s they make and their share
    of the 2048^3 product's median."""
    widths = json.loads((folder / "recipe_widths_bf16.json").read_text())["results"]
    peak = statistics.median(json.loads((folder / "matmul_bf16_2048.json").read_text())["tflops_rounds"])
    rows = []
    for result in widths:
        ours = result["sides"][0]
        img_s, gflop = ours["img_per_s"], ours["flops_per_image"] / 1e9
        share = f"{img_s * gflop / 1000 / peak:.1%}"
        rows.append([result["case"].rsplit("_", 1)[1], rate(img_s), f"{gflop:.3f}", f"{img_s * gflop:,.0f}", share])
    header = ["width", "img/s (bf16, 32 px, batch 256)", "GFLOP an image", "GFLOP/s", "share of the product's rate"]
    return markdown_table(header, rows)


def _time_v(path: Path) -> dict[str, float]:
    """GNU time's `-v` report as numbers: {"Minor (reclaiming a frame) page faults": 7081515.0, ...}."""
    fields = {}
    for line in path.read_text().splitlines():
        key, _, value = line.strip().rpartition(": ")
        if key and value.replace(".", "", 1).isdigit():
            fields[key] = float(value)
    return fields


def malloc_table(folder: Path) -> str:
    """One-epoch trainer runs under each `trainer.malloc` (a subfolder each, `<setting>_<round>/`: metrics.json,
    .hydra/overrides.yaml and `time.txt`, GNU time's `-v` report), in the order they ran (`order.txt`): the epoch's
    img/s and seconds, the process's minor page faults, system CPU seconds and peak RSS, and its train loss and
    holdout top-1 (the same arithmetic gives the same figures)."""
    rows = []
    for name in (folder / "order.txt").read_text().split():
        run = folder / name
        metrics, timed = json.loads((run / "metrics.json").read_text()), _time_v(run / "time.txt")
        setting = next(str(o) for o in OmegaConf.load(run / ".hydra" / "overrides.yaml") if "malloc" in str(o))
        final = metrics["final"]
        rows.append([
            f"`{setting.split('.', 1)[1]}`",
            f"{metrics['train_img_per_s']:.0f}",
            f"{final['epoch_seconds']:.1f}",
            f"{timed['Minor (reclaiming a frame) page faults'] / 1e6:.2f} M",
            f"{timed['System time (seconds)']:.1f}",
            f"{timed['Maximum resident set size (kbytes)'] / 2**20:.2f}",
            f"{final['train_loss']:.4f}",
            f"{final['val_top1']:.2f}%",
        ])  # fmt: skip
    header = ["setting", "train img/s", "epoch s", "minor page faults", "system CPU s", "peak RSS GiB",
              "train loss", "holdout top-1"]  # fmt: skip
    return markdown_table(header, rows)


def layernorm_error_table(folder: Path) -> str:
    """lab/bench_layernorm.py's record (`layernorm.json`): for each width and row count, the relative error of the
    input, weight and bias gradients against float64, PyTorch's bf16 kernel beside the float32 LayerNorm."""
    record = json.loads((folder / "layernorm.json").read_text())
    grads, sides = ("input", "weight", "bias"), ("pytorch_bf16", "float32_inside")
    rows = [
        [str(row["width"]), f"{row['rows']:,}", *(f"{row[side][grad]:.2%}" for side in sides for grad in grads)]
        for row in record["errors"]
    ]
    labels = [f"{grad} ({side})" for side in ("bf16 kernel", "float32") for grad in grads]
    return markdown_table(["width", "rows", *labels], rows)


def layernorm_training_table(folder: Path) -> str:
    """Equal-epoch runs with each LayerNorm (`<bf16_kernel|float32>_seed<n>/metrics.json`), in the order they ran
    (`order.txt`): the commit, steps, img/s, wall time, final train loss and holdout top-1."""
    rows = []
    for name in (folder / "order.txt").read_text().split():
        run = folder / name
        metrics = json.loads((run / "metrics.json").read_text())
        final = metrics["final"]
        rows.append([
            "PyTorch's bf16 kernel" if name.startswith("bf16_kernel") else "float32 (`vit/models/norm.py`)",
            str(_seed_of(run)),
            metrics["provenance"]["commit"][:7],
            f"{metrics['steps_trained']:,} ({metrics['epochs_done']})",
            f"{metrics['train_img_per_s']:.0f}",
            f"{metrics['wall_time_s']:.0f}",
            f"{final['train_loss']:.4f}",
            f"{final['val_top1']:.2f}%",
        ])  # fmt: skip
    header = ["LayerNorm", "seed", "commit", "steps (epochs)", "train img/s", "wall s", "train loss", "holdout top-1"]
    return markdown_table(header, rows)


def cuda_tier_table(folder: Path) -> str:
    """The GPU tier's JUnit files (`cuda_tier_<commit>.xml`): each test's outcome at each commit it ran at."""
    runs, started = {}, {}
    for path in folder.glob("cuda_tier_*.xml"):
        root, outcomes = ET.parse(path).getroot(), {}
        started[path] = next(root.iter("testsuite")).get("timestamp")
        for case in root.iter("testcase"):
            failed = case.find("failure") is not None or case.find("error") is not None
            skipped = case.find("skipped") is not None
            outcomes[case.get("name")] = "failed" if failed else "skipped" if skipped else "passed"
        runs[path] = outcomes
    runs = {path.stem.removeprefix("cuda_tier_"): runs[path] for path in sorted(runs, key=started.get)}  # run order
    names = sorted({name for outcomes in runs.values() for name in outcomes})
    rows = [[f"`{name}`", *(outcomes.get(name, "-") for outcomes in runs.values())] for name in names]
    totals = ["**passed**"] + [f"**{sum(v == 'passed' for v in o.values())} of {len(o)}**" for o in runs.values()]
    return markdown_table(["test (tests/e2e/test_cuda.py)", *(f"commit {c}" for c in runs)], [*rows, totals])


# --- The CPU proxy's base setting ---------------------------------------------------------------------------------


def proxy_base_table(folder: Path) -> str:
    """`experiment=cifar10_proxy` runs grouped by the code they ran (a subfolder each, its name the label) with a
    row a seed (final holdout top-1, the EMA's, the test split read once after training) and a mean row (mean and
    min-max) per group of several seeds."""
    header = ["code", "seed", "holdout top-1", "EMA holdout", "test top-1", "EMA test"]
    rows = []
    for group in sorted(p for p in folder.iterdir() if p.is_dir()):
        runs = sorted(find_runs(group), key=lambda r: _seed_of(r.path))
        for index, record in enumerate(runs):
            final, test = record.metrics["final"], record.metrics["test"]
            label = f"`{group.name}`" if index == 0 else "same"
            rows.append(
                [label, str(_seed_of(record.path)), f"{final['val_top1']:.2f}", f"{final['val_ema_top1']:.2f}"]
                + [f"{test['top1']:.2f}", f"{test['ema_top1']:.2f}"]
            )
        if len(runs) > 1:

            def cell(values: list[float]) -> str:
                return f"**{statistics.fmean(values):.2f}** ({min(values):.2f}-{max(values):.2f})"

            finals = [r.metrics["final"] for r in runs]
            tests = [r.metrics["test"] for r in runs]
            rows.append(
                [f"mean of {len(runs)} seeds (min-max)", ""]
                + [cell([f["val_top1"] for f in finals]), cell([f["val_ema_top1"] for f in finals])]
                + [cell([t["top1"] for t in tests]), cell([t["ema_top1"] for t in tests])]
            )
    return markdown_table(header, rows)


# --- The CPU recipe's step (the AVX2 machine) ---------------------------------------------------------------------

OPTIMIZER_LABELS = {
    "adamw:loop": "`adamw:loop` (torch's default on a CPU before: one tensor at a time)",
    "adamw:foreach": "`adamw:foreach` (multi-tensor)",
    "adamw": "`adamw` (what the trainer runs: fused)",
    "muon": "`muon` (AdamW for the stem, heads and 1-d tensors)",
}


def optimizer_step_table(folder: Path) -> str:
    """lab/bench_optimizer.py's printed table (bench_optimizer.md): each optimizer's median ms per step, and
    the ratio to torch's per-tensor AdamW computed here from those medians."""
    rows = []
    for line in (folder / "bench_optimizer.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4 and re.fullmatch(r"[\d.]+", cells[2]):
            rows.append((cells[0], cells[1], float(cells[2])))
    base = dict((name, ms) for name, _, ms in rows)["adamw:loop"]
    body = [[OPTIMIZER_LABELS.get(name, f"`{name}`"), cls, f"{ms:.2f}", f"{ms / base:.2f}"] for name, cls, ms in rows]
    return markdown_table(["optimizer", "class", "ms per step (median)", "vs torch's per-tensor AdamW"], body)


def cpu_bf16_table(folder: Path) -> str:
    """lab/bench_cpu_bf16.py's record (bench_cpu_bf16.json): a row per case, fp32 and bf16 autocast img/s
    (medians of the interleaved rounds) and their ratio, in the order measured."""
    record = json.loads((folder / "bench_cpu_bf16.json").read_text())
    rows = [
        [str(c["width"]), str(c["heads"]), str(c["tokens"]), str(c["batch"])]
        + [rate(c["fp32_img_per_s"]), rate(c["bf16_img_per_s"]), f"{c['bf16_over_fp32']:.2f}"]
        for c in record["cases"]
    ]
    header = ["width", "heads", "tokens", "batch", "fp32 img/s", "bf16 img/s", "bf16 / fp32"]
    return markdown_table(header, rows)


_BACKWARD = "backward (torch/_tensor.py"
# (row, which of py-spy's collapsed stacks inside `train_one_epoch` count for it)
PROFILE_ROWS: list[tuple[str, Callable[[str], bool]]] = [
    (
        "`forward_backward`: the model's forward",
        lambda s: "forward_backward" in s and _BACKWARD not in s and "Module._call_impl" in s,
    ),
    ("`forward_backward`: the backward pass", lambda s: _BACKWARD in s),
    ("of the forward: the encoder blocks", lambda s: "run_blocks" in s and _BACKWARD not in s),
    ("of the forward, in the blocks: attention", lambda s: "Attention.forward" in s and _BACKWARD not in s),
    ("of the forward, in the blocks: the MLP", lambda s: "Mlp.forward" in s and _BACKWARD not in s),
    ("of the forward: the convolutional stem", lambda s: "ConvStemEmbed.forward" in s and _BACKWARD not in s),
    ("the loader's batches (`GpuLoader.__iter__`, pad-crop and flip included)", lambda s: "GpuLoader.__iter__" in s),
    ("`optimizer_step` (clipping, fused AdamW, schedule, budget)", lambda s: "optimizer_step" in s),
]


def cpu_profile_table(folder: Path) -> str:
    """The share of py-spy's samples inside `train_one_epoch` whose stack holds each part (the raw collapsed stacks,
    `py-spy record -f raw`, gzipped)."""
    import gzip

    samples = []
    with gzip.open(next(folder.glob("pyspy_*.txt.gz")), "rt") as raw:
        for line in raw:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if "train_one_epoch" in stack:
                samples.append((stack, int(count)))
    total = sum(count for _, count in samples)
    rows = [[label, f"{100 * sum(n for s, n in samples if holds(s)) / total:.1f}%"] for label, holds in PROFILE_ROWS]
    return markdown_table([f"inside `train_one_epoch` ({total:,} samples)", "share of its samples"], rows)


LEVER_LABELS = {
    "vit_cpu_cifar": "none: plain patches, learned positions, GELU MLP",
    "vit_cpu_cifar_conv_stem": "convolutional stem (`model.patch_embed=conv`)",
    "vit_cpu_cifar_qk_norm": "qk-norm (`model.qk_norm=true`)",
    "vit_cpu_cifar_rope_mixed": "mixed RoPE (`model.pos_embed=rope_mixed`)",
    "vit_cpu_cifar_swiglu": "SwiGLU (`model.mlp=swiglu`)",
    "vit_cpu_cifar_three_levers": "qk-norm + mixed RoPE + SwiGLU",
}


def cpu_lever_table(folder: Path) -> str:
    """lab/benchmark.py's record of the lever cases (`step_*.json`): each lever's img/s (median and the
    rounds' range), against the plain case's median, and against timm's same model where timm builds it (the
    interleaved ratio)."""
    from bench_cases import CASES, build_side

    results = {r["case"]: r for path in folder.glob("step_*.json") for r in json.loads(path.read_text())["results"]}
    plain = results["vit_cpu_cifar"]["sides"][0]["img_per_s"]
    rows = []
    for case, label in LEVER_LABELS.items():
        result = results[case]
        ours, peer = result["sides"][0], (result["sides"][1] if len(result["sides"]) > 1 else None)
        params = sum(p.numel() for p in build_side(CASES[case], "ours").parameters())
        spread = f"{min(ours['round_img_per_s']):.0f}-{max(ours['round_img_per_s']):.0f}"
        versus_timm = "-"
        if peer:
            versus_timm = f"{result['ratio_median']:.3f} ({result['ratio_p10']:.3f}-{result['ratio_p90']:.3f})"
        rows.append(
            [label, f"{params:,}", f"{ours['img_per_s']:.0f} ({spread})", f"{ours['img_per_s'] / plain:.2f}"]
            + [f"{peer['img_per_s']:.0f}" if peer else "-", versus_timm]
        )
    header = ["lever on vit_cpu_cifar", "params", "ours img/s (rounds' range)", "vs none", "timm img/s"]
    return markdown_table([*header, "ours / timm (p10-p90)"], rows)


# --- Serving, loading and memory on the CPU -------------------------------------------------------------------------


def _inference_results(folder: Path, pattern: str) -> list[dict]:
    """The cases of lab/benchmark.py's mode=inference records matching `pattern`, in the order measured."""
    return [r for path in sorted(folder.glob(pattern)) for r in json.loads(path.read_text())["results"]]


def _ms(value: float, spread: tuple[float, float] | None = None) -> str:
    """Milliseconds with about four significant digits (9.08, 86.51, 1,278.7, 2,376), and the spread beside them in
    parentheses at the same decimals."""
    decimals = 2 if value < 100 else 1 if value < 1000 else 0
    text = f"{value:,.{decimals}f}"
    return text if spread is None else f"{text} ({spread[0]:,.{decimals}f}-{spread[1]:,.{decimals}f})"


def inference_table(folder: Path) -> str:
    """lab/benchmark.py's mode=inference records (`inference_*.json`): a row per model, batch and runtime,
    ours against timm's same model: the median latency over rounds with ours' 10th-90th percentile, images a second
    from the median, and the median of the per-round throughput ratios with its spread."""
    rows = []
    for result in _inference_results(folder, "inference_*.json"):
        for row in result["runtimes"]:
            spread = _ms(row["ours_ms"], (row["ours_p10_ms"], row["ours_p90_ms"]))
            peer, ratio = "-", "-"
            if row["peer_ms"] is not None:
                peer = f"{_ms(row['peer_ms'])}"
                ratio = f"{row['ratio_median']:.3f} ({row['ratio_p10']:.3f}-{row['ratio_p90']:.3f})"
            rows.append(
                [f"`{result['case']}`", str(result["img_size"]), str(result["batch"]), row["runtime"], spread]
                + [rate(1000 * result["batch"] / row["ours_ms"]), peer, ratio]
            )
    header = ["model", "img px", "batch", "runtime", "ours ms (p10-p90)", "ours img/s", "timm ms"]
    return markdown_table([*header, "ours / timm (p10-p90)"], rows)


INT8_RUNTIMES = ("eager", "onnxruntime", "onnxruntime-int8-dynamic", "onnxruntime-int8-static")


def int8_speed_table(folder: Path) -> str:
    """lab/benchmark.py's mode=inference records of the INT8 files (`int8_*.json`): a row per model and batch,
    each runtime's median latency (10th-90th percentile over rounds), and dynamic INT8 against onnxruntime's fp32
    (the ratio of the medians)."""
    rows = []
    for result in _inference_results(folder, "int8_*.json"):
        runtimes = {row["runtime"]: row for row in result["runtimes"]}
        cells = [
            _ms(runtimes[name]["ours_ms"], (runtimes[name]["ours_p10_ms"], runtimes[name]["ours_p90_ms"]))
            for name in INT8_RUNTIMES
        ]
        speedup = runtimes["onnxruntime"]["ours_ms"] / runtimes["onnxruntime-int8-dynamic"]["ours_ms"]
        rows.append([f"`{result['case']}`", str(result["img_size"]), str(result["batch"]), *cells, f"{speedup:.2f}x"])
    header = ["model", "img px", "batch", "PyTorch eager fp32 ms", "onnxruntime fp32 ms", "INT8 dynamic ms"]
    return markdown_table([*header, "INT8 static (QDQ) ms", "dynamic vs onnxruntime fp32"], rows)


def shards_table(folder: Path) -> str:
    """lab/bench_shards.py's record (`shards.json`): per row the median images a second of each loader over
    the repeats (their range beside it) and the median of the per-repeat ratios shards / folders."""
    record = json.loads((folder / "shards.json").read_text())

    def cell(median: float, repeats: list[float]) -> str:
        return f"{median:,.0f} ({min(repeats):,.0f}-{max(repeats):,.0f})"

    rows = [
        [row["row"], cell(row["folders_img_per_s"], row["folders_img_per_s_repeats"])]
        + [cell(row["shards_img_per_s"], row["shards_img_per_s_repeats"]), f"**{row['shards_over_folders']:.2f}**"]
        for row in record["rows"]
    ]
    header = ["row", "folders img/s (repeats' range)", "shards img/s (repeats' range)", "shards / folders"]
    return markdown_table(header, rows)


def memory_table(folder: Path) -> str:
    """lab/bench_memory.py's record (`memory.json`): each process's peak RSS before and after its one step,
    the step's share (after - before) and its time, in the order run, then the medians and their ratio."""
    record = json.loads((folder / "memory.json").read_text())
    rows, seen = [], {}
    for process in record["rows"]:
        seen[process["setting"]] = seen.get(process["setting"], 0) + 1
        before, after = process["rss_before_mib"], process["rss_after_mib"]
        rows.append(
            [process["setting"], str(seen[process["setting"]]), f"{before:,.0f} MiB", f"{after:,.0f} MiB"]
            + [f"{after - before:,.0f} MiB", f"{process['step_s']:.1f} s"]
        )
    plain, checkpointed = record["medians"]["plain"], record["medians"]["checkpointed"]
    rows.append(
        ["**checkpointed / plain**", "medians", "", "", f"**{checkpointed['share_mib'] / plain['share_mib']:.2f}x**"]
        + [f"**{checkpointed['step_s'] / plain['step_s']:.2f}x**"]
    )
    header = ["setting", "repeat", "peak RSS before", "peak RSS after", "step's share", "step time"]
    return markdown_table(header, rows)


def fsdp_table(folder: Path) -> str:
    """lab/bench_fsdp.py's record (`fsdp.json`): per model and strategy, what one rank holds of the weights,
    gradients and optimizer state (the ranks' mean), the largest rank's peak memory and the median step; then each
    sharded strategy's state against DDP's divided by the world size, and its step time against DDP's."""
    record = json.loads((folder / "fsdp.json").read_text())
    world = record["settings"]["world_size"]
    strategies = record["settings"].get("strategies", ["ddp", "fsdp"])  # records before fsdp_zero2: these two
    parts = ("params_mib", "grads_mib", "optimizer_mib")
    summary: dict[tuple[str, str], dict] = {}
    for model in record["settings"]["models"]:
        for strategy in strategies:
            mine = [row for row in record["rows"] if row["model"] == model and row["strategy"] == strategy]
            summary[model, strategy] = {
                **{part: statistics.mean(row[part] for row in mine) for part in parts},
                "peak_mib": max(row["peak_mib"] for row in mine),
                "step_s": statistics.median(row["step_s"] for row in mine),
            }
    rows = []
    for (model, strategy), values in summary.items():
        state = sum(values[part] for part in parts)
        cells = [f"{values[part]:,.0f}" for part in parts]
        rows.append([model, strategy, *cells, f"{state:,.0f}", f"{values['peak_mib']:,.0f}", f"{values['step_s']:.2f}"])
        if strategy != "ddp" and (model, "ddp") in summary:
            ddp = summary[model, "ddp"]
            share = f"**{state / (sum(ddp[part] for part in parts) / world):.2f}x** DDP's / {world}"
            peak = f"{values['peak_mib'] / ddp['peak_mib']:.2f}x DDP's"
            step = f"**{values['step_s'] / ddp['step_s']:.2f}x** DDP's"
            rows.append([model, f"{strategy} against ddp", "", "", "", share, peak, step])
    header = ["model", "strategy", "weights MiB / rank", "gradients MiB / rank", "optimizer MiB / rank"]
    return markdown_table([*header, "state MiB / rank", "peak MiB (largest rank)", "step s (median)"], rows)


def naflex_table(folder: Path) -> str:
    """lab/bench_naflex.py's records (`naflex_*.json`, one per position encoding): the median img/s of a step
    on NaFlex batches and on the same images as tensors, and their ratio."""
    names = {"learned": "learned table (`model.pos_embed=learned`)"}
    names["rope_mixed"] = "mixed RoPE (`model.pos_embed=rope_mixed`)"
    rows, shapes = [], False
    for path in sorted(folder.glob("naflex_*.json")):
        record = json.loads(path.read_text())
        speed = record["img_per_s"]
        label = names.get(record["pos_embed"], f"`model.pos_embed={record['pos_embed']}`")
        row = [label, f"{speed['naflex']:.0f}", f"{speed['tensors']:.0f}", f"**{record['naflex_over_tensors']:.2f}x**"]
        if "shapes" in record:  # the NaFlex batches' images square, or of mixed shapes padded (`shapes=mixed`)
            shapes = True
            share = f", {record['valid_token_share']:.0%} of tokens valid" if record["shapes"] == "mixed" else ""
            row.insert(1, f"{record['shapes']}{share}")
        rows.append(row)
    header = ["positions", "NaFlex img/s", "image tensors img/s", "NaFlex / tensors"]
    return markdown_table(header[:1] + ["NaFlex images"] * shapes + header[1:], rows)


NAFLEX_SIZES = (16, 24, 32, 48, 64)  # the test-split sizes each run is evaluated at (vit-eval data.img_size=<px>)
NAFLEX_VARIANTS = {"naflex": "mixed resolution (`data.naflex.seq_lens=[16,36,64]`)", "fixed": "fixed 32 px"}


def naflex_sizes_table(folder: Path) -> str:
    """Runs trained at mixed resolution and at a fixed 32 px (`<variant>/seed<N>/`: metrics.json and vit-eval's
    `eval_<px>.json` at each of NAFLEX_SIZES): the epochs trained and the test top-1 at each size, mean over seeds
    (± half the spread), the better of the two at each size in bold."""
    means = {}
    rows = []
    for variant, label in NAFLEX_VARIANTS.items():
        seeds = sorted((folder / variant).glob("seed*"), key=_seed_of)
        epochs = [json.loads((seed / "metrics.json").read_text())["budget"]["planned_epochs"] for seed in seeds]
        cells = [label, str(len(seeds)), f"{min(epochs):.1f}-{max(epochs):.1f}"]
        for size in NAFLEX_SIZES:
            top1 = [json.loads((seed / f"eval_{size}.json").read_text())["top1"] for seed in seeds]
            means[variant, size] = mean_and_half_range(top1)
        rows.append(cells)
    for row, variant in zip(rows, NAFLEX_VARIANTS, strict=True):
        for size in NAFLEX_SIZES:
            mean, half = means[variant, size]
            best = mean == max(means[v, size][0] for v in NAFLEX_VARIANTS)
            text = f"{mean:.2f}% ± {half:.2f}"
            row.append(f"**{text}**" if best else text)
    header = ["training", "seeds", "epochs", *(f"top-1 at {size} px" for size in NAFLEX_SIZES)]
    return markdown_table(header, rows)


def map_table(points: list[dict]) -> str:
    """lab/accuracy_map.py's points: a row per width and epochs, the training PFLOPs and the holdout and test top-1
    (mean ± half the spread over seeds)."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for point in points:
        groups.setdefault((point["width"], point["epochs"]), []).append(point)
    rows = []
    for (width, epochs), group in sorted(groups.items()):
        holdout, test = ([p[key] for p in group] for key in ("holdout_top1", "test_top1"))
        pflops = statistics.fmean(p["train_flops"] for p in group) / 1e15
        params = group[0]["params"] / 1e6
        rows.append([f"{width} wide ({params:.2f} M)", str(epochs), str(len(group)), f"{pflops:.3f}",
                     seed_spread(holdout), seed_spread(test)])  # fmt: skip
    return markdown_table(["model", "epochs", "seeds", "training PFLOPs", "holdout top-1", "test top-1"], rows)


def seed_spread(values: list[float]) -> str:
    mean, half = mean_and_half_range(values)
    return f"{mean:.2f}%" if len(values) == 1 else f"{mean:.2f}% ± {half:.2f}"


def accuracy_map_table(folder: Path) -> str:
    """The map's record (`map.json`, lab/accuracy_map.py) as `map_table`."""
    return map_table(json.loads((folder / "map.json").read_text())["points"])


MAP_RECORD = "cifar10_accuracy_map_avx512"
# The levers the recipe took since commit 4971314, added one at a time after 4 epochs (seed 0): each label and the
# record, relative to the equal-epochs record's folder, of the run (metrics.json) or evaluation (vit-eval's JSON).
EQUAL_EPOCH_LEVERS = (
    ("the recipe of commit 4971314: AdamW, a cls token, 32 px throughout, the flip at evaluation", "runs/e4/seed0"),
    ("+ shifted crops at evaluation: six views (vit-eval on the same weights)", "tta/e4_seed0_flip_true_shift_1.json"),
    ("+ Muon for the encoder's matrices (today's code)", "levers_e4/muon/seed0"),
    ("+ sequence pooling in place of the cls token", "levers_e4/muon_seqpool/seed0"),
    ("+ progressive resizing from 16 px: the family at 96 wide (the map's run)", f"../{MAP_RECORD}/runs/w96_e4/seed0"),
    ("at 144 wide (the map's run)", f"../{MAP_RECORD}/runs/w144_e4/seed0"),
)


def _holdout_top1(path: Path) -> float:
    """The holdout top-1 of a run's folder (its metrics.json's last evaluation) or of vit-eval's JSON."""
    if path.is_dir():
        return json.loads((path / "metrics.json").read_text())["final"]["val_top1"]
    return json.loads(path.read_text())["top1"]


def equal_epochs_table(folder: Path) -> str:
    """The recipe of commit 4971314 at set epochs on the holdout (`runs/e<E>/seed<S>/`) beside the recipe family's
    runs of the map at 96 and 144 wide (its record's `runs/w<W>_e<E>/seed<S>/`): mean ± half the spread (seeds),
    and how far 144 wide leads the earlier recipe."""
    family = folder.parent / MAP_RECORD / "runs"
    rows = []
    for run in sorted((folder / "runs").iterdir(), key=lambda path: int(path.name.removeprefix("e"))):
        epochs = int(run.name.removeprefix("e"))
        earlier = [_holdout_top1(path) for path in sorted(run.glob("seed*"))]
        wide = {
            w: [_holdout_top1(path) for path in sorted((family / f"w{w}_e{epochs}").glob("seed*"))] for w in (96, 144)
        }
        cells = [f"{seed_spread(values)} ({len(values)})" for values in (earlier, wide[96], wide[144])]
        rows.append([str(epochs), *cells, f"{statistics.fmean(wide[144]) - statistics.fmean(earlier):+.2f}"])
    header = ["epochs", "recipe of 4971314 (seeds)", "family, 96 wide (seeds)", "family, 144 wide (seeds)"]
    return markdown_table([*header, "144 wide's lead, points"], rows)


def equal_epochs_levers_table(folder: Path) -> str:
    """`EQUAL_EPOCH_LEVERS`: each step's holdout top-1 after 4 epochs and what it added to the step before."""
    rows, before = [], None
    for label, relative in EQUAL_EPOCH_LEVERS:
        top1 = _holdout_top1(folder / relative)
        rows.append([label, f"{top1:.2f}%", "" if before is None else f"{top1 - before:+.2f}"])
        before = top1
    return markdown_table(["after 4 epochs, seed 0", "holdout top-1", "points added"], rows)


PHOTO_TRAININGS = {"native": "at their own shapes (`data.naflex.seq_lens=[64]`)", "square": "square crops"}


def photo_shapes_table(folder: Path) -> str:
    """lab/photo_shapes_experiment.py's record (results.json): each training's test top-1 evaluated at the crops'
    own shapes and square, mean ± half the spread over seeds, the better training of each evaluation in bold."""
    record = json.loads((folder / "results.json").read_text())
    summary, views = record["summary"], ("own_shapes", "square")
    best = {view: max(summary[f"{method}/{view}"]["mean"] for method in PHOTO_TRAININGS) for view in views}
    rows = []
    for method, label in PHOTO_TRAININGS.items():
        cells = [label, str(len(summary[f"{method}/square"]["test_top1"])), str(record["settings"]["epochs"])]
        for view in views:
            text = seed_spread(summary[f"{method}/{view}"]["test_top1"])
            cells.append(f"**{text}**" if summary[f"{method}/{view}"]["mean"] == best[view] else text)
        rows.append(cells)
    header = ["training", "seeds", "epochs", "test top-1, each crop whole at its shape", "test top-1, square crop"]
    return markdown_table(header, rows)


def augment_table(folder: Path) -> str:
    """lab/bench_augment.py's records (`augment_threads<n>.json`, one per thread count): a row per policy and
    implementation, the median ms per batch at each thread count and the aten ops dispatched per batch (views and
    tensors of under 16 elements among them), as the first record counted them."""
    records = sorted((json.loads(p.read_text()) for p in folder.glob("augment_*.json")), key=lambda r: -r["threads"])
    rows = []
    for index, row in enumerate(records[0]["rows"]):
        times = [f"{record['rows'][index]['ms_median']:.1f}" for record in records]
        ops = [f"{round(row['ops_per_batch'].get(name, 0))}" for name in ("all", "views", "small")]
        rows.append([row["policy"], row["implementation"], *times, *ops])
    threads = [f"ms / batch, {r['threads']} thread{'s' if r['threads'] > 1 else ''}" for r in records]
    header = ["policy", "implementation", *threads, "aten ops / batch", "of them views", "of them < 16 elements"]
    return markdown_table(header, rows)


def cpu_loader_table(folder: Path) -> str:
    """lab/bench_cpu_loader.py's records (`cpu_loader_run<n>.json`): a row per pipeline and run, each side's
    images a second on one core and the median per-batch ratio ours / timm with its quartiles."""
    rows = []
    for path in sorted(folder.glob("cpu_loader_run*.json")):
        run = path.stem.removeprefix("cpu_loader_")
        for row in json.loads(path.read_text())["rows"]:
            q1, q3 = row["ours_over_timm_quartiles"]
            rows.append(
                [f"{row['pipeline']}, {run.replace('run', 'run ')}", f"{row['ours_img_per_s']:.1f}"]
                + [f"{row['timm_img_per_s']:.1f}", f"{row['ours_over_timm_median']:.2f} [{q1:.2f}, {q3:.2f}]"]
            )
    header = ["pipeline", "ours img/s per core", "timm img/s per core", "ours / timm, median per batch [quartiles]"]
    return markdown_table(header, rows)


# --- The CPU-scale experiments (lab/distill_experiment.py, transfer_experiment.py) -------------------------

DISTILL_LABELS = {
    "alone": "alone (labels only)",
    "hard": "hard distillation, token",
    "soft": "soft distillation (tau 1), token",
}
TRANSFER_LABELS = {
    "finetune": "finetune (pretrained, all layers, layer decay 0.75)",
    "probe": "probe (pretrained, head only)",
    "scratch": "scratch (random init, same steps)",
}


def _seed_row(label: str, method: dict) -> list[str]:
    """A method's seeds (test top-1 each), their mean and sample standard deviation, as benchmarks' experiments
    record them (lab/experiments.py's `seed_table`); the mean and spread computed here from the seeds."""
    tops = method["test_top1"]
    spread = statistics.stdev(tops) if len(tops) > 1 else 0.0
    return [label, " / ".join(f"{top:.2f}" for top in tops), f"**{statistics.fmean(tops):.2f}**", f"{spread:.2f}"]


def _seconds_range(seconds: list[float]) -> str:
    return f"{min(seconds):.0f}-{max(seconds):.0f} s"


def distill_table(folder: Path) -> str:
    """lab/distill_experiment.py's record (`results.json`): each student's seeds on the test images, their
    mean and spread, the distilled students' final agreement with the teacher on the holdout, each run's wall time;
    the teacher's row last."""
    summary = json.loads((folder / "results.json").read_text())["summary"]
    rows = []
    for method, label in DISTILL_LABELS.items():
        agreement = summary[method].get("holdout_agreement")
        agreement = " / ".join(f"{a:.1f}" for a in agreement) + "%" if agreement else "-"
        rows.append([*_seed_row(label, summary[method]), agreement, _seconds_range(summary[method]["seconds"])])
    teacher = summary["teacher"]
    rows.append([f"teacher ({teacher['steps']} steps)", f"{teacher['test_top1']:.2f}", "", "", ""])
    rows[-1].append(f"{teacher['seconds']:.0f} s")
    header = ["student", "test top-1, each seed", "mean", "sample std", "final holdout agreement with the teacher"]
    return markdown_table([*header, "wall time per run"], rows)


def holdout_curve_table(folder: Path) -> str:
    """An experiment's record (`results.json`): each method's holdout top-1 at each evaluated step, the mean over its
    seeds (the figure's lines), with the seeds' range."""
    record = json.loads((folder / "results.json").read_text())
    methods = list(record["summary"])[:-1]  # the last entry is the teacher or the pretraining run, not a method
    rows, steps = [], []
    for method in methods:
        runs = [run for name, run in sorted(record["runs"].items()) if name.startswith(f"{method}-")]
        curves = [[(h["step"], h["val_top1"]) for h in run["history"] if h["val_top1"] is not None] for run in runs]
        steps = [step for step, _ in curves[0]]
        by_step = list(zip(*[[top for _, top in curve] for curve in curves], strict=True))
        cells = [f"{statistics.fmean(v):.1f}% ({min(v):.1f}-{max(v):.1f})" for v in by_step]
        rows.append([method, *cells])
    return markdown_table(["holdout top-1, mean of seeds (range)", *(f"step {step}" for step in steps)], rows)


def transfer_table(folder: Path) -> str:
    """lab/transfer_experiment.py's record (`results.json`): each start's seeds on the target classes' test
    images, their mean and spread, each run's wall time."""
    summary = json.loads((folder / "results.json").read_text())["summary"]
    rows = [
        [*_seed_row(label, summary[method]), _seconds_range(summary[method]["seconds"])]
        for method, label in TRANSFER_LABELS.items()
    ]
    return markdown_table(["start", "test top-1, each seed", "mean", "sample std", "wall time per run"], rows)


BUSY_CASES = {
    "vit_cpu_recipe_96 amp=none": "96 wide, fp32",
    "vit_cpu_recipe_96 amp=bf16": "96 wide, bf16",
    "vit_cpu_recipe_144 amp=none": "144 wide, fp32",
    "vit_cpu_recipe_144 amp=bf16": "144 wide, bf16",
}


def _img_s(text: str) -> list[float]:
    return [float(part.replace(",", "")) for part in text.split("+")]


BUSY_EVAL_CASES = {
    "eval 96 amp=none": "vit-eval, 96 wide, fp32",
    "eval 144 amp=bf16": "vit-eval, 144 wide, bf16",
}


def busy_step_table(folder: Path) -> str:
    """lab/busy_cpu.sh's printed lines for the training step (step.log)."""
    return _busy_table(folder / "step.log", BUSY_CASES)


def busy_eval_table(folder: Path) -> str:
    """lab/busy_cpu.sh eval's printed lines for vit-eval's whole pass over the test split (eval.log)."""
    return _busy_table(folder / "eval.log", BUSY_EVAL_CASES)


def _busy_table(log: Path, cases: dict[str, str]) -> str:
    """lab/busy_cpu.sh's printed lines (`case | setting | condition | img/s`), a row per pass of each case (a case
    measured twice gets a row a pass); each condition's ratio to the pass's idle 2-thread speed."""
    passes: list[tuple[str, dict]] = []
    for line in log.read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) != 4 or cells[0] not in cases:
            continue
        if not passes or passes[-1][0] != cells[0] or (cells[1], cells[2]) in passes[-1][1]:
            passes.append((cells[0], {}))
        passes[-1][1][(cells[1], cells[2])] = _img_s(cells[3])
    rows = []
    for case, got in passes:
        idle = got[("threads=2", "alone")][0]

        def cell(key, got=got, idle=idle) -> str:
            values = got[key]
            return f"{' + '.join(rate(v) for v in values)} ({sum(values) / idle:.2f}x)"

        rows.append(
            [
                cases[case],
                rate(idle),
                rate(got[("threads=auto", "alone")][0]),
                cell(("threads=2", "beside a busy core")),
                cell(("threads=auto", "beside a busy core")),
                cell(("threads=2 each", "beside a second run")),
                cell(("threads=1 each", "beside a second run")),
            ]
        )
    header = [
        "case",
        "alone, 2 threads img/s",
        "alone, auto",
        "busy core, before",
        "busy core, after",
        "second run, before (sum)",
        "second run, after (sum)",
    ]
    return markdown_table(header, rows)


def wait_policy_table(folder: Path) -> str:
    """The alternating passes with and without OMP_WAIT_POLICY=PASSIVE (wait_policy_alone.log: `pass | case |
    setting | img/s`): a row per case, each pass's img/s under the default and under PASSIVE."""
    got: dict[str, dict[str, list[str]]] = {}
    for line in (folder / "wait_policy_alone.log").read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) == 4 and cells[3]:
            side = "passive" if "PASSIVE" in cells[2] else "default"
            got.setdefault(cells[1], {"default": [], "passive": []})[side].append(cells[3])
    rows = [[f"`{case}`", ", ".join(sides["default"]), ", ".join(sides["passive"])] for case, sides in got.items()]
    return markdown_table(["case (lab/bench_cases.py)", "default img/s", "PASSIVE img/s"], rows)


def alone_interleaved_table(folder: Path) -> str:
    """The step alone with 2 threads and with auto, alternating (alone_interleaved.log: `case | pass | setting |
    img/s`): a row per case, each setting's passes."""
    got: dict[str, dict[str, list[str]]] = {}
    for line in (folder / "alone_interleaved.log").read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) == 4 and cells[3]:
            got.setdefault(cells[0], {}).setdefault(cells[2], []).append(cells[3])
    rows = [
        [BUSY_CASES.get(case, case), ", ".join(by["threads=2"]), ", ".join(by["threads=auto"])]
        for case, by in got.items()
    ]
    return markdown_table(["case", "alone, 2 threads img/s", "alone, auto img/s"], rows)


def late_load_table(folder: Path) -> str:
    """lab/budget_outside.py loads=late_core records (budget_late_core_*.json; "before" in the name: the reserve
    for the evaluations scaled by the plan's window alone; "window": also the evaluation's threads decided from the
    last full window when the epoch's last one is too short to read): a row per run, its wall time from outside against
    the budget, the steps trained, the test top-1 and the thread line before the last evaluation where logged."""
    rows = []
    for path in sorted(folder.glob("budget_late_core_*.json"), key=lambda p: ("before" not in p.name, p.name)):
        record = json.loads(path.read_text())
        run = record["runs"][0]
        line = ([x for x in run.get("log_lines", []) if "for the evaluation" in x] or [""])[-1]  # the last one
        rows.append(
            [
                f"[{path.stem}](results/{folder.name}/{path.name})",
                "before" if "before" in path.name else "after, last window" if "window" in path.name else "after",
                f"{record['budget_s']:.0f} s",
                f"{run['outside_wall_s']:.1f} s ({run['outside_over_budget_s']:+.1f})",
                "yes" if run["outside_within_tolerance"] else "no",
                f"{run['trained_steps']:,}",
                f"{run['top1']:.2f}",
                f"`{line.split(' - threads: ')[1].split(':')[0]}`" if line else "not logged",
            ]
        )
    header = ["record", "reserve", "budget", "wall from outside", "within tolerance", "steps", "test top-1",
              "threads for the last evaluation"]  # fmt: skip
    return markdown_table(header, rows)


def digits_table(folder: Path) -> str:
    """docs/DATA.md's small-image runs on scikit-learn's digits: a row per run folder (patch<P>_seed<S>), its
    final holdout top-1 (what the patch was chosen on), its test top-1 (read once, after the last epoch) and its
    wall time."""
    rows = []
    for run in sorted(p for p in folder.iterdir() if p.is_dir()):
        metrics = json.loads((run / "metrics.json").read_text())
        patch, seed = run.name.removeprefix("patch").split("_seed")
        rows.append(
            [
                f"[{run.name}](results/{folder.name}/{run.name}/metrics.json)",
                patch,
                seed,
                f"{metrics['final']['val_top1']:.2f}%",
                f"{metrics['test']['top1']:.2f}%",
                f"{metrics['wall_time_s']:.0f} s",
            ]
        )
    return markdown_table(["record", "patch", "seed", "holdout top-1", "test top-1", "wall time"], rows)


TWO_TRAININGS = [
    ("alone", "one alone"),
    ("before", "two started together, trainer.threads=2 each"),
    ("after", "two started together, auto each"),
    ("late", "the second 30 s after the first, auto each"),
]


def two_trainings_table(folder: Path) -> str:
    """Recipe trainings side by side (a folder a run: metrics.json, train.log; wall.log: each group's wall time):
    a row per group, its runs' epoch img/s, their sum against the lone run's, the threads lines, the wall time."""
    walls = [float(line.rsplit(":", 1)[1].split()[0]) for line in (folder / "wall.log").read_text().splitlines()]
    alone = None
    rows = []
    for (prefix, label), wall in zip(TWO_TRAININGS, walls, strict=True):
        runs = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.split("_")[0] == prefix)
        speeds = [json.loads((run / "metrics.json").read_text())["history"][0]["train_img_per_s"] for run in runs]
        alone = alone or speeds[0]
        lines = [
            re.sub(r"^.* - threads: ", "", line).split(" (")[0].split(": other")[0]
            for run in runs
            for line in (run / "train.log").read_text().splitlines()
            if " - threads: " in line
        ]
        rows.append(
            [
                label,
                " + ".join(rate(v) for v in speeds) + f" ({sum(speeds) / alone:.2f}x)",
                "; ".join(f"`{line}`" for line in lines),
                f"{wall:.1f} s",
            ]
        )
    return markdown_table(["runs", "epoch img/s (sum vs one alone)", "threads lines", "wall time of the group"], rows)


TABLES: dict[str, DocTable] = {
    "cifar10_cpu_budget_avx2": DocTable("cifar10_cpu_budget/avx2", cpu_budget_table),
    "cifar10_cpu_budget_2h_loaded_avx2": DocTable("cifar10_cpu_budget/avx2_2h_loaded", cpu_budget_table),
    "cifar10_cpu_budget_2h_avx2": DocTable("cifar10_cpu_budget/avx2_2h", cpu_budget_table),
    "cifar10_cpu_budget_avx2_96wide": DocTable("cifar10_cpu_budget/avx2_96wide", cpu_budget_table),
    "cifar10_cpu_budget_avx2_muon_seqpool": DocTable("cifar10_cpu_budget/avx2_muon_seqpool", cpu_budget_table),
    "cifar10_cpu_budget_avx2_progressive_resize": DocTable(
        "cifar10_cpu_budget/avx2_progressive_resize", cpu_budget_table
    ),
    "cifar10_cpu_budget_avx512": DocTable("cifar10_cpu_budget/avx512", cpu_budget_table),
    "cifar10_cpu_budget_2h_avx512": DocTable("cifar10_cpu_budget/avx512_2h", cpu_budget_table),
    "cifar10_cpu_budget_2h_w144_avx512": DocTable("cifar10_cpu_budget/avx512_2h_w144", cpu_budget_table),
    "cifar10_cpu_budget_2h_bf16_avx512": DocTable("cifar10_cpu_budget/avx512_2h_bf16", cpu_budget_table),
    "cifar10_2h_levers_avx512": DocTable("cifar10_2h_levers_avx512", budget_comparison_table),
    "cifar10_cpu_budget_30m_bf16_avx512": DocTable("cifar10_cpu_budget/avx512_30m_bf16", cpu_budget_table),
    "cifar10_cpu_budget_2h_autoaug_avx512": DocTable("cifar10_cpu_budget/avx512_2h_autoaug", cpu_budget_table),
    "cifar10_cpu_budget_30m_zen5": DocTable("cifar10_cpu_budget/avx512_zen5_30m", cpu_budget_table),
    "cifar10_cpu_budget_30m_autoaug_zen4": DocTable("cifar10_cpu_budget/avx512_zen4_30m_autoaug", cpu_budget_table),
    "cifar10_autoaug_30m_zen5": DocTable("cifar10_autoaug_zen5/30m", budget_comparison_table),
    "cifar10_autoaug_e16_zen5": DocTable("cifar10_autoaug_zen5/e16", budget_comparison_table),
    "cifar10_autoaug_e24_zen4_seed0": DocTable("cifar10_autoaug_zen4/e24/seed0", budget_comparison_table),
    "cifar10_autoaug_e24_zen4_seed1": DocTable("cifar10_autoaug_zen4/e24/seed1", budget_comparison_table),
    "cifar10_levers_e16_zen5": DocTable("cifar10_levers_e16_zen5", budget_comparison_table),
    "cifar10_levers_stem_cost_zen5": DocTable("cifar10_levers_e16_zen5", model_step_table),
    "cpu_naflex_sizes_avx512": DocTable("cpu_naflex_sizes_avx512", naflex_sizes_table),
    "cpu_photo_shapes_avx512": DocTable("cpu_photo_shapes_avx512", photo_shapes_table),
    "cifar10_accuracy_map_avx512": DocTable("cifar10_accuracy_map_avx512", accuracy_map_table),
    "cifar10_equal_epochs_zen5": DocTable("cifar10_equal_epochs_zen5", equal_epochs_table),
    "cifar10_equal_epochs_levers_zen5": DocTable("cifar10_equal_epochs_zen5", equal_epochs_levers_table),
    "gpu_budget_h200": DocTable("gpu_budget_h200", gpu_budget_table),
    "foundation_step_avx2": DocTable("foundation_step_avx2", model_step_table),
    "matmul_peak_h200": DocTable("gpu_budget_h200", matmul_peak_table),
    "cuda_tier_h200": DocTable("gpu_budget_h200", cuda_tier_table),
    "model_step_h200": DocTable("model_step_h200", model_step_table),
    "cpu_levers_avx2": DocTable("cpu_levers_avx2", cpu_lever_table),
    "cpu_compile_avx2": DocTable("cpu_compile_avx2", model_step_table),
    "cifar10_cpu_budget_search_avx2": DocTable("cifar10_cpu_budget_search_avx2", budget_search_table),
    "cifar10_cpu_holdout_30m_avx2": DocTable("cifar10_cpu_holdout_30m_avx2", budget_comparison_table),
    "cpu_levers_30m_avx2": DocTable("cpu_levers_30m_avx2", budget_comparison_table),
    "cpu_tta_avx2": DocTable("cpu_levers_30m_avx2", tta_table),
    "cpu_alternating_flip_avx2": DocTable("cpu_alternating_flip_avx2", budget_comparison_table),
    "cpu_progressive_resize_avx2": DocTable("cpu_progressive_resize_avx2", budget_comparison_table),
    "optimizer_step_avx2": DocTable("cpu_step_avx2", optimizer_step_table),
    "cpu_bf16_avx512": DocTable("cpu_bf16_avx512", cpu_bf16_table),
    "cpu_bf16_zen5": DocTable("cpu_step_zen5", cpu_bf16_table),
    "busy_cpu_step_zen5": DocTable("busy_cpu_zen5", busy_step_table),
    "busy_cpu_step_xeon_amx": DocTable("busy_cpu_xeon_amx", busy_step_table),
    "recipe_widths_xeon_amx": DocTable("cpu_step_xeon_amx", width_rate_table),
    "matmul_xeon_amx": DocTable("cpu_step_xeon_amx", cpu_matmul_table),
    "malloc_xeon_amx": DocTable("cpu_malloc_xeon_amx", malloc_table),
    "layernorm_error_xeon_amx": DocTable("cpu_layernorm_xeon_amx", layernorm_error_table),
    "layernorm_training_xeon_amx": DocTable("cpu_layernorm_xeon_amx/equal_epochs", layernorm_training_table),
    "malloc_fp32_96_xeon_amx": DocTable("cpu_malloc_xeon_amx/fp32_96", malloc_table),
    "cifar10_widths_30m_xeon_amx": DocTable("cifar10_cpu_budget/amx_xeon_30m_widths", budget_comparison_table),
    "cifar10_levers_30m_xeon_amx": DocTable("cifar10_cpu_budget/amx_xeon_30m_levers", levers_beside_recipe_table),
    "busy_cpu_wait_policy_zen5": DocTable("busy_cpu_zen5", wait_policy_table),
    "busy_cpu_eval_zen5": DocTable("busy_cpu_zen5", busy_eval_table),
    "busy_cpu_alone_zen5": DocTable("busy_cpu_zen5", alone_interleaved_table),
    "busy_cpu_late_load_zen5": DocTable("busy_cpu_zen5", late_load_table),
    "budget_first_plan": DocTable("cifar10_cpu_budget", first_plan_table),
    "digits_small_images_zen5": DocTable("digits_small_images_zen5", digits_table),
    "busy_cpu_two_trainings_zen5": DocTable("busy_cpu_zen5/two_trainings", two_trainings_table),
    "cifar10_proxy_base": DocTable("cifar10_proxy_base", proxy_base_table),
    "cpu_profile_avx2": DocTable("cpu_step_avx2", cpu_profile_table),
    "cpu_inference_avx2": DocTable("cpu_inference_avx2", inference_table),
    "cpu_int8_speed_avx2": DocTable("cpu_inference_avx2", int8_speed_table),
    "cpu_shards_avx2": DocTable("cpu_shards_avx2", shards_table),
    "cpu_grad_checkpointing_avx2": DocTable("cpu_grad_checkpointing_avx2", memory_table),
    "cpu_fsdp_avx2": DocTable("cpu_fsdp_avx2", fsdp_table),
    "cpu_naflex_avx2": DocTable("cpu_naflex_avx2", naflex_table),
    "cpu_naflex_mixed_avx512": DocTable("cpu_naflex_mixed_avx512", naflex_table),
    "cpu_augment_avx2": DocTable("cpu_augment_avx2", augment_table),
    "cpu_loader_imagenet_avx2": DocTable("cpu_loader_imagenet_avx2", cpu_loader_table),
    "distill_cpu_avx2": DocTable("distill_cpu_avx2", distill_table),
    "distill_curve_cpu_avx2": DocTable("distill_cpu_avx2", holdout_curve_table),
    "transfer_cpu_avx2": DocTable("transfer_cpu_avx2", transfer_table),
    "what_to_expect": DocTable("", lambda results: headline_table(HEADLINES_CPU, results, "docs/results/")),
    "results_at_a_glance": DocTable("", lambda results: headline_table(HEADLINES, results, "results/")),
}


def render(name: str, results: Path = RESULTS) -> str:
    """The block's body: the table and the line naming its records."""
    table = TABLES[name]
    folder = results / table.records
    where = f"the records in `docs/results/{table.records}/`" if table.records else "the records each row links"
    return f"{table.build(folder)}\n\nGenerated by `python lab/doc_tables.py` from {where}.\n"


def blocks(text: str) -> list[tuple[str, str]]:
    """(name, body) of each generated block of a document."""
    return [(m.group("name"), m.group("body")) for m in BLOCK.finditer(text)]


def regenerate(text: str, results: Path = RESULTS) -> str:
    """`text` with every block's body replaced by what its records give; an unknown name is a KeyError."""
    return BLOCK.sub(lambda m: m.group("open") + render(m.group("name"), results) + m.group("close"), text)


# --- figures without a record --------------------------------------------------------------------------------------

# A table whose header names one of these is a table of measured figures (speed, accuracy, memory, time).
MEASURED_HEADER = re.compile(
    r"top-1|img/s|\bms\b|TFLOP|MFU|wall|GiB|\bGB\b|RSS|loss|seconds|share|first step|agreement|speed|time", re.I
)
HEADING = re.compile(r"^#+\s+(.*)$")
DIVIDER = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")


@dataclass(frozen=True)
class MeasuredTable:
    """A table of measured figures in a document: its file, the heading of its section, its line, and whether it is
    generated from records (inside a `<!-- table: -->` block)."""

    doc: str
    section: str
    line: int
    generated: bool


def sections(text: str) -> list[tuple[str, list[tuple[int, str]]]]:
    """(heading, [(line number, line), ...]) of each section of a Markdown text; a `#` line inside a fenced code
    block is not a heading."""
    found, heading, lines, fenced = [], "", [], False
    for number, line in enumerate(text.split("\n"), 1):
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            found.append((heading, lines))
            heading, lines = match.group(1).strip(), []
        lines.append((number, line))
    found.append((heading, lines))
    return found


def measured_tables(doc: str, text: str) -> list[MeasuredTable]:
    """The tables of measured figures in `text` (the Markdown of `doc`), by their header row, with the heading of
    the section each sits in (`sections`: a `#` line in a code block is not a heading)."""
    found = []
    for section, lines in sections(text):
        generated = False
        for position, (number, line) in enumerate(lines):
            if line.startswith("<!-- table:"):
                generated = True
            elif line.startswith("<!-- /table"):
                generated = False
            elif line.startswith("|") and position + 1 < len(lines) and DIVIDER.match(lines[position + 1][1]):
                if MEASURED_HEADER.search(line):
                    found.append(MeasuredTable(doc, section, number, generated))
    return found


REGISTRY = RESULTS / "README.md"
REGISTRY_SECTION = "## Figures measured before records were kept"


def registry_rows(registry: Path, section: str) -> list[list[str]]:
    """The cells of each row of the registry's table under `section` that names a document (docs/..., README);
    none when the registry has no such section."""
    text = registry.read_text()
    if section not in text:
        return []
    listed = text[text.index(section) :].split("\n## ")[0]
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in listed.splitlines()
        if line.startswith(("| docs/", "| README"))
    ]


def unbacked_sections(registry: Path = REGISTRY) -> set[tuple[str, str]]:
    """(document, section) of each row of the registry of figures measured before records were kept."""
    return {(cells[0], cells[1]) for cells in registry_rows(registry, REGISTRY_SECTION)}


def unaccounted(docs: list[Path], registry: Path = REGISTRY, root: Path = REPO) -> list[str]:
    """Problems with the docs' tables of measured figures: one neither generated nor in the registry (or in
    README.md, where only generated figures belong), and a registry row naming no such table. Paths are named
    relative to `root`, the repository."""
    listed, problems, found = unbacked_sections(registry), [], set()
    for path in docs:
        doc = path.relative_to(root).as_posix()
        for table in measured_tables(doc, path.read_text()):
            found.add((table.doc, table.section))
            if table.generated:
                continue
            if doc == "README.md":
                problems.append(f"{doc}:{table.line}: a table of measured figures in the README that no record backs")
            elif (doc, table.section) not in listed:
                problems.append(
                    f"{doc}:{table.line} ({table.section}): a table of measured figures that is neither generated "
                    f"from records nor listed in {registry.relative_to(root)}"
                )
    for doc, section in sorted(listed - found):
        problems.append(
            f"{registry.relative_to(root)}: lists {doc}, {section!r}, which holds no table of measured figures"
        )
    return problems
