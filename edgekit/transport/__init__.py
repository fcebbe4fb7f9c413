"""Transports to devices: one protocol (``base.Transport``), implemented by ``local`` (and ssh)."""

from __future__ import annotations

from typing import Any

from edgekit.errors import UsageError
from edgekit.transport.base import CommandResult, Transport

__all__ = ["CommandResult", "Transport", "open_transport"]


def open_transport(device: str | None, profile: Any = None) -> Transport:
    """The transport for a ``--device`` value: None or "local" is this machine.

    ``profile`` (an ``edgekit.profiles`` Profile, or None) supplies device-side defaults for
    remote devices; the local device ignores it.
    """
    if device is None or device == "local":
        from edgekit.transport.local import LocalTransport

        return LocalTransport()
    raise UsageError(
        f"cannot reach device '{device}': ssh devices arrive with the SSH transport",
        "omit --device (or pass --device local) to run on this machine",
    )
