"""Ansible as the fleet engine (``--engine ansible``): choosing it, bad input, parity with the ssh
engine on one loopback device, a jump host with key files, and (slow) a 50-device fleet.

The devices are real sshd processes on 127.0.0.1 (tests/lab); Ansible reaches them with its own
OpenSSH client. Host keys are checked: each inventory points Ansible's ssh at a known_hosts file
that holds every lab server's key (``-o UserKnownHostsFile=...`` in ``ansible_ssh_common_args``,
as a team would for a lab network), never at ``StrictHostKeyChecking=no``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from edgekit.devices import ansible as engine
from edgekit.errors import UsageError
from tests.conftest import EXAMPLES, assert_one_line_error
from tests.lab import sshd as sshd_mod

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
needs_ansible = pytest.mark.skipif(not engine.available(), reason="needs the ansible extra: pip install 'edgekit[ansible]'")


# -- choosing the engine, bad input (no device needed) -------------------------------------------


def test_the_default_engine_follows_the_inventory(tmp_path, monkeypatch):
    ini, toml = tmp_path / "hosts.ini", tmp_path / "devices.toml"
    assert engine.choose_engine(None, toml) == "ssh"
    assert engine.choose_engine(None, None) == "ssh"
    monkeypatch.setattr(engine, "available", lambda: True)
    assert engine.choose_engine(None, ini) == "ansible"
    monkeypatch.setattr(engine, "available", lambda: False)
    assert engine.choose_engine(None, ini) == "ssh"  # not installed: edgekit's own engine, as before
    with pytest.raises(UsageError, match="needs ansible-core and ansible-runner") as exc:
        engine.choose_engine("ansible", ini)
    assert "pip install 'edgekit[ansible]'" in exc.value.hint


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--serial", "0"], "--serial takes N hosts or N%"),
        (["--serial", "150%"], "--serial takes N hosts or N%"),
        (["--max-fail", "x"], "--max-fail takes a percentage"),
        (["--forks", "0"], "--forks must be at least 1"),
        (["--limit", " "], "--limit is empty"),
    ],
)
def test_bad_strategy_is_one_error(args, needle):
    opts = dict(zip(("--limit", "--forks", "--serial", "--max-fail"), (None, None, None, None)))
    opts.update({args[0]: int(args[1]) if args[0] == "--forks" else args[1]})
    with pytest.raises(UsageError, match=needle.replace("%", "%")):
        engine.Strategy.parse(opts["--limit"], opts["--forks"], opts["--serial"], opts["--max-fail"])


def test_engine_bad_input_on_the_command_line(cli, tmp_path):
    toml = tmp_path / "devices.toml"
    toml.write_text('[devices.a]\nssh = "a@127.0.0.1:1"\n')
    ini = tmp_path / "hosts.ini"
    ini.write_text("a ansible_host=127.0.0.1 ansible_port=1\n")
    assert_one_line_error(cli("deploy", DIGITS, "--engine", "nope", "--inventory", ini), 2, "unknown --engine 'nope'")
    assert_one_line_error(cli("deploy", DIGITS, "--engine", "ansible", "--inventory", toml), 2, "is edgekit's own devices.toml")
    assert_one_line_error(cli("deploy", DIGITS, "--engine", "ansible"), 2, "none was given")
    assert_one_line_error(cli("deploy", DIGITS, "--engine", "ssh", "--inventory", ini, "--limit", "a"), 2, "--limit is Ansible's")
    assert_one_line_error(cli("devices", "check", "a", "--inventory", toml, "--serial", "2"), 2, "--serial is Ansible's")
    if engine.available():
        assert_one_line_error(cli("deploy", DIGITS, "--engine", "ansible", "--inventory", ini, "--device", "a"), 2, "--device picks devices for the ssh engine")
        assert_one_line_error(cli("deploy", DIGITS, "--engine", "ansible", "--inventory", ini, "--rounds", "2"), 2, "--rounds above 1 is not supported")


@needs_ansible
def test_a_limit_that_matches_no_host_is_an_error(cli, tmp_path):
    ini = tmp_path / "hosts.ini"
    ini.write_text("[lab]\npi1 ansible_host=127.0.0.1 ansible_port=1\n")
    r = cli("devices", "check", "--inventory", ini, "--engine", "ansible", "--limit", "nosuch*")
    assert_one_line_error(r, 2, "--limit 'nosuch*' matches no host")
    r = cli("deploy", DIGITS, "--inventory", ini, "--limit", "nosuch*", "-n", "5")  # the default engine for an INI inventory
    assert_one_line_error(r, 2, "--limit 'nosuch*' matches no host")


# -- lab helpers ---------------------------------------------------------------------------------


def _ini_line(name: str, server: sshd_mod.Sshd, **more: str) -> str:
    words = [name, "ansible_host=127.0.0.1", f"ansible_port={server.port}", f"ansible_user={server.user}", f"ansible_ssh_private_key_file={server.client_key}"]
    return " ".join(words + [f"{k}={v}" for k, v in more.items()]) + "\n"


def _records(data_dir: Path, limit: int = 100) -> list[dict]:
    from edgekit.bench.store import ResultsStore

    with ResultsStore(data_dir / "results.db") as store:
        return sorted(store.records(limit=limit), key=lambda r: r["agent"]["variant"])


def _crashing_python(tmp_path: Path) -> Path:
    """A Python whose ``onnxruntime.InferenceSession`` raises "simulated crash in bench": the agent's
    facts and the store work, the first bench of a float variant fails (under either engine: the
    ssh engine's ``serve`` and Ansible's per-step commands both start this interpreter)."""
    shim = tmp_path / "crash-shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import builtins\n_import = builtins.__import__\n"
        "def _crash(*a, **k):\n    raise RuntimeError('simulated crash in bench')\n"
        "def _hooked(name, *a, **k):\n    mod = _import(name, *a, **k)\n"
        "    if name == 'onnxruntime' and getattr(mod, 'InferenceSession', None) is not _crash:\n        mod.InferenceSession = _crash\n"
        "    return mod\n"
        "builtins.__import__ = _hooked\n"
    )
    wrapper = tmp_path / "crashing-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={shim} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


# What differs between two measurements of the same bundle on the same device: when and how fast.
TIMING = {
    "run_uuid", "created", "stats", "samples_ns", "warmup_samples_ns", "first_inference_ns", "load_ns", "speed_probe", "started_at",
    "device_state", "layers", "peak_rss_bytes", "threads_probe", "rounds", "energy", "runner_load_ns",
    "speedup_p50", "speedup_ci95", "reasons",  # the int8 gate's measured speed-up, and its sentences quoting it
    "contention",  # what else the machine ran during the timed window: a moment's fact, like its clocks
    "faster", "recommended",  # int8 vs fp32 on the 2-core VM: the gate's verdict follows the measured speed-up
}  # fmt: skip


def _differences(a, b, path=""):
    """Paths where ``a`` and ``b`` differ, outside the timing fields."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k in TIMING:
                continue
            out += _differences(a.get(k), b.get(k), f"{path}.{k}")
        return out
    return [] if a == b else [path]


