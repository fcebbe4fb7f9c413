"""``deploy``, ``bench`` and ``devices check`` over Ansible (``--engine ansible``), one result per host.

The model is loaded, quantized and bundled once on this machine (once per distinct plan: hosts
whose facts give the same plan share one bundle); Ansible runs the per-device part
(``edgekit.devices.ansible``: the probe play, then the deploy play), and each host's agent
documents become records through the same ``execute`` a direct deploy runs (``Measured``), so
they are the records the ssh engine stores, timing aside.

Not over Ansible (refused with a hint): ``--rounds`` above 1 (a later round's threads depend on the
first round's probe), ``--layers error``, ``--provision``, ``--password`` and
``--trust-new-host`` (Ansible's own settings decide how it logs in and which host keys it trusts).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from edgekit.agentclient import bench_args, eval_args, of_variant, parse_agent_output
from edgekit.bundle import MANIFEST, Bundle
from edgekit.deploy import (
    DeployRequest,
    DeployResult,
    Job,
    Measured,
    execute,
    measured_before,
    open_job,
)
from edgekit.devices import DeviceEntry
from edgekit.devices import ansible as engine
from edgekit.devices.fleet import FAILED, OK, DeviceOutcome, FleetResult, safe_name
from edgekit.devices.lock import DEFAULT_TTL, describe_holder, holder_info
from edgekit.devices.preflight import PreflightReport, check_facts
from edgekit.errors import EXIT_DEVICE, EdgekitError, GateError, UsageError
from edgekit.events import DeviceEvents, Events
from edgekit.fsutil import sha256_file
from edgekit.plan import (
    Bench,
    Compile,
    Eval,
    LayerError,
    Plan,
    Quantize,
    WriteBundle,
    bench_config,
    plan_bundle,
    replan,
)
from edgekit.profiles import Profile, list_profiles, load_profile
from edgekit.transport.agentzip import build_agent_zip
from edgekit.transport.push import PushResult

BENCH_TIMEOUT_S = 900  # as bench_variant's
EVAL_TIMEOUT_S = 3600  # as eval_variant's


@dataclasses.dataclass
class Probed:
    """One host after the probe play: where edgekit lives there, and its facts (or why not)."""

    name: str
    profile: str = ""
    where: dict = dataclasses.field(default_factory=dict)  # root, python, venv, agent
    facts: dict | None = None
    lock: dict | None = None  # the lock's status (devices check)
    error: tuple[str, str] | None = None
    unreachable: bool = False  # Ansible could not reach it
    seconds: float = 0.0


def probe(inventory: Path, strategy: engine.Strategy, *, target: str | None, default_target: str, with_lock: bool, sink: Any) -> list[Probed]:
    """The probe play over the hosts ``strategy.limit`` selects; one ``Probed`` per host."""
    names = {p.name: p for p in list_profiles()}
    profiles = {n: _profile_vars(p) for n, p in names.items()}
    if target is not None:
        profiles[target] = _profile_vars(load_profile(target))  # a name or a path, as given
    with tempfile.TemporaryDirectory(prefix="edgekit-agent-") as tmp:
        agent = build_agent_zip(Path(tmp))
        extravars = {"edgekit": {
            "target": target or "", "default_target": default_target, "profiles": profiles, "where": engine._WHERE,
            "agent_local": str(agent), "agent_name": agent.name,
        }}  # fmt: skip
        sink.info(f"ansible: probing the hosts of {inventory}" + (f" matching {strategy.limit!r}" if strategy.limit else "") + f" ({strategy.forks} at a time)")
        play = engine.run_play(engine.probe_play(with_lock), inventory, extravars=extravars, limit=strategy.limit, forks=strategy.forks)
    if not play.hosts:
        raise engine.no_hosts_error(play, inventory, strategy.limit)
    out = []
    for name, run in play.hosts.items():
        p = Probed(name, seconds=run.seconds)
        settings = run.last("edgekit: settings")
        if settings is not None:
            ek = (settings.get("ansible_facts") or {}).get("ek") or {}
            p.profile, p.where = str(ek.get("profile") or ""), {k: ek.get(k) for k in ("root", "python", "venv", "agent")}
            p.where["venv"] = str(p.where.get("venv")).lower() == "true"
        if not run.ok:
            p.error, p.unreachable = engine.failure_reason(run), run.unreachable is not None
        else:
            try:
                p.facts = parse_agent_output(engine.agent_result(run.last("edgekit: facts") or {}), kind="edgekit.facts", device=name)
                if with_lock:
                    p.lock = json.loads(str((run.last("edgekit: lock status") or {}).get("stdout") or "{}"))
            except (EdgekitError, ValueError) as exc:
                p.error = (f"{name}: {getattr(exc, 'message', exc)}", getattr(exc, "hint", "") or "run edgekit devices check on it")
        out.append(p)
    return out


def _profile_vars(p: Profile) -> dict:
    return {"workdir": p.workdir, "python": p.python, "openvino": p.backend("openvino") is not None}


def check_fleet(inventory: Path, strategy: engine.Strategy, *, target: str | None, sink: Any) -> FleetResult[dict]:
    """``devices check`` of every host the strategy selects: the preflight report (and lock) of each."""
    result: FleetResult[dict] = FleetResult()
    for p in probe(inventory, strategy, target=target, default_target="linux-cpu", with_lock=True, sink=sink):
        if p.error is not None:
            result.outcomes.append(DeviceOutcome(p.name, FAILED, None, p.error[0], p.error[1], EXIT_DEVICE, p.seconds, unreachable=p.unreachable))
            continue
        report = _report(p, load_profile(p.profile), None)
        value = {**report.to_dict(), "lock": p.lock}
        if report.ok:
            result.outcomes.append(DeviceOutcome(p.name, OK, value, duration_s=p.seconds))
        else:
            try:
                report.raise_for_failures()
            except EdgekitError as exc:
                result.outcomes.append(DeviceOutcome(p.name, FAILED, value, exc.message, exc.hint, exc.exit_code, p.seconds))
    return result


def _report(p: Probed, profile: Profile, plan: Plan | None) -> PreflightReport:
    return check_facts(profile, plan, p.facts or {}, device=p.name, transport=f"ansible:{p.name}", python=str(p.where.get("python")), venv=bool(p.where.get("venv")))


# -- deploy ------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Host:
    probed: Probed
    job: Job | None  # None: a bench of a bundle that exists already
    plan: Plan
    group: int = -1


def deploy_fleet(req: DeployRequest, inventory: Path, strategy: engine.Strategy, *, target: str | None, sink: Any) -> FleetResult[DeployResult]:
    """``req`` deployed to every host the strategy selects, over Ansible; one outcome per host."""
    check_options(req)
    job = open_job(dataclasses.replace(req, device=DeviceEntry("ansible", "ansible", source=str(inventory))))
    outcomes: dict[str, DeviceOutcome] = {}
    hosts: dict[str, _Host] = {}
    profiles: dict[str, Profile] = {}
    for p in probe(inventory, strategy, target=target, default_target="local", with_lock=False, sink=sink):
        if p.error is not None:
            outcomes[p.name] = DeviceOutcome(p.name, FAILED, None, p.error[0], p.error[1], EXIT_DEVICE, p.seconds, unreachable=p.unreachable)
            continue
        profile = profiles.setdefault(p.profile, load_profile(p.profile))
        one = dataclasses.replace(job, device=DeviceEntry(p.name, f"ansible:{p.name}", profile=p.profile, source=str(inventory)), profile=profile)
        paper = one.plan()
        report = _report(p, profile, paper)
        try:
            report.raise_for_failures()
        except EdgekitError as exc:
            outcomes[p.name] = DeviceOutcome(p.name, FAILED, None, exc.message, exc.hint, exc.exit_code, p.seconds)
            continue
        events = DeviceEvents(sink, p.name)
        for c in report.warnings:
            events.warn(f"preflight: {c.name}: {c.detail}")
        plan = replan(paper, one.model, profile, p.facts)
        plan = dataclasses.replace(plan, notes=one.notes + plan.notes)
        _refuse_plan(plan)
        for note in plan.notes:
            events.info(f"note: {note}")
        hosts[p.name] = _Host(p, one, plan)
        outcomes[p.name] = DeviceOutcome(p.name, FAILED, None, "not deployed", None, EXIT_DEVICE, p.seconds)  # replaced below
    order = list(outcomes)
    if hosts:
        with tempfile.TemporaryDirectory(prefix="edgekit-ansible-") as tmp:
            _deploy(req, job, hosts, outcomes, strategy, inventory, Path(tmp), sink)
    return FleetResult([outcomes[n] for n in order])


def bench_fleet(bundle: Bundle, req: DeployRequest, variants: list[str], inventory: Path, strategy: engine.Strategy, *, target: str | None,
                sink: Any) -> FleetResult[DeployResult]:  # fmt: skip
    """``bench`` of a bundle that exists already on every host the strategy selects, over Ansible:
    pushed where missing, ``variants`` timed under each device's lock, the runs stored per host."""
    check_options(req)
    profile = load_profile(target or bundle.manifest.profile)
    config = bench_config(profile.bench, req)
    outcomes: dict[str, DeviceOutcome] = {}
    hosts: dict[str, _Host] = {}
    for p in probe(inventory, strategy, target=target or bundle.manifest.profile, default_target=profile.name, with_lock=False, sink=sink):
        if p.error is not None:
            outcomes[p.name] = DeviceOutcome(p.name, FAILED, None, p.error[0], p.error[1], EXIT_DEVICE, p.seconds, unreachable=p.unreachable)
            continue
        plan = plan_bundle(bundle.manifest, profile, device=p.name, variants=variants, config=config)
        _refuse_plan(plan)
        try:
            _report(p, profile, plan).raise_for_failures()
        except EdgekitError as exc:
            outcomes[p.name] = DeviceOutcome(p.name, FAILED, None, exc.message, exc.hint, exc.exit_code, p.seconds)
            continue
        hosts[p.name] = _Host(p, None, plan, group=0)
        outcomes[p.name] = DeviceOutcome(p.name, FAILED, None, "not benched", None, EXIT_DEVICE, p.seconds)  # replaced below
    order = list(outcomes)
    if hosts:
        sink.info(f"ansible: benching {bundle.manifest.model_name} ({', '.join(variants)}) on {len(hosts)} host(s)")
        with tempfile.TemporaryDirectory(prefix="edgekit-ansible-") as tmp:
            _measure(req, hosts, [bundle], None, outcomes, strategy, inventory, Path(tmp), sink)
    return FleetResult([outcomes[n] for n in order])


