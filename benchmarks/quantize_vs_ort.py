"""edgekit's quantizer against ONNX Runtime's ``quantize_static``, on the same models and data.

For each model both quantizers get the same float model (with its inputs' shapes fixed), the
same calibration feeds and the same held-out feeds, and the same target format: QDQ, int8
activations (asymmetric), int8 per-channel symmetric weights, MinMax calibration. The script
prints, side by side:

* quantize wall time, median of ``--repeats`` runs. edgekit: ``quantize_model`` (graph
  preparation, calibration, rewrite, ``onnx.checker``) minus its own held-out evaluation, plus
  writing the file. ORT: ``quant_pre_process`` (its recommended pre-processing, on by default)
  plus ``quantize_static`` writing the file.
* int8 model size on disk, and the number of QuantizeLinear/DequantizeLinear nodes.
* fp32-vs-int8 agreement on the held-out set, both measured by edgekit's own
  ``measure_agreement``: cosine, SNR (dB), top-1 agreement, accuracy against labels.
* inference latency p50 in ONNX Runtime, 1 thread, the same input, for fp32 and both int8
  models (sessions interleaved in rounds so machine drift hits all three alike).

Machines are noisy: only medians and ratios (edgekit / ORT) are shown.

    python benchmarks/quantize_vs_ort.py
    python benchmarks/quantize_vs_ort.py --models digits,mobilenetv2 --repeats 5
    python benchmarks/quantize_vs_ort.py --json > quantize_vs_ort.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from realdata import ROOT, Skip, rapidocr_cls  # benchmarks/realdata.py (this script's folder)

from edgekit.bench.stats import Stats
from edgekit.modelio import LoadedModel, load_model, onnx_opset, with_static_inputs
from edgekit.quantize import SCHEMES, FeedSet, load_feeds, quantize_model, save_model
from edgekit.quantize.report import AgreementReport, measure_agreement

SCHEMA = 1
CLS_CALIB, CLS_HELDOUT = 200, 100  # as examples/real/make_data.py
CLS_CALIB_SEED, CLS_HELDOUT_SEED = 0, 1
LATENCY_WARMUP = 20
LATENCY_ROUNDS = 15  # each round times every session once, in turn
LATENCY_BUDGET_S = 1.5  # per session, roughly, over all rounds
PAR = 0.10  # ratios within 1 +- PAR are "on par" (noise on a shared machine)


@dataclass
class Case:
    name: str
    loaded: LoadedModel
    calib: FeedSet
    heldout: FeedSet
    origin: str


# ---------------------------------------------------------------- models


def _example(folder: str, stem: str) -> Callable[[], Case]:
    def load() -> Case:
        path = ROOT / "examples" / folder / f"{stem}.onnx"
        if not path.is_file():
            raise Skip(f"{path} not found")
        loaded = load_model(path)
        side = loaded.sidecar
        if side.calibration is None or side.evaluation is None:
            raise Skip(f"{side.path or path}: sidecar names no calibration/evaluation data")
        calib = load_feeds(side.calibration, loaded.inputs)
        heldout = load_feeds(side.evaluation, loaded.inputs, labels=side.labels)
        return Case(folder, loaded, calib, heldout, str(path.relative_to(ROOT)))

    return load


def _ppocr_cls() -> Case:
    realmodels, path = rapidocr_cls()
    try:
        import sklearn  # noqa: F401  (realmodels needs its bundled sample photos)
    except ImportError:
        raise Skip("scikit-learn is not installed (the input photos); pip install scikit-learn") from None
    shape = (1, *realmodels.CLS_SHAPE)
    loaded = load_model(path, {"x": shape})
    name = loaded.inputs[0].name
    xc, _ = realmodels.cls_dataset(CLS_CALIB, CLS_CALIB_SEED)
    xh, labels = realmodels.cls_dataset(CLS_HELDOUT, CLS_HELDOUT_SEED)
    calib = FeedSet([{name: x[None]} for x in xc], f"cls_dataset({CLS_CALIB}, seed={CLS_CALIB_SEED})")
    heldout = FeedSet(
        [{name: x[None]} for x in xh], f"cls_dataset({CLS_HELDOUT}, seed={CLS_HELDOUT_SEED})", labels=labels
    )
    dist = realmodels.RAPIDOCR_DIST
    return Case("ppocr-cls", loaded, calib, heldout, f"{dist} {importlib.metadata.version(dist)}: {path.name}")


MODELS: dict[str, Callable[[], Case]] = {
    "digits": _example("digits", "digits_cnn"),
    "mobilenetv2": _example("mobilenetv2", "mobilenetv2"),
    "ppocr-cls": _ppocr_cls,
}


# ---------------------------------------------------------------- quantizers


@dataclass
class Quantized:
    path: Path
    times: list[float] = field(default_factory=list)  # seconds, one per repeat
    pre_times: list[float] = field(default_factory=list)  # ORT: the share of pre_steps
    pre_steps: list[str] = field(default_factory=list)  # ORT: what ran before quantize_static
    agreement: AgreementReport | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    def qdq_nodes(self) -> int:
        model = onnx.load(str(self.path))
        return sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def run_edgekit(case: Case, out: Path, repeats: int) -> Quantized:
    q = Quantized(out)
    scheme = SCHEMES["onnxruntime"]
    for i in range(repeats + 1):  # run 0 is an untimed warm-up (imports, caches)
        t0 = time.perf_counter()
        result = quantize_model(case.loaded, scheme, case.calib, case.heldout, method="minmax")
        save_model(result.model, out)
        if i:
            q.times.append(time.perf_counter() - t0 - result.seconds["evaluate"])
        q.agreement = result.agreement
    return q


class _Reader:
    """ORT CalibrationDataReader over a list of feeds (duck-typed: get_next, rewind)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self.feeds = feeds
        self.i = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def rewind(self) -> None:
        self.i = 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    if not text:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        return f"{tb.tb_frame.f_code.co_name}" if tb is not None else "no message"
    return text.splitlines()[0][:160]


