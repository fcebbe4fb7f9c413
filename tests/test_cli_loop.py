"""The whole loop through the real CLI: quantize, plan, deploy on the local target, and bad input."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.builders import float_io, onnx_model
from tests.conftest import EXAMPLES, assert_one_line_error

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
MOBILENET = EXAMPLES / "mobilenetv2" / "mobilenetv2.onnx"


def _dynamic_copy(tmp_path):
    """The digits model with a dynamic batch dimension (and no sidecar beside it)."""
    m = onnx.load(str(DIGITS))
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "dyn.onnx"
    onnx.save(m, str(path))
    return path


# -- deploy: the done-when of the local loop --------------------------------------------------


@pytest.mark.slow
def test_deploy_digits_json_has_stats_and_accuracy(cli, tmp_path):
    r = cli("deploy", DIGITS, "--target", "local", "--json", "--iterations", "30", "-o", tmp_path / "bundle")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # ekrt (native) runs the int8 variant, ONNX Runtime the fp32 reference
    assert doc["kind"] == "edgekit.deploy" and doc["backend"] == "native" and doc["precision"] == "int8"
    s = doc["summary"]
    for v in ("fp32", "int8"):
        assert s["variants"][v]["p50_ms"] > 0
        assert s["variants"][v]["p99_ms"] >= s["variants"][v]["p50_ms"]
    assert len(doc["runs"]) == 2 and all(run["stats"]["n"] == 30 for run in doc["runs"])
    # Held-out accuracy on real handwriting: int8 within 1 point of fp32.
    assert s["accuracy_fp32"] > 0.97
    assert s["accuracy_fp32"] - s["accuracy_int8"] <= 0.01
    assert s["agreement"]["samples"] == 360
    assert s["size_ratio"] < 0.5  # int8 weights
    # The runs are in the results store and can be read back.
    shown = cli("results", "show", str(doc["runs"][1]["id"]), "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["agent"]["variant"] == "int8"
    # The bundle on disk is complete and verifiable.
    from edgekit.bundle import load_bundle

    b = load_bundle(tmp_path / "bundle")
    assert {v.name for v in b.manifest.variants} == {"fp32", "int8"}


@pytest.mark.slow
def test_deploy_human_summary_and_second_push_sends_nothing(cli, tmp_path):
    args = ("deploy", DIGITS, "--iterations", "20", "-o", tmp_path / "b")
    first = cli(*args)
    assert first.returncode == 0, first.stderr
    assert "p50 ms" in first.stdout and "fp32" in first.stdout and "int8" in first.stdout
    # the int8 gate's verdict, measured on the device: speed beyond the noise and accuracy
    assert re.search(r"^recommended: (int8|fp32) \(int8 is .* fp32 .*accuracy drop", first.stdout, re.M), first.stdout
    assert "agreement measured on local: fp32 on onnxruntime, int8 on native, 360 held-out samples" in first.stdout
    second = cli(*args, "--json")
    doc = json.loads(second.stdout)
    # Quantization is deterministic, so the bundle content is the same and is not sent again.
    assert doc["push"]["files_skipped"] >= 4
    assert doc["push"]["files_sent"] <= 1  # at most the manifest (it records its creation time)
    assert doc["push"]["bytes_sent"] <= (tmp_path / "b" / "manifest.json").stat().st_size


def test_deploy_dry_run_writes_nothing(cli, tmp_path):
    r = cli("deploy", DIGITS, "--dry-run", "-o", tmp_path / "b", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["dry_run"] is True and doc["plan"]["backend"] == "native"
    assert not (tmp_path / "b").exists()
    assert not (tmp_path / "edgekit-out").exists()


def test_deploy_no_bench_builds_bundle_only(cli, tmp_path):
    r = cli("deploy", DIGITS, "--no-bench", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["runs"] == [] and doc["push"] is None
    assert (tmp_path / "b" / "manifest.json").is_file()
    assert cli("results", "list", "--json").stdout.strip() == "[]"


def test_deploy_no_quantize_runs_fp32_only(cli, tmp_path):
    r = cli("deploy", DIGITS, "--no-quantize", "--iterations", "5", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["precision"] == "fp32" and doc["quantize"] is None
    assert list(doc["summary"]["variants"]) == ["fp32"]


def test_deploy_dynamic_model_with_shape_from_sidecar(cli, tmp_path):
    r = cli("deploy", MOBILENET, "--no-bench", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["plan"]["inputs"][0]["shape"] == [1, 3, 64, 64]
    assert doc["quantize"]["agreement"]["accuracy_drop"] <= 0.015


# -- quantize and plan -------------------------------------------------------------------------


def test_quantize_writes_model_and_reports(cli, tmp_path):
    out = tmp_path / "q.onnx"
    r = cli("quantize", DIGITS, "-o", out, "--method", "percentile")
    assert r.returncode == 0, r.stderr
    assert "fp32 vs int8" in r.stdout and "accuracy on labels" in r.stdout
    m = onnx.load(str(out))
    ops = {n.op_type for n in m.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    assert not any(n.op_type == "BatchNormalization" for n in m.graph.node)


def test_quantize_random_calibration_warns_loudly(cli, tmp_path):
    path = _dynamic_copy(tmp_path)
    r = cli("quantize", path, "-o", tmp_path / "q.onnx", "--shape", "input:1,1,8,8", "--json")
    assert r.returncode == 0, r.stderr
    assert "RANDOM" in r.stderr
    assert json.loads(r.stdout)["calibration"]["random"] is True


def test_plan_targets(cli):
    r = cli("plan", DIGITS, "--target", "rpi5", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "native" and doc["precision"] == "int8"  # the runner cross-builds for aarch64
    assert [s["name"] for s in doc["steps"]][:4] == ["quantize", "compile", "compile", "bundle"]
    human = cli("plan", DIGITS, "--target", "local")
    assert "backend   native" in human.stdout and "precision int8" in human.stdout


def test_plan_lists_float_nodes_with_reasons(cli, tmp_path):
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], np.ones(12, dtype=np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Softmax", ["h"], ["y"], name="sm")]
    path = tmp_path / "m.onnx"
    onnx.save(onnx_model(nodes, [float_io("x", [1, 4])], [float_io("y", [1, 3])], [w], opset=13, ir_version=None), str(path))
    doc = json.loads(cli("plan", path, "--json").stdout)
    assert doc["float_nodes"] == [{"name": "sm", "op": "Softmax", "kind": "float", "reason": "no int8 rule for Softmax in the native scheme"}]


def test_plan_forced_unavailable_backend_is_refused(cli):
    r = cli("plan", DIGITS, "--backend", "tflite")  # an ONNX model: tflite runs .tflite files only
    assert_one_line_error(r, 3, "--backend tflite cannot run")
    r = cli("plan", DIGITS, "--backend", "nope")
    assert_one_line_error(r, 2, "unknown --backend 'nope'")


# -- bad input: one line, non-zero exit, no partial output -------------------------------------


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "model file not found"),
        (b"", "model file is empty"),
        (b"hello, not a model", "not an ONNX model"),
        (DIGITS.read_bytes()[:5000], "not an ONNX model"),  # truncated
    ],
)
def test_bad_model_files(cli, tmp_path, content, needle):
    model = tmp_path / "model.onnx"
    if content is not None:
        model.write_bytes(content)
    out = tmp_path / "q.onnx"
    for args in (("quantize", model, "-o", out), ("deploy", model, "-o", tmp_path / "b")):
        r = cli(*args)
        assert_one_line_error(r, 3, needle)
    assert not out.exists() and not (tmp_path / "b").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_dynamic_shape_without_shape(cli, tmp_path):
    path = _dynamic_copy(tmp_path)
    r = cli("quantize", path, "-o", tmp_path / "q.onnx")
    assert_one_line_error(r, 3, "dynamic shape")
    assert "--shape input:1,1,8,8" in r.stderr
    assert not (tmp_path / "q.onnx").exists()


def test_bad_shape_flags(cli, tmp_path):
    path = _dynamic_copy(tmp_path)
    assert_one_line_error(cli("plan", path, "--shape", "input=1,1,8,8"), 2, "bad --shape")
    assert_one_line_error(cli("plan", path, "--shape", "nope:1,1,8,8"), 2, "the model's inputs are: input")
    assert_one_line_error(cli("plan", path, "--shape", "input:1,2,8,8"), 2, "fixed to 1")


@pytest.mark.parametrize(
    "arrays, needle",
    [
        ({"input": np.zeros((10, 1, 8, 9), np.float32)}, "has shape [10, 1, 8, 9]"),
        ({"input": np.zeros((10, 1, 8, 8), np.uint8)}, "has dtype uint8"),
        ({"image": np.zeros((10, 1, 8, 8), np.float32)}, "no array for input(s) input"),
    ],
)
def test_bad_calibration_data(cli, tmp_path, arrays, needle):
    calib = tmp_path / "calib.npz"
    np.savez(calib, **arrays)
    out = tmp_path / "q.onnx"
    r = cli("quantize", DIGITS, "-o", out, "--calib", calib)
    assert_one_line_error(r, 3, needle)
    assert not out.exists()


def test_unknown_profile_and_invalid_profile_toml(cli, tmp_path):
    r = cli("deploy", DIGITS, "--target", "rpi55", "-o", tmp_path / "b")
    assert_one_line_error(r, 3, "unknown target profile 'rpi55'")
    assert "rpi5" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('schema = 1\nname = "bad"\n[cpu]\narch = "sparc"\n')
    r = cli("deploy", DIGITS, "--target", bad, "-o", tmp_path / "b")
    assert_one_line_error(r, 3, "bad.toml")
    assert not (tmp_path / "b").exists()


def test_output_in_missing_directory(cli, tmp_path):
    r = cli("quantize", DIGITS, "-o", tmp_path / "nope" / "q.onnx")
    assert_one_line_error(r, 3, "output directory does not exist")
    r = cli("deploy", DIGITS, "-o", tmp_path / "nope" / "bundle")
    assert_one_line_error(r, 3, "output directory does not exist")
    assert not (tmp_path / "nope").exists()


def test_unknown_method_and_exclude(cli, tmp_path):
    assert_one_line_error(cli("quantize", DIGITS, "-o", tmp_path / "q.onnx", "--method", "magic"), 2, "unknown calibration method")
    r = cli("quantize", DIGITS, "-o", tmp_path / "q.onnx", "--exclude", "conv_1")
    assert_one_line_error(r, 2, "--exclude names no node called 'conv_1'")
    assert not (tmp_path / "q.onnx").exists()


def test_quantized_model_refused(cli, tmp_path):
    q = tmp_path / "q.onnx"
    assert cli("quantize", DIGITS, "-o", q).returncode == 0
    shutil.copy(q, tmp_path / "again.onnx")
    assert_one_line_error(cli("quantize", tmp_path / "again.onnx", "-o", tmp_path / "qq.onnx"), 3, "already quantized")


def test_usage_errors_are_one_line(cli):
    r = cli("deploy")
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr
    r = cli("deploy", DIGITS, "--iterations", "0")
    assert r.returncode == 2 and "error:" in r.stderr
    r = cli("bench", DIGITS, "--min-time", "-1")
    assert r.returncode == 2 and "error:" in r.stderr and "--min-time" in r.stderr


def test_every_command_has_an_example_in_help(cli):
    for cmd in ("quantize", "plan", "deploy", "bench"):
        r = cli(cmd, "--help")
        assert r.returncode == 0
        assert "Example" in r.stdout, cmd
