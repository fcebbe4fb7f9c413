"""A real OpenSSH ``sshd`` on 127.0.0.1 (or inside a network namespace), owned by the tests.

Everything it needs lives in one temp directory: host key, client key, ``authorized_keys``,
``sshd_config``, pid file, log. It is started as ``sshd -D -e -f CONFIG`` (a plain process,
no init system), reported ready when it logs "Server listening", and stopped by PID together
with every per-connection child it forked.

The sessions it serves form a small "device": ``SetEnv`` gives them a home of their own
(``<dir>/home``, so ``~/.edgekit`` lands there, not in the real home) and a PATH whose
``python3`` is the interpreter running the tests (it has the runtimes the agent needs).

``openssh-server`` is installed with apt-get when it is missing and we are root (CI is);
otherwise ``unavailable_reason()`` says why, and the tests skip with that reason.

Command line::

    python -m tests.lab.sshd            # start one, print an ssh config block, wait for Ctrl-C
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/usr/bin/sshd")
START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
_INSTALL_LOCK = Path("/tmp/edgekit-lab-apt.lock")


class LabUnavailable(RuntimeError):
    """This machine cannot run the lab; the message says why (tests skip with it)."""


# -- installing ------------------------------------------------------------------------------


def sshd_path() -> str | None:
    for path in SSHD_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("sshd")


def apt_install(*packages: str, what: str) -> None:
    """``apt-get install`` (root only), serialised with other lab processes; LabUnavailable on failure."""
    if os.geteuid() != 0:
        raise LabUnavailable(f"{what} needs the packages {', '.join(packages)}; install them (apt-get needs root)")
    if shutil.which("apt-get") is None:
        raise LabUnavailable(f"{what} needs the packages {', '.join(packages)} and there is no apt-get here")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", "--no-install-recommends", *packages]
    with open(_INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:  # stale package lists: refresh once
            subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=300", "update", "-q"], env=env, capture_output=True, timeout=900)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise LabUnavailable(f"apt-get could not install {', '.join(packages)}: {tail}")


def ensure_sshd() -> str:
    """The sshd binary, installing openssh-server first when it is missing."""
    path = sshd_path()
    if path is None:
        apt_install("openssh-server", what="the SSH lab")
        path = sshd_path()
        if path is None:
            raise LabUnavailable("openssh-server was installed but no sshd binary was found")
    return path


def unavailable_reason() -> str | None:
    """Why an sshd cannot run here (None: it can, maybe after installing openssh-server)."""
    if sys.platform != "linux":
        return "the SSH lab needs Linux"
    if shutil.which("ssh-keygen") is None:
        return "the SSH lab needs ssh-keygen (openssh-client)"
    if sshd_path() is None and (os.geteuid() != 0 or shutil.which("apt-get") is None):
        return "sshd is not installed and cannot be installed here (needs root and apt-get): apt-get install openssh-server"
    return None


# -- keys -------------------------------------------------------------------------------------


def keygen(path: Path, comment: str = "edgekit-lab") -> str:
    """An unencrypted ed25519 key pair at ``path``/``path.pub``; returns the public key line."""
    if path.exists():
        path.unlink()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, capture_output=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    path.chmod(0o600)
    return path.with_suffix(".pub").read_text().strip()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# -- processes --------------------------------------------------------------------------------


def _ppid_map() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        out[int(entry)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first level first)."""
    parents = _ppid_map()
    found: list[int] = []
    frontier = [pid]
    while frontier:
        nxt = [p for p, pp in parents.items() if pp in frontier and p not in found]
        found += nxt
        frontier = nxt
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"


