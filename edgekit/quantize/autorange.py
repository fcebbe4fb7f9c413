"""``--method auto``: each activation's range chosen by the error it causes at the model's outputs.

Why not by each tensor's own error (what ``auto`` did first): on EfficientNet-Lite0 (ImageNet
weights) that choice clipped 37 of 162 activation ranges, the linear bottlenecks' outputs and
residual sums to 0.67-0.84 of their span and the logits to 0.93 of theirs, each the least squared
error on its own histogram, and lost to plain minmax (top-1 agreement 81 % vs 94 % on 32 held-out
photos): a tail clipped where it is rare is still where the next layers, and argmax, read the
largest values. Clipping the logits alone cost 3 of those 32 samples.

Here the candidates (minmax, percentile, MSE; and the per-tensor histogram choice) are judged
by the fp32-vs-int8 error at the model's outputs on a few calibration samples, with Q/DQ
reference semantics: first the four uniform assignments, minmax first (so a tie keeps minmax),
then blocks of consecutive tensors in graph order switched to each method, kept when the output
error falls (a per-tensor search ran 102 trials on EfficientNet-Lite0, 3.7x minmax's quantize
time, for the same held-out top-1). minmax is
always a candidate and every move must lower the error, so on those samples the result never errs
more than all-minmax. One ONNX Runtime session serves every trial: the activations' scales and
zero points are graph inputs of the model tried, so a trial is a run, not a rebuild. A trial
stops at the sample where its error (a sum that only grows) passes the best one's, and an
assignment judged before is not run again: the choice is the one full trials make, at a third of
their runs on ppocr-cls (tests/test_autorange.py). A graph output's own range stays minmax (its
extremes are what the caller reads: argmax, the best score).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgekit.quantize.calib import Feed
from edgekit.quantize.report import session
from edgekit.quantize.rewrite import Analysis, drop_unused_initializers, rewrite, tensor_params
from edgekit.quantize.scheme import QuantScheme

SAMPLES = 4  # calibration samples each trial runs on, for a model of more than
SMALL_MODEL_MACS = 200e6  # multiply-accumulates per inference; smaller ones are judged on up to
SMALL_SAMPLES = 16  # samples (a tiny model's 4 samples are too few values to judge a clip by)
BLOCKS = 8  # groups of consecutive tensors tried together after the uniform assignments
UNIFORM = ("minmax", "histogram", "percentile", "mse")  # minmax first: a tie keeps it
# Corrected biases are kept when they lower the output error by at least this much: less is within
# what 4-16 samples tell apart (PP-OCRv4 det at 128x128, 4 samples: 0.1 % lower, its held-out mask
# IoU 0.6 points worse and 8 points worse with its worst half in float; EfficientNet-Lite0 25 %,
# MTCNN O-Net 8 %, silero-vad 28 %, ppocr-cls 110 % *higher*).
BIAS_MARGIN = 0.01

Range = tuple[float, float]


def choose(
    model: onnx.ModelProto, analysis: Analysis, scheme: QuantScheme, candidates: Mapping[str, Mapping[str, Range]], feeds: Sequence[Feed],
    rounded: Mapping[str, np.ndarray] | None = None, use_weights: Callable[[Mapping[str, np.ndarray], bool], None] | None = None,
    bias: str = "off",
) -> tuple[dict[str, Range], dict]:
    """The range of each calibrated tensor (``candidates``: tensor -> method -> range, with at least
    "minmax"), and a record of the choice: the output error of all-minmax and of the result, the
    tensors whose range is not minmax's, the trials run.

    ``rounded`` (GPTQ's integers for the weights, ``quantize.rounding``): tried against the
    weights ``analysis`` rounds now (to nearest), both with minmax ranges, and kept when the output
    error falls; ``use_weights(r, corrected)`` makes the model use ``r`` (``{}``: to nearest), its
    biases corrected for that rounding or not. The record's "rounding" says which won, and both
    errors. ``bias``: "on" or "off" (as asked), or "decide": the biases corrected for the chosen
    rounding are tried the same way (the record's "bias")."""
    minmax = {t: c["minmax"] for t, c in candidates.items()}
    outputs = {o.name for o in model.graph.output}
    movable = [t for t in analysis.tensors if t in candidates and t not in outputs and len({c for c in candidates[t].values()}) > 1]
    record: dict = {"samples": 0, "trials": 0, "movable": len(movable)}
    use = use_weights or (lambda r, corrected: setattr(analysis, "rounded", dict(r)))
    decide_bias = bias == "decide" and use_weights is not None
    if not feeds or not (movable or rounded or decide_bias):
        return minmax, {**record, "chosen": {}}
    refs = _References(model, feeds)
    trial = _Trial(model, analysis, scheme, minmax, refs)
    record["samples"] = len(refs.feeds)
    current, best = dict(minmax), trial.error(minmax)
    made = [trial]
    corrected, kept = bias == "on", dict(analysis.rounded)  # the rounding in use (forced +gptq, or nearest)
    if rounded:
        use(rounded, corrected)
        learned = _Trial(model, analysis, scheme, minmax, refs)
        err = learned.error(minmax)
        made.append(learned)
        record["rounding"] = {"error_nearest": best, "error_gptq": err, "layers": len(rounded)}
        if err < best * (1 - 1e-6):
            trial, best, kept = learned, err, rounded
            record["rounding"]["chosen"] = "gptq"
        else:
            use({}, corrected)
            record["rounding"]["chosen"] = "nearest"
    if decide_bias:  # the biases corrected for the rounding just chosen, judged the same way
        use(kept, True)
        fixed = _Trial(model, analysis, scheme, minmax, refs)
        err = fixed.error(minmax)  # whole, as the rounding's: the record's errors are exact
        made.append(fixed)
        record["bias"] = {"error_as_is": best, "error_corrected": err, "chosen": err < best * (1 - BIAS_MARGIN)}
        if record["bias"]["chosen"]:
            trial, best = fixed, err
        else:
            use(kept, False)
    record["error_minmax"] = best
    for method in UNIFORM[1:]:
        ranges = {**minmax, **{t: candidates[t].get(method, minmax[t]) for t in movable}}
        err = trial.error(ranges, below=best * (1 - 1e-6))
        if err < best * (1 - 1e-6):
            current, best = ranges, err
    # Then blocks of consecutive tensors (graph order: a block is judged with the ranges chosen
    # before it) switched to each method, kept when the error falls: at most BLOCKS x 3 trials.
    size = max(1, math.ceil(len(movable) / BLOCKS))
    for start in range(0, len(movable), size):
        block = movable[start : start + size]
        for method in UNIFORM:
            ranges = {**current, **{t: candidates[t].get(method, current[t]) for t in block}}
            if ranges == current:
                continue
            err = trial.error(ranges, below=best * (1 - 1e-6))
            if err < best * (1 - 1e-6):
                current, best = ranges, err
    chosen = {t: next(m for m, r in candidates[t].items() if r == current[t]) for t in movable if current[t] != minmax[t]}
    return current, {**record, "trials": sum(t.runs for t in made), "error": best, "chosen": chosen}


class _References:
    """The float model's outputs on the samples the trials run (up to SAMPLES, or SMALL_SAMPLES for
    a model of at most SMALL_MODEL_MACS), in float64, and their power per output: computed once.

    By the model's size, not by how fast it ran here (as it was first): ppocr-rec (0.69 G MACs)
    took 15.6 ms per inference on a quiet 2-core VM and 20+ on a busy one, and so was judged on 16
    samples in one run and on 4 in the next, with other ranges chosen: one model, two results."""

    def __init__(self, model: onnx.ModelProto, feeds: Sequence[Feed]) -> None:
        from edgekit.quantize.sensitivity import macs

        ref = session(model.SerializeToString(), reference=False)
        self.names = [o.name for o in ref.get_outputs()]
        count = SMALL_SAMPLES if sum(macs(model).values()) <= SMALL_MODEL_MACS else SAMPLES
        values = [ref.run(self.names, f) for f in feeds[:count]]
        self.feeds = list(feeds[: len(values)])
        self.values = [[r.astype(np.float64) for r in outs] for outs in values]
        self.power = [max(sum(float(np.square(r[i]).sum()) for r in self.values), 1e-30) for i in range(len(self.names))]


class _Trial:
    """The QDQ model with every activation scale and zero point a graph input: one session, a run per trial.

    Its constant DequantizeLinear nodes (weights, biases, constant operands: the same in every
    trial) are computed once, by ONNX Runtime's own kernel, and stored as float initializers:
    with graph optimizations off (Q/DQ reference semantics) the session would dequantize every
    weight again on every run (on ppocr-cls a third of a trial's time). The values are the very
    floats the DQ computes, so a trial's outputs are too (tests/test_autorange.py)."""

    def __init__(self, model: onnx.ModelProto, analysis: Analysis, scheme: QuantScheme, ranges: dict[str, Range], refs: _References) -> None:
        self.analysis, self.scheme, self.runs, self.sample_runs = analysis, scheme, 0, 0
        qmodel = rewrite(model, analysis, tensor_params(analysis, ranges, scheme), scheme)
        names = {f"{t}__{k}" for t, src in analysis.tensors.items() if src[0] != "const" for k in ("scale", "zp")}
        keep, self.kinds = [], {}
        for init in qmodel.graph.initializer:
            if init.name in names:
                arr = numpy_helper.to_array(init)
                self.kinds[init.name] = arr.dtype
                qmodel.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(arr.shape)))
            else:
                keep.append(init)
        del qmodel.graph.initializer[:]
        qmodel.graph.initializer.extend(keep)
        self.session = session(fold_constant_dq(qmodel).SerializeToString(), reference=True)
        self.names, self.feeds, self.reference, self.power = refs.names, refs.feeds, refs.values, refs.power
        # Each input's scale or zero point follows one calibrated tensor's range (its own, or the
        # source's it shares: "same"); the params of a (tensor, range) are computed once, not per
        # trial (tensor_params over every tensor was 13 % of ppocr-cls's quantize time).
        self.source = {name: analysis.root(name.rpartition("__")[0]) for name in self.kinds}
        self.memo: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        # Inputs bound, not fed to run(): run() checks each of its ~2 x tensors names against
        # the inputs in a Python loop (quadratic: 15 % of ppocr-cls's trial time).
        self.binding = self.session.io_binding()
        self.judged: dict[tuple, float] = {}

    def error(self, ranges: dict[str, Range], below: float = math.inf) -> float:
        """Sum over the outputs of noise power / signal power (int8 vs fp32) on the samples; a
        trial stops as soon as its error reaches ``below`` (it only grows with each sample: the
        trial would be rejected) and returns what it had then, at least ``below``. An assignment
        judged before is not run again (``below`` only falls, so a stopped one stays rejected)."""
        self.runs += 1
        qp = self._inputs(ranges)
        key = tuple((n, v.item()) for n, v in qp.items())
        if key not in self.judged:
            self.judged[key] = self._error(qp, below)
        return self.judged[key]

    def _inputs(self, ranges: dict[str, Range]) -> dict[str, np.ndarray]:
        """The trial model's scale and zero point inputs for ``ranges``."""
        qp = {}
        for name, dtype in self.kinds.items():
            t = self.source[name]
            key = (name, ranges.get(t))
            if key not in self.memo:
                scale, zp = tensor_params(self.analysis, ranges, self.scheme, only=t)[t].scalars()
                self.memo[key] = np.asarray(scale if name.endswith("__scale") else zp, dtype=dtype)
            qp[name] = self.memo[key]
        return qp

    def _error(self, qp: dict[str, np.ndarray], below: float) -> float:
        b = self.binding
        for name, value in qp.items():
            b.bind_cpu_input(name, value)
        noise = [0.0] * len(self.names)
        err = 0.0
        for feed, ref in zip(self.feeds, self.reference):
            for name, value in feed.items():
                b.bind_cpu_input(name, value)
            for name in self.names:
                b.bind_output(name)
            self.session.run_with_iobinding(b)
            self.sample_runs += 1
            for i, (r, q) in enumerate(zip(ref, b.copy_outputs_to_cpu())):
                noise[i] += float(np.square(r - q.astype(np.float64)).sum())
            err = sum(n / p for n, p in zip(noise, self.power))
            if not math.isfinite(err) or err >= below:
                break
        return err if math.isfinite(err) else math.inf


