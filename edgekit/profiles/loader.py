"""Find, read and validate profile TOML files.

Search order for a name (first hit wins): ``./profiles/<name>.toml`` (relative to the
working directory), ``$EDGEKIT_CONFIG_DIR/profiles/<name>.toml`` (default: the platform's
user config dir), then the built-ins shipped beside this module. Anything containing a
path separator or ending in ``.toml`` is a file path instead.

Every error names the file, the key (dotted path, 0-based array indices, e.g.
``backends[1].precisions[0]``) and the values allowed there.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import platformdirs

from edgekit.errors import ProfileError
from edgekit.profiles.model import (
    ARCHES,
    BACKENDS,
    ISA_BY_ARCH,
    ISA_FEATURES,
    PRECISIONS,
    BackendSpec,
    BenchDefaults,
    CpuSpec,
    Profile,
    version_tuple,
)
from edgekit.profiles.probe import probe_host
from edgekit.tomlkeys import closest, unknown_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SCHEMA_VERSION = 1
BUILTIN_DIR = Path(__file__).resolve().parent

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")
_ORT_EP_RE = re.compile(r"^[A-Za-z0-9]+ExecutionProvider$")

_TOP_KEYS = ("schema", "name", "description", "accelerator", "cpu", "device", "backends", "bench")
_CPU_KEYS = ("arch", "core", "isa", "cores", "probe")
_DEVICE_KEYS = ("workdir", "python")
_BACKEND_KEYS = ("name", "precisions", "device", "min_version", "max_version", "dla_cores", "notes")
_BENCH_KEYS = ("warmup", "iterations", "min_time", "threads", "rounds")

# The device string each backend understands (onnxruntime: an execution provider name).
_BACKEND_DEVICES: dict[str, tuple[str, ...]] = {
    "native": ("CPU",),
    "tflite": ("CPU",),
    "tensorrt": ("GPU",),
    "openvino": ("CPU", "GPU", "NPU", "MYRIAD"),
    "numpy": ("CPU",),
}

_TOML_TYPES = {str: "a string", int: "an integer", float: "a float", bool: "a boolean", list: "an array", dict: "a table"}


# -- search -----------------------------------------------------------------------------


def _config_dir() -> Path:
    env = os.environ.get("EDGEKIT_CONFIG_DIR")
    return Path(env) if env else Path(platformdirs.user_config_dir("edgekit"))


def profile_dirs(cwd: Path | None = None) -> list[Path]:
    """Where profiles are looked up, in search order (the last one holds the built-ins)."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    return [cwd / "profiles", _config_dir() / "profiles", BUILTIN_DIR]


def _is_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.endswith(".toml")


def load_profile(name_or_path: str | os.PathLike[str], *, cwd: Path | None = None) -> Profile:
    """Load a profile by name (searched, see module doc) or by file path, validated."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or _is_path(text):
        return _load_file(_absolute(text, cwd))
    if _NAME_RE.match(text):
        for directory in profile_dirs(cwd):
            candidate = directory / f"{text}.toml"
            if candidate.is_file():
                return _load_file(candidate)
    close = difflib.get_close_matches(text, sorted(_visible_files(cwd)), n=3, cutoff=0.5)
    hint = "`edgekit profiles list` shows every profile; add your own as ./profiles/<name>.toml"
    if close:
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "? " + hint
    raise ProfileError(f"unknown target profile {text!r}", hint)


def list_profiles(*, cwd: Path | None = None) -> list[Profile]:
    """Every visible profile, sorted by name; a user file shadows a built-in of the same name."""
    loaded = {name: _load_file(path) for name, path in _visible_files(cwd).items()}
    return [loaded[name] for name in sorted(loaded)]


def validate_file(path: Path | str) -> Profile:
    """Read and validate one profile file; raises ProfileError naming file, key and allowed values."""
    return _load_file(_absolute(os.fspath(path), Path.cwd()))


def resolve(profile: Profile, *, cpu: CpuSpec | None = None) -> Profile:
    """Fill in the cpu facts of a probe profile; other profiles come back unchanged.

    ``cpu`` defaults to probing this machine; pass the facts of a remote device (e.g. from
    ``cpu_from_cpuinfo`` on its /proc/cpuinfo) when the probe profile targets one.
    """
    if not profile.probe:
        return profile
    return replace(profile, cpu=cpu if cpu is not None else probe_host())


def _visible_files(cwd: Path | None) -> dict[str, Path]:
    """Each visible profile's file by name, in search order (the first file of a name wins)."""
    files: dict[str, Path] = {}
    for directory in profile_dirs(cwd):
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                files.setdefault(path.stem, path)
    return files


