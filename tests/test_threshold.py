"""Never broken in silence: every quantize checks the task's metric, fp32 vs int8 on held-out samples,
against its threshold; a miss prints one ``warning:`` line (metric, figure, threshold, worst
layers) and ``--strict`` exits 5 with nothing written.

One model per metric kind (a class vector: top-1; an embedding: cosine; a probability map: mask
IoU; CTC scores: character error rate), each quantized twice: calibrated on data like its
held-out data (must pass, no warning), and on the same data scaled x40 (every activation range 40x
too wide: int8 keeps ~6 of its 256 levels for the real values), which must warn, and fail --strict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgekit import api
from edgekit.errors import GateError, ModelError, UsageError
from edgekit.events import Events
from edgekit.modelio import load_model
from edgekit.quantize import SCHEMES, FeedSet, quantize_model, sensitivity, threshold
from tests.builders import Graph, float_io

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
BROKEN = 40.0  # the calibration data's scale in the broken runs


class Recorder(Events):
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def embedding_model() -> onnx.ModelProto:
    """x [1, 32] -> three MatMul+Relu -> a [1, 48] embedding (a vector, scored by cosine)."""
    g, r = Graph(), _rng(0)
    h = "x"
    for i, (a, b) in enumerate([(32, 64), (64, 64), (64, 48)]):
        h = g.node("MatMul", [h, g.const(f"W{i}", r.normal(0, 1 / np.sqrt(a), (a, b)))], f"mm{i}")
        if i < 2:
            h = g.node("Relu", [h], f"relu{i}")
    return g.model([float_io("x", [1, 32])], [float_io(h, [1, 48])])


def mask_model() -> onnx.ModelProto:
    """x [1, 1, 16, 16] -> Conv 3x3 (8) + Relu -> Conv 1x1 (1) -> Sigmoid: a probability map (mask IoU at 0.5)."""
    g, r = Graph(), _rng(1)
    h = g.node("Conv", ["x", g.const("W0", r.normal(0, 0.4, (8, 1, 3, 3))), g.const("B0", np.zeros(8))], "conv0", pads=[1, 1, 1, 1])
    h = g.node("Relu", [h], "relu0")
    h = g.node("Conv", [h, g.const("W1", r.normal(0, 0.5, (1, 8, 1, 1))), g.const("B1", [-0.3])], "conv1")
    h = g.node("Sigmoid", [h], "prob")
    return g.model([float_io("x", [1, 1, 16, 16])], [float_io(h, [1, 1, 16, 16])])


def ctc_model() -> onnx.ModelProto:
    """x [1, 24, 16] (time steps x features) -> MatMul+Relu -> MatMul -> Softmax over 12 symbols (0 = blank).
    The weights read back the symbol each step was made of (``ctc_data``): logits x A^T, split into
    their positive and negative halves through the Relu."""
    g, a = Graph(), _symbols()
    h = g.node("MatMul", ["x", g.const("W0", np.concatenate([a.T, -a.T], axis=1))], "mm0")
    h = g.node("Relu", [h], "relu0")
    h = g.node("MatMul", [h, g.const("W1", np.concatenate([np.eye(12), -np.eye(12)]))], "mm1")
    h = g.node("Softmax", [h], "probs", axis=-1)
    return g.model([float_io("x", [1, 24, 16])], [float_io(h, [1, 24, 12])])


def _symbols() -> np.ndarray:
    return _rng(2).normal(0, 1, (12, 16)).astype(np.float32)


def ctc_data(n: int, seed: int) -> np.ndarray:
    """[n, 24, 16]: each step a symbol's feature vector (a row of ``_symbols``) plus noise."""
    r = _rng(seed)
    return (_symbols()[r.integers(0, 12, (n, 24))] + r.normal(0, 0.5, (n, 24, 16))).astype(np.float32)


MODELS = {"cosine": (embedding_model, (1, 32)), "iou": (mask_model, (1, 1, 16, 16)), "ctc": (ctc_model, (1, 24, 16))}


