"""ekrt's C sources for one target arch, from ``csrc/sources.toml`` (the one description).

Read by ``setup.py`` (the extension ``edgekit._ekrt``; it loads this file by path, so this
module imports nothing from edgekit and only the standard library) and by the cross builder
(``edgekit/targets/native/build.py``, the static ``ekrt`` runner).

    srcs = c_sources("aarch64", "runner")           # [CSource(path, isa, flags), ...]
    srcs = c_sources("x86_64", "extension", supported=lambda isa, flags: ...)
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8": "aarch64", "armv7": "armv7l"}
TARGETS = ("extension", "runner", "fuzz")
# kernel ISA -> the CPU feature it needs, in edgekit/profiles/model.py's words (what
# `ekrt info`, _ekrt.features() and the kernel tests print; csrc/include/edgekit/cpu.h)
ISA_FEATURE = {"neon": "neon", "neondot": "asimddp", "avx2": "avx2", "avx512vnni": "avx512_vnni", "avx512vbmi": "avx512vbmi", "amx": "amx_int8"}


def normalize_arch(arch: str) -> str:
    """``platform.machine()``-style names to the profile vocabulary (x86_64, aarch64, armv7l)."""
    a = arch.strip().lower()
    return ARCH_ALIASES.get(a, a)


def csrc_dir() -> Path:
    """The C sources: ``edgekit/_csrc`` in an installed wheel, else the repository's ``csrc/``."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "_csrc", here.parents[3] / "csrc"):
        if (candidate / "sources.toml").is_file():
            return candidate
    raise FileNotFoundError(f"ekrt's C sources (sources.toml) are not beside {here.parents[2]}")


SOURCE_SUFFIXES = (".c", ".h", ".inc", ".toml")
NOT_SOURCES = ("build", "corpus", "__pycache__")  # folders a wheel's copy of csrc/ leaves out (setup.py)


def content_hash(csrc: Path | None = None) -> str:
    """A hash of every C source, header, list and sources.toml under ``csrc``: a runner built
    from sources with this hash matches them (an edited checkout no longer does)."""
    csrc = Path(csrc) if csrc else csrc_dir()
    h = hashlib.sha256()
    for path in sorted(p for p in csrc.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
        rel = path.relative_to(csrc)
        if any(part.startswith(NOT_SOURCES) for part in rel.parts[:-1]):
            continue
        h.update(rel.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:24]


@dataclass(frozen=True)
class CSource:
    path: Path
    isa: str | None  # None: runtime/common code, built on every arch
    flags: tuple[str, ...] = ()


@dataclass
class SourceSet:
    """What to compile for one arch and target, and with which flags."""

    arch: str
    target: str
    sources: list[CSource] = field(default_factory=list)
    include_dirs: list[Path] = field(default_factory=list)
    cflags: list[str] = field(default_factory=list)
    defines: list[str] = field(default_factory=list)  # -D names for ISAs left out
    libraries: list[str] = field(default_factory=list)
    ldflags: list[str] = field(default_factory=list)
    isas: list[str] = field(default_factory=list)  # ISAs whose kernels are compiled
    skipped: dict[str, str] = field(default_factory=dict)  # ISA -> why it was left out


def load_description(csrc: Path | None = None) -> dict:
    csrc = Path(csrc) if csrc else csrc_dir()
    with open(csrc / "sources.toml", "rb") as fh:
        return tomllib.load(fh)


def flag_choices(spec: dict) -> list[tuple[str, ...]]:
    """An ISA's flags: one list, or a list of alternatives tried in order (compilers spell
    them differently: gcc/clang ``-march=armv8.2-a+dotprod``, zig ``-mcpu=generic+dotprod``)."""
    flags = spec.get("flags", [])
    if flags and all(isinstance(f, list) for f in flags):
        return [tuple(f) for f in flags]
    return [tuple(flags)]


def isa_of(path: str | Path, isas: dict) -> str | None:
    """The ISA word of a kernel file name (``qs8-vadd-avx2-u16.c`` -> ``avx2``), or None."""
    words = Path(path).stem.split("-")
    found = [w for w in words if w in isas]
    if len(found) > 1:
        raise ValueError(f"{path}: more than one ISA word in the file name ({', '.join(found)})")
    return found[0] if found else None


def c_sources(
    arch: str,
    target: str,
    csrc: Path | None = None,
    supported: Callable[[str, tuple[str, ...]], bool] | None = None,
) -> SourceSet:
    """The sources, flags and defines that build ``target`` ("extension", "runner" or "fuzz") for ``arch``.

    ``supported(isa, flags)`` says whether the compiler takes an ISA's flags (None: assume it
    does); an ISA it rejects is left out and its ``define`` is added for every file.
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, not {target!r}")
    csrc = Path(csrc) if csrc else csrc_dir()
    desc = load_description(csrc)
    arch = normalize_arch(arch)
    isas: dict = desc.get("isa", {})
    out = SourceSet(
        arch=arch,
        target=target,
        include_dirs=[csrc / d for d in desc.get("include_dirs", [])],
        cflags=list(desc.get("cflags", [])),
        libraries=list(desc.get("libraries", [])),
        ldflags=list(desc.get(f"{target}_ldflags", [])),
    )
    enabled: dict[str, tuple[str, ...]] = {}
    for name, spec in isas.items():
        if arch not in spec.get("archs", []):
            continue  # the kernel files compile to nothing elsewhere; don't even list them
        choices = flag_choices(spec)
        chosen = next((f for f in choices if not f or supported is None or supported(name, f)), None)
        if chosen is None:
            out.skipped[name] = "the compiler rejects " + " and ".join(" ".join(f) for f in choices)
            if spec.get("define"):
                out.defines.append(spec["define"])
            continue
        enabled[name] = chosen
    out.isas = [n for n in isas if n in enabled]
    patterns = list(desc.get("runtime", [])) + list(desc.get("kernels", [])) + list(desc.get(target, []))
    hits = (sorted(glob.glob(os.path.join(str(csrc), pattern))) for pattern in patterns)
    # a file that several patterns match is listed once, where it first appears
    for path in dict.fromkeys(Path(hit) for group in hits for hit in group):
        isa = isa_of(path, isas)
        if isa is not None and isa not in enabled:
            continue
        out.sources.append(CSource(path, isa, enabled.get(isa, ()) if isa else ()))
    return out


__all__ = [
    "CSource", "SourceSet", "c_sources", "content_hash", "csrc_dir", "flag_choices", "isa_of", "load_description", "normalize_arch",
]
