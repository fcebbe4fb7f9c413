"""Shared fixtures: an isolated edgekit home per test and a way to run the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab.fixtures import *  # noqa: F403  (the SSH lab: sshd_server, ssh_home, ssh_device, netns)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@pytest.fixture(autouse=True)
def edgekit_home(tmp_path_factory, monkeypatch):
    """Every test gets its own data/config/cache dirs, so results never leak between tests."""
    home = tmp_path_factory.mktemp("edgekit-home")
    for var, sub in (("EDGEKIT_DATA_DIR", "data"), ("EDGEKIT_CONFIG_DIR", "config"), ("EDGEKIT_CACHE_DIR", "cache")):
        (home / sub).mkdir()
        monkeypatch.setenv(var, str(home / sub))
    monkeypatch.delenv("EDGEKIT_DEBUG", raising=False)
    return home


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(tmp_path):
    """Run ``python -m edgekit ARGS`` in a subprocess (real exit codes, real stdout/stderr)."""

    def run(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600) -> CliResult:
        full_env = dict(os.environ)
        full_env["CI"] = "1"  # plain output, no animations
        full_env.update(env or {})
        proc = subprocess.run(
            [sys.executable, "-m", "edgekit", *map(str, args)],
            cwd=cwd or tmp_path,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return run


def assert_one_line_error(result: CliResult, code: int, needle: str = "") -> None:
    """Bad input: non-zero exit, exactly one ``error:`` and one ``hint:`` line, no traceback."""
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    hints = [ln for ln in lines if ln.startswith("hint: ")]
    assert len(errors) == 1, result.stderr
    assert len(hints) == 1, result.stderr
    assert "Traceback" not in result.stderr
    if needle:
        assert needle in errors[0], errors[0]
