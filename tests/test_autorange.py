"""``--method auto`` chooses each activation range by the error at the model's outputs (quantize.autorange):
minmax is always a candidate, so on the calibration samples it judges on, auto never errs more
than minmax; a range whose clipped tail the next layers read keeps minmax's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from edgekit.modelio import load_model
from edgekit.quantize import SCHEMES, FeedSet, autorange, quantize_model
from edgekit.quantize.report import outputs
from tests.builders import Graph, float_io
from tests.test_threshold import MODELS, _data

SCHEME = SCHEMES["onnxruntime"]


def _error(float_model: onnx.ModelProto, qmodel: onnx.ModelProto, feeds) -> float:
    """noise power / signal power at the outputs, summed over outputs, on ``feeds``."""
    ref = outputs(float_model.SerializeToString(), False, feeds)
    got = outputs(qmodel.SerializeToString(), True, feeds)
    err = 0.0
    for name in ref:
        r, q = (np.concatenate([np.asarray(a, np.float64).reshape(1, -1) for a in x[name]]) for x in (ref, got))
        err += float(np.square(r - q).sum() / np.square(r).sum())
    return err


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_auto_never_errs_more_than_minmax_at_the_outputs_on_its_calibration_samples(tmp_path, kind):
    build, shape = MODELS[kind]
    onnx.save(build(), str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    cal = [{"x": x[None]} for x in _data(shape, 24, 1)]
    held = FeedSet([{"x": x[None]} for x in _data(shape, 4, 2)], "held")
    auto = quantize_model(loaded, SCHEME, FeedSet(cal, "cal"), held, method="auto")
    mm = quantize_model(loaded, SCHEME, FeedSet(cal, "cal"), held, method="minmax")
    rec = auto.auto_ranges
    judged = cal[: rec["samples"]]  # (a tiny model: up to SMALL_SAMPLES of them)
    assert rec["samples"] == autorange.SMALL_SAMPLES
    assert _error(loaded.model, auto.model, judged) <= _error(loaded.model, mm.model, judged) * (1 + 1e-6)
    assert rec["trials"] >= 1 and rec["error"] <= rec["error_minmax"]


def spiky_model() -> onnx.ModelProto:
    """x [1, 256] -> Relu -> h -> MatMul (every row 1) -> y [1, 8]: y sums all of h, so the one
    large value of h per sample carries most of the output."""
    g = Graph()
    h = g.node("Relu", ["x"], "h")
    y = g.node("MatMul", [h, g.const("W", np.full((256, 8), 1.0))], "y")
    return g.model([float_io("x", [1, 256])], [float_io(y, [1, 8])])


def _spiky_feeds(n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(n):
        x = rng.standard_normal((1, 256)).astype(np.float32)
        x[0, rng.integers(0, 256)] = 60.0
        feeds.append({"x": x})
    return feeds


def _chosen(candidates):
    model = spiky_model()
    from edgekit.quantize.prepare import prepare
    from edgekit.quantize.rewrite import analyze
    from edgekit.tensorspec import IOSpec

    prepared = prepare(model, (IOSpec("x", (1, 256), "float32"),), SCHEME.min_opset)
    analysis = analyze(prepared, SCHEME, ())
    return autorange.choose(prepared, analysis, SCHEME, candidates, _spiky_feeds(8))


def test_a_clipped_tail_that_the_outputs_read_keeps_minmax():
    """h's values: a bulk below 4 and one 60 per sample; clipping h at 4 (what a per-tensor
    criterion picks when the tail is rare enough) wipes out most of y."""
    ranges, record = _chosen({"x": {"minmax": (-4.0, 60.0)}, "h": {"minmax": (0.0, 60.0), "mse": (0.0, 4.0), "histogram": (0.0, 4.0), "percentile": (0.0, 4.0)}, "y": {"minmax": (0.0, 400.0)}})
    assert ranges["h"] == (0.0, 60.0) and record["chosen"] == {}
    assert record["trials"] >= 3 and record["error"] == record["error_minmax"]


def test_a_range_wider_than_any_value_is_narrowed():
    """minmax of a run that saw a freak value (h up to 6000): the outputs err less with h's range
    at the 60 every sample reaches, and auto takes it."""
    ranges, record = _chosen({"x": {"minmax": (-4.0, 60.0)}, "h": {"minmax": (0.0, 6000.0), "mse": (0.0, 60.0), "histogram": (0.0, 60.0), "percentile": (0.0, 60.0)}, "y": {"minmax": (0.0, 400.0)}})
    assert ranges["h"] == (0.0, 60.0) and set(record["chosen"]) == {"h"}
    assert record["error"] < record["error_minmax"] / 10


def test_a_graph_output_keeps_its_minmax_range():
    ranges, record = _chosen({"x": {"minmax": (-4.0, 60.0)}, "h": {"minmax": (0.0, 60.0)}, "y": {"minmax": (0.0, 500.0), "mse": (0.0, 100.0), "histogram": (0.0, 100.0)}})
    assert ranges["y"] == (0.0, 500.0) and record["movable"] == 0


def _setup(kind: str, n: int = 24):
    """A built model of ``kind`` prepared and analysed, its candidates from an auto calibration, and its feeds."""
    from edgekit.quantize.calib import collect_ranges
    from edgekit.quantize.prepare import prepare
    from edgekit.quantize.rewrite import analyze
    from edgekit.tensorspec import IOSpec

    build, shape = MODELS[kind]
    prepared = prepare(build(), (IOSpec("x", shape, "float32"),), SCHEME.min_opset)
    analysis = analyze(prepared, SCHEME, ())
    feeds = [{"x": x[None]} for x in _data(shape, n, 1)]
    candidates: dict = {}
    collect_ranges(prepared, analysis.calibrated, feeds, method="auto", candidates=candidates)
    return prepared, analysis, candidates, feeds


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_trial_models_folded_weights_compute_what_their_dequantize_nodes_do(kind):
    """A trial runs with the constant DQs (weights, biases) folded into float initializers: the
    outputs are the unfolded Q/DQ model's, bit for bit."""
    from edgekit.quantize.report import session
    from edgekit.quantize.rewrite import rewrite, tensor_params

    prepared, analysis, candidates, feeds = _setup(kind, 4)
    qmodel = rewrite(prepared, analysis, tensor_params(analysis, {t: c["mse"] if "mse" in c else c["minmax"] for t, c in candidates.items()}, SCHEME), SCHEME)
    folded = autorange.fold_constant_dq(qmodel)
    assert sum(n.op_type == "DequantizeLinear" for n in folded.graph.node) < sum(n.op_type == "DequantizeLinear" for n in qmodel.graph.node)
    a, b = (session(m.SerializeToString(), reference=True) for m in (qmodel, folded))
    for feed in feeds:
        for x, y in zip(a.run(None, feed), b.run(None, feed)):
            assert np.array_equal(x, y)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_trials_stopped_early_and_remembered_choose_what_full_trials_choose(kind, monkeypatch):
    """A trial stops once its error passes the best so far, and an assignment judged before is
    not run again: the ranges, errors and trial count are those of running every trial in full."""
    prepared, analysis, candidates, feeds = _setup(kind)
    fast = autorange.choose(prepared, analysis, SCHEME, candidates, feeds)

    def full(self, ranges, below=np.inf):
        self.runs += 1
        return self._error(self._inputs(ranges), np.inf)

    monkeypatch.setattr(autorange._Trial, "error", full)
    slow = autorange.choose(prepared, analysis, SCHEME, candidates, feeds)
    assert fast == slow


def test_how_many_samples_judge_a_trial_depends_on_the_model_not_on_the_machine(monkeypatch):
    """A model of at most SMALL_MODEL_MACS is judged on up to SMALL_SAMPLES samples, a larger one on
    SAMPLES, however fast this host runs it (by time, ppocr-rec was judged on 16 samples on a quiet
    VM and on 4 on a busy one, with other ranges chosen)."""
    model = onnx.shape_inference.infer_shapes(spiky_model())  # 256 x 8 MACs (choose gets a prepared model: shapes known)
    feeds = _spiky_feeds(20)
    assert len(autorange._References(model, feeds).feeds) == autorange.SMALL_SAMPLES
    monkeypatch.setattr(autorange, "SMALL_MODEL_MACS", 256 * 8 - 1)
    assert len(autorange._References(model, feeds).feeds) == autorange.SAMPLES
