"""The device agent (as the zipapp the device runs), the host's bench runner, and `edgekit bench`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from edgekit.agent import bundle_hash
from edgekit.agentclient import BenchConfig, bench_variant, parse_agent_output
from edgekit.errors import EXIT_DEVICE, EXIT_INPUT, EXIT_USAGE, AgentError
from edgekit.fsutil import sha256_file
from edgekit.transport import agentzip
from edgekit.transport.agentzip import build_agent_zip
from edgekit.transport.base import CommandResult
from edgekit.transport.local import LocalTransport
from edgekit.transport.push import push_bundle
from tests.builders import tiny_bundle
from tests.conftest import assert_one_line_error


@pytest.fixture(scope="module")
def agent_zip(tmp_path_factory) -> Path:
    return build_agent_zip(tmp_path_factory.mktemp("agent"))


def _agent(zip_path: Path, *args: str, python_flags: tuple[str, ...] = (), pre: str = "") -> tuple[int, dict, str]:
    """Run the zipapp the way the device does; return (exit code, the one JSON document, stderr)."""
    if pre:  # run code first (e.g. hide a module), then the zipapp as __main__
        argv = [sys.executable, *python_flags, "-c", f"{pre}\nimport runpy, sys\nsys.argv = sys.argv[1:]\n"
                "runpy.run_path(sys.argv[0], run_name='__main__')", str(zip_path), *args]  # fmt: skip
    else:
        argv = [sys.executable, *python_flags, str(zip_path), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=zip_path.parent)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout  # exactly one JSON document
    return proc.returncode, json.loads(lines[0]), proc.stderr


# -- the zipapp -------------------------------------------------------------------------------


def test_agent_zip_is_deterministic(tmp_path, agent_zip):
    again = build_agent_zip(tmp_path)
    assert again.name == agent_zip.name  # content-addressed name
    assert again.read_bytes() == agent_zip.read_bytes()
    assert again.stem == hashlib.sha256(again.read_bytes()).hexdigest()
    with zipfile.ZipFile(again) as zf:
        names = zf.namelist()
    assert names[0] == "__main__.py" and "edgekit_agent/runner.py" in names
    assert "edgekit_agent/backends/onnxruntime.py" in names and "edgekit_agent/store.py" in names
    assert not any("__pycache__" in n for n in names)


def test_facts_run_with_the_stdlib_only(agent_zip):
    # -I -S: no site-packages, no edgekit, no numpy; the agent must still describe the device.
    rc, doc, _ = _agent(agent_zip, "facts", python_flags=("-I", "-S"))
    assert rc == 0 and doc["kind"] == "edgekit.facts" and doc["schema"] == 1
    dev = doc["device"]
    assert dev["cores"] == os.cpu_count() and dev["python"] == ".".join(map(str, sys.version_info[:3]))
    assert dev["memory_bytes"] > 0 and dev["arch"]
    runtimes = ("onnxruntime", "openvino", "tflite_runtime", "ai_edge_litert", "numpy", "tensorrt")
    assert dev["runtimes"] == {k: None for k in runtimes}
    assert set(doc["device_state"]) == {"governor", "temp_c", "freq_mhz", "freq_max_mhz", "thermal", "throttled"}


def test_facts_see_installed_runtimes(agent_zip):
    rc, doc, _ = _agent(agent_zip, "facts")
    assert rc == 0
    assert doc["device"]["runtimes"]["onnxruntime"] == onnxruntime.__version__
    assert doc["device"]["runtimes"]["numpy"] == np.__version__


def test_bench_document(tmp_path, agent_zip):
    bundle = tiny_bundle(tmp_path / "bundle")
    args = ("bench", str(bundle.root), "--variant", "fp32", "--warmup", "2", "--iterations", "7", "--threads", "1")
    rc, doc, _ = _agent(agent_zip, *args)
    assert rc == 0, doc
    assert doc["kind"] == "edgekit.bench" and doc["schema"] == 1 and doc["agent_version"] == "0.1.0"
    assert (doc["variant"], doc["backend"], doc["precision"]) == ("fp32", "onnxruntime", "fp32")
    assert doc["backend_version"] == onnxruntime.__version__
    assert doc["model"] == "fp32/tiny.onnx"
    assert doc["model_sha256"] == sha256_file(bundle.path("fp32/tiny.onnx"))
    assert doc["bundle_hash"] == bundle.manifest.bundle_hash
    assert doc["config"] == {"warmup": 2, "warmup_mode": "fixed", "iterations": 7, "duration_s": None, "min_time_s": None, "threads": 1, "batch": 1}
    assert len(doc["warmup_samples_ns"]) == 2 and "energy" in doc
    assert len(doc["samples_ns"]) == 7 and all(type(s) is int and s > 0 for s in doc["samples_ns"])
    assert doc["load_ns"] > 0 and doc["first_inference_ns"] > 0 and doc["peak_rss_bytes"] > 10 * 2**20
    assert doc["layers"] is None and doc["started_at"].endswith("+00:00")
    assert set(doc["device_state"]) == {"before", "after"}
    probe = doc["speed_probe"]  # the device's own speed through the window: 7 runs, one burst
    assert (probe["loop"], probe["bursts"]) == ("python-sum-200", 1) and doc["device"]["python"] == sys.version.split()[0]
    assert type(probe["ns"]) is int and 100 < probe["ns"] < 10**6, probe
    assert doc["device"]["runtimes"]["onnxruntime"] == onnxruntime.__version__
    assert {"hostname", "arch", "cpu_model", "cores", "isa", "memory_bytes", "os", "kernel", "python"} <= set(doc["device"])


def test_bench_for_a_duration(tmp_path, agent_zip):
    bundle = tiny_bundle(tmp_path / "bundle")
    rc, doc, _ = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32", "--warmup", "0", "--duration", "0.05")
    assert rc == 0, doc
    assert doc["config"]["iterations"] is None and doc["config"]["duration_s"] == 0.05
    # The samples are the runtime's own times (inputs bound once), so they need not fill the window:
    # the loop's Python and a busy machine's pauses lie between them. A us model runs thousands of
    # times in 50 ms; the samples, disjoint parts of the window, add up to at most it and its last run.
    samples = doc["samples_ns"]
    assert len(samples) >= 50 and sum(samples) <= 0.05e9 + max(samples)


def test_bench_for_a_count_and_a_minimum_time(tmp_path, agent_zip):
    bundle = tiny_bundle(tmp_path / "bundle")
    # a microsecond model: 5 runs would be over in a few us; the loop goes on until 0.05 s are used
    rc, doc, _ = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32", "--warmup", "0", "--iterations", "5", "--min-time", "0.05")
    assert rc == 0, doc
    assert doc["config"]["iterations"] == 5 and doc["config"]["min_time_s"] == 0.05 and doc["config"]["duration_s"] is None
    assert len(doc["samples_ns"]) > 5 and sum(doc["samples_ns"]) >= 0.05e9 * 0.5
    # a count that outlasts the minimum is run in full, not cut at the minimum
    rc, doc, _ = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32", "--warmup", "0", "--iterations", "300", "--min-time", "0.000001")
    assert rc == 0 and len(doc["samples_ns"]) == 300, doc


def test_bench_uses_the_bundles_inputs(tmp_path, agent_zip):
    good = tmp_path / "good.npz"
    np.savez(good, x=np.ones((4, 16), np.float32))
    rc, doc, _ = _agent(agent_zip, "bench", str(tiny_bundle(tmp_path / "bundle", inputs=good).root), "--variant", "fp32")
    assert rc == 0 and doc["config"]["batch"] == 4  # random data would have been batch 1

    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.ones((4, 16), np.float64))
    rc, doc, _ = _agent(agent_zip, "bench", str(tiny_bundle(tmp_path / "b2", inputs=bad).root), "--variant", "fp32")
    assert rc == 1 and doc["kind"] == "edgekit.error"
    assert "inputs.npz: input 'x' is float64, the model wants float32" in doc["error"]


def test_error_when_the_backend_is_not_installed(tmp_path, agent_zip):
    bundle = tiny_bundle(tmp_path / "bundle")
    hide = "import sys; sys.modules['onnxruntime'] = None  # as if it were not installed"
    rc, doc, stderr = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32", pre=hide)
    assert rc == 1, stderr
    assert doc["kind"] == "edgekit.error" and doc["schema"] == 1
    assert doc["error"].startswith("onnxruntime is not installed on the device")
    # never pip into the device's system Python (PEP 668 refuses it): edgekit's venv there, as preflight says
    assert doc["missing_runtime"] == "onnxruntime" and "pip install" not in doc["hint"]
    assert "edgekit devices provision DEVICE --runtime onnxruntime" in doc["hint"]
    assert "Traceback" not in stderr
    # the host names the device in the hint, as `devices check` does
    result = CommandResult(("python3", "agent.pyz"), rc, json.dumps(doc).encode(), b"", 0.1)
    with pytest.raises(AgentError) as err:
        parse_agent_output(result, device="pi5")
    assert err.value.message == doc["error"]
    assert err.value.hint == "install it into edgekit's own venv on the device: edgekit devices provision pi5 --runtime onnxruntime (or add --provision to deploy)"


def test_error_without_site_packages(tmp_path, agent_zip):
    bundle = tiny_bundle(tmp_path / "bundle")
    rc, doc, _ = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32", python_flags=("-I", "-S"))
    assert rc == 1 and doc["kind"] == "edgekit.error"
    assert "not installed on the device" in doc["error"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("bench", "{b}", "--variant", "int4"), "the bundle has no variant 'int4' (it has: fp32)"),
        (("bench", "{b}/nope", "--variant", "fp32"), "no bundle directory on the device"),
        (("bench", "{b}", "--variant", "fp32", "--iterations", "0"), "--iterations: must be >= 1"),
        (("bench", "{b}", "--variant", "fp32", "--duration", "soon"), "--duration"),
        (("bench", "{b}", "--variant", "fp32", "--min-time", "0"), "--min-time"),
        (("bench", "{b}"), "required: --variant"),
        (("explode",), "invalid choice: 'explode'"),
    ],
)
def test_error_documents(tmp_path, agent_zip, args, needle):
    bundle = tiny_bundle(tmp_path / "bundle")
    rc, doc, _ = _agent(agent_zip, *(a.format(b=bundle.root) for a in args))
    assert rc == 1 and doc["kind"] == "edgekit.error"
    assert needle in doc["error"] and doc["hint"] and "\n" not in doc["hint"]


def test_error_on_a_changed_model_or_unknown_backend(tmp_path, agent_zip):
    bundle = tiny_bundle(tmp_path / "bundle")
    with open(bundle.path("fp32/tiny.onnx"), "ab") as fh:
        fh.write(b"\0")
    rc, doc, _ = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32")
    assert rc == 1 and "does not match its sha256" in doc["error"]

    ov = tiny_bundle(tmp_path / "ov", backend="native")
    rc, doc, _ = _agent(agent_zip, "bench", str(ov.root), "--variant", "fp32")
    assert rc == 1 and "has no ekrt runner at bin/ekrt" in doc["error"]  # native: the runner travels in the bundle


NOISY = """
import os, sys, types
import edgekit.agent.backends as backends

