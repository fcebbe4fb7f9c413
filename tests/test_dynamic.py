"""--method dynamic: int8 weights per channel, activations quantized at run time (quantize.dynamic)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import ModelError, PlanError, UsageError
from edgekit.modelio import load_model
from edgekit.quantize import FeedSet, quantize_model, random_feeds, with_dynamic_inputs
from edgekit.quantize.calib import DYNAMIC, parse_method
from edgekit.quantize.dynamic import analyze, reference_form, rewrite
from edgekit.quantize.prepare import prepare
from edgekit.quantize.report import session
from edgekit.quantize.scheme import ONNXRUNTIME, narrow_weights
from tests.builders import float_io, onnx_model
from tests.conftest import assert_one_line_error

# ORT on x86 without VNNI: uint8 activations, 7-bit weights (what the planner picks here)
SCHEME = narrow_weights(replace(ONNXRUNTIME, activation_dtype="uint8"))


def _tiny(path, *, bias_first: bool = False):
    """x[N, 16] -> MatMul W1 + b1 -> Relu -> Gemm(transB) W2, c2 -> y[N, 6]: dynamic batch."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 12)).astype(np.float32) * np.linspace(0.1, 3, 12, dtype=np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal(12).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal((6, 12)).astype(np.float32), "W2"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "c2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["m1"], "mm1"),
        helper.make_node("Add", ["b1", "m1"] if bias_first else ["m1", "b1"], ["a1"], "add1"),
        helper.make_node("Relu", ["a1"], ["r1"], "relu1"),
        helper.make_node("Gemm", ["r1", "W2", "c2"], ["y"], "gemm2", transB=1),
    ]
    model = onnx_model(nodes, [float_io("x", ["N", 16])], [float_io("y", ["N", 6])], inits)
    onnx.save(model, path)
    return load_model(path, {"x": (4, 16)})


