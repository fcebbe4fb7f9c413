"""The device side of the device lock: ``python agent.pyz lock OP LOCKDIR [ARGS...]`` prints one JSON line.

The protocol (a lock directory that appears with its owner file inside, a guard ``flock`` for
breaking and releasing, expiry in the device's own clock) is described in the host's
``edgekit.devices.lock``. Operations: ``acquire INFO_JSON TTL``, ``refresh TOKEN TTL``,
``release TOKEN``, ``break TOKEN`` ("" breaks whoever holds it), ``status``, and ``keep TOKEN``
(long-lived, see below). Stdlib only.

Expiry is in the device's clock since boot (``CLOCK_BOOTTIME``), with the boot's id: a wall
clock that jumps (NTP, a board without an RTC that boots in 1970 and then learns the date)
neither expires a live lock nor keeps a dead one; a lock from an earlier boot is stale (none of
its processes survived the reboot). Locks written before this carry only wall times and are
judged by them.

A job's processes: each agent command the holder runs under the lock (``--lock LOCKDIR TOKEN``
before its arguments, ``join``) records its PID and start time in ``LOCKDIR/procs``. Breaking a
lock (expired, keeper gone, ``devices unlock``) first ends those processes and their descendants
(SIGTERM, then SIGKILL after ``END_GRACE`` s) and waits until they are gone, so the next job is
never timed beside the dead one's bench; the answer lists them (``ended``).

The keeper (``keep TOKEN``) is a process the holder keeps open over its own connection for as
long as it holds the lock; it answers each stdin line, and records its PID in ``keeper.json``.
When its stdin closes while the lock is still its holder's (the holder died, on whatever host,
or its link dropped), it ends the job's processes and removes the lock at once; and a lock whose
keeper is gone counts as stale. So a dead holder frees the device in seconds, not the TTL.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import time
import uuid

GRACE = 60.0  # a lock dir with no owner file yet: its creator is writing it (or died doing so)
END_GRACE = 3.0  # seconds between SIGTERM and SIGKILL when ending a dead job's processes
END_WAIT = 5.0  # seconds to wait for SIGKILLed processes to be gone


def _mono() -> float:
    """Seconds since boot, suspend included where the OS counts it (CLOCK_BOOTTIME)."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is not None:
        try:
            return time.clock_gettime(clock)
        except OSError:
            pass
    return time.monotonic()


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _stat(pid: int):
    """(ppid, start time in ticks, name) of a live process, or None (gone, a zombie, no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    name = raw[raw.find("(") + 1:raw.rfind(")")]
    fields = raw[raw.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), fields[19], name


def _alive(pid, start) -> bool:
    """Is process ``pid`` still the one that started at ``start`` (ticks since boot)?"""
    st = _stat(pid) if isinstance(pid, int) and pid > 0 else None
    return st is not None and st[1] == start


def _descendants(roots: set) -> set:
    """``roots`` and every live process below them."""
    children: dict = {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return set(roots)
    for pid in pids:
        st = _stat(pid)
        if st is not None:
            children.setdefault(st[0], []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


class _Lock:
    def __init__(self, lockdir: str) -> None:
        self.dir = os.path.abspath(os.path.expanduser(lockdir))
        self.parent = os.path.dirname(self.dir)
        self.owner_path = os.path.join(self.dir, "owner.json")
        self.why = ""  # why the lock ``state`` last read is stale

    def read_owner(self):
        try:
            with open(self.owner_path) as fh:
                doc = json.load(fh)
            return doc if isinstance(doc, dict) else None
        except (OSError, ValueError):
            return None

    def read_json(self, name: str):
        try:
            with open(os.path.join(self.dir, name)) as fh:
                doc = json.load(fh)
            return doc if isinstance(doc, dict) else None
        except (OSError, ValueError):
            return None

    def state(self):
        """(holder, stale, exists); ``self.why`` says why a stale lock is stale. The holder's
        ``expires`` is restated in this device's wall clock from its time since boot."""
        self.why = ""
        try:
            st = os.stat(self.dir)
        except OSError:
            return None, False, False
        holder = self.read_owner()
        now = time.time()
        if holder is None or not isinstance(holder.get("expires"), (int, float)):
            stale = now - st.st_mtime > GRACE
            self.why = "its owner file was never written" if stale else ""
            return holder, stale, True
        if holder.get("abandoned"):
            self.why = str(holder["abandoned"])
            return holder, True, True
        mono = holder.get("mono_expires")
        if holder.get("boot") and isinstance(mono, (int, float)):
            if holder["boot"] != _boot_id():
                self.why = "the device rebooted since it was taken"
                return holder, True, True
            left = mono - _mono()
            holder["expires"] = now + left
            if left <= 0:
                self.why = "it expired (no heartbeat for its TTL)"
                return holder, True, True
        elif now >= holder["expires"]:
            self.why = "it expired (no heartbeat for its TTL)"
            return holder, True, True
        keeper = self.read_json("keeper.json")
        if keeper and keeper.get("token") == _token(holder) and keeper.get("boot") == _boot_id() and not _alive(keeper.get("pid"), keeper.get("start")):
            self.why = "its holder's connection to the device is gone (the lock's keeper process ended)"
            return holder, True, True
        return holder, False, True

    def join(self, token: str, pid: int) -> bool:
        """Record process ``pid`` as one of the job's that holds the lock with ``token``."""
        st = _stat(pid)
        if st is None:
            return False
        with self.guarded():
            holder, _, exists = self.state()
            if not exists or _token(holder) != token:
                return False
            procs = os.path.join(self.dir, "procs")
            os.makedirs(procs, exist_ok=True)
            with open(os.path.join(procs, f"{pid}.json"), "w") as fh:
                json.dump({"pid": pid, "start": st[1], "name": st[2]}, fh)
        return True

    def end_job(self, spare=()) -> list:
        """End the processes of the lock's job (registered, its keeper, their descendants), but
        never this process, its ancestors or ``spare``; wait until they are gone. What was ended."""
        earlier = (self.read_json("ended.json") or {}).get("ended")  # what its keeper ended already
        ended = [e for e in earlier if isinstance(e, dict)] if isinstance(earlier, list) else []
        keeper = self.read_json("keeper.json")
        if keeper and keeper.get("pid") != os.getpid() and _alive(keeper.get("pid"), keeper.get("start")):
            _signal(keeper["pid"], keeper["start"], signal.SIGKILL)  # nothing left for it to do: we break the lock
        roots = set()
        procs = os.path.join(self.dir, "procs")
        names = sorted(os.listdir(procs)) if os.path.isdir(procs) else []
        for doc in (self.read_json(os.path.join("procs", n)) for n in names):
            if doc and _alive(doc.get("pid"), doc.get("start")):
                roots.add(doc["pid"])
        if not roots:
            return ended
        mine, pid = set(spare), os.getpid()
        while pid > 1 and pid not in mine:
            mine.add(pid)
            st = _stat(pid)
            pid = st[0] if st else 0
        victims = {p: _stat(p) for p in _descendants(roots) - mine}
        victims = {p: st for p, st in victims.items() if st is not None}
        now = [{"pid": p, "name": st[2], "signal": "SIGTERM"} for p, st in sorted(victims.items())]
        ended += now
        for p in victims:
            _signal(p, victims[p][1], signal.SIGTERM)
        left = self._wait_gone(victims, END_GRACE)
        for p in left:
            _signal(p, victims[p][1], signal.SIGKILL)
            next(e for e in now if e["pid"] == p)["signal"] = "SIGKILL"
        left = self._wait_gone({p: victims[p] for p in left}, END_WAIT)
        for e in now:
            e["gone"] = e["pid"] not in left
        return ended

    @staticmethod
    def _wait_gone(victims: dict, seconds: float) -> list:
        deadline = time.monotonic() + seconds
        while True:
            left = [p for p, st in victims.items() if _alive(p, st[1])]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.02)

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
            info.update(created=now, expires=now + ttl, ttl=ttl, boot=_boot_id(), mono_expires=_mono() + ttl)
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
                        why = self.why
                        out["ended"] = self.end_job()  # never time the next job beside the dead one's
                        self.remove()
                        out["broke"] = again
                        out["why"] = why
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
            out = {"done": bool(mine), "holder": holder if exists else None}
            if mine and op == "refresh":
                holder.update(expires=time.time() + ttl, boot=_boot_id(), mono_expires=_mono() + ttl)
                tmp = os.path.join(self.dir, ".owner.json.tmp")
                _dump_synced(holder, tmp)
                os.rename(tmp, self.owner_path)
            elif mine:
                if op == "break":
                    out["ended"] = self.end_job()
                self.remove()
            return out


