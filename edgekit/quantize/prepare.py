"""Float-graph clean-up before quantization: the model keeps its function, loses its noise.

Steps: opset to >= 13 (per-channel Q/DQ), static input shapes, Constant nodes to initializers,
constant folding (including Shape of static tensors, so shape arithmetic disappears),
BatchNormalization folded into the preceding Conv, dead nodes and initializers removed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter
from onnx.reference import ReferenceEvaluator

from edgekit.errors import ModelError
from edgekit.modelio import IOSpec, onnx_opset, with_static_inputs

# Never evaluated at prepare time: their result is not a function of their inputs alone.
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
_QDQ = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"}
# Folding a constant larger than this (elements) would bloat the model (e.g. ConstantOfShape).
_MAX_FOLD_ELEMENTS = 1 << 24


def prepare(model: onnx.ModelProto, inputs: tuple[IOSpec, ...], min_opset: int = 13, *, fix_inputs: bool = True) -> onnx.ModelProto:
    """``fix_inputs=False`` keeps the graph inputs' dynamic dimensions: only shape arithmetic that
    is static in the model itself is folded (the int8 model a user takes away; see
    ``quantize.with_dynamic_inputs``)."""
    quantized = sorted({n.op_type for n in model.graph.node} & _QDQ)
    if quantized:
        raise ModelError(
            f"model is already quantized (has {', '.join(quantized)} nodes)",
            "deploy it as it is with --no-quantize",
        )
    m = _upgrade_opset(model, min_opset)
    m = with_static_inputs(m, inputs) if fix_inputs else _inferred(m)
    _constants_to_initializers(m)
    _fold_constants(m)
    _fold_batchnorm(m)
    _remove_dead(m)
    m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    return checked(m, "graph preparation produced an invalid model", "report this with the model attached")


def checked(model: onnx.ModelProto, problem: str, hint: str) -> onnx.ModelProto:
    """``model`` once onnx.checker passes it; else ModelError: ``problem``, the checker's words, ``hint``."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:  # pragma: no cover - a bug in the passes that made it
        raise ModelError(f"{problem}: {exc}", hint) from exc
    return model


def _inferred(m: onnx.ModelProto) -> onnx.ModelProto:
    del m.graph.value_info[:]  # the exporter's shapes: what inference cannot show is not static
    try:
        return onnx.shape_inference.infer_shapes(m, data_prop=True)
    except onnx.shape_inference.InferenceError:
        return m


def _upgrade_opset(model: onnx.ModelProto, min_opset: int) -> onnx.ModelProto:
    if onnx_opset(model) >= min_opset:
        m = onnx.ModelProto()
        m.CopyFrom(model)
        return m
    try:
        return version_converter.convert_version(model, min_opset)
    except Exception as exc:
        raise ModelError(
            f"could not upgrade the model from opset {onnx_opset(model)} to {min_opset} (needed for per-channel int8): {exc}",
            f"re-export the model with opset >= {min_opset}",
        ) from exc


# The Constant attributes that become an initializer, and their dtype (None: a tensor's own).
_CONSTANT_DTYPES = {"value": None, "value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}


def _constants_to_initializers(m: onnx.ModelProto) -> None:
    keep = []
    for node in m.graph.node:
        attr = node.attribute[0] if node.op_type == "Constant" and len(node.attribute) == 1 else None
        if attr is None or attr.name not in _CONSTANT_DTYPES:
            keep.append(node)
        elif attr.name == "value":
            m.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(attr.t), node.output[0]))
        else:
            value = np.array(helper.get_attribute_value(attr), dtype=_CONSTANT_DTYPES[attr.name])
            m.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
    _set_nodes(m, keep)


