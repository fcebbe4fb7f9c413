"""The README's five-minute tour runs as written, in a fresh copy of the repository.

Every shell block of the tour section is run line by line, in order, with `edgekit` on PATH and
a results store of its own; the Python block runs too. Afterwards the copy's ``git status`` must
be clean: the tour writes under ``edgekit-out/`` (ignored), never into the tree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOUR_HEADING = "## A five-minute tour"


def tour_blocks(readme: str) -> list[tuple[str, str]]:
    """(language, text) of each fenced block in the tour section, in order."""
    start = readme.index(TOUR_HEADING)
    end = readme.find("\n## ", start + len(TOUR_HEADING))
    section = readme[start:end if end != -1 else None]
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", section, re.S | re.M)]


def shell_commands(blocks: list[tuple[str, str]]) -> list[str]:
    return [line.strip() for lang, text in blocks if lang in ("", "sh", "bash", "shell")
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_tour_section_is_found_and_has_commands():
    blocks = tour_blocks((REPO / "README.md").read_text())
    commands = shell_commands(blocks)
    assert len(commands) >= 10, commands
    assert all(c.startswith("edgekit ") for c in commands), [c for c in commands if not c.startswith("edgekit ")]
    assert any(lang == "python" for lang, _ in blocks)
    # outputs go under edgekit-out/, never the repository root
    for c in commands:
        for out in re.findall(r"(?:-o|--junit|--summary|--report|--output)\s+(\S+)", c):
            assert out.startswith("edgekit-out/"), c


def _copy_of_repo(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git = ["git", "-c", "user.name=tour", "-c", "user.email=tour@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "copy"], cwd=dest, check=True)


@pytest.mark.slow
def test_readme_tour_runs_as_written(tmp_path):
    blocks = tour_blocks((REPO / "README.md").read_text())
    work = tmp_path / "repo"
    work.mkdir()
    _copy_of_repo(work)
    # `edgekit` on PATH: this interpreter's, whatever venv or install runs the tests
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "edgekit").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m edgekit "$@"\n')
    (shim / "edgekit").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}", "CI": "true",
           "EDGEKIT_DATA_DIR": str(tmp_path / "data"), "EDGEKIT_CONFIG_DIR": str(tmp_path / "config"),
           "PYTHONPATH": str(REPO)}
    for command in shell_commands(blocks):
        proc = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"{command}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    for lang, text in blocks:
        if lang == "python":
            proc = subprocess.run([sys.executable, "-c", text], cwd=work, env=env, capture_output=True, text=True,
                                  timeout=600, stdin=subprocess.DEVNULL)
            assert proc.returncode == 0, f"{text}\n--- stderr\n{proc.stderr[-3000:]}"
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=work,
                            capture_output=True, text=True, check=True).stdout
    assert status == "", f"the tour left files in the tree:\n{status}"
    assert (work / "edgekit-out" / "report.html").is_file()
    assert (work / "edgekit-out" / "junit.xml").is_file()
