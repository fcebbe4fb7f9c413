"""The Transport protocol: how edgekit reaches a device. ``local`` and ``ssh`` implement it.

Everything above this layer (push, bench, deploy) is written once against the protocol and
cannot tell the implementations apart.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from edgekit.errors import TransportError
from edgekit.fsutil import sha256_file


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int  # negative: killed by that signal
    stdout: bytes
    stderr: bytes
    duration_s: float

    @property
    def command(self) -> str:
        """The command as one copy-pasteable shell line (for messages only, never executed)."""
        return shlex.join(self.argv)

    def stderr_tail(self, lines: int = 5) -> str:
        """The last ``lines`` non-empty lines of stderr, joined with " | " for one-line messages."""
        text = self.stderr.decode("utf-8", errors="replace")
        tail = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
        return " | ".join(tail)

    def last_json(self) -> dict | None:
        """The last line of stdout as a JSON object (a device script's answer); None if it is not one."""
        text = self.stdout.decode("utf-8", errors="replace").strip()
        try:
            doc = json.loads(text.splitlines()[-1]) if text else None
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None


# The most one answer line of a device program may hold: a bench reply of the agent's
# MAX_SAMPLES samples (~20 bytes each as JSON), its per-layer times and facts fit well inside.
MAX_ANSWER_BYTES = 64 << 20


def timed_out(timeout: float, command: str) -> TransportError:
    """The error of a command that ran past its timeout (every transport words it the same)."""
    return TransportError(
        f"command timed out after {timeout:g}s: {command}",
        "the device may be overloaded or the command stuck; allow more time or do less per run",
    )


@dataclass(frozen=True)
class PutStats:
    """What one upload cost: bytes actually sent, and the offset it resumed from (0: fresh)."""

    bytes_sent: int
    resumed_from: int


# progress(sent, on_device): bytes just sent, bytes of the file now on the device; a resumed
# upload calls progress(0, offset) once, before sending
PutProgress = Callable[[int, int], None]


@runtime_checkable
class Transport(Protocol):
    """A device edgekit can run commands on and copy files to and from.

    Remote paths are POSIX paths on the device; a relative one is taken relative to ``root``.
    """

    name: str  # "local", "ssh:user@host:port"
    root: str  # edgekit's working directory on the device
    python: str  # the interpreter that runs the agent on the device

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 600.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> CommandResult:
        """Run ``argv`` (a list, never a shell string) in ``cwd`` (default ``root``).

        ``env`` is added to the device's environment. On timeout the whole process group is
        killed and TransportError says "command timed out after Ns: <command>". With
        ``check``, a non-zero exit raises TransportError quoting the last stderr lines.
        """
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of arguments, not a shell string")
        argv = tuple(os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in argv)
        if not argv:
            raise TransportError("empty command", "pass the program and its arguments as a list")
        result = self._run(argv, timeout=timeout, cwd=cwd, env=env)
        if check and result.returncode != 0:
            tail = result.stderr_tail()
            raise TransportError(
                f"command failed with exit code {result.returncode}: {result.command}" + (f": {tail}" if tail else ""),
                "run the command by hand on the device to see its full output",
            )
        return result

    def _ensure_root(self) -> str:
        """``root``, created the first time a command runs in it."""
        if not getattr(self, "_root_ready", False):
            self.mkdir(self.root)
            self._root_ready = True
        return self.root

    def _run(self, argv: tuple[str, ...], *, timeout: float, cwd: str | None, env: Mapping[str, str] | None) -> CommandResult:
        """``run`` without the argument normalising and the exit-code check it shares."""
        ...

    def put(
        self,
        local: Path,
        remote: str,
        *,
        sha256: str | None = None,
        resume: bool = False,
        progress: PutProgress | None = None,
    ) -> PutStats:
        """Copy a local file to ``remote`` (whose directory must exist), atomically.

        The data goes to a temp name in the same directory, is fsynced, its sha256 is checked
        on the device against ``sha256`` (the local file's, computed when not given), and only
        then is it renamed over ``remote``. A failed or interrupted put leaves ``remote`` as it
        was. With ``resume`` the temp name comes from the content (``part_name``) and is kept
        when the link fails; the next put continues from it once the device's hash of it
        matches the start of the local file. ``progress`` is called as data moves.
        """
        local = Path(local)
        if not local.is_file():
            raise TransportError(f"cannot upload {local}: no such file", "check the local path")
        return self._put(local, remote, sha256 or sha256_file(local), resume, progress or (lambda sent, on_device: None))

    def _put(self, local: Path, remote: str, digest: str, resume: bool, progress: PutProgress) -> PutStats:
        """``put`` of an existing local file whose sha256 is ``digest`` (a no-op ``progress`` when none)."""
        ...

    def get(self, remote: str, local: Path) -> None:
        """Copy ``remote`` to ``local`` atomically (temp name, fsync, rename)."""
        ...

    def sha256(self, remote: str) -> str | None:
        """sha256 of the remote file, None when it does not exist."""
        ...

    def mkdir(self, remote: str) -> None:
        """Create a directory and its parents; an existing directory is fine."""
        ...

    def converse(self, argv: Sequence[str]) -> Conversation | None:
        """Start ``argv`` (in ``root``) as a process that answers each stdin line with one stdout
        line (``agent.pyz serve``); None when this transport cannot keep a process open."""
        return None

    def close(self) -> None: ...


_STDERR_KEEP = 64 * 1024


class Conversation:
    """A running command that answers one line per request line. A transport implements the
    four primitives (``_send``, ``_poll``, ``_wait``, ``_kill``); the protocol is written once."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = tuple(argv)
        self.returncode: int | None = None  # set once the process has ended
        self._out, self._err = bytearray(), bytearray()

    def ask(self, line: bytes, *, timeout: float) -> tuple[bytes | None, bytes]:
        """Send one request line; (its answer line, or None when the process ended first, and
        what it wrote to stderr since the last answer). On timeout the process is killed:
        TransportError."""
        if self.returncode is not None:
            return None, b""
        try:
            self._send(line.rstrip(b"\n") + b"\n")
        except OSError:
            pass  # it has ended: reading says how
        deadline = time.monotonic() + timeout
        while b"\n" not in self._out:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise timed_out(timeout, shlex.join(self.argv))
            out, err, ended = self._poll(min(left, 1.0))
            self._out += out
            if len(self._out) > MAX_ANSWER_BYTES and b"\n" not in self._out:  # bounded: a reply is a document, not a stream
                self.close()
                raise TransportError(
                    f"the device's answer passed {MAX_ANSWER_BYTES >> 20} MiB without ending: {shlex.join(self.argv)}",
                    "the program on the device is not edgekit's agent, or is broken; push it again (edgekit bench does)",
                )
            self._err += err
            del self._err[:-_STDERR_KEEP]
            if ended and b"\n" not in self._out:
                self.returncode = self._wait()
                return None, self._take_err()
        answer, _, rest = bytes(self._out).partition(b"\n")
        self._out = bytearray(rest)
        return answer, self._take_err()

    def _take_err(self) -> bytes:
        err = bytes(self._err)
        self._err.clear()
        return err

    def close(self) -> None:
        """End the process (EOF first, then a kill if it lingers); idempotent."""
        if self.returncode is None:
            self.returncode = self._kill()

    def _send(self, data: bytes) -> None: ...

    def _poll(self, timeout: float) -> tuple[bytes, bytes, bool]:
        """(stdout bytes, stderr bytes, ended) within ``timeout`` s."""
        ...

    def _wait(self) -> int:
        """The ended process's exit code (negative: its signal)."""
        ...

    def _kill(self) -> int: ...


def part_name(dest: str, digest: str, resume: bool) -> str:
    """The temp name an upload of ``digest`` to ``dest`` is written under (beside ``dest``)."""
    parent, base = posixpath.split(dest)
    tag = digest[:16] if resume else uuid.uuid4().hex[:12]
    return posixpath.join(parent, f".{base}.{tag}.part")
