"""known_hosts read as strictly as OpenSSH, checked against OpenSSH's own verdicts.

* Matching (which lines cover a host): many generated patterns (``*``, ``?``, ``!negation``,
  comma lists, ``[host]:port``, upper case, hashed by ``ssh-keygen -H``) against
  ``ssh-keygen -F HOST -f FILE``.
* Verdicts (ok / changed / revoked / unknown): a matrix of known_hosts files, each tried with
  the real ``ssh`` client and with edgekit's transport against the lab's real sshd; both must
  agree with the expected verdict, and "changed" and "revoked" stay refused with
  --trust-new-host.
"""

from __future__ import annotations

import getpass
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.errors import TransportError
from edgekit.transport.ssh import SshTransport
from edgekit.transport.sshconfig import known_entries, match_hostname
from tests.conftest import assert_one_line_error
from tests.lab import sshd as sshd_mod

needs_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")


def _keygen_found(name: str, path: Path) -> set[tuple[int, str]]:
    """(line, marker) of every line ``ssh-keygen -F`` finds for ``name``; CA lines left out."""
    out = subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)], capture_output=True, text=True, timeout=30).stdout
    found = {(int(m[1]), m[2].strip()) for m in re.finditer(r"^# Host .* found: line (\d+)(.*)$", out, re.M)}
    return {(n, "revoked" if marker == "REVOKED" else "") for n, marker in found if marker != "CA"}


def _edgekit_found(name: str, path: Path) -> set[tuple[int, str]]:
    return {(k.lineno, k.marker) for k in known_entries(name, [str(path)])}


def test_match_hostname_semantics():
    assert match_hostname("pi.lab", "*.lab") == 1
    assert match_hostname("PI.LAB", "*.lab") == 1 and match_hostname("pi.lab", "*.LAB") == 1
    assert match_hostname("pi.lab", "p?.lab") == 1 and match_hostname("pi.lab", "?.lab") == 0
    assert match_hostname("pi.lab", "*,!pi.lab") == -1  # a matching negation vetoes the line
    assert match_hostname("pi.lab", "!other,*.lab") == 1
    assert match_hostname("[pi.lab]:2222", "[pi.lab]:*") == 1 and match_hostname("pi.lab", "[pi.lab]:*") == 0
    assert match_hostname("pi.lab", "x" * 2000 + ",pi.lab") == 0  # OpenSSH gives up on an over-long subpattern


@needs_keygen
def test_matching_agrees_with_ssh_keygen(tmp_path):
    """Generated known_hosts lines (plain and hashed) x host names: the same lines match."""
    rng = random.Random(1313)
    names = ["pi.lab", "PI.lab", "pi2.lab", "[pi.lab]:2222", "[pi.lab]:22", "10.0.0.7", "[10.0.0.7]:2200", "db-a.example.org", "x"]
    atoms = ["pi.lab", "pi2.lab", "*", "*.lab", "p?.lab", "PI.*", "[pi.lab]:2222", "[pi.lab]:*", "[*]:2222", "10.0.0.?", "10.*",
             "[10.0.0.7]:2200", "db-?.example.*", "?", "x", "*x*", "other", "", "**", "[pi.lab]:22"]  # fmt: skip
    key = sshd_mod.keygen(tmp_path / "k", "k").split()[:2]
    lines = []
    for _ in range(400):
        pats = [("!" if rng.random() < 0.25 else "") + rng.choice(atoms) for _ in range(rng.randint(1, 4))]
        if not ",".join(pats):
            continue  # no host field at all: not a known_hosts line
        marker = rng.choice(["", "", "", "@revoked ", "@cert-authority "])
        lines.append(f"{marker}{','.join(pats)} {key[0]} {key[1]}")
    plain = tmp_path / "known_hosts"
    plain.write_text("\n".join(lines) + "\n")
    hashed = tmp_path / "known_hosts.hashed"
    shutil.copy(plain, hashed)
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], capture_output=True, check=True, timeout=60)
    assert "|1|" in hashed.read_text()
    checked = 0
    for path in (plain, hashed):
        for name in names:
            want = _keygen_found(name.lower(), path)
            assert _edgekit_found(name, path) == want, (name, path.name)
            checked += len(want)
    assert checked > 200  # the matrix really matched lines, not only agreed on "none"
    print(f"known_hosts matching: {len(lines)} lines x {len(names)} names x plain/hashed agree with ssh-keygen -F ({checked} matches)")


