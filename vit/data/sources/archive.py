"""Image-folder trees shipped as .tar/.tar.gz/.zip: extract once into a cache, safely, and reuse it.

Extraction goes to a temporary folder beside the final one and is renamed into place only after a marker
file is written, so an interrupted run leaves nothing that looks complete. Members that would land outside
the target (absolute paths, `..`, links pointing out) are refused: no tar-slip.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from vit.data.resources import cache_folder, taking_turns
from vit.errors import UserError

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
COMPLETE_MARKER = ".complete"


class ArchiveError(UserError):
    """An archive that cannot be used: unreadable, or with a member that escapes the target."""

    kind = "data"


def is_archive(path: str | Path) -> bool:
    name = str(path).lower()
    return Path(path).is_file() and name.endswith(ARCHIVE_SUFFIXES)


def archive_stem(path: Path) -> str:
    name = path.name
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def archive_key(archive: Path) -> str:
    """A short hash of the archive's absolute path, size and mtime: it changes when the archive does."""
    stat = archive.stat()
    return hashlib.sha1(f"{archive.resolve()}|{stat.st_size}|{int(stat.st_mtime)}".encode()).hexdigest()[:10]


def cache_location(archive: Path, cache_dir: str | Path | None = None) -> Path:
    """Where `archive` is extracted: `<stem>-<hash of its path>` in the cache folder (vit/data/resources.py's
    rule, with the archive's folder as the data's). The name does not change when the archive is replaced, so
    the new contents replace the old ones (the `.complete` marker's key tells them apart)."""
    folder = cache_folder(cache_dir, archive.parent, "archives")
    path_hash = hashlib.sha1(str(archive.resolve()).encode()).hexdigest()[:10]
    return folder / f"{archive_stem(archive)}-{path_hash}"


def _check_member_path(name: str, archive: Path) -> None:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise ArchiveError(f"archive {archive} has a member with an absolute path: {name!r}; refusing to extract")
    if ".." in path.parts:
        raise ArchiveError(f"archive {archive} has a member that escapes the target: {name!r}; refusing to extract")


def _check_tar(tar: tarfile.TarFile, archive: Path) -> bool:
    """Refuse members that escape the target; return whether the archive holds any links."""
    has_links = False
    for member in tar.getmembers():
        _check_member_path(member.name, archive)
        if member.issym() or member.islnk():
            has_links = True
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
    return has_links


def _plain_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """Extraction filter for archives already checked and free of links: our own user, ordinary modes.

    With no links in the archive, the lexical checks above are enough to keep every member inside the
    target, so this skips the `data` filter's two realpath() calls per member (seconds on 60k files)."""
    mode = 0o755 if member.isdir() else 0o644
    return member.replace(mode=mode, uid=None, gid=None, uname=None, gname=None, deep=False)


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
        has_links = _check_tar(tar, archive)
        if not hasattr(tarfile, "data_filter"):  # pragma: no cover - Python < 3.10.12/3.11.4: checked above
            tar.extractall(target)
        elif has_links:
            # Links can chain (a link inside a linked folder) in ways a lexical check cannot follow: let the
            # library's "data" filter resolve every member's real path as well.
            tar.extractall(target, filter="data")
        else:
            tar.extractall(target, filter=_plain_member)


def _is_complete(folder: Path, key: str) -> bool:
    marker = folder / COMPLETE_MARKER
    return marker.is_file() and marker.read_text().strip() == key


def extract_archive(archive: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Extract `archive` once and return the folder; later calls reuse it.

    The `.complete` marker holds the archive's key, so a folder beside an archive that has since been
    replaced (new size or mtime) is extracted again, and so is one left without a marker.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise ArchiveError(f"data archive {archive} does not exist")
    final, key = cache_location(archive, cache_dir), archive_key(archive)
    if _is_complete(final, key):
        return final
    with taking_turns(final.parent):
        return _extract_once(archive, final, key)


def _extract_once(archive: Path, final: Path, key: str) -> Path:
    """`archive` extracted into `final` unless a process that held the lock before this one already did."""
    if _is_complete(final, key):
        return final
    if final.exists():  # interrupted, or from an older archive: redo it
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        _extract(archive, staging)
        (staging / COMPLETE_MARKER).write_text(key)  # last: only a whole tree carries the marker
        try:
            os.replace(staging, final)
        except OSError:
            # Another process (a second DDP rank) renamed its copy into place first: use that one.
            if not _is_complete(final, key):
                raise
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, zlib.error, lzma.LZMAError) as err:
        raise ArchiveError(f"cannot extract data archive {archive}: {_reason(archive, err)}") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final


def _reason(archive: Path, err: BaseException) -> str:
    """One line: tarfile lists every compression it tried, one per line."""
    if isinstance(err, tarfile.ReadError | zipfile.BadZipFile | EOFError | zlib.error | lzma.LZMAError):
        if Path(archive).is_file() and Path(archive).stat().st_size == 0:
            return "empty file (0 bytes)"
        return "not a readable tar or zip archive (truncated, damaged, or another kind of file)"
    return " ".join(str(err).split()) or type(err).__name__