def check_options(req: DeployRequest) -> None:
    """Refuse what the ansible engine does not run (a UsageError naming the flag and the way out)."""
    for given, flag in ((req.layer_error, "--layers error"), (req.provision, "--provision"), (req.password is not None, "--password"),
                        (req.trust_new_host, "--trust-new-host"), ((req.rounds or 1) > 1, "--rounds above 1")):  # fmt: skip
        if given:
            raise UsageError(
                f"{flag} is not supported by the ansible engine",
                "use --engine ssh for it" + (", or trust the hosts' keys in known_hosts (ssh-keyscan, then check them)" if flag == "--trust-new-host" else ""),
            )


def _refuse_plan(plan: Plan) -> None:
    if any(isinstance(s, LayerError) for s in plan.steps) or any(isinstance(s, Bench) and s.config.rounds > 1 for s in plan.steps):
        raise UsageError(
            f"profile {plan.profile} times each variant in several rounds (or per-layer error), which the ansible engine does not run",
            "pass --rounds 1, or use --engine ssh",
        )


def _neutral(doc: Any, name: str) -> Any:
    """``doc`` with the device's name blanked wherever it stands as a word (``"to pi07 (...)"``):
    two hosts' plans compare equal when they differ only in whose they are."""
    if isinstance(doc, dict):
        return {k: _neutral(v, name) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_neutral(v, name) for v in doc]
    if isinstance(doc, str):
        return re.sub(rf"(?<![\w.@-]){re.escape(name)}(?![\w.@-])", "\0", doc)
    return doc


