"""The Transport protocol: how edgekit reaches a device. ``local`` and ``ssh`` implement it.

Everything above this layer (push, bench, deploy) is written once against the protocol and
cannot tell the implementations apart.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


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
        ...

    def put(self, local: Path, remote: str) -> None:
        """Copy a local file to ``remote`` (whose directory must exist), atomically.

        The data goes to a temp name in the same directory, is fsynced, its sha256 is checked
        against the local file's, and only then is it renamed over ``remote``. A failed or
        interrupted put leaves ``remote`` as it was.
        """
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

    def close(self) -> None: ...
