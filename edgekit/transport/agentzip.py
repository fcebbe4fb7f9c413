"""The agent as one zipapp (``python agent.pyz bench|facts|store ...``), built here on the host
from ``edgekit/agent``'s sources, and put on a device once per agent version.

The archive is deterministic (sorted entries, fixed timestamps and modes, no compression),
so its sha256 depends only on the agent's source: it is content-addressed on the device.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import tempfile
import zipfile
from pathlib import Path

from edgekit.fsutil import write_bytes_atomic
from edgekit.transport.base import Transport

PACKAGE = "edgekit_agent"  # the name the agent package has inside the zip
_SOURCES = Path(__file__).resolve().parents[1] / "agent"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry

# The zip's entry point. Plain syntax on purpose: on a Python too old for the agent it
# must still run far enough to answer with an error document.
_BOOT = f'''\
import json, sys
if sys.version_info < (3, 7):
    sys.stdout.write(json.dumps({{"schema": 1, "kind": "edgekit.error",
        "error": "Python %s on the device is too old for the edgekit agent (needs 3.7+)" % sys.version.split()[0],
        "hint": "install python3.7 or newer on the device and set its path as the profile's python"}}) + "\\n")
    sys.exit(1)
if sys.argv[1:2] == ["store"]:  # a push runs it twice: no command line parser to import
    from {PACKAGE}.store import main
    sys.exit(main(sys.argv[2:]))
from {PACKAGE}.__main__ import main
sys.exit(main())
'''


def agent_zip_bytes() -> bytes:
    """The agent zipapp's bytes, built from the agent package's sources."""
    members = {"__main__.py": _BOOT.encode()}
    for path in _SOURCES.rglob("*.py"):
        rel = path.relative_to(_SOURCES)
        if "__pycache__" not in rel.parts:
            members[f"{PACKAGE}/{rel.as_posix()}"] = path.read_bytes()
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.create_system = 3  # unix, whatever the host is
            zf.writestr(info, members[name])
    return buf.getvalue()


def build_agent_zip(dest_dir: Path) -> Path:
    """Write the agent zipapp to ``dest_dir/<sha256>.pyz`` (atomically) and return its path."""
    data = agent_zip_bytes()
    dest = Path(dest_dir) / f"{hashlib.sha256(data).hexdigest()}.pyz"
    write_bytes_atomic(dest, data)
    return dest


def agent_path(transport: Transport) -> str:
    """Where this edgekit's agent lives on the device (named by its content), present or not."""
    return posixpath.join(transport.root, "agent", f"{hashlib.sha256(agent_zip_bytes()).hexdigest()}.pyz")


def push_agent(transport: Transport) -> str:
    """Make sure this edgekit's agent zipapp is on the device; return its remote path."""
    remote = agent_path(transport)
    if transport.sha256(remote) != posixpath.basename(remote)[:-4]:
        with tempfile.TemporaryDirectory(prefix="edgekit-agent-") as tmp:
            local = build_agent_zip(Path(tmp))
            transport.mkdir(posixpath.dirname(remote))
            transport.put(local, remote, sha256=local.stem)
    return remote