def run_ort(case: Case, out: Path, repeats: int, preprocess: bool) -> Quantized:
    from onnx import version_converter
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    CalibrationDataReader.register(_Reader)
    q = Quantized(out)
    static = with_static_inputs(case.loaded.model, case.loaded.inputs)  # the shapes edgekit uses
    src = out.with_name(out.stem + ".float.onnx")
    onnx.save_model(static, str(src))
    upgraded = out.with_name(out.stem + ".opset13.onnx")
    pre = out.with_name(out.stem + ".pre.onnx")
    opset = onnx_opset(static)
    if opset < 13:
        q.notes.append(
            f"model is opset {opset}: ORT gets it upgraded to 13 (onnx.version_converter, in ORT's time): "
            "per-channel DequantizeLinear needs opset 13 and ORT's quantizer doesn't upgrade "
            "(edgekit does, in its own time)"
        )
    # ORT's symbolic shape inference rejects some real graphs; then do what its docs suggest
    # (skip_symbolic_shape=True) and say so. The failed attempt is not timed.
    pre_kwargs: dict | None = {} if preprocess else None
    q.pre_steps = [f"opset {opset}->13"] * (opset < 13) + ["quant_pre_process"] * preprocess
    for i in range(repeats + 1):  # run 0 is an untimed warm-up (imports, caches)
        t0 = time.perf_counter()
        model_in = src
        if opset < 13:
            onnx.save_model(version_converter.convert_version(onnx.load(str(src)), 13), str(upgraded))
            model_in = upgraded
        if pre_kwargs is not None:
            try:
                quant_pre_process(str(model_in), str(pre), **pre_kwargs)
            except Exception as exc:
                if pre_kwargs:
                    raise
                q.notes.append(
                    f"ORT quant_pre_process failed ({type(exc).__name__} in symbolic shape inference"
                    f"{': ' + _first_line(exc) if str(exc).strip() else ''}); used skip_symbolic_shape=True"
                )
                pre_kwargs = {"skip_symbolic_shape": True}
                t0 = time.perf_counter()
                if opset < 13:
                    onnx.save_model(version_converter.convert_version(onnx.load(str(src)), 13), str(upgraded))
                quant_pre_process(str(model_in), str(pre), **pre_kwargs)
            model_in = pre
        t1 = time.perf_counter()
        quantize_static(
            str(model_in),
            str(out),
            _Reader(case.calib.feeds),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
            calibrate_method=CalibrationMethod.MinMax,
        )
        t2 = time.perf_counter()
        if i:
            q.times.append(t2 - t0)
            q.pre_times.append(t1 - t0)
    q.agreement = measure_agreement(case.loaded.model.SerializeToString(), out.read_bytes(), case.heldout)
    return q


