"""Which layer broke it, on the device: per-layer fp32-vs-int8 error as each backend computed it.

The host writes a *twin* of each variant with the int8 model's activation tensors exposed as
graph outputs: in the int8 (QDQ) twin a DequantizeLinear reads each activation QuantizeLinear's
int8 output, so ekrt and ONNX Runtime hand back the very int8 values they computed; in the fp32
twin the float tensor of the same ONNX name is an output. The device runs both twins on a few
held-out samples (the agent's ``eval --model``) and the host compares them tensor by tensor.

A layer here is one quantized tensor ``t`` and the nodes between it and the quantized tensors it
is computed from (its *region*). Errors propagate: every layer after a broken one is bad too, so
each layer also gets the error it *adds*, its noise-to-signal power minus the worst of its
inputs'; the layer that adds the most is the one that broke it. Per-layer time is the bench's
profiled pass, its entries joined to the regions by node name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and onnx load on use: the HTML report imports node_name only
    import numpy as np
    import onnx

TWIN_DIR = "layers"  # a variant's twin lives in <variant>/layers/ in the bundle
WORST = 10  # layers the summary lists

_FUSED = re.compile(r"(_token_\d+|_nchwc|_quant)+$")


@dataclass(frozen=True)
class Layer:
    tensor: str  # the float model's tensor name
    q_output: str  # the int8 graph's QuantizeLinear output (int8) of it
    scale: str  # that QuantizeLinear's scale and zero point inputs
    zero_point: str
    op: str  # the op type that produces the tensor in the float graph
    nodes: tuple[str, ...]  # the region: node names of the int8 graph that compute it from the layers before
    inputs: tuple[str, ...]  # the quantized tensors (layers) it is computed from


def find_layers(fp32: onnx.ModelProto, int8: onnx.ModelProto) -> list[Layer]:
    """The int8 graph's activation tensors that the float graph has under the same name, in the
    int8 graph's order. A QuantizeLinear of ``t`` (``t__fp`` where ``t`` is a graph output, as
    the quantizer writes it) whose input is not a constant is an activation."""
    consts = {i.name for i in int8.graph.initializer} | {n.output[0] for n in int8.graph.node if n.op_type == "Constant"}
    float_names = {o for n in fp32.graph.node for o in n.output} | {i.name for i in fp32.graph.input}
    float_op = {o: n.op_type for n in fp32.graph.node for o in n.output}
    producer = {o: n for n in int8.graph.node for o in n.output}
    qs = {}
    for n in int8.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in consts:
            continue
        t = n.input[0][: -len("__fp")] if n.input[0].endswith("__fp") else n.input[0]
        if t in float_names and len(n.input) >= 3:
            qs[n.output[0]] = (t, n)
    # a DequantizeLinear of a layer's int8 output is where the next region starts
    boundary = {n.output[0]: qs[n.input[0]][0] for n in int8.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in qs}
    matched = {t for t, _ in qs.values()}
    float_producer = {o: n for n in fp32.graph.node for o in n.output}
    float_consts = {i.name for i in fp32.graph.initializer}
    layers = []
    for q_out, (t, qnode) in qs.items():
        nodes, inputs = [qnode.name], []
        # the int8 graph's nodes from the layers before up to t: a DQ of a layer's output ends the walk
        for name in _walk_back([qnode.input[0]], producer, lambda x: x in boundary or x in consts):
            node = producer[name]
            if not (node.op_type == "DequantizeLinear" and node.input[0] in consts):  # a weight's or bias's DQ
                nodes.append(node.name)
        inputs = [boundary[x] for x in _stops([qnode.input[0]], producer, lambda x: x in boundary or x in consts) if x in boundary]
        # and the float graph's (a backend may name a fused float node after one the int8 graph folded, e.g. a BatchNormalization)
        if t in float_producer:
            before = (matched - {t}) | float_consts
            nodes += [float_producer[x].name for x in _walk_back([t], float_producer, before.__contains__)]
        layers.append(Layer(t, q_out, qnode.input[1], qnode.input[2], float_op.get(t, "input"), tuple(dict.fromkeys(nodes)), tuple(dict.fromkeys(inputs))))
    return layers


def _walk_back(starts: list, producer: dict, stop) -> list:
    """Tensor names from ``starts`` back through their producers, not past a tensor where ``stop``: those with a producer."""
    out, seen, stack = [], set(), list(starts)
    while stack:
        name = stack.pop()
        if name in seen or stop(name) or name not in producer:
            continue
        seen.add(name)
        out.append(name)
        stack.extend(i for i in producer[name].input if i)
    return out


def _stops(starts: list, producer: dict, stop) -> list:
    """The tensors where ``_walk_back`` stops."""
    found, seen, stack = [], set(), list(starts)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if stop(name):
            found.append(name)
        elif name in producer:
            stack.extend(i for i in producer[name].input if i)
    return found


def int8_twin(int8: onnx.ModelProto, layers: list[Layer]) -> tuple[onnx.ModelProto, list[str]]:
    """The QDQ model with a DequantizeLinear of each layer's int8 tensor as an extra graph output;
    the outputs' layer names in order (None for the model's own outputs)."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    m.CopyFrom(int8)
    order: list = [None] * len(m.graph.output)
    for i, layer in enumerate(layers):
        out = f"__layer{i}"
        m.graph.node.append(helper.make_node("DequantizeLinear", [layer.q_output, layer.scale, layer.zero_point], [out], name=f"{out}__DQ"))
        m.graph.output.append(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
        order.append(layer.tensor)
    return m, order


def fp32_twin(fp32: onnx.ModelProto, layers: list[Layer]) -> tuple[onnx.ModelProto, list]:
    """The float model with each layer's tensor as a graph output (one already an output stays where it is)."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    m.CopyFrom(fp32)
    outputs = [o.name for o in m.graph.output]
    inputs = {i.name for i in m.graph.input}
    order: list = [t if t in {x.tensor for x in layers} else None for t in outputs]
    for layer in layers:
        if layer.tensor in outputs:
            continue
        if layer.tensor in inputs:  # a graph input is fed as it is: the host has it
            continue
        m.graph.output.append(helper.make_tensor_value_info(layer.tensor, onnx.TensorProto.FLOAT, None))
        order.append(layer.tensor)
    return m, order


def by_layer(outputs: dict[str, np.ndarray], order: list) -> dict[str, np.ndarray]:
    """The agent's positional outputs (``output0``...) of a twin, keyed by layer tensor."""
    got = {}
    for k, tensor in enumerate(order):
        if tensor is not None and f"output{k}" in outputs:
            got[tensor] = outputs[f"output{k}"]
    return got


def compare_layers(
    layers: list[Layer], fp: dict[str, np.ndarray], q: dict[str, np.ndarray], times: dict[str, list | None]
) -> list[dict]:
    """Per layer (the int8 graph's order): SNR, cosine, max abs error of the int8 tensor against
    the float one over all samples, the noise-to-signal power it adds over its inputs', and the
    per-layer time each variant's profile gives its region (``times``: variant -> profile)."""
    import numpy as np

    nsr: dict[str, float] = {}
    rows = []
    claimed: dict[str, set] = {v: set() for v in times}
    for layer in layers:
        a, b = fp.get(layer.tensor), q.get(layer.tensor)
        if a is None or b is None or np.shape(a) != np.shape(b):
            continue
        a64, b64 = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
        signal, noise = float(np.sum(a64 * a64)), float(np.sum((a64 - b64) ** 2))
        ratio = noise / signal if signal > 0 else (0.0 if noise == 0 else math.inf)
        nsr[layer.tensor] = ratio
        before = max((nsr.get(i, 0.0) for i in layer.inputs), default=0.0)
        norm = math.sqrt(signal * float(np.sum(b64 * b64)))
        row = {
            "tensor": layer.tensor,
            "op": layer.op,
            "nodes": list(layer.nodes),
            "inputs": list(layer.inputs),
            "snr_db": None if noise == 0 else (-math.inf if signal == 0 else round(10 * math.log10(signal / noise), 2)),
            "cosine": round(float(np.dot(a64, b64)) / norm, 6) if norm > 0 else (1.0 if noise == 0 else 0.0),
            "max_abs_err": float(np.max(np.abs(a64 - b64))) if a64.size else 0.0,
            "added_nsr": ratio - before if math.isfinite(ratio) else math.inf,
            "time_ns": {},
        }
        for variant, profile in times.items():
            row["time_ns"][variant] = _region_time(layer, profile, claimed[variant])
        rows.append(row)
    for row in rows:  # JSON has no infinity
        if row["snr_db"] == -math.inf:
            row["snr_db"] = -999.0
        if not math.isfinite(row["added_nsr"]):
            row["added_nsr"] = 1e9
    return rows


def worst(rows: list[dict], n: int = WORST) -> list[dict]:
    """The layers that add the most error first (ties: the lower SNR)."""
    return sorted(rows, key=lambda r: (-r["added_nsr"], math.inf if r["snr_db"] is None else r["snr_db"]))[:n]


def node_name(name: str, known) -> str:
    """A profiled layer's name as the graph node it came from, where one of ``known`` matches: ONNX
    Runtime names a fused node after one of its nodes plus a suffix (``relu1_nchwc``), OpenVINO
    an operation it split off after the node (``conv1/WithoutBiases``)."""
    for candidate in (name, _FUSED.sub("", name), name.rpartition("/")[0]):
        if candidate in known:
            return candidate
    return name


def _region_time(layer: Layer, profile: list | None, claimed: set) -> int | None:
    """The profiled ns of the entries whose node belongs to the layer's region (each entry counts once)."""
    if not profile:
        return None
    names = set(layer.nodes)
    total, hit = 0, False
    for k, entry in enumerate(profile):
        if k in claimed:
            continue
        if node_name(str(entry.get("name") or ""), names) in names:
            total += int(entry.get("ns") or 0)
            claimed.add(k)
            hit = True
    return total if hit else None


__all__ = ["TWIN_DIR", "Layer", "by_layer", "compare_layers", "find_layers", "fp32_twin", "int8_twin", "node_name", "worst"]
