"""An exclusive lock on a device, so two CI jobs never benchmark the same board at once.

The lock is the directory ``<root>/lock`` on the device: ``mkdir`` either creates it or
fails, atomically, on every POSIX filesystem. Inside it ``owner.json`` names the holder
(owner label, host, PID, user, a token) and when the lock was created and expires, in the
device's own clock (so clock skew between hosts doesn't matter). A holder refreshes its
expiry while it works (a heartbeat); a lock whose job died expires and is then broken. A lock
whose holder ran on this very host (same boot, same PID namespace) and whose process is gone is
broken at once: waiting out the TTL would tell us nothing new.

A holder that could not refresh for longer than the TTL (stalled link, suspended host) may have
had its lock broken by another job; it then marks the lock lost, and ``ensure_held()`` (called
before storing anything measured under the lock) raises ``LockLostError``.

Breaking and releasing go through a guard (``flock`` on ``<root>/lock.guard``, held only for
the few microseconds of check-and-rename on the device): under it the lock is read again, and
only if it is still the same stale lock is it renamed away (then deleted). So two jobs that
both find a stale lock cannot both break it, and neither can break the fresh lock the other
took a moment later. A release only removes a lock that still carries the releaser's token.

A held lock keeps a keeper on the device (``agent.pyz lock keep``, over its own channel): when the
holder dies on any host, its connection closes, and the keeper ends the job's processes and
removes the lock in seconds; a lock whose keeper is gone is stale. Expiry is in the device's
time since boot, so a device wall clock that jumps changes nothing. Each agent command run
under the lock joins its job (``--lock LOCKDIR TOKEN``); breaking a stale lock ends those
processes first and waits until they are gone, and ``broke``/``ended`` say so (the deploy's
records keep it as ``lock``). See ``edgekit/agent/lock.py``.

Every operation is one call of the agent's ``lock`` command on the device (``edgekit/agent/lock.py``,
stdlib only): through the connection's agent server when one runs, else as its own short
``python -S agent.pyz lock ...``. The heartbeat always uses its own command: it runs beside
whatever the server is busy with. Paths travel as arguments, never through a shell.
"""

from __future__ import annotations

import getpass
import json
import os
import posixpath
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgekit.errors import DeviceError, LockLostError
from edgekit.transport.agentzip import agent_call, push_agent
from edgekit.transport.base import Transport

LOCK_DIR = "lock"
DEFAULT_TTL = 300.0  # seconds without a heartbeat after which a lock counts as abandoned
DEFAULT_WAIT = 600.0  # how long deploy/bench queue behind another job by default


def lock_path(transport: Transport) -> str:
    return posixpath.join(transport.root, LOCK_DIR)


def describe_holder(holder: dict | None, now: float | None = None) -> str:
    """One line about who holds a lock: owner, where from, since when, until when."""
    if not holder:
        return "a job that has not written its owner file yet"
    who = str(holder.get("owner") or "unknown")
    where = f"{holder.get('user', '?')}@{holder.get('host', '?')}"
    text = f"{who} (pid {holder.get('pid', '?')})" if who == where else f"{who} ({where}, pid {holder.get('pid', '?')})"
    created = holder.get("created")
    if isinstance(created, (int, float)):
        text += f" since {datetime.fromtimestamp(created, timezone.utc).strftime('%Y-%m-%d %H:%M:%S')} UTC"
    expires = holder.get("expires")
    if isinstance(expires, (int, float)) and now is not None:
        left = expires - now
        text += f", expires in {left:.0f}s" if left > 0 else f", expired {-left:.0f}s ago"
    return text


def default_owner() -> str:
    """The owner label: the CI job when there is one, else user@host."""
    for var in ("CI_JOB_URL", "GITHUB_RUN_ID", "BUILD_URL", "CI_JOB_ID"):
        if os.environ.get(var):
            return f"{var}={os.environ[var]}"
    return f"{_user()}@{socket.gethostname()}"


