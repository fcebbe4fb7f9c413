"""`edgekit ci`: an edgekit.toml run end to end (this machine, an emulated ARM board over SSH),
gates passing and failing on purpose, baselines from an earlier run, JUnit validated against
tests/data/junit.xsd, the markdown summary, the example pipelines' commands, and bad configs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest
import xmlschema

from edgekit.ci.config import ConfigError, load_config
from tests.conftest import EXAMPLES, REPO, assert_one_line_error
from tests.lab.fixtures import emulated_boards

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
SCHEMA = Path(__file__).parent / "data" / "junit.xsd"
FAST = "[defaults]\niterations = 30\nwarmup = 3\n"
BRANCH = "ci-test-main"
BOARD = ("ci-gates", "cortex-a72", 31)  # its own name and link: other modules' boards may be up


def _edgekit(*args, cwd: Path, env: dict, timeout: float = 900) -> SimpleNamespace:
    """The real CLI in a subprocess with ``env`` (module-scoped runs can't use the per-test ``cli``)."""
    outer = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}  # only where a test sets it
    full = {**outer, "CI": "1", **env}
    proc = subprocess.run([sys.executable, "-m", "edgekit", *map(str, args)], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)
    return SimpleNamespace(returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr)


def _home(tmp_path_factory, name: str) -> tuple[Path, dict]:
    """A work dir and the env of an edgekit home of its own (store, cache, config)."""
    root = tmp_path_factory.mktemp(name)
    env = {}
    for var, sub in (("EDGEKIT_DATA_DIR", "data"), ("EDGEKIT_CONFIG_DIR", "config"), ("EDGEKIT_CACHE_DIR", "cache")):
        (root / sub).mkdir()
        env[var] = str(root / sub)
    (root / "work").mkdir()
    return root / "work", env


def _junit(path: Path) -> ET.Element:
    xmlschema.XMLSchema(SCHEMA).validate(str(path))
    return ET.parse(path).getroot()


def _cases(root: ET.Element) -> dict[tuple[str, str], ET.Element]:
    return {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}


def _gates(doc: dict, classname: str) -> dict[str, dict]:
    run = next(r for r in doc["runs"] if f"{r['model']}/{r['target']}/{r['device']}" == classname)
    return {g["gate"]: g for g in run["gates"]}


# -- this machine: a first run (no baseline), then a second one gated against it -----------------


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory):
    work, env = _home(tmp_path_factory, "ci-local")
    env["EDGEKIT_BRANCH"] = BRANCH  # what CI's variables say; runs are stored under it
    config = work / "edgekit.toml"
    model = f'[[models]]\npath = "{DIGITS}"\ntargets = ["local"]\n'
    config.write_text(FAST + model + 'gates = ["p50:+300%", "accuracy:-5pt", "p99:<10000ms"]\n')
    first = _edgekit("ci", "--junit", "first.xml", "--summary", "first.md", "--json", cwd=work, env=env)
    # the same model again, one gate made to fail: p99 under a microsecond
    config.write_text(FAST + model + 'gates = ["p50:+300%", "accuracy:-5pt", "p99:<10000ms", "p99:<0.001ms"]\n')
    step = work / "step-summary.md"
    second = _edgekit(
        "ci", "--junit", "second.xml", "--summary", "second.md", "--report", "second.html", "--json",
        cwd=work, env={**env, "GITHUB_STEP_SUMMARY": str(step)},
    )  # fmt: skip
    return SimpleNamespace(work=work, env=env, first=first, second=second, step=step)


CLASS = "digits_cnn/local/local"