def _deploy(req: DeployRequest, job: Job, hosts: dict[str, _Host], outcomes: dict[str, DeviceOutcome], strategy: engine.Strategy,
            inventory: Path, tmp: Path, sink: Any) -> None:  # fmt: skip
    groups: dict[str, list[str]] = {}
    for name, h in hosts.items():
        key = json.dumps(_neutral(h.plan.to_dict(), name), sort_keys=True, default=str)
        groups.setdefault(key, []).append(name)
    built: list[DeployResult] = []
    for i, members in enumerate(groups.values()):
        first = hosts[members[0]]
        base = req.output or Path("edgekit-out") / f"{req.model.stem}-{safe_name(first.plan.profile)}"
        out = base if len(groups) == 1 else base.with_name(f"{base.name}-{i + 1}")
        out.parent.mkdir(parents=True, exist_ok=True)
        label = members[0] if len(members) == 1 else f"{members[0]} and {len(members) - 1} more (ansible)"
        one = dataclasses.replace(first.job, device=dataclasses.replace(first.job.device, name=label), output=out)
        plan = replan(one.plan(), one.model, one.profile, first.probed.facts)
        plan = dataclasses.replace(plan, notes=one.notes + plan.notes)
        sink.info(f"ansible: building the bundle for {label} ({plan.backend}, {plan.profile})")
        built.append(execute(plan, one, None, sink, facts=first.probed.facts, only=(Quantize, Compile, WriteBundle)))
        for name in members:
            hosts[name].group = i
    _measure(req, hosts, [b.bundle for b in built], built, outcomes, strategy, inventory, tmp, sink)


