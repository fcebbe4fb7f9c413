"""The numpy reference backend: every op against ONNX Runtime, the examples to 1e-4, the
host's conversion and verdicts, the planner's choice, and the agent-side failures."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.agent import AgentFailure
from edgekit.agent.backends import numpy_ref
from edgekit.errors import ModelError
from edgekit.modelio import load_model
from edgekit.plan import make_plan
from edgekit.profiles import load_profile
from edgekit.targets import get_backend
from edgekit.targets.numpy import BACKEND, convert
from tests.conftest import EXAMPLES

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
MOBILENET = EXAMPLES / "mobilenetv2" / "mobilenetv2.onnx"
RNG = np.random.RandomState(0)


def _rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _model(nodes, inputs: dict, init: dict, outputs: list[str] | dict, opset: int = 13) -> onnx.ModelProto:
    """A graph from helper nodes: ``inputs`` name -> array (fed), ``init`` name -> array (weights);
    ``outputs`` names, or name -> shape where the model must pass onnx's checker."""
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs.items()]
    shapes = outputs if isinstance(outputs, dict) else dict.fromkeys(outputs)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in shapes.items()]
    inits = [numpy_helper.from_array(a, n) for n, a in init.items()]
    graph = helper.make_graph(nodes, "g", vi, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _compile(model: onnx.ModelProto | Path, tmp_path: Path):
    path = model if isinstance(model, Path) else tmp_path / "m.onnx"
    if not isinstance(model, Path):
        onnx.save(model, str(path))
    files = BACKEND.compile(path, tmp_path / "out")
    return files, numpy_ref.load(str(files[0]), None, {}, str(tmp_path))


def _check(model: onnx.ModelProto, feeds: dict, tmp_path: Path, tol: float = 1e-5) -> list:
    _, session = _compile(model, tmp_path)
    got = session.run(feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    return got


def _node(op, inputs, outputs=("y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), name=f"{op.lower()}_{outputs[0]}", **attrs)


# -- every op against ONNX Runtime ---------------------------------------------------------

X4 = _rand(2, 6, 9, 11)
CONV_CASES = {
    "plain": ({"kernel_shape": [3, 3]}, _rand(4, 6, 3, 3), True),
    "pads-strides": ({"kernel_shape": [3, 3], "pads": [1, 2, 0, 1], "strides": [2, 3]}, _rand(4, 6, 3, 3), True),
    "dilations": ({"kernel_shape": [3, 2], "dilations": [2, 3], "pads": [2, 1, 2, 1]}, _rand(5, 6, 3, 2), False),
    "groups": ({"group": 3, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, _rand(6, 2, 3, 3), True),
    "depthwise-stride2": ({"group": 6, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, _rand(6, 1, 3, 3), True),
    "same-upper": ({"auto_pad": "SAME_UPPER", "kernel_shape": [4, 4], "strides": [2, 2]}, _rand(3, 6, 4, 4), True),
    "same-lower": ({"auto_pad": "SAME_LOWER", "kernel_shape": [2, 3]}, _rand(3, 6, 2, 3), False),
    "valid": ({"auto_pad": "VALID", "kernel_shape": [5, 5], "strides": [3, 2]}, _rand(2, 6, 5, 5), True),
    "no-kernel-attr": ({}, _rand(4, 6, 1, 1), True),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(case, tmp_path):
    attrs, w, bias = CONV_CASES[case]
    init = {"w": w, **({"b": _rand(w.shape[0])} if bias else {})}
    node = _node("Conv", ["x", "w", "b"] if bias else ["x", "w"], **attrs)
    _check(_model([node], {"x": X4}, init, ["y"]), {"x": X4}, tmp_path)


def test_conv_1d(tmp_path):
    x = _rand(2, 3, 17)
    node = _node("Conv", ["x", "w", "b"], kernel_shape=[3], pads=[2, 1], strides=[2], dilations=[2])
    _check(_model([node], {"x": x}, {"w": _rand(4, 3, 3), "b": _rand(4)}, ["y"]), {"x": x}, tmp_path)


POOL_CASES = {
    "max-2x2": ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "max-pads": ("MaxPool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "max-ceil": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "max-dilations": ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    "max-same-upper": ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "avg-plain": ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "avg-pads-excl": ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "avg-pads-incl": ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 2, 1, 0], "count_include_pad": 1}),
    "avg-ceil": ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "avg-ceil-incl": ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1, "count_include_pad": 1}),
    "avg-same-lower": ("AveragePool", {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
}


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_pool(case, tmp_path):
    op, attrs = POOL_CASES[case]
    _check(_model([_node(op, ["x"], **attrs)], {"x": X4}, {}, ["y"]), {"x": X4}, tmp_path)


def test_pool_1d_and_global_average(tmp_path):
    x = _rand(2, 3, 15)
    nodes = [_node("MaxPool", ["x"], ["a"], kernel_shape=[3], strides=[2], pads=[1, 1]),
             _node("AveragePool", ["x"], ["b"], kernel_shape=[4], strides=[3]),
             _node("GlobalAveragePool", ["x"], ["c"])]
    _check(_model(nodes, {"x": x}, {}, ["a", "b", "c"]), {"x": x}, tmp_path)
    _check(_model([_node("GlobalAveragePool", ["x"])], {"x": X4}, {}, ["y"]), {"x": X4}, tmp_path)


@pytest.mark.parametrize("attrs, a_shape, b_shape, c_shape", [
    ({}, (3, 5), (5, 4), (4,)),
    ({"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, (5, 3), (4, 5), (3, 4)),
    ({"transB": 1}, (2, 7), (6, 7), (1, 6)),
    ({"alpha": 1.5}, (3, 5), (5, 4), None),
])
def test_gemm(attrs, a_shape, b_shape, c_shape, tmp_path):
    a = _rand(*a_shape)
    init = {"b": _rand(*b_shape), **({"c": _rand(*c_shape)} if c_shape else {})}
    node = _node("Gemm", ["a", "b", "c"] if c_shape else ["a", "b"], **attrs)
    _check(_model([node], {"a": a}, init, ["y"]), {"a": a}, tmp_path)


def test_matmul_and_broadcasting_arithmetic(tmp_path):
    a, b = _rand(2, 3, 4, 5), _rand(5, 6)
    nodes = [
        _node("MatMul", ["a", "b"], ["m"]),
        _node("Add", ["m", "bias"], ["s1"]),
        _node("Mul", ["s1", "scale"], ["s2"]),
        _node("Sub", ["s2", "m"], ["s3"]),
        _node("Div", ["s3", "den"], ["y"]),
    ]
    init = {"b": b, "bias": _rand(6), "scale": _rand(3, 1, 1), "den": (np.abs(_rand(4, 1)) + 0.5)}
    _check(_model(nodes, {"a": a}, init, ["y", "m"]), {"a": a}, tmp_path)
    x, w = _rand(7), _rand(3, 7, 2)  # 1-D times batched
    _check(_model([_node("MatMul", ["x", "w"])], {"x": x}, {"w": w}, ["y"]), {"x": x}, tmp_path)


def test_activations(tmp_path):
    x = _rand(3, 4, 5) * 20  # large values: Sigmoid must not overflow into nan
    nodes = [
        _node("Relu", ["x"], ["r"]),
        _node("Sigmoid", ["x"], ["s"]),
        _node("Clip", ["x", "lo", "hi"], ["c"]),
        _node("Clip", ["x", "", "hi"], ["c_hi"]),
        _node("Clip", ["x"], ["c_none"]),
        _node("Identity", ["x"], ["i"]),
    ]
    init = {"lo": np.array(-2.5, np.float32), "hi": np.array(6.0, np.float32)}
    _check(_model(nodes, {"x": x}, init, ["r", "s", "c", "c_hi", "c_none", "i"]), {"x": x}, tmp_path)


def test_clip_with_attributes_before_opset_11(tmp_path):
    x = _rand(4, 5) * 5
    _check(_model([_node("Clip", ["x"], min=-1.0, max=2.0)], {"x": x}, {}, ["y"], opset=6), {"x": x}, tmp_path)


@pytest.mark.parametrize("opset, axis", [(13, None), (13, 1), (13, 0), (11, None), (11, 2), (11, -1)])
def test_softmax(opset, axis, tmp_path):
    x = _rand(2, 3, 4, 5) * 4
    attrs = {} if axis is None else {"axis": axis}
    _check(_model([_node("Softmax", ["x"], **attrs)], {"x": x}, {}, ["y"], opset=opset), {"x": x}, tmp_path)


@pytest.mark.parametrize("axis", [0, 1, 3, -1, -3])
def test_flatten(axis, tmp_path):
    _check(_model([_node("Flatten", ["x"], axis=axis)], {"x": X4}, {}, ["y"]), {"x": X4}, tmp_path)


def test_reshape_transpose_concat(tmp_path):
    x = _rand(2, 3, 4, 5)
    nodes = [
        _node("Reshape", ["x", "shape"], ["r"]),  # 0 copies the input dim, -1 is inferred
        _node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
        _node("Transpose", ["x"], ["t_default"]),
        _node("Concat", ["x", "x2", "x"], ["c"], axis=-1),
        _node("Concat", ["x", "x2"], ["c0"], axis=1),
    ]
    init = {"shape": np.array([0, -1, 5], np.int64), "x2": _rand(2, 3, 4, 5)}
    _check(_model(nodes, {"x": x}, init, ["r", "t", "t_default", "c", "c0"]), {"x": x}, tmp_path)


def test_reshape_allowzero_and_constant_nodes_are_folded(tmp_path):
    x = _rand(2, 0, 3)  # allowzero=1: a 0 in the shape is a real zero
    shape = helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([0, 6], np.int64)))
    model = _model([shape, _node("Reshape", ["x", "shape"], allowzero=1)], {"x": x}, {}, ["y"], opset=14)
    _check(model, {"x": x}, tmp_path)
    graph, weights = convert(model)
    assert [n["op"] for n in graph["nodes"]] == ["Reshape"]  # the Constant became a weight
    assert "shape" in graph["weights"]["keys"]


def test_batch_normalization(tmp_path):
    c = X4.shape[1]
    init = {"s": _rand(c), "b": _rand(c), "m": _rand(c), "v": np.abs(_rand(c)) + 0.1}
    node = _node("BatchNormalization", ["x", "s", "b", "m", "v"], epsilon=1e-3)
    _check(_model([node], {"x": X4}, init, ["y"]), {"x": X4}, tmp_path)


def test_integer_division_truncates_like_onnxruntime(tmp_path):
    a = np.array([7, -7, 9, -9], np.int64)
    b = np.array([2, 2, -4, -4], np.int64)
    model = _model([_node("Div", ["a", "b"])], {"a": a}, {"b": b}, ["y"])
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    _, session = _compile(model, tmp_path)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"a": a})[0]
    assert session.run({"a": a})[0].tolist() == want.tolist() == [3, -3, -2, 2]


def test_the_op_set_is_the_one_promised():
    assert set(numpy_ref.OPS) == {
        "Conv", "Gemm", "MatMul", "Add", "Mul", "Sub", "Div", "Relu", "Clip", "Sigmoid", "Softmax", "MaxPool",
        "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Transpose", "Concat", "BatchNormalization", "Identity",
    }
    assert all(name == fn.__name__ for name, fn in numpy_ref.OPS.items())


# -- the examples, to 1e-4 ------------------------------------------------------------------


def test_digits_matches_onnxruntime_on_held_out_digits(tmp_path):
    files, session = _compile(DIGITS, tmp_path)
    assert [f.name for f in files] == ["graph.json", "weights.npz"]
    ref = ort.InferenceSession(str(DIGITS))
    with np.load(EXAMPLES / "digits" / "heldout.npz") as data:
        samples = data["input"][:60]
    labels = np.load(EXAMPLES / "digits" / "heldout_labels.npy")[:60]
    agree = 0
    for i in range(len(samples)):
        x = samples[i : i + 1]
        got, want = session.run({"input": x})[0], ref.run(None, {"input": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        agree += int(got.argmax() == labels[i])
    assert agree >= 58  # it is the real classifier, not just close numbers


@pytest.mark.parametrize("hw", [(64, 64), (37, 50)])
def test_mobilenetv2_matches_onnxruntime(hw, tmp_path):
    _, session = _compile(MOBILENET, tmp_path)
    ref = ort.InferenceSession(str(MOBILENET))
    with np.load(EXAMPLES / "mobilenetv2" / "heldout.npz") as data:
        real = data["input"][:3]
    feeds = [real[i : i + 1] for i in range(len(real))] if hw == (64, 64) else [_rand(1, 3, *hw)]
    for x in feeds:
        np.testing.assert_allclose(session.run({"input": x})[0], ref.run(None, {"input": x})[0], rtol=1e-4, atol=1e-4)
    layers = session.layers()
    assert len(layers) == session.info["nodes"] == len(onnx.load(str(MOBILENET)).graph.node)
    # the median ns of the profiled runs, with its quartiles
    assert all(set(entry) == {"name", "op", "ns", "ns_p25", "ns_p75"} and entry["ns"] > 0 for entry in layers), layers[0]
    assert session.info["weights_bytes"] > 600_000  # measured 661 296: all 165 k float32 initializer values


def test_conversion_is_deterministic(tmp_path):
    a = BACKEND.compile(DIGITS, tmp_path / "a")
    b = BACKEND.compile(DIGITS, tmp_path / "b")
    assert [f.read_bytes() for f in a] == [f.read_bytes() for f in b]
    graph = json.loads(a[0].read_text())
    assert graph["weights"]["sha256"] == hashlib.sha256(a[1].read_bytes()).hexdigest()
    assert graph["inputs"] == [{"name": "input", "shape": [1, 1, 8, 8], "dtype": "float32"}]


# -- verdicts: the first unsupported op is named -----------------------------------------------


def _save(model: onnx.ModelProto, tmp_path: Path, name: str = "m.onnx") -> Path:
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def test_verdict_names_the_first_unsupported_op(tmp_path):
    x = _rand(1, 4)
    nodes = [_node("Relu", ["x"], ["r"]), helper.make_node("Tanh", ["r"], ["t"], name="squash"),
             helper.make_node("Erf", ["t"], ["y"], name="erf")]
    loaded = load_model(_save(_model(nodes, {"x": x}, {}, {"y": [1, 4]}), tmp_path))
    verdict = BACKEND.supports(loaded, load_profile("rpi4"))
    assert not verdict.ok
    assert verdict.reasons == ("node 'squash' (op Tanh) is not in the numpy backend's op set",)
    with pytest.raises(ModelError, match="op Tanh"):
        BACKEND.compile(tmp_path / "m.onnx", tmp_path / "out")


def test_verdict_on_unsupported_variants_of_supported_ops(tmp_path):
    x5 = _rand(1, 2, 4, 4, 4)
    conv3d = _model([_node("Conv", ["x", "w"], kernel_shape=[2, 2, 2])], {"x": x5}, {"w": _rand(3, 2, 2, 2, 2)}, {"y": [1, 3, 3, 3, 3]})
    loaded = load_model(_save(conv3d, tmp_path, "c3.onnx"))
    assert "only 1-D and 2-D kernels" in BACKEND.supports(loaded, load_profile("rpi4")).reasons[0]
    indices = _model([_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2], strides=[2, 2])], {"x": X4}, {}, {"y": [2, 6, 4, 5]})
    loaded = load_model(_save(indices, tmp_path, "mp.onnx"))
    assert "Indices output" in BACKEND.supports(loaded, load_profile("rpi4")).reasons[0]


def test_quantized_model_is_not_for_the_float_interpreter(tmp_path):
    x = _rand(1, 4)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q0"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq0")]
    init = {"s": np.array(0.1, np.float32), "z": np.array(0, np.int8)}
    loaded = load_model(_save(_model(nodes, {"x": x}, init, {"y": [1, 4]}), tmp_path))
    assert BACKEND.supports(loaded, load_profile("rpi4")).reasons == ("node 'q0' (op QuantizeLinear) is not in the numpy backend's op set",)


# -- the planner picks numpy where nothing else runs ------------------------------------------

ARM_FACTS = {
    "device": {
        "arch": "aarch64", "cpu_model": "cortex-a72", "isa": ["neon"], "cores": 4,
        "runtimes": {"onnxruntime": None, "openvino": None, "tflite_runtime": None, "ai_edge_litert": None, "numpy": "1.24.2"},
    }
}


@pytest.mark.parametrize("target", ["rpi4", "rpi5", "linux-cpu"])
def test_planner_picks_numpy_fp32_on_a_board_without_runtimes(target):
    model = load_model(DIGITS)
    plan = make_plan(model, load_profile(target), device="pi@board", quantize=False, facts=ARM_FACTS)
    assert (plan.backend, plan.precision, plan.scheme, plan.probed) == ("numpy", "fp32", None, True)
    skipped = dict(plan.skipped)
    assert "onnxruntime is not installed on the device" in skipped["onnxruntime"]
    # quantizing, the int8 variant goes to a backend that needs no runtime (ekrt) when there is
    # one, and numpy runs the fp32 reference beside it; else numpy runs the float model alone
    plan = make_plan(model, load_profile(target), device="pi@board", facts=ARM_FACTS)
    if plan.backend == "native":
        assert plan.precision == "int8" and get_backend("native").variant_backend("fp32", ARM_FACTS) == "numpy"
    else:
        assert (plan.backend, plan.precision) == ("numpy", "fp32")
        assert any("no int8 path" in n for n in plan.notes)


def test_planner_prefers_onnxruntime_when_the_board_has_it():
    facts = json.loads(json.dumps(ARM_FACTS))
    facts["device"]["runtimes"]["onnxruntime"] = "1.17.0"
    plan = make_plan(load_model(DIGITS), load_profile("rpi4"), quantize=False, facts=facts)
    assert (plan.backend, plan.precision) == ("onnxruntime", "fp32")
    no_numpy = json.loads(json.dumps(ARM_FACTS))
    no_numpy["device"]["runtimes"]["numpy"] = None
    assert "numpy is not installed on the device" in get_backend("numpy").supports(load_model(DIGITS), load_profile("rpi4"), no_numpy).reasons[0]


# -- the device side refuses what it cannot trust ----------------------------------------------


def test_tampered_or_foreign_files_are_agent_failures(tmp_path):
    files = BACKEND.compile(DIGITS, tmp_path / "b")
    graph_path, weights_path = files
    data = bytearray(weights_path.read_bytes())
    data[-1] ^= 0xFF
    weights_path.write_bytes(bytes(data))
    with pytest.raises(AgentFailure, match="does not match the sha256"):
        numpy_ref.load(str(graph_path), None)

    onnx_file = tmp_path / "model.onnx"
    onnx_file.write_bytes(DIGITS.read_bytes())
    with pytest.raises(AgentFailure, match="not valid JSON"):
        numpy_ref.load(str(onnx_file), None)

    files = BACKEND.compile(DIGITS, tmp_path / "c")
    graph = json.loads(files[0].read_text())
    graph["nodes"][0]["op"] = "Tanh"
    files[0].write_text(json.dumps(graph))
    with pytest.raises(AgentFailure, match=r"node 'conv1' \(op Tanh\) is not in the numpy backend's op set"):
        numpy_ref.load(str(files[0]), None)
    graph["version"] = 99
    files[0].write_text(json.dumps(graph))
    with pytest.raises(AgentFailure, match="version 99"):
        numpy_ref.load(str(files[0]), None)


# -- the whole loop on this machine ----------------------------------------------------------


@pytest.mark.slow
def test_deploy_with_the_numpy_backend_on_the_local_device(cli, tmp_path):
    r = cli("deploy", DIGITS, "--target", "linux-cpu", "--backend", "numpy", "--iterations", "5", "--warmup", "1",
            "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["backend"], doc["precision"]) == ("numpy", "fp32")
    assert {f["path"] for f in doc["bundle"]["files"]} == {"fp32/graph.json", "fp32/weights.npz", "fp32/inputs.npz"}
    assert doc["summary"]["variants"]["fp32"]["p50_ms"] > 0
    shown = json.loads(cli("results", "show", str(doc["runs"][0]["id"]), "--json").stdout)
    assert shown["agent"]["backend"] == "numpy" and shown["agent"]["backend_version"] == np.__version__
    assert [layer["op"] for layer in shown["agent"]["layers"]][:3] == ["Conv", "BatchNormalization", "Relu"]
