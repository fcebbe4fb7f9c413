"""Facts about a CPU, from this machine or from a device's /proc/cpuinfo text.

``probe_host()`` fills the ``[cpu]`` facts of probe profiles (``local``, ``linux-cpu``).
``cpu_from_cpuinfo()`` is the parser behind it, public so a caller holding a device's
/proc/cpuinfo (read over a transport) gets the same normalized facts.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from edgekit.agent.facts import parse_cpuinfo
from edgekit.errors import ProfileError
from edgekit.profiles.model import ARCHES, CpuSpec

# Other names of ARCHES; a 32-bit userland on an ARMv8 core reports armv8l: it runs armv7l binaries.
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64", "armv8l": "armv7l"}


def normalize_arch(machine: str) -> str:
    """``platform.machine()`` / ``uname -m`` -> one of ARCHES."""
    arch = machine.strip().lower()
    arch = _ARCH_ALIASES.get(arch, arch)
    if arch not in ARCHES:
        raise ProfileError(
            f"unsupported CPU architecture '{machine}'; allowed: {', '.join(ARCHES)}",
            "edgekit targets x86_64, aarch64 and armv7l devices; for another machine write a "
            "profile with explicit [cpu] facts instead of probe = true",
        )
    return arch


def cpu_from_cpuinfo(text: str, arch: str, cores: int | None = None) -> CpuSpec:
    """Normalized CPU facts from the text of /proc/cpuinfo on a machine of ``arch``: the agent's
    parser (``edgekit.agent.facts.parse_cpuinfo``, the one the device runs) plus the core count.

    ``core`` is the Cortex/Neoverse name on ARM (from implementer + part; big.LITTLE
    parts are joined with "+" in the order the kernel lists them) and the
    "model name" on x86. ``isa`` keeps only the features edgekit dispatches on.
    """
    arch = normalize_arch(arch)
    core, isa = parse_cpuinfo(text, arch)
    processors = sum(1 for line in text.splitlines() if line.partition(":")[0].strip().lower() == "processor")
    return CpuSpec(arch=arch, core=core, isa=tuple(isa), cores=cores or processors or None)


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
