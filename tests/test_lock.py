"""The device lock: exclusive, atomic, named holder, bounded wait, stale locks broken exactly once.

Contention is tested between real processes on the local device (its workdir is the device's
edgekit dir); they talk to the test through pipes, so nothing here sleeps.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgekit.devices.lock import DeviceLock, device_lock, lock_status
from edgekit.errors import DeviceError
from edgekit.transport.local import LocalTransport
from tests import test_devices
from tests.conftest import EXAMPLES, REPO, assert_one_line_error

sshd = test_devices.sshd  # fixtures: a real sshd on loopback, and a client HOME that names it "lab"
ssh_home = test_devices.ssh_home

# One job on the device: takes the lock, says so on stdout, and holds it until told on stdin
# ("hold"), or exits still holding it, like a job that died ("keep").
JOB = r"""
import json, sys
from pathlib import Path
from edgekit.devices.lock import DeviceLock
from edgekit.errors import EdgekitError
from edgekit.transport.local import LocalTransport

root, wait, ttl, mode = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
lock = DeviceLock(LocalTransport(Path(root)), owner="job-" + mode, ttl=ttl, wait=wait, heartbeat=False,
                  on_wait=lambda m: print("WAITING " + m, flush=True))
try:
    lock.acquire()
except EdgekitError as exc:
    print("REFUSED " + exc.message, flush=True)
    sys.exit(4)
print("ACQUIRED " + json.dumps({"token": lock.token, "broke": lock.broke}), flush=True)
if mode == "hold":
    sys.stdin.readline()
    print("RELEASED " + json.dumps(lock.release()), flush=True)
