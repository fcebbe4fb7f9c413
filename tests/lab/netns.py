"""Separate "hosts" on one machine: network namespaces joined by veth pairs (root only).

``Netns.create()`` makes namespace N with a veth pair: ``10.200.N.1/30`` on the host side,
``10.200.N.2/30`` inside (a device). ``link(other)`` joins two namespaces directly with no
route from the host, so the second is reachable only *through* the first (ProxyJump).
Faults, on the host-side end of the link or inside the namespace:

* ``tbf(rate)``: a bandwidth cap (this kernel has no netem);
* ``drop_all()`` / ``restore()``: nftables drops everything inside the namespace: a pulled
  cable (falls back to taking the link down when nft is missing and cannot be installed);
* ``loss(percent)``: random drops with nftables.

Indexes are allocated under a file lock by looking at what exists, so parallel test runs (and
the ARM board lab, which uses 10.231.N) do not collide. ``destroy()`` kills every process
left in the namespace and deletes it (its veth ends go with it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
from pathlib import Path

from tests.lab.sshd import LabUnavailable, alive, apt_install, wait_gone

SUBNET = "10.200"
PREFIX = "eklab"
_LOCK = Path("/tmp/edgekit-lab-netns.lock")


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "network-namespace devices need root (ip netns, veth, tc, nft); run the tests as root, as CI does"
    if shutil.which("ip") is None:
        return "network-namespace devices need the 'ip' tool (iproute2)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns does not work here: {probe.stderr.strip()}"
    return None


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise LabUnavailable(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return proc


def ensure_nft() -> bool:
    """nft is there (installing nftables when missing and possible)."""
    if shutil.which("nft"):
        return True
    with contextlib.suppress(LabUnavailable):
        apt_install("nftables", what="the fault lab")
    return shutil.which("nft") is not None


def _used_indexes() -> set[int]:
    used: set[int] = set()
    out = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    for word in out.split():
        if word.startswith(SUBNET + "."):
            with contextlib.suppress(ValueError, IndexError):
                used.add(int(word.split(".")[2]))
    names = {line.split()[0] for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines() if line.strip()}
    links = {w.rstrip(":").split("@")[0] for w in _run(["ip", "-o", "link", "show"], check=False).stdout.split()}
    for n in range(1, 255):
        if f"{PREFIX}{n}" in names or f"ek{n}h" in links:
            used.add(n)
    return used


class Netns:
    """Namespace ``eklabN`` with a device address ``10.200.N.2`` reachable from the host."""

    def __init__(self, index: int, *, routed: bool = True) -> None:
        self.index = index
        self.name = f"{PREFIX}{index}"
        self.routed = routed
        self.host_addr = f"{SUBNET}.{index}.1"
        self.addr = f"{SUBNET}.{index}.2"
        self.veth_host = f"ek{index}h"
        self.veth_dev = f"ek{index}d"
        self._dropping = False
        self.links: list[tuple[str, str]] = []  # (namespace, veth) of extra links
        self.link_addrs: dict[str, str] = {}  # other namespace -> this end's address on that link

    @classmethod
    def create(cls, *, routed: bool = True) -> Netns:
        """A new namespace; ``routed=False``: no link to the host at all (use ``link``)."""
        reason = unavailable_reason()
        if reason:
            raise LabUnavailable(reason)
        with open(_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            used = _used_indexes()
            index = next((n for n in range(1, 255) if n not in used), None)
            if index is None:
                raise LabUnavailable("no free 10.200.N subnet for another namespace")
            ns = cls(index, routed=routed)
            try:
                ns._setup()
            except BaseException:
                ns.destroy()
                raise
        return ns

    def _setup(self) -> None:
        _run(["ip", "netns", "add", self.name])
        _run(["ip", "-n", self.name, "link", "set", "lo", "up"])
        if not self.routed:
            return
        _run(["ip", "link", "add", self.veth_host, "type", "veth", "peer", "name", self.veth_dev])
        _run(["ip", "link", "set", self.veth_dev, "netns", self.name])
        _run(["ip", "addr", "add", f"{self.host_addr}/30", "dev", self.veth_host])
        _run(["ip", "link", "set", self.veth_host, "up"])
        _run(["ip", "-n", self.name, "addr", "add", f"{self.addr}/30", "dev", self.veth_dev])
        _run(["ip", "-n", self.name, "link", "set", self.veth_dev, "up"])

    @property
    def prefix(self) -> list[str]:
        """Prefix a command with this to run it inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def link(self, other: Netns) -> tuple[str, str]:
        """A private link between this namespace and ``other``: (address here, address there).

        The pair is ``10.200.M.5`` / ``10.200.M.6`` (M: ``other``'s index), a /30 no host route
        covers, so ``other`` is reachable only from here.
        """
        a, b = f"ek{other.index}a", f"ek{other.index}b"
        here, there = f"{SUBNET}.{other.index}.5", f"{SUBNET}.{other.index}.6"
        _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
        _run(["ip", "link", "set", a, "netns", self.name])
        _run(["ip", "link", "set", b, "netns", other.name])
        _run(["ip", "-n", self.name, "addr", "add", f"{here}/30", "dev", a])
        _run(["ip", "-n", other.name, "addr", "add", f"{there}/30", "dev", b])
        _run(["ip", "-n", self.name, "link", "set", a, "up"])
        _run(["ip", "-n", other.name, "link", "set", b, "up"])
        self.links.append((self.name, a))
        self.link_addrs[other.name] = here
        other.link_addrs[self.name] = there
        return here, there

    # -- faults ------------------------------------------------------------------------------
    def tbf(self, rate: str = "8mbit", burst: str = "32kbit", latency: str = "400ms") -> None:
        """Cap host -> device bandwidth (the upload direction)."""
        _run(["tc", "qdisc", "replace", "dev", self.veth_host, "root", "tbf", "rate", rate, "burst", burst, "latency", latency])

    def no_tbf(self) -> None:
        _run(["tc", "qdisc", "del", "dev", self.veth_host, "root"], check=False)

    def _nft(self, script: str) -> None:
        proc = subprocess.run([*self.prefix, "nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise LabUnavailable(f"nft failed in {self.name}: {proc.stderr.strip()}")

    def drop_all(self) -> None:
        """Drop every packet in and out of the namespace: the cable is pulled, nobody is told."""
        if ensure_nft():
            self._nft(
                "table inet eklab {\n"
                "  chain in { type filter hook input priority 0; policy drop; }\n"
                "  chain out { type filter hook output priority 0; policy drop; }\n"
                "}\n"
            )
        else:
            _run(["ip", "-n", self.name, "link", "set", self.veth_dev, "down"])
        self._dropping = True

    def loss(self, percent: int) -> None:
        if not ensure_nft():
            raise LabUnavailable("random loss needs nftables (apt-get install nftables)")
        self._nft(f"table inet eklab {{\n  chain in {{ type filter hook input priority 0; numgen random mod 100 < {int(percent)} drop; }}\n}}\n")
        self._dropping = True

    def cable_out(self) -> None:
        """Take the device's end of the link down: the host still routes to it, nobody answers."""
        _run(["ip", "-n", self.name, "link", "set", self.veth_dev, "down"])

    def restore(self) -> None:
        if shutil.which("nft"):
            subprocess.run([*self.prefix, "nft", "delete", "table", "inet", "eklab"], capture_output=True, timeout=60)
        if self.routed:
            _run(["ip", "-n", self.name, "link", "set", self.veth_dev, "up"], check=False)
        self._dropping = False

    # -- teardown ----------------------------------------------------------------------------
    def pids(self) -> list[int]:
        out = _run(["ip", "netns", "pids", self.name], check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def destroy(self) -> None:
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_gone([p for p in pids if alive(p)])
        _run(["ip", "netns", "del", self.name], check=False)
        _run(["ip", "link", "del", self.veth_host], check=False)  # normally gone with the namespace
