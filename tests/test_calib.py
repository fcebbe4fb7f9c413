"""Calibration: reading feeds (every format, every bad input), preprocessing, ranges, splits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from edgekit.errors import CalibrationError, UsageError
from edgekit.modelio import IOSpec
from edgekit.quantize.calib import (
    FeedSet,
    Preprocess,
    collect_ranges,
    kl_threshold,
    load_feeds,
    random_feeds,
)

REPO = Path(__file__).resolve().parents[1]
DIGITS = REPO / "examples" / "digits"
IMG = (IOSpec("input", (1, 1, 8, 8), "float32"),)
TWO = (IOSpec("image", (1, 3, 4, 4), "float32"), IOSpec("mask", (1, 4), "int64"))


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def calib_error(needle: str, fn, *args, **kwargs) -> CalibrationError:
    with pytest.raises(CalibrationError) as exc:
        fn(*args, **kwargs)
    assert needle in exc.value.message, exc.value.message
    assert exc.value.hint, "every CalibrationError carries a hint"
    return exc.value


# -- formats -------------------------------------------------------------------------------------


def test_stacked_npz_the_digits_example():
    fs = load_feeds(DIGITS / "calib.npz", IMG)
    data = np.load(DIGITS / "calib.npz")["input"]
    assert len(fs.feeds) == 200 == data.shape[0]
    assert fs.source == str(DIGITS / "calib.npz") and not fs.random and fs.labels is None
    for i in (0, 57, 199):
        assert list(fs.feeds[i]) == ["input"]
        assert fs.feeds[i]["input"].shape == (1, 1, 8, 8) and fs.feeds[i]["input"].dtype == np.float32
        np.testing.assert_array_equal(fs.feeds[i]["input"][0], data[i])


def test_stacked_npz_with_labels():
    fs = load_feeds(DIGITS / "heldout.npz", IMG, labels=DIGITS / "heldout_labels.npy")
    assert len(fs.feeds) == 360
    assert fs.labels.dtype == np.int64 and fs.labels.tolist() == np.load(DIGITS / "heldout_labels.npy").tolist()


def test_npy(tmp_path):
    data = rand((5, 1, 8, 8))
    np.save(tmp_path / "x.npy", data)
    fs = load_feeds(tmp_path / "x.npy", IMG)
    assert len(fs.feeds) == 5
    np.testing.assert_array_equal(np.concatenate([f["input"] for f in fs.feeds]), data)


def test_float64_data_is_converted_to_the_input_dtype(tmp_path):
    np.save(tmp_path / "x.npy", rand((3, 1, 8, 8)).astype(np.float64))
    fs = load_feeds(tmp_path / "x.npy", IMG)
    assert {f["input"].dtype for f in fs.feeds} == {np.dtype(np.float32)}


def test_stacked_with_batch_two(tmp_path):
    spec = (IOSpec("input", (2, 1, 8, 8), "float32"),)
    data = rand((6, 1, 8, 8))
    np.savez(tmp_path / "x.npz", input=data)
    fs = load_feeds(tmp_path / "x.npz", spec)
    assert len(fs.feeds) == 3
    np.testing.assert_array_equal(fs.feeds[1]["input"], data[2:4])


def test_multi_input_npz(tmp_path):
    image, mask = rand((4, 3, 4, 4)), np.arange(16, dtype=np.int32).reshape(4, 4)
    np.savez(tmp_path / "x.npz", image=image, mask=mask, extra=np.zeros(3))
    fs = load_feeds(tmp_path / "x.npz", TWO)
    assert len(fs.feeds) == 4
    assert set(fs.feeds[2]) == {"image", "mask"}  # extra arrays are ignored
    assert fs.feeds[2]["mask"].dtype == np.int64 and fs.feeds[2]["mask"].tolist() == [[8, 9, 10, 11]]


def test_folder_of_npz_one_sample_each_in_name_order(tmp_path):
    samples = [rand((1, 1, 8, 8), i) for i in range(4)]
    for i, s in enumerate(samples):
        np.savez(tmp_path / f"s{i:02d}.npz", input=s)
    (tmp_path / ".hidden.npz").write_bytes(b"not read")
    (tmp_path / "notes.txt").write_text("ignored")
    fs = load_feeds(tmp_path, IMG)
    assert len(fs.feeds) == 4
    for f, s in zip(fs.feeds, samples):
        np.testing.assert_array_equal(f["input"], s)


def test_calib_samples_spread_evenly_and_a_folder_reads_only_those(tmp_path):
    data = np.load(DIGITS / "calib.npz")["input"]
    fs = load_feeds(DIGITS / "calib.npz", IMG, samples=5)
    picked = [0, 50, 100, 149, 199]  # evenly over 200, first and last included
    assert [f["input"][0].tolist() for f in fs.feeds] == [data[i].tolist() for i in picked]
    assert len(load_feeds(DIGITS / "calib.npz", IMG, samples=500).feeds) == 200  # more than there are: all
    for i in range(7):
        np.savez(tmp_path / f"s{i:02d}.npz", input=rand((1, 1, 8, 8), i))
    for i in (1, 2, 4, 5):  # the files not picked are never read: damaged ones do not matter
        (tmp_path / f"s{i:02d}.npz").write_bytes(b"damaged")
    got = load_feeds(tmp_path, IMG, samples=3)
    assert [f["input"].tolist() for f in got.feeds] == [rand((1, 1, 8, 8), i).tolist() for i in (0, 3, 6)]
    with pytest.raises(UsageError, match="--calib-samples must be at least 1"):
        load_feeds(DIGITS / "calib.npz", IMG, samples=0)


def test_calib_samples_through_the_cli(cli, tmp_path):
    r = cli("quantize", DIGITS / "digits_cnn.onnx", "-o", tmp_path / "q.onnx", "--calib-samples", "20", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["calibration"]["samples"] == 20  # of calib.npz's 200 (the sidecar names a held-out set of its own)
    bad = cli("quantize", DIGITS / "digits_cnn.onnx", "-o", tmp_path / "q2.onnx", "--calib-samples", "0")
    assert bad.returncode == 2 and "--calib-samples" in bad.stderr and not (tmp_path / "q2.onnx").exists()


def test_no_source_means_random_data():
    fs = load_feeds(None, TWO, random_count=5, seed=3)
    assert fs.random and fs.source == "random" and len(fs.feeds) == 5
    assert fs.feeds[0]["image"].dtype == np.float32 and fs.feeds[0]["image"].shape == (1, 3, 4, 4)
    assert fs.feeds[0]["mask"].dtype == np.int64 and 0 <= fs.feeds[0]["mask"].min() and fs.feeds[0]["mask"].max() < 8
    again = random_feeds(TWO, 5, seed=3)
    np.testing.assert_array_equal(again.feeds[4]["image"], fs.feeds[4]["image"])
    other = random_feeds(TWO, 5, seed=4)
    assert not np.array_equal(other.feeds[0]["image"], fs.feeds[0]["image"])


def test_random_data_too_big_to_make_up_is_refused():
    err = calib_error("32 random samples of the model's inputs would need 47684 GiB", random_feeds, (IOSpec("x", (99999999999, 4), "float32"),), 32)
    assert "--calib" in err.hint


def test_random_data_for_bool_and_unsupported_types():
    fs = random_feeds((IOSpec("flag", (3,), "bool"),), 2)
    assert fs.feeds[0]["flag"].dtype == np.bool_
    calib_error("cannot make random data for input 's'", random_feeds, (IOSpec("s", (1,), "str"),), 1)


# -- images --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def photo_dir(tmp_path_factory) -> Path:
    """Five PNG crops of scikit-learn's sample photos (china.jpg, flower.jpg)."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    d = tmp_path_factory.mktemp("photos")
    boxes = [(0, 0, 120, 90), (200, 100, 360, 220), (50, 300, 130, 420), (400, 10, 640, 190), (10, 10, 74, 58)]
    for i, box in enumerate(boxes):
        Image.fromarray(photos[i % 2]).crop(box).save(d / f"img{i}.png")
    (d / "README.txt").write_text("not an image")
    return d


