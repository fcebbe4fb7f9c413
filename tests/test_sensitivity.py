"""Per-layer sensitivity (``edgekit quantize --report``) on the real examples, and the quantizer on a
graph with an ``If`` whose branches read outer-scope tensors.

Numbers are pinned on the digits example only; MobileNetV2 is checked for "runs and sorts".
Everything int8 runs with Q/DQ reference semantics (ORT_DISABLE_ALL), never ORT's int8 kernels.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.modelio import load_model
from edgekit.quantize import (
    SCHEMES,
    ElementSample,
    FeedSet,
    analyze_model,
    collect_ranges,
    load_feeds,
    quantize_model,
    sensitivity,
)
from edgekit.quantize.report import session
from edgekit.quantize.rewrite import rewrite, tensor_params
from tests.builders import float_io, onnx_model
from tests.conftest import EXAMPLES

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
MNV2 = EXAMPLES / "mobilenetv2" / "mobilenetv2.onnx"
SCHEME = SCHEMES["onnxruntime"]
LAYER_KEYS = {"name", "op", "snr_db", "macs_share", "output_snr_db_alone", "output_cosine_alone", "output_snr_db_float", "output_snr_db_gain_float"}


def run(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    sess = session(model.SerializeToString(), reference=True)
    return [sess.run(None, f)[0] for f in feeds]


def data(path):
    loaded = load_model(path)
    side = loaded.sidecar
    return loaded, load_feeds(side.calibration, loaded.inputs), load_feeds(side.evaluation, loaded.inputs)


@pytest.fixture(scope="module")
def digits():
    loaded, cal, held = data(DIGITS)
    return loaded, cal, held, quantize_model(loaded, SCHEME, cal, held, method="minmax")  # the figures below are minmax's


def test_local_error_per_int8_node_matches_a_full_float_pass(digits):
    loaded, cal, _, result = digits
    int8 = [d.name for d in result.analysis.decisions if d.kind == "int8"]
    assert [x["name"] for x in result.layers] == int8 == ["conv1", "conv2", "conv3", "fc"]
    prepared, analysis = analyze_model(loaded, SCHEME)
    found = sensitivity.units(prepared, analysis)
    # The same figure from every value of every calibration sample, not the kept subsample.
    everything = ElementSample(1, per_tensor=1 << 40)
    collect_ranges(prepared, analysis.calibrated, cal.feeds, sample=everything)
    exact = sensitivity.local_snr(result.model, found, everything)
    for x in result.layers:
        assert 30 < x["snr_db"] < 60, x  # 8-bit minmax: about 6 dB a bit, less the ranges' slack
        assert abs(x["snr_db"] - exact[x["name"]]) < 0.5, (x, exact)


def test_keep_float_of_every_unit_is_the_float_model_and_of_none_the_int8_model(digits):
    loaded, _, held, result = digits
    prepared, analysis = analyze_model(loaded, SCHEME)
    found = sensitivity.units(prepared, analysis)
    feeds = held.feeds[:4]
    all_float = sensitivity.keep_float(result.model, prepared, found)
    assert not {n.op_type for n in all_float.graph.node} & {"QuantizeLinear", "DequantizeLinear"}
    onnx.checker.check_model(all_float)
    for a, b in zip(run(all_float, feeds), run(prepared, feeds)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(run(sensitivity.keep_float(result.model, prepared, []), feeds), run(result.model, feeds)):
        np.testing.assert_array_equal(a, b)
    # One node float: its weights are the float initializers again, the others stay int8.
    one = sensitivity.keep_float(result.model, prepared, [u for u in found if u.name == "conv2"])
    conv2 = next(n for n in one.graph.node if n.name == "conv2")
    inits = {t.name for t in one.graph.initializer}
    assert conv2.input[1] in inits and conv2.input[1] in {t.name for t in prepared.graph.initializer}
    fc = next(n for n in one.graph.node if n.name == "fc")
    assert fc.input[1] not in inits  # still read through its weight's DequantizeLinear


def test_a_node_with_a_crushed_range_ranks_first(digits):
    loaded, cal, held, _ = digits
    prepared, analysis = analyze_model(loaded, SCHEME)
    found = {u.name: u for u in sensitivity.units(prepared, analysis)}
    sample = ElementSample(len(cal.feeds))
    ranges = collect_ranges(prepared, analysis.calibrated, cal.feeds, sample=sample)
    victim = found["conv3"]  # the least harmful node when calibrated as usual
    lo, hi = ranges[victim.output]
    ranges[victim.output] = (lo * 0.05, hi * 0.05)  # clips 95 % of its range away
    qmodel = rewrite(prepared, analysis, tensor_params(analysis, ranges, SCHEME), SCHEME)
    local = sensitivity.local_snr(qmodel, list(found.values()), sample)
    s = sensitivity.measure(prepared, qmodel, analysis, held.feeds, local)
    first = s.layers[0]
    assert first["name"] == "conv3"
    assert first["snr_db"] == min(x["snr_db"] for x in s.layers) and first["snr_db"] < 20
    gains = [x["output_snr_db_gain_float"] for x in s.layers]
    assert gains == sorted(gains, reverse=True) and gains[0] > gains[1] + 10, gains
    assert first["output_snr_db_alone"] < min(x["output_snr_db_alone"] for x in s.layers[1:])
    assert s.samples == sensitivity.SAMPLES and s.output_snr_db < 20


def test_mobilenetv2_runs_and_sorts():
    loaded, cal, held = data(MNV2)
    result = quantize_model(loaded, SCHEME, cal, held)
    int8 = [d.name for d in result.analysis.decisions if d.kind == "int8"]
    assert sorted(x["name"] for x in result.layers) == sorted(int8)
    assert all(x["snr_db"] is not None and x["snr_db"] > 10 for x in result.layers)
    s = sensitivity.measure_result(loaded, result, held.feeds[:2])
    assert s.samples == 2 and len(s.layers) == len(int8) and not s.notes
    gains = [x["output_snr_db_gain_float"] for x in s.layers]
    assert gains == sorted(gains, reverse=True)
    shares = [x["macs_share"] for x in s.layers if x["op"] == "Conv"]
    assert all(v is not None for v in shares) and 0.9 < sum(shares) <= 1.0
    # Over the node budget: local errors only, worst first, and a note that says so.
    prepared, analysis = analyze_model(loaded, SCHEME)
    local = {x["name"]: x["snr_db"] for x in result.layers}
    small = sensitivity.measure(prepared, result.model, analysis, held.feeds, local, budget=10)
    assert small.samples == 0 and "more than 10" in small.notes[0]
    snrs = [x["snr_db"] for x in small.layers]
    assert snrs == sorted(snrs) and "output_snr_db_alone" not in small.layers[0]


# -- the CLI ------------------------------------------------------------------------------------


def test_quantize_report_json(cli, tmp_path):
    out = tmp_path / "q.onnx"
    r = cli("quantize", DIGITS, "-o", out, "--report", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    layers = doc["layers"]
    assert {x["name"] for x in layers} == {"conv1", "conv2", "conv3", "fc"}
    assert all(set(x) == LAYER_KEYS for x in layers), layers[0]
    gains = [x["output_snr_db_gain_float"] for x in layers]
    # most harmful first; the last layers' gains sit within noise of 0 (auto's ranges leave them little to gain)
    assert gains == sorted(gains, reverse=True) and gains[0] > 1 and all(g > -0.5 for g in gains)
    # Layers are named as the ONNX nodes of the written model (what ORT's profiler reports).
    nodes = {n.name: n.op_type for n in onnx.load(str(out)).graph.node}
    assert all(nodes[x["name"]] == x["op"] for x in layers)
    sens = doc["sensitivity"]
    assert sens["samples"] == 8 and sens["seconds"] > 0 and math.isfinite(sens["output_snr_db"]) and sens["notes"] == []


def test_quantize_report_table_and_plain_quantize_without_it(cli, tmp_path):
    r = cli("quantize", DIGITS, "-o", tmp_path / "q.onnx", "--report")
    assert r.returncode == 0, r.stderr
    assert "per-layer sensitivity, most harmful first (8 held-out samples" in r.stdout
    assert "gain kept float dB" in r.stdout and "conv2" in r.stdout
    plain = cli("quantize", DIGITS, "-o", tmp_path / "p.onnx", "--json")
    doc = json.loads(plain.stdout)
    assert "sensitivity" not in doc and set(doc["layers"][0]) == {"name", "op", "snr_db"}


def test_quantize_report_takes_no_value(cli, tmp_path):
    r = cli("quantize", DIGITS, "-o", tmp_path / "q.onnx", "--report", "full")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert not (tmp_path / "q.onnx").exists()


def test_deploy_stores_the_local_errors_on_the_int8_record(tmp_path):
    from edgekit import api
    from edgekit.bench.store import ResultsStore

    for _ in range(2):  # the second deploy takes the quantization from the cache
        result = api.deploy(DIGITS, target="local", iterations=5, warmup=1, output=tmp_path / "b")
    assert result.quantize.cached
    with ResultsStore() as store:
        records = [store.get(i) for i in result.run_ids]
    (int8,) = [r for r in records if r["agent"]["variant"] == "int8"]
    q = int8["quantization"]
    assert [x["name"] for x in q["layers"]] == ["conv1", "conv2", "conv3", "fc"]
    assert all(30 < x["snr_db"] < 60 for x in q["layers"]) and q["estimate"] is True and q["method"]
    assert all("quantization" not in r for r in records if r is not int8)


# -- control flow ---------------------------------------------------------------------------------


def if_model() -> onnx.ModelProto:
    """MatMul -> Relu whose output only an If's branches read; the If's condition comes from a
    second input, so nothing but the branches ties the If to the Relu."""
    rng = np.random.default_rng(0)
    then_g = helper.make_graph([helper.make_node("Identity", ["h"], ["t_out"])], "then", [], [float_io("t_out", [1, 8])])
    else_g = helper.make_graph([helper.make_node("Neg", ["h"], ["e_out"])], "else", [], [float_io("e_out", [1, 8])])
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["y"], name="mm1"),
        helper.make_node("Relu", ["y"], ["h"], name="relu"),
        helper.make_node("Greater", ["c", "zero"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["z"], name="branch", then_branch=then_g, else_branch=else_g),
        helper.make_node("MatMul", ["z", "W2"], ["out"], name="mm2"),
    ]
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 8)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 4)).astype(np.float32), "W2"),
        numpy_helper.from_array(np.array([0.0], np.float32), "zero"),
    ]
    inputs = [float_io("x", [1, 8]), helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])]
    model = onnx_model(nodes, inputs, [float_io("out", [1, 4])], inits, opset=13)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_if_branches_reading_outer_tensors_survive_quantization(tmp_path):
    path = tmp_path / "if.onnx"
    onnx.save(if_model(), str(path))
    loaded = load_model(path)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, 8)).astype(np.float32), "c": np.array([(-1.0) ** i], np.float32)} for i in range(40)]
    result = quantize_model(loaded, SCHEME, FeedSet(feeds[:32], "test"), FeedSet(feeds[32:], "test (held out)"))
    kinds = {d.name: d.kind for d in result.analysis.decisions}
    assert kinds == {"mm1": "int8", "relu": "fused", "gt": "float", "branch": "float", "mm2": "int8"}
    onnx.checker.check_model(result.model, full_check=True)
    order = [n.name for n in result.model.graph.node]
    assert order.index("relu") < order.index("branch")  # the If runs after what its branches read
    got = np.concatenate(run(result.model, feeds[32:]))
    want = np.concatenate([session(loaded.model.SerializeToString(), reference=True).run(None, f)[0] for f in feeds[32:]])
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()  # both branches taken: c alternates in sign
    (agree,) = result.agreement.outputs
    assert agree.cosine > 0.999
