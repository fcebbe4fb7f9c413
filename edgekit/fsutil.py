"""Atomic writes: bad input never leaves a half-written output file behind."""

from __future__ import annotations

import contextlib
import hashlib
import os
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


def check_output_path(path: Path | str) -> Path:
    """Fail early (before any work) when ``path`` cannot be written."""
    path = Path(path)
    parent = path.parent
    check_parent(path)
    if path.is_dir():
        raise OutputPathError(f"output path is a directory: {path}", "give a file name")
    if not os.access(parent, os.W_OK):
        raise OutputPathError(f"output directory is not writable: {parent}", "choose another output path")
    return path


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success fsync and rename it over ``path``.

    On any exception the temp file is removed and ``path`` is left untouched.
    """
    path = check_output_path(path)
    # Not mkstemp: its 0600 would survive the rename. Created 0666, the umask decides, as for open().
    tmp_path = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    os.close(os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
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
