"""Preflight and provisioning on a real device: this machine, through the local transport.

Devices that differ from this machine are real interpreters set up the way such devices are:
a bare venv (no runtimes), a Python whose pip or venv module is missing (Debian
minbase), and a device whose pip cannot reach the package index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.agent.facts import parse_cpuinfo
from edgekit.agentclient import device_facts
from edgekit.devices.preflight import PreflightError, preflight
from edgekit.devices.provision import platform_args, provision, use_provisioned_python, venv_python
from edgekit.errors import UsageError
from edgekit.profiles import load_profile
from edgekit.transport.local import LocalTransport
from tests.builders import cpuinfo
from tests.conftest import EXAMPLES, assert_one_line_error
from tests.lab.fixtures import client_home, emulated_boards

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
SMALL = "tomli-w"  # a small pure-Python package on the registry: what provisioning installs in tests

class EnvDevice(LocalTransport):
    """This machine as a device whose environment differs (e.g. its pip cannot reach the index)."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        super().__init__(root)
        self.extra_env = env

    def run(self, argv, *, timeout=600.0, cwd=None, env=None, check=True):
        return super().run(argv, timeout=timeout, cwd=cwd, env={**self.extra_env, **(env or {})}, check=check)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python with nothing installed: no numpy, no runtimes, no pip."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    return str(where / "bin" / "python")


