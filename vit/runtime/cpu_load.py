"""How busy this process's CPUs are with other work, read from the kernel's counters (Linux /proc; elsewhere the
reading is None and the rules fall back to the CPU count).

`others_busy` is the CPUs that other processes kept busy between two `CpuSample`s: the busy time of the CPUs in this
process's affinity (steal time included: a hypervisor's other guests take it), less this process's own time and its
children's (the loader's workers). `fitting_threads` turns it into a thread count: the CPUs left free, at least one.
A count above what is free puts two runnable threads on one core, and every parallel region then waits for the one
that is descheduled. This module imports no torch."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def process_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity; every CPU where the platform has none)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class CpuSample:
    """The counters at one moment: clock seconds, busy ticks of the process's CPUs, ticks of this process tree."""

    at: float
    busy_ticks: int
    own_ticks: int


def _busy_ticks(cpus: set[int]) -> int:
    busy = 0
    for line in (PROC / "stat").read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy


def _process_ticks(stat: str) -> tuple[int, int]:
    """(parent pid, user + system ticks) from a /proc/<pid>/stat line."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def _own_ticks() -> int:
    """This process's ticks (all its threads) and those of its live children (loader workers, one level down)."""
    me = os.getpid()
    _, ticks = _process_ticks((PROC / "self" / "stat").read_text())
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            parent, child = _process_ticks((entry / "stat").read_text())
        except (OSError, IndexError, ValueError):  # the process ended while it was read
            continue
        if parent == me:
            ticks += child
    return ticks


def sample(cpus: set[int] | None = None) -> CpuSample | None:
    """The counters now; None where /proc cannot be read (not Linux, a sandbox without it)."""
    try:
        return CpuSample(time.monotonic(), _busy_ticks(cpus or process_cpus()), _own_ticks())
    except (OSError, ValueError, IndexError):
        return None


def others_busy(before: CpuSample | None, after: CpuSample | None) -> float | None:
    """The CPUs other processes kept busy on average between two samples (0.0 on an idle machine, about 1.0 beside
    one busy loop); None without both samples or over too short a time to read."""
    if before is None or after is None:
        return None
    seconds = after.at - before.at
    if seconds < 0.05:
        return None
    ticks = (after.busy_ticks - before.busy_ticks) - (after.own_ticks - before.own_ticks)
    return max(0.0, ticks / os.sysconf("SC_CLK_TCK") / seconds)


def busy_now(seconds: float = 0.3, cpus: set[int] | None = None) -> float | None:
    """`others_busy` over the next `seconds` (the process waits that long)."""
    before = sample(cpus)
    time.sleep(seconds)
    return others_busy(before, sample(cpus))


def fitting_threads(cpus: int, others: float | None) -> int:
    """The threads that fit beside the other work: the CPUs it leaves free (a CPU counts as taken from half busy
    on), at least 1; all `cpus` when the load is unknown."""
    if others is None:
        return max(1, cpus)
    return max(1, min(cpus, cpus - int(others + 0.5)))