def fold_constant_dq(qmodel: onnx.ModelProto) -> onnx.ModelProto:
    """``qmodel`` with each DequantizeLinear that reads only initializers replaced by its float
    result, computed by ONNX Runtime's DequantizeLinear (Q/DQ reference semantics) once."""
    inits = {t.name: t for t in qmodel.graph.initializer}
    const = [n for n in qmodel.graph.node if n.op_type == "DequantizeLinear" and all(i in inits for i in n.input if i)]
    if not const:
        return qmodel
    used = {i for n in const for i in n.input if i}
    sub = helper.make_graph(
        [onnx.NodeProto.FromString(n.SerializeToString()) for n in const], "constant_dq", [],
        [helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, None) for n in const],
        [inits[i] for i in used],
    )
    sub_model = helper.make_model(sub, opset_imports=qmodel.opset_import, ir_version=qmodel.ir_version)
    values = session(sub_model.SerializeToString(), reference=True).run(None, {})
    folded = onnx.ModelProto()
    folded.CopyFrom(qmodel)
    g = folded.graph
    drop = {n.output[0] for n in const}
    nodes = [n for n in g.node if not (n.op_type == "DequantizeLinear" and n.output[0] in drop)]
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(numpy_helper.from_array(v, n.output[0]) for n, v in zip(const, values))
    drop_unused_initializers(g)
    return folded