class Session:
    version = "0"
    def run(self, feeds):
        os.write(1, b"C-LEVEL NOISE\\n")
        print("python noise")

def load(path, threads, options=None, workdir=None):
    os.write(1, b"LOAD NOISE\\n")
    return Session()

mod = types.ModuleType("edgekit.agent.backends.noisy")
mod.load = load
sys.modules[mod.__name__] = mod
backends.BACKENDS["noisy"] = "noisy"
from edgekit.agent.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def test_stdout_carries_only_the_document(tmp_path):
    # A runtime that prints to stdout (even from C, straight to fd 1) must not corrupt it.
    bundle = tiny_bundle(tmp_path / "bundle")
    manifest = json.loads((bundle.root / "manifest.json").read_text())
    manifest["variants"][0]["backend"] = "noisy"
    (bundle.root / "manifest.json").write_text(json.dumps(manifest))
    proc = subprocess.run(
        [sys.executable, "-c", NOISY, "bench", str(bundle.root), "--variant", "fp32", "--iterations", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backend"] == "noisy" and len(doc["samples_ns"]) == 3
    assert "C-LEVEL NOISE" in proc.stderr and "python noise" in proc.stderr and "LOAD NOISE" in proc.stderr


def test_bundle_hash_is_one_definition(tmp_path):
    bundle = tiny_bundle(tmp_path / "bundle")
    doc = json.loads((bundle.root / "manifest.json").read_text())
    assert bundle.manifest.bundle_hash == bundle_hash(doc)
    assert bundle_hash({**doc, "created": "another day"}) == bundle_hash(doc)
    assert bundle_hash({**doc, "profile": "rpi5"}) != bundle_hash(doc)


# -- the host's bench runner -----------------------------------------------------------------------


def test_bench_variant_over_the_local_transport(tmp_path):
    bundle = tiny_bundle(tmp_path / "bundle")
    dev = LocalTransport(tmp_path / "device")
    remote = push_bundle(dev, bundle).remote_dir
    doc = bench_variant(dev, remote, "fp32", BenchConfig(warmup=1, iterations=5))
    assert len(doc["samples_ns"]) == 5 and doc["bundle_hash"] == bundle.manifest.bundle_hash
    with pytest.raises(AgentError) as err:
        bench_variant(dev, remote, "int8", BenchConfig(warmup=0, iterations=1))
    assert "no variant 'int8'" in err.value.message and err.value.hint == "pass one of the bundle's variant names"
    dev.close()  # ends the agent server this connection started (else it waits on stdin until pytest exits)


# -- one agent process per connection (agent.pyz serve) ------------------------------------------


def test_serve_answers_each_line_from_a_fresh_worker(tmp_path, monkeypatch):
    import io

    from edgekit.agent import __main__ as agent_main

    pids = []

    def answer(argv):
        pids.append(os.getpid())  # runs in the worker: the parent's list never sees it
        if argv == ["crash"]:
            os.kill(os.getpid(), 9)
        return (0, {"kind": "edgekit.test", "argv": argv, "pid": os.getpid()})

    monkeypatch.setattr(agent_main, "_answer", answer)
    requests = [json.dumps({"argv": ["a"]}), "not json", json.dumps({"argv": ["crash"]}), json.dumps({"argv": [1]}), json.dumps({"argv": ["b"]})]
    out = io.StringIO()
    assert agent_main.serve(io.StringIO("\n".join(requests) + "\n"), out) == 0
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["status"] for r in replies] == [0, 2, -9, 2, 0]  # a killed worker: its signal, and the server goes on
    assert replies[1]["document"]["kind"] == "edgekit.error" and "bad request" in replies[1]["document"]["error"]
    assert replies[2]["document"] is None
    assert replies[0]["document"]["argv"] == ["a"] and replies[4]["document"]["argv"] == ["b"]
    assert os.getpid() not in {replies[0]["document"]["pid"], replies[4]["document"]["pid"]} and pids == []


def test_one_agent_server_per_connection(tmp_path, monkeypatch):
    from edgekit import agentclient

    bundle = tiny_bundle(tmp_path / "bundle")
    dev = LocalTransport(tmp_path / "device")
    remote = push_bundle(dev, bundle).remote_dir
    started = []
    converse = dev.converse
    monkeypatch.setattr(dev, "converse", lambda argv: started.append(argv) or converse(argv))
    docs = [bench_variant(dev, remote, "fp32", BenchConfig(warmup=1, iterations=3)) for _ in range(2)]
    assert agentclient.device_facts(dev)["kind"] == "edgekit.facts"
    assert len(started) == 1 and started[0][-1] == "serve"
    assert docs[0]["bundle_hash"] == docs[1]["bundle_hash"] == bundle.manifest.bundle_hash
    server = agentzip._SERVERS[dev]
    os.kill(server._proc.pid, 9)  # the server dies between two commands: that one runs on its own,
    assert len(bench_variant(dev, remote, "fp32", BenchConfig(warmup=0, iterations=2))["samples_ns"]) == 2
    assert len(started) == 1 and server.returncode == -9
    assert bench_variant(dev, remote, "fp32", BenchConfig(warmup=0, iterations=1))  # and the next starts a new server
    assert len(started) == 2
    with pytest.raises(AgentError, match="no variant 'int8'"):  # the agent's own errors still arrive as they are
        bench_variant(dev, remote, "int8", BenchConfig(warmup=0, iterations=1))
    (tmp_path / "venv-python").symlink_to(sys.executable)
    dev.python = str(tmp_path / "venv-python")  # as provisioning does: the next command runs the new Python
    assert agentclient.device_facts(dev)["kind"] == "edgekit.facts"
    assert len(started) == 3 and started[-1][0] == dev.python
    dev.close()
    assert agentzip._SERVERS[dev].returncode == 0  # EOF ended it cleanly


def test_agent_server_can_be_turned_off(tmp_path, monkeypatch):
    bundle = tiny_bundle(tmp_path / "bundle")
    dev = LocalTransport(tmp_path / "device")
    remote = push_bundle(dev, bundle).remote_dir
    monkeypatch.setenv("EDGEKIT_AGENT_SERVE", "0")
    monkeypatch.setattr(dev, "converse", lambda argv: pytest.fail("no server when EDGEKIT_AGENT_SERVE=0"))
    assert len(bench_variant(dev, remote, "fp32", BenchConfig(warmup=0, iterations=2))["samples_ns"]) == 2


def _result(rc: int, stdout: bytes, stderr: bytes = b"") -> CommandResult:
    return CommandResult(("python3", "/r/agent/abc.pyz", "bench"), rc, stdout, stderr, 0.1)


@pytest.mark.parametrize(
    ("result", "needle"),
    [
        (_result(-11, b"", b"Fatal Python error"), "killed by SIGSEGV"),
        (_result(-4, b""), "killed by SIGILL"),
        (_result(1, b"Traceback...\n", b"SyntaxError: future feature annotations"), "printed no JSON document (exit code 1)"),
        (_result(0, b"[1, 2]"), "not an object"),
        (_result(0, json.dumps({"kind": "edgekit.bench", "schema": 2}).encode()), "schema 2"),
        (_result(0, json.dumps({"kind": "edgekit.bench", "schema": 1, "samples_ns": [5, 0]}).encode()), "samples_ns"),
        (_result(1, json.dumps({"kind": "edgekit.error", "error": "boom", "hint": "fix"}).encode()), "boom"),
    ],
)
def test_agent_output_that_is_not_a_result(result, needle):
    with pytest.raises(AgentError) as err:
        parse_agent_output(result)
    assert needle in err.value.message and err.value.hint


# -- edgekit bench ---------------------------------------------------------------------------------


def test_cli_bench_json_and_store(cli, tmp_path):
    bundle = tiny_bundle(tmp_path / "bundle")
    result = cli("bench", bundle.root, "--iterations", "6", "--warmup", "1", "--json")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert len(records) == 1
    rec = records[0]
    assert rec["model_name"] == "tiny" and rec["target"] == "local" and rec["device"] == "local"
    assert rec["stats"]["n"] == 6 and rec["agent"]["config"]["iterations"] == 6
    assert rec["agent"]["bundle_hash"] == bundle.manifest.bundle_hash
    assert "2 file(s) sent" in result.stderr

    listed = cli("results", "list", "--json")
    assert [r["id"] for r in json.loads(listed.stdout)] == [rec["id"]]

    again = cli("bench", bundle.root, "--iterations", "3")
    assert again.returncode == 0, again.stderr
    assert "nothing to push" in again.stderr
    header = next(line for line in again.stdout.splitlines() if "p50 ms" in line)
    assert "variant" in header and "inf/s" in header
    assert any(line.startswith("fp32") and "onnxruntime" in line for line in again.stdout.splitlines())


def test_cli_bench_bad_inputs(cli, tmp_path):
    bundle = tiny_bundle(tmp_path / "bundle")
    assert_one_line_error(cli("bench", tmp_path / "nope"), EXIT_INPUT, "does not exist")
    assert_one_line_error(cli("bench", bundle.root, "--variant", "int8"), EXIT_USAGE, "no variant 'int8'")
    assert_one_line_error(cli("bench", bundle.root, "--iterations", "0"), EXIT_USAGE, "--iterations")
    assert_one_line_error(cli("bench", bundle.root, "--device", "pi@@127.0.0.1"), EXIT_USAGE, "pi@@127.0.0.1")
    assert_one_line_error(cli("bench", bundle.root, "--target", "no-such-board"), EXIT_INPUT, "no-such-board")
    ov = tiny_bundle(tmp_path / "ov", backend="native")
    assert_one_line_error(cli("bench", ov.root), EXIT_DEVICE, "has no ekrt runner at bin/ekrt")
    bundle.path("fp32/tiny.onnx").write_bytes(b"tampered")
    failed = cli("bench", bundle.root, "--json")
    assert_one_line_error(failed, EXIT_INPUT, "fp32/tiny.onnx")
    assert failed.stdout == ""
    assert json.loads(cli("results", "list", "--json").stdout) == []  # nothing was stored


def test_installed_versions_read_the_dist_info_names_as_import_would(tmp_path, monkeypatch):
    from importlib import metadata

    from edgekit.agent import facts, installed_versions

    first, second = tmp_path / "a", tmp_path / "b"
    for d, v in ((first, "1.20.0"), (second, "1.9.0")):  # the first on sys.path wins, as for import
        (d / f"onnxruntime_gpu-{v}.dist-info").mkdir(parents=True)
    (second / "tflite_runtime-2.14.0-py3.11.egg-info").mkdir()
    (second / "not-a-dist").mkdir()
    monkeypatch.setattr(sys, "path", [str(first), str(second), str(tmp_path / "missing")])
    assert installed_versions() == {"onnxruntime_gpu": "1.20.0", "tflite_runtime": "2.14.0"}
    v = facts.runtime_versions()
    assert v["onnxruntime"] == "1.20.0" and v["tflite_runtime"] == "2.14.0" and v["numpy"] is None
    monkeypatch.undo()  # the real environment: the same answers as importlib.metadata (without its import)
    assert facts.runtime_versions()["numpy"] == metadata.version("numpy")


def test_the_speed_loop_is_timed_through_the_window(monkeypatch):
    from edgekit.agent import speed

    now = [0]
    bursts = iter(range(5000, 6000, 10))
    monkeypatch.setattr(speed, "burst", lambda: next(bursts))
    monkeypatch.setattr(speed.time, "perf_counter_ns", lambda: now[0])
    meter = speed.SpeedMeter()
    for ms in range(100):  # an inference every 1 ms for 100 ms: a burst at 0, 10, ... 90 ms
        now[0] = ms * 1_000_000
        meter.tick(now[0])
    assert meter.bursts == [5000 + 10 * k for k in range(10)]
    assert meter.record() == {"loop": "python-sum-200", "ns": 5050, "bursts": 10}
    assert speed.SpeedMeter().record()["bursts"] == 1  # a window too short for a tick: one burst after it
    monkeypatch.undo()
    # 200 additions in pure Python: microseconds on any CPU the agent runs on
    assert 200 < speed.burst() < 200_000


# -- the timed loop: the runtime's own time per inference, where the session offers it ------------


def _fake_backend(monkeypatch, tmp_path, session_class):
    """A bundle whose variant runs on a backend module made of ``session_class``."""
    import types

    from edgekit.agent import backends

    fake = types.ModuleType("edgekit.agent.backends.fake")
    fake.load = lambda path, threads, options=None, workdir=None: session_class()
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(backends.BACKENDS, "fake", "fake")
    bundle = tiny_bundle(tmp_path / "bundle")
    manifest = json.loads((bundle.root / "manifest.json").read_text())
    manifest["variants"][0]["backend"] = "fake"
    (bundle.root / "manifest.json").write_text(json.dumps(manifest))
    return bundle


def test_samples_are_the_times_the_sessions_step_returns(tmp_path, monkeypatch):
    from edgekit.agent import runner

    class Session:
        version = "0"
        bound = None
        runs = 0

        def run(self, feeds):  # only the first inference: the loop runs the step
            Session.runs += 1

        def timed(self, feeds):
            Session.bound = feeds
            times = iter(range(1000, 10**6, 7))

            def step():
                sum(range(2000))  # takes far longer than the 1000 + 7k ns it reports
                return next(times)

            return step, "the fake runtime's own clock"

    bundle = _fake_backend(monkeypatch, tmp_path, Session)
    doc = runner.bench(str(bundle.root), "fp32", warmup=3, iterations=20, threads=1)
    assert Session.runs == 1 and list(Session.bound) == ["x"]  # the feeds were bound once, before the warm-up
    assert doc["warmup_samples_ns"] == [1000, 1007, 1014]
    assert doc["samples_ns"] == [1000 + 7 * k for k in range(3, 23)]
    assert doc["backend_info"]["timing"] == "the fake runtime's own clock"
    assert doc["speed_probe"]["bursts"] >= 1 and doc["speed_probe"]["loop"] == "python-sum-200"
    for min_time in (0.02, None):  # --min-time and --duration take the same steps
        kw = {"min_time_s": min_time} if min_time else {"duration_s": 0.02}
        doc = runner.bench(str(bundle.root), "fp32", warmup=0, iterations=5, threads=1, **kw)
        assert len(doc["samples_ns"]) >= 5 and doc["samples_ns"][:3] == [1000, 1007, 1014]


def test_a_session_without_a_step_is_timed_around_run(tmp_path, monkeypatch):
    from edgekit.agent import runner

    class Session:
        version = "0"

        def run(self, feeds):
            sum(range(20_000))

    bundle = _fake_backend(monkeypatch, tmp_path, Session)
    doc = runner.bench(str(bundle.root), "fp32", warmup=0, iterations=5, threads=1)
    assert "session.run(feeds)" in doc["backend_info"]["timing"]
    assert all(s > 10_000 for s in doc["samples_ns"])  # 20 000 additions in Python: far over 10 us


def test_a_step_that_cannot_bind_is_one_agent_failure(tmp_path, monkeypatch):
    from edgekit.agent import AgentFailure, runner

    class Session:
        version = "0"

        def run(self, feeds):
            pass

        def timed(self, feeds):
            raise RuntimeError("input 'x' has the wrong layout\nstack trace ...")

    bundle = _fake_backend(monkeypatch, tmp_path, Session)
    with pytest.raises(AgentFailure) as err:
        runner.bench(str(bundle.root), "fp32", warmup=0, iterations=5, threads=1)
    assert err.value.message == "binding the inputs of variant 'fp32' for timing failed: input 'x' has the wrong layout"
    assert "inputs" in err.value.hint


def test_a_static_shapes_backend_gets_the_variants_known_shapes(tmp_path, monkeypatch):
    from edgekit.agent import runner

    seen = []

    class Session:
        version = "0"

        def run(self, feeds):
            pass

    bundle = _fake_backend(monkeypatch, tmp_path, Session)
    fake = sys.modules["edgekit.agent.backends.fake"]
    fake.load = lambda path, threads, options=None, workdir=None: seen.append(dict(options)) or Session()
    runner.bench(str(bundle.root), "fp32", warmup=0, iterations=2, threads=1)
    assert "input_shapes" not in seen[-1]  # only for a backend that asks
    fake.STATIC_SHAPES = True
    runner.bench(str(bundle.root), "fp32", warmup=0, iterations=2, threads=1)
    assert seen[-1]["input_shapes"] == {}  # tiny's x is (-1, 16): not known, left dynamic
    manifest = json.loads((bundle.root / "manifest.json").read_text())
    manifest["variants"][0]["inputs"][0]["shape"] = [2, 16]
    (bundle.root / "manifest.json").write_text(json.dumps(manifest))
    runner.bench(str(bundle.root), "fp32", warmup=0, iterations=2, threads=1)
    assert seen[-1]["input_shapes"] == {"x": [2, 16]}
