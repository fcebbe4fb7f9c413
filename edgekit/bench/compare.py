"""Two runs side by side, honestly: refuse to compare what is not comparable, and call a change
only when it stands out of the noise.

The rule for latency (p50, p99, mean, throughput): a change is real when the 95 % bootstrap
interval of the ratio (``edgekit.bench.verdict.speedup_interval``, resampling the raw samples of
both runs) excludes 1 AND the change is larger than ``max(MIN_CHANGE, drift)``, where ``drift``
is the larger of the two runs' own wander: each run cut into (up to) ``DRIFT_BLOCKS`` consecutive
blocks, half the spread of the blocks' statistic (median, p99, mean) relative to the run's. Samples of one
run are not independent (a hot board, another process, a frequency change move many in a row),
so the bootstrap alone would call a busy machine's back-to-back runs different; a run that
wanders by 8 % within itself cannot show a 4 % change. On a quiet device the drift is well
under 1 % and the floor of ``MIN_CHANGE`` (5 %) rules.

A shared machine also changes speed as a whole for a while, which a run that was slow
throughout does not show as drift. The agent times a fixed loop through each window it times
itself (``speed_probe``), and a change must also exceed what the loop's move between the two
runs can explain (``verdict.machine_allowance``). A change within that, when the loop moved
more than ``MACHINE_UNSURE``, is "inconclusive" (as a gate on it is, see ``edgekit.bench.gates``). On the 2-core CI VM
the digits model ran at 45 us instead of 25 us for stretches of 0.3-20 s, the loop at 8.6 us
instead of 5.0 us with it: back-to-back runs of one build 42 % apart. Other processes busy on
the device during a timed window (``contention``, ``edgekit.agent.contention``) only slow that
run: a latency verdict they could explain ("slower" when the candidate was contended, "faster"
when the baseline was, "no change" when either was) is "inconclusive", naming the busiest of them.

Peak RSS and energy have one number per run: a change below ``MIN_CHANGE`` is "no change". Accuracy is
measured on the same samples each run: any change of the rate is a change.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.bench.record import contention_note, contention_reason, round_slices, validate_record
from edgekit.bench.stats import Stats, stat
from edgekit.bench.store import EXPORT_KIND, ResultsStore, check_export
from edgekit.bench.verdict import CONFIDENCE, MACHINE_UNSURE, machine_allowance, speedup_interval
from edgekit.errors import ResultsError
from edgekit.jsonable import strict_loads

# Two back-to-back runs of one bundle on one device differ by more than their within-run bootstrap
# intervals admit (clock and cache state, memory placement, other jobs): 1.8 % and 3.4 % on the
# digits example on a shared 2-core machine, with intervals of +-0.2 %. Below this floor no change
# is claimed, whatever the intervals say (so a relative gate tighter than 5 % cannot fail on noise).
# In a busier hour the same VM's calm pairs differed by 6.6-10.9 % in 5 of 12, with the speed loop
# within 1.7 %: per-process differences no single run can see (timing in several processes would).
MIN_CHANGE = 0.05
DRIFT_BLOCKS = 10
_MIN_BLOCK = 10  # fewer samples per block than this: too few to say a run drifted
_REF_HINT = "give a run id (edgekit results list), branch:NAME, tag:NAME (edgekit results pin), latest, or an export file (FILE or FILE#N)"


@dataclass(frozen=True)
class LatencyChange:
    """Candidate vs baseline at one statistic: ratio candidate/baseline, its CI, and the runs' noise."""

    ratio: float
    low: float
    high: float
    noise: float  # the runs' own: drift within a process, spread between processes (run_noise)
    machine: float = 0.0  # how far the device's own speed moved between the runs (machine_shift)
    busy: tuple[str, str] = ("", "")  # other work in the baseline's, the candidate's timed window (record.contention_note)

    @property
    def change(self) -> float:
        return self.ratio - 1.0

    @property
    def significant(self) -> bool:
        return self.outside_ci and abs(self.change) > self.floor

    @property
    def outside_ci(self) -> bool:
        return self.low > 1.0 or self.high < 1.0

    @property
    def unsure(self) -> bool:
        """A change the CI shows, that the device's own speed moving this far between the runs may
        explain: neither a change nor none can be claimed."""
        return self.outside_ci and self.machine > MACHINE_UNSURE and not self.significant

    @property
    def floor(self) -> float:
        """The smallest change that counts: MIN_CHANGE, the runs' noise, the machine's share."""
        return max(MIN_CHANGE, self.noise, machine_allowance(self.machine))

    @property
    def contended(self) -> str:
        """Why other work in a timed window leaves the verdict unproven ("" when it does not). Such
        work only slows a run: a candidate slowed by it that is still faster is faster, one that is
        slower may not be; against a slowed baseline the reverse; "no change" may hide either."""
        base, cand = self.busy
        if self.significant:
            return contention_reason("", cand) if self.ratio > 1.0 else contention_reason(base, "")
        return contention_reason(base, cand)

    @property
    def verdict(self) -> str:
        if self.contended:
            return "inconclusive"
        if self.significant:
            return "slower" if self.ratio > 1.0 else "faster"
        return "inconclusive" if self.unsure else "no change"

    def why(self) -> str:
        """Why the verdict is not a change (empty when it is one)."""
        if self.contended:
            return self.contended
        if self.significant:
            return ""
        if self.low <= 1.0 <= self.high:
            return "the 95% CI includes no change"
        if self.unsure:
            return (f"the device's own speed moved {self.machine * 100:.0f}% between the runs (its reference loop): "
                    "too far to judge a change of this size; rerun on a quiet device")
        if machine_allowance(self.machine) > max(MIN_CHANGE, self.noise):
            return f"within the device's own speed change of {self.machine * 100:.0f}% between the runs (its reference loop)"
        if self.noise > MIN_CHANGE:
            return f"within the runs' own noise of {self.noise * 100:.1f}% (drift within a process, spread between processes)"
        return f"below {MIN_CHANGE * 100:g}%"


