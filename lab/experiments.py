"""What the CPU-sized experiment scripts (lab/transfer_experiment.py, lab/distill_experiment.py) share:
the small ViT/4 and data settings of their runs, one `train.py` process per run, the per-method seed table, and
their results.json: a measurement record (vit/records/provenance.py) holding every run's metrics."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from records import measurement_record, write_record

REPO = Path(__file__).resolve().parents[1]

# The ViT/4 of every run (0.46 M parameters), CIFAR-10's JPEGs at 32 px on the GPU loader's code path (on the CPU),
# pad-crop and flip only, and the trainer settings of a one-thread CPU run.
SMALL_VIT = ["model=vit_tiny", "model.embed_dim=96", "model.depth=6", "model.num_heads=3", "model.mlp_ratio=2.0"]
SMALL_VIT += ["model.drop_path_rate=0.0"]
CIFAR_JPEGS = [
    "data=imagefolder",
    "data.img_size=32",
    "data.patch_size=4",
    "data.loader=resident",
    "data.num_workers=0",
]
CIFAR_JPEGS += ["data.mean=[0.4914,0.4822,0.4465]", "data.std=[0.2470,0.2435,0.2616]", "data.augment.crop=pad"]
CIFAR_JPEGS += ["data.augment.hflip=true", "data.augment.auto_augment=null", "data.augment.label_smoothing=0.0"]
CPU_TRAINER = ["trainer.device=cpu", "trainer.compile=false", "trainer.ema=false", "trainer.progress=log"]
CPU_TRAINER += ["trainer.attn_maps_every_n_epochs=0", "optim=adamw", "sched=cosine"]


def train(name: str, overrides: list[str], work: Path) -> dict:
    """One `train.py` process with one thread; its metrics.json (kept: a finished run is not trained again)."""
    run_dir = work / "runs" / name
    metrics = run_dir / "metrics.json"
    if metrics.is_file():
        return json.loads(metrics.read_text())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    start = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    (work / "runs").mkdir(parents=True, exist_ok=True)
    (work / "runs" / f"{name}.log").write_text(" ".join(command) + "\n\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    print(f"{name}: {time.time() - start:.0f} s", flush=True)
    return json.loads(metrics.read_text())


def seed_table(runs: dict[str, dict], method: str) -> dict:
    """The runs named `<method>-<seed>`: test top-1 of each seed, mean, sample standard deviation, min, max and
    wall times."""
    mine = {k: v for k, v in runs.items() if k.startswith(f"{method}-")}
    tops = [mine[k]["test"]["top1"] for k in sorted(mine)]
    spread = statistics.stdev(tops) if len(tops) > 1 else 0.0
    table = {"test_top1": tops, "mean": statistics.mean(tops), "std": spread, "min": min(tops), "max": max(tops)}
    return table | {"seconds": [mine[k]["wall_time_s"] for k in sorted(mine)]}


def plot_seed_curves(ax, runs: dict[str, dict], method: str, color: str, **style) -> None:
    """On `ax`: the holdout top-1 against optimizer steps of the runs named `<method>-<seed>`, their mean as a line
    and their min-max range shaded."""
    mine = [v for k, v in sorted(runs.items()) if k.startswith(f"{method}-")]
    curves = [[(r["step"], r["val_top1"]) for r in run["history"] if r["val_top1"] is not None] for run in mine]
    steps = [s for s, _ in curves[0]]
    values = list(zip(*[[v for _, v in curve] for curve in curves], strict=True))
    mean = [statistics.mean(v) for v in values]
    ax.plot(steps, mean, color=color, label=f"{method} (mean of {len(mine)} seeds)", **style)
    ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.2)


def run_or_load(
    args,
    run_all,
    summary,
    setting_types: tuple[type, ...] = (int,),
    *,
    measurement: str = "experiment",
    command: list[str] | None = None,
) -> dict:
    """The experiment's results: read from <work>/results.json with plot_only=true, else run (`run_all(args)`), with
    the wall time, the numeric settings (of `setting_types`) and `summary(results)` added, and written there as
    the measurement record `measurement` of `command` (default sys.argv): its provenance beside every run's
    metrics (each seed's history and test top-1) and the summary."""
    path = args.work / "results.json"
    if args.plot_only:
        return json.loads(path.read_text())
    start = time.time()
    results = run_all(args)
    results["wall_time_s"] = time.time() - start
    settings = {k: v for k, v in vars(args).items() if isinstance(v, setting_types) and not isinstance(v, bool)}
    results["settings"] = settings
    results["summary"] = summary(results)
    results = measurement_record(measurement, results, command)
    write_record(results, path)
    return results
