"""`edgekit lava-job` and `edgekit results import-lava`.

The job is validated by LAVA's own schema (``lava_common.schemas.validate`` from Debian's
lava-common, run by the system Python). No LAVA server or dispatcher runs here: the test plays
the board's side by running the job's test steps as written, in a shell, with the bundle served
over HTTP on 127.0.0.1 and ``lava-test-case`` / ``lava-test-raise`` stand-ins that print LAVA's
signal lines; then it turns the output into the job log and results files the way LAVA records
them (one ``lvl: target`` entry per line; one result per test-case signal). That emulation of the
server is the only stand-in: the commands, the agent and the import are the real ones.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

DIGITS = REPO / "examples" / "digits"
SYSTEM_PYTHON = "/usr/bin/python3"
SIGNAL_RE = re.compile(r"<LAVA_SIGNAL_TESTCASE TEST_CASE_ID=(\S+) RESULT=(\w+)(?: MEASUREMENT=(\S+) UNITS=(\S+))?>")

FAKE_TEST_CASE = """#!/bin/sh
# lava-test-case NAME --result R [--measurement X --units U], as LAVA's test shell reports it
name="$1"; shift
while [ $# -gt 0 ]; do
  case "$1" in
    --result) result="$2"; shift 2;;
    --measurement) measurement="$2"; shift 2;;
    --units) units="$2"; shift 2;;
    *) shift;;
  esac
done
if [ -n "$measurement" ]; then
  echo "<LAVA_SIGNAL_TESTCASE TEST_CASE_ID=$name RESULT=$result MEASUREMENT=$measurement UNITS=$units>"
else
  echo "<LAVA_SIGNAL_TESTCASE TEST_CASE_ID=$name RESULT=$result>"
