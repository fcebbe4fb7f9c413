"""``--method dynamic``: int8 weights, activations quantized per tensor at run time.

Every MatMul / Gemm whose weight is a constant becomes ONNX Runtime's dynamic form:

    x -> DynamicQuantizeLinear -> (x_q, x_scale, x_zp)
    MatMulInteger(x_q, W_q, x_zp, 0) -> Cast(float) -> Mul(., x_scale * W_scale) [-> Add(bias)]

which ORT's optimizer fuses (MatMulIntegerToFloatFusion, then DynamicQuantizeMatMulFusion) into
one DynamicQuantizeMatMul kernel per MatMul. The fusion wants each DynamicQuantizeLinear to feed
exactly one MatMulInteger and its scale Mul, so every node gets its own. Conv stays float: ORT's
ConvInteger (it has no fused dynamic Conv) ran magika 2.6x slower than float Conv on this x86 host
(26.7 vs 10.3 ms, 1 thread). Weights are symmetric int8 per output channel with the scheme's
``weight_qmax`` (63 where the host's u8s8 kernels sum pairs in a saturating int16), zero point 0,
so one scalar zero point serves every channel and the per-channel scale lives in the float Mul.

A Gather from a constant table (a text model's token embeddings, most of MiniLM's bytes) keeps the
table in int8, one scale per row: the rows it looks up are dequantized after the lookup (its
output is float, like the float model's), so the model shrinks without any int8 kernel.

Nothing is calibrated: the activation range is each run's own min/max, so the graph is shape-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgekit.quantize import qmath
from edgekit.quantize.rewrite import Analysis, NodeDecision, check_exclude, drop_unused_initializers
from edgekit.quantize.rules import attr
from edgekit.quantize.scheme import QuantScheme

OPS = ("MatMul", "Gemm")
INTEGER_OPS = ("MatMulInteger", "ConvInteger")  # what a reference session computes in float
FLOAT_REASON = "float between the int8 kernels (dynamic: only MatMul/Gemm weights are int8)"
TABLE_MIN = 4096  # elements: smaller tables are not worth three more nodes
CONV_REASON = "float: ONNX Runtime's run-time-quantized ConvInteger is slower than its float Conv (dynamic quantizes MatMul/Gemm)"


def _why_float(node: onnx.NodeProto, consts: dict[str, np.ndarray], elem: dict[str, int]) -> str | None:
    """Why ``node`` cannot take int8 weights with a run-time-quantized input (None: it can)."""
    if elem.get(node.input[0], TensorProto.FLOAT) != TensorProto.FLOAT or node.input[0] in consts:
        return "its input is not a float32 activation"
    w = consts.get(node.input[1])
    if w is None or w.dtype != np.float32:
        return "its weight is not a constant float32 initializer"
    if w.ndim != 2:
        return f"a {w.ndim}-D weight (MatMulInteger's per-column scales need a 2-D one)"
    if node.op_type == "Gemm":
        if attr(node, "transA", 0) or attr(node, "alpha", 1.0) != 1.0 or attr(node, "beta", 1.0) != 1.0:
            return "Gemm with transA, alpha or beta other than 0, 1, 1"
        n = w.shape[0] if attr(node, "transB", 0) else w.shape[1]
        bias = node.input[2] if len(node.input) > 2 else ""
        if bias and (bias not in consts or consts[bias].size != n):
            return "its bias is not a constant vector of one value per output"
    return None


def _table(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> bool:
    """A Gather of rows of a constant float table (an embedding), worth storing in int8?"""
    t = consts.get(node.input[0])
    return t is not None and t.dtype == np.float32 and t.ndim >= 2 and t.size >= TABLE_MIN and attr(node, "axis", 0) == 0


def analyze(model: onnx.ModelProto, exclude: Sequence[str] = ()) -> Analysis:
    """Which nodes of a prepared float model get int8 weights (kind "int8"), and why the others not."""
    check_exclude(model, exclude)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    elem = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.value_info] if v.type.HasField("tensor_type")}
    decisions = []
    for node in model.graph.node:
        if node.name in exclude:
            decisions.append(NodeDecision(node.name, node.op_type, "float", "excluded by --exclude"))
        elif node.op_type == "Gather" and _table(node, consts):
            decisions.append(NodeDecision(node.name, node.op_type, "int8", "int8 table, one scale per row; the rows looked up are dequantized"))
        elif node.op_type in OPS:
            why = _why_float(node, consts, elem)
            decisions.append(NodeDecision(node.name, node.op_type, "float" if why else "int8", why or "int8 weights, input quantized at run time"))
        else:
            decisions.append(NodeDecision(node.name, node.op_type, "float", CONV_REASON if node.op_type == "Conv" else FLOAT_REASON))
    return Analysis(decisions, {}, {}, consts)


def rewrite(model: onnx.ModelProto, analysis: Analysis, scheme: QuantScheme) -> onnx.ModelProto:
    """``model`` (prepared, analysed by ``analyze``) with its int8 nodes in ORT's dynamic form."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    todo = {d.name for d in analysis.decisions if d.kind == "int8"}  # int8 kernels, and int8 tables
    consts = analysis.consts
    added: dict[str, onnx.TensorProto] = {}

    def init(name: str, value: np.ndarray) -> str:
        if name not in added:
            added[name] = numpy_helper.from_array(value, name)
        return name

    nodes: list[onnx.NodeProto] = []
    for node in g.node:
        if node.name not in todo:
            nodes.append(node)
            continue
        p = node.name
        if node.op_type == "Gather":
            t = consts[node.input[0]]
            scale, zp = qmath.weight_params(t, 0)
            q = qmath.quantize(t, scale, zp, "int8", 0)
            rows = scale.reshape(-1, *[1] * (t.ndim - 1))
            names = init(f"{node.input[0]}__rows", q), init(f"{node.input[0]}__rowscale", rows.astype(np.float32))
            nodes.append(helper.make_node("Gather", [names[0], node.input[1]], [f"{p}__q"], f"{p}__gather"))
            nodes.append(helper.make_node("Gather", [names[1], node.input[1]], [f"{p}__s"], f"{p}__gather_scale"))
            nodes.append(helper.make_node("Cast", [f"{p}__q"], [f"{p}__f"], f"{p}__cast", to=TensorProto.FLOAT))
            nodes.append(helper.make_node("Mul", [f"{p}__f", f"{p}__s"], [node.output[0]], f"{p}__dequant"))
            continue
        trans = node.op_type == "Gemm" and attr(node, "transB", 0)
        w = consts[node.input[1]].T if trans else consts[node.input[1]]
        axis = 1 if scheme.per_channel else None  # the output column: one scale each
        scale, zp = qmath.weight_params(w, axis, scheme.weight_qmax)
        wq = qmath.quantize(w, scale, zp, "int8", axis)
        wname = node.input[1] + ("__T" if trans else "")
        names = init(f"{wname}__wq", wq), init(f"{wname}__wscale", scale.astype(np.float32)), init("edgekit__zero_int8", np.array(0, np.int8))
        xq, xs, xz = f"{p}__xq", f"{p}__xscale", f"{p}__xzp"
        nodes.append(helper.make_node("DynamicQuantizeLinear", [node.input[0]], [xq, xs, xz], f"{p}__dql"))
        nodes.append(helper.make_node("MatMulInteger", [xq, names[0], xz, names[2]], [f"{p}__int32"], f"{p}__int"))
        nodes.append(helper.make_node("Mul", [xs, names[1]], [f"{p}__scale"], f"{p}__scale_mul"))
        nodes.append(helper.make_node("Cast", [f"{p}__int32"], [f"{p}__float"], f"{p}__cast", to=TensorProto.FLOAT))
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        scaled = f"{p}__scaled" if bias else node.output[0]
        nodes.append(helper.make_node("Mul", [f"{p}__float", f"{p}__scale"], [scaled], f"{p}__out_mul"))
        if bias:
            # ORT folds an Add of a constant 1-D bias into the fused kernel (either input order: measured)
            b = consts[bias].reshape(-1).astype(np.float32)
            nodes.append(helper.make_node("Add", [scaled, init(f"{bias}__bias", b)], [node.output[0]], f"{p}__bias"))
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(added.values())
    drop_unused_initializers(g)
    return out


