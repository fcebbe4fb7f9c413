"""The agent as one zipapp (``python agent.pyz bench|facts|store|lock ...``), built here on the host
from ``edgekit/agent``'s sources, and put on a device once per agent version; and the one way
the host runs it there (``agent_server``, ``agent_call``).

The archive is deterministic (sorted entries, fixed timestamps and modes, no compression),
so its sha256 depends only on the agent's source: it is content-addressed on the device.

The commands of one connection share one ``agent.pyz serve`` process where the transport can
keep a process open (one Python start and one channel per connection; each command still runs
in a fresh forked worker). Where it cannot, or the server is gone, each command runs on its own.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import posixpath
import tempfile
import time
import weakref
import zipfile
from pathlib import Path

from edgekit.fsutil import write_bytes_atomic
from edgekit.jsonable import MAX_DEPTH, strict_loads
from edgekit.transport.base import MAX_ANSWER_BYTES, CommandResult, Conversation, Transport

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
if sys.argv[1:2] == ["lock"]:  # the device lock: as small a start as the store's
    from {PACKAGE}.lock import main
    sys.exit(main(sys.argv[2:]))
if sys.argv[1:2] == ["lava"]:  # inside a LAVA test shell: bench variants, report test cases
    from {PACKAGE}.lava import main
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


@functools.lru_cache(maxsize=1)
def agent_digest() -> str:
    """The sha256 of this edgekit's agent zipapp (its sources do not change while edgekit runs)."""
    return hashlib.sha256(agent_zip_bytes()).hexdigest()


def agent_path(transport: Transport) -> str:
    """Where this edgekit's agent lives on the device (named by its content), present or not."""
    return posixpath.join(transport.root, "agent", f"{agent_digest()}.pyz")


def push_agent(transport: Transport) -> str:
    """Make sure this edgekit's agent zipapp is on the device; return its remote path."""
    remote = agent_path(transport)
    if transport.sha256(remote) != posixpath.basename(remote)[:-4]:
        with tempfile.TemporaryDirectory(prefix="edgekit-agent-") as tmp:
            local = build_agent_zip(Path(tmp))
            transport.mkdir(posixpath.dirname(remote))
            transport.put(local, remote, sha256=local.stem)
    return remote


# one agent server per open connection; a closed transport's entry goes with it
_SERVERS: weakref.WeakKeyDictionary[Transport, Conversation] = weakref.WeakKeyDictionary()


def agent_server(transport: Transport, *, start: bool = True) -> Conversation | None:
    """The connection's ``agent.pyz serve`` (started when ``start`` and none runs); None where the
    transport cannot keep a process open, or with ``EDGEKIT_AGENT_SERVE=0`` (troubleshooting, and
    the benchmark's peer). Follows ``transport.python`` (provisioning may switch it to a venv)."""
    if os.environ.get("EDGEKIT_AGENT_SERVE", "1") == "0":
        return None
    server = _SERVERS.get(transport)
    if server is not None and server.argv[0] != transport.python:
        server.close()
        server = None
    if server is None or server.returncode is not None:
        if not start:
            return None
        server = transport.converse([transport.python, push_agent(transport), "serve"])
        if server is None:
            return None
        _SERVERS[transport] = server
    return server


def ask_server(transport: Transport, server: Conversation, args: list[str], *, timeout: float) -> CommandResult | None:
    """One command through the server, as the ``CommandResult`` a separate run would give (its
    stdout: the document); None when the server is gone (the caller runs the command on its own)."""
    start = time.monotonic()
    answer, stderr = server.ask(json.dumps({"argv": list(args)}).encode(), timeout=timeout)
    argv = (transport.python, server.argv[1], *args)
    if answer is None:
        _SERVERS.pop(transport, None)
        return None
    if len(answer) > MAX_ANSWER_BYTES:
        return CommandResult(argv, 1, b"", f"the agent's server answered {len(answer) >> 20} MiB; edgekit reads at most {MAX_ANSWER_BYTES >> 20} MiB".encode(), time.monotonic() - start)
    try:
        reply = strict_loads(answer, max_depth=MAX_DEPTH + 1)  # the reply wraps the document
        status, document = int(reply["status"]), reply["document"]
    except (ValueError, KeyError, TypeError):
        return CommandResult(argv, 1, b"", b"the agent's server answered something that is not a reply", time.monotonic() - start)
    out = json.dumps(document).encode() if document is not None else b""
    return CommandResult(argv, status, out, stderr, time.monotonic() - start)


def agent_call(transport: Transport, args: list[str], *, timeout: float, serve: bool = True) -> tuple[dict | None, CommandResult]:
    """A small agent command that answers one JSON line (``store``, ``lock``): through the running
    server when ``serve`` (it is not started for these), else as its own ``python -S agent.pyz``
    (-S: the stdlib is all they need; pushed first only when missing). (The answer or None, the run.)"""
    server = agent_server(transport, start=False) if serve else None
    result = ask_server(transport, server, args, timeout=timeout) if server is not None else None
    if result is None:
        argv = [transport.python, "-S", agent_path(transport), *args]
        result = transport.run(argv, timeout=timeout, check=False)
        if result.returncode == 2 and b"can't open file" in result.stderr:  # no agent (of this version) yet
            push_agent(transport)  # only then: checking first would cost every call a command
            result = transport.run(argv, timeout=timeout, check=False)
    return result.last_json(), result