def run_wander(samples_ns: Sequence[int], q: float | None = 50.0) -> float:
    """How far a run's statistic (percentile ``q``, None: the mean) wanders within the run (not
    ``stats.drift``, its trend from the first to the last tenth): half
    the spread of its values over consecutive blocks, relative to the whole run's. 0.0 when the
    run is too short to cut into blocks that hold that statistic (a p99 needs 100 samples a block)."""
    ns = np.asarray(samples_ns, dtype=np.float64)
    per_block = max(_MIN_BLOCK, int(np.ceil(100 / (100 - q))) if q is not None else 0)
    blocks = min(DRIFT_BLOCKS, ns.size // per_block)
    if blocks < 2:
        return 0.0
    values = [float(stat(b, q)) for b in np.array_split(ns, blocks)]
    return (max(values) - min(values)) / 2 / float(stat(ns, q))


def run_noise(agent: dict, q: float | None = 50.0) -> float:
    """How far a run's statistic moves within itself: its wander in each agent process, and for a run
    timed in several (``rounds``), half the spread of the processes' statistic relative to the whole."""
    parts = round_slices(agent)
    within = max(run_wander(p, q) for p in parts)
    if len(parts) < 2:
        return within
    values = [float(stat(p, q)) for p in parts]
    return max(within, (max(values) - min(values)) / 2 / float(stat(agent["samples_ns"], q)))


def latency_change(baseline: dict, candidate: dict, q: float | None = 50.0) -> LatencyChange:
    """Candidate vs baseline latency at percentile ``q`` (None: the mean), from two agent documents
    (records' ``agent``): their samples, their noise (``run_noise``), the device's own speed
    change between them (``machine_shift``) and other work in their timed windows (``contention``)."""
    speed, lo, hi = speedup_interval(list(baseline["samples_ns"]), list(candidate["samples_ns"]), q=q)
    noise = max(run_noise(baseline, q), run_noise(candidate, q))
    return LatencyChange(1 / speed, 1 / hi, 1 / lo, noise, machine_shift(baseline, candidate), (contention_note(baseline), contention_note(candidate)))


def machine_shift(a: dict, b: dict) -> float:
    """How far the device's own speed moved between two bench documents (records' ``agent``): the
    relative difference of the loop the agent timed through each window (``speed_probe``, see
    ``edgekit.agent.speed``); 0.0 when either run has none (a runtime that timed itself in its
    own process, an older record) or they timed another loop or on another Python."""
    pa, pb = a.get("speed_probe"), b.get("speed_probe")
    if not (isinstance(pa, dict) and isinstance(pb, dict)) or pa.get("loop") != pb.get("loop"):
        return 0.0
    if (a.get("device") or {}).get("python") != (b.get("device") or {}).get("python"):
        return 0.0
    return max(pa["ns"], pb["ns"]) / min(pa["ns"], pb["ns"]) - 1.0


# -- what may be compared -------------------------------------------------------------------
def comparable(a: dict, b: dict, *, allow_model_change: bool = False) -> str | None:
    """Why records ``a`` and ``b`` must not be compared, or None when they may.

    Same model (sha256 of the benched file, else its name), device (name and facts), backend,
    variant, precision and batch. ``allow_model_change`` lets the model differ (a changed
    model against the main branch's run), nothing else.
    """
    pa, pb = a["agent"], b["agent"]
    if a["device"] != b["device"]:
        return f"different devices: {a['device']} vs {b['device']}"
    da, db = pa.get("device") or {}, pb.get("device") or {}
    for key in ("hostname", "arch", "cpu_model"):
        if da.get(key) and db.get(key) and da[key] != db[key]:
            return f"different devices under one name {a['device']!r}: {key} {da[key]} vs {db[key]}"
    for key in ("backend", "variant", "precision"):
        if pa[key] != pb[key]:
            return f"different {key}s: {pa[key]} vs {pb[key]}"
    ba, bb = pa["config"]["batch"], pb["config"]["batch"]
    if ba != bb:
        return f"different batch sizes: {ba} vs {bb}"
    # the inference threads the run used (asked for, else the count the backend or the agent's
    # probe chose): 1 and 2 threads of one model differ by the scaling, not by a change; an
    # `edgekit ci` run whose probe picked 2 threads once failed p50:+5% at +83 % against a
    # --threads 1 baseline. Unknown on either side (a backend that does not say): not refused.
    ta, tb = pa["config"].get("threads"), pb["config"].get("threads")
    if ta is not None and tb is not None and ta != tb:
        return f"different thread counts: {ta} vs {tb}"
    # last: two variants of one bundle differ in their model files too, and the variant is the reason to say
    if not allow_model_change:
        sa, sb = pa.get("model_sha256"), pb.get("model_sha256")
        if sa and sb and sa != sb:
            return f"different models: sha256 {sa[:12]} vs {sb[:12]}"
        if not (sa and sb) and a["model_name"] != b["model_name"]:
            return f"different models: {a['model_name']} vs {b['model_name']}"
    return None


# -- the comparison -------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricChange:
    metric: str
    unit: str
    a: float | None
    b: float | None
    change: float | None  # b vs a: a fraction (accuracy: points)
    ci: tuple[float, float] | None  # 95 % interval of the change (latency only)
    verdict: str  # faster/slower (latency, throughput), better/worse (others), no change, inconclusive (latency: see LatencyChange), not measured
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric, "unit": self.unit, "a": self.a, "b": self.b, "change": self.change,
            "ci95": list(self.ci) if self.ci else None, "verdict": self.verdict, "note": self.note,
        }  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    """B (candidate) against A (baseline), one row per metric."""

    a: dict
    b: dict
    rows: tuple[MetricChange, ...]
    machine: float = 0.0  # machine_shift between the runs

    def row(self, metric: str) -> MetricChange:
        return next(r for r in self.rows if r.metric == metric)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": _ident(self.a), "b": _ident(self.b), "confidence": CONFIDENCE,
            "rule": f"change beyond max({MIN_CHANGE * 100:g}%, the runs' drift, the device's speed change) with the {CONFIDENCE * 100:g}% bootstrap CI excluding no change",
            "machine_shift": round(self.machine, 4),
            "metrics": [r.to_dict() for r in self.rows],
        }  # fmt: skip


