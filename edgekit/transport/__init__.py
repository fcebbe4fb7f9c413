"""Transports to devices: one protocol (``base.Transport``), implemented by ``local`` and ``ssh``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgekit.transport.base import CommandResult, Transport

__all__ = ["CommandResult", "Transport", "open_transport"]


def open_transport(
    device: str | None,
    profile: Any = None,
    *,
    trust_new_host: bool = False,
    password: str | None = None,
    connect_timeout: float | None = None,
    idle_timeout: float | None = None,
    log: Callable[[str], None] | None = None,
) -> Transport:
    """The transport for a ``--device`` value: None or "local" is this machine, anything else SSH.

    An SSH device is ``[user@]host[:port]`` or a Host alias from ``~/.ssh/config``; nothing is
    contacted until the first command. ``profile`` (an ``edgekit.profiles`` Profile, or None)
    gives the device's ``workdir`` (default ``~/.edgekit``) and ``python`` (default
    ``python3``); the local device ignores it. ``trust_new_host`` saves the key of a host not
    yet in known_hosts (a changed key is refused regardless); ``password`` is used only when
    given. ``log`` receives one-line notes (e.g. a newly trusted host key).
    """
    if device is None or device == "local":
        from edgekit.transport.local import LocalTransport

        return LocalTransport()
    from edgekit.transport.ssh import DEFAULT_IDLE_TIMEOUT, SshTransport

    return SshTransport(
        device,
        workdir=getattr(profile, "workdir", None) or "~/.edgekit",
        python=getattr(profile, "python", None) or "python3",
        trust_new_host=trust_new_host,
        password=password,
        connect_timeout=connect_timeout,
        idle_timeout=idle_timeout if idle_timeout is not None else DEFAULT_IDLE_TIMEOUT,
        log=log,
    )
