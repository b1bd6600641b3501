"""What a measurement script writes: one JSON record of what it measured, every value (per round, per seed, not only
the summary), the command that ran it and where it came from (commit, machine, library versions:
vit/records/provenance.py, the provenance every metrics.json carries too).

    record = measurement_record("bench_matmul", {"rounds": [...], "median_tflops": 694.1})
    write_record(record, "matmul.json")
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vit.records.files import atomic_write_text
from vit.records.provenance import provenance


def measurement_record(measurement: str, values: dict, argv: list[str] | None = None) -> dict:
    """One record: what was measured (the tool's name), where it came from, and every value (per round, per seed,
    not only the summary) as the tool computed them."""
    return {"measurement": measurement, "provenance": provenance(argv), **values}


def write_record(record: dict, path: str | Path) -> Path:
    """`record` as indented JSON at `path` (folders made; written atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json.dumps(record, indent=2) + "\n", path)
    return path


def script_command(script: str, argv: list[str] | None) -> list[str]:
    """The command a script's measurement record names: the process's own command line where `main` was given it
    (`argv` None, or sys.argv's arguments), else `<folder>/<name>.py` (lab/benchmark.py) and the
    arguments `main` was called with (a test calling `main` in its process)."""
    if argv is None or (Path(sys.argv[0]).name == Path(script).name and sys.argv[1:] == list(argv)):
        return list(sys.argv)
    return [f"{Path(script).resolve().parent.name}/{Path(script).name}", *argv]
