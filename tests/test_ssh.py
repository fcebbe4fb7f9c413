"""SshTransport against a real OpenSSH sshd on loopback (and in network namespaces when root).

Same contract as LocalTransport (tests/test_transport_local.py): argv-only commands, typed
failures, timeouts that kill the remote process group, atomic verified copies. Plus what only
SSH has: ~/.ssh/config, known_hosts, authentication, jump hosts, dead links.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgekit.errors import DeviceError, LinkError, TransportError, UsageError
from edgekit.fsutil import sha256_file
from edgekit.transport import Transport, open_transport
from edgekit.transport.ssh import SshTransport
from edgekit.transport.sshconfig import known_entries, parse_device, resolve_target
from tests.conftest import (
    EXAMPLES,
    NASTY,
    assert_conversation_contract,
    assert_nasty_names_round_trip,
    assert_one_line_error,
    assert_put_replaces_atomically_and_fails_cleanly,
    assert_timeout_kills_the_process_group,
    wait_until,
)
from tests.lab import sshd as sshd_mod
from tests.lab.proxy import TcpProxy

ECHO = "import json, os, sys; print(json.dumps([sys.argv[1:], os.getcwd(), os.environ.get('EK_VALUE')]))"
DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"


def _no_pwned(*roots: Path) -> None:
    for root in roots:
        assert not list(Path(root).rglob("pwned")), f"a shell ran something under {root}"


# -- device strings and ~/.ssh/config (no network) ---------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("pi@10.0.0.7", ("pi", "10.0.0.7", None)),
        ("10.0.0.7:2222", (None, "10.0.0.7", 2222)),
        ("ssh://ci@board.lan:2200", ("ci", "board.lan", 2200)),
        ("orin1", (None, "orin1", None)),
        ("root@[fe80::1]:22", ("root", "fe80::1", 22)),
        ("::1", (None, "::1", None)),
    ],
)
def test_parse_device(text, expected):
    assert parse_device(text) == expected


@pytest.mark.parametrize("bad", ["", "a@@b", "host:99999", "user@ho st", "x@"])
def test_parse_device_rejects(bad):
    with pytest.raises(UsageError):
        parse_device(bad)


def test_ssh_config_is_honoured(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("not read here")
    (tmp_path / ".ssh" / "config").write_text(
        "Host orin1\n  HostName 10.0.0.9\n  User nvidia\n  Port 2201\n  IdentityFile ~/.ssh/orin_key\n"
        "  IdentitiesOnly yes\n  ProxyJump bastion,inner:2022\n  ConnectTimeout 7\n"
        "Host bastion\n  HostName 192.0.2.1\n  User jumper\n  ProxyJump elsewhere\n"
        "Host *\n  UserKnownHostsFile ~/kh1 ~/kh2\n  StrictHostKeyChecking accept-new\n"
    )
    t = resolve_target("orin1")
    assert (t.hostname, t.user, t.port) == ("10.0.0.9", "nvidia", 2201)
    assert t.identity_files == (str(tmp_path / ".ssh" / "orin_key"),)  # IdentitiesOnly: no defaults
    assert t.proxy_jump == ("bastion", "inner:2022") and t.connect_timeout == 7
    assert t.user_known_hosts == (str(tmp_path / "kh1"), str(tmp_path / "kh2"))
    assert t.strict_host_key_checking == "accept-new"
    assert t.known_hosts_name == "[10.0.0.9]:2201"
    override = resolve_target("admin@orin1:22")  # the command line wins over the config
    assert (override.user, override.port, override.known_hosts_name) == ("admin", 22, "10.0.0.9")
    hop = resolve_target("bastion", _hop=True)
    assert (hop.hostname, hop.user, hop.proxy_jump) == ("192.0.2.1", "jumper", ())
    plain = resolve_target("plain.example")
    assert plain.identity_files == (str(tmp_path / ".ssh" / "id_ed25519"),)  # existing default keys only
    # nothing is contacted: building a transport is free (reading .root would connect)
    dev = open_transport("orin1")
    assert isinstance(dev, SshTransport) and dev.python == "python3"
    assert dev.name == "ssh:nvidia@10.0.0.9:2201" and dev.connects == 0


# -- commands ----------------------------------------------------------------------------------


@pytest.mark.ssh
def test_lazy_connect_and_root_under_the_devices_home(ssh_device, sshd_server):
    assert ssh_device.connects == 0
    assert ssh_device.name == f"ssh:{sshd_server.user}@127.0.0.1:{sshd_server.port}"
    assert ssh_device.root == str(sshd_server.home / ".edgekit")  # "~" expanded on the device
    assert ssh_device.connects == 1
    assert isinstance(ssh_device, Transport)
    ssh_device.run(["true"])
    assert (sshd_server.home / ".edgekit").is_dir() and ssh_device.connects == 1


@pytest.mark.ssh
def test_run_passes_argv_cwd_env_verbatim(ssh_device, sshd_server, tmp_path):
    weird = sshd_server.home / "dir with $(touch pwned); 'quotes' `x`"
    weird.mkdir()
    result = ssh_device.run([sys.executable, "-c", ECHO, *NASTY], cwd=str(weird), env={"EK_VALUE": "$(touch pwned) 'q' ;"})
    args, cwd, value = json.loads(result.stdout)
    assert args == NASTY and cwd == str(weird) and value == "$(touch pwned) 'q' ;"
    assert result.returncode == 0 and result.argv[0] == sys.executable and result.stderr == b""
    default = ssh_device.run([sys.executable, "-c", "import os; print(os.getcwd())"])
    assert default.stdout.decode().strip() == ssh_device.root
    # the program name itself is never a shell word either
    with pytest.raises(TransportError, match="command not found on the device"):
        ssh_device.run(["touch pwned"])
    with pytest.raises(UsageError):
        ssh_device.run(["true"], env={"A;touch pwned": "x"})
    with pytest.raises(TypeError):
        ssh_device.run("echo hi")
    _no_pwned(sshd_server.base, tmp_path, Path.cwd())


@pytest.mark.ssh
def test_run_exit_codes_signals_and_stderr(ssh_device):
    code = "import sys; sys.stderr.write('first\\nthe real reason\\n'); sys.exit(3)"
    with pytest.raises(TransportError) as err:
        ssh_device.run([sys.executable, "-c", code])
    assert "exit code 3" in err.value.message and "the real reason" in err.value.message
    assert not isinstance(err.value, LinkError)
    result = ssh_device.run([sys.executable, "-c", code], check=False)
    assert result.returncode == 3 and result.stderr_tail(1) == "the real reason"
    # a death by signal comes back as -SIGNUM (the agent's SIGILL/SIGSEGV messages rely on it)
    assert ssh_device.run(["sh", "-c", "kill -SEGV $$"], check=False).returncode == -11
    assert ssh_device.run([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], check=False).returncode == -9
    big = ssh_device.run([sys.executable, "-c", "import sys; sys.stdout.write('x' * 3000000); sys.stderr.write('y' * 200000)"])
    assert len(big.stdout) == 3000000 and len(big.stderr) == 200000


@pytest.mark.ssh
def test_missing_programs_and_directories(ssh_home):
    ssh_home.trust()
    dev = SshTransport("lab", python="/nonexistent/python3")
    try:
        with pytest.raises(TransportError) as err:
            dev.run([dev.python, "-c", "pass"])
        assert err.value.message == "Python was not found on the device 127.0.0.1: /nonexistent/python3"
        assert "python =" in err.value.hint
        with pytest.raises(TransportError, match="command not found on the device: no-such-program-ek"):
            dev.run(["no-such-program-ek", "--x"], check=False)
        with pytest.raises(TransportError, match="working directory does not exist on the device"):
            dev.run(["true"], cwd="/nonexistent/dir")
        script = ssh_home.server.home / "noexec.sh"
        script.write_text("#!/bin/sh\necho hi\n")
        with pytest.raises(TransportError, match="permission denied"):
            dev.run([str(script)])
    finally:
        dev.close()


@pytest.mark.ssh
def test_timeout_kills_the_remote_process_group(ssh_device, tmp_path):
    assert_timeout_kills_the_process_group(ssh_device, tmp_path)


@pytest.mark.ssh
def test_conversation_contract(ssh_device, tmp_path):
    assert_conversation_contract(ssh_device, tmp_path)
    assert ssh_device.run(["true"]).returncode == 0  # the connection is still usable


# -- files -------------------------------------------------------------------------------------


@pytest.mark.ssh
def test_put_get_sha256_mkdir_with_nasty_names(ssh_device, sshd_server, tmp_path):
    remote_dir = sshd_server.home / ".edgekit" / "sub dir" / "$(touch pwned)"
    assert_nasty_names_round_trip(ssh_device, remote_dir, tmp_path / "local")
    _no_pwned(sshd_server.base, tmp_path)


@pytest.mark.ssh
def test_put_replaces_atomically_and_fails_cleanly(ssh_device, sshd_server, tmp_path):
    assert_put_replaces_atomically_and_fails_cleanly(ssh_device, sshd_server.home / ".edgekit", tmp_path)


@pytest.mark.ssh
def test_sha256_without_sha256sum_uses_the_devices_python(ssh_home, tmp_path):
    """A device without coreutils' sha256sum (busybox builds may lack it) hashes with Python."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "cat", "printf", "df", "awk", "mkdir"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    server = sshd_mod.Sshd(tmp_path / "srv", device_path=str(bin_dir))
    server.start()
    try:
        ssh_home.add_host("bare", server)
        ssh_home.trust(server)
        dev = SshTransport("bare", python=sys.executable)
        f = tmp_path / "f.bin"
        f.write_bytes(os.urandom(100000))
        dev.mkdir("x")
        dev.put(f, "x/f.bin")
        assert dev.sha256("x/f.bin") == sha256_file(f)
        assert dev.sha256("x/none") is None
        dev.close()
    finally:
        server.stop()


