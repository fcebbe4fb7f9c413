"""`edgekit ci`: an edgekit.toml run end to end (this machine, an emulated ARM board over SSH),
gates passing and failing on purpose, baselines from an earlier run (never a failed one: a red run
retried stays red), a fleet with a dead device that degrades instead of dying, device text that
cannot break the reports, JUnit validated against Jenkins' xunit junit-10.xsd, the Ant/Surefire
schema and tests/data/junit.xsd, the markdown summary rendered to HTML, the example pipelines'
commands, and bad configs."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import xmlschema
from markdown_it import MarkdownIt

from edgekit.ci.config import ConfigError, load_config
from tests.conftest import EXAMPLES, REPO, assert_one_line_error
from tests.lab.fixtures import emulated_boards

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
DATA = Path(__file__).parent / "data"
SCHEMA = DATA / "junit.xsd"  # edgekit's own: the subset every reader agrees on
JENKINS = DATA / "junit-10.xsd"  # Jenkins xunit plugin's, as shipped (source in the file)
SUREFIRE = DATA / "surefire-test-report.xsd"  # Ant/Surefire's: one <testsuite> per document
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
    """The JUnit file, valid against all three schemas (each suite on its own against Surefire's)."""
    xmlschema.XMLSchema(SCHEMA).validate(str(path))
    xmlschema.XMLSchema(JENKINS).validate(str(path))
    root = ET.parse(path).getroot()
    surefire = xmlschema.XMLSchema(SUREFIRE)
    for suite in root.iter("testsuite"):
        surefire.validate(ET.tostring(suite, encoding="unicode"))
    return root


def _md_table(md: str) -> tuple[list[str], list[list[str]]]:
    """The first table of a markdown document as GitHub-flavoured markdown renders it: header, rows."""
    html = MarkdownIt("gfm-like").render(md)
    table = ET.fromstring(html[html.index("<table>") : html.index("</table>") + len("</table>")])
    head = ["".join(th.itertext()) for th in table.iter("th")]
    rows = [["".join(td.itertext()) for td in tr.iter("td")] for tr in table.find("tbody")]
    return head, rows


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
    env["EDGEKIT_COMMIT"] = "c0ffee1234567890c0ffee1234567890c0ffee12"
    config = work / "edgekit.toml"
    model = f'[[models]]\npath = "{DIGITS}"\ntargets = ["local"]\n'
    config.write_text(FAST + model + 'gates = ["p50:+300%", "accuracy:-5pt", "p99:<10000ms"]\n')
    first = _edgekit("ci", "--junit", "first.xml", "--summary", "first.md", "--json", cwd=work, env=env)
    # the same model again, one gate made to fail: loading in under a microsecond (not a latency: other
    # jobs on a shared machine would make a latency gate's failure inconclusive, edgekit.bench.gates)
    config.write_text(FAST + model + 'gates = ["p50:+300%", "accuracy:-5pt", "p99:<10000ms", "load:<0.001ms"]\n')
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
    head, rows = _md_table(md)
    assert len(head) <= 7 and rows[0][:2] == ["local (local)", "✅ pass"], rows
    assert float(rows[0][2].removesuffix(" ms")) > 0 and rows[0][3] == "— (no baseline)" and rows[0][6] == "—"
    assert float(rows[0][4].removesuffix("×")) > 0  # int8 vs fp32 at p50, both measured in this run


@pytest.mark.slow
def test_a_second_run_is_gated_against_the_first(local_runs):
    r, work = local_runs.second, local_runs.work
    first = json.loads(local_runs.first.stdout)
    assert_one_line_error(r, 5, f"1 gate(s) failed: {CLASS} load:<0.001ms")
    doc = json.loads(r.stdout)
    run = doc["runs"][0]
    # the baseline is the first run's int8 record, not this run's own
    assert run["baseline"]["run_id"] in first["runs"][0]["run_ids"]
    assert run["baseline"]["run_id"] not in run["run_ids"]
    gates = _gates(doc, CLASS)
    latency = gates["p50:+300%"]
    # a pass against a first run that another job on this shared machine contended cannot be claimed
    busy_base = "the device ran other work during the baseline's timed window" in latency["line"]
    assert (latency["passed"] is True or (busy_base and latency["status"] == "inconclusive")) and latency["baseline"] > 0, latency
    assert gates["accuracy:-5pt"]["passed"] is True  # same model, same data
    assert gates["p99:<10000ms"]["passed"] is True
    failed = gates["load:<0.001ms"]
    assert failed["passed"] is False and failed["value"] > 0.001 and "FAIL" in failed["line"]

    root = _junit(work / "second.xml")
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("4", "1", "0", "1" if busy_base else "0")
    failure = _cases(root)[(CLASS, "load:<0.001ms")].find("failure")
    assert failure.get("message") == failed["line"] and "ms" in failure.get("message")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["local/local.backend"] == "native" and props["local/local.variant"] == "int8"
    assert float(props["local/local.p50_ms"]) > 0 and float(props["local/local.accuracy_pct"]) > 50
    assert props["local/local.baseline_run_id"] == str(run["baseline"]["run_id"])

    md = (work / "second.md").read_text()
    assert md.startswith("## edgekit ci: ❌ gate failed")
    head, rows = _md_table(md)
    assert rows[0][:2] == ["local (local)", "❌ fail"]
    assert "❌ fail `load:<0.001ms`" in md and "[HTML report](second.html)" in md
    assert local_runs.step.read_text() == md  # $GITHUB_STEP_SUMMARY gets the same summary
    html = (work / "second.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html
    assert html.count('class="gate fail"') == 1 and "limit &lt; 0.001 ms" in html


def store_threads(env: dict, run_id: int) -> int:
    from edgekit.bench.store import ResultsStore

    with ResultsStore(Path(env["EDGEKIT_DATA_DIR"]) / "results.db") as store:
        return store.get(run_id)["agent"]["config"]["threads"]


@pytest.mark.slow
def test_baselines_from_a_branch_run_ids_or_an_export_file(local_runs):
    from edgekit.bench.store import ResultsStore
    from edgekit.ci.config import Baseline
    from edgekit.ci.run import pick_baseline

    work, env = local_runs.work, local_runs.env
    first = json.loads(local_runs.first.stdout)["runs"][0]
    second = json.loads(local_runs.second.stdout)["runs"][0]
    want = second["baseline"]["run_id"]  # the first run's int8 record
    # the second run was timed at the thread count of the first (the agent's probe may choose
    # otherwise from one run to the next, and a gate compares runs of one thread count only)
    assert f"timing at {store_threads(env, want)} thread(s), as its last gated run ({want}) was" in local_runs.second.stderr
    export = _edgekit("results", "export", *map(str, first["run_ids"]), "-o", "baseline.json", cwd=work, env=env)
    assert export.returncode == 0, export.stderr
    with ResultsStore(Path(env["EDGEKIT_DATA_DIR"]) / "results.db") as store:
        want_record = store.get(want)
        record = next(r for r in map(store.get, second["run_ids"]) if r["agent"]["variant"] == "int8")
        assert record["vcs"]["branch"] == BRANCH

        def pick(baseline):
            return pick_baseline(store, baseline, record, exclude=set(second["run_ids"]))

        found, note = pick(Baseline("latest", branch=BRANCH))
        assert found["id"] == want and note.startswith(f"run {want} at c0ffee1234 on {BRANCH} of ")
        assert pick(Baseline("default"))[0]["id"] == want  # the first run passed; the second failed: never a baseline
        assert store.get(want)["outcome"] == "pass"
        assert store.get(next(i for i in second["run_ids"] if store.get(i)["agent"]["variant"] == "int8"))["outcome"] == "fail"
        assert pick(Baseline("latest", branch="elsewhere")) == (None, "no baseline yet (latest passing on elsewhere)")
        assert pick(Baseline("ids", ids=(*second["run_ids"], *first["run_ids"])))[0]["id"] == want  # this run's own are never its baseline
        found, note = pick(Baseline("file", file=work / "baseline.json"))
        assert found["run_uuid"] == want_record["run_uuid"] and note.startswith("baseline.json ")
        # a run timed at another thread count (the agent's probe chose otherwise) has no baseline,
        # and the note names the stored run and the setting that would gate against it
        threads = record["agent"]["config"]["threads"]
        other = copy.deepcopy(record)
        other["agent"]["config"]["threads"] = threads + 1
        found, note = pick_baseline(store, Baseline("default"), other, exclude=set(second["run_ids"]))
        assert found is None and f"no baseline at {threads + 1} thread(s): run {want} was timed at {threads} (a gate compares runs of one thread count; threads = {threads} gates against it)" in note, note
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
            'gates = ["p99:<60000ms", "load:<0.001ms"]\n'  # a load time: no other job can make its failure inconclusive
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
        assert gates["p99:<60000ms"]["passed"] is True and gates["load:<0.001ms"]["passed"] is False
    root = _junit(work / "junit.xml")
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "2", "0")
    cases = _cases(root)
    assert cases[("digits_fp32/rpi4/pi4-ci", "load:<0.001ms")].find("failure") is not None
    assert cases[("digits_fp32/rpi4/pi4-ci", "p99:<60000ms")].find("failure") is None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["rpi4/pi4-ci.arch"] == "aarch64" and props["local/local.backend"] == "onnxruntime"
    md = (work / "summary.md").read_text()
    _, rows = _md_table(md)
    assert [r[:2] for r in rows] == [["local (local)", "❌ fail"], ["pi4-ci (rpi4)", "❌ fail"]], rows


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
    "not a model": ('[[models]]\npath = "edgekit.toml"\n', 3, "models[0].path: not an ONNX model (or truncated)"),
    "no targets": (f'[[models]]\npath = "{DIGITS}"\ntargets = []\n', 3, "models[0].targets: is empty"),
    "accuracy over 100": (f'[[models]]\npath = "{DIGITS}"\ngates = ["accuracy:>200%"]\n', 3, "accuracy lies between 0 and 100"),
    "unknown preprocess": (f'[[models]]\npath = "{DIGITS}"\npreprocess = "scale=1/255,gamma=2"\n', 3, "models[0].preprocess"),
    "typo in a key": (f'[[models]]\npath = "{DIGITS}"\ngatse = ["p50:+5%"]\n', 3, "unknown key 'gatse'"),
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
    # an ONNX file (so the config takes it) that no backend can run: opset 999
    broken = onnx.load(DIGITS)
    broken.opset_import[0].version = 999
    onnx.save(broken, tmp_path / "broken.onnx")
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
    assert md.startswith("## edgekit ci: ❌ error") and "**broken/local/local** ❌ error:" in md


# -- a fleet that degrades, not dies ----------------------------------------------------------------


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connecting is refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Three devices of one model: two on this machine, one at a closed loopback port; run twice,
    with --fail-on-unreachable on (the default) and off."""
    work, env = _home(tmp_path_factory, "ci-fleet")
    (work / "devices.toml").write_text(
        '[devices.local-a]\nssh = "local"\nprofile = "local"\n'
        '[devices.local-b]\nssh = "local"\nprofile = "local"\n'
        f'[devices.dead]\nssh = "nobody@127.0.0.1:{_closed_port()}"\nprofile = "local"\n'
    )
    (work / "edgekit.toml").write_text(
        'inventory = "devices.toml"\n' + FAST
        + f'[[models]]\npath = "{DIGITS}"\ntargets = ["local"]\ndevices = ["local-a", "dead", "local-b"]\nquantize = false\ngates = ["p99:<60000ms"]\n'
    )  # fmt: skip
    args = ("ci", "--junit", "junit.xml", "--summary", "summary.md", "--report", "report.html", "--json")
    on = _edgekit(*args, cwd=work, env=env)
    files = {name: (work / name).read_bytes() for name in ("junit.xml", "summary.md", "report.html")}
    off = _edgekit(*args, "--fail-on-unreachable=false", cwd=work, env=env)
    return SimpleNamespace(work=work, on=on, off=off, files=files)


@pytest.mark.slow
def test_one_dead_device_of_three_is_an_error_case_and_the_others_run(fleet):
    r = fleet.on
    assert_one_line_error(r, 4, "1 of 3 run(s) failed: digits_cnn/local/dead: connection refused by 127.0.0.1:")
    doc = json.loads(r.stdout)
    assert [(x["device"], x["status"]) for x in doc["runs"]] == [("local-a", "passed"), ("dead", "unreachable"), ("local-b", "passed")]
    assert doc["devices"] == {"ok": 2, "failed": 0, "unreachable": 1} and "devices: 2 ok, 0 failed, 1 unreachable" in r.stderr
    with open(fleet.work / "first-junit.xml", "wb") as fh:
        fh.write(fleet.files["junit.xml"])
    root = _junit(fleet.work / "first-junit.xml")
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("3", "0", "1", "0")
    cases = _cases(root)
    error = cases[("digits_cnn/local/dead", "p99:<60000ms")].find("error")
    assert error.get("message").startswith("device unreachable: connection refused") and error.get("type") == "exit 4"
    for device in ("local-a", "local-b"):
        case = cases[(f"digits_cnn/local/{device}", "p99:<60000ms")]
        assert case.find("error") is None and case.find("failure") is None
        out = case.find("system-out").text  # the measured values where GitLab shows them
        assert "p99 " in out and "backend: onnxruntime" in out and "p50_ms: " in out
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert float(props["local/local-a.p50_ms"]) > 0 and props["local/dead.outcome"] == "unreachable"
    md = fleet.files["summary.md"].decode()
    _, rows = _md_table(md)
    assert [r[:2] for r in rows] == [["local-a (local)", "✅ pass"], ["dead (local)", "❌ unreachable"], ["local-b (local)", "✅ pass"]]
    html = fleet.files["report.html"].decode()
    assert html.startswith("<!DOCTYPE html>") and "1 run(s) did not finish" in html and "connection refused" in html


@pytest.mark.slow
def test_fail_on_unreachable_false_reports_the_dead_device_and_exits_0(fleet):
    r = fleet.off
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 0 and doc["fail_on_unreachable"] is False
    assert [x["status"] for x in doc["runs"]] == ["passed", "unreachable", "passed"]
    root = _junit(fleet.work / "junit.xml")
    assert root.get("errors") == "1"  # still an error case: the report says what happened
    assert "❌ unreachable" in (fleet.work / "summary.md").read_text()


def test_bad_flags_write_nothing(cli, tmp_path):
    (tmp_path / "edgekit.toml").write_text(f'[[models]]\npath = "{DIGITS}"\n')
    for flags, needle in ((["--fail-on-unreachable=perhaps"], "--fail-on-unreachable takes true or false"),
                          (["--inconclusive", "ignore"], "--inconclusive must be warn or fail")):  # fmt: skip
        r = cli("ci", "--junit", "junit.xml", *flags)
        assert_one_line_error(r, 2, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edgekit.toml"]


# -- device text is data -----------------------------------------------------------------------------

# What a crashing runtime printed on one real board, and what a hostile one could: colour codes, a
# markdown link and image, HTML that closes the PR comment's <details>, a GitHub workflow command,
# fake edgekit error lines.
EVIL = (
    "#!/bin/sh\n"
    "printf 'boot\\n::error::pwned\\nerror: fake error line\\n"
    "\\033[31;1mFATAL\\033[0m \\033]0;title\\007crash [click](http://evil.example) ![img](http://evil.example/x.png) </details> <b>x</b> | a | b |\\n' >&2\n"
    "exit 1\n"
)


@pytest.mark.slow
def test_device_text_with_ansi_and_markdown_cannot_break_junit_summary_or_the_terminal(tmp_path_factory):
    work, env = _home(tmp_path_factory, "ci-evil")
    evil = work / "evilpy"
    evil.write_text(EVIL)
    evil.chmod(0o755)
    (work / "devices.toml").write_text(f'[devices.evil]\nssh = "local"\nprofile = "local"\npython = "{evil}"\n[devices.ok]\nssh = "local"\nprofile = "local"\n')
    (work / "edgekit.toml").write_text(
        'inventory = "devices.toml"\n' + FAST + f'[[models]]\npath = "{DIGITS}"\ndevices = ["evil", "ok"]\nquantize = false\ngates = ["p99:<60000ms"]\n'
    )
    r = _edgekit("ci", "--junit", "junit.xml", "--summary", "summary.md", "--report", "report.html", cwd=work, env=env)
    assert r.returncode == 4, r.stderr
    # the terminal: no line starts with the device's text, none carries an escape sequence
    for line in (r.stdout + r.stderr).splitlines():
        assert not line.startswith(("::", "error: fake", "FATAL", "boot")) and "\x1b" not in line and "\x07" not in line, line
    assert sum(ln.startswith("error: ") for ln in r.stderr.splitlines()) == 1
    assert "FATAL" in r.stderr  # the text is shown, as text
    # JUnit: parses, validates, keeps the words without the codes
    raw = (work / "junit.xml").read_bytes()
    assert b"\x1b" not in raw and b"\x07" not in raw
    root = _junit(work / "junit.xml")
    error = _cases(root)[("digits_cnn/local/evil", "p99:<60000ms")].find("error")
    assert "FATAL crash [click](http://evil.example)" in error.get("message") and "\n" not in error.get("message")
    # the summary renders to plain text: no link, image, raw HTML or extra table cell from the device
    md = (work / "summary.md").read_text()
    html = MarkdownIt("gfm-like").render(md)
    assert "<img" not in html and "</details>" not in html and "<b>" not in html and "evil.example\"" not in html
    assert "<a href=\"http://evil" not in html and html.count("<a ") == 1  # the report link, nothing else
    assert "[click](http://evil.example)" in html.replace("&quot;", '"')  # shown as the text it is
    _, rows = _md_table(md)
    assert all(len(row) == 7 for row in rows)
    assert not any(ln.startswith(("::", "error: fake")) for ln in md.splitlines())
    report = (work / "report.html").read_text()
    assert "\x1b" not in report and "&lt;/details&gt;" in report and "</details>" not in report


def test_sanitize_plain_markdown_and_quoted():
    from edgekit.sanitize import markdown, plain, quoted

    text = "\x1b[31mred\x1b[0m\r\nnext\x00line \x1b]8;;http://x\x07link\x1b]8;;\x07 \u202eevil\x9b31m"
    assert plain(text) == "red next line link evil"
    assert plain("a" * 5000, limit=10) == "a" * 9 + "…"
    assert markdown("[x](http://y) ![i](z) <b> | & *s* `c`") == r"\[x\]\(http\://y\) \!\[i\]\(z\) &lt;b\> \| &amp; \*s\* \`c\`"
    assert quoted("error: ", "a\n::error::b\nhint: c") == "error: a ::error::b hint: c"
    with pytest.raises(ValueError):
        quoted("", "x")


# -- a red run retried unchanged stays red -----------------------------------------------------------


@pytest.mark.slow
def test_a_red_ci_run_retried_unchanged_stays_red(tmp_path_factory):
    work, env = _home(tmp_path_factory, "ci-red")
    env.update(EDGEKIT_BRANCH="main", EDGEKIT_DEFAULT_BRANCH="main")
    held = np.load(EXAMPLES / "digits" / "heldout.npz")["input"]
    # calibrated on 1000x the real range: every real input rounds to a few int8 steps (accuracy ~8 %)
    np.savez(work / "bad_calib.npz", input=(held[:100] * 1000).astype(np.float32))
    model = f'[[models]]\npath = "{DIGITS}"\ntargets = ["local"]\ngates = ["accuracy:-5pt"]\n'
    (work / "good.toml").write_text(FAST + model)
    # strict = false: the accuracy gate judges the run (strict would refuse the int8 model before any run)
    (work / "bad.toml").write_text(FAST + model + 'calib = "bad_calib.npz"\nstrict = false\n')
    good = _edgekit("ci", "-c", "good.toml", "--json", cwd=work, env=env)
    assert good.returncode == 0, good.stderr
    baseline = json.loads(good.stdout)["runs"][0]["baseline"]
    assert baseline["run_id"] is None  # the first run: no baseline yet, it passes and becomes one
    first_int8 = json.loads(good.stdout)["runs"][0]["facts"]["run_id"]
    for attempt in ("red run", "retry", "second retry"):
        r = _edgekit("ci", "-c", "bad.toml", "--json", cwd=work, env=env)
        assert r.returncode == 5, (attempt, r.stderr)
        run = json.loads(r.stdout)["runs"][0]
        gate = run["gates"][0]
        assert run["baseline"]["run_id"] == first_int8, (attempt, run["baseline"])  # never the failed run before it
        assert gate["status"] == "fail" and gate["value"] < gate["baseline"] - 5, (attempt, gate["line"])


# -- papercuts -------------------------------------------------------------------------------------


def test_every_user_toml_refuses_an_unknown_key_with_a_did_you_mean(tmp_path):
    from edgekit.devices.inventory import load_inventory
    from edgekit.errors import EdgekitError
    from edgekit.modelio import load_model
    from edgekit.profiles import load_profile

    shutil.copy(DIGITS, tmp_path / "m.onnx")
    shutil.copy(EXAMPLES / "digits" / "calib.npz", tmp_path / "calib.npz")
    (tmp_path / "m.edgekit.toml").write_text('[calibration]\ndat = "calib.npz"\n')  # was: random calibration data, silently
    cases = [
        (lambda: load_model(tmp_path / "m.onnx"), "calibration.dat: unknown key 'dat'", "did you mean 'data'?"),
    ]
    (tmp_path / "devices.toml").write_text('[devices.pi]\nssh = "pi@h"\nprofil = "rpi4"\n')
    cases.append((lambda: load_inventory(tmp_path / "devices.toml"), "devices.pi: unknown key 'profil'", "did you mean 'profile'?"))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "rpi4.toml").write_text("descripton = 'x'\n" + (REPO / "edgekit" / "profiles" / "rpi4.toml").read_text())
    cases.append((lambda: load_profile(str(tmp_path / "profiles" / "rpi4.toml")), "unknown key (did you mean 'description'?)", ""))
    (tmp_path / "edgekit.toml").write_text(f'[[models]]\npath = "{DIGITS}"\nitertions = 5\n')
    cases.append((lambda: load_config(tmp_path / "edgekit.toml"), "unknown key 'itertions'", "did you mean 'iterations'?"))
    for call, message, hint in cases:
        with pytest.raises(EdgekitError) as info:
            call()
        assert message in info.value.message and hint in (info.value.hint or ""), (info.value.message, info.value.hint)


def test_the_ci_config_takes_preprocess_as_the_cli_does(tmp_path):
    from edgekit.quantize.calib import Preprocess

    text = "scale=1/255,mean=0.485/0.456/0.406,std=0.229/0.224/0.225,color=rgb"
    (tmp_path / "edgekit.toml").write_text(f'[defaults]\npreprocess = "{text}"\n[[models]]\npath = "{DIGITS}"\n')
    assert load_config(tmp_path / "edgekit.toml").models[0].options["preprocess"] == Preprocess.parse(text)


# -- three outcomes in the reports -------------------------------------------------------------------


def _synthetic(tmp_path, inconclusive: str):
    """A CiResult of one run gated against a baseline 30 samples could not tell it from (no deploy)."""
    from edgekit.bench.gates import parse_gate
    from edgekit.bench.record import make_record
    from edgekit.ci.run import CiResult, Run
    from tests.builders import bench_doc

    rng = np.random.default_rng(1)
    base = make_record(bench_doc([int(x) for x in rng.lognormal(np.log(1e6), 0.5, 30)]), model_name="m", target="t", device="d",
                       extra={"vcs": {"branch": "main", "commit": "feedface" * 5}})  # fmt: skip
    cand = make_record(bench_doc([int(x) for x in rng.lognormal(np.log(1.08e6), 0.5, 30)]), model_name="m", target="t", device="d")
    base["id"], cand["id"] = 1, 2
    (tmp_path / "edgekit.toml").write_text(f'[[models]]\npath = "{DIGITS}"\nname = "m"\ngates = ["p50:+5%", "p99:<60000ms"]\n')
    config = load_config(tmp_path / "edgekit.toml")
    run = Run("m", "t", "d", records=[cand], record=cand, baseline=base, baseline_note="run 1 at feedfacef on main of 2026-11-28")
    run.gates = [parse_gate("p50:+5%").check(cand, base), parse_gate("p99:<60000ms").check(cand, base)]
    return CiResult(config, [run], 1.0, inconclusive=inconclusive)


@pytest.mark.parametrize("policy, code", [("warn", 0), ("fail", 5)])
def test_an_inconclusive_gate_is_skipped_with_its_reason_or_fails_by_policy(tmp_path, policy, code):
    from edgekit.ci.junit import write_junit
    from edgekit.ci.summary import markdown

    result = _synthetic(tmp_path, policy)
    assert [g.outcome for g in result.runs[0].gates] == ["inconclusive", "pass"]
    assert result.exit_code == code and result.runs[0].outcome == "inconclusive"
    root = _junit(write_junit(result, tmp_path / "junit.xml"))
    case = _cases(root)[("m/t/d", "p50:+5%")]
    if policy == "warn":
        assert case.find("skipped").get("message").startswith("inconclusive: p50 ") and "spans the limit" in case.find("skipped").get("message")
        assert case.find("failure") is None
    else:
        assert case.find("failure").get("type") == "inconclusive (--inconclusive fail)"
    md = markdown(result, "https://ci.example/run 7")
    head, rows = _md_table(md)
    assert head == ["device", "result", "p50", "Δ p50 vs baseline (95% CI)", "int8 speed-up", "accuracy drop", "baseline commit (date)"]
    assert rows[0][1] == "⚠️ inconclusive" and rows[0][3].startswith("+") and "%" in rows[0][3] and ".." in rows[0][3]
    assert rows[0][6].startswith("feedfacefe (2026-") and "run 1" in rows[0][6]
    assert "⚠️ inconclusive `p50:+5%`" in md and "[HTML report](https://ci.example/run%207)" in md
    assert "1 inconclusive" in result.verdict()