# ---------------------------------------------------------------- latency


def _session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def latency_p50_ms(paths: dict[str, Path], feed: dict[str, np.ndarray]) -> dict[str, float]:
    """p50 (ms) per model over rounds that run every session in turn, on one fixed input."""
    sessions = {k: _session(p) for k, p in paths.items()}
    per_call = {}
    for k, s in sessions.items():
        for _ in range(LATENCY_WARMUP):
            s.run(None, feed)
        t0 = time.perf_counter()
        for _ in range(LATENCY_WARMUP):
            s.run(None, feed)
        per_call[k] = (time.perf_counter() - t0) / LATENCY_WARMUP
    iters = {k: int(min(1000, max(5, LATENCY_BUDGET_S / LATENCY_ROUNDS / max(t, 1e-6)))) for k, t in per_call.items()}
    samples: dict[str, list[int]] = {k: [] for k in sessions}
    for _ in range(LATENCY_ROUNDS):
        for k, s in sessions.items():
            run = s.run
            for _ in range(iters[k]):
                t = time.perf_counter_ns()
                run(None, feed)
                samples[k].append(time.perf_counter_ns() - t)
    return {k: Stats.from_samples(v).p50 for k, v in samples.items()}


# ---------------------------------------------------------------- one model


def _main_output(rep: AgreementReport):
    """The class-vector output if there is one (top-1, accuracy), else the first output."""
    return next((o for o in rep.outputs if o.top1 is not None), rep.outputs[0])


def _agreement(rep: AgreementReport) -> dict:
    o = _main_output(rep)
    return {
        "output": o.name,
        "cosine": o.cosine,
        "snr_db": None if o.snr_db == float("inf") else o.snr_db,
        "top1_agreement": o.top1,
        "accuracy": rep.accuracy_int8,
        "samples": rep.samples,
    }


def bench_model(case: Case, repeats: int, preprocess: bool, log: Callable[[str], None]) -> dict:
    with tempfile.TemporaryDirectory(prefix="ek-vs-ort-") as tmp:
        tmp = Path(tmp)
        # fp32 latency on the model with the same fixed input shapes the int8 models have.
        fp32 = tmp / "fp32.onnx"
        onnx.save_model(with_static_inputs(case.loaded.model, case.loaded.inputs), str(fp32))
        log(f"{case.name}: edgekit quantize x{repeats}")
        ek = run_edgekit(case, tmp / "edgekit.onnx", repeats)
        log(f"{case.name}: onnxruntime quantize_static x{repeats}")
        ort_q = run_ort(case, tmp / "ort.onnx", repeats, preprocess)
        log(f"{case.name}: latency, 1 thread")
        feed = case.heldout.feeds[0]
        p50 = latency_p50_ms({"fp32": fp32, "edgekit": ek.path, "onnxruntime": ort_q.path}, feed)
        ek_agree, ort_agree = _agreement(ek.agreement), _agreement(ort_q.agreement)
        return {
            "model": case.name,
            "origin": case.origin,
            "inputs": {i.name: list(i.shape) for i in case.loaded.inputs},
            "calibration_samples": len(case.calib.feeds),
            "heldout_samples": len(case.heldout.feeds),
            "labels": case.heldout.labels is not None,
            "fp32": {
                "size_bytes": case.loaded.path.stat().st_size,
                "accuracy": ek.agreement.accuracy_fp32,
                "latency_p50_ms": p50["fp32"],
            },
            "edgekit": {
                "quantize_s": statistics.median(ek.times),
                "quantize_s_runs": ek.times,
                "size_bytes": ek.size,
                "qdq_nodes": ek.qdq_nodes(),
                **ek_agree,
                "latency_p50_ms": p50["edgekit"],
            },
            "onnxruntime": {
                "quantize_s": statistics.median(ort_q.times),
                "quantize_s_runs": ort_q.times,
                "pre_process_s": statistics.median(ort_q.pre_times) if ort_q.pre_steps else None,
                "pre_process_steps": ort_q.pre_steps,
                "size_bytes": ort_q.size,
                "qdq_nodes": ort_q.qdq_nodes(),
                **ort_agree,
                "latency_p50_ms": p50["onnxruntime"],
            },
            "notes": ek.notes + ort_q.notes,
        }


