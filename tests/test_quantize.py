"""Model loading (modelio), graph preparation, per-op analysis and the QDQ rewrite.

Small models are built node by node with onnx.helper; ONNX Runtime runs them before and after.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import ModelError, UsageError
from edgekit.modelio import (
    IOSpec,
    load_model,
    onnx_opset,
    parse_shape_overrides,
    read_sidecar,
    with_static_inputs,
)
from edgekit.quantize import (
    SCHEMES,
    FeedSet,
    QuantScheme,
    analyze_model,
    qmath,
    quantize_model,
    random_feeds,
    save_model,
)
from edgekit.quantize.calib import collect_ranges
from edgekit.quantize.prepare import prepare
from edgekit.quantize.report import compare
from edgekit.quantize.rewrite import analyze, rewrite, tensor_params

REPO = Path(__file__).resolve().parents[1]
DIGITS = REPO / "examples" / "digits" / "digits_cnn.onnx"
F = TensorProto.FLOAT


# -- building blocks -----------------------------------------------------------------------------


def make_model(nodes, inputs, outputs, inits=(), opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    # IR 8: new enough for every opset used here, old enough for any onnxruntime >= 1.17.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def init(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def vi(name: str, shape, elem=F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def run(model: onnx.ModelProto, feed: dict, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def rand(shape, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def inits_of(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def producer(model: onnx.ModelProto, tensor: str) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if tensor in n.output]
    return node


def consumers(model: onnx.ModelProto, tensor: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if tensor in n.input]


def node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    (n,) = [n for n in model.graph.node if n.name == name]
    return n


def attr(n: onnx.NodeProto, name: str, default=None):
    return next((helper.get_attribute_value(a) for a in n.attribute if a.name == name), default)


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path))
    return path


def conv_bn_model(opset: int = 13) -> onnx.ModelProto:
    """Conv(+bias) -> BN -> Relu -> depthwise Conv(no bias) -> BN -> output."""
    rng = np.random.default_rng(0)
    c = 6
    inits = [
        init("w1", rng.normal(0, 0.3, (c, 3, 3, 3)).astype(np.float32)),
        init("b1", rng.normal(0, 0.1, c).astype(np.float32)),
        init("w2", rng.normal(0, 0.3, (c, 1, 3, 3)).astype(np.float32)),
    ]
    for k in (1, 2):
        inits += [
            init(f"g{k}", rng.uniform(0.5, 2.0, c).astype(np.float32)),
            init(f"be{k}", rng.normal(0, 0.5, c).astype(np.float32)),
            init(f"m{k}", rng.normal(0, 0.5, c).astype(np.float32)),
            init(f"v{k}", rng.uniform(0.1, 3.0, c).astype(np.float32)),
        ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g1", "be1", "m1", "v1"], ["n1"], name="bn1", epsilon=1e-3),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="dw", group=c, pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c2", "g2", "be2", "m2", "v2"], ["y"], name="bn2"),
    ]
    return make_model(nodes, [vi("x", [1, 3, 10, 10])], [vi("y", [1, c, 10, 10])], inits, opset)


def mixed_model() -> onnx.ModelProto:
    """A small graph touching every kind of decision.

    x -> conv1 -> relu1 -> pool (MaxPool) -> convt (ConvTranspose) -> sig (Sigmoid) -> div (Div)
      -> conv2 -> clip (Clip 0..6) -> flat (Reshape) -> gemm0 (transB=0) -> gemm1 (transB=1) = logits
      -> softmax = prob
    """
    rng = np.random.default_rng(1)
    inits = [
        init("W1", rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32)),
        init("B1", rng.normal(0, 0.2, 8).astype(np.float32)),
        init("WT", rng.normal(0, 0.4, (8, 6, 2, 2)).astype(np.float32)),
        init("BT", rng.normal(0, 0.2, 6).astype(np.float32)),
        init("two", np.array(2.0, np.float32)),
        init("W2", rng.normal(0, 0.4, (4, 6, 3, 3)).astype(np.float32)),
        init("B2", rng.normal(0, 0.2, 4).astype(np.float32)),
        init("lo", np.array(0.0, np.float32)),
        init("hi", np.array(6.0, np.float32)),
        init("shape", np.array([1, 256], np.int64)),
        init("G0", rng.normal(0, 0.1, (256, 32)).astype(np.float32)),
        init("C0", rng.normal(0, 0.2, 32).astype(np.float32)),
        init("G1", rng.normal(0, 0.3, (10, 32)).astype(np.float32)),
        init("C1", rng.normal(0, 0.2, 10).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("ConvTranspose", ["p1", "WT", "BT"], ["t1"], name="convt", strides=[2, 2]),
        helper.make_node("Sigmoid", ["t1"], ["s1"], name="sig"),
        helper.make_node("Div", ["s1", "two"], ["d1"], name="div"),
        helper.make_node("Conv", ["d1", "W2", "B2"], ["c2"], name="conv2", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["k2"], name="clip"),
        helper.make_node("Reshape", ["k2", "shape"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "G0", "C0"], ["g0"], name="gemm0"),
        helper.make_node("Gemm", ["g0", "G1", "C1"], ["logits"], name="gemm1", transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=1),
    ]
    return make_model(nodes, [vi("x", [1, 3, 16, 16])], [vi("logits", [1, 10]), vi("prob", [1, 10])], inits)


MIXED_EXPECTED = {
    "conv1": "int8",
    "relu1": "fused",
    "pool": "passthrough",
    "convt": "int8",
    "sig": "float",
    "div": "float",
    "conv2": "int8",
    "clip": "fused",
    "flat": "passthrough",
    "gemm0": "int8",
    "gemm1": "int8",
    "softmax": "float",
}


def feeds_for(name: str, shape, n: int, seed: int = 0) -> list[dict]:
    return [{name: rand(shape, seed * 1000 + i)} for i in range(n)]


def quantize_built(model: onnx.ModelProto, scheme: QuantScheme, exclude=(), n: int = 16):
    """prepare + analyze + calibrate + rewrite, the steps quantize_model runs, on an in-memory model."""
    (inp,) = model.graph.input
    shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
    prepared = prepare(model, (IOSpec(inp.name, shape, "float32"),))
    analysis = analyze(prepared, scheme, exclude)
    ranges = collect_ranges(prepared, analysis.calibrated, feeds_for(inp.name, shape, n), symmetric=scheme.activation_symmetric)
    params = tensor_params(analysis, ranges, scheme)
    return prepared, analysis, params, rewrite(prepared, analysis, params, scheme)


@pytest.fixture(scope="module")
def mixed_ort():
    return quantize_built(mixed_model(), SCHEMES["onnxruntime"])


def dq_source(model: onnx.ModelProto, tensor: str) -> tuple[onnx.NodeProto, dict[str, np.ndarray]]:
    """The DequantizeLinear producing ``tensor`` and its (q, scale, zp) initializer values."""
    dq = producer(model, tensor)
    assert dq.op_type == "DequantizeLinear", (tensor, dq.op_type)
    inits = inits_of(model)
    return dq, {k: inits[v] for k, v in zip(("q", "scale", "zp"), dq.input)}


def q_params(model: onnx.ModelProto, tensor: str) -> tuple[np.ndarray, np.ndarray]:
    """scale and zero point of the QuantizeLinear reading ``tensor``."""
    (q,) = [n for n in consumers(model, tensor) if n.op_type == "QuantizeLinear"]
    inits = inits_of(model)
    return inits[q.input[1]], inits[q.input[2]]


# -- modelio -------------------------------------------------------------------------------------


def test_load_model_reads_the_digits_example():
    loaded = load_model(DIGITS)
    assert loaded.name == "digits_cnn"
    assert loaded.opset == 13
    assert [(i.name, i.shape, i.dtype) for i in loaded.inputs] == [("input", (1, 1, 8, 8), "float32")]
    assert [(o.name, o.shape, o.dtype) for o in loaded.outputs] == [("logits", (1, 10), "float32")]
    assert len(loaded.sha256) == 64
    side = loaded.sidecar
    assert side.calibration == DIGITS.parent.resolve() / "calib.npz"
    assert side.evaluation == DIGITS.parent.resolve() / "heldout.npz"
    assert side.labels == DIGITS.parent.resolve() / "heldout_labels.npy"


@pytest.mark.parametrize(
    "setup,needle",
    [
        (lambda p: None, "model file not found"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b""), "is empty"),
        (lambda p: p.write_bytes(b"\x08\x07garbage that is not protobuf \xff\xff\xff"), "not an ONNX model"),
        (lambda p: p.write_bytes(DIGITS.read_bytes()[:5000]), "not an ONNX model"),
    ],
    ids=["missing", "directory", "empty", "garbage", "truncated"],
)
def test_load_model_bad_files(tmp_path, setup, needle):
    path = tmp_path / "m.onnx"
    setup(path)
    with pytest.raises(ModelError, match=needle) as exc:
        load_model(path)
    assert exc.value.hint


def test_load_model_refuses_a_model_onnx_checker_rejects(tmp_path):
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [1, 4])], [vi("y", [1, 4])])
    m.graph.node[0].input[0] = "nowhere"  # dangling input
    with pytest.raises(ModelError, match="invalid ONNX model") as exc:
        load_model(save(m, tmp_path / "bad.onnx"))
    assert "onnx.checker" in exc.value.hint


def dynamic_model() -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [vi("x", ["N", 3, "H", 32])],
        [vi("y", ["N", 3, "H", 32])],
    )


def test_dynamic_input_needs_a_shape(tmp_path):
    path = save(dynamic_model(), tmp_path / "dyn.onnx")
    with pytest.raises(ModelError, match=r"input 'x' has a dynamic shape \[\?,3,\?,32\]") as exc:
        load_model(path)
    assert "--shape x:1,3,224,32" in exc.value.hint
    loaded = load_model(path, {"x": (2, 3, 64, 32)})
    assert loaded.inputs[0].shape == (2, 3, 64, 32)
    static = with_static_inputs(loaded.model, loaded.inputs)
    dims = [d.dim_value for d in static.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [2, 3, 64, 32]


@pytest.mark.parametrize(
    "shapes,needle",
    [
        ({"nope": (1, 3, 8, 32)}, "the model's inputs are: x"),
        ({"x": (1, 3, 8)}, "has 3 dimensions, the model's input has 4"),
        ({"x": (1, 3, 8, 64)}, "dimension 3 is fixed to 32"),
    ],
)
def test_shape_overrides_are_checked(tmp_path, shapes, needle):
    with pytest.raises(UsageError, match=needle):
        load_model(save(dynamic_model(), tmp_path / "dyn.onnx"), shapes)


def test_sidecar_shape_and_paths(tmp_path):
    path = save(dynamic_model(), tmp_path / "dyn.onnx")
    (tmp_path / "dyn.edgekit.toml").write_text(
        '[calibration]\ndata = "data/c.npz"\n[evaluation]\ndata = "e.npz"\nlabels = "l.npy"\n[inputs.x]\nshape = [1, 3, 16, 32]\n'
    )
    side = read_sidecar(path)
    assert side.calibration == (tmp_path / "data" / "c.npz").resolve()
    assert side.labels == (tmp_path / "l.npy").resolve()
    assert load_model(path).inputs[0].shape == (1, 3, 16, 32)
    assert load_model(path, {"x": (4, 3, 8, 32)}).inputs[0].shape == (4, 3, 8, 32)  # the flag wins


@pytest.mark.parametrize(
    "text,needle",
    [
        ("[calibration\n", "invalid TOML"),
        ("[calibration]\ndata = 3\n", "calibration.data must be a path string"),
        ("[inputs.x]\nshape = [1, 0, 16, 32]\n", "inputs.x.shape must be a list of positive integers"),
        ("[inputs.x]\nshape = \"1,3,16,32\"\n", "inputs.x.shape must be a list of positive integers"),
        ("[calibration]\ndat = \"c.npz\"\n", "calibration.dat: unknown key 'dat'"),  # was: random calibration data, silently
        ("[calibrate]\ndata = \"c.npz\"\n", "unknown key 'calibrate'"),
        ("[inputs.x]\nshap = [1, 3]\n", "inputs.x.shap: unknown key 'shap'"),
    ],
)
def test_bad_sidecar(tmp_path, text, needle):
    path = save(dynamic_model(), tmp_path / "dyn.onnx")
    (tmp_path / "dyn.edgekit.toml").write_text(text)
    with pytest.raises(ModelError, match=needle):
        load_model(path)


def test_sidecar_section_that_is_not_a_table(tmp_path):
    path = save(dynamic_model(), tmp_path / "dyn.onnx")
    (tmp_path / "dyn.edgekit.toml").write_text('calibration = "calib.npz"\n')
    with pytest.raises(ModelError, match="calibration"):
        read_sidecar(path)


def test_parse_shape_overrides():
    assert parse_shape_overrides(None) == {}
    assert parse_shape_overrides(["input:1,3,224,224", " mask : 1 x 128 "]) == {"input": (1, 3, 224, 224), "mask": (1, 128)}
    for bad in ("input", "input:", "input:1,a", ":1,2", "input:1,,2"):
        with pytest.raises(UsageError, match="bad --shape value"):
            parse_shape_overrides([bad])
    with pytest.raises(UsageError, match="must be positive"):
        parse_shape_overrides(["input:1,0,8"])


def test_parse_shape_overrides_names_with_colons():
    assert parse_shape_overrides(["serving_default_x:0:1,224,224,3"]) == {"serving_default_x:0": (1, 224, 224, 3)}


# -- prepare -------------------------------------------------------------------------------------


def test_prepare_folds_batchnorm_and_keeps_the_function():
    model = conv_bn_model()
    prepared = prepare(model, (IOSpec("x", (1, 3, 10, 10), "float32"),))
    ops = [n.op_type for n in prepared.graph.node]
    assert "BatchNormalization" not in ops
    assert ops == ["Conv", "Relu", "Conv"]
    # Both convolutions now carry a bias (the depthwise one had none) and output the BN's tensor.
    conv1, _, dw = prepared.graph.node
    assert len(conv1.input) == 3 and len(dw.input) == 3
    assert dw.output[0] == "y" and attr(dw, "group") == 6
    onnx.checker.check_model(prepared)
    for seed in range(3):
        x = rand((1, 3, 10, 10), seed)
        (want,) = run(model, {"x": x})
        (got,) = run(prepared, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_prepare_leaves_batchnorm_when_conv_output_has_other_readers():
    model = conv_bn_model()
    model.graph.output.append(vi("c1", [1, 6, 10, 10]))  # conv1's own output is also wanted
    prepared = prepare(model, (IOSpec("x", (1, 3, 10, 10), "float32"),))
    assert [n.op_type for n in prepared.graph.node].count("BatchNormalization") == 1
    x = rand((1, 3, 10, 10), 5)
    for got, want in zip(run(prepared, {"x": x}), run(model, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_prepare_turns_constant_nodes_into_initializers():
    nodes = [
        helper.make_node("Constant", [], ["k"], value=init("kv", np.full((1, 4), 1.5, np.float32))),
        helper.make_node("Constant", [], ["s"], value_float=2.0),
        helper.make_node("Mul", ["x", "k"], ["a"]),
        helper.make_node("Mul", ["a", "s"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", [1, 4])], [vi("y", [1, 4])])
    prepared = prepare(model, (IOSpec("x", (1, 4), "float32"),))
    assert [n.op_type for n in prepared.graph.node] == ["Mul", "Mul"]
    inits = inits_of(prepared)
    assert inits["k"].tolist() == [[1.5] * 4] and float(inits["s"]) == 2.0
    x = rand((1, 4))
    np.testing.assert_array_equal(run(prepared, {"x": x})[0], x * 1.5 * 2.0)


def shape_chain_model(input_shape_end: int | None = None) -> onnx.ModelProto:
    """Typical exporter shape arithmetic: flatten with Shape->Gather->Unsqueeze->Concat->Reshape.

    The second Reshape takes the batch size from the graph input: Shape(x) -> Gather, or with
    ``input_shape_end`` set, opset 15's Shape(x, end=...) -> Slice-free form.
    """
    rng = np.random.default_rng(2)
    inits = [
        init("w", rng.normal(0, 0.3, (4, 2, 3, 3)).astype(np.float32)),
        init("zero", np.array(0, np.int64)),
        init("axes0", np.array([0], np.int64)),
        init("G", rng.normal(0, 0.2, (144, 5)).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["c"], ["sh"]),
        helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Constant", [], ["minus1"], value=init("m1", np.array([-1], np.int64))),
        helper.make_node("Concat", ["n1", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["c", "newshape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "G"], ["mm"]),
    ]
    if input_shape_end is None:
        nodes += [
            helper.make_node("Shape", ["x"], ["xsh"]),
            helper.make_node("Gather", ["xsh", "zero"], ["xn"], axis=0),
            helper.make_node("Unsqueeze", ["xn", "axes0"], ["xsh1"]),
        ]
    else:
        nodes.append(helper.make_node("Shape", ["x"], ["xsh1"], end=input_shape_end))
    nodes += [
        helper.make_node("Concat", ["xsh1", "minus1"], ["shape2"], axis=0),
        helper.make_node("Reshape", ["mm", "shape2"], ["y"]),
    ]
    return make_model(nodes, [vi("x", [1, 2, 6, 6])], [vi("y", [1, 5])], inits, opset=15)


def check_shape_folding(model: onnx.ModelProto) -> None:
    prepared = prepare(model, (IOSpec("x", (1, 2, 6, 6), "float32"),))
    ops = [n.op_type for n in prepared.graph.node]
    assert ops == ["Conv", "Reshape", "MatMul", "Reshape"]
    inits = inits_of(prepared)
    reshapes = [n for n in prepared.graph.node if n.op_type == "Reshape"]
    assert [inits[r.input[1]].tolist() for r in reshapes] == [[1, -1], [1, -1]]
    # Nothing left over: no int64 shape tensors but the two Reshape targets.
    assert sorted(k for k, v in inits.items() if v.dtype == np.int64) == sorted(r.input[1] for r in reshapes)
    x = rand((1, 2, 6, 6))
    np.testing.assert_allclose(run(prepared, {"x": x})[0], run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_prepare_folds_shape_arithmetic_on_static_shapes():
    check_shape_folding(shape_chain_model())


def test_prepare_folds_shape_with_end_on_a_graph_input():
    check_shape_folding(shape_chain_model(input_shape_end=1))


def test_prepare_upgrades_old_opsets():
    # Opset 11: Unsqueeze takes its axes as an attribute (an input from 13 on), Clip takes inputs.
    rng = np.random.default_rng(3)
    inits = [init("w", rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)), init("b", np.zeros(4, np.float32))]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Squeeze", ["p"], ["s"], axes=[2, 3]),
        helper.make_node("Unsqueeze", ["s"], ["y"], axes=[1]),
    ]
    model = make_model(nodes, [vi("x", [1, 3, 8, 8])], [vi("y", [1, 1, 4])], inits, opset=11)
    prepared = prepare(model, (IOSpec("x", (1, 3, 8, 8), "float32"),))
    assert onnx_opset(prepared) == 13
    unsq = [n for n in prepared.graph.node if n.op_type == "Unsqueeze"][0]
    assert len(unsq.input) == 2  # axes moved to an input
    x = rand((1, 3, 8, 8))
    np.testing.assert_allclose(run(prepared, {"x": x})[0], run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_prepare_refuses_a_quantized_model():
    inits = [init("s", np.array(0.1, np.float32)), init("z", np.array(0, np.int8))]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", [1, 4])], [vi("y", [1, 4])], inits)
    with pytest.raises(ModelError, match=r"already quantized \(has DequantizeLinear, QuantizeLinear nodes\)") as exc:
        prepare(model, (IOSpec("x", (1, 4), "float32"),))
    assert "--no-quantize" in exc.value.hint


def test_a_model_edgekit_quantized_is_refused_on_the_second_pass(tmp_path):
    loaded = load_model(DIGITS)
    cal = random_feeds(loaded.inputs, 4)
    result = quantize_model(loaded, SCHEMES["onnxruntime"], cal, cal)
    path = tmp_path / "digits.int8.onnx"
    save_model(result.model, path)
    again = load_model(path)
    with pytest.raises(ModelError, match="already quantized"):
        analyze_model(again, SCHEMES["onnxruntime"])


# -- analyze -------------------------------------------------------------------------------------


def test_decisions_on_the_mixed_model(mixed_ort):
    _, analysis, _, _ = mixed_ort
    kinds = {d.name: d.kind for d in analysis.decisions}
    assert kinds == MIXED_EXPECTED
    reasons = {d.name: d.reason for d in analysis.float_nodes}
    assert reasons["sig"] == "no int8 rule for Sigmoid in the onnxruntime scheme"
    assert reasons["div"] == "no int8 rule for Div in the onnxruntime scheme"
    assert reasons["softmax"] == "no int8 rule for Softmax in the onnxruntime scheme"
    assert analysis.summary() == {"int8": 5, "fused": 2, "passthrough": 2, "float": 3}
    assert set(analysis.rules) == {"conv1", "pool", "convt", "conv2", "flat", "gemm0", "gemm1"}
    # Calibrated tensors: the inputs of int8 ops and the outputs after fused activations.
    assert sorted(analysis.calibrated) == sorted(["x", "r1", "t1", "d1", "k2", "g0", "logits"])
    assert analysis.tensors["p1"] == ("same", "r1")
    assert analysis.tensors["f"] == ("same", "k2")


def test_fused_relu_gets_the_only_quantize(mixed_ort):
    _, _, _, q = mixed_ort
    # conv1 -> relu1 directly: no Q/DQ between them; the Q reads the Relu's output.
    assert [n.op_type for n in consumers(q, "c1")] == ["Relu"]
    assert [n.op_type for n in consumers(q, "r1")] == ["QuantizeLinear"]
    assert [n.op_type for n in consumers(q, "c2")] == ["Clip"]
    assert [n.op_type for n in consumers(q, "k2")] == ["QuantizeLinear"]


def test_passthrough_keeps_the_input_scale(mixed_ort):
    _, _, params, q = mixed_ort
    # MaxPool reads r1 (dequantized) and its output is quantized with r1's own scale and zero point.
    assert [n.op_type for n in consumers(q, "r1__dq")] == ["MaxPool"]
    for src, out in (("r1", "p1"), ("k2", "f")):
        s_in, z_in = q_params(q, src)
        s_out, z_out = q_params(q, out)
        assert s_out == s_in and z_out == z_in
        assert s_out.dtype == np.float32 and z_out.dtype == np.int8
    assert params["p1"] is params["r1"]


def test_exclude_keeps_a_node_float():
    prepared, analysis, _, q = quantize_built(mixed_model(), SCHEMES["onnxruntime"], exclude=["conv2"])
    kinds = {d.name: (d.kind, d.reason) for d in analysis.decisions}
    assert kinds["conv2"] == ("float", "excluded by --exclude")
    assert kinds["clip"] == ("float", "not after an int8 op")
    conv2 = node(q, "conv2")
    assert conv2.input[1] == "W2" and conv2.input[2] == "B2"  # float weights, untouched
    assert inits_of(q)["W2"].dtype == np.float32
    assert "c2" not in analysis.tensors and "k2" not in analysis.tensors
    # flat (Reshape) now reads a float tensor: it stays float too.
    assert kinds["flat"] == ("float", "input is not int8")


def test_exclude_unknown_name_suggests_close_matches():
    prepared = prepare(mixed_model(), (IOSpec("x", (1, 3, 16, 16), "float32"),))
    with pytest.raises(UsageError, match="--exclude names no node called 'conv3'") as exc:
        analyze(prepared, SCHEMES["onnxruntime"], ["conv3"])
    assert exc.value.hint.startswith("did you mean ")
    assert "conv1" in exc.value.hint and "conv2" in exc.value.hint
    with pytest.raises(UsageError) as exc:
        analyze(prepared, SCHEMES["onnxruntime"], ["zzzzzz"])
    assert "edgekit plan" in exc.value.hint


def test_unnamed_nodes_get_unique_stable_names():
    model = mixed_model()
    for n in model.graph.node:
        n.name = ""
    prepared = prepare(model, (IOSpec("x", (1, 3, 16, 16), "float32"),))
    names = [d.name for d in analyze(prepared, SCHEMES["onnxruntime"]).decisions]
    assert len(set(names)) == len(names) == 12
    assert names[0] == "Conv_0" and names[2] == "MaxPool_2"
    again = prepare(model, (IOSpec("x", (1, 3, 16, 16), "float32"),))
    assert [d.name for d in analyze(again, SCHEMES["onnxruntime"]).decisions] == names


# -- rewrite -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,axis,channels",
    [("conv1", 0, 8), ("convt", 1, 6), ("conv2", 0, 4), ("gemm0", 1, 32), ("gemm1", 0, 10)],
)
def test_weights_are_int8_per_output_channel(mixed_ort, name, axis, channels):
    prepared, _, _, q = mixed_ort
    n = node(q, name)
    dq, vals = dq_source(q, n.input[1])
    assert attr(dq, "axis") == axis
    assert vals["q"].dtype == np.int8 and vals["zp"].dtype == np.int8
    assert vals["scale"].shape == vals["zp"].shape == (channels,)
    assert not vals["zp"].any()
    w = inits_of(prepared)[node(prepared, name).input[1]]
    assert vals["q"].shape == w.shape
    want_scale, _ = qmath.weight_params(w, axis)
    np.testing.assert_array_equal(vals["scale"], want_scale)
    np.testing.assert_array_equal(vals["q"], qmath.quantize(w, want_scale, np.zeros(channels, np.int8), "int8", axis))
    # Dequantized weights are within half a step of the float ones.
    back = qmath.dequantize(vals["q"], vals["scale"], vals["zp"], axis)
    shape = [1] * w.ndim
    shape[axis] = -1
    assert np.all(np.abs(back - w) <= vals["scale"].reshape(shape) / 2 * (1 + 1e-6))


# The calibrated tensor whose scale the node's input carries: convt reads p1 and gemm0 reads f,
# pass-through outputs that share r1's and k2's scale.
@pytest.mark.parametrize("name,act", [("conv1", "x"), ("convt", "r1"), ("conv2", "d1"), ("gemm0", "k2"), ("gemm1", "g0")])
def test_bias_is_int32_with_input_scale_times_weight_scale(mixed_ort, name, act):
    prepared, _, _, q = mixed_ort
    n = node(q, name)
    _, w = dq_source(q, n.input[1])
    dq, b = dq_source(q, n.input[2])
    assert b["q"].dtype == np.int32 and b["zp"].dtype == np.int32 and not b["zp"].any()
    assert attr(dq, "axis") == 0
    x_scale, _ = q_params(q, act)
    np.testing.assert_allclose(b["scale"], np.float32(x_scale) * w["scale"], rtol=1e-6)
    bias = inits_of(prepared)[node(prepared, name).input[2]]
    assert np.all(np.abs(b["q"] * b["scale"].astype(np.float64) - bias) <= b["scale"] / 2 * (1 + 1e-6))


def test_float_weights_are_dropped(mixed_ort):
    _, _, _, q = mixed_ort
    floats = {t.name for t in q.graph.initializer if t.data_type == TensorProto.FLOAT and not t.name.endswith("__scale")}
    # Weights and biases became int8/int32; what stays float feeds float ops (Div, Clip's bounds).
    assert floats == {"two", "lo", "hi"}
    assert {"W1", "WT", "W2", "G0", "G1", "B1", "BT", "B2", "C0", "C1"}.isdisjoint(inits_of(q))


def test_names_of_graph_inputs_and_outputs_are_unchanged(mixed_ort):
    _, _, _, q = mixed_ort
    model = mixed_model()
    assert [i.name for i in q.graph.input] == ["x"]
    assert [o.name for o in q.graph.output] == ["logits", "prob"]
    assert [o.type for o in q.graph.output] == [o.type for o in model.graph.output]
    # logits is a graph output and read by softmax: the DQ writes it, softmax reads it.
    assert producer(q, "logits").op_type == "DequantizeLinear"
    assert [n.name for n in consumers(q, "logits")] == ["softmax"]


def test_qdq_model_passes_checker_and_runs_close_to_float(mixed_ort):
    _, _, _, q = mixed_ort
    onnx.checker.check_model(q, full_check=True)
    model = mixed_model()
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        got, want = [], []
        for feed in feeds_for("x", (1, 3, 16, 16), 8, seed=9):  # not the calibration samples
            got.append(run(q, feed, level))
            want.append(run(model, feed))
        for k in range(2):
            g = np.concatenate([o[k] for o in got])
            w = np.concatenate([o[k] for o in want])
            assert qmath.cosine(w, g) > 0.995  # measured 0.9989 (logits), 0.9997 (prob)
            assert qmath.snr_db(w, g) > 20  # measured 26.0 dB, 32.6 dB
        assert np.mean(np.concatenate([o[1] for o in got]).argmax(1) == np.concatenate([o[1] for o in want]).argmax(1)) >= 0.875


def zero_points(q: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = inits_of(q)
    out = {}
    for n in q.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert len(n.input) == 3, n.name
            out[n.name] = inits[n.input[2]]
    return out


def test_tensorrt_scheme_is_symmetric_everywhere():
    _, _, _, q = quantize_built(mixed_model(), SCHEMES["tensorrt"])
    zps = zero_points(q)
    assert len(zps) >= 20
    for name, zp in zps.items():
        assert zp.dtype in (np.int8, np.int32), name
        assert not zp.any(), f"{name} has zero point {zp}"
    # Activations use the narrow range: a symmetric scale is absmax / 127.
    inits = inits_of(q)
    for n in q.graph.node:
        if n.op_type == "QuantizeLinear":
            assert inits[n.input[2]].dtype == np.int8
    onnx.checker.check_model(q)
    x = rand((1, 3, 16, 16), 123)
    (w, _), (g, _) = run(mixed_model(), {"x": x}), run(q, {"x": x})
    assert qmath.cosine(w, g) > 0.995


def test_onnxruntime_scheme_uses_asymmetric_activations(mixed_ort):
    _, _, params, _ = mixed_ort
    # r1 is a ReLU output: asymmetric int8 puts 0 at -128 to use the whole range.
    assert int(params["r1"].zero_point) == -128
    assert int(params["x"].zero_point) != 0


def test_uint8_and_per_tensor_schemes_run():
    scheme = QuantScheme(name="u8-per-tensor", activation_dtype="uint8", per_channel=False)
    _, _, _, q = quantize_built(mixed_model(), scheme)
    onnx.checker.check_model(q)
    conv1 = node(q, "conv1")
    dq, w = dq_source(q, conv1.input[1])
    assert attr(dq, "axis") is None and w["scale"].shape == ()
    assert q_params(q, "x")[1].dtype == np.uint8
    x = rand((1, 3, 16, 16), 77)
    (w_, _), (g, _) = run(mixed_model(), {"x": x}), run(q, {"x": x})
    assert qmath.cosine(w_, g) > 0.995


def test_matmul_add_concat_and_shared_weights():
    rng = np.random.default_rng(4)
    inits = [
        init("W", rng.normal(0, 0.3, (8, 6)).astype(np.float32)),
        init("k", rng.normal(0, 1, (1, 6)).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"], name="mm1"),
        helper.make_node("MatMul", ["x", "W"], ["b"], name="mm2"),  # the same weight twice
        helper.make_node("Add", ["a", "k"], ["c"], name="addk"),  # a constant operand
        helper.make_node("Mul", ["b", "b"], ["d"], name="square"),  # one tensor on both inputs
        helper.make_node("Concat", ["c", "d"], ["y"], name="cat", axis=1),
    ]
    model = make_model(nodes, [vi("x", [2, 8])], [vi("y", [2, 12])], inits)
    _, analysis, _, q = quantize_built(model, SCHEMES["onnxruntime"])
    assert {d.name: d.kind for d in analysis.decisions} == dict.fromkeys(["mm1", "mm2", "addk", "square", "cat"], "int8")
    assert node(q, "mm1").input[1] == node(q, "mm2").input[1]  # one int8 copy of W, one DQ
    dq, w = dq_source(q, node(q, "mm1").input[1])
    assert attr(dq, "axis") == 1 and w["scale"].shape == (6,)
    dq, k = dq_source(q, node(q, "addk").input[1])
    assert k["q"].dtype == np.int8 and k["q"].shape == (1, 6)
    assert node(q, "square").input[0] == node(q, "square").input[1] == "b__dq"
    assert [o.name for o in q.graph.output] == ["y"]
    x = rand((2, 8), 8)
    assert qmath.cosine(run(model, {"x": x})[0], run(q, {"x": x})[0]) > 0.995


def test_graph_outputs_inside_the_int8_region():
    """Outputs that are a fused Relu (also read inside), a pass-through, a float op and an Add."""
    rng = np.random.default_rng(6)
    inits = [
        init("W", rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)),
        init("W2", rng.normal(0, 0.3, (4, 3, 1, 1)).astype(np.float32)),
        init("roi", np.zeros(0, np.float32)),
        init("scales", np.array([1, 1, 2, 2], np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Resize", ["r", "roi", "scales"], ["up"], name="cubic", mode="cubic"),
        helper.make_node("Resize", ["r", "roi", "scales"], ["up2"], name="nearest", mode="nearest"),
        helper.make_node("Conv", ["x", "W2"], ["c2"], name="conv2"),
        helper.make_node("Add", ["c2", "r"], ["s"], name="add"),
    ]
    outs = [vi("p", [1, 4, 4, 4]), vi("up", [1, 4, 16, 16]), vi("up2", [1, 4, 16, 16]), vi("s", [1, 4, 8, 8]), vi("r", [1, 4, 8, 8])]
    model = make_model(nodes, [vi("x", [1, 3, 8, 8])], outs, inits)
    _, analysis, _, q = quantize_built(model, SCHEMES["onnxruntime"])
    kinds = {d.name: (d.kind, d.reason) for d in analysis.decisions}
    assert kinds["cubic"] == ("float", "Resize mode other than nearest/linear")
    assert kinds["nearest"][0] == kinds["pool"][0] == "passthrough"
    assert kinds["relu"][0] == "fused" and kinds["add"][0] == "int8"
    assert [o.name for o in q.graph.output] == ["p", "up", "up2", "s", "r"]
    for name in ("p", "up2", "s", "r"):
        assert producer(q, name).op_type == "DequantizeLinear"
    assert producer(q, "up").op_type == "Resize"
    onnx.checker.check_model(q)
    x = rand((1, 3, 8, 8), 3)
    for want, got in zip(run(model, {"x": x}), run(q, {"x": x})):
        assert qmath.cosine(want, got) > 0.999


def test_scheme_values():
    d = SCHEMES["tensorrt"].to_dict()
    assert d["activation_symmetric"] is True and d["activation_dtype"] == "int8"
    assert d["ops"] == sorted(d["ops"]) and "Conv" in d["ops"]
    json.dumps(d)
    with pytest.raises(AttributeError):
        SCHEMES["onnxruntime"].per_channel = False  # frozen


# -- quantize_model end to end on a built model --------------------------------------------------


def test_quantize_model_result_and_save(tmp_path):
    loaded = load_model(save(mixed_model(), tmp_path / "mixed.onnx"))
    cal = FeedSet(feeds_for("x", (1, 3, 16, 16), 12), "built")
    held = FeedSet(feeds_for("x", (1, 3, 16, 16), 6, seed=5), "built-held", labels=np.arange(6) % 10)
    result = quantize_model(loaded, SCHEMES["onnxruntime"], cal, held, exclude=["gemm1"])
    doc = result.to_dict()
    json.dumps(doc)
    assert doc["calibration"] == {"source": "built", "samples": 12, "random": False}
    assert doc["nodes"] == {"int8": 4, "fused": 2, "passthrough": 2, "float": 4}
    assert {f["name"] for f in doc["float_nodes"]} == {"sig", "div", "gemm1", "softmax"}
    outs = {o["name"]: o for o in doc["agreement"]["outputs"]}
    assert set(outs) == {"logits", "prob"}
    assert outs["logits"]["top1"] is not None and outs["logits"]["cosine"] > 0.99
    assert doc["agreement"]["samples"] == 6 and doc["agreement"]["accuracy_fp32"] is not None
    assert doc["agreement"]["estimate"] is True and doc["agreement"]["measured_on"] == "host (Q/DQ reference semantics)"
    assert set(doc["seconds"]) == {"prepare", "calibrate", "rewrite", "evaluate"}
    out = tmp_path / "mixed.int8.onnx"
    save_model(result.model, out)
    assert onnx.load(str(out)) == result.model
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_agreement_is_a_pure_comparison_of_outputs_from_anywhere():
    fp32 = {"logits": [np.array([[3.0, 1.0, 0.0]]), np.array([[0.0, 2.0, 1.0]]), np.array([[0.0, 1.0, 5.0]])],
            "score": [np.float32(1.0), np.float32(2.0), np.float32(3.0)]}
    int8 = {"logits": [np.array([[2.9, 1.1, 0.0]]), np.array([[0.0, 1.0, 2.0]]), np.array([[0.0, 1.0, 5.0]])],
            "score": [np.float32(1.0), np.float32(2.0), np.float32(3.5)]}
    rep = compare(fp32, int8, np.array([0, 1, 1]), source="board", measured_on="device (native)", estimate=False)
    logits, score = rep.outputs
    assert rep.samples == 3 and (rep.measured_on, rep.estimate) == ("device (native)", False)
    assert logits.top1 == pytest.approx(2 / 3) and score.top1 is None
    assert (rep.accuracy_fp32, rep.accuracy_int8) == (pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert score.max_abs_err == pytest.approx(0.5) and logits.max_abs_err == pytest.approx(1.0)
    assert compare({"y": [np.ones((1, 2))]}, {"y": [np.ones((1, 2))]}, source="same").to_dict()["outputs"][0]["snr_db"] is None


def test_quantize_model_with_nothing_to_quantize(tmp_path):
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [vi("x", [1, 5])], [vi("y", [1, 5])])
    loaded = load_model(save(model, tmp_path / "softmax.onnx"))
    feeds = random_feeds(loaded.inputs, 2)
    with pytest.raises(ModelError, match="nothing in this model can be quantized") as exc:
        quantize_model(loaded, SCHEMES["onnxruntime"], feeds, feeds)
    assert "--no-quantize" in exc.value.hint


def test_a_concat_of_far_apart_ranges_keeps_its_output_float(tmp_path, monkeypatch):
    # YOLO's head: boxes in pixels (0-300) and class scores (0-1) in one tensor. One int8 scale
    # for both (~1.2 per step) rounds every score to a multiple of 1.2; its inputs keep their own.
    import sys

    rw = sys.modules["edgekit.quantize.rewrite"]  # (edgekit.quantize.rewrite the attribute is the function)
    boxes = helper.make_node("Mul", ["x", "k"], ["boxes"], name="boxes")
    scores = helper.make_node("Sigmoid", ["x"], ["scores"], name="scores")
    cat = helper.make_node("Concat", ["boxes", "scores"], ["out"], name="cat", axis=1)
    graph = helper.make_graph(
        [boxes, scores, cat], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(np.full((1, 8), 300.0, np.float32), "k")],
    )  # fmt: skip
    path = tmp_path / "head.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    feeds = [{"x": np.random.default_rng(i).uniform(-1, 1, (1, 8)).astype(np.float32)} for i in range(16)]

    def score_error(model) -> float:
        x = feeds[0]["x"]
        return float(np.abs(run(model, {"x": x})[0][:, 8:] - 1 / (1 + np.exp(-x))).max())

    result = quantize_model(load_model(path), SCHEMES["native"], FeedSet(feeds[:12], "c"), FeedSet(feeds[12:], "e"))
    decision = next(d for d in result.analysis.decisions if d.name == "cat")
    assert decision.kind == "float" and "apart" in decision.reason
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] in ("out", "out__fp") for n in result.model.graph.node)
    assert score_error(result.model) < 0.01  # the scores' own int8 scale: ~1/255
    monkeypatch.setattr(rw, "CONCAT_SPAN_RATIO", 1e9)  # one shared scale, as before
    shared = quantize_model(load_model(path), SCHEMES["native"], FeedSet(feeds[:12], "c"), FeedSet(feeds[12:], "e"))
    assert score_error(shared.model) > 0.3


def _embedding_model() -> onnx.ModelProto:
    """ids [1, 6] (int64) -> Gather from a [3000, 16] float table -> MatMul [16, 4] -> y."""
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((3000, 16)) * 0.05).astype(np.float32)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"), helper.make_node("MatMul", ["e", "w"], ["y"], name="proj")],
        "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 4])],
        initializer=[numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("scheme", ["onnxruntime", "openvino", "native", "tensorrt"])
def test_an_embedding_table_is_stored_int8_where_the_runtime_gathers_int8(tmp_path, scheme):
    """A Gather from a constant float table (MiniLM's word embeddings: 47 of its 67 MB) is int8 for
    ONNX Runtime and OpenVINO: the table int8 with one scale, the rows keep it (DQ -> Gather -> Q,
    which ORT runs as an int8 Gather); ekrt and TensorRT keep it float."""
    onnx.save(_embedding_model(), str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    feeds = [{"ids": rng.integers(0, 3000, (1, 6))} for _ in range(8)]
    r = quantize_model(loaded, SCHEMES[scheme], FeedSet(feeds, "c"), FeedSet(feeds[:2], "h"), method="minmax")
    inits = {t.name: numpy_helper.to_array(t) for t in r.model.graph.initializer}
    embed = next(n for n in r.model.graph.node if n.op_type == "Gather")
    if not SCHEMES[scheme].int8_tables:
        assert embed.input[0] == "table" and inits["table"].dtype == np.float32
        return
    q = inits["table__c__q"]
    assert "table" not in inits and q.shape == (3000, 16) and q.dtype == np.dtype(SCHEMES[scheme].activation_dtype)
    assert embed.input[0] == "table__c__dq"
    out = next(n for n in r.model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "e")
    assert out.input[1:] == ["e__scale", "e__zp"] and np.array_equal(inits["e__scale"], inits["table__c__scale"])  # the rows keep the table's scale
    assert sum(v.nbytes for v in inits.values()) < 0.3 * 3000 * 16 * 4
    ref = ort.InferenceSession(loaded.model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(r.model.SerializeToString(), providers=["CPUExecutionProvider"])  # optimized: its int8 Gather
    for f in feeds[:4]:
        a, b = ref.run(None, f)[0], got.run(None, f)[0]
        assert np.abs(a - b).max() < 0.05 * np.abs(a).max(), np.abs(a - b).max()
    if scheme == "openvino":  # and OpenVINO's CPU plugin runs it (where the extra is installed)
        ov = pytest.importorskip("openvino", reason="openvino (the openvino extra) is not installed")
        save_model(r.model, tmp_path / "q.onnx")
        compiled = ov.Core().compile_model(str(tmp_path / "q.onnx"), "CPU")
        for f in feeds[:4]:
            a, b = ref.run(None, f)[0], compiled(f)[0]
            assert np.abs(a - b).max() < 0.05 * np.abs(a).max(), np.abs(a - b).max()
