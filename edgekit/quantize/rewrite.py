"""Decide which nodes and tensors become int8 (analyze) and write the QDQ graph (rewrite)."""

from __future__ import annotations

import difflib
import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgekit.errors import UsageError
from edgekit.quantize import qmath
from edgekit.quantize.prepare import reads
from edgekit.quantize.rules import RULES, NodeRule, RuleContext, passthrough_rule
from edgekit.quantize.scheme import FUSED_ACTIVATIONS, QuantScheme, weight_qmax_of


@dataclass(frozen=True)
class NodeDecision:
    name: str
    op_type: str
    kind: str  # "int8" | "passthrough" | "fused" | "float"
    reason: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "op": self.op_type, "kind": self.kind, "reason": self.reason}


@dataclass
class Analysis:
    decisions: list[NodeDecision]
    rules: dict[str, NodeRule]  # node name -> rule, for int8 and passthrough nodes
    tensors: dict[str, tuple]  # tensor -> ("own",) | ("const",) | ("same", source tensor)
    consts: dict[str, np.ndarray] = field(repr=False, default_factory=dict)
    # weight -> its int8 values where they are not round-to-nearest at qmath.weight_params'
    # scales (``+gptq``: quantize.rounding); the scales stay those
    rounded: dict[str, np.ndarray] = field(repr=False, default_factory=dict)

    @property
    def float_nodes(self) -> list[NodeDecision]:
        return [d for d in self.decisions if d.kind == "float"]

    @property
    def calibrated(self) -> list[str]:
        return [t for t, src in self.tensors.items() if src[0] == "own"]

    def weight_q(self, name: str, s: np.ndarray, z: np.ndarray, axis: int | None) -> np.ndarray:
        """Weight ``name``'s int8 values at its scale ``s`` and zero point ``z``
        (``qmath.weight_params``): ``rounded``'s, else round-to-nearest."""
        w = self.consts[name]
        if name in self.rounded and self.rounded[name].shape == w.shape:
            return self.rounded[name]
        return qmath.quantize(w, s, z, "int8", axis)

    def root(self, t: str) -> str:
        """The tensor whose int8 scale ``t`` carries (itself, or a pass-through's source)."""
        while self.tensors.get(t, ("",))[0] == "same":
            t = self.tensors[t][1]
        return t

    def summary(self) -> dict:
        return dict(Counter(d.kind for d in self.decisions))


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every node a unique, stable name (exclusions and reports refer to them)."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        node.name = name
        seen.add(name)


def consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Tensor -> the nodes that take it as an input, in graph order."""
    found: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for i in node.input:
            found.setdefault(i, []).append(node)
    return found


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    types = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in model.graph.initializer:
        types[t.name] = t.data_type
    return types


def check_exclude(model: onnx.ModelProto, exclude: Sequence[str]) -> None:
    """Name ``model``'s nodes (``name_nodes``) and refuse an ``--exclude`` that names none of them."""
    name_nodes(model)
    names = [n.name for n in model.graph.node]
    for ex in exclude:
        if ex not in names:
            close = difflib.get_close_matches(ex, names, n=3)
            raise UsageError(
                f"--exclude names no node called '{ex}'",
                f"did you mean {', '.join(close)}?" if close else "see the node names with `edgekit plan MODEL --json`",
            )


def drop_unused_initializers(g: onnx.GraphProto) -> None:
    """Drop the initializers no node reads any more (the float weights of what is now int8)."""
    used = {i for n in g.node for i in reads(n)}  # If/Loop bodies read outer names too
    outputs = {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used or t.name in outputs]
    del g.initializer[:]
    g.initializer.extend(keep)


