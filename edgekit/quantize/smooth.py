"""SmoothQuant-style scale migration (Xiao et al., 2022): ``--method <ranges>+smooth[=alpha]``.

A few input channels of a transformer's MatMul/Gemm carry outliers, so one per-tensor activation
scale spends the int8 grid on them. Channel j of such an input X is divided by
s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) and row j of the (per-channel quantized) weight
multiplied by it: X W = (X diag(1/s)) (diag(s) W), exact in float.

The 1/s goes into constants upstream of X, never into a new Mul (that would be a float island at
run time): a LayerNormalization's scale and bias, a MatMul/Gemm's weight columns and bias, a Mul
by a constant, an Add/Sub of a constant (then on up its other input), one factor of a product of
activations (GELU's 0.5 * x), and back through Reshape/Transpose and the V side of softmax @ V
(the attention output projection's input comes from the V projection). Every reader of X must be
a MatMul/Gemm with a constant weight (they all get the same s); otherwise X is left alone. So is
a post-LayerNorm transformer's LayerNorm output: the residual Add reads it too.

alpha "auto" (plain ``+smooth``): per tensor, the alpha of ALPHAS whose simulated int8 error of
the readers' products is least, or no smoothing when none beats it. A fixed alpha can hurt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from edgekit.quantize import qmath
from edgekit.quantize.calib import ChannelAbsMax, Feed, observe
from edgekit.quantize.rules import attr
from edgekit.quantize.scheme import QuantScheme

Scale = Callable[[np.ndarray], np.ndarray]


def _same(scale: np.ndarray) -> np.ndarray:
    return scale


@dataclass
class Fold:
    """A constant that takes the scale: ``node.input[index]`` along ``axis`` (a weight's or a
    LayerNorm's channel axis), or divided by the broadcast scale when ``axis`` is None (a Mul/Add
    constant). ``to`` turns the scale of the smoothed tensor into the scale where the constant is
    (through the Reshape/Transpose/MatMul between them)."""

    node: onnx.NodeProto
    index: int
    axis: int | None
    to: Scale = _same


@dataclass
class Site:
    """One activation to smooth: its readers' weights take s, its producer's constants 1/s."""

    tensor: str
    channels: int
    readers: list[Fold]  # the weights multiplied by s
    folds: list[Fold]  # the constants divided by s
    chain: list[tuple[str, Scale]] = field(default_factory=list)  # every tensor divided by s on the way (X first), and how


@dataclass
class Smoothing:
    """What ``smooth_model`` did: the tensors smoothed (-> their MatMul/Gemm readers, and the alpha
    each got), and the candidates left alone with why."""

    alpha: float | str  # fixed, or "auto": per tensor, the ALPHAS one with the least simulated int8 error
    smoothed: dict[str, list[str]] = field(default_factory=dict)
    alphas: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def inputs(self) -> int:
        return sum(len(r) for r in self.smoothed.values())

    def to_dict(self) -> dict:
        return {
            "alpha": self.alpha, "inputs": self.inputs, "skipped": self.skipped,
            "tensors": {t: {"readers": r, "alpha": self.alphas[t]} for t, r in self.smoothed.items()},
        }

    @classmethod
    def from_dict(cls, doc: dict) -> Smoothing:
        """The inverse of ``to_dict`` (a cached quantization's report)."""
        tensors = doc.get("tensors") or {}
        return cls(doc["alpha"], {t: list(v["readers"]) for t, v in tensors.items()}, {t: v["alpha"] for t, v in tensors.items()}, dict(doc.get("skipped") or {}))


def _shapes(model: onnx.ModelProto, feed: Feed | None = None) -> dict[str, tuple[int, ...]]:
    """Each float tensor's static shape: from shape inference, else (reshapes computed from
    Shape) as seen on ``feed``."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes, unknown = {}, []
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        t = vi.type.tensor_type
        if t.elem_type != onnx.TensorProto.FLOAT:
            continue
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
        else:
            unknown.append(vi.name)
    if unknown and feed is not None:
        for values in observe(model, unknown, [feed]):
            shapes.update((n, tuple(v.shape)) for n, v in values.items())
    return shapes


def _reshape_scale(out_shape: tuple[int, ...], in_shape: tuple[int, ...], probe: np.ndarray) -> Scale | None:
    """The scale of a reshape's input from its output's: the axes the scale varies on must form a
    trailing block that the input also has (same element count), so flat order keeps them."""
    varies = [i for i, d in enumerate(probe.shape) if d != 1]
    k = varies[0] if varies else len(out_shape)
    block = out_shape[k:]
    size = int(np.prod(block, dtype=np.int64))
    j = next((j for j in range(len(in_shape), -1, -1) if int(np.prod(in_shape[j:], dtype=np.int64)) == size), None)
    if j is None:
        return None
    tail = in_shape[j:]
    return lambda scale: np.broadcast_to(scale.reshape(scale.shape[k:]), block).reshape((1,) * j + tail)


def find_sites(model: onnx.ModelProto, feed: Feed | None = None) -> tuple[list[Site], dict[str, str]]:
    """The activations that can be smoothed, and the MatMul/Gemm inputs that cannot (-> why);
    ``feed``: a sample that tells the shapes shape inference cannot."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes = list(model.graph.node)  # one wrapper per node, so ``is`` tells nodes apart
    if not any(n.op_type in ("MatMul", "Gemm") for n in nodes):
        return [], {}  # a CNN: nothing to smooth, and no shapes to work out
    uses: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for i in node.input:
            if node.op_type != "Shape":  # a Shape reads no values
                uses.setdefault(i, []).append(node)
    producer = {o: n for n in nodes for o in n.output}
    outputs = {o.name for o in model.graph.output}
    shapes = _shapes(model, feed)

    def const(name: str, ndim: tuple[int, ...] = (0, 1, 2, 3, 4)) -> bool:
        t = inits.get(name)
        return t is not None and t.data_type == onnx.TensorProto.FLOAT and len(t.dims) in ndim

    def weight(node: onnx.NodeProto, x: str) -> Fold | str:
        if node.op_type not in ("MatMul", "Gemm") or node.input[0] != x or x in node.input[1:]:
            return f"read by {node.op_type} {node.name}, not as a MatMul/Gemm input"
        if not const(node.input[1], (2,)) or (node.op_type == "Gemm" and attr(node, "transA", 0)):
            return f"{node.op_type} {node.name} has no constant 2-D weight"
        return Fold(node, 1, 1 if node.op_type == "Gemm" and attr(node, "transB", 0) else 0)

    def only(t: str, reader: onnx.NodeProto) -> bool:
        readers = uses.get(t, [])
        return t not in outputs and len(readers) == 1 and readers[0] is reader and t in shapes

    def fold(t: str, probe: np.ndarray, to: Scale, chain: list[tuple[str, Scale]]) -> list[Fold] | str:
        """The constants that divide ``t`` by ``to(s)``; ``probe``: a scale of that shape; ``chain``
        gets each tensor on the way."""
        chain.append((t, to))
        node = producer.get(t)
        if node is None:
            return "a graph input"
        op, per_channel = node.op_type, probe.size == probe.shape[-1]
        if op == "LayerNormalization" and per_channel:
            gamma_beta = [i for i in (1, 2) if len(node.input) > i and node.input[i]]
            if not all(const(node.input[i]) and inits[node.input[i]].dims[-1:] == [probe.size] for i in gamma_beta):
                return f"LayerNormalization {node.name} has a non-constant scale or bias"
            return [Fold(node, i, -1, to) for i in gamma_beta]
        if op in ("MatMul", "Gemm") and const(node.input[1], (2,)) and all(const(i) for i in node.input[2:] if i):
            if not per_channel or (op == "Gemm" and len(node.input) > 2 and node.input[2] and inits[node.input[2]].dims[-1:] not in ([], [1], [probe.size])):
                return f"{op} {node.name}'s outputs are scaled across more than their channels"
            axis = 0 if op == "Gemm" and attr(node, "transB", 0) else -1
            return [Fold(node, 1, axis, to), *[Fold(node, 2, -1, to) for i in node.input[2:3] if i]]
        if op == "MatMul" and not const(node.input[1]) and only(node.input[1], node):
            # A @ Y: scaling Y's columns scales the product's columns (the same per batch)
            y = node.input[1]
            if probe.ndim < 2 or probe.shape[-2] != 1 or shapes[y][:-2] != shapes[t][:-2]:
                return f"MatMul {node.name} mixes the scaled channels"
            return fold(y, probe, to, chain)
        if op == "Transpose" and only(node.input[0], node):
            inverse = tuple(int(i) for i in np.argsort(attr(node, "perm", list(range(probe.ndim))[::-1])))
            return fold(node.input[0], probe.transpose(inverse), lambda scale: to(scale).transpose(inverse), chain)
        if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity") and only(node.input[0], node):
            back = _reshape_scale(shapes[t], shapes[node.input[0]], probe)
            if back is None:
                return f"{op} {node.name} splits the scaled channels"
            return fold(node.input[0], back(probe), lambda scale: back(to(scale)), chain)
        if op in ("Mul", "Add", "Sub") and len(node.input) == 2:
            k = next((i for i in (1, 0) if const(node.input[i]) and not const(node.input[1 - i])), None)
            if k is None and op == "Mul":
                # a product of two activations: scaling either factor scales it (jax's LayerNorm
                # ends in (x - mean) * (rsqrt(var) * gamma), then + beta)
                why = f"made by Mul {node.name} of broadcast activations"
                for y in [y for y in node.input[::-1] if only(y, node) and shapes[y] == shapes[t]]:
                    seen: list[tuple[str, Scale]] = []
                    found = fold(y, probe, to, seen)
                    if not isinstance(found, str):
                        chain += seen
                        return found
                    why = found
                return why
            if k is None:
                return f"made by {op} {node.name} without one constant input"
            other = node.input[1 - k]
            try:
                widened = np.broadcast_shapes(tuple(inits[node.input[k]].dims), probe.shape)
                fits = other in shapes and np.broadcast_shapes(shapes[other], widened) == shapes[t]
            except ValueError:
                fits = False
            if not fits:
                return f"{op} {node.name}'s constant does not lie along the channels"
            if op == "Mul":
                return [Fold(node, k, None, to)]
            if op == "Sub" and k == 0:
                return f"made by Sub {node.name} of a constant minus the activation"
            if not only(other, node) or shapes[other] != shapes[t]:
                return f"{op} {node.name}'s other input is read elsewhere or broadcast"
            rest = fold(other, probe, to, chain)
            return rest if isinstance(rest, str) else [Fold(node, k, None, to), *rest]
        if op in ("MatMul", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Add", "Sub"):
            y = node.input[1 if op == "MatMul" else 0]
            also = sorted({n.op_type for n in uses.get(y, []) if n is not node})
            return f"{op} {node.name}'s input is " + (f"read by {'/'.join(also)} too" if also else "a graph output or of unknown shape")
        return f"made by {op} {node.name}, which has no constant to take the scale"

    sites, skipped = [], {}
    seen = set()
    for node in nodes:
        if node.op_type not in ("MatMul", "Gemm") or not node.input or node.input[0] in seen:
            continue
        x = node.input[0]
        seen.add(x)
        readers = [weight(r, x) for r in uses.get(x, [])]
        why = next((r for r in readers if isinstance(r, str)), None)
        if why is None and x in outputs:
            why = "a graph output"
        if why is None and not shapes.get(x):
            why = "its shape is not known"
        if why is None:
            shape = shapes[x]
            probe = np.ones((1,) * (len(shape) - 1) + shape[-1:])
            chain: list[tuple[str, Scale]] = []
            folds = fold(x, probe, lambda scale, shape=shape: scale.reshape((1,) * (len(shape) - 1) + (-1,)), chain)
            if isinstance(folds, str):
                why = folds
            else:
                sites.append(Site(x, shape[-1], readers, folds, chain))
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


# What +smooth (alpha "auto") tries per tensor, next to leaving it alone: SmoothQuant's 0.5 and
# around it. A tensor is smoothed only where that lowers the simulated int8 error of its readers'
# products: on MiniLM's GELU outputs a fixed 0.5 lowered the embedding cosine from 0.91 to 0.83.
ALPHAS = (0.25, 0.5, 0.75, 0.9)
ROWS = 4096  # rows of each smoothed tensor kept (spread over the samples) to simulate int8 on


def _scale(a: np.ndarray, w: np.ndarray, alpha: float) -> np.ndarray:
    ok = (a > 0) & (w > 0)
    return np.where(ok, np.power(np.where(ok, a, 1.0), alpha) / np.power(np.where(ok, w, 1.0), 1 - alpha), 1.0)


def _int8_error(rows: np.ndarray, weights: list[np.ndarray], s: np.ndarray, scheme: QuantScheme) -> float:
    """Squared error of (rows / s) @ (s * W) with the activation per tensor and each weight per
    output channel in int8 (minmax), against rows @ W, summed over the readers (W: [C, N])."""
    x = rows / s
    sc, z = qmath.scale_zero_point(min(float(x.min()), 0.0), max(float(x.max()), 0.0), "int8", scheme.activation_symmetric)
    xq = qmath.dequantize(qmath.quantize(x, sc, z, "int8"), sc, z)
    err = 0.0
    for w in weights:
        ws = w * s[:, None]
        axis = 1 if scheme.per_channel else None
        wsc, wz = qmath.weight_params(ws, axis, scheme.weight_qmax)
        err += float(np.sum(np.square(xq @ qmath.dequantize(qmath.quantize(ws, wsc, wz, "int8", axis), wsc, wz, axis) - rows @ w)))
    return err


def smooth_model(
    model: onnx.ModelProto, feeds: Sequence[Feed], alpha: float | str = "auto", scheme: QuantScheme | None = None, progress=None
) -> Smoothing:
    """Smooth ``model`` in place (its float outputs unchanged); one float pass over ``feeds``
    measures each candidate's per-channel max|x| (and keeps some of its rows). ``alpha``: a
    fixed migration strength, or "auto" (per tensor, see ALPHAS); ``scheme``: the int8 it is
    simulated in. ``progress`` advances once per feed."""
    scheme = scheme or QuantScheme("int8")
    sites, skipped = find_sites(model, feeds[0] if feeds else None)
    result = Smoothing(alpha, skipped=skipped)
    absmax = ChannelAbsMax({s.tensor: -1 for s in sites})
    between = {t for site in sites for t, _ in site.chain[1:]}
    peaks: dict[str, np.ndarray] = {}  # max |x| of each element of the tensors between X and the constants
    rows: dict[str, list[np.ndarray]] = {}
    rng = np.random.default_rng(0)
    for values in observe(model, [*absmax.axes, *between], feeds):
        for name, value in values.items():
            if name in absmax.axes and value.size:
                absmax.add(name, value)
                flat = value.reshape(-1, value.shape[-1]).astype(np.float64)
                rows.setdefault(name, []).append(flat[rng.choice(len(flat), min(len(flat), -(-ROWS // len(feeds))), replace=False)])
            if name in between:
                peaks[name] = np.maximum(peaks[name], np.abs(value)) if name in peaks else np.abs(value)
        if progress is not None:
            progress.advance()
    if progress is not None and not sites:
        progress.advance(len(feeds))  # nothing to observe: no pass
    inits = {t.name: t for t in model.graph.initializer}
    refs = Counter(i for node in model.graph.node for i in node.input)
    for site in sites:
        a = absmax.get(site.tensor)
        if a is None or a.size != site.channels:
            result.skipped[site.tensor] = "not seen in calibration"
            continue
        weights = [numpy_helper.to_array(inits[r.node.input[r.index]]).astype(np.float64) for r in site.readers]
        weights = [w if r.axis == 0 else w.T for w, r in zip(weights, site.readers, strict=True)]  # [C, N]
        w_max = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)

        def widens(s: np.ndarray, site: Site = site) -> str | None:
            # A tensor between X and the constants is divided by s too, and is int8 with one scale
            # of its own: where its range would widen, smoothing X costs more there than it gains.
            for t, to in site.chain[1:]:
                was, now = float(peaks[t].max()), float((peaks[t] / to(s)).max())
                if now > was * (1 + 1e-6):
                    return f"{t} on the way to the constants would widen from {was:.3g} to {now:.3g}"
            return None

        tried = {al: _scale(a, w_max, al) for al in ([alpha] if isinstance(alpha, float) else ALPHAS)}
        why = {al: widens(s) for al, s in tried.items()}
        tried = {al: s for al, s in tried.items() if why[al] is None}
        if not tried:
            result.skipped[site.tensor] = next(iter(why.values()))
            continue
        x = np.concatenate(rows[site.tensor])
        errors = {al: _int8_error(x, weights, s, scheme) for al, s in tried.items()}
        best = min(errors, key=errors.get)
        if alpha == "auto" and errors[best] >= _int8_error(x, weights, np.ones(site.channels), scheme):
            result.skipped[site.tensor] = f"no alpha of {', '.join(map(str, ALPHAS))} lowers its readers' simulated int8 error"
            continue
        s = tried[best]
        for f, reader in [*((r, True) for r in site.readers), *((f, False) for f in site.folds)]:
            name = f.node.input[f.index]
            old = numpy_helper.to_array(inits[name]).astype(np.float64)
            if reader:
                new = _along(old, s, f.axis)
            elif f.axis is not None:
                new = _along(old, 1.0 / f.to(s).ravel(), f.axis)
            else:
                new = old / f.to(s)
                while new.ndim > old.ndim and new.shape[0] == 1:  # the constant keeps its rank where it can
                    new = new[0]
            if refs[name] > 1:  # shared with another reader: this node gets a copy of its own
                refs[name] -= 1
                name = f"{name}__smooth_{f.node.name or len(inits)}_{f.index}"
                f.node.input[f.index] = name
                refs[name] = 1
                inits[name] = model.graph.initializer.add()
            inits[name].CopyFrom(numpy_helper.from_array(new.astype(np.float32), name))
        result.smoothed[site.tensor] = [r.node.name for r in site.readers]
        result.alphas[site.tensor] = best
    return result
