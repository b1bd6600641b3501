"""A budgeted training timed from outside its process: does `trainer.budget` hold the process's whole wall time?

usage: python lab/budget_outside.py [budget=60s] [loads=idle,one_core,late_core] [json=<file>] [<override> ...]

Runs `python train.py trainer.budget=<budget> <overrides>` once per load: `idle` alone, `one_core` beside a process
that keeps one core busy (a Python loop) for the whole run, `late_core` with that loop started at 80% of the budget
(the load changes near the end, where the last evaluation's time was planned on an idle machine). Each run's wall
time is taken from outside (from before the fork to the exit), beside what its metrics.json records (`wall_time_s`,
and `budget`: the planned and trained steps, the overrun, whether it is within the tolerance of 2% or 5 s) and the
exit code. Prints one JSON
record, and with json=<file> writes it there with the provenance (vit/records/provenance.py). Any other `key=value`
argument is an override of train.py's (e.g. `experiment=cifar10_cpu data.root=<archive>`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from records import measurement_record, script_command, write_record

from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.settings.trainer import parse_budget
from vit.train.budget import tolerance

REPO = Path(__file__).resolve().parents[1]
LOADS = ("idle", "one_core", "late_core")
LATE = 0.8  # late_core: the share of the budget before the loop starts
LOGGED = ("threads", ": train loss", "budget", "test top-1", "width")
OWN_KEYS = ("budget", "loads", "json")


def busy_core() -> subprocess.Popen:
    """A process that keeps one core busy until it is killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def timed_run(budget: str, overrides: list[str], load: str, folder: Path) -> dict:
    burner = busy_core() if load == "one_core" else None
    try:
        args = [sys.executable, str(REPO / "train.py"), f"trainer.budget={budget}", *overrides]
        args.append(f"hydra.run.dir={folder}")
        start = time.perf_counter()
        training = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if load == "late_core":
            try:
                training.wait(timeout=LATE * parse_budget(budget))
            except subprocess.TimeoutExpired:
                burner = busy_core()
        stdout, stderr = training.communicate()
        outside = time.perf_counter() - start
        done = subprocess.CompletedProcess(args, training.returncode, stdout, stderr)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    metrics_file = folder / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
    log_file = folder / "train.log"
    log_lines = log_file.read_text().splitlines() if log_file.exists() else []
    record = metrics.get("budget", {})
    budget_s = parse_budget(budget)
    return {
        "load": load,
        "exit_code": done.returncode,
        "outside_wall_s": round(outside, 3),
        "recorded_wall_s": metrics.get("wall_time_s"),
        "outside_over_budget_s": round(outside - budget_s, 3),
        # Of a run that trained: a refused one (a budget too small for it, exit 2) holds no budget to judge.
        "outside_within_tolerance": outside - budget_s <= tolerance(budget_s) if done.returncode == 0 else None,
        "planned_steps": record.get("planned_steps"),
        "trained_steps": record.get("trained_steps"),
        "replans": record.get("replans"),
        "top1": (metrics.get("test") or {}).get("top1") or (metrics.get("final") or {}).get("val_top1"),
        "budget_record": record,  # metrics.json's budget: every plan, the final lr (the run folder is not kept)
        "stderr_tail": done.stderr[-500:] if done.returncode else "",
        # the run's own account of its end: its threads, epochs and budget lines (the run folder is not kept)
        "log_lines": [line for line in log_lines if any(word in line for word in LOGGED)],
    }


def main(argv: list[str]) -> int:
    overrides = [arg for arg in argv if arg.split("=", 1)[0] not in OWN_KEYS]
    own = parse_args([arg for arg in argv if arg not in overrides], {"budget": "60s", "loads": ",".join(LOADS),
                                                                     "json": None}, lists=("loads",))  # fmt: skip
    budget = own["budget"]
    parse_budget(budget)  # a bad one: one line naming it
    loads = own["loads"]
    unknown = [load for load in loads if load not in LOADS]
    if unknown:
        raise UsageError(f"loads={','.join(loads)!r}: {', '.join(unknown)} not among {', '.join(LOADS)}")
    with tempfile.TemporaryDirectory() as scratch:
        runs = [timed_run(budget, overrides, load, Path(scratch) / load) for load in loads]
    values = {"budget": budget, "budget_s": parse_budget(budget), "overrides": overrides, "runs": runs}
    record = measurement_record("budget_outside", values, script_command(__file__, argv))
    if own["json"]:
        write_record(record, own["json"])
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
