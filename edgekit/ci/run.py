"""Run an edgekit.toml: every model x target x device through ``edgekit.api`` (the code `edgekit
deploy` runs: device lock held, a target's devices in parallel), then each run's baseline and gates.

Nothing is written here but the results store (as deploy does, plus each gated run's outcome, so
a later default baseline is never a failed run); the caller writes JUnit, JSON, markdown and the
report from the returned ``CiResult`` once everything has run.

A fleet degrades, it does not die: each model x target x device is its own run; a device that
cannot be reached, a push that fails or an agent that crashes makes that run an error (with the
reason) and the others go on. ``fail_on_unreachable`` decides whether an unreachable device
fails the job (exit 4); ``inconclusive`` ("warn" or "fail") whether an inconclusive gate does (exit 5).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit import api
from edgekit.bench.compare import accuracy
from edgekit.bench.gates import gated_record, run_outcome
from edgekit.bench.store import ResultsStore
from edgekit.ci.config import Baseline, CiConfig, ModelSpec
from edgekit.devices import DeviceEntry, connect
from edgekit.devices.fleet import run_fleet, safe_name
from edgekit.errors import EXIT_DEVICE, EXIT_GATE, EXIT_OK, DeviceError, EdgekitError, ResultsError
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
    unreachable: bool = False  # the error is that the device could not be reached at all

    @property
    def outcome(self) -> str:
        """error | unreachable | fail | inconclusive | pass: the run's own verdict."""
        if self.error:
            return "unreachable" if self.unreachable else "error"
        return run_outcome(self.gates) if self.gates else "pass"

    @property
    def classname(self) -> str:
        return f"{self.model}/{self.target}/{self.device}"

    @property
    def failed_gates(self) -> list[Any]:
        return [g for g in self.gates if g.outcome == "fail"]

    @property
    def inconclusive_gates(self) -> list[Any]:
        return [g for g in self.gates if g.outcome == "inconclusive"]

    def fp32_record(self) -> dict | None:
        """The float run of the same deploy (the int8 speed-up's reference), if there is one."""
        return next((r for r in self.records if r["agent"].get("precision") != "int8"), None)

    def speedup(self) -> float | None:
        """int8 vs float at p50 on this device in this run (None without both)."""
        f = self.fp32_record()
        if self.record is None or f is None or self.record is f or self.record["agent"].get("precision") != "int8":
            return None
        return f["stats"]["p50"] / self.record["stats"]["p50"] if self.record["stats"]["p50"] else None

    def accuracy_drop(self) -> float | None:
        """fp32 minus int8 accuracy on labels, in points (None without labels)."""
        value = ((self.record or {}).get("agreement") or {}).get("accuracy_drop")
        return None if value is None else value * 100

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
            "int8_speedup": None if self.speedup() is None else round(self.speedup(), 3),
            "accuracy_drop_pt": self.accuracy_drop(),
            "baseline_run_id": self.baseline.get("id") if self.baseline else None,
            "baseline_commit": ((self.baseline or {}).get("vcs") or {}).get("commit"),
            "baseline_created": (self.baseline or {}).get("created"),
        }  # fmt: skip
        return {k: v for k, v in out.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "target": self.target, "device": self.device,
            "status": {"error": "error", "unreachable": "unreachable", "fail": "failed", "inconclusive": "inconclusive"}.get(self.outcome, "passed"),
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
    fail_on_unreachable: bool = True
    inconclusive: str = "warn"  # "warn": an inconclusive gate does not fail the job; "fail": it does

    @property
    def exit_code(self) -> int:
        """The first counted error's code (3 model/input, 4 device; an unreachable device only with
        fail_on_unreachable), else 5 when a gate failed (or was inconclusive, with inconclusive="fail"), else 0."""
        errors = [r.exit_code for r in self.runs if r.error and (self.fail_on_unreachable or not r.unreachable)]
        if errors:
            return errors[0]
        return EXIT_GATE if any(self.failing(r) for r in self.runs) else EXIT_OK

    def failing(self, run: Run) -> list[Any]:
        """The gates of ``run`` that fail the job: failed ones, and inconclusive ones under inconclusive="fail"."""
        return [g for g in run.gates if g.outcome == "fail" or (g.outcome == "inconclusive" and self.inconclusive == "fail")]

    @property
    def no_baseline(self) -> bool:
        return any(g.outcome == "skipped" for r in self.runs for g in r.gates)

    def devices(self) -> dict[str, int]:
        """Devices (by name) ok / failed (a gate failed or the deploy did) / unreachable."""
        state: dict[str, str] = {}
        rank = {"ok": 0, "failed": 1, "unreachable": 2}
        for r in self.runs:
            s = "unreachable" if r.unreachable else "failed" if r.error or self.failing(r) else "ok"
            if rank[s] >= rank[state.get(r.device, "ok")]:
                state[r.device] = s
        return {k: sum(v == k for v in state.values()) for k in rank}

    def devices_line(self) -> str:
        d = self.devices()
        return f"devices: {d['ok']} ok, {d['failed']} failed, {d['unreachable']} unreachable"

    def verdict(self) -> str:
        gates = [g for r in self.runs for g in r.gates]
        count = {k: sum(g.outcome == k for g in gates) for k in ("pass", "fail", "inconclusive", "skipped")}
        errors = sum(1 for r in self.runs if r.error)
        parts = [f"{len(self.runs)} run(s)", f"{count['pass']} gate(s) passed", f"{count['fail']} failed"]
        if count["inconclusive"]:
            parts.append(f"{count['inconclusive']} inconclusive" + (" (counted as failed)" if self.inconclusive == "fail" else " (not a failure: --inconclusive warn)"))
        if count["skipped"]:
            parts.append(f"{count['skipped']} with no baseline yet (not a failure)")
        if errors:
            parts.append(f"{errors} error(s)")
        return ", ".join(parts) + "; " + self.devices_line()

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "kind": "edgekit.ci",
            "config": str(self.config.path),
            "baseline": self.config.baseline.describe(),
            "exit_code": self.exit_code,
            "verdict": self.verdict(),
            "devices": self.devices(),
            "fail_on_unreachable": self.fail_on_unreachable,
            "inconclusive": self.inconclusive,
            "seconds": round(self.seconds, 3),
            "runs": [r.to_dict() for r in self.runs],
        }


