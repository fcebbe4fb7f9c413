"""QDQ ONNX -> ``.ekm``: fuse DequantizeLinear -> op -> QuantizeLinear into ekrt's integer ops.

The QDQ model (what ``edgekit quantize`` writes) says, for every int8 tensor, its scale and
zero point: each ``QuantizeLinear`` on an activation becomes one int8 tensor of the runtime,
and a ``DequantizeLinear`` of it is that same tensor seen as float. Between them sit float
nodes; the lowering turns each float node into the integer op that produces exactly the
quantized value the QuantizeLinear asks for (docs/ekrt.md "Numbers" and "Ops"):

* Conv / Gemm / MatMul with int8 weights (+ int32 bias) (+ Relu/Clip) -> CONV2D /
  FULLY_CONNECTED with per-channel (multiplier, shift) of ``s_x * s_w[c] / s_y``;
* Add / Mul of two int8 tensors -> ADD / MUL; Concat, MaxPool, AveragePool,
  GlobalAveragePool, Reshape / Flatten / Squeeze / Unsqueeze / Transpose, Resize, Softmax;
* any chain of elementwise float ops of ONE int8 tensor (Sigmoid, Tanh, HardSigmoid,
  HardSwish, Div by a constant, ...) -> one LUT of 256 entries, computed by running the
  chain in ONNX Runtime on the 256 dequantized values, so the table holds what ORT computes;
* data movement (MaxPool, Reshape, ...) commutes with a monotone quantization, so a float
  island like ``DQ -> Div -> MaxPool -> Q`` quantizes before the MaxPool, exactly.

Layout: 4-D int8 activations are stored NHWC; graph inputs and outputs keep the model's NCHW.
``LOWERINGS`` (op type -> function) is the single list of what lowers; ``check_lowerable``
answers the planner from it without calibration data.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgekit.errors import ModelError
from edgekit.quantize import qmath
from edgekit.targets.native import ekm
from edgekit.targets.native.requant import quantize_multiplier

NHWC = (0, 2, 3, 1)  # stored axis i holds logical (NCHW) axis NHWC[i]
ADD_LEFT_SHIFT = 20
SOFTMAX_SCALE, SOFTMAX_ZP = 1.0 / 256.0, -128
FLOAT_CONST_MAX = 1 << 22  # elements: larger constant folds are not worth it


class LoweringError(ModelError):
    """A node ekrt cannot run; the message names it."""


@dataclass(frozen=True)
class QParams:
    scale: float
    zp: int


@dataclass
class QT:
    """An int8 tensor of the runtime: its index in the .ekm, its logical (ONNX) shape, its params."""

    index: int
    shape: tuple[int, ...]
    q: QParams


@dataclass
class QConst:
    """A constant that reaches a node through DequantizeLinear: integer values + params."""

    q: np.ndarray
    scale: np.ndarray
    zp: np.ndarray
    axis: int | None

    def dequantized(self) -> np.ndarray:
        axis = self.axis if self.scale.ndim == 1 and self.q.ndim > 0 else None
        if axis is not None and axis < 0:
            axis += self.q.ndim
        return qmath.dequantize(self.q, self.scale, self.zp, axis)


@dataclass
class LowerReport:
    ops: dict[str, int] = field(default_factory=dict)  # ekm op name -> count
    arena_bytes: int = 0
    const_bytes: int = 0

    def to_dict(self) -> dict:
        return {"ops": self.ops, "arena_bytes": self.arena_bytes, "const_bytes": self.const_bytes}


def stored(shape: tuple[int, ...]) -> tuple[int, ...]:
    """How the runtime stores a logical shape: 4-D as NHWC, the rest as is."""
    return tuple(shape[i] for i in NHWC) if len(shape) == 4 else tuple(shape)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _where(node: onnx.NodeProto) -> str:
    return f"{node.op_type} node '{node.name}'"


# ---------------------------------------------------------------------------------------------


class Lowerer:
    """One lowering of one QDQ model; ``run()`` returns the EkmModel."""

    def __init__(self, model: onnx.ModelProto) -> None:
        try:
            model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception as exc:  # shape inference raises several types; name the problem
            raise LoweringError(f"ONNX shape inference failed on the quantized model: {exc}", "check the model with onnx.checker") from None
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        g = model.graph
        self.shapes: dict[str, tuple[int, ...]] = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            dims = vi.type.tensor_type.shape.dim
            if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
                self.shapes[vi.name] = tuple(d.dim_value for d in dims)
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.qconsts: dict[str, QConst] = {}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in g.node:
            for o in node.output:
                self.producer[o] = node
            for i in node.input:
                self.consumers.setdefault(i, []).append(node)
        self.graph_inputs = {i.name for i in g.input if i.name not in self.consts}
        self.m = ekm.EkmModel()
        self.alias: dict[str, QT] = {}  # ONNX tensor -> runtime int8 tensor holding it exactly
        self.io: dict[str, int] = {}
        self.memo: dict[tuple, QT] = {}
        self.report = LowerReport()

    # -- tensors --------------------------------------------------------------------------

    def shape(self, name: str, node: onnx.NodeProto | None = None) -> tuple[int, ...]:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        if name in self.alias:
            return self.alias[name].shape
        if name not in self.shapes and name in self.producer:
            self._infer_shape(self.producer[name])
        if name not in self.shapes:
            where = f" ({_where(node)})" if node is not None else ""
            raise LoweringError(f"tensor '{name}'{where} has no static shape", "give the model's input shapes (--shape NAME=1,3,224,224)")
        return self.shapes[name]

    def _infer_shape(self, node: onnx.NodeProto) -> None:
        """ONNX shape inference on one node, its constant inputs given by value (after folding)."""
        inits, ins = [], []
        for i in node.input:
            if not i:
                continue
            if self.is_const(i):
                v = self.consts[i] if i in self.consts else self.float_const(i)
                inits.append(numpy_helper.from_array(np.asarray(v), i))
            else:
                elem = onnx.TensorProto.INT8 if self.producer.get(i) is not None and self.producer[i].op_type == "QuantizeLinear" else onnx.TensorProto.FLOAT
                ins.append(helper.make_tensor_value_info(i, elem, self.shape(i, node)))
        outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
        m = helper.make_model(helper.make_graph([node], "one", ins, outs, inits), opset_imports=self.model.opset_import)
        m.ir_version = self.model.ir_version
        try:
            inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
        except Exception:  # nothing more to learn; the caller names the tensor
            return
        for vi in list(inferred.graph.output) + list(inferred.graph.value_info):
            dims = vi.type.tensor_type.shape.dim
            if dims and all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
                self.shapes[vi.name] = tuple(d.dim_value for d in dims)

    def new_i8(self, shape: tuple[int, ...], q: QParams) -> QT:
        idx = self.m.add_tensor(ekm.Tensor(ekm.I8, ekm.ARENA, stored(shape), q.scale, q.zp))
        return QT(idx, tuple(shape), q)

    def const(self, dtype: int, data: np.ndarray, name: str = "") -> int:
        data = np.ascontiguousarray(data, dtype=ekm.DTYPE_NUMPY[dtype])
        self.report.const_bytes += data.nbytes
        dims = data.shape if data.ndim else (1,)
        return self.m.add_tensor(ekm.Tensor(dtype, ekm.CONST, tuple(dims), data=data.reshape(dims), name=name))

    def is_const(self, name: str) -> bool:
        return name in self.consts or name in self.qconsts

    def float_const(self, name: str) -> np.ndarray:
        if name in self.consts:
            return self.consts[name].astype(np.float32)
        return self.qconsts[name].dequantized()

    def op(self, type_: int, inputs: list[int], output: int, params=None, name: str = "") -> None:
        self.m.add_op(type_, inputs, [output], params, name)
        key = ekm.OP_NAMES[type_]
        self.report.ops[key] = self.report.ops.get(key, 0) + 1

    # -- the walk ---------------------------------------------------------------------------

    def run(self) -> ekm.EkmModel:
        g = self.model.graph
        for node in g.node:
            if node.op_type == "Constant":
                self.consts[node.output[0]] = numpy_helper.to_array(_attrs(node)["value"])
            elif node.op_type == "DequantizeLinear":
                self._dequantize(node)
            elif node.op_type == "QuantizeLinear":
                self._quantize(node)
            elif node.input and all((not i) or self.is_const(i) for i in node.input) and node.op_type != "Shape":
                self._fold(node)
            elif node.op_type == "Shape":
                self._fold_shape(node)
        for i, inp in enumerate(g.input):
            if inp.name in self.graph_inputs and inp.name not in self.io:
                raise LoweringError(
                    f"graph input '{inp.name}' does not go through a QuantizeLinear",
                    "quantize the model with edgekit (the native scheme) so every input is quantized",
                ) if any(True for _ in self.consumers.get(inp.name, [])) else LoweringError(
                    f"graph input {i} '{inp.name}' is unused", "remove it from the model")
        for out in g.output:
            qt = self.alias.get(out.name) or self.materialize(out.name, None)
            shape = self.shape(out.name)
            if len(shape) > ekm.MAX_RANK:
                raise LoweringError(f"graph output '{out.name}' has rank {len(shape)}", "ekrt tensors have rank <= 4")
            io = self.m.add_tensor(ekm.Tensor(ekm.F32, ekm.IO, shape, name=out.name))
            self.op(ekm.DEQUANTIZE, [qt.index], io, {0: int(len(shape) == 4)}, name=f"{out.name}__DQ")
            self.m.outputs.append((io, out.name))
        self.m.inputs.sort(key=lambda io_name: [i.name for i in g.input].index(io_name[1]))
        remap = _prune(self.m)
        self.alias = {k: QT(remap[v.index], v.shape, v.q) for k, v in self.alias.items() if v.index in remap}
        self.report.ops = dict(Counter(op.type_name for op in self.m.ops))
        _flatten_fc_inputs(self.m)
        self.report.arena_bytes = plan_memory(self.m)
        return self.m

    def _fold(self, node: onnx.NodeProto) -> None:
        from onnx.reference import ReferenceEvaluator

        feeds = {i: self.float_const(i) if i in self.qconsts else self.consts[i] for i in node.input if i}
        inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in feeds.items()]
        outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output]
        gm = helper.make_graph([node], "fold", [], outs, inits)
        mm = helper.make_model(gm, opset_imports=self.model.opset_import)
        try:
            results = ReferenceEvaluator(mm).run(None, {})
        except Exception as exc:
            raise LoweringError(f"cannot fold the constant {_where(node)}: {exc}", "simplify the model (onnxsim) first") from None
        for o, r in zip(node.output, results):
            r = np.asarray(r)
            if r.size > FLOAT_CONST_MAX:
                raise LoweringError(f"{_where(node)} makes a constant of {r.size} elements", "simplify the model first")
            self.consts[o] = r

    def _fold_shape(self, node: onnx.NodeProto) -> None:
        shape = np.array(self.shape(node.input[0], node), dtype=np.int64)
        a = _attrs(node)
        start, end = a.get("start", 0), a.get("end", None)
        self.consts[node.output[0]] = shape[start:end]

    def _dequantize(self, node: onnx.NodeProto) -> None:
        x = node.input[0]
        if x in self.consts:
            scale = self.consts[node.input[1]].astype(np.float32)
            zp = self.consts[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros_like(self.consts[x], shape=scale.shape)
            self.qconsts[node.output[0]] = QConst(self.consts[x], scale, np.asarray(zp), _attrs(node).get("axis", 1))
            return
        if x not in self.alias:
            raise LoweringError(f"{_where(node)} reads '{x}', which is not an int8 tensor of this graph", "int8 graph inputs are not supported")
        self.alias[node.output[0]] = self.alias[x]

    def _quantize(self, node: onnx.NodeProto) -> None:
        x = node.input[0]
        q = self.qparams(node)
        if x in self.consts:
            self.consts[node.output[0]] = qmath.quantize(self.consts[x], q.scale, q.zp, "int8")
            return
        if x in self.graph_inputs:
            if x not in self.io:
                shape = self.shape(x, node)
                if len(shape) > ekm.MAX_RANK:
                    raise LoweringError(f"graph input '{x}' has rank {len(shape)}", "ekrt tensors have rank <= 4")
                self.io[x] = self.m.add_tensor(ekm.Tensor(ekm.F32, ekm.IO, shape, name=x))
                self.m.inputs.append((self.io[x], x))
            out = self.new_i8(self.shape(x), q)
            self.op(ekm.QUANTIZE, [self.io[x]], out.index, {0: int(len(out.shape) == 4)}, name=node.name)
            self.alias[node.output[0]] = out
            return
        self.alias[node.output[0]] = self.materialize(x, q)

    def qparams(self, node: onnx.NodeProto) -> QParams:
        scale = self.consts.get(node.input[1])
        zp = self.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
        if scale is None or zp is None or scale.size != 1 or zp.size != 1:
            raise LoweringError(f"{_where(node)} is not per-tensor with constant scale and zero point", "quantize with edgekit (per-tensor activations)")
        if zp.dtype != np.int8:
            raise LoweringError(f"{_where(node)} quantizes to {zp.dtype}, ekrt runs int8 activations", "quantize with the native scheme (int8 activations)")
        s = float(np.float32(scale.reshape(())))
        if not (s > 0 and math.isfinite(s)):
            raise LoweringError(f"{_where(node)} has scale {s}", "scales must be positive")
        return QParams(s, int(zp.reshape(())))

    # -- float tensors become int8 on demand ---------------------------------------------------

    def materialize(self, name: str, want: QParams | None, act: tuple[float, float] | None = None) -> QT:
        """The int8 tensor holding float tensor ``name`` quantized with ``want`` (None: the op's
        natural params), clamped to the real range ``act``."""
        key = (name, want, act)
        if key in self.memo:
            return self.memo[key]
        if name in self.alias:
            qt = self.requant(self.alias[name], want, act, name)
        else:
            node = self.producer.get(name)
            if node is None:
                raise LoweringError(f"tensor '{name}' is neither produced by a node nor an int8 tensor", "check the model")
            fn = LOWERINGS.get(node.op_type)
            if fn is None:
                raise LoweringError(f"{_where(node)}: ekrt has no {node.op_type}", f"ekrt runs: {', '.join(sorted(LOWERINGS))}; deploy with another backend (--backend onnxruntime)")
            qt = fn(self, node, want, act)
        self.memo[key] = qt
        return qt

    def input_i8(self, node: onnx.NodeProto, i: int) -> QT:
        """Input ``i`` of an integer op: an int8 tensor (a DequantizeLinear output)."""
        name = node.input[i]
        if name in self.alias:
            return self.alias[name]
        if self.is_const(name):
            raise LoweringError(f"{_where(node)}: input {i} is a constant where ekrt wants an int8 activation", "keep that input an activation")
        return self.materialize(name, None)

    def act_range(self, q: QParams, act: tuple[float, float] | None) -> tuple[int, int]:
        if act is None:
            return -128, 127
        lo, hi = act
        qlo = -128 if lo == -math.inf else int(qmath.quantize(np.float32(lo), q.scale, q.zp, "int8"))
        qhi = 127 if hi == math.inf else int(qmath.quantize(np.float32(hi), q.scale, q.zp, "int8"))
        return qlo, qhi

    def requant(self, x: QT, want: QParams | None, act, name: str) -> QT:
        """``x`` itself when params and clamp change nothing, else a LUT that requantizes."""
        if (want is None or want == x.q) and (act is None or self.act_range(x.q, act) == (-128, 127)):
            return x
        out_q = want or x.q
        grid = np.arange(-128, 128, dtype=np.int32)
        f = (grid - x.q.zp).astype(np.float32) * np.float32(x.q.scale)
        if act is not None:
            f = np.clip(f, np.float32(act[0]) if act[0] != -math.inf else f.min(), np.float32(act[1]) if act[1] != math.inf else f.max())
        return self.lut(x, f, out_q, f"{name}__requant")

    def lut(self, x: QT, values: np.ndarray, q: QParams, name: str) -> QT:
        return self.table(x, qmath.quantize(np.nan_to_num(values.astype(np.float32)), q.scale, q.zp, "int8"), q, name)

    def table(self, x: QT, table: np.ndarray, q: QParams, name: str) -> QT:
        out = self.new_i8(x.shape, q)
        self.op(ekm.LUT, [x.index, self.const(ekm.I8, table, f"{name}__table")], out.index, name=name)
        return out

    def natural(self, values: np.ndarray) -> QParams:
        finite = values[np.isfinite(values)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        s, z = qmath.scale_zero_point(lo, hi, "int8", False)
        return QParams(float(s), int(z))

    def requant_params(self, real: np.ndarray) -> tuple[int, int]:
        mults, shifts = zip(*(quantize_multiplier(float(r)) for r in np.atleast_1d(real)))
        return self.const(ekm.I32, np.array(mults, np.int32)), self.const(ekm.I32, np.array(shifts, np.int32))

    def want_or_fail(self, node: onnx.NodeProto, want: QParams | None) -> QParams:
        if want is None:
            raise LoweringError(
                f"{_where(node)}: its output '{node.output[0]}' stays float (no QuantizeLinear after it)",
                "quantize the model with edgekit's native scheme, or deploy with another backend",
            )
        return want


# -- one function per ONNX op --------------------------------------------------------------------


def _padding(lw: Lowerer, node: onnx.NodeProto, in_hw: tuple[int, int], kernel: tuple[int, int],
             strides: tuple[int, int], dilations: tuple[int, int], out_hw: tuple[int, int]) -> list[int]:
    a = _attrs(node)
    auto = _s(a.get("auto_pad", "NOTSET"))
    if auto in ("NOTSET", ""):
        pads = list(a.get("pads", [0, 0, 0, 0]))
        if len(pads) != 4:
            raise LoweringError(f"{_where(node)} has pads {pads}", "ekrt runs 2-D convolutions and pools")
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    else:
        pads = [0, 0, 0, 0]
        for d in range(2):
            total = max(0, (out_hw[d] - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1 - in_hw[d])
            small, big = total // 2, total - total // 2
            pads[d], pads[d + 2] = (small, big) if auto == "SAME_UPPER" else (big, small)
    # ceil_mode (pools): pad the end so the window count matches the output size
    for d in range(2):
        need = (out_hw[d] - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1 - in_hw[d] - pads[d]
        if need > pads[d + 2]:
            if node.op_type == "AveragePool" and a.get("count_include_pad", 0):
                raise LoweringError(f"{_where(node)}: ceil_mode with count_include_pad", "ekrt does not run that combination")
            pads[d + 2] = need
    if any(p < 0 for p in pads):
        raise LoweringError(f"{_where(node)} has negative pads {pads}", "ekrt does not crop inside convolutions")
    return pads


def lower_conv(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    want = lw.want_or_fail(node, want)
    x = lw.input_i8(node, 0)
    if len(x.shape) != 4:
        raise LoweringError(f"{_where(node)} is {len(x.shape) - 2}-D", "ekrt runs 2-D convolutions only")
    wname = node.input[1]
    if wname not in lw.qconsts:
        raise LoweringError(f"{_where(node)}: the weight is not an int8 constant", "quantize the model with edgekit")
    w = lw.qconsts[wname]
    if np.any(w.zp != 0) or w.q.dtype != np.int8:
        raise LoweringError(f"{_where(node)}: weights are not symmetric int8", "quantize with edgekit (symmetric int8 weights)")
    a = _attrs(node)
    m_out, cpg, kh, kw = w.q.shape
    group = int(a.get("group", 1))
    strides = tuple(a.get("strides", (1, 1)))
    dil = tuple(a.get("dilations", (1, 1)))
    out_shape = lw.shape(node.output[0], node)
    n, c, h, wd = x.shape
    if c != cpg * group or m_out % group:
        raise LoweringError(f"{_where(node)}: {c} input channels do not fit weight {w.q.shape} with group {group}", "check the model")
    pads = _padding(lw, node, (h, wd), (kh, kw), strides, dil, out_shape[2:])
    s_w = np.broadcast_to(w.scale.astype(np.float64), (m_out,))
    real = np.float64(x.q.scale) * s_w / np.float64(want.scale)
    bias = np.zeros(m_out, np.int32)
    if len(node.input) > 2 and node.input[2]:
        bias = _bias(lw, node, node.input[2], m_out)
    wt = w.q.transpose(0, 2, 3, 1)  # [M][KH][KW][C/group]
    mult, shift = lw.requant_params(real)
    out = lw.new_i8(out_shape, want)
    amin, amax = lw.act_range(want, act)
    params = {0: kh, 1: kw, 2: strides[0], 3: strides[1], 4: dil[0], 5: dil[1],
              6: pads[0], 7: pads[1], 8: pads[2], 9: pads[3], 10: group, 11: amin, 12: amax}
    lw.op(ekm.CONV2D, [x.index, lw.const(ekm.I8, wt, wname), lw.const(ekm.I32, bias), mult, shift], out.index, params, node.name)
    return out


def _bias(lw: Lowerer, node: onnx.NodeProto, name: str, n: int) -> np.ndarray:
    b = lw.qconsts.get(name)
    if b is None or b.q.dtype != np.int32 or b.q.size != n:
        raise LoweringError(f"{_where(node)}: the bias is not an int32 constant of {n} values", "quantize the model with edgekit")
    return b.q.reshape(n).astype(np.int32)


def lower_gemm(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    want = lw.want_or_fail(node, want)
    x = lw.input_i8(node, 0)
    a = _attrs(node)
    if node.op_type == "Gemm" and (a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0 or a.get("transA", 0)):
        raise LoweringError(f"{_where(node)} has alpha/beta != 1 or transA", "ekrt runs plain x @ W + b")
    wname = node.input[1]
    if wname not in lw.qconsts:
        raise LoweringError(f"{_where(node)}: the weight is not an int8 constant", "ekrt runs a fully connected layer with constant int8 weights")
    w = lw.qconsts[wname]
    if w.q.ndim != 2 or w.q.dtype != np.int8 or np.any(w.zp != 0):
        raise LoweringError(f"{_where(node)}: the weight is not a 2-D symmetric int8 matrix", "quantize with edgekit")
    trans_b = node.op_type == "Gemm" and a.get("transB", 0)
    wq = w.q if trans_b else w.q.T  # [N][K]
    n_out, k = wq.shape
    if int(np.prod(x.shape)) != k or x.shape[-1] != k or any(d != 1 for d in x.shape[:-1]):
        raise LoweringError(f"{_where(node)}: input shape {x.shape} is not [1, {k}]", "ekrt runs batch-1 fully connected layers")
    axis = w.axis if w.axis is None or w.axis >= 0 else w.axis + 2
    if w.scale.size > 1 and axis != (0 if trans_b else 1):
        raise LoweringError(f"{_where(node)}: weight scales are not per output channel", "quantize with edgekit")
    s_w = np.broadcast_to(w.scale.reshape(-1).astype(np.float64), (n_out,))
    real = np.float64(x.q.scale) * s_w / np.float64(want.scale)
    bias = np.zeros(n_out, np.int32)
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        bias = _bias(lw, node, node.input[2], n_out)
    out_shape = lw.shape(node.output[0], node)
    mult, shift = lw.requant_params(real)
    out = lw.new_i8(out_shape, want)
    amin, amax = lw.act_range(want, act)
    lw.op(ekm.FULLY_CONNECTED, [x.index, lw.const(ekm.I8, wq, wname), lw.const(ekm.I32, bias), mult, shift], out.index, {11: amin, 12: amax}, node.name)
    return out


def _channel_vector(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """Does ``shape`` broadcast as one value per channel (the NHWC innermost axis)?"""
    if len(out_shape) == 4:
        full = (1,) * (4 - len(shape)) + tuple(shape)
        return full[0] == 1 and full[2] == 1 and full[3] == 1 and full[1] == out_shape[1]
    full = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return all(d == 1 for d in full[:-1]) and full[-1] == out_shape[-1]


def _operand(lw: Lowerer, node: onnx.NodeProto, i: int, out_shape) -> tuple[QT | None, tuple]:
    """An Add/Mul operand as an int8 tensor: activations as they are, constants quantized."""
    name = node.input[i]
    if not lw.is_const(name):
        qt = lw.input_i8(node, i)
        return qt, qt.shape
    if name in lw.qconsts and lw.qconsts[name].q.dtype == np.int8 and lw.qconsts[name].scale.size == 1:
        c = lw.qconsts[name]
        q, qp = c.q, QParams(float(c.scale.reshape(())), int(c.zp.reshape(())))
    else:
        v = lw.float_const(name)
        qp = lw.natural(v)
        q = qmath.quantize(v, qp.scale, qp.zp, "int8")
    shape = tuple(q.shape)
    if shape == tuple(out_shape):
        data = q.transpose(NHWC) if len(shape) == 4 else q
        dims = stored(shape)
    elif _channel_vector(shape, out_shape):
        data = q.reshape(-1)
        dims = (1, 1, 1, out_shape[1]) if len(out_shape) == 4 else (1,) * (len(out_shape) - 1) + (out_shape[-1],)
    else:
        return None, shape
    idx = lw.m.add_tensor(ekm.Tensor(ekm.I8, ekm.CONST, dims, qp.scale, qp.zp, data=np.ascontiguousarray(data).reshape(dims), name=name))
    lw.report.const_bytes += data.size
    return QT(idx, shape, qp), shape


def lower_binary(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    consts = [lw.is_const(i) for i in node.input]
    if any(consts) and _scalar_const(lw, node):
        return lower_lut(lw, node, want, act)
    if all(consts):
        raise LoweringError(f"{_where(node)} has only constant inputs", "fold it (onnxsim) first")
    if _lut_cone(lw, node.output[0]) is not None:  # e.g. x * relu6(x + 3): a function of x alone
        return lower_lut(lw, node, want, act)
    if node.op_type not in ("Add", "Mul"):
        raise LoweringError(f"{_where(node)}: {node.op_type} of two tensors", "ekrt runs Add and Mul of two int8 tensors; Sub/Div only by a constant")
    want = lw.want_or_fail(node, want)
    out_shape = lw.shape(node.output[0], node)
    a, a_shape = _operand(lw, node, 0, out_shape)
    b, b_shape = _operand(lw, node, 1, out_shape)
    if a is None or b is None:
        raise LoweringError(f"{_where(node)}: shapes {a_shape} and {b_shape} broadcast in a way ekrt does not run", "ekrt broadcasts only a per-channel operand")
    if tuple(a_shape) != tuple(out_shape):
        a, b, a_shape, b_shape = b, a, b_shape, a_shape
    if tuple(a_shape) != tuple(out_shape):
        raise LoweringError(f"{_where(node)}: neither input has the output's shape {out_shape}", "ekrt broadcasts only a per-channel operand")
    out = lw.new_i8(out_shape, want)
    amin, amax = lw.act_range(want, act)
    if node.op_type == "Add":
        twice_max = 2.0 * max(a.q.scale, b.q.scale)
        ma, sa = quantize_multiplier(a.q.scale / twice_max)
        mb, sb = quantize_multiplier(b.q.scale / twice_max)
        mo, so = quantize_multiplier(twice_max / ((1 << ADD_LEFT_SHIFT) * want.scale))
        params = {0: ma, 1: sa, 2: mb, 3: sb, 4: ADD_LEFT_SHIFT, 5: mo, 6: so, 11: amin, 12: amax}
        lw.op(ekm.ADD, [a.index, b.index], out.index, params, node.name)
    else:
        m_, s_ = quantize_multiplier(a.q.scale * b.q.scale / want.scale)
        lw.op(ekm.MUL, [a.index, b.index], out.index, {0: m_, 1: s_, 11: amin, 12: amax}, node.name)
    return out


def _scalar_const(lw: Lowerer, node: onnx.NodeProto) -> bool:
    """One non-constant input (or the same one twice) and constants of one value each."""
    live = {i for i in node.input if i and not lw.is_const(i)}
    return len(live) == 1 and all(lw.float_const(i).size == 1 for i in node.input if i and lw.is_const(i))


# Elementwise float ops that are a function of one value when their other inputs are constants
ELEMENTWISE = frozenset({
    "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Relu", "Clip", "LeakyRelu", "Elu", "Selu", "Celu",
    "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "Erf", "Softplus", "Softsign", "Floor", "Ceil",
    "Round", "Sin", "Cos", "Mish", "Gelu", "ThresholdedRelu", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
    "Identity", "Sign",
})


MAX_CONE = 64  # nodes folded into one table, at most


def _lut_cone(lw: Lowerer, tensor: str) -> tuple[list[onnx.NodeProto], str] | None:
    """The elementwise subgraph computing float ``tensor`` from ONE int8 tensor (and scalar
    constants), in order, and that int8 tensor (a DequantizeLinear output); None if there is none.

    It looks through intermediate QuantizeLinear -> DequantizeLinear pairs whose own cone has the
    same single source (hard-swish written as ``x * clip(x + 3, 0, 6) / 6`` with a Q/DQ after the
    Clip and the Mul is one function of x): the table runs those Q/DQ too, so it stays exact."""
    try:
        shape = lw.shape(tensor)
    except LoweringError:
        return None
    seen: dict[str, onnx.NodeProto] = {}

    def cone(name: str) -> set[str] | None:
        if lw.is_const(name):
            return set() if lw.float_const(name).size == 1 else None
        if name in lw.alias:
            if lw.alias[name].shape != shape:
                return None
            inner = through(name)
            return inner if inner is not None and len(inner) == 1 else {name}
        node = lw.producer.get(name)
        if node is None or node.op_type not in ELEMENTWISE:
            return None
        try:
            if lw.shape(name) != shape:
                return None
        except LoweringError:
            return None
        leaves: set[str] = set()
        for i in node.input:
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
    found = _lut_cone(lw, node.output[0])
    if found is None:
        raise LoweringError(f"{_where(node)}: not a function of one int8 tensor", "ekrt turns only elementwise ops of one tensor (and scalar constants) into tables")
    chain, src = found
    x = lw.alias[src]
    name = "+".join(n.name for n in chain if n.op_type not in ("QuantizeLinear", "DequantizeLinear"))
    if want is not None:
        table = _eval_chain(lw, chain, src, x.q, want)
        if act is not None:
            table = np.clip(table, *lw.act_range(want, act)).astype(np.int8)
        return lw.table(x, table, want, name)
    values = _eval_chain(lw, chain, src, x.q, None)
    if act is not None:
        values = np.clip(values, act[0], act[1]).astype(np.float32)
    return lw.lut(x, values, _natural_lut(lw, node, values), name)


def _natural_lut(lw: Lowerer, node: onnx.NodeProto, values: np.ndarray) -> QParams:
    if node.op_type in ("Sigmoid", "HardSigmoid"):
        return QParams(SOFTMAX_SCALE, SOFTMAX_ZP)
    return lw.natural(values)


def _eval_chain(lw: Lowerer, chain: list[onnx.NodeProto], src: str, xq: QParams, want: QParams | None) -> np.ndarray:
    """The chain run by ONNX Runtime on all 256 int8 inputs, as the QDQ model has it:
    DequantizeLinear of the input (and of int8 constants), the float nodes, and the
    QuantizeLinear of ``want`` (int8 table) or nothing (float values). ORT then fuses the
    same patterns it fuses in the whole model (QLinearAdd, QLinearSigmoid, ...), so the table
    holds exactly what ORT computes."""
    i8, f32 = onnx.TensorProto.INT8, onnx.TensorProto.FLOAT
    nodes = [helper.make_node("DequantizeLinear", ["lut_x", "lut_xs", "lut_xz"], [src])]
    inits = [numpy_helper.from_array(np.float32(xq.scale), "lut_xs"), numpy_helper.from_array(np.int8(xq.zp), "lut_xz")]
    for name in sorted({i for n in chain for i in n.input if i and lw.is_const(i)}):
        c = lw.qconsts.get(name)
        if c is not None and c.q.size == 1:
            inits += [numpy_helper.from_array(c.q.reshape(()), name + "__lq"), numpy_helper.from_array(c.scale.reshape(()), name + "__ls"),
                      numpy_helper.from_array(c.zp.reshape(()).astype(c.q.dtype), name + "__lz")]
            nodes.append(helper.make_node("DequantizeLinear", [name + "__lq", name + "__ls", name + "__lz"], [name]))
        elif name in lw.consts:  # as the model has it (a Q/DQ zero point stays int8)
            inits.append(numpy_helper.from_array(np.asarray(lw.consts[name]).reshape(()), name))
        else:
            inits.append(numpy_helper.from_array(lw.float_const(name).astype(np.float32).reshape(()), name))
    nodes += list(chain)
    out, elem = chain[-1].output[0], f32
    if want is not None:
        inits += [numpy_helper.from_array(np.float32(want.scale), "lut_ys"), numpy_helper.from_array(np.int8(want.zp), "lut_yz")]
        nodes.append(helper.make_node("QuantizeLinear", [out, "lut_ys", "lut_yz"], ["lut_y"]))
        out, elem = "lut_y", i8
    graph = helper.make_graph(nodes, "lut", [helper.make_tensor_value_info("lut_x", i8, [256])],
                              [helper.make_tensor_value_info(out, elem, None)], inits)
    model = helper.make_model(graph, opset_imports=lw.model.opset_import)
    model.ir_version = lw.model.ir_version
    feed = {"lut_x": np.arange(-128, 128, dtype=np.int8)}
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        (y,) = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feed)
    except Exception:  # an op ORT lacks: the ONNX reference implementation
        from onnx.reference import ReferenceEvaluator

        (y,) = ReferenceEvaluator(model).run(None, feed)
    return np.asarray(y).reshape(256).astype(np.int8 if want is not None else np.float32)


def lower_relu_clip(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    """Relu / Clip after an integer op fold into its clamp; after an int8 tensor they are a LUT."""
    src = node.input[0]
    parent = lw.producer.get(src)
    if src in lw.alias or (parent is not None and parent.op_type in ELEMENTWISE and _lut_cone(lw, src) is not None):
        return lower_lut(lw, node, want, act)
    if node.op_type == "Relu":
        lo, hi = 0.0, math.inf
    else:
        a = _attrs(node)
        lo, hi = a.get("min", -math.inf), a.get("max", math.inf)
        if len(node.input) > 1 and node.input[1]:
            lo = float(lw.float_const(node.input[1]).reshape(()))
        if len(node.input) > 2 and node.input[2]:
            hi = float(lw.float_const(node.input[2]).reshape(()))
    if act is not None:
        lo, hi = max(lo, act[0]), min(hi, act[1])
    return lw.materialize(src, want, (lo, hi))


def lower_concat(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    ins = [lw.input_i8(node, i) for i in range(len(node.input))]
    if len(ins) > ekm.MAX_OP_INPUTS:
        raise LoweringError(f"{_where(node)} concatenates {len(ins)} tensors", "ekrt concatenates up to 8")
    want = want or (ins[0].q if all(t.q == ins[0].q for t in ins) else lw.want_or_fail(node, None))
    out_shape = lw.shape(node.output[0], node)
    axis = _attrs(node)["axis"] % len(out_shape)
    axis = NHWC.index(axis) if len(out_shape) == 4 else axis
    params = {0: axis}
    for k, t in enumerate(ins):
        params[1 + 2 * k], params[2 + 2 * k] = quantize_multiplier(t.q.scale / want.scale)
    out = lw.new_i8(out_shape, want)
    lw.op(ekm.CONCAT, [t.index for t in ins], out.index, params, node.name)
    return lw.requant(out, None, act, node.output[0])


def _pool_params(lw: Lowerer, node: onnx.NodeProto, x: QT, out_shape) -> dict[int, int]:
    a = _attrs(node)
    if len(x.shape) != 4:
        raise LoweringError(f"{_where(node)} is not 2-D", "ekrt runs 2-D pools only")
    kernel = tuple(a["kernel_shape"])
    strides = tuple(a.get("strides", (1, 1)))
    if tuple(a.get("dilations", (1, 1))) != (1, 1) or a.get("storage_order", 0):
        raise LoweringError(f"{_where(node)} has dilations or column-major storage", "ekrt pools have dilation 1")
    pads = _padding(lw, node, x.shape[2:], kernel, strides, (1, 1), out_shape[2:])
    return {0: kernel[0], 1: kernel[1], 2: strides[0], 3: strides[1], 6: pads[0], 7: pads[1], 8: pads[2], 9: pads[3]}


def lower_maxpool(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    if len(node.output) > 1 and node.output[1]:
        raise LoweringError(f"{_where(node)} returns indices", "ekrt's MaxPool returns values only")
    # max commutes with a monotone quantization: quantize first (float islands), then pool
    src = node.input[0]
    x = lw.materialize(src, want if src not in lw.alias else None, act if src not in lw.alias else None)
    out_shape = lw.shape(node.output[0], node)
    params = _pool_params(lw, node, x, out_shape)
    params.update({4: 1, 5: 1})
    out = lw.new_i8(out_shape, x.q)
    lw.op(ekm.MAXPOOL, [x.index], out.index, params, node.name)
    return lw.requant(out, want, act, node.output[0])


def lower_avgpool(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    want = lw.want_or_fail(node, want)
    x = lw.input_i8(node, 0)
    out_shape = lw.shape(node.output[0], node)
    out = lw.new_i8(out_shape, want)
    if node.op_type == "GlobalAveragePool":
        if len(x.shape) != 4:
            raise LoweringError(f"{_where(node)} is not 2-D", "ekrt runs 2-D pools only")
        hw = x.shape[2] * x.shape[3]
        m_, s_ = quantize_multiplier(x.q.scale / (want.scale * hw))
        lw.op(ekm.GLOBAL_AVGPOOL, [x.index], out.index, {0: m_, 1: s_}, node.name)
    else:
        params = _pool_params(lw, node, x, out_shape)
        params.update({4: 1, 5: 1, 10: int(_attrs(node).get("count_include_pad", 0))})
        params[13], params[14] = quantize_multiplier(x.q.scale / want.scale)
        lw.op(ekm.AVGPOOL, [x.index], out.index, params, node.name)
    return lw.requant(out, None, act, node.output[0])


def lower_reshape(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    src = node.input[0]
    if node.op_type == "Identity":
        return lw.materialize(src, want, act)
    x = lw.materialize(src, want if src not in lw.alias else None, act if src not in lw.alias else None)
    out_shape = lw.shape(node.output[0], node)
    if math.prod(out_shape) != math.prod(x.shape):
        raise LoweringError(f"{_where(node)}: {x.shape} -> {out_shape} changes the element count", "check the model")

    def same_bytes(shape) -> bool:  # NHWC order == NCHW order
        return len(shape) != 4 or shape[1] == 1 or shape[2] * shape[3] == 1

    if same_bytes(x.shape) and same_bytes(out_shape):
        order = 0
    elif len(x.shape) == 4 and len(out_shape) != 4:
        order = 1
    else:
        raise LoweringError(f"{_where(node)}: reshape {x.shape} -> {out_shape} mixes the channel and spatial axes of a 4-D tensor", "ekrt reshapes 4-D tensors only into 2-D/3-D ones (Flatten)")
    if len(out_shape) > ekm.MAX_RANK:
        raise LoweringError(f"{_where(node)} makes a rank-{len(out_shape)} tensor", "ekrt tensors have rank <= 4")
    out = lw.new_i8(out_shape, x.q)
    lw.op(ekm.RESHAPE, [x.index], out.index, {0: order}, node.name)
    return lw.requant(out, want, act, node.output[0])


def lower_transpose(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    src = node.input[0]
    x = lw.materialize(src, want if src not in lw.alias else None, act if src not in lw.alias else None)
    rank = len(x.shape)
    perm = list(_attrs(node).get("perm", range(rank - 1, -1, -1)))
    out_shape = lw.shape(node.output[0], node)
    if rank == 4:
        inv = np.argsort(NHWC)
        stored_perm = [int(inv[perm[NHWC[i]]]) for i in range(4)]
    else:
        stored_perm = perm
    out = lw.new_i8(out_shape, x.q)
    lw.op(ekm.TRANSPOSE, [x.index], out.index, dict(enumerate(stored_perm)), node.name)
    return lw.requant(out, want, act, node.output[0])


def _resize_index_ok(mode: str, ctm: str, nearest_mode: str, in_n: int, out_n: int, scale: float) -> bool:
    """Does the node's coordinate rule give the runtime's: floor(d * in / out) (nearest), or
    half_pixel (linear)?"""
    d = np.arange(out_n, dtype=np.float64)
    if mode == "linear":
        return ctm in ("half_pixel", "pytorch_half_pixel") and (ctm == "half_pixel" or out_n > 1) and abs(scale - out_n / in_n) < 1e-6
    if ctm == "asymmetric":
        orig = d / scale
    elif ctm == "half_pixel":
        orig = (d + 0.5) / scale - 0.5
    elif ctm == "align_corners":
        orig = d * (in_n - 1) / max(out_n - 1, 1)
    else:
        return False
    rounding = {
        "floor": np.floor, "ceil": np.ceil,
        "round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
    }.get(nearest_mode)
    if rounding is None:
        return False
    idx = np.clip(rounding(orig), 0, in_n - 1).astype(np.int64)
    return bool(np.array_equal(idx, (np.arange(out_n) * in_n) // out_n))


def lower_resize(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    a = _attrs(node)
    mode = _s(a.get("mode", "nearest"))
    ctm = _s(a.get("coordinate_transformation_mode", "half_pixel"))
    nearest_mode = _s(a.get("nearest_mode", "round_prefer_floor"))
    src = node.input[0]
    nearest = mode == "nearest"
    x = lw.materialize(src, want if nearest and src not in lw.alias else None, act if nearest and src not in lw.alias else None)
    out_shape = lw.shape(node.output[0], node)
    if len(x.shape) != 4 or out_shape[:2] != x.shape[:2]:
        raise LoweringError(f"{_where(node)} resizes {x.shape} -> {out_shape}", "ekrt resizes the H and W of 4-D tensors only")
    if mode not in ("nearest", "linear") or a.get("antialias", 0) or a.get("axes") is not None or _s(a.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        raise LoweringError(f"{_where(node)}: mode {mode}", "ekrt resizes nearest and (bi)linear only")
    scales = None
    if len(node.input) > 2 and node.input[2] and lw.is_const(node.input[2]) and lw.float_const(node.input[2]).size == 4:
        scales = lw.float_const(node.input[2]).reshape(4)[2:]
    for d in range(2):
        in_n, out_n = x.shape[2 + d], out_shape[2 + d]
        scale = float(scales[d]) if scales is not None else out_n / in_n
        if not _resize_index_ok(mode, ctm, nearest_mode, in_n, out_n, scale):
            raise LoweringError(f"{_where(node)}: coordinate mode {ctm}/{nearest_mode} with scale {scale:g}", "ekrt resizes nearest (asymmetric/floor or the same indices) and linear with half_pixel")
    out = lw.new_i8(out_shape, x.q)
    lw.op(ekm.RESIZE, [x.index], out.index, {0: 0 if nearest else 1}, node.name)
    return lw.requant(out, want, act, node.output[0])


def lower_softmax(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    x = lw.input_i8(node, 0)
    axis = _attrs(node).get("axis", -1 if lw.opset >= 13 else 1) % len(x.shape)
    if len(x.shape) != 2 or axis != 1:
        raise LoweringError(f"{_where(node)}: softmax over axis {axis} of a {x.shape} tensor", "ekrt runs softmax over the last axis of a 2-D tensor")
    out = lw.new_i8(x.shape, QParams(SOFTMAX_SCALE, SOFTMAX_ZP))
    lw.op(ekm.SOFTMAX, [x.index], out.index, {0: 1}, node.name)
    return lw.requant(out, want, act, node.output[0])


LOWERINGS: dict[str, Callable[[Lowerer, onnx.NodeProto, QParams | None, tuple | None], QT]] = {
    "Conv": lower_conv,
    "Gemm": lower_gemm,
    "MatMul": lower_gemm,
    "Add": lower_binary,
    "Mul": lower_binary,
    "Sub": lower_binary,
    "Div": lower_binary,
    "Pow": lower_binary,
    "Max": lower_binary,
    "Min": lower_binary,
    "Concat": lower_concat,
    "MaxPool": lower_maxpool,
    "AveragePool": lower_avgpool,
    "GlobalAveragePool": lower_avgpool,
    "Reshape": lower_reshape,
    "Flatten": lower_reshape,
    "Squeeze": lower_reshape,
    "Unsqueeze": lower_reshape,
    "Identity": lower_reshape,
    "Transpose": lower_transpose,
    "Resize": lower_resize,
    "Softmax": lower_softmax,
    "Relu": lower_relu_clip,
    "Clip": lower_relu_clip,
    **{op: lower_lut for op in ELEMENTWISE - {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Identity", "Relu", "Clip"}},
}
# Float nodes the planner may see that fold away (shape arithmetic on static shapes).
FOLDED = frozenset({"Shape", "Constant", "Gather", "Concat", "Unsqueeze", "Squeeze", "Cast", "Slice", "Range", "ConstantOfShape"})


# -- after the walk -------------------------------------------------------------------------


def _prune(m: ekm.EkmModel) -> dict[int, int]:
    """Drop ops nothing reads (an intermediate a table folded in) and the tensors only they used;
    returns old tensor index -> new, for the tensors that stay."""
    used = {t for t, _ in m.outputs}
    keep = []
    for op in reversed(m.ops):
        if op.outputs[0] in used:
            keep.append(op)
            used.update(op.inputs)
    m.ops = keep[::-1]
    live = sorted(used | {t for t, _ in m.inputs})
    remap = {old: new for new, old in enumerate(live)}
    m.tensors = [m.tensors[i] for i in live]
    for op in m.ops:
        op.inputs = [remap[i] for i in op.inputs]
        op.outputs = [remap[i] for i in op.outputs]
    m.inputs = [(remap[t], n) for t, n in m.inputs]
    m.outputs = [(remap[t], n) for t, n in m.outputs]
    return remap


def _flatten_fc_inputs(m: ekm.EkmModel) -> None:
    """A Flatten of a 4-D NHWC tensor that only feeds fully connected layers needs no reorder:
    permute the weights' columns to NHWC order instead and keep the bytes (order 0)."""
    users: dict[int, list[ekm.Op]] = {}
    for op in m.ops:
        for i in op.inputs:
            users.setdefault(i, []).append(op)
    for op in m.ops:
        if op.type != ekm.RESHAPE or op.params[0] != 1:
            continue
        out = op.outputs[0]
        fcs = users.get(out, [])
        if not fcs or any(u.type != ekm.FULLY_CONNECTED or u.inputs[0] != out for u in fcs):
            continue
        n, h, w, c = m.tensors[op.inputs[0]].dims
        # NHWC flat index j holds the NCHW flat index perm[j]
        perm = np.arange(n * c * h * w).reshape(n, c, h, w).transpose(NHWC).reshape(-1)
        for fc in fcs:
            wt = m.tensors[fc.inputs[1]]
            wt.data = np.ascontiguousarray(wt.data[:, perm])
        op.params[0] = 0


