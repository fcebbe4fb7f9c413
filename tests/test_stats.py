from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from edgekit.bench.stats import STAT_FIELDS, Stats


@pytest.mark.parametrize("n", [2, 3, 10, 101, 1000, 20_011])
def test_matches_numpy_on_random_samples(n):
    rng = np.random.default_rng(n)
    # Long-tailed, like real latencies: a lognormal body around 5 ms plus a few outliers.
    samples = [int(x) for x in rng.lognormal(mean=np.log(5e6), sigma=0.3, size=n)]
    samples[: max(1, n // 100)] = [int(40e6)] * max(1, n // 100)
    s = Stats.from_samples(samples)
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert s.get(name) == np.percentile(samples, q, method="linear") / 1e6
    assert s.min == min(samples) / 1e6
    assert s.max == max(samples) / 1e6
    assert s.mean == pytest.approx(np.mean(samples) / 1e6, rel=1e-12)
    assert s.stddev == pytest.approx(np.std(samples, ddof=1) / 1e6, rel=1e-12)
    assert s.n == n
    assert s.throughput == pytest.approx(1000.0 / s.mean, rel=1e-15)
    assert s.min <= s.p50 <= s.p90 <= s.p99 <= s.max


def test_small_case_by_hand():
    # 1, 2, 3, 4 ms: linear interpolation between closest ranks, sample stddev.
    s = Stats.from_samples([1_000_000, 2_000_000, 3_000_000, 4_000_000])
    assert s.p50 == pytest.approx(2.5)
    assert s.p90 == pytest.approx(3.7)  # rank 0.9 * 3 = 2.7 -> 3 + 0.7 * (4 - 3)
    assert s.p99 == pytest.approx(3.97)
    assert s.mean == pytest.approx(2.5)
    assert s.stddev == pytest.approx(math.sqrt(5 / 3))
    assert s.throughput == pytest.approx(400.0)


def test_order_of_samples_does_not_matter():
    samples = [9_000, 1_000, 5_000, 3_000, 7_000]
    assert Stats.from_samples(samples) == Stats.from_samples(sorted(samples))


def test_single_sample():
    s = Stats.from_samples([2_500_000])
    assert s.n == 1
    assert s.stddev == 0.0
    assert {s.get(f) for f in STAT_FIELDS if f != "stddev"} == {2.5}
    assert s.throughput == pytest.approx(400.0)


def test_batch_scales_throughput_not_latency():
    samples = [2_000_000] * 10
    one, four = Stats.from_samples(samples), Stats.from_samples(samples, batch=4)
    assert one.throughput == pytest.approx(500.0)
    assert four.throughput == pytest.approx(2000.0)
    assert four.p50 == one.p50 == 2.0


def test_empty_samples_rejected():
    with pytest.raises(ValueError, match="no samples"):
        Stats.from_samples([])


def test_batch_below_one_rejected():
    with pytest.raises(ValueError, match="batch"):
        Stats.from_samples([1_000], batch=0)


def test_get_and_to_dict():
    s = Stats.from_samples([1_000_000, 3_000_000])
    assert s.get("throughput") == s.throughput
    with pytest.raises(KeyError, match="p95"):
        s.get("p95")
    with pytest.raises(KeyError):
        s.get("n")  # a count, not a statistic a gate can compare
    d = s.to_dict()
    assert list(d) == ["n", *STAT_FIELDS, "throughput"]
    assert d["p50"] == s.p50 == 2.0
    assert all(isinstance(d[f], float) for f in (*STAT_FIELDS, "throughput"))
    assert isinstance(d["n"], int)


def test_frozen():
    s = Stats.from_samples([1_000])
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.p50 = 0.0  # type: ignore[misc]
