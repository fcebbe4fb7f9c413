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
* **Files** go over SFTP (``sftp.SftpFiles``): pipelined writes to a temp name beside the
  target, hashed on the device, then ``posix-rename``d into place; resumable. Connecting and
  authenticating is ``sshconnect.SshConnector``. Every channel has a timeout: a stalled link (a pulled cable raises nothing and keeps
  paramiko's ``is_active()`` True) fails after ``idle_timeout`` seconds of no progress.
* **Failures** are typed: ``LinkError`` (dropped, stalled, refused, unreachable: retrying may
  help, and the connection is re-opened on next use) or ``TransportError`` (DNS, auth, host
  key, missing program, full disk: retrying will not).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import select
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from edgekit.errors import LinkError, TransportError, UsageError
from edgekit.transport.base import CommandResult, Conversation, Transport, timed_out
from edgekit.transport.sftp import SftpFiles
from edgekit.transport.sshconfig import SshTarget, resolve_target
from edgekit.transport.sshconnect import SshConnector

# paramiko logs its own view of every failure (with tracebacks) to the "paramiko" logger;
# without a handler, Python's last-resort handler prints them to stderr. Our typed errors say
# it once: keep its chatter out unless the application configures logging.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

DEFAULT_IDLE_TIMEOUT = 60.0  # no progress on a transfer or a command's link for this long: give up
ALIVE_INTERVAL = 15.0  # a command silent this long: check the link still answers
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

class SshTransport(Transport):
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
        ssh_config: Any = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.device = device
        # None: OpenSSH's own resolution (``ssh -G``) where an ssh client is installed, else ~/.ssh/config parsed
        config = ssh_config
        self.target: SshTarget = resolve_target(device, config)
        self.name = f"ssh:{self.target.display}"
        self.python = python
        self._workdir = workdir
        self.connect_timeout = connect_timeout if connect_timeout is not None else self.target.connect_timeout
        self.idle_timeout = idle_timeout
        self._connector = SshConnector(config, self.connect_timeout, trust_new_host, password, log or (lambda message: None))
        self._transport = None  # paramiko.Transport
        self._hops: list[Any] = []  # jump-host transports, outermost first
        self.files = SftpFiles(self)
        # the Transport's file operations are the SFTP half's own (same signatures)
        self._put, self.get, self.sha256, self.mkdir = self.files.put, self.files.get, self.files.sha256, self.files.mkdir
        self._root: str | None = None
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
            self._transport = self._connector.open(self.target, self._hops)
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

    # -- dropping ----------------------------------------------------------------------------
    def _drop(self) -> None:
        """Forget the connection (it is re-opened on next use)."""
        sftp, t, hops = self.files.detach(), self._transport, self._hops
        self._transport, self._hops = None, []
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
    def _run(self, argv: tuple[str, ...], *, timeout: float, cwd: str | None, env: Mapping[str, str] | None) -> CommandResult:
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
        try:
            with self._activity():
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
                        raise timed_out(timeout, display)
                    if not t.is_active():
                        raise self._lost(f"running {display}", EOFError("the server closed the connection"))
                    if now - last >= ALIVE_INTERVAL:
                        self._ping(t, f"running {display}")
                        last = time.monotonic()
                    select.select([fd], [], [], min(deadline - now, ALIVE_INTERVAL, 1.0))
                if not chan.status_event.wait(max(0.0, min(deadline - time.monotonic(), self.idle_timeout))):
                    self._kill(pid)
                    raise TransportError(f"command timed out after {timeout:g}s: {display}", "allow more time")
                sig = getattr(chan, "_edgekit_signal", None)
                code = -sig if sig is not None else chan.exit_status
        except (paramiko.SSHException, EOFError, TimeoutError, ConnectionError) as exc:
            raise self._lost(f"running {display}", exc) from None
        finally:
            with contextlib.suppress(Exception):
                chan.close()
        return CommandResult(tuple(argv), code, bytes(out), bytes(err), time.monotonic() - start)

    def converse(self, argv: Sequence[str]) -> Conversation | None:
        import paramiko

        argv = tuple(argv)
        wrapped = ["sh", "-c", WRAPPER, "sh", self._ensure_root(), "--", *argv]
        t = self.connect()
        try:
            chan = t.open_session(timeout=self.connect_timeout)
            chan.exec_command(shlex.join(wrapped))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise self._lost(f"starting {shlex.join(argv)}", exc) from None
        return _SshConversation(self, argv, chan)

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

    # -- helpers ---------------------------------------------------------------------------
    def _abs(self, remote: str) -> str:
        remote = os.fspath(remote)
        if remote.startswith("/"):
            return posixpath.normpath(remote)
        return posixpath.normpath(posixpath.join(self.root, remote))

    def __repr__(self) -> str:
        return f"SshTransport({self.device!r} -> {self.target.display})"


class _SshConversation(Conversation):
    """A command kept open on one SSH channel; the wrapper's first stdout line is its PID."""

    def __init__(self, owner: SshTransport, argv: tuple[str, ...], chan) -> None:
        super().__init__(argv)
        self._owner, self._chan = owner, chan
        self._pid: int | None = None
        self._last = time.monotonic()

    def _send(self, data: bytes) -> None:
        self._chan.sendall(data)

    def _poll(self, timeout: float) -> tuple[bytes, bytes, bool]:
        import paramiko

        owner, chan, what = self._owner, self._chan, f"running {shlex.join(self.argv)}"
        out, err = bytearray(), bytearray()
        try:
            select.select([chan.fileno()], [], [], min(timeout, ALIVE_INTERVAL))
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise owner._lost(what, exc) from None
        if self._pid is None and b"\n" in out:
            line, _, rest = bytes(out).partition(b"\n")
            out = bytearray(rest)
            with contextlib.suppress(ValueError):
                self._pid = int(line)
        now = time.monotonic()
        if out or err:
            self._last = now
        elif now - self._last >= ALIVE_INTERVAL:
            owner._ping(owner.connect(), what)
            self._last = time.monotonic()
        owner.beat()
        ended = chan.closed or (chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready())
        return bytes(out), bytes(err), ended

    def _wait(self) -> int:
        # a channel closed under us (the connection dropped) will never get a status
        if not self._chan.status_event.wait(2.0 if self._chan.closed else self._owner.idle_timeout):
            return self._kill()
        sig = getattr(self._chan, "_edgekit_signal", None)
        code = -sig if sig is not None else self._chan.exit_status
        with contextlib.suppress(Exception):
            self._chan.close()
        return code

    def _kill(self) -> int:
        with contextlib.suppress(Exception):
            self._chan.shutdown_write()  # EOF: the server's loop ends
        if not self._chan.status_event.wait(2.0):
            self._owner._kill(self._pid)
        code = self._chan.exit_status if self._chan.status_event.is_set() else -9
        with contextlib.suppress(Exception):
            self._chan.close()
        return code
