"""The numpy reference backend: a float ONNX interpreter that needs nothing but numpy.

For boards without any inference runtime, and as a correctness oracle. The device cannot
parse ONNX protobuf without the ``onnx`` package, so the host converts the model
(``edgekit.targets.numpy``) into ``graph.json`` (nodes, attributes, tensor names) plus a
``weights.npz`` beside it; this module executes that graph, one function per ONNX op,
named like the op. ``OPS`` is the single list of what is supported: the host's planner
reads it (and ``check_node``) for its verdict.

numpy is imported when a graph is loaded (the agent imports only the standard library at
import time); the op functions use the module-level ``np`` set then.
"""

from __future__ import annotations

import os
import sys
import time

from .. import REPUSH, AgentFailure, missing_runtime, read_json, sha256_file

GRAPH_FORMAT = "edgekit.numpy-graph"
GRAPH_VERSION = 1
PROFILE_RUNS = 3  # runs timed node by node for layers(), after the timed loop

np = None  # numpy, once _numpy() has run


# -- ops: one function per ONNX op, the spec's inputs in order, then the node's attributes ----


def Identity(x, attrs):
    return x


def Relu(x, attrs):
    return np.maximum(x, x.dtype.type(0))


def Sigmoid(x, attrs):
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype, copy=False)


def Clip(x, min=None, max=None, attrs=None):
    # opset >= 11: min/max are inputs; before: attributes
    lo = min if min is not None else attrs.get("min")
    hi = max if max is not None else attrs.get("max")
    if lo is not None:
        x = np.maximum(x, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        x = np.minimum(x, np.asarray(hi, dtype=x.dtype))
    return x


def Add(a, b, attrs):
    return a + b


def Sub(a, b, attrs):
    return a - b


def Mul(a, b, attrs):
    return a * b


def Div(a, b, attrs):
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return np.trunc(a / b).astype(np.result_type(a, b))  # C semantics: toward zero
    return a / b


def MatMul(a, b, attrs):
    return np.matmul(a, b)


def Gemm(a, b, c=None, attrs=None):
    if attrs.get("transA", 0):
        a = a.T
    if attrs.get("transB", 0):
        b = b.T
    y = a @ b
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y = y * y.dtype.type(alpha)
    if c is not None:
        y = y + (c if beta == 1.0 else c * c.dtype.type(beta))
    return y


def Flatten(x, attrs):
    axis = attrs.get("axis", 1)
    if axis < 0:
        axis += x.ndim
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    return x.reshape(outer, int(np.prod(x.shape[axis:], dtype=np.int64)))


def Reshape(x, shape, attrs):
    shape = [int(d) for d in shape]
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


def Transpose(x, attrs):
    return np.transpose(x, attrs.get("perm"))


def Concat(*xs, attrs):
    return np.concatenate(xs, axis=attrs["axis"])


def Softmax(x, attrs):
    axis = attrs.get("axis", -1 if attrs["_opset"] >= 13 else 1)
    if axis < 0:
        axis += x.ndim
    if attrs["_opset"] < 13:  # the input is coerced to 2-D at `axis`
        shape = x.shape
        y = Softmax(Flatten(x, {"axis": axis}), {"axis": 1, "_opset": 13})
        return y.reshape(shape)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def BatchNormalization(x, scale, b, mean, var, attrs):
    eps = x.dtype.type(attrs.get("epsilon", 1e-5))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    k = (scale / np.sqrt(var + eps)).astype(x.dtype, copy=False)
    return x * k.reshape(shape) + (b - mean * k).astype(x.dtype, copy=False).reshape(shape)


def GlobalAveragePool(x, attrs):
    return np.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float64).astype(x.dtype)