@needs_ansible
@pytest.mark.ssh
def test_ansible_and_ssh_engines_deploy_the_same_bundle_bytes_and_records(cli, sshd_server, ssh_home, tmp_path):
    sshd = sshd_server
    ssh_home.trust()  # for the ssh engine (edgekit reads $HOME/.ssh) ...
    kh = tmp_path / "known_hosts"  # ... and for Ansible's ssh (the account's ~/.ssh otherwise)
    kh.write_text(sshd.known_hosts_line())
    ini = tmp_path / "hosts.ini"
    ini.write_text("[lab]\n" + _ini_line("lab", sshd) + f"[lab:vars]\nansible_ssh_common_args='-o UserKnownHostsFile={kh}'\n")
    data = {name: tmp_path / f"data-{name}" for name in ("ssh", "ansible")}
    docs = {}
    for name in ("ssh", "ansible"):
        shutil.rmtree(sshd.home / ".edgekit", ignore_errors=True)  # a fresh device for each engine
        env = {**ssh_home.env(), "EDGEKIT_DATA_DIR": str(data[name])}
        where = ["--device", "lab"] if name == "ssh" else ["--inventory", ini, "--engine", "ansible"]
        runs = []
        for _ in range(2):
            # --threads 1: without it the agent probes 1 against all threads, and which wins is a timing
            r = cli("deploy", DIGITS, *where, "-n", "20", "--warmup", "5", "--threads", "1", "-o", "out", "--json", env=env)  # relative: Ansible runs elsewhere
            assert r.returncode == 0, r.stderr
            doc = json.loads(r.stdout)
            runs.append(doc if name == "ssh" else doc[0]["result"])
        docs[name] = runs
    ssh, ans = docs["ssh"], docs["ansible"]
    assert ans[0]["bundle"]["hash"] == ssh[0]["bundle"]["hash"]
    assert ans[0]["push"]["bytes_sent"] == ssh[0]["push"]["bytes_sent"] > 0
    assert (ans[0]["push"]["files_sent"], ans[0]["push"]["files_skipped"]) == (ssh[0]["push"]["files_sent"], ssh[0]["push"]["files_skipped"])
    assert ans[1]["push"]["bytes_sent"] == ssh[1]["push"]["bytes_sent"] == 0
    assert ans[0]["summary"]["accuracy_int8"] == ssh[0]["summary"]["accuracy_int8"] is not None  # evaluated on the device by both
    assert all(r["reused"] for r in ans[1]["runs"]) and all(r["reused"] for r in ssh[1]["runs"])  # the unchanged redeploy measured nothing
    a, b = _records(data["ssh"]), _records(data["ansible"])
    assert [r["agent"]["variant"] for r in a] == [r["agent"]["variant"] for r in b] == ["fp32", "int8"]
    for ra, rb in zip(a, b):
        assert _differences(ra, rb) == [], (ra["agent"]["variant"], _differences(ra, rb))
    assert not (sshd.home / ".edgekit" / "lock").exists()  # released


