"""Files written so that a crash at any moment leaves the old file or the new one (temporary file, fsync,
rename): checkpoints, metrics.json, exported models. A folder that cannot take them is named before any work."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from vit.errors import UserError
from vit.weights.files import first_line
from vit.weights.read import CheckpointError


class OutputError(UserError):
    """The run directory, or a file of it (metrics.json, TensorBoard events), cannot be written: one message naming
    the path and the reason."""

    kind = "output"


def atomic_save(obj: Any, path: str | Path) -> None:
    """Write `obj` to `path` so that a crash at any moment leaves either the old file or the new one.

    The bytes go to a temporary file in the same folder, are flushed to disk, and replace `path` in one
    rename; the folder is synced so the rename itself survives a power cut.
    """
    atomic_write(path, lambda handle: torch.save(obj, handle), "checkpoint", CheckpointError)


def atomic_write_text(text: str, path: str | Path) -> None:
    """`atomic_save` for a text file (metrics.json): a failed write raises OutputError and keeps the old file."""
    atomic_write(path, lambda handle: handle.write(text.encode()), "file", OutputError)


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any], what: str, error: type[ValueError]) -> None:
    """Call `write(handle)` on a temporary file beside `path`, fsync it, rename it over `path`, sync the folder.

    Any failure (a full disk, a read-only or unwritable folder, a file where the folder should be) removes the
    temporary file and raises `error` naming `what`, the path, the reason and the free space there.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        free = free_space(path.parent)  # before the partial file goes: what the write met
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder itself is what failed
        if isinstance(err, (OSError, RuntimeError)):
            # torch.save reports a full disk as a RuntimeError of its zip writer, hence the free space in the message.
            kept = "the previous file is intact" if path.is_file() else "there was no earlier file"
            raise error(
                f"cannot write {what} {str(path)!r}: {write_error_reason(err, path.parent)} ({free} free there); {kept}"
            ) from err
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_error_reason(err: BaseException, folder: Path) -> str:
    """Why writing into `folder` failed, in one line: which path is a file where a folder should be, if one is,
    else the OS's words ("No space left on device", "Permission denied")."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{str(blocker)!r} is a file, not a folder"
    return err.strerror if isinstance(err, OSError) and err.strerror else first_line(err)


PROBE_BYTES = 64 * 1024  # what a run directory must take at once: .hydra/'s config copies, the first events


def check_run_dir(path: str | Path, *, create: bool, setting: str = "") -> None:
    """Make sure `path` can be the run directory: it (or, with `create=False`, the nearest folder that exists on
    its way, where it would be created) takes a file of PROBE_BYTES, which is then removed. Raises OutputError
    naming the path, the setting it came from, the reason and the free space: a file in the way, no write
    permission, a read-only or full disk."""
    path = Path(path)
    folder = path
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
        folder = next(p for p in (path, *path.parents) if p.exists())
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        with tempfile.TemporaryFile(dir=folder) as probe:  # no name in the folder, gone when closed
            probe.write(bytes(PROBE_BYTES))
            probe.flush()
    except OSError as err:
        reason = write_error_reason(err, path)
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            reason = f"{reason}: cannot create files in {str(folder)!r}"
        source = f" ({setting})" if setting else ""
        raise OutputError(
            f"cannot use the run directory {str(path)!r}{source}: {reason} ({free_space(path)} free there)"
        ) from err


def free_space(folder: Path) -> str:
    """The free space of the disk holding `folder` (or its nearest existing parent), for error messages."""
    for candidate in (folder, *folder.parents):
        if candidate.is_dir():
            try:
                return f"{shutil.disk_usage(candidate).free / 2**20:,.1f} MiB"
            except OSError:
                break
    return "unknown"
