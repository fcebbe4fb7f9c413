"""The device's own speed while a variant is timed.

A shared machine slows down as a whole for a while (a neighbour VM, the host's clocks) with no
sign in load, steal time or cpufreq. On the 2-core CI VM the digits model ran at 45 us instead of
25 us at p50 for stretches of 0.3-20 s, and this module's loop at 8.6 us instead of 5.0 us with
it (a 64x64 numpy matmul at 12.1 instead of 8.1 us). Back-to-back runs of one build then differ by
40 %. The agent times a fixed loop through each timed window: two runs whose loops differ were
timed on a machine running at different speeds (``edgekit.bench.compare.machine_shift``).

Where the agent times the runtime itself (ONNX Runtime, OpenVINO, LiteRT), it runs a burst of
the loop between two inferences every ``EVERY_NS`` and records the median burst. A runtime that
times itself in another process (ekrt's runner, trtexec) has no probe yet. What was tried for
those and dropped:

- the same bursts in C inside ekrt's runner, with a loop of look-ups in a 4 KB table: it stayed
  at 4.4-4.7 us while the int8 digits model went from 13 to 21 us and back; with a pointer
  chase through 256 KB instead it moved with the model (9.5-11.9 us in slow runs) but spread
  7.8-9.7 us between calm ones, which would have blunted every gate on ekrt's runs;
- a thread bursting alongside the runtime: each burst after a sleep ran on a cold core, at
  10-12 us with a +-10 % spread on an idle VM;
- spinning the loop for 50 ms before and after the runtime's process: that process loads the
  model and warms up (up to 2 s) before its window, so the spins time other moments. On the
  CI VM one deploy's spins differed by 44 % between its fp32 and int8 benches while both
  variants ran at their usual speed, and the int8 verdict was withheld for nothing.
"""

from __future__ import annotations

import time

LOOP = "python-sum-200"  # a record names the loop; only like is compared with like
EVERY_NS = 10_000_000  # a burst every 10 ms of the window: ~0.15 % of it
BURST = 3  # timings per burst; the fastest counts (the first after a pause runs on cold caches)


def _loop() -> int:
    total = 0
    for k in range(200):
        total += k
    return total


def burst() -> int:
    """The fastest of ``BURST`` timings of the loop, in ns."""
    clock = time.perf_counter_ns
    times = []
    for _ in range(BURST):
        t0 = clock()
        _loop()
        times.append(clock() - t0)
    return min(times)


class SpeedMeter:
    """The loop timed through one window: ``tick`` between inferences."""

    def __init__(self) -> None:
        self.bursts: list[int] = []
        self._next = 0

    def tick(self, now: int) -> None:
        """Between two inferences (``now``: perf_counter_ns): a burst when one is due."""
        if now >= self._next:
            self.bursts.append(burst())
            self._next = time.perf_counter_ns() + EVERY_NS

    def record(self) -> dict:
        """``{loop, ns, bursts}``: the median burst; one is timed now when none was. (The loop's
        speed depends on the Python that ran it: the document's ``device.python``.)"""
        bursts = sorted(self.bursts) or [burst()]
        return {"loop": LOOP, "ns": int(bursts[len(bursts) // 2]), "bursts": len(bursts)}
