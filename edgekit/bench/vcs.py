"""Which branch and commit a run was measured for: CI's variables first, else git in the cwd."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# EDGEKIT_BRANCH first: the user's word beats the CI's. GITHUB_HEAD_REF is a pull request's
# source branch (empty on pushes, where GITHUB_REF_NAME is the branch).
BRANCH_VARS = ("EDGEKIT_BRANCH", "GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME")
COMMIT_VARS = ("EDGEKIT_COMMIT", "GITHUB_SHA", "CI_COMMIT_SHA")
GIT_TIMEOUT_S = 2.0


def vcs_info(cwd: Path | None = None) -> dict[str, str | None]:
    """``{"branch", "commit"}`` of this run; each None when unknown (not a repo, detached HEAD, no git).

    git runs only for what the environment did not say.
    """
    branch = _env(BRANCH_VARS)
    commit = _env(COMMIT_VARS)
    if branch is None:
        branch = _git(["rev-parse", "--abbrev-ref", "HEAD"], cwd)
        if branch == "HEAD":  # detached: no branch name to file the run under
            branch = None
    if commit is None:
        commit = _git(["rev-parse", "HEAD"], cwd)
    return {"branch": branch, "commit": commit}


def _env(names: tuple[str, ...]) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def _git(args: list[str], cwd: Path | None) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and out else None