# -- host keys ---------------------------------------------------------------------------------


@pytest.mark.ssh
def test_unknown_host_refused_then_trusted_on_first_use(ssh_home, sshd_server):
    dev = SshTransport("lab")
    with pytest.raises(TransportError) as err:
        dev.run(["true"])
    assert not isinstance(err.value, LinkError)
    assert f"[127.0.0.1]:{sshd_server.port} is not a known host" in err.value.message
    assert "SHA256:" in err.value.message and "--trust-new-host" in err.value.hint
    assert not ssh_home.known_hosts.exists()
    notes: list[str] = []
    trusting = SshTransport("lab", trust_new_host=True, log=notes.append)
    assert trusting.run(["true"]).returncode == 0
    trusting.close()
    saved = ssh_home.known_hosts.read_text()
    # one line, the host's name hashed when HashKnownHosts says so (Debian's /etc/ssh/ssh_config does)
    want_hashed = trusting.target.hash_known_hosts
    assert saved.count("\n") == 1 and saved.startswith("|1|") == want_hashed
    assert saved == sshd_server.known_hosts_line() or want_hashed
    assert [(k.lineno, k.key_b64) for k in known_entries(sshd_server.known_hosts_name, [str(ssh_home.known_hosts)])] == [(1, sshd_server.host_key_line.split()[1])]
    assert oct(ssh_home.known_hosts.stat().st_mode & 0o777) == "0o600"
    assert len(notes) == 1 and "trusted new host" in notes[0]
    again = SshTransport("lab")  # known now: no flag needed, nothing appended
    assert again.run(["true"]).returncode == 0
    again.close()
    assert ssh_home.known_hosts.read_text() == saved


