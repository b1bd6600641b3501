"""Which loader, worker count and thread count train fastest on this CPU: the trainer's own epoch img/s (loading,
augmentation, step, all of it) for each setting, each run in its own process, settings interleaved round by round.

usage: python lab/bench_cpu_setup.py data.root=<CIFAR-10 JPEG folder or archive> [rounds=3] [batches=60]
    [settings=<name>,<name>,...] [experiment=cifar10_cpu] [warmup=true] [json=<path>]

The settings (name: overrides):
    memory-t<T>       data.loader=resident trainer.threads=<T>: the decoded splits held in memory, augmented in process
    torch-w<W>-t<T>   data.loader=torch data.num_workers=<W> trainer.threads=<T>: worker processes decode the JPEGs
for T in 1..CPUs and W in 0..CPUs. Default: all of them. Each run trains `batches` batches of one epoch of
`experiment` (checkpoints, EMA, flip averaging and most of the evaluation off) after the decoded cache and the
image scan are warm (a first, untimed run of 2 batches fills them; warmup=false leaves it out). Prints a markdown
table of the median img/s per setting and its ratio to the fastest; json=<path> writes the measurement record:
every round's img/s of every setting, the medians, the settings' overrides, and the provenance (command, commit,
machine, versions: vit/records/provenance.py). docs/BENCHMARKS.md ("The CPU loader and thread defaults") has the
results behind `data.loader=auto` and `trainer.threads=auto`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from records import measurement_record, script_command, write_record

from vit.cli.args import parse_args, run_script
from vit.data.resources import available_cpus
from vit.errors import UsageError

REPO = Path(__file__).resolve().parents[1]


def all_settings(cpus: int) -> dict[str, list[str]]:
    settings = {f"memory-t{t}": ["data.loader=resident", f"trainer.threads={t}"] for t in range(1, cpus + 1)}
    for workers in range(0, cpus + 1):
        for threads in range(1, cpus + 1):
            settings[f"torch-w{workers}-t{threads}"] = [
                "data.loader=torch",
                f"data.num_workers={workers}",
                f"trainer.threads={threads}",
            ]
    return settings


def train_img_per_s(experiment: str, root: str, batches: int, overrides: list[str]) -> float:
    with tempfile.TemporaryDirectory(prefix="vit-cpu-setup-") as run_dir:
        command = [
            sys.executable,
            str(REPO / "train.py"),
            f"experiment={experiment}",
            f"data.root={root}",
            "trainer.epochs=1",
            f"trainer.limit_train_batches={batches}",
            "trainer.limit_val_batches=1",
            "trainer.ema=false",
            "trainer.eval_flip=false",
            "trainer.save_checkpoints=false",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise UsageError(f"{' '.join(overrides)}: train.py exited {done.returncode}: {done.stderr.strip()[-500:]}")
        return float(json.loads((Path(run_dir) / "metrics.json").read_text())["train_img_per_s"])


def main(argv: list[str]) -> int:
    known = {"data.root": None, "rounds": "3", "batches": "60", "settings": None, "experiment": "cifar10_cpu"}
    args = parse_args(argv, {**known, "warmup": "true", "json": None}, ("data.root",), lists=("settings",))
    settings = all_settings(available_cpus())
    names = args["settings"] or list(settings)
    unknown = [n for n in names if n not in settings]
    if unknown:
        raise UsageError(f"settings: {unknown[0]!r} is not one of {', '.join(settings)}")
    rounds, batches = args.integer("rounds"), args.integer("batches")
    if args.flag("warmup", True):
        train_img_per_s(args["experiment"], args["data.root"], 2, settings[names[0]])  # warm the caches
    results: dict[str, list[float]] = {n: [] for n in names}
    for round_index in range(rounds):
        for name in names:  # interleaved: every setting once per round
            results[name].append(train_img_per_s(args["experiment"], args["data.root"], batches, settings[name]))
            print(f"round {round_index + 1} {name}: {results[name][-1]:.0f} img/s", file=sys.stderr, flush=True)
    medians = {n: statistics.median(v) for n, v in results.items()}
    best = max(medians.values())
    print("| setting | overrides | img/s (median) | min-max | vs fastest |\n|---|---|---|---|---|")
    for name in sorted(names, key=medians.get, reverse=True):
        low, high = min(results[name]), max(results[name])
        overrides = " ".join(settings[name])
        print(f"| {name} | `{overrides}` | {medians[name]:.0f} | {low:.0f}-{high:.0f} | {medians[name] / best:.2f} |")
    if args["json"]:
        values = {"experiment": args["experiment"], "batches": batches, "rounds": results, "medians": medians}
        values["settings"] = {name: settings[name] for name in names}
        write_record(measurement_record("bench_cpu_setup", values, script_command(__file__, argv)), args["json"])
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