def expected_image(path: Path, h: int, w: int, mode: str = "RGB") -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert(mode).resize((w, h), Image.BILINEAR), dtype=np.float32)


def test_image_folder_nchw_rgb_with_mean_std(photo_dir):
    spec = (IOSpec("x", (1, 3, 24, 32), "float32"),)
    pre = Preprocess.parse("mean=0.485/0.456/0.406,std=0.229/0.224/0.225,scale=1/255")
    fs = load_feeds(photo_dir, spec, preprocess=pre)
    assert len(fs.feeds) == 5  # README.txt is not an image
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    for i, feed in enumerate(fs.feeds):
        x = feed["x"]
        assert x.shape == (1, 3, 24, 32) and x.dtype == np.float32
        want = ((expected_image(photo_dir / f"img{i}.png", 24, 32) * (1 / 255) - mean) / std).transpose(2, 0, 1)
        np.testing.assert_allclose(x[0], want, rtol=1e-5, atol=1e-5)


def test_image_bgr_nhwc_and_gray(photo_dir):
    rgb = load_feeds(photo_dir / "img1.png", (IOSpec("x", (1, 20, 20, 3), "float32"),), preprocess=Preprocess())
    bgr = load_feeds(photo_dir / "img1.png", (IOSpec("x", (1, 20, 20, 3), "float32"),), preprocess=Preprocess(color="bgr"))
    assert rgb.feeds[0]["x"].shape == (1, 20, 20, 3)  # layout guessed from the shape: NHWC
    np.testing.assert_array_equal(bgr.feeds[0]["x"], rgb.feeds[0]["x"][..., ::-1])
    np.testing.assert_allclose(rgb.feeds[0]["x"][0], expected_image(photo_dir / "img1.png", 20, 20) / 255, rtol=1e-6)
    gray = load_feeds(photo_dir / "img2.png", (IOSpec("x", (1, 1, 16, 12), "float32"),))
    np.testing.assert_allclose(gray.feeds[0]["x"][0, 0], expected_image(photo_dir / "img2.png", 16, 12, "L") / 255, rtol=1e-6)