# -- verdicts against the real ssh client and the lab sshd -------------------------------------

# Each case: known_hosts lines with {N} = the host's known_hosts name ("[127.0.0.1]:PORT"),
# {K} = the server's real key, {X} = another key; and OpenSSH's verdict.
MATRIX = [
    ("exact, same key", ["{N} {K}"], "ok"),
    ("exact, other key", ["{N} {X}"], "changed"),
    ("wildcard *, other key", ["* {X}"], "changed"),
    ("[host]:*, other key", ["[127.0.0.1]:* {X}"], "changed"),
    ("? pattern, other key", ["[127.0.0.?]:{P} {X}"], "changed"),
    ("comma list, other key", ["elsewhere.lab,{N} {X}"], "changed"),
    ("comma list, same key", ["elsewhere.lab,{N} {K}"], "ok"),
    ("negation vetoes the line", ["*,!{N} {X}"], "unknown"),
    ("negation vetoes even the right key", ["!{N},!{H},* {K}"], "unknown"),
    ("vetoed for [host]:port, bare host still vouches", ["!{N},* {K}"], "ok"),
    ("negating another host does not", ["!elsewhere.lab,* {X}"], "changed"),
    ("bare host entry, other key: no verdict on another port", ["{H} {X}"], "unknown"),
    ("bare host entry vouches on another port", ["{H} {K}"], "ok"),
    ("hashed bare host entry vouches on another port", ["H:{H} {K}"], "ok"),
    ("port entry decides before the bare host", ["{N} {X}", "{H} {K}"], "changed"),
    ("@revoked for the bare host", ["@revoked {H} {K}"], "revoked"),
    ("hashed, other key", ["H:{N} {X}"], "changed"),
    ("hashed, same key", ["H:{N} {K}"], "ok"),
    ("one matching line with the key is enough", ["* {X}", "{N} {K}"], "ok"),
    ("@revoked * wins over a good entry", ["{N} {K}", "@revoked * {K}"], "revoked"),
    ("@revoked for the host alone", ["@revoked {N} {K}"], "revoked"),
    ("@revoked with a hashed good entry", ["H:{N} {K}", "@revoked {N} {K}"], "revoked"),
    ("@revoked of another host does not apply", ["@revoked elsewhere.lab {K}", "{N} {K}"], "ok"),
    ("@revoked of another key does not apply", ["@revoked * {X}", "{N} {K}"], "ok"),
    ("@cert-authority lines are not host keys", ["@cert-authority * {X}"], "unknown"),
    ("@cert-authority with the host's own key", ["@cert-authority {N} {K}"], "unknown"),
    ("unknown marker ignored", ["@bogus {N} {X}"], "unknown"),
    ("undecodable key ignored", ["{N} ssh-ed25519 AAAA!!notbase64"], "unknown"),
    ("a key of another type is a change", ["{N} {E}"], "changed"),
]


def _hashed(line: str, tmp: Path) -> str:
    """``line`` with its host name hashed by ``ssh-keygen -H`` (as HashKnownHosts writes it)."""
    path = tmp / "to-hash"
    path.write_text(line + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(path)], capture_output=True, check=True, timeout=30)
    text = path.read_text()
    assert text.startswith("|1|") and line.split()[0] not in text
    return text