@pytest.fixture(scope="module")
def shadows(tmp_path_factory) -> Path:
    """Modules that fail to import, put first on a device's PYTHONPATH to take them away."""
    root = tmp_path_factory.mktemp("shadows")
    for name in ("pip", "venv"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError('No module named {name} (removed on this device)')\n")
    return root


def _shadowed(shadows: Path, *names: str) -> str:
    path = shadows.parent / ("only-" + "-".join(names))
    path.mkdir(exist_ok=True)
    for name in names:
        if not (path / name).exists():
            (path / name).symlink_to(shadows / name)
    return str(path)


# A probe profile whose one backend needs a runtime on the device (linux-cpu also has native,
# whose runner travels in the bundle, and numpy).
ORT_ONLY = """\
schema = 1
name = "ort-only"
description = "Any Linux host, ONNX Runtime only"
[cpu]
probe = true
[[backends]]
name = "onnxruntime"
device = "CPUExecutionProvider"
precisions = ["int8", "fp32"]
"""


@pytest.fixture
def ort_only(tmp_path) -> str:
    path = tmp_path / "ort-only.toml"
    path.write_text(ORT_ONLY)
    return str(path)


OFFLINE_PIP = {"PIP_INDEX_URL": "http://127.0.0.1:9/", "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": ""}


# -- preflight ----------------------------------------------------------------------------------


def test_preflight_on_this_machine_passes(tmp_path):
    t = LocalTransport(tmp_path / "device")
    report = preflight(t, load_profile("local"))
    assert report.ok, report.failures
    assert [c.name for c in report.checks] == ["arch", "python", "runtime", "memory", "disk"]
    probe = report.facts["probe"]
    assert os.path.realpath(probe["workdir"]["path"]) == os.path.realpath(t.root)
    assert probe["workdir"]["free_bytes"] > 0 and probe["libc"]["name"] == "glibc"
    assert probe["python"]["executable"] == sys.executable
    report.raise_for_failures()
    assert report.to_dict()["kind"] == "edgekit.preflight"


def test_preflight_arch_mismatch_fails_with_a_profile_that_fits(tmp_path):
    report = preflight(LocalTransport(tmp_path / "device"), load_profile("rpi5"), device="pi5")
    arch = next(c for c in report.checks if c.name == "arch")
    assert arch.status == "fail" and "profile rpi5 is for aarch64" in arch.detail
    assert "linux-cpu" in arch.hint
    with pytest.raises(PreflightError) as err:
        report.raise_for_failures()
    assert err.value.exit_code == 4 and err.value.message.startswith("preflight failed on pi5 (profile rpi5): arch:")


def test_preflight_isa_check_with_a_pi4s_cpu(tmp_path):
    # The facts of this device, with the CPU of a Raspberry Pi 4 as the agent reads it.
    t = LocalTransport(tmp_path / "device")
    facts = device_facts(t)
    model, isa = parse_cpuinfo(cpuinfo("rpi4"), "aarch64")
    facts["device"].update(arch="aarch64", cpu_model=model, isa=isa, cores=4)
    rpi5 = preflight(t, load_profile("rpi5"), facts=facts)
    isa_check = next(c for c in rpi5.checks if c.name == "isa")
    assert isa_check.status == "fail" and "promises asimddp, fp16" in isa_check.detail and "cortex-a72" in isa_check.detail
    assert "--target rpi4" in isa_check.hint and "SIGILL" in isa_check.hint
    assert any(c.name == "cpu" and c.status == "warn" for c in rpi5.checks)
    rpi4 = preflight(t, load_profile("rpi4"), facts=facts)
    assert next(c for c in rpi4.checks if c.name == "isa").status == "ok"
    assert not any(c.name == "cpu" for c in rpi4.checks)


def test_preflight_missing_runtime_names_the_provision_command(tmp_path, bare_python, ort_only):
    t = LocalTransport(tmp_path / "device")
    t.python = bare_python
    report = preflight(t, load_profile(ort_only), device="edge7")
    runtime = next(c for c in report.checks if c.name == "runtime")
    assert runtime.status == "fail" and "onnxruntime: onnxruntime is not installed" in runtime.detail
    assert "edgekit devices provision edge7 --runtime onnxruntime" in runtime.hint
    assert report.only_runtime_missing and report.runtime_to_provision == "onnxruntime"


def test_preflight_checks_every_backend_the_plan_uses(tmp_path, bare_python, numpy_python):
    # linux-cpu plans native (ekrt travels in the bundle), whose fp32 reference runs on onnxruntime
    # or numpy: a device with neither passed `devices check`, then deploy failed in the agent.
    t = LocalTransport(tmp_path / "device")
    t.python = bare_python
    report = preflight(t, load_profile("linux-cpu"), device="edge7")
    runtime = next(c for c in report.checks if c.name == "runtime")
    assert runtime.status == "fail", runtime
    assert runtime.detail == "native can run, but the fp32 variant runs on onnxruntime: onnxruntime is not installed on the device"
    assert "edgekit devices provision edge7 --runtime onnxruntime" in runtime.hint and "pip install" not in runtime.hint
    assert report.only_runtime_missing and report.runtime_to_provision == "onnxruntime"
    t.python = numpy_python  # a board with python3-numpy from its OS packages: numpy runs fp32
    runtime = next(c for c in preflight(t, load_profile("linux-cpu"), device="edge7").checks if c.name == "runtime")
    assert runtime.status == "ok" and runtime.detail.startswith("native can run; the fp32 variant runs on numpy (numpy "), runtime


def test_bench_of_a_bundle_checks_its_variants_runtimes_before_pushing(cli, tmp_path, bare_python):
    bundle = tmp_path / "bundle"
    r = cli("deploy", DIGITS, "--no-quantize", "--no-bench", "-o", bundle)  # fp32 on onnxruntime
    assert r.returncode == 0, r.stderr
    (tmp_path / "devices.toml").write_text(f'[devices.edge9]\nssh = "local"\nworkdir = "{tmp_path / "edge9"}"\npython = "{bare_python}"\n')
    r = cli("bench", bundle, "--device", "edge9", "--iterations", "5")
    assert_one_line_error(r, 4, "runtime: the bundle cannot run on the device: the fp32 variant runs on onnxruntime: onnxruntime is not installed")
    assert "hint: install it into edgekit's own venv on the device: edgekit devices provision edge9 --runtime onnxruntime" in r.stderr
    assert not (tmp_path / "edge9" / "bundles").exists()  # stopped before the push (it pushed, then failed in the agent)
    r = cli("bench", bundle, "--iterations", "5", "--json")  # this machine has it
    assert r.returncode == 0, r.stderr


def test_preflight_missing_accelerator_is_not_a_provisioning_job(tmp_path):
    # OpenVINO is installed here, but the profile asks for an NPU it cannot see.
    profile = tmp_path / "npu-here.toml"
    profile.write_text(ORT_ONLY.replace("ort-only", "npu-here").replace('"onnxruntime"', '"openvino"').replace("CPUExecutionProvider", "NPU"))
    report = preflight(LocalTransport(tmp_path / "device"), load_profile(str(profile)))
    runtime = next(c for c in report.checks if c.name == "runtime")
    assert runtime.status == "fail" and "OpenVINO sees devices CPU, not NPU" in runtime.detail
    assert "driver" in runtime.hint and "provision" not in runtime.hint
    assert report.runtime_to_provision is None and not report.only_runtime_missing


def test_preflight_disk_and_memory_against_the_bundle(tmp_path):
    t = LocalTransport(tmp_path / "device")
    free = device_facts(t)["probe"]["workdir"]["free_bytes"]
    report = preflight(t, load_profile("local"), bundle_bytes=free * 2)
    failed = {c.name: c for c in report.failures}
    assert set(failed) >= {"disk"} and "the bundle needs" in failed["disk"].detail
    small = preflight(t, load_profile("local"), bundle_bytes=1 << 20)
    assert small.ok and "bundle 1 MiB" in next(c for c in small.checks if c.name == "disk").detail


def test_preflight_fails_a_workdir_it_cannot_write(tmp_path):
    t = LocalTransport(tmp_path / "device")
    facts = device_facts(t)
    assert facts["probe"]["workdir"]["writable"] is True
    facts["probe"]["workdir"]["writable"] = False  # as a read-only remount reports it (root may write anywhere here)
    report = preflight(t, load_profile("local"), facts=facts)
    disk = next(c for c in report.failures if c.name == "disk")
    assert "is not writable by the device's user" in disk.detail and "workdir" in disk.hint


def test_deploy_stops_at_preflight_before_any_push(cli, tmp_path, bare_python, ort_only):
    # a device whose Python has no runtime: deploy refuses with the provision command as hint
    (tmp_path / "devices.toml").write_text(f'[devices.edge7]\nssh = "local"\nworkdir = "{tmp_path / "edge7"}"\npython = "{bare_python}"\n')
    r = cli("deploy", DIGITS, "--device", "edge7", "--target", ort_only, "--iterations", "5")
    assert_one_line_error(r, 4, "preflight failed on edge7 (profile ort-only): runtime: no runtime for this profile")
    assert "hint: install it into edgekit's own venv on the device: edgekit devices provision edge7 --runtime onnxruntime" in r.stderr
    assert not (tmp_path / "edge7" / "bundles").exists()


@pytest.fixture(scope="module")
def numpy_python(tmp_path_factory) -> str:
    """A Python with numpy and nothing else (a board with python3-numpy from its OS packages)."""
    import numpy

    root = tmp_path_factory.mktemp("numpy-only")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, capture_output=True)
    (root / "lib").mkdir()
    src = Path(numpy.__file__).parent
    for path in (src, src.parent / "numpy.libs", *src.parent.glob("numpy-*.dist-info")):
        if path.exists():
            (root / "lib" / path.name).symlink_to(path)
    site = next((root / "venv" / "lib").glob("python3*/site-packages"))
    (site / "numpy-only.pth").write_text(str(root / "lib") + "\n")
    return str(root / "venv" / "bin" / "python")


