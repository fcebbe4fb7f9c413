"""Per-layer sensitivity: which int8 nodes cost the model its accuracy.

A *unit* is one int8 node with the Q/DQ it brings: its int8 weights, int32 bias and int8
constant operands, the Q/DQ on its output (after fused activations, and the pass-through nodes
that reuse that scale), and the Q/DQ on inputs no other int8 node produces (graph inputs,
outputs of float nodes). Three figures per unit, all with Q/DQ reference semantics:

* local error: SNR of the fake-quantized activation at the node's output against float at that
  tensor (cheap: values kept from the calibration pass, see ``calib.ElementSample``);
* the model's output SNR when that unit alone is quantized (everything else float);
* the output SNR gained when that unit alone is kept float (everything else int8).

The variant models are the QDQ model with some units' Q/DQ dropped (``keep_float``), never a
second run of the quantizer, so they quantize exactly as the model that ships.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgekit.errors import UsageError
from edgekit.quantize import qmath
from edgekit.quantize.calib import ElementSample, Feed, is_dynamic
from edgekit.quantize.prepare import prepare, reads
from edgekit.quantize.report import session
from edgekit.quantize.rewrite import Analysis, analyze, consumers

if TYPE_CHECKING:
    from edgekit.modelio import LoadedModel
    from edgekit.quantize import QuantizeResult

SAMPLES = 8  # held-out samples the output effects run on (two inference passes per node each)
NODE_BUDGET = 150  # above this many int8 nodes, output effects only when asked for in full


def no_dynamic_report() -> UsageError:
    """Per-layer figures are of calibrated activation ranges: --method dynamic has none to measure."""
    return UsageError(
        "the per-layer report measures each int8 node's calibrated Q/DQ, and --method dynamic quantizes activations at run time",
        "drop --report (the fp32-vs-int8 agreement is measured all the same), or use a static --method",
    )


LOCAL_METHOD = "local SNR: each int8 node's output activation, fake-quantized vs float, over the calibration samples"


@dataclass(frozen=True)
class Unit:
    name: str  # the ONNX node name (what runtimes' profilers call the layer)
    op: str
    output: str  # the tensor whose Q/DQ carries this node's output scale
    tensors: tuple[str, ...]  # the activation tensors whose Q/DQ pair belongs to this unit


def units(model: onnx.ModelProto, analysis: Analysis) -> list[Unit]:
    """The int8 nodes of a prepared float model (analysed by ``analysis``), in graph order."""
    kind = {d.name: d.kind for d in analysis.decisions}
    readers = consumers(model)
    owner: dict[str, str] = {}
    found = []
    for node in model.graph.node:
        if kind.get(node.name) != "int8":
            continue
        out = node.output[0]
        while True:  # the Q goes after the Relu/Clip chain folded into this node's range
            nxt = [c for c in readers.get(out, []) if kind.get(c.name) == "fused"]
            if len(nxt) != 1:
                break
            out = nxt[0].output[0]
        if out not in analysis.tensors:
            continue
        owner[out] = node.name
        found.append((node, out))
    for node, _ in found:  # inputs no int8 node produces belong to their first int8 consumer
        for idx in analysis.rules[node.name].activations:
            t = node.input[idx]
            if t and analysis.tensors.get(t, ("const",))[0] != "const":
                owner.setdefault(analysis.root(t), node.name)
    for t, src in analysis.tensors.items():  # pass-through outputs share their source's scale and unit
        if src[0] == "same" and analysis.root(t) in owner:
            owner[t] = owner[analysis.root(t)]
    return [
        Unit(node.name, node.op_type, out, tuple(t for t, who in owner.items() if who == node.name))
        for node, out in found
    ]


def keep_float(qmodel: onnx.ModelProto, float_model: onnx.ModelProto, keep: Collection[Unit], *, switch: bool = False) -> onnx.ModelProto:
    """``qmodel`` with the units in ``keep`` back in float: their activation Q/DQ pairs become
    Identity, their weights, biases and constant operands the float initializers of ``float_model``
    (the prepared model ``qmodel`` was rewritten from).

    ``switch=True``: the units in ``keep`` get a choice instead, a scalar bool graph input each
    (``switch_name(unit)``, true: float) that selects with ``Where`` between the float tensor and
    its Q/DQ; one session then runs every mix of them, with the numbers of the fixed variant."""
    m = onnx.ModelProto()
    m.CopyFrom(qmodel)
    g = m.graph
    names = {u.name: u for u in keep}
    pairs = {f"{t}__DQ": (f"{t}__Q", u) for u in keep for t in u.tensors}  # rewrite's names for an activation's pair
    float_inputs = {n.name: list(n.input) for n in float_model.graph.node if n.name in names}
    float_inits = {t.name: t for t in float_model.graph.initializer}
    inits = {t.name for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    q_input = {n.name: n.input[0] for n in g.node if n.op_type == "QuantizeLinear"}
    drop_q = set() if switch else {q for q, _ in pairs.values()}
    nodes = []
    for node in g.node:
        if node.name in drop_q:
            continue
        if node.name in pairs:
            q, u = pairs[node.name]
            if not switch:
                nodes.append(helper.make_node("Identity", [q_input[q]], [node.output[0]], name=node.name + "__float"))
                continue
            out = node.output[0]
            node.output[0] = out + "__int8"
            nodes += [node, helper.make_node("Where", [switch_name(u), q_input[q], node.output[0]], [out], name=node.name + "__switch")]
            continue
        if node.name in names:
            for i, name in enumerate(node.input):
                p = producer.get(name)
                if p is not None and p.op_type == "DequantizeLinear" and p.input[0] in inits:
                    if switch:
                        chosen = f"{name}__{node.name}__switch"
                        nodes.append(helper.make_node("Where", [switch_name(names[node.name]), float_inputs[node.name][i], name], [chosen], name=chosen))
                        node.input[i] = chosen
                    else:
                        node.input[i] = float_inputs[node.name][i]
        nodes.append(node)
    if switch:
        g.input.extend(helper.make_tensor_value_info(switch_name(u), onnx.TensorProto.BOOL, []) for u in keep)
    used = {i for n in nodes for i in reads(n)}  # If/Loop bodies read outer names too
    nodes = [n for n in nodes if n.op_type != "DequantizeLinear" or n.input[0] not in inits or n.output[0] in used]
    used = {i for n in nodes for i in reads(n)}
    del g.node[:]
    g.node.extend(nodes)  # a switch sits right after its DQ, or right before its reader: still in order
    kept = [t for t in g.initializer if t.name in used]
    have = {t.name for t in kept}
    kept += [float_inits[n] for n in sorted(used - have) if n in float_inits]
    del g.initializer[:]
    g.initializer.extend(kept)
    return m


def switch_name(unit: Unit) -> str:
    return f"{unit.name}__keep_float"


class Switchboard:
    """One Q/DQ-reference session of ``qmodel`` in which any set of units runs float (see
    ``keep_float(switch=True)``): the variants sensitivity and mixed precision compare, without a
    new model and session for each."""

    def __init__(self, qmodel: onnx.ModelProto, float_model: onnx.ModelProto, found: Sequence[Unit]) -> None:
        self.units = list(found)
        self.session = session(keep_float(qmodel, float_model, self.units, switch=True).SerializeToString(), reference=True)
        self.names = [o.name for o in self.session.get_outputs()]

    def run(self, keep: Collection[str], feeds: Sequence[Feed]) -> list[list[np.ndarray]]:
        """Per sample, the outputs with the units named in ``keep`` float and the others int8."""
        flags = {switch_name(u): np.array(u.name in keep) for u in self.units}
        return [self.session.run(self.names, {**feed, **flags}) for feed in feeds]

    def outputs(self, keep: Collection[str], feeds: Sequence[Feed]) -> dict[str, np.ndarray]:
        """``run``, each output flattened and joined over the samples (what ``_score`` compares)."""
        runs = self.run(keep, feeds)
        return {n: np.concatenate([np.ravel(r[i]) for r in runs]).astype(np.float64) for i, n in enumerate(self.names)}


def local_snr(qmodel: onnx.ModelProto, found: Sequence[Unit], sample: ElementSample) -> dict[str, float | None]:
    """Node -> SNR (dB) of its output activation fake-quantized with ``qmodel``'s scale and zero
    point, against the float values in ``sample``; None where nothing was observed."""
    inits = {t.name: t for t in qmodel.graph.initializer}
    q_nodes = {n.name: n for n in qmodel.graph.node if n.op_type == "QuantizeLinear"}
    out: dict[str, float | None] = {}
    for u in found:
        q = q_nodes.get(f"{u.output}__Q")
        values = sample.get(u.output)
        if q is None or values is None or values.size == 0:
            out[u.name] = None
            continue
        scale, zp = (numpy_helper.to_array(inits[name]) for name in q.input[1:3])
        x = values.astype(np.float64)
        noise = x - qmath.dequantize(qmath.quantize(values, scale, zp, zp.dtype.name), scale, zp)
        # Plain reductions, not qmath.snr_db's np.dot: BLAS threads crawl on a busy machine.
        signal_power, noise_power = float(np.add.reduce(x * x)), float(np.add.reduce(noise * noise))
        out[u.name] = None if noise_power == 0 or signal_power == 0 else round(10 * math.log10(signal_power / noise_power), 2)
    return out


def _finite(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else round(float(x), 2)


# Gates per step of a recurrent op: each multiplies the input and the hidden state by its weights.
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def macs(model: onnx.ModelProto) -> dict[str, int]:
    """Multiply-accumulates per Conv/ConvTranspose/Gemm/MatMul/LSTM/GRU/RNN node, from the shapes a
    prepared (shape-inferred) model records; nodes whose shapes are unknown are left out. The
    recurrent ops count so that a model whose LSTMs stay float does not read as all int8."""
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
        if dims and all(dims):
            shapes[vi.name] = tuple(dims)
    for t in model.graph.initializer:
        shapes[t.name] = tuple(t.dims)
    out = {}
    for node in model.graph.node:
        y, a = shapes.get(node.output[0]), shapes.get(node.input[0]) if node.input else None
        w = shapes.get(node.input[1]) if len(node.input) > 1 else None
        if node.op_type == "Conv" and y and w:
            out[node.name] = math.prod(y) * math.prod(w[1:])
        elif node.op_type == "ConvTranspose" and a and w:
            out[node.name] = math.prod(a) * math.prod(w[1:])
        elif node.op_type in ("Gemm", "MatMul") and y and a:
            out[node.name] = math.prod(y) * a[-1]
        elif node.op_type in _GATES and a and w and len(a) == 3 and len(w) == 3:
            r = shapes.get(node.input[2]) if len(node.input) > 2 else None
            hidden = r[2] if r and len(r) == 3 else w[1] // _GATES[node.op_type]
            out[node.name] = a[0] * a[1] * w[0] * w[1] * (w[2] + hidden)  # steps x batch x directions x gates*hidden x (input + hidden)
    return out


@dataclass
class Sensitivity:
    layers: list[dict]  # most harmful first
    samples: int  # held-out samples the output effects ran on (0: not measured)
    output_snr_db: float | None  # the whole int8 model's, on those samples
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "layers": self.layers,
            "samples": self.samples,
            "output_snr_db": self.output_snr_db,
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
            "method": LOCAL_METHOD + "; output effects with Q/DQ reference semantics on held-out samples",
        }


def measure(
    float_model: onnx.ModelProto,
    qmodel: onnx.ModelProto,
    analysis: Analysis,
    feeds: Sequence[Feed],
    local: Mapping[str, float | None],
    *,
    samples: int = SAMPLES,
    budget: int | None = NODE_BUDGET,
    alone: bool = True,
    board: Switchboard | None = None,
    progress=None,
    among: Collection[str] | None = None,
) -> Sensitivity:
    """Each int8 node's local error (``local``: node -> dB) and, within ``budget`` nodes (None:
    no limit), its effect on the outputs alone float and (``alone``) alone quantized, on
    ``samples`` of ``feeds``. ``board``: a ``Switchboard`` of these models, if one is open.
    ``among``: the nodes whose output effects are measured (the others rank last); None: all."""
    t0 = time.perf_counter()
    found = units(float_model, analysis)
    node_macs = macs(float_model)
    total = sum(node_macs.values())
    layers = [
        {"name": u.name, "op": u.op, "snr_db": local.get(u.name), "macs_share": round(node_macs[u.name] / total, 4) if total and u.name in node_macs else None}
        for u in found
    ]
    feeds = list(feeds[:samples])
    notes = []
    whole = None
    if budget is not None and len(found) > budget:
        notes.append(f"{len(found)} int8 nodes, more than {budget}: output effects not measured (--report-full measures them)")
        feeds = []
    if feeds:
        board = board or Switchboard(qmodel, float_model, found)
        everything = {u.name for u in found}
        ref = board.outputs(everything, feeds)
        whole = _score(ref, board.outputs((), feeds))[0]
        raw = {}  # node -> (gain kept float, SNR alone quantized), unrounded, for the order
        for u, layer in zip(found, layers):
            if among is not None and u.name not in among:
                raw[u.name] = (-math.inf, math.inf)
                layer.update({"output_snr_db_float": None, "output_snr_db_gain_float": None})
                continue
            float_snr, _ = _score(ref, board.outputs({u.name}, feeds))
            gain = float_snr - whole if math.isfinite(whole) else 0.0
            alone_snr = 0.0
            if alone:
                alone_snr, alone_cos = _score(ref, board.outputs(everything - {u.name}, feeds))
                layer.update({"output_snr_db_alone": _finite(alone_snr), "output_cosine_alone": round(alone_cos, 6)})
            raw[u.name] = (gain, alone_snr)
            layer.update({"output_snr_db_float": _finite(float_snr), "output_snr_db_gain_float": _finite(gain)})
            if progress is not None:
                progress.advance()
        # Most harmful first: the largest gain when kept float, then the worst output alone quantized.
        layers.sort(key=lambda x: (-raw[x["name"]][0], raw[x["name"]][1]))
    else:
        layers.sort(key=lambda x: math.inf if x["snr_db"] is None else x["snr_db"])
    return Sensitivity(layers, len(feeds), None if whole is None else _finite(whole), time.perf_counter() - t0, notes)


def _score(ref: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray]) -> tuple[float, float]:
    """(SNR dB, cosine) of the worst output (lowest SNR)."""
    return min(((qmath.snr_db(ref[n], out[n]), qmath.cosine(ref[n], out[n])) for n in ref), key=lambda x: x[0])


def measure_result(
    loaded: LoadedModel, result: QuantizeResult, heldout: Sequence[Feed], *, exclude: Sequence[str] = (), full: bool = False, progress=None
) -> Sensitivity:
    """``measure`` for a ``QuantizeResult`` of ``loaded`` (a ``LoadedModel``), quantized with ``exclude``:
    the float model is prepared again (the same steps, the same node names) for the float side."""
    if is_dynamic(result.method):
        raise no_dynamic_report()
    prepared = prepare(loaded.model, loaded.inputs, result.scheme.min_opset)
    analysis = analyze(prepared, result.scheme, exclude)
    local = {x["name"]: x["snr_db"] for x in result.layers}
    return measure(prepared, result.model, analysis, heldout, local, budget=None if full else NODE_BUDGET, progress=progress)
