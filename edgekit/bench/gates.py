"""Regression gates: ``p50:+5%``, ``p99:<20ms``, ``accuracy:-0.5pt``, ``rss:<64MB``, ``energy:+10%``.

A gate is ``METRIC:LIMIT``. The limit is either

* relative to a baseline run: ``+N%`` (the metric may get worse by at most N %; worse is up for
  latency, memory, energy, and down for throughput: ``throughput:-5%``), or in accuracy points
  for ``accuracy`` (``accuracy:-0.5pt``) and ``drop`` (``drop:+0.5pt``);
* absolute: ``<VALUE UNIT`` or ``>VALUE UNIT`` (also ``<=``, ``>=``).

A gate has three outcomes: ``pass``, ``fail`` and ``inconclusive`` (and ``skipped`` when there is
nothing to judge: no baseline yet, an optional metric not measured). A relative latency gate (p50,
p90, p99, mean, throughput) fails only when all of these hold (asv / benchstat practice):

* the change is beyond the limit, and so is the whole 95 % bootstrap interval of the change;
* the change is significant by the rule of ``edgekit.bench.compare`` (beyond the runs' own drift
  and what the device's own speed change between the runs can explain, ``LatencyChange``);
* when both runs were timed in several agent processes (``--rounds``), a one-sided Mann-Whitney U
  test across the rounds' statistics agrees (p <= ``ROUNDS_ALPHA``); when only one of them was
  (a deploy's single-process run as the baseline of ``edgekit ci --rounds 3``), the change is
  inconclusive: one process's speed is a draw from a spread that process cannot show.

Other processes busy on the device during a timed window (``contention``,
``edgekit.agent.contention``) only slow that run. A latency or throughput gate (relative or
absolute) whose outcome they could explain is ``inconclusive``, naming the busiest of them: a
failure of a contended run, a pass against a contended baseline (of ``p50:>1ms``-style limits on
how good a metric may be, the reverse). An outcome they could not explain (a contended run that
passes ``p99:<20ms``) stands, and its line says it held despite them.

A change beyond the limit that misses any of these, or one within the limit whose interval reaches
beyond it, is ``inconclusive`` with the reason (the interval spans the limit; the device's own speed
moved more than the change; the rounds disagree): neither a regression nor a pass can be claimed.
``edgekit ci --inconclusive fail|warn`` decides what that does to the exit code.

A metric the device did not measure (no energy sensor, no labels for accuracy) FAILS the gate
with "not measured on this device": a gate the user asked for that silently checks nothing
would be worse. ``METRIC?:LIMIT`` (e.g. ``energy?:+10%``) makes it optional: skipped when not
measured. A relative gate without a baseline run (or whose baseline lacks the metric) is
neither passed nor failed: "no baseline yet" (``passed`` is None).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from edgekit.bench.compare import (
    _energy,
    _rss,
    accuracy,
    comparable,
    default_baseline,
    latency_change,
    other_threads,
    resolve,
)
from edgekit.bench.record import contention_note, contention_reason, round_slices
from edgekit.bench.stats import stat
from edgekit.bench.store import ResultsStore
from edgekit.errors import GateError, ResultsError, UsageError
from edgekit.jsonable import FieldsDict

_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}
_BYTES = {"b": 1, "kb": 2**10, "mb": 2**20, "gb": 2**30, "kib": 2**10, "mib": 2**20, "gib": 2**30}


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str  # the unit values are kept and shown in
    units: dict[str, float]  # unit accepted in an absolute limit -> factor to ``unit``
    higher_is_better: bool
    get: Callable[[dict], float | None]
    q: float | None | bool = False  # the bootstrap statistic (percentile, None: mean); False: no samples behind it


def _stat(name: str) -> Callable[[dict], float | None]:
    return lambda r: (r.get("stats") or {}).get(name)


def _agent_ms(key: str) -> Callable[[dict], float | None]:
    return lambda r: None if r["agent"].get(key) is None else r["agent"][key] / 1e6


def _drop(record: dict) -> float | None:
    value = (record.get("agreement") or {}).get("accuracy_drop")
    return None if value is None else value * 100


_LATENCY = {name: Metric(name, "ms", _MS, False, _stat(name), q) for name, q in
            (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("mean", None), ("min", False), ("max", False))}  # fmt: skip
TIMED = frozenset({*_LATENCY, "throughput"})  # the metrics of the timed window, which other work can contend
METRICS: dict[str, Metric] = {
    **_LATENCY,
    "throughput": Metric("throughput", "/s", {"/s": 1.0, "": 1.0}, True, _stat("throughput"), None),
    "accuracy": Metric("accuracy", "%", {"%": 1.0, "pt": 1.0}, True, accuracy),
    "drop": Metric("drop", "pt", {"pt": 1.0, "%": 1.0}, False, _drop),
    "rss": Metric("rss", "B", _BYTES, False, _rss),
    "energy": Metric("energy", "mJ", {"mj": 1.0, "uj": 1e-3, "j": 1e3}, False, _energy),
    "load": Metric("load", "ms", _MS, False, _agent_ms("load_ns")),
    "first": Metric("first", "ms", _MS, False, _agent_ms("first_inference_ns")),
}
SYNTAX_HINT = (
    "write METRIC:+N% (vs baseline), METRIC:<VALUE UNIT or METRIC:>VALUE UNIT, accuracy:-0.5pt; "
    f"metrics: {', '.join(METRICS)}"
)
ROUNDS_ALPHA = 0.05  # the test across rounds must reject "no slowdown" at this level
_EXACT_MAX = 20_000  # exact Mann-Whitney distribution up to this many rank splits, else the normal approximation
_GATE = re.compile(r"^\s*(?P<metric>[A-Za-z0-9_]+)(?P<opt>\?)?\s*:\s*(?P<op><=|>=|<|>|\+|-)?\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>\S*)\s*$")


@dataclass(frozen=True)
class Gate(FieldsDict):
    """One parsed gate. ``limit`` is in ``unit``: the metric's unit for absolute gates, % or pt for relative ones."""

    text: str
    metric: str
    relative: bool
    op: str  # "<", "<=", ">", ">=" (absolute); "+" or "-" (relative: the direction that is worse)
    limit: float
    unit: str
    optional: bool = False

    def check(self, record: dict, baseline: dict | None) -> GateResult:
        """This gate on ``record`` against ``baseline`` (needed by relative gates only)."""
        m = METRICS[self.metric]
        value = m.get(record)
        if value is None:
            status = "skipped, optional" if self.optional else "FAIL"
            return self._result("skipped" if self.optional else "fail", None, None, f"{self.metric} not measured on this device ({self._limit_text()}): {status}")
        shown = f"{self.metric} {_fmt(m, value)}"
        if not self.relative:
            ok = {"<": value < self.limit, "<=": value <= self.limit, ">": value > self.limit, ">=": value >= self.limit}[self.op]
            outcome, status = _contended("pass" if ok else "fail", self._bounds_worse(), None, record, self.metric)
            return self._result(outcome, value, None, f"{shown} ({self._limit_text()}): {status}")
        old = None if baseline is None else m.get(baseline)
        if old is None:
            why = "no baseline yet" if baseline is None else f"no baseline yet (the baseline run has no {self.metric})"
            return self._result("skipped", value, None, f"{shown} ({self._limit_text()} vs a baseline): {why}")
        shown += f" vs {_fmt(m, old)}"
        sign = 1.0 if self.op == "+" else -1.0  # worse is up (+) or down (-)
        if self.unit == "pt":
            delta = value - old
            ok = sign * delta <= self.limit + 1e-9
            return self._result("pass" if ok else "fail", value, old, f"{shown} ({delta:+.2f} pt, {self._limit_text()}): {'pass' if ok else 'FAIL'}", change=delta)
        if old == 0:
            return self._result("skipped", value, old, f"{shown}: the baseline is 0, no relative change to gate on")
        change = value / old - 1
        beyond = sign * change * 100 > self.limit
        outcome, status, ci = ("fail", "FAIL", None) if beyond else ("pass", "pass", None)
        text = f"{change * 100:+.1f}%"
        if m.q is not False:  # latency: the slowdown must also stand out of the noise
            lat = latency_change(baseline["agent"], record["agent"], m.q)
            lo, hi = (lat.low, lat.high) if not m.higher_is_better else (1 / lat.high, 1 / lat.low)
            text += f", 95% CI {(lo - 1) * 100:+.1f}..{(hi - 1) * 100:+.1f}%"
            ci = (lo - 1, hi - 1)
            worse = sorted((sign * (lo - 1) * 100, sign * (hi - 1) * 100))  # the interval of how much worse
            why = _undecided(beyond, worse, self.limit, lat, baseline["agent"], record["agent"], m.q)
            if why:
                outcome, status = "inconclusive", f"inconclusive ({why})"
            elif beyond:
                status = "FAIL" + _rounds_note(baseline["agent"], record["agent"], m.q)
        if outcome != "inconclusive":
            outcome, status = _contended(outcome, True, baseline, record, self.metric, status)
        return self._result(outcome, value, old, f"{shown} ({text}, {self._limit_text()}): {status}", change=change, ci=ci)

    def _bounds_worse(self) -> bool:
        """Does the limit bound how bad the metric may get (p99:<20ms, throughput:>100/s, every
        relative gate), rather than how good?"""
        return self.relative or (self.op in ("<", "<=")) != METRICS[self.metric].higher_is_better

    def _limit_text(self) -> str:
        if self.relative:
            return f"limit {self.op}{self.limit:g}{' pt' if self.unit == 'pt' else '%'}"
        m = METRICS[self.metric]
        return f"limit {self.op} {_fmt(m, self.limit)}"

    def _result(self, outcome: str, value, baseline, line: str,
                change: float | None = None, ci: tuple[float, float] | None = None) -> GateResult:  # fmt: skip
        return GateResult(self, outcome, value, baseline, self.limit, line, change, ci)