"""


class Job:
    def __init__(self, root: Path, *, wait: float = 0.0, ttl: float = 300.0, mode: str = "hold") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", JOB, str(root), repr(wait), repr(ttl), mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("EOF " + self.proc.stderr.read())

    def line(self, timeout: float = 120) -> str:
        return self.lines.get(timeout=timeout)

    def release(self) -> str:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self.line()

    def finish(self) -> int:
        try:
            return self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def _payload(line: str, word: str) -> dict:
    assert line.startswith(word + " "), line
    return json.loads(line[len(word) + 1 :])


def test_two_jobs_contend_the_second_waits_then_gets_it(tmp_path):
    root = tmp_path / "device"
    first = Job(root)
    _payload(first.line(), "ACQUIRED")
    status = lock_status(LocalTransport(root))
    holder = status["holder"]
    assert status["locked"] and not status["stale"]
    assert (holder["owner"], holder["pid"]) == ("job-hold", first.proc.pid)
    assert holder["created"] < holder["expires"] and holder["host"] and holder["user"]

    # a job that won't wait is refused at once, with the holder named
    impatient = Job(root, wait=0)
    refused = impatient.line()
    assert refused.startswith("REFUSED device local is locked by job-hold") and f"pid {first.proc.pid}" in refused
    assert impatient.finish() == 4

    # a job that waits says who it waits for, and gets the lock the moment it is released
    patient = Job(root, wait=120)
    waiting = patient.line()
    assert waiting.startswith("WAITING local is locked by job-hold") and f"pid {first.proc.pid}" in waiting
    assert first.release() == "RELEASED true"
    assert first.finish() == 0
    got = _payload(patient.line(), "ACQUIRED")
    assert got["broke"] is None  # taken after a release, not broken
    assert lock_status(LocalTransport(root))["holder"]["pid"] == patient.proc.pid
    assert patient.release() == "RELEASED true" and patient.finish() == 0
    assert not lock_status(LocalTransport(root))["locked"]


def test_a_stale_lock_is_broken_exactly_once(tmp_path):
    root = tmp_path / "device"
    dead = Job(root, ttl=1e-6, mode="keep")  # exits holding a lock that is already expired
    dead_token = _payload(dead.line(), "ACQUIRED")["token"]
    assert dead.finish() == 0 and lock_status(LocalTransport(root))["stale"]
    racers = [Job(root, wait=0, mode="keep") for _ in range(6)]  # all at once
    lines = [r.line() for r in racers]
    for r in racers:
        r.finish()
    winners = [_payload(ln, "ACQUIRED") for ln in lines if ln.startswith("ACQUIRED")]
    assert len(winners) == 1, lines
    # The racer that broke the stale lock need not be the one that then won it (another may
    # slip in between), so what holds is: one winner, the dead job's lock is gone, and every
    # loser names a live holder.
    assert winners[0]["token"] != dead_token
    assert all(ln.startswith("REFUSED device local is locked by job-keep") for ln in lines if not ln.startswith("ACQUIRED"))
    assert lock_status(LocalTransport(root))["holder"]["token"] == winners[0]["token"]
    assert not list(root.glob("lock.stale.*"))  # the broken lock was removed, not left lying around


def test_release_never_removes_someone_elses_lock(tmp_path):
    t = LocalTransport(tmp_path / "device")
    old = DeviceLock(t, ttl=1e-6, heartbeat=False)
    old.acquire()
    new = DeviceLock(t, heartbeat=False)
    new.acquire()
    assert new.broke["token"] == old.token
    assert old.release() is False  # its lock expired and was taken over
    assert lock_status(t)["holder"]["token"] == new.token
    assert new.release() is True
    assert not lock_status(t)["locked"]


def test_refresh_and_heartbeat_push_the_expiry(tmp_path):
    t = LocalTransport(tmp_path / "device")
    lock = DeviceLock(t, ttl=600, heartbeat=False)
    lock.acquire()
    before = lock_status(t)["holder"]["expires"]
    assert lock.refresh() is True
    assert lock_status(t)["holder"]["expires"] > before
    lock.release()
    assert lock.refresh() is False
    with device_lock(t, ttl=0.9) as beating:  # heartbeat every 0.3 s
        first = lock_status(t)["holder"]["expires"]
        deadline = time.monotonic() + 60
        while lock_status(t)["holder"]["expires"] == first:  # each poll is a device command
            assert time.monotonic() < deadline, "the heartbeat never refreshed the lock"
        assert beating.held
    assert not lock_status(t)["locked"]


def test_lock_errors_are_one_clear_line(tmp_path):
    t = LocalTransport(tmp_path / "device")
    t.python = str(tmp_path / "no-python-here")
    with pytest.raises(DeviceError) as err:
        DeviceLock(t).acquire()
    assert "no-python-here" in err.value.message and err.value.hint
    with pytest.raises(ValueError):
        DeviceLock(LocalTransport(tmp_path / "d2"), ttl=0)


def test_odd_workdir_names_reach_no_shell(tmp_path):
    root = tmp_path / "dev $(touch PWNED); echo 'a' \"b\" `id`"
    t = LocalTransport(root)
    with device_lock(t) as lock:
        owner = json.loads((root / "lock" / "owner.json").read_text())
        assert owner["token"] == lock.token
    assert not (root / "lock").exists()
    assert not list(tmp_path.rglob("PWNED")) and not (REPO / "PWNED").exists()


# -- the commands take the lock ------------------------------------------------------------------


def test_bench_refuses_a_locked_device_and_unlock_frees_it(cli, tmp_path):
    bundle = tmp_path / "bundle"
    r = cli("deploy", EXAMPLES / "digits" / "digits_cnn.onnx", "--no-quantize", "--no-bench", "-o", bundle)
    assert r.returncode == 0, r.stderr
    device = LocalTransport()  # the local device of this test's edgekit home, as the CLI sees it
    holder = DeviceLock(device, owner="ci-job-42", heartbeat=False)
    holder.acquire()
    r = cli("bench", bundle, "--iterations", "5", "--lock-wait", "0")
    assert_one_line_error(r, 4, "device local is locked by ci-job-42")
    assert "edgekit devices unlock" in r.stderr
    assert not (Path(device.root) / "bundles").exists()  # refused before anything was pushed
    shown = cli("devices", "check", "local", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["lock"]["holder"]["owner"] == "ci-job-42"
    r = cli("devices", "unlock", "local")
    assert r.returncode == 0 and "removed the lock on local held by ci-job-42" in r.stdout
    assert cli("devices", "unlock", "local").stdout.strip() == "local was not locked"
    assert holder.release() is False
    r = cli("bench", bundle, "--iterations", "5", "--lock-wait", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 1


def test_lock_over_ssh_between_two_connections(sshd, ssh_home):
    from edgekit.devices import connect
    from edgekit.profiles import load_profile

    (ssh_home / ".ssh" / "known_hosts").write_text(sshd.known_hosts_line())
    profile = load_profile("linux-cpu")
    one, two = connect("lab", profile), connect("lab", profile)
    try:
        with device_lock(one, owner="job-one", ttl=0.9):  # its heartbeat shares the connection
            with pytest.raises(DeviceError) as err:
                DeviceLock(two, wait=0.2, heartbeat=False).acquire()
            assert err.value.message.startswith(f"device {two.name} is locked by job-one")
            assert (sshd.home / ".edgekit" / "lock" / "owner.json").is_file()
        with device_lock(two, owner="job-two") as taken:
            assert lock_status(one)["holder"]["token"] == taken.token
        assert not lock_status(one)["locked"]
    finally:
        one.close()
        two.close()
