"""``+gptq`` (edgekit.quantize.rounding): weights rounded against the layers' float inputs.

The Hessian a layer collects is checked through an identity that needs no GPTQ at all: for any
weight error E, the squared error it causes in the layer's output over the samples is
tr(E H E^T) (every input position enters H when the image is small). That pins the patch layout
to the weight's column order for regular and depthwise convolutions and for Gemm.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import UsageError
from edgekit.modelio import IOSpec, load_model
from edgekit.quantize import SCHEMES, FeedSet, qmath, quantize_model, rounding
from edgekit.quantize.calib import collect_ranges, parse_method
from edgekit.quantize.prepare import prepare
from edgekit.quantize.rewrite import analyze

SCHEME = SCHEMES["onnxruntime"]


def _model(nodes, x_shape, y_name, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info(y_name, TensorProto.FLOAT, [1, 5])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _conv_net(seed: int = 0) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """A regular 3x3 conv (stride 2, asymmetric pads), a depthwise 5x5, a 1x1, then Gemm."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "b1": rng.standard_normal(8).astype(np.float32),
        "w2": rng.standard_normal((8, 1, 5, 5)).astype(np.float32), "b2": rng.standard_normal(8).astype(np.float32),
        "w3": rng.standard_normal((6, 8, 1, 1)).astype(np.float32), "b3": rng.standard_normal(6).astype(np.float32),
        "wf": rng.standard_normal((5, 6 * 5 * 4)).astype(np.float32), "bf": rng.standard_normal(5).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="dw", kernel_shape=[5, 5], pads=[2, 2, 2, 2], group=8),
        helper.make_node("Conv", ["c2", "w3", "b3"], ["c3"], name="pw", kernel_shape=[1, 1]),
        helper.make_node("Flatten", ["c3"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    return _model(nodes, (1, 3, 10, 9), "y", inits), (1, 3, 10, 9)


def _collect(model, found, feeds) -> None:
    """Each layer's Hessian from a float pass of its own (quantize collects them on its range pass)."""
    from edgekit.quantize.calib import observe

    taps = rounding.Hessians(found)
    for values in observe(model, taps.tensors, feeds):
        for name, value in values.items():
            taps.add(name, value)


def _feeds(shape, n, seed=1):
    rng = np.random.default_rng(seed)
    # correlated inputs (a smooth image plus noise): where GPTQ has something to exploit
    base = rng.standard_normal((n, 1, 1, *shape[2:])).astype(np.float32)
    return [{"x": (base[i] + 0.3 * rng.standard_normal(shape)).astype(np.float32)} for i in range(n)]


def _layer_outputs(model, node, weight, feeds):
    """The node's output (without its bias) for each feed, with ``weight`` as its weight."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.name == node.input[1]:
            t.CopyFrom(numpy_helper.from_array(weight.astype(np.float32), t.name))
        if len(node.input) > 2 and t.name == node.input[2]:
            t.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(t)), t.name))
    m.graph.output.append(helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [s.run([node.output[0]], f)[0].astype(np.float64) for f in feeds]


def test_a_layers_hessian_gives_its_output_error_for_any_weight_error():
    model, shape = _conv_net()
    model = prepare(model, (IOSpec("x", shape, "float32"),))  # shapes known: every layer int8
    feeds = _feeds(shape, 3)
    analysis = analyze(model, SCHEME)
    found = {layer.node.name: layer for layer in rounding.layers(model, analysis)}
    assert set(found) == {"conv1", "dw", "pw", "fc"}
    _collect(model, list(found.values()), feeds)
    rng = np.random.default_rng(7)
    for name, layer in found.items():
        w = layer.w.astype(np.float64)
        e = rng.standard_normal(w.shape) * 0.01
        a, b = _layer_outputs(model, layer.node, w, feeds), _layer_outputs(model, layer.node, w + e, feeds)
        measured = sum(float(np.square(y1 - y0).sum()) for y0, y1 in zip(a, b))
        if layer.depthwise:  # one Hessian per channel: sum_c e_c H_c e_c
            E = e.reshape(e.shape[0], -1)
            predicted = float(np.einsum("ck,ckl,cl->", E, layer.hessian, E))
        else:
            E = e.reshape(e.shape[0], -1) if layer.node.op_type == "Conv" else e
            predicted = float(np.trace(E @ layer.hessian @ E.T))
        assert predicted == pytest.approx(measured, rel=1e-4), name


def test_depthwise_hessians_split_over_threads_are_the_same_to_the_bit(monkeypatch):
    """Channel ranges on a pool of 4 (every layer split, down to 2 channels a part) sum what one
    thread sums: the Hessians, and so GPTQ's integers, are identical."""
    from concurrent.futures import ThreadPoolExecutor

    model, shape = _conv_net()
    model = prepare(model, (IOSpec("x", shape, "float32"),))
    feeds, analysis = _feeds(shape, 3), analyze(model, SCHEME)
    alone = rounding.layers(model, analysis)
    _collect(model, alone, feeds)
    calls = []
    real = rounding._by_channels
    monkeypatch.setattr(rounding, "_by_channels", lambda fn, c, w: calls.append(c) or real(fn, c, w))
    monkeypatch.setattr(rounding, "_pool", lambda: (ThreadPoolExecutor(4), 4))
    monkeypatch.setattr(rounding, "SPLIT_WORK", 0)
    monkeypatch.setattr(rounding, "SPLIT_CHANNELS", 2)
    split = rounding.layers(model, analysis)
    _collect(model, split, feeds)
    assert calls == [8, 8, 8]  # the depthwise layer's 8 channels, one call per sample, 4 parts each
    for a, b in zip(alone, split):
        assert np.array_equal(a.hessian, b.hessian), a.node.name
    assert all(np.array_equal(x, y) for x, y in zip(rounding.round_layers(alone, SCHEME).values(), rounding.round_layers(split, SCHEME).values()))


def test_gptq_rounds_to_nearest_when_the_inputs_are_uncorrelated_and_beats_it_when_they_are():
    rng = np.random.default_rng(3)
    W = rng.standard_normal((16, 24))
    scale = np.abs(W).max(axis=1) / 127
    nearest = np.clip(np.round(W / scale[:, None]), -127, 127)
    assert np.array_equal(rounding.solve(W, np.eye(24) * 5.0, scale, 127), nearest)  # nothing to pass on
    X = rng.standard_normal((24, 4000))
    X = (np.linalg.cholesky(0.9 * np.ones((24, 24)) + 0.1 * np.eye(24)) @ X)  # strongly correlated inputs
    H = X @ X.T
    Q = rounding.solve(W, H, scale, 127)
    assert Q.min() >= -127 and Q.max() <= 127
    err = lambda q: float(np.square((W - q * scale[:, None]) @ X).sum())  # noqa: E731
    assert err(Q) < 0.5 * err(nearest), (err(Q), err(nearest))
    # one Hessian per row (depthwise) gives what the shared one gives when they are all the same
    assert np.array_equal(rounding.solve(W, np.broadcast_to(H, (16, 24, 24)), scale, 127), Q)
    # an input never nonzero (a dead channel): its column rounds to nearest, nothing breaks
    H0 = H.copy()
    H0[5, :] = H0[:, 5] = 0
    assert np.array_equal(rounding.solve(W, H0, scale, 127)[:, 5], nearest[:, 5])


def test_quantize_with_gptq_keeps_the_scales_and_lowers_the_output_error(tmp_path):
    model, shape = _conv_net()
    calib, held = _feeds(shape, 8), _feeds(shape, 8, seed=2)
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    results = {m: quantize_model(loaded, SCHEME, FeedSet(calib, "c"), FeedSet(held, "h"), method=m) for m in ("minmax", "minmax+gptq")}
    plain, gptq = results["minmax"], results["minmax+gptq"]
    assert not plain.analysis.rounded and set(gptq.analysis.rounded) == {"w1", "w2", "w3", "wf"}
    ip, ig = ({t.name: numpy_helper.to_array(t) for t in r.model.graph.initializer} for r in (plain, gptq))
    for w in ("w1", "w2", "w3", "wf"):
        q = next(k for k in ip if k.startswith(w + "__") and k.endswith("__q"))
        s = q.replace("__q", "__scale")
        np.testing.assert_array_equal(ip[s], ig[s])  # same scales
        assert not np.array_equal(ip[q], ig[q]), w  # other integers
        assert np.abs(ig[q].astype(int) - ip[q].astype(int)).max() <= 127
    prepared = prepare(model, loaded.inputs)
    ref = [_run(prepared, f) for f in held]

    def noise(r):
        return sum(float(np.square(_run(r.model, f) - y).sum()) for f, y in zip(held, ref))

    assert noise(gptq) < noise(plain), (noise(gptq), noise(plain))
    # with bias correction too (which then corrects for the GPTQ integers), and with auto's ranges
    for method in ("minmax+bias+gptq", "auto+gptq"):
        r = quantize_model(loaded, SCHEME, FeedSet(calib, "c"), FeedSet(held, "h"), method=method)
        assert set(r.analysis.rounded) == {"w1", "w2", "w3", "wf"} and np.isfinite(noise(r)), method


def _run(model, feed):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return s.run(None, feed)[0].astype(np.float64)


def test_the_gptq_option_is_parsed_and_checked():
    assert parse_method("auto+gptq").gptq and not parse_method("auto").gptq
    assert parse_method("mse+bias+gptq").passes == 2  # the Hessians ride on the ranges' pass
    assert [parse_method(m).rounding for m in ("auto", "auto+gptq", "auto+nearest", "minmax", "mse+gptq")] == ["decide", "gptq", "nearest", "nearest", "gptq"]
    with pytest.raises(UsageError, match="two weight roundings"):
        parse_method("auto+gptq+nearest")
    with pytest.raises(UsageError, match=r"\+gptq takes no value"):
        parse_method("auto+gptq=2")
    with pytest.raises(UsageError, match="repeats"):
        parse_method("auto+gptq+gptq")


def test_the_bias_options_are_parsed_and_checked():
    assert [parse_method(m).bias for m in ("auto", "auto+bias", "auto+nobias", "minmax", "mse+bias", "auto+gptq")] == ["decide", "on", "off", "off", "on", "decide"]
    with pytest.raises(UsageError, match=r"corrected and uncorrected biases \(\+bias and \+nobias\)"):
        parse_method("auto+bias+nobias")


def test_the_rounded_integers_are_what_rewrite_and_bias_correction_use():
    model, shape = _conv_net(seed=4)
    analysis = analyze(prepare(model, (IOSpec("x", shape, "float32"),)), SCHEME)
    w = analysis.consts["w3"]
    s, z = qmath.weight_params(w, 0, SCHEME.weight_qmax)
    nearest = qmath.quantize(w, s, z, "int8", 0)
    analysis.rounded["w3"] = np.clip(nearest.astype(int) + 1, -127, 127).astype(np.int8)
    assert np.array_equal(analysis.weight_q("w3", s, z, 0), analysis.rounded["w3"])
    s1, z1 = qmath.weight_params(analysis.consts["w1"], 0, SCHEME.weight_qmax)
    assert np.array_equal(analysis.weight_q("w1", s1, z1, 0), qmath.quantize(analysis.consts["w1"], s1, z1, "int8", 0))


def test_the_hessians_collected_on_the_ranges_pass_are_those_of_a_pass_of_their_own():
    model, shape = _conv_net(seed=5)
    prepared = prepare(model, (IOSpec("x", shape, "float32"),))
    analysis = analyze(prepared, SCHEME)
    feeds = _feeds(shape, 3)
    alone, riding = rounding.layers(prepared, analysis), rounding.layers(prepared, analysis)
    _collect(prepared, alone, feeds)
    collect_ranges(prepared, analysis.calibrated, feeds, method="mse", taps=[rounding.Hessians(riding)])
    assert [x.samples for x in riding] == [3] * len(alone)
    for a, b in zip(alone, riding):
        np.testing.assert_array_equal(a.hessian, b.hessian)


def _nudged(found, scheme, weights=None):
    """GPTQ's integers pushed 3 steps off: a rounding that must lose to nearest's."""
    return {k: np.clip(v.astype(int) + 3, -127, 127).astype(np.int8) for k, v in real_round_layers(found, scheme, weights).items()}


real_round_layers = rounding.round_layers


@pytest.mark.parametrize("extra", ["", "+bias"])
def test_auto_keeps_gptq_only_where_it_lowers_the_output_error(tmp_path, monkeypatch, extra):
    model, shape = _conv_net()
    calib, held = _feeds(shape, 16), _feeds(shape, 8, seed=2)  # (on 8 of these GPTQ errs more at the outputs, and auto says so)
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")

    def q(method):
        return quantize_model(loaded, SCHEME, FeedSet(calib, "c"), FeedSet(held, "h"), method=method)

    auto, forced = q("auto" + extra), q("auto" + extra + "+gptq")
    rec = auto.auto_ranges["rounding"]
    assert rec["chosen"] == "gptq" and rec["error_gptq"] < rec["error_nearest"] and rec["layers"] == 4
    assert auto.analysis.rounded.keys() == forced.analysis.rounded.keys()
    assert auto.model.SerializeToString() == forced.model.SerializeToString()  # the same model as asking for it
    nearest = q("auto" + extra + "+nearest")
    assert "rounding" not in nearest.auto_ranges and not nearest.analysis.rounded
    # a rounding that errs more is dropped, and every trace of it with it (bias correction's too)
    monkeypatch.setattr(rounding, "round_layers", _nudged)
    lost = q("auto" + extra)
    assert lost.auto_ranges["rounding"]["chosen"] == "nearest" and not lost.analysis.rounded
    assert lost.auto_ranges["rounding"]["error_gptq"] > lost.auto_ranges["rounding"]["error_nearest"]
    assert lost.model.SerializeToString() == nearest.model.SerializeToString()


def test_auto_corrects_the_biases_only_where_that_lowers_the_output_error(tmp_path, monkeypatch):
    from edgekit.quantize import equalize

    model, shape = _conv_net(3)  # its rounding errors shift the depthwise layer's mean: correcting halves auto's error
    calib, held = _feeds(shape, 16), _feeds(shape, 8, seed=2)
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")

    def q(method):
        return quantize_model(loaded, SCHEME, FeedSet(calib, "c"), FeedSet(held, "h"), method=method)

    auto, forced, as_is = q("auto"), q("auto+bias"), q("auto+nobias")
    rec = auto.auto_ranges["bias"]
    assert rec["chosen"] and rec["error_corrected"] < 0.7 * rec["error_as_is"], rec
    assert "bias" not in forced.auto_ranges and "bias" not in as_is.auto_ranges
    assert auto.model.SerializeToString() == forced.model.SerializeToString()  # the same model as asking for it
    assert auto.model.SerializeToString() != as_is.model.SerializeToString()
    # a correction that errs more is dropped, and every trace of it with it
    real = equalize.correct_biases

    def wrong(model, analysis, means, scheme, originals):
        replaced = real(model, analysis, means, scheme, originals)
        for name, b in replaced.items():  # the shift turned around and tripled
            analysis.consts[name] = (b - 3 * (analysis.consts[name] - b)).astype(b.dtype)
        return replaced

    monkeypatch.setattr(equalize, "correct_biases", wrong)
    lost = q("auto")
    assert not lost.auto_ranges["bias"]["chosen"] and lost.auto_ranges["bias"]["error_corrected"] > lost.auto_ranges["bias"]["error_as_is"]
    assert lost.model.SerializeToString() == as_is.model.SerializeToString()


def test_layers_reading_the_same_patches_share_one_hessian():
    rng = np.random.default_rng(6)
    inits = {k: rng.standard_normal(s).astype(np.float32) for k, s in (("wa", (4, 3, 3, 3)), ("wb", (6, 3, 3, 3)), ("wc", (4, 3, 3, 3)))}
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], name="a", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wb"], ["b"], name="b", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),  # a's patches
        helper.make_node("Conv", ["x", "wc"], ["c"], name="c", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),  # other patches
    ]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abc"]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 40, 40])], outs,
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), (IOSpec("x", (1, 3, 40, 40), "float32"),))
    analysis = analyze(model, SCHEME)
    feeds = _feeds((1, 3, 40, 40), 2)
    found = {x.node.name: x for x in rounding.layers(model, analysis)}
    _collect(model, list(found.values()), feeds)
    assert found["b"].source is found["a"] and found["c"].source is found["c"] and found["b"].samples == 0
    own = rounding.layers(model, analysis)[1]  # b alone: its Hessian from its own pass
    _collect(model, [own], feeds)
    np.testing.assert_array_equal(own.hessian, found["a"].hessian)
    assert np.array_equal(rounding.round_layers([own], SCHEME)["wb"], rounding.round_layers(list(found.values()), SCHEME)["wb"])


