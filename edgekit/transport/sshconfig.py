"""Where a ``--device`` string leads: ssh config resolution and known_hosts bookkeeping.

``resolve_target("pi@10.0.0.7")`` or ``resolve_target("orin1")`` gives an ``SshTarget``
(host name, user, port, identity files, jump hosts, known_hosts files, revoked keys, hashing)
as OpenSSH decides it. Where an ``ssh`` client is installed it is asked (``ssh -G DEST``): the
system and user config, ``Include``, ``Match``, every ``%`` token, exactly as ``ssh`` itself would
read them. Without one, ``~/.ssh/config`` is parsed (paramiko's parser: Host aliases, HostName,
User, Port, IdentityFile, IdentitiesOnly, ProxyJump, ProxyCommand, ConnectTimeout,
UserKnownHostsFile, GlobalKnownHostsFile, HostKeyAlias, StrictHostKeyChecking). Nothing here
touches the network.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import EdgekitError, InputError, TransportError, UsageError
from edgekit.transport.names import check_host, check_user

DEFAULT_PORT = 22
DEFAULT_CONNECT_TIMEOUT = 15.0
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")

_DEVICE_RX = re.compile(
    r"""^(?:ssh://)?
        (?:(?P<user>[^@/\s]+)@)?
        (?:\[(?P<v6>[0-9A-Fa-f:.%\w]+)\]|(?P<host>[^@:/\s\[\]]+))
        (?::(?P<port>\d{1,5}))?/?$""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class SshTarget:
    """One SSH endpoint, fully resolved (no config lookups left)."""

    alias: str  # what the user typed, minus user and port ("orin1", "10.0.0.7")
    hostname: str  # what to connect to
    user: str
    port: int
    identity_files: tuple[str, ...]  # expanded paths; missing default ones already dropped
    identities_only: bool
    proxy_jump: tuple[str, ...]  # hop specs, outermost first ("" when none)
    proxy_command: str | None
    connect_timeout: float
    user_known_hosts: tuple[str, ...]
    global_known_hosts: tuple[str, ...]
    host_key_alias: str | None
    strict_host_key_checking: str  # "yes" | "accept-new" | "no" | "ask"
    revoked_host_keys: str | None = None  # RevokedHostKeys (a KRL or a list of public keys), expanded
    hash_known_hosts: bool = False  # HashKnownHosts: save new keys with the host name hashed
    host_key_algorithms: tuple[str, ...] = ()  # HostKeyAlgorithms in ssh's order (empty: the parser's default)
    source: str = "~/.ssh/config"  # how it was resolved: "ssh -G" or the parsed config

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is filed under in known_hosts (as OpenSSH writes it: lower case)."""
        if self.host_key_alias:
            return _lower(self.host_key_alias)
        host = _lower(self.hostname)
        return host if self.port == DEFAULT_PORT else f"[{host}]:{self.port}"

    @property
    def display(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"


def parse_device(device: str, where: str = "--device", error: type[EdgekitError] = UsageError) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` (IPv6 in brackets) -> (user, host, port), each part as
    OpenSSH would accept it (``names``); else ``error`` naming ``where``."""
    text = device.strip()
    if not text:
        raise error(f"{where}: empty device", "pass a host, user@host[:port], or a Host alias from ~/.ssh/config")
    if text.count(":") > 1 and "[" not in text and "@" not in text and "/" not in text:
        return None, check_host(text, where, error), None  # a bare IPv6 address
    m = _DEVICE_RX.match(text)
    if not m:
        raise error(
            f"{where}: cannot read device {text!r}",
            "use user@host, user@host:port, [ipv6]:port, or a Host alias from ~/.ssh/config",
        )
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        raise error(f"{where}: device {text!r}: port {port} is out of range", "ports are 1-65535")
    if m["user"] is not None:
        check_user(m["user"], where, error)
    return m["user"], check_host(m["v6"] or m["host"], where, error), port


def import_paramiko():
    """paramiko, imported without ``invoke``: paramiko.config imports it at once (50-90 ms of every
    SSH command here) for ``Match exec`` lines only; ``resolve_target`` loads it when one is met."""
    if "paramiko" not in sys.modules and "invoke" not in sys.modules:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` fails: paramiko keeps invoke = None
        try:
            import paramiko  # noqa: F401
        finally:
            del sys.modules["invoke"]
    import paramiko

    return paramiko


def _load_invoke() -> bool:
    """Give paramiko's config the ``invoke`` it was imported without; False when it is not installed."""
    import paramiko.config

    if paramiko.config.invoke is not None:
        return False
    try:
        import invoke
    except ImportError:
        return False
    paramiko.config.invoke = invoke
    return True


def load_config(path: Path | None = None):
    """paramiko's SSHConfig for ``path`` (default ~/.ssh/config); an empty one when absent."""
    paramiko = import_paramiko()

    path = path or Path(os.path.expanduser("~/.ssh/config"))
    if not path.is_file():
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except OSError as exc:
        raise TransportError(f"cannot read {path}: {exc.strerror or exc}", "check the file's permissions") from None
    except Exception as exc:  # paramiko's parser raises ConfigParseError and friends
        raise TransportError(f"cannot parse {path}: {exc}", "fix that line (ssh -G HOST shows how OpenSSH reads it)") from None


def resolve_target(device: str, config=None, *, _hop: bool = False) -> SshTarget:
    """The SSH endpoint ``device`` names, as ``ssh`` resolves it: by ``ssh -G`` when ``config`` is
    None and an ssh client is installed; else with ``config`` (default ~/.ssh/config) parsed."""
    user, host, port = parse_device(device)
    if config is None and shutil.which("ssh") is not None:
        return _from_openssh(host, user, port, _hop)
    config = config if config is not None else load_config()
    try:
        try:
            opts = config.lookup(host)
        except ImportError:  # `Match exec`: it runs its command through invoke
            if not _load_invoke():
                raise
            opts = config.lookup(host)
    except Exception as exc:  # e.g. `Match exec` needs the optional `invoke` package
        raise TransportError(
            f"cannot apply ~/.ssh/config to '{host}': {exc}",
            "simplify the matching Host/Match block (edgekit reads Host, HostName, User, Port, IdentityFile, ProxyJump)",
        ) from None
    where = f"~/.ssh/config (Host {host})"
    hostname = check_host(opts.get("hostname", host), f"{where}: HostName")
    if port is None:
        try:
            port = int(opts.get("port", DEFAULT_PORT))
        except ValueError:
            raise TransportError(f"~/.ssh/config: Port for {host} is not a number: {opts.get('port')!r}", "fix the Port line") from None
    user = user or (opts.get("user") and check_user(opts["user"], f"{where}: User")) or getpass.getuser()
    identities_only = str(opts.get("identitiesonly") or "").lower() in ("yes", "true", "on")
    configured = [os.path.expanduser(p) for p in opts.get("identityfile", [])]
    defaults = [] if identities_only and configured else [os.path.expanduser(p) for p in DEFAULT_IDENTITIES]
    identity_files = tuple(dict.fromkeys([*configured, *[p for p in defaults if os.path.exists(p)]]))
    jump = opts.get("proxyjump", "")
    hops: tuple[str, ...] = ()
    if jump and jump.lower() != "none" and not _hop:
        hops = tuple(h.strip() for h in jump.split(",") if h.strip())
        for hop in hops:  # each hop's name reaches a ProxyCommand like the target's does
            parse_device(hop, f"{where}: ProxyJump", InputError)
    proxy_command = opts.get("proxycommand")
    if proxy_command and proxy_command.lower() == "none":
        proxy_command = None
    try:
        timeout = float(opts.get("connecttimeout", DEFAULT_CONNECT_TIMEOUT))
    except ValueError:
        timeout = DEFAULT_CONNECT_TIMEOUT
    user_kh = _split_files(opts.get("userknownhostsfile"), DEFAULT_USER_KNOWN_HOSTS)
    global_kh = _split_files(opts.get("globalknownhostsfile"), DEFAULT_GLOBAL_KNOWN_HOSTS)
    strict = str(opts.get("stricthostkeychecking", "ask")).lower()
    strict = {"true": "yes", "false": "no", "off": "no", "on": "yes"}.get(strict, strict)
    return SshTarget(
        alias=host,
        hostname=hostname,
        user=user,
        port=port,
        identity_files=identity_files,
        identities_only=identities_only,
        proxy_jump=hops,
        proxy_command=proxy_command,
        connect_timeout=timeout,
        user_known_hosts=user_kh,
        global_known_hosts=global_kh,
        host_key_alias=opts.get("hostkeyalias"),
        strict_host_key_checking=strict,
    )


SYSTEM_CONFIG = "/etc/ssh/ssh_config"
# options whose ~ and %d ssh -G prints expanded (to the password database's home)
_HOME_PATHS = {"userknownhostsfile", "globalknownhostsfile"}
# what ssh tries when no IdentityFile is configured (ssh -G lists them all; edgekit keeps the existing ones)
_DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk", "id_xmss", "id_dsa")


def _pw_home() -> str | None:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):
        return None


def openssh_options(host: str, user: str | None = None, port: int | None = None, extra: Sequence[str] = ()) -> dict[str, list[str]]:
    """``ssh -G [-l USER] [-p PORT] HOST``: every option as ssh would use it (lower-case keys; a
    value per line, repeated keys such as IdentityFile in order).

    ssh reads the user config of the password database's home; edgekit's ``~`` is ``$HOME``. When
    they differ (a CI job, a test), ssh is pointed at ``$HOME/.ssh/config`` followed by the system
    config (``-F`` alone would drop the system config), and paths ssh expanded under the password
    database's home are mapped to ``$HOME``."""
    home, pw = os.path.expanduser("~"), _pw_home()
    argv = ["ssh", "-G"]
    wrapper = None
    remap = pw is not None and os.path.realpath(home) != os.path.realpath(pw)
    if remap:
        fd, wrapper = tempfile.mkstemp(prefix="edgekit-ssh-", suffix=".conf")
        with os.fdopen(fd, "w") as fh:
            fh.write(f'Include "{os.path.join(home, ".ssh", "config")}"\nInclude "{SYSTEM_CONFIG}"\n')
        argv += ["-F", wrapper]
    argv += [*extra, *(["-l", user] if user else []), *(["-p", str(port)] if port else []), host]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TransportError(f"ssh -G {host} failed: {exc}", "check the ssh client (ssh -G HOST)") from None
    finally:
        if wrapper is not None:
            os.unlink(wrapper)
    if proc.returncode != 0:
        why = [ln for ln in proc.stderr.splitlines() if ln.strip() and "Pseudo-terminal" not in ln]
        raise TransportError(
            f"ssh cannot resolve '{host}' from its config: {why[-1] if why else f'exit code {proc.returncode}'}",
            "fix the ssh config (ssh -G HOST shows how OpenSSH reads it)",
        )
    opts: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        if remap and pw is not None and key.lower() in _HOME_PATHS:
            value = " ".join(home + w[len(pw.rstrip("/")) :] if w == pw or w.startswith(pw.rstrip("/") + "/") else w for w in value.split(" "))
        opts.setdefault(key.lower(), []).append(value)
    return opts


def _from_openssh(host: str, user: str | None, port: int | None, hop: bool) -> SshTarget:
    opts = openssh_options(host, user, port)

    def one(key: str, default: str | None = None) -> str | None:
        values = opts.get(key)
        return values[0] if values else default

    hostname = check_host(one("hostname", host), f"ssh -G {host}: HostName")
    port = int(one("port", str(DEFAULT_PORT)))
    user = check_user(one("user") or getpass.getuser(), f"ssh -G {host}: User")
    home = os.path.expanduser("~")
    defaults = {os.path.join(home, ".ssh", name) for name in _DEFAULT_KEYS}
    files = [os.path.expanduser(p) for p in opts.get("identityfile", [])]
    identity_files = tuple(dict.fromkeys(p for p in files if p not in defaults or os.path.exists(p)))
    jump = one("proxyjump", "none")
    hops: tuple[str, ...] = ()
    if jump.lower() != "none" and not hop:
        hops = tuple(h.strip() for h in jump.split(",") if h.strip())
        for spec in hops:
            parse_device(spec, f"ssh -G {host}: ProxyJump", InputError)
    proxy = one("proxycommand")
    if proxy is not None and proxy.lower() != "none":
        # ProxyCommand takes %h %k %n %p %r %% (ssh_config(5) TOKENS; OpenSSH 9.2 refuses the
        # others there, %C and %d included), expanded when ssh connects: the port is the one in force
        # for this connection (given on --device, else the config's); %k the HostKeyAlias, else the
        # name as given
        key_alias = one("hostkeyalias")
        proxy = _expand(proxy, {"h": hostname, "k": key_alias or host, "n": host, "p": str(port), "r": user}, "ProxyCommand")
    else:
        proxy = None
    timeout = one("connecttimeout", "none")
    revoked = one("revokedhostkeys")
    if revoked is not None and revoked.lower() != "none":
        # ssh -G prints RevokedHostKeys as written; ssh expands ~ and the tokens of
        # UserKnownHostsFile in it: let ssh do that too
        revoked = openssh_options(host, user, port, ["-o", f"UserKnownHostsFile={revoked}"])["userknownhostsfile"][0]
    else:
        revoked = None
    strict = (one("stricthostkeychecking", "ask") or "ask").lower()
    alias = one("hostkeyalias")
    return SshTarget(
        alias=host,
        hostname=hostname,
        user=user,
        port=port,
        identity_files=identity_files,
        identities_only=(one("identitiesonly", "no") or "").lower() == "yes",
        proxy_jump=hops,
        proxy_command=proxy,
        connect_timeout=DEFAULT_CONNECT_TIMEOUT if timeout in (None, "none") else float(timeout),
        user_known_hosts=tuple(w for v in opts.get("userknownhostsfile", []) for w in v.split() if w.lower() != "none"),
        global_known_hosts=tuple(w for v in opts.get("globalknownhostsfile", []) for w in v.split() if w.lower() != "none"),
        host_key_alias=alias if alias and alias.lower() != "none" else None,
        strict_host_key_checking={"true": "yes", "false": "no"}.get(strict, strict),
        revoked_host_keys=revoked,
        hash_known_hosts=(one("hashknownhosts", "no") or "").lower() == "yes",
        host_key_algorithms=tuple(a for v in opts.get("hostkeyalgorithms", []) for a in v.split(",") if a),
        source="ssh -G",
    )


def _expand(text: str, tokens: dict[str, str], what: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        t = text[i + 1 : i + 2]
        if t == "%":
            out.append("%")
        elif t in tokens:
            out.append(tokens[t])
        else:
            raise InputError(f"{what} uses %{t}, which ssh does not expand there", f"{what} takes {', '.join('%' + k for k in tokens)} and %%")
        i += 2
    return "".join(out)


def _split_files(value, default: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return tuple(os.path.expanduser(p) for p in default)
    words = value if isinstance(value, list) else str(value).split()
    return tuple(os.path.expanduser(w) for w in words if w.lower() != "none")


# -- known_hosts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownKey:
    path: str
    lineno: int
    keytype: str
    key_b64: str  # the key blob in canonical base64, so equal keys compare equal as text
    marker: str = ""  # "" for a host key, "revoked" for an @revoked line


def match_pattern(name: str, pattern: str) -> bool:
    """OpenSSH's ``match_pattern``: ``*`` any run, ``?`` any one character, nothing else special."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name, re.DOTALL) is not None


def match_hostname(name: str, patterns: str) -> int:
    """OpenSSH's ``match_hostname``: 1 when a pattern of the comma list matches, -1 when a
    ``!pattern`` matches (which vetoes the whole line), else 0. Case-insensitive."""
    name = _lower(name)
    got = 0
    for sub in patterns.split(","):
        negated = sub.startswith("!")
        sub = _lower(sub[1:] if negated else sub)
        if len(sub.encode("utf-8", "surrogateescape")) >= 1023:
            return 0  # OpenSSH gives up on the whole list
        if match_pattern(name, sub):
            if negated:
                return -1
            got = 1
    return got


def _hosts_match(name: str, hosts: str) -> bool:
    """Does a known_hosts line's host field cover ``name`` (OpenSSH's ``match_maybe_hashed``)?"""
    if not hosts.startswith("|"):
        return match_hostname(name, hosts) == 1
    parts = hosts.split("|")
    if len(parts) < 4 or parts[1] != "1":
        return False
    try:
        salt = base64.b64decode(parts[2], validate=True)
    except ValueError:
        return False
    # ``|1|salt|HMAC-SHA1(salt, name)``, as ``ssh-keygen -H`` writes it
    digest = hmac.new(salt, name.encode("utf-8"), hashlib.sha1).digest()
    hashed = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    return len(salt) == 20 and hmac.compare_digest(hashed, hosts)


def _lower(text: str) -> str:
    return text.translate(_ASCII_LOWER)  # C tolower in the C locale: ASCII letters only


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_MARKERS = {"@cert-authority": "cert-authority", "@revoked": "revoked"}


def _key_blob(keytype: str, key_b64: str) -> bytes | None:
    """The key's wire blob when ``key_b64`` is valid base64 of a key of ``keytype``."""
    try:
        blob = base64.b64decode(key_b64, validate=True)
    except ValueError:
        return None
    n = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
    return blob if blob[4 : 4 + n] == keytype.encode() and len(blob) > 4 + n else None


def known_entries(name: str, files: Sequence[str]) -> list[KnownKey]:
    """Every known_hosts line of ``files`` that covers host ``name``, read as OpenSSH reads them:
    patterns with ``*``/``?``, ``!negation``, comma lists, hashed names; ``@revoked`` lines kept
    (marker "revoked"), ``@cert-authority`` and unreadable lines skipped."""
    name = _lower(name)
    found: list[KnownKey] = []
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as fh:
                lines = fh.read().split("\n")
        except OSError:
            continue
        for lineno, line in enumerate(lines, 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            marker = ""
            if fields[0].startswith("@"):
                marker = _MARKERS.get(fields[0], "bad")
                fields = fields[1:]
            if marker in ("bad", "cert-authority") or len(fields) < 3 or not _hosts_match(name, fields[0]):
                continue
            blob = _key_blob(fields[1], fields[2])
            if blob is not None:
                found.append(KnownKey(path, lineno, fields[1], base64.b64encode(blob).decode(), marker))
    return found


def known_keys(target: SshTarget) -> list[KnownKey]:
    """The host keys filed for the target (user and global files; @revoked lines left out)."""
    files = (*target.user_known_hosts, *target.global_known_hosts)
    return [k for k in known_entries(target.known_hosts_name, files) if not k.marker]


def _status(name: str, files: Sequence[str], keytype: str, key_b64: str) -> tuple[str, KnownKey | None]:
    entries = known_entries(name, files)
    blob = _key_blob(keytype, key_b64)
    key = base64.b64encode(blob).decode() if blob is not None else None
    for marker, verdict in (("revoked", "revoked"), ("", "ok")):
        hit = next((e for e in entries if e.marker == marker and e.key_b64 == key), None)
        if hit is not None:
            return verdict, hit
    plain = [e for e in entries if not e.marker]
    if plain:
        return "changed", next((e for e in plain if e.keytype == keytype), plain[0])
    return "unknown", None


KRL_MAGIC = b"SSHKRL\n\0"


def revoked_by_file(path: str, keytype: str, key_b64: str) -> bool:
    """Is the key in ``path`` (RevokedHostKeys: an OpenSSH KRL, or a file of public keys, one per
    line)? TransportError when the file cannot be read: ssh refuses the host then too."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(64 << 20)
    except OSError as exc:
        raise TransportError(
            f"cannot check the host key against RevokedHostKeys {path}: {exc.strerror or exc}; refusing to connect (as ssh does)",
            "create the file (it may be empty) or fix RevokedHostKeys in the ssh config",
        ) from None
    blob = _key_blob(keytype, key_b64)
    if not data.startswith(KRL_MAGIC):
        for line in data.decode("utf-8", "replace").splitlines():
            fields = line.split()
            if len(fields) >= 2 and not fields[0].startswith("#"):
                other = _key_blob(fields[0], fields[1])
                if other is not None and other == blob:
                    return True
        return False
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        raise TransportError(f"RevokedHostKeys {path} is a KRL, which needs ssh-keygen to read", "install the OpenSSH client tools")
    with tempfile.TemporaryDirectory(prefix="edgekit-krl-") as tmp:
        keyfile = os.path.join(tmp, "host.pub")
        with open(keyfile, "w") as fh:
            fh.write(f"{keytype} {key_b64}\n")
        proc = subprocess.run([keygen, "-Q", "-f", path, keyfile], capture_output=True, text=True, timeout=30)
    if proc.returncode == 0:
        return False
    if "REVOKED" in proc.stdout:
        return True
    why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    raise TransportError(f"cannot check the host key against RevokedHostKeys {path}: {why}; refusing to connect", "fix or remove the KRL file")


def host_key_status(target: SshTarget, keytype: str, key_b64: str) -> tuple[str, KnownKey | None]:
    """OpenSSH's verdict on the server's key, with the deciding known_hosts line: "revoked" (in
    RevokedHostKeys, or an @revoked line covering the host holds it; beats everything), "ok",
    "changed" (other keys, of any type, are filed for the host) or "unknown" (with the @revoked
    line of the bare host name when one holds the key: ssh warns about it, then treats the key as new)."""
    if target.revoked_host_keys and revoked_by_file(target.revoked_host_keys, keytype, key_b64):
        return "revoked", KnownKey(target.revoked_host_keys, 0, keytype, key_b64, "revoked")
    files = (*target.user_known_hosts, *target.global_known_hosts)
    verdict, line = _status(target.known_hosts_name, files, keytype, key_b64)
    if verdict == "unknown" and not target.host_key_alias and target.port != DEFAULT_PORT:
        # As ssh does ("checking without port identifier"), the bare host name's entry may vouch
        # for the key; its other keys are no verdict there. A revoked key stays revoked (ssh
        # warns, then would treat it as new).
        bare = _status(_lower(target.hostname), files, keytype, key_b64)
        if bare[0] == "ok":
            return bare
        if bare[0] == "revoked":  # ssh warns, and still treats the key as new for [host]:port
            return "unknown", bare[1]
    return verdict, line


def _filed_name(target: SshTarget) -> str:
    """The host field of a new known_hosts line: the name, or ``|1|salt|HMAC-SHA1`` of it when
    HashKnownHosts is on (as ssh and ``ssh-keygen -H`` write it)."""
    name = target.known_hosts_name
    if not target.hash_known_hosts:
        return name
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode("utf-8"), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def add_known_host(target: SshTarget, keytype: str, key_b64: str) -> str:
    """Append the host's key to the first user known_hosts file (created 0600), its name hashed
    when HashKnownHosts says so; the file's path."""
    if not target.user_known_hosts:
        raise TransportError(
            f"cannot save the host key of {target.known_hosts_name}: UserKnownHostsFile is none",
            "set UserKnownHostsFile in ~/.ssh/config",
        )
    path = target.user_known_hosts[0]
    parent = os.path.dirname(path) or "."
    try:
        os.makedirs(parent, mode=0o700, exist_ok=True)
        needs_newline = False
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                needs_newline = fh.read(1) != b"\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(("\n" if needs_newline else "") + f"{_filed_name(target)} {keytype} {key_b64}\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise TransportError(f"cannot save the host key to {path}: {exc.strerror or exc}", "check the file's permissions") from None
    return path
