"""Facts about a CPU, from this machine or from a device's /proc/cpuinfo text.

``probe_host()`` fills the ``[cpu]`` facts of probe profiles (``local``, ``linux-cpu``).
``cpu_from_cpuinfo()`` is the parser behind it, public so a caller holding a device's
/proc/cpuinfo (read over a transport) gets the same normalized facts.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from edgekit.errors import ProfileError
from edgekit.profiles.model import ARCHES, ISA_BY_ARCH, CpuSpec

_ARCH_ALIASES = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
    "armv7l": "armv7l",
    # a 32-bit userland on an ARMv8 core reports armv8l; it runs armv7l binaries
    "armv8l": "armv7l",
}

# The cpuinfo vocabulary (flag names, ARM part numbers) is defined once, in the agent, which
# must stay stdlib-only and standalone; the host may import it, never the other way round.
from edgekit.agent.facts import _ARM_FLAGS, _ARM_PARTS  # noqa: E402

_X86_FLAGS = {f: f for f in ISA_BY_ARCH["x86_64"]}


def normalize_arch(machine: str) -> str:
    """``platform.machine()`` / ``uname -m`` -> one of ARCHES."""
    arch = _ARCH_ALIASES.get(machine.strip().lower())
    if arch is None:
        raise ProfileError(
            f"unsupported CPU architecture '{machine}'; allowed: {', '.join(ARCHES)}",
            "edgekit targets x86_64, aarch64 and armv7l devices; for another machine write a "
            "profile with explicit [cpu] facts instead of probe = true",
        )
    return arch


def cpu_from_cpuinfo(text: str, arch: str, cores: int | None = None) -> CpuSpec:
    """Normalized CPU facts from the text of /proc/cpuinfo on a machine of ``arch``.

    ``core`` is the Cortex/Neoverse name on ARM (from implementer + part; big.LITTLE
    parts are joined with "+" in the order the kernel lists them) and the
    "model name" on x86. ``isa`` keeps only the features edgekit dispatches on.
    """
    arch = normalize_arch(arch)
    flags: set[str] = set()
    parts: list[str] = []
    model_name: str | None = None
    implementer: str | None = None
    processors = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "processor":
            processors += 1
        elif key in ("flags", "features"):
            flags.update(value.split())
        elif key == "model name" and model_name is None:
            model_name = value
        elif key == "cpu implementer":
            implementer = value.lower()
        elif key == "cpu part" and implementer is not None:
            ident = (implementer, value.lower())
            name = _ARM_PARTS.get(ident, f"{ident[0]}:{ident[1]}")
            if name not in parts:
                parts.append(name)

    if arch == "x86_64":
        isa = {_X86_FLAGS[f] for f in flags if f in _X86_FLAGS}
        core = model_name
    else:
        isa = {_ARM_FLAGS[f] for f in flags if f in _ARM_FLAGS}
        if arch == "aarch64":
            isa.add("neon")  # Advanced SIMD is mandatory in AArch64
        core = "+".join(parts) if parts else model_name
    ordered = tuple(f for f in ISA_BY_ARCH[arch] if f in isa)
    return CpuSpec(arch=arch, core=core, isa=ordered, cores=cores or processors or None)


def _usable_cpus() -> int | None:
    # The CPUs this process may run on (taskset, container cpusets), not the socket's total.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def probe_host() -> CpuSpec:
    """CPU facts of the machine edgekit is running on."""
    arch = normalize_arch(platform.machine())
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text(errors="replace") if cpuinfo.is_file() else ""
    return cpu_from_cpuinfo(text, arch, cores=_usable_cpus())