def test_a_forced_backend_missing_on_the_device_is_a_device_problem(cli, tmp_path, numpy_python):
    # --backend onnxruntime on a board with numpy only: preflight must not settle for the numpy
    # backend (the plan then refused the forced one as an input error, exit 3); it fails as a
    # device problem (exit 4) naming what to provision.
    (tmp_path / "devices.toml").write_text(f'[devices.edge8]\nssh = "local"\nworkdir = "{tmp_path / "edge8"}"\npython = "{numpy_python}"\n')
    r = cli("deploy", DIGITS, "--device", "edge8", "--target", "linux-cpu", "--backend", "onnxruntime", "--iterations", "5")
    assert_one_line_error(r, 4, "preflight failed on edge8 (profile linux-cpu): runtime:")
    assert "--runtime onnxruntime (or add --provision to deploy)" in r.stderr
    assert not (tmp_path / "edge8" / "bundles").exists()


# -- provisioning ------------------------------------------------------------------------------


def test_provision_from_the_registry_then_the_agent_uses_the_venv(tmp_path, bare_python):
    root = tmp_path / "device"
    t = LocalTransport(root)
    t.python = bare_python  # a device with a bare Python: no pip in it
    result = provision(t, packages=[SMALL], device="edge1")
    assert (result.source, result.layout, result.reason) == ("registry", "venv", None)
    assert result.python == venv_python(t) == str(root / "venv" / "bin" / "python") == t.python
    subprocess.run([result.python, "-c", "import tomli_w"], check=True)
    # a new connection to the device finds the venv; preflight says the agent runs there
    again = LocalTransport(root)
    again.python = bare_python
    assert use_provisioned_python(again) and again.python == result.python
    report = preflight(again, load_profile("local"))
    assert "(edgekit's venv)" in next(c for c in report.checks if c.name == "python").detail
    assert report.facts["probe"]["python"]["in_venv"]


