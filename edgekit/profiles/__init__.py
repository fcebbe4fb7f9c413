"""Target profiles: TOML data describing a device class, and the code that loads it.

>>> from edgekit.profiles import load_profile, resolve
>>> profile = resolve(load_profile("rpi5"))
>>> profile.backend("native").precisions
('int8',)
"""

from __future__ import annotations

from edgekit.profiles.loader import (
    list_profiles,
    load_profile,
    profile_dirs,
    resolve,
    validate_file,
)
from edgekit.profiles.model import BACKENDS, ISA_FEATURES, PRECISIONS, BackendSpec, CpuSpec, Profile
from edgekit.profiles.probe import cpu_from_cpuinfo, probe_host

__all__ = [
    "BACKENDS", "ISA_FEATURES", "PRECISIONS", "BackendSpec", "CpuSpec", "Profile", "cpu_from_cpuinfo",
    "list_profiles", "load_profile", "probe_host", "profile_dirs", "resolve", "validate_file",
]  # fmt: skip