@pytest.mark.ssh
def test_changed_host_key_is_always_refused(ssh_home, sshd_server, tmp_path):
    other = sshd_mod.keygen(tmp_path / "other_host_key")
    keytype, b64 = other.split()[:2]
    ssh_home.known_hosts.write_text(f"# a comment\nsomewhere.else {keytype} {b64}\n{sshd_server.known_hosts_name} {keytype} {b64}\n")
    for trust in (False, True):
        dev = SshTransport("lab", trust_new_host=trust)
        with pytest.raises(TransportError) as err:
            dev.run(["true"])
        assert "has CHANGED" in err.value.message
        assert f"{ssh_home.known_hosts} line 3" in err.value.message
        assert "ssh-keygen" in err.value.hint and sshd_server.known_hosts_name in err.value.hint
    assert ssh_home.known_hosts.read_text().count("\n") == 3  # nothing was added


@pytest.mark.ssh
def test_hashed_known_hosts_entry_is_recognised(ssh_home, sshd_server):
    from paramiko.hostkeys import HostKeys

    hashed = HostKeys.hash_host(sshd_server.known_hosts_name)
    ssh_home.known_hosts.write_text(f"{hashed} {sshd_server.host_key_line}\n")
    dev = SshTransport("lab")
    assert dev.run(["true"]).returncode == 0
    dev.close()


