"""Float ONNX -> QDQ int8 ONNX: prepare, analyze, calibrate, rewrite, measure agreement."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from edgekit.errors import ModelError
from edgekit.events import Events
from edgekit.fsutil import atomic_path
from edgekit.modelio import LoadedModel, with_static_inputs
from edgekit.quantize import autorange, dynamic, equalize, rounding, sensitivity, smooth, threshold
from edgekit.quantize import mixed as mixed_precision
from edgekit.quantize.calib import (
    DEFAULT_METHOD,
    DYNAMIC,
    ChannelMeans,
    ElementSample,
    FeedSet,
    Preprocess,
    collect_ranges,
    is_dynamic,
    load_feeds,
    observe,
    parse_method,
    random_feeds,
)
from edgekit.quantize.prepare import checked, prepare
from edgekit.quantize.report import HOST_ESTIMATE, AgreementReport, compare, outputs, session
from edgekit.quantize.rewrite import (
    Analysis,
    QParams,
    analyze,
    float_wide_concats,
    keep_output_float,
    rewrite,
    tensor_params,
)
from edgekit.quantize.scheme import SCHEMES, QuantScheme

__all__ = [
    "SCHEMES", "FeedSet", "Preprocess", "QuantScheme", "QuantizeResult", "analyze_model", "load_feeds",
    "quantize_model", "random_feeds", "save_model",
]  # fmt: skip

# What a quantized model that onnx.checker refuses (a rewrite bug) reports.
_REWRITE_BUG = ("the quantized model failed onnx.checker", "rerun with --exclude on the node named, and report it")


@dataclass
class QuantizeResult:
    model: onnx.ModelProto = field(repr=False)
    scheme: QuantScheme
    method: str
    analysis: Analysis = field(repr=False)
    calibration_source: str
    calibration_samples: int
    calibration_random: bool
    agreement: AgreementReport
    seconds: dict[str, float]
    cached: bool = False  # taken from the quantize cache (quantize.cache), not calibrated again
    layers: list[dict] = field(default_factory=list)  # per int8 node: name, op, snr_db (its local error)
    mixed_precision: dict | None = None  # --max-drop: the decision (mixed.decide), None when not asked
    smoothing: smooth.Smoothing | None = None  # +smooth: the MatMul/Gemm inputs smoothed, None when not asked
    check: threshold.Check | None = None  # the task's metric on the held-out samples against its threshold
    int8_mac_share: float | None = None  # of the model's MACs (Conv/Gemm/MatMul and recurrent), the share that runs int8
    auto_ranges: dict | None = None  # --method auto: how the ranges were chosen (autorange.choose's record)

    def quantization_record(self) -> dict:
        """What a results-store record keeps of the quantization: the per-layer error."""
        return {"layers": self.layers, "method": sensitivity.LOCAL_METHOD, "estimate": True, "measured_on": HOST_ESTIMATE}

    def to_dict(self) -> dict:
        return {
            "scheme": self.scheme.to_dict(),
            "method": self.method,
            "calibration": {
                "source": self.calibration_source,
                "samples": self.calibration_samples,
                "random": self.calibration_random,
            },
            "nodes": self.analysis.summary(),
            "float_nodes": [d.to_dict() for d in self.analysis.float_nodes],
            "agreement": self.agreement.to_dict(),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "cached": self.cached,
            "layers": self.layers,
            "mixed_precision": self.mixed_precision,
            "smoothed": self.smoothing.to_dict() if self.smoothing else None,
            "check": self.check.to_dict() if self.check else None,
            "int8_mac_share": self.int8_mac_share,
            "auto_ranges": self.auto_ranges,
        }


def analyze_model(loaded: LoadedModel, scheme: QuantScheme, exclude: Sequence[str] = (), method: str = DEFAULT_METHOD) -> tuple[onnx.ModelProto, Analysis]:
    if is_dynamic(method):
        # Dynamic quantization needs no shapes: the float model keeps its dynamic input dimensions,
        # or takes the fixed ones when its graph cannot be prepared without them.
        try:
            prepared = prepare(loaded.model, loaded.inputs, scheme.min_opset, fix_inputs=False)
        except ModelError:
            prepared = prepare(loaded.model, loaded.inputs, scheme.min_opset)
        return prepared, dynamic.analyze(prepared, exclude)
    prepared = prepare(loaded.model, loaded.inputs, scheme.min_opset)
    return prepared, analyze(prepared, scheme, exclude)


def quantize_model(loaded: LoadedModel, scheme: QuantScheme, calibration: FeedSet, heldout: FeedSet, **kw) -> QuantizeResult:
    """Quantize ``loaded`` with ``scheme`` (``_quantize_model`` says how). A scheme whose 7-bit
    weights are a speed choice and not a need (``QuantScheme.seven_bit_for_speed``: ekrt on x86
    without VNNI, whose 8-bit kernel is exact too) is tried again with 8-bit weights when its
    held-out check misses the threshold, and the better of the two is returned, its scheme's
    last note saying why."""
    result = _quantize_model(loaded, scheme, calibration, heldout, **kw)
    if not (scheme.seven_bit_for_speed and result.check is not None and not result.check.passed):
        return result
    events = kw.get("events")
    if events is not None:
        events.info(f"7-bit weights missed the held-out check ({result.check.metric} {result.check.value:.4g}): trying 8-bit weights")
    wide = dataclasses.replace(scheme, weight_qmax=127, depthwise_weight_qmax=None, seven_bit_for_speed=False)
    other = _quantize_model(loaded, wide, calibration, heldout, **{**kw, "progress": None})
    a, b = result.check, other.check
    lower_is_better = a.metric == "ctc"
    better = b is not None and (b.passed, -b.value if lower_is_better else b.value) > (a.passed, -a.value if lower_is_better else a.value)
    seconds = {k: result.seconds.get(k, 0.0) + other.seconds.get(k, 0.0) for k in {*result.seconds, *other.seconds}}
    if better:
        note = (f"8-bit weights: with 7-bit ones (ekrt's faster AVX2 GEMM) int8 scored {a.metric} {a.value:.4g} on the held-out "
                f"samples against {b.value:.4g} with 8-bit ones, so ekrt runs its exact 16-bit GEMM")
        if events is not None:
            events.info(note)
        return dataclasses.replace(other, scheme=dataclasses.replace(wide, notes=(*scheme.notes[:-1], note)), seconds=seconds)
    note = f"{scheme.notes[-1]}; 8-bit weights were tried too (held-out check missed: {a.metric} {a.value:.4g} vs {b.value:.4g} with 8-bit) and did no better"
    return dataclasses.replace(result, scheme=dataclasses.replace(scheme, notes=(*scheme.notes[:-1], note)), seconds=seconds)


def _quantize_model(
    loaded: LoadedModel,
    scheme: QuantScheme,
    calibration: FeedSet,
    heldout: FeedSet,
    *,
    method: str = DEFAULT_METHOD,
    exclude: Sequence[str] = (),
    max_drop: float | None = None,
    metric: str | None = None,
    progress=None,
    events=None,
    dynamic_fallback: bool = False,
    runs_float: Callable[[str], str | None] | None = None,
    goal: float | None = None,
    metric_why: str = "",
) -> QuantizeResult:
    """Quantize ``loaded`` with ``scheme``, calibrated on ``calibration``, checked on ``heldout``.

    ``metric`` (None: top1 for class vectors, else cosine) is also what ``result.check`` measures
    on ``heldout`` against ``goal`` (in the metric's unit, see ``threshold``; None: its default),
    ``metric_why`` saying where the metric came from.

    ``max_drop`` (points of ``metric``, see ``mixed``): keep the int8 nodes that cost most in
    float until the held-out metric holds; ``result.mixed_precision`` says whether it did
    (when not, the model is all int8 and the caller refuses or falls back). ``events``: where
    its progress goes (an ``edgekit.events.Events``). ``dynamic_fallback`` (the backend runs
    ``--method dynamic`` models): when ``max_drop`` cannot hold, try the dynamic model, and
    return it if it holds (``mixed_precision["fallback_from"]`` says what static scored).
    ``runs_float(op_type)``: why the backend cannot run such a node in float (None: it can);
    ``max_drop`` keeps float only nodes it can run."""
    recipe = parse_method(method)
    if recipe.ranges == DYNAMIC:
        return _quantize_dynamic(loaded, scheme, calibration, heldout, exclude=exclude, max_drop=max_drop, metric=metric, goal=goal, metric_why=metric_why)
    t0 = time.perf_counter()
    prepared, analysis = analyze_model(loaded, scheme, exclude)
    if recipe.equalize and equalize.cross_layer_equalize(prepared):
        analysis = analyze(prepared, scheme, exclude)  # its constants are the equalized ones
    t1 = time.perf_counter()
    if not analysis.rules:
        raise ModelError(
            "nothing in this model can be quantized with the " + scheme.name + " scheme",
            "deploy it in float with --no-quantize",
        )
    smoothing = smooth.smooth_model(prepared, calibration.feeds, recipe.smooth, scheme, progress) if recipe.smooth is not None else None
    if smoothing and smoothing.smoothed:
        analysis = analyze(prepared, scheme, exclude)  # ranges are calibrated on the smoothed activations
    sample = ElementSample(len(calibration.feeds))
    means = ChannelMeans(equalize.bias_inputs(prepared, analysis)) if recipe.bias != "off" else None
    candidates: dict | None = {} if recipe.ranges == "auto" else None
    learned = rounding.layers(prepared, analysis) if recipe.rounding != "nearest" else []
    ranges = collect_ranges(
        prepared,
        analysis.calibrated,
        calibration.feeds,
        method=recipe.ranges,
        symmetric=scheme.activation_symmetric,
        progress=progress,
        sample=sample,
        means=means,
        candidates=candidates,
        taps=[rounding.Hessians(learned)] if learned else (),
    )
    originals = equalize.clip_weights(prepared, analysis, scheme) if recipe.weight_clip else {}
    # GPTQ after clipping (its scales), before bias correction (which corrects for its integers)
    gptq = rounding.round_layers(learned, scheme, analysis.consts) if learned else {}
    unbiased: dict = {}

    def use_weights(rounded, corrected: bool) -> None:
        """Round the weights as ``rounded`` says ({}: to nearest), the biases corrected for that
        rounding when ``corrected`` (else as they were)."""
        analysis.rounded = dict(rounded)
        equalize.restore_biases(prepared, analysis, unbiased, scheme)
        unbiased.clear()
        if corrected and means is not None:
            unbiased.update(equalize.correct_biases(prepared, analysis, means, scheme, originals))

    use_weights(gptq if recipe.rounding == "gptq" else {}, recipe.bias == "on")
    auto_ranges = None
    if candidates is not None:  # auto: by the error at the outputs (after CLE/clip/bias, on the model that ships)
        float_wide_concats(prepared, analysis, {t: c["minmax"] for t, c in candidates.items()})
        decide = gptq if recipe.rounding == "decide" else None
        ranges, auto_ranges = autorange.choose(
            prepared, analysis, scheme, candidates, calibration.feeds, rounded=decide, use_weights=use_weights, bias=recipe.bias,
        )
    else:
        float_wide_concats(prepared, analysis, ranges)
    t2 = time.perf_counter()
    params = tensor_params(analysis, ranges, scheme)
    qmodel = checked(rewrite(prepared, analysis, params, scheme), *_REWRITE_BUG)
    found = sensitivity.units(prepared, analysis)
    snr = sensitivity.local_snr(qmodel, found, sample)
    layers = [{"name": u.name, "op": u.op, "snr_db": snr[u.name]} for u in found]
    t3 = time.perf_counter()
    seconds = {"prepare": t1 - t0, "calibrate": t2 - t1, "rewrite": t3 - t2}
    decision = None
    if max_drop is not None:
        all_int8 = qmodel
        qmodel, decision = mixed_precision.decide(
            prepared, qmodel, analysis, heldout, snr, max_drop=max_drop, metric=metric, events=events, runs_float=runs_float,
            search_on=None if calibration.random else calibration,
        )
        if not decision["holds"] and dynamic_fallback:
            fallback = _dynamic_fallback(loaded, scheme, calibration, heldout, exclude, max_drop, metric, method, decision, events, goal, metric_why)
            if fallback is not None:
                return fallback
        floats = {x["name"] for x in decision["float_layers"]}
        layers = [x for x in layers if x["name"] not in floats]
        if floats:
            feed = heldout.feeds[0]
            blobs = {"fp32": loaded.model.SerializeToString(), "int8": all_int8.SerializeToString(), "mixed": qmodel.SerializeToString()}
            decision["latency"] = mixed_precision.host_latency(blobs, feed)
        seconds["mixed_precision"] = time.perf_counter() - t3
        t3 = time.perf_counter()
    floats = {x["name"] for x in (decision or {}).get("float_layers", [])}
    agreement, check = _evaluate(loaded, qmodel, heldout, metric, goal, metric_why)
    if check is not None and not check.passed:  # name the layers that err most on the samples it missed on
        held = ElementSample(len(heldout.feeds))
        int8_units = [u for u in found if u.name not in floats]
        for values in observe(prepared, [u.output for u in int8_units], heldout.feeds):
            for name, value in values.items():
                held.add(name, value)
        snr_held = sensitivity.local_snr(qmodel, int8_units, held)
        check = dataclasses.replace(check, worst_layers=threshold.worst([{"name": u.name, "op": u.op, "snr_db": snr_held[u.name]} for u in int8_units]))
    t4 = time.perf_counter()
    return QuantizeResult(
        model=qmodel,
        scheme=scheme,
        method=method,
        analysis=analysis,
        calibration_source=calibration.source,
        calibration_samples=len(calibration.feeds),
        calibration_random=calibration.random,
        agreement=agreement,
        seconds={**seconds, "evaluate": t4 - t3},
        layers=layers,
        mixed_precision=decision,
        smoothing=smoothing,
        check=check,
        int8_mac_share=_mac_share(prepared, loaded, {u.name for u in found} - floats),
        auto_ranges=auto_ranges,
    )


def _evaluate(
    loaded: LoadedModel, qmodel: onnx.ModelProto, heldout: FeedSet, metric: str | None, goal: float | None, metric_why: str
) -> tuple[AgreementReport, threshold.Check | None]:
    """fp32 vs int8 on the held-out samples: the agreement report, and the task metric's check
    (the host's estimate: fp32 by ORT as usual, int8 with Q/DQ reference semantics)."""
    fp32 = outputs(loaded.model.SerializeToString(), False, heldout.feeds)
    int8 = outputs(qmodel.SerializeToString(), True, heldout.feeds)
    agreement = compare(fp32, int8, heldout.labels, source=heldout.source)
    if heldout.random:  # random inputs measure no task (the random calibration has its own loud warning)
        return agreement, None
    return agreement, threshold.check(fp32, int8, metric=metric, threshold=goal, why=metric_why)


def _mac_share(prepared: onnx.ModelProto, loaded: LoadedModel, int8_nodes: set[str]) -> float | None:
    """The share of the model's MACs that its int8 nodes compute: a node left float (an LSTM, a
    layer --max-drop kept float) counts as float."""
    node_macs = sensitivity.macs(with_static_inputs(prepared, loaded.inputs))
    total = sum(node_macs.values())
    return round(sum(v for k, v in node_macs.items() if k in int8_nodes) / total, 4) if total else None


def _quantize_dynamic(
    loaded: LoadedModel, scheme: QuantScheme, calibration: FeedSet, heldout: FeedSet, *, exclude: Sequence[str], max_drop: float | None, metric: str | None,
    goal: float | None = None, metric_why: str = "",
) -> QuantizeResult:
    """``--method dynamic``: int8 weights, activations quantized at run time; no calibration pass.
    No per-layer table (its local error is a calibrated activation range's); ``max_drop`` checks
    the held-out metric and holds or refuses (no layer search)."""
    t0 = time.perf_counter()
    prepared, analysis = analyze_model(loaded, scheme, exclude, DYNAMIC)
    if not any(d.kind == "int8" and d.op_type in dynamic.OPS for d in analysis.decisions):
        raise ModelError(
            "--method dynamic found no MatMul or Gemm with a constant 2-D float weight to make int8",
            "use a static method (e.g. --method auto), or deploy it in float with --no-quantize",
        )
    t1 = time.perf_counter()
    qmodel = checked(dynamic.rewrite(prepared, analysis, scheme), *_REWRITE_BUG)
    t2 = time.perf_counter()
    seconds = {"prepare": t1 - t0, "calibrate": 0.0, "rewrite": t2 - t1}
    decision = None
    if max_drop is not None:
        decision = mixed_precision.check_dynamic(prepared, qmodel, heldout, max_drop=max_drop, metric=metric)
        decision["int8_mac_share"] = _dynamic_mac_share(prepared, analysis, loaded)
        seconds["mixed_precision"] = time.perf_counter() - t2
        t2 = time.perf_counter()
    agreement, check = _evaluate(loaded, qmodel, heldout, metric, goal, metric_why)
    return QuantizeResult(
        model=qmodel, scheme=scheme, method=DYNAMIC, analysis=analysis, calibration_source="none (activations quantized at run time)",
        calibration_samples=0, calibration_random=calibration.random, agreement=agreement,
        seconds={**seconds, "evaluate": time.perf_counter() - t2}, mixed_precision=decision, check=check,
        int8_mac_share=_dynamic_mac_share(prepared, analysis, loaded),
    )


def _dynamic_mac_share(prepared: onnx.ModelProto, analysis: Analysis, loaded: LoadedModel) -> float | None:
    """The share of the model's MACs (Conv/Gemm/MatMul) that run int8 in the dynamic model: a
    fallback that holds by leaving the convolutions float must say how little it quantized."""
    node_macs = sensitivity.macs(with_static_inputs(prepared, loaded.inputs))
    total = sum(node_macs.values())
    int8 = sum(node_macs.get(d.name, 0) for d in analysis.decisions if d.kind == "int8" and d.op_type in dynamic.OPS)
    return round(int8 / total, 4) if total else None


def _dynamic_fallback(
    loaded: LoadedModel, scheme: QuantScheme, calibration: FeedSet, heldout: FeedSet, exclude: Sequence[str], max_drop: float,
    metric: str | None, method: str, static: dict, events, goal: float | None, metric_why: str,
) -> QuantizeResult | None:
    """The ``--method dynamic`` model when static int8 cannot hold ``max_drop`` and it can (None:
    it cannot either, or the model has no MatMul/Gemm weights; ``static`` notes what it scored)."""
    try:
        result = _quantize_dynamic(loaded, scheme, calibration, heldout, exclude=exclude, max_drop=max_drop, metric=metric, goal=goal, metric_why=metric_why)
    except ModelError:
        return None
    mp = result.mixed_precision
    static["dynamic_tried"] = {"before": mp["before"], "holds": mp["holds"]}
    if not mp["holds"]:
        return None
    mp["fallback_from"] = {k: static.get(k) for k in ("before", "after", "tried_float_layers", "judged")} | {"method": method}
    judged = static.get("judged") or {}
    missed = f"; on the held-out samples it did not search on {judged['after']}" if judged.get("missed") else ""
    (events or Events()).warn(
        f"--max-drop {max_drop:g} ({mp['metric']}): static int8 ({method}) cannot hold it ({static['after']} with "
        f"{static['tried_float_layers']} layers float{missed}, needs >= {mp['goal']}); --method {DYNAMIC} does ({mp['before']}): using it"
        + (f", with {mp['int8_mac_share']:.0%} of the MACs int8" if mp.get("int8_mac_share") is not None else "")
    )
    result.seconds["static_mixed_precision"] = static["seconds"]
    return result


def dynamic_dims(model: onnx.ModelProto) -> dict[str, list[str | int]]:
    """The graph inputs with a dimension that is not a number: name -> dims (names or "?" for those)."""
    found = {}
    for i in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in i.type.tensor_type.shape.dim]
        if any(isinstance(d, str) for d in dims):
            found[i.name] = dims
    return found


def with_dynamic_inputs(qmodel: onnx.ModelProto, loaded: LoadedModel, scheme: QuantScheme, exclude: Sequence[str] = ()) -> onnx.ModelProto | None:
    """``qmodel`` (quantized at ``loaded.inputs``' fixed shapes) as a model that keeps the original's
    dynamic input dimensions, with the very same scales; None when the original has none, or
    when the int8 graph cannot be rebuilt on the dynamic one (then the fixed-shape model is it).

    The float model is prepared again with its inputs left dynamic (only shape arithmetic that
    is static in the model itself folds), analysed, and given qmodel's activation scales by
    tensor name; the result must compute what qmodel computes on a sample of the fixed shape."""
    if not dynamic_dims(loaded.model):
        return None
    if any(n.op_type == "DynamicQuantizeLinear" for n in qmodel.graph.node):  # prepared shape-free already, unless its graph needed the fixed shapes
        return qmodel if dynamic_dims(qmodel) else None
    try:
        prepared = prepare(loaded.model, loaded.inputs, scheme.min_opset, fix_inputs=False)
    except ModelError:
        return None
    analysis = analyze(prepared, scheme, exclude)
    inits = {t.name: t for t in qmodel.graph.initializer}
    known: dict[str, QParams] = {}
    for t, src in list(analysis.tensors.items()):
        if src[0] != "own":
            continue
        if f"{t}__scale" not in inits:  # float in qmodel (a wide Concat, a layer kept float): float here
            producer = next((n for n in prepared.graph.node if t in n.output), None)
            if producer is None or producer.op_type != "Concat":
                return None
            keep_output_float(analysis, producer.name, t, "float in the fixed-shape int8 model")
            continue
        known[t] = QParams(onnx.numpy_helper.to_array(inits[f"{t}__scale"]), onnx.numpy_helper.to_array(inits[f"{t}__zp"]))
    params = tensor_params(analysis, {}, scheme, known)
    model = rewrite(prepared, analysis, params, scheme)
    # The int8 constants exactly as qmodel has them: its weights may be GPTQ's integers and its
    # biases corrected (+bias), neither of which this fresh analysis knows.
    for init in model.graph.initializer:
        same = inits.get(init.name)
        if same is not None and init.name.endswith(("__q", "__scale", "__zp")) and list(same.dims) == list(init.dims):
            init.CopyFrom(same)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError:
        return None
    return model


def same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, feed: dict) -> bool:
    """Do two models compute the same outputs (Q/DQ reference semantics) on ``feed``?"""
    try:
        outs = [session(m.SerializeToString(), reference=True).run(None, feed) for m in (a, b)]
    except Exception:
        return False
    return all(x.shape == y.shape and np.allclose(x, y, atol=1e-5, rtol=1e-5) for x, y in zip(*outs))


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """Write atomically: a failure never leaves a partial model at ``path``."""
    with atomic_path(Path(path)) as tmp:
        onnx.save_model(model, str(tmp))
