"""Bundles: round trip, content identity, tamper detection, manifest validation, atomic writes."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from edgekit.agent import bundle_hash as agent_bundle_hash
from edgekit.bundle import (
    MANIFEST,
    Bundle,
    BundleFile,
    Manifest,
    TensorSpec,
    Variant,
    load_bundle,
    write_bundle,
)
from edgekit.errors import InputError, OutputPathError
from edgekit.fsutil import sha256_file

SRC_SHA = "ab" * 32


def variant(manifest: Manifest, name: str) -> Variant:
    return next(v for v in manifest.variants if v.name == name)


def _sources(tmp_path: Path) -> dict[str, Path]:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "fp32.onnx").write_bytes(b"float model bytes")
    (src / "int8.onnx").write_bytes(b"int8 model bytes, a few more of them")
    (src / "inputs.npz").write_bytes(b"not really npz, bundles do not look inside")
    return {
        "model.fp32.onnx": src / "fp32.onnx",
        "int8/model.onnx": src / "int8.onnx",
        "int8/inputs.npz": src / "inputs.npz",
    }


def _variants() -> list[Variant]:
    x = (TensorSpec("x", (-1, 3, 8, 8), "float32"),)
    y = (TensorSpec("y", (-1, 10), "float32"),)
    return [
        Variant("fp32", "onnxruntime", "fp32", "model.fp32.onnx", x, y),
        Variant("int8", "onnxruntime", "int8", "int8/model.onnx", x, y),
    ]


def _write(out: Path, files: dict[str, Path], **kw) -> Bundle:
    args = dict(
        files=files,
        model_name="net",
        model_sha256=SRC_SHA,
        profile="local",
        backend="onnxruntime",
        precision="int8",
        variants=_variants(),
        plan={"backend": "onnxruntime", "steps": ["quantize"]},
    )
    args.update(kw)
    return write_bundle(out, **args)


def test_round_trip(tmp_path):
    files = _sources(tmp_path)
    written = _write(tmp_path / "b", files)
    loaded = load_bundle(tmp_path / "b")
    assert loaded.manifest == written.manifest
    assert loaded.root == tmp_path / "b"
    m = loaded.manifest
    assert m.schema == 1 and m.model_name == "net" and m.profile == "local"
    assert variant(m, "int8").model == "int8/model.onnx"
    assert variant(m, "int8").inputs[0].shape == (-1, 3, 8, 8)
    assert m.created.endswith("Z")
    by_path = {f.path: f for f in m.files}
    assert sorted(by_path) == sorted(files)
    for rel, src in files.items():
        assert by_path[rel].sha256 == sha256_file(src)
        assert by_path[rel].size == src.stat().st_size
        assert loaded.path(rel).read_bytes() == src.read_bytes()
    assert Manifest.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert oct((tmp_path / "b").stat().st_mode & 0o777) == oct(0o777 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_bundle_hash_is_content_identity(tmp_path):
    files = _sources(tmp_path)
    a = _write(tmp_path / "a", files)
    b = _write(tmp_path / "b", files, plan={"other": True})
    assert a.manifest.created != "" and a.manifest.bundle_hash == b.manifest.bundle_hash  # created/plan: a record
    files["model.fp32.onnx"].write_bytes(b"changed weights")
    c = _write(tmp_path / "c", files)
    assert c.manifest.bundle_hash != a.manifest.bundle_hash
    assert len(a.manifest.bundle_hash) == 64


def test_same_files_for_another_profile_or_options_is_another_bundle(tmp_path):
    # rpi4 and rpi5 bundles of one model carry the same files but different manifests: one id
    # for both let a board that got both end up with `current` naming the wrong manifest
    files = _sources(tmp_path)
    a = _write(tmp_path / "a", files)
    other_profile = _write(tmp_path / "b", files, profile="rpi5")
    v = _variants()
    other_options = _write(tmp_path / "c", files, variants=[v[0], replace(v[1], options={"threads_hint": 4})])
    other_backend = _write(tmp_path / "d", files, backend="native")
    ids = {x.manifest.bundle_hash for x in (a, other_profile, other_options, other_backend)}
    assert len(ids) == 4
    assert [f.sha256 for f in a.manifest.files] == [f.sha256 for f in other_profile.manifest.files]
    # the agent computes the same id from the manifest.json it reads on the device
    doc = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert agent_bundle_hash(doc) == other_profile.manifest.bundle_hash


@pytest.mark.parametrize(
    ("tamper", "needle"),
    [
        (lambda p: p.write_bytes(b"int8 model bytes, a few more of th3m"), "does not match its sha256"),
        (lambda p: p.write_bytes(b"short"), "has 5 bytes"),
        (lambda p: p.unlink(), "is missing"),
    ],
)
def test_tampered_file_is_named(tmp_path, tamper, needle):
    _write(tmp_path / "b", _sources(tmp_path))
    tamper(tmp_path / "b" / "int8" / "model.onnx")
    with pytest.raises(InputError) as err:
        load_bundle(tmp_path / "b")
    assert "int8/model.onnx" in err.value.message and needle in err.value.message
    assert err.value.hint
    assert variant(load_bundle(tmp_path / "b", verify=False).manifest, "int8")


def _manifest_doc(tmp_path: Path) -> tuple[Path, dict]:
    _write(tmp_path / "b", _sources(tmp_path))
    path = tmp_path / "b" / MANIFEST
    return path, json.loads(path.read_text())


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d.update(schema=2), "bundle schema 2 is not supported"),
        (lambda d: d.pop("files"), "'files' must be a list"),
        (lambda d: d["variants"][1].pop("backend"), "'variants[1].backend' must be a non-empty string"),
        (lambda d: d["variants"][0].update(backend="coreml"), "'variants[0].backend' is 'coreml'; allowed:"),
        (lambda d: d["variants"][0].update(precision="int4"), "'variants[0].precision' is 'int4'; allowed:"),
        (lambda d: d["variants"][0]["inputs"][0].update(shape=[1, "N"]), "'variants[0].inputs[0].shape'"),
        (lambda d: d["variants"][0].update(model="nope.onnx"), "nope.onnx, which is not in 'files'"),
        (lambda d: d["files"][0].update(path="../../etc/passwd"), "'files[0].path' has '../../etc/passwd'"),
        (lambda d: d["files"][0].update(path="/abs/path"), "'files[0].path'"),
        (lambda d: d["files"][0].update(sha256="xyz"), "'files[0].sha256' must be a sha256"),
        (lambda d: d["files"][0].update(size=-1), "'files[0].size'"),
        (lambda d: d["files"].append(dict(d["files"][0])), "lists int8/inputs.npz twice"),
        (lambda d: d.update(variants=[]), "'variants' is empty"),
        (lambda d: d["variants"].append(dict(d["variants"][0])), "two variants named 'fp32'"),
        (lambda d: d.update(plan=[1]), "'plan' must be an object"),
        (lambda d: d.update(model_sha256=None), "'model_sha256' must be a sha256"),
    ],
)
def test_bad_manifest_names_the_field(tmp_path, edit, needle):
    path, doc = _manifest_doc(tmp_path)
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        load_bundle(tmp_path / "b")
    assert needle in err.value.message
    assert str(path) in err.value.message
    assert err.value.hint


def test_manifest_not_json_or_missing(tmp_path):
    path, _ = _manifest_doc(tmp_path)
    path.write_text('{"schema": 1,\n  oops')
    with pytest.raises(InputError, match=r"is not valid JSON \(line 2"):
        load_bundle(tmp_path / "b")
    path.unlink()
    with pytest.raises(InputError, match="has no manifest.json"):
        load_bundle(tmp_path / "b")
    with pytest.raises(InputError, match="does not exist"):
        load_bundle(tmp_path / "missing")
    with pytest.raises(InputError, match="is not a directory"):
        load_bundle(_sources(tmp_path)["model.fp32.onnx"])
    with pytest.raises(InputError, match="must be a JSON object"):
        Manifest.from_dict([])


def _entries(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_write_is_atomic_when_a_source_is_missing(tmp_path):
    files = _sources(tmp_path)
    files["int8/model.onnx"] = tmp_path / "src" / "gone.onnx"
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError, match="gone.onnx"):
        _write(out / "b", files)
    assert _entries(out) == []  # no bundle, no temp dir


def test_write_is_atomic_when_variants_are_bad(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    bad = [Variant("fp32", "onnxruntime", "fp32", "elsewhere.onnx", (), ())]
    with pytest.raises(InputError, match="elsewhere.onnx, which is not in 'files'"):
        _write(out / "b", _sources(tmp_path), variants=bad)
    assert _entries(out) == []


@pytest.mark.parametrize("rel", ["../escape.onnx", "/abs.onnx", "a/./b.onnx", MANIFEST, ""])
def test_write_rejects_unsafe_paths(tmp_path, rel):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(InputError):
        _write(out / "b", {**_sources(tmp_path), rel: tmp_path / "src" / "fp32.onnx"})
    assert _entries(out) == []


def test_write_output_path_errors(tmp_path):
    files = _sources(tmp_path)
    with pytest.raises(OutputPathError) as err:
        _write(tmp_path / "no" / "such" / "b", files)
    assert "mkdir -p" in err.value.hint
    _write(tmp_path / "b", files)
    with pytest.raises(OutputPathError, match="already exists"):
        _write(tmp_path / "b", files)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputPathError, match="is a file"):
        _write(tmp_path / "afile", files, overwrite=True)


def test_overwrite_replaces_the_whole_bundle(tmp_path):
    files = _sources(tmp_path)
    _write(tmp_path / "b", files)
    (tmp_path / "b" / "stale.txt").write_text("from an older bundle")
    only_fp32 = {"model.fp32.onnx": files["model.fp32.onnx"]}
    bundle = _write(tmp_path / "b", only_fp32, variants=_variants()[:1], overwrite=True)
    assert _entries(tmp_path / "b") == [MANIFEST, "model.fp32.onnx"]
    assert load_bundle(tmp_path / "b").manifest == bundle.manifest
    assert _entries(tmp_path) == ["b", "src"]


def test_an_unchanged_rebuild_leaves_the_bundle_as_it_is(tmp_path):
    files = _sources(tmp_path)
    first = _write(tmp_path / "b", files)
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "b").rglob("*")}
    again = _write(tmp_path / "b", files, overwrite=True)
    assert again.manifest == first.manifest
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "b").rglob("*")} == stamp  # nothing rewritten
    files["int8/inputs.npz"].write_bytes(b"other samples")  # a changed source is written anew
    changed = _write(tmp_path / "b", files, overwrite=True)
    assert changed.manifest.bundle_hash != first.manifest.bundle_hash
    assert load_bundle(tmp_path / "b").manifest == changed.manifest
    (tmp_path / "b" / "stray.txt").write_text("not listed")  # a bundle holds exactly what it lists
    _write(tmp_path / "b", files, overwrite=True)
    assert not (tmp_path / "b" / "stray.txt").exists()


def test_bundle_file_dataclass_round_trip():
    f = BundleFile("a/b.onnx", "0" * 64, 3)
    assert f.to_dict() == {"path": "a/b.onnx", "sha256": "0" * 64, "size": 3}
