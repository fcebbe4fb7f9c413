"""edgekit's quantizer against ONNX Runtime's ``quantize_static`` on the real-model catalogue.

Every model of ``tests/realmodels.py`` CATALOGUE (real pretrained models from pinned PyPI wheels,
real inputs built as each model's package prepares them) is quantized by each column's tool from
the same float model (inputs fixed to the package's shapes) and the same calibration samples,
then judged on held-out samples by the model's own task metric (top-1 agreement, mask IoU, CER
increase, detection F1, cosine, speech-probability error) against the fp32 model. Columns:

* ``edgekit``: ``quantize_model`` with the scheme edgekit picks for ONNX Runtime on this host
  (``OnnxRuntimeBackend.quant_scheme``: on x86 uint8 activations; 7-bit weights without VNNI),
  its default ``--method`` (``auto``; ``--edgekit-method`` to change). Time: the whole
  ``quantize_model`` call (preparation, calibration, rewrite, checker, and its held-out check on
  one sample: what never hands out a broken model in silence) and the file write.
* ``edgekit --max-drop`` (``--with-max-drop``): ``edgekit.api.quantize`` with ``max_drop`` and
  ``metric`` set to the model's task goal (``benchmarks/task_metrics.py`` GOAL_AS_MAX_DROP: top-1
  1 point, cosine 0.1, IoU 5, CER 0.2, ...). The search runs on a third sample set of its own
  (seed 2), so the held-out samples that judge it were never tuned on. When it refuses, the row
  says so and names how many layers it tried in float.
* ``edgekit +nearest``: the same with ``+nearest`` (weights rounded to the nearest step: ``auto``
  before it could keep GPTQ's rounding).
* ``ORT default``: ``quant_pre_process`` + ``quantize_static`` with its defaults (QDQ, S8S8,
  per-tensor, MinMax).
* ``ORT best``: ``quantize_static`` with per_channel + reduce_range and each of MinMax /
  Percentile / Entropy; the setting with the best task metric is shown (with its own time).

Every metric runs the int8 model with Q/DQ reference semantics (ORT, graph optimizations off),
never ORT's optimised int8 kernels (which saturate on x86 without VNNI). Latency is ORT's own
(default optimizations, 1 thread, the first held-out sample), fp32 and every int8 model in
interleaved rounds: a host figure, not a device's.

    python benchmarks/quantize_vs_ort.py
    python benchmarks/quantize_vs_ort.py --models ppocr-cls,mtcnn-onet --calib 16 --eval 8
    python benchmarks/quantize_vs_ort.py --json > quantize_vs_ort.json
    python benchmarks/quantize_vs_ort.py --columns edgekit,"ORT default" --repeats 3   # time: median of 3 interleaved

With ``--repeats N`` every column quantizes N times, the columns in turn (edgekit, ORT, edgekit,
ORT, ...), and ``s`` is the median; the metric is the first repeat's (both tools are deterministic).
``edgekit / ORT default`` is the ratio of the two medians.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from realdata import Skip, catalogue  # benchmarks/realdata.py (this script's folder)

from edgekit.bench.stats import Stats
from edgekit.modelio import load_model, onnx_opset, with_static_inputs
from edgekit.quantize import FeedSet, quantize_model, save_model
from edgekit.quantize.calib import DEFAULT_METHOD

SEARCH_SEED = 2  # the --max-drop search's own samples (realmodels: calibration 0, held-out 1)

SCHEMA = 2
LATENCY_WARMUP = 5
LATENCY_ROUNDS = 7  # each round times every session in turn
LATENCY_BUDGET_S = 0.6  # per session, roughly, over all rounds
ORT_BEST = ("MinMax", "Percentile", "Entropy")  # with per_channel=True, reduce_range=True
# ORT's histogram calibrators hold every calibration activation in memory: Entropy on the 800x608
# layout model took > 5 min and 15 GB. Above this many input elements per sample it is skipped.
ENTROPY_MAX_INPUT = 160_000


@dataclass
class Case:
    name: str
    model: object  # realmodels.RealModel
    src: Path  # the float model with static inputs, as every tool gets it
    calib: object  # realmodels.Samples
    heldout: object
    fp32_out: list
    rm: object  # the tests/realmodels.py module
    ort_pre: tuple[Path, float] | None = None  # ORT's pre-processed model and its seconds


@dataclass
class Column:
    path: Path | None = None
    seconds: float | None = None
    setting: str = ""
    score: object = None  # realmodels.Score
    error: str | None = None
    tried: dict = field(default_factory=dict)  # ORT best: setting -> metric value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


# ---------------------------------------------------------------- tools


def host_scheme():
    """The scheme edgekit uses for ONNX Runtime on this machine (what ``edgekit quantize`` picks)."""
    from edgekit.profiles.loader import load_profile, resolve
    from edgekit.targets.onnxruntime import BACKEND

    return BACKEND.quant_scheme(resolve(load_profile("local")))


EDGEKIT_METHOD = DEFAULT_METHOD  # --edgekit-method
REPEATS = 1  # --repeats


def _edgekit(case: Case, out: Path, method: str, scheme=None):
    """``quantize_model`` with ``method`` (and ``scheme``: the host's for ONNX Runtime by default),
    the file written: the result and the seconds both took (its held-out report on one sample: not timed)."""
    loaded = load_model(case.src)
    calib = FeedSet(case.calib.feeds, f"{case.name} calib")
    heldout = FeedSet(case.heldout.feeds[:1], f"{case.name} held-out")
    t0 = time.perf_counter()
    result = quantize_model(loaded, scheme or host_scheme(), calib, heldout, method=method)
    save_model(result.model, out)
    return result, time.perf_counter() - t0


def edgekit_default(case: Case, out: Path) -> Column:
    result, seconds = _edgekit(case, out, EDGEKIT_METHOD)
    rounding = ((result.auto_ranges or {}).get("rounding") or {}).get("chosen")
    weights = f", {rounding} weights (auto's choice)" if rounding else ""
    bias = (result.auto_ranges or {}).get("bias")
    weights += (", biases corrected (auto's choice)" if bias["chosen"] else ", biases as they were (auto's choice)") if bias else ""
    return Column(out, seconds, f"{EDGEKIT_METHOD}, {host_scheme().activation_dtype} activations{weights}")


def _edgekit_with(case: Case, out: Path, option: str) -> Column:
    method = f"{EDGEKIT_METHOD}+{option}"
    return Column(out, _edgekit(case, out, method)[1], method)


def edgekit_nearest(case: Case, out: Path) -> Column:
    """``edgekit`` with ``+nearest``: every weight rounded to its nearest step (``auto`` as it was
    before it could choose GPTQ's rounding): what that choice adds, in the same run."""
    return _edgekit_with(case, out, "nearest")


def edgekit_nobias(case: Case, out: Path) -> Column:
    """``edgekit`` with ``+nobias``: the biases as the float model has them (``auto`` as it was
    before it could choose to correct them): what that choice adds, in the same run."""
    return _edgekit_with(case, out, "nobias")


def _native(case: Case, out: Path, avx2: bool) -> Column:
    from edgekit.quantize import SCHEMES

    if avx2:
        from ekrt_threads import native_avx2_scheme  # benchmarks/ekrt_threads.py

        scheme = native_avx2_scheme()
    else:
        scheme = SCHEMES["native"]
    seconds = _edgekit(case, out, EDGEKIT_METHOD, scheme)[1]
    weights = "7-bit GEMM weights, 8-bit depthwise" if avx2 else "8-bit weights"
    return Column(out, seconds, f"{EDGEKIT_METHOD}, ekrt's scheme: int8 activations, {weights}")


def ekrt_scheme(case: Case, out: Path) -> Column:
    """edgekit's default for ekrt (int8 activations, 8-bit weights: VNNI, AMX, ARM)."""
    return _native(case, out, avx2=False)


def ekrt_avx2_scheme(case: Case, out: Path) -> Column:
    """edgekit's default for ekrt on an x86 CPU without VNNI: 7-bit weights where ekrt runs a GEMM
    (its VPMADDUBSW kernel), 8-bit on depthwise convolutions. What the speed of that kernel costs."""
    return _native(case, out, avx2=True)


def edgekit_max_drop(case: Case, out: Path) -> Column:
    """``edgekit quantize --max-drop X --metric M`` at the model's task goal, through the public API
    with the samples written as folders of one .npz per sample (what ``--calib``/``--eval`` read);
    the search's samples are a set of their own (seed 2), not the held-out ones that judge it."""
    from task_metrics import GOAL_AS_MAX_DROP

    from edgekit import api
    from edgekit.errors import GateError

    def folder(which: str, samples) -> Path:
        d = out.parent / which
        d.mkdir(exist_ok=True)
        for i, feed in enumerate(samples.feeds):
            np.savez(d / f"{i:04d}.npz", **feed)
        return d

    metric, points = GOAL_AS_MAX_DROP[case.name]
    search = case.model.build(case.model, len(case.heldout.feeds), SEARCH_SEED)
    calib, tune = folder("calib", case.calib), folder("search", search)
    setting = f"--max-drop {points:g} --metric {metric.rsplit('/', 1)[-1]}"  # a module metric: its file name
    os.environ["EDGEKIT_CACHE_DIR"] = str(out.parent / "cache")  # quantized here, never an earlier run's cached model
    t0 = time.perf_counter()
    try:
        result = api.quantize(case.src, out, target="local", backend="onnxruntime", method=EDGEKIT_METHOD, calib=calib, eval=tune,
                              max_drop=points, metric=metric)
    except GateError as exc:
        return Column(None, time.perf_counter() - t0, setting, error=f"refused: {_first_line(exc).split(': ', 1)[-1]}")
    mp = result.mixed_precision or {}
    floats = len(mp.get("float_layers") or ())
    share = mp.get("int8_mac_share")
    how = f"; {floats} layers float" if "fallback_from" not in mp else f"; static refused ({mp['fallback_from']['after']}), --method dynamic held"
    return Column(out, time.perf_counter() - t0, setting + how + (f", {share:.0%} of MACs int8" if share is not None else ""))


class _Reader:
    """ORT CalibrationDataReader over a list of feeds (duck-typed: get_next, rewind)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self.feeds, self.i = feeds, 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        self.i += 1
        return self.feeds[self.i - 1] if self.i <= len(self.feeds) else None

    def rewind(self) -> None:
        self.i = 0


def _ort_input(case: Case) -> tuple[Path, float]:
    """ORT's recommended pre-processing (and opset 13, which per-channel weights need and ORT's
    quantizer doesn't do itself), run once per model: (its output, its seconds). Falls back to
    skip_symbolic_shape=True where ORT's symbolic shape inference rejects the graph, as its docs
    suggest (the failed attempt is not timed)."""
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if case.ort_pre is None:
        pre = case.src.with_name("ort_pre.onnx")
        for kwargs in ({}, {"skip_symbolic_shape": True}):
            t0 = time.perf_counter()
            src = case.src
            if onnx_opset(onnx.load(str(src))) < 13:
                src = case.src.with_name("opset13.onnx")
                onnx.save_model(version_converter.convert_version(onnx.load(str(case.src)), 13), str(src))
            try:
                quant_pre_process(str(src), str(pre), **kwargs)
            except Exception:
                if kwargs:
                    raise
                continue
            case.ort_pre = (pre, time.perf_counter() - t0)
            break
    return case.ort_pre


def _quantize_static(src: Path, out: Path, feeds, **kw) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    CalibrationDataReader.register(_Reader)
    with contextlib.redirect_stdout(sys.stderr):  # its entropy calibrator prints progress
        quantize_static(str(src), str(out), _Reader(feeds), quant_format=QuantFormat.QDQ, **kw)


def ort_default(case: Case, out: Path) -> Column:
    pre, pre_s = _ort_input(case)
    t0 = time.perf_counter()
    _quantize_static(pre, out, case.calib.feeds)
    return Column(out, pre_s + time.perf_counter() - t0, "defaults: S8S8, per-tensor, MinMax")


def ort_best(case: Case, out: Path) -> Column:
    from onnxruntime.quantization import CalibrationMethod

    best: Column | None = None
    tried = {}
    pre, pre_s = _ort_input(case)
    size = sum(int(np.prod(v.shape)) for v in case.calib.feeds[0].values())
    for method in ORT_BEST:
        if method == "Entropy" and size > ENTROPY_MAX_INPUT:
            tried[method] = f"skipped: input of {size} elements > {ENTROPY_MAX_INPUT} (memory)"
            continue
        path = out.with_name(f"{out.stem}.{method}.onnx")
        t0 = time.perf_counter()
        try:
            _quantize_static(pre, path, case.calib.feeds, per_channel=True, reduce_range=True,
                             calibrate_method=getattr(CalibrationMethod, method),
                             # bounded memory for the histograms; MinMax as ORT's default runs it
                             # (chunked MinMax raises "No data is collected" when the chunks divide the set)
                             extra_options={} if method == "MinMax" else {"CalibMaxIntermediateOutputs": 4})
        except Exception as exc:
            tried[method] = _first_line(exc)
            continue
        col = Column(path, pre_s + time.perf_counter() - t0, f"per_channel, reduce_range, {method}")
        col.score = case.model.metric(case.fp32_out, case.rm.run_outputs(path, case.heldout.feeds), case.heldout)
        tried[method] = col.score.value
        if best is None or _better(col.score, best.score):
            best = col
    if best is None:
        raise RuntimeError("; ".join(f"{k}: {v}" for k, v in tried.items()))
    best.tried = tried
    return best


def _better(a, b) -> bool:
    return a.value > b.value if a.higher_is_better else a.value < b.value


# The columns, in order: name -> tool(case, output path) -> Column. A tool that fails on a model
# shows its error in that row.
COLUMNS: dict[str, Callable[[Case, Path], Column]] = {
    "edgekit": edgekit_default,
    "edgekit +nearest": edgekit_nearest,
    "edgekit +nobias": edgekit_nobias,
    "ORT default": ort_default,
    "ORT best": ort_best,
    "ekrt": ekrt_scheme,  # --columns ekrt,"ekrt AVX2": ekrt's schemes (not in the default set)
    "ekrt AVX2": ekrt_avx2_scheme,
}
DEFAULT_COLUMNS = ("edgekit", "edgekit +nearest", "ORT default", "ORT best")


# ---------------------------------------------------------------- measuring


def _session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def latency_p50_ms(paths: dict[str, Path], feed: dict[str, np.ndarray]) -> dict[str, float]:
    """p50 (ms) per model over rounds that run every session in turn, on one fixed input."""
    sessions = {k: _session(p) for k, p in paths.items()}
    per_call = {}
    for k, s in sessions.items():
        t0 = time.perf_counter()
        for _ in range(LATENCY_WARMUP):
            s.run(None, feed)
        per_call[k] = (time.perf_counter() - t0) / LATENCY_WARMUP
    iters = {k: int(min(200, max(2, LATENCY_BUDGET_S / LATENCY_ROUNDS / max(t, 1e-6)))) for k, t in per_call.items()}
    samples: dict[str, list[int]] = {k: [] for k in sessions}
    for _ in range(LATENCY_ROUNDS):
        for k, s in sessions.items():
            for _ in range(iters[k]):
                t = time.perf_counter_ns()
                s.run(None, feed)
                samples[k].append(time.perf_counter_ns() - t)
    return {k: Stats.from_samples(v).p50 for k, v in samples.items()}


def bench_model(name: str, n_calib: int, n_eval: int, columns: dict, log: Callable[[str], None], repeats: int = 1) -> dict:
    model, rm = catalogue(name)
    path = model.locate()
    with tempfile.TemporaryDirectory(prefix="ek-vs-ort-") as tmp:
        work = Path(tmp)
        src = work / "fp32.onnx"
        loaded = load_model(path, {k: v for k, v in model.inputs.items() if v})
        onnx.save_model(with_static_inputs(loaded.model, loaded.inputs), str(src))
        log(f"{name}: {n_calib} calibration + {n_eval} held-out samples")
        calib, heldout = model.calib(n_calib), model.eval(n_eval)
        case = Case(name, model, src, calib, heldout, rm.run_outputs(src, heldout.feeds), rm)
        cols: dict[str, Column] = {}
        times: dict[str, list[float]] = {col: [] for col in columns}
        for rep in range(repeats):
            for col, tool in columns.items():
                if col in cols and cols[col].error:
                    continue
                log(f"{name}: {col}" + (f" ({rep + 1}/{repeats})" if repeats > 1 else ""))
                sub = work / col.replace(" ", "_") / str(rep)
                sub.mkdir(parents=True)
                case.ort_pre = None  # every repeat times ORT's pre-processing too
                try:
                    c = tool(case, sub / "int8.onnx")
                    if rep == 0 and c.score is None and c.error is None:
                        c.score = model.metric(case.fp32_out, rm.run_outputs(c.path, heldout.feeds), heldout)
                except Exception as exc:  # one tool failing on one model doesn't stop the others
                    c = Column(error=_first_line(exc))
                if c.seconds is not None:
                    times[col].append(c.seconds)
                if rep == 0:
                    cols[col] = c
        for col, c in cols.items():
            if times[col]:
                c.seconds = float(np.median(times[col]))
        log(f"{name}: latency, 1 thread")
        ok = {k: c.path for k, c in cols.items() if c.path is not None}
        p50 = latency_p50_ms({"fp32": src, **ok}, heldout.feeds[0])
        return {
            "model": name,
            "family": model.family,
            "origin": f"{model.dist} {model.version}: {model.file}",
            "data": model.data,
            "fp32": {"size_bytes": path.stat().st_size, "latency_p50_ms": p50["fp32"]},
            "edgekit_over_ort_default": _ratio(cols, "edgekit", "ORT default"),
            "metric": next(({"name": c.score.name, "goal": c.score.goal, "higher_is_better": c.score.higher_is_better}
                             for c in cols.values() if c.score), {"name": None, "goal": None, "higher_is_better": True}),
            "columns": {
                k: {
                    "error": c.error,
                    "setting": c.setting,
                    "quantize_s": c.seconds,
                    "quantize_s_repeats": times[k],
                    "size_bytes": c.path.stat().st_size if c.path else None,
                    "metric": None if c.score is None else c.score.value,
                    "meets_goal": None if c.score is None else c.score.meets_goal,
                    "detail": None if c.score is None else c.score.detail,
                    "tried": c.tried or None,
                    "latency_p50_ms": p50.get(k),
                }
                for k, c in cols.items()
            },
        }


def _ratio(cols: dict[str, Column], a: str, b: str) -> float | None:
    x, y = cols.get(a), cols.get(b)
    return x.seconds / y.seconds if x and y and x.seconds and y.seconds and not (x.error or y.error) else None


# ---------------------------------------------------------------- output


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _missing() -> dict:
    """A column a --from-json document did not run."""
    return {"error": "not run", "setting": None, "metric": None, "meets_goal": False, "quantize_s": None, "size_bytes": None, "latency_p50_ms": None}


def markdown(results: list[dict], columns: list[str]) -> str:
    head = ["model (family)", "metric (goal)", "fp32 ms"]
    for c in columns:
        head += [f"{c}: metric", "s", "KB", "ms"]
    ratio = "edgekit" in columns and "ORT default" in columns
    head += ["edgekit / ORT default s"] if ratio else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        m = r["metric"]
        goal = "-" if m["goal"] is None else f"{'≥' if m['higher_is_better'] else '≤'} {m['goal']:g}"
        row = [f"{r['model']} ({r['family']})", f"{m['name']} ({goal})", _fmt(r["fp32"]["latency_p50_ms"], ".2f")]
        for c in columns:
            col = r["columns"][c]
            if col["error"]:
                row += [f"fails: {col['error'][:60]}", "-", "-", "-"]  # the whole error is in the JSON
                continue
            mark = "" if col["meets_goal"] else " ✗"
            row += [_fmt(col["metric"], ".5f" if "cosine" in m["name"] else ".3f") + mark, _fmt(col["quantize_s"], ".2f"),
                    _fmt(col["size_bytes"] / 1024, ".0f"), _fmt(col["latency_p50_ms"], ".2f")]
        row += [_fmt(r["edgekit_over_ort_default"], ".2f")] if ratio else []
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def notes(results: list[dict]) -> list[str]:
    out = []
    for r in results:
        best = r["columns"].get("ORT best", {})
        if best.get("tried"):
            out.append(f"{r['model']}: ORT best = {best['setting']}; tried " +
                       ", ".join(f"{k} {v if isinstance(v, str) else format(v, '.4f')}" for k, v in best["tried"].items()))
        for k, col in r["columns"].items():
            if k == "edgekit --max-drop":
                out.append(f"{r['model']} {k}: {col['setting']}" + (f" ({col['error']})" if col["error"] else ""))
            d = col.get("detail") or {}
            if d:
                out.append(f"{r['model']} {k}: " + ", ".join(f"{a} {b:.4g}" if isinstance(b, float) else f"{a} {b}" for a, b in d.items()))
    return out


def environment(n_calib: int, n_eval: int) -> dict:
    import onnxruntime

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    scheme = host_scheme()
    return {
        "python": platform.python_version(), "machine": platform.machine(), "edgekit": version("edgekit"),
        "onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "numpy": np.__version__,
        "edgekit_scheme": {"activation_dtype": scheme.activation_dtype, "weight_qmax": scheme.weight_qmax},
        "calibration_samples": n_calib, "heldout_samples": n_eval, "repeats": REPEATS,
        "latency": {"threads": 1, "warmup": LATENCY_WARMUP, "rounds": LATENCY_ROUNDS, "budget_s": LATENCY_BUDGET_S},
    }


def main(argv: list[str] | None = None) -> int:
    from realdata import catalogue_names

    names_all = catalogue_names()
    ap = argparse.ArgumentParser(
        description="edgekit quantizer vs onnxruntime quantize_static on real pretrained models, by task metric.",
        epilog="example: python benchmarks/quantize_vs_ort.py --models ppocr-cls,mtcnn-onet",
    )
    ap.add_argument("--models", default=",".join(names_all), help=f"comma-separated, from: {', '.join(names_all)} (default: all)")
    ap.add_argument("--calib", type=int, default=16, help="calibration samples (default 16)")
    ap.add_argument("--eval", type=int, default=8, help="held-out samples for the metric (default 8)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--columns", default=",".join(DEFAULT_COLUMNS),
                    help=f"comma-separated, from: {', '.join(COLUMNS)} (default: {', '.join(DEFAULT_COLUMNS)})")
    ap.add_argument("--with-max-drop", action="store_true", help="add the column 'edgekit --max-drop' at each model's task goal")
    ap.add_argument("--repeats", type=int, default=1, help="quantize N times per column, interleaved; s is the median (default 1)")
    ap.add_argument("--edgekit-method", default=DEFAULT_METHOD, help=f"edgekit's --method (default {DEFAULT_METHOD})")
    ap.add_argument("--from-json", nargs="+", metavar="FILE", help="print the table of earlier --json runs (their models in order; nothing is run)")
    args = ap.parse_args(argv)
    if args.from_json:
        docs = [json.loads(Path(f).read_text()) for f in args.from_json]
        columns = list(dict.fromkeys(c for d in docs for c in d["columns"]))
        results = [{**r, "columns": {c: r["columns"].get(c) or _missing() for c in columns}} for d in docs for r in d["models"]]
        for d, f in zip(docs, args.from_json):
            e = d["environment"]
            print(f"{f}: edgekit {e['edgekit']} vs onnxruntime {e['onnxruntime']}, {e['machine']}; {e['calibration_samples']} calibration / "
                  f"{e['heldout_samples']} held-out samples")
        print()
        print(markdown(results, columns))
        for line in notes(results):
            print("note: " + line)
        return 0
    global EDGEKIT_METHOD, REPEATS
    EDGEKIT_METHOD, REPEATS = args.edgekit_method, args.repeats
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in names_all]
    if unknown or not names:
        print(f"error: unknown model(s): {', '.join(unknown) or '(none given)'}\nhint: choose from {', '.join(names_all)}", file=sys.stderr)
        return 2
    if args.calib < 1 or args.eval < 1 or args.repeats < 1:
        print("error: --calib, --eval and --repeats must be at least 1\nhint: e.g. --calib 16 --eval 8 --repeats 3", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(logging.ERROR)  # ORT's quantizer logs advice at WARNING on the root logger
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    columns = {c: COLUMNS[c] for c in (x.strip() for x in args.columns.split(",")) if c in COLUMNS}
    if args.with_max_drop:
        columns["edgekit --max-drop"] = edgekit_max_drop

    def log(msg: str) -> None:
        print(f"[quantize_vs_ort] {msg}", file=sys.stderr, flush=True)

    results, skipped = [], []
    for name in names:
        try:
            results.append(bench_model(name, args.calib, args.eval, columns, log, args.repeats))
        except Skip as exc:
            skipped.append({"model": name, "reason": str(exc)})
    env = environment(args.calib, args.eval)
    if args.json:
        print(json.dumps({"schema": SCHEMA, "benchmark": "quantize_vs_ort", "environment": env, "columns": list(columns),
                          "models": results, "skipped": skipped}, indent=2, default=str))
        return 0
    print(f"edgekit {env['edgekit']} vs onnxruntime {env['onnxruntime']}, {platform.machine()}; "
          f"{args.calib} calibration / {args.eval} held-out samples; metric: Q/DQ reference semantics vs fp32; "
          "s = quantize wall time, KB = int8 file, ms = ORT latency p50, 1 thread (host); ✗ = misses the goal\n")
    print(markdown(results, list(columns)))
    for line in notes(results):
        print("note: " + line)
    for s in skipped:
        print(f"skipped {s['model']}: {s['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
