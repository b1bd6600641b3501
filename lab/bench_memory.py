"""Peak memory and time of one training step with and without gradient checkpointing, on the CPU.

usage: python lab/bench_memory.py [model=vit_base] [img_size=224] [batch_size=32] [num_classes=1000]
    [repeats=3] [json=<file>]

Each measurement runs in a fresh process, so its peak resident set size (`ru_maxrss`) belongs to that step
alone: the process builds the model and a random batch, reads its peak RSS ("before"), runs one forward and
backward pass (cross-entropy against random labels, fp32, train mode), and reads its peak RSS again ("after").
The step's own share is after - before. The two settings alternate, one process at a time, `repeats` times.
`model` is a registered model name, `num_classes` its classifier's size. json=<file> writes the measurement
record: every process's peak RSS before and after and its step time, the medians per setting,
and the provenance (command, commit, machine, versions: vit/records/provenance.py).

    python lab/bench_memory.py                       # ViT-B/16, 224 px, 1000 classes, batch 32, 3 repeats
    python lab/bench_memory.py model=vit_tiny batch_size=8 repeats=1 json=memory.json
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from records import script_command  # noqa: E402

from vit.cli.args import parse_args, run_script  # noqa: E402  (this checkout's vit, in the child processes too)
from vit.errors import UsageError  # noqa: E402

SETTINGS = ("plain", "checkpointed")
NUMBERS = ("img_size", "batch_size", "num_classes", "repeats")
KNOWN = {"model": "vit_base", "img_size": "224", "batch_size": "32", "num_classes": "1000", "repeats": "3"}


def read_args(argv: list[str]) -> SimpleNamespace:
    """The settings; `one=<setting>` (internal, not in the usage) measures that setting in this process."""
    internal = {"one": None} if any(arg.startswith("one=") for arg in argv) else {}
    args = parse_args(argv, {**KNOWN, "json": None, **internal})
    if args.get("one") is not None and args["one"] not in SETTINGS:
        raise UsageError(f"one={args['one']!r} must be one of {', '.join(SETTINGS)}")
    numbers = {key: args.integer(key) for key in NUMBERS}
    return SimpleNamespace(model=args["model"], **numbers, json=args["json"], one=args.get("one"))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measure_one(args: SimpleNamespace) -> dict:
    """One step in this process: peak RSS before and after it, and its wall time."""
    import torch
    import torch.nn.functional as F

    from vit.models import create_model

    torch.manual_seed(0)
    model = create_model(args.model, img_size=args.img_size, num_classes=args.num_classes).train()
    model.set_grad_checkpointing(args.one == "checkpointed")
    images = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    labels = torch.randint(0, args.num_classes, (args.batch_size,))
    before = peak_rss_mib()
    start = time.perf_counter()
    F.cross_entropy(model(images), labels).backward()
    seconds = time.perf_counter() - start
    return {"setting": args.one, "rss_before_mib": before, "rss_after_mib": peak_rss_mib(), "step_s": seconds}


def run_child(args: SimpleNamespace, setting: str) -> dict:
    command = [sys.executable, __file__, f"one={setting}", f"model={args.model}", f"img_size={args.img_size}"]
    command += [f"batch_size={args.batch_size}", f"num_classes={args.num_classes}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"bench_memory: the {setting} process failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def medians(rows: list[dict]) -> dict:
    """Per setting: the median step time and the median step's share of the peak RSS (after - before)."""
    out = {}
    for setting in SETTINGS:
        mine = [r for r in rows if r["setting"] == setting]
        out[setting] = {
            "step_s": statistics.median(r["step_s"] for r in mine),
            "share_mib": statistics.median(r["rss_after_mib"] - r["rss_before_mib"] for r in mine),
        }
    return out


def summary(rows: list[dict]) -> str:
    lines = ["setting        peak RSS before   peak RSS after   step's share   step time"]
    for setting in SETTINGS:
        mine = [r for r in rows if r["setting"] == setting]
        for r in mine:
            share = r["rss_after_mib"] - r["rss_before_mib"]
            lines.append(
                f"{setting:<14} {r['rss_before_mib']:>11.0f} MiB {r['rss_after_mib']:>12.0f} MiB "
                f"{share:>10.0f} MiB {r['step_s']:>9.1f} s"
            )
    median = {s: statistics.median(r["step_s"] for r in rows if r["setting"] == s) for s in SETTINGS}
    lines.append(f"step time ratio checkpointed / plain (medians): {median['checkpointed'] / median['plain']:.2f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = read_args(argv)
    if args.one:
        print(json.dumps(measure_one(args)))
        return 0
    rows = []
    for repeat in range(args.repeats):
        for setting in SETTINGS:  # interleaved: a drift in the machine's load touches both settings alike
            rows.append(run_child(args, setting))
            print(f"repeat {repeat + 1}: {json.dumps(rows[-1])}", flush=True)
    print(summary(rows))
    if args.json:
        from records import measurement_record, write_record

        settings = {key: getattr(args, key) for key in ("model", *NUMBERS)}
        values = {"settings": settings, "rows": rows, "medians": medians(rows)}
        write_record(measurement_record("bench_memory", values, script_command(__file__, argv)), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))
