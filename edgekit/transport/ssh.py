"""The SSH device: the Transport protocol over paramiko, the same contract as ``local``.

* **Lazy.** Nothing touches the network until the first command or file operation; the
  device's root (``~/.edgekit`` by default, ``~`` expanded on the device) is resolved then.
* **Config and keys.** ``~/.ssh/config`` is honoured (see ``sshconfig``), keys come from the
  ssh-agent and the identity files; a password is used only when one is passed explicitly.
* **Host keys.** Checked against known_hosts (user and system files, hashed entries too). An
  unknown host is refused unless ``trust_new_host`` (then its key is appended, like OpenSSH's
  ``StrictHostKeyChecking=accept-new``); a changed key is always refused, naming the file line.
* **Commands** are argv lists joined with ``shlex.join`` and run by a fixed ``sh`` wrapper that
  gets the working directory and the environment as *arguments* (never pasted into script
  text), reports its PID, and ``exec``s the command. On timeout the command's process group
  is killed on the device. A death by signal comes back as a negative return code.
* **Files** go over SFTP with pipelined writes to a temp name in the target directory, are
  hashed on the device (``sha256sum``, else the device's Python), then ``posix-rename``d into
  place. Every channel has a timeout: a stalled link (a pulled cable raises nothing and keeps
  paramiko's ``is_active()`` True) fails after ``idle_timeout`` seconds of no progress.
* **Failures** are typed: ``LinkError`` (dropped, stalled, refused, unreachable: retrying may
  help, and the connection is re-opened on next use) or ``TransportError`` (DNS, auth, host
  key, missing program, full disk: retrying will not).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import logging
import os
import posixpath
import select
import shlex
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgekit.errors import DeviceError, LinkError, TransportError, UsageError
from edgekit.fsutil import atomic_path, sha256_file
from edgekit.transport.base import CommandResult, PutProgress, PutStats, part_name, prefix_sha256
from edgekit.transport.sshconfig import (
    SshTarget,
    add_known_host,
    host_key_known,
    known_keys,
    load_config,
    resolve_target,
)

# paramiko logs its own view of every failure (with tracebacks) to the "paramiko" logger;
# without a handler, Python's last-resort handler prints them to stderr. Our typed errors say
# it once: keep its chatter out unless the application configures logging.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

DEFAULT_IDLE_TIMEOUT = 60.0  # no progress on a transfer or a command's link for this long: give up
ALIVE_INTERVAL = 15.0  # a command silent this long: check the link still answers
WINDOW_SIZE = 8 * 1024 * 1024
BLOCK = 256 * 1024  # local read size for uploads (SFTP splits it into 32 KiB requests)
_ENV_NAME = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_0123456789")

# The command wrapper. Its text is constant: the working directory, the environment and the
# command arrive as positional parameters ("$1"...), so no user string is ever parsed as
# shell code. It prints its PID (kept by `exec`, so it is the command's PID) as line one.
_NODIR, _NOTFOUND, _NOEXEC = "@@edgekit:nodir@@", "@@edgekit:notfound@@", "@@edgekit:noexec@@"
WRAPPER = f"""printf '%s\\n' "$$"
cd "$1" 2>/dev/null || {{ printf '%s\\n' '{_NODIR}' >&2; exit 126; }}
shift
while [ "$1" != "--" ]; do export "$1"; shift; done
shift
case "$1" in
  */*) if [ ! -e "$1" ]; then printf '%s\\n' '{_NOTFOUND}' >&2; exit 127; fi
       if [ -d "$1" ] || [ ! -x "$1" ]; then printf '%s\\n' '{_NOEXEC}' >&2; exit 126; fi ;;
  *) command -v "$1" >/dev/null 2>&1 || {{ printf '%s\\n' '{_NOTFOUND}' >&2; exit 127; }} ;;
esac
exec "$@"
"""

# Kill a wrapped command and its process group (the group is the command's own, or the login
# shell's when that shell forked instead of exec'ing). Argument: the PID the wrapper printed.
KILLER = """s=$(cat "/proc/$1/stat" 2>/dev/null) || { kill -KILL "$1" 2>/dev/null; exit 0; }
pid=$1
s=${s##*") "}
set -- $s
if [ "$3" = "$pid" ] || [ "$3" = "$2" ]; then kill -KILL "-$3" 2>/dev/null; fi
kill -KILL "$pid" 2>/dev/null
exit 0
"""

# sha256 of "$1": prints the hex digest, "missing" (exit 0) or "notfile" (exit 3). For big files
# ("$3" = py) the device's Python ("$2", without site: it starts in milliseconds) goes first:
# hashlib uses OpenSSL, 2-5x faster than coreutils where the CPU has SHA instructions. Small
# files, or no Python: sha256sum (on stdin: it escapes odd file names in its output).
_HASH_PY = "import hashlib,sys\nh=hashlib.sha256()\nf=open(sys.argv[1],'rb')\nfor b in iter(lambda: f.read(1<<20), b''): h.update(b)\nprint(h.hexdigest())"
HASHER = f"""if [ ! -e "$1" ]; then echo missing; exit 0; fi
if [ ! -f "$1" ]; then echo notfile; exit 3; fi
if [ "$3" = py ] && command -v "$2" >/dev/null 2>&1; then exec "$2" -S -c {shlex.quote(_HASH_PY)} "$1"; fi
if command -v sha256sum >/dev/null 2>&1; then exec sha256sum < "$1"; fi
exec "$2" -S -c {shlex.quote(_HASH_PY)} "$1"
"""
PY_HASH_MIN = 4 << 20  # from this size on, hash with the device's Python first

# A big upload is hashed on the device *while* it arrives: this follower (the device's Python,
# started right after the temp file is opened) reads the file as it grows, up to the expected
# size, and prints the digest; so the check costs no second pass after the transfer. It gives
# up after "$4" seconds without growth (a dead upload). No Python: exit 127, hash afterwards.
_FOLLOW_PY = """import hashlib, sys, time
path, size, idle = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
h, done, last, nap = hashlib.sha256(), 0, time.time(), 0.001
with open(path, "rb") as f:
    while done < size:
        b = f.read(min(1 << 20, size - done))
        if b:
            h.update(b)
            done += len(b)
            last, nap = time.time(), 0.001
            continue
        if time.time() - last > idle:
            print("stalled %d" % done)
            sys.exit(4)
        time.sleep(nap)
        nap = min(nap * 2, 0.02)
print(h.hexdigest())
"""
FOLLOWER = f"""command -v "$1" >/dev/null 2>&1 || exit 127
exec "$1" -S -c {shlex.quote(_FOLLOW_PY)} "$2" "$3" "$4"
"""

# Free bytes (POSIX df, 1024-byte blocks) in the file system holding "$1".
DF = """df -Pk "$1" 2>/dev/null | awk 'NR==2 {print $4 * 1024}'"""


class SshTransport:
    """A device reached over SSH. Construct with ``open_transport`` (or directly, for tests)."""

    def __init__(
        self,
        device: str,
        *,
        workdir: str = "~/.edgekit",
        python: str = "python3",
        trust_new_host: bool = False,
        password: str | None = None,
        connect_timeout: float | None = None,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        alive_interval: float = ALIVE_INTERVAL,
        ssh_config: Any = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.device = device
        self._config = ssh_config if ssh_config is not None else load_config()
        self.target: SshTarget = resolve_target(device, self._config)
        self.name = f"ssh:{self.target.display}"
        self.python = python
        self._workdir = workdir
        self._trust_new_host = trust_new_host
        self._password = password
        self.connect_timeout = connect_timeout if connect_timeout is not None else self.target.connect_timeout
        self.idle_timeout = idle_timeout
        self.alive_interval = alive_interval
        self._log = log or (lambda message: None)
        self._transport = None  # paramiko.Transport
        self._hops: list[Any] = []  # jump-host transports, outermost first
        self._sftp = None
        self._root: str | None = None
        self._root_ready = False
        self._lock = threading.RLock()
        self.connects = 0  # how many times a connection was opened (reconnects included)
        # The watchdog: paramiko can block for ever in a socket write when the peer stops
        # reading (it retries send timeouts), so an operation with no progress for
        # idle_timeout gets its connection closed from outside; the operation then fails.
        self._busy = 0
        self._beat = time.monotonic()
        self._stalled = False
        self._watch_stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    # == connection ===========================================================================
    @property
    def root(self) -> str:
        """edgekit's directory on the device (connects to expand ``~``)."""
        if self._root is None:
            self._root = self._resolve_root()
        return self._root

    def _resolve_root(self) -> str:
        wd = self._workdir
        if wd.startswith("/"):
            return posixpath.normpath(wd)
        if wd == "~" or wd.startswith("~/"):
            out = self._exec(["sh", "-c", 'printf "%s" "$HOME"'], timeout=self.connect_timeout + 30)
            home = out.stdout.decode("utf-8", errors="replace").strip()
            if out.returncode != 0 or not home.startswith("/"):
                raise TransportError(
                    f"cannot find the home directory of {self.target.user} on {self.target.hostname}",
                    "set an absolute workdir in the target profile (workdir = \"/path/on/device\")",
                )
            return posixpath.normpath(home + wd[1:])
        raise UsageError(
            f"the profile's workdir {wd!r} is neither absolute nor under ~",
            'use workdir = "~/.edgekit" or an absolute path on the device',
        )

    def connect(self):
        """Open the connection now (normally it opens on first use); the paramiko Transport."""
        with self._lock:
            if self._transport is not None and self._transport.is_active():
                return self._transport
            self._drop()
            self._stalled = False
            self._transport = self._open(self.target, self._hops)
            self.connects += 1
            if self._watchdog is None or not self._watchdog.is_alive():
                self._watch_stop.clear()
                self._watchdog = threading.Thread(target=self._watch, name=f"edgekit-ssh-watchdog {self.target.display}", daemon=True)
                self._watchdog.start()
            return self._transport

    def _watch(self) -> None:
        while not self._watch_stop.wait(min(1.0, self.idle_timeout / 4)):
            t = self._transport
            if t is None or not self._busy or time.monotonic() - self._beat <= self.idle_timeout + 1.0:
                continue
            self._stalled = True
            with contextlib.suppress(Exception):
                t.close()  # unblocks the stuck operation with EOFError / SSHException

    @contextlib.contextmanager
    def _activity(self):
        """Mark an operation in flight for the watchdog; ``beat()`` inside it on progress."""
        self._busy += 1
        self._beat = time.monotonic()
        try:
            yield
        finally:
            self._busy -= 1

    def beat(self) -> None:
        self._beat = time.monotonic()

    def _open(self, target: SshTarget, hops: list, sock: Any = None):
        """An authenticated paramiko Transport to ``target`` (over ``sock`` when given)."""
        import paramiko

        if sock is None and target.proxy_jump:
            sock = self._through_jumps(target, hops)
        elif sock is None and target.proxy_command:
            try:
                sock = paramiko.ProxyCommand(target.proxy_command)
            except Exception as exc:
                raise TransportError(f"ProxyCommand for {target.alias} failed to start: {exc}", "check ProxyCommand in ~/.ssh/config") from None
        elif sock is None:
            sock = self._tcp(target)
        t = paramiko.Transport(sock, default_window_size=WINDOW_SIZE)
        t.banner_timeout = t.handshake_timeout = t.auth_timeout = self.connect_timeout
        _prefer_fast_ciphers(t)
        _catch_exit_signals(t)
        known = known_keys(target)
        if known:  # ask for a key type we can check (as OpenSSH orders HostKeyAlgorithms)
            opts = t.get_security_options()
            first = [k.keytype for k in known if k.keytype in opts.key_types]
            opts.key_types = tuple(dict.fromkeys([*first, *opts.key_types]))
        try:
            try:
                t.start_client(timeout=self.connect_timeout)
            except paramiko.SSHException as exc:
                if "banner" in str(exc).lower():
                    raise TransportError(
                        f"{target.hostname}:{target.port} did not answer as an SSH server ({exc})",
                        "check the port (Port in ~/.ssh/config, or user@host:PORT) and that sshd runs there",
                    ) from None
                raise LinkError(
                    f"the SSH handshake with {target.display} failed: {exc}",
                    "check the network to the device; edgekit retries pushes on their own",
                ) from None
            except (EOFError, OSError) as exc:
                raise LinkError(f"the connection to {target.display} dropped during the handshake: {exc}", "retry; check the network") from None
            try:
                server_key = t.get_remote_server_key()
            except paramiko.SSHException:  # start_client gave up waiting: no handshake in time
                if not getattr(t, "remote_version", ""):
                    raise TransportError(
                        f"{target.hostname}:{target.port} did not answer as an SSH server (no SSH banner within {self.connect_timeout:g}s)",
                        "check the port (Port in ~/.ssh/config, or user@host:PORT) and that sshd runs there",
                    ) from None
                raise LinkError(
                    f"the SSH handshake with {target.display} did not finish within {self.connect_timeout:g}s",
                    "the device or the network is very slow; raise ConnectTimeout in ~/.ssh/config",
                ) from None
            self._check_host_key(target, server_key, known)
            self._authenticate(target, t)
            t.set_keepalive(30)
        except BaseException:
            t.close()
            raise
        return t

    def _tcp(self, target: SshTarget) -> socket.socket:
        where = f"{target.hostname}:{target.port}"
        try:
            sock = socket.create_connection((target.hostname, target.port), timeout=self.connect_timeout)
        except socket.gaierror as exc:
            raise TransportError(
                f"cannot resolve host name '{target.hostname}' ({exc.strerror})",
                f"check the spelling, DNS, or add a Host {target.alias} block with HostName to ~/.ssh/config",
            ) from None
        except ConnectionRefusedError:
            raise LinkError(f"connection refused by {where}", "is sshd running on the device, and is the port right?") from None
        except TimeoutError:
            raise LinkError(
                f"timed out connecting to {where} after {self.connect_timeout:g}s",
                "the device is off, unreachable, or a firewall drops SSH; check the address and the network",
            ) from None
        except OSError as exc:
            if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN):
                raise LinkError(f"cannot reach {where}: {exc.strerror}", "check the address, the cable and the route to the device") from None
            raise LinkError(f"cannot connect to {where}: {exc.strerror or exc}", "check the address and the network") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _through_jumps(self, target: SshTarget, hops: list):
        """A direct-tcpip channel to ``target`` through its ProxyJump chain (hops appended to ``hops``)."""
        import paramiko

        chain = [resolve_target(spec, self._config, _hop=True) for spec in target.proxy_jump]
        via = None
        for hop in [*chain, target]:
            if via is None:
                t = self._open(hop, hops)
            else:
                try:
                    chan = via.open_channel("direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=self.connect_timeout)
                except paramiko.ChannelException as exc:
                    raise LinkError(
                        f"the jump host could not open a connection to {hop.hostname}:{hop.port}: {exc.text or exc}",
                        "check HostName/Port as the jump host sees them, and AllowTcpForwarding on the jump host",
                    ) from None
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    raise LinkError(f"the jump host connection failed: {exc}", "retry; check the jump host") from None
                if hop is target:
                    return chan
                t = self._open(hop, hops, sock=chan)
            hops.append(t)
            via = t
        raise AssertionError("unreachable")

    # -- host keys --------------------------------------------------------------------------
    def _check_host_key(self, target: SshTarget, key, known) -> None:
        keytype, key_b64 = key.get_name(), key.get_base64()
        if host_key_known(target, keytype, key_b64):  # raises when the key is @revoked
            return
        fingerprint = "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
        name = target.known_hosts_name
        same_type = [k for k in known if k.keytype == keytype]
        if any(k.key_b64 == key_b64 for k in same_type):
            return
        if same_type or known:
            k = (same_type or known)[0]
            raise TransportError(
                f"the host key of {name} has CHANGED: it now offers {keytype} {fingerprint}, "
                f"but {k.path} line {k.lineno} holds a different key; refusing to connect",
                f"if the device was reinstalled, remove the old key (ssh-keygen -f {shlex.quote(k.path)} -R {shlex.quote(name)}) "
                "and connect again with --trust-new-host; otherwise someone may be intercepting the connection",
            )
        trust = self._trust_new_host or target.strict_host_key_checking == "accept-new"
        if not trust:
            raise TransportError(
                f"{name} is not a known host (its {keytype} key is {fingerprint})",
                "check the fingerprint on the device (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
                "then pass --trust-new-host once to save it to ~/.ssh/known_hosts",
            )
        path = add_known_host(target, keytype, key_b64)
        self._log(f"trusted new host {name} ({keytype} {fingerprint}); saved to {path}")

    # -- authentication ----------------------------------------------------------------------
    def _authenticate(self, target: SshTarget, t) -> None:
        import paramiko

        tried: list[str] = []
        notes: list[str] = []
        allowed: list[str] | None = None

        def attempt(label: str, key) -> bool:
            nonlocal allowed
            try:
                rest = t.auth_publickey(target.user, key)
            except paramiko.BadAuthenticationType as exc:
                allowed = list(exc.allowed_types)
                return False
            except paramiko.AuthenticationException:
                tried.append(label)
                return False
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise LinkError(f"the connection to {target.display} dropped during authentication: {exc}", "retry") from None
            if rest:
                notes.append(f"the server wants more after the key ({', '.join(rest)})")
                return False
            return True

        agent = None
        try:
            if os.environ.get("SSH_AUTH_SOCK"):
                try:
                    agent = paramiko.Agent()
                    agent_keys = list(agent.get_keys())
                except Exception:  # an unreachable agent is no reason to fail: keys may be on disk
                    agent_keys = []
                wanted = _fingerprints(target.identity_files) if target.identities_only else None
                for key in agent_keys:
                    if wanted is not None and key.get_fingerprint() not in wanted:
                        continue
                    if attempt(f"agent key {key.get_name()}", key):
                        return
                    if allowed is not None and "publickey" not in allowed:
                        break
            for path in target.identity_files:
                if allowed is not None and "publickey" not in allowed:
                    break
                if not os.path.exists(path):
                    notes.append(f"IdentityFile {path} does not exist")
                    continue
                try:
                    key = paramiko.PKey.from_path(path)
                except paramiko.PasswordRequiredException:
                    notes.append(f"{path} is passphrase-protected (add it to ssh-agent: ssh-add {shlex.quote(path)})")
                    continue
                except Exception as exc:
                    notes.append(f"cannot read key {path}: {exc}")
                    continue
                if attempt(path, key):
                    return
            if self._password is not None:
                try:
                    t.auth_password(target.user, self._password)
                    return
                except paramiko.BadAuthenticationType as exc:
                    if "keyboard-interactive" in exc.allowed_types:
                        with contextlib.suppress(paramiko.AuthenticationException):
                            t.auth_interactive(target.user, lambda title, instr, prompts: [self._password] * len(prompts))
                            return
                    tried.append("password (not allowed by the server)")
                except paramiko.AuthenticationException:
                    tried.append("password")
        finally:
            if agent is not None:
                agent.close()
        what = ", ".join(tried) if tried else "no keys (none in ssh-agent, no identity files)"
        extra = f"; {'; '.join(notes)}" if notes else ""
        if allowed is not None:
            extra += f"; the server allows: {', '.join(allowed)}"
        raise TransportError(
            f"authentication failed for {target.user}@{target.hostname}:{target.port} (tried {what}){extra}",
            f"install your public key on the device (ssh-copy-id -p {target.port} {target.user}@{target.hostname}) "
            "or set IdentityFile for it in ~/.ssh/config; password login needs --password",
        )

    # -- dropping ----------------------------------------------------------------------------
    def _drop(self) -> None:
        """Forget the connection (it is re-opened on next use)."""
        sftp, t, hops = self._sftp, self._transport, self._hops
        self._sftp, self._transport, self._hops = None, None, []
        for closeable in (sftp, t, *reversed(hops)):
            if closeable is not None:
                with contextlib.suppress(Exception):
                    closeable.close()

    def close(self) -> None:
        with self._lock:
            self._drop()
        self._watch_stop.set()

    def _lost(self, what: str, exc: BaseException) -> LinkError:
        self._drop()
        stalled = isinstance(exc, TimeoutError) or self._stalled
        detail = f"no progress for {self.idle_timeout:g}s" if stalled else (str(exc) or type(exc).__name__)
        return LinkError(
            f"lost the connection to {self.target.display} while {what} ({detail})",
            "check the network to the device; the next command reconnects, and pushes resume where they stopped",
        )

    # == commands ==============================================================================
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 600.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> CommandResult:
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of arguments, not a shell string")
        argv = tuple(os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in argv)
        if not argv:
            raise TransportError("empty command", "pass the program and its arguments as a list")
        command = shlex.join(argv)
        pairs = []
        for key, value in (env or {}).items():
            if not key or key[0].isdigit() or not set(key) <= _ENV_NAME:
                raise UsageError(f"environment variable name {key!r} is not valid", "use letters, digits and _ (not first)")
            pairs.append(f"{key}={value}")
        workdir = self._abs(cwd) if cwd is not None else self._ensure_root()
        wrapped = ["sh", "-c", WRAPPER, "sh", workdir, *pairs, "--", *argv]
        result = self._exec(wrapped, timeout=timeout, display=command, report_pid=True)
        result = CommandResult(argv, result.returncode, result.stdout, result.stderr, result.duration_s)
        marker = result.stderr.rstrip().rsplit(b"\n", 1)[-1].decode("utf-8", errors="replace") if result.stderr else ""
        if result.returncode == 126 and marker == _NODIR:
            raise TransportError(f"working directory does not exist on the device: {workdir}", "create it first")
        if result.returncode == 127 and marker == _NOTFOUND:
            if argv[0] == self.python:
                raise TransportError(
                    f"Python was not found on the device {self.target.hostname}: {argv[0]}",
                    'install python3 (3.7 or newer) on the device, or set python = "/path/to/python3" in the target profile',
                )
            raise TransportError(f"command not found on the device: {argv[0]}", f"install it or use its full path ({command})")
        if result.returncode == 126 and marker == _NOEXEC:
            raise TransportError(f"cannot execute {argv[0]} on the device: permission denied", "check the file's mode")
        if check and result.returncode != 0:
            tail = result.stderr_tail()
            raise TransportError(
                f"command failed with exit code {result.returncode}: {command}" + (f": {tail}" if tail else ""),
                "run the command by hand on the device to see its full output",
            )
        return result

    def _exec(self, argv: Sequence[str], *, timeout: float, display: str | None = None, report_pid: bool = False) -> CommandResult:
        """Run a command line built from ``argv`` (``shlex.join``) and collect its output."""
        import paramiko

        command = shlex.join(argv)
        display = display or command
        start = time.monotonic()
        deadline = start + timeout
        t = self.connect()
        try:
            chan = t.open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise self._lost(f"starting {display}", exc) from None
        out, err = bytearray(), bytearray()
        pid: int | None = None
        activity = self._activity()
        activity.__enter__()
        try:
            chan.exec_command(command)
            chan.shutdown_write()  # stdin: nothing (like /dev/null)
            fd = chan.fileno()
            last = time.monotonic()
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if report_pid and pid is None and b"\n" in out:
                    line, _, rest = bytes(out).partition(b"\n")
                    out = bytearray(rest)
                    with contextlib.suppress(ValueError):
                        pid = int(line)
                now = time.monotonic()
                if got:
                    last = now
                self.beat()  # the loop itself is alive; the link is checked by _ping
                if chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if now >= deadline:
                    self._kill(pid)
                    raise TransportError(
                        f"command timed out after {timeout:g}s: {display}",
                        "the device may be overloaded or the command stuck; allow more time or do less per run",
                    )
                if not t.is_active():
                    raise self._lost(f"running {display}", EOFError("the server closed the connection"))
                if now - last >= self.alive_interval:
                    self._ping(t, f"running {display}")
                    last = time.monotonic()
                select.select([fd], [], [], min(deadline - now, self.alive_interval, 1.0))
            if not chan.status_event.wait(max(0.0, min(deadline - time.monotonic(), self.idle_timeout))):
                self._kill(pid)
                raise TransportError(f"command timed out after {timeout:g}s: {display}", "allow more time")
            code = chan.exit_status
            sig = getattr(chan, "_edgekit_signal", None)
            if sig is not None:
                code = -sig
        except (paramiko.SSHException, EOFError, TimeoutError, ConnectionError) as exc:
            raise self._lost(f"running {display}", exc) from None
        finally:
            activity.__exit__(None, None, None)
            with contextlib.suppress(Exception):
                chan.close()
        return CommandResult(tuple(argv), code, bytes(out), bytes(err), time.monotonic() - start)

    def _ping(self, t, what: str) -> None:
        """Open and close a channel: a link that cannot do that within idle_timeout is dead."""
        import paramiko

        try:
            chan = t.open_session(timeout=self.idle_timeout)
            chan.close()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise self._lost(what, exc) from None

    def _kill(self, pid: int | None) -> None:
        if pid is None or self._transport is None:
            return
        with contextlib.suppress(Exception):
            self._exec(["sh", "-c", KILLER, "sh", str(pid)], timeout=min(30.0, self.idle_timeout))

    # == files ===================================================================================
    def _sftp_client(self):
        import paramiko

        with self._lock:
            if self._sftp is not None and self._transport is not None and self._transport.is_active():
                return self._sftp
            t = self.connect()
            try:
                sftp = paramiko.SFTPClient.from_transport(t, window_size=WINDOW_SIZE)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise self._lost("opening SFTP", exc) from None
            if sftp is None:
                raise TransportError(f"{self.target.display} refused the SFTP subsystem", "enable 'Subsystem sftp' in the device's sshd_config")
            sftp.get_channel().settimeout(self.idle_timeout)
            self._sftp = sftp
            return sftp

    @contextlib.contextmanager
    def _sftp_op(self, what: str):
        """Map paramiko's link failures to LinkError (and drop the connection)."""
        try:
            yield
        except (EOFError, OSError, Exception) as exc:
            if isinstance(exc, TransportError) or not self._is_link_failure(exc):
                raise
            raise self._lost(what, exc) from None

    def _is_link_failure(self, exc: BaseException) -> bool:
        """Did ``exc`` come from the link (as opposed to an SFTP status like "no such file")?"""
        import paramiko

        if isinstance(exc, (paramiko.SSHException, EOFError, TimeoutError, ConnectionError)):
            return True
        if isinstance(exc, OSError) and exc.errno is None:  # paramiko's "Socket is closed" and friends
            t, sftp = self._transport, self._sftp
            chan = sftp.get_channel() if sftp is not None else None
            return t is None or not t.is_active() or (chan is not None and chan.closed) or self._stalled
        return False

    def put(
        self,
        local: Path,
        remote: str,
        *,
        sha256: str | None = None,
        resume: bool = False,
        progress: PutProgress | None = None,
    ) -> PutStats:
        local = Path(local)
        if not local.is_file():
            raise TransportError(f"cannot upload {local}: no such file", "check the local path")
        dest = self._abs(remote)
        parent = posixpath.dirname(dest)
        size = local.stat().st_size
        digest = sha256 or sha256_file(local)
        tmp = part_name(dest, digest, resume)
        sftp = self._sftp_client()
        offset = 0
        with self._sftp_op(f"uploading {local.name}"):
            self._check_upload_target(sftp, dest, parent)
            if resume:
                with contextlib.suppress(FileNotFoundError):
                    offset = sftp.stat(tmp).st_size or 0
        # what a dropped link left is kept only when the device's hash of it is the local prefix
        if not 0 < offset <= size or self._hash(tmp, offset) != prefix_sha256(local, offset):
            offset = 0
        sent = 0
        resumed_from = offset
        if offset and progress is not None:
            progress(0, offset)
        follower: dict[str, Any] = {}

        def start_follower() -> None:
            follower["chan"] = self._start_follower(tmp, size)

        for _attempt in range(2):
            follower.clear()
            try:
                sent += self._send(sftp, local, tmp, offset, size, progress, opened=start_follower if size >= PY_HASH_MIN else None)
            except BaseException as exc:
                if follower.get("chan") is not None:
                    with contextlib.suppress(Exception):
                        follower["chan"].close()
                if not resume and not isinstance(exc, LinkError):
                    self._remove_quietly(tmp)
                raise  # a LinkError leaves the temp file: a resumable upload continues from it
            got = self._finish_follower(follower["chan"]) if follower.get("chan") is not None else None
            if got != digest:  # no follower, or it saw something else: hash the file as it is now
                got = self._hash(tmp, size)
            if got == digest:
                break
            if offset > 0:  # what was there before did not fit: start the file over once
                offset = 0
                continue
            self._diagnose_write_failure(tmp, parent, size)
            self._remove_quietly(tmp)
            raise TransportError(f"upload of {local} to {dest} arrived corrupted (sha256 {got} on the device)", "retry; check the device's storage")
        with self._sftp_op(f"renaming {tmp}"):
            try:
                sftp.chmod(tmp, 0o644)
                try:
                    sftp.posix_rename(tmp, dest)
                except OSError as exc:
                    if exc.errno is None and "not supported" in str(exc).lower():  # no posix-rename@openssh.com
                        with contextlib.suppress(FileNotFoundError):
                            sftp.remove(dest)
                        sftp.rename(tmp, dest)
                    else:
                        raise
            except OSError as exc:
                if self._is_link_failure(exc):
                    raise
                self._remove_quietly(tmp)
                raise TransportError(f"cannot move the upload into place at {dest}: {exc.strerror or exc}", "check permissions") from None
        return PutStats(sent, resumed_from)

    def _check_upload_target(self, sftp, dest: str, parent: str) -> None:
        import stat as stat_mod

        try:
            st = sftp.stat(dest)
        except FileNotFoundError:
            try:
                pst = sftp.stat(parent)
            except FileNotFoundError:
                raise TransportError(
                    f"cannot upload to {dest}: directory {parent} does not exist on the device",
                    "create it first (Transport.mkdir)",
                ) from None
            if not stat_mod.S_ISDIR(pst.st_mode or 0):
                raise TransportError(f"cannot upload to {dest}: {parent} is not a directory", "check the remote path") from None
            return
        if stat_mod.S_ISDIR(st.st_mode or 0):
            raise TransportError(f"cannot upload to {dest}: it is a directory", "give the file's full remote path")

    def _start_follower(self, tmp: str, size: int):
        """Start the device-side hasher that follows ``tmp`` as it grows (a channel, or None)."""
        import paramiko

        try:
            chan = self._transport.open_session(timeout=self.connect_timeout)
            chan.exec_command(shlex.join(["sh", "-c", FOLLOWER, "sh", self.python, tmp, str(size), f"{self.idle_timeout:g}"]))
            chan.shutdown_write()
            return chan
        except (paramiko.SSHException, EOFError, OSError, AttributeError):
            return None  # the upload itself will fail or succeed on its own; hash afterwards

    def _finish_follower(self, chan) -> str | None:
        """The follower's digest (None when it could not tell: no Python, stalled, too slow)."""
        out = bytearray()
        try:
            chan.settimeout(max(self.idle_timeout, 10.0))
            while True:
                data = chan.recv(4096)
                if not data:
                    break
                out += data
            text = out.decode("ascii", errors="replace").strip()
            return text if chan.recv_exit_status() == 0 and len(text) == 64 else None
        except Exception:
            return None
        finally:
            with contextlib.suppress(Exception):
                chan.close()

    def _send(self, sftp, local: Path, tmp: str, offset: int, size: int, progress, opened: Callable[[], None] | None = None) -> int:
        """Write ``local[offset:]`` to ``tmp`` at ``offset``; bytes sent. ``opened()`` runs once the file is open."""
        sent = 0
        with self._sftp_op(f"uploading {local.name}"), self._activity():
            try:
                fh = sftp.open(tmp, "r+" if offset else "w")
            except PermissionError:
                raise TransportError(f"cannot write {tmp} on the device: permission denied", "check the directory's owner and mode") from None
            except OSError as exc:
                self._diagnose_write_failure(tmp, posixpath.dirname(tmp), size - offset)
                raise TransportError(f"cannot write {tmp} on the device: {exc.strerror or exc}", "check free space and permissions") from None
            try:
                if opened is not None:
                    opened()
                fh.set_pipelined(True)
                if offset:
                    fh.seek(offset)
                with open(local, "rb") as src:
                    src.seek(offset)
                    while True:
                        block = src.read(BLOCK)
                        if not block:
                            break
                        fh.write(block)
                        sent += len(block)
                        self.beat()
                        if progress is not None:
                            progress(len(block), offset + sent)
                if offset + sent != size:
                    raise TransportError(f"{local} changed while it was being uploaded", "upload it again")
                self._fsync_remote(sftp, fh)
                fh.close()  # waits for the server's answer, which follows every write: the data is there
            except OSError as exc:
                if self._is_link_failure(exc):
                    raise
                self._diagnose_write_failure(tmp, posixpath.dirname(tmp), size - offset)
                raise TransportError(f"writing {tmp} on the device failed: {exc.strerror or exc}", "check free space on the device") from None
            finally:
                with contextlib.suppress(Exception):
                    fh.close()
            if self._transport is None or not self._transport.is_active() or self._stalled:
                raise EOFError("the connection closed during the upload")
        return sent

    def _fsync_remote(self, sftp, fh) -> None:
        """Flush, then fsync@openssh.com on the open handle when the server has it (OpenSSH does)."""
        from paramiko.sftp import CMD_EXTENDED

        fh.flush()
        try:
            sftp._request(CMD_EXTENDED, "fsync@openssh.com", fh.handle)
        except Exception as exc:
            if self._is_link_failure(exc):
                raise

    def _diagnose_write_failure(self, tmp: str, directory: str, needed: int) -> None:
        """A write failed or arrived short: raise DeviceError if the device's disk is full."""
        free = self.free_bytes(directory)
        if free is not None and free < max(needed, 1) + 64 * 1024:
            self._remove_quietly(tmp)
            raise DeviceError(
                f"the device's disk is full: {free // 1024} KiB free in {directory}, the upload needs {max(needed, 0) // 1024 + 1} KiB",
                f"free space on {self.target.hostname} (old bundles live under {self.root}/bundles and {self.root}/objects)",
            )

    def free_bytes(self, directory: str) -> int | None:
        """Free bytes for this user in the file system holding ``directory`` (None: unknown)."""
        with contextlib.suppress(TransportError):
            res = self._exec(["sh", "-c", DF, "sh", self._abs(directory)], timeout=min(60.0, self.idle_timeout))
            text = res.stdout.decode().strip()
            if res.returncode == 0 and text.isdigit():
                return int(text)
        return None

    def _remove_quietly(self, path: str) -> None:
        if self._sftp is None:
            return
        with contextlib.suppress(Exception):
            self._sftp.remove(path)

    def get(self, remote: str, local: Path) -> None:
        src = self._abs(remote)
        sftp = self._sftp_client()
        with self._sftp_op(f"downloading {src}"):
            try:
                sftp.stat(src)
            except FileNotFoundError:
                raise TransportError(f"cannot download {src}: no such file on the device", "check the remote path") from None
            with atomic_path(Path(local)) as tmp:
                try:
                    sftp.get(src, str(tmp))
                except OSError as exc:
                    if self._is_link_failure(exc):
                        raise
                    raise TransportError(f"cannot download {src}: {exc.strerror or exc}", "check the remote path and permissions") from None

    def sha256(self, remote: str) -> str | None:
        return self._hash(self._abs(remote))

    def _hash(self, path: str, size: int | None = None) -> str | None:
        prefer = "py" if size is not None and size >= PY_HASH_MIN else "sum"
        res = self._exec(["sh", "-c", HASHER, "sh", path, self.python, prefer], timeout=max(600.0, self.idle_timeout))
        text = res.stdout.decode("utf-8", errors="replace").strip()
        if res.returncode == 0 and text == "missing":
            return None
        if res.returncode == 3 and text == "notfile":
            raise TransportError(f"{path} on the device is not a file", "check the remote path")
        word = text.split()[0] if text else ""
        if res.returncode != 0 or len(word) != 64:
            tail = res.stderr_tail(2)
            raise TransportError(
                f"cannot hash {path} on the device (exit code {res.returncode}){': ' + tail if tail else ''}",
                f"the device needs sha256sum (coreutils) or Python ({self.python})",
            )
        return word.lower()

    def mkdir(self, remote: str) -> None:
        import stat as stat_mod

        path = self._abs(remote)
        sftp = self._sftp_client()
        with self._sftp_op(f"creating {path}"):
            missing = []
            probe = path
            while True:
                try:
                    st = sftp.stat(probe)
                except FileNotFoundError:
                    missing.append(probe)
                    parent = posixpath.dirname(probe)
                    if parent == probe:
                        break
                    probe = parent
                    continue
                except OSError as exc:
                    raise TransportError(f"cannot create directory {path}: {exc.strerror or exc}", "check permissions") from None
                if not stat_mod.S_ISDIR(st.st_mode or 0):
                    raise TransportError(f"cannot create directory {path}: a file is in the way ({probe})", "remove that file")
                break
            for d in reversed(missing):
                try:
                    sftp.mkdir(d, 0o755)
                except OSError as exc:
                    with contextlib.suppress(OSError):
                        if stat_mod.S_ISDIR(sftp.stat(d).st_mode or 0):
                            continue  # made meanwhile by someone else
                    raise TransportError(f"cannot create directory {d}: {exc.strerror or exc}", "check permissions") from None

    # -- helpers ---------------------------------------------------------------------------
    def _abs(self, remote: str) -> str:
        remote = os.fspath(remote)
        if remote.startswith("/"):
            return posixpath.normpath(remote)
        return posixpath.normpath(posixpath.join(self.root, remote))

    def _ensure_root(self) -> str:
        if not self._root_ready:
            self.mkdir(self.root)
            self._root_ready = True
        return self.root

    def __repr__(self) -> str:
        return f"SshTransport({self.device!r} -> {self.target.display})"


# -- paramiko tuning -----------------------------------------------------------------------------


def _prefer_fast_ciphers(t) -> None:
    """AES-GCM first (no separate MAC pass: the fastest paramiko cipher), then the defaults."""
    opts = t.get_security_options()
    fast = [c for c in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr") if c in opts.ciphers]
    opts.ciphers = tuple(dict.fromkeys([*fast, *opts.ciphers]))


def _catch_exit_signals(t) -> None:
    """Record "exit-signal" requests (paramiko ignores them) so a killed command reports -SIGNUM."""
    from paramiko.channel import Channel
    from paramiko.common import MSG_CHANNEL_REQUEST

    table = getattr(t, "_channel_handler_table", None)
    if not isinstance(table, dict) or MSG_CHANNEL_REQUEST not in table:
        return
    original = table[MSG_CHANNEL_REQUEST]

    def handle(chan: Channel, m) -> None:
        pos = m.packet.tell()
        try:
            kind = m.get_text()
            if kind == "exit-signal":
                m.get_boolean()  # want_reply
                name = m.get_text()
                chan._edgekit_signal = getattr(signal, f"SIG{name}", None) or getattr(signal, name, 0) or 0
                chan.exit_status = -int(chan._edgekit_signal)
                chan.status_event.set()
                return
        except Exception:
            pass
        m.packet.seek(pos)
        original(chan, m)

    t._channel_handler_table = {**table, MSG_CHANNEL_REQUEST: handle}


def _fingerprints(paths: Sequence[str]) -> set[bytes]:
    import paramiko

    out = set()
    for path in paths:
        pub = path + ".pub"
        with contextlib.suppress(Exception):
            blob = base64.b64decode(open(pub).read().split()[1])
            out.add(hashlib.md5(blob).digest())
        with contextlib.suppress(Exception):
            out.add(paramiko.PKey.from_path(path).get_fingerprint())
    return out