def _undecided(beyond: bool, worse: list[float], limit: float, lat: Any, base: dict, cand: dict, q: float | None) -> str:
    """Why a latency gate can be neither passed nor failed ("" when it can be decided).
    ``worse``: the 95 % interval (in %) of how much worse the candidate is."""
    if not beyond:
        return f"the 95% CI {worse[0]:+.1f}..{worse[1]:+.1f}% spans the limit" if worse[1] > limit else ""
    if worse[0] <= limit:
        return f"the 95% CI {worse[0]:+.1f}..{worse[1]:+.1f}% spans the limit"
    if not lat.significant:
        return lat.why()
    nb, nc = len(round_slices(base)), len(round_slices(cand))
    if (nb == 1) != (nc == 1):
        # one side timed in several processes, the other in one: that one process may have been a
        # fast or a slow one (int8 digits on the 2-core CI VM: p50 7.2-13.6 us from one process
        # to the next, steady within each), and a single process shows no spread to allow for
        return (f"the baseline was timed in {nb} agent process{'es' if nb > 1 else ''} and this run in {nc}: "
                "one process's speed cannot be told from the device's process-to-process spread; "
                "gate runs timed alike (--rounds on both, as edgekit ci's own baselines are)")
    p = rounds_p_value(base, cand, q)
    if p is not None and p > ROUNDS_ALPHA:
        return f"the rounds disagree: Mann-Whitney p = {p:.2f} > {ROUNDS_ALPHA:g} across {len(round_slices(base))} + {len(round_slices(cand))} rounds"
    return ""


