"""The local device: this machine, with a working directory of its own.

It is the embedded default target and the reference the SSH transport is tested against:
same argv-only commands, same atomic, verified copies. The device's Python is the host's
interpreter, so the host venv's runtimes are the device's runtimes.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from edgekit.errors import TransportError
from edgekit.fsutil import atomic_path, cache_dir, fsync_path, sha256_file
from edgekit.transport.base import (
    CommandResult,
    Conversation,
    PutProgress,
    PutStats,
    Transport,
    part_name,
    timed_out,
)


def default_root() -> Path:
    """``$EDGEKIT_CACHE_DIR/local-device`` (else the user cache dir's)."""
    return cache_dir("local-device")


class LocalTransport(Transport):
    name = "local"

    def __init__(self, root: Path | None = None) -> None:
        self._root = Path(root) if root is not None else default_root()
        self.root = str(self._root)
        self.python = sys.executable
        self._conversations: list[Conversation] = []

    # -- commands ---------------------------------------------------------------------------
    def _run(self, argv: tuple[str, ...], *, timeout: float, cwd: str | None, env: Mapping[str, str] | None) -> CommandResult:
        command = shlex.join(argv)
        workdir = self._path(cwd if cwd is not None else self._ensure_root())
        if not workdir.is_dir():
            raise TransportError(f"working directory does not exist on the device: {workdir}", "create it first")
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills children too
            )
        except FileNotFoundError:
            raise TransportError(
                f"command not found on the device: {argv[0]}", f"install it or use its full path ({command})"
            ) from None
        except PermissionError:
            raise TransportError(f"cannot execute {argv[0]} on the device: permission denied", "check the file's mode") from None
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise timed_out(timeout, command) from None
        except BaseException:  # KeyboardInterrupt: don't leave the process running
            _kill_group(proc)
            raise
        return CommandResult(argv, proc.returncode, stdout, stderr, time.monotonic() - start)

    # -- files ------------------------------------------------------------------------------
    def _put(self, local: Path, remote: str, digest: str, resume: bool, progress: PutProgress) -> PutStats:
        dest = self._path(remote)
        if not dest.parent.is_dir():
            raise TransportError(
                f"cannot upload to {dest}: directory {dest.parent} does not exist on the device",
                "create it first (Transport.mkdir)",
            )
        if dest.is_dir():
            raise TransportError(f"cannot upload to {dest}: it is a directory", "give the file's full remote path")
        tmp = Path(part_name(str(dest), digest, resume))
        size = local.stat().st_size
        offset = tmp.stat().st_size if resume and tmp.is_file() else 0
        if not 0 < offset <= size or sha256_file(tmp) != sha256_file(local, offset):
            offset = 0
        if offset:
            progress(0, offset)
        sent = 0
        try:
            with open(tmp, "r+b" if offset else "wb") as out, open(local, "rb") as src:
                out.seek(offset)
                src.seek(offset)
                while block := src.read(1 << 20):
                    out.write(block)
                    sent += len(block)
                    progress(len(block), offset + sent)
                out.truncate()
                out.flush()
                os.fsync(out.fileno())
            if sha256_file(tmp) != digest:
                tmp.unlink()
                raise TransportError(f"upload of {local} to {dest} arrived corrupted", "retry; check the device's storage")
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest)
            fsync_path(dest.parent)
        except OSError as exc:
            raise TransportError(f"cannot upload {local} to {dest}: {exc.strerror or exc}", "check free space and permissions") from None
        finally:
            if not resume and tmp.exists():  # a resumable part stays for the next put to continue
                tmp.unlink()
        return PutStats(sent, offset)

    def get(self, remote: str, local: Path) -> None:
        src = self._path(remote)
        if not src.is_file():
            raise TransportError(f"cannot download {src}: no such file on the device", "check the remote path")
        with atomic_path(Path(local)) as tmp, open(src, "rb") as fh_in, open(tmp, "wb") as fh_out:
            while block := fh_in.read(1 << 20):
                fh_out.write(block)

    def sha256(self, remote: str) -> str | None:
        path = self._path(remote)
        if not path.exists():
            return None
        if not path.is_file():
            raise TransportError(f"{path} on the device is not a file", "check the remote path")
        return sha256_file(path)

    def mkdir(self, remote: str) -> None:
        path = self._path(remote)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise TransportError(f"cannot create directory {path}: a file is in the way", "remove that file") from None
        except OSError as exc:
            raise TransportError(f"cannot create directory {path}: {exc.strerror}", "check permissions") from None

    def converse(self, argv: Sequence[str]) -> Conversation | None:
        try:
            proc = subprocess.Popen(
                list(argv), cwd=self._path(self._ensure_root()), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
        except OSError:
            return None  # `run` says why, with its error messages
        conversation = _LocalConversation(argv, proc)
        self._conversations.append(conversation)
        return conversation

    def close(self) -> None:
        """End the processes ``converse`` started; the local device holds no connection."""
        while self._conversations:
            self._conversations.pop().close()

    # -- helpers ----------------------------------------------------------------------------
    def _path(self, remote: str) -> Path:
        path = Path(remote)
        return path if path.is_absolute() else self._root / path

    def __repr__(self) -> str:
        return f"LocalTransport(root={self.root!r})"


class _LocalConversation(Conversation):
    def __init__(self, argv: Sequence[str], proc: subprocess.Popen) -> None:
        super().__init__(argv)
        self._proc = proc
        self._open = {proc.stdout.fileno(): True, proc.stderr.fileno(): True}

    def _send(self, data: bytes) -> None:
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def _poll(self, timeout: float) -> tuple[bytes, bytes, bool]:
        out = err = b""
        ready, _, _ = select.select([fd for fd, up in self._open.items() if up], [], [], timeout)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                self._open[fd] = False
            elif fd == self._proc.stdout.fileno():
                out += chunk
            else:
                err += chunk
        return out, err, not self._open[self._proc.stdout.fileno()]

    def _wait(self) -> int:
        try:
            return self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return self._kill()

    def _kill(self) -> int:
        proc = self._proc
        with contextlib.suppress(OSError):
            proc.stdin.close()  # EOF: the server's loop ends
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own group: its children die too
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
        return proc.returncode


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=5)  # reap it and drain the pipes
    except subprocess.TimeoutExpired:  # a child that left the group still holds the pipes
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
        proc.wait()
