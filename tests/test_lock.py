"""The device lock: exclusive, atomic, named holder, bounded wait, stale locks broken exactly once.

Contention is tested between real processes on the local device (its workdir is the device's
edgekit dir); they talk to the test through pipes, so nothing here sleeps.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgekit.devices.lock import DeviceLock, break_lock, device_lock, lock_status, run_lock_op
from edgekit.errors import DeviceError, LockLostError
from edgekit.transport.local import LocalTransport
from tests.conftest import EXAMPLES, REPO, assert_one_line_error

# One job on the device: takes the lock, says so on stdout, and holds it until told on stdin
# ("hold"), or exits still holding it, like a job that died ("keep").
JOB = r"""
import json, sys
from pathlib import Path
from edgekit.devices.lock import DeviceLock
from edgekit.errors import EdgekitError
from edgekit.transport.local import LocalTransport

root, wait, ttl, mode, keeper = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
lock = DeviceLock(LocalTransport(Path(root)), owner="job-" + mode, ttl=ttl, wait=wait, heartbeat=False, keeper=keeper,
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
    def __init__(self, root: Path, *, wait: float = 0.0, ttl: float = 300.0, mode: str = "hold", keeper: bool = True) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", JOB, str(root), repr(wait), repr(ttl), mode, "1" if keeper else "0"],
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
    dead = Job(root, ttl=1e-6, mode="keep", keeper=False)  # exits holding a lock that is already expired (no keeper: a frozen link's case)
    dead_token = _payload(dead.line(), "ACQUIRED")["token"]
    assert dead.finish() == 0 and lock_status(LocalTransport(root))["stale"]
    # All at once; they stay alive holding (a dead holder on this host would be broken at once).
    racers = [Job(root, wait=0, mode="hold") for _ in range(6)]
    lines = [_first_non_waiting(r) for r in racers]
    winners = [_payload(ln, "ACQUIRED") for ln in lines if ln.startswith("ACQUIRED")]
    assert len(winners) == 1, lines
    # The racer that broke the stale lock need not be the one that then won it (another may
    # slip in between), so what holds is: one winner, the dead job's lock is gone, and every
    # loser names a live holder.
    assert winners[0]["token"] != dead_token
    assert all(ln.startswith("REFUSED device local is locked by job-hold") for ln in lines if not ln.startswith("ACQUIRED"))
    assert lock_status(LocalTransport(root))["holder"]["token"] == winners[0]["token"]
    assert not list(root.glob("lock.stale.*"))  # the broken lock was removed, not left lying around
    for r, ln in zip(racers, lines):
        if ln.startswith("ACQUIRED"):
            assert r.release() == "RELEASED true"
        r.finish()


def _first_non_waiting(job: Job) -> str:
    line = job.line()
    while line.startswith("WAITING "):  # e.g. "broke the lock ... that process on this host is gone"
        line = job.line()
    return line


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


def test_the_agent_refreshes_its_jobs_lock_and_refuses_work_once_it_is_lost(tmp_path):
    """``agent --lock DIR TOKEN --lock-ttl S CMD`` (what the Ansible engine runs for each
    measurement): the expiry pushed ahead before the work; another token, or no lock, refuses it."""
    t = LocalTransport(tmp_path / "device")
    lock = DeviceLock(t, ttl=60, heartbeat=False)
    lock.acquire()
    lockdir = str(lock.path)

    def agent(token: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "edgekit.agent", "--lock", lockdir, token, "--lock-ttl", "900", "facts", "--no-openvino"]
        return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)

    before = lock_status(t)["holder"]["expires"]
    ok = agent(lock.token)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.splitlines()[-1])["kind"] == "edgekit.facts"
    assert lock_status(t)["holder"]["expires"] >= before + 800
    for token in ("not-the-holder", lock.token):
        if token == lock.token:
            lock.release()
        bad = agent(token)
        assert bad.returncode == 1
        doc = json.loads(bad.stdout.splitlines()[-1])
        assert doc["kind"] == "edgekit.error" and "the device lock is no longer this job's" in doc["error"], doc
    assert not lock_status(t)["locked"]