# -- authentication and reachability ----------------------------------------------------------


@pytest.mark.ssh
def test_auth_failure_is_one_clear_error(ssh_home, sshd_server, tmp_path, cli):
    stranger = tmp_path / "stranger_key"
    sshd_mod.keygen(stranger)
    ssh_home.config.write_text(sshd_server.ssh_config("lab").replace(str(sshd_server.client_key), str(stranger)))
    ssh_home.trust()
    dev = SshTransport("lab")
    with pytest.raises(TransportError) as err:
        dev.run(["true"])
    assert not isinstance(err.value, LinkError)
    assert err.value.message.startswith(f"authentication failed for {sshd_server.user}@127.0.0.1:{sshd_server.port}")
    assert str(stranger) in err.value.message
    assert "ssh-copy-id" in err.value.hint and "--password" in err.value.hint
    result = cli("deploy", DIGITS, "--target", "linux-cpu", "--device", "lab", env=ssh_home.env())
    assert_one_line_error(result, 4, "authentication failed")
    # --password is an explicit opt-in, and never prompts without a terminal
    result = cli("deploy", DIGITS, "--target", "linux-cpu", "--device", "lab", "--password", env=ssh_home.env())
    assert_one_line_error(result, 2, "--password needs the password")


@pytest.mark.ssh
def test_refused_dns_and_not_ssh(ssh_home, tmp_path):
    port = sshd_mod.free_port()
    with pytest.raises(LinkError) as err:
        SshTransport(f"127.0.0.1:{port}", connect_timeout=5).run(["true"])
    assert err.value.message == f"connection refused by 127.0.0.1:{port}" and "sshd" in err.value.hint
    # something that accepts TCP but never speaks SSH (the kernel completes the handshake)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        with pytest.raises(TransportError) as err:
            SshTransport(f"127.0.0.1:{port}", connect_timeout=2).run(["true"])
    assert err.value.message.startswith(f"127.0.0.1:{port} did not answer as an SSH server")