_LATENCY = (("p50", 50.0), ("p99", 99.0), ("mean", None))


def compare(a: dict, b: dict) -> Comparison:
    """Per-metric verdicts of ``b`` against ``a`` (check ``comparable`` first)."""
    sa, sb = Stats.of_record(a), Stats.of_record(b)
    changes = {name: latency_change(a["agent"], b["agent"], q) for name, q in _LATENCY}
    rows = [MetricChange(name, "ms", sa.get(name), sb.get(name), ch.change, (ch.low - 1, ch.high - 1), ch.verdict, ch.why())
            for name, ch in changes.items()]  # fmt: skip
    mean = changes["mean"]
    ta, tb = sa.throughput, sb.throughput
    rows.append(MetricChange("throughput", "/s", ta, tb, tb / ta - 1, (1 / mean.high - 1, 1 / mean.low - 1), mean.verdict, mean.why()))
    for name, unit, get in (("rss", "B", _rss), ("energy", "mJ", _energy)):
        va, vb = get(a), get(b)
        if va is None and vb is None:
            continue
        if va is None or vb is None or va <= 0:
            rows.append(MetricChange(name, unit, va, vb, None, None, "not measured", f"{'A' if va is None else 'B'} has no {name}"))
            continue
        change = vb / va - 1
        verdict = "no change" if abs(change) < MIN_CHANGE else ("worse" if change > 0 else "better")
        rows.append(MetricChange(name, unit, va, vb, change, None, verdict))
    va, vb = accuracy(a), accuracy(b)
    if va is not None or vb is not None:
        if va is None or vb is None:
            rows.append(MetricChange("accuracy", "%", va, vb, None, None, "not measured", f"{'A' if va is None else 'B'} has no accuracy"))
        else:
            delta = vb - va
            verdict = "no change" if abs(delta) < 1e-9 else ("better" if delta > 0 else "worse")
            rows.append(MetricChange("accuracy", "%", va, vb, delta, None, verdict))
    return Comparison(a, b, tuple(rows), machine=machine_shift(a["agent"], b["agent"]))


