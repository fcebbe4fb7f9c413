"""Better ranges: MSE activation ranges, ``auto``, the entropy fix, MSE weight clipping, bias
correction and cross-layer equalization (``--method mse+clip+bias+cle``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import UsageError
from edgekit.modelio import load_model
from edgekit.quantize import (
    SCHEMES,
    FeedSet,
    analyze_model,
    equalize,
    load_feeds,
    qmath,
    quantize_model,
)
from edgekit.quantize.calib import (
    ChannelMeans,
    Recipe,
    collect_ranges,
    mse_range,
    mse_threshold,
    parse_method,
)
from edgekit.quantize.scheme import narrow_weights
from tests.conftest import EXAMPLES

MNV2 = EXAMPLES / "mobilenetv2" / "mobilenetv2.onnx"


def qdq_error(values: np.ndarray, rng: tuple[float, float], symmetric: bool) -> float:
    """Squared error of quantize-dequantize with the range's int8 params (qmath's), as the model
    will compute it."""
    s, z = qmath.scale_zero_point(rng[0], rng[1], "int8", symmetric)
    q = np.clip(np.rint(values / np.float32(s)) + np.float32(z), -128, 127)
    return float(np.square((q - np.float32(z)) * np.float32(s) - values).sum())


def identity_model(n: int) -> onnx.ModelProto:
    """x -> Identity -> y, and x -> Relu -> r: ranges of a given distribution and its positive part."""
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["r"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n]), helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, n])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def ranges_of(values: np.ndarray, method: str, symmetric: bool = False) -> dict[str, tuple[float, float]]:
    feeds = [{"x": part[None].astype(np.float32)} for part in values.reshape(8, -1)]
    return collect_ranges(identity_model(values.size // 8), ["y", "r"], feeds, method=method, symmetric=symmetric)


@pytest.fixture(scope="module")
def gaussian_with_outliers() -> np.ndarray:
    x = np.random.default_rng(0).normal(0.5, 1.0, 200_000).astype(np.float32)
    x[[10, 20_000, 150_000]] = [14.0, -12.0, 13.0]
    return x


@pytest.fixture(scope="module")
def heavy_tail() -> np.ndarray:
    return np.random.default_rng(11).standard_t(2.5, 200_000).astype(np.float32)


def brute_force(x: np.ndarray, symmetric: bool) -> float:
    """The least quantize-dequantize error over a fine grid of ranges (the known optimum)."""
    lo, hi = x.min(), x.max()
    if symmetric:
        return min(qdq_error(x, (-t, t), True) for t in np.linspace(0.02, 1, 100) * max(-lo, hi))
    return min(qdq_error(x, (a, b), False) for a in np.linspace(lo, 0, 30) for b in np.linspace(0, hi, 30))


@pytest.mark.parametrize("symmetric", [False, True])
def test_mse_range_is_the_optimum_and_clips_outliers_minmax_keeps(gaussian_with_outliers, heavy_tail, symmetric):
    for x in (gaussian_with_outliers, heavy_tail):
        mm, mse = ranges_of(x, "minmax", symmetric)["y"], ranges_of(x, "mse", symmetric)["y"]
        assert mm == (float(np.float32(x.min())), float(np.float32(x.max())))
        assert mm[0] <= mse[0] < 0 < mse[1] <= mm[1] and (mse[0] > mm[0] or mse[1] < mm[1])
        assert qdq_error(x, mse, symmetric) <= 1.03 * brute_force(x, symmetric)
        assert qdq_error(x, mse, symmetric) < 0.8 * qdq_error(x, mm, symmetric)
    # Measured: outliers at -12 / +14 over 200k N(0.5, 1) -> asymmetric MSE range (-7.3, 11.1),
    # error 121 against minmax's 173 (percentile's (-4.0, 5.2) clips too much: 223).


def test_mse_keeps_outliers_when_clipping_them_costs_more():
    # 3 outliers at +-50 among 400k N(0.5, 1): their clipping error (~7000) exceeds the rounding
    # noise minmax pays for its wide grid (~5600): MSE does not clip blindly.
    x = np.random.default_rng(0).normal(0.5, 1.0, 400_000).astype(np.float32)
    x[[10, 20_000, 300_000]] = [60.0, -45.0, 55.0]
    mse = ranges_of(x, "mse")["y"]
    assert mse[1] > 30 and mse[0] < -10
    assert qdq_error(x, mse, False) <= 1.03 * brute_force(x, False)


def test_mse_on_a_uniform_distribution_is_about_minmax():
    x = np.random.default_rng(1).uniform(-1.0, 3.0, 400_000)
    for symmetric in (False, True):
        mm, mse = ranges_of(x, "minmax", symmetric)["y"], ranges_of(x, "mse", symmetric)["y"]
        assert mse[0] == pytest.approx(mm[0], rel=0.03) and mse[1] == pytest.approx(mm[1], rel=0.03), (symmetric, mse, mm)
    # The ReLU output keeps its exact 0 and, uniform on (0, 3], its top.
    r = ranges_of(x, "mse")["r"]
    assert r[0] == 0.0 and r[1] == pytest.approx(3.0, rel=0.03)


def test_mse_range_is_asymmetric_for_a_skewed_tensor():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.exponential(1.0, 300_000), -rng.exponential(0.1, 100_000)])
    lo, hi = ranges_of(x, "mse")["y"]
    assert hi > 5 * -lo > 0  # one grid for both sides would waste half of it


def test_fewer_levels_clip_more():
    # Symmetric int8 has 127 steps per side, a one-sided uint8 range 255: a coarser grid makes
    # rounding dearer, so the optimum trades more clipping for it.
    values = np.abs(np.random.default_rng(3).laplace(0, 1, 400_000))
    hist, _ = np.histogram(values, bins=2048, range=(0, values.max()))
    t127, t255 = mse_threshold(hist, values.max(), 127), mse_threshold(hist, values.max(), 255)
    assert t127 < t255 < values.max()


def test_mse_range_finds_the_brute_force_optimum():
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.normal(1.0, 1.0, 50_000), rng.normal(-6.0, 0.3, 200)])
    hist, edges = np.histogram(x, bins=4096, range=(x.min(), x.max()))
    a, b = mse_range(hist, x.min(), x.max(), 255)
    grid = [(lo, hi) for lo in np.linspace(x.min(), 0, 40) for hi in np.linspace(0, x.max(), 40)]
    best = min(qdq_error(x, g, False) for g in grid)
    assert qdq_error(x, (a, b), False) <= 1.02 * best


def test_auto_picks_per_tensor_and_never_worse_than_minmax_on_its_values(gaussian_with_outliers):
    x = gaussian_with_outliers
    auto, mm = ranges_of(x, "auto")["y"], ranges_of(x, "minmax")["y"]
    assert auto != mm and qdq_error(x, auto, False) < qdq_error(x, mm, False)
    u = np.random.default_rng(1).uniform(-1.0, 3.0, 400_000)
    auto_u, mm_u = ranges_of(u, "auto")["y"], ranges_of(u, "minmax")["y"]
    assert qdq_error(u, auto_u, False) <= qdq_error(u, mm_u, False) * 1.001


# -- the entropy fix ---------------------------------------------------------------------------------


def _snr(ref: np.ndarray, test: np.ndarray) -> float:
    return qmath.snr_db(ref, test)


def test_entropy_on_the_mobilenetv2_example_is_as_good_as_minmax():
    # Before: KL clipped the first layers' ReLU6 outputs from 3.7 / 6.0 to 1.1-2.0 / 1.5-1.8 (it
    # counts the clipped tail as one bin of mass, not by how far it is clipped): logits SNR 18.9
    # dB against minmax's 30.4, held-out top-1 0.98 vs 0.99 (onnxruntime scheme). Measured after
    # the fix: 29.2 dB, 0.99.
    loaded = load_model(MNV2)
    side = loaded.sidecar
    calib = load_feeds(side.calibration, loaded.inputs)
    held = load_feeds(side.evaluation, loaded.inputs, labels=side.labels)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL

    def logits(model: onnx.ModelProto) -> np.ndarray:
        s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return np.concatenate([s.run(None, f)[0] for f in held.feeds])

    fp = logits(loaded.model)
    got = {m: logits(quantize_model(loaded, SCHEMES["onnxruntime"], calib, FeedSet(held.feeds[:2], "h"), method=m).model) for m in ("minmax", "entropy")}
    acc = {m: float(np.mean(v.argmax(1) == held.labels)) for m, v in got.items()}
    snr = {m: _snr(fp, v) for m, v in got.items()}
    assert acc["entropy"] >= acc["minmax"] - 0.01, acc
    assert snr["entropy"] >= snr["minmax"] - 3.0, snr


# -- weight clipping ---------------------------------------------------------------------------------


@pytest.mark.parametrize("qmax", [127, 63, 7])
def test_weight_clipping_lowers_the_error_per_channel_and_never_raises_it(qmax):
    rng = np.random.default_rng(5)
    w = rng.laplace(0, 0.05, (16, 64, 3, 3)).astype(np.float32)
    w[:4] = rng.uniform(-0.1, 0.1, (4, 64, 3, 3))  # uniform channels: nothing to gain by clipping

    def per_channel_error(v: np.ndarray) -> np.ndarray:
        s, z = qmath.weight_params(v, 0, qmax)
        return np.square(qmath.dequantize(qmath.quantize(v, s, z, "int8", 0), s, z, 0) - w).reshape(16, -1).sum(axis=1)

    clipped = qmath.clip_weight(w, 0, qmax)
    before, after = per_channel_error(w), per_channel_error(clipped)
    assert np.all(after <= before * (1 + 1e-6)), (before, after)
    if qmax > 7:
        assert np.array_equal(clipped[:4], w[:4])  # unchanged where clipping would not pay
    assert np.abs(clipped).max() <= np.abs(w).max()
    # 4-bit-like grids: a Laplace channel's optimum clips ~40 % of its absmax and halves the
    # error; at 8 bits the rounding is too fine for clipping to pay much (measured: 0 of the 53
    # MobileNetV2 example's weights change).
    if qmax == 7:
        assert np.all(after[4:] < 0.8 * before[4:]) and np.mean(after[4:] / before[4:]) < 0.7


def test_weight_clipping_per_tensor():
    w = np.random.default_rng(6).laplace(0, 1, (512, 64)).astype(np.float32)
    w[0, 0] = 80.0
    c = qmath.clip_weight(w, None, 127)
    err = {k: np.square(qmath.dequantize(qmath.quantize(v, *qmath.weight_params(v, None), "int8"), *qmath.weight_params(v, None)) - w).sum()
           for k, v in (("absmax", w), ("clipped", c))}
    assert err["clipped"] < err["absmax"] and np.abs(c).max() < 80.0


def test_clip_recipe_keeps_bias_scale_equal_to_input_times_weight_scale():
    loaded = load_model(EXAMPLES / "digits" / "digits_cnn.onnx")
    side = loaded.sidecar
    calib = load_feeds(side.calibration, loaded.inputs)
    q = quantize_model(loaded, SCHEMES["onnxruntime"], calib, FeedSet(calib.feeds[:2], "h"), method="mse+clip+bias").model
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    nodes = {o: n for n in q.graph.node for o in n.output}
    checked = 0
    for node in q.graph.node:
        if node.op_type not in ("Conv", "Gemm") or len(node.input) < 3:
            continue
        x_scale = inits[nodes[node.input[0]].input[1]]
        w_scale = inits[nodes[node.input[1]].input[1]]
        b_scale = inits[nodes[node.input[2]].input[1]]
        np.testing.assert_allclose(b_scale, (np.float64(x_scale) * w_scale.astype(np.float64)).astype(np.float32), rtol=1e-6)
        checked += 1
    assert checked >= 3


# -- cross-layer equalization ------------------------------------------------------------------------


def conv_chain() -> onnx.ModelProto:
    """Conv 3->8 -> Relu -> depthwise Conv 8 -> pointwise Conv 8->4, channels scaled 1e-2..1e2 apart."""
    rng = np.random.default_rng(7)
    spread = np.logspace(-2, 2, 8).astype(np.float32)
    w1 = rng.normal(0, 1, (8, 3, 3, 3)).astype(np.float32) * spread[:, None, None, None]
    b1 = rng.normal(0, 1, 8).astype(np.float32) * spread
    w2 = rng.normal(0, 1, (8, 1, 3, 3)).astype(np.float32) / spread[:, None, None, None]
    b2 = rng.normal(0, 0.1, 8).astype(np.float32)
    w3 = rng.normal(0, 1, (4, 8, 1, 1)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"), (w3, "w3"))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="c2", pads=[1, 1, 1, 1], group=8),
        helper.make_node("Conv", ["c2", "w3"], ["y"], name="c3"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 12, 12])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def run_reference(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feed)


def test_cle_keeps_the_float_outputs_and_equalizes_the_ranges():
    model = conv_chain()
    feed = {"x": np.random.default_rng(8).normal(0, 1, (1, 3, 12, 12)).astype(np.float32)}
    before = run_reference(model, feed)[0]
    assert equalize.cross_layer_equalize(model) == 2  # (c1, c2) through the Relu, and (c2, c3)
    after = run_reference(model, feed)[0]
    assert np.max(np.abs(after - before)) <= 1e-4 * np.max(np.abs(before))
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    r1 = np.abs(w["w1"]).reshape(8, -1).max(axis=1)
    r2 = np.abs(w["w2"]).reshape(8, -1).max(axis=1)
    assert r1.max() / r1.min() < 1e3 ** 0.5 < 1e4  # was 1e4 apart (spread 1e-2..1e2)
    # The last pair (c2, c3) is equalized exactly by the last pass; earlier ones approach it.
    r3 = np.abs(w["w3"]).max(axis=(0, 2, 3))
    np.testing.assert_allclose(r2, r3, rtol=1e-5)


def test_cle_leaves_clip_and_shared_tensors_alone():
    model = conv_chain()
    for node in model.graph.node:
        if node.op_type == "Relu":  # ReLU6 is not positively homogeneous: Clip(x / s) != Clip(x) / s
            node.op_type = "Clip"
            node.input.extend(["lo", "hi"])
    model.graph.initializer.extend([numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")])
    pairs = [(a.name, b.name) for a, b in equalize.equalizable_pairs(model)]
    assert pairs == [("c2", "c3")]


def test_cle_on_the_mobilenetv2_example_keeps_its_logits():
    loaded = load_model(MNV2)
    prepared, _ = analyze_model(loaded, SCHEMES["onnxruntime"])
    feed = load_feeds(loaded.sidecar.evaluation, loaded.inputs).feeds[0]
    before = run_reference(prepared, feed)[0]
    assert equalize.cross_layer_equalize(prepared) >= 1
    after = run_reference(prepared, feed)[0]
    assert np.max(np.abs(after - before)) < 1e-4 * np.max(np.abs(before))


# -- bias correction ---------------------------------------------------------------------------------


def test_bias_correction_removes_the_mean_output_error_of_a_conv_on_digits(tmp_path):
    from sklearn.datasets import load_digits

    images = load_digits().images.astype(np.float32)[:, None] / 16.0  # [N, 1, 8, 8] in [0, 1]: mean > 0
    w = np.random.default_rng(9).normal(0, 0.3, (16, 1, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(16, np.float32), "b")],
    )
    path = tmp_path / "conv.onnx"
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    loaded = load_model(path)
    calib = FeedSet([{"x": images[i : i + 1]} for i in range(0, 600, 3)], "digits")
    held = [{"x": images[i : i + 1]} for i in range(600, 1000)]
    fp = np.concatenate([run_reference(loaded.model, f)[0] for f in held])
    scheme = narrow_weights(SCHEMES["onnxruntime"])  # 7-bit weights: a rounding error worth correcting
    bias_error = {}
    for method in ("minmax", "minmax+bias"):
        q = quantize_model(loaded, scheme, calib, FeedSet(held[:2], "h"), method=method).model
        out = np.concatenate([run_reference(q, f)[0] for f in held])
        bias_error[method] = float(np.abs((out - fp).mean(axis=(0, 2, 3))).mean())  # per channel, on held-out images
    assert bias_error["minmax+bias"] < 0.5 * bias_error["minmax"], bias_error


def test_channel_means_are_the_running_mean_per_channel():
    means = ChannelMeans({"a": 1, "b": -1})
    rng = np.random.default_rng(10)
    xs = [rng.normal(np.arange(3)[None, :, None, None], 1, (2, 3, 4, 4)) for _ in range(5)]
    for x in xs:
        means.add("a", x)
        means.add("b", x)
    np.testing.assert_allclose(means.get("a"), np.concatenate(xs).mean(axis=(0, 2, 3)))
    np.testing.assert_allclose(means.get("b"), np.concatenate(xs).mean(axis=(0, 1, 2)))
    assert means.get("c") is None


# -- the recipe and bad input ------------------------------------------------------------------------


def test_parse_method():
    assert parse_method("minmax") == Recipe()
    assert parse_method("mse+clip+bias+cle") == Recipe("mse", True, True, True)
    assert parse_method("auto+bias") == Recipe("auto", bias_correction=True)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("kl", "unknown calibration method 'kl'"),
        ("minmax+mse", "names two range methods (minmax and mse)"),
        ("mse+clip+clip", "repeats +clip"),
        ("mse+fold", "unknown calibration option '+fold'"),
        ("+clip", "unknown calibration method '+clip'"),
    ],
)
def test_bad_methods_say_the_choices(text, words):
    with pytest.raises(UsageError, match=__import__("re").escape(words)) as exc:
        parse_method(text)
    assert "minmax, percentile, entropy, mse, auto" in exc.value.hint and "+clip" in exc.value.hint


def test_cli_refuses_contradictory_methods(cli, tmp_path):
    out = tmp_path / "q.onnx"
    for method, words in (("minmax+mse", "names two range methods"), ("best", "unknown calibration method 'best'")):
        r = cli("quantize", str(EXAMPLES / "digits" / "digits_cnn.onnx"), "-o", str(out), "--method", method)
        assert r.returncode == 2, r.stderr
        assert f"error: --method '{method}' {words}" in r.stderr or f"error: {words}" in r.stderr, r.stderr
        assert "hint:" in r.stderr and "Traceback" not in r.stderr
        assert not out.exists()


# -- a real model --------------------------------------------------------------------------------------


@pytest.mark.realmodels
def test_mse_ranges_lift_the_speech_embedding_on_a_vnni_less_x86_scheme():
    # openWakeWord's embedding CNN (catalogue goal: mean cosine >= 0.999), 16 calibration / 8
    # held-out samples, the scheme edgekit picks for ONNX Runtime on an x86 host without VNNI
    # (uint8 activations, 7-bit weights), spelled out so the test does not depend on the host.
    # Measured 2026-11-24: minmax 0.99632, mse 0.99742 (with 8-bit weights and int8 activations
    # the order flips: minmax 0.99799, mse 0.99745 -- why the default is auto, per tensor, not mse).
    from dataclasses import replace

    from realmodels import CATALOGUE, real_model_data, run_outputs

    m = CATALOGUE["oww-embedding"]
    loaded, calib, heldout = real_model_data("oww-embedding")
    scheme = replace(narrow_weights(SCHEMES["onnxruntime"]), activation_dtype="uint8")
    fp32 = run_outputs(m.locate(), heldout.feeds)
    score = {}
    for method in ("minmax", "mse"):
        q = quantize_model(loaded, scheme, FeedSet(calib.feeds, "calib"), FeedSet(heldout.feeds[:1], "h"), method=method)
        score[method] = m.metric(fp32, run_outputs(q.model.SerializeToString(), heldout.feeds), heldout).value
    assert score["minmax"] < 0.9970 < score["mse"], score


def test_api_refuses_a_bad_method_before_loading_anything(tmp_path):
    from edgekit import api

    with pytest.raises(UsageError, match="names two range methods"):
        api.quantize(tmp_path / "missing.onnx", tmp_path / "q.onnx", method="mse+auto")
    assert not (tmp_path / "q.onnx").exists()


def test_every_option_of_the_method_is_in_the_quantize_cache_key():
    from edgekit.quantize import cache as qcache

    feeds = FeedSet([{"x": np.zeros((1, 2), np.float32)}], "c")
    keys = {m: qcache.key("sha", SCHEMES["onnxruntime"], m, (), feeds, feeds) for m in ("minmax", "mse", "mse+clip", "mse+bias", "mse+cle", "mse+clip+bias+cle")}
    assert len(set(keys.values())) == len(keys)