def plan_memory(m: ekm.EkmModel) -> int:
    """Arena offsets for every arena tensor: lifetimes from the op order, greedy by size,
    64-byte aligned, reusing the space of tensors that are dead. Returns the arena size."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for j, op in enumerate(m.ops):
        for t in op.outputs:
            first.setdefault(t, j)
            last[t] = max(last.get(t, j), j)
        for t in op.inputs:
            last[t] = j
    arena = [i for i, t in enumerate(m.tensors) if t.storage == ekm.ARENA]
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    size = 0
    for i in sorted(arena, key=lambda i: (-m.tensors[i].nbytes, first.get(i, 0))):
        t = m.tensors[i]
        lo, hi = first.get(i, 0), last.get(i, first.get(i, 0))
        live = sorted((o, e) for o, e, f, la in placed if not (la < lo or f > hi))
        offset = 0
        for o, e in live:
            if offset + t.nbytes <= o:
                break
            offset = max(offset, ekm.align(e))
        t.offset = offset
        placed.append((offset, offset + t.nbytes, lo, hi))
        size = max(size, ekm.align(offset + t.nbytes))
    m.arena_size = size
    return size


# -- entry points -----------------------------------------------------------------------------


def lower(model: onnx.ModelProto) -> tuple[ekm.EkmModel, LowerReport]:
    """Lower a QDQ ONNX model; LoweringError names the first node ekrt cannot run."""
    lw = Lowerer(model)
    m = lw.run()
    return m, lw.report


def lower_file(onnx_path: str | Path, ekm_path: str | Path) -> LowerReport:
    """QDQ ``.onnx`` -> ``.ekm`` (written atomically)."""
    model = onnx.load(str(onnx_path))
    m, report = lower(model)
    ekm.save(m, ekm_path)
    return report


_verdicts: dict[str, str | None] = {}


def check_lowerable(loaded) -> str | None:
    """None when ekrt can run ``loaded`` quantized with the native scheme, else why not (naming
    the node). Lowers the QDQ graph built with placeholder ranges: no calibration needed."""
    from edgekit.quantize import analyze_model
    from edgekit.quantize.rewrite import rewrite, tensor_params
    from edgekit.quantize.scheme import NATIVE

    key = loaded.sha256 + repr([(i.name, tuple(i.shape)) for i in loaded.inputs])
    if key not in _verdicts:
        prepared, analysis = analyze_model(loaded, NATIVE)
        ranges = {t: (-1.0, 1.0) for t in analysis.calibrated}
        qmodel = rewrite(prepared, analysis, tensor_params(analysis, ranges, NATIVE), NATIVE)
        try:
            lower(qmodel)
            _verdicts[key] = None
        except LoweringError as exc:
            _verdicts[key] = exc.message
    return _verdicts[key]


__all__ = ["LOWERINGS", "LowerReport", "LoweringError", "check_lowerable", "lower", "lower_file", "plan_memory", "stored"]
