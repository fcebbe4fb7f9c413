"""Host and user names never reach a shell through a ProxyCommand's %h / %r / %n.

* End to end: a real sshd, a user ~/.ssh/config whose ProxyCommand runs ``sh -c "...%h..."``,
  and inventories (devices.toml, Ansible INI and YAML), ~/.ssh/config entries and --device
  values carrying ``;touch${IFS}PWNED;``: the CLI exits with one error naming the source and
  the value, and PWNED is never created (a good entry through the same proxy does connect).
* The rules are OpenSSH's own: ``names`` agrees with the real ``ssh -G`` on many strings.
* Fuzz: a few thousand generated names through every input path; each is refused with an
  EdgekitError or comes out as a name OpenSSH accepts, and every accepted one is run through
  the same ProxyCommand expansion and a real ``sh``: no marker file ever appears.
"""

from __future__ import annotations

import json
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paramiko
import pytest

from edgekit.devices.inventory import load_inventory, resolve_devices
from edgekit.errors import EdgekitError
from edgekit.transport.names import host_ok, user_ok
from edgekit.transport.sshconfig import load_config, parse_device, resolve_target
from tests.conftest import assert_one_line_error
from tests.test_ssh import RELAY  # a stdin/stdout <-> TCP relay for ProxyCommand

yaml = pytest.importorskip("yaml")

PAYLOAD = "lab-1;touch${IFS}PWNED;"

@pytest.fixture
def shell_proxy(ssh_home, sshd_server, tmp_path):
    """Every host in ~/.ssh/config goes through ``sh -c "echo %h %r >>LOG; exec relay"`` to the lab sshd."""
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    log = tmp_path / "proxy.log"
    log.touch()
    with open(ssh_home.config, "a") as fh:
        fh.write(
            "\nHost *\n"
            f'    ProxyCommand sh -c "echo %h %r >>{log}; exec {sys.executable} {relay} 127.0.0.1 {sshd_server.port}"\n'
            f"    User {sshd_server.user}\n    IdentityFile {sshd_server.client_key}\n    IdentitiesOnly yes\n"
        )
    return log


def _refused(result, tmp_path: Path, log: Path, code: int, *needles: str) -> None:
    assert_one_line_error(result, code, "has characters OpenSSH refuses")
    error = next(ln for ln in result.stderr.splitlines() if ln.startswith("error: "))
    for needle in needles:
        assert needle in error, error
    assert not (tmp_path / "PWNED").exists(), "a shell ran the payload"
    assert "lab-1" not in log.read_text(), "the ProxyCommand was started for the bad name"


@pytest.mark.ssh
@pytest.mark.slow
def test_bad_names_never_reach_the_proxycommand_shell(ssh_home, sshd_server, shell_proxy, cli, tmp_path):
    env = ssh_home.env()
    # control: a good entry goes through the same shell ProxyCommand to the real sshd
    (tmp_path / "good.toml").write_text('[devices.good]\nssh = "lab-ok"\n')
    good = cli("devices", "check", "good", "--inventory", tmp_path / "good.toml", env=env)
    assert_one_line_error(good, 4, "is not a known host")  # the handshake went through the proxy
    assert "lab-ok" in shell_proxy.read_text()

    inventories = {
        "devices.toml ssh": ("inv.toml", f'[devices.lab-1]\nssh = "{PAYLOAD}"\n', "devices.lab-1.ssh"),
        "devices.toml user": ("inv2.toml", f'[devices.lab-1]\nssh = "{PAYLOAD}@127.0.0.1"\n', "devices.lab-1.ssh"),
        "INI ansible_host": ("hosts.ini", f"[lab]\nlab-1 ansible_host={PAYLOAD}\n", "ansible_host"),
        "INI ansible_user": ("hosts2.ini", f"[lab]\nlab-1 ansible_host=lab-ok ansible_user={PAYLOAD}\n", "ansible_user"),
        "YAML ansible_host": ("hosts.yml", yaml.safe_dump({"all": {"hosts": {"lab-1": {"ansible_host": PAYLOAD}}}}), "ansible_host"),
        "YAML ansible_user": ("hosts2.yml", yaml.safe_dump({"all": {"hosts": {"lab-1": {"ansible_host": "lab-ok", "ansible_user": PAYLOAD}}}}), "ansible_user"),
    }
    for label, (name, text, where) in inventories.items():
        path = tmp_path / name
        path.write_text(text)
        # edgekit's own inventory reader (the ssh engine; with an INI/YAML inventory Ansible would be the default)
        result = cli("devices", "check", "lab-1", "--inventory", path, "--engine", "ssh", "--trust-new-host", env=env)
        try:
            _refused(result, tmp_path, shell_proxy, 3, str(path), where, repr(PAYLOAD))
        except AssertionError as exc:
            raise AssertionError(f"{label}: {exc}") from None
    listed = cli("devices", "list", "--inventory", tmp_path / "hosts.ini", env=env)  # listing refuses it as well
    _refused(listed, tmp_path, shell_proxy, 3, "ansible_host", repr(PAYLOAD))

    # ~/.ssh/config entries that would be substituted into %h / %r, and a ProxyJump hop
    evil = f"Host evil-host\n    HostName {PAYLOAD}\nHost evil-user\n    User {PAYLOAD}\nHost evil-jump\n    ProxyJump {PAYLOAD}\n"
    ssh_home.config.write_text(evil + ssh_home.config.read_text())  # first value wins: before Host *
    for alias, key in (("evil-host", "HostName"), ("evil-user", "User"), ("evil-jump", "ProxyJump")):
        result = cli("devices", "check", alias, "--trust-new-host", env=env)
        # resolved by `ssh -G` (which lowercases a HostName): the error names the destination and the option
        _refused(result, tmp_path, shell_proxy, 3, alias, key, "touch")

    # and on the command line (a bad argument: usage error)
    for device in (PAYLOAD, f"{PAYLOAD}@lab-ok", "root@-oProxyCommand=touch${IFS}PWNED"):
        result = cli("devices", "check", device, "--trust-new-host", env=env)
        assert result.returncode == 2, result.stderr
        assert not (tmp_path / "PWNED").exists()
    assert "lab-1" not in shell_proxy.read_text()