@pytest.mark.netns
def test_dns_failure_is_one_clear_error(netns, tmp_path):
    """Resolved inside a namespace with no route anywhere, so no query leaves this machine."""
    ns = netns(routed=False)
    code = (
        "from edgekit.transport.ssh import SshTransport\n"
        "try:\n    SshTransport('no-such-host.invalid', connect_timeout=3).run(['true'])\n"
        "except Exception as e:\n    print(type(e).__name__, e.message, '|', e.hint)\n"
    )
    proc = subprocess.run([*ns.prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.stdout.startswith("TransportError cannot resolve host name 'no-such-host.invalid'"), proc.stdout + proc.stderr
    assert "HostName" in proc.stdout


@pytest.mark.ssh
@pytest.mark.netns
def test_unreachable_host_is_one_clear_error(ssh_home, netns):
    ns = netns()
    ns.cable_out()  # the device's end of the link is down: nobody answers ARP
    start = time.monotonic()
    with pytest.raises(LinkError) as err:
        SshTransport(f"{ns.addr}:22", connect_timeout=10).run(["true"])
    assert time.monotonic() - start < 20
    assert err.value.message in (f"cannot reach {ns.addr}:22: No route to host", f"timed out connecting to {ns.addr}:22 after 10s")


@pytest.mark.ssh
@pytest.mark.netns
def test_silent_host_times_out(ssh_home, netns):
    ns = netns()
    ns.drop_all()  # a host that is there but answers nothing (a pulled cable, a firewall)
    start = time.monotonic()
    with pytest.raises(LinkError) as err:
        SshTransport(f"{ns.addr}:22", connect_timeout=2).run(["true"])
    assert time.monotonic() - start < 15
    assert err.value.message == f"timed out connecting to {ns.addr}:22 after 2s"


@pytest.mark.ssh
def test_dropped_connection_is_a_link_error_and_the_next_call_reconnects(ssh_device, sshd_server):
    ssh_device.run(["true"])
    code = "import sys, time; print('started', flush=True); time.sleep(30)"
    import threading

    killer = threading.Thread(target=lambda: wait_until(lambda: len(sshd_server.connection_pids()) > 2) and sshd_server.kill_connections())
    killer.start()
    start = time.monotonic()
    with pytest.raises(LinkError) as err:
        ssh_device.run([sys.executable, "-c", code], timeout=60)
    killer.join()
    assert time.monotonic() - start < 25
    assert "lost the connection" in err.value.message
    assert ssh_device.run(["true"]).returncode == 0
    assert ssh_device.connects == 2


@pytest.mark.ssh
def test_stalled_transfer_times_out(ssh_home, sshd_server, tmp_path):
    """A link that goes silent mid-upload (no error, no close) fails after idle_timeout."""
    ssh_home.trust()
    with TcpProxy("127.0.0.1", sshd_server.port) as proxy:
        ssh_home.add_host("slow", sshd_server)
        cfg = ssh_home.config.read_text().replace(f"Host slow\n    HostName 127.0.0.1\n    Port {sshd_server.port}", f"Host slow\n    HostName 127.0.0.1\n    Port {proxy.port}\n    HostKeyAlias {sshd_server.known_hosts_name}")
        ssh_home.config.write_text(cfg)
        dev = SshTransport("slow", idle_timeout=2)
        dev.mkdir("x")
        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(24 << 20))
        proxy.freeze_after(proxy.bytes_up + (1 << 20))
        proxy.cut.clear()
        start = time.monotonic()
        # the frozen connection is the current one only for connections made after arming;
        # reconnect so the fault applies to this transfer
        dev.close()
        dev = SshTransport("slow", idle_timeout=2)
        with pytest.raises(LinkError) as err:
            dev.put(big, f"{dev.root}/x/big.bin")
        elapsed = time.monotonic() - start
        assert proxy.frozen.is_set()
        assert elapsed < 30, elapsed
        assert "no progress for 2s" in err.value.message
        assert not (sshd_server.home / ".edgekit" / "x" / "big.bin").exists()
        dev.close()


@pytest.mark.ssh
def test_proxyjump_over_loopback(ssh_home, sshd_server, tmp_path):
    jump = sshd_mod.Sshd(tmp_path / "jump", client_key=sshd_server.client_key, log_level="DEBUG1")
    jump.start()
    try:
        ssh_home.add_host("jump", jump)
        ssh_home.add_host("behind", sshd_server, ProxyJump="jump")
        ssh_home.trust(jump)
        ssh_home.trust(sshd_server)
        dev = SshTransport("behind")
        assert dev.run(["true"]).returncode == 0
        f = tmp_path / "f.bin"
        f.write_bytes(os.urandom(1 << 20))
        dev.mkdir("j")
        dev.put(f, "j/f.bin")
        assert (sshd_server.home / ".edgekit" / "j" / "f.bin").read_bytes() == f.read_bytes()
        dev.close()
        # the jump host opened the connection to the device for us
        assert sshd_mod.log_has(jump, rf"direct.tcpip.*target 127\.0\.0\.1 port {sshd_server.port}")
    finally:
        jump.stop()


RELAY = """import os, socket, sys, threading
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while True:
        d = os.read(0, 65536)
        if not d:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(d)
threading.Thread(target=up, daemon=True).start()
while True:
    d = s.recv(65536)
    if not d:
        break
    os.write(1, d)
"""


@pytest.mark.ssh
def test_proxycommand(ssh_home, sshd_server, tmp_path):
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    ssh_home.add_host("relayed", sshd_server, ProxyCommand=f"{sys.executable} {relay} %h %p")
    ssh_home.trust()
    dev = SshTransport("relayed")
    assert dev.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[2] == b"127.0.0.1"
    dev.close()


@pytest.mark.ssh
@pytest.mark.netns
def test_proxyjump_reaches_a_host_only_the_jump_host_can_see(ssh_home, netns, tmp_path):
    jump_ns = netns()
    hidden_ns = netns(routed=False)
    _, hidden_addr = jump_ns.link(hidden_ns)
    key = tmp_path / "id"
    sshd_mod.keygen(key)
    jump = sshd_mod.Sshd(tmp_path / "jump", host=jump_ns.addr, port=22, prefix=jump_ns.prefix, client_key=key)
    hidden = sshd_mod.Sshd(tmp_path / "hidden", host=hidden_addr, port=22, prefix=hidden_ns.prefix, client_key=key)
    jump.start()
    hidden.start()
    try:
        ssh_home.config.write_text(jump.ssh_config("jump") + hidden.ssh_config("hidden", ProxyJump="jump"))
        dev = SshTransport("hidden", trust_new_host=True)
        out = dev.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.decode().split()
        # client address = the jump host's end of the private link: it came in through the jump
        assert out[2] == hidden_addr and out[0] == jump_ns.link_addrs[hidden_ns.name]
        dev.close()
        saved = [str(ssh_home.known_hosts)]  # both hops were checked and saved (hashed or not)
        assert known_entries(jump_ns.addr, saved) and known_entries(hidden_addr, saved)
    finally:
        hidden.stop()
        jump.stop()


# -- full disk -----------------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmpfs):
    return tmpfs("1m")


@pytest.mark.ssh
def test_full_disk_is_one_clear_device_error(ssh_device, tiny_disk, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 << 20))
    with pytest.raises(DeviceError) as err:
        ssh_device.put(big, str(tiny_disk / "big.bin"))
    assert "disk is full" in err.value.message and str(tiny_disk) in err.value.message
    assert not isinstance(err.value, LinkError)
    assert os.listdir(tiny_disk) == []  # the partial temp file is gone