def _feeds(n: int, seed: int = 0) -> FeedSet:
    rng = np.random.default_rng(seed)
    return FeedSet([{"x": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(n)], "test")


def _ort(model: onnx.ModelProto, path=None):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if path is not None:
        opts.optimized_model_filepath = str(path)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _fused_ops(model: onnx.ModelProto, tmp_path) -> Counter:
    """Op types of ONNX Runtime's optimized graph of ``model`` (what its CPU provider really runs)."""
    _ort(model, tmp_path / "opt.onnx")
    return Counter(n.op_type for n in onnx.load(tmp_path / "opt.onnx").graph.node)


# -- the rewrite, on a tiny model ----------------------------------------------------------------


def test_weights_are_int8_per_output_channel_with_the_schemes_range(tmp_path):
    loaded = _tiny(tmp_path / "t.onnx")
    r = quantize_model(loaded, SCHEME, _feeds(2), _feeds(4, 1), method=DYNAMIC)
    inits = {t.name: numpy_helper.to_array(t) for t in r.model.graph.initializer}
    ops = Counter(n.op_type for n in r.model.graph.node)
    assert ops["MatMulInteger"] == 2 and ops["DynamicQuantizeLinear"] == 2 and ops["MatMul"] == ops["Gemm"] == 0
    w1, s1 = inits["W1__wq"], inits["W1__wscale"]
    assert w1.dtype == np.int8 and w1.shape == (16, 12) and s1.shape == (12,)
    assert np.abs(w1).max(axis=0).tolist() == [63] * 12  # every column reaches the 7-bit range
    assert inits["W2__T__wq"].shape == (12, 6)  # Gemm transB: stored as [K, N] for MatMulInteger
    assert "W1" not in inits and "W2" not in inits  # float weights gone
    # scales follow each column's own absmax (W1's columns were scaled 0.1 .. 3)
    w = numpy_helper.to_array(onnx.load(tmp_path / "t.onnx").graph.initializer[0])
    assert np.allclose(s1, np.abs(w).max(axis=0) / 63, rtol=1e-6)
    assert r.method == "dynamic" and r.calibration_samples == 0 and r.layers == []
    assert r.agreement.outputs[0].cosine > 0.999


def test_the_dynamic_batch_dimension_is_kept(tmp_path):
    loaded = _tiny(tmp_path / "t.onnx")
    r = quantize_model(loaded, SCHEME, _feeds(2), _feeds(2, 1), method=DYNAMIC)
    dims = r.model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N" and dims[1].dim_value == 16
    assert with_dynamic_inputs(r.model, loaded, SCHEME) is r.model
    x = np.random.default_rng(5).standard_normal((9, 16)).astype(np.float32)  # not the shape it was planned at
    assert session(r.model.SerializeToString(), reference=True).run(None, {"x": x})[0].shape == (9, 6)


@pytest.mark.parametrize("bias_first", [False, True])
def test_exclude_keeps_a_node_float_and_bias_fuses(tmp_path, bias_first):
    loaded = _tiny(tmp_path / "t.onnx", bias_first=bias_first)
    r = quantize_model(loaded, SCHEME, _feeds(2), _feeds(2, 1), method=DYNAMIC, exclude=["gemm2"])
    ops = Counter(n.op_type for n in r.model.graph.node)
    assert ops["MatMulInteger"] == 1 and ops["Gemm"] == 1
    assert {d.name: d.kind for d in r.analysis.decisions}["gemm2"] == "float"
    fused = _fused_ops(r.model, tmp_path)
    # MatMul + Add(b1) into one kernel: DynamicQuantizeMatMul takes the bias (its 5th input)
    assert fused["DynamicQuantizeMatMul"] == 1 and fused["MatMulInteger"] == 0 and fused["Add"] == 0
    with pytest.raises(UsageError, match="no node called 'nope'"):
        quantize_model(loaded, SCHEME, _feeds(2), _feeds(2, 1), method=DYNAMIC, exclude=["nope"])


def test_ort_fuses_every_matmul_into_an_int8_kernel(tmp_path):
    loaded = _tiny(tmp_path / "t.onnx")
    r = quantize_model(loaded, SCHEME, _feeds(2), _feeds(2, 1), method=DYNAMIC)
    fused = _fused_ops(r.model, tmp_path)
    assert fused["DynamicQuantizeMatMul"] == 2, fused
    assert not {"MatMul", "Gemm", "MatMulInteger", "DynamicQuantizeLinear"} & set(fused), fused


def test_reference_equals_the_fused_kernels_with_7_bit_weights(tmp_path):
    # |q| <= 63: the u8s8 kernels cannot saturate, so ORT's fused int8 result is the model's meaning
    loaded = _tiny(tmp_path / "t.onnx")
    r = quantize_model(loaded, SCHEME, _feeds(2), _feeds(2, 1), method=DYNAMIC)
    ref, fused = session(r.model.SerializeToString(), reference=True), _ort(r.model)
    for feed in _feeds(6, 7).feeds:
        a, b = ref.run(None, feed)[0], fused.run(None, feed)[0]
        assert np.allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(a).max()), np.abs(a - b).max()
    # and the reference runs no integer kernel at all (so no CPU's int8 instructions decide it)
    assert not {"MatMulInteger", "ConvInteger"} & {n.op_type for n in reference_form(r.model).graph.node}


def test_reference_form_is_exact_integer_arithmetic():
    # 8-bit operands with sums far beyond int16 (where the host's VPMADDUBSW path saturates)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (3, 300)).astype(np.uint8)
    b = rng.integers(-127, 128, (300, 5)).astype(np.int8)
    azp, bzp = np.uint8(131), np.int8(3)
    m = onnx_model(
        [helper.make_node("MatMulInteger", ["a", "b", "azp", "bzp"], ["y"])],
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 300])], [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(azp), "azp"), numpy_helper.from_array(np.array(bzp), "bzp")],
    )
    want = (a.astype(np.int64) - 131) @ (b.astype(np.int64) - 3)
    got = session(m.SerializeToString(), reference=True).run(None, {"a": a})[0]
    assert got.dtype == np.int32 and np.array_equal(got, want)