def accuracy(record: dict) -> float | None:
    """The record's accuracy on labels in percent: int8's on an int8 record, float's otherwise."""
    agreement = record.get("agreement") or {}
    value = agreement.get("accuracy_int8" if record["agent"]["precision"] == "int8" else "accuracy_fp32")
    return None if value is None else value * 100


def _rss(record: dict) -> float | None:
    return record["agent"].get("peak_rss_bytes")


def _energy(record: dict) -> float | None:
    return (record["agent"].get("energy") or {}).get("mj_per_inference")


def _ident(record: dict) -> dict[str, Any]:
    agent = record["agent"]
    return {
        "id": record.get("id"), "run_uuid": record["run_uuid"], "created": record["created"],
        "model_name": record["model_name"], "target": record["target"], "device": record["device"],
        "variant": agent["variant"], "backend": agent["backend"], "model_sha256": agent.get("model_sha256"),
        "vcs": record.get("vcs"),
    }  # fmt: skip


# -- naming a run -----------------------------------------------------------------------------
def resolve(
    ref: str,
    store: ResultsStore,
    *,
    like: dict | None = None,
    model: str | None = None,
    target: str | None = None,
    device: str | None = None,
    variant: str | None = None,
    exclude: Sequence[int] = (),
) -> dict:
    """The record ``ref`` names: a store id (any run, even a failed one: the user named it),
    ``branch:NAME`` (the newest *passing* run on that branch; ``latest@NAME``: the newest run on it,
    whatever its gates said, as ``results compare`` wants it), ``tag:NAME``
    (the run pinned as NAME by ``edgekit results pin``, else the newest passing run of the commit
    the git tag NAME names), ``latest`` (the newest passing run), or an export file (``FILE``: its
    newest matching record that did not fail; ``FILE#N``: its ``records[N]``).

    Among several candidates, only those with ``like``'s model name, target, device and variant
    (when ``like`` is given) and the given filters count; the newest wins. Store runs in ``exclude``
    (the ones just made, when a gate looks for their baseline) never count.
    """
    filters = {"model_name": model, "target": target, "device": device, "variant": variant}
    if ref.isdigit():
        return store.get(int(ref))
    if ref.startswith(("latest@", "branch:")) or ref == "latest":
        branch = ref.split("@", 1)[1] if ref.startswith("latest@") else ref.removeprefix("branch:") if ref != "latest" else None
        if branch == "":
            raise ResultsError(f"no branch in {ref!r}", _REF_HINT)
        outcome = None if ref.startswith("latest@") else "pass"  # latest@BRANCH: the newest run whatever its gates said
        found = _pick([r for r in store.records(branch=branch, outcome=outcome, limit=1000) if r.get("id") not in exclude], like, filters)
        if found is None:
            where = f" on branch {branch!r}" if branch else ""
            raise ResultsError(f"no {'passing ' if outcome else ''}stored run{where}{_matching(like, filters)}", "a baseline is a run whose gates passed; list them: edgekit results list" + (f" --branch {branch}" if branch else ""))
        return found
    if ref.startswith("tag:"):
        return _tagged(ref.removeprefix("tag:"), store, like, filters, exclude)
    path, _, index = ref.partition("#")
    records = read_records(Path(path))
    if index:
        if not index.isdigit() or int(index) >= len(records):
            raise ResultsError(f"{path} has no record #{index} (it holds {len(records)}, #0 to #{len(records) - 1})", _REF_HINT)
        return records[int(index)]
    kept = [r for r in records if r.get("outcome") not in ("fail", "inconclusive")]  # never a failed run
    found = _pick(sorted(kept, key=lambda r: r["created"], reverse=True), like, filters)
    if found is None:
        raise ResultsError(f"no record in {path}{_matching(like, filters)} that did not fail its gates", "pick one by position: FILE#N")
    return found


