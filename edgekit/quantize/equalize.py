"""Changes to the float model's constants that make its int8 form closer to it: cross-layer
equalization (before calibration), per-channel weight clipping and bias correction (after it).

Cross-layer equalization (Nagel et al., "Data-Free Quantization", 2019): for Conv -> [Relu] -> Conv
pairs, output channel i of the first is divided by s_i and the matching input channel of the
second multiplied by it, s_i = sqrt(r1_i / r2_i) (r: the channel's weight absmax), so both weights
get the range sqrt(r1_i * r2_i). Relu(x / s) = Relu(x) / s for s > 0, so the float model computes
the same; only positively homogeneous activations (Relu, or none) qualify.

Bias correction: rounding the weights shifts each output channel's mean by E[(W_q - W) x]; with
the calibration's per-channel input means that shift is known and taken out of the float bias.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from edgekit.quantize import qmath
from edgekit.quantize.calib import ChannelMeans
from edgekit.quantize.rewrite import Analysis, consumers
from edgekit.quantize.rules import attr
from edgekit.quantize.scheme import QuantScheme, weight_qmax_of

ROUNDS = 4  # passes over the pairs: a chain (conv -> dw -> pw) shares a layer between two pairs


def equalizable_pairs(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """(first, second) Conv pairs joined by nothing or a Relu, each tensor between them read only
    by the next, every weight and bias constant and read by that node alone."""
    inits = {t.name for t in model.graph.initializer}
    uses = consumers(model)
    outputs = {o.name for o in model.graph.output}

    def own_const(node: onnx.NodeProto, idx: int) -> bool:
        return len(node.input) > idx and node.input[idx] in inits and len(uses.get(node.input[idx], [])) == 1

    pairs = []
    for first in model.graph.node:
        if first.op_type != "Conv" or not own_const(first, 1) or (len(first.input) > 2 and first.input[2] and not own_const(first, 2)):
            continue
        t = first.output[0]
        readers = uses.get(t, [])
        if len(readers) == 1 and readers[0].op_type == "Relu" and t not in outputs:
            t = readers[0].output[0]
            readers = uses.get(t, [])
        if t in outputs or len(readers) != 1 or readers[0].op_type != "Conv" or readers[0].input[0] != t or not own_const(readers[0], 1):
            continue
        pairs.append((first, readers[0]))
    return pairs


def cross_layer_equalize(model: onnx.ModelProto) -> int:
    """Equalize ``model``'s Conv pairs in place (the float function is unchanged); how many pairs."""
    inits = {t.name: t for t in model.graph.initializer}
    arrays = {n: numpy_helper.to_array(t).astype(np.float64) for n, t in inits.items()}
    pairs = equalizable_pairs(model)
    for _ in range(ROUNDS):
        for first, second in pairs:
            w1, w2 = arrays[first.input[1]], arrays[second.input[1]]
            channels, group = w1.shape[0], int(attr(second, "group", 1))
            out2, per_group = w2.shape[0], w2.shape[1]
            if group * per_group != channels or out2 % group:
                continue
            r1 = np.abs(w1).reshape(channels, -1).max(axis=1)
            blocks = w2.reshape(group, out2 // group, per_group, -1)  # [group, out in group, in in group, k]
            r2 = np.abs(blocks).max(axis=(1, 3)).reshape(channels)
            s = np.where((r1 > 0) & (r2 > 0), np.sqrt(r1 / np.where(r2 > 0, r2, 1.0)), 1.0)
            arrays[first.input[1]] = w1 / s.reshape(-1, *([1] * (w1.ndim - 1)))
            if len(first.input) > 2 and first.input[2]:
                arrays[first.input[2]] = arrays[first.input[2]] / s
            arrays[second.input[1]] = (blocks * s.reshape(group, 1, per_group, 1)).reshape(w2.shape)
    for name in {i for f, s in pairs for i in (*f.input[1:3], s.input[1]) if i}:
        t = inits[name]
        t.CopyFrom(numpy_helper.from_array(arrays[name].astype(numpy_helper.to_array(t).dtype), name))
    return len(pairs)


def clip_weights(model: onnx.ModelProto, analysis: Analysis, scheme: QuantScheme) -> dict[str, np.ndarray]:
    """Clip every int8 weight per channel by MSE (qmath.clip_weight), in ``analysis.consts`` (what
    rewrite quantizes); returns the unclipped originals by name, for bias correction."""
    originals: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        r = analysis.rules.get(node.name)
        if r is None or r.weight is None or r.output == "same" or node.input[r.weight] in originals:
            continue
        name = node.input[r.weight]
        originals[name] = analysis.consts[name]
        analysis.consts[name] = qmath.clip_weight(originals[name], r.weight_axis, weight_qmax_of(scheme, node, originals[name].shape))
    return originals


def bias_inputs(model: onnx.ModelProto, analysis: Analysis) -> dict[str, int]:
    """The inputs whose channel means bias correction needs: tensor -> its channel axis."""
    return {node.input[r.activations[0]]: 1 if node.op_type == "Conv" else -1 for node, r in _corrected(model, analysis)}


def _corrected(model: onnx.ModelProto, analysis: Analysis):
    uses = consumers(model)
    for node in model.graph.node:
        r = analysis.rules.get(node.name)  # an int8 Gemm has no transA (rules.gemm)
        if r is None or r.weight is None or r.bias is None or node.op_type not in ("Conv", "Gemm"):
            continue
        if len(uses.get(node.input[r.bias], [])) == 1:  # a shared bias serves other weights too
            yield node, r


def correct_biases(
    model: onnx.ModelProto, analysis: Analysis, means: ChannelMeans, scheme: QuantScheme, originals: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Subtract E[(W_q - W) x] from each corrected layer's bias, in ``analysis.consts`` and, when
    the scheme keeps biases float, in the model's initializer; returns the biases it replaced, by
    name (``restore_biases`` puts them back)."""
    inits = {t.name: t for t in model.graph.initializer}
    replaced: dict[str, np.ndarray] = {}
    for node, r in _corrected(model, analysis):
        mu = means.get(node.input[r.activations[0]])
        w_name, b_name = node.input[r.weight], node.input[r.bias]
        if mu is None:
            continue
        w = originals.get(w_name, analysis.consts[w_name]).astype(np.float64)
        used = analysis.consts[w_name]
        s, z = qmath.weight_params(used, r.weight_axis, weight_qmax_of(scheme, node, used.shape))
        error = qmath.dequantize(analysis.weight_q(w_name, s, z, r.weight_axis), s, z, r.weight_axis) - w
        if node.op_type == "Conv":
            out, per_group = error.shape[0], error.shape[1]
            group = int(attr(node, "group", 1))
            if mu.size != group * per_group:
                continue
            mu_of = mu.reshape(group, per_group)[np.arange(out) // (out // group)]  # [out, in in group]
            shift = (error.reshape(out, per_group, -1).sum(axis=2) * mu_of).sum(axis=1)
        else:
            if mu.size != error.shape[1 if attr(node, "transB", 0) else 0]:
                continue
            shift = (error @ mu if attr(node, "transB", 0) else mu @ error) * attr(node, "alpha", 1.0) / attr(node, "beta", 1.0)
        b = analysis.consts[b_name]
        if shift.shape != b.shape:
            continue
        fixed = (b.astype(np.float64) - shift).astype(b.dtype)
        replaced[b_name] = b
        analysis.consts[b_name] = fixed
        if not scheme.quantize_bias:
            inits[b_name].CopyFrom(numpy_helper.from_array(fixed, b_name))
    return replaced


def restore_biases(model: onnx.ModelProto, analysis: Analysis, biases: dict[str, np.ndarray], scheme: QuantScheme) -> None:
    """Undo ``correct_biases``: ``biases`` (what it returned) back in ``analysis.consts`` and,
    when the scheme keeps biases float, in the model's initializers."""
    inits = {t.name: t for t in model.graph.initializer}
    for name, b in biases.items():
        analysis.consts[name] = b
        if not scheme.quantize_bias:
            inits[name].CopyFrom(numpy_helper.from_array(b, name))
