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
