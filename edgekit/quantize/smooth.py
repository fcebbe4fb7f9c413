"""SmoothQuant-style scale migration (Xiao et al., 2022): ``--method <ranges>+smooth[=alpha]``.

A few input channels of a transformer's MatMul/Gemm carry outliers, so one per-tensor activation
scale spends the int8 grid on them. Channel j of such an input X is divided by
s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) and row j of the (per-channel quantized) weight
multiplied by it: X W = (X diag(1/s)) (diag(s) W), exact in float.

The 1/s goes into the constants of the node that makes X, never into a new Mul (that would be a
float island at run time): a LayerNormalization's scale and bias, a MatMul/Gemm's weight columns
and bias, a Mul by a constant, or an Add/Sub of a constant whose other input is folded the same
way (a decomposed LayerNorm ends in Mul(gamma) -> Add(beta)). Every reader of X must be a
MatMul/Gemm with a constant weight (they all get the same s); otherwise X is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from edgekit.quantize.calib import ChannelAbsMax, Feed, observe, observe_channels

# A constant to change: (node, input index, axis along which the channels lie).
Fold = tuple[onnx.NodeProto, int, int]


@dataclass
class Site:
    """One activation to smooth: its readers' weights take s, its producer's constants 1/s."""

    tensor: str
    channels: int
    readers: list[Fold]  # the weights multiplied by s
    folds: list[Fold]  # the producer's constants divided by s


@dataclass
class Smoothing:
    """What ``smooth_model`` did: the tensors smoothed (-> their MatMul/Gemm readers), and the
    candidates left alone with why."""

    alpha: float
    smoothed: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def inputs(self) -> int:
        return sum(len(r) for r in self.smoothed.values())

    def to_dict(self) -> dict:
        return {"alpha": self.alpha, "inputs": self.inputs, "tensors": self.smoothed, "skipped": self.skipped}


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _last_dims(model: onnx.ModelProto, feed: Feed | None = None) -> dict[str, int]:
    """The size of each float tensor's last axis: from shape inference, else (reshapes computed
    from Shape) as seen on ``feed``."""
    inferred = onnx.shape_inference.infer_shapes(model)
    dims, unknown = {}, []
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        t = vi.type.tensor_type
        if t.elem_type != onnx.TensorProto.FLOAT:
            continue
        if t.shape.dim and t.shape.dim[-1].HasField("dim_value"):
            dims[vi.name] = t.shape.dim[-1].dim_value
        else:
            unknown.append(vi.name)
    if unknown and feed is not None:
        for values in observe(model, unknown, [feed]):
            dims.update((n, v.shape[-1]) for n, v in values.items() if v.ndim)
    return dims


def find_sites(model: onnx.ModelProto, feed: Feed | None = None) -> tuple[list[Site], dict[str, str]]:
    """The activations that can be smoothed, and the MatMul/Gemm inputs that cannot (-> why);
    ``feed``: a sample that tells the channel counts shape inference cannot."""
    inits = {t.name: t for t in model.graph.initializer}
    uses: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for i in node.input:
            uses.setdefault(i, []).append(node)
    producer = {o: n for n in model.graph.node for o in n.output}
    outputs = {o.name for o in model.graph.output}
    last = _last_dims(model, feed)

    def const(name: str, ndim: tuple[int, ...] = (0, 1, 2, 3, 4)) -> bool:
        t = inits.get(name)
        return t is not None and t.data_type == onnx.TensorProto.FLOAT and len(t.dims) in ndim

    def weight(node: onnx.NodeProto, x: str) -> Fold | str:
        if node.op_type not in ("MatMul", "Gemm") or node.input[0] != x or x in node.input[1:]:
            return f"read by {node.op_type} {node.name}, not as a MatMul/Gemm input"
        if not const(node.input[1], (2,)) or (node.op_type == "Gemm" and _attr(node, "transA", 0)):
            return f"{node.op_type} {node.name} has no constant 2-D weight"
        return (node, 1, 1 if node.op_type == "Gemm" and _attr(node, "transB", 0) else 0)

    def fold(x: str, channels: int) -> list[Fold] | str:
        """The constants that divide ``x`` by s when divided by it along their last axis."""
        node = producer.get(x)
        if node is None:
            return "a graph input"
        op = node.op_type
        if op == "LayerNormalization":
            gamma_beta = [i for i in (1, 2) if len(node.input) > i and node.input[i]]
            if not all(const(node.input[i]) and inits[node.input[i]].dims[-1:] == [channels] for i in gamma_beta):
                return f"LayerNormalization {node.name} has a non-constant scale or bias"
            return [(node, i, -1) for i in gamma_beta]
        if op == "MatMul" and const(node.input[1], (2,)):
            return [(node, 1, -1)]
        if op == "Gemm" and const(node.input[1], (2,)) and all(const(i) for i in node.input[2:] if i):
            return [(node, 1, 0 if _attr(node, "transB", 0) else -1), *[(node, 2, -1) for i in node.input[2:3] if i]]
        if op in ("Mul", "Add", "Sub") and len(node.input) == 2:
            k = next((i for i in (1, 0) if const(node.input[i]) and not const(node.input[1 - i])), None)
            if k is None:
                return f"made by {op} {node.name} without one constant input"
            c, other = inits[node.input[k]], node.input[1 - k]
            if c.dims and c.dims[-1] not in (1, channels):
                return f"{op} {node.name}'s constant does not lie along the channels"
            if op == "Mul":
                return [(node, k, -1)]
            if op == "Sub" and k == 0:
                return f"made by Sub {node.name} of a constant minus the activation"
            if other in outputs or len(uses.get(other, [])) != 1 or last.get(other) != channels:
                return f"{op} {node.name}'s other input is read elsewhere or not per channel"
            rest = fold(other, channels)
            return rest if isinstance(rest, str) else [(node, k, -1), *rest]
        return f"made by {op} {node.name}, which has no constant to take the scale"

    sites, skipped = [], {}
    seen = set()
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or not node.input or node.input[0] in seen:
            continue
        x = node.input[0]
        seen.add(x)
        readers = [weight(r, x) for r in uses.get(x, []) if r.op_type != "Shape"]  # a Shape reads no values
        channels = last.get(x)
        why = next((r for r in readers if isinstance(r, str)), None)
        if why is None and x in outputs:
            why = "a graph output"
        if why is None and not channels:
            why = "its channel count is not known"
        if why is None:
            folds = fold(x, channels)
            if isinstance(folds, str):
                why = folds
            else:
                sites.append(Site(x, channels, readers, folds))
                continue
        skipped[x] = why
    return sites, skipped


def _along(values: np.ndarray, vec: np.ndarray, axis: int) -> np.ndarray:
    """``values`` times ``vec`` along ``axis``; a size-1 (or missing) last axis is widened to it."""
    if axis == -1 and (values.ndim == 0 or values.shape[-1] == 1):
        values = np.broadcast_to(values, (*values.shape[:-1], vec.size))
    shape = [1] * values.ndim
    shape[axis] = vec.size
    return values * vec.reshape(shape)


def smooth_model(model: onnx.ModelProto, feeds: Sequence[Feed], alpha: float) -> Smoothing:
    """Smooth ``model`` in place (its float outputs unchanged); one float pass over ``feeds``
    measures each candidate's per-channel max|x|."""
    sites, skipped = find_sites(model, feeds[0] if feeds else None)
    result = Smoothing(alpha, skipped=skipped)
    absmax = ChannelAbsMax({s.tensor: -1 for s in sites})
    observe_channels(model, absmax, feeds)
    inits = {t.name: t for t in model.graph.initializer}
    refs: dict[str, int] = {}
    for node in model.graph.node:
        for i in node.input:
            refs[i] = refs.get(i, 0) + 1
    for site in sites:
        a = absmax.get(site.tensor)
        if a is None or a.size != site.channels:
            result.skipped[site.tensor] = "not seen in calibration"
            continue
        w = np.zeros(site.channels)
        for node, i, axis in site.readers:
            arr = np.abs(numpy_helper.to_array(inits[node.input[i]]))
            w = np.maximum(w, arr.max(axis=1 - axis))
        ok = (a > 0) & (w > 0)
        s = np.where(ok, np.power(np.where(ok, a, 1.0), alpha) / np.power(np.where(ok, w, 1.0), 1 - alpha), 1.0)
        for (node, i, axis), vec in [*((f, s) for f in site.readers), *((f, 1.0 / s) for f in site.folds)]:
            name = node.input[i]
            new = _along(numpy_helper.to_array(inits[name]).astype(np.float64), vec, axis).astype(np.float32)
            if refs[name] > 1:  # shared with another reader: this node gets a copy of its own
                refs[name] -= 1
                name = f"{name}__smooth_{node.name or len(inits)}_{i}"
                node.input[i] = name
                refs[name] = 1
                inits[name] = model.graph.initializer.add()
            inits[name].CopyFrom(numpy_helper.from_array(new, name))
        result.smoothed[site.tensor] = [node.name for node, _, _ in site.readers]
    return result