def _contended(outcome: str, bounds_worse: bool, base: dict | None, cand: dict, metric: str, status: str = "") -> tuple[str, str]:
    """(outcome, status) of a gate on the timed window given other work on the device in it
    (``contention``). That work only slows a run, so it can explain a failure of a slowed candidate
    and a pass against a slowed baseline (of a limit on how bad the metric may get; of one on how
    good, the reverse): those are inconclusive, naming the busiest processes. The others stand,
    saying that they held despite it."""
    status = status or {"pass": "pass", "fail": "FAIL"}[outcome]
    if metric not in TIMED:
        return outcome, status
    notes = contention_note(base["agent"]) if base is not None else "", contention_note(cand["agent"])
    fails = outcome == "fail"
    blame = contention_reason(notes[0] if not fails else "", notes[1] if fails == bounds_worse else "")
    if blame:
        return "inconclusive", f"inconclusive ({blame})"
    held = contention_reason(*notes)
    return outcome, f"{status} (held although {held[0].lower()}{held[1:]})" if held else status


def _rounds_note(base: dict, cand: dict, q: float | None) -> str:
    p = rounds_p_value(base, cand, q)
    return f" (rounds agree: Mann-Whitney p = {p:.2f})" if p is not None else ""


def rounds_p_value(base: dict, cand: dict, q: float | None) -> float | None:
    """One-sided Mann-Whitney U p-value that ``cand``'s rounds (agent processes) are slower than
    ``base``'s at statistic ``q`` (percentile; None: the mean). None when the runs have too few
    rounds for any split to reach ``ROUNDS_ALPHA`` (e.g. one round each): no test to agree."""
    xs = [float(stat(r, q)) for r in round_slices(cand)]
    ys = [float(stat(r, q)) for r in round_slices(base)]
    n, k = len(xs) + len(ys), len(xs)
    if 1 / math.comb(n, k) > ROUNDS_ALPHA:
        return None
    pooled = xs + ys

    def u(chosen: tuple[int, ...] | list[int]) -> float:
        rest = [pooled[i] for i in range(n) if i not in chosen]
        return sum((a > b) + 0.5 * (a == b) for a in (pooled[i] for i in chosen) for b in rest)

    observed = u(range(k))
    if math.comb(n, k) <= _EXACT_MAX:  # every way of splitting the pooled rounds, as likely under "no change"
        splits = [u(c) for c in combinations(range(n), k)]
        return sum(s >= observed - 1e-9 for s in splits) / len(splits)
    m1, m2 = len(xs), len(ys)
    mean, sd = m1 * m2 / 2, math.sqrt(m1 * m2 * (n + 1) / 12)
    return 0.5 * math.erfc((observed - 0.5 - mean) / sd / math.sqrt(2))


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    outcome: str  # "pass", "fail", "inconclusive" (the runs cannot tell), "skipped" (no baseline yet, optional and not measured)
    value: float | None  # the metric's value in the gate's metric unit (ms, /s, %, pt, B, mJ)
    baseline: float | None
    limit: float | None
    line: str  # one human line: "p50 0.031 ms vs 0.030 ms (+3.3%, ..., limit +5%): pass"
    change: float | None = None  # relative: a fraction (pt gates: points)
    ci: tuple[float, float] | None = None  # latency: 95 % interval of the change

    @property
    def passed(self) -> bool | None:
        """True (pass), False (fail), None (inconclusive or skipped)."""
        return {"pass": True, "fail": False}.get(self.outcome)

    @property
    def status(self) -> str:
        return self.outcome

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate.text, "metric": self.gate.metric, "passed": self.passed, "status": self.status,
            "value": self.value, "baseline": self.baseline, "limit": self.limit, "unit": self.gate.unit,
            "relative": self.gate.relative, "change": self.change, "ci95": list(self.ci) if self.ci else None,
            "line": self.line,
        }  # fmt: skip


