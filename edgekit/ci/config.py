"""edgekit.toml: what `edgekit ci` runs (models x targets x devices), how it gates, against what.

```toml
inventory = "devices.toml"          # optional: where device names and @groups are looked up
jobs = 4                            # devices worked on at once (per model and target)
# engine = "ansible"                # with an Ansible inventory (hosts.ini / hosts.yml): Ansible reaches
                                    #   the devices (the default when ansible-runner is installed); "ssh": edgekit's own

[defaults]                          # any [[models]] key, for every model that does not set it
iterations = 50

[baseline]                          # default: the newest passing run on the default branch, else anywhere
branch = "main"                     # or one of: ref = "branch:NAME" | "tag:NAME" | "latest" | "12,13" | "FILE.json"
                                    #            tag = "golden" (edgekit results pin)   file = "ci/baseline.json"

[[models]]
path = "examples/digits/digits_cnn.onnx"
targets = ["local"]                 # profile names; devices default to the inventory's devices
devices = ["pi1", "@lab"]           #   of that profile, else this machine
gates = ["p50:+5%", "accuracy:-0.5pt", "p99:<20ms"]
```

Everything is checked here, before anything runs: unknown keys, wrong types, gate strings,
missing files, unknown profiles. Errors name the file and, where the file shows it, the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError, InputError, UsageError
from edgekit.tomlkeys import unknown_key

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_TOP = ("models", "defaults", "baseline", "inventory", "jobs", "engine")
_BASELINE = ("ref", "branch", "tag", "file")
# key -> (python types accepted, what to say when it is something else)
_MODEL: dict[str, tuple[tuple[type, ...], str]] = {
    "path": ((str,), "a model file path"),
    "name": ((str,), "a string"),
    "targets": ((list,), "a list of profile names"),
    "devices": ((list,), "a list of device names (inventory names, @GROUP, ssh aliases, local)"),
    "gates": ((list,), 'a list of gate strings such as "p50:+5%"'),
    "calib": ((str,), "a data path"),
    "eval": ((str,), "a data path"),
    "labels": ((str,), "a .npy path"),
    "max_drop": ((int, float), "accuracy points (a number, as deploy --max-drop)"),
    "iterations": ((int,), "a positive integer"),
    "warmup": ((int,), "a non-negative integer"),
    "duration": ((int, float), "seconds (a positive number)"),
    "min_time": ((int, float), "seconds (a number >= 0): time at least --iterations and at least this long"),
    "threads": ((int,), "a positive integer"),
    "rounds": ((int,), "a positive integer (agent processes per variant)"),
    "quantize": ((bool,), "true or false"),
    "layers": ((bool,), "true or false (per-layer times, a separate profiled pass)"),
    "backend": ((str,), "a backend name"),
    "method": ((str,), "a calibration method"),
    "preprocess": ((str,), "image preprocessing as --preprocess takes it, e.g. 'scale=1/255,mean=0.5,std=0.5,color=rgb'"),
    "metric": ((str,), "the int8 check's metric (top1, cosine, snr, iou, ctc or module.py:fn)"),
    "threshold": ((int, float), "the figure the int8 check must reach, in the metric's unit (e.g. 0.9 for iou)"),
    "strict": ((bool,), "true (the default in ci: an int8 model that misses its threshold fails the run, exit 5) or false (a warning)"),
}


class ConfigError(InputError):
    """edgekit.toml is unusable (exit 3)."""


@dataclass(frozen=True)
class Baseline:
    """What each run is compared with. Never a run whose gates failed, unless named by id:

    * ``default``: the newest passing comparable run on the default branch, else on any branch;
    * ``latest``: the newest passing comparable run (on ``branch`` when given);
    * ``tag``: the run pinned as ``name`` (edgekit results pin), else of the git tag ``name``;
    * ``ids``: given store run ids; ``file``: the records of an export file.
    """

    kind: str  # "default" | "latest" | "tag" | "ids" | "file"
    branch: str | None = None
    ids: tuple[int, ...] = ()
    file: Path | None = None
    name: str | None = None

    def describe(self) -> str:
        if self.kind == "default":
            return "the latest passing run on the default branch (else on any branch)"
        if self.kind == "file":
            return f"file {self.file}"
        if self.kind == "ids":
            return "runs " + ", ".join(map(str, self.ids))
        if self.kind == "tag":
            return f"tag:{self.name}"
        return f"latest passing on {self.branch}" if self.branch else "latest passing run"


@dataclass(frozen=True)
class ModelSpec:
    path: Path
    name: str
    runs: tuple[tuple[str, tuple[Any, ...]], ...]  # (target, its DeviceEntry list), in file order
    gates: tuple[Any, ...]  # edgekit.bench.gates.Gate
    options: dict[str, Any] = field(default_factory=dict)  # edgekit.api.request keyword arguments


@dataclass(frozen=True)
class CiConfig:
    path: Path
    models: tuple[ModelSpec, ...]
    baseline: Baseline
    inventory: Path | None
    jobs: int
    engine: str = "ssh"  # who reaches the inventory's devices: ssh (edgekit's own) or ansible


def load_config(path: Path, *, baseline: str | None = None) -> CiConfig:
    """Read and check ``path``; ``baseline`` (a --baseline REF) overrides the file's [baseline]."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no {path.name} at {path}", "write one (see examples/ci/README.md), or give --config FILE")
    try:
        text = path.read_text(encoding="utf-8")
        doc = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})", "save the file as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        where = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        loc = f"{path}:{where[1]}:{where[2]}" if where else str(path)
        what = msg[: where.start()].strip() if where else msg
        raise ConfigError(f"{loc}: TOML syntax error: {what}", "fix the syntax (https://toml.io)") from None
    return _Reader(path, text).config(doc, baseline)


