"""A bundle: the directory that goes to the device — model files plus ``manifest.json``.

The manifest records the schema version, the edgekit version, the profile, the plan's
backend and precision, one entry per runnable variant, and each file's sha256 and size.
``bundle_hash`` (over the manifest, which lists every file's sha256, minus the fields a
rebuild may change: ``created`` and the ``plan`` record) is the bundle's identity: it names
the bundle's directory on the device and ties benchmark results to what was run.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgekit import __version__
from edgekit.agent import PATH_OPTIONS
from edgekit.agent import bundle_hash as _bundle_hash
from edgekit.errors import InputError, OutputPathError
from edgekit.fsutil import check_output_dir, fsync_path, sha256_file
from edgekit.jsonable import FieldsDict, is_int, kind
from edgekit.profiles.model import BACKENDS, PRECISIONS
from edgekit.tensorspec import TensorSpec

SCHEMA = 1
MANIFEST = "manifest.json"
_HEX = frozenset("0123456789abcdef")
_REBUILD = "rebuild the bundle (edgekit deploy writes one) instead of editing it"


@dataclass(frozen=True)
class Variant(FieldsDict):
    """One runnable model in the bundle."""

    name: str  # "fp32", "int8", ...
    backend: str  # "onnxruntime", "native", "openvino", ...
    precision: str  # "fp32" | "int8" | "fp16"
    model: str  # relative path inside the bundle
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # Backend options the agent passes to the runtime (JSON values only), e.g. OpenVINO's
    # {"device": "CPU"} or TensorRT's trtexec flags. The planner decides them; the agent obeys.
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BundleFile(FieldsDict):
    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest(FieldsDict):
    schema: int
    edgekit_version: str
    created: str  # ISO-8601 UTC; kept when an identical bundle is rebuilt in place
    model_name: str  # source model file stem
    model_sha256: str  # sha256 of the source (float) model file
    profile: str
    backend: str  # the plan's backend
    precision: str  # the plan's precision
    variants: tuple[Variant, ...]
    files: tuple[BundleFile, ...]
    plan: dict  # the plan document, opaque here

    @property
    def bundle_hash(self) -> str:
        """The bundle's identity: files, profile, backend, variants and options (see the agent's)."""
        return _bundle_hash(self.to_dict())

    @classmethod
    def from_dict(cls, d: Any) -> Manifest:
        """Validate a manifest document; InputError names the first bad field."""
        if not isinstance(d, dict):
            raise InputError(f"the manifest must be a JSON object, got {kind(d)}", _REBUILD)
        schema = d.get("schema")
        if not is_int(schema):
            raise _bad("schema", f"must be an integer, got {kind(schema)}")
        if schema != SCHEMA:
            raise InputError(
                f"bundle schema {schema} is not supported; this edgekit reads schema {SCHEMA}",
                "build the bundle with this edgekit version, or install the edgekit that wrote it",
            )
        files = tuple(_file(f, f"files[{i}]") for i, f in enumerate(_list(d, "files")))
        paths = [f.path for f in files]
        for path in paths:
            if paths.count(path) > 1:
                raise _bad("files", f"lists {path} twice")
        variants = tuple(_variant(v, f"variants[{i}]") for i, v in enumerate(_list(d, "variants")))
        if not variants:
            raise _bad("variants", "is empty; a bundle needs at least one runnable variant")
        names = [v.name for v in variants]
        for v in variants:
            if names.count(v.name) > 1:
                raise _bad("variants", f"has two variants named '{v.name}'")
            if v.model not in paths:
                raise _bad(f"variants[{names.index(v.name)}].model", f"is {v.model}, which is not in 'files'")
            # options that name a file (the agent runs the runner): a bundle file, or refused here and there
            for key in PATH_OPTIONS:
                if key in v.options:
                    field = f"variants[{names.index(v.name)}].options.{key}"
                    if _check_relpath(v.options[key], field) not in paths:
                        raise _bad(field, f"is {v.options[key]}, which is not in 'files'")
        plan = _obj(d.get("plan"), "plan")
        return cls(
            schema=schema,
            edgekit_version=_str(d, "edgekit_version"),
            created=_str(d, "created"),
            model_name=_str(d, "model_name"),
            model_sha256=_sha(d.get("model_sha256"), "model_sha256"),
            profile=_str(d, "profile"),
            backend=_choice(d, "backend", BACKENDS),
            precision=_choice(d, "precision", PRECISIONS),
            variants=variants,
            files=files,
            plan=plan,
        )


@dataclass(frozen=True)
class Bundle:
    root: Path
    manifest: Manifest

    def path(self, relpath: str) -> Path:
        """The local path of one of the bundle's files."""
        return self.root.joinpath(*relpath.split("/"))


