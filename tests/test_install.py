"""Install like a user: `python -m build` makes a wheel (from the sdist, so the sdist is checked
too), a NEW venv installs it from the package registry, and its `edgekit` runs `--version` and
the first deploy with nothing else on the path: no repository on sys.path, an empty edgekit
cache, and the ekrt runner the wheel carries (no compile step on first use).

Needs the package registry for the build backend and the dependencies (pip's cache serves them
after the first run); slow-marked (~1-3 min on a 2-core VM). Also checks that sourcing
scripts/env.sh leaves the caller's shell options alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from edgekit import __version__
from tests.conftest import EXAMPLES, REPO


def _run(argv: list, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (argv, proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def _clean_env(home: Path) -> dict:
    """A user's environment: no PYTHONPATH or venv of the test run, an empty home (so an empty
    ~/.cache/edgekit: the runner must come from the wheel), plain output."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith(("EDGEKIT_", "XDG_"))}
    env.update(HOME=str(home), CI="1")
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", dist, REPO], REPO, timeout=900)
    wheels = list(dist.glob("edgekit-*.whl"))
    assert len(wheels) == 1 and list(dist.glob("edgekit-*.tar.gz")), list(dist.iterdir())
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, dict]:
    """A fresh venv (no system site-packages) with the wheel pip-installed; its bin dir and env."""
    root = tmp_path_factory.mktemp("user")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    env = _clean_env(root / "home")
    (root / "home").mkdir()
    # pip keeps its own cache (the user's, not the empty test home's): the registry is not asked
    # for 200 MB of wheels on every run
    pip_cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
    _run([env_dir / "bin" / "python", "-m", "pip", "install", "-q", wheel], root, {**env, "PIP_CACHE_DIR": pip_cache}, timeout=900)
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    return env_dir / "bin", env


@pytest.mark.slow
def test_wheel_carries_the_extension_the_runner_and_the_c_sources(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("edgekit/_ekrt") and n.endswith(".so") for n in names)
    arch = os.uname().machine
    assert f"edgekit/_runner/{arch}/ekrt" in names and f"edgekit/_runner/{arch}/build.txt" in names
    assert "edgekit/_csrc/sources.toml" in names  # the cross build of other archs' runners reads them
    assert "edgekit/profiles/local.toml" in names
    assert not any(n.startswith(("tests/", "examples/", "benchmarks/")) for n in names)  # the package only


@pytest.mark.slow
def test_installed_edgekit_reports_its_versions(installed, tmp_path):
    bin_dir, env = installed
    r = _run([bin_dir / "edgekit", "--version"], tmp_path, env)
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines())
    assert lines["edgekit"] == __version__
    assert "scalar" in lines["ekrt"]
    # the runner found is the one inside the installed package, not this checkout's
    assert lines["ekrt-runner"].startswith(str(bin_dir.parent)), lines["ekrt-runner"]
    doc = json.loads(_run([bin_dir / "edgekit", "version", "--json"], tmp_path, env).stdout)
    assert doc["ekrt"]["runner"] == lines["ekrt-runner"]
    assert doc["runtimes"]["onnxruntime"]  # a dependency: installed with the wheel


@pytest.mark.slow
def test_installed_edgekit_deploys_the_digits_example_without_compiling(installed, tmp_path):
    bin_dir, env = installed
    r = _run([bin_dir / "edgekit", "deploy", EXAMPLES / "digits" / "digits_cnn.onnx", "--target", "local"], tmp_path, env)
    assert "building ekrt runner" not in r.stderr  # the wheel's runner, not a first-use build
    assert "backend native" in r.stdout
    manifest = json.loads((tmp_path / "edgekit-out" / "digits_cnn-local" / "manifest.json").read_text())
    assert manifest["backend"] == "native"
    assert "bin/ekrt" in {f["path"] for f in manifest["files"]}
    # from a directory the package does not live in: the installed copy ran, not the repository
    where = _run([bin_dir / "python", "-c", "import edgekit; print(edgekit.__file__)"], tmp_path, env).stdout
    assert where.startswith(str(bin_dir.parent))


@pytest.mark.slow
def test_installed_edgekit_bad_input_is_one_error_and_one_hint(installed, tmp_path):
    bin_dir, env = installed
    proc = subprocess.run([bin_dir / "edgekit", "deploy", tmp_path / "missing.onnx", "--target", "local"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert [ln for ln in lines if ln.startswith("error: ")] and len([ln for ln in lines if ln.startswith("hint: ")]) == 1
    assert "Traceback" not in proc.stderr and not (tmp_path / "edgekit-out").exists()


def test_sourcing_env_sh_keeps_the_callers_shell_options(tmp_path):
    """`source scripts/env.sh` in a shell with no -e/-u/pipefail leaves them off; on an error it
    returns (the shell lives on) with error: + hint:, and a script's `set -e` stops there."""
    probe = ('source "$1/scripts/env.sh"; echo "rc=$?"; shopt -qo errexit && echo errexit; '
             'shopt -qo nounset && echo nounset; shopt -qo pipefail && echo pipefail; echo "alive"')
    # a Python that is not there: the fastest error env.sh can meet (nothing is installed)
    env = {**os.environ, "EDGEKIT_PYTHON": str(tmp_path / "no-python"), "EDGEKIT_DEV_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", "-c", probe, "probe", REPO], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["rc=2", "alive"], (proc.stdout, proc.stderr)
    assert "error: " in proc.stderr and "hint: " in proc.stderr
    strict = subprocess.run(["bash", "-c", "set -euo pipefail; " + probe, "probe", REPO], env=env,
                            capture_output=True, text=True, timeout=60)
    assert strict.returncode == 2 and "alive" not in strict.stdout


@pytest.mark.slow
def test_sourcing_env_sh_for_real_puts_this_checkouts_edgekit_on_path(tmp_path):
    """The success path, where the dev venvs exist already (under scripts/test, which sourced
    env.sh): sourcing again is quick, changes no option, and `edgekit` is this checkout's."""
    if not os.environ.get("EDGEKIT_DEV_VENV"):
        pytest.skip("not run through scripts/test (EDGEKIT_DEV_VENV unset): setting the dev venvs up here would take minutes")
    probe = ('source "$1/scripts/env.sh"; echo "rc=$?"; shopt -qo errexit && echo errexit; '
             'shopt -qo nounset && echo nounset; shopt -qo pipefail && echo pipefail; '
             'command -v edgekit; edgekit -V | head -1')
    proc = subprocess.run(["bash", "-c", probe, "probe", REPO], capture_output=True, text=True, timeout=600)
    out = proc.stdout.split("\n")
    assert out[0] == "rc=0", (proc.stdout, proc.stderr)
    assert out[1] == os.path.join(os.environ["EDGEKIT_DEV_VENV"], "bin", "edgekit")
    assert out[2].split() == ["edgekit", __version__]
