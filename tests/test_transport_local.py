"""LocalTransport: argv-only commands, timeouts that kill the whole group, atomic verified copies,
and content-addressed pushes of bundles and the agent."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from edgekit.bundle import TensorSpec, Variant, write_bundle
from edgekit.errors import TransportError, UsageError
from edgekit.fsutil import sha256_file
from edgekit.transport import Transport, open_transport
from edgekit.transport.agentzip import push_agent
from edgekit.transport.local import LocalTransport
from edgekit.transport.push import push_bundle, remote_bundle_dir
from tests.conftest import (
    NASTY,
    assert_conversation_contract,
    assert_nasty_names_round_trip,
    assert_put_replaces_atomically_and_fails_cleanly,
    assert_timeout_kills_the_process_group,
)

# Every one of these would do something if it ever reached a shell.
ECHO = "import json, sys; print(json.dumps(sys.argv[1:]))"


@pytest.fixture
def dev(tmp_path) -> LocalTransport:
    return LocalTransport(tmp_path / "device")


def _no_pwned(*roots: Path) -> None:
    for root in roots:
        assert not list(root.rglob("pwned")), f"a shell ran somewhere under {root}"


def test_is_a_transport_with_default_root(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path / "cache"))
    t = LocalTransport()
    assert isinstance(t, Transport)
    assert t.name == "local" and t.python == sys.executable
    assert t.root == str(tmp_path / "cache" / "local-device")
    assert isinstance(open_transport(None), LocalTransport)
    assert isinstance(open_transport("local"), LocalTransport)


def test_open_transport_gives_a_lazy_ssh_transport():
    t = open_transport("pi@10.0.0.7:2222")  # nothing is contacted until first use
    assert t.name == "ssh:pi@10.0.0.7:2222" and t.python == "python3"
    with pytest.raises(UsageError) as err:
        open_transport("pi@@bad host")
    assert "pi@@bad host" in err.value.message and err.value.hint


def test_run_passes_argv_verbatim(dev, tmp_path):
    result = dev.run([sys.executable, "-c", ECHO, *NASTY])
    assert json.loads(result.stdout) == NASTY
    assert result.returncode == 0 and result.duration_s > 0
    assert result.argv[0] == sys.executable
    assert Path(dev.root).is_dir()  # created on first use
    _no_pwned(tmp_path, Path.cwd())


def test_run_cwd_and_env(dev, tmp_path):
    weird = tmp_path / "dir with $(touch pwned); 'quotes'"
    weird.mkdir()
    code = "import os; print(os.getcwd()); print(os.environ['EK_VALUE'])"
    result = dev.run([sys.executable, "-c", code], cwd=str(weird), env={"EK_VALUE": "$(touch pwned)"})
    cwd, value = result.stdout.decode().splitlines()
    assert cwd == str(weird) and value == "$(touch pwned)"
    # the default cwd is the device root
    assert dev.run([sys.executable, "-c", "import os; print(os.getcwd())"]).stdout.decode().strip() == dev.root
    _no_pwned(tmp_path)


def test_run_failure_quotes_stderr(dev):
    code = "import sys; sys.stderr.write('first\\nthe real reason\\n'); sys.exit(3)"
    with pytest.raises(TransportError) as err:
        dev.run([sys.executable, "-c", code])
    assert "exit code 3" in err.value.message and "the real reason" in err.value.message
    result = dev.run([sys.executable, "-c", code], check=False)
    assert result.returncode == 3 and result.stderr_tail(1) == "the real reason"


def test_run_bad_commands(dev, tmp_path):
    with pytest.raises(TransportError, match="command not found on the device: no-such-program-ek"):
        dev.run(["no-such-program-ek", "--x"])
    with pytest.raises(TransportError, match="empty command"):
        dev.run([])
    with pytest.raises(TypeError):
        dev.run("echo hi")  # a shell string is a bug, not a command
    with pytest.raises(TransportError, match="working directory does not exist"):
        dev.run([sys.executable, "-c", "pass"], cwd=str(tmp_path / "nope"))


def test_timeout_kills_the_process_group(dev, tmp_path):
    assert_timeout_kills_the_process_group(dev, tmp_path)


def test_conversation_contract(dev, tmp_path):
    assert_conversation_contract(dev, tmp_path)


def test_put_get_sha256_with_nasty_names(dev, tmp_path):
    remote_dir = Path(dev.root) / "sub dir" / "$(touch pwned)"
    assert_nasty_names_round_trip(dev, remote_dir, tmp_path / "local")
    _no_pwned(tmp_path)


def test_put_replaces_atomically_and_fails_cleanly(dev, tmp_path):
    assert_put_replaces_atomically_and_fails_cleanly(dev, Path(dev.root), tmp_path)


def test_mkdir_is_exist_ok(dev, tmp_path):
    # (the errors of get, mkdir and sha256: test_put_replaces_atomically_and_fails_cleanly)
    dev.mkdir("a/b/c")
    dev.mkdir("a/b/c")
    assert (tmp_path / "device" / "a" / "b" / "c").is_dir()


def _bundle(tmp_path: Path, payload: bytes = b"weights" * 500):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "model.onnx").write_bytes(payload)
    (src / "inputs.npz").write_bytes(b"sample inputs")
    variant = Variant("fp32", "onnxruntime", "fp32", "fp32/model.onnx", (TensorSpec("x", (1, 4), "float32"),), ())
    return write_bundle(
        tmp_path / f"bundle-{len(list(tmp_path.glob('bundle-*')))}",
        files={"fp32/model.onnx": src / "model.onnx", "fp32/inputs.npz": src / "inputs.npz"},
        model_name="m", model_sha256="0" * 64, profile="local", backend="onnxruntime",
        precision="fp32", variants=[variant], plan={},
    )  # fmt: skip


def test_push_is_content_addressed(dev, tmp_path):
    bundle = _bundle(tmp_path)
    first = push_bundle(dev, bundle)
    assert first.remote_dir == remote_bundle_dir(dev, bundle)
    assert first.remote_dir.endswith("/bundles/" + bundle.manifest.bundle_hash)
    assert (first.files_sent, first.files_skipped) == (3, 0)  # two files + manifest.json
    total = sum(f.size for f in bundle.manifest.files) + (bundle.root / "manifest.json").stat().st_size
    assert first.bytes_sent == total
    for f in bundle.manifest.files:
        assert dev.sha256(f"{first.remote_dir}/{f.path}") == f.sha256

    second = push_bundle(dev, bundle)
    assert (second.bytes_sent, second.files_sent, second.files_skipped) == (0, 0, 3)

    # An interrupted or damaged copy on the device is repaired, and only that file is sent.
    remote_model = Path(first.remote_dir) / "fp32" / "model.onnx"
    remote_model.write_bytes(b"half a fi")
    (Path(first.remote_dir) / "fp32" / "inputs.npz").unlink()
    third = push_bundle(dev, bundle)
    # The model was damaged through its hard link to the object store: only it is sent again;
    # the deleted inputs.npz is re-linked from the device's intact object, not re-sent.
    assert third.files_sent == 1 and third.files_skipped == 2
    assert third.bytes_sent == bundle.path("fp32/model.onnx").stat().st_size
    assert dev.sha256(str(remote_model)) == sha256_file(bundle.path("fp32/model.onnx"))
    assert dev.sha256(f"{first.remote_dir}/fp32/inputs.npz") == sha256_file(bundle.path("fp32/inputs.npz"))


def test_push_agent_once(dev):
    remote = push_agent(dev)
    assert remote.startswith(dev.root + "/agent/") and remote.endswith(".pyz")
    inode = os.stat(remote).st_ino
    assert push_agent(dev) == remote
    assert os.stat(remote).st_ino == inode  # not uploaded again
    assert dev.sha256(remote) == Path(remote).name.removesuffix(".pyz")


def test_put_resumes_from_a_matching_part_only(dev, tmp_path):
    data = os.urandom(3_000_000)
    src = tmp_path / "blob"
    src.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    dev.mkdir("o")
    part = Path(dev.root) / "o" / f".blob.{digest[:16]}.part"  # what a cut upload leaves
    part.write_bytes(data[:1_000_000])
    seen: list[tuple[int, int]] = []
    stats = dev.put(src, "o/blob", sha256=digest, resume=True, progress=lambda s, d: seen.append((s, d)))
    assert (stats.resumed_from, stats.bytes_sent) == (1_000_000, 2_000_000)
    assert seen[0] == (0, 1_000_000) and seen[-1][1] == 3_000_000
    assert (Path(dev.root) / "o" / "blob").read_bytes() == data and not part.exists()
    part.write_bytes(b"garbage" + data[7:1_000_000])  # not the file's start: sent from 0
    stats = dev.put(src, "o/blob", sha256=digest, resume=True)
    assert (stats.resumed_from, stats.bytes_sent) == (0, 3_000_000)
    assert (Path(dev.root) / "o" / "blob").read_bytes() == data and not part.exists()