def _tagged(name: str, store: ResultsStore, like: dict | None, filters: dict, exclude: Sequence[int]) -> dict:
    """``tag:NAME``: the pinned run NAME, else the newest passing run of the git tag NAME's commit."""
    from edgekit.bench.vcs import tag_commit

    if not name:
        raise ResultsError("no name in 'tag:'", _REF_HINT)
    pinned = store.pinned(name)
    if pinned is not None:
        return store.get(pinned)
    commit = tag_commit(name)
    if commit is None:
        raise ResultsError(f"no pinned run and no git tag named {name!r}", f"pin one: edgekit results pin RUN --name {name} (see: edgekit results pins)")
    found = _pick([r for r in store.records(commit=commit, outcome="pass", limit=1000) if r.get("id") not in exclude], like, filters)
    if found is None:
        raise ResultsError(f"no passing stored run of git tag {name!r} (commit {commit[:12]}){_matching(like, filters)}", f"pin a run as the baseline: edgekit results pin RUN --name {name}")
    return found


def check_ref(ref: str) -> None:
    """Fail early (before a long run) on a reference that cannot name a run: a missing file, an empty branch."""
    if ref in ("latest@", "branch:", "tag:"):
        raise ResultsError(f"no name in {ref!r}", _REF_HINT)
    path = Path(ref.partition("#")[0])
    if not (ref.isdigit() or ref == "latest" or ref.startswith(("latest@", "branch:", "tag:")) or path.is_file()):
        raise ResultsError(f"no such file: {path}", _REF_HINT)


def read_records(path: Path) -> list[dict]:
    """The records of an export file (or of one record, as `edgekit results show --json` prints it)."""
    hint = "give a file written by `edgekit results export`"
    try:
        document = strict_loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"no such file: {path}", _REF_HINT) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}", hint) from None
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path} is not JSON: {exc.msg} (line {exc.lineno})", hint) from None
    except ValueError as exc:
        raise ResultsError(f"{path} is not an export: {exc}", hint) from None
    if isinstance(document, dict) and document.get("kind") == EXPORT_KIND:
        records = check_export(document)
    elif isinstance(document, dict) and "agent" in document:
        records = [validate_record(document)]
    else:
        raise ResultsError(f"{path} is not an edgekit results export", hint)
    if not records:
        raise ResultsError(f"{path} holds no records", hint)
    return records