# ---------------------------------------------------------------- output


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _fmt(v, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def _delta(a, b, spec: str, suffix: str = "") -> str:
    return "-" if a is None or b is None else format(a - b, "+" + spec) + suffix


def rows(r: dict) -> list[tuple[str, str, str, str, str]]:
    f, e, o = r["fp32"], r["edgekit"], r["onnxruntime"]
    pct = lambda v: None if v is None else 100 * v  # noqa: E731
    ms = lambda v: _fmt(v, ".3f")  # noqa: E731
    out = [
        ("quantize time, median (s)", "-", _fmt(e["quantize_s"], ".3f"), _fmt(o["quantize_s"], ".3f"),
         _fmt(_ratio(e["quantize_s"], o["quantize_s"]), ".2f", "x")),
    ]
    if o["pre_process_s"] is not None:
        out.append((f"  of which {' + '.join(o['pre_process_steps'])} (s)", "-", "-", _fmt(o["pre_process_s"], ".3f"), "-"))
    out += [
        ("model size (KB)", _fmt(f["size_bytes"] / 1024, ".1f"), _fmt(e["size_bytes"] / 1024, ".1f"),
         _fmt(o["size_bytes"] / 1024, ".1f"), _fmt(_ratio(e["size_bytes"], o["size_bytes"]), ".2f", "x")),
        ("Q/DQ nodes", "0", str(e["qdq_nodes"]), str(o["qdq_nodes"]), _delta(e["qdq_nodes"], o["qdq_nodes"], "d")),
        ("cosine vs fp32", "-", _fmt(e["cosine"], ".5f"), _fmt(o["cosine"], ".5f"),
         _delta(e["cosine"], o["cosine"], ".5f")),
        ("SNR vs fp32 (dB)", "-", _fmt(e["snr_db"], ".1f"), _fmt(o["snr_db"], ".1f"), _delta(e["snr_db"], o["snr_db"], ".1f", " dB")),
        ("top-1 agreement (%)", "-", _fmt(pct(e["top1_agreement"]), ".1f"), _fmt(pct(o["top1_agreement"]), ".1f"),
         _delta(pct(e["top1_agreement"]), pct(o["top1_agreement"]), ".1f", " pt")),
    ]
    if r["labels"]:
        out.append(("accuracy vs labels (%)", _fmt(pct(f["accuracy"]), ".1f"), _fmt(pct(e["accuracy"]), ".1f"),
                    _fmt(pct(o["accuracy"]), ".1f"), _delta(pct(e["accuracy"]), pct(o["accuracy"]), ".1f", " pt")))
    out.append(("latency p50, 1 thread (ms)", ms(f["latency_p50_ms"]), ms(e["latency_p50_ms"]), ms(o["latency_p50_ms"]),
                _fmt(_ratio(e["latency_p50_ms"], o["latency_p50_ms"]), ".2f", "x")))
    out.append(("  fp32 p50 / int8 p50", "-", _fmt(_ratio(f["latency_p50_ms"], e["latency_p50_ms"]), ".2f", "x"),
                _fmt(_ratio(f["latency_p50_ms"], o["latency_p50_ms"]), ".2f", "x"), "-"))
    return out


def _cmp(ratio: float | None, lower: str, higher: str, par: float = PAR) -> str:
    if ratio is None:
        return "n/a"
    if abs(ratio - 1) <= par:
        return f"on par ({ratio:.2f}x)"
    return f"{lower if ratio < 1 else higher} ({ratio:.2f}x)"


def verdict(r: dict) -> str:
    e, o = r["edgekit"], r["onnxruntime"]
    n = r["heldout_samples"]

    def frac_diff(key: str) -> float | None:
        return None if e[key] is None or o[key] is None else e[key] - o[key]

    snr_d = frac_diff("snr_db")
    top_d, acc_d = frac_diff("top1_agreement"), frac_diff("accuracy")
    # A tie: SNR within 1 dB; top-1 agreement and accuracy within 1 point or 1 sample (one
    # image of 100 flipping is not a finding).
    signs = []
    if snr_d is not None and abs(snr_d) > 1.0:
        signs.append(snr_d > 0)
    for d in (top_d, acc_d):
        if d is not None and abs(d) > 0.01 + 1e-9 and round(abs(d) * n) > 1:
            signs.append(d > 0)
    quality = "on par" if not signs else "better" if all(signs) else "worse" if not any(signs) else "mixed"
    parts = [f"SNR {_delta(e['snr_db'], o['snr_db'], '.1f', ' dB')}"]
    if top_d is not None:
        parts.append(f"top-1 agreement {100 * top_d:+.1f} pt")
    if acc_d is not None:
        parts.append(f"accuracy {100 * acc_d:+.1f} pt")
    return (
        f"{r['model']}: edgekit vs ORT: quality {quality} ({', '.join(parts)}, {n} held-out); "
        f"quantize {_cmp(_ratio(e['quantize_s'], o['quantize_s']), 'faster', 'slower')}; "
        f"size {_cmp(_ratio(e['size_bytes'], o['size_bytes']), 'smaller', 'larger', par=0.01)}; "
        f"int8 latency {_cmp(_ratio(e['latency_p50_ms'], o['latency_p50_ms']), 'faster', 'slower')}"
    )


def print_table(r: dict) -> None:
    head = ("", "fp32", "edgekit", "ORT", "edgekit vs ORT")
    body = rows(r)
    widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head))]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    ins = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in r["inputs"].items())
    print(f"== {r['model']}  ({r['origin']}; {ins}; calib {r['calibration_samples']}, "
          f"held-out {r['heldout_samples']}; agreement on output '{r['edgekit']['output']}')")
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for row in body:
        print(line(row))
    for note in r["notes"]:
        print(f"note: {note}")
    print()


