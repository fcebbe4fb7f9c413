"""Latency statistics, derived in one place from the raw per-iteration samples.

The device sends raw samples in nanoseconds; everything a table, a report or a regression
gate shows is computed here, on the host, so two tools can never disagree about a p99.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgekit.jsonable import FieldsDict

STAT_FIELDS = ("min", "p50", "p90", "p99", "max", "mean", "stddev")  # all in milliseconds
_PERCENTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
_NS_PER_MS = 1e6


@dataclass(frozen=True)
class Stats(FieldsDict):
    """Summary of one run. Latencies in milliseconds, throughput in inferences per second."""

    n: int
    min: float
    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    stddev: float
    throughput: float

    @classmethod
    def of_record(cls, record: dict) -> Stats:
        """The statistics of a stored record's raw samples."""
        return cls.from_samples(record["agent"]["samples_ns"], record["agent"]["config"]["batch"])

    @classmethod
    def from_samples(cls, samples_ns: Sequence[int], batch: int = 1) -> Stats:
        """Summarise per-iteration latencies (ns) of ``batch`` inferences each.

        Percentiles interpolate linearly between closest ranks (numpy's default method),
        computed on the nanosecond values and then scaled; stddev is the sample standard
        deviation (n - 1), 0.0 for a single sample.
        """
        if len(samples_ns) == 0:
            raise ValueError("no samples: statistics need at least one latency sample")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        ns = np.asarray(samples_ns, dtype=np.float64)
        pct = {
            name: float(np.percentile(ns, q, method="linear")) / _NS_PER_MS
            for name, q in _PERCENTILES.items()
        }
        mean = float(np.mean(ns)) / _NS_PER_MS
        stddev = float(np.std(ns, ddof=1)) / _NS_PER_MS if ns.size > 1 else 0.0
        return cls(
            n=int(ns.size),
            min=float(ns.min()) / _NS_PER_MS,
            **pct,
            max=float(ns.max()) / _NS_PER_MS,
            mean=mean,
            stddev=stddev,
            throughput=batch * 1000.0 / mean,
        )

    def get(self, field: str) -> float:
        """The value of a stat by name (``"p50"``, ``"throughput"``...); unknown -> KeyError."""
        if field not in STAT_FIELDS and field != "throughput":
            known = ", ".join((*STAT_FIELDS, "throughput"))
            raise KeyError(f"unknown statistic {field!r}; known: {known}")
        return getattr(self, field)


@dataclass(frozen=True)
class Drift:
    """How the p50 moved from the first to the last tenth of a run (in execution order)."""

    first_p50: float  # ms
    last_p50: float  # ms
    change_pct: float  # (last - first) / first, in %
    n: int  # samples in each tenth


def stat(x: Sequence[float] | np.ndarray, q: float | None, axis: int | None = None) -> np.ndarray:
    """Percentile ``q`` of ``x`` (None: the mean), along ``axis``."""
    return np.mean(x, axis=axis) if q is None else np.percentile(x, q, axis=axis)


def drift(samples_ns: Sequence[int], fraction: float = 0.1, min_samples: int = 5) -> Drift | None:
    """The p50 of the first and the last ``fraction`` of a timed run and their change in %;
    None when a tenth would hold fewer than ``min_samples`` (a sustained run: ``--duration``)."""
    k = int(len(samples_ns) * fraction)
    if k < min_samples:
        return None
    ns = np.asarray(samples_ns, dtype=np.float64)
    first, last = float(np.median(ns[:k])), float(np.median(ns[-k:]))
    return Drift(first / _NS_PER_MS, last / _NS_PER_MS, (last - first) / first * 100.0, k)