def write_bundle(
    out_dir: Path,
    *,
    files: Mapping[str, Path],
    model_name: str,
    model_sha256: str,
    profile: str,
    backend: str,
    precision: str,
    variants: Iterable[Variant],
    plan: dict,
    overwrite: bool = False,
) -> Bundle:
    """Write a bundle directory atomically: built beside ``out_dir``, then renamed into place.

    ``files`` maps relative bundle paths ("model.int8.onnx", "int8/inputs.npz") to local
    source files. Nothing is left behind when any input is bad.
    """
    out_dir = Path(out_dir)
    check_output_dir(out_dir)
    if out_dir.exists() and not overwrite:
        raise OutputPathError(
            f"bundle output {out_dir} already exists",
            "choose another output directory, or remove the old bundle first",
        )
    for rel, src in files.items():
        _check_relpath(rel, "files")
        if rel == MANIFEST:
            raise InputError(f"'{MANIFEST}' is written by edgekit; it cannot be a bundle file", "rename that file")
        if not Path(src).is_file():
            raise InputError(f"bundle file {rel}: source {src} does not exist or is not a file", "check the path")
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    head = {
        "schema": SCHEMA, "edgekit_version": __version__, "model_name": model_name, "model_sha256": model_sha256, "profile": profile,
        "backend": backend, "precision": precision, "variants": [v.to_dict() for v in variants], "plan": plan,
    }  # fmt: skip
    same = _same_bundle(out_dir, head, files)
    if same is not None:  # an unchanged rebuild: nothing to write (or to fsync)
        return same
    tmp = out_dir.parent / f".{out_dir.name}.{uuid.uuid4().hex[:12]}.tmp"
    tmp.mkdir()  # not mkdtemp: its 0700 mode would stick to the bundle
    try:
        entries = []
        for rel in sorted(files):
            dest = tmp.joinpath(*rel.split("/"))
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(files[rel], dest)
            fsync_path(dest)
            # hash what landed in the bundle, not the source (which may change meanwhile)
            entries.append(BundleFile(rel, sha256_file(dest), dest.stat().st_size))
        manifest_doc = {**head, "created": created, "files": [e.to_dict() for e in entries]}
        manifest_doc["created"] = _created(out_dir, manifest_doc, created)
        manifest = Manifest.from_dict(json.loads(json.dumps(manifest_doc)))  # same checks as load
        (tmp / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2) + "\n", encoding="utf-8")
        fsync_path(tmp / MANIFEST)
        for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, reverse=True):
            fsync_path(d)
        _move_into_place(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return Bundle(out_dir, manifest)


def load_bundle(path: Path, verify: bool = True) -> Bundle:
    """Read a bundle directory; with ``verify`` check every file's size and sha256."""
    root = Path(path)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise InputError(
            f"bundle {root} {what}",
            f"pass a bundle directory (one holding {MANIFEST}, as edgekit deploy writes)",
        )
    manifest_path = root / MANIFEST
    try:
        text = manifest_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{root} is not a bundle: it has no {MANIFEST}", "pass the bundle directory itself") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {manifest_path}: {exc}", _REBUILD) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{manifest_path} is not valid JSON (line {exc.lineno}: {exc.msg})", _REBUILD) from None
    try:
        manifest = Manifest.from_dict(doc)
    except InputError as exc:
        raise InputError(f"{manifest_path}: {exc.message}", exc.hint) from None
    bundle = Bundle(root, manifest)
    if verify:
        for f in manifest.files:
            local = bundle.path(f.path)
            if not local.is_file():
                raise InputError(f"bundle file {f.path} is missing from {root}", _REBUILD)
            size = local.stat().st_size
            if size != f.size:
                raise InputError(f"bundle file {f.path} has {size} bytes, the manifest says {f.size}", _REBUILD)
            if sha256_file(local) != f.sha256:
                raise InputError(f"bundle file {f.path} does not match its sha256 in {MANIFEST}", _REBUILD)
    return bundle


# -- helpers ---------------------------------------------------------------------------------


def _created(out_dir: Path, doc: dict[str, Any], now: str) -> str:
    """``now``, unless ``out_dir`` holds this very bundle already: then its first ``created``.

    Rebuilding an unchanged bundle must give a byte-identical manifest.json, or every deploy
    would push a new manifest (and the device would see a "new" bundle) for nothing.
    """
    try:
        old = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return now
    if not isinstance(old, dict) or not isinstance(old.get("created"), str):
        return now
    same = {k: v for k, v in old.items() if k != "created"} == json.loads(json.dumps({k: v for k, v in doc.items() if k != "created"}))
    return old["created"] if same else now