@pytest.mark.slow
def test_a_first_run_has_no_baseline_yet_and_passes(local_runs):
    r, work = local_runs.first, local_runs.work
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["kind"], doc["exit_code"]) == ("edgekit.ci", 0)
    gates = _gates(doc, CLASS)
    assert gates["p50:+300%"]["passed"] is None and "no baseline yet" in gates["p50:+300%"]["line"]
    assert gates["accuracy:-5pt"]["passed"] is None
    assert gates["p99:<10000ms"]["passed"] is True  # absolute: needs no baseline
    assert "no baseline yet" in r.stderr and "not a failure" in r.stderr
    run = doc["runs"][0]
    assert run["baseline"]["run_id"] is None and run["facts"]["variant"] == "int8" and len(run["run_ids"]) == 2

    root = _junit(work / "first.xml")
    suite = root.find("testsuite")
    assert (suite.get("name"), suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("digits_cnn", "3", "0", "0", "2")
    assert "no baseline yet" in _cases(root)[(CLASS, "p50:+300%")].find("skipped").get("message")

    md = (work / "first.md").read_text()
    assert md.startswith("## edgekit ci: ✅ passed") and "no baseline yet" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| local (local) |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["int8", "native"] and cells[6:9] == ["—", "—", "✅"], cells
    assert float(cells[3]) > 0 and float(cells[4]) >= float(cells[3])


@pytest.mark.slow
def test_a_second_run_is_gated_against_the_first(local_runs):
    r, work = local_runs.second, local_runs.work
    first = json.loads(local_runs.first.stdout)
    assert_one_line_error(r, 5, f"1 gate(s) failed: {CLASS} p99:<0.001ms")
    doc = json.loads(r.stdout)
    run = doc["runs"][0]
    # the baseline is the first run's int8 record, not this run's own
    assert run["baseline"]["run_id"] in first["runs"][0]["run_ids"]
    assert run["baseline"]["run_id"] not in run["run_ids"]
    gates = _gates(doc, CLASS)
    assert gates["p50:+300%"]["passed"] is True and gates["p50:+300%"]["baseline"] > 0
    assert gates["accuracy:-5pt"]["passed"] is True  # same model, same data
    assert gates["p99:<10000ms"]["passed"] is True
    failed = gates["p99:<0.001ms"]
    assert failed["passed"] is False and failed["value"] > 0.001 and "FAIL" in failed["line"]

    root = _junit(work / "second.xml")
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("4", "1", "0", "0")
    failure = _cases(root)[(CLASS, "p99:<0.001ms")].find("failure")
    assert failure.get("message") == failed["line"] and "ms" in failure.get("message")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["local/local.backend"] == "native" and props["local/local.variant"] == "int8"
    assert float(props["local/local.p50_ms"]) > 0 and float(props["local/local.accuracy_pct"]) > 50
    assert props["local/local.baseline_run_id"] == str(run["baseline"]["run_id"])

    md = (work / "second.md").read_text()
    assert md.startswith("## edgekit ci: ❌ gate failed")
    row = next(ln for ln in md.splitlines() if ln.startswith("| local (local) |"))
    assert [c.strip() for c in row.strip("|").split("|")][6:10] == ["✅", "✅", "✅", "❌"]
    assert f"**{CLASS}** ❌ p99" in md
    assert local_runs.step.read_text() == md  # $GITHUB_STEP_SUMMARY gets the same summary
    html = (work / "second.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html
    assert html.count('class="gate fail"') == 1 and "limit &lt; 0.001 ms" in html


@pytest.mark.slow
def test_baselines_from_a_branch_run_ids_or_an_export_file(local_runs):
    from edgekit.bench.store import ResultsStore
    from edgekit.ci.config import Baseline
    from edgekit.ci.run import pick_baseline

    work, env = local_runs.work, local_runs.env
    first = json.loads(local_runs.first.stdout)["runs"][0]
    second = json.loads(local_runs.second.stdout)["runs"][0]
    want = second["baseline"]["run_id"]  # the first run's int8 record
    export = _edgekit("results", "export", *map(str, first["run_ids"]), "-o", "baseline.json", cwd=work, env=env)
    assert export.returncode == 0, export.stderr
    with ResultsStore(Path(env["EDGEKIT_DATA_DIR"]) / "results.db") as store:
        want_record = store.get(want)
        record = next(r for r in map(store.get, second["run_ids"]) if r["agent"]["variant"] == "int8")
        assert record["vcs"]["branch"] == BRANCH

        def pick(baseline):
            return pick_baseline(store, baseline, record, exclude=set(second["run_ids"]))

        found, note = pick(Baseline("latest", branch=BRANCH))
        assert found["id"] == want and note.startswith(f"run {want} of ")
        assert pick(Baseline("latest", branch="elsewhere")) == (None, "no baseline yet (latest on elsewhere)")
        assert pick(Baseline("ids", ids=(*second["run_ids"], *first["run_ids"])))[0]["id"] == want  # this run's own are never its baseline
        found, note = pick(Baseline("file", file=work / "baseline.json"))
        assert found["run_uuid"] == want_record["run_uuid"] and note.startswith("baseline.json ")
    (work / "baseline.toml").write_text(FAST + f'[baseline]\nfile = "baseline.json"\n\n[[models]]\npath = "{DIGITS}"\n')
    assert load_config(work / "baseline.toml").baseline == Baseline("file", file=work / "baseline.json")
    assert load_config(work / "baseline.toml", baseline="12,13").baseline == Baseline("ids", ids=(12, 13))
    with pytest.raises(ConfigError, match="'nosuch' is not a baseline"):
        load_config(work / "baseline.toml", baseline="nosuch")
    (work / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="bad.json is not an edgekit results export"):
        load_config(work / "baseline.toml", baseline=str(work / "bad.json"))


# -- this machine and an emulated Raspberry Pi 4 in one file ---------------------------------------


@pytest.fixture(scope="module")
def board_run(tmp_path_factory):
    with emulated_boards(BOARD) as boards:
        work, env = _home(tmp_path_factory, "ci-board")
        home = work.parent / "home"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "config").write_text(boards[BOARD[0]].ssh_config("pi4-ci"))
        # the rpi4 target has no devices named: the inventory's rpi4 devices; local: this machine
        (work / "devices.toml").write_text('[devices.pi4-ci]\nssh = "pi4-ci"\nprofile = "rpi4"\n')
        (work / "edgekit.toml").write_text(
            "[defaults]\niterations = 5\nwarmup = 1\n\n"
            f'[[models]]\npath = "{DIGITS}"\nname = "digits_fp32"\ntargets = ["local", "rpi4"]\nquantize = false\n'
            'gates = ["p99:<60000ms", "p99:<0.001ms"]\n'
        )
        r = _edgekit("ci", "--junit", "junit.xml", "--summary", "summary.md", "--json", cwd=work, env={**env, "HOME": str(home)})
        yield SimpleNamespace(work=work, result=r)


@pytest.mark.slow
def test_ci_on_this_machine_and_an_emulated_arm_board(board_run):
    r, work = board_run.result, board_run.work
    assert r.returncode == 5, r.stderr
    doc = json.loads(r.stdout)
    assert [(x["target"], x["device"]) for x in doc["runs"]] == [("local", "local"), ("rpi4", "pi4-ci")]
    board = next(x for x in doc["runs"] if x["device"] == "pi4-ci")
    assert (board["facts"]["arch"], board["facts"]["cpu_model"], board["facts"]["backend"]) == ("aarch64", "cortex-a72", "numpy")
    for classname in ("digits_fp32/local/local", "digits_fp32/rpi4/pi4-ci"):
        gates = _gates(doc, classname)
        assert gates["p99:<60000ms"]["passed"] is True and gates["p99:<0.001ms"]["passed"] is False
    root = _junit(work / "junit.xml")
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "2", "0")
    cases = _cases(root)
    assert cases[("digits_fp32/rpi4/pi4-ci", "p99:<0.001ms")].find("failure") is not None
    assert cases[("digits_fp32/rpi4/pi4-ci", "p99:<60000ms")].find("failure") is None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["rpi4/pi4-ci.arch"] == "aarch64" and props["local/local.backend"] == "onnxruntime"
    md = (work / "summary.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| local (local) |") or ln.startswith("| pi4-ci (rpi4) |")]
    assert len(rows) == 2 and all(row.rstrip(" |").split("|")[-3:-1] == [" ✅ ", " ❌ "] for row in rows), rows


