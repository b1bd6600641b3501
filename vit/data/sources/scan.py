"""Find the image files of a split that cannot be decoded, once per tree (`data.scan_images`).

Every sample is opened and fully decoded by the one image reader (vit/data/images.py: a header check alone misses
a truncated file). Zero-byte files, files PIL cannot identify (a `.jpg` that is really text), truncated or
corrupt data and unreadable permissions are reported with a short reason each. A thread pool does the work:
PIL releases the GIL while it decodes.

The result is cached as a small JSON file keyed by the split's resolved root and the (relative path, size,
mtime_ns) of every sample, so a second run over an unchanged tree decodes nothing, while a changed, added or
removed file changes the key and the split is scanned again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vit.data.images import decode, problem_of, short_reason
from vit.data.resources import taking_turns

SCAN_VERSION = 1  # part of the cache key: bump when what counts as unreadable changes
CHUNK = 256  # at most this many images per thread-pool task: few tasks, so the pool's overhead stays small

log = logging.getLogger("vit.data")


decode_image = decode  # a module attribute: the tests count the decodes through it


def image_problem(path: str, size: int) -> str | None:
    """Why `path` (of `size` bytes) cannot be trained on, or None when it decodes."""
    if size == 0:
        return "empty file (0 bytes)"
    try:
        decode_image(path)
    except Exception as err:  # PIL raises OSError, SyntaxError, ValueError, struct.error... on damaged files
        return problem_of(err)
    return None


def _stat(path: str) -> tuple[int, int] | str:
    try:
        stat = os.stat(path)
    except OSError as err:  # vanished, a dangling link, a folder that cannot be listed
        return f"cannot stat: {short_reason(err)}"
    return stat.st_size, stat.st_mtime_ns


def scan_key(split_root: Path, paths: Sequence[str], stats: Sequence[tuple[int, int] | str]) -> str:
    """A hash of the resolved split root and the sorted (relative path, size, mtime_ns) of every sample."""
    digest = hashlib.sha1(f"v{SCAN_VERSION}|{os.fsencode(split_root.resolve())!r}".encode())
    rows = sorted(
        (os.fsencode(os.path.relpath(path, split_root)), stat if isinstance(stat, tuple) else (-1, -1))
        for path, stat in zip(paths, stats, strict=True)
    )
    for rel, (size, mtime) in rows:
        digest.update(rel + b"\0" + f"{size}|{mtime}\n".encode())
    return digest.hexdigest()[:16]


def _cache_file(cache_dir: Path, split_root: Path, key: str) -> Path:
    root_id = hashlib.sha1(os.fsencode(split_root.resolve())).hexdigest()[:8]
    return cache_dir / f"scan-{split_root.name}-{root_id}-{key}.json"


def _read_cache(path: Path, split_root: Path) -> dict[str, str] | None:
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        return {os.path.join(split_root, rel): reason for rel, reason in stored["bad"]}
    except (OSError, ValueError, KeyError, TypeError):  # absent, or damaged: scan again
        return None


def _write_cache(path: Path, split_root: Path, count: int, bad: dict[str, str]) -> None:
    """Write then rename (no half-written file under the final name); drop this split's older results."""
    rows = [[os.path.relpath(p, split_root), reason] for p, reason in sorted(bad.items())]
    payload = {"version": SCAN_VERSION, "root": os.fsdecode(split_root), "files": count, "bad": rows}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(payload, indent=1), encoding="utf-8")
        os.replace(tmp, path)
        prefix = path.name.rsplit("-", 1)[0] + "-"
        for old in path.parent.iterdir():
            if old.name.startswith(prefix) and old.name.endswith(".json") and old != path:
                old.unlink(missing_ok=True)
    except OSError:  # a cache we cannot write only costs a rescan next time
        pass


def _check_chunk(chunk: list[tuple[str, tuple[int, int] | str]]) -> list[tuple[str, str]]:
    bad = []
    for path, stat in chunk:
        problem = stat if isinstance(stat, str) else image_problem(path, stat[0])
        if problem is not None:
            bad.append((path, problem))
    return bad


def find_unreadable(
    paths: Sequence[str], split_root: str | Path, *, workers: int = 1, cache_dir: str | Path | None = None
) -> dict[str, str]:
    """{path: reason} for every path in `paths` (the samples of one split under `split_root`) that cannot
    be decoded. With `cache_dir`, the answer is read from / stored in a JSON file there."""
    split_root = Path(split_root)
    paths = list(paths)
    stats = [_stat(path) for path in paths]
    if cache_dir is None:
        return _scan(paths, stats, split_root, workers)
    cache = _cache_file(Path(cache_dir), split_root, scan_key(split_root, paths, stats))
    cached = _read_cache(cache, split_root)
    if cached is not None:
        return cached
    with taking_turns(cache.parent):
        cached = _read_cache(cache, split_root)  # a process that held the lock first may have written it
        if cached is not None:
            return cached
        bad = _scan(paths, stats, split_root, workers)
        _write_cache(cache, split_root, len(paths), bad)
    return bad


def _scan(paths: list[str], stats: list, split_root: Path, workers: int) -> dict[str, str]:
    """{path: reason} for the unreadable paths, decoded in `workers` threads."""
    log.info(
        "checking the %d images under %s for files that cannot be decoded (once per tree; "
        "data.scan_images=false skips this)",
        len(paths),
        split_root,
    )
    start = time.perf_counter()
    jobs = list(zip(paths, stats, strict=True))
    size = max(1, min(CHUNK, -(-len(jobs) // (4 * max(1, int(workers))))))  # >= 4 tasks per thread
    chunks = [jobs[i : i + size] for i in range(0, len(jobs), size)]
    bad: dict[str, str] = {}
    if int(workers) <= 1 or len(chunks) <= 1:
        for found in map(_check_chunk, chunks):
            bad.update(found)
    else:
        with ThreadPoolExecutor(max_workers=int(workers), thread_name_prefix="vit-scan") as pool:
            for found in pool.map(_check_chunk, chunks):
                bad.update(found)
    log.info("checked %d images in %.1f s: %d cannot be decoded", len(paths), time.perf_counter() - start, len(bad))
    return bad