def _same_bundle(out_dir: Path, head: dict[str, Any], files: Mapping[str, Path]) -> Bundle | None:
    """The bundle already at ``out_dir`` when it is exactly what would be written (same manifest
    but its date, every file present with the source's sha256); else None."""
    if not (out_dir / MANIFEST).is_file():
        return None
    try:
        old = load_bundle(out_dir, verify=True)
    except InputError:
        return None
    doc = old.manifest.to_dict()
    if {k: doc.get(k) for k in head} != json.loads(json.dumps(head)):
        return None
    listed = {f.path: f for f in old.manifest.files}
    present = {p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if not p.is_dir()}
    if set(listed) != set(files) or present != set(listed) | {MANIFEST}:  # a stray file: write it clean
        return None
    for rel, src in files.items():
        if Path(src).stat().st_size != listed[rel].size or sha256_file(src) != listed[rel].sha256:
            return None
    return old


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    if not out_dir.exists():
        os.replace(tmp, out_dir)
        return
    # A non-empty directory cannot be replaced in one rename: swap the old one aside first.
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
    os.replace(out_dir, old / "bundle")
    try:
        os.replace(tmp, out_dir)
    except OSError:
        os.replace(old / "bundle", out_dir)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _check_relpath(rel: Any, field: str) -> str:
    """Bundle paths are plain relative POSIX paths: they must not escape the bundle."""
    ok = (
        isinstance(rel, str)
        and not rel.startswith("/")
        and "\\" not in rel
        and posixpath.normpath(rel) == rel
        and ".." not in rel.split("/")
    )
    if not ok:
        raise _bad(field, f"has {rel!r}; bundle paths are relative POSIX paths inside the bundle (no '..')")
    return rel


def _bad(field: str, what: str) -> InputError:
    return InputError(f"manifest field '{field}' {what}", _REBUILD)


def _str(d: Mapping[str, Any], key: str, prefix: str = "") -> str:
    value = d.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(prefix + key, f"must be a non-empty string, got {kind(value)}")
    return value


def _choice(d: Mapping[str, Any], key: str, allowed: tuple[str, ...], prefix: str = "") -> str:
    value = _str(d, key, prefix)
    if value not in allowed:
        raise _bad(prefix + key, f"is '{value}'; allowed: {', '.join(allowed)}")
    return value


def _sha(value: Any, field: str) -> str:
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
        raise _bad(field, f"must be a sha256 (64 lowercase hex digits), got {value!r}")
    return value


def _list(d: Mapping[str, Any], key: str, prefix: str = "") -> list:
    value = d.get(key)
    if not isinstance(value, list):
        raise _bad(prefix + key, f"must be a list, got {kind(value)}")
    return value


def _obj(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(field, f"must be an object, got {kind(value)}")
    return value


def _file(value: Any, field: str) -> BundleFile:
    d = _obj(value, field)
    path = _check_relpath(d.get("path"), f"{field}.path")
    if path == MANIFEST:
        raise _bad(f"{field}.path", f"is {MANIFEST}, which cannot list itself")
    size = d.get("size")
    if not is_int(size) or size < 0:
        raise _bad(f"{field}.size", f"must be a byte count (integer >= 0), got {size!r}")
    return BundleFile(path, _sha(d.get("sha256"), f"{field}.sha256"), size)


def _tensor(value: Any, field: str) -> TensorSpec:
    d = _obj(value, field)
    shape = d.get("shape")
    if not isinstance(shape, list) or not all(is_int(s) for s in shape):
        raise _bad(f"{field}.shape", f"must be a list of integers, got {shape!r}")
    return TensorSpec(_str(d, "name", f"{field}."), tuple(shape), _str(d, "dtype", f"{field}."))


def _variant(value: Any, field: str) -> Variant:
    d = _obj(value, field)
    p = f"{field}."
    return Variant(
        name=_str(d, "name", p),
        backend=_choice(d, "backend", BACKENDS, p),
        precision=_choice(d, "precision", PRECISIONS, p),
        model=_check_relpath(d.get("model"), f"{field}.model"),
        inputs=tuple(_tensor(t, f"{field}.inputs[{i}]") for i, t in enumerate(_list(d, "inputs", p))),
        outputs=tuple(_tensor(t, f"{field}.outputs[{i}]") for i, t in enumerate(_list(d, "outputs", p))),
        options=dict(_obj(d.get("options", {}), f"{field}.options")),
    )