def check_devices(config: CiConfig, events: Events) -> dict[str, DeviceError]:
    """Reach every SSH device once before anything runs, in parallel: the ones that cannot be
    reached (by name, with the reason) are not deployed to; their runs are errors, the others go on."""
    from edgekit.profiles import load_profile

    todo: dict[str, tuple[DeviceEntry, str]] = {}
    for spec in config.models:
        for target, entries in spec.runs:
            for entry in entries:
                if not entry.is_local and config.engine == "ssh":  # Ansible reports its unreachable hosts itself
                    todo.setdefault(entry.name, (entry, target))

    def reach(item: tuple[DeviceEntry, str]) -> None:
        entry, target = item
        events.info(f"checking {entry.name} is reachable")
        transport = connect(entry, load_profile(target), connect_timeout=CONNECT_TIMEOUT_S, log=events.info)
        try:
            transport.run(["true"], timeout=CONNECT_TIMEOUT_S * 4)
        finally:
            transport.close()

    fleet = run_fleet(list(todo.values()), reach, jobs=max(1, config.jobs), name=lambda item: item[0].name)
    dead = {}
    for outcome in fleet.outcomes:
        if not outcome.succeeded:
            events.warn(f"device {outcome.device} is unreachable: {outcome.error}")
            dead[outcome.device] = DeviceError(outcome.error or "unreachable", outcome.hint or "")
    return dead


def run_ci(
    config: CiConfig, events: Events, *, output_root: Path = Path("edgekit-out") / "ci",
    fail_on_unreachable: bool = True, inconclusive: str = "warn",
) -> CiResult:  # fmt: skip
    """Deploy and bench everything the config names, pick baselines, check gates, record each gated
    run's outcome in the store."""
    if inconclusive not in ("warn", "fail"):
        raise ValueError(f"inconclusive must be 'warn' or 'fail', got {inconclusive!r}")
    t0 = time.monotonic()
    dead = check_devices(config, events)
    runs: list[Run] = []
    for spec in config.models:
        for target, entries in spec.runs:
            order = [e.name for e in entries]
            done: list[Run] = []
            for threads, group in _thread_groups(spec, target, entries, events).items():
                if config.engine == "ansible":
                    over = [e for e in group if not e.is_local]
                    done += _deploy(spec, target, [e for e in group if e.is_local], config.jobs, events, output_root, dead, threads)
                    done += _deploy_ansible(spec, target, over, config, events, output_root, threads) if over else []
                else:
                    done += _deploy(spec, target, group, config.jobs, events, output_root, dead, threads)
            runs.extend(sorted(done, key=lambda r: order.index(r.device)))
    mine = {r["id"] for run in runs for r in run.records}
    gates = {spec.name: spec.gates for spec in config.models}
    with ResultsStore() as store:
        for run in runs:
            if run.record is not None:
                run.baseline, run.baseline_note = pick_baseline(store, config.baseline, run.record, exclude=mine)
                run.gates = [gate.check(run.record, run.baseline) for gate in gates[run.model]]
                if run.record.get("id") is not None:
                    store.set_outcome(run.record["id"], run_outcome(run.gates))
    return CiResult(config, runs, time.monotonic() - t0, fail_on_unreachable, inconclusive)


