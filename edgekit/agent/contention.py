"""Other work on the device during a timed window, from /proc (Linux; stdlib only).

A run timed while another process kept the CPU busy (a bench left over from a killed job, a
compile, a CPU hog) is slower for a reason that is not the model's. The agent reads every
process's CPU time (``/proc/[pid]/stat``: utime + stime, in clock ticks) just before a timed
window and just after it (never inside it), and reports how much of a core the processes that
are not the bench's used meanwhile (``contention``). The bench's are the agent, its descendants
(ekrt's runner, a runtime's workers) and its ancestors (the ssh session, the host's edgekit on
a local device); kernel threads are ignored.

What a pair of snapshots can see: a process alive at both ends (its own CPU, plus ``cutime`` +
``cstime``: the children it reaped meanwhile, so a ``make`` running short compiler processes
counts), a process that started in the window (all its CPU). One that ended in the window, and
was reaped by no process counted here, is not seen. Only this PID namespace is visible. The
total is never more than /proc/stat says the whole machine was busy beyond the bench's own
processes: a process that ended and was reaped by a subreaper, not its parent, brings its whole
life's ticks to it.

The judgement (``contended``): the bench's threads need that many cores, and what a quiet system
runs anyway (the agent's bookkeeping, interrupts, the ssh session) one more; work beyond that has
nowhere to go but the bench's cores. Other work is contention when it takes at least
``CONTENDED_SHARE`` of a core out of that spare one: ``other_cpu >= CONTENDED_SHARE + max(0,
cores - threads - 1)`` (``limit``). On a 2-core board timing one thread, or any board timing all
its cores, the limit is 0.25 of a core; on an 8-core one timing one thread, 6.25 cores (work on
idle cores still shares caches, memory bandwidth and clocks; the loop of ``speed`` sees that,
this does not). The quarter is a choice, not a measured break-even: well above an idle system's
daemons, well below the core a single hog takes. Ticks are 10 ms (USER_HZ 100): a verdict needs
``MIN_TICKS`` of other work, so a window too short to show ``limit`` in that many ticks is
neither contended nor clean (None) unless it shows contention anyway.
"""

from __future__ import annotations

import os
import time

CONTENDED_SHARE = 0.25  # of a core, beyond the cores the bench leaves idle (the module's docstring)
MIN_TICKS = 3  # of other work before a window is called contended: 30 ms at USER_HZ 100
TOP = 3  # processes named in the record
_PROC = "/proc"