def test_conv_stays_float_and_conv_integer_has_an_exact_reference(tmp_path):
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W")
    model = onnx_model([helper.make_node("Conv", ["x", "W"], ["c"], "conv", pads=[1, 1, 1, 1]), helper.make_node("Flatten", ["c"], ["f"], "flat"),
                        helper.make_node("MatMul", ["f", "W2"], ["y"], "fc")],
                       [float_io("x", [1, 3, 4, 4])], [float_io("y", [1, 5])],
                       [w, numpy_helper.from_array(rng.standard_normal((128, 5)).astype(np.float32), "W2")])
    a = analyze(prepare(model, ()), ())
    kinds = {d.name: (d.kind, d.reason) for d in a.decisions}
    assert kinds["conv"][0] == "float" and "ConvInteger is slower" in kinds["conv"][1] and kinds["fc"][0] == "int8"
    # ConvInteger (ORT's quantize_dynamic writes it): the reference computes it in float, exactly
    xq = rng.integers(0, 256, (1, 3, 9, 9)).astype(np.uint8)
    wq = rng.integers(-63, 64, (4, 3, 3, 3)).astype(np.int8)  # 7-bit: the host's u8s8 kernel cannot saturate
    m = onnx_model(
        [helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], strides=[2, 2])],
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 9, 9])], [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(wq, "w"), numpy_helper.from_array(np.array(117, np.uint8), "xz"), numpy_helper.from_array(np.array(0, np.int8), "wz")],
    )
    ref = session(m.SerializeToString(), reference=True).run(None, {"x": xq})[0]
    assert ref.dtype == np.int32 and np.array_equal(ref, _ort(m).run(None, {"x": xq})[0])
    xs, ws = xq[0].astype(np.int64) - 117, wq.astype(np.int64)
    want = np.array([[[(xs[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3] * ws[o]).sum() for j in range(4)] for i in range(4)] for o in range(4)])
    assert np.array_equal(ref[0], want)


# -- bad inputs ----------------------------------------------------------------------------------


def test_dynamic_takes_no_plus_options():
    assert parse_method("dynamic").ranges == DYNAMIC
    with pytest.raises(UsageError, match="dynamic takes no \\+ options") as exc:
        parse_method("dynamic+bias")
    assert exc.value.hint and "--method dynamic" in exc.value.hint


def test_a_model_without_weights_is_refused(tmp_path):
    model = onnx_model([helper.make_node("Relu", ["x"], ["y"])], [float_io("x", [1, 4])], [float_io("y", [1, 4])])
    onnx.save(model, tmp_path / "r.onnx")
    loaded = load_model(tmp_path / "r.onnx")
    feeds = random_feeds(loaded.inputs, 2)
    with pytest.raises(ModelError, match="no MatMul or Gemm"):
        quantize_model(loaded, SCHEME, feeds, feeds, method=DYNAMIC)


def test_analysis_says_why_a_matmul_stays_float():
    w = numpy_helper.from_array(np.ones((2, 4, 3), np.float32), "W")
    model = onnx_model([helper.make_node("MatMul", ["x", "W"], ["y"], "mm3d"), helper.make_node("MatMul", ["x", "x2"], ["z"], "act")],
                       [float_io("x", [2, 5, 4]), float_io("x2", [2, 4, 5])], [float_io("y", None), float_io("z", None)], [w])
    a = analyze(prepare(model, ()), ())
    why = {d.name: d.reason for d in a.decisions}
    assert "3-D weight" in why["mm3d"] and "not a constant" in why["act"]
    assert a.summary() == {"float": 2}
    assert rewrite(model, a, SCHEME).graph.node[0].op_type == "MatMul"


