"""pytest fixtures for the SSH lab (registered by one import line in tests/conftest.py).

* ``sshd_server``: a fresh loopback sshd (its own host key, client key and device home);
* ``ssh_home``: a temp HOME whose ``~/.ssh/config`` describes that server as ``Host lab``
  (HOME is set for this process and for ``cli`` subprocesses; ssh-agent is hidden);
* ``ssh_device``: an ``SshTransport`` to ``lab`` with the server's key already known;
* ``netns``: a factory of network-namespace hosts (root only), torn down after the test;
* ``tmpfs``: ``tmpfs("1m")`` mounts a tiny tmpfs to fill up (root only), unmounted after the test;
* ``emulated_boards(*specs)``: not a fixture but what a module-scoped board fixture yields from:
  emulated arm64 boards (tests/lab/armboard.py) started under the lab lock, stopped after.

Tests that need them skip with the lab's reason when this machine cannot run an sshd.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab import armboard
from tests.lab import netns as netns_mod
from tests.lab import sshd as sshd_mod


def pytest_configure(config) -> None:
    """Register the lab's markers (this module is imported into tests/conftest.py)."""
    config.addinivalue_line("markers", "ssh: needs a real sshd started by tests/lab (skips with the reason when it cannot run)")
    config.addinivalue_line("markers", "netns: needs root for network namespaces (ip netns, veth, tc, nft)")


@pytest.fixture(scope="session")
def _ssh_lab_ready() -> None:
    reason = sshd_mod.unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        sshd_mod.ensure_sshd()
    except sshd_mod.LabUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def sshd_server(_ssh_lab_ready, tmp_path_factory):
    server = sshd_mod.Sshd(tmp_path_factory.mktemp("sshd"))
    try:
        server.start()
    except sshd_mod.LabUnavailable as exc:
        pytest.skip(f"cannot start sshd: {exc}")
    yield server
    server.stop()


@dataclass
class SshHome:
    home: Path
    server: sshd_mod.Sshd
    alias: str = "lab"

    @property
    def ssh_dir(self) -> Path:
        return self.home / ".ssh"

    @property
    def config(self) -> Path:
        return self.ssh_dir / "config"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    def env(self) -> dict[str, str]:
        """For subprocesses (the ``cli`` fixture's ``env=``): the same HOME, no ssh-agent."""
        return {"HOME": str(self.home), "SSH_AUTH_SOCK": ""}

    def trust(self, server: sshd_mod.Sshd | None = None) -> None:
        with open(self.known_hosts, "a") as fh:
            fh.write((server or self.server).known_hosts_line())

    def add_host(self, alias: str, server: sshd_mod.Sshd, **options: str) -> None:
        with open(self.config, "a") as fh:
            fh.write("\n" + server.ssh_config(alias, **options))


@pytest.fixture
def ssh_home(sshd_server, tmp_path_factory, monkeypatch) -> SshHome:
    home = client_home(tmp_path_factory.mktemp("client-home"), sshd_server.ssh_config("lab"), monkeypatch)
    return SshHome(home, sshd_server)


@pytest.fixture
def ssh_device(ssh_home):
    from edgekit.transport.ssh import SshTransport

    ssh_home.trust()
    device = SshTransport("lab", connect_timeout=10, idle_timeout=10)
    yield device
    device.close()


@pytest.fixture
def netns():
    """``netns(routed=True)`` makes a namespace host; all are destroyed after the test."""
    reason = netns_mod.unavailable_reason()
    if reason:
        pytest.skip(reason)
    made: list[netns_mod.Netns] = []

    def make(routed: bool = True) -> netns_mod.Netns:
        try:
            ns = netns_mod.Netns.create(routed=routed)
        except sshd_mod.LabUnavailable as exc:
            pytest.skip(f"cannot create a network namespace: {exc}")
        made.append(ns)
        return ns

    yield make
    for ns in reversed(made):
        ns.destroy()


@pytest.fixture
def tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a full-disk device needs a tiny tmpfs, and mounting one needs root")
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"tmpfs-{len(mounted)}"
        mnt.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@contextlib.contextmanager
def emulated_boards(*specs: tuple[str, str, int]) -> Iterator[dict[str, armboard.Board]]:
    """Boards ``(name, cpu, index)`` by name; skips with the reason when this machine cannot run them."""
    reason = armboard.unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        armboard.ensure_rootfs(log=lambda msg: None)
    except armboard.LabUnavailable as exc:
        pytest.skip(f"cannot build the arm64 root filesystem here: {exc}")
    started: dict[str, armboard.Board] = {}
    with armboard.lab_lock():  # another test session may be using these boards
        try:
            for name, cpu, index in specs:
                started[name] = armboard.start_board(name, cpu, index, log=lambda msg: None)
            yield started
        finally:
            for name in started:
                armboard.stop_board(name)


def client_home(home: Path, ssh_config: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``home`` as this process's HOME with ``ssh_config`` as its ~/.ssh/config, ssh-agent hidden."""
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    (home / ".ssh" / "config").write_text(ssh_config)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def device_path(server: sshd_mod.Sshd, remote: str) -> Path:
    """Where a device path of a loopback server lives on this machine (it is this machine)."""
    return Path(remote) if os.path.isabs(remote) else server.home / ".edgekit" / remote


__all__ = ["_ssh_lab_ready", "pytest_configure", "netns", "ssh_device", "ssh_home", "sshd_server", "tmpfs"]  # the fixtures