def Conv(x, w, b=None, attrs=None):
    """im2col: every kernel position of every output pixel as one column, then one matmul per group."""
    x, w, squeeze = _as_2d(x), _as_2d(w), x.ndim == 3
    n, c = x.shape[:2]
    m, cg, kh, kw = w.shape
    group = attrs.get("group", 1)
    if c != cg * group:
        raise AgentFailure(f"Conv: input has {c} channels, weights expect {cg} x {group} groups", _REBUILD)
    kernel = (kh, kw)
    strides, dilations = _pair(attrs, "strides", squeeze), _pair(attrs, "dilations", squeeze)
    pads = _pads(attrs, x.shape[2:], kernel, strides, dilations, squeeze)
    xp = _pad(x, pads, 0)
    oh, ow = (_out_len(xp.shape[2 + i], kernel[i], strides[i], dilations[i], False) for i in range(2))
    # (n, c, oh, ow, kh, kw) windows -> (n, c, kh, kw, oh, ow): channel x kernel rows, pixel columns
    cols = _windows(xp, kernel, strides, dilations, (oh, ow)).transpose(0, 1, 4, 5, 2, 3)
    cols = cols.reshape(n, group, cg * kh * kw, oh * ow)
    y = np.matmul(w.reshape(1, group, m // group, cg * kh * kw), cols).reshape(n, m, oh, ow)
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y[:, :, 0, :] if squeeze else y


def MaxPool(x, attrs):
    return _pool(x, attrs, "max")


def AveragePool(x, attrs):
    return _pool(x, attrs, "avg")


OPS = {
    f.__name__: f
    for f in (
        Conv, Gemm, MatMul, Add, Mul, Sub, Div, Relu, Clip, Sigmoid, Softmax, MaxPool, AveragePool,
        GlobalAveragePool, Flatten, Reshape, Transpose, Concat, BatchNormalization, Identity,
    )
}

# Ops whose (1-D or 2-D) spatial kernels this interpreter implements.
_SPATIAL = {"Conv", "MaxPool", "AveragePool"}
_REBUILD = "convert the model again on the host (edgekit deploy does) or use another backend"


def check_node(node: dict) -> str | None:
    """Why this interpreter cannot run ``node`` (a graph.json node), or None when it can."""
    op, attrs = node.get("op"), node.get("attrs") or {}
    where = f"node '{node.get('name') or '?'}' (op {op})"
    if node.get("domain") not in (None, "", "ai.onnx"):
        return f"{where} is in domain '{node['domain']}', not in the numpy backend's op set"
    if op not in OPS:
        return f"{where} is not in the numpy backend's op set"
    if op in _SPATIAL:
        rank = len(attrs.get("kernel_shape") or ())
        if rank not in (1, 2):
            return f"{where}: only 1-D and 2-D kernels are supported, this one is {rank}-D"
        if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
            return f"{where}: unknown auto_pad {attrs['auto_pad']!r}"
    if op == "MaxPool" and (len(node.get("outputs") or ()) > 1 or attrs.get("storage_order", 0)):
        return f"{where}: the Indices output and storage_order are not supported"
    if op == "BatchNormalization" and (attrs.get("training_mode", 0) or len(node.get("outputs") or ()) > 1):
        return f"{where}: only inference mode (one output) is supported"
    return None


# -- helpers of the spatial ops ---------------------------------------------------------------


def _as_2d(a):
    return a[:, :, None, :] if a.ndim == 3 else a


def _pair(attrs: dict, key: str, one_d: bool) -> tuple:
    value = attrs.get(key)
    if value is None:
        return (1, 1)
    return (1, value[0]) if one_d else tuple(value)


def _out_len(padded: int, k: int, s: int, d: int, ceil: bool) -> int:
    span = (k - 1) * d + 1
    return (padded - span + (s - 1 if ceil else 0)) // s + 1


def _pads(attrs: dict, spatial, kernel, strides, dilations, one_d: bool) -> list:
    """[(begin, end), (begin, end)] for the two spatial axes, from auto_pad or pads."""
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return pads
    p = attrs.get("pads")
    if auto == "VALID" or not p:
        return [(0, 0), (0, 0)]
    if one_d:
        return [(0, 0), (p[0], p[1])]
    return [(p[0], p[2]), (p[1], p[3])]


def _pad(x, pads, value):
    if not any(b or e for b, e in pads):
        return x
    return np.pad(x, [(0, 0), (0, 0), *pads], mode="constant", constant_values=value)


def _pool(x, attrs: dict, kind: str):
    squeeze = x.ndim == 3
    x = _as_2d(x)
    k = attrs["kernel_shape"]
    kernel = (1, k[0]) if squeeze else tuple(k)
    strides, dilations = _pair(attrs, "strides", squeeze), _pair(attrs, "dilations", squeeze)
    pads = _pads(attrs, x.shape[2:], kernel, strides, dilations, squeeze)
    ceil = bool(attrs.get("ceil_mode", 0))
    out = []
    for i in range(2):
        size = x.shape[2 + i] + pads[i][0] + pads[i][1]
        o = _out_len(size, kernel[i], strides[i], dilations[i], ceil)
        if ceil and (o - 1) * strides[i] >= x.shape[2 + i] + pads[i][0]:
            o -= 1  # a window may not start in the end padding
        out.append(o)
    # room for the last (ceil-mode) window past the end padding
    extra = [max(0, (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - (x.shape[2 + i] + pads[i][0] + pads[i][1])) for i in range(2)]
    full = [(pads[i][0], pads[i][1] + extra[i]) for i in range(2)]
    if kind == "max":
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        y = _windows(_pad(x, full, fill), kernel, strides, dilations, out).max(axis=(-2, -1))
        return y[:, :, 0, :] if squeeze else y
    total = _windows(_pad(x, full, 0), kernel, strides, dilations, out).sum(axis=(-2, -1), dtype=np.float64)
    # the divisor: the window's elements inside the input (or inside input + explicit pads)
    ones = np.ones((1, 1) + x.shape[2:], dtype=np.float64)
    if attrs.get("count_include_pad", 0):
        ones = _pad(ones, pads, 1.0)
        count_pads = [(0, extra[i]) for i in range(2)]
    else:
        count_pads = full
    count = _windows(_pad(ones, count_pads, 0.0), kernel, strides, dilations, out).sum(axis=(-2, -1))
    y = (total / count).astype(x.dtype)
    return y[:, :, 0, :] if squeeze else y


def _windows(xp, kernel, strides, dilations, out):
    s = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp,
        shape=xp.shape[:2] + (out[0], out[1], kernel[0], kernel[1]),
        strides=s[:2] + (s[2] * strides[0], s[3] * strides[1], s[2] * dilations[0], s[3] * dilations[1]),
        writeable=False,
    )


# -- the graph --------------------------------------------------------------------------------


class Session:
    """A loaded graph: ``run(feeds)`` returns the graph outputs in order."""

    def __init__(self, graph: dict, weights: dict, opset: int, info: dict) -> None:
        self._weights = weights
        self._outputs = list(graph["outputs"])
        self._nodes = []
        last_use = {name: i for i, node in enumerate(graph["nodes"]) for name in node["inputs"]}
        keep = set(self._outputs)
        for i, node in enumerate(graph["nodes"]):
            attrs = dict(node.get("attrs") or {}, _opset=opset)
            # free intermediates after their last reader: peak memory like a runtime's, not a sum
            free = [n for n in node["inputs"] if n and last_use.get(n) == i and n not in keep and n not in weights]
            self._nodes.append((node.get("name") or f"{node['op']}_{i}", node["op"], OPS[node["op"]], node["inputs"], node["outputs"], attrs, free))
        self._last_feeds = None
        self.version = np.__version__
        self.info = info

    def run(self, feeds: dict, _times: list | None = None):
        values = dict(self._weights)
        values.update(feeds)
        self._last_feeds = feeds
        clock = time.perf_counter_ns
        for _name, _op, fn, inputs, outputs, attrs, free in self._nodes:
            args = [values[n] if n else None for n in inputs]
            t = clock() if _times is not None else 0
            result = fn(*args, attrs=attrs)
            if _times is not None:
                _times.append(clock() - t)
            values[outputs[0]] = result  # every op in OPS has one output
            for n in free:
                values.pop(n, None)
        try:
            return [values[n] for n in self._outputs]
        except KeyError as exc:
            raise AgentFailure(f"the graph never computes its output {exc.args[0]!r}", _REBUILD) from None

    def layers(self) -> list | None:
        """Per node: the median over a few runs of the last feeds, timed node by node."""
        if self._last_feeds is None:
            return None
        runs = []
        for _ in range(PROFILE_RUNS):
            times: list = []
            self.run(self._last_feeds, times)
            runs.append(times)
        out = []
        for i, (name, op, *_rest) in enumerate(self._nodes):
            ns = sorted(r[i] for r in runs)
            out.append({"name": name, "op": op, "ns": ns[len(ns) // 2], "ns_p25": ns[round(0.25 * (len(ns) - 1))], "ns_p75": ns[round(0.75 * (len(ns) - 1))]})
        return out


def load(model_path: str, threads: int | None, options: dict | None = None, workdir: str | None = None) -> Session:
    """Load ``graph.json`` (and the weights file it names, beside it)."""
    threads_applied = False
    if threads and "numpy" not in sys.modules:
        # BLAS reads these once, when numpy loads it
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
        threads_applied = True
    _numpy()
    graph = read_graph(model_path)
    weights_path = os.path.join(os.path.dirname(model_path), graph["weights"]["file"])
    try:
        digest = sha256_file(weights_path)
    except OSError as exc:
        raise AgentFailure(f"cannot read the weights {weights_path}: {exc.strerror}", REPUSH) from None
    if digest != graph["weights"]["sha256"]:
        raise AgentFailure(f"{weights_path} does not match the sha256 recorded in {os.path.basename(model_path)}", REPUSH)
    try:
        with np.load(weights_path, allow_pickle=False) as data:
            stored = {key: data[key] for key in data.files}
    except Exception as exc:  # numpy raises ValueError/OSError/zipfile errors for a bad file
        raise AgentFailure(f"cannot read the weights {weights_path}: {exc}", _REBUILD) from None
    keys = graph["weights"]["keys"]  # tensor name -> key in the npz
    missing = sorted(name for name, key in keys.items() if key not in stored)
    if missing:
        raise AgentFailure(f"{weights_path} lacks the tensors {', '.join(missing[:5])}", _REBUILD)
    weights = {name: stored[key] for name, key in keys.items()}
    for node in graph["nodes"]:
        problem = check_node(node)
        if problem:
            raise AgentFailure(problem, "run this model with another backend (edgekit plan lists them)")
    info = {
        "nodes": len(graph["nodes"]),
        "weights_bytes": int(sum(w.nbytes for w in weights.values())),
        "threads": threads if threads_applied else None,
    }
    return Session(graph, weights, int(graph.get("opset") or 13), info)


def read_graph(path: str) -> dict:
    """graph.json, checked just enough to be executed safely."""
    graph = read_json(path, _REBUILD)
    if not isinstance(graph, dict) or graph.get("format") != GRAPH_FORMAT:
        raise AgentFailure(f"{path} is not an {GRAPH_FORMAT} file", "the numpy backend runs the graph.json edgekit converts; " + _REBUILD)
    if graph.get("version") != GRAPH_VERSION:
        raise AgentFailure(
            f"{path} is {GRAPH_FORMAT} version {graph.get('version')!r}; this agent reads version {GRAPH_VERSION}",
            "use the same edgekit version to build the bundle and to run it",
        )
    nodes, weights = graph.get("nodes"), graph.get("weights")
    ok = (
        isinstance(nodes, list)
        and all(isinstance(n, dict) and isinstance(n.get("inputs"), list) and isinstance(n.get("outputs"), list) and n.get("outputs") for n in nodes)
        and isinstance(graph.get("outputs"), list)
        and isinstance(weights, dict)
        and isinstance(weights.get("file"), str)
        and "/" not in weights["file"]
        and isinstance(weights.get("keys"), dict)
        and isinstance(weights.get("sha256"), str)
    )
    if not ok:
        raise AgentFailure(f"{path} is malformed (nodes, outputs or weights)", _REBUILD)
    return graph


def _numpy():
    global np
    if np is None:
        try:
            import numpy
        except ImportError:
            raise missing_runtime("numpy") from None
        np = numpy
    return np