def _static_shapes(m: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if all(d is not None for d in dims):
                shapes[vi.name] = tuple(dims)
    return shapes


def _fold_constants(m: onnx.ModelProto) -> None:
    consts = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    shapes = _static_shapes(m)
    keep = []
    for node in m.graph.node:
        ins = [i for i in node.input if i]
        if node.op_type == "Shape" and ins and ins[0] in shapes and ins[0] not in consts:
            shape = np.array(shapes[ins[0]], dtype=np.int64)
            start = next((a.i for a in node.attribute if a.name == "start"), 0)
            end = next((a.i for a in node.attribute if a.name == "end"), None)
            consts[node.output[0]] = shape[start:end]
            continue
        foldable = (
            ins
            and all(i in consts for i in ins)
            and node.op_type not in _NONDETERMINISTIC
            and node.domain in ("", "ai.onnx")
            and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        )
        if foldable:
            try:
                results = ReferenceEvaluator(node).run(None, {i: consts[i] for i in ins})
            except Exception:
                results = None
            if results is not None and all(np.asarray(r).size <= _MAX_FOLD_ELEMENTS for r in results):
                for name, value in zip(node.output, results):
                    consts[name] = np.asarray(value)
                continue
        keep.append(node)
    _set_nodes(m, keep)  # unchanged when nothing folded: every constant is an initializer already
    used = {i for n in keep for i in reads(n)} | {o.name for o in m.graph.output}
    existing = {t.name for t in m.graph.initializer}
    for name, value in consts.items():
        if name in used and name not in existing:
            m.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))


def _fold_batchnorm(m: onnx.ModelProto) -> None:
    inits = {t.name: t for t in m.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in m.graph.node:
        for i in reads(node):
            consumers.setdefault(i, []).append(node)
    outputs = {o.name for o in m.graph.output}
    producer = {o: n for n in m.graph.node for o in n.output}
    removed: set[int] = set()
    for bn in m.graph.node:
        if bn.op_type != "BatchNormalization" or any(bn.output[1:]):  # training-mode outputs in use
            continue
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or len(consumers.get(conv.output[0], [])) != 1:
            continue
        if conv.output[0] in outputs or not all(n in inits for n in bn.input[1:5]) or conv.input[1] not in inits:
            continue
        bias = conv.input[2] if len(conv.input) > 2 else ""
        if bias and bias not in inits:
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        gamma, beta, mean, var = (numpy_helper.to_array(inits[n]).astype(np.float64) for n in bn.input[1:5])
        w = numpy_helper.to_array(inits[conv.input[1]]).astype(np.float64)
        b = numpy_helper.to_array(inits[bias]).astype(np.float64) if bias else np.zeros(w.shape[0])
        factor = gamma / np.sqrt(var + eps)
        w_new = (w * factor.reshape(-1, *([1] * (w.ndim - 1)))).astype(np.float32)
        b_new = ((b - mean) * factor + beta).astype(np.float32)
        w_name, b_name = f"{conv.name or conv.output[0]}__w_bnfolded", f"{conv.name or conv.output[0]}__b_bnfolded"
        m.graph.initializer.extend([numpy_helper.from_array(w_new, w_name), numpy_helper.from_array(b_new, b_name)])
        del conv.input[1:]
        conv.input.extend([w_name, b_name])
        conv.output[0] = bn.output[0]  # the Conv now produces what the BN produced
        removed.add(id(bn))
    if removed:
        _set_nodes(m, [n for n in m.graph.node if id(n) not in removed])


def reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor ``node`` reads: its inputs, and the outer-scope names its subgraphs (If/Loop/Scan
    branches and bodies) use, which are not listed as inputs."""
    names = [i for i in node.input if i]
    for attr in node.attribute:
        for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            local = {i.name for i in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
            names += [i for n in g.node for i in reads(n) if i not in local]
    return names


def _remove_dead(m: onnx.ModelProto) -> None:
    needed = {o.name for o in m.graph.output}
    live = []
    for node in reversed(list(m.graph.node)):
        if any(o in needed for o in node.output if o):
            live.append(node)
            needed.update(reads(node))
    live.reverse()
    _set_nodes(m, live)
    inits = [t for t in m.graph.initializer if t.name in needed]
    del m.graph.initializer[:]
    m.graph.initializer.extend(inits)
    # Initializers listed as graph inputs (old exporters) are not inputs a user feeds.
    init_names = {t.name for t in inits}
    real_inputs = [i for i in m.graph.input if i.name not in init_names]
    del m.graph.input[:]
    m.graph.input.extend(real_inputs)
    del m.graph.value_info[:]


def _set_nodes(m: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> None:
    copies = []
    for n in nodes:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        copies.append(c)
    del m.graph.node[:]
    m.graph.node.extend(copies)