@needs_ansible
@pytest.mark.ssh
def test_bench_a_bundle_over_ansible_stores_what_the_ssh_engine_stores(cli, sshd_server, ssh_home, tmp_path):
    """``bench BUNDLE --engine ansible``: the bundle that exists already is pushed where missing and
    its variants timed under the device lock; the records are the ssh engine's, timing aside."""
    sshd = sshd_server
    ssh_home.trust()
    kh = tmp_path / "known_hosts"
    kh.write_text(sshd.known_hosts_line())
    ini = tmp_path / "hosts.ini"
    ini.write_text("[lab]\n" + _ini_line("lab", sshd) + f"[lab:vars]\nansible_ssh_common_args='-o UserKnownHostsFile={kh}'\n")
    bundle = tmp_path / "bundle"
    assert cli("deploy", DIGITS, "--no-bench", "-o", bundle).returncode == 0
    bench = ["bench", bundle, "-n", "20", "--warmup", "5", "--threads", "1", "--layers", "off", "--json"]
    records = {}
    for name in ("ssh", "ansible"):
        shutil.rmtree(sshd.home / ".edgekit", ignore_errors=True)
        env = {**ssh_home.env(), "EDGEKIT_DATA_DIR": str(tmp_path / f"data-{name}")}
        where = ["--device", "lab"] if name == "ssh" else ["--inventory", ini, "--engine", "ansible"]
        r = cli(*bench, *where, env=env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        if name == "ansible":  # one row per host, as a fleet's
            assert [(d["device"], d["status"]) for d in doc] == [("lab", "ok")]
            doc = doc[0]["result"]
            assert "[lab] pushed over Ansible: " in r.stderr
            again = cli(*bench, "--variant", "int8", *where, env=env)  # pushed already: nothing sent; one variant
            assert again.returncode == 0, again.stderr
            assert "[lab] bundle already on the device: nothing to push" in again.stderr
            assert [d["agent"]["variant"] for d in json.loads(again.stdout)[0]["result"]] == ["int8"]
        records[name] = sorted(doc, key=lambda d: d["agent"]["variant"])
    a, b = records["ssh"], records["ansible"]
    assert [r["agent"]["variant"] for r in a] == [r["agent"]["variant"] for r in b] == ["fp32", "int8"]
    assert all(r["device"] == "lab" for r in a + b)
    for ra, rb in zip(a, b):
        assert _differences(ra, rb) == [], (ra["agent"]["variant"], _differences(ra, rb))
    assert not (sshd.home / ".edgekit" / "lock").exists()


def test_bench_bad_input_for_the_ansible_engine(cli, tmp_path):
    ini = tmp_path / "hosts.ini"
    ini.write_text("a ansible_host=127.0.0.1 ansible_port=1\n")
    assert_one_line_error(cli("bench", DIGITS, "--engine", "ssh", "--inventory", ini, "--forks", "2"), 2, "--forks is Ansible's")
    if engine.available():
        assert_one_line_error(cli("bench", DIGITS, "--engine", "ansible", "--inventory", ini), 2, "a model file is benched on one device")
        assert_one_line_error(cli("bench", tmp_path, "--engine", "ansible", "--inventory", ini, "--device", "a"), 2, "--device picks devices for the ssh engine")
        assert_one_line_error(cli("bench", tmp_path, "--engine", "ansible", "--inventory", ini, "--rounds", "3"), 2, "--rounds above 1 is not supported")


@needs_ansible
@pytest.mark.ssh
def test_ci_runs_its_devices_through_ansible_and_reports_the_unreachable_one(cli, sshd_server, tmp_path):
    """edgekit.toml with an Ansible inventory and ``engine = "ansible"``: one device runs and is
    gated, one Ansible cannot reach is an "unreachable" run (exit 4; with --fail-on-unreachable=false
    it would not count, as test_ci checks for the ssh engine), and the JUnit file says the same."""
    kh = tmp_path / "known_hosts"
    kh.write_text(sshd_server.known_hosts_line())
    (tmp_path / "hosts.ini").write_text(
        "[lab]\n" + _ini_line("lab", sshd_server) + f"gone ansible_host=127.0.0.1 ansible_port={sshd_mod.free_port()}\n"
        f"[lab:vars]\nansible_ssh_common_args='-o UserKnownHostsFile={kh}'\n"
    )
    (tmp_path / "edgekit.toml").write_text(
        'inventory = "hosts.ini"\nengine = "ansible"\n[defaults]\niterations = 20\nwarmup = 3\nthreads = 1\nlayers = false\n'
        f'[[models]]\npath = "{DIGITS}"\ntargets = ["local"]\ndevices = ["lab", "gone"]\ngates = ["p99:<60000ms"]\n'
    )
    r = cli("ci", "--junit", "junit.xml", "--json")
    assert_one_line_error(r, 4, "1 of 2 run(s) failed: digits_cnn/local/gone: gone: Ansible could not reach it")
    doc = json.loads(r.stdout)
    assert [(x["device"], x["status"]) for x in doc["runs"]] == [("lab", "passed"), ("gone", "unreachable")]
    assert doc["devices"] == {"ok": 1, "failed": 0, "unreachable": 1}
    listed = json.loads(cli("results", "list", "--json").stdout)
    assert sorted(r["id"] for r in listed) == sorted(doc["runs"][0]["run_ids"]) and {r["device"] for r in listed} == {"lab"}
    import xml.etree.ElementTree as ET

    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "0", "1")
    bad = tmp_path / "bad.toml"
    bad.write_text('inventory = "hosts.ini"\nengine = "nope"\n' + f'[[models]]\npath = "{DIGITS}"\n')
    assert_one_line_error(cli("ci", "--config", bad), 3, "engine: unknown engine 'nope'")