def test_image_batch_repeats_the_sample(photo_dir):
    fs = load_feeds(photo_dir / "img0.png", (IOSpec("x", (2, 3, 8, 8), "float32"),))
    x = fs.feeds[0]["x"]
    assert x.shape == (2, 3, 8, 8)
    np.testing.assert_array_equal(x[0], x[1])


@pytest.mark.parametrize(
    "spec,pre,needle",
    [
        ((IOSpec("x", (1, 3, 24, 32), "float32"),), "size=32x32", "does not match the model input 24x32"),
        ((IOSpec("x", (1, 3, 24, 32), "float32"),), "mean=0.5/0.5", "mean/std need 1 or 3 values"),
        ((IOSpec("x", (1, 3, 24, 32), "uint8"),), "", "image calibration needs a float input"),
        ((IOSpec("x", (3, 24, 32), "float32"),), "", "one 4-D image input"),
        (TWO, "", "one 4-D image input"),
    ],
)
def test_image_bad_setups(photo_dir, spec, pre, needle):
    calib_error(needle, load_feeds, photo_dir, spec, preprocess=Preprocess.parse(pre))


def test_unreadable_image(tmp_path, photo_dir):
    (tmp_path / "a.png").write_bytes((photo_dir / "img0.png").read_bytes())
    (tmp_path / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n but then nothing")
    err = calib_error("cannot read image", load_feeds, tmp_path, (IOSpec("x", (1, 3, 8, 8), "float32"),))
    assert "b.png" in err.message


def test_preprocess_parse_good():
    p = Preprocess.parse("size=224x224, mean=0.485/0.456/0.406, std=0.229/0.224/0.225, scale=1/127.5, color=bgr, layout=NHWC")
    assert p == Preprocess(
        size=(224, 224),
        scale=1 / 127.5,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        color="bgr",
        layout="nhwc",
    )
    assert Preprocess.parse("") == Preprocess()
    assert Preprocess.parse("size=48*192").size == (48, 192)
    assert Preprocess.parse("scale=0.5").scale == 0.5
    assert Preprocess.parse("color=gray,").color == "gray"


@pytest.mark.parametrize(
    "text,item",
    [
        ("size=224", "size=224"),
        ("size=axb", "size=axb"),
        ("size=1x2x3", "size=1x2x3"),
        ("mean=a/b/c", "mean=a/b/c"),
        ("std=", "std="),
        ("scale=x", "scale=x"),
        ("color=purple", "color=purple"),
        ("layout=nchwc", "layout=nchwc"),
        ("resize=224x224", "resize=224x224"),
        ("size=2x2,bogus", "bogus"),
    ],
)
def test_preprocess_parse_bad(text, item):
    with pytest.raises(UsageError, match="bad --preprocess item") as exc:
        Preprocess.parse(text)
    assert f"'{item}'" in exc.value.message
    assert "size=HxW" in exc.value.hint


def test_preprocess_parse_scale_divided_by_zero():
    with pytest.raises(UsageError, match="bad --preprocess item 'scale=1/0'"):
        Preprocess.parse("scale=1/0")


# -- bad inputs ----------------------------------------------------------------------------------


def test_wrong_shape_stacked(tmp_path):
    np.savez(tmp_path / "x.npz", input=rand((10, 1, 8, 9)))
    calib_error("'input' has shape [10, 1, 8, 9], expected [N, 1, 8, 8]", load_feeds, tmp_path / "x.npz", IMG)
    np.savez(tmp_path / "y.npz", input=rand((10, 8, 8)))
    calib_error("'input' has shape [10, 8, 8], expected [N, 1, 8, 8]", load_feeds, tmp_path / "y.npz", IMG)


def test_wrong_shape_batch_not_a_multiple(tmp_path):
    np.savez(tmp_path / "x.npz", input=rand((5, 1, 8, 8)))
    calib_error("with N a multiple of 2", load_feeds, tmp_path / "x.npz", (IOSpec("input", (2, 1, 8, 8), "float32"),))


def test_wrong_shape_in_a_folder_sample(tmp_path):
    np.savez(tmp_path / "a.npz", input=rand((1, 1, 8, 8)))
    np.savez(tmp_path / "b.npz", input=rand((1, 8, 8)))
    err = calib_error("'input' has shape [1, 8, 8], expected [1, 1, 8, 8]", load_feeds, tmp_path, IMG)
    assert "b.npz" in err.message


def test_wrong_dtype_kind(tmp_path):
    np.savez(tmp_path / "x.npz", input=(rand((4, 1, 8, 8)) * 16).astype(np.uint8))
    err = calib_error("'input' has dtype uint8, the model wants float32", load_feeds, tmp_path / "x.npz", IMG)
    assert "preprocessing" in err.hint
    np.savez(tmp_path / "two.npz", image=rand((2, 3, 4, 4)), mask=np.zeros((2, 4), np.float32))
    calib_error("'mask' has dtype float32, the model wants int64", load_feeds, tmp_path / "two.npz", TWO)


def test_missing_input_key(tmp_path):
    np.savez(tmp_path / "x.npz", img=rand((4, 1, 8, 8)))
    calib_error("no array for input(s) input (has: img)", load_feeds, tmp_path / "x.npz", IMG)
    np.savez(tmp_path / "two.npz", image=rand((2, 3, 4, 4)))
    calib_error("no array for input(s) mask (has: image)", load_feeds, tmp_path / "two.npz", TWO)
    d = tmp_path / "folder"
    d.mkdir()
    np.savez(d / "s0.npz", other=rand((1, 1, 8, 8)))
    calib_error("no array for input(s) input (has: other)", load_feeds, d, IMG)


def test_different_sample_counts(tmp_path):
    np.savez(tmp_path / "two.npz", image=rand((3, 3, 4, 4)), mask=np.zeros((2, 4), np.int64))
    calib_error("inputs have different sample counts [2, 3]", load_feeds, tmp_path / "two.npz", TWO)


def test_npy_for_a_two_input_model(tmp_path):
    np.save(tmp_path / "x.npy", rand((2, 3, 4, 4)))
    err = calib_error("a .npy holds one array, but the model has 2 inputs", load_feeds, tmp_path / "x.npy", TWO)
    assert ".npz" in err.hint


def test_empty_folder(tmp_path):
    calib_error("no .npz files or images in", load_feeds, tmp_path, IMG)
    (tmp_path / "notes.txt").write_text("x")
    calib_error("no .npz files or images in", load_feeds, tmp_path, IMG)


def test_empty_stacked_file(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((0, 1, 8, 8), np.float32))
    # Caught by the shape check (the first sample is missing) before the "no samples" check.
    calib_error("'input' has shape [0, 1, 8, 8]", load_feeds, tmp_path / "x.npy", IMG)


@pytest.mark.parametrize("name", ["x.npz", "x.npy", "folder/s0.npz"])
def test_unreadable_file(tmp_path, name):
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"PK\x03\x04 this is not a numpy file")
    calib_error("cannot read", load_feeds, path if "/" not in name else path.parent, IMG)