# Issue 26: more cases, with what the earlier matrix lacked. Lines may also say where they go:
# "G:" the GlobalKnownHostsFile, "B:" a second UserKnownHostsFile, "R:" a RevokedHostKeys list,
# "KRL:" a RevokedHostKeys KRL (made by ssh-keygen -k); "H:" hashed by ssh-keygen -H. {A} is the
# HostKeyAlias "lab-alias". A case's options go into its Host block ("tokens": the known_hosts
# file is named with % tokens).
MORE = [
    ("% tokens in UserKnownHostsFile, @revoked *", ["@revoked * {K}"], "revoked", {"tokens": True}),
    ("% tokens in UserKnownHostsFile, other key", ["{N} {X}"], "changed", {"tokens": True}),
    ("% tokens in UserKnownHostsFile, same key", ["{N} {K}"], "ok", {"tokens": True}),
    ("% tokens in UserKnownHostsFile, unknown", [], "unknown", {"tokens": True}),
    ("HostKeyAlias, same key", ["{A} {K}"], "ok", {"HostKeyAlias": "lab-alias"}),
    ("HostKeyAlias, other key", ["{A} {X}"], "changed", {"HostKeyAlias": "lab-alias"}),
    ("HostKeyAlias, only the real name is filed", ["{N} {K}"], "unknown", {"HostKeyAlias": "lab-alias"}),
    ("%k token with HostKeyAlias", ["{A} {K}"], "ok", {"HostKeyAlias": "lab-alias", "tokens": True}),
    ("RevokedHostKeys list holds the key", ["{N} {K}", "R:{K}"], "revoked", {}),
    ("RevokedHostKeys list of another key", ["{N} {K}", "R:{X}"], "ok", {}),
    ("RevokedHostKeys KRL holds the key", ["{N} {K}", "KRL:{K}"], "revoked", {}),
    ("RevokedHostKeys KRL of another key", ["{N} {K}", "KRL:{X}"], "ok", {}),
    ("RevokedHostKeys with a % token", ["{N} {K}", "R:{K}"], "revoked", {"revoked_tokens": True}),
    ("RevokedHostKeys file missing", ["{N} {K}"], "revoked", {"RevokedHostKeys": "{dir}/no-such-krl"}),
    ("RevokedHostKeys revokes an unknown host's key", ["R:{K}"], "revoked", {}),
    ("second user file holds the key", ["B:{N} {K}"], "ok", {}),
    ("first user file other key, second the right one", ["{N} {X}", "B:{N} {K}"], "ok", {}),
    ("second user file has another key", ["B:{N} {X}"], "changed", {}),
    ("global file holds the key", ["G:{N} {K}"], "ok", {}),
    ("global file has another key", ["G:{N} {X}"], "changed", {}),
    ("@revoked in the global file", ["{N} {K}", "G:@revoked * {K}"], "revoked", {}),
    ("hashed other key, plain right key", ["H:{N} {X}", "{N} {K}"], "ok", {}),
    ("comments and blank lines around the key", ["# a comment", "", "{N} {K}", "   "], "ok", {}),
    ("empty known_hosts", [""], "unknown", {}),
    ("user file is a directory", [], "unknown", {"kh_dir": True}),
]
# accept-new verdicts that are not "unknown -> ok, the rest as with yes"
ACCEPT_NEW = {
    "@revoked for the bare host": "ok",  # ssh warns that [host]:port's key is revoked for host, then adds it
}
# A server that offers ed25519 and ecdsa: which key it shows depends on the client's algorithm order.
TWO_KEYS = [
    ("two keys: right ecdsa listed before wrong ed25519", ["{N} {E}", "{N} {X}"], "changed"),
    ("two keys: right ed25519 listed before wrong ecdsa", ["{N} {K}", "{N} {Y}"], "ok"),
    ("two keys: both right", ["{N} {E}", "{N} {K}"], "ok"),
    ("two keys: only ecdsa filed, right", ["{N} {E}"], "ok"),
    ("two keys: only ecdsa filed, wrong", ["{N} {Y}"], "changed"),
]


def _verdict_of(text: str, code: int) -> str:
    if code == 0:
        return "ok"
    low = text.lower()
    if "revoked" in low:
        return "revoked"
    if "has changed" in low or "remote host identification has changed" in low:
        return "changed"
    if "host key verification failed" in low or "is not a known host" in low:
        return "unknown"
    return "?"


def _ssh_run(config: Path, alias: str) -> tuple[str, str]:
    proc = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", alias, "true"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    return _verdict_of(proc.stderr, proc.returncode), proc.stderr


def _edgekit_run(alias: str, trust: bool) -> tuple[str, str]:
    device = SshTransport(alias, trust_new_host=trust, connect_timeout=10)
    try:
        device.connect()
        return "ok", ""
    except TransportError as exc:
        return _verdict_of(exc.message, 1), exc.message
    finally:
        device.close()