def environment(preprocess: bool, repeats: int) -> dict:
    import onnxruntime

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "edgekit": version("edgekit"),
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "repeats": repeats,
        "ort_pre_process": preprocess,
        "latency": {"threads": 1, "warmup": LATENCY_WARMUP, "rounds": LATENCY_ROUNDS, "budget_s": LATENCY_BUDGET_S},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="edgekit quantizer vs onnxruntime.quantization.quantize_static, same models and data.",
        epilog="example: python benchmarks/quantize_vs_ort.py --models digits,mobilenetv2 --repeats 5",
    )
    ap.add_argument("--repeats", type=int, default=3, help="quantize runs per tool; the median is shown (default 3)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from: {', '.join(MODELS)} (default: all)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    ap.add_argument("--no-ort-preprocess", dest="ort_preprocess", action="store_false",
                    help="skip ORT's quant_pre_process (on by default, as ORT recommends)")
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown or not names:
        print(f"error: unknown model(s): {', '.join(unknown) or '(none given)'}\nhint: choose from {', '.join(MODELS)}", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print("error: --repeats must be at least 1\nhint: e.g. --repeats 3", file=sys.stderr)
        return 2

    logging.getLogger().setLevel(logging.ERROR)  # ORT's quantizer logs advice at WARNING on the root logger
    try:
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)
    except ImportError:
        print("error: onnxruntime is not installed\nhint: pip install onnxruntime", file=sys.stderr)
        return 2

    def log(msg: str) -> None:
        print(f"[quantize_vs_ort] {msg}", file=sys.stderr, flush=True)

    env = environment(args.ort_preprocess, args.repeats)
    results, skipped, failed = [], [], []
    if not args.json:
        pre = "quant_pre_process + quantize_static" if args.ort_preprocess else "quantize_static (no pre-process)"
        print(f"edgekit {env['edgekit']} vs onnxruntime {env['onnxruntime']} ({pre}); {platform.machine()}, "
              f"python {env['python']}; quantize time = median of {args.repeats}; latency p50, 1 thread")
        print("both: QDQ, int8 asymmetric activations, int8 per-channel symmetric weights, MinMax; "
              "agreement measured by edgekit's measure_agreement for both\n")
    for name in names:
        try:
            case = MODELS[name]()
        except Skip as exc:
            skipped.append({"model": name, "reason": str(exc)})
            if not args.json:
                print(f"== {name}: skipped: {exc}\n")
            continue
        try:
            r = bench_model(case, args.repeats, args.ort_preprocess, log)
        except Exception as exc:  # one model failing (in either tool) doesn't stop the others
            failed.append({"model": name, "error": f"{type(exc).__name__}: {_first_line(exc)}"})
            if not args.json:
                print(f"== {name}: failed: {failed[-1]['error']}\n")
            continue
        results.append(r)
        if not args.json:
            print_table(r)
    if args.json:
        doc = {"schema": SCHEMA, "benchmark": "quantize_vs_ort", "environment": env, "models": results, "skipped": skipped, "failed": failed}
        print(json.dumps(doc, indent=2))
    else:
        for r in results:
            print("verdict " + verdict(r))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
