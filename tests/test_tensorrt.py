"""TensorRT, tested at its edges: no TensorRT or Jetson exists here.

* the QDQ lint on real QDQ models (edgekit's TensorRT scheme must pass, ONNX Runtime's default
  output must fail naming nodes; ONNX Runtime's own quantize_static as an independent check) and
  on small graphs that break one rule each;
* the exact trtexec command lines per TensorRT version and profile, and the engine cache key;
* the parsers fed with real trtexec logs and exports (tests/fixtures/trtexec/, each with a
  ``.source`` file naming where it was published);
* the device side and a whole deploy, with ``trtexec`` replaced by a script that replays those
  recorded files (tests/fixtures/trtexec/fake_trtexec.py): the one seam for what cannot run here.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.agent import AgentFailure, facts
from edgekit.agent import runner as agent_runner
from edgekit.agent.backends.tensorrt import probe as trt_probe
from edgekit.agent.backends.tensorrt import trtexec as trt_exec
from edgekit.bench.record import make_record
from edgekit.errors import EXIT_DEVICE, ModelError
from edgekit.modelio import load_model
from edgekit.profiles import load_profile
from edgekit.quantize import analyze_model, quantize_model, random_feeds
from edgekit.quantize.scheme import ONNXRUNTIME, TENSORRT
from edgekit.targets import get_backend
from edgekit.targets.tensorrt import (
    BACKEND,
    LINT_RULES,
    TrtexecOutputError,
    build_flags,
    engine_key,
    lint_qdq,
    parse_export_profile,
    parse_export_times,
    parse_trtexec_log,
    preview_qdq,
    shapes_spec,
    trtexec_bench_argv,
    trtexec_build_argv,
)
from tests import realmodels
from tests.builders import tiny_bundle
from tests.conftest import EXAMPLES, assert_one_line_error

FIXTURES = Path(__file__).parent / "fixtures" / "trtexec"
DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
MOBILENET = EXAMPLES / "mobilenetv2" / "mobilenetv2.onnx"
SHA = "ab" * 32


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_every_fixture_names_its_source():
    data = [p for p in FIXTURES.iterdir() if p.suffix in (".log", ".json")]
    assert len(data) >= 9
    for path in data:
        source = path.with_name(path.name + ".source").read_text(encoding="utf-8")
        assert re.search(r"https://github\.com/\S+", source), path.name


# -- versions and command lines ------------------------------------------------------------


@pytest.mark.parametrize(
    "code, version",
    [(8001, "8.0.1"), (8201, "8.2.1"), (8400, "8.4.0"), (8502, "8.5.2"), (8600, "8.6.0"), (100200, "10.2.0"), (101600, "10.16.0")],
)
def test_trtexec_version_codes(code, version):
    assert trt_exec.decode_version_code(code) == version
    assert trt_exec.banner_version(f"&&&& RUNNING TensorRT.trtexec [TensorRT v{code}] # trtexec --help") == version


def test_build_argv_jetson_nano_tensorrt_8_2_fp16():
    assert trtexec_build_argv(
        "fp16/model.onnx", "e.engine", build_flags("8.2.1", "fp16", workspace_mb=256), trt_version="8.2.1", timing_cache="t.cache",
    ) == [
        "trtexec", "--onnx=fp16/model.onnx", "--saveEngine=e.engine", "--fp16", "--workspace=256",
        "--timingCacheFile=t.cache", "--buildOnly",
    ]  # fmt: skip


def test_build_argv_orin_tensorrt_8_5_int8_is_int8_plus_fp16():
    assert trtexec_build_argv("int8/model.onnx", "e.engine", build_flags("8.5.2", "int8", workspace_mb=1024), trt_version="8.5.2") == [
        "trtexec", "--onnx=int8/model.onnx", "--saveEngine=e.engine", "--int8", "--fp16",
        "--memPoolSize=workspace:1024", "--buildOnly",
    ]  # fmt: skip


def test_build_argv_tensorrt_8_6_skips_inference_with_its_new_flag():
    argv = trtexec_build_argv("m.onnx", "e.engine", build_flags("8.6.2", "int8"), trt_version="8.6.2")
    assert argv[-1] == "--skipInference" and "--buildOnly" not in argv
    assert argv[3:5] == ["--int8", "--fp16"]


def test_build_argv_tensorrt_10_is_strongly_typed_for_qdq():
    argv = trtexec_build_argv("m.onnx", "e.engine", build_flags("10.3.0", "int8", shapes="x:1x3x64x64"), trt_version="10.3.0", timing_cache="t.cache")
    assert argv == [
        "trtexec", "--onnx=m.onnx", "--saveEngine=e.engine", "--stronglyTyped", "--shapes=x:1x3x64x64",
        "--timingCacheFile=t.cache", "--skipInference",
    ]  # fmt: skip
    assert "--int8" not in argv and "--fp16" not in argv  # NVIDIA: no precision flags with strong typing


def test_fp32_turns_tf32_off_and_workspace_spelling_follows_the_version():
    assert build_flags("8.2.1", "fp32") == ["--noTF32"]
    assert build_flags("8.3.1", "fp16", workspace_mb=64) == ["--fp16", "--workspace=64"]
    assert build_flags("8.4.1", "fp16", workspace_mb=64) == ["--fp16", "--memPoolSize=workspace:64"]
    assert build_flags("10.0.1", "fp16", workspace_mb=64) == ["--fp16", "--memPoolSize=workspace:64"]


def test_dla_core_and_gpu_fallback():
    assert build_flags("8.5.2", "int8", dla_core=1) == ["--int8", "--fp16", "--useDLACore=1", "--allowGPUFallback"]
    assert build_flags("8.5.2", "fp16", dla_core=0, allow_gpu_fallback=False) == ["--fp16", "--useDLACore=0"]
    with pytest.raises(ValueError, match="DLA runs fp16 and int8"):
        build_flags("8.5.2", "fp32", dla_core=0)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"trt_version": "7.1.3", "precision": "fp16"}, "older than 8.0"),
        ({"trt_version": "8.5.2", "precision": "int4"}, "precision must be one of"),
        ({"trt_version": "banana", "precision": "fp16"}, "not a version"),
        ({"trt_version": "8.5.2", "precision": "fp16", "workspace_mb": 0}, "workspace_mb"),
    ],
)
def test_build_flags_refuse_what_they_cannot_spell(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        build_flags(**kwargs)


def test_bench_argv_fixed_count_and_time_budget():
    assert trtexec_bench_argv(
        "k.engine", warmup_ms=1000, iterations=100, duration_s=None, export_times="t.json",
        export_profile="p.json", shapes="x:1x16", load_inputs="x:/tmp/in0.raw",
    ) == [
        "trtexec", "--loadEngine=k.engine", "--warmUp=1000", "--iterations=100", "--duration=0",
        "--exportTimes=t.json", "--exportProfile=p.json", "--dumpProfile", "--separateProfileRun",
        "--shapes=x:1x16", "--loadInputs=x:/tmp/in0.raw",
    ]  # fmt: skip
    argv = trtexec_bench_argv("k.engine", warmup_ms=0, iterations=100, duration_s=2.5, export_times="t.json", dla_core=0)
    assert argv == ["trtexec", "--loadEngine=k.engine", "--warmUp=0", "--iterations=1", "--duration=3", "--exportTimes=t.json", "--useDLACore=0"]
    # a count and a minimum time: trtexec's own rule is "at least --iterations and at least --duration"
    argv = trtexec_bench_argv("k.engine", warmup_ms=0, iterations=100, duration_s=None, export_times="t.json", min_time_s=0.5)
    assert argv[3:5] == ["--iterations=100", "--duration=1"]
    with pytest.raises(ValueError, match="duration_s"):
        trtexec_bench_argv("k.engine", warmup_ms=0, iterations=1, duration_s=0, export_times="t.json")


def test_shapes_spec_feeds_one_for_dynamic_dims_and_quotes_odd_names():
    inputs = [{"name": "x", "shape": [-1, 3, 64, 64]}, {"name": "in:0", "shape": [1, 4]}]
    assert shapes_spec(inputs) == "x:1x3x64x64,'in:0':1x4"


def test_warmup_is_time_for_trtexec():
    assert trt_exec.warmup_ms_for(0) == 0
    assert trt_exec.warmup_ms_for(5) == 200
    assert trt_exec.warmup_ms_for(50) == 1000


# -- engine cache key ------------------------------------------------------------------------


def test_engine_key_is_stable_and_ignores_flag_order():
    flags = ["--int8", "--fp16", "--shapes=x:1x16"]
    key = engine_key(SHA, "8.5.2", "NVIDIA Jetson Orin Nano / L4T R35.4.1", flags)
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert key == engine_key(SHA, "8.5.2", "NVIDIA Jetson Orin Nano / L4T R35.4.1", list(reversed(flags)))


@pytest.mark.parametrize(
    "change",
    [
        {"model_sha256": "cd" * 32},
        {"trt_version": "8.5.3"},
        {"gpu_or_soc": "NVIDIA Jetson AGX Orin / L4T R35.4.1"},
        {"gpu_or_soc": "NVIDIA Jetson Orin Nano / L4T R36.3.0"},
        {"flags": ["--int8", "--fp16", "--shapes=x:2x16"]},
        {"flags": ["--stronglyTyped", "--shapes=x:1x16"]},
    ],
)
def test_engine_key_changes_with_every_input(change):
    base = {"model_sha256": SHA, "trt_version": "8.5.2", "gpu_or_soc": "NVIDIA Jetson Orin Nano / L4T R35.4.1", "flags": ["--int8", "--fp16", "--shapes=x:1x16"]}
    assert engine_key(**base) != engine_key(**{**base, **change})


def test_engine_key_refuses_bad_inputs():
    with pytest.raises(ValueError, match="64 lowercase hex"):
        engine_key("not-a-sha", "8.5.2", "gpu", [])
    with pytest.raises(ValueError, match="gpu_or_soc"):
        engine_key(SHA, "8.5.2", " ", [])


def test_gpu_identity():
    assert trt_exec.gpu_identity("NVIDIA Jetson Nano Developer Kit", "L4T R32.7.1") == "NVIDIA Jetson Nano Developer Kit / L4T R32.7.1"
    assert trt_exec.gpu_identity(None, None, "NVIDIA GeForce RTX 3090, 535.104.05") == "NVIDIA GeForce RTX 3090, 535.104.05"
    assert trt_exec.gpu_identity() == "unknown GPU"


# -- parsers on real trtexec output ------------------------------------------------------------


def test_parse_jetson_nano_tensorrt_8_2_summary():
    doc = parse_trtexec_log(fixture("trt8201-jetson-nano-summary.log"))
    assert doc["tensorrt_version"] == "8.2.1" and doc["passed"] is True
    assert doc["throughput_qps"] == 72.2544
    assert doc["latency_ms"] == {"min": 13.7075, "max": 14.8861, "mean": 13.8259, "median": 13.7999, "p99": 14.8121}
    assert doc["end_to_end_ms"]["median"] == 13.8109
    assert doc["gpu_compute_ms"]["median"] == 13.6698 and doc["h2d_ms"]["p99"] == 0.128906
    assert doc["host_walltime_s"] == 3.03096 and doc["gpu_compute_total_s"] == 2.99948
    assert doc["device"] is None and doc["warmup_queries"] is None  # the paste has no log head


def test_parse_jetson_xavier_tensorrt_8_4_load_engine():
    doc = parse_trtexec_log(fixture("trt8400-jetson-xavier-loadengine.log"))
    assert doc["tensorrt_version"] == "8.4.0" and doc["passed"] is True
    assert doc["latency_ms"]["mean"] == 0.402238 and doc["d2h_ms"]["max"] == 0.00537109
    assert doc["end_to_end_ms"] is None  # 8.4's report has no End-to-End line


def test_parse_tensorrt_8_6_load_engine_with_device_and_percentiles():
    doc = parse_trtexec_log(fixture("trt8600-rtx3090-loadengine.log"))
    assert doc["tensorrt_version"] == "8.6.0"
    assert doc["device"] == "NVIDIA GeForce RTX 3090" and doc["compute_capability"] == "8.6"
    assert doc["engine_deserialize_s"] == 0.00584987 and doc["engine_build_s"] is None
    assert doc["warmup_queries"] == 4141 and doc["timed_queries"] == 63030
    assert doc["latency_ms"]["p90"] == 0.0532227 and doc["latency_ms"]["p95"] == 0.053772
    assert doc["gpu_compute_ms"]["p99"] == 0.0521851


def test_parse_tensorrt_8_6_build_reports_build_time():
    doc = parse_trtexec_log(fixture("trt8600-rtx3060-build-int8.log"))
    assert doc["engine_build_s"] == 46.6611 and doc["engine_deserialize_s"] == 0.0166769
    assert doc["warmup_queries"] == 94 and doc["throughput_qps"] == 471.185
    assert doc["errors"] == []


def test_parse_tensorrt_10_without_separate_profile_run_says_why_there_is_no_summary():
    text = fixture("trt101600-rtx6000-loadengine-dumpprofile.log")
    with pytest.raises(TrtexecOutputError, match="--separateProfileRun"):
        parse_trtexec_log(text)
    doc = parse_trtexec_log(text, require_summary=False)
    assert doc["tensorrt_version"] == "10.16.0" and doc["passed"] is True
    assert doc["device"] == "NVIDIA RTX 6000 Ada Generation" and doc["compute_capability"] == "8.9"
    assert doc["engine_deserialize_s"] == 0.0236319 and doc["latency_ms"] is None


def test_parse_jetson_orin_tensorrt_10_log_cut_before_the_summary():
    text = fixture("trt101602-jetson-orin-device.log")
    with pytest.raises(TrtexecOutputError, match="no '=== Performance summary ===' section"):
        parse_trtexec_log(text)
    doc = parse_trtexec_log(text, require_summary=False)
    assert (doc["device"], doc["compute_capability"], doc["tensorrt_version"]) == ("Orin", "8.7", "10.16.2")
    assert doc["passed"] is None


def test_parse_jetson_agx_orin_summary_cut_mid_line():
    doc = parse_trtexec_log(fixture("jetson-agx-orin-jp6-summary-cut.log"))
    assert doc["latency_ms"]["median"] == 4.83752 and doc["throughput_qps"] == 208.729
    assert doc["h2d_ms"] == {"min": 0.0480957, "max": 0.0679321, "mean": 0.0507424, "median": 0.050293, "p90": 0.052002, "p95": 0.0533447}
    assert doc["gpu_compute_ms"] is None and doc["tensorrt_version"] is None and doc["passed"] is None


def test_parse_failed_build_names_the_first_error():
    text = fixture("trt-build-failed-int32-bias-dq.log") + "&&&& FAILED TensorRT.trtexec [TensorRT v8502] # trtexec\n"
    doc = parse_trtexec_log(text, require_summary=False)
    assert doc["passed"] is False and len(doc["errors"]) == 7
    with pytest.raises(TrtexecOutputError, match="trtexec failed: Error\\[3\\]: p2o.DequantizeLinear.1357: only activation types"):
        parse_trtexec_log(text)


def test_tensorrt_8_0_printed_its_version_packed():
    # TensorRT 8.0's trtexec printed "TensorRT version: 8001" (as a Jetson Nano log on JetPack 4.6 shows)
    doc = parse_trtexec_log("[04/14/2026-01:43:06] [I] TensorRT version: 8001\n", require_summary=False)
    assert doc["tensorrt_version"] == "8.0.1"


@pytest.mark.parametrize("bad, needle", [("", "printed nothing"), (b"bytes", "must be text"), ("just text\n", "no '=== Performance summary")])
def test_parse_bad_logs(bad, needle):
    with pytest.raises(TrtexecOutputError, match=needle):
        parse_trtexec_log(bad)


def test_parse_export_times_real_trace():
    text = fixture("trt-explorer-mobilenet-qat.timing.json")
    samples = parse_export_times(text)
    assert len(samples) == 118 and samples[:2] == [459041, 442369]
    assert all(isinstance(s, int) and s > 0 for s in samples)
    skipped = parse_export_times(json.loads(text), skip=4)
    assert len(skipped) == 114 and skipped[0] == 900864


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda t: t[: len(t) // 2], "not valid JSON"),
        (lambda t: '{"a": 1}', "must be a JSON list"),
        (lambda t: t.replace('"latencyMs" : 0.459041', '"latencyMs" : null', 1), "record 0 has no latencyMs"),
        (lambda t: t.replace('"latencyMs" : 0.459041', '"latencyMs" : 0', 1), "record 0 has a latency of 0"),
    ],
)
def test_parse_export_times_bad_input(mutate, needle):
    with pytest.raises(TrtexecOutputError, match=needle):
        parse_export_times(mutate(fixture("trt-explorer-mobilenet-qat.timing.json")))


def test_parse_export_times_refuses_to_skip_everything():
    with pytest.raises(TrtexecOutputError, match="118 record\\(s\\), none left after 118 warm-up queries"):
        parse_export_times(fixture("trt-explorer-mobilenet-qat.timing.json"), skip=118)


def test_parse_export_profile_real_layers():
    layers = parse_export_profile(fixture("trt-explorer-mobilenet-qat.profile.json"))
    assert len(layers) == 18
    assert layers[0] == {"name": "QuantizeLinear_2", "op": "QuantizeLinear", "ns": 12204, "median_ns": None, "percent": 1.88608}
    assert layers[1]["op"] == "Conv+Clip" and layers[1]["ns"] == 10746  # 0.0107465 ms
    assert layers[7]["op"] == "Reformat"
    assert layers[11]["op"] == "Conv+Add"
    assert layers[16]["op"] == "Gemm" and layers[15]["ns"] == 0


@pytest.mark.parametrize(
    "text, needle",
    [
        ('[{"name": "x", "averageMs": 1}]', 'starting with {"count": N}'),
        ('[{"count": 0}]', "'count' must be a positive integer"),
        ('[{"count": 3}, {"name": "conv", "timeMs": 1}]', "entry 1 \\(conv\\) has no averageMs"),
        ('[{"count": 3}, {"averageMs": 1}]', "entry 1 has no layer name"),
        ('[{"count": 3}, {"name": "conv", "ave', "not valid JSON"),
    ],
)
def test_parse_export_profile_bad_input(text, needle):
    with pytest.raises(TrtexecOutputError, match=needle):
        parse_export_profile(text)


def test_layer_op_names():
    assert trt_exec.layer_op("features.1.conv.0.0.weight + QuantizeLinear_25 + Conv_29 + PWN(Clip_33)") == "Conv+Clip"
    assert trt_exec.layer_op("Reformatting CopyNode for Input Tensor 0 to node_conv2d + node_relu") == "Reformat"
    assert trt_exec.layer_op("node_conv2d + node_relu") == "layer"  # TensorRT 10 names carry no op type


# -- the QDQ lint ------------------------------------------------------------------------------


def _quantized(path: Path, scheme, shapes=None, n: int = 8):
    loaded = load_model(path, shapes or {})
    return loaded, quantize_model(loaded, scheme, random_feeds(loaded.inputs, n, seed=0), random_feeds(loaded.inputs, 2, seed=1)).model


@pytest.mark.parametrize("path", [DIGITS, MOBILENET], ids=["digits", "mobilenetv2"])
def test_tensorrt_scheme_output_passes_the_lint(path):
    _, model = _quantized(path, TENSORRT)
    assert lint_qdq(model) == []
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("DequantizeLinear") > ops.count("QuantizeLinear") > 0


@pytest.mark.parametrize("kind, shape", [("cls", (1, 3, 48, 192)), ("det", (1, 3, 320, 320))])
def test_tensorrt_scheme_output_of_real_pp_ocr_models_passes(kind, shape):
    path = realmodels.rapidocr_model(kind)
    _, model = _quantized(path, TENSORRT, {"x": shape}, n=4)
    assert lint_qdq(model) == []
    _, asymmetric = _quantized(path, ONNXRUNTIME, {"x": shape}, n=4)
    rules = {i.rule for i in lint_qdq(asymmetric)}
    assert rules == {"zero-point", "int8"}


def test_default_onnxruntime_scheme_output_fails_naming_nodes():
    _, model = _quantized(DIGITS, ONNXRUNTIME)
    issues = lint_qdq(model)
    names = {n.name for n in model.graph.node}
    assert issues and all(i.node in names for i in issues)
    bias = [i for i in issues if i.rule == "int8"]
    assert bias and all(i.node.endswith("__bias__DQ") and "int32" in i.message for i in bias)
    assert any(i.rule == "zero-point" and i.node.endswith("__Q") for i in issues)


def test_onnxruntime_quantize_static_as_an_independent_check(tmp_path):
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    calib = np.load(EXAMPLES / "digits" / "calib.npz")
    data = calib[calib.files[0]][:16].astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter({"input": data[i : i + 1]} for i in range(len(data)))

        def get_next(self):
            return next(self.feeds, None)

    def quantize(extra: dict) -> onnx.ModelProto:
        out = tmp_path / f"q{len(extra)}.onnx"
        quantize_static(str(DIGITS), str(out), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8, per_channel=True, extra_options=extra)  # fmt: skip
        return onnx.load(out)

    default = lint_qdq(quantize({}))
    assert {i.rule for i in default} == {"zero-point", "int8"}
    assert any(i.node == "bn1.bias_DequantizeLinear" for i in default)
    # ONNX Runtime's own recipe for TensorRT: symmetric activations and weights, float bias
    assert lint_qdq(quantize({"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False})) == []


def _graph(
    *, opset=13, zp_dtype=np.int8, zp=0, act_scale=0.1, w_axis=0, w_scale=None, w=None, op="Conv",
    q_consumer="DequantizeLinear", float_weight=False, scale_input=False, drop_q_zp=False, trans_b=0,
):  # fmt: skip
    """x -> Q -> DQ -> op(weight) -> y: one well-formed TensorRT Q/DQ pattern, bent by one argument."""
    rng = np.random.RandomState(0)
    if op == "Conv":
        w = w if w is not None else rng.randint(-127, 128, size=(4, 2, 3, 3)).astype(np.int8)
        x_shape, attrs = [1, 2, 5, 5], {}
    elif op == "ConvTranspose":
        w = w if w is not None else rng.randint(-127, 128, size=(2, 4, 3, 3)).astype(np.int8)
        x_shape, attrs = [1, 2, 5, 5], {}
    else:  # Gemm
        w = w if w is not None else rng.randint(-127, 128, size=(4, 2) if trans_b else (2, 4)).astype(np.int8)
        x_shape, attrs = [1, 2], {"transB": trans_b}
    channels = w.shape[w_axis]
    w_scale = np.full(channels, 0.02, np.float32) if w_scale is None else np.asarray(w_scale, np.float32)
    inits = [
        numpy_helper.from_array(np.asarray(act_scale, np.float32), "x_scale"),
        numpy_helper.from_array(np.asarray(zp, zp_dtype), "x_zp"),
        numpy_helper.from_array(w, "w_q"),
        numpy_helper.from_array(w_scale, "w_scale"),
        numpy_helper.from_array(np.zeros(w_scale.shape, np.int8), "w_zp"),
        numpy_helper.from_array(rng.randn(*w.shape).astype(np.float32), "w_float"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    if scale_input:
        inits = [i for i in inits if i.name != "x_scale"]
        inputs.append(helper.make_tensor_value_info("x_scale", TensorProto.FLOAT, []))
    q_inputs = ["x", "x_scale"] if drop_q_zp else ["x", "x_scale", "x_zp"]
    nodes = [
        helper.make_node("QuantizeLinear", q_inputs, ["x_q"], name="x_Q"),
        helper.make_node(q_consumer, ["x_q", "x_scale", "x_zp"] if q_consumer == "DequantizeLinear" else ["x_q"], ["x_dq"], name="x_DQ"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w_dq"], name="w_DQ", axis=w_axis),
        helper.make_node(op, ["x_dq", "w_float" if float_weight else "w_dq"], ["y"], name="layer", **attrs),
    ]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _rules(model) -> list[tuple[str, str]]:
    return sorted((i.node, i.rule) for i in lint_qdq(model))


def test_lint_accepts_the_well_formed_patterns():
    assert _rules(_graph()) == []
    assert _rules(_graph(op="ConvTranspose", w_axis=1)) == []
    assert _rules(_graph(op="Gemm", w_axis=1)) == []
    assert _rules(_graph(op="Gemm", w_axis=0, trans_b=1)) == []


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"opset": 12}, [("g", "opset")]),
        ({"zp": 3}, [("x_DQ", "zero-point"), ("x_Q", "zero-point")]),
        ({"zp_dtype": np.uint8, "zp": 0}, [("x_DQ", "int8"), ("x_Q", "int8")]),
        ({"drop_q_zp": True}, [("x_Q", "int8")]),
        ({"act_scale": -0.1}, [("x_DQ", "scale"), ("x_Q", "scale")]),
        ({"scale_input": True}, [("x_DQ", "scale"), ("x_Q", "scale")]),
        ({"act_scale": [0.1, 0.2]}, [("x_DQ", "per-tensor-activation"), ("x_Q", "per-tensor-activation")]),
        ({"w_axis": 1, "w_scale": [0.02, 0.02]}, [("w_DQ", "weight-axis")]),
        ({"op": "ConvTranspose", "w_axis": 0, "w_scale": [0.02, 0.02]}, [("w_DQ", "weight-axis")]),
        ({"op": "Gemm", "w_axis": 1, "trans_b": 1, "w_scale": [0.02, 0.02]}, [("w_DQ", "weight-axis")]),
        ({"w_scale": [0.02, 0.02, 0.02]}, [("w_DQ", "weight-axis")]),
        ({"w": np.full((4, 2, 3, 3), -128, np.int8)}, [("w_DQ", "weight-range")]),
        ({"q_consumer": "Relu"}, [("layer", "placement"), ("x_Q", "pairing")]),
        ({"float_weight": True}, [("layer", "placement")]),
    ],
)
def test_lint_names_the_node_and_rule_it_breaks(kwargs, expected):
    model = _graph(**kwargs)
    assert _rules(model) == expected
    assert {rule for _, rule in expected} <= set(LINT_RULES)


def test_lint_messages_say_what_to_do():
    issue = lint_qdq(_graph(float_weight=True))[0]
    assert "'x_dq' is int8" in issue.message and "weight 'w_float' is float" in issue.message
    assert str(issue).startswith("layer: ") and str(issue).endswith("[placement]")


def test_plan_preview_is_the_structure_deploy_writes():
    loaded, real = _quantized(DIGITS, TENSORRT)
    prepared, analysis = analyze_model(loaded, TENSORRT)
    preview = preview_qdq(prepared, analysis)
    assert lint_qdq(preview) == []
    signature = lambda m: sorted((n.op_type, tuple(n.input)) for n in m.graph.node)  # noqa: E731
    assert signature(preview) == signature(real)


def test_check_quantized_refuses_a_model_tensorrt_would_reject():
    _, model = _quantized(DIGITS, ONNXRUNTIME)
    with pytest.raises(ModelError, match=r"breaks TensorRT's Q/DQ rules at \d+ place\(s\): .*__Q: zero point") as err:
        BACKEND.check_quantized(model)
    assert "--exclude" in err.value.hint
    BACKEND.check_quantized(_quantized(DIGITS, TENSORRT)[1])  # passes quietly


# -- the backend in the plan -------------------------------------------------------------------


def _facts(version: str | None, trtexec: str | None = "/usr/src/tensorrt/bin/trtexec", arch: str = "aarch64") -> dict:
    return {
        "device": {
            "arch": arch,
            "runtimes": {"onnxruntime": "1.17.0", "numpy": "1.24.4", "tensorrt": version},
            "tensorrt": {"version": version, "source": "dpkg", "trtexec": trtexec, "l4t": "R35.4.1"},
        }
    }


@pytest.mark.parametrize(
    "target, facts_, ok, needle",
    [
        ("jetson-orin-nano", None, True, "planned on paper: the device's TensorRT must be >= 8.5"),
        ("jetson-nano", None, True, "must be <= 8.2"),
        ("jetson-orin-nano", _facts("8.5.2"), True, "the device has TensorRT 8.5.2"),
        ("jetson-orin-nano", _facts("10.3.0"), True, "TensorRT 10.3.0"),
        ("jetson-nano", _facts("8.2.1"), True, "TensorRT 8.2.1"),
        ("jetson-orin-nano", _facts("8.4.1"), False, "jetson-orin-nano needs >= 8.5"),
        ("jetson-nano", _facts("8.5.2"), False, "jetson-nano needs <= 8.2"),
        ("jetson-orin-nano", _facts(None), False, "TensorRT is not installed on the device"),
        ("jetson-orin-nano", _facts("8.6.2", trtexec=None), False, "no trtexec"),
        ("jetson-orin-nano", _facts("7.1.3"), False, "edgekit needs 8.0+"),
        ("jetson-orin-nano", _facts("8.6.2", arch="armv7l"), False, "does not run on armv7l"),
    ],
)
def test_supports(target, facts_, ok, needle):
    verdict = BACKEND.supports(load_model(DIGITS, {}), load_profile(target), facts_)
    assert verdict.ok is ok and needle in " ".join(verdict.reasons)


def test_registry_finds_the_backend():
    backend = get_backend("tensorrt")
    assert backend is BACKEND and backend.implemented and backend.scheme is TENSORRT


def test_variant_options_say_what_to_build_not_how_to_spell_it():
    spec = load_profile("jetson-orin-nano").backend("tensorrt")
    opts = BACKEND.variant_options(spec, "int8")
    assert opts == {"precision": "int8", "dla_core": None, "allow_gpu_fallback": True, "workspace_mb": None, "build_timeout_s": 1800.0}
    json.dumps(opts)  # JSON values only: they travel in the bundle manifest


def test_plan_jetson_orin_nano_is_tensorrt_int8_with_lint_and_device_steps(cli):
    res = cli("plan", DIGITS, "--target", "jetson-orin-nano", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert (doc["backend"], doc["precision"], doc["scheme"]["name"]) == ("tensorrt", "int8", "tensorrt")
    assert doc["scheme"]["quantize_bias"] is False and doc["scheme"]["activation_symmetric"] is True
    assert any(n.startswith("TensorRT Q/DQ lint passed on the planned graph") for n in doc["notes"])
    steps = {d["name"]: d["detail"] for s in doc["steps"] for d in s.get("device_steps", [])}  # done by the agent before timing
    assert "TensorRT 8.5: fp32: --noTF32; int8: --int8 --fp16" in steps["build engine"]
    assert "TensorRT 10.0+: fp32: --noTF32; int8: --stronglyTyped" in steps["build engine"]
    assert "key = sha256(model, TensorRT version, GPU/SoC, flags)".lower() in steps["build engine"].lower()
    assert "trtexec --loadEngine=trt-engines/KEY.engine" in steps["time engine"]
    human = cli("plan", DIGITS, "--target", "jetson-orin-nano")
    assert "backend   tensorrt" in human.stdout and "precision int8" in human.stdout and "lint passed" in human.stdout


def test_plan_jetson_nano_is_fp16_and_says_why(cli):
    res = cli("plan", DIGITS, "--target", "jetson-nano", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert (doc["backend"], doc["precision"], doc["quantize"]) == ("tensorrt", "fp16", False)
    notes = " ".join(doc["notes"])
    assert "Maxwell GPU has no fast int8" in notes and "has no int8 path: running fp16" in notes
    assert "TensorRT 8.2: fp16: --fp16" in {d["name"]: d["detail"] for s in doc["steps"] for d in s.get("device_steps", [])}["build engine"]


# -- facts --------------------------------------------------------------------------------------


def test_nv_tegra_release_parses_real_lines():
    # the line a Jetson Nano with JetPack 4.6.1 prints (cat /etc/nv_tegra_release)
    nano = "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64, DATE: Sat Feb 19 17:05:08 UTC 2022"
    assert facts.parse_nv_tegra_release(nano) == "R32.7.1"
    assert facts.parse_nv_tegra_release("# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref") == "R35.4.1"
    assert facts.parse_nv_tegra_release("Ubuntu 22.04") is None


def test_nvinfer_version_from_soname_and_dpkg():
    names = ["libnvinfer.so", "libnvinfer.so.8", "libnvinfer.so.8.5.2", "libnvinfer_plugin.so.8.5.2", "libc.so.6"]
    assert trt_probe.nvinfer_soname_version(names) == "8.5.2"
    assert trt_probe.nvinfer_soname_version(["libnvonnxparser.so.10.3.0"]) is None
    dpkg = "libnvinfer-bin 8.5.2-1+cuda11.4\nlibnvinfer-dev 8.5.2-1+cuda11.4\nlibnvinfer8 8.5.2-1+cuda11.4\n"
    assert trt_probe.parse_dpkg_nvinfer(dpkg) == "8.5.2"
    assert trt_probe.parse_dpkg_nvinfer("libnvinfer10 10.3.0.30-1+cuda12.5\n") == "10.3.0.30"
    assert trt_probe.parse_dpkg_nvinfer("libnvinfer-bin \n") is None


# -- the device side, with trtexec replayed -----------------------------------------------------


@pytest.fixture
def fake_trtexec(tmp_path, monkeypatch):
    """Put a ``trtexec`` that replays recorded output first on PATH; return its settings."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "trtexec"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FIXTURES / "fake_trtexec.py"}" "$@"\n', encoding="utf-8")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    calls = tmp_path / "calls.jsonl"
    env = {
        "FAKE_TRTEXEC_VERSION": "8600",
        "FAKE_TRTEXEC_BUILD_LOG": str(FIXTURES / "trt8600-rtx3060-build-int8.log"),
        "FAKE_TRTEXEC_BENCH_LOG": str(FIXTURES / "trt8600-rtx3060-build-int8.log"),
        "FAKE_TRTEXEC_TIMES": str(FIXTURES / "trt-explorer-mobilenet-qat.timing.json"),
        "FAKE_TRTEXEC_PROFILE": str(FIXTURES / "trt-explorer-mobilenet-qat.profile.json"),
        "FAKE_TRTEXEC_CALLS": str(calls),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    class Fake:
        path = shim

        @staticmethod
        def set(**values):
            for key, value in values.items():
                monkeypatch.setenv(f"FAKE_TRTEXEC_{key}", value)

        @staticmethod
        def calls() -> list[list[str]]:
            return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

        @staticmethod
        def builds() -> list[list[str]]:
            return [c for c in Fake.calls() if any(a.startswith("--onnx=") for a in c)]

    return Fake


def _trt_bundle(tmp_path: Path, precision: str = "int8", inputs: Path | None = None) -> Path:
    return tiny_bundle(
        tmp_path / "bundle", backend="tensorrt", precision=precision, inputs=inputs,
        options=BACKEND.variant_options(None, precision), profile="jetson-orin-nano", model_sha256=SHA,
    ).root  # fmt: skip


def test_agent_builds_then_reuses_the_engine(tmp_path, fake_trtexec):
    root = _trt_bundle(tmp_path)
    doc = agent_runner.bench(str(root), "int8", warmup=50, iterations=100, profile=True)
    info = doc["backend_info"]
    assert doc["backend"] == "tensorrt" and doc["backend_version"] == "8.6.0"
    assert info["engine_cached"] is False and info["engine_build_ns"] > 0 and info["trtexec_build_s"] == 46.6611
    build = info["build_argv"]
    assert build[0] == str(fake_trtexec.path) and build[1] == f"--onnx={root / 'int8' / 'tiny.onnx'}"
    assert build[2].startswith("--saveEngine=") and build[2].endswith(".partial")
    assert build[3:6] == ["--int8", "--fp16", "--shapes=x:1x16"]
    assert build[6].startswith("--timingCacheFile=") and build[7] == "--skipInference"
    bench = info["bench_argv"]
    assert bench[1] == f"--loadEngine={info['engine']}" and bench[2:5] == ["--warmUp=1000", "--iterations=100", "--duration=0"]
    assert "--separateProfileRun" in bench and "--shapes=x:1x16" in bench
    assert info["engine"] == str(root / "trt-engines" / f"{info['engine_key']}.engine") and Path(info["engine"]).is_file()
    # the replayed log reports 94 warm-up queries; trtexec's trace holds them first
    assert len(doc["samples_ns"]) == 118 - 94 and doc["samples_ns"][0] == 477570  # record 94: 0.47757 ms
    assert doc["first_inference_ns"] is None and doc["config"]["batch"] == 1
    assert len(doc["layers"]) == 18 and doc["layers"][1]["op"] == "Conv+Clip"
    assert info["device_name"] == "NVIDIA GeForce RTX 3060 Laptop GPU" and info["warmup_queries"] == 94
    assert info["latency_ms"]["median"] == 2.0188 and info["gpu_compute_ms"]["median"] == 1.44275
    record = make_record(doc, model_name="tiny", target="jetson-orin-nano", device="local")
    assert record["stats"]["n"] == 24

    again = agent_runner.bench(str(root), "int8", warmup=50, iterations=100)
    assert again["backend_info"]["engine_cached"] is True and again["backend_info"]["engine_build_ns"] is None
    assert again["backend_info"]["engine_key"] == info["engine_key"]
    assert len(fake_trtexec.builds()) == 1
    assert not list((root / "trt-engines").glob("*.partial")) and not list((root / "trt-engines").glob("bench-*"))


def test_another_tensorrt_version_builds_another_engine(tmp_path, fake_trtexec):
    root = _trt_bundle(tmp_path)
    first = agent_runner.bench(str(root), "int8", warmup=1, iterations=10)["backend_info"]
    fake_trtexec.set(VERSION="101600")
    second = agent_runner.bench(str(root), "int8", warmup=1, iterations=10)["backend_info"]
    assert second["engine_key"] != first["engine_key"] and second["engine_cached"] is False
    assert second["build_argv"][3] == "--stronglyTyped" and "--int8" not in second["build_argv"]
    assert len(fake_trtexec.builds()) == 2


def test_agent_feeds_the_variants_inputs_to_trtexec(tmp_path, fake_trtexec):
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    np.savez(tmp_path / "inputs.npz", x=x)
    root = _trt_bundle(tmp_path, precision="fp16", inputs=tmp_path / "inputs.npz")
    info = agent_runner.bench(str(root), "fp16", warmup=0, iterations=5)["backend_info"]
    assert "--fp16" in info["build_argv"]
    (load,) = [a for a in info["bench_argv"] if a.startswith("--loadInputs=")]
    assert re.fullmatch(r"--loadInputs=x:.*/input0\.raw", load)


def test_failed_build_names_trtexecs_error_and_leaves_no_engine(tmp_path, fake_trtexec):
    root = _trt_bundle(tmp_path)
    fake_trtexec.set(FAIL="build", BUILD_LOG=str(FIXTURES / "trt-build-failed-int32-bias-dq.log"))
    with pytest.raises(AgentFailure, match=r"could not build the int8 engine: Error\[3\]: .*only activation types") as err:
        agent_runner.bench(str(root), "int8", warmup=1, iterations=10)
    assert ".build.log" in err.value.hint
    engines = root / "trt-engines"
    assert not list(engines.glob("*.engine")) and not list(engines.glob("*.partial"))
    (log,) = engines.glob("*.build.log")
    assert "&&&& FAILED TensorRT.trtexec (exit code 1)" in log.read_text()


def test_bench_without_a_summary_is_a_clear_failure(tmp_path, fake_trtexec):
    root = _trt_bundle(tmp_path)
    fake_trtexec.set(BENCH_LOG=str(FIXTURES / "trt101600-rtx6000-loadengine-dumpprofile.log"))
    with pytest.raises(AgentFailure, match="--separateProfileRun"):
        agent_runner.bench(str(root), "int8", warmup=1, iterations=10)


def test_no_trtexec_on_the_device(tmp_path, monkeypatch):
    root = _trt_bundle(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(AgentFailure, match="trtexec is not on this device"):
        agent_runner.bench(str(root), "int8", warmup=1, iterations=10)


def test_trtexec_older_than_8_is_refused(tmp_path, fake_trtexec):
    root = _trt_bundle(tmp_path)
    fake_trtexec.set(VERSION="7103")
    with pytest.raises(AgentFailure, match="TensorRT 7.1.3 on the device is older than 8.0"):
        agent_runner.bench(str(root), "int8", warmup=1, iterations=10)


def test_facts_report_tensorrt_from_trtexec(fake_trtexec):
    found = facts.tensorrt_facts()
    assert found["trtexec"] == str(fake_trtexec.path)
    assert (found["version"], found["source"]) == ("8.6.0", "trtexec")
    assert facts.device_facts()["runtimes"]["tensorrt"] == "8.6.0"


# -- a whole deploy, trtexec replayed ------------------------------------------------------------
# Preflight (rightly) refuses a Jetson profile on this x86_64 machine, so the deploys use profiles
# for an x86_64 host with an NVIDIA GPU, with the Jetson profiles' TensorRT entries.


def _gpu_host_profile(tmp_path: Path, like: str) -> Path:
    jetson = load_profile(like).backend("tensorrt")
    bounds = "".join(f'{k} = "{v}"\n' for k, v in (("min_version", jetson.min_version), ("max_version", jetson.max_version)) if v)
    path = tmp_path / f"gpu-host-{like}.toml"
    path.write_text(
        f'schema = 1\nname = "gpu-host-{like}"\ndescription = "x86_64 host with an NVIDIA GPU, TensorRT as on {like}"\n\n'
        '[cpu]\narch = "x86_64"\nisa = ["sse4_2"]\n\n'
        f'[[backends]]\nname = "tensorrt"\ndevice = "GPU"\nprecisions = {json.dumps(list(jetson.precisions))}\n{bounds}\n'
        "[bench]\nwarmup = 50\niterations = 100\n",
        encoding="utf-8",
    )
    return path


def test_deploy_int8_builds_once_and_reuses(cli, tmp_path, fake_trtexec):
    out = tmp_path / "out"
    target = _gpu_host_profile(tmp_path, "jetson-orin-nano")
    args = ("deploy", DIGITS, "--target", target, "--output", out, "--iterations", "20", "--json")
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert (doc["backend"], doc["precision"]) == ("tensorrt", "int8")
    assert any("lint passed" in n for n in doc["plan"]["notes"])
    runs = {r["variant"]: r for r in doc["runs"]}
    assert set(runs) == {"fp32", "int8"}
    assert "--noTF32" in runs["fp32"]["backend_info"]["build_argv"]
    assert runs["int8"]["backend_info"]["build_argv"][3:5] == ["--int8", "--fp16"]
    assert all(r["backend_info"]["engine_cached"] is False for r in runs.values())
    assert all(r["stats"]["n"] == 24 and len(r["layers"]) == 18 for r in runs.values())
    assert len(fake_trtexec.builds()) == 2

    second = cli(*args, "--remeasure")  # bench again (not the reused runs), on the cached engines
    assert second.returncode == 0, second.stderr
    again = {r["variant"]: r for r in json.loads(second.stdout)["runs"]}
    assert all(r["backend_info"]["engine_cached"] is True for r in again.values())
    assert len(fake_trtexec.builds()) == 2  # nothing rebuilt


def test_deploy_fp16_only_profile(cli, tmp_path, fake_trtexec):
    fake_trtexec.set(
        VERSION="8201",
        BUILD_LOG=str(FIXTURES / "trt8201-jetson-nano-summary.log"),
        BENCH_LOG=str(FIXTURES / "trt8201-jetson-nano-summary.log"),
    )
    target = _gpu_host_profile(tmp_path, "jetson-nano")
    res = cli("deploy", DIGITS, "--target", target, "--output", tmp_path / "out", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    (run,) = doc["runs"]
    assert (doc["precision"], run["variant"]) == ("fp16", "fp16")
    assert run["backend_info"]["build_argv"][3] == "--fp16" and run["backend_info"]["build_argv"][-1] == "--buildOnly"
    assert run["stats"]["n"] == 118  # the 8.2 log reports no warm-up count: the whole trace is kept


def test_deploy_refuses_a_device_whose_tensorrt_is_too_new_for_the_profile(cli, tmp_path, fake_trtexec):
    fake_trtexec.set(VERSION="8600")
    res = cli("deploy", DIGITS, "--target", _gpu_host_profile(tmp_path, "jetson-nano"), "--output", tmp_path / "out")
    assert_one_line_error(res, EXIT_DEVICE, "the device has TensorRT 8.6.0; gpu-host-jetson-nano needs <= 8.2")
    assert not fake_trtexec.builds()