def test_provision_offline_device_gets_wheels_from_the_host(tmp_path):
    root = tmp_path / "device"
    t = EnvDevice(root, OFFLINE_PIP)  # its pip cannot reach any index
    result = provision(t, packages=[SMALL])
    assert result.source == "host" and "could not get them from the registry" in result.reason
    wheels = sorted(p.name for p in (root / "wheelhouse").iterdir())
    assert wheels == result.wheels and any(w.startswith("tomli_w-") for w in wheels)
    assert result.bytes_sent == sum((root / "wheelhouse" / w).stat().st_size for w in wheels)
    subprocess.run([str(root / "venv" / "bin" / "python"), "-c", "import tomli_w"], check=True)
    # the wheels are content-addressed on the device: a second time nothing is sent
    second = provision(EnvDevice(root, OFFLINE_PIP), packages=[SMALL], offline=True)
    assert (second.source, second.reason, second.bytes_sent, second.wheels_skipped) == ("host", "--offline", 0, len(wheels))


def test_provision_a_device_without_pip(tmp_path, shadows):
    # Debian minbase: python3 without python3-pip / python3-venv. The venv is made --without-pip,
    # the host sends pip's own wheel along, and pip runs from it.
    root = tmp_path / "device"
    t = EnvDevice(root, {"PYTHONPATH": _shadowed(shadows, "pip"), **OFFLINE_PIP})
    result = provision(t, packages=[SMALL])
    assert (result.source, result.layout, result.reason) == ("host", "venv", "the device has no pip")
    assert any(w.startswith("pip-") for w in result.wheels)
    venv = root / "venv"
    assert list(venv.glob("lib/python*/site-packages/tomli_w")) and not list(venv.glob("lib/python*/site-packages/pip"))
    assert list((root / "wheelhouse").glob("pip-*.whl"))


