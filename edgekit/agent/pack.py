"""Build the agent as one zipapp: ``python agent.pyz bench ...`` on any device with Python.

The archive is deterministic (sorted entries, fixed timestamps and modes, no compression),
so its sha256 depends only on the agent's source: it is content-addressed on the device
and pushed once per agent version, not once per run.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "edgekit_agent"  # the name the agent package has inside the zip
_HOST_ONLY = {"pack.py"}
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
from {PACKAGE}.__main__ import main
sys.exit(main())
'''


def agent_zip_bytes() -> bytes:
    """The agent zipapp's bytes, built from this package's sources."""
    src = Path(__file__).resolve().parent
    members = {"__main__.py": _BOOT.encode()}
    for path in src.rglob("*.py"):
        rel = path.relative_to(src)
        if "__pycache__" not in rel.parts and rel.as_posix() not in _HOST_ONLY:
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
    fd, tmp = tempfile.mkstemp(prefix=".agent.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest
