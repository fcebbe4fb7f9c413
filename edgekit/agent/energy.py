"""Energy over the timed loop, where the device exposes it (stdlib only; sysfs under facts.sysfs).

Sources, first found wins:

* ``rapl``: Intel RAPL through powercap, ``intel-rapl:N/energy_uj`` of each package (a µJ counter
  that wraps at ``max_energy_range_uj``). Often root-only since CVE-2020-8694: unreadable is absent.
* ``jetson-ina3221``: the Jetson's INA3221 monitor through hwmon (``name`` = ina3221): rail volts
  ``inN_input`` (mV) times amps ``currN_input`` (mA) = µW; the board input rail (VDD_IN, POM_5V_IN)
  when labelled, else the sum of the rails.
* ``hwmon``: the first hwmon device with ``powerN_input`` sensors (µW), summed.

A ``Meter`` samples its source every ``PERIOD_S`` in a thread with CLOCK_MONOTONIC timestamps
(``time.monotonic_ns``, the clock ekrt's runner stamps its timed loop with), so the energy of any
window inside the sampled span can be worked out afterwards: a counter is interpolated at the
window's ends, a power is integrated (trapezoids). No source: ``open_meter`` returns None and no
thread starts.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time

from .facts import _listdir, _number, _read, sysfs

PERIOD_S = 0.01
_RAPL = "sys/class/powercap"
_HWMON = "sys/class/hwmon"
_INA_INPUT_RAILS = ("VDD_IN", "POM_5V_IN")


class Meter:
    """Samples of one source: ``counter`` (cumulative µJ per channel) or ``power`` (µW, summed)."""

    def __init__(self, source: str, kind: str, read, wraps=None) -> None:
        self.source = source
        self.kind = kind
        self._read = read
        self._wraps = wraps  # counter: each channel's range (µJ) at which it starts again from 0
        self.samples = []  # (monotonic ns, value) in time order
        self._stop = threading.Event()
        self._thread = None

    def sample(self) -> None:
        value = self._read()
        if value is not None:
            self.samples.append((time.monotonic_ns(), value))

    def start(self) -> None:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="edgekit-energy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(PERIOD_S):
            self.sample()

    def joules(self, start_ns: int, end_ns: int):
        """Energy (J) between two monotonic times inside the sampled span; None when not covered."""
        if len(self.samples) < 2 or end_ns <= start_ns:
            return None
        times = [t for t, _ in self.samples]
        if start_ns < times[0] or end_ns > times[-1]:
            return None
        if self.kind == "counter":
            series = unwrap(self.samples, self._wraps)
            return (_interp(times, series, end_ns) - _interp(times, series, start_ns)) / 1e6
        return integrate_power([(t, float(v)) for t, v in self.samples], start_ns, end_ns) / 1e6


def unwrap(samples: list, wraps: list) -> list:
    """Total µJ at each sample from per-channel counters that wrap at ``wraps`` (each read apart by
    less than one wrap, which at 10 ms is always true)."""
    totals = []
    offset = [0] * len(wraps)
    last = None
    for _, values in samples:
        if last is not None:
            for i, (old, new) in enumerate(zip(last, values)):
                if new < old:
                    offset[i] += wraps[i]
        last = values
        totals.append(float(sum(v + o for v, o in zip(values, offset))))
    return totals


def integrate_power(samples: list, start_ns: int, end_ns: int) -> float:
    """µJ of (ns, µW) samples between two times: trapezoids, ends interpolated."""
    times = [t for t, _ in samples]
    values = [v for _, v in samples]
    points = [(start_ns, _interp(times, values, start_ns))]
    points += [(t, v) for t, v in samples if start_ns < t < end_ns]
    points.append((end_ns, _interp(times, values, end_ns)))
    return sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(points, points[1:])) / 1e9


def _interp(times: list, values: list, t: int) -> float:
    i = bisect.bisect_left(times, t)
    if i < len(times) and times[i] == t:
        return values[i]
    if i == 0:
        return values[0]
    if i == len(times):
        return values[-1]
    t0, t1 = times[i - 1], times[i]
    return values[i - 1] + (values[i] - values[i - 1]) * (t - t0) / (t1 - t0)


def open_meter():
    """A Meter for the first readable source here, not started; None when the device has none."""
    for find in (_rapl, _ina3221, _hwmon_power):
        meter = find()
        if meter is not None and meter._read() is not None:
            return meter
    return None


def _rapl():
    domains = [os.path.join(sysfs(_RAPL), n) for n in _listdir(sysfs(_RAPL)) if re.match(r"intel-rapl:\d+$", n)]
    # the package domains; "psys" (the whole platform) would count the packages twice
    named = [(d, (_text(os.path.join(d, "name")) or "")) for d in domains]
    packages = [d for d, name in named if name.startswith("package")] or [d for d, name in named if name != "psys"]
    wraps = [_number(os.path.join(d, "max_energy_range_uj")) for d in packages]
    if not packages or None in wraps:
        return None
    files = [os.path.join(d, "energy_uj") for d in packages]

    def read():
        values = [_number(f) for f in files]
        return None if None in values else tuple(values)

    return Meter("rapl", "counter", read, wraps)


def _ina3221():
    for dev in _hwmon_devices():
        if _text(os.path.join(dev, "name")) != "ina3221":
            continue
        channels = sorted({m.group(1) for m in (re.match(r"curr(\d+)_input$", n) for n in _listdir(dev)) if m})
        pairs = [(c, _text(os.path.join(dev, f"in{c}_label"))) for c in channels if os.path.exists(os.path.join(dev, f"in{c}_input"))]
        board = [c for c, label in pairs if label in _INA_INPUT_RAILS]
        use = board or [c for c, _ in pairs]
        if not use:
            continue
        files = [(os.path.join(dev, f"in{c}_input"), os.path.join(dev, f"curr{c}_input")) for c in use]

        def read(files=files):
            total = 0
            for volts, amps in files:
                mv, ma = _number(volts), _number(amps)
                if mv is None or ma is None:
                    return None
                total += mv * ma  # mV x mA = µW
            return total

        return Meter("jetson-ina3221", "power", read)
    return None


def _hwmon_power():
    for dev in _hwmon_devices():
        if _text(os.path.join(dev, "name")) == "ina3221":
            continue
        files = [os.path.join(dev, n) for n in _listdir(dev) if re.match(r"power\d+_input$", n)]
        if files:

            def read(files=files):
                values = [_number(f) for f in files]
                return None if None in values else sum(values)

            return Meter("hwmon", "power", read)
    return None


def _hwmon_devices() -> list:
    return [os.path.join(sysfs(_HWMON), n) for n in _listdir(sysfs(_HWMON)) if n.startswith("hwmon")]


def _text(path: str):
    text = _read(path)
    return None if text is None else text.strip()


def energy_record(meter, start_ns: int, end_ns: int, inferences: int):
    """The record's ``energy`` for the timed loop ``[start_ns, end_ns]`` of ``inferences``; None
    without a meter or a covered window."""
    joules = meter.joules(start_ns, end_ns) if meter is not None else None
    if joules is None or inferences < 1 or joules < 0:
        return None
    return {"source": meter.source, "joules": round(joules, 6), "mj_per_inference": round(joules * 1000.0 / inferences, 6)}