def snapshot():
    """Every process's CPU time now: ``{"ns": monotonic ns, "busy": the machine's busy ticks or
    None, "procs": {(pid, start): (ppid, ticks, reaped ticks, name)}}``; None where /proc does not
    show this process (not Linux)."""
    try:
        names = os.listdir(_PROC)
    except OSError:
        return None
    t0 = time.monotonic_ns()
    busy = _busy_ticks()
    procs = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(_PROC + "/" + name + "/stat", "rb") as fh:
                data = fh.read()
        except OSError:  # ended since the listing, or not ours to read
            continue
        entry = _parse_stat(data)
        if entry is not None:
            procs[(int(name), entry[0])] = entry[1:]
    t1 = time.monotonic_ns()
    if not any(pid == os.getpid() for pid, _ in procs):
        return None
    return {"ns": (t0 + t1) // 2, "busy": busy, "procs": procs}


def _busy_ticks():
    """All CPUs' busy ticks since boot from /proc/stat (user, nice, system, irq, softirq and
    steal, which a process's own times include too), or None."""
    try:
        with open(_PROC + "/stat", "rb") as fh:
            fields = fh.readline().split()
        return sum(int(fields[i]) for i in (1, 2, 3, 6, 7, 8))
    except (OSError, ValueError, IndexError):
        return None


def _parse_stat(data: bytes):
    """(start time, ppid, utime + stime, cutime + cstime, comm) from a /proc/[pid]/stat, or None."""
    text = data.decode("utf-8", "replace")
    open_, close = text.find("("), text.rfind(")")  # comm may hold spaces and parentheses
    fields = text[close + 2 :].split()
    if open_ < 0 or close < open_ or len(fields) < 20:
        return None
    try:
        # fields from the 3rd (state): ppid is the 4th, utime..cstime the 14th-17th, starttime the 22nd
        ppid, utime, stime, cutime, cstime, start = (int(fields[i]) for i in (1, 11, 12, 13, 14, 19))
    except ValueError:
        return None
    return start, ppid, utime + stime, max(0, cutime + cstime), text[open_ + 1 : close]


def contention(before, after, threads, span: str):
    """The bench document's ``contention`` from two ``snapshot``s around a timed window: ``{span,
    window_s, other_cpu, limit, contended, top}`` (``other_cpu``: cores' worth used by processes
    not the bench's; ``top``: the busiest of them, ``{pid, name, cpu}``). ``threads``: the
    bench's inference threads (None: all cores). None when either snapshot is."""
    if before is None or after is None:
        return None
    try:
        tck = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return None
    window_s = (after["ns"] - before["ns"]) / 1e9
    if tck <= 0 or window_s <= 0:
        return None
    ticks, mine = ticks_used(before["procs"], after["procs"], os.getpid())
    cores = os.cpu_count() or 1
    limit = CONTENDED_SHARE + max(0, cores - (threads or cores) - 1)
    total = sum(t for t, _, _ in ticks)
    if before.get("busy") is not None and after.get("busy") is not None:
        # never more than the machine as a whole was busy beyond the bench's own processes: a
        # process that ended in the window and was reaped by one that had not been its parent
        # (a subreaper) brings its whole lifetime's ticks with it
        total = min(total, max(0, after["busy"] - before["busy"] - mine))
    other = total / tck / window_s
    if total >= MIN_TICKS and other >= limit:
        contended = True
    elif limit * window_s * tck < MIN_TICKS:
        contended = None  # too short to show work at the limit in MIN_TICKS ticks
    else:
        contended = False
    top = sorted(ticks, key=lambda x: (-x[0], x[1]))[:TOP]
    return {
        "span": span,
        "window_s": round(window_s, 4),
        "other_cpu": round(other, 3),
        "limit": limit,
        "contended": contended,
        "top": [{"pid": pid, "name": name, "cpu": round(t / tck / window_s, 3)} for t, pid, name in top],
    }


def ticks_used(before: dict, after: dict, me: int) -> tuple:
    """(others, mine): (ticks, pid, name) of every process in ``after`` that used CPU since
    ``before`` and is neither ``me``, one of its descendants or ancestors, nor a kernel thread; and
    the ticks that ``me``, its descendants and ancestors used."""
    parent = {pid: v[0] for (pid, _), v in before.items()}
    parent.update((pid, v[0]) for (pid, _), v in after.items())
    ancestors = set(_chain(me, parent))

    def ours(pid: int) -> bool:
        return me in _chain(pid, parent)

    # A process that ended in the window adds its whole lifetime's ticks (and its reaped children's)
    # to its parent's reaped ticks, and the parent, if it ends too, to its own parent's: the
    # nearest ancestor alive at both ends carries them, and what they had used before the window
    # is not work in it.
    keys = {key[0]: key for key in before}

    def survivor(pid: int) -> int:
        seen = set()
        while pid > 0 and pid not in seen and pid in keys:
            if keys[pid] in after:
                return pid
            seen.add(pid)
            pid = before[keys[pid]][0]
        return 0

    ended = {}
    for key, (ppid, used, reaped, _) in before.items():
        if key not in after:
            carrier = survivor(ppid)
            ended[carrier] = ended.get(carrier, 0) + used + reaped
    out, mine = [], 0
    for key, (ppid, used, reaped, name) in after.items():
        pid = key[0]
        if pid == 2 or ppid == 2:
            continue
        was = before.get(key)
        if was is None:  # started in the window: all of it
            t = used + reaped
        else:
            t = max(0, used - was[1]) + max(0, reaped - was[2] - ended.get(pid, 0))
        if pid in ancestors or ours(pid):
            mine += t
        elif t > 0:
            out.append((t, pid, name))
    return out, mine


def _chain(pid: int, parent: dict) -> list:
    """``pid`` and its ancestors, as far as ``parent`` knows them."""
    out = []
    while pid > 0 and pid not in out:
        out.append(pid)
        pid = parent.get(pid, 0)
    return out
