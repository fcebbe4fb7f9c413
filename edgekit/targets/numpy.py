"""numpy: the float reference interpreter, for devices that have numpy and no runtime.

The device side (``edgekit.agent.backends.numpy_ref``) cannot parse ONNX protobuf, so the
host converts the model here: ``graph.json`` (nodes, attributes, tensor names; Constant
nodes folded into weights) and ``weights.npz`` (every initializer), written deterministically
so an unchanged model converts to the same bytes and is not pushed twice.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgekit.agent.backends.numpy_ref import GRAPH_FORMAT, GRAPH_VERSION, OPS, check_node
from edgekit.errors import ModelError
from edgekit.modelio import LoadedModel, np_dtype, onnx_opset
from edgekit.profiles import Profile
from edgekit.targets.base import Backend, Verdict

GRAPH_FILE = "graph.json"
WEIGHTS_FILE = "weights.npz"


class NumpyBackend(Backend):
    name = "numpy"
    scheme = None  # float only
    runtimes = ("numpy",)

    def supports(self, model: LoadedModel, profile: Profile, facts: dict | None = None) -> Verdict:
        verdict = super().supports(model, profile, facts)
        if not verdict.ok:
            return verdict
        _, _, problem = _nodes(model.model, with_constants=False)
        if problem:
            return Verdict(False, (problem,))
        return Verdict(True)

    def compile(self, model_path: Path, out_dir: Path) -> list[Path]:
        """``graph.json`` (the file the agent loads) and ``weights.npz``, written in ``out_dir``."""
        model = onnx.load(str(model_path))
        graph, weights = convert(model)
        out_dir.mkdir(parents=True, exist_ok=True)
        weights_path = out_dir / WEIGHTS_FILE
        data = npz_bytes(weights)
        weights_path.write_bytes(data)
        graph["weights"]["sha256"] = hashlib.sha256(data).hexdigest()
        graph_path = out_dir / GRAPH_FILE
        graph_path.write_text(json.dumps(graph, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return [graph_path, weights_path]


def convert(model: onnx.ModelProto) -> tuple[dict, dict[str, np.ndarray]]:
    """The graph.json document (weights sha256 still empty) and the weights by key."""
    nodes, constants, problem = _nodes(model, with_constants=True)
    if problem:
        raise ModelError(
            f"the numpy backend cannot run this model: {problem}",
            f"ops it runs: {', '.join(sorted(OPS))}; choose another backend with --backend",
        )
    tensors = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    tensors.update(constants)
    keys = {name: f"t{i}" for i, name in enumerate(sorted(tensors))}
    inputs = []
    for value in model.graph.input:
        if value.name in tensors:
            continue  # old exporters list initializers as inputs too
        tt = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tt.shape.dim]
        inputs.append({"name": value.name, "shape": dims, "dtype": np_dtype(tt.elem_type)})
    graph = {
        "format": GRAPH_FORMAT,
        "version": GRAPH_VERSION,
        "opset": onnx_opset(model),
        "inputs": inputs,
        "outputs": [o.name for o in model.graph.output],
        "nodes": nodes,
        "weights": {"file": WEIGHTS_FILE, "sha256": "", "keys": keys},
    }
    return graph, {keys[name]: np.ascontiguousarray(arr) for name, arr in tensors.items()}


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An uncompressed .npz, members in key order: the same arrays always give the same bytes."""
    buf = io.BytesIO()
    np.savez(buf, **{key: arrays[key] for key in sorted(arrays)})
    return buf.getvalue()


def _nodes(model: onnx.ModelProto, with_constants: bool) -> tuple[list[dict], dict[str, np.ndarray], str | None]:
    """graph.json nodes, the folded Constant outputs, and the first problem (None: all runnable)."""
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    nodes: list[dict] = []
    constants: dict[str, np.ndarray] = {}
    for i, node in enumerate(model.graph.node):
        where = f"node '{node.name or i}' (op {node.op_type})"
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            attr = node.attribute[0] if len(node.attribute) == 1 else None
            if attr is None or attr.name not in ("value", "value_float", "value_floats", "value_int", "value_ints"):
                return nodes, constants, f"{where}: only tensor and numeric constants are supported"
            shapes[node.output[0]] = list(attr.t.dims) if attr.name == "value" else []
            if with_constants:
                value = helper.get_attribute_value(attr)
                constants[node.output[0]] = (
                    numpy_helper.to_array(value) if attr.name == "value"
                    else np.asarray(value, dtype=np.float32 if "float" in attr.name else np.int64)
                )
            continue
        attrs = {}
        for a in node.attribute:
            value = helper.get_attribute_value(a)
            if isinstance(value, bytes):
                value = value.decode("utf-8", errors="replace")
            elif isinstance(value, list) and value and isinstance(value[0], bytes):
                value = [v.decode("utf-8", errors="replace") for v in value]
            elif not isinstance(value, (int, float, list)):
                return nodes, constants, f"{where}: attribute '{a.name}' holds a tensor or graph, which is not supported"
            attrs[a.name] = value
        if node.op_type == "Conv" and "kernel_shape" not in attrs:
            weight_shape = shapes.get(node.input[1]) if len(node.input) > 1 else None
            if not weight_shape:
                return nodes, constants, f"{where}: its weights are not a constant, so its kernel shape is unknown"
            attrs["kernel_shape"] = weight_shape[2:]
        entry = {
            "name": node.name or f"{node.op_type}_{i}",
            "op": node.op_type,
            "domain": node.domain,
            "inputs": list(node.input),
            "outputs": list(node.output),
            "attrs": attrs,
        }
        problem = check_node(entry)
        if problem:
            return nodes, constants, problem
        nodes.append(entry)
    return nodes, constants, None


BACKEND = NumpyBackend()
