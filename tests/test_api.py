"""The Python API (edgekit.api) drives the whole local loop without the CLI, and the plan is what runs."""

from __future__ import annotations

import json

import pytest

from edgekit import api
from edgekit.errors import UsageError
from edgekit.plan import Bench, Compile, Eval, Gate, Push, Quantize, Store, WriteBundle
from tests.conftest import EXAMPLES

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
# What differs between two runs of the same deploy: timings, ids, paths, clocks.
VOLATILE = {"stats", "p50_ms", "p99_ms", "mean_ms", "run_id", "id", "run_uuid", "measured", "seconds", "path", "push", "backend_info",
            "layers", "peak_rss_bytes", "speedup_p50", "int8_faster", "duration_s",
            "recommended", "recommendation", "cached", "step_seconds", "warnings"}  # fmt: skip  (the gate follows the timings; the second run hits the quantize cache)


def _stable(doc):
    """``doc`` without the fields that change from run to run (timings, ids, paths)."""
    if isinstance(doc, dict):
        return {k: _stable(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        return [_stable(v) for v in doc]
    return doc


@pytest.mark.slow
def test_api_deploy_gives_the_same_document_as_the_cli(cli, tmp_path):
    result = api.deploy(DIGITS, target="local", iterations=20, warmup=2, output=tmp_path / "b", remeasure=True)
    doc = result.to_dict()
    assert [r["variant"] for r in doc["runs"]] == ["fp32", "int8"]
    assert result.run_ids and all(isinstance(i, int) for i in result.run_ids)
    with api.results() as store:
        assert {store.get(i)["run_uuid"] for i in result.run_ids} == {r["run_uuid"] for r in doc["runs"]}

    # both measure: by default the CLI would reuse the API's runs (same bundle, device, settings)
    r = cli("deploy", DIGITS, "--target", "local", "--json", "--iterations", "20", "--warmup", "2", "-o", tmp_path / "b", "--remeasure")
    assert r.returncode == 0, r.stderr
    from_cli = json.loads(r.stdout)
    assert _stable(from_cli) == _stable(json.loads(json.dumps(doc)))
    assert from_cli["bundle"]["hash"] == doc["bundle"]["hash"]  # the same artifact


@pytest.mark.slow
def test_dry_run_prints_the_steps_that_deploy_executes(cli, tmp_path):
    dry = cli("deploy", DIGITS, "--dry-run", "--json", "--iterations", "10", "-o", tmp_path / "b")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)["plan"]["steps"]
    real = cli("deploy", DIGITS, "--json", "--iterations", "10", "-o", tmp_path / "b")
    assert real.returncode == 0, real.stderr
    executed = json.loads(real.stdout)["executed_steps"]
    assert executed == planned
    assert [s["name"] for s in executed] == ["quantize", "compile", "compile", "bundle", "push", "bench", "bench", "eval", "eval", "gate", "store"]
    # the fp32 reference and the int8 variant each name the backend that ran them
    assert [s["variant"]["backend"] for s in executed if s["name"] == "bench"] == ["onnxruntime", "native"]


def test_truncated_plans():
    deploy = api.plan(DIGITS, target="local")
    assert [type(s) for s in deploy.steps] == [Quantize, Compile, Compile, WriteBundle, Push, Bench, Bench, Eval, Eval, Gate, Store]
    bundle = api.plan(DIGITS, target="local", goal="bundle")
    assert [type(s) for s in bundle.steps] == [Quantize, Compile, Compile, WriteBundle]
    quantize = api.plan(DIGITS, target="local", goal="quantize")
    assert [type(s) for s in quantize.steps] == [Quantize]
    float_only = api.plan(DIGITS, target="local", quantize=False)
    assert [s.variant.name for s in float_only.steps if isinstance(s, Bench)] == ["fp32"]
    assert not float_only.quantize and not any(isinstance(s, (Eval, Gate)) for s in float_only.steps)


def test_bench_runs_the_profiles_count_for_its_minimum_time_but_an_asked_count_exactly():
    def configs(**asks):
        return [s["config"] for s in api.plan(DIGITS, target="rpi5", **asks).to_dict()["steps"] if s["name"] == "bench"]

    assert {(c["iterations"], c["min_time_s"], c["duration_s"]) for c in configs()} == {(100, 0.5, None)}
    assert {(c["iterations"], c["min_time_s"]) for c in configs(iterations=7)} == {(7, 0.0)}  # exactly 7
    assert {(c["iterations"], c["min_time_s"]) for c in configs(iterations=7, min_time_s=2)} == {(7, 2.0)}
    assert {(c["min_time_s"], c["duration_s"]) for c in configs(duration_s=3, min_time_s=2)} == {(0.0, 3)}  # a duration is the window
    plan = api.plan(DIGITS, target="rpi5")
    assert "100 timed runs and at least 0.5 s" in next(s for s in plan.steps if s.name == "bench").detail


def test_plan_json_is_the_serialisation_of_the_steps():
    plan = api.plan(DIGITS, target="rpi5", iterations=7)
    doc = plan.to_dict()
    benches = [s for s in doc["steps"] if s["name"] == "bench"]
    assert [b["config"]["iterations"] for b in benches] == [7, 7]
    assert [v["name"] for v in doc["variants"]] == ["fp32", "int8"]
    assert doc["variants"][1]["backend"] == "native"


def test_api_quantize_writes_the_model(tmp_path):
    out = tmp_path / "digits.int8.onnx"
    result = api.quantize(DIGITS, out, target="local")
    assert out.is_file() and out.stat().st_size > 1000
    assert result.agreement.samples > 0


def test_unknown_option_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown option"):
        api.plan(DIGITS, tagret="local")


@pytest.mark.slow
def test_runs_measured_after_the_lock_was_lost_are_not_stored(tmp_path):
    import contextlib

    from edgekit.deploy import execute, open_job
    from edgekit.devices.lock import DeviceLock, LockLostError, break_lock, device_lock
    from edgekit.events import Events, QuietProgress
    from edgekit.transport.local import LocalTransport

    job = open_job(api.request(DIGITS, target="local", iterations=5, warmup=1, output=tmp_path / "b"))
    device = LocalTransport(tmp_path / "device")

    class Thief(Events):
        """Another job breaks the lock (as after our TTL ran out) while int8 is being timed."""

        @contextlib.contextmanager
        def progress(self, description, total=None):
            yield QuietProgress()
            if description.startswith("benchmarking int8"):
                break_lock(device)
                DeviceLock(device, owner="the other job", heartbeat=False).acquire()

    with pytest.raises(LockLostError), device_lock(device, heartbeat=False) as lock:
        execute(job.plan(), job, device, Thief(), lock=lock)
    with api.results() as store:
        assert store.list() == []


@pytest.mark.slow
def test_a_dynamic_batch_model_deploys_with_calib_data_and_no_shape(cli, tmp_path):
    import onnx

    model = onnx.load(str(DIGITS))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"  # a dynamic batch, as most exports have
    dyn = tmp_path / "dyn.onnx"
    onnx.save(model, str(dyn))
    calib = EXAMPLES / "digits" / "calib.npz"
    refused = cli("deploy", dyn, "--no-bench", "-o", tmp_path / "x")  # nothing says the shape
    assert refused.returncode == 3 and "has a dynamic shape [?,1,8,8]" in refused.stderr
    r = cli("deploy", dyn, "--calib", calib, "--iterations", "5", "--json", "-o", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["plan"]["inputs"] == [{"name": "input", "shape": [1, 1, 8, 8], "dtype": "float32"}]
    assert any("dynamic input shapes taken from the data (batch 1): input:1,1,8,8" in n for n in doc["plan"]["notes"])
    assert doc["summary"]["agreement"]["estimate"] is False and doc["summary"]["variants"]["int8"]["p50_ms"] > 0


def test_quantize_keeps_the_models_dynamic_batch(cli, tmp_path):
    # Calibrated at batch 1 (from the data), the int8 model still takes any batch: one file for
    # every batch size, as the float model was (--shape used to freeze it).
    import numpy as np
    import onnx

    from edgekit.quantize.report import session

    model = onnx.load(str(DIGITS))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    dyn = tmp_path / "dyn.onnx"
    onnx.save(model, str(dyn))
    out = tmp_path / "dyn.int8.onnx"
    r = cli("quantize", dyn, "--calib", EXAMPLES / "digits" / "calib.npz", "-o", out)
    assert r.returncode == 0, r.stderr
    assert "keeps the dynamic input dimensions (input:[N,1,8,8]); it was calibrated at input:1,1,8,8" in r.stderr
    q = onnx.load(str(out))
    assert q.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    x = np.load(EXAMPLES / "digits" / "heldout.npz")["input"][:5]
    run = session(str(out), reference=True)
    batch = run.run(None, {"input": x})[0]
    one_by_one = np.concatenate([run.run(None, {"input": x[i : i + 1]})[0] for i in range(5)])
    assert batch.shape == (5, 10) and np.allclose(batch, one_by_one, atol=1e-5)
    fixed = cli("quantize", DIGITS, "--calib", EXAMPLES / "digits" / "calib.npz", "-o", tmp_path / "fixed.onnx")
    assert fixed.returncode == 0 and "dynamic" not in fixed.stderr  # a static model: nothing to keep
