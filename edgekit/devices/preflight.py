"""Preflight: is this device what the profile (and the plan) says it is? Checked before any push.

``preflight(transport, profile, plan)`` runs the agent's ``facts`` on the device and compares:
architecture, the ISA features the profile promises (an rpi5 profile on a board without
``asimddp``), CPU model and core count (warnings), a runtime for the profile's backends (or
the plan's) with versions inside the profile's bounds and, for OpenVINO, the plugin device,
memory and free disk in the workdir against the bundle. Every verdict says what is missing or
mismatched and what to do about it (``edgekit devices provision DEVICE --runtime ...``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.agent import provision_hint
from edgekit.agentclient import device_facts
from edgekit.errors import DeviceError, EdgekitError, ProfileError
from edgekit.jsonable import FieldsDict
from edgekit.profiles import Profile, list_profiles
from edgekit.targets import get_backend
from edgekit.targets.base import runtime_version
from edgekit.transport.base import Transport

OK, WARN, FAIL = "ok", "warn", "fail"
MIB = 1 << 20
# The runtime holds the model and a working copy (packed weights, arena): the bundle's size
# twice over is the least memory a run needs; more is normal, less fails.
MEMORY_FACTOR = 2.0
DISK_MARGIN = 16 * MIB  # the agent, results, temp names during a push
LOW_DISK = 64 * MIB  # without a bundle to measure against, less free space than this is a warning


class PreflightError(DeviceError):
    """The device does not match its profile or plan (exit code 4)."""


@dataclass(frozen=True)
class Check(FieldsDict):
    name: str  # arch, isa, cpu, cores, python, runtime, memory, disk
    status: str  # ok | warn | fail
    detail: str
    hint: str = ""


@dataclass
class PreflightReport:
    device: str  # the name the user gave (inventory name, user@host, local)
    transport: str  # the transport's name (local, ssh:user@host:port)
    profile: str
    facts: dict[str, Any]  # the agent's facts document ({"device": ..., "probe": ...})
    python: str  # the interpreter the agent runs with on the device
    checks: list[Check] = field(default_factory=list)
    runtime_to_provision: str | None = None  # what `devices provision --runtime` would fix

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == WARN]

    @property
    def only_runtime_missing(self) -> bool:
        return bool(self.failures) and all(c.name == "runtime" for c in self.failures) and self.runtime_to_provision is not None

    def raise_for_failures(self) -> None:
        """PreflightError listing every failed check (hint: the first failure's)."""
        if self.ok:
            return
        detail = "; ".join(f"{c.name}: {c.detail}" for c in self.failures)
        raise PreflightError(
            f"preflight failed on {self.device} (profile {self.profile}): {detail}",
            next((c.hint for c in self.failures if c.hint), "run `edgekit devices check DEVICE --target PROFILE`"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "kind": "edgekit.preflight",
            "device": self.device,
            "transport": self.transport,
            "profile": self.profile,
            "ok": self.ok,
            "python": self.python,
            "checks": [c.to_dict() for c in self.checks],
            "runtime_to_provision": self.runtime_to_provision,
            "facts": self.facts,
        }


def preflight(
    transport: Transport,
    profile: Profile,
    plan: Any = None,
    *,
    device: str | None = None,
    bundle_bytes: int | None = None,
    facts: dict | None = None,
    bundle: bool = False,
) -> PreflightReport:
    """Probe the device and check it against ``profile`` and, when given, ``plan``.

    Uses edgekit's own venv on the device when one was provisioned (``transport.python`` is
    pointed at it). ``bundle_bytes`` (default: estimated from the plan's model) is checked
    against free disk and memory. ``bundle``: ``plan`` is an existing bundle's (``plan_bundle``):
    its variants' backends are checked as they are. Nothing is raised for a mismatch: see
    ``raise_for_failures``.
    """
    from edgekit.devices.provision import use_provisioned_python, venv_python

    use_provisioned_python(transport)
    facts = facts if facts is not None else device_facts(transport, openvino=profile.backend("openvino") is not None)
    return check_facts(
        profile, plan, facts, device=device or transport.name, transport=transport.name, python=transport.python,
        venv=transport.python == venv_python(transport), bundle_bytes=bundle_bytes, bundle=bundle,
    )  # fmt: skip


def check_facts(
    profile: Profile,
    plan: Any,
    facts: dict,
    *,
    device: str,
    transport: str,
    python: str,
    venv: bool = False,
    bundle_bytes: int | None = None,
    bundle: bool = False,
) -> PreflightReport:
    """The checks of ``preflight`` on facts read already (by Ansible's engine, say); ``python``: the
    interpreter the agent ran with, ``venv``: it is edgekit's venv on the device."""
    d = facts.get("device") or {}
    probe = facts.get("probe") or {}
    if bundle_bytes is None and plan is not None:
        bundle_bytes = estimate_bundle_bytes(plan)
    report = PreflightReport(device, transport, profile.name, facts, python)
    checks = report.checks
    checks += _cpu_checks(profile, d)
    where = (probe.get("python") or {}).get("executable") or python
    checks.append(Check("python", OK, f"Python {d.get('python') or '?'} at {where}" + (" (edgekit's venv)" if venv else "")))
    runtime_check, report.runtime_to_provision = _runtime_check(profile, plan, facts, device, bundle)
    checks += [runtime_check, _memory_check(d, probe, bundle_bytes), _disk_check(probe, bundle_bytes)]
    return report


def ensure_ready(
    transport: Transport,
    profile: Profile,
    plan: Any = None,
    *,
    device: str | None = None,
    provision: bool = False,
    events: Any,
    bundle: Any = None,
) -> PreflightReport:
    """Preflight, provisioning the missing runtime first when asked; raises PreflightError on failure.

    This is what deploy (and bench, with the ``bundle`` it pushes) runs before pushing: its warnings
    go to ``events.warn``.
    """
    size = sum(f.size for f in bundle.manifest.files) if bundle is not None else None
    report = preflight(transport, profile, plan, device=device, bundle_bytes=size, bundle=bundle is not None)
    if provision and report.only_runtime_missing:
        from edgekit.devices.provision import provision as run_provision

        events.info(f"provisioning {report.runtime_to_provision} on {report.device} (deploy --provision)")
        run_provision(transport, report.runtime_to_provision, device=report.device, events=events, facts=report.facts)
        report = preflight(transport, profile, plan, device=device, bundle_bytes=size, bundle=bundle is not None)
    report.raise_for_failures()
    for c in report.warnings:
        events.warn(f"preflight: {c.name}: {c.detail}")
    return report


def estimate_bundle_bytes(plan: Any) -> int | None:
    """The plan's bundle size: the float model, plus about a quarter of it again for int8."""
    try:
        size = Path(plan.model_path).stat().st_size
    except (OSError, AttributeError, TypeError):
        return None
    return int(size * (1.3 if plan.quantize else 1.0))


# -- the checks ------------------------------------------------------------------------------


def _cpu_checks(profile: Profile, d: dict) -> list[Check]:
    from edgekit.profiles.probe import normalize_arch

    raw = str(d.get("arch") or "")
    try:
        arch = normalize_arch(raw)
    except ProfileError:
        return [Check("arch", FAIL, f"the device's CPU architecture is '{raw}', which edgekit does not target", "use an x86_64, aarch64 or armv7l device")]
    isa = list(d.get("isa") or [])
    model = d.get("cpu_model")
    if profile.probe or not profile.cpu.arch:
        return [Check("arch", OK, f"{arch} ({model or 'unknown CPU'}), ISA {' '.join(isa) or 'baseline'}; {profile.name} takes the device's own CPU facts")]
    if arch != profile.cpu.arch:
        fits = matching_profiles(arch, isa, model)
        return [
            Check(
                "arch",
                FAIL,
                f"the device is {arch}, profile {profile.name} is for {profile.cpu.arch}",
                f"pick a profile for this device: --target {fits[0]}" + (f" (or {', '.join(fits[1:4])})" if len(fits) > 1 else "")
                if fits else "pick a profile for this device (edgekit profiles list), or --target linux-cpu",
            )
        ]
    checks = [Check("arch", OK, f"{arch}, as profile {profile.name} says")]
    missing = [f for f in profile.cpu.isa if f not in isa]
    if missing:
        fits = matching_profiles(arch, isa, model)
        checks.append(
            Check(
                "isa",
                FAIL,
                f"profile {profile.name} promises {', '.join(missing)}, which this CPU ({model or 'unknown'}) lacks "
                f"(it has: {' '.join(isa) or 'none of the tracked features'})",
                (f"use a profile this CPU meets: --target {fits[0]}" if fits else "use a profile this CPU meets, or --target linux-cpu")
                + "; code built for the missing features would die with SIGILL",
            )
        )
    else:
        checks.append(Check("isa", OK, f"has {' '.join(profile.cpu.isa) or 'the baseline'} as {profile.name} requires" + (f" (CPU has {' '.join(isa)})" if isa else "")))
    if profile.cpu.core and model and profile.cpu.core != model:
        checks.append(
            Check(
                "cpu",
                WARN,
                f"profile {profile.name} describes a {profile.cpu.core}, the device is a {model}: timings will not be typical of {profile.name}",
            )
        )
    cores = d.get("cores")
    if profile.cpu.cores and isinstance(cores, int) and cores < profile.cpu.cores:
        checks.append(Check("cores", WARN, f"the device has {cores} cores, profile {profile.name} expects {profile.cpu.cores}"))
    return checks


def _runtime_check(profile: Profile, plan: Any, facts: dict, device: str, bundle: bool = False) -> tuple[Check, str | None]:
    """The runtime of every backend the plan would use on the device: ok, warn (not the paper
    plan's backend, another) or fail. ``bundle``: ``plan`` is an existing bundle's, whose variants
    run on the backends they were built for."""
    from edgekit.devices.provision import provisionable

    if bundle:
        pairs = [(v.name, v.backend) for v in plan.variants]
        lacking = _lacking(pairs, profile, facts)
        if lacking:
            return _lacking_check("the bundle cannot run on the device: ", lacking, facts, device)
        return Check("runtime", OK, "the bundle's variants can run: " + ", ".join(f"{v} on {_with_version(b, facts)}" for v, b in pairs)), None
    fmt = plan.model_format if plan is not None else None
    if plan is None:
        names = [b.name for b in profile.backends]
    elif plan.probed or plan.options.backend:
        names = [plan.backend]  # decided with the facts already, or forced with --backend: no other will do
    else:
        # On paper the planner took the first backend that could run; with the device's facts it
        # takes the first whose runtime is there, from the same point of the profile's order on.
        order = [b.name for b in profile.backends]
        names = [plan.backend] + (order[order.index(plan.backend) + 1 :] if plan.backend in order else [])
    reasons: list[str] = []
    candidates: list[str] = []
    kinds: list[str] = []
    for name in names:
        impl = get_backend(name)
        if not impl.implemented or (fmt and fmt not in impl.formats):
            continue
        candidates.append(name)
        verdict = impl.runs_on(profile, facts)
        if verdict.ok:
            what = f"{_with_version(name, facts)} can run"
            # the plan's other variants (native's fp32 reference runs on onnxruntime or numpy) need theirs too
            others = [(v, b) for v, b in planned_variants(name, profile, plan, facts) if b != name]
            lacking = _lacking(others, profile, facts)
            if lacking:
                return _lacking_check(f"{what}, but ", lacking, facts, device)
            what += "".join(f"; the {v} variant runs on {_with_version(b, facts)}" for v, b in others)
            if plan is not None and name != plan.backend:
                return Check("runtime", WARN, f"the plan on paper chose {plan.backend}, which the device lacks ({reasons[0]}); {what}, so deploy runs {name}"), None
            return Check("runtime", OK, what), None
        reasons.append(f"{name}: {'; '.join(verdict.reasons)}")
        kinds.append(verdict.kind)
    if not candidates:
        return Check("runtime", FAIL, f"none of profile {profile.name}'s backends is available in this edgekit version", "pick another --target"), None
    # Provisioning helps only where a runtime is missing, not where it is the wrong version or
    # lacks a device (a driver): those get their own hint.
    missing = [n for n, k in zip(candidates, kinds) if k == "missing"]
    runtime = next((r for r in (provisionable(n) for n in missing if "onnx" in get_backend(n).formats) if r), None)
    runtime = runtime or next((r for r in (provisionable(n) for n in missing) if r), None)
    if runtime:
        hint = _provision_hint(runtime, device, facts)
    elif kinds and kinds[0] == "version":
        hint = "install a runtime version inside the profile's bounds on the device, or use a profile written for the version it has"
    elif kinds and kinds[0] == "device":
        hint = "install the device's driver and the runtime's plugin for it, or use a profile for the devices the runtime sees"
    else:
        hint = "install the runtime on the device, or pick another --target"
    return Check("runtime", FAIL, "no runtime for this profile on the device: " + "; ".join(reasons), hint), runtime


def planned_variants(backend: str, profile: Profile, plan: Any, facts: dict | None) -> list[tuple[str, str]]:
    """(variant, backend that runs it) of a plan made for ``backend`` on the device, as the planner
    decides them: quantized, the float reference and int8; else the one variant. Without a
    ``plan`` (devices check), a deploy of an ONNX model with the profile's defaults."""
    impl = get_backend(backend)
    spec = profile.backend(backend)
    int8 = impl.scheme is not None and (spec is None or not spec.precisions or "int8" in spec.precisions)
    if plan is not None:
        int8 = plan.quantize if backend == plan.backend else int8 and plan.options.quantize and plan.model_format == "onnx"
        if not int8 and backend == plan.backend:
            return [(v.name, v.backend) for v in plan.variants]
    names = ("fp32", "int8") if int8 else (next((p for p in (spec.precisions if spec else ()) if p != "int8"), "fp32"),)
    return [(v, impl.variant_backend(v, facts)) for v in names]


def _lacking(pairs: list[tuple[str, str]], profile: Profile, facts: dict) -> list[tuple[str, str, Any]]:
    """The (variant, backend, verdict) of each pair whose backend cannot run on the device."""
    out = []
    for v, b in pairs:
        verdict = get_backend(b).runs_on(profile, facts)
        if not verdict.ok:
            out.append((v, b, verdict))
    return out


def _lacking_check(prefix: str, lacking: list[tuple[str, str, Any]], facts: dict, device: str) -> tuple[Check, str | None]:
    from edgekit.devices.provision import provisionable

    detail = prefix + "; ".join(f"the {v} variant runs on {b}: {'; '.join(verdict.reasons)}" for v, b, verdict in lacking)
    runtime = next((r for r in (provisionable(b) for _, b, verdict in lacking if verdict.kind == "missing") if r), None)
    hint = _provision_hint(runtime, device, facts) if runtime else "install the runtime on the device, or pick another --target"
    return Check("runtime", FAIL, detail, hint), runtime


def _provision_hint(runtime: str, device: str, facts: dict) -> str:
    """The provision command; on a PEP 668 Python, also why not pip (it refuses the system Python)."""
    python = ((facts.get("probe") or {}).get("python") or {})
    managed = f"; {python.get('executable') or 'its Python'} is externally managed (PEP 668), so pip would refuse it" if python.get("externally_managed") else ""
    return provision_hint(runtime, device) + managed


def _with_version(backend: str, facts: dict) -> str:
    impl = get_backend(backend)
    version = runtime_version(facts, *impl.runtimes) if impl.runtimes else None
    return f"{backend} ({' / '.join(impl.runtimes)} {version})" if version else backend


def _memory_check(d: dict, probe: dict, bundle_bytes: int | None) -> Check:
    total = d.get("memory_bytes")
    available = probe.get("memory_available_bytes")
    have = available if isinstance(available, int) else total
    if not isinstance(have, int):
        return Check("memory", WARN, "the device's memory could not be read")
    text = f"{_mb(have)} available" if isinstance(available, int) else f"{_mb(have)} total"
    if bundle_bytes:
        need = int(bundle_bytes * MEMORY_FACTOR)
        if have < need:
            return Check(
                "memory",
                FAIL,
                f"{text}; the bundle ({_mb(bundle_bytes)}) needs at least {_mb(need)} to load and run",
                "free memory on the device (stop other services) or use a smaller model",
            )
        return Check("memory", OK, f"{text}, bundle {_mb(bundle_bytes)}")
    return Check("memory", OK, text)


def _disk_check(probe: dict, bundle_bytes: int | None) -> Check:
    wd = probe.get("workdir") or {}
    free, path = wd.get("free_bytes"), wd.get("path") or "the workdir"
    if wd.get("writable") is False:
        return Check(
            "disk",
            FAIL,
            f"{path} is not writable by the device's user: the bundle cannot land there",
            "point the workdir at a directory that user owns (the inventory's workdir = ..., or the profile's [device] workdir), or fix its permissions",
        )
    if not isinstance(free, int):
        return Check("disk", WARN, f"free space in {path} could not be read")
    if bundle_bytes:
        need = bundle_bytes + DISK_MARGIN
        if free < need:
            return Check(
                "disk",
                FAIL,
                f"{_mb(free)} free in {path}; the bundle needs {_mb(need)}",
                "free space on the device, or point the profile's workdir (or the inventory's) at a bigger filesystem",
            )
        return Check("disk", OK, f"{_mb(free)} free in {path}, bundle {_mb(bundle_bytes)}")
    if free < LOW_DISK:
        return Check("disk", WARN, f"only {_mb(free)} free in {path}")
    return Check("disk", OK, f"{_mb(free)} free in {path}")


def matching_profiles(arch: str, isa: list[str], model: str | None) -> list[str]:
    """Profiles this CPU meets (same arch, every promised ISA feature), best match first."""
    try:
        profiles = list_profiles()
    except EdgekitError:  # a broken user profile must not hide the real problem
        return []
    # A profile with an accelerator promises more than a CPU can show: suggest CPU-only ones.
    fits = [p for p in profiles if not p.probe and not p.accelerator and p.cpu.arch == arch and set(p.cpu.isa) <= set(isa)]
    fits.sort(key=lambda p: (p.cpu.core != model, -len(p.cpu.isa), p.name))
    generic = [p.name for p in profiles if p.name == "linux-cpu"]  # probes the device: fits any CPU
    return [p.name for p in fits] + generic


def fact_rows(report: PreflightReport) -> list[list[str]]:
    """The device's facts as (fact, value) rows for a human table."""
    facts = report.facts
    d = facts.get("device") or {}
    probe = facts.get("probe") or {}
    libc = probe.get("libc") or {}
    wd = probe.get("workdir") or {}
    rows = [
        ["device", f"{report.device} ({report.transport})"],
        ["hostname", str(d.get("hostname") or "-")],
        ["arch", str(d.get("arch") or "-")],
        ["cpu", str(d.get("cpu_model") or "-") + (f" ({d['board']})" if d.get("board") else "")],
        ["isa", " ".join(d.get("isa") or []) or "-"],
        ["cores", str(d.get("cores") or "-")],
        ["memory", _mb(d.get("memory_bytes")) + (f" ({_mb(probe['memory_available_bytes'])} available)" if probe.get("memory_available_bytes") else "")],
        ["disk", f"{_mb(wd.get('free_bytes'))} free in {wd.get('path') or '-'}"],
        ["os", f"{d.get('os') or '-'} (kernel {d.get('kernel') or '-'}, {libc.get('name') or '?'} {libc.get('version') or ''})".rstrip()],
        ["python", f"{d.get('python') or '-'} at {report.python}"],
    ]
    for key, version in (d.get("runtimes") or {}).items():
        rows.append([f"runtime {key}", version or "-"])
    if probe.get("openvino_devices") is not None:
        rows.append(["openvino devices", ", ".join(map(str, probe["openvino_devices"])) or "-"])
    trt = d.get("tensorrt") if isinstance(d.get("tensorrt"), dict) else {}
    for key in ("l4t", "trtexec"):  # Jetson facts, where the agent found them
        if trt.get(key):
            rows.append([f"tensorrt {key}", str(trt[key])])
    return rows


def _mb(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    return f"{n / MIB:.0f} MiB" if n < 10 * 1024 * MIB else f"{n / (1024 * MIB):.1f} GiB"
