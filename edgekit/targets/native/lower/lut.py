"""LUT search: a chain of elementwise float ops of ONE int8 tensor becomes one table of 256
entries, computed by running the chain in ONNX Runtime on the 256 dequantized values."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgekit.targets.native import ekm
from edgekit.targets.native.lower.walk import (
    QT,
    SOFTMAX_SCALE,
    SOFTMAX_ZP,
    Lowerer,
    LoweringError,
    QParams,
    channel_vector,
    where,
)

# Elementwise float ops that are a function of one value when their other inputs are constants
ELEMENTWISE = frozenset({
    "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Relu", "Clip", "LeakyRelu", "Elu", "Selu", "Celu",
    "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "Erf", "Softplus", "Softsign", "Floor", "Ceil",
    "Round", "Sin", "Cos", "Mish", "Gelu", "ThresholdedRelu", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
    "Identity", "Sign",
})


MAX_CONE = 64  # nodes folded into one table, at most


def lut_cone(lw: Lowerer, tensor: str, per_channel: bool = False) -> tuple[list[onnx.NodeProto], str] | None:
    """The elementwise subgraph computing float ``tensor`` from ONE int8 tensor (and scalar
    constants), in order, and that int8 tensor (a DequantizeLinear output); None if there is none.

    It looks through intermediate QuantizeLinear -> DequantizeLinear pairs whose own cone has the
    same single source (hard-swish written as ``x * clip(x + 3, 0, 6) / 6`` with a Q/DQ after the
    Clip and the Mul is one function of x): the table runs those Q/DQ too, so it stays exact.
    ``per_channel``: constants may also hold one value per channel, and an inference
    BatchNormalization may be in the chain: a function of one value per channel (LUT_CHANNEL)."""
    try:
        shape = lw.shape(tensor)
    except LoweringError:
        return None
    seen: dict[str, onnx.NodeProto] = {}

    def cone(name: str) -> set[str] | None:
        if lw.is_const(name):
            v = lw.float_const(name)
            return set() if v.size == 1 or (per_channel and channel_vector(v.shape, shape)) else None
        if name in lw.alias:
            if lw.alias[name].shape != shape:
                return None
            inner = through(name)
            return inner if inner is not None and len(inner) == 1 else {name}
        node = lw.producer.get(name)
        bn = per_channel and node is not None and node.op_type == "BatchNormalization"
        if node is None or (node.op_type not in ELEMENTWISE and not bn):
            return None
        if bn and not all(lw.is_const(i) and lw.float_const(i).size == shape[1] for i in node.input[1:5]):
            return None
        try:
            if lw.shape(name) != shape:
                return None
        except LoweringError:
            return None
        leaves: set[str] = set()
        for i in node.input[:1] if bn else node.input:
            if i:
                sub = cone(i)
                if sub is None:
                    return None
                leaves |= sub
        seen.setdefault(node.name or name, node)
        return leaves if len(seen) <= MAX_CONE else None

    def through(alias: str) -> set[str] | None:
        dq = lw.producer.get(alias)
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        qn = lw.producer.get(dq.input[0])
        if qn is None or qn.op_type != "QuantizeLinear" or qn.input[0] in lw.graph_inputs:
            return None
        mark = dict(seen)
        leaves = cone(qn.input[0])
        if leaves is None or len(leaves) != 1:
            seen.clear()
            seen.update(mark)  # not folded: forget what this attempt collected
            return None
        seen.setdefault(qn.name or qn.output[0], qn)
        seen.setdefault(dq.name or dq.output[0], dq)
        return leaves

    leaves = cone(tensor)
    if leaves is None or len(leaves) != 1 or tensor in lw.alias:
        return None
    (src,) = leaves
    order = {id(n): k for k, n in enumerate(lw.model.graph.node)}
    return sorted(seen.values(), key=lambda n: order[id(n)]), src


def lower_lut(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    found = lut_cone(lw, node.output[0])
    if found is None and len(lw.shape(node.output[0], node)) in (2, 4):
        per_channel = lut_cone(lw, node.output[0], per_channel=True)
        if per_channel is not None:
            return _channel_lut(lw, *per_channel, want, act)
    if found is None:
        raise LoweringError(f"{where(node)}: not a function of one int8 tensor", "ekrt turns only elementwise ops of one tensor (and scalar constants) into tables")
    chain, src = found
    lw.tabled.update(n.name for n in chain if n.op_type not in ("QuantizeLinear", "DequantizeLinear"))
    x = lw.alias[src]
    name = "+".join(n.name for n in chain if n.op_type not in ("QuantizeLinear", "DequantizeLinear"))
    if want is not None:
        return lw.table(x, _eval_chain(lw, chain, src, x.q, want, act), want, name)
    values = _eval_chain(lw, chain, src, x.q, None, act)
    q = QParams(SOFTMAX_SCALE, SOFTMAX_ZP) if node.op_type in ("Sigmoid", "HardSigmoid") else lw.natural(values)
    return lw.lut(x, values, q, name)


def _channel_lut(lw: Lowerer, chain: list[onnx.NodeProto], src: str, want, act) -> QT:
    """A chain with per-channel constants (or a BatchNormalization): one table per channel, run
    by ONNX Runtime on every int8 value of every channel at once (LUT_CHANNEL)."""
    x = lw.alias[src]
    c = x.shape[1] if len(x.shape) == 4 else x.shape[-1]
    codes = np.arange(-128, 128, dtype=np.int8)
    grid = np.broadcast_to(codes, (1, c, 1, 256)) if len(x.shape) == 4 else np.broadcast_to(codes[:, None], (256, c))
    lw.tabled.update(n.name for n in chain if n.op_type not in ("QuantizeLinear", "DequantizeLinear"))
    name = "+".join(n.name for n in chain if n.op_type not in ("QuantizeLinear", "DequantizeLinear"))
    want = want or lw.natural(_eval_chain(lw, chain, src, x.q, None, act, np.ascontiguousarray(grid)))
    table = _eval_chain(lw, chain, src, x.q, want, act, np.ascontiguousarray(grid))
    table = table.reshape(c, 256) if len(x.shape) == 4 else table.T
    out = lw.new_i8(x.shape, want)
    lw.op(ekm.LUT_CHANNEL, [x.index, lw.const(ekm.I8, np.ascontiguousarray(table), f"{name}__tables")], out.index, name=name)
    return out


def _eval_chain(lw: Lowerer, chain: list[onnx.NodeProto], src: str, xq: QParams, want: QParams | None,
                act, grid: np.ndarray | None = None) -> np.ndarray:
    """The chain run by ONNX Runtime on all 256 int8 inputs, as the QDQ model has it:
    DequantizeLinear of the input (and of int8 constants), the float nodes, and the
    QuantizeLinear of ``want`` (int8 table) or nothing (float values). ORT then fuses the
    same patterns it fuses in the whole model (QLinearAdd, QLinearSigmoid, ...), so the table
    holds exactly what ORT computes. ``act``: the real range the result is clamped to (None:
    none). ``grid``: the int8 inputs, when not the 256 values (per channel: constants then keep
    their shapes)."""
    i8, f32 = onnx.TensorProto.INT8, onnx.TensorProto.FLOAT
    nodes = [helper.make_node("DequantizeLinear", ["lut_x", "lut_xs", "lut_xz"], [src])]
    inits = [numpy_helper.from_array(np.float32(xq.scale), "lut_xs"), numpy_helper.from_array(np.int8(xq.zp), "lut_xz")]
    for name in sorted({i for n in chain for i in n.input if i and lw.is_const(i)}):
        c = lw.qconsts.get(name)
        if c is not None and c.q.size == 1:
            inits += [numpy_helper.from_array(c.q.reshape(()), name + "__lq"), numpy_helper.from_array(c.scale.reshape(()), name + "__ls"),
                      numpy_helper.from_array(c.zp.reshape(()).astype(c.q.dtype), name + "__lz")]
            nodes.append(helper.make_node("DequantizeLinear", [name + "__lq", name + "__ls", name + "__lz"], [name]))
        else:  # a plain constant as the model has it (a Q/DQ zero point stays int8)
            v = np.asarray(lw.consts[name]) if name in lw.consts else lw.float_const(name).astype(np.float32)
            inits.append(numpy_helper.from_array(v.reshape(()) if v.size == 1 else v, name))
    nodes += list(chain)
    out, elem = chain[-1].output[0], f32
    if want is not None:
        inits += [numpy_helper.from_array(np.float32(want.scale), "lut_ys"), numpy_helper.from_array(np.int8(want.zp), "lut_yz")]
        nodes.append(helper.make_node("QuantizeLinear", [out, "lut_ys", "lut_yz"], ["lut_y"]))
        out, elem = "lut_y", i8
    grid = np.arange(-128, 128, dtype=np.int8) if grid is None else grid
    graph = helper.make_graph(nodes, "lut", [helper.make_tensor_value_info("lut_x", i8, list(grid.shape))],
                              [helper.make_tensor_value_info(out, elem, None)], inits)
    model = helper.make_model(graph, opset_imports=lw.model.opset_import)
    model.ir_version = lw.model.ir_version
    feed = {"lut_x": grid}
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        (y,) = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feed)
    except Exception:  # an op ORT lacks: the ONNX reference implementation
        from onnx.reference import ReferenceEvaluator

        (y,) = ReferenceEvaluator(model).run(None, feed)
    y = np.asarray(y).reshape(grid.shape).astype(np.int8 if want is not None else np.float32)
    if act is None:
        return y
    return np.clip(y, *(act if want is None else lw.act_range(want, act))).astype(y.dtype)