def test_pickled_npy_is_not_loaded(tmp_path):
    np.save(tmp_path / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    calib_error("cannot read", load_feeds, tmp_path / "x.npy", IMG)


def test_non_existent_path(tmp_path):
    err = calib_error("calibration data not found", load_feeds, tmp_path / "nope.npz", IMG)
    assert str(tmp_path / "nope.npz") in err.message


def test_unsupported_file_type(tmp_path):
    (tmp_path / "x.csv").write_text("1,2,3")
    calib_error("unsupported calibration data", load_feeds, tmp_path / "x.csv", IMG)


def test_labels_count_mismatch(tmp_path):
    np.save(tmp_path / "l.npy", np.arange(359))
    err = calib_error("must be 360 integer class indices, got shape [359]", load_feeds, DIGITS / "heldout.npz", IMG, labels=tmp_path / "l.npy")
    assert "one label per evaluation sample" in err.hint


def test_labels_bad_dtype_rank_and_missing(tmp_path):
    np.save(tmp_path / "f.npy", np.zeros(360, np.float32))
    calib_error("integer class indices, got shape [360] float32", load_feeds, DIGITS / "heldout.npz", IMG, labels=tmp_path / "f.npy")
    np.save(tmp_path / "2d.npy", np.zeros((360, 1), np.int64))
    calib_error("got shape [360, 1]", load_feeds, DIGITS / "heldout.npz", IMG, labels=tmp_path / "2d.npy")
    calib_error("cannot read labels", load_feeds, DIGITS / "heldout.npz", IMG, labels=tmp_path / "missing.npy")


# -- FeedSet.split -------------------------------------------------------------------------------


def feedset(n: int, labels: bool = True) -> FeedSet:
    return FeedSet([{"x": np.full((1,), i, np.float32)} for i in range(n)], "src", False, np.arange(n) if labels else None)


@pytest.mark.parametrize("n,frac,cut", [(10, 0.2, 8), (10, 0.25, 8), (10, 0.0, 9), (10, 1.0, 1), (2, 0.5, 1), (3, 0.01, 2)])
def test_split_keeps_at_least_one_sample_each_side(n, frac, cut):
    cal, held = feedset(n).split(frac)
    assert [int(f["x"][0]) for f in cal.feeds] == list(range(cut))
    assert [int(f["x"][0]) for f in held.feeds] == list(range(cut, n))
    assert cal.labels.tolist() == list(range(cut)) and held.labels.tolist() == list(range(cut, n))
    assert cal.source == "src" and held.source == "src (held out)"


def test_split_single_sample_and_no_labels():
    cal, held = feedset(1, labels=False).split(0.2)
    assert len(cal.feeds) == 1 and held.feeds == []
    assert cal.labels is None and held.labels is None


# -- ranges --------------------------------------------------------------------------------------


def elementwise_model(width: int) -> onnx.ModelProto:
    """y = Relu(x * k + c): each intermediate is exactly what numpy computes in float32."""
    rng = np.random.default_rng(0)
    k = rng.uniform(0.5, 2.0, (1, width)).astype(np.float32)
    c = rng.normal(0, 1, (1, width)).astype(np.float32)
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["a"]),
        helper.make_node("Add", ["a", "c"], ["b"]),
        helper.make_node("Relu", ["b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        initializer=[numpy_helper.from_array(k, "k"), numpy_helper.from_array(c, "c")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def intermediates(model: onnx.ModelProto, feeds) -> dict[str, np.ndarray]:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = np.concatenate([f["x"] for f in feeds])
    a = x * inits["k"]
    b = a + inits["c"]
    return {"x": x, "a": a, "b": b, "y": np.maximum(b, 0)}


def test_minmax_is_numpy_min_max_of_each_tensor():
    model = elementwise_model(64)
    feeds = [{"x": np.random.default_rng(i).normal(0, 2, (1, 64)).astype(np.float32)} for i in range(12)]
    ranges = collect_ranges(model, ["x", "a", "b", "y"], feeds, method="minmax")
    want = intermediates(model, feeds)
    for name in ("x", "a", "b", "y"):
        assert ranges[name] == (float(want[name].min()), float(want[name].max())), name
    assert ranges["y"][0] == 0.0


@pytest.fixture(scope="module")
def outlier_case():
    """400k values of b, 3 of them far outliers: percentile must clip them, minmax must not."""
    model = elementwise_model(50_000)
    feeds = [{"x": np.random.default_rng(i).normal(0, 1, (1, 50_000)).astype(np.float32)} for i in range(8)]
    feeds[3]["x"][0, :3] = [400.0, 350.0, -380.0]
    return model, feeds, collect_ranges(model, ["x", "a", "b", "y"], feeds, method="minmax")


def test_percentile_range_is_inside_minmax(outlier_case):
    model, feeds, mm = outlier_case
    pc = collect_ranges(model, ["x", "a", "b", "y"], feeds, method="percentile")
    for name in ("x", "a", "b", "y"):
        assert mm[name][0] <= pc[name][0] <= pc[name][1] <= mm[name][1], name
    # The outliers are gone: the clipped range is close to that of the bulk of the data.
    b = intermediates(model, feeds)["b"].ravel()
    bulk = np.sort(b)[4:-4]
    assert pc["b"][1] < mm["b"][1] / 10 and pc["b"][0] > mm["b"][0] / 10
    assert pc["b"][1] >= bulk.max() * 0.9 and pc["b"][0] <= bulk.min() * 0.9
    assert pc["y"][0] == 0.0  # a ReLU output keeps its exact 0 lower end


def test_symmetric_percentile_and_entropy_stay_inside_minmax(outlier_case):
    model, feeds, mm = outlier_case
    for method, symmetric in (("percentile", True), ("entropy", False), ("entropy", True)):
        r = collect_ranges(model, ["x", "b"], feeds, method=method, symmetric=symmetric)
        for name in ("x", "b"):
            assert mm[name][0] <= r[name][0] <= r[name][1] <= mm[name][1], (method, name)
            assert r[name][1] < mm[name][1], (method, name)  # the outliers are clipped


def test_unknown_method():
    with pytest.raises(UsageError, match="unknown calibration method 'kl'") as exc:
        collect_ranges(elementwise_model(4), ["x"], [], method="kl")
    assert "minmax, percentile, entropy, mse, auto" in exc.value.hint


def test_ranges_with_progress_and_all_zero_tensor():
    class Counter:
        n = 0

        def advance(self):
            self.n += 1

    model = elementwise_model(8)
    feeds = [{"x": np.zeros((1, 8), np.float32)}] * 3
    progress = Counter()
    r = collect_ranges(model, ["x", "y"], feeds, method="percentile", progress=progress)
    assert r["x"] == (0.0, 0.0)
    assert progress.n == 6  # percentile takes two passes over the feeds


def test_kl_threshold_clips_a_long_tail():
    rng = np.random.default_rng(0)
    values = np.abs(rng.normal(0, 1, 200_000))
    values[:20] = 50.0
    hist, _ = np.histogram(values, bins=2048, range=(0, 50.0))
    t = kl_threshold(hist, 50.0)
    assert 2.0 < t < 10.0
    assert kl_threshold(np.zeros(2048), 3.0) == 3.0
    assert kl_threshold(np.ones(64), 3.0) == 3.0  # fewer bins than levels: nothing to clip


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_data_names_file_sample_and_input(tmp_path, bad):
    data = rand((6, 1, 8, 8))
    data[4, 0, 3, 5] = bad
    np.savez(tmp_path / "x.npz", input=data)
    err = calib_error(f"{tmp_path / 'x.npz'}: sample 4, input 'input' has NaN or Inf values", load_feeds, tmp_path / "x.npz", IMG)
    assert err.exit_code == 3
    np.save(tmp_path / "x.npy", data)
    calib_error("x.npy: sample 4, input 'input'", load_feeds, tmp_path / "x.npy", IMG)
    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(3):
        np.savez(folder / f"s{i}.npz", input=data[i + 3 : i + 4])
    calib_error(f"{folder / 's1.npz'}: sample 1, input 'input'", load_feeds, folder, IMG)
    np.savez(tmp_path / "two.npz", image=rand((2, 3, 4, 4)), mask=np.zeros((2, 4), np.int64))
    assert len(load_feeds(tmp_path / "two.npz", TWO).feeds) == 2  # integer inputs are finite by nature


def test_image_preprocessing_with_non_finite_results_is_refused(photo_dir):
    spec = (IOSpec("x", (1, 3, 16, 16), "float32"),)
    with pytest.raises(UsageError, match="std must not be 0"):
        load_feeds(photo_dir, spec, preprocess=Preprocess.parse("std=0.5/0/0.5"))
    calib_error("img0.png: sample 0, input 'x' has NaN or Inf values", load_feeds, photo_dir, spec, preprocess=Preprocess(mean=(np.inf,)))


def test_the_c_histogram_is_numpys_bin_for_bin():
    """calib.histogram_add (ekrt's one-pass C kernel) against histogram_numpy, on the example
    MobileNetV2's real activations (ReLU6 outputs with their spike of zeros, signed ones), edge
    values, NaN, both bin counts the calibrator uses, signed and |x|."""
    from edgekit import _ekrt
    from edgekit.quantize import calib
    from tests.conftest import EXAMPLES

    assert calib._ekrt is _ekrt  # the calibrator runs the C kernel, not the fallback
    model = onnx.load(str(EXAMPLES / "mobilenetv2" / "mobilenetv2.onnx"))
    feed = {model.graph.input[0].name: np.load(EXAMPLES / "mobilenetv2" / "calib.npz")[model.graph.input[0].name][:1]}
    names = [n.output[0] for n in model.graph.node if n.op_type in ("Clip", "Conv", "Add")][:40]
    values = next(calib.observe(model, names, [feed]))
    edge = np.array([-1.0, 1.0, 0.0, np.nan, 0.999999, -0.999999, 1e-30], np.float32)
    with np.errstate(invalid="ignore"):  # numpy casts the NaN to int (bin 0 after its clip, as in C)
        for name, value in [*values.items(), ("edge", edge)]:
            finite = value[np.isfinite(value)]
            lo, hi = float(finite.min()), float(finite.max())
            absmax = max(-lo, hi)
            for bins in (calib.BINS, calib.BINS * 2):
                got = np.zeros(bins)
                calib.histogram_add(got, value, lo, hi)
                calib.histogram_add(got, value, lo, hi)  # it adds
                assert np.array_equal(got, 2 * calib.histogram_numpy(value, lo, hi, bins)), name
                got = np.zeros(bins)
                calib.histogram_add(got, value, 0.0, absmax, absolute=True)
                assert np.array_equal(got, calib.histogram_numpy(np.abs(value), 0.0, absmax, bins)), name
    with pytest.raises(TypeError, match="float32"):
        _ekrt.histogram_add(np.zeros(4, np.float64), 0.0, 1.0, np.zeros(8), False)
    with pytest.raises(TypeError, match="float64"):
        _ekrt.histogram_add(np.zeros(4, np.float32), 0.0, 1.0, np.zeros(8, np.int64), False)


@pytest.mark.realmodels
@pytest.mark.parametrize("keep", [0, 1 << 20, None])  # none kept (two runs per sample), some, all (one run each)
def test_values_kept_from_the_range_pass_give_the_histograms_of_a_second_run(keep, monkeypatch):
    """auto/mse/percentile calibrate from the range pass's kept values where they fit KEEP_BYTES
    and run the model again only for the rest: the ranges (every candidate's) are the second
    run's exactly, on a real model (MTCNN O-Net), and the model runs once per sample kept."""
    import edgekit.quantize.calib as calib_mod
    from edgekit.quantize import SCHEMES, analyze_model
    from tests.realmodels import real_model_data

    loaded, cal, _ = real_model_data("mtcnn-onet", 12, 1)
    prepared, analysis = analyze_model(loaded, SCHEMES["onnxruntime"])
    runs = []
    observer = calib_mod._observer_session

    def counting(model, tensors):
        session, names = observer(model, tensors)

        class Counting:
            def run(self, *a):
                runs.append(1)
                return session.run(*a)

        return Counting(), names

    def candidates(keep_bytes: int) -> dict:
        monkeypatch.setattr(calib_mod, "KEEP_BYTES", keep_bytes)
        found: dict = {}
        collect_ranges(prepared, analysis.calibrated, cal.feeds, method="auto", candidates=found)
        return found

    default = calib_mod.KEEP_BYTES
    reference = candidates(0)
    monkeypatch.setattr(calib_mod, "_observer_session", counting)
    assert candidates(default if keep is None else keep) == reference
    assert len(runs) == {0: 24, None: 12}.get(keep, len(runs))
    assert 12 <= len(runs) <= 24
    if keep == 1 << 20:
        assert 12 < len(runs) < 24  # some samples kept, the rest run again
