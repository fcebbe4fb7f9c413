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

import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from edgekit.errors import TransportError
from edgekit.transport.ssh import SshTransport
from edgekit.transport.sshconfig import host_key_status, known_entries, match_hostname
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


def _ssh_verdict(server, kh: Path) -> tuple[str, str]:
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(server.client_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={kh}", "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", "CheckHostIP=no", "-o", "ConnectTimeout=10", "-p", str(server.port), f"{server.user}@{server.host}", "true"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    err = proc.stderr
    if proc.returncode == 0:
        return "ok", err
    if "revoked" in err.lower():
        return "revoked", err
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err:
        return "changed", err
    if "Host key verification failed" in err:
        return "unknown", err
    return "?", err


def _edgekit_verdict(alias: str, trust: bool) -> tuple[str, str]:
    device = SshTransport(alias, trust_new_host=trust, connect_timeout=10)
    try:
        device.connect()
        return "ok", ""
    except TransportError as exc:
        text = exc.message
        for verdict, needle in (("revoked", "REVOKED"), ("changed", "CHANGED"), ("unknown", "is not a known host")):
            if needle in text:
                return verdict, text
        return "?", text
    finally:
        device.close()


@pytest.mark.ssh
@needs_keygen
def test_verdicts_agree_with_openssh_against_a_real_sshd(ssh_home, sshd_server, tmp_path):
    server = sshd_server
    other = " ".join(sshd_mod.keygen(tmp_path / "other", "x").split()[:2])
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(tmp_path / "ec")], check=True, capture_output=True)
    ecdsa = " ".join((tmp_path / "ec.pub").read_text().split()[:2])
    name = server.known_hosts_name
    fields = {"N": name, "H": server.host, "K": server.host_key_line, "X": other, "E": ecdsa, "P": str(server.port)}
    table = []
    for i, (label, lines, expected) in enumerate(MATRIX):
        kh = tmp_path / f"kh{i}"
        kh.write_text("".join(_hashed(ln[2:], tmp_path) if ln.startswith("H:") else ln + "\n" for ln in (x.format(**fields) for x in lines)))
        before = kh.read_text()
        ssh_home.add_host(f"m{i}", server, UserKnownHostsFile=str(kh), GlobalKnownHostsFile="/dev/null")
        openssh, ssh_err = _ssh_verdict(server, kh)
        strict, strict_err = _edgekit_verdict(f"m{i}", trust=False)
        library = host_key_status(SshTransport(f"m{i}").target, *server.host_key_line.split())[0]
        trusting, trusting_err = _edgekit_verdict(f"m{i}", trust=True)
        table.append((label, openssh, strict))
        assert openssh == expected, (label, ssh_err)
        assert library == expected, label
        assert strict == expected, (label, strict_err)
        if expected == "unknown":  # trust on first use: accepted and saved
            assert trusting == "ok", (label, trusting_err)
            assert kh.read_text() == before + server.known_hosts_line()
        else:  # a changed or revoked key is refused even when trusting, and nothing is saved
            assert trusting == expected, (label, trusting_err)
            assert kh.read_text() == before
    print("\nknown_hosts verdicts (case | OpenSSH ssh | edgekit):")
    for row in table:
        print(" | ".join(row))


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