# -- a bastion, key files, group vars --------------------------------------------------------------


@needs_ansible
@pytest.mark.ssh
def test_key_files_port_user_and_a_jump_host_from_the_inventory(cli, _ssh_lab_ready, tmp_path):
    """The device is reached only through the bastion (a ProxyCommand through it, the classic
    Ansible bastion line), each with its own key file: edgekit's own parser knew none of this."""
    with sshd_mod.Sshd(tmp_path / "bastion", log_level="DEBUG1") as bastion, sshd_mod.Sshd(tmp_path / "device") as device:
        kh = tmp_path / "known_hosts"
        kh.write_text(bastion.known_hosts_line() + device.known_hosts_line())
        hop = f"ssh -q -i {bastion.client_key} -o IdentitiesOnly=yes -o BatchMode=yes -o UserKnownHostsFile={kh} -p {bastion.port} -W %h:%p {bastion.user}@127.0.0.1"
        inv = tmp_path / "hosts.ini"
        inv.write_text(
            "[edge]\n" + _ini_line("board1", device, edgekit_profile="linux-cpu")
            + "[edge:vars]\n"
            + f"ansible_ssh_common_args='-o UserKnownHostsFile={kh} -o ProxyCommand=\"{hop}\"'\n"
        )  # fmt: skip
        r = cli("devices", "check", "board1", "--inventory", inv, "--json")  # the default engine: ansible
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc[0]["device"] == "board1" and doc[0]["status"] == "ok"
        assert doc[0]["result"]["profile"] == "linux-cpu" and doc[0]["result"]["lock"]["locked"] is False
        assert sshd_mod.log_has(bastion, r"direct-tcpip|server_request_direct_tcpip")  # it went through the bastion
        r = cli("deploy", DIGITS, "--inventory", inv, "--engine", "ansible", "-n", "10", "--warmup", "2", "-o", tmp_path / "out", "--json")
        assert r.returncode == 0, r.stderr
        result = json.loads(r.stdout)[0]["result"]
        assert result["device"] == "board1" and result["target"] == "linux-cpu"
        assert {run["variant"] for run in result["runs"]} == {"fp32", "int8"}
        assert (device.home / ".edgekit" / "bundles" / result["bundle"]["hash"] / "manifest.json").is_file()
        listed = json.loads(cli("results", "list", "--json").stdout)
        assert {r["device"] for r in listed} == {"board1"}


