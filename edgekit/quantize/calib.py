"""Calibration: where the samples come from (feeds), and what ranges they produce.

A *feed* is one ``{input name: array}`` dict, shaped exactly like the model's inputs.
Sources: a folder of ``.npz`` files (one sample each), a stacked ``.npz`` / ``.npy``, a folder of
images with the model's preprocessing, or random data (with a loud warning).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

try:  # ekrt's C extension (built with the package): the histograms' one-pass kernel
    from edgekit import _ekrt
except ImportError:  # pragma: no cover - a source tree whose extension is not built: numpy's
    _ekrt = None
from edgekit.errors import CalibrationError, ModelError, UsageError
from edgekit.modelio import IOSpec
from edgekit.quantize import qmath

Feed = dict[str, np.ndarray]
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
# Activation range methods: minmax (what was seen), percentile (99.999 % of it), entropy (the KL
# threshold, TensorRT's), mse (the clip minimising the expected quantization error, from the
# histogram), auto (per tensor, whichever of minmax / percentile / mse errs least on its histogram).
METHODS = ("minmax", "percentile", "entropy", "mse", "auto")
# Not a range method: int8 weights, activations quantized at run time (quantize.dynamic); no calibration.
DYNAMIC = "dynamic"
# auto: per tensor the least quantize-dequantize error of minmax / percentile / mse; on the 10-model
# catalogue never below minmax beyond the noise, and far above it on OCR recognition, layout detection
# and YOLO (docs/quantize.md, "Ranges")
DEFAULT_METHOD = "auto"
RANDOM_LIMIT = 4 << 30  # bytes of random calibration data we are willing to make up


@dataclass(frozen=True)
class FeedSet:
    feeds: list[Feed]
    source: str  # what a human reads: a path, or "random"
    random: bool = False
    labels: np.ndarray | None = None

    def split(self, held_out: float) -> tuple[FeedSet, FeedSet]:
        """Last ``held_out`` fraction becomes the held-out set (at least one sample each side)."""
        n = len(self.feeds)
        k = min(n - 1, max(1, int(round(n * held_out)))) if n > 1 else 0
        cut = n - k
        lab = self.labels
        return (
            FeedSet(self.feeds[:cut], self.source, self.random, None if lab is None else lab[:cut]),
            FeedSet(self.feeds[cut:], self.source + " (held out)", self.random, None if lab is None else lab[cut:]),
        )


@dataclass(frozen=True)
class Preprocess:
    """Image preprocessing: resize, scale, normalize, channel order, layout."""

    size: tuple[int, int] | None = None  # (height, width); None = from the model input
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    color: str = "rgb"  # "rgb" | "bgr" | "gray"
    layout: str | None = None  # "nchw" | "nhwc"; None = guess from the input shape

    def __post_init__(self) -> None:
        if 0.0 in self.std:
            raise UsageError("--preprocess std must not be 0 (it divides)", "e.g. std=0.229/0.224/0.225, or leave it out")

    @classmethod
    def parse(cls, text: str) -> Preprocess:
        """``"size=224x224,mean=0.485/0.456/0.406,std=0.229/0.224/0.225,scale=1/255,color=rgb,layout=nchw"``."""
        kw: dict = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, value = part.partition("=")
            key = key.strip().lower()
            try:
                if key == "size":
                    h, w = re.split(r"[x*]", value.lower())
                    kw["size"] = (int(h), int(w))
                elif key == "scale":
                    num, _, den = value.partition("/")
                    kw["scale"] = float(num) / float(den or 1)
                elif key in ("mean", "std"):
                    kw[key] = tuple(float(v) for v in value.split("/"))
                elif key == "color" and value in ("rgb", "bgr", "gray"):
                    kw["color"] = value
                elif key == "layout" and value.lower() in ("nchw", "nhwc"):
                    kw["layout"] = value.lower()
                else:
                    raise ValueError(key)
            except (ValueError, ZeroDivisionError):
                raise UsageError(
                    f"bad --preprocess item '{part}'",
                    "use size=HxW, scale=1/255, mean=a/b/c, std=a/b/c, color=rgb|bgr|gray, layout=nchw|nhwc",
                ) from None
        return cls(**kw)


def load_feeds(
    source: Path | None,
    inputs: Sequence[IOSpec],
    *,
    preprocess: Preprocess | None = None,
    random_count: int = 32,
    seed: int = 0,
    labels: Path | None = None,
    samples: int | None = None,
) -> FeedSet:
    """Read calibration/evaluation samples and check each against the model's inputs. ``samples``:
    read at most this many, spread evenly over the source (a folder: only their files are read)."""
    if samples is not None and samples < 1:
        raise UsageError(f"--calib-samples must be at least 1, got {samples}", "give the number of calibration samples to use, e.g. --calib-samples 64")
    if source is None:
        return random_feeds(inputs, random_count, seed)
    source = Path(source)
    per_file: list[Path] = []  # a folder: the file each sample came from
    if not source.exists():
        raise CalibrationError(f"calibration data not found: {source}", "give a .npz/.npy file or a folder of .npz files or images")
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.is_file() and not p.name.startswith("."))
        npz = spread([p for p in files if p.suffix == ".npz"], samples)
        images = spread([p for p in files if p.suffix.lower() in IMAGE_SUFFIXES], samples)
        if npz:
            feeds, per_file = [_check_feed(_read_npz(p), inputs, p) for p in npz], npz
        elif images:
            feeds, per_file = _image_feeds(images, inputs, preprocess or Preprocess()), images
        else:
            raise CalibrationError(f"no .npz files or images in {source}", "put one .npz per sample (keyed by input name) or image files there")
    elif source.suffix == ".npz":
        feeds = _stacked(_read_npz(source), inputs, source, samples)
    elif source.suffix == ".npy":
        if len(inputs) != 1:
            raise CalibrationError(
                f"{source}: a .npy holds one array, but the model has {len(inputs)} inputs",
                "use a .npz keyed by input name",
            )
        try:
            arr = np.load(source, allow_pickle=False)
        except Exception as exc:
            raise CalibrationError(f"cannot read {source}: {exc}", "write it with numpy.save") from exc
        feeds = _stacked({inputs[0].name: arr}, inputs, source, samples)
    elif source.suffix.lower() in IMAGE_SUFFIXES:
        feeds = _image_feeds([source], inputs, preprocess or Preprocess())
    else:
        raise CalibrationError(f"unsupported calibration data: {source}", "give a .npz/.npy file, or a folder of .npz files or images")
    if not feeds:
        raise CalibrationError(f"no samples in {source}", "calibration needs at least one sample")
    _check_finite(feeds, source, per_file)
    return FeedSet(feeds, str(source), False, None if labels is None else _read_labels(labels, len(feeds)))


def spread(items: Sequence, n: int | None) -> list:
    """At most ``n`` of ``items``, evenly spaced and in order (all of them when ``n`` is None)."""
    items = list(items)
    if n is None or n >= len(items):
        return items
    return [items[int(i)] for i in np.linspace(0, len(items) - 1, n).round()]


def random_feeds(inputs: Sequence[IOSpec], count: int, seed: int = 0) -> FeedSet:
    need = sum(int(np.prod(s.shape, dtype=np.float64)) * np.dtype(s.dtype).itemsize for s in inputs) * count
    if need > RANDOM_LIMIT:
        raise CalibrationError(
            f"{count} random samples of the model's inputs would need {need / 2**30:.0f} GiB",
            "give real data with --calib, or smaller input shapes with --shape",
        )
    rng = np.random.default_rng(seed)

    def value(spec: IOSpec) -> np.ndarray:
        dt = np.dtype(spec.dtype)
        if dt.kind == "f":
            return rng.standard_normal(spec.shape).astype(dt)
        if dt.kind in "iu":
            return rng.integers(0, 8, spec.shape).astype(dt)
        if dt.kind == "b":
            return rng.integers(0, 2, spec.shape).astype(dt)
        raise CalibrationError(f"cannot make random data for input '{spec.name}' of type {spec.dtype}", "give real data with --calib")

    return FeedSet([{spec.name: value(spec) for spec in inputs} for _ in range(count)], "random", True)


def _read_labels(path: Path, n: int) -> np.ndarray:
    try:
        lab = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise CalibrationError(f"cannot read labels {path}: {exc}", "labels are a .npy of int class indices") from exc
    if lab.ndim != 1 or lab.shape[0] != n or lab.dtype.kind not in "iu":
        raise CalibrationError(
            f"labels {path} must be {n} integer class indices, got shape {list(lab.shape)} {lab.dtype}",
            "one label per evaluation sample, saved with numpy.save",
        )
    if lab.size and (lab.min() < 0 or lab.max() >= 2**31):
        i = int(np.argmax((lab < 0) | (lab >= 2**31)))
        raise CalibrationError(
            f"labels {path}: sample {i} has class index {int(lab[i])}; class indices run from 0 to the number of classes - 1",
            "save the class index of each evaluation sample (0-based), not a score or an id",
        )
    return lab.astype(np.int64)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except Exception as exc:
        raise CalibrationError(f"cannot read {path}: {exc}", "write it with numpy.savez") from exc


def _check_finite(feeds: Sequence[Feed], source: Path, per_file: Sequence[Path]) -> None:
    """NaN/Inf in the data would yield ranges and agreement figures that mean nothing: refuse it."""
    for i, feed in enumerate(feeds):
        for name, arr in feed.items():
            if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
                raise CalibrationError(
                    f"{per_file[i] if per_file else source}: sample {i}, input '{name}' has NaN or Inf values",
                    "drop or fix that sample: calibration and evaluation need finite data",
                )


def _check_array(arr: np.ndarray, spec: IOSpec, where: Path, expect_shape: tuple[int, ...]) -> np.ndarray:
    want = np.dtype(spec.dtype)
    if arr.dtype.kind != want.kind:
        raise CalibrationError(
            f"{where}: '{spec.name}' has dtype {arr.dtype}, the model wants {want.name}",
            f"convert the data to {want.name} (and apply the model's preprocessing) before saving",
        )
    if tuple(arr.shape) != tuple(expect_shape):
        raise CalibrationError(
            f"{where}: '{spec.name}' has shape {list(arr.shape)}, expected {list(expect_shape)}",
            "save samples shaped like the model input (stacked files: [N, ...] with N a multiple of the batch)",
        )
    return arr.astype(want, copy=False)


def _require_inputs(arrays: Mapping[str, Any], inputs: Sequence[IOSpec], where: Path) -> None:
    missing = {s.name for s in inputs} - set(arrays)
    if missing:
        raise CalibrationError(
            f"{where}: no array for input(s) {', '.join(sorted(missing))} (has: {', '.join(sorted(arrays)) or 'nothing'})",
            "key each array by the model's input name",
        )


def _check_feed(feed: Feed, inputs: Sequence[IOSpec], where: Path) -> Feed:
    _require_inputs(feed, inputs, where)
    return {s.name: _check_array(feed[s.name], s, where, s.shape) for s in inputs}


def _stacked(arrays: dict[str, np.ndarray], inputs: Sequence[IOSpec], where: Path, samples: int | None = None) -> list[Feed]:
    _require_inputs(arrays, inputs, where)
    counts = set()
    for spec in inputs:
        arr = arrays[spec.name]
        batch = spec.shape[0] if spec.shape else 1
        if arr.ndim != len(spec.shape) or (spec.shape and tuple(arr.shape[1:]) != tuple(spec.shape[1:])) or arr.shape[0] % max(batch, 1):
            raise CalibrationError(
                f"{where}: '{spec.name}' has shape {list(arr.shape)}, expected [N, {', '.join(map(str, spec.shape[1:]))}]"
                + (f" with N a multiple of {batch}" if batch > 1 else ""),
                "stack the samples along the first axis",
            )
        _check_array(arr[:batch], spec, where, spec.shape)
        counts.add(arr.shape[0] // max(batch, 1))
    if len(counts) != 1:
        raise CalibrationError(f"{where}: inputs have different sample counts {sorted(counts)}", "give every input the same number of samples")

    def rows(spec: IOSpec, i: int) -> np.ndarray:
        b = spec.shape[0] if spec.shape else 1
        return np.ascontiguousarray(arrays[spec.name][i * b : (i + 1) * b]).astype(spec.dtype, copy=False)

    return [{spec.name: rows(spec, i) for spec in inputs} for i in spread(range(counts.pop()), samples)]


def _image_feeds(paths: list[Path], inputs: Sequence[IOSpec], pre: Preprocess) -> list[Feed]:
    from PIL import Image, UnidentifiedImageError

    if len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise CalibrationError("image calibration needs a model with one 4-D image input", "give .npz samples instead")
    spec = inputs[0]
    if np.dtype(spec.dtype).kind != "f":
        raise CalibrationError(f"image calibration needs a float input; '{spec.name}' is {spec.dtype}", "give .npz samples instead")
    n, a, b, c = spec.shape
    layout = pre.layout or ("nchw" if a in (1, 3) else "nhwc")
    channels, h, w = (a, b, c) if layout == "nchw" else (c, a, b)
    if pre.size and pre.size != (h, w):
        raise CalibrationError(f"--preprocess size {pre.size[0]}x{pre.size[1]} does not match the model input {h}x{w}", "drop size= or match it")
    color = "gray" if channels == 1 else pre.color
    mean = np.array(pre.mean, dtype=np.float32)
    std = np.array(pre.std, dtype=np.float32)
    if mean.size not in (1, channels) or std.size not in (1, channels):
        raise CalibrationError(f"--preprocess mean/std need 1 or {channels} values", "e.g. mean=0.485/0.456/0.406")
    feeds = []
    for path in paths:
        try:
            with Image.open(path) as im:
                im = im.convert("L" if color == "gray" else "RGB").resize((w, h), Image.BILINEAR)
                arr = np.asarray(im, dtype=np.float32)
        except (UnidentifiedImageError, OSError) as exc:
            raise CalibrationError(f"cannot read image {path}: {exc}", "remove it or convert it to PNG/JPEG") from exc
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if color == "bgr":
            arr = arr[:, :, ::-1]
        arr = (arr * pre.scale - mean) / std
        arr = arr.transpose(2, 0, 1) if layout == "nchw" else arr
        sample = np.ascontiguousarray(arr[None].astype(spec.dtype))
        feeds.append({spec.name: np.repeat(sample, n, axis=0) if n > 1 else sample})
    return feeds


# -- ranges ----------------------------------------------------------------------------------


class ElementSample:
    """A bounded, seeded subsample of each observed tensor's values over the calibration pass: what
    the per-layer error is measured on without running the float model again. At most ``per_tensor``
    values per tensor, spread evenly over the ``samples`` samples, so memory does not grow with
    the data (a few MB for a MobileNet)."""

    def __init__(self, samples: int, per_tensor: int = 1 << 16, seed: int = 0) -> None:
        self.per_sample = max(1, -(-per_tensor // max(1, samples)))
        self.rng = np.random.default_rng(seed)
        self.parts: dict[str, list[np.ndarray]] = {}

    def add(self, name: str, value: np.ndarray) -> None:
        flat = np.ravel(value)
        if flat.size > self.per_sample:
            flat = flat[self.rng.integers(0, flat.size, self.per_sample)]
        self.parts.setdefault(name, []).append(np.array(flat, dtype=np.float32))

    def get(self, name: str) -> np.ndarray | None:
        parts = self.parts.get(name)
        return np.concatenate(parts) if parts else None



@dataclass(frozen=True)
class Recipe:
    """What ``--method`` asks for: a range method, then ``+`` options that change the model.

    ``mse+clip+bias+cle``: MSE activation ranges, weights clipped per channel by MSE, biases
    corrected for the weights' rounding, cross-layer equalization before calibration; ``+gptq``:
    weights rounded against the layers' inputs (``quantize.rounding``); ``auto`` rounds them so
    when that lowers its output error (``rounding`` "decide"), ``+nearest`` never does; likewise
    ``auto`` corrects the biases when that lowers its output error (``bias`` "decide"), ``+bias``
    always does, ``+nobias`` never."""

    ranges: str = "minmax"
    weight_clip: bool = False
    bias_correction: bool = False
    equalize: bool = False
    smooth: float | str | None = None  # +smooth[=alpha]: SmoothQuant's migration strength, or "auto" (quantize.smooth)
    gptq: bool = False  # +gptq: weights rounded against the layers' float inputs (quantize.rounding)
    nearest: bool = False  # +nearest: weights rounded to the nearest step, auto does not try GPTQ
    nobias: bool = False  # +nobias: biases as they are, auto does not try correcting them

    @property
    def passes(self) -> int:
        """Float passes over the calibration samples: ranges (a second for histograms), smoothing
        (GPTQ's Hessians ride on the ranges' pass)."""
        return {"minmax": 1, DYNAMIC: 0}.get(self.ranges, 2) + (self.smooth is not None)

    @property
    def rounding(self) -> str:
        """How the weights are rounded: "gptq", "nearest", or "decide" (``auto``: GPTQ where it
        lowers the error at the outputs on the calibration samples, see ``autorange.choose``)."""
        if self.gptq or self.nearest:
            return "gptq" if self.gptq else "nearest"
        return "decide" if self.ranges == "auto" else "nearest"

    @property
    def bias(self) -> str:
        """Whether the biases are corrected for the weights' rounding: "on" (``+bias``), "off", or
        "decide" (``auto``: where it lowers the error at the outputs, see ``autorange.choose``)."""
        if self.bias_correction or self.nobias:
            return "on" if self.bias_correction else "off"
        return "decide" if self.ranges == "auto" else "off"


# The ``+`` options of a --method, and the Recipe field each one sets.
OPTIONS = {"clip": "weight_clip", "bias": "bias_correction", "cle": "equalize", "smooth": "smooth", "gptq": "gptq", "nearest": "nearest", "nobias": "nobias"}
SMOOTH_ALPHA = "auto"  # +smooth without a value: per tensor, the alpha with the least simulated int8 error, or none


def is_dynamic(method: str) -> bool:
    """Does ``method`` quantize activations at run time (``--method dynamic``)?"""
    return parse_method(method).ranges == DYNAMIC


def parse_method(text: str) -> Recipe:
    """``"mse+clip+bias"`` -> Recipe; UsageError naming the choices for anything else."""
    hint = f"choose one of: {', '.join(METHODS)}, optionally followed by +{', +'.join(OPTIONS)} (e.g. mse+clip+bias, auto+smooth=0.7), or {DYNAMIC}"
    base, *opts = [p.strip() for p in str(text).split("+")]
    if base == DYNAMIC:
        if opts:
            raise UsageError(
                f"--method '{text}': {DYNAMIC} takes no + options (it calibrates nothing, and its weights are quantized as they are)",
                f"use --method {DYNAMIC}, or a range method with options (e.g. mse+clip+bias)",
            )
        return Recipe(DYNAMIC)
    if base not in METHODS:
        raise UsageError(f"unknown calibration method '{text}'", hint)
    flags: dict[str, bool | float | str] = {}
    for item in opts:
        opt, eq, value = item.partition("=")
        if opt in METHODS:
            raise UsageError(f"--method '{text}' names two range methods ({base} and {opt})", hint)
        if opt not in OPTIONS:
            raise UsageError(f"unknown calibration option '+{opt}' in --method '{text}'", hint)
        if OPTIONS[opt] in flags:
            raise UsageError(f"--method '{text}' repeats +{opt}", hint)
        flags[OPTIONS[opt]] = _smooth_alpha(value, text) if opt == "smooth" else True
        if eq and opt != "smooth":
            raise UsageError(f"+{opt} takes no value, got '+{item}' in --method '{text}'", hint)
    if flags.get("gptq") and flags.get("nearest"):
        raise UsageError(f"--method '{text}' asks for two weight roundings (+gptq and +nearest)", "keep one: +gptq rounds against the layers' inputs, +nearest to the nearest step")
    if flags.get("bias_correction") and flags.get("nobias"):
        raise UsageError(f"--method '{text}' asks for corrected and uncorrected biases (+bias and +nobias)", "keep one: +bias corrects them, +nobias leaves them as they are")
    return Recipe(base, **flags)


def _smooth_alpha(value: str, text: str) -> float | str:
    if value in ("", SMOOTH_ALPHA):
        return SMOOTH_ALPHA
    try:
        alpha = float(value)
    except ValueError:
        alpha = float("nan")
    if not 0.0 < alpha < 1.0:
        raise UsageError(
            f"+smooth={value} in --method '{text}': alpha must be a number between 0 and 1, or auto",
            "e.g. auto+smooth (alpha chosen per tensor) or auto+smooth=0.5 (SmoothQuant's)",
        )
    return alpha


class ChannelMeans:
    """Running mean of chosen tensors along one axis (their channels): what bias correction needs
    of a layer's input. Memory: one float per channel."""

    def __init__(self, axes: Mapping[str, int]) -> None:
        self.axes = dict(axes)
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}

    @property
    def tensors(self) -> list[str]:
        return list(self.axes)

    def add(self, name: str, value: np.ndarray) -> None:
        axis = self.axes[name] % max(value.ndim, 1)
        others = tuple(i for i in range(value.ndim) if i != axis)  # summed in float64 without a float64 copy
        self.sums[name] = self.sums.get(name, 0.0) + value.sum(axis=others, dtype=np.float64)
        self.counts[name] = self.counts.get(name, 0) + value.size // max(value.shape[axis], 1)

    def get(self, name: str) -> np.ndarray | None:
        return self.sums[name] / self.counts[name] if self.counts.get(name) else None


