"""Content-addressed, resumable push of bundles (and of the agent) to a device.

Remote layout under the transport's root::

    objects/<sha256>                    every file ever pushed, stored once by content
    objects/.<name>.<sha16>.part        an upload in progress (resumed after a dropped link)
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
from its temp file. The bound is on consecutive attempts that make no progress.

The device-side steps run as one small stdlib-only Python program per phase (``_STORE``), so
a push costs two commands plus the uploads, and works the same over ``local`` and ``ssh``.
"""

from __future__ import annotations

import json
import posixpath
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgekit.agent.pack import build_agent_zip
from edgekit.bundle import MANIFEST, Bundle
from edgekit.errors import DeviceError, LinkError, TransportError
from edgekit.fsutil import sha256_file
from edgekit.transport.base import Transport

RETRIES = 5  # consecutive attempts without progress before a push gives up
BACKOFF_S = 0.5  # first wait after a dropped link; doubles up to MAX_BACKOFF_S
MAX_BACKOFF_S = 8.0
SPACE_MARGIN = 1 << 20  # keep this much free on the device beyond what a push needs
BATCH_CHECK_MAX = 4 << 20  # smaller objects are hash-checked together at commit, not one by one


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
        return {
            "remote_dir": self.remote_dir,
            "bytes_sent": self.bytes_sent,
            "files_sent": self.files_sent,
            "files_skipped": self.files_skipped,
            "duration_s": self.duration_s,
            "resumed": self.resumed,
            "retries": self.retries,
            "current": self.current,
            "previous": self.previous,
        }


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
            state.note_plan(missing, entries, size_of)
            need = sum(size_of[s] for s in missing)
            free = plan.get("free")
            if missing and isinstance(free, int) and free < need + SPACE_MARGIN:
                raise DeviceError(
                    f"not enough space on the device: the push needs {_mb(need)} MB, {_mb(free)} MB are free in {transport.root}",
                    f"free space on the device (old bundles live under {transport.root}/bundles and /objects)",
                )
            if missing:
                transport.mkdir(posixpath.join(transport.root, "objects"))
            pending: list[list] = []  # small objects sent unchecked: the commit checks them all at once
            for sha in missing:
                deferred = _upload(transport, local_of[sha], sha, size_of[sha], state, progress)
                if deferred:
                    pending.append([sha, deferred, size_of[sha]])
            done = _store(transport, "commit", {**request, "pending": pending})
            for sha in done.get("bad", []):  # arrived damaged: send again, checked one by one
                _upload(transport, local_of[sha], sha, size_of[sha], state, progress, batch=False)
            if done.get("bad"):
                done = _store(transport, "commit", request)
            break
        except LinkError:
            progressed = state.bytes_sent + state.files_sent > mark
            failures = 1 if progressed else failures + 1
            if failures > retries:
                raise
            if progressed:
                wait = backoff_s
            state.retries += 1
            sleep(wait)
            wait = min(wait * 2, max_backoff_s)
    skipped = len(entries) - state.files_sent_unique
    return PushResult(
        remote_dir=posixpath.join(transport.root, "bundles", bundle_hash),
        bytes_sent=state.bytes_sent,
        files_sent=state.files_sent_unique,
        files_skipped=max(0, skipped),
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


def current_bundle(transport: Transport) -> str | None:
    """The bundle hash ``current`` points at on the device (None: nothing pushed yet)."""
    return _hash_of(_store(transport, "status", {}).get("current"))


def push_agent(transport: Transport) -> str:
    """Make sure this edgekit's agent zipapp is on the device; return its remote path."""
    with tempfile.TemporaryDirectory(prefix="edgekit-agent-") as tmp:
        local = build_agent_zip(Path(tmp))
        remote = posixpath.join(transport.root, "agent", local.name)
        if transport.sha256(remote) != local.stem:
            transport.mkdir(posixpath.dirname(remote))
            transport.put(local, remote)
    return remote


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
        self.started: float | None = None
        self.completed_bytes = 0  # sizes of the objects finished so far
        self.position = 0  # how much of the current object is on the device

    @property
    def files_sent_unique(self) -> int:
        return len(self.sent)

    def note_plan(self, missing: list[str], entries, size_of) -> None:
        if self.started is None:  # the first answer fixes the totals; later ones only shrink
            self.bytes_total = sum(size_of[s] for s in missing)
            self.files_total = len(missing)
            self.started = time.monotonic()

    def report(self, progress: Progress | None, file: str) -> None:
        if progress is None:
            return
        done = self.completed_bytes + self.position
        elapsed = max(time.monotonic() - (self.started or time.monotonic()), 1e-6)
        progress(PushProgress(done, self.bytes_total, len(self.sent), self.files_total, done / elapsed, file))


def _upload(
    transport: Transport, local: Path, sha: str, size: int, state: _Counters, progress: Progress | None, batch: bool = True
) -> str | None:
    """Send one object. Small ones (over SSH) go to a temp name unchecked: the temp name is
    returned, for the commit step to hash and rename with the others in one command."""
    remote = posixpath.join(transport.root, "objects", sha)
    state.position = 0
    deferred = None

    def tick(n: int) -> None:
        state.bytes_sent += n
        state.position += n
        state.report(progress, local.name)

    def resumed(offset: int) -> None:
        state.resumed += 1
        state.position = offset  # on the device already, from an earlier attempt

    if getattr(transport, "supports_resume", False) and batch and size < BATCH_CHECK_MAX:
        deferred = posixpath.join(transport.root, "objects", f".{sha}.up")
        transport.put(local, deferred, sha256=sha, verify=False, progress=tick)  # type: ignore[call-arg]
    elif getattr(transport, "supports_resume", False):
        transport.put(local, remote, sha256=sha, resume=True, progress=tick, resumed=resumed)  # type: ignore[call-arg]
    else:
        transport.put(local, remote)
        tick(size)
    state.sent.add(sha)
    state.files_sent += 1
    state.completed_bytes += size
    state.position = 0
    state.report(progress, "")
    return deferred


def _store(transport: Transport, mode: str, request: dict) -> dict:
    """Run one phase of the device-side store program; its JSON answer."""
    # -S: no site import (stdlib only is needed): starts several times faster on a loaded device
    argv = [transport.python, "-S", "-c", _STORE, transport.root, mode, json.dumps(request, separators=(",", ":"))]
    result = transport.run(argv, timeout=600, check=False)
    text = result.stdout.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text.splitlines()[-1]) if text else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
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


