"""What a data config asks of the machine, each decided by one rule: how many loader worker processes, and where
the caches go (extracted archives, the image scan's results, decoded splits)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("vit.data")

CACHE_FOLDER = ".vit-cache"  # in the data's own folder


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, e.g. under a CPU quota)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_memory() -> int:
    """Bytes of host memory available to new allocations (Linux's MemAvailable; else the free physical pages)."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def num_workers(cfg: Mapping) -> int:
    """data.num_workers, or min(8, CPUs) when null; more workers than CPUs only queue for them, so a larger value
    is lowered to the CPU count, said once. The loaders' worker processes and the image scan's threads both
    follow it."""
    cpus = available_cpus()
    requested = cfg.get("num_workers")
    if requested is None:
        return min(8, cpus)
    if int(requested) > cpus:
        if (int(requested), cpus) not in _SAID:  # the loaders and the scan each ask: the user hears it once
            _SAID.add((int(requested), cpus))
            log.info("data.num_workers=%d but this process has %d CPUs: using %d workers", int(requested), cpus, cpus)
        return cpus
    return int(requested)


_SAID: set[tuple[int, int]] = set()  # (requested, CPUs) pairs already said in this process


def user_cache(kind: str) -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vit" / kind


def cache_folder(cfg: Mapping, data_folder: Path | None, kind: str) -> Path:
    """Where a cache of `kind` ("archives", "scan", "decoded") about the data in `data_folder` goes: `data.cache_dir`
    when set; else `.vit-cache` in `data_folder` when that is writable (the cache describes those files, so it
    lives, moves and is removed with them); else the user's cache folder, `$XDG_CACHE_HOME/vit/<kind>` (default
    ~/.cache/vit/<kind>). The files in it carry the name of what they describe, so kinds can share a folder."""
    if cfg.get("cache_dir"):
        return Path(str(cfg["cache_dir"])).expanduser()
    if data_folder is not None and os.access(data_folder, os.W_OK):
        return data_folder / CACHE_FOLDER
    return user_cache(kind)
