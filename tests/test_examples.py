"""The committed example models and data, and the real PP-OCR models from the rapidocr wheel."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from realmodels import (
    CLS_SHAPE,
    REC_SHAPE,
    cls_dataset,
    cls_samples,
    det_samples,
    find_rapidocr_model,
    rapidocr_model,
    rec_samples,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
DIGITS = REPO / "examples" / "digits"
MNV2 = REPO / "examples" / "mobilenetv2"
MB = 1_000_000


def session(path: Path | str) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def sidecar(model: Path) -> dict:
    return tomllib.loads(model.with_name(model.stem + ".edgekit.toml").read_text())


def input_shape(model: onnx.ModelProto, name: str) -> list[int | str]:
    (inp,) = [i for i in model.graph.input if i.name == name]
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in inp.type.tensor_type.shape.dim]


def accuracy(model: Path, x: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy, one sample per run: both models take batch 1."""
    sess = session(model)
    logits = np.concatenate([sess.run(["logits"], {"input": x[i:i + 1]})[0] for i in range(len(x))])
    return float((logits.argmax(1) == labels).mean())


def readme_accuracy(readme: Path) -> float:
    m = re.search(r"fp32 held-out accuracy: ([\d.]+)%", readme.read_text())
    assert m, f"{readme} states no 'fp32 held-out accuracy: N%'"
    return float(m.group(1)) / 100


# --- the committed examples -------------------------------------------------------------------


@pytest.mark.parametrize(("folder", "stem"), [(DIGITS, "digits_cnn"), (MNV2, "mobilenetv2")])
def test_example_model_is_valid_opset13_with_batchnorm(folder: Path, stem: str):
    path = folder / f"{stem}.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 13)]
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["logits"]
    ops = [n.op_type for n in model.graph.node]
    # Left unfolded on purpose: folding BN is the quantizer's job.
    assert "BatchNormalization" in ops
    assert ops[-1] == "Gemm"


@pytest.mark.parametrize(
    ("folder", "stem", "n_calib", "n_heldout"),
    [(DIGITS, "digits_cnn", 200, 360), (MNV2, "mobilenetv2", 64, 100)],
)
def test_sidecar_data_matches_model_inputs(folder: Path, stem: str, n_calib: int, n_heldout: int):
    model_path = folder / f"{stem}.onnx"
    model = onnx.load(str(model_path))
    meta = sidecar(model_path)
    declared = meta.get("inputs", {}).get("input", {}).get("shape")
    shape = input_shape(model, "input")
    if declared is not None:  # a dynamic input: the sidecar shape fills exactly the free dims
        assert len(declared) == len(shape)
        assert all(d == s for d, s in zip(declared, shape, strict=True) if isinstance(s, int))
        shape = declared
    assert all(isinstance(d, int) for d in shape), f"{stem}: input shape {shape} unresolved"

    calib = np.load(folder / meta["calibration"]["data"])
    heldout = np.load(folder / meta["evaluation"]["data"])
    labels = np.load(folder / meta["evaluation"]["labels"])
    for data, n in ((calib, n_calib), (heldout, n_heldout)):
        assert list(data.keys()) == ["input"]
        assert data["input"].dtype == np.float32
        assert data["input"].shape == (n, *shape[1:])
        assert np.isfinite(data["input"]).all()
    assert labels.dtype == np.int64 and labels.shape == (n_heldout,)
    assert set(np.unique(labels)) == set(range(10))
    # The held-out set was never trained on, and calibration comes from training: no overlap.
    seen = {row.tobytes() for row in calib["input"]}
    assert not any(row.tobytes() in seen for row in heldout["input"])


def test_digits_reaches_97_percent_on_heldout():
    heldout = np.load(DIGITS / "heldout.npz")["input"]
    labels = np.load(DIGITS / "heldout_labels.npy")
    acc = accuracy(DIGITS / "digits_cnn.onnx", heldout, labels)
    assert acc >= 0.97, acc
    assert abs(acc - readme_accuracy(DIGITS / "README.md")) <= 0.01


