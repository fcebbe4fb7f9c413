"""Atomic writes: bad input never leaves a half-written output file behind."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

from edgekit.errors import OutputPathError


def check_parent(path: Path) -> None:
    """The directory an output file or bundle goes in must exist."""
    if not path.parent.is_dir():
        raise OutputPathError(
            f"output directory does not exist: {path.parent}",
            f"create it first (mkdir -p {path.parent}) or choose another output path",
        )


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
# Write errors that mean "this output cannot be written here", not "edgekit has a bug".
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM}


def _refuse_special(path: Path, want_dir: bool = False) -> None:
    """Only a new path or a regular file (a real directory, for bundles) may be replaced.

    Renaming over a device node, FIFO, socket or symlink would replace it (as root, ``-o /dev/null``
    would replace /dev/null), so those are refused, as is a directory where a file goes and back.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    for test, kind in _KINDS:
        if test(mode):
            raise OutputPathError(
                f"{'bundle output' if want_dir else 'output path'} {path} is {kind}, not a regular {'directory' if want_dir else 'file'}",
                "edgekit writes only to a new path or over a regular file it can replace; choose another output path",
            )
    if stat.S_ISDIR(mode) and not want_dir:
        raise OutputPathError(f"output path is a directory: {path}", "give a file name")
    if not stat.S_ISDIR(mode) and want_dir:
        raise OutputPathError(f"bundle output {path} is a file", "choose another output directory")


def check_output_path(path: Path | str) -> Path:
    """Fail early (before any work) when ``path`` cannot be written, or is not a file edgekit may replace."""
    path = Path(path)
    parent = path.parent
    check_parent(path)
    _refuse_special(path)
    if not os.access(parent, os.W_OK):
        raise OutputPathError(f"output directory is not writable: {parent}", "choose another output path")
    return path


def check_output_dir(path: Path | str) -> Path:
    """The same for a bundle directory: a new path or a real directory (never a symlink to one)."""
    path = Path(path)
    check_parent(path)
    _refuse_special(path, want_dir=True)
    if not os.access(path.parent, os.W_OK):
        raise OutputPathError(f"output directory is not writable: {path.parent}", "choose another output path")
    return path


def write_error(path: Path, exc: OSError) -> OutputPathError:
    """The ``OutputPathError`` for a write that failed (disk full, read-only, I/O error)."""
    return OutputPathError(f"cannot write {path}: {exc.strerror or exc}", "free space or choose another output path; nothing was written")


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success fsync and rename it over ``path``.

    On any exception the temp file is removed and ``path`` is left untouched. A write that fails
    for lack of space or an I/O error (``ENOSPC``, ``EIO``, ...) becomes an ``OutputPathError``.
    """
    path = check_output_path(path)
    # Not mkstemp: its 0600 would survive the rename. Created 0666, the umask decides, as for open().
    tmp_path = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        os.close(os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        try:
            yield tmp_path
            with open(tmp_path, "rb+") as fh:
                os.fsync(fh.fileno())
        except OSError as exc:
            if exc.errno in _WRITE_ERRNOS:
                raise write_error(path, exc) from None
            raise
        # Checked again at the last moment: what is at ``path`` may have changed while we worked.
        _refuse_special(path)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def sha256_file(path: Path, size: int | None = None) -> str:
    """sha256 of a local file, or of its first ``size`` bytes (what a resumed upload keeps)."""
    h, left = hashlib.sha256(), float("inf") if size is None else size
    with open(path, "rb") as fh:
        while left > 0 and (block := fh.read(int(min(1 << 20, left)))):
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def cache_dir(name: str) -> Path:
    """``$EDGEKIT_CACHE_DIR/<name>``, else the user cache dir's (not created here)."""
    import platformdirs

    return Path(os.environ.get("EDGEKIT_CACHE_DIR") or platformdirs.user_cache_dir("edgekit")) / name


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory: so a rename into it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