class ChannelAbsMax(ChannelMeans):
    """Running max of |x| of chosen tensors per channel (along one axis): what smoothing needs of a
    MatMul/Gemm input. Memory: one float per channel."""

    def add(self, name: str, value: np.ndarray) -> None:
        axis = self.axes[name] % max(value.ndim, 1)
        seen = np.abs(np.moveaxis(value, axis, 0).reshape(value.shape[axis], -1)).max(axis=1).astype(np.float64)
        self.sums[name] = np.maximum(self.sums[name], seen) if name in self.sums else seen

    def get(self, name: str) -> np.ndarray | None:
        return self.sums.get(name)


def observe(model: onnx.ModelProto, tensors: Sequence[str], feeds: Sequence[Feed]) -> Iterator[dict[str, np.ndarray]]:
    """The float values of ``tensors`` (float ones) on each of ``feeds``, one dict per feed."""
    if not tensors:
        return
    session, names = _observer_session(model, tensors)
    for feed in feeds:
        yield dict(zip(names, session.run(names, feed)))


BINS = 2048
# Observed values of the first calibration samples kept from the range pass for the histogram pass
# (bytes): a small model's samples all fit, and calibrate in one run of the model each.
KEEP_BYTES = 256 << 20


def collect_ranges(
    model: onnx.ModelProto,
    tensors: Sequence[str],
    feeds: Sequence[Feed],
    method: str = "minmax",
    percentile: float = 99.999,
    symmetric: bool = False,
    progress=None,
    sample: ElementSample | None = None,
    means: ChannelMeans | None = None,
    candidates: dict[str, dict[str, tuple[float, float]]] | None = None,
    taps: Sequence = (),
) -> dict[str, tuple[float, float]]:
    """Run the float model over ``feeds`` and return a (min, max) range per tensor; ``sample``
    keeps some of the values seen on the way, ``means`` the channel means of its tensors, each of
    ``taps`` (a ``tensors`` list and ``add(name, value)``: GPTQ's Hessians) the values it names;
    ``candidates`` (method "auto") receives each tensor's range by every AUTO_CANDIDATES method,
    and by the histogram's choice among them ("histogram"), for ``autorange.choose``."""
    if method not in METHODS:
        raise UsageError(f"unknown calibration method '{method}'", f"choose one of: {', '.join(METHODS)}")
    taps = [*([means] if means is not None else []), *taps]
    wanted: dict[str, list] = {}
    for tap in taps:
        for t in tap.tensors:
            wanted.setdefault(t, []).append(tap)
    calibrated = set(tensors)
    extra = [t for t in wanted if t not in calibrated]
    session, names = _observer_session(model, [*tensors, *extra])
    lo = {n: np.inf for n in names}
    hi = {n: -np.inf for n in names}
    # The histograms need the ranges first. The first samples' values are kept (up to KEEP_BYTES)
    # for them; only the samples after those run the model a second time.
    kept: list[list[np.ndarray]] = []
    kept_bytes, keeping = 0, method != "minmax"
    for feed in feeds:
        values = session.run(names, feed)
        size = sum(v.nbytes for v in values)
        keeping = keeping and kept_bytes + size <= KEEP_BYTES
        if keeping:
            kept.append(values)
            kept_bytes += size
        for name, value in zip(names, values):
            if value.size:
                for tap in wanted.get(name, ()):
                    tap.add(name, value)
            if value.size and name not in extra:
                lo[name] = min(lo[name], float(value.min()))
                hi[name] = max(hi[name], float(value.max()))
                if sample is not None:
                    sample.add(name, value)
        if progress is not None:
            progress.advance()
    names = [n for n in names if n not in extra]
    ranges = {n: (lo[n] if np.isfinite(lo[n]) else 0.0, hi[n] if np.isfinite(hi[n]) else 0.0) for n in names}
    if method == "minmax":
        return ranges
    absmax = {n: max(abs(ranges[n][0]), abs(ranges[n][1])) for n in names}
    abs_hist = {n: np.zeros(BINS, dtype=np.float64) for n in names}
    signed_hist = {n: np.zeros(BINS * 2, dtype=np.float64) for n in names}
    # Only the histograms the method reads (each costs a pass over every value).
    one_sided = {n: ranges[n][0] >= 0 or ranges[n][1] <= 0 for n in names}
    need_abs = {n: method == "entropy" or symmetric or (method in ("mse", "auto") and one_sided[n]) for n in names}
    need_signed = {n: not symmetric and (method in ("percentile", "auto") or (method == "mse" and not one_sided[n])) for n in names}
    # A tensor that starts at 0 (after a Relu): its |x| histogram is the signed one with bin pairs
    # merged, bit for bit (the bin index is the same multiply, by a scale twice as large).
    from_signed = {n: need_abs[n] and need_signed[n] and ranges[n][0] == 0.0 for n in names}
    zeros = dict.fromkeys(names, 0)
    # (All the first run's values would take 672 MB per sample on layout-cdla, 170 MB on ppocr-rec.)
    for k, feed in enumerate(feeds):
        values = kept[k] if k < len(kept) else session.run(names, feed)
        for name, value in zip(names, values):
            if absmax[name] > 0:
                lo_, hi_ = ranges[name]
                if need_abs[name] and not from_signed[name]:
                    histogram_add(abs_hist[name], value, 0.0, absmax[name], absolute=True)
                if need_signed[name] and hi_ > lo_:
                    histogram_add(signed_hist[name], value, lo_, hi_)
                zeros[name] += int(np.count_nonzero(value == 0)) if lo_ <= 0 <= hi_ else 0
        if progress is not None:
            progress.advance()
    del kept
    out = {}
    for name in names:
        if absmax[name] == 0:
            out[name] = ranges[name]
            continue
        if from_signed[name]:
            abs_hist[name] = signed_hist[name].reshape(BINS, 2).sum(1)
        found = {
            m: _range(m, ranges[name], absmax[name], abs_hist[name], signed_hist[name], zeros[name], percentile, symmetric)
            for m in (AUTO_CANDIDATES if method == "auto" else (method,))
        }
        out[name] = found[method] if method != "auto" else _best_on_histogram(
            found, ranges[name], absmax[name], abs_hist[name], signed_hist[name], zeros[name], symmetric
        )
        if candidates is not None:
            candidates[name] = {**found, "histogram": out[name]}
    if candidates is not None:
        candidates.update({n: {"minmax": ranges[n]} for n in names if n not in candidates})
    return out


