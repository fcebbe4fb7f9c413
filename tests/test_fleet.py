"""Fleets: bounded concurrency, one outcome per device, failures isolated, Ctrl-C, and the CLI."""

from __future__ import annotations

import json
import threading

import pytest

from edgekit.devices.fleet import CANCELLED, INTERRUPTED, run_fleet, safe_name
from edgekit.errors import DeviceError, ModelError
from edgekit.events import DeviceEvents
from edgekit.transport.local import LocalTransport
from tests.conftest import EXAMPLES, assert_one_line_error

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"


def test_concurrency_is_bounded_by_jobs():
    active = peak = 0
    lock = threading.Lock()
    pair = threading.Barrier(2, timeout=60)  # only two devices running at once can pass it

    def work(i: int) -> int:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        pair.wait()
        with lock:
            active -= 1
        return i * i

    result = run_fleet(range(6), work, jobs=2)
    assert peak == 2
    assert [o.value for o in result.outcomes] == [0, 1, 4, 9, 16, 25]
    assert result.ok and result.exit_code == 0 and result.summary() == "6 of 6 device(s) passed"


def test_one_failing_device_does_not_stop_the_others():
    def work(name: str) -> str:
        if name == "pi2":
            raise DeviceError("cannot reach pi2", "check the cable")
        if name == "pi4":
            raise ModelError("bad model", "fix it")
        if name == "pi5":
            raise ZeroDivisionError("oops")
        return name.upper()

    names = ["pi1", "pi2", "pi3", "pi4", "pi5"]
    result = run_fleet(names, work, jobs=3)
    assert [o.device for o in result.outcomes] == names  # the order given, not the finishing order
    assert [o.value for o in result.succeeded] == ["PI1", "PI3"]
    by = {o.device: o for o in result.outcomes}
    assert (by["pi2"].status, by["pi2"].error, by["pi2"].hint, by["pi2"].exit_code) == ("failed", "cannot reach pi2", "check the cable", 4)
    assert by["pi4"].exit_code == 3
    assert by["pi5"].exit_code == 1 and "internal error: ZeroDivisionError: oops" in by["pi5"].error
    assert "ZeroDivisionError" in by["pi5"].traceback
    assert result.exit_code == 4  # the first failed device's
    assert result.summary() == "2 of 5 device(s) passed; failed: pi2, pi4, pi5"
    doc = by["pi2"].to_dict()
    assert doc["status"] == "failed" and doc["result"] is None and doc["exit_code"] == 4


def test_ctrl_c_cancels_what_has_not_started_and_does_not_wait():
    gate = threading.Event()
    started = threading.Semaphore(0)

    def work(i: int) -> int:
        if i == 0:
            return 0
        started.release()
        gate.wait(60)  # a device still busy when Ctrl-C comes
        return i

    def interrupt(outcome) -> None:
        assert started.acquire(timeout=60)  # device 1 is running
        raise KeyboardInterrupt

    try:
        result = run_fleet(range(5), work, jobs=2, on_done=interrupt)
    finally:
        gate.set()
    assert result.interrupted and result.exit_code == 130
    statuses = [o.status for o in result.outcomes]
    assert statuses[0] == "ok" and statuses[1] == INTERRUPTED
    assert set(statuses[2:]) <= {INTERRUPTED, CANCELLED} and CANCELLED in statuses[2:]


def test_device_events_prefix_every_line():
    lines = []

    class Sink:
        def info(self, m):
            lines.append(("info", m))

        def warn(self, m):
            lines.append(("warn", m))

    ev = DeviceEvents(Sink(), "pi1")
    ev.info("hello")
    ev.warn("careful")
    with ev.progress("pushing", total=3) as bar:
        bar.advance()
        bar.update("still pushing")
    assert lines == [("info", "[pi1] hello"), ("warn", "[pi1] careful"), ("info", "[pi1] pushing ...")]
    assert safe_name("pi@10.0.0.7:22") == "pi_10.0.0.7_22" and safe_name("..") == "device"


def test_jobs_must_be_positive():
    with pytest.raises(ValueError):
        run_fleet([1], lambda x: x, jobs=0)


# -- deploy and bench on several devices -----------------------------------------------------------