# -- the example pipelines, by running their commands ---------------------------------------------


def _pipeline_commands() -> dict[str, tuple[list[str], list[str]]]:
    """File -> (the commands its steps run, the files it uploads)."""
    import yaml

    gh = yaml.safe_load((REPO / "examples" / "ci" / "github-actions.yml").read_text())
    steps = gh["jobs"]["bench"]["steps"]
    uploads = next(s["with"]["path"].split() for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    gl = yaml.safe_load((REPO / "examples" / "ci" / "gitlab-ci.yml").read_text())["edgekit"]
    assert gl["artifacts"]["reports"]["junit"] in gl["artifacts"]["paths"]
    return {
        "github-actions.yml": ([s["run"] for s in steps if "run" in s], uploads),
        "gitlab-ci.yml": (list(gl["script"]), list(gl["artifacts"]["paths"])),
    }


@pytest.mark.parametrize("pipeline", ["github-actions.yml", "gitlab-ci.yml"])
@pytest.mark.slow
def test_the_example_pipelines_run(pipeline, tmp_path, edgekit_home):
    commands, artifacts = _pipeline_commands()[pipeline]
    # a copy of this repo's examples with a quicker edgekit.toml of the same shape
    shutil.copytree(EXAMPLES / "digits", tmp_path / "examples" / "digits")
    (tmp_path / "edgekit.toml").write_text(
        FAST + '[[models]]\npath = "examples/digits/digits_cnn.onnx"\ntargets = ["local"]\ngates = ["p50:+300%", "p99:<10000ms"]\n'
    )
    bindir = Path(sys.executable).parent
    assert (bindir / "edgekit").exists()  # what the install step provides, installed here already
    ran = 0
    for command in commands:
        if "pip install" in command:
            continue  # the venv has edgekit; installing it again is not what is tested
        env = {**os.environ, "CI": "true", "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "GITHUB_STEP_SUMMARY": str(tmp_path / "step.md")}
        proc = subprocess.run(["bash", "-eo", "pipefail", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, (command, proc.stderr)
        ran += 1
    assert ran == 1
    for name in artifacts:
        assert (tmp_path / name).stat().st_size > 0, name
    root = _junit(tmp_path / "edgekit-junit.xml")
    assert root.get("tests") == "2" and root.get("failures") == "0"


# -- bad edgekit.toml: one error and hint, exit 3 or 4, no output file ----------------------------


BAD = {
    "syntax": ('[[models]\npath = "m.onnx"\n', 3, "edgekit.toml:1:"),
    "unknown key": (f'[[models]]\npath = "{DIGITS}"\ngate = ["p50:+5%"]\n', 3, "edgekit.toml:3: models[0]: unknown key 'gate'"),
    "unknown top key": (f'model = "x"\n[[models]]\npath = "{DIGITS}"\n', 3, "unknown key 'model'"),
    "unknown gate metric": (f'[[models]]\npath = "{DIGITS}"\ngates = ["p50:+5%", "latency:+5%"]\n', 3, "models[0].gates[1]: unknown gate metric 'latency'"),
    "bad gate": (f'[[models]]\npath = "{DIGITS}"\ngates = ["p50:5ms"]\n', 3, "models[0].gates[0]"),
    "missing model": ('[[models]]\npath = "nope/model.onnx"\n', 3, "models[0].path: no such file: nope/model.onnx"),
    "wrong type": (f'[[models]]\npath = "{DIGITS}"\niterations = "ten"\n', 3, "models[0].iterations: must be a positive integer"),
    "negative min_time": (f'[[models]]\npath = "{DIGITS}"\nmin_time = -1\n', 3, "models[0].min_time: must be seconds in 0..3600"),
    "zero rounds": (f'[[models]]\npath = "{DIGITS}"\nrounds = 0\n', 3, "models[0].rounds: must be >= 1"),
    "unknown target": (f'[[models]]\npath = "{DIGITS}"\ntargets = ["nosuchboard"]\n', 3, "models[0].targets"),
    "no models": ("[defaults]\niterations = 5\n", 3, "no [[models]]"),
    "two baselines": (f'[baseline]\nbranch = "main"\nref = "latest"\n[[models]]\npath = "{DIGITS}"\n', 3, "exactly one of ref, branch, file"),
    "unreachable device": (f'[[models]]\npath = "{DIGITS}"\ndevices = ["nobody@127.0.0.1:1"]\n', 4, "device nobody@127.0.0.1:1"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_config_stops_before_anything_runs(case, cli, tmp_path):
    text, code, needle = BAD[case]
    (tmp_path / "edgekit.toml").write_text(text)
    (tmp_path / "home").mkdir()
    r = cli("ci", "--junit", "junit.xml", "--summary", "summary.md", "--report", "report.html", env={"HOME": str(tmp_path / "home")})
    assert_one_line_error(r, code, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edgekit.toml", "home"]  # no partial output, no bundle
    assert r.stdout == ""


def test_config_defaults_paths_and_units(tmp_path):
    (tmp_path / "data").mkdir()
    shutil.copy(EXAMPLES / "digits" / "calib.npz", tmp_path / "data" / "calib.npz")
    (tmp_path / "ci.toml").write_text(
        'jobs = 2\n[defaults]\niterations = 7\nmax_drop = 0.5\ngates = ["p50:+5%"]\n[baseline]\nbranch = "main"\n'
        f'[[models]]\npath = "{DIGITS}"\ncalib = "data/calib.npz"\n'
        f'[[models]]\npath = "{DIGITS}"\nname = "again"\niterations = 9\ngates = ["p99:<20ms", "accuracy:-0.5pt"]\nduration = 2\nmin_time = 0\nrounds = 3\n'
    )
    c = load_config(tmp_path / "ci.toml")
    a, b = c.models
    assert (c.jobs, c.baseline.kind, c.baseline.branch) == (2, "latest", "main")
    assert a.name == "digits_cnn" and a.options["calib"] == tmp_path / "data" / "calib.npz"
    assert a.options["iterations"] == 7 and a.options["max_drop"] == 0.5  # points, as the CLI and the API take them
    assert [g.text for g in a.gates] == ["p50:+5%"] and [g.metric for g in b.gates] == ["p99", "accuracy"]
    assert b.options["iterations"] == 9 and b.options["duration_s"] == 2 and b.options["min_time_s"] == 0
    assert b.options["rounds"] == 3 and "rounds" not in a.options
    assert [(t, [e.name for e in entries]) for t, entries in a.runs] == [("local", ["local"])]
    assert load_config(tmp_path / "ci.toml", baseline="latest@dev").baseline.branch == "dev"
    (tmp_path / "dup.toml").write_text(f'[[models]]\npath = "{DIGITS}"\n[[models]]\npath = "{DIGITS}"\n')
    with pytest.raises(ConfigError, match="two models are named 'digits_cnn'"):
        load_config(tmp_path / "dup.toml")


def test_the_repo_edgekit_toml_is_valid():
    c = load_config(REPO / "edgekit.toml")
    assert [m.name for m in c.models] == ["digits_cnn", "mobilenetv2"]
    for m in c.models:
        assert [g.text for g in m.gates] == ["p50:+5%", "accuracy:-0.5pt", "p99:<20ms"]
        assert [t for t, _ in m.runs] == ["local"]


@pytest.mark.slow
def test_a_model_that_cannot_deploy_is_an_error_and_the_others_still_run(cli, tmp_path):
    (tmp_path / "broken.onnx").write_bytes(b"not an onnx model")
    (tmp_path / "edgekit.toml").write_text(
        FAST + '[[models]]\npath = "broken.onnx"\ngates = ["p99:<10000ms"]\n'
        f'[[models]]\npath = "{DIGITS}"\ngates = ["p99:<10000ms"]\n'
    )
    r = cli("ci", "--junit", "junit.xml", "--summary", "summary.md", "--json")
    assert_one_line_error(r, 3, "1 of 2 run(s) failed: broken/local/local")
    doc = json.loads(r.stdout)
    assert [x["status"] for x in doc["runs"]] == ["error", "passed"]
    root = _junit(tmp_path / "junit.xml")
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert (suites["broken"].get("errors"), suites["digits_cnn"].get("errors"), suites["digits_cnn"].get("failures")) == ("1", "0", "0")
    error = _cases(root)[("broken/local/local", "p99:<10000ms")].find("error")
    assert error.get("message").startswith("deploy failed: ") and error.get("type") == "exit 3"
    md = (tmp_path / "summary.md").read_text()
    assert md.startswith("## edgekit ci: ❌ error") and "**broken/local/local**: error:" in md
