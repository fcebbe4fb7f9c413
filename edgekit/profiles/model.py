"""The profile data model: what a device class is, as frozen dataclasses.

A profile is data. The loader turns TOML into these objects after validating every key;
nothing here reads files or probes hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgekit.agent import version_tuple
from edgekit.agent.backends import BACKENDS as AGENT_BACKENDS
from edgekit.agent.facts import ARM_ISA, ISA_ORDER, X86_ISA
from edgekit.jsonable import FieldsDict, fields_dict

BACKENDS = tuple(AGENT_BACKENDS)  # the one registry of backend names (the agent's)
PRECISIONS = ("int8", "fp16", "fp32")
ARCHES = ("x86_64", "aarch64", "armv7l")

# ISA feature names, per architecture family: the features the backends and the native runtime
# dispatch on, named once, in the agent (the device reports them in its facts): Linux
# /proc/cpuinfo's words ("asimddp", "avx512_vnni"), "neon" for Advanced SIMD, "fp16" for asimdhp.
ISA_FEATURES = ISA_ORDER
ISA_BY_ARCH = {"x86_64": X86_ISA, "aarch64": ARM_ISA, "armv7l": ARM_ISA}


@dataclass(frozen=True)
class BackendSpec(FieldsDict):
    name: str
    precisions: tuple[str, ...]
    device: str | None = None
    min_version: str | None = None
    max_version: str | None = None
    dla_cores: int = 0
    notes: str = ""

    def version_ok(self, version: str) -> bool:
        """Does runtime ``version`` fall inside [min_version, max_version]?

        Bounds compare on the components they give: max_version "2022.3" admits 2022.3.2
        (a patch release of 2022.3) but not 2023.0.
        """
        have = version_tuple(version)
        if self.min_version and have < version_tuple(self.min_version):
            return False
        if self.max_version:
            bound = version_tuple(self.max_version)
            if have[: len(bound)] > bound:
                return False
        return True

    def bounds(self) -> str:
        """The version bounds as text: ``">= 8.0 and <= 8.6"``, "" when any version will do."""
        return " and ".join(f"{op} {v}" for op, v in ((">=", self.min_version), ("<=", self.max_version)) if v)


@dataclass(frozen=True)
class CpuSpec(FieldsDict):
    arch: str  # "" only in a probe profile that has not been resolved yet
    core: str | None
    isa: tuple[str, ...]
    cores: int | None


@dataclass(frozen=True)
class BenchDefaults(FieldsDict):
    warmup: int | str = "auto"  # untimed runs first: a count, or "auto" (until stable, bounded)
    iterations: int = 100
    # ... and at least this long, unless a count was asked for: a model of microseconds timed for
    # 100 runs is a window of a few ms, which one neighbour's burst or a clock step moves by tens of %
    min_time_s: float = 0.5  # Google Benchmark's default min time
    threads: int | None = None  # None = all cores
    # agent processes per variant, their samples merged: a process's own speed (memory placement,
    # which core) differs by several % from the next one's, which one process cannot show
    rounds: int = 1


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    source: str  # "builtin" or the file it came from
    cpu: CpuSpec
    accelerator: str | None
    backends: tuple[BackendSpec, ...]  # preference order
    probe: bool = False  # cpu facts come from probing the machine (see resolve())
    workdir: str = "~/.edgekit"
    python: str = "python3"
    bench: BenchDefaults = field(default_factory=BenchDefaults)

    def backend(self, name: str) -> BackendSpec | None:
        """The spec of backend ``name``, or None when this device cannot use it."""
        return next((spec for spec in self.backends if spec.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        # the fields in order, except that the document has probe right after source
        doc = fields_dict(self)
        return {**{key: doc.pop(key) for key in ("name", "description", "source", "probe")}, **doc}
