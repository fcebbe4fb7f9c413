"""Content-addressed, resumable push of bundles (and of the agent) to a device.

Remote layout under the transport's root::

    objects/<sha256>                    every file ever pushed, stored once by content
    objects/.<sha256>.<sha16>.part      an upload in progress (resumed after a dropped link;
                                        dropped by the store when stale or no longer needed)
    bundles/<bundle_hash>/<relpath>     a bundle, materialized as hard links to objects
                                        (copies where the file system has no hard links)
    current -> bundles/<hash>           the active bundle: switched by renaming a symlink
    previous -> bundles/<hash>          the one before it, kept for rollback
    agent/<sha256>.pyz                  the agent zipapp

A push asks the device once which objects it has (sizes and hashes checked, not trusted),
sends only the missing ones (each to a temp name, hash-checked on the device, renamed),
then builds the bundle directory from objects under a temp name and renames it into place,
and finally switches ``current``. So a bundle directory only ever appears complete, and
``current`` only ever points at a complete bundle. Files the device already has are never
sent again, even when they belong to another bundle.

A dropped or stalled connection (``LinkError``) is retried with exponential back-off; the
retry asks the device again, so finished objects are skipped and a partial upload continues
from its temp file (once the device confirms the part's hash matches the local file's start).
The bound is on consecutive attempts that make no progress; a push that gives up after data
moved says how far it got ("push interrupted after N of M bytes"): the next push resumes.

The device-side steps are the agent's ``store`` command (``edgekit/agent/store.py``), so a
push costs two store commands and the uploads (and the agent, once per agent version), the
same over ``local`` and ``ssh``.
"""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from edgekit.bundle import MANIFEST, Bundle
from edgekit.errors import DeviceError, LinkError, TransportError
from edgekit.fsutil import sha256_file
from edgekit.transport.agentzip import agent_call
from edgekit.transport.base import Transport

RETRIES = 5  # consecutive attempts without progress before a push gives up
BACKOFF_S = 0.5  # first wait after a dropped link; doubles up to MAX_BACKOFF_S
MAX_BACKOFF_S = 8.0
SPACE_MARGIN = 1 << 20  # keep this much free on the device beyond what a push needs


@dataclass(frozen=True)
class PushResult:
    remote_dir: str
    bytes_sent: int  # bytes that crossed the link (re-sent bytes after a drop count again)
    files_sent: int
    files_skipped: int  # files the device already had (by content)
    duration_s: float
    resumed: int = 0  # times an upload continued from a partial temp file after a dropped link
    retries: int = 0  # reconnections after dropped or stalled links
    current: str | None = None  # the bundle hash `current` points at after the push
    previous: str | None = None  # the bundle hash `previous` points at (rollback target)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PushProgress:
    """What a progress callback gets, after each block and at each file boundary."""

    bytes_done: int
    bytes_total: int  # bytes the device lacks (known after the first exchange; 0 before)
    files_done: int
    files_total: int
    rate_bps: float  # bytes per second since the transfer started
    file: str  # the file being sent ("" when none)


Progress = Callable[[PushProgress], None]


def remote_bundle_dir(transport: Transport, bundle: Bundle) -> str:
    return posixpath.join(transport.root, "bundles", bundle.manifest.bundle_hash)


def push_bundle(
    transport: Transport,
    bundle: Bundle,
    *,
    activate: bool = True,
    progress: Progress | None = None,
    retries: int = RETRIES,
    backoff_s: float = BACKOFF_S,
    max_backoff_s: float = MAX_BACKOFF_S,
    sleep: Callable[[float], None] = time.sleep,
) -> PushResult:
    """Make the bundle present (and, with ``activate``, current) on the device; send only what it lacks."""
    start = time.monotonic()
    bundle_hash = bundle.manifest.bundle_hash
    manifest_local = bundle.root / MANIFEST
    entries = [(f.path, f.sha256, f.size, bundle.path(f.path)) for f in bundle.manifest.files]
    entries.append((MANIFEST, sha256_file(manifest_local), manifest_local.stat().st_size, manifest_local))
    request = {"bundle": bundle_hash, "files": [[rel, sha, size] for rel, sha, size, _ in entries], "activate": activate}
    local_of = {sha: path for _, sha, _, path in entries}
    size_of = {sha: size for _, sha, size, _ in entries}

    state = _Counters()
    failures = 0
    wait = backoff_s
    while True:
        mark = state.bytes_sent + state.files_sent
        try:
            plan = _store(transport, "plan", request)
            missing = list(dict.fromkeys(plan["missing"]))
            state.note_plan(missing, size_of)
            need = sum(size_of[s] for s in missing)
            free = plan.get("free")
            if missing and isinstance(free, int) and free < need + SPACE_MARGIN:
                raise DeviceError(
                    f"not enough space on the device: the push needs {_mb(need)} MB, {_mb(free)} MB are free in {transport.root}",
                    f"free space on the device (old bundles live under {transport.root}/bundles and /objects)",
                )
            for sha in missing:
                _upload(transport, local_of[sha], sha, size_of[sha], state, progress)
            done = _store(transport, "commit", request)
            break
        except LinkError as exc:
            progressed = state.bytes_sent + state.files_sent > mark
            failures = 1 if progressed else failures + 1
            if failures > retries:
                if state.started is None:  # never reached the device: the link error says it all
                    raise
                raise TransportError(
                    f"push interrupted after {state.done} of {state.bytes_total} bytes ({exc.message}); run again to resume",
                    exc.hint,
                ) from None
            if progressed:
                wait = backoff_s
            state.retries += 1
            sleep(wait)
            wait = min(wait * 2, max_backoff_s)
    return PushResult(
        remote_dir=remote_bundle_dir(transport, bundle),
        bytes_sent=state.bytes_sent,
        files_sent=len(state.sent),
        files_skipped=max(0, len(entries) - len(state.sent)),
        duration_s=time.monotonic() - start,
        resumed=state.resumed,
        retries=state.retries,
        current=_hash_of(done.get("current")),
        previous=_hash_of(done.get("previous")),
    )