def test_forcing_a_backend_without_dynamic_int8_is_a_plan_error(tmp_path):
    from edgekit.plan import make_plan
    from edgekit.profiles import load_profile

    loaded = _tiny(tmp_path / "t.onnx")
    with pytest.raises(PlanError, match="--backend native cannot run --method dynamic: ekrt has no run-time-quantized int8"):
        make_plan(loaded, load_profile("local"), backend="native", method=DYNAMIC)
    plan = make_plan(loaded, load_profile("local"), method=DYNAMIC, goal="quantize")
    assert plan.backend == "onnxruntime"
    assert ("native", "--method dynamic: ekrt has no run-time-quantized int8; onnxruntime runs it") in plan.skipped
    assert any(n.startswith("not native: --method dynamic") for n in plan.notes)
    # the x86-openvino target prefers OpenVINO, whose CPU plugin runs these in f32: skipped too
    ov = make_plan(loaded, load_profile("x86-openvino"), method=DYNAMIC, goal="quantize")
    assert ov.backend == "onnxruntime" and any(b == "openvino" and "f32" in r for b, r in ov.skipped)
    # a static method is unchanged
    assert make_plan(loaded, load_profile("local"), goal="quantize").backend == "native"


def test_the_cli_spells_dynamic_as_the_quantizer_does():
    from edgekit.cli import common

    assert common.DYNAMIC == DYNAMIC