# -- the whole loop ------------------------------------------------------------------------------


def _shape(doc):
    """The structure of a JSON document: keys and value types, not values."""
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_shape(doc[0])] if doc else []
    return "number" if isinstance(doc, (int, float)) and not isinstance(doc, bool) else type(doc).__name__


def _shape_diff(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k} only in {'ssh' if k in b else 'local'}")
            else:
                out += _shape_diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        return _shape_diff(a[0], b[0], path + "[]") if a and b else []
    return [] if a == b or "NoneType" in (a, b) else [f"{path}: {a} vs {b}"]


@pytest.mark.slow
@pytest.mark.ssh
def test_deploy_over_ssh_alias_matches_local(ssh_home, sshd_server, cli, tmp_path):
    """`edgekit deploy ... --device lab`, the host described only in ~/.ssh/config, first
    refused as unknown, then trusted with --trust-new-host; same result shape as local."""
    env = ssh_home.env()
    args = ["deploy", DIGITS, "--target", "linux-cpu", "--json", "-n", "20"]
    refused = cli(*args, "--device", "lab", env=env)
    assert_one_line_error(refused, 4, "is not a known host")
    first = cli(*args, "--device", "lab", "--trust-new-host", env=env)
    assert first.returncode == 0, first.stderr
    assert "trusted new host" in first.stderr
    remote = json.loads(first.stdout)
    local = json.loads(cli(*args, "--device", "local", "-o", tmp_path / "local-bundle", env=env).stdout)
    assert _shape_diff(_shape(local), _shape(remote)) == []
    assert remote["device"] == "lab" and local["device"] == "local"
    assert [f["path"] for f in remote["bundle"]["files"]] == [f["path"] for f in local["bundle"]["files"]]
    assert [r["variant"] for r in remote["runs"]] == [r["variant"] for r in local["runs"]] == ["fp32", "int8"]
    assert remote["push"]["bytes_sent"] > 0 and remote["push"]["current"] == remote["bundle"]["hash"]
    device_bundle = sshd_server.home / ".edgekit" / "bundles" / remote["bundle"]["hash"]
    assert os.readlink(sshd_server.home / ".edgekit" / "current") == f"bundles/{remote['bundle']['hash']}"
    for f in remote["bundle"]["files"]:
        assert sha256_file(device_bundle / f["path"]) == f["sha256"]

    # the second deploy of the unchanged bundle sends nothing, and its push is quick
    second = cli(*args, "--device", "lab", env=env)
    assert second.returncode == 0, second.stderr
    push = json.loads(second.stdout)["push"]
    assert push["bytes_sent"] == 0 and push["files_sent"] == 0
    assert push["files_skipped"] == len(remote["bundle"]["files"]) + 1  # + manifest.json
    assert push["duration_s"] < 1.0, push