# What ``auto`` chooses among, per tensor, by each one's exact error over the histogram. Not
# entropy: its KL search is the slowest step of calibration, and it won 5 of 319 tensors on
# ppocr-rec, 5 of 40 on oww-embedding, 6 of 286 on ppocr-det (ties with mse included).
AUTO_CANDIDATES = ("minmax", "percentile", "mse")


def _range(method, rng, absmax, abs_hist, signed_hist, zeros, percentile, symmetric) -> tuple[float, float]:
    lo_, hi_ = rng
    if method == "minmax":
        return rng
    if method == "mse":
        if symmetric or lo_ >= 0 or hi_ <= 0:
            # One-sided tensors (ReLU outputs) and symmetric schemes: one threshold on |x|.
            steps = SYMMETRIC_STEPS if symmetric else ASYMMETRIC_STEPS  # between 0 and the threshold
            t = mse_threshold(abs_hist, absmax, steps, zeros)
            return (max(lo_, -t), min(hi_, t))
        return mse_range(signed_hist, lo_, hi_, ASYMMETRIC_STEPS, zeros)
    if method == "entropy" or symmetric:
        hist = abs_hist
        if lo_ >= 0 or hi_ <= 0:
            # ReLU outputs: the spike of exact zeros says nothing about where to clip.
            hist = hist.copy()
            hist[0] = max(0.0, hist[0] - zeros)
        if method == "entropy":
            # A one-sided tensor in an asymmetric scheme has every level on its one side (256, not 128).
            levels = ASYMMETRIC_STEPS + 1 if not symmetric and (lo_ >= 0 or hi_ <= 0) else SYMMETRIC_STEPS + 1
            # KL sees the clipped tail as one bin's worth of mass, not as how far it is clipped: on
            # long-tailed ReLU6 outputs (the MobileNetV2 example's first layers) it clipped 3.7 and
            # 6.0 to 1.1-2.0, and the logits' SNR fell from 30.4 to 18.9 dB. So it never clips
            # inside the squared-error optimum (29.2 dB there now).
            threshold = max(kl_threshold(hist, absmax, levels), mse_threshold(abs_hist, absmax, levels - 1, zeros))
        else:
            threshold = _hist_quantile(abs_hist, 0.0, absmax, percentile / 100.0)
        return (max(lo_, -threshold), min(hi_, threshold))
    h = signed_hist
    return (
        min(0.0, _hist_quantile(h, lo_, hi_, 1.0 - percentile / 100.0)) if lo_ < 0 else lo_,
        _hist_quantile(h, lo_, hi_, percentile / 100.0),
    )


