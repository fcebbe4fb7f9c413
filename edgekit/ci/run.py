"""Run an edgekit.toml: every model x target x device through ``edgekit.api`` (the code `edgekit
deploy` runs: device lock held, a target's devices in parallel), then each run's baseline and gates.

Nothing is written here but the results store (as deploy does); the caller writes JUnit, JSON,
markdown and the report from the returned ``CiResult`` once everything has run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit import api
from edgekit.bench.compare import accuracy
from edgekit.bench.gates import gated_record
from edgekit.bench.store import ResultsStore
from edgekit.ci.config import Baseline, CiConfig, ModelSpec
from edgekit.devices import DeviceEntry, connect
from edgekit.devices.fleet import run_fleet, safe_name
from edgekit.errors import EXIT_GATE, EXIT_OK, DeviceError, EdgekitError, ResultsError
from edgekit.events import DeviceEvents, Events

CONNECT_TIMEOUT_S = 15.0


@dataclass
class Run:
    """One model x target x device: its deploy, the run that is gated, its baseline, its gates."""

    model: str
    target: str
    device: str
    gates: list[Any] = field(default_factory=list)  # GateResult, in the file's order
    records: list[dict] = field(default_factory=list)  # every variant's stored record, with "id"
    record: dict | None = None  # the one gated (int8's when there is one)
    baseline: dict | None = None
    baseline_note: str = ""  # which run the baseline is, or why there is none
    error: str | None = None
    hint: str | None = None
    exit_code: int = EXIT_OK
    seconds: float = 0.0

    @property
    def classname(self) -> str:
        return f"{self.model}/{self.target}/{self.device}"

    @property
    def failed_gates(self) -> list[Any]:
        return [g for g in self.gates if g.passed is False]

    def facts(self) -> dict[str, Any]:
        """The numbers and device facts of the gated run (JUnit properties, summary columns)."""
        r = self.record
        if r is None:
            return {}
        agent, stats = r["agent"], r["stats"]
        device = agent.get("device") or {}
        out: dict[str, Any] = {
            "run_id": r.get("id"), "variant": agent.get("variant"), "backend": agent.get("backend"),
            "precision": agent.get("precision"), "p50_ms": stats.get("p50"), "p99_ms": stats.get("p99"),
            "iterations": stats.get("n"), "accuracy_pct": accuracy(r), "arch": device.get("arch"),
            "cpu_model": device.get("cpu_model"), "hostname": device.get("hostname"),
            "baseline_run_id": self.baseline.get("id") if self.baseline else None,
        }  # fmt: skip
        return {k: v for k, v in out.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "target": self.target, "device": self.device,
            "status": "error" if self.error else ("failed" if self.failed_gates else "passed"),
            "error": self.error, "hint": self.hint, "exit_code": self.exit_code, "seconds": round(self.seconds, 3),
            "facts": self.facts(), "run_ids": [r["id"] for r in self.records],
            "baseline": {"run_id": self.baseline.get("id") if self.baseline else None, "note": self.baseline_note},
            "gates": [g.to_dict() for g in self.gates],
        }  # fmt: skip


@dataclass
class CiResult:
    config: CiConfig
    runs: list[Run]
    seconds: float

    @property
    def exit_code(self) -> int:
        """The first error's code (3 model/input, 4 device), else 5 when a gate failed, else 0."""
        errors = [r.exit_code for r in self.runs if r.error]
        if errors:
            return errors[0]
        return EXIT_GATE if any(r.failed_gates for r in self.runs) else EXIT_OK

    @property
    def no_baseline(self) -> bool:
        return any(g.passed is None for r in self.runs for g in r.gates)

    def verdict(self) -> str:
        gates = [g for r in self.runs for g in r.gates]
        failed = sum(g.passed is False for g in gates)
        pending = sum(g.passed is None for g in gates)
        errors = sum(1 for r in self.runs if r.error)
        parts = [f"{len(self.runs)} run(s)", f"{len(gates) - failed - pending} gate(s) passed", f"{failed} failed"]
        if pending:
            parts.append(f"{pending} with no baseline yet (not a failure)")
        if errors:
            parts.append(f"{errors} error(s)")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "kind": "edgekit.ci",
            "config": str(self.config.path),
            "baseline": self.config.baseline.describe(),
            "exit_code": self.exit_code,
            "verdict": self.verdict(),
            "seconds": round(self.seconds, 3),
            "runs": [r.to_dict() for r in self.runs],
        }


