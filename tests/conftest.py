"""Shared fixtures: an isolated edgekit home per test and a way to run the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab.fixtures import *  # noqa: F403  (the SSH lab: sshd_server, ssh_home, ssh_device, netns)

REPO = Path(__file__).resolve().parents[1]
# Every one of these would do something if it ever reached a shell unquoted.
NASTY = ["a b", "it's", 'say "hi"', "semi;colon", "$(touch pwned)", "`touch pwned`", "x && touch pwned", "*", "back\\slash"]
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


def wait_until(condition, timeout: float = 10.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def assert_timeout_kills_the_process_group(device, tmp_path: Path) -> None:
    """A command that outlives its timeout is a TransportError, and its child dies with it."""
    from edgekit.errors import TransportError
    from tests.lab.sshd import alive

    pidfile = tmp_path / "grandchild.pid"
    # The child starts a grandchild (same process group), records its pid, then hangs.
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    start = time.monotonic()
    with pytest.raises(TransportError) as err:
        device.run([sys.executable, "-c", code], timeout=2)
    assert time.monotonic() - start < 30
    assert err.value.message.startswith("command timed out after 2s: ")
    assert sys.executable in err.value.message
    grandchild = int(pidfile.read_text())
    assert wait_until(lambda: not alive(grandchild)), "the command's child survived the timeout"


def assert_conversation_contract(device, tmp_path: Path) -> None:
    """``converse``: one answer line per request line, stderr alongside, the end of the process
    reported (not hung on), and a request that outlives its timeout kills the process group."""
    from edgekit.errors import TransportError
    from tests.lab.sshd import alive

    echo = "import sys\nfor line in sys.stdin:\n    print('seen', line.strip(), file=sys.stderr, flush=True)\n    print(line.strip().upper(), flush=True)\n    if line.strip() == 'bye': break"
    conv = device.converse([sys.executable, "-c", echo])
    answer, err = conv.ask(b"hello", timeout=30)
    assert answer == b"HELLO" and err in (b"", b"seen hello\n")  # two streams: stderr may trail the answer
    assert conv.ask(b"again\n", timeout=30)[0] == b"AGAIN"
    assert conv.ask(b"bye", timeout=30)[0] == b"BYE"
    assert conv.ask(b"anyone?", timeout=30)[0] is None and conv.returncode == 0  # it ended: None, not a hang

    pidfile = tmp_path / "conv-grandchild.pid"
    hang = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "for line in sys.stdin:\n    time.sleep(60)"
    )
    conv = device.converse([sys.executable, "-c", hang])
    start = time.monotonic()
    with pytest.raises(TransportError, match="timed out after 2s"):
        conv.ask(b"wait", timeout=2)
    assert time.monotonic() - start < 30 and conv.returncode is not None
    assert wait_until(lambda: not alive(int(pidfile.read_text()))), "the conversation's child survived the timeout"


def assert_nasty_names_round_trip(device, remote_dir: Path, local: Path) -> None:
    """mkdir, put, sha256 and get through ``device`` with ``NASTY`` names in "sub dir/$(touch pwned)",
    which is ``remote_dir`` on this machine."""
    from edgekit.fsutil import sha256_file

    local.mkdir()
    device.mkdir("sub dir/$(touch pwned)")
    assert remote_dir.is_dir()
    for i, name in enumerate(NASTY):
        src = local / f"src{i}"
        src.write_bytes(f"payload {i} {name}".encode() * 5000)
        remote = f"sub dir/$(touch pwned)/{name}"
        assert device.sha256(remote) is None
        device.put(src, remote)
        assert device.sha256(remote) == sha256_file(src)
        assert (remote_dir / name).read_bytes() == src.read_bytes()
        assert oct((remote_dir / name).stat().st_mode & 0o777) == "0o644"
        back = local / f"back {name}"
        device.get(remote, back)
        assert back.read_bytes() == src.read_bytes()
    assert sorted(os.listdir(remote_dir)) == sorted(NASTY)  # no temp files left


def assert_put_replaces_atomically_and_fails_cleanly(device, root: Path, tmp_path: Path) -> None:
    """put renames a complete file over the old one; bad puts, gets, mkdirs and sha256s are
    TransportErrors that leave nothing behind. ``root`` is the device's workdir on this machine."""
    from edgekit.errors import TransportError

    device.mkdir("d")
    remote = str(root / "d" / "f.bin")  # absolute remote paths work too
    old, new = tmp_path / "old", tmp_path / "new"
    old.write_bytes(b"old" * 10)
    new.write_bytes(os.urandom(3 << 20))
    device.put(old, remote)
    inode = os.stat(remote).st_ino
    device.put(new, remote)
    assert Path(remote).read_bytes() == new.read_bytes() and os.stat(remote).st_ino != inode  # renamed over
    assert oct(Path(remote).stat().st_mode & 0o777) == "0o644"
    with pytest.raises(TransportError, match="no such file"):
        device.put(tmp_path / "missing", remote)
    with pytest.raises(TransportError, match="does not exist on the device"):
        device.put(new, "not/made/yet.bin")
    with pytest.raises(TransportError, match="is a directory"):
        device.put(new, "d")
    with pytest.raises(TransportError, match="no such file on the device"):
        device.get("d/missing.bin", tmp_path / "x")
    assert not (tmp_path / "x").exists()
    (root / "file").write_text("x")
    with pytest.raises(TransportError, match="a file is in the way"):
        device.mkdir("file/sub")
    with pytest.raises(TransportError, match="is not a file"):
        device.sha256("d")
    assert Path(remote).read_bytes() == new.read_bytes()
    assert os.listdir(root / "d") == ["f.bin"]