def parse_gate(text: str) -> Gate:
    """Parse ``METRIC:LIMIT``; anything else is a UsageError naming what is wrong."""
    m = _GATE.match(text)
    name = text.split(":", 1)[0].strip().rstrip("?")
    if ":" in text and name and name not in METRICS:
        raise UsageError(f"unknown gate metric {name!r} in {text!r}", SYNTAX_HINT)
    if m is None:
        raise UsageError(f"cannot read the gate {text!r}", SYNTAX_HINT)
    metric, op, unit, number = METRICS[m["metric"]], m["op"] or "", m["unit"], float(m["num"])
    if op in ("", "+", "-") and unit in ("%", "pt") and not (metric.name == "accuracy" and unit == "%" and op == ""):
        return _relative(text, metric, op, number, unit, bool(m["opt"]))
    if op in ("", "+", "-"):
        raise UsageError(
            f"gate {text!r}: a relative limit is +N% (accuracy, drop: N pt); an absolute one starts with < or >",
            f"e.g. {metric.name}:{_relative_example(metric)} or {metric.name}:<{_example(metric)}",
        )
    key = unit if metric.unit in ("%", "pt", "/s") else unit.lower()
    if key not in metric.units:
        said = f"unit {unit!r}" if unit else "no unit"
        units = "B, KB, MB, GB (1 MB = 2^20 B)" if metric.unit == "B" else ", ".join(u for u in metric.units if u) or metric.unit
        raise UsageError(f"gate {text!r}: {said} for {metric.name}", f"say the unit, one of: {units} (e.g. {metric.name}:{op}{_example(metric)})")
    if metric.unit in ("%", "pt") and number > 100:
        raise UsageError(f"gate {text!r}: {metric.name} lies between 0 and 100 {metric.unit}, so a limit of {number:g} {metric.unit} means nothing", f"e.g. {metric.name}:{op}{_example(metric)}")
    return Gate(text, metric.name, False, op, number * metric.units[key], metric.unit, bool(m["opt"]))


