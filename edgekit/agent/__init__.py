"""The device-side agent: loads one variant of a bundle, times it, prints one JSON document.

It runs on the device as a standalone zipapp (see ``pack.py``), so every module here imports
only the standard library and its own siblings (relatively, so the package works under any
name). numpy and the backend runtimes are imported lazily, inside the functions that need them.
The host may import this package (``bundle_hash`` is defined once, here); the agent never
imports the host.

Syntax stays Python 3.7-compatible: boards run old interpreters (Debian buster has 3.7).
"""

from __future__ import annotations

import hashlib

AGENT_VERSION = "0.1.0"
SCHEMA = 1


class AgentFailure(Exception):
    """An expected failure on the device, reported as an ``edgekit.error`` document."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def bundle_hash(files) -> str:
    """Content identity of a bundle: sha256 over its sorted ``(path, sha256)`` pairs.

    ``files`` is an iterable of ``(relative_path, sha256_hex)``. manifest.json itself is not
    part of it (it carries a creation time), so the same payload always hashes the same.
    """
    h = hashlib.sha256()
    for path, digest in sorted(files):
        h.update(f"{digest}  {path}\n".encode())
    return h.hexdigest()


def error_document(message: str, hint: str = "") -> dict:
    return {"schema": SCHEMA, "kind": "edgekit.error", "agent_version": AGENT_VERSION, "error": message, "hint": hint}
