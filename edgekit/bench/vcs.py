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


# GitLab says which branch is the default; GitHub does not export it (EDGEKIT_DEFAULT_BRANCH can).
DEFAULT_BRANCH_VARS = ("EDGEKIT_DEFAULT_BRANCH", "CI_DEFAULT_BRANCH")


def default_branch(cwd: Path | None = None) -> str | None:
    """The repository's default branch: the CI's word, else the remote's HEAD (``origin/HEAD``),
    else ``main`` or ``master`` when such a branch exists; None outside a git repository."""
    named = _env(DEFAULT_BRANCH_VARS)
    if named:
        return named
    head = _git(["symbolic-ref", "--short", "refs/remotes/origin/HEAD"], cwd)
    if head:
        return head.split("/", 1)[1] if "/" in head else head
    for name in ("main", "master"):
        if _git(["rev-parse", "--verify", "--quiet", f"refs/heads/{name}"], cwd):
            return name
    return None


def tag_commit(tag: str, cwd: Path | None = None) -> str | None:
    """The commit a git tag names (None when there is no such tag or no git)."""
    return _git(["rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}"], cwd)
