"""Load and check an ONNX model; resolve input shapes; read the model's data sidecar."""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgekit.errors import ModelError, UsageError
from edgekit.fsutil import sha256_file
from edgekit.modelio_tflite import is_tflite, load_tflite
from edgekit.tensorspec import IOSpec, given_shape, shape_overrides
from edgekit.tomlkeys import unknown_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Sidecar:
    """``<model>.edgekit.toml``: the data that goes with a model (paths resolved)."""

    calibration: Path | None = None
    evaluation: Path | None = None
    labels: Path | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    metric: str | None = None  # [accuracy] metric: what the int8 model's held-out check measures
    threshold: float | None = None  # [accuracy] threshold: the figure it must reach, in the metric's unit


class Model(Protocol):
    """What the planner, targets and deploy read from a loaded model of any format."""

    format: str  # "onnx" | "tflite": which backends can read the file
    path: Path
    sha256: str
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    precision: str  # what the file computes in as it is: "fp32", or "int8" for a quantized .tflite

    @property
    def name(self) -> str: ...


@dataclass
class LoadedModel:
    """An ONNX model (a ``Model``); ``modelio_tflite.TfliteModel`` is the other format."""

    format: ClassVar[str] = "onnx"
    precision: ClassVar[str] = "fp32"  # float ONNX in; edgekit quantizes it itself

    path: Path
    model: onnx.ModelProto
    sha256: str
    inputs: tuple[IOSpec, ...]  # graph inputs (not initializers), with concrete shapes
    outputs: tuple[IOSpec, ...]  # concrete where shape inference knows them, else -1
    sidecar: Sidecar
    # Verdicts derived from this model once and read by every later plan (e.g. "can ekrt lower it")
    memo: dict[str, object] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def opset(self) -> int:
        return onnx_opset(self.model)


def onnx_opset(model: onnx.ModelProto) -> int:
    return next((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), 0)


def np_dtype(elem_type: int) -> str:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError):
        return TensorProto.DataType.Name(elem_type).lower()