def analyze(model: onnx.ModelProto, scheme: QuantScheme, exclude: Sequence[str] = ()) -> Analysis:
    """Classify every node of a prepared float model; no calibration needed."""
    check_exclude(model, exclude)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ctx = RuleContext(consts=consts, elem_types=_elem_types(model), scheme=scheme)
    readers = consumers(model)
    graph_outputs = {o.name for o in model.graph.output}

    def fused_output(tensor: str) -> tuple[str, list[str]]:
        """Follow sole-consumer Relu/Clip chains: the Q goes after them."""
        fused = []
        while tensor not in graph_outputs:
            cons = readers.get(tensor, [])
            if len(cons) != 1 or cons[0].op_type not in FUSED_ACTIVATIONS or cons[0].name in exclude:
                break
            act = cons[0]
            if act.op_type == "Clip" and not all(ctx.is_const(i) for i in act.input[1:] if i):
                break
            fused.append(act.name)
            tensor = act.output[0]
        return tensor, fused

    tensors: dict[str, tuple] = {}
    rules: dict[str, NodeRule] = {}
    decisions: dict[str, NodeDecision] = {}
    for node in model.graph.node:
        if node.name in decisions:  # already decided as a fused activation
            continue
        if node.name in exclude:
            decisions[node.name] = NodeDecision(node.name, node.op_type, "float", "excluded by --exclude")
            continue
        if node.op_type in scheme.passthrough:
            src = node.input[0] if node.input else ""
            if scheme.int8_tables and node.op_type == "Gather" and src not in tensors and _float_table(ctx, src):
                tensors[src] = ("const",)  # an embedding table: int8 (its own scale), and the rows it gives keep it
            if src in tensors and all(ctx.is_float(o) for o in node.output if o):
                r = passthrough_rule(node, ctx)
                if isinstance(r, NodeRule):
                    rules[node.name] = r
                    for o in node.output:
                        if o:
                            tensors.setdefault(o, ("same", src))
                    decisions[node.name] = NodeDecision(node.name, node.op_type, "passthrough", "keeps the input's int8 scale")
                    continue
                decisions[node.name] = NodeDecision(node.name, node.op_type, "float", r)
                continue
            decisions[node.name] = NodeDecision(node.name, node.op_type, "float", "input is not int8")
            continue
        if node.op_type in FUSED_ACTIVATIONS:
            decisions[node.name] = NodeDecision(node.name, node.op_type, "float", "not after an int8 op")
            continue
        handler = RULES.get(node.op_type) if node.op_type in scheme.ops else None
        if handler is None:
            decisions[node.name] = NodeDecision(node.name, node.op_type, "float", f"no int8 rule for {node.op_type} in the {scheme.name} scheme")
            continue
        if not all(ctx.is_float(node.input[i]) for i in range(len(node.input)) if node.input[i]):
            decisions[node.name] = NodeDecision(node.name, node.op_type, "float", "inputs are not float32")
            continue
        r = handler(node, ctx)
        if isinstance(r, str):
            decisions[node.name] = NodeDecision(node.name, node.op_type, "float", r)
            continue
        rules[node.name] = r
        for idx in r.activations:
            t = node.input[idx]
            if t and t not in tensors:
                tensors[t] = ("const",) if ctx.is_const(t) else ("own",)
        if r.output == "own":
            out, fused = fused_output(node.output[0])
            tensors.setdefault(out, ("own",))
            for name in fused:
                op = next(n.op_type for n in model.graph.node if n.name == name)
                decisions[name] = NodeDecision(name, op, "fused", f"folded into {node.name}'s output range")
        decisions[node.name] = NodeDecision(node.name, node.op_type, "int8")
    ordered = [decisions[n.name] for n in model.graph.node]
    return Analysis(ordered, rules, tensors, consts)


def _float_table(ctx: RuleContext, name: str) -> bool:
    """Is ``name`` a constant float matrix (or larger) a Gather could read as int8?"""
    v = ctx.consts.get(name)
    return v is not None and v.dtype == np.float32 and v.ndim >= 2 and v.size >= TABLE_MIN


TABLE_MIN = 4096  # elements: a smaller constant table is not worth a Q/DQ pair


@dataclass(frozen=True)
class QParams:
    scale: np.ndarray
    zero_point: np.ndarray

    def scalars(self) -> tuple[np.ndarray, np.ndarray]:
        """Scale (float32) and zero point as 0-d arrays: a per-tensor Q/DQ's initializers."""
        return np.asarray(self.scale, dtype=np.float32).reshape(()), np.asarray(self.zero_point).reshape(())