def _relative(text: str, metric: Metric, op: str, number: float, unit: str, optional: bool) -> Gate:
    points = metric.name in ("accuracy", "drop")
    if points != (unit == "pt"):
        raise UsageError(
            f"gate {text!r}: {metric.name} changes are " + ("in accuracy points (pt)" if points else "percentages (%)"),
            f"e.g. {metric.name}:{_relative_example(metric)}",
        )
    worse = "-" if metric.higher_is_better else "+"
    if (points or metric.higher_is_better) and number > 100:  # points, or a fall of a positive value
        said = "accuracy points" if points else f"a fall of {metric.name}"
        raise UsageError(f"gate {text!r}: {said} cannot exceed 100 {unit}", f"e.g. {metric.name}:{_relative_example(metric)}")
    if op and op != worse:
        raise UsageError(
            f"gate {text!r} would fail when {metric.name} gets better",
            f"a gate names how much worse {metric.name} may get: {metric.name}:{worse}{number:g}{unit}",
        )
    return Gate(text, metric.name, True, worse, number, unit, optional)


def _relative_example(metric: Metric) -> str:
    points = metric.name in ("accuracy", "drop")
    return ("-" if metric.higher_is_better else "+") + ("0.5pt" if points else "5%")


def _example(metric: Metric) -> str:
    return {"ms": "20ms", "/s": "1000/s", "%": "98%", "pt": "1pt", "B": "64MB", "mJ": "5mJ"}[metric.unit]


def _fmt(metric: Metric, value: float) -> str:
    if metric.unit == "ms":
        return f"{value:.3f} ms" if value >= 1 else f"{value:.4g} ms"
    if metric.unit == "B":
        return f"{value / 2**20:.1f} MB"
    if metric.unit == "/s":
        return f"{value:.1f}/s"
    if metric.unit in ("%", "pt"):
        return f"{value:.2f}{'%' if metric.unit == '%' else ' pt'}"
    return f"{value:.4g} {metric.unit}"


def parse_gates(texts: Sequence[str] | None) -> list[Gate]:
    return [parse_gate(t) for t in texts or ()]


def check_gates(gates: Sequence[Gate], record: dict, baseline: dict | None) -> list[GateResult]:
    return [g.check(record, baseline) for g in gates]