def parse_shape_overrides(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    """``["input:1,3,224,224", "mask:1,128"]`` -> ``{"input": (1,3,224,224), ...}``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items or []:
        # The last ':' separates: input names may contain ':' (tf2onnx's "serving_default_x:0").
        m = re.fullmatch(r"\s*(.+):\s*(\d+(?:\s*[,x]\s*\d+)*)\s*", item)
        if not m:
            raise UsageError(f"bad --shape value '{item}'", "write NAME:D0,D1,..., e.g. --shape input:1,3,224,224")
        dims = tuple(int(d) for d in re.split(r"\s*[,x]\s*", m.group(2)))
        if any(d <= 0 for d in dims):
            raise UsageError(f"bad --shape value '{item}': dimensions must be positive", "e.g. --shape input:1,3,224,224")
        shapes[m.group(1).strip()] = dims
    return shapes


def read_sidecar(model_path: Path) -> Sidecar:
    path = model_path.with_name(model_path.stem + ".edgekit.toml")
    if not path.is_file():
        return Sidecar()
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: invalid TOML: {exc}", "fix the sidecar file or remove it") from exc

    sections = {"calibration": ("data",), "evaluation": ("data", "labels"), "inputs": None, "accuracy": ("metric", "threshold")}
    bad = unknown_key(data, sections)
    if bad:  # a typo must not silently fall back to random calibration data
        raise ModelError(f"{path}: {bad[1]}", f"{bad[2]} (see docs/extending.md for the sidecar)")
    for section, keys in sections.items():
        if section in data and not isinstance(data[section], dict):
            raise ModelError(
                f"{path}: [{section}] must be a table",
                f"write it as a section, e.g. [{section}] with data = \"file.npz\" below it",
            )
        bad = unknown_key(data.get(section, {}), keys) if keys else None
        if bad:
            raise ModelError(f"{path}: {section}.{bad[0]}: {bad[1]}", bad[2])

    def rel(section: str, key: str) -> Path | None:
        value = data.get(section, {}).get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ModelError(f"{path}: {section}.{key} must be a path string", "e.g. data = \"calib.npz\"")
        return (path.parent / value).resolve()

    shapes = {}
    for name, spec in data.get("inputs", {}).items():
        bad = unknown_key(spec, ("shape",)) if isinstance(spec, dict) else None
        if bad:
            raise ModelError(f"{path}: inputs.{name}.{bad[0]}: {bad[1]}", bad[2])
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if not (isinstance(shape, list) and shape and all(isinstance(d, int) and d > 0 for d in shape)):
            raise ModelError(f"{path}: inputs.{name}.shape must be a list of positive integers", "e.g. shape = [1, 3, 224, 224]")
        shapes[name] = tuple(shape)
    metric, threshold = _accuracy(path, data.get("accuracy", {}))
    return Sidecar(
        calibration=rel("calibration", "data"),
        evaluation=rel("evaluation", "data"),
        labels=rel("evaluation", "labels"),
        shapes=shapes,
        metric=metric,
        threshold=threshold,
    )


def _accuracy(path: Path, table: dict) -> tuple[str | None, float | None]:
    """The sidecar's ``[accuracy]`` metric and threshold (their meaning is checked where they are
    used, as --metric/--threshold are: ``deploy.open_job``)."""
    unknown = sorted(set(table) - {"metric", "threshold"})
    if unknown:
        raise ModelError(f"{path}: unknown key accuracy.{unknown[0]}", 'the [accuracy] keys are metric (e.g. "iou") and threshold (e.g. 0.9)')
    metric, threshold = table.get("metric"), table.get("threshold")
    if metric is not None and not isinstance(metric, str):
        raise ModelError(f"{path}: accuracy.metric must be a string", 'e.g. metric = "iou"')
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))):
        raise ModelError(f"{path}: accuracy.threshold must be a number", "e.g. threshold = 0.9")
    return metric, None if threshold is None else float(threshold)


PROTO_LIMIT = 2**31  # bytes: protobuf cannot serialize a message this large, and edgekit hands models around whole


def _external_bytes(model: onnx.ModelProto, folder: Path) -> int:
    """The bytes the external-data initializers will take once read, from their ``length`` fields
    (or the rest of the file from ``offset``), without reading them."""
    total = 0
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        if "length" in info:
            total += int(info["length"])
        else:
            f = folder / info.get("location", "")
            total += max(0, f.stat().st_size - int(info.get("offset", 0))) if f.is_file() else 0
    return total


def _read_model_file(path: Path) -> tuple[bytes, bool]:
    """The bytes of a model file and whether it is a .tflite, read only after its size is known:
    a FIFO (which would block the read for ever) or a device such as /dev/zero is refused."""
    named_tflite = path.suffix.lower() == ".tflite"
    try:
        st = os.stat(path)  # follows a symlink: a link to a model file is a model file
    except (FileNotFoundError, NotADirectoryError):
        raise ModelError(f"model file not found: {path}", f"check the path; edgekit takes an .onnx{' or .tflite' * named_tflite} file") from None
    except OSError as exc:
        raise ModelError(f"cannot read the model {path}: {exc.strerror}", "check the path and its permissions") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelError(f"model path is a directory: {path}", f"give the {'.tflite' if named_tflite else '.onnx'} file inside it")
    if not stat.S_ISREG(st.st_mode):
        # a FIFO would block the read for ever, /dev/zero never ends: only files have a size to check first
        raise ModelError(f"model path is not a regular file ({_kind(st.st_mode)}): {path}", "give the model file itself; edgekit does not read a model from a pipe or a device")
    if st.st_size >= PROTO_LIMIT:
        raise ModelError(
            f"{path} holds {st.st_size / 2**30:.1f} GiB; edgekit handles models below 2 GiB (protobuf's limit)",
            "models this size are beyond an edge device's int8 path here: export a smaller model, or split it",
        )
    tflite = is_tflite(path)
    with open(path, "rb") as fh:
        raw = fh.read(PROTO_LIMIT)  # bounded even when the file grew since the size check
    if len(raw) >= PROTO_LIMIT:
        raise ModelError(f"{path} grew past 2 GiB while it was read", "let whatever writes the model finish, then try again")
    if not raw:
        raise ModelError(f"model file is empty: {path}", "re-export the model")
    return raw, tflite


def _parse_onnx(raw: bytes, path: Path) -> onnx.ModelProto:
    try:
        model = onnx.load_from_string(raw)
    except Exception as exc:  # protobuf DecodeError and friends
        raise ModelError(
            f"not an ONNX model (or truncated): {path}",
            "export the model to ONNX (torch.onnx.export, tf2onnx, ...) and check the file copied whole",
        ) from exc
    if not model.graph.node:
        raise ModelError(f"not an ONNX model (no graph nodes): {path}", "export the model to ONNX and try again")
    return model


def check_model_file(path: Path | str) -> None:
    """ModelError unless ``path`` is a readable ONNX (or .tflite) file: a cheap check before any
    work that would leave outputs behind (``edgekit ci`` checks every model before it runs one)."""
    path = Path(path)
    raw, tflite = _read_model_file(path)
    if not tflite:
        _parse_onnx(raw, path)


def load_model(path: Path | str, shapes: dict[str, tuple[int, ...]] | None = None) -> Model:
    """Read, check and resolve an ONNX model. Every failure is a ModelError with a hint.

    A ``.tflite`` file is read by ``modelio_tflite`` instead (a TfliteModel, ``format`` "tflite").
    """
    path = Path(path)
    raw, tflite = _read_model_file(path)
    if tflite:
        return load_tflite(path, raw, shapes, read_sidecar(path))
    model = _parse_onnx(raw, path)
    if any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer):
        total = len(raw) + _external_bytes(model, path.parent)
        if total >= PROTO_LIMIT:
            raise ModelError(
                f"{path} holds {total / 2**30:.1f} GiB with its external data; edgekit handles models below 2 GiB (protobuf's limit)",
                "models this size are beyond an edge device's int8 path here: export a smaller model, or split it",
            )
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except Exception as exc:
            raise ModelError(f"external weight data of {path} could not be read: {exc}", "keep the .data file beside the model") from exc
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"invalid ONNX model {path}: {_first_line(exc)}", "re-export the model; onnx.checker must accept it") from exc
    opset, newest = onnx_opset(model), onnx.defs.onnx_opset_version()
    if opset > newest:
        raise ModelError(
            f"{path} uses ONNX opset {opset}; the newest this edgekit supports is {newest}",
            f"re-export the model with opset {newest} or lower (e.g. torch.onnx.export(..., opset_version=17))",
        )
    try:  # strict: a graph whose shapes contradict each other fails here, not deep in a runtime
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except onnx.shape_inference.InferenceError as exc:
        raise ModelError(f"invalid ONNX model {path}: {_first_line(exc)}", "re-export the model; its shapes do not fit together") from exc
    _check_weights(model, path)

    sidecar = read_sidecar(path)
    init_names = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in init_names]
    wanted = shape_overrides(sidecar.shapes, shapes, {i.name for i in graph_inputs})
    inputs = []
    for inp in graph_inputs:
        tt = inp.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
        if inp.name in wanted:
            dims = list(given_shape(inp.name, wanted[inp.name], dims))
        elif any(d is None for d in dims):
            shown = ",".join(str(d) if d is not None else "?" for d in dims)
            example = ",".join(str(d) if d is not None else ("1" if i == 0 else "224") for i, d in enumerate(dims))
            raise ModelError(
                f"input '{inp.name}' has a dynamic shape [{shown}] and no shape was given",
                f"give one with --shape {inp.name}:{example}",
            )
        inputs.append(IOSpec(inp.name, tuple(int(d) for d in dims), np_dtype(tt.elem_type)))

    outputs = []
    for out in model.graph.output:
        tt = out.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        outputs.append(IOSpec(out.name, dims, np_dtype(tt.elem_type)))
    return LoadedModel(path, model, sha256_file(path), tuple(inputs), tuple(outputs), sidecar)


def with_static_inputs(model: onnx.ModelProto, inputs: tuple[IOSpec, ...]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs carry the concrete shapes (then shape inference)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    by_name = {i.name: i for i in inputs}
    for inp in m.graph.input:
        if inp.name in by_name:
            dims = inp.type.tensor_type.shape.dim
            for d, v in zip(dims, by_name[inp.name].shape):
                d.Clear()
                d.dim_value = v
    # Stale intermediate shapes (from the dynamic export) would fight the new ones.
    del m.graph.value_info[:]
    for out in m.graph.output:
        if out.type.tensor_type.HasField("shape"):
            for d in out.type.tensor_type.shape.dim:
                if not d.HasField("dim_value"):
                    d.Clear()
    try:
        return onnx.shape_inference.infer_shapes(m, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        shapes = " ".join(f"{i.name}:{','.join(map(str, i.shape))}" for i in inputs)
        raise ModelError(f"the model does not accept input shapes {shapes}: {_first_line(exc)}", "check the --shape values") from exc


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"


# The inputs of compute ops that hold weights (what quantization turns into int8 and scales).
WEIGHT_INPUTS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (0, 1, 2), "MatMul": (0, 1), "Einsum": (0, 1)}
# No trained weight is near this: past it the fp32 products with any sizeable activation overflow,
# and an int8 channel holding it quantizes every other weight of the channel to zero.
WEIGHT_LIMIT = 1e30


def _check_weights(model: onnx.ModelProto, path: Path) -> None:
    """Refuse weights of compute ops that hold NaN or Inf, are empty, or are absurdly large (a
    broken export): quantizing them gives a model that is silently wrong, or no model at all."""
    from onnx import numpy_helper

    consts = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    consts[node.output[0]] = a.t
    for node in model.graph.node:
        for i in WEIGHT_INPUTS.get(node.op_type, ()):
            name = node.input[i] if i < len(node.input) else ""
            t = consts.get(name)
            if t is None or t.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16):
                continue
            w = numpy_helper.to_array(t).astype(np.float64)
            where = f"{path}: weight '{name}' of {node.op_type} node '{node.name or node.output[0]}'"
            if w.size == 0:
                raise ModelError(f"{where} is empty (shape {list(w.shape)})", "re-export the model; a layer with no weights computes nothing")
            bad = int(np.count_nonzero(~np.isfinite(w)))
            if bad:
                what = "NaN" if np.isnan(w).any() else "Inf"
                raise ModelError(f"{where} holds {bad} {what} value(s) of {w.size}", "the weights are broken (a diverged training run or a bad export): fix them and re-export")
            peak = float(np.abs(w).max())
            if peak > WEIGHT_LIMIT:
                raise ModelError(f"{where} holds a value of magnitude {peak:.3g} (edgekit takes weights up to {WEIGHT_LIMIT:.0e})", "no trained weight is that large: check the export")


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
