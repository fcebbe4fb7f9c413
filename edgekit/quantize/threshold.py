"""Is the int8 model good enough? The task's metric, fp32 vs int8 on held-out samples, against its threshold.

Every quantize (and the quantize step of deploy and ci) makes this check, so an int8 model that
misses its task's goal is never handed out in silence: one ``warning:`` line names the metric,
the figure, the threshold and the int8 nodes with the worst local error; ``--strict`` makes it
exit 5 (the default in ``edgekit ci``).

Thresholds are in each metric's own unit, as a user states the goal: top-1 agreement in percent,
cosine and mask IoU as fractions, CTC as the character error rate's increase in points (an upper
bound), SNR in dB. ``mixed`` scores are higher-is-better points; ``figure`` converts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from edgekit.errors import UsageError
from edgekit.quantize import mixed

# The defaults (issue 28): top-1 agreement 99 %, cosine 0.99, IoU 0.9, CER +1 point; SNR 20 dB
# (noise at 1 % of the signal's power, what --max-drop 1 holds for snr).
DEFAULTS = {"top1": 99.0, "cosine": 0.99, "iou": 0.9, "ctc": 1.0, "snr": 20.0}
_RANGES = {"top1": (0.0, 100.0), "cosine": (-1.0, 1.0), "iou": (0.0, 1.0), "ctc": (0.0, 100.0)}
_UNITS = {"top1": "% top-1 agreement", "cosine": "cosine", "iou": "mask IoU", "ctc": "pt CER increase", "snr": "dB SNR"}
WORST_LAYERS = 3  # int8 nodes the warning names
# A top-1 disagreement is a near-tie when fp32's own two best classes are this close in probability
# (softmax of the class vector, unless it already is one): there int8's noise decides, not a broken
# layer. On EfficientNet-Lite0's 256 held-out crops every one of int8's 12 disagreements was one.
NEAR_TIE = 0.05


def check_threshold(metric: str | None, threshold: float | None) -> None:
    """Reject a threshold that cannot mean anything before any work (UsageError)."""
    if threshold is None:
        return
    if metric is None or metric == "auto":
        raise UsageError(
            f"--threshold {threshold:g} is in the metric's own unit, and no metric was named",
            "add --metric (top1 in %, cosine, iou, ctc as CER points, snr in dB), or set both in the model's .edgekit.toml [accuracy]",
        )
    mixed.check_metric(metric)
    lo, hi = _RANGES.get(metric, (-math.inf, math.inf))
    if not (math.isfinite(threshold) and lo <= threshold <= hi):
        raise UsageError(f"--threshold {threshold:g} is outside {metric}'s range [{lo:g}, {hi:g}]", f"e.g. --metric {metric} --threshold {DEFAULTS.get(metric, 0):g}")


def figure(metric: str, value: float) -> float:
    """``mixed``'s higher-is-better score -> the metric's unit."""
    return {"cosine": value / 100, "iou": value / 100, "ctc": 100 - value}.get(metric, value)


@dataclass(frozen=True)
class Check:
    metric: str
    why: str  # how the metric was picked (default for the outputs, --metric, the sidecar)
    value: float  # the held-out figure, in the metric's unit
    threshold: float
    passed: bool
    samples: int
    worst_layers: tuple[dict, ...]  # int8 nodes by local SNR on the held-out samples, lowest first: name, op, snr_db
    disagreements: int | None = None  # top1 against fp32: samples whose int8 top-1 differs
    near_ties: int | None = None  # of them, those where fp32's own top two are within NEAR_TIE

    def line(self) -> str:
        """The warning's text: metric, figure, threshold, the worst layers."""
        unit = _UNITS.get(self.metric, self.metric)
        cmp = ">" if self.metric == "ctc" else "<"
        head = f"int8 misses the {self.metric} threshold on {self.samples} held-out samples: {self.value:.4g} {unit} {cmp} {self.threshold:g} ({self.why})"
        if self.disagreements:
            head += (f"; {self.near_ties} of its {self.disagreements} disagreements are near-ties (fp32's own top two within "
                     f"{NEAR_TIE:g} probability)")
        if not self.worst_layers:
            return head + "; no per-layer error to name (activations quantized at run time)"
        names = ", ".join(f"{x['name']} ({x['op']}, {_db(x['snr_db'])})" for x in self.worst_layers)
        return f"{head}; lowest local SNR on them: {names}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["worst_layers"] = list(self.worst_layers)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Check:
        return cls(**{**d, "worst_layers": tuple(d["worst_layers"])})


def _db(x: float | None) -> str:
    return "inf dB" if x is None or not math.isfinite(x) else f"{x:.1f} dB"


def _stacked(outs: Mapping[str, Sequence[np.ndarray]], names: Sequence[str]) -> list[np.ndarray]:
    """name -> one array per sample, as ``mixed`` scores them: one array per output, samples on axis 0."""
    return [np.concatenate([np.reshape(a, (1, -1)) if np.ndim(a) == 0 else np.asarray(a) for a in outs[n]]) for n in names]


def check(
    fp32: Mapping[str, Sequence[np.ndarray]], int8: Mapping[str, Sequence[np.ndarray]], *, metric: str | None, threshold: float | None, why: str = "",
) -> Check | None:
    """The held-out check of int8 outputs against fp32's (name -> one array per sample), its worst
    layers still to name (``worst``). None when there is nothing to check against: a module.py:fn
    metric with no threshold given."""
    names = list(fp32)
    if not names or not len(fp32[names[0]]):
        return None
    ref, q = _stacked(fp32, names), _stacked(int8, names)
    m = mixed.metric_for(metric, ref, None)  # agreement with float, not accuracy on labels
    goal = DEFAULTS.get(m.name) if threshold is None else threshold
    if goal is None:
        return None
    value = figure(m.name, m.score(ref, q))
    passed = value <= goal + 1e-9 if m.name == "ctc" else value >= goal - 1e-9
    ties = near_ties(ref, q) if m.name == "top1" else None
    return Check(m.name, why or m.why or f"--metric {m.name}", round(value, 6), goal, passed, len(fp32[names[0]]), (), *(ties or (None, None)))


def near_ties(ref: Sequence[np.ndarray], q: Sequence[np.ndarray]) -> tuple[int, int] | None:
    """(disagreements, of them near-ties) of int8's top-1 against fp32's on the first class-vector
    output; None without one."""
    i = mixed.class_output(ref)  # the output the top1 metric scores
    if i is None:
        return None
    r = ref[i].astype(np.float64)
    differ = r.argmax(axis=1) != q[i].argmax(axis=1)
    probs = r if np.all(r >= 0) and np.allclose(r.sum(axis=1), 1.0, atol=1e-3) else np.exp(r - r.max(axis=1, keepdims=True))
    probs = probs / probs.sum(axis=1, keepdims=True)
    top2 = np.sort(probs, axis=1)[:, -2:]
    return int(differ.sum()), int((differ & (top2[:, 1] - top2[:, 0] < NEAR_TIE)).sum())


def worst(layers: Sequence[dict]) -> tuple[dict, ...]:
    """The WORST_LAYERS int8 nodes of lowest local SNR (name, op, snr_db; None: no error)."""
    ranked = sorted(layers, key=lambda x: math.inf if x.get("snr_db") is None else x["snr_db"])
    return tuple({"name": x["name"], "op": x["op"], "snr_db": x.get("snr_db")} for x in ranked[:WORST_LAYERS])


__all__ = ["DEFAULTS", "NEAR_TIE", "Check", "check", "check_threshold", "figure", "near_ties", "worst"]