def _dump_synced(doc: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(doc, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _token(holder) -> str | None:
    return (holder or {}).get("token")


def _signal(pid: int, start: str, sig) -> None:
    if _alive(pid, start):  # never a PID reused since the scan
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def keep(lockdir: str, token: str) -> int:
    """The lock's keeper: answer each stdin line until EOF; then, if the lock is still
    ``token``'s (its holder is gone without releasing it), end the job and remove the lock."""
    lock = _Lock(lockdir)
    st = _stat(os.getpid())
    with lock.guarded():
        holder, _, exists = lock.state()
        if not exists or _token(holder) != token:
            sys.stdout.write(json.dumps({"error": f"the lock at {lock.dir} is not held with this token"}) + "\n")
            return 1
        doc = {"token": token, "pid": os.getpid(), "start": st[1] if st else None, "boot": _boot_id()}
        tmp = os.path.join(lock.dir, ".keeper.json.tmp")
        _dump_synced(doc, tmp)
        os.rename(tmp, os.path.join(lock.dir, "keeper.json"))

    def hang_up(signum, frame):
        raise EOFError

    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, hang_up)
    try:
        for _line in sys.stdin:
            sys.stdout.write(json.dumps({"keeping": True, "pid": os.getpid()}) + "\n")
            sys.stdout.flush()
    except (EOFError, OSError):
        pass
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # the cleanup below must finish
    # The holder is gone without releasing (or its link dropped): end its job now, and leave the
    # lock marked abandoned, so the next job breaks it at once and its records say whose it was.
    with lock.guarded():
        holder, _, exists = lock.state()
        if exists and _token(holder) == token:
            ended = lock.end_job()
            _dump_synced({"ended": ended}, os.path.join(lock.dir, "ended.json"))
            holder["abandoned"] = "its holder's connection to the device closed without a release (the job died or lost its link)"
            tmp = os.path.join(lock.dir, ".owner.json.tmp")
            _dump_synced(holder, tmp)
            os.rename(tmp, lock.owner_path)
    return 0


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
            out.update(holder=holder if exists else None, locked=exists, stale=stale, why=lock.why)
        else:
            return {"error": f"agent usage: lock {op} with {len(args)} argument(s)"}
    except (OSError, ValueError) as exc:
        return {"error": f"the device lock at {lock.dir} failed: {exc}"}
    return out


def join(lockdir: str, token: str) -> bool:
    """This process is one of the job's that holds ``lockdir`` with ``token`` (the agent's ``--lock``)."""
    try:
        return _Lock(lockdir).join(token, os.getpid())
    except OSError:
        return False


def main(argv: list) -> int:
    if argv[:1] == ["keep"] and len(argv) == 3:
        return keep(argv[1], argv[2])
    sys.stdout.write(json.dumps(answer(argv)) + "\n")
    return 0
