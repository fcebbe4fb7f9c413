"""--layers error: per-layer fp32-vs-int8 error measured on the device, by the backend that runs each
variant (ekrt, ONNX Runtime), next to each layer's time; a planted broken layer is named the worst."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edgekit import api as ek
from edgekit import deploy as deploy_mod
from edgekit import layererror
from edgekit.agent import AgentFailure
from edgekit.agent.runner import evaluate
from edgekit.modelio import load_model
from edgekit.plan import make_plan
from edgekit.profiles import load_profile
from tests.conftest import EXAMPLES, assert_one_line_error

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
CALIB = EXAMPLES / "digits" / "calib.npz"
BROKEN = "relu2"  # the activation whose int8 scale the test sets 100x too large


def _plant(monkeypatch, tensor: str = BROKEN) -> None:
    """Deploy's quantizer, then one activation's scale (its Q and DQ share it) multiplied by 100."""
    real = deploy_mod.quantize_model

    def broken(*args, **kwargs):
        result = real(*args, **kwargs)
        for init in result.model.graph.initializer:
            if init.name == f"{tensor}__scale":
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(100), init.name))
                return result
        raise AssertionError(f"no {tensor}__scale in the quantized model")

    monkeypatch.setattr(deploy_mod, "quantize_model", broken)


@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
def test_a_planted_broken_layer_is_named_the_worst_on_the_device(backend, monkeypatch, tmp_path):
    _plant(monkeypatch)
    r = ek.deploy(DIGITS, target="local", backend=backend, calib=CALIB, iterations=5, warmup=1, layer_error=True, output=tmp_path / "b")
    le = r.layer_error
    assert le is not None and le["measured_on"] == "local"
    assert le["variants"]["int8"]["backend"] == backend and le["variants"]["fp32"]["backend"] == "onnxruntime"
    assert le["worst"][0] == BROKEN, le["worst"]
    rows = {x["tensor"]: x for x in le["layers"]}
    assert {"input", "relu1", "relu2", "pool", "relu3", "logits"} <= set(rows)
    assert rows[BROKEN]["snr_db"] < 15 < rows["relu1"]["snr_db"], (rows[BROKEN]["snr_db"], rows["relu1"]["snr_db"])
    # the layers after it inherit the error; the one before does not
    assert rows["relu3"]["snr_db"] < 20 and rows["relu1"]["cosine"] > 0.999
    # each layer's time, from each variant's profiled pass on the device, joined by node name
    for name in ("relu1", "relu2", "relu3"):
        assert rows[name]["time_ns"]["int8"] > 0 and rows[name]["time_ns"]["fp32"] > 0, rows[name]
    # ekrt exposes the very int8 tensors it computes: its twin's outputs equal the plain run's
    if backend == "native":
        assert le["variants"]["int8"]["outputs_max_abs_diff_vs_plain"] == 0.0
    # the int8 run's stored record carries it (the HTML report reads it from there)
    record = next(x for x in r.records if x["agent"]["variant"] == "int8")
    assert record["layer_error"]["worst"][0] == BROKEN


def test_deploy_layers_error_cli_json_and_summary(cli, tmp_path):
    r = cli("deploy", DIGITS, "--target", "local", "--iterations", "5", "--warmup", "1", "--layers", "error", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    le = doc["layer_error"]
    assert le["variants"]["int8"]["backend"] == "native"
    assert [s["name"] for s in doc["executed_steps"]].count("layers") == 1
    for row in le["layers"]:
        assert row["snr_db"] is None or row["snr_db"] > 20, row  # the real quantization is good on every layer
        assert set(row["time_ns"]) == {"fp32", "int8"}
    assert le["worst"] == [x["tensor"] for x in layererror.worst(le["layers"])]
    human = cli("deploy", DIGITS, "--target", "local", "--iterations", "5", "--warmup", "1", "--layers", "error", "-o", tmp_path / "b")
    assert human.returncode == 0, human.stderr
    assert "per-layer int8 error measured on local" in human.stdout and "worst layer:" in human.stdout
    report = cli("report", *[str(x["id"]) for x in doc["runs"]], "-o", tmp_path / "r.html")
    assert report.returncode == 0, report.stderr
    assert "as the device computed them" in (tmp_path / "r.html").read_text()


def test_the_plan_says_it_and_plain_deploys_do_not_run_it():
    model, profile = load_model(DIGITS), load_profile("local")
    steps = [s.name for s in make_plan(model, profile, layer_error=True, calibration=str(CALIB)).steps]
    assert steps.index("layers") > max(i for i, s in enumerate(steps) if s == "eval")
    assert "layers" not in [s.name for s in make_plan(model, profile, calibration=str(CALIB)).steps]
    fp = make_plan(model, profile, layer_error=True, quantize=False)
    assert "layers" not in [s.name for s in fp.steps] and any("--layers error" in n for n in fp.notes)


def test_bad_layer_options(cli, tmp_path):
    assert_one_line_error(cli("deploy", DIGITS, "--layers", "eror"), 2, "unknown --layers 'eror'")
    assert_one_line_error(cli("deploy", DIGITS, "--layers", "error", "--no-layers"), 2, "contradict")
    bundle = tmp_path / "b"
    assert cli("deploy", DIGITS, "--no-bench", "-o", bundle).returncode == 0
    assert_one_line_error(cli("bench", bundle, "--layers", "error"), 2, "a bundle has none")
    assert not (tmp_path / "edgekit-out").exists()


def test_the_agent_runs_only_a_twin_the_manifest_lists(tmp_path):
    out = tmp_path / "b"
    ek.deploy(DIGITS, target="local", calib=CALIB, goal="bundle", layer_error=True, output=out)
    assert not (out / "int8" / "layers").exists()  # no device, no twin: the LayerError step is the device's
    ek.deploy(DIGITS, target="local", calib=CALIB, iterations=3, warmup=1, layer_error=True, output=out)
    assert (out / "int8" / "layers" / "model.ekm").is_file() and (out / "eval" / "layer-samples.npz").is_file()
    (out / "stray.onnx").write_bytes((out / "fp32" / "layers" / "model.onnx").read_bytes())
    with pytest.raises(AgentFailure, match="does not match its sha256"):
        evaluate(str(out), "fp32", "eval/layer-samples.npz", str(tmp_path / "o.npz"), model="stray.onnx")
    with pytest.raises(AgentFailure, match="no model file"):
        evaluate(str(out), "fp32", "eval/layer-samples.npz", str(tmp_path / "o.npz"), model="fp32/layers/nothing.onnx")
    doc = evaluate(str(out), "int8", "eval/layer-samples.npz", str(tmp_path / "o.npz"), model="int8/layers/model.ekm")
    twin = onnx.load(str(out / "fp32" / "layers" / "model.onnx"))
    # positional: the model's output, then one per int8 tensor: the fp32 twin's outputs, the input it is
    # fed and the model's output a second time (it is an int8 tensor too)
    with np.load(doc["outputs"]) as got:
        assert sorted(got.files) == sorted(f"output{k}" for k in range(len(twin.graph.output) + 2))
