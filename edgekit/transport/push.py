"""Content-addressed push of bundles and of the agent to a device.

Remote layout under the transport's root::

    bundles/<bundle_hash>/<relpath>     the bundle's files, manifest.json last
    agent/<sha256>.pyz                  the agent zipapp

A file whose remote sha256 already matches is not sent again; ``Transport.put`` lands each
upload under a temp name and renames it only after its hash checks out. manifest.json goes
last, so a bundle directory that has one is complete.
"""

from __future__ import annotations

import posixpath
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgekit.agent.pack import build_agent_zip
from edgekit.bundle import MANIFEST, Bundle
from edgekit.fsutil import sha256_file
from edgekit.transport.base import Transport


@dataclass(frozen=True)
class PushResult:
    remote_dir: str
    bytes_sent: int
    files_sent: int
    files_skipped: int
    duration_s: float

    def to_dict(self) -> dict:
        return {
            "remote_dir": self.remote_dir,
            "bytes_sent": self.bytes_sent,
            "files_sent": self.files_sent,
            "files_skipped": self.files_skipped,
            "duration_s": self.duration_s,
        }


def remote_bundle_dir(transport: Transport, bundle: Bundle) -> str:
    return posixpath.join(transport.root, "bundles", bundle.manifest.bundle_hash)


def push_bundle(transport: Transport, bundle: Bundle) -> PushResult:
    """Send the bundle's files the device does not already have; manifest.json last."""
    start = time.monotonic()
    remote_dir = remote_bundle_dir(transport, bundle)
    entries = [(f.path, f.sha256, f.size) for f in bundle.manifest.files]
    manifest_local = bundle.root / MANIFEST
    entries.append((MANIFEST, sha256_file(manifest_local), manifest_local.stat().st_size))
    made: set[str] = set()
    sent = skipped = nbytes = 0
    for rel, digest, size in entries:
        remote = posixpath.join(remote_dir, rel)
        if transport.sha256(remote) == digest:
            skipped += 1
            continue
        parent = posixpath.dirname(remote)
        if parent not in made:
            transport.mkdir(parent)
            made.add(parent)
        transport.put(bundle.path(rel), remote)
        sent += 1
        nbytes += size
    return PushResult(remote_dir, nbytes, sent, skipped, time.monotonic() - start)


def push_agent(transport: Transport) -> str:
    """Make sure this edgekit's agent zipapp is on the device; return its remote path."""
    with tempfile.TemporaryDirectory(prefix="edgekit-agent-") as tmp:
        local = build_agent_zip(Path(tmp))
        remote = posixpath.join(transport.root, "agent", local.name)
        if transport.sha256(remote) != local.stem:
            transport.mkdir(posixpath.dirname(remote))
            transport.put(local, remote)
    return remote
