"""Task metrics of real-model catalogue entries as ``edgekit quantize --metric`` functions.

``edgekit quantize M --max-drop X --metric benchmarks/task_metrics.py:detection_f1`` holds the
int8 model within X points of fp32's own score. edgekit calls ``fn(ref_outputs, q_outputs)``:
one array per model output, the held-out samples stacked on axis 0; higher is better, points.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import realmodels as rm  # noqa: E402  (tests/realmodels.py: the catalogue's metrics)


def _per_sample(outputs: list[np.ndarray]) -> list[list[np.ndarray]]:
    return [[o[i : i + 1] for o in outputs] for i in range(len(outputs[0]))]


def detection_f1(ref: list[np.ndarray], q: list[np.ndarray]) -> float:
    """100 x F1 of YOLO detections (score >= 0.25, NMS 0.45; a match: same class, IoU >= 0.5)."""
    return 100 * rm.detection_f1_score(_per_sample(ref), _per_sample(q), rm.Samples([])).value


def speech_prob(ref: list[np.ndarray], q: list[np.ndarray]) -> float:
    """100 x (1 - the largest speech-probability error): --max-drop 5 is the catalogue's goal (0.05)."""
    return 100 * (1 - rm.vad_score(_per_sample(ref), _per_sample(q), rm.Samples([])).value)


def text_map_iou(ref: list[np.ndarray], q: list[np.ndarray]) -> float:
    """100 x mean mask IoU of PP-OCR det's probability map at RapidOCR's binarization (0.3)."""
    return 100 * rm.mask_iou_score(0.3)(_per_sample(ref), _per_sample(q), rm.Samples([])).value


def layout_iou(ref: list[np.ndarray], q: list[np.ndarray]) -> float:
    """100 x mean mask IoU of PicoDet's class scores (outputs 0-3) at its conf_thres (0.4)."""
    return 100 * rm.mask_iou_score(0.4, slice(0, 4))(_per_sample(ref), _per_sample(q), rm.Samples([])).value


HERE = Path(__file__).resolve()

# What `--max-drop` holds for each catalogue model so that its task goal is met: (--metric,
# --max-drop points). Built-in metrics where edgekit has the task's own (top-1, cosine, CTC
# decodes against fp32's, which needs no ground truth); these functions where it has not.
# minilm-l3: cosine over every token's state (padding too): the pooled-embedding metric needs
# the attention mask, which a --metric function does not see.
GOAL_AS_MAX_DROP: dict[str, tuple[str, float]] = {
    "ppocr-cls": ("top1", 1.0),
    "ppocr-det": (f"{HERE}:text_map_iou", 5.0),
    "ppocr-rec": ("ctc", 0.2),
    "orientation": ("top1", 1.0),
    "layout-cdla": (f"{HERE}:layout_iou", 5.0),
    "nudenet-320n": (f"{HERE}:detection_f1", 5.0),
    "mtcnn-onet": ("cosine", 0.1),
    "magika": ("top1", 1.0),
    "silero-vad": (f"{HERE}:speech_prob", 5.0),
    "oww-embedding": ("cosine", 0.1),
    "minilm-l3": ("cosine", 0.1),
}