@pytest.mark.slow
@pytest.mark.ssh
def test_bench_cli_over_ssh(ssh_home, sshd_server, cli, tmp_path):
    env = ssh_home.env()
    built = cli("deploy", DIGITS, "--target", "linux-cpu", "--backend", "onnxruntime", "--no-quantize", "--no-bench", "-o", tmp_path / "b", env=env)
    assert built.returncode == 0, built.stderr
    refused = cli("bench", tmp_path / "b", "--device", "lab", "--iterations", "5", env=env)
    assert_one_line_error(refused, 4, "is not a known host")
    result = cli("bench", tmp_path / "b", "--device", "lab", "--trust-new-host", "--iterations", "5", "--json", env=env)
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert [r["agent"]["variant"] for r in records] == ["fp32"]
    # the device as the user named it (an ssh_config alias here), as deploy records it too
    assert records[0]["device"] == "lab"
    assert len(records[0]["agent"]["samples_ns"]) == 5


@pytest.mark.ssh
def test_missing_python_on_the_device_is_one_clear_error(ssh_home, cli, tmp_path):
    text = (Path(__file__).parents[1] / "edgekit" / "profiles" / "linux-cpu.toml").read_text()
    profile = tmp_path / "no-python.toml"
    profile.write_text(text.replace('name = "linux-cpu"', 'name = "no-python"', 1) + '\n[device]\npython = "/nonexistent/python3"\n')
    ssh_home.trust()
    result = cli("deploy", DIGITS, "--target", profile, "--device", "lab", env=ssh_home.env())
    assert_one_line_error(result, 4, "Python was not found on the device")


def test_paramiko_loads_invoke_only_for_a_match_exec_line(tmp_path):
    # paramiko imports invoke (50-90 ms of every SSH command) for `Match exec` alone: edgekit
    # imports paramiko without it and hands it over when a config uses one. A fresh interpreter,
    # so what is imported is this test's own.
    (tmp_path / "plain").write_text("Host box\n  HostName 10.9.9.8\n")
    (tmp_path / "exec").write_text('Match exec "true"\n  HostName 10.9.9.9\n  Port 2222\n')
    code = (
        "import sys; from pathlib import Path; from edgekit.transport.sshconfig import load_config, resolve_target\n"
        "t = resolve_target('box', load_config(Path(sys.argv[1])))\n"
        "print(t.hostname, t.port, sys.modules.get('invoke') is not None)\n"
    )
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path / name)], capture_output=True, text=True, timeout=60) for name in ("plain", "exec")]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert runs[0].stdout.split() == ["10.9.9.8", "22", "False"]
    assert runs[1].stdout.split() == ["10.9.9.9", "2222", "True"]