# -- a fleet of 50 ------------------------------------------------------------------------------------


@needs_ansible
@pytest.mark.ssh
@pytest.mark.slow
def test_fifty_devices_through_ansible_with_unreachable_and_failing_ones(cli, _ssh_lab_ready, tmp_path):
    """50 loopback sshd devices (each its own port, host key and store), --forks 10 --serial 25%:
    3 unreachable (nobody listens on their port), 2 whose ONNX Runtime fails to load the model at
    the first bench (a Python wrapper named by ansible_python_interpreter, which both engines run). 45 devices' records stored, 5 errors with reasons, one summary.
    Then the same inventory through edgekit's own ssh engine, onto wiped devices: the same hosts
    fail, the same bundle ids, the same bytes pushed, and records that differ only in timing."""
    key = tmp_path / "client_key"
    sshd_mod.keygen(key, "edgekit-lab-client")
    wrapper = _crashing_python(tmp_path)
    servers: list[sshd_mod.Sshd] = []
    try:
        for i in range(47):
            servers.append(sshd_mod.Sshd(tmp_path / f"d{i:02d}", client_key=key).start())
        kh = tmp_path / "known_hosts"
        kh.write_text("".join(s.known_hosts_line() for s in servers))
        lines = [_ini_line(f"d{i:02d}", s, **({"ansible_python_interpreter": str(wrapper)} if i in (7, 31) else {})) for i, s in enumerate(servers)]
        lines += [f"gone{i} ansible_host=127.0.0.1 ansible_port={sshd_mod.free_port()}\n" for i in range(3)]
        inv = tmp_path / "fleet.ini"
        inv.write_text("[fleet]\n" + "".join(lines) + f"[fleet:vars]\nansible_ssh_common_args='-o UserKnownHostsFile={kh}'\n")
        # the ssh engine reads the account's ~/.ssh (it does not take Ansible's key-file and ssh-args variables)
        home = tmp_path / "home"
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        shutil.copy(key, home / ".ssh" / "id_ed25519")
        shutil.copy(f"{key}.pub", home / ".ssh" / "id_ed25519.pub")
        shutil.copy(kh, home / ".ssh" / "known_hosts")
        docs, stores = {}, {}
        for name in ("ansible", "ssh"):
            for s in servers:
                shutil.rmtree(s.home / ".edgekit", ignore_errors=True)  # fresh devices for each engine
            stores[name] = tmp_path / f"data-{name}"
            how = ["--forks", "10", "--serial", "25%"] if name == "ansible" else ["--jobs", "10"]
            r = cli("deploy", DIGITS, "--inventory", inv, "--engine", name, *how, "-n", "20", "--warmup", "2", "--layers", "off", "--threads", "1",
                    "-o", tmp_path / f"out-{name}", "--json", env={"HOME": str(home), "EDGEKIT_DATA_DIR": str(stores[name])}, timeout=1200)  # fmt: skip
            assert_one_line_error(r, 4, "5 of 50 device(s) failed")
            docs[name] = {d["device"]: d for d in json.loads(r.stdout)}
            doc = docs[name]
            assert len(doc) == 50
            failed = {n: d["error"] for n, d in doc.items() if d["status"] == "failed"}
            assert set(failed) == {"gone0", "gone1", "gone2", "d07", "d31"}, (name, failed)
            assert all("connection refused" in failed[f"gone{i}"].lower() for i in range(3)), (name, failed)
            assert all("simulated crash in bench" in failed[n] for n in ("d07", "d31")), (name, failed)
            listed = json.loads(cli("results", "list", "--json", "--limit", "500", env={"EDGEKIT_DATA_DIR": str(stores[name])}).stdout)
            assert len(listed) == 90 and len({r["device"] for r in listed}) == 45
            assert not any((s.home / ".edgekit" / "lock").exists() for s in servers)  # every lock released, the failed ones' too
        assert all("could not reach it" in docs["ansible"][f"gone{i}"]["error"] for i in range(3))
        ok = sorted(n for n, d in docs["ssh"].items() if d["status"] == "ok")
        pick = {n: (docs["ansible"][n]["result"], docs["ssh"][n]["result"]) for n in ok}
        assert {a["bundle"]["hash"] for a, _ in pick.values()} == {b["bundle"]["hash"] for _, b in pick.values()}  # one bundle id, both engines
        assert all(a["bundle"]["hash"] == b["bundle"]["hash"] and a["push"]["files_sent"] == b["push"]["files_sent"] > 0 for a, b in pick.values())
        # records by device and variant (the store's row ids follow the order the devices finished in)
        by = {name: {(r["device"], r["agent"]["variant"]): {k: v for k, v in r.items() if k != "id"} for r in _records(stores[name], limit=500)} for name in stores}
        assert set(by["ansible"]) == set(by["ssh"]) and len(by["ssh"]) == 90
        differ = {k: _differences(by["ansible"][k], by["ssh"][k]) for k in by["ssh"]}
        assert not any(differ.values()), {k: v for k, v in differ.items() if v}
    finally:
        for s in servers:
            s.stop()