# The device side. Python 3.7+, stdlib only; argv: ROOT MODE JSON; prints one JSON line.
_STORE = r'''
import errno, hashlib, json, os, shutil, sys, time
root, mode, req = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
objects, bundles = os.path.join(root, "objects"), os.path.join(root, "bundles")
CUR, PREV = os.path.join(root, "current"), os.path.join(root, "previous")
CACHE = os.path.join(objects, ".verified.json")

def out(doc):
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.exit(0)

def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass

def sha_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

def load_cache():
    try:
        with open(CACHE) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}

def save_cache(cache):
    tmp = CACHE + ".%d.tmp" % os.getpid()
    try:
        with open(tmp, "w") as fh:
            json.dump(cache, fh)
        os.replace(tmp, CACHE)
    except OSError:
        pass

def good_object(sha, size, cache):
    # An object counts only when its bytes hash right; the check is skipped for files
    # verified before and untouched since (same size, mtime and inode).
    path = os.path.join(objects, sha)
    try:
        st = os.stat(path)
    except OSError:
        return False
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    if st.st_size == size and cache.get(sha) == stamp:
        return True
    if st.st_size == size and sha_of(path) == sha:
        cache[sha] = stamp
        return True
    try:
        os.unlink(path)  # damaged: it will be sent again
    except OSError:
        pass
    cache.pop(sha, None)
    return False

def link_target(path):
    try:
        return os.readlink(path)
    except OSError:
        return None

def same(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False

def place(src, dest):
    # dest becomes src's content atomically: a hard link when possible, else a copy
    tmp = "%s.%d.tmp" % (dest, os.getpid())
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o644)
    os.replace(tmp, dest)

def switch(link, target):
    tmp = "%s.%d.tmp" % (link, os.getpid())
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)

try:
    for d in (root, objects, bundles):
        if not os.path.isdir(d):
            os.makedirs(d, exist_ok=True)
    if mode == "plan":
        now = time.time()
        for entry in os.listdir(objects):  # unchecked uploads abandoned by a push that died
            if entry.endswith(".up"):
                try:
                    if now - os.path.getmtime(os.path.join(objects, entry)) > 86400:
                        os.unlink(os.path.join(objects, entry))
                except OSError:
                    pass
        cache = load_cache()
        missing = []
        for rel, sha, size in req["files"]:
            if sha not in missing and not good_object(sha, size, cache):
                missing.append(sha)
        save_cache(cache)
        st = os.statvfs(objects)
        out({"missing": missing, "free": st.f_bavail * st.f_frsize, "current": link_target(CUR)})
    if mode == "commit":
        name = req["bundle"]
        final = os.path.join(bundles, name)
        rel_target = "bundles/" + name
        bad = []
        for sha, part, size in req.get("pending", []):
            # sent unchecked (small files): check each, then rename it into the store
            try:
                ok = os.path.getsize(part) == size and sha_of(part) == sha
            except OSError:
                ok = False
            if ok:
                os.chmod(part, 0o644)
                os.replace(part, os.path.join(objects, sha))
            else:
                bad.append(sha)
                try:
                    os.unlink(part)
                except OSError:
                    pass
        if bad:
            fsync_dir(objects)
            out({"bad": bad})
        for rel, sha, size in req["files"]:
            if not os.path.isfile(os.path.join(objects, sha)):
                out({"error": "object %s (%s) vanished from the device during the push" % (sha[:12], rel), "hint": "push again"})
        if os.path.isdir(final):
            # already there: repair any file that is not its object (each replace is atomic)
            for rel, sha, size in req["files"]:
                dest = os.path.join(final, *rel.split("/"))
                obj = os.path.join(objects, sha)
                if not same(dest, obj):
                    parent = os.path.dirname(dest)
                    if not os.path.isdir(parent):
                        os.makedirs(parent, exist_ok=True)
                    if os.path.isfile(dest) and os.path.getsize(dest) == size and sha_of(dest) == sha:
                        continue  # a good copy (file system without hard links)
                    place(obj, dest)
        else:
            tmp = os.path.join(bundles, ".%s.%d.tmp" % (name, os.getpid()))
            if os.path.isdir(tmp):
                shutil.rmtree(tmp)
            os.makedirs(tmp)
            # manifest.json last: a bundle directory that has one is complete
            for rel, sha, size in sorted(req["files"], key=lambda f: f[0] == "manifest.json"):
                dest = os.path.join(tmp, *rel.split("/"))
                parent = os.path.dirname(dest)
                if not os.path.isdir(parent):
                    os.makedirs(parent, exist_ok=True)
                place(os.path.join(objects, sha), dest)
            for dirpath, dirnames, filenames in os.walk(tmp, topdown=False):
                fsync_dir(dirpath)
            os.rename(tmp, final)
            fsync_dir(bundles)
        # every object of the bundle was hash-checked just now (by "plan", or on upload):
        # remember that, so the next push of it needs no re-hashing
        cache = load_cache()
        for rel, sha, size in req["files"]:
            try:
                st = os.stat(os.path.join(objects, sha))
                cache[sha] = [st.st_size, st.st_mtime_ns, st.st_ino]
            except OSError:
                pass
        save_cache(cache)
        cur = link_target(CUR)
        prev = link_target(PREV)
        if req.get("activate", True) and cur != rel_target:
            if cur is not None:
                switch(PREV, cur)
                prev = cur
            switch(CUR, rel_target)
            cur = rel_target
            fsync_dir(root)
        out({"current": cur, "previous": prev})
    if mode == "rollback":
        cur, prev = link_target(CUR), link_target(PREV)
        if prev is None or not os.path.isdir(os.path.join(root, prev)):
            out({"error": "there is no previous bundle to roll back to on the device", "hint": "push the bundle you want instead"})
        switch(CUR, prev)
        if cur is not None:
            switch(PREV, cur)
        fsync_dir(root)
        out({"current": prev, "previous": cur})
    if mode == "status":
        out({"current": link_target(CUR), "previous": link_target(PREV)})
    out({"error": "unknown store mode %r" % mode})
except OSError as exc:
    kind = "space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "os"
    hint = "free space on the device" if kind == "space" else "check permissions of %s on the device" % root
    out({"error": "the device's store failed: %s (%s)" % (exc.strerror or exc, getattr(exc, "filename", "") or root), "hint": hint, "kind": kind})
'''


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