def tensor_params(
    analysis: Analysis, ranges: dict[str, tuple[float, float]], scheme: QuantScheme, known: dict[str, QParams] | None = None,
    only: str | None = None,
) -> dict[str, QParams]:
    """Each tensor's scale and zero point: from its calibrated range, its constant's values, or
    its source's ("same"); ``known`` ones (taken from an existing int8 model) as given. ``only``:
    that tensor's (and the ones it resolves through), not every tensor's."""
    params: dict[str, QParams] = dict(known or {})

    def resolve(t: str) -> QParams:
        if t in params:
            return params[t]
        src = analysis.tensors[t]
        if src[0] == "same":
            params[t] = resolve(src[1])
        else:
            if src[0] == "const":
                v = analysis.consts[t]
                lo, hi = float(v.min(initial=0.0)), float(v.max(initial=0.0))
            else:
                lo, hi = ranges[t]
            params[t] = QParams(*qmath.scale_zero_point(lo, hi, scheme.activation_dtype, scheme.activation_symmetric))
        return params[t]

    for t in [only] if only is not None else analysis.tensors:
        resolve(t)
    return params


def keep_output_float(analysis: Analysis, node: str, output: str, reason: str) -> None:
    """Leave ``node``'s output float (no Q/DQ on it); its inputs keep theirs."""
    del analysis.tensors[output]
    analysis.rules.pop(node, None)
    analysis.decisions = [NodeDecision(d.name, d.op_type, "float", reason) if d.name == node else d for d in analysis.decisions]


# A Concat whose inputs' ranges differ more than this keeps its output float: one int8 scale for
# YOLO's box coordinates (0-320 px) and class scores (0-1) rounds every score below ~0.6 to 0.
CONCAT_SPAN_RATIO = 16.0


def float_wide_concats(model: onnx.ModelProto, analysis: Analysis, ranges: dict[str, tuple[float, float]]) -> list[str]:
    """Leave float the output of each Concat that joins ranges more than CONCAT_SPAN_RATIO apart,
    where nothing int8 reads it (a graph output, or float consumers); its inputs keep their own
    scales. The Concat nodes changed (their decisions say why)."""
    int8_inputs = {i for n in model.graph.node if n.name in analysis.rules for i in n.input}
    followers = {src[1] for src in analysis.tensors.values() if src[0] == "same"}
    changed = []
    for node in model.graph.node:
        out = node.output[0] if node.output else ""
        if node.op_type != "Concat" or node.name not in analysis.rules or analysis.tensors.get(out) != ("own",):
            continue
        if out in int8_inputs or out in followers:
            continue
        spans = []
        for src in map(analysis.root, node.input):
            if src in ranges:
                lo, hi = ranges[src]
            elif src in analysis.consts:
                lo, hi = float(analysis.consts[src].min(initial=0.0)), float(analysis.consts[src].max(initial=0.0))
            else:
                break
            spans.append(max(hi, 0.0) - min(lo, 0.0))
        else:
            if min(spans) > 0 and max(spans) / min(spans) > CONCAT_SPAN_RATIO:
                ratio = max(spans) / min(spans)
                keep_output_float(analysis, node.name, out, f"joins ranges {ratio:.0f}x apart (one int8 scale would crush the narrow ones)")
                changed.append(node.name)
    return changed