def test_cli_quantize_dynamic_json(cli, tmp_path):
    _tiny(tmp_path / "t.onnx")
    out = tmp_path / "t.dyn.onnx"
    r = cli("quantize", tmp_path / "t.onnx", "-o", out, "--shape", "x:4,16", "--method", "dynamic", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["method"] == "dynamic" and doc["calibration"]["samples"] == 0 and doc["nodes"]["int8"] == 2
    assert Counter(n.op_type for n in onnx.load(out).graph.node)["MatMulInteger"] == 2
    bad = cli("quantize", tmp_path / "t.onnx", "-o", out, "--shape", "x:4,16", "--method", "dynamic+bias")
    assert_one_line_error(bad, 2, "dynamic takes no + options")
    forced = cli("quantize", tmp_path / "t.onnx", "-o", out, "--shape", "x:4,16", "--method", "dynamic", "--backend", "native")
    assert forced.returncode != 0 and "ekrt has no run-time-quantized int8" in forced.stderr


def test_max_drop_holds_or_refuses_without_a_layer_search(tmp_path):
    loaded = _tiny(tmp_path / "t.onnx")
    ok = quantize_model(loaded, SCHEME, _feeds(2), _feeds(4, 1), method=DYNAMIC, max_drop=1.0, metric="cosine")
    assert ok.mixed_precision["holds"] and ok.mixed_precision["method"] == "dynamic" and ok.mixed_precision["float_layers"] == []
    strict = quantize_model(loaded, SCHEME, _feeds(2), _feeds(4, 1), method=DYNAMIC, max_drop=0.0, metric="snr")
    assert strict.mixed_precision["holds"] is False  # snr with 0 % noise allowed cannot hold for int8


# -- real models ---------------------------------------------------------------------------------


def _agreement(name: str, method: str, calib: int = 16, held: int = 16):
    from realmodels import CATALOGUE, real_model_data, run_outputs

    loaded, c, h = real_model_data(name, calib, held)
    r = quantize_model(loaded, SCHEME, FeedSet(c.feeds, "calib"), FeedSet(h.feeds, "held"), method=method)
    ref = run_outputs(loaded.path, h.feeds, reference=False)
    sess = session(r.model.SerializeToString(), reference=True)  # Q/DQ reference; integer ops computed in float
    return r, CATALOGUE[name].metric(ref, [sess.run(None, f) for f in h.feeds], h)


@pytest.mark.realmodels
def test_magika_dynamic_keeps_the_classes_static_collapses(tmp_path):
    dyn, score = _agreement("magika", DYNAMIC, held=32)
    assert score.value >= 0.99, score
    assert dyn.agreement.outputs[0].top1 >= 0.99  # what edgekit itself reports, Q/DQ-reference style
    _, static = _agreement("magika", "minmax", held=32)
    assert static.value < 0.5, static
    # ORT runs both MatMuls as fused int8 kernels; the Conv stays float (ConvInteger is slower)
    fused = _fused_ops(dyn.model, tmp_path)
    assert fused["DynamicQuantizeMatMul"] == 2 and fused["ConvInteger"] == 0, fused
    assert fused["MatMul"] == 0 and fused["MatMulInteger"] == 0


@pytest.mark.realmodels
def test_minilm_dynamic_embeddings_hold_where_static_drifts(tmp_path):
    from realmodels import real_model

    dyn, score = _agreement("minilm-l3", DYNAMIC)
    _, static = _agreement("minilm-l3", "auto")
    assert score.value >= 0.99, score
    assert score.value > static.value, (score, static)
    fused = _fused_ops(dyn.model, tmp_path)
    # every weight MatMul is an int8 kernel (Q, K, V share one DynamicQuantizeLinear once ORT merges
    # theirs, so those stay MatMulIntegerToFloat); the MatMuls left are attention's, activation x activation
    int8 = fused["DynamicQuantizeMatMul"] + fused["MatMulIntegerToFloat"]
    kinds = Counter(d.op_type for d in dyn.analysis.decisions if d.kind == "int8")
    assert int8 == kinds["MatMul"] + kinds["Gemm"] > 0 and fused["MatMulInteger"] == 0, fused
    # the token embeddings (30522 x 384, 45 MiB in float) are stored int8
    assert kinds["Gather"] == 1 and dyn.model.ByteSize() < 0.3 * onnx.load(real_model("minilm-l3").locate()).ByteSize()


def _chain(path, layers: int = 4):
    """x[1, 16] -> layers x (MatMul 16x16): every layer int8 in both forms."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32) / 4, f"W{i}") for i in range(layers)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i}", f"W{i}"], [f"h{i + 1}" if i < layers - 1 else "y"], f"mm{i}") for i in range(layers)]
    onnx.save(onnx_model(nodes, [float_io("x", [1, 16])], [float_io("y", [1, 16])], inits), path)
    return load_model(path)


def test_max_drop_falls_back_to_dynamic_when_static_cannot_hold(tmp_path):
    # calibrated on values 10^4 times larger than the held-out ones: every static range is far too
    # wide (the held-out activations round to a few steps), and keeping half the layers float cannot
    # fix the rest; run-time ranges fit each input
    loaded = _chain(tmp_path / "c.onnx")
    rng = np.random.default_rng(0)
    calib = FeedSet([{"x": rng.standard_normal((1, 16)).astype(np.float32) * 100} for _ in range(8)], "calib")
    held = FeedSet([{"x": rng.standard_normal((1, 16)).astype(np.float32) * 0.01} for _ in range(8)], "held")
    static = quantize_model(loaded, SCHEME, calib, held, method="minmax", max_drop=1.0, metric="cosine")
    assert static.mixed_precision["holds"] is False and static.method == "minmax"
    r = quantize_model(loaded, SCHEME, calib, held, method="minmax", max_drop=1.0, metric="cosine", dynamic_fallback=True)
    mp = r.mixed_precision
    assert r.method == DYNAMIC and mp["holds"] and mp["before"] >= mp["goal"]
    # static searched on the calibration samples (its ranges fit them) and missed on the held-out ones
    ff = mp["fallback_from"]
    assert ff["method"] == "minmax" and ff["judged"]["missed"] and ff["judged"]["after"] < mp["goal"]
    assert Counter(n.op_type for n in r.model.graph.node)["MatMulInteger"] == 4
    assert mp["int8_mac_share"] == 1.0  # every MAC is a MatMul's, all int8 at run time


def test_the_per_layer_report_is_refused_for_dynamic(cli, tmp_path):
    _tiny(tmp_path / "t.onnx")
    out = tmp_path / "t.dyn.onnx"
    r = cli("quantize", tmp_path / "t.onnx", "-o", out, "--shape", "x:4,16", "--method", "dynamic", "--report")
    assert_one_line_error(r, 2, "--method dynamic quantizes activations at run time")
    assert not out.exists()


def test_an_embedding_table_is_stored_int8_per_row(tmp_path):
    rng = np.random.default_rng(6)
    table = (rng.standard_normal((500, 16)) * np.linspace(0.01, 5, 500)[:, None]).astype(np.float32)  # rows of very different sizes
    model = onnx_model([helper.make_node("Gather", ["E", "ids"], ["e"], "embed"), helper.make_node("MatMul", ["e", "W"], ["y"], "proj")],
                       [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 7])], [float_io("y", [1, 7, 4])],
                       [numpy_helper.from_array(table, "E"), numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "W")])
    onnx.save(model, tmp_path / "e.onnx")
    loaded = load_model(tmp_path / "e.onnx")
    feeds = FeedSet([{"ids": rng.integers(0, 500, (1, 7))} for _ in range(4)], "t")
    r = quantize_model(loaded, SCHEME, feeds, feeds, method=DYNAMIC)
    inits = {t.name: numpy_helper.to_array(t) for t in r.model.graph.initializer}
    assert inits["E__rows"].dtype == np.int8 and "E" not in inits
    assert np.abs(inits["E__rows"]).max(axis=1).tolist() == [127] * 500  # per row: small rows keep their resolution
    ids = np.array([[0, 1, 499, 250, 3, 3, 2]])
    m = onnx.ModelProto()
    m.CopyFrom(r.model)
    m.graph.output.append(float_io("e", None))  # the looked-up rows, dequantized
    rows = session(m.SerializeToString(), reference=True).run(["e"], {"ids": ids})[0][0]
    step = np.abs(table[ids[0]]).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(rows - table[ids[0]]) <= step / 2 * 1.0001)
    assert r.agreement.outputs[0].cosine > 0.999


def test_cli_max_drop_falls_back_only_where_the_backend_runs_dynamic(cli, tmp_path):
    _chain(tmp_path / "c.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((8, 16)).astype(np.float32) * 100)
    np.savez(tmp_path / "held.npz", x=rng.standard_normal((8, 16)).astype(np.float32) * 0.01)
    args = ("quantize", tmp_path / "c.onnx", "-o", tmp_path / "q.onnx", "--calib", tmp_path / "calib.npz", "--eval", tmp_path / "held.npz",
            "--method", "minmax", "--max-drop", "1", "--metric", "cosine")
    ort_run = cli(*args, "--backend", "onnxruntime", "--json")
    assert ort_run.returncode == 0, ort_run.stderr
    doc = json.loads(ort_run.stdout)
    assert doc["method"] == "dynamic" and doc["mixed_precision"]["fallback_from"]["method"] == "minmax"
    assert "--method dynamic does" in ort_run.stderr
    native = cli(*args, "--backend", "native")  # ekrt runs no dynamic int8: static refuses as before
    assert native.returncode == 5 and "cannot hold" in native.stderr, native.stderr


def test_initializers_read_only_inside_an_if_branch_survive_the_rewrite(tmp_path):
    # y = x @ W, then If(flag): y + c else y - c, where c is an outer initializer only the
    # branches read (silero-vad's shape): the rewrite drops W's float copy, never c
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W")
    c = numpy_helper.from_array(np.full((1, 16), 0.5, np.float32), "c")
    branch = lambda op, name: helper.make_graph([helper.make_node(op, ["y", "c"], [f"{name}_out"])], name, [], [float_io(f"{name}_out", [1, 16])])  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y"], "mm"),
        helper.make_node("If", ["flag"], ["z"], "branch", then_branch=branch("Add", "then"), else_branch=branch("Sub", "else")),
    ]
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    onnx.save(onnx_model(nodes, [float_io("x", [1, 16]), flag], [float_io("z", [1, 16])], [w, c]), tmp_path / "if.onnx")
    loaded = load_model(tmp_path / "if.onnx")
    feeds = [{"x": rng.standard_normal((1, 16)).astype(np.float32), "flag": np.array(v)} for v in (True, False)]
    r = quantize_model(loaded, SCHEME, FeedSet(feeds, "calib"), FeedSet(feeds, "held"), method=DYNAMIC)
    names = {t.name for t in r.model.graph.initializer}
    assert "c" in names and "W" not in names
    onnx.checker.check_model(r.model)
    for feed in feeds:
        got = session(r.model.SerializeToString(), reference=True).run(None, feed)[0]
        want = session(loaded.model.SerializeToString(), reference=True).run(None, feed)[0]
        np.testing.assert_allclose(got, want, atol=0.2)
