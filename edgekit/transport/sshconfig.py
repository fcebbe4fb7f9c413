"""Where a ``--device`` string leads: ``~/.ssh/config`` resolution and known_hosts bookkeeping.

``resolve_target("pi@10.0.0.7")`` or ``resolve_target("orin1")`` gives an ``SshTarget``
(host name, user, port, identity files, jump hosts, known_hosts files) the way OpenSSH would
read it from ``~/.ssh/config``: Host aliases, HostName, User, Port, IdentityFile,
IdentitiesOnly, ProxyJump, ProxyCommand, ConnectTimeout, UserKnownHostsFile,
GlobalKnownHostsFile, HostKeyAlias, StrictHostKeyChecking. Nothing here touches the network.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import TransportError, UsageError

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

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is filed under in known_hosts (as OpenSSH writes it)."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == DEFAULT_PORT else f"[{self.hostname}]:{self.port}"

    @property
    def display(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"


def ssh_config_path() -> Path:
    return Path(os.path.expanduser("~/.ssh/config"))


def parse_device(device: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` (IPv6 in brackets) -> (user, host, port)."""
    text = device.strip()
    if not text:
        raise UsageError("empty --device", "pass a host, user@host[:port], or a Host alias from ~/.ssh/config")
    if text.count(":") > 1 and "[" not in text and "@" not in text and "/" not in text:
        return None, text, None  # a bare IPv6 address
    m = _DEVICE_RX.match(text)
    if not m:
        raise UsageError(
            f"cannot read device '{device}'",
            "use user@host, user@host:port, [ipv6]:port, or a Host alias from ~/.ssh/config",
        )
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"device '{device}': port {port} is out of range", "ports are 1-65535")
    return m["user"], m["v6"] or m["host"], port


def load_config(path: Path | None = None):
    """paramiko's SSHConfig for ``path`` (default ~/.ssh/config); an empty one when absent."""
    import paramiko

    path = path or ssh_config_path()
    if not path.is_file():
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except OSError as exc:
        raise TransportError(f"cannot read {path}: {exc.strerror or exc}", "check the file's permissions") from None
    except Exception as exc:  # paramiko's parser raises ConfigParseError and friends
        raise TransportError(f"cannot parse {path}: {exc}", "fix that line (ssh -G HOST shows how OpenSSH reads it)") from None


def resolve_target(device: str, config=None, *, _hop: bool = False) -> SshTarget:
    """The SSH endpoint ``device`` names, with ``~/.ssh/config`` applied (as ``ssh`` would)."""
    user, host, port = parse_device(device)
    config = config if config is not None else load_config()
    try:
        opts = config.lookup(host)
    except Exception as exc:  # e.g. `Match exec` needs the optional `invoke` package
        raise TransportError(
            f"cannot apply ~/.ssh/config to '{host}': {exc}",
            "simplify the matching Host/Match block (edgekit reads Host, HostName, User, Port, IdentityFile, ProxyJump)",
        ) from None
    hostname = opts.get("hostname", host)
    if port is None:
        try:
            port = int(opts.get("port", DEFAULT_PORT))
        except ValueError:
            raise TransportError(f"~/.ssh/config: Port for {host} is not a number: {opts.get('port')!r}", "fix the Port line") from None
    user = user or opts.get("user") or getpass.getuser()
    identities_only = _yes(opts.get("identitiesonly"))
    configured = [os.path.expanduser(p) for p in opts.get("identityfile", [])]
    defaults = [] if identities_only and configured else [os.path.expanduser(p) for p in DEFAULT_IDENTITIES]
    identity_files = tuple(dict.fromkeys([*configured, *[p for p in defaults if os.path.exists(p)]]))
    jump = opts.get("proxyjump", "")
    hops: tuple[str, ...] = ()
    if jump and jump.lower() != "none" and not _hop:
        hops = tuple(h.strip() for h in jump.split(",") if h.strip())
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


def _yes(value) -> bool:
    return str(value or "").lower() in ("yes", "true", "on")


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
    key_b64: str


def known_keys(target: SshTarget) -> list[KnownKey]:
    """Every key filed for the target in its known_hosts files (hashed entries included)."""
    import paramiko
    from paramiko.hostkeys import HostKeys

    name = target.known_hosts_name
    found: list[KnownKey] = []
    for path in (*target.user_known_hosts, *target.global_known_hosts):
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = fh.readlines()
        except OSError:
            continue
        for lineno, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#") or line.startswith("@"):
                continue  # markers (@cert-authority, @revoked) are not host keys
            fields = line.split()
            if len(fields) < 3:
                continue
            hosts, keytype, key_b64 = fields[0].split(","), fields[1], fields[2]
            for pattern in hosts:
                if pattern.startswith("|1|"):
                    try:
                        salt = pattern.split("|")[2]
                        hit = HostKeys.hash_host(name, salt) == pattern
                    except (IndexError, ValueError, paramiko.SSHException):
                        hit = False
                else:
                    hit = pattern == name
                if hit:
                    found.append(KnownKey(path, lineno, keytype, key_b64))
                    break
    return found


def add_known_host(target: SshTarget, keytype: str, key_b64: str) -> str:
    """Append the host's key to the first user known_hosts file (created 0600); its path."""
    if not target.user_known_hosts:
        raise TransportError(
            f"cannot save the host key of {target.known_hosts_name}: UserKnownHostsFile is none",
            "set UserKnownHostsFile in ~/.ssh/config",
        )
    path = target.user_known_hosts[0]
    parent = os.path.dirname(path) or "."
    try:
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o700, exist_ok=True)
        needs_newline = False
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                needs_newline = fh.read(1) != b"\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(("\n" if needs_newline else "") + f"{target.known_hosts_name} {keytype} {key_b64}\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise TransportError(f"cannot save the host key to {path}: {exc.strerror or exc}", "check the file's permissions") from None
    return path