# -- the rules are OpenSSH's ---------------------------------------------------------------

PIECES = [
    ";", "&", "&&", "|", "||", "<", ">", "(", ")", "$(", "`", "'", '"', "\\", "$", "${IFS}", "{", "}", ",", "!", "*", "?",
    "[", "]", "~", "#", "=", "^", "%h", "%r", "%n", "%%", "%", "@", ":", "/", " ", "\t", "\n", "\r", "\x00", "\x1b", "\x7f",
    "é", "中", "\u2028", "\u202e", "\U0001f600", "-", " -", "-o", "ProxyCommand=", "touch${IFS}PWNED", "$(touch PWNED)",
    "`touch PWNED`", ";touch PWNED;", "|touch PWNED", "&&touch PWNED", "\ntouch PWNED", "pi", "lab-1", "10.0.0.7", "host.lan",
    "user", "x", "0", "_", ".", "+",
]  # fmt: skip
KNOWN_BAD = [PAYLOAD, "-oProxyCommand=touch PWNED", "a\nProxyCommand touch PWNED", "x\x00;touch PWNED", "pi`touch PWNED`",
             "$(touch PWNED)", "pi|touch PWNED", "pi&touch PWNED", "pi>PWNED", "pi<x", "pi(x)", "pi{x}", "pi,x", "-", "", " "]  # fmt: skip


