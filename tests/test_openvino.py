"""OpenVINO for real (CPU plugin): deploy on x86-openvino, load/cached-load times, per-layer
counters with int8 kernels, device fallback detection; and the plans for NCS2 (MYRIAD, fp16,
OpenVINO <= 2022.3) and for devices whose facts lack OpenVINO or have the wrong version.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.modelio import load_model
from edgekit.plan import make_plan
from edgekit.profiles import load_profile
from edgekit.quantize import report
from edgekit.targets import get_backend
from tests.conftest import EXAMPLES, assert_one_line_error

ov = pytest.importorskip("openvino", reason="openvino (the openvino extra) is not installed")

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"


def _facts(**runtimes) -> dict:
    return {"device": {"arch": "x86_64", "runtimes": {"onnxruntime": "1.20.0", "numpy": "2.2.0", **runtimes}}}


# -- the done-when: deploy on x86-openvino runs OpenVINO for real --------------------------------


@pytest.mark.slow
def test_deploy_x86_openvino_reports_loads_layers_and_devices(cli, tmp_path):
    r = cli("deploy", DIGITS, "--target", "x86-openvino", "--iterations", "30", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["backend"], doc["precision"]) == ("openvino", "int8")
    assert doc["summary"]["accuracy_fp32"] - doc["summary"]["accuracy_int8"] <= 0.01
    runs = {run["variant"]: run for run in doc["runs"]}
    assert set(runs) == {"fp32", "int8"}
    for run in runs.values():
        info = run["backend_info"]
        assert info["device"] == "CPU" and info["execution_devices"] == ["CPU"] and info["fallback"] is False
        assert 0 < info["cached_load_ns"] < info["first_load_ns"]  # the second compile hits the cache
        assert info["cache_files"] >= 1
        assert info["inference_precision"] == "f32"  # not bf16, even on CPUs that have it
        assert run["stats"]["n"] == 30
    kernels = lambda run: {x["exec_type"] for x in run["layers"] if x["op"] == "Convolution"}  # noqa: E731
    # int8 convolutions run int8 kernels (e.g. brgconv_avx512_I8, jit_avx2_I8); fp32 ones don't.
    assert kernels(runs["int8"]) and all(k.lower().endswith("_i8") for k in kernels(runs["int8"]))
    assert kernels(runs["fp32"]) and not any(k.lower().endswith("_i8") for k in kernels(runs["fp32"]))
    assert all(set(x) >= {"name", "op", "ns", "exec_type", "status"} for x in runs["int8"]["layers"])
    assert sum(x["ns"] for x in runs["int8"]["layers"]) > 0
    # The stored record carries the same (edgekit results show).
    shown = json.loads(cli("results", "show", str(runs["int8"]["id"]), "--json").stdout)
    assert shown["agent"]["backend_info"]["first_load_ns"] == runs["int8"]["backend_info"]["first_load_ns"]
    # The plan said how: compile on the device with a cache.
    assert "compile" in [s["name"] for s in doc["plan"]["steps"]]
    cpu = {"device": "CPU", "precision_hint": "f32", "cache": True}
    assert {v["name"]: v["options"] for v in doc["plan"]["variants"]} == {"fp32": cpu, "int8": cpu}
    # The int8 model in the bundle has uint8 activations (the openvino scheme's; the kernels above ran them).
    import onnx

    model = onnx.load(str(tmp_path / "b" / "int8" / "model.onnx"))
    consts = {t.name: t.data_type for t in model.graph.initializer}
    assert {consts[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear"} == {onnx.TensorProto.UINT8}


@pytest.mark.slow
def test_deploy_x86_openvino_human_summary(cli, tmp_path):
    r = cli("deploy", DIGITS, "--target", "x86-openvino", "--iterations", "10", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "backend openvino" in out
    for variant in ("fp32", "int8"):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"{variant}: first load"))
        assert "cached load" in line and "executed on CPU" in line
        assert f"{variant}: slowest" in out
    assert "_I8" in out or "_i8" in out  # the int8 kernels in the layer table


def test_forced_openvino_on_local(cli, tmp_path):
    plan = json.loads(cli("plan", DIGITS, "--json").stdout)
    assert plan["backend"] != "openvino"  # on local OpenVINO comes after ekrt and ONNX Runtime
    r = cli("deploy", DIGITS, "--backend", "openvino", "--iterations", "5", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "openvino" and doc["plan"]["scheme"]["name"] == "openvino"
    assert [run["backend_info"]["execution_devices"] for run in doc["runs"]] == [["CPU"], ["CPU"]]
    b = cli("bench", DIGITS, "--backend", "openvino", "--iterations", "5", "--threads", "1", "--json")
    assert b.returncode == 0, b.stderr
    (rec,) = json.loads(b.stdout)
    assert (rec["agent"]["backend"], rec["agent"]["precision"]) == ("openvino", "fp32")
    assert rec["agent"]["backend_info"]["config"]["INFERENCE_NUM_THREADS"] == "1"


def test_missing_openvino_device_is_one_error(cli, tmp_path):
    profile = tmp_path / "npu-here.toml"
    profile.write_text(
        'schema = 1\nname = "npu-here"\ndescription = "this machine, asked for an NPU it does not have"\n'
        '[cpu]\nprobe = true\n[[backends]]\nname = "openvino"\ndevice = "NPU"\nprecisions = ["int8", "fp16"]\n'
    )
    r = cli("deploy", DIGITS, "--target", profile, "--iterations", "3")
    assert_one_line_error(r, 4, "NPU")  # found by the device check before, or by the agent


def test_agent_names_the_devices_it_sees(tmp_path):
    from edgekit.agent import AgentFailure
    from edgekit.agent.backends import openvino as agent_ov

    with pytest.raises(AgentFailure) as err:
        agent_ov.load(str(DIGITS), 1, {"device": "NPU"}, str(tmp_path))
    assert "sees CPU, not the requested NPU" in err.value.message and "NPU driver" in err.value.hint
    with pytest.raises(AgentFailure) as err:
        agent_ov.load(str(DIGITS), 1, {"device": "MYRIAD"}, str(tmp_path))
    assert "<= 2022.3" in err.value.hint


# -- agent backend: numbers agree with ONNX Runtime on the same QDQ model ------------------------


def test_openvino_int8_agrees_with_the_qdq_reference(tmp_path):
    from edgekit.agent.backends import openvino as agent_ov
    from edgekit.quantize import load_feeds, quantize_model, save_model
    from edgekit.quantize.scheme import OPENVINO

    loaded = load_model(DIGITS)
    feeds = load_feeds(loaded.sidecar.calibration, loaded.inputs)
    result = quantize_model(loaded, OPENVINO, feeds, feeds)
    path = tmp_path / "q.onnx"
    save_model(result.model, path)
    session = agent_ov.load(str(path), 1, {"device": "CPU", "precision_hint": "f32", "cache": False}, str(tmp_path))
    assert session.info["cached_load_ns"] is None and "cache_dir" not in session.info
    ref = report.session(str(path), reference=True)  # Q/DQ as written: not ORT's host-dependent int8 kernels
    agree = 0
    samples = feeds.feeds[:100]
    for feed in samples:
        ov_out = next(iter(session.run(feed).values()))
        ort_out = ref.run(None, feed)[0]
        agree += int(np.argmax(ov_out) == np.argmax(ort_out))
        assert np.abs(ov_out - ort_out).max() < 0.5  # a few int8 steps of the logits' scale
    assert agree >= 98


# -- the openvino scheme's activations: uint8, the dtype OpenVINO's CPU plugin runs in int8 -----------


def _conv_kernels(path, feed) -> set:
    """The kernels OpenVINO's CPU plugin runs the model's convolutions with (compiling raises if it refuses)."""
    compiled = ov.Core().compile_model(str(path), "CPU", {"PERF_COUNT": True, "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    request.infer(feed)
    return {p.exec_type for p in request.get_profiling_info() if p.node_type == "Convolution"}


@pytest.mark.parametrize("example", ["digits/digits_cnn.onnx", "mobilenetv2/mobilenetv2.onnx"])
def test_openvino_scheme_emits_uint8_activations_the_cpu_plugin_runs_in_int8(example, tmp_path):
    import dataclasses

    import onnx

    from edgekit.quantize import load_feeds, quantize_model, save_model

    loaded = load_model(EXAMPLES / example)
    planned = make_plan(loaded, load_profile("x86-openvino"), facts=_facts(openvino=ov.__version__.split("-")[0])).scheme
    assert planned.name == "openvino" and planned.activation_dtype == "uint8"
    feeds = load_feeds(loaded.sidecar.calibration, loaded.inputs)
    outcome = {}
    for dtype in ("int8", "uint8"):  # every activation dtype a QuantScheme can emit
        result = quantize_model(loaded, dataclasses.replace(planned, activation_dtype=dtype), feeds, feeds)
        path = tmp_path / f"{dtype}.onnx"
        save_model(result.model, path)
        model = onnx.load(str(path))
        consts = {t.name: t for t in model.graph.initializer}
        zero_points = {consts[n.input[2]].data_type for n in model.graph.node if n.op_type == "QuantizeLinear"}
        assert zero_points == {onnx.TensorProto.UINT8 if dtype == "uint8" else onnx.TensorProto.INT8}
        try:
            outcome[dtype] = _conv_kernels(path, feeds.feeds[0])
        except RuntimeError as exc:  # 2026.4 on AMX Xeons: "No suitable implementations" for int8
            outcome[dtype] = str(exc).splitlines()[0]
    # uint8: compiles, and every convolution runs an int8 kernel (brgconv_avx512_amx_I8, jit_avx2_I8, ...).
    # int8 activations on this VM's AMX CPU compiled, but ran digits' convolutions as brgconv_avx512_f32.
    assert isinstance(outcome["uint8"], set) and outcome["uint8"], outcome
    assert all(k.lower().endswith("_i8") for k in outcome["uint8"]), outcome


# -- a model the device's OpenVINO refuses at compile: the deploy falls back to the next backend ----


def _scaler_model(path):
    """MatMul, Relu, then ai.onnx.ml's Scaler: ONNX Runtime runs it, OpenVINO 2026.4's ONNX frontend
    has no conversion rule for it (a real refusal at compile, on any CPU)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.RandomState(0).standard_normal((16, 8)).astype(np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Scaler", ["r"], ["y"], domain="ai.onnx.ml", scale=[2.0], offset=[1.0]),
    ]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_model_openvino_refuses_at_compile_falls_back_to_the_next_backend(cli, tmp_path):
    model = _scaler_model(tmp_path / "scaled.onnx")
    r = cli("deploy", model, "--target", "x86-openvino", "--iterations", "3", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "onnxruntime" and {run["backend"] for run in doc["runs"]} == {"onnxruntime"}
    skipped = {s["backend"]: s["reason"] for s in doc["plan"]["skipped_backends"]}
    assert skipped["openvino"].startswith("the device's openvino refused the model at compile: OpenVINO ")
    assert skipped["openvino"].endswith("No conversion rule found for operations: ai.onnx.ml.Scaler")
    assert any("fell back to onnxruntime" in n for n in doc["plan"]["notes"])
    warnings = [x for x in r.stderr.splitlines() if x.startswith("warning: the device's openvino refused")]
    assert len(warnings) == 1 and warnings[0].endswith("falling back to onnxruntime, the next backend of x86-openvino")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert {v["backend"] for v in manifest["variants"]} == {"onnxruntime"}  # the bundle is the fallback's
    # Forced, OpenVINO's refusal is the error: one line and a hint, exit 4, no fallback.
    forced = cli("deploy", model, "--target", "x86-openvino", "--backend", "openvino", "--iterations", "3", "-o", tmp_path / "c")
    assert_one_line_error(forced, 4, "No conversion rule found for operations: ai.onnx.ml.Scaler")


# -- plans: NCS2, versions, devices without OpenVINO ---------------------------------------------


def test_plan_intel_ncs2_is_myriad_fp16_with_version_constraint(cli):
    r = cli("plan", DIGITS, "--target", "intel-ncs2", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["backend"], doc["precision"], doc["quantize"], doc["scheme"]) == ("openvino", "fp16", False, None)
    assert [v["options"] for v in doc["variants"]] == [{"device": "MYRIAD", "precision_hint": "f16", "cache": True}]
    notes = " | ".join(doc["notes"])
    assert "int8 is refused" in notes and "<= 2022.3" in notes and "MYRIAD plugin was removed in 2023.0" in notes
    assert "quantize" not in [s["name"] for s in doc["steps"]]
    human = cli("plan", DIGITS, "--target", "intel-ncs2")
    assert "precision fp16" in human.stdout and "MYRIAD" in human.stdout


def test_openvino_verdicts_from_device_facts():
    model = load_model(DIGITS)
    ncs2, npu, x86 = load_profile("intel-ncs2"), load_profile("intel-npu"), load_profile("x86-openvino")
    backend = get_backend("openvino")
    too_new = backend.supports(model, ncs2, _facts(openvino="2023.0.0"))
    assert not too_new.ok and "needs OpenVINO <= 2022.3" in too_new.reasons[0]
    lts = backend.supports(model, ncs2, _facts(openvino="2022.3.1"))  # a patch of 2022.3 is fine
    assert lts.ok and any("has OpenVINO 2022.3.1" in r for r in lts.reasons)
    assert any("not IR" in r for r in lts.reasons)  # older than this host's: ship ONNX, say why
    assert not backend.supports(model, npu, _facts(openvino="2023.2.0")).ok  # NPU plugin from 2023.3
    assert backend.supports(model, npu, _facts(openvino="2024.4.0")).ok
    ancient = backend.supports(model, x86, _facts(openvino="2021.4.2"))
    assert not ancient.ok and "2022.1 or newer" in ancient.reasons[0]


def test_device_without_openvino_skips_it_with_the_reason():
    plan = make_plan(load_model(DIGITS), load_profile("x86-openvino"), facts=_facts())
    assert plan.backend == "onnxruntime" and plan.probed
    assert plan.skipped == (("openvino", "openvino is not installed on the device"),)
    with_ov = make_plan(load_model(DIGITS), load_profile("x86-openvino"), facts=_facts(openvino=ov.__version__.split("-")[0]))
    assert with_ov.backend == "openvino" and with_ov.skipped == ()


# -- the timed step: OpenVINO's own per-request latency on inputs bound once -------------------------


def test_openvino_timed_step_is_the_requests_own_latency(tmp_path):
    import time

    from edgekit.agent.backends import openvino as agent_ov

    session = agent_ov.load(str(DIGITS), 1, {"device": "CPU", "cache": False}, str(tmp_path))
    rng = np.random.RandomState(3)
    a, b = (rng.standard_normal((1, 1, 8, 8)).astype(np.float32) for _ in range(2))
    want_a, want_b = (next(iter(session.run({"input": x}).values())).copy() for x in (a, b))
    assert not np.allclose(want_a, want_b)
    step, how = session.timed({"input": a})
    assert "InferRequest.latency" in how
    clock = time.perf_counter_ns
    for _ in range(50):
        t = clock()
        ns = step()
        wall = clock() - t
        assert type(ns) is int and 0 < ns <= wall  # timed inside the call, by OpenVINO
    np.testing.assert_allclose(session._request.get_output_tensor(0).data, want_a, rtol=1e-5, atol=1e-5)  # the bound input
    step, _ = session.timed({"input": b})
    step()
    np.testing.assert_allclose(session._request.get_output_tensor(0).data, want_b, rtol=1e-5, atol=1e-5)


def test_dynamic_inputs_compile_at_the_shapes_the_variant_is_timed_with(tmp_path):
    from edgekit.agent.backends import openvino as agent_ov

    model = EXAMPLES / "mobilenetv2" / "mobilenetv2.onnx"  # input 1x3xHxW
    x = np.random.RandomState(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    dynamic = agent_ov.load(str(model), 1, {"device": "CPU", "cache": False}, str(tmp_path))
    assert "reshaped" not in dynamic.info and dynamic._request.model_inputs[0].get_partial_shape().is_dynamic
    shapes = {"input": [1, 3, 64, 64], "absent": [1]}
    static = agent_ov.load(str(model), 1, {"device": "CPU", "cache": True, "input_shapes": shapes}, str(tmp_path))
    assert static.info["reshaped"] == {"input": [1, 3, 64, 64]}
    assert list(static._request.model_inputs[0].get_partial_shape().to_shape()) == [1, 3, 64, 64]
    assert 0 < static.info["cached_load_ns"] < static.info["first_load_ns"]  # the reshaped model is cached too
    want = next(iter(dynamic.run({"input": x}).values()))
    np.testing.assert_allclose(next(iter(static.run({"input": x}).values())), want, rtol=1e-4, atol=1e-4)
    static.timed({"input": x})
    assert static.layers()  # the profiled compile is reshaped alike
    with pytest.raises(RuntimeError):  # compiled for 64x64: another size is refused, not silently recompiled
        static.run({"input": np.zeros((1, 3, 32, 32), np.float32)})
