"""Where a measurement came from: the command, the code (git commit, and whether the tree had uncommitted changes),
the machine (CPU model and the flags that decide its speed, cores, GPU) and the library versions, written beside
every result (`metrics.json`, each measurement script's JSON) so that a published figure can be traced to the code
and the machine that produced it. The measurement scripts of lab/ write theirs with lab/records.py.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
# The CPU features a figure's speed depends on: AVX2 (every machine here), AVX-512, native bf16, AMX tiles.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
PACKAGES = ("torch", "torchvision", "timm", "onnxruntime", "numpy")


def git_state(repo: Path = REPO) -> dict:
    """{"commit": hash or None, "dirty": bool or None}: None where the code is not a git checkout (an installed
    wheel) or git is missing. `dirty` counts tracked files only: a run's own outputs do not make the tree dirty."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def cpu_facts(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """The CPU model, which of CPU_FLAGS it has (None where the OS does not say), and its logical cores."""
    model, flags = None, None
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():  # one block per core: the first one's
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name" and model is None:
                model = value
            elif key == "flags" and flags is None:
                flags = [flag for flag in CPU_FLAGS if flag in value.split()]
    return {"model": model or platform.processor() or platform.machine(), "flags": flags, "cores": os.cpu_count()}


def gpu_facts() -> list[dict]:
    """Name and memory (GiB) of each visible CUDA device; empty without one."""
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)})
    return gpus


def package_versions() -> dict:
    """Installed versions of PACKAGES (None for one that is not installed), read without importing them."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(argv: list[str] | None = None) -> dict:
    """The command (sys.argv unless given), code, machine, versions and date (UTC) of a measurement."""
    argv = sys.argv if argv is None else argv
    return {
        "command": shlex.join(argv),
        **git_state(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_facts(), "gpus": gpu_facts(), "platform": platform.platform()},
        "torch_threads": torch.get_num_threads(),
        "versions": package_versions(),
    }