def gated_record(records: Sequence[dict]) -> dict:
    """The run the gates judge among one deploy's or bench's records: int8's when there is one
    (it carries the on-device agreement and the int8 gate's recommendation), else the first."""
    if not records:
        raise ValueError("no records to gate")
    return next((r for r in records if r["agent"]["variant"] == "int8"), records[0])


@dataclass(frozen=True)
class GateReport:
    """The gates of one run: the record judged, the baseline it was judged against, each result."""

    record: dict
    baseline: dict | None
    results: tuple[GateResult, ...]
    note: str = ""  # why there is no baseline, where a stored run missed it for one reason (compare.other_threads)

    @property
    def failed(self) -> list[GateResult]:
        return [r for r in self.results if r.passed is False]

    @property
    def outcome(self) -> str:
        """The run's: ``fail`` when a gate failed, else ``inconclusive`` when one was, else ``pass``."""
        return run_outcome(self.results)

    def lines(self) -> list[str]:
        """One line per gate, naming the variant and the runs: "gate p50:+5% (int8, run 7 vs run 3): ..."."""
        base = "no baseline" if self.baseline is None else f"vs run {_run_name(self.baseline)}"
        where = f"{self.record['agent']['variant']}, run {_run_name(self.record)} {base}"
        return [f"gate {r.gate.text} ({where}): {r.line}" for r in self.results] + ([f"  {self.note}"] if self.note else [])

    def error(self) -> GateError | None:
        """The GateError to raise when any gate failed (None when none did)."""
        failed = self.failed
        if not failed:
            return None
        return GateError(
            f"{len(failed)} of {len(self.results)} gate(s) failed: {', '.join(r.gate.text for r in failed)}",
            "each gate's line above says by how much; compare the runs with: edgekit results compare A B",
        )

    def to_dict(self) -> list[dict[str, Any]]:
        extra = {
            "variant": self.record["agent"]["variant"], "run_id": self.record.get("id"), "run_uuid": self.record["run_uuid"],
            "baseline_id": None if self.baseline is None else self.baseline.get("id"),
            "baseline_uuid": None if self.baseline is None else self.baseline["run_uuid"],
        }  # fmt: skip
        return [{**r.to_dict(), **extra} for r in self.results]


def run_gates(
    gates: Sequence[Gate | str], records: Sequence[dict], store: ResultsStore, *, baseline: str | None = None
) -> GateReport:
    """Check ``gates`` on the gated record of a run just stored (``records`` with their ``id``).

    The baseline is ``baseline`` (a reference as ``edgekit.bench.compare.resolve`` reads it), else
    the newest earlier stored run of the same model name, target, device and variant. An explicit
    baseline that is not comparable (other device, backend, variant; a changed model is fine) is
    an error; a default one that is not is skipped.
    """
    parsed = [g if isinstance(g, Gate) else parse_gate(g) for g in gates]
    record = gated_record(records)
    own = [r["id"] for r in records if r.get("id") is not None]  # never the run's own baseline
    note = ""
    if baseline is None:
        base = default_baseline(store, record, exclude=own)
        note = "" if base is not None else other_threads(store, record, own, "--threads")
    else:
        base = resolve(baseline, store, like=record, exclude=own)
        reason = comparable(base, record, allow_model_change=True)
        if reason:
            raise ResultsError(f"baseline {baseline} cannot be compared with this run: {reason}", "give a baseline run of the same device, backend and variant")
    report = GateReport(record, base, tuple(check_gates(parsed, record, base)), note)
    if record.get("id") is not None:  # a later default baseline is never a run whose gates failed
        store.set_outcome(record["id"], report.outcome)
    return report


def run_outcome(results: Sequence[GateResult]) -> str:
    """What a run's gates decided, as the store keeps it: fail > inconclusive > pass."""
    outcomes = {r.outcome for r in results}
    return "fail" if "fail" in outcomes else "inconclusive" if "inconclusive" in outcomes else "pass"


def _run_name(record: dict) -> str:
    return str(record["id"]) if record.get("id") is not None else record["run_uuid"][:8]