class _Reader:
    """Checks one parsed file; knows the text so errors can name a line."""

    def __init__(self, path: Path, text: str) -> None:
        self.path, self.lines = path, text.splitlines()
        self.root = path.resolve().parent  # relative paths in the file are relative to it

    def fail(self, where: str, message: str, hint: str, *, section: tuple[str, int] | None = None, key: str | None = None) -> ConfigError:
        line = self._line(section, key) if section else None
        loc = f"{self.path}:{line}" if line else str(self.path)
        return ConfigError(f"{loc}: {where}: {message}" if where else f"{loc}: {message}", hint)

    def _line(self, section: tuple[str, int], key: str | None) -> int | None:
        """The line of ``key`` in the ``index``-th ``[name]``/``[[name]]`` section (1-based), else of the header."""
        name, index = section
        header = re.compile(rf"^\s*\[\[?\s*{re.escape(name)}\s*\]\]?\s*(#.*)?$")
        seen, start = -1, None
        for i, ln in enumerate(self.lines):
            if start is None and header.match(ln):
                seen += 1
                if seen == index:
                    start = i
                continue
            if start is not None and re.match(r"^\s*\[", ln):
                break
            if start is not None and key and re.match(rf"^\s*{re.escape(key)}\s*=", ln):
                return i + 1
        if start is None and key and name == "":
            return next((i + 1 for i, ln in enumerate(self.lines) if re.match(rf"^\s*{re.escape(key)}\s*=", ln)), None)
        return start + 1 if start is not None else None

    def unknown(self, table: dict, known: tuple[str, ...], where: str, section: tuple[str, int]) -> None:
        bad = unknown_key(table, known)
        if bad:
            raise self.fail(where, bad[1], bad[2], section=section, key=bad[0])

    def config(self, doc: dict, baseline_ref: str | None) -> CiConfig:
        self.unknown(doc, _TOP, "", ("", 0))
        models = doc.get("models")
        if not isinstance(models, list) or not models or not all(isinstance(m, dict) for m in models):
            raise self.fail("", "no [[models]]", 'add a [[models]] table with path = "model.onnx" and targets = ["local"]')
        defaults = doc.get("defaults", {})
        if not isinstance(defaults, dict):
            raise self.fail("defaults", "must be a table", "write it as [defaults] with model keys")
        self.unknown(defaults, tuple(k for k in _MODEL if k not in ("path", "name")), "defaults", ("defaults", 0))
        inventory = doc.get("inventory")
        if inventory is not None and not isinstance(inventory, str):
            raise self.fail("inventory", "must be a path string", 'e.g. inventory = "devices.toml"', section=("", 0), key="inventory")
        jobs = doc.get("jobs", 4)
        if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
            raise self.fail("jobs", f"must be a positive integer, got {jobs!r}", "e.g. jobs = 4", section=("", 0), key="jobs")
        inv = self._file(inventory, "inventory", ("", 0)) if inventory else None
        engine = doc.get("engine")
        if engine is not None and not isinstance(engine, str):
            raise self.fail("engine", f"must be a string, got {engine!r}", 'engine = "ansible" or "ssh"', section=("", 0), key="engine")
        from edgekit.devices.ansible import choose_engine

        try:
            engine = choose_engine(engine, inv)
        except EdgekitError as exc:
            raise self.fail("engine", exc.message.replace("--engine", "engine").replace("--inventory", "inventory"),
                            exc.hint.replace("--inventory", "inventory =").replace("--engine", "engine ="), section=("", 0), key="engine") from None  # fmt: skip
        specs = tuple(self.model(i, {**defaults, **m}, inv) for i, m in enumerate(models))
        names = [s.name for s in specs]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise self.fail("models", f"two models are named '{dup}'", "give one of them another name = \"...\"")
        return CiConfig(self.path, specs, self.baseline(doc.get("baseline"), baseline_ref), inv, jobs, engine)

    def model(self, i: int, m: dict, inventory: Path | None) -> ModelSpec:
        where, section = f"models[{i}]", ("models", i)
        self.unknown(m, tuple(_MODEL), where, section)
        for key, value in m.items():
            types, what = _MODEL[key]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise self.fail(f"{where}.{key}", f"must be {what}, got {value!r}", f"fix {key} in {self.path.name}", section=section, key=key)
            if isinstance(value, list) and not all(isinstance(v, str) for v in value):
                raise self.fail(f"{where}.{key}", f"must be {what}, got {value!r}", "use a list of strings", section=section, key=key)
        for key, low in (("iterations", 1), ("warmup", 0), ("threads", 1), ("rounds", 1)):
            if key in m and m[key] < low:
                raise self.fail(f"{where}.{key}", f"must be >= {low}, got {m[key]}", f"fix {key}", section=section, key=key)
        if "duration" in m and m["duration"] <= 0:
            raise self.fail(f"{where}.duration", "must be positive", "give seconds, e.g. duration = 5", section=section, key="duration")
        if "min_time" in m and not 0 <= m["min_time"] <= 3600:
            raise self.fail(f"{where}.min_time", "must be seconds in 0..3600", "give seconds, e.g. min_time = 1", section=section, key="min_time")
        if "path" not in m:
            raise self.fail(where, "no path", 'add path = "model.onnx"', section=section)
        model = self._file(m["path"], f"{where}.path", section, key="path")
        from edgekit.modelio import check_model_file

        try:  # a file that is no model fails the config, before any run and any output file
            check_model_file(model)
        except EdgekitError as exc:
            raise self.fail(f"{where}.path", exc.message, exc.hint, section=section, key="path") from None
        if "targets" in m and not m["targets"]:
            raise self.fail(f"{where}.targets", "is empty: the model would run nowhere", 'name at least one profile, e.g. targets = ["local"] (or leave targets out for local)', section=section, key="targets")
        runs = tuple((t, self._devices(t, m.get("devices") or [], inventory, where, section)) for t in m.get("targets") or ["local"])
        gates = tuple(self._gate(g, f"{where}.gates[{j}]", section) for j, g in enumerate(m.get("gates") or ()))
        options: dict[str, Any] = {}
        for key in ("calib", "eval", "labels"):
            if key in m:
                options[key] = self._file(m[key], f"{where}.{key}", section, key=key, folder=key != "labels")
        if "method" in m:
            from edgekit.quantize.calib import parse_method

            try:
                parse_method(m["method"])  # e.g. mse+clip+bias
            except UsageError as exc:
                raise self.fail(f"{where}.method", exc.message, exc.hint, section=section, key="method") from None
        if "preprocess" in m:
            from edgekit.quantize.calib import Preprocess

            try:
                options["preprocess"] = Preprocess.parse(m["preprocess"])  # the CLI's --preprocess syntax
            except EdgekitError as exc:
                raise self.fail(f"{where}.preprocess", exc.message, exc.hint, section=section, key="preprocess") from None
        renamed = {"duration": "duration_s", "min_time": "min_time_s"}
        for key in ("iterations", "warmup", "duration", "min_time", "threads", "rounds", "layers", "quantize", "backend", "method"):
            if key in m:
                options[renamed.get(key, key)] = m[key]
        if "max_drop" in m:
            options["max_drop"] = m["max_drop"]  # points in the file, as on the command line and in the API
        for key in ("metric", "threshold"):
            if key in m:
                options[key] = m[key]
        if "metric" in m:  # a threshold alone may be for the model's sidecar metric: deploy checks it
            from edgekit.quantize.mixed import check_metric
            from edgekit.quantize.threshold import check_threshold

            try:
                check_metric(m["metric"])
                check_threshold(m["metric"], m.get("threshold"))
            except UsageError as exc:
                raise self.fail(where, exc.message, exc.hint, section=section) from None
        options["strict"] = m.get("strict", True)  # ci gates: an int8 model below its threshold fails the run
        name = m.get("name") or model.stem
        return ModelSpec(model, name, runs, gates, options)

    def baseline(self, table: Any, ref: str | None) -> Baseline:
        if ref is not None:
            return self._ref(ref, "--baseline", None)
        if table is None:
            return Baseline("default")
        if not isinstance(table, dict):
            raise self.fail("baseline", "must be a table", "write [baseline] with ref, branch or file")
        section = ("baseline", 0)
        self.unknown(table, _BASELINE, "baseline", section)
        if len(table) != 1:
            raise self.fail("baseline", "give exactly one of ref, branch, file", 'e.g. branch = "main"', section=section)
        (key, value), = table.items()
        if not isinstance(value, str) or not value:
            raise self.fail(f"baseline.{key}", f"must be a non-empty string, got {value!r}", 'e.g. branch = "main"', section=section, key=key)
        if key == "branch":
            return Baseline("latest", branch=value)
        if key == "tag":
            return Baseline("tag", name=value)
        if key == "file":
            return self._export(self._file(value, "baseline.file", section, key="file"), "baseline.file", section)
        return self._ref(value, "baseline.ref", section)

    def _ref(self, ref: str, where: str, section: tuple[str, int] | None) -> Baseline:
        hint = 'a baseline is RUN ids ("12,13"), "branch:NAME", "tag:NAME" (edgekit results pin), "latest", "default" or an export file (edgekit results export)'
        if ref == "default":
            return Baseline("default")
        if ref == "latest":
            return Baseline("latest")
        for prefix in ("latest@", "branch:"):
            if ref.startswith(prefix) and len(ref) > len(prefix):
                return Baseline("latest", branch=ref[len(prefix):])
        if ref.startswith("tag:") and len(ref) > len("tag:"):
            return Baseline("tag", name=ref[len("tag:"):])
        if re.fullmatch(r"\d+(,\d+)*", ref):
            return Baseline("ids", ids=tuple(int(x) for x in ref.split(",")))
        candidate = Path(ref) if section is None else self.root / ref
        if candidate.is_file():
            return self._export(candidate, where, section)
        raise self.fail(where, f"'{ref}' is not a baseline (no such file either)", hint, section=section, key="ref" if section else None)

    def _export(self, path: Path, where: str, section: tuple[str, int] | None) -> Baseline:
        """A results export as the baseline, read now so a bad file stops the job before it runs."""
        from edgekit.bench.compare import read_records

        try:
            read_records(path)
        except EdgekitError as exc:
            raise self.fail(where, exc.message, exc.hint, section=section, key="file" if section else None) from None
        return Baseline("file", file=path)

    def _file(self, value: str, where: str, section: tuple[str, int], *, key: str | None = None, folder: bool = False) -> Path:
        p = Path(value).expanduser()
        p = p if p.is_absolute() else self.root / p
        if not (p.is_file() or (folder and p.is_dir())):
            raise self.fail(where, f"no such file: {value} ({p})", "fix the path (relative paths start at the edgekit.toml's folder)", section=section, key=key)
        return p

    def _gate(self, text: str, where: str, section: tuple[str, int]) -> Any:
        from edgekit.bench.gates import parse_gate

        try:
            return parse_gate(text)
        except EdgekitError as exc:
            raise self.fail(where, exc.message, exc.hint, section=section, key="gates") from None

    def _devices(self, target: str, names: list[str], inventory: Path | None, where: str, section: tuple[str, int]) -> tuple[Any, ...]:
        """The devices ``target`` runs on: the named ones, else the inventory's of that profile, else this machine."""
        from edgekit.devices import resolve_devices
        from edgekit.devices.inventory import DeviceEntry, default_inventory_path, load_inventory
        from edgekit.profiles import load_profile

        try:
            load_profile(target)
        except EdgekitError as exc:
            raise self.fail(f"{where}.targets", exc.message, exc.hint, section=section, key="targets") from None
        try:
            if names:
                return tuple(resolve_devices(names, inventory, cwd=self.root))
            path = inventory or default_inventory_path(self.root)
            listed = [e for e in load_inventory(path).devices.values() if e.profile == target] if path else []
        except EdgekitError as exc:
            raise self.fail(f"{where}.devices", exc.message, exc.hint, section=section, key="devices") from None
        return tuple(listed) or (DeviceEntry("local", "local"),)
