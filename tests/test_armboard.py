"""Emulated ARM boards (tests/lab/armboard.py): aarch64 Debian under qemu-user, one network
namespace each, reached over real SSH. One board is a Cortex-A72 (no dot product, like a
Raspberry Pi 4), the other a Cortex-A76 (dot product, like a Pi 5).

The boards need root and, for the first build, the Debian mirror; elsewhere these tests skip
and say why. Emulated timing means nothing: they assert correctness only.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgekit.agent.facts import parse_cpuinfo
from edgekit.bundle import Variant, write_bundle
from edgekit.modelio import load_model
from edgekit.plan import make_plan
from edgekit.profiles import load_profile
from edgekit.targets.numpy import BACKEND as NUMPY
from edgekit.transport.agentzip import PACKAGE, build_agent_zip
from tests.conftest import EXAMPLES
from tests.lab import armboard
from tests.lab.fixtures import emulated_boards

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
# Their own names and links, so `python -m tests.lab.armboard up` boards can stay up meanwhile.
TEST_BOARDS = (("ci-a72", "cortex-a72", 11), ("ci-a76", "cortex-a76", 12))
BOARDS = {name: cpu for name, cpu, _ in TEST_BOARDS}
ISA = {"cortex-a72": ["neon"], "cortex-a76": ["neon", "asimddp", "fp16"]}
HWCAP_ASIMDDP = 1 << 20


# -- without a board: the lab's own pieces -------------------------------------------------------


@pytest.mark.parametrize(
    "cpu, hwcap, core, isa",
    [
        ("cortex-a72", 0x8FB, "cortex-a72", ["neon"]),  # what qemu gives a cortex-a72
        ("cortex-a76", 0x119FFB, "cortex-a76", ["neon", "asimddp", "fp16"]),
    ],
)
def test_cpuinfo_reads_back_as_the_emulated_core(cpu, hwcap, core, isa):
    text = armboard.cpuinfo_text(cpu, hwcap, 0, cores=4)
    assert text.count("processor\t:") == 4
    assert parse_cpuinfo(text, "aarch64") == (core, isa)
    assert ("asimddp" in text) == bool(hwcap & HWCAP_ASIMDDP)


def test_debian_mirror_from_both_apt_source_formats(tmp_path):
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert armboard.debian_mirror((deb822,)) == "http://mirror.example/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text("# deb http://old/debian bookworm main\ndeb [arch=amd64] http://one.example/debian bookworm main\n")
    assert armboard.debian_mirror((one_line,)) == "http://one.example/debian"
    assert armboard.debian_mirror((tmp_path / "missing",)) == "http://deb.debian.org/debian"


# -- the boards -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def boards():
    with emulated_boards(*TEST_BOARDS) as started:
        yield started


def _connect(board):
    import paramiko

    client = paramiko.SSHClient()
    client.load_host_keys(str(board.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(board.host, board.port, username=board.user, key_filename=str(board.key),
                   look_for_keys=False, allow_agent=False, timeout=20)
    return client


def _exec(client, *argv: str, timeout: float = 120) -> str:
    _, stdout, stderr = client.exec_command(shlex.join(argv), timeout=timeout)
    out = stdout.read().decode()
    status = stdout.channel.recv_exit_status()
    assert status == 0, (argv, status, stderr.read().decode())
    return out


@pytest.fixture(scope="module")
def sessions(boards):
    clients = {name: _connect(board) for name, board in boards.items()}
    yield clients
    for client in clients.values():
        client.close()


def test_boards_boot_and_answer_over_ssh(boards, sessions):
    for name, client in sessions.items():
        out = _exec(client, "sh", "-c", "uname -m; hostname; id -un; echo $QEMU_CPU").split()
        assert out == ["aarch64", name, "pi", BOARDS[name]]
    if shutil.which("ssh"):  # the system client too, with strict host key checking
        for board in boards.values():
            proc = subprocess.run(board.ssh_argv("uname", "-m"), capture_output=True, text=True, timeout=60)
            assert (proc.returncode, proc.stdout.strip()) == (0, "aarch64"), proc.stderr


def test_cpu_features_differ_and_match_what_qemu_runs(sessions):
    probe = "import ctypes; g = ctypes.CDLL(None).getauxval; g.restype = ctypes.c_ulong; print(g(16))"
    seen = {}
    for name, client in sessions.items():
        cpuinfo = _exec(client, "cat", "/proc/cpuinfo")
        features = set(next(ln for ln in cpuinfo.splitlines() if ln.startswith("Features")).split(":")[1].split())
        hwcap = int(_exec(client, "python3", "-c", probe))
        # the cpuinfo the board shows is the CPU its programs really run on
        assert ("asimddp" in features) == bool(hwcap & HWCAP_ASIMDDP)
        assert "sse2" not in cpuinfo and "GenuineIntel" not in cpuinfo
        seen[name] = features
    assert "asimddp" not in seen["ci-a72"] and "asimddp" in seen["ci-a76"]
    assert {"fp", "asimd"} <= seen["ci-a72"] & seen["ci-a76"]


def _push_agent(client, tmp_path: Path) -> str:
    agent = build_agent_zip(tmp_path)
    with client.open_sftp() as sftp:
        sftp.put(str(agent), "agent.pyz")
    return "agent.pyz"


def test_agent_facts_on_each_board_and_the_plan_they_make(sessions, tmp_path):
    model = load_model(DIGITS)
    for name, client in sessions.items():
        agent = _push_agent(client, tmp_path)
        doc = json.loads(_exec(client, "python3", agent, "facts"))
        device = doc["device"]
        assert (doc["kind"], device["arch"], device["hostname"]) == ("edgekit.facts", "aarch64", name)
        assert device["cpu_model"] == BOARDS[name] and device["isa"] == ISA[BOARDS[name]]
        assert device["runtimes"]["numpy"] and device["runtimes"]["onnxruntime"] is None
        assert device["python"].startswith("3.11") and "Debian" in device["os"]
        plan = make_plan(model, load_profile("rpi4"), device=name, quantize=False, facts=doc)
        assert (plan.backend, plan.precision) == ("numpy", "fp32")


_RUN_ON_BOARD = """
import sys
sys.path.insert(0, "agent.pyz")
import numpy as np
from {package}.backends import numpy_ref
session = numpy_ref.load("nb/graph.json", None)
x = np.load("nb/inputs.npy")
np.save("nb/outputs.npy", np.concatenate([session.run({{"input": x[i:i + 1]}})[0] for i in range(len(x))]))
print(session.version)
"""


def test_numpy_backend_on_the_board_matches_onnxruntime_on_the_host(sessions, tmp_path):
    files = NUMPY.compile(DIGITS, tmp_path / "nb")
    with np.load(EXAMPLES / "digits" / "heldout.npz") as data:
        x = data["input"][:12]
    np.save(tmp_path / "nb" / "inputs.npy", x)
    ref = ort.InferenceSession(str(DIGITS))
    want = np.concatenate([ref.run(None, {"input": x[i : i + 1]})[0] for i in range(len(x))])
    client = sessions["ci-a72"]
    _push_agent(client, tmp_path)
    with client.open_sftp() as sftp:
        if "nb" not in sftp.listdir("."):
            sftp.mkdir("nb")
        for f in [*files, tmp_path / "nb" / "inputs.npy"]:
            sftp.put(str(f), f"nb/{f.name}")
        version = _exec(client, "python3", "-c", _RUN_ON_BOARD.format(package=PACKAGE)).strip()
        sftp.get("nb/outputs.npy", str(tmp_path / "outputs.npy"))
    got = np.load(tmp_path / "outputs.npy")
    assert version.startswith("1.") and version != np.__version__  # the board's own numpy (Debian's)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert (got.argmax(1) == want.argmax(1)).all()


def test_agent_benches_a_numpy_bundle_on_the_board(sessions, tmp_path):
    build = tmp_path / "build"
    files = NUMPY.compile(DIGITS, build / "fp32")
    loaded = load_model(DIGITS)
    ins, outs = loaded.inputs, loaded.outputs
    bundle = write_bundle(
        tmp_path / "bundle", files={f"fp32/{f.name}": f for f in files}, model_name="digits_cnn",
        model_sha256=loaded.sha256, profile="rpi4", backend="numpy", precision="fp32",
        variants=[Variant("fp32", "numpy", "fp32", "fp32/graph.json", ins, outs)], plan={},
    )
    client = sessions["ci-a76"]
    agent = _push_agent(client, tmp_path)
    with client.open_sftp() as sftp:
        for d in ("b", "b/fp32"):
            if d.split("/")[-1] not in sftp.listdir(os.path.dirname(d) or "."):
                sftp.mkdir(d)
        for f in bundle.manifest.files:
            sftp.put(str(bundle.path(f.path)), f"b/{f.path}")
        sftp.put(str(bundle.root / "manifest.json"), "b/manifest.json")
    doc = json.loads(_exec(client, "python3", agent, "bench", "b", "--variant", "fp32", "--warmup", "1", "--iterations", "3", "--profile"))
    assert doc["kind"] == "edgekit.bench", doc
    assert (doc["backend"], doc["device"]["arch"], doc["device"]["cpu_model"]) == ("numpy", "aarch64", "cortex-a76")
    assert len(doc["samples_ns"]) == 3 and all(s > 0 for s in doc["samples_ns"])
    assert [layer["op"] for layer in doc["layers"]][:2] == ["Conv", "BatchNormalization"]


# -- the whole loop: edgekit deploy --target rpi4 --device <board> ------------------------------


@pytest.mark.slow
def test_deploy_float_digits_to_the_a72_board_runs_numpy(boards, cli, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(boards["ci-a72"].ssh_config("pi4-lab"))
    args = ("deploy", DIGITS, "--target", "rpi4", "--device", "pi4-lab", "--no-quantize", "--warmup", "1",
            "--iterations", "5", "--json", "-o", tmp_path / "b")
    r = cli(*args, env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # the board has numpy and no runtime: the plan, made with its facts, is numpy in float
    assert (doc["backend"], doc["precision"], doc["plan"]["probed"]) == ("numpy", "fp32", True)
    # the same loop on this machine (same backend) gives a result of the same shape
    from tests.test_ssh import _shape, _shape_diff

    here = cli("deploy", DIGITS, "--target", "linux-cpu", "--backend", "numpy", "--no-quantize", "--warmup", "1",
               "--iterations", "5", "--json", "-o", tmp_path / "local-b")  # fmt: skip
    assert here.returncode == 0, here.stderr
    assert _shape_diff(_shape(json.loads(here.stdout)), _shape(doc)) == []
    skipped = {s["backend"]: s["reason"] for s in doc["plan"]["skipped_backends"]}
    assert "onnxruntime is not installed on the device" in skipped["onnxruntime"]
    assert {f["path"] for f in doc["bundle"]["files"]} == {"fp32/graph.json", "fp32/weights.npz", "fp32/inputs.npz"}
    assert doc["push"]["files_sent"] == 4 and doc["summary"]["variants"]["fp32"]["p50_ms"] > 0
    record = json.loads(cli("results", "show", str(doc["runs"][0]["id"]), "--json").stdout)
    facts = record["agent"]["device"]
    assert (facts["arch"], facts["cpu_model"], facts["isa"]) == ("aarch64", "cortex-a72", ["neon"])
    assert record["agent"]["backend"] == "numpy" and record["agent"]["backend_version"].startswith("1.24")
    # the same bundle again: the board has every file (at most the manifest is sent again)
    again = json.loads(cli(*args, env={"HOME": str(home)}).stdout)["push"]
    assert again["files_skipped"] >= 3 and again["files_sent"] <= 1, again
    assert again["bytes_sent"] <= (tmp_path / "b" / "manifest.json").stat().st_size