def _strings(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    out = list(KNOWN_BAD)
    while len(out) < count:
        kind = rng.random()
        if kind < 0.05:
            out.append(rng.choice(["pi", "a", "-x", "lab"]) * rng.randint(200, 2000))  # very long
        elif kind < 0.15:
            out.append("".join(rng.choice("abcxyz019.-_") for _ in range(rng.randint(1, 12))))  # plausible names
        else:
            out.append("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6))))
    return out


def _ssh_accepts(argv: list[str]) -> bool:
    proc = subprocess.run(["ssh", "-G", "-F", "/dev/null", *argv], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    if "invalid characters" in proc.stderr:
        return False
    assert proc.returncode == 0, (argv, proc.stderr)
    return True


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh")
def test_name_rules_agree_with_openssh():
    probe = subprocess.run(["ssh", "-G", "-F", "/dev/null", "--", "a;b"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if "invalid characters" not in probe.stderr:
        pytest.skip("this ssh predates OpenSSH 9.6's name checks")
    hosts = users = 0
    for s in _strings(606, 110):
        if "\x00" in s or not s:  # argv cannot carry NUL; ssh takes an empty -l as "no user"
            continue
        if "@" not in s and not s.startswith("ssh:"):  # ssh would split user@host itself
            assert host_ok(s) == _ssh_accepts(["--", s]), repr(s)
            hosts += 1
        assert user_ok(s) == _ssh_accepts(["-l", s, "--", "h"]), repr(s)
        users += 1
    assert hosts > 50 and users > 90
    print(f"OpenSSH agrees on {hosts} host names and {users} user names")


# -- the fuzz job ----------------------------------------------------------------------------

_STARTS_COMMANDS = set(";&|<>()`\n\r\x00")


def _shell_safe(value: str) -> bool:
    """Independent of ``names``: nothing in ``value`` can start a command in ``sh``."""
    return not (set(value) & _STARTS_COMMANDS) and "$(" not in value and not value.startswith("-")


@pytest.fixture
def fast_dir(tmp_path):
    """A scratch directory in memory when there is one (thousands of tiny files are written)."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="edgekit-fuzz-") as d:
        yield Path(d)


def test_fuzz_names_through_every_input_path(fast_dir, monkeypatch):
    tmp_path = fast_dir
    monkeypatch.setenv("EDGEKIT_CONFIG_DIR", str(tmp_path / "config"))  # no stray default inventory
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "proxy.out"
    proxy = f'Host *\n    ProxyCommand sh -c "echo %h %r %n >>{out}"\n'
    started = time.monotonic()
    strings = _strings(1313, 500)
    counts = {"cases": 0, "refused": 0, "accepted": 0, "shell runs": 0}
    accepted_addresses: set[str] = set()
    accepted_targets = []

    def attempt(what: str, call) -> None:
        counts["cases"] += 1
        try:
            produced = call()
        except EdgekitError:
            counts["refused"] += 1
            return
        counts["accepted"] += 1
        for kind, value in produced:
            if kind == "address":
                user, host, _ = parse_device(value)
                accepted_addresses.add(value)
                values = [("host", host), *([("user", user)] if user is not None else [])]
            else:
                values = [(kind, value)]
            for k, v in values:
                assert (host_ok if k == "host" else user_ok)(v), (what, k, v)
                assert _shell_safe(v), (what, k, v)

    def inventory(name: str, text: str):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return lambda: [("address", d.address) for d in load_inventory(path).devices.values() if d.address != "local"]

    def ssh_config(text: str, device: str):
        def run():
            path = tmp_path / "ssh_config"
            path.write_text(text + proxy, encoding="utf-8")
            target = resolve_target(device, load_config(path))
            accepted_targets.append(target)
            return [("host", target.hostname), ("user", target.user), *(("address", hop) for hop in target.proxy_jump)]

        return run

    for s in strings:
        if "\ud800" <= s[:1] <= "\udfff":
            continue
        attempt("--device", lambda s=s: [("address", e.address) for e in resolve_devices([s], cwd=tmp_path) if e.address != "local"])
        attempt("parse_device", lambda s=s: [("address", s)] if parse_device(s) else [])
        attempt("toml ssh", inventory("a.toml", f"[devices.d]\nssh = {json.dumps(s, ensure_ascii=False)}\n"))
        attempt("toml name", inventory("b.toml", f"[devices.{json.dumps(s, ensure_ascii=False)}]\nprofile = 'rpi4'\n"))
        attempt("ini host", inventory("a.ini", f"[g]\nd ansible_host={s}\n"))
        attempt("ini user", inventory("b.ini", f"[g]\nd ansible_host=10.0.0.7 ansible_user={s}\n"))
        attempt("ini name", inventory("c.ini", f"[g]\n{s} ansible_port=22\n"))
        for key in ("ansible_host", "ansible_user"):
            attempt(f"yaml {key}", inventory("a.yml", yaml.safe_dump({"all": {"hosts": {"d": {key: s}}}}, allow_unicode=True)))
        attempt("yaml name", inventory("b.yml", yaml.safe_dump({"all": {"hosts": {s: None}}}, allow_unicode=True)))
        if "\n" not in s and "\r" not in s:  # a config line cannot hold a line break (that would be our own injection)
            attempt("ssh_config HostName", ssh_config(f"Host fz\n    HostName {s}\n", "fz"))
            attempt("ssh_config User", ssh_config(f"Host fz\n    User {s}\n", "fz"))
            attempt("ssh_config ProxyJump", ssh_config(f"Host fz\n    ProxyJump {s}\n", "fz"))
            attempt("ssh_config Host alias", ssh_config(f"Host {s}\n    Port 22\n", s))

    # every accepted inventory address meets the same shell ProxyCommand the way a connection would
    for address in sorted(accepted_addresses):
        try:
            accepted_targets.append(resolve_target(address, paramiko.SSHConfig.from_text(proxy)))
        except EdgekitError:
            counts["refused"] += 1
    for command in sorted({t.proxy_command for t in accepted_targets if t.proxy_command}):
        subprocess.run(shlex.split(command), cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        counts["shell runs"] += 1
    assert not list(tmp_path.rglob("PWNED*")), "a generated name ran a command through the ProxyCommand shell"
    assert counts["shell runs"] > 200 and out.exists()
    assert counts["refused"] > 1000 and counts["accepted"] > 1000  # both sides of the rule were exercised
    elapsed = time.monotonic() - started
    print(f"ssh name fuzz: {len(strings)} strings, {counts['cases']} cases, {counts['refused']} refused, "
          f"{counts['accepted']} accepted, {counts['shell runs']} ProxyCommand shells run, {elapsed:.1f}s")  # fmt: skip
    assert elapsed < 20