def rewrite(model: onnx.ModelProto, analysis: Analysis, params: dict[str, QParams], scheme: QuantScheme) -> onnx.ModelProto:
    """Insert Q/DQ pairs on activations, int8 weights and int32 biases; return a new model."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    graph_outputs = {o.name for o in g.output}
    new_inits: list[onnx.TensorProto] = []
    new_nodes: list[onnx.NodeProto] = []

    def dequantized(base: str, q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, **attrs) -> str:
        """A constant quantized (``q`` and its parameters, as initializers) and the DQ that reads it."""
        names = [f"{base}__q", f"{base}__scale", f"{base}__zp"]
        new_inits.extend(numpy_helper.from_array(v, n) for v, n in zip((q, scale, zero_point), names))
        new_nodes.append(helper.make_node("DequantizeLinear", names, [f"{base}__dq"], name=f"{base}__DQ", **attrs))
        return f"{base}__dq"

    # 1. activations: tensor t -> Q -> DQ -> every consumer reads the DQ output.
    renamed: dict[str, str] = {}
    for t, src in analysis.tensors.items():
        if src[0] == "const":
            continue
        s_name, z_name = f"{t}__scale", f"{t}__zp"
        new_inits.extend(numpy_helper.from_array(v, n) for v, n in zip(params[t].scalars(), (s_name, z_name)))
        x, dq = t, f"{t}__dq"
        if t in graph_outputs:
            # Keep the graph's output name: the producer writes t__fp, the DQ writes t, and the
            # consumers inside the graph keep reading t (the DQ output now).
            x, dq = f"{t}__fp", t
            for node in g.node:
                for i, o in enumerate(node.output):
                    if o == t:
                        node.output[i] = x
        else:
            renamed[t] = dq
        new_nodes.append(helper.make_node("QuantizeLinear", [x, s_name, z_name], [f"{t}__q"], name=f"{t}__Q"))
        new_nodes.append(helper.make_node("DequantizeLinear", [f"{t}__q", s_name, z_name], [dq], name=f"{t}__DQ"))
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]

    # 2. per-node constants: int8 weights, int32 biases, int8 constant operands.
    original = {dq: t for t, dq in renamed.items()}
    done: dict[tuple, str] = {}
    for node in g.node:
        r = analysis.rules.get(node.name)
        if r is None:
            continue
        orig_inputs = [original.get(i, i) for i in node.input]
        # constant operands as int8; a pass-through's input is int8 already unless it is a constant (an int8 table)
        for idx in (0,) if r.output == "same" else r.activations:
            name = orig_inputs[idx] if idx < len(orig_inputs) else ""
            if analysis.tensors.get(name, ("",))[0] != "const":
                continue
            key = ("c", name)
            if key not in done:
                p = params[name]
                q = qmath.quantize(analysis.consts[name], p.scale, p.zero_point, scheme.activation_dtype)
                done[key] = dequantized(f"{name}__c", q, *p.scalars())
            node.input[idx] = done[key]
        if r.output == "same":
            continue
        w_scale = None
        if r.weight is not None:
            w_name = orig_inputs[r.weight]
            key = ("w", w_name, r.weight_axis)
            w = analysis.consts[w_name]
            s, z = qmath.weight_params(w, r.weight_axis, weight_qmax_of(scheme, node, w.shape))
            w_scale = s
            if key not in done:
                base = f"{w_name}__w{'' if r.weight_axis is None else r.weight_axis}"
                q = analysis.weight_q(w_name, s, z, r.weight_axis)
                if r.weight_axis is None:  # per tensor: a scalar scale and zero point
                    done[key] = dequantized(base, q, s.reshape(()), z.reshape(()))
                else:
                    done[key] = dequantized(base, q, s, z, axis=r.weight_axis)
            node.input[r.weight] = done[key]
        if r.bias is not None and w_scale is not None and r.activations and scheme.quantize_bias:
            act = orig_inputs[r.activations[0]]
            x_scale = float(np.asarray(params[act].scale).reshape(()))
            b_name = orig_inputs[r.bias]
            b = analysis.consts[b_name]
            ws = np.broadcast_to(w_scale, b.shape) if w_scale.ndim == 0 else w_scale
            q, s = qmath.quantize_bias(b, x_scale, ws)
            node.input[r.bias] = dequantized(f"{node.name}__bias", q, s, np.zeros(s.shape, dtype=np.int32), axis=0)

    g.initializer.extend(new_inits)
    nodes = list(g.node) + new_nodes
    del g.node[:]
    g.node.extend(_toposort(nodes, {i.name for i in g.input} | {t.name for t in g.initializer}))
    drop_unused_initializers(g)
    del g.value_info[:]
    return m


def _toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Kahn's algorithm, the lowest original index first among the ready nodes: an already sorted
    list comes back as it was, and each node's reads are looked at once."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output}
    readers: dict[int, list[int]] = {}
    waits = [0] * len(nodes)
    for k, n in enumerate(nodes):
        deps = {producer[i] for i in reads(n) if i in producer and i not in available}  # reads: If branches' outer names too
        waits[k] = len(deps)
        for d in deps:
            readers.setdefault(d, []).append(k)
    ready = [k for k, w in enumerate(waits) if w == 0]
    heapq.heapify(ready)
    out: list[onnx.NodeProto] = []
    while ready:
        k = heapq.heappop(ready)
        out.append(nodes[k])
        for r in readers.get(k, ()):
            waits[r] -= 1
            if waits[r] == 0:
                heapq.heappush(ready, r)
    if len(out) != len(nodes):  # pragma: no cover - a cycle means a bug in rewrite
        raise RuntimeError("QDQ rewrite produced a cyclic graph")
    return out
