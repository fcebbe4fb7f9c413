"""Emulated ARM boards: an arm64 Debian root filesystem run through qemu-user, one per netns.

Each board is a separate "host" on a private link (``10.231.N.2``, the host side is
``10.231.N.1``), with its own hostname, a copy-on-write overlay over one shared root
filesystem, an sshd started by this module, and an ARM ``/proc/cpuinfo`` that matches the
CPU qemu emulates for it (qemu-user would show the host's x86 one, which crashes some
runtimes). ``uname -m`` says aarch64; ``QEMU_CPU`` picks the core, so a ``cortex-a72`` board
has no dot-product instructions and a ``cortex-a76`` one does.

Needs root (network and mount namespaces, binfmt_misc), ``debootstrap`` and
``qemu-user-static`` (installed with apt-get when missing), and the host's Debian mirror for
the first build. The root filesystem is built once (~3 min) and cached outside git as
``~/.cache/edgekit-dev/rootfs-arm64.tar.zst`` (``$EDGEKIT_DEV_CACHE`` overrides the
directory); later runs restore it in about a second. Emulated timing means nothing: use
the boards for correctness, dispatch and protocol tests.

Command line (as root)::

    python -m tests.lab.armboard build            # build or restore the root filesystem
    python -m tests.lab.armboard up               # start the standard boards, print ssh config
    python -m tests.lab.armboard status
    python -m tests.lab.armboard down             # stop every board this lab started
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
PACKAGES = ("python3", "python3-numpy", "openssh-server")
USER = "pi"  # the login user on every board, like Raspberry Pi OS
SUBNET = "10.231"  # board N: 10.231.N.1 (host side) <-> 10.231.N.2 (board)
NETNS_PREFIX = "ekarm-"
CACHE_DIR = Path(os.environ.get("EDGEKIT_DEV_CACHE") or Path.home() / ".cache" / "edgekit-dev")
TARBALL = CACHE_DIR / "rootfs-arm64.tar.zst"
ROOTFS = CACHE_DIR / "rootfs-arm64"  # the extracted tarball: the read-only lower layer
RUN_DIR = Path(os.environ.get("EDGEKIT_ARMLAB_DIR") or "/tmp/edgekit-armlab")
APT_TOOLS = {"debootstrap": "debootstrap", "qemu-aarch64-static": "qemu-user-static", "zstd": "zstd"}
APT_LOCK = Path("/tmp/edgekit-lab-apt.lock")
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
BINFMT_CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")
BOOT_TIMEOUT = 60.0
# Bump when the build changes: a cached tarball of another version is rebuilt.
ROOTFS_VERSION = 1
VERSION_FILE = "etc/edgekit-rootfs-version"

# The standard boards: a Raspberry Pi 4 like core (no dot product) and a Pi 5 like one.
STANDARD_BOARDS = (("a72", "cortex-a72", 1), ("a76", "cortex-a76", 2))

# QEMU_CPU -> (CPU implementer, variant, part, revision) as the Linux kernel prints them.
MIDR = {
    "cortex-a53": ("0x41", "0x0", "0xd03", "4"),
    "cortex-a57": ("0x41", "0x1", "0xd07", "1"),
    "cortex-a72": ("0x41", "0x0", "0xd08", "3"),
    "cortex-a76": ("0x41", "0x4", "0xd0b", "1"),
    "neoverse-n1": ("0x41", "0x4", "0xd0c", "1"),
}

# AT_HWCAP / AT_HWCAP2 bits -> /proc/cpuinfo "Features" words (arch/arm64/kernel/cpuinfo.c order).
HWCAP_NAMES = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma "
    "lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg"
).split()
HWCAP2_NAMES = (
    "dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svef32mm svef64mm "
    "svebf16 i8mm bf16 dgh rng bti mte"
).split()

Log = Callable[[str], None]


class LabUnavailable(RuntimeError):
    """This machine cannot build or run the boards; the message says why (tests skip on it)."""


class BoardError(RuntimeError):
    """A board failed to start on a machine that can run boards: a bug, not a reason to skip."""


@dataclass(frozen=True)
class Board:
    name: str
    cpu: str  # QEMU_CPU
    index: int
    host: str  # the board's address, reachable from the host
    user: str
    key: Path  # the client private key authorized on every board
    host_key: str  # the board's public host key line ("ssh-ed25519 AAAA...")
    known_hosts: Path  # a known_hosts file with just this board
    netns: str
    workdir: Path
    port: int = 22

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}"

    def ssh_options(self) -> list[str]:
        return [
            "-i", str(self.key), "-p", str(self.port),
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20",
        ]

    def ssh_argv(self, *command: str) -> list[str]:
        """The system ``ssh`` command running ``command`` (argv, quoted here) on the board."""
        return ["ssh", *self.ssh_options(), self.target, "--", shlex.join(command)]

    def ssh_config(self, alias: str | None = None) -> str:
        """A ``~/.ssh/config`` block for the board."""
        return (
            f"Host {alias or 'armboard-' + self.name}\n"
            f"    HostName {self.host}\n    Port {self.port}\n    User {self.user}\n"
            f"    IdentityFile {self.key}\n    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {self.known_hosts}\n"
        )

    def pids(self) -> list[int]:
        return netns_pids(self.netns)


# -- checks and set-up -----------------------------------------------------------------------


def unavailable_reason() -> str | None:
    """Why boards cannot run here (None: they can, perhaps after installing packages)."""
    if sys.platform != "linux":
        return "emulated ARM boards need Linux"
    if os.geteuid() != 0:
        return "emulated ARM boards need root (network and mount namespaces, binfmt_misc)"
    for tool in ("ip", "unshare", "chroot", "tar", "mount"):
        if shutil.which(tool) is None:
            return f"emulated ARM boards need '{tool}' on the host"
    if not TARBALL.is_file() and not all(shutil.which(t) for t in APT_TOOLS) and shutil.which("apt-get") is None:
        missing = [p for t, p in APT_TOOLS.items() if not shutil.which(t)]
        return f"emulated ARM boards need the packages {', '.join(missing)} and there is no apt-get"
    return None


def ensure_tools(log: Log = print) -> None:
    """Install debootstrap, qemu-user-static and zstd from the OS packages when missing."""
    missing = sorted({pkg for tool, pkg in APT_TOOLS.items() if shutil.which(tool) is None})
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise LabUnavailable(f"install {', '.join(missing)} (no apt-get here)")
    log(f"installing {', '.join(missing)} with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300"]
    install = [*apt, "install", "-y", "-q", "--no-install-recommends", *missing]
    with _locked(APT_LOCK):  # the same lock as the other lab scripts: one apt-get at a time
        proc = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:  # stale package lists: refresh once
            subprocess.run([*apt, "update", "-q"], env=env, capture_output=True, timeout=900)
            proc = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise LabUnavailable(f"apt-get could not install {', '.join(missing)}: {_tail(proc.stderr)}")


def ensure_binfmt() -> None:
    """Register qemu-aarch64 with binfmt_misc (the package's install step does not, here)."""
    if not (BINFMT_DIR / "register").exists():
        proc = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise LabUnavailable(f"cannot mount binfmt_misc: {_tail(proc.stderr)}")
    entry = BINFMT_DIR / "qemu-aarch64"
    if entry.exists():
        if "enabled" in entry.read_text():
            return
        entry.write_text("1")
        return
    if not BINFMT_CONF.is_file():
        raise LabUnavailable(f"{BINFMT_CONF} is missing: install qemu-user-static")
    line = next(ln for ln in BINFMT_CONF.read_text().splitlines() if ln.startswith(":"))
    try:
        (BINFMT_DIR / "register").write_text(line)
    except FileExistsError:  # registered meanwhile by someone else
        pass
    except OSError as exc:
        raise LabUnavailable(f"cannot register qemu-aarch64 with binfmt_misc: {exc}") from None


def debian_mirror(sources: tuple[Path, ...] = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))) -> str:
    """The host's Debian mirror URI from its apt sources (one-line or deb822 format)."""
    files: list[Path] = []
    for src in sources:
        if src.is_dir():
            files += sorted(p for p in src.iterdir() if p.suffix in (".list", ".sources"))
        elif src.is_file():
            files.append(src)
    for path in files:
        text = path.read_text(errors="replace")
        for stanza in re.split(r"\n\s*\n", text):
            fields = {}
            for line in stanza.splitlines():
                key, sep, value = line.partition(":")
                if sep and not line.startswith((" ", "#")):
                    fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and SUITE in fields.get("suites", "").split():
                uri = fields.get("uris", "").split()
                if uri and "security" not in uri[0]:
                    return uri[0]
        for line in text.splitlines():
            words = [w for w in line.split("#")[0].split() if not w.startswith("[")]
            if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE and "security" not in words[1]:
                return words[1]
    return "http://deb.debian.org/debian"