def _measure(req: DeployRequest, hosts: dict[str, _Host], bundles: list[Bundle], built: list[DeployResult] | None, outcomes: dict[str, DeviceOutcome],
             strategy: engine.Strategy, inventory: Path, tmp: Path, sink: Any) -> None:  # fmt: skip
    """The deploy play over ``hosts``: each pushes ``bundles[h.group]`` and runs its plan's Bench
    and Eval steps under the device lock; each host's outcome (records, or why not) into ``outcomes``."""
    requests = {str(i): _store_request(b) for i, b in enumerate(bundles)}  # by group: two groups' manifests differ even where their files do not
    per_host = {}
    for name, h in hosts.items():
        bundle = bundles[h.group]
        remote = f"{h.probed.where['root']}/bundles/{bundle.manifest.bundle_hash}"
        reused = measured_before(h.plan, bundle, h.probed.facts, h.probed.where["agent"])
        steps = [] if reused else _steps(h.plan, remote, tmp / safe_name(name))
        per_host[name] = {"where": h.probed.where, "bundle": str(h.group), "lock": holder_info(), "steps": steps}
    extravars = {"edgekit": {
        "ttl": DEFAULT_TTL, "lock_retries": max(0, math.ceil(req.lock_wait / engine.LOCK_POLL_S)), "hosts": per_host, "bundles": requests,
        "python": sys.executable, "pack": engine.PACK, "unpack": engine.UNPACK, "tmp": str(tmp),
    }}  # fmt: skip
    plays = engine.deploy_play(strategy, max(len(p["steps"]) for p in per_host.values()))
    how = f"{strategy.forks} at a time" + (f", in batches of {strategy.serial}" if strategy.serial else "") + (
        f", stopping when more than {strategy.max_fail}% of a batch fail" if strategy.max_fail is not None else "")  # fmt: skip
    sink.info(f"ansible: deploying to {len(hosts)} host(s) ({how})")
    play = engine.run_play(plays, inventory, extravars=extravars, limit=",".join(hosts), forks=strategy.forks)
    for name, h in hosts.items():
        run = play.hosts.get(name)
        seconds = h.probed.seconds + (run.seconds if run else 0.0)
        if run is None:
            why = f" (more than {strategy.max_fail}% of a batch failed)" if strategy.max_fail is not None else ""
            outcomes[name] = DeviceOutcome(name, FAILED, None, f"{name}: not deployed: Ansible stopped the run before this host{why}",
                                           "fix the failed hosts, or raise --max-fail; then deploy again", EXIT_DEVICE, seconds)  # fmt: skip
            continue
        if not run.ok:
            error, hint = engine.failure_reason(run)
            outcomes[name] = DeviceOutcome(name, FAILED, None, error, hint, EXIT_DEVICE, seconds, unreachable=run.unreachable is not None)
            continue
        try:
            result = _records(req, h, bundles[h.group], built[h.group] if built else None, per_host[name], run, DeviceEvents(sink, name))
        except EdgekitError as exc:
            outcomes[name] = DeviceOutcome(name, FAILED, None, exc.message, exc.hint or None, exc.exit_code, seconds)
            continue
        outcomes[name] = DeviceOutcome(name, OK, result, duration_s=seconds)


def _store_request(bundle: Bundle) -> dict:
    """The store's plan/commit request of ``bundle`` (as ``push_bundle`` sends it), and each object's file here."""
    manifest = bundle.root / MANIFEST
    entries = [(f.path, f.sha256, f.size, bundle.path(f.path)) for f in bundle.manifest.files]
    entries.append((MANIFEST, sha256_file(manifest), manifest.stat().st_size, manifest))
    return {
        "request": {"bundle": bundle.manifest.bundle_hash, "files": [[rel, sha, size] for rel, sha, size, _ in entries], "activate": True, "verify": True},
        "objects": {sha: str(Path(path).resolve()) for _, sha, _, path in entries},  # the pack task runs in Ansible's own directory
        "sizes": {sha: size for _, sha, size, _ in entries},
    }


