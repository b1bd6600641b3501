"""What a data config asks of the machine, each decided by one rule: how many loader worker processes, and where
the caches go (extracted archives, the image scan's results, decoded splits)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from vit.settings.data import DataSettings

log = logging.getLogger("vit.data")

CACHE_FOLDER = ".vit-cache"  # in the data's own folder
LOCK_FILE = ".lock"  # in a cache folder: `taking_turns`


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


def num_workers(cfg: DataSettings) -> int:
    """data.num_workers, or min(8, CPUs) when null; more workers than CPUs only queue for them, so a larger value
    is lowered to the CPU count, said once. The loaders' worker processes and the image scan's threads both
    follow it."""
    cpus = available_cpus()
    requested = cfg.num_workers
    if requested is None:
        return min(8, cpus)
    if requested > cpus:
        if (requested, cpus) not in _SAID:  # the loaders and the scan each ask: the user hears it once
            _SAID.add((requested, cpus))
            log.info("data.num_workers=%d but this process has %d CPUs: using %d workers", requested, cpus, cpus)
        return cpus
    return requested


_SAID: set[tuple[int, int]] = set()  # (requested, CPUs) pairs already said in this process


def user_cache(kind: str) -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vit" / kind


def cache_folder(cache_dir: str | None, data_folder: Path | None, kind: str) -> Path:
    """Where a cache of `kind` ("archives", "scan", "decoded") about the data in `data_folder` goes: `data.cache_dir`
    when set; else `.vit-cache` in `data_folder` when that is writable (the cache describes those files, so it
    lives, moves and is removed with them); else the user's cache folder, `$XDG_CACHE_HOME/vit/<kind>` (default
    ~/.cache/vit/<kind>). The files in it carry the name of what they describe, so kinds can share a folder."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if data_folder is not None and os.access(data_folder, os.W_OK):
        return data_folder / CACHE_FOLDER
    return user_cache(kind)


@contextlib.contextmanager
def taking_turns(cache_dir: Path) -> Iterator[None]:
    """Run the block holding an exclusive lock on the cache folder `cache_dir` (its `.lock` file, created and kept):
    processes that build a cache there at once (the ranks of a DDP run, runs started together on one dataset) take
    turns, and the later ones find it built instead of building it again. Where the lock cannot be had (a
    read-only folder, no fcntl) the block runs without it: every cache is written atomically either way, so the
    lock only saves repeated work. Not nested: a second lock on the same folder in one process would wait forever."""
    handle = None
    try:
        import fcntl

        cache_dir.mkdir(parents=True, exist_ok=True)
        handle = open(cache_dir / LOCK_FILE, "a")  # noqa: SIM115 - held until the block ends
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
    except (ImportError, OSError):
        pass
    try:
        yield
    finally:
        if handle is not None:
            handle.close()