@needs_ansible
@pytest.mark.ssh
def test_max_fail_stops_the_run_and_the_rest_is_not_deployed(cli, _ssh_lab_ready, tmp_path):
    """--serial 1 --max-fail 0: the first batch's host fails its bench, so Ansible stops; the two
    hosts after it are reported not deployed, with the reason, and their stores stay empty."""
    key = tmp_path / "client_key"
    sshd_mod.keygen(key, "edgekit-lab-client")
    wrapper = tmp_path / "crashing-python"
    wrapper.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = bench ] && {{ echo "simulated crash in bench" >&2; exit 3; }}; done\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    servers = [sshd_mod.Sshd(tmp_path / f"h{i}", client_key=key).start() for i in range(3)]
    try:
        kh = tmp_path / "known_hosts"
        kh.write_text("".join(s.known_hosts_line() for s in servers))
        inv = tmp_path / "hosts.ini"
        inv.write_text("[fleet]\n" + _ini_line("h0", servers[0], ansible_python_interpreter=str(wrapper)) + _ini_line("h1", servers[1])
                       + _ini_line("h2", servers[2]) + f"[fleet:vars]\nansible_ssh_common_args='-o UserKnownHostsFile={kh}'\n")  # fmt: skip
        r = cli("deploy", DIGITS, "--inventory", inv, "--serial", "1", "--max-fail", "0%", "-n", "10", "--warmup", "2", "--layers", "off", "-o", tmp_path / "out", "--json")
        assert_one_line_error(r, 4, "3 of 3 device(s) failed")
        doc = {d["device"]: d for d in json.loads(r.stdout)}
        assert "simulated crash in bench" in doc["h0"]["error"]
        assert all("not deployed: Ansible stopped the run before this host (more than 0% of a batch failed)" in doc[h]["error"] for h in ("h1", "h2"))
        assert not (servers[1].home / ".edgekit" / "bundles").exists() and not (servers[2].home / ".edgekit" / "bundles").exists()
        assert not (servers[0].home / ".edgekit" / "lock").exists()  # the failed host's lock released in `always`
    finally:
        for s in servers:
            s.stop()