def test_digits_graph_is_the_documented_cnn():
    model = onnx.load(str(DIGITS / "digits_cnn.onnx"))
    assert [n.op_type for n in model.graph.node] == [
        "Conv", "BatchNormalization", "Relu", "Conv", "BatchNormalization", "Relu",
        "MaxPool", "Conv", "Relu", "Flatten", "Gemm",
    ]
    assert input_shape(model, "input") == [1, 1, 8, 8]
    # Trained BN statistics, not the init values (mean 0, var 1): folding must have work to do.
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert not np.allclose(inits["bn1.running_mean"], 0)
    assert not np.allclose(inits["bn1.running_var"], 1)


def test_mobilenetv2_structure():
    model = onnx.load(str(MNV2 / "mobilenetv2.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    assert input_shape(model, "input") == [1, 3, "height", "width"]

    def group(n: onnx.NodeProto) -> int:
        return next((a.i for a in n.attribute if a.name == "group"), 1)

    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    depthwise = [n for n in convs if group(n) > 1]
    assert len(depthwise) == 17  # one per inverted-residual block
    for n in depthwise:
        w = inits[n.input[1]]
        assert w.shape[1] == 1 and group(n) == w.shape[0], n.name  # group == channels

    clips = [n for n in model.graph.node if n.op_type == "Clip"]
    assert len(clips) == 35
    for n in clips:
        assert (float(inits[n.input[1]]), float(inits[n.input[2]])) == (0.0, 6.0)

    adds = [n for n in model.graph.node if n.op_type == "Add"]
    assert len(adds) == 11  # at width 0.25 the first block (8 -> 8 channels, stride 1) has one too
    for n in adds:  # residual: a block's linear projection added to the block's input
        assert all(i in producer for i in n.input)
        src, proj = (producer[i].op_type for i in n.input)
        assert proj == "BatchNormalization" and src in {"BatchNormalization", "Add", "Clip"}, n.name
    # only the first block's input is a ReLU6 output (the stem's): later blocks start after a projection
    assert sum(producer[n.input[0]].op_type == "Clip" for n in adds) == 1

    ops = [n.op_type for n in model.graph.node]
    assert ops.count("BatchNormalization") == len(convs) == 52
    assert "GlobalAveragePool" in ops
    # a model the project trained itself, small enough to keep in git
    assert (MNV2 / "mobilenetv2.onnx").stat().st_size <= 0.75 * MB


def test_mobilenetv2_data_is_small_float32():
    total = sum((MNV2 / f).stat().st_size for f in ("calib.npz", "heldout.npz", "heldout_labels.npy"))
    assert total <= 0.65 * MB


def test_mobilenetv2_accuracy_is_what_readme_says():
    heldout = np.load(MNV2 / "heldout.npz")["input"]
    labels = np.load(MNV2 / "heldout_labels.npy")
    acc = accuracy(MNV2 / "mobilenetv2.onnx", heldout, labels)
    assert acc >= 0.97, acc  # small, but a real classifier
    assert abs(acc - readme_accuracy(MNV2 / "README.md")) <= 0.01, acc


def test_mobilenetv2_runs_at_224():
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)
    (logits,) = session(MNV2 / "mobilenetv2.onnx").run(["logits"], {"input": x})
    assert logits.shape == (1, 10) and np.isfinite(logits).all()


# --- real PP-OCR models from the rapidocr-onnxruntime wheel -------------------------------------


def test_missing_wheel_says_how_to_install():
    with pytest.raises(LookupError, match=r"pip install --no-deps no-such-ocr-wheel"):
        find_rapidocr_model("cls", dist="no-such-ocr-wheel")
    with pytest.raises(ValueError, match="unknown model kind"):
        find_rapidocr_model("seg")  # type: ignore[arg-type]


@pytest.mark.realmodels
@pytest.mark.parametrize("kind", ["cls", "det", "rec"])
def test_rapidocr_model_is_found_in_the_wheel(kind: str):
    path = rapidocr_model(kind)
    assert path.parent.name == "models" and path.parent.parent.name == "rapidocr_onnxruntime"
    onnx.checker.check_model(str(path))


@pytest.mark.realmodels
def test_cls_runs_on_real_samples_and_reads_direction():
    x, labels = cls_dataset(48, seed=0)
    assert x.shape == (48, *CLS_SHAPE) and x.dtype == np.float32
    assert x.min() >= -1 and x.max() <= 1
    assert 0 < labels.sum() < len(labels)  # both directions present
    (probs,) = session(rapidocr_model("cls")).run(None, {"x": x})
    assert probs.shape == (48, 2)
    np.testing.assert_allclose(probs.sum(1), 1, atol=1e-5)
    # Preprocessed the way the model expects, it tells upright from turned text.
    assert (probs.argmax(1) == labels).mean() >= 0.9


@pytest.mark.realmodels
def test_det_runs_on_real_samples_and_finds_the_text():
    x = det_samples(2, seed=0, size=(320, 352))
    assert x.shape == (2, 3, 320, 352) and x.dtype == np.float32
    (prob,) = session(rapidocr_model("det")).run(None, {"x": x})
    assert prob.shape == (2, 1, 320, 352)
    assert prob.min() >= 0 and prob.max() <= 1
    text = (prob > 0.3).mean(axis=(1, 2, 3))  # DBNet's binarization threshold in RapidOCR
    assert ((text > 0.001) & (text < 0.5)).all(), text


@pytest.mark.realmodels
def test_rec_runs_on_real_samples():
    x = rec_samples(3, seed=0)
    assert x.shape == (3, *REC_SHAPE) and x.dtype == np.float32
    (probs,) = session(rapidocr_model("rec")).run(None, {"x": x})
    assert probs.shape[0] == 3 and probs.shape[2] == 6625
    np.testing.assert_allclose(probs.sum(2), 1, atol=1e-4)
    assert (probs.argmax(2) != 0).any(axis=1).all()  # every line reads as some characters, not all blank


def test_samples_are_deterministic_per_seed():
    assert np.array_equal(cls_samples(3, seed=5), cls_samples(3, seed=5))
    assert not np.array_equal(cls_samples(3, seed=5), cls_samples(3, seed=6))
    assert np.array_equal(det_samples(1, seed=2), det_samples(1, seed=2))


def test_text_lines_are_zero_padded_on_the_right():
    x = rec_samples(8, seed=0)
    # Lines are at most 320/48 wide per unit of height; short ones leave a zero tail, as in RapidOCR.
    padded = [(row[:, :, -1] == 0).all() for row in x]
    assert any(padded)
    assert all((row[:, :, 0] != 0).any() for row in x)


@pytest.mark.parametrize("size", [(320, 300), (0, 320), (-32, 320)])
def test_det_size_must_be_multiple_of_32(size: tuple[int, int]):
    with pytest.raises(ValueError, match="multiples of 32"):
        det_samples(1, seed=0, size=size)


@pytest.mark.realmodels
def test_make_data_writes_quantize_ready_files(tmp_path: Path):
    script = REPO / "examples" / "real" / "make_data.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--kind", "cls"],
        capture_output=True, text=True, timeout=120,
    )
    if proc.returncode != 0 and "not installed" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    model = tmp_path / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    assert model.read_bytes() == rapidocr_model("cls").read_bytes()
    meta = sidecar(model)
    shape = meta["inputs"]["x"]["shape"]
    assert shape == [1, *CLS_SHAPE]
    calib = np.load(tmp_path / meta["calibration"]["data"])["x"]
    heldout = np.load(tmp_path / meta["evaluation"]["data"])["x"]
    labels = np.load(tmp_path / meta["evaluation"]["labels"])
    assert calib.shape == (200, *shape[1:]) and heldout.shape == (100, *shape[1:])
    assert calib.dtype == heldout.dtype == np.float32
    assert labels.shape == (100,) and labels.dtype == np.int64
    assert not np.array_equal(calib[:100], heldout)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [model.name, model.stem + ".edgekit.toml", "cls_calib.npz", "cls_heldout.npz", "cls_heldout_labels.npy"]
    )


def test_make_data_refuses_unwritable_dir(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "real" / "make_data.py"), str(blocker / "out"), "--kind", "cls"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: cannot write to") and lines[1].startswith("hint: ")
    assert "Traceback" not in proc.stderr
