"""`edgekit --version` / `edgekit version [--json]` and typer's shell completion, run as a user
runs them (a subprocess: real exit codes, real output)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import edgekit
from edgekit import _ekrt
from tests.conftest import assert_one_line_error


def test_version_flag_names_edgekit_ekrt_and_the_installed_runtimes(cli):
    r = cli("--version", env={"EKRT_ISA": "scalar"})
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines() if line.strip())
    assert lines["edgekit"] == edgekit.__version__
    assert lines["ekrt"].startswith(_ekrt.version + " (")
    assert all(isa in lines["ekrt"] for isa in _ekrt.built_isas().split(","))
    assert lines["ekrt"].endswith("running: scalar)")  # EKRT_ISA pins the dispatch; the line shows it
    assert lines["onnxruntime"] == metadata.version("onnxruntime")
    assert lines["tensorrt"] == "-" or lines["tensorrt"][0].isdigit()
    assert lines["ekrt-runner"].endswith("/ekrt") or lines["ekrt-runner"].startswith("not prebuilt")
    assert r.stderr == ""
    assert cli("-V").stdout == cli("--version").stdout


def test_version_json_is_one_document_with_the_same_facts(cli):
    r = cli("version", "--json", env={"EKRT_ISA": "avx2"})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["edgekit"] == edgekit.__version__
    assert doc["ekrt"]["version"] == _ekrt.version
    assert doc["ekrt"]["built_isas"] == _ekrt.built_isas().split(",")
    assert "scalar" in doc["ekrt"]["built_isas"]
    # the dispatch honours EKRT_ISA where the CPU has it, else falls back: never an ISA not built
    assert doc["ekrt"]["isa"] in doc["ekrt"]["built_isas"]
    assert doc["runtimes"]["onnxruntime"] == metadata.version("onnxruntime")
    assert set(doc["runtimes"]) == {"onnxruntime", "openvino", "ai_edge_litert", "tflite_runtime", "tensorrt"}
    plain = cli("version").stdout
    assert plain == cli("--version").stdout and plain.startswith("edgekit")


def test_version_bad_option_is_a_usage_error(cli):
    assert_one_line_error(cli("version", "--jsn"), 2, "--jsn")


def _complete(words: str, cword: int) -> list[str]:
    env = {**os.environ, "_EDGEKIT_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    proc = subprocess.run([sys.executable, "-m", "edgekit"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_shell_completion_completes_commands_subcommands_and_options():
    assert _complete("edgekit dep", 1) == ["deploy"]
    assert _complete("edgekit profiles s", 2) == ["show"]
    assert "--target" in _complete("edgekit deploy --ta", 2)
    assert _complete("edgekit nosuchcommand", 1) == []


def test_completion_script_for_bash(cli):
    r = cli("--show-completion", "bash")
    assert r.returncode == 0, r.stderr
    assert "_EDGEKIT_COMPLETE=complete_bash" in r.stdout and "complete " in r.stdout