# Quantization steps across a range: asymmetric int8/uint8 use all 256 levels, symmetric int8 the
# narrow [-127, 127] (qmath.SYMMETRIC_QMAX steps on each side).
ASYMMETRIC_STEPS = 255
SYMMETRIC_STEPS = 127
CANDIDATES = 256  # clip thresholds tried per side


def histogram_add(counts: np.ndarray, value: np.ndarray, lo: float, hi: float, *, absolute: bool = False) -> None:
    """Add ``value``'s (``|value|``'s) histogram over [lo, hi] to ``counts`` (float64, its size the
    bins): np.histogram with a fixed range, without its edge fix-ups; the bin index by one
    multiply, in the tensor's float32 (4096 bins need no more). ekrt's C extension does it in one
    pass, 3x numpy's four (histogram_numpy, the same bins bit for bit: tests/test_calib.py)."""
    v = np.ascontiguousarray(value, dtype=np.float32).reshape(-1)
    if _ekrt is not None:
        _ekrt.histogram_add(v, lo, counts.size / (hi - lo), counts, absolute)
    else:  # pragma: no cover - an install without the extension
        counts += histogram_numpy(np.abs(v) if absolute else v, lo, hi, counts.size)


def histogram_numpy(value: np.ndarray, lo: float, hi: float, bins: int) -> np.ndarray:
    """``histogram_add``'s bins in numpy: the reference, and the path without the extension."""
    v = value.ravel().astype(np.float32, copy=False)
    idx = ((v - np.float32(lo)) * np.float32(bins / (hi - lo))).astype(np.intp)
    np.clip(idx, 0, bins - 1, out=idx)
    return np.bincount(idx, minlength=bins)


