"""The device side of a push: ``python agent.pyz store ROOT MODE JSON`` prints one JSON line.

Modes (the layout is described in the host's ``edgekit.transport.push``): ``plan`` (missing
objects, free space, cleanup of abandoned upload parts), ``commit`` (build the bundle under a
temp name, rename, switch ``current``), ``rollback``, ``status``. A failure is ``{"error",
"hint", "kind"}`` (kind "space": disk full), still exit 0: the host raises a typed error.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import time

from . import is_bundle_relpath, sha256_file

PART_MAX_AGE_S = 24 * 3600  # an upload temp file untouched this long belongs to a push given up on


def answer(argv: list) -> dict:
    """The JSON answer of one store step (``argv``: ROOT MODE JSON)."""
    if len(argv) != 3:
        return {"error": "agent usage: store ROOT MODE JSON", "hint": "push with the same edgekit version"}
    root = argv[0]
    try:
        return _Store(root).run(argv[1], json.loads(argv[2]))
    except OSError as exc:
        kind = "space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "os"
        hint = "free space on the device" if kind == "space" else f"check permissions of {root} on the device"
        where = getattr(exc, "filename", "") or root
        return {"error": f"the device's store failed: {exc.strerror or exc} ({where})", "hint": hint, "kind": kind}


def main(argv: list) -> int:
    sys.stdout.write(json.dumps(answer(argv)) + "\n")
    return 0


class _Store:
    def __init__(self, root: str) -> None:
        self.root = root
        self.objects = os.path.join(root, "objects")
        self.bundles = os.path.join(root, "bundles")
        self.cur = os.path.join(root, "current")
        self.prev = os.path.join(root, "previous")
        self.cache_path = os.path.join(self.objects, ".verified.json")

    def run(self, mode: str, req: dict) -> dict:
        for d in (self.root, self.objects, self.bundles):
            os.makedirs(d, exist_ok=True)
        if mode not in ("plan", "commit", "rollback", "status"):
            return {"error": f"unknown store mode {mode!r}"}
        bad = _bad_request(mode, req)
        if bad:
            return {"error": f"the device's store refused the push: {bad}", "hint": "rebuild the bundle with edgekit deploy (bundle paths stay inside the bundle)"}
        return getattr(self, mode)(req)

    # -- modes --------------------------------------------------------------------------------
    def plan(self, req: dict) -> dict:
        cache = self._load_cache()
        missing = []
        for _rel, sha, size in req["files"]:
            if sha not in missing and not self._good_object(sha, size, cache):
                missing.append(sha)
        self._save_cache(cache)
        self._clean_parts(set(missing))
        st = os.statvfs(self.objects)
        return {"missing": missing, "free": st.f_bavail * st.f_frsize, "current": _link_target(self.cur)}

    def commit(self, req: dict) -> dict:
        name = req["bundle"]
        final = os.path.join(self.bundles, name)
        if req.get("verify"):  # objects that came another way than this store's upload (Ansible's copy): hash each first
            missing = self.plan(req)["missing"]
            if missing:
                return {"error": f"{len(missing)} object(s) of the bundle are missing or damaged on the device after the push",
                        "hint": "push again", "missing": missing}  # fmt: skip
        for rel, sha, _size in req["files"]:
            if not os.path.isfile(os.path.join(self.objects, sha)):
                return {"error": f"object {sha[:12]} ({rel}) vanished from the device during the push", "hint": "push again"}
        if os.path.isdir(final):
            self._repair(final, req["files"])
        else:
            self._build(final, name, req["files"])
        # every object of the bundle was hash-checked just now (by "plan", or on upload):
        # remember that, so the next push of it needs no re-hashing
        cache = self._load_cache()
        for _rel, sha, _size in req["files"]:
            with contextlib.suppress(OSError):
                cache[sha] = _stamp(os.stat(os.path.join(self.objects, sha)))
        self._save_cache(cache)
        target = "bundles/" + name
        cur, prev = _link_target(self.cur), _link_target(self.prev)
        if req.get("activate", True) and cur != target:
            if cur is not None:
                _switch(self.prev, cur)
                prev = cur
            _switch(self.cur, target)
            cur = target
            _fsync_dir(self.root)
        return {"current": cur, "previous": prev}

    def rollback(self, req: dict) -> dict:
        cur, prev = _link_target(self.cur), _link_target(self.prev)
        if prev is None or not os.path.isdir(os.path.join(self.root, prev)):
            return {"error": "there is no previous bundle to roll back to on the device", "hint": "push the bundle you want instead"}
        _switch(self.cur, prev)
        if cur is not None:
            _switch(self.prev, cur)
        _fsync_dir(self.root)
        return {"current": prev, "previous": cur}

    def status(self, req: dict) -> dict:
        return {"current": _link_target(self.cur), "previous": _link_target(self.prev)}

    # -- helpers ------------------------------------------------------------------------------
    def _good_object(self, sha: str, size: int, cache: dict) -> bool:
        # An object counts only when its bytes hash right; the check is skipped for files
        # verified before and untouched since (same size, mtime and inode).
        path = os.path.join(self.objects, sha)
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_size == size and (cache.get(sha) == _stamp(st) or sha256_file(path) == sha):
            cache[sha] = _stamp(st)
            return True
        _unlink(path)  # damaged: it will be sent again
        cache.pop(sha, None)
        return False

    def _clean_parts(self, missing: set) -> None:
        """Drop upload temp files (``.<sha>.<tag>.part``) no push will continue: those of objects
        now present, and those untouched for a day. A part of a missing object is kept: the
        next upload of it resumes from there."""
        now = time.time()
        for entry in os.listdir(self.objects):
            if not (entry.startswith(".") and entry.endswith(".part")):
                continue
            path = os.path.join(self.objects, entry)
            sha = entry[1:65]
            try:
                stale = now - os.path.getmtime(path) > PART_MAX_AGE_S
            except OSError:
                continue
            if stale or (sha not in missing and os.path.isfile(os.path.join(self.objects, sha))):
                _unlink(path)

    def _repair(self, final: str, files: list) -> None:
        """The bundle is there already: make every file its object again (each replace is atomic)."""
        for rel, sha, size in files:
            dest = os.path.join(final, *rel.split("/"))
            obj = os.path.join(self.objects, sha)
            if _same(dest, obj):
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.isfile(dest) and os.path.getsize(dest) == size and sha256_file(dest) == sha:
                continue  # a good copy (file system without hard links)
            _place(obj, dest)

    def _build(self, final: str, name: str, files: list) -> None:
        tmp = os.path.join(self.bundles, f".{name}.{os.getpid()}.tmp")
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
        # manifest.json last: a bundle directory that has one is complete
        for rel, sha, _size in sorted(files, key=lambda f: f[0] == "manifest.json"):
            dest = os.path.join(tmp, *rel.split("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            _place(os.path.join(self.objects, sha), dest)
        for dirpath, _dirnames, _filenames in os.walk(tmp, topdown=False):
            _fsync_dir(dirpath)
        os.rename(tmp, final)
        _fsync_dir(self.bundles)

    def _load_cache(self) -> dict:
        try:
            with open(self.cache_path) as fh:
                data = json.load(fh)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save_cache(self, cache: dict) -> None:
        tmp = f"{self.cache_path}.{os.getpid()}.tmp"
        with contextlib.suppress(OSError):
            with open(tmp, "w") as fh:
                json.dump(cache, fh)
            os.replace(tmp, self.cache_path)


def _is_sha(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _bad_request(mode: str, req) -> str:
    """What is wrong with a plan/commit request ('' when nothing): every file it names must land
    inside the bundle, every object name is a sha256, the bundle's name is its hash."""
    if mode not in ("plan", "commit"):
        return ""
    if not isinstance(req, dict) or not isinstance(req.get("files"), list):
        return "the request has no list of files"
    for entry in req["files"]:
        if not (isinstance(entry, list) and len(entry) == 3):
            return f"a file entry is not [path, sha256, size]: {entry!r:.80}"
        rel, sha, size = entry
        if not is_bundle_relpath(rel):
            return f"file path {rel!r:.200} is not a path inside the bundle (relative, no '..')"
        if not _is_sha(sha) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f"file {rel}: bad sha256 or size"
    if mode == "commit" and not _is_sha(req.get("bundle")):
        return f"bundle name {req.get('bundle')!r:.80} is not a sha256"
    return ""


def _stamp(st: os.stat_result) -> list:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _link_target(path: str):
    try:
        return os.readlink(path)
    except OSError:
        return None


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _place(src: str, dest: str) -> None:
    """``dest`` becomes ``src``'s content atomically: a hard link when possible, else a copy."""
    tmp = f"{dest}.{os.getpid()}.tmp"
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o644)
    os.replace(tmp, dest)


def _switch(link: str, target: str) -> None:
    tmp = f"{link}.{os.getpid()}.tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)
