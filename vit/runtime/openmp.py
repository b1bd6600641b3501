"""What the environment says of PyTorch's OpenMP threads (GNU libgomp in the Linux wheels), read for the threads line.

libgomp reads its settings once, when torch loads it, so they cannot change while a run trains:
- `OMP_NUM_THREADS`: a thread count the user chose. trainer.threads=auto keeps it and fits nothing.
- `OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`: how a waiting thread waits. The default spins for a while at every barrier.
  That is the fastest alone and costs much beside other work with two threads per two cores; one thread per free core
  costs nothing either way. `PASSIVE` (yield at once) helps a crowded machine but slows the small steps of an idle
  one by up to 2.4x (docs/BENCHMARKS.md, "A busy CPU"). So the entry points leave the default, and
  trainer.threads=auto fits the count to the free cores instead (vit/train/thread_fit.py).

A setting found here is the user's: it is kept and named in the threads line. This module imports no torch."""

from __future__ import annotations

import os

POLICY_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def user_thread_count(environ=os.environ) -> int | None:
    """OMP_NUM_THREADS as a count (its first level where it lists several), or None when unset or not a count."""
    value = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def wait_policy(environ=os.environ) -> str:
    """The wait policy in force, in words: the environment's, named, or OpenMP's default."""
    given = ", ".join(f"{key}={environ[key]}" for key in POLICY_KEYS if key in environ)
    return f"{given} from the environment, kept" if given else "OpenMP's default wait"
