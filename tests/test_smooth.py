"""+smooth: SmoothQuant scale migration folded into constants (edgekit/quantize/smooth.py)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from realmodels import CATALOGUE, real_model_data, run_outputs

from edgekit.errors import UsageError
from edgekit.modelio import load_model
from edgekit.quantize import FeedSet, analyze_model, quantize_model
from edgekit.quantize.calib import Recipe, parse_method
from edgekit.quantize.scheme import SCHEMES
from edgekit.quantize.smooth import ALPHAS, find_sites, smooth_model
from tests.builders import smooth_model as built
from tests.conftest import EXAMPLES

SCHEME = SCHEMES["onnxruntime"]


def _feeds(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((32, 16)).astype(np.float32)} for _ in range(n)]


def _outputs(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    return [y for outs in run_outputs(model.SerializeToString(), feeds) for y in outs]


@pytest.mark.parametrize(
    ("producer", "readers"),
    [("layernorm", ("gemm",)), ("layernorm", ("matmul",)), ("mul_add", ("gemm",)), ("layernorm", ("gemm", "matmul"))],
)
def test_smoothed_float_model_computes_the_same_without_new_nodes(producer, readers):
    model = built(producer, readers)
    before_ops = [n.op_type for n in model.graph.node]
    before = _outputs(model, _feeds(4, seed=1))
    gamma = onnx.numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "gamma")).copy()
    done = smooth_model(model, _feeds(8), 0.5)
    assert list(done.smoothed) == ["h"] and done.inputs == len(readers) and done.alphas == {"h": 0.5}
    assert [n.op_type for n in model.graph.node] == before_ops  # the scale went into constants
    after = _outputs(model, _feeds(4, seed=1))
    for a, b in zip(before, after, strict=True):
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(a))
    # the outlier channel's scale shrank the most: that is what moved into the weights
    new_gamma = onnx.numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "gamma"))
    ratio = np.abs(new_gamma / gamma)
    assert int(np.argmin(ratio)) == 3 and ratio[3] < 0.5 * np.median(ratio)


def test_two_readers_share_one_scale():
    model = built("layernorm", ("gemm", "matmul"))
    w0 = {t.name: onnx.numpy_helper.to_array(t).copy() for t in model.graph.initializer}
    smooth_model(model, _feeds(8), 0.5)
    w1 = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    s_gemm = (w1["w0"] / w0["w0"])[0]  # Gemm transB=1: [out, C], channel j is column j
    s_matmul = (w1["w1"] / w0["w1"])[:, 0]  # MatMul: [C, out], channel j is row j
    np.testing.assert_allclose(s_gemm, s_matmul, rtol=1e-5)
    np.testing.assert_allclose(w1["gamma"] * s_gemm, w0["gamma"], rtol=1e-5)


@pytest.mark.parametrize(
    ("producer", "readers", "why"),
    [
        ("layernorm", ("gemm", "relu"), "read by Relu"),  # a reader that is no MatMul/Gemm
        ("relu", ("gemm",), "made by Relu"),  # nothing to fold 1/s into
    ],
)
def test_unfoldable_inputs_are_left_alone(producer, readers, why):
    model = built(producer, readers)
    before = model.SerializeToString()
    sites, skipped = find_sites(model)
    assert sites == [] and why in skipped["h"]
    done = smooth_model(model, _feeds(4), 0.5)
    assert done.inputs == 0 and why in done.skipped["h"]
    assert model.SerializeToString() == before


def _quantize(tmp_path, model: onnx.ModelProto, method: str):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    calib, held = FeedSet(_feeds(16), "calib"), FeedSet(_feeds(8, seed=5), "held")
    return quantize_model(load_model(path), SCHEME, calib, held, method=method)


@pytest.mark.parametrize(("producer", "method"), [("layernorm", "minmax"), ("mul_add", "minmax"), ("layernorm", "mse+clip+bias")])
def test_smoothing_lowers_the_int8_error(tmp_path, producer, method):
    """Agreement is measured with Q/DQ reference semantics (quantize._evaluate)."""
    plain = _quantize(tmp_path, built(producer), method)
    smoothed = _quantize(tmp_path, built(producer), method + "+smooth")
    snr = [r.agreement.outputs[0].snr_db for r in (plain, smoothed)]
    # measured: 12.7 -> 32.7 dB (layernorm, alpha 0.75), 10.6 -> 25.8 (mul_add, 0.9), 12.9 -> 32.4 (mse+clip+bias)
    assert snr[1] > snr[0] + 10, snr
    doc = smoothed.to_dict()["smoothed"]
    assert doc["inputs"] == 1 and doc["alpha"] == "auto" and doc["tensors"]["h"]["alpha"] in ALPHAS
    assert plain.to_dict()["smoothed"] is None
    assert len(smoothed.model.graph.node) == len(plain.model.graph.node)


def test_parse_method_smooth():
    assert parse_method("auto+smooth") == Recipe("auto", smooth="auto") == parse_method("auto+smooth=auto")
    assert parse_method("mse+bias+smooth=0.7") == Recipe("mse", bias_correction=True, smooth=0.7)
    assert parse_method("auto").smooth is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("auto+smooth+smooth", "repeats +smooth"),
        ("auto+smooth=0.5+smooth=0.7", "repeats +smooth"),
        ("auto+smooth=1.5", "alpha must be a number between 0 and 1"),
        ("auto+smooth=0", "alpha must be a number between 0 and 1"),
        ("auto+smooth=half", "alpha must be a number between 0 and 1"),
        ("auto+clip=1", "+clip takes no value"),
    ],
)
def test_bad_smooth_options_say_how(text, words):
    with pytest.raises(UsageError, match=re.escape(words)) as exc:
        parse_method(text)
    assert "smooth" in exc.value.hint


def test_minilm_smoothing_is_exact_and_auto_alpha_avoids_the_harm():
    """MiniLM is post-LayerNorm BERT: each LayerNorm output is read by the next Gemms AND by the
    residual Add, so no scale can go into its gamma/beta. What can be smoothed exactly: the
    attention output projection's input (1/s back through Reshape/Transpose/softmax@V into the V
    projection) and the FFN output's input (1/s into GELU's 0.5 * x constant).
    Measured (16 calib, 8 held out, reference semantics, mean embedding cosine): auto 0.9097,
    auto+smooth=0.5 0.8304 (layer 0's GELU output alone takes it to 0.835), auto+smooth 0.9091."""
    loaded, calib, held = real_model_data("minilm-l3")
    prepared, _ = analyze_model(loaded, SCHEME)
    nodes = [n.op_type for n in prepared.graph.node]
    before = run_outputs(prepared.SerializeToString(), held.feeds)
    done = smooth_model(prepared, calib.feeds, 0.5, SCHEME)
    after = run_outputs(prepared.SerializeToString(), held.feeds)
    for x, y in zip(before, after, strict=True):
        for a, b in zip(x, y, strict=True):
            assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(a))
    assert [n.op_type for n in prepared.graph.node] == nodes
    assert sorted(r for readers in done.smoothed.values() for r in readers) == ["Gemm_16", "Gemm_20", "Gemm_27", "Gemm_31", "Gemm_5", "Gemm_9"]
    residual = [why for why in done.skipped.values() if "read by Add too" in why]
    assert len(residual) == 6  # the LayerNorm outputs that feed Gemms (QKV, FFN) and a residual
    feeds = (FeedSet(calib.feeds, "calib"), FeedSet(held.feeds, "held"))
    fp32 = run_outputs(loaded.model.SerializeToString(), held.feeds, reference=False)
    score = {}
    for method in ("auto", "auto+smooth=0.5", "auto+smooth"):
        q = quantize_model(loaded, SCHEME, *feeds, method=method)
        score[method] = CATALOGUE["minilm-l3"].metric(fp32, run_outputs(q.model.SerializeToString(), held.feeds), held).value
    assert score["auto+smooth=0.5"] < score["auto"] - 0.03, score  # a fixed alpha can hurt ...
    assert score["auto+smooth"] > score["auto"] - 0.01, score  # ... the per-tensor choice does not


