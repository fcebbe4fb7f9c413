"""The graph walk: one ``Lowerer`` per model holds the lowering's state (tensors, aliases, memo)
and turns each QuantizeLinear'd float tensor into an int8 tensor of the runtime, asking the
op registry (``ops.LOWERINGS``) for the node that produces it."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgekit.errors import ModelError
from edgekit.quantize import qmath
from edgekit.targets.native import ekm
from edgekit.targets.native.lower.passes import NHWC, flatten_fc_inputs, plan_memory, prune
from edgekit.targets.native.requant import quantize_multiplier

ADD_LEFT_SHIFT = 20
SOFTMAX_SCALE, SOFTMAX_ZP = 1.0 / 256.0, -128
FLOAT_CONST_MAX = 1 << 22  # elements: larger constant folds are not worth it


class LoweringError(ModelError):
    """A node ekrt cannot run; the message names it. ``node`` is that node (when known);
    ``blocked``: it only failed because an input could not be lowered (coverage counts the cause once)."""

    node: onnx.NodeProto | None = None
    blocked: bool = False


@dataclass(frozen=True)
class QParams:
    scale: float
    zp: int


@dataclass
class QT:
    """An int8 tensor of the runtime: its index in the .ekm, its logical (ONNX) shape, its params.

    A tensor of rank > 4 (a Reshape/Transpose chain's middle) is a view: ``index`` -1, ``view`` the
    element of a real tensor's stored bytes each of its elements is (movement.py realizes it)."""

    index: int
    shape: tuple[int, ...]
    q: QParams
    view: tuple[int, np.ndarray] | None = None  # (real tensor index, stored flat index per element)


@dataclass
class FT:
    """A float32 tensor of a float island: its index in the .ekm and its logical (ONNX) shape,
    which is also how it is stored (a 4-D float tensor stays NCHW)."""

    index: int
    shape: tuple[int, ...]


# A float op's lowering: (lowerer, node) -> the float tensor of the output asked for (lw.asked)
FloatLowering = Callable[["Lowerer", onnx.NodeProto], "FT"]


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
    op_names: list[str] = field(default_factory=list)  # op j of the .ekm came from ONNX node op_names[j]

    def to_dict(self) -> dict:
        return {"ops": self.ops, "arena_bytes": self.arena_bytes, "const_bytes": self.const_bytes}


def stored(shape: tuple[int, ...]) -> tuple[int, ...]:
    """How the runtime stores a logical shape: 4-D as NHWC, the rest as is."""
    return tuple(shape[i] for i in NHWC) if len(shape) == 4 else tuple(shape)


def channel_vector(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """Does ``shape`` broadcast as one value per channel (the NHWC innermost axis)?"""
    if len(out_shape) == 4:
        full = (1,) * (4 - len(shape)) + tuple(shape)
        return full[0] == 1 and full[2] == 1 and full[3] == 1 and full[1] == out_shape[1]
    full = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return all(d == 1 for d in full[:-1]) and full[-1] == out_shape[-1]


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def where(node: onnx.NodeProto) -> str:
    return f"{node.op_type} node '{node.name}'"


# ---------------------------------------------------------------------------------------------


# An op's lowering: (lowerer, node, wanted output params or None, clamp or None) -> its int8 tensor
Lowering = Callable[["Lowerer", onnx.NodeProto, "QParams | None", "tuple | None"], "QT"]


class Lowerer:
    """One lowering of one QDQ model; ``run()`` returns the EkmModel."""

    def __init__(self, model: onnx.ModelProto, lowerings: dict[str, Lowering], collect: bool = False,
                 float_lowerings: dict[str, FloatLowering] | None = None) -> None:
        try:
            model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception as exc:  # shape inference raises several types; name the problem
            raise LoweringError(f"ONNX shape inference failed on the quantized model: {exc}", "check the model with onnx.checker") from None
        self.model = model
        self.lowerings = lowerings
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        g = model.graph
        self.shapes: dict[str, tuple[int, ...]] = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            dims = vi.type.tensor_type.shape.dim
            if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
                self.shapes[vi.name] = tuple(d.dim_value for d in dims)
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.qconsts: dict[str, QConst] = {}
        self.producer: dict[str, onnx.NodeProto] = {o: node for node in g.node for o in node.output}
        self.graph_inputs = {i.name for i in g.input if i.name not in self.consts}
        self.m = ekm.EkmModel()
        self.alias: dict[str, QT] = {}  # ONNX tensor -> runtime int8 tensor holding it exactly
        self.io: dict[str, int] = {}
        self.memo: dict[tuple, QT] = {}
        self.report = LowerReport()
        self.asked = ""  # the output a lowering function is called for (Split has several)
        # coverage: with ``collect``, a node that cannot be lowered is recorded and the walk goes on
        self.collect = collect
        self.failures: list[tuple[onnx.NodeProto | None, str]] = []
        self.failed: set[str] = set()  # tensors that could not be lowered
        self.lowered: set[str] = set()  # nodes run as integer ops
        self.tabled: set[str] = set()  # float nodes run as int8 tables (LUT, LUT_CHANNEL)
        self.folded: set[str] = set()  # constant and shape arithmetic, done at lowering time
        # float islands: a node with no int8 lowering runs in float32 between DEQUANTIZE and QUANTIZE
        self.float_lowerings = float_lowerings or {}
        self.floats: dict[str, FT] = {}  # ONNX tensor -> its float32 tensor in the runtime
        self.dequantized: dict[int, FT] = {}  # int8 tensor index -> its DEQUANTIZE
        self.islands: dict[str, tuple[str, str]] = {}  # node name -> (op type, why it runs in float)

    # -- tensors --------------------------------------------------------------------------

    def shape(self, name: str, node: onnx.NodeProto | None = None) -> tuple[int, ...]:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        if name in self.alias:
            return self.alias[name].shape
        if name not in self.shapes and name in self.producer:
            self._infer_shape(self.producer[name])
        if name not in self.shapes:
            at = f" ({where(node)})" if node is not None else ""
            raise LoweringError(f"tensor '{name}'{at} has no static shape", "give the model's input shapes (--shape NAME=1,3,224,224)")
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
        if min(inputs, default=0) < 0:
            raise LoweringError(f"node '{name}' reads a tensor of rank > {ekm.MAX_RANK}",
                                f"ekrt tensors have rank <= {ekm.MAX_RANK}; a higher rank may only appear inside a Reshape/Transpose/Squeeze/Unsqueeze chain")
        self.m.add_op(type_, inputs, [output], params, name)

    # -- the walk ---------------------------------------------------------------------------

    def run(self) -> ekm.EkmModel:
        g = self.model.graph
        for node in g.node:
            if node.op_type == "Constant":
                self.consts[node.output[0]] = numpy_helper.to_array(attrs(node)["value"])
            elif node.op_type == "DequantizeLinear":
                if node.input[0] in self.failed:
                    self.failed.add(node.output[0])
                else:
                    self._dequantize(node)
            elif node.op_type == "QuantizeLinear":
                self._collecting(node, self._quantize)
            elif node.op_type == "Shape" or (node.input and all((not i) or self.is_const(i) for i in node.input)):
                self._fold(node)
                self.folded.add(node.name)
        for i, inp in enumerate(g.input):
            if inp.name in self.graph_inputs and inp.name not in self.io:
                raise LoweringError(
                    f"graph input '{inp.name}' does not go through a QuantizeLinear",
                    "quantize the model with edgekit (the native scheme) so every input is quantized",
                ) if any(inp.name in node.input for node in g.node) else LoweringError(
                    f"graph input {i} '{inp.name}' is unused", "remove it from the model")
        for out in g.output:
            qt = self.alias.get(out.name) or self._collecting(out, lambda o: self.output_value(o.name))
            if qt is None:
                continue
            shape = self.shape(out.name)
            if len(shape) > ekm.MAX_RANK:
                raise LoweringError(f"graph output '{out.name}' has rank {len(shape)}", "ekrt tensors have rank <= 4")
            io = self.m.add_tensor(ekm.Tensor(ekm.F32, ekm.IO, shape, name=out.name))
            if isinstance(qt, FT):  # an island's value: copied out as it is
                self.op(ekm.RESHAPE, [qt.index], io, {0: 0}, name=f"{out.name}__out")
            else:
                self.op(ekm.DEQUANTIZE, [qt.index], io, {0: int(len(shape) == 4)}, name=f"{out.name}__DQ")
            self.m.outputs.append((io, out.name))
        if self.failures:
            return self.m  # coverage only: the model is incomplete
        self.m.inputs.sort(key=lambda io_name: [i.name for i in g.input].index(io_name[1]))
        remap = prune(self.m)
        self.alias = {k: QT(remap[v.index], v.shape, v.q) for k, v in self.alias.items() if v.index in remap}
        self.report.ops = dict(Counter(op.type_name for op in self.m.ops))
        self.report.op_names = [op.name or f"{op.type_name}#{j}" for j, op in enumerate(self.m.ops)]
        flatten_fc_inputs(self.m)
        self.report.arena_bytes = plan_memory(self.m)
        return self.m

    def _collecting(self, where_, fn):
        """fn(where_); with ``collect``, a LoweringError is recorded (once, at the node that caused
        it) and the tensor marked failed instead of ending the walk."""
        try:
            return fn(where_)
        except LoweringError as exc:
            if not self.collect:
                raise
            self.failed.update(getattr(where_, "output", [getattr(where_, "name", "")]))
            if not exc.blocked and (exc.node is None or all(exc.node is not n for n, _ in self.failures)):
                self.failures.append((exc.node, exc.message))
            return None

    def _fold(self, node: onnx.NodeProto) -> None:
        if node.op_type == "Shape":  # a static shape, whether or not the tensor is constant
            a = attrs(node)
            shape = np.array(self.shape(node.input[0], node), dtype=np.int64)
            self.consts[node.output[0]] = shape[a.get("start", 0):a.get("end", None)]
            return
        from onnx.reference import ReferenceEvaluator

        feeds = {i: self.float_const(i) if i in self.qconsts else self.consts[i] for i in node.input if i}
        inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in feeds.items()]
        outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output]
        gm = helper.make_graph([node], "fold", [], outs, inits)
        mm = helper.make_model(gm, opset_imports=self.model.opset_import)
        try:
            results = ReferenceEvaluator(mm).run(None, {})
        except Exception as exc:
            raise LoweringError(f"cannot fold the constant {where(node)}: {exc}", "simplify the model (onnxsim) first") from None
        for o, r in zip(node.output, results):
            r = np.asarray(r)
            if r.size > FLOAT_CONST_MAX:
                raise LoweringError(f"{where(node)} makes a constant of {r.size} elements", "simplify the model first")
            self.consts[o] = r

    def _dequantize(self, node: onnx.NodeProto) -> None:
        x = node.input[0]
        if x in self.consts:
            scale = self.consts[node.input[1]].astype(np.float32)
            zp = self.consts[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros_like(self.consts[x], shape=scale.shape)
            self.qconsts[node.output[0]] = QConst(self.consts[x], scale, np.asarray(zp), attrs(node).get("axis", 1))
            return
        if x not in self.alias:
            raise LoweringError(f"{where(node)} reads '{x}', which is not an int8 tensor of this graph", "int8 graph inputs are not supported")
        self.alias[node.output[0]] = self.alias[x]

    def _quantize(self, node: onnx.NodeProto) -> None:
        x = node.input[0]
        q = self.qparams(node)
        if x in self.consts:
            self.consts[node.output[0]] = qmath.quantize(self.consts[x], q.scale, q.zp, "int8")
            return
        self.alias[node.output[0]] = self.quantized_input(x, q, node.name) if x in self.graph_inputs else self.materialize(x, q)

    def quantized_input(self, x: str, q: QParams, name: str = "") -> QT:
        """Graph input ``x`` quantized with ``q`` (one QUANTIZE per params)."""
        key = (x, q, None)
        if key in self.memo:
            return self.memo[key]
        io = self.quantized_input_io(x)
        out = self.new_i8(self.shape(x), q)
        self.op(ekm.QUANTIZE, [io], out.index, {0: int(len(out.shape) == 4)}, name=name or f"{x}__Q")
        self.memo[key] = out
        return out

    def quantized_input_io(self, x: str) -> int:
        if x not in self.io:
            shape = self.shape(x)
            if len(shape) > ekm.MAX_RANK:
                raise LoweringError(f"graph input '{x}' has rank {len(shape)}", "ekrt tensors have rank <= 4")
            self.io[x] = self.m.add_tensor(ekm.Tensor(ekm.F32, ekm.IO, shape, name=x))
            self.m.inputs.append((self.io[x], x))
        return self.io[x]

    def qparams(self, node: onnx.NodeProto) -> QParams:
        scale = self.consts.get(node.input[1])
        zp = self.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
        if scale is None or zp is None or scale.size != 1 or zp.size != 1:
            raise LoweringError(f"{where(node)} is not per-tensor with constant scale and zero point", "quantize with edgekit (per-tensor activations)")
        if zp.dtype != np.int8:
            raise LoweringError(f"{where(node)} quantizes to {zp.dtype}, ekrt runs int8 activations", "quantize with the native scheme (int8 activations)")
        s = float(np.float32(scale.reshape(())))
        if not (s > 0 and math.isfinite(s)):
            raise LoweringError(f"{where(node)} has scale {s}", "scales must be positive")
        return QParams(s, int(zp.reshape(())))

    # -- float tensors become int8 on demand ---------------------------------------------------

    def _not_failed(self, name: str) -> None:
        """A tensor whose producer could not be lowered blocks every reader (coverage: "not reached")."""
        if name in self.failed:
            exc = LoweringError(f"tensor '{name}' could not be lowered", "see the node that produces it")
            exc.blocked = True
            raise exc

    def materialize(self, name: str, want: QParams | None, act: tuple[float, float] | None = None) -> QT:
        """The int8 tensor holding float tensor ``name`` quantized with ``want`` (None: the op's
        natural params), clamped to the real range ``act``."""
        key = (name, want, act)
        if key in self.memo:
            return self.memo[key]
        self._not_failed(name)
        if name in self.alias:
            qt = self.requant(self.alias[name], want, act, name)
        elif name in self.graph_inputs and want is not None:  # e.g. input -> Pad -> Q: quantize first
            qt = self.requant(self.quantized_input(name, want), None, act, name)
        else:
            node = self.producer.get(name)
            if node is None:
                raise LoweringError(f"tensor '{name}' is neither produced by a node nor an int8 tensor", "check the model")
            fn = self.lowerings.get(node.op_type)
            try:
                if fn is None:
                    raise LoweringError(f"{where(node)}: ekrt has no {node.op_type}", f"ekrt runs: {', '.join(sorted(self.lowerings))}; deploy with another backend (--backend onnxruntime)")
                self.asked = name
                qt = fn(self, node, want, act)
            except LoweringError as exc:
                exc.node = exc.node or node  # the innermost node names the cause
                if exc.blocked or want is None or not self.float_lowerings:
                    raise
                qt = self.island(node, name, want, act, exc)
            else:
                self.lowered.add(node.name)
        self.memo[key] = qt
        return qt

    # -- float islands ----------------------------------------------------------------------

    def island(self, node: onnx.NodeProto, name: str, want: QParams, act, exc: LoweringError) -> QT:
        """Float tensor ``name`` computed in float32 (its producer ``node`` has no int8 lowering:
        ``exc`` says why), then quantized with ``want`` for its int8 consumers."""
        ft = self.island_value(node, name, exc)
        out = self.new_i8(ft.shape, want)
        self.op(ekm.QUANTIZE, [ft.index], out.index, {0: int(len(ft.shape) == 4)}, name=f"{name}__Q")
        return self.requant(out, None, act, name)

    def island_value(self, node: onnx.NodeProto, name: str, exc: LoweringError) -> FT:
        self.islands.setdefault(node.name, (node.op_type, exc.message))
        try:
            return self.float_value(name)
        except LoweringError as fexc:
            self.islands.pop(node.name, None)
            err = LoweringError(f"{exc.message}; nor as float: {fexc.message}", fexc.hint)
            err.node, err.blocked = fexc.node or node, fexc.blocked
            raise err from None

    def float_value(self, name: str) -> FT:
        """Float tensor ``name`` as a float32 tensor of the runtime: an int8 tensor dequantized, a
        graph input or a constant as is, else its producer run as a float op (part of an island)."""
        if name in self.floats:
            return self.floats[name]
        self._not_failed(name)
        if name in self.alias:
            ft = self.dequantize_value(self.alias[name], name)
        elif name in self.graph_inputs:
            ft = FT(self.quantized_input_io(name), self.shape(name))
        elif self.is_const(name):
            v = self.float_const(name)
            ft = FT(self.const(ekm.F32, v, name), tuple(v.shape))
        else:
            node = self.producer.get(name)
            if node is None:
                raise LoweringError(f"tensor '{name}' is neither produced by a node nor an input", "check the model")
            fn = self.float_lowerings.get(node.op_type)
            if fn is None:
                exc = LoweringError(f"{where(node)}: ekrt has no {node.op_type}, in int8 or in float",
                                    f"ekrt runs in float: {', '.join(sorted(self.float_lowerings))}; deploy with another backend (--backend onnxruntime)")
                exc.node = node
                raise exc
            self.asked = name
            try:
                ft = fn(self, node)
            except LoweringError as exc:
                exc.node = exc.node or node
                raise
            self.islands.setdefault(node.name, (node.op_type, f"its output '{name}' is not quantized: it stays float inside a float island"))
        if len(ft.shape) > ekm.MAX_RANK:
            raise LoweringError(f"float tensor '{name}' has rank {len(ft.shape)}", f"ekrt's float islands hold tensors of rank <= {ekm.MAX_RANK}")
        self.floats[name] = ft
        return ft

    def dequantize_value(self, qt: QT, name: str) -> FT:
        if qt.view is not None:
            raise LoweringError(f"tensor '{name}' is a rank-{len(qt.shape)} view", f"ekrt's float islands read tensors of rank <= {ekm.MAX_RANK}")
        if qt.index not in self.dequantized:
            ft = self.new_f32(qt.shape)
            self.op(ekm.DEQUANTIZE, [qt.index], ft.index, {0: int(len(qt.shape) == 4)}, name=f"{name}__DQ")
            self.dequantized[qt.index] = ft
        return self.dequantized[qt.index]

    def new_f32(self, shape: tuple[int, ...]) -> FT:
        return FT(self.m.add_tensor(ekm.Tensor(ekm.F32, ekm.ARENA, tuple(shape))), tuple(shape))

    def output_value(self, name: str) -> QT | FT:
        """A graph output: int8 (dequantized into the output) where it lowers, else float."""
        try:
            return self.materialize(name, None)
        except LoweringError as exc:
            node = self.producer.get(name)
            if exc.blocked or not self.float_lowerings or node is None:
                raise
            return self.island_value(node, name, exc)

    def input_i8(self, node: onnx.NodeProto, i: int) -> QT:
        """Input ``i`` of an integer op: an int8 tensor (a DequantizeLinear output)."""
        name = node.input[i]
        if name in self.alias:
            return self.alias[name]
        if self.is_const(name):
            raise LoweringError(f"{where(node)}: input {i} is a constant where ekrt wants an int8 activation", "keep that input an activation")
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
        try:
            mults, shifts = zip(*(quantize_multiplier(float(r)) for r in np.atleast_1d(real)))
        except ValueError as exc:  # scales int8 cannot bridge (weights or ranges far apart): not an int8 node
            raise LoweringError(f"its requantization is out of ekrt's range: {exc}", "the node runs in float, or deploy with another backend") from None
        return self.const(ekm.I32, np.array(mults, np.int32)), self.const(ekm.I32, np.array(shifts, np.int32))

    def want_or_fail(self, node: onnx.NodeProto, want: QParams | None) -> QParams:
        if want is None:
            raise LoweringError(
                f"{where(node)}: its output '{node.output[0]}' stays float (no QuantizeLinear after it)",
                "quantize the model with edgekit's native scheme, or deploy with another backend",
            )
        return want