def test_lock_errors_are_one_clear_line(tmp_path):
    t = LocalTransport(tmp_path / "device")
    t.python = str(tmp_path / "no-python-here")
    with pytest.raises(DeviceError) as err:
        DeviceLock(t).acquire()
    assert "no-python-here" in err.value.message and err.value.hint
    with pytest.raises(ValueError):
        DeviceLock(LocalTransport(tmp_path / "d2"), ttl=0)
    # the device side answers a malformed operation in words, through the server or on its own
    for serve in (True, False):
        with pytest.raises(DeviceError, match="cannot refresh the device lock .*agent usage: lock refresh with 0 argument"):
            run_lock_op(LocalTransport(tmp_path / "d3"), "refresh", serve=serve)


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


def test_lock_over_ssh_between_two_connections(sshd_server, ssh_home):
    from edgekit.devices import connect
    from edgekit.profiles import load_profile

    sshd = sshd_server  # the lab's real sshd on loopback; ssh_home names it "lab"
    ssh_home.trust()
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


# -- a lost lock is never silent; a dead local holder never blocks the device ------------------

# A holder with a live heartbeat: takes the lock, says so, then on each stdin line checks it
# ("check") or releases it ("release") and reports what it found.
HOLDER = r"""
import json, sys
from pathlib import Path
from edgekit.devices.lock import DeviceLock
from edgekit.errors import LockLostError
from edgekit.transport.local import LocalTransport

lock = DeviceLock(LocalTransport(Path(sys.argv[1])), owner="job-a", ttl=float(sys.argv[2]))
lock.acquire()
print("ACQUIRED " + json.dumps({"token": lock.token}), flush=True)
for line in sys.stdin:
    if line.strip() == "check":
        try:
            lock.ensure_held()
            print("HELD", flush=True)
        except LockLostError as exc:
            print("LOST " + json.dumps({"message": exc.message, "hint": exc.hint, "code": exc.exit_code}), flush=True)
    else:
        print("RELEASED " + json.dumps(lock.release()), flush=True)
"""


def test_a_holder_suspended_past_its_ttl_finds_its_lock_lost(tmp_path):
    import signal

    root = tmp_path / "device"
    a = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), "1.5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        token_a = _payload(a.stdout.readline().strip(), "ACQUIRED")["token"]
        a.stdin.write("check\n")
        a.stdin.flush()
        assert a.stdout.readline().strip() == "HELD"
        os.kill(a.pid, signal.SIGSTOP)  # its heartbeat stops with it
        b = Job(root, wait=120)  # polls the device until A's lock expires, then breaks it
        got = _payload(_first_non_waiting(b), "ACQUIRED")
        assert got["broke"]["token"] == token_a
        os.kill(a.pid, signal.SIGCONT)
        a.stdin.write("check\n")
        a.stdin.flush()
        lost = _payload(a.stdout.readline().strip(), "LOST")
        assert lost["code"] == 4 and "lost the lock on device local" in lost["message"]
        assert "job-hold" in lost["message"] and lost["hint"]  # names who has the board now
        a.stdin.write("release\n")
        a.stdin.flush()
        assert a.stdout.readline().strip() == "RELEASED false"
        assert lock_status(LocalTransport(root))["holder"]["token"] == got["token"]  # B's lock survived A
        assert b.release() == "RELEASED true" and b.finish() == 0
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
        a.wait(timeout=60)


def test_leaving_the_block_without_the_lock_raises(tmp_path):
    t = LocalTransport(tmp_path / "device")
    with pytest.raises(LockLostError) as err:
        with device_lock(t, heartbeat=False) as lock:
            assert break_lock(t)["token"] == lock.token  # e.g. `edgekit devices unlock` meanwhile
    assert err.value.exit_code == 4 and "(it was removed)" in err.value.message
    assert lock.lost and not lock.held