fi
"""
FAKE_RAISE = '#!/bin/sh\necho "<LAVA_SIGNAL_TESTRAISE $1>"\nexit 1\n'


def edgekit(*args, cwd=None, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "edgekit", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lava") / "bundle"
    r = edgekit("deploy", DIGITS / "digits_cnn.onnx", "--target", "local", "--no-bench", "-o", out)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def served(tmp_path):
    """An HTTP server on 127.0.0.1 serving tmp_path/www; yields (root, base URL)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _board_path(tmp_path: Path) -> str:
    bin_dir = tmp_path / "board-bin"
    bin_dir.mkdir()
    for name, text in (("lava-test-case", FAKE_TEST_CASE), ("lava-test-raise", FAKE_RAISE),
                       ("python3", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def run_on_board(job: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    """The job's inline test steps, run in one shell as LAVA's test shell runs them."""
    (test,) = [a["test"] for a in job["actions"] if "test" in a]
    steps = test["definitions"][0]["repository"]["run"]["steps"]
    script = "\n".join(steps) + "\n"
    env = {**os.environ, "PATH": _board_path(tmp_path), "TMPDIR": str(tmp_path)}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=600)


def lava_files(stdout: str, tmp_path: Path, job_id: int = 4211) -> tuple[Path, Path]:
    """The job log and results as LAVA keeps them (lavacli jobs logs --raw / results --yaml)."""
    log = [{"dt": "2026-11-28T07:00:00.000000", "lvl": "target", "msg": line} for line in stdout.splitlines()]
    results = [{"suite": "lava", "name": "job", "result": "pass", "job": str(job_id)}]
    for m in SIGNAL_RE.finditer(stdout):
        case = {"suite": "0_edgekit-bench", "name": m.group(1), "result": m.group(2), "job": str(job_id)}
        if m.group(3):
            case.update(measurement=m.group(3), unit=m.group(4))
        results.append(case)
    (tmp_path / "log.yaml").write_text(yaml.safe_dump(log))
    (tmp_path / "results.yaml").write_text(yaml.safe_dump(results))
    return tmp_path / "log.yaml", tmp_path / "results.yaml"


def _lava_validate(job_path: Path) -> subprocess.CompletedProcess:
    code = ("import sys, yaml; from lava_common.schemas import validate; "
            "validate(yaml.safe_load(open(sys.argv[1]))); print('valid')")
    return subprocess.run([SYSTEM_PYTHON, "-c", code, str(job_path)], capture_output=True, text=True, timeout=60)


def _have_lava_common() -> bool:
    return os.path.exists(SYSTEM_PYTHON) and subprocess.run(
        [SYSTEM_PYTHON, "-c", "import lava_common.schemas"], capture_output=True).returncode == 0


def test_job_validates_against_lavas_schema(bundle, tmp_path):
    if not _have_lava_common():
        pytest.skip("Debian's lava-common (LAVA's job schema) is not installed: apt-get install lava-common")
    job_path = tmp_path / "job.yaml"
    r = edgekit("lava-job", bundle, "--device-type", "bcm2711-rpi-4-b", "--bundle-url", "https://files.example/x.tar.gz",
                "-o", job_path, "--fail", "p99:<20ms", "--tag", "edge-lab", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert Path(doc["pack"]).is_file() and doc["pack"].endswith(".tar.gz")
    v = _lava_validate(job_path)
    assert v.returncode == 0 and "valid" in v.stdout, v.stderr
    # the schema is a real check: a job without the device type, or with a bad test name, fails it
    job = yaml.safe_load(job_path.read_text())
    broken = tmp_path / "broken.yaml"
    del job["device_type"]
    broken.write_text(yaml.safe_dump(job))
    assert _lava_validate(broken).returncode != 0
    job = yaml.safe_load(job_path.read_text())
    job["actions"][2]["test"]["definitions"][0]["name"] = "edgekit bench"  # whitespace: not a LAVA name
    broken.write_text(yaml.safe_dump(job))
    assert _lava_validate(broken).returncode != 0


def test_pack_is_deterministic(bundle):
    from edgekit.lava import pack

    assert pack(bundle) == pack(bundle)


def test_job_runs_on_a_board_and_its_results_round_trip(bundle, tmp_path, served):
    root, base = served
    data = tmp_path / "data"
    env = {**os.environ, "EDGEKIT_DATA_DIR": str(data)}
    job_path = tmp_path / "out" / "job.yaml"
    job_path.parent.mkdir()
    r = edgekit("lava-job", bundle, "--device-type", "x86", "--bundle-url", f"{base}/digits.tar.gz", "-o", job_path,
                "--iterations", "30", "--fail", "p99:<10s", "--json", env=env)
    assert r.returncode == 0, r.stderr
    shutil.copy(json.loads(r.stdout)["pack"], root / "digits.tar.gz")
    job = yaml.safe_load(job_path.read_text())
    board = run_on_board(job, tmp_path)
    assert board.returncode == 0, board.stdout[-2000:] + board.stderr[-2000:]
    cases = {m.group(1): m for m in SIGNAL_RE.finditer(board.stdout)}
    for variant in ("fp32", "int8"):
        assert cases[f"{variant}-bench"].group(2) == "pass"
        for metric in ("p50", "p90", "p99", "mean"):
            m = cases[f"{variant}-{metric}"]
            assert m.group(2) == "pass" and m.group(4) == "ms" and float(m.group(3)) > 0
    log, results = lava_files(board.stdout, tmp_path)
    r = edgekit("results", "import-lava", log, results, "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"imported": 2, "skipped": 0}
    again = edgekit("results", "import-lava", log, results, "--json", env=env)
    assert json.loads(again.stdout) == {"imported": 0, "skipped": 2}
    listed = json.loads(edgekit("results", "list", "--json", env=env).stdout)
    assert sorted(x["variant"] for x in listed) == ["fp32", "int8"]
    run = json.loads(edgekit("results", "show", str(listed[0]["id"]), "--json", "--samples", env=env).stdout)
    assert run["device"].startswith("lava:") and run["target"] == "local" and run["model_name"] == "digits_cnn"
    assert run["lava"] == {"job": "4211"}
    assert len(run["agent"]["samples_ns"]) == 30
    # the p50 LAVA shows is the one the store computes from the samples
    lava_p50 = float(cases[f"{run['agent']['variant']}-p50"].group(3))
    assert abs(lava_p50 - run["stats"]["p50"]) < 1e-3 * lava_p50 + 1e-6  # both in ms


def test_a_gate_missed_on_the_board_fails_its_case(bundle, tmp_path, served):
    root, base = served
    job_path = tmp_path / "job.yaml"
    r = edgekit("lava-job", bundle, "--device-type", "x86", "--bundle-url", f"{base}/p.tar.gz", "-o", job_path,
                "--variant", "int8", "--iterations", "5", "--fail", "p50:<1us", "--json")
    assert r.returncode == 0, r.stderr
    shutil.copy(json.loads(r.stdout)["pack"], root / "p.tar.gz")
    board = run_on_board(yaml.safe_load(job_path.read_text()), tmp_path)
    assert board.returncode == 1
    cases = {m.group(1): m.group(2) for m in SIGNAL_RE.finditer(board.stdout)}
    assert cases == {"int8-bench": "pass", "int8-p50": "fail", "int8-p90": "pass", "int8-p99": "pass", "int8-mean": "pass"}


def test_a_tampered_bundle_is_refused_on_the_board(bundle, tmp_path, served):
    root, base = served
    job_path = tmp_path / "job.yaml"
    r = edgekit("lava-job", bundle, "--device-type", "x86", "--bundle-url", f"{base}/t.tar.gz", "-o", job_path, "--json")
    assert r.returncode == 0, r.stderr
    data = bytearray(Path(json.loads(r.stdout)["pack"]).read_bytes())
    data[-40] ^= 0xFF
    (root / "t.tar.gz").write_bytes(bytes(data))
    board = run_on_board(yaml.safe_load(job_path.read_text()), tmp_path)
    assert "<LAVA_SIGNAL_TESTRAISE edgekit-bundle-checksum-mismatch>" in board.stdout
    assert "EDGEKIT-DOC" not in board.stdout


@pytest.mark.parametrize("case", ["no-log", "tampered", "not-lava"])
def test_import_lava_bad_input(bundle, tmp_path, served, case):
    root, base = served
    job_path = tmp_path / "job.yaml"
    r = edgekit("lava-job", bundle, "--device-type", "x86", "--bundle-url", f"{base}/b.tar.gz", "-o", job_path,
                "--variant", "fp32", "--iterations", "5", "--json")
    shutil.copy(json.loads(r.stdout)["pack"], root / "b.tar.gz")
    board = run_on_board(yaml.safe_load(job_path.read_text()), tmp_path)
    log, results = lava_files(board.stdout, tmp_path)
    env = {**os.environ, "EDGEKIT_DATA_DIR": str(tmp_path / "data")}
    if case == "no-log":
        args = [results]
    elif case == "tampered":
        doc = yaml.safe_load(results.read_text())
        for c in doc:
            if c["name"] == "fp32-p50":
                c["measurement"] = str(float(c["measurement"]) * 2)
        results.write_text(yaml.safe_dump(doc))
        args = [log, results]
    else:
        (tmp_path / "other.yaml").write_text("a: 1\n")
        args = [tmp_path / "other.yaml"]
    r = edgekit("results", "import-lava", *args, env=env)
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: "), r.stderr
    assert not (tmp_path / "data").exists() or "fp32" not in edgekit("results", "list", "--json", env=env).stdout


@pytest.mark.parametrize("args, code, words", [
    (["--fail", "p50:+5%"], 2, "absolute latency gate"),
    (["--variant", "int4"], 2, "no variant 'int4'"),
    (["--bundle-url", "not a url"], 2, "is not a URL"),
])
def test_lava_job_bad_input(bundle, tmp_path, args, code, words):
    base = ["--device-type", "x86", "--bundle-url", "https://x.example/b.tar.gz", "-o", tmp_path / "job.yaml"]
    r = edgekit("lava-job", bundle, *base, *args)
    assert r.returncode == code, r.stderr
    assert words in r.stderr and "hint: " in r.stderr
    assert not (tmp_path / "job.yaml").exists() and not (tmp_path / "job.tar.gz").exists()


def test_lava_job_refuses_a_directory_that_is_no_bundle(tmp_path):
    r = edgekit("lava-job", tmp_path, "--device-type", "x86", "--bundle-url", "https://x.example/b.tar.gz", "-o", tmp_path / "j.yaml")
    assert r.returncode == 3 and "is not a bundle" in r.stderr


def test_lava_job_bundles_a_model_file(tmp_path):
    r = edgekit("lava-job", DIGITS / "digits_cnn.onnx", "--target", "local", "--device-type", "x86",
                "--bundle-url", "https://x.example/d.tar.gz", "-o", tmp_path / "d.yaml", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert Path(doc["pack"]) == tmp_path / "d.tar.gz" and (tmp_path / doc["bundle"] / "manifest.json").is_file()
    job = yaml.safe_load((tmp_path / "d.yaml").read_text())
    assert job["metadata"]["edgekit.bundle_sha256"] == doc["pack_sha256"]
    no_target = edgekit("lava-job", DIGITS / "digits_cnn.onnx", "--device-type", "x86", "--bundle-url", "https://x.example/d.tar.gz",
                        "-o", tmp_path / "e.yaml", cwd=tmp_path)
    assert no_target.returncode == 2 and "--target" in no_target.stderr