class _Parity:
    """Builds one case twice (files for ssh, files for edgekit: same content, same options), runs
    the real ssh on the one and edgekit on the other, and compares verdicts and saved keys."""

    def __init__(self, ssh_home, tmp: Path, fields: dict[str, str]) -> None:
        self.home, self.tmp, self.fields = ssh_home, tmp, fields
        # ssh gets the view edgekit asks `ssh -G` for when HOME is not the account's home:
        # $HOME's config, then the system config
        self.wrapper = tmp / "ssh-wrapper.conf"
        self.wrapper.write_text(f'Include "{ssh_home.config}"\nInclude /etc/ssh/ssh_config\n')
        self.rows: list[tuple[str, str, str, str]] = []

    def files(self, d: Path, lines: list[str], opts: dict, server, alias: str) -> tuple[dict[str, str], Path]:
        d.mkdir()
        buckets: dict[str, list[str]] = {"": [], "G:": [], "B:": [], "R:": [], "KRL:": []}
        for raw in lines:
            prefix = next((p for p in ("G:", "B:", "KRL:", "R:") if raw.startswith(p)), "")
            buckets[prefix].append(raw[len(prefix) :].format(**self.fields))
        body = "".join(_hashed(ln[2:], d) if ln.startswith("H:") else ln + "\n" for ln in buckets[""])
        user = getpass.getuser()
        if opts.get("tokens"):
            kh_opt = f"{d}/kh_%n_%u_%h_%p_%r_%k"
            kh = d / f"kh_{alias}_{user}_{server.host}_{server.port}_{server.user}_{opts.get('HostKeyAlias') or alias}"
        else:
            kh_opt, kh = str(d / "kh"), d / "kh"
        if opts.get("kh_dir"):
            kh.mkdir()
        else:
            kh.write_text(body)
        (d / "kh_b").write_text("".join(ln + "\n" for ln in buckets["B:"]))
        (d / "global").write_text("".join(ln + "\n" for ln in buckets["G:"]))
        block = {"UserKnownHostsFile": f"{kh_opt} {d / 'kh_b'}", "GlobalKnownHostsFile": str(d / "global")}
        if buckets["R:"]:
            (d / f"revoked_{user}").write_text("".join(ln + "\n" for ln in buckets["R:"]))
            block["RevokedHostKeys"] = f"{d}/revoked_%u" if opts.get("revoked_tokens") else str(d / f"revoked_{user}")
        if buckets["KRL:"]:
            pub = d / "krl-keys.pub"
            pub.write_text("".join(ln + "\n" for ln in buckets["KRL:"]))
            subprocess.run(["ssh-keygen", "-q", "-k", "-f", str(d / "krl"), str(pub)], check=True, capture_output=True, timeout=30)
            block["RevokedHostKeys"] = str(d / "krl")
        if "RevokedHostKeys" in opts:
            block["RevokedHostKeys"] = opts["RevokedHostKeys"].format(dir=d)
        if "HostKeyAlias" in opts:
            block["HostKeyAlias"] = opts["HostKeyAlias"]
        return block, kh

    def case(self, i: int, label: str, lines: list[str], expected: str, opts: dict, server, mode: str) -> None:
        got = {}
        for side in ("s", "e"):
            alias = f"{side}{i}{mode[0]}"
            block, kh = self.files(self.tmp / alias, lines, opts, server, alias)
            self.home.add_host(alias, server, StrictHostKeyChecking=mode, **block)
            before = kh.read_text() if kh.is_file() else ""
            verdict, text = _ssh_run(self.wrapper, alias) if side == "s" else _edgekit_run(alias, trust=False)
            after = kh.read_text() if kh.is_file() else ""
            got[side] = (verdict, text, before, after, kh)
        (sv, st, sb, sa, skh), (ev, et, eb, ea, ekh) = got["s"], got["e"]
        self.rows.append((label, mode, sv, ev))
        assert sv == expected, (label, mode, st)
        assert ev == sv, (label, mode, "ssh:", st, "edgekit:", et)
        # what was saved: nothing, or one line each, both hashed or both plain, found by ssh-keygen -F
        assert sa.startswith(sb) and ea.startswith(eb), (label, mode)
        new_s, new_e = sa[len(sb) :], ea[len(eb) :]
        assert bool(new_s) == bool(new_e), (label, mode, new_s, new_e)
        if new_s:
            assert new_s.startswith("|1|") == new_e.startswith("|1|"), (new_s, new_e)
            name = opts.get("HostKeyAlias") or self.fields["N"]
            for path in (skh, ekh):
                assert "found" in subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)], capture_output=True, text=True, timeout=30).stdout