def _thread_groups(spec: ModelSpec, target: str, entries: Sequence[DeviceEntry], events: Events) -> dict[int | None, list[DeviceEntry]]:
    """The devices of one model and target by the inference threads to time them at. Unless the
    config sets ``threads``, a device is timed at the count its newest gated run of this model was
    (a gate compares runs of one thread count only, ``bench.compare.comparable``; left to the
    agent's probe, a 2-core device picked 1 thread in one run and 2 in the next, and its gates then
    had no baseline); a device with none, at the probe's choice (None)."""
    groups: dict[int | None, list[DeviceEntry]] = {}
    if "threads" in spec.options:
        return {spec.options["threads"]: list(entries)}
    with ResultsStore() as store:
        for entry in entries:
            last = next((r for r in store.records(limit=50, model=spec.path.stem, target=target, device=entry.name)
                         if r.get("outcome") in ("pass", "inconclusive") and r["agent"]["config"].get("threads")), None)
            threads = last["agent"]["config"]["threads"] if last else None
            if last:
                events.info(f"[{spec.name}/{entry.name}] timing at {threads} thread(s), as its last gated run ({last['id']}) was: "
                            "set threads in edgekit.toml to choose")
            groups.setdefault(threads, []).append(entry)
    return groups


def _deploy(
    spec: ModelSpec, target: str, entries: list[DeviceEntry], jobs: int, events: Events, root: Path, dead: dict[str, DeviceError],
    threads: int | None = None,
) -> list[Run]:
    """One model on one target's devices, in parallel as `edgekit deploy --device A --device B` does;
    the ``dead`` (unreachable) ones are errors without being tried again; timed at ``threads``
    (None: the config's, else the agent's choice)."""
    from edgekit.deploy import open_job

    runs = {e.name: Run(spec.name, target, e.name) for e in entries}
    for e in entries:
        if e.name in dead:
            run = runs[e.name]
            run.error, run.hint, run.exit_code, run.unreachable = dead[e.name].message, dead[e.name].hint or None, dead[e.name].exit_code, True
    entries = [e for e in entries if e.name not in dead]
    if not entries:
        return list(runs.values())
    try:
        job = open_job(api.request(spec.path, target=target, device=entries[0], **_options(spec, threads)))
    except EdgekitError as exc:  # the model or its data: every device of it fails the same way
        for run in runs.values():
            run.error, run.hint, run.exit_code = exc.message, exc.hint or None, exc.exit_code
        return list(runs.values())

    def one(entry: DeviceEntry) -> Any:
        output = root / f"{safe_name(spec.name)}-{safe_name(target)}-{safe_name(entry.name)}"
        output.parent.mkdir(parents=True, exist_ok=True)
        return api.deploy_job(job, entry, DeviceEvents(events, f"{spec.name}/{entry.name}"), target=target, output=output)

    _collect(runs, run_fleet(entries, one, jobs=jobs, name=lambda e: e.name))
    return list(runs.values())


def _options(spec: ModelSpec, threads: int | None) -> dict[str, Any]:
    """The deploy options of a ci run: the model's, always measuring (ci gates new runs), at ``threads`` when given."""
    return {**spec.options, "remeasure": True, **({"threads": threads} if threads is not None else {})}