@pytest.mark.parametrize("method", ["minmax+gptq", "minmax+bias+gptq"])
def test_a_dynamic_batch_model_keeps_the_gptq_integers_and_corrected_biases(tmp_path, method):
    """The int8 model rebuilt on the float model's dynamic inputs (quantize.with_dynamic_inputs)
    carries the very integers and biases of the fixed-shape one: a fresh analysis knows neither
    GPTQ's rounding nor +bias's correction (a fresh-clone CI found the digits example's dynamic
    batch dropped once auto kept GPTQ)."""
    from edgekit.quantize import with_dynamic_inputs

    model, shape = _conv_net()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx", {"x": shape})
    r = quantize_model(loaded, SCHEME, FeedSet(_feeds(shape, 8), "c"), FeedSet(_feeds(shape, 2, seed=2), "h"), method=method)
    dyn = with_dynamic_inputs(r.model, loaded, SCHEME)
    assert dyn is not None, "the dynamic rebuild was refused"
    fixed = {t.name: numpy_helper.to_array(t) for t in r.model.graph.initializer if t.name.endswith("__q")}
    rebuilt = {t.name: numpy_helper.to_array(t) for t in dyn.graph.initializer if t.name.endswith("__q")}
    assert fixed.keys() == rebuilt.keys() and all(np.array_equal(fixed[k], rebuilt[k]) for k in fixed)