@pytest.mark.ssh
@needs_keygen
@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")
def test_parity_with_openssh_verdicts(ssh_home, sshd_server, tmp_path):
    """Every case of MATRIX and MORE with StrictHostKeyChecking yes and accept-new (BatchMode), and
    the two-key cases against a server offering ed25519 and ecdsa: the real ssh and edgekit read
    the same config (edgekit through ``ssh -G``) and the same files, and must reach the same verdict
    and save the same kind of line."""
    from tests.lab.sshd import Sshd

    server = sshd_server
    other = " ".join(sshd_mod.keygen(tmp_path / "other", "x").split()[:2])
    keys = {}
    for name in ("ec", "ec2"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(tmp_path / name)], check=True, capture_output=True)
        keys[name] = " ".join((tmp_path / f"{name}.pub").read_text().split()[:2])
    fields = {"N": server.known_hosts_name, "H": server.host, "K": server.host_key_line, "X": other, "E": keys["ec"],
              "Y": keys["ec2"], "P": str(server.port), "A": "lab-alias"}  # fmt: skip
    (tmp_path / "cases").mkdir()
    parity = _Parity(ssh_home, tmp_path / "cases", fields)
    cases = [(label, lines, expected, {}) for label, lines, expected in MATRIX] + MORE
    for mode in ("yes", "accept-new"):
        for i, (label, lines, expected, opts) in enumerate(cases):
            want = ACCEPT_NEW.get(label, "ok" if expected == "unknown" else expected) if mode == "accept-new" else expected
            parity.case(i, label, lines, want, opts, server, mode)

    two = Sshd(tmp_path / "two-keys")
    two.prepare()
    shutil.copy(tmp_path / "ec", two.base / "ssh_host_ecdsa_key")
    two.extra_host_keys = [two.base / "ssh_host_ecdsa_key"]
    two.start()
    try:
        parity.fields = {**fields, "N": two.known_hosts_name, "K": two.host_key_line, "P": str(two.port)}
        for mode in ("yes", "accept-new"):
            for j, (label, lines, expected) in enumerate(TWO_KEYS):
                parity.case(100 + j, label, lines, expected, {}, two, mode)
    finally:
        two.stop()
    rows = parity.rows
    print(f"\nOpenSSH parity: {len(rows)} rows ({len(cases) + len(TWO_KEYS)} cases x 2 modes), {sum(r[2] != r[3] for r in rows)} disagreements")
    for row in rows:
        print(" | ".join(row))
    assert len(rows) >= 54


@pytest.mark.ssh
@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")
def test_proxy_command_takes_the_port_given_on_the_command_line(ssh_home, sshd_server, tmp_path):
    """ProxyCommand's %p is the port in force for this connection: the one on --device wins over
    the config's, as with ssh -p (the issue's `--device root@pc:36689`)."""
    server = sshd_server
    ssh_home.trust()
    relay = tmp_path / "relay.py"
    relay.write_text(
        "import socket, sys, threading\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
        "def down():\n"
        "    for b in iter(lambda: s.recv(65536), b''):\n"
        "        sys.stdout.buffer.write(b)\n"
        "        sys.stdout.flush()\n"
        "threading.Thread(target=down, daemon=True).start()\n"
        "for b in iter(lambda: sys.stdin.buffer.read1(65536), b''):\n"
        "    s.sendall(b)\n"
    )
    block = server.ssh_config("viaproxy", ProxyCommand=f"{sys.executable} {relay} %h %p").replace(f"Port {server.port}", "Port 1")
    with open(ssh_home.config, "a") as fh:
        fh.write("\n" + block)
    target = SshTransport(f"viaproxy:{server.port}").target
    assert target.source == "ssh -G" and target.proxy_command == f"{sys.executable} {relay} {server.host} {server.port}"
    assert SshTransport("viaproxy").target.proxy_command.endswith(f"{server.host} 1")  # the config's port without one
    device = SshTransport(f"viaproxy:{server.port}", connect_timeout=10)
    try:
        assert device.run(["echo", "through the proxy"], timeout=30).stdout.strip() == b"through the proxy"
    finally:
        device.close()