def rollback(transport: Transport) -> tuple[str, str | None]:
    """Make ``previous`` current again (and the current one previous); (current, previous)."""
    done = _store(transport, "rollback", {})
    return _hash_of(done["current"]) or "", _hash_of(done.get("previous"))


# -- internals --------------------------------------------------------------------------------


class _Counters:
    def __init__(self) -> None:
        self.bytes_sent = 0  # over the link, re-sent bytes included
        self.files_sent = 0  # uploads finished (a retry's upload counts again)
        self.sent: set[str] = set()  # objects uploaded by this push
        self.resumed = 0
        self.retries = 0
        self.bytes_total = 0
        self.files_total = 0
        self.started: float | None = None  # when the device first answered
        self.completed_bytes = 0  # sizes of the objects finished so far
        self.position = 0  # how much of the current object is on the device

    @property
    def done(self) -> int:
        """Bytes of the missing objects that are on the device."""
        return self.completed_bytes + self.position

    def note_plan(self, missing: list[str], size_of: dict[str, int]) -> None:
        if self.started is None:  # the first answer fixes the totals; later ones only shrink
            self.bytes_total = sum(size_of[s] for s in missing)
            self.files_total = len(missing)
            self.started = time.monotonic()

    def report(self, progress: Progress | None, file: str) -> None:
        if progress is None:
            return
        elapsed = max(time.monotonic() - (self.started or time.monotonic()), 1e-6)
        progress(PushProgress(self.done, self.bytes_total, len(self.sent), self.files_total, self.done / elapsed, file))


def _upload(transport: Transport, local: Path, sha: str, size: int, state: _Counters, progress: Progress | None) -> None:
    """Send one object to the store, resuming from a partial upload the device has."""
    state.position = 0

    def tick(sent: int, on_device: int) -> None:
        state.resumed += sent == 0 and on_device > 0  # the put continues a part (it may not finish)
        state.bytes_sent += sent
        state.position = on_device
        state.report(progress, local.name)

    transport.put(local, posixpath.join(transport.root, "objects", sha), sha256=sha, resume=True, progress=tick)
    state.sent.add(sha)
    state.files_sent += 1
    state.completed_bytes += size
    state.position = 0
    state.report(progress, "")


def _store(transport: Transport, mode: str, request: dict) -> dict:
    """Run one step of the agent's store on the device; its JSON answer."""
    doc, result = agent_call(transport, ["store", transport.root, mode, json.dumps(request, separators=(",", ":"))], timeout=600)
    if doc is None:
        tail = result.stderr_tail(3)
        raise TransportError(
            f"the device's store step '{mode}' failed (exit code {result.returncode})" + (f": {tail}" if tail else ""),
            f"check {transport.root} on the device is writable and its Python ({transport.python}) is 3.7 or newer",
        )
    if "error" in doc:
        cls = DeviceError if doc.get("kind") == "space" else TransportError
        raise cls(str(doc["error"]), str(doc.get("hint") or "check the device's edgekit directory"))
    return doc


def _hash_of(link_target: str | None) -> str | None:
    return posixpath.basename(link_target) if link_target else None


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def describe(p: PushProgress) -> str:
    """One line for a progress bar: "12.3 / 50.0 MB, file 2 of 4, 95.1 MB/s"."""
    return (
        f"pushing {p.bytes_done / 1e6:.1f} / {p.bytes_total / 1e6:.1f} MB, "
        f"file {min(p.files_done + 1, p.files_total)} of {p.files_total}, {p.rate_bps / 1e6:.1f} MB/s"
    )


def progress_reporter(bar, interval_s: float = 0.1) -> Progress:
    """A push progress callback that updates ``bar`` (``update(description)``) at most every ``interval_s``."""
    last = [0.0]

    def report(p: PushProgress) -> None:
        now = time.monotonic()
        if now - last[0] >= interval_s or (p.bytes_done >= p.bytes_total and not p.file):
            last[0] = now
            bar.update(describe(p))

    return report
