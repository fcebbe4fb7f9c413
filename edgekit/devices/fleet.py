"""Run the same work on many devices at once: bounded concurrency, one outcome per device.

``run_fleet(items, fn, jobs=4)`` calls ``fn(item)`` in a thread pool. A device that fails
(an EdgekitError or any other exception) becomes a failed outcome with its message, hint and
exit code; the others carry on. Ctrl-C stops the devices that have not started yet and marks
the running ones "interrupted" without waiting for them (their connections are closed by the
callers' ``finally`` blocks as they unwind; a command already running on a device finishes there).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from edgekit.errors import EXIT_INTERNAL, EdgekitError

T = TypeVar("T")
R = TypeVar("R")

OK, FAILED, INTERRUPTED, CANCELLED = "ok", "failed", "interrupted", "cancelled"
EXIT_INTERRUPTED = 130
DEFAULT_JOBS = 4


@dataclass
class DeviceOutcome(Generic[R]):
    device: str
    status: str  # ok | failed | interrupted (was running at Ctrl-C) | cancelled (never started)
    value: R | None = None
    error: str | None = None
    hint: str | None = None
    exit_code: int = 0
    duration_s: float = 0.0
    traceback: str | None = None  # for a non-edgekit exception (a bug), shown with EDGEKIT_DEBUG=1
    unreachable: bool = False  # the device could not be reached at all (Ansible's "unreachable")

    @property
    def succeeded(self) -> bool:
        return self.status == OK

    @property
    def failed(self) -> bool:
        return not self.succeeded

    def to_dict(self, value: Callable[[Any], Any] | None = None) -> dict[str, Any]:
        v = self.value
        if v is not None:
            v = value(v) if value else (v.to_dict() if hasattr(v, "to_dict") else v)
        return {
            "device": self.device,
            "status": self.status,
            "exit_code": self.exit_code,
            "error": self.error,
            "hint": self.hint,
            "duration_s": round(self.duration_s, 3),
            "result": v,
        }


@dataclass
class FleetResult(Generic[R]):
    outcomes: list[DeviceOutcome[R]] = field(default_factory=list)
    interrupted: bool = False

    @property
    def succeeded(self) -> list[DeviceOutcome[R]]:
        return [o for o in self.outcomes if o.succeeded]

    @property
    def failed(self) -> list[DeviceOutcome[R]]:
        return [o for o in self.outcomes if o.failed]

    @property
    def ok(self) -> bool:
        return not self.interrupted and not self.failed

    @property
    def exit_code(self) -> int:
        """0 when every device passed; 130 after Ctrl-C; else the first failed device's code."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        return next((o.exit_code for o in self.outcomes if o.failed), 0)

    def summary(self) -> str:
        text = f"{len(self.succeeded)} of {len(self.outcomes)} device(s) passed"
        if self.failed:
            text += "; failed: " + ", ".join(o.device for o in self.failed)
        return text + (" (interrupted)" if self.interrupted else "")


def run_fleet(
    items: Iterable[T],
    fn: Callable[[T], R],
    *,
    jobs: int = DEFAULT_JOBS,
    name: Callable[[T], str] = str,
    on_done: Callable[[DeviceOutcome[R]], None] | None = None,
) -> FleetResult[R]:
    """``fn(item)`` for every item, at most ``jobs`` at a time; outcomes in the items' order.

    ``on_done`` is called (in the calling thread) as each device finishes.
    """
    items = list(items)
    if jobs < 1:
        raise ValueError("jobs must be >= 1")
    names = [name(i) for i in items]
    outcomes: list[DeviceOutcome[R] | None] = [None] * len(items)
    started: dict[int, float] = {}  # each worker sets its own key (atomic); read after Ctrl-C

    def call(index: int) -> DeviceOutcome[R]:
        t0 = started[index] = time.monotonic()
        try:
            value = fn(items[index])
        except EdgekitError as exc:
            return DeviceOutcome(names[index], FAILED, None, exc.message, exc.hint or None, exc.exit_code, time.monotonic() - t0)
        except Exception as exc:  # a bug on one device must not stop the fleet; say it like the CLI does
            return DeviceOutcome(
                names[index], FAILED, None, f"internal error: {type(exc).__name__}: {exc}",
                "this is a bug in edgekit; rerun with EDGEKIT_DEBUG=1 and report the traceback",
                EXIT_INTERNAL, time.monotonic() - t0, traceback.format_exc(),
            )  # fmt: skip
        return DeviceOutcome(names[index], OK, value, duration_s=time.monotonic() - t0)

    result: FleetResult[R] = FleetResult()
    pool = ThreadPoolExecutor(max_workers=min(jobs, max(1, len(items))), thread_name_prefix="edgekit-fleet")
    futures: dict[Future, int] = {}
    try:
        futures = {pool.submit(call, i): i for i in range(len(items))}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: futures[f]):
                outcome = fut.result()
                outcomes[futures[fut]] = outcome
                if on_done is not None:
                    on_done(outcome)
    except KeyboardInterrupt:
        result.interrupted = True
        for fut in futures:
            fut.cancel()
        now = time.monotonic()
        for fut, i in futures.items():
            if outcomes[i] is None:
                if fut.done() and not fut.cancelled():
                    outcomes[i] = fut.result()
                elif i in started:
                    outcomes[i] = DeviceOutcome(names[i], INTERRUPTED, error="interrupted (Ctrl-C) while running", exit_code=EXIT_INTERRUPTED, duration_s=now - started[i])
                else:
                    outcomes[i] = DeviceOutcome(names[i], CANCELLED, error="not started: interrupted (Ctrl-C)", exit_code=EXIT_INTERRUPTED)
    finally:
        pool.shutdown(wait=not result.interrupted, cancel_futures=True)
    result.outcomes = [o for o in outcomes if o is not None]
    return result


def workers_alive() -> bool:
    """True while a fleet worker thread still runs (after Ctrl-C: a device still busy)."""
    return any(t.name.startswith("edgekit-fleet") and t.is_alive() for t in threading.enumerate())


def exit_now(code: int) -> None:
    """Exit at once, not waiting for worker threads still talking to devices (after Ctrl-C)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def safe_name(device: str) -> str:
    """A device name as one path component (for per-device output directories)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", device).strip("._") or "device"