def wait_gone(pids: list[int], timeout: float = STOP_TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # polling a condition with a bound
    return True


# -- the server --------------------------------------------------------------------------------


class Sshd:
    """One sshd serving one "device" directory. Use as a context manager or start()/stop().

    ``prefix`` runs sshd under another command (e.g. ``["ip", "netns", "exec", NS]``);
    ``host`` is the address it listens on; ``extra`` adds sshd_config lines.
    """

    def __init__(
        self,
        base: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        prefix: list[str] | None = None,
        client_key: Path | None = None,
        log_level: str = "INFO",
        extra: tuple[str, ...] = (),
        device_path: str | None = None,
    ) -> None:
        self.base = Path(base)
        self.host = host
        self.port = port
        self.prefix = list(prefix or [])
        self.log_level = log_level
        self.extra = tuple(extra)
        self.user = _username()
        self.home = self.base / "home"  # the device's home: ~/.edgekit lives here
        self.client_key = client_key or self.base / "id_ed25519"
        self.host_key = self.base / "ssh_host_ed25519_key"
        self.config = self.base / "sshd_config"
        self.pidfile = self.base / "sshd.pid"
        venv_bin = str(Path(sys.executable).parent)
        self.device_path = device_path or f"{venv_bin}:/usr/local/bin:/usr/bin:/bin"
        self.proc: subprocess.Popen | None = None
        self.log: list[str] = []
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None
        self.host_key_line = ""  # "ssh-ed25519 AAAA..." (no comment)
        self.extra_host_keys: list[Path] = []  # more HostKey files (a server offering two key types)

    # -- set-up ---------------------------------------------------------------------------
    def prepare(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(exist_ok=True)
        if not self.client_key.exists():
            keygen(self.client_key, "edgekit-lab-client")
        pub = self.client_key.with_suffix(".pub").read_text().strip()
        (self.base / "authorized_keys").write_text(pub + "\n")
        self.host_key_line = " ".join(keygen(self.host_key, "edgekit-lab-host").split()[:2])

    def _config_text(self, port: int, penalties: bool) -> str:
        lines = [
            f"ListenAddress {self.host}",
            f"Port {port}",
            f"HostKey {self.host_key}",
            *(f"HostKey {k}" for k in self.extra_host_keys),
            f"PidFile {self.pidfile}",
            f"AuthorizedKeysFile {self.base / 'authorized_keys'}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "PrintMotd no",
            "AllowTcpForwarding yes",
            "MaxStartups 100:30:200",
            "MaxSessions 64",
            f"LogLevel {self.log_level}",
            "Subsystem sftp internal-sftp",
            # sessions get a home of their own and the test interpreter as python3
            f"SetEnv HOME={self.home} PATH={self.device_path}",
        ]
        if penalties:  # OpenSSH >= 9.8 penalises clients whose connections die; the fault tests kill many
            lines.append("PerSourcePenalties no")
        return "\n".join([*lines, *self.extra]) + "\n"

    def _write_config(self, sshd: str, port: int) -> None:
        for penalties in (True, False):
            self.config.write_text(self._config_text(port, penalties))
            check = subprocess.run([*self.prefix, sshd, "-t", "-f", str(self.config)], capture_output=True, text=True)
            if check.returncode == 0:
                return
            if not (penalties and "PerSourcePenalties" in check.stderr):
                raise LabUnavailable(f"sshd rejects the lab's config: {check.stderr.strip()}")

    # -- life cycle -----------------------------------------------------------------------
    def start(self) -> Sshd:
        reason = unavailable_reason()
        if reason:
            raise LabUnavailable(reason)
        sshd = ensure_sshd()
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        self.prepare()
        fixed = self.port is not None
        for _attempt in range(1 if fixed else 5):
            port = self.port if fixed else free_port(self.host if not self.prefix else "127.0.0.1")
            self._write_config(sshd, port)
            if self._launch(sshd, port):
                self.port = port
                return self
        raise LabUnavailable(f"sshd did not start: {' | '.join(self.log[-3:])}")

    def _launch(self, sshd: str, port: int) -> bool:
        self.log = []
        self._listening.clear()
        self.proc = subprocess.Popen(
            [*self.prefix, sshd, "-D", "-e", "-f", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read_log, args=(self.proc,), daemon=True)
        self._reader.start()
        # "Server listening on ..." is logged once the socket is bound and listening.
        deadline = time.monotonic() + START_TIMEOUT
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._kill_all()
                return False
        return True

    def _read_log(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", errors="replace").rstrip()
            self.log.append(line)
            if "Server listening on" in line:
                self._listening.set()

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def daemon_pid(self) -> int:
        """The listening sshd's PID (the launcher's, unless a prefix command forked)."""
        if self.pidfile.exists():
            with contextlib.suppress(ValueError):
                return int(self.pidfile.read_text().split()[0])
        return self.pid

    def connection_pids(self) -> list[int]:
        """The per-connection sshd children (and everything under them)."""
        return descendants(self.daemon_pid())

    def kill_connections(self) -> int:
        """SIGKILL every open connection's sshd processes (the listener keeps running)."""
        pids = self.connection_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_gone(pids)
        return len(pids)

    def stop(self) -> None:
        if self.proc is None:
            return
        self._kill_all()
        self.proc = None

    def _kill_all(self) -> None:
        assert self.proc is not None
        pids = [self.proc.pid, *descendants(self.proc.pid)]
        if self.pidfile.exists():
            with contextlib.suppress(ValueError):
                daemon = int(self.pidfile.read_text().split()[0])
                if daemon not in pids and alive(daemon):
                    pids += [daemon, *descendants(daemon)]
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=STOP_TIMEOUT)
        wait_gone(pids)
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()

    def __enter__(self) -> Sshd:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what a client needs ----------------------------------------------------------------
    @property
    def known_hosts_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def known_hosts_line(self) -> str:
        return f"{self.known_hosts_name} {self.host_key_line}\n"

    def ssh_config(self, alias: str, **more: str) -> str:
        """A ``~/.ssh/config`` block for this server."""
        lines = [
            f"Host {alias}",
            f"    HostName {self.host}",
            f"    Port {self.port}",
            f"    User {self.user}",
            f"    IdentityFile {self.client_key}",
            "    IdentitiesOnly yes",
        ]
        lines += [f"    {k} {v}" for k, v in more.items()]
        return "\n".join(lines) + "\n"

    def ssh_argv(self) -> list[str]:
        """Options for the system ssh/scp to reach this server (a known_hosts of its own)."""
        kh = self.base / "client_known_hosts"
        kh.write_text(self.known_hosts_line())
        return [
            "-i", str(self.client_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={kh}", "-o", "StrictHostKeyChecking=yes",
        ]  # fmt: skip


def _username() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def log_has(server: Sshd, pattern: str) -> bool:
    rx = re.compile(pattern)
    return any(rx.search(line) for line in list(server.log))


def main() -> int:  # pragma: no cover - a manual helper
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="edgekit-sshd-"))
    with Sshd(base) as server:
        print(server.ssh_config("edgekit-lab"))
        print(f"# known_hosts line:\n{server.known_hosts_line()}", end="")
        print(f"# sshd pid {server.pid}, dir {base}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
