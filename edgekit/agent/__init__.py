"""The device-side agent: loads one variant of a bundle, times it, prints one JSON document.

It runs on the device as a standalone zipapp (see ``pack.py``), so every module here imports
only the standard library and its own siblings (relatively, so the package works under any
name). numpy and the backend runtimes are imported lazily, inside the functions that need them.
The host may import this package (``bundle_hash`` and ``sha256_file`` are defined once for
the device side, here); the agent never imports the host.

Syntax stays Python 3.7-compatible: boards run old interpreters (Debian buster has 3.7).
"""

from __future__ import annotations

import hashlib
import json
import re

from .digest import sha256_file

__all__ = ["AGENT_VERSION", "SCHEMA", "AgentFailure", "bundle_file", "bundle_hash", "error_document", "missing_runtime", "provision_hint", "sha256_file"]

AGENT_VERSION = "0.1.0"
SCHEMA = 1
# A --duration run on a microsecond model would otherwise print a JSON document of many MB; the
# host refuses a reply with more (a compromised or broken agent's).
MAX_SAMPLES = 1_000_000


class AgentFailure(Exception):
    """An expected failure on the device, reported as an ``edgekit.error`` document.
    ``runtime``: the runtime (a ``devices provision --runtime`` name) whose absence it is, if so."""

    def __init__(self, message: str, hint: str = "", runtime: str | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.runtime = runtime
        # what failed, for the host to act on: "compile" (the runtime refused the model), or ""
        self.reason = reason


def provision_hint(runtime: str, device: str = "DEVICE") -> str:
    """The one hint for a runtime missing on a device, wherever it is found (preflight, the agent):
    edgekit's own venv there, never ``pip install`` into the system Python (which Debian 12 and
    Raspberry Pi OS refuse: PEP 668, "externally-managed-environment")."""
    return f"install it into edgekit's own venv on the device: edgekit devices provision {device} --runtime {runtime} (or add --provision to deploy)"


def missing_runtime(runtime: str, what: str | None = None) -> AgentFailure:
    """The failure of a backend whose runtime (``what``: its module, default ``runtime``) is not installed."""
    import sys

    return AgentFailure(f"{what or runtime} is not installed on the device (for {sys.executable})", provision_hint(runtime), runtime=runtime)


# Manifest fields that do not define the bundle: a rebuild of the same bundle may differ in them.
# ``plan`` records how the bundle was made (host paths, the device asked for), not what it is.
VOLATILE = frozenset({"created", "plan"})


def bundle_hash(manifest: dict) -> str:
    """The bundle's identity: sha256 of its manifest (canonical JSON) without ``VOLATILE`` fields.

    The manifest lists every file's sha256, so this covers the files and everything else that
    defines the bundle (profile, backend, variants and their options): bundles that differ in
    any of it get different ids, and so different directories on the device.
    """
    doc = {k: v for k, v in manifest.items() if k not in VOLATILE}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def installed_versions() -> dict:
    """Every installed distribution's version by normalized name (``onnxruntime_gpu``), read from
    the ``*.dist-info`` / ``*.egg-info`` names on ``sys.path``, first found wins (as import does).
    Where importlib.metadata exists it reads the same directories, and takes ~40 ms to import;
    on Python 3.7 it does not exist at all."""
    import os
    import sys

    found: dict = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            parts = name.rsplit(".", 1)[0].split("-")
            if len(parts) >= 2:
                found.setdefault(normalize_dist(parts[0]), parts[1])
    return found


def normalize_dist(name: str) -> str:
    """PEP 503 name normalization, with the underscores dist-info directory names use."""
    return re.sub(r"[-_.]+", "_", name).lower()


def version_tuple(version: str) -> tuple:
    """``"8.5.2.2"`` -> ``(8, 5, 2, 2)``; anything after the numeric prefix is ignored; ValueError
    when there is no leading number. The one parser of runtime versions, host and device."""
    match = re.match(r"\d+(\.\d+)*", str(version).strip())
    if not match:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(p) for p in match.group(0).split("."))


def read_json(path: str, bad_json_hint: str):
    """A JSON file the agent was given; AgentFailure when it can't be read or parsed."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise AgentFailure(f"cannot read {path}: {exc.strerror}", REPUSH) from None
    except ValueError as exc:
        raise AgentFailure(f"{path} is not valid JSON: {exc}", bad_json_hint) from None


REPUSH = "push the bundle again (edgekit bench / edgekit deploy do this)"
# Variant options that name a file of the bundle (a backend runs or reads it).
PATH_OPTIONS = ("runner",)
# A bundle is code: its runner and backends run with this account's rights. One that names a path
# outside itself was not written by edgekit.
_FOREIGN = "rebuild the bundle with edgekit deploy; run only bundles from people you would let run code on this device"


def is_bundle_relpath(rel) -> bool:
    """A plain relative POSIX path that stays inside the bundle: no '..', '.', empty part, root or backslash."""
    return (
        isinstance(rel, str)
        and 0 < len(rel) <= 4096
        and not rel.startswith("/")
        and "\\" not in rel
        and "\0" not in rel
        and all(part not in ("", ".", "..") for part in rel.split("/"))
    )


def bundle_file(bundle_dir: str, rel, what: str) -> str:
    """The path of ``rel`` (a path the manifest names, as ``what``) inside ``bundle_dir``.

    Refused (AgentFailure) when it is not a plain relative path, or when it resolves (through a
    symlink) outside the bundle: the agent never reads, runs or chmods a file the bundle does not hold.
    """
    import os

    if not is_bundle_relpath(rel):
        raise AgentFailure(f"manifest.json: {what} {rel!r} is not a path inside the bundle (relative, no '..')", _FOREIGN)
    path = os.path.join(bundle_dir, *rel.split("/"))
    root = os.path.realpath(bundle_dir)
    real = os.path.realpath(path)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise AgentFailure(f"manifest.json: {what} {rel} resolves outside the bundle (to {real})", _FOREIGN)
    return path


def error_document(message: str, hint: str = "", runtime: str | None = None, reason: str = "") -> dict:
    doc = {"schema": SCHEMA, "kind": "edgekit.error", "agent_version": AGENT_VERSION, "error": message, "hint": hint}
    if runtime:
        doc["missing_runtime"] = runtime  # the host names the device in the provision hint
    if reason:
        doc["reason"] = reason
    return doc
