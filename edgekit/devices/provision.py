"""Provision: install the runtime a plan needs into an edgekit-owned environment on the device.

Layout under the device's workdir (the transport's ``root``)::

    venv/                 python -m venv --system-site-packages --without-pip (the system's
                          numpy, apt runtimes and pip stay visible); without the venv module:
                          venv/site (pip --target) and venv/bin/python, a launcher that adds it
    wheelhouse/           wheels the host downloaded for the device, when it could not

The device first tries ``pip install`` from the registry itself. When that fails for want of
the network (or the device has no pip), the host downloads wheels for the device's platform
(arch, glibc's manylinux tags, CPython version and ABI, all from the device's facts), pushes
them (content-addressed: a wheel already there is not sent again) and the device installs
them with ``--no-index``; pip itself comes along when the device has none.

Once ``venv/bin/python`` exists, ``use_provisioned_python(transport)`` points the transport's
``python`` at it; preflight (and so deploy) and every command that opens a device through
``edgekit.devices.connect`` do that, so the agent runs with the provisioned runtime.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.agentclient import device_facts
from edgekit.errors import DeviceError, UsageError
from edgekit.fsutil import sha256_file
from edgekit.jsonable import fields_dict
from edgekit.transport.base import CommandResult, Transport

# --runtime NAME -> the pip packages that provide it, and the facts key that shows it
RUNTIMES: dict[str, tuple[tuple[str, ...], str]] = {
    "onnxruntime": (("onnxruntime",), "onnxruntime"),
    "openvino": (("openvino",), "openvino"),
    "tflite": (("ai-edge-litert",), "ai_edge_litert"),
    "numpy": (("numpy",), "numpy"),
}
VENV = "venv"
WHEELHOUSE = "wheelhouse"
_MANYLINUX_FIRST = 17  # manylinux2014 == manylinux_2_17: the oldest tag current wheels carry
# pip's words when it could not reach an index (or found nothing there at all).
_OFFLINE = re.compile(
    r"from versions: none|NewConnectionError|Failed to establish a new connection|Connection refused|"
    r"Name or service not known|Temporary failure in name resolution|Network is unreachable|No route to host|"
    r"timed out|ConnectTimeout|ProxyError|SSLError|not a trusted or secure host|Max retries exceeded",
    re.IGNORECASE,
)


class ProvisionError(DeviceError):
    pass


@dataclass
class ProvisionResult:
    device: str
    runtime: str | None
    packages: tuple[str, ...]
    python: str  # the interpreter the agent now runs with
    layout: str  # "venv" or "target" (pip --target + launcher) or "system" (already there)
    source: str  # "present" | "registry" (the device's pip) | "host" (wheels pushed)
    reason: str | None = None  # why the device could not install from the registry itself
    wheels: list[str] = field(default_factory=list)
    bytes_sent: int = 0
    wheels_skipped: int = 0
    versions: dict[str, str | None] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"schema": 1, "kind": "edgekit.provision", **fields_dict(self), "duration_s": round(self.duration_s, 3)}


def provisionable(backend: str) -> str | None:
    """The ``--runtime`` that gives ``backend`` its runtime, or None (e.g. tensorrt: JetPack's)."""
    return backend if backend in RUNTIMES else None


def venv_python(transport: Transport) -> str:
    return posixpath.join(transport.root, VENV, "bin", "python")


def use_provisioned_python(transport: Transport, *, again: bool = False) -> bool:
    """Point ``transport.python`` at edgekit's venv on the device when there is one. Asked once per
    connection (connect and preflight both want it), unless ``again`` (a venv may just have been made)."""
    path = venv_python(transport)
    if transport.python == path:
        return True
    if not again and _NO_VENV.get(transport) == path:
        return False
    if transport.run(["test", "-x", path], timeout=60, check=False).returncode == 0:
        transport.python = path
        return True
    _NO_VENV[transport] = path
    return False


_NO_VENV: weakref.WeakKeyDictionary[Transport, str] = weakref.WeakKeyDictionary()  # connections found without a venv


def provision(
    transport: Transport,
    runtime: str | None = None,
    *,
    packages: tuple[str, ...] | list[str] = (),
    offline: bool = False,
    device: str | None = None,
    events: Any = None,
    facts: dict | None = None,
    lock_wait: float = 0.0,
    timeout: float = 1800.0,
) -> ProvisionResult:
    """Install ``runtime`` (onnxruntime, openvino, tflite, numpy) and ``packages`` on the device.

    ``offline``: don't let the device try the registry; wheels come from the host. Holds the
    device lock while it installs. Raises ProvisionError when nothing worked, with pip's words.
    """
    from edgekit.devices.lock import device_lock

    if runtime is not None and runtime not in RUNTIMES:
        raise UsageError(f"unknown runtime '{runtime}'", f"choose one of: {', '.join(RUNTIMES)}")
    pkgs = tuple(dict.fromkeys((RUNTIMES[runtime][0] if runtime else ()) + tuple(packages)))
    if not pkgs:
        raise UsageError("nothing to provision", f"give --runtime ({', '.join(RUNTIMES)})")
    for p in pkgs:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._\-\[\],<>=!~ ]*", p):
            raise UsageError(f"not a package requirement: {p!r}", "give a name like onnxruntime or numpy>=1.24")
    name = device or transport.name
    say = events.info if events is not None else (lambda _msg: None)
    start = time.monotonic()
    with device_lock(transport, wait=lock_wait, on_wait=say):
        use_provisioned_python(transport, again=True)
        seen_by = ((facts or {}).get("probe") or {}).get("python", {}).get("executable")
        if facts is None or seen_by != transport.python:  # facts of another interpreter
            facts = device_facts(transport)
        key = RUNTIMES[runtime][1] if runtime else None
        if key and not packages and (facts.get("device") or {}).get("runtimes", {}).get(key):
            version = facts["device"]["runtimes"][key]
            say(f"{runtime} {version} is already on {name} ({transport.python})")
            return ProvisionResult(name, runtime, pkgs, transport.python, "system", "present",
                                   versions={key: version}, duration_s=time.monotonic() - start)  # fmt: skip
        env = _Env.create(transport, facts, say)
        result = ProvisionResult(name, runtime, pkgs, env.python, env.layout, "registry")
        reason = "--offline" if offline else None
        if reason is None and not env.has_pip:
            reason = "the device has no pip"
        if reason is None:
            say(f"installing {' '.join(pkgs)} on {name} from the registry (the device's pip)")
            r = env.pip_install(pkgs, timeout=timeout)
            if r.returncode != 0:
                words = _pip_tail(r)
                if not _OFFLINE.search(r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")):
                    raise ProvisionError(
                        f"pip on {name} could not install {' '.join(pkgs)}: {words}",
                        f"run it by hand on the device to see everything: {r.command}",
                    )
                reason = f"the device's pip could not get them from the registry ({words})"
        if reason is not None:
            say(f"{reason}: downloading wheels on this host for {env.platform_text}")
            result.source, result.reason = "host", reason
            _install_from_host(transport, env, pkgs, result, say, timeout)
        after = device_facts(transport)
        result.versions = dict((after.get("device") or {}).get("runtimes") or {})
        if key and not result.versions.get(key):
            raise ProvisionError(
                f"{' '.join(pkgs)} installed on {name}, but the agent ({transport.python}) does not see {key}",
                f"check the environment by hand: {transport.python} -m pip list",
            )
        result.duration_s = time.monotonic() - start
        return result


# -- the environment on the device ----------------------------------------------------------


@dataclass
class _Env:
    transport: Transport
    base: str  # the interpreter the environment was made from
    python: str  # edgekit's interpreter (venv/bin/python, or the launcher)
    layout: str  # venv | target
    has_pip: bool
    facts: dict

    @property
    def site(self) -> str:
        return posixpath.join(self.transport.root, VENV, "site")

    @property
    def wheelhouse(self) -> str:
        return posixpath.join(self.transport.root, WHEELHOUSE)

    @property
    def platform_text(self) -> str:
        d = self.facts.get("device") or {}
        libc = (self.facts.get("probe") or {}).get("libc") or {}
        return f"{d.get('arch')}, CPython {d.get('python')}, {libc.get('name') or 'libc ?'} {libc.get('version') or ''}".rstrip()

    @classmethod
    def create(cls, transport: Transport, facts: dict, say) -> _Env:
        """edgekit's environment on the device, made if missing; ``transport.python`` then points at it."""
        base = ((facts.get("probe") or {}).get("python") or {}).get("executable") or transport.python
        target = venv_python(transport)
        venv_dir = posixpath.join(transport.root, VENV)
        if transport.python == target:  # made before
            env = cls(transport, base, target, "target" if _is_launcher(transport, target) else "venv", False, facts)
        else:
            say(f"creating edgekit's venv on the device: {venv_dir}")
            # --without-pip: the system's pip (a system site package) serves the venv too, and
            # ensurepip is slow and missing on Debian without python3-venv. No pip at all: the
            # host sends pip's wheel.
            made = transport.run([base, "-m", "venv", "--system-site-packages", "--without-pip", venv_dir], timeout=600, check=False)
            env = cls(transport, base, target, "venv" if made.returncode == 0 else "target", False, facts)
            if made.returncode != 0:
                say(f"no venv module on the device ({_pip_tail(made)}): using pip --target {venv_dir}/site")
                env._write_launcher()
            transport.python = target
        env.has_pip = env._pip_works()
        return env

    def _pip_works(self) -> bool:
        python = self.base if self.layout == "target" else self.python
        return self.transport.run([python, "-m", "pip", "--version"], timeout=120, check=False).returncode == 0

    def _write_launcher(self) -> None:
        bindir = posixpath.dirname(self.python)
        self.transport.mkdir(bindir)
        self.transport.mkdir(self.site)
        text = (
            "#!/bin/sh\n"
            "# edgekit: the device's Python with edgekit's packages (pip --target) first on the path\n"
            f"PYTHONPATH={shlex.quote(self.site)}${{PYTHONPATH:+:$PYTHONPATH}}\n"
            "export PYTHONPATH\n"
            f'exec {shlex.quote(self.base)} "$@"\n'
        )
        with tempfile.TemporaryDirectory(prefix="edgekit-launcher-") as tmp:
            local = Path(tmp) / "python"
            local.write_text(text, encoding="utf-8")
            self.transport.put(local, self.python)
        self.transport.run(["chmod", "755", self.python], timeout=60)

    def pip_install(self, pkgs: tuple[str, ...], *, timeout: float, extra: tuple[str, ...] = (), pip: list[str] | None = None) -> CommandResult:
        argv = (pip or ["-m", "pip"]) + [
            "install", "--disable-pip-version-check", "--no-input", "--only-binary=:all:",
            "--retries", "1", "--timeout", "20", *extra, *pkgs,
        ]  # fmt: skip
        if self.layout == "target":  # pip --target: the launcher's directory, with the base interpreter
            return self.transport.run([self.base, *argv, "--target", self.site], timeout=timeout, check=False)
        return self.transport.run([self.python, *argv], timeout=timeout, check=False)


def _is_launcher(transport: Transport, path: str) -> bool:
    r = transport.run(["head", "-c", "9", path], timeout=60, check=False)
    return r.returncode == 0 and r.stdout.startswith(b"#!/bin/sh")


# -- wheels from the host ---------------------------------------------------------------------


def platform_args(facts: dict) -> list[str]:
    """``pip download`` options that select wheels for the device: platform tags, Python, ABI.

    Every manylinux tag up to the device's glibc is listed: given only the newest, pip would
    silently pick old releases built for older tags.
    """
    d = facts.get("device") or {}
    probe = facts.get("probe") or {}
    arch = str(d.get("arch") or "")
    machine = {"arm64": "aarch64", "amd64": "x86_64", "armv8l": "armv7l"}.get(arch, arch)
    impl = (probe.get("python") or {}).get("implementation", "CPython")
    if impl != "CPython":
        raise ProvisionError(f"the device runs {impl}; edgekit downloads wheels for CPython only", "provision with the device's own pip")
    match = re.match(r"(\d+)\.(\d+)", str(d.get("python") or ""))
    if not match or not machine:
        raise ProvisionError("the device's facts do not say its CPU architecture and Python version", "check the agent runs there: edgekit devices check DEVICE")
    py = f"{match.group(1)}{match.group(2)}"
    libc = probe.get("libc") or {}
    tags: list[str] = []
    version = re.match(r"(\d+)\.(\d+)", str(libc.get("version") or ""))
    if libc.get("name") == "glibc" and version and int(version.group(1)) == 2:
        newest = int(version.group(2))
        if machine == "x86_64":
            tags += ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux_2_5_x86_64", "manylinux_2_12_x86_64"]
        tags.append(f"manylinux2014_{machine}")
        tags += [f"manylinux_2_{n}_{machine}" for n in range(_MANYLINUX_FIRST, newest + 1)]
    elif libc.get("name") == "musl":
        tags += [f"musllinux_1_{n}_{machine}" for n in (1, 2)]
    tags.append(f"linux_{machine}")
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", f"{match.group(1)}.{match.group(2)}", "--abi", f"cp{py}"]
    return args + [arg for tag in tags for arg in ("--platform", tag)]


def download_wheels(facts: dict, pkgs: tuple[str, ...], dest: Path, timeout: float = 1800.0) -> list[Path]:
    """Download wheels of ``pkgs`` and their dependencies for the device into ``dest`` (on the host)."""
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
            *platform_args(facts), "-d", str(dest), *pkgs]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ProvisionError(f"downloading wheels on this host took over {timeout:g}s", "check the host's access to the package registry") from None
    if proc.returncode != 0:
        text = proc.stderr.decode(errors="replace")
        tail = " | ".join([ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")][-3:])
        raise ProvisionError(
            f"this host could not download wheels of {' '.join(pkgs)} for the device: {tail}",
            "the package may have no wheel for the device's platform and Python; see: " + shlex.join(argv),
        )
    return sorted(dest.glob("*.whl"))


def _install_from_host(transport: Transport, env: _Env, pkgs: tuple[str, ...], result: ProvisionResult, say, timeout: float) -> None:
    # Without pip on the device, pip runs from its own wheel (a zip on sys.path), pushed along
    # and kept in the wheelhouse for next time; it is not installed (slow on a small board).
    want = pkgs + (() if env.has_pip else ("pip",))
    with tempfile.TemporaryDirectory(prefix="edgekit-wheels-") as tmp:
        wheels = download_wheels(env.facts, want, Path(tmp), timeout)
        transport.mkdir(env.wheelhouse)
        for wheel in wheels:
            remote = posixpath.join(env.wheelhouse, wheel.name)
            if transport.sha256(remote) == sha256_file(wheel):
                result.wheels_skipped += 1
            else:
                transport.put(wheel, remote)
                result.bytes_sent += wheel.stat().st_size
            result.wheels.append(wheel.name)
        say(f"pushed {len(wheels) - result.wheels_skipped} wheel(s), {result.bytes_sent / 1e6:.1f} MB ({result.wheels_skipped} already there)")
        pip = None
        if not env.has_pip:
            pip_wheel = next((w.name for w in wheels if w.name.startswith("pip-")), None)
            if pip_wheel is None:
                raise ProvisionError("the host's download has no pip wheel for the device", "provision again; check the host's registry access")
            pip = [posixpath.join(env.wheelhouse, pip_wheel, "pip")]
        r = env.pip_install(pkgs, timeout=timeout, extra=("--no-index", "--find-links", env.wheelhouse), pip=pip)
    if r.returncode != 0:
        raise ProvisionError(
            f"installing the pushed wheels on {result.device} failed: {_pip_tail(r)}",
            f"run it by hand on the device to see everything: {r.command}",
        )


def _pip_tail(r: CommandResult) -> str:
    text = (r.stderr or b"").decode(errors="replace") or (r.stdout or b"").decode(errors="replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return " | ".join((errors or lines)[-2:]) or f"exit code {r.returncode}"