def test_cli_says_what_it_smoothed(cli, tmp_path):
    model, calib = tmp_path / "m.onnx", tmp_path / "calib.npz"
    onnx.save(built("layernorm", ("gemm", "matmul")), model)
    np.savez(calib, x=np.concatenate([f["x"] for f in _feeds(12)]))
    r = cli("quantize", model, "-o", tmp_path / "q.onnx", "--calib", calib, "--method", "minmax+smooth", "--target", "local")
    assert r.returncode == 0, r.stderr
    assert "smoothed 2 MatMul/Gemm inputs (alpha auto" in r.stdout, r.stdout
    r = cli("quantize", model, "-o", tmp_path / "q.onnx", "--calib", calib, "--method", "minmax+smooth=0.5", "--json", "--target", "local")
    doc = __import__("json").loads(r.stdout)
    assert doc["smoothed"]["inputs"] == 2 and doc["smoothed"]["tensors"]["h"]["alpha"] == 0.5
    r = cli("quantize", model, "-o", tmp_path / "q2.onnx", "--method", "minmax+smooth=2")
    assert r.returncode == 2 and "alpha must be a number between 0 and 1" in r.stderr and "hint:" in r.stderr


def test_a_cnn_has_nothing_to_smooth():
    """Its classifier Gemm reads Flatten(Relu(conv)): nothing to fold into, so +smooth changes
    nothing (so on ppocr-cls in benchmarks/ranges.py: 0 inputs smoothed, the same top-1)."""
    model = onnx.load(str(EXAMPLES / "digits" / "digits_cnn.onnx"))
    (x,) = model.graph.input
    shape = [d.dim_value or 1 for d in x.type.tensor_type.shape.dim]
    before = model.SerializeToString()
    done = smooth_model(model, [{x.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}], "auto")
    assert done.inputs == 0 and [why.split(" ")[:2] for why in done.skipped.values()] == [["made", "by"]]
    assert "Relu" in next(iter(done.skipped.values())) and model.SerializeToString() == before
