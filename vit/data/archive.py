"""Image-folder trees shipped as .tar/.tar.gz/.zip: extract once into a cache, safely, and reuse it.

Extraction goes to a temporary folder beside the final one and is renamed into place only after a marker
file is written, so an interrupted run leaves nothing that looks complete. Members that would land outside
the target (absolute paths, `..`, links pointing out) are refused: no tar-slip.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
COMPLETE_MARKER = ".complete"


class ArchiveError(ValueError):
    """An archive that cannot be used: unreadable, or with a member that escapes the target."""


def is_archive(path: str | Path) -> bool:
    name = str(path).lower()
    return Path(path).is_file() and name.endswith(ARCHIVE_SUFFIXES)


def archive_stem(path: Path) -> str:
    name = path.name
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def cache_location(archive: Path, cache_dir: str | Path | None = None) -> Path:
    """Where `archive` is extracted: `cache_dir/<stem>-<key>` if given, else beside the archive when that
    folder is writable, else under the user's cache folder. The key changes when the archive does."""
    stat = archive.stat()
    key = hashlib.sha1(f"{archive.resolve()}|{stat.st_size}|{int(stat.st_mtime)}".encode()).hexdigest()[:10]
    if cache_dir is not None:
        return Path(cache_dir).expanduser() / f"{archive_stem(archive)}-{key}"
    if os.access(archive.parent, os.W_OK):
        return archive.parent / f"{archive_stem(archive)}.extracted"
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vit"
    return base / f"{archive_stem(archive)}-{key}"


def _check_member_path(name: str, archive: Path) -> None:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise ArchiveError(f"archive {archive} has a member with an absolute path: {name!r}; refusing to extract")
    if ".." in path.parts:
        raise ArchiveError(f"archive {archive} has a member that escapes the target: {name!r}; refusing to extract")


def _check_tar(tar: tarfile.TarFile, archive: Path) -> None:
    for member in tar.getmembers():
        _check_member_path(member.name, archive)
        if member.issym() or member.islnk():
            target = (
                PurePosixPath(member.name).parent / member.linkname
                if member.issym()
                else PurePosixPath(member.linkname)
            )
            if PurePosixPath(member.linkname).is_absolute() or ".." in _normalise(target).parts:
                raise ArchiveError(
                    f"archive {archive} has a link pointing outside the target: {member.name!r} -> "
                    f"{member.linkname!r}; refusing to extract"
                )
        elif not (member.isfile() or member.isdir()):
            raise ArchiveError(f"archive {archive} has a special file {member.name!r}; refusing to extract")


def _normalise(path: PurePosixPath) -> PurePosixPath:
    """Resolve `..` lexically; a leading `..` that survives means the path leaves the root."""
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            if parts:
                parts.pop()
            else:
                return PurePosixPath("..")
        elif part not in (".", ""):
            parts.append(part)
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _extract(archive: Path, target: Path) -> None:
    if archive.name.lower().endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                _check_member_path(name, archive)
            zf.extractall(target)
        return
    with tarfile.open(archive) as tar:
        _check_tar(tar, archive)
        # The "data" filter (Python >= 3.12, backported to 3.10.12/3.11.4) repeats our checks in the library.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(target, filter="data")
        else:  # pragma: no cover - old Pythons, members already checked above
            tar.extractall(target)


def extract_archive(archive: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Extract `archive` once and return the folder; later calls reuse it."""
    archive = Path(archive)
    if not archive.is_file():
        raise ArchiveError(f"data archive {archive} does not exist")
    final = cache_location(archive, cache_dir)
    if (final / COMPLETE_MARKER).is_file():
        return final
    if final.exists():  # a half-extracted cache from an interrupted run: redo it
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        _extract(archive, staging)
        (staging / COMPLETE_MARKER).write_text(str(archive.resolve()))
        os.replace(staging, final)
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as err:
        raise ArchiveError(f"cannot extract data archive {archive}: {err}") from err
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final