def _absolute(text: str, cwd: Path) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else cwd / path


# -- reading ----------------------------------------------------------------------------


def _load_file(path: Path) -> Profile:
    file = str(path)
    hint = "check the path; `edgekit profiles list` shows the profiles edgekit can find"
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ProfileError(f"profile file not found: {file}", hint) from None
    except IsADirectoryError:
        raise ProfileError(f"profile path is a directory, not a TOML file: {file}", hint) from None
    except PermissionError:
        raise ProfileError(f"cannot read profile file (permission denied): {file}", hint) from None
    except UnicodeDecodeError as exc:
        raise ProfileError(
            f"{file}: not UTF-8 text (byte {exc.start})", "profiles are UTF-8 TOML files"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(
            f"{file}: invalid TOML: {' '.join(str(exc).split())}",
            "fix the syntax at that line (https://toml.io), then run: edgekit profiles validate "
            + shlex.quote(file),
        ) from None
    source = "builtin" if path.resolve().parent == BUILTIN_DIR else file
    return _Parser(file).profile(doc, stem=path.stem, source=source)


# -- validation -------------------------------------------------------------------------


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _type_name(value: Any) -> str:
    return _TOML_TYPES.get(type(value), f"a {type(value).__name__}")  # else a datetime


class _Parser:
    """Turns one parsed TOML document into a Profile, or raises at the first bad key."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, key: str, problem: str, allowed: str) -> NoReturn:
        raise ProfileError(
            f"{self.file}: {key}: {problem}; allowed: {allowed}",
            "edit the file (keys are described in docs/profiles.md), then run: "
            f"edgekit profiles validate {shlex.quote(self.file)}",
        )

    def keys(self, table: dict[str, Any], prefix: str, allowed: tuple[str, ...]) -> None:
        bad = unknown_key(table, allowed)
        if bad:
            key = bad[0]
            close = closest(key, allowed)
            problem = f"unknown key{f' (did you mean {close!r}?)' if close else ''}"
            self.fail(_join(prefix, repr(key) if not _NAME_RE.match(key) else key), problem, ", ".join(allowed))

    def value(self, table: dict[str, Any], key: str, prefix: str, typ: type, *, required: bool, allowed: str) -> Any:
        path = _join(prefix, key)
        if key not in table:
            if required:
                self.fail(path, "missing", allowed)
            return None
        value = table[key]
        if type(value) is not typ:  # exact: a TOML boolean is not an integer here
            self.fail(path, f"expected {_TOML_TYPES[typ]}, got {_type_name(value)}", allowed)
        return value

    def string(
        self, table: dict[str, Any], key: str, prefix: str, *, required: bool = False,
        choices: tuple[str, ...] | None = None, allowed: str = "a non-empty string",
    ) -> str | None:
        allowed = ", ".join(choices) if choices else allowed
        value = self.value(table, key, prefix, str, required=required, allowed=allowed)
        if value is None:
            return None
        if choices is not None and value not in choices:
            self.fail(_join(prefix, key), f"unknown value {value!r}", allowed)
        if not value.strip():
            self.fail(_join(prefix, key), "empty string", allowed)
        return value

    def integer(self, table: dict[str, Any], key: str, prefix: str, *, minimum: int) -> int | None:
        allowed = f"an integer >= {minimum}"
        value = self.value(table, key, prefix, int, required=False, allowed=allowed)
        if value is not None and value < minimum:
            self.fail(_join(prefix, key), f"{value} is too small", allowed)
        return value

    def string_list(
        self, table: dict[str, Any], key: str, prefix: str, *, choices: tuple[str, ...], required: bool,
        what: str,
    ) -> tuple[str, ...]:
        allowed = ", ".join(choices)
        items = self.value(table, key, prefix, list, required=required, allowed=f"an array of {allowed}")
        if items is None:
            return ()
        path = _join(prefix, key)
        if required and not items:
            self.fail(path, "empty array", f"one or more of {allowed}")
        for i, item in enumerate(items):
            if type(item) is not str:
                self.fail(f"{path}[{i}]", f"expected a string, got {_type_name(item)}", allowed)
            if item not in choices:
                self.fail(f"{path}[{i}]", f"unknown {what} {item!r}", allowed)
            if item in items[:i]:
                self.fail(f"{path}[{i}]", f"duplicate {what} {item!r}", f"each of {allowed} at most once")
        return tuple(items)

    def table(self, doc: dict[str, Any], key: str, keys: tuple[str, ...]) -> dict[str, Any]:
        if key not in doc:
            return {}
        value = doc[key]
        if type(value) is not dict:
            self.fail(key, f"expected a table [{key}], got {_type_name(value)}", ", ".join(keys))
        self.keys(value, key, keys)
        return value

    # -- sections ---------------------------------------------------------------------

    def profile(self, doc: dict[str, Any], *, stem: str, source: str) -> Profile:
        self.keys(doc, "", _TOP_KEYS)
        schema = self.value(doc, "schema", "", int, required=True, allowed=str(SCHEMA_VERSION))
        if schema != SCHEMA_VERSION:
            self.fail("schema", f"unsupported schema version {schema}", str(SCHEMA_VERSION))
        name_rule = "the file name without .toml (letters, digits, '.', '_', '-')"
        name = self.string(doc, "name", "", allowed=name_rule)
        if not _NAME_RE.match(stem):
            self.fail("name", f"file name {stem!r} is not a valid profile name", name_rule)
        if name is not None and name != stem:
            self.fail("name", f"{name!r} does not match the file name {stem + '.toml'!r}", repr(stem))
        description = self.string(doc, "description", "") or ""
        accelerator = self.string(doc, "accelerator", "")
        probe, cpu = self.cpu(doc)
        device = self.table(doc, "device", _DEVICE_KEYS)
        bench = self.bench(doc)
        return Profile(
            name=stem,
            description=description,
            source=source,
            cpu=cpu,
            accelerator=accelerator,
            backends=self.backends(doc),
            probe=probe,
            workdir=self.string(device, "workdir", "device") or "~/.edgekit",
            python=self.string(device, "python", "device") or "python3",
            bench=bench,
        )

    def cpu(self, doc: dict[str, Any]) -> tuple[bool, CpuSpec]:
        if "cpu" not in doc:
            self.fail("cpu", "missing [cpu] table", f"a [cpu] table with arch ({', '.join(ARCHES)}) or probe = true")
        cpu = self.table(doc, "cpu", _CPU_KEYS)
        probe = bool(self.value(cpu, "probe", "cpu", bool, required=False, allowed="true, false"))
        if probe:
            for key in ("arch", "core", "isa", "cores"):
                if key in cpu:
                    self.fail(f"cpu.{key}", "not allowed with cpu.probe = true (the facts come from probing)",
                              "probe alone, or drop probe and give arch, core, isa, cores")
            return True, CpuSpec(arch="", core=None, isa=(), cores=None)
        arch = self.string(cpu, "arch", "cpu", required=True, choices=ARCHES)
        assert arch is not None
        isa = self.string_list(cpu, "isa", "cpu", choices=ISA_FEATURES, required=False, what="ISA feature")
        for i, feature in enumerate(isa):
            if feature not in ISA_BY_ARCH[arch]:
                self.fail(f"cpu.isa[{i}]", f"{feature!r} is not a feature of {arch} CPUs",
                          ", ".join(ISA_BY_ARCH[arch]))
        return False, CpuSpec(
            arch=arch,
            core=self.string(cpu, "core", "cpu"),
            isa=isa,
            cores=self.integer(cpu, "cores", "cpu", minimum=1),
        )

    def backends(self, doc: dict[str, Any]) -> tuple[BackendSpec, ...]:
        allowed = f"one or more [[backends]] tables, name one of {', '.join(BACKENDS)}"
        entries = self.value(doc, "backends", "", list, required=True, allowed=allowed)
        if not entries:
            self.fail("backends", "empty array", allowed)
        specs: list[BackendSpec] = []
        for i, entry in enumerate(entries):
            prefix = f"backends[{i}]"
            if type(entry) is not dict:
                self.fail(prefix, f"expected a table ([[backends]]), got {_type_name(entry)}", allowed)
            self.keys(entry, prefix, _BACKEND_KEYS)
            name = self.string(entry, "name", prefix, required=True, choices=BACKENDS)
            assert name is not None
            for j, earlier in enumerate(specs):
                if earlier.name == name:
                    self.fail(f"{prefix}.name", f"duplicate backend {name!r} (also backends[{j}])",
                              "each backend once; list them in order of preference")
            precisions = self.string_list(entry, "precisions", prefix, choices=PRECISIONS, required=True,
                                          what="precision")
            specs.append(
                BackendSpec(
                    name=name,
                    precisions=precisions,
                    device=self.backend_device(entry, prefix, name),
                    **self.versions(entry, prefix),
                    dla_cores=self.dla_cores(entry, prefix, name),
                    notes=self.string(entry, "notes", prefix) or "",
                )
            )
        return tuple(specs)

    def backend_device(self, entry: dict[str, Any], prefix: str, backend: str) -> str | None:
        if backend == "onnxruntime":
            allowed = "an ONNX Runtime execution provider name, e.g. CPUExecutionProvider"
            device = self.string(entry, "device", prefix, allowed=allowed)
            if device is not None and not _ORT_EP_RE.match(device):
                self.fail(f"{prefix}.device", f"unknown value {device!r}", allowed)
            return device
        return self.string(entry, "device", prefix, choices=_BACKEND_DEVICES[backend])

    def versions(self, entry: dict[str, Any], prefix: str) -> dict[str, str | None]:
        allowed = "a dotted version string such as \"2022.3\" or \"8.5\""
        found: dict[str, str | None] = {}
        for key in ("min_version", "max_version"):
            version = self.string(entry, key, prefix, allowed=allowed)
            if version is not None and not _VERSION_RE.match(version):
                self.fail(f"{prefix}.{key}", f"{version!r} is not a version", allowed)
            found[key] = version
        low, high = found["min_version"], found["max_version"]
        if low and high and version_tuple(low) > version_tuple(high):
            self.fail(f"{prefix}.max_version", f"{high!r} is below min_version {low!r}", f"a version >= {low}")
        return found

    def dla_cores(self, entry: dict[str, Any], prefix: str, backend: str) -> int:
        cores = self.integer(entry, "dla_cores", prefix, minimum=0) or 0
        if cores and backend != "tensorrt":
            self.fail(f"{prefix}.dla_cores", f"{backend} has no DLA cores (only tensorrt uses them)", "0")
        return cores

    def bench(self, doc: dict[str, Any]) -> BenchDefaults:
        bench = self.table(doc, "bench", _BENCH_KEYS)
        defaults = BenchDefaults()
        # "auto" (the default): warm up until latency is stable, bounded (the agent's rule)
        warmup = "auto" if bench.get("warmup") == "auto" else self.integer(bench, "warmup", "bench", minimum=0)
        iterations = self.integer(bench, "iterations", "bench", minimum=1)
        min_time = bench.get("min_time")  # a TOML integer or float; a boolean is neither here
        if min_time is not None and (type(min_time) not in (int, float) or not 0 <= min_time <= 3600):
            self.fail("bench.min_time", f"expected seconds, got {min_time!r}", "a number of seconds in 0..3600 (0: exactly the iterations)")
        return BenchDefaults(
            warmup=defaults.warmup if warmup is None else warmup,
            iterations=defaults.iterations if iterations is None else iterations,
            min_time_s=defaults.min_time_s if min_time is None else float(min_time),
            threads=self.integer(bench, "threads", "bench", minimum=1),
            rounds=self.integer(bench, "rounds", "bench", minimum=1) or defaults.rounds,
        )
