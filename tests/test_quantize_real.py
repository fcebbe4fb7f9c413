"""Whole real models, real data: the committed examples and PaddleOCR's models from a PyPI wheel.

Figures measured when these thresholds were set (onnxruntime 1.31, x86-64) are in the comments;
each threshold sits a little below its measurement. The int8 side always runs with Q/DQ reference
semantics, which do not depend on the host's int8 kernels: measured so on an AVX2-only host, the
figures equal those first taken on an AVX-512 VNNI host.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from realmodels import cls_dataset, cls_samples, det_samples, rapidocr_model

from edgekit.modelio import LoadedModel, load_model
from edgekit.quantize import SCHEMES, FeedSet, load_feeds, qmath, quantize_model, save_model
from edgekit.quantize.prepare import prepare
from tests.conftest import EXAMPLES

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
MNV2 = EXAMPLES / "mobilenetv2" / "mobilenetv2.onnx"


@dataclass
class Example:
    loaded: LoadedModel
    calibration: FeedSet
    heldout: FeedSet


def example(path: Path) -> Example:
    loaded = load_model(path)
    side = loaded.sidecar
    return Example(
        loaded,
        load_feeds(side.calibration, loaded.inputs),
        load_feeds(side.evaluation, loaded.inputs, labels=side.labels),
    )


def outputs(model: onnx.ModelProto | Path, feeds: FeedSet, *, reference: bool = False) -> np.ndarray:
    """First output of every held-out sample, from a fresh ONNX Runtime session.

    ``reference=True`` (every int8 model here): Q/DQ executed as written. ORT's optimised int8
    kernels are no oracle: without VNNI on x86 they saturate, and the numbers depend on the host.
    """
    src = str(model) if isinstance(model, Path) else model.SerializeToString()
    opts = ort.SessionOptions()
    if reference:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, f)[0] for f in feeds.feeds])


def quantize_and_check_independently(ex: Example, scheme: str, method: str, tmp_path: Path):
    """Quantize, save, reload from disk and measure with our own ORT sessions; the report must agree."""
    result = quantize_model(ex.loaded, SCHEMES[scheme], ex.calibration, ex.heldout, method=method)
    path = tmp_path / f"{ex.loaded.name}.int8.onnx"
    save_model(result.model, path)
    fp32 = outputs(ex.loaded.path, ex.heldout)
    int8 = outputs(path, ex.heldout, reference=True)
    labels = ex.heldout.labels
    acc_f = float(np.mean(fp32.argmax(1) == labels))
    acc_q = float(np.mean(int8.argmax(1) == labels))
    (report,) = result.agreement.outputs
    assert result.agreement.accuracy_fp32 == acc_f and result.agreement.accuracy_int8 == acc_q
    assert report.top1 == float(np.mean(fp32.argmax(1) == int8.argmax(1)))
    assert report.cosine == pytest.approx(qmath.cosine(fp32, int8), abs=1e-6)
    assert report.snr_db == pytest.approx(qmath.snr_db(fp32, int8), abs=0.01)
    return result, onnx.load(str(path)), acc_f, acc_q


# -- examples/digits -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> Example:
    return example(DIGITS)


# Measured: fp32 and int8 both 99.17% (357/360) in all three; cosine 0.99992 / 0.99991 / 0.99990,
# SNR 37.8 / 37.5 / 36.8 dB, top-1 agreement 100%.
@pytest.mark.parametrize("scheme,method", [("onnxruntime", "minmax"), ("onnxruntime", "percentile"), ("tensorrt", "minmax")])
def test_digits_int8_keeps_accuracy(digits, scheme, method, tmp_path):
    result, qmodel, acc_f, acc_q = quantize_and_check_independently(digits, scheme, method, tmp_path)
    assert acc_f == pytest.approx(357 / 360)  # the README's figure
    assert acc_f - acc_q <= 0.01
    (out,) = result.agreement.outputs
    assert out.cosine > 0.999
    assert out.snr_db > 33
    assert out.top1 >= 0.99
    # Every node is int8 (BatchNormalization folded, Relu fused, MaxPool/Flatten pass-through).
    assert result.analysis.summary() == {"int8": 4, "fused": 3, "passthrough": 2}
    ops = [n.op_type for n in qmodel.graph.node]
    assert "BatchNormalization" not in ops
    # Q/DQ on: the input, 3 Relu outputs, MaxPool's and Flatten's outputs (input scale), the logits.
    assert ops.count("QuantizeLinear") == 7 and ops.count("Conv") == 3
    assert [o.name for o in qmodel.graph.output] == ["logits"] and [i.name for i in qmodel.graph.input] == ["input"]


def test_quantize_cli_estimate_on_digits_is_the_qdq_reference(cli, tmp_path):
    """What `edgekit quantize` prints is the model's meaning, whatever this CPU's int8 kernels do.

    On x86 without VNNI, ORT's optimised int8 kernels score this model 97.5 % (VPMADDUBSW
    saturates); Q/DQ executed as written, and ekrt, score 99.17 % (357/360) on every machine.
    """
    out = tmp_path / "digits.int8.onnx"
    r = cli("quantize", DIGITS, "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    agr = json.loads(r.stdout)["agreement"]
    assert (agr["estimate"], agr["measured_on"]) == (True, "host (Q/DQ reference semantics)")
    assert agr["samples"] == 360 and agr["accuracy_int8"] == pytest.approx(357 / 360, abs=0.003)
    ex = example(DIGITS)
    int8 = outputs(out, ex.heldout, reference=True)
    assert agr["accuracy_int8"] == float(np.mean(int8.argmax(1) == ex.heldout.labels))


# -- examples/mobilenetv2 ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mobilenetv2() -> Example:
    ex = example(MNV2)
    assert ex.loaded.inputs[0].shape == (1, 3, 64, 64)  # from the sidecar: the model's H and W are free
    return ex


# Measured (width 0.25, 100 held-out): fp32 99.0%; int8 99.0% with both methods; cosine 0.99956 /
# 0.99958, SNR 30.4 / 30.6 dB, top-1 agreement 100% / 100%.
@pytest.mark.parametrize("method", ["minmax", "percentile"])
def test_mobilenetv2_int8_keeps_accuracy(mobilenetv2, method, tmp_path):
    result, qmodel, acc_f, acc_q = quantize_and_check_independently(mobilenetv2, "onnxruntime", method, tmp_path)
    assert acc_f == pytest.approx(0.99)  # the README's figure
    assert acc_f - acc_q <= 0.015  # at most 1 of the 100 held-out digits
    (out,) = result.agreement.outputs
    assert out.top1 >= 0.98
    assert out.cosine > 0.998
    assert out.snr_db > 26
    # 52 BatchNormalization folded away, 35 Clip(0, 6) fused, nothing left in float.
    summary = result.analysis.summary()
    assert "float" not in summary and summary["fused"] == 35
    assert "BatchNormalization" not in {n.op_type for n in qmodel.graph.node}


# -- PaddleOCR, from the rapidocr-onnxruntime wheel ----------------------------------------------


@pytest.fixture(scope="module")
def ocr_cls() -> Example:
    loaded = load_model(rapidocr_model("cls"), {"x": (1, 3, 48, 192)})
    x, labels = cls_dataset(100, seed=2)
    return Example(
        loaded,
        FeedSet([{"x": s[None]} for s in cls_samples(32, seed=1)], "cls_samples(32, 1)"),
        FeedSet([{"x": s[None]} for s in x], "cls_dataset(100, 2)", labels=labels),
    )


# Measured on 100 held-out text lines: minmax cosine 0.9985, SNR 25.3 dB, top-1 agreement 99%;
# percentile cosine 0.9934, SNR 18.8 dB, top-1 agreement 97%; direction accuracy fp32 97%, int8 96%.
@pytest.mark.realmodels
@pytest.mark.parametrize("method", ["minmax", "percentile"])
def test_ocr_cls_int8_agrees_with_fp32(ocr_cls, method):
    result = quantize_model(ocr_cls.loaded, SCHEMES["onnxruntime"], ocr_cls.calibration, ocr_cls.heldout, method=method)
    (out,) = result.agreement.outputs
    assert out.top1 >= 0.95
    assert out.cosine > 0.99
    assert out.snr_db > 17
    agr = result.agreement
    assert agr.accuracy_fp32 >= 0.9  # the lines carry real text: the fp32 model reads their direction
    assert agr.accuracy_drop <= 0.03
    # Softmax, HardSigmoid and the Div of hard-swish have no int8 rule and stay float, with that reason.
    reasons = {d.op_type: d.reason for d in result.analysis.float_nodes}
    assert reasons["Softmax"] == "no int8 rule for Softmax in the onnxruntime scheme"
    assert result.analysis.summary()["int8"] > 100


@pytest.fixture(scope="module")
def ocr_det():
    loaded = load_model(rapidocr_model("det"), {"x": (1, 3, 320, 320)})
    cal = FeedSet([{"x": s[None]} for s in det_samples(8, seed=1)], "det_samples(8, 1)")
    held = FeedSet([{"x": s[None]} for s in det_samples(4, seed=2)], "det_samples(4, 2)")
    return loaded, cal, held, quantize_model(loaded, SCHEMES["onnxruntime"], cal, held, method="minmax")


# Measured on 4 held-out 320x320 scenes: cosine 0.9734, SNR 12.75 dB (percentile: 0.9708, 12.2 dB).
@pytest.mark.realmodels
def test_ocr_det_int8_agrees_with_fp32(ocr_det):
    loaded, _, _, result = ocr_det
    (out,) = result.agreement.outputs
    assert out.name == "sigmoid_0.tmp_0"
    assert out.cosine > 0.965
    assert out.snr_db > 12.0
    assert out.top1 is None  # a probability map, not a class vector
    assert [i.name for i in result.model.graph.input] == ["x"]


@pytest.mark.realmodels
@pytest.mark.xfail(
    strict=True,
    reason="PP-OCRv4 det loses more to full int8 than cosine 0.98 / 15 dB allows (measured 0.973 / 12.7 dB; "
    "ONNX Runtime's own quantize_static gets the same); needs sensitivity-driven float fallback",
)
def test_ocr_det_meets_the_target_agreement(ocr_det):
    (out,) = ocr_det[3].agreement.outputs
    assert out.cosine > 0.98
    assert out.snr_db > 15


@pytest.mark.realmodels
def test_ocr_det_is_as_good_as_onnxruntime_quantize_static(ocr_det, tmp_path):
    """Peer check: ORT's own static QDQ quantizer (S8S8, per-channel, minmax) on the same data."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    loaded, cal, held, result = ocr_det

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(cal.feeds)

        def get_next(self):
            return next(self.it, None)

    fp = tmp_path / "det.fp32.onnx"
    qp = tmp_path / "det.ort-int8.onnx"
    onnx.save_model(prepare(loaded.model, loaded.inputs), str(fp))
    quantize_static(
        str(fp),
        str(qp),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    ref, theirs = outputs(fp, held), outputs(qp, held, reference=True)
    (ours,) = result.agreement.outputs
    # Measured: ORT cosine 0.9735, SNR 12.76 dB; edgekit 0.9734, 12.75 dB.
    assert ours.cosine >= qmath.cosine(ref, theirs) - 0.003
    assert ours.snr_db >= qmath.snr_db(ref, theirs) - 0.5