def _steps(plan: Plan, remote: str, local: Path) -> list[dict]:
    """What the device runs for each Bench and Eval step: the agent's arguments (as a direct deploy's)."""
    steps = []
    for s in plan.steps:
        if isinstance(s, Bench):
            c = s.config
            timeout = max(BENCH_TIMEOUT_S, (c.duration_s or c.min_time_s) + 300) if (c.duration_s is not None or c.min_time_s > 0) else BENCH_TIMEOUT_S
            steps.append({"args": bench_args(remote, s.variant.name, c), "out": "", "local": "", "timeout": int(timeout)})
        elif isinstance(s, Eval):
            args, out = eval_args(remote, s.variant.name, s.samples, threads=s.threads)
            steps.append({"args": args, "out": out, "local": str(local / f"{s.variant.name}.outputs.npz"), "timeout": EVAL_TIMEOUT_S})
    return steps


class _HeldLock:
    """The device lock as the playbook held it: refreshed as each measurement starts and checked after
    the last one on the device (a lost lock failed the host there), released in ``always``."""

    def __init__(self, acquired: dict) -> None:
        self.acquired = acquired

    def ensure_held(self) -> None:
        return None  # checked on the device by the play's "lock check", before the release

    def record(self) -> dict | None:
        broke = self.acquired.get("broke")
        if not broke:
            return None
        return {"broke": describe_holder(broke), "why": str(self.acquired.get("why") or ""), "ended": [e for e in self.acquired.get("ended") or [] if isinstance(e, dict)]}


def _records(req: DeployRequest, h: _Host, bundle: Bundle, built: DeployResult | None, sent: dict, run: engine.HostRun, events: Events) -> DeployResult:
    store = _store_request(bundle)
    plan_res, commit_res = run.last("edgekit: store plan") or {}, run.last("edgekit: store commit") or {}
    missing = list(dict.fromkeys(json.loads(plan_res.get("stdout") or "{}").get("missing") or []))
    done = json.loads(commit_res.get("stdout") or "{}")
    push = PushResult(
        remote_dir=f"{h.probed.where['root']}/bundles/{bundle.manifest.bundle_hash}",
        bytes_sent=sum(store["sizes"][s] for s in missing),
        files_sent=len(missing),
        files_skipped=max(0, len(store["request"]["files"]) - len(missing)),
        duration_s=_between(plan_res.get("start"), commit_res.get("end")),
        current=Path(str(done.get("current") or "")).name or None,
        previous=Path(str(done.get("previous") or "")).name or None,
    )
    if missing:
        events.info(f"pushed over Ansible: {len(missing)} file(s) sent ({push.bytes_sent} bytes), {push.files_skipped} unchanged")
    else:
        events.info("bundle already on the device: nothing to push")
    measured = Measured(push, h.probed.where["agent"], built=built)
    for step, res in zip(sent["steps"], run.every("edgekit: run")):
        variant = step["args"][step["args"].index("--variant") + 1]
        kind = "edgekit.bench" if step["args"][0] == "bench" else "edgekit.eval"
        doc = of_variant(parse_agent_output(engine.agent_result(res), kind=kind, device=h.probed.name), variant, "benchmarked" if kind == "edgekit.bench" else "evaluated")
        if kind == "edgekit.bench":
            measured.benches[variant] = doc
        else:
            measured.evals[variant] = Path(step["local"])
    acquired = json.loads((run.last("edgekit: lock acquire") or {}).get("stdout") or "{}")
    plan = h.plan
    facts = h.probed.facts if h.job is not None else None  # a bench's plan is the bundle's, as ``api.bench_bundle`` runs it
    result = execute(plan, h.job, None, events, facts=facts, bundle=bundle, lock=_HeldLock(acquired), measured=measured)
    v = result.verdict
    if v is not None and plan.options.require_int8 and plan.variant(v.recommended).precision != "int8":
        raise GateError(f"--require-int8: the int8 gate recommends {v.recommended} on {plan.device}: " + "; ".join(v.reasons), "the runs are stored (edgekit results list)")
    return result


def _between(start: Any, end: Any) -> float:
    try:
        fmt = "%Y-%m-%d %H:%M:%S.%f"
        return max(0.0, (datetime.strptime(str(end), fmt) - datetime.strptime(str(start), fmt)).total_seconds())
    except ValueError:
        return 0.0

