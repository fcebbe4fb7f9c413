"""A type checker runs on the Python API (issue 24, item 6): edgekit/api.py and a typed user script
(tests/typed/api_usage.py) check clean, and every wrong call in tests/typed/api_misuse.py (a count
given as a string, an unknown option, a positional option...) is flagged, each on its own line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")

TYPED = REPO / "tests" / "typed"
FLAGS = ["--follow-imports=silent", "--ignore-missing-imports", "--disallow-untyped-defs", "--disallow-incomplete-defs", "--no-error-summary"]


def test_mypy_checks_the_api_and_flags_every_wrong_call(tmp_path):
    files = ["edgekit/api.py", "tests/typed/api_usage.py", "tests/typed/api_misuse.py"]
    r = subprocess.run(
        [sys.executable, "-m", "mypy", *FLAGS, "--cache-dir", str(tmp_path / "cache"), *files],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    errors = [m.groups() for m in re.finditer(r"^(\S+?):(\d+): error: (.*)$", r.stdout, re.MULTILINE)]
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 2: mypy itself failed
    assert [e for e in errors if e[0] != "tests/typed/api_misuse.py"] == [], r.stdout
    flagged = {n for n, line in enumerate((TYPED / "api_misuse.py").read_text().splitlines(), 1) if "# flagged:" in line}
    assert len(flagged) >= 8
    assert {int(line) for _, line, _ in errors} == flagged, r.stdout
