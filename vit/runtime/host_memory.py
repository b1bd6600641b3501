"""How the C library's allocator treats the memory a training step frees (`trainer.malloc`).

A CPU step allocates and frees the same large tensors every step (activations, their gradients, the casts of
autocast). glibc's malloc serves a block above its mmap threshold (at most 32 MiB, adapted as blocks are freed) with
a fresh mmap, and gives the top of its heap back to the system past its trim threshold. Either way the next step
touches new pages, and each 4 KiB page costs a page fault in the kernel. `reuse` raises both thresholds, so freed
blocks stay in the heap for the next step: the same arithmetic, bit for bit, without the faults. The cost is a heap
that stays at its peak size. Measured in docs/BENCHMARKS.md, "Freed memory kept for the next step".

jemalloc or tcmalloc preloaded (`LD_PRELOAD`), or glibc's own settings in the environment (`MALLOC_*_`,
`GLIBC_TUNABLES`), are the user's choice: `auto` keeps them and names them. The setting is process-wide and stays
after the run: glibc has no call that restores its adaptive threshold.

This module imports no torch."""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass

from vit.settings.trainer import MallocMode

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30  # blocks under 1 GiB come from the heap
# glibc before 2.35 refuses an mmap threshold above 32 MiB on a 64-bit system (HEAP_MAX_SIZE / 2)
MMAP_THRESHOLD_OLDER_GLIBC = 32 << 20
TRIM_THRESHOLD = 2**31 - 1  # the largest an int holds: the heap's top is never given back
ALLOCATOR_LIBRARIES = ("jemalloc", "tcmalloc", "mimalloc")
GLIBC_MALLOC_KEYS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def user_allocator(environ=os.environ) -> str | None:
    """What the environment chose for the allocator, in words (a preloaded allocator, glibc's malloc settings), or
    None when it chose nothing."""
    preloaded = [
        part for part in environ.get("LD_PRELOAD", "").replace(":", " ").split()
        if any(name in os.path.basename(part) for name in ALLOCATOR_LIBRARIES)
    ]  # fmt: skip
    if preloaded:
        return f"LD_PRELOAD={' '.join(preloaded)}"
    given = [f"{key}={environ[key]}" for key in GLIBC_MALLOC_KEYS if key in environ]
    if "glibc.malloc" in environ.get("GLIBC_TUNABLES", ""):
        given.append(f"GLIBC_TUNABLES={environ['GLIBC_TUNABLES']}")
    return ", ".join(given) or None


def is_glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@dataclass(frozen=True)
class MallocLine:
    """What `set_malloc` did, in the line the run logs; `warning`: a setting that could not run as given."""

    text: str
    warning: bool = False


def set_malloc(setting: MallocMode, device_type: str, environ=os.environ, libc=None) -> MallocLine | None:
    """Apply `trainer.malloc`=`setting` for a run on `device_type` ("cpu", "cuda"). Returns the line the run logs,
    or None where there is nothing to say (auto on a GPU or off glibc, system). `libc`: the C library (a test passes
    a stand-in); default glibc's, loaded where this process runs on it."""
    if setting == "system" or (setting == "auto" and device_type != "cpu"):
        return None
    chosen = user_allocator(environ)
    if chosen is not None and setting == "auto":
        return MallocLine(f"host memory: the allocator the environment chose ({chosen}), kept (trainer.malloc=auto)")
    if chosen is not None and chosen.startswith("LD_PRELOAD"):
        return MallocLine(f"trainer.malloc=reuse changes nothing: {chosen} serves the allocations, not glibc's "
                          "malloc; that allocator runs as it is", warning=True)  # fmt: skip
    if libc is None:
        if not is_glibc():
            libc_name = platform.libc_ver()[0] or platform.system()
            return None if setting == "auto" else MallocLine(
                f"trainer.malloc=reuse needs glibc's malloc; this process runs on {libc_name}, whose allocator runs",
                warning=True)  # fmt: skip
        libc = ctypes.CDLL("libc.so.6")
    threshold = MMAP_THRESHOLD if libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 else MMAP_THRESHOLD_OLDER_GLIBC
    if threshold != MMAP_THRESHOLD and libc.mallopt(M_MMAP_THRESHOLD, threshold) != 1:
        return MallocLine(f"trainer.malloc={setting}: glibc refused the mmap threshold; its allocator runs with its "
                          "defaults", warning=True)  # fmt: skip
    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    size = "1 GiB" if threshold == 1 << 30 else f"{threshold >> 20} MiB"
    overridden = f", over {chosen} from the environment" if chosen is not None else ""
    return MallocLine(
        f"host memory: freed blocks under {size} stay in the heap for the next step, no page faults on reuse "
        f"(trainer.malloc={setting}{' on a CPU' if setting == 'auto' else ''}{overridden})"
    )


__all__ = ["MallocLine", "is_glibc", "set_malloc", "user_allocator"]