def _data(shape: tuple[int, ...], n: int, seed: int) -> np.ndarray:
    if shape == MODELS["ctc"][1]:
        return ctc_data(n, seed)
    return _rng(seed).standard_normal((n, *shape[1:])).astype(np.float32)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """metric -> a folder with model.onnx, calib.npz, calib-x40.npz, held.npz."""
    out = {}
    for metric, (build, shape) in MODELS.items():
        root = tmp_path_factory.mktemp(metric)
        onnx.save(build(), str(root / "model.onnx"))
        cal = _data(shape, 48, 1)
        np.savez(root / "calib.npz", x=cal)
        np.savez(root / "calib-x40.npz", x=cal * BROKEN)
        np.savez(root / "held.npz", x=_data(shape, 24, 2))
        out[metric] = root
    return out


def _quantize(root: Path, calib: str, **kw):
    events = Recorder()
    result = api.quantize(root / "model.onnx", root / f"out-{calib}.onnx", events=events, calib=root / calib, eval=root / "held.npz", **kw)
    return result, events.warnings


@pytest.mark.parametrize("metric", sorted(MODELS))
def test_good_quantization_passes_without_a_warning(models, metric):
    result, warnings = _quantize(models[metric], "calib.npz", metric=metric)
    assert result.check is not None and result.check.metric == metric
    assert result.check.passed, result.check
    assert result.check.threshold == threshold.DEFAULTS[metric]
    assert not [w for w in warnings if "threshold" in w]


@pytest.mark.parametrize("metric", sorted(MODELS))
def test_broken_calibration_warns_once_and_strict_exits_5(models, metric):
    root = models[metric]
    result, warnings = _quantize(root, "calib-x40.npz", metric=metric)
    c = result.check
    assert c is not None and not c.passed, c
    misses = [w for w in warnings if "misses" in w]
    assert len(misses) == 1, warnings
    line = misses[0]
    assert f"the {metric} threshold" in line and f"{c.value:.4g}" in line and f"{threshold.DEFAULTS[metric]:g}" in line
    assert c.worst_layers and all(x["name"] in line for x in c.worst_layers)
    out = root / "strict.onnx"
    with pytest.raises(GateError) as exc:
        api.quantize(root / "model.onnx", out, calib=root / "calib-x40.npz", eval=root / "held.npz", metric=metric, strict=True)
    assert exc.value.exit_code == 5 and "--strict" in exc.value.message and exc.value.hint
    assert not out.exists()


def test_the_figure_is_the_metric_of_the_outputs(models):
    """The ctc figure is the CER increase of int8's greedy decodes against float's: recomputed here."""
    from edgekit.quantize.mixed import ctc_greedy, edit_distance
    from edgekit.quantize.report import outputs

    root = models["ctc"]
    result, _ = _quantize(root, "calib-x40.npz", metric="ctc")
    feeds = [{"x": x[None]} for x in np.load(root / "held.npz")["x"]]
    ref = np.concatenate(outputs((root / "model.onnx").read_bytes(), False, feeds)["probs"])
    q = np.concatenate(outputs(result.model.SerializeToString(), True, feeds)["probs"])
    want, got = ctc_greedy(ref), ctc_greedy(q)
    cer = 100 * sum(edit_distance(a, b) for a, b in zip(want, got)) / sum(len(a) for a in want)
    assert result.check.value == pytest.approx(cer, abs=1e-4)
    assert result.check.value > 1.0


def test_top1_disagreements_are_counted_and_near_ties_named():
    """Where fp32's own two best classes are within NEAR_TIE in probability, a flip is int8 noise
    deciding a coin toss: the line says how many of the disagreements are such, logits or
    probabilities alike."""
    sure, tie = np.log([0.9, 0.05, 0.05]), np.log([0.40, 0.38, 0.22])  # margins 0.85 and 0.02
    ref = [np.stack([sure, tie, tie, sure])]
    q = [np.stack([tie[[1, 0, 2]], tie[[1, 0, 2]], tie, sure])]  # flips one sure and one tied sample
    assert threshold.near_ties(ref, q) == (2, 1)
    assert threshold.near_ties([np.exp(ref[0])], q) == (2, 1)  # already probabilities: the same
    assert threshold.near_ties([np.zeros((4, 3, 5))], [np.zeros((4, 3, 5))]) is None  # no class vector
    c = threshold.check({"p": list(ref[0][:, None])}, {"p": list(q[0][:, None])}, metric="top1", threshold=None)
    assert (c.value, c.passed, c.disagreements, c.near_ties) == (50.0, False, 2, 1)
    assert "1 of its 2 disagreements are near-ties (fp32's own top two within 0.05 probability)" in c.line()
    assert threshold.Check.from_dict(c.to_dict()) == c
    cos = threshold.check({"p": list(ref[0][:, None])}, {"p": list(q[0][:, None])}, metric="cosine", threshold=None)
    assert cos.disagreements is None and "near-ties" not in cos.line()