def test_provision_without_the_venv_module_uses_a_target_dir(tmp_path, shadows):
    root = tmp_path / "device"
    t = EnvDevice(root, {"PYTHONPATH": _shadowed(shadows, "venv")})
    result = provision(t, packages=[SMALL])
    assert (result.source, result.layout) == ("registry", "target")
    launcher = root / "venv" / "bin" / "python"
    assert launcher.read_text().startswith("#!/bin/sh") and os.access(launcher, os.X_OK)
    assert (root / "venv" / "site" / "tomli_w").is_dir()
    proc = subprocess.run([str(launcher), "-c", "import tomli_w, sys; print(sys.executable)"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    # provisioning again finds the launcher and keeps the layout
    again = provision(EnvDevice(root, {"PYTHONPATH": _shadowed(shadows, "venv")}), packages=[SMALL])
    assert again.layout == "target" and again.python == str(launcher)


def test_provision_errors(tmp_path):
    t = LocalTransport(tmp_path / "device")
    with pytest.raises(UsageError, match="unknown runtime 'tensorflow'"):
        provision(t, "tensorflow")
    with pytest.raises(UsageError, match="nothing to provision"):
        provision(t)
    with pytest.raises(UsageError, match="not a package requirement"):
        provision(t, packages=["x; rm -rf /"])


def test_platform_args_list_every_manylinux_tag_of_the_device():
    facts = {
        "device": {"arch": "aarch64", "python": "3.11.2"},
        "probe": {"libc": {"name": "glibc", "version": "2.36"}, "python": {"implementation": "CPython"}},
    }
    args = platform_args(facts)
    tags = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert tags[0] == "manylinux2014_aarch64" and tags[-1] == "linux_aarch64"
    assert [f"manylinux_2_{n}_aarch64" for n in range(17, 37)] == tags[1:-1]
    assert args[args.index("--python-version") + 1] == "3.11" and args[args.index("--abi") + 1] == "cp311"


@pytest.mark.slow
def test_deploy_provision_installs_the_runtime_and_runs(cli, tmp_path, bare_python, ort_only):
    (tmp_path / "devices.toml").write_text(f'[devices.edge8]\nssh = "local"\nworkdir = "{tmp_path / "edge8"}"\npython = "{bare_python}"\n')
    r = cli("deploy", DIGITS, "--device", "edge8", "--target", ort_only, "--provision", "--iterations", "5", "--json", timeout=1200)
    assert r.returncode == 0, r.stderr
    assert "provisioning onnxruntime on edge8" in r.stderr
    doc = json.loads(r.stdout)
    assert {run["variant"] for run in doc["runs"]} == {"fp32", "int8"}
    shown = json.loads(cli("results", "show", str(doc["runs"][0]["id"]), "--json").stdout)
    assert shown["agent"]["device"]["runtimes"]["onnxruntime"]  # the venv's runtime ran it
    check = cli("devices", "check", "edge8", "--target", ort_only, "--json")
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["python"] == str(tmp_path / "edge8" / "venv" / "bin" / "python")


# -- the commands --------------------------------------------------------------------------------


def test_cli_devices_check(cli):
    r = cli("devices", "check", "local", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["profile"] == "local" and doc["lock"]["locked"] is False
    assert doc["facts"]["device"]["runtimes"]["onnxruntime"]
    human = cli("devices", "check", "local")
    assert human.returncode == 0 and "local is ready for local" in human.stdout and "runtime onnxruntime" in human.stdout
    bad = cli("devices", "check", "local", "--target", "rpi5")
    assert_one_line_error(bad, 4, "preflight failed on local (profile rpi5): arch: the device is x86_64")
    assert "FAIL" in bad.stdout  # the verdict table still shows what was checked
    assert_one_line_error(cli("devices", "check", "local", "--target", "nosuch"), 3, "unknown target profile")


def test_cli_devices_provision(cli):
    r = cli("devices", "provision", "local", "--runtime", "numpy", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["source"], doc["runtime"]) == ("present", "numpy") and doc["versions"]["numpy"]
    assert "numpy" in cli("devices", "provision", "local", "--runtime", "numpy").stdout
    assert_one_line_error(cli("devices", "provision", "local", "--runtime", "tensorflow"), 2, "unknown runtime 'tensorflow'")


# -- over SSH: a real sshd on loopback -----------------------------------------------------------


def test_check_over_ssh_after_trusting_the_host(cli, ssh_home):
    # the lab's ssh_home: ~/.ssh/config calls the loopback sshd "lab", its host key not known yet
    sshd = ssh_home.server
    r = cli("devices", "check", "lab", "--target", "linux-cpu")
    assert_one_line_error(r, 4)  # an unknown host key is refused
    assert "--trust-new-host" in r.stderr
    r = cli("devices", "check", "lab", "--target", "linux-cpu", "--trust-new-host", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["transport"].startswith("ssh:") and doc["device"] == "lab"
    assert os.path.realpath(doc["facts"]["probe"]["workdir"]["path"]) == os.path.realpath(sshd.home / ".edgekit")
    assert sshd.host_key_line.split()[1] in ssh_home.known_hosts.read_text()
    bad = cli("devices", "check", "lab", "--target", "rpi5")
    assert_one_line_error(bad, 4, "preflight failed on lab (profile rpi5): arch: the device is x86_64")


def _pep668_python() -> str | None:
    """This machine's system Python when it is externally managed (PEP 668) and has no onnxruntime:
    a Debian 12 / Raspberry Pi OS Bookworm device's python3, as it comes."""
    code = "import importlib.util, os, sys, sysconfig; print(os.path.isfile(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')) and sys.prefix == sys.base_prefix and importlib.util.find_spec('onnxruntime') is None)"
    try:
        out = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    except OSError:
        return None
    return "/usr/bin/python3" if out == "True" else None


@pytest.mark.slow
def test_check_names_provision_then_a_provisioned_device_passes_and_deploys_over_ssh(cli, ssh_home, tmp_path, bare_python):
    # issue 24: `devices check` said ready, `deploy` then failed in the agent with a pip hint that
    # Debian 12 refuses (PEP 668). A device whose python3 has no runtime, over a real sshd:
    system = _pep668_python()
    python = system or bare_python  # a bare venv where this machine's python3 is not a PEP 668 one
    ssh_home.trust()
    (tmp_path / "devices.toml").write_text(f'[devices.board]\nssh = "lab"\npython = "{python}"\n')
    env = ssh_home.env()
    r = cli("devices", "check", "board", "--target", "linux-cpu", env=env)
    assert_one_line_error(r, 4, "runtime: native can run, but the fp32 variant runs on onnxruntime: onnxruntime is not installed")
    assert "hint: install it into edgekit's own venv on the device: edgekit devices provision board --runtime onnxruntime" in r.stderr
    assert "pip install" not in r.stdout + r.stderr
    if system:
        assert f"{system} is externally managed (PEP 668), so pip would refuse it" in r.stderr
    p = cli("devices", "provision", "board", "--runtime", "onnxruntime", "--json", env=env, timeout=1500)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["versions"]["onnxruntime"]
    check = cli("devices", "check", "board", "--target", "linux-cpu", "--json", env=env)
    assert check.returncode == 0, check.stderr
    doc = json.loads(check.stdout)
    assert doc["ok"] and doc["python"].endswith("/venv/bin/python")
    runtime = next(c for c in doc["checks"] if c["name"] == "runtime")
    assert runtime["status"] == "ok" and "the fp32 variant runs on onnxruntime (onnxruntime " in runtime["detail"]
    d = cli("deploy", DIGITS, "--device", "board", "--target", "linux-cpu", "--iterations", "5", "--warmup", "1", "--no-layers", "--json", "-o", tmp_path / "b", env=env, timeout=1500)
    assert d.returncode == 0, d.stderr
    runs = json.loads(d.stdout)["runs"]
    assert [(x["variant"], x["backend"]) for x in runs] == [("fp32", "onnxruntime"), ("int8", "native")]


def test_provision_over_ssh_into_an_odd_workdir(ssh_home):
    # A workdir whose name would do harm if it ever reached a shell unquoted.
    from edgekit.devices import DeviceEntry, connect

    sshd = ssh_home.server
    ssh_home.trust()
    odd = "~/edge kit $(touch PWNED); 'q' \"d\""
    entry = DeviceEntry("lab", "lab", workdir=odd)
    t = connect(entry, load_profile("linux-cpu"))
    try:
        result = provision(t, packages=[SMALL], device="lab")
        assert (result.source, result.layout) == ("registry", "venv")
        venv = sshd.home / "edge kit $(touch PWNED); 'q' \"d\"" / "venv"
        assert result.python == str(venv / "bin" / "python") == t.python
        assert t.run([t.python, "-c", "import tomli_w"], check=False).returncode == 0
        report = preflight(t, load_profile("linux-cpu"), device="lab")
        assert "(edgekit's venv)" in next(c for c in report.checks if c.name == "python").detail
    finally:
        t.close()
    assert not list(sshd.home.rglob("PWNED")) and not list(sshd.base.rglob("PWNED"))
    # the next connection finds the venv by itself
    again = connect(entry, load_profile("linux-cpu"))
    try:
        assert again.python == result.python
    finally:
        again.close()


# -- an emulated Raspberry Pi 4 (aarch64 under qemu, its own network namespace, no internet) ------


@pytest.fixture(scope="module")
def pi4_board():
    with emulated_boards(("dvpi4", "cortex-a72", 41)) as boards:
        yield boards["dvpi4"]


@pytest.fixture
def pi4(pi4_board, tmp_path, monkeypatch):
    client_home(tmp_path / "client-home", pi4_board.ssh_config("pi4"), monkeypatch)
    return pi4_board


def test_preflight_on_an_emulated_pi4(cli, pi4):
    # A Cortex-A72 has no dot product: the rpi5 profile is refused before anything is pushed.
    r = cli("devices", "check", "pi4", "--target", "rpi5", "--json")
    assert r.returncode == 4
    doc = json.loads(r.stdout)
    assert doc["facts"]["device"]["arch"] == "aarch64" and doc["facts"]["device"]["cpu_model"] == "cortex-a72"
    failed = {c["name"]: c for c in doc["checks"] if c["status"] == "fail"}
    assert set(failed) == {"isa"} and "asimddp" in failed["isa"]["detail"] and "--target rpi4" in failed["isa"]["hint"]
    assert "error: preflight failed on pi4 (profile rpi5): isa: profile rpi5 promises asimddp" in r.stderr
    ok = cli("devices", "check", "pi4", "--target", "rpi4", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["facts"]["probe"]["python"]["pip"] is None  # Debian minbase: no pip


def test_provision_an_offline_pi4_with_wheels_for_aarch64(pi4):
    # The board cannot reach the registry and has neither pip nor ensurepip: the host downloads
    # aarch64 / cp311 / manylinux wheels (a C extension, so the platform tags matter) and pip.
    from edgekit.devices import connect

    t = connect("pi4", load_profile("rpi4"))
    try:
        result = provision(t, packages=["markupsafe"], device="pi4")
        assert (result.source, result.layout, result.reason) == ("host", "venv", "the device has no pip")
        markupsafe = next(w for w in result.wheels if w.lower().startswith("markupsafe-"))
        assert "cp311" in markupsafe and "aarch64" in markupsafe
        probe = "import markupsafe._speedups as s, platform; print(platform.machine(), s.__file__)"
        out = t.run([t.python, "-c", probe]).stdout.decode()
        assert out.startswith("aarch64 ") and "aarch64-linux-gnu" in out
        assert t.python.endswith("/.edgekit/venv/bin/python")
    finally:
        t.close()
