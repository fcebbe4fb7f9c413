"""The device side of the device lock: ``python agent.pyz lock OP LOCKDIR [ARGS...]`` prints one JSON line.

The protocol (a lock directory that appears with its owner file inside, a guard ``flock`` for
breaking and releasing, expiry in the device's own clock) is described in the host's
``edgekit.devices.lock``. Operations: ``acquire INFO_JSON TTL``, ``refresh TOKEN TTL``,
``release TOKEN``, ``break TOKEN`` ("" breaks whoever holds it), ``status``. Stdlib only.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
import uuid

GRACE = 60.0  # a lock dir with no owner file yet: its creator is writing it (or died doing so)


class _Lock:
    def __init__(self, lockdir: str) -> None:
        self.dir = os.path.abspath(os.path.expanduser(lockdir))
        self.parent = os.path.dirname(self.dir)
        self.owner_path = os.path.join(self.dir, "owner.json")

    def read_owner(self):
        try:
            with open(self.owner_path) as fh:
                doc = json.load(fh)
            return doc if isinstance(doc, dict) else None
        except (OSError, ValueError):
            return None

    def state(self):
        """(holder, stale, exists)."""
        try:
            st = os.stat(self.dir)
        except OSError:
            return None, False, False
        holder = self.read_owner()
        now = time.time()
        if holder is None or not isinstance(holder.get("expires"), (int, float)):
            return holder, now - st.st_mtime > GRACE, True
        return holder, now >= holder["expires"], True

    @contextlib.contextmanager
    def guarded(self):
        fd = os.open(os.path.join(self.parent, "lock.guard"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def remove(self) -> None:
        away = self.dir + ".stale." + uuid.uuid4().hex[:12]
        os.rename(self.dir, away)
        shutil.rmtree(away, ignore_errors=True)

    def acquire(self, info: dict, ttl: float) -> dict:
        out: dict = {}
        os.makedirs(self.parent, exist_ok=True)
        for attempt in (0, 1):
            # The lock appears with its owner file already inside (a renamed temp dir), so nobody
            # ever sees a lock without an owner: rename onto an existing, non-empty dir fails.
            now = time.time()
            info.update(created=now, expires=now + ttl, ttl=ttl)
            fresh = self.dir + ".new." + uuid.uuid4().hex[:12]
            os.mkdir(fresh, 0o755)
            _dump_synced(info, os.path.join(fresh, "owner.json"))
            try:
                os.rename(fresh, self.dir)
            except OSError:
                shutil.rmtree(fresh, ignore_errors=True)
                holder, stale, exists = self.state()
                if not exists:
                    continue
                if not stale or attempt:
                    out.update(acquired=False, holder=holder, stale=stale)
                    return out
                with self.guarded():
                    again, stale, exists = self.state()
                    if exists and stale and _token(again) == _token(holder):
                        self.remove()
                        out["broke"] = again
                continue
            out.update(acquired=True, holder=info)
            return out
        out.update(acquired=False, holder=self.read_owner(), stale=False)
        return out

    def change(self, op: str, token: str, ttl: float = 0.0) -> dict:
        """release / refresh / break, under the guard: only the holder ``token`` names (break "" : anyone)."""
        if not os.path.isdir(self.parent):
            return {"done": False, "holder": None}
        with self.guarded():
            holder, _, exists = self.state()
            mine = exists and (_token(holder) == token or (op == "break" and not token))
            if mine and op == "refresh":
                holder["expires"] = time.time() + ttl
                tmp = os.path.join(self.dir, ".owner.json.tmp")
                _dump_synced(holder, tmp)
                os.rename(tmp, self.owner_path)
            elif mine:
                self.remove()
            return {"done": bool(mine), "holder": holder if exists else None}


def _dump_synced(doc: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(doc, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _token(holder) -> str | None:
    return (holder or {}).get("token")


def answer(argv: list) -> dict:
    """The JSON answer to one lock operation (``argv``: OP LOCKDIR [ARGS...])."""
    if len(argv) < 2:
        return {"error": "agent usage: lock OP LOCKDIR [ARGS...]"}
    op, lock = argv[0], _Lock(argv[1])
    args = argv[2:]
    out: dict = {"now": time.time()}
    try:
        if op == "acquire" and len(args) == 2:
            out.update(lock.acquire(json.loads(args[0]), float(args[1])))
        elif op == "refresh" and len(args) == 2:
            out.update(lock.change(op, args[0], float(args[1])))
        elif op in ("release", "break") and len(args) == 1:
            out.update(lock.change(op, args[0]))
        elif op == "status" and not args:
            holder, stale, exists = lock.state()
            out.update(holder=holder if exists else None, locked=exists, stale=stale)
        else:
            return {"error": f"agent usage: lock {op} with {len(args)} argument(s)"}
    except (OSError, ValueError) as exc:
        return {"error": f"the device lock at {lock.dir} failed: {exc}"}
    return out


def main(argv: list) -> int:
    sys.stdout.write(json.dumps(answer(argv)) + "\n")
    return 0