def default_baseline(store: ResultsStore, record: dict, exclude: Sequence[int] = ()) -> dict | None:
    """The baseline nobody named: the newest earlier *passing* stored run (its gates passed, see
    ``ResultsStore.set_outcome``) of ``record``'s model name, target, device and variant on the
    default branch (``vcs.default_branch``), else on any branch; never a failed one, so a red run
    retried unchanged stays red. When no run passed, a run no gate ever judged (a plain bench, a
    store from before outcomes were kept) is the baseline. Runs in ``exclude`` never count. A run
    whose timed window other work contended (``contention``) is passed over while a clean one is
    found: a gate cannot pass against it (``edgekit.bench.gates``)."""
    from edgekit.bench.vcs import default_branch

    f = _fields(record)
    like = {"model": f["model_name"], "target": f["target"], "device": f["device"], "variant": f["variant"]}
    main = default_branch()
    tries = [*([store.records(**like, branch=main, outcome="pass", limit=50)] if main else []), store.records(**like, outcome="pass", limit=50)]
    # last, a run no gate ever judged (a plain bench, a store from before outcomes were kept): not a failed one either
    tries.append([r for r in store.records(**like, limit=50) if r.get("outcome") is None])
    for busy_too in (False, True):
        for stored in tries:
            found = baseline_for((c for c in stored if c["created"] <= record["created"] and (busy_too or not contention_note(c["agent"]))), record, exclude)
            if found is not None:
                return found
    return None


def other_threads(store: ResultsStore, record: dict, exclude: Collection[int], setting: str) -> str:
    """Why a stored run of ``record``'s model, target, device and variant was no baseline, when only
    its thread count differs (the agent's probe chose another count than that run's): a sentence
    naming the run and ``setting`` (how the user sets the count), or "" when there is none."""
    f = _fields(record)
    threads = record["agent"]["config"].get("threads")
    for c in store.records(limit=50, model=f["model_name"], target=f["target"], device=f["device"], variant=f["variant"]):
        if c.get("id") not in exclude and (comparable(c, record, allow_model_change=True) or "").startswith("different thread counts"):
            count = c["agent"]["config"]["threads"]
            return (f"no baseline at {threads} thread(s): run {c['id']} was timed at {count} "
                    f"(a gate compares runs of one thread count; {setting} {count} gates against it)")
    return ""


def gated_threads(store: ResultsStore, model: str, target: str, device: str, variants: Collection[str] | None = None) -> dict | None:
    """The newest stored run of ``model`` on ``target`` and ``device`` (of one of ``variants``, None:
    any) that has a thread count: what a default gate of a new run would compare against, and so
    the count to time it at (``bench --fail`` without ``--threads``); None when there is none."""
    for r in store.records(limit=50, model=model, target=target, device=device):
        if (variants is None or r["agent"]["variant"] in variants) and r["agent"]["config"].get("threads"):
            return r
    return None


def baseline_for(candidates: Iterable[dict], record: dict, exclude: Collection[int] = ()) -> dict | None:
    """The first of ``candidates`` (newest first) that ``record`` may be measured against: the same
    model name, target, device and variant, comparable (a changed model is), not in ``exclude``."""
    wanted = _fields(record)
    for c in candidates:
        if c.get("id") not in exclude and _fields(c) == wanted and comparable(c, record, allow_model_change=True) is None:
            return c
    return None


def _pick(records: list[dict], like: dict | None, filters: dict) -> dict | None:
    """The newest of ``records`` passing ``filters``, and comparable with ``like`` when given."""
    kept = [r for r in records if all(v is None or _fields(r)[k] == v for k, v in filters.items())]
    if like is not None:
        return baseline_for(kept, like)
    return kept[0] if kept else None


def _fields(record: dict) -> dict[str, str]:
    return {"model_name": record["model_name"], "target": record["target"], "device": record["device"], "variant": record["agent"]["variant"]}


def _matching(like: dict | None, filters: dict) -> str:
    wanted = {**(_fields(like) if like else {}), **{k: v for k, v in filters.items() if v is not None}}
    return " matching " + ", ".join(f"{k.removesuffix('_name')} {v}" for k, v in wanted.items()) if wanted else ""