def test_threshold_flag_moves_the_goal(models):
    root = models["cosine"]
    broken, _ = _quantize(root, "calib-x40.npz", metric="cosine")
    lenient, warnings = _quantize(root, "calib-x40.npz", metric="cosine", threshold=broken.check.value - 0.01)
    assert lenient.check.passed and not [w for w in warnings if "misses" in w]
    strict, _ = _quantize(root, "calib.npz", metric="cosine", threshold=1.0)
    assert strict.check.value < 1.0 and not strict.check.passed


def test_sidecar_names_the_metric_and_threshold(models):
    root = models["iou"]
    (root / "model.edgekit.toml").write_text('[accuracy]\nmetric = "iou"\nthreshold = 0.5\n')
    try:
        result, warnings = _quantize(root, "calib-x40.npz")
        assert result.check.metric == "iou" and result.check.threshold == 0.5 and "model.edgekit.toml" in result.check.why
        assert result.check.passed == (result.check.value >= 0.5)
        result, _ = _quantize(root, "calib-x40.npz", threshold=0.99)  # the flag over the sidecar's, for its metric
        assert result.check.threshold == 0.99 and not result.check.passed
    finally:
        (root / "model.edgekit.toml").unlink()


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ('[accuracy]\nmetric = "iou"\nthreshold = 1.5\n', "outside iou's range"),
        ('[accuracy]\nmetric = "f1"\n', "unknown metric"),
        ('[accuracy]\nthreshold = 0.9\n', "no metric was named"),
        ('[accuracy]\nmetric = "iou"\ngoal = 0.9\n', "accuracy.goal: unknown key 'goal'"),
        ('[accuracy]\nmetric = "iou"\nthreshold = "high"\n', "must be a number"),
    ],
)
def test_bad_sidecar_accuracy_is_refused(tmp_path, models, toml, words):
    model = tmp_path / "m.onnx"
    model.write_bytes((models["iou"] / "model.onnx").read_bytes())
    (tmp_path / "m.edgekit.toml").write_text(toml)
    with pytest.raises(ModelError) as exc:
        api.quantize(model, tmp_path / "o.onnx", calib=models["iou"] / "calib.npz")
    assert words in exc.value.message and "m.edgekit.toml" in exc.value.message and exc.value.hint
    assert exc.value.exit_code == 3 and not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize(
    ("kw", "words"),
    [({"threshold": 0.9}, "no metric was named"), ({"metric": "top1", "threshold": 101.0}, "outside top1's range"), ({"metric": "f1"}, "unknown metric")],
)
def test_bad_threshold_flags_are_usage_errors(models, tmp_path, kw, words):
    root = models["cosine"]
    with pytest.raises(UsageError) as exc:
        api.quantize(root / "model.onnx", tmp_path / "o.onnx", calib=root / "calib.npz", **kw)
    assert words in exc.value.message and exc.value.hint
    assert not (tmp_path / "o.onnx").exists()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=_env())


def _env() -> dict:
    import os

    return {**os.environ, "CI": "1", "PYTHONPATH": str(ROOT)}


