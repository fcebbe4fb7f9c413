"""Devices: inventories, preflight, fleets, the device lock and provisioning.

>>> from edgekit.devices import connect, resolve_devices
>>> [d.name for d in resolve_devices(["local"])]
['local']

``connect(name_or_entry, profile)`` is how commands open a device: an inventory name resolves
to its SSH target (and workdir / python overrides), ``local`` is this machine, anything else
goes to the transport as an SSH target; when edgekit provisioned a venv on the device, the
transport's ``python`` is pointed at it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from edgekit.devices.inventory import DeviceEntry, resolve_devices
from edgekit.profiles import Profile
from edgekit.transport.base import Transport

__all__ = ["DeviceEntry", "connect", "resolve_devices"]


def connect(
    device: str | DeviceEntry | None,
    profile: Profile | None = None,
    *,
    inventory: Path | str | None = None,
    **transport_options: Any,
) -> Transport:
    """Open (lazily) the transport to ``device``: None or "local" is this machine.

    A name found in ``inventory`` (default: ./devices.toml, then the config dir's) uses that
    entry's SSH target, and its workdir / python in place of the profile's.
    """
    from edgekit.devices.provision import use_provisioned_python
    from edgekit.transport import open_transport

    if isinstance(device, DeviceEntry):
        entry = device
    elif device is None:
        entry = DeviceEntry("local", "local")
    else:
        entry = resolve_devices([device], inventory)[0]
    if entry.is_local:
        from edgekit.transport.local import LocalTransport

        transport: Transport = LocalTransport(Path(entry.workdir).expanduser() if entry.workdir else None)
        if entry.python:
            transport.python = entry.python
    else:
        if profile is not None and (entry.workdir or entry.python):
            profile = dataclasses.replace(
                profile, workdir=entry.workdir or profile.workdir, python=entry.python or profile.python
            )
        transport = open_transport(entry.address, profile, **transport_options)  # trust_new_host, password, log
    transport.device_name = entry.name  # type: ignore[attr-defined]  # what hints call it: edgekit devices provision NAME
    try:
        use_provisioned_python(transport)
    except BaseException:
        transport.close()
        raise
    return transport