def check_devices(config: CiConfig, events: Events) -> None:
    """Reach every SSH device once before anything runs: an unreachable one stops the job here (exit 4)."""
    from edgekit.profiles import load_profile

    seen: set[str] = set()
    for spec in config.models:
        for target, entries in spec.runs:
            for entry in entries:
                if entry.is_local or entry.name in seen:
                    continue
                seen.add(entry.name)
                events.info(f"checking {entry.name} is reachable")
                try:
                    transport = connect(entry, load_profile(target), connect_timeout=CONNECT_TIMEOUT_S, log=events.info)
                    try:
                        transport.run(["true"], timeout=CONNECT_TIMEOUT_S * 4)
                    finally:
                        transport.close()
                except DeviceError as exc:
                    raise DeviceError(f"{config.path}: models '{spec.name}': device {entry.name}: {exc.message}", exc.hint) from None


def run_ci(config: CiConfig, events: Events, *, output_root: Path = Path("edgekit-out") / "ci") -> CiResult:
    """Deploy and bench everything the config names, pick baselines, check gates."""
    t0 = time.monotonic()
    check_devices(config, events)
    runs: list[Run] = []
    for spec in config.models:
        for target, entries in spec.runs:
            runs.extend(_deploy(spec, target, list(entries), config.jobs, events, output_root))
    mine = {r["id"] for run in runs for r in run.records}
    gates = {spec.name: spec.gates for spec in config.models}
    with ResultsStore() as store:
        for run in runs:
            if run.record is not None:
                run.baseline, run.baseline_note = pick_baseline(store, config.baseline, run.record, exclude=mine)
                run.gates = [gate.check(run.record, run.baseline) for gate in gates[run.model]]
    return CiResult(config, runs, time.monotonic() - t0)


def _deploy(spec: ModelSpec, target: str, entries: list[DeviceEntry], jobs: int, events: Events, root: Path) -> list[Run]:
    """One model on one target's devices, in parallel as `edgekit deploy --device A --device B` does."""
    from edgekit.deploy import open_job

    runs = {e.name: Run(spec.name, target, e.name) for e in entries}
    try:
        job = open_job(api.request(spec.path, target=target, device=entries[0], **{**spec.options, "remeasure": True}))  # ci gates new runs: it always measures
    except EdgekitError as exc:  # the model or its data: every device of it fails the same way
        for run in runs.values():
            run.error, run.hint, run.exit_code = exc.message, exc.hint or None, exc.exit_code
        return list(runs.values())

    def one(entry: DeviceEntry) -> Any:
        output = root / f"{safe_name(spec.name)}-{safe_name(target)}-{safe_name(entry.name)}"
        output.parent.mkdir(parents=True, exist_ok=True)
        return api.deploy_job(job, entry, DeviceEvents(events, f"{spec.name}/{entry.name}"), target=target, output=output)

    fleet = run_fleet(entries, one, jobs=jobs, name=lambda e: e.name)
    for outcome in fleet.outcomes:
        run = runs[outcome.device]
        run.seconds = outcome.duration_s
        if not outcome.succeeded:
            run.error, run.hint, run.exit_code = outcome.error, outcome.hint, outcome.exit_code
            continue
        result = outcome.value
        run.records = [{"id": rid, **r} for r, rid in zip(result.records, result.run_ids)]
        run.record = gated_record(run.records) if run.records else None
    return list(runs.values())


def pick_baseline(store: ResultsStore, baseline: Baseline, record: dict, *, exclude: set[int] = frozenset()) -> tuple[dict | None, str]:
    """The run ``record`` is gated against, and a note saying which it is or that there is none yet:
    the newest candidate of the same model name, target, device and variant that is comparable
    (a changed model is, as against the main branch's run) and not one of this job's runs."""
    from edgekit.bench.compare import baseline_for, read_records

    if baseline.kind == "latest":
        like = {"model": record["model_name"], "target": record["target"], "device": record["device"], "variant": record["agent"]["variant"]}
        candidates = store.records(limit=50, branch=baseline.branch, **like)
    elif baseline.kind == "ids":
        candidates = []
        for run_id in baseline.ids:
            try:
                candidates.append(store.get(run_id))
            except ResultsError:  # an id of another store: not this run's baseline
                continue
    else:
        candidates = sorted(read_records(baseline.file), key=lambda r: r["created"], reverse=True)
    r = baseline_for(candidates, record, exclude)
    if r is None:
        return None, f"no baseline yet ({baseline.describe()})"
    where = f"{baseline.file.name} " if baseline.kind == "file" else ""
    return r, f"{where}{'run ' + str(r['id']) if r.get('id') is not None else 'record'} of {r['created'][:19]}"