@pytest.mark.slow
def test_deploy_and_bench_a_fleet_from_an_inventory(cli, tmp_path):
    # Three "devices" on this machine, each with its own workdir; one has a profile it can't meet.
    inv = tmp_path / "devices.toml"
    inv.write_text(
        f'[devices.sim1]\nssh = "local"\nworkdir = "{tmp_path / "sim1"}"\ntags = ["lab"]\n\n'
        f'[devices.sim2]\nssh = "local"\nworkdir = "{tmp_path / "sim2"}"\ntags = ["lab"]\n\n'
        f'[devices.wrongarch]\nssh = "local"\nworkdir = "{tmp_path / "wrong"}"\nprofile = "rpi5"\n'
    )
    r = cli("deploy", DIGITS, "--inventory", inv, "--iterations", "10", "--jobs", "3", "-o", tmp_path / "out", "--json")
    assert_one_line_error(r, 4, "1 of 3 device(s) failed: wrongarch")
    doc = json.loads(r.stdout)
    assert [d["device"] for d in doc] == ["sim1", "sim2", "wrongarch"]
    assert [d["status"] for d in doc] == ["ok", "ok", "failed"]
    assert "preflight failed on wrongarch" in doc[2]["error"] and "x86_64" in doc[2]["error"]
    for d in doc[:2]:
        assert d["result"]["device"] == d["device"] and d["result"]["push"]["files_sent"] > 0
        assert {run["variant"] for run in d["result"]["runs"]} == {"fp32", "int8"}
    assert (tmp_path / "out" / "sim1" / "manifest.json").is_file() and (tmp_path / "out" / "sim2" / "manifest.json").is_file()
    assert not (tmp_path / "wrong" / "bundles").exists()  # preflight failed before any push
    assert (tmp_path / "sim1" / "bundles").is_dir() and (tmp_path / "sim2" / "bundles").is_dir()

    # bench the same bundle on the @lab group: a row each, runs stored under each device's name
    r = cli("bench", tmp_path / "out" / "sim1", "--inventory", inv, "--device", "@lab", "--iterations", "5")
    assert r.returncode == 0, r.stderr
    assert "2 of 2 device(s) passed" in r.stdout and "sim1" in r.stdout and "sim2" in r.stdout
    listed = json.loads(cli("results", "list", "--json").stdout)
    devices = [row["device"] for row in listed]
    assert devices.count("sim1") == 4 and devices.count("sim2") == 4  # 2 deploy + 2 bench runs each


def test_fleet_bad_input(cli, tmp_path):
    inv = tmp_path / "devices.toml"
    inv.write_text(f'[devices.sim1]\nssh = "local"\nworkdir = "{tmp_path / "sim1"}"\n')
    assert_one_line_error(cli("deploy", DIGITS, "--inventory", inv, "--dry-run"), 2, "--dry-run and --no-bench don't reach a device")
    assert_one_line_error(cli("deploy", DIGITS, "--inventory", inv, "--device", "nosuch"), 2, "no device 'nosuch' in inventory")
    assert_one_line_error(cli("bench", DIGITS, "--device", "a@127.0.0.1", "--device", "b@127.0.0.1"), 2, "a model file is benched on one device")
    assert_one_line_error(cli("deploy", DIGITS, "--device", "@nogroup"), 2, "in group 'nogroup'")


def test_a_device_from_the_default_inventory_uses_its_profile_and_workdir(cli, tmp_path):
    # devices.toml in the working directory: `--device NAME` finds it, single-device output as before
    (tmp_path / "devices.toml").write_text(f'[devices.bench1]\nssh = "local"\nworkdir = "{tmp_path / "b1"}"\nprofile = "rpi5"\n')
    r = cli("deploy", DIGITS, "--device", "bench1", "--iterations", "5")
    assert_one_line_error(r, 4, "preflight failed on bench1 (profile rpi5)")
    assert "--target" in r.stderr.splitlines()[-1]  # the hint names a profile this CPU meets
    r = cli("deploy", DIGITS, "--device", "bench1", "--target", "local", "--iterations", "5", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["device"] == "bench1" and doc["target"] == "local"
    assert LocalTransport(tmp_path / "b1").sha256(f"bundles/{doc['bundle']['hash']}/manifest.json")


# -- a fleet of an SSH device, this machine, and one that is down ------------------------------


@pytest.mark.slow
def test_fleet_over_ssh_and_local_with_one_device_down(cli, sshd_server, ssh_home, tmp_path):
    sshd = sshd_server  # the lab's real sshd on loopback; ssh_home names it "lab"
    ssh_home.trust()
    r = cli(
        "deploy", DIGITS, "--device", "lab", "--device", "local", "--device", "nobody@127.0.0.1:1",
        "--jobs", "3", "--iterations", "5", "-o", tmp_path / "out", "--json",
    )  # fmt: skip
    assert_one_line_error(r, 4, "1 of 3 device(s) failed: nobody@127.0.0.1:1")
    doc = {d["device"]: d for d in json.loads(r.stdout)}
    assert doc["lab"]["status"] == "ok" and doc["local"]["status"] == "ok"
    assert doc["nobody@127.0.0.1:1"]["status"] == "failed" and doc["nobody@127.0.0.1:1"]["exit_code"] == 4
    lab = doc["lab"]["result"]
    assert lab["device"] == "lab" and {run["variant"] for run in lab["runs"]} == {"fp32", "int8"}
    assert (sshd.home / ".edgekit" / "bundles" / lab["bundle"]["hash"] / "manifest.json").is_file()
    assert not (sshd.home / ".edgekit" / "lock").exists()  # released after the run