@pytest.mark.parametrize("keeper", [True, False], ids=["its-keeper-marks-it", "no-keeper"])
def test_a_killed_holder_on_this_host_is_broken_at_once(tmp_path, keeper):
    root = tmp_path / "device"
    dead = Job(root, ttl=300, keeper=keeper)  # would block the device for five minutes by the TTL alone
    token = _payload(dead.line(), "ACQUIRED")["token"]
    dead.proc.kill()
    deadline = time.monotonic() + 60  # unreaped, it lingers as a zombie: that counts as gone too
    while _proc_state(dead.proc.pid) not in ("Z", None):
        assert time.monotonic() < deadline, "the killed holder never died"
    said: list[str] = []
    start = time.monotonic()
    with device_lock(LocalTransport(root), wait=0, on_wait=said.append) as lock:
        assert lock.held and lock_status(LocalTransport(root))["holder"]["token"] == lock.token
    assert time.monotonic() - start < 30  # no wait for the 300 s TTL (and wait=0 would refuse)
    # the keeper saw the holder's connection close and marked the lock (or, racing it, this job saw the process gone)
    why = ("connection to the device closed without a release", "that process on this host is gone") if keeper else ("that process on this host is gone",)
    assert len(said) == 1 and any(w in said[0] for w in why) and f"pid {dead.proc.pid}" in said[0], said
    assert dead.finish() != 0 and lock.token != token


# A process of the job holding the lock (as the agent's ``--lock LOCKDIR TOKEN`` makes its work):
# joins the lock's job, says so, and runs until ended.
WORK = r"""
import sys, time
from edgekit.agent import lock
print("JOINED" if lock.join(sys.argv[1], sys.argv[2]) else "NOT-JOINED", flush=True)
time.sleep(600)
"""


def _work(root: Path, token: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WORK, str(root / "lock"), token], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "JOINED"
    return proc


@pytest.mark.parametrize("keeper", [True, False], ids=["keeper", "ttl"])
def test_breaking_a_dead_jobs_lock_ends_its_processes_first(tmp_path, keeper):
    """Kill -9 the holder while its work runs on the device: the next job gets the board only after
    that work is gone, and says which processes it ended. With a keeper that is seconds; without
    one (a frozen link) the TTL, here 2 s, on the device's clock since boot."""
    root = tmp_path / "device"
    dead = Job(root, ttl=2.0 if not keeper else 300, keeper=keeper)
    token = _payload(dead.line(), "ACQUIRED")["token"]
    work = _work(root, token)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # not the job's: spared
    try:
        dead.proc.kill()
        dead.finish()
        said: list[str] = []
        start = time.monotonic()
        with device_lock(LocalTransport(root), wait=60, on_wait=said.append) as lock:
            assert work.poll() is not None, "the dead job's work still runs under the new lock"
            assert stranger.poll() is None
            assert lock.broke["token"] == token and work.pid in [e["pid"] for e in lock.ended]
            assert lock.record()["ended"] and lock.record()["broke"].startswith("job-hold")
        assert time.monotonic() - start < 30
        assert any(f"pid {work.pid}" in m for m in said), said
    finally:
        for p in (work, stranger):
            p.kill()
            p.wait(timeout=60)


def test_a_lock_expires_by_the_devices_clock_since_boot_not_its_wall_clock(tmp_path):
    """A device whose wall clock jumps a day ahead (NTP on a board without an RTC) must not
    expire a live lock; a lock from an earlier boot is stale."""
    t = LocalTransport(tmp_path / "device")
    held = DeviceLock(t, heartbeat=False, keeper=False, ttl=300)
    held.acquire()
    owner = tmp_path / "device" / "lock" / "owner.json"
    doc = json.loads(owner.read_text())
    doc["expires"] = doc["created"] = doc["created"] - 86400  # as if taken under a clock a day behind
    owner.write_text(json.dumps(doc))
    status = lock_status(t)
    assert status["locked"] and not status["stale"], status
    with pytest.raises(DeviceError, match="is locked by"):
        DeviceLock(t, wait=0, heartbeat=False, keeper=False).acquire()
    doc["boot"] = "an-earlier-boot"
    owner.write_text(json.dumps(doc))
    status = lock_status(t)
    assert status["stale"] and "rebooted" in status["why"]
    assert held.release() is True  # still its token: the holder may release a stale lock