@pytest.mark.ssh
@pytest.mark.slow
def test_cli_refuses_a_wildcard_entry_with_another_key_even_with_trust_new_host(ssh_home, sshd_server, cli, tmp_path):
    other = " ".join(sshd_mod.keygen(tmp_path / "other", "x").split()[:2])
    ssh_home.known_hosts.write_text(f"*.example.org,[127.0.0.*]:* {other}\n")
    result = cli("devices", "check", "lab", "--trust-new-host", env=ssh_home.env())
    assert_one_line_error(result, 4, "has CHANGED")
    assert f"{ssh_home.known_hosts} line 1" in result.stderr
    assert ssh_home.known_hosts.read_text() == f"*.example.org,[127.0.0.*]:* {other}\n"  # nothing saved


@pytest.mark.ssh
@pytest.mark.slow
def test_cli_refuses_a_revoked_key_even_with_trust_new_host(ssh_home, sshd_server, cli):
    ssh_home.known_hosts.write_text(f"@revoked * {sshd_server.host_key_line}\n")
    result = cli("devices", "check", "lab", "--trust-new-host", env=ssh_home.env())
    assert_one_line_error(result, 4, "is REVOKED")
    assert ssh_home.known_hosts.read_text() == f"@revoked * {sshd_server.host_key_line}\n"


@pytest.mark.ssh
@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")
def test_the_issue_repro_a_percent_token_in_user_known_hosts_file(ssh_home, sshd_server, cli):
    """Issue 26 item 1: `UserKnownHostsFile ~/.ssh/kh_%u` holding `@revoked * KEY` was ignored
    (edgekit trusted the host and wrote a file literally named kh_%u); ssh says "revoked"."""
    kh = ssh_home.ssh_dir / f"kh_{getpass.getuser()}"
    kh.write_text(f"@revoked * {sshd_server.host_key_line}\n")
    ssh_home.config.write_text(sshd_server.ssh_config("lab", UserKnownHostsFile="~/.ssh/kh_%u"))
    result = cli("devices", "check", "lab", "--trust-new-host", env=ssh_home.env())
    assert_one_line_error(result, 4, "is REVOKED")
    assert kh.read_text() == f"@revoked * {sshd_server.host_key_line}\n"
    assert not (ssh_home.ssh_dir / "kh_%u").exists()


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")
@pytest.mark.parametrize("token", list("hknprCdiLluj%"))
@pytest.mark.parametrize("key_alias", [None, "farm-key"])
def test_proxy_command_tokens_expand_or_fail_as_ssh_does(token, key_alias, tmp_path, monkeypatch):
    """Each %-token in a ProxyCommand: ssh itself (the oracle) runs the command with the token
    expanded, or refuses the token; edgekit expands it to the same text, or refuses it too."""
    from edgekit.errors import EdgekitError
    from edgekit.transport.sshconfig import resolve_target

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    seen = tmp_path / "seen"
    alias_line = f"    HostKeyAlias {key_alias}\n" if key_alias else ""
    (home / ".ssh" / "config").write_text(
        f"Host board\n    HostName 127.0.0.9\n    User pi\n    Port 2222\n{alias_line}"
        f"    ProxyCommand sh -c 'echo \"[%{token}]\" > {seen}'\n"
    )
    proc = subprocess.run(["ssh", "-F", str(home / ".ssh" / "config"), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "board", "true"], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "HOME": str(home)})  # fmt: skip
    by_ssh = seen.read_text() if seen.exists() else None
    if seen.exists():
        seen.unlink()
    try:
        target = resolve_target("board")
    except EdgekitError as exc:
        assert by_ssh is None, f"ssh ran %{token} as {by_ssh!r}; edgekit refused it: {exc.message}"
        assert f"%{token}" in exc.message and exc.hint
        return
    assert by_ssh is not None, f"edgekit expanded %{token}; ssh refused it: {proc.stderr.strip()}"
    subprocess.run(target.proxy_command, shell=True, timeout=30)  # as paramiko's ProxyCommand starts it
    assert seen.read_text() == by_ssh, (token, target.proxy_command)