def holder_info(owner: str | None = None) -> dict[str, Any]:
    """What a new lock's owner file says about its holder (this process), with a fresh token."""
    return {
        "token": uuid.uuid4().hex,
        "owner": owner or default_owner(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "user": _user(),
        "instance": _process_instance(os.getpid()),
    }


class DeviceLock:
    """The lock on one device; a context manager (``device_lock``) that takes it, waiting up to ``wait`` s.

    ``on_wait`` is told in one sentence naming the holder when the lock is busy and we wait, or
    when we break the lock of a holder that died on this host.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        owner: str | None = None,
        ttl: float = DEFAULT_TTL,
        wait: float = 0.0,
        on_wait: Callable[[str], None] | None = None,
        heartbeat: bool = True,
        keeper: bool = True,
    ) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be > 0")
        self.transport = transport
        self.path = lock_path(transport)
        self.ttl = float(ttl)
        self.wait = max(0.0, float(wait))
        self.on_wait = on_wait or (lambda _message: None)
        self.heartbeat = heartbeat
        self.keeper = keeper  # keep ``lock keep`` running on the device while held (see the module's docstring)
        self.info = holder_info(owner)
        self.held = False
        self.broke: dict | None = None  # the stale lock this one replaced, if any
        self.broke_why = ""  # why it was stale
        self.ended: list[dict] = []  # the processes of its job that were ended first
        self._keeper: Any = None  # the Conversation running ``lock keep`` while the lock is held
        self._lost = threading.Event()
        self.lost_to: dict | None = None  # who held the device when we found our lock gone
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._mutex = threading.Lock()  # the heartbeat and release never talk to the device at once

    @property
    def token(self) -> str:
        return self.info["token"]

    @property
    def lost(self) -> bool:
        """True once the device showed that our lock is gone (another job broke or removed it)."""
        return self._lost.is_set()

    def acquire(self) -> None:
        """Take the lock, waiting up to ``wait`` seconds; DeviceError naming the holder if not."""
        deadline = time.monotonic() + self.wait
        delay = 0.05
        told = False
        while True:
            doc = run_lock_op(self.transport, "acquire", json.dumps(self.info), repr(self.ttl))
            if doc.get("acquired"):
                self.held = True
                if doc.get("broke"):
                    self.broke, self.broke_why = doc["broke"], str(doc.get("why") or "")
                    self.ended = [e for e in doc.get("ended") or [] if isinstance(e, dict)]
                    self.on_wait(f"broke the stale lock on {self.transport.name} held by {describe_holder(doc['broke'])}"
                                 + (f": {self.broke_why}" if self.broke_why else "") + _ended_text(self.ended))
                if self.keeper:
                    self._start_keeper()
                self.transport.lock_args = ("--lock", self.path, self.token)  # the agent's work joins the job
                if self.heartbeat:
                    self._beat = threading.Thread(target=self._heartbeat, name=f"edgekit-lock-{self.transport.name}", daemon=True)
                    self._beat.start()
                return
            holder = doc.get("holder")
            if _died_here(holder):
                broken = run_lock_op(self.transport, "break", holder["token"])
                if broken.get("done"):
                    self.broke, self.broke_why = holder, "its process on this host is gone"
                    self.ended = [e for e in broken.get("ended") or [] if isinstance(e, dict)]
                    self.on_wait(f"broke the lock on {self.transport.name} held by {describe_holder(holder)}: that process on this host is gone"
                                 + _ended_text(self.ended))
                    continue
            left = deadline - time.monotonic()
            if left <= 0:
                waited = f"; waited {self.wait:g}s" if self.wait else ""
                raise DeviceError(
                    f"device {self.transport.name} is locked by {describe_holder(holder, doc.get('now'))}{waited}",
                    "wait for that job to finish or queue behind it with --lock-wait SECONDS; the lock of a job "
                    f"that died expires by itself (TTL {(holder or {}).get('ttl', self.ttl):g}s), or remove it: "
                    "edgekit devices unlock DEVICE",
                )
            if not told:
                self.on_wait(f"{self.transport.name} is locked by {describe_holder(holder, doc.get('now'))}; waiting up to {self.wait:g}s")
                told = True
            time.sleep(min(delay, left))  # polling a remote condition; each poll is one command
            delay = min(delay * 1.5, 2.0)

    def _start_keeper(self) -> None:
        """Start the lock's keeper on the device (where the transport keeps processes open); without
        one, a dead holder's lock is freed by its TTL alone."""
        try:
            keeper = self.transport.converse([self.transport.python, "-S", push_agent(self.transport), "lock", "keep", self.path, self.token])
            answer, _ = keeper.ask(b"{}", timeout=60) if keeper is not None else (None, b"")
        except (DeviceError, OSError):  # TransportError included: the TTL still frees a dead holder's lock
            return
        if keeper is not None and answer is not None and b'"keeping": true' in answer:
            self._keeper = keeper
        elif keeper is not None:
            keeper.close()

    def record(self) -> dict | None:
        """What the runs measured under this lock keep about it: the stale lock it broke (whose,
        why) and the processes of that job it ended first; None when it broke none."""
        if not self.broke:
            return None
        return {"broke": describe_holder(self.broke), "why": self.broke_why, "ended": self.ended}

    def refresh(self, *, serve: bool = False) -> bool:
        """Push the expiry ``ttl`` seconds ahead; False when the lock is no longer ours (then it is lost).
        ``serve``: the caller is the thread that owns the connection's agent server (not the heartbeat)."""
        with self._mutex:
            if not self.held:
                return False
            doc = run_lock_op(self.transport, "refresh", self.token, repr(self.ttl), serve=serve)
            if not doc.get("done"):
                self._mark_lost(doc.get("holder"))
            return self.held

    def ensure_held(self) -> None:
        """Raise LockLostError unless the device still carries our lock (one device round trip).

        Call it before storing anything measured under the lock: a record measured while another
        job also had the board is worthless.
        """
        if not self.lost:
            if not self.held:
                raise DeviceError(f"the lock on {self.transport.name} is not held", "take it first (device_lock)")
            self.refresh(serve=True)
        if self.lost:
            now = f"it is now held by {describe_holder(self.lost_to)}" if self.lost_to else "it was removed"
            raise LockLostError(
                f"lost the lock on device {self.transport.name} ({now}); results measured since are not stored",
                f"this job could not refresh it for longer than its TTL ({self.ttl:g}s): a stalled link or a "
                "suspended host; run again",
            )

    def _mark_lost(self, holder: dict | None) -> None:
        self.held = False
        self.lost_to = holder
        self._lost.set()

    def release(self) -> bool:
        """Give the lock up; False when it was no longer ours (it expired and was broken)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        self.transport.lock_args = ()
        try:
            with self._mutex:
                if not self.held:
                    return False
                self.held = False
                doc = run_lock_op(self.transport, "release", self.token)  # never removes the lock of whoever broke ours
                if not doc.get("done"):
                    self._mark_lost(doc.get("holder"))
                return bool(doc.get("done"))
        finally:
            if self._keeper is not None:  # after the release: its EOF then finds the lock gone
                self._keeper.close()
                self._keeper = None

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self.refresh():
                    return
            except Exception:  # noqa: BLE001 - a failed beat is retried; the work itself reports the outage
                continue

    def __enter__(self) -> DeviceLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.release()
        except Exception:
            if exc[0] is None:
                raise  # a failed release after a failure would hide the real error
        if exc[0] is None and self.lost:
            self.ensure_held()  # the block finished without the lock: exit 4, not 0


# ``with device_lock(transport, wait=..., on_wait=...) as lock:`` holds the lock for the block.
device_lock = DeviceLock


def lock_status(transport: Transport) -> dict[str, Any]:
    """``{"locked": bool, "stale": bool, "holder": dict|None, "now": device time}``."""
    return run_lock_op(transport, "status")


def break_lock(transport: Transport) -> dict | None:
    """Remove the device's lock whoever holds it; the holder it had (None: it was not locked)."""
    doc = run_lock_op(transport, "break", "")
    return doc.get("holder") if doc.get("done") else None


def run_lock_op(transport: Transport, op: str, *args: str, serve: bool = True) -> dict[str, Any]:
    """Run one lock operation on the device; its JSON answer, or DeviceError saying why not.
    ``serve``: through the connection's agent server if one runs (not from another thread)."""
    doc, result = agent_call(transport, ["lock", op, lock_path(transport), *args], timeout=60, serve=serve)
    if doc is None or "error" in doc:
        tail = str(doc["error"]) if doc else result.stderr_tail(3)
        raise DeviceError(
            f"cannot {op} the device lock at {lock_path(transport)} on {transport.name}"
            + (f": {tail}" if tail else f" (exit code {result.returncode})"),
            f"check that {transport.python} runs on the device and that its workdir is writable",
        )
    return doc


def _ended_text(ended: list[dict]) -> str:
    if not ended:
        return ""
    names = ", ".join(f"{e.get('name')} (pid {e.get('pid')})" for e in ended[:4]) + (f" and {len(ended) - 4} more" if len(ended) > 4 else "")
    stuck = [e for e in ended if e.get("gone") is False]
    return f"; ended {len(ended)} process(es) of that job first: {names}" + (f"; {len(stuck)} would not die" if stuck else "")


def _process_instance(pid: int) -> str:
    """Who process ``pid`` is on this host: boot, PID namespace, PID and start time ("" if unknown).

    Equal strings mean the same live process; a PID reused after a reboot, in another namespace
    or by a later process gives a different one. Zombies count as gone.
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink("/proc/self/ns/pid")
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        own_proc = os.readlink("/proc/self") == str(os.getpid())  # else /proc shows another namespace
    except (OSError, ValueError):
        return ""
    if not boot or not own_proc or len(fields) < 20 or fields[0] in ("Z", "X"):
        return ""
    return f"{boot}/{pidns}/{pid}/{fields[19]}"


def _died_here(holder: dict | None) -> bool:
    """The holder's process ran on this host (same boot and PID namespace) and is gone."""
    if not holder or not isinstance(holder.get("token"), str) or not isinstance(holder.get("pid"), int):
        return False
    theirs, ours = str(holder.get("instance") or ""), _process_instance(os.getpid())
    if not theirs or not ours or theirs.rsplit("/", 2)[0] != ours.rsplit("/", 2)[0]:
        return False  # another host, or no way to tell: only the TTL can free it
    return _process_instance(holder["pid"]) != theirs


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return str(os.getuid())
