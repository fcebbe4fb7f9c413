"""Every path a bundle names stays inside the bundle (issue 26 item 5), checked by the agent on the
device (a bundle is code: its runner runs with the agent's rights) and by the host when it loads one."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.agent import store
from edgekit.bundle import load_bundle
from edgekit.errors import InputError
from edgekit.transport.agentzip import build_agent_zip
from tests.builders import tiny_bundle
from tests.conftest import assert_one_line_error


@pytest.fixture(scope="module")
def agent_zip(tmp_path_factory) -> Path:
    return build_agent_zip(tmp_path_factory.mktemp("agent"))


def _agent(zip_path: Path, *args: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(zip_path), *args], capture_output=True, text=True, timeout=300, cwd=zip_path.parent)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, (proc.stdout, proc.stderr)
    return proc.returncode, json.loads(lines[0])


def _edit(root: Path, change) -> None:
    """Change manifest.json the way a hostile or broken host would (no edgekit checks on the way)."""
    path = root / "manifest.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.fixture
def evil(tmp_path) -> Path:
    """A 0644 script outside the bundle that leaves a mark when run."""
    (tmp_path / "outside").mkdir()
    script = tmp_path / "outside" / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {tmp_path / 'PWNED'}\n")
    script.chmod(0o644)
    return script


def _assert_untouched(evil: Path) -> None:
    assert stat.S_IMODE(evil.stat().st_mode) == 0o644, "a file outside the bundle was made executable"
    assert not (evil.parent.parent / "PWNED").exists(), "a file outside the bundle was run"


def test_the_issue_repro_runner_outside_the_bundle_is_refused(tmp_path, agent_zip, evil):
    (tmp_path / "a").mkdir()
    bundle = tiny_bundle(tmp_path / "a" / "bundle", backend="native")
    _edit(bundle.root, lambda d: d["variants"][0].setdefault("options", {}).update(runner="../../outside/evil.sh"))
    for command in ("bench", "eval"):
        args = ["--variant", "fp32"] + (["--samples", "fp32/tiny.onnx", "--output", str(tmp_path / "o.npz")] if command == "eval" else [])
        rc, doc = _agent(agent_zip, command, str(bundle.root), *args)
        assert rc == 1 and doc["kind"] == "edgekit.error", doc
        assert "options.runner '../../outside/evil.sh' is not a path inside the bundle" in doc["error"]
        assert "run only bundles from people you would let run code on this device" in doc["hint"]
    _assert_untouched(evil)


@pytest.mark.parametrize("runner", ["/tmp/evil.sh", "bin/../../x", "./bin/ekrt", "bin//ekrt", "bin\\ekrt", "", 7])
def test_runner_paths_that_are_not_plain_relative_paths_are_refused(tmp_path, agent_zip, runner):
    bundle = tiny_bundle(tmp_path / "bundle", backend="native")
    _edit(bundle.root, lambda d: d["variants"][0].setdefault("options", {}).update(runner=runner))
    rc, doc = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32")
    assert rc == 1 and "is not a path inside the bundle" in doc["error"], doc


def test_a_runner_symlinked_outside_the_bundle_is_refused(tmp_path, agent_zip, evil):
    (tmp_path / "a").mkdir()
    bundle = tiny_bundle(tmp_path / "a" / "bundle", backend="native")
    (bundle.root / "bin").mkdir()
    (bundle.root / "bin" / "ekrt").symlink_to(evil)  # the default runner path, not named in options
    rc, doc = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32")
    assert rc == 1 and "options.runner bin/ekrt resolves outside the bundle" in doc["error"], doc
    _assert_untouched(evil)


def test_a_runner_must_be_a_listed_bundle_file_with_its_hash(tmp_path, agent_zip, evil):
    bundle = tiny_bundle(tmp_path / "bundle", backend="native")
    (bundle.root / "bin").mkdir()
    unlisted = bundle.root / "bin" / "sneaky.sh"
    unlisted.write_text(evil.read_text())
    unlisted.chmod(0o644)
    _edit(bundle.root, lambda d: d["variants"][0].setdefault("options", {}).update(runner="bin/sneaky.sh"))
    rc, doc = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32")
    assert rc == 1 and "options.runner 'bin/sneaky.sh' is not one of the bundle's files" in doc["error"], doc
    assert stat.S_IMODE(unlisted.stat().st_mode) == 0o644

    def listed_with_wrong_hash(d):
        d["files"].append({"path": "bin/sneaky.sh", "sha256": "0" * 64, "size": unlisted.stat().st_size})

    _edit(bundle.root, listed_with_wrong_hash)
    rc, doc = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32")
    assert rc == 1 and "bin/sneaky.sh on the device does not match its sha256" in doc["error"], doc
    assert stat.S_IMODE(unlisted.stat().st_mode) == 0o644 and not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d["variants"][0].update(model="../tiny.onnx"), "variant 'fp32' model '../tiny.onnx' is not a path inside the bundle"),
        (lambda d: d["files"].append({"path": "../../etc/passwd", "sha256": "0" * 64, "size": 1}), "file '../../etc/passwd' is not a path inside the bundle"),
        (lambda d: d["variants"][0].update(options=["runner", "x"]), "'options' must be an object"),
    ],
)
def test_other_manifest_paths_are_refused_on_the_device(tmp_path, agent_zip, change, needle):
    bundle = tiny_bundle(tmp_path / "bundle")
    _edit(bundle.root, change)
    rc, doc = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32")
    assert rc == 1 and needle in doc["error"], doc


def test_a_model_symlinked_outside_the_bundle_is_refused(tmp_path, agent_zip):
    bundle = tiny_bundle(tmp_path / "bundle")
    model = bundle.root / "fp32" / "tiny.onnx"
    os.replace(model, tmp_path / "elsewhere.onnx")
    model.symlink_to(tmp_path / "elsewhere.onnx")  # same bytes and hash: only the place is wrong
    rc, doc = _agent(agent_zip, "bench", str(bundle.root), "--variant", "fp32")
    assert rc == 1 and "file fp32/tiny.onnx resolves outside the bundle" in doc["error"], doc


def test_eval_samples_outside_the_bundle_are_refused(tmp_path, agent_zip):
    bundle = tiny_bundle(tmp_path / "bundle")
    rc, doc = _agent(agent_zip, "eval", str(bundle.root), "--variant", "fp32", "--samples", "../x.npz", "--output", str(tmp_path / "o.npz"))
    assert rc == 1 and "samples file '../x.npz' is not a path inside the bundle" in doc["error"], doc


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        ({"bundle": "a" * 64, "files": [["../../outside/x", "b" * 64, 1]]}, "file path '../../outside/x' is not a path inside the bundle"),
        ({"bundle": "a" * 64, "files": [["/etc/cron.d/x", "b" * 64, 1]]}, "is not a path inside the bundle"),
        ({"bundle": "a" * 64, "files": [["x", "../../../etc/passwd", 1]]}, "file x: bad sha256 or size"),
        ({"bundle": "../../x", "files": [["x", "b" * 64, 1]]}, "bundle name '../../x' is not a sha256"),
        ({"bundle": "a" * 64, "files": "x"}, "the request has no list of files"),
    ],
)
def test_the_device_store_refuses_paths_outside_its_bundles(tmp_path, request_, needle):
    root = tmp_path / "root"
    doc = store.answer([str(root), "commit", json.dumps(request_)])
    assert needle in doc["error"], doc
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
    assert not any((root / "bundles").iterdir())


@pytest.mark.parametrize("runner", ["../../outside/evil.sh", "bin/ekrt"])
def test_the_host_refuses_such_a_bundle_too(cli, tmp_path, runner):
    bundle = tiny_bundle(tmp_path / "bundle", backend="native")
    _edit(bundle.root, lambda d: d["variants"][0].setdefault("options", {}).update(runner=runner))
    with pytest.raises(InputError, match="options.runner"):
        load_bundle(bundle.root)
    r = cli("bench", bundle.root)
    assert_one_line_error(r, 3, "options.runner")


def test_a_verified_commit_refuses_an_object_that_arrived_damaged(tmp_path):
    """``commit`` with ``verify`` (the Ansible engine's: its objects come by ``copy``, not through the
    store's own hash-checked upload) hashes every object first: a damaged one is removed and named,
    and no bundle is built; once it is whole, the same commit builds it and switches ``current``."""
    import hashlib

    root = tmp_path / "root"
    data = b"the model's bytes"
    sha = hashlib.sha256(data).hexdigest()
    (root / "objects").mkdir(parents=True)
    (root / "objects" / sha).write_bytes(b"the model's bytez")  # same size, wrong bytes
    req = {"bundle": "a" * 64, "files": [["model.onnx", sha, len(data)]], "activate": True, "verify": True}
    doc = store.answer([str(root), "commit", json.dumps(req)])
    assert "1 object(s) of the bundle are missing or damaged" in doc["error"] and doc["missing"] == [sha], doc
    assert not (root / "objects" / sha).exists() and not (root / "bundles" / ("a" * 64)).exists()
    (root / "objects" / sha).write_bytes(data)
    doc = store.answer([str(root), "commit", json.dumps(req)])
    assert doc.get("current") == "bundles/" + "a" * 64, doc
    assert (root / "bundles" / ("a" * 64) / "model.onnx").read_bytes() == data
