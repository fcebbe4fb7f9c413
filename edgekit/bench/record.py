"""A benchmark record: the agent's raw document plus what the host knows and derives.

``make_record`` turns the JSON document the device agent printed into a record for the
results store; ``validate_record`` checks a record that comes back in from a file. Both
recompute the statistics from the raw samples, so a record's ``stats`` always agree with
its ``agent.samples_ns``.
"""

from __future__ import annotations

import copy
import uuid
from datetime import datetime, timezone
from itertools import accumulate
from typing import Any

import numpy as np

from edgekit.agent import SCHEMA as AGENT_SCHEMA  # the agent document layout this host reads
from edgekit.bench.stats import Stats, drift
from edgekit.errors import AgentError, EdgekitError, ResultsError
from edgekit.jsonable import is_int, kind

RECORD_SCHEMA = 1
AGENT_KIND = "edgekit.bench"
_RESERVED = ("schema", "run_uuid", "created", "model_name", "target", "device", "stats", "agent")

_AGENT_HINT = (
    "the agent on the device and this edgekit may be out of step; redeploy the agent "
    "(edgekit deploy) and run the benchmark again"
)
_RECORD_HINT = "the file was not written by `edgekit results export` or was edited; export it again from the source store"


def make_record(
    agent_doc: dict, *, model_name: str, target: str, device: str, extra: dict | None = None
) -> dict:
    """Wrap a validated agent document into a new record with a fresh run_uuid.

    Raises AgentError naming the first missing or malformed field of ``agent_doc``.
    """
    _check_agent(agent_doc, AgentError, "agent document field", "", _AGENT_HINT)
    for name, value in (("model_name", model_name), ("target", target), ("device", device)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    for key in extra or {}:
        if key in _RESERVED:
            raise ValueError(f"extra field {key!r} would overwrite a record field")
    record = {
        "schema": RECORD_SCHEMA,
        "run_uuid": uuid.uuid4().hex,
        "created": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
        "model_name": model_name,
        "target": target,
        "device": device,
        "stats": None,
        "agent": copy.deepcopy(agent_doc),
        **copy.deepcopy(extra or {}),
    }
    return validate_record(record)


def merge_rounds(docs: list[dict]) -> dict:
    """One agent document from the documents of several agent processes that timed the same
    variant (``--rounds``): their samples in the order they ran, the first round's load, first
    inference, warm-up, thread probe and layers, the largest RSS, the energy summed, the speed
    loop's median, the busiest round's ``contention`` (``merge_contention``), and ``rounds`` (each
    process's sample count, start, loop and contention) so that the spread between processes can
    be measured (``compare.run_noise``).

    Raises AgentError when the documents are not of one variant of one bundle on one backend."""
    for doc in docs:
        _check_agent(doc, AgentError, "agent document field", "", _AGENT_HINT)
    if len(docs) == 1:
        return copy.deepcopy(docs[0])
    first = docs[0]
    for doc in docs[1:]:
        for key in ("variant", "backend", "backend_version", "precision", "bundle_hash", "model_sha256"):
            if doc.get(key) != first.get(key):
                raise AgentError(f"the rounds of variant {first['variant']!r} differ in {key}: {first.get(key)!r} vs {doc.get(key)!r}", _AGENT_HINT)
        for key in ("batch", "threads"):
            if doc["config"].get(key) != first["config"].get(key):
                raise AgentError(f"the rounds of variant {first['variant']!r} differ in config.{key}: {first['config'].get(key)!r} vs {doc['config'].get(key)!r}", _AGENT_HINT)
    merged = copy.deepcopy(first)
    merged["samples_ns"] = [s for doc in docs for s in doc["samples_ns"]]
    merged["device_state"] = {"before": (first.get("device_state") or {}).get("before"), "after": (docs[-1].get("device_state") or {}).get("after")}
    rss = [doc["peak_rss_bytes"] for doc in docs if doc.get("peak_rss_bytes") is not None]
    merged["peak_rss_bytes"] = max(rss) if rss else None
    merged["energy"] = merged["speed_probe"] = None  # unless every round has one, of one source / loop
    energy = [doc.get("energy") for doc in docs]
    if all(energy) and len({e["source"] for e in energy}) == 1:
        joules = sum(e["joules"] for e in energy)
        inferences = len(merged["samples_ns"]) * first["config"]["batch"]
        merged["energy"] = {"source": energy[0]["source"], "joules": round(joules, 6), "mj_per_inference": round(joules * 1000.0 / inferences, 6)}
    probes = [doc.get("speed_probe") for doc in docs]
    if all(probes) and len({p["loop"] for p in probes}) == 1:
        ns = sorted(p["ns"] for p in probes)
        merged["speed_probe"] = {"loop": probes[0]["loop"], "ns": ns[len(ns) // 2], "bursts": sum(p["bursts"] for p in probes)}
    merged["contention"] = merge_contention([doc.get("contention") for doc in docs])
    merged["rounds"] = [
        {"samples": len(doc["samples_ns"]), "started_at": doc.get("started_at"), "speed_probe_ns": (doc.get("speed_probe") or {}).get("ns"),
         "contention": doc.get("contention")}
        for doc in docs
    ]  # fmt: skip
    return merged


def merge_contention(rounds: list[dict | None]) -> dict | None:
    """The ``contention`` of a run timed in several processes: the busiest round's (a contended
    one first), contended when any round was; not clean (None) when a round could not be judged
    or has none; None when no round has one."""
    known = [c for c in rounds if c]
    if not known:
        return None
    worst = dict(max(known, key=lambda c: (c.get("contended") is True, c["other_cpu"])))
    if any(c.get("contended") is True for c in known):
        worst["contended"] = True
    elif len(known) < len(rounds) or any(c.get("contended") is None for c in known):
        worst["contended"] = None
    return worst


def contention_note(agent: dict | None) -> str:
    """"pid 4242 (stress) 97% of a core, ..." for a run whose timed window other work contended
    (``edgekit.agent.contention``); "" for one it did not, or that was not judged."""
    c = (agent or {}).get("contention") or {}
    if c.get("contended") is not True:
        return ""
    top = c.get("top") or []
    shown = [p for p in top if p["cpu"] >= 0.05] or top[:1]  # not the daemons' hundredths
    named = ", ".join(f"pid {p['pid']} ({p['name']}) {p['cpu'] * 100:.0f}% of a core" for p in shown)
    return named or f"{c['other_cpu']:.2f} cores"


def contention_reason(baseline_note: str, candidate_note: str) -> str:
    """Why a verdict on two runs cannot be claimed because other work contended the timed window
    of one or both (``contention_note`` of each, "" for a run not to blame); "" when neither."""
    if baseline_note and candidate_note:
        return f"the device ran other work during both runs' timed windows: {baseline_note}; {candidate_note}"
    if baseline_note or candidate_note:
        whose = "the baseline's" if baseline_note else "the candidate's"
        return f"the device ran other work during {whose} timed window: {baseline_note or candidate_note}"
    return ""


def round_slices(agent: dict) -> list[list[int]]:
    """The samples of each agent process a run was timed in (one list when it had one)."""
    samples = agent["samples_ns"]
    ends = list(accumulate(r["samples"] for r in agent.get("rounds") or []))
    out = [samples[start:end] for start, end in zip([0, *ends], ends)]
    return out if len(out) > 1 else [samples]


def round_p50s_ns(agent: dict) -> list[float]:
    """The median latency (ns) of each agent process a run was timed in."""
    return [float(np.median(x)) for x in round_slices(agent)]


def validate_record(d: Any) -> dict:
    """Check a record (e.g. from an import) and return a normalised copy.

    Normalises ``run_uuid`` to 32 hex digits and ``created`` to UTC, and recomputes ``stats``
    from the raw samples. Raises ResultsError naming the first bad field.
    """

    def bad(field: str, what: str) -> ResultsError:
        return ResultsError(f"record field {field!r} {what}", _RECORD_HINT)

    if not isinstance(d, dict):
        raise ResultsError(f"a record must be a JSON object, got {_kind(d)}", _RECORD_HINT)
    schema = d.get("schema")
    if not is_int(schema):
        raise bad("schema", f"must be an integer, got {_kind(schema)}")
    if schema > RECORD_SCHEMA:
        raise ResultsError(
            f"record schema {schema} is newer than this edgekit understands ({RECORD_SCHEMA})",
            "upgrade edgekit (pip install -U edgekit) on this machine",
        )
    if schema != RECORD_SCHEMA:
        raise bad("schema", f"must be {RECORD_SCHEMA}, got {schema}")
    out = copy.deepcopy(d)
    try:
        out["run_uuid"] = uuid.UUID(d["run_uuid"]).hex
    except (KeyError, TypeError, ValueError, AttributeError):
        raise bad("run_uuid", f"must be a UUID string, got {d.get('run_uuid')!r}") from None
    out["created"] = _utc_iso(d.get("created"))
    if out["created"] is None:
        raise bad("created", "must be an ISO-8601 timestamp with a UTC offset")
    for key in ("model_name", "target", "device"):
        if not isinstance(d.get(key), str) or not d[key]:
            raise bad(key, f"must be a non-empty string, got {_kind(d.get(key))}")
    if "stats" in d and d["stats"] is not None and not isinstance(d["stats"], dict):
        raise bad("stats", f"must be an object, got {_kind(d['stats'])}")
    agent = d.get("agent")
    if not isinstance(agent, dict):
        raise bad("agent", f"must be the agent's JSON object, got {_kind(agent)}")
    _check_agent(agent, ResultsError, "record field", "agent.", _RECORD_HINT)
    out["stats"] = Stats.of_record(d).to_dict()
    return out


def _check_agent(doc: Any, error: type[EdgekitError], label: str, path: str, hint: str) -> None:
    """Raise ``error`` naming the first field of an agent document that is missing or bad."""

    def fail(field: str, what: str) -> EdgekitError:
        return error(f"{label} {path + field!r} {what}", hint)

    if not isinstance(doc, dict):
        raise error(f"the agent document must be a JSON object, got {_kind(doc)}", hint)
    if doc.get("kind") != AGENT_KIND:
        raise fail("kind", f"must be {AGENT_KIND!r}, got {doc.get('kind')!r}")
    schema = doc.get("schema")
    if not is_int(schema) or schema < 1:
        raise fail("schema", f"must be a positive integer, got {schema!r}")
    if schema > AGENT_SCHEMA:
        raise error(
            f"agent document schema {schema} is newer than this edgekit understands ({AGENT_SCHEMA})",
            "upgrade edgekit on this machine (pip install -U edgekit) to match the agent",
        )
    for key in ("variant", "backend", "precision"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise fail(key, f"must be a non-empty string, got {_kind(doc.get(key))}")
    samples = doc.get("samples_ns")
    if not isinstance(samples, list) or not samples:
        raise fail(
            "samples_ns", f"must be a non-empty list of positive integers, got {_kind(samples)}"
        )
    for i, s in enumerate(samples):
        if not is_int(s) or s <= 0:
            raise fail(
                "samples_ns", f"must hold positive integers (nanoseconds); item {i} is {s!r}"
            )
    config = doc.get("config")
    if not isinstance(config, dict):
        raise fail("config", f"must be an object, got {_kind(config)}")
    batch = config.get("batch")
    if not is_int(batch) or batch < 1:
        raise fail("config.batch", f"must be a positive integer, got {batch!r}")
    if not isinstance(doc.get("device"), dict):
        raise fail("device", f"must be an object of device facts, got {_kind(doc.get('device'))}")
    # Optional fields: absent or null is fine, a wrong type is not.
    for key in (
        "agent_version",
        "backend_version",
        "model",
        "model_sha256",
        "bundle_hash",
        "started_at",
    ):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise fail(key, f"must be a string or null, got {_kind(doc[key])}")
    for key in ("load_ns", "first_inference_ns", "peak_rss_bytes"):
        value = doc.get(key)
        if value is not None and (not is_int(value) or value < 0):
            raise fail(key, f"must be a non-negative integer or null, got {value!r}")
    if doc.get("device_state") is not None and not isinstance(doc["device_state"], dict):
        raise fail("device_state", f"must be an object or null, got {_kind(doc['device_state'])}")
    if doc.get("layers") is not None and not isinstance(doc["layers"], (list, dict)):
        raise fail("layers", f"must be a list, an object or null, got {_kind(doc['layers'])}")
    _check_measurement(doc, fail)


def _check_measurement(doc: dict, fail: Any) -> None:
    """The optional fields of disciplined measurement (warm-up, device state, energy, layers)."""
    config = doc["config"]
    if config.get("warmup") is not None and (not is_int(config["warmup"]) or config["warmup"] < 0):
        raise fail("config.warmup", f"must be a non-negative integer or null, got {config['warmup']!r}")
    if config.get("warmup_mode") not in (None, "fixed", "auto"):
        raise fail("config.warmup_mode", f"must be 'fixed', 'auto' or null, got {config['warmup_mode']!r}")
    warm = doc.get("warmup_samples_ns")
    if warm is not None and (not isinstance(warm, list) or not all(is_int(s) and s > 0 for s in warm)):
        raise fail("warmup_samples_ns", "must be a list of positive integers (nanoseconds) or null")
    for when in ("before", "after"):
        state = (doc.get("device_state") or {}).get(when)
        if state is None:
            continue
        field = f"device_state.{when}"
        if not isinstance(state, dict):
            raise fail(field, f"must be an object or null, got {_kind(state)}")
        for key in ("freq_mhz", "freq_max_mhz", "thermal"):
            value = state.get(key)
            if value is not None and (not isinstance(value, dict) or not all(_is_number(v) for v in value.values())):
                raise fail(f"{field}.{key}", "must be an object of numbers or null")
        throttled = state.get("throttled")
        if throttled is not None and (
            not isinstance(throttled, dict) or not all(isinstance(throttled.get(k), bool) for k in ("now", "ever"))
        ):
            raise fail(f"{field}.throttled", "must be an object with booleans 'now' and 'ever', or null")
    probe = doc.get("speed_probe")
    if probe is not None and not (
        isinstance(probe, dict) and isinstance(probe.get("loop"), str) and all(is_int(probe.get(k)) and probe[k] > 0 for k in ("ns", "bursts"))
    ):
        raise fail("speed_probe", "must be {loop, ns, bursts} with a positive ns and burst count, or null")
    rounds = doc.get("rounds")
    if rounds is not None:
        ok = isinstance(rounds, list) and len(rounds) >= 2 and all(isinstance(r, dict) and is_int(r.get("samples")) and r["samples"] > 0 for r in rounds)
        if not ok or sum(r["samples"] for r in rounds) != len(doc["samples_ns"]):
            raise fail("rounds", "must be a list of 2 or more {samples, ...} whose sample counts add up to samples_ns, or null")
    _check_contention(doc.get("contention"), "contention", fail)
    for i, r in enumerate(rounds or []):
        _check_contention(r.get("contention"), f"rounds[{i}].contention", fail)
    energy = doc.get("energy")
    if energy is not None:
        ok = isinstance(energy, dict) and isinstance(energy.get("source"), str)
        if not ok or not all(_is_number(energy.get(k)) and energy[k] >= 0 for k in ("joules", "mj_per_inference")):
            raise fail("energy", "must be {source, joules, mj_per_inference} with non-negative numbers, or null")
    for i, layer in enumerate(doc.get("layers") if isinstance(doc.get("layers"), list) else []):
        if not isinstance(layer, dict) or not isinstance(layer.get("name"), str) or not _is_number(layer.get("ns")) or layer["ns"] < 0:
            raise fail("layers", f"item {i} must be an object with a name and non-negative ns")
        if layer.get("calls") is not None and not is_int(layer["calls"]):
            raise fail("layers", f"item {i}: calls must be an integer or null, got {layer['calls']!r}")


def _check_contention(c: Any, field: str, fail: Any) -> None:
    """``contention`` (``edgekit.agent.contention``): absent in older records and off Linux."""
    if c is None:
        return
    ok = isinstance(c, dict) and c.get("contended") in (True, False, None) and isinstance(c.get("top"), list)
    ok = ok and all(_is_number(c.get(k)) and c[k] >= 0 for k in ("window_s", "other_cpu", "limit"))
    ok = ok and all(isinstance(p, dict) and is_int(p.get("pid")) and isinstance(p.get("name"), str) and _is_number(p.get("cpu")) for p in c["top"])
    if not ok:
        raise fail(field, "must be {window_s, other_cpu, limit, contended, top: [{pid, name, cpu}]} with non-negative numbers, or null")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return kind(value, none="null or nothing")


def _utc_iso(value: Any) -> str | None:
    """``value`` as an aware ISO-8601 timestamp converted to UTC, or None if it is not one."""
    if not isinstance(value, str):
        return None
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value  # 3.10 rejects "Z"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return when.astimezone(timezone.utc).isoformat(timespec="microseconds")


def measurement_warnings(agent: dict) -> list[str]:
    """What makes a run's numbers suspect: the p50 drifting by 5% or more from the first to the last
    tenth of the run (with the temperature it went through), throttling the device reported, other
    work on the device contending the timed window (``contention``), and all cores running 10 % or
    more slower than one thread in the agent's thread probe (it then timed one)."""
    state = agent.get("device_state") or {}
    before, after = state.get("before") or {}, state.get("after") or {}
    lines = []
    parts = round_slices(agent) if agent.get("samples_ns") else []
    drifts = [d for d in map(drift, parts) if d is not None]
    d = max(drifts, key=lambda x: abs(x.change_pct), default=None)  # within a process: a step between two is not drift
    if d is not None and abs(d.change_pct) >= 5:
        heat = f" (temperature {before['temp_c']:g} -> {after['temp_c']:g} C)" if before.get("temp_c") is not None and after.get("temp_c") is not None else ""
        lines.append(f"drift: p50 {d.change_pct:+.0f}% from the first to the last tenth of the run{heat}")
    if len(parts) > 1:
        p50 = [ns / 1e6 for ns in round_p50s_ns(agent)]
        if max(p50) >= 1.05 * min(p50):
            lines.append(f"rounds: p50 {min(p50):.3g}-{max(p50):.3g} ms across the {len(parts)} processes (counted as noise when runs are compared)")
    throttled = [s["throttled"] for s in (before, after) if isinstance(s.get("throttled"), dict)]
    if any(t.get("now") or t.get("ever") for t in throttled):
        lines.append(f"throttled ({throttled[-1].get('source')}): {throttled[-1].get('detail')}")
    note = contention_note(agent)
    if note:
        c = agent["contention"]
        window = f"{c['window_s']:.2g} s timed window" if c.get("span") != "runner" else f"{c['window_s']:.2g} s of the runtime's process (its load, warm-up and timed loop)"
        lines.append(f"contended: other work on the device used {c['other_cpu']:.2f} cores through the {window}: {note}; its latencies are upper bounds, a latency gate it fails is inconclusive")
    probe = agent.get("threads_probe") or {}
    if probe.get("chosen") == 1 and probe.get("all_p50_ns", 0) > 1.1 * probe.get("one_p50_ns", 0) > 0:  # beyond the probe's noise
        lines.append(
            f"threads: all {probe['all_threads']} were slower than one here ({probe['all_p50_ns'] / 1e3:.0f} vs "
            f"{probe['one_p50_ns'] / 1e3:.0f} us p50 in a {probe['runs']}-run probe each): timed with 1 thread"
        )
    return lines