# -- the root filesystem -----------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def lab_lock(timeout: float = 900.0) -> Iterator[None]:
    """Exclusive use of the lab by one test session at a time (they share board names)."""
    path = RUN_DIR.parent / (RUN_DIR.name + ".lock")
    with open(path, "w") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BoardError(f"another session has held {path} for {timeout:.0f} s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_rootfs(log: Log = print, rebuild: bool = False) -> Path:
    """The extracted arm64 root filesystem: restored from the cached tarball, built if none."""
    reason = unavailable_reason()
    if reason:
        raise LabUnavailable(reason)
    ensure_tools(log)
    ensure_binfmt()
    with _locked(CACHE_DIR / "rootfs-arm64.lock"):
        if rebuild or not TARBALL.is_file():
            _build_tarball(log)
        _restore(log)
        if _rootfs_version() != ROOTFS_VERSION:
            log(f"the cached root filesystem is not version {ROOTFS_VERSION}: rebuilding it")
            _build_tarball(log)
            _restore(log)
    return ROOTFS


def _rootfs_version() -> int | None:
    """The ROOTFS_VERSION the extracted root filesystem was built with (None: unknown)."""
    text = (ROOTFS / VERSION_FILE).read_text() if (ROOTFS / VERSION_FILE).is_file() else ""
    return int(text) if text.strip().isdigit() else None


def _restore(log: Log) -> None:
    """Extract the tarball into ROOTFS unless that extraction is already there."""
    stamp = f"{TARBALL.stat().st_size}:{TARBALL.stat().st_mtime_ns}\n"
    stamp_file = ROOTFS / ".edgekit-stamp"
    if stamp_file.is_file() and stamp_file.read_text() == stamp:
        return
    log(f"restoring {ROOTFS} from {TARBALL}")
    tmp = Path(tempfile.mkdtemp(prefix="rootfs-arm64.", dir=CACHE_DIR))
    try:
        _run(["tar", "--zstd", "--numeric-owner", "-xpf", str(TARBALL), "-C", str(tmp)])
        tmp.chmod(0o755)
        (tmp / ".edgekit-stamp").write_text(stamp)
        if ROOTFS.exists():
            shutil.rmtree(ROOTFS)
        os.replace(tmp, ROOTFS)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _build_tarball(log: Log) -> None:
    mirror = debian_mirror()
    build = Path(tempfile.mkdtemp(prefix="rootfs-arm64.build.", dir=CACHE_DIR))
    build.chmod(0o755)  # it becomes the boards' "/": mkdtemp's 0700 would lock users out
    try:
        log(f"debootstrap {SUITE} arm64 from {mirror} (a few minutes, once)")
        start = time.monotonic()
        proc = subprocess.run(
            ["debootstrap", "--arch=arm64", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, str(build), mirror],
            capture_output=True, text=True,
        )
        if proc.returncode != 0:
            log_file = build / "debootstrap" / "debootstrap.log"
            detail = _tail(log_file.read_text(errors="replace")) if log_file.is_file() else _tail(proc.stderr + proc.stdout)
            raise LabUnavailable(f"debootstrap from {mirror} failed: {detail}")
        log(f"debootstrap done in {time.monotonic() - start:.0f} s; configuring")
        _chroot(build, ["useradd", "--create-home", "--shell", "/bin/bash", USER])
        # No password, but not locked either: with UsePAM no, sshd refuses locked ("!") accounts.
        shadow = build / "etc" / "shadow"
        shadow.write_text(re.sub(rf"^{USER}:!:", f"{USER}:*:", shadow.read_text(), flags=re.M))
        # Host keys are made per board at boot; the package's own would be shared by all.
        for key in (build / "etc" / "ssh").glob("ssh_host_*"):
            key.unlink()
        (build / VERSION_FILE).write_text(f"{ROOTFS_VERSION}\n")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (build / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        tmp_tar = TARBALL.with_name(TARBALL.name + ".part")
        log(f"packing {TARBALL}")
        _run(["tar", "--zstd", "--numeric-owner", "-cpf", str(tmp_tar), "-C", str(build), "."])
        os.replace(tmp_tar, TARBALL)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _chroot(root: Path, argv: list[str], cpu: str = "cortex-a72", error: type = LabUnavailable) -> str:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "QEMU_CPU": cpu, "LANG": "C.UTF-8"}
    return _run(["chroot", str(root), *argv], env=env, error=error)


def _run(argv: list[str], env: dict | None = None, timeout: float = 900, error: type = LabUnavailable) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise error(f"{shlex.join(argv)} failed ({proc.returncode}): {_tail(proc.stderr or proc.stdout)}")
    return proc.stdout


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join([ln.strip() for ln in text.splitlines() if ln.strip()][-lines:])


# -- /proc/cpuinfo for an emulated core ------------------------------------------------------------

_HWCAP_PROBE = "import ctypes; g = ctypes.CDLL(None).getauxval; g.restype = ctypes.c_ulong; print(g(16), g(26))"


def hwcaps(rootfs: Path, cpu: str) -> tuple[int, int]:
    """AT_HWCAP and AT_HWCAP2 that qemu gives a process on ``cpu`` (asked inside the rootfs)."""
    out = _chroot(rootfs, ["/usr/bin/python3", "-I", "-S", "-c", _HWCAP_PROBE], cpu=cpu, error=BoardError)
    hwcap, hwcap2 = (int(x) for x in out.split())
    return hwcap, hwcap2


def features(hwcap: int, hwcap2: int) -> list[str]:
    names = [n for i, n in enumerate(HWCAP_NAMES) if hwcap >> i & 1]
    return names + [n for i, n in enumerate(HWCAP2_NAMES) if hwcap2 >> i & 1]


def cpuinfo_text(cpu: str, hwcap: int, hwcap2: int, cores: int) -> str:
    """An arm64 kernel's /proc/cpuinfo for ``cores`` cores of ``cpu`` with these hwcaps."""
    if cpu not in MIDR:
        raise BoardError(f"no MIDR known for QEMU_CPU={cpu}; known: {', '.join(sorted(MIDR))}")
    implementer, variant, part, revision = MIDR[cpu]
    block = (
        "processor\t: {n}\nBogoMIPS\t: 108.00\nFeatures\t: " + " ".join(features(hwcap, hwcap2)) + "\n"
        f"CPU implementer\t: {implementer}\nCPU architecture: 8\nCPU variant\t: {variant}\n"
        f"CPU part\t: {part}\nCPU revision\t: {revision}\n\n"
    )
    return "".join(block.format(n=n) for n in range(cores))


# -- boards --------------------------------------------------------------------------------------


def netns_name(name: str) -> str:
    return NETNS_PREFIX + name


def netns_pids(netns: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def _client_key(lab: Path) -> tuple[Path, str]:
    key = lab / "id_ed25519"
    with _locked(lab / "id_ed25519.lock"):  # the pair is written once, by one process
        if not key.is_file():
            private, public = _ed25519_pair("edgekit-armlab")
            tmp = key.with_suffix(".part")
            tmp.write_bytes(private)
            tmp.chmod(0o600)
            key.with_suffix(".pub").write_text(public + "\n")
            os.replace(tmp, key)
        return key, key.with_suffix(".pub").read_text().strip()


def _ed25519_pair(comment: str) -> tuple[bytes, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    k = Ed25519PrivateKey.generate()
    private = k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    public = k.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private, f"{public} {comment}"


def _passwd_ids(rootfs: Path, user: str) -> tuple[int, int]:
    for line in (rootfs / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise BoardError(f"the root filesystem has no user {user}: rebuild it (build --rebuild)")


_SSHD_CONFIG = """\
ListenAddress {address}
Port 22
HostKey /etc/ssh/edgekit_host_ed25519_key
PidFile /run/sshd.pid
AuthorizedKeysFile .ssh/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PrintMotd no
MaxStartups 64:30:128
Subsystem sftp internal-sftp
# sshd gives sessions a clean environment: every aarch64 program they start needs the CPU again
SetEnv QEMU_CPU={cpu}
"""

# Runs (host /bin/sh) inside the board's network, mount and UTS namespaces; ends as its sshd.
_BOOT = """\
set -e
hostname {name}
mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} {root}
mount -t proc proc {root}/proc
mount --bind {cpuinfo} {root}/proc/cpuinfo
mount --rbind /dev {root}/dev
mount -t tmpfs -o mode=755 tmpfs {root}/run
mount -t tmpfs -o mode=1777 tmpfs {root}/tmp
mkdir -p -m 755 {root}/run/sshd
echo {name} > {root}/etc/hostname
printf '127.0.0.1 localhost\\n127.0.1.1 {name}\\n' > {root}/etc/hosts
install -m 600 {board}/host_key {root}/etc/ssh/edgekit_host_ed25519_key
install -m 644 {board}/host_key.pub {root}/etc/ssh/edgekit_host_ed25519_key.pub
install -m 644 {board}/sshd_config {root}/etc/ssh/edgekit_sshd_config
install -d -m 700 -o {uid} -g {gid} {root}/home/{user}/.ssh
install -m 600 -o {uid} -g {gid} {board}/authorized_keys {root}/home/{user}/.ssh/authorized_keys
install -d -m 700 {root}/root/.ssh
install -m 600 {board}/authorized_keys {root}/root/.ssh/authorized_keys
export QEMU_CPU={cpu}
exec chroot {root} /usr/sbin/sshd -D -e -f /etc/ssh/edgekit_sshd_config
"""


def start_board(name: str, cpu: str, index: int, log: Log = print) -> Board:
    """Start board ``name`` emulating ``cpu`` at 10.231.``index``.2; waits until sshd answers."""
    if not re.fullmatch(r"[a-z0-9-]{1,10}", name):
        raise ValueError(f"board name {name!r}: 1-10 of a-z, 0-9, '-'")
    if not 1 <= index <= 254:
        raise ValueError(f"board index {index}: 1..254")
    rootfs = ensure_rootfs(log)
    stop_board(name)
    lab = RUN_DIR
    lab.mkdir(parents=True, exist_ok=True)
    lab.chmod(0o755)
    key, key_pub = _client_key(lab)
    board_dir = lab / name
    if board_dir.exists():
        shutil.rmtree(board_dir)
    for sub in ("upper", "work", "root"):
        (board_dir / sub).mkdir(parents=True)
    host_addr, addr = f"{SUBNET}.{index}.1", f"{SUBNET}.{index}.2"

    cpuinfo = lab / f"cpuinfo-{cpu}"
    if not cpuinfo.is_file():
        tmp = cpuinfo.with_suffix(".part")
        tmp.write_text(cpuinfo_text(cpu, *hwcaps(rootfs, cpu), cores=os.cpu_count() or 1))
        os.replace(tmp, cpuinfo)
    private, public = _ed25519_pair(f"root@{name}")
    (board_dir / "host_key").write_bytes(private)
    (board_dir / "host_key").chmod(0o600)
    (board_dir / "host_key.pub").write_text(public + "\n")
    (board_dir / "authorized_keys").write_text(key_pub + "\n")
    (board_dir / "sshd_config").write_text(_SSHD_CONFIG.format(address=addr, cpu=cpu))
    host_key = " ".join(public.split()[:2])
    known_hosts = board_dir / "known_hosts"
    known_hosts.write_text(f"{addr} {host_key}\n")
    uid, gid = _passwd_ids(rootfs, USER)
    boot = board_dir / "boot.sh"
    boot.write_text(_BOOT.format(
        name=name, lower=rootfs, upper=board_dir / "upper", work=board_dir / "work", root=board_dir / "root",
        cpuinfo=cpuinfo, board=board_dir, uid=uid, gid=gid, user=USER, cpu=cpu,
    ))

    ns = netns_name(name)
    veth_host, veth_dev = f"ekarm{index}h", f"ekarm{index}d"
    _ip(["ip", "netns", "add", ns])
    try:
        _ip(["ip", "link", "add", veth_host, "type", "veth", "peer", "name", veth_dev])
        _ip(["ip", "link", "set", veth_dev, "netns", ns])
        _ip(["ip", "addr", "add", f"{host_addr}/30", "dev", veth_host])
        _ip(["ip", "link", "set", veth_host, "up"])
        _ip(["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", veth_dev])
        _ip(["ip", "-n", ns, "link", "set", veth_dev, "up"])
        _ip(["ip", "-n", ns, "link", "set", "lo", "up"])
        _ip(["ip", "-n", ns, "route", "add", "default", "via", host_addr])
        with open(board_dir / "sshd.log", "wb") as log_fh:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--mount", "--uts", "--propagation", "private", "/bin/sh", str(boot)],
                stdin=subprocess.DEVNULL, stdout=log_fh, stderr=log_fh, start_new_session=True,
            )
        (board_dir / "pid").write_text(f"{proc.pid}\n")
        _wait_for_sshd(proc, addr, board_dir / "sshd.log")
    except BaseException:
        stop_board(name)
        raise
    return Board(name, cpu, index, addr, USER, key, host_key, known_hosts, ns, board_dir)


def _ip(argv: list[str]) -> str:
    return _run(argv, timeout=30, error=BoardError)


def _wait_for_sshd(proc: subprocess.Popen, addr: str, log_file: Path) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise BoardError(f"the board's sshd exited ({proc.returncode}): {_tail(log_file.read_text(errors='replace'))}")
        try:
            with socket.create_connection((addr, 22), timeout=2) as sock:
                sock.settimeout(10)
                if sock.recv(64).startswith(b"SSH-2.0-"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BoardError(f"the board's sshd did not answer on {addr}:22 within {BOOT_TIMEOUT:.0f} s: {_tail(log_file.read_text(errors='replace'))}")
        time.sleep(0.05)  # polling a condition with a bound, not a race


def stop_board(name: str) -> None:
    """Stop board ``name``: its processes, its namespace, its link; missing parts are fine."""
    ns = netns_name(name)
    pids = netns_pids(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    pid_file = RUN_DIR / name / "pid"
    if pid_file.is_file():  # the launcher (ip netns exec) is our child only in the process that started it
        with contextlib.suppress(ChildProcessError, ValueError):
            os.waitpid(int(pid_file.read_text()), os.WNOHANG)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    board_dir = RUN_DIR / name
    if board_dir.exists():
        shutil.rmtree(board_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def running_boards() -> list[str]:
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    names = [ln.split()[0] for ln in proc.stdout.splitlines() if ln.strip()]
    return sorted(n[len(NETNS_PREFIX):] for n in names if n.startswith(NETNS_PREFIX))


# -- command line ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab.armboard", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build (or restore) the cached arm64 root filesystem")
    b.add_argument("--rebuild", action="store_true", help="debootstrap again even when cached")
    sub.add_parser("up", help="start the standard boards (a72: cortex-a72, a76: cortex-a76)")
    sub.add_parser("down", help="stop every board")
    sub.add_parser("status", help="list running boards")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr)

    try:
        if args.command == "build":
            print(ensure_rootfs(log, rebuild=args.rebuild))
        elif args.command == "up":
            for name, cpu, index in STANDARD_BOARDS:
                board = start_board(name, cpu, index, log)
                print(board.ssh_config())
        elif args.command == "down":
            for name in running_boards():
                stop_board(name)
        else:
            for name in running_boards():
                print(name, " ".join(map(str, netns_pids(netns_name(name)))))
    except (LabUnavailable, BoardError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