def test_a_live_or_foreign_holder_is_not_broken_early(tmp_path):
    t = LocalTransport(tmp_path / "device")
    other = DeviceLock(t, heartbeat=False)
    boot, pidns, _pid, _start = other.info["instance"].split("/")
    other.info["instance"] = f"another-boot/{pidns}/1/1"  # a PID that is not ours to judge
    other.info["pid"] = 2**22 + 7  # no such process here
    other.acquire()
    with pytest.raises(DeviceError, match="is locked by"):
        DeviceLock(t, wait=0, heartbeat=False).acquire()
    assert other.release() is True
    reused = DeviceLock(t, heartbeat=False)  # its PID now belongs to a later process (this one)
    reused.info["instance"] = f"{boot}/{pidns}/{_pid}/{int(_start) - 1}"
    reused.acquire()
    taker = DeviceLock(t, wait=0, heartbeat=False)
    taker.acquire()
    assert taker.release() is True and reused.release() is False
    alive = DeviceLock(t, heartbeat=False)  # this process, alive: never broken
    alive.acquire()
    with pytest.raises(DeviceError, match="is locked by"):
        DeviceLock(t, wait=0, heartbeat=False).acquire()
    assert alive.release() is True


def _proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


@pytest.mark.slow
@pytest.mark.ssh
def test_a_deploy_killed_mid_bench_in_another_pid_namespace_is_ended_before_the_next_one(ssh_home, sshd_server, cli, tmp_path):
    """Kill -9 a deploy while it benches on a loopback-sshd device, the deploy running in another
    PID namespace (so this host cannot see that it died: as from another host). Its connection
    closes; the lock's keeper on the device ends the job's processes and marks the lock; the next
    deploy breaks it in seconds (not the 300 s TTL), none of the first job's processes is alive
    when it benches, and its records say whose lock it broke and what it ended."""
    if os.geteuid() != 0:
        pytest.skip("another PID namespace (unshare --pid) needs root")
    env = {**os.environ, **ssh_home.env(), "CI": "1"}
    ssh_home.trust()
    lockdir = sshd_server.home / ".edgekit" / "lock"
    args = [sys.executable, "-m", "edgekit", "deploy", str(EXAMPLES / "digits" / "digits_cnn.onnx"), "--target", "linux-cpu", "--device", "lab"]
    first = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", *args, "--duration", "120", "-o", str(tmp_path / "a")],
                             env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (lockdir / "procs").is_dir() or not list((lockdir / "procs").iterdir()):  # its bench has joined the job
            assert first.poll() is None, first.stderr.read().decode()
            assert time.monotonic() < deadline, "the first deploy never benched under the lock"
            time.sleep(0.2)
        time.sleep(1.0)  # well inside its 120 s timed window
        work = [json.loads(p.read_text()) for p in (lockdir / "procs").iterdir()]
        assert all(_proc_state(w["pid"]) not in (None, "Z") for w in work)
        os.killpg(first.pid, 9)
        first.wait(timeout=60)
        killed = time.monotonic()
        while "abandoned" not in json.loads((lockdir / "owner.json").read_text()):  # the keeper saw the connection close
            assert time.monotonic() - killed < 30, "the dead holder's lock was not freed within 30 s"
            time.sleep(0.1)
        assert all(_proc_state(w["pid"]) in (None, "Z") for w in work), "the keeper marked the lock before the job's processes were gone"
        start = time.monotonic()
        second = cli("deploy", EXAMPLES / "digits" / "digits_cnn.onnx", "--target", "linux-cpu", "--device", "lab", "-n", "50", "--json",
                     "-o", tmp_path / "b", env=ssh_home.env())  # fmt: skip
        took = time.monotonic() - start
        assert second.returncode == 0, second.stderr
        assert "broke the stale lock on ssh:" in second.stderr and "connection to the device closed" in second.stderr, second.stderr
        assert all(_proc_state(w["pid"]) in (None, "Z") for w in work), "a process of the killed job outlived it"
        assert took < 120  # the whole second deploy; the lock itself was free in seconds, not the TTL
        runs = json.loads(second.stdout)["runs"]
        for run in runs:  # each run measured after the break says so, in the deploy's output and the store
            assert run["lock"]["broke"].startswith("root@") and "connection to the device closed" in run["lock"]["why"]
            assert {w["pid"] for w in work} <= {e["pid"] for e in run["lock"]["ended"]}
            assert all(e["gone"] for e in run["lock"]["ended"])  # gone before this deploy took the board
        stored = json.loads(cli("results", "show", str(runs[0]["id"]), "--json", env=ssh_home.env()).stdout)
        assert stored.get("lock") == runs[0]["lock"] or stored.get("record", {}).get("lock") == runs[0]["lock"], list(stored)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, 9)
            first.wait(timeout=60)