def test_cli_digits_top1_broken_calibration_warns_and_strict_exits_5(tmp_path):
    """The real digits CNN, calibrated on its own data x40: 96 % top-1 agreement on its 360 held-out digits."""
    with np.load(DIGITS / "calib.npz") as z:
        np.savez(tmp_path / "calib-x40.npz", **{k: z[k] * BROKEN for k in z.files})
    args = ("quantize", str(DIGITS / "digits_cnn.onnx"), "--calib", str(tmp_path / "calib-x40.npz"))
    r = _cli(*args, "-o", "warn.onnx", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    warnings = [x for x in r.stderr.splitlines() if x.startswith("warning:")]
    assert len(warnings) == 1 and "top1 threshold" in warnings[0] and "< 99" in warnings[0] and "lowest local SNR" in warnings[0], r.stderr
    doc = json.loads(r.stdout)
    assert doc["check"]["passed"] is False and doc["check"]["value"] < 99
    r = _cli(*args, "-o", "strict.onnx", "--strict", cwd=tmp_path)
    assert r.returncode == 5, r.stderr
    lines = r.stderr.splitlines()
    assert sum(x.startswith("warning:") for x in lines) == 1
    assert sum(x.startswith("error:") for x in lines) == 1 and sum(x.startswith("hint:") for x in lines) == 1
    assert not (tmp_path / "strict.onnx").exists()
    r = _cli("quantize", str(DIGITS / "digits_cnn.onnx"), "-o", "good.onnx", "--strict", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "warning:" not in r.stderr and "check, held-out top1" in r.stdout and ": holds" in r.stdout


def test_int8_share_counts_a_float_lstm_as_float(tmp_path):
    """A Conv (int8) feeding an LSTM (no int8 rule: float): the MACs share is the Conv's, not 100 %."""
    g, r = Graph(), _rng(3)
    h = g.node("Conv", ["x", g.const("W", r.normal(0, 0.3, (8, 8, 1, 1))), g.const("B", np.zeros(8))], "conv")
    h = g.node("Reshape", [h, g.const("s", [8, 1, 8], np.int64)], "seq")  # [steps 8, batch 1, features 8]
    hidden = 16
    lstm = g.node(
        "LSTM", [h, g.const("LW", r.normal(0, 0.3, (1, 4 * hidden, 8))), g.const("LR", r.normal(0, 0.3, (1, 4 * hidden, hidden)))],
        "lstm", outs=["Y", "Yh"], hidden_size=hidden,
    )
    model = g.model([float_io("x", [1, 8, 8, 1])], [float_io(lstm[1], [1, 1, hidden])])
    macs = sensitivity.macs(onnx.shape_inference.infer_shapes(model))
    assert macs["lstm"] == 8 * 1 * 1 * 4 * hidden * (8 + hidden) and macs["conv"] == 8 * 8 * 8
    onnx.save(model, str(tmp_path / "lstm.onnx"))
    feeds = [{"x": r.standard_normal((1, 8, 8, 1)).astype(np.float32)} for _ in range(6)]
    result = quantize_model(load_model(tmp_path / "lstm.onnx"), SCHEMES["onnxruntime"], FeedSet(feeds[:4], "cal"), FeedSet(feeds[4:], "held"))
    assert "lstm" in {d.name for d in result.analysis.float_nodes}
    assert result.int8_mac_share == pytest.approx(macs["conv"] / (macs["conv"] + macs["lstm"]), abs=1e-4)


def test_ci_is_strict_by_default_and_checks_its_accuracy_keys(tmp_path):
    from edgekit.ci.config import ConfigError, load_config

    model = f'path = "{DIGITS / "digits_cnn.onnx"}"\ntargets = ["local"]\n'
    (tmp_path / "a.toml").write_text(f"[[models]]\n{model}\n[[models]]\n{model}name = \"lenient\"\nstrict = false\nmetric = \"cosine\"\nthreshold = 0.95\n")
    specs = load_config(tmp_path / "a.toml").models
    assert specs[0].options["strict"] is True and "metric" not in specs[0].options
    assert specs[1].options["strict"] is False and specs[1].options["metric"] == "cosine" and specs[1].options["threshold"] == 0.95
    for bad, words in (('metric = "cosine"\nthreshold = 2\n', "outside cosine's range"), ('metric = "f1"\n', "unknown metric"), ("strict = 1\n", "strict")):
        (tmp_path / "b.toml").write_text(f"[[models]]\n{model}{bad}")
        with pytest.raises(ConfigError) as exc:
            load_config(tmp_path / "b.toml")
        assert words in exc.value.message and exc.value.hint


def test_random_held_out_data_is_not_checked(models):
    root = models["cosine"]
    result = api.quantize(root / "model.onnx", root / "random.onnx", metric="cosine", threshold=1.0)  # no --calib: random samples
    assert result.calibration_random and result.check is None