def reference_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every MatMulInteger / ConvInteger computed in float, not by the host's int8
    kernels (which run even with ORT_DISABLE_ALL, and saturate on x86 without VNNI): what the
    model means, the same on every CPU.

    MatMulInteger: operands minus zero points, MatMul in double (exact: every int32 sum is far
    inside double's 53 bits). ConvInteger: the same in float32 (ORT has no double Conv), rounded
    to the integer; exact while every partial sum is below 2^24 in magnitude, and beyond it off by
    float32 rounding (a relative 6e-8, far below one quantization step)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    ranks = {t.name: len(t.dims) for t in out.graph.initializer}
    for n in out.graph.node:
        if n.op_type not in INTEGER_OPS:
            nodes.append(n)
            continue
        conv = n.op_type == "ConvInteger"
        to = TensorProto.FLOAT if conv else TensorProto.DOUBLE
        p = f"{n.name or n.output[0]}__ref"
        shifted = []
        for k, (x, zp) in enumerate(((n.input[0], n.input[2] if len(n.input) > 2 else ""), (n.input[1], n.input[3] if len(n.input) > 3 else ""))):
            nodes.append(helper.make_node("Cast", [x], [f"{p}_x{k}"], to=to))
            if zp:
                nodes.append(helper.make_node("Cast", [zp], [f"{p}_z{k}"], to=to))
                z = f"{p}_z{k}"
                if conv and k == 1:  # a per-output-channel zero point: [M] -> [M, 1, ...] (a scalar broadcasts as well)
                    out.graph.initializer.append(numpy_helper.from_array(np.array([-1] + [1] * (ranks.get(x, 4) - 1), np.int64), f"{p}_zshape"))
                    nodes.append(helper.make_node("Reshape", [z, f"{p}_zshape"], [f"{z}r"]))
                    z = f"{z}r"
                nodes.append(helper.make_node("Sub", [f"{p}_x{k}", z], [f"{p}_s{k}"]))
                shifted.append(f"{p}_s{k}")
            else:
                shifted.append(f"{p}_x{k}")
        if conv:
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            nodes.append(helper.make_node("Conv", shifted, [f"{p}_f"], **attrs))
            nodes.append(helper.make_node("Round", [f"{p}_f"], [f"{p}_r"]))
            nodes.append(helper.make_node("Cast", [f"{p}_r"], [n.output[0]], to=TensorProto.INT32))
        else:
            nodes.append(helper.make_node("MatMul", shifted, [f"{p}_f"]))
            nodes.append(helper.make_node("Cast", [f"{p}_f"], [n.output[0]], to=TensorProto.INT32))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