def _moments(hist: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bin edges and the prefix sums of count, count*x, count*x^2 (x the bin centres), each of
    length bins + 1: entry i sums the bins below edge i."""
    edges = np.linspace(lo, hi, hist.size + 1)
    x = (edges[:-1] + edges[1:]) / 2
    c = hist.astype(np.float64)
    pre = [np.concatenate([[0.0], np.cumsum(v)]) for v in (c, c * x, c * x * x)]
    return edges, *pre


def _picks(first: int, last: int) -> np.ndarray:
    """At most CANDIDATES edge indices from first to last, both included."""
    return np.unique(np.linspace(first, last, min(CANDIDATES, last - first + 1)).round().astype(np.int64))


def mse_threshold(abs_hist: np.ndarray, absmax: float, steps: int, zeros: float = 0.0) -> float:
    """The |x| clip threshold t minimising the expected squared error of quantizing with
    ``steps`` steps between 0 and t: clipping error sum over |x| > t of (|x| - t)^2,
    plus rounding noise (t / steps)^2 / 12 per value inside (exact zeros have none)."""
    edges, p0, p1, p2 = _moments(abs_hist, 0.0, absmax)
    j = _picks(1, abs_hist.size)
    t = edges[j]
    above = (p0[-1] - p0[j], p1[-1] - p1[j], p2[-1] - p2[j])
    clip = above[2] - 2 * t * above[1] + t * t * above[0]
    inside = np.maximum(p0[j] - zeros, 0.0)
    err = clip + inside * (t / steps) ** 2 / 12
    return float(t[int(np.argmin(err))])


def mse_range(hist: np.ndarray, lo: float, hi: float, steps: int, zeros: float = 0.0) -> tuple[float, float]:
    """The [a, b] (lo <= a <= 0 <= b <= hi) minimising the expected squared error of quantizing
    to ``steps`` levels (see mse_threshold), searched jointly over both ends."""
    edges, p0, p1, p2 = _moments(hist, lo, hi)
    zero = int(np.searchsorted(edges, 0.0))
    i = _picks(0, max(zero - 1, 0))  # a <= 0
    j = _picks(min(zero, hist.size), hist.size)  # b >= 0
    a, b = np.minimum(edges[i], 0.0), np.maximum(edges[j], 0.0)
    below = a * a * p0[i] - 2 * a * p1[i] + p2[i]
    above = (p2[-1] - p2[j]) - 2 * b * (p1[-1] - p1[j]) + b * b * (p0[-1] - p0[j])
    inside = np.maximum(p0[j][None, :] - p0[i][:, None] - zeros, 0.0)
    width = b[None, :] - a[:, None]
    err = below[:, None] + above[None, :] + inside * (width / steps) ** 2 / 12
    err = np.where(width > 0, err, np.inf)
    k = np.unravel_index(int(np.argmin(err)), err.shape)
    return float(a[k[0]]), float(b[k[1]])


def _best_on_histogram(
    candidates: dict[str, tuple[float, float]], rng: tuple[float, float], absmax: float, abs_hist: np.ndarray, signed_hist: np.ndarray,
    zeros: float, symmetric: bool,
) -> tuple[float, float]:
    """The candidate range whose quantize-dequantize squared error over the whole histogram (bin
    centres, the real grid and zero point; exact zeros cost nothing) is least; minmax on a tie.
    The whole histogram, not a sample of values: a sample misses the rare outliers that decide."""
    if rng[1] <= rng[0]:
        return candidates["minmax"]
    # A symmetric grid errs the same on x and -x: |x| will do.
    hist, lo, hi = (abs_hist, 0.0, absmax) if symmetric else (signed_hist, *rng)
    edges = np.linspace(lo, hi, hist.size + 1)
    x = (edges[:-1] + edges[1:]) / 2
    counts = hist.copy()
    if lo <= 0.0 <= hi:
        zbin = min(int((0.0 - lo) / (hi - lo) * hist.size), hist.size - 1)
        counts[zbin] = max(counts[zbin] - zeros, 0.0)
    best, best_err = candidates["minmax"], np.inf
    for name in ("minmax", *[k for k in candidates if k != "minmax"]):
        sc, z = qmath.scale_zero_point(*candidates[name], "int8", symmetric)
        err = float(counts @ np.square(qmath.dequantize(qmath.quantize(x, sc, z, "int8"), sc, z) - x))
        if err < best_err * (1 - 1e-9):
            best, best_err = candidates[name], err
    return best


def _hist_quantile(hist: np.ndarray, lo: float, hi: float, q: float) -> float:
    cdf = np.cumsum(hist)
    if cdf[-1] == 0:
        return hi
    idx = int(np.searchsorted(cdf, q * cdf[-1]))
    width = (hi - lo) / hist.size
    return float(lo + min(idx + 1, hist.size) * width)


def kl_threshold(hist: np.ndarray, absmax: float, levels: int = 128) -> float:
    """TensorRT-style entropy calibration: the |x| clip threshold minimizing KL(P || Q)."""
    hist = hist.astype(np.float64)
    nbins = hist.size
    if nbins <= levels or hist.sum() == 0:
        return absmax
    best_i, best_kl = nbins, np.inf
    for i in range(levels, nbins + 1, 8):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        nonzero = p > 0
        # Q: merge the first i bins into `levels` groups and spread each group's mass evenly
        # over its non-empty bins (empty bins stay empty, as P has nothing there).
        starts = np.linspace(0, i, levels + 1).astype(int)[:-1]
        sums = np.add.reduceat(hist[:i], starts)  # Q has no outlier mass: clipping costs
        counts = np.add.reduceat(nonzero.astype(np.int64), starts)
        spread = np.repeat(sums / np.maximum(counts, 1), np.diff(np.append(starts, i)))
        q = np.where(nonzero, spread, 0.0)
        p_sum, q_sum = p.sum(), q.sum()
        if q_sum == 0:
            continue
        pn, qn = p / p_sum, q / q_sum
        mask = pn > 0
        qn_m = np.where(qn[mask] > 0, qn[mask], 1e-12)
        kl = float(np.sum(pn[mask] * np.log(pn[mask] / qn_m)))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return (best_i + 0.5) * (absmax / nbins) if best_i < nbins else absmax


def _observer_session(model: onnx.ModelProto, tensors: Sequence[str]):
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    existing = {o.name for o in m.graph.output}
    names = list(dict.fromkeys(tensors))
    for name in names:
        if name not in existing:
            m.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    # Basic optimizations only: fusions must not change the values we observe.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT's own Fail/InvalidGraph/NotImplemented: the model, not edgekit
        reason = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", str(exc).strip().splitlines()[0])
        raise ModelError(f"ONNX Runtime cannot load the model: {reason[:300]}", "check the --shape values, or re-export the model") from exc
    return session, names