def _deploy_ansible(spec: ModelSpec, target: str, entries: list[DeviceEntry], config: CiConfig, events: Events, root: Path,
                    threads: int | None = None) -> list[Run]:
    """One model on one target's devices through Ansible (``engine = "ansible"``): bundled once
    here, the inventory's hosts of those names deployed ``config.jobs`` at a time (Ansible's forks)."""
    from edgekit.ansibledeploy import deploy_fleet
    from edgekit.devices.ansible import Strategy

    runs = {e.name: Run(spec.name, target, e.name) for e in entries}
    assert config.inventory is not None  # engine = "ansible" needs one (checked with the config)
    # one bundle per thread count: the devices of one model and target may be timed at several
    output = root / f"{safe_name(spec.name)}-{safe_name(target)}{f'-t{threads}' if threads is not None else ''}"
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        req = api.request(spec.path, target=target, output=output, **_options(spec, threads))
        fleet = deploy_fleet(req, config.inventory, Strategy.parse(",".join(runs), config.jobs, None, None), target=target, sink=events)
    except EdgekitError as exc:  # the model, its data, or no host matched: every device of it fails the same way
        for run in runs.values():
            run.error, run.hint, run.exit_code = exc.message, exc.hint or None, exc.exit_code
        return list(runs.values())
    _collect(runs, fleet)
    for run in runs.values():
        if not run.records and not run.error:
            run.error, run.hint, run.exit_code = f"{run.device}: Ansible reported nothing for this host", f"check that {config.inventory} names it: ansible-inventory -i {config.inventory} --list", EXIT_DEVICE
    return list(runs.values())


def _collect(runs: dict[str, Run], fleet: Any) -> None:
    """Each device's outcome into its run: the records and the gated one, or the error."""
    for outcome in fleet.outcomes:
        run = runs.get(outcome.device)
        if run is None:
            continue
        run.seconds = outcome.duration_s
        if not outcome.succeeded:
            run.error, run.hint, run.exit_code, run.unreachable = outcome.error, outcome.hint, outcome.exit_code, outcome.unreachable
            continue
        result = outcome.value
        run.records = [{"id": rid, **r} for r, rid in zip(result.records, result.run_ids)]
        run.record = gated_record(run.records) if run.records else None


def pick_baseline(store: ResultsStore, baseline: Baseline, record: dict, *, exclude: set[int] = frozenset()) -> tuple[dict | None, str]:
    """The run ``record`` is gated against, and a note saying which it is or that there is none yet:
    the newest candidate of the same model name, target, device and variant that is comparable
    (a changed model is, as against the main branch's run) and not one of this job's runs."""
    from edgekit.bench.compare import (
        baseline_for,
        default_baseline,
        other_threads,
        read_records,
        resolve,
    )

    like = {"model": record["model_name"], "target": record["target"], "device": record["device"], "variant": record["agent"]["variant"]}
    if baseline.kind == "default":
        candidates = [r] if (r := default_baseline(store, record, exclude=sorted(exclude))) else []
    elif baseline.kind == "latest":  # passing runs only: a failed run is never a baseline
        candidates = store.records(limit=50, branch=baseline.branch, outcome="pass", **like)
    elif baseline.kind == "tag":
        try:
            candidates = [resolve(f"tag:{baseline.name}", store, like=record, exclude=sorted(exclude))]
        except ResultsError as exc:
            return None, f"no baseline: {exc.message}"
    elif baseline.kind == "ids":
        candidates = []
        for run_id in baseline.ids:
            try:
                candidates.append(store.get(run_id))
            except ResultsError:  # an id of another store: not this run's baseline
                continue
    else:  # an export file: its runs that did not fail their gates
        kept = [r for r in read_records(baseline.file) if r.get("outcome") not in ("fail", "inconclusive")]
        candidates = sorted(kept, key=lambda r: r["created"], reverse=True)
    r = baseline_for(candidates, record, exclude)
    if r is None:
        why = other_threads(store, record, exclude, "threads =")
        return None, f"no baseline yet ({baseline.describe()}){'; ' + why if why else ''}"
    where = f"{baseline.file.name} " if baseline.kind == "file" else ""
    vcs = r.get("vcs") or {}
    commit = f" at {vcs['commit'][:10]}" if vcs.get("commit") else ""
    branch = f" on {vcs['branch']}" if vcs.get("branch") else ""
    failed = " (a run whose gates failed: named by id)" if r.get("outcome") == "fail" else ""
    return r, f"{where}{'run ' + str(r['id']) if r.get('id') is not None else 'record'}{commit}{branch} of {r['created'][:19]}{failed}"
